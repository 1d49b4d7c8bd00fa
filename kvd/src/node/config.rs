//! How a node is set up, by concern: where it sits in the cluster, its engine, its
//! durability, and its edge (the connection limits, handed to the edge alone).

use std::path::PathBuf;
use std::time::Duration;

use kvshared::frame::DEFAULT_MAX_FRAME;
use kvshared::routing::ShardId;

use crate::durable::LogSettings;
use crate::edge::EdgeConfig;
use crate::store::MemoryLimit;

/// Default `--idle-timeout`.
pub const DEFAULT_IDLE_TIMEOUT: Duration = Duration::from_secs(300);
/// Default `--read-timeout`.
pub const DEFAULT_READ_TIMEOUT: Duration = Duration::from_secs(10);
/// Default `--write-timeout`.
pub const DEFAULT_WRITE_TIMEOUT: Duration = Duration::from_secs(10);
/// Default `--max-buffer-memory` (1 GiB).
pub const DEFAULT_MAX_BUFFER_MEMORY: usize = 1 << 30;

/// How a node is set up (the serving flags of the `kvd` command).
#[derive(Clone, Debug, Default)]
pub struct NodeConfig {
    /// Where it sits in the cluster.
    pub cluster: ClusterConfig,
    /// Its store and the threads that serve it.
    pub engine: EngineConfig,
    /// `--data-dir` and how the log is kept (`None`: in memory only).
    pub durability: Option<Durability>,
    /// What every connection is held to (`--max-frame` also bounds what the node accepts
    /// and answers).
    pub edge: EdgeConfig,
}

/// Where a node sits in the cluster.
#[derive(Clone, Debug)]
pub struct ClusterConfig {
    /// The shard this node serves.
    pub shard: ShardId,
    /// `--no-slots`: it starts owning no slot (a group added to a running cluster).
    pub no_slots: bool,
    /// `--group` or `--join`: this node is a member of a replica group.
    pub group: Option<GroupMember>,
}

/// How a node belongs to a replica group.
#[derive(Clone, Debug)]
pub struct GroupMember {
    /// This member's address as the others reach it (its `--listen`, as written).
    pub me: String,
    /// `--group`: the members a new group starts with (this one among them); empty with
    /// `--join` (the member waits for `kvd admin add-replica`).
    pub initial: Vec<String>,
}

/// The store and the threads that serve it.
#[derive(Clone, Debug)]
pub struct EngineConfig {
    /// Internal map shards (rounded up to a power of two).
    pub map_shards: usize,
    /// Keys to preallocate room for.
    pub capacity: usize,
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

/// A durable node's data directory and how its log is kept.
#[derive(Clone, Debug)]
pub struct Durability {
    /// `--data-dir`.
    pub data_dir: PathBuf,
    /// `--fsync`, `--snapshot-every`, and the segment size.
    pub log: LogSettings,
}

impl Durability {
    /// Durable in `data_dir`, with the default log settings.
    pub fn in_dir(data_dir: impl Into<PathBuf>) -> Durability {
        Durability {
            data_dir: data_dir.into(),
            log: LogSettings::default(),
        }
    }
}

impl Default for ClusterConfig {
    fn default() -> Self {
        ClusterConfig {
            shard: ShardId::SOLO,
            no_slots: false,
            group: None,
        }
    }
}

impl Default for EngineConfig {
    fn default() -> Self {
        EngineConfig {
            map_shards: 64,
            capacity: 0,
            memory: None,
            worker_threads: 1,
            sample_period: Duration::from_secs(1),
            #[cfg(test)]
            fault_stale_reads: false,
        }
    }
}

impl Default for EdgeConfig {
    fn default() -> Self {
        EdgeConfig {
            max_conns: 1024,
            max_frame: DEFAULT_MAX_FRAME,
            idle_timeout: Some(DEFAULT_IDLE_TIMEOUT),
            read_timeout: DEFAULT_READ_TIMEOUT,
            write_timeout: DEFAULT_WRITE_TIMEOUT,
            max_buffer_memory: DEFAULT_MAX_BUFFER_MEMORY,
            auth: None,
            insecure_no_auth: false,
            tls: None,
        }
    }
}
