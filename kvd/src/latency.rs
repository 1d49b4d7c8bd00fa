//! Recording service times into the fixed buckets of [`kvshared::latency`], from every
//! connection at once without a lock: one relaxed `fetch_add` per op kind per batch, on a
//! stripe of the calling thread (so two worker threads do not share the cache lines they
//! write).

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

use crossbeam::utils::CachePadded;
use kvshared::latency::{BUCKETS, Latency, bucket_of};

/// Stripes of the op-kind histograms: more than worker threads are likely to be.
const STRIPES: usize = 8;

/// The op kinds timed: get, put (conditional ones too), delete.
pub const KINDS: usize = 3;

/// One histogram's counters.
pub struct Buckets {
    counts: [AtomicU64; BUCKETS],
    sum_ns: AtomicU64,
}

impl Default for Buckets {
    fn default() -> Self {
        Buckets {
            counts: std::array::from_fn(|_| AtomicU64::new(0)),
            sum_ns: AtomicU64::new(0),
        }
    }
}

impl Buckets {
    /// Counts `n` values of `ns` each.
    #[inline]
    pub fn record_n(&self, ns: u64, n: u64) {
        if n > 0 {
            self.counts[bucket_of(ns)].fetch_add(n, Ordering::Relaxed);
            self.sum_ns.fetch_add(ns.saturating_mul(n), Ordering::Relaxed);
        }
    }

    fn add_to(&self, dense: &mut [u64], sum: &mut u64) {
        for (d, c) in dense.iter_mut().zip(&self.counts) {
            *d += c.load(Ordering::Relaxed);
        }
        *sum += self.sum_ns.load(Ordering::Relaxed);
    }

    /// A snapshot.
    pub fn snapshot(&self) -> Latency {
        let (mut dense, mut sum) = (vec![0; BUCKETS], 0);
        self.add_to(&mut dense, &mut sum);
        Latency::from_dense(&dense, sum)
    }
}

/// The node's per-op-kind service times.
pub struct OpLatencies {
    stripes: Box<[CachePadded<[Buckets; KINDS]>]>,
}

impl Default for OpLatencies {
    fn default() -> Self {
        OpLatencies {
            stripes: (0..STRIPES)
                .map(|_| CachePadded::new(std::array::from_fn(|_| Buckets::default())))
                .collect(),
        }
    }
}

/// This thread's stripe, given out round-robin as threads first record.
fn stripe() -> usize {
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    thread_local! {
        static STRIPE: usize = NEXT.fetch_add(1, Ordering::Relaxed) % STRIPES;
    }
    STRIPE.with(|s| *s)
}

impl OpLatencies {
    /// Records a batch that took `ns` and held `per_kind` ops of each kind (each op waited
    /// as long as its batch).
    #[inline]
    pub fn record(&self, per_kind: [u64; KINDS], ns: u64) {
        let stripe = &self.stripes[stripe()];
        for (b, n) in stripe.iter().zip(per_kind) {
            b.record_n(ns, n);
        }
    }

    /// The totals over all stripes: get, put, delete.
    pub fn snapshot(&self) -> [Latency; KINDS] {
        std::array::from_fn(|k| {
            let (mut dense, mut sum) = (vec![0; BUCKETS], 0);
            for s in self.stripes.iter() {
                s[k].add_to(&mut dense, &mut sum);
            }
            Latency::from_dense(&dense, sum)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_from_many_threads_add_up_per_kind() {
        let l = std::sync::Arc::new(OpLatencies::default());
        let threads: Vec<_> = (0..4)
            .map(|_| {
                let l = l.clone();
                std::thread::spawn(move || {
                    for _ in 0..100 {
                        l.record([3, 1, 0], 10_000);
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        let [get, put, delete] = l.snapshot();
        assert_eq!((get.count(), put.count(), delete.count()), (1200, 400, 0));
        assert_eq!(get.sum_ns, 1200 * 10_000);
        let p50 = get.quantile_ns(0.5).unwrap();
        assert!((8_000..12_500).contains(&p50), "{p50}");
    }
}
