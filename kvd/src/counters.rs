//! Hot-path counters: striped, cache-padded atomics.
//!
//! The counters themselves are declared once, in `kvshared::stats` ([`Counter`], [`Counts`]).
//! A connection adds what its batches did to a local [`Counts`] and publishes that to its own
//! stripe now and then (see `connection`); the stats reader sums the stripes. No lock and no
//! shared cache line on the request path.

use std::sync::atomic::{AtomicU64, Ordering};

use crossbeam::utils::CachePadded;
use kvshared::stats::{Counter, Counts};

const STRIPES: usize = 16;

type Stripe = CachePadded<[AtomicU64; Counter::COUNT]>;

/// The node's counters.
pub struct Counters {
    stripes: Box<[Stripe]>,
}

impl Default for Counters {
    fn default() -> Self {
        Counters {
            stripes: (0..STRIPES)
                .map(|_| CachePadded::new(std::array::from_fn(|_| AtomicU64::new(0))))
                .collect(),
        }
    }
}

impl Counters {
    fn stripe(&self, conn: u64) -> &Stripe {
        &self.stripes[conn as usize % STRIPES]
    }

    /// Adds `v` to counter `c` on the stripe of connection `conn`.
    #[inline]
    pub fn add(&self, conn: u64, c: Counter, v: u64) {
        if v != 0 {
            self.stripe(conn)[c as usize].fetch_add(v, Ordering::Relaxed);
        }
    }

    /// Adds every counter of `counts` to connection `conn`'s stripe.
    pub fn add_counts(&self, conn: u64, counts: &Counts) {
        for &c in Counter::ALL {
            self.add(conn, c, counts.get(c));
        }
    }

    /// The totals over all stripes.
    pub fn totals(&self) -> Counts {
        let mut t = Counts::default();
        for stripe in self.stripes.iter() {
            for &c in Counter::ALL {
                *t.get_mut(c) += stripe[c as usize].load(Ordering::Relaxed);
            }
        }
        t
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn totals_sum_over_stripes() {
        let c = Counters::default();
        for conn in 0..40 {
            c.add(conn, Counter::Gets, 2);
        }
        let local = Counts {
            puts: 3,
            batches: 1,
            bytes_in: 10,
            ..Counts::default()
        };
        c.add_counts(5, &local);
        let t = c.totals();
        assert_eq!((t.gets, t.puts, t.batches, t.bytes_in), (80, 3, 1, 10));
    }
}
