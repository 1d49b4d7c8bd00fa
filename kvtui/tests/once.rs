//! `kvtui --once --json` against two live nodes and one dead address.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use kvd::local::LocalCluster;
use kvshared::client::{ClientConfig, Cluster, Op};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn once_json_reports_live_nodes_with_moving_counters_and_the_dead_one_as_down() {
    let cluster = LocalCluster::start(2, |_| {}).await.unwrap();
    // An address nothing listens on (held for the test, so nothing else can take it).
    let dead = kvtestkit::addr();
    let mut nodes = cluster.addrs();
    nodes.push(dead.clone());

    // Load in the background until kvtui has finished sampling (so the load surely
    // overlaps both samples, however slow the machine), bounded by a deadline and a count.
    let client = Arc::new(
        Cluster::connect(&cluster.addrs(), ClientConfig::default())
            .await
            .unwrap(),
    );
    let sampled = Arc::new(AtomicBool::new(false));
    let load = tokio::spawn({
        let (client, sampled) = (client.clone(), sampled.clone());
        async move {
            let keys: Vec<String> = (0..64).map(|i| format!("k{i}")).collect();
            let ops: Vec<Op<'_>> = keys.iter().map(|k| Op::Put(k.as_bytes(), b"v")).collect();
            let until = tokio::time::Instant::now() + kvtestkit::HANG;
            for _ in 0..10_000_000 {
                if sampled.load(Ordering::Relaxed) || tokio::time::Instant::now() >= until {
                    break;
                }
                let _ = client.batch(&ops).await;
            }
        }
    });
    // The load has started before kvtui takes its first sample.
    while client.stats(0).await.unwrap().counts.puts == 0 {
        tokio::task::yield_now().await;
    }

    let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_kvtui"))
        .args(["--once", "--json", "--interval", "500ms", "--nodes", &nodes.join(",")])
        .env_remove("KV_NODES")
        .output()
        .await
        .unwrap();
    sampled.store(true, Ordering::Relaxed);
    load.await.unwrap();
    assert_eq!(
        out.status.code(),
        Some(1),
        "a node down is a failure scripts can see: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let rows = report["nodes"].as_array().unwrap();
    assert_eq!(rows.len(), 3);
    for (i, row) in rows.iter().take(2).enumerate() {
        assert_eq!(row["up"], true, "{row}");
        assert_eq!(row["shard"], format!("{i}/2"));
        assert!(row["ops_per_sec"].as_f64().unwrap() > 0.0, "counters moved: {row}");
        assert!(row["puts"].as_u64().unwrap() > 0);
        assert!(row["rss_bytes"].as_u64().unwrap() > 0);
        // Two distinct kvd CPU samples apart, under load: never a spurious 0.
        assert!(row["cpu_percent"].as_f64().unwrap() > 0.0, "CPU 0 under load: {row}");
        assert!(row["p99_us"].as_f64().unwrap() > 0.0, "server latency: {row}");
        assert!(row["net_in_per_sec"].as_f64().unwrap() > 0.0);
    }
    assert!(
        report["total"]["net_in_per_sec"].as_f64().unwrap() > 0.0,
        "named as per node"
    );
    // Two nodes of a 2-node cluster and a third address: the list does not match.
    let problems = report["problems"].as_array().unwrap();
    assert!(
        problems.iter().any(|p| p
            .as_str()
            .unwrap()
            .contains("a cluster of 2 nodes, but --nodes lists 3")),
        "{problems:?}"
    );
    assert_eq!(rows[2]["up"], false);
    assert!(rows[2]["error"].as_str().unwrap().contains(&dead.to_string()));
    assert_eq!(report["total"]["up"], 2);
    assert_eq!(report["total"]["nodes"], 3);

    // Without --json: the table as text.
    let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_kvtui"))
        .args(["--once", "--interval", "200ms", "--nodes", &nodes.join(",")])
        .output()
        .await
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        text.contains("NODE") && text.contains("TOTAL") && text.contains("is down"),
        "{text}"
    );

    // No node answers: no total to speak of (null, not zeros).
    let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_kvtui"))
        .args(["--once", "--json", "--interval", "100ms", "--nodes", &dead.to_string()])
        .output()
        .await
        .unwrap();
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(report["total"].is_null(), "{report}");

    // Every node up: exit 0.
    let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_kvtui"))
        .args(["--once", "--interval", "100ms", "--nodes", &cluster.addrs().join(",")])
        .output()
        .await
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stderr));
}
