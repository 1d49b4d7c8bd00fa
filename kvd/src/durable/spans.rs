//! Where each log record lies on disk, and reading records back from there.
//!
//! The log's writer thread alone changes [`Spans`] (appends, rotations, cuts, purges), under
//! the write lock; a [`RecordReader`] reads records back holding the read lock, so no file is
//! cut, rewritten or deleted under a read. Only records below [`Spans::readable_end`] are read
//! back: written and, when the log fsyncs, fsynced, so that restoring the active segment after
//! a failed fsync (which rewrites what followed the last fsync) never changes what a reader
//! can see, and raft never takes them back (they are committed: see the log store).

use std::path::PathBuf;
use std::sync::Arc;

use super::log::LogError;
use super::segment;

/// One segment file and where its records end.
pub(super) struct SegmentFile {
    /// The index of its first record.
    pub first: u64,
    pub path: PathBuf,
    /// End offset of each record, in order.
    pub ends: Vec<u64>,
}

impl SegmentFile {
    /// The index after its last record.
    pub fn end_index(&self) -> u64 {
        self.first + self.ends.len() as u64
    }

    /// Where record `k` of this file starts.
    pub fn start_of(&self, k: usize) -> u64 {
        match k {
            0 => segment::HEADER_LEN as u64,
            k => self.ends.get(k - 1).copied().unwrap_or(segment::HEADER_LEN as u64),
        }
    }
}

/// The log's segment files in order: closed ones, then the one being appended to.
pub struct Spans {
    pub(super) closed: Vec<SegmentFile>,
    pub(super) active: SegmentFile,
    /// Records of the active segment durable as of the last fsync (what the next fsync
    /// writes into the segment's mark).
    pub(super) synced_records: u64,
    /// Whether the log fsyncs (not with `--fsync never`): then only synced records are
    /// readable, and the writer keeps the others to write again after a failed fsync.
    pub(super) fsyncs: bool,
}

impl Spans {
    pub(super) fn new(closed: Vec<SegmentFile>, active: SegmentFile, synced_records: u64) -> Spans {
        Spans {
            closed,
            active,
            synced_records,
            fsyncs: true,
        }
    }

    /// Records below this index can be read back (see the module's note).
    pub fn readable_end(&self) -> u64 {
        match self.fsyncs {
            true => self.active.first + self.synced_records,
            false => self.next_index(),
        }
    }

    /// The index the next record gets.
    pub(super) fn next_index(&self) -> u64 {
        self.active.end_index()
    }

    /// The index of the first record on disk.
    pub(super) fn first_index(&self) -> u64 {
        self.closed.first().map_or(self.active.first, |s| s.first)
    }

    /// The file holding record `index`.
    fn file_of(&self, index: u64) -> Option<&SegmentFile> {
        if index >= self.active.first {
            return (index < self.active.end_index()).then_some(&self.active);
        }
        let after = self.closed.partition_point(|s| s.first <= index);
        let file = self.closed.get(after.checked_sub(1)?)?;
        (index < file.end_index()).then_some(file)
    }
}

/// Reads records back from the segment files (any thread).
#[derive(Clone)]
pub struct RecordReader {
    spans: Arc<parking_lot::RwLock<Spans>>,
}

impl RecordReader {
    pub(super) fn new(spans: Arc<parking_lot::RwLock<Spans>>) -> RecordReader {
        RecordReader { spans }
    }

    /// Records below this index can be read back now.
    pub fn readable_end(&self) -> u64 {
        self.spans.read().readable_end()
    }

    /// The payloads of records `start..end`, read from their files (one read per file) with
    /// every checksum checked. A record not on disk, or not yet readable, is an error.
    pub fn read(&self, start: u64, end: u64) -> Result<Vec<Vec<u8>>, LogError> {
        let spans = self.spans.read();
        if end > spans.readable_end() {
            return Err(LogError::NotWritten {
                end,
                readable_end: spans.readable_end(),
            });
        }
        let mut out = Vec::with_capacity(usize::try_from(end.saturating_sub(start)).unwrap_or(0));
        let mut index = start;
        while index < end {
            let Some(file) = spans.file_of(index) else {
                return Err(LogError::NotOnDisk(index));
            };
            let k = usize::try_from(index - file.first).unwrap_or(usize::MAX);
            let upto = end.min(file.end_index());
            let last = usize::try_from(upto - file.first).unwrap_or(usize::MAX);
            let Some(ends) = file.ends.get(k..last) else {
                return Err(LogError::PastFileEnd(index));
            };
            out.extend(segment::read_span(&file.path, file.start_of(k), ends)?);
            index = upto;
        }
        Ok(out)
    }
}
