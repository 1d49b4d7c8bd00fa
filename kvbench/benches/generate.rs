//! kvbench's cost of making an op, no network: how many nanoseconds one core spends drawing
//! YCSB ops into batches and encoding each batch as the frame the client sends (a
//! benchmark, not a test).
//!
//!     cargo bench -p kvbench --bench generate
//!
//! The headline workload (1,000,000 records, decimal keys, 128-byte values, YCSB-B,
//! zipfian 0.99, scrambled) at batch 64 and 8192, one node; the best of five rounds.

use std::time::Instant;

use kvbench::engine::BatchFiller;
use kvbench::workload::{Shared, SpecOptions, Workload, WorkloadSpec};
use kvshared::frame::{AlignedVec, FrameKind};
use kvshared::slots::SlotTable;
use kvshared::wire::encode_frame;

const OPS: u64 = 4_000_000;

fn round(batch: usize, encode: bool) -> f64 {
    let spec = WorkloadSpec::new(
        Workload::B,
        &SpecOptions {
            records: 1_000_000,
            value_size: 128,
            ..SpecOptions::default()
        },
    );
    let shared = Shared::new(spec, 1);
    let slots = std::sync::Arc::new(SlotTable::for_client(1));
    let mut filler = BatchFiller::new(shared, 7, (1, slots), batch, false);
    let mut frame = AlignedVec::new();
    let mut made = 0u64;
    let began = Instant::now();
    while made < OPS {
        let lane = filler.fill("");
        if encode {
            encode_frame(FrameKind::BatchRequest, made, filler.request(lane), &mut frame).expect("encode");
        }
        made += filler.take_counts(lane).iter().sum::<u64>();
    }
    std::hint::black_box(&frame);
    began.elapsed().as_nanos() as f64 / made as f64
}

fn main() {
    for batch in [64, 8192] {
        for encode in [false, true] {
            let best = (0..5).map(|_| round(batch, encode)).fold(f64::INFINITY, f64::min);
            let what = if encode { "draw + encode" } else { "draw" };
            println!("batch {batch:>5}, {what:<13}: {best:6.1} ns/op");
        }
    }
}
