//! A shard's log as an openraft log: a group of one voter here, of several once replica
//! groups come (issue 13), over the log files of [`super::log`] and the node's [`Store`].
//!
//! A batch with writes is one log entry: its frame body, validated again when applied (a
//! log file is untrusted input too). The state machine applies an entry by running the
//! batch through the store, reads included, so ops on one key keep batch order; the reply
//! comes back as the encoded response body. Read-only batches do not touch the log.
//!
//! Status (issue 12): serves `--data-dir` for one voter (write, restart, replay; the crash
//! test is `kvd/tests/durability.rs`). Not yet: snapshots (policy off), purging and
//! truncating the log on disk, coalescing many batches into one entry.

use std::collections::BTreeMap;
use std::fmt::Debug;
use std::io::Cursor;
use std::ops::RangeBounds;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use kvshared::frame::{AlignedVec, FrameKind, HEADER_LEN};
use kvshared::stats::Counts;
use kvshared::wire::{BatchResponse, BatchView, encode_frame};
use openraft::storage::{LogFlushed, LogState, RaftLogStorage, RaftStateMachine, Snapshot};
use openraft::{
    BasicNode, Entry, EntryPayload, LogId, OptionalSend, RaftLogReader, RaftSnapshotBuilder, SnapshotMeta,
    StorageError, StorageIOError, StoredMembership, Vote,
};
use serde::{Deserialize, Serialize};

use super::log::{FsyncPolicy, GroupCommit, LogFiles};
use super::snapshot;
use crate::counters::Counters;
use crate::store::{Scratch, Store, Unbounded};

/// The batches with writes of one log entry, as their frame bodies: the proposer puts every
/// batch that arrived while the previous entries were being committed into one entry.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct WriteBatch(pub Vec<Vec<u8>>);

/// The encoded response bodies of an entry's batches, in order (none for raft's own entries).
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct Applied(pub Vec<Vec<u8>>);

/// Most batches in one entry.
const MAX_BATCHES_PER_ENTRY: usize = 1024;
/// Entries proposed and not yet applied at once (so commits overlap with the next fsync).
const PROPOSALS_IN_FLIGHT: usize = 4;

openraft::declare_raft_types!(
    /// The raft types of a shard group.
    pub ShardRaft:
        D = WriteBatch,
        R = Applied,
        NodeId = u64,
        Node = BasicNode,
        Entry = Entry<ShardRaft>,
        SnapshotData = Cursor<Vec<u8>>,
        AsyncRuntime = openraft::TokioRuntime,
);

type StorageResult<T> = Result<T, StorageError<u64>>;

fn io_error(e: impl std::fmt::Display) -> StorageError<u64> {
    StorageError::IO {
        source: StorageIOError::write(&std::io::Error::other(e.to_string())),
    }
}

/// The log storage: every entry kept in memory (until snapshots purge them) and on disk.
pub struct LogStore {
    inner: Arc<parking_lot::Mutex<LogInner>>,
}

struct LogInner {
    dir: PathBuf,
    entries: BTreeMap<u64, Entry<ShardRaft>>,
    last_purged: Option<LogId<u64>>,
    vote: Option<Vote<u64>>,
    writer: Option<Arc<GroupCommit>>,
}

impl LogStore {
    /// Opens (or creates) the log in `dir`, reading back every entry.
    pub fn open(dir: &Path, fsync: FsyncPolicy) -> Result<LogStore, Box<dyn std::error::Error + Send + Sync>> {
        let (files, recovered) = LogFiles::open(&dir.join("log"), 0)?;
        let mut entries = BTreeMap::new();
        for (index, bytes) in recovered.records {
            let entry: Entry<ShardRaft> =
                postcard::from_bytes(&bytes).map_err(|e| format!("log record {index}: cannot decode: {e}"))?;
            if entry.log_id.index != index {
                return Err(format!("log record {index} holds entry {}", entry.log_id.index).into());
            }
            entries.insert(index, entry);
        }
        let vote_path = dir.join("vote");
        let vote = match vote_path.exists() {
            true => Some(postcard::from_bytes(&snapshot::read(&vote_path)?.data).map_err(|e| e.to_string())?),
            false => None,
        };
        Ok(LogStore {
            inner: Arc::new(parking_lot::Mutex::new(LogInner {
                dir: dir.to_path_buf(),
                entries,
                last_purged: None,
                vote,
                writer: Some(Arc::new(GroupCommit::start(files, fsync))),
            })),
        })
    }
}

impl RaftLogReader<ShardRaft> for LogStore {
    async fn try_get_log_entries<RB: RangeBounds<u64> + Clone + Debug + OptionalSend>(
        &mut self,
        range: RB,
    ) -> StorageResult<Vec<Entry<ShardRaft>>> {
        Ok(self.inner.lock().entries.range(range).map(|(_, e)| e.clone()).collect())
    }
}

impl RaftLogStorage<ShardRaft> for LogStore {
    type LogReader = LogStore;

    async fn get_log_state(&mut self) -> StorageResult<LogState<ShardRaft>> {
        let inner = self.inner.lock();
        let last = inner
            .entries
            .last_key_value()
            .map(|(_, e)| e.log_id)
            .or(inner.last_purged);
        Ok(LogState {
            last_purged_log_id: inner.last_purged,
            last_log_id: last,
        })
    }

    async fn get_log_reader(&mut self) -> Self::LogReader {
        LogStore {
            inner: self.inner.clone(),
        }
    }

    async fn save_vote(&mut self, vote: &Vote<u64>) -> StorageResult<()> {
        let path = self.inner.lock().dir.join("vote");
        let data = postcard::to_allocvec(vote).map_err(io_error)?;
        snapshot::write(&path, &snapshot::Snapshot { meta: Vec::new(), data }).map_err(io_error)?;
        self.inner.lock().vote = Some(*vote);
        Ok(())
    }

    async fn read_vote(&mut self) -> StorageResult<Option<Vote<u64>>> {
        Ok(self.inner.lock().vote)
    }

    async fn append<I>(&mut self, entries: I, callback: LogFlushed<ShardRaft>) -> StorageResult<()>
    where
        I: IntoIterator<Item = Entry<ShardRaft>> + OptionalSend,
        I::IntoIter: OptionalSend,
    {
        let mut inner = self.inner.lock();
        let mut payloads = Vec::new();
        let mut first = None;
        for entry in entries {
            first.get_or_insert(entry.log_id.index);
            payloads.push(postcard::to_allocvec(&entry).map_err(io_error)?);
            inner.entries.insert(entry.log_id.index, entry);
        }
        let (Some(first), Some(writer)) = (first, inner.writer.clone()) else {
            callback.log_io_completed(Ok(()));
            return Ok(());
        };
        drop(inner);
        writer.append(first, payloads, move |result| {
            callback.log_io_completed(result.map_err(std::io::Error::other));
        });
        Ok(())
    }

    async fn truncate(&mut self, log_id: LogId<u64>) -> StorageResult<()> {
        // A lone voter never has entries to take back; replica groups will need this.
        Err(io_error(format!(
            "truncating the log at {log_id} is not supported yet (a group of one voter never needs it)"
        )))
    }

    async fn purge(&mut self, log_id: LogId<u64>) -> StorageResult<()> {
        let mut inner = self.inner.lock();
        inner.entries.retain(|&i, _| i > log_id.index);
        inner.last_purged = Some(log_id);
        Ok(())
    }
}

/// The state machine: the node's store, and how far it has applied.
pub struct StateMachine {
    store: Arc<Store>,
    counters: Arc<Counters>,
    last_applied: Option<LogId<u64>>,
    membership: StoredMembership<u64, BasicNode>,
    scratch: Scratch,
    response: BatchResponse,
    body: AlignedVec,
}

impl StateMachine {
    /// A state machine that applies to `store` (empty: the log is replayed into it).
    pub fn new(store: Arc<Store>, counters: Arc<Counters>) -> StateMachine {
        StateMachine {
            store,
            counters,
            last_applied: None,
            membership: StoredMembership::default(),
            scratch: Scratch::default(),
            response: BatchResponse::default(),
            body: AlignedVec::new(),
        }
    }

    fn apply_batch(&mut self, bytes: &[u8]) -> Vec<u8> {
        self.body.clear();
        self.body.extend_from_slice(bytes);
        let Ok(batch) = BatchView::parse(&self.body) else {
            // Validated before it was proposed; a log that does not decode is refused on
            // open. Nothing to run.
            return Vec::new();
        };
        let mut tally = Counts::default();
        self.store.execute(
            &batch,
            &mut self.response,
            &mut Unbounded,
            &mut self.scratch,
            &mut tally,
        );
        self.counters.add_counts(0, &tally);
        let mut frame = AlignedVec::new();
        match encode_frame(FrameKind::BatchResponse, 0, &self.response, &mut frame) {
            Ok(()) => frame.get(HEADER_LEN..).unwrap_or_default().to_vec(),
            Err(_) => Vec::new(),
        }
    }
}

/// Builds no snapshot yet (the snapshot policy is off; see the module docs).
pub struct NoSnapshots;

impl RaftSnapshotBuilder<ShardRaft> for NoSnapshots {
    async fn build_snapshot(&mut self) -> StorageResult<Snapshot<ShardRaft>> {
        Err(io_error("snapshots are not built yet"))
    }
}

impl RaftStateMachine<ShardRaft> for StateMachine {
    type SnapshotBuilder = NoSnapshots;

    async fn applied_state(&mut self) -> StorageResult<(Option<LogId<u64>>, StoredMembership<u64, BasicNode>)> {
        Ok((self.last_applied, self.membership.clone()))
    }

    async fn apply<I>(&mut self, entries: I) -> StorageResult<Vec<Applied>>
    where
        I: IntoIterator<Item = Entry<ShardRaft>> + OptionalSend,
        I::IntoIter: OptionalSend,
    {
        let mut out = Vec::new();
        for entry in entries {
            self.last_applied = Some(entry.log_id);
            out.push(match entry.payload {
                EntryPayload::Blank => Applied::default(),
                EntryPayload::Normal(WriteBatch(batches)) => {
                    Applied(batches.iter().map(|b| self.apply_batch(b)).collect())
                }
                EntryPayload::Membership(m) => {
                    self.membership = StoredMembership::new(Some(entry.log_id), m);
                    Applied::default()
                }
            });
        }
        Ok(out)
    }

    async fn get_snapshot_builder(&mut self) -> Self::SnapshotBuilder {
        NoSnapshots
    }

    async fn begin_receiving_snapshot(&mut self) -> StorageResult<Box<Cursor<Vec<u8>>>> {
        Err(io_error("snapshots are not received yet"))
    }

    async fn install_snapshot(
        &mut self,
        _meta: &SnapshotMeta<u64, BasicNode>,
        _snapshot: Box<Cursor<Vec<u8>>>,
    ) -> StorageResult<()> {
        Err(io_error("snapshots are not installed yet"))
    }

    async fn get_current_snapshot(&mut self) -> StorageResult<Option<Snapshot<ShardRaft>>> {
        Ok(None)
    }
}

/// The network of a group of one: there is nobody to talk to.
pub struct Alone;

/// A connection to no one.
pub struct NoPeer;

impl openraft::network::RaftNetworkFactory<ShardRaft> for Alone {
    type Network = NoPeer;

    async fn new_client(&mut self, _target: u64, _node: &BasicNode) -> NoPeer {
        NoPeer
    }
}

fn unreachable<E: std::error::Error>() -> openraft::error::RPCError<u64, BasicNode, E> {
    openraft::error::RPCError::Unreachable(openraft::error::Unreachable::new(&std::io::Error::other(
        "a group of one voter has no peers",
    )))
}

impl openraft::network::RaftNetwork<ShardRaft> for NoPeer {
    async fn append_entries(
        &mut self,
        _rpc: openraft::raft::AppendEntriesRequest<ShardRaft>,
        _option: openraft::network::RPCOption,
    ) -> Result<
        openraft::raft::AppendEntriesResponse<u64>,
        openraft::error::RPCError<u64, BasicNode, openraft::error::RaftError<u64>>,
    > {
        Err(unreachable())
    }

    async fn install_snapshot(
        &mut self,
        _rpc: openraft::raft::InstallSnapshotRequest<ShardRaft>,
        _option: openraft::network::RPCOption,
    ) -> Result<
        openraft::raft::InstallSnapshotResponse<u64>,
        openraft::error::RPCError<
            u64,
            BasicNode,
            openraft::error::RaftError<u64, openraft::error::InstallSnapshotError>,
        >,
    > {
        Err(unreachable())
    }

    async fn vote(
        &mut self,
        _rpc: openraft::raft::VoteRequest<u64>,
        _option: openraft::network::RPCOption,
    ) -> Result<
        openraft::raft::VoteResponse<u64>,
        openraft::error::RPCError<u64, BasicNode, openraft::error::RaftError<u64>>,
    > {
        Err(unreachable())
    }
}

/// A shard's raft group of one voter over `dir`, applying to `store`.
pub struct DurableShard {
    raft: openraft::Raft<ShardRaft>,
    proposals: tokio::sync::mpsc::UnboundedSender<Proposal>,
}

/// A batch waiting for the proposer, and where its answer goes.
type Proposal = (Vec<u8>, tokio::sync::oneshot::Sender<Result<Vec<u8>, String>>);

/// Group commit above the log: takes every batch queued while earlier entries were being
/// committed, proposes them as one entry (up to [`PROPOSALS_IN_FLIGHT`] entries at once), and
/// hands each batch its own answer.
async fn propose(raft: openraft::Raft<ShardRaft>, mut queue: tokio::sync::mpsc::UnboundedReceiver<Proposal>) {
    let slots = Arc::new(tokio::sync::Semaphore::new(PROPOSALS_IN_FLIGHT));
    while let Some(first) = queue.recv().await {
        let Ok(slot) = slots.clone().acquire_owned().await else {
            return;
        };
        let mut waiting = vec![first];
        while waiting.len() < MAX_BATCHES_PER_ENTRY {
            match queue.try_recv() {
                Ok(p) => waiting.push(p),
                Err(_) => break,
            }
        }
        let (bodies, answers): (Vec<_>, Vec<_>) = waiting.into_iter().unzip();
        let raft = raft.clone();
        tokio::spawn(async move {
            let result = raft.client_write(WriteBatch(bodies)).await;
            drop(slot);
            match result {
                Ok(written) => {
                    for (answer, reply) in answers.into_iter().zip(written.data.0) {
                        let _ = answer.send(Ok(reply));
                    }
                }
                Err(e) => {
                    for answer in answers {
                        let _ = answer.send(Err(e.to_string()));
                    }
                }
            }
        });
    }
}

/// This node's id in its group of one.
const ME: u64 = 1;

impl DurableShard {
    /// Opens the shard's log in `dir` (creating and initialising the group on first start),
    /// replays it into `store`, and returns once the node leads its group and has applied
    /// every committed entry.
    pub async fn open(
        dir: &Path,
        store: Arc<Store>,
        counters: Arc<Counters>,
        fsync: FsyncPolicy,
    ) -> Result<DurableShard, Box<dyn std::error::Error + Send + Sync>> {
        let log = LogStore::open(dir, fsync)?;
        let fresh = log.inner.lock().vote.is_none() && log.inner.lock().entries.is_empty();
        let config = openraft::Config {
            heartbeat_interval: 250,
            election_timeout_min: 300,
            election_timeout_max: 600,
            snapshot_policy: openraft::SnapshotPolicy::Never,
            ..Default::default()
        };
        let raft = openraft::Raft::new(
            ME,
            Arc::new(config.validate()?),
            Alone,
            log,
            StateMachine::new(store, counters),
        )
        .await?;
        if fresh {
            let mut members = BTreeMap::new();
            members.insert(ME, BasicNode::default());
            raft.initialize(members).await?;
        }
        let (proposals, queue) = tokio::sync::mpsc::unbounded_channel();
        tokio::spawn(propose(raft.clone(), queue));
        let shard = DurableShard { raft, proposals };
        shard
            .raft
            .wait(Some(std::time::Duration::from_secs(10)))
            .state(openraft::ServerState::Leader, "lead the group of one")
            .await?;
        let last = shard.raft.metrics().borrow().last_log_index;
        shard
            .raft
            .wait(Some(std::time::Duration::from_secs(60)))
            .applied_index_at_least(last, "apply the recovered log")
            .await?;
        Ok(shard)
    }

    /// Commits a batch with writes (durably, as `--fsync` says, together with the batches
    /// that arrive meanwhile) and applies it; returns the encoded response body.
    pub async fn write(&self, batch_body: Vec<u8>) -> Result<Vec<u8>, Box<dyn std::error::Error + Send + Sync>> {
        let (tx, rx) = tokio::sync::oneshot::channel();
        self.proposals
            .send((batch_body, tx))
            .map_err(|_| "the shard's log has stopped")?;
        Ok(rx.await.map_err(|_| "the shard's log has stopped")??)
    }

    /// The index of the last applied entry.
    pub fn applied_index(&self) -> u64 {
        self.raft.metrics().borrow().last_applied.map_or(0, |l| l.index)
    }

    /// Stops the group.
    pub async fn shutdown(&self) {
        let _ = self.raft.shutdown().await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kvshared::routing::ShardId;
    use kvshared::wire::{BatchRequest, OpReply, ReplyView};

    fn body(req: &BatchRequest) -> Vec<u8> {
        let mut frame = AlignedVec::new();
        encode_frame(FrameKind::BatchRequest, 1, req, &mut frame).unwrap();
        frame[HEADER_LEN..].to_vec()
    }

    fn aligned(bytes: &[u8]) -> AlignedVec {
        let mut v = AlignedVec::new();
        v.extend_from_slice(bytes);
        v
    }

    /// Writes go through the log; after a restart on the same directory the store is
    /// rebuilt from it and every acknowledged write is there.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn acknowledged_writes_survive_a_restart() {
        let dir = std::env::temp_dir().join(format!("kvd-raft-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let store = Arc::new(Store::new(ShardId::SOLO, 8, 0).unwrap());
        let shard = DurableShard::open(&dir, store.clone(), Arc::default(), FsyncPolicy::Always)
            .await
            .unwrap();
        for i in 0..50 {
            let mut req = BatchRequest::new();
            req.push_put(format!("k{i}").as_bytes(), format!("v{i}").as_bytes());
            req.push_get(format!("k{i}").as_bytes());
            let reply = aligned(&shard.write(body(&req)).await.unwrap());
            let view = ReplyView::parse(&reply).unwrap();
            assert_eq!(view.result(0), OpReply::Stored);
            assert_eq!(view.result(1), OpReply::Found(format!("v{i}").as_bytes()));
        }
        shard.shutdown().await;
        drop(shard);
        assert_eq!(store.len(), 50);

        let again = Arc::new(Store::new(ShardId::SOLO, 8, 0).unwrap());
        let shard = DurableShard::open(&dir, again.clone(), Arc::default(), FsyncPolicy::Always)
            .await
            .unwrap();
        assert_eq!(again.len(), 50, "the log was replayed into the new store");
        let mut req = BatchRequest::new();
        req.push_get(b"k49");
        req.push_put(b"k50", b"after the restart");
        let reply = aligned(&shard.write(body(&req)).await.unwrap());
        assert_eq!(ReplyView::parse(&reply).unwrap().result(0), OpReply::Found(b"v49"));
        shard.shutdown().await;
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
