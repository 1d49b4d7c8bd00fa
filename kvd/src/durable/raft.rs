//! A shard's log as an openraft log: a group of one voter, or with `--group` the members of
//! a replica group (over [`super::network`]), over the log files of [`super::log`], the
//! snapshots of [`super::catalog`] and the node's [`Store`].
//!
//! A log entry holds the write parts of the batches that arrived while earlier entries were
//! committing (see `propose`); each part is a batch frame body, validated again when
//! applied (a log file is untrusted input too). Applying runs the part through the store, so
//! ops on one key keep batch order; its reply goes back as an encoded response body.
//!
//! Snapshots are fuzzy, and exact per map shard: a snapshot says it holds the log up to index
//! `L` (what was applied when it began), but it copies one map shard at a time while later
//! entries go on being applied, so some shards' copies also hold writes after `L`. Each map
//! shard remembers the last entry whose writes reached it, and the snapshot stores that index
//! with the shard's pairs (under the same lock). Recovery loads it and replays every entry
//! after `L`, skipping, for each key, the entries its shard's copy already holds. (Replaying
//! a blind put or delete twice would be harmless; a conditional put, `SET NX`/`XX`, would not:
//! `XX a` then `NX b` from absent gives `b`, applied again on top of `b` gives `a`.) This is
//! what lets a snapshot of a large store be taken without stopping writes (only one map
//! shard's read lock is held at a time).

use std::collections::BTreeMap;
use std::fmt::Debug;
use std::ops::RangeBounds;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use kvshared::frame::AlignedVec;
use kvshared::stats::{Counts, Durability};
use kvshared::wire::{BatchResponse, BatchView, encode_body};
use openraft::storage::{LogFlushed, LogState, RaftLogStorage, RaftStateMachine, Snapshot};
use openraft::{
    BasicNode, Entry, EntryPayload, LogId, OptionalSend, RaftLogReader, RaftSnapshotBuilder, SnapshotMeta,
    StorageError, StorageIOError, StoredMembership, Vote,
};
use serde::{Deserialize, Serialize};

use super::log::{FsyncPolicy, GroupCommit, LogFiles};

mod admin;
use super::{DurableConfig, SnapshotEvery};
use super::{catalog, snapshot};
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
/// Entries proposed and not yet applied at once. One: the next entry takes every batch that
/// arrived while this one was committed, so each fsync carries as many batches as possible.
/// Measured A B A B (YCSB-B batch 64, --fsync always): 1 in flight 2.59M and 2.96M op/s, 4 in
/// flight 1.98M and 2.04M (more, smaller entries: more fsyncs and more per-entry work); 2, 8
/// and 16 were no better. Replica groups, with a network round trip per commit, may want more.
const PROPOSALS_IN_FLIGHT: usize = 1;

openraft::declare_raft_types!(
    /// The raft types of a shard group.
    pub ShardRaft:
        D = WriteBatch,
        R = Applied,
        NodeId = u64,
        Node = BasicNode,
        Entry = Entry<ShardRaft>,
        SnapshotData = tokio::fs::File,
        AsyncRuntime = openraft::TokioRuntime,
);

type StorageResult<T> = Result<T, StorageError<u64>>;

fn io_error(e: impl std::fmt::Display) -> StorageError<u64> {
    StorageError::IO {
        source: StorageIOError::write(&std::io::Error::other(e.to_string())),
    }
}

/// The log storage: the entries since the last snapshot kept in memory, every entry on disk.
pub struct LogStore {
    inner: Arc<parking_lot::Mutex<LogInner>>,
}

struct LogInner {
    dir: PathBuf,
    entries: BTreeMap<u64, Entry<ShardRaft>>,
    last_purged: Option<LogId<u64>>,
    vote: Option<Vote<u64>>,
    writer: Arc<GroupCommit>,
    /// The last committed entry written to the `committed` file, and when; kept only by a
    /// replica group's member (a group of one commits its whole log itself at start).
    committed: Option<LogId<u64>>,
    committed_saved_at: Option<std::time::Instant>,
    keep_committed: bool,
}

impl LogStore {
    /// Opens (or creates) the log in `dir`, reading back every entry; also returns the index
    /// of the first record on disk.
    pub fn open(
        dir: &Path,
        fsync: FsyncPolicy,
        segment_bytes: u64,
        keep_committed: bool,
    ) -> Result<(LogStore, u64), Box<dyn std::error::Error + Send + Sync>> {
        let log_dir = dir.join("log");
        let (files, recovered) = LogFiles::open(&log_dir, 0)?;
        let files = files.with_segment_bytes(segment_bytes);
        let first_on_disk = files.first_index();
        let mut entries = BTreeMap::new();
        for (index, bytes) in recovered.records {
            let entry: Entry<ShardRaft> = postcard::from_bytes(&bytes).map_err(|e| {
                format!(
                    "{}: log record {index} does not decode ({e}): written by another kvd version, or damaged; restore the data directory from a copy or move it away",
                    log_dir.display()
                )
            })?;
            if entry.log_id.index != index {
                return Err(format!(
                    "{}: log record {index} holds entry {}: the log is damaged",
                    log_dir.display(),
                    entry.log_id.index
                )
                .into());
            }
            entries.insert(index, entry);
        }
        let vote_path = dir.join("vote");
        let vote = match vote_path.exists() {
            true => Some(
                postcard::from_bytes(&snapshot::read(&vote_path)?.data)
                    .map_err(|e| format!("{}: does not decode: {e}", vote_path.display()))?,
            ),
            false => None,
        };
        // Where the log was known committed, at most a second before the stop: a restarted
        // member applies that much at once, without waiting to hear from a leader. A hint
        // only (a lower value is always safe): one that does not read is passed over.
        let committed_path = dir.join("committed");
        let committed = match keep_committed && committed_path.exists() {
            false => None,
            true => match snapshot::read(&committed_path)
                .map_err(|e| e.to_string())
                .and_then(|f| postcard::from_bytes::<LogId<u64>>(&f.data).map_err(|e| e.to_string()))
            {
                Ok(c) if entries.contains_key(&c.index) => Some(c),
                Ok(_) => None,
                Err(e) => {
                    tracing::warn!(file = %committed_path.display(), error = %e, "passed over the committed-index hint");
                    None
                }
            },
        };
        let writer = GroupCommit::start(files, fsync)
            .map_err(|e| format!("{}: cannot start the log writer thread: {e}", dir.display()))?;
        let store = LogStore {
            inner: Arc::new(parking_lot::Mutex::new(LogInner {
                dir: dir.to_path_buf(),
                entries,
                last_purged: None,
                vote,
                writer: Arc::new(writer),
                committed,
                committed_saved_at: None,
                keep_committed,
            })),
        };
        Ok((store, first_on_disk))
    }

    /// Forgets the entries up to `log_id` (a snapshot holds them).
    fn forget_through(&self, log_id: LogId<u64>) {
        let mut inner = self.inner.lock();
        inner.entries.retain(|&i, _| i > log_id.index);
        inner.last_purged = Some(log_id);
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

    async fn save_committed(&mut self, committed: Option<LogId<u64>>) -> StorageResult<()> {
        let path = {
            let mut inner = self.inner.lock();
            if !inner.keep_committed {
                return Ok(());
            }
            inner.committed = committed;
            if inner
                .committed_saved_at
                .is_some_and(|t| t.elapsed() < COMMITTED_SAVE_EVERY)
            {
                return Ok(());
            }
            inner.committed_saved_at = Some(std::time::Instant::now());
            inner.dir.join("committed")
        };
        if let Some(c) = committed {
            let data = postcard::to_allocvec(&c).map_err(io_error)?;
            snapshot::write(&path, &snapshot::Snapshot { meta: Vec::new(), data }).map_err(io_error)?;
        }
        Ok(())
    }

    async fn read_committed(&mut self) -> StorageResult<Option<LogId<u64>>> {
        Ok(self.inner.lock().committed)
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
        let Some(first) = first else {
            callback.log_io_completed(Ok(()));
            return Ok(());
        };
        let writer = inner.writer.clone();
        drop(inner);
        writer.append(first, payloads, move |result| {
            callback.log_io_completed(result.map_err(std::io::Error::other));
        });
        Ok(())
    }

    async fn truncate(&mut self, log_id: LogId<u64>) -> StorageResult<()> {
        // A replica's uncommitted entries that its new leader does not have: gone from
        // memory now, from disk in order with the next appends (see `LogFiles::truncate_from`).
        let mut inner = self.inner.lock();
        inner.entries.split_off(&log_id.index);
        inner.writer.truncate_from(log_id.index);
        Ok(())
    }

    async fn purge(&mut self, log_id: LogId<u64>) -> StorageResult<()> {
        // Memory only: the files go when a snapshot is pruned (see `SnapshotMaker`), so that
        // the log on disk reaches back to the older kept snapshot.
        self.forget_through(log_id);
        Ok(())
    }
}

/// Snapshot state shared by the state machine, its builders and stats.
#[derive(Default)]
struct Snapshots {
    /// The newest snapshot: what it stands for, its file, its size.
    current: Option<(SnapshotMeta<u64, BasicNode>, PathBuf, u64)>,
    /// When the newest snapshot was finished (or found at start).
    taken_at: Option<std::time::Instant>,
    /// Snapshots written by this process.
    taken: u64,
    /// How long the last one took to write, and its pairs.
    last_took: std::time::Duration,
    last_pairs: u64,
    /// A snapshot is being written.
    building: bool,
    /// The log writer's byte count when the last snapshot began.
    log_bytes_at_last: u64,
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
    dir: PathBuf,
    writer: Arc<GroupCommit>,
    snapshots: Arc<parking_lot::Mutex<Snapshots>>,
}

impl StateMachine {
    fn apply_batch(&mut self, index: u64, bytes: &[u8]) -> Vec<u8> {
        self.body.clear();
        self.body.extend_from_slice(bytes);
        let Ok(batch) = BatchView::parse(&self.body) else {
            // Validated before it was proposed; a log that does not decode is refused on
            // open. Nothing to run.
            return Vec::new();
        };
        let mut tally = Counts::default();
        self.scratch.log_index = index;
        self.store.execute(
            &batch,
            &mut self.response,
            &mut Unbounded,
            &mut self.scratch,
            &mut tally,
        );
        self.counters.add_counts(0, &tally);
        let mut body = AlignedVec::new();
        match encode_body(&self.response, &mut body) {
            Ok(()) => body.to_vec(),
            Err(_) => Vec::new(),
        }
    }

    /// Loads the snapshot in `path` (already read and checked) into the store.
    fn load(&mut self, path: &Path, snap: &snapshot::Snapshot) -> Result<u64, String> {
        let meta: SnapshotMeta<u64, BasicNode> = postcard::from_bytes(&snap.meta)
            .map_err(|e| format!("{}: its metadata does not decode: {e}", path.display()))?;
        let pairs = self
            .store
            .import(&snap.data)
            .map_err(|e| format!("{}: {e}", path.display()))?;
        self.last_applied = meta.last_log_id;
        self.membership = meta.last_membership.clone();
        let size = std::fs::metadata(path).map_or(0, |m| m.len());
        let mut snaps = self.snapshots.lock();
        snaps.current = Some((meta, path.to_path_buf(), size));
        snaps.taken_at = Some(std::time::Instant::now());
        snaps.last_pairs = pairs;
        Ok(pairs)
    }
}

/// Decodes a snapshot's metadata.
fn snapshot_meta(snap: &snapshot::Snapshot) -> Result<SnapshotMeta<u64, BasicNode>, String> {
    postcard::from_bytes(&snap.meta).map_err(|e| format!("its metadata does not decode: {e}"))
}

/// Writes a snapshot of the store as of `meta` (see the module docs: fuzzy, and safe).
pub struct SnapshotMaker {
    store: Arc<Store>,
    dir: PathBuf,
    meta: Option<SnapshotMeta<u64, BasicNode>>,
    writer: Arc<GroupCommit>,
    snapshots: Arc<parking_lot::Mutex<Snapshots>>,
}

impl SnapshotMaker {
    /// Writes the file (blocking: runs on a blocking thread), prunes old snapshots and the
    /// log before the oldest kept one. Returns the path and size.
    fn write(&self, meta: &SnapshotMeta<u64, BasicNode>) -> Result<(PathBuf, u64, u64), String> {
        let index = meta.last_log_id.map_or(0, |l| l.index);
        let path = catalog::path(&self.dir, index);
        let encoded = postcard::to_allocvec(meta).map_err(|e| e.to_string())?;
        let mut file = snapshot::SnapshotWriter::create(&path, &encoded).map_err(|e| e.to_string())?;
        let mut buf = Vec::new();
        self.store.export_header(&mut buf);
        file.write_data(&buf).map_err(|e| e.to_string())?;
        let mut pairs = 0;
        for shard in 0..self.store.map_shards() {
            buf.clear();
            pairs += self.store.export_shard(shard, &mut buf);
            file.write_data(&buf).map_err(|e| e.to_string())?;
        }
        let size = file.finish().map_err(|e| e.to_string())?;
        match catalog::prune(&self.dir) {
            Ok(Some(oldest_kept)) => self.writer.purge_through(oldest_kept),
            Ok(None) => {}
            Err(e) => tracing::warn!(dir = %self.dir.display(), error = %e, "could not delete old snapshots"),
        }
        Ok((path, size, pairs))
    }
}

impl RaftSnapshotBuilder<ShardRaft> for SnapshotMaker {
    async fn build_snapshot(&mut self) -> StorageResult<Snapshot<ShardRaft>> {
        let result = match self.meta.take() {
            None => Err("nothing applied yet: no snapshot to take".to_string()),
            Some(meta) => {
                let started = std::time::Instant::now();
                let maker = SnapshotMaker {
                    store: self.store.clone(),
                    dir: self.dir.clone(),
                    meta: None,
                    writer: self.writer.clone(),
                    snapshots: self.snapshots.clone(),
                };
                let m = meta.clone();
                match tokio::task::spawn_blocking(move || maker.write(&m)).await {
                    Ok(Ok((path, size, pairs))) => Ok((meta, path, size, pairs, started.elapsed())),
                    Ok(Err(e)) => Err(e),
                    Err(e) => Err(e.to_string()),
                }
            }
        };
        self.snapshots.lock().building = false;
        match result {
            Ok((meta, path, size, pairs, took)) => {
                tracing::info!(
                    file = %path.display(),
                    bytes = size,
                    pairs,
                    took_ms = took.as_millis() as u64,
                    "wrote a snapshot"
                );
                {
                    let mut snaps = self.snapshots.lock();
                    snaps.current = Some((meta.clone(), path.clone(), size));
                    snaps.taken_at = Some(std::time::Instant::now());
                    snaps.taken += 1;
                    snaps.last_took = took;
                    snaps.last_pairs = pairs;
                }
                let file = tokio::fs::File::open(&path).await.map_err(io_error)?;
                Ok(Snapshot {
                    meta,
                    snapshot: Box::new(file),
                })
            }
            Err(e) => {
                tracing::warn!(error = %e, "could not write a snapshot (the log keeps everything; the next one tries again)");
                Err(io_error(e))
            }
        }
    }
}

impl RaftStateMachine<ShardRaft> for StateMachine {
    type SnapshotBuilder = SnapshotMaker;

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
                EntryPayload::Normal(WriteBatch(batches)) => Applied(
                    batches
                        .iter()
                        .map(|b| self.apply_batch(entry.log_id.index, b))
                        .collect(),
                ),
                EntryPayload::Membership(m) => {
                    self.membership = StoredMembership::new(Some(entry.log_id), m);
                    Applied::default()
                }
            });
        }
        Ok(out)
    }

    async fn get_snapshot_builder(&mut self) -> Self::SnapshotBuilder {
        let meta = self.last_applied.map(|last| SnapshotMeta {
            last_log_id: Some(last),
            last_membership: self.membership.clone(),
            snapshot_id: format!("{}-{}", last.leader_id.term, last.index),
        });
        let mut snaps = self.snapshots.lock();
        snaps.building = true;
        snaps.log_bytes_at_last = self.writer.figures().bytes;
        SnapshotMaker {
            store: self.store.clone(),
            dir: self.dir.clone(),
            meta,
            writer: self.writer.clone(),
            snapshots: self.snapshots.clone(),
        }
    }

    async fn begin_receiving_snapshot(&mut self) -> StorageResult<Box<tokio::fs::File>> {
        let path = self.dir.join("snap-receiving.tmp");
        let file = tokio::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(&path)
            .await
            .map_err(io_error)?;
        Ok(Box::new(file))
    }

    async fn install_snapshot(
        &mut self,
        meta: &SnapshotMeta<u64, BasicNode>,
        snapshot: Box<tokio::fs::File>,
    ) -> StorageResult<()> {
        // The leader sends its snapshot file as it is: check it like one read from disk.
        snapshot.sync_all().await.map_err(io_error)?;
        drop(snapshot);
        let index = meta.last_log_id.map_or(0, |l| l.index);
        let path = catalog::path(&self.dir, index);
        std::fs::rename(self.dir.join("snap-receiving.tmp"), &path).map_err(io_error)?;
        super::sync_dir(&self.dir).map_err(io_error)?;
        let snap = snapshot::read(&path).map_err(io_error)?;
        self.load(&path, &snap).map_err(io_error)?;
        if let Ok(Some(oldest_kept)) = catalog::prune(&self.dir) {
            self.writer.purge_through(oldest_kept);
        }
        Ok(())
    }

    async fn get_current_snapshot(&mut self) -> StorageResult<Option<Snapshot<ShardRaft>>> {
        let current = self.snapshots.lock().current.clone();
        match current {
            None => Ok(None),
            Some((meta, path, _)) => Ok(Some(Snapshot {
                meta,
                snapshot: Box::new(tokio::fs::File::open(&path).await.map_err(io_error)?),
            })),
        }
    }
}

/// A shard's raft group over `dir`, applying to `store`: of one voter, or of the members
/// of `--group` (replica groups).
pub struct DurableShard {
    raft: openraft::Raft<ShardRaft>,
    proposals: tokio::sync::mpsc::UnboundedSender<Proposal>,
    writer: Arc<GroupCommit>,
    snapshots: Arc<parking_lot::Mutex<Snapshots>>,
    fsync: FsyncPolicy,
    /// This member's id, and whether there are other members.
    me: u64,
    grouped: bool,
    /// Leadership checks for reads, shared by all the reads waiting at one moment; each
    /// answers the read index (the leader's commit index when the round began).
    confirms: tokio::sync::mpsc::UnboundedSender<ReadIndexWaiter>,
    /// On a follower or learner: reads waiting to run once this member has applied the
    /// leader's read index (follower reads).
    member_reads: tokio::sync::mpsc::UnboundedSender<ReadIndexWaiter>,
    /// Terms this process has seen begin (each is an election).
    elections: Arc<std::sync::atomic::AtomicU64>,
    /// How this member reaches the others (for a hand-over's `Campaign`).
    client: kvshared::client::ClientConfig,
    /// This leader is handing over (`transfer-leader`): it serves nothing meanwhile.
    handing_over: Arc<std::sync::atomic::AtomicBool>,
    /// The commit index the leader last sent this member (openraft 0.9's metrics have none).
    leader_commit: std::sync::atomic::AtomicU64,
    /// The membership changes this member carried out as leader (see `GroupFigures::changes`).
    changes: parking_lot::Mutex<std::collections::VecDeque<kvshared::stats::GroupChange>>,
    /// When (ms since `epoch`) this member last heard from a leader (an append or a
    /// heartbeat), for bounded-staleness reads; 0 before the first.
    heard_from_leader_ms: std::sync::atomic::AtomicU64,
    /// While receiving a snapshot: until when (ms since `epoch`) not to campaign; 0 otherwise.
    snapshot_quiet: Arc<std::sync::atomic::AtomicU64>,
    epoch: std::time::Instant,
}

/// Why the log did not answer a batch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LogError {
    /// This member does not lead its group (the leader's address, when known): nothing of
    /// the batch ran; the client should ask the leader.
    NotLeader(Option<String>),
    /// The log failed; the batch may have been logged (its outcome is unknown).
    Failed(String),
}

impl std::fmt::Display for LogError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            LogError::NotLeader(Some(l)) => write!(f, "not the leader of the group ({l} is)"),
            LogError::NotLeader(None) => write!(f, "not the leader of the group (none known)"),
            LogError::Failed(why) => f.write_str(why),
        }
    }
}

/// The leader's address from openraft's forward-to-leader hint.
fn leader_hint(f: &openraft::error::ForwardToLeader<u64, BasicNode>) -> LogError {
    LogError::NotLeader(f.leader_node.as_ref().map(|n| n.addr.clone()))
}

/// A batch waiting for the proposer, and where its answer goes.
type Proposal = (Vec<u8>, tokio::sync::oneshot::Sender<LogAnswer>);

/// What the log answers a submitted batch: its encoded response body, or why it failed (the
/// outcome is then unknown: the batch may have been logged).
pub type LogAnswer = Result<Vec<u8>, LogError>;

/// Group commit above the log: takes every batch queued while earlier entries were being
/// committed, proposes them as one entry (up to [`PROPOSALS_IN_FLIGHT`] entries at once), and
/// hands each batch its own answer.
/// While `quiet` (a leader handing over), batches are answered "not the leader" unproposed.
async fn propose(
    raft: openraft::Raft<ShardRaft>,
    mut queue: tokio::sync::mpsc::UnboundedReceiver<Proposal>,
    quiet: Arc<std::sync::atomic::AtomicBool>,
) {
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
        if quiet.load(std::sync::atomic::Ordering::Relaxed) {
            // Nothing of these ran; the client asks again, of the next leader.
            for (_, answer) in waiting {
                let _ = answer.send(Err(LogError::NotLeader(None)));
            }
            continue;
        }
        let (bodies, answers): (Vec<_>, Vec<_>) = waiting.into_iter().unzip();
        let raft = raft.clone();
        tokio::spawn(async move {
            // Bounded: openraft 0.9 may never answer an entry a change of leader has taken
            // away, and this slot would then hold every later write of the shard.
            let result = tokio::time::timeout(PROPOSE_LIMIT, raft.client_write(WriteBatch(bodies))).await;
            drop(slot);
            let result = match result {
                Ok(r) => r,
                Err(_) => {
                    let why = LogError::Failed(format!(
                        "no commit within {PROPOSE_LIMIT:?} (a change of leader?): the outcome is unknown"
                    ));
                    for answer in answers {
                        let _ = answer.send(Err(why.clone()));
                    }
                    return;
                }
            };
            match result {
                Ok(written) => {
                    for (answer, reply) in answers.into_iter().zip(written.data.0) {
                        let _ = answer.send(Ok(reply));
                    }
                }
                Err(e) => {
                    let why = match e.forward_to_leader() {
                        Some(f) => leader_hint(f),
                        None => LogError::Failed(e.to_string()),
                    };
                    for answer in answers {
                        let _ = answer.send(Err(why.clone()));
                    }
                }
            }
        });
    }
}

/// Starts a snapshot when the log has grown past `--snapshot-every` (and, in bytes, past the
/// last snapshot's size) since the last one.
async fn watch_log(
    raft: openraft::Raft<ShardRaft>,
    writer: Arc<GroupCommit>,
    snapshots: Arc<parking_lot::Mutex<Snapshots>>,
    every: SnapshotEvery,
) {
    let mut tick = tokio::time::interval(std::time::Duration::from_millis(200));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let (building, bytes_at_last, snapshot_index, snapshot_bytes) = {
            let s = snapshots.lock();
            let (index, size) = s
                .current
                .as_ref()
                .map_or((0, 0), |(m, _, size)| (m.last_log_id.map_or(0, |l| l.index), *size));
            (s.building, s.log_bytes_at_last, index, size)
        };
        if building {
            continue;
        }
        let due = match every {
            // At least the last snapshot's size too, so that writing snapshots never costs
            // more disk than the log itself (as Redis's auto-aof-rewrite-percentage 100).
            SnapshotEvery::Bytes(limit) => {
                writer.figures().bytes.saturating_sub(bytes_at_last) >= limit.max(snapshot_bytes)
            }
            SnapshotEvery::Entries(limit) => {
                let applied = raft.metrics().borrow().last_applied.map_or(0, |l| l.index);
                applied.saturating_sub(snapshot_index) >= limit
            }
        };
        if due && raft.trigger().snapshot().await.is_err() {
            return;
        }
    }
}

/// Where a read-index round's outcome goes: the read index, or why there is none.
pub type ReadIndexWaiter = tokio::sync::oneshot::Sender<Result<u64, LogError>>;

/// Confirms leadership for the reads that asked: one read-index round (a heartbeat to a
/// majority) for every request queued when it starts; requests that arrive during a round
/// wait for the next, which begins after their reads ran. Each is answered the read index
/// (what a follower must have applied before it may serve a read begun before the round).
async fn confirm(raft: openraft::Raft<ShardRaft>, mut queue: tokio::sync::mpsc::UnboundedReceiver<ReadIndexWaiter>) {
    while let Some(first) = queue.recv().await {
        let mut waiting = vec![first];
        while let Ok(more) = queue.try_recv() {
            waiting.push(more);
        }
        // Bounded: a round can wait for an entry to be applied that a change of leader has
        // taken away, and every later read of this member would queue behind it. Reads
        // change nothing, so a round that runs out answers "not the leader": asked again.
        let outcome = match tokio::time::timeout(CONFIRM_LIMIT, raft.ensure_linearizable()).await {
            Ok(Ok(read)) => Ok(read.map_or(0, |l| l.index)),
            Ok(Err(e)) => Err(match e.forward_to_leader() {
                Some(f) => leader_hint(f),
                None => LogError::NotLeader(None),
            }),
            Err(_) => Err(LogError::NotLeader(None)),
        };
        for w in waiting {
            let _ = w.send(outcome.clone());
        }
    }
}

/// Follower reads: a follower or learner asks its leader for a read index, one request for
/// every read queued when it starts (requests arriving meanwhile wait for the next), and
/// answers each read once this member has applied that far. The reads then run here and
/// see every write acknowledged before they arrived: the leader's read index is at least
/// the commit index when its round began, which was after the reads arrived here (Raft's
/// read index, served by a follower, section 6.4 of Ongaro's thesis). A round that fails
/// (no leader known, the leader unreachable, deposed or slow to answer, this member more
/// than `MEMBER_READ_MAX_BEHIND` entries behind or slow to apply) answers "not the leader",
/// naming the leader: the client asks another member, or the leader.
async fn follow_reads(
    me: u64,
    raft: openraft::Raft<ShardRaft>,
    mut queue: tokio::sync::mpsc::UnboundedReceiver<ReadIndexWaiter>,
    client: kvshared::client::ClientConfig,
) {
    let mut leader: Option<(String, Arc<kvshared::client::Cluster>)> = None;
    while let Some(first) = queue.recv().await {
        let mut waiting = vec![first];
        while let Ok(more) = queue.try_recv() {
            waiting.push(more);
        }
        let addr = {
            let m = raft.metrics();
            let m = m.borrow();
            m.current_leader
                .and_then(|id| m.membership_config.membership().get_node(&id).map(|n| n.addr.clone()))
        };
        let Some(addr) = addr else {
            for w in waiting {
                let _ = w.send(Err(LogError::NotLeader(None)));
            }
            continue;
        };
        let cluster = match &leader {
            Some((a, c)) if *a == addr => Some(c.clone()),
            _ => kvshared::client::Cluster::new(std::slice::from_ref(&addr), client.clone())
                .ok()
                .map(Arc::new),
        };
        let Some(cluster) = cluster else {
            for w in waiting {
                let _ = w.send(Err(LogError::NotLeader(Some(addr.clone()))));
            }
            continue;
        };
        leader = Some((addr.clone(), cluster.clone()));
        let asked = tokio::time::timeout(
            MEMBER_READ_ASK_LIMIT,
            super::network::admin_call(&cluster, super::network::AdminRequest::ReadIndex { member: me }),
        )
        .await;
        let index = match asked {
            Ok(Ok(super::network::AdminReply::ReadIndex(index))) => index,
            Ok(Ok(super::network::AdminReply::NotLeader(named))) => {
                let named = named.or(Some(addr));
                for w in waiting {
                    let _ = w.send(Err(LogError::NotLeader(named.clone())));
                }
                continue;
            }
            _ => {
                for w in waiting {
                    let _ = w.send(Err(LogError::NotLeader(Some(addr.clone()))));
                }
                continue;
            }
        };
        // A member far behind (a learner catching up) would keep the reads waiting: the
        // client is better served by another member at once.
        let applied = raft.metrics().borrow().last_applied.map_or(0, |l| l.index);
        if applied.saturating_add(MEMBER_READ_MAX_BEHIND) < index {
            for w in waiting {
                let _ = w.send(Err(LogError::NotLeader(Some(addr.clone()))));
            }
            continue;
        }
        // Waiting to apply is this member's own business: the next round may begin.
        let raft = raft.clone();
        tokio::spawn(async move {
            let applied = raft
                .wait(Some(MEMBER_READ_APPLY_LIMIT))
                .applied_index_at_least(Some(index), "apply the read index")
                .await;
            let outcome = match applied {
                Ok(_) => Ok(index),
                Err(_) => Err(LogError::NotLeader(Some(addr))),
            };
            for w in waiting {
                let _ = w.send(outcome.clone());
            }
        });
    }
}

/// Counts the terms that begin while this process runs (one per election it sees).
async fn count_elections(raft: openraft::Raft<ShardRaft>, elections: Arc<std::sync::atomic::AtomicU64>) {
    let mut metrics = raft.metrics();
    let mut term = metrics.borrow().current_term;
    while metrics.changed().await.is_ok() {
        let now = metrics.borrow().current_term;
        if now > term {
            elections.fetch_add(now - term, std::sync::atomic::Ordering::Relaxed);
            term = now;
        }
    }
}

fn sorted(addrs: impl Iterator<Item = String>) -> Vec<String> {
    let mut v: Vec<String> = addrs.collect();
    v.sort();
    v
}

/// Longest a proposed entry may take to commit before its batches are answered "outcome
/// unknown" (their connections close).
const PROPOSE_LIMIT: std::time::Duration = std::time::Duration::from_secs(3);

/// Queues a read for a read-index round on `queue`.
fn queue_for_read_index(
    queue: &tokio::sync::mpsc::UnboundedSender<ReadIndexWaiter>,
) -> tokio::sync::oneshot::Receiver<Result<u64, LogError>> {
    let (tx, rx) = tokio::sync::oneshot::channel();
    if let Err(tokio::sync::mpsc::error::SendError(tx)) = queue.send(tx) {
        let _ = tx.send(Err(LogError::NotLeader(None)));
    }
    rx
}

/// Follower reads: how long a member waits for its leader's read index, how far behind it
/// may be and still wait to apply it (log entries), and how long it waits to apply it. All
/// well under the clients' stall detection (1 s of silence on a connection), so that a
/// slow member is refused and passed by, not taken for a dead one.
const MEMBER_READ_ASK_LIMIT: std::time::Duration = std::time::Duration::from_millis(500);
const MEMBER_READ_MAX_BEHIND: u64 = 64;
const MEMBER_READ_APPLY_LIMIT: std::time::Duration = std::time::Duration::from_millis(300);

/// Longest a read-index round may take.
const CONFIRM_LIMIT: std::time::Duration = std::time::Duration::from_secs(1);

/// How often the committed index is written down (a hint for restarts).
const COMMITTED_SAVE_EVERY: std::time::Duration = std::time::Duration::from_secs(1);

/// How long after a snapshot chunk a follower holds its campaign back.
const SNAPSHOT_QUIET_MS: u64 = 1000;

/// Entries per append RPC (openraft's default is 300: hundreds of megabytes here).
const MAX_ENTRIES_PER_APPEND: u64 = 4;

/// This node's id in a group of one.
const ME: u64 = 1;

/// Raft timing of replica groups. The heartbeat is also openraft 0.9's timeout for an
/// append round trip (a follower's fsync included), so it stays well above the 0.3-4 ms an
/// fsync takes here; an election starts 0.4-0.8 s after the last heartbeat, so a leader's
/// death costs its keys about a second (the aim) while a busy or slow heartbeat does
/// not start needless elections.
const GROUP_HEARTBEAT_MS: u64 = 100;
const GROUP_ELECTION_MS: (u64, u64) = (400, 800);

/// What a restart found and did, for the log line.
#[derive(Debug, Default)]
pub struct Recovery {
    /// The snapshot started from, and its pairs.
    pub snapshot: Option<(PathBuf, u64)>,
    /// Log entries replayed after it.
    pub entries_replayed: u64,
}

impl DurableShard {
    /// Opens the shard in `dir` (creating and initialising the group on first start): loads
    /// the newest usable snapshot into `store`, replays the log after it, and, for a group of
    /// one, returns once the node leads it and has applied every committed entry. A member of
    /// a replica group returns at once: it serves (or names the leader) while a leader
    /// commits what it replays.
    pub async fn open(
        dir: &Path,
        store: Arc<Store>,
        counters: Arc<Counters>,
        config: DurableConfig,
    ) -> Result<(DurableShard, Recovery), Box<dyn std::error::Error + Send + Sync>> {
        let DurableConfig {
            fsync,
            snapshot_every: every,
            segment_bytes,
            group,
        } = config;
        let (log, first_on_disk) = LogStore::open(dir, fsync, segment_bytes, group.is_some())?;
        let (writer, last_log_index, fresh, committed_at_start) = {
            let inner = log.inner.lock();
            let last = inner.entries.last_key_value().map(|(i, _)| *i);
            (
                inner.writer.clone(),
                last,
                inner.vote.is_none() && last.is_none(),
                inner.committed.map(|c| c.index),
            )
        };
        let snapshots = Arc::new(parking_lot::Mutex::new(Snapshots::default()));
        let mut sm = StateMachine {
            store: store.clone(),
            counters,
            last_applied: None,
            membership: StoredMembership::default(),
            scratch: Scratch::default(),
            response: BatchResponse::default(),
            body: AlignedVec::new(),
            dir: dir.to_path_buf(),
            writer: writer.clone(),
            snapshots: snapshots.clone(),
        };
        let log_is_whole = last_log_index.is_none() || first_on_disk == 0;
        let (chosen, passed_over) = catalog::newest_usable(dir, |snap| {
            let index = snapshot_meta(snap)?.last_log_id.map_or(0, |l| l.index);
            match last_log_index {
                Some(_) if first_on_disk > index + 1 => Err(format!(
                    "the log after it is missing (the log on disk starts at entry {first_on_disk})"
                )),
                _ => Ok(()),
            }
        })
        .map_err(|e| format!("{}: cannot list snapshots: {e}", dir.display()))?;
        for why in &passed_over {
            tracing::warn!(%why, "passed over a snapshot; recovering from an older one, or the whole log, instead");
        }
        let mut recovery = Recovery::default();
        let mut base = 0;
        match chosen {
            Some((path, snap)) => {
                let pairs = sm.load(&path, &snap)?;
                drop(snap);
                if let Some(last) = sm.last_applied {
                    log.forget_through(last);
                    base = last.index;
                }
                recovery.snapshot = Some((path, pairs));
            }
            None if !log_is_whole => {
                let why = match passed_over.is_empty() {
                    true => "no snapshot holds the entries before it".to_string(),
                    false => format!(
                        "no snapshot holding the entries before it can be used ({})",
                        passed_over.join("; ")
                    ),
                };
                return Err(format!(
                    "{}: the log starts at entry {first_on_disk} and {why}. kvd will not start from less than it acknowledged: restore the data directory from a copy, or move it away to start the shard empty",
                    dir.display()
                )
                .into());
            }
            None => {}
        }
        // Replay restores every acknowledged write, whatever --max-memory says now.
        let cap = store.memory_limit();
        store.set_max_memory(None);
        let grouped = group.is_some();
        if let Some(g) = &group {
            // A member that led when it stopped would take up its leadership again at once
            // (openraft 0.9 restores a committed vote of its own as leadership), before its
            // store has replayed anything, and, as seen here, without rebuilding its
            // replication, so the group stalled. It comes back as having voted for itself in
            // that term, and the group elects a leader in a new one.
            let mut inner = log.inner.lock();
            if let Some(v) = inner.vote.filter(|v| v.committed && v.leader_id.node_id == g.me) {
                inner.vote = Some(Vote::new(v.leader_id.term, g.me));
            }
        }
        let (me, initial, client) = match group {
            Some(g) => (g.me, g.initial, g.client),
            None => (ME, BTreeMap::from([(ME, BasicNode::default())]), Default::default()),
        };
        let (heartbeat, election) = match grouped {
            true => (GROUP_HEARTBEAT_MS, GROUP_ELECTION_MS),
            false => (250, (300, 600)),
        };
        let config = openraft::Config {
            heartbeat_interval: heartbeat,
            election_timeout_min: election.0,
            election_timeout_max: election.1,
            snapshot_policy: openraft::SnapshotPolicy::Never,
            // An entry can hold a thousand batches (megabytes), and an append must arrive
            // within a heartbeat: a follower catching up gets a few entries per round trip.
            max_payload_entries: MAX_ENTRIES_PER_APPEND,
            max_in_snapshot_log_to_keep: 0,
            ..Default::default()
        };
        let network = super::network::Network::new(client.clone());
        let raft = openraft::Raft::new(me, Arc::new(config.validate()?), network, log, sm).await?;
        if fresh && !initial.is_empty() {
            // Every member of a new group initialises it with the same membership, which
            // openraft allows; a member that restarts has a vote or a log and rejoins; one
            // started with --join waits for the leader to add it.
            raft.initialize(initial).await?;
        }
        let (proposals, queue) = tokio::sync::mpsc::unbounded_channel();
        let handing_over = Arc::new(std::sync::atomic::AtomicBool::new(false));
        tokio::spawn(propose(raft.clone(), queue, handing_over.clone()));
        let (confirms, confirm_queue) = tokio::sync::mpsc::unbounded_channel();
        tokio::spawn(confirm(raft.clone(), confirm_queue));
        let (member_reads, member_read_queue) = tokio::sync::mpsc::unbounded_channel();
        if grouped {
            tokio::spawn(follow_reads(me, raft.clone(), member_read_queue, client.clone()));
        }
        let elections = Arc::new(std::sync::atomic::AtomicU64::new(0));
        tokio::spawn(count_elections(raft.clone(), elections.clone()));
        let shard = DurableShard {
            raft,
            proposals,
            writer,
            snapshots,
            fsync,
            me,
            grouped,
            confirms,
            member_reads,
            elections,
            client,
            handing_over,
            leader_commit: std::sync::atomic::AtomicU64::new(0),
            heard_from_leader_ms: std::sync::atomic::AtomicU64::new(0),
            changes: Default::default(),
            snapshot_quiet: Arc::default(),
            epoch: std::time::Instant::now(),
        };
        // What the log on disk holds (the metrics may not show it yet this early).
        let last = last_log_index;
        if grouped {
            // A member serves (or says who leads) at once; what it replays commits when a
            // leader is there, so the replay filter and the memory cap come back then.
            let raft = shard.raft.clone();
            let store = store.clone();
            if let Some(committed) = committed_at_start {
                // It applies what it knows committed before it may campaign: a member that
                // wins an election serves only once its store has caught up, and a restarted
                // one, whose log is often the longest, would otherwise win and keep the shard
                // waiting through its whole replay.
                raft.runtime_config().elect(false);
                let raft = raft.clone();
                tokio::spawn(async move {
                    let _ = raft
                        .wait(Some(std::time::Duration::from_secs(60)))
                        .applied_index_at_least(Some(committed), "apply the log known committed")
                        .await;
                    raft.runtime_config().elect(true);
                });
            }
            tokio::spawn(async move {
                if raft
                    .wait(Some(std::time::Duration::from_secs(24 * 3600)))
                    .applied_index_at_least(last, "apply the recovered log")
                    .await
                    .is_ok()
                {
                    store.set_max_memory(cap.map(|l| l.max_bytes));
                    store.end_replay();
                }
            });
        } else {
            shard
                .raft
                .wait(Some(std::time::Duration::from_secs(10)))
                .state(openraft::ServerState::Leader, "lead the group of one")
                .await?;
            shard
                .raft
                .wait(Some(std::time::Duration::from_secs(300)))
                .applied_index_at_least(last, "apply the recovered log")
                .await?;
            store.set_max_memory(cap.map(|l| l.max_bytes));
            store.end_replay();
        }
        recovery.entries_replayed = shard.applied_index().saturating_sub(base);
        tokio::spawn(watch_log(
            shard.raft.clone(),
            shard.writer.clone(),
            shard.snapshots.clone(),
            every,
        ));
        Ok((shard, recovery))
    }

    /// Queues the body of a batch (of writes and the reads that follow them) for the log;
    /// the answer comes once its entry is committed (durably, as `--fsync` says, together
    /// with the batches that arrive meanwhile) and applied: the encoded response body.
    pub fn submit(&self, batch_body: Vec<u8>) -> tokio::sync::oneshot::Receiver<LogAnswer> {
        let (tx, rx) = tokio::sync::oneshot::channel();
        if let Err(tokio::sync::mpsc::error::SendError((_, tx))) = self.proposals.send((batch_body, tx)) {
            let _ = tx.send(Err(LogError::Failed("the shard's log has stopped".into())));
        }
        rx
    }

    /// Whether this member may serve now: `Ok` when it leads its group (as far as it knows;
    /// reads confirm it with [`DurableShard::confirm_leadership`]), else who does.
    pub fn leadership(&self) -> Result<(), LogError> {
        if !self.grouped {
            return Ok(());
        }
        if self.handing_over.load(std::sync::atomic::Ordering::Relaxed) {
            return Err(LogError::NotLeader(None));
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
            return Err(LogError::NotLeader(None));
        }
        // (A member that restarted may still hold its own old leadership in its vote: it
        // names nobody rather than itself.)
        let leader = m
            .current_leader
            .filter(|id| *id != self.me)
            .and_then(|id| m.membership_config.membership().get_node(&id).map(|n| n.addr.clone()));
        Err(LogError::NotLeader(leader))
    }

    /// For reads not yet run on this leader: answers the read index once a majority has
    /// confirmed, after they arrived, that this member still leads, and this member has
    /// applied everything committed when that round began (openraft's
    /// `ensure_linearizable`); the reads may run then. `None` for a group of one.
    pub fn confirm_leadership(&self) -> Option<tokio::sync::oneshot::Receiver<Result<u64, LogError>>> {
        if !self.grouped {
            return None;
        }
        Some(queue_for_read_index(&self.confirms))
    }

    /// On a follower or learner, for reads not yet run: answers `Ok` once this member has
    /// applied the leader's read index (see `follow_reads`); the reads may run then. `None`
    /// outside a replica group.
    pub fn member_read(&self) -> Option<tokio::sync::oneshot::Receiver<Result<u64, LogError>>> {
        if !self.is_member() {
            return None;
        }
        Some(queue_for_read_index(&self.member_reads))
    }

    /// Whether this shard's log has other members than this one (a replica group).
    pub fn is_grouped(&self) -> bool {
        self.grouped
    }

    /// Whether this node is a member (voter or learner) of its group as its log says now: a
    /// removed learner (the shard manager's) or one not yet added serves no reads.
    fn is_member(&self) -> bool {
        self.grouped
            && self
                .raft
                .metrics()
                .borrow()
                .membership_config
                .membership()
                .get_node(&self.me)
                .is_some()
    }

    /// Whether this member's store is at most `bound` behind its leader: it heard from the
    /// leader within `bound`, and has applied everything committed as of that message.
    /// (Bounded-staleness reads, `--reads stale`: the store then holds every write
    /// acknowledged before the leader sent that message, which left it less than `bound` ago
    /// by this member's clock; network delay comes on top.)
    pub fn fresh_within(&self, bound: std::time::Duration) -> bool {
        if !self.is_member() {
            return false;
        }
        let heard = self.heard_from_leader_ms.load(std::sync::atomic::Ordering::Relaxed);
        let now = self.epoch.elapsed().as_millis() as u64;
        heard != 0
            && now.saturating_sub(heard) <= bound.as_millis() as u64
            && self.applied_index() >= self.leader_commit.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Answers a raft RPC from another member, or an operator's admin request (a
    /// `RaftRequest` frame's body).
    pub async fn serve_rpc(&self, body: &[u8]) -> Vec<u8> {
        super::network::serve(self, body).await
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
        let until = self.epoch.elapsed().as_millis() as u64 + SNAPSHOT_QUIET_MS;
        if self.snapshot_quiet.swap(until, std::sync::atomic::Ordering::Relaxed) == 0 {
            self.raft.runtime_config().elect(false);
            let (raft, quiet, epoch) = (self.raft.clone(), self.snapshot_quiet.clone(), self.epoch);
            tokio::spawn(async move {
                loop {
                    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                    let until = quiet.load(std::sync::atomic::Ordering::Relaxed);
                    if epoch.elapsed().as_millis() as u64 >= until
                        && quiet
                            .compare_exchange(
                                until,
                                0,
                                std::sync::atomic::Ordering::Relaxed,
                                std::sync::atomic::Ordering::Relaxed,
                            )
                            .is_ok()
                    {
                        raft.runtime_config().elect(true);
                        return;
                    }
                }
            });
        }
    }

    /// Notes the commit index a leader's append carried (this member's commit index).
    pub(super) fn note_leader_commit(&self, index: Option<u64>) {
        let now = (self.epoch.elapsed().as_millis() as u64).max(1);
        self.heard_from_leader_ms
            .store(now, std::sync::atomic::Ordering::Relaxed);
        if let Some(i) = index {
            self.leader_commit.fetch_max(i, std::sync::atomic::Ordering::Relaxed);
        }
    }

    /// This member's place in its group, as its raft metrics say.
    pub fn group_figures(&self) -> kvshared::stats::GroupFigures {
        let m = self.raft.metrics().borrow().clone();
        let membership = m.membership_config.membership();
        let role = match m.state {
            openraft::ServerState::Leader => "leader",
            // Started with --join and not added yet, or removed from the group.
            _ if membership.nodes().next().is_none() => "joining",
            _ if membership.get_node(&self.me).is_none() => "removed",
            openraft::ServerState::Learner => "learner",
            _ => "follower",
        };
        let addr = |id: u64| membership.get_node(&id).map(|n| n.addr.clone()).unwrap_or_default();
        let last = m.last_log_index.unwrap_or(0);
        let commit_index = match &m.replication {
            // The leader: the highest index a majority of voters holds.
            Some(matched) if m.state == openraft::ServerState::Leader => {
                let mut held: Vec<u64> = membership
                    .voter_ids()
                    .map(|id| match id == self.me {
                        true => last,
                        false => matched.get(&id).copied().flatten().map_or(0, |l| l.index),
                    })
                    .collect();
                held.sort_unstable_by(|a, b| b.cmp(a));
                held.get(held.len() / 2).copied().unwrap_or(0)
            }
            _ => self.leader_commit.load(std::sync::atomic::Ordering::Relaxed),
        };
        let applied_index = m.last_applied.map_or(0, |l| l.index);
        kvshared::stats::GroupFigures {
            role: role.to_string(),
            term: m.current_term,
            leader: m.current_leader.map(addr).unwrap_or_default(),
            log_index: last,
            commit_index: commit_index.max(applied_index),
            applied_index,
            elections: self.elections.load(std::sync::atomic::Ordering::Relaxed),
            lag: m
                .replication
                .iter()
                .flatten()
                .filter(|(id, _)| **id != self.me)
                .map(|(id, matched)| kvshared::stats::FollowerLag {
                    addr: addr(*id),
                    behind: last.saturating_sub(matched.map_or(0, |l| l.index)),
                })
                .collect(),
            members: sorted(membership.voter_ids().map(addr)),
            learners: sorted(membership.learner_ids().map(addr)),
            changes: match m.state {
                openraft::ServerState::Leader => self.changes.lock().iter().cloned().collect(),
                _ => Vec::new(),
            },
        }
    }

    /// The index of the last applied entry.
    pub fn applied_index(&self) -> u64 {
        self.raft.metrics().borrow().last_applied.map_or(0, |l| l.index)
    }

    /// Takes a snapshot now and waits until it is written, or until it is clear the newest
    /// snapshot already holds everything applied (tests and operators).
    pub async fn snapshot_now(&self) -> Result<(), String> {
        let before = self.snapshots.lock().taken;
        self.raft.trigger().snapshot().await.map_err(|e| e.to_string())?;
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
                self.raft.trigger().snapshot().await.map_err(|e| e.to_string())?;
            }
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
        Err("the snapshot did not finish within 60 s".into())
    }

    /// The log's and snapshots' figures, for stats.
    pub fn figures(&self) -> Durability {
        let w = self.writer.figures();
        let applied = self.applied_index();
        let s = self.snapshots.lock();
        let (snapshot_index, snapshot_bytes) = s
            .current
            .as_ref()
            .map_or((0, 0), |(m, _, size)| (m.last_log_id.map_or(0, |l| l.index), *size));
        Durability {
            mode: match self.fsync {
                FsyncPolicy::Always => "always",
                FsyncPolicy::EverySecond => "1s",
                FsyncPolicy::Never => "never",
            }
            .into(),
            log_bytes: w.disk_bytes,
            log_entries: applied.saturating_sub(snapshot_index),
            last_applied: applied,
            snapshot_index,
            snapshot_bytes,
            snapshot_age_ms: s.taken_at.map_or(0, |t| t.elapsed().as_millis() as u64),
            snapshots_taken: s.taken,
            last_snapshot_ms: s.last_took.as_millis() as u64,
            fsyncs: w.fsyncs,
            log_records_written: w.records,
            fsync_p50_us: w.fsync_us.value_at_quantile(0.5),
            fsync_p99_us: w.fsync_us.value_at_quantile(0.99),
        }
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
    use kvshared::wire::{BatchRequest, OpKind, OpReply, ReplyView};

    fn body(req: &BatchRequest) -> Vec<u8> {
        let mut body = AlignedVec::new();
        encode_body(req, &mut body).unwrap();
        body.to_vec()
    }

    fn aligned(bytes: &[u8]) -> AlignedVec {
        let mut v = AlignedVec::new();
        v.extend_from_slice(bytes);
        v
    }

    fn config(segment_bytes: u64) -> DurableConfig {
        DurableConfig {
            fsync: FsyncPolicy::Always,
            snapshot_every: SnapshotEvery::Bytes(1 << 40),
            segment_bytes,
            group: None,
        }
    }

    fn scratch_dir(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("kvd-raft-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        dir
    }

    async fn open(dir: &Path, segment_bytes: u64) -> Result<(DurableShard, Recovery, Arc<Store>), String> {
        let store = Arc::new(Store::new(ShardId::SOLO, 8, 0).unwrap());
        let (shard, recovery) = DurableShard::open(dir, store.clone(), Arc::default(), config(segment_bytes))
            .await
            .map_err(|e| e.to_string())?;
        Ok((shard, recovery, store))
    }

    async fn put(shard: &DurableShard, key: &str, value: &str) {
        let mut req = BatchRequest::new();
        req.push_put(key.as_bytes(), value.as_bytes());
        let reply = aligned(&shard.submit(body(&req)).await.unwrap().unwrap());
        assert_eq!(ReplyView::parse(&reply).unwrap().result(0), OpReply::Stored);
    }

    fn value(store: &Store, key: &str) -> Option<String> {
        let mut req = BatchRequest::new();
        req.push_get(key.as_bytes());
        let frame = aligned(&body(&req));
        let batch = BatchView::parse(&frame).unwrap();
        let mut out = BatchResponse::default();
        store.execute(
            &batch,
            &mut out,
            &mut Unbounded,
            &mut Scratch::default(),
            &mut Counts::default(),
        );
        let mut reply = AlignedVec::new();
        encode_body(&out, &mut reply).unwrap();
        match ReplyView::parse(&reply).unwrap().result(0) {
            OpReply::Found(v) => Some(String::from_utf8(v.to_vec()).unwrap()),
            _ => None,
        }
    }

    /// Writes key `k{i % 50}` = `round-i` for `i` in `range`.
    async fn write_rounds(shard: &DurableShard, range: std::ops::Range<u32>) {
        for i in range {
            put(shard, &format!("k{}", i % 50), &format!("round-{i}")).await;
        }
    }

    fn check_all(store: &Store, last_round: u32) {
        for k in 0..50 {
            let i = (0..=last_round).rev().find(|i| i % 50 == k).unwrap();
            assert_eq!(value(store, &format!("k{k}")), Some(format!("round-{i}")), "key k{k}");
        }
    }

    /// Snapshots cut the log (whole segments before the older kept snapshot go), and a
    /// restart loads the newest snapshot and replays only the log after it. A damaged newest
    /// snapshot falls back to the older one plus the log after it; with both damaged and the
    /// log's start gone, kvd refuses to start and says what to do.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn snapshots_cut_the_log_and_recovery_falls_back_when_one_is_damaged() {
        let dir = scratch_dir("snapshots");
        let (shard, _, _) = open(&dir, 4 << 10).await.unwrap();
        write_rounds(&shard, 0..300).await;
        shard.snapshot_now().await.unwrap();
        write_rounds(&shard, 300..600).await;
        shard.snapshot_now().await.unwrap();
        write_rounds(&shard, 600..650).await;
        let figures = shard.figures();
        assert_eq!(figures.snapshots_taken, 2);
        assert!(figures.snapshot_bytes > 0 && figures.log_entries < 100, "{figures:?}");
        shard.shutdown().await;
        drop(shard);
        let snaps = catalog::list(&dir).unwrap();
        assert_eq!(snaps.len(), 2, "two snapshots kept: {snaps:?}");
        let first_segment = dir.join("log").join("log-00000000000000000000.seg");
        assert!(
            !first_segment.exists(),
            "segments before the older snapshot are deleted"
        );

        let (shard, recovery, store) = open(&dir, 4 << 10).await.unwrap();
        assert_eq!(
            recovery.snapshot.as_ref().map(|(p, _)| p.clone()),
            Some(snaps[0].1.clone())
        );
        assert!(
            recovery.entries_replayed <= 60,
            "replayed {}",
            recovery.entries_replayed
        );
        check_all(&store, 649);
        shard.shutdown().await;
        drop(shard);

        let mut bytes = std::fs::read(&snaps[0].1).unwrap();
        let mid = bytes.len() / 2;
        bytes[mid] ^= 0x40;
        std::fs::write(&snaps[0].1, &bytes).unwrap();
        let (shard, recovery, store) = open(&dir, 4 << 10).await.unwrap();
        assert_eq!(
            recovery.snapshot.as_ref().map(|(p, _)| p.clone()),
            Some(snaps[1].1.clone())
        );
        assert!(
            recovery.entries_replayed >= 300,
            "replayed {}",
            recovery.entries_replayed
        );
        check_all(&store, 649);
        shard.shutdown().await;
        drop(shard);

        let mut bytes = std::fs::read(&snaps[1].1).unwrap();
        bytes[20] ^= 0x01;
        std::fs::write(&snaps[1].1, &bytes).unwrap();
        let e = open(&dir, 4 << 10).await.err().unwrap();
        assert!(e.contains("snap-") && e.contains("restore the data directory"), "{e}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// A snapshot taken while writes go on is still a correct start: every write after its
    /// index is replayed on top (blind puts and deletes are idempotent).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_snapshot_taken_under_writes_recovers_every_write() {
        let dir = scratch_dir("fuzzy");
        let (shard, _, _) = open(&dir, 1 << 20).await.unwrap();
        let shard = Arc::new(shard);
        let writer = {
            let shard = shard.clone();
            tokio::spawn(async move { write_rounds(&shard, 0..2000).await })
        };
        while !writer.is_finished() {
            shard.snapshot_now().await.unwrap();
        }
        writer.await.unwrap();
        shard.shutdown().await;
        drop(shard);
        let (shard, recovery, store) = open(&dir, 1 << 20).await.unwrap();
        assert!(recovery.snapshot.is_some());
        check_all(&store, 1999);
        shard.shutdown().await;
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// Conditional puts and deletes (whose outcome depends on the state they meet) while
    /// snapshots are taken one after another: after a restart every key holds exactly what
    /// it held before. (Here a snapshot's copy rarely overlaps a write; the overlap that makes
    /// the per-shard skip matter is forced in `store::dump`'s
    /// `replay_after_a_fuzzy_snapshot_skips_what_each_shard_already_holds`.)
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn conditional_writes_under_snapshots_recover_exactly() {
        let dir = scratch_dir("conditional");
        let (shard, _, live) = open(&dir, 1 << 20).await.unwrap();
        let shard = Arc::new(shard);
        let writer = {
            let shard = shard.clone();
            tokio::spawn(async move {
                for i in 0..1500u32 {
                    let key = format!("k{}", i % 20);
                    let mut req = BatchRequest::new();
                    match i % 3 {
                        0 => req.push(OpKind::PutIfAbsent, key.as_bytes(), format!("nx-{i}").as_bytes()),
                        1 => req.push(OpKind::PutIfPresent, key.as_bytes(), format!("xx-{i}").as_bytes()),
                        _ if i % 7 == 0 => req.push_delete(key.as_bytes()),
                        _ => req.push(OpKind::PutIfPresent, key.as_bytes(), format!("xx-{i}").as_bytes()),
                    }
                    shard.submit(body(&req)).await.unwrap().unwrap();
                }
            })
        };
        while !writer.is_finished() {
            shard.snapshot_now().await.unwrap();
        }
        writer.await.unwrap();
        let before: Vec<Option<String>> = (0..20).map(|k| value(&live, &format!("k{k}"))).collect();
        shard.shutdown().await;
        drop(shard);
        let (shard, recovery, store) = open(&dir, 1 << 20).await.unwrap();
        assert!(recovery.snapshot.is_some());
        let after: Vec<Option<String>> = (0..20).map(|k| value(&store, &format!("k{k}"))).collect();
        assert_eq!(after, before);
        shard.shutdown().await;
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// Writes go through the log; after a restart on the same directory the store is
    /// rebuilt from it and every acknowledged write is there.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn acknowledged_writes_survive_a_restart() {
        let dir = scratch_dir("restart");
        let (shard, _, store) = open(&dir, 1 << 20).await.unwrap();
        for i in 0..50 {
            let mut req = BatchRequest::new();
            req.push_put(format!("k{i}").as_bytes(), format!("v{i}").as_bytes());
            req.push_get(format!("k{i}").as_bytes());
            let reply = aligned(&shard.submit(body(&req)).await.unwrap().unwrap());
            let view = ReplyView::parse(&reply).unwrap();
            assert_eq!(view.result(0), OpReply::Stored);
            assert_eq!(view.result(1), OpReply::Found(format!("v{i}").as_bytes()));
        }
        shard.shutdown().await;
        drop(shard);
        assert_eq!(store.len(), 50);

        let (shard, _, again) = open(&dir, 1 << 20).await.unwrap();
        assert_eq!(again.len(), 50, "the log was replayed into the new store");
        let mut req = BatchRequest::new();
        req.push_get(b"k49");
        req.push_put(b"k50", b"after the restart");
        let reply = aligned(&shard.submit(body(&req)).await.unwrap().unwrap());
        assert_eq!(ReplyView::parse(&reply).unwrap().result(0), OpReply::Found(b"v49"));
        shard.shutdown().await;
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
