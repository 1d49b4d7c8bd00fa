//! `kvbench merge`: one result from the result files of several client machines.

use std::io::Write as _;

use anyhow::Context;

use std::process::ExitCode;

use crate::cli::MergeArgs;
use crate::report;
use crate::result::RunResult;
use crate::run::{EXIT_FAILURES, exit_status};

/// Runs whose measured windows share less than this share of the shortest one are said
/// not to overlap: their op/s were not reached together, so their sum is no throughput.
const MIN_OVERLAP: f64 = 0.8;

pub fn command(args: MergeArgs) -> anyhow::Result<ExitCode> {
    let mut results = Vec::new();
    for path in &args.files {
        let text = std::fs::read(path).with_context(|| format!("cannot read {}", path.display()))?;
        let r: RunResult = serde_json::from_slice(&text)
            .with_context(|| format!("{} is not a kvbench result file", path.display()))?;
        results.push(r);
    }
    if let Some(warning) = overlap_warning(&args.files, &results) {
        eprintln!("kvbench merge: {warning}");
    }
    let merged = RunResult::merge(&results)?;
    let text = report::summary(&merged);
    match args.json.as_deref() {
        Some(p) if p == std::path::Path::new("-") => {
            eprint!("{text}");
            let mut out = std::io::stdout().lock();
            serde_json::to_writer_pretty(&mut out, &merged)?;
            writeln!(out)?;
        }
        Some(p) => {
            kvshared::out!("{text}")?;
            std::fs::write(p, serde_json::to_vec_pretty(&merged)?)?;
        }
        None => kvshared::out!("{text}")?,
    }
    if let Some(stem) = &args.timeline {
        let title = "Each shard's p99 batch round trip, second by second";
        crate::timeline::chart(&merged.node_timeline, &merged.options.nodes, title, stem)?;
        eprintln!("kvbench: timeline chart written to {}.png and .svg", stem.display());
    }
    if merged.failed_ops > 0 && !args.allow_failures && !merged.interrupted {
        eprintln!(
            "kvbench merge: {} ops failed in the merged runs; exit status {EXIT_FAILURES} (--allow-failures to accept failures)",
            merged.failed_ops
        );
    }
    Ok(exit_status(&merged, args.allow_failures))
}

/// A run's measured window, Unix milliseconds: after its warm-up, for its elapsed time.
fn window_ms(r: &RunResult) -> (f64, f64) {
    let start = r.started_unix_ms as f64 + r.options.warmup_s * 1000.0;
    (start, start + r.elapsed_s * 1000.0)
}

/// Why the runs' op/s should not be added, when their measured windows did not overlap
/// (most of the shortest window shared by all), naming each file's window.
pub fn overlap_warning(files: &[std::path::PathBuf], results: &[RunResult]) -> Option<String> {
    let windows: Vec<(f64, f64)> = results.iter().map(window_ms).collect();
    let shared_start = windows.iter().map(|w| w.0).fold(f64::MIN, f64::max);
    let shared_end = windows.iter().map(|w| w.1).fold(f64::MAX, f64::min);
    let shortest = windows.iter().map(|w| w.1 - w.0).fold(f64::MAX, f64::min);
    let shared = (shared_end - shared_start).max(0.0);
    if results.len() < 2 || shared >= MIN_OVERLAP * shortest {
        return None;
    }
    let first = windows.iter().map(|w| w.0).fold(f64::MAX, f64::min);
    let each: Vec<String> = files
        .iter()
        .zip(&windows)
        .map(|(f, w)| {
            format!(
                "{} ran {:.1}-{:.1} s",
                f.display(),
                (w.0 - first) / 1e3,
                (w.1 - first) / 1e3
            )
        })
        .collect();
    Some(format!(
        "warning: the runs did not run together ({}; {:.0}% of the shortest window shared), so the summed op/s is \
         not a throughput the cluster reached; start the clients together",
        each.join(", "),
        100.0 * shared / shortest.max(1e-9)
    ))
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    use super::*;

    fn run(started_unix_ms: u64, warmup_s: f64, elapsed_s: f64) -> RunResult {
        let mut r = RunResult {
            started_unix_ms,
            elapsed_s,
            ..RunResult::default()
        };
        r.options.warmup_s = warmup_s;
        r
    }

    fn files(n: usize) -> Vec<PathBuf> {
        (0..n).map(|i| PathBuf::from(format!("r{i}.json"))).collect()
    }

    #[test]
    fn runs_started_together_merge_without_a_warning() {
        let rs = [run(1_000_000, 2.0, 10.0), run(1_000_300, 2.0, 10.0)];
        assert_eq!(overlap_warning(&files(2), &rs), None);
    }

    #[test]
    fn runs_one_after_the_other_are_named_with_their_windows() {
        let rs = [run(1_000_000, 2.0, 10.0), run(1_013_000, 2.0, 10.0)];
        let w = overlap_warning(&files(2), &rs).expect("a warning");
        assert!(w.contains("r0.json ran 0.0-10.0 s"), "{w}");
        assert!(w.contains("r1.json ran 13.0-23.0 s"), "{w}");
        assert!(w.contains("0% of the shortest window shared"), "{w}");
    }

    #[test]
    fn a_half_overlap_is_not_enough() {
        let rs = [run(1_000_000, 0.0, 10.0), run(1_005_000, 0.0, 10.0)];
        assert!(overlap_warning(&files(2), &rs).is_some());
    }

    #[test]
    fn failed_ops_in_any_run_fail_the_merge() {
        let mut bad = run(1_000_000, 0.0, 10.0);
        bad.failed_ops = 3;
        let merged = RunResult::merge(&[run(1_000_000, 0.0, 10.0), bad]).unwrap();
        assert_eq!(merged.failed_ops, 3);
        assert_eq!(exit_status(&merged, false), ExitCode::from(EXIT_FAILURES));
        assert_eq!(exit_status(&merged, true), ExitCode::SUCCESS);
    }
}
