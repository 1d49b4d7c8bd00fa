//! Redis Cluster on the RESP front (issue 30, item 4): nodes started with `--resp-cluster`
//! answer `CLUSTER SLOTS|SHARDS|NODES|INFO|MYID`, redirect a command for another shard's
//! slot with `-MOVED`, refuse keys of several shards with `-CROSSSLOT`; redis-cli -c,
//! redis-py's RedisCluster and go-redis's ClusterClient route by themselves, with no
//! redirect once they know the slots; in 3 groups x 3 members the leaders are the masters,
//! a follower redirects to its leader and serves reads after READONLY.

mod common;

use std::path::PathBuf;
use std::process::Command;

use common::{groups_cluster, kvd, python, raw, run_client_check};
use kvshared::routing::{key_slot, owner_node};

/// A key of `shard` (of `count`) named with `prefix`.
fn key_of(shard: u32, count: u32, prefix: &str) -> String {
    (0..)
        .map(|i| format!("{prefix}{i}"))
        .find(|k| owner_node(k.as_bytes(), count) == shard)
        .unwrap()
}

/// The nodes' `moved` counters, summed.
fn moved(nodes: &str) -> u64 {
    let out = kvd(&["stats", "--json", "--nodes", nodes]);
    let all: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let all = all.as_array().unwrap();
    all.iter().map(|n| n["stats"]["moved"].as_u64().unwrap_or(0)).sum()
}

#[test]
fn three_nodes_describe_the_cluster_and_redirect_as_redis_cluster() {
    let (_guards, nodes, resp) = groups_cluster("rc-three", 3, 1);
    let slots = raw(&resp[1][0], b"CLUSTER SLOTS\r\nQUIT\r\n");
    assert!(
        slots.starts_with("*3\r\n*3\r\n:0\r\n:5461\r\n*3\r\n$9\r\n127.0.0.1\r\n"),
        "{slots:?}"
    );
    for r in &resp {
        let port = r[0].rsplit_once(':').unwrap().1;
        assert!(slots.contains(&format!(":{port}\r\n")), "{slots:?}");
    }
    let (listed, me) = (
        raw(&resp[2][0], b"CLUSTER NODES\r\nQUIT\r\n"),
        raw(&resp[2][0], b"CLUSTER MYID\r\nQUIT\r\n"),
    );
    let id = me.lines().nth(1).unwrap();
    let mine = listed.lines().find(|l| l.contains("myself")).unwrap();
    assert!(
        mine.starts_with(id) && mine.contains(&resp[2][0]) && mine.ends_with(" 10923-16383"),
        "{listed}"
    );
    assert_eq!(listed.lines().filter(|l| l.contains("master")).count(), 3, "{listed}");
    // Redis Cluster's own tools ask INFO first (`redis-cli --cluster check`).
    let info = raw(&resp[0][0], b"INFO cluster\r\nINFO server\r\nQUIT\r\n");
    assert!(info.contains("# Cluster\r\ncluster_enabled:1\r\n"), "{info:?}");
    assert!(info.contains("redis_mode:cluster\r\n"), "{info:?}");
    // A key of shard 2 asked at shard 0: MOVED to shard 2's RESP address.
    let k = key_of(2, 3, "moved-");
    let got = raw(&resp[0][0], format!("SET {k} v\r\nQUIT\r\n").as_bytes());
    assert_eq!(
        got,
        format!("-MOVED {} {}\r\n+OK\r\n", key_slot(k.as_bytes()), resp[2][0])
    );
    assert_eq!(moved(&nodes), 1);
    // Keys of two shards: CROSSSLOT; keys of this shard's several slots: served.
    let (a, b, c) = (key_of(0, 3, "a-"), key_of(1, 3, "b-"), key_of(0, 3, "c-"));
    let got = raw(
        &resp[0][0],
        format!("MGET {a} {b}\r\nMSET {a} 1 {c} 2\r\nQUIT\r\n").as_bytes(),
    );
    assert_eq!(
        got,
        "-CROSSSLOT Keys in request don't hash to the same slot\r\n+OK\r\n+OK\r\n"
    );
    // In MULTI a key of another shard is redirected when queued, and EXEC aborts.
    let got = raw(
        &resp[0][0],
        format!("MULTI\r\nSET {a} x\r\nSET {b} y\r\nEXEC\r\nQUIT\r\n").as_bytes(),
    );
    assert!(got.starts_with("+OK\r\n+QUEUED\r\n-MOVED "), "{got:?}");
    assert!(got.contains("-EXECABORT"), "{got:?}");
    // redis-cli -c follows the redirects.
    for shard in 0..3 {
        let k = key_of(shard, 3, "cli-");
        let set = Command::new(kvtestkit::tools::program("redis-cli"))
            .args(["-c", "-p", port_of(&resp[0][0]), "set", &k, "v1"])
            .output()
            .unwrap();
        assert_eq!(String::from_utf8_lossy(&set.stdout).trim(), "OK", "{set:?}");
        let get = Command::new(kvtestkit::tools::program("redis-cli"))
            .args(["-c", "-p", port_of(&resp[1][0]), "get", &k])
            .output()
            .unwrap();
        assert_eq!(String::from_utf8_lossy(&get.stdout).trim(), "v1");
    }
    // The slot's keys, where they are.
    let slot = key_slot(a.as_bytes());
    let got = raw(&resp[0][0], format!("CLUSTER COUNTKEYSINSLOT {slot}\r\nCLUSTER GETKEYSINSLOT {slot} 5\r\nCLUSTER COUNTKEYSINSLOT 16384\r\nQUIT\r\n").as_bytes());
    assert!(got.starts_with(":1\r\n*1\r\n"), "{got:?}");
    assert!(
        got.contains(&a) && got.ends_with("-ERR Invalid slot\r\n+OK\r\n"),
        "{got:?}"
    );
    // `kvd stats` says which slots each node serves.
    let stats = String::from_utf8_lossy(&kvd(&["stats", "--nodes", &nodes]).stdout).into_owned();
    for slots in [
        "0-5461 (5462 slots)",
        "5462-10922 (5461 slots)",
        "10923-16383 (5461 slots)",
    ] {
        assert!(stats.contains(&format!("slots: {slots}")), "{stats}");
    }
    // Without --resp-cluster nothing changed: see redis_clients.rs (forwarding).
}

fn port_of(addr: &str) -> &str {
    addr.rsplit_once(':').unwrap().1
}

/// redis-py's RedisCluster and go-redis's ClusterClient against `addr`, and the redirects
/// they met: none, since each learns the slots before its first command.
fn cluster_clients(nodes: &str, addr: &str, replicas: bool) {
    let before = moved(nodes);
    let mut cmd = Command::new(python());
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/clients/redis_py_cluster_check.py");
    cmd.arg(script).arg(addr);
    if replicas {
        cmd.arg("--replicas");
    }
    run_client_check(cmd, "redis-py RedisCluster");
    let mut cmd = Command::new(kvtestkit::tools::goredis());
    cmd.arg(if replicas { "cluster-readonly" } else { "cluster" }).arg(addr);
    run_client_check(cmd, "go-redis ClusterClient");
    assert_eq!(
        moved(nodes),
        before,
        "a cluster client that knows the slots was redirected"
    );
}

#[test]
fn cluster_clients_route_by_themselves_without_redirects() {
    let (_guards, nodes, resp) = groups_cluster("rc-clients", 3, 1);
    cluster_clients(&nodes, &resp[1][0], false);
}

/// 3 groups x 3 members: the leaders are the masters and the followers their replicas;
/// a follower redirects a key of its own slots to its leader, and after READONLY serves
/// the read itself; the cluster clients route without a redirect, to replicas too.
#[test]
fn three_groups_of_three_are_masters_and_replicas() {
    let (_guards, nodes, resp) = groups_cluster("rc-groups", 3, 3);
    let slots = raw(&resp[0][0], b"CLUSTER SLOTS\r\nQUIT\r\n");
    assert!(
        slots.starts_with("*3\r\n*5\r\n:0\r\n:5461\r\n"),
        "master and two replicas per range: {slots:?}"
    );
    let listed = raw(&resp[0][0], b"CLUSTER NODES\r\nQUIT\r\n");
    let flagged = |f: &str| {
        listed
            .lines()
            .filter(|l| l.split(' ').nth(2).is_some_and(|x| x.contains(f)))
            .count()
    };
    assert_eq!((flagged("master"), flagged("slave")), (3, 6), "{listed}");
    // Group 1's leader and a follower, by their RESP addresses.
    let role = |addr: &str| raw(addr, b"ROLE\r\nQUIT\r\n");
    let leader = resp[1].iter().find(|a| role(a).contains("master")).unwrap().clone();
    let follower = resp[1].iter().find(|a| role(a).contains("slave")).unwrap().clone();
    let k = key_of(1, 3, "grp-");
    let got = raw(&leader, format!("SET {k} v\r\nQUIT\r\n").as_bytes());
    assert_eq!(got, "+OK\r\n+OK\r\n");
    let slot = key_slot(k.as_bytes());
    let got = raw(
        &follower,
        format!("GET {k}\r\nREADONLY\r\nGET {k}\r\nSET {k} w\r\nQUIT\r\n").as_bytes(),
    );
    let to_leader = format!("-MOVED {slot} {leader}\r\n");
    assert_eq!(got, format!("{to_leader}+OK\r\n$1\r\nv\r\n{to_leader}+OK\r\n"));
    cluster_clients(&nodes, &resp[2][0], false);
    cluster_clients(&nodes, &resp[0][1], true);
}

/// The slots `CLUSTER SLOTS` lists at `addr` (each slot counted once per range it is in).
fn slots_listed(addr: &str) -> Option<u32> {
    let client = redis::Client::open(format!("redis://{addr}")).ok()?;
    let mut con = client.get_connection().ok()?;
    let ranges: Vec<redis::Value> = redis::cmd("CLUSTER").arg("SLOTS").query(&mut con).ok()?;
    let mut total = 0;
    for r in ranges {
        let redis::Value::Array(r) = r else { return None };
        match (r.first(), r.get(1)) {
            (Some(redis::Value::Int(a)), Some(redis::Value::Int(b))) => total += (b - a + 1) as u32,
            _ => return None,
        }
    }
    Some(total)
}

/// Issue 60: on every node, `CLUSTER SLOTS` lists all 16384 slots at every moment of a slot
/// move (a slot handed over stays under its source until its target owns it), and
/// `CLUSTER INFO` says `ok` throughout: every sample, not most.
#[test]
fn every_slot_is_listed_on_every_node_through_a_slot_move() {
    let (_guards, nodes, resp) = groups_cluster("rc-cover", 3, 1);
    let addrs: Vec<&String> = resp.iter().map(|g| &g[0]).collect();
    let began = std::time::Instant::now();
    while !addrs
        .iter()
        .all(|a| raw(a, b"CLUSTER INFO\r\nQUIT\r\n").contains("cluster_state:ok"))
    {
        assert!(began.elapsed().as_secs() < 60, "the nodes never saw the whole cluster");
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    let mut mover = Command::new(env!("CARGO_BIN_EXE_kvd"))
        .args(["admin", "move-slots", "--nodes", &nodes, "--from", "0", "--to", "1"])
        .args(["--chunk", "8", "0-1023"])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let (mut samples, mut holes) = (0, Vec::new());
    let began = std::time::Instant::now();
    let status = loop {
        for a in &addrs {
            match slots_listed(a) {
                Some(16384) => {}
                other => holes.push((a.to_string(), other)),
            }
            if !raw(a, b"CLUSTER INFO\r\nQUIT\r\n").contains("cluster_state:ok") {
                holes.push((a.to_string(), Some(0)));
            }
            samples += 1;
        }
        if let Some(status) = mover.try_wait().unwrap() {
            break status;
        }
        assert!(began.elapsed().as_secs() < 180, "the move did not finish");
    };
    let mut err = String::new();
    std::io::Read::read_to_string(mover.stderr.as_mut().unwrap(), &mut err).unwrap();
    assert!(status.success(), "{err}");
    assert!(samples >= 6, "the move ended before it was sampled ({samples} samples)");
    assert!(
        holes.is_empty(),
        "{} of {samples} samples with a hole: {holes:?}",
        holes.len()
    );
    // Once every view is refreshed, the moved slots are listed under group 1 everywhere.
    let began = std::time::Instant::now();
    let moved = |a: &str| {
        let nodes = raw(a, b"CLUSTER NODES\r\nQUIT\r\n");
        nodes.lines().any(|l| l.contains(&resp[1][0]) && l.contains(" 0-1023"))
    };
    while !addrs.iter().all(|a| moved(a)) {
        assert!(began.elapsed().as_secs() < 30, "the move never showed");
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    // The epoch moved with the slots (Redis's config epoch: clients and tools compare it).
    for a in &addrs {
        let info = raw(a, b"CLUSTER INFO\r\nQUIT\r\n");
        let epoch: u32 = info
            .lines()
            .find_map(|l| l.strip_prefix("cluster_current_epoch:"))
            .and_then(|e| e.trim().parse().ok())
            .unwrap();
        assert!(epoch > 1, "{info}");
    }
}

/// Issue 60: a shard whose master stops answering (stopped here; an election in a replica
/// group) keeps its slots listed under it, flagged `fail`, on the other nodes: `CLUSTER
/// SLOTS` lists all 16384 slots and `CLUSTER INFO` says `ok` with the shard's slots as
/// `pfail` (before, they vanished from `CLUSTER SLOTS` until a master answered again).
#[test]
fn a_shard_whose_master_stops_answering_stays_listed_under_it() {
    let (guards, _nodes, resp) = groups_cluster("rc-stopped", 3, 1);
    let ok = |a: &str| raw(a, b"CLUSTER INFO\r\nQUIT\r\n").contains("cluster_state:ok");
    let began = std::time::Instant::now();
    while !(ok(&resp[0][0]) && ok(&resp[1][0])) {
        assert!(began.elapsed().as_secs() < 60, "the nodes never saw the whole cluster");
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    guards.procs[2].server.signal(libc::SIGSTOP);
    let seen_failed = |a: &str| {
        raw(a, b"CLUSTER NODES\r\nQUIT\r\n")
            .lines()
            .any(|l| l.contains(&resp[2][0]) && l.contains("master,fail"))
    };
    let began = std::time::Instant::now();
    while !(seen_failed(&resp[0][0]) && seen_failed(&resp[1][0])) {
        assert!(
            began.elapsed().as_secs() < 30,
            "the stopped master was never seen failed"
        );
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    for a in [&resp[0][0], &resp[1][0]] {
        assert_eq!(slots_listed(a), Some(16384), "at {a}");
        let info = raw(a, b"CLUSTER INFO\r\nQUIT\r\n");
        assert!(info.contains("cluster_state:ok\r\n"), "{info}");
        assert!(info.contains("cluster_slots_pfail:5461\r\n"), "{info}");
    }
    guards.procs[2].server.signal(libc::SIGCONT);
}
