//! The manager's second lever: when one group serves far more than its share, some of its
//! busiest slots go to the idlest groups (`kvd manager --move-slots`). When to move and
//! what: pure functions of the per-slot load the groups sample, so the hysteresis and the
//! plan are tested without a cluster. Every key keeps one copy: a move costs a copy of the
//! moved keys once, not a replica of the whole shard for as long as it is hot.

use crate::reshard::Planned;

/// Consecutive owned slots judged together when choosing what to move: the moved slots
/// stay in few ranges (a sampled slot's count is noisy; a block's much less).
const BLOCK: usize = 64;
/// A group above the mean by less than this fraction of it gives nothing.
const TOLERANCE: f64 = 0.15;
/// A move smaller than this fraction of the mean load is not worth its copy.
const SMALLEST_MOVE: f64 = 0.1;

/// Sampled ops per interval below which the load is not judged.
pub const MIN_SAMPLED: u64 = 200;
/// A group at this many times the threshold is moved from after one interval, however many
/// the policy asks for: a spot that hot is not noise, and each interval waited is one the
/// group spends saturated (on the hot-spot benchmark, half a second of each phase's start).
const PLAIN_HOT: f64 = 2.0;

/// When the manager moves slots (its flags).
#[derive(Clone, Debug)]
pub struct SpreadPolicy {
    /// The busiest group must serve at least this many times the mean load...
    pub above: f64,
    /// ...for this many intervals in a row.
    pub up_after: u32,
    /// Intervals left alone after a move ended (its effect shows in the next windows).
    pub settle: u32,
    /// Sampled ops per interval, over all groups, below which nothing is judged (too few to
    /// tell a hot group from noise).
    pub min_sampled: u64,
}

/// The hysteresis between intervals.
#[derive(Clone, Debug, Default)]
pub struct SpreadState {
    hot_streak: u32,
    settling: u32,
}

impl SpreadState {
    /// A move just ended: the next `settle` intervals count for nothing.
    pub fn moved(&mut self, settle: u32) {
        *self = SpreadState {
            settling: settle,
            ..SpreadState::default()
        };
    }
}

impl SpreadPolicy {
    /// Updates `state` with this interval's load per group (sampled ops) and says why to
    /// move now, or `None`.
    pub fn decide(&self, state: &mut SpreadState, group_load: &[u64]) -> Option<String> {
        if state.settling > 0 {
            state.settling -= 1;
            return None;
        }
        let total: u64 = group_load.iter().sum();
        let mean = total as f64 / group_load.len().max(1) as f64;
        let (busiest, most) = group_load
            .iter()
            .copied()
            .enumerate()
            .max_by_key(|&(_, l)| l)
            .unwrap_or((0, 0));
        let ratio = most as f64 / mean.max(1.0);
        let hot = total >= self.min_sampled && group_load.len() > 1 && ratio >= self.above;
        state.hot_streak = if hot { state.hot_streak + 1 } else { 0 };
        let plain = hot && ratio >= self.above * PLAIN_HOT;
        if state.hot_streak < self.up_after.max(1) && !plain {
            return None;
        }
        let intervals = state.hot_streak;
        state.hot_streak = 0;
        let shares: Vec<String> = group_load
            .iter()
            .map(|&l| format!("{:.0}%", 100.0 * l as f64 / total.max(1) as f64))
            .collect();
        Some(format!(
            "group {busiest} served {ratio:.1}x the mean load for {intervals} interval{} (at least {:.1}x); shares of the sampled ops: {}",
            if intervals == 1 { "" } else { "s" },
            self.above,
            shares.join(" ")
        ))
    }
}

/// The load `slots` carry (`load[s]`: slot `s`'s sampled ops; a slot past its end carries none).
pub fn slots_load(slots: &[u16], load: &[u64]) -> u64 {
    slots
        .iter()
        .map(|&s| load.get(usize::from(s)).copied().unwrap_or(0))
        .sum()
}

/// Each group's load: what the slots it owns (`owned[g]`) carry.
pub fn group_loads(owned: &[Vec<u16>], load: &[u64]) -> Vec<u64> {
    owned.iter().map(|g| slots_load(g, load)).collect()
}

/// The moves that bring every group above the mean (by more than a tolerance) down to about
/// the mean, its excess going to the groups under it, idlest first. `owned[g]`: group `g`'s
/// slots, ascending; `load[s]`: slot `s`'s sampled ops over the window. A donor gives its
/// busiest blocks of consecutive slots first (fewest keys copied for the load moved); a
/// single slot hotter than what a receiver has room for stays where it is.
pub fn plan_spread(owned: &[Vec<u16>], load: &[u64]) -> Vec<Planned> {
    let of = |s: u16| load.get(usize::from(s)).copied().unwrap_or(0);
    let mut sums = group_loads(owned, load);
    let mean = sums.iter().sum::<u64>() as f64 / sums.len().max(1) as f64;
    let mut donors: Vec<usize> = (0..owned.len())
        .filter(|&g| sums[g] as f64 > mean * (1.0 + TOLERANCE))
        .collect();
    donors.sort_by_key(|&g| std::cmp::Reverse(sums[g]));
    let mut plan = Vec::new();
    for from in donors {
        let mut left: Vec<u16> = owned[from].clone();
        loop {
            let excess = sums[from] as f64 - mean;
            let Some(to) = (0..owned.len()).filter(|&g| g != from).min_by_key(|&g| sums[g]) else {
                break;
            };
            let give = excess.min(mean - sums[to] as f64);
            if give < mean * SMALLEST_MOVE {
                break;
            }
            let taken = take_load(&mut left, give as u64, &of);
            let moved: u64 = taken.iter().map(|&s| of(s)).sum();
            if taken.is_empty() || moved == 0 {
                break;
            }
            sums[from] -= moved;
            sums[to] += moved;
            plan.push(Planned { from, to, slots: taken });
        }
    }
    plan
}

/// Takes slots carrying up to `want` load out of `slots` (ascending), busiest blocks of
/// [`BLOCK`] consecutive entries first, a block's slots in order; returns them ascending.
fn take_load(slots: &mut Vec<u16>, want: u64, of: &impl Fn(u16) -> u64) -> Vec<u16> {
    let mut blocks: Vec<&[u16]> = slots.chunks(BLOCK).collect();
    blocks.sort_by_key(|b| std::cmp::Reverse(b.iter().map(|&s| of(s)).sum::<u64>()));
    let mut taken = Vec::new();
    let mut got = 0u64;
    'blocks: for block in blocks {
        for &s in block {
            if got >= want {
                break 'blocks;
            }
            if got + of(s) <= want {
                got += of(s);
                taken.push(s);
            }
        }
    }
    taken.sort_unstable();
    slots.retain(|s| taken.binary_search(s).is_err());
    taken
}

#[cfg(test)]
mod tests {
    use super::*;
    use kvshared::routing::{SLOTS, owned_slots};
    use proptest::prelude::*;

    /// `groups` groups; the first `filled` split every slot evenly, the rest hold none.
    fn layout(groups: usize, filled: u32) -> Vec<Vec<u16>> {
        (0..groups as u32)
            .map(|g| match g < filled {
                true => {
                    let (a, b) = owned_slots(g, filled);
                    (a..=b).collect()
                }
                false => Vec::new(),
            })
            .collect()
    }

    fn apply(owned: &mut [Vec<u16>], plan: &[Planned]) {
        for p in plan {
            owned[p.from].retain(|s| !p.slots.contains(s));
            owned[p.to].extend(&p.slots);
        }
    }

    /// 80% of the load on group 0's slots, the rest even: as `kvbench -w hotkey`.
    fn hot_first_third() -> Vec<u64> {
        let (_, last) = owned_slots(0, 3);
        (0..SLOTS).map(|s| if s <= last { 20 } else { 1 }).collect()
    }

    #[test]
    fn a_hot_group_spreads_over_the_idle_ones_in_few_ranges() {
        let mut owned = layout(6, 3);
        let load = hot_first_third();
        let plan = plan_spread(&owned, &load);
        assert!(plan.iter().all(|p| p.from == 0), "{plan:?}");
        apply(&mut owned, &plan);
        let after = group_loads(&owned, &load);
        let mean = after.iter().sum::<u64>() as f64 / 6.0;
        let worst = *after.iter().max().unwrap() as f64;
        assert!(worst <= mean * 1.3, "{after:?}");
        for p in &plan {
            assert!(crate::reshard::ranges(&p.slots).len() <= 4, "{p:?}");
        }
    }

    #[test]
    fn an_even_load_moves_nothing() {
        let owned = layout(6, 6);
        let load = vec![3u64; usize::from(SLOTS)];
        assert!(plan_spread(&owned, &load).is_empty());
    }

    #[test]
    fn one_slot_hotter_than_any_room_stays() {
        let owned = layout(3, 3);
        let mut load = vec![0u64; usize::from(SLOTS)];
        load[5] = 1_000_000;
        assert!(plan_spread(&owned, &load).is_empty());
    }

    #[test]
    fn a_move_waits_for_a_streak_and_then_settles() {
        let p = SpreadPolicy {
            above: 1.5,
            up_after: 2,
            settle: 2,
            min_sampled: 100,
        };
        let mut s = SpreadState::default();
        let hot = [900, 50, 50];
        let even = [300, 300, 300];
        let got: Vec<bool> = [&hot, &even, &hot, &hot, &hot, &hot]
            .iter()
            .map(|l| p.decide(&mut s, &l[..]).is_some())
            .collect();
        assert_eq!(got, [false, false, false, true, false, true]);
        s.moved(2);
        assert!(p.decide(&mut s, &hot).is_none() && p.decide(&mut s, &hot).is_none());
        assert!(p.decide(&mut s, &hot).is_none(), "a new streak starts after settling");
        assert!(p.decide(&mut s, &hot).is_some());
        // Too few sampled ops to judge.
        let mut s = SpreadState::default();
        assert!((0..5).all(|_| p.decide(&mut s, &[90, 1, 1]).is_none()));
    }

    #[test]
    fn a_group_far_past_the_threshold_is_moved_from_after_one_interval() {
        let p = SpreadPolicy {
            above: 1.3,
            up_after: 3,
            settle: 2,
            min_sampled: 100,
        };
        // 2.7x the mean (past twice the threshold): at once; 2.49x: after the streak.
        let mut s = SpreadState::default();
        let why = p.decide(&mut s, &[900, 50, 50]).expect("moved after one interval");
        assert!(why.contains("for 1 interval "), "{why}");
        let mut s = SpreadState::default();
        let got: Vec<bool> = (0..3).map(|_| p.decide(&mut s, &[830, 85, 85]).is_some()).collect();
        assert_eq!(got, [false, false, true]);
        // Settling still holds, however hot.
        s.moved(1);
        assert!(p.decide(&mut s, &[1000, 0, 0]).is_none());
        assert!(p.decide(&mut s, &[1000, 0, 0]).is_some());
    }

    proptest! {
        /// Whatever the load and layout: every slot moves at most once, from the group
        /// that owns it, and the busiest group is no busier after the plan.
        #[test]
        fn a_plan_moves_owned_slots_once_and_never_makes_the_peak_worse(
            filled in 1u32..6,
            extra in 0usize..4,
            hot in proptest::collection::vec((0u16..SLOTS, 1u64..10_000), 0..40),
            base in 0u64..5,
        ) {
            let groups = filled as usize + extra;
            let mut owned = layout(groups, filled);
            let mut load = vec![base; usize::from(SLOTS)];
            for (s, l) in hot {
                load[usize::from(s)] += l;
            }
            let before = group_loads(&owned, &load);
            let plan = plan_spread(&owned, &load);
            let mut seen = std::collections::HashSet::new();
            for p in &plan {
                prop_assert!(p.from != p.to);
                for s in &p.slots {
                    prop_assert!(seen.insert(*s), "slot {} moved twice", s);
                    prop_assert!(owned[p.from].contains(s));
                }
                apply(&mut owned, std::slice::from_ref(p));
            }
            let after = group_loads(&owned, &load);
            prop_assert!(after.iter().max() <= before.iter().max(), "{:?} -> {:?}", before, after);
        }
    }
}
