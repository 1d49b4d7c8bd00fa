//! `kvbench run --tui`: the kvtui dashboard with this run's progress, throughput and latency.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Instant;

use kvshared::client::Cluster;
use kvtui::{BenchProgress, BenchSource, DashboardConfig, Exit};

use crate::engine::Live;
use crate::interrupt::Interrupt;
use crate::result::RunResult;
use crate::run::{RunPlan, run_live};

/// A running benchmark as the dashboard sees it.
struct LiveBench {
    live: Arc<Live>,
    title: String,
}

impl BenchSource for LiveBench {
    fn progress(&self) -> BenchProgress {
        let live = &self.live;
        let recent = Some(live.take_recent_latency()).filter(|h| !h.is_empty()).map(|h| {
            (
                h.value_at_quantile(0.5) as f64 / 1000.0,
                h.value_at_quantile(0.99) as f64 / 1000.0,
            )
        });
        BenchProgress {
            title: self.title.clone(),
            elapsed: Instant::now().saturating_duration_since(live.started),
            warmup: live.measure_start.saturating_duration_since(live.started),
            total: live.measure_end.saturating_duration_since(live.started),
            completed_ops: live.completed.load(Ordering::Relaxed),
            measured_ops: live.measured.load(Ordering::Relaxed),
            failed_ops: live.failed.load(Ordering::Relaxed),
            recent_latency_us: recent,
            done: live.stop.load(Ordering::Relaxed),
        }
    }
}

/// Runs the benchmark with the dashboard in the foreground; pressing q stops the run early
/// (the result then covers the time measured so far).
pub async fn run_with_dashboard(
    cluster: Arc<Cluster>,
    plan: &RunPlan,
    interrupt: &Interrupt,
) -> anyhow::Result<RunResult> {
    let plan = RunPlan {
        show_progress: false,
        ..plan.clone()
    };
    let live = Live::new(&plan.engine);
    live.track_recent_latency.store(true, Ordering::Relaxed);
    let nodes: Vec<String> = (0..cluster.node_count()).map(|n| cluster.addr(n).to_string()).collect();
    let run = {
        let (cluster, plan, live, interrupt) = (cluster.clone(), plan.clone(), live.clone(), interrupt.clone());
        tokio::spawn(async move { run_live(cluster, &plan, live, &interrupt).await })
    };
    let source: Arc<dyn BenchSource> = Arc::new(LiveBench {
        live: live.clone(),
        title: format!(
            "workload {:?}, {} tasks, batch {}",
            plan.workload.workload, plan.engine.tasks, plan.engine.batch
        )
        .to_lowercase(),
    });
    let handle = tokio::runtime::Handle::current();
    let config = DashboardConfig {
        nodes,
        client: cluster.config().clone(),
        interval: std::time::Duration::from_millis(500),
        window: std::time::Duration::from_secs(60),
        record: None,
        replay: None,
    };
    let exit = tokio::task::spawn_blocking(move || kvtui::run_dashboard(&handle, config, Some(source))).await??;
    if exit == Exit::Quit {
        live.stop_early();
    }
    run.await?
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::EngineConfig;
    use std::time::Duration;

    #[test]
    fn progress_reports_the_window_counters_and_recent_latency() {
        let live = Live::new(&EngineConfig {
            tasks: 1,
            batch: 1,
            warmup: Duration::from_secs(2),
            duration: Duration::from_secs(10),
            ops_limit: None,
            rate: None,
            seed: 1,
            cache_aside: false,
            split_reads: false,
            threads: 1,
        });
        live.completed.store(1234, Ordering::Relaxed);
        live.measured.store(1000, Ordering::Relaxed);
        live.failed.store(5, Ordering::Relaxed);
        for ns in [100_000u64, 200_000, 300_000] {
            live.recent_latency.lock().record(ns).unwrap();
        }
        let source = LiveBench {
            live: live.clone(),
            title: "t".into(),
        };
        let p = source.progress();
        assert_eq!((p.completed_ops, p.failed_ops, p.done), (1234, 5, false));
        assert_eq!(p.measured_ops, 1000, "the summary's count, without the warm-up");
        assert_eq!((p.warmup, p.total), (Duration::from_secs(2), Duration::from_secs(12)));
        let (p50, p99) = p.recent_latency_us.unwrap();
        assert!((p50 - 200.0).abs() < 1.0 && (p99 - 300.0).abs() < 1.0, "{p50} {p99}");
        // Taken: the next report covers only what came after.
        assert!(source.progress().recent_latency_us.is_none());
        live.stop.store(true, Ordering::Relaxed);
        assert!(source.progress().done);
    }
}
