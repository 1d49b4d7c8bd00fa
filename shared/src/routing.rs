//! Key hashing and routing: which node owns a key, and which internal map shard holds it.
//!
//! Two functions of a key, each fixed and documented so that every client and server, in any
//! language, agrees on placement forever:
//!
//! * **Which node**: the key's Redis Cluster hash slot, `key_slot(key)` = CRC-16/XMODEM of the
//!   key (or of its `{hash tag}`) mod 16,384, then the slot's owner. A cluster started as
//!   `--shard i/n` splits the slots into n contiguous, even ranges: `slot_owner(slot, n) =
//!   (slot * n) >> 14`. `owner_node(key, n)` is the two together.
//! * **Where inside the node**: `key_hash(key) = xxh3_64(key)` with seed 0, for the node's own
//!   hash table; `map_shard(hash, shards) = (hash >> 40) & (shards - 1)`: bits 40.. pick the
//!   internal shard.
//!
//! The bit ranges of `key_hash` are disjoint on purpose. The store's hash table uses the low
//! bits for bucket positions and the top 7 bits as tags; if the shard were chosen from the low
//! bits, every key in a shard would share them and crowd into a fraction of that shard's
//! buckets. The slot is a separate hash so that a map shard holds keys of every slot.

/// The fixed hash of a key inside a node (its table and map shard). Both sides call this;
/// nothing else hashes keys for placement inside a node.
#[inline]
pub fn key_hash(key: &[u8]) -> u64 {
    xxhash_rust::xxh3::xxh3_64(key)
}

/// The node (0-based) that owns `key` in a cluster of `nodes` nodes started with the even
/// split: `slot_owner(key_slot(key), nodes)`.
///
/// `nodes` must be at least 1 and at most [`SLOTS`].
#[inline]
pub fn owner_node(key: &[u8], nodes: u32) -> u32 {
    slot_owner(key_slot(key), nodes)
}

/// The node that owns `slot` when `nodes` nodes split the slots evenly into contiguous
/// ranges, in order (node 0 the lowest slots): `(slot * nodes) >> 14`, no division.
#[inline]
pub fn slot_owner(slot: u16, nodes: u32) -> u32 {
    (u32::from(slot) * nodes) >> SLOT_BITS
}

/// The slots node `index` of `nodes` owns in the even split: the first and the last.
pub fn owned_slots(index: u32, nodes: u32) -> (u16, u16) {
    // The smallest slot s with s * nodes >= i << 14, for i = index and index + 1.
    let first = |i: u32| (i << SLOT_BITS).div_ceil(nodes.max(1));
    (first(index) as u16, (first(index + 1) - 1) as u16)
}

/// Redis Cluster's hash slot count.
pub const SLOTS: u16 = 16_384;

/// A cluster member's node id as Redis Cluster shows it (`CLUSTER NODES`, `MYID`): 40 hex
/// digits, made from its kvd address as `--nodes` names it, so every node computes the same
/// id for a member without asking it.
pub fn node_id(addr: &str) -> String {
    let wide = xxhash_rust::xxh3::xxh3_128(addr.as_bytes());
    format!("{wide:032x}{:08x}", key_hash(addr.as_bytes()) as u32)
}
/// `SLOTS` is `1 << SLOT_BITS`.
const SLOT_BITS: u32 = 14;

/// CRC-16/XMODEM, Redis Cluster's slot hash, from `crc`: byte at a time for short keys, 16
/// bytes at a time (an 8 KiB table) from 16 bytes on (`cargo bench -p kvshared --bench
/// routing`: a 23-byte key 75 -> 33 ns; a 6-byte key is faster byte at a time).
static CRC16: crc::Crc<u16> = crc::Crc::<u16>::new(&crc::CRC_16_XMODEM);
static CRC16_WIDE: crc::Crc<u16, crc::Table<16>> = crc::Crc::<u16, crc::Table<16>>::new(&crc::CRC_16_XMODEM);

/// A key's Redis Cluster hash slot: CRC-16/XMODEM of the key mod 16,384, or of its hash
/// tag, the bytes between the first `{` and the first `}` after it when there are any
/// (`{user1000}.following` and `{user1000}.followers` share a slot). What `CLUSTER
/// KEYSLOT` answers, and what every client and server routes by.
#[inline]
pub fn key_slot(key: &[u8]) -> u16 {
    let tagged = key.iter().position(|&b| b == b'{').and_then(|open| {
        let rest = key.get(open + 1..)?;
        let close = rest.iter().position(|&b| b == b'}')?;
        rest.get(..close).filter(|tag| !tag.is_empty())
    });
    let hashed = tagged.unwrap_or(key);
    let crc = match hashed.len() {
        0..16 => CRC16.checksum(hashed),
        _ => CRC16_WIDE.checksum(hashed),
    };
    crc % SLOTS
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

    /// Whether this node owns `slot` (in the even split `--shard i/n` starts with).
    #[inline]
    pub fn owns(&self, slot: u16) -> bool {
        slot_owner(slot, self.count) == self.index
    }

    /// The slots this node owns: the first and the last.
    pub fn slots(&self) -> (u16, u16) {
        owned_slots(self.index, self.count)
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
        if count > u32::from(SLOTS) {
            return Err(format!(
                "shard count {count} is more than the {SLOTS} hash slots: each shard owns at least one"
            ));
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
        let long = b"a key longer than sixteen bytes, {and a tag";
        assert_eq!(super::CRC16_WIDE.checksum(long), super::CRC16.checksum(long));
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
            counts[owner_node(i.to_string().as_bytes(), n) as usize] += 1;
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
        assert!("0/16384".parse::<ShardId>().is_ok());
        assert!("0/16385".parse::<ShardId>().is_err());
    }

    /// Contiguous and even (Redis's `--cluster create` gives 3 nodes 0-5460, 5461-10922 and
    /// 10923-16383: one slot apart).
    #[test]
    fn the_even_split_is_contiguous_and_redis_like() {
        let three: Vec<_> = (0..3).map(|i| owned_slots(i, 3)).collect();
        assert_eq!(three, [(0, 5461), (5462, 10922), (10923, 16383)]);
        assert_eq!(owned_slots(0, 1), (0, 16383));
    }

    proptest! {
        #[test]
        fn owner_is_in_range(slot in 0..SLOTS, nodes in 1u32..=16_384) {
            prop_assert!(slot_owner(slot, nodes) < nodes);
        }

        #[test]
        fn exactly_one_node_owns_each_key(key: Vec<u8>, nodes in 1u32..16) {
            let slot = key_slot(&key);
            let owners = (0..nodes).filter(|&i| ShardId { index: i, count: nodes }.owns(slot)).count();
            prop_assert_eq!(owners, 1);
        }

        /// `owned_slots` is exactly the slots `slot_owner` gives the node, never empty.
        #[test]
        fn owned_ranges_agree_with_the_owner(nodes in 1u32..=16_384, pick: u32) {
            let index = pick % nodes;
            let (first, last) = owned_slots(index, nodes);
            prop_assert!(first <= last && last < SLOTS);
            prop_assert_eq!(slot_owner(first, nodes), index);
            prop_assert_eq!(slot_owner(last, nodes), index);
            if first > 0 { prop_assert_eq!(slot_owner(first - 1, nodes), index - 1); }
            if last < SLOTS - 1 { prop_assert_eq!(slot_owner(last + 1, nodes), index + 1); }
        }
    }
}
