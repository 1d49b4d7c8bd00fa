//! `kvd manager --move-slots`: each interval, reads every group's sampled per-slot load,
//! and when one group stays far busier than the mean ([`SpreadPolicy`]), moves its busiest
//! slots to the idlest groups ([`plan_spread`]) with the same steps as `kvd admin
//! move-slots` (copied ahead, a short write pause per chunk, resumable). One move job at a
//! time; the load is still read while it runs, so the next decision starts from fresh
//! figures.

use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use tokio::task::JoinHandle;

use super::decision::{DecisionLine, decision, finished, print};
use super::spread::{SpreadPolicy, SpreadState, group_loads, plan_spread, slots_load};
use crate::move_slots::{Groups, move_slots};
use crate::reshard::{learn_map, owned_by_group, ranges, tables};

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
    /// The counters read last interval (summed over the groups).
    last: Option<Vec<u32>>,
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
    ) -> anyhow::Result<SlotMover> {
        let all = tables(&groups).await.context("reading the groups' slot tables")?;
        let owned = owned_by_group(&all)?;
        for g in (0..owned.len()).filter(|&g| owned[g].is_empty()) {
            learn_map(&groups, g, &all)
                .await
                .with_context(|| format!("group {g} holds no slot and could not learn the map"))?;
        }
        Ok(SlotMover {
            groups: Arc::new(groups),
            policy,
            state: SpreadState::default(),
            chunk,
            read_limit,
            last: None,
            owned: Some(owned),
            job: None,
        })
    }

    /// One interval: reports a finished move, reads the load, maybe starts a move.
    pub async fn tick(&mut self, json: bool) -> anyhow::Result<()> {
        if self.job.as_ref().is_some_and(|j| j.is_finished())
            && let Some(job) = self.job.take()
        {
            for line in job.await.unwrap_or_default() {
                print(&line, json)?;
            }
            self.state.moved(self.policy.settle);
            self.owned = None;
        }
        let Ok(Some(now)) = tokio::time::timeout(self.read_limit, read_loads(&self.groups)).await else {
            tracing::debug!("a group's slot load did not come in time");
            self.last = None;
            return Ok(());
        };
        let Some(before) = self.last.replace(now.clone()) else {
            return Ok(());
        };
        if self.job.is_some() {
            return Ok(());
        }
        let load: Vec<u64> = now
            .iter()
            .zip(&before)
            .map(|(a, b)| u64::from(Some(a.wrapping_sub(*b)).filter(|d| *d < MAX_COUNTER_STEP).unwrap_or(0)))
            .collect();
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
        let Some(why) = self.policy.decide(&mut self.state, &sums) else {
            return Ok(());
        };
        let plan = plan_spread(owned, &load);
        if plan.is_empty() {
            tracing::debug!(%why, "nothing worth moving");
            return Ok(());
        }
        let mut asked = Vec::new();
        for p in &plan {
            let moved = slots_load(&p.slots, &load);
            let share = 100.0 * moved as f64 / sums.iter().sum::<u64>().max(1) as f64;
            let what = format!(
                "{} slots ({}) carrying {share:.0}% of the load: {why}",
                p.slots.len(),
                kvshared::slots::format_ranges(&ranges(&p.slots))
            );
            let line = decision(p.from, "move", &format!("group {}", p.to), &what);
            print(&line, json)?;
            asked.push((line, p.clone()));
        }
        let (groups, chunk) = (self.groups.clone(), self.chunk);
        self.job = Some(tokio::spawn(async move {
            let mut done = Vec::new();
            for (line, p) in asked {
                let outcome = move_slots(&groups, (p.from, p.to), &ranges(&p.slots), chunk)
                    .await
                    .map(|()| format!("{} slots now at group {}", p.slots.len(), p.to));
                done.push(finished(line, "moved", outcome));
            }
            done
        }));
        Ok(())
    }

    /// Waits for a move under way and prints how it ended.
    pub async fn finish(&mut self, json: bool) -> anyhow::Result<()> {
        if let Some(job) = self.job.take() {
            for line in job.await.unwrap_or_default() {
                print(&line, json)?;
            }
        }
        Ok(())
    }
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
