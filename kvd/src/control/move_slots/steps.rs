//! One chunk of a move: where each of its slots stands, read from both groups' tables, and
//! the logged steps each still needs.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use crate::control::error::refuse;
use kvshared::slots::{Slot, SlotChange, SlotState};

use super::Groups;
use super::copy::{self, Tracked};

/// What one chunk's move did.
#[derive(Default)]
pub(super) struct Moved {
    /// Keys copied while the chunk was frozen.
    pub(super) keys: u64,
    /// From the freeze to the target owning the chunk.
    pub(super) frozen_for: Duration,
    /// The source no longer tracked the chunk's writes: it was copied whole.
    pub(super) tracking_lost: bool,
}

/// Where one slot's move stands, from both groups' tables.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Stage {
    /// Owned by the source; the target holds nothing of it.
    Freeze,
    /// Owned by the source, importing at the target: copied before the freeze (or a copy
    /// that was cut short).
    Precopied,
    /// Frozen at the source; the target does not import it yet.
    Import,
    /// Frozen at the source, importing at the target.
    Copy,
    /// Gone from the source to the target, still importing there: the target takes it.
    Own,
    /// Owned by the target.
    Done,
}

/// How a slot's keys reach the target in this chunk.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Path {
    /// Copied before the freeze under the tracking: once frozen, only the keys written since.
    Changed,
    /// Copied whole while frozen, into a new import (whatever the target held of it goes).
    Whole,
    /// In the target already: it only takes the slot.
    Own,
}

/// Moves one chunk: reads where each slot stands, then runs the steps each needs. A source
/// that lost its tracking has the chunk copied whole, frozen.
pub(super) async fn move_chunk(
    groups: &Groups,
    (from, to): (usize, usize),
    part: &[u16],
    tracked: Option<&Tracked>,
) -> crate::control::error::Result<Moved> {
    let began = Instant::now();
    if let Some(moved) = chunk_once(groups, (from, to), part, tracked).await? {
        return Ok(moved);
    }
    eprintln!("kvd: group {from} no longer tracks this chunk's writes; copying it whole while it is frozen");
    let mut moved = chunk_once(groups, (from, to), part, None).await?.unwrap_or_default();
    moved.frozen_for = moved.frozen_for.max(began.elapsed());
    moved.tracking_lost = true;
    Ok(moved)
}

/// One try at a chunk; `None` when the source no longer tracks it (nothing handed over).
async fn chunk_once(
    groups: &Groups,
    (from, to): (usize, usize),
    part: &[u16],
    tracked: Option<&Tracked>,
) -> crate::control::error::Result<Option<Moved>> {
    let (src, dst) = (groups.table(from).await?, groups.table(to).await?);
    let epoch_now = src.iter().chain(&dst).map(|s| s.epoch).max().unwrap_or(0);
    // Slots handed over on what the target imported keep that import's epoch; a slot
    // copied whole is imported afresh at a new one.
    let mut by_epoch: BTreeMap<u32, Vec<(u16, Stage, Path)>> = BTreeMap::new();
    for &slot in part {
        let (s, t) = (src[usize::from(slot)], dst[usize::from(slot)]);
        let st = stage(slot, s, t, (from, to))?;
        let (path, epoch) = match st {
            Stage::Done => continue,
            Stage::Own => (Path::Own, t.epoch),
            Stage::Precopied if tracked.is_some_and(|k| k.epoch == t.epoch) => (Path::Changed, t.epoch),
            _ => (Path::Whole, epoch_now + 1),
        };
        by_epoch.entry(epoch).or_default().push((slot, st, path));
    }
    let mut moved = Moved::default();
    for (epoch, list) in by_epoch {
        let Some(m) = run_steps(groups, (from, to), epoch, &list, tracked).await? else {
            return Ok(None);
        };
        moved.keys += m.keys;
        moved.frozen_for = moved.frozen_for.max(m.frozen_for);
    }
    Ok(Some(moved))
}

/// Where `slot` stands between source `from` (entry `s`) and target `to` (entry `t`).
pub(super) fn stage(slot: u16, s: Slot, t: Slot, (from, to): (usize, usize)) -> crate::control::error::Result<Stage> {
    let to16 = to as u16;
    Ok(match (s.state, t.state) {
        (SlotState::Owned, SlotState::Gone) => Stage::Freeze,
        (SlotState::Owned, SlotState::Importing) => Stage::Precopied,
        (SlotState::Frozen, SlotState::Gone) => Stage::Import,
        (SlotState::Frozen, SlotState::Importing) => Stage::Copy,
        (SlotState::Gone, SlotState::Importing) if s.owner == to16 => Stage::Own,
        (SlotState::Gone, SlotState::Owned | SlotState::Frozen) if s.owner == to16 => Stage::Done,
        _ => refuse!(
            "slot {slot} is {} at group {from} and {} at group {to}: not a move from {from} to {to} \
             (see `kvd admin slots`)",
            describe(s),
            describe(t)
        ),
    })
}

pub(super) fn describe(s: Slot) -> String {
    match s.state {
        SlotState::Gone => format!("gone to group {} (epoch {})", s.owner, s.epoch),
        state => format!("{} (epoch {})", state.as_str(), s.epoch),
    }
}

/// The slots of `list` that `keep` accepts, as inclusive ranges in order.
fn ranges_of(list: &[(u16, Stage, Path)], keep: impl Fn(Stage, Path) -> bool) -> Vec<[u16; 2]> {
    let slots: Vec<u16> = list
        .iter()
        .filter(|(_, st, p)| keep(*st, *p))
        .map(|(s, ..)| *s)
        .collect();
    kvshared::slots::ranges_of_slots(&slots)
}

/// Runs the steps the slots of `list` still need, at `epoch`; `None` when the source no
/// longer tracks the slots copied before the freeze (they stay frozen, not handed over).
async fn run_steps(
    groups: &Groups,
    (from, to): (usize, usize),
    epoch: u32,
    list: &[(u16, Stage, Path)],
    tracked: Option<&Tracked>,
) -> crate::control::error::Result<Option<Moved>> {
    let change = |ranges: Vec<[u16; 2]>, to_state, owner: usize| SlotChange {
        ranges,
        to: to_state,
        owner: owner as u16,
        epoch,
    };
    let mut moved = Moved::default();
    let changed = ranges_of(list, |_, p| p == Path::Changed);
    if !changed.is_empty() {
        // The hand-over begins: the target, which sent these slots' clients to the source
        // while it copied them, answers "try again" from now until it owns them.
        groups
            .change(to, &change(changed.clone(), SlotState::Importing, to))
            .await?;
    }
    let freeze = ranges_of(list, |st, _| matches!(st, Stage::Freeze | Stage::Precopied));
    if !freeze.is_empty() {
        groups.change(from, &change(freeze, SlotState::Frozen, from)).await?;
    }
    let frozen_at = Instant::now();
    let whole = ranges_of(list, |_, p| p == Path::Whole);
    if !whole.is_empty() {
        // (Naming the target: its hand-over is under way, "try again" there meanwhile.)
        groups
            .change(to, &change(whole.clone(), SlotState::Importing, to))
            .await?;
        moved.keys += copy::copy_whole(groups, (from, to), &whole).await?;
    }
    if let (false, Some(t)) = (changed.is_empty(), tracked) {
        let Some(keys) = copy::copy_changed(groups, (from, to), t, &changed).await? else {
            return Ok(None);
        };
        moved.keys += keys;
    }
    let handed = ranges_of(list, |_, p| p != Path::Own);
    if !handed.is_empty() {
        groups.change(from, &change(handed, SlotState::Gone, to)).await?;
    }
    let own = ranges_of(list, |_, _| true);
    if !own.is_empty() {
        groups.change(to, &change(own.clone(), SlotState::Owned, to)).await?;
        moved.frozen_for = frozen_at.elapsed();
        tell_the_others(groups, (from, to), &change(own, SlotState::Gone, to)).await;
    }
    Ok(Some(moved))
}

/// Tells every group but the two that `change`'s slots are now the target's, all at once,
/// so that they redirect clients there in one hop (a group that cannot be told now still
/// redirects to the source, which redirects on: a warning, not a failure).
async fn tell_the_others(groups: &Groups, (from, to): (usize, usize), change: &SlotChange) {
    let others = (0..groups.count()).filter(|&g| g != from && g != to);
    let told = others.map(|g| async move { (g, groups.change(g, change).await) });
    for (g, outcome) in futures::future::join_all(told).await {
        if let Err(e) = outcome {
            eprintln!("kvd: warning: group {g} was not told the slots' new owner: {e:#}");
        }
    }
}
