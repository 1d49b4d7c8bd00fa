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

use crossbeam::utils::CachePadded;
use hashbrown::HashTable;
use kvshared::routing::{ShardId, key_hash, map_shard, owner_node};
use kvshared::stats::Counts;
use kvshared::wire::{BatchResponse, BatchView, OpKind, OpStatus};
use parking_lot::RwLock;

/// One stored pair: key and value share a single allocation.
struct Entry {
    data: Box<[u8]>,
    key_len: u32,
}

impl Entry {
    /// A new entry, or `None` when there is no memory for it (refused, not an abort).
    fn new(key: &[u8], value: &[u8]) -> Option<Entry> {
        let mut data = Vec::new();
        data.try_reserve_exact(key.len() + value.len()).ok()?;
        data.extend_from_slice(key);
        data.extend_from_slice(value);
        Some(Entry {
            data: data.into_boxed_slice(),
            key_len: key.len() as u32,
        })
    }

    fn key(&self) -> &[u8] {
        self.data.get(..self.key_len as usize).unwrap_or_default()
    }

    fn value(&self) -> &[u8] {
        self.data.get(self.key_len as usize..).unwrap_or_default()
    }

    /// Replaces the value, in place when the length is unchanged (the common YCSB update).
    /// Returns false, leaving the old value, when there is no memory for the new one.
    fn set_value(&mut self, value: &[u8]) -> bool {
        let k = self.key_len as usize;
        if self.data.len() - k == value.len() {
            self.data[k..].copy_from_slice(value);
            return true;
        }
        match Entry::new(&self.data[..k], value) {
            Some(e) => {
                *self = e;
                true
            }
            None => false,
        }
    }
}

type Shard = HashTable<Entry>;

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

/// Reusable per-connection memory for grouping a batch by shard.
#[derive(Default)]
pub struct Scratch {
    /// Per op: `(shard << 32) | op index`, or skipped ops left out.
    order: Vec<u64>,
    hashes: Vec<u64>,
    writes: Vec<bool>,
    counts: Vec<u32>,
    sorted: Vec<u64>,
}

/// Where a batch's results go: the response, the reply's room, the counters.
struct Answers<'a, R> {
    out: &'a mut BatchResponse,
    room: &'a mut R,
    tally: &'a mut Counts,
}

/// The sharded map.
pub struct Store {
    shards: Box<[CachePadded<RwLock<Shard>>]>,
    me: ShardId,
    #[cfg(test)]
    fault: Option<stale::StaleReads>,
}

impl Store {
    /// A store for node `me` with `map_shards` internal shards (rounded up to a power of two),
    /// preallocated for about `capacity` keys in total. Memory that cannot be had is an
    /// error (`OutOfMemory`), not an abort.
    pub fn new(me: ShardId, map_shards: usize, capacity: usize) -> std::io::Result<Store> {
        let n = map_shards.max(1).next_power_of_two();
        let per_shard = capacity.div_ceil(n);
        let mut shards = Vec::with_capacity(n);
        for _ in 0..n {
            let mut table = HashTable::new();
            table
                .try_reserve(per_shard, |e: &Entry| key_hash(e.key()))
                .map_err(|e| {
                    std::io::Error::new(
                        std::io::ErrorKind::OutOfMemory,
                        format!("cannot preallocate room for {capacity} keys ({e:?}); lower --capacity"),
                    )
                })?;
            shards.push(CachePadded::new(RwLock::new(table)));
        }
        Ok(Store {
            shards: shards.into_boxed_slice(),
            me,
            #[cfg(test)]
            fault: None,
        })
    }

    /// Unit tests only: answer some reads from a stale copy (see [`stale`]).
    #[cfg(test)]
    pub(crate) fn enable_stale_reads(&mut self) {
        self.fault = Some(stale::StaleReads::new(self.shards.len()));
    }

    /// Internal map shards.
    pub fn map_shards(&self) -> usize {
        self.shards.len()
    }

    /// Keys stored now (takes each shard's lock briefly; for stats, not the hot path).
    pub fn len(&self) -> u64 {
        self.shards.iter().map(|s| s.read().len() as u64).sum()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Executes every op of `batch`, writing one result per op into `out` (found values
    /// that `room` does not admit are answered `TooLarge`), and adds what it did to `tally`
    /// (op and error counters).
    pub fn execute(
        &self,
        batch: &BatchView<'_>,
        out: &mut BatchResponse,
        room: &mut impl ReplyRoom,
        scratch: &mut Scratch,
        tally: &mut Counts,
    ) {
        let n = batch.len();
        out.reset(n);
        scratch.order.clear();
        scratch.hashes.clear();
        scratch.hashes.resize(n, 0);
        scratch.writes.clear();
        scratch.writes.resize(n, false);
        let shard_count = self.shards.len();
        for i in 0..n {
            let op = match batch.op(i) {
                Ok(op) => op,
                Err(why) => {
                    out.set_malformed(i, why);
                    tally.malformed_op += 1;
                    continue;
                }
            };
            let hash = key_hash(op.key);
            if !self.me.owns(hash) {
                out.set_wrong_shard(i, owner_node(hash, self.me.count), self.me.count);
                tally.wrong_shard += 1;
                continue;
            }
            scratch.hashes[i] = hash;
            scratch.writes[i] = op.kind != OpKind::Get;
            scratch
                .order
                .push(((map_shard(hash, shard_count) as u64) << 32) | i as u64);
        }
        group_by_shard(
            &mut scratch.order,
            &mut scratch.counts,
            &mut scratch.sorted,
            shard_count,
        );
        let order = &scratch.order;
        let mut ans = Answers { out, room, tally };
        let mut start = 0;
        while start < order.len() {
            let shard = (order[start] >> 32) as usize;
            let mut end = start + 1;
            while end < order.len() && (order[end] >> 32) as usize == shard {
                end += 1;
            }
            let group = &order[start..end];
            let writes = group.iter().any(|&e| scratch.writes[e as u32 as usize]);
            if writes {
                self.run_group_write(shard, group, batch, &scratch.hashes, &mut ans);
            } else {
                self.run_group_read(shard, group, batch, &scratch.hashes, &mut ans);
            }
            start = end;
        }
    }

    fn run_group_read(
        &self,
        shard: usize,
        group: &[u64],
        batch: &BatchView<'_>,
        hashes: &[u64],
        ans: &mut Answers<'_, impl ReplyRoom>,
    ) {
        let table = self.shards[shard].read();
        for &e in group {
            let i = e as u32 as usize;
            if let Ok(op) = batch.op(i) {
                self.get(shard, &table, hashes[i], op.key, i, ans);
            }
        }
    }

    fn run_group_write(
        &self,
        shard: usize,
        group: &[u64],
        batch: &BatchView<'_>,
        hashes: &[u64],
        ans: &mut Answers<'_, impl ReplyRoom>,
    ) {
        let mut table = self.shards[shard].write();
        for &e in group {
            let i = e as u32 as usize;
            let Ok(op) = batch.op(i) else { continue };
            let hash = hashes[i];
            match op.kind {
                OpKind::Get => self.get(shard, &table, hash, op.key, i, ans),
                OpKind::Put => {
                    let stored = match table.find_mut(hash, |e| e.key() == op.key) {
                        Some(entry) => {
                            #[cfg(test)]
                            if let Some(f) = &self.fault {
                                f.remember(shard, op.key, entry.value());
                            }
                            entry.set_value(op.value)
                        }
                        None => match Entry::new(op.key, op.value) {
                            Some(entry) if table.try_reserve(1, |e| key_hash(e.key())).is_ok() => {
                                table.insert_unique(hash, entry, |e| key_hash(e.key()));
                                true
                            }
                            _ => false,
                        },
                    };
                    if stored {
                        ans.tally.puts += 1;
                        ans.out.set(i, OpStatus::Stored);
                    } else {
                        ans.tally.out_of_memory += 1;
                        ans.out.set(i, OpStatus::OutOfMemory);
                    }
                }
                OpKind::Delete => {
                    ans.tally.deletes += 1;
                    let existed = match table.find_entry(hash, |e| e.key() == op.key) {
                        Ok(found) => {
                            found.remove();
                            true
                        }
                        Err(_) => false,
                    };
                    ans.out
                        .set(i, if existed { OpStatus::Deleted } else { OpStatus::Absent });
                }
            }
        }
    }
}

impl Store {
    #[inline]
    fn get(
        &self,
        _shard: usize,
        table: &Shard,
        hash: u64,
        key: &[u8],
        i: usize,
        ans: &mut Answers<'_, impl ReplyRoom>,
    ) {
        ans.tally.gets += 1;
        match table.find(hash, |e| e.key() == key) {
            Some(entry) => {
                ans.tally.hits += 1;
                #[cfg(test)]
                if let Some(f) = &self.fault
                    && f.answer_stale(_shard, key, |v| {
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
            None => {
                ans.tally.misses += 1;
                ans.out.set(i, OpStatus::NotFound);
            }
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
            if owner_node(key_hash(key.as_bytes()), 2) == 1 {
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
            let owner = owner_node(key_hash(k.as_bytes()), 3);
            if owner == 1 {
                assert_eq!(v.result(i), OpReply::Stored);
            } else {
                assert_eq!(v.result(i), OpReply::WrongShard { owner, nodes: 3 });
            }
        }
        assert_eq!(tally.wrong_shard + tally.puts, 50);
        assert_eq!(store.len(), tally.puts);
    }
}
