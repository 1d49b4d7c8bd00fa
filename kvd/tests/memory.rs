//! `--max-memory` against the real binary: the cap holds (in kvd's accounting and in RSS),
//! `none` refuses writes with a clear error, and `kvd config` changes the cap at run time.

mod common;

use common::{kvd, rss_bytes, start};
use kvshared::client::{ClientConfig, ClientError, Cluster, Op};

fn stats(addr: &str) -> serde_json::Value {
    let out = kvd(&["stats", "--nodes", addr, "--json"]);
    serde_json::from_slice::<serde_json::Value>(&out.stdout).unwrap()[0]["stats"].clone()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cap_holds_and_none_refuses_until_the_cap_is_raised() {
    let (server, addr) = start(&["--max-memory", "8mb", "--eviction", "none"]);
    let before = rss_bytes(server.pid());
    let cluster = Cluster::connect(std::slice::from_ref(&addr), ClientConfig::default())
        .await
        .unwrap();
    let value = vec![3u8; 1000];
    let keys: Vec<String> = (0..20_000).map(|i| format!("key{i}")).collect();
    let mut refused = 0;
    for chunk in keys.chunks(500) {
        let ops: Vec<Op> = chunk.iter().map(|k| Op::Put(k.as_bytes(), &value)).collect();
        for r in cluster.batch(&ops).await {
            match r {
                Ok(_) => {}
                Err(e @ ClientError::OutOfMemory { .. }) => {
                    refused += 1;
                    assert!(e.to_string().contains("no memory"), "{e}");
                }
                Err(e) => panic!("{e}"),
            }
        }
    }
    let s = stats(&addr);
    assert!(refused > 10_000, "20 MB of puts into an 8 MB cap: {refused} refused");
    assert!(s["memory_used_bytes"].as_u64().unwrap() <= 8_000_000, "{s}");
    assert_eq!(s["out_of_memory"], refused);
    assert_eq!(s["evicted"], 0);
    assert!(
        rss_bytes(server.pid()) < before + 8_000_000 + (40 << 20),
        "RSS {} MB",
        rss_bytes(server.pid()) >> 20
    );
    // Reads and deletes still work at the cap.
    assert!(cluster.get(b"key0").await.unwrap().is_some());
    assert!(cluster.delete(b"key0").await.unwrap());
    // Raised at run time, the cap lets the refused writes in.
    let raised = kvd(&["config", "--nodes", &addr, "--max-memory", "64mb"]);
    assert_eq!(
        raised.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&raised.stderr)
    );
    cluster.put(b"key19999", &value).await.unwrap();
    assert_eq!(stats(&addr)["max_memory_bytes"], 64_000_000);
    let table = String::from_utf8_lossy(&kvd(&["stats", "--nodes", &addr]).stdout).to_string();
    assert!(table.contains("DATA") && table.contains("/64.0 MB"), "{table}");
    // And flushed, nothing is left.
    assert_eq!(kvd(&["config", "--nodes", &addr, "--flush"]).status.code(), Some(0));
    assert_eq!(stats(&addr)["keys"], 0);
    drop(server);
}

/// Issue 58: under a churn of mixed value sizes (100 B to 1 MiB over random keys, from 8
/// clients at once, 40 times the cap written), RSS comes back within the cap plus 8 MiB
/// once the writes end, for each policy that evicts: freed memory goes back to the OS
/// (`kvd::alloc`). (It stayed at twice the cap and more: 127-143 MB for a 64 MB cap.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rss_comes_back_within_the_cap_after_a_churn_of_mixed_sizes() {
    const CAP: u64 = 64_000_000;
    const MARGIN: u64 = 8 << 20;
    for policy in ["lru", "random"] {
        let (server, addr) = start(&["--max-memory", "64mb", "--eviction", policy]);
        let idle = rss_bytes(server.pid());
        let cluster = std::sync::Arc::new(
            Cluster::connect(
                std::slice::from_ref(&addr),
                ClientConfig {
                    conns_per_node: 8,
                    ..ClientConfig::default()
                },
            )
            .await
            .unwrap(),
        );
        let clients: Vec<_> = (0..8u64)
            .map(|c| {
                let cluster = cluster.clone();
                tokio::spawn(async move { churn(&cluster, c, 40 * CAP / 8).await })
            })
            .collect();
        for c in clients {
            c.await.unwrap();
        }
        let s = stats(&addr);
        assert!(s["memory_used_bytes"].as_u64().unwrap() <= CAP, "{s}");
        assert!(s["evicted"].as_u64().unwrap() > 0, "{s}");
        let pid = server.pid();
        eprintln!(
            "{policy}: RSS {} MB after the churn (idle {} MB)",
            rss_bytes(pid) >> 20,
            idle >> 20
        );
        common::until(
            &format!("{policy}: RSS within the cap plus {} MB", MARGIN >> 20),
            common::HANG,
            || {
                let rss = rss_bytes(pid);
                if rss <= idle + CAP + MARGIN {
                    Ok(())
                } else {
                    Err(format!("RSS {} MB (idle {} MB)", rss >> 20, idle >> 20))
                }
            },
        );
        drop(server);
    }
}

/// Puts of 100 B, 4 KiB, 64 KiB and 1 MiB in turn over 20,000 random keys, four to a
/// batch, until `bytes` are written.
async fn churn(cluster: &Cluster, seed: u64, bytes: u64) {
    let values: Vec<Vec<u8>> = [100usize, 4096, 65_536, 1 << 20]
        .iter()
        .map(|&n| vec![7u8; n])
        .collect();
    let mut rng = 0x9e37_79b9_7f4a_7c15u64 ^ seed.wrapping_mul(0x2545_f491_4f6c_dd1d);
    let (mut written, mut round) = (0u64, 0usize);
    while written < bytes {
        let keys: Vec<String> = (0..4)
            .map(|_| {
                rng ^= rng << 13;
                rng ^= rng >> 7;
                rng ^= rng << 17;
                format!("churn{}", rng % 20_000)
            })
            .collect();
        let ops: Vec<Op> = keys
            .iter()
            .enumerate()
            .map(|(i, k)| Op::Put(k.as_bytes(), &values[(round + i) % values.len()]))
            .collect();
        for r in cluster.batch(&ops).await {
            r.unwrap();
        }
        written += (0..ops.len())
            .map(|i| values[(round + i) % values.len()].len() as u64)
            .sum::<u64>();
        round += 1;
    }
}
