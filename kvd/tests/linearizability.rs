//! The real server, under concurrent clients, produces linearizable histories; and the
//! check is not vacuous: a store that answers some reads from a stale copy is caught.

use std::sync::Arc;
use std::time::Duration;

use kvd::local::LocalCluster;
use kvshared::client::{ClientConfig, Cluster, RecordConfig, record};
use kvshared::history::{CheckOptions, Verdict, check, render_timeline};
use proptest::prelude::*;
use proptest::test_runner::{Config, TestRunner};

async fn recorded_verdict(shards: u32, stale: bool, clients: usize, keys: usize, seed: u64) -> (Verdict, usize) {
    let cluster = LocalCluster::start(shards, |c| c.fault_stale_reads = stale)
        .await
        .unwrap();
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
        duration: Duration::from_millis(400),
        max_ops_per_client: 2_000,
        seed,
        ..RecordConfig::default()
    };
    let recording = record(client, &config).await;
    assert_eq!(recording.refused, 0);
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
            let (verdict, ops) = rt.block_on(recorded_verdict(shards, false, clients, keys, seed));
            prop_assert!(ops > 50, "only {} ops recorded", ops);
            if let Verdict::NotLinearizable(f) = &verdict {
                eprintln!("{}", render_timeline(f));
            }
            prop_assert_eq!(verdict, Verdict::Linearizable);
            Ok(())
        })
        .unwrap();
}

#[test]
fn a_store_with_stale_reads_is_caught() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let (verdict, ops) = rt.block_on(recorded_verdict(2, true, 6, 3, 7));
    assert!(ops > 50);
    let Verdict::NotLinearizable(failure) = verdict else {
        panic!("the stale-read fault went unnoticed: {verdict:?}");
    };
    let timeline = render_timeline(&failure);
    assert!(timeline.contains("<- stuck"), "{timeline}");
}
