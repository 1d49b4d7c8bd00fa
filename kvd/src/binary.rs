//! The binary front: kvd's own protocol on one connection. Read a frame, dispatch it,
//! answer it, repeat. Every rule about waiting, deadlines, memory, the token and shutdown
//! is the edge's (`edge::conn::Conn`); this file parses frames and runs them.
//!
//! Frames are handled one after another in arrival order, so pipelined requests are answered
//! in order. Answers are buffered and flushed only when no further request is already
//! waiting in the read buffer, which turns a burst of pipelined requests into one `write`.
//!
//! Bad input never takes the process down: a frame whose header is not ours ends this
//! connection after an error reply (id [`CONNECTION_ERROR_ID`]: the stream can no longer be
//! trusted to be in step); a body that fails validation gets an error reply for its request
//! and the connection goes on.
//!
//! A new request kind is one arm in [`Binary::dispatch`].

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;

use kvshared::frame::{
    AlignedVec, CONNECTION_ERROR_ID, FrameError, FrameHeader, FrameKind, HEADER_LEN, read_body, read_header,
};
use kvshared::stats::Counter;
use kvshared::wire::{
    BatchResponse, BatchView, ErrorCode, ErrorReply, WireError, encode_empty_frame, encode_frame, parse_config_request,
};
use tokio::io::AsyncWriteExt;

use crate::edge::budget::ReplyAllowance;
use crate::edge::conn::{Conn, ConnError, End, Input, Stage};
use crate::node::{LogWait, Node, NodeError, ReadMode, Scratch};

/// A connection keeps buffers up to this size for the next frame; larger ones (left by an
/// unusually large frame or reply) are freed, so idle connections do not hold the largest
/// frame they ever carried. Batches of 8192 ops of 128 B stay well under it. What it keeps
/// beyond the free allowance is paid from the node's buffer budget.
const KEEP_BUFFER_BYTES: usize = 4 << 20;

/// Publish the local counters to the node's at least every this many batches (and whenever
/// the connection goes idle), so a stats reader is never far behind.
const PUBLISH_EVERY: u64 = 64;

/// Batches a connection may have waiting for the log at once before it stops reading...
const MAX_WAITING: usize = 256;
/// ...and the bytes their responses may hold together (the reads already answered).
const MAX_WAITING_BYTES: usize = KEEP_BUFFER_BYTES;

/// Bytes the responses kept for reuse may hold together (see [`Spares`]).
const SPARE_BYTES: usize = 1 << 20;

/// Responses of answered logged batches, kept to be the next logged batches' responses: a
/// batch that waits for the log takes its response with it, and a fresh one grew from
/// nothing (three columns allocated, the values reallocated as they grew: 6% of a durable
/// node's CPU under YCSB-B at batch 64). Bounded by [`SPARE_BYTES`], and counted in the
/// connection's buffers.
#[derive(Default)]
struct Spares {
    kept: Vec<BatchResponse>,
    bytes: usize,
}

impl Spares {
    fn take(&mut self) -> BatchResponse {
        let response = self.kept.pop().unwrap_or_default();
        self.bytes = self.bytes.saturating_sub(response.heap_bytes());
        response
    }

    fn give(&mut self, response: BatchResponse) {
        let bytes = response.heap_bytes();
        if self.bytes + bytes <= SPARE_BYTES {
            self.bytes += bytes;
            self.kept.push(response);
        }
    }

    fn clear(&mut self) {
        *self = Spares::default();
    }
}

/// A batch answered in part, waiting for its logged ops (a durable node).
struct Waiting {
    id: u64,
    response: BatchResponse,
    log: LogWait,
}

/// How long [`Binary::answer_logged`] waits.
#[derive(Clone, Copy)]
enum Wait {
    /// Answers only what is done.
    No,
    /// Waits for the oldest batch.
    Oldest,
    /// Waits for every batch.
    All,
}

/// One binary-protocol connection: the edge's connection, and the buffers reused for
/// every frame.
struct Binary {
    conn: Conn,
    /// The node it serves.
    node: Arc<Node>,
    body: AlignedVec,
    out: AlignedVec,
    response: BatchResponse,
    scratch: Scratch,
    /// How fresh this connection's reads must be on a follower (`StaleReads` frame).
    reads: ReadMode,
    /// The replica group this connection's client believes it talks to (`PinGroup`; 0: any).
    pinned_group: u64,
    /// Batches waiting for the shard's log, in arrival order.
    waiting: VecDeque<Waiting>,
    spares: Spares,
}

/// Serves `conn` until the peer closes, a protocol error, or shutdown.
pub(crate) async fn serve(conn: Conn, node: Arc<Node>) {
    let mut b = Binary {
        conn,
        node,
        body: AlignedVec::new(),
        out: AlignedVec::new(),
        response: BatchResponse::default(),
        scratch: Scratch::default(),
        reads: ReadMode::Linearizable,
        pinned_group: 0,
        waiting: VecDeque::new(),
        spares: Spares::default(),
    };
    let mut end = b.run().await;
    // A clean end answers what still waits for the log; a failed one answers nothing
    // more (the client counts those outcomes as unknown).
    if matches!(end, End::Clean)
        && let Err(e) = b.answer_logged(Wait::All).await
    {
        end = End::Failed(e);
    }
    let _ = b.conn.writer.flush().await;
    match end {
        End::Clean => tracing::debug!(peer = %b.conn.peer.addr, "connection closed"),
        End::Failed(why) => {
            if let Some(suppressed) = b.conn.may_warn() {
                tracing::warn!(peer = %b.conn.peer.addr, %why, suppressed, "connection ended");
            }
        }
    }
}

impl Binary {
    async fn run(&mut self) -> End {
        loop {
            let must_wait = self.waiting.len() >= MAX_WAITING
                || self.waiting.iter().map(|w| w.response.heap_bytes()).sum::<usize>() > MAX_WAITING_BYTES;
            let wait = if must_wait { Wait::Oldest } else { Wait::No };
            if let Err(e) = self.answer_logged(wait).await {
                return End::Failed(e);
            }
            if self.conn.reader.buffer().is_empty() {
                // Nothing more is queued: publish counters, push out the answers so far, wait.
                self.conn.publish();
                if let Err(e) = self.conn.writer.flush().await {
                    return End::Failed(e.into());
                }
                let oldest = self.waiting.front_mut().map(|w| w.log.wait());
                match self.conn.wait_for_input(oldest).await {
                    Input::Ready => {}
                    // The oldest logged batch is done: go round to answer it.
                    Input::Woken => continue,
                    Input::End(end) => return end,
                }
            }
            let header = match self.read_frame().await {
                Ok(Some(h)) => h,
                Ok(None) => return End::Clean,
                Err(e) => {
                    self.reply_connection_error(&e).await;
                    return End::Failed(e.into());
                }
            };
            if let Some(end) = self.handle(header).await {
                return end;
            }
        }
    }

    /// Whether a whole request frame is already read into the connection's buffer (after the
    /// drain, those are answered "shutting down" too before the connection ends).
    fn whole_frame_buffered(&self) -> bool {
        let buffered = self.conn.reader.buffer();
        let Some(head) = buffered.first_chunk::<{ kvshared::frame::HEADER_LEN }>() else {
            return false;
        };
        FrameHeader::decode(head, self.node.config().edge.max_frame)
            .is_ok_and(|h| buffered.len() >= kvshared::frame::HEADER_LEN + h.len as usize)
    }

    /// Runs (or, during shutdown, refuses) one request and writes its reply; `Some` when
    /// the connection ends after it (after the drain: once no whole request is buffered).
    async fn handle(&mut self, header: FrameHeader) -> Option<End> {
        let stage = self.conn.stage();
        let go_on = match stage {
            // The request was read: it is answered "shutting down" even when the drain is
            // over, then the connection ends.
            Stage::Refuse | Stage::Over => self
                .encode_error(
                    header.id,
                    ErrorCode::ShuttingDown,
                    "the node is shutting down; the request was not run".into(),
                )
                .map(|()| true),
            Stage::Serve => self.dispatch(header).await,
        };
        let go_on = match go_on {
            Ok(go_on) => go_on,
            Err(e) => return Some(End::Failed(e.into())),
        };
        if let Err(e) = self.write_out().await {
            return Some(End::Failed(e.into()));
        }
        if stage == Stage::Over && !self.whole_frame_buffered() {
            return Some(End::Clean);
        }
        if !go_on {
            self.conn.close_after_error().await;
            return Some(End::Failed(ConnError::WrongToken));
        }
        self.settle_buffers();
        if self.conn.tally.batches >= PUBLISH_EVERY {
            self.conn.publish();
        }
        None
    }

    /// Reads the next frame into `self.body`, counting the bytes. A frame that has begun
    /// must arrive whole by the edge's deadline, and its body must find room in the node's
    /// buffer budget; before the token only a small `AuthRequest` is read.
    async fn read_frame(&mut self) -> Result<Option<FrameHeader>, FrameError> {
        let max_frame = self.node.config().edge.max_frame;
        let deadline = self.conn.request_deadline();
        let header = match tokio::time::timeout_at(deadline, read_header(&mut self.conn.reader, max_frame)).await {
            Ok(header) => header?,
            Err(_) => return Err(self.timed_out()),
        };
        let Some(header) = header else { return Ok(None) };
        let len = header.len as usize;
        if !self.conn.auth().admitted() && (header.kind != FrameKind::AuthRequest || len > self.conn.request_limit()) {
            // Before the token, a peer can make the node read one small frame, nothing more.
            return Err(self.refuse_unauthenticated().await);
        }
        let grow = len.saturating_sub(self.body.capacity());
        if !self.conn.room_for(self.buffer_bytes() + grow, deadline).await {
            return Err(self.refuse_no_room(len).await);
        }
        match tokio::time::timeout_at(deadline, read_body(&mut self.conn.reader, &mut self.body, len)).await {
            Ok(read) => read?,
            Err(_) => return Err(self.timed_out()),
        }
        self.conn.tally.bytes_in += (HEADER_LEN + len) as u64;
        Ok(Some(header))
    }

    fn timed_out(&mut self) -> FrameError {
        FrameError::Io(std::io::Error::new(
            std::io::ErrorKind::TimedOut,
            self.conn.read_timed_out(),
        ))
    }

    /// Answers a frame for which the node's buffer budget has no room, and ends the
    /// connection.
    async fn refuse_no_room(&mut self, len: usize) -> FrameError {
        let message = format!(
            "no room for a frame of {len} bytes: the node's connections hold all of its \
             --max-buffer-memory; try again later"
        );
        if self
            .encode_error(CONNECTION_ERROR_ID, ErrorCode::OutOfMemory, message.clone())
            .is_ok()
        {
            let _ = self.write_out().await;
            self.conn.close_after_error().await;
        }
        FrameError::Io(std::io::Error::new(std::io::ErrorKind::OutOfMemory, message))
    }

    /// Answers a request sent before the token (or a token frame too large to be one) with
    /// the reason, and ends the connection.
    async fn refuse_unauthenticated(&mut self) -> FrameError {
        self.conn.auth().refused();
        let message = "authentication required: this node has a token; give the client the same \
                       --auth-token-file (or KV_AUTH_TOKEN_FILE)";
        if self
            .encode_error(CONNECTION_ERROR_ID, ErrorCode::AuthRequired, message.into())
            .is_ok()
        {
            let _ = self.write_out().await;
            self.conn.close_after_error().await;
        }
        FrameError::Io(std::io::Error::new(std::io::ErrorKind::PermissionDenied, message))
    }

    /// Bytes this connection's buffers hold now.
    fn buffer_bytes(&self) -> usize {
        self.body.capacity() + self.out.capacity() + self.response.heap_bytes() + self.spares.bytes
    }

    /// Runs one request and leaves its encoded reply in `self.out`; false when the
    /// connection must be closed after the reply (a wrong token).
    async fn dispatch(&mut self, header: FrameHeader) -> Result<bool, WireError> {
        let id = header.id;
        match header.kind {
            FrameKind::BatchRequest => self.batch(id).map(|()| true),
            FrameKind::RaftRequest => self.raft(id).await.map(|()| true),
            FrameKind::StaleReads => self.read_mode(id).map(|()| true),
            FrameKind::PinGroup => self.pin_group(id).map(|()| true),
            FrameKind::StatsRequest => {
                self.conn.publish();
                let stats = self.node.stats();
                encode_frame(FrameKind::StatsResponse, id, &stats, &mut self.out).map(|()| true)
            }
            FrameKind::AuthRequest => {
                if self.conn.auth().present(&self.body) {
                    encode_empty_frame(FrameKind::AuthOk, id, &mut self.out);
                    return Ok(true);
                }
                self.encode_error(id, ErrorCode::AuthFailed, "wrong token".into())?;
                Ok(false)
            }
            FrameKind::ConfigRequest => self.config(id).map(|()| true),
            other @ (FrameKind::BatchResponse
            | FrameKind::StatsResponse
            | FrameKind::ErrorResponse
            | FrameKind::AuthOk
            | FrameKind::ConfigOk
            | FrameKind::RaftResponse
            | FrameKind::NotLeader) => {
                self.conn.tally.bad_frame += 1;
                self.encode_error(
                    id,
                    ErrorCode::BadFrame,
                    format!("a client may not send {other:?} frames"),
                )
                .map(|()| true)
            }
        }
    }

    /// A batch of ops: run at once, or (a durable node) answered once its log entry is
    /// applied, while the next requests are read.
    fn batch(&mut self, id: u64) -> Result<(), WireError> {
        if let Some(refusal) = self.wrong_group(self.pinned_group) {
            return self.encode_error(id, ErrorCode::WrongGroup, refusal);
        }
        let batch = match BatchView::parse(&self.body) {
            Ok(batch) => batch,
            Err(e) => {
                if let Some(suppressed) = self.conn.may_warn() {
                    tracing::warn!(peer = %self.conn.peer.addr, id, error = %e, suppressed, "rejected a malformed batch");
                }
                tracing::debug!(peer = %self.conn.peer.addr, id, detail = e.detail(), "validation detail");
                self.conn.tally.malformed_body += 1;
                return self.encode_error(id, ErrorCode::MalformedBody, e.to_string());
            }
        };
        let edge = &self.conn.edge;
        let node = &self.node;
        let mut room = ReplyAllowance::new(&edge.budget, batch.len(), node.config().edge.max_frame as usize);
        let log = node.execute_reading(
            &batch,
            &mut self.response,
            &mut room,
            &mut self.scratch,
            &mut self.conn.tally,
            self.reads,
        );
        let taken = room.taken();
        self.conn.hold(taken);
        self.conn.tally.batches += 1;
        match log {
            None => encode_frame(FrameKind::BatchResponse, id, &self.response, &mut self.out),
            Some(log) => {
                let response = std::mem::replace(&mut self.response, self.spares.take());
                self.waiting.push_back(Waiting { id, response, log });
                self.out.clear();
                Ok(())
            }
        }
    }

    /// A raft RPC from another member of this node's replica group.
    async fn raft(&mut self, id: u64) -> Result<(), WireError> {
        match self.node.serve_raft(&self.body).await {
            Some(reply) => {
                raw_frame(&mut self.out, FrameKind::RaftResponse, id, &reply);
                Ok(())
            }
            None => self.encode_error(
                id,
                ErrorCode::Refused,
                "this node is not a member of a replica group".into(),
            ),
        }
    }

    /// `PinGroup`: the group the client believes this member is in. Answered with this
    /// member's group id; refused when it is in another (or none, while the client knows
    /// one). The connection's batches are then checked against it.
    fn pin_group(&mut self, id: u64) -> Result<(), WireError> {
        let Ok(believed) = <[u8; 8]>::try_from(&self.body[..]).map(u64::from_le_bytes) else {
            self.conn.tally.malformed_body += 1;
            let message = "a PinGroup body is 8 bytes (a group id, little-endian)".into();
            return self.encode_error(id, ErrorCode::MalformedBody, message);
        };
        if let Some(refusal) = self.wrong_group(believed) {
            return self.encode_error(id, ErrorCode::WrongGroup, refusal);
        }
        let mine = self.node.group_id().unwrap_or(0);
        self.pinned_group = if believed != 0 { believed } else { mine };
        raw_frame(&mut self.out, FrameKind::ConfigOk, id, &mine.to_le_bytes());
        Ok(())
    }

    /// Why a request from a client that believes this member is in group `believed` (0: any)
    /// must not run here, if it must not.
    fn wrong_group(&self, believed: u64) -> Option<String> {
        let mine = self.node.group_id();
        match mine {
            _ if believed == 0 => None,
            Some(g) if g == believed => None,
            Some(g) => Some(format!(
                "this member belongs to replica group {g:016x}, not {believed:016x}: check --nodes"
            )),
            None => Some(format!(
                "this member belongs to no replica group yet (expected {believed:016x}): it waits for kvd admin add-replica"
            )),
        }
    }

    /// `StaleReads`: how fresh this connection's reads on a follower must be.
    fn read_mode(&mut self, id: u64) -> Result<(), WireError> {
        match <[u8; 4]>::try_from(&self.body[..]) {
            Ok(ms) => {
                self.reads = match u32::from_le_bytes(ms) {
                    0 => ReadMode::Linearizable,
                    ms => ReadMode::Stale(Duration::from_millis(u64::from(ms))),
                };
                encode_empty_frame(FrameKind::ConfigOk, id, &mut self.out);
                Ok(())
            }
            Err(_) => {
                self.conn.tally.malformed_body += 1;
                self.encode_error(
                    id,
                    ErrorCode::MalformedBody,
                    "a StaleReads body is 4 bytes (milliseconds, little-endian)".into(),
                )
            }
        }
    }

    /// A change of settings at run time.
    fn config(&mut self, id: u64) -> Result<(), WireError> {
        match parse_config_request(&self.body) {
            Ok(change) => match self.node.configure(&change) {
                Ok(()) => {
                    encode_empty_frame(FrameKind::ConfigOk, id, &mut self.out);
                    Ok(())
                }
                Err(why) => self.encode_error(id, ErrorCode::Refused, why.to_string()),
            },
            Err(e) => {
                self.conn.tally.malformed_body += 1;
                self.encode_error(id, ErrorCode::MalformedBody, e.to_string())
            }
        }
    }

    /// Answers the logged batches whose entries are applied, oldest first, waiting for none,
    /// the oldest, or all of them. An error ends the connection: a batch whose log failed
    /// may have been logged, so it gets no answer rather than a wrong one (the client counts
    /// its outcome as unknown).
    async fn answer_logged(&mut self, wait: Wait) -> Result<(), ConnError> {
        let max_reply = self.node.config().edge.max_frame as usize;
        let mut waited = false;
        while let Some(head) = self.waiting.front_mut() {
            let must = match wait {
                Wait::No => false,
                Wait::Oldest => !waited,
                Wait::All => true,
            };
            if must {
                head.log.wait().await;
                waited = true;
            }
            let not_leader = match head.log.finish(&mut head.response, max_reply) {
                None => break,
                Some(Err(e @ NodeError::OutcomeUnknown { .. })) => {
                    // Its outcomes are taken: it must not be waited for again (a oneshot
                    // that has answered panics when polled again) when the caller drains
                    // the queue after this error.
                    self.waiting.pop_front();
                    return Err(ConnError::Batch(Box::new(e)));
                }
                Some(Err(NodeError::NotLeader { leader })) => Some(Ok(leader)),
                Some(Err(e @ NodeError::DiskRefuses { .. })) => Some(Err(e)),
                Some(Ok(())) => None,
            };
            let Some(done) = self.waiting.pop_front() else { break };
            match not_leader {
                // Nothing of the batch ran, and will not anywhere now: the client is told why.
                Some(Err(why)) => self.encode_error(done.id, ErrorCode::Refused, why.to_string())?,
                // Nothing of the batch ran: the client sends it to the leader.
                Some(Ok(leader)) => raw_frame(
                    &mut self.out,
                    FrameKind::NotLeader,
                    done.id,
                    leader.unwrap_or_default().as_bytes(),
                ),
                None => encode_frame(FrameKind::BatchResponse, done.id, &done.response, &mut self.out)?,
            }
            self.write_out().await?;
            self.spares.give(done.response);
        }
        Ok(())
    }

    fn encode_error(&mut self, id: u64, code: ErrorCode, message: String) -> Result<(), WireError> {
        encode_frame(
            FrameKind::ErrorResponse,
            id,
            &ErrorReply { code, message },
            &mut self.out,
        )
    }

    /// Buffers `self.out` for sending.
    async fn write_out(&mut self) -> std::io::Result<()> {
        self.conn.tally.bytes_out += self.out.len() as u64;
        self.conn.writer.write_all(&self.out).await
    }

    /// Counts a frame that could not be read and, when the peer is still there to hear it,
    /// says why on the connection as a whole before the connection is closed.
    async fn reply_connection_error(&mut self, e: &FrameError) {
        let (counter, code) = match e {
            FrameError::TooLarge { .. } => (Counter::FrameTooLarge, Some(ErrorCode::FrameTooLarge)),
            FrameError::VersionMismatch { .. } => (Counter::BadFrame, Some(ErrorCode::VersionMismatch)),
            FrameError::BadMagic(_) | FrameError::UnknownKind(_) => (Counter::BadFrame, Some(ErrorCode::BadFrame)),
            // Timeouts and refusals were counted where they happened.
            FrameError::Io(io) if io.kind() != std::io::ErrorKind::UnexpectedEof => return,
            FrameError::Truncated | FrameError::Io(_) => (Counter::Io, None),
        };
        *self.conn.tally.get_mut(counter) += 1;
        if let Some(code) = code
            && self.encode_error(CONNECTION_ERROR_ID, code, e.to_string()).is_ok()
        {
            let _ = self.write_out().await;
            self.conn.close_after_error().await;
        }
    }

    /// After a reply is written: frees buffers a large frame left behind (see
    /// [`KEEP_BUFFER_BYTES`]), and makes what is taken from the node's budget match what
    /// the buffers kept for the next frame hold (freeing them when the budget has no room
    /// to keep them).
    fn settle_buffers(&mut self) {
        if self.body.capacity() > KEEP_BUFFER_BYTES {
            self.body = AlignedVec::new();
        }
        if self.out.capacity() > KEEP_BUFFER_BYTES {
            self.out = AlignedVec::new();
        }
        if self.response.heap_bytes() > KEEP_BUFFER_BYTES {
            self.response = BatchResponse::default();
        }
        if !self.conn.settle(self.buffer_bytes()) {
            self.body = AlignedVec::new();
            self.out = AlignedVec::new();
            self.response = BatchResponse::default();
            self.spares.clear();
        }
    }
}

/// Puts a frame of `kind` whose body is `body` as it is into `out`.
fn raw_frame(out: &mut AlignedVec, kind: FrameKind, id: u64, body: &[u8]) {
    out.clear();
    out.extend_from_slice(
        &FrameHeader {
            kind,
            len: body.len() as u32,
            id,
        }
        .encode(),
    );
    out.extend_from_slice(body);
}

#[cfg(test)]
mod tests {
    use super::{SPARE_BYTES, Spares};
    use kvshared::wire::BatchResponse;

    fn response_of(value_bytes: usize) -> BatchResponse {
        let mut r = BatchResponse::default();
        r.reset(1);
        r.set_found(0, &vec![7u8; value_bytes]);
        r
    }

    /// Spares are handed out again (grown, not fresh), their bytes are counted as they come
    /// and go, and no more than `SPARE_BYTES` are kept.
    #[test]
    fn spare_responses_are_reused_within_their_bound() {
        let mut spares = Spares::default();
        assert_eq!(spares.take().heap_bytes(), 0, "none kept: a fresh one");
        spares.give(response_of(1000));
        assert!(spares.bytes >= 1000);
        let again = spares.take();
        assert!(again.heap_bytes() >= 1000, "the kept one comes back");
        assert_eq!(spares.bytes, 0);
        for _ in 0..3 {
            spares.give(response_of(SPARE_BYTES / 2));
        }
        assert_eq!(spares.kept.len(), 1, "a second half-bound response is over the bound");
        assert!(spares.bytes <= SPARE_BYTES);
        spares.clear();
        assert_eq!((spares.kept.len(), spares.bytes), (0, 0));
    }
}
