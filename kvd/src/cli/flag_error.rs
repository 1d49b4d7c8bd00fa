//! Why `kvd`'s flags were refused before anything started: each names the flag and what
//! would work instead.

use std::time::Duration;

use super::{MAX_CAPACITY, MAX_CONNS, MAX_FRAME_LIMIT, MAX_MAP_SHARDS, MAX_THREADS, MIN_MAX_FRAME};

/// A flag, or a combination of flags, that cannot work.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[allow(missing_docs)] // the messages say it
pub enum FlagError {
    #[error("{0}")]
    Size(#[from] kvshared::cli::SizeError),
    #[error(
        "--no-slots with --shard {shard}: an added group comes after the groups it joins (its index is at least 1)"
    )]
    NoSlotsOnFirstGroup { shard: String },
    #[error("--max-frame {0} is too small: a request frame needs at least {MIN_MAX_FRAME} bytes")]
    FrameTooSmall(u64),
    #[error("--max-frame {0} is too large: at most {MAX_FRAME_LIMIT} bytes (1gib)")]
    FrameTooLarge(u64),
    #[error("--max-buffer-memory {buffers} is smaller than --max-frame {frame}: a largest frame could never be read")]
    BuffersBelowFrame { buffers: u64, frame: u32 },
    #[error(
        "--data-dir keeps every acknowledged write, so it cannot evict: add --eviction none (writes past --max-memory are then refused)"
    )]
    DurableEviction,
    #[error("--nodes lists {listed} nodes but --shard {shard} says the cluster has {count}")]
    NodesCount { listed: usize, shard: String, count: u32 },
    #[error("--group must list this node's own --listen address {0} (as written there)")]
    GroupWithoutSelf(String),
    #[error("--group lists {0} twice")]
    GroupTwice(String),
    #[error("{flag} {value:?} is too long: at most 30d")]
    TimeoutTooLong { flag: &'static str, value: Duration },
    #[error("{0} must be more than 0")]
    TimeoutZero(&'static str),
    #[error("--max-conns must be between 1 and {MAX_CONNS}")]
    Conns,
    #[error("--max-memory {0} bytes is too small to hold anything: at least 1mib (sizes like 100mb, 2gb)")]
    MemoryTooSmall(u64),
    #[error("--threads must be between 1 and {MAX_THREADS}")]
    Threads,
    #[error("--map-shards must be between 1 and {MAX_MAP_SHARDS}")]
    MapShards,
    #[error("--capacity {0} is more keys than one node can index (at most {MAX_CAPACITY})")]
    CapacityTooLarge(usize),
    #[error(
        "--capacity {capacity} preallocates a {index_gib:.2} GiB index, more than --max-memory ({cap_gib:.2} GiB): lower --capacity or raise --max-memory"
    )]
    CapacityOverCap {
        capacity: usize,
        index_gib: f64,
        cap_gib: f64,
    },
    #[error(
        "--capacity {capacity} preallocates a {index_gib:.2} GiB index, more than half of this machine's {host_gib:.2} GiB of memory: lower --capacity (or give --max-memory to say how much this node may use)"
    )]
    CapacityOverHost {
        capacity: usize,
        index_gib: f64,
        host_gib: f64,
    },
    #[error("{text}: {source}")]
    Duration {
        text: String,
        source: humantime::DurationError,
    },
    #[error("{0}: a window is 100ms to 10m")]
    Window(String),
    #[error("{text} is not a time to live: give 1ms to {max}ms")]
    Ttl { text: String, max: u64 },
}
