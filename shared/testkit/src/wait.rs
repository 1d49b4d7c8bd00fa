//! Waiting for events, not for time.
//!
//! A test waits for the condition it needs (a role in stats, an applied index, a line in a
//! log, a port accepting), polling it; the deadline only bounds a hang, so it is generous:
//! a busy machine makes the wait longer, never the outcome different. On timeout the panic
//! names what was awaited and what the last poll saw.

use std::future::Future;
use std::time::{Duration, Instant};

/// The deadline of a wait that only guards against a hang.
pub const HANG: Duration = Duration::from_secs(120);

/// First pause between polls; it doubles up to [`MAX_PAUSE`].
const FIRST_PAUSE: Duration = Duration::from_millis(5);
const MAX_PAUSE: Duration = Duration::from_millis(200);

/// Polls `probe` until it returns `Ok` (its value is returned) or `within` has passed; then
/// panics with `what` and the last `Err` it returned (what it saw).
pub fn until<T, E: std::fmt::Debug>(what: &str, within: Duration, mut probe: impl FnMut() -> Result<T, E>) -> T {
    let deadline = Instant::now() + within;
    let mut pause = FIRST_PAUSE;
    loop {
        match probe() {
            Ok(v) => return v,
            Err(seen) if Instant::now() >= deadline => {
                panic!("timed out after {within:?} waiting for {what}; last seen: {seen:?}")
            }
            Err(_) => {}
        }
        std::thread::sleep(pause);
        pause = (pause * 2).min(MAX_PAUSE);
    }
}

/// [`until`] for an async probe, on the caller's tokio runtime.
pub async fn until_async<T, E, F, Fut>(what: &str, within: Duration, mut probe: F) -> T
where
    E: std::fmt::Debug,
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, E>>,
{
    let deadline = Instant::now() + within;
    let mut pause = FIRST_PAUSE;
    loop {
        match probe().await {
            Ok(v) => return v,
            Err(seen) if Instant::now() >= deadline => {
                panic!("timed out after {within:?} waiting for {what}; last seen: {seen:?}")
            }
            Err(_) => {}
        }
        tokio::time::sleep(pause).await;
        pause = (pause * 2).min(MAX_PAUSE);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_wait_returns_the_first_value_and_a_timeout_says_what_it_saw() {
        let mut n = 0;
        assert_eq!(
            until("n to reach 3", HANG, || {
                n += 1;
                if n >= 3 { Ok(n) } else { Err(n) }
            }),
            3
        );
        let panicked = std::panic::catch_unwind(|| {
            until("never", Duration::from_millis(30), || Err::<(), _>("still no"));
        });
        let text = *panicked.unwrap_err().downcast::<String>().unwrap();
        assert!(text.contains("never") && text.contains("still no"), "{text}");
    }
}
