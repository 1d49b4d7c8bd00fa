//! The client verbs of the `kvd` binary: get, put, del, stats.

use std::process::ExitCode;
use std::time::Duration;

use kvshared::client::{ClientConfig, Cluster, parse_nodes};
use kvshared::stats::NodeStats;

use crate::cli::{Command, NodesArg};

/// Exit code when `get` finds nothing.
const NOT_FOUND: u8 = 1;
/// Exit code on any error.
const FAILED: u8 = 2;

/// Runs one client verb and returns the process exit code.
pub async fn run(command: Command) -> ExitCode {
    match run_inner(command).await {
        Ok(code) => ExitCode::from(code),
        Err(e) => {
            eprintln!("kvd: {e:#}");
            ExitCode::from(FAILED)
        }
    }
}

fn cluster(arg: &NodesArg) -> anyhow::Result<Cluster> {
    let nodes = parse_nodes(&arg.nodes)?;
    let timeout = Duration::from_millis(arg.timeout_ms);
    let config = ClientConfig {
        request_timeout: timeout,
        connect_timeout: timeout,
        ..ClientConfig::default()
    };
    Ok(Cluster::new(&nodes, config)?)
}

async fn run_inner(command: Command) -> anyhow::Result<u8> {
    match command {
        Command::Get { nodes, key } => match cluster(&nodes)?.get(key.as_bytes()).await? {
            Some(v) => {
                kvshared::outln!("{}", String::from_utf8_lossy(&v));
                Ok(0)
            }
            None => {
                eprintln!("kvd: {key:?} not found");
                Ok(NOT_FOUND)
            }
        },
        Command::Put { nodes, key, value } => {
            cluster(&nodes)?.put(key.as_bytes(), value.as_bytes()).await?;
            kvshared::outln!("OK");
            Ok(0)
        }
        Command::Del { nodes, key } => {
            let existed = cluster(&nodes)?.delete(key.as_bytes()).await?;
            kvshared::outln!("{}", if existed { "deleted" } else { "absent" });
            Ok(0)
        }
        Command::Stats { nodes, json } => stats(&nodes, json).await,
    }
}

async fn stats(arg: &NodesArg, json: bool) -> anyhow::Result<u8> {
    let cluster = cluster(arg)?;
    let mut rows = Vec::new();
    for node in 0..cluster.node_count() {
        rows.push((cluster.addr(node).to_string(), cluster.stats(node).await));
    }
    let failed = rows.iter().any(|(_, r)| r.is_err());
    if json {
        let out: Vec<_> = rows
            .iter()
            .map(|(addr, r)| match r {
                Ok(s) => serde_json::json!({ "addr": addr, "up": true, "stats": s }),
                Err(e) => serde_json::json!({ "addr": addr, "up": false, "error": e.to_string() }),
            })
            .collect();
        kvshared::outln!("{}", serde_json::to_string_pretty(&out)?);
    } else {
        print_table(&rows);
    }
    Ok(if failed { FAILED } else { 0 })
}

fn print_table(rows: &[(String, Result<NodeStats, kvshared::client::ClientError>)]) {
    kvshared::outln!(
        "{:<22} {:>5} {:>9} {:>12} {:>10} {:>10} {:>7} {:>6} {:>9} {:>7}",
        "NODE",
        "SHARD",
        "UPTIME",
        "KEYS",
        "GETS",
        "PUTS",
        "HIT%",
        "CONNS",
        "RSS",
        "ERRORS"
    );
    for (addr, r) in rows {
        match r {
            Ok(s) => {
                let lookups = s.hits + s.misses;
                let hit = if lookups == 0 {
                    "-".to_string()
                } else {
                    format!("{:.1}", 100.0 * s.hits as f64 / lookups as f64)
                };
                kvshared::outln!(
                    "{:<22} {:>5} {:>8}s {:>12} {:>10} {:>10} {:>7} {:>6} {:>7}MB {:>7}",
                    addr,
                    format!("{}/{}", s.shard_index, s.shard_count),
                    s.uptime_ms / 1000,
                    s.keys,
                    s.gets,
                    s.puts,
                    hit,
                    s.connections_open,
                    s.process_rss_bytes / (1024 * 1024),
                    s.errors.total()
                );
            }
            Err(e) => kvshared::outln!("{addr:<22} DOWN: {e}"),
        }
    }
}
