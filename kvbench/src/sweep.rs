//! `kvbench sweep`: every point of a tasks x batch grid, each with its own warm-up; a CSV
//! row and a terminal line per point, then charts.

use std::path::Path;
use std::process::ExitCode;

use anyhow::Context;
use kvshared::units::si;

use crate::chart::LineChart;
use crate::cli::SweepArgs;
use crate::connect;
use crate::interrupt::Interrupt;
use crate::report::{CsvRow, append_csv};
use crate::result::RunResult;
use crate::run::{EXIT_FAILURES, EXIT_INTERRUPTED, RunPlan, run_plan};

/// `kvbench sweep`. Ctrl-C ends the sweep after the point in progress (which is reported
/// as interrupted); the charts then show the points measured so far.
pub async fn command(args: SweepArgs, interrupt: Interrupt) -> anyhow::Result<ExitCode> {
    std::fs::create_dir_all(&args.out).with_context(|| format!("cannot create {}", args.out.display()))?;
    let csv = args.out.join("sweep.csv");
    if csv.exists() {
        std::fs::remove_file(&csv)?;
    }
    let cluster = connect::cluster(&args.bench.cluster).await?;
    if !args.cache_sizes.is_empty() {
        return cache_command(&args, cluster, interrupt).await;
    }
    let points = args.tasks.len() * args.batch.len();
    eprintln!(
        "kvbench sweep: {points} points x ({:?} warm-up + {:?}), results in {}",
        args.bench.timing.warmup,
        args.bench.timing.duration,
        args.out.display()
    );
    let base = RunPlan::new(&args.bench, 1, 1, false);
    let mut results = Vec::new();
    'grid: for &tasks in &args.tasks {
        for &batch in &args.batch {
            if interrupt.is_set() {
                break 'grid;
            }
            let r = run_plan(cluster.clone(), &base.point(tasks, batch), &interrupt).await?;
            let lat = |k: &str| r.latency_us.get(k).map(|l| l.p99_us).unwrap_or(0.0);
            kvshared::outln!(
                "tasks {tasks:>5}  batch {batch:>6}  {:>12}   batch p50 {:>9.1} us  p99 {:>9.1} us   failed {}",
                format!("{} op/s", si(r.ops_per_sec)),
                r.latency_us.get("batch").map(|l| l.p50_us).unwrap_or(0.0),
                lat("batch"),
                r.failed_ops
            )?;
            append_csv(&csv, &CsvRow::of(&r))?;
            std::fs::write(
                args.out.join(format!("point-t{tasks}-b{batch}.json")),
                serde_json::to_vec_pretty(&r)?,
            )?;
            results.push(r);
        }
    }
    write_charts(&args.out, &args.tasks, &args.batch, &results)?;
    eprintln!(
        "kvbench sweep: wrote {} and throughput-vs-batch, throughput-vs-tasks, latency-vs-batch (.png, .svg)",
        csv.display()
    );
    if interrupt.is_set() {
        eprintln!("kvbench sweep: interrupted after {} of {points} points", results.len());
    }
    Ok(exit_status(&results, &interrupt, args.allow_failures))
}

/// A sweep's exit status: interrupted, some ops failed (unless allowed), or success.
fn exit_status(results: &[RunResult], interrupt: &Interrupt, allow_failures: bool) -> ExitCode {
    if interrupt.is_set() {
        return ExitCode::from(EXIT_INTERRUPTED);
    }
    let failed: u64 = results.iter().map(|r| r.failed_ops).sum();
    if failed > 0 && !allow_failures {
        eprintln!("kvbench sweep: {failed} ops failed; exit status {EXIT_FAILURES} (--allow-failures to accept)");
        return ExitCode::from(EXIT_FAILURES);
    }
    ExitCode::SUCCESS
}

/// The cache-size sweep (see `cache_sweep`).
async fn cache_command(
    args: &SweepArgs,
    cluster: std::sync::Arc<kvshared::client::Cluster>,
    interrupt: Interrupt,
) -> anyhow::Result<ExitCode> {
    let tasks = args.tasks.last().copied().unwrap_or(32);
    let batch = args.batch.last().copied().unwrap_or(64);
    eprintln!(
        "kvbench sweep: {} cache sizes x ({:?} warm-up + {:?}), {tasks} tasks, batch {batch}; \
         every node is flushed at each size; results in {}",
        args.cache_sizes.len(),
        args.bench.timing.warmup,
        args.bench.timing.duration,
        args.out.display()
    );
    let plan = RunPlan::new(&args.bench, tasks, batch, false);
    let (points, results) = crate::cache_sweep::run(cluster, &plan, &args.cache_sizes, &args.out, &interrupt).await?;
    std::fs::write(args.out.join("cache.json"), serde_json::to_vec_pretty(&points)?)?;
    eprintln!(
        "kvbench sweep: wrote {} and hit-ratio-vs-cache-size (.png, .svg)",
        args.out.join("cache.csv").display()
    );
    Ok(exit_status(&results, &interrupt, args.allow_failures))
}

/// Draws the three sweep charts from the results of a grid (in tasks-major order).
pub fn write_charts(dir: &Path, tasks: &[usize], batches: &[usize], results: &[RunResult]) -> anyhow::Result<()> {
    let at = |t: usize, b: usize| results.iter().find(|r| r.options.tasks == t && r.options.batch == b);
    let by_tasks = |f: &dyn Fn(&RunResult) -> f64| -> Vec<(String, Vec<(f64, f64)>)> {
        tasks
            .iter()
            .map(|&t| {
                let pts = batches
                    .iter()
                    .filter_map(|&b| at(t, b).map(|r| (b as f64, f(r))))
                    .collect();
                (format!("{t} tasks"), pts)
            })
            .collect()
    };
    LineChart {
        title: "Throughput vs batch size".into(),
        x_label: "ops per batch per node".into(),
        y_label: "op/s".into(),
        log_x: true,
        log_y: false,
        series: by_tasks(&|r| r.ops_per_sec),
    }
    .write(&dir.join("throughput-vs-batch"))?;
    LineChart {
        title: "Throughput vs client tasks".into(),
        x_label: "client tasks".into(),
        y_label: "op/s".into(),
        log_x: true,
        log_y: false,
        series: batches
            .iter()
            .map(|&b| {
                let pts = tasks
                    .iter()
                    .filter_map(|&t| at(t, b).map(|r| (t as f64, r.ops_per_sec)))
                    .collect();
                (format!("batch {b}"), pts)
            })
            .collect(),
    }
    .write(&dir.join("throughput-vs-tasks"))?;
    LineChart {
        title: "Batch round-trip p99 latency vs batch size".into(),
        x_label: "ops per batch per node".into(),
        y_label: "p99 latency (us)".into(),
        log_x: true,
        log_y: true,
        series: by_tasks(&|r| r.latency_us.get("batch").map(|l| l.p99_us).unwrap_or(0.0).max(0.1)),
    }
    .write(&dir.join("latency-vs-batch"))?;
    Ok(())
}
