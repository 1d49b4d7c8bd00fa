//! `kvd admin rebalance`, `add-shard` and `remove-shard`: plans which slots go where from
//! every group's own table, then runs the moves with `move_slots` (each resumable: run the
//! command again after an interruption; it plans from where the slots are then).

use anyhow::bail;
use kvshared::routing::SLOTS;
use kvshared::slots::{Slot, SlotChange, SlotState};

use crate::move_slots::{Groups, move_slots};

/// One planned move: from a group, to a group, these slots (ascending).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Planned {
    pub from: usize,
    pub to: usize,
    pub slots: Vec<u16>,
}

/// Which slots each group owns, from the groups' own tables; refuses a cluster with a move
/// unfinished or a slot without exactly one owner.
pub fn owned_by_group(tables: &[Vec<Slot>]) -> anyhow::Result<Vec<Vec<u16>>> {
    let mut owned = vec![Vec::new(); tables.len()];
    let mut owners = vec![0u8; usize::from(SLOTS)];
    for (g, table) in tables.iter().enumerate() {
        for (s, e) in table.iter().enumerate().take(usize::from(SLOTS)) {
            match e.state {
                SlotState::Owned => {
                    owned[g].push(s as u16);
                    owners[s] = owners[s].saturating_add(1);
                }
                SlotState::Frozen | SlotState::Importing => bail!(
                    "slot {s} is {} at group {g}: a move is unfinished; run `kvd admin move-slots` for it again \
                     (see `kvd admin slots`)",
                    e.state.as_str()
                ),
                SlotState::Gone => {}
            }
        }
    }
    if let Some(s) = owners.iter().position(|&n| n != 1) {
        bail!(
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

async fn tables(groups: &Groups) -> anyhow::Result<Vec<Vec<Slot>>> {
    let mut all = Vec::with_capacity(groups.count());
    for g in 0..groups.count() {
        all.push(groups.table(g).await?);
    }
    Ok(all)
}

/// Moves slots until the groups of `keep` hold even shares (the rest none).
pub async fn rebalance(groups: &Groups, keep: &[usize], chunk: usize) -> anyhow::Result<()> {
    let owned = owned_by_group(&tables(groups).await?)?;
    let plan = plan_even(&owned, keep);
    if plan.is_empty() {
        eprintln!("kvd: the slots are spread evenly already; nothing to move");
    }
    for p in &plan {
        eprintln!(
            "kvd: moving {} slots from group {} to group {}",
            p.slots.len(),
            p.from,
            p.to
        );
        move_slots(groups, (p.from, p.to), &ranges(&p.slots), chunk).await?;
    }
    Ok(())
}

/// `add-shard`: group `new` (started with `--no-slots`) learns the cluster's map from every
/// other group, then the slots are spread evenly over all groups.
pub async fn add_shard(groups: &Groups, new: usize, chunk: usize) -> anyhow::Result<()> {
    let all = tables(groups).await?;
    let mine = all
        .get(new)
        .map(|t| t.iter().filter(|s| s.state != SlotState::Gone).count());
    match mine {
        None => bail!("--group {new}: --nodes lists {} groups", groups.count()),
        Some(0) => {}
        Some(n) => eprintln!("kvd: group {new} already holds {n} slots: spreading the slots evenly again"),
    }
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
    let keep: Vec<usize> = (0..groups.count()).collect();
    rebalance(groups, &keep, chunk).await
}

/// `remove-shard`: every slot of group `gone` is spread over the other groups.
pub async fn remove_shard(groups: &Groups, gone: usize, chunk: usize) -> anyhow::Result<()> {
    if gone >= groups.count() || groups.count() < 2 {
        bail!("--group {gone}: --nodes must list that group and at least one other");
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
}
