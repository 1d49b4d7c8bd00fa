//! The raft types of a shard, what a log entry carries and applying it answers, and how the
//! log answers a batch.

use openraft::{BasicNode, Entry, StorageError, StorageIOError};
use serde::{Deserialize, Serialize};

/// The encoded response bodies of an entry's batches, in order (none for raft's own entries).
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct Applied(#[serde(with = "bodies")] pub Vec<Vec<u8>>);

/// A list of bodies, each as bytes: one copy per body. (serde's own `Vec<u8>` is a sequence
/// of `u8`, one call per byte: 16% of a durable node's time under YCSB-A.)
mod bodies {
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(bodies: &[Vec<u8>], s: S) -> Result<S::Ok, S::Error> {
        s.collect_seq(bodies.iter().map(|b| serde_bytes::Bytes::new(b)))
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<Vec<u8>>, D::Error> {
        let bufs = Vec::<serde_bytes::ByteBuf>::deserialize(d)?;
        Ok(bufs.into_iter().map(serde_bytes::ByteBuf::into_vec).collect())
    }
}

openraft::declare_raft_types!(
    /// The raft types of a shard group.
    pub ShardRaft:
        D = crate::durable::entry::LogPayload,
        R = Applied,
        NodeId = u64,
        Node = BasicNode,
        Entry = Entry<ShardRaft>,
        SnapshotData = tokio::fs::File,
        AsyncRuntime = openraft::TokioRuntime,
);

pub(super) type StorageResult<T> = Result<T, StorageError<u64>>;

pub(super) fn io_error(e: impl std::fmt::Display) -> StorageError<u64> {
    StorageError::IO {
        source: StorageIOError::write(&std::io::Error::other(e.to_string())),
    }
}

/// Why the replicated log did not answer a batch submitted to it (not to be confused with
/// `durable::log::LogError`, why the log's files could not be read or written).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SubmitError {
    /// This member does not lead its group (the leader's address, when known): nothing of
    /// the batch ran; the client should ask the leader.
    #[error("not the leader of the group ({})", .0.as_deref().map_or("none known".to_string(), |l| format!("{l} is")))]
    NotLeader(Option<String>),
    /// The log failed; the batch may have been logged (its outcome is unknown).
    #[error("{0}")]
    Failed(String),
    /// The batch was refused before anything of it ran (the disk refuses writes); why.
    #[error("{0}")]
    Refused(String),
}

/// The leader's address from openraft's forward-to-leader hint.
pub(super) fn leader_hint(f: &openraft::error::ForwardToLeader<u64, BasicNode>) -> SubmitError {
    SubmitError::NotLeader(f.leader_node.as_ref().map(|n| n.addr.clone()))
}

/// What the log answers a submitted batch: its encoded response body, or why it failed (the
/// outcome is then unknown: the batch may have been logged).
pub type LogAnswer = Result<Vec<u8>, SubmitError>;
