//! Turning a result into what people and spreadsheets read: the summary table and CSV rows.

use std::fmt::Write as _;
use std::path::Path;

use kvshared::units::{bytes, bytes_per_sec, grouped, si};
use serde::Serialize;

use crate::result::RunResult;

/// The summary printed at the end of `kvbench run`.
pub fn summary(r: &RunResult) -> String {
    let mut s = String::new();
    let o = &r.options;
    if let Some(w) = &r.workload {
        let _ = writeln!(s, "workload   {}", w.describe());
    }
    let mode = match o.rate {
        Some(rate) => format!(
            "open loop at {} op/s (latency from intended send times: coordinated omission corrected)",
            si(rate)
        ),
        None => "closed loop".to_string(),
    };
    let _ = writeln!(
        s,
        "load       {} tasks, batch {}, {} conn(s)/node, pipeline {}, {}",
        o.tasks, o.batch, o.conns, o.pipeline, mode
    );
    if r.interrupted {
        let _ = writeln!(
            s,
            "INTERRUPTED by Ctrl-C: the figures cover the {:.1} s measured before it{}",
            r.elapsed_s,
            if r.elapsed_s == 0.0 {
                " (stopped during warm-up)"
            } else {
                ""
            }
        );
    }
    let _ = writeln!(
        s,
        "window     {:.1} s measured after {:.1} s warm-up{}",
        r.elapsed_s,
        o.warmup_s,
        if r.merged_runs > 1 {
            format!(", merged from {} runs", r.merged_runs)
        } else {
            String::new()
        }
    );
    let _ = writeln!(s);
    let _ = writeln!(
        s,
        "throughput {} op/s   ({} ops)",
        grouped(r.ops_per_sec.round() as u64),
        grouped(r.ops)
    );
    for n in &r.per_node {
        let _ = write!(s, "  {:<21} {:>12} op/s", n.addr, grouped(n.ops_per_sec.round() as u64));
        if let Some(sv) = n.server.as_ref().filter(|sv| sv.restarted) {
            let _ = write!(
                s,
                "   server: RESTARTED during the run; since then ({:.1} s): {} op/s, RSS {}",
                sv.seconds,
                si(sv.ops_per_sec),
                bytes(sv.rss_bytes as f64)
            );
        } else if let Some(sv) = &n.server {
            let _ = write!(
                s,
                "   server: {} op/s, CPU {:.0}%, RSS {}, net in {} out {}",
                si(sv.ops_per_sec),
                sv.cpu_percent,
                bytes(sv.rss_bytes as f64),
                bytes_per_sec(sv.bytes_in_per_sec),
                bytes_per_sec(sv.bytes_out_per_sec)
            );
        }
        let _ = writeln!(s);
    }
    if r.merged_runs > 1 {
        let _ = writeln!(
            s,
            "client CPU {:.0}% of one core, summed over {} kvbench runs",
            r.client_cpu_percent, r.merged_runs
        );
    } else {
        let _ = writeln!(
            s,
            "client CPU {:.0}% of one core (kvbench itself)",
            r.client_cpu_percent
        );
    }
    let _ = writeln!(s);
    let _ = writeln!(
        s,
        "latency us {:>10} {:>10} {:>10} {:>10} {:>10} {:>12}",
        "p50", "p90", "p99", "p99.9", "max", "count"
    );
    for (name, l) in &r.latency_us {
        let _ = writeln!(
            s,
            "  {:<8} {:>10.1} {:>10.1} {:>10.1} {:>10.1} {:>10.1} {:>12}",
            name,
            l.p50_us,
            l.p90_us,
            l.p99_us,
            l.p999_us,
            l.max_us,
            grouped(l.count)
        );
    }
    let _ = writeln!(s);
    if r.errors.is_empty() {
        let _ = writeln!(s, "errors     none");
    } else {
        let list: Vec<String> = r.errors.iter().map(|(k, v)| format!("{k}: {v}")).collect();
        let _ = writeln!(
            s,
            "errors     {} ops failed ({})",
            grouped(r.failed_ops),
            list.join(", ")
        );
    }
    if r.redirected > 0 {
        let _ = writeln!(
            s,
            "redirects  {} ops answered MOVED or TRYAGAIN (a slot moved), sent again",
            grouped(r.redirected)
        );
    }
    if r.read_misses > 0 {
        let _ = writeln!(
            s,
            "note       {} reads found no value: was the cluster loaded (`kvbench load`)?",
            grouped(r.read_misses)
        );
    }
    s
}

/// One CSV row per run, for `--csv` and sweeps.
#[derive(Debug, Serialize)]
pub struct CsvRow {
    pub started_unix_ms: u64,
    pub workload: String,
    pub nodes: usize,
    pub tasks: usize,
    pub batch: usize,
    pub pipeline: usize,
    pub conns: usize,
    pub elapsed_s: f64,
    pub ops: u64,
    pub ops_per_sec: f64,
    pub read_p50_us: f64,
    pub read_p99_us: f64,
    pub update_p99_us: f64,
    pub batch_p50_us: f64,
    pub batch_p99_us: f64,
    pub batch_p999_us: f64,
    pub failed_ops: u64,
    pub client_cpu_percent: f64,
    pub server_cpu_percent: f64,
}

impl CsvRow {
    pub fn of(r: &RunResult) -> CsvRow {
        let lat = |name: &str| r.latency_us.get(name).cloned().unwrap_or_default();
        CsvRow {
            started_unix_ms: r.started_unix_ms,
            workload: r
                .workload
                .as_ref()
                .map(|w| format!("{:?}", w.workload).to_lowercase())
                .unwrap_or_default(),
            nodes: r.options.nodes.len(),
            tasks: r.options.tasks,
            batch: r.options.batch,
            pipeline: r.options.pipeline,
            conns: r.options.conns,
            elapsed_s: r.elapsed_s,
            ops: r.ops,
            ops_per_sec: r.ops_per_sec,
            read_p50_us: lat("read").p50_us,
            read_p99_us: lat("read").p99_us,
            update_p99_us: lat("update").p99_us,
            batch_p50_us: lat("batch").p50_us,
            batch_p99_us: lat("batch").p99_us,
            batch_p999_us: lat("batch").p999_us,
            failed_ops: r.failed_ops,
            client_cpu_percent: r.client_cpu_percent,
            server_cpu_percent: r
                .per_node
                .iter()
                .filter_map(|n| n.server.as_ref().map(|s| s.cpu_percent))
                .sum(),
        }
    }
}

/// Appends `row` to the CSV file at `path`, writing the header first if the file is new.
pub fn append_csv(path: &Path, row: &CsvRow) -> anyhow::Result<()> {
    let fresh = std::fs::metadata(path).map(|m| m.len() == 0).unwrap_or(true);
    let file = std::fs::OpenOptions::new().create(true).append(true).open(path)?;
    let mut w = csv::WriterBuilder::new().has_headers(fresh).from_writer(file);
    w.serialize(row)?;
    w.flush()?;
    Ok(())
}
