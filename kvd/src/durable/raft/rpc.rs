//! Answering what reaches this member in a `RaftRequest` frame: another member's raft RPC,
//! or an operator's (or another member's) admin request. The body is untrusted: it is
//! decoded with postcard, which checks every length, and what does not decode is refused.
//! A raft RPC is taken up only when it is for this member's group and for this member: a
//! member of another group (a typo in `--group`), or one whose disk was wiped and that came
//! back as a new member at the same address, refuses it with a reason.

use std::sync::atomic::Ordering;

use super::shard::DurableShard;
use crate::durable::network::{AdminRequest, RaftMessage, RaftRpc, RaftRpcReply, UNREADABLE};

impl DurableShard {
    /// Answers a raft RPC from another member, or an admin request (a `RaftRequest` frame's
    /// body).
    pub async fn serve_rpc(&self, body: &[u8]) -> Vec<u8> {
        let reply = match postcard::from_bytes::<RaftMessage>(body) {
            Err(e) => RaftRpcReply::Refused(format!("{UNREADABLE}: {e}")),
            Ok(message) => match self.addressed_here(&message) {
                Err(why) => RaftRpcReply::Refused(why.to_string()),
                Ok(()) => self.answer(message.rpc).await,
            },
        };
        postcard::to_allocvec(&reply).unwrap_or_default()
    }

    async fn answer(&self, rpc: RaftRpc) -> RaftRpcReply {
        let raft = self.raft();
        match rpc {
            RaftRpc::Append(rpc) => {
                self.note_leader_commit(rpc.leader_commit.map(|l| l.index));
                RaftRpcReply::Append(raft.append_entries(rpc).await)
            }
            RaftRpc::Vote(rpc) => RaftRpcReply::Vote(raft.vote(rpc).await),
            RaftRpc::Snapshot(rpc) => {
                self.receiving_snapshot();
                RaftRpcReply::Snapshot(raft.install_snapshot(rpc).await)
            }
            RaftRpc::Admin(request) => RaftRpcReply::Admin(self.admin(request).await),
        }
    }

    /// Whether `message` is for this member: anyone may ask who it is or hand it a group to
    /// adopt; raft RPCs and the members' own requests must name this member's group and
    /// (when they name one) this member; an operator's request may name no group.
    fn addressed_here(&self, message: &RaftMessage) -> Result<(), Misaddressed> {
        let mine = self.group.load(Ordering::Relaxed);
        let needs_group = match &message.rpc {
            RaftRpc::Admin(AdminRequest::Identify | AdminRequest::Adopt { .. }) => false,
            RaftRpc::Admin(
                AdminRequest::AddLearner { .. }
                | AdminRequest::Promote { .. }
                | AdminRequest::Remove { .. }
                | AdminRequest::TransferLeader { .. }
                | AdminRequest::Initialize { .. },
            ) => message.group != 0,
            _ => true,
        };
        if needs_group && mine == 0 {
            return Err(Misaddressed::NoGroupYet { me: self.me });
        }
        if needs_group && message.group != mine {
            return Err(Misaddressed::OtherGroup {
                me: self.me,
                mine,
                named: message.group,
            });
        }
        if message.to != 0 && message.to != self.me {
            return Err(Misaddressed::OtherMember {
                me: self.me,
                named: message.to,
            });
        }
        Ok(())
    }
}

/// Why a message is not for this member (told back to the sender).
#[derive(Debug, thiserror::Error)]
enum Misaddressed {
    #[error(
        "member {me} belongs to no group yet: it waits for `kvd admin init-group` (a new group) \
         or `kvd admin add-replica` (an existing one)"
    )]
    NoGroupYet { me: u64 },
    #[error("member {me} belongs to group {mine}, not to group {named}: check the members' --group lists")]
    OtherGroup { me: u64, mine: u64, named: u64 },
    #[error(
        "this is member {me}, not member {named}: the member at this address was replaced (its data \
         directory is new); add it back with `kvd admin add-replica`"
    )]
    OtherMember { me: u64, named: u64 },
}
