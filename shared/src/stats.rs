//! Per-node statistics: what kvd reports over the protocol, and how readers turn two
//! samples into rates.
//!
//! kvd serves only monotonic totals and timestamps; every rate (op/s, bytes/s, CPU) is
//! computed by the reader, here, from two samples. Three readers use it (kvtui, `kvd stats`
//! and kvbench's server figures), so there is exactly one place where a restart, a sample
//! that kvd has not refreshed yet, or a counter going backwards is handled.
//!
//! The node's counters are declared once, in the `counters!` list below: that list makes
//! the [`Counter`] index used by kvd's striped atomics, the [`Counts`] struct that travels in
//! [`NodeStats`] (rkyv and JSON), and every counter's name, class and doc text. Adding a
//! counter is one line there plus the code that increments it.

use rkyv::{Archive, Deserialize as RkyvDeserialize, Serialize as RkyvSerialize};
use serde::{Deserialize, Serialize};

use crate::latency::LatencyStats;
use crate::routing::ShardId;

/// What a counter counts, for grouping in displays and in the Prometheus exposition.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CounterClass {
    /// Operations served and their outcomes.
    Ops,
    /// Bytes and batches on kvd's own sockets.
    Traffic,
    /// Connections accepted and closed.
    Connections,
    /// Something a client did wrong, or a connection that failed.
    Error,
}

macro_rules! counters {
    ($( $field:ident / $variant:ident : $class:ident, $help:literal; )*) => {
        /// Every counter a node keeps, as an index (kvd's striped atomics are arrays of these).
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
        #[repr(usize)]
        pub enum Counter {
            $(
                #[doc = $help]
                $variant,
            )*
        }

        impl Counter {
            /// Every counter, in declaration order.
            pub const ALL: &'static [Counter] = &[$(Counter::$variant),*];
            /// How many counters there are.
            pub const COUNT: usize = Counter::ALL.len();

            /// The counter's name in JSON and metrics (`gets`, `wrong_shard`).
            pub fn name(self) -> &'static str {
                match self {
                    $(Counter::$variant => stringify!($field),)*
                }
            }

            /// One line saying what the counter counts (the metrics' HELP text).
            pub fn help(self) -> &'static str {
                match self {
                    $(Counter::$variant => $help,)*
                }
            }

            /// What kind of figure this is.
            pub fn class(self) -> CounterClass {
                match self {
                    $(Counter::$variant => CounterClass::$class,)*
                }
            }
        }

        /// A value for every counter: a node's totals since it started, or what one batch or
        /// one connection added since it last published.
        #[derive(Archive, RkyvSerialize, RkyvDeserialize, Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq)]
        pub struct Counts {
            $(
                #[doc = $help]
                #[serde(default)]
                pub $field: u64,
            )*
        }

        impl Counts {
            /// The value of counter `c`.
            #[inline]
            pub fn get(&self, c: Counter) -> u64 {
                match c {
                    $(Counter::$variant => self.$field,)*
                }
            }

            /// The value of counter `c`, to change.
            #[inline]
            pub fn get_mut(&mut self, c: Counter) -> &mut u64 {
                match c {
                    $(Counter::$variant => &mut self.$field,)*
                }
            }
        }
    };
}

counters! {
    gets / Gets : Ops, "Get ops served.";
    puts / Puts : Ops, "Put ops served.";
    deletes / Deletes : Ops, "Delete ops served.";
    hits / Hits : Ops, "Gets that found their key.";
    misses / Misses : Ops, "Gets that found no value.";
    evicted / Evicted : Ops, "Keys evicted to stay within --max-memory.";
    expired / Expired : Ops, "Keys removed because their time to live ran out (by a write that found them past their deadline, by the active expiry cycle, or by a leader's logged expiry).";
    expire_cycle_microseconds / ExpireCycleMicroseconds : Ops, "Microseconds the active expiry cycle has run (its share of a core: the rate of this counter over one million).";
    applied / Applied : Ops, "Ops applied from the log (a durable node's logged ops; on a replica group's followers, the leader's writes they replay, which they did not serve).";
    batches / Batches : Traffic, "Batch requests executed.";
    bytes_in / BytesIn : Traffic, "Bytes read from client sockets (frames, headers included).";
    bytes_out / BytesOut : Traffic, "Bytes written to client sockets.";
    conns_opened / ConnsOpened : Connections, "Client connections accepted.";
    conns_closed / ConnsClosed : Connections, "Client connections that ended.";
    conns_refused / ConnsRefused : Connections, "Connections refused at once because --max-conns were open.";
    conns_idle_closed / ConnsIdleClosed : Connections, "Connections closed after --idle-timeout without a request.";
    wrong_shard / WrongShard : Error, "Ops for keys of slots this node does not serve (answered Moved, naming the owner).";
    keys_loaded / KeysLoaded : Ops, "Keys copied in by slot moves (Load ops from kvd admin move-slots, add-shard, rebalance), also counted in puts.";
    slots_in / SlotsIn : Ops, "Slots whose hand-over to this node's group ended here (importing -> owned), as applied by this node.";
    slots_out / SlotsOut : Ops, "Slots this node's group handed over (frozen -> gone), as applied by this node.";
    try_again / TryAgain : Error, "Ops refused while their slot was being handed over between shard groups (answered TryAgain; clients send them again).";
    moved / Moved : Traffic, "RESP commands answered -MOVED to the node that serves their slot (a node started with --resp-cluster): a cluster client's slot map was out of date, or the client is not cluster-aware.";
    malformed_op / MalformedOp : Error, "Ops with bad key or value spans.";
    malformed_body / MalformedBody : Error, "Frame bodies that failed validation.";
    bad_frame / BadFrame : Error, "Frames with a bad magic, unknown kind or other protocol version.";
    frame_too_large / FrameTooLarge : Error, "Length prefixes over the frame limit.";
    io / Io : Error, "Connections that ended in the middle of a frame or with an I/O error.";
    reply_too_large / ReplyTooLarge : Error, "Found values left out of a reply that reached the frame limit (answered TooLarge).";
    out_of_memory / OutOfMemory : Error, "Ops refused for lack of memory (a write at --max-memory with nothing to evict, or an allocation that failed).";
    auth_failed / AuthFailed : Error, "Requests refused for a wrong token, or for want of one, on every front together.";
    auth_failed_resp / AuthFailedResp : Error, "The RESP front's share of auth_failed (AUTH or HELLO with a wrong token, or a command before it).";
    auth_failed_http / AuthFailedHttp : Error, "The HTTP front's share of auth_failed (a request without the right Authorization: Bearer token).";
    conns_read_timeout / ConnsReadTimeout : Error, "Connections closed because a request that had begun did not arrive whole within --read-timeout.";
    conns_write_timeout / ConnsWriteTimeout : Error, "Connections closed because the peer read none of its replies for --write-timeout.";
    wrong_protocol / WrongProtocol : Error, "Connections that spoke another front's protocol (or plaintext to a TLS port), told the right port and closed.";
    protected_refused / ProtectedRefused : Connections, "Non-loopback connections refused in protected mode (no token, no --insecure-no-auth).";
    log_suppressed / LogSuppressed : Error, "Warnings caused by peers that were counted but not logged (rate limits).";
    log_lines_dropped / LogLinesDropped : Error, "Log lines dropped because stderr could not keep up (the log never blocks serving).";
    buffer_budget_closed / BufferBudgetClosed : Error, "Connections closed because --max-buffer-memory had no room for their frame within --read-timeout.";
}

impl Counts {
    /// Ops served (get + put + delete).
    pub fn ops(&self) -> u64 {
        self.gets + self.puts + self.deletes
    }

    /// Every error counter summed.
    pub fn errors(&self) -> u64 {
        self.errors_by_kind().map(|(_, v)| v).sum()
    }

    /// Ops and commands sent elsewhere rather than failed: answered `Moved` (wrong shard,
    /// `-MOVED`) or `TryAgain` (a slot being handed over). Clients follow them; a slot move
    /// makes many.
    pub fn redirects(&self) -> u64 {
        self.wrong_shard + self.try_again + self.moved
    }

    /// The error counters without the redirects among them (`wrong_shard`, `try_again`):
    /// what went wrong.
    pub fn failures(&self) -> u64 {
        self.errors().saturating_sub(self.wrong_shard + self.try_again)
    }

    /// `(name, value)` of each error counter.
    pub fn errors_by_kind(&self) -> impl Iterator<Item = (&'static str, u64)> + '_ {
        Counter::ALL
            .iter()
            .filter(|c| c.class() == CounterClass::Error)
            .map(|&c| (c.name(), self.get(c)))
    }

    /// Connections open now (opened minus closed).
    pub fn connections_open(&self) -> u64 {
        self.conns_opened.saturating_sub(self.conns_closed)
    }

    /// Hits / lookups, `None` without lookups.
    pub fn hit_ratio(&self) -> Option<f64> {
        let lookups = self.hits + self.misses;
        (lookups > 0).then(|| self.hits as f64 / lookups as f64)
    }

    /// `self - before` per counter, saturating at zero.
    pub fn since(&self, before: &Counts) -> Counts {
        let mut d = Counts::default();
        for &c in Counter::ALL {
            *d.get_mut(c) = self.get(c).saturating_sub(before.get(c));
        }
        d
    }
}

/// Byte counters of one host network interface (totals since boot).
#[derive(Archive, RkyvSerialize, RkyvDeserialize, Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq)]
pub struct InterfaceStats {
    /// Interface name (`eth0`, `lo`).
    pub name: String,
    /// Bytes received since boot.
    pub rx_bytes: u64,
    /// Bytes sent since boot.
    pub tx_bytes: u64,
}

/// Process and host figures that kvd samples off the request path, about once a second.
#[derive(Archive, RkyvSerialize, RkyvDeserialize, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
pub struct SystemFigures {
    /// When these figures were sampled, in milliseconds of the node's uptime. Rates of
    /// these figures use this, not the time the reader read them.
    pub system_sampled_ms: u64,
    /// CPU time kvd has used, in milliseconds (user + system); rate it for a CPU %.
    pub process_cpu_ms: u64,
    /// kvd's CPU use over its last sampling period, percent of one core.
    pub process_cpu_percent: f32,
    /// kvd's resident memory.
    pub process_rss_bytes: u64,
    /// Host-wide CPU use over the last sampling period, percent of all cores (0..=100).
    pub host_cpu_percent: f32,
    /// Logical CPUs of the host.
    pub host_cpus: u32,
    /// Host memory in use.
    pub host_mem_used_bytes: u64,
    /// Host memory in total.
    pub host_mem_total_bytes: u64,
    /// The host's name.
    pub host_name: String,
    /// Every network interface of the host, sorted by name.
    pub interfaces: Vec<InterfaceStats>,
    /// The host's CPU time by state since boot (Linux `/proc/stat`); rate it for the
    /// host's split between processes and the kernel's interrupt work.
    #[serde(default)]
    pub host_cpu: HostCpuTime,
}

/// A host's CPU time by state, milliseconds summed over all its CPUs since boot.
#[derive(Archive, RkyvSerialize, RkyvDeserialize, Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq)]
pub struct HostCpuTime {
    /// In processes' user mode (nice included).
    pub user_ms: u64,
    /// In the kernel on behalf of processes (system calls, page faults).
    pub system_ms: u64,
    /// In hard and soft interrupts (network receive and send work lands here), which no
    /// process is charged for.
    pub irq_ms: u64,
    /// Idle, waiting for I/O included.
    pub idle_ms: u64,
    /// Taken by the hypervisor for other guests.
    pub steal_ms: u64,
}

/// A host's CPU use between two samples, percent of one core each (a 2-core host busy
/// everywhere is 200), split as htop's header and bottom's process view would.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq)]
pub struct HostCpuSplit {
    /// Processes: user and system time.
    pub processes_percent: f64,
    /// Hard and soft interrupts (not charged to any process).
    pub irq_percent: f64,
    /// Stolen by the hypervisor.
    pub steal_percent: f64,
    /// Idle.
    pub idle_percent: f64,
}

impl HostCpuSplit {
    /// The split between two samples `secs` apart; `None` without a usable span or when
    /// the host gave no figures.
    pub fn between(before: &HostCpuTime, after: &HostCpuTime, secs: f64) -> Option<HostCpuSplit> {
        if secs <= 0.0 || after.user_ms + after.idle_ms == 0 {
            return None;
        }
        let pct = |a: u64, b: u64| b.saturating_sub(a) as f64 / secs / 10.0;
        Some(HostCpuSplit {
            processes_percent: pct(before.user_ms + before.system_ms, after.user_ms + after.system_ms),
            irq_percent: pct(before.irq_ms, after.irq_ms),
            steal_percent: pct(before.steal_ms, after.steal_ms),
            idle_percent: pct(before.idle_ms, after.idle_ms),
        })
    }
}

impl SystemFigures {
    /// Host NIC totals summed over interfaces other than loopback.
    pub fn host_net_totals(&self) -> (u64, u64) {
        self.interfaces
            .iter()
            .filter(|i| i.name != "lo")
            .fold((0, 0), |(rx, tx), i| (rx + i.rx_bytes, tx + i.tx_bytes))
    }
}

/// A node's durability figures: its log and snapshots (`--data-dir`).
#[derive(Archive, RkyvSerialize, RkyvDeserialize, Serialize, Deserialize, Clone, Debug, PartialEq)]
pub struct Durability {
    /// `memory` (no data dir), or the `--fsync` policy: `always`, `1s`, `never`.
    pub mode: String,
    /// Bytes of log segments on disk (back to the older kept snapshot).
    pub log_bytes: u64,
    /// Log entries since the newest snapshot.
    pub log_entries: u64,
    /// Bytes of log entries held in memory (the newest; older ones are read back from the
    /// segment files).
    #[serde(default)]
    pub log_memory_bytes: u64,
    /// Index of the last applied log entry.
    pub last_applied: u64,
    /// Log index the newest snapshot stands for (0: none).
    pub snapshot_index: u64,
    /// Bytes of the newest snapshot file (0: none).
    pub snapshot_bytes: u64,
    /// Milliseconds since the newest snapshot was written or loaded (0: none).
    pub snapshot_age_ms: u64,
    /// Snapshots this process wrote.
    pub snapshots_taken: u64,
    /// Milliseconds the last snapshot took to write.
    pub last_snapshot_ms: u64,
    /// Fsyncs of the log so far.
    pub fsyncs: u64,
    /// Log records (entries) written so far.
    pub log_records_written: u64,
    /// How long the log's fsyncs took (a histogram, as the service times).
    #[serde(default)]
    pub fsync: crate::latency::Latency,
    /// When writes to the disk began failing (Unix ms; 0: they work). Meanwhile the node
    /// refuses batches with writes (reads go on) and retries the disk until it works again.
    #[serde(default)]
    pub stalled_since_unix_ms: u64,
    /// Why the disk refuses writes (the operating system's words, e.g. "No space left on
    /// device"), while stalled.
    #[serde(default)]
    pub stall_reason: String,
    /// Times the disk began refusing writes since the node started.
    #[serde(default)]
    pub disk_stalls: u64,
}

impl Default for Durability {
    fn default() -> Self {
        Durability {
            mode: "memory".into(),
            log_bytes: 0,
            log_entries: 0,
            log_memory_bytes: 0,
            last_applied: 0,
            snapshot_index: 0,
            snapshot_bytes: 0,
            snapshot_age_ms: 0,
            snapshots_taken: 0,
            last_snapshot_ms: 0,
            fsyncs: 0,
            log_records_written: 0,
            fsync: crate::latency::Latency::default(),
            stalled_since_unix_ms: 0,
            stall_reason: String::new(),
            disk_stalls: 0,
        }
    }
}

impl Durability {
    /// Whether the node keeps a log (a `--data-dir`).
    pub fn is_durable(&self) -> bool {
        self.mode != "memory"
    }

    /// Two short lines for people (kvd stats, kvtui's detail view): the log, then the
    /// snapshot and fsyncs. One line, "in memory only", for a node without a data dir.
    pub fn summary_lines(&self) -> Vec<String> {
        use crate::units::{bytes, grouped, micros};
        if !self.is_durable() {
            return vec!["in memory only (no --data-dir): a restart loses the shard".into()];
        }
        let snapshot = if self.snapshot_index == 0 {
            "no snapshot yet".to_string()
        } else {
            format!(
                "snapshot at entry {} ({}, {} s old; {} taken here, last took {} ms)",
                grouped(self.snapshot_index),
                bytes(self.snapshot_bytes as f64),
                self.snapshot_age_ms / 1000,
                self.snapshots_taken,
                self.last_snapshot_ms
            )
        };
        let mut lines = Vec::new();
        if self.stalled_since_unix_ms != 0 {
            lines.push(format!(
                "durability: STALLED since {} (unix ms), {}: writes are refused until the disk works again",
                self.stalled_since_unix_ms, self.stall_reason
            ));
        }
        lines.extend([
            format!(
                "durable, fsync {}: log {} on disk ({} in memory), {} entries since the snapshot, applied through {}",
                self.mode,
                bytes(self.log_bytes as f64),
                bytes(self.log_memory_bytes as f64),
                grouped(self.log_entries),
                grouped(self.last_applied)
            ),
            format!(
                "{snapshot}; fsyncs {} (p50 {}, p99 {})",
                grouped(self.fsyncs),
                micros(self.fsync.quantile_ns(0.5).unwrap_or(0) / 1000),
                micros(self.fsync.quantile_ns(0.99).unwrap_or(0) / 1000)
            ),
        ]);
        lines
    }
}

/// A node's place in its replica group: the one definition every tool reads (JSON: the
/// lower-case name, `""` for a node in no group).
#[derive(
    Archive, RkyvSerialize, RkyvDeserialize, Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq,
)]
#[serde(rename_all = "lowercase")]
pub enum GroupRole {
    /// Not a member of a replica group (in memory, or a durable group of one).
    #[default]
    #[serde(rename = "")]
    None,
    /// Leads its group: serves reads and writes.
    Leader,
    /// A voter that follows the leader: serves reads (follower reads).
    Follower,
    /// Follows the log without voting: serves reads.
    Learner,
    /// Started as a member (`--group` or `--join`) but no group has it yet: it waits for
    /// `kvd admin init-group` or `kvd admin add-replica`, and serves nothing.
    Joining,
    /// Its group has removed it: serves nothing.
    Removed,
}

impl GroupRole {
    /// The name tools print (and JSON carries).
    pub fn as_str(self) -> &'static str {
        match self {
            GroupRole::None => "",
            GroupRole::Leader => "leader",
            GroupRole::Follower => "follower",
            GroupRole::Learner => "learner",
            GroupRole::Joining => "joining",
            GroupRole::Removed => "removed",
        }
    }

    /// Whether the member is in its group's membership now (leader, follower or learner).
    pub fn is_member(self) -> bool {
        matches!(self, GroupRole::Leader | GroupRole::Follower | GroupRole::Learner)
    }

    /// Whether the node is part of a replica group in any way (not `None`).
    pub fn in_group(self) -> bool {
        self != GroupRole::None
    }
}

impl std::fmt::Display for GroupRole {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A replica group member's place in its group.
#[derive(Archive, RkyvSerialize, RkyvDeserialize, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
pub struct GroupFigures {
    /// Its role (see [`GroupRole`]).
    #[serde(default)]
    pub role: GroupRole,
    /// The replica group's id (made by `kvd admin init-group`; 0 while this member has
    /// none). Every member of one group reports the same.
    #[serde(default)]
    pub group_id: u64,
    /// The raft term this member is in.
    #[serde(default)]
    pub term: u64,
    /// The leader's address as this member knows it (empty: none known).
    #[serde(default)]
    pub leader: String,
    /// The last log entry this member holds.
    #[serde(default)]
    pub log_index: u64,
    /// The last log entry known committed (held by a majority of voters): computed on the
    /// leader, the leader's last word on a follower.
    #[serde(default)]
    pub commit_index: u64,
    /// The last log entry applied here.
    #[serde(default)]
    pub applied_index: u64,
    /// Elections (new terms) this member's process has seen.
    #[serde(default)]
    pub elections: u64,
    /// Times this member's process saw the leader change (to a leader other than the last
    /// one it knew; the first leader it learns is not a change).
    #[serde(default)]
    pub leader_changes: u64,
    /// Read-index rounds this member's process ran as leader (one confirms leadership for
    /// every read waiting then, its own and its members'; a group with no other member
    /// runs none: its reads need no round).
    #[serde(default)]
    pub read_index_rounds: u64,
    /// On the leader: how many entries each follower is behind.
    #[serde(default)]
    pub lag: Vec<FollowerLag>,
    /// The voters' addresses, as the group's membership (its log) says now.
    #[serde(default)]
    pub members: Vec<String>,
    /// The learners' addresses (members that follow the log but do not vote).
    #[serde(default)]
    pub learners: Vec<String>,
    /// On the leader: the last membership changes it carried out, oldest first (at most
    /// [`GroupChange::KEPT`]; a new leader starts an empty list).
    #[serde(default)]
    pub changes: Vec<GroupChange>,
}

/// One membership change a group's leader carried out, and why it was asked for.
#[derive(Archive, RkyvSerialize, RkyvDeserialize, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
pub struct GroupChange {
    /// When it was done (Unix ms, the leader's clock).
    pub unix_ms: u64,
    /// What was done, in words (e.g. "added 10.0.0.5:7070 as a learner").
    pub what: String,
    /// Who asked and why, as they said it (the shard manager gives the figures that
    /// decided it; `kvd admin` says so).
    pub why: String,
}

impl GroupChange {
    /// How many changes a leader keeps.
    pub const KEPT: usize = 16;

    /// One line: when (UTC), what, and why.
    pub fn summary(&self) -> String {
        let at = std::time::UNIX_EPOCH + std::time::Duration::from_millis(self.unix_ms);
        format!(
            "changed {}: {} ({})",
            humantime::format_rfc3339_seconds(at),
            self.what,
            self.why
        )
    }
}

/// How far one follower is behind its leader.
#[derive(Archive, RkyvSerialize, RkyvDeserialize, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
pub struct FollowerLag {
    /// The follower.
    pub addr: String,
    /// Log entries the leader has that it has not confirmed.
    pub behind: u64,
}

/// One node's statistics at one instant.
#[derive(Archive, RkyvSerialize, RkyvDeserialize, Serialize, Deserialize, Clone, Debug, PartialEq)]
pub struct NodeStats {
    /// kvd's version string.
    pub version: String,
    /// The shard this node serves (`"0/2"` in JSON).
    pub shard: ShardId,
    /// kvd's process id.
    pub pid: u32,
    /// Milliseconds since the node started; a smaller value than last time means a restart.
    pub uptime_ms: u64,
    /// Wall clock at sampling, milliseconds since the Unix epoch.
    pub unix_ms: u64,
    /// Keys stored now.
    pub keys: u64,
    /// Keys with a time to live (Redis's `expires=` in `INFO keyspace`).
    pub volatile_keys: u64,
    /// Internal map shards, each with its own lock.
    pub map_shards: u32,
    /// Bytes the stored data takes as kvd accounts it (keys, values, entries, tables).
    pub memory_used_bytes: u64,
    /// `--max-memory` in bytes; 0 when unlimited.
    pub max_memory_bytes: u64,
    /// `--eviction` (`lru`, `random`, `none`), or empty when unlimited.
    pub eviction: String,
    /// Tokio worker threads serving connections.
    pub worker_threads: u32,
    /// Where the node speaks RESP (`--resp`, as bound; empty: it does not), for Redis
    /// Cluster's `CLUSTER SLOTS` and `-MOVED` on the other nodes.
    #[serde(default)]
    pub resp_addr: String,
    /// The hash slot ranges the node serves, first and last slot of each (docs/CLUSTER.md).
    #[serde(default)]
    pub slots: Vec<[u16; 2]>,
    /// Slot moves under way here: slots this node's group is handing over (frozen) and
    /// taking in (importing), and the highest epoch its slot table holds.
    #[serde(default)]
    pub slot_moves: SlotMoves,
    /// The shard's log and snapshots (`durability.mode` is `memory` without `--data-dir`).
    #[serde(default)]
    pub durability: Durability,
    /// The node's replica group (empty `role` when it is in none); flattened in JSON, so a
    /// node's stats have `role`, `term`, `leader`, `applied_index` and `members`.
    #[serde(flatten)]
    pub group: GroupFigures,
    /// Service-time histograms since the node started (see [`LatencyStats`]).
    #[serde(default)]
    pub latency: LatencyStats,
    /// What the node served over its last window (see [`RecentLoad`]).
    #[serde(default)]
    pub recent: RecentLoad,
    /// Counter totals since the node started.
    #[serde(flatten)]
    pub counts: Counts,
    /// Process and host figures, as last sampled.
    #[serde(flatten)]
    pub system: SystemFigures,
}

/// The load a node's shard took over its last window, measured by the node itself: the
/// figures a watcher of hot shards (a shard manager, an operator with curl) reads without
/// keeping state of its own. A window ends when a stats request finds the current one at
/// least [`RecentLoad::MIN_WINDOW_MS`] old, so it is about as long as the busiest poller's
/// interval (and the whole time since the last request when nobody polls).
#[derive(Archive, RkyvSerialize, RkyvDeserialize, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
pub struct RecentLoad {
    /// Length of the window in ms; 0 until the first window has ended.
    pub window_ms: u64,
    /// Gets per second.
    pub reads_per_sec: f64,
    /// Puts (conditional ones included) and deletes per second.
    pub writes_per_sec: f64,
    /// Server-side service time of the window's reads (the batch's time in kvd, per op
    /// kind), mean, microseconds.
    pub read_mean_us: f64,
    /// The same, p99.
    pub read_p99_us: f64,
    /// Server-side service time of the window's writes, mean, microseconds.
    pub write_mean_us: f64,
    /// The same, p99.
    pub write_p99_us: f64,
}

impl RecentLoad {
    /// The shortest window a node reports.
    pub const MIN_WINDOW_MS: u64 = 1000;

    /// The load between two cumulative readings `ms` milliseconds apart.
    pub fn between(before: (&Counts, &LatencyStats), after: (&Counts, &LatencyStats), ms: u64) -> RecentLoad {
        let secs = (ms as f64 / 1000.0).max(1e-3);
        let (c0, l0) = before;
        let (c1, l1) = after;
        let reads = l1.get.since(&l0.get);
        let writes = l1.put.since(&l0.put).merged(&l1.delete.since(&l0.delete));
        let us = |ns: Option<u64>| ns.map_or(0.0, |n| n as f64 / 1000.0);
        RecentLoad {
            window_ms: ms,
            reads_per_sec: c1.gets.saturating_sub(c0.gets) as f64 / secs,
            writes_per_sec: (c1.puts + c1.deletes).saturating_sub(c0.puts + c0.deletes) as f64 / secs,
            read_mean_us: us(reads.mean_ns()),
            read_p99_us: us(reads.quantile_ns(0.99)),
            write_mean_us: us(writes.mean_ns()),
            write_p99_us: us(writes.quantile_ns(0.99)),
        }
    }

    /// One line for `kvd stats`.
    pub fn summary(&self) -> String {
        if self.window_ms == 0 {
            return "no full window yet".into();
        }
        format!(
            "{} reads/s (p99 {}), {} writes/s (p99 {}) over the last {:.1} s",
            crate::units::si(self.reads_per_sec),
            crate::units::micros(self.read_p99_us as u64),
            crate::units::si(self.writes_per_sec),
            crate::units::micros(self.write_p99_us as u64),
            self.window_ms as f64 / 1000.0
        )
    }
}

impl Default for NodeStats {
    fn default() -> Self {
        NodeStats {
            version: String::new(),
            shard: ShardId::SOLO,
            pid: 0,
            uptime_ms: 0,
            unix_ms: 0,
            keys: 0,
            volatile_keys: 0,
            map_shards: 0,
            memory_used_bytes: 0,
            max_memory_bytes: 0,
            eviction: String::new(),
            worker_threads: 0,
            resp_addr: String::new(),
            slots: Vec::new(),
            slot_moves: SlotMoves::default(),
            durability: Durability::default(),
            group: GroupFigures::default(),
            latency: LatencyStats::default(),
            recent: RecentLoad::default(),
            counts: Counts::default(),
            system: SystemFigures::default(),
        }
    }
}

/// Slot moves under way at a node (docs/CLUSTER.md).
#[derive(
    Archive, RkyvSerialize, RkyvDeserialize, Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq,
)]
pub struct SlotMoves {
    /// Slots frozen here: being handed to another group (writes answered "try again").
    pub frozen: u32,
    /// Slots being copied in here.
    pub importing: u32,
    /// Of the moves into this node under way: the slots it already took (owns); with
    /// `importing`, how many those moves bring in all. 0 when none is under way.
    pub taken: u32,
    /// The highest epoch of the node's slot table (0: the even split, never moved).
    pub epoch: u32,
}

impl NodeStats {
    /// The slots it serves, as `0-5461 (5462 slots)`, with the moves under way
    /// (`, 256 frozen`); `none` when it serves none.
    pub fn slots_summary(&self) -> String {
        let count: u32 = self
            .slots
            .iter()
            .map(|[a, b]| u32::from(b.saturating_sub(*a)) + 1)
            .sum();
        let ranges: Vec<String> = self
            .slots
            .iter()
            .map(|[a, b]| if a == b { a.to_string() } else { format!("{a}-{b}") })
            .collect();
        let m = self.slot_moves;
        let moving = match (m.frozen, m.importing) {
            (0, 0) => String::new(),
            (f, 0) => format!(", {f} frozen"),
            (0, i) => format!(", {i} importing"),
            (f, i) => format!(", {f} frozen, {i} importing"),
        };
        match count {
            0 => format!("none{moving}"),
            n => format!("{} ({n} slots{moving})", ranges.join(",")),
        }
    }

    /// Slot moves at this node since it started, for people: `in 1,024 slots (moving in:
    /// 768 of 1,024 taken, 33.1k keys/s), out 2,048 slots`; `None` when it has seen none.
    /// `keys_per_sec`: the rate of `keys_loaded` (from [`NodeRates`]), when known.
    pub fn moves_summary(&self, keys_per_sec: Option<f64>) -> Option<String> {
        let (c, m) = (&self.counts, self.slot_moves);
        if c.slots_in + c.slots_out + c.keys_loaded == 0 && m.frozen + m.importing == 0 {
            return None;
        }
        let grouped = crate::units::grouped;
        let mut inbound = Vec::new();
        if m.importing > 0 {
            let all = u64::from(m.taken) + u64::from(m.importing);
            inbound.push(format!(
                "moving in: {} of {} taken",
                grouped(u64::from(m.taken)),
                grouped(all)
            ));
        }
        match keys_per_sec {
            Some(r) if r > 0.0 => inbound.push(format!("{} keys/s", crate::units::si(r))),
            _ => {}
        }
        let detail = match inbound.is_empty() {
            true => String::new(),
            false => format!(" ({})", inbound.join(", ")),
        };
        let frozen = match m.frozen {
            0 => String::new(),
            f => format!(" ({} frozen)", grouped(u64::from(f))),
        };
        Some(format!(
            "in {} slots{detail}, {} keys copied in; out {} slots{frozen}",
            grouped(c.slots_in),
            grouped(c.keys_loaded),
            grouped(c.slots_out)
        ))
    }

    /// The stored data's memory, for tables: `12.3 MB`, or `12.3 MB/100 MB` under a cap.
    pub fn memory_summary(&self) -> String {
        let used = crate::units::bytes(self.memory_used_bytes as f64);
        match self.max_memory_bytes {
            0 => used,
            cap => format!("{used}/{}", crate::units::bytes(cap as f64)),
        }
    }

    /// Whether `self` comes from a later process than `before` (a restart between the two).
    pub fn restarted_since(&self, before: &NodeStats) -> bool {
        self.uptime_ms < before.uptime_ms || self.pid != before.pid
    }
}

/// Receive and send rates of one host interface.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
pub struct InterfaceRate {
    /// Interface name.
    pub name: String,
    /// Bytes received per second.
    pub rx_per_sec: f64,
    /// Bytes sent per second.
    pub tx_per_sec: f64,
}

/// Rates between two samples of the same node.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
pub struct NodeRates {
    /// The span the counter rates cover, seconds.
    pub seconds: f64,
    /// Ops per second (get + put + delete).
    pub ops_per_sec: f64,
    /// Gets per second.
    pub gets_per_sec: f64,
    /// Puts per second.
    pub puts_per_sec: f64,
    /// Deletes per second.
    pub deletes_per_sec: f64,
    /// Ops applied from the log per second (a follower's replayed writes; not served).
    #[serde(default)]
    pub applied_per_sec: f64,
    /// Keys copied in by slot moves per second.
    #[serde(default)]
    pub keys_loaded_per_sec: f64,
    /// Errors per second, redirects left out (see [`Counts::failures`]).
    pub errors_per_sec: f64,
    /// Redirects per second (see [`Counts::redirects`]).
    #[serde(default)]
    pub redirects_per_sec: f64,
    /// Hits / (hits + misses) over the span; `None` if there were no lookups.
    pub hit_ratio: Option<f64>,
    /// kvd's own socket bytes in per second.
    pub bytes_in_per_sec: f64,
    /// kvd's own socket bytes out per second.
    pub bytes_out_per_sec: f64,
    /// kvd CPU over the system span, percent of one core.
    pub process_cpu_percent: f64,
    /// Host NIC receive rate, interfaces other than loopback summed.
    pub host_rx_per_sec: f64,
    /// Host NIC send rate, interfaces other than loopback summed.
    pub host_tx_per_sec: f64,
    /// Per host interface.
    pub interfaces: Vec<InterfaceRate>,
    /// The host's CPU split over the system span (`None`: not measured).
    #[serde(default)]
    pub host_cpu: Option<HostCpuSplit>,
    /// The span the CPU and NIC rates cover: between kvd's own sampling times, which
    /// change only about once a second. 0 when kvd had not sampled twice in the span.
    pub system_seconds: f64,
    /// The node restarted between the samples: the counter rates cover only the time since
    /// the restart (`seconds` is that time), and the system rates are absent.
    pub restarted: bool,
}

impl NodeRates {
    /// Rates from `before` to `after`, `seconds` apart as measured by the reader.
    ///
    /// CPU and NIC totals change only when kvd samples them (about once a second), so they
    /// are rated over kvd's sampling times, or two reads between samples would show 0 and
    /// then double. Use [`RateTracker`] to keep those rates steady when polling faster than
    /// kvd samples.
    ///
    /// After a restart (uptime went backwards or the pid changed), the counter rates cover
    /// the time since the restart: the new process's totals over its uptime.
    pub fn between(before: &NodeStats, after: &NodeStats, seconds: f64) -> NodeRates {
        if after.restarted_since(before) {
            let since_restart = (after.uptime_ms as f64 / 1000.0).min(seconds.max(0.0));
            let mut r = Self::counter_rates(&Counts::default(), &after.counts, since_restart);
            r.restarted = true;
            return r;
        }
        let mut r = Self::counter_rates(&before.counts, &after.counts, seconds);
        r.set_system(&before.system, &after.system);
        r
    }

    fn counter_rates(before: &Counts, after: &Counts, seconds: f64) -> NodeRates {
        let d = after.since(before);
        let rate = |v: u64| if seconds > 0.0 { v as f64 / seconds } else { 0.0 };
        NodeRates {
            seconds,
            ops_per_sec: rate(d.ops()),
            gets_per_sec: rate(d.gets),
            puts_per_sec: rate(d.puts),
            applied_per_sec: rate(d.applied),
            keys_loaded_per_sec: rate(d.keys_loaded),
            deletes_per_sec: rate(d.deletes),
            errors_per_sec: rate(d.failures()),
            redirects_per_sec: rate(d.redirects()),
            hit_ratio: d.hit_ratio(),
            bytes_in_per_sec: rate(d.bytes_in),
            bytes_out_per_sec: rate(d.bytes_out),
            ..NodeRates::default()
        }
    }

    fn set_system(&mut self, before: &SystemFigures, after: &SystemFigures) {
        let secs = after.system_sampled_ms.saturating_sub(before.system_sampled_ms) as f64 / 1000.0;
        if secs <= 0.0 {
            return;
        }
        let rate = |a: u64, b: u64| b.saturating_sub(a) as f64 / secs;
        let (rx0, tx0) = before.host_net_totals();
        let (rx1, tx1) = after.host_net_totals();
        self.system_seconds = secs;
        self.process_cpu_percent = rate(before.process_cpu_ms, after.process_cpu_ms) / 10.0;
        self.host_cpu = HostCpuSplit::between(&before.host_cpu, &after.host_cpu, secs);
        self.host_rx_per_sec = rate(rx0, rx1);
        self.host_tx_per_sec = rate(tx0, tx1);
        self.interfaces = after
            .interfaces
            .iter()
            .filter_map(|i| {
                let old = before.interfaces.iter().find(|o| o.name == i.name)?;
                Some(InterfaceRate {
                    name: i.name.clone(),
                    rx_per_sec: rate(old.rx_bytes, i.rx_bytes),
                    tx_per_sec: rate(old.tx_bytes, i.tx_bytes),
                })
            })
            .collect();
    }

    /// Whether the CPU and NIC rates were measured (kvd sampled twice in the span).
    pub fn system_fresh(&self) -> bool {
        self.system_seconds > 0.0
    }
}

/// Follows one node through a series of polls and gives steady rates.
///
/// Counter rates cover the time since the previous poll. CPU and NIC rates cover the last
/// two distinct kvd samples, so polling faster than kvd samples repeats the last measured
/// rate instead of alternating between 0 and twice the truth.
#[derive(Clone, Debug, Default)]
pub struct RateTracker {
    /// The previous poll: (reader's time in seconds, stats).
    previous: Option<(f64, NodeStats)>,
    /// The newest distinct system sample seen.
    latest_system: Option<SystemFigures>,
    /// CPU and NIC rates between the two newest distinct system samples.
    system_rates: Option<NodeRates>,
}

impl RateTracker {
    /// Takes in a poll made at `at_secs` (any monotonic clock in seconds) and returns the
    /// rates since the previous poll; `None` for the first poll.
    pub fn update(&mut self, at_secs: f64, stats: &NodeStats) -> Option<NodeRates> {
        let mut rates = self
            .previous
            .take()
            .map(|(t0, before)| NodeRates::between(&before, stats, at_secs - t0));
        if rates.as_ref().is_some_and(|r| r.restarted) {
            self.latest_system = None;
            self.system_rates = None;
        }
        match &self.latest_system {
            Some(latest) if latest.system_sampled_ms == stats.system.system_sampled_ms => {}
            Some(latest) => {
                let mut sys = NodeRates::default();
                sys.set_system(latest, &stats.system);
                self.system_rates = sys.system_fresh().then_some(sys);
                self.latest_system = Some(stats.system.clone());
            }
            None => self.latest_system = Some(stats.system.clone()),
        }
        if let (Some(r), Some(sys)) = (rates.as_mut(), &self.system_rates) {
            r.system_seconds = sys.system_seconds;
            r.process_cpu_percent = sys.process_cpu_percent;
            r.host_rx_per_sec = sys.host_rx_per_sec;
            r.host_tx_per_sec = sys.host_tx_per_sec;
            r.interfaces = sys.interfaces.clone();
        }
        self.previous = Some((at_secs, stats.clone()));
        rates
    }

    /// Forgets everything (the node went down; whatever answers next starts afresh).
    pub fn reset(&mut self) {
        *self = RateTracker::default();
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn slots_read_as_ranges_and_a_count() {
        let mut s = NodeStats::default();
        assert_eq!(s.slots_summary(), "none");
        s.slots = vec![[0, 5461], [7000, 7000]];
        assert_eq!(s.slots_summary(), "0-5461,7000 (5463 slots)");
        s.slot_moves = SlotMoves {
            frozen: 256,
            importing: 0,
            taken: 0,
            epoch: 3,
        };
        assert_eq!(s.slots_summary(), "0-5461,7000 (5463 slots, 256 frozen)");
        s.slot_moves = SlotMoves {
            frozen: 0,
            importing: 1024,
            taken: 342,
            epoch: 4,
        };
        s.counts.slots_in = 342;
        assert_eq!(
            s.moves_summary(Some(31_000.0)).as_deref(),
            Some("in 342 slots (moving in: 342 of 1,366 taken, 31.0k keys/s), 0 keys copied in; out 0 slots")
        );
    }

    use super::*;

    #[test]
    fn recent_load_is_the_difference_over_the_window() {
        let before = (Counts::default(), LatencyStats::default());
        let c = Counts {
            gets: 2000,
            puts: 300,
            deletes: 100,
            ..Counts::default()
        };
        let mut dense = vec![0u64; crate::latency::BUCKETS];
        dense[crate::latency::bucket_of(50_000)] = 2000;
        let l = LatencyStats {
            get: crate::latency::Latency::from_dense(&dense, 2000 * 50_000),
            ..LatencyStats::default()
        };
        let r = RecentLoad::between((&before.0, &before.1), (&c, &l), 2000);
        assert_eq!((r.reads_per_sec, r.writes_per_sec), (1000.0, 200.0));
        assert_eq!(r.read_mean_us, 50.0);
        assert!((40.0..70.0).contains(&r.read_p99_us), "{r:?}");
        assert_eq!(r.write_p99_us, 0.0);
        assert!(r.summary().contains("over the last 2.0 s"), "{}", r.summary());
    }

    fn sample(uptime_ms: u64, gets: u64, cpu_ms: u64) -> NodeStats {
        NodeStats {
            pid: 7,
            uptime_ms,
            counts: Counts {
                gets,
                hits: gets,
                ..Counts::default()
            },
            system: SystemFigures {
                system_sampled_ms: uptime_ms,
                process_cpu_ms: cpu_ms,
                ..SystemFigures::default()
            },
            ..NodeStats::default()
        }
    }

    #[test]
    fn rates_from_totals() {
        let r = NodeRates::between(&sample(1000, 100, 0), &sample(3000, 2100, 1000), 2.0);
        assert_eq!(r.ops_per_sec, 1000.0);
        assert_eq!(r.process_cpu_percent, 50.0);
        assert_eq!(r.hit_ratio, Some(1.0));
        assert!(!r.restarted);
    }

    #[test]
    fn cpu_is_rated_over_kvds_sampling_times_not_the_read_times() {
        let a = sample(1000, 0, 0);
        let mut b = sample(1500, 100, 0);
        b.system.system_sampled_ms = a.system.system_sampled_ms;
        let r = NodeRates::between(&a, &b, 0.5);
        assert!(!r.system_fresh());
        assert_eq!(r.ops_per_sec, 200.0);
        let mut c = sample(2000, 200, 900);
        c.system.system_sampled_ms = 2000;
        let r = NodeRates::between(&b, &c, 0.5);
        assert!(r.system_fresh());
        assert_eq!(r.process_cpu_percent, 90.0);
    }

    #[test]
    fn a_restart_gives_the_rates_since_the_restart() {
        let r = NodeRates::between(&sample(9000, 5000, 100), &sample(500, 10, 5), 1.0);
        assert!(r.restarted);
        // 10 ops in the 0.5 s since the restart, not 0 and not a negative spike.
        assert_eq!(r.seconds, 0.5);
        assert_eq!(r.ops_per_sec, 20.0);
        assert!(!r.system_fresh());
    }

    /// Polls every 500 ms against kvd sampling every 1000 ms, with the host NIC and CPU
    /// moving at a steady rate: every rate after the first must be the true rate.
    #[test]
    fn polling_faster_than_kvd_samples_gives_steady_nic_and_cpu_rates() {
        let nic_rate = 1_000_000u64; // bytes per second on eth0
        let cpu_rate = 600u64; // CPU ms per second (60%)
        let mut tracker = RateTracker::default();
        let mut seen = Vec::new();
        for poll in 0..12u64 {
            let now_ms = 1000 + poll * 500;
            let sampled_ms = now_ms / 1000 * 1000;
            let mut s = sample(now_ms, poll * 100, sampled_ms * cpu_rate / 1000);
            s.system.system_sampled_ms = sampled_ms;
            s.system.interfaces = vec![InterfaceStats {
                name: "eth0".into(),
                rx_bytes: sampled_ms * nic_rate / 1000,
                tx_bytes: sampled_ms * nic_rate / 2000,
            }];
            if let Some(r) = tracker.update(now_ms as f64 / 1000.0, &s) {
                seen.push(r);
            }
        }
        for r in seen.iter().skip(1) {
            assert_eq!(r.ops_per_sec, 200.0);
            assert_eq!(r.host_rx_per_sec, nic_rate as f64, "{r:?}");
            assert_eq!(r.interfaces[0].rx_per_sec, nic_rate as f64, "{r:?}");
            assert_eq!(r.interfaces[0].tx_per_sec, nic_rate as f64 / 2.0, "{r:?}");
            assert_eq!(r.process_cpu_percent, 60.0, "{r:?}");
        }
    }

    #[test]
    fn json_keeps_flat_counter_names_and_the_shard_as_text() {
        let mut s = sample(1, 3, 0);
        s.shard = ShardId { index: 1, count: 3 };
        s.counts.wrong_shard = 4;
        let v: serde_json::Value = serde_json::to_value(&s).unwrap();
        assert_eq!(v["gets"], 3);
        assert_eq!(v["wrong_shard"], 4);
        assert_eq!(v["shard"], "1/3");
        assert_eq!(v["system_sampled_ms"], 1);
        let back: NodeStats = serde_json::from_value(v).unwrap();
        assert_eq!(back, s);
    }

    #[test]
    fn counter_names_are_unique_and_indexes_match_fields() {
        let mut names: Vec<_> = Counter::ALL.iter().map(|c| c.name()).collect();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), Counter::COUNT);
        for (i, &c) in Counter::ALL.iter().enumerate() {
            assert_eq!(c as usize, i);
            let mut counts = Counts::default();
            *counts.get_mut(c) = 7;
            assert_eq!(counts.get(c), 7);
            assert_eq!(Counter::ALL.iter().map(|&o| counts.get(o)).sum::<u64>(), 7);
        }
    }
}
