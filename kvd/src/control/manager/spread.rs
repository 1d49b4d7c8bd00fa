//! The manager's second lever: when one group serves far more than its share, some of its
//! busiest slots go to the idlest groups (`kvd manager --move-slots`). When to move and
//! what: pure functions of the per-slot load the groups sample, so the hysteresis and the
//! plan are tested without a cluster. Every key keeps one copy: a move costs a copy of the
//! moved keys once, not a replica of the whole shard for as long as it is hot.

use crate::control::reshard::Planned;

/// Consecutive owned slots judged together when choosing what to move: the moved slots
/// stay in few ranges (a sampled slot's count is noisy; a block's much less).
const BLOCK: usize = 64;
/// A group above the mean by less than this fraction of it gives nothing.
pub const TOLERANCE: f64 = 0.15;
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
    /// A smaller imbalance that lasts: the busiest group serving at least this many times
    /// the mean over the last `balance_after` intervals (and in the last one)...
    pub balance_above: f64,
    /// ...gives its excess too (0: never). Planned on those intervals' load together, so
    /// the few percent it moves are not noise.
    pub balance_after: u32,
}

/// Which load a move is planned on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Lever {
    /// A hot group, from the last interval's load.
    Spread,
    /// A lasting imbalance, from the load of the last `balance_after` intervals.
    Balance,
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
    /// Updates `state` with this interval's load per group (sampled ops) and, once
    /// `balance_after` intervals have passed since the last move, their load per group
    /// together (`window`); says which lever to move by now and why, or `None`.
    pub fn decide(
        &self,
        state: &mut SpreadState,
        group_load: &[u64],
        window: Option<&[u64]>,
    ) -> Option<(Lever, String)> {
        if state.settling > 0 {
            state.settling -= 1;
            return None;
        }
        let (busiest, ratio) = peak(group_load);
        let hot = judged(group_load, self.min_sampled) && ratio >= self.above;
        state.hot_streak = if hot { state.hot_streak + 1 } else { 0 };
        let plain = hot && ratio >= self.above * PLAIN_HOT;
        if state.hot_streak >= self.up_after.max(1) || plain {
            let intervals = state.hot_streak;
            state.hot_streak = 0;
            let why = format!(
                "group {busiest} served {ratio:.1}x the mean load for {intervals} interval{} (at least {:.1}x); shares of the sampled ops: {}",
                if intervals == 1 { "" } else { "s" },
                self.above,
                shares(group_load)
            );
            return Some((Lever::Spread, why));
        }
        if hot {
            // A hot group's streak is under way: the spread answers it.
            return None;
        }
        let window = window.filter(|w| self.balance_after > 0 && judged(w, self.min_sampled))?;
        let (lasting, over) = peak(window);
        let now = group_load.get(lasting).copied().unwrap_or(0) as f64 / mean(group_load).max(1.0);
        if over < self.balance_above || now < self.balance_above {
            return None;
        }
        let why = format!(
            "group {lasting} served {over:.2}x the mean load over {} intervals (at least {:.2}x); shares of the sampled ops: {}",
            self.balance_after,
            self.balance_above,
            shares(window)
        );
        Some((Lever::Balance, why))
    }
}

/// Whether a load per group is enough to judge by.
fn judged(group_load: &[u64], min_sampled: u64) -> bool {
    group_load.len() > 1 && group_load.iter().sum::<u64>() >= min_sampled
}

fn mean(group_load: &[u64]) -> f64 {
    group_load.iter().sum::<u64>() as f64 / group_load.len().max(1) as f64
}

/// The busiest group and how many times the mean it serves.
fn peak(group_load: &[u64]) -> (usize, f64) {
    let (busiest, most) = group_load
        .iter()
        .copied()
        .enumerate()
        .max_by_key(|&(_, l)| l)
        .unwrap_or((0, 0));
    (busiest, most as f64 / mean(group_load).max(1.0))
}

/// Each group's share of the sampled ops, as printed.
fn shares(group_load: &[u64]) -> String {
    let total = group_load.iter().sum::<u64>().max(1) as f64;
    let shares: Vec<String> = group_load
        .iter()
        .map(|&l| format!("{:.0}%", 100.0 * l as f64 / total))
        .collect();
    shares.join(" ")
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
            assert!(crate::control::reshard::ranges(&p.slots).len() <= 4, "{p:?}");
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

    /// A policy spreading past `above` after `up_after` intervals; settle 2, at least 100
    /// sampled ops, balance at 1.25x over 4 intervals.
    fn policy(above: f64, up_after: u32) -> SpreadPolicy {
        SpreadPolicy {
            above,
            up_after,
            settle: 2,
            min_sampled: 100,
            balance_above: 1.25,
            balance_after: 4,
        }
    }

    #[test]
    fn a_move_waits_for_a_streak_and_then_settles() {
        let p = policy(1.5, 2);
        let mut s = SpreadState::default();
        let hot = [900, 50, 50];
        let even = [300, 300, 300];
        let got: Vec<bool> = [&hot, &even, &hot, &hot, &hot, &hot]
            .iter()
            .map(|l| p.decide(&mut s, &l[..], None).is_some())
            .collect();
        assert_eq!(got, [false, false, false, true, false, true]);
        s.moved(2);
        assert!(p.decide(&mut s, &hot, None).is_none() && p.decide(&mut s, &hot, None).is_none());
        assert!(
            p.decide(&mut s, &hot, None).is_none(),
            "a new streak starts after settling"
        );
        assert!(p.decide(&mut s, &hot, None).is_some());
        // Too few sampled ops to judge.
        let mut s = SpreadState::default();
        assert!((0..5).all(|_| p.decide(&mut s, &[90, 1, 1], None).is_none()));
    }

    #[test]
    fn a_group_far_past_the_threshold_is_moved_from_after_one_interval() {
        let p = policy(1.3, 3);
        // 2.7x the mean (past twice the threshold): at once; 2.49x: after the streak.
        let mut s = SpreadState::default();
        let (_, why) = p
            .decide(&mut s, &[900, 50, 50], None)
            .expect("moved after one interval");
        assert!(why.contains("for 1 interval "), "{why}");
        let mut s = SpreadState::default();
        let got: Vec<bool> = (0..3)
            .map(|_| p.decide(&mut s, &[830, 85, 85], None).is_some())
            .collect();
        assert_eq!(got, [false, false, true]);
        // Settling still holds, however hot.
        s.moved(1);
        assert!(p.decide(&mut s, &[1000, 0, 0], None).is_none());
        assert!(p.decide(&mut s, &[1000, 0, 0], None).is_some());
    }

    #[test]
    fn a_lasting_imbalance_is_evened_on_its_window_and_a_passing_one_is_not() {
        let p = policy(1.6, 2);
        let mut s = SpreadState::default();
        // 1.3x the mean over the window and now: under the spread threshold, over balance's.
        let now = [390, 300, 210];
        let window = [1560, 1200, 840];
        assert!(p.decide(&mut s, &now, None).is_none(), "no window yet");
        let (lever, why) = p.decide(&mut s, &now, Some(&window)).expect("evened");
        assert_eq!(lever, Lever::Balance);
        assert!(why.contains("1.30x the mean load over 4 intervals"), "{why}");
        // Over the window but not now (it passed), or now but not over the window: held.
        assert!(p.decide(&mut s, &[300, 300, 300], Some(&window)).is_none());
        assert!(p.decide(&mut s, &now, Some(&[1200, 1200, 1200])).is_none());
        // Off with balance_after 0; a hot group still spreads, on the interval's load.
        let off = SpreadPolicy {
            balance_after: 0,
            ..p.clone()
        };
        assert!(off.decide(&mut SpreadState::default(), &now, Some(&window)).is_none());
        let mut s = SpreadState::default();
        assert!(
            p.decide(&mut s, &[800, 100, 100], Some(&window)).is_none(),
            "a hot streak begins"
        );
        let (lever, _) = p.decide(&mut s, &[800, 100, 100], Some(&window)).expect("spread");
        assert_eq!(lever, Lever::Spread);
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
