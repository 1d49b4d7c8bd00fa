//! Shutdown of one HTTP connection as the other fronts do it: requests that arrive within
//! [`DRAIN_IDLE`] of each other are still run (at most for [`DRAIN_MAX`]), then each request
//! read is answered 503 "shutting down" (not run) until the client is quiet for
//! [`LAST_READ`] (at most [`REFUSE_MAX`]); only then is hyper told to close, so that no
//! request it has read is left without an answer. (Closing at once dropped the pipelined
//! requests hyper had read and not yet parsed: about 16 per connection under load.)

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use axum::extract::{Request, State};
use axum::http::StatusCode;
use axum::middleware::Next;
use axum::response::Response;
use tokio::time::{Duration, Instant};

use crate::edge::conn::{DRAIN_IDLE, DRAIN_MAX, LAST_READ, REFUSE_MAX};

/// Where one connection's requests are in its shutdown.
pub(super) struct Gate {
    refusing: AtomicBool,
    /// When the last request arrived, in ms after `began`.
    last_ms: AtomicU64,
    began: Instant,
}

impl Gate {
    pub fn new() -> Arc<Gate> {
        Arc::new(Gate {
            refusing: AtomicBool::new(false),
            last_ms: AtomicU64::new(0),
            began: Instant::now(),
        })
    }

    fn last_request(&self) -> Instant {
        self.began + Duration::from_millis(self.last_ms.load(Ordering::Relaxed))
    }
}

/// Around every route: notes the request's arrival, and answers it 503 (not run) once the
/// connection refuses.
pub(super) async fn gate(State(gate): State<Arc<Gate>>, request: Request, next: Next) -> Response {
    let now = gate.began.elapsed().as_millis() as u64;
    gate.last_ms.store(now, Ordering::Relaxed);
    if gate.refusing.load(Ordering::Relaxed) {
        return super::json_error(
            StatusCode::SERVICE_UNAVAILABLE,
            "kvd is shutting down; the request was not run",
        );
    }
    next.run(request).await
}

/// After the shutdown signal: drains, refuses, then lets hyper close the connection
/// `served` (which ends on its own if the client leaves first).
pub(super) async fn close<F: Future>(gate: &Gate, mut served: Pin<&mut F>, shut: impl FnOnce(Pin<&mut F>)) {
    let began = Instant::now();
    if quiet_for(gate, served.as_mut(), DRAIN_IDLE, began + DRAIN_MAX).await {
        return;
    }
    gate.refusing.store(true, Ordering::Relaxed);
    if quiet_for(gate, served.as_mut(), LAST_READ, Instant::now() + REFUSE_MAX).await {
        return;
    }
    shut(served.as_mut());
    served.await;
}

/// Waits until no request arrived for `quiet`, or until `until`; true if the connection
/// ended meanwhile.
async fn quiet_for<F: Future>(gate: &Gate, mut served: Pin<&mut F>, quiet: Duration, until: Instant) -> bool {
    loop {
        let wake = (gate.last_request() + quiet).min(until);
        if Instant::now() >= wake {
            return false;
        }
        tokio::select! {
            _ = served.as_mut() => return true,
            () = tokio::time::sleep_until(wake) => {}
        }
    }
}
