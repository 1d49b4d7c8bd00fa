//! Times to live through the RESP front, as Redis users run them: the expiry commands'
//! answers (for a key this node owns and one it forwards), no read returning a key after
//! its deadline under concurrent load, keys nobody touches removed by the active cycle, and
//! deadlines kept across kill -9, in memory, durable and in a replica group.

mod common;

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::{HANG, Kvd, TempDir, addr, resp_cluster, start_at, temp_dir, until};

fn con(addr: &str) -> redis::Connection {
    redis::Client::open(format!("redis://{addr}/"))
        .unwrap()
        .get_connection_with_timeout(Duration::from_secs(5))
        .unwrap()
}

fn key_of(shard: u32, prefix: &str) -> String {
    (0..)
        .map(|i| format!("{prefix}{i}"))
        .find(|k| kvshared::routing::owner_node(k.as_bytes(), 2) == shard)
        .unwrap()
}

fn cmd(c: &mut redis::Connection, args: &[&str]) -> redis::Value {
    let mut command = redis::cmd(args[0]);
    command.arg(&args[1..]);
    match command.query::<redis::Value>(c) {
        Ok(v) => v,
        Err(e) => redis::Value::SimpleString(format!("ERR {e}")),
    }
}

fn int(c: &mut redis::Connection, args: &[&str]) -> i64 {
    match cmd(c, args) {
        redis::Value::Int(n) => n,
        other => panic!("{args:?}: {other:?}"),
    }
}

/// Asserts `key`'s TTL is `secs` as Redis rounds it, less the whole seconds this machine
/// took since the time to live was set at `set` (none, unless it is very busy).
fn assert_ttl(c: &mut redis::Connection, key: &str, secs: i64, set: Instant) {
    let ttl = int(c, &["TTL", key]);
    let lag = set.elapsed().as_secs_f64().ceil() as i64;
    assert!(
        (secs - lag..=secs).contains(&ttl),
        "TTL {key} = {ttl}, set to {secs} s {:?} ago",
        set.elapsed()
    );
}

/// Asserts `key`'s PTTL is at most `ms` and at least `ms` less the time since `set`.
fn assert_pttl(c: &mut redis::Connection, key: &str, ms: i64, set: Instant) {
    let pttl = int(c, &["PTTL", key]);
    let lag = set.elapsed().as_millis() as i64 + 1;
    assert!(
        (ms - lag..=ms).contains(&pttl),
        "PTTL {key} = {pttl}, set to {ms} ms {:?} ago",
        set.elapsed()
    );
}

/// The expiry commands answer as Redis's, for a key this node owns and one it forwards to
/// the other shard.
#[test]
fn expiry_commands_answer_as_redis_for_local_and_forwarded_keys() {
    let (_guards, resp) = resp_cluster(&[]);
    let mut c = con(&resp[0]);
    for shard in 0..2 {
        let k = key_of(shard, "ttl-");
        let k = k.as_str();
        let set = Instant::now();
        assert_eq!(cmd(&mut c, &["SET", k, "1", "EX", "100"]), redis::Value::Okay);
        assert_ttl(&mut c, k, 100, set);
        assert_pttl(&mut c, k, 100_000, set);
        let at = int(&mut c, &["PEXPIRETIME", k]);
        assert_eq!(int(&mut c, &["EXPIRETIME", k]), at / 1000);
        assert_eq!(cmd(&mut c, &["SET", k, "2", "KEEPTTL"]), redis::Value::Okay);
        assert_eq!(int(&mut c, &["INCR", k]), 3, "an increment keeps the time to live");
        assert_eq!(int(&mut c, &["PEXPIRETIME", k]), at);
        assert_eq!(int(&mut c, &["EXPIRE", k, "50", "GT"]), 0);
        assert_eq!(int(&mut c, &["EXPIRE", k, "50", "LT"]), 1);
        assert_eq!(int(&mut c, &["EXPIRE", k, "60", "NX"]), 0);
        assert_eq!(int(&mut c, &["PERSIST", k]), 1);
        assert_eq!(int(&mut c, &["PERSIST", k]), 0);
        assert_eq!(int(&mut c, &["TTL", k]), -1);
        assert_eq!(int(&mut c, &["EXPIRE", k, "60", "XX"]), 0);
        assert_eq!(int(&mut c, &["EXPIRE", k, "60", "NX"]), 1);
        assert_eq!(
            cmd(&mut c, &["GETEX", k, "PERSIST"]),
            redis::Value::BulkString(b"3".to_vec())
        );
        assert_eq!(int(&mut c, &["TTL", k]), -1);
        let set = Instant::now();
        assert_eq!(
            cmd(&mut c, &["GETEX", k, "PX", "100000"]),
            redis::Value::BulkString(b"3".to_vec())
        );
        assert_ttl(&mut c, k, 100, set);
        assert_eq!(cmd(&mut c, &["SET", k, "4"]), redis::Value::Okay);
        assert_eq!(int(&mut c, &["TTL", k]), -1, "a plain SET ends the time to live");
        assert_eq!(int(&mut c, &["TTL", "ttl-none"]), -2);
        let set = Instant::now();
        assert_eq!(cmd(&mut c, &["SETEX", k, "10", "v"]), redis::Value::Okay);
        assert_ttl(&mut c, k, 10, set);
        assert_eq!(cmd(&mut c, &["SET", k, "w", "NX", "PX", "5000"]), redis::Value::Nil);
        let set = Instant::now();
        assert_eq!(
            cmd(&mut c, &["SET", k, "w", "XX", "PX", "5000", "GET"]),
            redis::Value::BulkString(b"v".to_vec())
        );
        assert_ttl(&mut c, k, 5, set);
        assert_eq!(int(&mut c, &["PEXPIRE", k, "-1"]), 1, "a past deadline removes the key");
        assert_eq!(int(&mut c, &["EXISTS", k]), 0);
        assert_eq!(cmd(&mut c, &["PSETEX", k, "150", "short"]), redis::Value::Okay);
        // (Past its deadline whatever the machine: the deadline was set before the reply.)
        std::thread::sleep(Duration::from_millis(300));
        assert_eq!(cmd(&mut c, &["GET", k]), redis::Value::Nil, "{k} after its deadline");
        assert_eq!(int(&mut c, &["TTL", k]), -2);
    }
    let errors = [
        (
            &["SET", "e", "v", "EX", "0"][..],
            "invalid expire time in 'set' command",
        ),
        (&["SET", "e", "v", "EX", "x"], "value is not an integer or out of range"),
        (&["SET", "e", "v", "EX", "10", "PX", "10"], "syntax error"),
        (&["SET", "e", "v", "KEEPTTL", "EX", "10"], "syntax error"),
        (&["SETEX", "e", "-1", "v"], "invalid expire time in 'setex' command"),
        (
            &["EXPIRE", "e", "10", "NX", "XX"],
            "NX and XX, GT or LT options at the same time are not compatible",
        ),
        (
            &["EXPIRE", "e", "10", "GT", "LT"],
            "GT and LT options at the same time are not compatible",
        ),
        (&["EXPIRE", "e", "10", "ZZ"], "Unsupported option ZZ"),
        (
            &["EXPIRE", "e", "99999999999999999"],
            "invalid expire time in 'expire' command",
        ),
        (&["GETEX", "e", "EX", "0"], "invalid expire time in 'getex' command"),
        (&["GETEX", "e", "FOO"], "syntax error"),
    ];
    for (args, text) in errors {
        match cmd(&mut c, args) {
            redis::Value::SimpleString(e) => assert!(e.contains(text), "{args:?}: {e}"),
            other => panic!("{args:?}: {other:?}"),
        }
    }
}

/// Writers set keys with short random times to live, each value unique, while readers
/// read them; no read that began after a value's deadline (its SET's reply plus its time
/// to live: the deadline is set between the request and the reply) returns that value.
fn no_read_after_its_deadline(addr: &str) {
    let deadlines: Arc<Mutex<std::collections::HashMap<String, Instant>>> = Arc::default();
    let reads: Arc<Mutex<Vec<(Instant, String)>>> = Arc::default();
    let stop = Instant::now() + Duration::from_secs(3);
    let mut threads = Vec::new();
    for w in 0..4 {
        let (addr, deadlines) = (addr.to_string(), deadlines.clone());
        threads.push(std::thread::spawn(move || {
            let mut c = con(&addr);
            for n in 0..300 {
                if Instant::now() > stop {
                    break;
                }
                let value = format!("w{w}-{n}");
                let ttl = 5 + (n * 37 + w * 11) % 60;
                let key = format!("exp{}", n % 8);
                let ok = cmd(&mut c, &["SET", &key, &value, "PX", &ttl.to_string()]);
                assert_eq!(ok, redis::Value::Okay);
                let bound = Instant::now() + Duration::from_millis(ttl as u64);
                deadlines.lock().unwrap().insert(value, bound);
                std::thread::sleep(Duration::from_millis(((n % 5) * 7) as u64));
            }
        }));
    }
    for _ in 0..6 {
        let (addr, reads) = (addr.to_string(), reads.clone());
        threads.push(std::thread::spawn(move || {
            let mut c = con(&addr);
            for n in 0..2000 {
                if Instant::now() > stop {
                    break;
                }
                let began = Instant::now();
                if let redis::Value::BulkString(v) = cmd(&mut c, &["GET", &format!("exp{}", n % 8)]) {
                    reads.lock().unwrap().push((began, String::from_utf8(v).unwrap()));
                }
            }
        }));
    }
    for t in threads {
        t.join().unwrap();
    }
    let (deadlines, reads) = (deadlines.lock().unwrap(), reads.lock().unwrap());
    assert!(reads.len() > 100, "only {} reads found a value", reads.len());
    for (began, value) in reads.iter() {
        let bound = deadlines[value];
        assert!(*began < bound, "{value} read {:?} after its deadline", *began - bound);
    }
}

#[test]
fn no_read_returns_a_key_after_its_deadline_in_memory() {
    let (_guards, resp) = resp_cluster(&[]);
    no_read_after_its_deadline(&resp[0]);
}

#[test]
fn no_read_returns_a_key_after_its_deadline_durable() {
    let (_node, resp, dir) = durable("no-read");
    no_read_after_its_deadline(&resp);
    drop(dir);
}

#[test]
fn no_read_returns_a_key_after_its_deadline_in_a_group() {
    let (_guards, resp, leader) = common::resp_group("expiry-no-read");
    no_read_after_its_deadline(&resp[leader]);
}

/// A durable node's RESP address and data dir.
fn durable(name: &str) -> (Kvd, String, TempDir) {
    let dir = temp_dir(&format!("expiry-{name}"));
    let resp = addr();
    let (node, _) = start_at(
        &addr(),
        &["--data-dir", &dir.path().display().to_string(), "--resp", &resp],
    );
    (node, resp, dir)
}

/// Sets `n` keys with a 200 ms time to live and 50 without, then waits
/// until every member in `check` holds only the 50: nobody reads or writes the others, so
/// only the active cycle (in a group, the leader's, through its log) removes them.
fn untouched_keys_go(writer: &str, check: &[String], n: usize) {
    let mut c = con(writer);
    let mut pipe = redis::pipe();
    for i in 0..n {
        pipe.cmd("SET")
            .arg(format!("gone{i}"))
            .arg("v")
            .arg("PX")
            .arg(200)
            .ignore();
    }
    for i in 0..50 {
        pipe.cmd("SET").arg(format!("stays{i}")).arg("v").ignore();
    }
    pipe.query::<()>(&mut c).unwrap();
    for addr in check {
        let mut c = con(addr);
        until(
            &format!("{addr} to hold only the 50 keys without a time to live"),
            HANG,
            || {
                // This member's own keys (DBSIZE is the cluster's).
                let info = match cmd(&mut c, &["INFO", "keyspace"]) {
                    redis::Value::BulkString(t) => String::from_utf8(t).unwrap(),
                    other => panic!("{other:?}"),
                };
                let keys: usize = info
                    .split("keys=")
                    .nth(1)
                    .and_then(|s| s.split(',').next())
                    .and_then(|s| s.parse().ok())
                    .unwrap_or(0);
                if keys == 50 { Ok(()) } else { Err(keys) }
            },
        );
    }
    let info = match cmd(&mut c, &["INFO", "stats"]) {
        redis::Value::BulkString(t) => String::from_utf8(t).unwrap(),
        other => panic!("{other:?}"),
    };
    let expired: usize = info
        .lines()
        .find_map(|l| l.strip_prefix("expired_keys:"))
        .and_then(|v| v.trim().parse().ok())
        .unwrap();
    assert!(expired >= n, "expired_keys:{expired}");
}

#[test]
fn keys_nobody_touches_are_removed_in_memory() {
    let resp = addr();
    let (_node, _) = start_at("127.0.0.1:0", &["--resp", &resp]);
    untouched_keys_go(&resp, std::slice::from_ref(&resp), 3000);
}

#[test]
fn keys_nobody_touches_are_removed_by_the_leader_s_log_on_every_member() {
    let (_guards, resp, leader) = common::resp_group("expiry-untouched");
    let mut order = resp.clone();
    order.rotate_left(leader);
    untouched_keys_go(&resp[leader], &order, 1000);
}

/// A durable node's deadlines survive kill -9: the replayed log gives the same deadlines,
/// and a key whose deadline passed is gone.
#[test]
fn deadlines_survive_kill_9() {
    let (mut node, resp, dir) = durable("kill");
    let mut c = con(&resp);
    assert_eq!(cmd(&mut c, &["SET", "long", "v", "EX", "1000"]), redis::Value::Okay);
    let at = int(&mut c, &["PEXPIRETIME", "long"]);
    assert_eq!(cmd(&mut c, &["SET", "short", "v", "PX", "200"]), redis::Value::Okay);
    assert_eq!(int(&mut c, &["INCR", "counter"]), 1);
    let set = Instant::now();
    assert_eq!(int(&mut c, &["EXPIRE", "counter", "500"]), 1);
    assert_eq!(int(&mut c, &["INCR", "counter"]), 2);
    assert_eq!(cmd(&mut c, &["SET", "kept", "v"]), redis::Value::Okay);
    // (Past `short`'s deadline whatever the machine.)
    std::thread::sleep(Duration::from_millis(400));
    node.kill();
    let (_node, _) = start_at(
        &addr(),
        &["--data-dir", &dir.path().display().to_string(), "--resp", &resp],
    );
    let mut c = con(&resp);
    assert_eq!(int(&mut c, &["PEXPIRETIME", "long"]), at);
    assert_eq!(cmd(&mut c, &["GET", "short"]), redis::Value::Nil);
    assert_eq!(
        cmd(&mut c, &["GET", "counter"]),
        redis::Value::BulkString(b"2".to_vec())
    );
    // (500 s less the 400 ms above: 500 as Redis rounds it, less this machine's lag.)
    assert_ttl(&mut c, "counter", 500, set);
    assert_eq!(int(&mut c, &["TTL", "kept"]), -1);
}

/// The binary protocol (`kvd put --ttl`) and HTTP (`PUT /kv/k?ttl=`) set times to live
/// too; a bad one is refused with a message naming it.
#[test]
fn kvd_put_ttl_and_http_ttl_set_deadlines() {
    let (http, resp) = (addr(), addr());
    let (_node, bin) = common::start(&["--resp", &resp, "--http", &http]);
    let mut c = con(&resp);
    let set = Instant::now();
    let out = common::kvd(&["put", "--nodes", &bin, "--ttl", "100s", "bk", "v"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_ttl(&mut c, "bk", 100, set);
    let out = common::kvd(&["put", "--nodes", &bin, "bk", "w"]);
    assert!(out.status.success());
    assert_eq!(int(&mut c, &["TTL", "bk"]), -1, "a put without --ttl ends it, as SET");
    let out = common::kvd(&["put", "--nodes", &bin, "--ttl", "0s", "bk", "v"]);
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("not a time to live"),
        "{out:?}"
    );
    let curl = |args: &[&str]| {
        let out = std::process::Command::new(kvtestkit::tools::program("curl"))
            .args(["-s", "-o", "/dev/null", "-w", "%{http_code}"])
            .args(args)
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let url = |q: &str| format!("http://{http}/kv/hk{q}");
    let set = Instant::now();
    assert_eq!(curl(&["-X", "PUT", "--data", "v", &url("?ttl=300ms")]), "204");
    let left = int(&mut c, &["PTTL", "hk"]);
    let lag = set.elapsed().as_millis() as i64 + 1;
    assert!(
        (300 - lag..=300).contains(&left) || (left == -2 && lag >= 300),
        "{left}"
    );
    assert_eq!(curl(&["-X", "PUT", "--data", "v", &url("?ttl=abc")]), "400");
    assert_eq!(curl(&["-X", "PUT", "--data", "v", &url("?ttl=0")]), "400");
    // Gone once its 300 ms are up.
    until("hk to be gone after its time to live", HANG, || {
        let code = curl(&[&url("")]);
        if code == "404" { Ok(()) } else { Err(code) }
    });
    assert!(set.elapsed() >= Duration::from_millis(300), "hk went before its time");
    // Readable while it lives (a minute).
    let set = Instant::now();
    assert_eq!(curl(&["-X", "PUT", "--data", "v", &url("?ttl=60")]), "204");
    assert_eq!(curl(&[&url("")]), "200");
    assert_ttl(&mut c, "hk", 60, set);
}
