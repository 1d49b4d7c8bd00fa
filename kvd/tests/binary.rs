//! The built `kvd` binary: the ready line, client verbs and exit codes, SIGTERM.

mod common;

use std::process::Command;

use common::{kvd, start};

#[test]
fn client_verbs_and_exit_codes() {
    let (server, addr) = start(&["--shard", "0/1"]);
    let put = kvd(&["put", "--nodes", &addr, "user:1", "alice"]);
    assert_eq!(put.status.code(), Some(0));
    let get = kvd(&["get", "--nodes", &addr, "user:1"]);
    assert_eq!(String::from_utf8_lossy(&get.stdout).trim(), "alice");
    let missing = kvd(&["get", "--nodes", &addr, "user:2"]);
    assert_eq!(missing.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&missing.stderr).contains("not found"));
    let del = kvd(&["del", "--nodes", &addr, "user:1"]);
    assert_eq!(String::from_utf8_lossy(&del.stdout).trim(), "deleted");
    let stats = kvd(&["stats", "--nodes", &addr, "--json"]);
    let json: serde_json::Value = serde_json::from_slice(&stats.stdout).unwrap();
    assert_eq!(json[0]["stats"]["puts"], 1);
    // The service times: one put, two gets (a hit, a miss), one delete, each timed once.
    let latency = &json[0]["stats"]["latency"];
    let count = |kind: &str| -> u64 {
        latency[kind]["buckets"]
            .as_array()
            .unwrap()
            .iter()
            .map(|b| b[1].as_u64().unwrap())
            .sum()
    };
    assert_eq!((count("get"), count("put"), count("delete")), (2, 1, 1), "{latency}");
    let text = kvd(&["stats", "--nodes", &addr]);
    assert!(
        String::from_utf8_lossy(&text.stdout).contains("service time since start: get p50"),
        "{}",
        String::from_utf8_lossy(&text.stdout)
    );
    // A held port nothing listens on: a node that is down.
    let dead = common::addr();
    let partly_down = kvd(&["stats", "--nodes", &format!("{addr},{dead}"), "--timeout", "500ms"]);
    assert_eq!(
        partly_down.status.code(),
        Some(1),
        "a node down is a failure scripts can see"
    );
    assert!(String::from_utf8_lossy(&partly_down.stdout).contains("DOWN"));
    let down = kvd(&["get", "--nodes", &dead, "x", "--timeout", "500ms"]);
    assert_eq!(down.status.code(), Some(2));
    assert_eq!(
        String::from_utf8_lossy(&down.stderr).lines().count(),
        1,
        "one-line reason"
    );
    drop(server);
}

/// Two nodes given in the wrong order: the client verbs name the problem, not just the
/// refusal.
#[test]
fn client_verbs_name_a_node_list_in_the_wrong_order() {
    let (a, addr_a) = start(&["--shard", "0/2"]);
    let (b, addr_b) = start(&["--shard", "1/2"]);
    let swapped = format!("{addr_b},{addr_a}");
    let mut explained = false;
    for i in 0..20 {
        let put = kvd(&["put", "--nodes", &swapped, &format!("k{i}"), "v"]);
        if put.status.code() == Some(2) {
            let err = String::from_utf8_lossy(&put.stderr);
            assert!(err.contains("list the nodes in shard order"), "{err}");
            explained = true;
            break;
        }
    }
    assert!(explained, "no key of 20 went to the wrong node");
    let stats = kvd(&["stats", "--nodes", &swapped]);
    assert!(String::from_utf8_lossy(&stats.stderr).contains("is listed at position 0"));
    drop((a, b));
}

#[test]
fn sigterm_stops_kvd_cleanly() {
    let (mut server, addr) = start(&[]);
    assert_eq!(kvd(&["put", "--nodes", &addr, "k", "v"]).status.code(), Some(0));
    server.signal(libc::SIGTERM);
    let status = server.wait_exit(common::HANG);
    assert!(status.success(), "kvd exited with {status}");
}

#[test]
fn a_bad_flag_is_explained() {
    let out = kvd(&["--shard", "3/2"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("below the count"));
    // Settings that cannot work are refused before anything starts, naming the flag.
    for (args, says) in [
        (&["--capacity", "100000000000"][..], "--capacity"),
        (&["--capacity", "18446744073709551615"][..], "--capacity"),
        (&["--max-frame", "0"][..], "--max-frame"),
        (&["--max-frame", "2gib"][..], "--max-frame"),
        (
            &["--data-dir", "/dev/null"][..],
            "--data-dir /dev/null: not a directory",
        ),
        (&["--max-conns", "0"][..], "--max-conns"),
        (&["--threads", "0"][..], "--threads"),
    ] {
        let out = kvd(&[args, &["--listen", "127.0.0.1:0"]].concat());
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert!(err.contains(says) && err.lines().count() == 1, "{args:?}: {err}");
    }
    // --max-frame takes sizes as every size flag does (it once took only a number of bytes).
    let (_node, addr) = start(&["--max-frame", "1gib"]);
    let stats = kvd(&["stats", "--nodes", &addr]);
    assert!(stats.status.success(), "{}", String::from_utf8_lossy(&stats.stderr));
}

/// Values are bytes: `kvd put k -` and `--file F` store exactly what they read, `kvd get`
/// writes exactly what is stored (no newline when stdout is not a terminal), `--text`
/// prints text and a newline; a value larger than a frame (an endless file) is refused
/// before anything is sent. (A 100,000-byte random value once came back as 181,585 bytes, and
/// `put k -` stored "-".)
#[test]
fn get_and_put_are_binary_safe() {
    use std::io::Write;
    let (_server, addr) = start(&["--shard", "0/1"]);
    let mut value = vec![0u8; 100_000];
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    for b in &mut value {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        *b = x as u8;
    }
    let mut child = Command::new(env!("CARGO_BIN_EXE_kvd"))
        .args(["put", "--nodes", &addr, "bin:stdin", "-"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::null())
        .spawn()
        .unwrap();
    child.stdin.take().unwrap().write_all(&value).unwrap();
    assert!(child.wait().unwrap().success());
    let scratch = common::temp_dir("binary-value");
    let file = scratch.path().join("value");
    std::fs::write(&file, &value).unwrap();
    let put = kvd(&["put", "--nodes", &addr, "--file", file.to_str().unwrap(), "bin:file"]);
    assert!(put.status.success(), "{}", String::from_utf8_lossy(&put.stderr));
    for key in ["bin:stdin", "bin:file"] {
        let got = kvd(&["get", "--nodes", &addr, key]);
        assert!(got.stdout == value, "{key}: {} bytes back", got.stdout.len());
    }
    let text = kvd(&["get", "--nodes", &addr, "--text", "bin:file"]);
    assert!(text.stdout.ends_with(b"\n") && text.stdout.len() > value.len());
    // An endless file is refused at the frame limit, and nothing is stored.
    let endless = kvd(&["put", "--nodes", &addr, "--file", "/dev/zero", "bin:endless"]);
    assert!(!endless.status.success());
    assert!(String::from_utf8_lossy(&endless.stderr).contains("--file /dev/zero: it is larger than"));
    assert_eq!(kvd(&["get", "--nodes", &addr, "bin:endless"]).status.code(), Some(1));
    let _ = std::fs::remove_file(file);
}
