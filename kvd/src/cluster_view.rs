//! What this node knows of the whole cluster, for Redis Cluster clients: which slots each
//! shard owns, and each shard's members with their RESP addresses and roles (the leader is
//! the shard's `master`). `CLUSTER SLOTS|SHARDS|NODES|INFO` answer from it and `-MOVED`
//! names its addresses.
//!
//! A background task asks every member in `--nodes` for its stats once a second (at most
//! `ASK_TIMEOUT` each) and replaces the view whole; readers take the current one without
//! waiting. A member that does not answer keeps its last known address and shows as failed.
//!
//! Every slot is listed under one shard at every moment (`assign`): under the group whose
//! leader says it serves it; a slot no leader claims (handed over, between the source's
//! "gone" and the target's "owned") stays where the last view had it, that is under its
//! source until the target owns it; a shard whose leader is not known (an election) keeps
//! its last leader as its master, marked failed, so its slots stay listed and a client
//! that goes there is redirected or refused (never told a slot has no owner).

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
    /// The highest epoch of its slot table (Redis's config epoch; 0: never moved).
    pub epoch: u32,
}

impl MemberView {
    /// Redis's config epoch for this member: one past its table's highest slot epoch.
    pub fn config_epoch(&self) -> u32 {
        self.epoch.saturating_add(1)
    }
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

    /// The master `s` is listed under: the one that answers, else its last known one (an
    /// election under way), if it ever had one that speaks RESP.
    pub fn listed_master<'a>(&self, s: &'a ShardView) -> Option<&'a MemberView> {
        self.master_of(s)
            .or_else(|| s.members.iter().find(|m| m.master && m.resp.is_some()))
    }

    /// Slots listed under a shard with a (last known) master: every slot, unless a shard
    /// never had a master that speaks RESP.
    pub fn slots_listed(&self) -> u32 {
        self.slots_of(|s| self.listed_master(s).is_some())
    }

    /// Slots whose master answers now.
    pub fn slots_up(&self) -> u32 {
        self.slots_of(|s| self.master_of(s).is_some())
    }

    /// How many slots the shards `keep` accepts hold.
    fn slots_of(&self, keep: impl Fn(&ShardView) -> bool) -> u32 {
        self.shards
            .iter()
            .filter(|s| keep(s))
            .flat_map(|s| &s.slots)
            .map(|[first, last]| u32::from(last - first) + 1)
            .sum()
    }

    /// Redis's `cluster_current_epoch`: one past the highest slot epoch any member reports
    /// (1 for the even split, as a new Redis cluster starts); each slot move raises it.
    pub fn current_epoch(&self) -> u32 {
        self.shards
            .iter()
            .flat_map(|s| &s.members)
            .map(MemberView::config_epoch)
            .max()
            .unwrap_or(1)
    }

    /// Every slot has an owner listed: Redis's `cluster_state:ok` (a shard in an election
    /// keeps its slots; `fail` only when a slot truly has no owner to go to).
    pub fn complete(&self) -> bool {
        self.slots_listed() == u32::from(kvshared::routing::SLOTS)
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
        epoch: node.slot_table().moves().epoch,
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
    let me = node.config().cluster.shard.index;
    let mut shards: Vec<ShardView> = (0..count)
        .map(|_| ShardView {
            slots: Vec::new(),
            members: Vec::new(),
        })
        .collect();
    // This node knows its own group's slots exactly; another group's, its leader does.
    let mut claims = vec![(me, node.slot_table().served())];
    for ((addr, &shard), answer) in flat.iter().zip(shard_of).zip(answers) {
        let known = last.shards.iter().flat_map(|s| &s.members).find(|m| &m.addr == addr);
        let member = match answer {
            Ok(s) => {
                let member = member_of(addr, &s, node);
                if member.master && !member.myself && shard != me {
                    claims.push((shard, s.slots.clone()));
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
    for (i, s) in shards.iter_mut().enumerate() {
        keep_last_master(s, last.shards.get(i));
        // The master first: clients take the first node of a slot range as its master.
        s.members.sort_by_key(|m| !m.master);
    }
    let before = owners_of(last);
    let table = |slot: u16| u32::from(node.slot_table().get(slot).owner);
    let owners = assign(count, &claims, &before, table);
    for (i, s) in shards.iter_mut().enumerate() {
        s.slots = ranges_of(&owners, i as u32);
    }
    View { shards, refreshes }
}

/// A shard none of whose members says it leads (an election, or its leader down) keeps the
/// master of the last view, marked failed: its slots stay listed under it.
fn keep_last_master(s: &mut ShardView, last: Option<&ShardView>) {
    if s.members.iter().any(|m| m.master) {
        return;
    }
    let Some(was) = last.and_then(|l| l.members.iter().find(|m| m.master)) else {
        return;
    };
    if let Some(m) = s.members.iter_mut().find(|m| m.addr == was.addr) {
        m.master = true;
    }
}

/// Each slot's shard in `view` (`None`: listed under none).
fn owners_of(view: &View) -> Vec<Option<u32>> {
    let mut owners = vec![None; usize::from(kvshared::routing::SLOTS)];
    for (i, s) in view.shards.iter().enumerate() {
        for &[first, last] in &s.slots {
            for slot in first..=last {
                if let Some(o) = owners.get_mut(usize::from(slot)) {
                    *o = Some(i as u32);
                }
            }
        }
    }
    owners
}

/// Every slot's shard: the one whose leader claims it (of two claims, the one the last
/// view had); a slot no leader claims stays where `before` had it (a slot handed over is
/// its source's until the target owns it), else goes where this node's table says
/// (`table`). A shard past `count` owns nothing here (`None`).
fn assign(
    count: u32,
    claims: &[(u32, Vec<[u16; 2]>)],
    before: &[Option<u32>],
    table: impl Fn(u16) -> u32,
) -> Vec<Option<u32>> {
    let slots = kvshared::routing::SLOTS;
    let mut owners: Vec<Option<u32>> = vec![None; usize::from(slots)];
    for (shard, ranges) in claims.iter().filter(|(s, _)| *s < count) {
        for &[first, last] in ranges {
            for slot in first..=last.min(slots - 1) {
                let was = before.get(usize::from(slot)).copied().flatten();
                let o = &mut owners[usize::from(slot)];
                *o = match *o {
                    Some(other) if other != *shard && was == Some(other) => Some(other),
                    _ => Some(*shard),
                };
            }
        }
    }
    (0..slots)
        .map(|slot| {
            owners[usize::from(slot)]
                .or_else(|| before.get(usize::from(slot)).copied().flatten())
                .unwrap_or_else(|| table(slot))
        })
        .map(|o| (o < count).then_some(o))
        .collect()
}

/// The slots owned by `shard`, as inclusive ranges.
fn ranges_of(owners: &[Option<u32>], shard: u32) -> Vec<[u16; 2]> {
    let slots: Vec<u16> = (0..kvshared::routing::SLOTS)
        .filter(|&s| owners.get(usize::from(s)) == Some(&Some(shard)))
        .collect();
    kvshared::slots::ranges_of_slots(&slots)
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
        epoch: 0,
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
        epoch: s.slot_moves.epoch,
    }
}

#[cfg(test)]
mod tests {
    use super::{assign, ranges_of};
    use kvshared::routing::SLOTS;

    fn even(count: u32) -> Vec<(u32, Vec<[u16; 2]>)> {
        let per = SLOTS / count as u16;
        (0..count)
            .map(|i| {
                let first = i as u16 * per;
                let last = if i + 1 == count { SLOTS - 1 } else { first + per - 1 };
                (i, vec![[first, last]])
            })
            .collect()
    }

    #[test]
    fn every_slot_is_listed_through_a_hand_over() {
        let before: Vec<Option<u32>> = assign(2, &even(2), &[], |_| 0);
        assert!(before.iter().all(Option::is_some));
        // Slots 0-9 handed from 0 to 1: source "gone", target still importing: no claim.
        let mut claims = even(2);
        claims[0].1 = vec![[10, SLOTS / 2 - 1]];
        let during = assign(2, &claims, &before, |_| 1);
        assert_eq!(ranges_of(&during, 0), [[0, SLOTS / 2 - 1]], "listed under the source");
        // The target owns them: listed under it.
        claims[1].1.push([0, 9]);
        let after = assign(2, &claims, &during, |_| 0);
        assert_eq!(ranges_of(&after, 0), [[10, SLOTS / 2 - 1]]);
        assert_eq!(ranges_of(&after, 1), [[0, 9], [SLOTS / 2, SLOTS - 1]]);
        // Two claims of one slot (a stale leader): the last view's owner keeps it.
        claims[0].1.push([0, 0]);
        let both = assign(2, &claims, &after, |_| 0);
        assert_eq!(both[0], Some(1));
        // Nothing known yet: the table's owner; a shard past the count owns nothing.
        let fresh = assign(2, &[], &[], |s| if s < 5 { 7 } else { 0 });
        assert_eq!((fresh[4], fresh[5]), (None, Some(0)));
    }
}
