//! Data that survives an upgrade (issue 57): the golden data directories under
//! `tests/golden/log-format-*`, written by earlier builds (`scripts/golden-datadirs.sh`), are
//! opened by this build and must hold exactly what the writing build answered: every key's
//! value and deadline, every absent key absent, every slot with its owner. Each is opened on a
//! copy (kvd writes to the directory it opens), written to once more, and opened again: an
//! upgraded directory goes on working.

mod common;

use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

use common::{HANG, Kvd, TempDir, kvd, start_at, temp_dir, until};

/// Every golden set, oldest format first.
fn formats() -> Vec<PathBuf> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/golden");
    let mut dirs: Vec<PathBuf> = std::fs::read_dir(&root)
        .unwrap()
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| {
            p.file_name()
                .is_some_and(|n| n.to_string_lossy().starts_with("log-format-"))
        })
        .collect();
    dirs.sort();
    assert!(!dirs.is_empty(), "no golden data directories in {}", root.display());
    dirs
}

/// A key as the writing build answered it.
struct Expected {
    key: String,
    /// `None`: absent.
    value: Option<String>,
    /// Unix ms, or -1 for none.
    deadline: i64,
}

fn expected(path: &Path) -> Vec<Expected> {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let now = SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_millis() as i64;
    text.lines()
        .map(|line| {
            let f: Vec<&str> = line.split('\t').collect();
            assert_eq!(f.len(), 3, "{}: {line:?}", path.display());
            let (value, deadline) = match (f[1], f[2]) {
                ("-", "-") => (None, -1),
                (v, d) => {
                    let d: i64 = d.parse().unwrap();
                    // A deadline that has passed since: the key is gone.
                    match d >= 0 && d <= now {
                        true => (None, -1),
                        false => (Some(v.to_string()), d),
                    }
                }
            };
            Expected {
                key: f[0].to_string(),
                value,
                deadline,
            }
        })
        .collect()
}

/// A copy of the golden directory `from` (kvd writes to what it opens; the golden stays).
fn copy(from: &Path, scratch: &TempDir, name: &str) -> PathBuf {
    let to = scratch.path().join(name);
    let mut todo = vec![(from.to_path_buf(), to.clone())];
    while let Some((src, dst)) = todo.pop() {
        std::fs::create_dir_all(&dst).unwrap();
        for entry in std::fs::read_dir(&src).unwrap().filter_map(Result::ok) {
            let target = dst.join(entry.file_name());
            match entry.file_type().unwrap().is_dir() {
                true => todo.push((entry.path(), target)),
                false => {
                    std::fs::copy(entry.path(), &target).unwrap();
                }
            }
        }
    }
    to
}

fn redis(addr: &str) -> redis::Connection {
    redis::Client::open(format!("redis://{addr}/"))
        .unwrap()
        .get_connection_with_timeout(HANG)
        .unwrap()
}

/// Every expected key, read over RESP at `addr`: its value and its deadline, or absent.
fn check_keys(addr: &str, keys: &[Expected], what: &str) {
    let mut c = redis(addr);
    for e in keys {
        let got: Option<String> = redis::cmd("GET").arg(&e.key).query(&mut c).unwrap();
        assert_eq!(got, e.value, "{what}: the value of {}", e.key);
        if e.value.is_some() {
            let at: i64 = redis::cmd("PEXPIRETIME").arg(&e.key).query(&mut c).unwrap();
            assert_eq!(at, e.deadline, "{what}: the deadline of {}", e.key);
        }
    }
}

/// One durable node: its snapshots and log tail read back; then a write, a restart, and
/// everything again.
#[test]
fn a_golden_single_node_reads_back_exactly_and_goes_on() {
    for format in formats() {
        let what = format!("{}/single", format.display());
        let keys = expected(&format.join("single/expected.tsv"));
        let scratch = temp_dir("compat-single");
        let dir = copy(&format.join("single/data"), &scratch, "data");
        let d = dir.display().to_string();
        let resp = common::addr();
        let (node, _) = start_at("127.0.0.1:0", &["--data-dir", &d, "--resp", &resp]);
        check_keys(&resp, &keys, &what);
        let mut c = redis(&resp);
        let _: () = redis::cmd("SET").arg("after-upgrade").arg("yes").query(&mut c).unwrap();
        drop(node);
        let (_node, _) = start_at("127.0.0.1:0", &["--data-dir", &d, "--resp", &resp]);
        check_keys(&resp, &keys, &format!("{what}, reopened"));
        let got: Option<String> = redis::cmd("GET").arg("after-upgrade").query(&mut redis(&resp)).unwrap();
        assert_eq!(got.as_deref(), Some("yes"), "{what}: a write after the upgrade");
    }
}

/// A replica group of three, each member on the address its membership names: a leader is
/// elected, every key reads back, and a write after the upgrade reaches every member.
#[test]
fn a_golden_replica_group_reads_back_exactly_and_goes_on() {
    for format in formats() {
        let what = format!("{}/group", format.display());
        let keys = expected(&format.join("group/expected.tsv"));
        let scratch = temp_dir("compat-group");
        let members: Vec<String> = (1..=3)
            .map(|m| kvtestkit::port::hold_at(&format!("127.77.0.{m}:7070")))
            .collect();
        let resp: Vec<String> = (0..3).map(|_| common::addr()).collect();
        let group = members.join(",");
        let mut nodes: Vec<Kvd> = Vec::new();
        for m in 0..3 {
            let dir = copy(
                &format.join(format!("group/member{}", m + 1)),
                &scratch,
                &format!("m{m}"),
            );
            let d = dir.display().to_string();
            nodes.push(start_at(&members[m], &["--data-dir", &d, "--group", &group, "--resp", &resp[m]]).0);
        }
        let leader = until("a leader among the upgraded members", HANG, || {
            (0..3).find(|&m| common::resp_leads(&resp[m])).ok_or("none yet")
        });
        check_keys(&resp[leader], &keys, &what);
        let put = kvd(&["put", "--nodes", &members.join("|"), "after-upgrade", "yes"]);
        assert!(put.status.success(), "{}", String::from_utf8_lossy(&put.stderr));
        for m in &members {
            until(&format!("{m} to hold the write made after the upgrade"), HANG, || {
                let got = kvd(&["stats", "--nodes", m, "--json"]);
                let json: serde_json::Value = serde_json::from_slice(&got.stdout).unwrap_or_default();
                let applied = json[0]["stats"]["applied_index"].as_u64().unwrap_or(0);
                let leader_commit = leader_commit(&members);
                if applied >= leader_commit {
                    Ok(())
                } else {
                    Err((applied, leader_commit))
                }
            });
        }
        drop(nodes);
    }
}

/// The commit index of whichever member says it leads.
fn leader_commit(members: &[String]) -> u64 {
    let got = kvd(&["stats", "--nodes", &members.join("|"), "--json"]);
    let json: serde_json::Value = serde_json::from_slice(&got.stdout).unwrap_or_default();
    json.as_array()
        .into_iter()
        .flatten()
        .find(|r| r["role"] == "leader")
        .and_then(|r| r["stats"]["commit_index"].as_u64())
        .unwrap_or(u64::MAX)
}

/// Two groups after a slot move: the slot table reads back as it was (owners, epochs), and
/// every key from its owner.
#[test]
fn a_golden_cluster_after_a_slot_move_reads_back_exactly() {
    for format in formats() {
        let what = format!("{}/moved", format.display());
        let keys = expected(&format.join("moved/expected.tsv"));
        let scratch = temp_dir("compat-moved");
        let addrs: Vec<String> = (1..=2)
            .map(|g| kvtestkit::port::hold_at(&format!("127.77.0.1{g}:7070")))
            .collect();
        let nodes = addrs.join(",");
        let mut running: Vec<Kvd> = Vec::new();
        for g in 0..2 {
            let dir = copy(&format.join(format!("moved/group{g}")), &scratch, &format!("g{g}"));
            let (d, shard) = (dir.display().to_string(), format!("{g}/2"));
            let args = [
                "--shard",
                &shard,
                "--data-dir",
                &d,
                "--group",
                &addrs[g],
                "--nodes",
                &nodes,
            ];
            running.push(start_at(&addrs[g], &args).0);
        }
        let want = std::fs::read_to_string(format.join("moved/slots.txt")).unwrap();
        let slots = until("both groups to answer with their slot tables", HANG, || {
            let out = kvd(&["admin", "slots", "--nodes", &nodes]);
            let text = String::from_utf8_lossy(&out.stdout).into_owned();
            if out.status.success() {
                Ok(text)
            } else {
                Err(String::from_utf8_lossy(&out.stderr).into_owned())
            }
        });
        assert_eq!(slots, want, "{what}: the slot table");
        for e in &keys {
            let got = kvd(&["get", "--nodes", &nodes, "--text", &e.key]);
            let value = String::from_utf8_lossy(&got.stdout).trim_end().to_string();
            assert_eq!(Some(value), e.value, "{what}: {}", e.key);
        }
        drop(running);
    }
}
