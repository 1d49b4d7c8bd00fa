//! Serving one client connection: read a frame, dispatch it, answer it, repeat.
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
//! Shutdown: once told, the connection keeps answering requests that arrive within
//! [`DRAIN_IDLE`] of each other for at most [`DRAIN_MAX`]; requests that arrive after that
//! get a `ShuttingDown` error reply rather than silence or a reset.
//!
//! A new request kind is one arm in [`Connection::dispatch`].

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;

use kvshared::auth::MAX_TOKEN_LEN;
use kvshared::frame::AlignedVec;
use kvshared::frame::{
    CONNECTION_ERROR_ID, FrameError, FrameHeader, FrameKind, HEADER_LEN, MAGIC, read_body, read_header,
};
use kvshared::stats::{Counter, Counts};
use kvshared::tls::TlsServer;
use kvshared::wire::{
    BatchResponse, BatchView, ErrorCode, ErrorReply, WireError, encode_empty_frame, encode_frame, parse_config_request,
};
use tokio::io::{AsyncBufReadExt, AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, BufReader, BufWriter};
use tokio::net::TcpStream;
use tokio::sync::broadcast;
use tokio::time::Instant;

use crate::budget::{FREE_PER_CONNECTION, ReplyAllowance};
use crate::durable::raft::LogError;
use crate::node::{LogWait, Node, ReadMode};
use crate::store::Scratch;
use crate::warn_limit::PER_CONNECTION;

/// After shutdown is signalled, a connection keeps answering requests that arrive within
/// this long of each other (the batches already in flight), then closes...
const DRAIN_IDLE: Duration = Duration::from_millis(200);
/// ...but never for longer than this, so a client that keeps sending cannot hold shutdown open.
const DRAIN_MAX: Duration = Duration::from_secs(1);
/// After the drain, requests that still arrive are answered `ShuttingDown` until the client
/// is quiet for this long...
const LAST_READ: Duration = Duration::from_millis(100);
/// ...or for at most this long.
const REFUSE_MAX: Duration = Duration::from_secs(1);

/// A connection keeps buffers up to this size for the next frame; larger ones (left by an
/// unusually large frame or reply) are freed, so idle connections do not hold the largest
/// frame they ever carried. Batches of 8192 ops of 128 B stay well under it. What it keeps
/// beyond [`FREE_PER_CONNECTION`] is paid from the node's buffer budget.
const KEEP_BUFFER_BYTES: usize = 4 << 20;

/// How often a frame waiting for room in the buffer budget looks again...
const BUDGET_RETRY: Duration = Duration::from_millis(5);
/// ...and how long it waits at most (less if `--read-timeout` is shorter) before the
/// connection is refused: room frees as other frames are answered, within milliseconds
/// on a healthy node.
const BUDGET_WAIT: Duration = Duration::from_secs(1);

/// Publish the local counters to the node's at least every this many batches (and whenever
/// the connection goes idle), so a stats reader is never far behind.
const PUBLISH_EVERY: u64 = 64;

/// The two directions of a client connection, plain TCP or TLS.
type ReadHalf = Box<dyn AsyncRead + Send + Unpin>;
type WriteHalf = Box<dyn AsyncWrite + Send + Unpin>;

/// Splits a connection into its two directions, after the TLS handshake when the node
/// serves TLS (which must finish within `handshake_timeout`).
async fn open(
    stream: TcpStream,
    tls: Option<&TlsServer>,
    handshake_timeout: Duration,
) -> std::io::Result<(ReadHalf, WriteHalf)> {
    let Some(tls) = tls else {
        let (read, write) = stream.into_split();
        return Ok((Box::new(read), Box::new(write)));
    };
    // A client speaking plain frames to a TLS node is told so, in plain frames, rather
    // than failing a handshake it never started.
    let mut first = [0u8; MAGIC.len()];
    if let Ok(Ok(n)) = tokio::time::timeout(handshake_timeout, stream.peek(&mut first)).await
        && n == MAGIC.len()
        && first == MAGIC
    {
        let message = "this node serves TLS only: connect with --tls-ca FILE (the CA of its certificate)".to_string();
        Box::pin(refuse(stream, None, ErrorCode::BadFrame, message.clone())).await;
        return Err(std::io::Error::new(std::io::ErrorKind::InvalidData, message));
    }
    let stream = tokio::time::timeout(handshake_timeout, tls.accept(stream))
        .await
        .map_err(|_| std::io::Error::new(std::io::ErrorKind::TimedOut, "TLS handshake timed out"))??;
    let (read, write) = tokio::io::split(stream);
    Ok((Box::new(read), Box::new(write)))
}

/// Tells a connection that is not served why (one error frame for the connection as a
/// whole: over `--max-conns`, or protected mode), then closes it.
pub(crate) async fn refuse(stream: TcpStream, tls: Option<TlsServer>, code: ErrorCode, message: String) {
    let Ok((mut read, mut write)) = open(stream, tls.as_ref(), LAST_READ * 10).await else {
        return;
    };
    let reply = ErrorReply { code, message };
    let mut out = AlignedVec::new();
    if encode_frame(FrameKind::ErrorResponse, CONNECTION_ERROR_ID, &reply, &mut out).is_ok() {
        let _ = tokio::time::timeout(Duration::from_secs(1), write.write_all(&out)).await;
    }
    let _ = write.shutdown().await;
    // Read and drop what the client already sent (at most a little, briefly): closing with
    // unread input resets the connection, which can destroy the reason before it is read.
    let mut sink = [0u8; 4096];
    let until = Instant::now() + LAST_READ;
    let mut left = 1 << 20;
    while let Ok(Ok(n)) = tokio::time::timeout_at(until, read.read(&mut sink)).await
        && n > 0
        && left > n
    {
        left -= n;
    }
}

/// Batches a connection may have waiting for the log at once before it stops reading...
const MAX_WAITING: usize = 256;
/// ...and the bytes their responses may hold together (the reads already answered).
const MAX_WAITING_BYTES: usize = KEEP_BUFFER_BYTES;

/// A batch answered in part, waiting for its logged ops (a durable node).
struct Waiting {
    id: u64,
    response: BatchResponse,
    log: LogWait,
}

/// How long [`Connection::answer_logged`] waits.
#[derive(Clone, Copy)]
enum Wait {
    /// Answers only what is done.
    No,
    /// Waits for the oldest batch.
    Oldest,
    /// Waits for every batch.
    All,
}

/// Why serving a connection stopped, for the log.
enum End {
    /// The peer closed, or shutdown finished draining.
    Clean,
    /// Something failed; the reason.
    Failed(String),
}

/// One client connection: its socket halves, and the buffers reused for every frame.
pub(crate) struct Connection {
    node: Arc<Node>,
    id: u64,
    peer: String,
    reader: BufReader<ReadHalf>,
    writer: BufWriter<WriteHalf>,
    body: AlignedVec,
    out: AlignedVec,
    response: BatchResponse,
    scratch: Scratch,
    /// What this connection did since it last published to the node's counters.
    tally: Counts,
    /// `--idle-timeout`, and the interval that checks it.
    idle_check: Option<(Duration, tokio::time::Interval)>,
    /// When the last request arrived (or the connection opened).
    last_request: Instant,
    /// Bytes this connection has taken from the node's buffer budget.
    held: usize,
    /// Warnings this connection has caused in the log.
    warned: u32,
    /// Whether the peer may send requests: it presented the token, or none is needed.
    authenticated: bool,
    /// How fresh this connection's reads must be on a follower (`StaleReads` frame).
    reads: ReadMode,
    /// Batches waiting for the shard's log, in arrival order.
    waiting: VecDeque<Waiting>,
}

impl Connection {
    /// Serves `stream` until the peer closes, a protocol error, or shutdown.
    pub(crate) async fn serve(node: Arc<Node>, id: u64, stream: TcpStream, shutdown: broadcast::Receiver<()>) {
        let peer = stream.peer_addr().map(|a| a.to_string()).unwrap_or_else(|_| "?".into());
        let _ = stream.set_nodelay(true);
        node.counters.add(id, Counter::ConnsOpened, 1);
        let (read, write) = match open(stream, node.config.tls.as_ref(), node.config.read_timeout).await {
            Ok(halves) => halves,
            Err(e) => {
                tracing::debug!(%peer, error = %e, "TLS handshake failed");
                node.counters.add(id, Counter::Io, 1);
                node.counters.add(id, Counter::ConnsClosed, 1);
                return;
            }
        };
        let mut conn = Connection {
            node,
            id,
            peer,
            reader: BufReader::with_capacity(64 * 1024, read),
            writer: BufWriter::with_capacity(64 * 1024, write),
            body: AlignedVec::new(),
            out: AlignedVec::new(),
            response: BatchResponse::default(),
            scratch: Scratch::default(),
            tally: Counts::default(),
            idle_check: None,
            last_request: Instant::now(),
            held: 0,
            warned: 0,
            authenticated: false,
            reads: ReadMode::Linearizable,
            waiting: VecDeque::new(),
        };
        conn.authenticated = conn.node.config.auth.is_none();
        if let Some(limit) = conn.node.config.idle_timeout {
            // Checked four times per timeout: a connection is closed between 1 and 1.25
            // timeouts after its last request.
            let period = (limit / 4).max(Duration::from_millis(1));
            let mut tick = tokio::time::interval_at(Instant::now() + period, period);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            conn.idle_check = Some((limit, tick));
        }
        let mut end = conn.run(shutdown).await;
        // A clean end answers what still waits for the log; a failed one answers nothing
        // more (the client counts those outcomes as unknown).
        if matches!(end, End::Clean)
            && let Err(e) = conn.answer_logged(Wait::All).await
        {
            end = End::Failed(e);
        }
        let _ = conn.writer.flush().await;
        conn.node.buffers.give(conn.held);
        match end {
            End::Clean => tracing::debug!(peer = %conn.peer, "connection closed"),
            End::Failed(why) => {
                if let Some(suppressed) = conn.may_warn() {
                    tracing::warn!(peer = %conn.peer, %why, suppressed, "connection ended");
                }
            }
        }
        conn.tally.conns_closed += 1;
        conn.publish();
    }

    async fn run(&mut self, mut shutdown: broadcast::Receiver<()>) -> End {
        let mut drain_until: Option<Instant> = None;
        loop {
            if let Some(until) = drain_until
                && Instant::now() >= until
            {
                return self.refuse_the_rest().await;
            }
            let must_wait = self.waiting.len() >= MAX_WAITING
                || self.waiting.iter().map(|w| w.response.heap_bytes()).sum::<usize>() > MAX_WAITING_BYTES;
            let wait = if must_wait { Wait::Oldest } else { Wait::No };
            if let Err(e) = self.answer_logged(wait).await {
                return End::Failed(e);
            }
            if self.reader.buffer().is_empty() {
                // Nothing more is queued: publish counters, push out the answers so far, wait.
                self.publish();
                if let Err(e) = self.writer.flush().await {
                    return End::Failed(e.to_string());
                }
                match self.wait_for_input(&mut shutdown, &mut drain_until).await {
                    Ok(true) => {}
                    Ok(false) if drain_until.is_some() => return self.refuse_the_rest().await,
                    Ok(false) => return End::Clean,
                    Err(e) => return End::Failed(e.to_string()),
                }
                if self.reader.buffer().is_empty() {
                    continue;
                }
            }
            let read = match drain_until {
                Some(_) => tokio::time::timeout(DRAIN_IDLE * 5, self.read_frame())
                    .await
                    .unwrap_or(Err(FrameError::Truncated)),
                None => self.read_frame().await,
            };
            let header = match read {
                Ok(Some(h)) => h,
                Ok(None) => return End::Clean,
                Err(e) => {
                    self.reply_connection_error(&e).await;
                    return End::Failed(e.to_string());
                }
            };
            let go_on = match self.dispatch(header).await {
                Ok(go_on) => go_on,
                Err(e) => return End::Failed(format!("cannot encode a reply: {e}")),
            };
            if let Err(e) = self.write_out().await {
                return End::Failed(e.to_string());
            }
            if !go_on {
                self.close_after_error().await;
                return End::Failed("the client presented a wrong token".into());
            }
            self.settle_buffers();
            if self.tally.batches >= PUBLISH_EVERY {
                self.publish();
            }
        }
    }

    /// Waits until there are bytes to read (true), the peer closed (false), or, while
    /// draining, the drain's idle time passed (false). Shutdown starts the drain.
    async fn wait_for_input(
        &mut self,
        shutdown: &mut broadcast::Receiver<()>,
        drain_until: &mut Option<Instant>,
    ) -> std::io::Result<bool> {
        if let Some(until) = *drain_until {
            let wait = DRAIN_IDLE.min(until.saturating_duration_since(Instant::now()));
            return match tokio::time::timeout(wait, self.reader.fill_buf()).await {
                Ok(Ok([])) | Err(_) => Ok(false),
                Ok(Ok(_)) => Ok(true),
                Ok(Err(e)) => Err(e),
            };
        }
        // Waiting here means every request was answered: nothing is in flight. The idle
        // check rides on a coarse interval made once per connection, so waiting costs no
        // timer registration per request.
        loop {
            let reader = &mut self.reader;
            let idle = &mut self.idle_check;
            let logged = self.waiting.front_mut();
            let has_logged = logged.is_some();
            tokio::select! {
                filled = reader.fill_buf() => return Ok(!filled?.is_empty()),
                // The oldest logged batch is done: go round to answer it.
                _ = async { if let Some(w) = logged { w.log.wait().await } }, if has_logged => return Ok(true),
                _ = shutdown.recv() => {
                    *drain_until = Some(Instant::now() + DRAIN_MAX);
                    return Ok(true);
                }
                _ = async { if let Some((_, tick)) = idle { tick.tick().await; } }, if idle.is_some() => {
                    if let Some((limit, _)) = &self.idle_check
                        && self.last_request.elapsed() >= *limit
                    {
                        self.tally.conns_idle_closed += 1;
                        tracing::debug!(peer = %self.peer, "closing an idle connection");
                        return Ok(false);
                    }
                }
            }
        }
    }

    /// Reads the next frame into `self.body`, counting the bytes. A frame that has begun
    /// must arrive whole within `--read-timeout` (a client trickling bytes holds nothing),
    /// and its body must find room in the node's buffer budget within [`BUDGET_WAIT`].
    async fn read_frame(&mut self) -> Result<Option<FrameHeader>, FrameError> {
        let (max_frame, read_timeout) = (self.node.config.max_frame, self.node.config.read_timeout);
        let deadline = Instant::now() + read_timeout;
        let timed_out = || {
            FrameError::Io(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                format!("a frame did not arrive whole within {read_timeout:?}"),
            ))
        };
        let header = tokio::time::timeout_at(deadline, read_header(&mut self.reader, max_frame))
            .await
            .map_err(|_| timed_out())??;
        let Some(header) = header else { return Ok(None) };
        self.last_request = Instant::now();
        let len = header.len as usize;
        if !self.authenticated && (header.kind != FrameKind::AuthRequest || len > MAX_TOKEN_LEN) {
            // Before the token, a peer can make the node read one small frame, nothing more.
            return Err(self.refuse_unauthenticated().await);
        }
        if !self
            .room_for_body(len, deadline.min(Instant::now() + BUDGET_WAIT))
            .await
        {
            self.tally.buffer_budget_closed += 1;
            let message = format!(
                "no room for a frame of {len} bytes: the node's connections hold all of its \
                 --max-buffer-memory; try again later"
            );
            if self
                .encode_error(CONNECTION_ERROR_ID, ErrorCode::OutOfMemory, message.clone())
                .is_ok()
            {
                let _ = self.write_out().await;
                self.close_after_error().await;
            }
            return Err(FrameError::Io(std::io::Error::new(
                std::io::ErrorKind::OutOfMemory,
                message,
            )));
        }
        tokio::time::timeout_at(deadline, read_body(&mut self.reader, &mut self.body, len))
            .await
            .map_err(|_| timed_out())??;
        self.tally.bytes_in += (HEADER_LEN + len) as u64;
        Ok(Some(header))
    }

    /// Answers a request sent before the token (or a token frame too large to be one) with
    /// the reason, and ends the connection.
    async fn refuse_unauthenticated(&mut self) -> FrameError {
        self.tally.auth_failed += 1;
        if let Some(suppressed) = self.may_warn() {
            tracing::warn!(peer = %self.peer, suppressed, "refused a request sent without the token");
        }
        let message = "authentication required: this node has a token; give the client the same \
                       --auth-token-file (or KV_AUTH_TOKEN_FILE)";
        if self
            .encode_error(CONNECTION_ERROR_ID, ErrorCode::AuthRequired, message.into())
            .is_ok()
        {
            let _ = self.write_out().await;
            self.close_after_error().await;
        }
        FrameError::Io(std::io::Error::new(std::io::ErrorKind::PermissionDenied, message))
    }

    /// Checks a presented token: `AuthOk`, or an error reply and false (close).
    fn authenticate(&mut self, id: u64) -> Result<bool, WireError> {
        let accepted = self.node.config.auth.as_ref().is_none_or(|t| t.matches(&self.body));
        if accepted {
            self.authenticated = true;
            encode_empty_frame(FrameKind::AuthOk, id, &mut self.out);
            return Ok(true);
        }
        self.tally.auth_failed += 1;
        if let Some(suppressed) = self.may_warn() {
            tracing::warn!(peer = %self.peer, suppressed, "refused a wrong token");
        }
        self.encode_error(id, ErrorCode::AuthFailed, "wrong token".into())?;
        Ok(false)
    }

    /// Bytes this connection's buffers hold now.
    fn buffer_bytes(&self) -> usize {
        self.body.capacity() + self.out.capacity() + self.response.heap_bytes()
    }

    /// Makes sure the buffers may grow to hold a body of `len` bytes, taking what that needs
    /// beyond the free allowance from the node's budget; waits for room until `deadline`.
    async fn room_for_body(&mut self, len: usize, deadline: Instant) -> bool {
        let grow = len.saturating_sub(self.body.capacity());
        let need = (self.buffer_bytes() + grow)
            .saturating_sub(FREE_PER_CONNECTION)
            .saturating_sub(self.held);
        if need == 0 {
            return true;
        }
        loop {
            if self.node.buffers.try_take(need) {
                self.held += need;
                return true;
            }
            if Instant::now() + BUDGET_RETRY > deadline {
                return false;
            }
            tokio::time::sleep(BUDGET_RETRY).await;
        }
    }

    /// Runs one request and leaves its encoded reply in `self.out`; false when the
    /// connection must be closed after the reply (a wrong token).
    async fn dispatch(&mut self, header: FrameHeader) -> Result<bool, WireError> {
        match header.kind {
            FrameKind::BatchRequest => match BatchView::parse(&self.body) {
                Ok(batch) => {
                    let node = &self.node;
                    let mut room = ReplyAllowance::new(&node.buffers, batch.len(), node.config.max_frame as usize);
                    let log = node.execute_reading(
                        &batch,
                        &mut self.response,
                        &mut room,
                        &mut self.scratch,
                        &mut self.tally,
                        self.reads,
                    );
                    self.held += room.taken();
                    self.tally.batches += 1;
                    match log {
                        None => encode_frame(FrameKind::BatchResponse, header.id, &self.response, &mut self.out)
                            .map(|()| true),
                        Some(log) => {
                            // Answered once its entry is applied (see `answer_logged`);
                            // the next requests are read meanwhile.
                            self.waiting.push_back(Waiting {
                                id: header.id,
                                response: std::mem::take(&mut self.response),
                                log,
                            });
                            self.out.clear();
                            Ok(true)
                        }
                    }
                }
                Err(e) => {
                    if let Some(suppressed) = self.may_warn() {
                        tracing::warn!(peer = %self.peer, id = header.id, error = %e, suppressed, "rejected a malformed batch");
                    }
                    tracing::debug!(peer = %self.peer, id = header.id, detail = e.detail(), "validation detail");
                    self.tally.malformed_body += 1;
                    self.encode_error(header.id, ErrorCode::MalformedBody, e.to_string())
                        .map(|()| true)
                }
            },
            FrameKind::RaftRequest => match self.node.serve_raft(&self.body).await {
                Some(reply) => {
                    self.out.clear();
                    raw_frame(&mut self.out, FrameKind::RaftResponse, header.id, &reply);
                    Ok(true)
                }
                None => self
                    .encode_error(
                        header.id,
                        ErrorCode::Refused,
                        "this node is not a member of a replica group".into(),
                    )
                    .map(|()| true),
            },
            FrameKind::StaleReads => match <[u8; 4]>::try_from(&self.body[..]) {
                Ok(ms) => {
                    self.reads = match u32::from_le_bytes(ms) {
                        0 => ReadMode::Linearizable,
                        ms => ReadMode::Stale(Duration::from_millis(u64::from(ms))),
                    };
                    encode_empty_frame(FrameKind::ConfigOk, header.id, &mut self.out);
                    Ok(true)
                }
                Err(_) => {
                    self.tally.malformed_body += 1;
                    self.encode_error(
                        header.id,
                        ErrorCode::MalformedBody,
                        "a StaleReads body is 4 bytes (milliseconds, little-endian)".into(),
                    )
                    .map(|()| true)
                }
            },
            FrameKind::StatsRequest => {
                self.publish();
                encode_frame(FrameKind::StatsResponse, header.id, &self.node.stats(), &mut self.out).map(|()| true)
            }
            FrameKind::AuthRequest => self.authenticate(header.id),
            FrameKind::ConfigRequest => match parse_config_request(&self.body) {
                Ok(change) => match self.node.configure(&change) {
                    Ok(()) => {
                        encode_empty_frame(FrameKind::ConfigOk, header.id, &mut self.out);
                        Ok(true)
                    }
                    Err(why) => self.encode_error(header.id, ErrorCode::Refused, why).map(|()| true),
                },
                Err(e) => {
                    self.tally.malformed_body += 1;
                    self.encode_error(header.id, ErrorCode::MalformedBody, e.to_string())
                        .map(|()| true)
                }
            },
            other @ (FrameKind::BatchResponse
            | FrameKind::StatsResponse
            | FrameKind::ErrorResponse
            | FrameKind::AuthOk
            | FrameKind::ConfigOk
            | FrameKind::RaftResponse
            | FrameKind::NotLeader) => {
                self.tally.bad_frame += 1;
                self.encode_error(
                    header.id,
                    ErrorCode::BadFrame,
                    format!("a client may not send {other:?} frames"),
                )
                .map(|()| true)
            }
        }
    }

    /// Answers the logged batches whose entries are applied, oldest first, waiting for none,
    /// the oldest, or all of them. An error ends the connection: a batch whose log failed
    /// may have been logged, so it gets no answer rather than a wrong one (the client counts
    /// its outcome as unknown).
    async fn answer_logged(&mut self, wait: Wait) -> Result<(), String> {
        let max_reply = self.node.config.max_frame as usize;
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
                Some(Err(LogError::Failed(e))) => {
                    // Its outcomes are taken: it must not be waited for again (a oneshot
                    // that has answered panics when polled again) when the caller drains
                    // the queue after this error.
                    self.waiting.pop_front();
                    return Err(format!("the shard's log failed: {e}"));
                }
                Some(Err(LogError::NotLeader(leader))) => Some(leader),
                Some(Ok(())) => None,
            };
            let Some(done) = self.waiting.pop_front() else { break };
            match not_leader {
                // Nothing of the batch ran: the client sends it to the leader.
                Some(leader) => {
                    self.out.clear();
                    raw_frame(
                        &mut self.out,
                        FrameKind::NotLeader,
                        done.id,
                        leader.unwrap_or_default().as_bytes(),
                    );
                }
                None => encode_frame(FrameKind::BatchResponse, done.id, &done.response, &mut self.out)
                    .map_err(|e| format!("cannot encode a reply: {e}"))?,
            }
            self.write_out().await.map_err(|e| e.to_string())?;
            if self.response.heap_bytes() < done.response.heap_bytes() {
                self.response = done.response;
            }
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
        self.tally.bytes_out += self.out.len() as u64;
        self.writer.write_all(&self.out).await
    }

    /// Counts a frame that could not be read and, when the peer is still there to hear it,
    /// says why on the connection as a whole before the connection is closed.
    async fn reply_connection_error(&mut self, e: &FrameError) {
        let (counter, code) = match e {
            FrameError::TooLarge { .. } => (Counter::FrameTooLarge, Some(ErrorCode::FrameTooLarge)),
            FrameError::VersionMismatch { .. } => (Counter::BadFrame, Some(ErrorCode::VersionMismatch)),
            FrameError::BadMagic(_) | FrameError::UnknownKind(_) => (Counter::BadFrame, Some(ErrorCode::BadFrame)),
            FrameError::Truncated | FrameError::Io(_) => (Counter::Io, None),
        };
        *self.tally.get_mut(counter) += 1;
        if let Some(code) = code
            && self.encode_error(CONNECTION_ERROR_ID, code, e.to_string()).is_ok()
        {
            let _ = self.write_out().await;
            self.close_after_error().await;
        }
    }

    /// Sends what is buffered, ends our side, and reads and drops what the peer still
    /// sends for a moment: closing a socket with unread input makes the kernel send a reset,
    /// which can destroy the error reply before the peer reads it.
    async fn close_after_error(&mut self) {
        self.publish();
        let _ = self.writer.flush().await;
        let _ = self.writer.shutdown().await;
        let until = Instant::now() + REFUSE_MAX;
        let mut sink = [0u8; 16 * 1024];
        while let Ok(Ok(n)) = tokio::time::timeout_at(until, self.reader.read(&mut sink)).await
            && n > 0
        {}
    }

    /// The drain is over: every request that still arrives (already buffered, or sent by a
    /// client that has not heard yet) is answered `ShuttingDown` (it was not run) until the
    /// client goes quiet for [`LAST_READ`] or [`REFUSE_MAX`] passes. A client therefore
    /// gets an answer for every request, never a reset.
    async fn refuse_the_rest(&mut self) -> End {
        let until = Instant::now() + REFUSE_MAX;
        while Instant::now() < until {
            if self.reader.buffer().is_empty() {
                if self.writer.flush().await.is_err() {
                    break;
                }
                match tokio::time::timeout(LAST_READ, self.reader.fill_buf()).await {
                    Ok(Ok(buf)) if !buf.is_empty() => {}
                    _ => break,
                }
            }
            let Ok(Ok(Some(header))) = tokio::time::timeout(LAST_READ, self.read_frame()).await else {
                break;
            };
            let refused = self.encode_error(
                header.id,
                ErrorCode::ShuttingDown,
                "the node is shutting down; the request was not run".into(),
            );
            if refused.is_err() || self.write_out().await.is_err() {
                break;
            }
        }
        End::Clean
    }

    /// After a reply is written: frees buffers a large frame left behind (see
    /// [`KEEP_BUFFER_BYTES`]), and makes what is taken from the node's budget match what
    /// the buffers kept for the next frame hold beyond the free allowance (giving back the
    /// rest, or freeing the buffers when the budget has no room to keep them).
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
        let keep = self.buffer_bytes().saturating_sub(FREE_PER_CONNECTION);
        if keep > self.held && !self.node.buffers.try_take(keep - self.held) {
            self.body = AlignedVec::new();
            self.out = AlignedVec::new();
            self.response = BatchResponse::default();
            self.node.buffers.give(self.held);
            self.held = 0;
            return;
        }
        if keep > self.held {
            self.held = keep;
        } else {
            self.node.buffers.give(self.held - keep);
            self.held = keep;
        }
    }

    /// Whether this connection may log a warning now (see `warn_limit`): `Some(n)` with
    /// the number of warnings suppressed node-wide since the last one written.
    fn may_warn(&mut self) -> Option<u64> {
        if self.warned >= PER_CONNECTION {
            self.tally.log_suppressed += 1;
            return None;
        }
        match self.node.warnings.admit() {
            Some(suppressed) => {
                self.warned += 1;
                Some(suppressed)
            }
            None => {
                self.tally.log_suppressed += 1;
                None
            }
        }
    }

    /// Adds the local tally to the node's counters and starts it again from zero.
    fn publish(&mut self) {
        self.node.counters.add_counts(self.id, &self.tally);
        self.tally = Counts::default();
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
