//! The manager's first lever: read replicas. A hot shard gets a spare member as a learner
//! (it catches up from the leader, then serves reads); a cooled shard gives it back.

use std::collections::HashMap;
use std::sync::Arc;

use kvshared::client::{ClientConfig, Cluster, members};
use kvshared::stats::{GroupRole, NodeStats};

use super::decision::{DecisionLine, decision, finished, print};
use super::policy::{Decision, Policy, ShardLoad, ShardState};
use crate::control::admin_cmd::Group;
use kvshared::admin::AdminRequest;

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

/// Every shard's learners as the manager follows them.
pub struct Learners {
    shards: Vec<Shard>,
    clients: Clients,
    policy: Policy,
    spare: Vec<String>,
    config: ClientConfig,
}

impl Learners {
    /// The shards of `entries` (`--nodes`), with these spares.
    pub fn new(entries: &[String], spare: Vec<String>, policy: Policy, config: ClientConfig) -> Learners {
        let shards = entries
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
        let clients = Clients {
            config: config.clone(),
            by_addr: HashMap::new(),
        };
        Learners {
            shards,
            clients,
            policy,
            spare,
            config,
        }
    }

    /// One interval: reports finished changes, reads every member's load, maybe starts a
    /// change per shard.
    pub async fn tick(&mut self, json: bool) -> crate::control::error::Result<()> {
        let spares = self.clients.stats_of(&self.spare).await;
        // Spares serving some shard now, by the leaders' last word: a new replica goes to
        // the spare machine that serves the fewest.
        let in_use: Vec<String> = self.shards.iter().flat_map(|s| s.added.iter().cloned()).collect();
        for shard in self.shards.iter_mut() {
            if shard.change.as_ref().is_some_and(|c| c.is_finished())
                && let Some(handle) = shard.change.take()
                && let Ok(outcome) = handle.await
            {
                print(&outcome.line, json)?;
            }
            let stats = self.clients.stats_of(&shard.members).await;
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
                if self.spare.contains(l) && !shard.added.contains(l) {
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
            let (line, done, request) = match self.policy.decide(&mut shard.state, &load, spare.is_some()) {
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
            print(&line, json)?;
            let mut g = Group::of(shard.index, shard.members.clone(), self.config.clone());
            shard.change = Some(tokio::spawn(async move {
                let outcome = g.send(request).await;
                ChangeOutcome {
                    line: finished(line, done, outcome),
                }
            }));
        }
        Ok(())
    }

    /// Waits for the changes under way and prints how they ended.
    pub async fn finish(&mut self, json: bool) -> crate::control::error::Result<()> {
        for shard in self.shards.iter_mut() {
            if let Some(handle) = shard.change.take()
                && let Ok(outcome) = handle.await
            {
                print(&outcome.line, json)?;
            }
        }
        Ok(())
    }
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
