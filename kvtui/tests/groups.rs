//! kvtui over a replica group whose membership moved away from `--nodes`: the leader handed
//! to a member `--nodes` leaves out is found from the group (its row is added, the totals
//! are the leader's), a removed member says so, and followers show the writes they apply
//! apart from the ops they serve. Real kvd processes (the `kvd` built beside `kvtui`).

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

fn kvd_binary() -> PathBuf {
    let path = Path::new(env!("CARGO_BIN_EXE_kvtui")).with_file_name("kvd");
    assert!(
        path.exists(),
        "{} is missing: build the workspace (cargo test --workspace builds it)",
        path.display()
    );
    path
}

/// A free port below the ephemeral range, distinct within this process.
fn free_port() -> u16 {
    use std::sync::atomic::{AtomicU32, Ordering};
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let start = std::process::id().wrapping_mul(104_729);
    for _ in 0..12_000 {
        let port = 20_000 + (start.wrapping_add(NEXT.fetch_add(1, Ordering::Relaxed)) % 12_000) as u16;
        if std::net::TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return port;
        }
    }
    panic!("no free port in 20000-31999 on 127.0.0.1");
}

/// Kills the kvd processes this test started (by their handles) when it ends.
struct Members(Vec<Child>);

impl Drop for Members {
    fn drop(&mut self) {
        for c in &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
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
fn start_group(scratch: &Path) -> (Members, Vec<String>) {
    let addrs: Vec<String> = (0..3).map(|_| format!("127.0.0.1:{}", free_port())).collect();
    let mut members = Members(Vec::new());
    for (i, addr) in addrs.iter().enumerate() {
        let dir = scratch.join(format!("m{i}"));
        let child = Command::new(kvd_binary())
            .args([
                "--listen",
                addr,
                "--data-dir",
                dir.to_str().unwrap(),
                "--group",
                &addrs.join(","),
            ])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        members.0.push(child);
    }
    let deadline = Instant::now() + Duration::from_secs(20);
    while addrs.iter().any(|a| std::net::TcpStream::connect(a).is_err()) {
        assert!(Instant::now() < deadline, "the members did not start listening");
        std::thread::sleep(Duration::from_millis(50));
    }
    kvd(&["admin", "init-group", "--nodes", &addrs.join("|")]);
    (members, addrs)
}

#[test]
fn a_moved_leader_is_found_and_a_removed_member_says_so() {
    let scratch = std::env::temp_dir().join(format!("kvtui-groups-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&scratch);
    let (_members, addrs) = start_group(&scratch);
    let all = addrs.join("|");
    for i in 0..20 {
        kvd(&["put", "--nodes", &all, &format!("k{i}"), "v"]);
    }
    // The lead goes to the third member, which the dashboard's --nodes leaves out.
    let out = kvd(&["admin", "transfer-leader", "--nodes", &all, &addrs[2]]);
    assert!(out.contains(&format!("leader {}", addrs[2])), "{out}");
    let listed = addrs[..2].join("|");
    // Load while kvtui samples (bounded): followers apply what they do not serve.
    let load = std::thread::spawn({
        let all = all.clone();
        move || {
            for i in 0..60 {
                let _ = Command::new(kvd_binary())
                    .args(["put", "--nodes", &all, &format!("load{}", i % 5), "v"])
                    .output();
            }
        }
    });
    let report = once(&listed);
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
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let report = once(&all);
        let gone = row(&report, &addrs[0]);
        if gone["removed"] == true {
            assert_eq!(row(&report, &addrs[1])["removed"], false);
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the removed member is not shown removed: {report}"
        );
    }
    let _ = std::fs::remove_dir_all(&scratch);
}
