//! The raft messages between the members of a replica group, carried as `RaftRequest` /
//! `RaftResponse` frames on the members' ordinary kvd ports (so a group needs no second
//! port, and gets the same frame limits, token and TLS as clients): their types, and the
//! sending side (`raft::rpc` answers them).
//!
//! The body is openraft's own request or response, postcard-encoded: openraft's types are
//! serde-only. A body from the network is untrusted: postcard decoding checks every length
//! against the bytes there are and fails cleanly; the frame size was checked before.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use kvshared::client::{ClientConfig, ClientError, Cluster};
use kvshared::frame::{AlignedVec, FrameKind};
use openraft::BasicNode;
use openraft::error::{InstallSnapshotError, NetworkError, RPCError, RaftError, RemoteError, Unreachable};
use openraft::network::{RPCOption, RaftNetwork, RaftNetworkFactory};
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, InstallSnapshotRequest, InstallSnapshotResponse, VoteRequest,
    VoteResponse,
};
use serde::{Deserialize, Serialize};

use super::bulk::{self, Lane, NoReply, Step};
use super::raft::types::ShardRaft;
pub use kvshared::admin::{AdminReply, AdminRequest, MemberIdentity, Target, UNREADABLE};

/// A raft RPC from one member to another, or a request about the group.
#[derive(Serialize, Deserialize)]
pub enum RaftRpc {
    Append(AppendEntriesRequest<ShardRaft>),
    Vote(VoteRequest<u64>),
    Snapshot(InstallSnapshotRequest<ShardRaft>),
    Admin(AdminRequest),
}

/// What travels in a `RaftRequest` frame: the RPC, the group it is for and the member it is
/// for. A member answers raft RPCs only of its own group and addressed to itself (a member
/// of another group, or one whose disk was wiped and that came back as a new member at the
/// same address, refuses them with a reason instead of taking them up).
#[derive(Serialize, Deserialize)]
pub struct RaftMessage {
    /// The group's id (0: the sender does not know it; only operators' requests).
    pub group: u64,
    /// The member's id (0: whichever member this is; only operators' requests).
    pub to: u64,
    /// The RPC.
    pub rpc: RaftRpc,
}

/// Its answer.
#[derive(Serialize, Deserialize)]
pub enum RaftRpcReply {
    Append(Result<AppendEntriesResponse<u64>, RaftError<u64>>),
    Vote(Result<VoteResponse<u64>, RaftError<u64>>),
    Snapshot(Result<InstallSnapshotResponse<u64>, RaftError<u64, InstallSnapshotError>>),
    /// The member could not take the request (not a group member, or the body did not decode).
    Refused(String),
    Admin(AdminReply),
}

/// Makes the connections to the other members, one pooled client per member, kept for the
/// life of the node (openraft asks for a "client" per voter on every replication round).
pub struct Network {
    config: ClientConfig,
    peers: HashMap<u64, Arc<Cluster>>,
    /// Each member's bulk lane (`super::bulk`): its own connection, and the big append on it.
    lanes: HashMap<u64, (Arc<Cluster>, Arc<Lane>)>,
    /// Whether each member answers, for the one log line per change of its state.
    reach: HashMap<u64, Arc<Reach>>,
    /// This member's group (0 until it has one), which every RPC names.
    group: Arc<AtomicU64>,
}

impl Network {
    /// Talks to the members with `config`'s timeouts, token and TLS, naming `group`.
    pub fn new(config: ClientConfig, group: Arc<AtomicU64>) -> Network {
        Network {
            config: ClientConfig {
                conns_per_node: 1,
                pipeline: 64,
                ..config
            },
            peers: HashMap::new(),
            lanes: HashMap::new(),
            reach: HashMap::new(),
            group,
        }
    }
}

/// Whether a member answers RPCs: a change is logged once, with how many RPCs failed and for
/// how long (openraft's own lines, one or two per failed heartbeat, are filtered out of the
/// default log: 41 lines in 5 s for one member down).
#[derive(Default)]
pub struct Reach {
    down: parking_lot::Mutex<Option<(std::time::Instant, u64)>>,
}

impl Reach {
    fn failed(&self, addr: &str, why: &str) {
        let mut down = self.down.lock();
        match down.as_mut() {
            Some((_, n)) => *n += 1,
            None => {
                tracing::warn!(member = addr, error = why, "a member of the group does not answer");
                *down = Some((std::time::Instant::now(), 1));
            }
        }
    }

    fn answered(&self, addr: &str) {
        if let Some((since, failed)) = self.down.lock().take() {
            tracing::info!(
                member = addr,
                failed_rpcs = failed,
                down_ms = since.elapsed().as_millis() as u64,
                "a member of the group answers again"
            );
        }
    }
}

impl RaftNetworkFactory<ShardRaft> for Network {
    type Network = Peer;

    async fn new_client(&mut self, target: u64, node: &BasicNode) -> Peer {
        let connect = || {
            Cluster::new(std::slice::from_ref(&node.addr), self.config.clone())
                .ok()
                .map(Arc::new)
        };
        let cluster = match self.peers.get(&target) {
            Some(c) if c.addr(0) == node.addr => Some(c.clone()),
            _ => connect(),
        };
        let lane = match self.lanes.get(&target) {
            Some((c, lane)) if c.addr(0) == node.addr => Some((c.clone(), lane.clone())),
            _ => connect().map(|c| (c, Arc::default())),
        };
        if let Some(c) = &cluster {
            self.peers.insert(target, c.clone());
        }
        if let Some(l) = &lane {
            self.lanes.insert(target, l.clone());
        }
        Peer {
            target,
            addr: node.addr.clone(),
            cluster,
            lane,
            group: self.group.clone(),
            reach: self.reach.entry(target).or_default().clone(),
        }
    }
}

/// One other member.
pub struct Peer {
    target: u64,
    addr: String,
    cluster: Option<Arc<Cluster>>,
    /// The connection for big appends, and the one under way.
    lane: Option<(Arc<Cluster>, Arc<Lane>)>,
    group: Arc<AtomicU64>,
    reach: Arc<Reach>,
}

fn unreachable<E: std::error::Error>(e: &ClientError) -> RPCError<u64, BasicNode, E> {
    RPCError::Unreachable(Unreachable::new(e))
}

fn network<E: std::error::Error>(why: String) -> RPCError<u64, BasicNode, E> {
    RPCError::Network(NetworkError::new(&std::io::Error::other(why)))
}

impl Peer {
    async fn call<E: std::error::Error>(
        &self,
        rpc: RaftRpc,
        option: &RPCOption,
    ) -> Result<RaftRpcReply, RPCError<u64, BasicNode, E>> {
        let reply = self.exchange(rpc, option).await;
        match &reply {
            Ok(RaftRpcReply::Refused(why)) => self.reach.failed(&self.addr, why),
            Ok(_) => self.reach.answered(&self.addr),
            Err(e) => self.reach.failed(&self.addr, &e.to_string()),
        }
        reply
    }

    async fn exchange<E: std::error::Error>(
        &self,
        rpc: RaftRpc,
        option: &RPCOption,
    ) -> Result<RaftRpcReply, RPCError<u64, BasicNode, E>> {
        let Some(cluster) = &self.cluster else {
            return Err(network("no usable address for this member".into()));
        };
        let message = self.message(rpc);
        exchange(cluster, &message, option.hard_ttl())
            .await
            .map_err(|e| match e {
                Failed::Unreachable(e) => unreachable(&e),
                Failed::Network(why) => network(why),
            })
    }

    fn message(&self, rpc: RaftRpc) -> RaftMessage {
        RaftMessage {
            group: self.group.load(Ordering::Relaxed),
            to: self.target,
            rpc,
        }
    }

    /// Sends a big append on the bulk lane (see `super::bulk`): once, whatever openraft's
    /// repeats; a heartbeat stands for it while it is under way.
    async fn append_big(
        &self,
        rpc: AppendEntriesRequest<ShardRaft>,
        option: &RPCOption,
    ) -> Result<AppendEntriesResponse<u64>, RPCError<u64, BasicNode, RaftError<u64>>> {
        let Some((cluster, lane)) = &self.lane else {
            return Err(network("no usable address for this member".into()));
        };
        let beat = bulk::heartbeat(&rpc);
        let send = |rpc: AppendEntriesRequest<ShardRaft>| {
            let ttl = bulk::deadline(bulk::entry_bytes(&rpc));
            let message = self.message(RaftRpc::Append(rpc));
            let cluster = cluster.clone();
            tokio::spawn(async move {
                match exchange(&cluster, &message, ttl).await {
                    Ok(RaftRpcReply::Append(r)) => Ok(r),
                    Ok(RaftRpcReply::Refused(why)) => Err(NoReply::failed(why)),
                    Ok(_) => Err(NoReply::failed("answered another kind of RPC")),
                    Err(Failed::Unreachable(e)) => Err(NoReply {
                        unreachable: true,
                        why: e.to_string(),
                    }),
                    Err(Failed::Network(why)) => Err(NoReply::failed(why)),
                }
            })
        };
        match lane.append(rpc, option.soft_ttl() / 2, send).await {
            Step::Answered(Ok(r)) => {
                self.reach.answered(&self.addr);
                r.map_err(|e| self.remote(e))
            }
            // A member that cannot be reached is backed off from, as on the ordinary path
            // (else every retry would start another send at once).
            Step::Answered(Err(no)) => {
                self.reach.failed(&self.addr, &no.why);
                match no.unreachable {
                    true => Err(RPCError::Unreachable(Unreachable::new(&std::io::Error::other(no.why)))),
                    false => Err(network(no.why)),
                }
            }
            Step::Sending => {
                let prev = beat.prev_log_id;
                match self.append_now(beat, option).await? {
                    AppendEntriesResponse::Success if prev.is_some() => Ok(AppendEntriesResponse::PartialSuccess(prev)),
                    AppendEntriesResponse::Success => Err(network("a big append is still being sent".into())),
                    other => Ok(other),
                }
            }
        }
    }

    async fn append_now(
        &self,
        rpc: AppendEntriesRequest<ShardRaft>,
        option: &RPCOption,
    ) -> Result<AppendEntriesResponse<u64>, RPCError<u64, BasicNode, RaftError<u64>>> {
        match self.call(RaftRpc::Append(rpc), option).await? {
            RaftRpcReply::Append(r) => r.map_err(|e| self.remote(e)),
            RaftRpcReply::Refused(why) => Err(network(why)),
            _ => Err(network("answered another kind of RPC".into())),
        }
    }

    fn remote<E: std::error::Error>(&self, e: E) -> RPCError<u64, BasicNode, E> {
        RPCError::RemoteError(RemoteError::new(self.target, e))
    }
}

/// Why an exchange with a member failed.
enum Failed {
    Unreachable(ClientError),
    Network(String),
}

/// Sends `message` to `cluster`'s node and reads its answer, within `ttl`.
async fn exchange(cluster: &Cluster, message: &RaftMessage, ttl: std::time::Duration) -> Result<RaftRpcReply, Failed> {
    // Serialised straight into the frame: an append of megabytes is copied once.
    let call = cluster.call_with(0, FrameKind::RaftRequest, |buf| {
        postcard::serialize_with_flavor(message, FrameBody(buf)).map_err(|e| e.to_string())
    });
    let reply = tokio::time::timeout(ttl, call)
        .await
        .map_err(|_| Failed::Network(format!("no answer within {ttl:?}")))?
        .map_err(|e| match e {
            ClientError::Encode { reason } => Failed::Network(reason),
            e => Failed::Unreachable(e),
        })?;
    if reply.kind != FrameKind::RaftResponse {
        return Err(Failed::Network(reply.unexpected().to_string()));
    }
    postcard::from_bytes(&reply.body).map_err(|e| Failed::Network(format!("the answer does not decode: {e}")))
}

/// postcard's output appended to a frame's buffer.
struct FrameBody<'a>(&'a mut AlignedVec);

impl postcard::ser_flavors::Flavor for FrameBody<'_> {
    type Output = ();

    fn try_push(&mut self, byte: u8) -> postcard::Result<()> {
        self.0.push(byte);
        Ok(())
    }

    fn try_extend(&mut self, bytes: &[u8]) -> postcard::Result<()> {
        self.0.extend_from_slice(bytes);
        Ok(())
    }

    fn finalize(self) -> postcard::Result<()> {
        Ok(())
    }
}

impl RaftNetwork<ShardRaft> for Peer {
    async fn append_entries(
        &mut self,
        rpc: AppendEntriesRequest<ShardRaft>,
        option: RPCOption,
    ) -> Result<AppendEntriesResponse<u64>, RPCError<u64, BasicNode, RaftError<u64>>> {
        match bulk::entry_bytes(&rpc) < bulk::BULK_BYTES {
            true => self.append_now(rpc, &option).await,
            false => self.append_big(rpc, &option).await,
        }
    }

    async fn install_snapshot(
        &mut self,
        rpc: InstallSnapshotRequest<ShardRaft>,
        option: RPCOption,
    ) -> Result<InstallSnapshotResponse<u64>, RPCError<u64, BasicNode, RaftError<u64, InstallSnapshotError>>> {
        match self.call(RaftRpc::Snapshot(rpc), &option).await? {
            RaftRpcReply::Snapshot(r) => r.map_err(|e| self.remote(e)),
            RaftRpcReply::Refused(why) => Err(network(why)),
            _ => Err(network("answered another kind of RPC".into())),
        }
    }

    async fn vote(
        &mut self,
        rpc: VoteRequest<u64>,
        option: RPCOption,
    ) -> Result<VoteResponse<u64>, RPCError<u64, BasicNode, RaftError<u64>>> {
        match self.call(RaftRpc::Vote(rpc), &option).await? {
            RaftRpcReply::Vote(r) => r.map_err(|e| self.remote(e)),
            RaftRpcReply::Refused(why) => Err(network(why)),
            _ => Err(network("answered another kind of RPC".into())),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// kvshared's admin requests (what `kvd admin` sends) and replies are this envelope's,
    /// byte for byte.
    #[test]
    fn the_admin_envelope_is_the_members_one() {
        let request = AdminRequest::PreVote {
            candidate: 7,
            last_log: Some(kvshared::admin::LogPosition {
                term: 3,
                leader: 9,
                index: 1234,
            }),
        };
        let to = Target { group: 5, member: 6 };
        let ours = postcard::to_allocvec(&RaftMessage {
            group: 5,
            to: 6,
            rpc: RaftRpc::Admin(request.clone()),
        })
        .unwrap();
        assert_eq!(kvshared::admin::encode(to, &request), ours);
        let reply = AdminReply::Identity(MemberIdentity {
            member: 1,
            group: Some(2),
            initialised: true,
            peers: vec!["a:1".into()],
            shard: "0/1".into(),
        });
        let body = postcard::to_allocvec(&RaftRpcReply::Admin(reply.clone())).unwrap();
        assert_eq!(kvshared::admin::decode_reply(&body), reply);
        let body = postcard::to_allocvec(&RaftRpcReply::Refused("nope".into())).unwrap();
        assert_eq!(kvshared::admin::decode_reply(&body), AdminReply::Failed("nope".into()));
        // openraft's log id is encoded as a log position is.
        let id = openraft::LogId::<u64>::new(openraft::CommittedLeaderId::new(3, 9), 1234);
        let position = kvshared::admin::LogPosition {
            term: 3,
            leader: 9,
            index: 1234,
        };
        assert_eq!(
            postcard::to_allocvec(&id).unwrap(),
            postcard::to_allocvec(&position).unwrap()
        );
    }
}
