//! `--data-dir` against the real binary: nothing acknowledged is lost across `kill -9`, the
//! history across restarts is linearizable, and damaged files are refused or passed over as
//! the operator was promised.

mod common;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use common::{HANG, Kvd, Recorder, TempDir, addr, kvd, start, start_at, temp_dir, until_async};
use kvshared::client::{ClientConfig, Cluster, RecordConfig};
use kvshared::history::{CheckOptions, Return, Verdict, check, render_timeline};
use parking_lot::Mutex;

/// A snapshot every 200 log entries: the kills below land before, during and after
/// snapshots, and restarts recover from snapshot plus log, not from the log alone.
const DURABLE: [&str; 4] = ["--fsync", "always", "--snapshot-every", "200entries"];

/// Per key: the last value a put of it was acknowledged with, and the last one attempted.
#[derive(Default, Clone, Copy)]
struct Seen {
    acked: u64,
    tried: u64,
}

/// Starts a durable kvd on `dir`, on a port held for the test (so that it can be restarted
/// at the same address).
fn start_on(dir: &str) -> (Kvd, String) {
    let at = addr();
    (restart_at(&at, dir), at)
}

/// Restarts a durable kvd on the address it had (clients reconnect to it).
fn restart_at(addr: &str, dir: &str) -> Kvd {
    let mut args = vec!["--data-dir", dir];
    args.extend(DURABLE);
    start_at(addr, &args).0
}

fn scratch(name: &str) -> TempDir {
    temp_dir(&format!("durability-{name}"))
}

fn snapshots_in(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
    let mut found: Vec<_> = std::fs::read_dir(dir)
        .unwrap()
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "snap"))
        .collect();
    found.sort();
    found
}

fn next(rng: &mut u64) -> u64 {
    *rng ^= *rng << 13;
    *rng ^= *rng >> 7;
    *rng ^= *rng << 17;
    *rng
}

/// 20 times: four writers put increasing values to their own keys while kvd is killed with
/// SIGKILL at a random moment; restarted on the same directory, every key must hold its
/// last acknowledged value or the one in flight at the kill (never an older one), and the
/// writes go on from there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acknowledged_writes_survive_kill_9() {
    let dir = scratch("crash");
    let dir_s = dir.path().display().to_string();
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
        // Some writes acknowledged in this round, then a random moment.
        let acked = |seen: &Mutex<HashMap<String, Seen>>| seen.lock().values().map(|s| s.acked).sum::<u64>();
        let target = acked(&seen) + 5;
        until_async("writes acknowledged before the kill", HANG, || async {
            let now = acked(&seen);
            if now >= target { Ok(()) } else { Err(now) }
        })
        .await;
        tokio::time::sleep(Duration::from_millis(next(&mut rng) % 100)).await;
        server.kill();
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
    assert!(
        !snapshots_in(dir.path()).is_empty(),
        "no snapshot was taken between the kills"
    );
    let stats = kvd(&["stats", "--nodes", &addr]);
    let text = String::from_utf8_lossy(&stats.stdout);
    assert!(stats.status.success());
    assert!(
        text.contains("durable, fsync always") && text.contains("fsyncs"),
        "{text}"
    );
    drop(server);
}

/// A data directory of another shard is refused, naming it.
#[test]
fn a_data_dir_of_another_shard_is_refused() {
    let dir = scratch("shard");
    let dir_s = dir.path().display().to_string();
    let (server, _) = start(&["--shard", "0/2", "--data-dir", &dir_s]);
    drop(server);
    let out = kvd(&["--shard", "1/2", "--listen", "127.0.0.1:0", "--data-dir", &dir_s]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("holds shard 0/2") && err.contains(&dir_s), "{err}");
}

/// Clients record a history of gets, puts (unique values) and deletes while kvd is killed
/// with SIGKILL 20 times and restarted on the same address and data dir; the project's
/// checker must find the whole history, across the restarts, linearizable. An acknowledged
/// write lost by a crash shows up as a later get that reads an older value.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_history_across_kill_9_restarts_is_linearizable() {
    let dir = scratch("history");
    let dir_s = dir.path().display().to_string();
    let (server, addr) = start_on(&dir_s);
    let cluster = Arc::new(
        Cluster::connect(
            std::slice::from_ref(&addr),
            ClientConfig {
                request_timeout: Duration::from_secs(2),
                connect_timeout: Duration::from_millis(500),
                ..ClientConfig::default()
            },
        )
        .await
        .unwrap(),
    );
    let config = RecordConfig {
        clients: 8,
        keys: 12,
        key_prefix: "crash-".into(),
        ttl_ms: None,
        duration: HANG,
        max_ops_per_client: 1_000_000,
        seed: 12,
        get_percent: 50,
        put_percent: 40,
        progress: None,
    };
    let recorder = Recorder::start(&cluster, config);
    let mut server = Some(server);
    let mut rng = 0x9e37_79b9_7f4a_7c15u64;
    for _ in 0..20 {
        // Ops served since the last restart, then a random moment.
        recorder.more(40).await;
        tokio::time::sleep(Duration::from_millis(next(&mut rng) % 100)).await;
        let mut killed = server.take().unwrap();
        killed.kill();
        let (addr, dir_s) = (addr.clone(), dir_s.clone());
        server = Some(
            tokio::task::spawn_blocking(move || restart_at(&addr, &dir_s))
                .await
                .unwrap(),
        );
    }
    // Then the recording reads what the kills left.
    recorder.more(300).await;
    let recording = recorder.finish().await;
    let ops = &recording.history.operations;
    let acked_puts = ops.iter().filter(|o| o.ret == Return::Stored).count();
    let unknown = ops.iter().filter(|o| o.ret == Return::Unknown).count();
    eprintln!(
        "{} ops recorded, {acked_puts} puts acknowledged, {unknown} cut by kills, {} refused",
        ops.len(),
        recording.refused_total()
    );
    assert!(acked_puts > 200, "only {acked_puts} puts acknowledged");
    assert!(unknown > 0, "no op was cut by a kill: the kills missed the load");
    assert!(
        !snapshots_in(dir.path()).is_empty(),
        "no snapshot was taken between the kills"
    );
    let report = check(&recording.history, &CheckOptions::default());
    match &report.verdict {
        Verdict::Linearizable => {}
        Verdict::NotLinearizable(f) => panic!(
            "not linearizable across kill -9 ({} ops, {unknown} cut by kills):\n{}",
            ops.len(),
            render_timeline(f)
        ),
        other => panic!("check undecided: {other:?}"),
    }
    drop(server);
}

/// Puts `k0`, `k1`, ... (value `v<n>`) through a durable kvd on `dir` (a snapshot every 200
/// entries) until `keys` are written and `snapshots` snapshot files exist, then kills it.
/// Returns how many keys were written.
async fn fill(dir: &str, keys: u32, snapshots: usize) -> u32 {
    let (mut server, addr) = start_on(dir);
    let cluster = Cluster::connect(std::slice::from_ref(&addr), ClientConfig::default())
        .await
        .unwrap();
    let mut n = 0;
    while n < keys || snapshots_in(std::path::Path::new(dir)).len() < snapshots {
        // (Bounded: 200 entries make a snapshot.)
        assert!(
            n < keys + 200 * (snapshots as u32 + 2),
            "{n} puts made too few snapshots"
        );
        cluster
            .put(format!("k{n}").as_bytes(), format!("v{n}").as_bytes())
            .await
            .unwrap();
        n += 1;
    }
    server.kill();
    n
}

/// Runs a durable kvd on `dir` that is expected to refuse to start; gives its exit code and
/// stderr. One that starts serving instead fails the test.
fn start_failing(dir: &str) -> (Option<i32>, String) {
    let mut args = vec!["--data-dir", dir];
    args.extend(DURABLE);
    match kvtestkit::kvd::try_start(&args) {
        Ok(kvd) => panic!("kvd started on {dir}; it printed:\n{}", kvd.log()),
        Err(exited) => (exited.status.code(), exited.output),
    }
}

/// A flipped byte in the middle of the log (not a torn tail) stops kvd at start, with an
/// error naming the segment and saying what to do; it never serves a shortened history.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_corrupt_log_record_is_refused_naming_the_file() {
    let dir = scratch("corrupt-log");
    let dir_s = dir.path().display().to_string();
    // Fewer writes than a snapshot needs: the whole history is in the log.
    fill(&dir_s, 100, 0).await;
    let segment = std::fs::read_dir(dir.path().join("log"))
        .unwrap()
        .filter_map(|e| e.ok().map(|e| e.path()))
        .find(|p| p.extension().is_some_and(|x| x == "seg"))
        .expect("a log segment");
    let mut bytes = std::fs::read(&segment).unwrap();
    let middle = bytes.len() / 2;
    bytes[middle] ^= 0x40;
    std::fs::write(&segment, &bytes).unwrap();
    let (code, err) = start_failing(&dir_s);
    assert_eq!(code, Some(2), "{err}");
    let name = segment.file_name().unwrap().to_string_lossy().into_owned();
    assert!(err.contains(&name) && err.contains("corrupt"), "{err}");
}

/// A damaged vote file is refused as what it is, naming it (not as a snapshot, which kvd
/// would fall back from: a vote has no older copy).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_corrupt_vote_file_is_refused_as_the_vote() {
    let dir = scratch("corrupt-vote");
    let dir_s = dir.path().display().to_string();
    fill(&dir_s, 10, 0).await;
    let vote = dir.path().join("vote");
    let mut bytes = std::fs::read(&vote).expect("a vote file");
    let last = bytes.len() - 1;
    bytes[last] ^= 0x40;
    std::fs::write(&vote, &bytes).unwrap();
    let (code, err) = start_failing(&dir_s);
    assert_eq!(code, Some(2), "{err}");
    assert!(
        err.contains(&vote.display().to_string()) && err.contains("the raft vote file is damaged"),
        "{err}"
    );
}

/// A damaged newest snapshot is passed over with a warning naming it; the older snapshot
/// and the log after it still hold every acknowledged write.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_corrupt_newest_snapshot_falls_back_to_the_older_one() {
    let dir = scratch("corrupt-snap");
    let dir_s = dir.path().display().to_string();
    // Single puts are one entry each; two snapshots are kept.
    let written = fill(&dir_s, 500, 2).await;
    let snaps = snapshots_in(dir.path());
    assert_eq!(snaps.len(), 2, "{snaps:?}");
    let newest = snaps.last().unwrap();
    let mut bytes = std::fs::read(newest).unwrap();
    let middle = bytes.len() / 2;
    bytes[middle] ^= 0x40;
    std::fs::write(newest, &bytes).unwrap();

    let mut args = vec!["--data-dir", dir_s.as_str()];
    args.extend(DURABLE);
    let (server, addr) = common::start_capturing(&args);
    let cluster = Cluster::connect(std::slice::from_ref(&addr), ClientConfig::default())
        .await
        .unwrap();
    for k in [0, 1, written / 2, written - 2, written - 1] {
        let got = cluster.get(format!("k{k}").as_bytes()).await.unwrap();
        assert_eq!(got.as_deref(), Some(format!("v{k}").as_bytes()), "k{k}");
    }
    let log = server.1;
    let name = newest.file_name().unwrap().to_string_lossy().into_owned();
    assert!(log.contains(&name), "no warning names {name}:\n{log}");
    drop(server.0);

    // With both damaged, the log from entry 0 is still on disk here (one segment: nothing
    // was cut), so kvd replays all of it. (Where the log's start is gone too, it refuses to
    // start: `snapshots_cut_the_log_and_recovery_falls_back_when_one_is_damaged`.)
    // (Another byte than before: the restart may have rewritten the newest snapshot, or may
    // have been killed while doing so, and a second flip of the same byte would undo the first.)
    for snap in snapshots_in(dir.path()) {
        let mut bytes = std::fs::read(&snap).unwrap();
        let third = bytes.len() / 3;
        bytes[third] ^= 0x40;
        std::fs::write(&snap, &bytes).unwrap();
    }
    let (server, addr) = common::start_capturing(&args);
    let cluster = Cluster::connect(std::slice::from_ref(&addr), ClientConfig::default())
        .await
        .unwrap();
    for k in [0, written - 1] {
        let got = cluster.get(format!("k{k}").as_bytes()).await.unwrap();
        assert_eq!(got.as_deref(), Some(format!("v{k}").as_bytes()), "k{k}");
    }
    assert!(server.1.matches(".snap").count() >= 2, "{}", server.1);
    drop(server.0);
}

/// A durable node never drops acknowledged data: eviction and flush are refused.
#[test]
fn eviction_and_flush_are_refused_on_a_durable_node() {
    let dir = scratch("refusals");
    let dir_s = dir.path().display().to_string();
    let out = kvd(&["--listen", "127.0.0.1:0", "--data-dir", &dir_s, "--max-memory", "100mb"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("--eviction none"), "{err}");

    let (server, addr) = start(&["--data-dir", &dir_s]);
    let out = kvd(&["config", "--nodes", &addr, "--flush"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "flush was accepted");
    assert!(err.contains("does not flush"), "{err}");
    drop(server);
}
