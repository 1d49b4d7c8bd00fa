//! Times to live in the store: the ops that set and read deadlines, expiry on access, and
//! the active cycle.
//!
//! One rule keeps replicas and replays in agreement: a key past its deadline is removed
//! only by a write, and every write decides "past" against its batch's clock (see
//! `Answers::clock`), which for a logged batch is the leader's clock written into the
//! entry. A read only answers an expired key as missing; it removes nothing. So every
//! member, and every replay of the log, removes the same keys at the same entries. In
//! memory, the active cycle removes expired keys itself; on a durable node only the
//! leader's cycle runs, and it logs `Expired` ops (Redis's rule: replicas wait for the
//! master's deletes).

use super::Ops;
use std::time::Instant;

use kvshared::expiry::{Expire, ExpireIf, PutIf, PutTtl, PutWith, clock_of, now_ms};
use kvshared::stats::Counts;
use kvshared::wire::{MalformedOp, OpKind, OpStatus};

use super::memory::Shard;
use super::{Answers, ReplyRoom, Store};

/// Deadlines the active cycle samples from a map shard per round (Redis's
/// `ACTIVE_EXPIRE_CYCLE_KEYS_PER_LOOP`).
const SAMPLES_PER_ROUND: usize = 20;
/// A map shard gets another round while more than this share of a round's sample had
/// expired (Redis: 10%; its default effort).
const AGAIN_ABOVE_PERCENT: usize = 10;

/// The time a batch's ops see (see `Answers::clock`): the node's clock, or when applying a
/// log entry (`log_index` > 0) the clock op its leader put first.
pub(super) fn batch_clock(batch: &impl Ops, log_index: u64) -> u64 {
    if log_index == 0 {
        return now_ms();
    }
    match batch.op(0) {
        Ok(op) if op.kind == OpKind::Clock => clock_of(op.value).unwrap_or(0),
        _ => 0,
    }
}

/// What one run of the active cycle did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CycleFigures {
    /// Deadlines looked at.
    pub sampled: u64,
    /// Keys removed (in memory) or found due (durable: to be logged).
    pub expired: u64,
}

impl Store {
    /// Removes `key` (in `s`, locked for writing) if its deadline is at or before the
    /// batch's clock; true when it did.
    pub(super) fn expire_if_due(
        &self,
        s: &mut Shard,
        hash: u64,
        key: &[u8],
        ans: &mut Answers<'_, impl ReplyRoom>,
    ) -> bool {
        if !s.expires.is_due(key, ans.clock) {
            return false;
        }
        ans.tally.expired += 1;
        self.remove_key(s, hash, key)
    }

    /// Removes `key` and its deadline from `s` (locked for writing); true when it was there.
    pub(super) fn remove_key(&self, s: &mut Shard, hash: u64, key: &[u8]) -> bool {
        let Some(at) = s.table.find(hash, key) else {
            return false;
        };
        self.memory.usage.give(s.remove_at(at));
        true
    }

    /// Sets (`Some`) or removes `key`'s deadline in `s`, keeping the accounts.
    pub(super) fn set_deadline(&self, s: &mut Shard, key: &[u8], at: Option<u64>) {
        s.note_written(key);
        match at {
            Some(at) => {
                let added = s.expires.set(key, at);
                s.entry_bytes += added;
                self.memory.usage.add(added);
            }
            None => {
                let freed = s.expires.remove(key);
                s.entry_bytes -= freed;
                self.memory.usage.give(freed);
            }
        }
    }

    /// A read of `key`'s deadline (op `i`): `Counted` with it or -1, `NotFound` when the
    /// key is absent or past its deadline.
    pub(super) fn ttl_of(s: &Shard, hash: u64, key: &[u8], i: usize, ans: &mut Answers<'_, impl ReplyRoom>) {
        ans.tally.gets += 1;
        if s.table.find(hash, key).is_none() || s.expires.is_due(key, ans.clock) {
            ans.tally.misses += 1;
            return ans.out.set(i, OpStatus::NotFound);
        }
        ans.tally.hits += 1;
        let at = s.expires.get(key).map_or(-1, |at| at as i64);
        ans.out.set_counted(i, at);
    }

    /// Op `i`, a put with a condition and a time to live (`arg`: a [`PutWith`]).
    #[allow(clippy::too_many_arguments)]
    pub(super) fn put_with(
        &self,
        shard: usize,
        s: &mut Shard,
        hash: u64,
        key: &[u8],
        arg: &[u8],
        i: usize,
        ans: &mut Answers<'_, impl ReplyRoom>,
    ) {
        let Some(p) = PutWith::decode(arg) else {
            ans.tally.malformed_op += 1;
            return ans.out.set_malformed(i, MalformedOp::BadExpiry);
        };
        ans.tally.puts += 1;
        let present = s.table.find(hash, key).is_some();
        if matches!((p.cond, present), (PutIf::Absent, true) | (PutIf::Present, false)) {
            return ans.out.set(i, OpStatus::NotStored);
        }
        if !self.put(shard, s, hash, key, p.value, ans) {
            ans.tally.puts -= 1;
            ans.tally.out_of_memory += 1;
            return ans.out.set(i, OpStatus::OutOfMemory);
        }
        match p.ttl {
            PutTtl::Clear => self.set_deadline(s, key, None),
            PutTtl::Keep => {}
            PutTtl::Until(d) => self.set_deadline(s, key, Some(d.resolve(ans.clock))),
        }
        ans.out.set(i, OpStatus::Stored);
    }

    /// Op `i`, setting or removing `key`'s deadline (`arg`: an [`Expire`]): `Stored` when
    /// it changed, `NotStored` when the key is absent or the condition does not hold. A
    /// deadline already past removes the key, as Redis does.
    pub(super) fn expire(
        &self,
        s: &mut Shard,
        hash: u64,
        key: &[u8],
        arg: &[u8],
        i: usize,
        ans: &mut Answers<'_, impl ReplyRoom>,
    ) {
        let Some(e) = Expire::decode(arg) else {
            ans.tally.malformed_op += 1;
            return ans.out.set_malformed(i, MalformedOp::BadExpiry);
        };
        ans.tally.puts += 1;
        let current = s.expires.get(key);
        let new = e.deadline.resolve(ans.clock);
        let changed = s.table.find(hash, key).is_some()
            && match e.cond {
                ExpireIf::Persist => current.is_some(),
                _ => e.applies(current, new),
            };
        if !changed {
            return ans.out.set(i, OpStatus::NotStored);
        }
        match e.cond {
            ExpireIf::Persist => self.set_deadline(s, key, None),
            _ if new <= ans.clock => {
                self.remove_key(s, hash, key);
            }
            _ => self.set_deadline(s, key, Some(new)),
        }
        ans.out.set(i, OpStatus::Stored);
    }

    /// Keys with a deadline, over every map shard.
    pub fn volatile_keys(&self) -> u64 {
        self.map.shards.iter().map(|s| s.read().expires.len() as u64).sum()
    }

    /// One run of the active cycle in memory, as Redis's: from each map shard in turn
    /// (starting at `from`), sample deadlines and remove the keys past `clock`, again while
    /// a round finds more than a tenth expired; stops at `until`. Each round holds one map
    /// shard's lock for at most 20 (`SAMPLES_PER_ROUND`) lookups.
    pub fn expire_cycle(&self, clock: u64, from: usize, until: Instant, tally: &mut Counts) -> CycleFigures {
        let mut figures = CycleFigures::default();
        let n = self.map.shards.len();
        for step in 0..n {
            let shard = (from + step) % n;
            loop {
                let mut s = self.map.shards[shard].write();
                let (sampled, due) = Self::sample_due(&mut s, clock);
                for key in &due {
                    let hash = kvshared::routing::key_hash(key);
                    self.remove_key(&mut s, hash, key);
                }
                drop(s);
                figures.sampled += sampled as u64;
                figures.expired += due.len() as u64;
                tally.expired += due.len() as u64;
                if due.len() * 100 <= sampled * AGAIN_ABOVE_PERCENT || Instant::now() >= until {
                    break;
                }
            }
            if Instant::now() >= until {
                break;
            }
        }
        figures
    }

    /// For a durable leader's cycle: up to `max` keys past `clock`, sampled from each map
    /// shard in turn as [`Store::expire_cycle`] does, removing nothing (the leader logs
    /// `Expired` ops for them).
    pub fn due_keys(&self, clock: u64, max: usize, out: &mut Vec<Vec<u8>>) -> CycleFigures {
        let mut figures = CycleFigures::default();
        for shard in self.map.shards.iter() {
            if out.len() >= max {
                break;
            }
            let mut s = shard.write();
            let (sampled, due) = Self::sample_due(&mut s, clock);
            drop(s);
            figures.sampled += sampled as u64;
            figures.expired += due.len() as u64;
            out.extend(due.into_iter().take(max - out.len()));
        }
        figures
    }

    /// Samples up to [`SAMPLES_PER_ROUND`] deadlines of `s` at random: how many it looked
    /// at, and the keys past `clock` among them.
    fn sample_due(s: &mut Shard, clock: u64) -> (usize, Vec<Vec<u8>>) {
        let len = s.expires.len();
        let sampled = len.min(SAMPLES_PER_ROUND);
        let mut due = Vec::new();
        for _ in 0..sampled {
            let i = (s.next_random() % len as u64) as usize;
            if let Some((key, at)) = s.expires.at(i)
                && at <= clock
                && !due.iter().any(|d: &Vec<u8>| d == key)
            {
                due.push(key.to_vec());
            }
        }
        (sampled, due)
    }
}

#[cfg(test)]
pub(in crate::store) mod tests_support {
    use kvshared::expiry::clock_value;
    use kvshared::frame::{AlignedVec, FrameKind, HEADER_LEN};
    use kvshared::wire::{BatchRequest, BatchResponse, OpReply, encode_frame};

    use super::*;
    use crate::store::{Scratch, Unbounded};

    /// Runs `req` as a log entry applied at `clock` (its first op the clock), or, with
    /// `clock` 0, as a client's batch; returns each op's result (the clock's left out).
    pub(in crate::store) fn run_at(store: &Store, clock: u64, req: &BatchRequest) -> (Vec<OpReply<'static>>, Counts) {
        let mut entry = BatchRequest::new();
        if clock > 0 {
            entry.push(OpKind::Clock, b"", &clock_value(clock));
        }
        let mut frame = AlignedVec::new();
        encode_frame(FrameKind::BatchRequest, 1, &joined(&entry, req), &mut frame).unwrap();
        let mut body: AlignedVec = AlignedVec::new();
        body.extend_from_slice(&frame[HEADER_LEN..]);
        let view = kvshared::wire::BatchView::parse(&body).unwrap();
        let mut out = BatchResponse::default();
        let mut tally = Counts::default();
        let mut scratch = Scratch {
            log_index: u64::from(clock > 0),
            ..Scratch::default()
        };
        store.execute(&view, &mut out, &mut Unbounded, &mut scratch, &mut tally);
        let skip = usize::from(clock > 0);
        let results = (skip..out.len()).map(|i| leak(out.result(i))).collect();
        (results, tally)
    }

    fn joined(first: &BatchRequest, rest: &BatchRequest) -> BatchRequest {
        let mut all = first.clone();
        let mut frame = AlignedVec::new();
        encode_frame(FrameKind::BatchRequest, 1, rest, &mut frame).unwrap();
        let mut body: AlignedVec = AlignedVec::new();
        body.extend_from_slice(&frame[HEADER_LEN..]);
        let view = kvshared::wire::BatchView::parse(&body).unwrap();
        for i in 0..view.len() {
            let op = view.op(i).unwrap();
            all.push(op.kind, op.key, op.value);
        }
        all
    }

    fn leak(r: OpReply<'_>) -> OpReply<'static> {
        match r {
            OpReply::Found(v) => OpReply::Found(Box::leak(v.to_vec().into_boxed_slice())),
            OpReply::NotFound => OpReply::NotFound,
            OpReply::Stored => OpReply::Stored,
            OpReply::NotStored => OpReply::NotStored,
            OpReply::Deleted => OpReply::Deleted,
            OpReply::Absent => OpReply::Absent,
            OpReply::Counted(n) => OpReply::Counted(n),
            OpReply::OutOfMemory => OpReply::OutOfMemory,
            OpReply::Aborted => OpReply::Aborted,
            OpReply::Moved { slot, owner, epoch } => OpReply::Moved { slot, owner, epoch },
            OpReply::Malformed(_) => OpReply::Malformed("malformed"),
            _ => OpReply::Malformed("other"),
        }
    }
}

#[cfg(test)]
mod tests {
    use kvshared::expiry::{Deadline, clock_value};
    use kvshared::routing::ShardId;
    use kvshared::wire::{BatchRequest, OpReply};

    use super::tests_support::run_at;
    use super::*;

    fn put_ttl(req: &mut BatchRequest, key: &[u8], value: &[u8], cond: PutIf, ttl: PutTtl) {
        req.push(OpKind::PutWith, key, &PutWith { cond, ttl, value }.encode());
    }

    fn expire(req: &mut BatchRequest, key: &[u8], cond: ExpireIf, deadline: Deadline) {
        req.push(OpKind::Expire, key, &Expire { cond, deadline }.encode());
    }

    /// A key set with a time to live answers its deadline, is found before it and missing
    /// from it on, and the first write after it removes it (counted expired); a plain put
    /// ends the time to live, an increment keeps it, KEEPTTL keeps it.
    #[test]
    fn a_key_lives_until_its_deadline_and_writes_keep_or_end_it_as_redis() {
        let store = Store::new(ShardId::SOLO, 4, 0).unwrap();
        let mut req = BatchRequest::new();
        put_ttl(&mut req, b"k", b"1", PutIf::Always, PutTtl::Until(Deadline::In(100)));
        req.push(OpKind::Ttl, b"k", b"");
        req.push(OpKind::IncrBy, b"k", &5i64.to_le_bytes());
        req.push(OpKind::Ttl, b"k", b"");
        req.push(OpKind::Ttl, b"none", b"");
        let (r, _) = run_at(&store, 1_000, &req);
        assert_eq!(
            r,
            [
                OpReply::Stored,
                OpReply::Counted(1_100),
                OpReply::Counted(6),
                OpReply::Counted(1_100),
                OpReply::NotFound
            ]
        );
        let mut get = BatchRequest::new();
        get.push_get(b"k");
        assert_eq!(run_at(&store, 1_099, &get).0, [OpReply::Found(b"6")]);
        assert_eq!(run_at(&store, 1_100, &get).0, [OpReply::NotFound]);
        assert_eq!(store.len(), 1, "a read removes nothing");
        let mut incr = BatchRequest::new();
        incr.push(OpKind::IncrBy, b"k", &1i64.to_le_bytes());
        let (r, tally) = run_at(&store, 1_100, &incr);
        assert_eq!(
            (r[0], tally.expired),
            (OpReply::Counted(1), 1),
            "the write found it gone"
        );
        let mut req = BatchRequest::new();
        put_ttl(&mut req, b"k", b"a", PutIf::Always, PutTtl::Until(Deadline::At(5_000)));
        put_ttl(&mut req, b"k", b"b", PutIf::Present, PutTtl::Keep);
        req.push(OpKind::Ttl, b"k", b"");
        req.push_put(b"k", b"c");
        req.push(OpKind::Ttl, b"k", b"");
        let (r, _) = run_at(&store, 2_000, &req);
        assert_eq!(
            r,
            [
                OpReply::Stored,
                OpReply::Stored,
                OpReply::Counted(5_000),
                OpReply::Stored,
                OpReply::Counted(-1)
            ]
        );
        assert_eq!(store.memory_used(), store.memory_recount());
    }

    /// EXPIRE's conditions (NX, XX, GT, LT) and PERSIST, as Redis: an absent key is never
    /// changed, GT never sets a deadline on a key without one, LT always does, and a
    /// deadline already past removes the key.
    #[test]
    fn expire_conditions_persist_and_a_past_deadline_are_redis_s() {
        let store = Store::new(ShardId::SOLO, 4, 0).unwrap();
        let mut req = BatchRequest::new();
        req.push_put(b"k", b"v");
        expire(&mut req, b"absent", ExpireIf::Always, Deadline::In(10));
        expire(&mut req, b"k", ExpireIf::HasTtl, Deadline::In(10));
        expire(&mut req, b"k", ExpireIf::Later, Deadline::In(10));
        expire(&mut req, b"k", ExpireIf::Sooner, Deadline::In(50));
        expire(&mut req, b"k", ExpireIf::NoTtl, Deadline::In(10));
        expire(&mut req, b"k", ExpireIf::Later, Deadline::In(60));
        expire(&mut req, b"k", ExpireIf::Sooner, Deadline::In(70));
        req.push(OpKind::Ttl, b"k", b"");
        req.push(OpKind::Expire, b"k", &Expire::persist().encode());
        req.push(OpKind::Expire, b"k", &Expire::persist().encode());
        req.push(OpKind::Ttl, b"k", b"");
        expire(&mut req, b"k", ExpireIf::Always, Deadline::At(1));
        req.push_get(b"k");
        let (r, _) = run_at(&store, 100, &req);
        use OpReply::*;
        assert_eq!(
            r,
            [
                Stored,
                NotStored,
                NotStored,
                NotStored,
                Stored,
                NotStored,
                Stored,
                NotStored,
                Counted(160),
                Stored,
                NotStored,
                Counted(-1),
                Stored,
                NotFound
            ]
        );
        assert_eq!(store.len(), 0, "a past deadline removed it");
        assert_eq!(store.memory_used(), store.memory_recount());
    }

    /// A clock op from a client is malformed (only a log entry carries one), and ops with
    /// arguments that do not parse are malformed, nothing changed.
    #[test]
    fn a_client_s_clock_and_bad_arguments_are_refused() {
        let store = Store::new(ShardId::SOLO, 4, 0).unwrap();
        let mut req = BatchRequest::new();
        req.push(OpKind::Clock, b"", &clock_value(u64::MAX));
        req.push(OpKind::PutWith, b"k", &[9, 9]);
        req.push(OpKind::Expire, b"k", &[0]);
        let (r, tally) = run_at(&store, 0, &req);
        assert!(r.iter().all(|r| matches!(r, OpReply::Malformed(_))), "{r:?}");
        assert_eq!((tally.malformed_op, store.len()), (3, 0));
    }

    /// The active cycle removes keys past their deadline, leaves the others, and keeps the
    /// accounts; `due_keys` finds the same keys without removing them.
    #[test]
    fn the_active_cycle_removes_what_is_due() {
        let store = Store::new(ShardId::SOLO, 4, 0).unwrap();
        let mut req = BatchRequest::new();
        for i in 0..200u32 {
            let key = format!("k{i}");
            let ttl = if i % 2 == 0 { 10 } else { 10_000 };
            put_ttl(
                &mut req,
                key.as_bytes(),
                b"v",
                PutIf::Always,
                PutTtl::Until(Deadline::In(ttl)),
            );
        }
        run_at(&store, 1_000, &req);
        let mut due = Vec::new();
        store.due_keys(2_000, 1_000, &mut due);
        assert!(!due.is_empty() && due.len() <= 100, "{}", due.len());
        assert_eq!(store.len(), 200);
        let mut tally = Counts::default();
        let until = Instant::now() + std::time::Duration::from_secs(5);
        for _ in 0..100 {
            store.expire_cycle(2_000, 0, until, &mut tally);
        }
        assert_eq!((store.len(), tally.expired), (100, 100));
        assert_eq!(store.volatile_keys(), 100);
        assert_eq!(store.memory_used(), store.memory_recount());
    }

    /// A snapshot keeps each key's deadline.
    #[test]
    fn a_snapshot_keeps_deadlines() {
        let store = Store::new(ShardId::SOLO, 4, 0).unwrap();
        let mut req = BatchRequest::new();
        put_ttl(&mut req, b"a", b"1", PutIf::Always, PutTtl::Until(Deadline::At(7_000)));
        req.push_put(b"b", b"2");
        run_at(&store, 1_000, &req);
        let data = store.export_all();
        let copy = Store::new(ShardId::SOLO, 4, 0).unwrap();
        assert_eq!(copy.import(&data), Ok(2));
        copy.end_replay();
        let mut ttl = BatchRequest::new();
        ttl.push(OpKind::Ttl, b"a", b"");
        ttl.push(OpKind::Ttl, b"b", b"");
        assert_eq!(
            run_at(&copy, 1_000, &ttl).0,
            [OpReply::Counted(7_000), OpReply::Counted(-1)]
        );
        assert_eq!(copy.memory_used(), copy.memory_recount());
    }
}

#[cfg(test)]
mod eviction_tests {
    use kvshared::expiry::Deadline;
    use kvshared::routing::ShardId;
    use kvshared::wire::{BatchRequest, OpReply};

    use super::tests_support::run_at;
    use super::*;
    use crate::store::{Eviction, MemoryLimit};

    fn limited(max_bytes: usize, eviction: Eviction) -> Store {
        Store::with_limit(ShardId::SOLO, 8, 0, Some(MemoryLimit { max_bytes, eviction })).unwrap()
    }

    /// Fills a store whose cap holds about 600 of these keys with 400 keys with deadlines
    /// `1_000_000 + i` (i = 0..400) and 200 without, then writes 400 more without.
    fn fill(store: &Store) -> Vec<OpReply<'static>> {
        let mut req = BatchRequest::new();
        for i in 0..400u64 {
            let put = PutWith {
                cond: PutIf::Always,
                ttl: PutTtl::Until(Deadline::At(1_000_000 + i)),
                value: &[1u8; 100],
            };
            req.push(OpKind::PutWith, format!("v{i}").as_bytes(), &put.encode());
        }
        for i in 0..600 {
            req.push_put(format!("p{i}").as_bytes(), &[1u8; 100]);
        }
        run_at(store, 1_000, &req).0
    }

    fn present(store: &Store, keys: impl Iterator<Item = String>) -> Vec<bool> {
        let mut req = BatchRequest::new();
        let keys: Vec<String> = keys.collect();
        for k in &keys {
            req.push_get(k.as_bytes());
        }
        run_at(store, 1_000, &req)
            .0
            .iter()
            .map(|r| matches!(r, OpReply::Found(_)))
            .collect()
    }

    /// volatile-* policies evict only keys with a time to live; once none is left, a write
    /// is refused (Redis's behaviour), and every key without one is still there.
    #[test]
    fn volatile_policies_evict_only_keys_with_a_deadline() {
        for policy in [Eviction::VolatileLru, Eviction::VolatileTtl, Eviction::VolatileRandom] {
            let store = limited(100 << 10, policy);
            let results = fill(&store);
            assert!(
                results.contains(&OpReply::OutOfMemory),
                "{policy:?}: the volatile keys ran out"
            );
            let stored_plain = (400..1000).filter(|&i| results[i] == OpReply::Stored).count();
            let plain = present(&store, (0..600).map(|i| format!("p{i}")));
            assert_eq!(
                plain.iter().filter(|p| **p).count(),
                stored_plain,
                "{policy:?} evicted a key without a deadline"
            );
            assert_eq!(store.memory_used(), store.memory_recount());
        }
    }

    /// volatile-ttl evicts the nearest deadlines first (of a sample): the survivors are
    /// mostly those with later deadlines. (One op per batch, as clients' writes come.)
    #[test]
    fn volatile_ttl_evicts_the_nearest_deadlines_first() {
        let store = limited(100 << 10, Eviction::VolatileTtl);
        for i in 0..780u64 {
            let mut req = BatchRequest::new();
            if i < 400 {
                let put = PutWith {
                    cond: PutIf::Always,
                    ttl: PutTtl::Until(Deadline::At(1_000_000 + i)),
                    value: &[1u8; 100],
                };
                req.push(OpKind::PutWith, format!("v{i}").as_bytes(), &put.encode());
            } else {
                req.push_put(format!("p{i}").as_bytes(), &[1u8; 100]);
            }
            run_at(&store, 1_000, &req);
        }
        let left = present(&store, (0..400).map(|i| format!("v{i}")));
        let (early, late) = (
            left[..200].iter().filter(|p| **p).count(),
            left[200..].iter().filter(|p| **p).count(),
        );
        assert!(late > early * 2, "early {early}, late {late}");
    }
}
