//! A Ctrl-C that stops a long command early without losing what it measured.
//!
//! The binary installs the signal handler and triggers this; commands watch it, stop their
//! load, and report the partial result as interrupted. (A second Ctrl-C is the binary's to
//! handle: it exits at once.)

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use tokio::sync::Notify;

/// Shared flag plus wake-up: cheap to clone, set once.
#[derive(Clone, Default, Debug)]
pub struct Interrupt {
    inner: Arc<(AtomicBool, Notify)>,
}

impl Interrupt {
    /// Asks every watcher to stop.
    pub fn trigger(&self) {
        self.inner.0.store(true, Ordering::SeqCst);
        self.inner.1.notify_waiters();
    }

    /// Whether it was triggered.
    pub fn is_set(&self) -> bool {
        self.inner.0.load(Ordering::SeqCst)
    }

    /// Resolves once triggered (at once if it already was).
    pub async fn wait(&self) {
        loop {
            let notified = self.inner.1.notified();
            if self.is_set() {
                return;
            }
            notified.await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn waiters_wake_and_late_waiters_return_at_once() {
        let i = Interrupt::default();
        let waiter = tokio::spawn({
            let i = i.clone();
            async move { i.wait().await }
        });
        tokio::task::yield_now().await;
        i.trigger();
        waiter.await.unwrap();
        i.wait().await;
        assert!(i.is_set());
    }
}
