//! When a member of a replica group campaigns: a pre-vote (the Raft thesis, 9.6; etcd's
//! `PreVote`) decides, not openraft's election timer.
//!
//! openraft 0.9 has no pre-vote. A follower that times out votes for itself in a new term at
//! once, and two of its rules then slow failover down when that follower lacks the dead
//! leader's last entry (measured over 20 kills: 1.2-2.2 s where the others took 0.6-0.8 s):
//! the other follower refuses it but, having already voted in that term, cannot be elected
//! in it either; and a member refuses every vote for a lease after its own vote changed, so
//! the member that can win waits out one or two more timeouts. A follower that saw a longer
//! log once also adds twice the timeout to its next wait, even an election later.
//!
//! So a grouped member runs with openraft's timer off, and this task asks the other voters
//! first, changing nothing: "would you vote for my log now?" ([`grants`]). Only with a
//! majority of each of the membership's configurations does it start openraft's election.
//! A member that refuses a pre-vote for a shorter log while it has not heard from a leader
//! for a lease itself asks at once, so the member that can win goes first. Safety is still
//! openraft's vote; this only decides who asks and when.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use openraft::{LogId, ServerState};
use tokio::time::Instant;

use super::open::GROUP_ELECTION_MS;
use super::types::ShardRaft;
use crate::durable::network::{AdminReply, AdminRequest, Target};
use kvshared::admin::LogPosition;

/// How often the task looks whether it is time to ask.
const TICK: Duration = Duration::from_millis(10);
/// How long a pre-vote waits for a member's answer.
const ASK_LIMIT: Duration = Duration::from_millis(150);
/// openraft's leader lease: how long after its vote last changed (a leader's append, a vote)
/// a member refuses votes; the election timeout's maximum.
pub(super) const LEASE: Duration = Duration::from_millis(GROUP_ELECTION_MS.1);

/// What the campaign task and the pre-vote answers share: whether this member may campaign
/// now, and the prod that makes the task look at once.
pub(super) struct Campaign {
    /// A restarted member applies what it knew committed first (see `open::catch_up`).
    catching_up: AtomicBool,
    /// Until when (ms since `epoch`) a member receiving a snapshot holds back (see
    /// `DurableShard::receiving_snapshot`).
    quiet_until: AtomicU64,
    epoch: std::time::Instant,
    prod: tokio::sync::Notify,
}

impl Default for Campaign {
    fn default() -> Campaign {
        Campaign {
            catching_up: AtomicBool::new(false),
            quiet_until: AtomicU64::new(0),
            epoch: std::time::Instant::now(),
            prod: tokio::sync::Notify::new(),
        }
    }
}

impl Campaign {
    /// Holds campaigns back, or lets them go, while a restarted member catches up.
    pub(super) fn catching_up(&self, on: bool) {
        self.catching_up.store(on, Ordering::Relaxed);
    }

    /// Holds campaigns back for `d` from now (or longer, if already held longer).
    pub(super) fn quiet_for(&self, d: Duration) {
        let until = (self.epoch.elapsed() + d).as_millis() as u64;
        self.quiet_until.fetch_max(until, Ordering::Relaxed);
    }

    fn held(&self) -> bool {
        self.catching_up.load(Ordering::Relaxed)
            || (self.epoch.elapsed().as_millis() as u64) < self.quiet_until.load(Ordering::Relaxed)
    }
}

/// Where a member stands when it answers a pre-vote or decides to ask for them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Standing {
    pub leads: bool,
    /// Time since its vote last changed (none: it never voted nor heard from a leader).
    pub heard: Option<Duration>,
    /// Whether its vote is a leader's that a quorum granted (it follows a leader).
    pub committed: bool,
    /// Its log's last entry.
    pub last_log: Option<LogId<u64>>,
}

/// The pre-vote rule: a member would vote for a candidate with log `theirs` when the
/// candidate is a voter of the membership it knows, if it knows one (a removed member, never
/// told, is refused), it does not lead, has not heard from a leader (nor voted) for a lease,
/// and `theirs` is at least as new as its own: what openraft's vote would decide, without
/// changing anything.
pub(super) fn grants(me: &Standing, voter: bool, theirs: Option<LogId<u64>>) -> bool {
    voter && !me.leads && me.heard.is_none_or(|d| d >= LEASE) && theirs >= me.last_log
}

/// Whether a member that refused `theirs` should ask for pre-votes itself at once: its own
/// log is the newer one and its lease has run out too, so it, not the asker, can win.
pub(super) fn should_go_first(me: &Standing, theirs: Option<LogId<u64>>) -> bool {
    !me.leads && me.heard.is_none_or(|d| d >= LEASE) && theirs < me.last_log
}

/// How long after its vote last changed a member waits before asking: openraft's own timer
/// (a follower of a leader waits the lease and its timeout, a member without one its timeout).
pub(super) fn patience(committed: bool, drawn: Duration) -> Duration {
    if committed { LEASE + drawn } else { drawn }
}

/// Whether `granted` (the members that would vote, this one included) holds a majority of
/// every configuration of a (possibly joint) membership.
pub(super) fn majority(configs: &[BTreeSet<u64>], granted: &BTreeSet<u64>) -> bool {
    !configs.is_empty() && configs.iter().all(|c| c.intersection(granted).count() * 2 > c.len())
}

/// Whether `member` is a voter of the membership `raft` knows; `None` while it knows none.
fn voter_in(raft: &openraft::Raft<ShardRaft>, member: u64) -> Option<bool> {
    let m = raft.metrics();
    let m = m.borrow();
    let mut voters = m.membership_config.membership().voter_ids().peekable();
    voters.peek()?;
    Some(voters.any(|v| v == member))
}

fn draw() -> Duration {
    Duration::from_millis(rand::random_range(GROUP_ELECTION_MS.0..=GROUP_ELECTION_MS.1))
}

/// What the campaign task works with.
pub(super) struct Campaigner {
    pub me: u64,
    pub raft: openraft::Raft<ShardRaft>,
    pub log: Arc<parking_lot::Mutex<super::log_store::LogInner>>,
    pub client: kvshared::client::ClientConfig,
    pub group: Arc<AtomicU64>,
    pub campaign: Arc<Campaign>,
}

/// Where `raft` stands now; `None` once it has stopped.
pub(super) async fn standing(
    raft: &openraft::Raft<ShardRaft>,
    log: &parking_lot::Mutex<super::log_store::LogInner>,
) -> Option<Standing> {
    let (leads, heard, committed) = raft
        .with_raft_state(|s| {
            let heard = s.vote_last_modified().map(|t| t.elapsed());
            (
                s.server_state == ServerState::Leader,
                heard,
                s.vote_ref().is_committed(),
            )
        })
        .await
        .ok()?;
    let last_log = {
        let log = log.lock();
        log.cache.last().or(log.last_purged)
    };
    Some(Standing {
        leads,
        heard,
        committed,
        last_log,
    })
}

impl Campaigner {
    /// Runs until the raft stops: each tick, when this voter has not heard from a leader
    /// for its patience (or was prodded and its lease has run out), asks for pre-votes and,
    /// with a majority, starts openraft's election; after a round it waits a fresh timeout.
    pub(super) async fn run(self) {
        let mut drawn: (Option<Duration>, Duration) = (None, draw());
        let mut next_round = Instant::now();
        loop {
            let prodded = tokio::select! {
                _ = tokio::time::sleep(TICK) => false,
                _ = self.campaign.prod.notified() => true,
            };
            if self.campaign.held() || Instant::now() < next_round || !self.is_voter() {
                continue;
            }
            let Some(me) = standing(&self.raft, &self.log).await else {
                return;
            };
            if me.leads {
                continue;
            }
            let silent = me.heard.unwrap_or(Duration::MAX);
            // A fresh timeout for every change of the vote (openraft draws one per process).
            if drawn.0.is_none_or(|d| silent < d) {
                drawn.1 = draw();
            }
            drawn.0 = Some(silent);
            let wait = match prodded {
                true => LEASE,
                false => patience(me.committed, drawn.1),
            };
            if silent < wait {
                continue;
            }
            if self.pre_vote(me.last_log).await {
                tracing::info!(member = self.me, "pre-vote won: campaigning");
                if self.raft.trigger().elect().await.is_err() {
                    return;
                }
            }
            next_round = Instant::now() + draw();
        }
    }

    fn is_voter(&self) -> bool {
        voter_in(&self.raft, self.me) == Some(true)
    }

    /// Asks every other voter at once whether it would vote for `last_log` now.
    async fn pre_vote(&self, last_log: Option<LogId<u64>>) -> bool {
        let membership = self.raft.metrics().borrow().membership_config.clone();
        let configs = membership.membership().get_joint_config().clone();
        let others: Vec<(u64, String)> = membership
            .membership()
            .voter_ids()
            .filter(|&v| v != self.me)
            .filter_map(|v| membership.membership().get_node(&v).map(|n| (v, n.addr.clone())))
            .collect();
        let asks = others.into_iter().map(|(member, addr)| async move {
            let granted = tokio::time::timeout(ASK_LIMIT, self.ask(member, addr, last_log)).await;
            (member, granted.unwrap_or(false))
        });
        let mut granted: BTreeSet<u64> = futures::future::join_all(asks)
            .await
            .into_iter()
            .filter_map(|(member, yes)| yes.then_some(member))
            .collect();
        granted.insert(self.me);
        majority(&configs, &granted)
    }

    async fn ask(&self, member: u64, addr: String, last_log: Option<LogId<u64>>) -> bool {
        let Ok(peer) = kvshared::client::Cluster::new(&[addr], self.client.clone()) else {
            return false;
        };
        let to = Target {
            group: self.group.load(Ordering::Relaxed),
            member,
        };
        let ask = AdminRequest::PreVote {
            candidate: self.me,
            last_log: last_log.map(position),
        };
        match kvshared::admin::call(&peer, to, ask).await {
            Ok(AdminReply::PreVote(yes)) => yes,
            // A kvd from before pre-votes cannot read the request: it would have campaigned
            // on its own timer, so it counts as willing (its real vote still decides).
            Ok(AdminReply::Failed(why)) => why.starts_with(crate::durable::network::UNREADABLE),
            _ => false,
        }
    }
}

/// A log id as the admin requests carry it.
fn position(id: LogId<u64>) -> LogPosition {
    LogPosition {
        term: id.leader_id.term,
        leader: id.leader_id.node_id,
        index: id.index,
    }
}

/// A log id from the admin requests' form.
pub(super) fn log_id(p: LogPosition) -> LogId<u64> {
    LogId::new(openraft::CommittedLeaderId::new(p.term, p.leader), p.index)
}

impl super::shard::DurableShard {
    /// Answers another voter's pre-vote; when this member's own log is the newer and its
    /// lease is over, it asks for pre-votes itself at once.
    pub(super) async fn answer_pre_vote(&self, candidate: u64, theirs: Option<LogId<u64>>) -> AdminReply {
        let Some(me) = standing(&self.raft, &self.log).await else {
            return AdminReply::Failed("this member's raft has stopped".into());
        };
        if should_go_first(&me, theirs) {
            self.campaign.prod.notify_one();
        }
        // A member that knows no membership yet cannot rule the asker out (a group whose
        // first election failed must still be able to start).
        let voter = voter_in(&self.raft, candidate) != Some(false);
        AdminReply::PreVote(grants(&me, voter, theirs))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use openraft::CommittedLeaderId;

    fn log(term: u64, index: u64) -> Option<LogId<u64>> {
        Some(LogId::new(CommittedLeaderId::new(term, 1), index))
    }

    #[test]
    fn log_ids_and_positions_convert_both_ways() {
        let id = LogId::new(CommittedLeaderId::new(4, 8), 15);
        assert_eq!(log_id(position(id)), id);
    }

    fn standing(heard_ms: Option<u64>, last_log: Option<LogId<u64>>) -> Standing {
        Standing {
            leads: false,
            heard: heard_ms.map(Duration::from_millis),
            committed: true,
            last_log,
        }
    }

    #[test]
    fn a_pre_vote_is_granted_only_to_a_voter_past_the_lease_with_a_log_as_new() {
        let lease = LEASE.as_millis() as u64;
        let me = standing(Some(lease), log(3, 10));
        assert!(grants(&me, true, log(3, 10)), "same log, lease over");
        assert!(grants(&me, true, log(3, 11)), "longer log");
        assert!(grants(&me, true, log(4, 2)), "a later term beats a longer log");
        assert!(!grants(&me, true, log(3, 9)), "a shorter log");
        assert!(!grants(&me, true, log(2, 50)), "an older term, however long");
        assert!(!grants(&me, true, None), "no log");
        assert!(
            !grants(&me, false, log(3, 11)),
            "not a voter (a removed member, never told)"
        );
        assert!(
            !grants(&standing(Some(lease - 1), log(3, 10)), true, log(3, 11)),
            "heard from a leader within the lease"
        );
        assert!(
            grants(&standing(None, None), true, None),
            "a member that never heard of anyone"
        );
        let leader = Standing { leads: true, ..me };
        assert!(!grants(&leader, true, log(9, 99)), "a leader never grants");
    }

    #[test]
    fn the_member_with_the_newer_log_goes_first_once_its_lease_is_over() {
        let lease = LEASE.as_millis() as u64;
        assert!(should_go_first(&standing(Some(lease), log(3, 10)), log(3, 9)));
        assert!(
            !should_go_first(&standing(Some(lease), log(3, 10)), log(3, 10)),
            "not newer"
        );
        assert!(
            !should_go_first(&standing(Some(lease - 1), log(3, 10)), log(3, 9)),
            "its leader may live"
        );
    }

    #[test]
    fn campaigns_are_held_while_catching_up_and_for_a_while_after_a_snapshot_chunk() {
        let c = Campaign::default();
        assert!(!c.held());
        c.catching_up(true);
        assert!(c.held());
        c.catching_up(false);
        assert!(!c.held());
        c.quiet_for(Duration::from_secs(60));
        c.quiet_for(Duration::from_millis(1));
        assert!(c.held(), "a later chunk never shortens the quiet");
        let short = Campaign::default();
        short.quiet_for(Duration::from_millis(1));
        std::thread::sleep(Duration::from_millis(20));
        assert!(!short.held(), "the quiet ends");
    }

    #[test]
    fn a_follower_waits_the_lease_and_its_timeout_a_candidate_its_timeout() {
        let t = Duration::from_millis(GROUP_ELECTION_MS.0);
        assert_eq!(patience(true, t), LEASE + t);
        assert_eq!(patience(false, t), t);
    }

    #[test]
    fn a_majority_is_needed_in_every_configuration_of_a_joint_membership() {
        let set = |v: &[u64]| v.iter().copied().collect::<BTreeSet<u64>>();
        assert!(majority(&[set(&[1, 2, 3])], &set(&[1, 2])));
        assert!(!majority(&[set(&[1, 2, 3])], &set(&[1])));
        assert!(majority(&[set(&[1])], &set(&[1])), "a group of one voter");
        assert!(
            !majority(&[set(&[1, 2, 3, 4])], &set(&[1, 2])),
            "half is not a majority"
        );
        let joint = [set(&[1, 2, 3]), set(&[1, 2, 4])];
        assert!(majority(&joint, &set(&[1, 2])));
        assert!(majority(&joint, &set(&[1, 3, 4])), "two of each");
        assert!(!majority(&joint, &set(&[1, 3])), "one of the second's three");
        assert!(!majority(&[], &set(&[1])), "no configuration");
    }
}
