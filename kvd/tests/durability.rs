//! `--data-dir` against the real binary: nothing acknowledged is lost across `kill -9`.

mod common;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use common::{Kvd, kvd, start};
use kvshared::client::{ClientConfig, Cluster};
use parking_lot::Mutex;

/// Per key: the last value a put of it was acknowledged with, and the last one attempted.
#[derive(Default, Clone, Copy)]
struct Seen {
    acked: u64,
    tried: u64,
}

fn start_on(dir: &str) -> (Kvd, String) {
    start(&["--data-dir", dir, "--fsync", "always"])
}

/// 20 times: four writers put increasing values to their own keys while kvd is killed with
/// SIGKILL at a random moment; restarted on the same directory, every key must hold its
/// last acknowledged value or the one in flight at the kill (never an older one), and the
/// writes go on from there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acknowledged_writes_survive_kill_9() {
    let dir = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("crash-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let dir_s = dir.display().to_string();
    let seen: Arc<Mutex<HashMap<String, Seen>>> = Arc::default();
    let mut rng = 0x2545_f491_4f6c_dd1du64;
    let (mut server, mut addr) = start_on(&dir_s);
    let config = ClientConfig {
        request_timeout: Duration::from_secs(2),
        connect_timeout: Duration::from_secs(2),
        ..ClientConfig::default()
    };
    for kill in 0..20 {
        let cluster = Arc::new(
            Cluster::connect(std::slice::from_ref(&addr), config.clone())
                .await
                .unwrap(),
        );
        let writers: Vec<_> = (0..4)
            .map(|w| {
                let (cluster, seen) = (cluster.clone(), seen.clone());
                tokio::spawn(async move {
                    for n in 0u64.. {
                        let key = format!("w{w}-k{}", n % 8);
                        let next = seen.lock().get(&key).map_or(1, |s| s.tried + 1);
                        seen.lock().entry(key.clone()).or_default().tried = next;
                        match cluster.put(key.as_bytes(), next.to_string().as_bytes()).await {
                            Ok(()) => seen.lock().entry(key).or_default().acked = next,
                            Err(_) => return,
                        }
                    }
                })
            })
            .collect();
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        tokio::time::sleep(Duration::from_millis(30 + rng % 250)).await;
        server.0.kill().unwrap();
        server.0.wait().unwrap();
        for w in writers {
            w.await.unwrap();
        }
        (server, addr) = start_on(&dir_s);
        let check = Cluster::connect(std::slice::from_ref(&addr), config.clone())
            .await
            .unwrap();
        let expected = seen.lock().clone();
        for (key, s) in &expected {
            let got = check.get(key.as_bytes()).await.unwrap();
            let value: u64 = got
                .as_deref()
                .map_or(0, |v| std::str::from_utf8(v).unwrap().parse().unwrap());
            assert!(
                value >= s.acked && value <= s.tried,
                "after kill {kill}: {key} holds {value}, but {} was acknowledged ({} attempted)",
                s.acked,
                s.tried
            );
            // What is there now is what later writes build on.
            seen.lock().insert(
                key.clone(),
                Seen {
                    acked: value,
                    tried: value,
                },
            );
        }
    }
    let total: u64 = seen.lock().values().map(|s| s.acked).sum();
    assert!(total > 100, "only {total} writes acknowledged over 20 runs");
    let stats = kvd(&["stats", "--nodes", &addr, "--json"]);
    assert!(stats.status.success());
    drop(server);
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A data directory of another shard is refused, naming it.
#[test]
fn a_data_dir_of_another_shard_is_refused() {
    let dir = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("shard-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let dir_s = dir.display().to_string();
    let (server, _) = start(&["--shard", "0/2", "--data-dir", &dir_s]);
    drop(server);
    let out = kvd(&["--shard", "1/2", "--listen", "127.0.0.1:0", "--data-dir", &dir_s]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("holds shard 0/2") && err.contains(&dir_s), "{err}");
    std::fs::remove_dir_all(&dir).unwrap();
}
