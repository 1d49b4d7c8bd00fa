//! Key hashing and routing: which node owns a key, and which internal map shard holds it.
//!
//! One hash per key, computed once and reused for every decision:
//!
//! * `key_hash(key) = xxh3_64(key)` with seed 0. It is fixed and documented (not a
//!   per-process random seed) so that every client and server, in any language, agrees on
//!   placement forever.
//! * `owner_node(hash, n) = ((hash & 0xffff_ffff) * n) >> 32`: the low 32 bits, scaled to
//!   `0..n` with a multiply-shift (Lemire's fast range), so no division and an even split.
//! * `map_shard(hash, shards) = (hash >> 40) & (shards - 1)`: bits 40.. pick the internal shard.
//!
//! The bit ranges are disjoint on purpose. The store's hash table uses the low bits for bucket
//! positions and the top 7 bits as tags; if the shard were chosen from the low bits, every key
//! in a shard would share them and crowd into a fraction of that shard's buckets.

/// The fixed hash of a key. Both sides call this; nothing else hashes keys.
#[inline]
pub fn key_hash(key: &[u8]) -> u64 {
    xxhash_rust::xxh3::xxh3_64(key)
}

/// The node (0-based) that owns a key with this hash in a cluster of `nodes` nodes.
///
/// `nodes` must be at least 1.
#[inline]
pub fn owner_node(hash: u64, nodes: u32) -> u32 {
    (((hash & 0xffff_ffff) * u64::from(nodes)) >> 32) as u32
}

/// Redis Cluster's hash slot count.
pub const SLOTS: u16 = 16_384;

/// CRC-16/XMODEM, Redis Cluster's slot hash (a table-driven implementation from `crc`).
const CRC16: crc::Crc<u16> = crc::Crc::<u16>::new(&crc::CRC_16_XMODEM);

/// A key's Redis Cluster hash slot: CRC-16/XMODEM of the key mod 16,384, or of its hash
/// tag, the bytes between the first `{` and the first `}` after it when there are any
/// (`{user1000}.following` and `{user1000}.followers` share a slot). What `CLUSTER
/// KEYSLOT` answers. (Routing does not use it yet: see issue 30's notes in ARCHITECTURE.md.)
pub fn key_slot(key: &[u8]) -> u16 {
    let tagged = key.iter().position(|&b| b == b'{').and_then(|open| {
        let rest = key.get(open + 1..)?;
        let close = rest.iter().position(|&b| b == b'}')?;
        rest.get(..close).filter(|tag| !tag.is_empty())
    });
    CRC16.checksum(tagged.unwrap_or(key)) % SLOTS
}

/// The internal map shard of a key with this hash; `shards` must be a power of two.
#[inline]
pub fn map_shard(hash: u64, shards: usize) -> usize {
    debug_assert!(shards.is_power_of_two());
    ((hash >> 40) as usize) & (shards - 1)
}

/// A node's place in the cluster: shard `index` of `count`, written `index/count`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, rkyv::Archive, rkyv::Serialize, rkyv::Deserialize)]
#[rkyv(derive(Debug))]
pub struct ShardId {
    /// This node's index, `0..count`.
    pub index: u32,
    /// Nodes in the cluster.
    pub count: u32,
}

/// In JSON a shard is the text `"i/n"`, as on the command line.
impl serde::Serialize for ShardId {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> serde::Deserialize<'de> for ShardId {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<ShardId, D::Error> {
        let text = <std::borrow::Cow<'de, str>>::deserialize(d)?;
        text.parse().map_err(serde::de::Error::custom)
    }
}

impl ShardId {
    /// The single-node cluster.
    pub const SOLO: ShardId = ShardId { index: 0, count: 1 };

    /// Whether this node owns a key with this hash.
    #[inline]
    pub fn owns(&self, hash: u64) -> bool {
        owner_node(hash, self.count) == self.index
    }
}

impl std::fmt::Display for ShardId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.index, self.count)
    }
}

impl std::str::FromStr for ShardId {
    type Err = String;

    /// Parses `i/n` with `0 <= i < n`.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let (i, n) = s
            .split_once('/')
            .ok_or_else(|| format!("expected I/N (e.g. 0/2), got {s:?}"))?;
        let index: u32 = i
            .trim()
            .parse()
            .map_err(|_| format!("shard index {i:?} is not a number"))?;
        let count: u32 = n
            .trim()
            .parse()
            .map_err(|_| format!("shard count {n:?} is not a number"))?;
        if count == 0 {
            return Err("shard count must be at least 1".into());
        }
        if index >= count {
            return Err(format!("shard index {index} must be below the count {count}"));
        }
        Ok(ShardId { index, count })
    }
}

#[cfg(test)]
mod tests {
    /// Redis Cluster's own examples (its specification and `CLUSTER KEYSLOT` answers).
    #[test]
    fn slots_are_redis_cluster_s() {
        use super::key_slot;
        assert_eq!(super::CRC16.checksum(b"123456789"), 0x31C3);
        assert_eq!(key_slot(b"123456789"), 12_739);
        assert_eq!(key_slot(b"somekey"), 11_058);
        assert_eq!(key_slot(b"foo"), 12_182);
        assert_eq!(key_slot(b"bar"), 5_061);
        assert_eq!(key_slot(b"hello"), 866);
        assert_eq!(key_slot(b"{user1000}.following"), key_slot(b"{user1000}.followers"));
        assert_ne!(key_slot(b"foo{}{bar}"), key_slot(b"bar"), "an empty tag: the whole key");
        assert_eq!(key_slot(b"foo{{bar}}zap"), key_slot(b"{bar"));
        assert_eq!(key_slot(b"foo{bar}{zap}"), key_slot(b"bar"));
        assert_eq!(key_slot(b""), 0);
    }

    use super::*;
    use proptest::prelude::*;

    #[test]
    fn hash_is_fixed_across_processes() {
        // Pinned values: a change here silently re-shards every deployed cluster.
        assert_eq!(key_hash(b""), 0x2d06800538d394c2);
        assert_eq!(key_hash(b"0"), xxhash_rust::xxh3::xxh3_64(b"0"));
    }

    #[test]
    fn routing_spreads_keys_evenly() {
        let n = 4;
        let mut counts = [0u32; 4];
        for i in 0..40_000u32 {
            counts[owner_node(key_hash(i.to_string().as_bytes()), n) as usize] += 1;
        }
        for c in counts {
            assert!((9_000..11_000).contains(&c), "uneven split {counts:?}");
        }
    }

    #[test]
    fn parse_shard_id() {
        assert_eq!("1/3".parse::<ShardId>(), Ok(ShardId { index: 1, count: 3 }));
        assert!("3/3".parse::<ShardId>().is_err());
        assert!("0/0".parse::<ShardId>().is_err());
        assert!("x".parse::<ShardId>().is_err());
    }

    proptest! {
        #[test]
        fn owner_is_in_range(hash: u64, nodes in 1u32..1000) {
            prop_assert!(owner_node(hash, nodes) < nodes);
        }

        #[test]
        fn exactly_one_node_owns_each_key(key: Vec<u8>, nodes in 1u32..16) {
            let h = key_hash(&key);
            let owners = (0..nodes).filter(|&i| ShardId { index: i, count: nodes }.owns(h)).count();
            prop_assert_eq!(owners, 1);
        }
    }
}
