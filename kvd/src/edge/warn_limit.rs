//! Rate limits for warnings that peers can cause (malformed frames, failed connections).
//!
//! A peer sending garbage must not be able to fill the disk or the log pipe: each
//! connection logs a few such warnings at most, and the node as a whole a few per second.
//! What is held back is counted (`log_suppressed` in stats), and the next line that is
//! written says how many were suppressed before it.

use std::time::{Duration, Instant};

use parking_lot::Mutex;

/// Warnings one connection may log; later ones are only counted.
pub const PER_CONNECTION: u32 = 3;
/// Warnings the node may log per second, over all connections.
pub const PER_SECOND: u32 = 20;

/// The node-wide limit (a lock taken only on the warning path, never per request).
pub struct WarnLimit {
    state: Mutex<Window>,
}

struct Window {
    started: Instant,
    written: u32,
    suppressed: u64,
}

impl Default for WarnLimit {
    fn default() -> Self {
        WarnLimit {
            state: Mutex::new(Window {
                started: Instant::now(),
                written: 0,
                suppressed: 0,
            }),
        }
    }
}

impl WarnLimit {
    /// Whether a warning may be written now: `Some(n)` with the number suppressed since the
    /// last one written (to say so in the line), or `None` (it is counted as suppressed).
    pub fn admit(&self) -> Option<u64> {
        self.admit_at(Instant::now())
    }

    fn admit_at(&self, now: Instant) -> Option<u64> {
        let mut w = self.state.lock();
        if now.saturating_duration_since(w.started) >= Duration::from_secs(1) {
            w.started = now;
            w.written = 0;
        }
        if w.written >= PER_SECOND {
            w.suppressed += 1;
            return None;
        }
        w.written += 1;
        Some(std::mem::take(&mut w.suppressed))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_flood_is_cut_to_the_rate_and_the_next_line_says_how_many_were_held_back() {
        let limit = WarnLimit::default();
        let start = Instant::now();
        let written = (0..1000).filter(|_| limit.admit_at(start).is_some()).count();
        assert_eq!(written, PER_SECOND as usize);
        let next = limit.admit_at(start + Duration::from_millis(1001));
        assert_eq!(next, Some(1000 - PER_SECOND as u64));
        assert_eq!(limit.admit_at(start + Duration::from_millis(1002)), Some(0));
    }
}
