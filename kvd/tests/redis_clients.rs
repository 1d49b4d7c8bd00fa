//! Redis clients as their users run them (issue 28, first part): RESP3 after `HELLO 3`
//! (redis-py 8's default), Redis's roles, and `MULTI`, which kvd refuses as a whole: a
//! queued command never runs. On a 2-shard cluster through one node, with and without a
//! token; redis-py from the venv `.ci/run` makes (`.ci/requirements.txt`) and go-redis v9
//! (`kvd/tests/clients/goredis`, which `.ci/run` builds).

mod common;

use std::path::PathBuf;
use std::process::Command;

use common::{addr, python, raw, resp_cluster as cluster, run_client_check, start_at, token_file};

#[test]
fn hello_3_switches_to_resp3_and_hello_2_back() {
    let (_nodes, resp) = cluster(&[]);
    let got = raw(
        &resp[0],
        b"GET nope\r\nHELLO 3 SETNAME me\r\nGET nope\r\nMGET nope nope\r\nCONFIG GET databases\r\nCLIENT GETNAME\r\nHELLO 2\r\nGET nope\r\nHELLO 4\r\nQUIT\r\n",
    );
    let expected_start = "$-1\r\n%7\r\n$6\r\nserver\r\n$5\r\nredis\r\n$7\r\nversion\r\n";
    assert!(got.starts_with(expected_start), "{got:?}");
    assert!(got.contains("$5\r\nproto\r\n:3\r\n"), "{got:?}");
    // After HELLO 3: RESP3 nulls and maps; after HELLO 2: RESP2 again.
    let after3 = got.split("$7\r\nmodules\r\n*0\r\n").nth(1).unwrap();
    assert!(
        after3.starts_with("_\r\n*2\r\n_\r\n_\r\n%1\r\n$9\r\ndatabases\r\n$1\r\n1\r\n$2\r\nme\r\n*14\r\n"),
        "{after3:?}"
    );
    let after2 = got.split("$7\r\nmodules\r\n*0\r\n").nth(2).unwrap();
    assert_eq!(after2, "$-1\r\n-NOPROTO unsupported protocol version\r\n+OK\r\n");
}

/// A whole transaction sent in one write, as pipelining clients send it: the queued
/// commands answer QUEUED, EXEC runs them as one (in a round of its own), and the commands
/// after it run after it, for this node's keys and, forwarded whole, the other shard's.
#[test]
fn a_pipelined_transaction_runs_whole_and_in_order() {
    let (_nodes, resp) = cluster(&[]);
    for shard in 0..2 {
        let (a, b) = (key_of(shard, "txp-a"), key_of(shard, "txp-b"));
        let text = format!(
            "SET {a} 0\r\nMULTI\r\nINCR {a}\r\nSET {b} x\r\nEXEC\r\nGET {a}\r\nMULTI\r\nGET {b}\r\nEXEC\r\nQUIT\r\n"
        );
        let got = raw(&resp[0], text.as_bytes());
        assert_eq!(
            got,
            "+OK\r\n+OK\r\n+QUEUED\r\n+QUEUED\r\n*2\r\n:1\r\n+OK\r\n$1\r\n1\r\n+OK\r\n+QUEUED\r\n*1\r\n$1\r\nx\r\n+OK\r\n",
            "shard {shard}"
        );
    }
    // The redis crate's atomic pipeline runs.
    let (c, d) = (key_of(1, "tx-c"), key_of(1, "tx-d"));
    let client = redis::Client::open(format!("redis://{}/", resp[1])).unwrap();
    let mut con = client.get_connection().unwrap();
    let result: ((), ()) = redis::pipe()
        .atomic()
        .set(&c, "1")
        .set(&d, "2")
        .query(&mut con)
        .unwrap();
    assert_eq!(result, ((), ()));
    let left: (Option<String>, Option<String>) = redis::pipe().get(&c).get(&d).query(&mut con).unwrap();
    assert_eq!(left, (Some("1".into()), Some("2".into())));
}

#[test]
fn role_and_info_replication_tell_a_plain_node_is_a_master() {
    let (_nodes, resp) = cluster(&[]);
    let got = raw(&resp[0], b"ROLE\r\nINFO replication\r\nQUIT\r\n");
    assert!(got.starts_with("*3\r\n$6\r\nmaster\r\n:0\r\n*0\r\n"), "{got:?}");
    assert!(got.contains("role:master\r\nconnected_slaves:0\r\n"), "{got:?}");
}

fn redis_py(addr: &str, token: Option<&str>) {
    let python = python();
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/clients/redis_py_check.py");
    let mut cmd = Command::new(python);
    cmd.arg(script);
    run_check(cmd, "redis-py", addr, token);
}

/// Runs an outside client's check program against `addr` (with `token`).
fn run_check(mut cmd: Command, client: &str, addr: &str, token: Option<&str>) {
    cmd.arg(addr);
    if let Some(t) = token {
        cmd.arg(t);
    }
    run_client_check(cmd, client);
}

#[test]
fn redis_py_with_its_defaults_works_through_one_node() {
    let (_nodes, resp) = cluster(&[]);
    redis_py(&resp[0], None);
}

#[test]
fn redis_py_with_a_token_works_through_one_node() {
    let token = "py-token-0123456789abcdef";
    let path = token_file("redis-py-token", token);
    let (_nodes, resp) = cluster(&["--auth-token-file", &path]);
    redis_py(&resp[1], Some(token));
}

/// In a replica group the roles are the group's: the leader is a `master` with two
/// replicas, a follower a `slave` naming its master, which answers a write with Redis's
/// `-READONLY` (nothing ran) and serves reads.
#[test]
fn a_group_shows_true_roles_and_a_follower_refuses_writes_as_a_redis_replica() {
    let bin: Vec<String> = (0..3).map(|_| addr()).collect();
    let resp: Vec<String> = (0..3).map(|_| addr()).collect();
    let http: Vec<String> = (0..3).map(|_| addr()).collect();
    let group = bin.join(",");
    let dirs: Vec<common::TempDir> = (0..3).map(|i| common::temp_dir(&format!("redis-roles-{i}"))).collect();
    let mut guards = Vec::new();
    for (i, dir) in dirs.iter().enumerate() {
        let d = dir.path().display().to_string();
        let args = [
            "--data-dir",
            &d,
            "--group",
            &group,
            "--resp",
            &resp[i],
            "--http",
            &http[i],
        ];
        guards.push(start_at(&bin[i], &args).0);
    }
    let init = common::kvd(&["admin", "init-group", "--nodes", &bin.join("|")]);
    assert!(init.status.success(), "{}", String::from_utf8_lossy(&init.stderr));
    let role = |i: usize| raw(&resp[i], b"INFO replication\r\nQUIT\r\n");
    let leader = common::until("a master among the members", common::HANG, || {
        (0..3).find(|&i| role(i).contains("role:master")).ok_or("none yet")
    });
    let info = role(leader);
    assert!(info.contains("connected_slaves:2"), "{info}");
    let follower = (leader + 1) % 3;
    let info = role(follower);
    assert!(
        info.contains("role:slave") && info.contains("master_link_status:"),
        "{info}"
    );
    let got = raw(&resp[leader], b"SET roles-k v\r\nQUIT\r\n");
    assert!(got.starts_with("+OK"), "{got:?}");
    let got = raw(&resp[follower], b"SET roles-k w\r\nQUIT\r\n");
    assert!(
        got.starts_with("-READONLY You can't write against a read only replica."),
        "{got:?}"
    );
    let got = raw(&resp[follower], b"GET roles-k\r\nROLE\r\nQUIT\r\n");
    assert!(got.starts_with("$1\r\nv\r\n*5\r\n$5\r\nslave\r\n"), "{got:?}");
    // /healthz tells the same roles (it said "standalone" for every node).
    let health = |i: usize| {
        let out = Command::new(kvtestkit::tools::program("curl"))
            .args(["-s", &format!("http://{}/healthz", http[i])])
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    assert!(health(leader).contains("\"role\":\"leader\""), "{}", health(leader));
    assert!(
        health(follower).contains("\"role\":\"follower\""),
        "{}",
        health(follower)
    );
    drop(guards);
}

/// go-redis v9's checks (`kvd/tests/clients/goredis`), built by `.ci/run` into
/// target/goredis-check.
fn go_redis(addr: &str, token: Option<&str>) {
    run_check(Command::new(kvtestkit::tools::goredis()), "go-redis", addr, token);
}

#[test]
fn go_redis_with_resp3_and_resp2_works_through_one_node_also_with_a_token() {
    let (_nodes, resp) = cluster(&[]);
    go_redis(&resp[0], None);
    let token = "go-token-0123456789abcdef";
    let path = token_file("go-redis-token", token);
    let (_nodes, resp) = cluster(&["--auth-token-file", &path]);
    go_redis(&resp[1], Some(token));
}

/// A key of `shard` (of 2) named with `prefix`.
fn key_of(shard: u32, prefix: &str) -> String {
    (0..)
        .map(|i| format!("{prefix}{i}"))
        .find(|k| kvshared::routing::owner_node(k.as_bytes(), 2) == shard)
        .unwrap()
}

/// 64 clients of `addr` at once, each sending `rounds` times, for each of `keys`, the
/// command `command[0] KEY command[1..]` (answered with an integer).
fn from_64_clients(addr: &str, keys: &[String], rounds: usize, command: &'static [&'static str]) {
    let threads: Vec<_> = (0..64)
        .map(|_| {
            let (addr, keys) = (addr.to_string(), keys.to_vec());
            std::thread::spawn(move || {
                let mut con = redis::Client::open(format!("redis://{addr}/"))
                    .unwrap()
                    .get_connection()
                    .unwrap();
                for _ in 0..rounds {
                    for k in &keys {
                        let _: i64 = redis::cmd(command[0])
                            .arg(k)
                            .arg(&command[1..])
                            .query(&mut con)
                            .unwrap();
                    }
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
}

/// INCR is atomic under concurrency: 64 clients incrementing one key 100 times each end at
/// exactly 6,400, for a key the node owns and one it forwards to the other shard; DECR,
/// INCRBY and DECRBY, and Redis's error texts for a value that is not an integer and for an
/// overflow (nothing changed).
#[test]
fn incr_from_64_clients_ends_at_the_exact_count_and_errors_are_redis_s() {
    let (_nodes, resp) = cluster(&[]);
    let keys = [key_of(0, "count-"), key_of(1, "count-")];
    from_64_clients(&resp[0], &keys, 100, &["INCR"]);
    let got = raw(
        &resp[1],
        format!(
            "GET {}\r\nGET {}\r\nDECR {}\r\nINCRBY {} 10\r\nDECRBY {} 20\r\nQUIT\r\n",
            keys[0], keys[1], keys[0], keys[0], keys[0]
        )
        .as_bytes(),
    );
    assert_eq!(got, "$4\r\n6400\r\n$4\r\n6400\r\n:6399\r\n:6409\r\n:6389\r\n+OK\r\n");
    let got = raw(
        &resp[0],
        b"SET s abc\r\nINCR s\r\nGET s\r\nSET big 9223372036854775807\r\nINCR big\r\nINCRBY n x\r\nINCRBY n 007\r\nDECRBY n -9223372036854775808\r\nINCR\r\nQUIT\r\n",
    );
    assert_eq!(
        got,
        "+OK\r\n-ERR value is not an integer or out of range\r\n$3\r\nabc\r\n+OK\r\n-ERR increment or decrement would overflow\r\n-ERR value is not an integer or out of range\r\n-ERR value is not an integer or out of range\r\n-ERR decrement would overflow\r\n-ERR wrong number of arguments for 'incr' command\r\n+OK\r\n"
    );
}

/// APPEND is atomic under concurrency too: 64 clients appending one byte 50 times each to a
/// local and a forwarded key end with exactly 3,200 bytes each; the new length is answered.
#[test]
fn append_from_64_clients_loses_no_byte() {
    let (_nodes, resp) = cluster(&[]);
    let keys = [key_of(0, "log-"), key_of(1, "log-")];
    from_64_clients(&resp[0], &keys, 50, &["APPEND", "x"]);
    let got = raw(
        &resp[1],
        format!(
            "STRLEN {}\r\nSTRLEN {}\r\nAPPEND {} yz\r\nAPPEND\r\nQUIT\r\n",
            keys[0], keys[1], keys[0]
        )
        .as_bytes(),
    );
    assert_eq!(
        got,
        ":3200\r\n:3200\r\n:3202\r\n-ERR wrong number of arguments for 'append' command\r\n+OK\r\n"
    );
}

/// SETRANGE as Redis answers it, for a local and a forwarded key: padding, overwriting, the
/// new length, and Redis's refusals (checked before anything is sent).
#[test]
fn setrange_answers_as_redis() {
    let (_nodes, resp) = cluster(&[]);
    for k in [key_of(0, "range-"), key_of(1, "range-")] {
        let none = format!("{k}-none");
        let got = raw(
            &resp[0],
            format!(
                "SET {k} Hello_World\r\nSETRANGE {k} 6 Redis\r\nGET {k}\r\nSETRANGE {k}-new 2 ab\r\nGET {k}-new\r\n\
                 *4\r\n$8\r\nSETRANGE\r\n${}\r\n{none}\r\n$1\r\n5\r\n$0\r\n\r\nEXISTS {none}\r\n\
                 SETRANGE {k} -1 x\r\nSETRANGE {k} x x\r\nSETRANGE {k} 536870911 ab\r\nSETRANGE {k} 1\r\nQUIT\r\n",
                none.len()
            )
            .as_bytes(),
        );
        assert_eq!(
            got,
            "+OK\r\n:11\r\n$11\r\nHello_Redis\r\n:4\r\n$4\r\n\0\0ab\r\n:0\r\n:0\r\n-ERR offset is out of range\r\n\
             -ERR value is not an integer or out of range\r\n-ERR string exceeds maximum allowed size (proto-max-bulk-len)\r\n\
             -ERR wrong number of arguments for 'setrange' command\r\n+OK\r\n",
            "{k}"
        );
    }
}

/// APPEND stops below `--max-frame` (issue 58): a value longer than the node could send back
/// (or send to a member catching up) is refused with Redis's text on RESP and as a bad range
/// on the binary protocol, and nothing changes; in memory, durable, and in a replica group.
#[test]
fn appends_stop_below_the_frame_limit_in_every_mode() {
    const CHUNK: usize = 600 << 10;
    let append = |key: &str| {
        format!(
            "*3\r\n$6\r\nAPPEND\r\n${}\r\n{key}\r\n${CHUNK}\r\n{}\r\n",
            key.len(),
            "a".repeat(CHUNK)
        )
    };
    let over = "-ERR string exceeds maximum allowed size (proto-max-bulk-len)\r\n";
    let check = |resp: &str, mode: &str| {
        let got = raw(
            resp,
            format!("{}{}STRLEN big\r\nQUIT\r\n", append("big"), append("big")).as_bytes(),
        );
        assert_eq!(got, format!(":{CHUNK}\r\n{over}:{CHUNK}\r\n+OK\r\n"), "{mode}");
    };
    let frame = ["--max-frame", "1mib"];
    // In memory and durable, both fronts.
    let dir = common::temp_dir("append-cap");
    let d = dir.path().display().to_string();
    for (mode, extra) in [("in memory", vec![]), ("durable", vec!["--data-dir", d.as_str()])] {
        let (bin, resp) = (addr(), addr());
        let args = [&frame[..], &["--resp", &resp], &extra[..]].concat();
        let (node, _) = start_at(&bin, &args);
        check(&resp, mode);
        let mut s = std::net::TcpStream::connect(&bin).unwrap();
        let mut req = kvshared::wire::BatchRequest::new();
        req.push(kvshared::wire::OpKind::Append, b"bin", &vec![b'b'; CHUNK]);
        for expected in [
            kvshared::wire::OpReply::Counted(CHUNK as i64),
            kvshared::wire::OpReply::Malformed(kvshared::wire::MalformedOp::BadRange.as_str()),
        ] {
            let (_, body) = common::exchange(&mut s, &common::batch_frame(1, &req));
            let reply = kvshared::wire::ReplyView::parse(&body).unwrap();
            assert_eq!(reply.result(0), expected, "{mode}");
        }
        drop(node);
    }
    // A replica group: what the leader refuses is never logged.
    let (_group, resp, leader) = common::resp_group_with("append-cap-group", &frame);
    check(&resp[leader], "a replica group");
}

/// Counters, appends and range writes are logged like any write: after kill -9 the replayed
/// log gives the same values.
#[test]
fn counters_survive_kill_9_through_the_log() {
    let dir = common::temp_dir("redis-counters");
    let d = dir.path().display().to_string();
    let bin = addr();
    let resp = addr();
    let (mut node, _) = start_at(&bin, &["--data-dir", &d, "--resp", &resp]);
    let mut pipeline = Vec::new();
    for _ in 0..500 {
        pipeline.extend_from_slice(b"INCR logged\r\nINCRBY other 3\r\nAPPEND text ab\r\n");
    }
    pipeline.extend_from_slice(b"SETRANGE text 1 XY\r\n");
    pipeline.extend_from_slice(b"QUIT\r\n");
    let got = raw(&resp, &pipeline);
    assert!(
        got.contains(":500\r\n:1500\r\n:1000\r\n:1000\r\n+OK"),
        "{}",
        &got[got.len().saturating_sub(60)..]
    );
    node.kill();
    let (_node, _) = start_at(&bin, &["--data-dir", &d, "--resp", &resp]);
    let got = raw(
        &resp,
        b"GET logged\r\nGET other\r\nINCR logged\r\nSTRLEN text\r\nGETRANGE text 0 5\r\nQUIT\r\n",
    );
    assert_eq!(
        got,
        "$3\r\n500\r\n$4\r\n1500\r\n:501\r\n:1000\r\n$6\r\naXYbab\r\n+OK\r\n"
    );
}

/// The string reads and GETDEL, as Redis answers them, for a local and a forwarded key.
#[test]
fn getdel_strlen_getrange_type_and_touch_answer_as_redis() {
    let (_nodes, resp) = cluster(&[]);
    for shard in 0..2 {
        let k = key_of(shard, "str-");
        let got = raw(
            &resp[0],
            format!(
                "*3\r\n$3\r\nSET\r\n${}\r\n{k}\r\n$16\r\nThis is a string\r\nSTRLEN {k}\r\nGETRANGE {k} 0 3\r\nGETRANGE {k} -3 -1\r\nSUBSTR {k} 10 100\r\nTYPE {k}\r\nTOUCH {k} nope\r\nGETDEL {k}\r\nGETDEL {k}\r\nTYPE {k}\r\nSTRLEN {k}\r\nGETRANGE {k} x 1\r\nQUIT\r\n",
                k.len()
            )
            .as_bytes(),
        );
        assert_eq!(
            got,
            "+OK\r\n:16\r\n$4\r\nThis\r\n$3\r\ning\r\n$6\r\nstring\r\n+string\r\n:1\r\n$16\r\nThis is a string\r\n$-1\r\n+none\r\n:0\r\n-ERR value is not an integer or out of range\r\n+OK\r\n",
            "shard {shard}"
        );
    }
}

/// INCRBYFLOAT as Redis's examples answer it, for a local and a forwarded key, with its
/// errors (nothing changed); the sum is stored as text (GET reads it).
#[test]
fn incrbyfloat_answers_as_redis() {
    let (_nodes, resp) = cluster(&[]);
    for shard in 0..2 {
        let k = key_of(shard, "float");
        let text = format!(
            "SET {k} 10.50\r\nINCRBYFLOAT {k} 0.1\r\nINCRBYFLOAT {k} -5\r\nGET {k}\r\nSET {k} 5.0e3\r\n\
             INCRBYFLOAT {k} 2.0e2\r\nINCRBYFLOAT {k} abc\r\nSET {k} text\r\nINCRBYFLOAT {k} 1\r\n\
             SET {k} 1e308\r\nINCRBYFLOAT {k} 1e308\r\nGET {k}\r\nINCRBYFLOAT {k}\r\nQUIT\r\n"
        );
        let got = raw(&resp[0], text.as_bytes());
        assert_eq!(
            got,
            "+OK\r\n$4\r\n10.6\r\n$3\r\n5.6\r\n$3\r\n5.6\r\n+OK\r\n$4\r\n5200\r\n\
             -ERR value is not a valid float\r\n+OK\r\n-ERR value is not a valid float\r\n+OK\r\n\
             -ERR increment would produce NaN or Infinity\r\n$5\r\n1e308\r\n\
             -ERR wrong number of arguments for 'incrbyfloat' command\r\n+OK\r\n",
            "{k}"
        );
    }
}
