//! Latency histograms: HDR histograms in nanoseconds, their summaries, and their portable
//! form (HdrHistogram's V2 deflate encoding in base64, readable by any HdrHistogram tool).
//!
//! Results from several client machines are combined by adding histograms, never by
//! averaging percentiles.

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use hdrhistogram::Histogram;
use hdrhistogram::serialization::{Deserializer, Serializer, V2DeflateSerializer};
use serde::{Deserialize, Serialize};

pub type Hist = Histogram<u64>;

/// An empty auto-resizing histogram with 3 significant figures.
pub fn new_hist() -> Hist {
    // 3 significant figures is always a valid precision.
    Histogram::new(3).unwrap_or_else(|_| unreachable!("sigfig 3 is valid"))
}

/// The portable text form of a histogram.
pub fn encode(h: &Hist) -> anyhow::Result<String> {
    let mut bytes = Vec::new();
    V2DeflateSerializer::new()
        .serialize(h, &mut bytes)
        .map_err(|e| anyhow::anyhow!("cannot encode histogram: {e:?}"))?;
    Ok(STANDARD.encode(bytes))
}

/// Reads a histogram written by [`encode`] (or any V2 HdrHistogram encoder).
pub fn decode(text: &str) -> anyhow::Result<Hist> {
    let bytes = STANDARD.decode(text)?;
    let mut h: Hist = Deserializer::new()
        .deserialize(&mut bytes.as_slice())
        .map_err(|e| anyhow::anyhow!("cannot decode histogram: {e:?}"))?;
    h.auto(true);
    Ok(h)
}

/// Percentiles of one histogram, in microseconds.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct LatencySummary {
    pub count: u64,
    pub mean_us: f64,
    pub p50_us: f64,
    pub p90_us: f64,
    pub p99_us: f64,
    pub p999_us: f64,
    pub max_us: f64,
}

impl LatencySummary {
    pub fn of(h: &Hist) -> LatencySummary {
        if h.is_empty() {
            return LatencySummary::default();
        }
        let us = |ns: u64| ns as f64 / 1000.0;
        LatencySummary {
            count: h.len(),
            mean_us: h.mean() / 1000.0,
            p50_us: us(h.value_at_quantile(0.50)),
            p90_us: us(h.value_at_quantile(0.90)),
            p99_us: us(h.value_at_quantile(0.99)),
            p999_us: us(h.value_at_quantile(0.999)),
            max_us: us(h.max()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::rngs::SmallRng;
    use rand::{RngExt, SeedableRng};

    #[test]
    fn encoding_round_trips() {
        let mut h = new_hist();
        for v in [1_000, 5_000, 5_000, 90_000, 12_345_678] {
            h.record(v).unwrap();
        }
        let back = decode(&encode(&h).unwrap()).unwrap();
        assert_eq!(back, h);
    }

    #[test]
    fn merged_halves_give_the_percentiles_of_one_combined_run() {
        let mut rng = SmallRng::seed_from_u64(3);
        let (mut a, mut b, mut whole) = (new_hist(), new_hist(), new_hist());
        for i in 0..100_000 {
            // Two clients with different latency profiles.
            let v = if i % 2 == 0 {
                rng.random_range(1_000..50_000)
            } else {
                rng.random_range(20_000..2_000_000)
            };
            if i % 2 == 0 { &mut a } else { &mut b }.record(v).unwrap();
            whole.record(v).unwrap();
        }
        // Through the portable form, as `kvbench merge` does.
        let mut merged = decode(&encode(&a).unwrap()).unwrap();
        merged.add(decode(&encode(&b).unwrap()).unwrap()).unwrap();
        assert_eq!(LatencySummary::of(&merged), LatencySummary::of(&whole));
    }
}
