//! What the store runs: a batch of ops read in place, whether from a client's frame
//! (`kvshared::wire::BatchView`) or from a log entry (`crate::durable::entry`, whose format is
//! the log's own). The store knows neither encoding, only this.

use kvshared::wire::{BatchView, MalformedOp, OpKind, OpRef};

/// A batch of ops, each read in place with its key and value bounds-checked.
pub trait Ops {
    /// Ops in the batch.
    fn len(&self) -> usize;

    /// Op `i`, or why it cannot be read.
    fn op(&self, i: usize) -> Result<OpRef<'_>, MalformedOp>;

    /// Whether the batch holds an `Atomic` op: it runs as one (a transaction).
    fn is_atomic(&self) -> bool {
        self.contains(OpKind::Atomic)
    }

    /// Whether the batch holds an op of `kind`.
    fn contains(&self, kind: OpKind) -> bool;

    /// Whether the batch holds no op.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl Ops for BatchView<'_> {
    fn len(&self) -> usize {
        BatchView::len(self)
    }

    fn op(&self, i: usize) -> Result<OpRef<'_>, MalformedOp> {
        BatchView::op(self, i)
    }

    fn is_atomic(&self) -> bool {
        BatchView::is_atomic(self)
    }

    fn contains(&self, kind: OpKind) -> bool {
        BatchView::contains(self, kind)
    }
}
