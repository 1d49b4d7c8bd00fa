//! Request and response bodies under the edge's rules: a request body must arrive whole
//! within `--read-timeout`, may be at most `--max-frame` bytes, and is paid from the node's
//! buffer budget as it arrives (48 stalled 60 MiB uploads held 2.9 GB before); a response
//! body keeps what its value took from the budget until it is sent.

use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use http_body::{Frame, SizeHint};
use http_body_util::BodyExt;
use tokio::time::Instant;

use crate::edge::budget::{BufferBudget, Held};

/// A request body read whole, and its share of the budget.
pub(crate) struct Value {
    pub bytes: Vec<u8>,
    _held: Held,
}

/// Why a body was not read: a status and a reason.
pub(crate) struct Refused(StatusCode, String);

impl IntoResponse for Refused {
    fn into_response(self) -> Response {
        (self.0, axum::Json(serde_json::json!({ "error": self.1 }))).into_response()
    }
}

/// Reads `body` whole: within `within` of now, at most `limit` bytes, paid from `budget`.
pub(crate) async fn collect(
    body: Body,
    budget: &std::sync::Arc<BufferBudget>,
    limit: usize,
    within: Duration,
) -> Result<Value, Refused> {
    let deadline = Instant::now() + within;
    let mut held = Held::new(budget.clone());
    let mut bytes = Vec::new();
    // With a known length, the room is reserved once (address space: its pages become
    // memory only as the bytes arrive, and the budget is paid as they do), so a body is
    // never copied as it grows.
    let announced = http_body::Body::size_hint(&body).exact().map(|n| n as usize);
    let too_large = || {
        Refused(
            StatusCode::PAYLOAD_TOO_LARGE,
            format!("a value is at most {limit} bytes (--max-frame)"),
        )
    };
    if announced.is_some_and(|n| n > limit) {
        return Err(too_large());
    }
    let reserved = announced.is_some_and(|n| n <= limit && bytes.try_reserve_exact(n).is_ok());
    let read = async {
        let mut body = body;
        while let Some(frame) = body.frame().await {
            let frame =
                frame.map_err(|e| Refused(StatusCode::BAD_REQUEST, format!("the body could not be read: {e}")))?;
            let Ok(data) = frame.into_data() else { continue };
            let total = bytes.len().saturating_add(data.len());
            if total > limit {
                return Err(too_large());
            }
            let paid = if reserved {
                held.grow_to(total, deadline).await
            } else if total > bytes.capacity() {
                // Grown by a quarter at a time (few copies), and paid for by capacity.
                let target = total
                    .max(bytes.capacity() + bytes.capacity() / 4)
                    .max(64 << 10)
                    .min(limit);
                let paid = held.grow_to(target, deadline).await;
                if paid {
                    bytes.reserve_exact(target - bytes.len());
                }
                paid
            } else {
                true
            };
            if !paid {
                return Err(Refused(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "no room for the body: the node's connections hold all of its --max-buffer-memory; try again later"
                        .into(),
                ));
            }
            bytes.extend_from_slice(&data);
        }
        Ok(())
    };
    match tokio::time::timeout_at(deadline, read).await {
        Ok(Ok(())) => Ok(Value { bytes, _held: held }),
        Ok(Err(refused)) => Err(refused),
        Err(_) => Err(Refused(
            StatusCode::REQUEST_TIMEOUT,
            format!("the body did not arrive whole within {within:?} (--read-timeout)"),
        )),
    }
}

/// A response body that gives back its share of the budget once it has been sent.
pub(crate) struct Guarded {
    data: Option<Bytes>,
    _held: Held,
}

impl Guarded {
    pub(crate) fn new(data: Vec<u8>, held: Held) -> Guarded {
        Guarded {
            data: Some(Bytes::from(data)),
            _held: held,
        }
    }
}

impl http_body::Body for Guarded {
    type Data = Bytes;
    type Error = std::convert::Infallible;

    fn poll_frame(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        Poll::Ready(self.get_mut().data.take().map(|d| Ok(Frame::data(d))))
    }

    fn is_end_stream(&self) -> bool {
        self.data.is_none()
    }

    fn size_hint(&self) -> SizeHint {
        SizeHint::with_exact(self.data.as_ref().map_or(0, |d| d.len() as u64))
    }
}
