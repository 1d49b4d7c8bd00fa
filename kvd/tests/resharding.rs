//! Slots move between durable replica groups while a recorded load runs, with the source's
//! and the target's leaders killed (kill -9) or paused (SIGSTOP) in the middle of moves: the
//! history stays linearizable, every interrupted move is finished by running it again, and
//! every slot ends with exactly one owner.

mod common;

use std::io::{BufRead, BufReader};
use std::process::{Child, ChildStderr, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{HANG, Recorder, groups_cluster, kvd, raw, until};
use kvshared::client::{ClientConfig, Cluster, RecordConfig};
use kvshared::history::{CheckOptions, Verdict, check, render_timeline};
use kvshared::routing::key_slot;

/// Records `clients` clients' ops on the keys `rs-*` until the test ends the recording.
fn start_recording(rt: &tokio::runtime::Runtime, client: &Arc<Cluster>, clients: usize) -> Recorder {
    let config = RecordConfig {
        clients,
        keys: KEYS,
        key_prefix: "rs-".into(),
        duration: HANG,
        max_ops_per_client: 1_000_000,
        ..RecordConfig::default()
    };
    let _in = rt.enter();
    Recorder::start(client, config)
}

/// `groups` in-memory groups on loopback splitting the slots evenly, and one more started
/// with `--no-slots`: the guards, the addresses and the `--nodes` list.
fn with_empty_group(groups: usize) -> (common::Nodes, Vec<String>, String) {
    with_empty_group_in(groups, None, &[])
}

/// As [`with_empty_group`]; with `durable`, each group is a durable group of one member
/// (`--data-dir` under the temporary directory, named by `durable`, and `--group`), as the
/// hot-spot bench runs them: its changes go through the log. The empty group is started with
/// `empty` too.
fn with_empty_group_in(groups: usize, durable: Option<&str>, empty: &[&str]) -> (common::Nodes, Vec<String>, String) {
    let addrs: Vec<String> = (0..=groups).map(|_| common::addr()).collect();
    let mut guards = common::Nodes {
        procs: Vec::new(),
        dirs: Vec::new(),
    };
    for (i, addr) in addrs.iter().enumerate() {
        let shard = match i < groups {
            true => format!("{i}/{groups}"),
            false => format!("{groups}/{}", groups + 1),
        };
        let mut args = vec!["--shard".to_string(), shard];
        if i == groups {
            args.push("--no-slots".into());
            args.extend(empty.iter().map(ToString::to_string));
        }
        if let Some(name) = durable {
            let dir = common::temp_dir(&format!("{name}-{i}"));
            args.extend([
                "--data-dir".into(),
                dir.path().display().to_string(),
                "--group".into(),
                addr.clone(),
            ]);
            guards.dirs.push(dir);
        }
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        guards.push(common::start_at(addr, &args).0);
        if durable.is_some() {
            let init = kvd(&["admin", "init-group", "--nodes", addr]);
            assert!(init.status.success(), "{}", String::from_utf8_lossy(&init.stderr));
        }
    }
    let nodes = addrs.join(",");
    (guards, addrs, nodes)
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

/// The recording's keys: `rs-0` ... `rs-39`.
const KEYS: usize = 40;

/// Which member of group `g` leads (by `INFO replication` on its RESP port).
fn leader(resp: &[Vec<String>], g: usize, alive: &[bool]) -> usize {
    until(&format!("group {g} to have a leader"), HANG, || {
        (0..resp[g].len())
            .filter(|&m| alive[g * 3 + m])
            .find(|&m| raw(&resp[g][m], b"INFO replication\r\nQUIT\r\n").contains("role:master"))
            .ok_or("none yet")
    })
}

/// Runs `kvd admin move-slots` until it succeeds (at most 4 runs): a run that met a killed
/// leader may fail, and the next one finishes the move.
fn move_slots(
    nodes: &str,
    from: usize,
    to: usize,
    slots: &str,
    during: impl FnOnce(&mut Child, &mut Progress),
) -> usize {
    let (from, to) = (from.to_string(), to.to_string());
    let args = [
        "admin",
        "move-slots",
        "--nodes",
        nodes,
        "--from",
        &from,
        "--to",
        &to,
        "--chunk",
        "100",
        slots,
    ];
    let mut first = Command::new(env!("CARGO_BIN_EXE_kvd"))
        .args(args)
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut progress = BufReader::new(first.stderr.take().unwrap()).lines();
    during(&mut first, &mut progress);
    let drain = std::thread::spawn(move || progress.map_while(Result::ok).for_each(|l| eprintln!("{l}")));
    let mut runs = 1;
    let mut ok = first.wait().unwrap().success();
    let _ = drain.join();
    while !ok {
        assert!(runs < 4, "move-slots {from} -> {to} did not finish in {runs} runs");
        let out = kvd(&args);
        let said = String::from_utf8_lossy(&out.stderr);
        eprintln!("rerun: {said}");
        // The run before handed every slot over, then failed: nothing is left to move.
        ok = out.status.success() || (out.status.code() == Some(1) && said.contains(&format!("group {to}'s already")));
        runs += 1;
    }
    runs
}

/// One run of `kvd admin move-slots`, waited for.
fn move_once(nodes: &str, from: &str, to: &str, chunk: &str, slots: &str) -> std::process::Output {
    kvd(&[
        "admin",
        "move-slots",
        "--nodes",
        nodes,
        "--from",
        from,
        "--to",
        to,
        "--chunk",
        chunk,
        slots,
    ])
}

/// The lines a running `move-slots` writes to its standard error.
type Progress = std::io::Lines<BufReader<ChildStderr>>;

/// Reads (and shows) `progress` until `chunks` more chunks have moved.
fn wait_for_chunks(progress: &mut Progress, chunks: usize) {
    let mut seen = 0;
    while seen < chunks {
        let Some(Ok(line)) = progress.next() else { return };
        eprintln!("{line}");
        seen += usize::from(line.contains("slots moved"));
    }
}

fn signal(pid: u32, sig: &str) {
    let _ = Command::new("kill")
        .args([&format!("-{sig}"), &pid.to_string()])
        .status();
}

/// 1,000 slots: those of half the recording's keys, and slots from 0 up to make the count.
fn slots_to_move() -> String {
    let mut slots: Vec<u16> = (0..KEYS / 2).map(|i| key_slot(format!("rs-{i}").as_bytes())).collect();
    let mut fill = 0u16;
    slots.sort_unstable();
    slots.dedup();
    while slots.len() < 1000 {
        if !slots.contains(&fill) {
            slots.push(fill);
        }
        fill += 1;
    }
    slots.sort_unstable();
    let parts: Vec<String> = slots.iter().map(u16::to_string).collect();
    parts.join(",")
}

#[test]
fn slots_move_back_and_forth_under_load_and_leader_faults() {
    let (mut guards, nodes, resp) = groups_cluster("reshard", 2, 3);
    let pids: Vec<u32> = guards.iter().map(|g| g.pid()).collect();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let list: Vec<String> = nodes.split(',').map(str::to_string).collect();
    let client = Arc::new(Cluster::new(&list, ClientConfig::default()).unwrap());
    let recorder = start_recording(&rt, &client, 8);
    rt.block_on(recorder.more(300));
    let slots = slots_to_move();
    let mut alive = vec![true; 6];
    // 1. 0 -> 1, the source's leader killed in the middle, then the admin itself: the
    // second run finishes what the first left frozen or importing.
    let victim = leader(&resp, 0, &alive);
    let runs = move_slots(&nodes, 0, 1, &slots, |admin, progress| {
        wait_for_chunks(progress, 1);
        guards[victim].kill();
        alive[victim] = false;
        // Mid-move (3 of 10 chunks done), whatever this machine's speed.
        wait_for_chunks(progress, 2);
        std::thread::sleep(Duration::from_millis(20));
        let _ = admin.kill();
    });
    assert!(runs >= 2, "the admin was killed before the move ended");
    // 2. 1 -> 0, the target's (group 0's new) leader paused for 1.5 s.
    let paused = leader(&resp, 0, &alive);
    move_slots(&nodes, 1, 0, &slots, |_, _| {
        std::thread::sleep(Duration::from_millis(200));
        signal(pids[paused], "STOP");
        std::thread::sleep(Duration::from_millis(1500));
        signal(pids[paused], "CONT");
    });
    // 3. 0 -> 1, the target's leader killed.
    let victim = 3 + leader(&resp, 1, &alive);
    move_slots(&nodes, 0, 1, &slots, |_, _| {
        std::thread::sleep(Duration::from_millis(300));
        guards[victim].kill();
        alive[victim] = false;
    });
    // 4. 1 -> 0, the source's leader paused.
    let paused = 3 + leader(&resp, 1, &alive);
    move_slots(&nodes, 1, 0, &slots, |_, _| {
        std::thread::sleep(Duration::from_millis(200));
        signal(pids[paused], "STOP");
        std::thread::sleep(Duration::from_millis(1500));
        signal(pids[paused], "CONT");
    });
    // Ops after the last move, and over 1,000 in all.
    rt.block_on(recorder.more(300));
    rt.block_on(recorder.more(1001u64.saturating_sub(recorder.recorded())));
    let recording = rt.block_on(recorder.finish());
    let report = check(&recording.history, &CheckOptions::default());
    if let Verdict::NotLinearizable(f) = &report.verdict {
        eprintln!("{}", render_timeline(f));
    }
    assert_eq!(report.verdict, Verdict::Linearizable);
    let ops = recording.history.operations.len();
    assert!(ops > 1000, "only {ops} ops recorded");
    // Every slot has exactly one owner: the moved slots are with group 0 (the last move's
    // target), the rest where the even split put them; nothing is left frozen or importing.
    let out = kvd(&["admin", "slots", "--nodes", &nodes]);
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let moved_high = slots.split(',').filter(|s| s.parse::<u16>().unwrap() >= 8192).count();
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 2, "{text}");
    assert!(
        lines[0].contains(&format!("owned {} (0-8191,", 8192 + moved_high)),
        "{text}"
    );
    assert!(
        lines[1].contains(&format!("owned {} (8192-", 8192 - moved_high)),
        "{text}"
    );
    for line in lines {
        assert!(line.contains("frozen 0 (-), importing 0 (-)"), "{text}");
    }
    // Every key reads back through a fresh client (which starts from the even split).
    let fresh = Cluster::new(&list, ClientConfig::default()).unwrap();
    for i in 0..KEYS {
        let key = format!("rs-{i}");
        rt.block_on(fresh.get(key.as_bytes())).unwrap();
    }
}

/// A fourth group (started with `--no-slots`) is added under a YCSB-B-like load (95% reads,
/// 5% writes, every write from one writer per key), then removed: each group holds an even
/// share in between, the fourth none at the end, and the cluster holds exactly the keys
/// written, each with its last acknowledged value.
#[test]
fn add_shard_then_remove_shard_keeps_the_key_set() {
    let (_guards, addrs, nodes) = with_empty_group(3);
    let rt = runtime();
    let client = Arc::new(Cluster::new(&addrs, ClientConfig::default()).unwrap());
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    // Four writers, each owning the keys `w{writer}-{n}`, n < 500.
    let writers: Vec<_> = (0..4)
        .map(|w| {
            let (client, stop) = (client.clone(), stop.clone());
            rt.spawn(async move {
                let mut last = std::collections::HashMap::new();
                for round in 0u64..200_000 {
                    if stop.load(std::sync::atomic::Ordering::Relaxed) {
                        break;
                    }
                    let key = format!("w{w}-{}", round % 500);
                    if round % 20 == 0 || round < 500 {
                        let value = format!("{round}");
                        if client.put(key.as_bytes(), value.as_bytes()).await.is_ok() {
                            last.insert(key, value);
                        }
                    } else {
                        let _ = client.get(key.as_bytes()).await;
                    }
                }
                last
            })
        })
        .collect();
    // Once the writers are under way (the first group has taken 100 of their puts)...
    until("the writers to be under way", HANG, || {
        let puts = rt.block_on(client.stats(0)).map(|s| s.counts.puts).unwrap_or(0);
        if puts >= 100 { Ok(()) } else { Err(puts) }
    });
    let out = kvd(&["admin", "add-shard", "--nodes", &nodes, "--chunk", "1024"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let slots = String::from_utf8_lossy(&kvd(&["admin", "slots", "--nodes", &nodes]).stdout).into_owned();
    assert_eq!(slots.matches("owned 4096 ").count(), 4, "{slots}");
    let out = kvd(&[
        "admin",
        "remove-shard",
        "--nodes",
        &nodes,
        "--group",
        "3",
        "--chunk",
        "1024",
    ]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let mut written = std::collections::HashMap::new();
    for w in writers {
        written.extend(rt.block_on(w).unwrap());
    }
    let slots = String::from_utf8_lossy(&kvd(&["admin", "slots", "--nodes", &nodes]).stdout).into_owned();
    assert!(slots.lines().nth(3).unwrap().contains("owned 0 (-)"), "{slots}");
    let fresh = Cluster::new(&addrs, ClientConfig::default()).unwrap();
    for (key, value) in &written {
        let got = rt.block_on(fresh.get(key.as_bytes())).unwrap();
        assert_eq!(got.as_deref(), Some(value.as_bytes()), "{key}");
    }
    let held: u64 = (0..4).map(|g| rt.block_on(fresh.stats(g)).unwrap().keys).sum();
    assert_eq!(held, written.len() as u64, "no key left behind twice, none lost");
    assert_eq!(rt.block_on(fresh.stats(3)).unwrap().keys, 0);
}

/// A client that has heard of a slot's new owner (at the move's epoch) but asks a target
/// still behind it (importing, naming the source at an older epoch) is not bounced between
/// the two until its redirects run out: it waits, as for "try again", and is answered once
/// the target owns the slot.
#[test]
fn a_client_ahead_of_a_target_waits_for_its_hand_over() {
    use kvshared::slots::SlotState;

    let addrs: Vec<String> = (0..2).map(|_| common::addr()).collect();
    let nodes = addrs.join(",");
    let _a = common::start_at(&addrs[0], &["--shard", "0/2", "--nodes", &nodes]).0;
    let _b = common::start_at(&addrs[1], &["--shard", "1/2", "--nodes", &nodes]).0;
    let key = (0..)
        .map(|i| format!("hand{i}"))
        .find(|k| key_slot(k.as_bytes()) < 8192)
        .unwrap();
    let slot = key_slot(key.as_bytes());
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let admin = Cluster::new(&addrs, ClientConfig::default()).unwrap();
    let set = |g: usize, to: SlotState, owner: u16| common::set_slot(&rt, &admin, g, slot, (to, owner, 5));
    // Group 1 imports the slot naming group 0 (its source); group 0 has handed it over.
    set(1, SlotState::Importing, 0);
    set(0, SlotState::Frozen, 0);
    set(0, SlotState::Gone, 1);
    let config = ClientConfig {
        request_timeout: Duration::from_secs(5),
        ..ClientConfig::default()
    };
    let client = Arc::new(Cluster::new(&addrs, config).unwrap());
    let reader = {
        let (client, key) = (client.clone(), key.clone());
        rt.spawn(async move { client.get(key.as_bytes()).await })
    };
    // Once the target has answered the client (naming the source, at an older epoch than
    // the client knows: the client waits, and asks again)...
    until("the target to answer the client", HANG, || {
        let n = rt.block_on(admin.stats(1)).map(|s| s.counts.wrong_shard).unwrap_or(0);
        if n > 0 { Ok(()) } else { Err(n) }
    });
    set(1, SlotState::Owned, 1);
    let got = rt.block_on(reader).unwrap();
    assert!(matches!(got, Ok(None)), "{got:?}");
}

/// One move from a source to two targets at once (`move_from`, as the manager runs its
/// plan): one copy ahead for both under one tracking token, then both targets' chunks side
/// by side, while a recorded load runs, in memory and between durable groups (whose log
/// puts the two targets' steps in one entry: a change of such an entry was once skipped,
/// leaving slots with two owners). The history is linearizable, each target owns exactly
/// its slots, and nothing is left frozen or importing.
#[test]
fn one_source_moves_slots_to_two_targets_at_once() {
    for durable in [None, Some("two-targets")] {
        moves_to_two_targets(durable);
    }
}

fn moves_to_two_targets(durable: Option<&str>) {
    let (_guards, addrs, nodes) = with_empty_group_in(2, durable, &[]);
    let rt = runtime();
    let client = Arc::new(Cluster::new(&addrs, ClientConfig::default()).unwrap());
    // 6,000 keys in the moving blocks: the copy ahead takes several pages, split by target.
    use kvshared::client::{Op, Outcome};
    let fill: Vec<String> = (0..)
        .map(|i| format!("fill-{i}"))
        .filter(|k| (7000..7700).contains(&key_slot(k.as_bytes())))
        .take(6_000)
        .collect();
    for part in fill.chunks(500) {
        let ops: Vec<Op<'_>> = part.iter().map(|k| Op::Put(k.as_bytes(), k.as_bytes())).collect();
        assert!(
            rt.block_on(client.batch(&ops))
                .iter()
                .all(|r| matches!(r, Ok(Outcome::Stored)))
        );
    }
    let recorder = start_recording(&rt, &client, 4);
    rt.block_on(recorder.more(100));
    // The recorded keys' slots of group 0 (below 8192) split between the targets, and
    // blocks of empty slots beside them.
    let mut ours: Vec<u16> = (0..KEYS)
        .map(|i| key_slot(format!("rs-{i}").as_bytes()))
        .filter(|&s| s < 8192)
        .collect();
    ours.sort_unstable();
    ours.dedup();
    assert!(ours.len() >= 4, "{ours:?}");
    let half = ours.len() / 2;
    let with_block = |mut s: Vec<u16>, block: std::ops::Range<u16>| {
        s.extend(block.filter(|b| !ours.contains(b)));
        s.sort_unstable();
        s
    };
    let to_one = with_block(ours[..half].to_vec(), 7000..7300);
    let to_two = with_block(ours[half..].to_vec(), 7300..7700);
    let groups = kvd::control::move_slots::Groups::new(&addrs, ClientConfig::default()).unwrap();
    let targets = [(1, to_one.clone()), (2, to_two.clone())];
    let outcomes = rt.block_on(kvd::control::move_slots::move_from(&groups, 0, &targets, 100));
    for o in &outcomes {
        assert!(o.is_ok(), "{o:?}");
    }
    rt.block_on(recorder.more(100));
    rt.block_on(recorder.more(201u64.saturating_sub(recorder.recorded())));
    let recording = rt.block_on(recorder.finish());
    let report = check(&recording.history, &CheckOptions::default());
    if let Verdict::NotLinearizable(f) = &report.verdict {
        eprintln!("{}", render_timeline(f));
    }
    assert_eq!(report.verdict, Verdict::Linearizable);
    assert!(recording.history.operations.len() > 200);
    let fresh = Cluster::new(&addrs, ClientConfig::default()).unwrap();
    rt.block_on(fresh.learn_slot_map());
    for (to, slots) in &targets {
        assert!(
            slots.iter().all(|&s| fresh.slots().owner(s) == *to as u16),
            "group {to}"
        );
    }
    let text = String::from_utf8_lossy(&kvd(&["admin", "slots", "--nodes", &nodes]).stdout).into_owned();
    assert_eq!(text.matches("frozen 0 (-), importing 0 (-)").count(), 3, "{text}");
    for i in 0..KEYS {
        rt.block_on(fresh.get(format!("rs-{i}").as_bytes())).unwrap();
    }
    for part in fill.chunks(500) {
        let ops: Vec<Op<'_>> = part.iter().map(|k| Op::Get(k.as_bytes())).collect();
        for (k, got) in part.iter().zip(rt.block_on(fresh.batch(&ops))) {
            assert!(
                matches!(&got, Ok(Outcome::Value(v)) if v == k.as_bytes()),
                "{k}: {got:?}"
            );
        }
    }
}

/// `kvd manager --move-slots`: a burst of reads on one group's keys makes it serve far more
/// than its share, and the manager moves some of its busiest slots to the idle groups (a
/// third group started with `--no-slots` among them) while a recorded load runs. The
/// history is linearizable, the moved slots have one owner each, and every key reads back.
#[test]
fn the_manager_moves_a_hot_groups_slots_to_idle_groups() {
    let (guards, addrs, nodes) = with_empty_group(2);
    let rt = runtime();
    let client = Arc::new(Cluster::new(&addrs, ClientConfig::default()).unwrap());
    // 64 keys of group 0 (slots below 8192), read in a burst.
    let hot: Vec<String> = (0..)
        .map(|i| format!("hot-{i}"))
        .filter(|k| key_slot(k.as_bytes()) < 8192)
        .take(64)
        .collect();
    let written = hot.clone();
    for k in &hot {
        rt.block_on(client.put(k.as_bytes(), b"v")).unwrap();
    }
    let mut manager = common::Guard(
        Command::new(env!("CARGO_BIN_EXE_kvd"))
            .args(["manager", "--nodes", &nodes, "--move-slots", "--interval", "500ms"])
            .args([
                "--up-after",
                "2",
                "--settle",
                "1",
                "--spread-above",
                "1.5",
                "--chunk",
                "1024",
            ])
            .arg("--json")
            .stdout(Stdio::piped())
            .spawn()
            .unwrap(),
    );
    let decisions = common::Decisions::read(manager.stdout.take().unwrap());
    let recorder = start_recording(&rt, &client, 4);
    // The burst, until the manager has moved some of group 0's slots (bounded by HANG).
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let burst = rt.spawn({
        let (client, stop) = (client.clone(), stop.clone());
        async move {
            let until = Instant::now() + HANG;
            let ops: Vec<kvshared::client::Op<'_>> =
                hot.iter().map(|k| kvshared::client::Op::Get(k.as_bytes())).collect();
            while !stop.load(std::sync::atomic::Ordering::Relaxed) && Instant::now() < until {
                let _ = client.batch(&ops).await;
            }
        }
    });
    rt.block_on(decisions.wait_for_one("a move of group 0's slots", |v| {
        v["action"] == "moved" && v["shard"] == 0
    }));
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    rt.block_on(burst).unwrap();
    drop(manager);
    rt.block_on(recorder.more(300));
    rt.block_on(recorder.more(501u64.saturating_sub(recorder.recorded())));
    let recording = rt.block_on(recorder.finish());
    let actions: Vec<String> = decisions
        .all()
        .iter()
        .map(|v| format!("{} {}", v["action"].as_str().unwrap_or(""), v["shard"]))
        .collect();
    eprintln!("the manager did: {actions:?}");
    assert!(actions.iter().any(|a| a == "moved 0"), "{actions:?}");
    assert!(!actions.iter().any(|a| a.starts_with("failed")), "{actions:?}");
    let report = check(&recording.history, &CheckOptions::default());
    if let Verdict::NotLinearizable(f) = &report.verdict {
        eprintln!("{}", render_timeline(f));
    }
    assert_eq!(report.verdict, Verdict::Linearizable);
    assert!(recording.history.operations.len() > 500);
    let text = String::from_utf8_lossy(&kvd(&["admin", "slots", "--nodes", &nodes]).stdout).into_owned();
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 3, "{text}");
    assert!(!lines[2].contains("owned 0 (-)"), "the idle group took none: {text}");
    for line in &lines {
        assert!(line.contains("frozen 0 (-), importing 0 (-)"), "{text}");
    }
    let fresh = Cluster::new(&addrs, ClientConfig::default()).unwrap();
    for k in &written {
        assert_eq!(
            rt.block_on(fresh.get(k.as_bytes())).unwrap().as_deref(),
            Some(&b"v"[..]),
            "{k}"
        );
    }
    drop(guards);
}

/// What `--move-slots` and `rebalance --by load` go by: a replica group counts its reads
/// in its sampled per-slot load (they run deferred, after a read index, on the leader and
/// the followers alike), not only its writes.
#[test]
fn a_replica_groups_reads_count_in_its_slot_load() {
    use kvshared::wire::{BatchRequest, OpKind, OpReply};

    let (_guards, nodes, _) = groups_cluster("slotload", 1, 3);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let list: Vec<String> = nodes.split(',').map(str::to_string).collect();
    let client = Cluster::new(
        &list,
        ClientConfig {
            reads: kvshared::client::ReadFrom::Leader,
            ..ClientConfig::default()
        },
    )
    .unwrap();
    rt.block_on(client.put(b"counted", b"v")).unwrap();
    let total = |client: &Cluster| -> u64 {
        let mut req = BatchRequest::new();
        req.push(OpKind::SlotLoad, b"", &[]);
        let reply = rt.block_on(client.send_batch(0, &req)).unwrap();
        let view = reply.batch().unwrap();
        let OpReply::Found(bytes) = view.result(0) else {
            panic!("no slot load")
        };
        kvshared::slots::decode_load_counts(bytes)
            .unwrap()
            .iter()
            .map(|&c| u64::from(c))
            .sum()
    };
    let before = total(&client);
    let gets: Vec<kvshared::client::Op<'_>> = (0..8).map(|_| kvshared::client::Op::Get(b"counted")).collect();
    for _ in 0..256 {
        for r in rt.block_on(client.batch(&gets)) {
            r.unwrap();
        }
    }
    let after = total(&client);
    assert!(after > before, "2,048 reads left the slot load at {before}");
}

/// `kvd admin` verbs honour `--timeout` and name the group that does not answer (issue 58):
/// with one of two nodes down, `slots` and `move-slots` give up after the `--timeout` given,
/// not after a minute, and say which node; so do the group-membership verbs when no member
/// of the group answers.
#[test]
fn admin_verbs_give_up_on_a_node_down_after_their_timeout_naming_it() {
    let (node, up) = common::start(&["--shard", "0/2"]);
    let down = common::addr(); // held: nothing listens, connections are refused
    let nodes = format!("{up},{down}");
    for verb in [
        &["slots"][..],
        &["move-slots", "--from", "1", "--to", "0", "9000-9001"][..],
    ] {
        let args = [&["admin"][..], verb, &["--nodes", &nodes, "--timeout", "1s"]].concat();
        let out = kvd(&args);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{verb:?}: {err}");
        assert!(
            err.contains(&down) && err.contains("does not answer within --timeout 1s"),
            "{verb:?} names the node down and the timeout: {err}"
        );
    }
    // The group-membership verbs, against a group none of whose members answers.
    let other = common::addr();
    let group = format!("{down}|{other}");
    for verb in [
        &["transfer-leader"][..],
        &["remove-replica"][..],
        &["add-replica", "--learner"][..],
    ] {
        let args = [&["admin"][..], verb, &["--nodes", &group, "--timeout", "1s", &other]].concat();
        let out = kvd(&args);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{verb:?}: {err}");
        assert!(
            (err.contains(&down) || err.contains(&other)) && err.contains("within --timeout 1s"),
            "{verb:?} names a member and the timeout: {err}"
        );
    }
    drop(node);
}

/// Issue 58: a slot move's copy fits every frame limit. Group 0 holds 24 values of 1 MiB in
/// the slots it gives to group 2, started with `--max-frame 4mib`: a page of the copy (up to
/// 4 MiB and more) is loaded in batches within the target's limit; then moved back, from the
/// small-frame group; every value reads back whole. In memory and durable.
#[test]
fn a_slot_move_of_big_values_fits_a_target_with_a_small_frame_limit() {
    big_values_move_within_a_small_frame(None);
    big_values_move_within_a_small_frame(Some("big-move"));
}

fn big_values_move_within_a_small_frame(durable: Option<&str>) {
    let (_guards, addrs, nodes) = with_empty_group_in(2, durable, &["--max-frame", "4mib"]);
    let rt = runtime();
    let client = Cluster::new(&addrs, ClientConfig::default()).unwrap();
    let value = |i: usize| vec![b'a' + (i % 26) as u8; 1 << 20];
    let keys: Vec<String> = (0..)
        .map(|i| format!("big{i}"))
        .filter(|k| kvshared::routing::key_slot(k.as_bytes()) < 8192)
        .take(24)
        .collect();
    for (i, k) in keys.iter().enumerate() {
        rt.block_on(client.put(k.as_bytes(), &value(i))).unwrap();
    }
    for (from, to) in [("0", "2"), ("2", "0")] {
        let out = move_once(&nodes, from, to, "8192", "0-8191");
        assert!(
            out.status.success(),
            "{from} -> {to}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let fresh = Cluster::new(&addrs, ClientConfig::default()).unwrap();
        let to: usize = to.parse().unwrap();
        assert_eq!(rt.block_on(fresh.stats(to)).unwrap().keys, 24);
        for (i, k) in keys.iter().enumerate() {
            let got = rt.block_on(fresh.get(k.as_bytes())).unwrap();
            assert!(got.as_deref() == Some(&value(i)[..]), "{k}: {:?}", got.map(|v| v.len()));
        }
    }
}

/// Issue 60: `move-slots` over a fragmented range moves the slots the source owns and names
/// the ones it leaves out (gone to another group before); run again, it finds nothing left
/// and says so with exit status 1; a group `--nodes` does not list is named.
#[test]
fn a_move_plans_over_what_the_source_owns_and_says_when_nothing_is_left() {
    let (_guards, nodes, _resp) = groups_cluster("mv-plan", 3, 1);
    let run = |from: &str, to: &str, slots: &str| {
        let out = move_once(&nodes, from, to, "4", slots);
        (out.status.code(), String::from_utf8_lossy(&out.stderr).into_owned())
    };
    let (code, said) = run("2", "0", "12000-12004");
    assert_eq!(code, Some(0), "{said}");
    let (code, said) = run("2", "1", "11990-12020");
    assert_eq!(code, Some(0), "{said}");
    assert!(said.contains("moved 26 slots"), "{said}");
    assert!(
        said.contains("left out, not group 2's to hand over: 12000-12004 (gone to group 0"),
        "{said}"
    );
    let (code, said) = run("2", "1", "11990-12020");
    assert_eq!(code, Some(1), "{said}");
    assert!(
        said.contains("26 slots (11990-11999,12005-12020) are group 1's already"),
        "{said}"
    );
    assert!(said.contains("nothing to move"), "{said}");
    let (code, said) = run("0", "5", "0-1");
    assert_ne!(code, Some(0), "{said}");
    assert!(said.contains("--to 5: --nodes lists 3 groups (0 to 2)"), "{said}");
}
