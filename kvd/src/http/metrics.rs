//! `GET /metrics`: the node's figures in the Prometheus text exposition format (0.0.4),
//! written over the counters kvd already keeps. Counters end in `_total`, units are in the
//! names (`_bytes`, `_seconds`), and every series has a `shard` (the node's index) and a
//! `shards` (the cluster's size) label, so one Prometheus scraping every node can sum or
//! split by shard. The process's own figures use the standard `process_*` names every
//! Prometheus client library exports; the error counters are one `kvd_errors_total` with a
//! `kind` label; a replica group member exports its role, term and log positions.

use std::fmt::Write;

use kvshared::latency::upper_ns;
use kvshared::stats::{Counter, CounterClass, NodeStats};

/// The labels every series has: `shard="0",shards="2"`.
fn labels(s: &NodeStats) -> String {
    format!("shard=\"{}\",shards=\"{}\"", s.shard.index, s.shard.count)
}

/// A counter's series name and value: `kvd_NAME_total`; one kept in microseconds goes out
/// in seconds, Prometheus's base unit (`kvd_expire_cycle_seconds_total`).
fn exported(c: Counter, v: u64) -> (String, String) {
    match c.name().strip_suffix("_microseconds") {
        Some(base) => (format!("kvd_{base}_seconds_total"), format!("{}", v as f64 / 1e6)),
        None => (format!("kvd_{}_total", c.name()), v.to_string()),
    }
}

/// The exposition text for one node's stats.
pub fn render(s: &NodeStats) -> String {
    let labels = labels(s);
    let mut out = String::with_capacity(8 * 1024);
    for &c in Counter::ALL.iter().filter(|c| c.class() != CounterClass::Error) {
        let (name, value) = exported(c, s.counts.get(c));
        family(&mut out, &name, "counter", c.help());
        let _ = writeln!(out, "{name}{{{labels}}} {value}");
    }
    family(
        &mut out,
        "kvd_errors_total",
        "counter",
        "Things clients did wrong and connections that failed, by kind (see docs/HTTP.md).",
    );
    for &c in Counter::ALL.iter().filter(|c| c.class() == CounterClass::Error) {
        let _ = writeln!(
            out,
            "kvd_errors_total{{{labels},kind=\"{}\"}} {}",
            c.name(),
            s.counts.get(c)
        );
    }
    super::process_metrics::render(&mut out, s);
    super::group_metrics::render(&mut out, &labels, s);
    let d = &s.durability;
    let m = s.slot_moves;
    let gauges: [(&str, &str, f64); 17] = [
        ("kvd_keys", "Keys stored on this node.", s.keys as f64),
        (
            "kvd_volatile_keys",
            "Keys with a time to live on this node.",
            s.volatile_keys as f64,
        ),
        (
            "kvd_uptime_seconds",
            "Seconds since the node started.",
            s.uptime_ms as f64 / 1e3,
        ),
        (
            "kvd_connections_open",
            "Client connections open now.",
            s.counts.connections_open() as f64,
        ),
        (
            "kvd_memory_used_bytes",
            "Memory the stored data takes, as accounted for --max-memory.",
            s.memory_used_bytes as f64,
        ),
        (
            "kvd_memory_max_bytes",
            "--max-memory (0: no cap).",
            s.max_memory_bytes as f64,
        ),
        (
            "kvd_host_memory_used_bytes",
            "Memory in use on the host.",
            s.system.host_mem_used_bytes as f64,
        ),
        (
            "kvd_log_bytes",
            "Bytes of log segments on disk (0 without --data-dir).",
            d.log_bytes as f64,
        ),
        (
            "kvd_log_memory_bytes",
            "Bytes of log entries held in memory (the newest; older ones are read back from disk).",
            d.log_memory_bytes as f64,
        ),
        (
            "kvd_log_entries",
            "Log entries since the newest snapshot.",
            d.log_entries as f64,
        ),
        (
            "kvd_log_last_applied_index",
            "Index of the last applied log entry.",
            d.last_applied as f64,
        ),
        (
            "kvd_snapshot_bytes",
            "Size of the newest snapshot (0: none).",
            d.snapshot_bytes as f64,
        ),
        (
            "kvd_snapshot_age_seconds",
            "Seconds since the newest snapshot was written or loaded.",
            d.snapshot_age_ms as f64 / 1e3,
        ),
        (
            "kvd_slots_frozen",
            "Slots this node's group is handing over now (writes answered TRYAGAIN).",
            f64::from(m.frozen),
        ),
        (
            "kvd_slots_importing",
            "Slots being copied into this node's group now.",
            f64::from(m.importing),
        ),
        (
            "kvd_slots_taken",
            "Slots the moves into this node's group under way have handed over so far (plus kvd_slots_importing: the moves' total).",
            f64::from(m.taken),
        ),
        (
            "kvd_durability_stalled",
            "1 while the disk refuses writes (writes are refused, reads go on), else 0.",
            f64::from(u8::from(d.stalled_since_unix_ms != 0)),
        ),
    ];
    for (name, help, value) in gauges {
        family(&mut out, name, "gauge", help);
        let _ = writeln!(out, "{name}{{{labels}}} {value}");
    }
    family(
        &mut out,
        "kvd_disk_stalls_total",
        "counter",
        "Times the disk began refusing writes (no space, read-only, failing).",
    );
    let _ = writeln!(out, "kvd_disk_stalls_total{{{labels}}} {}", d.disk_stalls);
    family(&mut out, "kvd_fsyncs_total", "counter", "Fsyncs of the log.");
    let _ = writeln!(out, "kvd_fsyncs_total{{{labels}}} {}", d.fsyncs);
    let name = "kvd_fsync_duration_seconds";
    family(&mut out, name, "histogram", "Time of each fsync of the log.");
    histogram(&mut out, name, &labels, &d.fsync);
    family(
        &mut out,
        "kvd_snapshots_total",
        "counter",
        "Snapshots this process wrote.",
    );
    let _ = writeln!(out, "kvd_snapshots_total{{{labels}}} {}", d.snapshots_taken);
    op_durations(&mut out, &labels, s);
    family(
        &mut out,
        "kvd_info",
        "gauge",
        "Always 1; the labels say what the node is.",
    );
    let _ = writeln!(
        out,
        "kvd_info{{{labels},version=\"{}\",durability=\"{}\"}} 1",
        s.version, d.mode
    );
    out
}

/// The service-time histograms: per op kind a Prometheus histogram with one bucket per
/// doubling (every fourth of kvd's own buckets, so the cumulative counts are exact), and per
/// map shard a summary of sum and count (64 histograms per node would swamp a scrape).
fn op_durations(out: &mut String, labels: &str, s: &NodeStats) {
    let name = "kvd_op_duration_seconds";
    family(
        out,
        name,
        "histogram",
        "Service time of ops, from the start of their batch to their result (through the log when durable).",
    );
    for (op, latency) in s.latency.kinds() {
        histogram(out, name, &format!("{labels},op=\"{op}\""), latency);
    }
    let name = "kvd_map_shard_duration_seconds";
    family(
        out,
        name,
        "summary",
        "Time sampled batches spent on one internal map shard's ops, lock wait included.",
    );
    for (i, latency) in s.latency.map_shards.iter().enumerate() {
        let _ = writeln!(
            out,
            "{name}_sum{{{labels},map_shard=\"{i}\"}} {}",
            latency.sum_ns as f64 / 1e9
        );
        let _ = writeln!(out, "{name}_count{{{labels},map_shard=\"{i}\"}} {}", latency.count());
    }
}

/// One histogram's series from kvd's own buckets: one bucket per doubling (every fourth of
/// kvd's, so the cumulative counts are exact), `+Inf`, `_sum` and `_count`.
fn histogram(out: &mut String, name: &str, labels: &str, latency: &kvshared::latency::Latency) {
    let mut cumulative = 0;
    for (i, count) in latency.dense().iter().enumerate() {
        cumulative += count;
        let upper = upper_ns(i);
        if i % 4 == 0 && upper != u64::MAX {
            let le = upper as f64 / 1e9;
            let _ = writeln!(out, "{name}_bucket{{{labels},le=\"{le}\"}} {cumulative}");
        }
    }
    let _ = writeln!(out, "{name}_bucket{{{labels},le=\"+Inf\"}} {cumulative}");
    let _ = writeln!(out, "{name}_sum{{{labels}}} {}", latency.sum_ns as f64 / 1e9);
    let _ = writeln!(out, "{name}_count{{{labels}}} {cumulative}");
}

pub(super) fn family(out: &mut String, name: &str, kind: &str, help: &str) {
    let help = help.replace('\\', "\\\\").replace('\n', " ");
    let _ = writeln!(out, "# HELP {name} {help}");
    let _ = writeln!(out, "# TYPE {name} {kind}");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_counter_has_a_total_with_a_shard_label() {
        let mut s = NodeStats::default();
        s.counts.gets = 42;
        let text = render(&s);
        assert!(
            text.contains("# TYPE kvd_gets_total counter\nkvd_gets_total{shard=\"0\",shards=\"1\"} 42\n"),
            "{text}"
        );
        for &c in Counter::ALL {
            let series = match c.class() {
                CounterClass::Error => format!("kvd_errors_total{{shard=\"0\",shards=\"1\",kind=\"{}\"}} ", c.name()),
                _ => format!("{}{{", exported(c, 0).0),
            };
            assert!(text.contains(&series), "{series}");
        }
        assert!(text.contains("kvd_info{shard=\"0\",shards=\"1\""));
    }

    /// Buckets are cumulative, end in +Inf equal to the count, and a value lands under the
    /// first bound above it.
    #[test]
    fn op_durations_are_a_prometheus_histogram() {
        let mut s = NodeStats::default();
        let mut dense = vec![0; kvshared::latency::BUCKETS];
        dense[kvshared::latency::bucket_of(3_000)] = 5; // 3 us
        dense[kvshared::latency::bucket_of(2_000_000)] = 1; // 2 ms
        s.latency.get = kvshared::latency::Latency::from_dense(&dense, 17_000_000);
        s.latency.map_shards = vec![Default::default(); 2];
        let text = render(&s);
        let bucket = |le: &str| {
            let key = format!("kvd_op_duration_seconds_bucket{{shard=\"0\",shards=\"1\",op=\"get\",le=\"{le}\"}} ");
            let line = text
                .lines()
                .find(|l| l.starts_with(&key))
                .unwrap_or_else(|| panic!("{key} in {text}"));
            line[key.len()..].parse::<u64>().unwrap()
        };
        assert_eq!(bucket("0.000002048"), 0);
        assert_eq!(bucket("0.000004096"), 5);
        assert_eq!(bucket("0.001048576"), 5);
        assert_eq!(bucket("0.002097152"), 6);
        assert_eq!(bucket("+Inf"), 6);
        assert!(text.contains("kvd_op_duration_seconds_count{shard=\"0\",shards=\"1\",op=\"get\"} 6\n"));
        assert!(text.contains("kvd_op_duration_seconds_sum{shard=\"0\",shards=\"1\",op=\"get\"} 0.017\n"));
        assert!(text.contains("kvd_map_shard_duration_seconds_count{shard=\"0\",shards=\"1\",map_shard=\"1\"} 0\n"));
    }
}
