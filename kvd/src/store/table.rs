//! A map shard's hash table: open addressing with linear probing, built so a batch can
//! overlap its cache misses.
//!
//! Why not hashbrown: a batch of independent lookups is bound by memory latency (the bucket,
//! then the entry), and hashbrown has no way to ask for a bucket's address before probing
//! it. Here [`Table::prefetch`] touches the line a key's probe will start at, so a batch
//! issues the misses of the next few ops while it finishes the current one, and
//! [`Table::prefetch_value`] does the same for the value a found slot points at.
//!
//! Layout, chosen for memory as much as speed (a record of 128 bytes should cost little more
//! than 128 bytes):
//!
//! * A slot is 32 bytes, two to a cache line and never straddling one: the key's tag, the
//!   data (one allocation), the LRU clock and the length of a long key.
//! * A key of up to 7 bytes lives in the tag itself (its bytes and its length), so the probe
//!   compares one word and never touches another line; the allocation holds only the value
//!   (128 bytes is an exact size class of the allocator kvd uses, mimalloc).
//! * A longer key's tag is a marker and 56 bits of its hash; the key is kept in front of its
//!   value in the allocation, and compared only when the tag matches.
//! * The slot count is any number (the home slot is found by multiplying, not masking), so
//!   a table preallocated for N keys is sized for N, not for the next power of two. Up to 4
//!   slots in 5 are used; the table grows by half past that.
//! * Removal shifts the following entries back (no tombstones), so a probe ends at the
//!   first empty slot however many keys came and went.
//!
//! Everything here is safe Rust except the prefetch hint, which cannot fault.
//!
//! A model-based proptest (below) holds it to `HashMap`'s behaviour.

use std::sync::atomic::{AtomicU32, Ordering};

use kvshared::keyspace::placement_position;
use kvshared::routing::key_hash;

/// Longest key kept in the tag.
const INLINE_KEY: usize = 7;
/// The tag's top byte for a key longer than [`INLINE_KEY`].
const LONG_KEY: u8 = 0xFF;
/// At most this many slots in `LOAD_DEN` hold an entry.
const LOAD_NUM: usize = 4;
const LOAD_DEN: usize = 5;
/// The fewest slots of a table that holds anything.
const MIN_SLOTS: usize = 8;
/// A probe past this many slots when placing a key marks the table crowded: its next
/// insert grows it (see [`Table::must_grow`]).
const CROWDED_PROBE: usize = 128;
/// How many slots ahead a walk over the table ([`Table::iter`], [`Table::scan`]) starts
/// loading a long key: enough misses in flight to overlap, few enough that the
/// lines are still cached when the walk gets there.
const WALK_AHEAD: usize = 8;
/// How far ahead a walk that copies whole pairs starts loading them (see [`Table::copy_hint`]).
const COPY_AHEAD: usize = 16;
/// A crowded table grows early only while it has fewer than this many times the slots its
/// entries need, so keys chosen to crowd it cost bounded memory.
const MAX_SPREAD: usize = 16;

/// One slot. Empty when `data` is `None`.
#[repr(C, align(32))]
#[derive(Default)]
struct Slot {
    /// Little-endian: a short key's bytes (zero-padded) and, in the last byte, its length;
    /// a long key: [`LONG_KEY`] in the last byte, the top 56 bits of its hash before it.
    tag: [u8; 8],
    /// The value (short key), or the key and then the value (long key).
    data: Option<Box<[u8]>>,
    /// When the entry was last read or written, on the store's LRU clock. Atomic so reads,
    /// under the shard's shared lock, can update it.
    touched: AtomicU32,
    /// A long key's length (0 for a short key).
    key_len: u32,
}

/// A stored pair, as the rest of the store sees it.
#[derive(Clone, Copy)]
pub(super) struct EntryRef<'a> {
    slot: &'a Slot,
}

impl<'a> EntryRef<'a> {
    pub(super) fn key(self) -> &'a [u8] {
        let s = self.slot;
        if s.tag[7] == LONG_KEY {
            s.data
                .as_deref()
                .and_then(|d| d.get(..s.key_len as usize))
                .unwrap_or_default()
        } else {
            s.tag.get(..s.tag[7] as usize).unwrap_or_default()
        }
    }

    pub(super) fn value(self) -> &'a [u8] {
        let s = self.slot;
        let d = s.data.as_deref().unwrap_or_default();
        d.get(s.key_len as usize..).unwrap_or_default()
    }

    /// What the entry's allocation costs (see [`data_cost`]).
    pub(super) fn cost(self) -> usize {
        data_cost(self.key().len(), self.value().len())
    }

    /// When the entry was last used.
    pub(super) fn touched(self) -> u32 {
        self.slot.touched.load(Ordering::Relaxed)
    }

    /// Marks the entry used at `now`. Written only when the clock moved, so a hot key read
    /// from several cores does not bounce its cache line on every read.
    #[inline]
    pub(super) fn touch(self, now: u32) {
        if self.slot.touched.load(Ordering::Relaxed) != now {
            self.slot.touched.store(now, Ordering::Relaxed);
        }
    }

    /// The value's first byte, to prefetch it.
    #[inline]
    fn value_ptr(self) -> *const u8 {
        let s = self.slot;
        match &s.data {
            Some(d) => d.as_ptr().wrapping_add(s.key_len as usize),
            None => std::ptr::null(),
        }
    }
}

/// What a probe looks for: the key's tag, and the key itself when it is long.
#[derive(Clone, Copy)]
struct Probe<'k> {
    tag: u64,
    key: &'k [u8],
    long: bool,
}

impl<'k> Probe<'k> {
    #[inline]
    fn new(hash: u64, key: &'k [u8]) -> Probe<'k> {
        if key.len() <= INLINE_KEY {
            // Byte by byte: at most 7, and no call to memcpy for a variable length.
            let mut tag = (key.len() as u64) << 56;
            for (j, &c) in key.iter().enumerate() {
                tag |= u64::from(c) << (8 * j);
            }
            Probe { tag, key, long: false }
        } else {
            Probe {
                tag: ((LONG_KEY as u64) << 56) | (hash >> 8),
                key,
                long: true,
            }
        }
    }

    #[inline]
    fn matches(&self, s: &Slot) -> bool {
        u64::from_le_bytes(s.tag) == self.tag
            && (!self.long
                || (s.key_len as usize == self.key.len()
                    && s.data.as_deref().and_then(|d| d.get(..self.key.len())) == Some(self.key)))
    }
}

/// The hash bits that place a key in a table (its top 56, as a long key's tag keeps them).
#[inline]
fn placement(hash: u64) -> u64 {
    hash >> 8
}

/// Issues a prefetch of the cache line holding `p` (a hint: any address is allowed).
#[inline(always)]
fn prefetch_line(p: *const u8) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: a prefetch is a hint; it never faults, whatever the address.
    unsafe {
        std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(p.cast::<i8>());
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = p;
}

/// The home slot of a key with these placement bits in a table of `slots` slots.
#[inline]
fn home_slot(placement: u64, slots: usize) -> usize {
    // Multiply-shift on mixed bits (the key's scan position): any slot count, and the bits
    // the owner node and the map shard were chosen by (the low 32, bits 40..50) are spread
    // over every slot. Slots are in position order, which a scan relies on.
    home_of_position(placement_position(placement), slots)
}

/// The home slot of a key at scan position `position`.
#[inline]
fn home_of_position(position: u32, slots: usize) -> usize {
    ((u64::from(position) * slots as u64) >> 32) as usize
}

/// Starts loading the line where the probe for `hash` begins in a table whose
/// [`Table::whereabouts`] were `(at, slots)`, read without its lock. A stale pair (the
/// table grew since) costs only a useless prefetch: nothing is read through the address.
#[inline]
pub(super) fn prefetch_at(at: usize, slots: usize, hash: u64) {
    if slots > 0 {
        let home = home_slot(placement(hash), slots);
        prefetch_line((at as *const u8).wrapping_add(home * std::mem::size_of::<Slot>()));
    }
}

/// [`Table::scan`]'s answer when the table is done.
const END: u64 = 1 << 32;

/// The table could not get memory (nothing changed).
#[derive(Debug, PartialEq, Eq)]
pub(super) struct NoMemory;

/// The hash table of one map shard.
#[derive(Default)]
pub(super) struct Table {
    slots: Box<[Slot]>,
    len: usize,
    /// A key was placed more than [`CROWDED_PROBE`] slots past its home.
    crowded: bool,
}

impl Table {
    /// An empty table with no allocation.
    pub(super) fn new() -> Table {
        Table::default()
    }

    /// Bytes of the slot array of a table made with room for `items` entries.
    pub(super) fn bytes_for(items: usize) -> usize {
        match items {
            0 => 0,
            _ => slots_for(items).saturating_mul(std::mem::size_of::<Slot>()),
        }
    }

    /// An empty table with room for `items` entries before it grows.
    pub(super) fn with_capacity(items: usize) -> Result<Table, NoMemory> {
        let mut t = Table::new();
        if items > 0 {
            t.resize(slots_for(items))?;
        }
        Ok(t)
    }

    /// Entries stored.
    pub(super) fn len(&self) -> usize {
        self.len
    }

    /// Entries it holds before the next insert makes it grow.
    pub(super) fn capacity(&self) -> usize {
        self.slots.len() * LOAD_NUM / LOAD_DEN
    }

    /// Bytes of the slot array.
    pub(super) fn allocation_size(&self) -> usize {
        std::mem::size_of_val(&*self.slots)
    }

    /// Whether the next insert of a new key grows the table first: it is full, or crowded
    /// (keys that arrive in the order of their homes, as a copy in scan order sends them,
    /// pile into one run while the table is small for them; each insert and each lookup of
    /// an absent key would walk it).
    pub(super) fn must_grow(&self) -> bool {
        self.len + 1 > self.capacity() || self.crowded
    }

    /// Forgets that the table is crowded (a capped store had no bytes to spare for it).
    pub(super) fn calm(&mut self) {
        self.crowded = false;
    }

    /// What the next growth adds, in bytes (an estimate for the memory cap).
    pub(super) fn growth_bytes(&self) -> usize {
        self.grown_slots() * std::mem::size_of::<Slot>() - self.allocation_size()
    }

    /// The slot count the next growth moves to: half again as many entries. (Doubling
    /// would leave a table that just grew a little over half full at 32 bytes a slot; a
    /// table of N entries moves each entry about three times over its life instead of
    /// twice, at a few nanoseconds each.)
    fn grown_slots(&self) -> usize {
        slots_for((self.len + 1).max(self.capacity() + self.capacity() / 2))
    }

    /// Slots, full or empty (for sampling at random).
    pub(super) fn slot_count(&self) -> usize {
        self.slots.len()
    }

    /// The entry in slot `i`, if the slot is full.
    pub(super) fn at(&self, i: usize) -> Option<EntryRef<'_>> {
        let slot = self.slots.get(i)?;
        slot.data.as_ref().map(|_| EntryRef { slot })
    }

    #[inline]
    fn home(&self, placement: u64) -> usize {
        home_slot(placement, self.slots.len())
    }

    /// Where the slot array is and how many slots it has, for [`prefetch_at`] without the
    /// shard's lock.
    pub(super) fn whereabouts(&self) -> (usize, usize) {
        (self.slots.as_ptr() as usize, self.slots.len())
    }

    /// Starts loading the line where the probe for `hash` begins (and the next, which a
    /// probe that does not end in its home line goes on into).
    #[inline]
    pub(super) fn prefetch(&self, hash: u64) {
        if self.slots.is_empty() {
            return;
        }
        let at = self.home(placement(hash));
        let p = self.slots.as_ptr().wrapping_add(at).cast::<u8>();
        prefetch_line(p);
        prefetch_line(p.wrapping_add(64));
    }

    /// Starts loading the value of the entry in slot `i` (its first two lines: a 128-byte
    /// value).
    #[inline]
    pub(super) fn prefetch_value(&self, i: usize) {
        if let Some(e) = self.at(i) {
            let p = e.value_ptr();
            prefetch_line(p);
            prefetch_line(p.wrapping_add(64));
        }
    }

    /// For a walk by slot index that copies whole pairs (a snapshot's export): starts
    /// loading the value of the slot [`COPY_AHEAD`] past `i`. Each pair is an allocation of
    /// its own, wherever the allocator put it; the copy stalls on each all the same (the
    /// machine's memory is the limit), but the steps under the shard's lock got shorter:
    /// docs/PERFORMANCE.md, "A snapshot's walk prefetched".
    #[inline]
    pub(super) fn copy_hint(&self, i: usize) {
        self.prefetch_value(i + COPY_AHEAD);
    }

    /// The slot holding `key` (whose hash is `hash`), if any.
    #[inline]
    pub(super) fn find(&self, hash: u64, key: &[u8]) -> Option<usize> {
        let n = self.slots.len();
        if self.len == 0 {
            return None;
        }
        let probe = Probe::new(hash, key);
        let mut i = self.home(placement(hash));
        loop {
            let s = self.slots.get(i)?;
            // An empty slot ends the probe: the key is absent.
            s.data.as_ref()?;
            if probe.matches(s) {
                return Some(i);
            }
            i += 1;
            if i == n {
                i = 0;
            }
        }
    }

    /// Replaces the value in slot `i`: in place when the length is unchanged (the common
    /// YCSB update). False, leaving the old value, when there is no memory for the new one
    /// or the slot is empty.
    pub(super) fn set_value(&mut self, i: usize, value: &[u8], now: u32) -> bool {
        let Some(s) = self.slots.get_mut(i) else { return false };
        let k = s.key_len as usize;
        let Some(d) = s.data.as_mut() else { return false };
        *s.touched.get_mut() = now;
        if d.len() - k == value.len() {
            d[k..].copy_from_slice(value);
            return true;
        }
        let Some(new) = allocate(&d[..k], value) else {
            return false;
        };
        *d = new;
        true
    }

    /// Stores a key known to be absent. Grows the table first if it is full or crowded
    /// (see [`Table::must_grow`]). Returns the slot, or `NoMemory` (nothing changed).
    pub(super) fn insert_new(&mut self, hash: u64, key: &[u8], value: &[u8], now: u32) -> Result<usize, NoMemory> {
        if self.must_grow() {
            self.resize(self.grown_slots())?;
        }
        let long = key.len() > INLINE_KEY;
        let data = if long {
            allocate(key, value)
        } else {
            allocate(&[], value)
        }
        .ok_or(NoMemory)?;
        let slot = Slot {
            tag: Probe::new(hash, key).tag.to_le_bytes(),
            data: Some(data),
            touched: AtomicU32::new(now),
            key_len: if long { key.len() as u32 } else { 0 },
        };
        let i = self.place(placement(hash), slot);
        self.len += 1;
        Ok(i)
    }

    /// Removes the entry in slot `i`; returns its key and value bytes (0 if it was empty).
    /// The entries after it that move back a slot or more are shown to `moved` (a copy in
    /// slot order, `export`, must see them again).
    pub(super) fn remove_at(&mut self, i: usize, mut moved: impl FnMut(&[u8])) -> usize {
        let n = self.slots.len();
        let Some(removed) = self.slots.get_mut(i).map(std::mem::take) else {
            return 0;
        };
        let Some(data) = removed.data else { return 0 };
        let freed = if removed.tag[7] == LONG_KEY {
            data.len()
        } else {
            data.len() + removed.tag[7] as usize
        };
        self.len -= 1;
        // Shift back every following entry whose probe passes the hole.
        let mut hole = i;
        let mut j = i;
        loop {
            j += 1;
            if j == n {
                j = 0;
            }
            let Some(home) = self
                .slots
                .get(j)
                .and_then(|s| self.placement_of(s))
                .map(|p| self.home(p))
            else {
                break;
            };
            // The entry at j may fill the hole when the hole lies on its probe: cyclically
            // home <= hole < j.
            if (hole + n - home) % n < (j + n - home) % n {
                let entry = std::mem::take(&mut self.slots[j]);
                moved(EntryRef { slot: &entry }.key());
                self.slots[hole] = entry;
                hole = j;
            }
        }
        freed
    }

    /// Every entry. Each step starts loading the long key of the slot [`WALK_AHEAD`] on (a
    /// walk that reads keys, to find their slots, would wait for each otherwise).
    pub(super) fn iter(&self) -> impl Iterator<Item = EntryRef<'_>> {
        self.slots.iter().enumerate().filter_map(|(i, slot)| {
            self.prefetch_data(i + WALK_AHEAD);
            slot.data.as_ref().map(|_| EntryRef { slot })
        })
    }

    /// For a walk by slot index that reads keys: starts loading the long key of the slot
    /// [`WALK_AHEAD`] past `i`.
    #[inline]
    pub(super) fn walk_hint(&self, i: usize) {
        self.prefetch_data(i + WALK_AHEAD);
    }

    /// Starts loading the first line of slot `i`'s allocation if it holds a long key (a
    /// walk reads the key; a short one is in the slot already).
    #[inline]
    fn prefetch_data(&self, i: usize) {
        if let Some(s) = self.slots.get(i)
            && s.tag[7] == LONG_KEY
            && let Some(d) = s.data.as_deref()
        {
            prefetch_line(d.as_ptr());
        }
    }

    /// One step of a scan in position order (see `kvshared::keyspace`): calls `visit` with
    /// every entry whose position is in `from..next` and returns `next` (`1 << 32`: the
    /// table is done). Walks from `from`'s home slot to an empty slot past it once `want`
    /// entries at or past `from` were seen or `16 * want` slots walked; every entry whose
    /// home lies before that empty slot is behind it, so nothing in `from..next` is missed
    /// however the table changed between steps.
    pub(super) fn scan(&self, from: u32, want: usize, mut visit: impl FnMut(EntryRef<'_>)) -> u64 {
        let n = self.slots.len();
        if self.len == 0 {
            return 1 << 32;
        }
        let start = home_of_position(from, n);
        let (mut seen, mut i) = (0usize, start);
        let next = loop {
            if i == n {
                break END;
            }
            match self.position_at(i) {
                Some(p) => seen += usize::from(p >= from),
                None if i > start && (seen >= want || i - start >= want.saturating_mul(16)) => {
                    break ((i as u64) << 32).div_ceil(n as u64);
                }
                None => {}
            }
            i += 1;
        };
        // At the end: the entries whose probe wrapped to the first slots (before `start`;
        // those from `start` on were walked).
        let wrapped = match next {
            END if start > 0 => (0..start).take_while(|&j| self.position_at(j).is_some()).count(),
            _ => 0,
        };
        for j in (start..i).chain(0..wrapped) {
            self.prefetch_data(j + WALK_AHEAD);
            if let Some(p) = self.position_at(j)
                && u64::from(p) >= u64::from(from)
                && u64::from(p) < next
            {
                visit(EntryRef { slot: &self.slots[j] });
            }
        }
        next
    }

    /// The scan position of the key in slot `i` (`None`: empty).
    fn position_at(&self, i: usize) -> Option<u32> {
        self.placement_of(self.slots.get(i)?).map(placement_position)
    }

    /// The placement bits of a full slot's key (`None` for an empty slot).
    fn placement_of(&self, s: &Slot) -> Option<u64> {
        s.data.as_ref()?;
        Some(if s.tag[7] == LONG_KEY {
            u64::from_le_bytes(s.tag) & ((1 << 56) - 1)
        } else {
            placement(key_hash(EntryRef { slot: s }.key()))
        })
    }

    /// Puts `slot` in the first empty slot of its probe (the table has room); a long probe
    /// marks the table crowded.
    fn place(&mut self, placement: u64, slot: Slot) -> usize {
        let n = self.slots.len();
        let mut i = self.home(placement);
        let mut probed = 0;
        while self.slots[i].data.is_some() {
            i += 1;
            probed += 1;
            if i == n {
                i = 0;
            }
        }
        if probed > CROWDED_PROBE && self.grown_slots() <= MAX_SPREAD.saturating_mul(slots_for(self.len + 1)) {
            self.crowded = true;
        }
        self.slots[i] = slot;
        i
    }

    /// Moves every entry into a table of `slots` slots.
    fn resize(&mut self, slots: usize) -> Result<(), NoMemory> {
        let mut fresh: Vec<Slot> = Vec::new();
        fresh.try_reserve_exact(slots).map_err(|_| NoMemory)?;
        fresh.resize_with(slots, Slot::default);
        let old = std::mem::replace(&mut self.slots, fresh.into_boxed_slice());
        self.crowded = false;
        for s in old.into_vec() {
            if let Some(p) = self.placement_of(&s) {
                self.place(p, s);
            }
        }
        Ok(())
    }
}

/// Slots for `items` entries at the highest load allowed.
fn slots_for(items: usize) -> usize {
    (items.saturating_mul(LOAD_DEN).div_ceil(LOAD_NUM)).max(MIN_SLOTS)
}

/// What the allocation of an entry with these lengths costs, as mimalloc hands it out: the
/// bytes allocated (the value, and a long key) rounded up to the allocator's size class
/// (16-byte steps up to 64, then four classes per doubling: ..., 112, 128, 160, 192, ...).
/// An empty allocation costs nothing.
/// What one entry costs a table: its slot and its allocation (Redis's `MEMORY USAGE`; a
/// deadline, when set, adds `expires::deadline_cost`).
pub fn entry_bytes(key_len: usize, value_len: usize) -> usize {
    std::mem::size_of::<Slot>() + data_cost(key_len, value_len)
}

pub(super) fn data_cost(key_len: usize, value_len: usize) -> usize {
    let bytes = if key_len > INLINE_KEY {
        key_len + value_len
    } else {
        value_len
    };
    size_class(bytes)
}

fn size_class(bytes: usize) -> usize {
    if bytes == 0 {
        return 0;
    }
    let words = bytes.div_ceil(8);
    let words = if words <= 8 {
        words.div_ceil(2).max(1) * 2
    } else {
        let step = 1usize << ((usize::BITS - 1 - (words - 1).leading_zeros()) - 2);
        words.div_ceil(step) * step
    };
    words * 8
}

/// One allocation of `key` then `value`, or `None` when there is no memory.
fn allocate(key: &[u8], value: &[u8]) -> Option<Box<[u8]>> {
    let mut data = Vec::new();
    data.try_reserve_exact(key.len() + value.len()).ok()?;
    data.extend_from_slice(key);
    data.extend_from_slice(value);
    Some(data.into_boxed_slice())
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use proptest::prelude::*;

    use super::*;

    #[derive(Debug, Clone)]
    enum Op {
        Insert(Vec<u8>, Vec<u8>),
        Remove(Vec<u8>),
        Get(Vec<u8>),
    }

    fn key() -> impl Strategy<Value = Vec<u8>> {
        // Mostly a small key space (so ops meet), short and long keys, some that differ
        // only past the inline length.
        prop_oneof![
            (0u8..40).prop_map(|i| i.to_string().into_bytes()),
            (0u8..20).prop_map(|i| format!("a-long-key-{i}").into_bytes()),
            proptest::collection::vec(any::<u8>(), 0..12),
        ]
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            4 => (key(), proptest::collection::vec(any::<u8>(), 0..40)).prop_map(|(k, v)| Op::Insert(k, v)),
            2 => key().prop_map(Op::Remove),
            2 => key().prop_map(Op::Get),
        ]
    }

    proptest! {
        /// The table behaves as a `HashMap` under any sequence of puts, removes and gets,
        /// through growth and backward-shift removal.
        #[test]
        fn behaves_like_a_hashmap(ops in proptest::collection::vec(op(), 0..400), prealloc in 0usize..50) {
            let mut t = Table::with_capacity(prealloc).unwrap();
            let mut model: HashMap<Vec<u8>, Vec<u8>> = HashMap::new();
            for op in ops {
                match op {
                    Op::Insert(k, v) => {
                        let h = key_hash(&k);
                        match t.find(h, &k) {
                            Some(i) => prop_assert!(t.set_value(i, &v, 1)),
                            None => { t.insert_new(h, &k, &v, 1).unwrap(); }
                        }
                        model.insert(k, v);
                    }
                    Op::Remove(k) => {
                        let found = t.find(key_hash(&k), &k);
                        let removed = found.map(|i| t.remove_at(i, |_| {}));
                        let expected = model.remove(&k);
                        prop_assert_eq!(found.is_some(), expected.is_some());
                        if let (Some(bytes), Some(v)) = (removed, expected) {
                            prop_assert_eq!(bytes, k.len() + v.len());
                        }
                    }
                    Op::Get(k) => {
                        let got = t.find(key_hash(&k), &k).and_then(|i| t.at(i)).map(|e| e.value().to_vec());
                        prop_assert_eq!(got.as_ref(), model.get(&k));
                    }
                }
                prop_assert_eq!(t.len(), model.len());
                prop_assert!(t.len() <= t.capacity());
            }
            // Every entry is found again, and iteration yields exactly the model.
            for (k, v) in &model {
                let i = t.find(key_hash(k), k);
                prop_assert!(i.is_some(), "lost {:?}", k);
                let e = t.at(i.unwrap()).unwrap();
                prop_assert_eq!(e.key(), &k[..]);
                prop_assert_eq!(e.value(), &v[..]);
            }
            let mut seen: Vec<(Vec<u8>, Vec<u8>)> = t.iter().map(|e| (e.key().to_vec(), e.value().to_vec())).collect();
            let mut want: Vec<(Vec<u8>, Vec<u8>)> = model.into_iter().collect();
            seen.sort();
            want.sort();
            prop_assert_eq!(seen, want);
        }
    }

    #[test]
    fn collisions_in_one_home_slot_survive_removal_from_the_middle() {
        // A tiny table so that probes wrap and cluster.
        let mut t = Table::with_capacity(6).unwrap();
        let keys: Vec<Vec<u8>> = (0..6).map(|i: u32| format!("k{i}").into_bytes()).collect();
        for k in &keys {
            t.insert_new(key_hash(k), k, k, 0).unwrap();
        }
        for (n, k) in keys.iter().enumerate() {
            let i = t.find(key_hash(k), k).unwrap();
            assert_eq!(t.remove_at(i, |_| {}), 2 * k.len());
            for later in &keys[n + 1..] {
                assert!(t.find(key_hash(later), later).is_some(), "{later:?} lost");
            }
        }
        assert_eq!(t.len(), 0);
    }

    /// Keys that arrive in the order of their homes (a copy in scan order: a slot move's
    /// pages, an import, a client copying another node's SCAN) do not pile into one run of a
    /// small table that each insert walks: a long probe grows the table early.
    #[test]
    fn keys_in_scan_order_do_not_pile_into_one_run() {
        let mut keys: Vec<(u64, Vec<u8>)> = (0..40_000)
            .map(|i| format!("user{i}").into_bytes())
            .map(|k| (key_hash(&k), k))
            .collect();
        keys.sort_by_key(|(h, _)| placement_position(placement(*h)));
        let mut t = Table::new();
        let mut walked = 0;
        for (h, k) in &keys {
            let at = t.insert_new(*h, k, b"v", 0).unwrap();
            let home = t.home(placement(*h));
            walked += (at + t.slot_count() - home) % t.slot_count();
        }
        let mean = walked as f64 / keys.len() as f64;
        assert!(
            mean < CROWDED_PROBE as f64,
            "each insert walked {mean:.0} slots past its home on average"
        );
        assert!(t.slot_count() <= slots_for(2 * keys.len()), "{} slots", t.slot_count());
        for (h, k) in &keys {
            assert!(t.find(*h, k).is_some());
        }
    }

    /// Keys chosen to crowd one home grow a table to at most `MAX_SPREAD` times the slots
    /// they need, however long their run.
    #[test]
    fn keys_crowding_one_home_cost_bounded_slots() {
        let mut t = Table::new();
        let mut n = 0;
        // About 1,000 keys whose homes are in the first 1/1024 of any table.
        for i in 0..1_000_000u64 {
            let k = i.to_le_bytes();
            let h = key_hash(&k);
            if placement_position(placement(h)) >= 1 << 22 {
                continue;
            }
            t.insert_new(h, &k, b"", 0).unwrap();
            n += 1;
        }
        assert!(n > 4 * CROWDED_PROBE, "{n} keys");
        assert!(
            t.slot_count() <= MAX_SPREAD * slots_for(n + 1),
            "{} slots for {n} keys",
            t.slot_count()
        );
    }

    #[test]
    fn costs_follow_mimallocs_size_classes() {
        assert_eq!(data_cost(6, 0), 0);
        assert_eq!(data_cost(6, 1), 16);
        assert_eq!(data_cost(6, 64), 64);
        assert_eq!(data_cost(6, 65), 80);
        assert_eq!(data_cost(6, 128), 128);
        assert_eq!(data_cost(6, 129), 160);
        assert_eq!(data_cost(8, 128), 160);
        assert_eq!(data_cost(0, 1000), 1024);
        assert_eq!(data_cost(0, 1025), 1280);
    }

    #[test]
    fn a_slot_is_half_a_cache_line() {
        assert_eq!(std::mem::size_of::<Slot>(), 32);
        assert_eq!(std::mem::align_of::<Slot>(), 32);
        // A table for 1,000 keys takes 1,250 slots, not a power of two.
        assert_eq!(Table::with_capacity(1000).unwrap().slot_count(), 1250);
    }
}
