//! `kvbench check`: record a concurrent history against a live cluster (or read a saved
//! one) and check it is linearizable.

use std::process::ExitCode;
use std::time::{SystemTime, UNIX_EPOCH};

use anyhow::Context;
use kvshared::client::{RecordConfig, record};
use kvshared::history::{CheckOptions, History, Verdict, check, render_timeline, staleness};
use kvshared::units::grouped;

use crate::cli::CheckArgs;
use crate::connect;

/// Exit codes: 0 linearizable, 1 not linearizable, 2 unknown; with `--reads stale`, 0 when
/// no get was staler than `--max-staleness` (plus a 100 ms slack), 1 otherwise.
pub async fn command(args: CheckArgs) -> anyhow::Result<ExitCode> {
    let mut faults = None;
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
        None => {
            let (history, started_unix_ms, shards) = record_history(&args).await?;
            if let Some(path) = &args.faults {
                let text = std::fs::read_to_string(path).with_context(|| format!("cannot read {}", path.display()))?;
                let list = crate::faults::parse(&text).map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?;
                let waits = crate::faults::unavailability(&history, &list, started_unix_ms, shards);
                faults = Some((list, waits));
            }
            history
        }
    };
    let options = CheckOptions {
        deadline: Some(args.deadline),
        ..CheckOptions::default()
    };
    let history_for_check = history.clone();
    let report = tokio::task::spawn_blocking(move || check(&history_for_check, &options)).await?;
    let mut code = match &report.verdict {
        Verdict::Linearizable => 0,
        Verdict::NotLinearizable(_) => 1,
        Verdict::Unknown { .. } => 2,
    };
    // With --reads stale the promise is the bound, not linearizability: it decides.
    let stale =
        stale_bound(&args).map(|bound| (bound, staleness(&history, (bound + STALENESS_SLACK).as_nanos() as u64)));
    if let Some((_, s)) = &stale {
        code = u8::from(s.over_bound > 0);
    }
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
        let acked = history
            .operations
            .iter()
            .filter(|o| o.ret != kvshared::history::Return::Unknown)
            .count();
        kvshared::outln!(
            "outcomes   {} acknowledged, {} unknown",
            grouped(acked as u64),
            grouped((history.operations.len() - acked) as u64)
        )?;
        if let Some((list, waits)) = &faults {
            kvshared::outln!(
                "faults     {} injected; each shard's wait for an acknowledged op begun after the fault:",
                list.len()
            )?;
            for (f, wait) in list.iter().zip(waits) {
                let wait = wait.map_or("none acknowledged before the recording ended".into(), |ms| {
                    format!("{ms:.0} ms")
                });
                kvshared::outln!("  {:<10} shard {:<3} {:>10}   {}", f.name, f.shard, wait, f.note)?;
            }
        }
        if let Some((bound, s)) = &stale {
            print_staleness(*bound, s)?;
        }
        if let (Verdict::NotLinearizable(f), None) = (&report.verdict, &stale) {
            kvshared::outln!()?;
            kvshared::out!("{}", render_timeline(f))?;
        }
    }
    Ok(ExitCode::from(code))
}

/// What a stale get may miss on top of `--max-staleness` before the check fails: the
/// measurement's own slack (each node's check and the client's clock).
const STALENESS_SLACK: std::time::Duration = std::time::Duration::from_millis(100);

/// `--max-staleness`, when the reads were recorded with `--reads stale`.
fn stale_bound(args: &CheckArgs) -> Option<std::time::Duration> {
    let nodes = &args.cluster.nodes;
    (nodes.reads == kvshared::cli::ReadsArg::Stale).then_some(nodes.max_staleness)
}

/// The staleness lines of the report.
fn print_staleness(bound: std::time::Duration, s: &kvshared::history::Staleness) -> anyhow::Result<()> {
    kvshared::outln!(
        "staleness  worst {:.0} ms over {} gets ({} stale at all); {} staler than the bound ({} ms + {} ms slack): {}",
        s.worst_ms,
        grouped(s.gets as u64),
        grouped(s.stale as u64),
        s.over_bound,
        bound.as_millis(),
        STALENESS_SLACK.as_millis(),
        if s.over_bound == 0 {
            "the bound HELD"
        } else {
            "the bound did NOT hold"
        }
    )?;
    if let Some((key, get, missed)) = &s.worst {
        kvshared::outln!("           the worst: key {key:?}, {get} missed {missed}")?;
    }
    kvshared::outln!("           (with --reads stale the exit status follows the bound, not linearizability)")?;
    Ok(())
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

/// Records a history; also returns the Unix time (ms) of its clock's zero and the shard count.
async fn record_history(args: &CheckArgs) -> anyhow::Result<(History, u64, u32)> {
    let cluster = connect::cluster(&args.cluster).await?;
    let shards = cluster.node_count() as u32;
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
        ttl_ms: args.ttl.map(|t| (t.min_ms, t.max_ms)),
        ..RecordConfig::default()
    };
    eprintln!(
        "kvbench check: recording {} clients on {} keys for {:?} ...",
        config.clients, config.keys, config.duration
    );
    let started_unix_ms = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0);
    let recording = record(cluster, &config).await;
    for line in explain(&recording) {
        eprintln!("kvbench check: {line}");
    }
    if let Some(path) = &args.history {
        std::fs::write(path, serde_json::to_vec(&recording.history)?)
            .with_context(|| format!("cannot write {}", path.display()))?;
        eprintln!("kvbench check: history saved to {}", path.display());
    }
    Ok((recording.history, started_unix_ms, shards))
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
