//! `kvd admin move-slots` and `kvd admin slots`: hands slots from one shard group to
//! another while both serve, in chunks, each chunk by the four logged steps of
//! `kvshared::slots` (freeze at the source, import at the target, copy, gone at the source,
//! owned at the target), then tells the other groups the new owner.
//!
//! Every step is idempotent and each slot's progress is read back from both groups' tables
//! before a chunk starts, so a move interrupted anywhere (the admin killed, a leader killed
//! or paused) is finished by running the same command again: no slot ends with two owners
//! or none, and no key is lost (the source drops a slot's keys only in the step that
//! records that the target holds them, and the target's copy is in its log by then).

use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use kvshared::client::{ClientConfig, Cluster, Reply};
use kvshared::keyspace::ScanRequest;
use kvshared::slots::{self, Slot, SlotChange, SlotState};
use kvshared::wire::{BatchRequest, OpKind, OpReply};

/// Keys asked for per page of a copy.
const PAGE_KEYS: u32 = 2_000;
/// How long a step may keep answering "try again" or failing over before the move stops.
const STEP_LIMIT: Duration = Duration::from_secs(60);

/// Where one slot's move stands, from both groups' tables.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Stage {
    /// Owned by the source: freeze it first.
    Freeze,
    /// Frozen at the source; the target does not import it yet.
    Import,
    /// Frozen at the source, importing at the target: copy, then hand over.
    Copy,
    /// Gone from the source to the target, still importing there: the target takes it.
    Own,
    /// Owned by the target.
    Done,
}

/// One group of the cluster, as `--nodes` lists it.
pub struct Groups {
    cluster: Cluster,
}

impl Groups {
    /// The groups of `nodes`.
    pub fn new(nodes: &[String], config: ClientConfig) -> anyhow::Result<Groups> {
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

/// What one chunk's move did.
#[derive(Default)]
struct Moved {
    keys: u64,
    frozen_for: Duration,
}

/// Moves `wanted` from group `from` to group `to`, `chunk` slots at a time; prints each
/// chunk's progress.
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
    let (mut keys, mut worst_freeze) = (0u64, Duration::ZERO);
    for (n, part) in all.chunks(chunk.max(1)).enumerate() {
        let done = move_chunk(groups, (from, to), part).await?;
        keys += done.keys;
        worst_freeze = worst_freeze.max(done.frozen_for);
        eprintln!(
            "kvd: slots moved {}/{}: {} keys, writes paused {} ms",
            (n * chunk.max(1) + part.len()).min(all.len()),
            all.len(),
            done.keys,
            done.frozen_for.as_millis()
        );
    }
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

/// Moves one chunk: reads where each slot stands, then runs the steps each needs.
async fn move_chunk(groups: &Groups, (from, to): (usize, usize), part: &[u16]) -> anyhow::Result<Moved> {
    let (src, dst) = (groups.table(from).await?, groups.table(to).await?);
    let epoch_now = src.iter().chain(&dst).map(|s| s.epoch).max().unwrap_or(0);
    let mut stages = Vec::with_capacity(part.len());
    for &slot in part {
        stages.push((
            slot,
            stage(slot, src[usize::from(slot)], dst[usize::from(slot)], (from, to))?,
        ));
    }
    // Slots already importing keep the epoch they import at; the rest take a new one.
    let importing_at = |slot: u16| dst[usize::from(slot)].epoch;
    let mut by_epoch: std::collections::BTreeMap<u32, Vec<(u16, Stage)>> = Default::default();
    for (slot, st) in stages {
        let epoch = if st >= Stage::Copy {
            importing_at(slot)
        } else {
            epoch_now + 1
        };
        by_epoch.entry(epoch).or_default().push((slot, st));
    }
    let mut moved = Moved::default();
    for (epoch, list) in by_epoch {
        let m = run_steps(groups, (from, to), epoch, &list).await?;
        moved.keys += m.keys;
        moved.frozen_for = moved.frozen_for.max(m.frozen_for);
    }
    Ok(moved)
}

/// Where `slot` stands between source `from` (entry `s`) and target `to` (entry `t`).
fn stage(slot: u16, s: Slot, t: Slot, (from, to): (usize, usize)) -> anyhow::Result<Stage> {
    let to16 = to as u16;
    Ok(match (s.state, t.state) {
        (SlotState::Owned, SlotState::Gone) => Stage::Freeze,
        (SlotState::Frozen, SlotState::Gone) => Stage::Import,
        (SlotState::Frozen, SlotState::Importing) => Stage::Copy,
        (SlotState::Gone, SlotState::Importing) if s.owner == to16 => Stage::Own,
        (SlotState::Gone, SlotState::Owned | SlotState::Frozen) if s.owner == to16 => Stage::Done,
        _ => bail!(
            "slot {slot} is {} at group {from} and {} at group {to}: not a move from {from} to {to} \
             (see `kvd admin slots`)",
            describe(s),
            describe(t)
        ),
    })
}

fn describe(s: Slot) -> String {
    match s.state {
        SlotState::Gone => format!("gone to group {} (epoch {})", s.owner, s.epoch),
        state => format!("{} (epoch {})", state.as_str(), s.epoch),
    }
}

/// Runs the steps the slots of `list` still need, at `epoch`.
async fn run_steps(
    groups: &Groups,
    (from, to): (usize, usize),
    epoch: u32,
    list: &[(u16, Stage)],
) -> anyhow::Result<Moved> {
    let at = |from_stage: Stage| -> Vec<[u16; 2]> {
        let mut r: Vec<u16> = list
            .iter()
            .filter(|(_, st)| *st <= from_stage)
            .map(|(s, _)| *s)
            .collect();
        r.sort_unstable();
        let mut out: Vec<[u16; 2]> = Vec::new();
        for s in r {
            match out.last_mut() {
                Some(last) if last[1] + 1 == s => last[1] = s,
                _ => out.push([s, s]),
            }
        }
        out
    };
    let change = |ranges: Vec<[u16; 2]>, to_state, owner: usize| SlotChange {
        ranges,
        to: to_state,
        owner: owner as u16,
        epoch,
    };
    let mut moved = Moved::default();
    let freeze = at(Stage::Freeze);
    if !freeze.is_empty() {
        groups.change(from, &change(freeze, SlotState::Frozen, from)).await?;
    }
    let frozen_at = Instant::now();
    let import = at(Stage::Import);
    if !import.is_empty() {
        groups.change(to, &change(import, SlotState::Importing, to)).await?;
    }
    let copy = at(Stage::Copy);
    if !copy.is_empty() {
        moved.keys = copy_keys(groups, (from, to), &copy).await?;
        groups.change(from, &change(copy, SlotState::Gone, to)).await?;
    }
    let own = at(Stage::Own);
    if !own.is_empty() {
        groups.change(to, &change(own.clone(), SlotState::Owned, to)).await?;
        moved.frozen_for = frozen_at.elapsed();
        tell_the_others(groups, (from, to), &change(own, SlotState::Gone, to)).await;
    }
    Ok(moved)
}

/// Copies every key of `ranges` from group `from` (frozen there) into group `to`
/// (importing there), a page at a time; returns how many.
async fn copy_keys(groups: &Groups, (from, to): (usize, usize), ranges: &[[u16; 2]]) -> anyhow::Result<u64> {
    let (mut cursor, mut keys) = (0u64, 0u64);
    let mut load = BatchRequest::new();
    let mut value = Vec::new();
    loop {
        let req = ScanRequest {
            cursor,
            count: PAGE_KEYS,
        };
        let reply = groups
            .one(from, OpKind::SlotScan, &slots::encode_slot_scan(req, ranges))
            .await?;
        let view = reply.batch()?;
        let OpReply::Found(page) = view.result(0) else {
            bail!("group {from} did not answer a copy's page: {:?}", view.result(0));
        };
        let (next, copied) = slots::decode_copied(page).context("a copy's page does not parse")?;
        load.clear();
        for c in &copied {
            value.clear();
            slots::encode_load(c.value, c.deadline, &mut value);
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
            return Ok(keys);
        }
        cursor = next;
    }
}

/// Tells every group but the two that `change`'s slots are now the target's, so that they
/// redirect clients there in one hop (a group that cannot be told now still redirects to
/// the source, which redirects on: a warning, not a failure).
async fn tell_the_others(groups: &Groups, (from, to): (usize, usize), change: &SlotChange) {
    for g in (0..groups.count()).filter(|&g| g != from && g != to) {
        if let Err(e) = groups.change(g, change).await {
            eprintln!("kvd: warning: group {g} was not told the slots' new owner: {e:#}");
        }
    }
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
