//! `kvtui --once`: one sample per node (rates over one interval) as JSON or as the table's
//! text, for scripts and CI.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use kvshared::client::{ClientConfig, Cluster};
use serde::Serialize;

use crate::state::{ClusterView, Health, Sample, Totals};
use crate::ui::table;

/// One node in the JSON output: the table's fields.
#[derive(Debug, Serialize)]
pub struct NodeRow {
    pub addr: String,
    pub up: bool,
    pub error: Option<String>,
    pub shard: Option<String>,
    pub uptime_s: Option<u64>,
    pub keys: Option<u64>,
    pub ops_per_sec: Option<f64>,
    pub gets_per_sec: Option<f64>,
    pub puts_per_sec: Option<f64>,
    pub hit_ratio: Option<f64>,
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
    pub total: Totals,
}

async fn sample_all(cluster: &Cluster, view: &mut ClusterView) {
    for node in 0..cluster.node_count() {
        let result = cluster.stats(node).await.map_err(|e| e.to_string());
        view.apply(Sample {
            node,
            at: Instant::now(),
            result,
        });
    }
}

/// Samples every node twice, `interval` apart.
pub async fn sample_once(nodes: &[String], config: ClientConfig, interval: Duration) -> anyhow::Result<ClusterView> {
    let cluster = Cluster::new(nodes, config)?;
    let mut view = ClusterView::new(nodes);
    sample_all(&cluster, &mut view).await;
    tokio::time::sleep(interval).await;
    sample_all(&cluster, &mut view).await;
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
                up: n.is_up(),
                error: match &n.health {
                    Health::Down { error } => Some(error.clone()),
                    _ => None,
                },
                shard: s.map(|s| s.shard.to_string()),
                uptime_s: s.map(|s| s.uptime_ms / 1000),
                keys: s.map(|s| s.keys),
                ops_per_sec: r.map(|r| r.ops_per_sec),
                gets_per_sec: r.map(|r| r.gets_per_sec),
                puts_per_sec: r.map(|r| r.puts_per_sec),
                hit_ratio: r.and_then(|r| r.hit_ratio),
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
        total: view.totals(),
    }
}

/// The table as text, plus a line per node that is down.
pub fn text(view: &ClusterView) -> String {
    let mut out = table::as_text(view, Instant::now(), 180);
    for n in &view.nodes {
        if let Health::Down { error } = &n.health {
            out.push_str(&format!("{} is down: {error}\n", n.addr));
        }
    }
    out
}
