//! `kvd admin rebalance`, `add-shard` and `remove-shard`: plans which slots go where from
//! every group's own table, then runs the moves with `move_slots` (each resumable: run the
//! command again after an interruption; it plans from where the slots are then).

use crate::control::error::refuse;
use kvshared::routing::SLOTS;
use kvshared::slots::{Slot, SlotChange, SlotState};

use crate::control::move_slots::{Groups, move_slots};

/// One planned move: from a group, to a group, these slots (ascending).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Planned {
    pub from: usize,
    pub to: usize,
    pub slots: Vec<u16>,
}

/// Which slots each group owns, from the groups' own tables; refuses a cluster with a move
/// unfinished or a slot without exactly one owner.
pub fn owned_by_group(tables: &[Vec<Slot>]) -> crate::control::error::Result<Vec<Vec<u16>>> {
    let mut owned = vec![Vec::new(); tables.len()];
    let mut owners = vec![0u8; usize::from(SLOTS)];
    for (g, table) in tables.iter().enumerate() {
        for (s, e) in table.iter().enumerate().take(usize::from(SLOTS)) {
            match e.state {
                SlotState::Owned => {
                    owned[g].push(s as u16);
                    owners[s] = owners[s].saturating_add(1);
                }
                SlotState::Frozen | SlotState::Importing => refuse!(
                    "slot {s} is {} at group {g}: a move is unfinished; run `kvd admin move-slots` for it again \
                     (see `kvd admin slots`)",
                    e.state.as_str()
                ),
                SlotState::Gone => {}
            }
        }
    }
    if let Some(s) = owners.iter().position(|&n| n != 1) {
        refuse!(
            "slot {s} has {} owners among the groups --nodes lists: list every group of the cluster",
            owners[s]
        );
    }
    Ok(owned)
}

/// The moves that leave every group of `keep` with an even share of the slots (the first
/// `16384 % k` one more) and the others with none. Each donor gives its highest slots.
pub fn plan_even(owned: &[Vec<u16>], keep: &[usize]) -> Vec<Planned> {
    let k = keep.len().max(1);
    let target = |g: usize| match keep.iter().position(|&x| x == g) {
        Some(i) => usize::from(SLOTS) / k + usize::from(i < usize::from(SLOTS) % k),
        None => 0,
    };
    let mut spare: Vec<(usize, Vec<u16>)> = Vec::new();
    for (g, slots) in owned.iter().enumerate() {
        let t = target(g);
        if slots.len() > t {
            spare.push((g, slots[t..].to_vec()));
        }
    }
    let mut plan = Vec::new();
    for (g, slots) in owned.iter().enumerate() {
        let mut need = target(g).saturating_sub(slots.len());
        while need > 0 {
            let Some((from, give)) = spare.iter_mut().find(|(_, s)| !s.is_empty()) else {
                break;
            };
            let n = need.min(give.len());
            let taken: Vec<u16> = give.drain(give.len() - n..).collect();
            plan.push(Planned {
                from: *from,
                to: g,
                slots: taken,
            });
            need -= n;
        }
    }
    plan
}

/// Inclusive ranges of ascending slots.
pub fn ranges(slots: &[u16]) -> Vec<[u16; 2]> {
    let mut out: Vec<[u16; 2]> = Vec::new();
    for &s in slots {
        match out.last_mut() {
            Some(r) if r[1] + 1 == s => r[1] = s,
            _ => out.push([s, s]),
        }
    }
    out
}

pub async fn tables(groups: &Groups) -> crate::control::error::Result<Vec<Vec<Slot>>> {
    let mut all = Vec::with_capacity(groups.count());
    for g in 0..groups.count() {
        all.push(groups.table(g).await?);
    }
    Ok(all)
}

/// Moves slots until the groups of `keep` hold even shares (the rest none).
pub async fn rebalance(groups: &Groups, keep: &[usize], chunk: usize) -> crate::control::error::Result<()> {
    let owned = owned_by_group(&tables(groups).await?)?;
    let plan = plan_even(&owned, keep);
    if plan.is_empty() {
        eprintln!("kvd: the slots are spread evenly already; nothing to move");
    }
    run_plan(groups, &plan, chunk, |_| String::new()).await
}

/// Runs `plan`'s moves in order, saying each (with `note`'s words about it) first.
async fn run_plan(
    groups: &Groups,
    plan: &[Planned],
    chunk: usize,
    note: impl Fn(&Planned) -> String,
) -> crate::control::error::Result<()> {
    for p in plan {
        eprintln!(
            "kvd: moving {} slots{} from group {} to group {}",
            p.slots.len(),
            note(p),
            p.from,
            p.to
        );
        move_slots(groups, (p.from, p.to), &ranges(&p.slots), chunk).await?;
    }
    Ok(())
}

/// Most slots one `rebalance --by load` moves.
pub const MAX_LOAD_MOVES: usize = 64;

/// The moves that even out the groups' load (`load[s]`: slot `s`'s ops over the window):
/// while the busiest and the idlest group differ by more than a tenth of the mean, the
/// busiest gives the idlest the slot whose load is nearest half the difference (and below
/// it, so the difference shrinks), at most [`MAX_LOAD_MOVES`] slots. Only a slot carrying
/// an eighth of the difference or more moves (each move closes a quarter of the gap or more;
/// cold slots are left to `rebalance` by slots); a single slot hotter than the difference
/// stays: a slot is the unit that moves.
pub fn plan_by_load(owned: &[Vec<u16>], load: &[u64]) -> Vec<Planned> {
    let of = |s: u16| load.get(usize::from(s)).copied().unwrap_or(0);
    let mut owned: Vec<Vec<u16>> = owned.to_vec();
    let mut sums: Vec<u64> = owned.iter().map(|g| g.iter().map(|&s| of(s)).sum()).collect();
    let mean = sums.iter().sum::<u64>() / sums.len().max(1) as u64;
    let mut moves: Vec<(usize, usize, u16)> = Vec::new();
    while moves.len() < MAX_LOAD_MOVES && owned.len() > 1 {
        let hi = (0..sums.len()).max_by_key(|&g| sums[g]).unwrap_or(0);
        let lo = (0..sums.len()).min_by_key(|&g| sums[g]).unwrap_or(0);
        let gap = sums[hi] - sums[lo];
        if gap.saturating_mul(10) <= mean {
            break;
        }
        // A slot moves at most once a run (so every move starts from its owner now).
        let best = owned[hi]
            .iter()
            .copied()
            .filter(|&s| !moves.iter().any(|&(_, _, m)| m == s))
            .filter(|&s| of(s) < gap && of(s).saturating_mul(8) >= gap)
            .min_by_key(|&s| (gap / 2).abs_diff(of(s)));
        let Some(slot) = best else { break };
        owned[hi].retain(|&s| s != slot);
        owned[lo].push(slot);
        sums[hi] -= of(slot);
        sums[lo] += of(slot);
        moves.push((hi, lo, slot));
    }
    let mut plan: Vec<Planned> = Vec::new();
    for (from, to, slot) in moves {
        match plan.iter_mut().find(|p| p.from == from && p.to == to) {
            Some(p) => p.slots.push(slot),
            None => plan.push(Planned {
                from,
                to,
                slots: vec![slot],
            }),
        }
    }
    for p in &mut plan {
        p.slots.sort_unstable();
    }
    plan
}

/// `rebalance --by load`: reads every group's sampled per-slot load twice, `window` apart,
/// and moves slots from the busiest groups to the idlest (see [`plan_by_load`]).
pub async fn rebalance_by_load(
    groups: &Groups,
    window: std::time::Duration,
    chunk: usize,
) -> crate::control::error::Result<()> {
    let owned = owned_by_group(&tables(groups).await?)?;
    let before = slot_loads(groups).await?;
    tokio::time::sleep(window).await;
    let after = slot_loads(groups).await?;
    let load: Vec<u64> = before
        .iter()
        .zip(&after)
        .map(|(b, a)| u64::from(a.wrapping_sub(*b)))
        .collect();
    for (g, slots) in owned.iter().enumerate() {
        let sum: u64 = slots.iter().map(|&s| load[usize::from(s)]).sum();
        eprintln!(
            "kvd: group {g}: {} slots, load {sum} (sampled ops over {window:?})",
            slots.len()
        );
    }
    let plan = plan_by_load(&owned, &load);
    if plan.is_empty() {
        eprintln!("kvd: the load is even within a tenth of the mean (or one slot is the hot spot); nothing to move");
    }
    run_plan(groups, &plan, chunk, |p| {
        let moved: u64 = p.slots.iter().map(|&s| load[usize::from(s)]).sum();
        format!(" (load {moved})")
    })
    .await
}

/// Every slot's sampled load summed over the groups (each group counts only the slots it
/// serves).
async fn slot_loads(groups: &Groups) -> crate::control::error::Result<Vec<u32>> {
    let mut sum = vec![0u32; usize::from(SLOTS)];
    for g in 0..groups.count() {
        for (s, v) in groups.slot_load(g).await?.into_iter().enumerate() {
            if let Some(x) = sum.get_mut(s) {
                *x = x.wrapping_add(v);
            }
        }
    }
    Ok(sum)
}

/// `add-shard`: group `new` (started with `--no-slots`) learns the cluster's map from every
/// other group, then the slots are spread evenly over all groups.
pub async fn add_shard(groups: &Groups, new: usize, chunk: usize) -> crate::control::error::Result<()> {
    let all = tables(groups).await?;
    let mine = all
        .get(new)
        .map(|t| t.iter().filter(|s| s.state != SlotState::Gone).count());
    match mine {
        None => refuse!("--group {new}: --nodes lists {} groups", groups.count()),
        Some(0) => {}
        Some(n) => eprintln!("kvd: group {new} already holds {n} slots: spreading the slots evenly again"),
    }
    learn_map(groups, new, &all).await?;
    let keep: Vec<usize> = (0..groups.count()).collect();
    rebalance(groups, &keep, chunk).await
}

/// Group `new` learns from the other groups' `tables` which of them owns each slot (as
/// Gone entries naming the owner), so that it redirects a client asking it for a slot it
/// does not hold. Idempotent.
pub async fn learn_map(groups: &Groups, new: usize, all: &[Vec<Slot>]) -> crate::control::error::Result<()> {
    for (g, table) in all.iter().enumerate().filter(|(g, _)| *g != new) {
        let mut by_epoch: std::collections::BTreeMap<u32, Vec<u16>> = Default::default();
        for (s, e) in table.iter().enumerate() {
            if e.state == SlotState::Owned {
                by_epoch.entry(e.epoch).or_default().push(s as u16);
            }
        }
        for (epoch, slots) in by_epoch {
            let change = SlotChange {
                ranges: ranges(&slots),
                to: SlotState::Gone,
                owner: g as u16,
                epoch,
            };
            groups.change(new, &change).await?;
        }
    }
    Ok(())
}

/// `remove-shard`: every slot of group `gone` is spread over the other groups.
pub async fn remove_shard(groups: &Groups, gone: usize, chunk: usize) -> crate::control::error::Result<()> {
    if gone >= groups.count() || groups.count() < 2 {
        refuse!("--group {gone}: --nodes must list that group and at least one other");
    }
    let keep: Vec<usize> = (0..groups.count()).filter(|&g| g != gone).collect();
    rebalance(groups, &keep, chunk).await?;
    eprintln!(
        "kvd: group {gone} owns no slot now: its members may be stopped{}",
        if gone + 1 == groups.count() {
            ", and it may be left out of --nodes"
        } else {
            " (keep it in --nodes while a later group is listed: groups are named by position)"
        }
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use kvshared::routing::{ShardId, owned_slots};

    fn even(n: u32) -> Vec<Vec<u16>> {
        (0..n)
            .map(|i| {
                let (a, b) = owned_slots(i, n);
                (a..=b).collect()
            })
            .collect()
    }

    fn apply(owned: &mut [Vec<u16>], plan: &[Planned]) {
        for p in plan {
            owned[p.from].retain(|s| !p.slots.contains(s));
            owned[p.to].extend(&p.slots);
            owned[p.to].sort_unstable();
        }
    }

    #[test]
    fn adding_a_fourth_group_takes_a_quarter_from_the_three() {
        let mut owned = even(3);
        owned.push(Vec::new());
        let plan = plan_even(&owned, &[0, 1, 2, 3]);
        assert_eq!(plan.iter().map(|p| p.to).collect::<Vec<_>>(), vec![3, 3, 3]);
        apply(&mut owned, &plan);
        let counts: Vec<usize> = owned.iter().map(Vec::len).collect();
        assert_eq!(counts, vec![4096; 4]);
        assert!(
            plan_even(&owned, &[0, 1, 2, 3]).is_empty(),
            "balanced: nothing more to move"
        );
    }

    #[test]
    fn removing_a_group_gives_all_its_slots_to_the_rest() {
        let mut owned = even(4);
        let plan = plan_even(&owned, &[0, 1, 3]);
        apply(&mut owned, &plan);
        assert!(owned[2].is_empty());
        let total: usize = owned.iter().map(Vec::len).sum();
        assert_eq!(total, usize::from(SLOTS));
        assert!(owned.iter().enumerate().all(|(g, s)| g == 2 || s.len() >= 5461));
    }

    #[test]
    fn unfinished_moves_and_missing_owners_are_refused() {
        let t = |me: u32| kvshared::slots::SlotTable::for_shard(ShardId { index: me, count: 2 }).entries();
        assert!(owned_by_group(&[t(0), t(1)]).is_ok());
        let e = owned_by_group(&[t(0)]).unwrap_err().to_string();
        assert!(e.contains("has 0 owners"), "{e}");
        let mut frozen = t(0);
        frozen[3].state = SlotState::Frozen;
        let e = owned_by_group(&[frozen, t(1)]).unwrap_err().to_string();
        assert!(e.contains("slot 3 is frozen at group 0"), "{e}");
    }

    fn sums(owned: &[Vec<u16>], load: &[u64]) -> Vec<u64> {
        owned
            .iter()
            .map(|g| g.iter().map(|&s| load[usize::from(s)]).sum())
            .collect()
    }

    #[test]
    fn hot_slots_move_from_the_busiest_group_to_the_idlest() {
        let mut owned = even(3);
        let mut load = vec![1u64; usize::from(SLOTS)];
        // Group 0 holds three hot slots (the hot keys of a zipfian load).
        for (s, l) in [(10, 9000), (20, 7000), (30, 5000)] {
            load[s] = l;
        }
        let plan = plan_by_load(&owned, &load);
        assert!(!plan.is_empty());
        assert!(plan.iter().all(|p| p.from == 0));
        apply(&mut owned, &plan);
        let after = sums(&owned, &load);
        let (hi, lo) = (after.iter().max().unwrap(), after.iter().min().unwrap());
        assert!(hi - lo < 9000, "{after:?}");
        // Already even: nothing to do.
        assert!(plan_by_load(&even(3), &vec![5; usize::from(SLOTS)]).is_empty());
        // One slot hotter than everything else together stays where it is.
        let mut one = vec![0u64; usize::from(SLOTS)];
        one[7] = 1_000_000;
        assert!(plan_by_load(&even(2), &one).is_empty());
    }

    proptest::proptest! {
        /// Whatever the loads, a plan moves only slots their source owns, at most 64 of
        /// them, and never widens the gap between the busiest and the idlest group.
        #[test]
        fn a_load_plan_never_widens_the_gap(
            groups in 2u32..6,
            hot in proptest::collection::vec((0u16..SLOTS, 0u64..100_000), 0..40),
            base in 0u64..3,
        ) {
            let mut owned = even(groups);
            let mut load = vec![base; usize::from(SLOTS)];
            for (s, l) in hot {
                load[usize::from(s)] = l;
            }
            let gap = |o: &[Vec<u16>]| {
                let v = sums(o, &load);
                v.iter().max().unwrap() - v.iter().min().unwrap()
            };
            let before = gap(&owned);
            let plan = plan_by_load(&owned, &load);
            proptest::prop_assert!(plan.iter().map(|p| p.slots.len()).sum::<usize>() <= MAX_LOAD_MOVES);
            proptest::prop_assert!(plan.iter().all(|p| p.slots.iter().all(|s| owned[p.from].contains(s))));
            apply(&mut owned, &plan);
            proptest::prop_assert!(gap(&owned) <= before);
        }
    }
}
