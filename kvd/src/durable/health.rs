//! Whether the shard's disk takes writes: one failed write, fsync or snapshot must not stop
//! the shard for good. Whatever fails (no space, a read-only or failing file system) is
//! retried with backoff until it works again; meanwhile [`DiskHealth`] says the shard is
//! stalled, since when and why, so that batches with writes are refused at once with a
//! clear reason (reads go on), the state shows in stats, kvtui and `/metrics`, and the log
//! says so once when it begins, every `LOG_EVERY` while it lasts, and once when it ends
//! (a flood of one ERROR line per refused write wrote 14.5 MB in 5 s before).

use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// How often a stall that goes on is logged again.
const LOG_EVERY: Duration = Duration::from_secs(10);
/// The first and the longest wait between retries.
const FIRST_BACKOFF: Duration = Duration::from_millis(50);
const MAX_BACKOFF: Duration = Duration::from_secs(2);

/// A stall in progress.
#[derive(Clone, Debug)]
struct Stall {
    since: Instant,
    since_unix_ms: u64,
    /// What failed, with the file, for the log.
    detail: String,
    /// The operating system's reason, for clients and stats (no paths).
    reason: String,
    /// Failed attempts so far, and when the log last said so.
    attempts: u64,
    logged_at: Instant,
}

/// The disk's state, shared by the log writer, the snapshot writer and the node.
#[derive(Default)]
pub struct DiskHealth {
    stall: parking_lot::Mutex<Option<Stall>>,
    stalls: std::sync::atomic::AtomicU64,
}

/// What a stall looks like from outside.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct StallFigures {
    /// Unix ms it began (0: none now).
    pub since_unix_ms: u64,
    /// Why.
    pub reason: String,
    /// Stalls so far.
    pub stalls: u64,
}

impl DiskHealth {
    /// Notes that `what` failed with `error` (`detail` names the file): a stall begins, or
    /// goes on. Logged when it begins and every `LOG_EVERY` after.
    pub fn failed(&self, what: &str, detail: &str, error: &std::io::Error) {
        let mut stall = self.stall.lock();
        let now = Instant::now();
        match stall.as_mut() {
            None => {
                self.stalls.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                tracing::error!(
                    %detail,
                    "the disk refuses writes ({what}: {error}): writes to this shard are refused, reads go on; retrying until it works again"
                );
                *stall = Some(Stall {
                    since: now,
                    since_unix_ms: unix_ms(),
                    detail: detail.to_string(),
                    reason: error.to_string(),
                    attempts: 1,
                    logged_at: now,
                });
            }
            Some(s) => {
                s.attempts += 1;
                s.reason = error.to_string();
                if now.duration_since(s.logged_at) >= LOG_EVERY {
                    s.logged_at = now;
                    tracing::warn!(
                        detail = %s.detail,
                        attempts = s.attempts,
                        stalled_s = now.duration_since(s.since).as_secs(),
                        "the disk still refuses writes ({what}: {error})"
                    );
                }
            }
        }
    }

    /// Notes that writing works (again); logs the end of a stall.
    pub fn ok(&self) {
        if let Some(s) = self.stall.lock().take() {
            tracing::warn!(
                stalled_ms = s.since.elapsed().as_millis() as u64,
                attempts = s.attempts,
                "the disk takes writes again: writes to this shard resume"
            );
        }
    }

    /// While stalled: the reason a client is given for a refused write (no paths).
    pub fn refusal(&self) -> Option<String> {
        self.stall.lock().as_ref().map(|s| {
            format!(
                "the node's disk refuses writes ({}) since {} s ago; the write was not run (reads go on); retry later",
                s.reason,
                s.since.elapsed().as_secs()
            )
        })
    }

    /// While stalled: the operating system's reason (no paths).
    pub fn stall_reason(&self) -> Option<String> {
        self.stall.lock().as_ref().map(|s| s.reason.clone())
    }

    /// For stats.
    pub fn figures(&self) -> StallFigures {
        let stall = self.stall.lock();
        StallFigures {
            since_unix_ms: stall.as_ref().map_or(0, |s| s.since_unix_ms),
            reason: stall.as_ref().map_or(String::new(), |s| s.reason.clone()),
            stalls: self.stalls.load(std::sync::atomic::Ordering::Relaxed),
        }
    }
}

/// Retries with growing pauses, for a thread that must not give up.
pub struct Backoff {
    next: Duration,
}

impl Default for Backoff {
    fn default() -> Self {
        Backoff { next: FIRST_BACKOFF }
    }
}

impl Backoff {
    /// The pause before the next try (doubling, up to `MAX_BACKOFF`).
    pub fn next_pause(&mut self) -> Duration {
        let pause = self.next;
        self.next = (self.next * 2).min(MAX_BACKOFF);
        pause
    }
}

fn unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stall_begins_once_and_ends_when_writes_work() {
        let h = DiskHealth::default();
        assert_eq!(h.refusal(), None);
        let full = std::io::Error::from_raw_os_error(28);
        h.failed("append", "/data/log/x.seg", &full);
        h.failed("append", "/data/log/x.seg", &full);
        let refusal = h.refusal().unwrap();
        assert!(
            refusal.contains("No space left on device") && !refusal.contains("/data"),
            "{refusal}"
        );
        let f = h.figures();
        assert!(f.since_unix_ms > 0);
        assert_eq!(f.stalls, 1);
        h.ok();
        assert_eq!(h.refusal(), None);
        assert_eq!(h.figures().since_unix_ms, 0);
        let mut b = Backoff::default();
        let pauses: Vec<_> = (0..8).map(|_| b.next_pause()).collect();
        assert_eq!(pauses[0], FIRST_BACKOFF);
        assert_eq!(*pauses.last().unwrap(), MAX_BACKOFF);
    }
}
