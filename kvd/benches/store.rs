//! The store alone, no network: how many ops per second one core executes from validated
//! batches (a benchmark, not a test).
//!
//!     cargo bench -p kvd --bench store
//!
//! 1,000,000 records of 128 bytes (decimal keys), batches of 8192 YCSB-B-like ops (95% get,
//! 5% put), keys drawn uniformly (every lookup likely a cache miss) or from the 1,000 hottest
//! records (mostly cache hits). Each batch is encoded once with rkyv and validated by
//! `BatchView::parse` on every execution, as kvd does per frame.

use std::time::Instant;

use kvd::store::{Scratch, Store, Unbounded};
use kvshared::frame::{AlignedVec, FrameKind, HEADER_LEN};
use kvshared::routing::ShardId;
use kvshared::stats::Counts;
use kvshared::wire::{BatchRequest, BatchResponse, BatchView, encode_frame};
use rand::rngs::SmallRng;
use rand::{RngExt, SeedableRng};

/// As in kvd's binary (the store's memory model assumes it).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

const RECORDS: u64 = 1_000_000;
const BATCH: usize = 8192;

fn body(req: &BatchRequest) -> AlignedVec {
    let mut frame = AlignedVec::new();
    encode_frame(FrameKind::BatchRequest, 1, req, &mut frame).expect("encode");
    let mut body = AlignedVec::new();
    body.extend_from_slice(&frame[HEADER_LEN..]);
    body
}

fn main() {
    let store = Store::new(ShardId::SOLO, 64, RECORDS as usize).expect("store");
    let value = [7u8; 128];
    let mut out = BatchResponse::default();
    let mut scratch = Scratch::default();
    let mut tally = Counts::default();
    let mut load = BatchRequest::new();
    for i in 0..RECORDS {
        load.push_put(i.to_string().as_bytes(), &value);
        if load.len() == BATCH || i + 1 == RECORDS {
            let b = body(&load);
            store.execute(
                &BatchView::parse(&b).expect("valid"),
                &mut out,
                &mut Unbounded,
                &mut scratch,
                &mut tally,
            );
            load.clear();
        }
    }
    let mut rng = SmallRng::seed_from_u64(1);
    // `cargo bench -p kvd --bench store -- hottest` runs only the rows naming it (to profile one).
    let only: Vec<String> = std::env::args().skip(1).filter(|a| !a.starts_with('-')).collect();
    for (name, space) in [("uniform over 1,000,000", RECORDS), ("hottest 1,000", 1_000)] {
        if !only.is_empty() && !only.iter().any(|o| name.contains(o.as_str())) {
            continue;
        }
        let batches: Vec<AlignedVec> = (0..64)
            .map(|_| {
                let mut req = BatchRequest::new();
                for _ in 0..BATCH {
                    let key = rng.random_range(0..space).to_string();
                    if rng.random_range(0..100) < 95 {
                        req.push_get(key.as_bytes());
                    } else {
                        req.push_put(key.as_bytes(), &value);
                    }
                }
                body(&req)
            })
            .collect();
        let rounds = 20;
        let start = Instant::now();
        for _ in 0..rounds {
            for b in &batches {
                let view = BatchView::parse(b).expect("valid");
                store.execute(&view, &mut out, &mut Unbounded, &mut scratch, &mut tally);
            }
        }
        let secs = start.elapsed().as_secs_f64();
        let ops = (rounds * batches.len() * BATCH) as f64;
        println!(
            "store: {name:<24} batch {BATCH}: {:>6.2}M op/s on one core ({:.0} ns/op)",
            ops / secs / 1e6,
            secs * 1e9 / ops
        );
    }
}
