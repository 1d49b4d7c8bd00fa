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

/// Used of total bytes in one unit when both share it: `1.6/25.3 GB`, else `734 MB/25.3 GB`.
pub fn bytes_of(used: f64, total: f64) -> String {
    let (u, t) = (bytes(used), bytes(total));
    match (u.rsplit_once(' '), t.rsplit_once(' ')) {
        (Some((un, uu)), Some((tn, tu))) if uu == tu => format!("{un}/{tn} {tu}"),
        _ => format!("{u}/{t}"),
    }
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
        us if us < 999_950 => format!("{:.1} ms", us as f64 / 1e3),
        us => format!("{:.1} s", us as f64 / 1e6),
    }
}

/// A latency in nanoseconds, as [`micros`] does (below a microsecond: `0.4 us`).
pub fn nanos(ns: u64) -> String {
    match ns {
        ns if ns < 1000 => format!("{:.1} us", ns as f64 / 1e3),
        ns => micros(ns / 1000),
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
    while v >= 999.5 && unit + 1 < units.len() {
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
        // Just under a unit's step rounds up to the next unit, never to "1000k".
        assert_eq!(si(999_700.0), "1.0M");
        assert_eq!(si(999_400.0), "999k");
        assert_eq!(si(999.6), "1.0k");
        assert_eq!(bytes_of(1.6e9, 25.3e9), "1.6/25.3 GB");
        assert_eq!(bytes_of(734e6, 25.3e9), "734 MB/25.3 GB");
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
        assert_eq!(micros(999_960), "1.0 s");
        assert_eq!(nanos(420), "0.4 us");
        assert_eq!(nanos(12_400), "12 us");
    }
}
