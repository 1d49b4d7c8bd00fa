//! `kvd manager --move-slots`: each interval, reads every group's sampled per-slot load,
//! and when one group stays far busier than the mean ([`SpreadPolicy`]), moves its busiest
//! slots to the idlest groups ([`plan_spread`]) with the same steps as `kvd admin
//! move-slots` (copied ahead, a short write pause per chunk, resumable). A source's slots go
//! to all of its targets in one move ([`move_from`]: one copy ahead, the targets' chunks
//! side by side), so spreading a hot group takes about as long as its largest part. One
//! move job at a time; the load is still read while it runs, so the next decision starts
//! from fresh figures.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;

use crate::control::error::{ControlError, Doing};
use tokio::task::JoinHandle;

use super::decision::{DecisionLine, decision, finished, print};
use super::spread::{Lever, SpreadPolicy, SpreadState, group_loads, plan_spread, slots_load};
use crate::control::move_slots::{Groups, move_from};
use crate::control::reshard::{Planned, learn_map, owned_by_group, ranges, tables};

/// A sampled counter that went back (a restarted node) or jumped by more than this in one
/// interval is read as no load.
const MAX_COUNTER_STEP: u32 = 1 << 30;

/// The slot lever's state between intervals.
pub struct SlotMover {
    groups: Arc<Groups>,
    policy: SpreadPolicy,
    state: SpreadState,
    chunk: usize,
    /// How long one reading of every group's load may take.
    read_limit: Duration,
    /// The counters (summed over the groups) read at each interval since the last move
    /// ended, the newest last: at most `balance_after` intervals' worth.
    readings: VecDeque<Vec<u32>>,
    /// Each group's slots, read again after every move.
    owned: Option<Vec<Vec<u16>>>,
    job: Option<JoinHandle<Vec<DecisionLine>>>,
}

impl SlotMover {
    /// Connects to the groups of `nodes`; every group holding no slot (a spare group,
    /// started with `--no-slots`) first learns who owns each slot, as `add-shard` does.
    pub async fn start(
        groups: Groups,
        policy: SpreadPolicy,
        chunk: usize,
        read_limit: Duration,
    ) -> crate::control::error::Result<SlotMover> {
        let all = tables(&groups)
            .await
            .doing(|| "reading the groups' slot tables".into())?;
        let owned = owned_by_group(&all)?;
        for g in (0..owned.len()).filter(|&g| owned[g].is_empty()) {
            learn_map(&groups, g, &all)
                .await
                .doing(|| format!("group {g} holds no slot and could not learn the map"))?;
        }
        Ok(SlotMover {
            groups: Arc::new(groups),
            policy,
            state: SpreadState::default(),
            chunk,
            read_limit,
            readings: VecDeque::new(),
            owned: Some(owned),
            job: None,
        })
    }

    /// One interval: reports a finished move, reads the load, maybe starts a move.
    pub async fn tick(&mut self, json: bool) -> crate::control::error::Result<()> {
        if self.job.as_ref().is_some_and(|j| j.is_finished())
            && let Some(job) = self.job.take()
        {
            for line in job.await.unwrap_or_default() {
                print(&line, json)?;
            }
            self.state.moved(self.policy.settle);
            self.owned = None;
            // The load before the move no longer says where it goes.
            self.readings.drain(..self.readings.len().saturating_sub(1));
        }
        let Ok(Some(now)) = tokio::time::timeout(self.read_limit, read_loads(&self.groups)).await else {
            tracing::debug!("a group's slot load did not come in time");
            self.readings.clear();
            return Ok(());
        };
        self.readings.push_back(now);
        while self.readings.len() > self.policy.balance_after.max(1) as usize + 1 {
            self.readings.pop_front();
        }
        let (Some(now), Some(before), Some(first)) = (
            self.readings.back(),
            self.readings.len().checked_sub(2).and_then(|i| self.readings.get(i)),
            self.readings.front(),
        ) else {
            return Ok(());
        };
        if self.job.is_some() {
            return Ok(());
        }
        let load = load_between(now, before);
        let window = (self.readings.len() == self.policy.balance_after as usize + 1).then(|| load_between(now, first));
        if self.owned.is_none() {
            match tables(&self.groups).await.and_then(|t| owned_by_group(&t)) {
                Ok(owned) => self.owned = Some(owned),
                Err(e) => {
                    tracing::debug!(error = %format!("{e:#}"), "slot tables not read");
                    return Ok(());
                }
            }
        }
        let Some(owned) = &self.owned else { return Ok(()) };
        let sums = group_loads(owned, &load);
        let window_sums = window.as_ref().map(|w| group_loads(owned, w));
        let Some((lever, why)) = self.policy.decide(&mut self.state, &sums, window_sums.as_deref()) else {
            return Ok(());
        };
        let load = match (lever, &window) {
            (Lever::Balance, Some(w)) => w,
            _ => &load,
        };
        let plan = plan_spread(owned, load);
        if plan.is_empty() {
            tracing::debug!(%why, "nothing worth moving");
            return Ok(());
        }
        let mut asked = Vec::new();
        let total = load.iter().sum::<u64>().max(1);
        for p in &plan {
            let share = 100.0 * slots_load(&p.slots, load) as f64 / total as f64;
            let what = format!(
                "{} slots ({}) carrying {share:.0}% of the load: {why}",
                p.slots.len(),
                kvshared::slots::format_ranges(&ranges(&p.slots))
            );
            let line = decision(p.from, "move", &format!("group {}", p.to), &what);
            print(&line, json)?;
            asked.push((line, p.clone()));
        }
        self.job = Some(spawn_moves(self.groups.clone(), self.chunk, asked));
        Ok(())
    }

    /// Waits for a move under way and prints how it ended.
    pub async fn finish(&mut self, json: bool) -> crate::control::error::Result<()> {
        if let Some(job) = self.job.take() {
            for line in job.await.unwrap_or_default() {
                print(&line, json)?;
            }
        }
        Ok(())
    }
}

/// Runs the asked moves, one per source (see [`by_source`]), in a task; how each ended.
fn spawn_moves(
    groups: Arc<Groups>,
    chunk: usize,
    asked: Vec<(DecisionLine, Planned)>,
) -> JoinHandle<Vec<DecisionLine>> {
    tokio::spawn(async move {
        let mut done = Vec::new();
        for (from, targets) in by_source(asked) {
            let slots: Vec<(usize, Vec<u16>)> = targets.iter().map(|t| (t.to, t.slots.clone())).collect();
            let outcomes = move_from(&groups, from, &slots, chunk).await;
            for (t, outcome) in targets.into_iter().zip(outcomes) {
                let said = outcome
                    .map(|()| format!("{} slots now at group {}", t.slots.len(), t.to))
                    .map_err(|e| format!("{e:#}"));
                for line in t.lines {
                    done.push(finished(line, "moved", said.clone().map_err(ControlError::Refused)));
                }
            }
        }
        done
    })
}

/// One target of a source's move: the group, the slots it takes (ascending), the decisions
/// that asked for them.
struct TargetMove {
    to: usize,
    slots: Vec<u16>,
    lines: Vec<DecisionLine>,
}

/// The planned moves by source, in the order planned, each source's targets once (slots
/// planned for one target in two parts are joined): one move per source sends to all its
/// targets at once.
fn by_source(asked: Vec<(DecisionLine, Planned)>) -> Vec<(usize, Vec<TargetMove>)> {
    let mut out: Vec<(usize, Vec<TargetMove>)> = Vec::new();
    for (line, p) in asked {
        let at = match out.iter().position(|(from, _)| *from == p.from) {
            Some(at) => at,
            None => {
                out.push((p.from, Vec::new()));
                out.len() - 1
            }
        };
        let Some((_, targets)) = out.get_mut(at) else { continue };
        match targets.iter_mut().find(|t| t.to == p.to) {
            Some(t) => {
                t.slots.extend(p.slots);
                t.slots.sort_unstable();
                t.slots.dedup();
                t.lines.push(line);
            }
            None => targets.push(TargetMove {
                to: p.to,
                slots: p.slots,
                lines: vec![line],
            }),
        }
    }
    out
}

/// Each slot's sampled ops between two readings of the counters (a counter that went back,
/// a restarted node's, or jumped past `MAX_COUNTER_STEP` counts as none).
fn load_between(now: &[u32], before: &[u32]) -> Vec<u64> {
    now.iter()
        .zip(before)
        .map(|(a, b)| u64::from(Some(a.wrapping_sub(*b)).filter(|d| *d < MAX_COUNTER_STEP).unwrap_or(0)))
        .collect()
}

/// Every slot's sampled load summed over the groups, asked of all groups at once (a busy
/// group answers late; the others need not wait for it). `None` if a group did not answer.
async fn read_loads(groups: &Arc<Groups>) -> Option<Vec<u32>> {
    let mut asks = tokio::task::JoinSet::new();
    for g in 0..groups.count() {
        let groups = groups.clone();
        asks.spawn(async move { groups.slot_load(g).await });
    }
    let mut sum = vec![0u32; usize::from(kvshared::routing::SLOTS)];
    while let Some(done) = asks.join_next().await {
        let counts = done.ok()?.ok()?;
        for (x, v) in sum.iter_mut().zip(counts) {
            *x = x.wrapping_add(v);
        }
    }
    Some(sum)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn asked(from: usize, to: usize, slots: &[u16]) -> (DecisionLine, Planned) {
        let line = decision(from, "move", &format!("group {to}"), "test");
        let slots = slots.to_vec();
        (line, Planned { from, to, slots })
    }

    /// One move per source, each target once with every slot planned for it: the manager
    /// sends a source's slots to all its targets in one move.
    #[test]
    fn the_plan_is_run_as_one_move_per_source() {
        let plan = vec![
            asked(0, 3, &[5, 6]),
            asked(0, 4, &[7]),
            asked(1, 3, &[9000]),
            asked(0, 3, &[1, 6]),
        ];
        let shape: Vec<(usize, Vec<String>)> = by_source(plan)
            .into_iter()
            .map(|(from, t)| {
                let t = t.iter().map(|t| format!("{} {:?} {}", t.to, t.slots, t.lines.len()));
                (from, t.collect())
            })
            .collect();
        assert_eq!(
            shape,
            vec![
                (0, vec!["3 [1, 5, 6] 2".to_string(), "4 [7] 1".to_string()]),
                (1, vec!["3 [9000] 1".to_string()]),
            ]
        );
    }
}
