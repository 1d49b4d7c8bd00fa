//! The linearizability check is not vacuous: a node whose store answers some reads from a
//! stale copy is caught. The fault (`store::stale`) exists only under `cfg(test)`, so this
//! test lives inside the crate; no binary a user runs contains it.

use std::sync::Arc;
use std::time::Duration;

use kvshared::client::{ClientConfig, Cluster, RecordConfig, record};
use kvshared::history::{CheckOptions, Verdict, check, render_timeline};

use crate::local::LocalCluster;

#[test]
fn a_store_with_stale_reads_is_caught() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let verdict = rt.block_on(async {
        let cluster = LocalCluster::start(2, |c| c.engine.fault_stale_reads = true)
            .await
            .unwrap();
        let config = ClientConfig {
            conns_per_node: 2,
            ..ClientConfig::default()
        };
        let client = Arc::new(Cluster::connect(&cluster.addrs(), config).await.unwrap());
        let config = RecordConfig {
            clients: 6,
            keys: 3,
            duration: Duration::from_secs(60),
            max_ops_per_client: 300,
            seed: 7,
            ..RecordConfig::default()
        };
        let recording = record(client, &config).await;
        assert_eq!(recording.history.operations.len(), 6 * 300);
        check(&recording.history, &CheckOptions::default()).verdict
    });
    let Verdict::NotLinearizable(failure) = verdict else {
        panic!("the stale-read fault went unnoticed: {verdict:?}");
    };
    let timeline = render_timeline(&failure);
    assert!(timeline.contains("<- stuck"), "{timeline}");
}
