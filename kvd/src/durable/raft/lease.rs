//! Bounded-staleness reads (`--reads stale --max-staleness D`): how fresh a follower's or
//! learner's store is, anchored on a round trip the member itself started.
//!
//! While clients ask it for stale reads, the member asks its leader for a read index every
//! [`PROBE_EVERY`] (the same `ReadIndex` request follower reads use), noting on its own
//! monotonic clock when it *sent* each request. The leader answers only after a heartbeat
//! round with a majority that began after the request arrived, so the index it answers
//! covers every write acknowledged before the member sent the request. Once the member has
//! applied that index, its store holds every write acknowledged before `sent`: a read it
//! runs at `now` misses at most the writes acknowledged in `now - sent`. So a read is served
//! from the store only while `now - sent <= D`, checked when the read runs (after it
//! arrived), on the member's own clock.
//!
//! The assumption is only that the member's monotonic clock runs at the rate of real time
//! (Linux's `CLOCK_MONOTONIC`, disciplined by NTP, is off by well under 0.1%: under 0.5 ms on
//! a 500 ms bound). Nothing is assumed about pauses: a member frozen after sending (SIGSTOP,
//! a long GC-like stall, a partition) finds on waking that its anchor is old, because both
//! ends of the measure are its own clock, and refuses to serve stale reads until a fresh
//! round trip. (It used to take a message *received* from the leader as fresh, and a
//! heartbeat that waited in the socket during a 3 s freeze made it serve reads 2-3 s stale.)
//! A deposed leader never serves stale reads: a leader's reads always wait for its own
//! read-index round, which a deposed one cannot complete.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// How often a member that serves stale reads asks its leader for a fresh anchor.
pub(super) const PROBE_EVERY: Duration = Duration::from_millis(50);
/// How long after the last stale read the member keeps probing.
const WANTED_FOR: Duration = Duration::from_secs(10);

/// A member's freshness anchor: the newest `(sent, index)` its leader confirmed.
pub(crate) struct Lease {
    epoch: Instant,
    anchor: parking_lot::Mutex<Option<(Instant, u64)>>,
    /// When (ms since `epoch`, plus one) a stale read last asked.
    wanted_ms: AtomicU64,
}

impl Default for Lease {
    fn default() -> Self {
        Lease {
            epoch: Instant::now(),
            anchor: parking_lot::Mutex::new(None),
            wanted_ms: AtomicU64::new(0),
        }
    }
}

impl Lease {
    /// Notes that the leader answered read index `index` to a request sent at `sent`.
    pub fn confirmed(&self, sent: Instant, index: u64) {
        let mut anchor = self.anchor.lock();
        if anchor.is_none_or(|(s, _)| sent > s) {
            *anchor = Some((sent, index));
        }
    }

    /// Whether a read that arrived before now may be answered from a store that has applied
    /// `applied`: the anchor is at most `bound` old by this member's clock, and applied.
    pub fn fresh_within(&self, bound: Duration, applied: u64) -> bool {
        let now = Instant::now();
        self.wanted_ms
            .store(now.duration_since(self.epoch).as_millis() as u64 + 1, Ordering::Relaxed);
        match *self.anchor.lock() {
            Some((sent, index)) => now.duration_since(sent) <= bound && applied >= index,
            None => false,
        }
    }

    /// Whether stale reads were asked for lately (the member probes only then).
    pub fn wanted(&self) -> bool {
        let last = self.wanted_ms.load(Ordering::Relaxed);
        last != 0 && self.epoch.elapsed().as_millis() as u64 <= last + WANTED_FOR.as_millis() as u64
    }

    /// Forgets the anchor (this member now leads, or left the group).
    pub fn reset(&self) {
        *self.anchor.lock() = None;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_anchor_is_fresh_only_within_the_bound_of_when_it_was_sent() {
        let lease = Lease::default();
        assert!(!lease.fresh_within(Duration::from_secs(1), 100), "no anchor yet");
        assert!(lease.wanted());
        let sent = Instant::now();
        lease.confirmed(sent, 10);
        assert!(lease.fresh_within(Duration::from_secs(1), 10));
        assert!(!lease.fresh_within(Duration::from_secs(1), 9), "not applied that far");
        // An older round trip answered late does not replace a newer anchor.
        lease.confirmed(sent - Duration::from_secs(5), 11);
        assert!(lease.fresh_within(Duration::from_secs(1), 10));
        std::thread::sleep(Duration::from_millis(30));
        assert!(
            !lease.fresh_within(Duration::from_millis(20), 10),
            "older than the bound"
        );
        lease.reset();
        assert!(!lease.fresh_within(Duration::from_secs(1), 10));
    }
}
