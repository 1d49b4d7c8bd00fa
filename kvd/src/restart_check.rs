//! `kvd admin restart-check`: whether a member of a replica group may be stopped now, for a
//! restart or an upgrade done member by member (docs/UPGRADING.md).
//!
//! It reads every member's stats (the client protocol, which members of one release apart
//! both speak) and holds a member stoppable when:
//!
//! - it is not the leader (stopping the leader costs the group an election; move the lead
//!   first with `kvd admin transfer-leader`);
//! - it answers and has applied everything the leader had committed when asked (after a
//!   restart: it has caught up again);
//! - without it, a majority of the voters (the leader among them) answer and have caught up
//!   the same way, so the group keeps committing while it is down.
//!
//! "Committed when asked" is the leader's commit index read before the member's applied
//! index: a member that applies steadily passes under a steady load too.

use std::time::Duration;

use kvshared::client::{ClientConfig, ClientError, Cluster};
use kvshared::stats::{GroupRole, NodeStats};

/// How long one member may take to answer its stats.
const ASK_LIMIT: Duration = Duration::from_secs(2);
/// How often `--wait` asks again.
const ASK_EVERY: Duration = Duration::from_millis(200);

/// Checks `addr` in shard `shard`'s group (reached through `members`); with a `limit`, asks
/// again until it holds or the limit passes. Returns the exit code: 0 may stop, 1 not now.
pub async fn run(
    shard: usize,
    members: Vec<String>,
    config: ClientConfig,
    addr: &str,
    limit: Duration,
) -> std::io::Result<u8> {
    let config = ClientConfig {
        request_timeout: ASK_LIMIT,
        conns_per_node: 1,
        ..config
    };
    let began = tokio::time::Instant::now();
    let mut last = String::new();
    loop {
        let verdict = check(&members, &config, addr).await;
        match verdict {
            Ok(why) => {
                kvshared::outln!("{addr} may be stopped: {why}")?;
                return Ok(0);
            }
            Err(why) if began.elapsed() >= limit => {
                kvshared::outln!("{addr} may not be stopped now (shard {shard}): {why}")?;
                return Ok(1);
            }
            Err(why) => {
                let why = why.to_string();
                if why != last {
                    eprintln!("kvd: waiting: {why}");
                    last = why;
                }
                tokio::time::sleep(ASK_EVERY).await;
            }
        }
    }
}

/// What each address answered (or why it did not).
type Answers = Vec<(String, Result<NodeStats, ClientError>)>;

/// Why a member has not caught up.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
enum Behind {
    #[error("{addr} has applied {applied} of the {commit} entries committed")]
    Applying { addr: String, applied: u64, commit: u64 },
    #[error("{addr} does not answer ({source})")]
    Silent { addr: String, source: ClientError },
    #[error("{0} was not asked")]
    NotAsked(String),
}

/// Why the member may not be stopped now.
#[derive(Debug, PartialEq, thiserror::Error)]
enum NotNow {
    #[error("no member says it leads the group (asked {0}): an election?")]
    NoLeader(String),
    #[error("it leads the group (term {0}): move the lead first with kvd admin transfer-leader")]
    Leads(u64),
    #[error("it is not a member of the group led by {leader} (members {members})")]
    NotMember { leader: String, members: String },
    #[error("it has not caught up: {0}")]
    NotCaughtUp(Behind),
    #[error(
        "without it, {ready} of {voters} voters have caught up and a majority needs {majority} ({})",
        behind.iter().map(Behind::to_string).collect::<Vec<_>>().join("; ")
    )]
    NoMajority {
        ready: usize,
        voters: usize,
        majority: usize,
        behind: Vec<Behind>,
    },
}

/// Why the member may be stopped.
#[derive(Debug, PartialEq)]
struct MayStop {
    leader: String,
    applied: u64,
    commit: u64,
    ready: usize,
    voters: usize,
    majority: usize,
}

impl std::fmt::Display for MayStop {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "not the leader ({} leads); applied {} of {} committed; without it {} of {} voters have caught up (a majority is {})",
            self.leader, self.applied, self.commit, self.ready, self.voters, self.majority
        )
    }
}

async fn ask(addrs: &[String], config: &ClientConfig) -> Answers {
    let asks = addrs.iter().map(|a| async move {
        let stats = match Cluster::new(std::slice::from_ref(a), config.clone()) {
            Ok(c) => c.stats(0).await,
            Err(e) => Err(e),
        };
        (a.clone(), stats)
    });
    futures::future::join_all(asks).await
}

/// The verdict on `addr` now: why it may be stopped, or why not.
async fn check(members: &[String], config: &ClientConfig, addr: &str) -> Result<MayStop, NotNow> {
    // First the leader (and its commit index), then every voter's applied index.
    let mut addrs: Vec<String> = members.to_vec();
    if !addrs.iter().any(|m| m == addr) {
        addrs.push(addr.to_string());
    }
    let first = ask(&addrs, config).await;
    let (leader, leader_stats) = first
        .iter()
        .filter_map(|(a, s)| s.as_ref().ok().map(|s| (a, s)))
        .filter(|(_, s)| s.group.role == GroupRole::Leader)
        .max_by_key(|(_, s)| s.group.term)
        .ok_or_else(|| NotNow::NoLeader(addrs.join(", ")))?;
    if leader == addr {
        return Err(NotNow::Leads(leader_stats.group.term));
    }
    let commit = leader_stats.group.commit_index;
    let voters = leader_stats.group.members.clone();
    let mut everyone = voters.clone();
    everyone.extend(leader_stats.group.learners.iter().cloned());
    if !everyone.iter().any(|m| m == addr) {
        return Err(NotNow::NotMember {
            leader: leader.clone(),
            members: everyone.join(", "),
        });
    }
    let now = ask(&everyone, config).await;
    let caught_up = |a: &str| -> Result<u64, Behind> {
        match now.iter().find(|(m, _)| m == a).map(|(_, s)| s) {
            Some(Ok(s)) if s.group.applied_index >= commit => Ok(s.group.applied_index),
            Some(Ok(s)) => Err(Behind::Applying {
                addr: a.to_string(),
                applied: s.group.applied_index,
                commit,
            }),
            Some(Err(e)) => Err(Behind::Silent {
                addr: a.to_string(),
                source: e.clone(),
            }),
            None => Err(Behind::NotAsked(a.to_string())),
        }
    };
    verdict(addr, leader, &voters, commit, &caught_up)
}

/// Whether the voters other than `addr` keep a caught-up majority, then whether `addr` has
/// caught up itself (in that order: with a voter down, the missing majority is the reason
/// that lasts, whatever entry `addr` is applying under load at that instant).
fn verdict(
    addr: &str,
    leader: &str,
    voters: &[String],
    commit: u64,
    caught_up: &dyn Fn(&str) -> Result<u64, Behind>,
) -> Result<MayStop, NotNow> {
    let majority = voters.len() / 2 + 1;
    let others: Vec<&String> = voters.iter().filter(|v| *v != addr).collect();
    let (ready, behind): (Vec<_>, Vec<_>) = others.iter().map(|v| caught_up(v)).partition(Result::is_ok);
    if ready.len() < majority {
        return Err(NotNow::NoMajority {
            ready: ready.len(),
            voters: voters.len(),
            majority,
            behind: behind.into_iter().filter_map(Result::err).collect(),
        });
    }
    let applied = caught_up(addr).map_err(NotNow::NotCaughtUp)?;
    Ok(MayStop {
        leader: leader.to_string(),
        applied,
        commit,
        ready: ready.len(),
        voters: voters.len(),
        majority,
    })
}
