//! The real multi-host flow, `scripts/run-cluster.sh`, on hosts made on this machine: four
//! network-namespace hosts (three kvd, one client) linked by a bridge, a short benchmark and
//! a short linearizability check across them, then everything torn down. Namespaces and
//! cgroups need root: these tests are ignored without it (`.ci/run` runs them as root), and
//! fail, saying why, when run without what they need.

use std::path::{Path, PathBuf};
use std::process::Command;

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap().to_path_buf()
}

/// Removes the namespaces even if the test fails half way (the script's own trap does too).
struct Teardown {
    prefix: String,
}

impl Drop for Teardown {
    fn drop(&mut self) {
        let _ = Command::new(repo_root().join("scripts/local-cluster.sh"))
            .args(["--prefix", &self.prefix, "down"])
            .output();
    }
}

/// Fails the test, saying why, unless this machine can make network-namespace hosts.
fn require_namespaces() {
    kvtestkit::tools::require_root("run-cluster.sh --local's hosts");
    if let Err(why) = namespaces_available() {
        panic!("network namespaces are needed: {why}");
    }
}

/// The directory with kvd and kvbench (where `cargo test --workspace` built them).
fn bin_dir() -> PathBuf {
    kvtestkit::kvd::binary("kvd").parent().unwrap().to_path_buf()
}

fn namespaces_available() -> Result<(), String> {
    let uid = Command::new("id").arg("-u").output().map_err(|e| e.to_string())?;
    if String::from_utf8_lossy(&uid.stdout).trim() != "0" {
        return Err("not running as root".into());
    }
    // (A name of its own per call: the tests of this file ask at the same time.)
    static PROBES: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let n = PROBES.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let probe = format!("kvprobe{}-{n}", std::process::id() % 100_000);
    let add = Command::new("ip")
        .args(["netns", "add", &probe])
        .output()
        .map_err(|e| format!("no ip command ({e}); install iproute2"))?;
    if !add.status.success() {
        return Err(format!(
            "cannot make a namespace: {}",
            String::from_utf8_lossy(&add.stderr).trim()
        ));
    }
    let _ = Command::new("ip").args(["netns", "del", &probe]).output();
    Ok(())
}

/// Whether the machine has a cgroup CPU controller `local-cluster.sh --cpu` can use.
fn cpu_quota_available() -> bool {
    let v2 = std::fs::read_to_string("/sys/fs/cgroup/cgroup.controllers")
        .is_ok_and(|c| c.split_whitespace().any(|w| w == "cpu"));
    v2 || Path::new("/sys/fs/cgroup/cpu/cpu.cfs_quota_us").exists()
        || Path::new("/sys/fs/cgroup/cpu,cpuacct/cpu.cfs_quota_us").exists()
}

/// `local-cluster.sh up 1 --cpu 0.1`: what the host runs is held to its quota (the kernel
/// throttles its cgroup), `status` shows the quota, and `down` removes the cgroup.
#[test]
#[ignore = "needs root: network namespaces and a cgroup CPU controller (.ci/run runs it, as root)"]
fn a_host_with_a_cpu_quota_is_throttled_and_its_cgroup_removed() {
    require_namespaces();
    assert!(cpu_quota_available(), "this test needs a cgroup CPU controller");
    let prefix = format!("kvq{}", std::process::id() % 10_000);
    let _teardown = Teardown { prefix: prefix.clone() };
    let script = repo_root().join("scripts/local-cluster.sh");
    let run = |args: &[&str]| {
        let out = Command::new(&script)
            .args(["--prefix", &prefix])
            .args(args)
            .output()
            .unwrap();
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(out.status.success(), "local-cluster {args:?} failed: {text}");
        text
    };
    run(&["up", "1", "--cpu", "0.1"]);
    let group = ["/sys/fs/cgroup", "/sys/fs/cgroup/cpu", "/sys/fs/cgroup/cpu,cpuacct"]
        .iter()
        .map(|root| Path::new(root).join(format!("kvd-{prefix}0")))
        .find(|p| p.exists())
        .expect("up --cpu made no cgroup for the host");
    assert!(run(&["status"]).contains("cpu: 0.10 cores"));
    // A busy loop, bounded to one second, on the host: a tenth of a core cannot keep it
    // running, so the kernel throttles the host's cgroup.
    let _ = Command::new(&script)
        .args([
            "--prefix",
            &prefix,
            "exec",
            "0",
            "timeout",
            "1",
            "sh",
            "-c",
            "while :; do :; done",
        ])
        .output()
        .unwrap();
    let stat = std::fs::read_to_string(group.join("cpu.stat")).unwrap();
    let throttled: u64 = stat
        .lines()
        .find_map(|l| l.strip_prefix("nr_throttled "))
        .and_then(|n| n.trim().parse().ok())
        .unwrap_or_else(|| panic!("no nr_throttled in {stat}"));
    assert!(throttled > 0, "the busy loop was never throttled: {stat}");
    run(&["down"]);
    assert!(!group.exists(), "down left {}", group.display());
}

#[test]
#[ignore = "needs root: network-namespace hosts (.ci/run runs it, as root)"]
fn run_cluster_across_hosts_merges_results_and_checks_linearizability() {
    require_namespaces();
    let bin_dir = bin_dir();
    let prefix = format!("kvt{}", std::process::id() % 10_000);
    let mode = "--local";
    let _teardown = Teardown { prefix: prefix.clone() };
    let scratch = kvtestkit::temp_dir("run-cluster");
    let logs = scratch.path().to_path_buf();
    // Four hosts of half a core each (the machine's two cores), where quotas can be had.
    let cpu: &[&str] = if mode == "--local" && cpu_quota_available() {
        &["--cpu", "0.5"]
    } else {
        &[]
    };
    let out = Command::new(repo_root().join("scripts/run-cluster.sh"))
        .args(cpu)
        .args([
            mode,
            "--records",
            "20000",
            "--port",
            "17170",
            "--check",
            "1s",
            "--bin-dir",
            bin_dir.to_str().unwrap(),
            "--logs",
            logs.to_str().unwrap(),
            "3",
            "1",
            "--threads 1",
            "--duration 2s --warmup 500ms --tasks 16 --batch 32",
        ])
        .env("KV_NS_PREFIX", &prefix)
        .env("KV_NO_BUILD", "1")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "run-cluster failed:\n{stdout}\n{stderr}");

    let run = logs.join("latest");
    let merged: serde_json::Value = serde_json::from_slice(&std::fs::read(run.join("merged.json")).unwrap()).unwrap();
    assert!(merged["ops"].as_u64().unwrap() > 0, "{merged}");
    assert_eq!(merged["failed_ops"], 0, "{}", merged["errors"]);
    assert_eq!(merged["errors"], serde_json::json!({}));
    let nodes = merged["per_node"].as_array().unwrap();
    assert_eq!(nodes.len(), 3);
    for n in nodes {
        assert!(n["ops"].as_u64().unwrap() > 0, "every node served ops: {n}");
        if mode == "--local" {
            assert!(n["addr"].as_str().unwrap().starts_with("198.18.77."), "{n}");
        }
    }
    let check = std::fs::read_to_string(run.join("check.txt")).unwrap();
    assert!(check.contains("verdict    LINEARIZABLE"), "{check}");
    for f in [
        "summary.txt",
        "stats-end.txt",
        "client-0.json",
        "kvd-0.log",
        "kvd-2.log",
        "history.json",
    ] {
        assert!(run.join(f).exists(), "{f} missing in {}", run.display());
    }
    // Nothing is left behind.
    let links = Command::new("ip").args(["-o", "link", "show"]).output();
    if let Ok(links) = links {
        let text = String::from_utf8_lossy(&links.stdout);
        assert!(!text.contains(&format!("{prefix}v")), "veth links left: {text}");
    }
}

/// `run-cluster.sh --replicas 3` on namespace hosts: two shards, each a replica group of
/// three kvd (`--group`, a data directory each) on hosts of their own; the benchmark and a
/// linearizability check go through `--nodes "A|B|C,D|E|F"`, and every member reports its
/// role. The check runs under the nemesis, a leader's kill -9 (restarted a second later)
/// and a leader cut off from the other hosts, stays linearizable, and reports how long each
/// fault kept its shard from answering. Where namespaces cannot be made, the same runs on
/// loopback ports with kills and pauses (a partition needs links to cut).
#[test]
#[ignore = "needs root: network-namespace hosts (.ci/run runs it, as root)"]
fn run_cluster_starts_replica_groups() {
    require_namespaces();
    let bin_dir = bin_dir();
    let prefix = format!("kvg{}", std::process::id() % 10_000);
    let _teardown = Teardown { prefix: prefix.clone() };
    let (mode, faults) = ("--local", "kill,partition");
    let scratch = kvtestkit::temp_dir("run-cluster-groups");
    let logs = scratch.path().to_path_buf();
    let out = Command::new(repo_root().join("scripts/run-cluster.sh"))
        .args([
            mode,
            "--replicas",
            "3",
            "--records",
            "5000",
            "--port",
            "17270",
            "--check",
            "6s",
            "--nemesis",
            faults,
            "--nemesis-every",
            "1",
            "--bin-dir",
            bin_dir.to_str().unwrap(),
            "--logs",
            logs.to_str().unwrap(),
            "2",
            "1",
            "--threads 1",
            "--duration 1s --warmup 200ms --tasks 8 --batch 16",
        ])
        .env("KV_NO_BUILD", "1")
        .env("KV_NS_PREFIX", &prefix)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "run-cluster failed:\n{stdout}\n{stderr}");
    let run = logs.join("latest");
    let check = std::fs::read_to_string(run.join("check.txt")).unwrap();
    assert!(check.contains("verdict    LINEARIZABLE"), "{check}");
    let injected = std::fs::read_to_string(run.join("nemesis.txt")).unwrap();
    assert!(injected.lines().count() >= 2, "faults were injected: {injected}");
    for fault in faults.split(',') {
        assert!(
            injected.contains(match fault {
                "kill" => "kill -9",
                "pause" => "SIGSTOP",
                _ => "cut off",
            }),
            "no {fault} among the faults: {injected}"
        );
        // The check reports each fault's unavailability (or that the recording ended first).
        assert!(
            check
                .lines()
                .any(|l| l.trim_start().starts_with(fault) && l.contains("shard")),
            "no {fault} line in the check's fault report:\n{check}"
        );
    }
    let stats = std::fs::read_to_string(run.join("stats-end.txt")).unwrap();
    // (Right after a fault a group may be between leaders: only roles are required here.)
    assert!(stats.contains(" leader ") && stats.contains(" follower "), "{stats}");
    for h in 0..6 {
        assert!(
            run.join(format!("data-{h}")).is_dir(),
            "member {h} has its data directory"
        );
    }
}

/// The stale-read bound under faults, as a user would check it: a replica group of three,
/// `kvbench check --reads stale --max-staleness 500ms` while the nemesis pauses a random
/// member (SIGSTOP for 1 s) and cuts a follower off from every other host for 2 s, in turn.
/// The check measures each acknowledged get's staleness against the history and its status
/// says whether every get kept to the bound (plus 100 ms of measurement slack). Before the
/// lease, a member frozen for a second served gets a second stale when it woke. Where
/// namespaces cannot be made, pauses only, on loopback ports.
#[test]
#[ignore = "needs root: network-namespace hosts (.ci/run runs it, as root)"]
fn run_cluster_stale_reads_keep_their_bound_under_pauses_and_isolation() {
    require_namespaces();
    let bin_dir = bin_dir();
    let prefix = format!("kvs{}", std::process::id() % 10_000);
    let _teardown = Teardown { prefix: prefix.clone() };
    let (mode, faults) = ("--local", "pause,isolate");
    let scratch = kvtestkit::temp_dir("run-cluster-stale");
    let logs = scratch.path().to_path_buf();
    let out = Command::new(repo_root().join("scripts/run-cluster.sh"))
        .args([
            mode,
            "--replicas",
            "3",
            "--records",
            "1000",
            "--port",
            "17300",
            "--check",
            "10s",
            "--check-args",
            "--reads stale --max-staleness 500ms --clients 12 --keys 20",
            "--nemesis",
            faults,
            "--nemesis-every",
            "1",
            "--bin-dir",
            bin_dir.to_str().unwrap(),
            "--logs",
            logs.to_str().unwrap(),
            "1",
            "1",
            "--threads 1",
            "--duration 1s --warmup 200ms --tasks 4 --batch 16",
        ])
        .env("KV_NO_BUILD", "1")
        .env("KV_NS_PREFIX", &prefix)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    let stdout = String::from_utf8_lossy(&out.stdout);
    let run = logs.join("latest");
    let check = std::fs::read_to_string(run.join("check.txt")).unwrap_or_default();
    assert!(out.status.success(), "run-cluster failed:\n{stdout}\n{stderr}\n{check}");
    assert!(check.contains("the bound HELD"), "{check}");
    let injected = std::fs::read_to_string(run.join("nemesis.txt")).unwrap();
    for (fault, line) in [("pause", "SIGSTOP"), ("isolate", "a follower) cut off")] {
        if faults.contains(fault) {
            assert!(injected.contains(line), "no {fault} among the faults: {injected}");
        }
    }
}
