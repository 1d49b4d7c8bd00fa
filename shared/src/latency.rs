//! Service-time histograms with fixed log-scale buckets, as kvd keeps them and every tool
//! reads them.
//!
//! Fixed buckets (rather than an HDR histogram per recorder) because kvd records into atomic
//! counters from every connection without a lock, because two cumulative snapshots subtract
//! into the histogram of the time between them (which is how kvtui shows "p99 over the last
//! second" from counters kept since start), and because Prometheus histograms are exactly
//! this: cumulative counts under fixed upper bounds. Four buckets per doubling bound the
//! error of a quantile to under 19% of its value, which is enough to see which node or map
//! shard is slow.

use rkyv::{Archive, Deserialize as RkyvDeserialize, Serialize as RkyvSerialize};
use serde::{Deserialize, Serialize};

/// Buckets per doubling of the value.
const PER_DOUBLING: u32 = 4;
/// Values below 2^FIRST_BIT ns (256 ns) all fall in bucket 0.
const FIRST_BIT: u32 = 8;
/// Buckets in all: 256 ns up to about 2^35 ns (34 s) in steps of 2^(1/4); the last bucket
/// takes everything above.
pub const BUCKETS: usize = ((35 - FIRST_BIT) * PER_DOUBLING + 1) as usize;

/// The bucket a value of `ns` nanoseconds falls in.
#[inline]
pub fn bucket_of(ns: u64) -> usize {
    if ns < 1 << FIRST_BIT {
        return 0;
    }
    let msb = 63 - ns.leading_zeros();
    let sub = ((ns >> (msb - 2)) & 0b11) as u32;
    (((msb - FIRST_BIT) * PER_DOUBLING + sub + 1) as usize).min(BUCKETS - 1)
}

/// The smallest value in bucket `i`, in ns.
pub fn lower_ns(i: usize) -> u64 {
    if i == 0 {
        return 0;
    }
    let i = i as u32 - 1;
    let msb = FIRST_BIT + i / PER_DOUBLING;
    let sub = (i % PER_DOUBLING) as u64;
    (1u64 << msb) + (sub << (msb - 2))
}

/// The largest value in bucket `i` (exclusive), in ns; `u64::MAX` for the last.
pub fn upper_ns(i: usize) -> u64 {
    if i + 1 >= BUCKETS { u64::MAX } else { lower_ns(i + 1) }
}

/// A histogram of service times: (bucket, count) for the buckets that are not empty, in
/// bucket order, and the sum of all values (for means and Prometheus's `_sum`).
#[derive(Archive, RkyvSerialize, RkyvDeserialize, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
pub struct Latency {
    /// `[bucket, count]` pairs, ascending by bucket, no zero counts.
    pub buckets: Vec<(u32, u64)>,
    /// Sum of the recorded values in ns.
    pub sum_ns: u64,
}

impl Latency {
    /// From dense per-bucket counts.
    pub fn from_dense(counts: &[u64], sum_ns: u64) -> Latency {
        Latency {
            buckets: counts
                .iter()
                .enumerate()
                .filter(|&(_, &c)| c > 0)
                .map(|(i, &c)| (i as u32, c))
                .collect(),
            sum_ns,
        }
    }

    /// Per-bucket counts, `BUCKETS` long (buckets out of range from a peer are ignored).
    pub fn dense(&self) -> Vec<u64> {
        let mut d = vec![0; BUCKETS];
        for &(i, c) in &self.buckets {
            if let Some(slot) = d.get_mut(i as usize) {
                *slot += c;
            }
        }
        d
    }

    /// Values recorded.
    pub fn count(&self) -> u64 {
        self.buckets.iter().map(|&(_, c)| c).sum()
    }

    /// Both histograms together.
    pub fn merged(&self, other: &Latency) -> Latency {
        let mut d = self.dense();
        for (a, b) in d.iter_mut().zip(other.dense()) {
            *a += b;
        }
        Latency::from_dense(&d, self.sum_ns.saturating_add(other.sum_ns))
    }

    /// What was recorded after `before` (an earlier snapshot of the same counters). A
    /// restarted node's counters start again from zero: then everything in `self` is new.
    pub fn since(&self, before: &Latency) -> Latency {
        let (now, then) = (self.dense(), before.dense());
        if now.iter().zip(&then).any(|(n, t)| n < t) {
            return self.clone();
        }
        let d: Vec<u64> = now.iter().zip(&then).map(|(n, t)| n - t).collect();
        Latency::from_dense(&d, self.sum_ns.saturating_sub(before.sum_ns))
    }

    /// The `q` quantile (0..=1) in ns, as the geometric middle of its bucket; `None` when
    /// nothing was recorded.
    pub fn quantile_ns(&self, q: f64) -> Option<u64> {
        let total = self.count();
        if total == 0 {
            return None;
        }
        let rank = ((q.clamp(0.0, 1.0) * total as f64).ceil() as u64).max(1);
        let mut seen = 0;
        for &(i, c) in &self.buckets {
            seen += c;
            if seen >= rank {
                let i = i as usize;
                let (lo, hi) = (lower_ns(i), upper_ns(i));
                return Some(match (lo, hi) {
                    (0, hi) => hi / 2,
                    (lo, u64::MAX) => lo,
                    (lo, hi) => ((lo as f64) * (hi as f64)).sqrt() as u64,
                });
            }
        }
        None
    }

    /// The mean in ns, if anything was recorded.
    pub fn mean_ns(&self) -> Option<u64> {
        let n = self.count();
        (n > 0).then(|| self.sum_ns / n)
    }
}

/// A node's service times: from the start of executing a batch to its reply being ready
/// (for ops that go through a durable node's log, to the log's answer), counted once per
/// op, by op kind; and per internal map shard, the time a sampled batch spent on that
/// shard's ops (lock wait included), counted once per batch and shard.
#[derive(Archive, RkyvSerialize, RkyvDeserialize, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
pub struct LatencyStats {
    /// Gets.
    pub get: Latency,
    /// Puts, conditional ones included.
    pub put: Latency,
    /// Deletes.
    pub delete: Latency,
    /// One per internal map shard, in shard order (sampled: about one batch in
    /// [`MAP_SHARD_SAMPLE_EVERY`]).
    pub map_shards: Vec<Latency>,
}

/// kvd times the map-shard groups of one batch in this many per connection (reading the
/// clock per group of every batch costs several percent at batch 64).
pub const MAP_SHARD_SAMPLE_EVERY: u32 = 16;

impl LatencyStats {
    /// Every op kind together.
    pub fn all(&self) -> Latency {
        self.get.merged(&self.put).merged(&self.delete)
    }

    /// The op kinds with their names, as in `/metrics` and `kvd stats`.
    pub fn kinds(&self) -> [(&'static str, &Latency); 3] {
        [("get", &self.get), ("put", &self.put), ("delete", &self.delete)]
    }

    /// One line for tables: `get p50 12 us p99 80 us; put ...` over the kinds that have ops,
    /// or `-` when none has.
    pub fn summary(&self) -> String {
        let parts: Vec<String> = self
            .kinds()
            .iter()
            .filter_map(|(name, l)| {
                Some(format!(
                    "{name} p50 {} p99 {}",
                    crate::units::nanos(l.quantile_ns(0.5)?),
                    crate::units::nanos(l.quantile_ns(0.99)?)
                ))
            })
            .collect();
        if parts.is_empty() { "-".into() } else { parts.join("; ") }
    }

    /// The `n` map shards with the highest p99: (shard, p99 in ns, sampled batches).
    pub fn slowest_map_shards(&self, n: usize) -> Vec<(usize, u64, u64)> {
        let mut shards: Vec<(usize, u64, u64)> = self
            .map_shards
            .iter()
            .enumerate()
            .filter_map(|(i, l)| Some((i, l.quantile_ns(0.99)?, l.count())))
            .collect();
        shards.sort_by_key(|&(i, p99, _)| (std::cmp::Reverse(p99), i));
        shards.truncate(n);
        shards
    }

    /// What was recorded after `before`.
    pub fn since(&self, before: &LatencyStats) -> LatencyStats {
        let empty = Latency::default();
        LatencyStats {
            get: self.get.since(&before.get),
            put: self.put.since(&before.put),
            delete: self.delete.since(&before.delete),
            map_shards: self
                .map_shards
                .iter()
                .enumerate()
                .map(|(i, l)| l.since(before.map_shards.get(i).unwrap_or(&empty)))
                .collect(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn buckets_tile_the_range_in_quarter_doublings() {
        assert_eq!(bucket_of(0), 0);
        assert_eq!(bucket_of(255), 0);
        assert_eq!(bucket_of(256), 1);
        assert_eq!(lower_ns(1), 256);
        assert_eq!(lower_ns(2), 320);
        assert_eq!(lower_ns(5), 512);
        for i in 1..BUCKETS - 1 {
            assert!(lower_ns(i) < upper_ns(i));
            assert_eq!(bucket_of(lower_ns(i)), i);
            assert_eq!(bucket_of(upper_ns(i) - 1), i);
            assert!(upper_ns(i) as f64 / lower_ns(i) as f64 <= 1.26);
        }
        assert_eq!(bucket_of(u64::MAX), BUCKETS - 1);
        assert!(lower_ns(BUCKETS - 1) > 30_000_000_000);
    }

    proptest! {
        /// A quantile lands within a bucket's width of the exact one.
        #[test]
        fn quantiles_are_within_a_bucket_of_exact(mut values in prop::collection::vec(300u64..10_000_000_000, 1..400), q in 0.0f64..=1.0) {
            let mut dense = vec![0; BUCKETS];
            for &v in &values {
                dense[bucket_of(v)] += 1;
            }
            let h = Latency::from_dense(&dense, values.iter().sum());
            values.sort_unstable();
            let rank = ((q * values.len() as f64).ceil() as usize).max(1);
            let exact = values[rank - 1] as f64;
            let got = h.quantile_ns(q).unwrap() as f64;
            prop_assert!(got / exact < 1.26 && exact / got < 1.26, "{got} vs {exact}");
        }

        /// Later minus earlier is what was added in between.
        #[test]
        fn since_subtracts(a in prop::collection::vec(0u64..1000, BUCKETS), b in prop::collection::vec(0u64..1000, BUCKETS)) {
            let before = Latency::from_dense(&a, 10);
            let sum: Vec<u64> = a.iter().zip(&b).map(|(x, y)| x + y).collect();
            let after = Latency::from_dense(&sum, 25);
            prop_assert_eq!(after.since(&before), Latency::from_dense(&b, 15));
        }
    }

    #[test]
    fn a_restart_makes_everything_new() {
        let before = Latency::from_dense(&[0, 5, 5], 100);
        let after = Latency::from_dense(&[0, 1], 3);
        assert_eq!(after.since(&before), after);
        assert_eq!(Latency::default().quantile_ns(0.5), None);
    }
}
