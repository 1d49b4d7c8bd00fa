//! Sorting ops into one batch per owner node: the one place a client splits ops by node.

use std::sync::Arc;

use crate::routing::key_slot;
use crate::slots::SlotTable;
use crate::wire::{BatchRequest, OpKind};

/// One reusable [`BatchRequest`] per node; each op goes to the batch of the node that owns
/// its key's slot, as the slot table says. kvbench's load engine, `kvbench load` and
/// [`super::Cluster::batch`] all fill their batches through this.
#[derive(Clone)]
pub struct NodeBatches {
    batches: Vec<BatchRequest>,
    slots: Arc<SlotTable>,
}

impl NodeBatches {
    /// Empty batches for a cluster of `nodes` nodes (at least one) split evenly.
    pub fn new(nodes: usize) -> NodeBatches {
        NodeBatches::with_table(nodes, Arc::new(SlotTable::for_client(nodes.max(1) as u32)))
    }

    /// Empty batches for `nodes` nodes, routed by `slots` (a cluster client's table, which
    /// learns from redirects).
    pub fn with_table(nodes: usize, slots: Arc<SlotTable>) -> NodeBatches {
        NodeBatches {
            batches: (0..nodes.max(1)).map(|_| BatchRequest::new()).collect(),
            slots,
        }
    }

    /// The node that owns `key` (a table naming a group past the last falls back to 0; a
    /// client's table only learns owners it has).
    #[inline]
    pub fn owner(&self, key: &[u8]) -> usize {
        if self.batches.len() == 1 {
            return 0;
        }
        let owner = usize::from(self.slots.owner(key_slot(key)));
        if owner < self.batches.len() { owner } else { 0 }
    }

    /// Appends an op to the batch of the node that owns `key` and returns that node.
    #[inline]
    pub fn push(&mut self, kind: OpKind, key: &[u8], value: &[u8]) -> usize {
        let node = self.owner(key);
        self.batches[node].push(kind, key, value);
        node
    }

    /// Appends an op to `node`'s batch, for a caller that already knows the owner (a second
    /// op on the same key).
    pub fn push_to(&mut self, node: usize, kind: OpKind, key: &[u8], value: &[u8]) {
        self.batches[node].push(kind, key, value);
    }

    /// Node `node`'s batch, to append to.
    pub fn batch_mut(&mut self, node: usize) -> &mut BatchRequest {
        &mut self.batches[node]
    }

    /// Node `node`'s batch.
    pub fn batch(&self, node: usize) -> &BatchRequest {
        &self.batches[node]
    }

    /// Empties node `node`'s batch, keeping its memory.
    pub fn clear(&mut self, node: usize) {
        self.batches[node].clear();
    }

    /// The nodes whose batches hold ops, with those batches.
    pub fn non_empty(&self) -> impl Iterator<Item = (usize, &BatchRequest)> {
        self.batches.iter().enumerate().filter(|(_, b)| !b.is_empty())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::routing::owner_node;

    #[test]
    fn ops_land_with_their_owner() {
        let mut b = NodeBatches::new(3);
        for i in 0..300u32 {
            let key = i.to_string();
            let node = b.push(OpKind::Put, key.as_bytes(), b"v");
            assert_eq!(node, owner_node(key.as_bytes(), 3) as usize);
        }
        let total: usize = b.non_empty().map(|(_, r)| r.len()).sum();
        assert_eq!(total, 300);
        assert_eq!(b.non_empty().count(), 3);
        b.clear(1);
        assert_eq!(b.batch(1).len(), 0);
    }
}
