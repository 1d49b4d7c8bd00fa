//! Durable shards (issue 12): log segment files, the numbered log with group commit, snapshot
//! files, and the shard's openraft group over them (`raft`).
//!
//! Files are untrusted input when read back: every length is checked against the file before
//! anything is allocated, every record and snapshot carries a CRC-32, and each file starts
//! with a magic and a format version. A torn tail (the last record of the last segment cut
//! short by a crash) is cut off with a warning naming the file and offset; damage anywhere
//! else is refused with an error that names the file and says what the operator can do.
//! The format is documented in docs/LOG_FORMAT.md.
//!
//! Serving with `--data-dir` goes through [`raft::DurableShard`] (see `Node::execute`).

pub mod bulk;
pub mod catalog;
pub mod direct;
pub mod entry;
pub mod health;
mod legacy;
pub mod log;
pub mod meta;
mod meta_error;
pub mod network;
pub mod raft;
pub mod samples;
pub mod segment;
pub mod snapshot;
pub mod spans;

use std::path::Path;

/// Fsyncs a directory, so that a file created or renamed in it survives a power loss.
pub fn sync_dir(dir: &Path) -> std::io::Result<()> {
    std::fs::File::open(dir)?.sync_all()
}

/// How a durable shard keeps its log.
#[derive(Clone, Debug)]
pub struct DurableConfig {
    /// The log's settings.
    pub log: LogSettings,
    /// `--group`: the replica group this member belongs to (none: a group of one).
    pub group: Option<GroupConfig>,
}

/// How the log is written, snapshotted and cut into segments.
#[derive(Clone, Copy, Debug)]
pub struct LogSettings {
    /// `--fsync`.
    pub fsync: log::FsyncPolicy,
    /// `--snapshot-every`.
    pub snapshot_every: SnapshotEvery,
    /// Start a new log segment past this size ([`log::SEGMENT_BYTES`]; smaller in tests).
    pub segment_bytes: u64,
}

impl Default for LogSettings {
    fn default() -> Self {
        LogSettings {
            fsync: log::FsyncPolicy::Always,
            snapshot_every: SnapshotEvery::Bytes(64 << 20),
            segment_bytes: log::SEGMENT_BYTES,
        }
    }
}

/// A member's replica group. Who the member is (its id) and which group it belongs to are
/// the data directory's (`meta::Identity`), never derived from flags: a member whose disk
/// was wiped is a new member, and a group is initialised once, by `kvd admin init-group`.
#[derive(Clone, Debug)]
pub struct GroupConfig {
    /// `--group`: the members a new group is meant to have (what `kvd admin init-group`
    /// checks); empty with `--join`.
    pub peers: Vec<String>,
    /// The shard this member serves.
    pub shard: kvshared::routing::ShardId,
    /// How to reach the others (timeouts, token, TLS).
    pub client: kvshared::client::ClientConfig,
}

/// `--snapshot-every`: how much log starts a snapshot.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SnapshotEvery {
    /// Bytes of log written since the last snapshot (`64mib`).
    Bytes(u64),
    /// Log entries applied since the last snapshot (`100000entries`).
    Entries(u64),
}

/// Default `--snapshot-every`.
pub const DEFAULT_SNAPSHOT_EVERY: &str = "64mib";

/// A `--snapshot-every` that is not a size or a count of entries.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SnapshotEveryError {
    /// Neither `N entries` nor a size.
    #[error("{text:?}: not a number of entries: {source}")]
    Entries {
        /// What was given.
        text: String,
        /// Why.
        source: std::num::ParseIntError,
    },
    /// Not a size.
    #[error(transparent)]
    Size(#[from] kvshared::cli::SizeError),
    /// Zero.
    #[error("{0:?}: a snapshot needs at least one byte or entry of log")]
    Zero(String),
}

impl std::str::FromStr for SnapshotEvery {
    type Err = SnapshotEveryError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let s = s.trim();
        let every =
            match s.strip_suffix("entries").map(str::trim) {
                Some(n) => SnapshotEvery::Entries(n.replace('_', "").parse().map_err(|source| {
                    SnapshotEveryError::Entries {
                        text: s.to_string(),
                        source,
                    }
                })?),
                None => SnapshotEvery::Bytes(kvshared::cli::parse_size(s)?),
            };
        match every {
            SnapshotEvery::Bytes(0) | SnapshotEvery::Entries(0) => Err(SnapshotEveryError::Zero(s.to_string())),
            every => Ok(every),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn snapshot_every_takes_sizes_and_entry_counts() {
        assert_eq!("64mib".parse(), Ok(SnapshotEvery::Bytes(64 << 20)));
        assert_eq!("1mb".parse(), Ok(SnapshotEvery::Bytes(1_000_000)));
        assert_eq!("100000entries".parse(), Ok(SnapshotEvery::Entries(100_000)));
        assert_eq!("10 entries".parse(), Ok(SnapshotEvery::Entries(10)));
        assert!("0entries".parse::<SnapshotEvery>().is_err());
        assert!("lots".parse::<SnapshotEvery>().is_err());
    }
}
