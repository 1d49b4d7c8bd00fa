//! The snapshots in a data directory: their names, which one recovery starts from, and
//! which ones are kept.
//!
//! A snapshot is `snap-<last included index, 20 digits>.snap`. The newest two are kept: the
//! log on disk reaches back to the older one, so if the newest is damaged, the older one plus
//! the log after it still holds every acknowledged write.

use std::path::{Path, PathBuf};

use super::snapshot::{self, Snapshot, SnapshotError};

/// Snapshots kept on disk (the newest, and one to fall back on).
pub const KEPT: usize = 2;

/// The path of the snapshot that ends at log index `index`.
pub fn path(dir: &Path, index: u64) -> PathBuf {
    dir.join(format!("snap-{index:020}.snap"))
}

/// The snapshots in `dir`, newest first, with their last indexes.
pub fn list(dir: &Path) -> std::io::Result<Vec<(u64, PathBuf)>> {
    let mut found: Vec<(u64, PathBuf)> = std::fs::read_dir(dir)?
        .filter_map(|e| e.ok())
        .filter_map(|e| {
            let name = e.file_name().into_string().ok()?;
            let index = name.strip_prefix("snap-")?.strip_suffix(".snap")?.parse().ok()?;
            Some((index, e.path()))
        })
        .collect();
    found.sort_unstable_by_key(|(index, _)| std::cmp::Reverse(*index));
    Ok(found)
}

/// Deletes all but the newest [`KEPT`] snapshots, and any unfinished `.tmp` one; returns
/// the index of the oldest snapshot kept (the log on disk must reach back to it).
pub fn prune(dir: &Path) -> std::io::Result<Option<u64>> {
    let all = list(dir)?;
    for (_, old) in all.iter().skip(KEPT) {
        std::fs::remove_file(old)?;
    }
    for e in std::fs::read_dir(dir)?.filter_map(|e| e.ok()) {
        let name = e.file_name();
        let name = name.to_string_lossy();
        if name.starts_with("snap-") && name.ends_with(".tmp") {
            std::fs::remove_file(e.path())?;
        }
    }
    Ok(all.get(KEPT.min(all.len()).wrapping_sub(1)).map(|(i, _)| *i))
}

/// Why a snapshot that reads back whole cannot be started from.
#[derive(Debug, thiserror::Error)]
pub enum Unusable {
    /// Its metadata does not decode.
    #[error("its metadata does not decode: {0}")]
    Meta(#[from] postcard::Error),
    /// The log entries after it are gone.
    #[error("the log after it is missing (the log on disk starts at entry {first_on_disk})")]
    LogMissing {
        /// The first entry the log on disk holds.
        first_on_disk: u64,
    },
}

/// What [`newest_usable`] found: the snapshot to start from, if any, and why each newer
/// one was passed over.
pub type Found = (Option<(PathBuf, Snapshot)>, Vec<String>);

/// The newest snapshot that reads back whole and that `usable` accepts (the log after it
/// must be there), and why each newer one was passed over. The caller decides whether what
/// is left is enough (the whole log, from entry 0, also is).
pub fn newest_usable(dir: &Path, mut usable: impl FnMut(&Snapshot) -> Result<(), Unusable>) -> std::io::Result<Found> {
    let mut passed_over = Vec::new();
    for (_, path) in list(dir)? {
        let why = match snapshot::read(&path) {
            Ok(snap) => match usable(&snap) {
                Ok(()) => return Ok((Some((path, snap)), passed_over)),
                Err(why) => format!("{}: {why}", path.display()),
            },
            Err(e @ (SnapshotError::Invalid { .. } | SnapshotError::Io { .. })) => e.to_string(),
        };
        passed_over.push(why);
    }
    Ok((None, passed_over))
}
