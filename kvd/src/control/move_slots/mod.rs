//! `kvd admin move-slots` and `kvd admin slots`: hands slots from one shard group to
//! another while both serve, in chunks, each chunk by the four logged steps of
//! `kvshared::slots` (freeze at the source, import at the target, copy, gone at the source,
//! owned at the target), then tells the other groups the new owner.
//!
//! The keys are copied before the freeze (`copy::precopy`): the source tracks the keys
//! written in the moving slots while the admin copies them all, and each chunk's freeze
//! then waits only for the keys written since. A source that lost its tracking (restarted,
//! another member leading, over its budget) says so, and that chunk is copied whole while
//! frozen, as a move without tracking is.
//!
//! Every step is idempotent and each slot's progress is read back from both groups' tables
//! before a chunk starts, so a move interrupted anywhere (the admin killed, a leader killed
//! or paused) is finished by running the same command again: no slot ends with two owners
//! or none, and no key is lost (the source drops a slot's keys only in the step that
//! records that the target holds them, and the target's copy is in its log by then).

mod copy;
pub mod plan;
mod steps;

use std::time::{Duration, Instant};

use crate::control::error::{ControlError, Doing, refuse, unexpected};
use kvshared::client::{ClientConfig, Cluster, Reply};
use kvshared::slots::{self, Slot, SlotChange, SlotState};
use kvshared::wire::{BatchRequest, OpKind, OpReply};

/// How long a step may keep answering "try again" or failing over before the move stops.
const STEP_LIMIT: Duration = Duration::from_secs(60);
/// Copies ahead of the freeze one move makes at most (the first, and again after the source
/// lost its tracking); past them, each chunk left is copied whole while frozen.
const PRECOPY_TRIES: usize = 3;

/// One group of the cluster, as `--nodes` lists it.
pub struct Groups {
    cluster: Cluster,
    /// How long a group may refuse connections before a step gives up on it, naming it:
    /// the `--timeout` of the command.
    down_limit: Duration,
}

impl Groups {
    /// The groups of `nodes`.
    pub fn new(nodes: &[String], config: ClientConfig) -> crate::control::error::Result<Groups> {
        // Every step and page goes to a group's leader: a copy's pages come from the member
        // that tracks its slots (a page from another member is refused: see `copy`).
        let config = ClientConfig {
            reads: kvshared::client::ReadFrom::Leader,
            ..config
        };
        Ok(Groups {
            down_limit: config.request_timeout,
            cluster: Cluster::new(nodes, config)?,
        })
    }

    /// How many groups.
    pub fn count(&self) -> usize {
        self.cluster.node_count()
    }

    /// Sends one op to group `g`'s leader (following failovers), retrying "try again".
    async fn one(&self, g: usize, kind: OpKind, value: &[u8]) -> crate::control::error::Result<Reply> {
        let mut req = BatchRequest::new();
        req.push(kind, b"", value);
        self.send(g, &req).await
    }

    /// Sends `req` to group `g` until it ran (or the step's time is up).
    async fn send(&self, g: usize, req: &BatchRequest) -> crate::control::error::Result<Reply> {
        let began = Instant::now();
        let mut down_since: Option<Instant> = None;
        loop {
            let result = self.cluster.send_batch(g, req).await;
            let down = result
                .as_ref()
                .err()
                .is_some_and(|e| matches!(e.kind(), "connect" | "node_down"));
            match down {
                true => down_since = down_since.or(Some(Instant::now())),
                false => down_since = None,
            }
            match result {
                Ok(reply) => return Ok(reply),
                // No member of the group takes connections: give up after --timeout, naming it.
                Err(e) if down_since.is_some_and(|t| t.elapsed() >= self.down_limit) => {
                    return Err(e).doing(|| {
                        format!(
                            "group {g} ({}) does not answer within --timeout {:?}",
                            self.cluster.addr(g),
                            self.down_limit
                        )
                    });
                }
                Err(e) if began.elapsed() < STEP_LIMIT && !e.outcome_unknown() => {
                    tracing::debug!(group = g, error = %e, "retrying a step");
                }
                // An unknown outcome: every step may run twice, so it is sent again.
                Err(e) if began.elapsed() < STEP_LIMIT => tracing::debug!(group = g, error = %e, "resending a step"),
                Err(e) => return Err(e).doing(|| format!("group {g} ({})", self.cluster.addr(g))),
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Group `g`'s slot table, read from its leader (linearizable).
    pub async fn table(&self, g: usize) -> crate::control::error::Result<Vec<Slot>> {
        let reply = self.one(g, OpKind::SlotMap, &[]).await?;
        let view = reply.batch()?;
        match view.result(0) {
            OpReply::Found(bytes) => {
                slots::decode_entries(bytes).map_err(|e| ControlError::Refused(format!("group {g}: {e}")))
            }
            other => unexpected!("group {g} did not send its slot table: {other:?}"),
        }
    }

    /// Group `g`'s sampled per-slot load counters (see `OpKind::SlotLoad`).
    pub async fn slot_load(&self, g: usize) -> crate::control::error::Result<Vec<u32>> {
        let reply = self.one(g, OpKind::SlotLoad, &[]).await?;
        let view = reply.batch()?;
        match view.result(0) {
            OpReply::Found(bytes) => slots::decode_load_counts(bytes)
                .ok_or_else(|| ControlError::Refused(format!("group {g}: a slot load reply of {} bytes", bytes.len()))),
            other => unexpected!("group {g} did not send its slot load: {other:?}"),
        }
    }

    /// Applies `change` at group `g`; an error unless the group took it.
    pub async fn change(&self, g: usize, change: &SlotChange) -> crate::control::error::Result<()> {
        let reply = self.one(g, OpKind::SlotSet, &change.encode()).await?;
        match reply.batch()?.result(0) {
            OpReply::Stored => Ok(()),
            OpReply::NotStored => refuse!(
                "group {g} refused to make slots {} {} (owner {}, epoch {}): its table is not where that step starts; \
                 see `kvd admin slots`",
                slots::format_ranges(&change.ranges),
                change.to.as_str(),
                change.owner,
                change.epoch
            ),
            other => unexpected!("group {g} answered {other:?} to a slot change"),
        }
    }
}

/// Moves `wanted` from group `from` to group `to`, `chunk` slots at a time; prints the
/// copy before the freeze and each chunk's progress. Only the slots in a move from `from`
/// to `to` are moved (a half-done move is resumed where it stands); those the target holds
/// already and those that are not the source's are left out, and said so. Returns how
/// many slots it moved (0: nothing to move).
pub async fn move_slots(
    groups: &Groups,
    (from, to): (usize, usize),
    wanted: &[[u16; 2]],
    chunk: usize,
) -> crate::control::error::Result<usize> {
    check_groups(groups.count(), from, &[to])?;
    let all: Vec<u16> = wanted.iter().flat_map(|[a, b]| *a..=*b).collect();
    let (src, dst) = (groups.table(from).await?, groups.table(to).await?);
    let p = plan::plan(&src, &dst, (from, to), &all);
    if !p.done.is_empty() {
        let done = slots::format_ranges(&slots::ranges_of_slots(&p.done));
        eprintln!("kvd: {} slots ({done}) are group {to}'s already", p.done.len());
    }
    for line in p.left_out() {
        eprintln!("kvd: left out, not group {from}'s to hand over: {line}");
    }
    if p.moving.is_empty() {
        return Ok(0);
    }
    let n = p.moving.len();
    let mut outcome = move_from(groups, from, &[(to, p.moving)], chunk).await;
    outcome.pop().unwrap_or(Ok(())).map(|()| n)
}

/// Refuses a source or target that is not a group of the `n` that `--nodes` lists, or a
/// target that is the source, naming it.
fn check_groups(n: usize, from: usize, tos: &[usize]) -> crate::control::error::Result<()> {
    let last = n.saturating_sub(1);
    if from >= n {
        refuse!("--from {from}: --nodes lists {n} groups (0 to {last})");
    }
    for &to in tos {
        if to >= n {
            refuse!("--to {to}: --nodes lists {n} groups (0 to {last})");
        }
        if to == from {
            refuse!("--from and --to are both group {to}: a move is between two groups");
        }
    }
    Ok(())
}

/// One target of a move from one source, as it goes.
enum Leg {
    /// Slots still to hand over (in order), keys copied so far, the longest write pause.
    Moving(Vec<u16>, u64, Duration),
    /// Every slot handed over: keys copied, the longest write pause.
    Done(u64, Duration),
    Failed(ControlError),
}

/// Moves slots from group `from` to several groups at once (`targets`: each group and the
/// slots it takes), `chunk` slots at a time per target: one copy before the freeze for all
/// of them (the source tracks the writes to every moving slot under one token), then each
/// target's chunks side by side. A target whose chunk found the tracking lost stops there,
/// and what is left of every target is copied ahead again (at most `PRECOPY_TRIES`
/// copies; past them, chunks are copied whole while frozen). How each target's move ended.
pub async fn move_from(
    groups: &Groups,
    from: usize,
    targets: &[(usize, Vec<u16>)],
    chunk: usize,
) -> Vec<crate::control::error::Result<()>> {
    let mut tos: Vec<usize> = targets.iter().map(|(to, _)| *to).collect();
    tos.sort_unstable();
    tos.dedup();
    let checked = match tos.len() < targets.len() {
        true => Err(ControlError::Refused("a move names one target twice".into())),
        false => check_groups(groups.count(), from, &tos),
    };
    if let Err(e) = checked {
        return targets
            .iter()
            .map(|_| Err(ControlError::Refused(e.to_string())))
            .collect();
    }
    let began = Instant::now();
    let mut legs: Vec<Leg> = targets
        .iter()
        .map(|(_, s)| Leg::Moving(s.clone(), 0, Duration::ZERO))
        .collect();
    for round in 0..=PRECOPY_TRIES {
        let moving: Vec<(usize, &[u16])> = targets
            .iter()
            .zip(&legs)
            .filter_map(|((to, _), leg)| match leg {
                Leg::Moving(left, ..) if !left.is_empty() => Some((*to, left.as_slice())),
                _ => None,
            })
            .collect();
        if moving.is_empty() {
            break;
        }
        let tracked = match round < PRECOPY_TRIES {
            true => copy::precopy(groups, from, &moving).await,
            false => Ok(None),
        };
        let outcomes = match tracked {
            Ok(tracked) => run_legs(groups, from, &moving, chunk, tracked).await,
            Err(e) => moving
                .iter()
                .map(|_| Err(ControlError::Refused(format!("{e:#}"))))
                .collect(),
        };
        let mut outcomes = outcomes.into_iter();
        for leg in legs
            .iter_mut()
            .filter(|l| matches!(l, Leg::Moving(left, ..) if !left.is_empty()))
        {
            let Some(outcome) = outcomes.next() else { break };
            *leg = leg_after(std::mem::replace(leg, Leg::Done(0, Duration::ZERO)), outcome);
        }
    }
    let took = began.elapsed();
    targets
        .iter()
        .zip(legs)
        .map(|((to, slots), leg)| {
            let (keys, pause) = match leg {
                Leg::Done(keys, pause) | Leg::Moving(_, keys, pause) => (keys, pause),
                Leg::Failed(e) => return Err(e),
            };
            eprintln!(
                "kvd: moved {} slots ({}) from group {from} to group {to}: {keys} keys in {:.2} s ({:.0} keys/s), longest write pause {} ms",
                slots.len(),
                slots::format_ranges(&slots::ranges_of_slots(slots)),
                took.as_secs_f64(),
                keys as f64 / took.as_secs_f64().max(1e-9),
                pause.as_millis()
            );
            Ok(())
        })
        .collect()
}

/// A leg after one round: `outcome` is the slots it has left, the keys it copied and its
/// longest write pause in that round.
fn leg_after(leg: Leg, outcome: crate::control::error::Result<(Vec<u16>, u64, Duration)>) -> Leg {
    let (keys, pause) = match leg {
        Leg::Moving(_, keys, pause) | Leg::Done(keys, pause) => (keys, pause),
        failed @ Leg::Failed(_) => return failed,
    };
    match outcome {
        Ok((left, k, p)) if left.is_empty() => Leg::Done(keys + k, pause.max(p)),
        Ok((left, k, p)) => Leg::Moving(left, keys + k, pause.max(p)),
        Err(e) => Leg::Failed(e),
    }
}

/// One round of a move's targets side by side, after the copy ahead (`tracked`, whose keys
/// count for each target); ends the source's tracking. Per target: its slots left, the
/// keys it copied, its longest write pause.
async fn run_legs(
    groups: &Groups,
    from: usize,
    moving: &[(usize, &[u16])],
    chunk: usize,
    tracked: Option<copy::Tracked>,
) -> Vec<crate::control::error::Result<(Vec<u16>, u64, Duration)>> {
    let legs = moving.iter().enumerate().map(|(i, &(to, left))| {
        let copied = tracked.as_ref().and_then(|t| t.keys.get(i).copied()).unwrap_or(0);
        let tracked = tracked.as_ref();
        async move {
            let (rest, keys, pause) = run_chunks(groups, (from, to), left, chunk, tracked).await?;
            Ok((rest, keys + copied, pause))
        }
    });
    let outcomes = futures::future::join_all(legs).await;
    if let Some(t) = &tracked {
        copy::stop_tracking(groups, from, t.token).await;
    }
    outcomes
}

/// Hands `slots` from `from` to `to` chunk by chunk; stops after a chunk that found the
/// source's tracking lost (copied whole, frozen), so that the rest is copied ahead again.
/// The slots left, the keys copied while frozen, the longest write pause.
async fn run_chunks(
    groups: &Groups,
    (from, to): (usize, usize),
    slots: &[u16],
    chunk: usize,
    tracked: Option<&copy::Tracked>,
) -> crate::control::error::Result<(Vec<u16>, u64, Duration)> {
    let (mut keys, mut pause, mut done) = (0, Duration::ZERO, 0);
    for part in slots.chunks(chunk.max(1)) {
        let moved = steps::move_chunk(groups, (from, to), part, tracked).await?;
        (keys, pause, done) = (keys + moved.keys, pause.max(moved.frozen_for), done + part.len());
        eprintln!(
            "kvd: slots moved {done}/{} to group {to}: {} keys copied while frozen, writes paused {} ms",
            slots.len(),
            moved.keys,
            moved.frozen_for.as_millis()
        );
        if moved.tracking_lost {
            // The source's leader changed (or its notes ran over): what is left is copied
            // ahead of its freeze again, tracked by the leader now.
            break;
        }
    }
    Ok((slots.get(done..).unwrap_or_default().to_vec(), keys, pause))
}

/// `kvd admin slots`: each group's slots, by state.
pub async fn print_slots(groups: &Groups) -> crate::control::error::Result<()> {
    for g in 0..groups.count() {
        let t = kvshared::slots::SlotTable::from_entries(&groups.table(g).await?);
        let show = |state: SlotState| {
            let r = t.ranges(|s| s.state == state);
            let n: usize = r.iter().map(|[a, b]| usize::from(b - a) + 1).sum();
            format!(
                "{n} ({})",
                if r.is_empty() {
                    "-".into()
                } else {
                    slots::format_ranges(&r)
                }
            )
        };
        // (Through the project's stdout writer: `kvd admin slots | head` must not panic.)
        kvshared::outln!(
            "group {g} ({}): epoch {}, owned {}, frozen {}, importing {}",
            groups.cluster.addr(g),
            t.max_epoch(),
            show(SlotState::Owned),
            show(SlotState::Frozen),
            show(SlotState::Importing),
        )?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A move whose source is among its targets, or names a target twice or a group the
    /// list lacks, is refused for every target before anything is asked of a group.
    #[tokio::test]
    async fn a_move_to_its_own_source_or_twice_to_one_target_is_refused() {
        // (Nothing listens there: a refusal must not need the groups.)
        let nodes = [
            "127.0.0.1:1".to_string(),
            "127.0.0.1:2".to_string(),
            "127.0.0.1:3".to_string(),
        ];
        let groups = Groups::new(&nodes, ClientConfig::default()).unwrap();
        for (targets, why) in [
            (vec![(0, vec![1]), (1, vec![2])], "--from and --to are both group 0"),
            (vec![(1, vec![1]), (1, vec![2])], "names one target twice"),
            (
                vec![(1, vec![1]), (3, vec![2])],
                "--to 3: --nodes lists 3 groups (0 to 2)",
            ),
        ] {
            let outcomes = move_from(&groups, 0, &targets, 10).await;
            assert_eq!(outcomes.len(), targets.len());
            for o in outcomes {
                let e = o.expect_err("refused");
                assert!(matches!(&e, ControlError::Refused(m) if m.contains(why)), "{e}");
            }
        }
    }
}
