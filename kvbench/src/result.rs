//! The result of a run, as written to JSON and read back by `kvbench merge`.
//!
//! A result file explains itself: it records every option, the workload, the kvbench
//! version and the machine, next to the figures. Latency histograms are stored whole (see
//! [`crate::hist`]) so that results from several client machines merge exactly.

use std::collections::BTreeMap;

use kvshared::stats::{NodeRates, NodeStats};
use serde::{Deserialize, Serialize};

use crate::engine::EngineOutput;
use crate::hist::{self, LatencySummary};
use crate::workload::{OpType, WorkloadSpec};

/// The machine a result was measured on.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Machine {
    pub hostname: String,
    pub cores: usize,
    pub os: String,
}

impl Machine {
    pub fn this() -> Machine {
        Machine {
            hostname: sysinfo::System::host_name().unwrap_or_default(),
            cores: std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1),
            os: format!(
                "{} {}",
                sysinfo::System::name().unwrap_or_default(),
                sysinfo::System::kernel_version().unwrap_or_default()
            ),
        }
    }
}

/// The load options of a run.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct RunOptions {
    pub nodes: Vec<String>,
    pub tasks: usize,
    pub batch: usize,
    pub pipeline: usize,
    pub conns: usize,
    pub threads: usize,
    pub duration_s: f64,
    pub warmup_s: f64,
    pub ops_limit: Option<u64>,
    /// Open-loop target rate (op/s); `None` for closed loop.
    pub rate: Option<f64>,
    pub seed: u64,
    pub timeout_ms: u64,
}

/// What the servers themselves saw over the measured window (from their stats).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ServerFigures {
    /// The node's kvd version and shard, as it reported them.
    pub version: String,
    pub shard: String,
    pub ops_per_sec: f64,
    /// kvd's CPU, percent of one core.
    pub cpu_percent: f64,
    pub rss_bytes: u64,
    pub bytes_in_per_sec: f64,
    pub bytes_out_per_sec: f64,
    pub host_cpu_percent: f64,
    pub keys: u64,
    /// The node restarted during the window: the figures cover only the `seconds` since the
    /// restart (and CPU is unknown, 0).
    #[serde(default)]
    pub restarted: bool,
    /// The span the figures cover, seconds (the window, or the time since a restart).
    #[serde(default)]
    pub seconds: f64,
}

impl ServerFigures {
    /// The node's figures over the window from `before` to `after`, `seconds` apart.
    pub fn between(before: &NodeStats, after: &NodeStats, seconds: f64) -> ServerFigures {
        let r = NodeRates::between(before, after, seconds);
        ServerFigures {
            version: after.version.clone(),
            shard: after.shard.to_string(),
            ops_per_sec: r.ops_per_sec,
            cpu_percent: r.process_cpu_percent,
            rss_bytes: after.system.process_rss_bytes,
            bytes_in_per_sec: r.bytes_in_per_sec,
            bytes_out_per_sec: r.bytes_out_per_sec,
            host_cpu_percent: f64::from(after.system.host_cpu_percent),
            keys: after.keys,
            restarted: r.restarted,
            seconds: r.seconds,
        }
    }
}

/// One node's share of a run.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct NodeResult {
    pub addr: String,
    pub ops: u64,
    pub ops_per_sec: f64,
    pub server: Option<ServerFigures>,
    /// The measured window's round trips of this node's batches of reads only...
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub read_batches_us: Option<LatencySummary>,
    /// ...and of its batches with a write (with `--split-reads`: its writes).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub write_batches_us: Option<LatencySummary>,
    /// Those two histograms ("read_batches", "write_batches"; HdrHistogram V2 deflate +
    /// base64), so that `kvbench merge` can combine clients.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub histograms: BTreeMap<String, String>,
}

/// The names of a node's two batch histograms, reads only and with a write.
const NODE_BATCH_KINDS: [&str; 2] = ["read_batches", "write_batches"];

impl NodeResult {
    /// Sets the batch summaries and histograms from `[reads only, with a write]`.
    fn set_batches(&mut self, hists: [&hist::Hist; 2]) -> anyhow::Result<()> {
        let summary = |h: &hist::Hist| (!h.is_empty()).then(|| LatencySummary::of(h));
        self.read_batches_us = summary(hists[0]);
        self.write_batches_us = summary(hists[1]);
        self.histograms.clear();
        for (name, h) in NODE_BATCH_KINDS.iter().zip(hists) {
            if !h.is_empty() {
                self.histograms.insert(name.to_string(), hist::encode(h)?);
            }
        }
        Ok(())
    }
}

/// A whole run (or several merged).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct RunResult {
    pub kvbench_version: String,
    pub started_unix_ms: u64,
    pub command_line: Vec<String>,
    pub machine: Machine,
    pub options: RunOptions,
    pub workload: Option<WorkloadSpec>,
    /// True when run open loop (`--rate`): latencies count from each batch's intended send
    /// time, which corrects for coordinated omission.
    pub open_loop: bool,
    /// Length of the measured window (warm-up excluded), seconds.
    pub elapsed_s: f64,
    pub ops: u64,
    pub ops_per_sec: f64,
    pub ops_by_type: BTreeMap<String, u64>,
    /// Ops the servers acknowledged over the whole run, warm-up included, as wire ops.
    pub wire_ops_completed: u64,
    pub read_misses: u64,
    /// Gets that missed inside the measured window.
    #[serde(default)]
    pub measured_read_misses: u64,
    /// Puts that filled misses (cache-aside runs).
    #[serde(default)]
    pub fills: u64,
    /// Ops a node answered `Moved` or `TryAgain` (a slot moved or being moved), sent again.
    #[serde(default)]
    pub redirected: u64,
    pub failed_ops: u64,
    pub errors: BTreeMap<String, u64>,
    pub per_node: Vec<NodeResult>,
    /// Ops completed in each second since the start; the first `warmup_s` seconds are warm-up.
    pub per_second: Vec<u64>,
    /// Per op type and for whole batch round trips ("batch").
    pub latency_us: BTreeMap<String, LatencySummary>,
    /// The same histograms, nanoseconds, HdrHistogram V2 deflate + base64.
    pub histograms: BTreeMap<String, String>,
    /// kvbench's own CPU over the measured window, percent of one core.
    pub client_cpu_percent: f64,
    /// How many runs this result combines (1 unless made by `kvbench merge`).
    pub merged_runs: usize,
    /// Stopped early by Ctrl-C: the figures cover the window measured until then.
    #[serde(default)]
    pub interrupted: bool,
    /// Per node (shard order), per second since the start (warm-up included, as
    /// `per_second`): the client's batch round trips to that node, as latency histograms
    /// (`buckets` of `[bucket, count]`, see kvshared's `latency`; `sum_ns`).
    #[serde(default)]
    pub node_timeline: Vec<Vec<kvshared::latency::Latency>>,
}

impl RunResult {
    /// Builds a result from the engine's output and the servers' stats around the window.
    pub fn from_engine(
        out: &EngineOutput,
        options: RunOptions,
        workload: WorkloadSpec,
        servers: Vec<Option<ServerFigures>>,
        client_cpu_percent: f64,
        started_unix_ms: u64,
    ) -> anyhow::Result<RunResult> {
        let secs = out.elapsed.as_secs_f64().max(1e-9);
        let mut latency_us = BTreeMap::new();
        let mut histograms = BTreeMap::new();
        let mut ops_by_type = BTreeMap::new();
        for t in OpType::ALL {
            let h = &out.hists[t as usize];
            if !h.is_empty() {
                latency_us.insert(t.name().to_string(), LatencySummary::of(h));
                histograms.insert(t.name().to_string(), hist::encode(h)?);
                ops_by_type.insert(t.name().to_string(), out.ops_by_type[t as usize]);
            }
        }
        if !out.batch_hist.is_empty() {
            latency_us.insert("batch".into(), LatencySummary::of(&out.batch_hist));
            histograms.insert("batch".into(), hist::encode(&out.batch_hist)?);
        }
        let mut per_node = Vec::new();
        for (i, ((addr, &ops), server)) in options.nodes.iter().zip(&out.per_node_ops).zip(servers).enumerate() {
            let mut n = NodeResult {
                addr: addr.clone(),
                ops,
                ops_per_sec: ops as f64 / secs,
                server,
                ..NodeResult::default()
            };
            if let Some([reads, writes]) = out.node_batches.get(i) {
                n.set_batches([reads, writes])?;
            }
            per_node.push(n);
        }
        Ok(RunResult {
            kvbench_version: env!("CARGO_PKG_VERSION").to_string(),
            started_unix_ms,
            command_line: std::env::args().collect(),
            machine: Machine::this(),
            open_loop: options.rate.is_some(),
            options,
            workload: Some(workload),
            elapsed_s: out.elapsed.as_secs_f64(),
            ops: out.ops(),
            ops_per_sec: out.ops() as f64 / secs,
            ops_by_type,
            wire_ops_completed: out.wire_ops_completed,
            read_misses: out.read_misses,
            measured_read_misses: out.measured_read_misses,
            fills: out.fills,
            redirected: out.redirected,
            failed_ops: out.failed_ops,
            errors: out.errors.clone(),
            per_node,
            per_second: out.per_second.clone(),
            latency_us,
            histograms,
            client_cpu_percent,
            merged_runs: 1,
            interrupted: false,
            node_timeline: out.node_timeline.clone(),
        })
    }

    /// Combines runs made at the same time from several client machines against one cluster:
    /// throughputs and counts add, histograms are merged and percentiles recomputed from them.
    pub fn merge(results: &[RunResult]) -> anyhow::Result<RunResult> {
        let Some(first) = results.first() else {
            anyhow::bail!("nothing to merge");
        };
        let mut m = first.clone();
        m.merged_runs = 0;
        m.interrupted = results.iter().any(|r| r.interrupted);
        m.ops = 0;
        m.ops_per_sec = 0.0;
        m.ops_by_type.clear();
        m.wire_ops_completed = 0;
        m.read_misses = 0;
        m.measured_read_misses = 0;
        m.fills = 0;
        m.redirected = 0;
        m.failed_ops = 0;
        m.errors.clear();
        m.per_second.clear();
        m.node_timeline.clear();
        m.client_cpu_percent = 0.0;
        m.elapsed_s = 0.0;
        for n in &mut m.per_node {
            n.ops = 0;
            n.ops_per_sec = 0.0;
        }
        let mut hists: BTreeMap<String, hist::Hist> = BTreeMap::new();
        // Per node (by address): its batch histograms, reads only and with a write.
        let mut node_hists: BTreeMap<String, [hist::Hist; 2]> = BTreeMap::new();
        for r in results {
            for n in &r.per_node {
                let acc = node_hists
                    .entry(n.addr.clone())
                    .or_insert_with(|| [hist::new_hist(), hist::new_hist()]);
                for (k, name) in NODE_BATCH_KINDS.iter().enumerate() {
                    if let Some(text) = n.histograms.get(*name) {
                        acc[k]
                            .add(&hist::decode(text)?)
                            .map_err(|e| anyhow::anyhow!("cannot merge {name} histograms: {e:?}"))?;
                    }
                }
            }
            m.merged_runs += r.merged_runs.max(1);
            m.ops += r.ops;
            m.ops_per_sec += r.ops_per_sec;
            m.wire_ops_completed += r.wire_ops_completed;
            m.read_misses += r.read_misses;
            m.measured_read_misses += r.measured_read_misses;
            m.fills += r.fills;
            m.redirected += r.redirected;
            m.failed_ops += r.failed_ops;
            m.client_cpu_percent += r.client_cpu_percent;
            m.elapsed_s = m.elapsed_s.max(r.elapsed_s);
            for (k, v) in &r.ops_by_type {
                *m.ops_by_type.entry(k.clone()).or_insert(0) += v;
            }
            for (k, v) in &r.errors {
                *m.errors.entry(k.clone()).or_insert(0) += v;
            }
            for (i, v) in r.per_second.iter().enumerate() {
                if m.per_second.len() <= i {
                    m.per_second.push(0);
                }
                m.per_second[i] += v;
            }
            // Clients list the nodes in the same (shard) order.
            crate::timeline::merge(&mut m.node_timeline, &r.node_timeline);
            for n in &r.per_node {
                match m.per_node.iter_mut().find(|x| x.addr == n.addr) {
                    Some(x) => {
                        x.ops += n.ops;
                        x.ops_per_sec += n.ops_per_sec;
                        // Every client saw the same servers; keep the first report of them.
                        if x.server.is_none() {
                            x.server = n.server.clone();
                        }
                    }
                    None => m.per_node.push(n.clone()),
                }
            }
            for (k, text) in &r.histograms {
                let h = hist::decode(text)?;
                match hists.get_mut(k) {
                    Some(acc) => acc
                        .add(&h)
                        .map_err(|e| anyhow::anyhow!("cannot merge {k} histograms: {e:?}"))?,
                    None => {
                        hists.insert(k.clone(), h);
                    }
                }
            }
        }
        m.latency_us = hists.iter().map(|(k, h)| (k.clone(), LatencySummary::of(h))).collect();
        for n in &mut m.per_node {
            if let Some([reads, writes]) = node_hists.get(&n.addr) {
                n.set_batches([reads, writes])?;
            }
        }
        m.histograms = hists
            .iter()
            .map(|(k, h)| Ok((k.clone(), hist::encode(h)?)))
            .collect::<anyhow::Result<_>>()?;
        Ok(m)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hist::new_hist;

    fn result(ops: u64, latencies: &[u64], addr: &str) -> RunResult {
        let mut h = new_hist();
        for &l in latencies {
            h.record(l).unwrap();
        }
        RunResult {
            ops,
            ops_per_sec: ops as f64,
            elapsed_s: 1.0,
            per_node: vec![NodeResult {
                addr: addr.into(),
                ops,
                ops_per_sec: ops as f64,
                server: None,
                ..NodeResult::default()
            }],
            per_second: vec![ops],
            latency_us: [("read".to_string(), LatencySummary::of(&h))].into(),
            histograms: [("read".to_string(), hist::encode(&h).unwrap())].into(),
            merged_runs: 1,
            ..RunResult::default()
        }
    }

    /// A node restarted during the window: its counters started again, so the figures are
    /// those since the restart and the summary says so (not "0 op/s, CPU 0%").
    #[test]
    fn a_node_restarted_in_the_window_is_reported_with_figures_since_the_restart() {
        let stats = |pid: u32, uptime_ms: u64, gets: u64| NodeStats {
            pid,
            uptime_ms,
            counts: kvshared::stats::Counts {
                gets,
                ..Default::default()
            },
            ..NodeStats::default()
        };
        let figures = ServerFigures::between(&stats(10, 60_000, 9_000_000), &stats(11, 2_000, 400_000), 10.0);
        assert!(figures.restarted);
        assert_eq!(figures.seconds, 2.0);
        assert_eq!(figures.ops_per_sec, 200_000.0);
        let mut r = result(100, &[1_000], "n0");
        r.per_node[0].server = Some(figures);
        let text = crate::report::summary(&r);
        assert!(
            text.contains("RESTARTED during the run; since then (2.0 s): 200k op/s"),
            "{text}"
        );
    }

    #[test]
    fn merge_adds_throughput_and_merges_histograms() {
        let a = result(100, &[1_000, 2_000, 3_000], "n0");
        let b = result(300, &[10_000, 20_000, 30_000], "n0");
        let m = RunResult::merge(&[a, b]).unwrap();
        assert_eq!((m.ops, m.ops_per_sec, m.merged_runs), (400, 400.0, 2));
        assert_eq!(m.per_node.len(), 1);
        assert_eq!(m.per_node[0].ops, 400);
        assert_eq!(m.per_second, vec![400]);
        let read = &m.latency_us["read"];
        assert_eq!(read.count, 6);
        assert!((read.max_us - 30.0).abs() < 0.1);
        // The median of the combined samples, not an average of the two medians (2 and 20).
        assert!((read.p50_us - 3.0).abs() < 0.1, "{}", read.p50_us);
    }

    #[test]
    fn a_nodes_read_and_write_batches_merge_across_clients() {
        let with = |reads: &[u64], writes: &[u64]| {
            let mut r = result(1, &[1_000], "n0");
            let (mut hr, mut hw) = (new_hist(), new_hist());
            reads.iter().for_each(|&l| hr.record(l).unwrap());
            writes.iter().for_each(|&l| hw.record(l).unwrap());
            r.per_node[0].set_batches([&hr, &hw]).unwrap();
            r
        };
        let a = with(&[1_000, 2_000], &[]);
        assert!(a.per_node[0].write_batches_us.is_none());
        let b = with(&[3_000], &[50_000, 70_000]);
        let m = RunResult::merge(&[a, b]).unwrap();
        let n = &m.per_node[0];
        let (r, w) = (
            n.read_batches_us.as_ref().unwrap(),
            n.write_batches_us.as_ref().unwrap(),
        );
        assert_eq!((r.count, w.count), (3, 2));
        assert!(
            (r.mean_us - 2.0).abs() < 0.1 && (w.max_us - 70.0).abs() < 0.5,
            "{r:?} {w:?}"
        );
    }
}
