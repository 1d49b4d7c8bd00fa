//! The `kvd` command line: serve a shard, or talk to a running cluster.

use clap::{Args, Parser, Subcommand};
use kvshared::cli::{AuthArgs, parse_size};

mod flag_error;
pub use flag_error::FlagError;

use crate::durable::SnapshotEvery;
use crate::durable::log::FsyncPolicy;
use crate::store::Eviction;
use kvshared::cli::NodesArgs;
use kvshared::client::DEFAULT_NODE;
use kvshared::frame::MAX_FRAME_LIMIT;
use kvshared::routing::ShardId;

#[derive(Parser, Debug)]
#[command(
    name = "kvd",
    version,
    about = "Sharded in-memory key-value server, and client verbs to use it",
    long_about = "Sharded in-memory key-value server.\n\n\
        Without a subcommand, kvd serves shard I of an N-node cluster: start one kvd per node with\n\
        --shard 0/N ... --shard N-1/N, and give clients the nodes in that same order.\n\n\
        The subcommands are a small client for people and scripts.\n\n\
        Exit status: 0 success; 1 `get` found no such key, `stats` could not reach every node,\n\
        `admin move-slots` found nothing to move, or `admin restart-check` says not now;\n\
        2 any other error (a one-line reason on stderr). The server exits 0 after a clean\n\
        shutdown (SIGINT/SIGTERM) and 2 when it cannot start.",
    after_help = "Examples:\n  \
        kvd --shard 0/2 --listen 127.0.0.1:7070 &\n  \
        kvd --shard 1/2 --listen 127.0.0.1:7071 &\n  \
        export KV_NODES=127.0.0.1:7070,127.0.0.1:7071\n  \
        kvd put user:1 alice && kvd get user:1 && kvd stats\n\n\
        Logs go to stderr; RUST_LOG=debug shows more.",
    args_conflicts_with_subcommands = true
)]
pub struct Cli {
    #[command(flatten)]
    pub serve: ServeArgs,
    #[command(subcommand)]
    pub command: Option<Command>,
}

/// `--max-frame`: a size as every size flag takes it (`64mib`, `1gib`, bytes), within a u32
/// (its upper bound, 1 GiB, is checked with the other settings).
fn parse_frame_size(s: &str) -> Result<u32, FlagError> {
    let bytes = parse_size(s)?;
    u32::try_from(bytes).map_err(|_| FlagError::FrameTooLarge(bytes))
}

/// Smallest `--max-frame` that still fits a useful batch.
pub const MIN_MAX_FRAME: u32 = 1024;
/// Most keys `--capacity` may ask to preallocate for.
pub const MAX_CAPACITY: usize = 1 << 32;
/// Most worker threads.
pub const MAX_THREADS: usize = 1024;
/// Most internal map shards.
pub const MAX_MAP_SHARDS: usize = 1 << 20;
/// Most connections `--max-conns` may allow (each is a file descriptor and buffers).
pub const MAX_CONNS: usize = 1_000_000;
/// Longest `--idle-timeout`, `--read-timeout` or `--write-timeout` (a deadline past it would
/// overflow the clock's arithmetic, and means "never" anyway).
pub const MAX_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(30 * 86_400);
/// Smallest `--max-memory`: below it the store's own index does not fit.
pub const MIN_MAX_MEMORY: u64 = 1 << 20;
/// Share of the machine's memory `--capacity` may preallocate when no `--max-memory` says
/// otherwise.
pub const CAPACITY_SHARE_OF_HOST: f64 = 0.5;

#[derive(Args, Debug, Clone)]
pub struct ServeArgs {
    /// Which shard this node serves, as I/N (node I of N, counting from 0).
    #[arg(long, default_value = "0/1", value_name = "I/N")]
    pub shard: ShardId,
    /// Start owning no hash slot: a shard group being added to a running cluster, which
    /// `kvd admin add-shard` then gives slots (docs/CLUSTER.md). With --data-dir the choice
    /// is kept in the directory, and a restart must make the same one.
    #[arg(long)]
    pub no_slots: bool,
    /// Address to listen on (port 0 picks a free port; the ready line shows it).
    #[arg(long, default_value = DEFAULT_NODE, value_name = "ADDR")]
    pub listen: String,
    /// Tokio worker threads [default: the number of CPUs].
    #[arg(long)]
    pub threads: Option<usize>,
    /// Most client connections served at once, over every front (binary, RESP, HTTP); one
    /// more is told "max connections reached" and closed. Lowered, with a warning, to what
    /// the open-file limit (ulimit -n) allows.
    #[arg(long, default_value_t = 1024)]
    pub max_conns: usize,
    /// Close a connection that sends no request for this long (0 = never; at most 30d). A
    /// connection with a request in flight is not idle.
    #[arg(long, default_value = "300s", value_parser = humantime::parse_duration, value_name = "DURATION")]
    pub idle_timeout: std::time::Duration,
    /// A request that has begun must arrive whole within this long, or the connection is
    /// closed (a client trickling bytes holds no buffer), on every front; an HTTP
    /// connection's next request headers too (so an idle keep-alive connection is closed
    /// after this long). At most 30d.
    #[arg(long, default_value = "10s", value_parser = humantime::parse_duration, value_name = "DURATION")]
    pub read_timeout: std::time::Duration,
    /// A client that reads none of its replies for this long is disconnected (one that
    /// pipelines requests and never reads would otherwise hold its connection and buffers
    /// for ever), on every front. At most 30d.
    #[arg(long, default_value = "10s", value_parser = humantime::parse_duration, value_name = "DURATION")]
    pub write_timeout: std::time::Duration,
    /// Largest frame body (at most 1gib; sizes like 16mib or a number of bytes). A request
    /// with a larger length prefix is refused unread; a reply is kept within it (values past
    /// it are answered `TooLarge`).
    #[arg(long, default_value = "64mib", value_parser = parse_frame_size, value_name = "SIZE")]
    pub max_frame: u32,
    /// Bytes all connections together may hold in buffers beyond 256 KiB each (large
    /// request bodies, large replies): past it, a large frame waits for room up to 1 s (less
    /// if --read-timeout is shorter) and is then refused with a reason. Sizes like 512mb,
    /// 2gb, 1gib.
    #[arg(long, default_value = "1gib", value_parser = parse_size, value_name = "SIZE")]
    pub max_buffer_memory: u64,
    #[command(flatten)]
    pub auth: AuthArgs,
    /// Serve clients on other hosts without a token. Without a token and without this flag,
    /// a kvd bound beyond loopback serves only loopback clients (protected mode).
    #[arg(long)]
    pub insecure_no_auth: bool,
    /// Serve TLS only, with this certificate chain (PEM); needs --tls-key. Clients then
    /// connect with --tls-ca naming the CA (or this certificate, if self-signed).
    #[arg(long, value_name = "FILE", requires = "tls_key")]
    pub tls_cert: Option<std::path::PathBuf>,
    /// The private key of --tls-cert (PEM).
    #[arg(long, value_name = "FILE", requires = "tls_cert")]
    pub tls_key: Option<std::path::PathBuf>,
    /// Keep the shard durable in DIR: every batch with writes goes through the shard's log
    /// (an openraft log) before it is answered, and a restart loads the newest snapshot and
    /// replays the log after it. Without it, the shard lives in memory only and a restart
    /// loses every key.
    #[arg(long, value_name = "DIR")]
    pub data_dir: Option<std::path::PathBuf>,
    /// When an answered write is durable: always (fsync before answering, many writes per
    /// fsync; survives kill -9 and power loss), 1s (fsync every second; survives kill -9,
    /// a power loss may take the last second), never (the OS decides; survives kill -9).
    #[arg(long, value_enum, default_value = "always", requires = "data_dir")]
    pub fsync: FsyncPolicy,
    /// Write a snapshot of the store (and drop the log before the previous one) when the log
    /// has grown by this much since the last: a size (64mib, 1gb; and at least the last
    /// snapshot's size, so snapshots never write more than the log) or a number of entries
    /// (100000entries). Smaller: faster restarts, more snapshot writing.
    #[arg(long, value_name = "SIZE|Nentries", default_value = crate::durable::DEFAULT_SNAPSHOT_EVERY, requires = "data_dir")]
    pub snapshot_every: SnapshotEvery,
    /// Make this shard a replica group: every member's --listen address (this node's among
    /// them), the same list on every member. The group's leader serves the shard; the
    /// others say who leads; a write is answered once a majority has it. A new member waits,
    /// blank, until `kvd admin init-group` starts the group (once, for all its members); a
    /// restart rejoins it (with the membership its log holds, whatever --group says then); a
    /// member never starts a group by itself. Clients list a group's members separated by
    /// `|` in --nodes.
    #[arg(long, value_delimiter = ',', value_name = "ADDR,ADDR,...", requires = "data_dir")]
    pub group: Vec<String>,
    /// Start as a new, empty member of a replica group that exists: it serves nothing until
    /// `kvd admin add-replica` adds it (it then catches up from the leader and votes). A
    /// restart rejoins with the membership its log holds. (A member whose data directory was
    /// lost comes back this way too: see docs/REPLICATION.md.)
    #[arg(long, requires = "data_dir", conflicts_with = "group")]
    pub join: bool,
    /// Cap on the memory the stored data takes (keys, values and their overhead, as
    /// accounted: see the README), e.g. 100mb, 2gb [default: unlimited].
    #[arg(long, value_parser = parse_size, value_name = "SIZE")]
    pub max_memory: Option<u64>,
    /// What a write does at --max-memory: evict the least recently used of a sample (lru),
    /// evict at random (random), or be refused (none; reads and deletes go on); or evict
    /// only keys with a time to live: the least recently used (volatile-lru), the nearest
    /// deadline (volatile-ttl), at random (volatile-random). Redis's names allkeys-lru,
    /// allkeys-random and noeviction are taken too.
    #[arg(long, value_enum, default_value = "lru", requires = "max_memory")]
    pub eviction: Eviction,
    /// Internal map shards, each with its own lock (rounded up to a power of two)
    /// [default: 8 x threads, at least 16: few enough that a small batch takes few locks,
    /// enough that two threads seldom want the same one].
    #[arg(long)]
    pub map_shards: Option<usize>,
    /// Keys to preallocate room for, so loading does not stall on rehashing.
    #[arg(long, default_value_t = 0)]
    pub capacity: usize,
    /// Also speak the Redis protocol (RESP2) on this address, e.g. 127.0.0.1:6379, for
    /// redis-cli, redis-benchmark and every Redis client library [default: off].
    #[arg(long, value_name = "ADDR")]
    pub resp: Option<String>,
    /// Make the RESP port a Redis Cluster node, for cluster-aware clients (redis-py
    /// RedisCluster, go-redis ClusterClient, `redis-cli -c`, memtier --cluster-mode): a
    /// command for another shard's keys is answered `-MOVED slot host:port` instead of being
    /// forwarded, and SCAN, KEYS, DBSIZE and FLUSHALL cover this node alone. Give every node
    /// --nodes. (CLUSTER SLOTS and the other CLUSTER commands answer either way.)
    #[arg(long, requires = "resp")]
    pub resp_cluster: bool,
    /// Also serve HTTP on this address: GET /metrics (Prometheus), GET /stats (JSON),
    /// GET|PUT|DELETE /kv/{key}, GET /healthz [default: off].
    #[arg(long, value_name = "ADDR")]
    pub http: Option<String>,
    /// The cluster's nodes in shard order (this one among them): with it, a key of another
    /// shard sent over RESP is forwarded to its owner, so a plain Redis client pointed at any
    /// one node reaches every key (an extra hop; the same for HTTP /kv). Without it such keys
    /// are answered with an error naming the owner.
    #[arg(long, value_name = "ADDR,ADDR,...", value_delimiter = ',')]
    pub nodes: Vec<String>,
}

impl ServeArgs {
    /// Refuses settings that cannot work, before anything starts, with a reason that names
    /// the flag (a zero frame limit would refuse every request; a huge capacity would abort
    /// on allocation).
    pub fn validate(&self) -> Result<(), FlagError> {
        if self.no_slots && self.shard.index == 0 {
            return Err(FlagError::NoSlotsOnFirstGroup {
                shard: self.shard.to_string(),
            });
        }
        if self.max_frame < MIN_MAX_FRAME {
            return Err(FlagError::FrameTooSmall(self.max_frame.into()));
        }
        if self.max_frame > MAX_FRAME_LIMIT {
            return Err(FlagError::FrameTooLarge(self.max_frame.into()));
        }
        if self.max_buffer_memory < u64::from(self.max_frame) {
            return Err(FlagError::BuffersBelowFrame {
                buffers: self.max_buffer_memory,
                frame: self.max_frame,
            });
        }
        if self.data_dir.is_some() && self.max_memory.is_some() && self.eviction != Eviction::None {
            return Err(FlagError::DurableEviction);
        }
        if !self.nodes.is_empty() && self.nodes.len() != self.shard.count as usize {
            return Err(FlagError::NodesCount {
                listed: self.nodes.len(),
                shard: self.shard.to_string(),
                count: self.shard.count,
            });
        }
        if !self.group.is_empty() {
            if !self.group.contains(&self.listen) {
                return Err(FlagError::GroupWithoutSelf(self.listen.clone()));
            }
            for (i, m) in self.group.iter().enumerate() {
                if self.group[..i].contains(m) {
                    return Err(FlagError::GroupTwice(m.clone()));
                }
            }
        }
        self.validate_limits()?;
        if self.threads.is_some_and(|t| t == 0 || t > MAX_THREADS) {
            return Err(FlagError::Threads);
        }
        if self.map_shards.is_some_and(|s| s == 0 || s > MAX_MAP_SHARDS) {
            return Err(FlagError::MapShards);
        }
        if self.capacity > MAX_CAPACITY {
            return Err(FlagError::CapacityTooLarge(self.capacity));
        }
        Ok(())
    }

    /// The connection limits and deadlines, and the memory cap.
    fn validate_limits(&self) -> Result<(), FlagError> {
        for (flag, value) in [
            ("--idle-timeout", self.idle_timeout),
            ("--read-timeout", self.read_timeout),
            ("--write-timeout", self.write_timeout),
        ] {
            if value > MAX_TIMEOUT {
                return Err(FlagError::TimeoutTooLong { flag, value });
            }
            if value.is_zero() && flag != "--idle-timeout" {
                return Err(FlagError::TimeoutZero(flag));
            }
        }
        if !(1..=MAX_CONNS).contains(&self.max_conns) {
            return Err(FlagError::Conns);
        }
        if let Some(max) = self.max_memory
            && max < MIN_MAX_MEMORY
        {
            return Err(FlagError::MemoryTooSmall(max));
        }
        Ok(())
    }

    /// Refuses a `--capacity` whose index, over `map_shards`, would not fit this machine (see
    /// [`ServeArgs::check_capacity`]), before anything is allocated.
    pub fn capacity_fits(&self, map_shards: usize) -> Result<(), FlagError> {
        if self.capacity == 0 {
            return Ok(());
        }
        let index = crate::store::Store::preallocated_bytes(map_shards, self.capacity);
        let host = sysinfo::System::new().map_or(0, |mut system| {
            system.refresh_memory();
            system.total_memory()
        });
        self.check_capacity(index, host)
    }

    /// Refuses a `--capacity` whose preallocated index (`index_bytes`) would not fit: in
    /// `--max-memory` if given, else in half of the machine's memory (`host_bytes`; 0 when
    /// unknown, which checks nothing).
    pub fn check_capacity(&self, index_bytes: usize, host_bytes: u64) -> Result<(), FlagError> {
        let gib = |b: f64| b / f64::from(1u32 << 30);
        let index = index_bytes as f64;
        if let Some(max) = self.max_memory {
            if index > max as f64 {
                return Err(FlagError::CapacityOverCap {
                    capacity: self.capacity,
                    index_gib: gib(index),
                    cap_gib: gib(max as f64),
                });
            }
            return Ok(());
        }
        if host_bytes > 0 && index > host_bytes as f64 * CAPACITY_SHARE_OF_HOST {
            return Err(FlagError::CapacityOverHost {
                capacity: self.capacity,
                index_gib: gib(index),
                host_gib: gib(host_bytes as f64),
            });
        }
        Ok(())
    }
}

/// The client verbs.
#[derive(Subcommand, Debug)]
pub enum Command {
    /// Print the value of KEY (exit 1 if absent): its bytes as stored, followed by a
    /// newline only when stdout is a terminal (as redis-cli).
    Get {
        #[command(flatten)]
        nodes: NodesArgs,
        /// Never add a newline, even on a terminal.
        #[arg(long, conflicts_with = "text")]
        raw: bool,
        /// Print the value as text (invalid UTF-8 shown as U+FFFD) and a newline.
        #[arg(long)]
        text: bool,
        /// The key.
        key: String,
    },
    /// Store VALUE under KEY: the argument's bytes, stdin's with `-`, or a file's with
    /// --file.
    Put {
        #[command(flatten)]
        nodes: NodesArgs,
        /// Read the value from this file instead (bounded by --max-frame).
        #[arg(long, value_name = "FILE", conflicts_with = "value")]
        file: Option<std::path::PathBuf>,
        /// The key expires this long after the node stores it (Redis's SET ... PX); without
        /// it, the key has no time to live (a time to live it had ends, as with SET).
        #[arg(long, value_parser = parse_ttl, value_name = "DURATION")]
        ttl: Option<std::time::Duration>,
        /// The key.
        key: String,
        /// The value; `-` reads it from stdin (bounded by --max-frame).
        #[arg(required_unless_present = "file")]
        value: Option<String>,
    },
    /// Delete KEY (prints whether it existed).
    Del {
        #[command(flatten)]
        nodes: NodesArgs,
        /// The key.
        key: String,
    },
    /// Change settings of every node at run time: the memory cap (as Redis's CONFIG SET
    /// maxmemory), and/or remove every key.
    Config {
        #[command(flatten)]
        nodes: NodesArgs,
        /// The cluster's new --max-memory, split evenly over the nodes; `none` removes it.
        #[arg(long, value_name = "SIZE|none")]
        max_memory: Option<String>,
        /// Remove every key first (asks nothing: this is for benchmarks and tests).
        #[arg(long)]
        flush: bool,
    },
    /// Run the cluster without stopping it: replica groups (init-group, add-replica,
    /// remove-replica, transfer-leader, restart-check) and hash slots (slots, move-slots,
    /// rebalance, add-shard, remove-shard).
    #[command(subcommand)]
    Admin(AdminCommand),
    /// Watch every shard's load and give hot shards read replicas on spare members (learners
    /// that serve linearizable reads), taking them back when the shard cools; with
    /// --move-slots, move a hot group's slots to idle groups instead.
    Manager(ManagerArgs),
    /// Show each node's statistics (exit 1 if a node does not answer).
    Stats {
        #[command(flatten)]
        nodes: NodesArgs,
        /// Print JSON (one object per node) instead of a table.
        #[arg(long)]
        json: bool,
    },
}

/// `kvd admin`: membership changes of a replica group. Each is sent to the group's leader,
/// which carries it out through the group's log (openraft's joint consensus), and waits
/// until it is done.
#[derive(Subcommand, Debug)]
pub enum AdminCommand {
    /// Add ADDR (a kvd started with --join, or a former member restarted empty) to the
    /// group: it catches up from the leader as a learner, then becomes a voter.
    AddReplica {
        #[command(flatten)]
        group: GroupArgs,
        /// Stay a learner: catch up and follow the log, but do not vote.
        #[arg(long)]
        learner: bool,
        /// The new member's address (its --listen).
        addr: String,
    },
    /// Remove ADDR from the group (a voter or a learner). Removing the leader moves the
    /// leadership to another member first.
    RemoveReplica {
        #[command(flatten)]
        group: GroupArgs,
        /// The member to remove.
        addr: String,
    },
    /// Make ADDR the group's leader (it must be a voter). The shard's requests pause for
    /// about a second while the leadership moves.
    TransferLeader {
        #[command(flatten)]
        group: GroupArgs,
        /// The member to lead.
        addr: String,
    },
    /// Whether ADDR may be stopped now (for a restart or an upgrade, member by member): exits
    /// 0 when ADDR is not the group's leader, answers and has applied everything the leader
    /// had committed, and the group keeps a caught-up majority of voters without it; 1 with
    /// the reason otherwise. With --wait, waits up to --timeout (give it a minute or more;
    /// each member is asked for at most 2 s) until that holds: after a restart, until ADDR
    /// has caught up again. See docs/UPGRADING.md.
    RestartCheck {
        #[command(flatten)]
        group: GroupArgs,
        /// Wait (up to --timeout) until ADDR may be stopped instead of answering now.
        #[arg(long)]
        wait: bool,
        /// The member to stop.
        addr: String,
    },
    /// Start new replica groups, once: each entry of --nodes (`A|B|C`) is one shard's group,
    /// whose members must be running (kvd --group A,B,C --data-dir DIR) and in no group yet.
    /// Each member writes the new group's id into its data directory; from then on it takes
    /// part only in that group. A member never starts a group by itself (so a member whose
    /// disk was wiped cannot form a second group): see docs/REPLICATION.md.
    InitGroup {
        #[command(flatten)]
        nodes: NodesArgs,
    },
    /// Move hash slots from shard group --from to shard group --to while both serve: a chunk
    /// at a time, its writes paused while its keys are copied (reads go on), then handed
    /// over through both groups' logs. Only the slots in a move from --from to --to are
    /// moved; the others are named and left out. Run it again to finish a move that was
    /// interrupted (exit 1 when nothing is left to move).
    /// See docs/CLUSTER.md.
    MoveSlots {
        #[command(flatten)]
        nodes: NodesArgs,
        /// The group that gives the slots (its index in --nodes).
        #[arg(long)]
        from: usize,
        /// The group that takes them.
        #[arg(long)]
        to: usize,
        /// Slots per hand-over (each pauses its slots' writes while their keys are copied).
        #[arg(long, default_value_t = 256, value_parser = clap::value_parser!(u16).range(1..=16384))]
        chunk: u16,
        /// The slots, as `0-99,200,300-310`.
        slots: String,
    },
    /// Move slots until every group of --nodes holds an even share (see move-slots).
    Rebalance {
        #[command(flatten)]
        nodes: NodesArgs,
        /// What to even out: `slots` (each group an even share of the slot count) or `load`
        /// (each group's sampled ops over --window: hot slots move from the busiest groups to
        /// the idlest, at most 64 slots a run).
        #[arg(long, value_enum, default_value = "slots")]
        by: RebalanceBy,
        /// With --by load: how long to measure the load before planning.
        #[arg(long, default_value = "5s", value_parser = parse_window, value_name = "DURATION")]
        window: std::time::Duration,
        /// Slots per hand-over.
        #[arg(long, default_value_t = 256, value_parser = clap::value_parser!(u16).range(1..=16384))]
        chunk: u16,
    },
    /// Give a new shard group slots: --group (default: the last of --nodes), started with
    /// `kvd --shard I/N --no-slots`, learns the cluster's slot map, then the slots are spread
    /// evenly over every group.
    AddShard {
        #[command(flatten)]
        nodes: NodesArgs,
        /// The new group's index in --nodes [default: the last].
        #[arg(long)]
        group: Option<usize>,
        /// Slots per hand-over.
        #[arg(long, default_value_t = 256, value_parser = clap::value_parser!(u16).range(1..=16384))]
        chunk: u16,
    },
    /// Spread every slot of --group over the other groups, so that its members may be stopped.
    RemoveShard {
        #[command(flatten)]
        nodes: NodesArgs,
        /// The group to empty (its index in --nodes).
        #[arg(long)]
        group: usize,
        /// Slots per hand-over.
        #[arg(long, default_value_t = 256, value_parser = clap::value_parser!(u16).range(1..=16384))]
        chunk: u16,
    },
    /// Print each group's slots: owned, frozen (being handed over), importing, and its epoch.
    Slots {
        #[command(flatten)]
        nodes: NodesArgs,
    },
}

/// `kvd manager`: when a shard gets a replica, and when it gives it back.
#[derive(Args, Debug)]
pub struct ManagerArgs {
    /// The shards' groups, in shard order, as for every client (`A|B,C|D`); one member per
    /// group is enough to find the rest.
    #[command(flatten)]
    pub nodes: NodesArgs,
    /// Spare members: each a kvd started with `--shard I/N --join --data-dir DIR` (a spare
    /// machine runs one per shard it may help). The manager adds a spare of a hot shard as a
    /// learner and removes it when the shard cools. Not needed with --move-slots.
    #[arg(long, value_delimiter = ',', value_name = "ADDR,...")]
    pub spare: Vec<String>,
    /// Most members (voters and learners) a shard may have.
    #[arg(long, default_value_t = 5)]
    pub max_replicas: usize,
    /// Move slots instead of (or as well as) adding replicas: when one group serves at
    /// least --spread-above times the mean load for --up-after intervals, its busiest slots
    /// go to the idlest groups (as `kvd admin move-slots` moves them). --nodes lists every
    /// group, spare groups (started with --no-slots) included.
    #[arg(long)]
    pub move_slots: bool,
    /// With --move-slots: how many times the mean load the busiest group must serve.
    #[arg(long, default_value_t = 2.0, value_name = "RATIO")]
    pub spread_above: f64,
    /// With --move-slots: a smaller imbalance is evened too when it lasts: the busiest group
    /// serving this many times the mean load over --balance-after intervals (and in the
    /// last) gives its excess to the groups under the mean, planned on those intervals'
    /// load together.
    #[arg(long, default_value_t = 1.25, value_name = "RATIO")]
    pub balance_above: f64,
    /// With --move-slots: intervals a smaller imbalance must last (0: never even one out).
    #[arg(long, default_value_t = 8, value_name = "N")]
    pub balance_after: u32,
    /// With --move-slots: slots per hand-over (each pauses its slots' writes briefly).
    #[arg(long, default_value_t = 256, value_parser = clap::value_parser!(u16).range(1..=16384))]
    pub chunk: u16,
    /// How often the manager reads every member's load.
    #[arg(long, default_value = "1s", value_parser = humantime::parse_duration, value_name = "DURATION")]
    pub interval: std::time::Duration,
    /// A shard is hot when its reads per second per serving member reach this...
    #[arg(long, default_value_t = 100_000.0, value_name = "READS_PER_SEC")]
    pub hot_reads: f64,
    /// ...or when a member's read p99 (kvd's own service time) reaches this while the shard
    /// serves at least --cold-reads per member (a slow member with little to do waits on
    /// something another replica would not fix).
    #[arg(long, default_value = "50ms", value_parser = humantime::parse_duration, value_name = "DURATION")]
    pub hot_p99: std::time::Duration,
    /// A shard with an added replica is cold when, with one member fewer, it would serve
    /// fewer reads per second per member than this [default: a quarter of --hot-reads].
    #[arg(long, value_name = "READS_PER_SEC")]
    pub cold_reads: Option<f64>,
    /// Intervals in a row a shard must be hot before a replica is added.
    #[arg(long, default_value_t = 3, value_name = "N")]
    pub up_after: u32,
    /// Intervals in a row a shard must be cold before an added replica is removed.
    #[arg(long, default_value_t = 5, value_name = "N")]
    pub down_after: u32,
    /// Intervals after a change of a shard during which it is left alone (so that the
    /// change's effect shows before the next is judged).
    #[arg(long, default_value_t = 2, value_name = "N")]
    pub settle: u32,
    /// Stop after this long [default: run until Ctrl-C].
    #[arg(long, value_parser = humantime::parse_duration, value_name = "DURATION")]
    pub duration: Option<std::time::Duration>,
    /// Print each decision as a JSON object (one per line) instead of text.
    #[arg(long)]
    pub json: bool,
}

/// Which replica group an admin command is for.
#[derive(Args, Debug)]
pub struct GroupArgs {
    #[command(flatten)]
    pub nodes: NodesArgs,
    /// The shard whose group to change, when --nodes lists several [default: the one that
    /// lists ADDR, or the only one].
    #[arg(long, value_name = "I")]
    pub shard: Option<usize>,
}

/// What `kvd admin rebalance` evens out.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum RebalanceBy {
    /// Slot counts.
    Slots,
    /// Sampled ops per group.
    Load,
}

/// A `--window`: 100 ms to 10 minutes.
fn parse_window(text: &str) -> Result<std::time::Duration, FlagError> {
    let d = parse_duration(text)?;
    if !(std::time::Duration::from_millis(100)..=std::time::Duration::from_secs(600)).contains(&d) {
        return Err(FlagError::Window(text.to_string()));
    }
    Ok(d)
}

/// A `--ttl`: a duration of at least a millisecond and at most [`kvshared::expiry::MAX_TTL_MS`].
fn parse_ttl(text: &str) -> Result<std::time::Duration, FlagError> {
    let d = parse_duration(text)?;
    if d.as_millis() == 0 || d.as_millis() > u128::from(kvshared::expiry::MAX_TTL_MS) {
        return Err(FlagError::Ttl {
            text: text.to_string(),
            max: kvshared::expiry::MAX_TTL_MS,
        });
    }
    Ok(d)
}

fn parse_duration(text: &str) -> Result<std::time::Duration, FlagError> {
    humantime::parse_duration(text).map_err(|source| FlagError::Duration {
        text: text.to_string(),
        source,
    })
}

#[cfg(test)]
mod tests {
    /// `--max-frame`'s default is the protocol's default frame limit, and it takes sizes.
    #[test]
    fn max_frame_takes_sizes_and_defaults_to_the_protocols_limit() {
        assert_eq!(super::parse_frame_size("64mib"), Ok(kvshared::frame::DEFAULT_MAX_FRAME));
        assert_eq!(super::parse_frame_size("1gib"), Ok(1 << 30));
        assert_eq!(super::parse_frame_size("4096"), Ok(4096));
        assert!(matches!(
            super::parse_frame_size("8gib"),
            Err(super::FlagError::FrameTooLarge(8_589_934_592))
        ));
    }
}
