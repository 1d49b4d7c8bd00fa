//! What the kvbench binary tells a script: exit statuses, and Ctrl-C keeping the partial
//! result (like oha).

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use kvd::local::LocalCluster;
use kvshared::client::{ClientConfig, Cluster};

fn kvbench(args: &[&str]) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_kvbench"));
    c.args(args).env_remove("KV_NODES");
    c
}

/// Runs kvbench to completion off the async runtime (the nodes run on it).
async fn output(args: Vec<&str>) -> std::process::Output {
    let args: Vec<String> = args.into_iter().map(String::from).collect();
    tokio::task::spawn_blocking(move || {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        kvbench(&args).output().unwrap()
    })
    .await
    .unwrap()
}

/// Failed ops make `kvbench run` exit 1, unless failures are allowed. The failures here:
/// the nodes have a memory cap too small for any write and refuse to evict, so every
/// update is refused as out of memory.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failed_ops_give_exit_status_1_unless_allowed() {
    let cluster = LocalCluster::start(2, |c| {
        c.engine.memory = Some(kvd::store::MemoryLimit {
            max_bytes: 1,
            eviction: kvd::store::Eviction::None,
        })
    })
    .await
    .unwrap();
    let nodes = cluster.addrs().join(",");
    let common = [
        "run",
        "--nodes",
        &nodes,
        "--records",
        "200",
        "--tasks",
        "2",
        "--batch",
        "8",
        "--warmup",
        "0s",
        "--duration",
        "60s",
        "--ops",
        "2000",
        "-q",
    ];
    let out = output(common.to_vec()).await;
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("out_of_memory"), "{stdout}");
    assert_eq!(out.status.code(), Some(1), "{}", String::from_utf8_lossy(&out.stderr));

    let allowed = output([&common[..], &["--allow-failures"]].concat()).await;
    assert_eq!(allowed.status.code(), Some(0));
}

/// Ctrl-C stops the load, prints the partial result marked as interrupted, writes --json,
/// and exits 130.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ctrl_c_reports_the_partial_run_and_exits_130() {
    let cluster = LocalCluster::start(1, |_| {}).await.unwrap();
    let addrs = cluster.addrs();
    let client = Cluster::connect(&addrs, ClientConfig::default()).await.unwrap();
    let scratch = kvtestkit::temp_dir("kvbench-ctrl-c");
    let json = scratch.path().join("result.json");
    let child = kvbench(&[
        "run",
        "--nodes",
        &addrs[0],
        "--records",
        "200",
        "--tasks",
        "2",
        "--batch",
        "8",
        "--warmup",
        "200ms",
        "--duration",
        "120s",
        "--json",
        json.to_str().unwrap(),
    ])
    .stdout(Stdio::piped())
    .stderr(Stdio::piped())
    .spawn()
    .unwrap();

    // Wait for the event that matters: the load is flowing and the window has begun.
    let deadline = Instant::now() + kvtestkit::HANG;
    loop {
        if client.stats(0).await.unwrap().counts.ops() > 1000 {
            break;
        }
        assert!(Instant::now() < deadline, "kvbench never loaded the node");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // Past the warm-up (so the window is not empty), counted by the node's own progress.
    let target = client.stats(0).await.unwrap().counts.ops() * 2 + 10_000;
    while client.stats(0).await.unwrap().counts.ops() < target {
        assert!(Instant::now() < deadline, "kvbench stopped loading");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // The window opens 200 ms (the warm-up) after the engine starts; the engine is running,
    // so after 300 ms more it is open, however slow the machine.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let kill = Command::new("kill")
        .args(["-INT", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(kill.success());
    let out = tokio::task::spawn_blocking(move || child.wait_with_output().unwrap())
        .await
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        out.status.code(),
        Some(130),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("INTERRUPTED"), "{stdout}");
    assert!(stdout.contains("throughput"), "{stdout}");
    let result: serde_json::Value = serde_json::from_slice(&std::fs::read(&json).unwrap()).unwrap();
    assert_eq!(result["interrupted"], true);
    let elapsed = result["elapsed_s"].as_f64().unwrap();
    assert!(elapsed > 0.0 && elapsed < 120.0, "window {elapsed}");
    assert!(result["ops"].as_u64().unwrap() > 0);
}
