//! `--ttl`: writes that expire. Every put of a load or a run sets a time to live drawn
//! uniformly from a range (`10s`, or `10s..60s`), as a cache does; the server resolves it
//! against its own clock (`SET key value PX ms`).

use kvshared::client::NodeBatches;
use kvshared::expiry::{Deadline, MAX_TTL_MS, PutIf, PutTtl, PutWith};
use kvshared::wire::OpKind;
use rand::RngExt;
use rand::rngs::SmallRng;
use serde::{Deserialize, Serialize};

/// Times to live in milliseconds, from `min` to `max` inclusive.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TtlRange {
    pub min_ms: u64,
    pub max_ms: u64,
}

impl TtlRange {
    /// One time to live from the range.
    pub fn draw(&self, rng: &mut SmallRng) -> u64 {
        rng.random_range(self.min_ms..=self.max_ms)
    }

    /// `10s` or `10s..60s` (humantime durations).
    pub fn parse(text: &str) -> Result<TtlRange, String> {
        let ms = |t: &str| -> Result<u64, String> {
            let d = humantime::parse_duration(t.trim()).map_err(|e| format!("{t}: {e}"))?;
            let ms = d.as_millis();
            if ms == 0 || ms > u128::from(MAX_TTL_MS) {
                return Err(format!("{t} is not a time to live: give 1ms or more"));
            }
            Ok(ms as u64)
        };
        let (min, max) = match text.split_once("..") {
            Some((a, b)) => (ms(a)?, ms(b)?),
            None => (ms(text)?, ms(text)?),
        };
        if min > max {
            return Err(format!("{text}: the first time to live is longer than the second"));
        }
        Ok(TtlRange {
            min_ms: min,
            max_ms: max,
        })
    }

    /// How it reads in a summary.
    pub fn describe(&self) -> String {
        let d = |ms: u64| humantime::format_duration(std::time::Duration::from_millis(ms)).to_string();
        if self.min_ms == self.max_ms {
            d(self.min_ms)
        } else {
            format!("{}..{}", d(self.min_ms), d(self.max_ms))
        }
    }
}

/// Adds a put of `value` under `key` to `lane`'s batch: a plain put, or with `ttl` a put
/// with a time to live drawn from it (`arg` is reused for its encoding).
pub fn push_put(
    batches: &mut NodeBatches,
    lane: usize,
    key: &[u8],
    value: &[u8],
    ttl: Option<(TtlRange, &mut SmallRng)>,
    arg: &mut Vec<u8>,
) {
    match ttl {
        None => batches.push_to(lane, OpKind::Put, key, value),
        Some((range, rng)) => {
            let put = PutWith {
                cond: PutIf::Always,
                ttl: PutTtl::Until(Deadline::In(range.draw(rng))),
                value,
            };
            arg.clear();
            put.encode_into(arg);
            batches.push_to(lane, OpKind::PutWith, key, arg)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_parse_and_refuse_what_is_not_one() {
        assert_eq!(
            TtlRange::parse("10s"),
            Ok(TtlRange {
                min_ms: 10_000,
                max_ms: 10_000
            })
        );
        assert_eq!(
            TtlRange::parse("1s..1m"),
            Ok(TtlRange {
                min_ms: 1_000,
                max_ms: 60_000
            })
        );
        assert!(TtlRange::parse("0s").is_err());
        assert!(TtlRange::parse("1m..1s").is_err());
        assert!(TtlRange::parse("soon").is_err());
    }
}
