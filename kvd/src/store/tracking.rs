//! A migration's copy before the freeze (`SlotTrack`; see `kvshared::slot_copy`): the keys
//! written in the slots being moved, noted while they still take writes, so that the
//! freeze has to wait only for those keys to be copied again, not for every key.
//!
//! Each map shard notes the keys it changes (a put, a removal, an eviction, a deadline set
//! or cleared) in its `written` set, under the lock its write holds already: a node that
//! tracks nothing pays one branch per write. `Start` installs the sets under each map
//! shard's write lock, so a write either ran before (and the copy that follows reads it) or
//! is noted. The node-wide [`Tracking`] (the token, the keys collected for copying again)
//! is touched only by `SlotTrack` ops.
//!
//! The token is the proof that nothing was missed: a map shard replaced by a flush or a
//! snapshot's import, a node restarted (another member leading), or a shard that went over
//! its share of [`TRACKED_BYTES`] no longer holds it, and every later step answers
//! `NotFound`: the admin copies the chunk whole, frozen, as without tracking.

use std::collections::{BTreeSet, HashSet};
use std::sync::Arc;

use kvshared::keyspace::{MAX_SCAN_PAGE_BYTES, ScanRequest};
use kvshared::routing::{key_hash, key_slot, map_shard};
use kvshared::slot_copy::{Copied, TrackRequest, encode_copied};
use kvshared::slots::SlotBits;
use kvshared::wire::MalformedOp;

use super::Store;

/// Most bytes of noted keys a node holds (over all its map shards; a key costs its length
/// and [`KEY_OVERHEAD`]). Past a map shard's share, it stops noting and the copy of each
/// chunk falls back to a whole copy under the freeze.
pub const TRACKED_BYTES: usize = 64 << 20;
/// What a noted key costs beside its bytes (its box and its place in the set).
const KEY_OVERHEAD: usize = 40;

/// What one map shard has noted since `Start`.
enum Noted {
    Keys(HashSet<Box<[u8]>>),
    /// Over the shard's share of [`TRACKED_BYTES`]: the keys were let go.
    Overflowed,
}

/// One map shard's tracking (see the module's notes).
pub(super) struct Written {
    token: u64,
    slots: Arc<SlotBits>,
    noted: Noted,
    bytes: usize,
    budget: usize,
}

impl Written {
    /// Notes `key` if its slot is tracked.
    #[inline]
    pub(super) fn note(&mut self, key: &[u8]) {
        if !self.slots.has(key_slot(key)) {
            return;
        }
        let Noted::Keys(keys) = &mut self.noted else { return };
        if keys.contains(key) {
            return;
        }
        self.bytes += key.len() + KEY_OVERHEAD;
        if self.bytes > self.budget {
            tracing::debug!(budget = self.budget, "a map shard's tracked keys overflowed");
            self.noted = Noted::Overflowed;
            return;
        }
        keys.insert(key.into());
    }

    /// Moves the noted keys of `wanted` slots into `into`.
    fn drain(&mut self, wanted: &SlotBits, into: &mut BTreeSet<Vec<u8>>) {
        if let Noted::Keys(keys) = &mut self.noted {
            keys.retain(|k| {
                let take = wanted.has(key_slot(k));
                if take {
                    into.insert(k.to_vec());
                }
                !take
            });
        }
    }

    /// Lets go of the noted keys of `slots` (they left the node).
    pub(super) fn forget(&mut self, slots: &SlotBits) {
        if let Noted::Keys(keys) = &mut self.noted {
            keys.retain(|k| !slots.has(key_slot(k)));
        }
    }

    fn holds(&self, token: u64) -> bool {
        self.token == token && matches!(self.noted, Noted::Keys(_))
    }
}

/// The node's tracking: the token, and the keys collected for copying again.
pub(super) struct Tracking {
    token: u64,
    changed: BTreeSet<Vec<u8>>,
}

/// What a `SlotTrack` op answers.
pub(super) enum TrackAnswer {
    /// Started or stopped.
    Done,
    /// A page of copied keys.
    Page(Vec<u8>),
    /// Not tracking under that token (any more): copy whole under the freeze.
    Unknown,
}

impl Store {
    /// A `SlotTrack` op (node-wide).
    pub(super) fn slot_track(&self, value: &[u8], clock: u64) -> Result<TrackAnswer, MalformedOp> {
        let request = TrackRequest::decode(value).ok_or(MalformedOp::BadKeyspace)?;
        let mut tracking = self.own.tracking.lock();
        Ok(match request {
            TrackRequest::Start { token, ranges } => {
                self.start_tracking(&mut tracking, token, &ranges);
                TrackAnswer::Done
            }
            TrackRequest::Stop { token } => {
                self.stop_tracking(&mut tracking, token);
                TrackAnswer::Done
            }
            TrackRequest::Scan { token, req, ranges } => match tracking.as_ref() {
                Some(t) if self.tracks_all(t, token) => TrackAnswer::Page(self.slot_scan_page(req, &ranges, clock)?),
                _ => TrackAnswer::Unknown,
            },
            TrackRequest::Changed { token, req, ranges } => match tracking.as_mut() {
                Some(t) if self.tracks_all(t, token) => TrackAnswer::Page(self.changed_page(t, req, &ranges, clock)),
                _ => TrackAnswer::Unknown,
            },
        })
    }

    fn start_tracking(&self, tracking: &mut Option<Tracking>, token: u64, ranges: &[[u16; 2]]) {
        *tracking = Some(Tracking {
            token,
            changed: BTreeSet::new(),
        });
        let slots = Arc::new(SlotBits::of(ranges));
        let budget = TRACKED_BYTES / self.map.shards.len().max(1);
        for shard in self.map.shards.iter() {
            shard.write().written = Some(Box::new(Written {
                token,
                slots: slots.clone(),
                noted: Noted::Keys(HashSet::new()),
                bytes: 0,
                budget,
            }));
        }
        tracing::info!(token, slots = %kvshared::slots::format_ranges(ranges), "tracking writes for a slot copy");
    }

    fn stop_tracking(&self, tracking: &mut Option<Tracking>, token: u64) {
        if tracking.as_ref().is_none_or(|t| t.token != token) {
            return;
        }
        *tracking = None;
        for shard in self.map.shards.iter() {
            let mut s = shard.write();
            if s.written.as_ref().is_some_and(|w| w.token == token) {
                s.written = None;
            }
        }
    }

    /// Whether every map shard still tracks under `token` (none replaced or overflowed).
    fn tracks_all(&self, t: &Tracking, token: u64) -> bool {
        t.token == token
            && self
                .map
                .shards
                .iter()
                .all(|s| s.read().written.as_ref().is_some_and(|w| w.holds(token)))
    }

    /// A page of the keys of `ranges` written since tracking began: their values now, or
    /// absent. The first page (cursor 0) collects them from the map shards; the cursor is
    /// a position among the collected keys of `ranges`, in key order.
    fn changed_page(&self, t: &mut Tracking, req: ScanRequest, ranges: &[[u16; 2]], clock: u64) -> Vec<u8> {
        let wanted = SlotBits::of(ranges);
        if req.cursor == 0 {
            for shard in self.map.shards.iter() {
                if let Some(w) = shard.write().written.as_deref_mut() {
                    w.drain(&wanted, &mut t.changed);
                }
            }
        }
        let mut page = vec![0u8; 8];
        let (mut sent, mut next) = (0u32, 0u64);
        let keys = t.changed.iter().filter(|k| wanted.has(key_slot(k)));
        for (at, key) in keys.enumerate().skip(usize::try_from(req.cursor).unwrap_or(usize::MAX)) {
            if sent == req.count || page.len() >= MAX_SCAN_PAGE_BYTES {
                next = at as u64;
                break;
            }
            let hash = key_hash(key);
            let s = self.map.shards[map_shard(hash, self.map.shards.len())].read();
            let live = s.table.find(hash, key).and_then(|i| s.table.at(i));
            let value = live.filter(|_| !s.expires.is_due(key, clock)).map(|e| e.value());
            let deadline = value.and(s.expires.get(key));
            encode_copied(&Copied { key, value, deadline }, &mut page);
            sent += 1;
        }
        page[..8].copy_from_slice(&next.to_le_bytes());
        page
    }

    /// Lets go of whatever the tracking holds of `slots` (they left the node).
    pub(super) fn forget_tracked(&self, slots: &SlotBits) {
        if let Some(t) = self.own.tracking.lock().as_mut() {
            t.changed.retain(|k| !slots.has(key_slot(k)));
        }
    }
}

#[cfg(test)]
mod tests {
    use kvshared::expiry::{Deadline, Expire, ExpireIf};
    use kvshared::keyspace::ScanRequest;
    use kvshared::routing::ShardId;
    use kvshared::slot_copy::TrackRequest;
    use kvshared::slots::SlotState;
    use kvshared::wire::{BatchRequest, OpKind, OpReply};
    use proptest::prelude::*;

    use super::super::Store;
    use super::super::slots::tests::{change, keys_in_low_slots, load_page, run};

    const TOKEN: u64 = 0x5eed;
    const MOVING: [[u16; 2]; 1] = [[0, 99]];

    fn track(store: &Store, r: TrackRequest) -> OpReply<'static> {
        let mut req = BatchRequest::new();
        req.push(OpKind::SlotTrack, b"", &r.encode());
        run(store, &req)[0]
    }

    /// One page of `Scan` (`changed` false) or `Changed` loaded into `to`; the next cursor,
    /// or `None` when the source answered `NotFound`.
    fn page(from: &Store, to: &Store, cursor: u64, changed: bool) -> Option<u64> {
        let (token, req, ranges) = (TOKEN, ScanRequest { cursor, count: 3 }, MOVING.to_vec());
        let r = match changed {
            false => TrackRequest::Scan { token, req, ranges },
            true => TrackRequest::Changed { token, req, ranges },
        };
        let OpReply::Found(bytes) = track(from, r) else {
            return None;
        };
        Some(load_page(to, bytes).0)
    }

    /// A write of key `k` to `store`: put (0, 3), delete (1), a deadline set (2).
    fn write(store: &Store, keys: &[Vec<u8>], (k, what): (usize, u8), n: usize) {
        let key = &keys[k % keys.len()];
        let mut req = BatchRequest::new();
        match what {
            1 => req.push_delete(key),
            2 => req.push(
                OpKind::Expire,
                key,
                &Expire {
                    cond: ExpireIf::Always,
                    deadline: Deadline::At(4_000_000_000_000 + n as u64),
                }
                .encode(),
            ),
            _ => req.push_put(key, format!("v{n}").as_bytes()),
        }
        run(store, &req);
    }

    /// Every key of `keys` as `store` answers it: its value and deadline, or absent.
    fn contents(store: &Store, keys: &[Vec<u8>]) -> Vec<(Option<Vec<u8>>, Option<u64>)> {
        keys.iter()
            .map(|k| {
                let mut req = BatchRequest::new();
                req.push_get(k);
                req.push(OpKind::Ttl, k, b"");
                let r = run(store, &req);
                let value = match r[0] {
                    OpReply::Found(v) => Some(v.to_vec()),
                    _ => None,
                };
                let deadline = match r[1] {
                    OpReply::Counted(at) if at >= 0 => Some(at as u64),
                    _ => None,
                };
                (value, deadline)
            })
            .collect()
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]
        /// Whatever is put, removed or given a deadline in the moving slots while they are
        /// copied before the freeze (before, between and after the pages), the target ends
        /// holding exactly what the source held at the freeze, after copying only the keys
        /// written since.
        #[test]
        fn the_target_ends_with_what_the_source_held_at_the_freeze(
            writes in proptest::collection::vec((0usize..40, 0u8..4), 0..120),
            cuts in proptest::collection::vec(0usize..120, 2),
        ) {
            let (a, b) = (
                Store::new(ShardId { index: 0, count: 2 }, 4, 0).unwrap(),
                Store::new(ShardId { index: 1, count: 2 }, 4, 0).unwrap(),
            );
            let keys = keys_in_low_slots(40);
            for (n, k) in keys.iter().enumerate().take(25) {
                write(&a, &keys, (n, 0), n);
                prop_assert!(!k.is_empty());
            }
            let (first, second) = (cuts[0].min(cuts[1]).min(writes.len()), cuts[0].max(cuts[1]).min(writes.len()));
            prop_assert_eq!(track(&a, TrackRequest::Start { token: TOKEN, ranges: MOVING.to_vec() }), OpReply::Stored);
            prop_assert_eq!(change(&b, &MOVING, SlotState::Importing, 1, 1), OpReply::Stored);
            for (n, w) in writes[..first].iter().enumerate() {
                write(&a, &keys, *w, n);
            }
            let (mut cursor, mut n) = (0, first);
            loop {
                cursor = page(&a, &b, cursor, false).unwrap();
                if let Some(w) = writes.get(n).filter(|_| n < second) {
                    write(&a, &keys, *w, n);
                    n += 1;
                }
                if cursor == 0 {
                    break;
                }
            }
            for (i, w) in writes[n..].iter().enumerate() {
                write(&a, &keys, *w, n + i);
            }
            prop_assert_eq!(change(&a, &MOVING, SlotState::Frozen, 0, 1), OpReply::Stored);
            let held = contents(&a, &keys);
            let mut cursor = 0;
            loop {
                cursor = page(&a, &b, cursor, true).unwrap();
                if cursor == 0 {
                    break;
                }
            }
            prop_assert_eq!(change(&a, &MOVING, SlotState::Gone, 1, 1), OpReply::Stored);
            prop_assert_eq!(change(&b, &MOVING, SlotState::Owned, 1, 1), OpReply::Stored);
            prop_assert_eq!(contents(&b, &keys), held);
        }
    }

    /// A flush, another token or a stop loses the tracking: every step then answers
    /// `NotFound`, so the admin copies whole.
    #[test]
    fn a_lost_tracking_is_said() {
        let (a, b) = (
            Store::new(ShardId { index: 0, count: 2 }, 4, 0).unwrap(),
            Store::new(ShardId { index: 1, count: 2 }, 4, 0).unwrap(),
        );
        let start = TrackRequest::Start {
            token: TOKEN,
            ranges: MOVING.to_vec(),
        };
        assert_eq!(track(&a, start.clone()), OpReply::Stored);
        assert_eq!(page(&a, &b, 0, false), Some(0));
        a.flush();
        assert_eq!(page(&a, &b, 0, false), None, "a flushed store tracks nothing");
        assert_eq!(page(&a, &b, 0, true), None);
        assert_eq!(track(&a, start), OpReply::Stored);
        assert_eq!(track(&a, TrackRequest::Stop { token: 9 }), OpReply::Stored);
        assert_eq!(page(&a, &b, 0, true), Some(0), "another token's stop changes nothing");
        assert_eq!(track(&a, TrackRequest::Stop { token: TOKEN }), OpReply::Stored);
        assert_eq!(page(&a, &b, 0, true), None);
        let mut bad = BatchRequest::new();
        bad.push(OpKind::SlotTrack, b"", &[9, 9]);
        assert!(matches!(run(&a, &bad)[0], OpReply::Malformed(_)));
    }
}
