//! kvbench against real kvd nodes on 127.0.0.1: the result is complete and agrees with the
//! servers' own counters; sweeps write their CSV and charts; a dying node does not hang a run.

use std::sync::Arc;
use std::sync::atomic::AtomicU64;

use clap::Parser;
use kvbench::cli::{Cli, Command};
use kvbench::interrupt::Interrupt;
use kvbench::run::{RunPlan, run_plan};
use kvd::local::{LocalCluster, LocalNode};
use kvd::node::NodeConfig;
use kvshared::client::{ClientConfig, Cluster};
use kvtestkit::{HANG, until_async};

/// Waits until the engine has completed `n` more ops.
async fn more(live: &kvbench::engine::Live, n: u64) {
    let completed = || live.completed.load(std::sync::atomic::Ordering::Relaxed);
    let target = completed() + n;
    until_async(&format!("{target} ops completed"), HANG, || async {
        let now = completed();
        if now >= target { Ok(()) } else { Err(now) }
    })
    .await
}

/// `live` nodes in process, each serving shard i of `live + 1`, and the address of a last
/// node that is down: a port held for the test that refuses every connection (a node
/// stopped here would free its port for any other test to take).
async fn with_a_node_down(live: u32) -> (Vec<LocalNode>, Vec<String>) {
    let mut nodes = Vec::new();
    for index in 0..live {
        let config = NodeConfig {
            cluster: kvd::node::ClusterConfig {
                shard: kvshared::routing::ShardId { index, count: live + 1 },
                ..Default::default()
            },
            engine: kvd::node::EngineConfig {
                map_shards: 8,
                ..Default::default()
            },
            ..NodeConfig::default()
        };
        nodes.push(LocalNode::start(config).await.unwrap());
    }
    let mut addrs: Vec<String> = nodes.iter().map(|n| n.addr.to_string()).collect();
    addrs.push(kvtestkit::addr());
    (nodes, addrs)
}

fn parse(args: &[&str]) -> Command {
    Cli::try_parse_from(std::iter::once("kvbench").chain(args.iter().copied()))
        .unwrap()
        .command
}

/// Parses a `kvbench run` command line and runs it against its `--nodes`.
async fn run(args: &[&str]) -> kvbench::result::RunResult {
    let Command::Run(args) = parse(&[&["run"], args].concat()) else {
        unreachable!("not a run command")
    };
    let cluster = kvbench::connect::cluster(&args.bench.cluster).await.unwrap();
    let plan = RunPlan {
        show_progress: false,
        ..RunPlan::from_args(&args)
    };
    run_plan(cluster, &plan, &Interrupt::default()).await.unwrap()
}

async fn server_ops(cluster: &Cluster) -> u64 {
    let mut total = 0;
    for n in 0..cluster.node_count() {
        total += cluster.stats(n).await.unwrap().counts.ops();
    }
    total
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_reports_every_field_and_matches_the_servers_counts() {
    let nodes = LocalCluster::start(2, |_| {}).await.unwrap();
    let list = nodes.addrs().join(",");
    let cluster = Arc::new(Cluster::connect(&nodes.addrs(), ClientConfig::default()).await.unwrap());
    let plan = kvbench::load::LoadPlan {
        records: 2000,
        value_size: 32,
        key_prefix: String::new(),
        batch: 256,
        tasks: 2,
        seed: 1,
        ttl: None,
    };
    kvbench::load::load(cluster.clone(), &plan, Arc::new(AtomicU64::new(0)))
        .await
        .unwrap();
    let before = server_ops(&cluster).await;
    assert_eq!(before, 2000, "the load wrote each record once");

    let r = run(&[
        "--nodes",
        &list,
        "--records",
        "2000",
        "--value-size",
        "32",
        "--tasks",
        "4",
        "--batch",
        "16",
        "--warmup",
        "200ms",
        "--duration",
        "1s",
        "--workload",
        "f",
    ])
    .await;
    let after = server_ops(&cluster).await;

    // Every op the client saw acknowledged (warm-up included) is one the servers counted.
    assert_eq!(after - before, r.wire_ops_completed);
    assert!(r.ops > 0 && r.ops_per_sec > 0.0);
    assert_eq!(r.failed_ops, 0);
    assert_eq!(r.read_misses, 0, "all keys were loaded");
    assert_eq!(r.per_node.len(), 2);
    assert!(r.per_node.iter().all(|n| n.ops > 0 && n.server.is_some()));
    assert_eq!(r.per_node.iter().map(|n| n.ops).sum::<u64>(), r.ops);
    assert!(r.ops_by_type.contains_key("read") && r.ops_by_type.contains_key("read_modify_write"));

    let json: serde_json::Value = serde_json::to_value(&r).unwrap();
    for field in [
        "kvbench_version",
        "machine",
        "options",
        "workload",
        "elapsed_s",
        "ops",
        "ops_per_sec",
        "per_node",
        "per_second",
        "latency_us",
        "histograms",
        "errors",
        "client_cpu_percent",
        "command_line",
    ] {
        assert!(json.get(field).is_some(), "missing {field}");
    }
    assert_eq!(json["options"]["tasks"], 4);
    assert_eq!(json["options"]["batch"], 16);
    assert_eq!(json["workload"]["workload"], "f");
    assert!(json["machine"]["cores"].as_u64().unwrap() >= 1);
    for k in ["read", "read_modify_write", "batch"] {
        let l = &json["latency_us"][k];
        assert!(l["p50_us"].as_f64().unwrap() > 0.0, "{k}");
        assert!(l["p99_us"].as_f64().unwrap() >= l["p50_us"].as_f64().unwrap());
        assert!(json["histograms"][k].as_str().unwrap().len() > 10);
    }
}

/// The schedule bounds an open-loop run from both sides: it must send the ops it is asked
/// for (the run ends on the op count, not on a clock), and it may not send them faster than
/// the rate allows (a slow machine can only take longer, never shorter).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn open_loop_keeps_to_its_rate_and_says_so() {
    let nodes = LocalCluster::start(1, |_| {}).await.unwrap();
    let list = nodes.addrs().join(",");
    let r = run(&[
        "--nodes",
        &list,
        "--records",
        "100",
        "--tasks",
        "2",
        "--batch",
        "10",
        "--warmup",
        "0s",
        "--duration",
        "60s",
        "--ops",
        "1000",
        "--rate",
        "2000",
    ])
    .await;
    assert!(r.open_loop);
    assert!(r.ops >= 1000, "stopped after {} of 1000 ops", r.ops);
    // 1000 ops at 2000 op/s take 0.5 s; one batch per task may be due at once.
    assert!(
        r.elapsed_s >= (1000.0 - 20.0) / 2000.0,
        "{} ops in {:.3} s: faster than 2000 op/s",
        r.ops,
        r.elapsed_s
    );
    assert!(kvbench::report::summary(&r).contains("coordinated omission corrected"));
}

/// Three nodes, one dead from the start: ops for it fail at once (counted as node_down),
/// no task ever pauses while other nodes are up, and the live nodes get their share.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_node_does_not_stall_the_ops_for_live_nodes() {
    use kvbench::engine::{self, EngineConfig, Live};
    use kvbench::workload::{Shared, SpecOptions, Workload, WorkloadSpec};

    let (_nodes, addrs) = with_a_node_down(2).await;
    let cluster = Arc::new(Cluster::new(&addrs, ClientConfig::default()).unwrap());
    let spec = WorkloadSpec::new(
        Workload::B,
        &SpecOptions {
            records: 1000,
            value_size: 16,
            ..SpecOptions::default()
        },
    );
    let cfg = EngineConfig {
        tasks: 4,
        batch: 8,
        warmup: std::time::Duration::ZERO,
        duration: std::time::Duration::from_secs(60),
        ops_limit: Some(20_000),
        rate: None,
        seed: 3,
        cache_aside: false,
        split_reads: false,
        threads: 2,
    };
    let live = Live::new(&cfg);
    let out = engine::run(cluster, Shared::new(spec, 3), cfg, live).await;
    assert_eq!(out.pauses, 0, "a task paused although two nodes were up");
    assert!(
        out.errors.get("node_down").copied().unwrap_or(0) > 0,
        "{:?}",
        out.errors
    );
    assert!(out.per_node_ops[0] > 0 && out.per_node_ops[1] > 0);
    assert_eq!(out.per_node_ops[2], 0);
    // The dead node's share failed; the live nodes' share went through.
    let ok = out.per_node_ops[0] + out.per_node_ops[1];
    assert!(out.failed_ops < ok, "failed {} vs ok {ok}", out.failed_ops);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_dying_mid_run_fails_only_its_ops_and_the_run_ends() {
    let mut nodes = LocalCluster::start(2, |_| {}).await.unwrap();
    let list = nodes.addrs().join(",");
    let Command::Run(args) = parse(&[
        "run",
        "--nodes",
        &list,
        "--records",
        "1000",
        "--tasks",
        "4",
        "--batch",
        "8",
        "--warmup",
        "0s",
        "--duration",
        "1h",
        "--timeout",
        "1s",
    ]) else {
        unreachable!()
    };
    let cluster = kvbench::connect::cluster(&args.bench.cluster).await.unwrap();
    let watch = Cluster::connect(&nodes.addrs(), ClientConfig::default()).await.unwrap();
    let served = |node: usize| {
        let watch = &watch;
        async move { watch.stats(node).await.map(|s| s.counts.ops()).unwrap_or(0) }
    };
    let dying = nodes.nodes.pop().unwrap();
    let plan = RunPlan::from_args(&args);
    let interrupt = Interrupt::default();
    let run = tokio::spawn({
        let interrupt = interrupt.clone();
        async move { run_plan(cluster, &plan, &interrupt).await }
    });
    // The node dies once the run is under way on both; the run is ended once the live node
    // has served 1,000 more ops after the death (so the dead node's share has failed).
    until_async("the run to be under way", HANG, || async {
        let (a, b) = (served(0).await, served(1).await);
        if a > 0 && b > 0 { Ok(()) } else { Err((a, b)) }
    })
    .await;
    dying.stop().await;
    let after_death = served(0).await;
    until_async("the live node to serve on", HANG, || async {
        let now = served(0).await;
        if now >= after_death + 1000 { Ok(()) } else { Err(now) }
    })
    .await;
    interrupt.trigger();
    let r = tokio::time::timeout(HANG, run)
        .await
        .expect("the run hung after a node died")
        .unwrap()
        .unwrap();
    assert!(r.failed_ops > 0, "ops to the dead node are reported as failed");
    assert!(
        r.errors
            .keys()
            .any(|k| k == "node_down" || k == "connect" || k == "shutting_down"),
        "{:?}",
        r.errors
    );
    assert!(r.per_node[0].ops > 0, "the live node kept serving");
}

/// `-w hotkey --phases`: the hot spot moves from shard to shard on schedule, and the
/// result's per-node timeline shows where the batches went second by second.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_moving_hot_spot_follows_its_phases_in_the_timeline() {
    let nodes = LocalCluster::start(2, |_| {}).await.unwrap();
    let list = nodes.addrs().join(",");
    let r = run(&[
        "--nodes",
        &list,
        "--records",
        "4000",
        "-w",
        "hotkey",
        "--phases",
        "0:2s,1:2s",
        "--duration",
        "5500ms",
        "--warmup",
        "0s",
        "--tasks",
        "4",
        "--batch",
        "16",
    ])
    .await;
    assert_eq!(r.failed_ops, 0, "{:?}", r.errors);
    assert_eq!(r.node_timeline.len(), 2);
    let batches = |node: usize, second: usize| r.node_timeline[node].get(second).map_or(0, |l| l.count());
    // Only reads and writes of the hot node's keys: in seconds 0-1 and 4-5 node 0 is hot, in
    // seconds 2-3 node 1. Each phase's second second is looked at: a batch answered just
    // after a phase changed may still belong to the phase before (a task reads the clock
    // once per 256 ops), however slow the machine.
    for (second, hot) in [(1, 0), (3, 1), (5, 0)] {
        let (on_hot, on_cold) = (batches(hot, second), batches(1 - hot, second));
        assert!(
            on_hot > 10 * on_cold.max(1),
            "second {second}: hot node {hot} {on_hot}, other {on_cold}"
        );
    }
    let wl = r.workload.as_ref().unwrap();
    assert!(wl.describe().contains("0 for 2s, then 1 for 2s"), "{}", wl.describe());
    let dir = kvtestkit::temp_dir("kvbench-timeline");
    let stem = dir.path().join("timeline");
    kvbench::timeline::chart(&r.node_timeline, &r.options.nodes, "test", &stem).unwrap();
    assert!(std::fs::metadata(stem.with_extension("png")).unwrap().len() > 5_000);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_two_by_two_sweep_writes_csv_and_charts() {
    let nodes = LocalCluster::start(1, |_| {}).await.unwrap();
    let list = nodes.addrs().join(",");
    let scratch = kvtestkit::temp_dir("kvbench-sweep");
    let out = scratch.path().join("out");
    let Command::Sweep(args) = parse(&[
        "sweep",
        "--nodes",
        &list,
        "--records",
        "500",
        "--tasks",
        "1,4",
        "--batch",
        "1,32",
        "--warmup",
        "100ms",
        "--duration",
        "300ms",
        "--out",
        out.to_str().unwrap(),
    ]) else {
        unreachable!()
    };
    let code = kvbench::sweep::command(args, Interrupt::default()).await.unwrap();
    assert_eq!(code, std::process::ExitCode::SUCCESS);
    let csv = std::fs::read_to_string(out.join("sweep.csv")).unwrap();
    let lines: Vec<&str> = csv.lines().collect();
    assert_eq!(lines.len(), 5, "header and four points:\n{csv}");
    assert!(lines[0].contains("ops_per_sec") && lines[0].contains("batch_p99_us"));
    for chart in ["throughput-vs-batch", "throughput-vs-tasks", "latency-vs-batch"] {
        let png = std::fs::metadata(out.join(format!("{chart}.png"))).unwrap();
        assert!(png.len() > 5_000, "{chart}.png is empty");
        assert!(out.join(format!("{chart}.svg")).exists());
    }
    assert!(out.join("point-t4-b32.json").exists());
}

/// A cache-size sweep flushes and caps the node at each size, runs cache-aside, and finds
/// the hit ratio of kvd's sampled LRU close to an exact LRU's on the same keys (uniform over
/// 100 keys: the ratio is the fraction of the keys the cache holds).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cache_sweep_compares_hit_ratios_with_exact_lru() {
    let nodes = LocalCluster::start(1, |_| {}).await.unwrap();
    let list = nodes.addrs().join(",");
    let scratch = kvtestkit::temp_dir("kvbench-cache-sweep");
    let out = scratch.path().join("out");
    let Command::Sweep(args) = parse(&[
        "sweep",
        "--nodes",
        &list,
        "-w",
        "getpopular",
        "--cache-sizes",
        "12kb,18kb,64kb",
        "--tasks",
        "4",
        "--batch",
        "16",
        "--warmup",
        "300ms",
        "--duration",
        "500ms",
        "--out",
        out.to_str().unwrap(),
    ]) else {
        unreachable!()
    };
    let code = kvbench::sweep::command(args, Interrupt::default()).await.unwrap();
    assert_eq!(code, std::process::ExitCode::SUCCESS);
    let points: Vec<serde_json::Value> =
        serde_json::from_slice(&std::fs::read(out.join("cache.json")).unwrap()).unwrap();
    assert_eq!(points.len(), 3);
    for p in &points {
        let (kvd, exact) = (
            p["hit_ratio"].as_f64().unwrap(),
            p["exact_lru_hit_ratio"].as_f64().unwrap(),
        );
        assert!((kvd - exact).abs() < 0.05, "{p}");
    }
    assert!(
        points[0]["keys_held"].as_u64().unwrap() < 100,
        "the smallest cache holds some keys"
    );
    assert!(points[0]["evicted"].as_u64().unwrap() > 0);
    assert_eq!(points[2]["keys_held"], 100, "the largest cache holds them all");
    assert!(out.join("hit-ratio-vs-cache-size.png").exists());
    assert!(std::fs::read_to_string(out.join("cache.csv")).unwrap().lines().count() == 4);
    // The node is left uncapped, as it was.
    let client = kvshared::client::Cluster::connect(&nodes.addrs(), ClientConfig::default())
        .await
        .unwrap();
    assert_eq!(client.stats(0).await.unwrap().max_memory_bytes, 0);
}

#[test]
fn the_binary_explains_an_unreachable_cluster() {
    let dead = kvtestkit::addr();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_kvbench"))
        .args(["run", "--nodes", &dead, "--duration", "1s"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("cannot reach the cluster") && err.contains(&dead), "{err}");

    // With no --nodes at all and nothing on the default port (held here, never listened
    // on), the hint says how to start kvd.
    let _default = kvtestkit::port::hold("127.0.0.1:7070").unwrap_or_else(|e| {
        panic!("port 7070 is in use on this machine ({e}): this test checks the hint kvbench gives when nothing listens there")
    });
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_kvbench"))
        .args(["run", "--duration", "1s"])
        .env_remove("KV_NODES")
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("kvd --listen 127.0.0.1:7070"), "{err}");
}

#[test]
fn dry_run_measures_generation_without_a_cluster() {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_kvbench"))
        .args(["run", "--dry-run", "--duration", "300ms", "--records", "10000"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("op/s per core") && text.contains("bytes/op"), "{text}");
}

/// A node that accepts connections and then answers nothing (as a SIGSTOPped kvd does):
/// once its requests have gone unanswered for the stall threshold (its floor, 1 s, on a fresh
/// connection), the tasks park them and go on,
/// so the other nodes' ops keep flowing every second while the stalled ones wait for their
/// timeout; they end as failed (`stalled` or `timeout`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frozen_node_does_not_stop_the_other_nodes_ops() {
    use kvbench::engine::{self, EngineConfig, Live};
    use kvbench::workload::{Shared, SpecOptions, Workload, WorkloadSpec};

    let (_nodes, addrs) = with_a_node_down(2).await;
    // The third node accepts and then answers nothing: a listening socket on its held port.
    let frozen = kvtestkit::port::listener_for(&addrs[2]).unwrap().unwrap();
    frozen.set_nonblocking(true).unwrap();
    let frozen = tokio::net::TcpListener::from_std(frozen).unwrap();
    let holder = tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((socket, _)) = frozen.accept().await {
            held.push(socket);
        }
    });
    let cluster = Arc::new(
        Cluster::new(
            &addrs,
            ClientConfig {
                request_timeout: std::time::Duration::from_secs(4),
                pipeline: 4,
                ..ClientConfig::default()
            },
        )
        .unwrap(),
    );
    let spec = WorkloadSpec::new(
        Workload::B,
        &SpecOptions {
            records: 1000,
            value_size: 16,
            ..SpecOptions::default()
        },
    );
    let cfg = EngineConfig {
        tasks: 8,
        batch: 8,
        warmup: std::time::Duration::ZERO,
        duration: std::time::Duration::from_secs(5),
        ops_limit: None,
        rate: None,
        seed: 5,
        cache_aside: false,
        split_reads: false,
        threads: 2,
    };
    let live = Live::new(&cfg);
    let out = tokio::time::timeout(
        std::time::Duration::from_secs(30),
        engine::run(cluster, Shared::new(spec, 5), cfg, live),
    )
    .await
    .expect("the run hung on a frozen node");
    holder.abort();
    // Seconds 2..5: the stall was found within the first second and a half, and from then
    // on the live nodes' ops flow although the frozen node's requests still wait.
    let seconds = &out.per_second;
    assert!(seconds.len() >= 4, "{seconds:?}");
    for (i, &ops) in seconds.iter().enumerate().skip(2) {
        assert!(ops > 0, "second {i} had no ops while one node was frozen: {seconds:?}");
    }
    assert!(out.per_node_ops[0] > 0 && out.per_node_ops[1] > 0);
    assert_eq!(out.per_node_ops[2], 0);
    assert!(
        out.errors.contains_key("stalled") || out.errors.contains_key("timeout"),
        "{:?}",
        out.errors
    );
}

/// Nodes listed out of shard order: kvbench refuses to start and says why, instead of
/// reporting millions of refused ops.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_list_out_of_order_is_refused_at_start() {
    let nodes = LocalCluster::start(2, |_| {}).await.unwrap();
    let mut addrs = nodes.addrs();
    addrs.reverse();
    let Command::Run(args) = parse(&["run", "--nodes", &addrs.join(","), "--duration", "1s"]) else {
        unreachable!()
    };
    let err = kvbench::connect::cluster(&args.bench.cluster).await.err().unwrap();
    let text = format!("{err:#}");
    assert!(
        text.contains("--nodes does not match the cluster") && text.contains("list the nodes in shard order"),
        "{text}"
    );
}

/// A node dying mid-load: the error says how many records were stored and that running the
/// load again starts over.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_load_cut_short_says_how_far_it_got() {
    let mut nodes = LocalCluster::start(2, |_| {}).await.unwrap();
    let list = nodes.addrs().join(",");
    let Command::Load(args) = parse(&[
        "load",
        "--nodes",
        &list,
        "--records",
        "20000000",
        "--value-size",
        "16",
        "--quiet",
        "--timeout",
        "1s",
    ]) else {
        unreachable!()
    };
    let dying = nodes.nodes.pop().unwrap();
    let killer = tokio::spawn(async move {
        tokio::time::sleep(std::time::Duration::from_millis(300)).await;
        dying.stop().await;
    });
    let err = tokio::time::timeout(std::time::Duration::from_secs(60), kvbench::load::command(args))
        .await
        .expect("the load hung after a node died")
        .expect_err("the load cannot finish with a node gone");
    killer.await.unwrap();
    let text = format!("{err:#}");
    assert!(
        text.contains("the load stopped after") && text.contains("of 20,000,000 records were stored"),
        "{text}"
    );
    assert!(text.contains("does not resume"), "{text}");
}

/// `--ttl`: a load's puts set times to live from the range (every key is volatile), and
/// once they pass, the nodes' active expiry removes the keys nobody touches.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_load_with_ttl_sets_times_to_live_and_the_keys_expire() {
    let nodes = LocalCluster::start(2, |_| {}).await.unwrap();
    let cluster = Arc::new(Cluster::connect(&nodes.addrs(), ClientConfig::default()).await.unwrap());
    let plan = kvbench::load::LoadPlan {
        records: 2000,
        value_size: 32,
        key_prefix: String::new(),
        batch: 256,
        tasks: 2,
        seed: 1,
        ttl: Some(kvbench::workload::ttl::TtlRange::parse("300ms..600ms").unwrap()),
    };
    kvbench::load::load(cluster.clone(), &plan, Arc::new(AtomicU64::new(0)))
        .await
        .unwrap();
    let mut volatile = 0;
    for node in 0..2 {
        volatile += cluster.stats(node).await.unwrap().volatile_keys;
    }
    assert_eq!(volatile, 2000);
    until_async("every key to expire", HANG, || async {
        let mut keys = 0;
        for node in 0..2 {
            keys += cluster.stats(node).await.unwrap().keys;
        }
        if keys == 0 { Ok(()) } else { Err(keys) }
    })
    .await;
}

/// Slots moved between the two nodes while the load runs: ops answered `Moved` (after a
/// move) or `TryAgain` (during one) are sent again to the owner and succeed; none fails.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ops_redirected_by_a_slot_move_are_sent_again_and_succeed() {
    use kvbench::engine::{self, EngineConfig, Live};
    use kvbench::workload::{Shared, SpecOptions, Workload, WorkloadSpec};

    let nodes = LocalCluster::start(2, |_| {}).await.unwrap();
    let addrs = nodes.addrs();
    let cluster = Arc::new(Cluster::connect(&addrs, ClientConfig::default()).await.unwrap());
    let load = kvbench::load::LoadPlan {
        records: 2000,
        value_size: 16,
        key_prefix: String::new(),
        batch: 256,
        tasks: 2,
        seed: 7,
        ttl: None,
    };
    kvbench::load::load(cluster.clone(), &load, Arc::new(AtomicU64::new(0)))
        .await
        .unwrap();
    // Two connections per node: the load runs on two threads, each with a client of its own.
    let two_conns = ClientConfig {
        conns_per_node: 2,
        ..ClientConfig::default()
    };
    let cluster = Arc::new(Cluster::connect(&addrs, two_conns).await.unwrap());
    let spec = WorkloadSpec::new(
        Workload::A,
        &SpecOptions {
            records: 2000,
            value_size: 16,
            ..SpecOptions::default()
        },
    );
    let cfg = EngineConfig {
        tasks: 4,
        batch: 16,
        warmup: std::time::Duration::ZERO,
        // Ended below, after the moves (the duration only bounds a hang).
        duration: HANG,
        ops_limit: None,
        rate: None,
        seed: 7,
        cache_aside: false,
        split_reads: false,
        threads: 2,
    };
    let live = Live::new(&cfg);
    let run = tokio::spawn(engine::run(cluster, Shared::new(spec, 7), cfg, live.clone()));
    let groups = kvd::control::move_slots::Groups::new(&addrs, ClientConfig::default()).unwrap();
    for (from, to) in [(0, 1), (1, 0), (0, 1)] {
        // Ops before each move, whatever this machine's speed.
        more(&live, 2_000).await;
        kvd::control::move_slots::move_slots(&groups, (from, to), &[[0, 4095]], 64)
            .await
            .unwrap();
    }
    more(&live, 2_000).await;
    live.stop_early();
    let out = tokio::time::timeout(HANG, run).await.expect("the run hung").unwrap();
    assert!(out.redirected > 0, "no op was redirected: {:?}", out.errors);
    assert_eq!(out.failed_ops, 0, "{:?}", out.errors);
    assert!(out.ops() > 0);
    // The two threads' tasks shared their thread's histograms: each op counted once.
    for (hist, &ops) in out.hists.iter().zip(&out.ops_by_type) {
        assert_eq!(hist.len(), ops);
    }
    // A load through a client that still believes the even split: the records of moved
    // slots are redirected, sent again and stored.
    let stale = Arc::new(Cluster::connect(&addrs, ClientConfig::default()).await.unwrap());
    kvbench::load::load(stale.clone(), &load, Arc::new(AtomicU64::new(0)))
        .await
        .unwrap();
    assert!(stale.redirects().0 > 0);
    // A new client learns where the slots went from the groups, before any redirect.
    let fresh = Cluster::connect(&addrs, ClientConfig::default()).await.unwrap();
    assert_eq!(fresh.learn_slot_map().await, 4096);
    assert!((0..4096).all(|s| fresh.slots().owner(s) == 1));
    assert!((4096..8192).all(|s| fresh.slots().owner(s) == 0));
    assert_eq!(fresh.redirects(), (0, 0));
    // The nodes count what they moved (kvd stats, kvtui): 4,096 slots in twice, out once.
    let (s0, s1) = (fresh.stats(0).await.unwrap(), fresh.stats(1).await.unwrap());
    assert_eq!((s1.counts.slots_in, s1.counts.slots_out), (8192, 4096));
    assert_eq!((s0.counts.slots_in, s0.counts.slots_out), (4096, 8192));
    assert!(s1.counts.keys_loaded > 0 && s0.counts.keys_loaded > 0);
    let summary = s1.moves_summary(Some(1500.0)).unwrap();
    assert!(summary.starts_with("in 8,192 slots (1.5k keys/s), "), "{summary}");
    assert!(summary.ends_with("; out 4,096 slots"), "{summary}");
}

/// Four keys of group 0's slots take all the load (40/30/20/10%): `rebalance --by load`
/// moves the hottest slot and then the one that evens the rest to group 1, and every key
/// still reads back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rebalance_by_load_moves_hot_slots_to_the_idle_group() {
    use kvshared::client::Op;
    use kvshared::routing::key_slot;

    let nodes = LocalCluster::start(2, |_| {}).await.unwrap();
    let addrs = nodes.addrs();
    let cluster = Arc::new(Cluster::connect(&addrs, ClientConfig::default()).await.unwrap());
    let mut hot: Vec<(String, u16)> = Vec::new();
    for i in 0.. {
        let key = format!("hot-{i}");
        let slot = key_slot(key.as_bytes());
        if slot < 8192 && hot.iter().all(|(_, s)| *s != slot) {
            hot.push((key, slot));
        }
        if hot.len() == 4 {
            break;
        }
    }
    for (key, _) in &hot {
        cluster.put(key.as_bytes(), b"v").await.unwrap();
    }
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let load = {
        let (cluster, stop, hot) = (cluster.clone(), stop.clone(), hot.clone());
        tokio::spawn(async move {
            let mut ops = Vec::new();
            for ((key, _), weight) in hot.iter().zip([40, 30, 20, 10]) {
                ops.extend(std::iter::repeat_n(Op::Get(key.as_bytes()), weight));
            }
            let began = std::time::Instant::now();
            while !stop.load(std::sync::atomic::Ordering::Relaxed) && began.elapsed() < HANG {
                for r in cluster.batch(&ops).await {
                    r.unwrap();
                }
            }
        })
    };
    let groups = kvd::control::move_slots::Groups::new(&addrs, ClientConfig::default()).unwrap();
    kvd::control::reshard::rebalance_by_load(&groups, std::time::Duration::from_secs(1), 64)
        .await
        .unwrap();
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    load.await.unwrap();
    let table = groups.table(1).await.unwrap();
    let at_one: Vec<bool> = hot
        .iter()
        .map(|(_, s)| table[usize::from(*s)].state == kvshared::slots::SlotState::Owned)
        .collect();
    assert_eq!(at_one, [true, false, false, true], "{hot:?}");
    let fresh = Cluster::connect(&addrs, ClientConfig::default()).await.unwrap();
    for (key, _) in &hot {
        assert_eq!(fresh.get(key.as_bytes()).await.unwrap().as_deref(), Some(&b"v"[..]));
    }
}

/// `--conns N` is the connections per node the load uses, and the run's own client adds one
/// per node (stats, the slot map), not N more: the load threads send over connections of
/// their own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_opens_its_load_connections_and_one_more_per_node() {
    let nodes = LocalCluster::start(1, |_| {}).await.unwrap();
    let addr = nodes.addrs()[0].clone();
    let watch = Cluster::connect(std::slice::from_ref(&addr), ClientConfig::default())
        .await
        .unwrap();
    let before = watch.stats(0).await.unwrap().counts.conns_opened;
    let r = run(&[
        "--nodes",
        &addr,
        "--records",
        "500",
        "--conns",
        "3",
        "--threads",
        "3",
        "--tasks",
        "6",
        "--batch",
        "8",
        "--warmup",
        "100ms",
        "--duration",
        "500ms",
    ])
    .await;
    assert!(r.ops > 0);
    assert_eq!(r.options.threads, 3);
    let opened = watch.stats(0).await.unwrap().counts.conns_opened - before;
    // The layout check's one (closed at once), the run's client's one, the load's three.
    assert_eq!(opened, 1 + 1 + 3, "connections the run opened");
}
