//! kvtui over a replica group whose membership moved away from `--nodes`: the leader handed
//! to a member `--nodes` leaves out is found from the group (its row is added, the totals
//! are the leader's), a removed member says so, and followers show the writes they apply
//! apart from the ops they serve. Real kvd processes (the `kvd` built beside `kvtui`).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

fn kvd_binary() -> PathBuf {
    kvtestkit::kvd::binary("kvd")
}

fn kvd(args: &[&str]) -> String {
    let out = Command::new(kvd_binary())
        .args(args)
        .env_remove("KV_NODES")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "kvd {args:?}: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).to_string()
}

/// `kvtui --once --json` over `nodes`: its rows by address.
fn once(nodes: &str) -> serde_json::Value {
    let out = Command::new(env!("CARGO_BIN_EXE_kvtui"))
        .args(["--once", "--json", "--interval", "500ms", "--nodes", nodes])
        .env_remove("KV_NODES")
        .output()
        .unwrap();
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&out.stderr)))
}

fn row<'a>(report: &'a serde_json::Value, addr: &str) -> &'a serde_json::Value {
    let rows = report["nodes"].as_array().unwrap();
    rows.iter()
        .find(|r| r["addr"] == addr)
        .unwrap_or_else(|| panic!("no row for {addr}: {report}"))
}

/// Starts a group of three on fresh data dirs and has one command make it a group.
fn start_group(scratch: &Path) -> (Vec<kvtestkit::kvd::Kvd>, Vec<String>) {
    let addrs: Vec<String> = (0..3).map(|_| kvtestkit::addr()).collect();
    let mut members = Vec::new();
    for (i, addr) in addrs.iter().enumerate() {
        let dir = scratch.join(format!("m{i}"));
        let group = addrs.join(",");
        members.push(kvtestkit::kvd::start(&[
            "--listen",
            addr,
            "--data-dir",
            dir.to_str().unwrap(),
            "--group",
            &group,
        ]));
    }
    kvd(&["admin", "init-group", "--nodes", &addrs.join("|")]);
    (members, addrs)
}

#[test]
fn a_moved_leader_is_found_and_a_removed_member_says_so() {
    let scratch = kvtestkit::temp_dir("kvtui-groups");
    let (_members, addrs) = start_group(scratch.path());
    let all = addrs.join("|");
    for i in 0..20 {
        kvd(&["put", "--nodes", &all, &format!("k{i}"), "v"]);
    }
    // The lead goes to the third member, which the dashboard's --nodes leaves out.
    let out = kvd(&["admin", "transfer-leader", "--nodes", &all, &addrs[2]]);
    assert!(out.contains(&format!("leader {}", addrs[2])), "{out}");
    let listed = addrs[..2].join("|");
    // Load until kvtui has sampled (so it overlaps both samples, however slow the machine;
    // bounded by a count): followers apply what they do not serve.
    let sampled = Arc::new(AtomicBool::new(false));
    let load = std::thread::spawn({
        let (all, sampled) = (all.clone(), sampled.clone());
        move || {
            for i in 0..100_000 {
                if sampled.load(Ordering::Relaxed) {
                    break;
                }
                let _ = Command::new(kvd_binary())
                    .args(["put", "--nodes", &all, &format!("load{}", i % 5), "v"])
                    .output();
            }
        }
    });
    let report = once(&listed);
    sampled.store(true, Ordering::Relaxed);
    load.join().unwrap();
    let leader = row(&report, &addrs[2]);
    assert_eq!(leader["learned"], true, "{leader}");
    assert_eq!(leader["role"], "leader", "{leader}");
    assert!(
        report["total"]["keys"].as_u64().unwrap() >= 20,
        "the leader's keys count: {report}"
    );
    let follower = row(&report, &addrs[0]);
    assert_eq!(follower["learned"], false);
    assert_eq!(follower["role"], "follower", "{follower}");
    assert_eq!(
        follower["puts_per_sec"].as_f64(),
        Some(0.0),
        "a follower serves no write: {follower}"
    );
    assert!(
        follower["applied_per_sec"].as_f64().unwrap() > 0.0,
        "it applies them: {follower}"
    );

    // The first member leaves the group; it keeps running and still believes it follows.
    kvd(&["admin", "remove-replica", "--nodes", &all, &addrs[0]]);
    kvtestkit::until("the removed member to be shown removed", kvtestkit::HANG, || {
        let report = once(&all);
        match row(&report, &addrs[0])["removed"] == true {
            true => {
                assert_eq!(row(&report, &addrs[1])["removed"], false);
                Ok(())
            }
            false => Err(report),
        }
    });
}
