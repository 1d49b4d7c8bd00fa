//! What this node knows of the whole cluster, for Redis Cluster clients: which slots each
//! shard owns, and each shard's members with their RESP addresses and roles (the leader is
//! the shard's `master`). `CLUSTER SLOTS|SHARDS|NODES|INFO` answer from it and `-MOVED`
//! names its addresses.
//!
//! A background task asks every member in `--nodes` for its stats once a second (at most
//! `ASK_TIMEOUT` each) and replaces the view whole; readers take the current one without
//! waiting. Slots are the even split `--shard i/n` starts with. A member that does not
//! answer keeps its last known address and shows as failed.

use std::sync::Arc;
use std::time::Duration;

use kvshared::client::{ClientConfig, Cluster, members};
use kvshared::routing::node_id;
use kvshared::stats::{GroupRole, NodeStats};

use crate::node::Node;

/// How often the view is refreshed.
const REFRESH: Duration = Duration::from_secs(1);
/// Longest wait for one member's stats.
const ASK_TIMEOUT: Duration = Duration::from_millis(800);

/// The cluster as this node last saw it.
#[derive(Clone, Debug, Default)]
pub struct View {
    /// One per shard, in shard order.
    pub shards: Vec<ShardView>,
    /// Refreshes done (0: nothing known of the other nodes yet).
    pub refreshes: u64,
}

/// One shard: its slots and its members, the master first when one is known.
#[derive(Clone, Debug)]
pub struct ShardView {
    /// The slots it serves, as inclusive ranges.
    pub slots: Vec<[u16; 2]>,
    /// Its members.
    pub members: Vec<MemberView>,
}

/// One member of a shard.
#[derive(Clone, Debug)]
pub struct MemberView {
    /// Redis Cluster's node id (see [`node_id`]).
    pub id: String,
    /// Its kvd address as `--nodes` names it.
    pub addr: String,
    /// Where it speaks RESP, host and port (`None`: it does not, or it never answered).
    pub resp: Option<(String, u16)>,
    /// It leads its group (or is in none): Redis's `master`.
    pub master: bool,
    /// It answered the last refresh.
    pub up: bool,
    /// Its last applied log entry (Redis's replication offset).
    pub offset: u64,
    /// This node.
    pub myself: bool,
}

impl View {
    /// The master of `shard` with a RESP address, if known.
    pub fn master(&self, shard: u32) -> Option<&MemberView> {
        self.master_of(self.shards.get(shard as usize)?)
    }

    /// The master of `s` with a RESP address, if known.
    pub fn master_of<'a>(&self, s: &'a ShardView) -> Option<&'a MemberView> {
        s.members.iter().find(|m| m.master && m.up && m.resp.is_some())
    }

    /// Every shard has a master that speaks RESP: Redis's `cluster_state:ok`.
    pub fn complete(&self) -> bool {
        (0..self.shards.len() as u32).all(|s| self.master(s).is_some())
    }
}

/// The view, refreshed in the background while the node serves.
pub struct ClusterView {
    current: parking_lot::RwLock<Arc<View>>,
}

impl ClusterView {
    /// The view of `node` in the cluster of `nodes` (its `--nodes`; empty: it is alone),
    /// refreshed by a task on the current runtime until the node stops.
    pub fn start(node: Arc<Node>, nodes: &[String], config: ClientConfig) -> Arc<ClusterView> {
        let view = Arc::new(ClusterView {
            current: parking_lot::RwLock::new(Arc::new(alone(&node))),
        });
        let flat: Vec<String> = nodes.iter().flat_map(|e| members(e).map(str::to_string)).collect();
        let shard_of: Vec<u32> = (0..nodes.len() as u32)
            .flat_map(|s| std::iter::repeat_n(s, members(&nodes[s as usize]).count()))
            .collect();
        if flat.is_empty() {
            return view;
        }
        let Ok(asker) = Cluster::new(
            &flat,
            ClientConfig {
                request_timeout: ASK_TIMEOUT,
                ..config
            },
        ) else {
            return view;
        };
        let asker = Arc::new(asker);
        let weak = Arc::downgrade(&view);
        tokio::spawn(async move {
            let count = nodes_count(&shard_of);
            let mut refreshes = 0;
            loop {
                let answers = ask_all(&asker).await;
                let Some(view) = weak.upgrade() else { return };
                refreshes += 1;
                let last = view.get();
                let next = build(&node, &flat, &shard_of, count, answers, &last, refreshes);
                *view.current.write() = Arc::new(next);
                drop(view);
                tokio::time::sleep(REFRESH).await;
            }
        });
        view
    }

    /// The current view.
    pub fn get(&self) -> Arc<View> {
        self.current.read().clone()
    }
}

/// Every member's stats, asked at once.
async fn ask_all(asker: &Arc<Cluster>) -> Vec<Result<NodeStats, kvshared::client::ClientError>> {
    let mut asks = tokio::task::JoinSet::new();
    for i in 0..asker.node_count() {
        let asker = asker.clone();
        asks.spawn(async move { (i, asker.stats(i).await) });
    }
    let mut answers: Vec<_> = (0..asker.node_count())
        .map(|_| Err(kvshared::client::ClientError::BadNodes("not asked".into())))
        .collect();
    while let Some(Ok((i, answer))) = asks.join_next().await {
        answers[i] = answer;
    }
    answers
}

fn nodes_count(shard_of: &[u32]) -> u32 {
    shard_of.last().map_or(1, |&s| s + 1)
}

/// The view of a node on its own (no `--nodes`): all its shard's slots, itself the master.
fn alone(node: &Node) -> View {
    let me = node.config().cluster.shard;
    let bound = node.resp_addr();
    let addr = bound.map_or(String::new(), |a| a.to_string());
    let member = MemberView {
        id: node_id(&addr),
        addr,
        resp: bound.map(|a| (a.ip().to_string(), a.port())),
        master: true,
        up: true,
        offset: 0,
        myself: true,
    };
    let mut shards = vec![];
    for index in 0..me.count {
        let members = if index == me.index {
            vec![member.clone()]
        } else {
            vec![]
        };
        shards.push(ShardView {
            slots: known_slots(node, index),
            members,
        });
    }
    View { shards, refreshes: 0 }
}

/// The next view from every member's answer (or failure), keeping what the last view knew
/// of members that did not answer.
fn build(
    node: &Node,
    flat: &[String],
    shard_of: &[u32],
    count: u32,
    answers: Vec<Result<NodeStats, kvshared::client::ClientError>>,
    last: &View,
    refreshes: u64,
) -> View {
    let mut shards: Vec<ShardView> = (0..count)
        .map(|i| ShardView {
            slots: known_slots(node, i),
            members: Vec::new(),
        })
        .collect();
    for ((addr, &shard), answer) in flat.iter().zip(shard_of).zip(answers) {
        let known = last.shards.iter().flat_map(|s| &s.members).find(|m| &m.addr == addr);
        let member = match answer {
            Ok(s) => {
                let member = member_of(addr, &s, node);
                if member.master && !member.myself && shard != node.config().cluster.shard.index {
                    // Its master knows a shard's slots best.
                    shards[shard as usize].slots = s.slots.clone();
                }
                member
            }
            Err(_) => MemberView {
                up: false,
                master: false,
                ..known.cloned().unwrap_or_else(|| unknown(addr))
            },
        };
        shards[shard as usize].members.push(member);
    }
    for s in &mut shards {
        // The master first: clients take the first node of a slot range as its master.
        s.members.sort_by_key(|m| !m.master);
    }
    View { shards, refreshes }
}

/// The slots this node's table says group `index` serves (its own exactly; the others'
/// as last told; a slot importing here is its source's while it is copied, and nobody's
/// once its hand-over is under way).
fn known_slots(node: &Node, index: u32) -> Vec<[u16; 2]> {
    let me = node.config().cluster.shard.index;
    node.slot_table()
        .ranges(|s| u32::from(s.owner) == index && !(s.state == kvshared::slots::SlotState::Importing && index == me))
}

fn unknown(addr: &str) -> MemberView {
    MemberView {
        id: node_id(addr),
        addr: addr.to_string(),
        resp: None,
        master: false,
        up: false,
        offset: 0,
        myself: false,
    }
}

/// A member as its stats describe it. An unspecified RESP address (`0.0.0.0`, `::`) is
/// announced with the host clients reach its kvd port by.
fn member_of(addr: &str, s: &NodeStats, me: &Node) -> MemberView {
    let resp = s.resp_addr.parse::<std::net::SocketAddr>().ok().map(|r| {
        let host = match r.ip().is_unspecified() {
            true => addr
                .rsplit_once(':')
                .map_or(addr, |(h, _)| h)
                .trim_matches(['[', ']'])
                .to_string(),
            false => r.ip().to_string(),
        };
        (host, r.port())
    });
    MemberView {
        id: node_id(addr),
        addr: addr.to_string(),
        resp,
        master: matches!(s.group.role, GroupRole::None | GroupRole::Leader),
        up: true,
        offset: s.group.applied_index,
        myself: s.pid == std::process::id()
            && s.shard == me.config().cluster.shard
            && me.resp_addr().is_some_and(|a| a.to_string() == s.resp_addr),
    }
}
