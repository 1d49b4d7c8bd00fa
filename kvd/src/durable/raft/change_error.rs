//! Why a membership change or a hand-over (`kvd admin`) was not made: told back to the
//! operator as the reply's reason.

use std::time::Duration;

use kvshared::client::ClientError;

/// A membership change that did not happen, and what to do about it.
#[derive(Debug, thiserror::Error)]
#[allow(missing_docs)] // the messages say it
pub enum ChangeError {
    #[error("{addr} is not reachable (is it running with --join?): {source}")]
    Unreachable { addr: String, source: ClientError },
    #[error("{addr} did not say who it is: {answer}")]
    NoIdentity { addr: String, answer: String },
    #[error("{addr} serves shard {theirs}, this group shard {ours}")]
    OtherShard { addr: String, theirs: String, ours: String },
    #[error("this member belongs to no group")]
    NoGroup,
    #[error("{addr} belongs to another group ({group}): a member is in one group for life")]
    OtherGroup { addr: String, group: u64 },
    #[error("{addr} did not join the group: {answer}")]
    NotJoined { addr: String, answer: String },
    /// openraft refused the change; `leader` when it named who leads.
    #[error("{}{why}", leader.as_ref().map_or(String::new(), |l| format!("not the leader any more ({l} is): ")))]
    Raft { leader: Option<String>, why: String },
    #[error(
        "{addr} did not catch up within {limit:?} (is it running with --join, and reachable from the leader?); it stays a learner: remove it with `kvd admin remove-replica`"
    )]
    NoCatchUp { addr: String, limit: Duration },
    #[error("{why} (this member stopped leading while {addr} caught up: ask again)")]
    LeadLostCatchingUp { addr: String, why: String },
    #[error("{addr} is not a learner of this group: add it first")]
    NotALearner { addr: String },
    #[error("{addr} is the group's only voter: add another member before removing it")]
    OnlyVoter { addr: String },
    #[error("no other voter to hand over to")]
    NoOtherVoter,
    #[error("{addr} is not a voter of this group")]
    NotAVoter { addr: String },
    #[error("this member stopped leading while handing over")]
    StoppedLeading,
    #[error("the log kept growing while handing over; try again")]
    LogKeptGrowing,
    #[error("another member was elected; the group has a leader, not the one asked for")]
    OtherElected,
    #[error("the member did not take over within {0:?}; this member leads on")]
    NoTakeOver(Duration),
}
