//! Random op sequences through the real client and server agree with a HashMap model.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};

use kvd::local::LocalCluster;
use kvshared::client::{ClientConfig, Cluster, Op, Outcome};
use proptest::prelude::*;
use proptest::test_runner::{Config, TestRunner};

#[derive(Debug, Clone)]
enum ModelOp {
    Get(u8),
    Put(u8, Vec<u8>),
    Delete(u8),
    /// A conditional put: `true` stores only if absent (SET NX), `false` only if present (XX).
    PutIf(u8, Vec<u8>, bool),
}

fn op() -> impl Strategy<Value = ModelOp> {
    prop_oneof![
        4 => (0u8..16).prop_map(ModelOp::Get),
        3 => ((0u8..16), proptest::collection::vec(any::<u8>(), 0..48)).prop_map(|(k, v)| ModelOp::Put(k, v)),
        1 => (0u8..16).prop_map(ModelOp::Delete),
        2 => ((0u8..16), proptest::collection::vec(any::<u8>(), 0..48), any::<bool>())
            .prop_map(|(k, v, nx)| ModelOp::PutIf(k, v, nx)),
    ]
}

fn check_against_model(shards: u32) {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let cluster = rt.block_on(LocalCluster::start(shards, |_| {})).unwrap();
    let client = rt
        .block_on(Cluster::connect(&cluster.addrs(), ClientConfig::default()))
        .unwrap();
    let case = AtomicU64::new(0);
    let mut runner = TestRunner::new(Config {
        cases: 48,
        ..Config::default()
    });
    let strategy = (proptest::collection::vec(op(), 1..120), 1usize..40);
    runner
        .run(&strategy, |(ops, batch_size)| {
            // Each case gets its own key space, so cases do not see each other's data.
            let prefix = case.fetch_add(1, Ordering::Relaxed);
            let key = |k: u8| format!("case{prefix}-key{k}").into_bytes();
            let mut model: HashMap<Vec<u8>, Vec<u8>> = HashMap::new();
            for chunk in ops.chunks(batch_size) {
                let keys: Vec<Vec<u8>> = chunk
                    .iter()
                    .map(|o| match o {
                        ModelOp::Get(k) | ModelOp::Put(k, _) | ModelOp::Delete(k) | ModelOp::PutIf(k, _, _) => key(*k),
                    })
                    .collect();
                let batch: Vec<Op<'_>> = chunk
                    .iter()
                    .zip(&keys)
                    .map(|(o, k)| match o {
                        ModelOp::Get(_) => Op::Get(k),
                        ModelOp::Put(_, v) => Op::Put(k, v),
                        ModelOp::Delete(_) => Op::Delete(k),
                        ModelOp::PutIf(_, v, true) => Op::PutIfAbsent(k, v),
                        ModelOp::PutIf(_, v, false) => Op::PutIfPresent(k, v),
                    })
                    .collect();
                let expected: Vec<Outcome> = chunk
                    .iter()
                    .zip(&keys)
                    .map(|(o, k)| match o {
                        ModelOp::Get(_) => model.get(k).map_or(Outcome::NotFound, |v| Outcome::Value(v.clone())),
                        ModelOp::Put(_, v) => {
                            model.insert(k.clone(), v.clone());
                            Outcome::Stored
                        }
                        ModelOp::Delete(_) => Outcome::Deleted(model.remove(k).is_some()),
                        ModelOp::PutIf(_, v, if_absent) => {
                            if model.contains_key(k) == *if_absent {
                                Outcome::NotStored
                            } else {
                                model.insert(k.clone(), v.clone());
                                Outcome::Stored
                            }
                        }
                    })
                    .collect();
                let got: Vec<Outcome> = rt
                    .block_on(client.batch(&batch))
                    .into_iter()
                    .map(|r| r.expect("op failed"))
                    .collect();
                prop_assert_eq!(got, expected);
            }
            Ok(())
        })
        .unwrap();
}

#[test]
fn random_ops_agree_with_a_hashmap_on_one_node() {
    check_against_model(1);
}

#[test]
fn random_ops_agree_with_a_hashmap_on_three_nodes() {
    check_against_model(3);
}
