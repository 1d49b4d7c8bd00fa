//! Serving one client connection: read a frame, execute it, answer it, repeat.
//!
//! Frames are handled one after another in arrival order, so pipelined requests are answered
//! in order. Responses are buffered and flushed only when no further request is already
//! waiting in the read buffer, which turns a burst of pipelined requests into one `write`.
//!
//! Bad input never takes the process down: a frame whose header is not ours ends this
//! connection (after an error reply, since the stream can no longer be trusted to be in
//! step), a body that fails validation gets an error reply and the connection goes on.

use std::sync::Arc;
use std::time::Duration;

use kvshared::frame::{FrameError, FrameKind, HEADER_LEN, read_frame};
use kvshared::wire::{BatchResponse, BatchView, ErrorCode, ErrorReply, encode_frame};
use rkyv::util::AlignedVec;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader, BufWriter};
use tokio::net::TcpStream;
use tokio::sync::broadcast;

use crate::counters::{Counter, Tally};
use crate::node::Node;
use crate::store::Scratch;

/// After shutdown is signalled, a connection keeps answering requests that arrive within
/// this long of each other (the batches already in flight), then closes...
const DRAIN_IDLE: Duration = Duration::from_millis(200);
/// ...but never for longer than this, so a client that keeps sending cannot hold shutdown open.
const DRAIN_MAX: Duration = Duration::from_secs(1);

/// Flush the local tally to the shared counters at least this often, in batches.
const TALLY_EVERY: u64 = 64;

/// Per-connection buffers, reused for every frame.
struct Buffers {
    body: AlignedVec,
    out: AlignedVec,
    response: BatchResponse,
    scratch: Scratch,
}

/// Serves `stream` until the peer closes, a protocol error, or shutdown.
pub async fn serve_connection(
    node: Arc<Node>,
    conn_id: u64,
    mut stream: TcpStream,
    mut shutdown: broadcast::Receiver<()>,
) {
    let peer = stream.peer_addr().map(|a| a.to_string()).unwrap_or_else(|_| "?".into());
    let _ = stream.set_nodelay(true);
    node.counters.add(conn_id, Counter::ConnsOpened, 1);
    let (read, write) = stream.split();
    let mut reader = BufReader::with_capacity(64 * 1024, read);
    let mut writer = BufWriter::with_capacity(64 * 1024, write);
    let mut bufs = Buffers {
        body: AlignedVec::new(),
        out: AlignedVec::new(),
        response: BatchResponse::default(),
        scratch: Scratch::default(),
    };
    let mut tally = Tally::default();
    let mut drain_until: Option<tokio::time::Instant> = None;
    let max_frame = node.config.max_frame;

    let end: Result<(), String> = loop {
        if drain_until.is_some_and(|until| tokio::time::Instant::now() >= until) {
            break Ok(());
        }
        if reader.buffer().is_empty() {
            // Nothing more is queued: publish counters, then push out the answers so far.
            tally.flush(&node.counters, conn_id);
            if let Err(e) = writer.flush().await {
                break Err(e.to_string());
            }
            if let Some(until) = drain_until {
                let wait = DRAIN_IDLE.min(until.saturating_duration_since(tokio::time::Instant::now()));
                match tokio::time::timeout(wait, reader.fill_buf()).await {
                    Ok(Ok([])) | Err(_) => break Ok(()),
                    Ok(Ok(_)) => {}
                    Ok(Err(e)) => break Err(e.to_string()),
                }
            } else {
                tokio::select! {
                    filled = reader.fill_buf() => match filled {
                        Ok([]) => break Ok(()),
                        Ok(_) => {}
                        Err(e) => break Err(e.to_string()),
                    },
                    _ = shutdown.recv() => {
                        drain_until = Some(tokio::time::Instant::now() + DRAIN_MAX);
                        continue;
                    }
                }
            }
        }
        let read = if drain_until.is_some() {
            tokio::time::timeout(DRAIN_IDLE * 5, read_frame(&mut reader, &mut bufs.body, max_frame))
                .await
                .unwrap_or(Err(FrameError::Truncated))
        } else {
            read_frame(&mut reader, &mut bufs.body, max_frame).await
        };
        let header = match read {
            Ok(Some(h)) => h,
            Ok(None) => break Ok(()),
            Err(e) => {
                let (counter, code) = match &e {
                    FrameError::TooLarge { .. } => (Counter::FrameTooLarge, Some(ErrorCode::FrameTooLarge)),
                    FrameError::VersionMismatch { .. } => (Counter::BadFrame, Some(ErrorCode::VersionMismatch)),
                    FrameError::BadMagic(_) | FrameError::UnknownKind(_) => {
                        (Counter::BadFrame, Some(ErrorCode::BadFrame))
                    }
                    FrameError::Truncated | FrameError::Io(_) => (Counter::Io, None),
                };
                node.counters.add(conn_id, counter, 1);
                if let Some(code) = code {
                    // The stream is out of step: say why (id 0: the connection as a whole), then close.
                    let reply = ErrorReply {
                        code,
                        message: e.to_string(),
                    };
                    if encode_frame(FrameKind::ErrorResponse, 0, &reply, &mut bufs.out).is_ok() {
                        let _ = writer.write_all(&bufs.out).await;
                        let _ = writer.flush().await;
                    }
                }
                break Err(e.to_string());
            }
        };
        tally.bytes_in += (HEADER_LEN + bufs.body.len()) as u64;
        let encoded = match header.kind {
            FrameKind::BatchRequest => match BatchView::parse(&bufs.body) {
                Ok(batch) => {
                    let t = node.store.execute(&batch, &mut bufs.response, &mut bufs.scratch);
                    tally.add_batch(&t);
                    encode_frame(FrameKind::BatchResponse, header.id, &bufs.response, &mut bufs.out)
                }
                Err(e) => {
                    tracing::warn!(%peer, id = header.id, error = %e, "rejected a malformed batch");
                    node.counters.add(conn_id, Counter::MalformedBody, 1);
                    let reply = ErrorReply {
                        code: ErrorCode::MalformedBody,
                        message: e.to_string(),
                    };
                    encode_frame(FrameKind::ErrorResponse, header.id, &reply, &mut bufs.out)
                }
            },
            FrameKind::StatsRequest => {
                tally.flush(&node.counters, conn_id);
                encode_frame(FrameKind::StatsResponse, header.id, &node.stats(), &mut bufs.out)
            }
            other => {
                node.counters.add(conn_id, Counter::BadFrame, 1);
                let reply = ErrorReply {
                    code: ErrorCode::BadFrame,
                    message: format!("a client may not send {other:?} frames"),
                };
                encode_frame(FrameKind::ErrorResponse, header.id, &reply, &mut bufs.out)
            }
        };
        if let Err(e) = encoded {
            break Err(format!("cannot encode a reply: {e}"));
        }
        tally.bytes_out += bufs.out.len() as u64;
        if let Err(e) = writer.write_all(&bufs.out).await {
            break Err(e.to_string());
        }
        if tally.batches >= TALLY_EVERY {
            tally.flush(&node.counters, conn_id);
        }
    };
    tally.flush(&node.counters, conn_id);
    let _ = writer.flush().await;
    node.counters.add(conn_id, Counter::ConnsClosed, 1);
    match end {
        Ok(()) => tracing::debug!(%peer, "connection closed"),
        Err(why) => tracing::warn!(%peer, %why, "connection ended"),
    }
}
