//! How fast the linearizability checker is (a benchmark, not a test).
//!
//!     cargo bench -p kvshared --bench checker
//!
//! Builds histories the way a real run makes them: clients each issuing one op at a time
//! with random durations, every op taking effect at a random moment inside its interval, and
//! the results computed by applying the ops in that order; a fraction of the ops lose their
//! answer (unknown outcome: a lost write took effect or not, at random). Then checks each
//! class of history on one thread twice: with the checker as it is, and with the plain
//! WGL search with Porcupine's memoisation (`prune: false`), the algorithm
//! Porcupine runs, so the two columns compare the same implementation with and without
//! the rule.
//!
//!     cargo bench -p kvshared --bench checker [CLASS-SUBSTRING]

use std::collections::HashMap;
use std::time::{Duration, Instant};

use kvshared::history::{Call, CheckOptions, History, Operation, Return, Verdict, check};
use rand::rngs::SmallRng;
use rand::{RngExt, SeedableRng};

fn history(ops: usize, clients: u32, keys: u32, unknown_percent: u32, seed: u64) -> History {
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
            let unknown = rng.random_range(0..100u32) < unknown_percent;
            // A lost write may not have happened at all.
            let happened = !unknown || rng.random_range(0..2u8) == 0;
            planned.push((effect, client, call, ret, key, kind, unknown, happened));
            t = ret + rng.random_range(100..2_000u64);
        }
    }
    planned.sort_unstable();
    let mut map: HashMap<u32, String> = HashMap::new();
    let operations = planned
        .into_iter()
        .enumerate()
        .map(|(i, (_, client, call_ns, return_ns, key, kind, unknown, happened))| {
            let (call, ret) = match kind {
                0..=5 => (
                    Call::Get,
                    Return::Value {
                        value: map.get(&key).cloned(),
                    },
                ),
                6..=8 => {
                    let v = format!("v{i}");
                    if happened {
                        map.insert(key, v.clone());
                    }
                    (Call::Put { value: v }, Return::Stored)
                }
                _ => (
                    Call::Delete,
                    Return::Deleted {
                        existed: happened && map.remove(&key).is_some(),
                    },
                ),
            };
            Operation {
                client,
                key: format!("key{key}"),
                call,
                ret: if unknown { Return::Unknown } else { ret },
                call_ns,
                return_ns,
            }
        })
        .collect();
    History { operations }
}

/// One class of history: (label, ops, clients, keys, unknown %).
type Class = (&'static str, usize, u32, u32, u32);

const CLASSES: &[Class] = &[
    ("many keys, few clients", 1_000, 16, 1_000, 0),
    ("many keys, few clients", 100_000, 16, 1_000, 0),
    ("many keys, few clients", 1_000_000, 16, 1_000, 0),
    ("few keys", 100_000, 16, 10, 0),
    ("few keys, 5% unknown", 100_000, 16, 10, 5),
    ("few keys, 20% unknown", 100_000, 16, 10, 20),
    ("one key, 8 clients", 10_000, 8, 1, 0),
    ("one key, 16 clients", 1_000, 16, 1, 0),
    ("one key, 16 clients", 10_000, 16, 1, 0),
    ("one key, 16 clients, 5% unknown", 1_000, 16, 1, 5),
    ("one key, 16 clients, 20% unknown", 1_000, 16, 1, 20),
    ("one key, 32 clients", 1_000, 32, 1, 0),
    ("one key, 64 clients", 1_000, 64, 1, 0),
];

/// Each check gives up (and the table says so) after this long.
const DEADLINE: Duration = Duration::from_secs(10);

/// Seconds to check `h`, or `None` if the deadline passed.
fn time(h: &History, prune: bool) -> Option<f64> {
    let options = CheckOptions {
        deadline: Some(DEADLINE),
        threads: 1,
        prune,
    };
    let start = Instant::now();
    let report = check(h, &options);
    let secs = start.elapsed().as_secs_f64();
    match report.verdict {
        Verdict::Linearizable => Some(secs),
        Verdict::Unknown { .. } => None,
        v => panic!("a generated history must be linearizable: {v:?}"),
    }
}

fn main() {
    let only = std::env::args().skip(1).find(|a| !a.starts_with('-'));
    println!(
        "{:<34} {:>9} {:>8} {:>5} {:>8} {:>12} {:>16} {:>7}",
        "class", "ops", "clients", "keys", "unknown", "checker", "porcupine-style", "ratio"
    );
    for &(label, ops, clients, keys, unknown) in CLASSES {
        if only.as_deref().is_some_and(|o| !label.contains(o)) {
            continue;
        }
        let h = history(ops, clients, keys, unknown, 42);
        let ours = time(&h, true);
        let plain = time(&h, false);
        let show = |t: Option<f64>| t.map_or(format!(">{} s", DEADLINE.as_secs()), |t| format!("{t:.4} s"));
        let ratio = match (ours, plain) {
            (Some(a), Some(b)) => format!("{:.2}", a / b),
            (Some(_), None) => "<<1".to_string(),
            _ => "-".to_string(),
        };
        println!(
            "{label:<34} {ops:>9} {clients:>8} {keys:>5} {unknown:>7}% {:>12} {:>16} {ratio:>7}",
            show(ours),
            show(plain),
        );
    }
}
