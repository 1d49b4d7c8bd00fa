//! The edge's rules hold on every front (binary, RESP, HTTP), against the real binary: the
//! outside probe's findings of issue 26, one test each. Peers on "another host" are made in
//! network namespaces (root and iproute2, which `.ci/run` has); the rest is 127.0.0.1.

mod common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use common::{HANG, Kvd, Netns, addr, kvd, rss_bytes, self_signed, start_at, start_command, token_file, until};
use kvshared::frame::{FrameHeader, FrameKind};
use kvshared::wire::BatchRequest;

const KVD: &str = env!("CARGO_BIN_EXE_kvd");

/// A kvd with all three fronts on free 127.0.0.1 ports.
struct Fronts {
    server: Kvd,
    binary: String,
    resp: String,
    http: String,
}

fn start_fronts(extra: &[&str]) -> Fronts {
    let (resp, http) = (addr(), addr());
    let mut args = vec!["--resp", &resp, "--http", &http];
    args.extend(extra);
    let (server, binary) = start_at("127.0.0.1:0", &args);
    Fronts {
        server,
        binary,
        resp,
        http,
    }
}

/// The node's counters, read with `kvd stats --json` (with the token file, if any).
fn counters(binary: &str, token: Option<&str>) -> serde_json::Value {
    let mut c = Command::new(KVD);
    c.args(["stats", "--nodes", binary, "--json"]).env_remove("KV_NODES");
    if let Some(t) = token {
        c.env("KV_AUTH_TOKEN_FILE", t);
    }
    let out = c.output().unwrap();
    let json: serde_json::Value =
        serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&out.stderr)));
    json[0]["stats"].clone()
}

/// `redis-cli args` against `addr` (given up after [`HANG`]): its stdout and stderr together.
fn redis_cli(addr: &str, args: &[&str]) -> String {
    let (host, port) = addr.rsplit_once(':').unwrap();
    let out = Command::new("timeout")
        .arg(HANG.as_secs().to_string())
        .arg(kvtestkit::tools::program("redis-cli"))
        .args(["-h", host, "-p", port])
        .args(args)
        .output()
        .unwrap();
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// `curl -s` with `args`: the body, then the status code on a line of its own.
fn curl(args: &[&str]) -> (String, u16) {
    let out = Command::new(kvtestkit::tools::program("curl"))
        .args(["-s", "--max-time", &HANG.as_secs().to_string(), "-w", "\n%{http_code}"])
        .args(args)
        .output()
        .expect("curl is needed");
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    let (body, code) = text.rsplit_once('\n').unwrap_or(("", "0"));
    (body.to_string(), code.trim().parse().unwrap_or(0))
}

/// Reads from `s` until EOF, an error, or `within`: what arrived, and whether the server
/// closed the connection.
fn read_until_closed(s: &mut TcpStream, within: Duration) -> (Vec<u8>, bool) {
    let until = Instant::now() + within;
    let mut got = Vec::new();
    let mut chunk = [0u8; 16 * 1024];
    while Instant::now() < until {
        s.set_read_timeout(Some(Duration::from_millis(100))).unwrap();
        match s.read(&mut chunk) {
            Ok(0) => return (got, true),
            Ok(n) => got.extend_from_slice(&chunk[..n]),
            Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => {}
            Err(_) => return (got, true),
        }
    }
    (got, false)
}

/// Finding 1: protected mode is decided per listener from its own address, and holds on
/// RESP and HTTP: a peer on another host cannot run SET, GET or INFO, the refusals are
/// counted, and kvd says so at start. A loopback client is served on every front.
#[test]
#[ignore = "needs root: a network namespace for the other host (.ci/run runs it, as root)"]
fn protected_mode_holds_on_every_front_bound_beyond_loopback() {
    kvtestkit::tools::require_root("protected mode's test");
    let ns = Netns::with_address("kvd-edge-protected", "10.77.0.2");
    // (Fixed ports: the namespace has a port space of its own.)
    let args = [
        "--listen",
        "127.0.0.1:7311",
        "--resp",
        "0.0.0.0:7312",
        "--http",
        "0.0.0.0:7313",
    ];
    let (_server, _addr, before) = start_command(ns.command(KVD, &args), &args, false);
    assert!(before.contains("protected mode on the resp port"), "{before}");
    assert!(before.contains("protected mode on the http port"), "{before}");
    assert!(!before.contains("protected mode on the binary port"), "{before}");
    let in_ns = |program: &str, args: &[&str]| {
        let out = ns.command(program, args).output().unwrap();
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    };
    for command in [&["set", "remote", "v"][..], &["get", "k"], &["info"]] {
        let said = in_ns("redis-cli", &[&["-h", "10.77.0.2", "-p", "7312"], command].concat());
        assert!(
            said.contains("DENIED") && said.contains("protected mode"),
            "{command:?}: {said}"
        );
    }
    let said = in_ns(
        "curl",
        &[
            "-s",
            "-w",
            "\n%{http_code}",
            "http://10.77.0.2:7313/kv/remote",
            "-X",
            "PUT",
            "-d",
            "v",
        ],
    );
    assert!(said.ends_with("403") && said.contains("protected mode"), "{said}");
    // Loopback clients are served on every front; the remote SET never ran.
    let local = in_ns("redis-cli", &["-h", "127.0.0.1", "-p", "7312", "exists", "remote"]);
    assert_eq!(local.trim(), "0", "{local}");
    let local = in_ns("curl", &["-s", "http://127.0.0.1:7313/healthz"]);
    assert!(local.contains("serving"), "{local}");
    let stats = in_ns(KVD, &["stats", "--nodes", "127.0.0.1:7311", "--json"]);
    let json: serde_json::Value = serde_json::from_str(&stats).unwrap_or_else(|e| panic!("{e}: {stats}"));
    let refused = json[0]["stats"]["protected_refused"].as_u64().unwrap();
    assert!(refused >= 4, "protected_refused = {refused}");
}

/// Finding 2: with --tls-cert, every front speaks TLS only: RESP over TLS (as Redis's
/// tls-port) and HTTPS are served; plaintext on either is told to use TLS, in its own
/// protocol.
#[test]
fn tls_is_spoken_on_every_front() {
    let (cert, key) = self_signed("edge-tls");
    let token = token_file("edge-tls-token", "0123456789abcdef0123456789abcdef");
    let f = start_fronts(&["--tls-cert", &cert, "--tls-key", &key, "--auth-token-file", &token]);
    let t = "0123456789abcdef0123456789abcdef";
    let tls = ["--tls", "--cacert", &cert, "-a", t, "--no-auth-warning"];
    assert_eq!(
        redis_cli(&f.resp, &[&tls[..], &["set", "k", "v"]].concat()).trim(),
        "OK"
    );
    assert_eq!(redis_cli(&f.resp, &[&tls[..], &["get", "k"]].concat()).trim(), "v");
    let plain = redis_cli(&f.resp, &["-a", t, "--no-auth-warning", "get", "k"]);
    assert!(plain.contains("TLS only") && !plain.contains("\nv"), "{plain}");

    let bearer = format!("Authorization: Bearer {t}");
    let url = format!("https://{}/kv/k", f.http);
    let (body, code) = curl(&["--cacert", &cert, "-H", &bearer, &url]);
    assert_eq!((body.as_str(), code), ("v", 200));
    let (body, code) = curl(&["-H", &bearer, &format!("http://{}/kv/k", f.http)]);
    assert_eq!(code, 400, "{body}");
    assert!(body.contains("TLS only"), "{body}");
    drop(f);
}

/// Finding 3: before the token a connection may make the node hold only a few KiB, on every
/// front: 24 clients per front announcing 64 MiB and sending 1 MiB each hold almost
/// nothing, and a client with the token then stores and reads a 60 MB value.
#[test]
fn without_the_token_a_connection_holds_almost_nothing_on_every_front() {
    let token = token_file("edge-preauth-token", "0123456789abcdef0123456789abcdef");
    let f = start_fronts(&["--auth-token-file", &token, "--max-buffer-memory", "256mib"]);
    let before = rss_bytes(f.server.pid());
    let megabyte = vec![b'x'; 1 << 20];
    let binary_header = FrameHeader {
        kind: FrameKind::BatchRequest,
        len: 64 << 20,
        id: 1,
    }
    .encode()
    .to_vec();
    let resp_header = b"*2\r\n$4\r\nAUTH\r\n$67108864\r\n".to_vec();
    let http_header = b"PUT /kv/x HTTP/1.1\r\nhost: a\r\ncontent-length: 67108864\r\n\r\n".to_vec();
    let mut conns = Vec::new();
    for (addr, header) in [
        (&f.binary, &binary_header),
        (&f.resp, &resp_header),
        (&f.http, &http_header),
    ] {
        for _ in 0..24 {
            let mut s = TcpStream::connect(addr).unwrap();
            s.set_write_timeout(Some(Duration::from_secs(2))).unwrap();
            let _ = s.write_all(header);
            let _ = s.write_all(&megabyte);
            conns.push(s);
        }
    }
    // Once the node has taken all 72 and dealt with each (refused and closed it: only the
    // stats request's own connection is open)...
    until("the 72 connections to be refused and closed", HANG, || {
        let stats = counters(&f.binary, Some(&token));
        let (opened, closed) = (
            stats["conns_opened"].as_u64().unwrap_or(0),
            stats["conns_closed"].as_u64().unwrap_or(0),
        );
        if opened >= 72 && opened - closed <= 1 {
            Ok(())
        } else {
            Err((opened, closed))
        }
    });
    let during = rss_bytes(f.server.pid());
    assert!(
        during < before + (48 << 20),
        "72 unauthenticated 64 MiB announcements hold {} MiB",
        (during.saturating_sub(before)) >> 20
    );
    // Each was answered with a refusal, in its protocol.
    let mut answers = String::new();
    for s in conns.iter_mut().skip(24).step_by(24) {
        let (said, _) = read_until_closed(s, HANG);
        answers.push_str(&String::from_utf8_lossy(&said));
    }
    assert!(answers.contains("-ERR Protocol error"), "{answers}");
    assert!(answers.contains("401 Unauthorized"), "{answers}");
    drop(conns);

    let client = redis::Client::open(format!("redis://:{}@{}/", "0123456789abcdef0123456789abcdef", f.resp)).unwrap();
    let mut con = client.get_connection().unwrap();
    let value = vec![7u8; 60_000_000];
    let _: () = redis::cmd("SET").arg("big").arg(&value).query(&mut con).unwrap();
    let back: Vec<u8> = redis::cmd("GET").arg("big").query(&mut con).unwrap();
    assert_eq!(back.len(), value.len());
}

/// Finding 4: a RESP command that has begun must arrive whole within --read-timeout; one
/// byte at a time does not keep it open (the deadline used to restart on every byte).
#[test]
fn a_trickled_resp_command_is_closed_at_the_read_deadline() {
    let f = start_fronts(&["--read-timeout", "1s"]);
    let mut s = TcpStream::connect(&f.resp).unwrap();
    let writer = s.try_clone().unwrap();
    // A SET of a 500-byte value, a byte every 100 ms: 50 s to arrive whole, against a 1 s
    // deadline.
    let command = format!("*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$500\r\n{}\r\n", "v".repeat(500));
    let (trickle, finished) = trickle(writer, command.into_bytes(), Duration::from_millis(100));
    let (said, closed) = read_until_closed(&mut s, HANG);
    assert!(closed, "the trickling connection was never closed");
    assert!(
        !finished.load(Ordering::SeqCst),
        "the whole command trickled in (50 s) before the 1 s deadline closed it: {said:?}"
    );
    let _ = trickle.join();
    assert!(counters(&f.binary, None)["conns_read_timeout"].as_u64().unwrap() >= 1);
}

/// Writes `bytes` to `writer` one at a time, `every` apart, until done or the write fails;
/// the flag says whether all were written.
fn trickle(mut writer: TcpStream, bytes: Vec<u8>, every: Duration) -> (std::thread::JoinHandle<()>, Arc<AtomicBool>) {
    let finished = Arc::new(AtomicBool::new(false));
    let done = finished.clone();
    let thread = std::thread::spawn(move || {
        for b in bytes {
            if writer.write_all(&[b]).is_err() {
                return;
            }
            std::thread::sleep(every);
        }
        done.store(true, Ordering::SeqCst);
    });
    (thread, finished)
}

/// Finding 5a: HTTP bodies are paid from the buffer budget as they arrive and must arrive
/// whole within --read-timeout: stalled uploads cannot hold the node's memory, and the
/// budget is back once they are refused.
#[test]
fn stalled_http_uploads_are_bounded_and_then_freed() {
    let f = start_fronts(&[
        "--max-buffer-memory",
        "64mib",
        "--read-timeout",
        "2s",
        "--max-frame",
        "62914560",
    ]);
    let (body, code) = curl(&[
        "-X",
        "PUT",
        "-H",
        "content-length: 62914561",
        "--data-binary",
        "x",
        &format!("http://{}/kv/over", f.http),
    ]);
    assert_eq!(code, 413, "a body over --max-frame is refused from its length: {body}");
    let before = rss_bytes(f.server.pid());
    let header = b"PUT /kv/up HTTP/1.1\r\nhost: a\r\ncontent-length: 62914560\r\n\r\n";
    let chunk = vec![b'u'; 8 << 20];
    let mut uploads = Vec::new();
    for _ in 0..12 {
        let mut s = TcpStream::connect(&f.http).unwrap();
        s.set_write_timeout(Some(Duration::from_secs(3))).unwrap();
        let _ = s.write_all(header);
        let _ = s.write_all(&chunk);
        uploads.push(s);
    }
    // (An upper bound: whatever the node has read of them by now.)
    std::thread::sleep(Duration::from_millis(800));
    let during = rss_bytes(f.server.pid());
    assert!(
        during < before + (110 << 20),
        "12 stalled 60 MiB uploads hold {} MiB with a 64 MiB budget",
        (during.saturating_sub(before)) >> 20
    );
    let mut codes = Vec::new();
    for s in &mut uploads {
        let (said, _) = read_until_closed(s, HANG);
        let text = String::from_utf8_lossy(&said);
        codes.push(text.split(' ').nth(1).unwrap_or("none").to_string());
    }
    assert!(
        codes.iter().all(|c| c == "408" || c == "503"),
        "each stalled upload is refused (timeout or no room): {codes:?}"
    );
    drop(uploads);
    let big = vec![b'v'; 30 << 20];
    let scratch = common::temp_dir("edge-upload");
    let path = scratch.path().join("upload");
    std::fs::write(&path, &big).unwrap();
    let (body, code) = curl(&[
        "-X",
        "PUT",
        "--data-binary",
        &format!("@{}", path.display()),
        &format!("http://{}/kv/up", f.http),
    ]);
    assert_eq!(code, 204, "the budget is free again: {body}");
}

/// Finding 5b: HTTP connections count against --max-conns with the other fronts', idle
/// keep-alive connections and slowloris headers are closed after --read-timeout, and then
/// new clients are served.
#[test]
fn http_connections_are_limited_and_slow_ones_closed() {
    let f = start_fronts(&["--max-conns", "8", "--read-timeout", "5s"]);
    let idle: Vec<TcpStream> = (0..8).map(|_| TcpStream::connect(&f.http).unwrap()).collect();
    // Once kvd has taken all eight (within their 5 s), a ninth is refused with a reason.
    let body = until("a ninth connection to be refused", HANG, || {
        let (body, code) = curl(&[&format!("http://{}/healthz", f.http)]);
        if code == 503 { Ok(body) } else { Err((code, body)) }
    });
    assert!(body.contains("max connections"), "{body}");
    let said = redis_cli(&f.resp, &["ping"]);
    assert!(
        said.contains("max number of clients"),
        "one limit for every front: {said}"
    );
    // The silent ones are closed after --read-timeout; then clients are served again.
    for mut s in idle {
        let (_, closed) = read_until_closed(&mut s, HANG);
        assert!(closed, "an idle HTTP connection was kept");
    }
    let (_, code) = curl(&[&format!("http://{}/healthz", f.http)]);
    assert_eq!(code, 200);
    // A keep-alive connection that goes quiet after a request is closed too.
    let mut s = TcpStream::connect(&f.http).unwrap();
    s.write_all(b"GET /healthz HTTP/1.1\r\nhost: a\r\n\r\n").unwrap();
    let (said, closed) = read_until_closed(&mut s, HANG);
    assert!(closed && String::from_utf8_lossy(&said).contains("200 OK"), "{said:?}");
    // Headers sent a byte at a time (a header of 600 bytes, one every 100 ms: a minute to
    // arrive whole) do not keep a connection.
    let mut s = TcpStream::connect(&f.http).unwrap();
    let headers = format!("GET /healthz HTTP/1.1\r\nx-slow: {}\r\n\r\n", "a".repeat(600));
    let (slow, finished) = trickle(s.try_clone().unwrap(), headers.into_bytes(), Duration::from_millis(100));
    let (_, closed) = read_until_closed(&mut s, HANG);
    assert!(
        closed && !finished.load(Ordering::SeqCst),
        "slowloris headers kept the connection"
    );
    let _ = slow.join();
}

/// Finding 6: a client that pipelines requests and never reads is disconnected after
/// --write-timeout (counted), on the binary, RESP and HTTP ports, instead of holding every
/// connection slot; then a new client is served, and (under `--max-memory`) the memory
/// their buffers took is given back.
#[test]
fn clients_that_never_read_are_disconnected_on_every_front() {
    // (With --max-memory, under which kvd gives freed memory back at once: `kvd::alloc`.)
    let f = start_fronts(&["--write-timeout", "1s", "--max-conns", "24", "--max-memory", "1gb"]);
    let value = "v".repeat(4096);
    assert_eq!(redis_cli(&f.resp, &["set", "big", &value]).trim(), "OK");
    let huge = "h".repeat(24 << 20);
    let mut put = Command::new(kvtestkit::tools::program("redis-cli"))
        .args([
            "-h",
            "127.0.0.1",
            "-p",
            f.resp.rsplit_once(':').unwrap().1,
            "-x",
            "set",
            "huge",
        ])
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    put.stdin.take().unwrap().write_all(huge.as_bytes()).unwrap();
    assert!(put.wait().unwrap().success());
    let idle = rss_bytes(f.server.pid());
    let mut gets = BatchRequest::new();
    for _ in 0..1024 {
        gets.push_get(b"big");
    }
    let frame = common::batch_frame(1, &gets);
    let resp_gets = b"*2\r\n$3\r\nGET\r\n$3\r\nbig\r\n".repeat(2000);
    let mut hogs = Vec::new();
    for i in 0..20 {
        let (addr, request): (&String, &[u8]) = if i % 2 == 0 {
            (&f.binary, &frame)
        } else {
            (&f.resp, &resp_gets)
        };
        let mut s = TcpStream::connect(addr).unwrap();
        s.set_write_timeout(Some(Duration::from_secs(1))).unwrap();
        for _ in 0..10 {
            if s.write_all(request).is_err() {
                break;
            }
        }
        hogs.push(s);
    }
    // HTTP: two gets of a 24 MB value, pipelined, never read.
    let mut s = TcpStream::connect(&f.http).unwrap();
    s.write_all(&b"GET /kv/huge HTTP/1.1\r\nhost: a\r\n\r\n".repeat(2))
        .unwrap();
    hogs.push(s);
    until("every reader-less client to be closed", HANG, || {
        let stats = counters(&f.binary, None);
        if stats["conns_write_timeout"].as_u64().unwrap_or(0) >= 21 {
            Ok(())
        } else {
            Err(stats)
        }
    });
    assert_eq!(redis_cli(&f.resp, &["ping"]).trim(), "PONG");
    let put = kvd(&["put", "--nodes", &f.binary, "k", "v"]);
    assert!(put.status.success(), "{}", String::from_utf8_lossy(&put.stderr));
    drop(hogs);
    // Their buffers' memory goes back to the OS (issue 58: 1 GB stayed resident). (Without
    // a cap it stays with the allocator: see docs/MEMORY.md.)
    let pid = f.server.pid();
    until("the non-readers' memory to be given back", HANG, || {
        let rss = rss_bytes(pid);
        if rss <= idle + (16 << 20) {
            Ok(())
        } else {
            Err(format!("RSS {} MB, {} MB before them", rss >> 20, idle >> 20))
        }
    });
}

/// Finding 7a: SIGTERM finishes within the grace period although a RESP and a binary
/// client read none of their replies and an HTTP upload is stalled.
#[test]
fn shutdown_is_bounded_whatever_the_clients_do() {
    let mut f = start_fronts(&[]);
    assert_eq!(redis_cli(&f.resp, &["set", "big", &"v".repeat(4096)]).trim(), "OK");
    let mut hog = TcpStream::connect(&f.resp).unwrap();
    hog.set_write_timeout(Some(Duration::from_secs(1))).unwrap();
    let _ = hog.write_all(&b"*2\r\n$3\r\nGET\r\n$3\r\nbig\r\n".repeat(20_000));
    let mut upload = TcpStream::connect(&f.http).unwrap();
    upload
        .write_all(b"PUT /kv/u HTTP/1.1\r\nhost: a\r\ncontent-length: 10000000\r\n\r\nabc")
        .unwrap();
    let mut gets = BatchRequest::new();
    for _ in 0..1024 {
        gets.push_get(b"big");
    }
    let mut binary_hog = TcpStream::connect(&f.binary).unwrap();
    binary_hog.set_write_timeout(Some(Duration::from_secs(1))).unwrap();
    for _ in 0..10 {
        let _ = binary_hog.write_all(&common::batch_frame(1, &gets));
    }
    // Once kvd has all three (and the stats request's own) open, SIGTERM.
    until("the three clients to be taken", HANG, || {
        let stats = counters(&f.binary, None);
        let open = stats["conns_opened"].as_u64().unwrap_or(0) - stats["conns_closed"].as_u64().unwrap_or(0);
        if open >= 4 { Ok(()) } else { Err(stats) }
    });
    f.server.signal(libc::SIGTERM);
    // It exits by itself (within its grace period; a hang fails here).
    let status = f.server.wait_exit(HANG);
    assert!(status.success(), "kvd exited with {status}");
    drop((hog, upload, binary_hog));
}

/// Finding 7b: under pipelined RESP load, SIGTERM answers every command the node read:
/// served during the drain, then "shutting down" (not run). No batch of commands ends
/// part-answered, and every client hears of the shutdown before the connection closes.
#[test]
fn shutdown_under_resp_load_answers_every_command_read() {
    let mut f = start_fronts(&[]);
    let clients: Vec<_> = (0..8)
        .map(|c| {
            let addr = f.resp.clone();
            std::thread::spawn(move || {
                let mut s = TcpStream::connect(&addr).unwrap();
                s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
                let batch: Vec<u8> = (0..64)
                    .flat_map(|i| format!("*3\r\n$3\r\nSET\r\n$6\r\nk{c}-{i:03}\r\n$3\r\nval\r\n").into_bytes())
                    .collect();
                let (mut served, mut refused) = (0u64, 0u64);
                let until = Instant::now() + HANG;
                while Instant::now() < until {
                    if s.write_all(&batch).is_err() {
                        return (served, refused, "the write failed before any refusal".to_string());
                    }
                    let mut reader = std::io::BufReader::new(&s);
                    for i in 0..64 {
                        let mut line = String::new();
                        match std::io::BufRead::read_line(&mut reader, &mut line) {
                            Ok(n) if n > 0 && line == "+OK\r\n" => served += 1,
                            Ok(n) if n > 0 && line.contains("shutting down") => refused += 1,
                            other => return (served, refused, format!("reply {i} of a batch: {other:?} {line:?}")),
                        }
                    }
                    if refused > 0 {
                        return (served, refused, String::new());
                    }
                }
                (served, refused, "no shutdown seen".to_string())
            })
        })
        .collect();
    until("1,000 commands served", HANG, || {
        let puts = counters(&f.binary, None)["puts"].as_u64().unwrap_or(0);
        if puts > 1000 { Ok(()) } else { Err(puts) }
    });
    f.server.signal(libc::SIGTERM);
    let mut total = 0;
    for c in clients {
        let (served, refused, problem) = c.join().unwrap();
        assert!(problem.is_empty(), "{problem} (served {served}, refused {refused})");
        total += served;
    }
    assert!(total > 1000, "only {total} commands served before the shutdown");
    assert!(f.server.wait_exit(HANG).success());
}

/// Finding 8: start-up flags that pass parsing but cannot work are refused at once, in one
/// line naming the flag or file, instead of eating memory or panicking after the ready line.
#[test]
fn impossible_settings_are_refused_at_start() {
    let (cert, key) = self_signed("edge-flags");
    for (args, says) in [
        (&["--auth-token-file", "/dev/zero"][..], "/dev/zero"),
        (&["--tls-cert", "/dev/zero", "--tls-key", &key][..], "/dev/zero"),
        (&["--tls-cert", &cert, "--tls-key", "/dev/zero"][..], "/dev/zero"),
        (&["--capacity", "4294967296"][..], "--capacity"),
        (&["--capacity", "300000000", "--max-memory", "1gb"][..], "--capacity"),
        (&["--max-conns", "18446744073709551615"][..], "--max-conns"),
        (&["--read-timeout", "500000000000y"][..], "--read-timeout"),
        (&["--read-timeout", "1000d"][..], "--read-timeout"),
        (&["--write-timeout", "0s"][..], "--write-timeout"),
        (&["--idle-timeout", "90d"][..], "--idle-timeout"),
        (&["--max-memory", "1b"][..], "--max-memory"),
    ] {
        let out = Command::new("timeout")
            .args([&HANG.as_secs().to_string(), KVD, "--listen", "127.0.0.1:0"])
            .args(args)
            .stdout(Stdio::null())
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert!(err.contains(says), "{args:?}: {err}");
    }
    // A token file others may read is taken, with a warning naming it.
    let path = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("edge-readable-token");
    std::fs::write(&path, "0123456789abcdef0123456789abcdef\n").unwrap();
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
    }
    let path = path.display().to_string();
    let args = ["--listen", "127.0.0.1:0", "--auth-token-file", &path];
    let mut command = Command::new(KVD);
    command.args(args).env("RUST_LOG", "info");
    let (_server, _, before) = start_command(command, &args, false);
    assert!(
        before.contains("may be read by other users") && before.contains(&path),
        "{before}"
    );
}

/// Finding 9: failed authentications are counted on every front, in stats and /metrics.
#[test]
fn failed_authentication_is_counted_per_front() {
    let token = token_file("edge-count-token", "0123456789abcdef0123456789abcdef");
    let wrong = token_file("edge-count-wrong", "fedcba9876543210fedcba9876543210");
    let f = start_fronts(&["--auth-token-file", &token]);
    for _ in 0..3 {
        let said = redis_cli(&f.resp, &["-a", "not-the-token", "--no-auth-warning", "ping"]);
        assert!(said.contains("WRONGPASS") || said.contains("NOAUTH"), "{said}");
    }
    for header in ["Authorization: Bearer nope", "X-Nothing: 1"] {
        let (_, code) = curl(&["-H", header, &format!("http://{}/stats", f.http)]);
        assert_eq!(code, 401);
    }
    let out = kvd(&["put", "--nodes", &f.binary, "--auth-token-file", &wrong, "k", "v"]);
    assert_eq!(out.status.code(), Some(2));
    let stats = counters(&f.binary, Some(&token));
    assert_eq!(stats["auth_failed_http"], 2, "{stats}");
    // redis-cli runs AUTH, then the command (refused: NOAUTH): two per try.
    assert_eq!(stats["auth_failed_resp"], 6, "{stats}");
    let binary = stats["auth_failed"].as_u64().unwrap() - 8;
    assert!(
        binary >= 1,
        "every front's together, the binary port's wrong token too: {stats}"
    );
    let (metrics, code) = curl(&[
        "-H",
        "authorization: bearer 0123456789abcdef0123456789abcdef",
        &format!("http://{}/metrics", f.http),
    ]);
    assert_eq!(code, 200, "the bearer scheme in lower case is accepted");
    assert!(
        metrics.contains("kvd_errors_total{shard=\"0\",shards=\"1\",kind=\"auth_failed_resp\"} 6"),
        "{metrics}"
    );
    assert!(
        metrics.contains("kvd_errors_total{shard=\"0\",shards=\"1\",kind=\"auth_failed_http\"} 2"),
        "{metrics}"
    );
}

/// Finding 10: a client on the wrong port is told at once, in its own protocol, where its
/// protocol is served (it used to wait 5-10 s for a reply). Each tool here waits as long as
/// the test does ([`HANG`]) before giving up on its own, so each answer below came from kvd,
/// unasked: a kvd that waited for the client would hang the test.
#[test]
fn the_wrong_port_names_the_right_one_at_once() {
    let f = start_fronts(&[]);
    let said = redis_cli(&f.binary, &["get", "k"]);
    assert!(
        said.contains(&format!("RESP (Redis) is served on {}", f.resp)),
        "{said}"
    );
    let out = kvd(&["get", "--nodes", &f.resp, "--timeout", "1h", "k"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains(&format!("binary protocol is served on {}", f.binary)),
        "{err}"
    );
    let (body, code) = curl(&[&format!("http://{}/metrics", f.binary)]);
    assert_eq!(code, 400);
    assert!(body.contains(&format!("HTTP is served on {}", f.http)), "{body}");
    let said = redis_cli(&f.http, &["ping"]);
    assert!(said.contains("this is kvd's http port"), "{said}");
    let (body, code) = curl(&[&format!("http://{}/healthz", f.resp)]);
    assert_eq!(code, 400, "{body}");
    let stats = counters(&f.binary, None);
    assert!(stats["wrong_protocol"].as_u64().unwrap() >= 5, "{stats}");
    // A kvd without an HTTP front says how to start one.
    let (_server, binary) = start_at("127.0.0.1:0", &[]);
    let (body, _) = curl(&[&format!("http://{binary}/metrics")]);
    assert!(body.contains("start it with --http ADDR"), "{body}");
}

/// Idle connections are closed on every front: after --idle-timeout on the binary and RESP
/// ports, and after --read-timeout (the time a request's headers have) on HTTP.
#[test]
fn idle_connections_are_closed_on_every_front() {
    let f = start_fronts(&["--idle-timeout", "1s", "--read-timeout", "1s"]);
    let mut resp = TcpStream::connect(&f.resp).unwrap();
    resp.write_all(b"PING\r\n").unwrap();
    let mut http = TcpStream::connect(&f.http).unwrap();
    http.write_all(b"GET /healthz HTTP/1.1\r\nhost: a\r\n\r\n").unwrap();
    let mut binary = TcpStream::connect(&f.binary).unwrap();
    for (name, s, says) in [
        ("binary", &mut binary, ""),
        ("resp", &mut resp, "+PONG"),
        ("http", &mut http, "200 OK"),
    ] {
        let (said, closed) = read_until_closed(s, HANG);
        assert!(closed, "the idle {name} connection was kept");
        assert!(String::from_utf8_lossy(&said).contains(says), "{name}: {said:?}");
    }
    assert!(counters(&f.binary, None)["conns_idle_closed"].as_u64().unwrap() >= 2);
}

/// Warnings a peer can cause are rate-limited on every front: 300 wrong tokens on one RESP
/// connection and 300 on one HTTP connection write a few lines, and the rest are counted.
#[test]
fn peers_cannot_flood_the_log_through_resp_or_http() {
    let token = token_file("edge-flood-token", "0123456789abcdef0123456789abcdef");
    let f = start_fronts(&["--auth-token-file", &token]);
    let mut resp = TcpStream::connect(&f.resp).unwrap();
    resp.write_all(&b"*2\r\n$4\r\nAUTH\r\n$5\r\nwrong\r\n".repeat(300))
        .unwrap();
    let mut http = TcpStream::connect(&f.http).unwrap();
    http.write_all(&b"GET /stats HTTP/1.1\r\nhost: a\r\nauthorization: Bearer wrong\r\n\r\n".repeat(300))
        .unwrap();
    for (s, answers) in [(&mut resp, "WRONGPASS"), (&mut http, "401 Unauthorized")] {
        let mut said = Vec::new();
        until("every wrong token to be answered", HANG, || {
            let (more, _) = read_until_closed(s, Duration::from_millis(200));
            said.extend(more);
            let n = String::from_utf8_lossy(&said).matches(answers).count();
            if n >= 300 { Ok(()) } else { Err(n) }
        });
    }
    let stats = counters(&f.binary, Some(&token));
    assert_eq!(stats["auth_failed"], 600, "{stats}");
    assert!(stats["log_suppressed"].as_u64().unwrap() >= 600 - 6, "{stats}");
}

/// Issue 58, item 6: an HTTP client that keeps sending on its keep-alive connection through
/// SIGTERM is answered for every request: served during the drain, then 503 "shutting down"
/// (not run), until it pauses or the refusals end; then the connection closes. (hyper was
/// told to close at once, and dropped the pipelined requests it had read.)
#[test]
fn http_requests_during_shutdown_are_served_then_refused_never_dropped() {
    let mut f = start_fronts(&[]);
    let mut s = TcpStream::connect(&f.http).unwrap();
    s.set_read_timeout(Some(HANG)).unwrap();
    let mut reader = std::io::BufReader::new(s.try_clone().unwrap());
    let (mut served, mut refused) = (0u32, 0u32);
    let until = Instant::now() + HANG;
    let mut signalled = false;
    while Instant::now() < until {
        if s.write_all(b"GET /kv/k HTTP/1.1\r\nHost: kvd\r\n\r\n").is_err() {
            break;
        }
        // The status line, the headers, and the body (its length given).
        let mut line = String::new();
        if std::io::BufRead::read_line(&mut reader, &mut line).unwrap_or(0) == 0 {
            break; // closed: after the last answer
        }
        let status: u16 = line.split(' ').nth(1).and_then(|c| c.parse().ok()).unwrap_or(0);
        let mut length = 0usize;
        loop {
            let mut h = String::new();
            std::io::BufRead::read_line(&mut reader, &mut h).unwrap();
            if h == "\r\n" {
                break;
            }
            if let Some(v) = h.to_ascii_lowercase().strip_prefix("content-length:") {
                length = v.trim().parse().unwrap();
            }
        }
        let mut body = vec![0; length];
        reader.read_exact(&mut body).unwrap();
        match status {
            404 => served += 1,
            503 => {
                assert!(String::from_utf8_lossy(&body).contains("shutting down"), "{body:?}");
                refused += 1;
            }
            other => panic!("status {other}: {line}"),
        }
        if served == 20 && !signalled {
            f.server.signal(libc::SIGTERM);
            signalled = true;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    assert!(signalled && refused > 0, "served {served}, refused {refused}");
    assert!(f.server.wait_exit(HANG).success());
}
