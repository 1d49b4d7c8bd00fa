//! A move's copies: every key of the moving slots before the freeze, under the source's
//! tracking of the keys written meanwhile (`SlotTrack`); the keys written since, once a
//! chunk is frozen; or a chunk's keys whole while it is frozen (`SlotScan`), when the
//! source does not track it. Each page read from the source is written into the target
//! through its log (`Load` ops; a key removed at the source is removed at the target).

use std::time::Instant;

use anyhow::{Context, bail};
use kvshared::keyspace::ScanRequest;
use kvshared::slot_copy::{TrackRequest, decode_copied, encode_load};
use kvshared::slots::{self, SlotChange, SlotState};
use kvshared::wire::{BatchRequest, OpKind, OpReply};

use super::Groups;

/// Keys asked for per page of a copy.
const PAGE_KEYS: u32 = 2_000;
/// Whole copies of a frozen chunk tried before the move stops (each cut short by a change
/// of the source's leader).
const WHOLE_COPY_TRIES: usize = 5;

/// A copy made before the freeze: the source tracks the writes under `token`; the target
/// imports the slots at `epoch`.
pub(super) struct Tracked {
    pub(super) token: u64,
    pub(super) epoch: u32,
    /// Keys copied before the freeze.
    pub(super) keys: u64,
}

/// Copies every key of the slots of `all` that the source still owns outright into the
/// target, which imports them at a new epoch, while the source tracks the keys written
/// meanwhile. `None` when there was nothing to copy so, or the source stopped tracking
/// (each chunk is then copied whole, frozen).
pub(super) async fn precopy(
    groups: &Groups,
    (from, to): (usize, usize),
    all: &[u16],
) -> anyhow::Result<Option<Tracked>> {
    let (src, dst) = (groups.table(from).await?, groups.table(to).await?);
    let epoch = src.iter().chain(&dst).map(|s| s.epoch).max().unwrap_or(0) + 1;
    let fresh: Vec<u16> = all
        .iter()
        .copied()
        .filter(|&s| {
            let (s, t) = (src[usize::from(s)], dst[usize::from(s)]);
            s.state == SlotState::Owned && matches!(t.state, SlotState::Gone | SlotState::Importing)
        })
        .collect();
    if fresh.is_empty() {
        return Ok(None);
    }
    let ranges = slots::ranges_of_slots(&fresh);
    let began = Instant::now();
    let token = start_tracking(groups, from, &ranges).await?;
    let mut tracked = Tracked { token, epoch, keys: 0 };
    let import = SlotChange {
        ranges: ranges.clone(),
        to: SlotState::Importing,
        // The source: the target redirects to it until the hand-over.
        owner: from as u16,
        epoch,
    };
    groups.change(to, &import).await?;
    let page = |cursor| {
        let req = ScanRequest {
            cursor,
            count: PAGE_KEYS,
        };
        let ranges = ranges.clone();
        (OpKind::SlotTrack, TrackRequest::Scan { token, req, ranges }.encode())
    };
    let Some(keys) = copy_pages(groups, (from, to), page).await? else {
        eprintln!(
            "kvd: group {from} stopped tracking the slots' writes during the copy; each chunk is copied whole while frozen"
        );
        stop_tracking(groups, from, token).await;
        return Ok(None);
    };
    tracked.keys = keys;
    let took = began.elapsed().as_secs_f64();
    eprintln!(
        "kvd: copied {keys} keys of {} slots from group {from} to group {to} before freezing them, in {took:.2} s ({:.0} keys/s)",
        fresh.len(),
        keys as f64 / took.max(1e-9)
    );
    Ok(Some(tracked))
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
) -> anyhow::Result<Option<u64>> {
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
    copy_pages(groups, (from, to), page).await
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
) -> anyhow::Result<u64> {
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
        let copied = copy_pages(groups, (from, to), page).await?;
        stop_tracking(groups, from, token).await;
        if let Some(keys) = copied {
            return Ok(keys);
        }
    }
    bail!(
        "group {from}'s leader changed under each of {WHOLE_COPY_TRIES} copies of slots {}",
        slots::format_ranges(ranges)
    )
}

/// Starts group `from`'s tracking of `ranges` under a new token.
async fn start_tracking(groups: &Groups, from: usize, ranges: &[[u16; 2]]) -> anyhow::Result<u64> {
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
        other => bail!("group {from} did not start tracking the slots' writes: {other:?}"),
    }
}

/// Reads pages from group `from` (`page` makes the op for a cursor) and loads their keys
/// into group `to`, until the source says it is done; returns how many keys, or `None` when
/// the source answered `NotFound` (no tracking under the token asked).
async fn copy_pages(
    groups: &Groups,
    (from, to): (usize, usize),
    page: impl Fn(u64) -> (OpKind, Vec<u8>),
) -> anyhow::Result<Option<u64>> {
    let (mut cursor, mut keys) = (0u64, 0u64);
    let mut load = BatchRequest::new();
    let mut value = Vec::new();
    loop {
        let (kind, request) = page(cursor);
        let reply = groups.one(from, kind, &request).await?;
        let view = reply.batch()?;
        let bytes = match view.result(0) {
            OpReply::Found(bytes) => bytes,
            OpReply::NotFound => return Ok(None),
            other => bail!("group {from} did not answer a copy's page: {other:?}"),
        };
        let (next, copied) = decode_copied(bytes).context("a copy's page does not parse")?;
        load.clear();
        for c in &copied {
            value.clear();
            encode_load(c.value, c.deadline, &mut value);
            load.push(OpKind::Load, c.key, &value);
        }
        if !load.is_empty() {
            let reply = groups.send(to, &load).await?;
            let view = reply.batch()?;
            for i in 0..view.len() {
                match view.result(i) {
                    OpReply::Stored => keys += 1,
                    other => bail!("group {to} did not take a copied key: {other:?}"),
                }
            }
        }
        if next == 0 {
            return Ok(Some(keys));
        }
        cursor = next;
    }
}
