//! Applying entries to the store, and the shard's snapshots: writing them (fuzzy, per map
//! shard exact: see the module docs of `raft`), loading them at start, installing a leader's.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use kvshared::frame::AlignedVec;
use kvshared::stats::Counts;
use kvshared::wire::{BatchResponse, encode_body};
use openraft::storage::{RaftStateMachine, Snapshot};
use openraft::{
    BasicNode, Entry, EntryPayload, LogId, OptionalSend, RaftSnapshotBuilder, SnapshotMeta, StoredMembership,
};

use super::types::{Applied, ShardRaft, StorageResult, io_error};
use crate::counters::Counters;
use crate::durable::entry::{LogPayload, LoggedBatch};
use crate::durable::health::DiskHealth;
use crate::durable::log::GroupCommit;
use crate::durable::{catalog, snapshot};
use crate::store::{Exported, Scratch, Store, Unbounded};

/// Copies of a snapshot made without the transaction gate held throughout before one is made
/// with it (each is thrown away when a transaction or a slot change came in its way).
const UNGATED_TRIES: u32 = 2;
/// A paced snapshot rests this many times as long as each piece of its work took: it uses
/// at most a quarter of a CPU's time. (On a node of a small CPU quota, an unpaced snapshot
/// took its whole share for as long as it ran: docs/PERFORMANCE.md, "Snapshots that do not
/// stop the node".)
const REST_PER_WORK: u32 = 3;

/// Spreads a snapshot's work out: after each piece (a step of a map shard's copy, a write
/// of the file), sleeps `rest` times as long as the piece took.
struct Pacer {
    since: std::cell::Cell<std::time::Instant>,
    rest: u32,
}

impl Pacer {
    fn new(rest: u32) -> Pacer {
        Pacer {
            since: std::cell::Cell::new(std::time::Instant::now()),
            rest,
        }
    }

    fn rest(&self) {
        if self.rest > 0 {
            std::thread::sleep(self.since.get().elapsed() * self.rest);
        }
        self.since.set(std::time::Instant::now());
    }
}

/// Snapshot state shared by the state machine, its builders and stats.
#[derive(Default)]
pub(super) struct Snapshots {
    /// The newest snapshot: what it stands for, its file, its size.
    pub(super) current: Option<(SnapshotMeta<u64, BasicNode>, PathBuf, u64)>,
    /// When the newest snapshot was finished (or found at start).
    pub(super) taken_at: Option<std::time::Instant>,
    /// Snapshots written by this process.
    pub(super) taken: u64,
    /// How long the last one took to write, and its pairs.
    pub(super) last_took: std::time::Duration,
    pub(super) last_pairs: u64,
    /// A snapshot is being written.
    pub(super) building: bool,
    /// The log writer's byte count when the last snapshot began.
    pub(super) log_bytes_at_last: u64,
}

/// The state machine: the node's store, and how far it has applied.
pub struct StateMachine {
    pub(super) store: Arc<Store>,
    pub(super) counters: Arc<Counters>,
    pub(super) last_applied: Option<LogId<u64>>,
    pub(super) membership: StoredMembership<u64, BasicNode>,
    pub(super) scratch: Scratch,
    pub(super) response: BatchResponse,
    pub(super) dir: PathBuf,
    pub(super) writer: Arc<GroupCommit>,
    pub(super) snapshots: Arc<parking_lot::Mutex<Snapshots>>,
    pub(super) health: Arc<DiskHealth>,
}

/// Why the state machine cannot go on: openraft is told (a storage error stops the member).
#[derive(Debug, thiserror::Error)]
pub enum MachineError {
    /// An entry of the log does not read.
    #[error("log entry {index} does not read ({source}): kvd will not apply a log it cannot read")]
    Unreadable {
        /// The entry's index.
        index: u64,
        /// Why.
        source: crate::durable::entry::EntryError,
    },
    /// A snapshot's metadata does not decode.
    #[error("{}: its metadata does not decode: {source}", path.display())]
    Meta {
        /// The snapshot file.
        path: PathBuf,
        /// Why.
        source: postcard::Error,
    },
    /// A snapshot's pairs do not load.
    #[error("{}: {source}", path.display())]
    Import {
        /// The snapshot file.
        path: PathBuf,
        /// Why.
        source: crate::store::ImportError,
    },
    /// Nothing is applied yet: there is nothing to snapshot.
    #[error("nothing applied yet: no snapshot to take")]
    NothingApplied,
    /// Writing a snapshot failed other than by the disk refusing (which is retried).
    #[error(transparent)]
    Snapshot(#[from] snapshot::SnapshotError),
    /// The task writing a snapshot failed.
    #[error("the snapshot task failed: {0}")]
    Task(#[from] tokio::task::JoinError),
}

impl StateMachine {
    /// Applies an entry's batches; each answered with its response body.
    fn apply_entry(&mut self, index: u64, payload: &LogPayload) -> Result<Applied, MachineError> {
        // A payload is checked whole when it is built or decoded (from a segment or a peer):
        // one that does not read here is a bug, and a storage error stops the member rather
        // than apply the entry as nothing.
        let batches = payload
            .batches()
            .map_err(|source| MachineError::Unreadable { index, source })?;
        Ok(Applied(batches.iter().map(|b| self.apply_batch(index, b)).collect()))
    }

    fn apply_batch(&mut self, index: u64, batch: &LoggedBatch<'_>) -> Vec<u8> {
        let mut tally = Counts::default();
        self.scratch.log_index = index;
        self.store
            .execute(batch, &mut self.response, &mut Unbounded, &mut self.scratch, &mut tally);
        // Applying is not serving: the member that answers the client counts the ops it
        // served (`merge_logged`); every member counts what it applied.
        let applied = tally.ops();
        let tally = Counts {
            applied,
            evicted: tally.evicted,
            expired: tally.expired,
            out_of_memory: tally.out_of_memory,
            ..Counts::default()
        };
        self.counters.add_counts(0, &tally);
        let mut body = AlignedVec::new();
        match encode_body(&self.response, &mut body) {
            Ok(()) => body.to_vec(),
            Err(_) => Vec::new(),
        }
    }

    /// Loads the snapshot in `path` (already read and checked) into the store.
    pub(super) fn load(&mut self, path: &Path, snap: &snapshot::Snapshot) -> Result<u64, MachineError> {
        let meta: SnapshotMeta<u64, BasicNode> =
            postcard::from_bytes(&snap.meta).map_err(|source| MachineError::Meta {
                path: path.to_path_buf(),
                source,
            })?;
        let pairs = self.store.import(&snap.data).map_err(|source| MachineError::Import {
            path: path.to_path_buf(),
            source,
        })?;
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
pub(super) fn snapshot_meta(snap: &snapshot::Snapshot) -> Result<SnapshotMeta<u64, BasicNode>, postcard::Error> {
    postcard::from_bytes(&snap.meta)
}

/// Writes a snapshot of the store as of `meta` (see the module docs: fuzzy, and safe).
pub struct SnapshotMaker {
    pub(super) store: Arc<Store>,
    pub(super) dir: PathBuf,
    pub(super) meta: Option<SnapshotMeta<u64, BasicNode>>,
    pub(super) writer: Arc<GroupCommit>,
    pub(super) snapshots: Arc<parking_lot::Mutex<Snapshots>>,
    pub(super) health: Arc<DiskHealth>,
}

impl SnapshotMaker {
    /// Writes the file (blocking: runs on a blocking thread), prunes old snapshots and the
    /// log before the oldest kept one. Returns the path and size.
    fn write(&self, meta: &SnapshotMeta<u64, BasicNode>) -> Result<(PathBuf, u64, u64), snapshot::SnapshotError> {
        let index = meta.last_log_id.map_or(0, |l| l.index);
        let path = catalog::path(&self.dir, index);
        let encoded = postcard::to_allocvec(meta).map_err(|e| snapshot::SnapshotError::Invalid {
            path: path.clone(),
            why: e.to_string(),
        })?;
        // Without the transaction gate held throughout first (slot changes and transactions
        // go on being applied), paced; after that many copies that one interrupted, with the
        // gate and at full speed (the gate's hold as short as it can be).
        let mut attempt = 0;
        let (file, pairs) = loop {
            let mut file = snapshot::SnapshotWriter::create(&path, &encoded)?;
            let hold_gate = attempt >= UNGATED_TRIES;
            let pacer = Pacer::new(if hold_gate { 0 } else { REST_PER_WORK });
            let written = self.store.export_into(hold_gate, &mut || pacer.rest(), &mut |b| {
                let r = file.write_data(b);
                pacer.rest();
                r
            })?;
            match written {
                Exported::Done(pairs) => break (file, pairs),
                Exported::Interrupted => attempt += 1,
            }
        };
        let size = file.finish()?;
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
            None => Err(MachineError::NothingApplied),
            Some(meta) => self.write_until_done(meta).await,
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
                tracing::warn!(error = %e, "could not write a snapshot");
                Err(io_error(e))
            }
        }
    }
}

/// A snapshot written: what it stands for, its file, size, pairs, and how long it took.
type Written = (SnapshotMeta<u64, BasicNode>, PathBuf, u64, u64, std::time::Duration);

impl SnapshotMaker {
    /// Writes the snapshot, retrying while the disk refuses (no space, read-only): a failed
    /// snapshot must not stop the shard (openraft stops for good on a storage error), and the
    /// log keeps everything meanwhile.
    async fn write_until_done(&self, meta: SnapshotMeta<u64, BasicNode>) -> Result<Written, MachineError> {
        let started = std::time::Instant::now();
        let mut backoff = crate::durable::health::Backoff::default();
        let mut stalled = false;
        loop {
            let maker = SnapshotMaker {
                store: self.store.clone(),
                dir: self.dir.clone(),
                meta: None,
                writer: self.writer.clone(),
                snapshots: self.snapshots.clone(),
                health: self.health.clone(),
            };
            let m = meta.clone();
            match tokio::task::spawn_blocking(move || maker.write(&m)).await {
                Ok(Ok((path, size, pairs))) => {
                    if stalled {
                        self.health.ok();
                    }
                    return Ok((meta, path, size, pairs, started.elapsed()));
                }
                Ok(Err(snapshot::SnapshotError::Io { path, what, source })) => {
                    stalled = true;
                    let detail = format!("{}: cannot {what}", path.display());
                    self.health.failed("write a snapshot", &detail, &source);
                    let _ = std::fs::remove_file(path.with_extension("tmp"));
                    tokio::time::sleep(backoff.next_pause()).await;
                }
                Ok(Err(e)) => return Err(e.into()),
                Err(e) => return Err(e.into()),
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
                EntryPayload::Normal(payload) => self.apply_entry(entry.log_id.index, &payload).map_err(io_error)?,
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
            health: self.health.clone(),
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
        let began = std::time::Instant::now();
        snapshot.sync_all().await.map_err(io_error)?;
        drop(snapshot);
        let index = meta.last_log_id.map_or(0, |l| l.index);
        let path = catalog::path(&self.dir, index);
        std::fs::rename(self.dir.join("snap-receiving.tmp"), &path).map_err(io_error)?;
        crate::durable::sync_dir(&self.dir).map_err(io_error)?;
        let snap = snapshot::read(&path).map_err(io_error)?;
        let pairs = self.load(&path, &snap).map_err(io_error)?;
        if let Ok(Some(oldest_kept)) = catalog::prune(&self.dir) {
            self.writer.purge_through(oldest_kept);
        }
        tracing::info!(file = %path.display(), pairs, took_ms = began.elapsed().as_millis() as u64, "installed the leader's snapshot");
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
