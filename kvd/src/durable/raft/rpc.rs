//! Answering what reaches this member in a `RaftRequest` frame: another member's raft RPC,
//! or an operator's (or another member's) admin request. The body is untrusted: it is
//! decoded with postcard, which checks every length, and what does not decode is refused.

use super::shard::DurableShard;
use crate::durable::network::{RaftRpc, RaftRpcReply};

impl DurableShard {
    /// Answers a raft RPC from another member, or an operator's admin request (a
    /// `RaftRequest` frame's body).
    pub async fn serve_rpc(&self, body: &[u8]) -> Vec<u8> {
        let raft = self.raft();
        let reply = match postcard::from_bytes::<RaftRpc>(body) {
            Err(e) => RaftRpcReply::Refused(format!("not a raft request: {e}")),
            Ok(RaftRpc::Append(rpc)) => {
                self.note_leader_commit(rpc.leader_commit.map(|l| l.index));
                RaftRpcReply::Append(raft.append_entries(rpc).await)
            }
            Ok(RaftRpc::Vote(rpc)) => RaftRpcReply::Vote(raft.vote(rpc).await),
            Ok(RaftRpc::Snapshot(rpc)) => {
                self.receiving_snapshot();
                RaftRpcReply::Snapshot(raft.install_snapshot(rpc).await)
            }
            Ok(RaftRpc::Admin(request)) => RaftRpcReply::Admin(self.admin(request).await),
        };
        postcard::to_allocvec(&reply).unwrap_or_default()
    }
}
