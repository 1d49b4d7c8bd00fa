//! A durable shard as the node sees it: submit a batch, ask who leads, confirm leadership for
//! reads, follower reads, snapshots on demand, shutdown.

use std::sync::Arc;

use super::propose::Proposal;
use super::reads::{ReadIndexWaiter, queue_for_read_index};
use super::state_machine::Snapshots;
use super::tasks::Tasks;
use super::types::{LogAnswer, ShardRaft, SubmitError};
use crate::durable::log::{FsyncPolicy, GroupCommit};

/// How long after a snapshot chunk a follower holds its campaign back.
const SNAPSHOT_QUIET: std::time::Duration = std::time::Duration::from_secs(1);

/// A shard's raft group over `dir`, applying to `store`: of one voter, or of the members
/// of `--group` (replica groups).
pub struct DurableShard {
    pub(super) raft: openraft::Raft<ShardRaft>,
    pub(super) proposals: tokio::sync::mpsc::UnboundedSender<Proposal>,
    pub(super) writer: Arc<GroupCommit>,
    /// The log store's state (for its figures).
    pub(super) log: Arc<parking_lot::Mutex<super::log_store::LogInner>>,
    pub(super) snapshots: Arc<parking_lot::Mutex<Snapshots>>,
    pub(super) fsync: FsyncPolicy,
    /// This member's id, and whether there are other members.
    pub(super) me: u64,
    pub(super) grouped: bool,
    /// Leadership checks for reads, shared by all the reads waiting at one moment; each
    /// answers the read index (the leader's commit index when the round began).
    pub(super) confirms: tokio::sync::mpsc::UnboundedSender<ReadIndexWaiter>,
    /// On a follower or learner: reads waiting to run once this member has applied the
    /// leader's read index (follower reads).
    pub(super) member_reads: tokio::sync::mpsc::UnboundedSender<ReadIndexWaiter>,
    /// Terms this process has seen begin (each is an election).
    pub(super) events: Arc<super::open::RaftEvents>,
    /// How this member reaches the others (for a hand-over's `Campaign`).
    pub(super) client: kvshared::client::ClientConfig,
    /// This leader is handing over (`transfer-leader`): it serves nothing meanwhile.
    pub(super) handing_over: Arc<std::sync::atomic::AtomicBool>,
    /// The commit index the leader last sent this member (openraft 0.9's metrics have none).
    pub(super) leader_commit: std::sync::atomic::AtomicU64,
    /// The membership changes this member carried out as leader (see `GroupFigures::changes`).
    pub(super) changes: parking_lot::Mutex<std::collections::VecDeque<kvshared::stats::GroupChange>>,
    /// How fresh this member's store is, for bounded-staleness reads (see `lease`).
    pub(super) lease: Arc<super::lease::Lease>,
    /// Whether this member may campaign now, and its pre-vote answers' prod (see `campaign`).
    pub(super) campaign: Arc<super::campaign::Campaign>,
    /// This member's group id (0 while it belongs to none: a blank member), shared with the
    /// network so that every RPC names it.
    pub(super) group: Arc<std::sync::atomic::AtomicU64>,
    /// Its `--group` list (what `kvd admin init-group` checks).
    pub(super) peers: Vec<String>,
    /// The shard it serves, `I/N`.
    pub(super) shard: String,
    /// Its data directory (where a group it adopts is written down).
    pub(super) dir: std::path::PathBuf,
    /// Every background task of the shard, ended with it.
    pub(super) tasks: Arc<Tasks>,
    /// Whether the disk takes writes (a stalled disk refuses batches with writes).
    pub(super) health: Arc<crate::durable::health::DiskHealth>,
}

impl DurableShard {
    /// Queues the body of a batch (of writes and the reads that follow them) for the log;
    /// the answer comes once its entry is committed (durably, as `--fsync` says, together
    /// with the batches that arrive meanwhile) and applied: the encoded response body.
    pub fn submit(&self, batch_body: Vec<u8>) -> tokio::sync::oneshot::Receiver<LogAnswer> {
        let (tx, rx) = tokio::sync::oneshot::channel();
        if let Err(tokio::sync::mpsc::error::SendError((_, tx))) = self.proposals.send((batch_body, tx)) {
            let _ = tx.send(Err(SubmitError::Failed("the shard's log has stopped".into())));
        }
        rx
    }

    /// Whether this member may serve now: `Ok` when it leads its group (as far as it knows;
    /// reads confirm it with [`DurableShard::read_index_round`]), else who does.
    pub fn leadership(&self) -> Result<(), SubmitError> {
        if !self.grouped {
            return Ok(());
        }
        if self.handing_over.load(std::sync::atomic::Ordering::Relaxed) {
            return Err(SubmitError::NotLeader(None));
        }
        // Read in place: this runs once per batch, and the metrics hold the membership.
        let metrics = self.raft.metrics();
        let m = metrics.borrow();
        if m.current_leader == Some(self.me) && m.state == openraft::ServerState::Leader {
            // A new leader serves once it has applied an entry of its own term: then every
            // entry an earlier leader committed (and maybe acknowledged) is in the store too.
            // Until then its reads could miss a write acknowledged just before the election.
            if m.last_applied.is_some_and(|l| l.leader_id.term == m.current_term) {
                return Ok(());
            }
            return Err(SubmitError::NotLeader(None));
        }
        // (A member that restarted may still hold its own old leadership in its vote: it
        // names nobody rather than itself.)
        let leader = m
            .current_leader
            .filter(|id| *id != self.me)
            .and_then(|id| m.membership_config.membership().get_node(&id).map(|n| n.addr.clone()));
        Err(SubmitError::NotLeader(leader))
    }

    /// Whether another member may serve this group's reads: a replica group whose
    /// membership (as this member's log says now) lists a member other than this one.
    /// Otherwise this leader's store holds every write it acknowledged (a write is answered
    /// once applied here) and nobody else can have served a later one: its reads run at
    /// once, as a lone durable node's do, and a batch's reads before its first write do not
    /// go through the log. A member added later is in the membership before it holds
    /// anything to serve (its first entries come after the change), and its reads ask this
    /// leader for a read index, which a round answers (`read_index_for`), not this check.
    pub fn shares_reads(&self) -> bool {
        self.grouped && self.with_membership(|m| m.nodes().any(|(id, _)| *id != self.me))
    }

    /// `f` of the membership this member's log holds now.
    pub(super) fn with_membership<R>(&self, f: impl FnOnce(&openraft::Membership<u64, openraft::BasicNode>) -> R) -> R {
        f(self.raft.metrics().borrow().membership_config.membership())
    }

    /// For reads not yet run on this leader (when [`DurableShard::shares_reads`]) and for a
    /// member's: answers the read index once a majority has confirmed, after they arrived,
    /// that this member still leads, and this member has applied everything committed when
    /// that round began (openraft's `ensure_linearizable`); the reads may run then.
    pub fn read_index_round(&self) -> tokio::sync::oneshot::Receiver<Result<u64, SubmitError>> {
        queue_for_read_index(&self.confirms)
    }

    /// On a follower or learner, for reads not yet run: answers `Ok` once this member has
    /// applied the leader's read index (see `follow_reads`); the reads may run then. `None`
    /// outside a replica group.
    pub fn member_read(&self) -> Option<tokio::sync::oneshot::Receiver<Result<u64, SubmitError>>> {
        if !self.is_member() {
            return None;
        }
        Some(queue_for_read_index(&self.member_reads))
    }

    /// Whether this node is a member (voter or learner) of its group as its log says now: a
    /// removed learner (the shard manager's) or one not yet added serves no reads.
    fn is_member(&self) -> bool {
        self.grouped && self.with_membership(|m| m.get_node(&self.me).is_some())
    }

    /// Whether this member may answer reads from its own store and stay within `bound` of
    /// its leader: a read-index round trip it *sent* at most `bound` ago (by its own clock)
    /// confirmed an index it has applied (see `lease`: pauses cannot fool it).
    pub fn fresh_within(&self, bound: std::time::Duration) -> bool {
        self.is_member() && self.lease.fresh_within(bound, self.applied_index())
    }

    /// The group's raft.
    pub(super) fn raft(&self) -> &openraft::Raft<ShardRaft> {
        &self.raft
    }

    /// A snapshot chunk arrived: this member does not campaign until a second after the
    /// last one. (openraft 0.9 does not count chunks as hearing from the leader; a follower
    /// catching up by a large snapshot timed out and started an election that deposed a
    /// working leader.)
    pub(super) fn receiving_snapshot(&self) {
        self.campaign.quiet_for(SNAPSHOT_QUIET);
    }

    /// Notes the commit index a leader's append carried (this member's commit index, for
    /// stats; never for freshness: a message that waited in a socket says nothing of now).
    pub(super) fn note_leader_commit(&self, index: Option<u64>) {
        if let Some(i) = index {
            self.leader_commit.fetch_max(i, std::sync::atomic::Ordering::Relaxed);
        }
    }

    /// The index of the last applied entry.
    pub fn applied_index(&self) -> u64 {
        self.raft.metrics().borrow().last_applied.map_or(0, |l| l.index)
    }

    /// Takes a snapshot now and waits until it is written, or until it is clear the newest
    /// snapshot already holds everything applied (tests and operators).
    pub async fn snapshot_now(&self) -> Result<(), SnapshotNowError> {
        let before = self.snapshots.lock().taken;
        self.raft
            .trigger()
            .snapshot()
            .await
            .map_err(|e| SnapshotNowError::Stopped(Box::new(e)))?;
        for i in 0..6000 {
            let (taken, building, index) = {
                let s = self.snapshots.lock();
                let index = s.current.as_ref().and_then(|(m, _, _)| m.last_log_id).map(|l| l.index);
                (s.taken, s.building, index)
            };
            // openraft skips a snapshot of what the newest one already holds.
            if taken > before || (!building && index.is_some_and(|i| i >= self.applied_index())) {
                return Ok(());
            }
            // openraft also ignores a trigger while it still counts the last snapshot as
            // being built (its completion not yet processed): ask again.
            if !building && i % 10 == 9 {
                self.raft
                    .trigger()
                    .snapshot()
                    .await
                    .map_err(|e| SnapshotNowError::Stopped(Box::new(e)))?;
            }
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
        Err(SnapshotNowError::TimedOut)
    }

    /// Stops the group.
    pub async fn shutdown(&self) {
        self.tasks.abort_all();
        let _ = self.raft.shutdown().await;
    }

    /// While the disk refuses writes: why, for a client whose write is refused (nothing ran).
    pub fn write_refusal(&self) -> Option<String> {
        self.health.refusal()
    }

    /// This member's group id, once it belongs to one.
    pub fn group_id(&self) -> Option<u64> {
        Some(self.group.load(std::sync::atomic::Ordering::Relaxed)).filter(|&g| g != 0)
    }
}

/// Why [`DurableShard::snapshot_now`] did not see a snapshot written.
#[derive(Debug, thiserror::Error)]
pub enum SnapshotNowError {
    /// The raft core has stopped.
    #[error("the raft core has stopped: {0}")]
    Stopped(Box<openraft::error::Fatal<u64>>),
    /// No snapshot was written in time.
    #[error("the snapshot did not finish within 60 s")]
    TimedOut,
}
