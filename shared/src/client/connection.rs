//! One TCP connection to one node, shared by many tasks, with pipelining.
//!
//! Callers encode a frame and write it themselves, combining: a caller queues its frame and,
//! if no one else is writing, writes everything queued with one vectored `write`; if someone
//! is, that writer picks the frame up. So a lone caller reaches the socket with no hand-off
//! to another task (the batch-1 round trip), and many callers still share syscalls. A reader
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
use tokio::sync::{Mutex as AsyncMutex, OwnedSemaphorePermit, Semaphore, oneshot};

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

/// Most buffers a connection keeps for reuse, and the largest it keeps.
// A connection whose requests have waited its stall threshold (see `super::rtt`: at least
// a second, more when its round trips have been long) with no reply at all is stalled: new
// requests fail at once (`ClientError::Stalled`) rather than queue behind the old ones,
// which wait for their timeout. A stopped process (SIGSTOP, a debugger, a swap storm)
// answers nothing.
/// How often a caller waiting for a pipeline slot checks for a stall.
const STALL_CHECK: Duration = Duration::from_millis(100);

const POOLED_BUFFERS: usize = 256;
const POOLED_BYTES: usize = 8 << 20;

/// Frame buffers reused between requests and replies, so that large frames do not cost
/// fresh memory (page faults and zeroing, 9% of kvbench's CPU at batch 1024) every time.
#[derive(Default)]
struct BufferPool {
    free: Mutex<Vec<AlignedVec>>,
}

impl BufferPool {
    fn take(&self) -> AlignedVec {
        self.free.lock().pop().unwrap_or_default()
    }

    fn give(&self, mut buf: AlignedVec) {
        if buf.capacity() > POOLED_BYTES {
            return;
        }
        buf.clear();
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
}

/// A pipelined connection to one node.
pub(crate) struct Connection {
    addr: Arc<str>,
    outbox: Outbox,
    pool: Arc<BufferPool>,
    pending: Arc<Mutex<Pending>>,
    next_id: AtomicU64,
    in_flight: Arc<Semaphore>,
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
        let addr: Arc<str> = addr.into();
        let pending = Arc::new(Mutex::new(Pending {
            waiters: HashMap::new(),
            silent_since: None,
            rtt: Default::default(),
            failed: None,
        }));
        let alive = Arc::new(AtomicBool::new(true));
        let pool = Arc::new(BufferPool::default());
        tokio::spawn(read_loop(
            read,
            pending.clone(),
            alive.clone(),
            addr.clone(),
            pool.clone(),
        ));
        Ok(Connection {
            addr,
            pool,
            outbox: Outbox {
                queue: Mutex::new(Vec::new()),
                writer: AsyncMutex::new(write),
            },
            pending,
            next_id: AtomicU64::new(1),
            in_flight: Arc::new(Semaphore::new(pipeline.max(1))),
            alive,
            max_frame,
        })
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

    /// Queues `frame` and writes everything queued unless another caller is already writing
    /// (that caller then writes this frame too).
    async fn send(&self, frame: AlignedVec) -> std::io::Result<()> {
        self.outbox.queue.lock().push(frame);
        loop {
            let Ok(mut writer) = self.outbox.writer.try_lock() else {
                return Ok(());
            };
            // If this future is dropped mid-write the stream is out of step: mark it dead.
            let mut guard = DeadUnlessDone {
                conn: self,
                done: false,
            };
            loop {
                let frames = std::mem::take(&mut *self.outbox.queue.lock());
                if frames.is_empty() {
                    break;
                }
                write_frames(&mut writer, &frames).await?;
                for f in frames {
                    self.pool.give(f);
                }
            }
            guard.done = true;
            drop(writer);
            // A frame queued after our last look but before we let go of the writer would be
            // stranded: look again now that the writer is free.
            if self.outbox.queue.lock().is_empty() {
                return Ok(());
            }
        }
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
        // Dropping the write half shuts the socket for writing; the server then closes, the
        // reader sees EOF and fails whatever is still waiting.
        self.in_flight.close();
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
