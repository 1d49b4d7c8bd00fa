//! Replica groups: three kvd processes on 127.0.0.1 ports serving one shard as a raft group
//! (`--group`), reached by one client through `--nodes "A|B|C"`. The leader is killed with
//! kill -9 under a recording load: a new leader serves, nothing acknowledged is lost, the
//! history is linearizable, and the killed member, restarted, catches up as a follower.
//! Members are added, handed the leadership and removed (`kvd admin`) under a recording load:
//! the history stays linearizable and a client that knows only the first members follows.

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{HANG, Kvd, Recorder, TempDir, addr, kvd, start_at, temp_dir, until_async};
use kvshared::client::{ClientConfig, ClientError, Cluster, RecordConfig, Recording, record};
use kvshared::history::{CheckOptions, Verdict, check, render_timeline};

/// Three members started with `--group` (indexes 0-2), and `joiners` more started with
/// `--join` after them.
struct Group {
    /// Members started with `--group` (the first ones); the rest with `--join`.
    voters: usize,
    /// Flags every member is started with too.
    extra: Vec<String>,
    addrs: Vec<String>,
    members: Vec<Option<Kvd>>,
    /// Each member's data directory (removed when the group is dropped, after its members).
    dirs: Vec<TempDir>,
}

impl Group {
    fn start(name: &str) -> Group {
        Group::start_with_joiners(name, 0)
    }

    fn start_with_joiners(name: &str, joiners: usize) -> Group {
        Group::start_shaped(name, 3, joiners)
    }

    fn start_shaped(name: &str, voters: usize, joiners: usize) -> Group {
        Group::start_with(name, voters, joiners, &[])
    }

    fn start_with(name: &str, voters: usize, joiners: usize, extra: &[&str]) -> Group {
        let n = voters + joiners;
        let mut g = Group {
            voters,
            extra: extra.iter().map(ToString::to_string).collect(),
            addrs: (0..n).map(|_| addr()).collect(),
            members: (0..n).map(|_| None).collect(),
            dirs: (0..n).map(|i| temp_dir(&format!("group-{name}-{i}"))).collect(),
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
        let dir = self.dirs[i].path().display().to_string();
        let mut args = vec!["--shard", "0/1", "--data-dir", &dir];
        match i < self.voters {
            true => args.extend(["--group", &group]),
            false => args.push("--join"),
        }
        args.extend(self.extra.iter().map(String::as_str));
        let (kvd, _) = start_at(&self.addrs[i], &args);
        self.members[i] = Some(kvd);
    }

    fn kill(&mut self, i: usize) {
        if let Some(mut m) = self.members[i].take() {
            m.kill();
        }
    }

    /// Each running member's log, for a failure message.
    fn logs(&self) -> String {
        let mut out = String::new();
        for (addr, m) in self.addrs.iter().zip(&self.members) {
            if let Some(m) = m {
                out.push_str(&format!("--- {addr}:\n{}\n", m.log()));
            }
        }
        out
    }

    /// Sends `signal` (e.g. `libc::SIGSTOP`) to member `i`.
    fn signal(&self, i: usize, signal: i32) {
        self.members[i].as_ref().expect("a running member").signal(signal);
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

    /// A client of member `i` alone.
    fn one(&self, i: usize) -> Cluster {
        Cluster::new(std::slice::from_ref(&self.addrs[i]), ClientConfig::default()).unwrap()
    }

    /// Each running member's (role, applied index), asked directly.
    async fn roles(&self) -> Vec<Option<(String, u64)>> {
        let mut out = Vec::new();
        for (i, m) in self.members.iter().enumerate() {
            if m.is_none() {
                out.push(None);
                continue;
            }
            out.push(
                self.one(i)
                    .stats(0)
                    .await
                    .ok()
                    .map(|s| (s.group.role.as_str().to_string(), s.group.applied_index)),
            );
        }
        out
    }

    /// Waits until exactly one running member says it leads; returns it.
    async fn leader(&self) -> usize {
        until_async("a single leader", HANG, || async {
            let roles = self.roles().await;
            let leaders: Vec<usize> = (0..roles.len())
                .filter(|&i| roles[i].as_ref().is_some_and(|(r, _)| r == "leader"))
                .collect();
            match leaders[..] {
                [one] => Ok(one),
                _ => Err(roles),
            }
        })
        .await
    }

    /// Waits until member `i` has applied every entry the leader had committed when asked
    /// (so it has heard from the leader since).
    async fn caught_up(&self, i: usize) {
        let leader = self.leader().await;
        let target = self.one(leader).stats(0).await.unwrap().group.commit_index;
        until_async(&format!("member {i} to apply up to {target}"), HANG, || async {
            match self.one(i).stats(0).await {
                Ok(s) if s.group.applied_index >= target => Ok(()),
                other => Err(other.map(|s| s.group)),
            }
        })
        .await
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
    // (A plain client follows the hint: send one batch and look at the answer itself.)
    let mut batch = kvshared::wire::BatchRequest::new();
    batch.push_put(b"x", b"y");
    let named = until_async("a follower to name the leader", HANG, || async {
        let answer = match direct.start_batch(0, &batch).await {
            Ok(flight) => direct.finish_batch(0, flight).await.map(|_| ()),
            Err(e) => Err(e),
        };
        match answer {
            Err(ClientError::NotLeader { leader: Some(l), .. }) => Ok(l),
            Err(ClientError::NotLeader { leader: None, .. }) => Err("no leader known yet".to_string()),
            other => panic!("a follower answered {other:?}"),
        }
    })
    .await;
    assert_eq!(named, group.addrs[group.leader().await]);

    // A recording load across a kill -9 of the leader: ops before it, then ops after it.
    let recorder = start_recording(&client, 11);
    recorder.more(300).await;
    group.kill(leader);
    let killed = Instant::now();
    // The first write after the kill that succeeds: the shard's unavailability.
    until_async("a write to succeed after the kill", HANG, || {
        client.put(b"after", b"kill")
    })
    .await;
    eprintln!("first write {:?} after the leader's kill -9", killed.elapsed());
    recorder.more(300).await;
    let recording = recorder.finish().await;
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
    let figures = group.one(new_leader).stats(0).await.unwrap().group;
    assert!(figures.elections >= 1, "the new leader saw its election: {figures:?}");
    until_async("the restarted member to catch up as a follower", HANG, || async {
        let roles = group.roles().await;
        match &roles[leader] {
            Some((role, applied)) if role == "follower" && *applied >= target => Ok(()),
            _ => Err(roles),
        }
    })
    .await;
}

/// Six recording clients on five keys in the background, until the test ends them.
fn start_recording(client: &Arc<Cluster>, seed: u64) -> Recorder {
    let config = RecordConfig {
        clients: 6,
        keys: 5,
        duration: HANG,
        max_ops_per_client: 1_000_000,
        key_prefix: "lin-".into(),
        seed,
        ..RecordConfig::default()
    };
    Recorder::start(client, config)
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
    // `--timeout` bounds how long a verb waits for a leader: here only a hang.
    let out = kvd(&[&["admin"], args, &["--timeout", "60s"]].concat());
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
    let recorder = start_recording(&client, 5);
    recorder.more(300).await;

    // The new member catches up (the 200 keys) as a learner, then votes.
    let out = tokio::task::spawn_blocking({
        let (nodes, new) = (nodes.clone(), new.clone());
        move || admin(&["add-replica", "--nodes", &nodes, &new])
    })
    .await
    .unwrap();
    assert!(out.contains(&new) && out.contains("learners none"), "{out}");
    let one = group.one(3);
    // (The new member learns the final membership with the leader's next append.)
    let figures = until_async("the new member to learn it is one of 4", HANG, || async {
        match one.stats(0).await {
            Ok(f) if f.group.members.len() == 4 => Ok(f),
            other => Err(other.map(|f| f.group)),
        }
    })
    .await;
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
    let one = group.one((first_leader + 1) % 3);
    until_async(&format!("{stayed} to count a leader change"), HANG, || async {
        match one.stats(0).await {
            Ok(f) if f.group.leader_changes > 0 => Ok(()),
            other => Err(other.map(|f| f.group)),
        }
    })
    .await;
    let gone = group.addrs[first_leader].clone();
    let out = tokio::task::spawn_blocking({
        let (nodes, gone) = (nodes.clone(), gone.clone());
        move || admin(&["remove-replica", "--nodes", &nodes, &gone])
    })
    .await
    .unwrap();
    assert!(!out.contains(&gone) && out.contains(&new), "{out}");
    // (A member that stayed learns the new membership with the leader's next append.)
    until_async("a member that stayed to learn the 3 voters left", HANG, || async {
        match one.stats(0).await.map(|f| f.group.members) {
            Ok(voters) if voters.len() == 3 && !voters.contains(&gone) => Ok(()),
            other => Err(other),
        }
    })
    .await;
    // (The removed member is not told: the final membership goes to the new members only.
    // Its operator stops it.)
    group.kill(first_leader);

    // Ops after every change, and at least 1,000 in all.
    recorder.more(300).await;
    recorder.more(1001u64.saturating_sub(recorder.recorded())).await;
    let recording = recorder.finish().await;
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

/// `kvd admin restart-check ADDR` with `extra` flags: its exit code and what it printed.
fn restart_check(nodes: &str, addr: &str, extra: &[&str]) -> (i32, String) {
    let out = kvd(&[&["admin", "restart-check", "--nodes", nodes], extra, &[addr]].concat());
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.code().unwrap_or(-1), text)
}

/// A rolling restart (docs/UPGRADING.md) under a recording load: member by member, the lead
/// moved off first, `restart-check --wait` before each stop (SIGTERM) and after each start. No op
/// fails or ends unknown, nothing acknowledged is lost, and the history is linearizable.
/// `restart-check` refuses the leader and, while one member is down, every other voter.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rolling_restart_under_load_fails_no_op_and_stays_linearizable() {
    let mut group = Group::start("rolling");
    let client = Arc::new(group.client());
    for i in 0..200 {
        let (k, v) = (format!("k{i}"), format!("v{i}"));
        client.put(k.as_bytes(), v.as_bytes()).await.unwrap();
    }
    let nodes = group.addrs[..3].join("|");
    let recorder = start_recording(&client, 11);
    recorder.more(200).await;
    let mut stopped_logs = String::new();
    for i in 0..3 {
        let me = group.addrs[i].clone();
        let leader = group.leader().await;
        if leader == i {
            let (code, text) = restart_check(&nodes, &me, &[]);
            assert_eq!(code, 1, "the leader may not be stopped: {text}");
            assert!(
                text.contains("leads the group") && text.contains("transfer-leader"),
                "{text}"
            );
            let next = group.addrs[(i + 1) % 3].clone();
            let (n, m) = (nodes.clone(), next.clone());
            tokio::task::spawn_blocking(move || admin(&["transfer-leader", "--nodes", &n, &m]))
                .await
                .unwrap();
        }
        let (n, m) = (nodes.clone(), me.clone());
        let (code, text) = tokio::task::spawn_blocking(move || restart_check(&n, &m, &["--wait", "--timeout", "120s"]))
            .await
            .unwrap();
        assert_eq!(code, 0, "{me} may be stopped once the lead moved: {text}");
        // Stopped as an operator stops it: SIGTERM, which answers what it took in and
        // sends the rest elsewhere.
        group.signal(i, libc::SIGTERM);
        let mut stopped = group.members[i].take().unwrap();
        let log = tokio::task::spawn_blocking(move || {
            stopped.wait_exit(HANG);
            stopped.log()
        })
        .await
        .unwrap();
        stopped_logs.push_str(&format!("--- {me} until it stopped:\n{log}\n"));
        // While it is down, stopping another voter would leave no majority.
        let leader = group.leader().await;
        let other = (0..3).find(|&j| j != i && j != leader).unwrap();
        let (code, text) = restart_check(&nodes, &group.addrs[other], &[]);
        assert_eq!(
            code, 1,
            "with {me} down, {} may not be stopped: {text}",
            group.addrs[other]
        );
        assert!(text.contains("a majority needs 2"), "{text}");
        recorder.more(100).await;
        group.restart(i);
        let (n, m) = (nodes.clone(), me.clone());
        let (code, text) = tokio::task::spawn_blocking(move || restart_check(&n, &m, &["--wait", "--timeout", "120s"]))
            .await
            .unwrap();
        assert_eq!(code, 0, "{me} caught up after its restart: {text}");
        recorder.more(100).await;
    }
    let recording = recorder.finish().await;
    eprintln!(
        "{} ops recorded across a rolling restart, {} unknown, {} refused",
        recording.history.operations.len(),
        recording.unknown,
        recording.refused_total()
    );
    assert_eq!(
        recording.refused_total(),
        0,
        "ops failed: {:?}\nmembers {:?}\n{stopped_logs}{}",
        recording.refused,
        group.addrs,
        group.logs()
    );
    assert_eq!(recording.unknown, 0, "ops ended unknown");
    assert_linearizable(&recording, "a rolling restart");
    for i in 0..200 {
        let got = client.get(format!("k{i}").as_bytes()).await.unwrap();
        assert_eq!(got, Some(format!("v{i}").into_bytes()), "k{i}");
    }
}

/// Big values (issue 58): with one member down, six values of 20 MiB (a third of the default
/// `--max-frame` each) are written, and a blank member is added: it catches up (each append
/// within the frame limit, the older entries by snapshot) and the group keeps its leader.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_added_after_big_values_catches_up_and_the_group_keeps_a_leader() {
    let mut group = Group::start_with_joiners("big-values", 1);
    let client = Arc::new(group.client());
    let leader = group.leader().await;
    group.kill((leader + 1) % 3);
    let value = |i: usize| vec![b'a' + i as u8; 20 << 20];
    for i in 0..6 {
        if let Err(e) = client.put(format!("big{i}").as_bytes(), &value(i)).await {
            panic!("big{i}: {e}\n{}", group.logs());
        }
    }
    let nodes = group.addrs[..3].join("|");
    let new = group.addrs[3].clone();
    let (n, m) = (nodes.clone(), new.clone());
    let out =
        tokio::task::spawn_blocking(move || kvd(&["admin", "add-replica", "--nodes", &n, &m, "--timeout", "120s"]))
            .await
            .unwrap();
    if !out.status.success() {
        panic!(
            "add-replica: {}\n{}",
            String::from_utf8_lossy(&out.stderr),
            group.logs()
        );
    }
    group.leader().await;
    let one = group.one(3);
    until_async("the new member to hold the six big values", HANG, || async {
        match one.stats(0).await {
            Ok(f) if f.keys >= 6 => Ok(()),
            other => Err(other.map(|f| (f.keys, f.group.applied_index))),
        }
    })
    .await;
    for i in 0..6 {
        let got = client.get(format!("big{i}").as_bytes()).await.unwrap();
        assert!(got.as_deref() == Some(&value(i)[..]), "big{i}");
    }
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
    let one = group.one(0);
    until_async("the learner to be removed", HANG, || async {
        match one.stats(0).await.map(|s| s.group.learners) {
            Ok(l) if l.is_empty() => Ok(()),
            other => Err(other),
        }
    })
    .await;
    let alone_again = rounds(&leader).await;
    read_all(&client).await;
    assert_eq!(rounds(&leader).await, alone_again, "rounds ran after the member left");
}

/// The shard manager, under a recording load whose reads spread over the group's members
/// (clients' default): a burst of reads makes the shard hot and the manager adds the spare
/// as a learner, which serves reads; when the burst ends the shard cools and the manager
/// removes it. The history across both changes is linearizable, and the leader keeps the
/// manager's reasons. The hot and cold thresholds come from what this machine did: the
/// recording's read rate alone and with the burst, measured first.
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
    let recorder = start_recording(&client, 9);
    recorder.more(300).await;
    let alone = reads_per_sec(&group.one(0)).await;
    let burst = Burst::start(&client);
    let with_burst = reads_per_sec(&group.one(0)).await;
    eprintln!("reads/s: {alone:.0} with the recording alone, {with_burst:.0} with the burst");
    assert!(
        with_burst > 4.0 * alone,
        "the burst ({with_burst:.0} reads/s) did not outpace the recording ({alone:.0}) on this machine"
    );
    // Hot with the burst (even once a learner takes half), cold without it.
    let (hot, cold) = (with_burst / 2.0, 2.0 * alone);
    let manager = std::process::Command::new(env!("CARGO_BIN_EXE_kvd"))
        .args(["manager", "--nodes", &leader, "--spare", &spare, "--interval", "500ms"])
        .args([
            "--hot-reads",
            &format!("{hot:.0}"),
            "--cold-reads",
            &format!("{cold:.0}"),
        ])
        .args([
            "--hot-p99",
            "1h",
            "--up-after",
            "2",
            "--down-after",
            "3",
            "--settle",
            "1",
            "--json",
        ])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut manager = common::Guard(manager);
    let decisions = common::Decisions::read(manager.stdout.take().unwrap());
    decisions.wait_for(&format!("added {spare}")).await;
    let reads = burst.stop().await;
    decisions.wait_for(&format!("removed {spare}")).await;
    drop(manager);
    recorder.more(300).await;
    let recording = recorder.finish().await;
    let actions = decisions.actions();
    eprintln!("{reads} reads in the burst; the manager did: {actions:?}");
    assert!(!actions.iter().any(|a| a.starts_with("failed")), "{actions:?}");

    // The learner served reads while it was one.
    let learner = group.one(1).stats(0).await.unwrap();
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

/// A node's gets per second, from its counters over a window of about 1.5 s.
async fn reads_per_sec(node: &Cluster) -> f64 {
    let (g0, t0) = (node.stats(0).await.unwrap().counts.gets, Instant::now());
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let g1 = node.stats(0).await.unwrap().counts.gets;
    (g1 - g0) as f64 / t0.elapsed().as_secs_f64()
}

/// Batches of reads from eight tasks, spread like the recording's reads, until stopped
/// (bounded by [`HANG`]).
struct Burst {
    stop: Arc<std::sync::atomic::AtomicBool>,
    tasks: tokio::task::JoinSet<u64>,
}

impl Burst {
    fn start(client: &Arc<Cluster>) -> Burst {
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let mut tasks = tokio::task::JoinSet::new();
        let until = Instant::now() + HANG;
        for _ in 0..8 {
            let (client, stop) = (client.clone(), stop.clone());
            tasks.spawn(async move {
                let keys: Vec<String> = (0..64).map(|i| format!("k{i}")).collect();
                let ops: Vec<kvshared::client::Op<'_>> =
                    keys.iter().map(|k| kvshared::client::Op::Get(k.as_bytes())).collect();
                let mut n = 0u64;
                while !stop.load(std::sync::atomic::Ordering::Relaxed) && Instant::now() < until {
                    n += client.batch(&ops).await.iter().filter(|r| r.is_ok()).count() as u64;
                }
                n
            });
        }
        Burst { stop, tasks }
    }

    /// Ends the burst; returns the reads it made.
    async fn stop(mut self) -> u64 {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        let mut reads = 0;
        while let Some(n) = self.tasks.join_next().await {
            reads += n.unwrap_or(0);
        }
        reads
    }
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
    for i in 1..=50u64 {
        let v = format!("v{i}");
        client.put(b"k", v.as_bytes()).await.unwrap();
        let answer = until_async(&format!("read {i} to be served on the follower"), HANG, || {
            let answer = read(&mut s, i);
            async move {
                match answer {
                    (FrameKind::NotLeader, _) => Err(answer),
                    _ => Ok(answer),
                }
            }
        })
        .await;
        assert_eq!(answer, (FrameKind::BatchResponse, Some(v)), "read {i} on a follower");
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
    // (The bound is time itself: the follower must not have heard from its leader for
    // twice the bound.)
    group.signal(leader, libc::SIGSTOP);
    tokio::time::sleep(Duration::from_millis(600)).await;
    let began = Instant::now();
    let (kind, value) = read(&mut s, 103);
    group.signal(leader, libc::SIGCONT);
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
        duration: HANG,
        max_ops_per_client: 2_500,
        get_percent: 98,
        put_percent: 2,
        ttl_ms: Some((1, 10)),
        seed: 11,
        ..RecordConfig::default()
    };
    let recording = record(client, &config).await;
    assert_eq!(recording.refused_total(), 0, "{:?}", recording.refused);
    assert_eq!(recording.history.operations.len(), 10_000);
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
        let one = group.one(leader);
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
    let one = group.one(away);
    // Caught up: every key, at the index the leader had applied (or later). (The index
    // alone is not enough: on a busy machine the lead can move during the writes, and the
    // member asked above may then be a follower a little behind the group.)
    let caught_up = until_async("the member to catch up", HANG, || async {
        match one.stats(0).await {
            Ok(s) if s.group.applied_index >= at_leader.group.applied_index && s.keys == KEYS as u64 + 1 => Ok(s),
            other => Err(other.map(|s| (s.keys, s.group))),
        }
    })
    .await;
    assert_eq!(caught_up.keys, KEYS as u64 + 1, "the member caught up with every key");
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
    use kvshared::admin::{AdminReply, AdminRequest, LogPosition, Target, call as admin_call};
    let group = Group::start("pre-vote");
    let leader = group.leader().await;
    let one = |i: usize| group.one(i);
    let newest = Some(LogPosition {
        term: u64::MAX,
        leader: 0,
        index: u64::MAX,
    });
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
    // Paused for five times the election timeout's maximum: its timer has run out when it
    // resumes, so it asks for pre-votes at once, and is refused.
    group.signal(follower, libc::SIGSTOP);
    tokio::time::sleep(Duration::from_millis(1500)).await;
    group.signal(follower, libc::SIGCONT);
    // Once it has heard from the leader again (applied a write made after it resumed) it
    // would not campaign for another lease: whatever it did on resuming is done.
    group.client().put(b"after-resume", b"1").await.unwrap();
    group.caught_up(follower).await;
    assert_eq!(group.leader().await, leader, "the resumed follower deposed the leader");
    assert_eq!(term(one(leader).stats(0).await.unwrap()), before, "a term began");
    // The leader pauses: one of the others is elected (pre-vote granted between them).
    group.signal(leader, libc::SIGSTOP);
    let others = [(leader + 1) % 3, (leader + 2) % 3];
    until_async("a follower to be elected after the leader's pause", HANG, || async {
        for i in others {
            if one(i).stats(0).await.is_ok_and(|s| s.group.role.as_str() == "leader") {
                return Ok(i);
            }
        }
        Err("no leader among the others yet")
    })
    .await;
    group.signal(leader, libc::SIGCONT);
}

/// Big values in faults (issue 58): members with `--max-frame 4mib` and `--snapshot-every
/// 8mib`, values of 1 MiB (a quarter of the frame), 40 MiB written while a follower is away
/// (more than one snapshot interval). The follower comes back and catches up; the leader is
/// then killed and the group elects another; a wiped member added back is sent a snapshot
/// of 40 MiB and more, and the leader is killed during that install: the group elects a
/// leader again each time, and every acknowledged value reads back whole.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn big_values_survive_a_member_far_behind_and_a_leader_killed_during_an_install() {
    const MIB: usize = 1 << 20;
    let mut group = Group::start_with("big-faults", 3, 1, &["--max-frame", "4mib", "--snapshot-every", "8mib"]);
    let client = Arc::new(group.client());
    let value = |i: usize| vec![b'a' + (i % 26) as u8; MIB];
    let put_all = |from: usize, to: usize| {
        let client = client.clone();
        async move {
            for i in from..to {
                client.put(format!("big{i}").as_bytes(), &value(i)).await.unwrap();
            }
        }
    };
    put_all(0, 8).await;
    // A follower away while 40 MiB are written, then back; then the leader killed.
    let leader = group.leader().await;
    let away = (leader + 1) % 3;
    group.kill(away);
    put_all(8, 48).await;
    group.restart(away);
    group.caught_up(away).await;
    group.kill(leader);
    let second = group.leader().await;
    assert_ne!(second, leader);
    put_all(48, 52).await;
    // The old leader back; then the fourth member (blank) added, and the leader killed while
    // it installs the snapshot.
    group.restart(leader);
    group.caught_up(leader).await;
    let (n, m) = (group.addrs[..3].join("|"), group.addrs[3].clone());
    let adding = tokio::task::spawn_blocking(move || {
        kvd(&[
            "admin",
            "add-replica",
            "--learner",
            "--nodes",
            &n,
            &m,
            "--timeout",
            "60s",
        ])
    });
    let one = group.one(3);
    until_async("the new member to be sent the log or a snapshot", HANG, || async {
        match one.stats(0).await {
            Ok(s) if s.group.role == kvshared::stats::GroupRole::Learner || s.keys > 0 => Ok(()),
            other => Err(other.map(|s| (s.group.role, s.keys))),
        }
    })
    .await;
    group.kill(second);
    let third = group.leader().await;
    assert_ne!(third, second);
    let _ = adding.await;
    put_all(52, 56).await;
    for i in 0..56 {
        let got = client.get(format!("big{i}").as_bytes()).await.unwrap();
        assert!(
            got.as_deref() == Some(&value(i)[..]),
            "big{i}: {:?} bytes",
            got.map(|v| v.len())
        );
    }
}

/// Issue 58, finding 1, as the probe did it: three members at the default `--max-frame`
/// (64 MiB); a follower killed and its data directory deleted; six values of 20 MiB written
/// (each acknowledged); the wiped member started with `--join` and added back. It catches up
/// (appends of 20 MiB, over openraft's 75 ms per append, go once on a lane of their own while
/// heartbeats keep the group led), the leader never stops its raft, and every value reads
/// back whole from the added member's group with the old leader gone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wiped_member_added_back_after_values_of_20_mib_catches_up_and_the_group_stays_led() {
    const MIB: usize = 1 << 20;
    let mut group = Group::start_with("wiped-big", 3, 0, &[]);
    let client = Arc::new(group.client());
    // Bytes that do not compress, so that a snapshot carries them whole too.
    let value = |i: usize| {
        let mut x = 0x9E37_79B9_7F4A_7C15u64 ^ i as u64;
        (0..20 * MIB)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                x as u8
            })
            .collect::<Vec<u8>>()
    };
    client.put(b"small", b"x").await.unwrap();
    let leader = group.leader().await;
    let wiped = (leader + 1) % 3;
    group.kill(wiped);
    std::fs::remove_dir_all(group.dirs[wiped].path()).unwrap();
    for i in 0..6 {
        let put = client.put(format!("big{i}").as_bytes(), &value(i)).await;
        assert!(put.is_ok(), "SET {i} of 20 MiB: {put:?}\n{}", group.logs());
    }
    group.restart(wiped);
    let (nodes, member) = (group.addrs.join("|"), group.addrs[wiped].clone());
    let add = tokio::task::spawn_blocking(move || {
        kvd(&["admin", "add-replica", "--nodes", &nodes, &member, "--timeout", "120s"])
    })
    .await
    .unwrap();
    let said = String::from_utf8_lossy(&add.stderr);
    assert!(add.status.success(), "{said}\n{}", group.logs());
    group.caught_up(wiped).await;
    let logs = group.logs();
    assert!(!logs.contains("RaftCore"), "a member's raft stopped:\n{logs}");
    // Each big entry was sent once (catch-ups that timed out were once sent again and again).
    let pid = group.members[wiped].as_ref().unwrap().pid();
    let io = std::fs::read_to_string(format!("/proc/{pid}/io")).unwrap();
    let read: u64 = io
        .lines()
        .find_map(|l| l.strip_prefix("rchar: "))
        .and_then(|n| n.trim().parse().ok())
        .unwrap();
    eprintln!("the added member read {} MiB to catch up on 120 MiB", read >> 20);
    assert!(
        read < 240 * MIB as u64,
        "{} MiB read: big appends were sent again and again",
        read >> 20
    );
    let old = group.leader().await;
    group.kill(old);
    for i in 0..6 {
        let got = client.get(format!("big{i}").as_bytes()).await.unwrap();
        assert!(
            got.as_deref() == Some(&value(i)[..]),
            "big{i}: {:?} bytes",
            got.map(|v| v.len())
        );
    }
}
