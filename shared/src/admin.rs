//! The requests about a replica group that operators (`kvd admin`, `kvd manager`) and the
//! members themselves send a member, and their answers: the group-administration half of
//! the members' `RaftRequest`/`RaftResponse` frames, so that the tools that send them are
//! clients of the cluster and need nothing of the server (nor of openraft).
//!
//! On the wire a request travels in the members' raft envelope, postcard-encoded: the
//! group's id, the member's id, then the envelope's variant for a group request (see
//! [`ADMIN_VARIANT`]) and the request. The server's envelope (`kvd::durable::network`)
//! carries these same types; a test there holds the two encodings equal.

use serde::{Deserialize, Serialize};

use crate::client::{ClientError, Cluster};
use crate::frame::FrameKind;

/// Who a request is for: a group and one of its members, or (operators) whoever answers.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Target {
    /// The group's id (0: any).
    pub group: u64,
    /// The member's id (0: any).
    pub member: u64,
}

impl Target {
    /// Whoever answers (an operator's request, or asking a member who it is).
    pub const ANY: Target = Target { group: 0, member: 0 };
}

/// Where a member's raft log ends: the leader that wrote its last entry (term and member)
/// and the entry's index. Encoded as openraft's `LogId<u64>` is.
#[derive(Serialize, Deserialize, Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct LogPosition {
    /// The term of the leader that wrote the last entry.
    pub term: u64,
    /// That leader's member id.
    pub leader: u64,
    /// The last entry's index.
    pub index: u64,
}

/// A change to a replica group (`kvd admin`), carried out by its leader; `Campaign` goes from
/// a leader handing over to the member it hands over to.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
#[allow(missing_docs)] // each variant's fields are said in its own words
pub enum AdminRequest {
    /// Add the member at this address as a learner and answer once it has caught up.
    AddLearner { addr: String, why: String },
    /// Make a learner that has caught up a voter.
    Promote { addr: String, why: String },
    /// Remove a voter or a learner.
    Remove { addr: String, why: String },
    /// Hand the leadership to this voter.
    TransferLeader { addr: String },
    /// Start an election now (sent by the leader that hands over to this member).
    Campaign,
    /// A read index for reads a follower or learner (`member`, its id) is about to serve
    /// (follower reads): answered by the leader after a read-index round, and refused to a
    /// node that is no longer a member (a removed learner may not know it is).
    ReadIndex { member: u64 },
    /// Who are you: answered [`AdminReply::Identity`] by any kvd in a replica group's role.
    Identify,
    /// Belong to this group from now on (written to the data directory before the answer):
    /// sent by `kvd admin init-group` to every member of a new group, and by a leader to a
    /// member it adds. Refused by a member of another group.
    Adopt { group: u64 },
    /// Would you vote for member `candidate`, whose log ends at `last_log`, now (a pre-vote:
    /// nothing changes)? Answered [`AdminReply::PreVote`].
    PreVote {
        candidate: u64,
        last_log: Option<LogPosition>,
    },
    /// Start the group with these members (`(id, address)`): sent by `kvd admin init-group`
    /// to one member, once every member has adopted the group.
    Initialize { members: Vec<(u64, String)> },
}

/// Who a member is (the answer to [`AdminRequest::Identify`]).
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
pub struct MemberIdentity {
    /// Its member id (made with its data directory).
    pub member: u64,
    /// Its group's id, once it belongs to one.
    pub group: Option<u64>,
    /// Whether its raft log holds a membership (the group was initialised and it has heard
    /// of it).
    pub initialised: bool,
    /// Its `--group` list (empty with `--join`).
    pub peers: Vec<String>,
    /// The shard it serves (`I/N`).
    pub shard: String,
}

/// What a member answers an [`AdminRequest`].
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
pub enum AdminReply {
    /// Done; what was done, in words.
    Done(String),
    /// Only the leader carries out changes: this one (when known) leads.
    NotLeader(Option<String>),
    /// The change was refused or failed; why.
    Failed(String),
    /// The leader's read index: a member that has applied this far may serve reads that
    /// arrived before it asked.
    ReadIndex(u64),
    /// Who this member is.
    Identity(MemberIdentity),
    /// The answer to a pre-vote.
    PreVote(bool),
}

/// How a member refuses a request it cannot decode (the start of its refusal's text): an
/// older kvd asked something newer.
pub const UNREADABLE: &str = "not a raft request";

/// The raft envelope's variant that carries an [`AdminRequest`] (after the append, vote and
/// snapshot RPCs).
pub const ADMIN_VARIANT: u32 = 3;
/// The answer envelope's variant of a refusal (a text).
pub const REFUSED_REPLY_VARIANT: u32 = 3;
/// The answer envelope's variant of an [`AdminReply`].
pub const ADMIN_REPLY_VARIANT: u32 = 4;

/// A request's frame body: `request` for `to`, in the members' envelope.
pub fn encode(to: Target, request: &AdminRequest) -> Vec<u8> {
    let mut body = postcard::to_allocvec(&(to.group, to.member, ADMIN_VARIANT)).unwrap_or_default();
    body.extend(postcard::to_allocvec(request).unwrap_or_default());
    body
}

/// A member's answer to a request, from its frame body (a refusal, or an answer that does
/// not decode, as [`AdminReply::Failed`] with why).
pub fn decode_reply(body: &[u8]) -> AdminReply {
    match postcard::take_from_bytes::<u32>(body) {
        Ok((ADMIN_REPLY_VARIANT, rest)) => postcard::from_bytes(rest)
            .unwrap_or_else(|e| AdminReply::Failed(format!("the answer does not decode: {e}"))),
        Ok((REFUSED_REPLY_VARIANT, rest)) => match postcard::from_bytes::<String>(rest) {
            Ok(why) => AdminReply::Failed(why),
            Err(e) => AdminReply::Failed(format!("the answer does not decode: {e}")),
        },
        Ok(_) => AdminReply::Failed("the member answered another kind of request".into()),
        Err(e) => AdminReply::Failed(format!("the answer does not decode: {e}")),
    }
}

/// Asks the member that is `cluster`'s node 0 to carry out `request`, as `to` says (a member
/// of the group asking another names both; an operator asks [`Target::ANY`]).
pub async fn call(cluster: &Cluster, to: Target, request: AdminRequest) -> Result<AdminReply, ClientError> {
    let reply = cluster.call(0, FrameKind::RaftRequest, &encode(to, &request)).await?;
    if reply.kind != FrameKind::RaftResponse {
        return Err(reply.unexpected());
    }
    Ok(decode_reply(&reply.body))
}

/// A new member or group id: random, non-zero, and below 2^53 so that JSON readers keep it
/// exact.
pub fn new_id() -> u64 {
    (rand::random::<u64>() >> 11).max(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every reply round-trips through the envelope; a refusal and garbage come back as
    /// `Failed` with why, never a panic.
    #[test]
    fn replies_decode_from_the_envelope() {
        let reply = AdminReply::Done("added".into());
        let mut body = postcard::to_allocvec(&ADMIN_REPLY_VARIANT).unwrap();
        body.extend(postcard::to_allocvec(&reply).unwrap());
        assert_eq!(decode_reply(&body), reply);
        let mut refused = postcard::to_allocvec(&REFUSED_REPLY_VARIANT).unwrap();
        refused.extend(postcard::to_allocvec(&"no such group".to_string()).unwrap());
        assert_eq!(decode_reply(&refused), AdminReply::Failed("no such group".into()));
        assert!(matches!(decode_reply(&[0xFF; 3]), AdminReply::Failed(_)));
        assert!(matches!(decode_reply(&[]), AdminReply::Failed(_)));
        assert!(matches!(decode_reply(&[0]), AdminReply::Failed(_)));
    }

    #[test]
    fn new_ids_are_nonzero_and_json_exact() {
        for _ in 0..1000 {
            let id = new_id();
            assert!(id > 0 && id < 1 << 53);
        }
    }
}
