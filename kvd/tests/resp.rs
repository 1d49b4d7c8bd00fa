//! The RESP front against real Redis clients: the `redis` crate, redis-cli and
//! redis-benchmark (Debian's `redis-tools`, which `.ci/run` installs), on a 2-node cluster
//! where each node forwards the other's keys.

mod common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::Command;
use std::time::Duration;

use common::resp_cluster as cluster;
use proptest::prelude::*;

fn redis_url(addr: &str) -> String {
    format!("redis://{addr}/")
}

#[test]
fn the_redis_crate_gets_sets_deletes_and_pipelines_across_shards() {
    use redis::Commands;
    let (_nodes, resp) = cluster(&[]);
    let client = redis::Client::open(redis_url(&resp[0])).unwrap();
    let mut con = client.get_connection().unwrap();
    // 200 keys: about half belong to the other node and are forwarded.
    for i in 0..200 {
        let () = con.set(format!("k{i}"), format!("v{i}")).unwrap();
    }
    for i in 0..200 {
        let v: Option<String> = con.get(format!("k{i}")).unwrap();
        assert_eq!(v.as_deref(), Some(format!("v{i}").as_str()));
    }
    // Every key is where its shard says: the other node's RESP port sees the same values.
    let mut other = redis::Client::open(redis_url(&resp[1]))
        .unwrap()
        .get_connection()
        .unwrap();
    let v: Option<String> = other.get("k7").unwrap();
    assert_eq!(v.as_deref(), Some("v7"));
    // DBSIZE is the cluster's; INFO keyspace one node's.
    let total: (u64, u64) = (
        redis::cmd("DBSIZE").query(&mut con).unwrap(),
        redis::cmd("DBSIZE").query(&mut other).unwrap(),
    );
    assert_eq!(total, (200, 200));
    let own = |c: &mut redis::Connection| -> u64 {
        let info: String = redis::cmd("INFO").arg("keyspace").query(c).unwrap();
        let keys = info.split("keys=").nth(1).and_then(|s| s.split(',').next());
        keys.unwrap().parse().unwrap()
    };
    let sizes = (own(&mut con), own(&mut other));
    assert_eq!(sizes.0 + sizes.1, 200, "{sizes:?}");
    assert!(sizes.0 > 50 && sizes.1 > 50, "keys spread over both shards: {sizes:?}");

    // A pipeline: replies come back in command order, ops on one key in order.
    let (a, b, c, d): (String, Option<String>, u64, Option<String>) = redis::pipe()
        .set("p1", "x")
        .get("p1")
        .del(&["p1", "k1", "nope"])
        .get("p1")
        .query(&mut con)
        .map(|((), b, c, d): ((), Option<String>, u64, Option<String>)| ("OK".to_string(), b, c, d))
        .unwrap();
    assert_eq!((a.as_str(), b.as_deref(), c, d), ("OK", Some("x"), 2, None));

    let () = redis::cmd("MSET")
        .arg(&["m1", "1", "m2", "2", "m3", "3"])
        .query(&mut con)
        .unwrap();
    let got: Vec<Option<String>> = redis::cmd("MGET")
        .arg(&["m1", "m2", "m3", "m4"])
        .query(&mut con)
        .unwrap();
    assert_eq!(got, vec![Some("1".into()), Some("2".into()), Some("3".into()), None]);
    let n: u64 = redis::cmd("EXISTS").arg(&["m1", "m2", "m4"]).query(&mut con).unwrap();
    assert_eq!(n, 2);
    let old: Option<String> = redis::cmd("GETSET").arg("m1").arg("9").query(&mut con).unwrap();
    assert_eq!(old.as_deref(), Some("1"));
    let old: Option<String> = redis::cmd("SET")
        .arg("m1")
        .arg("10")
        .arg("GET")
        .query(&mut con)
        .unwrap();
    assert_eq!(old.as_deref(), Some("9"));

    // SET NX / XX: conditional, atomic with respect to other ops on the key.
    let set = |con: &mut redis::Connection, k: &str, v: &str, cond: &str| -> Option<String> {
        redis::cmd("SET").arg(k).arg(v).arg(cond).query(con).unwrap()
    };
    assert_eq!(set(&mut con, "c1", "x", "XX"), None);
    assert_eq!(set(&mut con, "c1", "x", "NX").as_deref(), Some("OK"));
    assert_eq!(set(&mut con, "c1", "y", "NX"), None);
    assert_eq!(set(&mut con, "c1", "z", "XX").as_deref(), Some("OK"));
    let v: Option<String> = con.get("c1").unwrap();
    assert_eq!(v.as_deref(), Some("z"));
    let old: Option<String> = redis::cmd("SET")
        .arg("c1")
        .arg("w")
        .arg("NX")
        .arg("GET")
        .query(&mut con)
        .unwrap();
    assert_eq!(
        old.as_deref(),
        Some("z"),
        "SET NX GET gives the old value and stores nothing"
    );
    let v: Option<String> = con.get("c1").unwrap();
    assert_eq!(v.as_deref(), Some("z"));

    // An unknown command is an error, and the connection goes on.
    let e = redis::cmd("LPUSH").arg("l").arg("x").query::<()>(&mut con).unwrap_err();
    assert!(e.to_string().contains("unknown command"), "{e}");
    let pong: String = redis::cmd("PING").query(&mut con).unwrap();
    assert_eq!(pong, "PONG");
}

fn redis_cli(addr: &str, args: &[&str]) -> String {
    let (host, port) = addr.rsplit_once(':').unwrap();
    let out = Command::new(kvtestkit::tools::program("redis-cli"))
        .args(["-h", host, "-p", port])
        .args(args)
        .output()
        .expect("redis-cli is missing: install Debian's redis-tools (.ci/run does)");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).trim_end().to_string()
}

#[test]
fn redis_cli_and_redis_benchmark_work_against_the_cluster() {
    let (_nodes, resp) = cluster(&[]);
    assert_eq!(redis_cli(&resp[0], &["PING"]), "PONG");
    assert_eq!(redis_cli(&resp[0], &["SET", "greeting", "hello world"]), "OK");
    assert_eq!(redis_cli(&resp[1], &["GET", "greeting"]), "hello world");
    assert_eq!(redis_cli(&resp[0], &["MSET", "a", "1", "b", "2"]), "OK");
    // (redis-cli prints a missing value as an empty line; the helper trims the end.)
    assert_eq!(redis_cli(&resp[1], &["MGET", "c", "a", "b"]), "\n1\n2");
    assert_eq!(redis_cli(&resp[0], &["DEL", "a", "b", "c"]), "2");
    assert!(redis_cli(&resp[0], &["INFO", "server"]).contains("redis_version:"));
    assert!(redis_cli(&resp[0], &["INFO"]).contains("# Keyspace"));
    // Pipelined input, as `redis-cli --pipe`-style scripts send it.
    let (host, port) = resp[0].rsplit_once(':').unwrap();
    let mut child = Command::new(kvtestkit::tools::program("redis-cli"))
        .args(["-h", host, "-p", port])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(b"SET s1 one\nSET s2 two\nGET s1\nGET s2\n")
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert_eq!(String::from_utf8_lossy(&out.stdout), "OK\nOK\none\ntwo\n");

    // redis-benchmark exits 1 on the first error reply: its start-up CONFIG GETs, SET and
    // GET must all be answered, with and without pipelining, over random keys of both shards.
    for pipeline in ["1", "16"] {
        let out = Command::new(kvtestkit::tools::program("redis-benchmark"))
            .args(["-h", host, "-p", port, "-t", "set,get", "-n", "20000", "-r", "10000"])
            .args(["-P", pipeline, "-c", "8", "-q"])
            .output()
            .expect("redis-benchmark is missing: install Debian's redis-tools (.ci/run does)");
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "{text}{}", String::from_utf8_lossy(&out.stderr));
        assert!(text.contains("SET:") && text.contains("GET:"), "{text}");
    }
}

/// INFO's `tcp_port`, `redis-cli --stat`, and redis-benchmark's default suite: every string
/// test it has runs to the end; a list test gets Redis's own unknown-command error (the
/// tool exits at the first error reply, so the suite is run with `-t`).
#[test]
fn redis_cli_stat_and_the_string_benchmarks_run_to_the_end() {
    let (_nodes, resp) = cluster(&[]);
    let (host, port) = resp[0].rsplit_once(':').unwrap();
    let info = redis_cli(&resp[0], &["INFO", "server"]);
    assert!(info.contains(&format!("tcp_port:{port}\r")), "{info}");
    let out = Command::new("timeout")
        .args([
            "2",
            "stdbuf",
            "-o0",
            "redis-cli",
            "-h",
            host,
            "-p",
            port,
            "--stat",
            "-i",
            "0.2",
        ])
        .output()
        .unwrap();
    let stat = String::from_utf8_lossy(&out.stdout);
    assert!(stat.contains("keys") && stat.lines().count() >= 4, "{stat}");
    assert!(!stat.contains("-9223372036854775808"), "{stat}");
    let out = Command::new(kvtestkit::tools::program("redis-benchmark"))
        .args([
            "-h",
            host,
            "-p",
            port,
            "-t",
            "ping,set,get,incr,mset",
            "-n",
            "5000",
            "-r",
            "1000",
        ])
        .args(["-P", "16", "-c", "4", "-q"])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}{}", String::from_utf8_lossy(&out.stderr));
    for test in [
        "PING_INLINE:",
        "PING_MBULK:",
        "SET:",
        "GET:",
        "INCR:",
        "MSET (10 keys):",
    ] {
        assert!(text.contains(test), "{test} missing: {text}");
    }
    let out = Command::new(kvtestkit::tools::program("redis-benchmark"))
        .args(["-h", host, "-p", port, "-t", "lpush", "-n", "100", "-q"])
        .output()
        .unwrap();
    // (It prints the server's error on stderr.)
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(text.contains("ERR unknown command 'LPUSH'"), "{text}");
}

/// Sends raw bytes, returns what the server said before closing (or within 2 s).
fn raw(addr: &str, bytes: &[u8]) -> Vec<u8> {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
    s.write_all(bytes).unwrap();
    let mut out = Vec::new();
    let mut chunk = [0u8; 4096];
    while let Ok(n) = s.read(&mut chunk) {
        if n == 0 {
            break;
        }
        out.extend_from_slice(&chunk[..n]);
    }
    out
}

#[test]
fn bad_input_gets_a_protocol_error_and_a_close_and_others_are_served() {
    let (_nodes, resp) = cluster(&["--max-frame", "65536"]);
    // A bulk length over --max-frame is refused before its bytes are awaited.
    let out = raw(&resp[0], b"*2\r\n$3\r\nGET\r\n$9999999\r\n");
    assert_eq!(out, b"-ERR Protocol error: invalid bulk length\r\n");
    let out = raw(&resp[0], b"*9999999999\r\n");
    assert_eq!(out, b"-ERR Protocol error: invalid multibulk length\r\n");
    // Commands before the bad one are answered first.
    let out = raw(&resp[0], b"PING\r\n*1\r\n:5\r\n");
    assert_eq!(out, b"+PONG\r\n-ERR Protocol error: expected '$', got ':'\r\n");
    // QUIT answers and closes.
    assert_eq!(raw(&resp[0], b"QUIT\r\nPING\r\n"), b"+OK\r\n");
    assert_eq!(redis_cli(&resp[0], &["PING"]), "PONG");
}

/// Mutated streams of valid commands never take the node down: after each, a fresh client
/// is still answered.
#[test]
fn mutated_command_streams_never_stop_the_node() {
    use proptest::test_runner::{Config, TestRunner};
    let (_nodes, resp) = cluster(&["--max-frame", "65536"]);
    let valid = b"*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$5\r\nvalue\r\n*2\r\n$3\r\nGET\r\n$1\r\nk\r\nMGET k x y\r\n*4\r\n$3\r\nDEL\r\n$1\r\nk\r\n$1\r\na\r\n$1\r\nb\r\nPING\r\n";
    let mut runner = TestRunner::new(Config {
        cases: 24,
        ..Config::default()
    });
    let mutations = (
        prop::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..8),
        any::<prop::sample::Index>(),
    );
    runner
        .run(&mutations, |(flips, cut)| {
            let mut stream = valid.to_vec();
            for (at, b) in flips {
                let i = at.index(stream.len());
                stream[i] = b;
            }
            stream.truncate(cut.index(stream.len()) + 1);
            let mut s = TcpStream::connect(&resp[0]).unwrap();
            s.set_read_timeout(Some(Duration::from_millis(200))).unwrap();
            s.write_all(&stream).unwrap();
            let mut sink = [0u8; 4096];
            let _ = s.read(&mut sink);
            drop(s);
            prop_assert_eq!(redis_cli(&resp[0], &["PING"]), "PONG");
            Ok(())
        })
        .unwrap();
}

/// Large commands on many connections cannot make the node hold more than
/// --max-buffer-memory in read buffers, and a command that stalls half-way is closed after
/// --read-timeout; other clients are served throughout.
#[test]
fn buffers_are_bounded_and_stalled_commands_are_closed() {
    let (_nodes, resp) = cluster(&[
        "--max-frame",
        "600000",
        "--max-buffer-memory",
        "1mib",
        "--read-timeout",
        "3s",
    ]);
    // Each connection announces a 590,000-byte value and sends most of it.
    let mut header = b"*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$590000\r\n".to_vec();
    header.extend(std::iter::repeat_n(b'x', 500_000));
    let mut conns = Vec::new();
    for _ in 0..6 {
        let mut s = TcpStream::connect(&resp[0]).unwrap();
        let _ = s.write_all(&header);
        conns.push(s);
    }
    // A command without room waits for it (at most 1 s, as on every front), then is
    // refused; the ones that got room hold it until --read-timeout (3 s) closes them.
    let mut refused = 0;
    for s in &mut conns {
        s.set_read_timeout(Some(Duration::from_millis(2000))).unwrap();
        let mut answer = [0u8; 256];
        if let Ok(n) = s.read(&mut answer)
            && n > 0
        {
            let text = String::from_utf8_lossy(&answer[..n]);
            assert!(text.contains("buffer memory is full"), "{text}");
            refused += 1;
        }
    }
    assert!(
        refused >= 3,
        "only {refused} of 6 large commands were refused with a 1 MiB budget"
    );
    assert_eq!(redis_cli(&resp[0], &["PING"]), "PONG");
    // The stalled ones are closed after --read-timeout (3 s).
    let mut s = TcpStream::connect(&resp[0]).unwrap();
    s.write_all(b"*2\r\n$3\r\nGET\r\n").unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut sink = [0u8; 64];
    match s.read(&mut sink) {
        Ok(0) => {}
        Ok(n) => panic!(
            "a stalled command was answered: {:?}",
            String::from_utf8_lossy(&sink[..n])
        ),
        Err(e) => panic!("the stalled connection was not closed within 10 s: {e}"),
    }
    drop(conns);
}

/// Redis's answers where kvd differed (issue 58, item 9): a client name with a space is
/// refused by HELLO's SETNAME as by CLIENT SETNAME; INCRBYFLOAT by `inf` would make the value
/// infinite; MEMORY USAGE's SAMPLES takes a count of zero or more; a forged SCAN cursor is
/// an invalid cursor.
#[test]
fn small_differences_are_answered_as_redis_answers_them() {
    let (_nodes, resp) = common::resp_cluster(&[]);
    let mut con = redis::Client::open(redis_url(&resp[0]))
        .unwrap()
        .get_connection()
        .unwrap();
    let err =
        |cmd: &mut redis::Cmd, con: &mut redis::Connection| cmd.query::<redis::Value>(con).unwrap_err().to_string();
    let names = "Client names cannot contain spaces, newlines or special characters";
    let e = err(redis::cmd("HELLO").arg("3").arg("SETNAME").arg("a b"), &mut con);
    assert!(e.contains(names), "{e}");
    let e = err(redis::cmd("CLIENT").arg("SETNAME").arg("a b"), &mut con);
    assert!(e.contains(names), "{e}");
    let e = err(redis::cmd("INCRBYFLOAT").arg("f").arg("inf"), &mut con);
    assert!(e.contains("increment would produce NaN or Infinity"), "{e}");
    let e = err(redis::cmd("INCRBYFLOAT").arg("f").arg("abc"), &mut con);
    assert!(e.contains("value is not a valid float"), "{e}");
    // A sum below 1e-17 is written `0`, as Redis writes it (not 325 characters).
    let tiny: String = redis::cmd("INCRBYFLOAT")
        .arg("tiny")
        .arg("1e-320")
        .query(&mut con)
        .unwrap();
    assert_eq!(tiny, "0");
    let _: () = redis::cmd("SET").arg("m").arg("v").query(&mut con).unwrap();
    let e = err(
        redis::cmd("MEMORY").arg("USAGE").arg("m").arg("SAMPLES").arg("-1"),
        &mut con,
    );
    assert!(e.contains("syntax error"), "{e}");
    let e = err(
        redis::cmd("MEMORY").arg("USAGE").arg("m").arg("SAMPLES").arg("x"),
        &mut con,
    );
    assert!(e.contains("not an integer"), "{e}");
    let used: i64 = redis::cmd("MEMORY")
        .arg("USAGE")
        .arg("m")
        .arg("SAMPLES")
        .arg("0")
        .query(&mut con)
        .unwrap();
    assert!(used > 0);
    // A cursor no node gave out: Redis's words, not kvd's internal ones.
    let e = err(redis::cmd("SCAN").arg("123456789012"), &mut con);
    assert!(e.contains("invalid cursor"), "{e}");
}

/// Issue 59: the command table is the one registry. Every command `COMMAND` lists (it reads
/// the table) runs once with arguments of its arity: none is unknown or refused for its
/// arity, and the connection goes on. A command added to the table without a sample here
/// fails this test until one is added.
#[test]
fn every_command_of_the_table_runs_once() {
    let (_nodes, resp) = cluster(&[]);
    let mut con = redis::Client::open(redis_url(&resp[0]))
        .unwrap()
        .get_connection()
        .unwrap();
    let listed: Vec<redis::Value> = redis::cmd("COMMAND").query(&mut con).unwrap();
    let names: Vec<String> = listed
        .iter()
        .filter_map(|c| match c {
            redis::Value::Array(fields) => match fields.first() {
                Some(redis::Value::BulkString(name)) => Some(String::from_utf8_lossy(name).to_uppercase()),
                _ => None,
            },
            _ => None,
        })
        .collect();
    let count: usize = redis::cmd("COMMAND").arg("COUNT").query(&mut con).unwrap();
    assert_eq!(names.len(), count, "COMMAND and COMMAND COUNT read one table");
    let _: () = redis::cmd("SET").arg("{t}a").arg("1").query(&mut con).unwrap();
    let samples: &[(&str, &[&[&str]])] = &[
        ("APPEND", &[&["APPEND", "k", "v"]]),
        ("ASKING", &[&["ASKING"]]),
        ("AUTH", &[&["AUTH", "x"]]),
        ("CLIENT", &[&["CLIENT", "ID"]]),
        ("CLUSTER", &[&["CLUSTER", "KEYSLOT", "k"]]),
        ("COMMAND", &[&["COMMAND", "COUNT"]]),
        ("CONFIG", &[&["CONFIG", "GET", "maxmemory"]]),
        ("DBSIZE", &[&["DBSIZE"]]),
        ("DECR", &[&["DECR", "n"]]),
        ("DECRBY", &[&["DECRBY", "n", "2"]]),
        ("DEL", &[&["DEL", "gone"]]),
        ("DISCARD", &[&["DISCARD"]]),
        ("ECHO", &[&["ECHO", "hi"]]),
        ("EXEC", &[&["EXEC"]]),
        ("EXISTS", &[&["EXISTS", "k"]]),
        ("EXPIRE", &[&["EXPIRE", "k", "100"]]),
        ("EXPIREAT", &[&["EXPIREAT", "k", "99999999999"]]),
        ("EXPIRETIME", &[&["EXPIRETIME", "k"]]),
        ("FLUSHALL", &[&["FLUSHALL"]]),
        ("FLUSHDB", &[&["FLUSHDB"]]),
        ("GET", &[&["GET", "k"]]),
        ("GETDEL", &[&["GETDEL", "k"]]),
        ("GETEX", &[&["GETEX", "k", "PERSIST"]]),
        ("GETRANGE", &[&["GETRANGE", "k", "0", "1"]]),
        ("GETSET", &[&["GETSET", "k", "v"]]),
        ("HELLO", &[&["HELLO", "2"]]),
        ("INCR", &[&["INCR", "n"]]),
        ("INCRBY", &[&["INCRBY", "n", "3"]]),
        ("INCRBYFLOAT", &[&["INCRBYFLOAT", "f", "1.5"]]),
        ("INFO", &[&["INFO", "server"]]),
        ("KEYS", &[&["KEYS", "*"]]),
        ("MEMORY", &[&["MEMORY", "USAGE", "k"]]),
        ("MGET", &[&["MGET", "k", "n"]]),
        ("MSET", &[&["MSET", "a", "1", "b", "2"]]),
        ("MSETNX", &[&["MSETNX", "{t}x", "1", "{t}y", "2"]]),
        ("MULTI", &[&["MULTI"], &["SET", "{t}q", "1"], &["EXEC"]]),
        ("OBJECT", &[&["OBJECT", "ENCODING", "k"]]),
        ("PERSIST", &[&["PERSIST", "k"]]),
        ("PEXPIRE", &[&["PEXPIRE", "k", "100000"]]),
        ("PEXPIREAT", &[&["PEXPIREAT", "k", "99999999999999"]]),
        ("PEXPIRETIME", &[&["PEXPIRETIME", "k"]]),
        ("PING", &[&["PING"]]),
        ("PSETEX", &[&["PSETEX", "k", "100000", "v"]]),
        ("PTTL", &[&["PTTL", "k"]]),
        ("QUIT", &[]),
        ("RANDOMKEY", &[&["RANDOMKEY"]]),
        ("READONLY", &[&["READONLY"]]),
        ("READWRITE", &[&["READWRITE"]]),
        ("RENAME", &[&["SET", "{t}a", "1"], &["RENAME", "{t}a", "{t}b"]]),
        ("RENAMENX", &[&["RENAMENX", "{t}b", "{t}c"]]),
        ("ROLE", &[&["ROLE"]]),
        ("SCAN", &[&["SCAN", "0"]]),
        ("SELECT", &[&["SELECT", "0"]]),
        ("SET", &[&["SET", "k", "v", "EX", "100"]]),
        ("SETEX", &[&["SETEX", "k", "100", "v"]]),
        ("SETNX", &[&["SETNX", "k2", "v"]]),
        ("SETRANGE", &[&["SETRANGE", "k", "0", "x"]]),
        ("STRLEN", &[&["STRLEN", "k"]]),
        ("SUBSTR", &[&["SUBSTR", "k", "0", "1"]]),
        ("TIME", &[&["TIME"]]),
        ("TOUCH", &[&["TOUCH", "k"]]),
        ("TTL", &[&["TTL", "k"]]),
        ("TYPE", &[&["TYPE", "k"]]),
        ("UNLINK", &[&["UNLINK", "k2"]]),
        ("UNWATCH", &[&["UNWATCH"]]),
        ("WATCH", &[&["WATCH", "k"], &["UNWATCH"]]),
    ];
    for name in &names {
        let Some((_, steps)) = samples.iter().find(|(n, _)| n == name) else {
            panic!("{name} is in the command table with no sample here: add one");
        };
        for step in steps.iter() {
            let mut cmd = redis::cmd(step[0]);
            for a in &step[1..] {
                cmd.arg(*a);
            }
            if let Err(e) = cmd.query::<redis::Value>(&mut con) {
                let text = e.to_string();
                assert!(
                    !text.contains("unknown command") && !text.contains("wrong number of arguments"),
                    "{step:?}: {text}"
                );
            }
        }
        let pong: String = redis::cmd("PING").query(&mut con).unwrap();
        assert_eq!(pong, "PONG", "after {name}");
    }
    // TIME, added as one entry and one handler: Redis's shape.
    let (secs, micros): (u64, u64) = redis::cmd("TIME").query(&mut con).unwrap();
    assert!(secs > 1_700_000_000 && micros < 1_000_000);
    // QUIT last, on a connection of its own: answered, then closed.
    assert!(names.iter().any(|n| n == "QUIT"));
    let said = common::raw(&resp[1], b"QUIT\r\n");
    assert_eq!(said, "+OK\r\n");
}
