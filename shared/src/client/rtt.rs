//! When a connection counts as stalled: derived from the round trips it has seen, as TCP
//! derives its retransmission timeout (RFC 6298: SRTT and RTTVAR, gains 1/8 and 1/4), with
//! a floor and a ceiling.
//!
//! A fixed second misfired on busy but healthy nodes: at batch 8192 on a loaded machine a
//! round trip can take seconds, and `kvbench run` failed 327,680 ops as "stalled" with the
//! node answering all along. A frozen node must still be caught in about a second at small
//! batches, where round trips take milliseconds: there the floor decides.

use std::time::Duration;

/// The shortest stall threshold (TCP's minimum RTO; a frozen node at batch 64 is caught
/// this soon).
pub const STALL_FLOOR: Duration = Duration::from_secs(1);
/// The longest: a node silent this long is stalled whatever its past round trips.
pub const STALL_CEILING: Duration = Duration::from_secs(30);
/// How many times TCP's timeout (SRTT + 4 RTTVAR) a request may wait before the node counts
/// as stalled: a stall fails callers' ops (TCP only resends), so it must be rarer than a
/// retransmission.
const SAFETY: u32 = 3;

/// The smoothed round trip and its variation, in nanoseconds (0: no sample yet).
#[derive(Debug, Default, Clone, Copy)]
pub struct RttEstimate {
    srtt_ns: u64,
    rttvar_ns: u64,
}

impl RttEstimate {
    /// Takes one round trip into account.
    pub fn sample(&mut self, rtt: Duration) {
        let r = u64::try_from(rtt.as_nanos()).unwrap_or(u64::MAX);
        if self.srtt_ns == 0 {
            self.srtt_ns = r.max(1);
            self.rttvar_ns = r / 2;
        } else {
            let err = self.srtt_ns.abs_diff(r);
            self.rttvar_ns = self.rttvar_ns - self.rttvar_ns / 4 + err / 4;
            self.srtt_ns = (self.srtt_ns - self.srtt_ns / 8 + r / 8).max(1);
        }
    }

    /// How long requests may wait with no reply before the connection counts as stalled.
    pub fn stall_after(&self) -> Duration {
        let rto = self.srtt_ns.saturating_add(self.rttvar_ns.saturating_mul(4));
        Duration::from_nanos(rto.saturating_mul(u64::from(SAFETY))).clamp(STALL_FLOOR, STALL_CEILING)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    #[test]
    fn small_round_trips_keep_the_floor() {
        let mut e = RttEstimate::default();
        assert_eq!(e.stall_after(), STALL_FLOOR);
        for _ in 0..100 {
            e.sample(MS);
        }
        assert_eq!(e.stall_after(), STALL_FLOOR);
    }

    #[test]
    fn slow_varying_round_trips_raise_the_threshold_up_to_the_ceiling() {
        let mut e = RttEstimate::default();
        for i in 0..200 {
            e.sample(if i % 2 == 0 { 300 * MS } else { 900 * MS });
        }
        let t = e.stall_after();
        assert!(t > 3 * Duration::from_secs(1), "{t:?}");
        assert!(t <= STALL_CEILING);
        for _ in 0..50 {
            e.sample(Duration::from_secs(3600));
        }
        assert_eq!(e.stall_after(), STALL_CEILING);
    }

    #[test]
    fn it_comes_back_down_when_round_trips_do() {
        let mut e = RttEstimate::default();
        for _ in 0..50 {
            e.sample(2000 * MS);
        }
        assert!(e.stall_after() > 5 * Duration::from_secs(1));
        for _ in 0..200 {
            e.sample(MS);
        }
        assert_eq!(e.stall_after(), STALL_FLOOR);
    }

    proptest::proptest! {
        #[test]
        fn any_samples_give_a_threshold_within_bounds(samples in proptest::collection::vec(0u64..u64::MAX, 0..64)) {
            let mut e = RttEstimate::default();
            for s in samples {
                e.sample(Duration::from_nanos(s));
            }
            let t = e.stall_after();
            proptest::prop_assert!(t >= STALL_FLOOR && t <= STALL_CEILING);
        }
    }
}
