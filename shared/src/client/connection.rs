//! One TCP connection to one node, shared by many tasks, with pipelining.
//!
//! Callers encode a frame and hand it over; a writer task coalesces queued frames into as few
//! `write` calls as it can, and a reader task matches each response to its caller by request
//! id. Up to `pipeline` requests may be in flight at once. When the connection fails, every
//! caller waiting on it gets the same `NodeDown` error, and the connection is marked dead so
//! the pool can replace it.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rkyv::util::AlignedVec;
use tokio::io::{AsyncWriteExt, BufReader, BufWriter};
use tokio::net::TcpStream;
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::sync::{OwnedSemaphorePermit, Semaphore, mpsc, oneshot};

use super::ClientError;
use crate::frame::{FrameError, FrameKind, HEADER_LEN, read_frame};
use crate::wire::{ReplyView, WireError, parse_error_reply};

/// A response frame, owned by the caller.
#[derive(Debug)]
pub struct Reply {
    pub kind: FrameKind,
    pub body: AlignedVec,
    addr: Arc<str>,
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

type Waiter = oneshot::Sender<Result<Reply, ClientError>>;

struct Pending {
    waiters: HashMap<u64, Waiter>,
    /// Set once the connection has failed; later callers get this error at once.
    failed: Option<ClientError>,
}

/// A pipelined connection to one node.
pub struct Connection {
    addr: Arc<str>,
    frames: mpsc::UnboundedSender<AlignedVec>,
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
}

impl InFlight {
    /// Waits for the reply, at most `timeout`.
    pub async fn wait(self, timeout: Duration) -> Result<Reply, ClientError> {
        match tokio::time::timeout(timeout, self.rx).await {
            Ok(Ok(result)) => result,
            Ok(Err(_)) => Err(ClientError::NodeDown {
                addr: self.addr.to_string(),
                reason: "connection closed".into(),
            }),
            Err(_) => {
                if let Ok(mut p) = self.pending.lock() {
                    p.waiters.remove(&self.id);
                }
                Err(ClientError::Timeout {
                    addr: self.addr.to_string(),
                    after: timeout,
                })
            }
        }
    }
}

impl Connection {
    /// Connects to `addr` within `timeout`.
    pub async fn open(
        addr: &str,
        pipeline: usize,
        max_frame: u32,
        timeout: Duration,
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
        let (read, write) = stream.into_split();
        let addr: Arc<str> = addr.into();
        let pending = Arc::new(Mutex::new(Pending {
            waiters: HashMap::new(),
            failed: None,
        }));
        let alive = Arc::new(AtomicBool::new(true));
        let (frames, queue) = mpsc::unbounded_channel();
        tokio::spawn(write_loop(write, queue, pending.clone(), alive.clone(), addr.clone()));
        tokio::spawn(read_loop(read, pending.clone(), alive.clone(), addr.clone(), max_frame));
        Ok(Connection {
            addr,
            frames,
            pending,
            next_id: AtomicU64::new(1),
            in_flight: Arc::new(Semaphore::new(pipeline.max(1))),
            alive,
            max_frame,
        })
    }

    pub fn addr(&self) -> &str {
        &self.addr
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
        let permit = self
            .in_flight
            .clone()
            .acquire_owned()
            .await
            .map_err(|_| self.down("connection closed"))?;
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let mut frame = AlignedVec::new();
        encode(id, &mut frame).map_err(|e| ClientError::Protocol {
            addr: self.addr.to_string(),
            reason: e.to_string(),
        })?;
        let body_len = frame.len() - HEADER_LEN;
        if body_len > self.max_frame as usize {
            return Err(ClientError::FrameTooLarge {
                len: body_len,
                max: self.max_frame,
            });
        }
        let (tx, rx) = oneshot::channel();
        {
            let mut p = self.pending.lock().map_err(|_| self.down("poisoned"))?;
            if let Some(e) = &p.failed {
                return Err(e.clone());
            }
            p.waiters.insert(id, tx);
        }
        if self.frames.send(frame).is_err() {
            return Err(self.down("writer stopped"));
        }
        Ok(InFlight {
            id,
            rx,
            pending: self.pending.clone(),
            addr: self.addr.clone(),
            _permit: permit,
        })
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
        // Dropping the frame sender ends the writer, which shuts the socket; the reader
        // then sees EOF and fails whatever is still waiting.
        self.in_flight.close();
    }
}

/// Marks the connection failed and answers every waiter with `err`.
fn fail_all(pending: &Mutex<Pending>, alive: &AtomicBool, err: ClientError) {
    alive.store(false, Ordering::Relaxed);
    let waiters = match pending.lock() {
        Ok(mut p) => {
            if p.failed.is_none() {
                p.failed = Some(err.clone());
            }
            std::mem::take(&mut p.waiters)
        }
        Err(_) => return,
    };
    for (_, w) in waiters {
        let _ = w.send(Err(err.clone()));
    }
}

async fn write_loop(
    write: OwnedWriteHalf,
    mut queue: mpsc::UnboundedReceiver<AlignedVec>,
    pending: Arc<Mutex<Pending>>,
    alive: Arc<AtomicBool>,
    addr: Arc<str>,
) {
    let mut out = BufWriter::with_capacity(64 * 1024, write);
    while let Some(frame) = queue.recv().await {
        let mut result = out.write_all(&frame).await;
        // Coalesce whatever else is queued into the same flush.
        while result.is_ok() {
            match queue.try_recv() {
                Ok(frame) => result = out.write_all(&frame).await,
                Err(_) => break,
            }
        }
        if result.is_ok() {
            result = out.flush().await;
        }
        if let Err(e) = result {
            tracing::debug!(%addr, error = %e, "write failed");
            fail_all(
                &pending,
                &alive,
                ClientError::NodeDown {
                    addr: addr.to_string(),
                    reason: e.to_string(),
                },
            );
            return;
        }
    }
    let _ = out.shutdown().await;
}

async fn read_loop(
    read: OwnedReadHalf,
    pending: Arc<Mutex<Pending>>,
    alive: Arc<AtomicBool>,
    addr: Arc<str>,
    max_frame: u32,
) {
    let mut reader = BufReader::with_capacity(64 * 1024, read);
    let reason = loop {
        let mut body = AlignedVec::new();
        match read_frame(&mut reader, &mut body, max_frame).await {
            Ok(Some(header)) => {
                let waiter = match pending.lock() {
                    Ok(mut p) => p.waiters.remove(&header.id),
                    Err(_) => break "poisoned".to_string(),
                };
                if header.id == 0 && header.kind == FrameKind::ErrorResponse {
                    // Id 0: the server is refusing the connection as a whole.
                    let why = parse_error_reply(&body)
                        .map(|e| e.message)
                        .unwrap_or_else(|e| e.to_string());
                    break format!("server closed the connection: {why}");
                }
                if let Some(w) = waiter {
                    let _ = w.send(Ok(Reply {
                        kind: header.kind,
                        body,
                        addr: addr.clone(),
                    }));
                }
            }
            Ok(None) => break "connection closed by the server".to_string(),
            Err(FrameError::Io(e)) => break e.to_string(),
            Err(e) => {
                break format!("bad frame from server: {e}");
            }
        }
    };
    tracing::debug!(%addr, %reason, "connection ended");
    fail_all(
        &pending,
        &alive,
        ClientError::NodeDown {
            addr: addr.to_string(),
            reason,
        },
    );
}
