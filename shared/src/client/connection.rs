//! One TCP connection to one node, shared by many tasks, with pipelining.
//!
//! Callers encode a frame and queue it. A caller alone on the connection (no other request in
//! flight) writes it itself when no one else is writing, so the batch-1 round trip reaches the
//! socket with no hand-off to another task. Otherwise the connection's flusher task writes
//! everything queued with one vectored `write`, after letting the other ready tasks queue
//! theirs: many callers share one syscall (one `writev` per batch cost kvbench more than
//! generating the batch; see docs/PERFORMANCE.md). A reader
//! task matches each response to its caller by request id. Up to `pipeline` requests may be in
//! flight at once. When the connection fails, every caller waiting on it gets the same
//! `NodeDown` error, and the connection is marked dead so the pool can replace it.

use std::collections::HashMap;
use std::io::IoSlice;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use rkyv::util::AlignedVec;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::io::{AsyncWriteExt, BufReader};
use tokio::net::TcpStream;
use tokio::sync::{Mutex as AsyncMutex, Notify, OwnedSemaphorePermit, Semaphore, oneshot};

use super::ClientError;
use crate::auth::AuthToken;
use crate::frame::{CONNECTION_ERROR_ID, FrameError, FrameKind, HEADER_LEN, MAX_FRAME_LIMIT, append_frame, read_frame};
use crate::tls::TlsClient;
use crate::wire::{ReplyView, WireError, parse_error_reply};

/// The two directions of a connection, plain TCP or TLS.
type ReadHalf = Box<dyn AsyncRead + Send + Unpin>;
type WriteHalf = Box<dyn AsyncWrite + Send + Unpin>;

/// The request id of the token frame (ids of requests start at 1 and never get here).
const AUTH_REQUEST_ID: u64 = u64::MAX;

// A connection whose requests have waited its stall threshold (see `super::rtt`: at least
// a second, more when its round trips have been long) with no reply at all is stalled: new
// requests fail at once (`ClientError::Stalled`) rather than queue behind the old ones,
// which wait for their timeout. A stopped process (SIGSTOP, a debugger, a swap storm)
// answers nothing.
/// How often a caller waiting for a pipeline slot checks for a stall.
const STALL_CHECK: Duration = Duration::from_millis(100);

/// A frame at least this large is written by its caller, not held for the flusher: its
/// syscall is already paid for by its bytes, and holding it while other tasks build their
/// batches (hundreds of microseconds at batch 8192) would leave the server idle.
const WRITES_ITSELF_BYTES: usize = 16 * 1024;

/// Most buffers a connection keeps for reuse, and the largest it keeps.
const POOLED_BUFFERS: usize = 256;
const POOLED_BYTES: usize = 8 << 20;

/// Frame buffers reused, so that large frames do not cost fresh memory (page faults and
/// zeroing, 9% of kvbench's CPU at batch 1024) every time. A connection has one pool for its
/// requests and one for its replies. A buffer comes back with its old bytes: a reply is
/// read over them (`read_body` zeroes only growth), a request clears it first.
#[derive(Default)]
struct BufferPool {
    free: Mutex<Vec<AlignedVec>>,
}

impl BufferPool {
    fn take(&self) -> AlignedVec {
        self.free.lock().pop().unwrap_or_default()
    }

    fn give(&self, buf: AlignedVec) {
        if buf.capacity() > POOLED_BYTES {
            return;
        }
        let mut free = self.free.lock();
        if free.len() < POOLED_BUFFERS {
            free.push(buf);
        }
    }
}

/// A response frame, owned by the caller. Its buffer goes back to the connection's pool
/// when it is dropped.
pub struct Reply {
    /// What the body is.
    pub kind: FrameKind,
    /// The reply's body, aligned for rkyv.
    pub body: AlignedVec,
    addr: Arc<str>,
    pool: Arc<BufferPool>,
}

impl Drop for Reply {
    fn drop(&mut self) {
        self.pool.give(std::mem::take(&mut self.body));
    }
}

impl std::fmt::Debug for Reply {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Reply")
            .field("kind", &self.kind)
            .field("len", &self.body.len())
            .field("addr", &self.addr)
            .finish()
    }
}

impl Reply {
    /// The batch results, or the server's refusal of the whole request.
    pub fn batch(&self) -> Result<ReplyView<'_>, ClientError> {
        match self.kind {
            FrameKind::BatchResponse => ReplyView::parse(&self.body).map_err(|e| self.protocol(e)),
            _ => Err(self.unexpected()),
        }
    }

    /// The error a non-success reply stands for.
    pub fn unexpected(&self) -> ClientError {
        let addr = self.addr.to_string();
        match self.kind {
            FrameKind::ErrorResponse => match parse_error_reply(&self.body) {
                Ok(e) => ClientError::Server {
                    addr,
                    code: e.code,
                    message: e.message,
                },
                Err(e) => self.protocol(e),
            },
            FrameKind::NotLeader => ClientError::NotLeader {
                addr,
                leader: std::str::from_utf8(&self.body)
                    .ok()
                    .filter(|l| !l.is_empty())
                    .map(str::to_string),
            },
            other => ClientError::Protocol {
                addr,
                reason: format!("unexpected reply kind {other:?}"),
            },
        }
    }

    fn protocol(&self, e: WireError) -> ClientError {
        ClientError::Protocol {
            addr: self.addr.to_string(),
            reason: e.to_string(),
        }
    }
}

/// A request's reply channel, and when it was sent (for the round-trip estimate).
type Waiter = (oneshot::Sender<Result<Reply, ClientError>>, Instant);

struct Pending {
    waiters: HashMap<u64, Waiter>,
    /// The round trips seen, which set the stall threshold.
    rtt: super::rtt::RttEstimate,
    /// Since when requests have waited with no reply arriving: set when the first request
    /// of an idle connection is sent, moved on by every reply, cleared when none waits.
    silent_since: Option<Instant>,
    /// Set once the connection has failed; later callers get this error at once.
    failed: Option<ClientError>,
}

/// Frames waiting to be written, and the socket's write half.
struct Outbox {
    queue: Mutex<Vec<AlignedVec>>,
    writer: AsyncMutex<WriteHalf>,
    /// Wakes the flusher: frames are queued that no caller is writing, or the connection
    /// is closing.
    wake: Notify,
    closed: AtomicBool,
}

impl Outbox {
    /// Writes queued frames until the queue is empty, giving their buffers back to `pool`.
    async fn drain(&self, writer: &mut WriteHalf, pool: &BufferPool) -> std::io::Result<()> {
        loop {
            let frames = std::mem::take(&mut *self.queue.lock());
            if frames.is_empty() {
                return Ok(());
            }
            write_frames(writer, &frames).await?;
            for f in frames {
                pool.give(f);
            }
        }
    }
}

/// A pipelined connection to one node.
pub(crate) struct Connection {
    addr: Arc<str>,
    outbox: Arc<Outbox>,
    pool: Arc<BufferPool>,
    pending: Arc<Mutex<Pending>>,
    next_id: AtomicU64,
    in_flight: Arc<Semaphore>,
    pipeline: usize,
    alive: Arc<AtomicBool>,
    max_frame: u32,
}

/// A request that has been queued for sending; `wait` for its reply.
pub struct InFlight {
    id: u64,
    rx: oneshot::Receiver<Result<Reply, ClientError>>,
    pending: Arc<Mutex<Pending>>,
    addr: Arc<str>,
    _permit: OwnedSemaphorePermit,
    /// Sent to a replica group's member chosen for reads (not the leader path).
    pub(crate) reader: bool,
}

impl InFlight {
    /// The address of the node it was sent to.
    pub(crate) fn addr(&self) -> Arc<str> {
        self.addr.clone()
    }

    /// How long this request may wait before its node counts as stalled (see
    /// `client::rtt`): at least a second, more on a connection whose round trips are long.
    pub fn stall_after(&self) -> Duration {
        self.pending.lock().rtt.stall_after()
    }

    /// Waits for the reply, at most `timeout`.
    pub async fn wait(self, timeout: Duration) -> Result<Reply, ClientError> {
        match tokio::time::timeout(timeout, self.rx).await {
            Ok(Ok(result)) => result,
            Ok(Err(_)) => Err(ClientError::NodeDown {
                addr: self.addr.to_string(),
                reason: "connection closed".into(),
            }),
            Err(_) => {
                let mut p = self.pending.lock();
                p.waiters.remove(&self.id);
                if p.waiters.is_empty() {
                    p.silent_since = None;
                }
                drop(p);
                Err(ClientError::Timeout {
                    addr: self.addr.to_string(),
                    after: timeout,
                })
            }
        }
    }
}

impl Connection {
    /// Connects to `addr` within `timeout` (over TLS if `tls` is given), and presents
    /// `auth` if given.
    pub async fn open(
        addr: &str,
        pipeline: usize,
        max_frame: u32,
        timeout: Duration,
        auth: Option<&AuthToken>,
        tls: Option<&TlsClient>,
    ) -> Result<Connection, ClientError> {
        let connect_err = |reason: String| ClientError::Connect {
            addr: addr.to_string(),
            reason,
        };
        let stream = tokio::time::timeout(timeout, TcpStream::connect(addr))
            .await
            .map_err(|_| connect_err(format!("timed out after {timeout:?}")))?
            .map_err(|e| connect_err(e.to_string()))?;
        stream.set_nodelay(true).map_err(|e| connect_err(e.to_string()))?;
        let (read, write): (ReadHalf, WriteHalf) = match tls {
            None => {
                let mut stream = stream;
                if let Some(token) = auth {
                    tokio::time::timeout(timeout, authenticate(&mut stream, addr, token))
                        .await
                        .map_err(|_| connect_err(format!("no answer to the token within {timeout:?}")))??;
                }
                let (read, write) = stream.into_split();
                (Box::new(read), Box::new(write))
            }
            Some(tls) => {
                let mut stream = tokio::time::timeout(timeout, tls.connect(addr, stream))
                    .await
                    .map_err(|_| connect_err(format!("TLS handshake timed out after {timeout:?}")))?
                    .map_err(|e| connect_err(format!("TLS handshake failed: {e}")))?;
                if let Some(token) = auth {
                    tokio::time::timeout(timeout, authenticate(&mut stream, addr, token))
                        .await
                        .map_err(|_| connect_err(format!("no answer to the token within {timeout:?}")))??;
                }
                let (read, write) = tokio::io::split(stream);
                (Box::new(read), Box::new(write))
            }
        };
        Ok(Connection::over(addr.into(), read, write, pipeline, max_frame))
    }

    /// A connection over an open (and, where needed, authenticated) stream's two halves;
    /// starts its reader and its flusher.
    fn over(addr: Arc<str>, read: ReadHalf, write: WriteHalf, pipeline: usize, max_frame: u32) -> Connection {
        let pending = Arc::new(Mutex::new(Pending {
            waiters: HashMap::new(),
            silent_since: None,
            rtt: Default::default(),
            failed: None,
        }));
        let alive = Arc::new(AtomicBool::new(true));
        // Requests and replies keep buffers apart: a reply read into a request's smaller
        // buffer would zero its growth (10% of kvbench's CPU at batch 8192).
        let pool = Arc::new(BufferPool::default());
        tokio::spawn(read_loop(
            read,
            pending.clone(),
            alive.clone(),
            addr.clone(),
            Arc::new(BufferPool::default()),
        ));
        let outbox = Arc::new(Outbox {
            queue: Mutex::new(Vec::new()),
            writer: AsyncMutex::new(write),
            wake: Notify::new(),
            closed: AtomicBool::new(false),
        });
        tokio::spawn(flush_loop(
            outbox.clone(),
            pool.clone(),
            pending.clone(),
            alive.clone(),
            addr.clone(),
        ));
        Connection {
            addr,
            pool,
            outbox,
            pending,
            next_id: AtomicU64::new(1),
            in_flight: Arc::new(Semaphore::new(pipeline.max(1))),
            pipeline: pipeline.max(1),
            alive,
            max_frame,
        }
    }

    /// Fails with `Stalled` once requests have waited the stall threshold with no reply.
    fn check_not_stalled(&self) -> Result<(), ClientError> {
        let p = self.pending.lock();
        match p.silent_since.map(|t| t.elapsed()) {
            Some(silent_for) if silent_for >= p.rtt.stall_after() => Err(ClientError::Stalled {
                addr: self.addr.to_string(),
                silent_for,
            }),
            _ => Ok(()),
        }
    }

    /// Whether no request waits for a reply on this connection.
    pub(crate) fn is_idle(&self) -> bool {
        self.pending.lock().waiters.is_empty()
    }

    /// False once the connection has failed; the pool then opens a new one.
    pub fn is_alive(&self) -> bool {
        self.alive.load(Ordering::Relaxed)
    }

    /// Encodes a request with a fresh id (via `encode`) and queues it for sending.
    ///
    /// Waits while `pipeline` requests are already in flight on this connection.
    pub async fn start(
        &self,
        encode: impl FnOnce(u64, &mut AlignedVec) -> Result<(), WireError>,
    ) -> Result<InFlight, ClientError> {
        // A node that has answered nothing for a while fails new requests at once, also
        // those waiting for a pipeline slot, so callers' other nodes keep going.
        let permit = match self.in_flight.clone().try_acquire_owned() {
            Ok(permit) => permit,
            Err(_) => {
                let acquire = self.in_flight.clone().acquire_owned();
                tokio::pin!(acquire);
                loop {
                    self.check_not_stalled()?;
                    tokio::select! {
                        permit = &mut acquire => break permit.map_err(|_| self.down("connection closed"))?,
                        _ = tokio::time::sleep(STALL_CHECK) => {}
                    }
                }
            }
        };
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let mut frame = self.pool.take();
        frame.clear();
        encode(id, &mut frame).map_err(|e| ClientError::Encode { reason: e.to_string() })?;
        let body_len = frame.len() - HEADER_LEN;
        if body_len > self.max_frame as usize {
            return Err(ClientError::FrameTooLarge {
                len: body_len,
                max: self.max_frame,
            });
        }
        let (tx, rx) = oneshot::channel();
        {
            let mut p = self.pending.lock();
            if let Some(e) = &p.failed {
                return Err(e.clone());
            }
            let stall_after = p.rtt.stall_after();
            if let Some(silent_for) = p.silent_since.map(|t| t.elapsed()).filter(|&d| d >= stall_after) {
                return Err(ClientError::Stalled {
                    addr: self.addr.to_string(),
                    silent_for,
                });
            }
            if p.waiters.is_empty() {
                p.silent_since = Some(Instant::now());
            }
            p.waiters.insert(id, (tx, Instant::now()));
        }
        if let Err(e) = self.send(frame).await {
            let err = self.down(&e.to_string());
            fail_all(&self.pending, &self.alive, err.clone());
            return Err(err);
        }
        Ok(InFlight {
            id,
            rx,
            pending: self.pending.clone(),
            addr: self.addr.clone(),
            _permit: permit,
            reader: false,
        })
    }

    /// Queues `frame`. A caller alone on the connection, or with a frame large enough to pay
    /// for its own syscall, writes everything queued itself unless someone else is writing;
    /// otherwise the flusher writes it.
    async fn send(&self, frame: AlignedVec) -> std::io::Result<()> {
        let large = frame.len() >= WRITES_ITSELF_BYTES;
        self.outbox.queue.lock().push(frame);
        // This caller holds one of the pipeline's permits: all free but it means alone.
        let alone = self.in_flight.available_permits() + 1 >= self.pipeline;
        let writer = match alone || large {
            true => self.outbox.writer.try_lock().ok(),
            false => None,
        };
        let Some(mut writer) = writer else {
            self.outbox.wake.notify_one();
            return Ok(());
        };
        // If this future is dropped mid-write the stream is out of step: mark it dead.
        let mut guard = DeadUnlessDone {
            conn: self,
            done: false,
        };
        self.outbox.drain(&mut writer, &self.pool).await?;
        guard.done = true;
        drop(writer);
        // A frame queued after our last look but before we let go of the writer would be
        // stranded: hand it to the flusher.
        if !self.outbox.queue.lock().is_empty() {
            self.outbox.wake.notify_one();
        }
        Ok(())
    }

    fn down(&self, reason: &str) -> ClientError {
        ClientError::NodeDown {
            addr: self.addr.to_string(),
            reason: reason.to_string(),
        }
    }
}

impl Drop for Connection {
    fn drop(&mut self) {
        // Dropping the write half (once the flusher has let go of it too) shuts the socket for
        // writing; the server then closes, the reader sees EOF and fails whatever still waits.
        self.in_flight.close();
        self.outbox.closed.store(true, Ordering::Relaxed);
        self.outbox.wake.notify_one();
    }
}

/// Marks the connection dead when dropped before `done` is set.
struct DeadUnlessDone<'a> {
    conn: &'a Connection,
    done: bool,
}

impl Drop for DeadUnlessDone<'_> {
    fn drop(&mut self) {
        if !self.done {
            fail_all(
                &self.conn.pending,
                &self.conn.alive,
                self.conn.down("a write was interrupted"),
            );
        }
    }
}

/// The connection's flusher: writes what callers queued but did not write themselves.
///
/// Before taking the queue it yields once, so the other tasks ready on this worker queue
/// their frames first and one vectored write carries them all.
async fn flush_loop(
    outbox: Arc<Outbox>,
    pool: Arc<BufferPool>,
    pending: Arc<Mutex<Pending>>,
    alive: Arc<AtomicBool>,
    addr: Arc<str>,
) {
    loop {
        outbox.wake.notified().await;
        if outbox.closed.load(Ordering::Relaxed) {
            return;
        }
        tokio::task::yield_now().await;
        let mut writer = outbox.writer.lock().await;
        if let Err(e) = outbox.drain(&mut writer, &pool).await {
            let err = ClientError::NodeDown {
                addr: addr.to_string(),
                reason: e.to_string(),
            };
            fail_all(&pending, &alive, err);
            return;
        }
    }
}

/// Writes all of `frames` with as few vectored writes as the socket allows.
async fn write_frames(writer: &mut WriteHalf, frames: &[AlignedVec]) -> std::io::Result<()> {
    let mut slices: Vec<IoSlice<'_>> = frames.iter().map(|f| IoSlice::new(f.as_slice())).collect();
    let mut rest = &mut slices[..];
    while !rest.is_empty() {
        let n = writer.write_vectored(rest).await?;
        if n == 0 {
            return Err(std::io::ErrorKind::WriteZero.into());
        }
        IoSlice::advance_slices(&mut rest, n);
    }
    Ok(())
}

/// Marks the connection failed and answers every waiter with `err`.
fn fail_all(pending: &Mutex<Pending>, alive: &AtomicBool, err: ClientError) {
    alive.store(false, Ordering::Relaxed);
    let waiters = {
        let mut p = pending.lock();
        if p.failed.is_none() {
            p.failed = Some(err.clone());
        }
        std::mem::take(&mut p.waiters)
    };
    for (_, (w, _)) in waiters {
        let _ = w.send(Err(err.clone()));
    }
}

/// Presents `token` as the connection's first frame and waits for the server's verdict.
async fn authenticate<S: AsyncRead + AsyncWrite + Unpin>(
    stream: &mut S,
    addr: &str,
    token: &AuthToken,
) -> Result<(), ClientError> {
    let mut frame = Vec::with_capacity(HEADER_LEN + token.as_bytes().len());
    append_frame(&mut frame, FrameKind::AuthRequest, AUTH_REQUEST_ID, token.as_bytes());
    let lost = |e: &dyn std::fmt::Display| ClientError::Connect {
        addr: addr.to_string(),
        reason: format!("while presenting the token: {e}"),
    };
    stream.write_all(&frame).await.map_err(|e| lost(&e))?;
    let mut body = AlignedVec::new();
    let header = read_frame(stream, &mut body, MAX_FRAME_LIMIT)
        .await
        .map_err(|e| lost(&e))?
        .ok_or_else(|| lost(&"the server closed the connection"))?;
    match header.kind {
        FrameKind::AuthOk => Ok(()),
        FrameKind::ErrorResponse => {
            let refusal = parse_error_reply(&body).map_err(|e| lost(&e))?;
            Err(ClientError::Server {
                addr: addr.to_string(),
                code: refusal.code,
                message: refusal.message,
            })
        }
        other => Err(lost(&format!("unexpected reply {other:?}"))),
    }
}

async fn read_loop(
    read: ReadHalf,
    pending: Arc<Mutex<Pending>>,
    alive: Arc<AtomicBool>,
    addr: Arc<str>,
    pool: Arc<BufferPool>,
) {
    let mut reader = BufReader::with_capacity(64 * 1024, read);
    // Why the connection ended: a peer that is not speaking our protocol (or another
    // version of it) is a protocol error; anything else means the node went away.
    let (protocol, reason) = loop {
        let mut body = pool.take();
        // Replies are read up to the largest limit any server may have: a server bounds its
        // replies by its own `--max-frame`, which may be above this client's request limit.
        match read_frame(&mut reader, &mut body, MAX_FRAME_LIMIT).await {
            Ok(Some(header)) => {
                let waiter = {
                    let mut p = pending.lock();
                    let waiter = p.waiters.remove(&header.id);
                    p.silent_since = (!p.waiters.is_empty()).then(Instant::now);
                    if let Some((_, sent)) = &waiter {
                        p.rtt.sample(sent.elapsed());
                    }
                    waiter.map(|(w, _)| w)
                };
                if header.id == CONNECTION_ERROR_ID && header.kind == FrameKind::ErrorResponse {
                    // The server is refusing the connection as a whole.
                    let refusal = parse_error_reply(&body);
                    let mismatch = refusal.as_ref().is_ok_and(|e| {
                        matches!(
                            e.code,
                            crate::wire::ErrorCode::VersionMismatch
                                | crate::wire::ErrorCode::BadFrame
                                | crate::wire::ErrorCode::AuthRequired
                        )
                    });
                    let why = refusal.map(|e| e.message).unwrap_or_else(|e| e.to_string());
                    break (mismatch, format!("server closed the connection: {why}"));
                }
                if let Some(w) = waiter {
                    let _ = w.send(Ok(Reply {
                        kind: header.kind,
                        body,
                        addr: addr.clone(),
                        pool: pool.clone(),
                    }));
                } else {
                    // Nobody waits any more (timed out): keep the buffer.
                    pool.give(body);
                }
            }
            Ok(None) => break (false, "connection closed by the server".to_string()),
            Err(FrameError::Io(e)) => break (false, e.to_string()),
            Err(FrameError::Truncated) => break (false, FrameError::Truncated.to_string()),
            Err(e) => break (true, format!("not a kvd reply: {e}")),
        }
    };
    tracing::debug!(%addr, %reason, "connection ended");
    let addr = addr.to_string();
    let err = if protocol {
        ClientError::Protocol { addr, reason }
    } else {
        ClientError::NodeDown { addr, reason }
    };
    fail_all(&pending, &alive, err);
}

#[cfg(test)]
mod tests {
    use std::pin::Pin;
    use std::sync::atomic::AtomicUsize;
    use std::task::{Context, Poll};

    use super::*;
    use crate::frame::FrameHeader;

    /// A write half that takes everything at once and counts its calls and bytes.
    struct CountingWriter {
        calls: Arc<AtomicUsize>,
        bytes: Arc<AtomicUsize>,
    }

    impl AsyncWrite for CountingWriter {
        fn poll_write(self: Pin<&mut Self>, _: &mut Context<'_>, buf: &[u8]) -> Poll<std::io::Result<usize>> {
            self.calls.fetch_add(1, Ordering::Relaxed);
            self.bytes.fetch_add(buf.len(), Ordering::Relaxed);
            Poll::Ready(Ok(buf.len()))
        }

        fn poll_write_vectored(
            self: Pin<&mut Self>,
            _: &mut Context<'_>,
            bufs: &[IoSlice<'_>],
        ) -> Poll<std::io::Result<usize>> {
            let n = bufs.iter().map(|b| b.len()).sum();
            self.calls.fetch_add(1, Ordering::Relaxed);
            self.bytes.fetch_add(n, Ordering::Relaxed);
            Poll::Ready(Ok(n))
        }

        fn is_write_vectored(&self) -> bool {
            true
        }

        fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<std::io::Result<()>> {
            Poll::Ready(Ok(()))
        }

        fn poll_shutdown(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<std::io::Result<()>> {
            Poll::Ready(Ok(()))
        }
    }

    /// A connection (pipeline 64) whose writes are counted (calls, bytes), reading from a
    /// peer that never answers (keep the returned end alive).
    fn counted() -> (Connection, Arc<AtomicUsize>, Arc<AtomicUsize>, tokio::io::DuplexStream) {
        let (calls, bytes) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
        let (quiet, peer) = tokio::io::duplex(64);
        let writer = CountingWriter {
            calls: calls.clone(),
            bytes: bytes.clone(),
        };
        let conn = Connection::over("test".into(), Box::new(quiet), Box::new(writer), 64, 1 << 20);
        (conn, calls, bytes, peer)
    }

    fn frame(id: u64, buf: &mut AlignedVec) -> Result<(), WireError> {
        let header = FrameHeader {
            kind: FrameKind::BatchRequest,
            len: 4,
            id,
        };
        buf.extend_from_slice(&header.encode());
        buf.extend_from_slice(b"body");
        Ok(())
    }

    /// Requests started while others are in flight are written together (one `writev` per
    /// request cost kvbench more than building the batch), and none is left unwritten.
    #[tokio::test(flavor = "current_thread")]
    async fn requests_in_flight_together_share_writes() {
        let (conn, calls, bytes, _peer) = counted();
        let conn = Arc::new(conn);
        const REQUESTS: usize = 32;
        let started: Vec<_> = (0..REQUESTS)
            .map(|_| {
                let conn = conn.clone();
                tokio::spawn(async move { conn.start(frame).await })
            })
            .collect();
        let mut held = Vec::new();
        for s in started {
            held.push(s.await.expect("task").expect("queued"));
        }
        let want = REQUESTS * (HEADER_LEN + 4);
        kvtestkit::until_async("every request to be written", kvtestkit::HANG, || async {
            let got = bytes.load(Ordering::Relaxed);
            if got >= want { Ok(()) } else { Err(got) }
        })
        .await;
        assert_eq!(bytes.load(Ordering::Relaxed), want, "every request written, once");
        let calls = calls.load(Ordering::Relaxed);
        assert!(calls <= 3, "{REQUESTS} requests took {calls} writes");
        drop(held);
    }

    /// A lone request is written by its caller, before `start` returns: no hand-off.
    #[tokio::test(flavor = "current_thread")]
    async fn a_lone_request_is_written_before_start_returns() {
        let (conn, calls, bytes, _peer) = counted();
        let flight = conn.start(frame).await.expect("queued");
        assert_eq!(bytes.load(Ordering::Relaxed), HEADER_LEN + 4);
        assert_eq!(calls.load(Ordering::Relaxed), 1);
        drop(flight);
    }
}
