//! The standard `process_*` metrics, under the names every Prometheus client library's
//! process collector uses (and without labels, as they export them: Prometheus adds the
//! target's), so the usual dashboards and alerts find kvd's process like any other.

use std::fmt::Write;

use kvshared::stats::NodeStats;

use super::metrics::family;

/// Writes the process metrics: CPU and resident memory as the node's sampler last saw them,
/// open and allowed file descriptors and the start time as they are now.
pub fn render(out: &mut String, s: &NodeStats) {
    let now_s = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64());
    let mut metrics: Vec<(&str, &str, &str, f64)> = vec![
        (
            "process_cpu_seconds_total",
            "counter",
            "Total user and system CPU time spent in seconds.",
            s.system.process_cpu_ms as f64 / 1e3,
        ),
        (
            "process_resident_memory_bytes",
            "gauge",
            "Resident memory size in bytes.",
            s.system.process_rss_bytes as f64,
        ),
        (
            "process_start_time_seconds",
            "gauge",
            "Start time of the process since unix epoch in seconds.",
            (now_s - s.uptime_ms as f64 / 1e3).floor(),
        ),
    ];
    if let Ok(fds) = std::fs::read_dir("/proc/self/fd") {
        metrics.push((
            "process_open_fds",
            "gauge",
            "Number of open file descriptors.",
            fds.count() as f64,
        ));
    }
    if let Ok((soft, _)) = rlimit::getrlimit(rlimit::Resource::NOFILE) {
        metrics.push((
            "process_max_fds",
            "gauge",
            "Maximum number of open file descriptors.",
            soft as f64,
        ));
    }
    for (name, kind, help, value) in metrics {
        family(out, name, kind, help);
        let _ = writeln!(out, "{name} {value}");
    }
}
