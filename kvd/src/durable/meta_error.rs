//! Why a data directory's small files (`LOCK`, `shard`, `identity`) refuse it: each says
//! which file and what to do.

use std::path::PathBuf;

use kvshared::routing::ShardId;

/// A data directory refused by its metadata, or a metadata file that could not be written.
#[derive(Debug, thiserror::Error)]
#[allow(missing_docs)] // the messages say it
pub enum MetaError {
    #[error("{}: cannot read {what}: {source}", path.display())]
    Read {
        path: PathBuf,
        what: &'static str,
        source: std::io::Error,
    },
    #[error("{}: {what} is not text: the file is damaged", path.display())]
    NotText { path: PathBuf, what: &'static str },
    #[error(
        "{}: {what} is empty: the file was cut short (a file system crash or repair). kvd writes it \
         atomically, so it never left it so; see docs/LOG_FORMAT.md (\"metadata files\") for how to restore it",
        path.display()
    )]
    Empty { path: PathBuf, what: &'static str },
    #[error("{}: cannot write: {source}", path.display())]
    Write { path: PathBuf, source: std::io::Error },
    #[error("--data-dir {}: not a directory (give a directory, or a path that does not exist yet)", dir.display())]
    NotADirectory { dir: PathBuf },
    #[error("--data-dir {}: cannot create the directory: {source}", dir.display())]
    CreateDir { dir: PathBuf, source: std::io::Error },
    #[error("{}: cannot open the lock file: {source}", path.display())]
    OpenLock { path: PathBuf, source: std::io::Error },
    #[error(
        "{} is in use by {holder}: two kvd processes on one data directory would each acknowledge \
         writes that the other's log loses. Stop that kvd first, or give this one its own --data-dir",
        dir.display()
    )]
    InUse { dir: PathBuf, holder: String },
    #[error("{}: cannot lock: {source}", path.display())]
    Lock { path: PathBuf, source: std::io::Error },
    /// The directory was first started with the other placement (`--no-slots` or not).
    #[error(
        "{} holds shard {shard} started {}, but this kvd was started {}: start it as the directory \
         was first started (a group's slots come from its log, and the start is where that log begins)",
        dir.display(),
        if *no_slots { "with the even split of --shard" } else { "with --no-slots (a group added to a running cluster)" },
        if *no_slots { "with --no-slots" } else { "without --no-slots" }
    )]
    OtherStart {
        dir: PathBuf,
        shard: ShardId,
        no_slots: bool,
    },
    #[error("{} holds shard {found} but this kvd serves --shard {me}: point --data-dir at this shard's directory", dir.display())]
    OtherShard { dir: PathBuf, found: ShardId, me: ShardId },
    #[error(
        "{} holds shard {found} as written by a kvd from before hash slots, which placed keys by \
         another function: under hash slots most of its keys belong to other shards, so this \
         kvd will not serve it (nothing in it is changed). Serve it with the kvd that wrote it, \
         copy its keys out (`redis-cli --scan` against that kvd, or `kvbench`), and load them \
         into a cluster started on fresh directories (docs/CLUSTER.md, \"data directories from before hash slots\")",
        dir.display()
    )]
    BeforeSlots { dir: PathBuf, found: ShardId },
    #[error(
        "{}: the shard file says {found:?}, which is not a shard (`I/N slots`): the file is damaged; \
         write the shard this directory holds into it (e.g. `0/2 slots`) if you know it",
        path.display()
    )]
    DamagedShard { path: PathBuf, found: String },
    #[error(
        "{}: does not read as `member N` and `group N|none`: the file is damaged. Restore the \
         directory from a copy, or move it away and add this member back as a new one \
         (docs/REPLICATION.md, \"a member that lost its disk\")",
        path.display()
    )]
    DamagedIdentity { path: PathBuf },
}

impl From<MetaError> for std::io::Error {
    fn from(e: MetaError) -> std::io::Error {
        let kind = match &e {
            MetaError::Read { source, .. }
            | MetaError::Write { source, .. }
            | MetaError::CreateDir { source, .. }
            | MetaError::OpenLock { source, .. }
            | MetaError::Lock { source, .. } => source.kind(),
            MetaError::NotADirectory { .. } => std::io::ErrorKind::NotADirectory,
            MetaError::InUse { .. } => std::io::ErrorKind::WouldBlock,
            _ => std::io::ErrorKind::InvalidData,
        };
        std::io::Error::new(kind, e)
    }
}
