//! A move's copies: every key of the moving slots before the freeze, under the source's
//! tracking of the keys written meanwhile (`SlotTrack`); the keys written since, once a
//! chunk is frozen; or a chunk's keys whole while it is frozen (`SlotScan`), when the
//! source does not track it. Each page read from the source is written into the target
//! through its log (`Load` ops; a key removed at the source is removed at the target).

use std::time::Instant;

use crate::control::error::{ControlError, refuse, unexpected};
use kvshared::client::Reply;
use kvshared::keyspace::ScanRequest;
use kvshared::routing::key_slot;
use kvshared::slot_copy::{TrackRequest, decode_copied, encode_load};
use kvshared::slots::{self, SlotBits, SlotChange, SlotState};
use kvshared::wire::{BatchRequest, OpKind, OpReply};

use super::Groups;

/// Keys asked for per page of a copy (the most a scan request may ask; a page also stops at
/// `MAX_COPY_PAGE_BYTES`).
const PAGE_KEYS: u32 = kvshared::keyspace::MAX_SCAN_COUNT;
/// Whole copies of a frozen chunk tried before the move stops (each cut short by a change
/// of the source's leader).
const WHOLE_COPY_TRIES: usize = 5;

/// A copy made before the freeze: the source tracks the writes under `token`; the targets
/// import the slots at `epoch`.
pub(super) struct Tracked {
    pub(super) token: u64,
    pub(super) epoch: u32,
    /// Keys copied before the freeze, per target (in the order the move named them).
    pub(super) keys: Vec<u64>,
}

/// A copy's target: the group and the slots it takes (a page's key of another slot is
/// refused: the source sent what was not asked).
pub(super) struct Target {
    to: usize,
    takes: SlotBits,
}

impl Target {
    /// Group `to`, taking the slots of `ranges`.
    pub(super) fn new(to: usize, ranges: &[[u16; 2]]) -> Target {
        Target {
            to,
            takes: SlotBits::of(ranges),
        }
    }

    fn takes(&self, slot: u16) -> bool {
        self.takes.has(slot)
    }
}

/// Copies every key of the slots each target takes that the source still owns outright
/// into that target, which imports them at a new epoch (one for all the targets), while
/// the source tracks the keys written meanwhile under one token; one stream of pages serves
/// every target, each page's keys loaded into their targets side by side. `None` when
/// there was nothing to copy so, or the source stopped tracking (each chunk is then copied
/// whole, frozen).
pub(super) async fn precopy(
    groups: &Groups,
    from: usize,
    targets: &[(usize, &[u16])],
) -> crate::control::error::Result<Option<Tracked>> {
    let (fresh, epoch) = fresh_slots(groups, from, targets).await?;
    let mut union: Vec<u16> = fresh.iter().flat_map(|(_, s)| s.iter().copied()).collect();
    union.sort_unstable();
    union.dedup();
    if union.is_empty() {
        return Ok(None);
    }
    let ranges = slots::ranges_of_slots(&union);
    let began = Instant::now();
    let token = start_tracking(groups, from, &ranges).await?;
    let imports = fresh.iter().filter(|(_, s)| !s.is_empty()).map(|(to, slots)| {
        let import = SlotChange {
            ranges: slots::ranges_of_slots(slots),
            to: SlotState::Importing,
            // The source: the target redirects to it until the hand-over.
            owner: from as u16,
            epoch,
        };
        async move { groups.change(*to, &import).await }
    });
    futures::future::try_join_all(imports).await?;
    // One page stream for every target: the source walks its keys once, whatever the
    // number of targets, and each page's keys are loaded into their targets side by side.
    // (A stream per target walked every key once per target: five times the source's CPU
    // for a hot group spread five ways.)
    let takers: Vec<Target> = fresh
        .iter()
        .map(|(to, slots)| Target::new(*to, &slots::ranges_of_slots(slots)))
        .collect();
    let page = |cursor| {
        let req = ScanRequest {
            cursor,
            count: PAGE_KEYS,
        };
        let ranges = ranges.clone();
        (OpKind::SlotTrack, TrackRequest::Scan { token, req, ranges }.encode())
    };
    let Some(keys) = copy_pages(groups, from, &takers, page).await? else {
        eprintln!(
            "kvd: group {from} stopped tracking the slots' writes during the copy; each chunk is copied whole while frozen"
        );
        stop_tracking(groups, from, token).await;
        return Ok(None);
    };
    let took = began.elapsed().as_secs_f64();
    for ((to, slots), k) in fresh.iter().zip(&keys).filter(|((_, s), _)| !s.is_empty()) {
        eprintln!(
            "kvd: copied {k} keys of {} slots from group {from} to group {to} before freezing them, in {took:.2} s ({:.0} keys/s)",
            slots.len(),
            *k as f64 / took.max(1e-9)
        );
    }
    Ok(Some(Tracked { token, epoch, keys }))
}

/// The slots each target may take by a copy ahead (owned outright by the source, held by
/// the target as gone or a cut-short import), and the epoch of the imports: one above any
/// the source's and the targets' tables hold.
async fn fresh_slots(
    groups: &Groups,
    from: usize,
    targets: &[(usize, &[u16])],
) -> crate::control::error::Result<(Vec<(usize, Vec<u16>)>, u32)> {
    let src = groups.table(from).await?;
    let dsts = futures::future::try_join_all(targets.iter().map(|&(to, _)| groups.table(to))).await?;
    let mut fresh: Vec<(usize, Vec<u16>)> = Vec::new();
    let mut epoch = src.iter().map(|s| s.epoch).max().unwrap_or(0);
    for (&(to, slots), dst) in targets.iter().zip(dsts) {
        epoch = epoch.max(dst.iter().map(|s| s.epoch).max().unwrap_or(0));
        let takes = |s: &u16| {
            let (s, t) = (src.get(usize::from(*s)), dst.get(usize::from(*s)));
            s.is_some_and(|s| s.state == SlotState::Owned)
                && t.is_some_and(|t| matches!(t.state, SlotState::Gone | SlotState::Importing))
        };
        fresh.push((to, slots.iter().copied().filter(takes).collect()));
    }
    Ok((fresh, epoch + 1))
}

/// Ends the source's tracking (best effort: a source that restarted has none left, and a
/// later move's `Start` replaces it anyway).
pub(super) async fn stop_tracking(groups: &Groups, from: usize, token: u64) {
    let stop = TrackRequest::Stop { token }.encode();
    if let Err(e) = groups.one(from, OpKind::SlotTrack, &stop).await {
        tracing::debug!(error = %e, "stopping the source's tracking");
    }
}

/// Copies the keys of `ranges` (frozen at the source) written since the copy before the
/// freeze; `None` when the source no longer tracks them under `t`'s token.
pub(super) async fn copy_changed(
    groups: &Groups,
    (from, to): (usize, usize),
    t: &Tracked,
    ranges: &[[u16; 2]],
) -> crate::control::error::Result<Option<u64>> {
    let page = |cursor| {
        let req = ScanRequest {
            cursor,
            count: PAGE_KEYS,
        };
        let changed = TrackRequest::Changed {
            token: t.token,
            req,
            ranges: ranges.to_vec(),
        };
        (OpKind::SlotTrack, changed.encode())
    };
    let copied = copy_pages(groups, from, &[Target::new(to, ranges)], page).await?;
    Ok(copied.map(|keys| keys.iter().sum()))
}

/// Copies every key of `ranges` from group `from` (frozen there) into group `to`
/// (importing there); returns how many. The pages are read under a tracking token, so that
/// they all come from one member's tables (a scan's cursor means nothing on another's);
/// when the source's leader changes under the copy, it starts over (the slots are frozen:
/// what was loaded stays right).
pub(super) async fn copy_whole(
    groups: &Groups,
    (from, to): (usize, usize),
    ranges: &[[u16; 2]],
) -> crate::control::error::Result<u64> {
    for _ in 0..WHOLE_COPY_TRIES {
        let token = start_tracking(groups, from, ranges).await?;
        let page = |cursor| {
            let req = ScanRequest {
                cursor,
                count: PAGE_KEYS,
            };
            let scan = TrackRequest::Scan {
                token,
                req,
                ranges: ranges.to_vec(),
            };
            (OpKind::SlotTrack, scan.encode())
        };
        let copied = copy_pages(groups, from, &[Target::new(to, ranges)], page).await?;
        stop_tracking(groups, from, token).await;
        if let Some(keys) = copied {
            return Ok(keys.iter().sum());
        }
    }
    refuse!(
        "group {from}'s leader changed under each of {WHOLE_COPY_TRIES} copies of slots {}",
        slots::format_ranges(ranges)
    )
}

/// Starts group `from`'s tracking of `ranges` under a new token.
async fn start_tracking(groups: &Groups, from: usize, ranges: &[[u16; 2]]) -> crate::control::error::Result<u64> {
    let token = rand::random::<u64>();
    let start = TrackRequest::Start {
        token,
        ranges: ranges.to_vec(),
    };
    match groups
        .one(from, OpKind::SlotTrack, &start.encode())
        .await?
        .batch()?
        .result(0)
    {
        OpReply::Stored => Ok(token),
        other => unexpected!("group {from} did not start tracking the slots' writes: {other:?}"),
    }
}

/// Reads pages from group `from` (`page` makes the op for a cursor) and loads each key
/// into the target that takes its slot (the targets of one page side by side), until the
/// source says it is done; the next page is read while the last one is loaded. Returns how
/// many keys each target took, or `None` when the source answered `NotFound` (no tracking
/// under the token asked).
async fn copy_pages(
    groups: &Groups,
    from: usize,
    targets: &[Target],
    page: impl Fn(u64) -> (OpKind, Vec<u8>),
) -> crate::control::error::Result<Option<Vec<u64>>> {
    let read = |cursor| {
        let (kind, request) = page(cursor);
        async move { groups.one(from, kind, &request).await }
    };
    let mut keys = vec![0u64; targets.len()];
    let mut reply = read(0).await?;
    loop {
        let Some((next, loads)) = loads_of_page(from, targets, &reply)? else {
            return Ok(None);
        };
        let stored = futures::future::join_all(targets.iter().zip(&loads).map(|(t, load)| store(groups, t.to, load)));
        let (following, stored) = match next {
            0 => (None, stored.await),
            next => {
                let (following, stored) = tokio::join!(read(next), stored);
                (Some(following), stored)
            }
        };
        for (k, s) in keys.iter_mut().zip(stored) {
            *k += s?;
        }
        match following {
            None => return Ok(Some(keys)),
            Some(following) => reply = following?,
        }
    }
}

/// The most bytes of keys and values one `Load` batch to a target carries (at least one key
/// a batch): a page of the source's is up to `MAX_COPY_PAGE_BYTES` and more, and a target
/// started with a smaller `--max-frame` refused it whole, closing the connection.
const LOAD_BATCH_BYTES: usize = 1 << 20;

/// One page from the source as `Load` batches for each target (in `targets`' order), and
/// the next cursor (0: done); `None` when the source answered `NotFound`.
fn loads_of_page(
    from: usize,
    targets: &[Target],
    reply: &Reply,
) -> crate::control::error::Result<Option<(u64, Vec<Vec<BatchRequest>>)>> {
    let view = reply.batch()?;
    let bytes = match view.result(0) {
        OpReply::Found(bytes) => bytes,
        OpReply::NotFound => return Ok(None),
        other => unexpected!("group {from} did not answer a copy's page: {other:?}"),
    };
    let (next, copied) =
        decode_copied(bytes).ok_or_else(|| ControlError::Unexpected("a copy's page does not parse".into()))?;
    let mut loads: Vec<Loads> = targets.iter().map(|_| Loads::default()).collect();
    let mut value = Vec::new();
    for c in &copied {
        let slot = key_slot(c.key);
        let Some(load) = targets
            .iter()
            .position(|t| t.takes(slot))
            .and_then(|t| loads.get_mut(t))
        else {
            unexpected!("group {from} sent a key of slot {slot}, which this copy does not move");
        };
        value.clear();
        encode_load(c.value, c.deadline, &mut value);
        load.push(c.key, &value);
    }
    Ok(Some((next, loads.into_iter().map(|l| l.batches).collect())))
}

/// A target's `Load` batches, each within [`LOAD_BATCH_BYTES`].
#[derive(Default)]
struct Loads {
    batches: Vec<BatchRequest>,
    bytes: usize,
}

impl Loads {
    fn push(&mut self, key: &[u8], value: &[u8]) {
        let size = key.len() + value.len();
        match self.batches.last_mut() {
            Some(b) if self.bytes + size <= LOAD_BATCH_BYTES => {
                b.push(OpKind::Load, key, value);
                self.bytes += size;
            }
            _ => {
                let mut b = BatchRequest::new();
                b.push(OpKind::Load, key, value);
                self.batches.push(b);
                self.bytes = size;
            }
        }
    }
}

/// Loads `loads` into group `to`, one batch after another; how many keys it took.
async fn store(groups: &Groups, to: usize, loads: &[BatchRequest]) -> crate::control::error::Result<u64> {
    let mut took = 0;
    for load in loads {
        let reply = groups.send(to, load).await?;
        let view = reply.batch()?;
        for i in 0..view.len() {
            match view.result(i) {
                OpReply::Stored => {}
                other => unexpected!("group {to} did not take a copied key: {other:?}"),
            }
        }
        took += view.len() as u64;
    }
    Ok(took)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A copy's target takes the keys of its slots and no other (a page holding another
    /// slot's key is refused).
    #[test]
    fn a_target_takes_the_keys_of_its_slots_only() {
        let key_in = |slots: std::ops::RangeInclusive<u16>| {
            (0..)
                .map(|i| format!("k{i}").into_bytes())
                .find(|k| slots.contains(&key_slot(k)))
                .unwrap_or_default()
        };
        let t = Target::new(7, &[[300, 399], [1000, 1000]]);
        let takes = |k: Vec<u8>| t.takes(key_slot(&k));
        assert!(takes(key_in(300..=399)));
        assert!(takes(key_in(1000..=1000)));
        assert!(!takes(key_in(0..=299)));
        assert!(!takes(key_in(400..=999)));
    }

    /// A target's loads are cut into batches within `LOAD_BATCH_BYTES` (a key bigger than
    /// that alone in its batch), in the order the page gave them.
    #[test]
    fn loads_are_cut_into_batches_within_the_byte_bound() {
        let mut loads = Loads::default();
        let big = vec![7u8; LOAD_BATCH_BYTES];
        let small = vec![1u8; LOAD_BATCH_BYTES / 3];
        for (key, value) in [
            (&b"a"[..], &small),
            (b"b", &small),
            (b"c", &big),
            (b"d", &small),
            (b"e", &small),
        ] {
            loads.push(key, value);
        }
        let keys: Vec<Vec<&[u8]>> = loads
            .batches
            .iter()
            .map(|b| (0..b.len()).filter_map(|i| b.key(i)).collect())
            .collect();
        let expected: Vec<Vec<&[u8]>> = vec![vec![b"a", b"b"], vec![b"c"], vec![b"d", b"e"]];
        assert_eq!(keys, expected);
    }
}
