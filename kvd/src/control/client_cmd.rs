//! The client verbs of the `kvd` binary: get, put, del, stats, config (admin: `admin_cmd`).

use std::process::ExitCode;

use kvshared::cli::{NodesArgs, parse_size};
use kvshared::client::{ClientError, Cluster};
use kvshared::stats::NodeStats;
use kvshared::units::{bytes, grouped};
use kvshared::wire::ConfigRequest;

use crate::cli::Command;
use crate::control::error::{ControlError, refuse};

/// Exit code when `get` finds nothing, or `stats` could not reach every node.
const NOT_ALL: u8 = 1;

/// The membership changes `kvd stats` shows under a leader, newest first.
const SHOWN_CHANGES: usize = 5;

/// Runs one client verb and returns the process exit code.
pub async fn run(command: Command) -> crate::control::error::Result<ExitCode> {
    let code = match command {
        Command::Get { nodes, raw, text, key } => {
            match explained(&cluster(&nodes)?, |c| c.get(key.as_bytes())).await? {
                Some(v) => {
                    print_value(&v, raw, text)?;
                    0
                }
                None => {
                    eprintln!("kvd: {key:?} not found");
                    NOT_ALL
                }
            }
        }
        Command::Put {
            nodes,
            file,
            ttl,
            key,
            value,
        } => {
            let cluster = cluster(&nodes)?;
            let value = put_value(file.as_deref(), value.as_deref(), cluster.config().max_frame)?;
            match ttl {
                None => explained(&cluster, |c| c.put(key.as_bytes(), &value)).await?,
                Some(ttl) => explained(&cluster, |c| c.put_for(key.as_bytes(), &value, ttl)).await?,
            }
            kvshared::outln!("OK")?;
            0
        }
        Command::Del { nodes, key } => {
            let existed = explained(&cluster(&nodes)?, |c| c.delete(key.as_bytes())).await?;
            kvshared::outln!("{}", if existed { "deleted" } else { "absent" })?;
            0
        }
        Command::Stats { nodes, json } => stats(&nodes, json).await?,
        Command::Admin(admin) => crate::control::admin_cmd::run(admin).await?,
        Command::Manager(args) => crate::control::manager::run(args).await?,
        Command::Config {
            nodes,
            max_memory,
            flush,
        } => {
            let per_node = match max_memory.as_deref() {
                None => None,
                Some("none") => Some(0),
                Some(size) => {
                    let total = parse_size(size)?;
                    Some((total / nodes.node_list()?.len() as u64).max(1))
                }
            };
            let cluster = cluster(&nodes)?;
            let change = ConfigRequest {
                max_memory_bytes: per_node,
                flush,
            };
            for node in 0..cluster.node_count() {
                cluster.configure(node, &change).await?;
            }
            kvshared::outln!("OK")?;
            0
        }
    };
    Ok(ExitCode::from(code))
}

/// Writes a value as `kvd get` does: its bytes, then a newline on a terminal (never with
/// `raw`); with `text`, as lossy UTF-8 and a newline.
fn print_value(v: &[u8], raw: bool, text: bool) -> crate::control::error::Result<()> {
    use std::io::{IsTerminal, Write};
    if text {
        kvshared::outln!("{}", String::from_utf8_lossy(v))?;
        return Ok(());
    }
    let mut out = std::io::stdout().lock();
    let newline = !raw && out.is_terminal();
    let written = out
        .write_all(v)
        .and_then(|()| if newline { out.write_all(b"\n") } else { Ok(()) })
        .and_then(|()| out.flush());
    match written {
        // A closed pipe (`kvd get k | head -c 10`) is not an error.
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(()),
        other => Ok(other?),
    }
}

/// The value `kvd put` stores: the argument's bytes, stdin's for `-`, or `file`'s; read
/// bounded by the frame limit (a value must fit in one frame).
fn put_value(
    file: Option<&std::path::Path>,
    value: Option<&str>,
    max_frame: u32,
) -> crate::control::error::Result<Vec<u8>> {
    let max = u64::from(max_frame);
    match (file, value) {
        (Some(path), _) => kvshared::files::read_bounded(path, max)
            .map_err(|e| ControlError::Refused(format!("--file {}: {e}", path.display()))),
        (None, Some("-")) => kvshared::files::read_all_bounded(std::io::stdin().lock(), max)
            .map_err(|e| ControlError::Refused(format!("the value on stdin: {e} (--max-frame)"))),
        (None, Some(v)) => Ok(v.as_bytes().to_vec()),
        (None, None) => refuse!("give a VALUE, - for stdin, or --file FILE"),
    }
}

/// Runs `op`; when a node refuses it as not its shard, asks every node which shard it
/// serves and says what is wrong with `--nodes`.
async fn explained<'c, T, F>(
    cluster: &'c Cluster,
    op: impl FnOnce(&'c Cluster) -> F,
) -> crate::control::error::Result<T>
where
    F: std::future::Future<Output = Result<T, ClientError>>,
{
    match op(cluster).await {
        Err(e @ ClientError::Moved { .. }) => {
            let problems = cluster.check_layout().await;
            let lines: Vec<String> = problems.iter().map(|p| format!("  {p}")).collect();
            match lines.is_empty() {
                true => Err(e.into()),
                false => Err(ControlError::Refused(format!(
                    "{e}\n--nodes does not match the cluster:\n{}",
                    lines.join("\n")
                ))),
            }
        }
        other => Ok(other?),
    }
}

fn cluster(args: &NodesArgs) -> crate::control::error::Result<Cluster> {
    Ok(Cluster::new(&args.node_list()?, args.client_config()?)?)
}

async fn stats(args: &NodesArgs, json: bool) -> crate::control::error::Result<u8> {
    // Every member of every replica group is its own row.
    let entries = args.node_list()?;
    let members = kvshared::client::expand_members(&entries);
    let config = args.client_config()?;
    let mut rows = Vec::new();
    for (_, addr) in &members {
        let one = Cluster::new(std::slice::from_ref(addr), config.clone())?;
        rows.push((addr.clone(), one.stats(0).await));
    }
    // Members a group has gained since --nodes was written (kvd admin add-replica) get
    // rows too, after the others. (Not when each entry names one node: then the rows are
    // the nodes asked about.)
    let mut i = match entries.iter().any(|e| kvshared::client::members(e).nth(1).is_some()) {
        true => 0,
        false => rows.len(),
    };
    while i < rows.len() {
        let gained: Vec<String> = match &rows[i].1 {
            Ok(s) => s.group.members.iter().chain(&s.group.learners).cloned().collect(),
            Err(_) => Vec::new(),
        };
        for addr in gained {
            if !rows.iter().any(|(a, _)| *a == addr) {
                let one = Cluster::new(std::slice::from_ref(&addr), config.clone())?;
                rows.push((addr.clone(), one.stats(0).await));
            }
        }
        i += 1;
    }
    let member_shards: Vec<_> = rows[..members.len()]
        .iter()
        .map(|(_, r)| r.as_ref().ok().map(|s| s.shard))
        .collect();
    let (shards, mut problems) = kvshared::client::entry_shards(&entries, &member_shards);
    problems.extend(kvshared::client::check_layout(&entries, &shards));
    if json {
        let out: Vec<_> = rows
            .iter()
            .map(|(addr, r)| match r {
                Ok(s) => serde_json::json!({
                    "addr": addr,
                    "up": true,
                    "role": s.group.role.in_group().then_some(s.group.role.as_str()),
                    "stats": s
                }),
                Err(e) => serde_json::json!({ "addr": addr, "up": false, "error": e.to_string() }),
            })
            .collect();
        kvshared::outln!("{}", serde_json::to_string_pretty(&out)?)?;
    } else {
        kvshared::out!("{}", table(&rows))?;
    }
    for p in &problems {
        eprintln!("kvd: warning: {p}");
    }
    Ok(if rows.iter().any(|(_, r)| r.is_err()) {
        NOT_ALL
    } else {
        0
    })
}

fn table(rows: &[(String, Result<NodeStats, ClientError>)]) -> String {
    let in_groups = rows
        .iter()
        .any(|(_, r)| r.as_ref().is_ok_and(|s| s.group.role.in_group()));
    let mut out = format!(
        "{:<22} {:>5} {:>9} {:>12} {:>12} {:>12} {:>6} {:>6} {:>19} {:>9} {:>8}{}\n",
        "NODE",
        "SHARD",
        "UPTIME",
        "KEYS",
        "GETS",
        "PUTS",
        "HIT%",
        "CONNS",
        "DATA",
        "RSS",
        "ERRORS",
        if in_groups {
            "  ROLE      TERM   COMMIT  APPLIED"
        } else {
            ""
        }
    );
    for (addr, r) in rows {
        match r {
            Ok(s) => {
                let c = &s.counts;
                let hit = c
                    .hit_ratio()
                    .map_or_else(|| "-".to_string(), |h| format!("{:.1}", 100.0 * h));
                let role = match in_groups {
                    true => format!(
                        "  {:<9} {:>4} {:>8} {:>8}",
                        s.group.role, s.group.term, s.group.commit_index, s.group.applied_index
                    ),
                    false => String::new(),
                };
                out.push_str(&format!(
                    "{:<22} {:>5} {:>8}s {:>12} {:>12} {:>12} {:>6} {:>6} {:>19} {:>9} {:>8}{role}\n",
                    addr,
                    s.shard.to_string(),
                    s.uptime_ms / 1000,
                    grouped(s.keys),
                    grouped(c.gets),
                    grouped(c.puts),
                    hit,
                    c.connections_open(),
                    s.memory_summary(),
                    bytes(s.system.process_rss_bytes as f64),
                    grouped(c.errors())
                ));
                out.push_str(&format!(
                    "{:<22} service time since start: {}\n",
                    "",
                    s.latency.summary()
                ));
                out.push_str(&format!("{:<22} load: {}\n", "", s.recent.summary()));
                out.push_str(&format!("{:<22} slots: {}\n", "", s.slots_summary()));
                if let Some(moves) = s.moves_summary(None) {
                    out.push_str(&format!("{:<22} slot moves: {moves}\n", ""));
                }
                if !s.group.lag.is_empty() {
                    let lag: Vec<String> = s
                        .group
                        .lag
                        .iter()
                        .map(|l| format!("{} {} behind", l.addr, l.behind))
                        .collect();
                    out.push_str(&format!(
                        "{:<22} leads: followers {}; {} elections seen\n",
                        "",
                        lag.join(", "),
                        s.group.elections
                    ));
                }
                for change in s.group.changes.iter().rev().take(SHOWN_CHANGES) {
                    out.push_str(&format!("{:<22} {}\n", "", change.summary()));
                }
                if s.durability.is_durable() {
                    for line in s.durability.summary_lines() {
                        out.push_str(&format!("{:<22} {line}\n", ""));
                    }
                }
            }
            Err(e) => out.push_str(&format!("{addr:<22} DOWN: {e}\n")),
        }
    }
    out
}
