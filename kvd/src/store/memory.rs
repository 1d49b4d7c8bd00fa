//! What the stored data costs in memory, and what happens at `--max-memory`.
//!
//! Accounting counts what the store really holds, as the allocator hands it out: each
//! entry's allocation (its value, and its key when the key is too long for the slot; in
//! mimalloc's size classes, see `table::data_cost`), and each map shard's slot array (32
//! bytes per slot, full or not; see `table`). The total is kept in one counter,
//! and a write takes its bytes from it *before* it stores anything, so the accounted total
//! never exceeds the cap after a write returns.
//!
//! At the cap a write first makes room in its own map shard, one entry at a time, in its
//! own write path (never a sweep), taking another shard's lock only with `try_write` when its
//! own shard has nothing left to give:
//!
//! * `lru`: sample 16 entries at random and evict the one used longest ago. Each entry
//!   carries the store's millisecond clock from its last read or write (a read writes it
//!   only when the clock has moved), so reads stay as cheap as before, as in Redis's
//!   approximate LRU;
//! * `random`: evict one entry at random;
//! * `none`: evict nothing; the write is refused (`OutOfMemory`), reads and deletes go on;
//! * `volatile-lru`, `volatile-ttl`, `volatile-random`: as Redis's, only keys with a time
//!   to live go: the least recently used of 16 sampled, the one with the nearest deadline
//!   of 16 sampled, or one at random; with none left, the write is refused.
//!
//! Redis's names are accepted for the first three (`allkeys-lru`, `allkeys-random`,
//! `noeviction`). A key's deadline counts in its cost (see `expires`).

use std::sync::atomic::{AtomicU8, AtomicUsize, Ordering};

use super::expires::Expires;
use super::table::Table;

/// What happens when a write needs memory beyond `--max-memory` (Redis's
/// `maxmemory-policy`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Eviction {
    /// Evict the least recently used of a random sample (Redis: allkeys-lru).
    #[value(alias = "allkeys-lru")]
    Lru,
    /// Evict at random (Redis: allkeys-random).
    #[value(alias = "allkeys-random")]
    Random,
    /// Evict nothing: refuse the write (Redis: noeviction).
    #[value(alias = "noeviction")]
    None,
    /// Evict the least recently used of a sample of the keys with a time to live.
    #[value(name = "volatile-lru")]
    VolatileLru,
    /// Evict the key with the nearest deadline of a sample of those with one.
    #[value(name = "volatile-ttl")]
    VolatileTtl,
    /// Evict a key with a time to live, at random.
    #[value(name = "volatile-random")]
    VolatileRandom,
}

impl Eviction {
    const ALL: [Eviction; 6] = [
        Eviction::Lru,
        Eviction::Random,
        Eviction::None,
        Eviction::VolatileLru,
        Eviction::VolatileTtl,
        Eviction::VolatileRandom,
    ];

    fn from_index(i: u8) -> Eviction {
        Eviction::ALL.get(usize::from(i)).copied().unwrap_or(Eviction::Lru)
    }

    /// The policy's name, as on the command line.
    pub fn name(self) -> &'static str {
        match self {
            Eviction::Lru => "lru",
            Eviction::Random => "random",
            Eviction::None => "none",
            Eviction::VolatileLru => "volatile-lru",
            Eviction::VolatileTtl => "volatile-ttl",
            Eviction::VolatileRandom => "volatile-random",
        }
    }

    /// The policy named `name` (as [`Eviction::name`] gives it).
    pub fn from_name(name: &str) -> Option<Eviction> {
        Eviction::ALL.into_iter().find(|e| e.name() == name)
    }

    /// Redis's `maxmemory-policy` name for it.
    pub fn redis_name(self) -> &'static str {
        match self {
            Eviction::Lru => "allkeys-lru",
            Eviction::Random => "allkeys-random",
            Eviction::None => "noeviction",
            other => other.name(),
        }
    }

    /// Whether the policy orders entries by their last use (so entries carry the clock).
    pub fn uses_lru_clock(self) -> bool {
        matches!(self, Eviction::Lru | Eviction::VolatileLru)
    }
}

/// `--max-memory` and `--eviction`.
#[derive(Clone, Copy, Debug)]
pub struct MemoryLimit {
    /// Accounted bytes the store may hold.
    pub max_bytes: usize,
    /// What a write does at the cap.
    pub eviction: Eviction,
}

/// Entries sampled per eviction under `lru` (Redis samples 5; more is closer to exact LRU
/// and costs only at the cap).
const LRU_SAMPLES: usize = 16;
/// Random slots tried per sampled entry before scanning a nearly empty table.
const PROBES: usize = 256;
/// Most entries one write may evict; past it, the write is refused rather than stall. A put
/// usually evicts one entry; the write that makes a map shard's table grow pays for the
/// new table at once (a few hundred KB: a thousand or two entries, well under a millisecond).
pub(super) const MAX_EVICTIONS_PER_WRITE: usize = 4096;

/// One internal shard: its table and what its entries cost.
pub(super) struct Shard {
    pub(super) table: Table,
    /// The deadlines of its keys that have a time to live.
    pub(super) expires: Expires,
    /// Accounted bytes of the entries and their deadlines (the table's own cost follows
    /// from its capacity).
    pub(super) entry_bytes: usize,
    /// State of the sampling generator (xorshift), per shard so it needs no other lock.
    rng: u64,
    /// The last log entry whose writes reached this shard (durable shards; see `dump`).
    pub(super) applied: u64,
    /// While a migration copies slots from this node: the keys written in them (see
    /// `tracking`).
    pub(super) written: Option<Box<super::tracking::Written>>,
    /// While a snapshot copies this shard in steps: the keys written meanwhile (see
    /// `export`).
    pub(super) copying: Option<Box<super::export::CopyWrites>>,
}

impl Shard {
    pub(super) fn new(table: Table, seed: u64) -> Shard {
        Shard {
            table,
            expires: Expires::default(),
            entry_bytes: 0,
            rng: seed | 1,
            applied: 0,
            written: None,
            copying: None,
        }
    }

    /// Notes that `key` changed, for a migration's copy (see `tracking`).
    #[inline]
    pub(super) fn note_written(&mut self, key: &[u8]) {
        if let Some(w) = self.written.as_deref_mut() {
            w.note(key);
        }
        if let Some(c) = self.copying.as_deref_mut() {
            c.note(key);
        }
    }

    /// Accounted bytes of the whole shard: its entries and its table's allocation (every
    /// bucket, full, empty or deleted).
    pub(super) fn bytes(&self) -> usize {
        self.entry_bytes + self.table.allocation_size()
    }

    pub(super) fn next_random(&mut self) -> u64 {
        let mut x = self.rng;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.rng = x;
        x.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    /// A random entry other than `keep`: its slot and when it was last used. Tries random
    /// slots (a table that filled up has most of them full), then, for a table that deletes
    /// left nearly empty, scans.
    fn sample(&mut self, keep: &[u8]) -> Option<(usize, u32)> {
        let n = self.table.slot_count();
        if n == 0 {
            return None;
        }
        for _ in 0..PROBES {
            let i = (self.next_random() % n as u64) as usize;
            if let Some(e) = self.table.at(i)
                && e.key() != keep
            {
                return Some((i, e.touched()));
            }
        }
        (0..n).find_map(|i| self.table.at(i).filter(|e| e.key() != keep).map(|e| (i, e.touched())))
    }

    /// Evicts one entry (not `keep`) as `policy` says; returns the bytes freed, or `None`
    /// when the policy evicts nothing or the shard has nothing else.
    pub(super) fn evict_one(&mut self, policy: Eviction, keep: &[u8]) -> Option<usize> {
        let samples = match policy {
            Eviction::Lru => LRU_SAMPLES,
            Eviction::Random => 1,
            Eviction::None => return None,
            Eviction::VolatileLru | Eviction::VolatileTtl => return self.evict_volatile(policy, LRU_SAMPLES, keep),
            Eviction::VolatileRandom => return self.evict_volatile(policy, 1, keep),
        };
        let mut victim: Option<(usize, u32)> = None;
        for _ in 0..samples.min(self.table.len()) {
            let Some(candidate) = self.sample(keep) else { break };
            if victim.is_none_or(|v| candidate.1 < v.1) {
                victim = Some(candidate);
            }
        }
        let (at, _) = victim?;
        Some(self.remove_at(at))
    }

    /// Evicts one of `samples` keys with a deadline (not `keep`), sampled at random: the
    /// least recently used (`volatile-lru`), the nearest deadline (`volatile-ttl`), or the
    /// first (`volatile-random`). `None` when the shard has no other key with a deadline.
    fn evict_volatile(&mut self, policy: Eviction, samples: usize, keep: &[u8]) -> Option<usize> {
        let n = self.expires.len();
        // (slot, the order it goes in: its last use or its deadline)
        let mut victim: Option<(usize, u64)> = None;
        for _ in 0..samples.min(n) {
            let mut candidate = None;
            for _ in 0..PROBES {
                let i = (self.next_random() % n as u64) as usize;
                let Some((key, at)) = self.expires.at(i).filter(|(k, _)| *k != keep) else {
                    continue;
                };
                let Some(slot) = self.table.find(kvshared::routing::key_hash(key), key) else {
                    continue;
                };
                let touched = self.table.at(slot).map_or(0, |e| u64::from(e.touched()));
                candidate = Some((slot, if policy == Eviction::VolatileTtl { at } else { touched }));
                break;
            }
            let Some(c) = candidate else { break };
            if victim.is_none_or(|v| c.1 < v.1) {
                victim = Some(c);
            }
        }
        let (slot, _) = victim?;
        Some(self.remove_at(slot))
    }

    /// Removes the entry in slot `at` and its deadline; returns the accounted bytes freed.
    pub(super) fn remove_at(&mut self, at: usize) -> usize {
        let Some(e) = self.table.at(at) else { return 0 };
        if let Some(w) = self.written.as_deref_mut() {
            w.note(e.key());
        }
        if let Some(c) = self.copying.as_deref_mut() {
            c.note(e.key());
        }
        let freed = e.cost() + self.expires.remove(e.key());
        let mut copying = self.copying.as_deref_mut();
        self.table.remove_at(at, |key| {
            if let Some(c) = copying.as_deref_mut() {
                c.note(key);
            }
        });
        self.entry_bytes -= freed;
        freed
    }
}

/// The store-wide total of accounted bytes, and the cap (which can change at run time,
/// as Redis's `CONFIG SET maxmemory`; atomics, as every write reads it).
/// The memory cap and eviction: the bytes accounted against `--max-memory`, the LRU clock,
/// and the policy a cap set at run time uses.
pub(super) struct MemoryCap {
    pub(super) usage: Usage,
    /// The LRU clock's zero.
    started: std::time::Instant,
    /// The policy a cap set at run time uses when none was configured.
    configured: Eviction,
}

impl MemoryCap {
    /// `usage` under `limit` (lru for a cap set later when none is given).
    pub(super) fn new(usage: Usage, limit: Option<MemoryLimit>) -> MemoryCap {
        MemoryCap {
            usage,
            started: std::time::Instant::now(),
            configured: limit.map_or(Eviction::Lru, |l| l.eviction),
        }
    }

    /// A cap set at run time refuses writes rather than evict.
    pub(super) fn never_evict(&mut self) {
        self.configured = Eviction::None;
    }

    /// Sets (or removes) the cap, keeping the eviction policy in force (or configured).
    pub(super) fn set_max(&self, max_bytes: Option<usize>) {
        let eviction = self.usage.limit().map_or(self.configured, |l| l.eviction);
        self.usage
            .set_limit(max_bytes.map(|max_bytes| MemoryLimit { max_bytes, eviction }));
    }

    /// The LRU clock (milliseconds since start; 0 when nothing evicts by age).
    pub(super) fn now(&self) -> u32 {
        match self.usage.limit() {
            Some(limit) if limit.eviction.uses_lru_clock() => self.started.elapsed().as_millis() as u32,
            _ => 0,
        }
    }
}

pub(super) struct Usage {
    used: AtomicUsize,
    /// The cap; `usize::MAX` when there is none.
    max: AtomicUsize,
    eviction: AtomicU8,
}

impl Usage {
    pub(super) fn new(limit: Option<MemoryLimit>) -> Usage {
        let usage = Usage {
            used: AtomicUsize::new(0),
            max: AtomicUsize::new(usize::MAX),
            eviction: AtomicU8::new(0),
        };
        usage.set_limit(limit);
        usage
    }

    /// Whether a cap is set.
    pub(super) fn is_capped(&self) -> bool {
        self.max.load(Ordering::Relaxed) != usize::MAX
    }

    /// The cap and policy now.
    pub(super) fn limit(&self) -> Option<MemoryLimit> {
        match self.max.load(Ordering::Relaxed) {
            usize::MAX => None,
            max_bytes => Some(MemoryLimit {
                max_bytes,
                eviction: Eviction::from_index(self.eviction.load(Ordering::Relaxed)),
            }),
        }
    }

    /// Sets (or, with `None`, removes) the cap. A lower cap is reached by the writes that
    /// follow, as they evict.
    pub(super) fn set_limit(&self, limit: Option<MemoryLimit>) {
        if let Some(l) = limit {
            let index = Eviction::ALL.iter().position(|&e| e == l.eviction).unwrap_or(0);
            self.eviction.store(index as u8, Ordering::Relaxed);
        }
        self.max.store(
            limit.map_or(usize::MAX, |l| l.max_bytes.min(usize::MAX - 1)),
            Ordering::Relaxed,
        );
    }

    /// Accounted bytes now.
    pub(super) fn used(&self) -> usize {
        self.used.load(Ordering::Relaxed)
    }

    /// Takes `bytes` if the cap allows them (always, without a cap).
    pub(super) fn try_take(&self, bytes: usize) -> bool {
        match self.max.load(Ordering::Relaxed) {
            usize::MAX => {
                self.used.fetch_add(bytes, Ordering::Relaxed);
                true
            }
            max => self
                .used
                .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |u| {
                    u.checked_add(bytes).filter(|&t| t <= max)
                })
                .is_ok(),
        }
    }

    /// Adds bytes whatever the cap (a reconciliation after an estimate fell short).
    pub(super) fn add(&self, bytes: usize) {
        self.used.fetch_add(bytes, Ordering::Relaxed);
    }

    /// Gives bytes back.
    pub(super) fn give(&self, bytes: usize) {
        if bytes > 0 {
            self.used.fetch_sub(bytes, Ordering::Relaxed);
        }
    }
}

#[cfg(test)]
mod tests {
    use kvshared::routing::key_hash;

    use super::*;

    #[test]
    fn lru_evicts_what_was_used_longest_ago() {
        let mut shard = Shard::new(Table::new(), 7);
        for i in 0..64u32 {
            let key = i.to_string();
            // Keys 0..8 were used recently (clock 1000), the rest long ago.
            let when = if i < 8 { 1000 } else { i };
            let at = shard
                .table
                .insert_new(key_hash(key.as_bytes()), key.as_bytes(), b"v", when)
                .unwrap();
            shard.entry_bytes += shard.table.at(at).unwrap().cost();
        }
        for _ in 0..40 {
            shard.evict_one(Eviction::Lru, b"").unwrap();
        }
        let recent = (0..8)
            .filter(|i: &u32| {
                let k = i.to_string();
                shard.table.find(key_hash(k.as_bytes()), k.as_bytes()).is_some()
            })
            .count();
        assert_eq!(recent, 8, "a recently used key was evicted before older ones");
        assert_eq!(shard.table.len(), 24);
        assert_eq!(shard.entry_bytes, 24 * 16);
        assert_eq!(shard.evict_one(Eviction::None, b""), None);
    }
}
