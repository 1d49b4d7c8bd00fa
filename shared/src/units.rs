//! Human-readable numbers, the same in every tool: `1.2M op/s`, `734 KB/s`, `210 MB`.
//!
//! Rates and counts use SI prefixes (k, M, G: powers of 1000); bytes use KB/MB/GB as powers
//! of 1000 too, like network tools, so "MB/s" means 10^6 bytes per second everywhere.

/// `1234` -> `1.2k`, `1_500_000` -> `1.5M`; below 1000 the plain integer.
pub fn si(value: f64) -> String {
    scaled(value, &["", "k", "M", "G", "T"])
}

/// Bytes: `734_000` -> `734 KB`.
pub fn bytes(value: f64) -> String {
    scaled(value, &[" B", " KB", " MB", " GB", " TB"])
}

/// Bytes per second: `734_000` -> `734 KB/s`.
pub fn bytes_per_sec(value: f64) -> String {
    format!("{}/s", bytes(value))
}

/// Ops per second: `1_234_567` -> `1.2M op/s`.
pub fn ops_per_sec(value: f64) -> String {
    format!("{} op/s", si(value))
}

/// Thousands separators for exact counts: `3123456` -> `3,123,456`.
pub fn grouped(value: u64) -> String {
    let digits = value.to_string();
    let mut out = String::with_capacity(digits.len() + digits.len() / 3);
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// A latency in microseconds: `350 us`, `2.1 ms`, `1.5 s`.
pub fn micros(us: u64) -> String {
    match us {
        us if us < 1000 => format!("{us} us"),
        us if us < 1_000_000 => format!("{:.1} ms", us as f64 / 1e3),
        us => format!("{:.1} s", us as f64 / 1e6),
    }
}

/// A duration in seconds as `3h02m`, `4m05s` or `12s`.
pub fn uptime(seconds: u64) -> String {
    match seconds {
        s if s >= 3600 => format!("{}h{:02}m", s / 3600, (s % 3600) / 60),
        s if s >= 60 => format!("{}m{:02}s", s / 60, s % 60),
        s => format!("{s}s"),
    }
}

fn scaled(value: f64, units: &[&str]) -> String {
    if !value.is_finite() {
        return "-".into();
    }
    let negative = value < 0.0;
    let mut v = value.abs();
    let mut unit = 0;
    while v >= 999.95 && unit + 1 < units.len() {
        v /= 1000.0;
        unit += 1;
    }
    let sign = if negative { "-" } else { "" };
    if unit == 0 {
        format!("{sign}{}{}", v.round() as u64, units[0])
    } else if v >= 99.95 {
        format!("{sign}{v:.0}{}", units[unit])
    } else {
        format!("{sign}{v:.1}{}", units[unit])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rates_and_sizes() {
        assert_eq!(ops_per_sec(1_234_567.0), "1.2M op/s");
        assert_eq!(ops_per_sec(999.0), "999 op/s");
        assert_eq!(ops_per_sec(0.0), "0 op/s");
        assert_eq!(si(1_000.0), "1.0k");
        assert_eq!(si(999_960.0), "1.0M");
        assert_eq!(si(123_456.0), "123k");
        assert_eq!(bytes_per_sec(734_000.0), "734 KB/s");
        assert_eq!(bytes(210_000_000.0), "210 MB");
        assert_eq!(bytes(512.0), "512 B");
        assert_eq!(bytes(f64::NAN), "-");
        assert_eq!(si(-2500.0), "-2.5k");
    }

    #[test]
    fn grouping_and_uptime() {
        assert_eq!(grouped(0), "0");
        assert_eq!(grouped(1000), "1,000");
        assert_eq!(grouped(3_123_456), "3,123,456");
        assert_eq!(uptime(59), "59s");
        assert_eq!(uptime(245), "4m05s");
        assert_eq!(uptime(10_920), "3h02m");
    }

    #[test]
    fn latencies() {
        assert_eq!(micros(350), "350 us");
        assert_eq!(micros(2_140), "2.1 ms");
        assert_eq!(micros(1_500_000), "1.5 s");
    }
}
