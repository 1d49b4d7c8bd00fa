//! openraft's log storage over the segment files: every entry on disk (written by the
//! group-commit thread), the newest in memory too (`EntryCache`, within a byte budget; older
//! ones are read back from the files), the vote and the committed-index hint in files of
//! their own.

use std::fmt::Debug;
use std::ops::RangeBounds;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use openraft::storage::{LogFlushed, LogState, RaftLogStorage};
use openraft::{Entry, EntryPayload, LogId, OptionalSend, RaftLogReader, Vote};

use super::entry_cache::{EntryCache, LOG_CACHE_BYTES};
use super::types::{ShardRaft, StorageResult, io_error};
use crate::durable::log::{FsyncPolicy, GroupCommit, LogError, LogFiles, RecordFault};
use crate::durable::snapshot;
use crate::durable::spans::RecordReader;

/// How often the committed index is written down (a hint for restarts).
pub(super) const COMMITTED_SAVE_EVERY: std::time::Duration = std::time::Duration::from_secs(1);

/// The log storage: every entry on disk, the newest in memory too.
pub struct LogStore {
    pub(super) inner: Arc<parking_lot::Mutex<LogInner>>,
}

pub(super) struct LogInner {
    pub(super) dir: PathBuf,
    /// The newest entries.
    pub(super) cache: EntryCache,
    /// Reads older entries back from the segment files.
    reader: RecordReader,
    /// The highest index known committed (entries up to it are never taken back).
    committed_index: u64,
    pub(super) last_purged: Option<LogId<u64>>,
    pub(super) vote: Option<Vote<u64>>,
    pub(super) writer: Arc<GroupCommit>,
    /// The last committed entry written to the `committed` file, and when; kept only by a
    /// replica group's member (a group of one commits its whole log itself at start).
    pub(super) committed: Option<LogId<u64>>,
    pub(super) committed_saved_at: Option<std::time::Instant>,
    pub(super) keep_committed: bool,
    /// Whether the disk takes writes.
    pub(super) health: Arc<crate::durable::health::DiskHealth>,
    /// Most bytes of entries one append to a member carries (within the members'
    /// `--max-frame`): see [`RaftLogReader::limited_get_log_entries`].
    pub(super) append_bytes: usize,
}

impl LogStore {
    /// Opens (or creates) the log in `dir`, reading back every entry; also returns the index
    /// of the first record on disk.
    pub fn open(
        dir: &Path,
        fsync: FsyncPolicy,
        segment_bytes: u64,
        keep_committed: bool,
        health: Arc<crate::durable::health::DiskHealth>,
    ) -> Result<(LogStore, u64), Box<dyn std::error::Error + Send + Sync>> {
        let log_dir = dir.join("log");
        refuse_a_lost_log(dir, &log_dir)?;
        // Where the log was known committed, at most a second before the stop: a restarted
        // member applies that much at once, without waiting to hear from a leader. A group of
        // one commits its whole log at start. Entries up to there are never taken back, so
        // they need not stay in memory.
        let hint = match keep_committed {
            true => read_committed_hint(&dir.join("committed")),
            false => None,
        };
        let committed_index = match keep_committed {
            true => hint.map_or(0, |c| c.index),
            false => u64::MAX,
        };
        let mut cache = EntryCache::new(LOG_CACHE_BYTES);
        let files = LogFiles::open(
            &log_dir,
            0,
            &mut |index, bytes| {
                cache.push(decode_record(&log_dir, index, &bytes)?, bytes.len());
                cache.evict(committed_index);
                Ok(())
            },
            &mut |index, old| upgrade_record(&log_dir, index, &old),
        )?;
        let files = files.with_segment_bytes(segment_bytes);
        let first_on_disk = files.first_index();
        let reader = files.reader();
        let last = cache.last().map(|l| l.index);
        // A hint only (a lower value is always safe): one outside the log is passed over.
        let committed = hint.filter(|c| c.index >= first_on_disk && Some(c.index) <= last);
        let committed_index = committed_index.min(last.unwrap_or(0));
        let vote_path = dir.join("vote");
        let vote = match vote_path.exists() {
            true => Some(read_vote(&vote_path)?),
            false => None,
        };
        let writer = GroupCommit::start(files, fsync, health.clone())
            .map_err(|e| format!("{}: cannot start the log writer thread: {e}", dir.display()))?;
        let store = LogStore {
            inner: Arc::new(parking_lot::Mutex::new(LogInner {
                dir: dir.to_path_buf(),
                cache,
                reader,
                committed_index,
                last_purged: None,
                vote,
                writer: Arc::new(writer),
                committed,
                committed_saved_at: None,
                keep_committed,
                health,
                append_bytes: usize::MAX,
            })),
        };
        Ok((store, first_on_disk))
    }

    /// Bounds the entries one append to a member carries to `frame` bytes (the members'
    /// `--max-frame`), less room for the message around them, and to [`APPEND_BYTES`].
    pub(super) fn limit_appends(&self, frame: u32) {
        let limit = (frame as usize).saturating_sub(APPEND_SLACK).min(APPEND_BYTES);
        self.inner.lock().append_bytes = limit.max(1);
    }

    /// Forgets the entries up to `log_id` (a snapshot holds them).
    pub(super) fn forget_through(&self, log_id: LogId<u64>) {
        let mut inner = self.inner.lock();
        inner.cache.forget_through(log_id.index);
        inner.last_purged = Some(log_id);
        inner.writer.raft_purged(log_id.index);
    }
}

impl LogInner {
    /// Drops cached entries past the budget: only committed ones, and only once readable
    /// from disk.
    fn evict(&mut self) {
        if self.cache.over_budget() {
            let on_disk = self.reader.readable_end().saturating_sub(1);
            self.cache.evict(self.committed_index.min(on_disk));
        }
    }
}

/// The committed-index hint, if it reads (one that does not is passed over).
fn read_committed_hint(path: &Path) -> Option<LogId<u64>> {
    if !path.exists() {
        return None;
    }
    match snapshot::read(path)
        .map_err(|e| e.to_string())
        .and_then(|f| postcard::from_bytes::<LogId<u64>>(&f.data).map_err(|e| e.to_string()))
    {
        Ok(c) => Some(c),
        Err(e) => {
            tracing::warn!(file = %path.display(), error = %e, "passed over the committed-index hint");
            None
        }
    }
}

/// The first byte of a log record (segment format 3): how the rest is encoded. 1: postcard's
/// encoding of openraft's `Entry`, its data a payload of entry format 1 (`durable::entry`).
/// A later encoding gets a new byte, and this build's reader stays.
pub(crate) const RECORD_ENTRY_V1: u8 = 1;

/// An entry as its log record: its encoding's byte, then the entry, written into one
/// allocation sized from its payload (postcard's own `Vec` grew by doubling and copying: ~3%
/// of a durable node's CPU under YCSB-A).
pub(crate) fn encode_entry(entry: &Entry<ShardRaft>) -> postcard::Result<Vec<u8>> {
    // The payload's bytes, a length of at most 10 bytes before it, and the entry's ids.
    let size = match &entry.payload {
        EntryPayload::Normal(payload) => 64 + payload.bytes().len(),
        _ => 256,
    };
    let mut out = Vec::with_capacity(size);
    out.push(RECORD_ENTRY_V1);
    postcard::to_extend(entry, out)
}

/// An entry as its log record (as `encode_entry` makes it), for the golden bytes of
/// `durable::samples`.
pub fn encode_record(entry: &Entry<ShardRaft>) -> postcard::Result<Vec<u8>> {
    encode_entry(entry)
}

/// A log record's entry, refused (naming the directory, the record and what to do) if it
/// does not decode, or holds another index than its place: never applied as nothing.
pub fn decode_record(log_dir: &Path, index: u64, bytes: &[u8]) -> Result<Entry<ShardRaft>, LogError> {
    let refused = |fault| LogError::Unreadable {
        dir: log_dir.to_path_buf(),
        index,
        fault,
    };
    let entry: Entry<ShardRaft> = match bytes.split_first() {
        Some((&RECORD_ENTRY_V1, rest)) => postcard::from_bytes(rest).map_err(|e| refused(RecordFault::Decode(e)))?,
        Some((tag, _)) => return Err(refused(RecordFault::Encoding(*tag))),
        None => return Err(refused(RecordFault::Empty)),
    };
    if entry.log_id.index != index {
        return Err(refused(RecordFault::OtherEntry(entry.log_id.index)));
    }
    Ok(entry)
}

/// A record of an older segment format (2: postcard's `Entry` whose data was the batches'
/// client frame bodies) as a record of this one, refused like [`decode`] if it does not read.
fn upgrade_record(log_dir: &Path, index: u64, old: &[u8]) -> Result<Vec<u8>, LogError> {
    let refused = |fault| LogError::Unreadable {
        dir: log_dir.to_path_buf(),
        index,
        fault,
    };
    let entry = crate::durable::legacy::entry_v2(old).map_err(|e| refused(RecordFault::Legacy(e)))?;
    encode_entry(&entry).map_err(|e| refused(RecordFault::Upgrade(e)))
}

/// Why the raft vote file cannot be read.
#[derive(Debug, thiserror::Error)]
pub enum VoteFileError {
    /// The file is damaged: the member must not start.
    #[error(
        "{}: the raft vote file is damaged ({why}): kvd will not start without its vote (it could vote twice in one term). Restore the data directory from a copy; or, in a replica group, move the directory away and add the member back as a new one",
        path.display()
    )]
    Damaged {
        /// The vote file.
        path: PathBuf,
        /// How.
        why: String,
    },
    /// The file could not be read.
    #[error(transparent)]
    Read(snapshot::SnapshotError),
}

/// The raft vote in `path` (in the snapshot file format), or why it cannot be read: a vote
/// file is no snapshot, and there is no older one to fall back to.
fn read_vote(path: &Path) -> Result<Vote<u64>, VoteFileError> {
    let refused = |why: String| VoteFileError::Damaged {
        path: path.to_path_buf(),
        why,
    };
    let file = snapshot::read(path).map_err(|e| match e {
        snapshot::SnapshotError::Invalid { why, .. } => refused(why),
        e => VoteFileError::Read(e),
    })?;
    postcard::from_bytes(&file.data).map_err(|e| refused(format!("does not decode: {e}")))
}

/// Every log segment of a directory that had a log is gone.
#[derive(Debug, thiserror::Error)]
#[error(
    "{}: no log segment is left, but this data directory voted or took snapshots: the log was \
     deleted. kvd will not serve a shortened history. Restore the directory from a copy, or \
     move it away to start the shard empty (losing its data)",
    log_dir.display()
)]
pub struct LostLog {
    /// The log's directory.
    pub log_dir: PathBuf,
}

/// A shard that has voted or snapshotted had a log: if every segment is gone, it was deleted
/// (kvd always keeps the active segment), and starting would lose what it acknowledged.
fn refuse_a_lost_log(dir: &Path, log_dir: &Path) -> Result<(), LostLog> {
    let has_segment = std::fs::read_dir(log_dir).is_ok_and(|entries| {
        entries
            .filter_map(Result::ok)
            .any(|e| e.file_name().to_string_lossy().ends_with(".seg"))
    });
    let had_log = dir.join("vote").exists() || crate::durable::catalog::list(dir).is_ok_and(|l| !l.is_empty());
    if !has_segment && had_log {
        return Err(LostLog {
            log_dir: log_dir.to_path_buf(),
        });
    }
    Ok(())
}

/// Room in an append's frame for everything but the entries' payloads: the message, each
/// entry's ids, lengths and membership.
const APPEND_SLACK: usize = 256 * 1024;

/// The most bytes of entries one append carries (an entry bigger than this goes alone): a
/// member far behind is sent its backlog in steps that each finish well within a heartbeat
/// on a quiet machine, and the bigger ones go on the bulk lane (`durable::bulk`).
const APPEND_BYTES: usize = 8 << 20;

/// An entry's bytes in an append (its payload, and room for its ids).
fn entry_bytes(entry: &Entry<ShardRaft>) -> usize {
    match &entry.payload {
        EntryPayload::Normal(p) => p.bytes().len() + 64,
        _ => 1024,
    }
}

/// The first of `entries` whose bytes fit in `limit` (at least one: a single entry is
/// within a client's frame).
fn within(mut entries: Vec<Entry<ShardRaft>>, limit: usize) -> Vec<Entry<ShardRaft>> {
    let mut total = 0usize;
    let keep = entries
        .iter()
        .position(|e| {
            total = total.saturating_add(entry_bytes(e));
            total > limit
        })
        .unwrap_or(entries.len())
        .max(1);
    entries.truncate(keep);
    entries
}

impl RaftLogReader<ShardRaft> for LogStore {
    /// What one append to a member carries: the entries from `start`, as many as fit in the
    /// members' frame limit (a catch-up of big values once made an append of 80 MiB that the
    /// frame limit refused, over and over).
    async fn limited_get_log_entries(&mut self, start: u64, end: u64) -> StorageResult<Vec<Entry<ShardRaft>>> {
        let limit = self.inner.lock().append_bytes;
        let entries = self.try_get_log_entries(start..end).await?;
        Ok(within(entries, limit))
    }

    async fn try_get_log_entries<RB: RangeBounds<u64> + Clone + Debug + OptionalSend>(
        &mut self,
        range: RB,
    ) -> StorageResult<Vec<Entry<ShardRaft>>> {
        // openraft asks for ranges it computed from what peers sent: a range whose start is
        // past its end would panic BTreeMap::range, so it is answered empty instead.
        use std::ops::Bound::{Excluded, Included, Unbounded};
        let start = match range.start_bound() {
            Included(&s) => Some(s),
            Excluded(&s) => s.checked_add(1),
            Unbounded => Some(0),
        };
        let end = match range.end_bound() {
            Included(&e) => e.checked_add(1),
            Excluded(&e) => Some(e),
            Unbounded => None,
        };
        let Some(start) = start else { return Ok(Vec::new()) };
        if end.is_some_and(|e| e <= start) {
            return Ok(Vec::new());
        }
        let end = end.unwrap_or(u64::MAX);
        // A snapshot may purge the start of the range while it is read from disk: then it
        // is read again from after the purge (openraft sends a snapshot for what is gone).
        let mut tries = 0;
        loop {
            match self.read_range(start, end) {
                Err(e) if tries < 3 && self.purged_since(start) => {
                    tracing::debug!(error = %e, start, "the log was purged while read; reading again");
                    tries += 1;
                }
                other => return other.map_err(io_error),
            }
        }
    }
}

impl LogStore {
    /// Whether entries from `start` on were purged (a snapshot holds them now).
    fn purged_since(&self, start: u64) -> bool {
        self.inner.lock().last_purged.is_some_and(|l| l.index >= start)
    }

    /// The entries `start..end` that exist: from memory, and the older ones from disk.
    fn read_range(&self, start: u64, end: u64) -> Result<Vec<Entry<ShardRaft>>, LogError> {
        let (disk, mut entries, reader, log_dir) = {
            let inner = self.inner.lock();
            // Entries a snapshot holds are gone; the rest before the cache are on disk.
            let start = start.max(inner.last_purged.map_or(0, |l| l.index + 1));
            // Nothing past the last entry exists (an empty cache: the log ends at the purge).
            let log_end = inner.cache.last().or(inner.last_purged).map_or(0, |l| l.index + 1);
            let cached_from = inner.cache.first_index().unwrap_or(log_end);
            let disk = start..end.min(cached_from);
            let cached = inner.cache.range(start.max(cached_from), end);
            (disk, cached, inner.reader.clone(), inner.dir.join("log"))
        };
        if disk.is_empty() {
            return Ok(entries);
        }
        let mut out = Vec::with_capacity(entries.len() + (disk.end - disk.start) as usize);
        for (index, bytes) in disk.clone().zip(reader.read(disk.start, disk.end)?) {
            out.push(decode_record(&log_dir, index, &bytes)?);
        }
        out.append(&mut entries);
        Ok(out)
    }
}

impl RaftLogStorage<ShardRaft> for LogStore {
    type LogReader = LogStore;

    async fn get_log_state(&mut self) -> StorageResult<LogState<ShardRaft>> {
        let inner = self.inner.lock();
        let last = inner.cache.last().or(inner.last_purged);
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
        let (path, health) = {
            let inner = self.inner.lock();
            (inner.dir.join("vote"), inner.health.clone())
        };
        let data = postcard::to_allocvec(vote).map_err(io_error)?;
        // A vote must be durable before raft goes on; a failing disk is retried (openraft
        // stops for good on a storage error), and the member waits meanwhile.
        let mut backoff = crate::durable::health::Backoff::default();
        let mut stalled = false;
        loop {
            let snap = snapshot::Snapshot {
                meta: Vec::new(),
                data: data.clone(),
            };
            match snapshot::write(&path, &snap) {
                Ok(_) => break,
                Err(snapshot::SnapshotError::Io { source, what, .. }) => {
                    stalled = true;
                    health.failed("save the vote", &format!("{}: cannot {what}", path.display()), &source);
                    tokio::time::sleep(backoff.next_pause()).await;
                }
                Err(e) => return Err(io_error(e)),
            }
        }
        if stalled {
            health.ok();
        }
        self.inner.lock().vote = Some(*vote);
        Ok(())
    }

    async fn read_vote(&mut self) -> StorageResult<Option<Vote<u64>>> {
        Ok(self.inner.lock().vote)
    }

    async fn save_committed(&mut self, committed: Option<LogId<u64>>) -> StorageResult<()> {
        let path = {
            let mut inner = self.inner.lock();
            if let Some(c) = committed {
                inner.committed_index = inner.committed_index.max(c.index);
                inner.evict();
            }
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
            // A hint only (a lower one is always safe): a disk that refuses it is passed over.
            if let Err(e) = snapshot::write(&path, &snapshot::Snapshot { meta: Vec::new(), data }) {
                tracing::debug!(error = %e, "could not write the committed-index hint");
            }
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
            let bytes = encode_entry(&entry).map_err(io_error)?;
            inner.cache.push(entry, bytes.len());
            payloads.push(bytes);
        }
        inner.evict();
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
        inner.cache.truncate_from(log_id.index);
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

#[cfg(test)]
mod tests {
    use super::*;
    use openraft::{CommittedLeaderId, Membership};

    /// Sizing the encoding up front changes no byte of the log's records, whatever the
    /// payload (and however far off the size guess is): the encoding's byte, then postcard's.
    #[test]
    fn entries_encode_as_their_byte_then_postcard() {
        use crate::durable::entry::{LogPayload, encode_batch};
        use kvshared::wire::OpKind;
        let log_id = LogId::new(CommittedLeaderId::new(3, 1), 42);
        let big = vec![1; 70_000];
        let batch =
            encode_batch([(OpKind::Put, &b"k"[..], &big[..]), (OpKind::Delete, b"x", b"")].into_iter()).unwrap();
        let payloads = [
            EntryPayload::Blank,
            EntryPayload::Normal(LogPayload::from_batches::<Vec<u8>>(&[])),
            EntryPayload::Normal(LogPayload::from_batches(&[batch.clone(), batch])),
            EntryPayload::Membership(Membership::new(vec![[1, 2, 3].into()], None)),
        ];
        for payload in payloads {
            let entry = Entry::<ShardRaft> { log_id, payload };
            let mut want = vec![RECORD_ENTRY_V1];
            want.extend(postcard::to_allocvec(&entry).unwrap());
            let record = encode_entry(&entry).unwrap();
            assert_eq!(record, want);
            assert_eq!(decode_record(Path::new("log"), 42, &record).unwrap(), entry);
        }
        let err = decode_record(Path::new("log"), 42, &[9, 1, 2]).unwrap_err();
        assert!(
            matches!(
                err,
                LogError::Unreadable {
                    index: 42,
                    fault: RecordFault::Encoding(9),
                    ..
                }
            ),
            "{err}"
        );
    }
}
