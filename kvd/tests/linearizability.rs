//! The real server, under concurrent clients, produces linearizable histories. (That the
//! check is not vacuous, by catching a store with a stale-read fault, is a unit test in
//! `kvd/src/fault_tests.rs`: the fault exists only in kvd's own test build.)

mod common;

use std::sync::Arc;
use std::time::Duration;

use kvd::local::LocalCluster;
use kvshared::client::{ClientConfig, Cluster, RecordConfig, record};
use kvshared::history::{CheckOptions, Verdict, check, render_timeline};
use proptest::prelude::*;
use proptest::test_runner::{Config, TestRunner};

/// Ops each client runs; a recording stops when every client has run them.
const OPS_PER_CLIENT: u64 = 300;

async fn recorded_verdict(shards: u32, clients: usize, keys: usize, seed: u64) -> (Verdict, usize) {
    let cluster = LocalCluster::start(shards, |_| {}).await.unwrap();
    let client = Arc::new(
        Cluster::connect(
            &cluster.addrs(),
            ClientConfig {
                conns_per_node: 2,
                ..ClientConfig::default()
            },
        )
        .await
        .unwrap(),
    );
    let config = RecordConfig {
        clients,
        keys,
        // A deadline only for a broken build: the recording ends on the op count.
        duration: Duration::from_secs(60),
        max_ops_per_client: OPS_PER_CLIENT,
        seed,
        ..RecordConfig::default()
    };
    let recording = record(client, &config).await;
    assert_eq!(recording.refused_total(), 0, "{:?}", recording.refused);
    let ops = recording.history.operations.len();
    let report = check(&recording.history, &CheckOptions::default());
    (report.verdict, ops)
}

#[test]
fn concurrent_clients_on_real_shards_stay_linearizable() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let mut runner = TestRunner::new(Config {
        cases: 4,
        ..Config::default()
    });
    let params = (2u32..=3, 2usize..=8, 1usize..=4, any::<u64>());
    runner
        .run(&params, |(shards, clients, keys, seed)| {
            let (verdict, ops) = rt.block_on(recorded_verdict(shards, clients, keys, seed));
            prop_assert_eq!(ops as u64, clients as u64 * OPS_PER_CLIENT);
            if let Verdict::NotLinearizable(f) = &verdict {
                eprintln!("{}", render_timeline(f));
            }
            prop_assert_eq!(verdict, Verdict::Linearizable);
            Ok(())
        })
        .unwrap();
}

/// Puts with times to live of 1-10 ms, in memory and durable: every history is
/// linearizable with each value gone when its time ran out (the checker places an expiry
/// per put: a read of a value after its time surely ran out fails it), and times do run out.
#[test]
fn histories_with_times_to_live_stay_linearizable_in_memory_and_durable() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    for durable in [false, true] {
        let dir = common::temp_dir("lin-ttl");
        let (verdict, expired) = rt.block_on(async {
            let d = dir.path().to_path_buf();
            let cluster = LocalCluster::start(2, |c| {
                if durable {
                    c.durability = Some(kvd::node::Durability::in_dir(d.join(c.cluster.shard.index.to_string())));
                }
            })
            .await
            .unwrap();
            let client = Arc::new(
                Cluster::connect(&cluster.addrs(), ClientConfig::default())
                    .await
                    .unwrap(),
            );
            let config = RecordConfig {
                clients: 4,
                // Few puts over many keys, so a key often outlives its time to live and
                // the frequent reads find it gone.
                keys: 64,
                // Bounded by the op count (10,000 in all); the time only guards a hang.
                duration: common::HANG,
                max_ops_per_client: 2_500,
                get_percent: 98,
                put_percent: 2,
                ttl_ms: Some((1, 10)),
                seed: 7,
                ..RecordConfig::default()
            };
            let recording = record(client, &config).await;
            assert_eq!(recording.refused_total(), 0, "{:?}", recording.refused);
            let report = check(&recording.history, &CheckOptions::default());
            (report.verdict, common::reads_after_expiry(&recording.history))
        });
        if let Verdict::NotLinearizable(f) = &verdict {
            eprintln!("{}", render_timeline(f));
        }
        assert_eq!(verdict, Verdict::Linearizable, "durable: {durable}");
        assert!(
            expired > 100,
            "only {expired} reads found a key gone (durable: {durable})"
        );
    }
}
