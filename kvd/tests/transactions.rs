//! Redis transactions through the RESP front: MULTI/EXEC/DISCARD/WATCH/UNWATCH answer as
//! Redis's; a transaction is atomic under concurrency (no reader ever sees half of one,
//! optimistic WATCH increments end at the exact count) in memory, durable and in a replica
//! group; one whose keys span shards is refused with CROSSSLOT; one on another shard's keys
//! is forwarded whole; after kill -9 the log replays whole transactions.

mod common;

use std::time::{Duration, Instant};

use common::{addr, raw, resp_cluster, start_at};
use redis::Value;

fn con(addr: &str) -> redis::Connection {
    redis::Client::open(format!("redis://{addr}/"))
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

fn err_contains(v: &Value, text: &str) -> bool {
    matches!(v, Value::SimpleString(e) if e.contains(text))
}

fn bulk(s: &str) -> Value {
    Value::BulkString(s.as_bytes().to_vec())
}

/// The first key `prefix{i}` that node `shard` of 2 owns.
fn key_of(shard: u32, prefix: &str) -> String {
    (0..)
        .map(|i| format!("{prefix}{i}"))
        .find(|k| kvshared::routing::owner_node(k.as_bytes(), 2) == shard)
        .unwrap()
}

/// Redis's answers, for a transaction on this node's keys and one on the other shard's.
#[test]
fn multi_exec_discard_and_watch_answer_as_redis() {
    let (_guards, resp) = resp_cluster(&[]);
    let mut c = con(&resp[0]);
    for shard in 0..2 {
        let (a, t) = (key_of(shard, "tx-a"), key_of(shard, "tx-text"));
        assert_eq!(cmd(&mut c, &["SET", &t, "text"]), Value::Okay);
        // (Raw: the redis crate turns an EXEC array holding an error into an error.)
        let got = raw(
            &resp[0],
            format!("MULTI\r\nSET {a} 1\r\nINCR {a}\r\nINCR {t}\r\nGET {a}\r\nPING\r\nEXEC\r\nQUIT\r\n").as_bytes(),
        );
        assert_eq!(
            got,
            "+OK\r\n+QUEUED\r\n+QUEUED\r\n+QUEUED\r\n+QUEUED\r\n+QUEUED\r\n*5\r\n+OK\r\n:2\r\n\
             -ERR value is not an integer or out of range\r\n$1\r\n2\r\n+PONG\r\n+OK\r\n",
            "shard {shard}"
        );
        // A command refused when queued aborts the whole transaction: nothing runs.
        assert_eq!(cmd(&mut c, &["MULTI"]), Value::Okay);
        cmd(&mut c, &["SET", &a, "9"]);
        assert!(err_contains(&cmd(&mut c, &["INCRBY", &a]), "wrong number of arguments"));
        assert!(err_contains(&cmd(&mut c, &["NOSUCH"]), "unknown command"));
        assert!(err_contains(&cmd(&mut c, &["EXEC"]), "Transaction discarded"));
        assert_eq!(cmd(&mut c, &["GET", &a]), bulk("2"));
        // DISCARD drops the queue.
        assert_eq!(cmd(&mut c, &["MULTI"]), Value::Okay);
        cmd(&mut c, &["SET", &a, "9"]);
        assert_eq!(cmd(&mut c, &["DISCARD"]), Value::Okay);
        assert_eq!(cmd(&mut c, &["GET", &a]), bulk("2"));
        // WATCH: a change by another client makes EXEC answer null and run nothing.
        let mut other = con(&resp[1]);
        assert_eq!(cmd(&mut c, &["WATCH", &a]), Value::Okay);
        assert_eq!(cmd(&mut other, &["SET", &a, "changed"]), Value::Okay);
        assert_eq!(cmd(&mut c, &["MULTI"]), Value::Okay);
        cmd(&mut c, &["SET", &a, "mine"]);
        assert_eq!(cmd(&mut c, &["EXEC"]), Value::Nil);
        assert_eq!(cmd(&mut c, &["GET", &a]), bulk("changed"));
        // Unchanged: it runs; EXEC ends the watch.
        assert_eq!(cmd(&mut c, &["WATCH", &a]), Value::Okay);
        assert_eq!(cmd(&mut c, &["MULTI"]), Value::Okay);
        cmd(&mut c, &["SET", &a, "mine"]);
        assert_eq!(cmd(&mut c, &["EXEC"]), Value::Array(vec![Value::Okay]));
        // UNWATCH forgets the watch.
        assert_eq!(cmd(&mut c, &["WATCH", &a]), Value::Okay);
        assert_eq!(cmd(&mut other, &["SET", &a, "again"]), Value::Okay);
        assert_eq!(cmd(&mut c, &["UNWATCH"]), Value::Okay);
        assert_eq!(cmd(&mut c, &["MULTI"]), Value::Okay);
        cmd(&mut c, &["GET", &a]);
        assert_eq!(cmd(&mut c, &["EXEC"]), Value::Array(vec![bulk("again")]));
        // A watched key that expires counts as changed.
        assert_eq!(cmd(&mut c, &["SET", &a, "v", "PX", "100"]), Value::Okay);
        assert_eq!(cmd(&mut c, &["WATCH", &a]), Value::Okay);
        std::thread::sleep(Duration::from_millis(200));
        assert_eq!(cmd(&mut c, &["MULTI"]), Value::Okay);
        cmd(&mut c, &["SET", &a, "mine"]);
        assert_eq!(cmd(&mut c, &["EXEC"]), Value::Nil);
    }
    // Keys of two shards in one transaction: CROSSSLOT when queued, EXECABORT at EXEC.
    let (k0, k1) = (key_of(0, "tx-x"), key_of(1, "tx-x"));
    assert_eq!(cmd(&mut c, &["MULTI"]), Value::Okay);
    cmd(&mut c, &["SET", &k0, "1"]);
    assert!(err_contains(&cmd(&mut c, &["SET", &k1, "1"]), "hash to the same slot"));
    assert!(err_contains(&cmd(&mut c, &["EXEC"]), "Transaction discarded"));
    assert_eq!(cmd(&mut c, &["EXISTS", &k0]), Value::Int(0));
    let errors = [
        (&["EXEC"][..], "EXEC without MULTI"),
        (&["DISCARD"], "DISCARD without MULTI"),
    ];
    for (args, text) in errors {
        assert!(err_contains(&cmd(&mut c, args), text), "{args:?}");
    }
    assert_eq!(cmd(&mut c, &["MULTI"]), Value::Okay);
    assert!(err_contains(&cmd(&mut c, &["MULTI"]), "MULTI calls can not be nested"));
    assert!(err_contains(
        &cmd(&mut c, &["WATCH", "x"]),
        "WATCH inside MULTI is not allowed"
    ));
    assert_eq!(cmd(&mut c, &["EXEC"]), Value::Array(vec![]));
}

/// Under concurrency: writers move one unit from `a` to `b` in transactions (DECR a,
/// INCR b) while readers read both in transactions: every read sums to the start (no
/// reader sees half of one), and at the end the units moved are exactly the writers'.
/// Then 16 clients increment a counter optimistically (WATCH, GET, MULTI, SET, EXEC, retry
/// on null): it ends at the exact count.
fn atomic_under_concurrency(addr: &str, shard: u32) -> [String; 3] {
    let keys = [key_of(shard, "txa"), key_of(shard, "txb"), key_of(shard, "txn")];
    let [a, b, n]: [&'static str; 3] = keys.clone().map(|k| &*Box::leak(k.into_boxed_str()));
    let mut c = con(addr);
    assert_eq!(cmd(&mut c, &["MSET", a, "1000", b, "0", n, "0"]), Value::Okay);
    // (Only a bound against a hang.)
    let stop = Instant::now() + common::HANG;
    let mut threads = Vec::new();
    for w in 0..4 {
        let addr = addr.to_string();
        threads.push(std::thread::spawn(move || {
            let mut c = con(&addr);
            for _ in 0..100 {
                let r: (i64, i64) = redis::pipe().atomic().decr(a, 1).incr(b, 1).query(&mut c).unwrap();
                assert_eq!(r.0 + r.1, 1000, "writer {w}: {r:?}");
            }
        }));
    }
    for _ in 0..4 {
        let addr = addr.to_string();
        threads.push(std::thread::spawn(move || {
            let mut c = con(&addr);
            for _ in 0..200 {
                if Instant::now() > stop {
                    break;
                }
                let (x, y): (i64, i64) = redis::pipe().atomic().get(a).get(b).query(&mut c).unwrap();
                assert_eq!(x + y, 1000, "a reader saw half a transaction: {x} + {y}");
            }
        }));
    }
    for _ in 0..16 {
        let addr = addr.to_string();
        threads.push(std::thread::spawn(move || {
            let mut c = con(&addr);
            for _ in 0..20 {
                loop {
                    assert!(Instant::now() < stop, "optimistic increments did not finish");
                    cmd(&mut c, &["WATCH", n]);
                    let v: i64 = redis::cmd("GET").arg(n).query(&mut c).unwrap();
                    let done: Option<(String,)> = redis::pipe().atomic().set(n, v + 1).query(&mut c).unwrap();
                    if done.is_some() {
                        break;
                    }
                }
            }
        }));
    }
    for t in threads {
        t.join().unwrap();
    }
    assert_eq!(
        cmd(&mut c, &["MGET", a, b, n]),
        Value::Array(vec![bulk("600"), bulk("400"), bulk("320")])
    );
    keys
}

#[test]
fn transactions_are_atomic_under_concurrency_in_memory() {
    let (_guards, resp) = resp_cluster(&[]);
    // Through one node: a transaction on its own keys, and one forwarded whole.
    atomic_under_concurrency(&resp[0], 0);
    atomic_under_concurrency(&resp[0], 1);
}

#[test]
fn transactions_are_atomic_under_concurrency_durable_and_replay_whole_after_kill_9() {
    let dir = common::temp_dir("tx-durable");
    let d = dir.path().display().to_string();
    let bin = addr();
    let resp = addr();
    let (mut node, _) = start_at(&bin, &["--data-dir", &d, "--resp", &resp]);
    let [a, b, n] = atomic_under_concurrency(&resp, 0);
    node.kill();
    let (_node, _) = start_at(&bin, &["--data-dir", &d, "--resp", &resp]);
    let mut c = con(&resp);
    assert_eq!(
        cmd(&mut c, &["MGET", &a, &b, &n]),
        Value::Array(vec![bulk("600"), bulk("400"), bulk("320")])
    );
}

#[test]
fn transactions_are_atomic_under_concurrency_in_a_group() {
    let (_guards, resp, leader) = common::resp_group("tx-atomic");
    atomic_under_concurrency(&resp[leader], 0);
}

/// MSETNX sets every key or none (1 or 0), atomically, and refuses keys of two shards.
#[test]
fn msetnx_sets_all_or_none() {
    let (_guards, resp) = resp_cluster(&[]);
    let mut c = con(&resp[0]);
    for shard in 0..2 {
        let (a, b, d) = (key_of(shard, "nx-a"), key_of(shard, "nx-b"), key_of(shard, "nx-d"));
        assert_eq!(cmd(&mut c, &["MSETNX", &a, "1", &b, "2"]), Value::Int(1));
        assert_eq!(cmd(&mut c, &["MSETNX", &d, "3", &b, "4"]), Value::Int(0));
        assert_eq!(
            cmd(&mut c, &["MGET", &a, &b, &d]),
            Value::Array(vec![bulk("1"), bulk("2"), Value::Nil])
        );
    }
    let (k0, k1) = (key_of(0, "nx-x"), key_of(1, "nx-x"));
    assert!(err_contains(
        &cmd(&mut c, &["MSETNX", &k0, "1", &k1, "1"]),
        "hash to the same slot"
    ));
    assert!(err_contains(
        &cmd(&mut c, &["MSETNX", &k0]),
        "wrong number of arguments"
    ));
}
