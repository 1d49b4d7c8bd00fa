//! Sorting ops into one batch per owner node: the one place a client splits ops by node.

use crate::routing::owner_node;
use crate::wire::{BatchRequest, OpKind};

/// One reusable [`BatchRequest`] per node; each op goes to the batch of the node that owns
/// its key. kvbench's load engine, `kvbench load` and [`super::Cluster::batch`] all fill
/// their batches through this.
#[derive(Debug, Clone)]
pub struct NodeBatches {
    batches: Vec<BatchRequest>,
}

impl NodeBatches {
    /// Empty batches for a cluster of `nodes` nodes (at least one).
    pub fn new(nodes: usize) -> NodeBatches {
        NodeBatches {
            batches: (0..nodes.max(1)).map(|_| BatchRequest::new()).collect(),
        }
    }

    /// The node that owns `key`.
    #[inline]
    pub fn owner(&self, key: &[u8]) -> usize {
        owner_node(key, self.batches.len() as u32) as usize
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
