//! Replica groups: three kvd processes on 127.0.0.1 ports serving one shard as a raft group
//! (`--group`), reached by one client through `--nodes "A|B|C"`. The leader is killed with
//! kill -9 under a recording load: a new leader serves, nothing acknowledged is lost, the
//! history is linearizable, and the killed member, restarted, catches up as a follower.
//! Members are added, handed the leadership and removed (`kvd admin`) under a recording load:
//! the history stays linearizable and a client that knows only the first members follows.

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{Kvd, free_port, kvd, start_at};
use kvshared::client::{ClientConfig, ClientError, Cluster, RecordConfig, Recording, record};
use kvshared::history::{CheckOptions, Verdict, check, render_timeline};

/// Three members started with `--group` (indexes 0-2), and `joiners` more started with
/// `--join` after them.
struct Group {
    /// Members started with `--group` (the first ones); the rest with `--join`.
    voters: usize,
    addrs: Vec<String>,
    dirs: Vec<std::path::PathBuf>,
    members: Vec<Option<Kvd>>,
}

impl Group {
    fn start(name: &str) -> Group {
        Group::start_with_joiners(name, 0)
    }

    fn start_with_joiners(name: &str, joiners: usize) -> Group {
        Group::start_shaped(name, 3, joiners)
    }

    fn start_shaped(name: &str, voters: usize, joiners: usize) -> Group {
        let n = voters + joiners;
        let addrs: Vec<String> = (0..n).map(|_| format!("127.0.0.1:{}", free_port())).collect();
        let dirs: Vec<_> = (0..n)
            .map(|i| std::env::temp_dir().join(format!("kvd-group-{name}-{}-{i}", std::process::id())))
            .collect();
        for d in &dirs {
            let _ = std::fs::remove_dir_all(d);
        }
        let mut g = Group {
            voters,
            addrs,
            dirs,
            members: (0..n).map(|_| None).collect(),
        };
        for i in 0..n {
            g.restart(i);
        }
        // A new group is started once, by one command, for all its first members.
        let init = kvd(&["admin", "init-group", "--nodes", &g.addrs[..voters].join("|")]);
        assert!(init.status.success(), "{}", String::from_utf8_lossy(&init.stderr));
        g
    }

    fn restart(&mut self, i: usize) {
        let group = self.addrs[..self.voters].join(",");
        let dir = self.dirs[i].display().to_string();
        let mut args = vec!["--shard", "0/1", "--data-dir", &dir];
        match i < self.voters {
            true => args.extend(["--group", &group]),
            false => args.push("--join"),
        }
        let (kvd, _) = start_at(&self.addrs[i], &args);
        self.members[i] = Some(kvd);
    }

    fn kill(&mut self, i: usize) {
        if let Some(mut m) = self.members[i].take() {
            m.0.kill().unwrap();
            m.0.wait().unwrap();
        }
    }

    /// The client of the first three members, as `--nodes "A|B|C"` gives it.
    fn client(&self) -> Cluster {
        Cluster::new(
            &[self.addrs[..3].join("|")],
            ClientConfig {
                request_timeout: Duration::from_secs(5),
                ..ClientConfig::default()
            },
        )
        .unwrap()
    }

    /// Each running member's (role, applied index), asked directly.
    async fn roles(&self) -> Vec<Option<(String, u64)>> {
        let mut out = Vec::new();
        for (i, addr) in self.addrs.iter().enumerate() {
            if self.members[i].is_none() {
                out.push(None);
                continue;
            }
            let one = Cluster::new(std::slice::from_ref(addr), ClientConfig::default()).unwrap();
            out.push(
                one.stats(0)
                    .await
                    .ok()
                    .map(|s| (s.group.role.as_str().to_string(), s.group.applied_index)),
            );
        }
        out
    }

    /// Waits until exactly one running member says it leads; returns it.
    async fn leader(&self) -> usize {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let roles = self.roles().await;
            let leaders: Vec<usize> = (0..roles.len())
                .filter(|&i| roles[i].as_ref().is_some_and(|(r, _)| r == "leader"))
                .collect();
            if leaders.len() == 1 {
                return leaders[0];
            }
            assert!(Instant::now() < deadline, "no single leader within 20 s: {roles:?}");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

impl Drop for Group {
    fn drop(&mut self) {
        for i in 0..self.members.len() {
            self.kill(i);
        }
        for d in &self.dirs {
            let _ = std::fs::remove_dir_all(d);
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_group_fails_over_loses_nothing_and_stays_linearizable() {
    let mut group = Group::start("failover");
    let client = Arc::new(group.client());
    for i in 0..100 {
        client
            .put(format!("k{i}").as_bytes(), format!("v{i}").as_bytes())
            .await
            .unwrap();
    }
    let leader = group.leader().await;
    let roles = group.roles().await;
    assert!(
        roles.iter().flatten().filter(|(r, _)| r == "follower").count() == 2,
        "{roles:?}"
    );

    // `kvd stats` lists every member with its role; JSON has a `role` per member.
    let stats = kvd(&["stats", "--nodes", &group.addrs.join("|"), "--json"]);
    let rows: serde_json::Value = serde_json::from_slice(&stats.stdout).unwrap();
    let rows = rows.as_array().unwrap();
    let leader_row = &rows[leader]["stats"];
    let (commit, applied) = (
        leader_row["commit_index"].as_u64(),
        leader_row["applied_index"].as_u64(),
    );
    assert!(commit >= applied && commit > Some(0), "{leader_row}");
    let rows: serde_json::Value = serde_json::from_slice(&stats.stdout).unwrap();
    let rows = rows.as_array().unwrap();
    assert_eq!(rows.len(), 3, "{rows:?}");
    let roles: Vec<&str> = rows.iter().map(|r| r["role"].as_str().unwrap()).collect();
    assert_eq!(roles.iter().filter(|r| **r == "leader").count(), 1, "{roles:?}");
    assert_eq!(roles.iter().filter(|r| **r == "follower").count(), 2, "{roles:?}");
    assert_eq!(rows[leader]["stats"]["role"], "leader");
    let lag = rows[leader]["stats"]["lag"].as_array().unwrap();
    assert_eq!(lag.len(), 2, "the leader reports each follower's lag: {lag:?}");
    assert!(rows[leader]["stats"]["elections"].as_u64().is_some());
    let text = kvd(&["stats", "--nodes", &group.addrs.join("|")]);
    let text = String::from_utf8_lossy(&text.stdout);
    assert!(
        text.contains("ROLE") && text.contains("leader") && text.contains("follower"),
        "{text}"
    );

    // A follower asked directly runs nothing and names the leader.
    let follower = (leader + 1) % 3;
    let direct = Cluster::new(std::slice::from_ref(&group.addrs[follower]), ClientConfig::default()).unwrap();
    // (Right after an election a follower may not know the leader yet: then it says so.)
    let deadline = Instant::now() + Duration::from_secs(5);
    // (A plain client follows the hint: send one batch and look at the answer itself.)
    let mut batch = kvshared::wire::BatchRequest::new();
    batch.push_put(b"x", b"y");
    loop {
        let answer = match direct.start_batch(0, &batch).await {
            Ok(flight) => direct.finish_batch(0, flight).await.map(|_| ()),
            Err(e) => Err(e),
        };
        match answer {
            Err(ClientError::NotLeader { leader: Some(l), .. }) => {
                assert_eq!(l, group.addrs[group.leader().await]);
                break;
            }
            Err(ClientError::NotLeader { leader: None, .. }) if Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(50)).await
            }
            other => panic!("a follower answered {other:?}"),
        }
    }

    // A recording load across a kill -9 of the leader.
    let recording = start_recording(&client, 6, 11);
    tokio::time::sleep(Duration::from_millis(1500)).await;
    group.kill(leader);
    let killed = Instant::now();
    // The first write after the kill that succeeds: the shard's unavailability.
    let first_write = loop {
        if client.put(b"after", b"kill").await.is_ok() {
            break killed.elapsed();
        }
        assert!(
            killed.elapsed() < Duration::from_secs(30),
            "no write succeeded within 30 s of the kill"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    eprintln!("first write {first_write:?} after the leader's kill -9");
    let recording = recording.await.unwrap();
    let ops = &recording.history.operations;
    let acked = ops
        .iter()
        .filter(|o| o.ret == kvshared::history::Return::Stored)
        .count();
    eprintln!(
        "{} ops recorded, {acked} puts acknowledged, {} unknown, refused {:?}",
        ops.len(),
        recording.unknown,
        recording.refused
    );
    assert!(acked > 50, "only {acked} puts acknowledged");
    assert_linearizable(&recording, "a leader kill");

    // Every acknowledged write before the kill is still there.
    for i in 0..100 {
        assert_eq!(
            client.get(format!("k{i}").as_bytes()).await.unwrap(),
            Some(format!("v{i}").into_bytes()),
            "k{i}"
        );
    }

    // The killed member comes back as a follower and catches up.
    group.restart(leader);
    let new_leader = group.leader().await;
    assert_ne!(
        new_leader, leader,
        "a restarted member does not take over a working group"
    );
    let target = group.roles().await[new_leader].as_ref().unwrap().1;
    let one = Cluster::new(std::slice::from_ref(&group.addrs[new_leader]), ClientConfig::default()).unwrap();
    let figures = one.stats(0).await.unwrap().group;
    assert!(figures.elections >= 1, "the new leader saw its election: {figures:?}");
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let roles = group.roles().await;
        if let Some((role, applied)) = &roles[leader]
            && role == "follower"
            && *applied >= target
        {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the restarted member did not catch up: {roles:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Six recording clients on five keys for `secs` seconds, in the background.
fn start_recording(client: &Arc<Cluster>, secs: u64, seed: u64) -> tokio::task::JoinHandle<Recording> {
    let client = client.clone();
    tokio::spawn(async move {
        let config = RecordConfig {
            clients: 6,
            keys: 5,
            duration: Duration::from_secs(secs),
            max_ops_per_client: 100_000,
            key_prefix: "lin-".into(),
            seed,
            ..RecordConfig::default()
        };
        record(client, &config).await
    })
}

/// Checks a recorded history; panics with the failing key's timeline if it is not
/// linearizable across `what`.
fn assert_linearizable(recording: &Recording, what: &str) {
    let report = check(&recording.history, &CheckOptions::default());
    match &report.verdict {
        Verdict::Linearizable => {}
        Verdict::NotLinearizable(f) => panic!("not linearizable across {what}:\n{}", render_timeline(f)),
        other => panic!("check undecided: {other:?}"),
    }
}

/// Runs `kvd admin ARGS` against the group and returns its standard output; panics with
/// its error when it fails.
fn admin(args: &[&str]) -> String {
    let out = kvd(&[&["admin"], args].concat());
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(
        out.status.success(),
        "kvd admin {args:?}: {text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    text
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn members_added_handed_the_lead_and_removed_under_load_stay_linearizable() {
    let mut group = Group::start_with_joiners("membership", 1);
    let client = Arc::new(group.client());
    for i in 0..200 {
        client
            .put(format!("k{i}").as_bytes(), format!("v{i}").as_bytes())
            .await
            .unwrap();
    }
    let first_leader = group.leader().await;
    let nodes = group.addrs[..3].join("|");
    let new = group.addrs[3].clone();
    let recording = start_recording(&client, 8, 5);
    tokio::time::sleep(Duration::from_millis(500)).await;

    // The new member catches up (the 200 keys) as a learner, then votes.
    let out = tokio::task::spawn_blocking({
        let (nodes, new) = (nodes.clone(), new.clone());
        move || admin(&["add-replica", "--nodes", &nodes, &new])
    })
    .await
    .unwrap();
    assert!(out.contains(&new) && out.contains("learners none"), "{out}");
    let one = Cluster::new(std::slice::from_ref(&new), ClientConfig::default()).unwrap();
    // (The new member learns the final membership with the leader's next append.)
    let deadline = Instant::now() + Duration::from_secs(10);
    let figures = loop {
        let figures = one.stats(0).await.unwrap();
        if figures.group.members.len() == 4 || Instant::now() > deadline {
            break figures;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(figures.group.members.len(), 4, "{:?}", figures.group);
    assert!(
        figures.keys >= 200,
        "the new member holds the data: {} keys",
        figures.keys
    );

    // The new member takes the lead, then the first leader leaves the group.
    let out = tokio::task::spawn_blocking({
        let (nodes, new) = (nodes.clone(), new.clone());
        move || admin(&["transfer-leader", "--nodes", &nodes, &new])
    })
    .await
    .unwrap();
    assert!(out.contains(&format!("leader {new}")), "{out}");
    // A member that stayed saw the lead change hands.
    let stayed = group.addrs[(first_leader + 1) % 3].clone();
    let one = Cluster::new(std::slice::from_ref(&stayed), ClientConfig::default()).unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while one.stats(0).await.unwrap().group.leader_changes == 0 {
        assert!(Instant::now() < deadline, "{stayed} counted no leader change");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let gone = group.addrs[first_leader].clone();
    let out = tokio::task::spawn_blocking({
        let (nodes, gone) = (nodes.clone(), gone.clone());
        move || admin(&["remove-replica", "--nodes", &nodes, &gone])
    })
    .await
    .unwrap();
    assert!(!out.contains(&gone) && out.contains(&new), "{out}");
    // (A member that stayed learns the new membership with the leader's next append.)
    let deadline = Instant::now() + Duration::from_secs(10);
    let voters = loop {
        let voters = one.stats(0).await.unwrap().group.members;
        if (voters.len() == 3 && !voters.contains(&gone)) || Instant::now() > deadline {
            break voters;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert!(voters.len() == 3 && !voters.contains(&gone), "{voters:?}");
    // (The removed member is not told: the final membership goes to the new members only.
    // Its operator stops it.)
    group.kill(first_leader);

    let recording = recording.await.unwrap();
    let ops = &recording.history.operations;
    eprintln!(
        "{} ops recorded across add, transfer and remove, {} unknown",
        ops.len(),
        recording.unknown
    );
    assert!(ops.len() > 1000, "only {} ops", ops.len());
    assert_linearizable(&recording, "membership changes");
    // The client that was told only of the first three members reaches the new leader, and
    // every write acknowledged before the changes is there.
    for i in 0..200 {
        assert_eq!(
            client.get(format!("k{i}").as_bytes()).await.unwrap(),
            Some(format!("v{i}").into_bytes()),
            "k{i}"
        );
    }
    assert!(client.members(0).contains(&new), "{:?}", client.members(0));
    // A member that is not a voter cannot be handed the lead; the error says why.
    let out = kvd(&["admin", "transfer-leader", "--nodes", &new, &gone]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("not a voter"), "{out:?}");
}

/// A group whose only member is its leader runs its reads at once: nobody else can have
/// served a write it has not applied, so no read-index round is needed (they waited for the
/// leader's apply to catch up). A member added to the group makes the leader's reads and the
/// member's ask for rounds again, and once it is removed they stop. (Reads across both
/// changes stay linearizable: `the_manager_adds_and_removes_a_read_replica_and_reads_stay_linearizable`.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_group_of_one_reads_without_rounds_until_a_member_joins() {
    let group = Group::start_shaped("alone", 1, 1);
    let (leader, spare) = (group.addrs[0].clone(), group.addrs[1].clone());
    let config = ClientConfig {
        request_timeout: Duration::from_secs(5),
        ..ClientConfig::default()
    };
    let client = Cluster::new(std::slice::from_ref(&leader), config.clone()).unwrap();
    for i in 0..100 {
        client
            .put(format!("k{i}").as_bytes(), format!("v{i}").as_bytes())
            .await
            .unwrap();
    }
    async fn rounds(at: &str) -> u64 {
        let one = Cluster::new(&[at.to_string()], ClientConfig::default()).unwrap();
        one.stats(0).await.unwrap().group.read_index_rounds
    }
    async fn read_all(c: &Cluster) {
        for i in 0..100 {
            let got = c.get(format!("k{i}").as_bytes()).await.unwrap();
            assert_eq!(got, Some(format!("v{i}").into_bytes()), "k{i}");
        }
    }
    read_all(&client).await;
    assert_eq!(rounds(&leader).await, 0, "a group of one ran read-index rounds");

    admin(&["add-replica", "--learner", "--nodes", &leader, &spare]);
    let both = Cluster::new(&[format!("{leader}|{spare}")], config).unwrap();
    read_all(&both).await;
    let with_member = rounds(&leader).await;
    assert!(with_member > 0, "reads with a learner in the group ran no round");

    admin(&["remove-replica", "--nodes", &leader, &spare]);
    let deadline = Instant::now() + Duration::from_secs(10);
    let one = Cluster::new(std::slice::from_ref(&leader), ClientConfig::default()).unwrap();
    while !one.stats(0).await.unwrap().group.learners.is_empty() {
        assert!(Instant::now() < deadline, "the learner was not removed");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let alone_again = rounds(&leader).await;
    read_all(&client).await;
    assert_eq!(rounds(&leader).await, alone_again, "rounds ran after the member left");
}

/// The shard manager, under a recording load whose reads spread over the group's members
/// (clients' default): a burst of reads makes the shard hot and the manager adds the spare
/// as a learner, which serves reads; when the burst ends the shard cools and the manager
/// removes it. The history across both changes is linearizable, and the leader keeps the
/// manager's reasons.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_manager_adds_and_removes_a_read_replica_and_reads_stay_linearizable() {
    let group = Group::start_shaped("manager", 1, 1);
    let (leader, spare) = (group.addrs[0].clone(), group.addrs[1].clone());
    let client = Arc::new(
        Cluster::new(
            std::slice::from_ref(&leader),
            ClientConfig {
                request_timeout: Duration::from_secs(5),
                ..ClientConfig::default()
            },
        )
        .unwrap(),
    );
    for i in 0..200 {
        client
            .put(format!("k{i}").as_bytes(), format!("v{i}").as_bytes())
            .await
            .unwrap();
    }
    let manager = std::process::Command::new(env!("CARGO_BIN_EXE_kvd"))
        .args([
            "manager",
            "--nodes",
            &leader,
            "--spare",
            &spare,
            "--interval",
            "500ms",
            "--hot-reads",
            "100000",
            "--cold-reads",
            "40000",
            "--up-after",
            "2",
            "--down-after",
            "3",
            "--settle",
            "1",
            "--duration",
            "16s",
            "--json",
        ])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut manager = Kvd::guard(manager);
    let decisions = {
        let mut stdout = manager.stdout.take().unwrap();
        std::thread::spawn(move || {
            let mut text = String::new();
            let _ = std::io::Read::read_to_string(&mut stdout, &mut text);
            text
        })
    };
    let recording = start_recording(&client, 14, 9);
    // The burst: many batches of reads for 5 s (bounded in time), spread like the
    // recording's reads.
    let burst = {
        let client = client.clone();
        tokio::spawn(async move {
            let keys: Vec<String> = (0..64).map(|i| format!("k{i}")).collect();
            let until = Instant::now() + Duration::from_secs(5);
            let mut tasks = tokio::task::JoinSet::new();
            for _ in 0..8 {
                let (client, keys) = (client.clone(), keys.clone());
                tasks.spawn(async move {
                    let ops: Vec<kvshared::client::Op<'_>> =
                        keys.iter().map(|k| kvshared::client::Op::Get(k.as_bytes())).collect();
                    let mut n = 0u64;
                    while Instant::now() < until {
                        n += client.batch(&ops).await.iter().filter(|r| r.is_ok()).count() as u64;
                    }
                    n
                });
            }
            let mut reads = 0;
            while let Some(n) = tasks.join_next().await {
                reads += n.unwrap_or(0);
            }
            reads
        })
    };
    let reads = burst.await.unwrap();
    let recording = recording.await.unwrap();
    let decisions = tokio::task::spawn_blocking(move || decisions.join().unwrap())
        .await
        .unwrap();
    drop(manager);
    eprintln!("{reads} reads in the burst; the manager said:\n{decisions}");
    let actions: Vec<String> = decisions
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .map(|v| {
            format!(
                "{} {}",
                v["action"].as_str().unwrap_or(""),
                v["member"].as_str().unwrap_or("")
            )
        })
        .collect();
    assert!(actions.contains(&format!("added {spare}")), "{actions:?}");
    assert!(actions.contains(&format!("removed {spare}")), "{actions:?}");
    assert!(!actions.iter().any(|a| a.starts_with("failed")), "{actions:?}");

    // The learner served reads while it was one.
    let one = Cluster::new(std::slice::from_ref(&spare), ClientConfig::default()).unwrap();
    let learner = one.stats(0).await.unwrap();
    assert!(learner.counts.gets > 0, "the learner served no reads");
    // The leader kept the manager's reasons.
    let figures = client.stats(0).await.unwrap().group;
    assert!(figures.learners.is_empty(), "{figures:?}");
    assert!(
        figures.changes.iter().any(|c| c.why.starts_with("shard manager: hot"))
            && figures.changes.iter().any(|c| c.why.starts_with("shard manager: cold")),
        "{:?}",
        figures.changes
    );
    let ops = &recording.history.operations;
    eprintln!(
        "{} ops recorded across the manager's add and remove, {} unknown",
        ops.len(),
        recording.unknown
    );
    assert!(ops.len() > 1000, "only {} ops", ops.len());
    assert_linearizable(&recording, "the manager's add and remove");
}

/// Follower reads over a plain connection to one follower: a linearizable read sees every
/// write acknowledged before it (the follower waits for the leader's read index), and a
/// bounded-stale one (`StaleReads` 300 ms) is answered from the follower's own store only
/// while it hears from its leader: with the leader frozen, it is refused ("not the
/// leader", nothing ran) rather than answered from a store that falls ever further behind.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_follower_reads_linearizably_or_within_its_stated_staleness() {
    use kvshared::frame::{FrameHeader, FrameKind};
    use kvshared::wire::{BatchRequest, OpReply, ReplyView};

    let group = Group::start("follower-reads");
    let client = Arc::new(group.client());
    client.put(b"k", b"v0").await.unwrap();
    let leader = group.leader().await;
    let follower = (leader + 1) % 3;
    let addr = group.addrs[follower].clone();
    let (mut s, mut get) = (std::net::TcpStream::connect(&addr).unwrap(), BatchRequest::new());
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    get.push_get(b"k");
    let read = |s: &mut std::net::TcpStream, id: u64| -> (FrameKind, Option<String>) {
        let (header, body) = common::exchange(s, &common::batch_frame(id, &get));
        let value =
            (header.kind == FrameKind::BatchResponse).then(|| match ReplyView::parse(&body).unwrap().result(0) {
                OpReply::Found(v) => String::from_utf8_lossy(v).into_owned(),
                other => format!("{other:?}"),
            });
        (header.kind, value)
    };
    // Every write acknowledged by the leader is seen by the next read on the follower.
    // (Under load a follower may refuse a read it cannot serve soon, "not the leader":
    // nothing ran, a client would ask elsewhere; it is asked again. Never a stale value.)
    // (Right after the group's first election a follower may still name a member that no
    // longer leads, for up to a heartbeat.)
    let deadline = Instant::now() + Duration::from_secs(10);
    for i in 1..=50u64 {
        let v = format!("v{i}");
        client.put(b"k", v.as_bytes()).await.unwrap();
        loop {
            match read(&mut s, i) {
                (FrameKind::NotLeader, _) if Instant::now() < deadline => {
                    tokio::time::sleep(Duration::from_millis(10)).await
                }
                answer => {
                    assert_eq!(answer, (FrameKind::BatchResponse, Some(v)), "read {i} on a follower");
                    break;
                }
            }
        }
    }
    // Bounded staleness: answered at once while the follower hears from the leader.
    let mut frame = FrameHeader {
        kind: FrameKind::StaleReads,
        len: 4,
        id: 100,
    }
    .encode()
    .to_vec();
    frame.extend_from_slice(&300u32.to_le_bytes());
    assert_eq!(common::exchange(&mut s, &frame).0.kind, FrameKind::ConfigOk);
    assert_eq!(read(&mut s, 101).0, FrameKind::BatchResponse);
    // A malformed StaleReads body is refused; the connection goes on.
    let bad = FrameHeader {
        kind: FrameKind::StaleReads,
        len: 2,
        id: 102,
    }
    .encode()
    .iter()
    .copied()
    .chain([1, 2])
    .collect::<Vec<u8>>();
    assert_eq!(common::exchange(&mut s, &bad).0.kind, FrameKind::ErrorResponse);
    // The leader freezes: past the bound the follower neither answers from its store nor
    // gets a read index, and says so.
    let pid = group.members[leader].as_ref().unwrap().id().to_string();
    assert!(
        std::process::Command::new("kill")
            .args(["-STOP", &pid])
            .status()
            .unwrap()
            .success()
    );
    tokio::time::sleep(Duration::from_millis(600)).await;
    let began = Instant::now();
    let (kind, value) = read(&mut s, 103);
    let _ = std::process::Command::new("kill").args(["-CONT", &pid]).status();
    assert_eq!(
        kind,
        FrameKind::NotLeader,
        "answered {value:?} {:?} after the leader froze",
        began.elapsed()
    );
}

/// Puts with times to live of 1-10 ms through a group's leader, reads served by the
/// leader: the history is linearizable with each value gone when its time ran out (the
/// checker's expiry ops), and times do run out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_group_s_history_with_times_to_live_stays_linearizable() {
    let group = Group::start("ttl-history");
    let client = Arc::new(group.client());
    let config = RecordConfig {
        clients: 4,
        // Few puts over many keys, so a key often outlives its time to live and the
        // frequent reads find it gone.
        keys: 64,
        duration: Duration::from_millis(1500),
        max_ops_per_client: 20_000,
        get_percent: 98,
        put_percent: 2,
        ttl_ms: Some((1, 10)),
        seed: 11,
        ..RecordConfig::default()
    };
    let recording = record(client, &config).await;
    assert_eq!(recording.refused_total(), 0, "{:?}", recording.refused);
    assert_linearizable(&recording, "times to live in a group");
    let expired = common::reads_after_expiry(&recording.history);
    assert!(expired > 100, "only {expired} reads found a key gone");
}

/// A member away while the group writes more log than a member keeps in memory (16 MiB)
/// catches up from entries the leader reads back from its segment files, and the leader's
/// log memory stays within its bound meanwhile (issue 32: bounded log memory).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_far_behind_catches_up_from_entries_read_back_from_disk() {
    const KEYS: usize = 160_000;
    const BATCH: usize = 2_000;
    let mut group = Group::start("behind");
    let client = group.client();
    client.put(b"first", b"1").await.unwrap();
    let leader = group.leader().await;
    let away = (leader + 1) % 3;
    group.kill(away);
    let value = vec![b'v'; 160];
    for start in (0..KEYS).step_by(BATCH) {
        let keys: Vec<String> = (start..start + BATCH).map(|i| format!("key{i}")).collect();
        let ops: Vec<_> = keys
            .iter()
            .map(|k| kvshared::client::Op::Put(k.as_bytes(), &value))
            .collect();
        for r in client.batch(&ops).await {
            r.unwrap();
        }
    }
    let leader_stats = |group: &Group| {
        let one = Cluster::new(std::slice::from_ref(&group.addrs[leader]), ClientConfig::default()).unwrap();
        async move { one.stats(0).await.unwrap() }
    };
    let at_leader = leader_stats(&group).await;
    let written = (KEYS * (value.len() + 10)) as u64;
    assert!(
        at_leader.durability.log_bytes > written && at_leader.durability.log_memory_bytes < 24 << 20,
        "{} of log on disk, {} in memory: not bounded",
        at_leader.durability.log_bytes,
        at_leader.durability.log_memory_bytes
    );

    group.restart(away);
    let one = Cluster::new(std::slice::from_ref(&group.addrs[away]), ClientConfig::default()).unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let s = one.stats(0).await;
        if s.as_ref()
            .is_ok_and(|s| s.group.applied_index >= at_leader.group.applied_index)
        {
            assert_eq!(s.unwrap().keys, KEYS as u64 + 1, "the member caught up with every key");
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the member did not catch up in 60 s: {:?}",
            s.map(|s| s.group)
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // It was sent entries, not a snapshot: none was taken (the log is below --snapshot-every).
    assert_eq!(leader_stats(&group).await.durability.snapshots_taken, 0);
}

/// Pre-votes (`kvd::durable::raft`'s `campaign`): while the leader lives no member would
/// vote, whatever log the asker has (the leader leads; the followers heard from it within
/// the lease); a follower paused past its election timeout and resumed does not depose the
/// leader (its pre-vote is refused, so no term begins); and once the leader is paused, the
/// followers elect one of themselves.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pre_votes_are_refused_while_the_leader_lives_and_a_paused_follower_does_not_depose_it() {
    use kvd::durable::network::{AdminReply, AdminRequest, Target, admin_call};
    let group = Group::start("pre-vote");
    let leader = group.leader().await;
    let one = |i: usize| Cluster::new(std::slice::from_ref(&group.addrs[i]), ClientConfig::default()).unwrap();
    let newest = Some(openraft::LogId::new(
        openraft::CommittedLeaderId::new(u64::MAX, 0),
        u64::MAX,
    ));
    for i in 0..3 {
        let who = match admin_call(&one(i), Target::ANY, AdminRequest::Identify).await.unwrap() {
            AdminReply::Identity(who) => who,
            other => panic!("member {i} answered {other:?}"),
        };
        let to = Target {
            group: who.group.unwrap(),
            member: who.member,
        };
        for last_log in [None, newest] {
            let ask = AdminRequest::PreVote {
                candidate: who.member,
                last_log,
            };
            let answer = admin_call(&one(i), to, ask).await.unwrap();
            assert_eq!(
                answer,
                AdminReply::PreVote(false),
                "member {i} (leader {leader}), log {last_log:?}"
            );
        }
    }
    let term = |s: kvshared::stats::NodeStats| s.group.term;
    let before = term(one(leader).stats(0).await.unwrap());
    let follower = (leader + 1) % 3;
    let signal = |i: usize, sig: &str| {
        let pid = group.members[i].as_ref().unwrap().id().to_string();
        assert!(
            std::process::Command::new("kill")
                .args([sig, &pid])
                .status()
                .unwrap()
                .success()
        );
    };
    signal(follower, "-STOP");
    tokio::time::sleep(Duration::from_millis(1500)).await;
    signal(follower, "-CONT");
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_eq!(group.leader().await, leader, "the resumed follower deposed the leader");
    assert_eq!(term(one(leader).stats(0).await.unwrap()), before, "a term began");
    // The leader pauses: one of the others is elected (pre-vote granted between them).
    signal(leader, "-STOP");
    let deadline = Instant::now() + Duration::from_secs(10);
    let elected = loop {
        let others = [(leader + 1) % 3, (leader + 2) % 3];
        let mut led = None;
        for i in others {
            if one(i).stats(0).await.is_ok_and(|s| s.group.role.as_str() == "leader") {
                led = Some(i);
            }
        }
        if led.is_some() || Instant::now() > deadline {
            break led;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    signal(leader, "-CONT");
    assert!(
        elected.is_some(),
        "no follower was elected within 10 s of the leader's pause"
    );
}
