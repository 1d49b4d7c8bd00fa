//! `kvtui --record FILE` on a real terminal (util-linux `script`) appends each sample as a
//! JSON line; `kvtui --replay FILE` shows it.

mod common;

use common::Terminal;

use kvd::local::LocalCluster;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_recording_holds_every_sample_and_replays() {
    let cluster = LocalCluster::start(1, |_| {}).await.unwrap();
    let addr = cluster.addrs()[0].clone();
    let scratch = kvtestkit::temp_dir("kvtui-record");
    let file = scratch.path().join("recording.jsonl");

    let terminal = Terminal::start(&format!("--nodes {addr} --interval 100ms --record {}", file.display()));
    kvtestkit::until_async("kvtui to record 5 samples", kvtestkit::HANG, || async {
        let n = std::fs::read_to_string(&file).map_or(0, |t| t.lines().count());
        if n >= 5 { Ok(()) } else { Err(n) }
    })
    .await;
    tokio::task::spawn_blocking(move || terminal.stop("-TERM"))
        .await
        .unwrap();
    let recording = kvtui::recording::read(&file).unwrap();
    assert!(recording.records.len() >= 5);
    assert_eq!(recording.nodes, vec![addr.clone()]);
    assert!(
        recording.records.iter().all(|r| r.stats.is_some()),
        "every poll answered"
    );
    let times: Vec<u64> = recording.records.iter().map(|r| r.unix_ms).collect();
    assert!(times.windows(2).all(|w| w[0] <= w[1]), "{times:?}");

    let replay = format!("--replay {} --speed 5", file.display());
    let addr_shown = addr.clone();
    let screen = tokio::task::spawn_blocking(move || {
        let terminal = Terminal::start(&replay);
        terminal.wait_for(b"REPLAY 5x");
        terminal.wait_for(addr_shown.as_bytes());
        terminal.stop("-TERM")
    })
    .await
    .unwrap();
    let screen = String::from_utf8_lossy(&screen).into_owned();
    assert!(screen.contains("REPLAY 5x"), "{screen}");
    assert!(screen.contains(&addr), "{screen}");
}
