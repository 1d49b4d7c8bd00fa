//! Helpers for tests that run the built `kvd` binary.
#![allow(dead_code)] // each test file uses its own subset

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::process::{Child, Command, Stdio};

use kvshared::frame::{AlignedVec, FrameHeader, FrameKind, HEADER_LEN};
use kvshared::wire::{BatchRequest, encode_frame};

/// A kvd child process that is killed when dropped, so a failing test leaves none behind.
/// It may hold kvd's stderr unread (a stalled log reader).
pub struct Kvd(pub Child, Option<Box<dyn std::any::Any + Send>>);

impl Kvd {
    /// Guards a kvd started some other way (e.g. through `ip netns exec`, which execs it).
    pub fn guard(child: Child) -> Kvd {
        Kvd(child, None)
    }
}

impl Drop for Kvd {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

impl std::ops::Deref for Kvd {
    type Target = Child;
    fn deref(&self) -> &Child {
        &self.0
    }
}

impl std::ops::DerefMut for Kvd {
    fn deref_mut(&mut self) -> &mut Child {
        &mut self.0
    }
}

/// Starts `kvd` on a free port and returns it with the address from its ready line.
pub fn start(args: &[&str]) -> (Kvd, String) {
    start_logging(args, "kvd=info", false)
}

/// Starts `kvd` listening on `listen` (e.g. the address a killed kvd had).
pub fn start_at(listen: &str, args: &[&str]) -> (Kvd, String) {
    start_with(listen, args, "kvd=info", false)
}

/// Starts `kvd` with `RUST_LOG=log`; with `stall`, nobody reads its stderr after the ready
/// line (the pipe fills, as with a stuck log collector).
pub fn start_logging(args: &[&str], log: &str, stall: bool) -> (Kvd, String) {
    start_with("127.0.0.1:0", args, log, stall)
}

/// Starts `kvd` on a free port; returns it with what it logged before its ready line (e.g.
/// what recovery passed over), and its address.
pub fn start_capturing(args: &[&str]) -> ((Kvd, String), String) {
    let (kvd, addr, before) = start_full("127.0.0.1:0", args, "kvd=info", false);
    ((kvd, before), addr)
}

fn start_with(listen: &str, args: &[&str], log: &str, stall: bool) -> (Kvd, String) {
    let (kvd, addr, _) = start_full(listen, args, log, stall);
    (kvd, addr)
}

fn start_full(listen: &str, args: &[&str], log: &str, stall: bool) -> (Kvd, String, String) {
    let mut command = Command::new(env!("CARGO_BIN_EXE_kvd"));
    command.args(["--listen", listen]).args(args).env("RUST_LOG", log);
    start_command(command, stall)
}

/// Starts a kvd by `command` (e.g. inside a network namespace); returns it, the address of
/// its ready line, and what it logged before that line.
pub fn start_command(mut command: Command, stall: bool) -> (Kvd, String, String) {
    let mut child = command.stderr(Stdio::piped()).spawn().unwrap();
    let stderr = child.stderr.take().unwrap();
    // Guard the child first, so a failed start does not leave it running.
    let guard = Kvd(child, None);
    let mut lines = BufReader::new(stderr).lines();
    // Lines before the ready line (e.g. what a data directory recovered) are kept apart.
    let mut before = String::new();
    let ready = lines
        .by_ref()
        .take(50)
        .map_while(Result::ok)
        .find(|l| {
            let ready = l.contains("listening on");
            if !ready {
                before.push_str(l);
                before.push('\n');
            }
            ready
        })
        .unwrap_or_else(|| panic!("kvd printed no ready line; it said:\n{before}"));
    let addr = ready
        .rsplit("listening on ")
        .next()
        .expect("no ready line")
        .trim()
        .to_string();
    assert!(ready.contains("kvd shard"), "{ready}");
    let mut guard = guard;
    if stall {
        guard.1 = Some(Box::new(lines));
        return (guard, addr, before);
    }
    // Keep draining stderr so kvd never blocks on a full pipe.
    std::thread::spawn(move || for _ in lines {});
    (guard, addr, before)
}

/// A port free at the time of asking (for nodes that must know each other's addresses
/// before they start).
///
/// Picked below Linux's ephemeral range (32768-60999), from which outgoing connections take
/// their source ports: a port picked there (by binding port 0) could be taken by a test's
/// client connection before kvd binds it, and kvd then fails to start ("printed no ready
/// line", seen once under the 64-connection INCR test). Distinct within a process.
pub fn free_port() -> u16 {
    use std::sync::atomic::{AtomicU32, Ordering};
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let start = std::process::id().wrapping_mul(7919);
    for _ in 0..12_000 {
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let port = 20_000 + (start.wrapping_add(n) % 12_000) as u16;
        if std::net::TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return port;
        }
    }
    panic!("no free port in 20000-31999 on 127.0.0.1");
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

/// Two nodes (shards 0/2 and 1/2), each with a RESP port and the other's address for
/// forwarding; returns the guards and the two RESP addresses.
pub fn resp_cluster(extra: &[&str]) -> (Vec<Kvd>, Vec<String>) {
    let bin: Vec<String> = (0..2).map(|_| format!("127.0.0.1:{}", free_port())).collect();
    let resp: Vec<String> = (0..2).map(|_| format!("127.0.0.1:{}", free_port())).collect();
    let nodes = bin.join(",");
    let mut guards = Vec::new();
    for i in 0..2 {
        let shard = format!("{i}/2");
        let mut args = vec!["--shard", &shard, "--resp", &resp[i], "--nodes", &nodes];
        args.extend(extra);
        guards.push(start_at(&bin[i], &args).0);
    }
    (guards, resp)
}

/// A 3-member replica group started with `--data-dir` (fresh directories named after
/// `name`) and `--resp`: its members, their RESP addresses, and which one leads (found
/// with `INFO replication`, within 10 s).
pub fn resp_group(name: &str) -> (Vec<Kvd>, Vec<String>, usize) {
    let bin: Vec<String> = (0..3).map(|_| format!("127.0.0.1:{}", free_port())).collect();
    let resp: Vec<String> = (0..3).map(|_| format!("127.0.0.1:{}", free_port())).collect();
    let members = bin.join(",");
    let mut guards = Vec::new();
    for i in 0..3 {
        let dir = std::env::temp_dir().join(format!("kvd-{name}-{}-{i}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let d = dir.display().to_string();
        guards.push(start_at(&bin[i], &["--data-dir", &d, "--group", &members, "--resp", &resp[i]]).0);
    }
    let init = kvd(&["admin", "init-group", "--nodes", &bin.join("|")]);
    assert!(init.status.success(), "{}", String::from_utf8_lossy(&init.stderr));
    let leads = |addr: &str| {
        let Ok(mut s) = TcpStream::connect(addr) else {
            return false;
        };
        let _ = s.set_read_timeout(Some(std::time::Duration::from_secs(3)));
        let _ = s.write_all(b"INFO replication\r\nQUIT\r\n");
        let mut out = Vec::new();
        let _ = s.read_to_end(&mut out);
        String::from_utf8_lossy(&out).contains("role:master")
    };
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        if let Some(leader) = (0..3).find(|&i| leads(&resp[i])) {
            return (guards, resp, leader);
        }
        assert!(std::time::Instant::now() < deadline, "no leader");
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
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

/// The venv's Python with redis-py, made by `.ci/run` (or `KV_PYTHON`).
#[allow(dead_code)]
pub fn python() -> Option<std::path::PathBuf> {
    if let Some(p) = std::env::var_os("KV_PYTHON") {
        return Some(std::path::PathBuf::from(p));
    }
    let venv = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target/pyvenv/bin/python");
    venv.exists().then_some(venv)
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
pub fn groups_cluster(name: &str, groups: usize, members: usize) -> (Vec<Kvd>, String, Vec<Vec<String>>) {
    let port = |_| format!("127.0.0.1:{}", free_port());
    let bin: Vec<Vec<String>> = (0..groups).map(|_| (0..members).map(port).collect()).collect();
    let resp: Vec<Vec<String>> = (0..groups).map(|_| (0..members).map(port).collect()).collect();
    let nodes = bin.iter().map(|g| g.join("|")).collect::<Vec<_>>().join(",");
    let mut guards = Vec::new();
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
            let dir = std::env::temp_dir().join(format!("kvd-{name}-{}-{g}-{m}", std::process::id()));
            let (d, group) = (dir.display().to_string(), bin[g].join(","));
            if members > 1 {
                let _ = std::fs::remove_dir_all(&dir);
                args.extend(["--data-dir", &d, "--group", &group]);
            }
            guards.push(start_at(&bin[g][m], &args).0);
        }
        if members > 1 {
            let init = kvd(&["admin", "init-group", "--nodes", &bin[g].join("|")]);
            assert!(init.status.success(), "{}", String::from_utf8_lossy(&init.stderr));
        }
    }
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    for addr in resp.iter().flatten() {
        while !raw(addr, b"CLUSTER INFO\r\nQUIT\r\n").contains("cluster_state:ok") {
            assert!(
                std::time::Instant::now() < deadline,
                "{addr}: the cluster's state never became ok"
            );
            std::thread::sleep(std::time::Duration::from_millis(100));
        }
    }
    (guards, nodes, resp)
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
