//! `kvbench merge`: one result from the result files of several client machines.

use std::io::Write as _;

use anyhow::Context;

use crate::cli::MergeArgs;
use crate::report;
use crate::result::RunResult;

pub fn command(args: MergeArgs) -> anyhow::Result<()> {
    let mut results = Vec::new();
    for path in &args.files {
        let text = std::fs::read(path).with_context(|| format!("cannot read {}", path.display()))?;
        let r: RunResult = serde_json::from_slice(&text)
            .with_context(|| format!("{} is not a kvbench result file", path.display()))?;
        results.push(r);
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
    Ok(())
}
