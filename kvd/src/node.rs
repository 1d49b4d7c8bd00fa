//! The state one kvd process shares between its connections.

use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use kvshared::auth::AuthToken;
use kvshared::frame::DEFAULT_MAX_FRAME;
use kvshared::routing::ShardId;
use kvshared::stats::{Counts, NodeStats};
use kvshared::tls::TlsServer;
use kvshared::wire::{BatchResponse, BatchView, ConfigRequest};

use crate::budget::BufferBudget;
use crate::counters::Counters;
use crate::durable::log::FsyncPolicy;
use crate::durable::raft::DurableShard;
use crate::sampler::Sampler;
use crate::store::{MemoryLimit, ReplyRoom, Scratch, Store};
use crate::warn_limit::WarnLimit;

/// Default `--idle-timeout`.
pub const DEFAULT_IDLE_TIMEOUT: Duration = Duration::from_secs(300);
/// Default `--read-timeout`.
pub const DEFAULT_READ_TIMEOUT: Duration = Duration::from_secs(10);

/// The file in a data directory that says which shard it holds.
const SHARD_FILE: &str = "shard";

/// Refuses a data directory written for another shard; marks a new one as this shard's.
fn check_shard_file(dir: &std::path::Path, me: ShardId) -> std::io::Result<()> {
    std::fs::create_dir_all(dir)?;
    let path = dir.join(SHARD_FILE);
    match std::fs::read_to_string(&path) {
        Ok(found) if found.trim() == me.to_string() => Ok(()),
        Ok(found) => Err(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!(
                "{} holds shard {} but this kvd serves --shard {me}: point --data-dir at this shard's directory",
                dir.display(),
                found.trim()
            ),
        )),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            std::fs::write(&path, format!("{me}\n"))?;
            crate::durable::sync_dir(dir)
        }
        Err(e) => Err(e),
    }
}

/// Default `--max-buffer-memory` (1 GiB).
pub const DEFAULT_MAX_BUFFER_MEMORY: usize = 1 << 30;

/// Reads how many log lines the process dropped (set once by the binary that set up logging).
static LOG_LINES_DROPPED: OnceLock<Box<dyn Fn() -> u64 + Send + Sync>> = OnceLock::new();

/// Tells every node of this process how to read the log's dropped-lines count.
pub fn report_log_drops(read: impl Fn() -> u64 + Send + Sync + 'static) {
    let _ = LOG_LINES_DROPPED.set(Box::new(read));
}

/// How a node is set up (the serving flags of the `kvd` command).
#[derive(Clone, Debug)]
pub struct NodeConfig {
    /// The shard this node serves.
    pub shard: ShardId,
    /// Internal map shards (rounded up to a power of two).
    pub map_shards: usize,
    /// Keys to preallocate room for.
    pub capacity: usize,
    /// Most connections served at once.
    pub max_conns: usize,
    /// Largest frame body accepted.
    pub max_frame: u32,
    /// Close a connection that sends no request for this long (`None`: never).
    pub idle_timeout: Option<Duration>,
    /// A frame that has begun must arrive whole within this long.
    pub read_timeout: Duration,
    /// Bytes all connections together may hold in buffers beyond a small allowance each.
    pub max_buffer_memory: usize,
    /// The token clients must present first (`None`: no token).
    pub auth: Option<AuthToken>,
    /// Serve clients from other hosts without a token (turns protected mode off).
    pub insecure_no_auth: bool,
    /// Serve TLS only (`--tls-cert`, `--tls-key`).
    pub tls: Option<TlsServer>,
    /// `--max-memory` and `--eviction` (`None`: unlimited).
    pub memory: Option<MemoryLimit>,
    /// `--data-dir`: keep the shard durable there (`None`: in memory only).
    pub data_dir: Option<std::path::PathBuf>,
    /// `--fsync`: when a logged write is durable.
    pub fsync: FsyncPolicy,
    /// Tokio worker threads, reported in stats.
    pub worker_threads: usize,
    /// How often the CPU/memory/network sampler runs.
    pub sample_period: Duration,
    /// Unit tests only: answer some reads from a stale copy (see `store::stale`).
    #[cfg(test)]
    pub fault_stale_reads: bool,
}

impl Default for NodeConfig {
    fn default() -> Self {
        NodeConfig {
            shard: ShardId::SOLO,
            map_shards: 64,
            capacity: 0,
            max_conns: 1024,
            max_frame: DEFAULT_MAX_FRAME,
            idle_timeout: Some(DEFAULT_IDLE_TIMEOUT),
            read_timeout: DEFAULT_READ_TIMEOUT,
            max_buffer_memory: DEFAULT_MAX_BUFFER_MEMORY,
            auth: None,
            insecure_no_auth: false,
            tls: None,
            memory: None,
            data_dir: None,
            fsync: FsyncPolicy::Always,
            worker_threads: 1,
            sample_period: Duration::from_secs(1),
            #[cfg(test)]
            fault_stale_reads: false,
        }
    }
}

/// The store, the counters and the system sampler of one node.
pub struct Node {
    /// How it was set up.
    pub config: NodeConfig,
    /// The data.
    pub store: Arc<Store>,
    /// What it has done.
    pub(crate) counters: Arc<Counters>,
    /// The shard's log, with `--data-dir`: batches with writes go through it.
    durable: Option<DurableShard>,
    /// What the connections' buffers may hold together.
    pub(crate) buffers: BufferBudget,
    /// How many warnings peers may cause.
    pub(crate) warnings: WarnLimit,
    /// Protected mode: no token, bound beyond loopback, and not told `--insecure-no-auth`;
    /// only loopback peers are served.
    pub(crate) protected: bool,
    sampler: Sampler,
    started: Instant,
}

impl Node {
    /// A node with an empty store; starts the sampler thread. Fails if the store's
    /// preallocation cannot be had.
    pub fn new(config: NodeConfig) -> std::io::Result<Node> {
        #[allow(unused_mut)]
        let mut store = Store::with_limit(config.shard, config.map_shards, config.capacity, config.memory)?;
        #[cfg(test)]
        if config.fault_stale_reads {
            store.enable_stale_reads();
        }
        Ok(Node {
            store: Arc::new(store),
            counters: Arc::new(Counters::default()),
            durable: None,
            buffers: BufferBudget::new(config.max_buffer_memory),
            warnings: WarnLimit::default(),
            protected: false,
            sampler: Sampler::start(config.sample_period),
            started: Instant::now(),
            config,
        })
    }

    /// With `--data-dir`: opens the shard's log there (creating it on first start, refusing a
    /// directory of another shard), replays it into the store, and logs what was recovered.
    pub async fn open_data_dir(&mut self) -> std::io::Result<()> {
        let Some(dir) = self.config.data_dir.clone() else {
            return Ok(());
        };
        let started = Instant::now();
        check_shard_file(&dir, self.config.shard)?;
        let shard = DurableShard::open(&dir, self.store.clone(), self.counters.clone(), self.config.fsync)
            .await
            .map_err(|e| std::io::Error::other(format!("{}: {e}", dir.display())))?;
        tracing::info!(
            dir = %dir.display(),
            keys = self.store.len(),
            entries_replayed = shard.applied_index(),
            took_ms = started.elapsed().as_millis() as u64,
            fsync = ?self.config.fsync,
            "recovered the shard from its log"
        );
        self.durable = Some(shard);
        Ok(())
    }

    /// Whether batches with writes must go through the log ([`Node::write_through_log`]).
    pub fn logs_writes(&self) -> bool {
        self.durable.is_some()
    }

    /// Commits a batch with writes through the shard's log and applies it; returns the
    /// encoded response body. An error means the outcome is unknown (the batch may have
    /// been logged).
    pub async fn write_through_log(&self, body: Vec<u8>) -> Result<Vec<u8>, String> {
        match &self.durable {
            Some(log) => log.write(body).await.map_err(|e| e.to_string()),
            None => Err("this node has no log".into()),
        }
    }

    /// Stops the shard's log (at shutdown, after the connections are done).
    pub async fn close(&self) {
        if let Some(log) = &self.durable {
            log.shutdown().await;
        }
    }

    /// Runs a batch: the one entry point into the node for every front (the binary protocol
    /// today; RESP and HTTP later), so that what a batch does is decided here, per mode. In
    /// memory, the store runs it at once. (A durable or replicated node will send batches
    /// with writes through its log here, and no front will need to know.)
    pub fn execute(
        &self,
        batch: &BatchView<'_>,
        out: &mut BatchResponse,
        room: &mut impl ReplyRoom,
        scratch: &mut Scratch,
        tally: &mut Counts,
    ) {
        self.store.execute(batch, out, room, scratch, tally);
    }

    /// Applies a change of settings at run time (flush first, then the cap).
    pub fn configure(&self, change: &ConfigRequest) {
        if change.flush {
            self.store.flush();
            tracing::info!("flushed every key (config request)");
        }
        if let Some(max) = change.max_memory_bytes {
            let max = (max > 0).then_some(max as usize);
            self.store.set_max_memory(max);
            tracing::info!(max_memory_bytes = ?max, "memory cap changed (config request)");
        }
    }

    /// A snapshot of every figure the node reports.
    pub fn stats(&self) -> NodeStats {
        let sample = self.sampler.latest();
        let mut system = sample.figures;
        system.system_sampled_ms = sample.at.saturating_duration_since(self.started).as_millis() as u64;
        NodeStats {
            version: env!("CARGO_PKG_VERSION").to_string(),
            shard: self.config.shard,
            pid: std::process::id(),
            uptime_ms: self.started.elapsed().as_millis() as u64,
            unix_ms: SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map(|d| d.as_millis() as u64)
                .unwrap_or(0),
            keys: self.store.len(),
            map_shards: self.store.map_shards() as u32,
            memory_used_bytes: self.store.memory_used(),
            max_memory_bytes: self.store.memory_limit().map_or(0, |l| l.max_bytes as u64),
            eviction: self
                .store
                .memory_limit()
                .map_or(String::new(), |l| l.eviction.name().to_string()),
            worker_threads: self.config.worker_threads as u32,
            counts: Counts {
                log_lines_dropped: LOG_LINES_DROPPED.get().map_or(0, |f| f()),
                ..self.counters.totals()
            },
            system,
        }
    }
}
