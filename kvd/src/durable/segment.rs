//! Log segment files: a header, then records of
//! `[payload length u32][payload crc32 u32][crc32 of those 8 bytes u32][payload]`.
//!
//! The header ends with a *mark*, rewritten in place before each fsync: how many records
//! were already durable (as of the fsync before), and whether the segment is sealed (closed
//! by rotation: a next segment must follow). Reading back, a segment that holds fewer records
//! than its mark, or a sealed last segment, was cut or lost after kvd wrote it (a crash can
//! only tear what was not yet fsynced): refused, naming the file.
//!
//! A segment is appended to and fsynced by one writer; many records go in one `write` and one
//! `fdatasync` (group commit is the caller's: it hands over everything queued at once).
//! Reading a segment back validates the header and every record; see [`read`] for what
//! counts as a torn tail and what as corruption.

use std::fs::{File, OpenOptions};
use std::io::{Read, Write};
use std::path::{Path, PathBuf};

/// Bytes that open every segment file.
pub const MAGIC: [u8; 8] = *b"KVDLOG\0\0";
/// The segment format this kvd writes (3: each record's payload starts with a byte naming
/// its encoding, the log's own entry format; 2: the header's durable mark).
pub const FORMAT_VERSION: u32 = 3;
/// The oldest segment format this kvd reads (its records are upgraded to the current
/// format when the log is opened: see `LogFiles::open`).
pub const OLDEST_READ: u32 = 2;
/// Size of the file header: magic, version, reserved, then the mark: durable records (u64),
/// sealed (u32), and the mark's crc32 (u32).
pub const HEADER_LEN: usize = 32;
/// Where the mark starts in the header.
const MARK_AT: usize = 16;
/// Size of a record's header: payload length, payload checksum, and the header's own
/// checksum (so that a damaged length is seen as damage, not as a record cut short).
pub const RECORD_HEADER_LEN: usize = 12;
/// A last record whose checksum fails is a torn tail only if its payload ends in at least
/// this many zero bytes (blocks allocated but never written by a crash); otherwise it is
/// damage, refused.
const ZERO_TAIL: usize = 16;
/// The largest payload a record may have (a batch of writes is far smaller).
pub const MAX_PAYLOAD: usize = 1 << 30;

/// Why a segment could not be read or written.
#[derive(Debug, thiserror::Error)]
pub enum SegmentError {
    /// The file system failed.
    #[error("{path}: cannot {what}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// What was being done.
        what: &'static str,
        /// The error.
        source: std::io::Error,
    },
    /// Not a segment file at all.
    #[error("{path}: not a kvd log segment (bad magic); is --data-dir the right directory?")]
    BadMagic {
        /// The file.
        path: PathBuf,
    },
    /// Written by another format version.
    #[error(
        "{path}: log format version {found}; this kvd reads versions {OLDEST_READ} to {FORMAT_VERSION}: run the kvd that wrote it (docs/UPGRADING.md), or start from an empty data directory"
    )]
    Version {
        /// The file.
        path: PathBuf,
        /// The version found.
        found: u32,
    },
    /// The file holds fewer records than were written and fsynced before (truncated, or its
    /// header cut): never a crash's torn tail.
    #[error(
        "{path}: holds {found} whole records but {durable} were written and fsynced to it before: the file was cut (truncated or damaged) after kvd wrote it. kvd will not serve a shortened history. Restore this data directory from a copy, or move it away to start this shard empty (losing its data)"
    )]
    Cut {
        /// The file.
        path: PathBuf,
        /// Records it holds.
        found: u64,
        /// Records its mark says were durable.
        durable: u64,
    },
    /// Damage that is not a torn tail: refusing is the only safe answer.
    #[error(
        "{path}: corrupt log record at byte {offset} ({why}), with data after it: the log is damaged before its end. kvd will not serve a shortened history. Restore this data directory from a copy, or move it away to start this shard empty (losing its data)"
    )]
    Corrupt {
        /// The file.
        path: PathBuf,
        /// Where the bad record starts.
        offset: u64,
        /// What is wrong with it.
        why: &'static str,
    },
}

fn io<'a>(path: &'a Path, what: &'static str) -> impl FnOnce(std::io::Error) -> SegmentError + 'a {
    move |source| SegmentError::Io {
        path: path.to_path_buf(),
        what,
        source,
    }
}

/// A segment open for appending.
pub struct Segment {
    path: PathBuf,
    file: File,
    len: u64,
    buf: Vec<u8>,
    /// Bytes from [`PAGE`] up to here are durable and out of the page cache (see `sync`).
    uncached_to: u64,
}

/// The page cache's unit: the first page (the header's mark is rewritten in place) and the
/// last partial one (appended to next) stay cached.
const PAGE: u64 = 4096;

impl Segment {
    /// Creates a new, empty segment (its header fsynced, and the directory entry too).
    pub fn create(path: &Path) -> Result<Segment, SegmentError> {
        let mut file = OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(path)
            .map_err(io(path, "create the segment"))?;
        let mut header = [0u8; HEADER_LEN];
        header[..8].copy_from_slice(&MAGIC);
        header[8..12].copy_from_slice(&FORMAT_VERSION.to_le_bytes());
        header[MARK_AT..].copy_from_slice(&mark_bytes(0, false));
        file.write_all(&header).map_err(io(path, "write the header"))?;
        file.sync_all().map_err(io(path, "fsync the header"))?;
        if let Some(dir) = path.parent() {
            super::sync_dir(dir).map_err(io(dir, "fsync the directory"))?;
        }
        Ok(Segment {
            path: path.to_path_buf(),
            file,
            len: HEADER_LEN as u64,
            buf: Vec::new(),
            uncached_to: PAGE,
        })
    }

    /// Opens an existing segment for appending at `len` (its valid length, from [`read`]).
    pub fn open_at(path: &Path, len: u64) -> Result<Segment, SegmentError> {
        let file = OpenOptions::new()
            .write(true)
            .open(path)
            .map_err(io(path, "open the segment"))?;
        file.set_len(len).map_err(io(path, "cut the segment"))?;
        file.sync_all().map_err(io(path, "fsync the cut"))?;
        let mut seg = Segment {
            path: path.to_path_buf(),
            file,
            len,
            buf: Vec::new(),
            uncached_to: PAGE,
        };
        seg.seek_end()?;
        Ok(seg)
    }

    fn seek_end(&mut self) -> Result<(), SegmentError> {
        use std::io::Seek;
        self.file
            .seek(std::io::SeekFrom::Start(self.len))
            .map_err(io(&self.path, "seek"))?;
        Ok(())
    }

    /// Bytes in the segment.
    pub fn bytes(&self) -> u64 {
        self.len
    }

    /// Appends one record per payload with a single write (not yet durable: see [`Segment::sync`]).
    pub fn append<P: AsRef<[u8]>>(&mut self, payloads: &[P]) -> Result<(), SegmentError> {
        self.buf.clear();
        for p in payloads {
            let p = p.as_ref();
            assert!(
                !p.is_empty() && p.len() <= MAX_PAYLOAD,
                "log payloads are 1 byte to 1 GiB (a caller bug)"
            );
            let mut head = [0u8; RECORD_HEADER_LEN];
            head[..4].copy_from_slice(&(p.len() as u32).to_le_bytes());
            head[4..8].copy_from_slice(&crc32fast::hash(p).to_le_bytes());
            let head_crc = crc32fast::hash(&head[..8]);
            head[8..].copy_from_slice(&head_crc.to_le_bytes());
            self.buf.extend_from_slice(&head);
            self.buf.extend_from_slice(p);
        }
        self.file
            .write_all(&self.buf)
            .map_err(io(&self.path, "append records"))?;
        self.len += self.buf.len() as u64;
        Ok(())
    }

    /// Makes everything appended so far durable (one `fdatasync`), then lets the kernel drop
    /// the whole pages it has just written: the log is read back rarely (a lagging follower,
    /// a restart), and on a small host a page cache that only grows made every append copy
    /// into fresh pages (PERFORMANCE.md, "Snapshots past the page cache").
    pub fn sync(&mut self) -> Result<(), SegmentError> {
        self.file.sync_data().map_err(io(&self.path, "fsync"))?;
        let whole = self.len / PAGE * PAGE;
        if let Some(len) = std::num::NonZeroU64::new(whole.saturating_sub(self.uncached_to)) {
            // Advice only: a kernel that ignores it costs memory, not correctness.
            let _ = rustix::fs::fadvise(&self.file, self.uncached_to, Some(len), rustix::fs::Advice::DontNeed);
            self.uncached_to = whole;
        }
        Ok(())
    }

    /// Rewrites the header's mark in place (durable with the next [`Segment::sync`]): that
    /// `durable_records` records were durable, and whether the segment is `sealed`.
    pub fn mark(&self, durable_records: u64, sealed: bool) -> Result<(), SegmentError> {
        use std::os::unix::fs::FileExt;
        self.file
            .write_all_at(&mark_bytes(durable_records, sealed), MARK_AT as u64)
            .map_err(io(&self.path, "write the header's mark"))
    }
}

/// The mark's bytes: durable records, sealed, and their checksum.
fn mark_bytes(durable_records: u64, sealed: bool) -> [u8; HEADER_LEN - MARK_AT] {
    let mut m = [0u8; HEADER_LEN - MARK_AT];
    m[..8].copy_from_slice(&durable_records.to_le_bytes());
    m[8..12].copy_from_slice(&u32::from(sealed).to_le_bytes());
    let crc = crc32fast::hash(&m[..12]);
    m[12..].copy_from_slice(&crc.to_le_bytes());
    m
}

/// The records of a segment, and whether a torn tail was found (and must be cut).
#[derive(Debug, PartialEq, Eq)]
pub struct Contents {
    /// Every valid record's payload, in order.
    pub records: Vec<Vec<u8>>,
    /// The length of the valid part; shorter than the file when a tail was torn.
    pub valid_len: u64,
    /// Where a torn tail starts (the last segment only).
    pub torn_at: Option<u64>,
    /// How many records the header's mark says were durable.
    pub durable_records: u64,
    /// Whether the segment was sealed by a rotation (a next segment must follow it).
    pub sealed: bool,
    /// The segment format it was written in (between [`OLDEST_READ`] and [`FORMAT_VERSION`]).
    pub format: u32,
}

/// Reads and checks a whole segment.
///
/// In the `last` segment, what a crash in the middle of an append leaves is a torn tail:
/// a record header cut short, a whole header whose record runs past the end of the file,
/// zeros from a record's start to the end, or a final record whose checksum fails and whose
/// payload ends in zeros (blocks allocated, never written). It held no acknowledged data (a
/// record is acknowledged only after its fsync), so it is reported in `torn_at` and left out.
/// Anything else (a damaged header, a checksum that fails with data after it, any bad
/// record in an earlier segment) is [`SegmentError::Corrupt`].
pub fn read(path: &Path, last: bool) -> Result<Contents, SegmentError> {
    let mut file = File::open(path).map_err(io(path, "open the segment"))?;
    let mut bytes = Vec::new();
    file.read_to_end(&mut bytes).map_err(io(path, "read the segment"))?;
    if bytes.get(..8).is_some_and(|m| m != MAGIC) {
        return Err(SegmentError::BadMagic {
            path: path.to_path_buf(),
        });
    }
    let version = bytes.get(8..12).map(|v| u32::from_le_bytes([v[0], v[1], v[2], v[3]]));
    if let Some(found) = version.filter(|v| !(OLDEST_READ..=FORMAT_VERSION).contains(v)) {
        return Err(SegmentError::Version {
            path: path.to_path_buf(),
            found,
        });
    }
    // The header was fsynced when the segment was made: shorter than it, the file was cut.
    let Some(header) = bytes.get(..HEADER_LEN) else {
        return Err(SegmentError::Corrupt {
            path: path.to_path_buf(),
            offset: bytes.len() as u64,
            why: "the file is shorter than a segment header: it was cut",
        });
    };
    let (durable_records, sealed) = read_mark(path, header)?;
    let format = version.unwrap_or(FORMAT_VERSION);
    let mut records = Vec::new();
    let mut at = HEADER_LEN;
    let end = bytes.len();
    let corrupt = |offset: usize, why: &'static str| SegmentError::Corrupt {
        path: path.to_path_buf(),
        offset: offset as u64,
        why,
    };
    while at < end {
        let torn = |records: Vec<Vec<u8>>| Contents {
            records,
            valid_len: at as u64,
            torn_at: Some(at as u64),
            durable_records,
            sealed,
            format,
        };
        if last && bytes[at..].iter().all(|&b| b == 0) {
            return Ok(torn(records));
        }
        let Some(head) = bytes.get(at..at + RECORD_HEADER_LEN) else {
            return if last {
                Ok(torn(records))
            } else {
                Err(corrupt(at, "record header cut short"))
            };
        };
        let word = |i: usize| u32::from_le_bytes([head[i], head[i + 1], head[i + 2], head[i + 3]]);
        if crc32fast::hash(&head[..8]) != word(8) {
            return Err(corrupt(at, "record header checksum mismatch"));
        }
        let len = word(0) as usize;
        if len == 0 || len > MAX_PAYLOAD {
            return Err(corrupt(at, "impossible record length"));
        }
        let body = at + RECORD_HEADER_LEN;
        let Some(payload) = bytes.get(body..body + len) else {
            return if last {
                Ok(torn(records))
            } else {
                Err(corrupt(at, "record runs past the end of the file"))
            };
        };
        if crc32fast::hash(payload) != word(4) {
            let unwritten = payload.len() >= ZERO_TAIL && payload[payload.len() - ZERO_TAIL..].iter().all(|&b| b == 0);
            return if last && body + len == end && unwritten {
                Ok(torn(records))
            } else {
                Err(corrupt(at, "record checksum mismatch"))
            };
        }
        records.push(payload.to_vec());
        at = body + len;
    }
    Ok(Contents {
        records,
        valid_len: end as u64,
        torn_at: None,
        durable_records,
        sealed,
        format,
    })
}

/// Reads back, from a segment being appended to or closed, the whole records that end at
/// `ends` (in order), the first starting at `from`: one positioned read, each record's
/// length and both checksums checked, as [`read`] does. The caller knows where the records
/// are (the log's index of its files); a file that does not hold them is an error naming it.
pub fn read_span(path: &Path, from: u64, ends: &[u64]) -> Result<Vec<Vec<u8>>, SegmentError> {
    use std::os::unix::fs::FileExt;
    let Some(&end) = ends.last() else { return Ok(Vec::new()) };
    let corrupt = |offset: u64, why: &'static str| SegmentError::Corrupt {
        path: path.to_path_buf(),
        offset,
        why,
    };
    let len = end
        .checked_sub(from)
        .and_then(|l| usize::try_from(l).ok())
        .filter(|&l| l <= MAX_PAYLOAD.saturating_mul(2))
        .ok_or_else(|| corrupt(from, "a span of records out of order"))?;
    let file = File::open(path).map_err(io(path, "open the segment"))?;
    let mut bytes = vec![0u8; len];
    file.read_exact_at(&mut bytes, from)
        .map_err(io(path, "read records back"))?;
    let mut records = Vec::with_capacity(ends.len());
    let mut at = from;
    for &record_end in ends {
        let lo = usize::try_from(at.saturating_sub(from)).unwrap_or(usize::MAX);
        let hi = record_end
            .checked_sub(from)
            .and_then(|h| usize::try_from(h).ok())
            .unwrap_or(usize::MAX);
        let record = bytes
            .get(lo..hi)
            .ok_or_else(|| corrupt(at, "a span of records out of order"))?;
        let payload = check_record(record).map_err(|why| corrupt(at, why))?;
        records.push(payload.to_vec());
        at = record_end;
    }
    Ok(records)
}

/// One whole record's payload, its header's and payload's checksums checked.
fn check_record(record: &[u8]) -> Result<&[u8], &'static str> {
    let (Some(head), Some(payload)) = (record.get(..RECORD_HEADER_LEN), record.get(RECORD_HEADER_LEN..)) else {
        return Err("record header cut short");
    };
    let word = |i: usize| u32::from_le_bytes([head[i], head[i + 1], head[i + 2], head[i + 3]]);
    if crc32fast::hash(&head[..8]) != word(8) {
        return Err("record header checksum mismatch");
    }
    if word(0) as usize != payload.len() {
        return Err("record length is not where the log's index says it ends");
    }
    if crc32fast::hash(payload) != word(4) {
        return Err("record checksum mismatch");
    }
    Ok(payload)
}

/// The header's mark: durable records and sealed, checked.
fn read_mark(path: &Path, header: &[u8]) -> Result<(u64, bool), SegmentError> {
    let m = &header[MARK_AT..HEADER_LEN];
    let word = |i: usize| u32::from_le_bytes([m[i], m[i + 1], m[i + 2], m[i + 3]]);
    if crc32fast::hash(&m[..12]) != word(12) {
        return Err(SegmentError::Corrupt {
            path: path.to_path_buf(),
            offset: MARK_AT as u64,
            why: "the header's mark fails its checksum",
        });
    }
    let durable = u64::from_le_bytes([m[0], m[1], m[2], m[3], m[4], m[5], m[6], m[7]]);
    Ok((durable, word(8) != 0))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn scratch(name: &str) -> kvtestkit::Scratch {
        kvtestkit::scratch_file("segment", name)
    }

    fn written(payloads: &[Vec<u8>]) -> (kvtestkit::Scratch, Vec<u64>) {
        let path = scratch("log-1.seg");
        let mut seg = Segment::create(&path).unwrap();
        let mut ends = Vec::new();
        for p in payloads {
            seg.append(&[p]).unwrap();
            ends.push(seg.bytes());
        }
        seg.sync().unwrap();
        (path, ends)
    }

    fn payloads() -> impl Strategy<Value = Vec<Vec<u8>>> {
        prop::collection::vec(prop::collection::vec(any::<u8>(), 1..300), 1..20)
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]

        #[test]
        fn records_round_trip(payloads in payloads()) {
            let (path, _) = written(&payloads);
            let back = read(&path, true).unwrap();
            prop_assert_eq!(back.records, payloads);
            prop_assert_eq!(back.torn_at, None);
        }

        /// Syncs between appends, each letting the kernel drop the whole pages written so
        /// far, and marks rewritten in the first page, lose nothing.
        #[test]
        fn syncing_between_appends_reads_back_everything(
            payloads in prop::collection::vec(prop::collection::vec(any::<u8>(), 1..3000), 1..30),
            syncs in prop::collection::vec(any::<bool>(), 30),
        ) {
            let path = scratch("log-1.seg");
            let mut seg = Segment::create(&path).unwrap();
            for (i, p) in payloads.iter().enumerate() {
                seg.append(&[p]).unwrap();
                if syncs[i] {
                    seg.mark(i as u64, false).unwrap();
                    seg.sync().unwrap();
                }
            }
            seg.sync().unwrap();
            let back = read(&path, true).unwrap();
            prop_assert_eq!(back.records, payloads);
            prop_assert_eq!(back.torn_at, None);
        }

        /// A log cut at any byte (a crash mid-append) keeps every record before the cut
        /// and reports the cut.
        #[test]
        fn a_cut_keeps_every_whole_record_before_it(payloads in payloads(), cut in any::<prop::sample::Index>()) {
            let (path, ends) = written(&payloads);
            let full = std::fs::metadata(&path).unwrap().len();
            let at = HEADER_LEN as u64 + cut.index((full - HEADER_LEN as u64) as usize) as u64;
            std::fs::OpenOptions::new().write(true).open(&path).unwrap().set_len(at).unwrap();
            let back = read(&path, true).unwrap();
            let whole = ends.iter().filter(|&&e| e <= at).count();
            prop_assert_eq!(&back.records[..], &payloads[..whole]);
            let expect_torn = !ends.contains(&at) && at != HEADER_LEN as u64;
            prop_assert_eq!(back.torn_at.is_some(), expect_torn);
            // Reopened at the valid length, appending goes on after the last whole record.
            let mut seg = Segment::open_at(&path, back.valid_len).unwrap();
            seg.append(&[b"after".to_vec()]).unwrap();
            let again = read(&path, true).unwrap();
            prop_assert_eq!(again.records.len(), whole + 1);
        }

        /// A flipped byte anywhere (bit rot, not a crash) is refused with the file's name
        /// and the record's offset, never read as a shorter log.
        #[test]
        fn a_flipped_byte_is_refused_naming_the_file(payloads in payloads(), pick in any::<prop::sample::Index>()) {
            let (path, _) = written(&payloads);
            let mut bytes = std::fs::read(&path).unwrap();
            let at = HEADER_LEN + pick.index(bytes.len() - HEADER_LEN);
            bytes[at] ^= 0x40;
            std::fs::write(&path, &bytes).unwrap();
            for last in [true, false] {
                let e = read(&path, last).unwrap_err();
                prop_assert!(matches!(&e, SegmentError::Corrupt { path: p, .. } if p.as_path() == &*path), "{}", e);
            }
        }

        /// Zeros after the last record (blocks a crash allocated but never wrote) are a torn
        /// tail; the records before them are kept.
        #[test]
        fn trailing_zeros_are_a_torn_tail(payloads in payloads(), zeros in 1usize..5000) {
            let (path, _) = written(&payloads);
            let mut bytes = std::fs::read(&path).unwrap();
            let valid = bytes.len() as u64;
            bytes.extend(std::iter::repeat_n(0u8, zeros));
            std::fs::write(&path, &bytes).unwrap();
            let back = read(&path, true).unwrap();
            prop_assert_eq!(back.records, payloads);
            prop_assert_eq!(back.torn_at, Some(valid));
        }
    }

    #[test]
    fn other_files_and_versions_are_named_and_refused() {
        let path = scratch("log-1.seg");
        std::fs::write(&path, b"hello, this is not a log").unwrap();
        // The text is what an operator reads: tested once, here.
        let e = read(&path, true).unwrap_err();
        assert!(
            matches!(&e, SegmentError::BadMagic { path: p } if p.as_path() == &*path),
            "{e}"
        );
        let e = e.to_string();
        assert!(e.contains("not a kvd log segment") && e.contains("log-1.seg"), "{e}");
        let mut header = [0u8; HEADER_LEN];
        header[..8].copy_from_slice(&MAGIC);
        header[8..12].copy_from_slice(&7u32.to_le_bytes());
        std::fs::write(&path, header).unwrap();
        let e = read(&path, true).unwrap_err();
        assert!(matches!(e, SegmentError::Version { found: 7, .. }), "{e}");
        // A header cut short (`truncate -s 16`) is refused as cut, not read as empty.
        let second = scratch("log-2.seg");
        let seg = Segment::create(&second).unwrap();
        let cut = seg.path.clone();
        drop(seg);
        std::fs::OpenOptions::new()
            .write(true)
            .open(&cut)
            .unwrap()
            .set_len(16)
            .unwrap();
        let e = read(&cut, true).unwrap_err();
        assert!(matches!(e, SegmentError::Corrupt { offset: 16, .. }), "{e}");
        // The mark is read back as written.
        let third = scratch("log-3.seg");
        let mut seg = Segment::create(&third).unwrap();
        seg.append(&[b"x".to_vec()]).unwrap();
        seg.mark(1, true).unwrap();
        let back = read(&seg.path, true).unwrap();
        assert_eq!((back.durable_records, back.sealed), (1, true));
    }
}
