//! The state one kvd process shares between its connections.

use std::sync::OnceLock;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use kvshared::auth::AuthToken;
use kvshared::frame::DEFAULT_MAX_FRAME;
use kvshared::routing::ShardId;
use kvshared::stats::{Counts, NodeStats};
use kvshared::tls::TlsServer;
use kvshared::wire::{BatchResponse, BatchView, ConfigRequest};

use crate::budget::BufferBudget;
use crate::counters::Counters;
use crate::sampler::Sampler;
use crate::store::{MemoryLimit, ReplyRoom, Scratch, Store};
use crate::warn_limit::WarnLimit;

/// Default `--idle-timeout`.
pub const DEFAULT_IDLE_TIMEOUT: Duration = Duration::from_secs(300);
/// Default `--read-timeout`.
pub const DEFAULT_READ_TIMEOUT: Duration = Duration::from_secs(10);

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
    pub store: Store,
    /// What it has done.
    pub(crate) counters: Counters,
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
            store,
            counters: Counters::default(),
            buffers: BufferBudget::new(config.max_buffer_memory),
            warnings: WarnLimit::default(),
            protected: false,
            sampler: Sampler::start(config.sample_period),
            started: Instant::now(),
            config,
        })
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
