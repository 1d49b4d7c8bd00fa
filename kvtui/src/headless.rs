//! `kvtui --once`: one sample per node (rates over one interval) as JSON or as the table's
//! text, for scripts and CI.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use kvshared::client::{ClientConfig, Cluster};
use serde::Serialize;

use crate::state::{ClusterView, Health, Origin, Sample, Standing, Totals};
use crate::ui::table;

/// One node in the JSON output: the table's fields.
#[derive(Debug, Serialize)]
pub struct NodeRow {
    pub addr: String,
    /// Not in `--nodes`: a member its replica group reported.
    pub learned: bool,
    /// Its group's leader no longer lists it.
    pub removed: bool,
    /// Its role in its replica group (`leader`, `follower`, `learner`, ...); null in none.
    pub role: Option<String>,
    pub up: bool,
    pub error: Option<String>,
    pub shard: Option<String>,
    /// The hash slots it serves (`0-5461 (5462 slots)`).
    pub slots: Option<String>,
    /// Slot moves it has seen (`in 1,024 slots (33.1k keys/s), ...`), if any.
    pub slot_moves: Option<String>,
    pub uptime_s: Option<u64>,
    pub keys: Option<u64>,
    pub ops_per_sec: Option<f64>,
    pub gets_per_sec: Option<f64>,
    pub puts_per_sec: Option<f64>,
    /// Ops applied from the log per second (on a follower: the leader's writes, not served).
    pub applied_per_sec: Option<f64>,
    pub errors_per_sec: Option<f64>,
    pub hit_ratio: Option<f64>,
    /// Server-side service time over every op in the interval, in microseconds.
    pub p50_us: Option<f64>,
    pub p99_us: Option<f64>,
    /// kvd CPU, percent of one core, over the interval.
    pub cpu_percent: Option<f64>,
    pub host_cpu_percent: Option<f32>,
    pub rss_bytes: Option<u64>,
    pub host_mem_used_bytes: Option<u64>,
    pub host_mem_total_bytes: Option<u64>,
    pub net_in_per_sec: Option<f64>,
    pub net_out_per_sec: Option<f64>,
    pub nic_rx_per_sec: Option<f64>,
    pub nic_tx_per_sec: Option<f64>,
    pub gets: Option<u64>,
    pub puts: Option<u64>,
    pub deletes: Option<u64>,
    /// Error counters by kind (totals since the node started).
    pub errors: Option<BTreeMap<String, u64>>,
}

#[derive(Debug, Serialize)]
pub struct OnceReport {
    pub interval_ms: u64,
    pub nodes: Vec<NodeRow>,
    /// Sums over the nodes that answered; null when none did.
    pub total: Option<Totals>,
    /// What is wrong with `--nodes` as the nodes report it (wrong order, a shard served
    /// twice, a cluster of another size).
    pub problems: Vec<String>,
    /// Each host's CPU split: kvd, other processes, interrupts, idle.
    pub hosts: Vec<crate::hosts::HostView>,
}

async fn sample_all(cluster: &Cluster) -> Vec<Sample> {
    let mut samples = Vec::with_capacity(cluster.node_count());
    for node in 0..cluster.node_count() {
        let result = cluster.stats(node).await.map_err(|e| e.to_string());
        samples.push(Sample {
            node,
            at: Instant::now(),
            result,
        });
    }
    samples
}

/// Longest extra wait for kvd's system sampler (it samples CPU and NICs once a second).
const SYSTEM_SAMPLE_WAIT: Duration = Duration::from_millis(2500);

/// Samples every node twice, at least `interval` apart, and later if need be: until each
/// node that answered both times has taken a new CPU/NIC sample of its own in between
/// (kvd samples those once a second; two polls between the same two kvd samples would show
/// CPU 0).
/// The members replica groups report that `--nodes` left out are sampled too (a probe round
/// finds them).
pub async fn sample_once(nodes: &[String], config: ClientConfig, interval: Duration) -> anyhow::Result<ClusterView> {
    let mut addrs = crate::state::members(nodes);
    // Made first: sample times are measured from its start.
    let mut view = ClusterView::new(nodes);
    for s in sample_all(&Cluster::new(&addrs, config.clone())?).await {
        view.apply(s);
    }
    addrs.extend(view.discover().into_iter().map(|(_, addr)| addr));
    let cluster = Cluster::new(&addrs, config)?;
    let first = sample_all(&cluster).await;
    let started = Instant::now();
    tokio::time::sleep(interval).await;
    let last = loop {
        let last = sample_all(&cluster).await;
        let fresh = first.iter().zip(&last).all(|(a, b)| match (&a.result, &b.result) {
            (Ok(a), Ok(b)) => a.system.system_sampled_ms != b.system.system_sampled_ms || b.restarted_since(a),
            _ => true,
        });
        if fresh || started.elapsed() >= interval + SYSTEM_SAMPLE_WAIT {
            break last;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    for s in first.into_iter().chain(last) {
        view.apply(s);
    }
    view.tick(Instant::now());
    Ok(view)
}

pub fn report(view: &ClusterView, interval: Duration) -> OnceReport {
    let nodes = view
        .nodes
        .iter()
        .map(|n| {
            let s = n.stats.as_ref().filter(|_| n.is_up());
            let r = n.rates.as_ref();
            NodeRow {
                addr: n.addr.clone(),
                learned: n.origin == Origin::Learned,
                removed: n.standing == Standing::Removed,
                role: s.filter(|s| s.group.role.in_group()).map(|s| s.group.role.to_string()),
                up: n.is_up(),
                error: match &n.health {
                    Health::Down { error } => Some(error.clone()),
                    _ => None,
                },
                shard: s.map(|s| s.shard.to_string()),
                slots: s.map(|s| s.slots_summary()),
                slot_moves: s.and_then(|s| s.moves_summary(r.map(|r| r.keys_loaded_per_sec))),
                uptime_s: s.map(|s| s.uptime_ms / 1000),
                keys: s.map(|s| s.keys),
                ops_per_sec: r.map(|r| r.ops_per_sec),
                gets_per_sec: r.map(|r| r.gets_per_sec),
                puts_per_sec: r.map(|r| r.puts_per_sec),
                applied_per_sec: r.map(|r| r.applied_per_sec),
                errors_per_sec: r.map(|r| r.errors_per_sec),
                hit_ratio: r.and_then(|r| r.hit_ratio),
                p50_us: n.recent_quantiles_ns().map(|(p50, _)| p50 as f64 / 1e3),
                p99_us: n.recent_quantiles_ns().map(|(_, p99)| p99 as f64 / 1e3),
                cpu_percent: r.map(|r| r.process_cpu_percent),
                host_cpu_percent: s.map(|s| s.system.host_cpu_percent),
                rss_bytes: s.map(|s| s.system.process_rss_bytes),
                host_mem_used_bytes: s.map(|s| s.system.host_mem_used_bytes),
                host_mem_total_bytes: s.map(|s| s.system.host_mem_total_bytes),
                net_in_per_sec: r.map(|r| r.bytes_in_per_sec),
                net_out_per_sec: r.map(|r| r.bytes_out_per_sec),
                nic_rx_per_sec: r.map(|r| r.host_rx_per_sec),
                nic_tx_per_sec: r.map(|r| r.host_tx_per_sec),
                gets: s.map(|s| s.counts.gets),
                puts: s.map(|s| s.counts.puts),
                deletes: s.map(|s| s.counts.deletes),
                errors: s.map(|s| s.counts.errors_by_kind().map(|(k, v)| (k.to_string(), v)).collect()),
            }
        })
        .collect();
    OnceReport {
        interval_ms: interval.as_millis() as u64,
        nodes,
        total: Some(view.totals()).filter(|t| t.up > 0),
        problems: view.layout_problems().iter().map(ToString::to_string).collect(),
        hosts: crate::hosts::hosts(view),
    }
}

/// Membership changes `--once` prints under the table, at most.
const CHANGE_LINES: usize = 5;

/// The table as text, plus a line per node that is down and per recent membership change.
pub fn text(view: &ClusterView) -> String {
    let mut out = table::as_text(view, Instant::now(), 180);
    for n in &view.nodes {
        if let Health::Down { error } = &n.health {
            out.push_str(&format!("{} is down: {error}\n", n.addr));
        }
    }
    for h in crate::hosts::hosts(view) {
        out.push_str(&format!("{}\n", h.summary()));
    }
    for (shard, c) in view.recent_changes(CHANGE_LINES) {
        out.push_str(&format!("shard {shard}: {}\n", c.summary()));
    }
    for p in view.layout_problems() {
        out.push_str(&format!("warning: {p}\n"));
    }
    out
}
