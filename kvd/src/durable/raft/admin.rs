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

use std::collections::BTreeSet;
use std::sync::atomic::Ordering;
use std::time::Duration;

use openraft::{BasicNode, ChangeMembers, ServerState};

use super::open::GROUP_ELECTION_MS;
use super::shard::DurableShard;
use super::types::{LogError, leader_hint};
use crate::durable::member_id;
use crate::durable::network::{AdminReply, AdminRequest, admin_call};

/// How long a new learner may take to catch up before `AddLearner` gives up.
const CATCH_UP_LIMIT: Duration = Duration::from_secs(600);
/// How long the chosen member may take to win its election before the hand-over is called off.
const TAKE_OVER_LIMIT: Duration = Duration::from_secs(3);

impl DurableShard {
    /// Carries out an operator's request about the group (or, for `Campaign`, a handing-over
    /// leader's).
    pub async fn admin(&self, request: AdminRequest) -> AdminReply {
        if !self.grouped {
            return AdminReply::Failed("this node is not a member of a replica group".into());
        }
        if request == AdminRequest::Campaign {
            return match self.raft.trigger().elect().await {
                Ok(()) => AdminReply::Done("campaigning".into()),
                Err(e) => AdminReply::Failed(e.to_string()),
            };
        }
        if let Err(LogError::NotLeader(leader)) = self.leadership() {
            return AdminReply::NotLeader(leader);
        }
        if let AdminRequest::ReadIndex { member } = request {
            // Not a change: no log line. Shares the leader's own reads' rounds.
            if self
                .raft
                .metrics()
                .borrow()
                .membership_config
                .membership()
                .get_node(&member)
                .is_none()
            {
                return AdminReply::Failed("not a member of the group".into());
            }
            return match self.confirm_leadership() {
                Some(round) => match round.await {
                    Ok(Ok(index)) => AdminReply::ReadIndex(index),
                    Ok(Err(LogError::NotLeader(leader))) => AdminReply::NotLeader(leader),
                    Ok(Err(LogError::Failed(why))) => AdminReply::Failed(why),
                    Err(_) => AdminReply::NotLeader(None),
                },
                None => AdminReply::Failed("this node is not a member of a replica group".into()),
            };
        }
        let (outcome, why) = match request {
            AdminRequest::AddLearner { addr, why } => (self.add_learner(addr).await, why),
            AdminRequest::Promote { addr, why } => (self.promote(&addr).await, why),
            AdminRequest::Remove { addr, why } => (self.remove(&addr).await, why),
            AdminRequest::TransferLeader { addr } => (self.hand_over(&addr).await, "kvd admin".into()),
            AdminRequest::Campaign | AdminRequest::ReadIndex { .. } => {
                (Ok(AdminReply::Done("nothing to change".into())), String::new())
            }
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
                AdminReply::Failed(why)
            }
        }
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
        self.raft
            .metrics()
            .borrow()
            .membership_config
            .membership()
            .voter_ids()
            .collect()
    }

    async fn add_learner(&self, addr: String) -> Result<AdminReply, String> {
        let id = member_id(&addr);
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
            .map_err(|e| leader_or(e.forward_to_leader().map(leader_hint), e.to_string()))?;
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
            Err(openraft::metrics::WaitError::Timeout(..)) => Err(format!(
                "{addr} did not catch up within {CATCH_UP_LIMIT:?} (is it running with --join, and reachable from the leader?); it stays a learner: remove it with `kvd admin remove-replica`"
            )),
            Err(e) => Err(format!(
                "{e} (this member stopped leading while {addr} caught up: ask again)"
            )),
        }
    }

    async fn promote(&self, addr: &str) -> Result<AdminReply, String> {
        let id = member_id(addr);
        if self.is_voter(id) {
            return Ok(AdminReply::Done(format!("{addr} is a voter already")));
        }
        let change = ChangeMembers::AddVoterIds(BTreeSet::from([id]));
        self.raft
            .change_membership(change, false)
            .await
            .map_err(|e| leader_or(e.forward_to_leader().map(leader_hint), e.to_string()))?;
        Ok(AdminReply::Done(format!("{addr} is a voter")))
    }

    async fn remove(&self, addr: &str) -> Result<AdminReply, String> {
        let id = member_id(addr);
        let voters = self.voters();
        if !voters.contains(&id) {
            let learner = self
                .raft
                .metrics()
                .borrow()
                .membership_config
                .membership()
                .learner_ids()
                .any(|l| l == id);
            if !learner {
                return Ok(AdminReply::Done(format!("{addr} is not a member")));
            }
            self.raft
                .change_membership(ChangeMembers::RemoveNodes(BTreeSet::from([id])), false)
                .await
                .map_err(|e| e.to_string())?;
            return Ok(AdminReply::Done(format!("removed the learner {addr}")));
        }
        if voters.len() == 1 {
            return Err(format!(
                "{addr} is the group's only voter: add another member before removing it"
            ));
        }
        if id == self.me {
            // Hand over to the member that is furthest along, then let it do the removal.
            let next = self.most_caught_up(&voters).ok_or("no other voter to hand over to")?;
            self.hand_over(&next).await?;
            return Ok(AdminReply::NotLeader(Some(next)));
        }
        self.raft
            .change_membership(ChangeMembers::RemoveVoters(BTreeSet::from([id])), false)
            .await
            .map_err(|e| leader_or(e.forward_to_leader().map(leader_hint), e.to_string()))?;
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
    async fn hand_over(&self, addr: &str) -> Result<AdminReply, String> {
        let target = member_id(addr);
        if target == self.me {
            return Ok(AdminReply::Done(format!("{addr} leads already")));
        }
        if !self.is_voter(target) {
            return Err(format!("{addr} is not a voter of this group"));
        }
        let peer =
            kvshared::client::Cluster::new(&[addr.to_string()], self.client.clone()).map_err(|e| e.to_string())?;
        self.handing_over.store(true, Ordering::Relaxed);
        self.raft.runtime_config().heartbeat(false);
        let outcome = self.quiet_and_campaign(target, &peer).await;
        self.raft.runtime_config().heartbeat(true);
        self.handing_over.store(false, Ordering::Relaxed);
        outcome.map(|took| AdminReply::Done(format!("{addr} leads (the shard paused {} ms)", took.as_millis())))
    }

    async fn quiet_and_campaign(&self, target: u64, peer: &kvshared::client::Cluster) -> Result<Duration, String> {
        let began = tokio::time::Instant::now();
        let lease = Duration::from_millis(GROUP_ELECTION_MS.1 + 100);
        // The entry already proposed still commits (within milliseconds); campaign once no
        // follower has heard from this leader for a whole lease. The others would campaign
        // only a random 0.4-0.8 s later, so the chosen member asks first.
        let (mut last, mut changed) = (self.raft.metrics().borrow().last_log_index, began);
        while changed.elapsed() < lease {
            tokio::time::sleep(Duration::from_millis(20)).await;
            let m = self.raft.metrics().borrow().clone();
            if m.state != ServerState::Leader {
                return Err("this member stopped leading while handing over".into());
            }
            if m.last_log_index != last {
                (last, changed) = (m.last_log_index, tokio::time::Instant::now());
            }
            if began.elapsed() > TAKE_OVER_LIMIT {
                return Err("the log kept growing while handing over; try again".into());
            }
        }
        let deadline = tokio::time::Instant::now() + TAKE_OVER_LIMIT;
        while tokio::time::Instant::now() < deadline {
            match admin_call(peer, AdminRequest::Campaign).await {
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
                    return Err("another member was elected; the group has a leader, not the one asked for".into());
                }
                Err(_) => {}
            }
        }
        Err(format!(
            "the member did not take over within {TAKE_OVER_LIMIT:?}; this member leads on"
        ))
    }
}

/// An error that says who leads when openraft named a leader.
fn leader_or(hint: Option<LogError>, why: String) -> String {
    match hint {
        Some(LogError::NotLeader(Some(l))) => format!("not the leader any more ({l} is): {why}"),
        _ => why,
    }
}
