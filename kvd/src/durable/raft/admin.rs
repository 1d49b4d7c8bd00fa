//! Membership changes and leader hand-over (`kvd admin`), carried out by the group's leader.
//!
//! Adding a member is openraft's two steps: the new member joins as a learner and catches up
//! (from the log, or the leader's snapshot when the log no longer reaches back), then a
//! joint-consensus change makes it a voter. Removing one is a membership change; a leader
//! that removes itself hands the leadership over first, so the group never waits out an
//! election for it.
//!
//! openraft 0.9 has no leadership transfer, and a follower refuses to vote while its leader
//! lease (the election timeout's maximum since it last heard from the leader) runs. So the
//! leader hands over by going quiet: it stops serving batches (they are answered "not the
//! leader", so nothing is lost and clients retry), stops its heartbeats, waits out the lease,
//! and asks the new member to campaign. The other followers would campaign only after the
//! lease plus a random election timeout, so the chosen member, whose log is complete since
//! nothing was written meanwhile, is the first to ask and wins. Whatever happens, the leader
//! turns its heartbeats and serving back on within a few seconds: a failed hand-over leaves
//! the group as it was.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::Ordering;
use std::time::Duration;

use openraft::{BasicNode, ChangeMembers, ServerState};

use super::change_error::ChangeError;
use super::open::GROUP_ELECTION_MS;
use super::shard::DurableShard;
use super::types::{SubmitError, leader_hint};
use crate::durable::meta::Identity;
use crate::durable::network::{AdminReply, AdminRequest, MemberIdentity, Target};

/// How long a new learner may take to catch up before `AddLearner` gives up.
const CATCH_UP_LIMIT: Duration = Duration::from_secs(600);
/// How long after the lease's end the chosen member is asked to campaign (the last heartbeat's
/// way to the followers, on this clock).
const HAND_OVER_MARGIN_MS: u64 = 25;
/// How long the chosen member may take to win its election before the hand-over is called off.
const TAKE_OVER_LIMIT: Duration = Duration::from_secs(3);

impl DurableShard {
    /// Carries out a request about the group: an operator's, a handing-over leader's
    /// (`Campaign`), a follower's (`ReadIndex`), or `kvd admin init-group`'s and an adding
    /// leader's (`Identify`, `Adopt`, `Initialize`).
    pub async fn admin(&self, request: AdminRequest) -> AdminReply {
        if !self.grouped {
            return AdminReply::Failed("this node is not a member of a replica group".into());
        }
        match request {
            AdminRequest::Identify => return AdminReply::Identity(self.identity()),
            AdminRequest::Adopt { group } => return self.adopt(group).await,
            AdminRequest::Initialize { members } => return self.initialize(members).await,
            AdminRequest::PreVote { candidate, last_log } => {
                return self
                    .answer_pre_vote(candidate, last_log.map(super::campaign::log_id))
                    .await;
            }
            AdminRequest::Campaign => {
                return match self.raft.trigger().elect().await {
                    Ok(()) => AdminReply::Done("campaigning".into()),
                    Err(e) => AdminReply::Failed(e.to_string()),
                };
            }
            _ => {}
        }
        if let Err(SubmitError::NotLeader(leader)) = self.leadership() {
            return AdminReply::NotLeader(leader);
        }
        if let AdminRequest::ReadIndex { member } = request {
            return self.read_index_for(member).await;
        }
        let (outcome, why) = match request {
            AdminRequest::AddLearner { addr, why } => (self.add_learner(addr).await, why),
            AdminRequest::Promote { addr, why } => (self.promote(&addr).await, why),
            AdminRequest::Remove { addr, why } => (self.remove(&addr).await, why),
            AdminRequest::TransferLeader { addr } => (self.hand_over(&addr).await, "kvd admin".into()),
            _ => (Ok(AdminReply::Done("nothing to change".into())), String::new()),
        };
        match outcome {
            Ok(done) => {
                tracing::info!(?done, %why, "membership change");
                if let AdminReply::Done(what) = &done {
                    self.note_change(what, &why);
                }
                done
            }
            Err(why) => {
                tracing::warn!(%why, "membership change failed");
                AdminReply::Failed(why.to_string())
            }
        }
    }

    /// Who this member is.
    fn identity(&self) -> MemberIdentity {
        MemberIdentity {
            member: self.me,
            group: self.group_id(),
            initialised: self.with_membership(|m| m.nodes().next().is_some()),
            peers: self.peers.clone(),
            shard: self.shard.clone(),
        }
    }

    /// Joins `group` for good: written to the data directory (atomically, fsynced) before the
    /// answer, so that from then on this member answers that group's RPCs only.
    async fn adopt(&self, group: u64) -> AdminReply {
        if group == 0 {
            return AdminReply::Failed("a group id is never 0".into());
        }
        match self.group_id() {
            Some(g) if g == group => return AdminReply::Done(format!("member {} is in group {g}", self.me)),
            Some(g) => {
                return AdminReply::Failed(format!(
                    "member {} belongs to group {g}, not {group}: a member is in one group for life                      (move its data directory away to make it a new, blank member)",
                    self.me
                ));
            }
            None => {}
        }
        let identity = Identity {
            member: self.me,
            group: Some(group),
        };
        let dir = self.dir.clone();
        match tokio::task::spawn_blocking(move || identity.store(&dir)).await {
            Ok(Ok(())) => {
                self.group.store(group, Ordering::Relaxed);
                tracing::info!(group, member = self.me, "joined a replica group");
                AdminReply::Done(format!("member {} joined group {group}", self.me))
            }
            Ok(Err(e)) => AdminReply::Failed(format!("cannot write the identity file: {e}")),
            Err(e) => AdminReply::Failed(e.to_string()),
        }
    }

    /// Starts the group with `members` (`kvd admin init-group`, once every member adopted it).
    async fn initialize(&self, members: Vec<(u64, String)>) -> AdminReply {
        if self.group_id().is_none() {
            return AdminReply::Failed("this member has not adopted a group: run `kvd admin init-group`".into());
        }
        if !members.iter().any(|(id, _)| *id == self.me) {
            return AdminReply::Failed(format!("member {} is not among the members to start with", self.me));
        }
        let nodes: BTreeMap<u64, BasicNode> = members.into_iter().map(|(id, addr)| (id, BasicNode { addr })).collect();
        match self.raft.initialize(nodes).await {
            Ok(()) => AdminReply::Done("the group is initialised".into()),
            Err(e) => AdminReply::Failed(format!("cannot initialise the group: {e}")),
        }
    }

    /// A read index for a follower's reads (not a change: no log line). Shares the leader's
    /// own reads' rounds.
    async fn read_index_for(&self, member: u64) -> AdminReply {
        let known = self.with_membership(|m| m.get_node(&member).is_some());
        if !known {
            return AdminReply::Failed("not a member of the group".into());
        }
        match self.read_index_round().await {
            Ok(Ok(index)) => AdminReply::ReadIndex(index),
            Ok(Err(SubmitError::NotLeader(leader))) => AdminReply::NotLeader(leader),
            Ok(Err(SubmitError::Failed(why) | SubmitError::Refused(why))) => AdminReply::Failed(why),
            Err(_) => AdminReply::NotLeader(None),
        }
    }

    /// The ids the membership lists at `addr`, voters first (two while a member that lost
    /// its disk is being replaced by its new self).
    fn ids_at(&self, addr: &str) -> Vec<u64> {
        let m = self.raft.metrics().borrow().clone();
        let membership = m.membership_config.membership();
        let mut ids: Vec<u64> = membership
            .voter_ids()
            .chain(membership.learner_ids())
            .filter(|id| membership.get_node(id).is_some_and(|n| n.addr == addr))
            .collect();
        ids.dedup();
        ids
    }

    /// Keeps a change in the leader's list (shown by `kvd stats` and kvtui).
    fn note_change(&self, what: &str, why: &str) {
        let mut changes = self.changes.lock();
        if changes.len() == kvshared::stats::GroupChange::KEPT {
            changes.pop_front();
        }
        changes.push_back(kvshared::stats::GroupChange {
            unix_ms: std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_millis() as u64),
            what: what.to_string(),
            why: why.to_string(),
        });
    }

    fn is_voter(&self, id: u64) -> bool {
        self.voters().contains(&id)
    }

    fn voters(&self) -> Vec<u64> {
        self.with_membership(|m| m.voter_ids().collect())
    }

    /// Asks the kvd at `addr` who it is, and makes it adopt this group.
    async fn enlist(&self, addr: &str) -> Result<u64, ChangeError> {
        let unreachable = |source| ChangeError::Unreachable {
            addr: addr.to_string(),
            source,
        };
        let peer = kvshared::client::Cluster::new(&[addr.to_string()], self.client.clone()).map_err(unreachable)?;
        let who = match kvshared::admin::call(&peer, Target::ANY, AdminRequest::Identify).await {
            Ok(AdminReply::Identity(who)) => who,
            Ok(other) => {
                return Err(ChangeError::NoIdentity {
                    addr: addr.to_string(),
                    answer: format!("{other:?}"),
                });
            }
            Err(e) => return Err(unreachable(e)),
        };
        if who.shard != self.shard {
            return Err(ChangeError::OtherShard {
                addr: addr.to_string(),
                theirs: who.shard.to_string(),
                ours: self.shard.to_string(),
            });
        }
        let group = self.group_id().ok_or(ChangeError::NoGroup)?;
        if let Some(theirs) = who.group.filter(|g| *g != group) {
            return Err(ChangeError::OtherGroup {
                addr: addr.to_string(),
                group: theirs,
            });
        }
        let to = Target {
            group: 0,
            member: who.member,
        };
        match kvshared::admin::call(&peer, to, AdminRequest::Adopt { group }).await {
            Ok(AdminReply::Done(_)) => Ok(who.member),
            Ok(other) => Err(ChangeError::NotJoined {
                addr: addr.to_string(),
                answer: format!("{other:?}"),
            }),
            Err(e) => Err(unreachable(e)),
        }
    }

    async fn add_learner(&self, addr: String) -> Result<AdminReply, ChangeError> {
        let id = self.enlist(&addr).await?;
        if self.is_voter(id) {
            return Ok(AdminReply::Done(format!("{addr} is a voter already")));
        }
        let node = BasicNode { addr: addr.clone() };
        // openraft 0.9's blocking add_learner gives up waiting after its default 500 ms and
        // answers Ok: add without blocking, and wait here for the learner to reach the log's
        // end as of now (from there on it keeps pace like any follower).
        self.raft
            .add_learner(id, node, false)
            .await
            .map_err(|e| raft_refused(e.forward_to_leader().map(leader_hint), e.to_string()))?;
        let target = self.raft.metrics().borrow().last_log_index.unwrap_or(0);
        let caught_up = self
            .raft
            .wait(Some(CATCH_UP_LIMIT))
            .metrics(
                |m| {
                    m.replication
                        .as_ref()
                        .and_then(|r| r.get(&id).copied().flatten())
                        .is_some_and(|l| l.index >= target)
                },
                "the new learner catches up",
            )
            .await;
        match caught_up {
            Ok(_) => Ok(AdminReply::Done(format!("{addr} has caught up as a learner"))),
            Err(openraft::metrics::WaitError::Timeout(..)) => Err(ChangeError::NoCatchUp {
                addr,
                limit: CATCH_UP_LIMIT,
            }),
            Err(e) => Err(ChangeError::LeadLostCatchingUp {
                addr,
                why: e.to_string(),
            }),
        }
    }

    /// Makes the learner at `addr` a voter; a voter at the same address with another id (the
    /// member it was before its disk was wiped) leaves the voters in the same change.
    async fn promote(&self, addr: &str) -> Result<AdminReply, ChangeError> {
        let ids = self.ids_at(addr);
        let voters = self.voters();
        let Some(&new) = ids.iter().find(|id| !voters.contains(id)) else {
            return match ids.is_empty() {
                true => Err(ChangeError::NotALearner { addr: addr.to_string() }),
                false => Ok(AdminReply::Done(format!("{addr} is a voter already"))),
            };
        };
        let replaced: Vec<u64> = ids.iter().copied().filter(|id| voters.contains(id)).collect();
        let mut next: BTreeSet<u64> = voters.iter().copied().filter(|v| !replaced.contains(v)).collect();
        next.insert(new);
        self.raft
            .change_membership(ChangeMembers::ReplaceAllVoters(next), false)
            .await
            .map_err(|e| raft_refused(e.forward_to_leader().map(leader_hint), e.to_string()))?;
        Ok(AdminReply::Done(match replaced.is_empty() {
            true => format!("{addr} is a voter"),
            false => format!("{addr} is a voter again, as a new member (member {new}; it replaced {replaced:?})"),
        }))
    }

    async fn remove(&self, addr: &str) -> Result<AdminReply, ChangeError> {
        let Some(id) = self.ids_at(addr).first().copied() else {
            return Ok(AdminReply::Done(format!("{addr} is not a member")));
        };
        let voters = self.voters();
        if !voters.contains(&id) {
            let learner = self.with_membership(|m| m.learner_ids().any(|l| l == id));
            if !learner {
                return Ok(AdminReply::Done(format!("{addr} is not a member")));
            }
            self.raft
                .change_membership(ChangeMembers::RemoveNodes(BTreeSet::from([id])), false)
                .await
                .map_err(|e| raft_refused(None, e.to_string()))?;
            return Ok(AdminReply::Done(format!("removed the learner {addr}")));
        }
        if voters.len() == 1 {
            return Err(ChangeError::OnlyVoter { addr: addr.to_string() });
        }
        if id == self.me {
            // Hand over to the member that is furthest along, then let it do the removal.
            let next = self.most_caught_up(&voters).ok_or(ChangeError::NoOtherVoter)?;
            self.hand_over(&next).await?;
            return Ok(AdminReply::NotLeader(Some(next)));
        }
        self.raft
            .change_membership(ChangeMembers::RemoveVoters(BTreeSet::from([id])), false)
            .await
            .map_err(|e| raft_refused(e.forward_to_leader().map(leader_hint), e.to_string()))?;
        Ok(AdminReply::Done(format!("removed {addr}")))
    }

    /// The address of the voter other than this one whose log reaches furthest.
    fn most_caught_up(&self, voters: &[u64]) -> Option<String> {
        let m = self.raft.metrics().borrow().clone();
        let matched = m.replication.clone().unwrap_or_default();
        voters
            .iter()
            .filter(|v| **v != self.me)
            .max_by_key(|v| matched.get(v).copied().flatten().map_or(0, |l| l.index))
            .and_then(|v| m.membership_config.membership().get_node(v).map(|n| n.addr.clone()))
    }

    /// Hands the leadership to the voter at `addr` (see the module docs).
    async fn hand_over(&self, addr: &str) -> Result<AdminReply, ChangeError> {
        let voters = self.voters();
        let Some(target) = self.ids_at(addr).into_iter().find(|id| voters.contains(id)) else {
            return Err(ChangeError::NotAVoter { addr: addr.to_string() });
        };
        if target == self.me {
            return Ok(AdminReply::Done(format!("{addr} leads already")));
        }
        if !self.is_voter(target) {
            return Err(ChangeError::NotAVoter { addr: addr.to_string() });
        }
        let peer = kvshared::client::Cluster::new(&[addr.to_string()], self.client.clone()).map_err(|source| {
            ChangeError::Unreachable {
                addr: addr.to_string(),
                source,
            }
        })?;
        // This member does not campaign against the one it hands the lead to: once the new
        // leader has won, a first heartbeat of its that a busy machine delays past this
        // member's timeout would otherwise let this member take the lead straight back
        // (the other followers' leases ran out while it went quiet).
        self.campaign
            .quiet_for(TAKE_OVER_LIMIT * 2 + Duration::from_millis(GROUP_ELECTION_MS.1 * 4));
        self.handing_over.store(true, Ordering::Relaxed);
        self.raft.runtime_config().heartbeat(false);
        let outcome = self.quiet_and_campaign(target, &peer).await;
        self.raft.runtime_config().heartbeat(true);
        self.handing_over.store(false, Ordering::Relaxed);
        outcome.map(|took| AdminReply::Done(format!("{addr} leads (the shard paused {} ms)", took.as_millis())))
    }

    async fn quiet_and_campaign(&self, target: u64, peer: &kvshared::client::Cluster) -> Result<Duration, ChangeError> {
        let began = tokio::time::Instant::now();
        let lease = Duration::from_millis(GROUP_ELECTION_MS.1 + HAND_OVER_MARGIN_MS);
        // The entry already proposed still commits (within milliseconds); campaign once no
        // follower has heard from this leader for a whole lease. A follower campaigns on its
        // own only after the lease plus its own timeout (450-600 ms), so the chosen member,
        // asking at 325 ms, is first.
        let (mut last, mut changed) = (self.raft.metrics().borrow().last_log_index, began);
        while changed.elapsed() < lease {
            tokio::time::sleep(Duration::from_millis(20)).await;
            let m = self.raft.metrics().borrow().clone();
            if m.state != ServerState::Leader {
                return Err(ChangeError::StoppedLeading);
            }
            if m.last_log_index != last {
                (last, changed) = (m.last_log_index, tokio::time::Instant::now());
            }
            if began.elapsed() > TAKE_OVER_LIMIT {
                return Err(ChangeError::LogKeptGrowing);
            }
        }
        let deadline = tokio::time::Instant::now() + TAKE_OVER_LIMIT;
        while tokio::time::Instant::now() < deadline {
            let to = Target {
                group: self.group.load(Ordering::Relaxed),
                member: target,
            };
            match kvshared::admin::call(peer, to, AdminRequest::Campaign).await {
                Ok(AdminReply::Done(_)) => {}
                Ok(other) => tracing::debug!(?other, "campaign request"),
                Err(e) => tracing::debug!(error = %e, "campaign request"),
            }
            let mut metrics = self.raft.metrics();
            let waited = tokio::time::timeout(Duration::from_millis(500), async {
                loop {
                    {
                        let m = metrics.borrow();
                        if m.current_leader.is_some_and(|l| l != self.me) && m.state != ServerState::Leader {
                            return m.current_leader;
                        }
                    }
                    if metrics.changed().await.is_err() {
                        return None;
                    }
                }
            })
            .await;
            match waited {
                Ok(Some(leader)) if leader == target => return Ok(began.elapsed()),
                Ok(_) => {
                    return Err(ChangeError::OtherElected);
                }
                Err(_) => {}
            }
        }
        Err(ChangeError::NoTakeOver(TAKE_OVER_LIMIT))
    }
}

/// openraft's refusal, saying who leads when it named a leader.
fn raft_refused(hint: Option<SubmitError>, why: String) -> ChangeError {
    let leader = match hint {
        Some(SubmitError::NotLeader(Some(l))) => Some(l),
        _ => None,
    };
    ChangeError::Raft { leader, why }
}
