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
mod steps;

use std::time::{Duration, Instant};

use anyhow::{Context, bail};
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
}

impl Groups {
    /// The groups of `nodes`.
    pub fn new(nodes: &[String], config: ClientConfig) -> anyhow::Result<Groups> {
        // Every step and page goes to a group's leader: a copy's pages come from the member
        // that tracks its slots (a page from another member is refused: see `copy`).
        let config = ClientConfig {
            reads: kvshared::client::ReadFrom::Leader,
            ..config
        };
        Ok(Groups {
            cluster: Cluster::new(nodes, config)?,
        })
    }

    /// How many groups.
    pub fn count(&self) -> usize {
        self.cluster.node_count()
    }

    /// Sends one op to group `g`'s leader (following failovers), retrying "try again".
    async fn one(&self, g: usize, kind: OpKind, value: &[u8]) -> anyhow::Result<Reply> {
        let mut req = BatchRequest::new();
        req.push(kind, b"", value);
        self.send(g, &req).await
    }

    /// Sends `req` to group `g` until it ran (or the step's time is up).
    async fn send(&self, g: usize, req: &BatchRequest) -> anyhow::Result<Reply> {
        let began = Instant::now();
        loop {
            let result = self.cluster.send_batch(g, req).await;
            match result {
                Ok(reply) => return Ok(reply),
                Err(e) if began.elapsed() < STEP_LIMIT && !e.outcome_unknown() => {
                    tracing::debug!(group = g, error = %e, "retrying a step");
                }
                // An unknown outcome: every step may run twice, so it is sent again.
                Err(e) if began.elapsed() < STEP_LIMIT => tracing::debug!(group = g, error = %e, "resending a step"),
                Err(e) => return Err(e).with_context(|| format!("group {g} ({})", self.cluster.addr(g))),
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Group `g`'s slot table, read from its leader (linearizable).
    pub async fn table(&self, g: usize) -> anyhow::Result<Vec<Slot>> {
        let reply = self.one(g, OpKind::SlotMap, &[]).await?;
        let view = reply.batch()?;
        match view.result(0) {
            OpReply::Found(bytes) => slots::decode_entries(bytes).map_err(|e| anyhow::anyhow!("group {g}: {e}")),
            other => bail!("group {g} did not send its slot table: {other:?}"),
        }
    }

    /// Group `g`'s sampled per-slot load counters (see `OpKind::SlotLoad`).
    pub async fn slot_load(&self, g: usize) -> anyhow::Result<Vec<u32>> {
        let reply = self.one(g, OpKind::SlotLoad, &[]).await?;
        let view = reply.batch()?;
        match view.result(0) {
            OpReply::Found(bytes) => slots::decode_load_counts(bytes)
                .ok_or_else(|| anyhow::anyhow!("group {g}: a slot load reply of {} bytes", bytes.len())),
            other => bail!("group {g} did not send its slot load: {other:?}"),
        }
    }

    /// Applies `change` at group `g`; an error unless the group took it.
    pub async fn change(&self, g: usize, change: &SlotChange) -> anyhow::Result<()> {
        let reply = self.one(g, OpKind::SlotSet, &change.encode()).await?;
        match reply.batch()?.result(0) {
            OpReply::Stored => Ok(()),
            OpReply::NotStored => bail!(
                "group {g} refused to make slots {} {} (owner {}, epoch {}): its table is not where that step starts; \
                 see `kvd admin slots`",
                slots::format_ranges(&change.ranges),
                change.to.as_str(),
                change.owner,
                change.epoch
            ),
            other => bail!("group {g} answered {other:?} to a slot change"),
        }
    }
}

/// Moves `wanted` from group `from` to group `to`, `chunk` slots at a time; prints the
/// copy before the freeze and each chunk's progress.
pub async fn move_slots(
    groups: &Groups,
    (from, to): (usize, usize),
    wanted: &[[u16; 2]],
    chunk: usize,
) -> anyhow::Result<()> {
    if from == to || from >= groups.count() || to >= groups.count() {
        bail!(
            "--from and --to must be two different groups of the {} --nodes lists",
            groups.count()
        );
    }
    let all: Vec<u16> = wanted.iter().flat_map(|[a, b]| *a..=*b).collect();
    let began = Instant::now();
    let mut tracked = copy::precopy(groups, (from, to), &all).await?;
    let (mut keys, mut copies) = (tracked.as_ref().map_or(0, |t| t.keys), 1);
    let mut worst_freeze = Duration::ZERO;
    let parts: Vec<&[u16]> = all.chunks(chunk.max(1)).collect();
    let chunks = async {
        for (n, part) in parts.iter().enumerate() {
            let done = steps::move_chunk(groups, (from, to), part, tracked.as_ref()).await?;
            keys += done.keys;
            worst_freeze = worst_freeze.max(done.frozen_for);
            eprintln!(
                "kvd: slots moved {}/{}: {} keys copied while frozen, writes paused {} ms",
                (n * chunk.max(1) + part.len()).min(all.len()),
                all.len(),
                done.keys,
                done.frozen_for.as_millis()
            );
            if done.tracking_lost && n + 1 < parts.len() && copies < PRECOPY_TRIES {
                // The source's leader changed (or its notes ran over): copy what is left
                // ahead of its freeze again, tracked by the leader now.
                if let Some(t) = &tracked {
                    copy::stop_tracking(groups, from, t.token).await;
                }
                tracked = copy::precopy(groups, (from, to), &parts[n + 1..].concat()).await?;
                keys += tracked.as_ref().map_or(0, |t| t.keys);
                copies += 1;
            }
        }
        anyhow::Ok(())
    }
    .await;
    if let Some(t) = &tracked {
        copy::stop_tracking(groups, from, t.token).await;
    }
    chunks?;
    let took = began.elapsed();
    eprintln!(
        "kvd: moved {} slots ({}) from group {from} to group {to}: {keys} keys in {:.2} s ({:.0} keys/s), longest write pause {} ms",
        all.len(),
        slots::format_ranges(wanted),
        took.as_secs_f64(),
        keys as f64 / took.as_secs_f64().max(1e-9),
        worst_freeze.as_millis()
    );
    Ok(())
}

/// `kvd admin slots`: each group's slots, by state.
pub async fn print_slots(groups: &Groups) -> anyhow::Result<()> {
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
