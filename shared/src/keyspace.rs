//! The keyspace ops' arguments and answers (Redis's `SCAN`, `RENAME`), and the cursor a
//! client walks a whole cluster with.
//!
//! A scan walks one node's map shards in order, and each map shard's keys in the order of
//! a 32-bit *position* taken from the key's hash ([`scan_position`]); the node-level cursor
//! is `map shard << 32 | position`. Every key whose position is below the cursor was
//! returned, whatever was added, removed or resized since, so a key present for the whole
//! scan is returned exactly once by its node (Redis promises at least once).
//!
//! A cluster cursor ([`ClusterCursor`]) adds the node's index in bits 48..63; 0 begins and
//! ends a scan, as Redis's.
//!
//! Every decoder here reads bytes from a peer: lengths are checked, nothing panics.

use crate::routing::key_hash;

/// Most keys one scan op returns (a larger `COUNT` is cut to it).
pub const MAX_SCAN_COUNT: u32 = 10_000;
/// A scan page stops growing past this many bytes of keys (at the next boundary).
pub const MAX_SCAN_PAGE_BYTES: usize = 256 << 10;
/// Longest `MATCH` pattern.
pub const MAX_PATTERN_BYTES: usize = 1024;

/// A key's place in its map shard's scan order.
#[inline]
pub fn scan_position(hash: u64) -> u32 {
    placement_position(hash >> 8)
}

/// [`scan_position`] from the hash's top 56 bits (what a table keeps of a long key): the
/// top 32 bits of a multiply-mix, independent of the bits that chose the node and map
/// shard. kvd's tables order their slots by it, which is what makes a scan by position
/// cheap. (Inline: kvd's table finds every home slot with it.)
#[inline]
pub fn placement_position(placement: u64) -> u32 {
    (placement.wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 32) as u32
}

/// The position of `key` (see [`scan_position`]).
pub fn key_position(key: &[u8]) -> u32 {
    scan_position(key_hash(key))
}

/// A scan op's value: where to start and about how many keys to return.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ScanRequest {
    /// `map shard << 32 | position` (0: the start).
    pub cursor: u64,
    /// Keys wanted (at least 1, at most [`MAX_SCAN_COUNT`]; a page may hold more or fewer).
    pub count: u32,
}

impl ScanRequest {
    /// Its bytes: the cursor then the count, little-endian.
    pub fn encode(self) -> [u8; 12] {
        let mut out = [0u8; 12];
        out[..8].copy_from_slice(&self.cursor.to_le_bytes());
        out[8..].copy_from_slice(&self.count.to_le_bytes());
        out
    }

    /// Reads one; `None` when the bytes are not 12 or the count is 0.
    pub fn decode(bytes: &[u8]) -> Option<ScanRequest> {
        let cursor = u64::from_le_bytes(bytes.get(..8)?.try_into().ok()?);
        let count = u32::from_le_bytes(bytes.get(8..12)?.try_into().ok()?);
        (bytes.len() == 12 && count > 0).then_some(ScanRequest {
            cursor,
            count: count.min(MAX_SCAN_COUNT),
        })
    }
}

/// A scan op's answer: the next node-level cursor (0: the node is done) and the keys.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ScanPage<'a> {
    /// The node's cursor for the next page (0: done).
    pub next: u64,
    /// The keys of this page.
    pub keys: Vec<&'a [u8]>,
}

/// Writes a page: the next cursor, then each key as a 4-byte length and its bytes.
pub fn encode_page<'k>(next: u64, keys: impl Iterator<Item = &'k [u8]>, out: &mut Vec<u8>) {
    out.extend_from_slice(&next.to_le_bytes());
    for k in keys {
        out.extend_from_slice(&(k.len() as u32).to_le_bytes());
        out.extend_from_slice(k);
    }
}

impl<'a> ScanPage<'a> {
    /// Reads a page from a peer's bytes; `None` when they do not parse.
    pub fn decode(bytes: &'a [u8]) -> Option<ScanPage<'a>> {
        let next = u64::from_le_bytes(bytes.get(..8)?.try_into().ok()?);
        let mut rest = bytes.get(8..)?;
        let mut keys = Vec::new();
        while !rest.is_empty() {
            let len = u32::from_le_bytes(rest.get(..4)?.try_into().ok()?) as usize;
            keys.push(rest.get(4..4usize.checked_add(len)?)?);
            rest = rest.get(4 + len..)?;
        }
        Some(ScanPage { next, keys })
    }
}

/// A cursor over a whole cluster: the node's index and that node's own cursor.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ClusterCursor {
    /// The node's index.
    pub node: u32,
    /// That node's cursor (see [`ScanRequest::cursor`]).
    pub at: u64,
}

impl ClusterCursor {
    /// The cursor Redis clients see (0 at the start and at the end).
    pub fn to_u64(self) -> u64 {
        (u64::from(self.node) << 48) | self.at
    }

    /// Reads a client's cursor against a cluster of `nodes`; `None` when it names no node
    /// of it or a map shard past 65,535.
    pub fn from_u64(cursor: u64, nodes: u32) -> Option<ClusterCursor> {
        let node = (cursor >> 48) as u32;
        (node < nodes && node < 1 << 15).then_some(ClusterCursor {
            node,
            at: cursor & ((1 << 48) - 1),
        })
    }

    /// Where a scan goes after node `node` answered `next`: on in it, on to the next
    /// node, or `None` (the end: the client's cursor 0).
    pub fn after(node: u32, next: u64, nodes: u32) -> Option<ClusterCursor> {
        match next {
            0 if node + 1 >= nodes => None,
            0 => Some(ClusterCursor { node: node + 1, at: 0 }),
            at => Some(ClusterCursor { node, at }),
        }
    }
}

/// A rename op's value: the target key, and whether an existing target stops it (`nx`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Rename<'a> {
    /// The key it becomes.
    pub to: &'a [u8],
    /// Only when that key is absent (`RENAMENX`).
    pub nx: bool,
}

impl<'a> Rename<'a> {
    /// Its bytes: a flag byte (1: nx), then the target.
    pub fn encode(self) -> Vec<u8> {
        let mut out = vec![u8::from(self.nx)];
        out.extend_from_slice(self.to);
        out
    }

    /// Reads one; `None` when the flag is not 0 or 1.
    pub fn decode(bytes: &'a [u8]) -> Option<Rename<'a>> {
        match bytes.split_first()? {
            (0, to) => Some(Rename { to, nx: false }),
            (1, to) => Some(Rename { to, nx: true }),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    proptest! {
        /// Pages, requests, renames and cursors read back as written; any bytes decode
        /// without a panic.
        #[test]
        fn round_trips_and_never_panics(
            keys in proptest::collection::vec(proptest::collection::vec(any::<u8>(), 0..20), 0..20),
            next in any::<u64>(),
            junk in proptest::collection::vec(any::<u8>(), 0..64),
            cursor in any::<u64>(),
            nodes in 1u32..100,
        ) {
            let mut out = Vec::new();
            encode_page(next, keys.iter().map(Vec::as_slice), &mut out);
            let page = ScanPage::decode(&out).unwrap();
            prop_assert_eq!(page.next, next);
            prop_assert_eq!(page.keys, keys.iter().map(Vec::as_slice).collect::<Vec<_>>());
            let _ = ScanPage::decode(&junk);
            let _ = ScanRequest::decode(&junk);
            let _ = Rename::decode(&junk);
            if let Some(c) = ClusterCursor::from_u64(cursor, nodes) {
                prop_assert_eq!(c.to_u64(), cursor);
            }
            let req = ScanRequest { cursor, count: 7 };
            prop_assert_eq!(ScanRequest::decode(&req.encode()), Some(req));
        }
    }

    #[test]
    fn a_cluster_cursor_walks_node_by_node_and_ends_at_zero() {
        assert_eq!(ClusterCursor::from_u64(0, 2), Some(ClusterCursor { node: 0, at: 0 }));
        assert_eq!(ClusterCursor::after(0, 0, 2), Some(ClusterCursor { node: 1, at: 0 }));
        assert_eq!(ClusterCursor::after(1, 5, 2), Some(ClusterCursor { node: 1, at: 5 }));
        assert_eq!(ClusterCursor::after(1, 0, 2), None);
        assert_eq!(ClusterCursor::from_u64(2 << 48, 2), None);
        let r = Rename { to: b"b", nx: true };
        assert_eq!(Rename::decode(&r.encode()), Some(r));
        assert_eq!(ScanRequest::decode(&ScanRequest { cursor: 1, count: 0 }.encode()), None);
    }
}
