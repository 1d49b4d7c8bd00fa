//! Helpers for tests that run the built `kvd` binary.
#![allow(dead_code)] // each test file uses its own subset

use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::Command;

use kvshared::frame::{AlignedVec, FrameHeader, FrameKind, HEADER_LEN};
use kvshared::wire::{BatchRequest, encode_frame};

pub use kvtestkit::kvd::Kvd;
#[allow(unused_imports)]
pub use kvtestkit::process::AfterReady;
#[allow(unused_imports)] // each test file uses its own subset
pub use kvtestkit::{Guard, HANG, TempDir, addr, temp_dir, until, until_async};

/// Starts `kvd` on a free port and returns it with the address from its ready line.
pub fn start(args: &[&str]) -> (Kvd, String) {
    start_logging(args, "kvd=info", false)
}

/// Starts `kvd` listening on `listen` (an address of [`addr`], e.g. the one a killed kvd
/// had, or port 0).
pub fn start_at(listen: &str, args: &[&str]) -> (Kvd, String) {
    let args = [&["--listen", listen], args].concat();
    start_logging(&args, "kvd=info", false)
}

/// Starts `kvd` with `RUST_LOG=log`; with `stall`, nobody reads its stderr after the ready
/// line (the pipe fills, as with a stuck log collector).
pub fn start_logging(args: &[&str], log: &str, stall: bool) -> (Kvd, String) {
    let options = kvtestkit::kvd::Options {
        log: Some(log.to_string()),
        after: if stall { AfterReady::Stall } else { AfterReady::Read },
    };
    let kvd = kvtestkit::kvd::start_with(args, &options);
    let addr = kvd.addr.clone();
    (kvd, addr)
}

/// Starts `kvd` on a free port; returns it with what it logged before its ready line (e.g.
/// what recovery passed over), and its address.
pub fn start_capturing(args: &[&str]) -> ((Kvd, String), String) {
    let kvd = kvtestkit::kvd::start(args);
    let (addr, before) = (kvd.addr.clone(), kvd.ready.before.join("\n"));
    ((kvd, before), addr)
}

/// Starts a kvd by `command` (e.g. inside a network namespace; `args` are kvd's own
/// arguments); returns it, the address of its ready line, and what it logged before.
pub fn start_command(command: Command, args: &[&str], stall: bool) -> (Kvd, String, String) {
    let after = if stall { AfterReady::Stall } else { AfterReady::Read };
    let kvd = kvtestkit::kvd::start_command(command, args, after);
    let (addr, before) = (kvd.addr.clone(), kvd.ready.before.join("\n"));
    (kvd, addr, before)
}

/// Runs `kvd` with `args` (a client verb, or a bad flag) and waits for it.
pub fn kvd(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_kvd"))
        .args(args)
        .env_remove("KV_NODES")
        .output()
        .unwrap()
}

/// kvd's resident memory, from /proc (Linux).
pub fn rss_bytes(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .map_or(0, |kb| kb * 1024)
}

/// Writes one frame and reads the one reply frame: its header and its body (aligned).
pub fn exchange(s: &mut TcpStream, frame: &[u8]) -> (FrameHeader, AlignedVec) {
    s.write_all(frame).unwrap();
    read_reply(s)
}

/// Reads one reply frame from `s` (any length the client would accept).
pub fn read_reply(s: &mut TcpStream) -> (FrameHeader, AlignedVec) {
    let mut raw = [0u8; HEADER_LEN];
    s.read_exact(&mut raw).unwrap();
    let header = FrameHeader::decode(&raw, kvshared::frame::MAX_FRAME_LIMIT).unwrap();
    let mut body = AlignedVec::new();
    body.resize(header.len as usize, 0);
    s.read_exact(&mut body).unwrap();
    (header, body)
}

/// A batch request as one whole frame.
pub fn batch_frame(id: u64, batch: &BatchRequest) -> AlignedVec {
    let mut out = AlignedVec::new();
    encode_frame(FrameKind::BatchRequest, id, batch, &mut out).unwrap();
    out
}

/// Runs `ip` with `args`; false if it failed (e.g. not root).
pub fn ip(args: &[&str]) -> bool {
    Command::new("ip").args(args).status().is_ok_and(|s| s.success())
}

/// A network namespace made for one test, removed when dropped.
pub struct Netns(pub String);

impl Drop for Netns {
    fn drop(&mut self) {
        ip(&["netns", "del", &self.0]);
    }
}

impl Netns {
    /// A namespace whose loopback device also carries `addr` (a host address other than
    /// 127.0.0.1, so that a client in it connecting to `addr` is "another host" to kvd).
    pub fn with_address(name: &str, addr: &str) -> Netns {
        let ns = Netns(format!("{name}-{}", std::process::id()));
        assert!(
            ip(&["netns", "add", &ns.0]),
            "cannot make a network namespace (run as root, with iproute2)"
        );
        assert!(ip(&["-n", &ns.0, "link", "set", "lo", "up"]));
        assert!(ip(&["-n", &ns.0, "addr", "add", &format!("{addr}/32"), "dev", "lo"]));
        ns
    }

    /// `program args` run inside the namespace.
    pub fn command(&self, program: &str, args: &[&str]) -> Command {
        let mut c = Command::new("ip");
        c.args(["netns", "exec", &self.0, program])
            .args(args)
            .env_remove("KV_NODES");
        c
    }
}

/// A token file for a test, in Cargo's temporary directory for integration tests, readable
/// by its owner only.
pub fn token_file(name: &str, token: &str) -> String {
    use std::os::unix::fs::PermissionsExt;
    let path = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join(name);
    std::fs::write(&path, format!("{token}\n")).unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
    path.display().to_string()
}

/// A self-signed certificate for 127.0.0.1 and its key, as PEM files.
pub fn self_signed(name: &str) -> (String, String) {
    let made = rcgen::generate_simple_self_signed(vec!["127.0.0.1".to_string(), "localhost".to_string()]).unwrap();
    let dir = std::path::Path::new(env!("CARGO_TARGET_TMPDIR"));
    let (cert, key) = (dir.join(format!("{name}.crt")), dir.join(format!("{name}.key")));
    std::fs::write(&cert, made.cert.pem()).unwrap();
    std::fs::write(&key, made.signing_key.serialize_pem()).unwrap();
    (cert.display().to_string(), key.display().to_string())
}

/// Running nodes and the data directories they use, dropped in that order (the nodes are
/// killed, then the directories removed). Indexes and iterates as the nodes.
pub struct Nodes {
    pub procs: Vec<Kvd>,
    pub dirs: Vec<TempDir>,
}

impl std::ops::Deref for Nodes {
    type Target = Vec<Kvd>;
    fn deref(&self) -> &Vec<Kvd> {
        &self.procs
    }
}

impl std::ops::DerefMut for Nodes {
    fn deref_mut(&mut self) -> &mut Vec<Kvd> {
        &mut self.procs
    }
}

/// Two nodes (shards 0/2 and 1/2), each with a RESP port and the other's address for
/// forwarding; returns the guards and the two RESP addresses.
pub fn resp_cluster(extra: &[&str]) -> (Nodes, Vec<String>) {
    let bin: Vec<String> = (0..2).map(|_| addr()).collect();
    let resp: Vec<String> = (0..2).map(|_| addr()).collect();
    let nodes = bin.join(",");
    let mut procs = Vec::new();
    for i in 0..2 {
        let shard = format!("{i}/2");
        let mut args = vec!["--shard", &shard, "--resp", &resp[i], "--nodes", &nodes];
        args.extend(extra);
        procs.push(start_at(&bin[i], &args).0);
    }
    (
        Nodes {
            procs,
            dirs: Vec::new(),
        },
        resp,
    )
}

/// Whether the RESP node at `addr` says it is a master (`INFO replication`).
pub fn resp_leads(addr: &str) -> bool {
    let Ok(mut s) = TcpStream::connect(addr) else {
        return false;
    };
    let _ = s.set_read_timeout(Some(std::time::Duration::from_secs(3)));
    let _ = s.write_all(b"INFO replication\r\nQUIT\r\n");
    let mut out = Vec::new();
    let _ = s.read_to_end(&mut out);
    String::from_utf8_lossy(&out).contains("role:master")
}

/// A 3-member replica group started with `--data-dir` (fresh directories named after
/// `name`) and `--resp`: its members, their RESP addresses, and which one leads (found
/// with `INFO replication`).
pub fn resp_group(name: &str) -> (Nodes, Vec<String>, usize) {
    resp_group_with(name, &[])
}

/// As [`resp_group`], each member started with `extra` flags too.
pub fn resp_group_with(name: &str, extra: &[&str]) -> (Nodes, Vec<String>, usize) {
    let bin: Vec<String> = (0..3).map(|_| addr()).collect();
    let resp: Vec<String> = (0..3).map(|_| addr()).collect();
    let members = bin.join(",");
    let dirs: Vec<TempDir> = (0..3).map(|i| temp_dir(&format!("{name}-{i}"))).collect();
    let mut procs = Vec::new();
    for i in 0..3 {
        let d = dirs[i].path().display().to_string();
        let args = [&["--data-dir", &d, "--group", &members, "--resp", &resp[i]][..], extra].concat();
        procs.push(start_at(&bin[i], &args).0);
    }
    let init = kvd(&["admin", "init-group", "--nodes", &bin.join("|")]);
    assert!(init.status.success(), "{}", String::from_utf8_lossy(&init.stderr));
    let leader = until("a member to say it is the master", HANG, || {
        (0..3).find(|&i| resp_leads(&resp[i])).ok_or("none yet")
    });
    (Nodes { procs, dirs }, resp, leader)
}

/// Gets that found a key missing after a put of it had been acknowledged: with no deletes
/// in the workload, only an expiry removes a key, so these show times running out.
pub fn reads_after_expiry(history: &kvshared::history::History) -> usize {
    use kvshared::history::{Call, Return};
    let mut ops: Vec<_> = history.operations.iter().collect();
    ops.sort_by_key(|o| o.call_ns);
    let mut put_done: std::collections::HashMap<&str, u64> = Default::default();
    let mut n = 0;
    for o in ops {
        match (&o.call, &o.ret) {
            (Call::PutTtl { .. }, Return::Stored) => {
                let t = put_done.entry(o.key.as_str()).or_insert(u64::MAX);
                *t = (*t).min(o.return_ns);
            }
            (Call::Get, Return::Value { value: None }) => {
                n += usize::from(put_done.get(o.key.as_str()).is_some_and(|&t| t < o.call_ns));
            }
            _ => {}
        }
    }
    n
}

/// The venv's Python with redis-py, made by `.ci/run` (or `KV_PYTHON`); a test that needs it
/// fails, saying how to get it, when it is missing.
pub fn python() -> std::path::PathBuf {
    kvtestkit::tools::python()
}

/// Runs an outside client's check program: it must exit 0 and say "every check passed".
#[allow(dead_code)]
pub fn run_client_check(mut cmd: Command, client: &str) {
    let out = cmd.output().unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "{client} failed:\n{text}");
    assert!(text.contains("every check passed"), "{text}");
}

/// Sends `bytes` to a RESP address (ending in QUIT) and returns everything it answered
/// (each read within 10 s).
#[allow(dead_code)]
pub fn raw(addr: &str, bytes: &[u8]) -> String {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(std::time::Duration::from_secs(10))).unwrap();
    s.write_all(bytes).unwrap();
    let mut out = Vec::new();
    let _ = s.read_to_end(&mut out);
    String::from_utf8_lossy(&out).into_owned()
}

/// A cluster of `groups` shards of `members` each (1: in memory; 3: durable replica
/// groups), every node with `--resp-cluster`: the guards, the `--nodes` list, and the RESP
/// addresses by shard, then member.
pub fn groups_cluster(name: &str, groups: usize, members: usize) -> (Nodes, String, Vec<Vec<String>>) {
    let bin: Vec<Vec<String>> = (0..groups).map(|_| (0..members).map(|_| addr()).collect()).collect();
    let resp: Vec<Vec<String>> = (0..groups).map(|_| (0..members).map(|_| addr()).collect()).collect();
    let nodes = bin.iter().map(|g| g.join("|")).collect::<Vec<_>>().join(",");
    let mut all = Nodes {
        procs: Vec::new(),
        dirs: Vec::new(),
    };
    for g in 0..groups {
        for m in 0..members {
            let shard = format!("{g}/{groups}");
            let mut args = vec![
                "--shard",
                &shard,
                "--resp",
                &resp[g][m],
                "--nodes",
                &nodes,
                "--resp-cluster",
            ];
            let dir = temp_dir(&format!("{name}-{g}-{m}"));
            let (d, group) = (dir.path().display().to_string(), bin[g].join(","));
            if members > 1 {
                args.extend(["--data-dir", &d, "--group", &group]);
            }
            all.procs.push(start_at(&bin[g][m], &args).0);
            all.dirs.push(dir);
        }
        if members > 1 {
            let init = kvd(&["admin", "init-group", "--nodes", &bin[g].join("|")]);
            assert!(init.status.success(), "{}", String::from_utf8_lossy(&init.stderr));
        }
    }
    for addr in resp.iter().flatten() {
        until(&format!("{addr}: the cluster's state to be ok"), HANG, || {
            let info = raw(addr, b"CLUSTER INFO\r\nQUIT\r\n");
            if info.contains("cluster_state:ok") {
                Ok(())
            } else {
                Err(info)
            }
        });
    }
    (all, nodes, resp)
}

/// Sets one slot of node `node` (of `client`'s list) to `to` (owner, epoch), as a step of
/// `kvd admin move-slots` does, and checks that the node took it.
#[allow(dead_code)]
pub fn set_slot(
    rt: &tokio::runtime::Runtime,
    client: &kvshared::client::Cluster,
    node: usize,
    slot: u16,
    (to, owner, epoch): (kvshared::slots::SlotState, u16, u32),
) {
    let change = kvshared::slots::SlotChange {
        ranges: vec![[slot, slot]],
        to,
        owner,
        epoch,
    };
    let mut req = BatchRequest::new();
    req.push(kvshared::wire::OpKind::SlotSet, b"", &change.encode());
    let reply = rt.block_on(client.send_batch(node, &req)).unwrap();
    let status = reply.batch().unwrap().status(0);
    assert_eq!(status, Some(kvshared::wire::OpStatus::Stored), "{to:?} at node {node}");
}

/// A recording load in the background that the test ends at an event (after enough ops
/// around a kill, a move, a change), not after a guessed time.
pub struct Recorder {
    progress: std::sync::Arc<kvshared::client::RecordProgress>,
    task: tokio::task::JoinHandle<kvshared::client::Recording>,
}

impl Recorder {
    /// Starts recording `config` (its `duration` only bounds a hang) on the current runtime.
    pub fn start(
        client: &std::sync::Arc<kvshared::client::Cluster>,
        mut config: kvshared::client::RecordConfig,
    ) -> Recorder {
        let progress = kvshared::client::RecordProgress::new();
        config.progress = Some(progress.clone());
        let client = client.clone();
        let task = tokio::spawn(async move { kvshared::client::record(client, &config).await });
        Recorder { progress, task }
    }

    /// Ops recorded so far.
    pub fn recorded(&self) -> u64 {
        self.progress.recorded()
    }

    /// Waits until `more` ops beyond those recorded now are recorded.
    pub async fn more(&self, more: u64) {
        let target = self.progress.recorded() + more;
        until_async(&format!("{target} ops recorded"), HANG, || async {
            let now = self.progress.recorded();
            if now >= target { Ok(()) } else { Err(now) }
        })
        .await
    }

    /// Ends the recording and returns it.
    pub async fn finish(self) -> kvshared::client::Recording {
        self.progress.stop();
        self.task.await.expect("the recording task")
    }
}

/// A `kvd manager --json`'s decisions as they are printed.
pub struct Decisions(std::sync::Arc<std::sync::Mutex<Vec<serde_json::Value>>>);

impl Decisions {
    pub fn read(stdout: std::process::ChildStdout) -> Decisions {
        let lines: std::sync::Arc<std::sync::Mutex<Vec<serde_json::Value>>> = Default::default();
        let kept = lines.clone();
        std::thread::spawn(move || {
            use std::io::BufRead;
            for line in std::io::BufReader::new(stdout).lines().map_while(Result::ok) {
                if let Ok(v) = serde_json::from_str(&line) {
                    kept.lock().unwrap().push(v);
                }
            }
        });
        Decisions(lines)
    }

    /// Every decision printed so far.
    pub fn all(&self) -> Vec<serde_json::Value> {
        self.0.lock().unwrap().clone()
    }

    /// Each decision as "ACTION MEMBER".
    pub fn actions(&self) -> Vec<String> {
        let lines = self.0.lock().unwrap();
        lines
            .iter()
            .map(|v| {
                format!(
                    "{} {}",
                    v["action"].as_str().unwrap_or(""),
                    v["member"].as_str().unwrap_or("")
                )
            })
            .collect()
    }

    /// Waits until the manager has printed `action` ("added ADDR").
    pub async fn wait_for(&self, action: &str) {
        until_async(&format!("the manager to print {action:?}"), HANG, || async {
            let actions = self.actions();
            if actions.iter().any(|a| a == action) {
                Ok(())
            } else {
                Err(actions)
            }
        })
        .await
    }
}

impl Decisions {
    /// Waits until the manager has printed a decision for which `wanted` holds.
    pub async fn wait_for_one(&self, what: &str, wanted: impl Fn(&serde_json::Value) -> bool) {
        until_async(&format!("the manager to print {what}"), HANG, || async {
            let all = self.all();
            if all.iter().any(&wanted) { Ok(()) } else { Err(all) }
        })
        .await
    }
}
