use std::time::Duration;

use crate::wire::ErrorCode;

/// Why a client call (or one op of a batch) failed.
///
/// Cloneable so that one node failure can be reported for every op routed to that node.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[allow(missing_docs)] // each variant's message says what it is
pub enum ClientError {
    #[error("cannot connect to {addr}: {reason}")]
    Connect { addr: String, reason: String },
    #[error("node {addr} is down: {reason}")]
    NodeDown { addr: String, reason: String },
    /// Not sent: the node failed a moment ago and is not tried again until `retry_in` passes.
    #[error("node {addr} is down (not tried again for {retry_in:?})")]
    Unavailable { addr: String, retry_in: Duration },
    /// Not sent: the node has left earlier requests unanswered for `silent_for` (stopped,
    /// or far behind), so new ones fail at once instead of queueing behind them.
    #[error("{addr} has answered nothing for {silent_for:?} (stopped or overloaded?); not sent")]
    Stalled { addr: String, silent_for: Duration },
    /// Not run: this member of a replica group is not its leader (`leader` names it when
    /// the member knows).
    #[error("{addr} is not the leader of its group{}", leader.as_ref().map_or(String::new(), |l| format!(" ({l} is)")))]
    NotLeader { addr: String, leader: Option<String> },
    #[error("no answer from {addr} within {after:?}")]
    Timeout { addr: String, after: Duration },
    #[error("request of {len} bytes exceeds the frame limit of {max} bytes; use smaller batches")]
    FrameTooLarge { len: usize, max: u32 },
    #[error("cannot encode the request: {reason}")]
    Encode { reason: String },
    #[error("protocol error with {addr}: {reason}")]
    Protocol { addr: String, reason: String },
    #[error("{addr} refused the request ({code:?}): {message}")]
    Server {
        addr: String,
        code: ErrorCode,
        message: String,
    },
    #[error(
        "{addr} does not own this key's slot: shard group {owner} does (epoch {epoch}), and --nodes lists {listed} groups{}",
        moved_hint(*owner, *listed)
    )]
    Moved {
        addr: String,
        owner: u32,
        epoch: u32,
        /// How many groups the client was given.
        listed: u32,
    },
    #[error("{addr} kept answering that the key's slot is being handed over (not run); try again")]
    TryAgain { addr: String },
    #[error(
        "{addr} found the value but it did not fit in the reply (over the server's frame limit); read it in a smaller batch"
    )]
    ReplyTooLarge { addr: String },
    #[error("{addr} had no memory for the op; it was not run")]
    OutOfMemory { addr: String },
    #[error("{addr} rejected the op as malformed: {reason}")]
    MalformedOp { addr: String, reason: String },
    #[error("invalid node list: {0}")]
    BadNodes(String),
}

impl ClientError {
    /// A short stable name for the kind of error, for counting errors by kind.
    pub fn kind(&self) -> &'static str {
        match self {
            ClientError::Connect { .. } => "connect",
            ClientError::NodeDown { .. } => "node_down",
            ClientError::Unavailable { .. } => "node_down",
            ClientError::Timeout { .. } => "timeout",
            ClientError::Stalled { .. } => "stalled",
            ClientError::NotLeader { .. } => "not_leader",
            ClientError::FrameTooLarge { .. } => "frame_too_large",
            ClientError::Encode { .. } => "encode",
            ClientError::Protocol { .. } => "protocol",
            ClientError::Server {
                code: ErrorCode::ShuttingDown,
                ..
            } => "shutting_down",
            ClientError::Server {
                code: ErrorCode::AuthRequired | ErrorCode::AuthFailed,
                ..
            } => "auth",
            ClientError::Server { .. } => "server",
            ClientError::Moved { .. } => "wrong_shard",
            ClientError::TryAgain { .. } => "try_again",
            ClientError::MalformedOp { .. } => "malformed_op",
            ClientError::ReplyTooLarge { .. } => "reply_too_large",
            ClientError::OutOfMemory { .. } => "out_of_memory",
            ClientError::BadNodes(_) => "bad_nodes",
        }
    }

    /// Whether the op may have taken effect although no success came back, so that a
    /// history checker must treat its outcome as unknown.
    ///
    /// Any failure after the request may have left the client is unknown: the node may have
    /// applied it and then died, stalled, or sent a reply we could not read. Only failures
    /// that prove the node did not run the op (it was never sent, or the node refused it
    /// without running it) are definite.
    pub fn outcome_unknown(&self) -> bool {
        match self {
            ClientError::NodeDown { .. } | ClientError::Timeout { .. } | ClientError::Protocol { .. } => true,
            ClientError::Connect { .. }
            | ClientError::Unavailable { .. }
            | ClientError::Stalled { .. }
            | ClientError::NotLeader { .. }
            | ClientError::FrameTooLarge { .. }
            | ClientError::Encode { .. }
            | ClientError::Server { .. }
            | ClientError::Moved { .. }
            | ClientError::TryAgain { .. }
            | ClientError::MalformedOp { .. }
            | ClientError::ReplyTooLarge { .. }
            | ClientError::OutOfMemory { .. }
            | ClientError::BadNodes(_) => false,
        }
    }
}

/// Why a client could not follow a redirect: a group it was not given, or redirects that
/// went round in circles (a node list in another order than the cluster's).
fn moved_hint(owner: u32, listed: u32) -> String {
    match owner < listed {
        true => " (the redirects went round: is --nodes in shard order?)".to_string(),
        false => format!(": list every group, in shard order (group {owner} is missing)"),
    }
}
