//! kvbench against real kvd nodes on 127.0.0.1: the result is complete and agrees with the
//! servers' own counters; sweeps write their CSV and charts; a dying node does not hang a run.

use std::sync::Arc;
use std::sync::atomic::AtomicU64;

use clap::Parser;
use kvbench::cli::{Cli, Command};
use kvd::local::LocalCluster;
use kvshared::client::{ClientConfig, Cluster};

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
    let cluster = kvbench::connect::cluster(&args.cluster).await.unwrap();
    kvbench::run::run_with(cluster, &args, false).await.unwrap()
}

async fn server_ops(cluster: &Cluster) -> u64 {
    let mut total = 0;
    for n in 0..cluster.node_count() {
        total += cluster.stats(n).await.unwrap().ops();
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
        "1s",
        "--rate",
        "2000",
    ])
    .await;
    assert!(r.open_loop);
    // Never more than the schedule allows (plus one batch per task of slack).
    assert!(r.ops <= 2000 + 20, "sent {} ops at 2000 op/s for 1 s", r.ops);
    assert!(kvbench::report::summary(&r).contains("coordinated omission corrected"));
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
        "2s",
        "--timeout",
        "1s",
    ]) else {
        unreachable!()
    };
    let cluster = kvbench::connect::cluster(&args.cluster).await.unwrap();
    let dying = nodes.nodes.pop().unwrap();
    let killer = tokio::spawn(async move {
        tokio::time::sleep(std::time::Duration::from_millis(500)).await;
        dying.stop().await;
    });
    let r = tokio::time::timeout(
        std::time::Duration::from_secs(20),
        kvbench::run::run_with(cluster, &args, false),
    )
    .await
    .expect("the run hung after a node died")
    .unwrap();
    killer.await.unwrap();
    assert!(r.failed_ops > 0, "ops to the dead node are reported as failed");
    assert!(
        r.errors.keys().any(|k| k == "node_down" || k == "connect"),
        "{:?}",
        r.errors
    );
    assert!(r.per_node[0].ops > 0, "the live node kept serving");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_two_by_two_sweep_writes_csv_and_charts() {
    let nodes = LocalCluster::start(1, |_| {}).await.unwrap();
    let list = nodes.addrs().join(",");
    let out = std::env::temp_dir().join(format!("kvbench-sweep-test-{}", std::process::id()));
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
    kvbench::sweep::command(args).await.unwrap();
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
    std::fs::remove_dir_all(&out).unwrap();
}

#[test]
fn the_binary_explains_an_unreachable_cluster() {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_kvbench"))
        .args(["run", "--nodes", "127.0.0.1:1", "--duration", "1s"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("cannot reach the cluster") && err.contains("127.0.0.1:1"),
        "{err}"
    );

    // With no --nodes at all and nothing on the default port, the hint says how to start kvd.
    if std::net::TcpListener::bind("127.0.0.1:7070").is_ok() {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_kvbench"))
            .args(["run", "--duration", "1s"])
            .env_remove("KV_NODES")
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains("kvd --listen 127.0.0.1:7070"), "{err}");
    }
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
