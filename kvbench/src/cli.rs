//! The `kvbench` command line.

use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};
use kvshared::cli::NodesArgs;

use crate::workload::{Contention, Distribution, Phase, SpecOptions, Workload, parse_phases};

#[derive(Parser, Debug)]
#[command(
    name = "kvbench",
    version,
    about = "YCSB load generator, sweeps and linearizability checks for kvd clusters",
    after_help = "A first benchmark on one machine:\n  \
        kvd --listen 127.0.0.1:7070 &\n  \
        kvbench load                      # 1,000,000 records of 128 bytes\n  \
        kvbench run --duration 10s        # YCSB-B, zipfian 0.99, 128 tasks, batch 64\n\n\
        Nodes come from --nodes or KV_NODES (default 127.0.0.1:7070), in shard order.\n\
        Logs go to stderr; RUST_LOG=debug shows more.\n\n\
        Exit status: 0 done and every op succeeded; 1 some ops failed (run, sweep; see\n\
        --allow-failures) or, for check, not linearizable; 2 an error (bad flags, cluster\n\
        unreachable, check verdict unknown); 130 interrupted by Ctrl-C (run and sweep still\n\
        print and save what was measured; a second Ctrl-C quits at once)."
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Subcommand, Debug)]
pub enum Command {
    /// Preload records 0..N-1 in large batches.
    Load(LoadArgs),
    /// Run a workload and print (and optionally save) the result.
    Run(RunArgs),
    /// Run every point of a tasks x batch grid; write sweep.csv and charts.
    Sweep(SweepArgs),
    /// Combine result files from several client machines into one result.
    Merge(MergeArgs),
    /// Record a concurrent history against the cluster and check it is linearizable
    /// (exit 0 linearizable, 1 not linearizable, 2 unknown or error).
    Check(CheckArgs),
}

/// Which cluster, and how to load it.
#[derive(Args, Debug, Clone)]
pub struct ClusterArgs {
    #[command(flatten)]
    pub nodes: NodesArgs,
    /// TCP connections per node [default: as many as the node has worker threads, so the
    /// node can serve on all its cores; kvd serves one connection on one core at a time].
    #[arg(long)]
    pub conns: Option<usize>,
    /// Batches in flight at once per connection.
    #[arg(long, default_value_t = 64)]
    pub pipeline: usize,
    /// Client threads [default: the number of CPUs]. `run` and `sweep` spread their tasks
    /// over this many threads, each with its own runtime and its own share of the `--conns`
    /// connections (so at most `--conns` threads); `load` and `check` run on this many
    /// runtime workers.
    #[arg(long)]
    pub threads: Option<usize>,
    /// Send each node's reads and writes in separate batches, so that every batch of reads
    /// may be served by any member of a replica group (see --reads); a read-modify-write
    /// stays in one batch. Without it a batch of 64 YCSB-B ops holds a write 96% of the
    /// time and goes to the leader.
    #[arg(long)]
    pub split_reads: bool,
}

/// The shape of the data set: shared by `load` and the workloads, so both agree on keys.
#[derive(Args, Debug, Clone)]
pub struct DataArgs {
    /// Records in the store (keys 0..N-1 in decimal, after --key-prefix).
    #[arg(long, default_value_t = 1_000_000)]
    pub records: u64,
    /// Bytes per value.
    #[arg(long, default_value_t = 128)]
    pub value_size: usize,
    /// Text before each record number in a key.
    #[arg(long, default_value = "")]
    pub key_prefix: String,
    /// Every put sets a time to live: a duration (`30s`) or a range (`10s..60s`) each put
    /// draws from uniformly (Redis's SET ... PX); without it, plain puts.
    #[arg(long, value_parser = crate::workload::ttl::TtlRange::parse, value_name = "DURATION[..DURATION]")]
    pub ttl: Option<crate::workload::ttl::TtlRange>,
}

#[derive(Args, Debug, Clone)]
pub struct WorkloadArgs {
    /// Workload: YCSB a, b, c, d, f, or one of the presets below (see --help).
    #[arg(long, short = 'w', value_enum, default_value = "b")]
    pub workload: Workload,
    /// Contention of the read-mostly / write-mostly presets.
    #[arg(long, value_enum)]
    pub contention: Option<Contention>,
    #[command(flatten)]
    pub data: DataArgs,
    /// Key distribution, overriding the workload's.
    #[arg(long, value_enum)]
    pub distribution: Option<Distribution>,
    /// Zipfian skew.
    #[arg(long)]
    pub theta: Option<f64>,
    /// Scramble zipfian ranks over the key space (YCSB's scrambled zipfian); by default
    /// record 0 is the hottest (rank order).
    #[arg(long)]
    pub scrambled: bool,
    /// Hotspot distribution: fraction of keys that are hot [default: 0.2].
    #[arg(long)]
    pub hot_fraction: Option<f64>,
    /// Hotspot distribution: fraction of ops that go to hot keys [default: 0.8]. With
    /// `-w hotkey`: fraction of ops on the hot node's keys, the rest spread over every
    /// record [default: all].
    #[arg(long)]
    pub hot_ops: Option<f64>,
    /// With `-w hotkey`: a hot spot that moves between shards, as SHARD:DURATION steps
    /// repeated in turn from the start of the run, e.g. `0:10s,1:10s,2:10s` [default: shard
    /// 0 throughout]. `--timeline` then shows each shard's latency following it.
    #[arg(long, value_parser = parse_phases_arg, value_name = "SHARD:TIME,...")]
    pub phases: Option<PhaseList>,
}

/// `--phases`, parsed (one value that holds several steps, for clap).
#[derive(Clone, Debug)]
pub struct PhaseList(pub Vec<Phase>);

fn parse_phases_arg(text: &str) -> Result<PhaseList, String> {
    parse_phases(text).map(PhaseList)
}

impl WorkloadArgs {
    pub fn spec_options(&self) -> SpecOptions {
        SpecOptions {
            contention: self.contention,
            distribution: self.distribution,
            theta: self.theta,
            scrambled: self.scrambled,
            hot_fraction: self.hot_fraction,
            hot_ops: self.hot_ops,
            records: self.data.records,
            value_size: self.data.value_size,
            key_prefix: self.data.key_prefix.clone(),
            phases: self.phases.clone().map(|p| p.0).unwrap_or_default(),
            ttl: self.data.ttl,
        }
    }
}

#[derive(Args, Debug, Clone)]
pub struct TimingArgs {
    /// Measured time (after warm-up).
    #[arg(long, short = 'd', default_value = "10s", value_parser = humantime::parse_duration)]
    pub duration: Duration,
    /// Warm-up before measuring; excluded from every figure.
    #[arg(long, default_value = "2s", value_parser = humantime::parse_duration)]
    pub warmup: Duration,
    /// Stop after this many measured ops instead of after --duration.
    #[arg(long)]
    pub ops: Option<u64>,
    /// Open loop: send at this many op/s in total and measure latency from each batch's
    /// intended send time (corrects coordinated omission). Closed loop if absent.
    #[arg(long)]
    pub rate: Option<f64>,
    /// Seed for the op generators; the same seed repeats the same op sequence per task.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
}

/// What every measured run needs: the cluster, the workload and the timing.
#[derive(Args, Debug, Clone)]
pub struct BenchArgs {
    #[command(flatten)]
    pub cluster: ClusterArgs,
    #[command(flatten)]
    pub workload: WorkloadArgs,
    #[command(flatten)]
    pub timing: TimingArgs,
}

#[derive(Args, Debug, Clone)]
pub struct RunArgs {
    #[command(flatten)]
    pub bench: BenchArgs,
    /// Concurrent client tasks.
    #[arg(long, short = 't', default_value_t = 128)]
    pub tasks: usize,
    /// Ops per batch per node.
    #[arg(long, short = 'b', default_value_t = 64)]
    pub batch: usize,
    /// Write the full result as JSON to FILE (`-` for stdout; the summary then goes to stderr).
    #[arg(long, value_name = "FILE")]
    pub json: Option<PathBuf>,
    /// Append one row per run to this CSV file (header written when the file is new).
    #[arg(long, value_name = "FILE")]
    pub csv: Option<PathBuf>,
    /// Chart each shard's p99 batch round trip second by second to STEM.png and STEM.svg
    /// (the figures are in the JSON's `node_timeline` either way; with `-w hotkey --phases`
    /// it shows the hot spot moving).
    #[arg(long, value_name = "STEM")]
    pub timeline: Option<PathBuf>,
    /// Generate and encode ops without sending them, to measure kvbench's own speed per core.
    #[arg(long)]
    pub dry_run: bool,
    /// No progress output.
    #[arg(long, short = 'q')]
    pub quiet: bool,
    /// Exit 0 even when ops failed (for runs under fault injection, where failures are
    /// expected); they are still counted and reported.
    #[arg(long)]
    pub allow_failures: bool,
    /// Show the live cluster dashboard (kvtui) with the benchmark's throughput, latency and
    /// progress while it runs; q stops the run early. Plain progress lines when stdout is not a terminal.
    #[arg(long)]
    pub tui: bool,
}

#[derive(Args, Debug, Clone)]
pub struct SweepArgs {
    #[command(flatten)]
    pub bench: BenchArgs,
    /// Task counts to try.
    #[arg(long, value_delimiter = ',', default_value = "1,8,32,128")]
    pub tasks: Vec<usize>,
    /// Batch sizes to try.
    #[arg(long, value_delimiter = ',', default_value = "1,8,64,512,8192")]
    pub batch: Vec<usize>,
    /// Sweep over cache sizes instead of the tasks x batch grid: at each size (the cluster's
    /// total, split over the nodes) every node is FLUSHED and capped, and the workload runs
    /// cache-aside (a missed get is filled with a put); prints and charts the hit ratio
    /// next to an exact LRU's on the same key sequence. Runs at the last --tasks and
    /// --batch values. E.g. --cache-sizes 20mb,40mb,80mb -w c.
    #[arg(long, value_delimiter = ',', value_parser = kvshared::cli::parse_size, value_name = "SIZE,...")]
    pub cache_sizes: Vec<u64>,
    /// Directory for sweep.csv, the charts and each point's JSON.
    #[arg(long, default_value = "sweep")]
    pub out: PathBuf,
    /// Exit 0 even when ops failed at some point of the sweep.
    #[arg(long)]
    pub allow_failures: bool,
}

#[derive(Args, Debug, Clone)]
pub struct LoadArgs {
    #[command(flatten)]
    pub cluster: ClusterArgs,
    #[command(flatten)]
    pub data: DataArgs,
    /// Puts per batch per node.
    #[arg(long, default_value_t = 8192)]
    pub batch: usize,
    /// Concurrent loading tasks.
    #[arg(long, default_value_t = 4)]
    pub tasks: usize,
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// No progress bar.
    #[arg(long, short = 'q')]
    pub quiet: bool,
}

#[derive(Args, Debug, Clone)]
pub struct MergeArgs {
    /// Result files written by `kvbench run --json`.
    #[arg(required = true)]
    pub files: Vec<PathBuf>,
    /// Write the merged result as JSON to FILE (`-` for stdout).
    #[arg(long, value_name = "FILE")]
    pub json: Option<PathBuf>,
    /// Chart each shard's p99 batch round trip second by second, all clients together, to
    /// STEM.png and STEM.svg (as `kvbench run --timeline`).
    #[arg(long, value_name = "STEM")]
    pub timeline: Option<PathBuf>,
    /// Exit 0 even when some runs had failed ops (as `kvbench run --allow-failures`).
    #[arg(long)]
    pub allow_failures: bool,
}

#[derive(Args, Debug, Clone)]
pub struct CheckArgs {
    #[command(flatten)]
    pub cluster: ClusterArgs,
    /// Concurrent clients, each doing one op at a time.
    #[arg(long, default_value_t = 16)]
    pub clients: usize,
    /// Distinct keys (few keys means more contention, a harder check).
    #[arg(long, default_value_t = 100)]
    pub keys: usize,
    /// How long to record.
    #[arg(long, short = 'd', default_value = "10s", value_parser = humantime::parse_duration)]
    pub duration: Duration,
    /// Percent of gets; puts are 40%, the rest deletes.
    #[arg(long, default_value_t = 50)]
    pub get_percent: u32,
    /// Save the recorded history as JSON.
    #[arg(long, value_name = "FILE")]
    pub history: Option<PathBuf>,
    /// Check a saved history instead of recording one.
    #[arg(long, value_name = "FILE", conflicts_with = "history")]
    pub from: Option<PathBuf>,
    /// A fault log (scripts/run-cluster.sh --nemesis writes one: Unix ms, shard, fault,
    /// note; tab-separated), read after recording: prints how long each fault kept its shard
    /// from acknowledging ops begun after it.
    #[arg(long, value_name = "FILE", conflicts_with = "from")]
    pub faults: Option<PathBuf>,
    /// Puts carry a time to live drawn from this range (`50ms`, `20ms..200ms`), and the
    /// check holds reads to it: no read returns a value after its time ran out.
    #[arg(long, value_parser = crate::workload::ttl::TtlRange::parse, value_name = "DURATION[..DURATION]")]
    pub ttl: Option<crate::workload::ttl::TtlRange>,
    /// Give up (exit 2, verdict unknown) if checking takes longer than this.
    #[arg(long, default_value = "60s", value_parser = humantime::parse_duration)]
    pub deadline: Duration,
    /// Print the report as JSON on stdout.
    #[arg(long)]
    pub json: bool,
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
}
