//! The load engine: many tokio tasks generating ops, batching them per node, sending them
//! and recording what came back.
//!
//! Each task owns its generator, its per-node batches and its histograms, so the hot loop
//! shares nothing but a few atomic counters (for live progress). Results are merged once
//! at the end. The engine knows nothing of terminals or files; callers watch [`Live`].

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use kvshared::client::{ClientError, Cluster, NodeBatches, Op, Outcome, Reply};
use kvshared::latency::Latency;
use kvshared::routing::key_slot;
use kvshared::slots::SlotTable;
use kvshared::wire::{BatchRequest, OpKind, OpReply, OpStatus};
use parking_lot::Mutex;
use rand::Rng;

use crate::hist::{Hist, new_hist};
use crate::timeline::Timeline;
use crate::workload::{OpGen, OpType, Shared, write_key};

/// How hard and how long to drive the cluster.
#[derive(Clone, Debug)]
pub struct EngineConfig {
    /// Concurrent client tasks.
    pub tasks: usize,
    /// Ops per batch per node.
    pub batch: usize,
    /// Time before measuring starts.
    pub warmup: Duration,
    /// Measured time.
    pub duration: Duration,
    /// Stop after this many measured ops instead of after `duration`.
    pub ops_limit: Option<u64>,
    /// Open loop at this many op/s in total (latency from intended send times).
    pub rate: Option<f64>,
    /// Seed of the op generators.
    pub seed: u64,
    /// Use the cluster as a cache in front of a database: a get that misses is followed by
    /// a put of the value (the fill), as the seed reports' cache-aside clients do.
    pub cache_aside: bool,
    /// Reads and writes in separate batches (`--split-reads`).
    pub split_reads: bool,
    /// Threads the tasks run on (`--threads`), each with a runtime and connections of its
    /// own (see [`run`]).
    pub threads: usize,
}

/// Counters the engine updates as it goes, for progress displays. Cheap to read at any time.
pub struct Live {
    pub started: Instant,
    pub measure_start: Instant,
    /// End of the measured window (far in the future when stopping on an op count).
    pub measure_end: Instant,
    /// Ops completed since the start, warm-up included.
    pub completed: AtomicU64,
    /// Ops completed inside the measured window.
    pub measured: AtomicU64,
    pub failed: AtomicU64,
    /// Set to stop every task (end of the window, op count reached, interrupted, quit).
    pub stop: AtomicBool,
    /// When the run was stopped early, microseconds after `started` (u64::MAX if not).
    stopped_early_us: AtomicU64,
    /// Completed ops per whole second since start, filled by the engine's monitor.
    pub per_second: Mutex<Vec<u64>>,
    /// Batch latencies since a live display last took them (tasks add to it about every
    /// 100 ms, so the hot loop does not touch a shared lock per batch).
    pub recent_latency: Mutex<Hist>,
    /// Whether anything shows `recent_latency`; merging histograms costs CPU, so tasks only do
    /// it when a display asked.
    pub track_recent_latency: AtomicBool,
}

impl Live {
    pub fn new(cfg: &EngineConfig) -> Arc<Live> {
        let started = Instant::now();
        let measure_start = started + cfg.warmup;
        let window = if cfg.ops_limit.is_some() {
            Duration::from_secs(365 * 24 * 3600)
        } else {
            cfg.duration
        };
        Arc::new(Live {
            started,
            measure_start,
            measure_end: measure_start + window,
            completed: AtomicU64::new(0),
            measured: AtomicU64::new(0),
            failed: AtomicU64::new(0),
            stop: AtomicBool::new(false),
            stopped_early_us: AtomicU64::new(u64::MAX),
            per_second: Mutex::new(Vec::new()),
            recent_latency: Mutex::new(new_hist()),
            track_recent_latency: AtomicBool::new(false),
        })
    }

    pub fn in_warmup(&self) -> bool {
        Instant::now() < self.measure_start
    }

    /// Takes the batch latencies recorded since the last call.
    pub fn take_recent_latency(&self) -> Hist {
        std::mem::replace(&mut *self.recent_latency.lock(), new_hist())
    }

    /// Stops the run now, before its window ends (op count reached, Ctrl-C, q in the
    /// dashboard). The measured window ends here; the first call decides.
    pub fn stop_early(&self) {
        if !self.stop.swap(true, Ordering::SeqCst) {
            let us = self.started.elapsed().as_micros() as u64;
            self.stopped_early_us.store(us, Ordering::SeqCst);
        }
    }

    /// The end of the measured window: the planned end, or an earlier stop.
    fn window_end(&self) -> Instant {
        match self.stopped_early_us.load(Ordering::SeqCst) {
            u64::MAX => self.measure_end,
            us => (self.started + Duration::from_micros(us)).min(self.measure_end),
        }
    }
}

/// Everything the tasks measured, merged.
#[derive(Debug)]
pub struct EngineOutput {
    /// Length of the measured window actually covered.
    pub elapsed: Duration,
    pub ops_by_type: [u64; 4],
    pub hists: [Hist; 4],
    pub batch_hist: Hist,
    /// Measured ops per node.
    pub per_node_ops: Vec<u64>,
    /// Ops the servers acknowledged over the whole run, warm-up included, counted as wire
    /// ops (a read-modify-write is a get and a put): what the servers' own counters see.
    pub wire_ops_completed: u64,
    pub read_misses: u64,
    /// Gets that missed inside the measured window (for hit ratios after warm-up).
    pub measured_read_misses: u64,
    /// Puts sent to fill misses (cache-aside), warm-up included.
    pub fills: u64,
    /// Ops answered `Moved` or `TryAgain` and sent again, warm-up included.
    pub redirected: u64,
    pub failed_ops: u64,
    pub errors: BTreeMap<String, u64>,
    /// Ops completed in each second since start (warm-up included).
    pub per_second: Vec<u64>,
    /// Per node, per second since start (warm-up included): batch round trips.
    pub node_timeline: Vec<Vec<Latency>>,
    /// Per node, the measured window's batch round trips: `[reads only, with a write]`
    /// (with `--split-reads` these are the node's reads and its writes).
    pub node_batches: Vec<[Hist; 2]>,
    /// Times a task paused after a failure because every node was down.
    pub pauses: u64,
}

impl EngineOutput {
    pub fn ops(&self) -> u64 {
        self.ops_by_type.iter().sum()
    }
}

/// Generates ops and sorts them into per-node batches. Shared by the send loop and the
/// dry run, so both measure the same generation code.
pub struct BatchFiller {
    gen_: OpGen,
    batch: usize,
    nodes: u32,
    /// Batches per node: 1, or 2 with reads and writes apart (lane `2 * node + 1` has the
    /// writes).
    lanes: usize,
    /// A batch per lane.
    pending: NodeBatches,
    /// Which node owns each slot (the cluster client's table, which learns from redirects).
    slots: Arc<SlotTable>,
    /// Per node: how many ops of each type its pending batch holds.
    counts: Vec<[u64; 4]>,
    key: Vec<u8>,
    value: Vec<u8>,
    /// `--ttl`, and the buffer a put with one is encoded in.
    ttl: Option<crate::workload::ttl::TtlRange>,
    arg: Vec<u8>,
    /// Ops generated so far (for open-loop schedules).
    pub generated: u64,
}

impl BatchFiller {
    pub fn new(
        shared: Arc<Shared>,
        seed: u64,
        (nodes, slots): (usize, Arc<SlotTable>),
        batch: usize,
        split_reads: bool,
    ) -> BatchFiller {
        let mut gen_ = OpGen::new(shared.clone(), seed);
        let mut value = vec![0u8; shared.spec.value_size];
        gen_.rng().fill_bytes(&mut value);
        let lanes = if split_reads { 2 } else { 1 };
        BatchFiller {
            gen_,
            batch: batch.max(1),
            nodes: nodes.max(1) as u32,
            lanes,
            pending: NodeBatches::new(nodes.max(1) * lanes),
            slots,
            counts: vec![[0; 4]; nodes.max(1) * lanes],
            key: Vec::with_capacity(32),
            value,
            ttl: shared.spec.ttl,
            arg: Vec::new(),
            generated: 0,
        }
    }

    /// Generates ops until some batch is full; returns its lane (see [`BatchFiller::node_of`]).
    #[inline]
    pub fn fill(&mut self, prefix: &str) -> usize {
        loop {
            let (op, index) = self.gen_.next_op();
            if self.nodes == 1 && op == OpType::Read {
                // One node and a get: its key is written into the batch, nothing else to do.
                self.pending
                    .batch_mut(0)
                    .push_appending_key(OpKind::Get, |keys| write_key(keys, prefix, index), &[]);
                if let Some(lane) = self.count(0, op) {
                    return lane;
                }
                continue;
            }
            self.key.clear();
            write_key(&mut self.key, prefix, index);
            let node = match self.nodes {
                1 => 0,
                _ => match usize::from(self.slots.owner(key_slot(&self.key))) {
                    n if n < self.nodes as usize => n,
                    _ => 0,
                },
            };
            let lane = match (self.lanes, op) {
                (1, _) | (_, OpType::Read) => node * self.lanes,
                _ => node * self.lanes + 1,
            };
            match op {
                OpType::Read => self.pending.push_to(lane, OpKind::Get, &self.key, &[]),
                OpType::Update | OpType::Insert => self.push_put(lane),
                OpType::ReadModifyWrite => {
                    // Read and write of one key in one batch: the server runs them in order.
                    self.pending.push_to(lane, OpKind::Get, &self.key, &[]);
                    self.push_put(lane);
                }
            };
            if let Some(lane) = self.count(lane, op) {
                return lane;
            }
        }
    }

    /// Counts an op pushed to `lane`; the lane when its batch is now full.
    #[inline]
    fn count(&mut self, lane: usize, op: OpType) -> Option<usize> {
        self.counts[lane][op as usize] += 1;
        self.generated += 1;
        (self.pending.batch(lane).len() >= self.batch).then_some(lane)
    }

    /// A put of a fresh value under the current key, with `--ttl`'s time to live if any.
    #[inline]
    fn push_put(&mut self, lane: usize) {
        self.gen_.fresh_value(&mut self.value);
        let ttl = self.ttl.map(|t| (t, self.gen_.rng()));
        crate::workload::ttl::push_put(&mut self.pending, lane, &self.key, &self.value, ttl, &mut self.arg);
    }

    /// The node a lane's batches go to.
    #[inline]
    pub fn node_of(&self, lane: usize) -> usize {
        lane / self.lanes
    }

    /// Bytes of each value written.
    pub fn value_size(&self) -> usize {
        self.value.len()
    }

    /// Lane `lane`'s pending batch.
    pub fn request(&self, lane: usize) -> &BatchRequest {
        self.pending.batch(lane)
    }

    /// Empties lane `lane`'s batch and returns how many ops of each type it held.
    pub fn take_counts(&mut self, lane: usize) -> [u64; 4] {
        self.pending.clear(lane);
        std::mem::take(&mut self.counts[lane])
    }
}

/// The latency histograms of a load thread's tasks, which they share: kept per task (six
/// each), a batch's records missed the cache (`record_n`'s load of its count was 96% of its
/// samples, 4% of kvbench's CPU at batch 64). A thread's tasks never run at once, so the
/// lock is never contended.
struct Recorded {
    hists: [Hist; 4],
    batch_hist: Hist,
    node_batches: Vec<[Hist; 2]>,
}

impl Recorded {
    fn new(nodes: usize) -> Arc<Mutex<Recorded>> {
        Arc::new(Mutex::new(Recorded {
            node_batches: (0..nodes).map(|_| [new_hist(), new_hist()]).collect(),
            ..Recorded::empty()
        }))
    }

    fn empty() -> Recorded {
        Recorded {
            hists: std::array::from_fn(|_| new_hist()),
            batch_hist: new_hist(),
            node_batches: Vec::new(),
        }
    }

    fn add(&mut self, other: &Recorded) {
        for (a, b) in self.hists.iter_mut().zip(&other.hists) {
            // Histograms auto-resize, so adding never fails for lack of range.
            let _ = a.add(b);
        }
        let _ = self.batch_hist.add(&other.batch_hist);
        for (a, b) in self.node_batches.iter_mut().zip(&other.node_batches) {
            let _ = a[0].add(&b[0]);
            let _ = a[1].add(&b[1]);
        }
    }
}

/// What one task measured (its latencies in the histograms it shares with its thread).
struct TaskOutput {
    ops_by_type: [u64; 4],
    recorded: Arc<Mutex<Recorded>>,
    per_node_ops: Vec<u64>,
    wire_ops_completed: u64,
    read_misses: u64,
    measured_read_misses: u64,
    fills: u64,
    redirected: u64,
    failed_ops: u64,
    errors: BTreeMap<String, u64>,
    pauses: u64,
    timeline: Timeline,
}

impl TaskOutput {
    fn new(nodes: usize, recorded: Arc<Mutex<Recorded>>) -> TaskOutput {
        TaskOutput {
            ops_by_type: [0; 4],
            recorded,
            per_node_ops: vec![0; nodes],
            wire_ops_completed: 0,
            read_misses: 0,
            measured_read_misses: 0,
            fills: 0,
            redirected: 0,
            failed_ops: 0,
            errors: BTreeMap::new(),
            pauses: 0,
            timeline: Timeline::new(nodes),
        }
    }

    fn error(&mut self, kind: &str, ops: u64) {
        *self.errors.entry(kind.to_string()).or_insert(0) += ops;
        self.failed_ops += ops;
    }
}

/// Runs the load until the window ends (or the op count is reached), then merges results.
///
/// The tasks run on `cfg.threads` runtimes of one worker thread each, each with its own
/// connections (a [`Cluster::sibling`] of `cluster`), as a thread-per-core server runs: a
/// reply wakes its task on the thread that read it. On one multi-threaded runtime, every
/// such wake-up also woke an idle worker to steal work (an `eventfd` write and a context
/// switch, a fifth of kvbench's CPU at batch 64; docs/PERFORMANCE.md).
pub async fn run(cluster: Arc<Cluster>, shared: Arc<Shared>, cfg: EngineConfig, live: Arc<Live>) -> EngineOutput {
    let monitor = tokio::spawn(monitor(live.clone()));
    let stopper = {
        let live = live.clone();
        tokio::spawn(async move {
            tokio::time::sleep_until(live.measure_end.into()).await;
            live.stop.store(true, Ordering::Relaxed);
        })
    };
    let mut out = TaskOutput::new(cluster.node_count(), Recorded::new(cluster.node_count()));
    for part in run_threads(&cluster, &shared, &cfg, &live) {
        // A thread fails only by panicking; its figures are lost but the run still reports.
        if let Ok(t) = part.await {
            merge_task(&mut out, t);
        }
    }
    live.stop.store(true, Ordering::Relaxed);
    stopper.abort();
    // The monitor ticks once a second; waiting for its next tick would stretch the run.
    monitor.abort();
    let elapsed = live
        .window_end()
        .min(Instant::now())
        .saturating_duration_since(live.measure_start);
    let per_second = live.per_second.lock().clone();
    let recorded = std::mem::replace(&mut *out.recorded.lock(), Recorded::empty());
    EngineOutput {
        elapsed,
        ops_by_type: out.ops_by_type,
        hists: recorded.hists,
        batch_hist: recorded.batch_hist,
        per_node_ops: out.per_node_ops,
        node_batches: recorded.node_batches,
        wire_ops_completed: out.wire_ops_completed,
        read_misses: out.read_misses,
        measured_read_misses: out.measured_read_misses,
        fills: out.fills,
        redirected: out.redirected,
        failed_ops: out.failed_ops,
        errors: out.errors,
        per_second,
        pauses: out.pauses,
        node_timeline: out.timeline.finish(),
    }
}

/// What one thread's tasks will have measured.
type ThreadOutput = tokio::sync::oneshot::Receiver<TaskOutput>;

/// Starts the tasks, task `t` on thread `t % threads`, and returns what each thread will
/// have measured. A thread that cannot be started runs its tasks on the caller's runtime
/// instead, with the caller's client.
fn run_threads(
    cluster: &Arc<Cluster>,
    shared: &Arc<Shared>,
    cfg: &EngineConfig,
    live: &Arc<Live>,
) -> Vec<ThreadOutput> {
    thread_plan(cfg.tasks, cfg.threads, cluster.config().conns_per_node)
        .into_iter()
        .enumerate()
        .map(|(thread, (mine, own_conns))| {
            let part = (mine, shared.clone(), cfg.clone(), live.clone());
            match spawn_load_thread(thread, cluster, own_conns, part.clone()) {
                Ok(rx) => rx,
                Err(e) => {
                    tracing::warn!("load thread {thread} did not start ({e}); its tasks run on the main runtime");
                    let (tx, rx) = tokio::sync::oneshot::channel();
                    let (mine, shared, cfg, live) = part;
                    let cluster = cluster.clone();
                    tokio::spawn(async move {
                        let _ = tx.send(run_tasks(mine, cluster, shared, cfg, live).await);
                    });
                    rx
                }
            }
        })
        .collect()
}

/// Which tasks each thread runs (task `t` on thread `t % threads`) and how many connections
/// per node it has. Each thread has its own connections to every node, so there are no more
/// threads than connections per node (nor than tasks), and the connections are split among
/// them: `conns` in all.
fn thread_plan(tasks: usize, threads: usize, conns: usize) -> Vec<(Vec<usize>, usize)> {
    let (tasks, conns) = (tasks.max(1), conns.max(1));
    let threads = load_threads(tasks, threads, conns);
    (0..threads)
        .map(|thread| {
            let mine = (thread..tasks).step_by(threads).collect();
            (mine, conns / threads + usize::from(thread < conns % threads))
        })
        .collect()
}

/// How many load threads `tasks` tasks over `conns` connections per node run on when
/// `threads` are asked for: no more than the connections, nor than the tasks.
pub fn load_threads(tasks: usize, threads: usize, conns: usize) -> usize {
    threads.min(conns.max(1)).clamp(1, tasks.max(1))
}

/// The tasks one thread runs and what they share.
type ThreadPart = (Vec<usize>, Arc<Shared>, EngineConfig, Arc<Live>);

/// Starts load thread `thread`: a runtime of one worker running `part`'s tasks over a
/// client of its own with `conns` connections per node. (One worker, not a current-thread
/// runtime: the same at batch 64, 5% more op/s at batch 1024, where the current-thread
/// runtime parked between batches more often.)
fn spawn_load_thread(
    thread: usize,
    cluster: &Cluster,
    conns: usize,
    part: ThreadPart,
) -> std::io::Result<ThreadOutput> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()?;
    let sibling = Arc::new(cluster.sibling(conns).map_err(std::io::Error::other)?);
    let (tx, rx) = tokio::sync::oneshot::channel();
    std::thread::Builder::new()
        .name(format!("kvbench-load-{thread}"))
        .spawn(move || {
            let (mine, shared, cfg, live) = part;
            let _ = tx.send(rt.block_on(run_tasks(mine, sibling, shared, cfg, live)));
        })?;
    Ok(rx)
}

/// Runs tasks `tasks` on the current runtime and merges what they measured.
async fn run_tasks(
    tasks: Vec<usize>,
    cluster: Arc<Cluster>,
    shared: Arc<Shared>,
    cfg: EngineConfig,
    live: Arc<Live>,
) -> TaskOutput {
    let recorded = Recorded::new(cluster.node_count());
    let handles: Vec<_> = tasks
        .into_iter()
        .map(|t| {
            let out = TaskOutput::new(cluster.node_count(), recorded.clone());
            tokio::spawn(task_loop(
                t,
                cluster.clone(),
                shared.clone(),
                cfg.clone(),
                live.clone(),
                out,
            ))
        })
        .collect();
    let mut out = TaskOutput::new(cluster.node_count(), recorded);
    for h in handles {
        // A task only fails by panicking; its figures are lost but the run still reports.
        if let Ok(t) = h.await {
            merge_task(&mut out, t);
        }
    }
    out
}

fn merge_task(into: &mut TaskOutput, t: TaskOutput) {
    for i in 0..4 {
        into.ops_by_type[i] += t.ops_by_type[i];
    }
    // A thread's tasks recorded into their thread's histograms already.
    if !Arc::ptr_eq(&into.recorded, &t.recorded) {
        into.recorded.lock().add(&t.recorded.lock());
    }
    for (a, b) in into.per_node_ops.iter_mut().zip(&t.per_node_ops) {
        *a += b;
    }
    into.wire_ops_completed += t.wire_ops_completed;
    into.read_misses += t.read_misses;
    into.measured_read_misses += t.measured_read_misses;
    into.fills += t.fills;
    into.redirected += t.redirected;
    into.failed_ops += t.failed_ops;
    into.pauses += t.pauses;
    for (k, v) in t.errors {
        *into.errors.entry(k).or_insert(0) += v;
    }
    into.timeline.absorb(t.timeline);
}

/// Samples the completed-op counter once a second into `live.per_second`.
async fn monitor(live: Arc<Live>) {
    let mut last = 0;
    let mut tick = tokio::time::interval_at((live.started + Duration::from_secs(1)).into(), Duration::from_secs(1));
    while !live.stop.load(Ordering::Relaxed) {
        tick.tick().await;
        let now = live.completed.load(Ordering::Relaxed);
        live.per_second.lock().push(now - last);
        last = now;
    }
}

async fn task_loop(
    task: usize,
    cluster: Arc<Cluster>,
    shared: Arc<Shared>,
    cfg: EngineConfig,
    live: Arc<Live>,
    mut out: TaskOutput,
) -> TaskOutput {
    let nodes = cluster.node_count();
    let seed = cfg.seed.wrapping_add((task as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15));
    let prefix = shared.spec.key_prefix.clone();
    let mut filler = BatchFiller::new(
        shared,
        seed,
        (nodes, cluster.slots().clone()),
        cfg.batch,
        cfg.split_reads,
    );
    let per_task_rate = cfg.rate.map(|r| (r / cfg.tasks.max(1) as f64).max(1e-3));
    let mut recent = new_hist();
    let mut recent_since = Instant::now();
    let mut misses = Vec::new();
    let mut redirected = Vec::new();
    let mut sent = BatchRequest::new();
    let mut fill = BatchRequest::new();
    let fill_value = vec![0x5a_u8; filler.value_size()];
    let mut parked: Vec<Option<Parked>> = (0..nodes).map(|_| None).collect();
    let mut stall_timer = Box::pin(tokio::time::sleep(Duration::ZERO));
    while !live.stop.load(Ordering::Relaxed) {
        let lane = filler.fill(&prefix);
        let node = filler.node_of(lane);
        // Open loop: the batch was due when its last op was scheduled; latency counts from then,
        // so time spent behind schedule is measured, not hidden (coordinated omission).
        let intended = per_task_rate.map(|r| live.started + Duration::from_secs_f64(filler.generated as f64 / r));
        if let Some(t) = intended {
            tokio::time::sleep_until(t.into()).await;
            if live.stop.load(Ordering::Relaxed) {
                break;
            }
        }
        collect_parked(&cluster, &mut parked, &mut out, &live).await;
        if parked[node].is_some() {
            // This node left an earlier batch of ours unanswered past its stall threshold: do not
            // queue more behind it; the ops fail now and the other nodes' ops go on.
            let ops: u64 = filler.take_counts(lane).iter().sum();
            out.error("stalled", ops);
            live.failed.fetch_add(ops, Ordering::Relaxed);
            tokio::task::yield_now().await;
            continue;
        }
        let sent_at = Instant::now();
        let result = match cluster.start_batch(node, filler.request(lane)).await {
            Err(e) => Err(e),
            Ok(flight) => {
                let stall_after = flight.stall_after();
                let waiting = {
                    let cluster = cluster.clone();
                    async move { cluster.finish_batch(node, flight).await }
                };
                let mut waiting = Box::pin(waiting);
                // One timer per task, moved only when it would fire before this batch's
                // stall threshold (to half a threshold past it): a stall is seen 1-1.5
                // thresholds after the send, and most batches leave the timer wheel alone
                // (a timer per batch was 3% of kvbench's CPU at batch 64).
                let due = tokio::time::Instant::from_std(sent_at + stall_after);
                if stall_timer.deadline() < due {
                    stall_timer.as_mut().reset(due + stall_after / 2);
                }
                tokio::select! {
                    result = &mut waiting => result,
                    _ = stall_timer.as_mut() => {
                        // Stalled node: park the batch (it waits for its timeout on its own)
                        // and go on with the other nodes.
                        let wire_ops = filler.request(lane).len() as u64;
                        let counts = filler.take_counts(lane);
                        parked[node] = Some(Parked { wait: tokio::spawn(waiting), counts, wire_ops, sent_at });
                        continue;
                    }
                }
            }
        };
        // A replica group's leader moved: the batch did not run; send it to the new one.
        let result = match result {
            Err(e) if cluster.worth_resending(node, &e) => cluster.send_batch(node, filler.request(lane)).await,
            other => other,
        };
        let mut done = Instant::now();
        let wire_ops = filler.request(lane).len() as u64;
        // Cache-aside needs the keys of the misses once the reply is in (the batch is reused).
        if cfg.cache_aside {
            sent.clone_from(filler.request(lane));
        }
        match result {
            Ok(reply) => {
                let in_window = done >= live.measure_start && done <= live.measure_end;
                misses.clear();
                redirected.clear();
                let mut failed = check_reply(
                    &cluster,
                    &reply,
                    wire_ops,
                    &mut out,
                    in_window,
                    &mut misses,
                    &mut redirected,
                );
                drop(reply);
                if !redirected.is_empty() {
                    failed -= resend(&cluster, filler.request(lane), &redirected, &mut out).await;
                    done = Instant::now();
                }
                let counts = filler.take_counts(lane);
                if cfg.cache_aside && !misses.is_empty() {
                    fill.clear();
                    for &i in &misses {
                        if let Some(key) = sent.key(i) {
                            fill.push_put(key, &fill_value);
                        }
                    }
                    if cluster.send_batch(node, &fill).await.is_ok() {
                        out.fills += fill.len() as u64;
                    }
                }
                let ok_counts = without_failures(counts, failed);
                let ok: u64 = ok_counts.iter().sum();
                out.wire_ops_completed += wire_ops.saturating_sub(failed);
                live.completed.fetch_add(ok, Ordering::Relaxed);
                let latency = (done.saturating_duration_since(intended.unwrap_or(sent_at)).as_nanos() as u64).max(1);
                let tracking = live.track_recent_latency.load(Ordering::Relaxed);
                if tracking {
                    let _ = recent.record(latency);
                }
                if tracking && done.duration_since(recent_since) >= Duration::from_millis(100) {
                    let _ = live.recent_latency.lock().add(&recent);
                    recent.reset();
                    recent_since = done;
                }
                let second = done.saturating_duration_since(live.started).as_secs() as usize;
                out.timeline.record(node, second, latency);
                if done >= live.measure_start && done <= live.measure_end {
                    let mut recorded = out.recorded.lock();
                    let _ = recorded.batch_hist.record(latency);
                    for (i, &c) in ok_counts.iter().enumerate() {
                        if c > 0 {
                            let _ = recorded.hists[i].record_n(latency, c);
                            out.ops_by_type[i] += c;
                        }
                    }
                    let with_write = usize::from(counts[1..].iter().any(|&c| c > 0));
                    if let Some(h) = recorded.node_batches.get_mut(node) {
                        let _ = h[with_write].record(latency);
                    }
                    drop(recorded);
                    out.per_node_ops[node] += ok;
                    let measured = live.measured.fetch_add(ok, Ordering::Relaxed) + ok;
                    if cfg.ops_limit.is_some_and(|limit| measured >= limit) {
                        live.stop_early();
                    }
                }
            }
            Err(e) => {
                let ops: u64 = filler.take_counts(lane).iter().sum();
                out.error(e.kind(), ops);
                live.failed.fetch_add(ops, Ordering::Relaxed);
                if let Some(pause) = pause_after(&e, &cluster) {
                    out.pauses += 1;
                    tokio::time::sleep(pause).await;
                }
            }
        }
    }
    for p in parked.iter_mut().filter_map(Option::take) {
        // The run is over: what a stalled node still owes is not waited for.
        p.wait.abort();
        let ops: u64 = p.counts.iter().sum();
        out.error("stalled", ops);
    }
    out
}

/// A batch left waiting on a node that stopped answering (see `InFlight::stall_after`).
struct Parked {
    wait: tokio::task::JoinHandle<Result<Reply, ClientError>>,
    counts: [u64; 4],
    wire_ops: u64,
    sent_at: Instant,
}

/// Accounts the parked batches that have finished (answered late, or timed out): a late
/// answer's ops count as done, with the latency they really had; a failure as failed.
async fn collect_parked(cluster: &Cluster, parked: &mut [Option<Parked>], out: &mut TaskOutput, live: &Live) {
    for slot in parked.iter_mut() {
        if !slot.as_ref().is_some_and(|p| p.wait.is_finished()) {
            continue;
        }
        let Some(p) = slot.take() else { continue };
        let ops: u64 = p.counts.iter().sum();
        // Finished, so this does not wait.
        match p.wait.await {
            Ok(Ok(reply)) => {
                let done = Instant::now();
                let mut misses = Vec::new();
                // The batch is gone: ops redirected here are not sent again (counted failed).
                let mut redirected = Vec::new();
                let failed = check_reply(cluster, &reply, p.wire_ops, out, true, &mut misses, &mut redirected);
                if !redirected.is_empty() {
                    out.error("redirected", redirected.len() as u64);
                }
                let ok_counts = without_failures(p.counts, failed);
                let ok: u64 = ok_counts.iter().sum();
                live.completed.fetch_add(ok, Ordering::Relaxed);
                if done >= live.measure_start && done <= live.measure_end {
                    let latency = done.saturating_duration_since(p.sent_at).as_nanos() as u64;
                    let mut recorded = out.recorded.lock();
                    for (i, &c) in ok_counts.iter().enumerate() {
                        if c > 0 {
                            let _ = recorded.hists[i].record_n(latency, c);
                            out.ops_by_type[i] += c;
                        }
                    }
                    drop(recorded);
                    live.measured.fetch_add(ok, Ordering::Relaxed);
                }
            }
            Ok(Err(e)) => {
                out.error(e.kind(), ops);
                live.failed.fetch_add(ops, Ordering::Relaxed);
            }
            Err(_) => {
                out.error("stalled", ops);
                live.failed.fetch_add(ops, Ordering::Relaxed);
            }
        }
    }
}

/// Sends again the ops of `request` a node answered `Moved` (its slot has another owner,
/// now learned) or `TryAgain` (its slot was being handed over): the cluster client routes
/// them by its table, follows further redirects and waits out a hand-over, within its
/// request timeout. Returns how many now succeeded; the others count as errors.
async fn resend(cluster: &Cluster, request: &BatchRequest, redirected: &[usize], out: &mut TaskOutput) -> u64 {
    let ops = ops_at(request, redirected);
    out.redirected += redirected.len() as u64;
    let mut ok = 0;
    for result in cluster.batch(&ops).await {
        match result {
            Ok(Outcome::NotFound) => {
                out.read_misses += 1;
                ok += 1;
            }
            Ok(_) => ok += 1,
            Err(e) => out.error(e.kind(), 1),
        }
    }
    if ops.len() < redirected.len() {
        // An op the request does not hold (it cannot happen: the batch is kept until here).
        out.error("protocol", (redirected.len() - ops.len()) as u64);
    }
    ok
}

/// The ops of `request` at `indexes`, for the cluster client to send again (it routes them
/// by its table and follows redirects); an index the request does not hold is left out.
pub(crate) fn ops_at<'a>(request: &'a BatchRequest, indexes: &[usize]) -> Vec<Op<'a>> {
    indexes
        .iter()
        .filter_map(|&i| request.op(i))
        .map(|(kind, key, value)| Op::Raw(kind, key, value))
        .collect()
}

/// Per-type op counts with `failed` ops taken off (from the first types on). Per-op failures
/// are rare (a misconfigured cluster), and are reported in full in the error counts.
fn without_failures(mut counts: [u64; 4], mut failed: u64) -> [u64; 4] {
    for c in counts.iter_mut() {
        let take = failed.min(*c);
        *c -= take;
        failed -= take;
    }
    counts
}

/// Counts per-op errors and read misses in a reply (and collects the op indexes of the
/// misses and of the ops answered `Moved` or `TryAgain`); returns the number of failed ops,
/// those redirected included.
fn check_reply(
    cluster: &Cluster,
    reply: &Reply,
    wire_ops: u64,
    out: &mut TaskOutput,
    in_window: bool,
    misses: &mut Vec<usize>,
    redirected: &mut Vec<usize>,
) -> u64 {
    let view = match reply.batch() {
        Ok(v) => v,
        Err(e) => {
            out.error(e.kind(), wire_ops);
            return wire_ops;
        }
    };
    if view.len() as u64 != wire_ops {
        out.error("protocol", wire_ops);
        return wire_ops;
    }
    let mut failed = 0;
    for i in 0..view.len() {
        match view.status(i) {
            Some(OpStatus::NotFound) => {
                out.read_misses += 1;
                out.measured_read_misses += u64::from(in_window);
                misses.push(i);
            }
            Some(OpStatus::Moved) => {
                // Learned for the next batches; the op is sent again (see `resend`).
                if let OpReply::Moved { slot, owner, epoch } = view.result(i) {
                    cluster.learn_moved(slot, owner, epoch);
                }
                redirected.push(i);
                failed += 1;
            }
            Some(OpStatus::TryAgain) => {
                redirected.push(i);
                failed += 1;
            }
            Some(OpStatus::Malformed) | None => {
                out.error("malformed_op", 1);
                failed += 1;
            }
            Some(OpStatus::TooLarge) => {
                out.error("reply_too_large", 1);
                failed += 1;
            }
            Some(OpStatus::OutOfMemory) => {
                out.error("out_of_memory", 1);
                failed += 1;
            }
            _ => {}
        }
    }
    failed
}

/// How long a task pauses after a failed batch. Not at all while some node is up: the
/// client fails a down node's batches at once, and the task's ops for healthy nodes must
/// keep flowing. Only when every node is down does it pause, so it does not spin.
fn pause_after(e: &ClientError, cluster: &Cluster) -> Option<Duration> {
    match e {
        ClientError::Timeout { .. } => None,
        _ if cluster.any_up() => None,
        _ => Some(Duration::from_millis(20)),
    }
}

#[cfg(test)]
mod tests {
    use super::{BatchFiller, thread_plan};
    use crate::workload::{OpGen, OpType, Shared, SpecOptions, Workload, WorkloadSpec, write_key};
    use kvshared::client::NodeBatches;
    use kvshared::slots::SlotTable;
    use kvshared::wire::OpKind;

    /// A node's batches made with their gets' keys written in place hold what pushing each
    /// op with its key from a buffer gives: the same ops, kinds, keys and values, in order.
    #[test]
    fn batches_with_keys_written_in_place_hold_the_ops_drawn() {
        for (workload, prefix, split_reads) in [(Workload::B, "", false), (Workload::A, "user", true)] {
            let opts = SpecOptions {
                records: 1_000_000,
                value_size: 16,
                key_prefix: prefix.into(),
                ..SpecOptions::default()
            };
            let shared = Shared::new(WorkloadSpec::new(workload, &opts), 1);
            let slots = std::sync::Arc::new(SlotTable::for_client(1));
            let mut filler = BatchFiller::new(shared.clone(), 9, (1, slots), 64, split_reads);
            // The same draws, pushed one by one (the filler's first draw fills its value).
            let mut ops = OpGen::new(shared, 9);
            let mut value = vec![0u8; 16];
            rand::Rng::fill_bytes(ops.rng(), &mut value);
            let mut expected = NodeBatches::new(if split_reads { 2 } else { 1 });
            for _ in 0..20 {
                let lane = filler.fill(prefix);
                loop {
                    let (op, index) = ops.next_op();
                    let mut key = Vec::new();
                    write_key(&mut key, prefix, index);
                    let lane_of = usize::from(split_reads && op != OpType::Read);
                    match op {
                        OpType::Read => expected.push_to(lane_of, OpKind::Get, &key, &[]),
                        _ => {
                            ops.fresh_value(&mut value);
                            expected.push_to(lane_of, OpKind::Put, &key, &value);
                        }
                    }
                    if lane_of == lane && expected.batch(lane).len() == 64 {
                        break;
                    }
                }
                assert_eq!(filler.request(lane), expected.batch(lane));
                filler.take_counts(lane);
                expected.clear(lane);
            }
        }
    }

    /// Every task runs on exactly one thread, and the threads' connections add up to the
    /// `--conns` asked for, each thread having at least one.
    #[test]
    fn threads_split_the_tasks_and_the_connections() {
        assert_eq!(thread_plan(5, 2, 2), vec![(vec![0, 2, 4], 1), (vec![1, 3], 1)]);
        assert_eq!(thread_plan(4, 2, 3), vec![(vec![0, 2], 2), (vec![1, 3], 1)]);
        // No more threads than connections per node, nor than tasks.
        assert_eq!(thread_plan(4, 8, 1), vec![(vec![0, 1, 2, 3], 1)]);
        assert_eq!(thread_plan(2, 8, 16).len(), 2);
        assert_eq!(thread_plan(0, 0, 0), vec![(vec![0], 1)]);
        for tasks in 1..20 {
            for threads in 1..6 {
                for conns in 1..6 {
                    let plan = thread_plan(tasks, threads, conns);
                    assert_eq!(plan.len(), super::load_threads(tasks, threads, conns));
                    let mut all: Vec<usize> = plan.iter().flat_map(|(t, _)| t.clone()).collect();
                    all.sort_unstable();
                    assert_eq!(all, (0..tasks).collect::<Vec<_>>());
                    assert_eq!(plan.iter().map(|(_, c)| c).sum::<usize>(), conns.max(plan.len()));
                    assert!(plan.iter().all(|(t, c)| !t.is_empty() && *c >= 1));
                }
            }
        }
    }
}
