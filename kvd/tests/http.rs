//! The HTTP front against the binary: /kv on a 2-node cluster (forwarded keys included),
//! /stats, /healthz, and /metrics checked by Prometheus's own `promtool check metrics`.

mod common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::{Command, Stdio};

use common::{Kvd, addr, start_at};
/// Two nodes with HTTP fronts that forward each other's keys; the guards and HTTP addresses.
fn cluster() -> (Vec<Kvd>, Vec<String>) {
    let bin: Vec<String> = (0..2).map(|_| addr()).collect();
    let http: Vec<String> = (0..2).map(|_| addr()).collect();
    let nodes = bin.join(",");
    let guards = (0..2)
        .map(|i| {
            let shard = format!("{i}/2");
            start_at(&bin[i], &["--shard", &shard, "--http", &http[i], "--nodes", &nodes]).0
        })
        .collect();
    (guards, http)
}

/// One HTTP/1.1 request (connection closed after it); the status and the body.
fn request(addr: &str, method: &str, path: &str, body: &[u8]) -> (u16, Vec<u8>) {
    request_with(addr, method, path, "", body)
}

/// As [`request`], with extra header lines (each ending in CRLF).
fn request_with(addr: &str, method: &str, path: &str, headers: &str, body: &[u8]) -> (u16, Vec<u8>) {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(common::HANG)).unwrap();
    let head = format!(
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\n{headers}Content-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    s.write_all(head.as_bytes()).unwrap();
    s.write_all(body).unwrap();
    let mut raw = Vec::new();
    s.read_to_end(&mut raw).unwrap();
    let split = raw.windows(4).position(|w| w == b"\r\n\r\n").expect("no header end");
    let head = String::from_utf8_lossy(&raw[..split]).to_string();
    let status: u16 = head.split_whitespace().nth(1).unwrap().parse().unwrap();
    let mut body = raw[split + 4..].to_vec();
    if head.to_ascii_lowercase().contains("transfer-encoding: chunked") {
        body = dechunk(&body);
    }
    (status, body)
}

fn dechunk(mut b: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    loop {
        let nl = b.windows(2).position(|w| w == b"\r\n").unwrap();
        let len = usize::from_str_radix(std::str::from_utf8(&b[..nl]).unwrap().trim(), 16).unwrap();
        if len == 0 {
            return out;
        }
        out.extend_from_slice(&b[nl + 2..nl + 2 + len]);
        b = &b[nl + 2 + len + 2..];
    }
}

#[test]
fn kv_round_trips_on_either_node_with_percent_decoded_keys() {
    let (_nodes, http) = cluster();
    for i in 0..40 {
        let (status, _) = request(&http[0], "PUT", &format!("/kv/user%3A{i}"), format!("v{i}").as_bytes());
        assert_eq!(status, 204);
    }
    // Read back through the other node: about half the keys are forwarded each way.
    for i in 0..40 {
        let (status, body) = request(&http[1], "GET", &format!("/kv/user:{i}"), b"");
        assert_eq!((status, body), (200, format!("v{i}").into_bytes()), "user:{i}");
    }
    let (status, _) = request(&http[0], "DELETE", "/kv/user:3", b"");
    assert_eq!(status, 204);
    let (status, body) = request(&http[1], "GET", "/kv/user:3", b"");
    assert_eq!(status, 404);
    let err: serde_json::Value = serde_json::from_slice(&body).unwrap();
    assert!(err["error"].as_str().unwrap().contains("user:3"), "{err}");
    let (status, _) = request(&http[0], "DELETE", "/kv/user:3", b"");
    assert_eq!(status, 404);
    // Raw bytes in, raw bytes out.
    let value: Vec<u8> = (0..=255u8).collect();
    assert_eq!(request(&http[0], "PUT", "/kv/bin", &value).0, 204);
    assert_eq!(request(&http[1], "GET", "/kv/bin", b""), (200, value));
    // Keys are any bytes, escaped; an escape that is not one is refused, never taken literally.
    assert_eq!(request(&http[0], "PUT", "/kv/%FF%00%25", b"raw").0, 204);
    assert_eq!(request(&http[1], "GET", "/kv/%ff%00%25", b""), (200, b"raw".to_vec()));
    for method in ["GET", "PUT", "DELETE"] {
        let (status, body) = request(&http[0], method, "/kv/%zz", b"x");
        assert_eq!(status, 400, "{method}");
        let err: serde_json::Value = serde_json::from_slice(&body).unwrap();
        assert!(err["error"].as_str().unwrap().contains("two hex digits"), "{err}");
    }
    assert_eq!(request(&http[0], "GET", "/kv/%25zz", b"").0, 404);
}

#[test]
fn stats_healthz_and_metrics_that_promtool_accepts() {
    let (_nodes, http) = cluster();
    assert_eq!(request(&http[0], "PUT", "/kv/a", b"1").0, 204);
    assert_eq!(request(&http[0], "GET", "/kv/a", b"").0, 200);

    let (status, body) = request(&http[0], "GET", "/stats", b"");
    assert_eq!(status, 200);
    let stats: serde_json::Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(stats["shard"], "0/2");
    assert!(stats["durability"]["mode"] == "memory", "{stats}");

    let (status, body) = request(&http[1], "GET", "/healthz", b"");
    assert_eq!(status, 200);
    let health: serde_json::Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(
        (health["status"].as_str(), health["shard"].as_str()),
        (Some("serving"), Some("1/2"))
    );

    let (status, body) = request(&http[0], "GET", "/metrics", b"");
    assert_eq!(status, 200);
    let text = String::from_utf8(body).unwrap();
    assert!(text.contains("kvd_puts_total{shard=\"0\",shards=\"2\"}"), "{text}");
    assert!(text.contains("# TYPE kvd_keys gauge"), "{text}");
    let mut promtool = Command::new(kvtestkit::tools::program("promtool"))
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("promtool is missing: .ci/run takes it out of Debian's prometheus package into target/tools/usr/bin (add that to PATH)");
    promtool.stdin.take().unwrap().write_all(text.as_bytes()).unwrap();
    let out = promtool.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "promtool check metrics refused the exposition:\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn unknown_paths_and_methods_are_refused() {
    let (_nodes, http) = cluster();
    let (status, body) = request(&http[0], "GET", "/nope", b"");
    assert_eq!(status, 404);
    let json: serde_json::Value = serde_json::from_slice(&body).unwrap();
    assert!(json["error"].as_str().unwrap().contains("/kv/{key}"), "{json}");
    let (status, body) = request(&http[0], "POST", "/kv/a", b"x");
    assert_eq!(status, 405);
    let json: serde_json::Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(
        json["error"],
        "method not allowed here; this path takes GET, HEAD, PUT, DELETE"
    );
    let (status, body) = request(&http[0], "DELETE", "/metrics", b"");
    assert_eq!(status, 405);
    assert!(String::from_utf8_lossy(&body).contains("takes GET, HEAD"));
}

/// With a token, everything but /healthz wants `Authorization: Bearer TOKEN`.
#[test]
fn a_token_guards_everything_but_healthz() {
    let dir = common::temp_dir("http-token");
    let token_file = dir.path().join("token");
    let token = "0123456789abcdef0123456789abcdef";
    std::fs::write(&token_file, token).unwrap();
    let http = addr();
    let listen = addr();
    let _node = start_at(
        &listen,
        &["--http", &http, "--auth-token-file", token_file.to_str().unwrap()],
    );
    assert_eq!(request(&http, "GET", "/kv/a", b"").0, 401);
    assert_eq!(request(&http, "GET", "/metrics", b"").0, 401);
    assert_eq!(request(&http, "GET", "/healthz", b"").0, 200);
    let bearer = format!("Authorization: Bearer {token}\r\n");
    let with = |method: &str, path: &str, body: &[u8]| request_with(&http, method, path, &bearer, body).0;
    assert_eq!(with("PUT", "/kv/a", b"1"), 204);
    assert_eq!(with("GET", "/kv/a", b""), 200);
}

/// A slot frozen for a hand-over: its writes are answered "try again" on every front (binary
/// `TryAgain`, RESP `-TRYAGAIN`, HTTP 503) and run nowhere; its reads are still served.
#[test]
fn a_slot_being_moved_answers_try_again_on_every_front() {
    use kvshared::client::{ClientConfig, Cluster};
    use kvshared::slots::SlotState;
    use kvshared::wire::{BatchRequest, OpStatus};

    let (bin, resp, http) = (addr(), addr(), addr());
    let _node = start_at(&bin, &["--resp", &resp, "--http", &http]).0;
    assert_eq!(request(&http, "PUT", "/kv/moving", b"v1").0, 204);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let client = Cluster::new(std::slice::from_ref(&bin), ClientConfig::default()).unwrap();
    let slot = kvshared::routing::key_slot(b"moving");
    common::set_slot(&rt, &client, 0, slot, (SlotState::Frozen, 0, 1));

    let mut put = BatchRequest::new();
    put.push_put(b"moving", b"v2");
    let reply = rt.block_on(client.send_batch(0, &put)).unwrap();
    assert_eq!(reply.batch().unwrap().status(0), Some(OpStatus::TryAgain));
    let set = common::raw(
        &resp,
        b"*3\r\n$3\r\nSET\r\n$6\r\nmoving\r\n$2\r\nv3\r\n*2\r\n$3\r\nGET\r\n$6\r\nmoving\r\n*1\r\n$4\r\nQUIT\r\n",
    );
    assert!(set.starts_with("-TRYAGAIN "), "{set}");
    assert!(set.contains("\r\n$2\r\nv1\r\n"), "{set}");
    let (status, body) = request(&http, "PUT", "/kv/moving", b"v4");
    assert_eq!(status, 503, "{}", String::from_utf8_lossy(&body));
    assert_eq!(request(&http, "GET", "/kv/moving", b""), (200, b"v1".to_vec()));
    // Keys of other slots are written as before.
    assert_eq!(request(&http, "PUT", "/kv/staying", b"s").0, 204);
}

/// A slot being copied into node 1 (importing there while node 0 still serves it): node 1's
/// binary front redirects to node 0 (`Moved`, at an epoch below the import's), and its
/// forwarding fronts (HTTP, RESP) answer from node 0, so a move's copy ahead of the freeze
/// takes nothing from the keys' readers and writers, whichever node they ask.
#[test]
fn a_slot_importing_at_a_node_is_served_by_its_source_through_that_node() {
    use kvshared::client::{ClientConfig, Cluster};
    use kvshared::slots::SlotState;
    use kvshared::wire::{BatchRequest, OpReply};

    let bin: Vec<String> = (0..2).map(|_| addr()).collect();
    let (http, resp) = (addr(), addr());
    let nodes = bin.join(",");
    let _a = start_at(&bin[0], &["--shard", "0/2", "--nodes", &nodes]).0;
    let _b = start_at(
        &bin[1],
        &["--shard", "1/2", "--nodes", &nodes, "--http", &http, "--resp", &resp],
    )
    .0;
    // A key of node 0's half of the slots.
    let key = (0..)
        .map(|i| format!("imp{i}"))
        .find(|k| kvshared::routing::key_slot(k.as_bytes()) < 8192)
        .unwrap();
    let slot = kvshared::routing::key_slot(key.as_bytes());
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let client = Cluster::new(&bin, ClientConfig::default()).unwrap();
    rt.block_on(client.put(key.as_bytes(), b"v1")).unwrap();
    common::set_slot(&rt, &client, 1, slot, (SlotState::Importing, 0, 1));

    let mut get = BatchRequest::new();
    get.push_get(key.as_bytes());
    let reply = rt.block_on(client.send_batch(1, &get)).unwrap();
    assert_eq!(
        reply.batch().unwrap().result(0),
        OpReply::Moved {
            slot,
            owner: 0,
            epoch: 0
        }
    );
    let path = format!("/kv/{key}");
    assert_eq!(request(&http, "GET", &path, b""), (200, b"v1".to_vec()));
    assert_eq!(request(&http, "PUT", &path, b"v2").0, 204);
    let cmd = format!(
        "*2\r\n$3\r\nGET\r\n${}\r\n{key}\r\n*3\r\n$3\r\nSET\r\n${}\r\n{key}\r\n$2\r\nv3\r\n*1\r\n$4\r\nQUIT\r\n",
        key.len(),
        key.len()
    );
    let answer = common::raw(&resp, cmd.as_bytes());
    assert!(answer.starts_with("$2\r\nv2\r\n+OK\r\n"), "{answer}");
    assert_eq!(
        rt.block_on(client.get(key.as_bytes())).unwrap().as_deref(),
        Some(&b"v3"[..])
    );
}
