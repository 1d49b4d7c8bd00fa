//! The store's slot table: which slots this node's group serves, changed only by `SlotSet`
//! ops (through the log on a durable node), and a migration's copy (`SlotScan`, `Load`).
//!
//! Every op's slot is checked against the table before the op joins its map shard's group
//! ([`Store::refuse_unserved`]). A change may land between that check and the group's lock,
//! so the table counts its changes: a group whose lock is taken after a change checks its
//! ops again ([`Store::still_served`]). With that, an op either ran before a change (and a
//! migration's copy, taken after the change, sees it) or is refused after it: no write is
//! lost between a freeze and the copy, and no read finds a key dropped by a hand-over.
//!
//! A change takes the transaction gate exclusively: no snapshot copies the map shards in
//! the middle of one, so a snapshot's table and its map shards agree; the table's last
//! applied log entry is saved with it, and replaying the log skips changes it already holds.

use super::Ops;
use kvshared::keyspace::ScanRequest;
use kvshared::routing::key_slot;
use kvshared::slot_copy::{Copied, Loaded, MAX_COPY_PAGE_BYTES, decode_load, decode_slot_scan, encode_copied};
use kvshared::slots::{Slot, SlotBits, SlotChange, SlotState, Verdict};
use kvshared::stats::Counts;
use kvshared::wire::{BatchResponse, MalformedOp, OpKind, OpStatus};

use super::memory::Shard;
use super::{Answers, ReplyRoom, Store};

impl Store {
    /// The node's slot table.
    pub fn slot_table(&self) -> &kvshared::slots::SlotTable {
        &self.own.slots
    }

    /// Answers op `i` (on `key`) `Moved` or `TryAgain` when this node does not serve its
    /// slot now; true when it did (the op does not run).
    #[inline]
    pub(super) fn refuse_unserved(
        &self,
        kind: OpKind,
        key: &[u8],
        i: usize,
        out: &mut BatchResponse,
        tally: &mut Counts,
    ) -> bool {
        let (write, load) = (kind.is_write(), kind == OpKind::Load);
        if !load && self.own.slots.serves_all(write) {
            return false;
        }
        let slot = key_slot(key);
        match self.own.slots.verdict(slot, write, load) {
            Verdict::Serve => false,
            Verdict::Moved { owner, epoch } => {
                out.set_moved(i, slot, owner, epoch);
                tally.wrong_shard += 1;
                true
            }
            Verdict::TryAgain => {
                out.set(i, OpStatus::TryAgain);
                tally.try_again += 1;
                true
            }
        }
    }

    /// Counts an op on `key` in its slot's sampled load.
    #[inline]
    pub(super) fn count_slot_load(&self, key: &[u8]) {
        self.own.count_load(key);
    }

    /// Every slot's sampled load, as `OpKind::SlotLoad` answers it.
    pub(super) fn slot_load_bytes(&self) -> Vec<u8> {
        self.own.load_bytes()
    }

    /// On a durable node's store, a write that is not being applied from the log (`log_index`
    /// 0) is answered `TryAgain` (true): its node found its slot not served when it chose what
    /// to log, and the slot changed hands since (see [`Store::writes_through_log_only`]).
    #[inline]
    pub(super) fn refuse_unlogged_write(
        &self,
        kind: OpKind,
        log_index: u64,
        i: usize,
        out: &mut BatchResponse,
        tally: &mut Counts,
    ) -> bool {
        if !self.policy.log_only || log_index > 0 || !kind.is_write() {
            return false;
        }
        out.set(i, OpStatus::TryAgain);
        tally.try_again += 1;
        true
    }

    /// Whether this node serves op `kind` on `key` now (a durable node's choice of what to log).
    #[inline]
    pub(super) fn serves(&self, kind: OpKind, key: &[u8]) -> bool {
        let (write, load) = (kind.is_write(), kind == OpKind::Load);
        (!load && self.own.slots.serves_all(write))
            || self.own.slots.verdict(key_slot(key), write, load) == Verdict::Serve
    }

    /// A map shard group's ops whose slots the table still serves, when it changed since the
    /// batch checked them (`seen`); the others are answered as [`Store::refuse_unserved`] does.
    /// `None`: nothing changed, the group runs as it is.
    pub(super) fn still_served(
        &self,
        group: &[u64],
        batch: &impl Ops,
        ans: &mut Answers<'_, impl ReplyRoom>,
    ) -> Option<Vec<u64>> {
        if self.own.slots.changes() == ans.slot_changes {
            return None;
        }
        let kept = group
            .iter()
            .copied()
            .filter(|&e| {
                let i = e as u32 as usize;
                batch
                    .op(i)
                    .is_ok_and(|op| !self.refuse_unserved(op.kind, op.key, i, ans.out, ans.tally))
            })
            .collect();
        Some(kept)
    }

    /// A `SlotSet` op (node-wide): applies the change if every slot may take it, else
    /// changes nothing and answers `NotStored`. Slots that leave this node (gone) or start
    /// importing lose the keys this node held of them.
    pub(super) fn set_slots(&self, value: &[u8], log_index: u64, tally: &mut Counts) -> OpStatus {
        let Some(change) = SlotChange::decode(value) else {
            return OpStatus::Malformed;
        };
        let _gate = self.gate.pass_alone();
        if log_index > 0 && log_index < self.own.applied.load(std::sync::atomic::Ordering::Acquire) {
            // Replaying the log: the snapshot's table already holds this change. (Not the
            // entry of the table's last change itself: one entry holds many batches, so
            // several changes, and each must run; run again on a replay, a change that was
            // applied changes nothing: see `plan_change`.)
            return OpStatus::Stored;
        }
        let me = self.own.me.index as u16;
        let Some(plan) = plan_change(&self.own.slots, &change, me) else {
            return OpStatus::NotStored;
        };
        let mut taken = 0u32;
        for &(slot, entry, _) in &plan {
            match (self.own.slots.get(slot).state, entry.state) {
                (SlotState::Importing, SlotState::Owned) => {
                    tally.slots_in += 1;
                    taken += 1;
                }
                (SlotState::Frozen, SlotState::Gone) => tally.slots_out += 1,
                _ => {}
            }
            self.own.slots.set(slot, entry);
        }
        self.own.count_taken(taken);
        let dropped: Vec<u16> = plan.iter().filter(|(_, _, drop)| *drop).map(|(s, _, _)| *s).collect();
        if !dropped.is_empty() {
            self.drop_slots(&SlotBits::of(&kvshared::slots::ranges_of_slots(&dropped)), log_index);
        }
        if log_index > 0 {
            self.own
                .applied
                .fetch_max(log_index, std::sync::atomic::Ordering::AcqRel);
        }
        tracing::info!(
            slots = %kvshared::slots::format_ranges(&change.ranges),
            to = change.to.as_str(),
            owner = change.owner,
            epoch = change.epoch,
            dropped = dropped.len(),
            "slots changed"
        );
        OpStatus::Stored
    }

    /// The moves under way here, for stats.
    pub fn slot_moves(&self) -> kvshared::stats::SlotMoves {
        self.own.moves()
    }

    /// Removes every key of `slots` from every map shard (each under its write lock). This
    /// walk is in a move's write pause, and a durable node's log waits for it: each key's
    /// slot is asked of a bit set, and a key is removed where the walk found it (no copy of
    /// it, no second probe).
    fn drop_slots(&self, slots: &SlotBits, log_index: u64) {
        self.forget_tracked(slots);
        for shard in self.map.shards.iter() {
            let mut s = shard.write();
            s.applied = s.applied.max(log_index);
            // The keys leave with their slots: not a migration's change to copy.
            let mut written = s.written.take();
            if let Some(w) = written.as_deref_mut() {
                w.forget(slots);
            }
            let (mut i, mut freed) = (0, 0);
            while i < s.table.slot_count() {
                s.table.walk_hint(i);
                match s.table.at(i) {
                    // Removing shifts later entries of the probe back, maybe into slot `i`:
                    // it is looked at again. (A kept entry in the table's first slots, whose
                    // probe wrapped, may shift into its last ones and is kept again.)
                    Some(e) if slots.has(key_slot(e.key())) => freed += s.remove_at(i),
                    _ => i += 1,
                }
            }
            // Given back once: an atomic per key waited for each freed value's cache miss
            // (a third of the walk's time).
            self.memory.usage.give(freed);
            s.written = written;
        }
    }

    /// A `SlotScan` op (node-wide): a page of the keys of the slots asked for, with their
    /// values and deadlines, walking the map shards as `SCAN` does.
    pub(super) fn slot_scan(&self, request: &[u8], clock: u64) -> Result<Vec<u8>, MalformedOp> {
        let (req, ranges) = decode_slot_scan(request).ok_or(MalformedOp::BadKeyspace)?;
        self.slot_scan_page(req, &ranges, clock)
    }

    /// A page of the keys of `ranges` from `req`'s cursor (see [`Store::slot_scan`]).
    pub(super) fn slot_scan_page(
        &self,
        req: ScanRequest,
        ranges: &[[u16; 2]],
        clock: u64,
    ) -> Result<Vec<u8>, MalformedOp> {
        let wanted = SlotBits::of(ranges);
        let (mut map, mut from) = ((req.cursor >> 32) as usize, req.cursor as u32);
        if map >= self.map.shards.len() {
            return Err(MalformedOp::BadKeyspace);
        }
        // Sized once for a full page (about 256 bytes a key at most asked): grown by
        // doubling, a 4 MiB page was copied again as much as it holds.
        let mut page = Vec::with_capacity(8 + MAX_COPY_PAGE_BYTES.min((req.count as usize).saturating_mul(256)));
        page.extend_from_slice(&[0u8; 8]);
        let mut walked = 0usize;
        // Every key of the shards is walked, a page's worth at a time (no index by slot).
        let want = (req.count as usize).saturating_mul(16);
        loop {
            let s = self.map.shards[map].read();
            let next = s.table.scan(from, want.saturating_sub(walked).max(1), |e| {
                walked += 1;
                let key = e.key();
                if wanted.has(key_slot(key)) && !s.expires.is_due(key, clock) {
                    let deadline = s.expires.get(key);
                    encode_copied(
                        &Copied {
                            key,
                            value: Some(e.value()),
                            deadline,
                        },
                        &mut page,
                    );
                }
            });
            drop(s);
            match u32::try_from(next) {
                Ok(at) => from = at,
                Err(_) => (map, from) = (map + 1, 0),
            }
            if map == self.map.shards.len() || walked >= want || page.len() >= MAX_COPY_PAGE_BYTES {
                break;
            }
        }
        let next = match map == self.map.shards.len() {
            true => 0,
            false => ((map as u64) << 32) | u64::from(from),
        };
        page[..8].copy_from_slice(&next.to_le_bytes());
        Ok(page)
    }

    /// Op `i`, a migration's `Load` of `key` in `shard` (locked as `s`): the value and
    /// deadline as the source held them.
    pub(super) fn load_one(
        &self,
        shard: usize,
        s: &mut Shard,
        (hash, key, value): (u64, &[u8], &[u8]),
        i: usize,
        ans: &mut Answers<'_, impl ReplyRoom>,
    ) {
        let (value, deadline) = match decode_load(value) {
            Some(Loaded::Value(value, deadline)) => (value, deadline),
            Some(Loaded::Absent) => {
                // Removed at the source since the copy began.
                self.remove_key(s, hash, key);
                ans.tally.deletes += 1;
                ans.tally.keys_loaded += 1;
                return ans.out.set(i, OpStatus::Stored);
            }
            None => {
                ans.tally.malformed_op += 1;
                return ans.out.set_malformed(i, MalformedOp::BadKeyspace);
            }
        };
        if !self.put(shard, s, hash, key, value, ans) {
            ans.tally.out_of_memory += 1;
            return ans.out.set(i, OpStatus::OutOfMemory);
        }
        self.set_deadline(s, key, deadline);
        ans.tally.puts += 1;
        ans.tally.keys_loaded += 1;
        ans.out.set(i, OpStatus::Stored);
    }

    /// Appends the slot table and the log entry of its last change (a snapshot's).
    pub fn export_slots(&self, out: &mut Vec<u8>) {
        let applied = self.own.applied.load(std::sync::atomic::Ordering::Acquire);
        out.extend_from_slice(&applied.to_le_bytes());
        self.own.slots.encode(out);
    }

    /// Loads a table written by [`Store::export_slots`]; returns the bytes it took.
    pub(super) fn import_slots(&self, data: &[u8]) -> Result<usize, super::dump::ImportError> {
        use super::dump::ImportError;
        let cut = || ImportError::SlotTable("cut short".into());
        let (applied, rest) = data.split_first_chunk::<8>().ok_or_else(cut)?;
        let table = rest.get(..kvshared::slots::ENCODED_LEN).ok_or_else(cut)?;
        self.own.slots.load(table).map_err(ImportError::SlotTable)?;
        self.own
            .applied
            .store(u64::from_le_bytes(*applied), std::sync::atomic::Ordering::Release);
        Ok(8 + kvshared::slots::ENCODED_LEN)
    }

    /// Starts the table owning no slot (`--no-slots`): every slot gone to the group the even
    /// split of the groups before this one gives it, at epoch 0, until `kvd admin add-shard`
    /// tells it the cluster's map.
    pub fn start_without_slots(&mut self) {
        self.own.no_slots = true;
        self.own.slots = self.own.initial_table();
    }

    /// Resets the table to the even split `--shard` gives (a snapshot from before slot maps).
    pub(super) fn reset_slots(&self) {
        let fresh = self.own.initial_table();
        for (s, e) in fresh.entries().into_iter().enumerate() {
            self.own.slots.set(s as u16, e);
        }
        self.own.applied.store(0, std::sync::atomic::Ordering::Release);
    }
}

/// The entries a change gives its slots, and whether each loses its keys here; `None` when
/// some slot may not take the change (see the rules in `kvshared::slots`). Repeating a
/// change that was applied changes nothing (every step of a move may be run again).
fn plan_change(table: &kvshared::slots::SlotTable, c: &SlotChange, me: u16) -> Option<Vec<(u16, Slot, bool)>> {
    let mut plan = Vec::new();
    for slot in c.slots() {
        let now = table.get(slot);
        let mine = |state| Slot {
            state,
            owner: me,
            epoch: c.epoch,
        };
        let step = match (c.to, now.state) {
            (SlotState::Frozen, SlotState::Owned | SlotState::Frozen) => Some((
                Slot {
                    state: SlotState::Frozen,
                    ..now
                },
                false,
            )),
            // The entry names the source, which serves the slot while it is copied, or this
            // node once the hand-over is under way (see `SlotState::Importing`).
            (SlotState::Importing, SlotState::Gone | SlotState::Importing) if c.epoch > now.epoch => Some((
                Slot {
                    state: SlotState::Importing,
                    owner: c.owner,
                    epoch: c.epoch,
                },
                true,
            )),
            // The same import, its hand-over begun (nothing dropped).
            (SlotState::Importing, SlotState::Importing) if c.epoch == now.epoch && c.owner != now.owner => {
                Some((Slot { owner: c.owner, ..now }, false))
            }
            (SlotState::Importing, SlotState::Importing) if c.epoch == now.epoch => None,
            (SlotState::Owned, SlotState::Importing) if c.epoch == now.epoch => Some((mine(SlotState::Owned), false)),
            (SlotState::Owned, SlotState::Owned) if c.epoch == now.epoch => None,
            // Unfreezing (a move given up before the hand-over).
            (SlotState::Owned, SlotState::Frozen) if c.epoch == now.epoch => Some((
                Slot {
                    state: SlotState::Owned,
                    ..now
                },
                false,
            )),
            (SlotState::Gone, SlotState::Frozen) if c.owner != me && c.epoch > now.epoch => Some((
                Slot {
                    state: SlotState::Gone,
                    owner: c.owner,
                    epoch: c.epoch,
                },
                true,
            )),
            // Hearing of a later owner of a slot this node does not hold.
            (SlotState::Gone, SlotState::Gone) if c.owner != me && c.epoch >= now.epoch => Some((
                Slot {
                    state: SlotState::Gone,
                    owner: c.owner,
                    epoch: c.epoch,
                },
                false,
            )),
            (SlotState::Gone, SlotState::Gone) if c.epoch < now.epoch => None,
            _ => return None,
        };
        if let Some((entry, drop)) = step {
            plan.push((slot, entry, drop));
        }
    }
    Some(plan)
}

#[cfg(test)]
pub(super) mod tests {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};

    use kvshared::keyspace::ScanRequest;
    use kvshared::routing::ShardId;
    use kvshared::slot_copy::{decode_copied, encode_load, encode_slot_scan};
    use kvshared::slots::{SlotChange, SlotState};
    use kvshared::wire::{BatchRequest, BatchResponse, OpKind, OpReply, OpStatus};

    use super::super::{Scratch, Store, Unbounded};

    /// Runs `req` on `store` (in memory: no log) and returns each op's reply, owned.
    pub(in crate::store) fn run(store: &Store, req: &BatchRequest) -> Vec<OpReply<'static>> {
        let mut frame: kvshared::frame::AlignedVec = kvshared::frame::AlignedVec::new();
        kvshared::wire::encode_frame(kvshared::frame::FrameKind::BatchRequest, 1, req, &mut frame).unwrap();
        let mut body: kvshared::frame::AlignedVec = kvshared::frame::AlignedVec::new();
        body.extend_from_slice(&frame[kvshared::frame::HEADER_LEN..]);
        let view = kvshared::wire::BatchView::parse(&body).unwrap();
        let mut out = BatchResponse::default();
        let mut tally = kvshared::stats::Counts::default();
        store.execute(&view, &mut out, &mut Unbounded, &mut Scratch::default(), &mut tally);
        (0..out.len())
            .map(|i| match out.result(i) {
                OpReply::Found(v) => OpReply::Found(Box::leak(v.to_vec().into_boxed_slice())),
                OpReply::Malformed(_) => OpReply::Malformed("malformed"),
                r => owned(r),
            })
            .collect()
    }

    fn owned(r: OpReply<'_>) -> OpReply<'static> {
        match r {
            OpReply::NotFound => OpReply::NotFound,
            OpReply::Stored => OpReply::Stored,
            OpReply::NotStored => OpReply::NotStored,
            OpReply::Deleted => OpReply::Deleted,
            OpReply::Absent => OpReply::Absent,
            OpReply::TryAgain => OpReply::TryAgain,
            OpReply::Moved { slot, owner, epoch } => OpReply::Moved { slot, owner, epoch },
            OpReply::Counted(n) => OpReply::Counted(n),
            _ => OpReply::Malformed("other"),
        }
    }

    pub(in crate::store) fn change(
        store: &Store,
        ranges: &[[u16; 2]],
        to: SlotState,
        owner: u16,
        epoch: u32,
    ) -> OpReply<'static> {
        let mut req = BatchRequest::new();
        let c = SlotChange {
            ranges: ranges.to_vec(),
            to,
            owner,
            epoch,
        };
        req.push(OpKind::SlotSet, b"", &c.encode());
        run(store, &req)[0]
    }

    proptest::proptest! {
        /// A hand-over's drop of the slots that left removes exactly their keys, from a
        /// table crowded enough that removals shift entries back (some across its end):
        /// every other key is still there and the accounts add up.
        #[test]
        fn gone_slots_lose_exactly_their_keys(
            keys in 1usize..400,
            ranges in proptest::collection::vec((0u16..16384, 0u16..2000), 1..6),
        ) {
            let store = Store::new(ShardId { index: 0, count: 1 }, 1, keys).unwrap();
            let mut put = BatchRequest::new();
            for i in 0..keys {
                put.push(OpKind::Put, format!("k{i}").as_bytes(), &[7u8; 20]);
            }
            run(&store, &put);
            let ranges: Vec<[u16; 2]> = ranges.iter().map(|&(a, n)| [a, a.saturating_add(n).min(16383)]).collect();
            let gone = kvshared::slots::SlotBits::of(&ranges);
            proptest::prop_assert_eq!(change(&store, &ranges, SlotState::Frozen, 0, 1), OpReply::Stored);
            proptest::prop_assert_eq!(change(&store, &ranges, SlotState::Gone, 1, 1), OpReply::Stored);
            let kept: Vec<Vec<u8>> = (0..keys)
                .map(|i| format!("k{i}").into_bytes())
                .filter(|k| !gone.has(kvshared::routing::key_slot(k)))
                .collect();
            proptest::prop_assert_eq!(store.len(), kept.len() as u64);
            proptest::prop_assert_eq!(store.memory_used(), store.memory_recount());
            let mut get = BatchRequest::new();
            for k in &kept {
                get.push(OpKind::Get, k, b"");
            }
            if !kept.is_empty() {
                proptest::prop_assert!(run(&store, &get).iter().all(|r| matches!(r, OpReply::Found(_))));
            }
        }
    }

    /// The per-slot load is sampled by op, not by batch: a slot whose ops come in few full
    /// batches and one whose ops come in many small ones, as many ops each, count alike.
    /// (One whole batch in sixteen counted the first as nothing here: its batches fell
    /// between the sampled ones.)
    #[test]
    fn the_slot_load_counts_ops_alike_in_full_batches_and_small_ones() {
        let store = Store::new(ShardId { index: 0, count: 1 }, 4, 0).unwrap();
        let mut scratch = Scratch::default();
        let mut batch = |tag: &str, ops: usize| {
            let mut req = BatchRequest::new();
            for i in 0..ops {
                req.push(OpKind::Get, format!("{{{tag}}}k{i}").as_bytes(), b"");
            }
            let mut frame = kvshared::frame::AlignedVec::new();
            kvshared::wire::encode_frame(kvshared::frame::FrameKind::BatchRequest, 1, &req, &mut frame).unwrap();
            let mut body: kvshared::frame::AlignedVec = kvshared::frame::AlignedVec::new();
            body.extend_from_slice(&frame[kvshared::frame::HEADER_LEN..]);
            let view = kvshared::wire::BatchView::parse(&body).unwrap();
            let mut out = BatchResponse::default();
            let mut tally = kvshared::stats::Counts::default();
            store.execute(&view, &mut out, &mut Unbounded, &mut scratch, &mut tally);
        };
        for _ in 0..10 {
            batch("full", 64);
            for _ in 0..16 {
                batch("small", 4);
            }
        }
        let load = kvshared::slots::decode_load_counts(&store.slot_load_bytes()).unwrap();
        let of = |tag: &str| load[usize::from(kvshared::routing::key_slot(tag.as_bytes()))];
        let every = kvshared::slots::SLOT_LOAD_SAMPLE_EVERY;
        let expected = 640 / every;
        for tag in ["full", "small"] {
            assert!(
                of(tag).abs_diff(expected) <= 1,
                "slot of {{{tag}}}: {} sampled, not about {expected}",
                of(tag)
            );
        }
    }

    /// The per-slot load the manager moves slots by counts what clients asked, not the keys
    /// a move copied in (else a move's target looks busy for what it was given).
    #[test]
    fn a_slot_copys_loads_are_not_counted_as_load() {
        let store = Store::new(ShardId { index: 0, count: 1 }, 4, 0).unwrap();
        let mut scratch = Scratch::default();
        let mut batch = |kind: OpKind| {
            let mut req = BatchRequest::new();
            for i in 0..8 {
                req.push(kind, format!("k{i}").as_bytes(), b"v");
            }
            let mut frame = kvshared::frame::AlignedVec::new();
            kvshared::wire::encode_frame(kvshared::frame::FrameKind::BatchRequest, 1, &req, &mut frame).unwrap();
            let mut body: kvshared::frame::AlignedVec = kvshared::frame::AlignedVec::new();
            body.extend_from_slice(&frame[kvshared::frame::HEADER_LEN..]);
            let view = kvshared::wire::BatchView::parse(&body).unwrap();
            let mut out = BatchResponse::default();
            let mut tally = kvshared::stats::Counts::default();
            store.execute(&view, &mut out, &mut Unbounded, &mut scratch, &mut tally);
        };
        let counted = |store: &Store| -> u64 {
            store
                .slot_load_bytes()
                .chunks(4)
                .map(|c| u64::from(u32::from_le_bytes([c[0], c[1], c[2], c[3]])))
                .sum()
        };
        for _ in 0..64 {
            batch(OpKind::Load);
        }
        assert_eq!(counted(&store), 0, "a copy's loads counted");
        for _ in 0..64 {
            batch(OpKind::Put);
        }
        assert!(counted(&store) > 0, "clients' puts not counted");
    }

    /// Copies `ranges` from `from` to `to` as `kvd admin move-slots` does; returns the keys.
    fn copy(from: &Store, to: &Store, ranges: &[[u16; 2]]) -> usize {
        let (mut cursor, mut n) = (0, 0);
        loop {
            let mut req = BatchRequest::new();
            req.push(
                OpKind::SlotScan,
                b"",
                &encode_slot_scan(ScanRequest { cursor, count: 100 }, ranges),
            );
            let OpReply::Found(page) = run(from, &req)[0] else {
                panic!("no page")
            };
            let (next, keys) = load_page(to, page);
            n += keys;
            if next == 0 {
                return n;
            }
            cursor = next;
        }
    }

    /// Loads a copy's page into `to` as `kvd admin move-slots` does: the next cursor and
    /// how many keys.
    pub(in crate::store) fn load_page(to: &Store, page: &[u8]) -> (u64, usize) {
        let (next, keys) = decode_copied(page).unwrap();
        let mut load = BatchRequest::new();
        for c in &keys {
            let mut v = Vec::new();
            encode_load(c.value, c.deadline, &mut v);
            load.push(OpKind::Load, c.key, &v);
        }
        if !load.is_empty() {
            assert!(run(to, &load).iter().all(|r| *r == OpReply::Stored));
        }
        (next, keys.len())
    }

    /// Keys of shard 0 of 2 whose slots lie in `0..=99`.
    pub(in crate::store) fn keys_in_low_slots(n: usize) -> Vec<Vec<u8>> {
        (0u32..)
            .map(|i| format!("k{i}").into_bytes())
            .filter(|k| kvshared::routing::key_slot(k) < 100)
            .take(n)
            .collect()
    }

    /// A move's progress at its target: slots taken so far out of the move's total, reset
    /// once nothing imports.
    #[test]
    fn a_target_counts_the_slots_it_took_of_the_moves_under_way() {
        let b = Store::new(ShardId { index: 1, count: 2 }, 4, 0).unwrap();
        assert_eq!(change(&b, &[[0, 199]], SlotState::Importing, 1, 1), OpReply::Stored);
        assert_eq!((b.slot_moves().importing, b.slot_moves().taken), (200, 0));
        assert_eq!(change(&b, &[[0, 99]], SlotState::Owned, 1, 1), OpReply::Stored);
        assert_eq!((b.slot_moves().importing, b.slot_moves().taken), (100, 100));
        assert_eq!(change(&b, &[[100, 199]], SlotState::Owned, 1, 1), OpReply::Stored);
        assert_eq!((b.slot_moves().importing, b.slot_moves().taken), (0, 0));
    }

    /// The four steps move a slot range's keys (values and deadlines) and its ownership;
    /// every step may run twice; a step out of order changes nothing.
    #[test]
    fn a_move_hands_keys_and_slots_over() {
        let (a, b) = (
            Store::new(ShardId { index: 0, count: 2 }, 4, 0).unwrap(),
            Store::new(ShardId { index: 1, count: 2 }, 4, 0).unwrap(),
        );
        let keys = keys_in_low_slots(50);
        let mut put = BatchRequest::new();
        for k in &keys {
            put.push_put(k, k);
        }
        assert!(run(&a, &put).iter().all(|r| *r == OpReply::Stored));
        let r = [[0, 99]];
        // Out of order: importing a slot the target is not told is gone, owning before importing.
        assert_eq!(change(&b, &r, SlotState::Owned, 1, 1), OpReply::NotStored);
        assert_eq!(change(&a, &r, SlotState::Gone, 1, 1), OpReply::NotStored);
        for _ in 0..2 {
            assert_eq!(change(&a, &r, SlotState::Frozen, 0, 1), OpReply::Stored);
            assert_eq!(change(&b, &r, SlotState::Importing, 0, 1), OpReply::Stored);
        }
        assert_eq!(run(&a, &put)[0], OpReply::TryAgain, "a frozen slot refuses writes");
        let mut get = BatchRequest::new();
        get.push_get(&keys[0]);
        assert_eq!(
            run(&a, &get)[0],
            OpReply::Found(Box::leak(keys[0].clone().into_boxed_slice()))
        );
        let slot = kvshared::routing::key_slot(&keys[0]);
        assert_eq!(
            run(&b, &get)[0],
            OpReply::Moved {
                slot,
                owner: 0,
                epoch: 0
            },
            "an importing slot serves nothing yet: its source does"
        );
        assert_eq!(b.slot_table().owner(slot), 0, "forwarding goes to the source meanwhile");
        // The hand-over begins (the same import, naming the target): "try again" there.
        for _ in 0..2 {
            assert_eq!(change(&b, &r, SlotState::Importing, 1, 1), OpReply::Stored);
        }
        assert_eq!(run(&b, &get)[0], OpReply::TryAgain, "a slot being handed over");
        assert_eq!(copy(&a, &b, &r), 50);
        for _ in 0..2 {
            assert_eq!(change(&a, &r, SlotState::Gone, 1, 1), OpReply::Stored);
            assert_eq!(change(&b, &r, SlotState::Owned, 1, 1), OpReply::Stored);
        }
        assert_eq!(a.len(), 0, "the source dropped the slots' keys");
        assert_eq!(b.len(), 50);
        let slot = kvshared::routing::key_slot(&keys[0]);
        assert_eq!(
            run(&a, &get)[0],
            OpReply::Moved {
                slot,
                owner: 1,
                epoch: 1
            }
        );
        assert!(matches!(run(&b, &get)[0], OpReply::Found(_)));
        assert_eq!(b.slot_table().served(), vec![[0, 99], [8192, 16383]]);
        // A slot that left cannot be frozen again by its old owner.
        assert_eq!(change(&a, &r, SlotState::Frozen, 0, 2), OpReply::NotStored);
    }

    /// Writers hammer a slot range while it is frozen, copied and handed over: every write
    /// the source acknowledged is at the target afterwards (none falls between the freeze
    /// and the copy).
    #[test]
    fn no_acknowledged_write_is_lost_by_a_move() {
        let a = Arc::new(Store::new(ShardId { index: 0, count: 2 }, 4, 0).unwrap());
        let b = Store::new(ShardId { index: 1, count: 2 }, 4, 0).unwrap();
        let keys = Arc::new(keys_in_low_slots(64));
        let stop = Arc::new(AtomicBool::new(false));
        let writers: Vec<_> = (0..3)
            .map(|w| {
                let (a, keys, stop) = (a.clone(), keys.clone(), stop.clone());
                std::thread::spawn(move || {
                    let mut acked = std::collections::HashMap::new();
                    for n in 0u32..200_000 {
                        if stop.load(Ordering::Relaxed) {
                            break;
                        }
                        let k = &keys[(n as usize * 7 + w) % keys.len()];
                        let v = format!("{w}-{n}").into_bytes();
                        let mut req = BatchRequest::new();
                        req.push_put(k, &v);
                        if run(&a, &req)[0] == OpReply::Stored {
                            acked.insert(k.clone(), (n, v));
                        }
                    }
                    acked
                })
            })
            .collect();
        std::thread::sleep(std::time::Duration::from_millis(20));
        let r = [[0, 99]];
        assert_eq!(change(&a, &r, SlotState::Frozen, 0, 1), OpReply::Stored);
        assert_eq!(change(&b, &r, SlotState::Importing, 1, 1), OpReply::Stored);
        copy(&a, &b, &r);
        assert_eq!(change(&a, &r, SlotState::Gone, 1, 1), OpReply::Stored);
        assert_eq!(change(&b, &r, SlotState::Owned, 1, 1), OpReply::Stored);
        stop.store(true, Ordering::Relaxed);
        // Per key, the last acknowledged write of every writer; the store's value must be
        // one of them (writers race on a key), and no acknowledged key is missing.
        let mut last: std::collections::HashMap<Vec<u8>, Vec<Vec<u8>>> = Default::default();
        for w in writers {
            for (k, (_, v)) in w.join().unwrap() {
                last.entry(k).or_default().push(v);
            }
        }
        for (k, vs) in last {
            let mut get = BatchRequest::new();
            get.push_get(&k);
            match run(&b, &get)[0] {
                OpReply::Found(v) => assert!(vs.iter().any(|x| x == v), "{k:?} holds an unacknowledged value"),
                other => panic!("{k:?}: acknowledged, then {other:?} at the target"),
            }
        }
    }

    /// A snapshot keeps the table; replaying a change the snapshot holds does nothing.
    #[test]
    fn snapshots_keep_the_table_and_replay_skips_what_they_hold() {
        let a = Store::new(ShardId { index: 0, count: 2 }, 4, 0).unwrap();
        let c = SlotChange {
            ranges: vec![[5, 9]],
            to: SlotState::Frozen,
            owner: 0,
            epoch: 0,
        };
        assert_eq!(
            a.set_slots(&c.encode(), 7, &mut kvshared::stats::Counts::default()),
            OpStatus::Stored
        );
        let data = a.export_all();
        let b = Store::new(ShardId { index: 0, count: 2 }, 4, 0).unwrap();
        b.import(&data).unwrap();
        assert_eq!(b.slot_table().entries(), a.slot_table().entries());
        let unfreeze = SlotChange {
            ranges: vec![[5, 9]],
            to: SlotState::Owned,
            owner: 0,
            epoch: 0,
        };
        assert_eq!(
            b.set_slots(&unfreeze.encode(), 6, &mut kvshared::stats::Counts::default()),
            OpStatus::Stored,
            "held by the snapshot: skipped"
        );
        assert_eq!(b.slot_table().get(5).state, SlotState::Frozen);
        assert_eq!(
            b.set_slots(&unfreeze.encode(), 8, &mut kvshared::stats::Counts::default()),
            OpStatus::Stored
        );
        assert_eq!(b.slot_table().get(5).state, SlotState::Owned);
    }

    /// Two changes in one log entry (the log puts every batch queued meanwhile in one
    /// entry, so two moves' steps share it) both run: the second was once skipped as "held
    /// by the snapshot" and answered `Stored`, leaving a slot with two owners. Replaying
    /// that entry changes nothing more.
    #[test]
    fn every_change_of_one_log_entry_runs() {
        let a = Store::new(ShardId { index: 0, count: 2 }, 4, 0).unwrap();
        let freeze = |ranges: Vec<[u16; 2]>| SlotChange {
            ranges,
            to: SlotState::Frozen,
            owner: 0,
            epoch: 0,
        };
        let gone = |ranges: Vec<[u16; 2]>, owner: u16| SlotChange {
            ranges,
            to: SlotState::Gone,
            owner,
            epoch: 1,
        };
        let entry = [
            freeze(vec![[5, 9]]),
            freeze(vec![[20, 29]]),
            gone(vec![[5, 9]], 1),
            gone(vec![[20, 29]], 1),
        ];
        for replay in [false, true] {
            for c in &entry {
                let status = a.set_slots(&c.encode(), 7, &mut kvshared::stats::Counts::default());
                assert!(replay || status == OpStatus::Stored, "{c:?}");
            }
            for slot in [5, 9, 20, 29] {
                let e = a.slot_table().get(slot);
                assert_eq!(
                    (e.state, e.owner, e.epoch),
                    (SlotState::Gone, 1, 1),
                    "slot {slot}, replay {replay}"
                );
            }
            assert_eq!(a.slot_table().get(10).state, SlotState::Owned);
        }
    }
}
