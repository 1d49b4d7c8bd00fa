//! The state one kvd process shares between its connections.

use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use kvshared::frame::DEFAULT_MAX_FRAME;
use kvshared::routing::ShardId;
use kvshared::stats::{ErrorCounts, NodeStats};

use crate::counters::{Counter, Counters};
use crate::sampler::Sampler;
use crate::store::Store;

/// How a node is set up (the serving flags of the `kvd` command).
#[derive(Clone, Debug)]
pub struct NodeConfig {
    pub shard: ShardId,
    /// Internal map shards (rounded up to a power of two).
    pub map_shards: usize,
    /// Keys to preallocate room for.
    pub capacity: usize,
    pub max_conns: usize,
    pub max_frame: u32,
    /// Tokio worker threads, reported in stats.
    pub worker_threads: usize,
    /// How often the CPU/memory/network sampler runs.
    pub sample_period: Duration,
    /// Test-only fault injection: answer some reads from a stale copy.
    #[cfg(feature = "fault-stale-reads")]
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
            worker_threads: 1,
            sample_period: Duration::from_secs(1),
            #[cfg(feature = "fault-stale-reads")]
            fault_stale_reads: false,
        }
    }
}

/// The store, the counters and the system sampler of one node.
pub struct Node {
    pub config: NodeConfig,
    pub store: Store,
    pub counters: Counters,
    sampler: Sampler,
    started: Instant,
}

impl Node {
    pub fn new(config: NodeConfig) -> Node {
        #[allow(unused_mut)]
        let mut store = Store::new(config.shard, config.map_shards, config.capacity);
        #[cfg(feature = "fault-stale-reads")]
        if config.fault_stale_reads {
            store.enable_stale_reads();
        }
        Node {
            store,
            counters: Counters::default(),
            sampler: Sampler::start(config.sample_period),
            started: Instant::now(),
            config,
        }
    }

    /// A snapshot of every figure the node reports.
    pub fn stats(&self) -> NodeStats {
        let c = |k| self.counters.total(k);
        let sys = self.sampler.latest();
        let opened = c(Counter::ConnsOpened);
        NodeStats {
            version: env!("CARGO_PKG_VERSION").to_string(),
            shard_index: self.config.shard.index,
            shard_count: self.config.shard.count,
            pid: std::process::id(),
            uptime_ms: self.started.elapsed().as_millis() as u64,
            unix_ms: SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map(|d| d.as_millis() as u64)
                .unwrap_or(0),
            keys: self.store.len(),
            map_shards: self.store.map_shards() as u32,
            worker_threads: self.config.worker_threads as u32,
            gets: c(Counter::Gets),
            puts: c(Counter::Puts),
            deletes: c(Counter::Deletes),
            hits: c(Counter::Hits),
            misses: c(Counter::Misses),
            batches: c(Counter::Batches),
            bytes_in: c(Counter::BytesIn),
            bytes_out: c(Counter::BytesOut),
            connections_open: opened.saturating_sub(c(Counter::ConnsClosed)),
            connections_total: opened,
            errors: ErrorCounts {
                wrong_shard: c(Counter::WrongShard),
                malformed_op: c(Counter::MalformedOp),
                malformed_body: c(Counter::MalformedBody),
                bad_frame: c(Counter::BadFrame),
                frame_too_large: c(Counter::FrameTooLarge),
                io: c(Counter::Io),
            },
            system_sampled_ms: sys.at.saturating_duration_since(self.started).as_millis() as u64,
            process_cpu_ms: sys.process_cpu_ms,
            process_cpu_percent: sys.process_cpu_percent,
            process_rss_bytes: sys.process_rss_bytes,
            host_cpu_percent: sys.host_cpu_percent,
            host_cpus: sys.host_cpus,
            host_mem_used_bytes: sys.host_mem_used_bytes,
            host_mem_total_bytes: sys.host_mem_total_bytes,
            host_name: sys.host_name,
            interfaces: sys.interfaces,
        }
    }
}
