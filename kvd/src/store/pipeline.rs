//! How a group of ops overlaps its cache misses.
//!
//! A lookup in a table of a million keys costs two misses in a row: the slot, then the
//! value it points at. One op after another, a core waits for each in turn; but the ops of a
//! batch are independent, so the loop runs a few ops apart on each:
//!
//! * the slot of the op [`AHEAD`] places on is requested ([`prefetch_ahead`]);
//! * the current op is probed (its slot has had time to arrive) and, when found, its value
//!   is requested and the op waits in [`Pending`];
//! * the op [`BEHIND`] places back has its value copied into the reply.
//!
//! Writes take no part: before a write runs, every pending read is delivered, so a read
//! answers with what its key held at its place in the batch, and no slot a read found moves
//! (an insert may grow the table, a delete shifts entries) before it is read.

use super::table::Table;

/// How many ops ahead a slot is requested.
const AHEAD: usize = 8;
/// How many found reads wait for their values' lines before being copied.
const BEHIND: usize = 8;

/// Requests the slots of the group's first [`AHEAD`] ops.
#[inline]
pub(super) fn prefetch_first(table: &Table, group: &[u64], hashes: &[u64]) {
    for &e in group.iter().take(AHEAD) {
        if let Some(&h) = hashes.get(e as u32 as usize) {
            table.prefetch(h);
        }
    }
}

/// Requests the slot of the op [`AHEAD`] places after op `k` of the group.
#[inline]
pub(super) fn prefetch_ahead(table: &Table, group: &[u64], k: usize, hashes: &[u64]) {
    if let Some(&e) = group.get(k + AHEAD)
        && let Some(&h) = hashes.get(e as u32 as usize)
    {
        table.prefetch(h);
    }
}

/// Found reads waiting for their values: (op index, slot), oldest first.
pub(super) struct Pending {
    ring: [(u32, u32); BEHIND],
    head: usize,
    len: usize,
}

impl Pending {
    pub(super) fn new() -> Pending {
        Pending {
            ring: [(0, 0); BEHIND],
            head: 0,
            len: 0,
        }
    }

    /// Adds a found read; when the ring was full, returns the oldest, which is now due.
    #[inline]
    pub(super) fn push(&mut self, op: u32, slot: u32) -> Option<(u32, u32)> {
        let due = if self.len == BEHIND { self.pop() } else { None };
        self.ring[(self.head + self.len) % BEHIND] = (op, slot);
        self.len += 1;
        due
    }

    /// The oldest waiting read.
    #[inline]
    pub(super) fn pop(&mut self) -> Option<(u32, u32)> {
        if self.len == 0 {
            return None;
        }
        let oldest = self.ring[self.head];
        self.head = (self.head + 1) % BEHIND;
        self.len -= 1;
        Some(oldest)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pending_reads_come_out_oldest_first_and_the_full_ring_hands_one_back() {
        let mut p = Pending::new();
        for i in 0..BEHIND as u32 {
            assert_eq!(p.push(i, i * 10), None);
        }
        assert_eq!(p.push(99, 990), Some((0, 0)));
        let rest: Vec<_> = std::iter::from_fn(|| p.pop()).collect();
        assert_eq!(rest.len(), BEHIND);
        assert_eq!(rest.first(), Some(&(1, 10)));
        assert_eq!(rest.last(), Some(&(99, 990)));
    }
}
