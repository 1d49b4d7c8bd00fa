//! RESP's texts for what has no answer: the node's refusals and failures (Redis's prefixes,
//! which clients act on), and a slot on the move.

use crate::node::NodeError;
use crate::routed::NoAnswer;

/// Why a command was not run or has no answer, with Redis's text for it (clients and
/// tests written against Redis read these texts).
#[derive(Debug, thiserror::Error)]
pub enum CommandError {
    #[error("ERR value is not an integer or out of range")]
    NotAnInteger,
    #[error("ERR syntax error")]
    Syntax,
    #[error("ERR wrong number of arguments for '{0}' command")]
    WrongArgs(String),
    #[error("ERR invalid expire time in '{0}' command")]
    InvalidExpire(String),
    #[error("ERR Unsupported option {0}")]
    UnsupportedOption(String),
    #[error("ERR GT and LT options at the same time are not compatible")]
    GtAndLt,
    #[error("ERR NX and XX, GT or LT options at the same time are not compatible")]
    NxWithOthers,
    #[error("ERR invalid cursor")]
    InvalidCursor,
    #[error("ERR {0}")]
    Pattern(#[from] kvshared::pattern::PatternError),
    /// FLUSHALL/FLUSHDB without a mode on a durable node.
    #[error(
        "ERR kvd: {0} on a durable node (--data-dir) deletes acknowledged data for good; send {0} SYNC (or ASYNC) to mean it"
    )]
    FlushNeedsMode(String),
    #[error("ERR KEYS would answer more than {keys} keys or {mib} MiB of them; use SCAN")]
    TooManyKeys { keys: usize, mib: usize },
    /// The node (this one or another) has no answer.
    #[error("{}", no_answer(.0))]
    NoAnswer(#[from] NoAnswer),
    /// Node `node` refused a node-wide op.
    #[error("ERR node {node}: {why}")]
    Refused { node: u32, why: String },
    /// A command kvd never queues in MULTI.
    #[error("ERR kvd does not run {0} inside MULTI")]
    NotInMulti(&'static str),
    /// A command that is more than one step (or none) cannot be queued.
    #[error("ERR this command is not run inside MULTI")]
    NotQueueable,
    /// A Redis Cluster redirection (`MOVED`, `ASK`, `TRYAGAIN`, `CROSSSLOT`), as rendered.
    #[error("{0}")]
    Redirected(String),
    /// The error a handler answered, as rendered on the wire.
    #[error("{0}")]
    Answered(String),
    /// Node `node` answered something else than the op's answer.
    #[error("ERR node {node} answered {what}")]
    Unexpected { node: u32, what: String },
}

/// Redis's answer while a slot is being migrated, which cluster clients retry on.
pub(crate) const TRY_AGAIN: &str = "TRYAGAIN the key's slot is being moved to another shard group; try again";

/// RESP's error for an op with no answer (`resp_error` for the node's own reasons).
pub fn no_answer(e: &NoAnswer) -> String {
    match e {
        NoAnswer::Node(e) => resp_error(e),
        other => format!("ERR {other}"),
    }
}

/// RESP's answer to a batch the node could not answer (Redis's prefixes: clients with
/// replica support act on `READONLY` by going to the master; kvd names the leader's binary
/// address, the one it knows).
pub fn resp_error(e: &NodeError) -> String {
    match e {
        NodeError::NotLeader { leader } => format!(
            "READONLY You can't write against a read only replica. (kvd: nothing ran; {})",
            leader
                .as_ref()
                .map_or("no leader is known yet".to_string(), |l| format!(
                    "the group's leader is {l}"
                ))
        ),
        NodeError::DiskRefuses { .. } | NodeError::OutcomeUnknown { .. } => format!("ERR {e}"),
    }
}
