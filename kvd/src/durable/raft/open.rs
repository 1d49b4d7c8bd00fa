//! Opening a shard: recovering its store from the newest usable snapshot and the log after
//! it, and starting its raft group and the tasks around it.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::AtomicU64;

use kvshared::wire::BatchResponse;
use openraft::{BasicNode, StoredMembership, Vote};

use super::log_store::LogStore;
use super::propose::propose;
use super::reads::{confirm, follow_reads, keep_lease};
use super::shard::DurableShard;
use super::state_machine::{Snapshots, StateMachine, snapshot_meta};
use super::tasks::Tasks;
use super::types::ShardRaft;
use crate::counters::Counters;
use crate::durable::health::DiskHealth;
use crate::durable::log::GroupCommit;
use crate::durable::meta::Identity;
use crate::durable::{DurableConfig, SnapshotEvery, catalog};
use crate::store::{Scratch, Store};

/// Entries per append RPC (openraft's default is 300: hundreds of megabytes here).
pub(super) const MAX_ENTRIES_PER_APPEND: u64 = 4;

/// This node's id in a group of one.
pub(super) const ME: u64 = 1;

/// Raft timing of replica groups. The heartbeat is also openraft 0.9's timeout for an
/// append round trip (a follower's fsync included), so it stays well above the 0.3-4 ms an
/// fsync takes here. The range's maximum is openraft's leader lease: a member refuses votes
/// for that long after its vote last changed (a leader's append, a vote). A follower asks
/// for pre-votes after the lease plus a timeout drawn in the range (450-600 ms of silence,
/// six heartbeats or more; `campaign`), and the member with the newest log goes first, so
/// failover is about the smaller wait plus a pre-vote, the vote and the first entry.
/// (400-800 ms with a 100 ms heartbeat until 2026-11-26: failover 1.3-2.0 s; 200-400 ms and
/// openraft's own timer until 2026-11-27: median 0.74-0.79 s, up to 2.2 s when the first
/// candidate lacked the dead leader's last entry.)
pub(super) const GROUP_HEARTBEAT_MS: u64 = 75;
pub(super) const GROUP_ELECTION_MS: (u64, u64) = (150, 300);

/// What a restart found and did, for the log line.
#[derive(Debug, Default)]
pub struct Recovery {
    /// The snapshot started from, and its pairs.
    pub snapshot: Option<(PathBuf, u64)>,
    /// Log entries replayed after it.
    pub entries_replayed: u64,
}

/// Opening errors: a message for the operator.
type OpenError = Box<dyn std::error::Error + Send + Sync>;

/// What recovery read back before the group starts.
struct Recovered {
    log: LogStore,
    sm: StateMachine,
    disk: Disk,
    /// The last entry the log on disk holds.
    last_log_index: Option<u64>,
    /// Nothing on disk yet: no vote, no entry.
    fresh: bool,
    /// The committed-index hint (replica groups).
    committed_at_start: Option<u64>,
    /// The index recovery started from (the snapshot's).
    base: u64,
    recovery: Recovery,
}

/// What the shard keeps of its disk: the log's writer and its entries in memory, the
/// snapshots and whether the disk takes writes.
struct Disk {
    writer: Arc<GroupCommit>,
    log: Arc<parking_lot::Mutex<super::log_store::LogInner>>,
    snapshots: Arc<parking_lot::Mutex<Snapshots>>,
    health: Arc<DiskHealth>,
}

/// Who this shard is in raft: its id, the membership a group of one starts with, how it
/// reaches other members, and its group's id (0 until it has one).
struct Membership {
    me: u64,
    initial: BTreeMap<u64, BasicNode>,
    client: kvshared::client::ClientConfig,
    group: Arc<AtomicU64>,
    peers: Vec<String>,
    shard: String,
}

impl DurableShard {
    /// Opens the shard in `dir`: loads the newest usable snapshot into `store`, replays the
    /// log after it, and, for a group of one (initialised on its first start), returns once
    /// the node leads it and has applied every committed entry. A member of a replica group
    /// returns at once: it serves (or names the leader) while a leader commits what it
    /// replays. A new member never initialises a group by itself: it waits as a blank member
    /// until `kvd admin init-group` or `kvd admin add-replica` gives it one.
    pub async fn open(
        dir: &Path,
        store: Arc<Store>,
        counters: Arc<Counters>,
        config: DurableConfig,
    ) -> Result<(DurableShard, Recovery), OpenError> {
        let grouped = config.group.is_some();
        let who = membership(dir, config.group)?;
        let r = recover(
            dir,
            &store,
            counters,
            config.log.fsync,
            config.log.segment_bytes,
            grouped,
        )
        .await?;
        // Replay restores every acknowledged write, whatever --max-memory says now.
        let cap = store.memory_limit();
        store.set_max_memory(None);
        if grouped {
            let mut inner = r.log.inner.lock();
            // A member that led when it stopped would take up its leadership again at once
            // (openraft 0.9 restores a committed vote of its own as leadership), before its
            // store has replayed anything, and, as seen here, without rebuilding its
            // replication, so the group stalled. It comes back as having voted for itself in
            // that term, and the group elects a leader in a new one.
            if let Some(v) = inner.vote.filter(|v| v.committed && v.leader_id.node_id == who.me) {
                inner.vote = Some(Vote::new(v.leader_id.term, who.me));
            }
        }
        r.log.limit_appends(who.client.max_frame);
        let raft_config = raft_config(grouped)?;
        let network = crate::durable::network::Network::new(who.client.clone(), who.group.clone());
        let raft = openraft::Raft::new(who.me, raft_config, network, r.log, r.sm).await?;
        if r.fresh && !grouped {
            raft.initialize(who.initial.clone()).await?;
        }
        let shard = DurableShard::start(raft, r.disk, config.log.fsync, grouped, who, dir);
        let mut recovery = r.recovery;
        shard
            .catch_up(&store, cap, r.last_log_index, r.committed_at_start)
            .await?;
        recovery.entries_replayed = shard.applied_index().saturating_sub(r.base);
        let failed_dir = dir.to_path_buf();
        shard.tasks.spawn(stop_if_raft_fails(shard.raft.clone(), move |why| {
            // (Unit tests watch for the failure themselves: the test process goes on.)
            if !cfg!(test) {
                exit_failed(&failed_dir, &why)
            }
        }));
        shard.tasks.spawn(watch_log(
            shard.raft.clone(),
            shard.writer.clone(),
            shard.snapshots.clone(),
            config.log.snapshot_every,
        ));
        Ok((shard, recovery))
    }

    /// The shard over a started raft, with its tasks running.
    fn start(
        raft: openraft::Raft<ShardRaft>,
        disk: Disk,
        fsync: crate::durable::log::FsyncPolicy,
        grouped: bool,
        who: Membership,
        dir: &Path,
    ) -> DurableShard {
        let Disk {
            writer,
            log,
            snapshots,
            health,
        } = disk;
        let tasks = Arc::new(Tasks::default());
        let (proposals, queue) = tokio::sync::mpsc::unbounded_channel();
        let handing_over = Arc::new(std::sync::atomic::AtomicBool::new(false));
        tasks.spawn(propose(
            raft.clone(),
            queue,
            handing_over.clone(),
            tasks.clone(),
            health.clone(),
        ));
        let events = Arc::new(RaftEvents::default());
        let (confirms, confirm_queue) = tokio::sync::mpsc::unbounded_channel();
        tasks.spawn(confirm(raft.clone(), confirm_queue, events.clone()));
        let (member_reads, member_read_queue) = tokio::sync::mpsc::unbounded_channel();
        let lease = Arc::new(super::lease::Lease::default());
        let campaign = Arc::new(super::campaign::Campaign::default());
        if grouped {
            let (client, group) = (who.client.clone(), who.group.clone());
            let followed = follow_reads(
                who.me,
                raft.clone(),
                member_read_queue,
                client.clone(),
                group.clone(),
                tasks.clone(),
            );
            tasks.spawn(followed);
            tasks.spawn(keep_lease(
                who.me,
                raft.clone(),
                client.clone(),
                group.clone(),
                lease.clone(),
            ));
            let campaigner = super::campaign::Campaigner {
                me: who.me,
                raft: raft.clone(),
                log: log.clone(),
                client,
                group,
                campaign: campaign.clone(),
            };
            tasks.spawn(campaigner.run());
        }
        tasks.spawn(count_events(raft.clone(), events.clone()));
        DurableShard {
            raft,
            proposals,
            writer,
            log,
            snapshots,
            fsync,
            me: who.me,
            grouped,
            confirms,
            member_reads,
            events,
            client: who.client,
            group: who.group,
            peers: who.peers,
            shard: who.shard,
            dir: dir.to_path_buf(),
            handing_over,
            leader_commit: std::sync::atomic::AtomicU64::new(0),
            lease,
            changes: Default::default(),
            campaign,
            tasks,
            health,
        }
    }

    /// Applies the recovered log: a group of one waits until it leads and has applied it all;
    /// a group member goes on at once and ends the replay (and restores the memory cap) when
    /// a leader has committed it. A restarted member applies what it knew committed before it
    /// may campaign: one that wins an election serves only once its store has caught up, and
    /// a restarted one, whose log is often the longest, would otherwise win and keep the
    /// shard waiting through its whole replay.
    async fn catch_up(
        &self,
        store: &Arc<Store>,
        cap: Option<crate::store::MemoryLimit>,
        last: Option<u64>,
        committed_at_start: Option<u64>,
    ) -> Result<(), OpenError> {
        let raft = self.raft.clone();
        if !self.grouped {
            raft.wait(Some(std::time::Duration::from_secs(10)))
                .state(openraft::ServerState::Leader, "lead the group of one")
                .await?;
            raft.wait(Some(std::time::Duration::from_secs(300)))
                .applied_index_at_least(last, "apply the recovered log")
                .await?;
            store.set_max_memory(cap.map(|l| l.max_bytes));
            store.end_replay();
            return Ok(());
        }
        if let Some(committed) = committed_at_start {
            self.campaign.catching_up(true);
            let (campaign, raft) = (self.campaign.clone(), raft.clone());
            self.tasks.spawn(async move {
                let _ = raft
                    .wait(Some(std::time::Duration::from_secs(60)))
                    .applied_index_at_least(Some(committed), "apply the log known committed")
                    .await;
                campaign.catching_up(false);
            });
        }
        let store = store.clone();
        self.tasks.spawn(async move {
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
        Ok(())
    }
}

/// This shard's place in raft: a group of one (id [`ME`]), or a replica group member whose
/// id and group come from the directory's identity file.
fn membership(dir: &Path, group: Option<crate::durable::GroupConfig>) -> Result<Membership, OpenError> {
    Ok(match group {
        None => Membership {
            me: ME,
            initial: BTreeMap::from([(ME, BasicNode::default())]),
            client: Default::default(),
            group: Arc::default(),
            peers: Vec::new(),
            shard: String::new(),
        },
        Some(g) => {
            let identity = Identity::load_or_create(dir)?;
            Membership {
                me: identity.member,
                initial: BTreeMap::new(),
                client: g.client,
                group: Arc::new(AtomicU64::new(identity.group.unwrap_or(0))),
                peers: g.peers,
                shard: g.shard.to_string(),
            }
        }
    })
}

/// How long a snapshot chunk's RPC (the last one's install included) may take.
const INSTALL_SNAPSHOT_TIMEOUT_MS: u64 = 10_000;

/// openraft's settings for a group of one or a replica group.
fn raft_config(grouped: bool) -> Result<Arc<openraft::Config>, OpenError> {
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
        // A snapshot chunk (3 MiB), and the last one's install (reading and loading the
        // whole store: about a second for a million records), must not be given up on
        // after openraft's 200 ms: each retry queues another chunk behind the one the
        // member is still working on, and a connection silent that long is then held as
        // stalled by the leader's client (REPLICATION.md, catch-up).
        install_snapshot_timeout: INSTALL_SNAPSHOT_TIMEOUT_MS,
        // A group's members campaign after a pre-vote (`campaign`), not on openraft's timer.
        enable_elect: !grouped,
        ..Default::default()
    };
    Ok(Arc::new(config.validate()?))
}

/// Reads back the log and the newest usable snapshot (loaded into the store), refusing a
/// directory whose log does not reach back to a usable snapshot.
async fn recover(
    dir: &Path,
    store: &Arc<Store>,
    counters: Arc<Counters>,
    fsync: crate::durable::log::FsyncPolicy,
    segment_bytes: u64,
    grouped: bool,
) -> Result<Recovered, OpenError> {
    let health = Arc::new(DiskHealth::default());
    let (log, first_on_disk) = LogStore::open(dir, fsync, segment_bytes, grouped, health.clone())?;
    let (writer, last_log_index, fresh, committed_at_start) = {
        let inner = log.inner.lock();
        let last = inner.cache.last().map(|l| l.index);
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
        dir: dir.to_path_buf(),
        writer: writer.clone(),
        snapshots: snapshots.clone(),
        health: health.clone(),
    };
    let (recovery, base) = load_snapshot(dir, &log, &mut sm, last_log_index, first_on_disk)?;
    let log_inner = log.inner.clone();
    Ok(Recovered {
        log,
        sm,
        disk: Disk {
            writer,
            log: log_inner,
            snapshots,
            health,
        },
        last_log_index,
        fresh,
        committed_at_start,
        base,
        recovery,
    })
}

/// Loads the newest snapshot the log reaches back to into the state machine; returns what
/// was loaded and its index.
fn load_snapshot(
    dir: &Path,
    log: &LogStore,
    sm: &mut StateMachine,
    last_log_index: Option<u64>,
    first_on_disk: u64,
) -> Result<(Recovery, u64), OpenError> {
    let log_is_whole = last_log_index.is_none() || first_on_disk == 0;
    let (chosen, passed_over) = catalog::newest_usable(dir, |snap| {
        let index = snapshot_meta(snap)?.last_log_id.map_or(0, |l| l.index);
        match last_log_index {
            Some(_) if first_on_disk > index + 1 => Err(catalog::Unusable::LogMissing { first_on_disk }),
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
    Ok((recovery, base))
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

/// The exit status of a kvd whose raft core stopped on an error (see [`stop_if_raft_fails`]).
pub const RAFT_FAILED_EXIT: i32 = 3;

/// Fail-stop: if openraft's core stops on an error (a storage error it cannot go on from),
/// the member cannot take part in its group any more, and serving on would answer every
/// client "no leader" for ever. `stop` is called with the reason (in kvd: [`exit_failed`],
/// so that a supervisor restarts it; everything acknowledged is on disk). A core stopped by
/// kvd's own shutdown is not a failure.
pub(super) async fn stop_if_raft_fails(raft: openraft::Raft<ShardRaft>, stop: impl FnOnce(String)) {
    let mut metrics = raft.metrics();
    loop {
        let state = metrics.borrow().running_state.clone();
        if let Err(e) = state
            && e != openraft::error::Fatal::Stopped
        {
            stop(e.to_string());
            return;
        }
        if metrics.changed().await.is_err() {
            return;
        }
    }
}

/// Logs why the raft of the shard in `dir` stopped, and exits with [`RAFT_FAILED_EXIT`].
pub(super) fn exit_failed(dir: &Path, why: &str) -> ! {
    tracing::error!(data_dir = %dir.display(), error = why, "the shard's raft stopped on an error: kvd exits (a supervisor restarts it; nothing acknowledged is lost)");
    eprintln!(
        "kvd: {}: the shard's raft stopped on an error: {why}; exiting with status {RAFT_FAILED_EXIT}",
        dir.display()
    );
    std::process::exit(RAFT_FAILED_EXIT);
}

/// What this member has seen of its group's history since its process started.
#[derive(Debug, Default)]
pub(super) struct RaftEvents {
    /// Terms begun (one per election).
    pub elections: std::sync::atomic::AtomicU64,
    /// Times a leader other than the last known one became known.
    pub leader_changes: std::sync::atomic::AtomicU64,
    /// Read-index rounds run as leader (for its own reads and its members').
    pub read_index_rounds: std::sync::atomic::AtomicU64,
}

/// Counts the terms that begin while this process runs and the changes of leader it sees.
pub(super) async fn count_events(raft: openraft::Raft<ShardRaft>, events: Arc<RaftEvents>) {
    use std::sync::atomic::Ordering::Relaxed;
    let mut metrics = raft.metrics();
    let (mut term, mut leader) = {
        let m = metrics.borrow();
        (m.current_term, m.current_leader)
    };
    while metrics.changed().await.is_ok() {
        let (now, now_leader) = {
            let m = metrics.borrow();
            (m.current_term, m.current_leader)
        };
        if now > term {
            events.elections.fetch_add(now - term, Relaxed);
            term = now;
        }
        if let Some(id) = now_leader
            && leader != Some(id)
        {
            if leader.is_some() {
                events.leader_changes.fetch_add(1, Relaxed);
            }
            leader = Some(id);
        }
    }
}
