//! The snapshot gate: what keeps a snapshot from splitting a transaction or a slot change,
//! and what a snapshot being replayed already holds.
//!
//! An atomic batch applied from the log holds the gate shared; a slot change and a
//! snapshot's start and end (or its whole copy) hold it exclusive. Every pass through the
//! gate is counted, so a snapshot that did not hold the gate throughout its copy knows
//! whether something passed meanwhile and redoes the copy (see `export`).

use std::sync::atomic::{AtomicU64, Ordering};

use parking_lot::{RwLock, RwLockReadGuard, RwLockWriteGuard};

/// The gate, its count of passes, and the replay's view of the snapshot it started from.
#[derive(Default)]
pub(super) struct SnapshotGate {
    lock: RwLock<()>,
    passes: AtomicU64,
    /// While a durable shard replays its log after loading a snapshot: per map shard of the
    /// snapshot, the last log entry its copy already holds (see `dump`).
    pub(super) replay: RwLock<Option<Vec<u64>>>,
}

impl SnapshotGate {
    /// Held by an atomic batch or a slot change applied from the log: counted as a pass.
    pub(super) fn pass_shared(&self) -> RwLockReadGuard<'_, ()> {
        let guard = self.lock.read();
        self.passes.fetch_add(1, Ordering::AcqRel);
        guard
    }

    /// Held by a slot change: counted as a pass, and nothing else passes meanwhile.
    pub(super) fn pass_alone(&self) -> RwLockWriteGuard<'_, ()> {
        let guard = self.lock.write();
        self.passes.fetch_add(1, Ordering::AcqRel);
        guard
    }

    /// Held by a snapshot: nothing passes while it lives (not counted).
    pub(super) fn close(&self) -> RwLockWriteGuard<'_, ()> {
        self.lock.write()
    }

    /// Passes so far.
    pub(super) fn passes(&self) -> u64 {
        self.passes.load(Ordering::Acquire)
    }
}

#[cfg(test)]
mod tests {
    use super::SnapshotGate;

    #[test]
    fn passes_are_counted_and_a_closed_gate_lets_none_through() {
        let gate = SnapshotGate::default();
        drop(gate.pass_shared());
        drop(gate.pass_alone());
        assert_eq!(gate.passes(), 2);
        let closed = gate.close();
        assert!(gate.lock.try_read().is_none(), "a pass while the gate is closed");
        drop(closed);
        assert!(gate.lock.try_read().is_some());
        assert_eq!(gate.passes(), 2, "closing is not a pass");
    }
}
