//! Hot-path counters: striped, cache-padded atomics, added to once per batch.
//!
//! A connection accumulates a [`BatchTally`] locally and adds it to its own stripe; the stats
//! reader sums the stripes. No lock and no shared cache line on the request path.

use std::sync::atomic::{AtomicU64, Ordering};

use crossbeam::utils::CachePadded;

use crate::store::BatchTally;

/// Every counter kvd keeps, as an index into a stripe.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(usize)]
pub enum Counter {
    Gets,
    Puts,
    Deletes,
    Hits,
    Misses,
    Batches,
    BytesIn,
    BytesOut,
    ConnsOpened,
    ConnsClosed,
    WrongShard,
    MalformedOp,
    MalformedBody,
    BadFrame,
    FrameTooLarge,
    Io,
}

const COUNTERS: usize = Counter::Io as usize + 1;
const STRIPES: usize = 16;

type Stripe = CachePadded<[AtomicU64; COUNTERS]>;

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
    /// Adds `v` to counter `c` on the stripe of connection `conn`.
    #[inline]
    pub fn add(&self, conn: u64, c: Counter, v: u64) {
        if v != 0 {
            self.stripes[conn as usize % STRIPES][c as usize].fetch_add(v, Ordering::Relaxed);
        }
    }

    /// Adds a batch's tally (plus the frame bytes it cost) to connection `conn`'s stripe.
    pub fn add_tally(&self, conn: u64, t: &Tally) {
        let b = &t.batch;
        for (c, v) in [
            (Counter::Gets, b.gets),
            (Counter::Puts, b.puts),
            (Counter::Deletes, b.deletes),
            (Counter::Hits, b.hits),
            (Counter::Misses, b.misses),
            (Counter::WrongShard, b.wrong_shard),
            (Counter::MalformedOp, b.malformed),
            (Counter::Batches, t.batches),
            (Counter::BytesIn, t.bytes_in),
            (Counter::BytesOut, t.bytes_out),
        ] {
            self.add(conn, c, v);
        }
    }

    /// The total of counter `c` over all stripes.
    pub fn total(&self, c: Counter) -> u64 {
        self.stripes.iter().map(|s| s[c as usize].load(Ordering::Relaxed)).sum()
    }
}

/// What one connection has done since it last added to the shared counters.
#[derive(Default, Debug, Clone, Copy)]
pub struct Tally {
    pub batch: BatchTally,
    pub batches: u64,
    pub bytes_in: u64,
    pub bytes_out: u64,
}

impl Tally {
    pub fn add_batch(&mut self, b: &BatchTally) {
        let t = &mut self.batch;
        t.gets += b.gets;
        t.puts += b.puts;
        t.deletes += b.deletes;
        t.hits += b.hits;
        t.misses += b.misses;
        t.wrong_shard += b.wrong_shard;
        t.malformed += b.malformed;
        self.batches += 1;
    }

    /// Moves the tally into the shared counters and starts again from zero.
    pub fn flush(&mut self, counters: &Counters, conn: u64) {
        counters.add_tally(conn, self);
        *self = Tally::default();
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
        let mut t = Tally::default();
        t.add_batch(&BatchTally {
            puts: 3,
            ..Default::default()
        });
        t.bytes_in = 10;
        t.flush(&c, 5);
        assert_eq!(c.total(Counter::Gets), 80);
        assert_eq!(c.total(Counter::Puts), 3);
        assert_eq!(c.total(Counter::Batches), 1);
        assert_eq!(c.total(Counter::BytesIn), 10);
        assert_eq!(t.batches, 0);
    }
}
