//! `kvbench check`: record a concurrent history against a live cluster (or read a saved
//! one) and check it is linearizable.

use std::process::ExitCode;
use std::time::{SystemTime, UNIX_EPOCH};

use anyhow::Context;
use kvshared::client::{RecordConfig, record};
use kvshared::history::{CheckOptions, History, Verdict, check, render_timeline};
use kvshared::units::grouped;

use crate::cli::CheckArgs;
use crate::connect;

/// Exit codes: 0 linearizable, 1 not linearizable, 2 unknown.
pub async fn command(args: CheckArgs) -> anyhow::Result<ExitCode> {
    let history = match &args.from {
        Some(path) => {
            let text = std::fs::read(path).with_context(|| format!("cannot read {}", path.display()))?;
            let history = serde_json::from_slice::<History>(&text)
                .with_context(|| format!("{} is not a saved history", path.display()))?;
            history
                .validate()
                .with_context(|| format!("{} cannot be checked", path.display()))?;
            history
        }
        None => record_history(&args).await?,
    };
    let options = CheckOptions {
        deadline: Some(args.deadline),
        ..CheckOptions::default()
    };
    let history_for_check = history.clone();
    let report = tokio::task::spawn_blocking(move || check(&history_for_check, &options)).await?;
    let code = match &report.verdict {
        Verdict::Linearizable => 0,
        Verdict::NotLinearizable(_) => 1,
        Verdict::Unknown { .. } => 2,
    };
    if args.json {
        kvshared::outln!("{}", serde_json::to_string_pretty(&report)?)?;
    } else {
        let clients = {
            let mut c: Vec<u32> = history.operations.iter().map(|o| o.client).collect();
            c.sort_unstable();
            c.dedup();
            c.len()
        };
        let verdict = match &report.verdict {
            Verdict::Linearizable => "LINEARIZABLE".to_string(),
            Verdict::NotLinearizable(f) => format!("NOT LINEARIZABLE (key {:?})", f.key),
            Verdict::Unknown { reason, .. } => format!("UNKNOWN: {reason}"),
        };
        kvshared::outln!("verdict    {verdict}")?;
        kvshared::outln!(
            "history    {} ops from {} clients on {} keys",
            grouped(report.operations as u64),
            clients,
            report.keys
        )?;
        kvshared::outln!("checked in {:.1} ms", report.elapsed_ms)?;
        if let Verdict::NotLinearizable(f) = &report.verdict {
            kvshared::outln!()?;
            kvshared::out!("{}", render_timeline(f))?;
        }
    }
    Ok(ExitCode::from(code))
}

/// What happened to the ops that are not plain successes, with the real cause: refused
/// ops by kind (a node down is not a wrong --nodes order), and ops of unknown outcome.
fn explain(recording: &kvshared::client::Recording) -> Vec<String> {
    let mut lines = Vec::new();
    for (kind, (n, first)) in &recording.refused {
        let why = match *kind {
            "node_down" | "connect" | "shutting_down" | "stalled" => {
                "a node was down or not answering; they never ran, so the check leaves them out"
            }
            "wrong_shard" => "refused as another shard's: is --nodes in shard order?",
            _ => "they failed before running, so the check leaves them out",
        };
        lines.push(format!("{n} ops not run ({why}); first: {first}"));
    }
    if recording.unknown > 0 {
        lines.push(format!(
            "{} ops have an unknown outcome (sent, no answer: a timeout or a node lost mid-request); the checker lets each have taken effect or not",
            recording.unknown
        ));
    }
    lines
}

async fn record_history(args: &CheckArgs) -> anyhow::Result<History> {
    let cluster = connect::cluster(&args.cluster).await?;
    let stamp = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis())
        .unwrap_or(0);
    let config = RecordConfig {
        clients: args.clients.max(1),
        keys: args.keys.max(1),
        // A fresh key space per check, so other data (or a concurrent benchmark) does not
        // interfere with the model's starting state.
        key_prefix: format!("lin-{stamp}-"),
        duration: args.duration,
        seed: args.seed,
        get_percent: args.get_percent.min(100),
        put_percent: 40.min(100 - args.get_percent.min(100)),
        ..RecordConfig::default()
    };
    eprintln!(
        "kvbench check: recording {} clients on {} keys for {:?} ...",
        config.clients, config.keys, config.duration
    );
    let recording = record(cluster, &config).await;
    for line in explain(&recording) {
        eprintln!("kvbench check: {line}");
    }
    if let Some(path) = &args.history {
        std::fs::write(path, serde_json::to_vec(&recording.history)?)
            .with_context(|| format!("cannot write {}", path.display()))?;
        eprintln!("kvbench check: history saved to {}", path.display());
    }
    Ok(recording.history)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_dead_node_is_named_as_such_not_as_a_wrong_order() {
        let mut recording = kvshared::client::Recording::default();
        recording
            .refused
            .insert("node_down", (183_709, "node 127.0.0.1:7071 is down".into()));
        recording.unknown = 3;
        let lines = explain(&recording);
        assert!(lines[0].starts_with("183709 ops not run (a node was down"), "{lines:?}");
        assert!(!lines[0].contains("shard order"));
        assert!(lines[1].starts_with("3 ops have an unknown outcome"), "{lines:?}");
    }
}
