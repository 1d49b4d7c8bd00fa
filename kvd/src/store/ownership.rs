//! Slot ownership: which hash slots this node serves, the moves into it under way, the
//! sampled load per slot, and a migration's tracking of the keys it copies. The rules that
//! change the table (`SlotSet`, through the log on a durable node) are in `slots`; the
//! tracking's pages in `tracking`.

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

use kvshared::routing::{SLOTS, ShardId, key_slot};
use kvshared::slots::SlotTable;

use super::tracking::Tracking;

/// This node's slots and what moves them.
pub(super) struct Ownership {
    /// The node (its group's index and the number of groups at start).
    pub(super) me: ShardId,
    /// Which slots this node serves.
    pub(super) slots: SlotTable,
    /// Started with `--no-slots` (see `Store::start_without_slots`).
    pub(super) no_slots: bool,
    /// The log entry of the table's last change (0: none, or in memory).
    pub(super) applied: AtomicU64,
    /// Slots the moves into this node under way have handed over already.
    taken: AtomicU32,
    /// Per hash slot: the sampled ops served here (see `OpKind::SlotLoad`).
    load: Box<[AtomicU32]>,
    /// A migration's tracking of the keys written in the slots it copies.
    pub(super) tracking: parking_lot::Mutex<Option<Tracking>>,
}

impl Ownership {
    /// The even split `me` gives, nothing moving, no load yet.
    pub(super) fn new(me: ShardId) -> Ownership {
        Ownership {
            me,
            slots: SlotTable::for_shard(me),
            no_slots: false,
            applied: AtomicU64::new(0),
            taken: AtomicU32::new(0),
            load: (0..SLOTS).map(|_| AtomicU32::new(0)).collect(),
            tracking: parking_lot::Mutex::new(None),
        }
    }

    /// The table `--shard` gives this node: the even split, or (`--no-slots`) no slot at all.
    pub(super) fn initial_table(&self) -> SlotTable {
        match self.no_slots {
            true => SlotTable::joining(self.me.index.max(1), self.me.index as u16),
            false => SlotTable::for_shard(self.me),
        }
    }

    /// Counts an op on `key` in its slot's sampled load.
    #[inline]
    pub(super) fn count_load(&self, key: &[u8]) {
        if let Some(c) = self.load.get(usize::from(key_slot(key))) {
            c.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Every slot's sampled load, as `OpKind::SlotLoad` answers it.
    pub(super) fn load_bytes(&self) -> Vec<u8> {
        self.load
            .iter()
            .flat_map(|c| c.load(Ordering::Relaxed).to_le_bytes())
            .collect()
    }

    /// Counts `taken` more slots of the moves into this node under way, back to 0 once
    /// none imports here.
    pub(super) fn count_taken(&self, taken: u32) {
        match self.slots.moves().importing {
            0 => self.taken.store(0, Ordering::Release),
            _ => {
                self.taken.fetch_add(taken, Ordering::AcqRel);
            }
        }
    }

    /// The moves under way here, for stats.
    pub(super) fn moves(&self) -> kvshared::stats::SlotMoves {
        kvshared::stats::SlotMoves {
            taken: self.taken.load(Ordering::Acquire),
            ..self.slots.moves()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_new_node_owns_its_even_split_and_counts_load_per_slot() {
        let me = ShardId { index: 1, count: 2 };
        let own = Ownership::new(me);
        assert_eq!(own.slots.entries(), SlotTable::for_shard(me).entries());
        own.count_load(b"k");
        own.count_load(b"k");
        let load = kvshared::slots::decode_load_counts(&own.load_bytes()).unwrap();
        assert_eq!(load.iter().map(|&c| u64::from(c)).sum::<u64>(), 2);
        assert_eq!(load[usize::from(key_slot(b"k"))], 2);
        assert_eq!(own.moves().taken, 0);
    }

    #[test]
    fn an_added_group_starts_owning_no_slot() {
        let mut own = Ownership::new(ShardId { index: 2, count: 3 });
        own.no_slots = true;
        let table = own.initial_table();
        assert!((0..SLOTS).all(|s| table.get(s).state != kvshared::slots::SlotState::Owned));
    }
}
