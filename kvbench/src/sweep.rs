//! `kvbench sweep`: every point of a tasks x batch grid, each with its own warm-up; a CSV
//! row and a terminal line per point, then charts.

use std::path::Path;

use anyhow::Context;
use kvshared::units::si;

use crate::chart::LineChart;
use crate::cli::{RunArgs, SweepArgs};
use crate::connect;
use crate::report::{CsvRow, append_csv};
use crate::result::RunResult;
use crate::run::run_with;

/// `kvbench sweep`.
pub async fn command(args: SweepArgs) -> anyhow::Result<()> {
    std::fs::create_dir_all(&args.out).with_context(|| format!("cannot create {}", args.out.display()))?;
    let csv = args.out.join("sweep.csv");
    if csv.exists() {
        std::fs::remove_file(&csv)?;
    }
    let cluster = connect::cluster(&args.cluster).await?;
    let points = args.tasks.len() * args.batch.len();
    eprintln!(
        "kvbench sweep: {points} points x ({:?} warm-up + {:?}), results in {}",
        args.timing.warmup,
        args.timing.duration,
        args.out.display()
    );
    let mut results = Vec::new();
    for &tasks in &args.tasks {
        for &batch in &args.batch {
            let run = RunArgs {
                cluster: args.cluster.clone(),
                workload: args.workload.clone(),
                timing: args.timing.clone(),
                tasks,
                batch,
                json: None,
                csv: None,
                dry_run: false,
                quiet: true,
                tui: false,
            };
            let r = run_with(cluster.clone(), &run, false).await?;
            let lat = |k: &str| r.latency_us.get(k).map(|l| l.p99_us).unwrap_or(0.0);
            kvshared::outln!(
                "tasks {tasks:>5}  batch {batch:>6}  {:>12}   batch p50 {:>9.1} us  p99 {:>9.1} us   failed {}",
                format!("{} op/s", si(r.ops_per_sec)),
                r.latency_us.get("batch").map(|l| l.p50_us).unwrap_or(0.0),
                lat("batch"),
                r.failed_ops
            );
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
    Ok(())
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
        log_y: false,
        series: by_tasks(&|r| r.ops_per_sec),
    }
    .write(&dir.join("throughput-vs-batch"))?;
    LineChart {
        title: "Throughput vs client tasks".into(),
        x_label: "client tasks".into(),
        y_label: "op/s".into(),
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
        log_y: true,
        series: by_tasks(&|r| r.latency_us.get("batch").map(|l| l.p99_us).unwrap_or(0.0).max(0.1)),
    }
    .write(&dir.join("latency-vs-batch"))?;
    Ok(())
}
