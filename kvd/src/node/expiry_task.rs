//! The active expiry cycle: a thread per node that, ten times a second, removes keys past
//! their deadline that nobody touches (a read answers them missing but removes nothing), so
//! their memory comes back. Redis's cycle, with its bounds: each run samples deadlines a map
//! shard at a time and stops after [`BUDGET`] of each [`PERIOD`] (a quarter of a core at
//! most); the time it ran is counted (`expire_cycle_microseconds`), so its CPU share is measured.
//!
//! In memory the cycle removes the keys itself. On a durable node only the leader (or a
//! node alone) runs it, and it logs `Expired` ops for the keys it found due, so that every
//! member and every replay removes them at the same entry; followers remove nothing.

use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use kvshared::expiry::now_ms;
use kvshared::stats::Counts;

use crate::node::Node;

/// How often the cycle runs (Redis's default `hz` 10).
pub const PERIOD: Duration = Duration::from_millis(100);
/// The most one run may take (Redis: 25% of each period).
pub const BUDGET: Duration = Duration::from_millis(25);
/// Most keys a durable leader logs as expired per run.
const MAX_LOGGED_PER_RUN: usize = 2048;

/// Starts the cycle for `node`; the thread ends once the node is dropped.
pub fn start(node: &Arc<Node>) {
    let weak = Arc::downgrade(node);
    let spawned = std::thread::Builder::new()
        .name("kvd-expiry".into())
        .spawn(move || run(&weak));
    if let Err(e) = spawned {
        tracing::warn!("the active expiry cycle did not start ({e}); expired keys are removed only by writes");
    }
}

fn run(weak: &Weak<Node>) {
    let mut from = 0usize;
    loop {
        std::thread::sleep(PERIOD);
        let Some(node) = weak.upgrade() else { return };
        if node.store.volatile_keys() == 0 {
            continue;
        }
        let began = Instant::now();
        let mut tally = Counts::default();
        let wait = match node.expiry_mode() {
            ExpiryMode::Remove => {
                node.store.expire_cycle(now_ms(), from, began + BUDGET, &mut tally);
                None
            }
            ExpiryMode::Log => {
                let mut due = Vec::new();
                node.store.due_keys(now_ms(), MAX_LOGGED_PER_RUN, &mut due);
                node.log_expired(&due)
            }
            ExpiryMode::Follow => None,
        };
        from = from.wrapping_add(1);
        tally.expire_cycle_microseconds += began.elapsed().as_micros() as u64;
        node.count(&tally);
        drop(node);
        if let Some(wait) = wait {
            // One logged batch at a time; its answer says nothing the next run needs.
            let _ = wait.blocking_recv();
        }
    }
}

/// What a node's cycle does.
pub enum ExpiryMode {
    /// Removes expired keys itself (in memory).
    Remove,
    /// Logs their removal (a durable node that leads, or is alone).
    Log,
    /// Nothing (a follower or learner: its leader's log removes them).
    Follow,
}
