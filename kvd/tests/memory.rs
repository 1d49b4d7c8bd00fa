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
