//! How a benchmark shows itself in the dashboard (`kvbench run --tui`).
//!
//! kvtui does not know kvbench; kvbench implements [`BenchSource`] and the dashboard polls it
//! once per frame.

use std::time::Duration;

/// A benchmark's progress at one instant.
#[derive(Debug, Clone, Default)]
pub struct BenchProgress {
    pub title: String,
    pub elapsed: Duration,
    pub warmup: Duration,
    /// Warm-up plus measured time.
    pub total: Duration,
    /// Ops completed so far (warm-up included): the live throughput comes from this.
    pub completed_ops: u64,
    /// Ops completed inside the measured window: what the run's summary will count.
    pub measured_ops: u64,
    pub failed_ops: u64,
    /// Latency percentiles (p50, p99) in microseconds of batches completed since the last poll.
    pub recent_latency_us: Option<(f64, f64)>,
    pub done: bool,
}

/// Anything that can report benchmark progress.
pub trait BenchSource: Send + Sync {
    fn progress(&self) -> BenchProgress;
}
