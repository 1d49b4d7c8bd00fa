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
        for (g, addr) in addrs.iter().enumerate() {
            let dir = copy(&format.join(format!("moved/group{g}")), &scratch, &format!("g{g}"));
            let (d, shard) = (dir.display().to_string(), format!("{g}/2"));
            let args = ["--shard", &shard, "--data-dir", &d, "--group", addr, "--nodes", &nodes];
            running.push(start_at(addr, &args).0);
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

/// The version in a log segment's header.
fn segment_format(path: &Path) -> u32 {
    let bytes = std::fs::read(path).unwrap();
    u32::from_le_bytes(bytes[8..12].try_into().unwrap())
}

/// Every segment of a data directory.
fn segments(data: &Path) -> Vec<PathBuf> {
    let mut segs: Vec<PathBuf> = std::fs::read_dir(data.join("log"))
        .unwrap()
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "seg"))
        .collect();
    segs.sort();
    segs
}

/// An older log is rewritten in this build's format when it is opened (the upgrade is in
/// place, one segment at a time); a log of a newer format than this build reads is refused,
/// naming the file, the versions and where the procedure is.
#[test]
fn an_older_log_is_upgraded_in_place_and_a_newer_one_is_refused_by_name() {
    let current = kvd::durable::segment::FORMAT_VERSION;
    for format in formats() {
        let scratch = temp_dir("compat-upgrade");
        let dir = copy(&format.join("single/data"), &scratch, "data");
        let d = dir.display().to_string();
        let (node, _) = start_at("127.0.0.1:0", &["--data-dir", &d]);
        drop(node);
        for seg in segments(&dir) {
            assert_eq!(segment_format(&seg), current, "{}: upgraded on open", seg.display());
        }
        let newest = segments(&dir).pop().unwrap();
        let mut bytes = std::fs::read(&newest).unwrap();
        bytes[8..12].copy_from_slice(&(current + 1).to_le_bytes());
        std::fs::write(&newest, bytes).unwrap();
        let out = kvd(&["--listen", "127.0.0.1:0", "--data-dir", &d]);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "a newer log must be refused: {err}");
        for part in [
            newest.display().to_string(),
            format!("log format version {}", current + 1),
            format!("this kvd reads versions 2 to {current}"),
            "docs/UPGRADING.md".to_string(),
        ] {
            assert!(err.contains(&part), "the refusal names {part:?}: {err}");
        }
    }
}

/// Where the golden bytes are.
fn golden_bytes() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/golden/bytes")
}

/// Every encoding kvd keeps or sends (`kvd::durable::samples`) is byte for byte what was
/// committed for its version. A change of layout without a new version fails here; with
/// `KVD_BLESS=1` the files of a *new* version are written (an existing file is never
/// rewritten: a format that changes gets a new version, and its old files stay).
#[test]
fn every_encoding_matches_its_golden_bytes() {
    let scratch = temp_dir("compat-bytes");
    let samples = kvd::durable::samples::all(scratch.path()).unwrap();
    let dir = golden_bytes();
    let bless = std::env::var_os("KVD_BLESS").is_some();
    let mut missing = Vec::new();
    for s in &samples {
        let path = dir.join(&s.name);
        match std::fs::read(&path) {
            Ok(golden) => assert!(
                golden == s.bytes,
                "{} changed ({} bytes, golden {}): a format changed without a new version; bump the version \
                 (its name changes) and keep a reader for the old bytes",
                s.name,
                s.bytes.len(),
                golden.len()
            ),
            Err(_) if bless => {
                std::fs::create_dir_all(&dir).unwrap();
                std::fs::write(&path, &s.bytes).unwrap();
            }
            Err(_) => missing.push(s.name.clone()),
        }
    }
    assert!(
        missing.is_empty(),
        "no golden bytes for {missing:?}: a new version? write them with KVD_BLESS=1"
    );
    // Every golden file is either one this build writes or an older version, named here with
    // the reader that still takes it.
    const OLDER: &[&str] = &[];
    for entry in std::fs::read_dir(&dir).unwrap().filter_map(Result::ok) {
        let name = entry.file_name().to_string_lossy().into_owned();
        assert!(
            samples.iter().any(|s| s.name == name) || OLDER.contains(&name.as_str()),
            "{name}: a golden file no sample writes (list older versions in OLDER, with their reader)"
        );
    }
}

/// The committed bytes of a raft message decode as one and encode back the same: members of
/// this raft version agree on every message, entries and all.
#[test]
fn golden_raft_messages_and_records_read_back() {
    use kvd::durable::network::{RaftMessage, RaftRpcReply};
    let dir = golden_bytes();
    let version = kvshared::frame::RAFT_VERSION;
    let mut seen = 0;
    for entry in std::fs::read_dir(&dir).unwrap().filter_map(Result::ok) {
        let name = entry.file_name().to_string_lossy().into_owned();
        let bytes = std::fs::read(entry.path()).unwrap();
        if let Some(what) = name.strip_prefix(&format!("raft-{version}-")) {
            let again = match what.starts_with("reply-") {
                true => postcard::to_allocvec(&postcard::from_bytes::<RaftRpcReply>(&bytes).unwrap()).unwrap(),
                false => postcard::to_allocvec(&postcard::from_bytes::<RaftMessage>(&bytes).unwrap()).unwrap(),
            };
            assert_eq!(again, bytes, "{name}");
            seen += 1;
        }
        if let Some(what) = name.strip_prefix("record-1-") {
            // (The samples are entries 7, 8 and 9.)
            let index = 7 + ["blank.bin", "membership.bin", "normal.bin"]
                .iter()
                .position(|w| *w == what)
                .unwrap();
            let entry = kvd::durable::raft::decode_record(&dir, index as u64, &bytes).unwrap();
            assert_eq!(kvd::durable::raft::encode_record(&entry).unwrap(), bytes, "{name}");
            seen += 1;
        }
    }
    assert!(seen >= 13, "only {seen} golden messages and records");
}

/// A damaged log record, as a flipped, cut or inserted byte: either refused, or it reads as
/// exactly the ops its bytes say (encoding those ops again gives the same payload) and the
/// store answers every one of them. Never an entry applied as nothing, never a panic.
mod mutated_entries {
    use kvd::durable::entry::{LogPayload, encode_batch};
    use kvd::store::{Ops, Scratch, Store, Unbounded};
    use kvshared::routing::ShardId;
    use kvshared::wire::BatchResponse;
    use openraft::EntryPayload;
    use proptest::prelude::*;

    fn golden_record() -> Vec<u8> {
        std::fs::read(super::golden_bytes().join("record-1-normal.bin")).unwrap()
    }

    #[derive(Debug, Clone)]
    enum Damage {
        Flip { at: usize, xor: u8 },
        Cut { at: usize },
        Insert { at: usize, byte: u8 },
    }

    fn damage() -> impl Strategy<Value = Damage> {
        prop_oneof![
            (any::<usize>(), 1..=255u8).prop_map(|(at, xor)| Damage::Flip { at, xor }),
            any::<usize>().prop_map(|at| Damage::Cut { at }),
            (any::<usize>(), any::<u8>()).prop_map(|(at, byte)| Damage::Insert { at, byte }),
        ]
    }

    fn apply(mut bytes: Vec<u8>, d: &Damage) -> Vec<u8> {
        let n = bytes.len();
        match *d {
            Damage::Flip { .. } | Damage::Cut { .. } if n == 0 => {}
            Damage::Flip { at, xor } => bytes[at % n] ^= xor,
            Damage::Cut { at } => bytes.truncate(at % n),
            Damage::Insert { at, byte } => bytes.insert(at % (n + 1), byte),
        }
        bytes
    }

    /// The payload's ops encoded again, batch by batch.
    fn encoded_again(payload: &LogPayload) -> Vec<u8> {
        let batches = payload.batches().unwrap();
        let again: Vec<Vec<u8>> = batches
            .iter()
            .map(|b| {
                let ops: Vec<_> = (0..b.len()).map(|i| b.op(i).unwrap()).collect();
                encode_batch(ops.iter().map(|op| (op.kind, op.key, op.value))).unwrap()
            })
            .collect();
        LogPayload::from_batches(&again).bytes().to_vec()
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(2000))]
        #[test]
        fn a_damaged_record_is_refused_or_read_as_what_it_says(damages in proptest::collection::vec(damage(), 1..4)) {
            let bytes = damages.iter().fold(golden_record(), apply);
            let dir = std::path::Path::new("log");
            let Ok(entry) = kvd::durable::raft::decode_record(dir, 9, &bytes) else { return Ok(()) };
            let EntryPayload::Normal(payload) = entry.payload else { return Ok(()) };
            prop_assert_eq!(encoded_again(&payload), payload.bytes().to_vec());
            let store = Store::new(ShardId::SOLO, 4, 0).unwrap();
            for batch in payload.batches().unwrap() {
                let mut out = BatchResponse::default();
                store.execute(&batch, &mut out, &mut Unbounded, &mut Scratch::default(), &mut Default::default());
                prop_assert_eq!(out.len(), batch.len(), "every op answered");
            }
        }
    }
}

/// A peer of another protocol version is refused on its first frame, with both versions
/// named and which end to upgrade: a member of the builds before the raft protocol had a
/// version of its own (its raft frames carry the client protocol's v19), and a client newer
/// than this kvd.
#[test]
fn a_peer_of_another_version_is_refused_at_once_naming_both_versions() {
    use kvshared::frame::{FrameKind, RAFT_VERSION, VERSION};
    let (_node, addr) = common::start(&[]);
    let refusal = |version: u8, kind: FrameKind| {
        let mut s = std::net::TcpStream::connect(&addr).unwrap();
        let mut frame = [0u8; kvshared::frame::HEADER_LEN];
        frame[..2].copy_from_slice(b"KV");
        frame[2] = version;
        frame[3] = kind as u8;
        frame[8] = 1;
        let (header, body) = common::exchange(&mut s, &frame);
        assert_eq!(header.kind, FrameKind::ErrorResponse);
        kvshared::wire::parse_error_reply(&body).unwrap().message
    };
    let old_member = refusal(19, FrameKind::RaftRequest);
    assert!(
        old_member.contains(&format!(
            "raft protocol between group members version mismatch: this end speaks v{RAFT_VERSION}, the other end v19"
        )) && old_member.contains("upgrade the other end"),
        "{old_member}"
    );
    let new_client = refusal(VERSION + 1, FrameKind::StatsRequest);
    assert!(
        new_client.contains(&format!(
            "client protocol version mismatch: this end speaks v{VERSION}, the other end v{}",
            VERSION + 1
        )) && new_client.contains("(this one)"),
        "{new_client}"
    );
}
