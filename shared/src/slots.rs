//! The slot map: which shard group owns each of the 16,384 hash slots, since which epoch,
//! and where a slot being handed over stands. One table type serves a node (its own slots'
//! states, and the last owner it heard of for the others) and a client (owners only).
//!
//! A slot changes hands in four log entries, two in each group (see docs/CLUSTER.md and
//! REPLICATION.md, "moving slots"): the target starts **importing** it (whatever it held of
//! the slot is dropped; only the migration's `Load` ops may write it, the rest are redirected
//! to the source) and the keys are copied while the source serves, the source **freezes** it
//! (reads still served, writes answered "try again") and the keys written since are copied,
//! the source marks it **gone** to the target at the import's epoch (and drops its keys), and
//! the target **owns** it at that epoch. At every moment at most one group serves the slot, and every
//! step is idempotent, so an interrupted move is finished by running it again.
//!
//! Every decoder here reads bytes from a peer or a file: lengths are checked, nothing panics.

use std::sync::atomic::{AtomicU16, AtomicU32, AtomicU64, Ordering};

use crate::routing::{SLOTS, ShardId, slot_owner};

/// Where a slot stands at a node.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum SlotState {
    /// This node's group serves the slot.
    Owned = 0,
    /// This group still owns the slot and serves its reads, but refuses its writes ("try
    /// again"): it is being handed over.
    Frozen = 1,
    /// The slot is being copied into this group: only `Load` ops write it; the rest are
    /// redirected to the group that serves it meanwhile (the entry's owner: the source), or
    /// answered "try again" once the hand-over is under way (the entry names this group).
    Importing = 2,
    /// Another group owns the slot (the entry's owner, as of its epoch).
    Gone = 3,
}

impl SlotState {
    #[inline]
    fn from_u8(b: u8) -> Option<SlotState> {
        match b {
            0 => Some(SlotState::Owned),
            1 => Some(SlotState::Frozen),
            2 => Some(SlotState::Importing),
            3 => Some(SlotState::Gone),
            _ => None,
        }
    }

    /// The state's name, as `kvd admin slots` prints it.
    pub fn as_str(self) -> &'static str {
        match self {
            SlotState::Owned => "owned",
            SlotState::Frozen => "frozen",
            SlotState::Importing => "importing",
            SlotState::Gone => "gone",
        }
    }
}

/// One slot's entry: its state here, the group that owns it, and the epoch of the change
/// that made it so (0: the even split the cluster started with).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Slot {
    /// Where it stands at this node.
    pub state: SlotState,
    /// The owning group's index: this node's own while owned or frozen; while importing,
    /// the group it is copied from, which serves it meanwhile, or this node's own once the
    /// hand-over is under way (the source frozen).
    pub owner: u16,
    /// The epoch of the last change of owner.
    pub epoch: u32,
}

impl Slot {
    fn pack(self) -> u64 {
        (u64::from(self.state as u8) << 48) | (u64::from(self.owner) << 32) | u64::from(self.epoch)
    }

    #[inline]
    fn unpack(bits: u64) -> Option<Slot> {
        Some(Slot {
            state: SlotState::from_u8((bits >> 48) as u8)?,
            owner: (bits >> 32) as u16,
            epoch: bits as u32,
        })
    }
}

/// What a node answers an op on a slot: serve it, or send the client elsewhere.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Run it here.
    Serve,
    /// Another group owns the slot (as of `epoch`).
    Moved {
        /// The owning group.
        owner: u16,
        /// The epoch of that ownership.
        epoch: u32,
    },
    /// The slot is being handed over: not run, send it again shortly.
    TryAgain,
}

/// The owner, epoch and state of every slot, read without a lock; changes are serialised.
pub struct SlotTable {
    cells: Box<[AtomicU64]>,
    /// What the hot path reads: one bit per slot whose reads this node serves (owned or
    /// frozen), and one per slot whose writes it serves (owned); 4 KiB, in the L1 cache,
    /// where the cells are 128 KiB. Kept in step with the cells by every change.
    served: Served,
    /// Each slot's owner (32 KiB): what a client routes by.
    owners: Box<[AtomicU16]>,
    /// Held by every change, so the cells and the bits agree once it is done.
    writer: parking_lot::Mutex<()>,
    /// Bumped after every change (after its cells and bits): a batch that read it before
    /// checking its slots compares it again under each map shard's lock, and checks again if
    /// it moved.
    changes: AtomicU64,
    /// This node's group ([`NO_GROUP`] in a client's table): an importing slot whose entry
    /// names it is being handed over ("try again"); one naming another group is served by
    /// that group meanwhile (`Moved`).
    me: u16,
}

/// The `me` of a client's table: it is no group.
const NO_GROUP: u16 = u16::MAX;

/// Per slot, whether this node serves its reads and its writes; and how many of each, so
/// a node that serves every slot need not compute an op's slot at all.
struct Served {
    reads: Box<[AtomicU64]>,
    writes: Box<[AtomicU64]>,
    read_count: AtomicU32,
    write_count: AtomicU32,
}

impl Served {
    const WORDS: usize = SLOTS as usize / 64;

    fn new() -> Served {
        Served {
            reads: (0..Self::WORDS).map(|_| AtomicU64::new(0)).collect(),
            writes: (0..Self::WORDS).map(|_| AtomicU64::new(0)).collect(),
            read_count: AtomicU32::new(0),
            write_count: AtomicU32::new(0),
        }
    }

    /// Whether `slot`'s reads (or writes) are served here.
    #[inline]
    fn has(&self, slot: u16, write: bool) -> bool {
        let words = if write { &self.writes } else { &self.reads };
        words
            .get(usize::from(slot) / 64)
            .is_some_and(|w| w.load(Ordering::Acquire) & (1 << (slot % 64)) != 0)
    }

    /// Whether every slot's reads (or writes) are served here.
    #[inline]
    fn all(&self, write: bool) -> bool {
        let count = if write { &self.write_count } else { &self.read_count };
        count.load(Ordering::Acquire) == u32::from(SLOTS)
    }

    /// Sets or clears `slot`'s bit in `words`, counting the change.
    fn mark(words: &[AtomicU64], count: &AtomicU32, slot: u16, on: bool) {
        let Some(w) = words.get(usize::from(slot) / 64) else {
            return;
        };
        let bit = 1u64 << (slot % 64);
        let was = match on {
            true => w.fetch_or(bit, Ordering::AcqRel),
            false => w.fetch_and(!bit, Ordering::AcqRel),
        } & bit
            != 0;
        match (was, on) {
            (false, true) => count.fetch_add(1, Ordering::AcqRel),
            (true, false) => count.fetch_sub(1, Ordering::AcqRel),
            _ => 0,
        };
    }

    /// Brings `slot`'s bits to what state `state` means (the caller holds the writer lock).
    fn update(&self, slot: u16, state: SlotState) {
        let (read, write) = match state {
            SlotState::Owned => (true, true),
            SlotState::Frozen => (true, false),
            SlotState::Importing | SlotState::Gone => (false, false),
        };
        Self::mark(&self.reads, &self.read_count, slot, read);
        Self::mark(&self.writes, &self.write_count, slot, write);
    }
}

impl SlotTable {
    /// The even split of `--shard i/n`, seen from shard `me`: its range owned, every other
    /// slot gone to its even-split owner at epoch 0.
    pub fn for_shard(me: ShardId) -> SlotTable {
        let cells = (0..SLOTS)
            .map(|s| {
                let owner = slot_owner(s, me.count) as u16;
                let state = match me.owns(s) {
                    true => SlotState::Owned,
                    false => SlotState::Gone,
                };
                AtomicU64::new(Slot { state, owner, epoch: 0 }.pack())
            })
            .collect();
        let table = SlotTable {
            cells,
            served: Served::new(),
            owners: (0..SLOTS).map(|_| AtomicU16::new(0)).collect(),
            writer: parking_lot::Mutex::new(()),
            changes: AtomicU64::new(0),
            me: me.index as u16,
        };
        table.derive_served();
        table
    }

    /// Sets every slot's served bits and owner from its cell (after a constructor wrote the
    /// cells).
    fn derive_served(&self) {
        let _writer = self.writer.lock();
        for (s, (cell, owner)) in self.cells.iter().zip(self.owners.iter()).enumerate() {
            if let Some(slot) = Slot::unpack(cell.load(Ordering::Acquire)) {
                self.served.update(s as u16, slot.state);
                owner.store(slot.owner, Ordering::Release);
            }
        }
    }

    /// The table of a group added to a running cluster of `before` groups (`--no-slots`):
    /// it owns nothing; every slot is gone to its owner in the even split of `before`.
    pub fn joining(before: u32, me: u16) -> SlotTable {
        let mut table = SlotTable::for_client(before);
        table.me = me;
        for cell in table.cells.iter() {
            if let Some(slot) = Slot::unpack(cell.load(Ordering::Relaxed)) {
                cell.store(
                    Slot {
                        state: SlotState::Gone,
                        ..slot
                    }
                    .pack(),
                    Ordering::Relaxed,
                );
            }
        }
        table.derive_served();
        table
    }

    /// A client's table of a cluster of `groups` groups before it has heard of any move:
    /// the even split (every slot `Owned` by its owner: a client has no state of its own).
    pub fn for_client(groups: u32) -> SlotTable {
        let mut table = SlotTable::for_shard(ShardId {
            index: 0,
            count: groups.max(1),
        });
        table.me = NO_GROUP;
        for cell in table.cells.iter() {
            let bits = cell.load(Ordering::Relaxed);
            if let Some(slot) = Slot::unpack(bits) {
                cell.store(
                    Slot {
                        state: SlotState::Owned,
                        ..slot
                    }
                    .pack(),
                    Ordering::Relaxed,
                );
            }
        }
        table.derive_served();
        table
    }

    /// A table holding `entries` (slot order; slots past their end as a one-group client's).
    pub fn from_entries(entries: &[Slot]) -> SlotTable {
        let table = SlotTable::for_client(1);
        for (s, e) in entries.iter().take(usize::from(SLOTS)).enumerate() {
            table.set(s as u16, *e);
        }
        table
    }

    /// Slot `slot`'s entry (a slot past the end reads as gone to group 0 at epoch 0).
    #[inline]
    pub fn get(&self, slot: u16) -> Slot {
        let bits = self
            .cells
            .get(usize::from(slot))
            .map_or(0, |c| c.load(Ordering::Acquire));
        Slot::unpack(bits).unwrap_or(Slot {
            state: SlotState::Gone,
            owner: 0,
            epoch: 0,
        })
    }

    /// The group that owns `slot`, as far as this table knows.
    #[inline]
    pub fn owner(&self, slot: u16) -> u16 {
        self.owners
            .get(usize::from(slot))
            .map_or(0, |o| o.load(Ordering::Acquire))
    }

    /// What this node does with an op on `slot`: `write` for ops that change the store,
    /// `load` for a migration's copy.
    #[inline]
    pub fn verdict(&self, slot: u16, write: bool, load: bool) -> Verdict {
        if !load && self.served.has(slot, write) {
            return Verdict::Serve;
        }
        verdict_of(self.get(slot), write, load, self.me)
    }

    /// Whether this node serves every slot's reads (or, `write`, writes): an op on any key
    /// is served, whatever its slot, unless it is a migration's `Load` (see
    /// [`SlotTable::verdict`]). A single node, or a group owning the whole map, skips
    /// computing slots on its hot path.
    #[inline]
    pub fn serves_all(&self, write: bool) -> bool {
        self.served.all(write)
    }

    /// Sets slot `slot`'s entry and its served bits (then counts a change: see `changes`).
    pub fn set(&self, slot: u16, entry: Slot) {
        if let Some(cell) = self.cells.get(usize::from(slot)) {
            let _writer = self.writer.lock();
            cell.store(entry.pack(), Ordering::Release);
            self.served.update(slot, entry.state);
            if let Some(owner) = self.owners.get(usize::from(slot)) {
                owner.store(entry.owner, Ordering::Release);
            }
            self.changes.fetch_add(1, Ordering::AcqRel);
        }
    }

    /// How many changes the table has seen (see `changes`).
    #[inline]
    pub fn changes(&self) -> u64 {
        self.changes.load(Ordering::Acquire)
    }

    /// A client heard that `owner` owns `slot` as of `epoch` (a redirect): it believes it
    /// unless it knows of a later epoch. Returns whether the table changed.
    pub fn learn(&self, slot: u16, owner: u16, epoch: u32) -> bool {
        let now = self.get(slot);
        if epoch < now.epoch || (owner == now.owner && epoch == now.epoch) {
            return false;
        }
        self.set(slot, Slot { owner, epoch, ..now });
        true
    }

    /// The highest epoch in the table.
    pub fn max_epoch(&self) -> u32 {
        (0..SLOTS).map(|s| self.get(s).epoch).max().unwrap_or(0)
    }

    /// Every slot's entry, in slot order.
    pub fn entries(&self) -> Vec<Slot> {
        (0..SLOTS).map(|s| self.get(s)).collect()
    }

    /// The slots whose entries `keep` accepts, as inclusive ranges in order.
    pub fn ranges(&self, keep: impl Fn(Slot) -> bool) -> Vec<[u16; 2]> {
        let mut out: Vec<[u16; 2]> = Vec::new();
        for s in 0..SLOTS {
            if !keep(self.get(s)) {
                continue;
            }
            match out.last_mut() {
                Some(r) if r[1] + 1 == s => r[1] = s,
                _ => out.push([s, s]),
            }
        }
        out
    }

    /// The slots frozen and importing here, and the highest epoch (for stats; `taken` is
    /// the store's to fill in).
    pub fn moves(&self) -> crate::stats::SlotMoves {
        let mut m = crate::stats::SlotMoves::default();
        for s in 0..SLOTS {
            let e = self.get(s);
            m.epoch = m.epoch.max(e.epoch);
            match e.state {
                SlotState::Frozen => m.frozen += 1,
                SlotState::Importing => m.importing += 1,
                SlotState::Owned | SlotState::Gone => {}
            }
        }
        m
    }

    /// The ranges this node's group serves (owned or frozen).
    pub fn served(&self) -> Vec<[u16; 2]> {
        self.ranges(|s| matches!(s.state, SlotState::Owned | SlotState::Frozen))
    }

    /// Appends the table: 16,384 little-endian `u64`s (state, owner, epoch packed).
    pub fn encode(&self, out: &mut Vec<u8>) {
        out.reserve(ENCODED_LEN);
        for cell in self.cells.iter() {
            out.extend_from_slice(&cell.load(Ordering::Acquire).to_le_bytes());
        }
    }

    /// Replaces the table with an encoded one (see [`SlotTable::encode`]), refusing bytes
    /// that are not one.
    pub fn load(&self, bytes: &[u8]) -> Result<(), String> {
        if bytes.len() != ENCODED_LEN {
            return Err(format!("a slot table is {ENCODED_LEN} bytes, not {}", bytes.len()));
        }
        let entries = decode_entries(bytes)?;
        for (s, e) in entries.into_iter().enumerate() {
            self.set(s as u16, e);
        }
        Ok(())
    }
}

/// What a node whose entry for a slot is `s` does with an op on it (see
/// [`SlotTable::verdict`]).
fn verdict_of(s: Slot, write: bool, load: bool, me: u16) -> Verdict {
    match (s.state, write, load) {
        (SlotState::Gone, ..) => Verdict::Moved {
            owner: s.owner,
            epoch: s.epoch,
        },
        (SlotState::Importing, _, true) => Verdict::Serve,
        // Copied here while its source serves it: sent there, at an epoch just below the
        // import's, so a client that has heard of the hand-over is not sent back. (Once
        // the hand-over is under way the entry names this group: "try again", below.)
        (SlotState::Importing, _, false) if s.owner != me => Verdict::Moved {
            owner: s.owner,
            epoch: s.epoch.saturating_sub(1),
        },
        (SlotState::Owned, ..) | (SlotState::Frozen, false, false) => match load {
            true => Verdict::TryAgain,
            false => Verdict::Serve,
        },
        _ => Verdict::TryAgain,
    }
}

/// A node counts one op in this many in its per-slot load (`OpKind::SlotLoad`): every
/// sixteenth op it runs, whatever batches they came in. (Counting every op of one batch in
/// sixteen gave a group that gets few, full batches a handful of samples per interval, in
/// steps of a batch: a data group serving 7% of the ops read as 2-10%, and a plan that
/// took it for idle gave it more than the mean.)
pub const SLOT_LOAD_SAMPLE_EVERY: u32 = 16;

/// A node's per-slot load counters as `OpKind::SlotLoad` answers them (16,384
/// little-endian `u32`s); `None` for bytes of any other length.
pub fn decode_load_counts(bytes: &[u8]) -> Option<Vec<u32>> {
    if bytes.len() != usize::from(SLOTS) * 4 {
        return None;
    }
    Some(
        bytes
            .chunks_exact(4)
            .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect(),
    )
}

/// Bytes of an encoded table.
pub const ENCODED_LEN: usize = SLOTS as usize * 8;

/// Reads an encoded table's entries (see [`SlotTable::encode`]).
pub fn decode_entries(bytes: &[u8]) -> Result<Vec<Slot>, String> {
    if bytes.len() != ENCODED_LEN {
        return Err(format!("a slot table is {ENCODED_LEN} bytes, not {}", bytes.len()));
    }
    bytes
        .chunks_exact(8)
        .enumerate()
        .map(|(s, c)| {
            let bits = u64::from_le_bytes(c.try_into().unwrap_or_default());
            Slot::unpack(bits).ok_or_else(|| format!("slot {s}: unknown state {}", bits >> 48))
        })
        .collect()
}

/// A change of slots at one node: the value of a `SlotSet` op (see the module's notes for
/// which changes a node accepts).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SlotChange {
    /// The slots, as inclusive ranges.
    pub ranges: Vec<[u16; 2]>,
    /// Their new state.
    pub to: SlotState,
    /// The owning group after the change.
    pub owner: u16,
    /// The epoch of the change.
    pub epoch: u32,
}

/// Most ranges one change may name.
pub const MAX_RANGES: usize = SLOTS as usize;

impl SlotChange {
    /// Its bytes: state u8, owner u16, epoch u32, then each range as two u16 (little-endian).
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(7 + 4 * self.ranges.len());
        out.push(self.to as u8);
        out.extend_from_slice(&self.owner.to_le_bytes());
        out.extend_from_slice(&self.epoch.to_le_bytes());
        encode_ranges(&self.ranges, &mut out);
        out
    }

    /// Reads one; `None` unless the bytes are exactly one with valid, ordered ranges.
    pub fn decode(bytes: &[u8]) -> Option<SlotChange> {
        let (head, rest) = bytes.split_at_checked(7)?;
        let to = SlotState::from_u8(head[0])?;
        let owner = u16::from_le_bytes([head[1], head[2]]);
        let epoch = u32::from_le_bytes([head[3], head[4], head[5], head[6]]);
        Some(SlotChange {
            ranges: decode_ranges(rest)?,
            to,
            owner,
            epoch,
        })
    }

    /// Every slot the change names.
    pub fn slots(&self) -> impl Iterator<Item = u16> + '_ {
        self.ranges.iter().flat_map(|[a, b]| *a..=*b)
    }
}

/// Appends slot ranges: each as two little-endian `u16`s (first, last).
pub fn encode_ranges(ranges: &[[u16; 2]], out: &mut Vec<u8>) {
    for [a, b] in ranges {
        out.extend_from_slice(&a.to_le_bytes());
        out.extend_from_slice(&b.to_le_bytes());
    }
}

/// Reads what [`encode_ranges`] wrote; `None` unless the bytes are whole ranges (at most
/// [`MAX_RANGES`]), each in order and within the map.
pub fn decode_ranges(bytes: &[u8]) -> Option<Vec<[u16; 2]>> {
    if !bytes.len().is_multiple_of(4) || bytes.len() / 4 > MAX_RANGES {
        return None;
    }
    let ranges: Vec<[u16; 2]> = bytes
        .chunks_exact(4)
        .map(|c| [u16::from_le_bytes([c[0], c[1]]), u16::from_le_bytes([c[2], c[3]])])
        .collect();
    ranges.iter().all(|[a, b]| a <= b && *b < SLOTS).then_some(ranges)
}

/// Reads slots as an operator writes them: `0-99,200,300-310` (inclusive ranges).
pub fn parse_ranges(text: &str) -> Result<Vec<[u16; 2]>, String> {
    let mut out = Vec::new();
    for part in text.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let (a, b) = part.split_once('-').unwrap_or((part, part));
        let slot = |t: &str| -> Result<u16, String> {
            match t.trim().parse::<u16>() {
                Ok(s) if s < SLOTS => Ok(s),
                _ => Err(format!("`{part}`: slots are numbers from 0 to {}", SLOTS - 1)),
            }
        };
        let (a, b) = (slot(a)?, slot(b)?);
        if a > b {
            return Err(format!("`{part}`: a range goes from low to high"));
        }
        out.push([a, b]);
    }
    if out.is_empty() {
        return Err("no slots given (e.g. 0-99,200)".into());
    }
    // In order, overlapping and adjacent ranges joined.
    out.sort_unstable();
    let mut merged: Vec<[u16; 2]> = Vec::with_capacity(out.len());
    for [a, b] in out {
        match merged.last_mut() {
            Some(last) if u32::from(a) <= u32::from(last[1]) + 1 => last[1] = last[1].max(b),
            _ => merged.push([a, b]),
        }
    }
    Ok(merged)
}

/// A set of slots, one bit each: which slots a move copies or a node tracks, asked once
/// per key.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SlotBits([u64; SLOTS as usize / 64]);

impl SlotBits {
    /// The slots of `ranges` (inclusive; slots past the last are left out).
    pub fn of(ranges: &[[u16; 2]]) -> SlotBits {
        let mut bits = [0u64; SLOTS as usize / 64];
        for slot in ranges.iter().flat_map(|[a, b]| *a..=*b) {
            if let Some(w) = bits.get_mut(usize::from(slot) / 64) {
                *w |= 1 << (slot % 64);
            }
        }
        SlotBits(bits)
    }

    /// Whether `slot` is in the set.
    #[inline]
    pub fn has(&self, slot: u16) -> bool {
        self.0
            .get(usize::from(slot) / 64)
            .is_some_and(|w| w & (1 << (slot % 64)) != 0)
    }
}

/// `slots` (in any order) as inclusive ranges in order.
pub fn ranges_of_slots(slots: &[u16]) -> Vec<[u16; 2]> {
    let mut sorted = slots.to_vec();
    sorted.sort_unstable();
    sorted.dedup();
    let mut out: Vec<[u16; 2]> = Vec::new();
    for s in sorted {
        match out.last_mut() {
            Some(last) if last[1] + 1 == s => last[1] = s,
            _ => out.push([s, s]),
        }
    }
    out
}

/// Writes ranges as [`parse_ranges`] reads them.
pub fn format_ranges(ranges: &[[u16; 2]]) -> String {
    let parts: Vec<String> = ranges
        .iter()
        .map(|[a, b]| if a == b { a.to_string() } else { format!("{a}-{b}") })
        .collect();
    parts.join(",")
}

#[cfg(test)]
mod tests {

    /// A slot set holds exactly the slots of its ranges, the last slot included; a range
    /// past the last slot adds nothing beyond it.
    #[test]
    fn a_slot_set_holds_the_slots_of_its_ranges() {
        let set = SlotBits::of(&[[0, 0], [63, 64], [16000, 16383]]);
        let held: Vec<u16> = (0..SLOTS).filter(|&s| set.has(s)).collect();
        let want: Vec<u16> = [0, 63, 64].into_iter().chain(16000..SLOTS).collect();
        assert_eq!(held, want);
        assert!(!set.has(SLOTS) && !set.has(u16::MAX));
        assert_eq!(SlotBits::of(&[[16380, u16::MAX]]), SlotBits::of(&[[16380, 16383]]));
    }
    use proptest::prelude::*;

    use super::*;

    #[test]
    fn a_shard_starts_with_its_even_split() {
        let t = SlotTable::for_shard(ShardId { index: 1, count: 3 });
        assert_eq!(t.served(), vec![[5462, 10922]]);
        assert_eq!(t.verdict(0, false, false), Verdict::Moved { owner: 0, epoch: 0 });
        assert_eq!(t.verdict(6000, true, false), Verdict::Serve);
        assert_eq!(t.verdict(6000, true, true), Verdict::TryAgain);
        t.set(
            6000,
            Slot {
                state: SlotState::Frozen,
                owner: 1,
                epoch: 0,
            },
        );
        assert_eq!(t.verdict(6000, false, false), Verdict::Serve);
        assert_eq!(t.verdict(6000, true, false), Verdict::TryAgain);
        t.set(
            6000,
            Slot {
                state: SlotState::Importing,
                owner: 0,
                epoch: 4,
            },
        );
        assert_eq!(t.verdict(6000, true, true), Verdict::Serve);
        assert_eq!(t.verdict(6000, false, false), Verdict::Moved { owner: 0, epoch: 3 });
        assert_eq!(t.owner(6000), 0, "clients and forwarding go to the source meanwhile");
        t.set(
            6000,
            Slot {
                state: SlotState::Importing,
                owner: 1,
                epoch: 4,
            },
        );
        assert_eq!(
            t.verdict(6000, false, false),
            Verdict::TryAgain,
            "its hand-over under way"
        );
    }

    #[test]
    fn a_client_learns_only_newer_owners() {
        let t = SlotTable::for_client(3);
        assert_eq!(t.owner(0), 0);
        assert!(t.learn(0, 2, 5));
        assert!(!t.learn(0, 1, 4));
        assert!(!t.learn(0, 2, 5));
        assert_eq!(t.owner(0), 2);
        assert_eq!(t.max_epoch(), 5);
    }

    #[test]
    fn ranges_read_as_written() {
        let r = parse_ranges("0-99, 200,300-310").unwrap();
        assert_eq!(r, vec![[0, 99], [200, 200], [300, 310]]);
        assert_eq!(parse_ranges("5,3,4,10-12,11-20").unwrap(), vec![[3, 5], [10, 20]]);
        assert_eq!(format_ranges(&r), "0-99,200,300-310");
        for bad in ["", "5-1", "16384", "a", "1-2-3"] {
            assert!(parse_ranges(bad).is_err(), "{bad}");
        }
    }

    proptest! {
        /// Whatever changes a table sees, its served bits answer every slot as its cell
        /// does, and `serves_all` holds exactly when every slot is served.
        #[test]
        fn served_bits_agree_with_the_cells(
            groups in 1u32..5,
            changes in proptest::collection::vec((0u16..SLOTS, 0u8..4, 0u16..5, 0u32..9), 0..300),
            whole in any::<bool>(),
        ) {
            let t = match whole {
                true => SlotTable::for_shard(ShardId { index: 0, count: 1 }),
                false => SlotTable::for_shard(ShardId { index: 0, count: groups }),
            };
            prop_assert_eq!(t.serves_all(true), whole || groups == 1);
            for (slot, state, owner, epoch) in changes {
                let state = SlotState::from_u8(state).unwrap_or(SlotState::Gone);
                t.set(slot, Slot { state, owner, epoch });
            }
            for write in [false, true] {
                let mut all = true;
                for slot in 0..SLOTS {
                    prop_assert_eq!(t.owner(slot), t.get(slot).owner);
                    let slow = verdict_of(t.get(slot), write, false, t.me);
                    prop_assert_eq!(t.verdict(slot, write, false), slow);
                    prop_assert_eq!(t.verdict(slot, write, true), verdict_of(t.get(slot), write, true, t.me));
                    all &= slow == Verdict::Serve;
                }
                prop_assert_eq!(t.serves_all(write), all);
            }
        }

        /// Changes and tables read back as written; any bytes decode
        /// without a panic.
        #[test]
        fn round_trips_and_never_panics(
            ranges in proptest::collection::vec((0u16..SLOTS, 0u16..SLOTS), 0..20),
            owner in any::<u16>(),
            epoch in any::<u32>(),
            junk in proptest::collection::vec(any::<u8>(), 0..200),
        ) {
            let ranges: Vec<[u16; 2]> = ranges.into_iter().map(|(a, b)| [a.min(b), a.max(b)]).collect();
            let change = SlotChange { ranges: ranges.clone(), to: SlotState::Gone, owner, epoch };
            prop_assert_eq!(SlotChange::decode(&change.encode()), Some(change));
            let _ = SlotChange::decode(&junk);
            let t = SlotTable::for_client(3);
            prop_assert!(t.load(&junk).is_err());
        }
    }

    #[test]
    fn a_table_reads_back_as_written() {
        let t = SlotTable::for_shard(ShardId { index: 0, count: 2 });
        t.set(
            9,
            Slot {
                state: SlotState::Gone,
                owner: 1,
                epoch: 3,
            },
        );
        let mut bytes = Vec::new();
        t.encode(&mut bytes);
        let u = SlotTable::for_client(1);
        u.load(&bytes).unwrap();
        assert_eq!(u.entries(), t.entries());
    }
}
