//! The node-wide ops (`Scan`, `KeyCount`, `Flush`: Redis's `SCAN`, `DBSIZE`, `FLUSHALL`)
//! and `Rename`, which moves a key within the node inside an atomic batch.
//!
//! A node-wide op is alone in its batch (a log entry's clock aside): it has no key to be
//! ordered by among other ops. A scan walks the map shards in order and each table in
//! scan-position order (see `kvshared::keyspace` and `Table::scan`); keys past their
//! deadline are left out, as a read would. A flush goes through the log on a durable node
//! and, replayed over a snapshot, clears only the map shards the snapshot copied before it.

use super::Ops;
use kvshared::keyspace::{MAX_SCAN_PAGE_BYTES, Rename, ScanRequest, encode_page};
use kvshared::routing::{key_hash, key_slot, map_shard};
use kvshared::stats::Counts;
use kvshared::wire::{BatchResponse, MalformedOp, NodeWide, OpKind, OpStatus};

use super::memory::Shard;
use super::table::Table;
use super::{Answers, ReplyRoom, Store};
use kvshared::pattern::Pattern;

/// Why a scan was refused.
type Refusal = MalformedOp;

/// A scan's page as op `first`'s answer (a read: counted as a get).
fn answer_page(
    page: Result<Vec<u8>, Refusal>,
    first: usize,
    out: &mut BatchResponse,
    room: &mut impl ReplyRoom,
    tally: &mut Counts,
) {
    tally.gets += 1;
    match page {
        Ok(page) if room.admit(page.len()) => {
            out.set_found(first, &page);
        }
        Ok(_) => out.set(first, OpStatus::TooLarge),
        Err(why) => {
            tally.malformed_op += 1;
            out.set_malformed(first, why);
        }
    }
}

impl Store {
    /// Runs `batch` if it holds a node-wide op: alone (after a log entry's clock) it runs;
    /// beside other ops it is answered `NotAlone` and they run as usual. True when the
    /// batch was run here.
    pub(super) fn run_node_wide(
        &self,
        batch: &impl Ops,
        out: &mut BatchResponse,
        room: &mut impl ReplyRoom,
        tally: &mut Counts,
        log_index: u64,
    ) -> bool {
        let first = usize::from(log_index > 0 && batch.op(0).is_ok_and(|op| op.kind == OpKind::Clock));
        let Ok(op) = batch.op(first) else { return false };
        let Some(wide) = op.kind.node_wide() else { return false };
        if batch.len() != first + 1 {
            return false;
        }
        if first == 1 {
            out.set(0, OpStatus::Stored);
        }
        match wide {
            NodeWide::Scan => {
                let clock = super::expiry::batch_clock(batch, log_index);
                answer_page(self.scan(op.key, op.value, clock), first, out, room, tally);
            }
            NodeWide::SlotScan => {
                let clock = super::expiry::batch_clock(batch, log_index);
                answer_page(self.slot_scan(op.value, clock), first, out, room, tally);
            }
            NodeWide::KeyCount => {
                tally.gets += 1;
                out.set_counted(first, self.len() as i64);
            }
            NodeWide::SlotSet => match self.set_slots(op.value, log_index, tally) {
                OpStatus::Malformed => {
                    tally.malformed_op += 1;
                    out.set_malformed(first, MalformedOp::BadKeyspace);
                }
                status => out.set(first, status),
            },
            // The slot table and its load are the cluster's metadata, read by clients as
            // they connect and by `kvd admin`: not counted as the users' gets.
            NodeWide::SlotMap => {
                let mut table = Vec::new();
                self.slot_table().encode(&mut table);
                out.set_found(first, &table);
            }
            NodeWide::SlotLoad => {
                out.set_found(first, &self.slot_load_bytes());
            }
            NodeWide::SlotTrack => {
                let clock = super::expiry::batch_clock(batch, log_index);
                match self.slot_track(op.value, clock) {
                    Ok(super::tracking::TrackAnswer::Done) => out.set(first, OpStatus::Stored),
                    Ok(super::tracking::TrackAnswer::Unknown) => out.set(first, OpStatus::NotFound),
                    Ok(super::tracking::TrackAnswer::Page(page)) if room.admit(page.len()) => {
                        out.set_found(first, &page);
                    }
                    Ok(super::tracking::TrackAnswer::Page(_)) => out.set(first, OpStatus::TooLarge),
                    Err(why) => {
                        tally.malformed_op += 1;
                        out.set_malformed(first, why);
                    }
                }
            }
            NodeWide::Flush => {
                tally.deletes += 1;
                self.flush_at(log_index);
                out.set(first, OpStatus::Stored);
            }
        }
        true
    }

    /// One scan op: a page (see `kvshared::keyspace::ScanPage`) from the request's cursor.
    fn scan(&self, pattern: &[u8], request: &[u8], clock: u64) -> Result<Vec<u8>, Refusal> {
        let req = ScanRequest::decode(request).ok_or(MalformedOp::BadKeyspace)?;
        let pattern = Pattern::new(pattern).map_err(|_| MalformedOp::BadKeyspace)?;
        let (mut map, mut from) = ((req.cursor >> 32) as usize, req.cursor as u32);
        if map >= self.map.shards.len() {
            return Err(MalformedOp::BadKeyspace);
        }
        let (mut keys, mut bytes, mut walked) = (Vec::new(), 0usize, 0usize);
        let want = req.count as usize;
        loop {
            let s = self.map.shards[map].read();
            let next = s.table.scan(from, want.saturating_sub(walked).max(1), |e| {
                walked += 1;
                let key = e.key();
                if !s.expires.is_due(key, clock) && pattern.matches(key) {
                    bytes += key.len() + 4;
                    keys.push(key.to_vec());
                }
            });
            drop(s);
            match u32::try_from(next) {
                Ok(at) => from = at,
                Err(_) => (map, from) = (map + 1, 0),
            }
            if map == self.map.shards.len() || walked >= want || bytes >= MAX_SCAN_PAGE_BYTES {
                break;
            }
        }
        let next = match map == self.map.shards.len() {
            true => 0,
            false => ((map as u64) << 32) | u64::from(from),
        };
        let mut page = Vec::with_capacity(8 + bytes);
        encode_page(next, keys.iter().map(Vec::as_slice), &mut page);
        Ok(page)
    }

    /// Redis's `CLUSTER COUNTKEYSINSLOT` and `GETKEYSINSLOT`: how many live keys of `slot`
    /// this node holds, and the first `limit` of them. A pass over every key (kvd keeps no
    /// index by slot), one map shard's read lock at a time.
    pub fn keys_in_slot(&self, slot: u16, limit: usize) -> (u64, Vec<Vec<u8>>) {
        let clock = kvshared::expiry::now_ms();
        let (mut count, mut keys) = (0u64, Vec::new());
        for shard in self.map.shards.iter() {
            let s = shard.read();
            for e in s.table.iter() {
                let key = e.key();
                if key_slot(key) == slot && !s.expires.is_due(key, clock) {
                    count += 1;
                    if keys.len() < limit {
                        keys.push(key.to_vec());
                    }
                }
            }
        }
        (count, keys)
    }

    /// Removes every key: each map shard gets a new, empty table. Applying a log entry
    /// (`log_index` > 0) over a snapshot, a map shard whose copy already holds the entry
    /// is left alone, and every shard remembers the entry.
    pub(super) fn flush_at(&self, log_index: u64) {
        let replay = self.gate.replay.read();
        for (i, shard) in self.map.shards.iter().enumerate() {
            if let Some(held) = replay.as_ref()
                && log_index > 0
                && held.get(i).is_some_and(|&h| log_index <= h)
            {
                continue;
            }
            let mut s = shard.write();
            self.memory.usage.give(s.bytes());
            let applied = s.applied.max(log_index);
            *s = Shard::new(Table::new(), 0x9e37_79b9_7f4a_7c15 ^ i as u64);
            s.applied = applied;
            self.map.hints[i].publish(&s.table);
        }
    }

    /// The map shards a rename in an atomic batch needs besides its key's: its target's.
    pub(super) fn rename_target_shard(&self, value: &[u8]) -> Result<usize, Refusal> {
        let r = Rename::decode(value).ok_or(MalformedOp::BadKeyspace)?;
        let hash = key_hash(r.to);
        if !self.serves(OpKind::Put, r.to) {
            return Err(MalformedOp::BadKeyspace);
        }
        Ok(map_shard(hash, self.map.shards.len()))
    }

    /// Op `i`, a rename of `key` (in map shard `from`, locked as `src`) to the target in
    /// `to` (locked as `dst`, or `None` when it is the same shard): the value and deadline
    /// move; the target's old value and deadline go. The target is written before the key
    /// goes, so a put refused for memory changes nothing.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn rename(
        &self,
        (from, src): (usize, &mut Shard),
        dst: Option<(usize, &mut Shard)>,
        key: &[u8],
        value: &[u8],
        i: usize,
        ans: &mut Answers<'_, impl ReplyRoom>,
    ) {
        let Some(r) = Rename::decode(value) else {
            return ans.out.set_malformed(i, MalformedOp::BadKeyspace);
        };
        let (hash, to_hash) = (key_hash(key), key_hash(r.to));
        self.expire_if_due(src, hash, key, ans);
        let Some(entry) = src.table.find(hash, key).and_then(|at| src.table.at(at)) else {
            return ans.out.set(i, OpStatus::NotFound);
        };
        let (moved, deadline) = (entry.value().to_vec(), src.expires.get(key));
        ans.tally.puts += 1;
        let (to, t) = match dst {
            Some((to, d)) => (to, d),
            None => (from, &mut *src),
        };
        self.expire_if_due(t, to_hash, r.to, ans);
        let exists = t.table.find(to_hash, r.to).is_some();
        if (r.nx && exists) || (key == r.to) {
            return ans
                .out
                .set(i, if r.nx { OpStatus::NotStored } else { OpStatus::Stored });
        }
        if !self.put(to, t, to_hash, r.to, &moved, ans) {
            ans.tally.out_of_memory += 1;
            return ans.out.set(i, OpStatus::OutOfMemory);
        }
        self.set_deadline(t, r.to, deadline);
        self.set_deadline(src, key, None);
        self.remove_key(src, hash, key);
        ans.out.set(i, OpStatus::Stored);
    }
}

#[cfg(test)]
mod tests {
    use std::collections::{BTreeMap, BTreeSet};

    use kvshared::expiry::{Deadline, Expire, ExpireIf};
    use kvshared::keyspace::ScanPage;
    use kvshared::routing::ShardId;
    use kvshared::wire::{BatchRequest, OpReply};
    use proptest::prelude::*;

    use super::*;
    use crate::store::expiry::tests_support::run_at;

    fn one(store: &Store, kind: OpKind, key: &[u8], value: &[u8]) -> OpReply<'static> {
        let mut req = BatchRequest::new();
        req.push(kind, key, value);
        run_at(store, 0, &req).0[0]
    }

    fn put(store: &Store, key: &str) {
        assert_eq!(one(store, OpKind::Put, key.as_bytes(), b"v"), OpReply::Stored);
    }

    /// One scan op: its keys and the next cursor.
    fn page(store: &Store, cursor: u64, count: u32, pattern: &str) -> (u64, Vec<String>) {
        let req = ScanRequest { cursor, count }.encode();
        match one(store, OpKind::Scan, pattern.as_bytes(), &req) {
            OpReply::Found(bytes) => {
                let page = ScanPage::decode(bytes).unwrap();
                let keys = page.keys.iter().map(|k| String::from_utf8_lossy(k).into_owned());
                (page.next, keys.collect())
            }
            other => panic!("scan answered {other:?}"),
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(48))]
        /// Redis's guarantee, and more: a key present for the whole scan is returned exactly
        /// once, while other keys come and go between pages and the tables grow.
        #[test]
        fn a_key_present_throughout_is_returned_once(
            stay in 0usize..300,
            churn in proptest::collection::vec((0usize..2000, any::<bool>()), 0..400),
            counts in proptest::collection::vec(1u32..40, 1..20),
            map_shards in 1usize..6,
        ) {
            let store = Store::new(ShardId::SOLO, map_shards, 0).unwrap();
            for i in 0..stay {
                put(&store, &format!("stay{i}"));
            }
            let mut seen: BTreeMap<String, usize> = BTreeMap::new();
            let (mut cursor, mut step, mut churned) = (0u64, 0usize, churn.iter());
            loop {
                let (next, keys) = page(&store, cursor, counts[step % counts.len()], "");
                for k in keys {
                    *seen.entry(k).or_default() += 1;
                }
                for &(k, add) in churned.by_ref().take(40) {
                    match add {
                        true => put(&store, &format!("churn{k}")),
                        false => { one(&store, OpKind::Delete, format!("churn{k}").as_bytes(), b""); }
                    }
                }
                step += 1;
                prop_assert!(step < 100_000, "the scan never ends");
                if next == 0 {
                    break;
                }
                prop_assert!(next > cursor, "the cursor goes forward");
                cursor = next;
            }
            for i in 0..stay {
                prop_assert_eq!(seen.get(&format!("stay{i}")).copied(), Some(1), "stay{}", i);
            }
            prop_assert!(seen.values().all(|&n| n == 1), "no key twice");
        }
    }

    /// MATCH filters, expired keys are left out, a bad cursor or pattern is malformed, and
    /// a key count and a flush cover the node.
    #[test]
    fn match_expiry_count_and_flush() {
        let store = Store::new(ShardId::SOLO, 4, 0).unwrap();
        for i in 0..50 {
            put(&store, &format!("user:{i}"));
            put(&store, &format!("item:{i}"));
        }
        let past = Expire {
            cond: ExpireIf::Always,
            deadline: Deadline::At(1),
        }
        .encode();
        assert_eq!(one(&store, OpKind::Expire, b"user:7", &past), OpReply::Stored);
        let (mut cursor, mut users) = (0, BTreeSet::new());
        loop {
            let (next, keys) = page(&store, cursor, 10, "user:*");
            users.extend(keys);
            if next == 0 {
                break;
            }
            cursor = next;
        }
        assert_eq!(users.len(), 49);
        assert!(users.iter().all(|k| k.starts_with("user:")) && !users.contains("user:7"));
        let bad = ScanRequest {
            cursor: 99 << 32,
            count: 10,
        }
        .encode();
        assert!(matches!(one(&store, OpKind::Scan, b"", &bad), OpReply::Malformed(_)));
        assert!(matches!(
            one(&store, OpKind::Scan, b"", b"short"),
            OpReply::Malformed(_)
        ));
        assert_eq!(one(&store, OpKind::KeyCount, b"", b""), OpReply::Counted(99));
        let mut mixed = BatchRequest::new();
        mixed.push(OpKind::Flush, b"", b"");
        mixed.push(OpKind::Get, b"user:1", b"");
        let (r, _) = run_at(&store, 0, &mixed);
        assert!(matches!(r[0], OpReply::Malformed(_)), "a flush beside another op");
        assert_eq!(r[1], OpReply::Found(b"v"));
        assert_eq!(one(&store, OpKind::Flush, b"", b""), OpReply::Stored);
        assert_eq!(store.len(), 0);
        assert_eq!(store.memory_used(), store.memory_recount());
    }

    fn rename(store: &Store, from: &str, to: &str, nx: bool) -> OpReply<'static> {
        let mut req = BatchRequest::new();
        req.push(OpKind::Atomic, b"", b"");
        let r = Rename { to: to.as_bytes(), nx };
        req.push(OpKind::Rename, from.as_bytes(), &r.encode());
        run_at(store, 0, &req).0[1]
    }

    /// A rename moves the value and the deadline, across map shards or within one; NX
    /// keeps an existing target; a missing key is NotFound; outside a transaction or to
    /// another node's key it is refused.
    #[test]
    fn rename_moves_value_and_deadline() {
        let store = Store::new(ShardId { index: 0, count: 2 }, 8, 0).unwrap();
        let me = ShardId { index: 0, count: 2 };
        let mine: Vec<String> = (0..)
            .map(|i| format!("k{i}"))
            .filter(|k| me.owns(key_slot(k.as_bytes())))
            .take(20)
            .collect();
        let other = (0..)
            .map(|i| format!("o{i}"))
            .find(|k| !me.owns(key_slot(k.as_bytes())))
            .unwrap();
        let at = kvshared::expiry::now_ms() + 100_000;
        let later = Expire {
            cond: ExpireIf::Always,
            deadline: Deadline::At(at),
        }
        .encode();
        put(&store, &mine[0]);
        assert_eq!(one(&store, OpKind::Expire, mine[0].as_bytes(), &later), OpReply::Stored);
        for to in &mine[1..] {
            let from = &mine[0];
            assert_eq!(rename(&store, from, to, false), OpReply::Stored);
            assert_eq!(one(&store, OpKind::Get, from.as_bytes(), b""), OpReply::NotFound);
            assert_eq!(one(&store, OpKind::Get, to.as_bytes(), b""), OpReply::Found(b"v"));
            assert!(matches!(one(&store, OpKind::Ttl, to.as_bytes(), b""), OpReply::Counted(t) if t == at as i64));
            assert_eq!(rename(&store, to, from, false), OpReply::Stored);
        }
        put(&store, &mine[1]);
        assert_eq!(rename(&store, &mine[0], &mine[1], true), OpReply::NotStored);
        assert_eq!(rename(&store, &mine[0], &mine[0], false), OpReply::Stored);
        assert_eq!(rename(&store, &mine[5], &mine[2], false), OpReply::NotFound);
        assert!(matches!(rename(&store, &mine[0], &other, false), OpReply::Malformed(_)));
        let r = Rename { to: b"x", nx: false }.encode();
        assert!(matches!(
            one(&store, OpKind::Rename, mine[0].as_bytes(), &r),
            OpReply::Malformed(_)
        ));
        assert_eq!(store.len(), 2);
        assert_eq!(store.memory_used(), store.memory_recount());
    }
}

/// Any op of any kind, with any key and value bytes, in any batch (a transaction or not,
/// a client's or a log entry's): answered, never a panic, and the memory accounts stay true.
#[cfg(test)]
mod any_ops {
    use kvshared::keyspace::{Rename, ScanRequest};
    use kvshared::routing::ShardId;
    use kvshared::wire::BatchRequest;
    use proptest::prelude::*;

    use super::*;
    use crate::store::expiry::tests_support::run_at;

    fn value() -> impl Strategy<Value = Vec<u8>> {
        prop_oneof![
            proptest::collection::vec(any::<u8>(), 0..24),
            (any::<u64>(), 0u32..50).prop_map(|(cursor, count)| ScanRequest { cursor, count }.encode().to_vec()),
            (0u8..6, any::<bool>()).prop_map(|(k, nx)| Rename { to: &[b'k', k], nx }.encode()),
            any::<i64>().prop_map(|n| n.to_le_bytes().to_vec()),
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(256))]
        #[test]
        fn any_ops_are_answered_and_accounts_stay_true(
            batches in proptest::collection::vec(
                (proptest::collection::vec((0..OpKind::ALL.len(), 0u8..6, value()), 1..8), 0u64..3),
                1..12,
            ),
        ) {
            let store = Store::new(ShardId::SOLO, 4, 0).unwrap();
            for (ops, clock) in batches {
                let mut req = BatchRequest::new();
                for (kind, key, value) in &ops {
                    req.push(OpKind::ALL[*kind], &[b'k', *key], value);
                }
                let (results, _) = run_at(&store, clock * 1_000, &req);
                prop_assert_eq!(results.len(), ops.len());
                prop_assert_eq!(store.memory_used(), store.memory_recount());
            }
        }
    }
}
