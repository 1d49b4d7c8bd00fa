//! `kvbench run`: drive the cluster, read the servers' stats around the measured window,
//! and report.
//!
//! The command layer ([`command`]) turns flags into a [`RunPlan`]; everything below it takes
//! the plan, so `sweep` and the dashboard run the same code with plans of their own.

use std::io::{IsTerminal, Write as _};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use kvshared::client::Cluster;
use kvshared::frame::AlignedVec;
use kvshared::frame::FrameKind;
use kvshared::stats::NodeStats;
use kvshared::units::{grouped, si};
use kvshared::wire::encode_frame;

use crate::cli::{BenchArgs, RunArgs};
use crate::connect;
use crate::cpu::own_cpu_ms;
use crate::engine::{self, BatchFiller, EngineConfig, Live};
use crate::interrupt::Interrupt;
use crate::progress;
use crate::report::{self, CsvRow};
use crate::result::{RunOptions, RunResult, ServerFigures};
use crate::workload::{Shared, WorkloadSpec};

/// Exit status when ops failed (and failures were not allowed).
pub const EXIT_FAILURES: u8 = 1;
/// Exit status of a run stopped by Ctrl-C (128 + SIGINT, as shells report it).
pub const EXIT_INTERRUPTED: u8 = 130;

/// Everything one run needs to know, independent of how it was asked for.
#[derive(Clone, Debug)]
pub struct RunPlan {
    /// Load shape and timing.
    pub engine: EngineConfig,
    /// What the ops are.
    pub workload: WorkloadSpec,
    /// Show progress on stderr.
    pub show_progress: bool,
}

impl RunPlan {
    /// The plan the shared run flags describe, with `tasks` tasks and batches of `batch`.
    pub fn new(bench: &BenchArgs, tasks: usize, batch: usize, show_progress: bool) -> RunPlan {
        let timing = &bench.timing;
        RunPlan {
            engine: EngineConfig {
                tasks: tasks.max(1),
                batch: batch.max(1),
                warmup: timing.warmup,
                duration: timing.duration,
                ops_limit: timing.ops,
                rate: timing.rate,
                seed: timing.seed,
                cache_aside: false,
                split_reads: bench.cluster.split_reads,
                threads: bench.cluster.threads.unwrap_or_else(default_threads),
            },
            workload: WorkloadSpec::new(bench.workload.workload, &bench.workload.spec_options()),
            show_progress,
        }
    }

    /// The plan `kvbench run` flags describe.
    pub fn from_args(args: &RunArgs) -> RunPlan {
        RunPlan::new(&args.bench, args.tasks, args.batch, !args.quiet)
    }

    /// The same plan with another task count and batch size (a sweep point).
    pub fn point(&self, tasks: usize, batch: usize) -> RunPlan {
        let mut p = self.clone();
        p.engine.tasks = tasks.max(1);
        p.engine.batch = batch.max(1);
        p
    }
}

/// Runs one benchmark; Ctrl-C (through `interrupt`) ends it early with a partial result.
pub async fn run_plan(cluster: Arc<Cluster>, plan: &RunPlan, interrupt: &Interrupt) -> anyhow::Result<RunResult> {
    let live = Live::new(&plan.engine);
    run_live(cluster, plan, live, interrupt).await
}

/// Runs one benchmark whose progress can be watched through `live` (made from the plan).
pub async fn run_live(
    cluster: Arc<Cluster>,
    plan: &RunPlan,
    live: Arc<Live>,
    interrupt: &Interrupt,
) -> anyhow::Result<RunResult> {
    let cfg = plan.engine.clone();
    plan.workload
        .check(cluster.node_count() as u32)
        .map_err(|e| anyhow::anyhow!(e))?;
    let slots = cluster.slots().clone();
    let shared = Shared::with_owners(plan.workload.clone(), cluster.node_count() as u32, &|s| {
        u32::from(slots.owner(s))
    });
    let started_unix_ms = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0);
    let progress = plan
        .show_progress
        .then(|| tokio::spawn(progress::watch(live.clone(), cfg.warmup + cfg.duration)));
    let stopper = {
        let (live, interrupt) = (live.clone(), interrupt.clone());
        tokio::spawn(async move {
            interrupt.wait().await;
            live.stop_early();
        })
    };

    // Figures at the start of the measured window, taken beside the load.
    let window_start = {
        let (cluster, live) = (cluster.clone(), live.clone());
        tokio::spawn(async move {
            tokio::time::sleep_until(live.measure_start.into()).await;
            (Instant::now(), all_stats(&cluster).await, own_cpu_ms())
        })
    };
    let out = engine::run(cluster.clone(), shared, cfg.clone(), live.clone()).await;
    stopper.abort();
    let interrupted = interrupt.is_set();
    if let Some(p) = progress {
        let _ = p.await;
    }
    // Interrupted during warm-up: there is no window and no server figures.
    let (t0, stats0, cpu0) = if !interrupted || Instant::now() >= live.measure_start {
        window_start.await?
    } else {
        window_start.abort();
        (Instant::now(), vec![None; cluster.node_count()], own_cpu_ms())
    };
    let end = (Instant::now(), all_stats(&cluster).await, own_cpu_ms());
    let secs = end.0.duration_since(t0).as_secs_f64();
    let servers = stats0
        .iter()
        .zip(&end.1)
        .map(|(a, b)| match (a, b) {
            (Some(a), Some(b)) => Some(ServerFigures::between(a, b, secs)),
            _ => None,
        })
        .collect();
    let client_cpu = end.2.saturating_sub(cpu0) as f64 / 10.0 / secs.max(1e-9);
    let options = RunOptions {
        nodes: (0..cluster.node_count()).map(|n| cluster.addr(n).to_string()).collect(),
        tasks: cfg.tasks,
        batch: cfg.batch,
        pipeline: cluster.config().pipeline,
        conns: cluster.config().conns_per_node,
        // The load threads that ran (at most one per connection).
        threads: engine::load_threads(cfg.tasks, cfg.threads, cluster.config().conns_per_node),
        duration_s: cfg.duration.as_secs_f64(),
        warmup_s: cfg.warmup.as_secs_f64(),
        ops_limit: cfg.ops_limit,
        rate: cfg.rate,
        seed: cfg.seed,
        timeout_ms: cluster.config().request_timeout.as_millis() as u64,
    };
    let mut result = RunResult::from_engine(
        &out,
        options,
        plan.workload.clone(),
        servers,
        client_cpu,
        started_unix_ms,
    )?;
    result.interrupted = interrupted;
    Ok(result)
}

/// Every node's stats, `None` for a node that does not answer.
async fn all_stats(cluster: &Cluster) -> Vec<Option<NodeStats>> {
    let mut v = Vec::with_capacity(cluster.node_count());
    for n in 0..cluster.node_count() {
        v.push(cluster.stats(n).await.ok());
    }
    v
}

/// Worker threads when `--threads` is not given: one per CPU.
pub fn default_threads() -> usize {
    std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1)
}

/// The exit status a finished run earns (see `kvbench --help`).
pub fn exit_status(result: &RunResult, allow_failures: bool) -> ExitCode {
    if result.interrupted {
        ExitCode::from(EXIT_INTERRUPTED)
    } else if result.failed_ops > 0 && !allow_failures {
        ExitCode::from(EXIT_FAILURES)
    } else {
        ExitCode::SUCCESS
    }
}

/// `kvbench run`.
pub async fn command(args: RunArgs, interrupt: Interrupt) -> anyhow::Result<ExitCode> {
    if args.dry_run {
        dry_run(&args)?;
        return Ok(ExitCode::SUCCESS);
    }
    let plan = RunPlan::from_args(&args);
    let cluster = connect::cluster(&args.bench.cluster).await?;
    let result = if args.tui && std::io::stdout().is_terminal() {
        crate::tui::run_with_dashboard(cluster, &plan, &interrupt).await?
    } else {
        // Without a terminal, --tui falls back to plain progress lines.
        run_plan(cluster, &plan, &interrupt).await?
    };
    let json_to_stdout = args.json.as_deref() == Some(std::path::Path::new("-"));
    let text = report::summary(&result);
    if json_to_stdout {
        eprint!("{text}");
        let mut out = std::io::stdout().lock();
        serde_json::to_writer_pretty(&mut out, &result)?;
        writeln!(out)?;
    } else {
        kvshared::out!("{text}")?;
        if let Some(path) = &args.json {
            std::fs::write(path, serde_json::to_vec_pretty(&result)?)?;
            eprintln!("kvbench: result written to {}", path.display());
        }
    }
    if let Some(path) = &args.csv {
        report::append_csv(path, &CsvRow::of(&result))?;
    }
    if let Some(stem) = &args.timeline {
        let title = "Each shard's p99 batch round trip, second by second";
        crate::timeline::chart(&result.node_timeline, &result.options.nodes, title, stem)?;
        eprintln!("kvbench: timeline chart written to {}.png and .svg", stem.display());
    }
    if result.failed_ops > 0 && !args.allow_failures && !result.interrupted {
        eprintln!(
            "kvbench: {} ops failed; exit status {EXIT_FAILURES} (--allow-failures to accept failures)",
            grouped(result.failed_ops)
        );
    }
    Ok(exit_status(&result, args.allow_failures))
}

/// Generates and encodes ops on this thread without sending anything: kvbench's own cost.
fn dry_run(args: &RunArgs) -> anyhow::Result<()> {
    let nodes = args.bench.cluster.nodes.node_list()?.len();
    let spec = WorkloadSpec::new(args.bench.workload.workload, &args.bench.workload.spec_options());
    let describe = spec.describe();
    let prefix = spec.key_prefix.clone();
    spec.check(nodes as u32).map_err(|e| anyhow::anyhow!(e))?;
    let build = Instant::now();
    let shared = Shared::new(spec, nodes as u32);
    let setup = build.elapsed();
    let mut filler = BatchFiller::new(
        shared,
        args.bench.timing.seed,
        (nodes, Arc::new(kvshared::slots::SlotTable::for_client(nodes as u32))),
        args.batch.max(1),
        args.bench.cluster.split_reads,
    );
    let mut frame = AlignedVec::new();
    let budget = args.bench.timing.duration.min(Duration::from_secs(5));
    let start = Instant::now();
    let cpu0 = own_cpu_ms();
    let mut bytes = 0u64;
    let mut batches = 0u64;
    while start.elapsed() < budget {
        for _ in 0..64 {
            let lane = filler.fill(&prefix);
            encode_frame(FrameKind::BatchRequest, batches, filler.request(lane), &mut frame)?;
            bytes += frame.len() as u64;
            batches += 1;
            filler.take_counts(lane);
        }
    }
    let secs = start.elapsed().as_secs_f64();
    let cpu = (own_cpu_ms().saturating_sub(cpu0)) as f64 / 1000.0;
    let ops = filler.generated;
    kvshared::outln!("dry run    {describe}")?;
    kvshared::outln!(
        "           {} nodes, batch {}: generated and encoded {} ops in {:.2} s on one thread",
        nodes,
        args.batch,
        grouped(ops),
        secs
    )?;
    kvshared::outln!(
        "rate       {} op/s per core ({} op/s wall clock), {} batches, {:.1} bytes/op on the wire",
        si(ops as f64 / cpu.max(1e-9)),
        si(ops as f64 / secs),
        grouped(batches),
        bytes as f64 / ops.max(1) as f64
    )?;
    kvshared::outln!(
        "setup      key generator ready in {:.1} ms",
        setup.as_secs_f64() * 1000.0
    )?;
    Ok(())
}
