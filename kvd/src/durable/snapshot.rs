//! Snapshot files: the whole store at one log index, written so that a crash at any moment
//! leaves either the old snapshot or the new one, never half of one.
//!
//! Layout: `[magic 8][version u32][reserved u32][meta length u32][meta][data][data length u64]
//! [crc32 of everything before u32]`: the data's length comes after it so that a large store
//! streams to the file a map shard at a time. Written to `NAME.tmp`, fsynced, renamed to
//! `NAME`, and the directory fsynced.

use std::fs::File;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};

use super::direct::DirectWriter;

/// Bytes that open every snapshot file.
pub const MAGIC: [u8; 8] = *b"KVDSNAP\0";
/// The snapshot format this kvd writes and reads.
/// 2: the data holds each map shard's last log entry (see `store::dump`).
pub const FORMAT_VERSION: u32 = 2;

/// Why a snapshot could not be read or written.
#[derive(Debug, thiserror::Error)]
pub enum SnapshotError {
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
    /// The file is not a whole, valid snapshot of a version this kvd reads.
    #[error(
        "{path}: not a valid snapshot ({why}); kvd falls back to an older snapshot if there is one, and refuses to start otherwise"
    )]
    Invalid {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        why: String,
    },
}

/// What a snapshot holds: opaque metadata (the log position it stands for) and the data.
#[derive(Debug, PartialEq, Eq)]
pub struct Snapshot {
    /// Metadata (e.g. the last log id and membership), encoded by the caller.
    pub meta: Vec<u8>,
    /// The store's contents, encoded by the caller.
    pub data: Vec<u8>,
}

/// Writes `snapshot` as `path` atomically (temporary file, fsync, rename, fsync directory).
pub fn write(path: &Path, snapshot: &Snapshot) -> Result<u64, SnapshotError> {
    let mut w = SnapshotWriter::create(path, &snapshot.meta)?;
    w.write_data(&snapshot.data)?;
    w.finish()
}

/// A snapshot being written: the data goes in piece by piece; [`SnapshotWriter::finish`]
/// makes it durable and puts it in place. Dropped unfinished, it leaves only `NAME.tmp`.
pub struct SnapshotWriter {
    path: PathBuf,
    tmp: PathBuf,
    file: DirectWriter,
    hasher: crc32fast::Hasher,
    data_len: u64,
    written: u64,
}

impl SnapshotWriter {
    /// Starts `path` (as `path.tmp`) with its metadata.
    pub fn create(path: &Path, meta: &[u8]) -> Result<SnapshotWriter, SnapshotError> {
        let tmp = path.with_extension("tmp");
        let file = DirectWriter::create(&tmp).map_err(|source| SnapshotError::Io {
            path: tmp.clone(),
            what: "create",
            source,
        })?;
        let mut w = SnapshotWriter {
            path: path.to_path_buf(),
            tmp,
            file,
            hasher: crc32fast::Hasher::new(),
            data_len: 0,
            written: 0,
        };
        w.put(&MAGIC)?;
        w.put(&FORMAT_VERSION.to_le_bytes())?;
        w.put(&0u32.to_le_bytes())?;
        w.put(&(meta.len() as u32).to_le_bytes())?;
        w.put(meta)?;
        Ok(w)
    }

    fn put(&mut self, bytes: &[u8]) -> Result<(), SnapshotError> {
        self.hasher.update(bytes);
        self.written += bytes.len() as u64;
        self.file.write_all(bytes).map_err(|source| SnapshotError::Io {
            path: self.tmp.clone(),
            what: "write",
            source,
        })
    }

    /// Appends data.
    pub fn write_data(&mut self, bytes: &[u8]) -> Result<(), SnapshotError> {
        self.data_len += bytes.len() as u64;
        self.put(bytes)
    }

    /// Ends the file, fsyncs it, renames it into place and fsyncs the directory; returns
    /// the file's size.
    pub fn finish(mut self) -> Result<u64, SnapshotError> {
        let fail = |p: &Path, what: &'static str| {
            let p = p.to_path_buf();
            move |source| SnapshotError::Io { path: p, what, source }
        };
        let len = self.data_len.to_le_bytes();
        self.put(&len)?;
        let crc = self.hasher.clone().finalize().to_le_bytes();
        self.put(&crc)?;
        let file = self.file.finish().map_err(fail(&self.tmp, "write"))?;
        file.sync_all().map_err(fail(&self.tmp, "fsync"))?;
        drop(file);
        std::fs::rename(&self.tmp, &self.path).map_err(fail(&self.path, "rename into place"))?;
        if let Some(dir) = self.path.parent() {
            super::sync_dir(dir).map_err(fail(dir, "fsync the directory"))?;
        }
        Ok(self.written)
    }
}

/// Reads and checks a snapshot; every length is checked against the file before use.
pub fn read(path: &Path) -> Result<Snapshot, SnapshotError> {
    let invalid = |why: String| SnapshotError::Invalid {
        path: path.to_path_buf(),
        why,
    };
    let mut bytes = Vec::new();
    File::open(path)
        .and_then(|mut f| f.read_to_end(&mut bytes))
        .map_err(|source| SnapshotError::Io {
            path: path.to_path_buf(),
            what: "read",
            source,
        })?;
    let (body, crc) = bytes
        .split_last_chunk::<4>()
        .ok_or_else(|| invalid("shorter than a header".into()))?;
    if body.get(..8) != Some(&MAGIC[..]) {
        return Err(invalid("bad magic: not a kvd snapshot".into()));
    }
    let u32_at = |at: usize| {
        body.get(at..at + 4)
            .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    };
    let version = u32_at(8).ok_or_else(|| invalid("cut short".into()))?;
    if version != FORMAT_VERSION {
        return Err(invalid(format!(
            "format version {version}; this kvd reads version {FORMAT_VERSION}"
        )));
    }
    if crc32fast::hash(body) != u32::from_le_bytes(*crc) {
        return Err(invalid(
            "checksum mismatch: the file is damaged or was cut short".into(),
        ));
    }
    let meta_len = u32_at(16).ok_or_else(|| invalid("cut short".into()))? as usize;
    let meta = body
        .get(20..20 + meta_len)
        .ok_or_else(|| invalid("metadata runs past the end".into()))?
        .to_vec();
    let data_start = 20 + meta_len;
    let (before_len, len) = body
        .split_last_chunk::<8>()
        .filter(|(before, _)| before.len() >= data_start)
        .ok_or_else(|| invalid("cut short".into()))?;
    let data_end = before_len.len();
    if u64::from_le_bytes(*len) != (data_end - data_start) as u64 {
        return Err(invalid(format!(
            "the data length says {} bytes but {} are there",
            u64::from_le_bytes(*len),
            data_end - data_start
        )));
    }
    // The data is moved, not copied: a large store is not held twice.
    bytes.truncate(data_end);
    bytes.drain(..data_start);
    Ok(Snapshot { meta, data: bytes })
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn scratch() -> kvtestkit::Scratch {
        kvtestkit::scratch_file("snapshot", "snap-1.snap")
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]

        #[test]
        fn snapshots_round_trip_and_any_damage_is_refused(
            meta in prop::collection::vec(any::<u8>(), 0..100),
            data in prop::collection::vec(any::<u8>(), 0..3000),
            pick in any::<prop::sample::Index>(),
            cut in any::<prop::sample::Index>(),
        ) {
            let path = scratch();
            let snap = Snapshot { meta, data };
            write(&path, &snap).unwrap();
            prop_assert!(!path.with_extension("tmp").exists());
            prop_assert_eq!(read(&path).unwrap(), snap);
            let good = std::fs::read(&path).unwrap();
            let mut flipped = good.clone();
            flipped[pick.index(good.len())] ^= 0x01;
            std::fs::write(&path, &flipped).unwrap();
            let e = read(&path).unwrap_err().to_string();
            prop_assert!(e.contains("snap-1.snap"), "{}", e);
            std::fs::write(&path, &good[..cut.index(good.len())]).unwrap();
            prop_assert!(read(&path).is_err());
        }
    }
}
