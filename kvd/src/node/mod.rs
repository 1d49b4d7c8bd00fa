//! The state one kvd process shares between its connections.

use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use kvshared::frame::AlignedVec;
use kvshared::latency::LatencyStats;
use kvshared::stats::{Counts, GroupFigures, NodeStats, RecentLoad};
use kvshared::wire::{BatchResponse, BatchView, ConfigRequest, OpKind, OpStatus, ReplyView};
use tokio::sync::oneshot;

use crate::counters::Counters;
use crate::durable::raft::{DurableShard, LogAnswer, SubmitError};
use crate::durable::{DurableConfig, GroupConfig};
use crate::latency::{KINDS, OpLatencies};
use crate::sampler::Sampler;
use crate::store::{CappedRoom, ReplyRoom, Store};

mod config;
mod error;
pub(crate) mod expiry_task;
pub use config::{
    ClusterConfig, DEFAULT_IDLE_TIMEOUT, DEFAULT_MAX_BUFFER_MEMORY, DEFAULT_READ_TIMEOUT, DEFAULT_WRITE_TIMEOUT,
    Durability, EngineConfig, GroupMember, NodeConfig,
};
pub use error::{ConfigError, NodeError};

/// A connection's reusable memory for running its batches (grouping ops by map shard):
/// one per connection, handed to every [`Node::execute`].
#[derive(Default)]
pub struct Scratch(crate::store::Scratch);

/// The bytes `MEMORY USAGE` reports for a key of `key_len` bytes holding `value_len` (what
/// the store accounts for it against `--max-memory`).
pub fn memory_usage(key_len: usize, value_len: usize) -> usize {
    crate::store::entry_bytes(key_len, value_len)
}

/// Redis's `maxmemory-policy` for kvd's eviction policy named `name` (INFO, CONFIG GET).
pub fn redis_policy(name: &str) -> &'static str {
    crate::store::Eviction::from_name(name).map_or("noeviction", crate::store::Eviction::redis_name)
}

/// Reads how many log lines the process dropped (set once by the binary that set up logging).
static LOG_LINES_DROPPED: OnceLock<Box<dyn Fn() -> u64 + Send + Sync>> = OnceLock::new();

/// Tells every node of this process how to read the log's dropped-lines count.
pub fn report_log_drops(read: impl Fn() -> u64 + Send + Sync + 'static) {
    let _ = LOG_LINES_DROPPED.set(Box::new(read));
}

/// The store, the counters and the system sampler of one node.
pub struct Node {
    /// How it was set up.
    config: NodeConfig,
    /// The data.
    store: Arc<Store>,
    /// What it has done.
    counters: Arc<Counters>,
    /// How long its batches took, per op kind.
    latencies: Arc<OpLatencies>,
    /// The shard's log, with `--data-dir`: batches with writes go through it.
    durable: Option<DurableShard>,
    /// With `--data-dir`: the lock that keeps other processes off it, held while the node lives.
    lock: Option<crate::durable::meta::DataDirLock>,
    sampler: Sampler,
    started: Instant,
    /// The cumulative figures where the current load window began, and the last window's
    /// load (see [`RecentLoad`]).
    window: parking_lot::Mutex<LoadWindow>,
    /// Where the RESP front listens, once bound (reported in stats for the other nodes'
    /// `CLUSTER SLOTS` and `-MOVED`).
    resp_addr: std::sync::OnceLock<std::net::SocketAddr>,
}

struct LoadWindow {
    began: Instant,
    counts: Counts,
    latency: LatencyStats,
    last: RecentLoad,
}

impl LoadWindow {
    /// Ends the current window if it is old enough, and returns the last complete one.
    fn advance(&mut self, counts: &Counts, latency: &LatencyStats) -> RecentLoad {
        let ms = self.began.elapsed().as_millis() as u64;
        if ms >= RecentLoad::MIN_WINDOW_MS {
            self.last = RecentLoad::between((&self.counts, &self.latency), (counts, latency), ms);
            self.began = Instant::now();
            self.counts = *counts;
            self.latency = latency.clone();
        }
        self.last.clone()
    }
}

impl Node {
    /// A node with an empty store; starts the sampler thread. Fails if the store's
    /// preallocation cannot be had.
    pub fn new(config: NodeConfig) -> std::io::Result<Node> {
        let mut store = Store::with_limit(
            config.cluster.shard,
            config.engine.map_shards,
            config.engine.capacity,
            config.engine.memory,
        )?;
        if config.cluster.no_slots {
            store.start_without_slots();
        }
        #[cfg(test)]
        if config.engine.fault_stale_reads {
            store.enable_stale_reads();
        }
        if config.durability.is_some() {
            // An evicted key would come back on replay: a durable node refuses writes at
            // its cap instead (see `ServeArgs::validate`).
            store.never_evict();
            store.writes_through_log_only();
        } else {
            store.cap_values(u64::from(config.edge.max_frame));
        }
        Ok(Node {
            store: Arc::new(store),
            counters: Arc::new(Counters::default()),
            latencies: Arc::new(OpLatencies::default()),
            durable: None,
            lock: None,
            sampler: Sampler::start(config.engine.sample_period),
            started: Instant::now(),
            window: parking_lot::Mutex::new(LoadWindow {
                began: Instant::now(),
                counts: Counts::default(),
                latency: LatencyStats::default(),
                last: RecentLoad::default(),
            }),
            resp_addr: std::sync::OnceLock::new(),
            config,
        })
    }

    /// With `--data-dir`: opens the shard's log there (creating it on first start, refusing a
    /// directory of another shard), replays it into the store, and logs what was recovered.
    pub async fn open_data_dir(&mut self) -> std::io::Result<()> {
        let Some(durability) = self.config.durability.clone() else {
            return Ok(());
        };
        let dir = durability.data_dir;
        let started = Instant::now();
        // First of all: no other kvd may serve this directory while this one does.
        self.lock = Some(crate::durable::meta::DataDirLock::take(&dir)?);
        crate::durable::meta::check_shard(&dir, self.config.cluster.shard, self.config.cluster.no_slots)?;
        let (shard, recovery) = DurableShard::open(
            &dir,
            self.store.clone(),
            self.counters.clone(),
            DurableConfig {
                log: durability.log,
                group: self.config.cluster.group.as_ref().map(|g| GroupConfig {
                    peers: g.initial.clone(),
                    shard: self.config.cluster.shard,
                    client: kvshared::client::ClientConfig {
                        auth: self.config.edge.auth.clone(),
                        max_frame: self.config.edge.max_frame,
                        request_timeout: Duration::from_secs(2),
                        connect_timeout: Duration::from_millis(500),
                        ..Default::default()
                    },
                }),
            },
        )
        .await
        .map_err(|e| std::io::Error::other(format!("{}: {e}", dir.display())))?;
        tracing::info!(
            dir = %dir.display(),
            keys = self.store.len(),
            snapshot = %recovery.snapshot.as_ref().map_or("none".into(), |(p, _)| p.display().to_string()),
            snapshot_pairs = recovery.snapshot.as_ref().map_or(0, |(_, n)| *n),
            entries_replayed = recovery.entries_replayed,
            took_ms = started.elapsed().as_millis() as u64,
            fsync = ?durability.log.fsync,
            "recovered the shard"
        );
        self.durable = Some(shard);
        Ok(())
    }

    /// What this node's active expiry cycle does now (see `expiry_task`).
    pub(crate) fn expiry_mode(&self) -> crate::node::expiry_task::ExpiryMode {
        use crate::node::expiry_task::ExpiryMode;
        match &self.durable {
            None => ExpiryMode::Remove,
            Some(log) if log.leadership().is_ok() => ExpiryMode::Log,
            Some(_) => ExpiryMode::Follow,
        }
    }

    /// Logs an `Expired` op for each of `keys` (a durable leader's expiry cycle); the
    /// answer comes once the entry is applied. `None` when there is nothing to log.
    pub(crate) fn log_expired(&self, keys: &[Vec<u8>]) -> Option<oneshot::Receiver<LogAnswer>> {
        let log = self.durable.as_ref()?;
        if keys.is_empty() {
            return None;
        }
        let clock = kvshared::expiry::clock_value(kvshared::expiry::now_ms());
        let ops = std::iter::once((OpKind::Clock, &[][..], &clock[..]))
            .chain(keys.iter().map(|k| (OpKind::Expired, &k[..], &[][..])));
        let batch = crate::durable::entry::encode_batch(ops).ok()?;
        Some(log.submit(batch))
    }

    /// Adds what a background job did to the node's counters.
    pub(crate) fn count(&self, tally: &Counts) {
        self.counters.add_counts(0, tally);
    }

    /// Stops the shard's log (at shutdown, after the connections are done).
    pub async fn close(&self) {
        if let Some(log) = &self.durable {
            log.shutdown().await;
        }
    }

    /// Runs a batch: the one entry point into the node for every front (the binary protocol,
    /// RESP and HTTP), so that what a batch does is decided here, per mode. Every op's
    /// service time (from here to its result being ready) is recorded per op kind.
    ///
    /// In memory, the store runs it at once and this returns `None`. With a data dir, the
    /// reads that need no log run at once as well; the writes (and the reads that follow a
    /// write of their key in the batch) go to the shard's log as one entry, and the returned
    /// [`LogWait`] fills in their results once that entry is committed and applied. The
    /// caller may take further requests meanwhile: many connections' batches share a commit.
    pub fn execute(
        &self,
        batch: &BatchView<'_>,
        out: &mut BatchResponse,
        room: &mut impl ReplyRoom,
        scratch: &mut Scratch,
        tally: &mut Counts,
    ) -> Option<LogWait> {
        self.execute_reading(batch, out, room, scratch, tally, ReadMode::Linearizable)
    }

    /// [`Node::execute`], for a connection that has said how fresh its reads must be. In a
    /// replica group, a batch of reads only may run on a follower or learner: linearizable
    /// ones once it has applied the leader's read index, bounded-stale ones at once while it
    /// is within the bound (else as linearizable ones). Batches with writes go to the leader.
    pub fn execute_reading(
        &self,
        batch: &BatchView<'_>,
        out: &mut BatchResponse,
        room: &mut impl ReplyRoom,
        scratch: &mut Scratch,
        tally: &mut Counts,
        reads: ReadMode,
    ) -> Option<LogWait> {
        let began = Instant::now();
        let before = per_kind(tally);
        let scratch = &mut scratch.0;
        let Some(log) = &self.durable else {
            self.store.execute(batch, out, room, scratch, tally);
            self.latencies.record(since(per_kind(tally), before), elapsed_ns(began));
            return None;
        };
        if let Err(not_leader) = log.leadership() {
            // (A malformed op goes to the leader too, which answers it as such.)
            let reads_only =
                !batch.is_empty() && (0..batch.len()).all(|i| batch.op(i).is_ok_and(|op| op.kind.follower_may_serve()));
            if !reads_only || !matches!(not_leader, SubmitError::NotLeader(Some(_))) {
                // A member that does not lead its group runs no write and says who leads.
                return Some(LogWait::refused(not_leader));
            }
            if let ReadMode::Stale(bound) = reads
                && log.fresh_within(bound)
            {
                self.store.execute(batch, out, room, scratch, tally);
                self.latencies.record(since(per_kind(tally), before), elapsed_ns(began));
                return None;
            }
            // The reads must run after this member has applied the leader's read index:
            // they wait with a copy of the batch.
            let Some(gate) = log.member_read() else {
                return Some(LogWait::refused(not_leader));
            };
            return Some(self.read_after(gate, batch, began));
        }
        let mut logged = Vec::new();
        // A replica group's leader may not yet have applied a write a follower has already
        // applied (and served to a reader: both learn the commit, each applies on its own),
        // so its reads do not run on its store as it is now: a batch of reads only runs
        // once a read-index round that began after it arrived is done, which waits until
        // this leader has applied everything committed when the round began; in a batch
        // with a write, its reads go through the log with the writes, in batch order. (Not
        // in a group with no other member: `DurableShard::shares_reads`.)
        let shared = log.shares_reads();
        self.store.ops_to_log(batch, &mut scratch.written, &mut logged, shared);
        if !logged.is_empty()
            && let Some(why) = log.write_refusal()
        {
            // The disk refuses writes: nothing of the batch runs (reads alone go on).
            return Some(LogWait::refused(SubmitError::Refused(why)));
        }
        if logged.is_empty() {
            if shared {
                return Some(self.read_after(log.read_index_round(), batch, began));
            }
            // No other member: nobody else serves reads, its store holds every write it
            // acknowledged.
            self.store.execute(batch, out, room, scratch, tally);
            self.latencies.record(since(per_kind(tally), before), elapsed_ns(began));
            return None;
        }
        self.store.execute_except(batch, &logged, out, room, scratch, tally);
        self.latencies.record(since(per_kind(tally), before), elapsed_ns(began));
        let mut logged_kinds = [0; KINDS];
        let mut gets = Vec::new();
        for (j, &i) in logged.iter().enumerate() {
            if let Ok(op) = batch.op(i as usize) {
                logged_kinds[kind_index(op.kind)] += 1;
                if op.kind == OpKind::Get {
                    gets.push(j as u32);
                }
            }
        }
        let answer = match logged_batch(batch, &logged, |op| self.too_long(op)) {
            Ok(entry) => log.submit(entry),
            Err(e) => {
                let (tx, rx) = tokio::sync::oneshot::channel();
                let _ = tx.send(Err(SubmitError::Failed(e.to_string())));
                rx
            }
        };
        Some(LogWait(Waiting::Logged {
            answer,
            got: None,
            positions: logged,
            served: Served {
                began,
                kinds: logged_kinds,
                gets,
                latencies: self.latencies.clone(),
                counters: self.counters.clone(),
            },
        }))
    }

    /// Whether `op`, a range write or an append, would make a value longer than this node
    /// serves: 512 MiB, or `--max-frame` when smaller (a longer value could not be read
    /// back, nor sent to a member catching up). In memory the store itself caps values at
    /// that ([`Store::cap_values`]); a durable leader checks here, before logging, and logs
    /// such an op as one no store runs (see [`logged_batch`]), so that a log replayed, or
    /// applied by a member, under another `--max-frame` applies what was accepted. (Appends
    /// to one key in flight at once are each checked against the value as it is now: the
    /// store's own cap, 512 MiB when durable, bounds what they make together.)
    fn too_long(&self, op: &kvshared::wire::OpRef<'_>) -> bool {
        let max = kvshared::wire::MAX_STRING.min(u64::from(self.config.edge.max_frame));
        match op.kind {
            OpKind::SetRange => {
                let offset = op.value.first_chunk::<8>().map_or(0, |o| u64::from_le_bytes(*o));
                op.value.len() > 8 && offset.saturating_add(op.value.len() as u64 - 8) > max
            }
            OpKind::Append if !op.value.is_empty() => {
                op.value.len() as u64 > max || (self.store.value_len(op.key) + op.value.len()) as u64 > max
            }
            _ => false,
        }
    }

    /// `batch` (reads only), to run from a copy once `gate` answers a read index that this
    /// member has applied.
    fn read_after(
        &self,
        gate: oneshot::Receiver<Result<u64, SubmitError>>,
        batch: &BatchView<'_>,
        began: Instant,
    ) -> LogWait {
        LogWait::deferred(
            gate,
            DeferredRead {
                body: copied_body(batch),
                store: self.store.clone(),
                counters: self.counters.clone(),
                timing: (began, self.latencies.clone()),
            },
        )
    }

    /// Applies a change of settings at run time (flush first, then the cap). A durable node
    /// refuses a flush: it would have to go through the log to survive a restart, and a
    /// benchmark's fresh start is better had from an empty data directory.
    pub fn configure(&self, change: &ConfigRequest) -> Result<(), ConfigError> {
        if change.flush && self.durable.is_some() {
            return Err(ConfigError::DurableFlush);
        }
        if change.flush {
            self.store.flush();
            tracing::info!("flushed every key (config request)");
        }
        if let Some(max) = change.max_memory_bytes {
            let max = (max > 0).then_some(max as usize);
            self.store.set_max_memory(max);
            tracing::info!(max_memory_bytes = ?max, "memory cap changed (config request)");
        }
        Ok(())
    }

    /// This node's place in its replica group (empty figures when it is in none).
    pub fn group_figures(&self) -> GroupFigures {
        match (&self.durable, &self.config.cluster.group) {
            (Some(log), Some(_)) => log.group_figures(),
            _ => GroupFigures::default(),
        }
    }

    /// How it was set up.
    pub fn config(&self) -> &NodeConfig {
        &self.config
    }

    /// Where its ops, connections and errors are counted (every front adds to them).
    pub fn counters(&self) -> &Arc<Counters> {
        &self.counters
    }

    /// Where its RESP front listens, once bound.
    pub fn resp_addr(&self) -> Option<std::net::SocketAddr> {
        self.resp_addr.get().copied()
    }

    /// Notes where its RESP front listens (once; reported in stats for the other nodes'
    /// `CLUSTER SLOTS` and `-MOVED`).
    pub fn set_resp_addr(&self, addr: std::net::SocketAddr) {
        let _ = self.resp_addr.set(addr);
    }

    /// The slot table as this node knows it (its own slots exactly; the others' as last
    /// told).
    pub fn slot_table(&self) -> &kvshared::slots::SlotTable {
        self.store.slot_table()
    }

    /// How many live keys slot `slot` holds here, and up to `limit` of them (Redis's
    /// `CLUSTER COUNTKEYSINSLOT` and `GETKEYSINSLOT`).
    pub fn keys_in_slot(&self, slot: u16, limit: usize) -> (u64, Vec<Vec<u8>>) {
        self.store.keys_in_slot(slot, limit)
    }

    /// The shard group that owns `key`'s slot, as this node's slot table says (its own
    /// slots exactly, the others' as last told): where a front forwards or redirects.
    #[inline]
    pub fn owner_of(&self, key: &[u8]) -> u32 {
        u32::from(self.store.slot_table().owner(kvshared::routing::key_slot(key)))
    }

    /// Whether this node serves every slot's reads (a single node, or a group owning the
    /// whole map): every key's owner is this node, no slot need be computed.
    #[inline]
    pub fn serves_every_slot(&self) -> bool {
        self.store.slot_table().serves_all(false)
    }

    /// Whether it serves its shard's writes (Redis's `master`): it is in no group, or leads
    /// its group and serves. Cheap (no figures built): the RESP front asks per command.
    pub fn serves_writes(&self) -> bool {
        match (&self.durable, &self.config.cluster.group) {
            (Some(log), Some(_)) => log.leadership().is_ok(),
            _ => true,
        }
    }

    /// The replica group this node is a member of (`None`: none yet, or not in a group).
    pub fn group_id(&self) -> Option<u64> {
        self.durable
            .as_ref()
            .filter(|_| self.config.cluster.group.is_some())?
            .group_id()
    }

    /// Answers a raft RPC from another member of this node's replica group (`None`: this
    /// node is in no group).
    pub async fn serve_raft(&self, body: &[u8]) -> Option<Vec<u8>> {
        match &self.durable {
            Some(log) if self.config.cluster.group.is_some() => Some(log.serve_rpc(body).await),
            _ => None,
        }
    }

    /// A snapshot of every figure the node reports.
    pub fn stats(&self) -> NodeStats {
        let sample = self.sampler.latest();
        let mut system = sample.figures;
        system.system_sampled_ms = sample.at.saturating_duration_since(self.started).as_millis() as u64;
        let latency = {
            let [get, put, delete] = self.latencies.snapshot();
            LatencyStats {
                get,
                put,
                delete,
                map_shards: self.store.shard_latencies(),
            }
        };
        let counts = Counts {
            log_lines_dropped: LOG_LINES_DROPPED.get().map_or(0, |f| f()),
            ..self.counters.totals()
        };
        let recent = self.window.lock().advance(&counts, &latency);
        NodeStats {
            version: env!("CARGO_PKG_VERSION").to_string(),
            shard: self.config.cluster.shard,
            pid: std::process::id(),
            uptime_ms: self.started.elapsed().as_millis() as u64,
            unix_ms: SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map(|d| d.as_millis() as u64)
                .unwrap_or(0),
            keys: self.store.len(),
            volatile_keys: self.store.volatile_keys(),
            map_shards: self.store.map_shards() as u32,
            memory_used_bytes: self.store.memory_used(),
            max_memory_bytes: self.store.memory_limit().map_or(0, |l| l.max_bytes as u64),
            eviction: self
                .store
                .memory_limit()
                .map_or(String::new(), |l| l.eviction.name().to_string()),
            worker_threads: self.config.engine.worker_threads as u32,
            resp_addr: self.resp_addr.get().map_or(String::new(), ToString::to_string),
            slots: self.store.slot_table().served(),
            slot_moves: self.store.slot_moves(),
            durability: self.durable.as_ref().map(DurableShard::figures).unwrap_or_default(),
            group: self.group_figures(),
            latency,
            recent,
            counts,
            system,
        }
    }
}

/// How fresh a connection's reads must be on a member of a replica group that does not
/// lead it (the binary protocol's `StaleReads` frame sets it per connection).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReadMode {
    /// Every read sees every write acknowledged before it arrived.
    Linearizable,
    /// A follower may answer from its own store while it is at most this far behind its
    /// leader (see `DurableShard::fresh_within`).
    Stale(Duration),
}

/// The offset of a range write no store runs: past every value.
const NO_OFFSET: u64 = u64::MAX;

/// The ops at `positions` of `batch` as a batch of a log entry, in the log's own format
/// (`durable::entry`; converted here, once, at the leader): first a clock op with this node's
/// time, which every member applying the entry (and every replay) uses to decide which keys
/// have expired (see `store::expiry`); its result is not the client's. An op `too_long`
/// refuses is logged as a range write at [`NO_OFFSET`], which every store refuses
/// (`BadRange`, nothing changed), so that its answer comes back in order with the others.
fn logged_batch(
    batch: &BatchView<'_>,
    positions: &[u32],
    too_long: impl Fn(&kvshared::wire::OpRef<'_>) -> bool,
) -> Result<Vec<u8>, crate::durable::entry::EntryError> {
    let clock = kvshared::expiry::clock_value(kvshared::expiry::now_ms());
    let refused = NO_OFFSET.to_le_bytes();
    let ops = std::iter::once((OpKind::Clock, &[][..], &clock[..])).chain(
        positions
            .iter()
            .filter_map(|&i| batch.op(i as usize).ok())
            .map(|op| match too_long(&op) {
                true => (OpKind::SetRange, op.key, &refused[..]),
                false => (op.kind, op.key, op.value),
            }),
    );
    crate::durable::entry::encode_batch(ops)
}

/// A copy of a batch's frame body, as received (ill-formed ops too: they are answered as such
/// when the batch runs).
fn copied_body(batch: &BatchView<'_>) -> AlignedVec {
    let mut body = AlignedVec::new();
    body.extend_from_slice(batch.body());
    body
}

thread_local! {
    /// The scratch of the deferred reads a worker thread runs, kept between batches: its
    /// buffers, and its counts of ops and batches, by which one op in
    /// `SLOT_LOAD_SAMPLE_EVERY` is sampled for the per-slot load (`SlotLoad`, which `kvd
    /// manager --move-slots` and `rebalance --by load` go by) and one batch in
    /// `MAP_SHARD_SAMPLE_EVERY` for the map shards' latency. (A fresh scratch per batch
    /// sampled none: a replica group's reads, all deferred, went uncounted.)
    static DEFERRED_SCRATCH: std::cell::RefCell<Scratch> = std::cell::RefCell::new(Scratch::default());
}

/// Reads that run once this member has applied a read index: a follower's (the leader's
/// index), or a replica group leader's (its own).
struct DeferredRead {
    body: AlignedVec,
    store: Arc<Store>,
    counters: Arc<Counters>,
    timing: (Instant, Arc<OpLatencies>),
}

impl DeferredRead {
    fn run(self, out: &mut BatchResponse, max_reply: usize) -> Result<(), SubmitError> {
        let batch = BatchView::parse(&self.body).map_err(|e| SubmitError::Failed(e.to_string()))?;
        let mut tally = Counts::default();
        let mut room = CappedRoom::new(batch.len(), max_reply);
        DEFERRED_SCRATCH
            .with_borrow_mut(|scratch| self.store.execute(&batch, out, &mut room, &mut scratch.0, &mut tally));
        self.counters.add_counts(0, &tally);
        let (began, latencies) = self.timing;
        latencies.record(per_kind(&tally), elapsed_ns(began));
        Ok(())
    }
}

/// A batch that waits for the log (see [`Node::execute`]): its logged ops wait for their
/// entry to be applied; or, in a replica group, its reads wait for a read index before they
/// run (the leader's own round, or on a follower the leader's answer); or a member refused
/// it because another leads.
pub struct LogWait(Waiting);

/// What a [`LogWait`] waits for.
enum Waiting {
    /// Nothing ran, and why (this member does not lead its group).
    Refused(SubmitError),
    /// Reads to run from a copy once `gate` answers a read index this member has applied.
    Deferred {
        gate: oneshot::Receiver<Result<u64, SubmitError>>,
        got: Option<Result<u64, SubmitError>>,
        read: DeferredRead,
    },
    /// Ops that went to the log: their results come with the entry's answer.
    Logged {
        answer: oneshot::Receiver<LogAnswer>,
        got: Option<LogAnswer>,
        /// Where each logged op's result goes in the batch's response.
        positions: Vec<u32>,
        /// What the logged ops count as, once answered.
        served: Served,
    },
    /// Answered (by [`LogWait::finish`]).
    Finished,
}

impl LogWait {
    /// Nothing ran: this member does not lead its group.
    fn refused(why: SubmitError) -> LogWait {
        LogWait(Waiting::Refused(why))
    }

    /// Reads waiting to run until this member has applied a read index (`gate`).
    fn deferred(gate: oneshot::Receiver<Result<u64, SubmitError>>, read: DeferredRead) -> LogWait {
        LogWait(Waiting::Deferred { gate, got: None, read })
    }

    /// Waits until what it waits for has come (or failed). Cancel-safe: the outcome is
    /// kept for [`LogWait::finish`].
    pub async fn wait(&mut self) {
        match &mut self.0 {
            Waiting::Deferred {
                gate, got: got @ None, ..
            } => {
                *got = Some(gate.await.unwrap_or(Err(SubmitError::NotLeader(None))));
            }
            Waiting::Logged {
                answer,
                got: got @ None,
                ..
            } => {
                *got = Some(
                    answer
                        .await
                        .unwrap_or_else(|_| Err(SubmitError::Failed(LOG_STOPPED.into()))),
                );
            }
            _ => {}
        }
    }

    /// Takes what has come without waiting; true once it has.
    fn ready(&mut self) -> bool {
        match &mut self.0 {
            Waiting::Deferred {
                gate, got: got @ None, ..
            } => match gate.try_recv() {
                Ok(g) => *got = Some(g),
                Err(oneshot::error::TryRecvError::Empty) => return false,
                Err(oneshot::error::TryRecvError::Closed) => *got = Some(Err(SubmitError::NotLeader(None))),
            },
            Waiting::Logged {
                answer,
                got: got @ None,
                ..
            } => match answer.try_recv() {
                Ok(a) => *got = Some(a),
                Err(oneshot::error::TryRecvError::Empty) => return false,
                Err(oneshot::error::TryRecvError::Closed) => *got = Some(Err(SubmitError::Failed(LOG_STOPPED.into()))),
            },
            _ => {}
        }
        true
    }

    /// Once everything awaited has come: puts the results into `out` (found values only
    /// while the reply stays within `max_reply` bytes) and returns `Some(Ok)`; `None` while
    /// it has not. `NotLeader` means nothing of the batch took effect (the client asks the
    /// leader); `Failed` means the outcome is unknown: the batch may have been logged, so
    /// the caller must not answer it as failed.
    pub fn finish(&mut self, out: &mut BatchResponse, max_reply: usize) -> Option<Result<(), NodeError>> {
        if !self.ready() {
            return None;
        }
        Some(self.take(out, max_reply).map_err(NodeError::from))
    }

    fn take(&mut self, out: &mut BatchResponse, max_reply: usize) -> Result<(), SubmitError> {
        match std::mem::replace(&mut self.0, Waiting::Finished) {
            Waiting::Refused(why) => Err(why),
            Waiting::Deferred { got, read, .. } => match got {
                Some(Ok(_)) => read.run(out, max_reply),
                Some(Err(e)) => Err(e),
                None => Err(SubmitError::NotLeader(None)),
            },
            Waiting::Logged {
                got, positions, served, ..
            } => match got {
                Some(Ok(reply)) => merge_logged(&reply, &positions, served, out, max_reply),
                Some(Err(e)) => Err(e),
                None => Err(SubmitError::Failed(LOG_STOPPED.into())),
            },
            Waiting::Finished => Err(SubmitError::Failed("answered twice".into())),
        }
    }
}

/// A batch's logged ops as the member that serves them counts them: when the batch began,
/// its logged ops per kind, where their service time goes and where they are counted (the
/// log's apply counts them only as applied, on every member).
struct Served {
    began: Instant,
    kinds: [u64; KINDS],
    /// Which logged ops are gets (positions among them): only a get's answer is a hit or
    /// a miss (an INCRBYFLOAT is answered with a value too).
    gets: Vec<u32>,
    latencies: Arc<OpLatencies>,
    counters: Arc<Counters>,
}

impl Served {
    /// Counts the ops, with a get's hit or miss from its answer in `view`.
    fn count(&self, view: &ReplyView<'_>) {
        let mut tally = Counts {
            gets: self.kinds[0],
            puts: self.kinds[1],
            deletes: self.kinds[2],
            ..Counts::default()
        };
        // (The entry's first op is its clock: see `logged_batch`.)
        for &j in &self.gets {
            match view.status(j as usize + 1) {
                Some(OpStatus::Found) => tally.hits += 1,
                Some(OpStatus::NotFound) => tally.misses += 1,
                _ => {}
            }
        }
        self.counters.add_counts(0, &tally);
        self.latencies.record(self.kinds, elapsed_ns(self.began));
    }
}

/// Puts the log's answer for the logged ops (`reply`, an encoded response body) into the
/// batch's response at `positions`, and counts them served with their service time.
fn merge_logged(
    reply: &[u8],
    positions: &[u32],
    served: Served,
    out: &mut BatchResponse,
    max_reply: usize,
) -> Result<(), SubmitError> {
    let mut body: AlignedVec = AlignedVec::new();
    body.extend_from_slice(reply);
    // (The entry's first op is its clock: see `logged_batch`.)
    let view = match ReplyView::parse(&body) {
        Ok(view) if view.len() == positions.len() + 1 => view,
        Ok(_) => return Err(SubmitError::Failed("the log answered a different number of ops".into())),
        Err(e) => return Err(SubmitError::Failed(format!("the log's answer does not decode: {e}"))),
    };
    served.count(&view);
    let room = BatchResponse::value_room(out.len(), max_reply);
    for (j, &i) in positions.iter().enumerate() {
        let used = out.value_bytes();
        out.copy_result(i as usize, &view, j + 1, |len| used + len <= room);
    }
    Ok(())
}

/// Ops of each timed kind a tally has counted: get, put, delete.
fn per_kind(tally: &Counts) -> [u64; KINDS] {
    [tally.gets, tally.puts, tally.deletes]
}

fn since(now: [u64; KINDS], before: [u64; KINDS]) -> [u64; KINDS] {
    std::array::from_fn(|k| now[k].saturating_sub(before[k]))
}

fn kind_index(kind: OpKind) -> usize {
    match kind {
        OpKind::Delete | OpKind::Expired | OpKind::Flush => 2,
        k if k.is_write() => 1,
        _ => 0,
    }
}

fn elapsed_ns(began: Instant) -> u64 {
    began.elapsed().as_nanos() as u64
}

const LOG_STOPPED: &str = "the shard's log has stopped";

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::Unbounded;
    use kvshared::wire::{BatchRequest, OpReply, encode_body};

    fn run(node: &Node, req: &BatchRequest) -> Vec<String> {
        let mut aligned = AlignedVec::new();
        encode_body(req, &mut aligned).unwrap();
        let batch = BatchView::parse(&aligned).unwrap();
        let mut out = BatchResponse::default();
        let mut scratch = Scratch::default();
        let mut tally = Counts::default();
        let wait = node.execute(&batch, &mut out, &mut Unbounded, &mut scratch, &mut tally);
        if let Some(mut wait) = wait {
            block_on_log(&mut wait);
            wait.finish(&mut out, 1 << 20).unwrap().unwrap();
        }
        let mut body = AlignedVec::new();
        encode_body(&out, &mut body).unwrap();
        let view = ReplyView::parse(&body).unwrap();
        (0..view.len())
            .map(|i| match view.result(i) {
                OpReply::Found(v) => String::from_utf8_lossy(v).into_owned(),
                other => format!("{other:?}"),
            })
            .collect()
    }

    fn block_on_log(wait: &mut LogWait) {
        tokio::task::block_in_place(|| tokio::runtime::Handle::current().block_on(wait.wait()));
    }

    /// A range write or an append that would make a value longer than `--max-frame` is
    /// refused on the binary path too, in memory and durable, alone: the batch's other ops run.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_value_past_the_frame_limit_is_refused_alone() {
        let dir = kvtestkit::scratch_file("node-range", "data");
        for data_dir in [None, Some(dir.to_path_buf())] {
            let mut node = Node::new(NodeConfig {
                durability: data_dir.map(Durability::in_dir),
                edge: crate::edge::EdgeConfig {
                    max_frame: 1 << 20,
                    ..Default::default()
                },
                ..NodeConfig::default()
            })
            .unwrap();
            node.open_data_dir().await.unwrap();
            let arg = |offset: u64| [&offset.to_le_bytes()[..], b"xy"].concat();
            let mut put = BatchRequest::new();
            put.push_put(b"a", b"1");
            assert_eq!(run(&node, &put), ["Stored"]);
            let mut req = BatchRequest::new();
            req.push_put(b"b", b"1");
            req.push(OpKind::SetRange, b"r", &arg(1 << 20));
            req.push(OpKind::Append, b"a", &vec![b'z'; 1 << 20]);
            let got = run(&node, &req);
            assert_eq!(got[0], "Stored");
            assert!(
                got[1].starts_with("Malformed") && got[2].starts_with("Malformed"),
                "{got:?}"
            );
            let mut ok = BatchRequest::new();
            ok.push(OpKind::SetRange, b"r", &arg((1 << 20) - 2));
            ok.push_get(b"a");
            ok.push(OpKind::Append, b"a", b"2");
            assert_eq!(
                run(&node, &ok),
                [
                    format!("{:?}", OpReply::Counted(1 << 20)),
                    "1".to_string(),
                    format!("{:?}", OpReply::Counted(2)),
                ]
            );
            let mut longer = BatchRequest::new();
            longer.push(OpKind::Append, b"r", b"!");
            longer.push(OpKind::Append, b"a", b"3");
            assert_eq!(
                run(&node, &longer),
                [
                    format!(
                        "{:?}",
                        OpReply::Malformed(kvshared::wire::MalformedOp::BadRange.as_str())
                    ),
                    format!("{:?}", OpReply::Counted(3)),
                ]
            );
            node.close().await;
        }
    }

    /// With a data dir, reads run at once and writes through the log, yet every op sees
    /// the batch's earlier ops on its key, as in memory.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_durable_batch_keeps_batch_order_per_key() {
        let dir = kvtestkit::scratch_file("node-split", "data");
        let mut node = Node::new(NodeConfig {
            durability: Some(Durability::in_dir(dir.to_path_buf())),
            ..NodeConfig::default()
        })
        .unwrap();
        node.open_data_dir().await.unwrap();
        let mut first = BatchRequest::new();
        first.push_put(b"k", b"v1");
        first.push_put(b"other", b"o1");
        assert_eq!(run(&node, &first), ["Stored", "Stored"]);

        let mut req = BatchRequest::new();
        req.push_get(b"k");
        req.push_put(b"k", b"v2");
        req.push_get(b"other");
        req.push_get(b"k");
        req.push_delete(b"k");
        req.push_get(b"k");
        req.push_get(b"missing");
        req.push_put(b"k", b"v3");
        assert_eq!(
            run(&node, &req),
            ["v1", "Stored", "o1", "v2", "Deleted", "NotFound", "NotFound", "Stored"]
        );
        let mut read = BatchRequest::new();
        read.push_get(b"k");
        assert_eq!(run(&node, &read), ["v3"]);
        node.close().await;
        drop(node);
    }
}
