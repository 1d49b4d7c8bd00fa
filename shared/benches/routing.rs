//! What placing a key costs (a benchmark, not a test): the slot (CRC-16 of the key, for the
//! node) against the xxh3 hash (for the node's table), per key, over a million decimal keys
//! as kvbench makes them.
//!
//!     cargo bench -p kvshared --bench routing

use std::hint::black_box;
use std::time::Instant;

use kvshared::routing::{key_hash, key_slot, owner_node};

fn per_key(keys: &[Vec<u8>], f: impl Fn(&[u8]) -> u64) -> f64 {
    let mut best = f64::MAX;
    for _ in 0..5 {
        let t = Instant::now();
        let mut sum = 0u64;
        for k in keys {
            sum = sum.wrapping_add(f(black_box(k)));
        }
        black_box(sum);
        best = best.min(t.elapsed().as_secs_f64() * 1e9 / keys.len() as f64);
    }
    best
}

fn main() {
    for (name, make) in [
        (
            "decimal keys (0..1M)",
            (|i: u64| i.to_string().into_bytes()) as fn(u64) -> Vec<u8>,
        ),
        ("user keys (user + 19 digits)", |i: u64| {
            format!("user{:019}", i.wrapping_mul(0x9E37_79B9_7F4A_7C15)).into_bytes()
        }),
    ] {
        let keys: Vec<Vec<u8>> = (0..1_000_000u64).map(make).collect();
        let slot = per_key(&keys, |k| u64::from(key_slot(k)));
        let owner = per_key(&keys, |k| u64::from(owner_node(k, 3)));
        let hash = per_key(&keys, key_hash);
        println!("{name}: key_slot {slot:.1} ns, owner_node {owner:.1} ns, key_hash (xxh3) {hash:.1} ns per key");
    }
}
