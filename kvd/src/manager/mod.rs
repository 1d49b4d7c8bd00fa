//! `kvd manager`: watches every shard's load and gives a hot shard read replicas on spare
//! members, then takes them back when it cools.
//!
//! A spare is a kvd started with `--join` for one shard (`--shard I/N --join --data-dir D`):
//! it holds nothing and serves nothing until a group adds it. Each interval the manager
//! reads every member's stats (`recent`: reads/s, writes/s and server-side read p99 over
//! the member's last window), sums a shard's reads over the members that serve them, and
//! asks [`policy::Policy`] what to do. An added replica is a learner: it catches up from the
//! leader (log or snapshot), then serves reads (follower reads with the leader's read index,
//! so they stay linearizable) but never votes, so writes cost no more than before. Clients
//! learn it from the group within a few seconds and spread their reads over it.
//!
//! The manager holds no state that matters: a restarted manager finds the learners it added
//! (the learners that are spares) and goes on. Every decision is printed with the figures
//! that caused it, and kept with them in the leader's list of changes (`kvd stats`, kvtui).

pub mod policy;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{Context, bail};
use kvshared::client::{ClientConfig, Cluster, members};
use kvshared::stats::{GroupRole, NodeStats};
use serde::Serialize;

use crate::admin_cmd::Group;
use crate::cli::ManagerArgs;
use crate::durable::network::AdminRequest;
use policy::{Decision, Policy, ShardLoad, ShardState};

/// One shard as the manager follows it.
struct Shard {
    index: usize,
    /// The group's members (voters and learners) as last reported by its leader, or as
    /// `--nodes` lists them until one answers.
    members: Vec<String>,
    /// Learners this manager added, oldest first (removed newest first).
    added: Vec<String>,
    state: ShardState,
    /// A change under way.
    change: Option<tokio::task::JoinHandle<ChangeOutcome>>,
}

struct ChangeOutcome {
    line: DecisionLine,
}

/// A decision as printed (one line, or one JSON object with `--json`).
#[derive(Serialize, Clone, Debug)]
struct DecisionLine {
    unix_ms: u64,
    shard: usize,
    /// `add`, `remove`, `added`, `removed` or `failed`.
    action: String,
    member: String,
    why: String,
}

/// Runs the manager until `--duration` ends or Ctrl-C; returns the exit code.
pub async fn run(args: ManagerArgs) -> anyhow::Result<u8> {
    let entries = args.nodes.node_list()?;
    let config = ClientConfig {
        request_timeout: args.interval.max(Duration::from_millis(500)),
        connect_timeout: args.interval.max(Duration::from_millis(500)),
        ..args.nodes.client_config()?
    };
    if args.spare.is_empty() {
        bail!(
            "give the manager spare members with --spare ADDR,... (each a kvd started with --shard I/N --join --data-dir DIR)"
        );
    }
    if args.max_replicas < 2 {
        bail!(
            "--max-replicas {}: a shard needs room for at least 2 members to gain one",
            args.max_replicas
        );
    }
    let policy = Policy {
        hot_reads_per_member: args.hot_reads,
        hot_read_p99: args.hot_p99,
        cold_reads_per_member: args.cold_reads.unwrap_or(args.hot_reads / 4.0),
        up_after: args.up_after.max(1),
        down_after: args.down_after.max(1),
        max_replicas: args.max_replicas,
        settle: args.settle,
    };
    let mut shards: Vec<Shard> = entries
        .iter()
        .enumerate()
        .map(|(index, e)| Shard {
            index,
            members: members(e).map(str::to_string).collect(),
            added: Vec::new(),
            state: ShardState::default(),
            change: None,
        })
        .collect();
    let mut clients = Clients {
        config: config.clone(),
        by_addr: HashMap::new(),
    };
    eprintln!(
        "kvd manager: {} shard(s), {} spare(s), every {:?}: a replica is added after {} hot intervals (>= {:.0} reads/s per member or read p99 >= {:?}), removed after {} cold ones; at most {} members per shard",
        shards.len(),
        args.spare.len(),
        args.interval,
        policy.up_after,
        policy.hot_reads_per_member,
        policy.hot_read_p99,
        policy.down_after,
        policy.max_replicas
    );
    let began = Instant::now();
    let mut tick = tokio::time::interval(args.interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let ctrl_c = tokio::signal::ctrl_c();
    tokio::pin!(ctrl_c);
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = &mut ctrl_c => break,
        }
        if args.duration.is_some_and(|d| began.elapsed() >= d) {
            break;
        }
        let spares = clients.stats_of(&args.spare).await;
        // Spares serving some shard now, by the leaders' last word: a new replica goes to
        // the spare machine that serves the fewest.
        let in_use: Vec<String> = shards.iter().flat_map(|s| s.added.iter().cloned()).collect();
        for shard in shards.iter_mut() {
            if shard.change.as_ref().is_some_and(|c| c.is_finished())
                && let Some(handle) = shard.change.take()
                && let Ok(outcome) = handle.await
            {
                print(&outcome.line, args.json)?;
            }
            let stats = clients.stats_of(&shard.members).await;
            let Some(leader) = stats
                .iter()
                .find_map(|(_, s)| s.as_ref().filter(|s| s.group.role == GroupRole::Leader))
            else {
                tracing::debug!(shard = shard.index, "no leader answered");
                continue;
            };
            let group = &leader.group;
            let mut now: Vec<String> = group.members.iter().chain(&group.learners).cloned().collect();
            if group.members.is_empty() {
                // A node outside any replica group: nothing to manage.
                continue;
            }
            now.sort();
            shard.members = now;
            // Learners that are spares are this manager's (also those of an earlier run).
            shard.added.retain(|a| group.learners.contains(a));
            for l in &group.learners {
                if args.spare.contains(l) && !shard.added.contains(l) {
                    shard.added.push(l.clone());
                }
            }
            let load = shard_load(&stats, leader, shard.added.len());
            tracing::debug!(shard = shard.index, ?load, "shard load");
            if shard.change.is_some() {
                continue;
            }
            let spare = free_spare(&spares, shard.index, &shard.members, &in_use);
            let by_manager = |why: &str| format!("shard manager: {why}");
            let (line, done, request) = match policy.decide(&mut shard.state, &load, spare.is_some()) {
                Decision::Hold => continue,
                Decision::Add(why) => match spare {
                    Some(addr) => (
                        decision(shard.index, "add", &addr, &why),
                        "added",
                        AdminRequest::AddLearner {
                            why: by_manager(&why),
                            addr,
                        },
                    ),
                    None => continue,
                },
                Decision::Remove(why) => match shard.added.last() {
                    Some(addr) => (
                        decision(shard.index, "remove", addr, &why),
                        "removed",
                        AdminRequest::Remove {
                            addr: addr.clone(),
                            why: by_manager(&why),
                        },
                    ),
                    None => continue,
                },
            };
            print(&line, args.json)?;
            let mut g = Group::of(shard.index, shard.members.clone(), config.clone());
            shard.change = Some(tokio::spawn(async move {
                let outcome = g.send(request).await;
                ChangeOutcome {
                    line: finished(line, done, outcome),
                }
            }));
        }
    }
    // Changes under way are let finish: a half-made change is the leader's to finish, but
    // the operator should read how it ended.
    for shard in shards.iter_mut() {
        if let Some(handle) = shard.change.take()
            && let Ok(outcome) = handle.await
        {
            print(&outcome.line, args.json)?;
        }
    }
    Ok(0)
}

/// A shard's figures: reads summed over its members, writes and members from the leader.
fn shard_load(stats: &[(String, Option<NodeStats>)], leader: &NodeStats, added: usize) -> ShardLoad {
    let serving: Vec<&NodeStats> = stats
        .iter()
        .filter_map(|(_, s)| s.as_ref())
        .filter(|s| s.group.role.is_member())
        .collect();
    ShardLoad {
        reads_per_sec: serving.iter().map(|s| s.recent.reads_per_sec).sum(),
        writes_per_sec: leader.recent.writes_per_sec,
        read_p99_us: serving
            .iter()
            .filter(|s| s.recent.reads_per_sec > 0.0)
            .map(|s| s.recent.read_p99_us)
            .fold(0.0, f64::max),
        members: leader.group.members.len() + leader.group.learners.len(),
        added,
    }
}

/// A spare of shard `shard` that is not in its group now, as the leader says (`members`):
/// one started with `--join`, or removed earlier (which may not know it was, and is added
/// back from where its log stands). Of those, the one on the machine (address without its
/// port) with the fewest spares `in_use`: replicas of different shards spread over the
/// spare machines.
fn free_spare(
    spares: &[(String, Option<NodeStats>)],
    shard: usize,
    members: &[String],
    in_use: &[String],
) -> Option<String> {
    let machine = |addr: &str| addr.rsplit_once(':').map_or(addr, |(host, _)| host).to_string();
    spares
        .iter()
        .filter(|(addr, s)| {
            s.as_ref()
                .is_some_and(|s| s.shard.index as usize == shard && s.group.role.in_group())
                && !members.contains(addr)
        })
        .min_by_key(|(addr, _)| in_use.iter().filter(|u| machine(u) == machine(addr)).count())
        .map(|(addr, _)| addr.clone())
}

fn unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

fn decision(shard: usize, action: &str, member: &str, why: &str) -> DecisionLine {
    DecisionLine {
        unix_ms: unix_ms(),
        shard,
        action: action.into(),
        member: member.into(),
        why: why.into(),
    }
}

fn finished(asked: DecisionLine, done: &str, outcome: anyhow::Result<String>) -> DecisionLine {
    let (action, why) = match outcome {
        Ok(what) => (done.to_string(), what),
        Err(e) => (
            "failed".to_string(),
            format!("{} {}: {e:#}", asked.action, asked.member),
        ),
    };
    DecisionLine {
        unix_ms: unix_ms(),
        action,
        why,
        ..asked
    }
}

fn print(line: &DecisionLine, json: bool) -> anyhow::Result<()> {
    tracing::debug!(shard = line.shard, action = %line.action, member = %line.member, why = %line.why, "shard manager");
    if json {
        kvshared::outln!("{}", serde_json::to_string(line).context("cannot encode a decision")?)?;
    } else {
        kvshared::outln!(
            "{} shard {} {} {}: {}",
            humantime::format_rfc3339_seconds(UNIX_EPOCH + Duration::from_millis(line.unix_ms)),
            line.shard,
            line.action,
            line.member,
            line.why
        )?;
    }
    Ok(())
}

/// One client per member, kept between intervals.
struct Clients {
    config: ClientConfig,
    by_addr: HashMap<String, Arc<Cluster>>,
}

impl Clients {
    /// Every address's stats, asked at once (`None` for one that did not answer).
    async fn stats_of(&mut self, addrs: &[String]) -> Vec<(String, Option<NodeStats>)> {
        let mut asks = tokio::task::JoinSet::new();
        for (i, addr) in addrs.iter().enumerate() {
            let client = match self.by_addr.get(addr) {
                Some(c) => c.clone(),
                None => match Cluster::new(std::slice::from_ref(addr), self.config.clone()) {
                    Ok(c) => {
                        let c = Arc::new(c);
                        self.by_addr.insert(addr.clone(), c.clone());
                        c
                    }
                    Err(_) => continue,
                },
            };
            asks.spawn(async move { (i, client.stats(0).await.ok()) });
        }
        let mut out: Vec<(String, Option<NodeStats>)> = addrs.iter().map(|a| (a.clone(), None)).collect();
        while let Some(done) = asks.join_next().await {
            if let Ok((i, stats)) = done
                && let Some(slot) = out.get_mut(i)
            {
                slot.1 = stats;
            }
        }
        out
    }
}
