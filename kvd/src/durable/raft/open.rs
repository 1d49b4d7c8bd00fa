//! Opening a shard: recovering its store from the newest usable snapshot and the log after
//! it, and starting its raft group and the tasks around it.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use kvshared::frame::AlignedVec;
use kvshared::wire::BatchResponse;
use openraft::{BasicNode, StoredMembership, Vote};

use super::log_store::LogStore;
use super::propose::propose;
use super::reads::{confirm, follow_reads};
use super::shard::DurableShard;
use super::state_machine::{Snapshots, StateMachine, snapshot_meta};
use super::types::ShardRaft;
use crate::counters::Counters;
use crate::durable::log::GroupCommit;
use crate::durable::{DurableConfig, SnapshotEvery, catalog};
use crate::store::{Scratch, Store};

/// Entries per append RPC (openraft's default is 300: hundreds of megabytes here).
pub(super) const MAX_ENTRIES_PER_APPEND: u64 = 4;

/// This node's id in a group of one.
pub(super) const ME: u64 = 1;

/// Raft timing of replica groups. The heartbeat is also openraft 0.9's timeout for an
/// append round trip (a follower's fsync included), so it stays well above the 0.3-4 ms an
/// fsync takes here; an election starts 0.4-0.8 s after the last heartbeat, so a leader's
/// death costs its keys about a second (the aim) while a busy or slow heartbeat does
/// not start needless elections.
pub(super) const GROUP_HEARTBEAT_MS: u64 = 100;
pub(super) const GROUP_ELECTION_MS: (u64, u64) = (400, 800);

/// What a restart found and did, for the log line.
#[derive(Debug, Default)]
pub struct Recovery {
    /// The snapshot started from, and its pairs.
    pub snapshot: Option<(PathBuf, u64)>,
    /// Log entries replayed after it.
    pub entries_replayed: u64,
}

impl DurableShard {
    /// Opens the shard in `dir` (creating and initialising the group on first start): loads
    /// the newest usable snapshot into `store`, replays the log after it, and, for a group of
    /// one, returns once the node leads it and has applied every committed entry. A member of
    /// a replica group returns at once: it serves (or names the leader) while a leader
    /// commits what it replays.
    pub async fn open(
        dir: &Path,
        store: Arc<Store>,
        counters: Arc<Counters>,
        config: DurableConfig,
    ) -> Result<(DurableShard, Recovery), Box<dyn std::error::Error + Send + Sync>> {
        let DurableConfig {
            fsync,
            snapshot_every: every,
            segment_bytes,
            group,
        } = config;
        let (log, first_on_disk) = LogStore::open(dir, fsync, segment_bytes, group.is_some())?;
        let (writer, last_log_index, fresh, committed_at_start) = {
            let inner = log.inner.lock();
            let last = inner.entries.last_key_value().map(|(i, _)| *i);
            (
                inner.writer.clone(),
                last,
                inner.vote.is_none() && last.is_none(),
                inner.committed.map(|c| c.index),
            )
        };
        let snapshots = Arc::new(parking_lot::Mutex::new(Snapshots::default()));
        let mut sm = StateMachine {
            store: store.clone(),
            counters,
            last_applied: None,
            membership: StoredMembership::default(),
            scratch: Scratch::default(),
            response: BatchResponse::default(),
            body: AlignedVec::new(),
            dir: dir.to_path_buf(),
            writer: writer.clone(),
            snapshots: snapshots.clone(),
        };
        let log_is_whole = last_log_index.is_none() || first_on_disk == 0;
        let (chosen, passed_over) = catalog::newest_usable(dir, |snap| {
            let index = snapshot_meta(snap)?.last_log_id.map_or(0, |l| l.index);
            match last_log_index {
                Some(_) if first_on_disk > index + 1 => Err(format!(
                    "the log after it is missing (the log on disk starts at entry {first_on_disk})"
                )),
                _ => Ok(()),
            }
        })
        .map_err(|e| format!("{}: cannot list snapshots: {e}", dir.display()))?;
        for why in &passed_over {
            tracing::warn!(%why, "passed over a snapshot; recovering from an older one, or the whole log, instead");
        }
        let mut recovery = Recovery::default();
        let mut base = 0;
        match chosen {
            Some((path, snap)) => {
                let pairs = sm.load(&path, &snap)?;
                drop(snap);
                if let Some(last) = sm.last_applied {
                    log.forget_through(last);
                    base = last.index;
                }
                recovery.snapshot = Some((path, pairs));
            }
            None if !log_is_whole => {
                let why = match passed_over.is_empty() {
                    true => "no snapshot holds the entries before it".to_string(),
                    false => format!(
                        "no snapshot holding the entries before it can be used ({})",
                        passed_over.join("; ")
                    ),
                };
                return Err(format!(
                    "{}: the log starts at entry {first_on_disk} and {why}. kvd will not start from less than it acknowledged: restore the data directory from a copy, or move it away to start the shard empty",
                    dir.display()
                )
                .into());
            }
            None => {}
        }
        // Replay restores every acknowledged write, whatever --max-memory says now.
        let cap = store.memory_limit();
        store.set_max_memory(None);
        let grouped = group.is_some();
        if let Some(g) = &group {
            // A member that led when it stopped would take up its leadership again at once
            // (openraft 0.9 restores a committed vote of its own as leadership), before its
            // store has replayed anything, and, as seen here, without rebuilding its
            // replication, so the group stalled. It comes back as having voted for itself in
            // that term, and the group elects a leader in a new one.
            let mut inner = log.inner.lock();
            if let Some(v) = inner.vote.filter(|v| v.committed && v.leader_id.node_id == g.me) {
                inner.vote = Some(Vote::new(v.leader_id.term, g.me));
            }
        }
        let (me, initial, client) = match group {
            Some(g) => (g.me, g.initial, g.client),
            None => (ME, BTreeMap::from([(ME, BasicNode::default())]), Default::default()),
        };
        let (heartbeat, election) = match grouped {
            true => (GROUP_HEARTBEAT_MS, GROUP_ELECTION_MS),
            false => (250, (300, 600)),
        };
        let config = openraft::Config {
            heartbeat_interval: heartbeat,
            election_timeout_min: election.0,
            election_timeout_max: election.1,
            snapshot_policy: openraft::SnapshotPolicy::Never,
            // An entry can hold a thousand batches (megabytes), and an append must arrive
            // within a heartbeat: a follower catching up gets a few entries per round trip.
            max_payload_entries: MAX_ENTRIES_PER_APPEND,
            max_in_snapshot_log_to_keep: 0,
            ..Default::default()
        };
        let network = crate::durable::network::Network::new(client.clone());
        let raft = openraft::Raft::new(me, Arc::new(config.validate()?), network, log, sm).await?;
        if fresh && !initial.is_empty() {
            // Every member of a new group initialises it with the same membership, which
            // openraft allows; a member that restarts has a vote or a log and rejoins; one
            // started with --join waits for the leader to add it.
            raft.initialize(initial).await?;
        }
        let (proposals, queue) = tokio::sync::mpsc::unbounded_channel();
        let handing_over = Arc::new(std::sync::atomic::AtomicBool::new(false));
        tokio::spawn(propose(raft.clone(), queue, handing_over.clone()));
        let (confirms, confirm_queue) = tokio::sync::mpsc::unbounded_channel();
        tokio::spawn(confirm(raft.clone(), confirm_queue));
        let (member_reads, member_read_queue) = tokio::sync::mpsc::unbounded_channel();
        if grouped {
            tokio::spawn(follow_reads(me, raft.clone(), member_read_queue, client.clone()));
        }
        let elections = Arc::new(std::sync::atomic::AtomicU64::new(0));
        tokio::spawn(count_elections(raft.clone(), elections.clone()));
        let shard = DurableShard {
            raft,
            proposals,
            writer,
            snapshots,
            fsync,
            me,
            grouped,
            confirms,
            member_reads,
            elections,
            client,
            handing_over,
            leader_commit: std::sync::atomic::AtomicU64::new(0),
            heard_from_leader_ms: std::sync::atomic::AtomicU64::new(0),
            changes: Default::default(),
            snapshot_quiet: Arc::default(),
            epoch: std::time::Instant::now(),
        };
        // What the log on disk holds (the metrics may not show it yet this early).
        let last = last_log_index;
        if grouped {
            // A member serves (or says who leads) at once; what it replays commits when a
            // leader is there, so the replay filter and the memory cap come back then.
            let raft = shard.raft.clone();
            let store = store.clone();
            if let Some(committed) = committed_at_start {
                // It applies what it knows committed before it may campaign: a member that
                // wins an election serves only once its store has caught up, and a restarted
                // one, whose log is often the longest, would otherwise win and keep the shard
                // waiting through its whole replay.
                raft.runtime_config().elect(false);
                let raft = raft.clone();
                tokio::spawn(async move {
                    let _ = raft
                        .wait(Some(std::time::Duration::from_secs(60)))
                        .applied_index_at_least(Some(committed), "apply the log known committed")
                        .await;
                    raft.runtime_config().elect(true);
                });
            }
            tokio::spawn(async move {
                if raft
                    .wait(Some(std::time::Duration::from_secs(24 * 3600)))
                    .applied_index_at_least(last, "apply the recovered log")
                    .await
                    .is_ok()
                {
                    store.set_max_memory(cap.map(|l| l.max_bytes));
                    store.end_replay();
                }
            });
        } else {
            shard
                .raft
                .wait(Some(std::time::Duration::from_secs(10)))
                .state(openraft::ServerState::Leader, "lead the group of one")
                .await?;
            shard
                .raft
                .wait(Some(std::time::Duration::from_secs(300)))
                .applied_index_at_least(last, "apply the recovered log")
                .await?;
            store.set_max_memory(cap.map(|l| l.max_bytes));
            store.end_replay();
        }
        recovery.entries_replayed = shard.applied_index().saturating_sub(base);
        tokio::spawn(watch_log(
            shard.raft.clone(),
            shard.writer.clone(),
            shard.snapshots.clone(),
            every,
        ));
        Ok((shard, recovery))
    }
}

/// Starts a snapshot when the log has grown past `--snapshot-every` (and, in bytes, past the
/// last snapshot's size) since the last one.
pub(super) async fn watch_log(
    raft: openraft::Raft<ShardRaft>,
    writer: Arc<GroupCommit>,
    snapshots: Arc<parking_lot::Mutex<Snapshots>>,
    every: SnapshotEvery,
) {
    let mut tick = tokio::time::interval(std::time::Duration::from_millis(200));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let (building, bytes_at_last, snapshot_index, snapshot_bytes) = {
            let s = snapshots.lock();
            let (index, size) = s
                .current
                .as_ref()
                .map_or((0, 0), |(m, _, size)| (m.last_log_id.map_or(0, |l| l.index), *size));
            (s.building, s.log_bytes_at_last, index, size)
        };
        if building {
            continue;
        }
        let due = match every {
            // At least the last snapshot's size too, so that writing snapshots never costs
            // more disk than the log itself (as Redis's auto-aof-rewrite-percentage 100).
            SnapshotEvery::Bytes(limit) => {
                writer.figures().bytes.saturating_sub(bytes_at_last) >= limit.max(snapshot_bytes)
            }
            SnapshotEvery::Entries(limit) => {
                let applied = raft.metrics().borrow().last_applied.map_or(0, |l| l.index);
                applied.saturating_sub(snapshot_index) >= limit
            }
        };
        if due && raft.trigger().snapshot().await.is_err() {
            return;
        }
    }
}

/// Counts the terms that begin while this process runs (one per election it sees).
pub(super) async fn count_elections(raft: openraft::Raft<ShardRaft>, elections: Arc<std::sync::atomic::AtomicU64>) {
    let mut metrics = raft.metrics();
    let mut term = metrics.borrow().current_term;
    while metrics.changed().await.is_ok() {
        let now = metrics.borrow().current_term;
        if now > term {
            elections.fetch_add(now - term, std::sync::atomic::Ordering::Relaxed);
            term = now;
        }
    }
}
