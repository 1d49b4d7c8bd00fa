//! The newest log entries, kept in memory within a byte budget; older ones are read back from
//! the segment files (`LogStore`).
//!
//! Holds a contiguous run of entries ending at the log's last entry, which is never evicted.
//! An entry leaves only when it is committed and readable from disk (the caller says up to
//! where), so what raft may still take back, or what a failed fsync may make the writer write
//! again, is always here.

use std::collections::BTreeMap;

use openraft::{Entry, LogId};

use super::types::ShardRaft;

/// Bytes of encoded entries a shard keeps in memory at most (beyond the newest entry, and
/// beyond entries not yet committed or on disk). Unit tests keep 64 KiB, so that every test
/// of a durable shard reads entries back from its files too.
pub(crate) const LOG_CACHE_BYTES: usize = if cfg!(test) { 64 << 10 } else { 16 << 20 };

/// The newest entries and their encoded sizes.
pub(super) struct EntryCache {
    entries: BTreeMap<u64, (Entry<ShardRaft>, usize)>,
    bytes: usize,
    budget: usize,
}

impl EntryCache {
    pub(super) fn new(budget: usize) -> EntryCache {
        EntryCache {
            entries: BTreeMap::new(),
            bytes: 0,
            budget,
        }
    }

    /// Adds the next entry, `bytes` long when encoded.
    pub(super) fn push(&mut self, entry: Entry<ShardRaft>, bytes: usize) {
        if let Some((_, old)) = self.entries.insert(entry.log_id.index, (entry, bytes)) {
            self.bytes -= old;
        }
        self.bytes += bytes;
    }

    /// Whether the budget is passed.
    pub(super) fn over_budget(&self) -> bool {
        self.bytes > self.budget
    }

    /// Drops the oldest entries while over budget, none past `through`, never the last.
    pub(super) fn evict(&mut self, through: u64) {
        while self.over_budget() && self.entries.len() > 1 {
            let Some(mut oldest) = self.entries.first_entry() else {
                return;
            };
            if *oldest.key() > through {
                return;
            }
            self.bytes -= oldest.get_mut().1;
            oldest.remove();
        }
    }

    /// Drops the entries from `index` on (raft took them back).
    pub(super) fn truncate_from(&mut self, index: u64) {
        let gone = self.entries.split_off(&index);
        self.bytes -= gone.values().map(|(_, b)| b).sum::<usize>();
    }

    /// Drops the entries up to `index` (a snapshot holds them).
    pub(super) fn forget_through(&mut self, index: u64) {
        let kept = match index.checked_add(1) {
            Some(next) => self.entries.split_off(&next),
            None => BTreeMap::new(),
        };
        let gone = std::mem::replace(&mut self.entries, kept);
        self.bytes -= gone.values().map(|(_, b)| b).sum::<usize>();
    }

    /// The index of the oldest entry held.
    pub(super) fn first_index(&self) -> Option<u64> {
        self.entries.keys().next().copied()
    }

    /// The newest entry's id.
    pub(super) fn last(&self) -> Option<LogId<u64>> {
        self.entries.values().next_back().map(|(e, _)| e.log_id)
    }

    /// Copies of the entries held in `start..end`.
    pub(super) fn range(&self, start: u64, end: u64) -> Vec<Entry<ShardRaft>> {
        if end <= start {
            return Vec::new();
        }
        self.entries.range(start..end).map(|(_, (e, _))| e.clone()).collect()
    }

    /// Bytes of the entries held, encoded.
    pub(super) fn bytes(&self) -> usize {
        self.bytes
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use openraft::{CommittedLeaderId, EntryPayload};

    fn entry(index: u64) -> Entry<ShardRaft> {
        Entry {
            log_id: LogId::new(CommittedLeaderId::new(1, 0), index),
            payload: EntryPayload::Blank,
        }
    }

    #[test]
    fn eviction_keeps_the_budget_the_uncommitted_and_the_last_entry() {
        let mut cache = EntryCache::new(100);
        for i in 1..=10 {
            cache.push(entry(i), 30);
        }
        cache.evict(4);
        assert_eq!(cache.first_index(), Some(5), "nothing past `through` leaves");
        cache.evict(100);
        assert_eq!((cache.first_index(), cache.bytes()), (Some(8), 90));
        let mut small = EntryCache::new(10);
        small.push(entry(1), 30);
        small.evict(1);
        assert_eq!(small.last().map(|l| l.index), Some(1), "the last entry stays");
        cache.truncate_from(9);
        cache.forget_through(7);
        assert_eq!((cache.first_index(), cache.bytes()), (Some(8), 30));
        cache.forget_through(u64::MAX);
        assert_eq!((cache.first_index(), cache.bytes()), (None, 0));
    }
}
