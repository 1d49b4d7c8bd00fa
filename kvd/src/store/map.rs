//! The table and its map shards: the keys, split over independently locked shards (each a
//! `table::Table` with its keys' deadlines and memory account, see `memory::Shard`), where
//! each shard's slot array is (readable without its lock, for prefetching), and how long
//! sampled batches spent on each.

use std::sync::atomic::{AtomicUsize, Ordering};

use crossbeam::utils::CachePadded;
use parking_lot::RwLock;

use super::memory::{Shard, Usage};
use super::table::{Table, prefetch_at};

/// The map shards.
pub(super) struct MapShards {
    pub(super) shards: Box<[CachePadded<RwLock<Shard>>]>,
    pub(super) hints: Box<[SlotsHint]>,
    /// Per map shard: how long sampled batches spent on its ops, lock wait included.
    pub(super) latency: Box<[crate::latency::Buckets]>,
}

/// The seed of map shard `i`'s eviction sampling.
fn seed(i: usize) -> u64 {
    0x9e37_79b9_7f4a_7c15 ^ i as u64
}

/// How many map shards a store has, and how many entries each one's table is made for, to
/// hold `capacity` keys without growing.
pub(super) fn table_sizes(map_shards: usize, capacity: usize) -> (usize, usize) {
    let n = map_shards.max(1).next_power_of_two();
    // Keys fall on map shards at random: room for four standard deviations more than the
    // mean, so that no shard's table grows just before the cluster holds `capacity` keys.
    let mean = capacity.div_ceil(n);
    let per_shard = if mean == 0 { 0 } else { mean + 4 * mean.isqrt() + 4 };
    (n, per_shard)
}

impl MapShards {
    /// `map_shards` (rounded up to a power of two) shards made for `capacity` keys in all,
    /// their tables' bytes added to `usage`. Memory that cannot be had is an error.
    pub(super) fn new(map_shards: usize, capacity: usize, usage: &Usage) -> std::io::Result<MapShards> {
        let (n, per_shard) = table_sizes(map_shards, capacity);
        let mut shards = Vec::with_capacity(n);
        for i in 0..n {
            let table = Table::with_capacity(per_shard).map_err(|_| {
                std::io::Error::new(
                    std::io::ErrorKind::OutOfMemory,
                    format!("cannot preallocate room for {capacity} keys; lower --capacity"),
                )
            })?;
            usage.add(table.allocation_size());
            shards.push(CachePadded::new(RwLock::new(Shard::new(table, seed(i)))));
        }
        let hints: Box<[SlotsHint]> = shards.iter().map(|_| SlotsHint::default()).collect();
        for (hint, shard) in hints.iter().zip(&shards) {
            hint.publish(&shard.read().table);
        }
        Ok(MapShards {
            shards: shards.into_boxed_slice(),
            hints,
            latency: (0..n).map(|_| crate::latency::Buckets::default()).collect(),
        })
    }

    /// Keys stored now (takes each shard's lock briefly; for stats, not the hot path).
    pub(super) fn keys(&self) -> u64 {
        self.shards.iter().map(|s| s.read().table.len() as u64).sum()
    }

    /// Empties every shard (a new, empty table each), giving their bytes back to `usage`.
    pub(super) fn flush(&self, usage: &Usage) {
        for (i, shard) in self.shards.iter().enumerate() {
            let mut s = shard.write();
            usage.give(s.bytes());
            *s = Shard::new(Table::new(), seed(i));
            self.hints[i].publish(&s.table);
        }
    }
}

/// Where a map shard's slot array is, readable without its lock: a batch requests the
/// first line of every op's probe before it takes any lock (see `pipeline`). Published by
/// whoever holds the write lock when the array may have moved.
#[derive(Default)]
pub(super) struct SlotsHint {
    at: AtomicUsize,
    slots: AtomicUsize,
}

impl SlotsHint {
    pub(super) fn publish(&self, table: &Table) {
        let (at, slots) = table.whereabouts();
        self.at.store(at, Ordering::Relaxed);
        self.slots.store(slots, Ordering::Relaxed);
    }

    #[inline]
    pub(super) fn prefetch(&self, hash: u64) {
        prefetch_at(
            self.at.load(Ordering::Relaxed),
            self.slots.load(Ordering::Relaxed),
            hash,
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shards_are_a_power_of_two_made_for_the_capacity_and_flush_gives_their_bytes_back() {
        assert_eq!(table_sizes(6, 0), (8, 0));
        let (n, per) = table_sizes(4, 1_000_000);
        assert_eq!(n, 4);
        assert!(per > 250_000 && per < 260_000, "{per}");
        let usage = Usage::new(None);
        let map = MapShards::new(3, 10_000, &usage).unwrap();
        assert_eq!((map.shards.len(), map.hints.len(), map.latency.len()), (4, 4, 4));
        assert!(usage.used() > 0, "the preallocated tables are accounted");
        assert_eq!(map.keys(), 0);
        let before = usage.used();
        map.flush(&usage);
        assert!(usage.used() < before, "flushing gave the tables' bytes back");
    }
}
