//! RESP's texts for what has no answer: the node's refusals and failures (Redis's prefixes,
//! which clients act on), and a slot on the move.

use crate::node::NodeError;
use crate::routed::NoAnswer;

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
