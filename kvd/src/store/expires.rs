//! A map shard's deadlines: for each key with a time to live, when it stops existing (Unix
//! milliseconds), kept beside the table as Redis keeps its `expires` dictionary beside the
//! keyspace. A key without one costs nothing here, and a shard with none skips every check
//! (one `is_empty`). Indexed, so the active cycle and the volatile eviction policies can
//! sample a random key in constant time.

use indexmap::IndexMap;

use super::table::data_cost;

/// Bytes one deadline costs besides its key's copy: the deadline, the map's index entry and
/// its hash, the key's box.
const PER_DEADLINE: usize = 48;

/// One map shard's deadlines.
#[derive(Default)]
pub(super) struct Expires {
    map: IndexMap<Box<[u8]>, u64, foldhash::fast::RandomState>,
}

/// What a deadline costs in accounted bytes.
pub(super) fn deadline_cost(key_len: usize) -> usize {
    data_cost(key_len, 0) + PER_DEADLINE
}

impl Expires {
    pub(super) fn len(&self) -> usize {
        self.map.len()
    }

    /// The key's deadline, if it has one.
    #[inline]
    pub(super) fn get(&self, key: &[u8]) -> Option<u64> {
        if self.map.is_empty() {
            return None;
        }
        self.map.get(key).copied()
    }

    /// Whether the key has a deadline at or before `clock` (so it no longer exists).
    #[inline]
    pub(super) fn is_due(&self, key: &[u8], clock: u64) -> bool {
        self.get(key).is_some_and(|at| at <= clock)
    }

    /// Sets the key's deadline; returns the accounted bytes it added (0 when it had one).
    pub(super) fn set(&mut self, key: &[u8], at: u64) -> usize {
        if let Some(d) = self.map.get_mut(key) {
            *d = at;
            return 0;
        }
        self.map.insert(key.into(), at);
        deadline_cost(key.len())
    }

    /// Removes the key's deadline; returns the accounted bytes freed (0 when it had none).
    pub(super) fn remove(&mut self, key: &[u8]) -> usize {
        if self.map.is_empty() {
            return 0;
        }
        match self.map.swap_remove(key) {
            Some(_) => deadline_cost(key.len()),
            None => 0,
        }
    }

    /// The key and deadline at position `i` (for sampling; `i` below [`Expires::len`]).
    pub(super) fn at(&self, i: usize) -> Option<(&[u8], u64)> {
        self.map.get_index(i).map(|(k, &at)| (&**k, at))
    }
}
