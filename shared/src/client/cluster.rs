//! The cluster client: routes ops to their owner nodes and merges the answers.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use rkyv::util::AlignedVec;
use tokio::sync::Mutex as AsyncMutex;

use super::connection::{Connection, InFlight, Reply};
use super::{ClientConfig, ClientError, LayoutProblem, NodeBatches, ReadFrom, check_layout};
use crate::frame::FrameKind;
use crate::slots::{SlotState, SlotTable};
use crate::stats::{GroupRole, NodeStats};
use crate::wire::{
    BatchRequest, ConfigRequest, ErrorCode, OpKind, OpReply, decode_stats, encode_empty_frame, encode_frame,
};

/// One operation for [`Cluster::batch`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op<'a> {
    /// Read a key.
    Get(&'a [u8]),
    /// Store a value under a key.
    Put(&'a [u8], &'a [u8]),
    /// Remove a key.
    Delete(&'a [u8]),
    /// Store a value under a key that is absent (Redis `SET NX`).
    PutIfAbsent(&'a [u8], &'a [u8]),
    /// Store a value under a key that is present (Redis `SET XX`).
    PutIfPresent(&'a [u8], &'a [u8]),
    /// Add to a key's integer value (Redis `INCRBY`; an absent key counts as 0).
    IncrBy(&'a [u8], i64),
    /// Append to a key's value (Redis `APPEND`; an absent key starts empty).
    Append(&'a [u8], &'a [u8]),
    /// Overwrite a key's value from an offset, zero-padding up to it (Redis `SETRANGE`).
    SetRange(&'a [u8], u64, &'a [u8]),
    /// Store a value with a condition and a time to live (Redis `SET` with its options).
    PutWith(&'a [u8], crate::expiry::PutWith<'a>),
    /// Set or remove a key's deadline (Redis `EXPIRE` and its kin, `PERSIST`).
    Expire(&'a [u8], crate::expiry::Expire),
    /// Read a key's deadline: `Counted` with it in Unix milliseconds, -1 for none.
    Ttl(&'a [u8]),
    /// An op of any kind with its value as the wire carries it (a front that forwards ops
    /// it has already encoded, such as kvd's RESP front).
    Raw(OpKind, &'a [u8], &'a [u8]),
}

impl<'a> Op<'a> {
    /// The key the op is about.
    pub fn key(&self) -> &'a [u8] {
        match *self {
            Op::Get(k)
            | Op::Put(k, _)
            | Op::Delete(k)
            | Op::PutIfAbsent(k, _)
            | Op::PutIfPresent(k, _)
            | Op::IncrBy(k, _)
            | Op::Append(k, _)
            | Op::SetRange(k, _, _)
            | Op::PutWith(k, _)
            | Op::Expire(k, _)
            | Op::Ttl(k)
            | Op::Raw(_, k, _) => k,
        }
    }
}

/// The result of one successful operation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// A get found this value.
    Value(Vec<u8>),
    /// A get found nothing.
    NotFound,
    /// A put was stored.
    Stored,
    /// Delete: whether the key existed.
    Deleted(bool),
    /// A conditional put's condition did not hold; nothing changed.
    NotStored,
    /// An increment stored this sum.
    Counted(i64),
    /// An increment found a value that is not a decimal 64-bit integer; nothing changed.
    NotAnInteger,
    /// An increment's sum would overflow; nothing changed.
    Overflow,
    /// Not run: its atomic batch did not run.
    Aborted,
}

/// Whether a request that failed with `e` did not run and another member of the group
/// might run it (a leader change, a member down or shutting down).
fn another_member_may_serve(e: &ClientError) -> bool {
    matches!(
        e,
        ClientError::NotLeader { .. }
            | ClientError::Connect { .. }
            | ClientError::Unavailable { .. }
            | ClientError::Stalled { .. }
            | ClientError::Server {
                code: ErrorCode::ShuttingDown | ErrorCode::WrongGroup,
                ..
            }
    )
}

/// Pause between tries of a replica group's members while none leads (an election).
const FAILOVER_PAUSE: Duration = Duration::from_millis(50);

/// First and longest pause before a node that failed is tried again.
const RETRY_FIRST: Duration = Duration::from_millis(50);
const RETRY_MAX: Duration = Duration::from_secs(1);

/// A connection slot's connection, and the member (index into `members`) it goes to.
type MemberConnection = (usize, Arc<Connection>);

/// A shard's connections, and whether it is known to be down; a dead connection is
/// replaced on next use. A shard served by a replica group has several members; requests go
/// to the one believed to lead (`current`), which moves on "not the leader" (to the member
/// it names) and on a member that cannot be reached (to the next).
struct NodePool {
    addr: String,
    /// The group's members: those listed, and any a "not the leader" answer has named since
    /// (a member added to the group after this client started).
    members: parking_lot::RwLock<Vec<String>>,
    /// More than one member: requests follow the leader.
    grouped: AtomicBool,
    current: AtomicUsize,
    slots: Vec<AsyncMutex<Option<MemberConnection>>>,
    next: AtomicUsize,
    /// While the node is known to be down: until when (ms since the cluster's epoch) its
    /// requests fail at once instead of trying it again. 0 while it is up.
    down_until_ms: AtomicU64,
    /// The current retry pause in ms (doubles while the node stays down).
    retry_ms: AtomicU64,
    /// Where batches of reads only go (`--reads replicas|stale`): the group's members as it
    /// last reported them, kept current by [`Cluster::refresh_topology`].
    readers: Arc<Readers>,
}

/// A replica group's members that serve reads, learned from the group (so that replicas
/// added while the client runs get their share without a restart).
#[derive(Default)]
struct Readers {
    members: parking_lot::RwLock<Vec<Arc<Reader>>>,
    next: AtomicUsize,
    /// When (ms since the cluster's epoch) the group was last asked for its members (1:
    /// when the client was made).
    asked_ms: AtomicU64,
    /// An ask is under way.
    asking: AtomicBool,
    /// The group the shard's members must be in (see [`super::pin`]).
    pin: super::pin::GroupPin,
}

/// One member reads may go to, and its connection.
struct Reader {
    addr: String,
    conn: AsyncMutex<Option<Arc<Connection>>>,
    /// Until when (ms since the cluster's epoch) reads pass this member by: it refused a
    /// read or could not be reached. 0: usable.
    avoid_until_ms: AtomicU64,
}

impl Reader {
    fn new(addr: String) -> Arc<Reader> {
        Arc::new(Reader {
            addr,
            conn: AsyncMutex::new(None),
            avoid_until_ms: AtomicU64::new(0),
        })
    }
}

/// Rounds of redirects one batch may go through (a slot moves once per round at most; more
/// means the node list is not the cluster's).
const MAX_REDIRECT_ROUNDS: u32 = 8;
/// The pause before sending again ops whose slot is being handed over: this times the
/// retry, at most [`MAX_TRY_AGAIN_PAUSE`]. They are sent again while the request's time
/// lasts: a hand-over pauses its slots' writes for as long as its steps take (a few
/// hundred milliseconds off a saturated source, seconds when a leader is paused in it).
const TRY_AGAIN_PAUSE: Duration = Duration::from_millis(5);
const MAX_TRY_AGAIN_PAUSE: Duration = Duration::from_millis(50);

/// How often a client asks a shard which members its group has (for reads).
const TOPOLOGY_EVERY: Duration = Duration::from_secs(2);
/// How long reads pass by a member that refused one or could not be reached.
const READER_PAUSE: Duration = Duration::from_secs(1);
/// A member further behind its leader than this many log entries gets no reads: it is
/// catching up (a new learner), and its reads would wait for it.
const READER_MAX_LAG: u64 = 64;

/// A client of an n-node kvd cluster. Node `i` of `--nodes` must be the kvd started as `--shard i/n`.
///
/// A node that fails (refused connection, connection lost) is marked down for a short,
/// growing pause (50 ms doubling to 1 s): its requests then fail at once with
/// [`ClientError::Unavailable`] instead of each waiting for a connection attempt, so one dead
/// node costs the callers nothing on their other nodes. After the pause the next request
/// tries the node again.
pub struct Cluster {
    nodes: Vec<NodePool>,
    config: ClientConfig,
    epoch: Instant,
    /// Which group owns each slot, as far as redirects have told (the even split at first).
    slots: Arc<SlotTable>,
    /// `Moved` answers followed, and `TryAgain` answers sent again.
    redirects: AtomicU64,
    try_agains: AtomicU64,
}

/// The connection of a node's pool that control requests (stats, settings) use.
const CONTROL_SLOT: usize = 0;

impl Cluster {
    /// A cluster client that connects lazily, on first use of each node (and reconnects after
    /// a failure). Never fails on a node being down; calls to that node do.
    pub fn new(nodes: &[String], config: ClientConfig) -> Result<Cluster, ClientError> {
        if nodes.is_empty() {
            return Err(ClientError::BadNodes("no nodes given".into()));
        }
        let nodes: Vec<NodePool> = nodes
            .iter()
            .map(|addr| NodePool {
                addr: addr.clone(),
                members: parking_lot::RwLock::new(super::members(addr).map(str::to_string).collect()),
                grouped: AtomicBool::new(super::members(addr).nth(1).is_some()),
                current: AtomicUsize::new(0),
                slots: (0..config.conns_per_node.max(1))
                    .map(|_| AsyncMutex::new(None))
                    .collect(),
                next: AtomicUsize::new(0),
                down_until_ms: AtomicU64::new(0),
                retry_ms: AtomicU64::new(0),
                readers: Arc::new(Readers {
                    members: parking_lot::RwLock::new(match super::members(addr).nth(1) {
                        Some(_) => super::members(addr).map(|m| Reader::new(m.to_string())).collect(),
                        None => Vec::new(),
                    }),
                    // First asked once the client has run for a while: a one-shot client
                    // (a `kvd get`) costs the nodes no second connection.
                    asked_ms: AtomicU64::new(1),
                    ..Readers::default()
                }),
            })
            .collect();
        let groups = nodes.len() as u32;
        Ok(Cluster {
            nodes,
            config,
            epoch: Instant::now(),
            slots: Arc::new(SlotTable::for_client(groups)),
            redirects: AtomicU64::new(0),
            try_agains: AtomicU64::new(0),
        })
    }

    /// Connects every connection to every node now; fails with the first node that refuses.
    pub async fn connect(nodes: &[String], config: ClientConfig) -> Result<Cluster, ClientError> {
        let cluster = Cluster::new(nodes, config)?;
        for node in 0..cluster.nodes.len() {
            for slot in 0..cluster.nodes[node].slots.len() {
                cluster.connection_in(node, slot).await?;
            }
        }
        Ok(cluster)
    }

    /// Connects each node's first connection now (reachable, and the token accepted); the
    /// others open on first use. Control requests (stats, settings) always go over the first,
    /// so a client that sends its batches through [`Cluster::sibling`]s (kvbench's load
    /// threads) holds one connection per node of its own, not `conns_per_node`.
    pub async fn connect_first(nodes: &[String], config: ClientConfig) -> Result<Cluster, ClientError> {
        let cluster = Cluster::new(nodes, config)?;
        for node in 0..cluster.nodes.len() {
            cluster.connection_in(node, CONTROL_SLOT).await?;
        }
        Ok(cluster)
    }

    /// Another client of the same cluster with its own `conns_per_node` connections per node
    /// (made lazily, on the runtime that first uses them), sharing this client's slot table
    /// and starting from what it knows of each group's members and leader. A load generator
    /// that runs one runtime per thread gives each its own (see kvbench's engine).
    pub fn sibling(&self, conns_per_node: usize) -> Result<Cluster, ClientError> {
        let addrs: Vec<String> = self.nodes.iter().map(|n| n.addr.clone()).collect();
        let config = ClientConfig {
            conns_per_node: conns_per_node.max(1),
            ..self.config.clone()
        };
        let mut sibling = Cluster::new(&addrs, config)?;
        for (theirs, mine) in self.nodes.iter().zip(&sibling.nodes) {
            mine.members.write().clone_from(&theirs.members.read());
            mine.grouped
                .store(theirs.grouped.load(Ordering::Relaxed), Ordering::Relaxed);
            mine.current
                .store(theirs.current.load(Ordering::Relaxed), Ordering::Relaxed);
        }
        sibling.slots = self.slots.clone();
        Ok(sibling)
    }

    /// The client's slot table (shared: tools that route by themselves use it too).
    pub fn slots(&self) -> &Arc<SlotTable> {
        &self.slots
    }

    /// `Moved` answers this client followed, and `TryAgain` answers it sent again.
    pub fn redirects(&self) -> (u64, u64) {
        (
            self.redirects.load(Ordering::Relaxed),
            self.try_agains.load(Ordering::Relaxed),
        )
    }

    /// Node `asked` answered that group `owner` owns `slot` as of `epoch`: whether the op
    /// may be sent there (a group this client has, and not the one that answered), learning
    /// the owner when the epoch is news.
    pub fn follow_moved(&self, slot: u16, asked: usize, owner: u16, epoch: u32) -> bool {
        if usize::from(owner) >= self.nodes.len() || usize::from(owner) == asked {
            return false;
        }
        self.learn_moved(slot, owner, epoch);
        usize::from(self.slots.owner(slot)) != asked
    }

    /// A node answered that group `owner` owns `slot` as of `epoch`: the table learns it
    /// (when the client has that group and the epoch is news). Counted as a redirect.
    pub fn learn_moved(&self, slot: u16, owner: u16, epoch: u32) {
        self.redirects.fetch_add(1, Ordering::Relaxed);
        if usize::from(owner) < self.nodes.len() {
            self.slots.learn(slot, owner, epoch);
        }
    }

    /// Learns which group owns each slot from the groups themselves (each one's own
    /// table, as a Redis Cluster client reads `CLUSTER SLOTS` when it starts), so that a new
    /// client of a cluster whose slots have moved is not redirected slot by slot. A group
    /// that does not answer is skipped (its slots are learned from redirects). Returns how
    /// many slots the table changed.
    pub async fn learn_slot_map(&self) -> usize {
        let mut learned = 0;
        let mut req = BatchRequest::new();
        req.push(OpKind::SlotMap, b"", &[]);
        for g in 0..self.nodes.len() {
            let Ok(reply) = self.send_batch(g, &req).await else {
                continue;
            };
            let Ok(view) = reply.batch() else { continue };
            let OpReply::Found(bytes) = view.result(0) else {
                continue;
            };
            let Ok(entries) = crate::slots::decode_entries(bytes) else {
                continue;
            };
            for (s, e) in entries.iter().enumerate() {
                let served = matches!(e.state, SlotState::Owned | SlotState::Frozen);
                learned += usize::from(served && self.slots.learn(s as u16, g as u16, e.epoch));
            }
        }
        learned
    }

    /// Nodes in the cluster.
    pub fn node_count(&self) -> usize {
        self.nodes.len()
    }

    /// Node `node`'s address as given (a replica group's members joined by `|`).
    pub fn addr(&self, node: usize) -> &str {
        &self.nodes[node].addr
    }

    /// The member of shard `node`'s group requests go to now (the only one for a single
    /// node).
    pub fn member_addr(&self, node: usize) -> String {
        let pool = &self.nodes[node];
        if !self.is_group(node) {
            return pool.addr.clone();
        }
        let members = pool.members.read();
        let i = pool.current.load(Ordering::Relaxed) % members.len().max(1);
        members.get(i).map_or_else(|| pool.addr.clone(), String::clone)
    }

    /// The members of shard `node`'s group this client knows (the one node for a single node).
    pub fn members(&self, node: usize) -> Vec<String> {
        self.nodes[node].members.read().clone()
    }

    /// Moves shard `node`'s requests to the member named `leader` (added to the members if
    /// the client did not know it: the group has grown), else to the next member.
    fn follow(&self, node: usize, leader: Option<&str>) {
        let pool = &self.nodes[node];
        let now = pool.current.load(Ordering::Relaxed);
        let mut members = pool.members.upgradable_read();
        let named = match leader {
            Some(l) if !members.iter().any(|m| m == l) => {
                tracing::info!(shard = node, member = %l, "a group member not in --nodes leads; following it");
                let mut grown = parking_lot::RwLockUpgradableReadGuard::upgrade(members);
                grown.push(l.to_string());
                pool.grouped.store(true, Ordering::Relaxed);
                members = parking_lot::RwLockWriteGuard::downgrade_to_upgradable(grown);
                Some(members.len() - 1)
            }
            Some(l) => members.iter().position(|m| m == l),
            None => None,
        };
        let count = members.len().max(1);
        let next = named.unwrap_or(now + 1) % count;
        if next != now % count {
            tracing::debug!(shard = node, to = %members[next], "following the group's leader");
            pool.current.store(next, Ordering::Relaxed);
        }
    }

    fn is_group(&self, node: usize) -> bool {
        self.nodes[node].grouped.load(Ordering::Relaxed)
    }

    /// Whether another member than the one asked may serve shard `node`'s requests: it is a
    /// replica group, or a single node found leading a group whose members serve reads.
    fn has_replicas(&self, node: usize) -> bool {
        self.is_group(node) || !self.nodes[node].readers.members.read().is_empty()
    }

    /// How the client talks to the nodes.
    pub fn config(&self) -> &ClientConfig {
        &self.config
    }

    fn now_ms(&self) -> u64 {
        // +1 so that 0 always means "up".
        self.epoch.elapsed().as_millis() as u64 + 1
    }

    /// How much longer node `node` counts as down, if it does.
    pub fn down_for(&self, node: usize) -> Option<Duration> {
        let until = self.nodes[node].down_until_ms.load(Ordering::Relaxed);
        if until == 0 {
            return None;
        }
        let now = self.now_ms();
        (until > now).then(|| Duration::from_millis(until - now))
    }

    /// Whether some node is not known to be down.
    pub fn any_up(&self) -> bool {
        (0..self.nodes.len()).any(|n| self.down_for(n).is_none())
    }

    fn mark_down(&self, node: usize) {
        let pool = &self.nodes[node];
        let first = RETRY_FIRST.as_millis() as u64;
        let retry = (pool.retry_ms.load(Ordering::Relaxed) * 2).clamp(first, RETRY_MAX.as_millis() as u64);
        pool.retry_ms.store(retry, Ordering::Relaxed);
        pool.down_until_ms.store(self.now_ms() + retry, Ordering::Relaxed);
        tracing::debug!(addr = %pool.addr, retry_ms = retry, "node marked down");
    }

    fn mark_up(&self, node: usize) {
        let pool = &self.nodes[node];
        if pool.retry_ms.load(Ordering::Relaxed) != 0 {
            pool.retry_ms.store(0, Ordering::Relaxed);
            pool.down_until_ms.store(0, Ordering::Relaxed);
        }
    }

    /// Notes the outcome of a request to `node` for the down/up bookkeeping, and for a
    /// replica group which member to ask next.
    fn observe<T>(&self, node: usize, result: &Result<T, ClientError>) {
        match result {
            Ok(_) => self.mark_up(node),
            Err(ClientError::NotLeader { leader, .. }) => self.follow(node, leader.as_deref()),
            Err(
                ClientError::Connect { .. }
                | ClientError::NodeDown { .. }
                | ClientError::Stalled { .. }
                | ClientError::Server {
                    code: ErrorCode::ShuttingDown | ErrorCode::WrongGroup,
                    ..
                },
            ) if self.is_group(node) => self.follow(node, None),
            Err(
                ClientError::Connect { .. }
                | ClientError::NodeDown { .. }
                | ClientError::Server {
                    code: ErrorCode::ShuttingDown,
                    ..
                },
            ) => self.mark_down(node),
            Err(_) => {}
        }
    }

    async fn connection_in(&self, node: usize, slot: usize) -> Result<Arc<Connection>, ClientError> {
        let pool = &self.nodes[node];
        // The member to use, read once: the connection made below must go to the member it
        // is filed under. (Reading the leader again after the slot's lock filed a connection
        // to one member under another's index when the leader moved meanwhile; requests then
        // went to a follower that kept naming the leader the client thought it was asking,
        // and recording clients spun on "not the leader" for as long as it stayed alive.)
        let member = match self.is_group(node) {
            true => pool.current.load(Ordering::Relaxed) % pool.members.read().len().max(1),
            false => 0,
        };
        let mut guard = pool.slots[slot].lock().await;
        if let Some((_, conn)) = guard.as_ref().filter(|(m, c)| *m == member && c.is_alive()) {
            return Ok(conn.clone());
        }
        if let Some((_, old)) = guard.take().filter(|(_, c)| c.is_alive()) {
            // The group's leader moved: requests still waiting on the old member's connection
            // get their own answers (most often "not the leader": certainly not run) before it
            // closes; closing it now would turn them into unknown outcomes.
            let linger = self.config.request_timeout;
            tokio::spawn(async move {
                let until = tokio::time::Instant::now() + linger;
                while !old.is_idle() && tokio::time::Instant::now() < until {
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
                drop(old);
            });
        }
        let addr = match self.is_group(node) {
            true => pool
                .members
                .read()
                .get(member)
                .cloned()
                .unwrap_or_else(|| pool.addr.clone()),
            false => pool.addr.clone(),
        };
        let conn = Arc::new(self.open(&addr).await?);
        if self.is_group(node) {
            self.pinned(node, &conn).await?;
        }
        *guard = Some((member, conn.clone()));
        Ok(conn)
    }

    /// Pins a new connection to a member of shard `node`'s group to the group this client
    /// believes in (learned from the listed members first): a member of another group
    /// refuses it, nothing ran.
    async fn pinned(&self, node: usize, conn: &Connection) -> Result<(), ClientError> {
        let pool = &self.nodes[node];
        let timeout = self
            .config
            .request_timeout
            .min(self.config.connect_timeout.max(Duration::from_secs(1)));
        if pool.readers.pin.get() == 0 {
            let members = pool.members.read().clone();
            let ask = |addr: String| async move {
                let conn = self.open(&addr).await?;
                super::pin::pin(&conn, 0, timeout).await
            };
            pool.readers.pin.learn(&members, ask).await;
        }
        super::pin::pin(conn, pool.readers.pin.get(), timeout).await.map(|_| ())
    }

    /// A new connection to `addr`, with this client's limits, token and TLS.
    async fn open(&self, addr: &str) -> Result<Connection, ClientError> {
        let c = &self.config;
        Connection::open(
            addr,
            c.pipeline,
            c.max_frame,
            c.connect_timeout,
            c.auth.as_ref(),
            c.tls.as_ref(),
        )
        .await
    }

    /// The next connection slot of `node`'s pool, round-robin.
    fn next_slot(&self, node: usize) -> usize {
        let pool = &self.nodes[node];
        pool.next.fetch_add(1, Ordering::Relaxed) % pool.slots.len()
    }

    /// A connection to `node`, round-robin over its pool; fails at once while the node is
    /// marked down.
    pub(crate) async fn connection(&self, node: usize) -> Result<Arc<Connection>, ClientError> {
        if let Some(left) = self.down_for(node) {
            return Err(ClientError::Unavailable {
                addr: self.addr(node).to_string(),
                retry_in: left,
            });
        }
        let conn = self.connection_in(node, self.next_slot(node)).await;
        self.observe(node, &conn);
        conn
    }

    /// Queues a batch for `node` (all its keys must belong to it) without waiting for the reply.
    /// A batch of reads only goes to the next member of a replica group that serves reads
    /// (`--reads`), else to the leader.
    pub async fn start_batch(&self, node: usize, batch: &BatchRequest) -> Result<InFlight, ClientError> {
        if self.config.reads != ReadFrom::Leader {
            self.refresh_topology(node);
            if batch.reads_only()
                && let Some((reader, conn)) = self.reader(node).await
            {
                match conn
                    .start(|id, buf| encode_frame(FrameKind::BatchRequest, id, batch, buf))
                    .await
                {
                    Ok(mut flight) => {
                        flight.reader = true;
                        return Ok(flight);
                    }
                    Err(_) => self.avoid_reader(&reader),
                }
            }
        }
        let conn = self.connection(node).await?;
        let started = conn
            .start(|id, buf| encode_frame(FrameKind::BatchRequest, id, batch, buf))
            .await;
        self.observe(node, &started);
        started
    }

    /// Waits for the reply to a batch started on `node` with [`Cluster::start_batch`].
    pub async fn finish_batch(&self, node: usize, flight: InFlight) -> Result<Reply, ClientError> {
        let reader = flight.reader.then(|| flight.addr());
        let reply = match flight.wait(self.config.request_timeout).await {
            // A replica group's member that does not lead ran nothing: an error, so that
            // the next request goes to the member it names. So is a node's refusal (shutting
            // down, not in the group asked for: nothing ran), so that it is sent to another
            // member. (Left as a reply, a refusal was only read as an error by the caller,
            // past the resending: during a rolling restart, reads a member refused while it
            // shut down failed instead of going to the next member.)
            Ok(r) if matches!(r.kind, FrameKind::NotLeader | FrameKind::ErrorResponse) => Err(r.unexpected()),
            other => other,
        };
        match reader {
            // A member that could not serve a read is passed by for a while (the caller
            // sends the batch again, to the next member or the leader); the leader's
            // bookkeeping is not about it.
            Some(addr) => {
                if reply.as_ref().is_err_and(another_member_may_serve)
                    && let Some(r) = self.nodes[node]
                        .readers
                        .members
                        .read()
                        .iter()
                        .find(|r| *r.addr == *addr)
                {
                    self.avoid_reader(r);
                }
            }
            None => self.observe(node, &reply),
        }
        reply
    }

    /// The next member of `node`'s group that reads may go to, and a connection to it;
    /// `None` when none is usable now (reads go to the leader then).
    async fn reader(&self, node: usize) -> Option<(Arc<Reader>, Arc<Connection>)> {
        let readers = &self.nodes[node].readers;
        let count = readers.members.read().len();
        let start = readers.next.fetch_add(1, Ordering::Relaxed);
        for k in 0..count {
            let r = readers.members.read().get((start + k) % count).cloned()?;
            if r.avoid_until_ms.load(Ordering::Relaxed) > self.now_ms() {
                continue;
            }
            match self.reader_connection(node, &r).await {
                Ok(conn) => return Some((r, conn)),
                Err(e) => {
                    tracing::debug!(member = %r.addr, error = %e, "a member for reads cannot be reached");
                    self.avoid_reader(&r);
                }
            }
        }
        None
    }

    fn avoid_reader(&self, r: &Reader) {
        let until = self.now_ms() + READER_PAUSE.as_millis() as u64;
        r.avoid_until_ms.store(until, Ordering::Relaxed);
    }

    /// `r`'s connection, opened (and told the staleness it may answer with) when needed.
    async fn reader_connection(&self, node: usize, r: &Reader) -> Result<Arc<Connection>, ClientError> {
        let mut guard = r.conn.lock().await;
        if let Some(conn) = guard.as_ref().filter(|c| c.is_alive()) {
            return Ok(conn.clone());
        }
        let c = &self.config;
        let conn = Arc::new(self.open(&r.addr).await?);
        self.pinned(node, &conn).await?;
        if let ReadFrom::Stale(bound) = c.reads {
            let ms = u32::try_from(bound.as_millis()).unwrap_or(u32::MAX).max(1);
            let reply = conn
                .start(|id, buf: &mut AlignedVec| {
                    buf.clear();
                    buf.extend_from_slice(
                        &crate::frame::FrameHeader {
                            kind: FrameKind::StaleReads,
                            len: 4,
                            id,
                        }
                        .encode(),
                    );
                    buf.extend_from_slice(&ms.to_le_bytes());
                    Ok(())
                })
                .await?
                .wait(c.request_timeout)
                .await?;
            if reply.kind != FrameKind::ConfigOk {
                return Err(reply.unexpected());
            }
        }
        *guard = Some(conn.clone());
        Ok(conn)
    }

    /// Every [`TOPOLOGY_EVERY`], asks shard `node` (in the background) which members its
    /// group has, voters and learners, and which of them have caught up: those serve its
    /// reads from then on. A single node found to lead a group of several becomes a group
    /// to this client.
    fn refresh_topology(&self, node: usize) {
        let pool = &self.nodes[node];
        let readers = &pool.readers;
        let now = self.now_ms();
        let asked = readers.asked_ms.load(Ordering::Relaxed);
        if (asked != 0 && now.saturating_sub(asked) < TOPOLOGY_EVERY.as_millis() as u64)
            || readers.asking.swap(true, Ordering::Relaxed)
        {
            return;
        }
        readers.asked_ms.store(now, Ordering::Relaxed);
        let (readers, addr) = (pool.readers.clone(), self.member_addr(node));
        let config = ClientConfig {
            conns_per_node: 1,
            request_timeout: self.config.request_timeout.min(TOPOLOGY_EVERY),
            ..self.config.clone()
        };
        tokio::spawn(async move {
            let asked = async {
                let one = Cluster::new(std::slice::from_ref(&addr), config).ok()?;
                one.stats(0).await.ok()
            };
            if let Some(stats) = asked.await {
                let g = &stats.group;
                let behind = |m: &String| g.lag.iter().find(|l| l.addr == *m).map_or(0, |l| l.behind);
                let mut serving: Vec<String> = g
                    .members
                    .iter()
                    .chain(&g.learners)
                    .filter(|m| behind(m) <= READER_MAX_LAG)
                    .cloned()
                    .collect();
                serving.sort();
                serving.dedup();
                let mut members = readers.members.write();
                let now: Vec<&str> = members.iter().map(|r| r.addr.as_str()).collect();
                if serving.len() > 1 && serving.iter().map(String::as_str).ne(now.iter().copied()) {
                    tracing::debug!(%addr, ?serving, "a replica group's members for reads");
                    let kept: Vec<Arc<Reader>> = serving
                        .into_iter()
                        .map(|m| match members.iter().find(|r| r.addr == m) {
                            Some(r) => r.clone(),
                            None => Reader::new(m),
                        })
                        .collect();
                    *members = kept;
                } else if serving.len() <= 1 && !members.is_empty() && g.role.in_group() {
                    members.clear();
                }
            }
            readers.asking.store(false, Ordering::Relaxed);
        });
    }

    /// Sends a batch to `node` and waits for the reply; read results with [`Reply::batch`].
    /// For a replica group, a batch that certainly did not run (the member asked does not
    /// lead, or cannot be reached) is sent again to the member named or the next one, while
    /// the request timeout lasts; one whose outcome is unknown is never resent.
    pub async fn send_batch(&self, node: usize, batch: &BatchRequest) -> Result<Reply, ClientError> {
        let began = tokio::time::Instant::now();
        let mut reply = self.send_batch_once(node, batch).await;
        while self.has_replicas(node)
            && reply.as_ref().is_err_and(another_member_may_serve)
            && began.elapsed() < self.config.request_timeout
        {
            // A named leader is asked at once. (Pausing before asking it a second time, in
            // case members disagree on the leader, made failover slower: median 1.9 s
            // against 1.5 s over 20 kills.)
            if !matches!(&reply, Err(ClientError::NotLeader { leader: Some(_), .. })) {
                tokio::time::sleep(FAILOVER_PAUSE).await;
            }
            reply = self.send_batch_once(node, batch).await;
        }
        reply
    }

    async fn send_batch_once(&self, node: usize, batch: &BatchRequest) -> Result<Reply, ClientError> {
        let flight = self.start_batch(node, batch).await?;
        self.finish_batch(node, flight).await
    }

    /// Whether a failure of a request to `node` should be tried again with
    /// [`Cluster::send_batch`]: the node is a replica group and the request certainly did
    /// not run there.
    pub fn worth_resending(&self, node: usize, e: &ClientError) -> bool {
        self.has_replicas(node) && another_member_may_serve(e)
    }

    /// Runs `ops` across the cluster: splits them by owner, sends the parts to their nodes
    /// concurrently and returns one result per op, in op order. A node that fails fails only
    /// the ops routed to it.
    ///
    /// Gets whose values did not fit in a reply (a node bounds each reply by its frame
    /// limit) are asked again in further rounds; each round returns at least one value per
    /// node, so this ends.
    ///
    /// Ops answered `Moved` are sent to the group named (learning its slot), and ops answered
    /// `TryAgain` (their slot was being handed over) again after a short pause, while the
    /// request's time lasts.
    pub async fn batch(&self, ops: &[Op<'_>]) -> Vec<Result<Outcome, ClientError>> {
        let began = tokio::time::Instant::now();
        let mut results = self.batch_once(ops).await;
        let (mut redirects, mut waits) = (0u32, 0u32);
        loop {
            let left: Vec<usize> = (0..results.len())
                .filter(|&i| self.worth_redirecting(&results[i]))
                .collect();
            let elapsed = began.elapsed();
            if left.is_empty() || elapsed >= self.config.request_timeout {
                break;
            }
            let moved = left
                .iter()
                .any(|&i| matches!(results[i], Err(ClientError::Moved { .. })));
            if moved {
                redirects += 1;
                if redirects > MAX_REDIRECT_ROUNDS {
                    break;
                }
            }
            if left
                .iter()
                .any(|&i| matches!(results[i], Err(ClientError::TryAgain { .. })))
            {
                self.try_agains.fetch_add(1, Ordering::Relaxed);
                waits += 1;
                let pause = (TRY_AGAIN_PAUSE * waits).min(MAX_TRY_AGAIN_PAUSE);
                tokio::time::sleep(pause.min(self.config.request_timeout - elapsed)).await;
            }
            let again: Vec<Op<'_>> = left.iter().map(|&i| ops[i]).collect();
            for (i, r) in left.into_iter().zip(self.batch_once(&again).await) {
                results[i] = r;
            }
        }
        loop {
            let left: Vec<usize> = (0..results.len())
                .filter(|&i| matches!(results[i], Err(ClientError::ReplyTooLarge { .. })))
                .collect();
            if left.is_empty() {
                return results;
            }
            let again: Vec<Op<'_>> = left.iter().map(|&i| ops[i]).collect();
            let retried = self.batch_once(&again).await;
            let progress = retried
                .iter()
                .any(|r| !matches!(r, Err(ClientError::ReplyTooLarge { .. })));
            for (i, r) in left.into_iter().zip(retried) {
                results[i] = r;
            }
            if !progress {
                return results;
            }
        }
    }

    async fn batch_once(&self, ops: &[Op<'_>]) -> Vec<Result<Outcome, ClientError>> {
        let mut parts = NodeBatches::with_table(self.nodes.len(), self.slots.clone());
        let mut index: Vec<Vec<usize>> = vec![Vec::new(); self.nodes.len()];
        for (i, op) in ops.iter().enumerate() {
            let node = match *op {
                Op::Get(k) => parts.push(OpKind::Get, k, &[]),
                Op::Put(k, v) => parts.push(OpKind::Put, k, v),
                Op::Delete(k) => parts.push(OpKind::Delete, k, &[]),
                Op::PutIfAbsent(k, v) => parts.push(OpKind::PutIfAbsent, k, v),
                Op::PutIfPresent(k, v) => parts.push(OpKind::PutIfPresent, k, v),
                Op::IncrBy(k, by) => parts.push(OpKind::IncrBy, k, &by.to_le_bytes()),
                Op::Append(k, v) => parts.push(OpKind::Append, k, v),
                Op::SetRange(k, offset, v) => parts.push(OpKind::SetRange, k, &[&offset.to_le_bytes()[..], v].concat()),
                Op::PutWith(k, p) => parts.push(OpKind::PutWith, k, &p.encode()),
                Op::Expire(k, e) => parts.push(OpKind::Expire, k, &e.encode()),
                Op::Ttl(k) => parts.push(OpKind::Ttl, k, &[]),
                Op::Raw(kind, k, v) => parts.push(kind, k, v),
            };
            index[node].push(i);
        }
        // Queue every part first, then collect: the nodes work concurrently.
        let began = tokio::time::Instant::now();
        let mut started = Vec::with_capacity(self.nodes.len());
        for (node, req) in parts.non_empty() {
            started.push((node, self.start_batch(node, req).await));
        }
        let mut results: Vec<Option<Result<Outcome, ClientError>>> = vec![None; ops.len()];
        for (node, flight) in started {
            let idx = &index[node];
            let mut reply = match flight {
                Ok(f) => self.finish_batch(node, f).await,
                Err(e) => Err(e),
            };
            // A replica group's leader moved, or the member asked is gone: the part did not
            // run, so it is sent again, to the member named or the next one, while the
            // request's time lasts. (An outcome that may have happened is never resent.)
            if self.has_replicas(node)
                && reply.as_ref().is_err_and(another_member_may_serve)
                && began.elapsed() < self.config.request_timeout
            {
                reply = self.send_batch(node, parts.batch(node)).await;
            }
            let view = reply.as_ref().map_err(Clone::clone).and_then(|r| r.batch());
            let err = match view {
                Ok(view) if view.len() == idx.len() => {
                    for (j, &i) in idx.iter().enumerate() {
                        let outcome = match view.result(j) {
                            OpReply::Moved { slot, owner, epoch } if self.follow_moved(slot, node, owner, epoch) => {
                                Err(self.moved(node, owner, epoch))
                            }
                            // A node behind what this client has heard (a target that has not
                            // applied its hand-over yet): the slot is changing hands there,
                            // so the op is asked again after a pause, as "try again".
                            OpReply::Moved { slot, epoch, .. } if epoch < self.slots.get(slot).epoch => {
                                Err(ClientError::TryAgain {
                                    addr: self.addr(node).to_string(),
                                })
                            }
                            reply => self.outcome(node, reply),
                        };
                        results[i] = Some(outcome);
                    }
                    continue;
                }
                Ok(view) => ClientError::Protocol {
                    addr: self.addr(node).to_string(),
                    reason: format!("{} results for {} ops", view.len(), idx.len()),
                },
                Err(err) => err,
            };
            for &i in idx {
                results[i] = Some(Err(err.clone()));
            }
        }
        // Every op was routed to exactly one node, and every node's ops got a result above.
        results
            .into_iter()
            .map(|r| {
                r.unwrap_or_else(|| {
                    Err(ClientError::Encode {
                        reason: "op was not routed".into(),
                    })
                })
            })
            .collect()
    }

    fn outcome(&self, node: usize, reply: OpReply<'_>) -> Result<Outcome, ClientError> {
        let addr = || self.addr(node).to_string();
        match reply {
            OpReply::Found(v) => Ok(Outcome::Value(v.to_vec())),
            OpReply::NotFound => Ok(Outcome::NotFound),
            OpReply::Stored => Ok(Outcome::Stored),
            OpReply::Deleted => Ok(Outcome::Deleted(true)),
            OpReply::Absent => Ok(Outcome::Deleted(false)),
            OpReply::Moved { owner, epoch, .. } => Err(self.moved(node, owner, epoch)),
            OpReply::TryAgain => Err(ClientError::TryAgain { addr: addr() }),
            OpReply::Malformed(reason) => Err(ClientError::MalformedOp {
                addr: addr(),
                reason: reason.to_string(),
            }),
            OpReply::TooLarge => Err(ClientError::ReplyTooLarge { addr: addr() }),
            OpReply::OutOfMemory => Err(ClientError::OutOfMemory { addr: addr() }),
            OpReply::NotStored => Ok(Outcome::NotStored),
            OpReply::Counted(sum) => Ok(Outcome::Counted(sum)),
            OpReply::NotAnInteger => Ok(Outcome::NotAnInteger),
            OpReply::Overflow => Ok(Outcome::Overflow),
            OpReply::Aborted => Ok(Outcome::Aborted),
        }
    }

    /// Whether a result is a redirect to follow (to another group this client has) or a
    /// slot being handed over.
    fn worth_redirecting(&self, r: &Result<Outcome, ClientError>) -> bool {
        match r {
            Err(ClientError::Moved { addr, owner, .. }) => {
                (*owner as usize) < self.nodes.len() && self.addr(*owner as usize) != addr
            }
            Err(ClientError::TryAgain { .. }) => true,
            _ => false,
        }
    }

    fn moved(&self, node: usize, owner: u16, epoch: u32) -> ClientError {
        ClientError::Moved {
            addr: self.addr(node).to_string(),
            owner: u32::from(owner),
            epoch,
            listed: self.node_count() as u32,
        }
    }

    async fn one(&self, op: Op<'_>) -> Result<Outcome, ClientError> {
        self.batch(&[op]).await.pop().unwrap_or_else(|| {
            Err(ClientError::Encode {
                reason: "no result".into(),
            })
        })
    }

    /// The value of `key`, or `None` if it is absent.
    pub async fn get(&self, key: &[u8]) -> Result<Option<Vec<u8>>, ClientError> {
        match self.one(Op::Get(key)).await? {
            Outcome::Value(v) => Ok(Some(v)),
            _ => Ok(None),
        }
    }

    /// Stores `value` under `key`.
    pub async fn put(&self, key: &[u8], value: &[u8]) -> Result<(), ClientError> {
        self.one(Op::Put(key, value)).await.map(|_| ())
    }

    /// Stores `value` under `key` for `ttl` (from when the node stores it; Redis's
    /// `SET key value PX ms`).
    pub async fn put_for(&self, key: &[u8], value: &[u8], ttl: std::time::Duration) -> Result<(), ClientError> {
        use crate::expiry::{Deadline, PutIf, PutTtl, PutWith};
        let put = PutWith {
            cond: PutIf::Always,
            ttl: PutTtl::Until(Deadline::after(ttl)),
            value,
        };
        self.one(Op::PutWith(key, put)).await.map(|_| ())
    }

    /// Reads `key`'s deadline (Unix milliseconds): `Some(None)` for a key without one,
    /// `None` for an absent key.
    pub async fn deadline(&self, key: &[u8]) -> Result<Option<Option<u64>>, ClientError> {
        match self.one(Op::Ttl(key)).await? {
            Outcome::Counted(at) => Ok(Some(u64::try_from(at).ok())),
            _ => Ok(None),
        }
    }

    /// Adds `by` to `key`'s integer value (an absent key counts as 0) and returns the sum:
    /// `Outcome::Counted`, or `NotAnInteger`/`Overflow` when nothing changed.
    pub async fn incr_by(&self, key: &[u8], by: i64) -> Result<Outcome, ClientError> {
        self.one(Op::IncrBy(key, by)).await
    }

    /// Deletes `key`; returns whether it existed.
    pub async fn delete(&self, key: &[u8]) -> Result<bool, ClientError> {
        Ok(matches!(self.one(Op::Delete(key)).await?, Outcome::Deleted(true)))
    }

    /// The statistics of node `node`. A stats request always tries the node, even while it
    /// is marked down: it is how a watcher finds out that the node is back.
    pub async fn stats(&self, node: usize) -> Result<NodeStats, ClientError> {
        let result = self.stats_on(node).await;
        self.observe(node, &result);
        result
    }

    async fn stats_on(&self, node: usize) -> Result<NodeStats, ClientError> {
        let conn = self.connection_in(node, CONTROL_SLOT).await?;
        let reply = conn
            .start(|id, buf: &mut AlignedVec| {
                encode_empty_frame(FrameKind::StatsRequest, id, buf);
                Ok(())
            })
            .await?
            .wait(self.config.request_timeout)
            .await?;
        if reply.kind != FrameKind::StatsResponse {
            return Err(reply.unexpected());
        }
        decode_stats(&reply.body).map_err(|e| ClientError::Protocol {
            addr: self.addr(node).to_string(),
            reason: e.to_string(),
        })
    }

    /// Sends a frame of `kind` with `body` as it is to member `node` (a single address) and
    /// returns the reply, whatever its kind (replica groups' raft messages use it).
    pub async fn call(&self, node: usize, kind: FrameKind, body: &[u8]) -> Result<Reply, ClientError> {
        self.call_with(node, kind, |buf| {
            buf.extend_from_slice(body);
            Ok(())
        })
        .await
    }

    /// [`Cluster::call`] with a body that `body` writes straight into the frame's buffer
    /// (a large raft append is serialised once, not serialised and then copied).
    pub async fn call_with(
        &self,
        node: usize,
        kind: FrameKind,
        body: impl FnOnce(&mut AlignedVec) -> Result<(), String>,
    ) -> Result<Reply, ClientError> {
        let conn = self.connection_in(node, self.next_slot(node)).await;
        self.observe(node, &conn);
        let reply = conn?
            .start(|id, buf: &mut AlignedVec| crate::wire::encode_frame_with(kind, id, buf, body))
            .await?
            .wait(self.config.request_timeout)
            .await;
        self.observe(node, &reply);
        reply
    }

    /// Changes node `node`'s settings at run time (see [`ConfigRequest`]).
    pub async fn configure(&self, node: usize, change: &ConfigRequest) -> Result<(), ClientError> {
        let conn = self.connection_in(node, CONTROL_SLOT).await?;
        let reply = conn
            .start(|id, buf| encode_frame(FrameKind::ConfigRequest, id, change, buf))
            .await?
            .wait(self.config.request_timeout)
            .await?;
        match reply.kind {
            FrameKind::ConfigOk => Ok(()),
            _ => Err(reply.unexpected()),
        }
    }

    /// Asks every node which shard it serves (all at once, within the request timeout) and
    /// returns what is wrong with the node list (see [`check_layout`]); nodes that do not
    /// answer are not judged.
    pub async fn check_layout(&self) -> Vec<LayoutProblem> {
        let entries: Vec<String> = self.nodes.iter().map(|n| n.addr.clone()).collect();
        let members = super::expand_members(&entries);
        let mut asks = tokio::task::JoinSet::new();
        for (i, (_, addr)) in members.iter().enumerate() {
            let addr = addr.clone();
            let config = self.config.clone();
            asks.spawn(async move {
                let one = Cluster::new(std::slice::from_ref(&addr), config).ok()?;
                let s = one.stats(0).await.ok()?;
                let leads = matches!(s.group.role, GroupRole::None | GroupRole::Leader);
                Some((i, s.shard, leads.then_some(s.slots)))
            });
        }
        let mut member_shards = vec![None; members.len()];
        let mut served: Vec<Option<Vec<[u16; 2]>>> = vec![None; entries.len()];
        while let Some(done) = asks.join_next().await {
            if let Ok(Some((i, shard, slots))) = done {
                member_shards[i] = Some(shard);
                if let Some(slots) = slots {
                    served[members[i].0] = Some(slots);
                }
            }
        }
        let (shards, mut problems) = super::entry_shards(&entries, &member_shards);
        problems.extend(check_layout(&entries, &shards));
        problems.extend(super::layout::slots_served_twice(&entries, &served));
        problems
    }

    /// Waits until every node answers a stats request, or `within` passes.
    pub async fn wait_ready(&self, within: Duration) -> Result<(), ClientError> {
        let deadline = tokio::time::Instant::now() + within;
        for node in 0..self.nodes.len() {
            loop {
                match self.stats(node).await {
                    Ok(_) => break,
                    Err(e) if tokio::time::Instant::now() >= deadline => return Err(e),
                    Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A load thread's client sees what the first client learned of slots and leaders, and
    /// what either learns of slots later; its connections are its own.
    #[test]
    fn a_sibling_shares_the_slot_table_and_starts_from_the_known_leader() {
        let config = ClientConfig {
            conns_per_node: 4,
            ..ClientConfig::default()
        };
        let first = Cluster::new(&["a:1|b:2|c:3".to_string(), "d:4".to_string()], config).unwrap();
        first.nodes[0].current.store(2, Ordering::Relaxed);
        first.nodes[0].members.write().push("e:5".to_string());
        let sibling = first.sibling(1).unwrap();
        assert_eq!(sibling.config().conns_per_node, 1);
        assert_eq!(sibling.nodes[0].slots.len(), 1);
        assert_eq!(first.nodes[0].slots.len(), 4);
        assert_eq!(sibling.nodes[0].current.load(Ordering::Relaxed), 2);
        assert_eq!(*sibling.nodes[0].members.read(), ["a:1", "b:2", "c:3", "e:5"]);
        assert!(sibling.nodes[0].grouped.load(Ordering::Relaxed));
        assert!(!sibling.nodes[1].grouped.load(Ordering::Relaxed));
        // Slot 10 belongs to group 0 in the even split; a redirect either client follows
        // moves it for both.
        assert_eq!(sibling.slots().owner(10), 0);
        first.learn_moved(10, 1, 1);
        assert_eq!(sibling.slots().owner(10), 1);
        sibling.learn_moved(11, 1, 1);
        assert_eq!(first.slots().owner(11), 1);
    }
}
