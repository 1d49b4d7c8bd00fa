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
//! Serving with `--data-dir` goes through [`raft::DurableShard`] (see `Node::execute`'s
//! neighbours in `node`). Not yet: snapshots, purging and truncating the log on disk, a
//! proposer that coalesces many batches' writes into one entry.

pub mod log;
pub mod raft;
pub mod segment;
pub mod snapshot;

use std::path::Path;

/// Fsyncs a directory, so that a file created or renamed in it survives a power loss.
pub fn sync_dir(dir: &Path) -> std::io::Result<()> {
    std::fs::File::open(dir)?.sync_all()
}
