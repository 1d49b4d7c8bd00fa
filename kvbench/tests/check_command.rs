//! `kvbench check` end to end: against live nodes, from a saved history, and on a tampered one.

use kvd::local::LocalCluster;
use kvshared::history::{Call, History, Operation, Return};

async fn kvbench(args: &[&str]) -> std::process::Output {
    tokio::process::Command::new(env!("CARGO_BIN_EXE_kvbench"))
        .args(args)
        .env_remove("KV_NODES")
        .output()
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn check_records_saves_and_rechecks_a_history() {
    let nodes = LocalCluster::start(2, |_| {}).await.unwrap();
    let list = nodes.addrs().join(",");
    let dir = kvtestkit::temp_dir("kvbench-check");
    let saved = dir.path().join("history.json");
    let saved = saved.to_str().unwrap();

    let out = kvbench(&[
        "check",
        "--nodes",
        &list,
        "--clients",
        "4",
        "--keys",
        "5",
        "--duration",
        "500ms",
        "--history",
        saved,
    ])
    .await;
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        text.contains("LINEARIZABLE") && text.contains("from 4 clients on 5 keys"),
        "{text}"
    );

    let again = kvbench(&["check", "--from", saved, "--json"]).await;
    assert_eq!(again.status.code(), Some(0));
    let report: serde_json::Value = serde_json::from_slice(&again.stdout).unwrap();
    assert_eq!(report["verdict"]["verdict"], "linearizable");

    // Tamper: make one successful read return a value nobody wrote.
    let mut h: History = serde_json::from_slice(&std::fs::read(saved).unwrap()).unwrap();
    let get = h
        .operations
        .iter_mut()
        .find(|o| matches!(o.ret, Return::Value { .. }))
        .expect("the history has reads");
    get.ret = Return::Value {
        value: Some("never-written".into()),
    };
    let tampered = dir.path().join("tampered.json");
    std::fs::write(&tampered, serde_json::to_vec(&h).unwrap()).unwrap();
    let bad = kvbench(&["check", "--from", tampered.to_str().unwrap()]).await;
    let text = String::from_utf8_lossy(&bad.stdout);
    assert_eq!(bad.status.code(), Some(1), "{text}");
    assert!(
        text.contains("NOT LINEARIZABLE") && text.contains("get→never-written"),
        "{text}"
    );

    // Malformed: an op that returns before it was called. A one-line refusal, exit 2.
    let op = &mut h.operations[3];
    op.return_ns = op.call_ns.saturating_sub(1);
    op.call_ns = op.return_ns + 1;
    let malformed = dir.path().join("malformed.json");
    std::fs::write(&malformed, serde_json::to_vec(&h).unwrap()).unwrap();
    let refused = kvbench(&["check", "--from", malformed.to_str().unwrap()]).await;
    let err = String::from_utf8_lossy(&refused.stderr);
    assert_eq!(refused.status.code(), Some(2), "{err}");
    assert_eq!(err.trim().lines().count(), 1, "one line: {err}");
    assert!(err.contains("operation #3") && err.contains("before its call"), "{err}");
}

/// `kvbench check --ttl`: puts with times to live, reads held to them; a history where a
/// read returns a value long after its time ran out is not linearizable, with that read
/// shown.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn check_with_times_to_live_holds_reads_to_them() {
    let nodes = LocalCluster::start(2, |_| {}).await.unwrap();
    let list = nodes.addrs().join(",");
    let dir = kvtestkit::temp_dir("kvbench-check-ttl");
    let saved = dir.path().join("history.json");
    let saved = saved.to_str().unwrap();
    let args = [
        "check",
        "--nodes",
        &list,
        "--clients",
        "4",
        "--keys",
        "3",
        "--duration",
        "700ms",
    ];
    let out = kvbench(&[&args[..], &["--ttl", "2ms..20ms", "--history", saved]].concat()).await;
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(text.contains("LINEARIZABLE"), "{text}");
    // Tamper: the last read of a key returns the value of its first put with a time to
    // live, a second after its time ran out.
    let mut h: History = serde_json::from_slice(&std::fs::read(saved).unwrap()).unwrap();
    let (key, value, ends) = h
        .operations
        .iter()
        .find_map(|o| match (&o.call, &o.ret) {
            (Call::PutTtl { value, ttl_ms }, Return::Stored) => {
                Some((o.key.clone(), value.clone(), o.return_ns + ttl_ms * 1_000_000))
            }
            _ => None,
        })
        .expect("the history has puts with times to live");
    let end = h.operations.iter().map(|o| o.return_ns).max().unwrap();
    h.operations.push(Operation {
        client: 99,
        key,
        call: Call::Get,
        ret: Return::Value {
            value: Some(value.clone()),
        },
        call_ns: end.max(ends) + 1_000_000_000,
        return_ns: end.max(ends) + 1_000_001_000,
    });
    let tampered = dir.path().join("tampered.json");
    std::fs::write(&tampered, serde_json::to_vec(&h).unwrap()).unwrap();
    let bad = kvbench(&["check", "--from", tampered.to_str().unwrap()]).await;
    let text = String::from_utf8_lossy(&bad.stdout);
    assert_eq!(bad.status.code(), Some(1), "{text}");
    assert!(
        text.contains("NOT LINEARIZABLE") && text.contains(&format!("get→{value}")),
        "{text}"
    );
}
