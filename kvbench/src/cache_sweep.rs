//! `kvbench sweep --cache-sizes`: the cluster as a cache in front of a database (as the seed
//! reports use it), at several memory caps. At each size every node is flushed and capped
//! (its share of the size), then the workload runs cache-aside (a get that misses is
//! filled with a put). Each point reports the hit ratio kvd's approximate LRU reached after
//! warm-up, next to the hit ratio an exact LRU holding as many entries would have had on the
//! same key sequence (simulated here from the same generator and seed), and the throughput.

use std::num::NonZeroUsize;
use std::path::Path;
use std::sync::Arc;

use anyhow::Context;
use kvshared::client::Cluster;
use kvshared::units::{bytes, si};
use kvshared::wire::ConfigRequest;
use serde::Serialize;

use crate::chart::LineChart;
use crate::interrupt::Interrupt;
use crate::result::RunResult;
use crate::run::{RunPlan, run_plan};
use crate::workload::{OpGen, OpType, Shared};

/// Key draws the exact-LRU simulation makes at most per point.
const MAX_SIMULATED: u64 = 5_000_000;

/// One cache size's figures.
#[derive(Serialize, Debug, Clone)]
pub struct CachePoint {
    /// The cluster's cap, bytes (each node gets its share).
    pub cache_bytes: u64,
    /// Keys the cluster held at the end of the point.
    pub keys_held: u64,
    /// Hit ratio of kvd's gets in the measured window.
    pub hit_ratio: f64,
    /// Hit ratio of an exact LRU of `keys_held` entries on the same key sequence.
    pub exact_lru_hit_ratio: f64,
    /// Throughput, op/s (fills not counted).
    pub ops_per_sec: f64,
    /// Keys evicted during the point.
    pub evicted: u64,
}

/// Runs the cache sweep: one point per size in `sizes`, results and charts in `out`.
pub async fn run(
    cluster: Arc<Cluster>,
    base: &RunPlan,
    sizes: &[u64],
    out: &Path,
    interrupt: &Interrupt,
) -> anyhow::Result<(Vec<CachePoint>, Vec<RunResult>)> {
    let nodes = cluster.node_count();
    let mut before = Vec::with_capacity(nodes);
    for node in 0..nodes {
        before.push(cluster.stats(node).await?.max_memory_bytes);
    }
    let mut plan = base.clone();
    plan.engine.cache_aside = true;
    let mut points = Vec::new();
    let mut results = Vec::new();
    let csv_path = out.join("cache.csv");
    let mut csv = csv::Writer::from_path(&csv_path).with_context(|| format!("cannot write {}", csv_path.display()))?;
    for &size in sizes {
        if interrupt.is_set() {
            break;
        }
        let share = (size / nodes as u64).max(1);
        let reset = ConfigRequest {
            max_memory_bytes: Some(share),
            flush: true,
        };
        for node in 0..nodes {
            cluster.configure(node, &reset).await?;
        }
        let evicted_before = evicted(&cluster).await?;
        let r = run_plan(cluster.clone(), &plan, interrupt).await?;
        let mut keys_held = 0;
        for node in 0..nodes {
            keys_held += cluster.stats(node).await?.keys;
        }
        let reads = r.ops_by_type.get(OpType::Read.name()).copied().unwrap_or(0);
        let hit_ratio = match reads {
            0 => 0.0,
            n => 1.0 - r.measured_read_misses as f64 / n as f64,
        };
        let point = CachePoint {
            cache_bytes: size,
            keys_held,
            hit_ratio,
            exact_lru_hit_ratio: exact_lru_hit_ratio(&plan, keys_held, reads),
            ops_per_sec: r.ops_per_sec,
            evicted: evicted(&cluster).await?.saturating_sub(evicted_before),
        };
        kvshared::outln!(
            "cache {:>10}  keys {:>10}  hit ratio {:>6.2}%  exact LRU {:>6.2}%  ({:+.2} points)  {:>12}",
            bytes(size as f64),
            point.keys_held,
            100.0 * point.hit_ratio,
            100.0 * point.exact_lru_hit_ratio,
            100.0 * (point.hit_ratio - point.exact_lru_hit_ratio),
            format!("{} op/s", si(point.ops_per_sec))
        )?;
        csv.serialize(&point)?;
        csv.flush()?;
        points.push(point);
        results.push(r);
    }
    // Leave the nodes capped as they were (the data is gone: the sweep flushed it).
    for (node, &max) in before.iter().enumerate() {
        let restore = ConfigRequest {
            max_memory_bytes: Some(max),
            flush: false,
        };
        cluster.configure(node, &restore).await?;
    }
    write_chart(out, &points)?;
    Ok((points, results))
}

async fn evicted(cluster: &Cluster) -> anyhow::Result<u64> {
    let mut total = 0;
    for node in 0..cluster.node_count() {
        total += cluster.stats(node).await?.counts.evicted;
    }
    Ok(total)
}

/// The hit ratio of an exact LRU cache of `entries` keys on the reads of `plan`'s workload
/// (same generator, same seed; draws are independent, so one stream stands for the
/// interleaving of all tasks'). Counted after the cache has had time to fill, as the run's
/// warm-up lets kvd's cache fill.
pub fn exact_lru_hit_ratio(plan: &RunPlan, entries: u64, reads: u64) -> f64 {
    let Some(capacity) = NonZeroUsize::new(entries as usize) else {
        return 0.0;
    };
    let shared = Shared::new(plan.workload.clone(), 1);
    let mut generator = OpGen::new(shared, plan.engine.seed);
    let mut cache = lru::LruCache::new(capacity);
    let warm = 4 * entries;
    let measured = reads.clamp(100_000, MAX_SIMULATED);
    let (mut hits, mut counted) = (0u64, 0u64);
    let mut drawn = 0u64;
    while counted < measured {
        let (op, key) = generator.next_op();
        if op != OpType::Read {
            continue;
        }
        drawn += 1;
        let hit = cache.get(&key).is_some();
        if !hit {
            cache.put(key, ());
        }
        if drawn > warm {
            counted += 1;
            hits += u64::from(hit);
        }
    }
    hits as f64 / counted as f64
}

fn write_chart(dir: &Path, points: &[CachePoint]) -> anyhow::Result<()> {
    let series = |f: fn(&CachePoint) -> f64| {
        points
            .iter()
            .map(|p| (p.cache_bytes as f64 / 1e6, 100.0 * f(p)))
            .collect()
    };
    LineChart {
        title: "Hit ratio vs cache size".into(),
        x_label: "cluster --max-memory (MB)".into(),
        y_label: "hit ratio (%)".into(),
        log_x: true,
        log_y: false,
        series: vec![
            ("kvd (sampled LRU)".into(), series(|p| p.hit_ratio)),
            ("exact LRU, same entries".into(), series(|p| p.exact_lru_hit_ratio)),
        ],
    }
    .write(&dir.join("hit-ratio-vs-cache-size"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::EngineConfig;
    use crate::workload::{SpecOptions, Workload, WorkloadSpec};

    fn plan(workload: Workload, records: u64) -> RunPlan {
        RunPlan {
            engine: EngineConfig {
                tasks: 1,
                batch: 1,
                warmup: std::time::Duration::ZERO,
                duration: std::time::Duration::ZERO,
                ops_limit: None,
                rate: None,
                seed: 1,
                cache_aside: true,
                split_reads: false,
                threads: 1,
            },
            workload: WorkloadSpec::new(
                workload,
                &SpecOptions {
                    records,
                    value_size: 128,
                    ..SpecOptions::default()
                },
            ),
            show_progress: false,
        }
    }

    /// Uniform reads over 100 keys: an exact LRU of 25 holds a quarter of them.
    #[test]
    fn exact_lru_of_uniform_keys_hits_in_proportion_to_its_size() {
        let ratio = exact_lru_hit_ratio(&plan(Workload::Getpopular, 1000), 25, 200_000);
        assert!((ratio - 0.25).abs() < 0.01, "{ratio}");
        assert_eq!(exact_lru_hit_ratio(&plan(Workload::Getpopular, 1000), 0, 1000), 0.0);
    }

    /// Zipfian reads: a cache of 10% of the keys catches well over 10% of the reads.
    #[test]
    fn exact_lru_of_zipfian_keys_beats_the_cache_fraction() {
        let ratio = exact_lru_hit_ratio(&plan(Workload::C, 100_000), 10_000, 200_000);
        assert!(ratio > 0.5, "{ratio}");
    }
}
