//! Why the engine gave a batch no answer: the one error type every front maps to its
//! protocol (`binary`'s error frames, RESP's `-READONLY`/`-ERR`, HTTP's statuses). An op's
//! own outcome (moved, out of memory, too large, malformed...) is not an error of the
//! batch: it is that op's result in the response (`kvshared::wire::OpReply`).

use crate::durable::raft::SubmitError;

/// Why a batch got no answer. Each variant says whether anything of it ran.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NodeError {
    /// This member does not lead its replica group: nothing of the batch ran; the client
    /// should ask the leader (its address, when this member knows it).
    #[error("not the leader of the group ({})", leader_text(.leader))]
    NotLeader { leader: Option<String> },
    /// The disk refuses writes (full, read-only, failing): nothing of the batch ran; the
    /// OS's reason.
    #[error("{reason}")]
    DiskRefuses { reason: String },
    /// The log failed or stopped after the batch was handed to it: the batch may have been
    /// logged, so its outcome is unknown and it must not be answered as failed.
    #[error("the shard's log failed; the write may or may not have taken effect: {reason}")]
    OutcomeUnknown { reason: String },
}

/// Why a change of settings at run time (`kvd config`) was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConfigError {
    /// A flush of a durable node: it would have to go through the log to survive a restart.
    #[error(
        "a node with --data-dir does not flush (a restart would bring the keys back): restart it on an empty data directory instead"
    )]
    DurableFlush,
}

fn leader_text(leader: &Option<String>) -> String {
    match leader {
        Some(l) => format!("{l} is"),
        None => "none known".into(),
    }
}

impl NodeError {
    /// Whether nothing of the batch ran (the client may send it again, elsewhere or later).
    pub fn nothing_ran(&self) -> bool {
        !matches!(self, NodeError::OutcomeUnknown { .. })
    }
}

impl From<SubmitError> for NodeError {
    fn from(e: SubmitError) -> NodeError {
        match e {
            SubmitError::NotLeader(leader) => NodeError::NotLeader { leader },
            SubmitError::Refused(reason) => NodeError::DiskRefuses { reason },
            SubmitError::Failed(reason) => NodeError::OutcomeUnknown { reason },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The texts users see (RESP's `-ERR`, binary error frames, HTTP bodies carry them).
    #[test]
    fn each_error_says_what_happened() {
        let e = NodeError::from(SubmitError::NotLeader(Some("10.0.0.2:7000".into())));
        assert_eq!(e.to_string(), "not the leader of the group (10.0.0.2:7000 is)");
        assert!(e.nothing_ran());
        let e = NodeError::from(SubmitError::NotLeader(None));
        assert_eq!(e.to_string(), "not the leader of the group (none known)");
        let e = NodeError::from(SubmitError::Refused(
            "the disk refuses writes: No space left on device".into(),
        ));
        assert_eq!(e.to_string(), "the disk refuses writes: No space left on device");
        assert!(e.nothing_ran());
        let e = NodeError::from(SubmitError::Failed("no commit within 3s".into()));
        assert_eq!(
            e.to_string(),
            "the shard's log failed; the write may or may not have taken effect: no commit within 3s"
        );
        assert!(!e.nothing_ran());
    }
}
