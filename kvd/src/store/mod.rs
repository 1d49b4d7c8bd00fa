//! The in-memory store: a map split into independently locked shards.
//!
//! The store knows nothing of sockets or frames. It executes a batch of ops read from a
//! [`BatchView`] and writes one result per op into a [`BatchResponse`]. Ops are grouped by
//! internal shard first, so each shard's lock is taken once per batch, not once per op; a
//! shard group with no write takes the lock shared.
//!
//! Each key is hashed once ([`key_hash`]); that hash decides the owner node, the internal
//! shard and the bucket probe. Within a shard group ops run in batch order, so two ops on the
//! same key in one batch take effect in the order the client wrote them.

use std::collections::HashSet;

use kvshared::latency::{Latency, MAP_SHARD_SAMPLE_EVERY};
use kvshared::routing::{ShardId, key_hash, map_shard};
use kvshared::slots::SLOT_LOAD_SAMPLE_EVERY;
use kvshared::stats::Counts;
use kvshared::wire::{BatchResponse, BatchView, OpKind, OpStatus};

mod atomic;
mod dump;
mod expires;
mod expiry;
mod export;
mod gate;
mod keyspace;
mod map;
mod memory;
mod ops;
mod ownership;
mod pipeline;
mod policy;
mod slots;
mod table;
mod tracking;

pub use dump::{ImportError, PairFault, SectionFault};
pub use expiry::CycleFigures;
use expiry::batch_clock;
pub use export::Exported;
use gate::SnapshotGate;
use map::{MapShards, table_sizes};
pub use memory::{Eviction, MemoryLimit};
use memory::{MAX_EVICTIONS_PER_WRITE, MemoryCap, Shard, Usage};
pub use ops::Ops;
use ownership::Ownership;
use pipeline::Pending;
use policy::WritePolicy;
pub use table::entry_bytes;
use table::{Table, data_cost};

/// Decides whether a found value may join the reply being built (a reply is bounded by the
/// frame limit and by the node's buffer budget); a value refused is answered `TooLarge`.
pub trait ReplyRoom {
    /// Whether `bytes` more value bytes may join the reply (and, if so, counts them).
    fn admit(&mut self, bytes: usize) -> bool;
}

/// No bound on replies (benchmarks and tests of the store alone).
pub struct Unbounded;

impl ReplyRoom for Unbounded {
    fn admit(&mut self, _bytes: usize) -> bool {
        true
    }
}

/// Keeps one reply's values within the frame limit (the first value always goes in), so a
/// batch of large gets cannot make an unbounded reply; the others are answered "reply too
/// large". (The binary protocol's connections also charge the node's buffer budget:
/// `budget::ReplyAllowance`.)
pub struct CappedRoom {
    left: usize,
    first: bool,
}

impl CappedRoom {
    /// Room for the values of a reply to `ops` ops within `max_reply` bytes.
    pub fn new(ops: usize, max_reply: usize) -> CappedRoom {
        CappedRoom {
            left: BatchResponse::value_room(ops, max_reply),
            first: true,
        }
    }
}

impl ReplyRoom for CappedRoom {
    fn admit(&mut self, bytes: usize) -> bool {
        if bytes <= self.left || std::mem::take(&mut self.first) {
            self.left = self.left.saturating_sub(bytes);
            self.first = false;
            return true;
        }
        false
    }
}

/// Key hashes a batch writes: foldhash over them, seeded per set (SipHash cost 2% of a
/// durable node's CPU here).
pub(crate) type WrittenKeys = HashSet<u64, foldhash::fast::RandomState>;

/// Reusable per-connection memory for grouping a batch by shard.
#[derive(Default)]
pub struct Scratch {
    /// Per op: `(shard << 32) | op index`, or skipped ops left out.
    order: Vec<u64>,
    hashes: Vec<u64>,
    writes: Vec<bool>,
    counts: Vec<u32>,
    sorted: Vec<u64>,
    /// Key hashes a batch writes (a durable node's split, see [`Store::ops_to_log`]).
    pub(crate) written: WrittenKeys,
    /// The log entry the batch belongs to, when a durable shard applies its log (0: none).
    /// Each map shard a write touches remembers it, so a snapshot knows exactly which
    /// entries its copy of that shard holds.
    pub(crate) log_index: u64,
    /// Batches this scratch has run, to time one in `MAP_SHARD_SAMPLE_EVERY` per map shard.
    batches: u32,
    /// Ops this scratch has run, to count one in `SLOT_LOAD_SAMPLE_EVERY` in the slot load.
    ops: u32,
}

/// Where a batch's results go: the response, the reply's room, the counters.
struct Answers<'a, R> {
    out: &'a mut BatchResponse,
    room: &'a mut R,
    tally: &'a mut Counts,
    /// The LRU clock for this batch.
    now: u32,
    /// The time this batch's ops see, Unix milliseconds: a key whose deadline is at or
    /// before it does not exist. The node's clock; when applying a log entry, the clock
    /// its leader wrote into it (0 in entries from before expiry: nothing expires).
    clock: u64,
    /// See `Scratch::log_index`.
    log_index: u64,
    /// The slot table's change count when the batch checked its ops' slots (see `slots`).
    slot_changes: u64,
}

/// Batches up to this many ops request every op's slot before running any group (a larger
/// batch's groups are long enough to pipeline by themselves, and its early requests would
/// be evicted before use).
const PREFETCH_WHOLE_BATCH: usize = 256;

/// The sharded map.
pub struct Store {
    /// The keys, in map shards.
    map: MapShards,
    /// Which slots this node serves, and what moves them.
    own: Ownership,
    /// `--max-memory`, what is accounted against it, and eviction.
    memory: MemoryCap,
    /// What keeps a snapshot from splitting a transaction or a slot change.
    gate: SnapshotGate,
    /// What a write may make, and whether it runs outside the log.
    policy: WritePolicy,
    #[cfg(test)]
    fault: Option<stale::StaleReads>,
}

impl Store {
    /// Bytes a store made for `capacity` keys over `map_shards` takes before it holds
    /// anything (its tables' slots), to refuse a `--capacity` the machine cannot hold before
    /// trying to allocate it.
    pub fn preallocated_bytes(map_shards: usize, capacity: usize) -> usize {
        let (n, per_shard) = table_sizes(map_shards, capacity);
        Table::bytes_for(per_shard).saturating_mul(n)
    }

    /// A store for node `me` with `map_shards` internal shards (rounded up to a power of two),
    /// preallocated for about `capacity` keys in total. Memory that cannot be had is an
    /// error (`OutOfMemory`), not an abort.
    pub fn new(me: ShardId, map_shards: usize, capacity: usize) -> std::io::Result<Store> {
        Store::with_limit(me, map_shards, capacity, None)
    }

    /// As [`Store::new`], holding at most `limit` (see `memory`). The preallocated tables
    /// count against it.
    pub fn with_limit(
        me: ShardId,
        map_shards: usize,
        capacity: usize,
        limit: Option<MemoryLimit>,
    ) -> std::io::Result<Store> {
        let usage = Usage::new(None);
        let map = MapShards::new(map_shards, capacity, &usage)?;
        if let Some(limit) = limit
            && usage.used() > limit.max_bytes
        {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                format!(
                    "--capacity {capacity} alone takes {} bytes of table, more than --max-memory {}",
                    usage.used(),
                    limit.max_bytes
                ),
            ));
        }
        let used = usage.used();
        let usage = Usage::new(limit);
        usage.add(used);
        Ok(Store {
            map,
            own: Ownership::new(me),
            memory: MemoryCap::new(usage, limit),
            gate: SnapshotGate::default(),
            policy: WritePolicy::default(),
            #[cfg(test)]
            fault: None,
        })
    }

    /// Unit tests only: answer some reads from a stale copy (see [`stale`]).
    #[cfg(test)]
    pub(crate) fn enable_stale_reads(&mut self) {
        self.fault = Some(stale::StaleReads::new(self.map.shards.len()));
    }

    /// Makes a cap set at run time refuse writes rather than evict (a durable node's store:
    /// an evicted key would come back when the log is replayed).
    pub fn never_evict(&mut self) {
        self.memory.never_evict();
    }

    /// Makes the store run writes only when applying a log entry (a durable node's store).
    /// A write its node chose not to log (its slot was not served then) and that reaches
    /// the store after its slot changed hands is answered `TryAgain`, not run outside the log.
    pub fn writes_through_log_only(&mut self) {
        self.policy.log_only = true;
    }

    /// Caps what an append may make at `max` bytes (at most [`kvshared::wire::MAX_STRING`],
    /// the cap otherwise): a node in memory caps values at its `--max-frame`, the longest
    /// value it could send back. A durable store keeps the constant, so that a log replayed
    /// under another `--max-frame`, or applied by a member with another, applies what was
    /// accepted; its node checks appends against `--max-frame` before logging them
    /// (`Node::refuse_long_values`).
    pub fn cap_values(&mut self, max: u64) {
        self.policy.cap_values(max);
    }

    /// The length of `key`'s value here (0 when absent).
    pub fn value_len(&self, key: &[u8]) -> usize {
        let hash = key_hash(key);
        let s = self.map.shards[map_shard(hash, self.map.shards.len())].read();
        s.table
            .find(hash, key)
            .and_then(|at| s.table.at(at))
            .map_or(0, |e| e.value().len())
    }

    /// Internal map shards.
    pub fn map_shards(&self) -> usize {
        self.map.shards.len()
    }

    /// Keys stored now (takes each shard's lock briefly; for stats, not the hot path).
    pub fn len(&self) -> u64 {
        self.map.keys()
    }

    /// Accounted bytes the store holds now (keys, values, entries and tables).
    pub fn memory_used(&self) -> u64 {
        self.memory.usage.used() as u64
    }

    /// `--max-memory` and `--eviction`, if set.
    pub fn memory_limit(&self) -> Option<MemoryLimit> {
        self.memory.usage.limit()
    }

    /// Sets (or removes) the cap at run time, keeping the configured eviction policy (lru
    /// if none was configured).
    pub fn set_max_memory(&self, max_bytes: Option<usize>) {
        self.memory.set_max(max_bytes);
    }

    /// Removes every key (a benchmark's fresh start): each shard gets a new, empty table.
    pub fn flush(&self) {
        self.map.flush(&self.memory.usage);
    }

    /// Adds up the shards' own accounts (takes each lock), to check the running total.
    #[cfg(test)]
    fn memory_recount(&self) -> u64 {
        self.map.shards.iter().map(|s| s.read().bytes() as u64).sum()
    }

    /// The LRU clock (milliseconds since start; 0 when nothing evicts by age).
    fn now(&self) -> u32 {
        self.memory.now()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The ops of `batch` a durable node must send through its log, as ascending indexes
    /// into `logged`: every well-formed write of a key this node owns, and every read of a
    /// key that an earlier op of the batch writes (so it sees that write, in batch order).
    /// The other reads may run at once against the store, which holds only committed writes.
    /// Keys are told apart by hash; a collision only sends a read through the log for nothing.
    /// With `reads_too` (a batch with a write on a replica group's leader) every read of an
    /// owned key goes through the log as well, once the batch has a write.
    pub fn ops_to_log(&self, batch: &BatchView<'_>, written: &mut WrittenKeys, logged: &mut Vec<u32>, reads_too: bool) {
        logged.clear();
        written.clear();
        if batch.is_atomic() {
            return self.atomic_to_log(batch, logged);
        }
        for i in 0..batch.len() {
            let Ok(op) = batch.op(i) else { continue };
            if op.kind == OpKind::Clock {
                // Only the node adds one, to the entry it logs (see `Node::execute`).
                continue;
            }
            if op.kind.is_node_wide() {
                // No key: a flush goes through the log, a scan or count runs at once.
                if op.kind.is_write() {
                    written.insert(0);
                    logged.push(i as u32);
                }
                continue;
            }
            if !self.serves(op.kind, op.key) {
                continue;
            }
            // (A read before the batch's first write needs no hash: 2% of a durable node's
            // CPU under YCSB-B went to hashing and SipHash here.)
            if op.kind.is_write() {
                written.insert(key_hash(op.key));
                logged.push(i as u32);
            } else if reads_too || (!written.is_empty() && written.contains(&key_hash(op.key))) {
                logged.push(i as u32);
            }
        }
        if reads_too && written.is_empty() {
            // Reads only: none goes through the log.
            logged.clear();
        }
    }

    /// An atomic batch goes through the log whole when it writes and every op of it can
    /// run here; otherwise none of it does (it runs, or is refused, at once).
    fn atomic_to_log(&self, batch: &BatchView<'_>, logged: &mut Vec<u32>) {
        let mut writes = false;
        for i in 0..batch.len() {
            match batch.op(i) {
                Ok(op) if op.kind == OpKind::Atomic => {}
                Ok(op) if op.kind != OpKind::Clock && self.serves(op.kind, op.key) => writes |= op.kind.is_write(),
                _ => return,
            }
        }
        if writes {
            logged.extend(0..batch.len() as u32);
        }
    }

    /// Executes every op of `batch`, writing one result per op into `out` (found values
    /// that `room` does not admit are answered `TooLarge`), and adds what it did to `tally`
    /// (op and error counters).
    pub fn execute(
        &self,
        batch: &impl Ops,
        out: &mut BatchResponse,
        room: &mut impl ReplyRoom,
        scratch: &mut Scratch,
        tally: &mut Counts,
    ) {
        self.execute_except(batch, &[], out, room, scratch, tally);
    }

    /// Per map shard, the time sampled batches spent on its ops (see `LatencyStats`).
    pub fn shard_latencies(&self) -> Vec<Latency> {
        self.map.latency.iter().map(|b| b.snapshot()).collect()
    }

    /// As [`Store::execute`], leaving out the ops whose indexes `skip` lists (ascending):
    /// their results stay `NotFound` in `out` for the caller to fill (a durable node's
    /// logged ops; see [`Store::ops_to_log`]).
    pub fn execute_except(
        &self,
        batch: &impl Ops,
        skip: &[u32],
        out: &mut BatchResponse,
        room: &mut impl ReplyRoom,
        scratch: &mut Scratch,
        tally: &mut Counts,
    ) {
        let n = batch.len();
        out.reset(n);
        if batch.is_atomic() {
            // A transaction: all of it here, or all of it through the log (`ops_to_log`).
            if skip.is_empty() {
                self.execute_atomic(batch, out, room, scratch, tally);
            }
            return;
        }
        if skip.is_empty() && self.run_node_wide(batch, out, room, tally, scratch.log_index) {
            return;
        }
        scratch.order.clear();
        scratch.hashes.clear();
        scratch.hashes.resize(n, 0);
        scratch.writes.clear();
        scratch.writes.resize(n, false);
        let shard_count = self.map.shards.len();
        let mut skip = skip.iter().peekable();
        let replay_guard = (scratch.log_index > 0).then(|| self.gate.replay.read());
        let replay = replay_guard.as_deref().and_then(Option::as_ref);
        let prefetch_all = n <= PREFETCH_WHOLE_BATCH;
        let slot_changes = self.own.slots.changes();
        for i in 0..n {
            if skip.next_if(|&&s| s as usize == i).is_some() {
                continue;
            }
            let op = match batch.op(i) {
                Ok(op) => op,
                Err(why) => {
                    out.set_malformed(i, why);
                    tally.malformed_op += 1;
                    continue;
                }
            };
            if op.kind == OpKind::Clock {
                // Read by `batch_clock`; only a log entry may carry one.
                match scratch.log_index {
                    0 => {
                        out.set_malformed(i, kvshared::wire::MalformedOp::LogOnly);
                        tally.malformed_op += 1;
                    }
                    _ => out.set(i, OpStatus::Stored),
                }
                continue;
            }
            if matches!(op.kind, OpKind::Unchanged | OpKind::Rename) || op.kind.is_node_wide() {
                // A transaction's check or rename (see `atomic`); a node-wide op with others.
                let why = match op.kind.is_node_wide() {
                    true => kvshared::wire::MalformedOp::NotAlone,
                    false => kvshared::wire::MalformedOp::NotAtomic,
                };
                out.set_malformed(i, why);
                tally.malformed_op += 1;
                continue;
            }
            if self.refuse_unserved(op.kind, op.key, i, out, tally)
                || self.refuse_unlogged_write(op.kind, scratch.log_index, i, out, tally)
            {
                continue;
            }
            if op.kind != OpKind::Load {
                // (A slot copy's loads are not its load: counted, a move's target would
                // look busy for what it was given.)
                scratch.ops = scratch.ops.wrapping_add(1);
                if scratch.ops.is_multiple_of(SLOT_LOAD_SAMPLE_EVERY) {
                    self.count_slot_load(op.key);
                }
            }
            let hash = key_hash(op.key);
            if let Some(held) = replay {
                // Replaying the log: the snapshot's copy of this key's map shard already
                // holds this entry; applying it again could change a conditional put's
                // outcome. (Its answer goes nowhere.)
                if held
                    .get(map_shard(hash, held.len()))
                    .is_some_and(|&h| scratch.log_index <= h)
                {
                    continue;
                }
            }
            scratch.hashes[i] = hash;
            scratch.writes[i] = op.kind.is_write();
            let shard = map_shard(hash, shard_count);
            if prefetch_all && let Some(hint) = self.map.hints.get(shard) {
                hint.prefetch(hash);
            }
            scratch.order.push(((shard as u64) << 32) | i as u64);
        }
        group_by_shard(
            &mut scratch.order,
            &mut scratch.counts,
            &mut scratch.sorted,
            shard_count,
        );
        let order = &scratch.order;
        scratch.batches = scratch.batches.wrapping_add(1);
        let timed = scratch.batches.is_multiple_of(MAP_SHARD_SAMPLE_EVERY);
        let mut ans = Answers {
            out,
            room,
            tally,
            now: self.now(),
            clock: batch_clock(batch, scratch.log_index),
            log_index: scratch.log_index,
            slot_changes,
        };
        let mut start = 0;
        while start < order.len() {
            let shard = (order[start] >> 32) as usize;
            let mut end = start + 1;
            while end < order.len() && (order[end] >> 32) as usize == shard {
                end += 1;
            }
            let group = &order[start..end];
            let writes = group.iter().any(|&e| scratch.writes[e as u32 as usize]);
            let began = timed.then(std::time::Instant::now);
            if writes {
                self.run_group_write(shard, group, batch, &scratch.hashes, &mut ans);
            } else {
                self.run_group_read(shard, group, batch, &scratch.hashes, &mut ans);
            }
            if let Some(began) = began {
                self.map.latency[shard].record_n(began.elapsed().as_nanos() as u64, 1);
            }
            start = end;
        }
    }

    fn run_group_read(
        &self,
        shard: usize,
        group: &[u64],
        batch: &impl Ops,
        hashes: &[u64],
        ans: &mut Answers<'_, impl ReplyRoom>,
    ) {
        let table = self.map.shards[shard].read();
        let kept = self.still_served(group, batch, ans);
        let group = kept.as_deref().unwrap_or(group);
        let mut pending = Pending::new();
        pipeline::prefetch_first(&table.table, group, hashes);
        for (k, &e) in group.iter().enumerate() {
            pipeline::prefetch_ahead(&table.table, group, k, hashes);
            let i = e as u32 as usize;
            match batch.op(i) {
                Ok(op) if op.kind == OpKind::Ttl => Self::ttl_of(&table, hashes[i], op.key, i, ans),
                Ok(op) => self.probe_get(shard, &table, hashes[i], op.key, i, ans, &mut pending),
                Err(_) => {}
            }
        }
        self.deliver_all(shard, &table, ans, &mut pending);
    }

    fn run_group_write(
        &self,
        shard: usize,
        group: &[u64],
        batch: &impl Ops,
        hashes: &[u64],
        ans: &mut Answers<'_, impl ReplyRoom>,
    ) {
        let mut table = self.map.shards[shard].write();
        table.applied = table.applied.max(ans.log_index);
        let kept = self.still_served(group, batch, ans);
        let group = kept.as_deref().unwrap_or(group);
        let mut pending = Pending::new();
        pipeline::prefetch_first(&table.table, group, hashes);
        for (k, &e) in group.iter().enumerate() {
            pipeline::prefetch_ahead(&table.table, group, k, hashes);
            let i = e as u32 as usize;
            let Ok(op) = batch.op(i) else { continue };
            let hash = hashes[i];
            if op.kind == OpKind::Get {
                self.probe_get(shard, &table, hash, op.key, i, ans, &mut pending);
                continue;
            }
            if op.kind == OpKind::Ttl {
                Self::ttl_of(&table, hash, op.key, i, ans);
                continue;
            }
            // Reads found before this write answer with what they found, before it changes
            // (batch order per key).
            self.deliver_all(shard, &table, ans, &mut pending);
            // A key past its deadline is gone before anything writes it.
            let expired = self.expire_if_due(&mut table, hash, op.key, ans);
            self.write_one(shard, &mut table, hash, op, expired, i, ans);
        }
        self.deliver_all(shard, &table, ans, &mut pending);
    }

    /// Runs write op `i` on `key` in `shard` (locked for writing as `s`). `expired`: the
    /// key had just passed its deadline and was removed (an `Expired` op's answer).
    #[allow(clippy::too_many_arguments)]
    fn write_one(
        &self,
        shard: usize,
        s: &mut Shard,
        hash: u64,
        op: kvshared::wire::OpRef<'_>,
        expired: bool,
        i: usize,
        ans: &mut Answers<'_, impl ReplyRoom>,
    ) {
        match op.kind {
            OpKind::Get
            | OpKind::Ttl
            | OpKind::Clock
            | OpKind::Atomic
            | OpKind::Unchanged
            | OpKind::Rename
            | OpKind::Scan
            | OpKind::KeyCount
            | OpKind::Flush
            | OpKind::SlotSet
            | OpKind::SlotScan
            | OpKind::SlotMap
            | OpKind::SlotLoad
            | OpKind::SlotTrack => {}
            OpKind::Load => self.load_one(shard, s, (hash, op.key, op.value), i, ans),
            OpKind::PutIfAbsent | OpKind::PutIfPresent
                if s.table.find(hash, op.key).is_some() != (op.kind == OpKind::PutIfPresent) =>
            {
                // The condition does not hold: nothing changes.
                ans.tally.puts += 1;
                ans.out.set(i, OpStatus::NotStored);
            }
            OpKind::Put | OpKind::PutIfAbsent | OpKind::PutIfPresent => {
                // A plain put ends any time to live, as Redis's SET.
                if self.put(shard, s, hash, op.key, op.value, ans) {
                    self.set_deadline(s, op.key, None);
                    ans.tally.puts += 1;
                    ans.out.set(i, OpStatus::Stored);
                } else {
                    ans.tally.out_of_memory += 1;
                    ans.out.set(i, OpStatus::OutOfMemory);
                }
            }
            OpKind::PutWith => self.put_with(shard, s, hash, op.key, op.value, i, ans),
            OpKind::Expire => self.expire(s, hash, op.key, op.value, i, ans),
            OpKind::IncrBy => self.incr_by(shard, s, hash, op.key, op.value, i, ans),
            OpKind::IncrByFloat => self.incr_by_float(shard, s, (hash, op.key), op.value, i, ans),
            OpKind::Append => self.append(shard, s, hash, op.key, op.value, i, ans),
            OpKind::SetRange => self.set_range(shard, s, hash, op.key, op.value, i, ans),
            OpKind::Expired => {
                ans.tally.deletes += 1;
                ans.out
                    .set(i, if expired { OpStatus::Deleted } else { OpStatus::Absent });
            }
            OpKind::Delete => {
                ans.tally.deletes += 1;
                let existed = self.remove_key(s, hash, op.key);
                ans.out
                    .set(i, if existed { OpStatus::Deleted } else { OpStatus::Absent });
            }
        }
    }
}

impl Store {
    /// Op `i`, an increment of `key` by `delta` (8 bytes, a little-endian `i64`) in `shard`
    /// (locked for writing as `s`): reads the value as a decimal integer (absent: 0) and
    /// stores the sum in decimal, under the shard's lock, so concurrent increments all
    /// count. A value that is not an integer, a sum that overflows or a bad delta changes
    /// nothing.
    #[allow(clippy::too_many_arguments)]
    fn incr_by(
        &self,
        shard: usize,
        s: &mut Shard,
        hash: u64,
        key: &[u8],
        delta: &[u8],
        i: usize,
        ans: &mut Answers<'_, impl ReplyRoom>,
    ) {
        let Ok(by) = <[u8; 8]>::try_from(delta).map(i64::from_le_bytes) else {
            ans.tally.malformed_op += 1;
            return ans.out.set_malformed(i, kvshared::wire::MalformedOp::BadIncrement);
        };
        let old = match s.table.find(hash, key).and_then(|at| s.table.at(at)) {
            None => Some(0),
            Some(e) => kvshared::wire::decimal_i64(e.value()),
        };
        let Some(old) = old else {
            return ans.out.set(i, OpStatus::NotAnInteger);
        };
        let Some(sum) = old.checked_add(by) else {
            return ans.out.set(i, OpStatus::Overflow);
        };
        let text = itoa::Buffer::new().format(sum).as_bytes().to_vec();
        self.put_counted(shard, s, (hash, key, &text), sum, (i, ans));
    }

    /// Op `i`, a float increment of `key` by `delta` (8 bytes, a little-endian finite
    /// `f64`): the value read as a number (absent: 0), the sum stored as text and answered
    /// `Found` with it; a value that is not a number, or a sum that is not finite, changes
    /// nothing.
    fn incr_by_float(
        &self,
        shard: usize,
        s: &mut Shard,
        (hash, key): (u64, &[u8]),
        delta: &[u8],
        i: usize,
        ans: &mut Answers<'_, impl ReplyRoom>,
    ) {
        let by = <[u8; 8]>::try_from(delta)
            .map(f64::from_le_bytes)
            .ok()
            .filter(|d| d.is_finite());
        let Some(by) = by else {
            ans.tally.malformed_op += 1;
            return ans.out.set_malformed(i, kvshared::wire::MalformedOp::BadIncrement);
        };
        let old = match s.table.find(hash, key).and_then(|at| s.table.at(at)) {
            None => Some(0.0),
            Some(e) => kvshared::wire::decimal_f64(e.value()),
        };
        let Some(old) = old else {
            return ans.out.set(i, OpStatus::NotAnInteger);
        };
        let sum = old + by;
        if !sum.is_finite() {
            return ans.out.set(i, OpStatus::Overflow);
        }
        let text = kvshared::wire::float_text(sum);
        if self.put(shard, s, hash, key, text.as_bytes(), ans) {
            ans.tally.puts += 1;
            ans.out.set_found(i, text.as_bytes());
        } else {
            ans.tally.out_of_memory += 1;
            ans.out.set(i, OpStatus::OutOfMemory);
        }
    }

    /// Op `i`, `suffix` appended to `key`'s value in `shard` (locked for writing as `s`; an
    /// absent key starts empty), under the shard's lock so concurrent appends all land;
    /// answered with the new length.
    #[allow(clippy::too_many_arguments)]
    fn append(
        &self,
        shard: usize,
        s: &mut Shard,
        hash: u64,
        key: &[u8],
        suffix: &[u8],
        i: usize,
        ans: &mut Answers<'_, impl ReplyRoom>,
    ) {
        let old = s.table.find(hash, key).and_then(|at| s.table.at(at)).map(|e| e.value());
        if (old.map_or(0, <[u8]>::len) + suffix.len()) as u64 > self.policy.value_cap {
            ans.tally.malformed_op += 1;
            return ans.out.set_malformed(i, kvshared::wire::MalformedOp::BadRange);
        }
        let mut value = Vec::with_capacity(old.map_or(0, <[u8]>::len) + suffix.len());
        value.extend_from_slice(old.unwrap_or(&[]));
        value.extend_from_slice(suffix);
        self.put_counted(shard, s, (hash, key, &value), value.len() as i64, (i, ans));
    }

    /// Op `i`, a range write to `key` in `shard` (locked for writing as `s`): `arg` is the
    /// offset (8 bytes, little-endian) then the bytes, written over the value from the
    /// offset, zero bytes padding up to it; answered with the new length. The length is
    /// checked against [`kvshared::wire::MAX_STRING`] before anything is allocated.
    #[allow(clippy::too_many_arguments)]
    fn set_range(
        &self,
        shard: usize,
        s: &mut Shard,
        hash: u64,
        key: &[u8],
        arg: &[u8],
        i: usize,
        ans: &mut Answers<'_, impl ReplyRoom>,
    ) {
        let parsed = arg.split_first_chunk::<8>().map(|(o, b)| (u64::from_le_bytes(*o), b));
        let Some((offset, bytes)) = parsed.filter(|(o, b)| o.saturating_add(b.len() as u64) <= self.policy.value_cap)
        else {
            ans.tally.malformed_op += 1;
            return ans.out.set_malformed(i, kvshared::wire::MalformedOp::BadRange);
        };
        let old = s.table.find(hash, key).and_then(|at| s.table.at(at)).map(|e| e.value());
        let old_len = old.map_or(0, <[u8]>::len);
        if bytes.is_empty() {
            // Nothing to write: the length as it is, and an absent key stays absent.
            ans.tally.puts += 1;
            return ans.out.set_counted(i, old_len as i64);
        }
        let (offset, end) = (offset as usize, offset as usize + bytes.len());
        let len = old_len.max(end);
        if self.memory.usage.limit().is_some_and(|l| len > l.max_bytes) {
            // More than the cap could ever hold: refused before the value is built.
            ans.tally.out_of_memory += 1;
            return ans.out.set(i, OpStatus::OutOfMemory);
        }
        let mut value = Vec::with_capacity(len);
        value.extend_from_slice(old.unwrap_or(&[]));
        value.resize(len, 0);
        value[offset..end].copy_from_slice(bytes);
        self.put_counted(shard, s, (hash, key, &value), len as i64, (i, ans));
    }

    /// Stores a read-modify-write op's new `value` under `key` and answers op `i` with
    /// `count` (an increment's sum, a new length); at the cap with no room, `OutOfMemory`
    /// and nothing changed.
    fn put_counted(
        &self,
        shard: usize,
        s: &mut Shard,
        (hash, key, value): (u64, &[u8], &[u8]),
        count: i64,
        (i, ans): (usize, &mut Answers<'_, impl ReplyRoom>),
    ) {
        if self.put(shard, s, hash, key, value, ans) {
            ans.tally.puts += 1;
            ans.out.set_counted(i, count);
        } else {
            ans.tally.out_of_memory += 1;
            ans.out.set(i, OpStatus::OutOfMemory);
        }
    }

    /// Stores `value` under `key` in `shard` (locked for writing as `s`): takes the bytes
    /// it will need first, making room at the cap as the eviction policy says; false (and
    /// nothing changed) when they cannot be had.
    fn put(
        &self,
        shard: usize,
        s: &mut Shard,
        hash: u64,
        key: &[u8],
        value: &[u8],
        ans: &mut Answers<'_, impl ReplyRoom>,
    ) -> bool {
        let now = ans.now;
        // Under a cap, take the bytes first (an estimate, settled below); without one, only
        // the settling counts them (no second lookup on the fast path).
        let need = if self.memory.usage.is_capped() {
            let old = s.table.find(hash, key).and_then(|at| s.table.at(at)).map(|e| e.cost());
            let grow = match old {
                None if s.table.len() == s.table.capacity() => s.table.growth_bytes(),
                None if s.table.must_grow() => self.spare_growth(s),
                _ => 0,
            };
            (data_cost(key.len(), value.len()) + grow).saturating_sub(old.unwrap_or(0))
        } else {
            0
        };
        if !self.take_bytes(shard, s, need, key, ans.tally) {
            return false;
        }
        let before = s.bytes();
        let stored = match s.table.find(hash, key) {
            Some(at) => {
                let old = s.table.at(at).map_or(0, |e| e.cost());
                #[cfg(test)]
                if let (Some(f), Some(e)) = (&self.fault, s.table.at(at)) {
                    f.remember(shard, key, e.value());
                }
                let ok = s.table.set_value(at, value, now);
                let new = s.table.at(at).map_or(0, |e| e.cost());
                s.entry_bytes = s.entry_bytes - old + new;
                ok
            }
            None => match s.table.insert_new(hash, key, value, now) {
                Ok(_) => {
                    self.map.hints[shard].publish(&s.table);
                    s.entry_bytes += data_cost(key.len(), value.len());
                    true
                }
                Err(_) => false,
            },
        };
        if stored {
            s.note_written(key);
        }
        // Settle the estimate against what the shard now really holds.
        let grew = s.bytes().saturating_sub(before);
        let shrank = before.saturating_sub(s.bytes());
        match grew.cmp(&need) {
            std::cmp::Ordering::Less => self.memory.usage.give(need - grew),
            std::cmp::Ordering::Greater => self.memory.usage.add(grew - need),
            std::cmp::Ordering::Equal => {}
        }
        self.memory.usage.give(shrank);
        stored
    }

    /// What a crowded table's early growth takes under a cap (see `Table::must_grow`): only
    /// bytes to spare, as it is worth no eviction or refusal; without them the table stays.
    fn spare_growth(&self, s: &mut Shard) -> usize {
        let bytes = s.table.growth_bytes();
        if self.memory.usage.try_take(bytes) {
            self.memory.usage.give(bytes);
            bytes
        } else {
            s.table.calm();
            0
        }
    }

    /// Takes `need` accounted bytes for a write of `keep` into `shard`, evicting first as
    /// the policy says. The first entry goes from this shard (a put of one entry evicts
    /// one entry where it already holds the lock); a larger need (a table that grows) takes
    /// its next entries from the other shards in turn (those whose lock is free at once),
    /// so that no one shard is emptied of its recently used keys. False when the bytes
    /// cannot be had.
    fn take_bytes(&self, shard: usize, s: &mut Shard, need: usize, keep: &[u8], tally: &mut Counts) -> bool {
        if need == 0 || self.memory.usage.try_take(need) {
            return true;
        }
        let Some(limit) = self.memory.usage.limit() else {
            return false;
        };
        if limit.eviction == Eviction::None {
            return false;
        }
        let n = self.map.shards.len();
        let mut misses = 0;
        for step in 0..MAX_EVICTIONS_PER_WRITE {
            let at = (shard + step) % n;
            let freed = if at == shard {
                s.evict_one(limit.eviction, keep)
            } else {
                self.map.shards[at]
                    .try_write()
                    .and_then(|mut other| other.evict_one(limit.eviction, &[]))
            };
            let Some(freed) = freed else {
                misses += 1;
                if misses >= n {
                    break;
                }
                continue;
            };
            misses = 0;
            self.memory.usage.give(freed);
            tally.evicted += 1;
            if self.memory.usage.try_take(need) {
                return true;
            }
        }
        false
    }

    /// Looks up a read's key: a miss is answered at once; a found entry has its value's
    /// lines requested and joins `pending`, to be copied into the reply a few ops later
    /// (when `pending` is full, the oldest is delivered first).
    #[allow(clippy::too_many_arguments)]
    #[inline]
    fn probe_get(
        &self,
        shard: usize,
        table: &Shard,
        hash: u64,
        key: &[u8],
        i: usize,
        ans: &mut Answers<'_, impl ReplyRoom>,
        pending: &mut Pending,
    ) {
        ans.tally.gets += 1;
        // (A key past its deadline is answered missing; only a write removes it.)
        match table
            .table
            .find(hash, key)
            .filter(|_| !table.expires.is_due(key, ans.clock))
        {
            Some(at) => {
                ans.tally.hits += 1;
                table.table.prefetch_value(at);
                if let Some((op, slot)) = pending.push(i as u32, at as u32) {
                    self.deliver(shard, table, op as usize, slot as usize, ans);
                }
            }
            None => {
                ans.tally.misses += 1;
                ans.out.set(i, OpStatus::NotFound);
            }
        }
    }

    fn deliver_all(&self, shard: usize, table: &Shard, ans: &mut Answers<'_, impl ReplyRoom>, pending: &mut Pending) {
        while let Some((op, slot)) = pending.pop() {
            self.deliver(shard, table, op as usize, slot as usize, ans);
        }
    }

    /// Answers read `i` with the value of the entry in slot `at` (found by `probe_get`; the
    /// table has not changed since).
    #[inline]
    fn deliver(&self, _shard: usize, table: &Shard, i: usize, at: usize, ans: &mut Answers<'_, impl ReplyRoom>) {
        let Some(entry) = table.table.at(at) else {
            ans.out.set(i, OpStatus::NotFound);
            return;
        };
        entry.touch(ans.now);
        #[cfg(test)]
        if let Some(f) = &self.fault
            && f.answer_stale(_shard, entry.key(), |v| {
                ans.out.set_found(i, v);
            })
        {
            return;
        }
        if !ans.room.admit(entry.value().len()) {
            ans.tally.reply_too_large += 1;
            ans.out.set(i, OpStatus::TooLarge);
            return;
        }
        if ans.out.set_found(i, entry.value()) == OpStatus::OutOfMemory {
            ans.tally.out_of_memory += 1;
        }
    }
}

/// Orders the ops in `scratch.order` by shard, keeping batch order within a shard.
///
/// Small batches sort; large ones use a counting sort, linear in ops plus shards.
/// The result is left in `order`.
fn group_by_shard(order: &mut Vec<u64>, counts: &mut Vec<u32>, sorted: &mut Vec<u64>, shard_count: usize) {
    let n = order.len();
    if n <= 64 || n < shard_count / 4 {
        // Keys are (shard, index) so a plain sort keeps batch order within a shard.
        order.sort_unstable();
        return;
    }
    counts.clear();
    counts.resize(shard_count + 1, 0);
    for &e in order.iter() {
        counts[(e >> 32) as usize + 1] += 1;
    }
    for s in 1..=shard_count {
        counts[s] += counts[s - 1];
    }
    sorted.clear();
    sorted.resize(n, 0);
    for &e in order.iter() {
        let slot = &mut counts[(e >> 32) as usize];
        sorted[*slot as usize] = e;
        *slot += 1;
    }
    std::mem::swap(order, sorted);
}

/// A deliberate bug for the linearizability tests to find: the store remembers each
/// overwritten value and answers every third read of such a key with it. Compiled only into
/// kvd's own unit tests (`cfg(test)`), so no binary a user runs contains it; CI checks that
/// with `nm`.
#[cfg(test)]
pub(crate) mod stale {
    use std::collections::HashMap;
    use std::sync::atomic::{AtomicU64, Ordering};

    use parking_lot::Mutex;

    /// Per map shard: the value each key had before its last overwrite.
    type OldValues = Mutex<HashMap<Vec<u8>, Vec<u8>>>;

    pub struct StaleReads {
        old: Box<[OldValues]>,
        reads: AtomicU64,
    }

    impl StaleReads {
        pub fn new(shards: usize) -> StaleReads {
            StaleReads {
                old: (0..shards).map(|_| Mutex::new(HashMap::new())).collect(),
                reads: AtomicU64::new(0),
            }
        }

        pub fn remember(&self, shard: usize, key: &[u8], old: &[u8]) {
            self.old[shard].lock().insert(key.to_vec(), old.to_vec());
        }

        /// Calls `answer` with a stale value and returns true, for one read in three.
        pub fn answer_stale(&self, shard: usize, key: &[u8], answer: impl FnOnce(&[u8])) -> bool {
            if !self.reads.fetch_add(1, Ordering::Relaxed).is_multiple_of(3) {
                return false;
            }
            match self.old[shard].lock().get(key) {
                Some(v) => {
                    answer(v);
                    true
                }
                None => false,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kvshared::frame::AlignedVec;
    use kvshared::frame::{FrameKind, HEADER_LEN};
    use kvshared::routing::owner_node;
    use kvshared::wire::{BatchRequest, OpReply, ReplyView, encode_frame};

    /// Runs a request through the store and returns the encoded response body.
    fn run(store: &Store, req: &BatchRequest) -> (AlignedVec, Counts) {
        let mut frame = AlignedVec::new();
        encode_frame(FrameKind::BatchRequest, 1, req, &mut frame).unwrap();
        let mut body: AlignedVec = AlignedVec::new();
        body.extend_from_slice(&frame[HEADER_LEN..]);
        let view = BatchView::parse(&body).unwrap();
        let mut out = BatchResponse::default();
        let mut tally = Counts::default();
        store.execute(&view, &mut out, &mut Unbounded, &mut Scratch::default(), &mut tally);
        let mut resp = AlignedVec::new();
        encode_frame(FrameKind::BatchResponse, 1, &out, &mut resp).unwrap();
        let mut rbody: AlignedVec = AlignedVec::new();
        rbody.extend_from_slice(&resp[HEADER_LEN..]);
        (rbody, tally)
    }

    /// Appends as Redis's: an absent key starts empty, each append answers the new length,
    /// binary bytes stay as they are, appends in one batch land in order.
    #[test]
    fn appends_grow_the_value_in_order() {
        let store = Store::new(ShardId::SOLO, 8, 0).unwrap();
        let mut req = BatchRequest::new();
        req.push(OpKind::Append, b"a", b"Hello");
        req.push(OpKind::Append, b"a", b" World");
        req.push(OpKind::Append, b"a", &[0, 255]);
        req.push_get(b"a");
        req.push(OpKind::Append, b"e", b"");
        let (body, tally) = run(&store, &req);
        let r = ReplyView::parse(&body).unwrap();
        assert_eq!(r.result(0), OpReply::Counted(5));
        assert_eq!(r.result(1), OpReply::Counted(11));
        assert_eq!(r.result(2), OpReply::Counted(13));
        assert_eq!(r.result(3), OpReply::Found(b"Hello World\x00\xff"));
        assert_eq!(r.result(4), OpReply::Counted(0));
        assert_eq!((tally.puts, tally.gets), (4, 1));
    }

    /// Range writes as Redis's SETRANGE: zero padding up to the offset, overwriting inside
    /// the value, growing it past its end; no bytes: the length, an absent key stays absent;
    /// a short argument or one past 512 MiB is malformed, nothing allocated.
    #[test]
    fn range_writes_pad_overwrite_and_refuse_past_the_limit() {
        let store = Store::new(ShardId::SOLO, 8, 0).unwrap();
        let arg = |offset: u64, bytes: &[u8]| [&offset.to_le_bytes()[..], bytes].concat();
        let mut req = BatchRequest::new();
        req.push(OpKind::SetRange, b"k", &arg(3, b"ab"));
        req.push(OpKind::SetRange, b"k", &arg(0, b"xy"));
        req.push(OpKind::SetRange, b"k", &arg(4, b"cdef"));
        req.push_get(b"k");
        req.push(OpKind::SetRange, b"none", &arg(9, b""));
        req.push_get(b"none");
        req.push(OpKind::SetRange, b"k", &[1, 2]);
        req.push(OpKind::SetRange, b"k", &arg(kvshared::wire::MAX_STRING, b"z"));
        req.push(OpKind::SetRange, b"k", &arg(u64::MAX, b"z"));
        let (body, tally) = run(&store, &req);
        let r = ReplyView::parse(&body).unwrap();
        assert_eq!(r.result(0), OpReply::Counted(5));
        assert_eq!(r.result(1), OpReply::Counted(5));
        assert_eq!(r.result(2), OpReply::Counted(8));
        assert_eq!(r.result(3), OpReply::Found(b"xy\0acdef"));
        assert_eq!(r.result(4), OpReply::Counted(0));
        assert_eq!(r.result(5), OpReply::NotFound);
        for i in 6..9 {
            assert!(matches!(r.result(i), OpReply::Malformed(_)), "{i}: {:?}", r.result(i));
        }
        assert_eq!(tally.malformed_op, 3);
    }

    /// Increments as Redis's: an absent key counts as 0, the sum is stored in decimal and
    /// answered; a value that is not an integer and a sum that overflows change nothing;
    /// ops on one key in one batch apply in order.
    #[test]
    fn increments_add_in_order_and_refuse_non_integers_and_overflow() {
        let store = Store::new(ShardId::SOLO, 8, 0).unwrap();
        let mut req = BatchRequest::new();
        req.push(OpKind::IncrBy, b"n", &5i64.to_le_bytes());
        req.push(OpKind::IncrBy, b"n", &(-7i64).to_le_bytes());
        req.push_get(b"n");
        req.push_put(b"s", b"abc");
        req.push(OpKind::IncrBy, b"s", &1i64.to_le_bytes());
        req.push_put(b"big", i64::MAX.to_string().as_bytes());
        req.push(OpKind::IncrBy, b"big", &1i64.to_le_bytes());
        req.push(OpKind::IncrBy, b"n", &[1, 2, 3]);
        let (body, tally) = run(&store, &req);
        let r = ReplyView::parse(&body).unwrap();
        assert_eq!(r.result(0), OpReply::Counted(5));
        assert_eq!(r.result(1), OpReply::Counted(-2));
        assert_eq!(r.result(2), OpReply::Found(b"-2"));
        assert_eq!(r.result(4), OpReply::NotAnInteger);
        assert_eq!(r.result(6), OpReply::Overflow);
        assert!(matches!(r.result(7), OpReply::Malformed(_)));
        assert_eq!(tally.malformed_op, 1);
        let mut read = BatchRequest::new();
        read.push_get(b"s");
        read.push_get(b"big");
        let (body, _) = run(&store, &read);
        let r = ReplyView::parse(&body).unwrap();
        assert_eq!(r.result(0), OpReply::Found(b"abc"));
        assert_eq!(r.result(1), OpReply::Found(i64::MAX.to_string().as_bytes()));
    }

    fn limited(max_bytes: usize, eviction: Eviction) -> Store {
        Store::with_limit(ShardId::SOLO, 8, 0, Some(MemoryLimit { max_bytes, eviction })).unwrap()
    }

    /// A range write to a far offset under a small cap is refused for memory before its
    /// value is built (one op could otherwise make the node allocate up to 512 MiB), and
    /// changes nothing.
    #[test]
    fn a_range_write_past_the_cap_is_refused_before_it_allocates() {
        let store = limited(1 << 20, Eviction::Lru);
        let mut req = BatchRequest::new();
        req.push(
            OpKind::SetRange,
            b"k",
            &[&(400u64 << 20).to_le_bytes()[..], b"x"].concat(),
        );
        req.push_get(b"k");
        let (body, tally) = run(&store, &req);
        let r = ReplyView::parse(&body).unwrap();
        assert_eq!(r.result(0), OpReply::OutOfMemory);
        assert_eq!(r.result(1), OpReply::NotFound);
        assert_eq!((tally.out_of_memory, tally.puts), (1, 0));
    }

    /// Under a flood of writes of very different sizes the accounted total never passes
    /// the cap after a batch returns, and always equals what the shards hold (no drift, no
    /// leak); room is made by eviction, so no write is refused.
    #[test]
    fn the_cap_holds_under_a_write_flood() {
        let cap = 1 << 20;
        let store = limited(cap, Eviction::Lru);
        let mut state = 12345u64;
        let mut evicted = 0;
        for round in 0..200 {
            let mut req = BatchRequest::new();
            for i in 0..100 {
                state = state
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                let size = [1, 16, 128, 1000, 4000, 20_000][(state >> 33) as usize % 6];
                req.push_put(format!("k{}", (round * 100 + i) % 3000).as_bytes(), &vec![7u8; size]);
            }
            let (_, tally) = run(&store, &req);
            assert_eq!(tally.out_of_memory, 0);
            evicted += tally.evicted;
            assert!(
                store.memory_used() as usize <= cap,
                "{} over {cap}",
                store.memory_used()
            );
            assert_eq!(store.memory_used(), store.memory_recount());
        }
        assert!(evicted > 1000, "{evicted} evictions");
    }

    /// Under a cap, a crowded table grows early only from bytes to spare, never by evicting:
    /// keys chosen to crowd one home (uncapped, they grow the table towards 16 times its
    /// need) under a cap of twice what their table needs evict nothing and are refused
    /// nothing, and the accounting stays exact.
    #[test]
    fn early_growth_under_a_cap_takes_only_spare_bytes() {
        let keys: Vec<[u8; 8]> = (0..2_000_000u64)
            .map(u64::to_le_bytes)
            .filter(|k| kvshared::keyspace::placement_position(key_hash(k) >> 8) < 1 << 22)
            .collect();
        let cap = keys.len() * table::entry_bytes(8, 16) + 2 * Table::bytes_for(keys.len());
        let store = Store::with_limit(
            ShardId::SOLO,
            1,
            0,
            Some(MemoryLimit {
                max_bytes: cap,
                eviction: Eviction::Lru,
            }),
        )
        .unwrap();
        let mut req = BatchRequest::new();
        for k in &keys {
            req.push_put(k, &[7u8; 16]);
        }
        let (_, tally) = run(&store, &req);
        assert!(keys.len() > 1000, "{} keys", keys.len());
        assert_eq!(
            (tally.evicted, tally.out_of_memory, tally.puts),
            (0, 0, keys.len() as u64)
        );
        assert!(
            store.memory_used() as usize <= cap,
            "{} over {cap}",
            store.memory_used()
        );
        assert_eq!(store.memory_used(), store.memory_recount());
    }

    /// With `none`, writes past the cap are refused per op (reads and deletes go on), and
    /// succeed again once deletes made room.
    #[test]
    fn none_refuses_writes_at_the_cap_and_recovers_after_deletes() {
        let store = limited(64 << 10, Eviction::None);
        let mut req = BatchRequest::new();
        for i in 0..1000 {
            req.push_put(format!("k{i}").as_bytes(), &[1u8; 100]);
        }
        let (reply, tally) = run(&store, &req);
        assert!(tally.out_of_memory > 0 && tally.puts > 0, "{tally:?}");
        assert_eq!(tally.evicted, 0);
        let stored = tally.puts;
        let view = ReplyView::parse(&reply).unwrap();
        let kept = (0..1000).find(|&i| view.result(i) == OpReply::Stored).unwrap();
        assert!((0..1000).any(|i| view.result(i) == OpReply::OutOfMemory));
        let mut reads = BatchRequest::new();
        reads.push_get(format!("k{kept}").as_bytes());
        let (reply, _) = run(&store, &reads);
        assert!(matches!(ReplyView::parse(&reply).unwrap().result(0), OpReply::Found(_)));
        let mut dels = BatchRequest::new();
        for i in 0..100 {
            dels.push_delete(format!("k{i}").as_bytes());
        }
        let (reply, _) = run(&store, &dels);
        let view = ReplyView::parse(&reply).unwrap();
        let removed = (0..100).filter(|&i| view.result(i) == OpReply::Deleted).count() as u64;
        assert!(removed > 0);
        let mut again = BatchRequest::new();
        again.push_put(b"new", &[1u8; 100]);
        let (reply, _) = run(&store, &again);
        assert_eq!(ReplyView::parse(&reply).unwrap().result(0), OpReply::Stored);
        assert_eq!(store.len(), stored - removed + 1);
        assert_eq!(store.memory_used(), store.memory_recount());
    }

    /// Approximate LRU: keys read all along survive a scan of many cold keys written
    /// through a cache that holds a fraction of them.
    #[test]
    fn recently_read_keys_survive_a_scan_of_cold_keys() {
        let store = limited(512 << 10, Eviction::Lru);
        let hot: Vec<String> = (0..500).map(|i| format!("hot{i}")).collect();
        let mut req = BatchRequest::new();
        for k in &hot {
            req.push_put(k.as_bytes(), &[1u8; 100]);
        }
        run(&store, &req);
        for round in 0..50 {
            std::thread::sleep(std::time::Duration::from_millis(2));
            let mut reads = BatchRequest::new();
            for k in &hot {
                reads.push_get(k.as_bytes());
            }
            run(&store, &reads);
            let mut cold = BatchRequest::new();
            for i in 0..200 {
                cold.push_put(format!("cold{round}-{i}").as_bytes(), &[2u8; 100]);
            }
            run(&store, &cold);
        }
        let mut reads = BatchRequest::new();
        for k in &hot {
            reads.push_get(k.as_bytes());
        }
        let (_, tally) = run(&store, &reads);
        assert!(tally.hits >= 475, "only {} of 500 hot keys survived", tally.hits);
        assert!(store.len() < 500 + 50 * 200, "nothing was evicted");
    }

    /// Error replies cost nine bytes per op like any other (the owner rides in the value
    /// slots), so a request full of failing ops cannot make a reply larger than itself.
    /// (With a detail record per error, a 64 MiB frame of bad ops gave a 380 MB reply.)
    #[test]
    fn a_reply_of_errors_is_no_larger_than_its_request() {
        let store = Store::new(ShardId { index: 0, count: 2 }, 8, 0).unwrap();
        let mut req = BatchRequest::new();
        let mut i = 0u64;
        while req.len() < 100_000 {
            let key = i.to_string();
            if owner_node(key.as_bytes(), 2) == 1 {
                req.push_get(key.as_bytes());
            }
            i += 1;
        }
        let (reply, tally) = run(&store, &req);
        assert_eq!(tally.wrong_shard, 100_000);
        let mut request = AlignedVec::new();
        encode_frame(FrameKind::BatchRequest, 1, &req, &mut request).unwrap();
        assert!(
            reply.len() <= request.len(),
            "reply {} bytes for a request of {}",
            reply.len(),
            request.len()
        );
    }

    #[test]
    fn put_get_delete_in_one_batch_keep_order() {
        let store = Store::new(ShardId::SOLO, 8, 0).unwrap();
        let mut req = BatchRequest::new();
        req.push_get(b"a");
        req.push_put(b"a", b"1");
        req.push_get(b"a");
        req.push_put(b"a", b"22");
        req.push_get(b"a");
        req.push_delete(b"a");
        req.push_delete(b"a");
        req.push_get(b"a");
        let (body, tally) = run(&store, &req);
        let v = ReplyView::parse(&body).unwrap();
        let got: Vec<_> = (0..8).map(|i| v.result(i)).collect();
        assert_eq!(
            got,
            vec![
                OpReply::NotFound,
                OpReply::Stored,
                OpReply::Found(b"1"),
                OpReply::Stored,
                OpReply::Found(b"22"),
                OpReply::Deleted,
                OpReply::Absent,
                OpReply::NotFound
            ]
        );
        assert_eq!((tally.gets, tally.puts, tally.deletes, tally.hits), (4, 2, 2, 2));
        assert!(store.is_empty());
    }

    #[test]
    fn large_batches_group_by_shard_and_answer_in_op_order() {
        let store = Store::new(ShardId::SOLO, 16, 1000).unwrap();
        let mut req = BatchRequest::new();
        for i in 0..500u32 {
            req.push_put(i.to_string().as_bytes(), &i.to_le_bytes());
        }
        for i in 0..500u32 {
            req.push_get(i.to_string().as_bytes());
        }
        let (body, _) = run(&store, &req);
        let v = ReplyView::parse(&body).unwrap();
        for i in 0..500u32 {
            assert_eq!(v.result(500 + i as usize), OpReply::Found(&i.to_le_bytes()));
        }
        assert_eq!(store.len(), 500);
    }

    #[test]
    fn keys_of_other_nodes_are_refused_with_the_owner() {
        let me = ShardId { index: 1, count: 3 };
        let store = Store::new(me, 4, 0).unwrap();
        let mut req = BatchRequest::new();
        let keys: Vec<String> = (0..50).map(|i| format!("k{i}")).collect();
        for k in &keys {
            req.push_put(k.as_bytes(), b"v");
        }
        let (body, tally) = run(&store, &req);
        let v = ReplyView::parse(&body).unwrap();
        for (i, k) in keys.iter().enumerate() {
            let owner = owner_node(k.as_bytes(), 3);
            if owner == 1 {
                assert_eq!(v.result(i), OpReply::Stored);
            } else {
                let slot = kvshared::routing::key_slot(k.as_bytes());
                assert_eq!(
                    v.result(i),
                    OpReply::Moved {
                        slot,
                        owner: owner as u16,
                        epoch: 0
                    }
                );
            }
        }
        assert_eq!(tally.wrong_shard + tally.puts, 50);
        assert_eq!(store.len(), tally.puts);
    }
}
