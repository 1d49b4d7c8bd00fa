//! The log on disk: numbered records in a directory of segment files, appended with group
//! commit by one writer thread.
//!
//! Records have consecutive indexes; a segment is named after its first index
//! (`log-<index, 20 digits>.seg`) and a new one starts when the active one passes
//! [`SEGMENT_BYTES`], so that dropping the log before a snapshot deletes whole files.
//!
//! Group commit: callers hand appends to [`GroupCommit`]; its thread takes everything queued
//! while the previous fsync ran, writes it with one `write`, makes it durable with one
//! `fdatasync` (`--fsync always`), and only then completes every caller. With `1s`, callers
//! complete after the write and a sync runs at least once a second; with `never`, the OS
//! decides.

use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use std::sync::Arc;

use parking_lot::RwLock;

use super::health::{Backoff, DiskHealth};
use super::segment::{self, Segment, SegmentError};
use super::spans::{RecordReader, SegmentFile, Spans};

/// A segment is closed and a new one started past this size.
pub const SEGMENT_BYTES: u64 = 64 << 20;

/// When an acknowledged append is durable.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum FsyncPolicy {
    /// Before it is acknowledged: survives `kill -9` and a power loss.
    Always,
    /// Within a second (as Redis's `appendfsync everysec`): survives `kill -9` of the process;
    /// a power loss may take the last second.
    #[value(name = "1s")]
    EverySecond,
    /// When the OS writes it back: survives `kill -9`, not a power loss.
    Never,
}

/// Why the log could not be opened or written.
#[derive(Debug, thiserror::Error)]
pub enum LogError {
    /// A segment failed.
    #[error(transparent)]
    Segment(#[from] SegmentError),
    /// The directory failed.
    #[error("{dir}: cannot {what}: {source}")]
    Dir {
        /// The directory.
        dir: PathBuf,
        /// What was being done.
        what: &'static str,
        /// The error.
        source: std::io::Error,
    },
    /// Segments do not follow each other.
    #[error(
        "{path}: starts at record {found} but the segment before ends at {expected}: a segment is missing or does not belong here"
    )]
    Gap {
        /// The segment.
        path: PathBuf,
        /// Its first index.
        found: u64,
        /// Where the previous one ended.
        expected: u64,
    },
    /// The last segment was sealed by a rotation, but the segment after it is gone.
    #[error(
        "{path} was closed when a next segment was started, but no segment follows it: the log's last segment file is missing. kvd will not serve a shortened history. Restore this data directory from a copy, or move it away to start this shard empty (losing its data)"
    )]
    MissingLast {
        /// The last segment there is.
        path: PathBuf,
    },
    /// Records asked for that are not written (or not yet readable).
    #[error("records up to {end} asked for, but only those below {readable_end} are written")]
    NotWritten {
        /// The end asked for.
        end: u64,
        /// Where readable records end.
        readable_end: u64,
    },
    /// A record no segment file holds any more.
    #[error("log record {0} is in no segment file (taken off with a snapshot)")]
    NotOnDisk(u64),
    /// A record past the end its file's spans know.
    #[error("log record {0} is past its file's end")]
    PastFileEnd(u64),
    /// An append that does not continue the log.
    #[error("append at {first}, but the log's next index is {next}")]
    OutOfOrder {
        /// Where the append starts.
        first: u64,
        /// The log's next index.
        next: u64,
    },
    /// Taking back records older than the active segment (committed ones).
    #[error("cannot take back records from {index}: the active segment starts at {active_first}")]
    TakeBackCommitted {
        /// Where taking back was asked to start.
        index: u64,
        /// The active segment's first record.
        active_first: u64,
    },
    /// A record that does not read as an entry of this log.
    #[error("{}: log record {index} {fault}{}", dir.display(), fault.remedy())]
    Unreadable {
        /// The log's directory.
        dir: PathBuf,
        /// The record's index.
        index: u64,
        /// What is wrong with it.
        fault: RecordFault,
    },
}

/// What is wrong with a log record that does not read.
#[derive(Debug, thiserror::Error)]
pub enum RecordFault {
    /// Its bytes do not decode.
    #[error("does not decode ({0})")]
    Decode(postcard::Error),
    /// An encoding this build does not know.
    #[error("is of encoding {0}, which this kvd does not read (written by a newer kvd? docs/UPGRADING.md)")]
    Encoding(u8),
    /// No bytes at all.
    #[error("is empty")]
    Empty,
    /// It holds another entry than its place says.
    #[error("holds entry {0}: the log is damaged")]
    OtherEntry(u64),
    /// A record of the log before this build's format that does not read.
    #[error("of the log before this kvd's format {0}")]
    Legacy(super::legacy::LegacyError),
    /// A record of the older format read, but could not be written in this one.
    #[error("cannot encode its upgrade: {0}")]
    Upgrade(postcard::Error),
}

impl RecordFault {
    /// What an operator can do about it.
    fn remedy(&self) -> &'static str {
        match self {
            RecordFault::Decode(_) | RecordFault::Encoding(_) | RecordFault::Empty => {
                ": kvd will not apply a log it cannot read. Restore the data directory from a copy, or move it away to start this shard empty (losing its data; in a replica group, add it back as a new member)"
            }
            RecordFault::Legacy(_) => {
                ": kvd will not apply a log it cannot read. Restore the data directory from a copy, or run the kvd that wrote it (docs/UPGRADING.md)"
            }
            RecordFault::OtherEntry(_) | RecordFault::Upgrade(_) => "",
        }
    }
}

/// The log's files (owned by the writer thread once group commit starts).
pub struct LogFiles {
    dir: PathBuf,
    /// Rotation size ([`SEGMENT_BYTES`]; smaller in tests).
    segment_bytes: u64,
    /// Where every record is; changed here only, read by [`RecordReader`]s too.
    spans: Arc<RwLock<Spans>>,
    active: Segment,
    /// The payloads of the active segment's records after its synced ones (kept when the
    /// log fsyncs, so that a failed fsync, after which the kernel may have dropped the pages,
    /// can write them again: see [`LogFiles::restore`]).
    unsynced: Vec<Vec<u8>>,
    /// Unit tests only: while set, appends and fsyncs fail as on a read-only file system.
    #[cfg(test)]
    fault: Option<std::sync::Arc<std::sync::atomic::AtomicBool>>,
}

/// Refuses a segment that holds fewer records than its mark says were durable, or a last
/// segment that was sealed (its successor is gone).
fn check_mark(path: &Path, contents: &segment::Contents, last: bool) -> Result<(), LogError> {
    let found = contents.records.len() as u64;
    if found < contents.durable_records {
        return Err(SegmentError::Cut {
            path: path.to_path_buf(),
            found,
            durable: contents.durable_records,
        }
        .into());
    }
    if last && contents.sealed {
        return Err(LogError::MissingLast {
            path: path.to_path_buf(),
        });
    }
    Ok(())
}

fn segment_name(first: u64) -> String {
    format!("log-{first:020}.seg")
}

/// Writes the segment at `path` (whose records start at index `first`) again in the current
/// format, each record made by `upgrade`: into a new file, fsynced, then renamed over the
/// old one and the directory fsynced, so a crash leaves one whole file or the other (an
/// interrupted upgrade is done again at the next start). Returns the new contents.
fn upgrade_segment(
    path: &Path,
    first: u64,
    old: segment::Contents,
    upgrade: &mut dyn FnMut(u64, Vec<u8>) -> Result<Vec<u8>, LogError>,
) -> Result<segment::Contents, LogError> {
    let from = old.format;
    let records = old
        .records
        .into_iter()
        .enumerate()
        .map(|(i, r)| upgrade(first + i as u64, r))
        .collect::<Result<Vec<_>, _>>()?;
    let tmp = path.with_extension("seg.upgrading");
    match std::fs::remove_file(&tmp) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
            return Err(LogError::Dir {
                dir: tmp,
                what: "remove an interrupted upgrade",
                source: e,
            });
        }
        _ => {}
    }
    let mut next = Segment::create(&tmp)?;
    next.append(&records)?;
    next.mark(records.len() as u64, old.sealed)?;
    next.sync()?;
    let valid_len = next.bytes();
    drop(next);
    let dir = path.parent().unwrap_or(Path::new("."));
    std::fs::rename(&tmp, path)
        .and_then(|()| super::sync_dir(dir))
        .map_err(|source| LogError::Dir {
            dir: path.to_path_buf(),
            what: "put the upgraded segment in place",
            source,
        })?;
    tracing::info!(file = %path.display(), records = records.len(), from, to = segment::FORMAT_VERSION, "upgraded a log segment to this kvd's format");
    Ok(segment::Contents {
        durable_records: records.len() as u64,
        records,
        valid_len,
        torn_at: None,
        sealed: old.sealed,
        format: segment::FORMAT_VERSION,
    })
}

/// The segment files in `dir`, by their first index, in order.
fn list_segments(dir: &Path) -> Result<Vec<u64>, LogError> {
    let dir_err = |what| {
        let dir = dir.to_path_buf();
        move |source| LogError::Dir { dir, what, source }
    };
    std::fs::create_dir_all(dir).map_err(dir_err("create"))?;
    let mut firsts: Vec<u64> = std::fs::read_dir(dir)
        .map_err(dir_err("list"))?
        .filter_map(|e| e.ok())
        .filter_map(|e| {
            let name = e.file_name().into_string().ok()?;
            name.strip_prefix("log-")?.strip_suffix(".seg")?.parse().ok()
        })
        .collect();
    firsts.sort_unstable();
    Ok(firsts)
}

impl LogFiles {
    /// Opens the log in `dir` (creating it, starting at index `start`, if it has no segment),
    /// reading back and checking every record, one segment at a time, and handing each to
    /// `visit` with its index; a torn tail is cut off (and logged, naming the file). A
    /// segment of an older format is upgraded first: `upgrade` makes each of its records
    /// (with its index) a record of the current format, and the segment is written again
    /// in it, atomically (a crash leaves the old file or the new one).
    pub fn open(
        dir: &Path,
        start: u64,
        visit: &mut dyn FnMut(u64, Vec<u8>) -> Result<(), LogError>,
        upgrade: &mut dyn FnMut(u64, Vec<u8>) -> Result<Vec<u8>, LogError>,
    ) -> Result<LogFiles, LogError> {
        let firsts = list_segments(dir)?;
        let mut closed = Vec::new();
        let mut expected = firsts.first().copied().unwrap_or(start);
        for (n, &first) in firsts.iter().enumerate() {
            let path = dir.join(segment_name(first));
            if first != expected {
                return Err(LogError::Gap {
                    path,
                    found: first,
                    expected,
                });
            }
            let last = n + 1 == firsts.len();
            let contents = segment::read(&path, last)?;
            check_mark(&path, &contents, last)?;
            if let Some(at) = contents.torn_at {
                tracing::warn!(file = %path.display(), offset = at, "cut a torn tail off the log (a crash during an append; it held no acknowledged write)");
            }
            let contents = match contents.format < segment::FORMAT_VERSION {
                true => upgrade_segment(&path, first, contents, upgrade)?,
                false => contents,
            };
            let mut ends = Vec::with_capacity(contents.records.len());
            let mut end = segment::HEADER_LEN as u64;
            for (i, r) in contents.records.into_iter().enumerate() {
                end += (segment::RECORD_HEADER_LEN + r.len()) as u64;
                ends.push(end);
                visit(first + i as u64, r)?;
            }
            let info = SegmentFile { first, path, ends };
            expected = info.end_index();
            if last {
                let mut active = Segment::open_at(&info.path, contents.valid_len)?;
                let synced_records = info.ends.len() as u64;
                active.mark(synced_records, false)?;
                active.sync()?;
                return Ok(LogFiles::over(dir, Spans::new(closed, info, synced_records), active));
            }
            closed.push(info);
        }
        let path = dir.join(segment_name(start));
        let active = Segment::create(&path)?;
        let info = SegmentFile {
            first: start,
            path,
            ends: Vec::new(),
        };
        Ok(LogFiles::over(dir, Spans::new(closed, info, 0), active))
    }

    fn over(dir: &Path, spans: Spans, active: Segment) -> LogFiles {
        LogFiles {
            dir: dir.to_path_buf(),
            segment_bytes: SEGMENT_BYTES,
            spans: Arc::new(RwLock::new(spans)),
            active,
            unsynced: Vec::new(),
            #[cfg(test)]
            fault: None,
        }
    }

    /// Starts a new segment past `bytes` instead of [`SEGMENT_BYTES`].
    pub fn with_segment_bytes(mut self, bytes: u64) -> LogFiles {
        self.segment_bytes = bytes;
        self
    }

    /// A reader of the records these files hold, for any thread.
    pub fn reader(&self) -> RecordReader {
        RecordReader::new(self.spans.clone())
    }

    /// The index the next record gets.
    pub fn next_index(&self) -> u64 {
        self.spans.read().next_index()
    }

    /// Appends records `first..first + payloads.len()` (not yet durable: see [`LogFiles::sync`]).
    /// A `first` past the end (a replica that installed a snapshot newer than its log) starts
    /// the log afresh there: every segment before is covered by that snapshot and deleted.
    pub fn append(&mut self, first: u64, payloads: &[Vec<u8>]) -> Result<(), LogError> {
        #[cfg(test)]
        self.injected_fault()?;
        if first > self.next_index() {
            self.restart_at(first)?;
        }
        if first != self.next_index() {
            return Err(LogError::OutOfOrder {
                first,
                next: self.next_index(),
            });
        }
        if self.active.bytes() >= self.segment_bytes {
            self.rotate()?;
        }
        self.active.append(payloads)?;
        let mut spans = self.spans.write();
        let mut end = spans.active.ends.last().copied().unwrap_or(segment::HEADER_LEN as u64);
        for p in payloads {
            end += (segment::RECORD_HEADER_LEN + p.len()) as u64;
            spans.active.ends.push(end);
        }
        Ok(())
    }

    /// Takes back the records from `index` on (a replica's entries that its new leader
    /// does not have). Only records of the active segment can be taken back: older ones are
    /// committed, and raft never takes committed entries back.
    pub fn truncate_from(&mut self, index: u64) -> Result<(), LogError> {
        let spans = self.spans.clone();
        let mut spans = spans.write();
        if index >= spans.next_index() {
            return Ok(());
        }
        if index < spans.active.first {
            return Err(LogError::TakeBackCommitted {
                index,
                active_first: spans.active.first,
            });
        }
        let keep = (index - spans.active.first) as usize;
        self.active = Segment::open_at(&spans.active.path, spans.active.start_of(keep))?;
        spans.active.ends.truncate(keep);
        let unsynced_kept = keep.saturating_sub(spans.synced_records as usize);
        self.unsynced.truncate(unsynced_kept);
        // Records taken back were durable, maybe: the mark must not claim them any more.
        spans.synced_records = spans.synced_records.min(keep as u64);
        self.active.mark(spans.synced_records, false)?;
        self.active.sync()?;
        Ok(())
    }

    /// Deletes every segment and starts a new one at `first`.
    fn restart_at(&mut self, first: u64) -> Result<(), LogError> {
        let path = self.dir.join(segment_name(first));
        let next = Segment::create(&path)?;
        let spans = self.spans.clone();
        let mut spans = spans.write();
        let old = std::mem::replace(
            &mut spans.active,
            SegmentFile {
                first,
                path,
                ends: Vec::new(),
            },
        );
        spans.synced_records = 0;
        self.active = next;
        self.unsynced.clear();
        for s in std::mem::take(&mut spans.closed).into_iter().chain([old]) {
            std::fs::remove_file(&s.path).map_err(|source| LogError::Dir {
                dir: s.path.clone(),
                what: "remove a segment a snapshot covers",
                source,
            })?;
        }
        super::sync_dir(&self.dir).map_err(|source| LogError::Dir {
            dir: self.dir.clone(),
            what: "fsync the directory",
            source,
        })?;
        Ok(())
    }

    fn rotate(&mut self) -> Result<(), LogError> {
        // Sealed: every record durable, and a next segment must follow.
        let (records, first) = {
            let spans = self.spans.read();
            (spans.active.ends.len() as u64, spans.next_index())
        };
        self.active.mark(records, true)?;
        self.active.sync()?;
        self.spans.write().synced_records = records;
        self.unsynced.clear();
        let path = self.dir.join(segment_name(first));
        let next = match Segment::create(&path) {
            Ok(next) => next,
            Err(e) => {
                // No next segment after all: unsealed again (if the disk lets us), so that a
                // restart does not look for one.
                let _ = self.active.mark(records, false).and_then(|()| self.active.sync());
                return Err(e.into());
            }
        };
        let mut spans = self.spans.write();
        let old = std::mem::replace(
            &mut spans.active,
            SegmentFile {
                first,
                path,
                ends: Vec::new(),
            },
        );
        spans.closed.push(old);
        spans.synced_records = 0;
        self.active = next;
        Ok(())
    }

    /// Bytes of every segment on disk.
    pub fn disk_bytes(&self) -> u64 {
        let spans = self.spans.read();
        let closed: u64 = spans.closed.iter().map(|s| s.ends.last().copied().unwrap_or(0)).sum();
        closed + self.active.bytes()
    }

    /// The index of the first record on disk.
    pub fn first_index(&self) -> u64 {
        self.spans.read().first_index()
    }

    /// Makes every appended record durable, and (one fsync behind) says so in the active
    /// segment's mark.
    pub fn sync(&mut self) -> Result<(), LogError> {
        #[cfg(test)]
        self.injected_fault()?;
        let synced = self.spans.read().synced_records;
        self.active.mark(synced, false)?;
        self.active.sync()?;
        let mut spans = self.spans.write();
        spans.synced_records = spans.active.ends.len() as u64;
        self.unsynced.clear();
        Ok(())
    }

    /// Unit tests: fails as a read-only file system does while the fault is set.
    #[cfg(test)]
    fn injected_fault(&self) -> Result<(), LogError> {
        match &self.fault {
            Some(f) if f.load(std::sync::atomic::Ordering::Relaxed) => Err(SegmentError::Io {
                path: self.spans.read().active.path.clone(),
                what: "append records",
                source: std::io::Error::from(std::io::ErrorKind::ReadOnlyFilesystem),
            }
            .into()),
            _ => Ok(()),
        }
    }

    /// Keeps the payloads just appended until the next fsync (see `unsynced`).
    pub fn appended(&mut self, payloads: Vec<Vec<u8>>) {
        if self.spans.read().fsyncs {
            self.unsynced.extend(payloads);
        }
    }

    /// After a failed write or fsync: opens the active segment anew (a new descriptor, for a
    /// file system that came back), cut back to what is known written (the last fsync's
    /// records when the log fsyncs: after a failed fsync the kernel may have dropped the
    /// pages), and writes the records after that again from memory.
    pub fn restore(&mut self) -> Result<(), LogError> {
        {
            let mut spans = self.spans.write();
            let keep = match spans.fsyncs {
                true => spans.synced_records as usize,
                false => spans.active.ends.len(),
            };
            self.active = Segment::open_at(&spans.active.path, spans.active.start_of(keep))?;
            spans.active.ends.truncate(keep);
        }
        let again = std::mem::take(&mut self.unsynced);
        if !again.is_empty() {
            let first = self.next_index();
            if let Err(e) = self.append(first, &again) {
                self.unsynced = again;
                return Err(e);
            }
            self.appended(again);
        }
        Ok(())
    }

    /// Deletes the segments whose records all have indexes up to `index` (they are in a
    /// snapshot); the active segment stays.
    pub fn purge_through(&mut self, index: u64) -> Result<(), LogError> {
        let mut spans = self.spans.write();
        while let Some(s) = spans.closed.first() {
            let last = s.end_index();
            if last == 0 || last - 1 > index {
                break;
            }
            let s = spans.closed.remove(0);
            std::fs::remove_file(&s.path).map_err(|source| LogError::Dir {
                dir: s.path.clone(),
                what: "remove a purged segment",
                source,
            })?;
        }
        Ok(())
    }
}

/// Why an append was not made durable: told to every append of the failed group commit
/// (so it is shared).
#[derive(Debug, Clone, thiserror::Error)]
pub enum AppendError {
    /// The files failed in a way retrying does not mend.
    #[error("cannot {what}: {source}")]
    Failed {
        /// What was being done.
        what: &'static str,
        /// The error.
        source: Arc<LogError>,
    },
    /// The log was stopped while the disk refused writes.
    #[error("the log stopped while the disk refused writes: {0}")]
    StoppedWhileStalled(Arc<LogError>),
    /// The writer thread is gone.
    #[error("the log writer has stopped")]
    WriterGone,
}

/// Work for the writer thread.
enum Job {
    /// Records to append, and who to tell once they are written (and durable).
    Append {
        first: u64,
        payloads: Vec<Vec<u8>>,
        done: Box<dyn FnOnce(Result<(), AppendError>) + Send>,
    },
    /// Delete the segments that only hold records up to this index.
    Purge(u64),
    /// Take back the records from this index on.
    Truncate(u64),
}

/// What the writer has done, for stats.
#[derive(Debug, Clone)]
pub struct WriterFigures {
    /// Fsyncs so far.
    pub fsyncs: u64,
    /// Records appended so far.
    pub records: u64,
    /// Appends (calls) so far.
    pub appends: u64,
    /// Record bytes appended so far (payloads and their headers).
    pub bytes: u64,
    /// Bytes of the segments on disk now.
    pub disk_bytes: u64,
    /// How long fsyncs took: counts per `kvshared::latency` bucket...
    pub fsync_buckets: Vec<u64>,
    /// ...and their sum, ns.
    pub fsync_sum_ns: u64,
}

impl Default for WriterFigures {
    fn default() -> Self {
        WriterFigures {
            fsyncs: 0,
            records: 0,
            appends: 0,
            bytes: 0,
            disk_bytes: 0,
            fsync_buckets: vec![0; kvshared::latency::BUCKETS],
            fsync_sum_ns: 0,
        }
    }
}

/// The writer thread: group commit over [`LogFiles`].
pub struct GroupCommit {
    /// `None` once dropped: the writer then finishes what is queued and ends.
    jobs: Option<mpsc::Sender<Job>>,
    figures: std::sync::Arc<parking_lot::Mutex<WriterFigures>>,
    /// Tells a writer stuck retrying a failing disk to give up (the log is shutting down).
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
    /// Records through here are held by the older snapshot kept (see [`GroupCommit::purge_through`]).
    snapshot_floor: std::sync::atomic::AtomicU64,
    /// Records through here openraft has purged (it no longer reads them, to apply or to
    /// send to a member catching up).
    raft_floor: std::sync::atomic::AtomicU64,
}

impl Drop for GroupCommit {
    /// Ends the writer and waits for it: what was queued is written (or refused, on a disk
    /// that refuses writes) and the files are synced and closed when this returns, so a
    /// reopening of the same files sees everything.
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        self.jobs = None;
        // (A writer's own last reference, dropped on its thread, cannot wait for itself.)
        if let Some(thread) = self.thread.take()
            && thread.thread().id() != std::thread::current().id()
        {
            let _ = thread.join();
        }
    }
}

/// The writer thread's state.
struct Writer {
    files: LogFiles,
    policy: FsyncPolicy,
    figures: std::sync::Arc<parking_lot::Mutex<WriterFigures>>,
    health: std::sync::Arc<DiskHealth>,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    last_sync: Instant,
    dirty: bool,
}

impl GroupCommit {
    /// Starts the writer thread over `files`; a failing disk is retried until it works,
    /// and reported to `health` meanwhile.
    pub fn start(
        files: LogFiles,
        policy: FsyncPolicy,
        health: std::sync::Arc<DiskHealth>,
    ) -> std::io::Result<GroupCommit> {
        let (jobs, rx) = mpsc::channel::<Job>();
        files.spans.write().fsyncs = policy != FsyncPolicy::Never;
        let figures = std::sync::Arc::new(parking_lot::Mutex::new(WriterFigures {
            disk_bytes: files.disk_bytes(),
            ..WriterFigures::default()
        }));
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let mut writer = Writer {
            files,
            policy,
            figures: figures.clone(),
            health,
            stop: stop.clone(),
            last_sync: Instant::now(),
            dirty: false,
        };
        let thread = std::thread::Builder::new()
            .name("log-writer".into())
            .spawn(move || writer.run(rx))?;
        Ok(GroupCommit {
            jobs: Some(jobs),
            figures,
            stop,
            thread: Some(thread),
            snapshot_floor: std::sync::atomic::AtomicU64::new(0),
            raft_floor: std::sync::atomic::AtomicU64::new(0),
        })
    }

    /// Queues records `first..` and calls `done` once they are written (and durable, under
    /// `--fsync always`).
    pub fn append(
        &self,
        first: u64,
        payloads: Vec<Vec<u8>>,
        done: impl FnOnce(Result<(), AppendError>) + Send + 'static,
    ) {
        let job = Job::Append {
            first,
            payloads,
            done: Box::new(done),
        };
        let sent = match &self.jobs {
            Some(jobs) => jobs.send(job),
            None => Err(mpsc::SendError(job)),
        };
        if let Err(mpsc::SendError(Job::Append { done, .. })) = sent {
            done(Err(AppendError::WriterGone));
        }
    }

    /// Takes back, on the writer thread and in order with the appends, the records from
    /// `index` on.
    pub fn truncate_from(&self, index: u64) {
        if let Some(jobs) = &self.jobs {
            let _ = jobs.send(Job::Truncate(index));
        }
    }

    /// Records through `index` are held by the older snapshot kept: their segments may go
    /// once openraft has purged them too ([`GroupCommit::raft_purged`]). Deleted on the
    /// writer thread.
    pub fn purge_through(&self, index: u64) {
        self.snapshot_floor
            .fetch_max(index, std::sync::atomic::Ordering::Relaxed);
        self.purge_below_both();
    }

    /// openraft has purged records through `index`. (It keeps what it still sends to a member
    /// catching up: a segment deleted before that made its reads fail and its core stop.)
    pub fn raft_purged(&self, index: u64) {
        self.raft_floor.fetch_max(index, std::sync::atomic::Ordering::Relaxed);
        self.purge_below_both();
    }

    fn purge_below_both(&self) {
        use std::sync::atomic::Ordering::Relaxed;
        let through = self.snapshot_floor.load(Relaxed).min(self.raft_floor.load(Relaxed));
        if through > 0
            && let Some(jobs) = &self.jobs
        {
            let _ = jobs.send(Job::Purge(through));
        }
    }

    /// What the writer has done so far.
    pub fn figures(&self) -> WriterFigures {
        self.figures.lock().clone()
    }
}

impl Writer {
    fn run(&mut self, rx: mpsc::Receiver<Job>) {
        loop {
            let first = match self.policy {
                FsyncPolicy::EverySecond if self.dirty => match rx.recv_timeout(Duration::from_millis(200)) {
                    Ok(job) => Some(job),
                    Err(mpsc::RecvTimeoutError::Timeout) => None,
                    Err(mpsc::RecvTimeoutError::Disconnected) => break,
                },
                _ => match rx.recv() {
                    Ok(job) => Some(job),
                    Err(_) => break,
                },
            };
            // Everything queued while the last fsync ran goes into this one, in order (a
            // truncation applies between the appends around it).
            let jobs: Vec<Job> = first.into_iter().chain(rx.try_iter()).collect();
            self.commit(jobs);
        }
        let _ = self.files.sync();
    }

    /// Writes a group of jobs, fsyncs as the policy says, and only then completes them.
    fn commit(&mut self, jobs: Vec<Job>) {
        let mut acks = Vec::new();
        let mut purge = None;
        let mut outcome = Ok(());
        let (mut bytes, mut records) = (0u64, 0u64);
        for job in jobs {
            match job {
                Job::Append { first, payloads, done } => {
                    bytes += payloads
                        .iter()
                        .map(|p| (segment::RECORD_HEADER_LEN + p.len()) as u64)
                        .sum::<u64>();
                    records += payloads.len() as u64;
                    if outcome.is_ok() {
                        outcome = self.write(first, payloads);
                    }
                    acks.push(done);
                }
                Job::Purge(through) => purge = purge.max(Some(through)),
                Job::Truncate(from) => {
                    if outcome.is_ok() {
                        outcome = self.retried("take back log records", |f| f.truncate_from(from));
                    }
                }
            }
        }
        let sync_now = match self.policy {
            FsyncPolicy::Always => !acks.is_empty(),
            FsyncPolicy::EverySecond => {
                self.dirty |= !acks.is_empty();
                self.dirty && self.last_sync.elapsed() >= Duration::from_secs(1)
            }
            FsyncPolicy::Never => false,
        };
        let mut took = None;
        if sync_now && outcome.is_ok() {
            let started = Instant::now();
            outcome = self.retried("fsync the log", LogFiles::sync);
            took = Some(started.elapsed());
            self.last_sync = Instant::now();
            self.dirty = false;
        }
        if let Some(through) = purge
            && let Err(e) = self.files.purge_through(through)
        {
            tracing::warn!(error = %e, "could not delete old log segments (they are kept; the next snapshot tries again)");
        }
        self.count(took, acks.len() as u64, records, bytes);
        for done in acks {
            done(outcome.clone());
        }
    }

    /// Appends one job's records, retrying a failing disk.
    fn write(&mut self, first: u64, payloads: Vec<Vec<u8>>) -> Result<(), AppendError> {
        self.retried("append to the log", |f| f.append(first, &payloads))?;
        self.files.appended(payloads);
        Ok(())
    }

    /// Runs `op` until it works: after an I/O error (no space, a read-only or failing file
    /// system) the disk is stalled, the active segment restored, and `op` tried again after
    /// a pause. Other errors, and a log that is shutting down, give up.
    fn retried(
        &mut self,
        what: &'static str,
        mut op: impl FnMut(&mut LogFiles) -> Result<(), LogError>,
    ) -> Result<(), AppendError> {
        let mut backoff = Backoff::default();
        let mut stalled = false;
        loop {
            let error = match op(&mut self.files) {
                Ok(()) => {
                    if stalled {
                        self.health.ok();
                    }
                    return Ok(());
                }
                Err(e) => e,
            };
            let Some(io) = error.io_error() else {
                return Err(AppendError::Failed {
                    what,
                    source: Arc::new(error),
                });
            };
            stalled = true;
            self.health.failed(what, &error.to_string(), io);
            loop {
                if self.stop.load(std::sync::atomic::Ordering::Relaxed) {
                    return Err(AppendError::StoppedWhileStalled(Arc::new(error)));
                }
                std::thread::sleep(backoff.next_pause());
                match self.files.restore() {
                    Ok(()) => break,
                    Err(e) => match e.io_error() {
                        Some(io) => self.health.failed(what, &e.to_string(), io),
                        None => {
                            return Err(AppendError::Failed {
                                what,
                                source: Arc::new(e),
                            });
                        }
                    },
                }
            }
        }
    }

    fn count(&self, took: Option<Duration>, appends: u64, records: u64, bytes: u64) {
        let mut f = self.figures.lock();
        if let Some(took) = took {
            f.fsyncs += 1;
            let ns = u64::try_from(took.as_nanos()).unwrap_or(u64::MAX);
            if let Some(c) = f.fsync_buckets.get_mut(kvshared::latency::bucket_of(ns)) {
                *c += 1;
            }
            f.fsync_sum_ns = f.fsync_sum_ns.saturating_add(ns);
        }
        f.appends += appends;
        f.records += records;
        f.bytes += bytes;
        f.disk_bytes = self.files.disk_bytes();
    }
}

impl LogError {
    /// The operating system's error, when the disk failed (rather than the log's contents).
    pub fn io_error(&self) -> Option<&std::io::Error> {
        match self {
            LogError::Segment(SegmentError::Io { source, .. }) | LogError::Dir { source, .. } => Some(source),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every record read back, with its index.
    type Records = Vec<(u64, Vec<u8>)>;

    /// Opens the log and collects every record it reads back.
    fn open_all(dir: &Path, start: u64) -> Result<(LogFiles, Records), LogError> {
        let mut records = Vec::new();
        let files = LogFiles::open(
            dir,
            start,
            &mut |i, r| {
                records.push((i, r));
                Ok(())
            },
            &mut |i, r| {
                // Test records are bytes of no format: an "upgrade" marks them.
                let mut up = b"up:".to_vec();
                up.extend(r);
                let _ = i;
                Ok(up)
            },
        )?;
        Ok((files, records))
    }

    fn scratch() -> kvtestkit::Scratch {
        kvtestkit::scratch("log")
    }

    #[test]
    fn records_survive_a_reopen_across_segments_and_purges_drop_whole_files() {
        let dir = scratch();
        let (log, rec) = open_all(&dir, 1).unwrap();
        let mut log = log.with_segment_bytes(64 << 10);
        assert!(rec.is_empty());
        let big = vec![7u8; 5 << 10];
        for i in 1..=30u64 {
            log.append(i, std::slice::from_ref(&big)).unwrap();
        }
        log.sync().unwrap();
        let segments = std::fs::read_dir(&dir).unwrap().count();
        assert!(segments >= 2, "{segments} segments for 150 KB");
        drop(log);
        let (mut log, rec) = open_all(&dir, 1).unwrap();
        assert_eq!(rec.len(), 30);
        assert_eq!(rec.last().unwrap().0, 30);
        assert_eq!(log.next_index(), 31);
        log.purge_through(20).unwrap();
        drop(log);
        let (log, rec) = open_all(&dir, 1).unwrap();
        assert!(rec.first().unwrap().0 > 1, "purged records are gone");
        assert!(rec.first().unwrap().0 <= 21, "records after the purge point stay");
        assert_eq!(log.next_index(), 31);
    }

    /// Records are read back from their files across segments, each checksum checked; a
    /// record not yet fsynced, one a purge took off, or one damaged on disk is an error (the
    /// damaged file named), never a panic or a wrong payload.
    #[test]
    fn records_read_back_across_segments_and_damage_is_refused() {
        let dir = scratch();
        let (log, _) = open_all(&dir, 1).unwrap();
        let mut log = log.with_segment_bytes(16 << 10);
        let payload = |i: u64| vec![i as u8; 100 + (i as usize * 37) % 3000];
        for i in 1..=60u64 {
            log.append(i, &[payload(i)]).unwrap();
        }
        let reader = log.reader();
        assert!(
            reader.read(60, 61).is_err(),
            "the active segment's records are not readable before their fsync"
        );
        assert!(reader.read(1, 2).is_ok(), "a rotation fsyncs the closed segment");
        log.sync().unwrap();
        assert!(std::fs::read_dir(&dir).unwrap().count() >= 3);
        for (start, end) in [(1, 61), (5, 6), (17, 44), (60, 61), (3, 3)] {
            let back = reader.read(start, end).unwrap();
            assert_eq!(back, (start..end).map(payload).collect::<Vec<_>>(), "{start}..{end}");
        }
        assert!(reader.read(60, 62).is_err(), "past the end");
        log.purge_through(30).unwrap();
        assert!(reader.read(1, 2).is_err(), "purged");
        // A flipped byte in a record still on disk.
        let last = std::fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().path())
            .max()
            .unwrap();
        let mut bytes = std::fs::read(&last).unwrap();
        let n = bytes.len();
        bytes[n - 5] ^= 0xff;
        std::fs::write(&last, bytes).unwrap();
        let e = reader.read(60, 61).unwrap_err();
        assert!(
            matches!(&e, LogError::Segment(segment::SegmentError::Corrupt { path, .. }) if *path == last),
            "{e}"
        );
    }

    #[test]
    fn group_commit_completes_every_append_with_fewer_fsyncs_than_appends() {
        let dir = scratch();
        let (log, _) = open_all(&dir, 1).unwrap();
        let writer = GroupCommit::start(log, FsyncPolicy::Always, Default::default()).unwrap();
        let (tx, rx) = mpsc::channel();
        for i in 1..=2000u64 {
            let tx = tx.clone();
            writer.append(i, vec![i.to_le_bytes().to_vec()], move |r| tx.send(r).unwrap());
        }
        for _ in 0..2000 {
            rx.recv().unwrap().unwrap();
        }
        let f = writer.figures();
        assert_eq!((f.records, f.appends), (2000, 2000));
        assert!(f.fsyncs < 2000, "{} fsyncs for 2000 appends: no grouping", f.fsyncs);
        drop(writer);
        let (_, rec) = open_all(&dir, 1).unwrap();
        assert_eq!(rec.len(), 2000);
        assert_eq!(rec[1999], (2000, 2000u64.to_le_bytes().to_vec()));
    }

    /// A disk that refuses writes (here: as a read-only file system) stalls the log: the
    /// append is not completed, the stall is reported, and once the disk takes writes again
    /// the append completes and its records are on disk. Nothing is answered as failed.
    #[test]
    fn a_failing_disk_stalls_the_log_until_it_works_again() {
        let dir = scratch();
        let (mut log, _) = open_all(&dir, 1).unwrap();
        let fault = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        log.fault = Some(fault.clone());
        let health = std::sync::Arc::new(DiskHealth::default());
        let writer = GroupCommit::start(log, FsyncPolicy::Always, health.clone()).unwrap();
        let (tx, rx) = mpsc::channel();
        let t = tx.clone();
        writer.append(1, vec![b"one".to_vec()], move |r| t.send(r).unwrap());
        rx.recv().unwrap().unwrap();
        fault.store(true, std::sync::atomic::Ordering::Relaxed);
        writer.append(2, vec![b"two".to_vec()], move |r| tx.send(r).unwrap());
        assert!(
            rx.recv_timeout(Duration::from_millis(400)).is_err(),
            "answered while the disk refused"
        );
        let refusal = health.refusal().expect("the stall is reported");
        assert!(
            refusal.contains("Read-only file system") || refusal.contains("read-only"),
            "{refusal}"
        );
        fault.store(false, std::sync::atomic::Ordering::Relaxed);
        rx.recv_timeout(Duration::from_secs(10)).unwrap().unwrap();
        assert_eq!(health.refusal(), None);
        assert_eq!(health.figures().stalls, 1);
        drop(writer);
        let (_, rec) = open_all(&dir, 1).unwrap();
        let records: Vec<_> = rec.iter().map(|(i, r)| (*i, r.clone())).collect();
        assert_eq!(records, vec![(1, b"one".to_vec()), (2, b"two".to_vec())]);
    }

    /// A segment cut after kvd wrote it (`truncate`), or a last segment that is gone, is
    /// refused naming the file; a crash's torn tail is not.
    #[test]
    fn a_cut_or_lost_segment_is_refused_naming_the_file() {
        let dir = scratch();
        let (log, _) = open_all(&dir, 1).unwrap();
        let mut log = log.with_segment_bytes(64 << 10);
        for i in 1..=30u64 {
            log.append(i, &[vec![1u8; 10 << 10]]).unwrap();
            log.sync().unwrap();
        }
        drop(log);
        let mut names: Vec<_> = std::fs::read_dir(&dir).unwrap().map(|e| e.unwrap().path()).collect();
        names.sort();
        let last = names.last().unwrap().clone();
        // Cut into its first record (the mark trails the log by one group commit: the
        // segment holds two records, and its mark says one was durable).
        let cut = segment::HEADER_LEN as u64 + 100;
        std::fs::OpenOptions::new()
            .write(true)
            .open(&last)
            .unwrap()
            .set_len(cut)
            .unwrap();
        let e = open_all(&dir, 1).err().unwrap().to_string();
        assert!(e.contains("was cut") && e.contains(&last.display().to_string()), "{e}");
        std::fs::remove_file(&last).unwrap();
        let e = open_all(&dir, 1).err().unwrap().to_string();
        assert!(e.contains("last segment file is missing"), "{e}");
    }

    #[test]
    fn a_missing_segment_is_refused() {
        let dir = scratch();
        let (log, _) = open_all(&dir, 1).unwrap();
        let mut log = log.with_segment_bytes(64 << 10);
        for i in 1..=30u64 {
            log.append(i, &[vec![1u8; 10 << 10]]).unwrap();
        }
        drop(log);
        let mut names: Vec<_> = std::fs::read_dir(&dir).unwrap().map(|e| e.unwrap().path()).collect();
        names.sort();
        assert!(names.len() >= 3);
        std::fs::remove_file(&names[1]).unwrap();
        let e = open_all(&dir, 1).err().unwrap().to_string();
        assert!(e.contains("missing"), "{e}");
    }
}
