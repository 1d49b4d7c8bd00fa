//! `kvtui --record FILE` on a real terminal (util-linux `script`) appends each sample as a
//! JSON line; `kvtui --replay FILE` shows it.

mod common;

use common::kvtui_below;

use std::io::Read;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use kvd::local::LocalCluster;

/// Runs kvtui with `args` under `script`; returns script and kvtui's pid.
fn on_a_terminal(args: &str) -> (Child, u32, std::thread::JoinHandle<Vec<u8>>) {
    // The pseudo-terminal starts at 0x0 when the test has no terminal: give it a size.
    let command = format!("stty cols 160 rows 45; exec {} {args}", env!("CARGO_BIN_EXE_kvtui"));
    let mut script = Command::new("script")
        .args(["-qfec", &command, "/dev/null"])
        .env("TERM", "xterm")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("util-linux `script` is needed to give kvtui a terminal");
    let mut out = script.stdout.take().unwrap();
    let reader = std::thread::spawn(move || {
        let mut all = Vec::new();
        let _ = out.read_to_end(&mut all);
        all
    });
    let deadline = Instant::now() + Duration::from_secs(20);
    let pid = loop {
        if let Some(pid) = kvtui_below(script.id()) {
            break pid;
        }
        assert!(Instant::now() < deadline, "kvtui did not start under script");
        std::thread::sleep(Duration::from_millis(50));
    };
    (script, pid, reader)
}

/// Ends kvtui as a user's `kill` would and waits for script; kills both if that fails.
fn stop(mut script: Child, kvtui: u32) {
    let _ = Command::new("kill").args(["-TERM", &kvtui.to_string()]).status();
    let deadline = Instant::now() + Duration::from_secs(20);
    while script.try_wait().unwrap().is_none() {
        if Instant::now() > deadline {
            let _ = Command::new("kill").args(["-KILL", &kvtui.to_string()]).status();
            let _ = script.kill();
            let _ = script.wait();
            panic!("kvtui did not end after SIGTERM");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_recording_holds_every_sample_and_replays() {
    let cluster = LocalCluster::start(1, |_| {}).await.unwrap();
    let addr = cluster.addrs()[0].clone();
    let file = std::env::temp_dir().join(format!("kvtui-record-{}.jsonl", std::process::id()));
    let _ = std::fs::remove_file(&file);

    let (script, pid, _) = on_a_terminal(&format!("--nodes {addr} --interval 100ms --record {}", file.display()));
    let deadline = Instant::now() + Duration::from_secs(20);
    while std::fs::read_to_string(&file).map_or(0, |t| t.lines().count()) < 5 {
        assert!(Instant::now() < deadline, "kvtui recorded fewer than 5 samples in 20 s");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    stop(script, pid);
    let recording = kvtui::recording::read(&file).unwrap();
    assert!(recording.records.len() >= 5);
    assert_eq!(recording.nodes, vec![addr.clone()]);
    assert!(
        recording.records.iter().all(|r| r.stats.is_some()),
        "every poll answered"
    );
    let times: Vec<u64> = recording.records.iter().map(|r| r.unix_ms).collect();
    assert!(times.windows(2).all(|w| w[0] <= w[1]), "{times:?}");

    let (script, pid, screen) = on_a_terminal(&format!("--replay {} --speed 5", file.display()));
    tokio::time::sleep(Duration::from_millis(1500)).await;
    stop(script, pid);
    let screen = String::from_utf8_lossy(&screen.join().unwrap()).into_owned();
    assert!(screen.contains("REPLAY 5x"), "{screen}");
    assert!(screen.contains(&addr), "{screen}");
    std::fs::remove_file(&file).unwrap();
}
