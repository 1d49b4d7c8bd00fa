//! The node-wide budget for connection buffers (`--max-buffer-memory`).
//!
//! Each connection may hold small buffers for free ([`FREE_PER_CONNECTION`]): that keeps the
//! common case (batches well under a megabyte) free of shared atomics. Anything larger (a
//! big request body before it is read, the room for a big reply, or a large buffer kept for
//! the next frame) is taken from this budget first. A peer that announces a large frame
//! therefore cannot make the node hold more than the budget in buffers, however many
//! connections it opens: past it, reading waits for room and then gives up with a reason.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use kvshared::wire::BatchResponse;

use crate::store::ReplyRoom;

/// Buffer bytes each connection holds without asking the budget.
pub const FREE_PER_CONNECTION: usize = 256 << 10;

/// How often a request waiting for room in the budget looks again...
pub(crate) const BUDGET_RETRY: std::time::Duration = std::time::Duration::from_millis(5);
/// ...and how long it waits at most (less if `--read-timeout` is shorter) before it is
/// refused: room frees as other requests are answered, within milliseconds on a healthy
/// node.
pub(crate) const BUDGET_WAIT: std::time::Duration = std::time::Duration::from_secs(1);

/// Bytes the connections of one node may hold in buffers beyond their free allowance.
#[derive(Debug)]
pub struct BufferBudget {
    limit: usize,
    used: AtomicUsize,
}

impl BufferBudget {
    /// A budget of `limit` bytes.
    pub fn new(limit: usize) -> BufferBudget {
        BufferBudget {
            limit,
            used: AtomicUsize::new(0),
        }
    }

    /// Takes `bytes` if all of them are free.
    pub fn try_take(&self, bytes: usize) -> bool {
        self.used
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |used| {
                used.checked_add(bytes).filter(|&total| total <= self.limit)
            })
            .is_ok()
    }

    /// Gives back bytes taken before.
    pub fn give(&self, bytes: usize) {
        if bytes > 0 {
            self.used.fetch_sub(bytes, Ordering::AcqRel);
        }
    }

    /// Bytes taken now.
    #[cfg(test)]
    pub fn used(&self) -> usize {
        self.used.load(Ordering::Acquire)
    }
}

/// Bytes held from a budget, given back when dropped (for what is not a connection's own
/// buffer: an HTTP request's body, a response's value).
pub(crate) struct Held {
    budget: Arc<BufferBudget>,
    bytes: usize,
}

impl Held {
    /// Nothing held yet.
    pub fn new(budget: Arc<BufferBudget>) -> Held {
        Held { budget, bytes: 0 }
    }

    /// `bytes` already taken from `budget` (e.g. by a [`ReplyAllowance`]).
    pub fn adopt(budget: Arc<BufferBudget>, bytes: usize) -> Held {
        Held { budget, bytes }
    }

    /// Makes what is held cover `total` bytes beyond the free allowance, waiting for room
    /// until `deadline` (at most [`BUDGET_WAIT`]). False: no room came.
    pub async fn grow_to(&mut self, total: usize, deadline: tokio::time::Instant) -> bool {
        let need = total.saturating_sub(FREE_PER_CONNECTION).saturating_sub(self.bytes);
        if need == 0 {
            return true;
        }
        // Whole steps, so that a large body costs a few budget operations, not one a chunk.
        let step = need.max(REPLY_STEP);
        let deadline = deadline.min(tokio::time::Instant::now() + BUDGET_WAIT);
        loop {
            for want in [step, need] {
                if self.budget.try_take(want) {
                    self.bytes += want;
                    return true;
                }
            }
            if tokio::time::Instant::now() + BUDGET_RETRY > deadline {
                return false;
            }
            tokio::time::sleep(BUDGET_RETRY).await;
        }
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        self.budget.give(self.bytes);
    }
}

/// Reply room is taken from the budget in steps of at least this many value bytes, so a
/// large reply costs a few atomic operations, not one per value.
const REPLY_STEP: usize = 1 << 20;

/// How many value bytes the reply being built may still carry: within the frame limit, and
/// paid for from the buffer budget (each value byte is held twice: in the response's value
/// column and in the encoded frame). The first value of a reply is always admitted (it fits
/// the frame limit, as it arrived in a put), so any stored value can be read on its own.
pub struct ReplyAllowance<'a> {
    budget: &'a BufferBudget,
    frame_left: usize,
    paid_left: usize,
    taken: usize,
    admitted_any: bool,
}

impl<'a> ReplyAllowance<'a> {
    /// The allowance for a reply to `ops` ops within `max_reply` bytes.
    pub fn new(budget: &'a BufferBudget, ops: usize, max_reply: usize) -> ReplyAllowance<'a> {
        ReplyAllowance {
            budget,
            frame_left: BatchResponse::value_room(ops, max_reply),
            paid_left: FREE_PER_CONNECTION / 2,
            taken: 0,
            admitted_any: false,
        }
    }

    /// Bytes taken from the budget for this reply; the connection gives them back once the
    /// reply is sent.
    pub fn taken(&self) -> usize {
        self.taken
    }
}

impl ReplyRoom for ReplyAllowance<'_> {
    fn admit(&mut self, bytes: usize) -> bool {
        let first = !self.admitted_any;
        if bytes > self.frame_left && !first {
            return false;
        }
        if bytes > self.paid_left {
            let need = 2 * (bytes - self.paid_left);
            let step = need.max(2 * REPLY_STEP);
            let got = if self.budget.try_take(step) {
                step
            } else if self.budget.try_take(need) {
                need
            } else if first {
                0
            } else {
                return false;
            };
            self.taken += got;
            self.paid_left = (self.paid_left + got / 2).max(bytes);
        }
        self.paid_left -= bytes;
        self.frame_left = self.frame_left.saturating_sub(bytes);
        self.admitted_any = true;
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_help_states_the_wait_the_code_keeps() {
        use clap::CommandFactory;
        let cmd = crate::cli::Cli::command();
        let arg = cmd.get_arguments().find(|a| a.get_long() == Some("max-buffer-memory"));
        let help = arg
            .and_then(|a| a.get_help())
            .map(|h| h.to_string())
            .unwrap_or_default();
        let stated = format!("up to {} s", BUDGET_WAIT.as_secs());
        assert!(
            help.contains(&stated),
            "--max-buffer-memory's help should say {stated:?}: {help}"
        );
    }

    #[test]
    fn takes_only_what_is_free_and_gets_it_back() {
        let b = BufferBudget::new(100);
        assert!(b.try_take(60));
        assert!(!b.try_take(41));
        assert!(b.try_take(40));
        assert_eq!(b.used(), 100);
        b.give(60);
        assert!(b.try_take(60));
        assert!(!b.try_take(usize::MAX));
    }

    #[test]
    fn a_reply_stays_within_the_frame_limit_but_always_takes_its_first_value() {
        let b = BufferBudget::new(usize::MAX / 4);
        let mut room = ReplyAllowance::new(&b, 10, 10 << 20);
        assert!(room.admit(12 << 20), "the first value is admitted even over the limit");
        assert!(!room.admit(1));
        let mut room = ReplyAllowance::new(&b, 10, 10 << 20);
        assert!(room.admit(6 << 20));
        assert!(!room.admit(6 << 20));
        assert!(room.admit(3 << 20));
    }

    #[test]
    fn a_reply_is_paid_from_the_budget_and_refused_past_it() {
        let b = BufferBudget::new(8 << 20);
        let mut room = ReplyAllowance::new(&b, 10, 1 << 30);
        assert!(room.admit(FREE_PER_CONNECTION / 2), "the free allowance costs nothing");
        assert_eq!(b.used(), 0);
        assert!(room.admit(3 << 20));
        assert!(b.used() >= 6 << 20, "each value byte is paid twice");
        assert!(!room.admit(3 << 20), "past the budget");
        b.give(room.taken());
        assert_eq!(b.used(), 0);
    }
}
