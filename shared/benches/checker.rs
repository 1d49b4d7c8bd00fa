//! How fast the linearizability checker is (a benchmark, not a test).
//!
//!     cargo bench -p kvshared --bench checker
//!
//! Builds histories the way a real run makes them: 16 clients, each issuing one op at a time
//! with random durations, every op taking effect at a random moment inside its interval, and
//! the results computed by applying the ops in that order. Then checks them on one thread.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use kvshared::history::{Call, CheckOptions, History, Operation, Return, Verdict, check};
use rand::rngs::SmallRng;
use rand::{RngExt, SeedableRng};

fn history(ops: usize, clients: u32, keys: u32, seed: u64) -> History {
    let mut rng = SmallRng::seed_from_u64(seed);
    // (effect time, client, call, return, key, kind)
    let mut planned = Vec::with_capacity(ops);
    let per_client = ops / clients as usize;
    for client in 0..clients {
        let mut t = rng.random_range(0..1_000u64);
        for _ in 0..per_client {
            let call = t;
            let ret = call + rng.random_range(1_000..20_000u64);
            let effect = rng.random_range(call..=ret);
            let key = rng.random_range(0..keys);
            let kind = rng.random_range(0..10u8); // 0-5 get, 6-8 put, 9 delete
            planned.push((effect, client, call, ret, key, kind));
            t = ret + rng.random_range(100..2_000u64);
        }
    }
    planned.sort_unstable();
    let mut map: HashMap<u32, String> = HashMap::new();
    let operations = planned
        .into_iter()
        .enumerate()
        .map(|(i, (_, client, call_ns, return_ns, key, kind))| {
            let (call, ret) = match kind {
                0..=5 => (
                    Call::Get,
                    Return::Value {
                        value: map.get(&key).cloned(),
                    },
                ),
                6..=8 => {
                    let v = format!("v{i}");
                    map.insert(key, v.clone());
                    (Call::Put { value: v }, Return::Stored)
                }
                _ => (
                    Call::Delete,
                    Return::Deleted {
                        existed: map.remove(&key).is_some(),
                    },
                ),
            };
            Operation {
                client,
                key: format!("key{key}"),
                call,
                ret,
                call_ns,
                return_ns,
            }
        })
        .collect();
    History { operations }
}

fn main() {
    let options = CheckOptions {
        deadline: Some(Duration::from_secs(600)),
        threads: 1,
    };
    for (ops, keys) in [(100_000, 1_000), (1_000_000, 1_000), (100_000, 10)] {
        let h = history(ops, 16, keys, 42);
        let start = Instant::now();
        let report = check(&h, &options);
        let secs = start.elapsed().as_secs_f64();
        assert_eq!(report.verdict, Verdict::Linearizable);
        println!(
            "checker: {ops:>9} ops, 16 clients, {keys:>5} keys, 1 thread: {secs:>7.3} s ({:.0} ops/s)",
            ops as f64 / secs
        );
    }
}
