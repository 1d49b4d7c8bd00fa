//! The keyspace commands through the RESP front, on a 2-node cluster through one node and
//! with a token: SCAN covers every node with Redis's guarantee while keys come and go,
//! KEYS, DBSIZE, RANDOMKEY, FLUSHALL cover the cluster; RENAME moves a key and its TTL
//! within a shard (CROSSSLOT across); OBJECT ENCODING and MEMORY USAGE answer as Redis;
//! redis-cli's --scan, --bigkeys and --memkeys run. A durable node wants FLUSHALL's mode
//! said, and a flush goes through its log (a restart does not bring the keys back); in a
//! replica group every member applies it.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::process::Command;
use std::time::Duration;

use common::{addr, resp_cluster, start_at, token_file};
use redis::Value;

const TOKEN: &str = "keyspace-secret-token";

fn con(addr: &str, token: Option<&str>) -> redis::Connection {
    let url = match token {
        Some(t) => format!("redis://:{t}@{addr}/"),
        None => format!("redis://{addr}/"),
    };
    redis::Client::open(url)
        .unwrap()
        .get_connection_with_timeout(Duration::from_secs(5))
        .unwrap()
}

fn cmd(c: &mut redis::Connection, args: &[&str]) -> Value {
    let mut command = redis::cmd(args[0]);
    command.arg(&args[1..]);
    match command.query::<Value>(c) {
        Ok(v) => v,
        Err(e) => Value::SimpleString(format!("ERR {e}")),
    }
}

fn text(v: &Value) -> String {
    match v {
        Value::BulkString(b) => String::from_utf8_lossy(b).into_owned(),
        Value::SimpleString(s) => s.clone(),
        Value::Int(n) => n.to_string(),
        other => format!("{other:?}"),
    }
}

fn key_of(shard: u32, prefix: &str) -> String {
    (0..)
        .map(|i| format!("{prefix}{i}"))
        .find(|k| kvshared::routing::owner_node(k.as_bytes(), 2) == shard)
        .unwrap()
}

/// A whole SCAN with these options: every key it returned, with how often.
fn scan_all(c: &mut redis::Connection, options: &[&str], between: &mut dyn FnMut()) -> BTreeMap<String, usize> {
    let (mut cursor, mut seen, mut rounds) = ("0".to_string(), BTreeMap::new(), 0);
    loop {
        let mut args = vec!["SCAN", cursor.as_str()];
        args.extend(options);
        let Value::Array(reply) = cmd(c, &args) else {
            panic!("SCAN answered no array")
        };
        let [next, Value::Array(keys)] = &reply[..] else {
            panic!("{reply:?}")
        };
        for k in keys {
            *seen.entry(text(k)).or_default() += 1;
        }
        between();
        cursor = text(next);
        rounds += 1;
        assert!(rounds < 100_000, "the scan does not end");
        if cursor == "0" {
            return seen;
        }
    }
}

#[test]
fn scan_keys_dbsize_and_flush_cover_the_cluster_through_one_node() {
    let token = token_file("keyspace-token", TOKEN);
    let (_nodes, resp) = resp_cluster(&["--auth-token-file", &token]);
    let mut c = con(&resp[0], Some(TOKEN));
    let mut other = con(&resp[1], Some(TOKEN));
    // Without the token nothing of it is answered.
    let mut anon = con(&resp[0], None);
    assert!(text(&cmd(&mut anon, &["SCAN", "0"])).contains("NOAUTH"));
    assert!(text(&cmd(&mut anon, &["FLUSHALL"])).contains("NOAUTH"));
    for i in 0..600 {
        assert_eq!(cmd(&mut c, &["SET", &format!("stay:{i}"), "v"]), Value::Okay);
    }
    assert_eq!(cmd(&mut c, &["SET", "gone", "v", "PX", "1"]), Value::Okay);
    // Keys come and go (and tables grow) between pages: every key present throughout is
    // returned, once; the expired one never.
    let mut churn = 0;
    let seen = scan_all(&mut c, &["COUNT", "7"], &mut || {
        for _ in 0..20 {
            churn += 1;
            cmd(&mut other, &["SET", &format!("churn:{churn}"), "x"]);
            cmd(&mut other, &["DEL", &format!("churn:{}", churn / 2)]);
        }
    });
    for i in 0..600 {
        assert_eq!(seen.get(&format!("stay:{i}")), Some(&1), "stay:{i}");
    }
    assert!(seen.values().all(|&n| n == 1) && !seen.contains_key("gone"));
    // MATCH and TYPE filter; COUNT is work, not a promise.
    let matched = scan_all(&mut c, &["MATCH", "stay:1?", "COUNT", "1000"], &mut || {});
    assert_eq!(
        matched.keys().cloned().collect::<Vec<_>>(),
        (10..20).map(|i| format!("stay:{i}")).collect::<Vec<_>>()
    );
    assert!(scan_all(&mut c, &["TYPE", "hash"], &mut || {}).is_empty());
    assert!(text(&cmd(&mut c, &["SCAN", "0", "COUNT", "0"])).contains("syntax error"));
    assert!(text(&cmd(&mut c, &["SCAN", "x"])).contains("invalid cursor"));
    assert!(text(&cmd(&mut c, &["SCAN", &(9u64 << 48).to_string()])).contains("invalid cursor"));
    let Value::Array(keys) = cmd(&mut c, &["KEYS", "stay:5?"]) else {
        panic!()
    };
    let keys: BTreeSet<String> = keys.iter().map(text).collect();
    assert_eq!(keys, (50..60).map(|i| format!("stay:{i}")).collect());
    let total = cmd(&mut c, &["DBSIZE"]);
    let on_each: i64 = (0..2)
        .map(|i| {
            let info = text(&cmd(&mut con(&resp[i], Some(TOKEN)), &["INFO", "keyspace"]));
            let keys = info.split("keys=").nth(1).and_then(|s| s.split(',').next());
            keys.unwrap().parse::<i64>().unwrap()
        })
        .sum();
    assert_eq!(total, Value::Int(on_each));
    assert!(text(&cmd(&mut c, &["RANDOMKEY"])).contains(':'));
    assert_eq!(
        cmd(&mut c, &["EXISTS", "stay:1", "stay:2", "nope", "stay:1"]),
        Value::Int(3)
    );
    assert_eq!(cmd(&mut c, &["FLUSHALL"]), Value::Okay);
    assert_eq!(cmd(&mut other, &["DBSIZE"]), Value::Int(0));
    assert_eq!(cmd(&mut c, &["RANDOMKEY"]), Value::Nil);
    assert_eq!(cmd(&mut c, &["FLUSHDB", "ASYNC"]), Value::Okay);
}

#[test]
fn rename_object_encoding_and_memory_usage_answer_as_redis() {
    let (_nodes, resp) = resp_cluster(&[]);
    let mut c = con(&resp[0], None);
    for shard in 0..2 {
        let (a, b, d) = (key_of(shard, "rn-a"), key_of(shard, "rn-b"), key_of(shard, "rn-d"));
        assert_eq!(cmd(&mut c, &["SET", &a, "1", "EX", "100"]), Value::Okay);
        assert_eq!(cmd(&mut c, &["RENAME", &a, &b]), Value::Okay);
        assert_eq!(cmd(&mut c, &["GET", &a]), Value::Nil);
        assert_eq!(cmd(&mut c, &["GET", &b]), Value::BulkString(b"1".to_vec()));
        assert!(matches!(cmd(&mut c, &["TTL", &b]), Value::Int(t) if t > 90));
        assert!(text(&cmd(&mut c, &["RENAME", &a, &d])).contains("no such key"));
        assert_eq!(cmd(&mut c, &["SET", &d, "x"]), Value::Okay);
        assert_eq!(cmd(&mut c, &["RENAMENX", &b, &d]), Value::Int(0));
        assert_eq!(cmd(&mut c, &["RENAMENX", &d, &a]), Value::Int(1));
        // Inside a transaction too.
        assert_eq!(cmd(&mut c, &["MULTI"]), Value::Okay);
        cmd(&mut c, &["RENAME", &b, &d]);
        assert_eq!(cmd(&mut c, &["EXEC"]), Value::Array(vec![Value::Okay]));
        assert_eq!(cmd(&mut c, &["GET", &d]), Value::BulkString(b"1".to_vec()));
    }
    let (k0, k1) = (key_of(0, "rn-x"), key_of(1, "rn-x"));
    cmd(&mut c, &["SET", &k0, "1"]);
    assert!(text(&cmd(&mut c, &["RENAME", &k0, &k1])).contains("same slot"));
    for (value, encoding) in [("12345", "int"), ("-7", "int"), ("012", "embstr"), ("hello", "embstr")] {
        cmd(&mut c, &["SET", "enc", value]);
        assert_eq!(text(&cmd(&mut c, &["OBJECT", "ENCODING", "enc"])), encoding, "{value}");
    }
    let long = "x".repeat(3000);
    cmd(&mut c, &["SET", "enc", &long]);
    assert_eq!(text(&cmd(&mut c, &["OBJECT", "ENCODING", "enc"])), "raw");
    assert_eq!(cmd(&mut c, &["OBJECT", "ENCODING", "nope"]), Value::Nil);
    let Value::Int(usage) = cmd(&mut c, &["MEMORY", "USAGE", "enc", "SAMPLES", "0"]) else {
        panic!()
    };
    assert!((3000..3400).contains(&usage), "{usage}");
    assert_eq!(cmd(&mut c, &["MEMORY", "USAGE", "nope"]), Value::Nil);
    assert_eq!(text(&cmd(&mut c, &["TYPE", "enc"])), "string");
    // Redis Cluster's slots (docs/CLUSTER.md; redis_cluster.rs tests the rest).
    assert_eq!(cmd(&mut c, &["CLUSTER", "KEYSLOT", "somekey"]), Value::Int(11_058));
    assert_eq!(
        cmd(&mut c, &["CLUSTER", "KEYSLOT", "{user1000}.following"]),
        cmd(&mut c, &["CLUSTER", "KEYSLOT", "user1000"])
    );
    // Both nodes' ranges once the node's view of the cluster has been refreshed (each second).
    common::until("both nodes' ranges in CLUSTER SLOTS", common::HANG, || {
        let Value::Array(ranges) = cmd(&mut c, &["CLUSTER", "SLOTS"]) else {
            panic!("CLUSTER SLOTS answers the slot ranges")
        };
        if ranges.len() == 2 { Ok(()) } else { Err(ranges) }
    });
    assert_eq!(cmd(&mut c, &["UNLINK", "enc", "nope"]), Value::Int(1));
}

fn redis_cli(addr: &str, args: &[&str]) -> String {
    let (host, port) = addr.rsplit_once(':').unwrap();
    let out = Command::new("timeout")
        .args(["20", "redis-cli", "-h", host, "-p", port])
        .args(args)
        .output()
        .expect("redis-cli is missing: install Debian's redis-tools (.ci/run does)");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn redis_cli_scan_bigkeys_and_memkeys_run() {
    let (_nodes, resp) = resp_cluster(&[]);
    let mut c = con(&resp[0], None);
    for i in 0..300 {
        cmd(&mut c, &["SET", &format!("cli:{i}"), &"v".repeat(i)]);
    }
    let listed: BTreeSet<String> = redis_cli(&resp[0], &["--scan"]).lines().map(str::to_string).collect();
    assert_eq!(listed, (0..300).map(|i| format!("cli:{i}")).collect());
    let ones = redis_cli(&resp[1], &["--scan", "--pattern", "cli:1??"]);
    assert_eq!(ones.lines().count(), 100);
    let big = redis_cli(&resp[0], &["--bigkeys"]);
    assert!(
        big.contains("Sampled 300 keys") && big.contains("'\"cli:299\"' has 299 bytes"),
        "{big}"
    );
    let mem = redis_cli(&resp[0], &["--memkeys"]);
    assert!(
        mem.contains("Sampled 300 keys") && mem.contains("Biggest string found"),
        "{mem}"
    );
}

#[test]
fn a_durable_flush_wants_its_mode_said_and_goes_through_the_log() {
    let dir = common::temp_dir("flush-durable");
    let d = dir.path().display().to_string();
    let bin = addr();
    let resp = addr();
    let (mut node, _) = start_at(&bin, &["--data-dir", &d, "--resp", &resp]);
    let mut c = con(&resp, None);
    for i in 0..50 {
        cmd(&mut c, &["SET", &format!("d:{i}"), "v"]);
    }
    assert!(text(&cmd(&mut c, &["FLUSHALL"])).contains("FLUSHALL SYNC"));
    assert_eq!(cmd(&mut c, &["DBSIZE"]), Value::Int(50));
    assert_eq!(cmd(&mut c, &["FLUSHALL", "SYNC"]), Value::Okay);
    cmd(&mut c, &["SET", "after", "1"]);
    node.kill();
    let (_node, _) = start_at(&bin, &["--data-dir", &d, "--resp", &resp]);
    let mut c = con(&resp, None);
    assert_eq!(
        cmd(&mut c, &["DBSIZE"]),
        Value::Int(1),
        "the flush was replayed, the later write kept"
    );
    assert_eq!(cmd(&mut c, &["GET", "after"]), Value::BulkString(b"1".to_vec()));
}

#[test]
fn a_group_flush_reaches_every_member_and_a_follower_scans() {
    let (_guards, resp, leader) = common::resp_group("flush-group");
    let mut c = con(&resp[leader], None);
    for i in 0..40 {
        cmd(&mut c, &["SET", &format!("g:{i}"), "v"]);
    }
    let follower = (leader + 1) % 3;
    let mut f = con(&resp[follower], None);
    let seen = scan_all(&mut f, &[], &mut || {});
    assert_eq!(seen.len(), 40, "a follower's scan reads what was committed");
    let refused = text(&cmd(&mut f, &["FLUSHALL", "SYNC"]));
    assert!(
        refused.contains("READONLY") || refused.contains("read only"),
        "{refused}"
    );
    assert_eq!(cmd(&mut c, &["FLUSHALL", "SYNC"]), Value::Okay);
    for addr in &resp {
        let mut m = con(addr, None);
        common::until(&format!("{addr} to drop its keys"), common::HANG, || {
            let size = cmd(&mut m, &["DBSIZE"]);
            if size == Value::Int(0) { Ok(()) } else { Err(size) }
        });
    }
}
