//! The store's contents as bytes, for snapshots:
//!
//! `[u32::MAX][slot table: last change's log entry u64, 16,384 entries u64][map shards u32]`,
//! then per map shard `[last log entry it holds u64][bytes of its pairs
//! u64][pairs]`, each pair `[key length u32][value length u32][key][value]` (little-endian);
//! a key with a time to live has [`HAS_DEADLINE`] set in its value length and its deadline
//! (Unix milliseconds, u64) after its value. (Snapshots from before expiry have no such
//! pair and read as they did; a kvd from before expiry refuses one that has.)
//!
//! Written one map shard at a time by `export`, so that a snapshot never holds more than
//! one shard's lock, and that for a step of a few hundred entries (it is fuzzy: later
//! entries go on being applied meanwhile), and read back with every length checked against
//! the bytes before use (a snapshot file is untrusted input). The per-shard entry makes the
//! fuzzy snapshot exact: replaying the log after it skips, for each key, the entries its
//! shard's copy already holds, which matters because a conditional put (`SET NX`/`XX`)
//! applied twice can end differently than once.

use kvshared::routing::{key_hash, key_slot, map_shard};
use kvshared::stats::Counts;
use kvshared::wire::BatchResponse;

use super::{Answers, Store, Table, Unbounded};

/// Bytes of a pair's header.
const PAIR_HEADER: usize = 8;
/// Set in a pair's value length when its deadline follows its value (values are at most
/// 512 MiB, so the bit is free).
pub(super) const HAS_DEADLINE: u32 = 1 << 31;
/// In place of a map shard count: the slot table follows, then the count (snapshots from
/// before slot maps begin with the count, at most 2^20).
pub(super) const SLOT_TABLE_FOLLOWS: u32 = u32::MAX;
/// Bytes of a map shard's header.
pub(super) const SHARD_HEADER: usize = 16;

/// Why an export (a snapshot's data: an untrusted file) was refused, saying where.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ImportError {
    /// Shorter than the map shard count.
    #[error("the data is shorter than its header")]
    ShortHeader,
    /// A map shard count no kvd writes.
    #[error("the data says {0} map shards")]
    ShardCount(usize),
    /// Bytes after the last map shard's pairs.
    #[error("{0} bytes after the last map shard")]
    Trailing(usize),
    /// The slot table before the shards, and why.
    #[error("the slot table: {0}")]
    SlotTable(String),
    /// A map shard's header.
    #[error("map shard {shard}: {why}")]
    Section { shard: usize, why: SectionFault },
    /// A pair of a map shard.
    #[error("map shard {shard}: pair {pair} at byte {at}: {why}")]
    Pair {
        shard: usize,
        pair: u64,
        at: usize,
        why: PairFault,
    },
}

/// What is wrong with a map shard's header.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum SectionFault {
    #[error("header cut short")]
    HeaderCut,
    #[error("pairs length too large")]
    TooLong,
    #[error("pairs run past the end")]
    PastEnd,
}

/// What is wrong with a pair.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PairFault {
    #[error("header cut short")]
    HeaderCut,
    #[error("key runs past the end")]
    KeyPastEnd,
    #[error("value runs past the end")]
    ValuePastEnd,
    #[error("deadline runs past the end")]
    DeadlinePastEnd,
    #[error("empty key")]
    EmptyKey,
    /// A key of a slot this node has handed over.
    #[error("a key of a slot shard {0} does not hold")]
    NotOwned(kvshared::routing::ShardId),
    #[error("no room for it (--max-memory, or the machine's memory)")]
    NoRoom,
}

/// A pair's fault and where it is in its section.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Fault {
    pair: u64,
    at: usize,
    why: PairFault,
}

impl Fault {
    fn in_shard(self, shard: usize) -> ImportError {
        ImportError::Pair {
            shard,
            pair: self.pair,
            at: self.at,
            why: self.why,
        }
    }
}

impl Store {
    /// Replaces the store's contents with an export (a snapshot's data); returns how many
    /// pairs. Until [`Store::end_replay`], log entries applied with an index the snapshot's
    /// copy of their key's map shard already holds are skipped. Refuses data that does not
    /// parse, a key this node does not own, or pairs that do not fit under `--max-memory`,
    /// saying which pair.
    pub fn import(&self, data: &[u8]) -> Result<u64, ImportError> {
        self.flush();
        let mut data = data;
        match data.split_first_chunk::<4>() {
            Some((magic, rest)) if u32::from_le_bytes(*magic) == SLOT_TABLE_FOLLOWS => {
                let took = self.import_slots(rest)?;
                data = &rest[took..];
            }
            // From before slot maps: the even split of --shard.
            _ => self.reset_slots(),
        }
        let (count, rest) = data.split_first_chunk::<4>().ok_or(ImportError::ShortHeader)?;
        let count = u32::from_le_bytes(*count) as usize;
        if count == 0 || count > 1 << 20 {
            return Err(ImportError::ShardCount(count));
        }
        let sections = sections(rest, count)?;
        let total = sections.iter().try_fold(0usize, |n, (shard, _, section)| {
            let mut pairs = 0usize;
            for pair in Pairs::new(section) {
                pair.map_err(|e| e.in_shard(*shard))?;
                pairs += 1;
            }
            Ok::<_, ImportError>(n + pairs)
        })?;
        self.reserve_for_import(total);
        let mut held = Vec::with_capacity(sections.len());
        let mut pairs = 0u64;
        for (shard, applied, section) in sections {
            pairs += self.import_pairs(section).map_err(|e| e.in_shard(shard))?;
            held.push(applied);
        }
        *self.gate.replay.write() = Some(held);
        Ok(pairs)
    }

    /// Gives every (empty) map shard's table room for its share of `pairs` entries before
    /// an import fills it. An export lists each table's pairs in slot order, which is hash
    /// order; inserted in that order into a table that grows as it goes, a linear probe's
    /// early keys all have homes in the first sliver of the slots and pile into one long
    /// run (a million pairs took 17 s instead of 0.4 s: a follower's snapshot install,
    /// REPLICATION.md). The table's own early growth (`Table::must_grow`) bounds that
    /// for every path; an import knows its count, so it sizes each table once instead of
    /// growing it step by step. Under `--max-memory`, a reservation past the cap is not made.
    fn reserve_for_import(&self, pairs: usize) {
        let per_shard = pairs / self.map.shards.len();
        let per_shard = per_shard + per_shard / 16 + 16;
        for (i, shard) in self.map.shards.iter().enumerate() {
            let mut s = shard.write();
            let grow = Table::bytes_for(per_shard).saturating_sub(s.table.allocation_size());
            let over_cap = self
                .memory
                .usage
                .limit()
                .is_some_and(|l| self.memory.usage.used().saturating_add(grow) > l.max_bytes);
            if grow == 0 || s.table.len() > 0 || over_cap {
                continue;
            }
            if let Ok(table) = Table::with_capacity(per_shard) {
                self.memory.usage.add(grow);
                s.table = table;
                self.map.hints[i].publish(&s.table);
            }
        }
    }

    /// The log replay after a snapshot is over: entries are applied as they come.
    pub fn end_replay(&self) {
        *self.gate.replay.write() = None;
    }

    fn import_pairs(&self, data: &[u8]) -> Result<u64, Fault> {
        let mut out = BatchResponse::default();
        let mut tally = Counts::default();
        let mut ans = Answers {
            out: &mut out,
            room: &mut Unbounded,
            tally: &mut tally,
            now: self.now(),
            clock: 0,
            log_index: 0,
            slot_changes: self.own.slots.changes(),
        };
        let mut pairs = 0u64;
        for pair in Pairs::new(data) {
            let Pair {
                key,
                value,
                deadline,
                at,
            } = pair?;
            let bad = |why| Fault { pair: pairs, at, why };
            let hash = key_hash(key);
            if self.own.slots.get(key_slot(key)).state == kvshared::slots::SlotState::Gone {
                return Err(bad(PairFault::NotOwned(self.own.me)));
            }
            let shard = map_shard(hash, self.map.shards.len());
            let mut s = self.map.shards[shard].write();
            if !self.put(shard, &mut s, hash, key, value, &mut ans) {
                return Err(bad(PairFault::NoRoom));
            }
            if deadline.is_some() {
                self.set_deadline(&mut s, key, deadline);
            }
            drop(s);
            pairs += 1;
        }
        Ok(pairs)
    }
}

/// A map shard's section of an export: its index, the entry it was copied at, its pairs.
type Section<'a> = (usize, u64, &'a [u8]);

/// An export's map-shard sections, every length checked.
fn sections(mut rest: &[u8], count: usize) -> Result<Vec<Section<'_>>, ImportError> {
    let mut out = Vec::with_capacity(count.min(rest.len() / SHARD_HEADER + 1));
    for shard in 0..count {
        let bad = |why| ImportError::Section { shard, why };
        let (header, body) = rest
            .split_first_chunk::<SHARD_HEADER>()
            .ok_or_else(|| bad(SectionFault::HeaderCut))?;
        let applied = u64::from_le_bytes(header[..8].try_into().unwrap_or_default());
        let len = u64::from_le_bytes(header[8..].try_into().unwrap_or_default());
        let len = usize::try_from(len).map_err(|_| bad(SectionFault::TooLong))?;
        let section = body.get(..len).ok_or_else(|| bad(SectionFault::PastEnd))?;
        out.push((shard, applied, section));
        rest = body.get(len..).unwrap_or_default();
    }
    if !rest.is_empty() {
        return Err(ImportError::Trailing(rest.len()));
    }
    Ok(out)
}

/// One pair of an export section.
struct Pair<'a> {
    key: &'a [u8],
    value: &'a [u8],
    deadline: Option<u64>,
    /// Where its header starts in the section.
    at: usize,
}

/// The pairs of an export section in order; every length is checked against the data.
struct Pairs<'a> {
    data: &'a [u8],
    rest: &'a [u8],
    count: u64,
}

impl<'a> Pairs<'a> {
    fn new(data: &'a [u8]) -> Pairs<'a> {
        Pairs {
            data,
            rest: data,
            count: 0,
        }
    }

    fn parse(&self) -> Result<(Pair<'a>, usize), Fault> {
        let (rest, pairs) = (self.rest, self.count);
        let at = self.data.len() - rest.len();
        let bad = |why| Fault { pair: pairs, at, why };
        let (header, body) = rest
            .split_first_chunk::<PAIR_HEADER>()
            .ok_or_else(|| bad(PairFault::HeaderCut))?;
        let key_len = u32::from_le_bytes([header[0], header[1], header[2], header[3]]) as usize;
        let value_len = u32::from_le_bytes([header[4], header[5], header[6], header[7]]);
        let has_deadline = value_len & HAS_DEADLINE != 0;
        let value_len = (value_len & !HAS_DEADLINE) as usize;
        let key = body.get(..key_len).ok_or_else(|| bad(PairFault::KeyPastEnd))?;
        let value = body
            .get(key_len..key_len + value_len)
            .ok_or_else(|| bad(PairFault::ValuePastEnd))?;
        let mut pair_len = key_len + value_len;
        let deadline = if has_deadline {
            let at = body
                .get(pair_len..pair_len + 8)
                .and_then(|b| <[u8; 8]>::try_from(b).ok())
                .ok_or_else(|| bad(PairFault::DeadlinePastEnd))?;
            pair_len += 8;
            Some(u64::from_le_bytes(at))
        } else {
            None
        };
        if key.is_empty() {
            return Err(bad(PairFault::EmptyKey));
        }
        Ok((
            Pair {
                key,
                value,
                deadline,
                at,
            },
            PAIR_HEADER + pair_len,
        ))
    }
}

impl<'a> Iterator for Pairs<'a> {
    type Item = Result<Pair<'a>, Fault>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.rest.is_empty() {
            return None;
        }
        match self.parse() {
            Ok((pair, len)) => {
                self.rest = self.rest.get(len..).unwrap_or_default();
                self.count += 1;
                Some(Ok(pair))
            }
            Err(e) => {
                self.rest = &[];
                Some(Err(e))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::Exported;
    use kvshared::routing::ShardId;
    use kvshared::wire::OpKind;
    use proptest::prelude::*;

    /// An export of one map shard holding `pairs`.
    fn one_shard(pairs: &[(Vec<u8>, Vec<u8>)]) -> Vec<u8> {
        let mut body = Vec::new();
        for (k, v) in pairs {
            body.extend_from_slice(&(k.len() as u32).to_le_bytes());
            body.extend_from_slice(&(v.len() as u32).to_le_bytes());
            body.extend_from_slice(k);
            body.extend_from_slice(v);
        }
        let mut buf = 1u32.to_le_bytes().to_vec();
        buf.extend_from_slice(&0u64.to_le_bytes());
        buf.extend_from_slice(&(body.len() as u64).to_le_bytes());
        buf.extend_from_slice(&body);
        buf
    }

    fn store_with(pairs: &[(Vec<u8>, Vec<u8>)]) -> Store {
        let store = Store::new(ShardId::SOLO, 4, 0).unwrap();
        store.import(&one_shard(pairs)).unwrap();
        store
    }

    /// An import sizes each empty table once for its share of the pairs, so the pairs,
    /// which come in slot (hash) order, never pile into the first slots of a small table
    /// that grows as they arrive.
    #[test]
    fn an_import_sizes_each_table_before_filling_it() {
        let pairs: Vec<_> = (0..20_000)
            .map(|i| (format!("user{i}").into_bytes(), vec![7u8; 16]))
            .collect();
        let source = store_with(&pairs);
        let store = Store::new(ShardId::SOLO, 4, 0).unwrap();
        assert_eq!(store.import(&export(&source)).unwrap(), 20_000);
        let per_shard = 20_000 / 4;
        let reserved = Table::bytes_for(per_shard + per_shard / 16 + 16);
        for shard in store.map.shards.iter() {
            let s = shard.read();
            assert!(s.table.len() > 0);
            assert_eq!(s.table.allocation_size(), reserved, "a table grew during the import");
        }
        assert_eq!(store.memory_recount() as usize, store.memory.usage.used());
    }

    fn export(store: &Store) -> Vec<u8> {
        store.export_all()
    }

    /// Every pair of an export, sorted.
    fn pairs_of(bytes: &[u8]) -> Vec<(Vec<u8>, Vec<u8>)> {
        // After the slot table.
        let bytes = &bytes[4 + 8 + kvshared::slots::ENCODED_LEN..];
        let count = u32::from_le_bytes(bytes[..4].try_into().unwrap()) as usize;
        let mut rest = &bytes[4..];
        let mut found = Vec::new();
        for _ in 0..count {
            let len = u64::from_le_bytes(rest[8..16].try_into().unwrap()) as usize;
            let mut section = &rest[16..16 + len];
            while let Some((h, body)) = section.split_first_chunk::<8>() {
                let k = u32::from_le_bytes([h[0], h[1], h[2], h[3]]) as usize;
                let v = u32::from_le_bytes([h[4], h[5], h[6], h[7]]) as usize;
                found.push((body[..k].to_vec(), body[k..k + v].to_vec()));
                section = &body[k + v..];
            }
            rest = &rest[16 + len..];
        }
        found.sort();
        found
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]

        /// Export then import gives the same store; any cut or damage is refused or
        /// yields pairs that were in the data (never a panic).
        #[test]
        fn pairs_round_trip_and_bad_bytes_are_refused(
            map in prop::collection::btree_map(prop::collection::vec(any::<u8>(), 1..12), prop::collection::vec(any::<u8>(), 0..40), 0..60),
            cut in any::<prop::sample::Index>(),
            flip in any::<prop::sample::Index>(),
        ) {
            let pairs: Vec<_> = map.into_iter().collect();
            let store = store_with(&pairs);
            prop_assert_eq!(store.len(), pairs.len() as u64);
            let bytes = export(&store);
            let again = Store::new(ShardId::SOLO, 8, 0).unwrap();
            prop_assert_eq!(again.import(&bytes).unwrap(), pairs.len() as u64);
            prop_assert_eq!(&pairs_of(&export(&again)), &pairs);
            if !bytes.is_empty() {
                let short = &bytes[..cut.index(bytes.len())];
                let _ = Store::new(ShardId::SOLO, 8, 0).unwrap().import(short);
                let mut damaged = bytes.clone();
                damaged[flip.index(bytes.len())] ^= 0x80;
                let _ = Store::new(ShardId::SOLO, 8, 0).unwrap().import(&damaged);
            }
        }
    }

    /// Applies one op as log entry `index` and returns the key's value afterwards.
    fn apply(store: &Store, index: u64, kind: OpKind, key: &[u8], value: &[u8]) -> Option<Vec<u8>> {
        use kvshared::frame::{AlignedVec, FrameKind, HEADER_LEN};
        use kvshared::wire::{BatchRequest, BatchView, OpReply, encode_frame};
        let run = |req: &BatchRequest, log_index: u64| {
            let mut frame = AlignedVec::new();
            encode_frame(FrameKind::BatchRequest, 1, req, &mut frame).unwrap();
            let mut body: AlignedVec = AlignedVec::new();
            body.extend_from_slice(&frame[HEADER_LEN..]);
            let mut out = BatchResponse::default();
            let mut scratch = crate::store::Scratch {
                log_index,
                ..Default::default()
            };
            let view = BatchView::parse(&body).unwrap();
            store.execute(&view, &mut out, &mut Unbounded, &mut scratch, &mut Counts::default());
            match out.result(0) {
                OpReply::Found(v) => Some(v.to_vec()),
                _ => None,
            }
        };
        let mut write = BatchRequest::new();
        write.push(kind, key, value);
        run(&write, index);
        let mut read = BatchRequest::new();
        read.push_get(key);
        run(&read, 0)
    }

    /// One log entry of the test below.
    enum Entry {
        Op(OpKind, Vec<u8>, Vec<u8>),
        Flush,
    }

    fn apply_entry(store: &Store, index: u64, entry: &Entry) {
        match entry {
            Entry::Op(kind, key, value) => {
                apply(store, index, *kind, key, value);
            }
            Entry::Flush => store.flush_at(index),
        }
    }

    /// Copies a store of `preload` keys (room for `room`) in steps, applying 30 entries on
    /// keys `0..keys` between steps (overwrites, deletes, appends, conditional puts; once a
    /// flush after step `flush_after`), then restores the copy, replays the whole log and
    /// checks it gives the store the log gave. Returns the steps taken.
    fn copy_under_writes(room: usize, preload: u64, keys: u64, flush_after: Option<usize>, seed: u64) -> usize {
        let store = Store::new(ShardId::SOLO, 2, room).unwrap();
        let key = |k: u64| format!("key{k}").into_bytes();
        let mut log: Vec<Entry> = (0..preload)
            .map(|k| Entry::Op(OpKind::Put, key(k), b"v0".to_vec()))
            .collect();
        for (i, e) in log.iter().enumerate() {
            apply_entry(&store, i as u64 + 1, e);
        }
        let (mut rng, mut steps) = (seed | 1, 0);
        let mut between = || {
            steps += 1;
            let first = log.len();
            for n in 0..30u64 {
                rng ^= rng << 13;
                rng ^= rng >> 7;
                rng ^= rng << 17;
                let kind = [OpKind::Put, OpKind::Delete, OpKind::Append, OpKind::PutIfAbsent][(rng >> 40) as usize % 4];
                log.push(Entry::Op(kind, key(rng % keys), format!("s{steps}n{n}").into_bytes()));
            }
            if flush_after == Some(steps) {
                log.push(Entry::Flush);
            }
            for (i, e) in log.iter().enumerate().skip(first) {
                apply_entry(&store, i as u64 + 1, e);
            }
        };
        let mut bytes = Vec::new();
        let written = store.export_into(true, &mut between, &mut |b| {
            bytes.extend_from_slice(b);
            Ok::<(), ()>(())
        });
        let Ok(Exported::Done(counted)) = written else {
            panic!("seed {seed}: {written:?}")
        };

        let recovered = Store::new(ShardId::SOLO, 2, room).unwrap();
        // The pairs counted as they were written (stepped copies dropped, last copies
        // added) are the pairs the snapshot holds.
        assert_eq!(recovered.import(&bytes).unwrap(), counted, "seed {seed}");
        for (i, e) in log.iter().enumerate() {
            apply_entry(&recovered, i as u64 + 1, e);
        }
        recovered.end_replay();
        let (got, want) = (pairs_of(&export(&recovered)), pairs_of(&export(&store)));
        let wrong = want.iter().filter(|p| !got.contains(p)).count();
        assert!(
            got == want,
            "seed {seed}: {wrong} of {} pairs differ after the replay",
            want.len()
        );
        steps
    }

    /// A map shard copied in steps while entries are applied between the steps holds each
    /// key as of the shard's recorded entry: the snapshot plus a replay of the whole log
    /// gives the store the log gave. Nearly full tables (long probes, so deletes shift
    /// keys back across a step's edge), a flush, and a table that grows during the copy
    /// (then copied whole) included.
    #[test]
    fn a_copy_in_steps_under_writes_restores_exactly_what_the_log_gives() {
        for seed in 0..12 {
            // ~73% full, never grows: steps to the end.
            let steps = copy_under_writes(4000, 4000, 4000, None, 0x2545_f491_4f6c_dd1d ^ seed);
            assert!(steps >= 10, "the copy went in {steps} steps");
        }
        // A flush after step 3 replaces the shards: the rest is copied whole.
        assert_eq!(copy_under_writes(10_000, 1500, 2500, Some(3), 7), 3);
        // The table grows during the copy: copied whole.
        assert!(copy_under_writes(0, 1500, 2500, None, 9) >= 2);
    }

    /// Applies `ops` as one atomic batch (Redis's `MULTI`/`EXEC`), log entry `index`.
    fn apply_atomic(store: &Store, index: u64, ops: &[(&[u8], &[u8])]) {
        use kvshared::frame::{AlignedVec, FrameKind, HEADER_LEN};
        use kvshared::wire::{BatchRequest, BatchView, encode_frame};
        let mut req = BatchRequest::new();
        req.push(OpKind::Atomic, b"", b"");
        for (k, v) in ops {
            req.push(OpKind::Put, k, v);
        }
        let mut frame = AlignedVec::new();
        encode_frame(FrameKind::BatchRequest, 1, &req, &mut frame).unwrap();
        let mut body: AlignedVec = AlignedVec::new();
        body.extend_from_slice(&frame[HEADER_LEN..]);
        let mut scratch = crate::store::Scratch {
            log_index: index,
            ..Default::default()
        };
        let view = BatchView::parse(&body).unwrap();
        let mut out = BatchResponse::default();
        store.execute(&view, &mut out, &mut Unbounded, &mut scratch, &mut Counts::default());
    }

    /// An export that does not hold the transaction gate throughout is thrown away when a
    /// transaction was applied during it (its shards may lie on both sides of the copy);
    /// one that holds it is not, and either way a finished export plus the replay gives
    /// the store the log gave.
    #[test]
    fn an_export_without_the_gate_is_redone_when_a_transaction_comes_in_its_way() {
        let store = Store::new(ShardId::SOLO, 2, 4000).unwrap();
        let key = |k: u64| format!("key{k}").into_bytes();
        for k in 0..2000 {
            apply(&store, k + 1, OpKind::Put, &key(k), b"v0");
        }
        let export_with = |hold_gate: bool, transaction_at: Option<u64>| {
            let (mut bytes, mut steps) = (Vec::new(), 0);
            let mut between = || {
                steps += 1;
                if steps == 2
                    && let Some(index) = transaction_at
                {
                    // Two keys of different map shards, one copied already, one not.
                    apply_atomic(&store, index, &[(b"key1", b"t"), (b"key2", b"t"), (b"key3", b"t")]);
                }
            };
            let mut write = |b: &[u8]| -> Result<(), ()> {
                bytes.extend_from_slice(b);
                Ok(())
            };
            let exported = store.export_into(hold_gate, &mut between, &mut write).unwrap();
            (exported, bytes)
        };
        assert!(matches!(export_with(false, None).0, Exported::Done(2000)));
        assert_eq!(export_with(false, Some(2001)).0, Exported::Interrupted);
        // A slot change (it drops keys in every map shard) comes in the way the same.
        let mut steps = 0;
        let mut between = || {
            steps += 1;
            if steps == 2 {
                let freeze = kvshared::slots::SlotChange {
                    ranges: vec![[5, 9]],
                    to: kvshared::slots::SlotState::Frozen,
                    owner: 0,
                    epoch: 0,
                };
                store.set_slots(&freeze.encode(), 0, &mut Counts::default());
            }
        };
        let exported = store.export_into(false, &mut between, &mut |_| Ok::<(), ()>(()));
        assert_eq!(exported, Ok(Exported::Interrupted));
        // With the gate held the transaction waits for the copy's end: run it on another
        // thread, which the copy does not wait for.
        let (exported, bytes) = std::thread::scope(|scope| {
            let (tx, rx) = std::sync::mpsc::channel::<()>();
            let store = &store;
            let copy = scope.spawn(move || {
                let (mut bytes, mut steps) = (Vec::new(), 0);
                let mut between = || {
                    steps += 1;
                    if steps == 2 {
                        let _ = tx.send(());
                    }
                };
                let mut write = |b: &[u8]| -> Result<(), ()> {
                    bytes.extend_from_slice(b);
                    Ok(())
                };
                let exported = store.export_into(true, &mut between, &mut write).unwrap();
                (exported, bytes)
            });
            rx.recv().unwrap();
            scope.spawn(move || apply_atomic(store, 2002, &[(b"key1", b"u"), (b"key2", b"u"), (b"key3", b"u")]));
            copy.join().unwrap()
        });
        assert!(matches!(exported, Exported::Done(2000)));
        let recovered = Store::new(ShardId::SOLO, 2, 4000).unwrap();
        recovered.import(&bytes).unwrap();
        for k in 0..2000 {
            apply(&recovered, k + 1, OpKind::Put, &key(k), b"v0");
        }
        apply_atomic(&recovered, 2001, &[(b"key1", b"t"), (b"key2", b"t"), (b"key3", b"t")]);
        apply_atomic(&recovered, 2002, &[(b"key1", b"u"), (b"key2", b"u"), (b"key3", b"u")]);
        recovered.end_replay();
        assert_eq!(pairs_of(&export(&recovered)), pairs_of(&export(&store)));
    }

    /// A snapshot copied a shard after entries 1 and 2 were applied to it, although it says
    /// it holds the log only to entry 0. Replaying 1 and 2 on top would change a conditional
    /// put's outcome; the shard's recorded entry makes the replay skip them.
    #[test]
    fn replay_after_a_fuzzy_snapshot_skips_what_each_shard_already_holds() {
        let store = Store::new(ShardId::SOLO, 4, 0).unwrap();
        assert_eq!(apply(&store, 1, OpKind::PutIfPresent, b"k", b"a"), None);
        assert_eq!(apply(&store, 2, OpKind::PutIfAbsent, b"k", b"b"), Some(b"b".to_vec()));
        let bytes = export(&store);

        // Another map shard count on restart: each key still finds its old shard's entry.
        let recovered = Store::new(ShardId::SOLO, 16, 0).unwrap();
        recovered.import(&bytes).unwrap();
        apply(&recovered, 1, OpKind::PutIfPresent, b"k", b"a");
        assert_eq!(
            apply(&recovered, 2, OpKind::PutIfAbsent, b"k", b"b"),
            Some(b"b".to_vec())
        );
        recovered.end_replay();
        // After the replay, new entries apply as usual.
        assert_eq!(
            apply(&recovered, 3, OpKind::PutIfPresent, b"k", b"c"),
            Some(b"c".to_vec())
        );

        // What the per-shard entry prevents: the same replay without it ends at "a".
        let naive = Store::new(ShardId::SOLO, 4, 0).unwrap();
        naive.import(&bytes).unwrap();
        naive.end_replay();
        apply(&naive, 1, OpKind::PutIfPresent, b"k", b"a");
        assert_eq!(apply(&naive, 2, OpKind::PutIfAbsent, b"k", b"b"), Some(b"a".to_vec()));
    }

    #[test]
    fn a_key_of_another_shard_is_refused() {
        let store = Store::new(ShardId { index: 0, count: 2 }, 4, 0).unwrap();
        let other = (0..100u32)
            .map(|i| i.to_string())
            .find(|k| !store.own.me.owns(key_slot(k.as_bytes())))
            .unwrap();
        let e = store
            .import(&one_shard(&[(other.into_bytes(), Vec::new())]))
            .unwrap_err();
        assert!(
            matches!(&e, ImportError::Pair { shard: 0, pair: 0, why: PairFault::NotOwned(me), .. } if *me == store.own.me),
            "{e}"
        );
        assert_eq!(
            e.to_string(),
            "map shard 0: pair 0 at byte 0: a key of a slot shard 0/2 does not hold"
        );
    }
}
