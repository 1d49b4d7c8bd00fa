//! One connection as a front sees it: its two directions with the edge's rules applied.
//!
//! A front asks its [`Conn`] to wait for the next request ([`Conn::wait_for_input`]: the
//! idle timeout, shutdown and the drain are decided there, and the first bytes are checked
//! for another front's protocol), until when a begun request must arrive
//! ([`Conn::request_deadline`]), how much it may hold ([`Conn::request_limit`],
//! [`Conn::room_for`], [`Conn::settle`]), whether the peer has presented the token
//! ([`Conn::auth`]), and whether a request that arrives during shutdown is still run
//! ([`Conn::stage`]). Writes go through the write deadline. Dropping the connection gives
//! back its share of the buffer budget and counts it closed, on every path.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use kvshared::stats::Counts;
use tokio::io::{AsyncBufReadExt, AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, BufReader, BufWriter, ReadBuf};
use tokio::sync::broadcast;
use tokio::time::{Instant, Interval};

use super::budget::{BUDGET_RETRY, BUDGET_WAIT, FREE_PER_CONNECTION};
use super::deadline::DeadlineWriter;
pub(crate) use super::ended::ConnError;
use super::gate::Standing;
use super::refusal::Refusal;
use super::shared::{Edge, Peer};
use super::sniff::{Spoken, sniff};

/// After shutdown is signalled, a connection keeps answering requests that arrive within
/// this long of each other (the ones already in flight), then refuses later ones...
pub(crate) const DRAIN_IDLE: Duration = Duration::from_millis(200);
/// ...but never for longer than this, so a client that keeps sending cannot hold shutdown
/// open.
pub(crate) const DRAIN_MAX: Duration = Duration::from_secs(1);
/// After the drain, requests that still arrive are refused ("shutting down", not run)
/// until the client is quiet for this long...
pub(crate) const LAST_READ: Duration = Duration::from_millis(100);
/// ...or for at most this long.
pub(crate) const REFUSE_MAX: Duration = Duration::from_secs(1);

/// A connection's read direction (after TLS, if any).
pub(crate) type ReadHalf = Box<dyn AsyncRead + Send + Unpin>;
/// A connection's write direction (after TLS, if any), under the write deadline.
pub(crate) type WriteHalf = DeadlineWriter<Box<dyn AsyncWrite + Send + Unpin>>;

/// Where a connection is in its life.
#[derive(Clone, Copy, Debug)]
enum Phase {
    /// Requests are run.
    Serving,
    /// Shutdown began: requests already on their way are run until `until`, or until none
    /// arrives for [`DRAIN_IDLE`].
    Draining { until: Instant },
    /// Requests that still arrive are answered "shutting down" (not run) until `until`,
    /// or until none arrives for [`LAST_READ`].
    Refusing { until: Instant },
}

/// What to do with the request just read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Stage {
    /// Run it.
    Serve,
    /// Answer that the node is shutting down; it was not run.
    Refuse,
    /// Stop reading: the drain is over.
    Over,
}

/// What [`Conn::wait_for_input`] found.
pub(crate) enum Input {
    /// Bytes are buffered in [`Conn::reader`].
    Ready,
    /// The front's own event (passed to `wait_for_input`) happened.
    Woken,
    /// The connection is over.
    End(End),
}

/// How a connection ended.
pub(crate) enum End {
    /// The peer closed, it was idle too long, or shutdown finished.
    Clean,
    /// Something failed; the reason, for the log.
    Failed(ConnError),
}

/// One client connection, of any front.
pub(crate) struct Conn {
    /// The node-wide edge.
    pub edge: Arc<Edge>,
    /// Who is at the other end.
    pub peer: Peer,
    /// The read direction, buffered.
    pub reader: BufReader<ReadHalf>,
    /// The write direction, buffered; every write is under `--write-timeout`.
    pub writer: BufWriter<WriteHalf>,
    /// What the connection did since it last published to the node's counters.
    pub tally: Counts,
    standing: Standing,
    /// Bytes taken from the node's buffer budget.
    held: usize,
    phase: Phase,
    shutdown: Option<broadcast::Receiver<()>>,
    /// `--idle-timeout`, and the interval that checks it.
    idle: Option<(Duration, Interval)>,
    last_request: Instant,
    /// Whether the first bytes have been looked at.
    sniffed: bool,
}

impl Conn {
    /// A served connection of `peer.front` (opened by the edge).
    pub(super) fn new(
        edge: Arc<Edge>,
        peer: Peer,
        reader: ReadHalf,
        writer: WriteHalf,
        shutdown: broadcast::Receiver<()>,
    ) -> Conn {
        let idle = edge.config.idle_timeout.map(|limit| {
            // Checked four times per timeout: a connection is closed between 1 and 1.25
            // timeouts after its last request, and waiting costs no timer per request.
            let period = (limit / 4).max(Duration::from_millis(1));
            let mut tick = tokio::time::interval_at(Instant::now() + period, period);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            (limit, tick)
        });
        Conn {
            standing: Standing::at_start(edge.config.auth.as_ref()),
            edge,
            peer,
            reader: BufReader::with_capacity(64 * 1024, reader),
            writer: BufWriter::with_capacity(64 * 1024, writer),
            tally: Counts::default(),
            held: 0,
            phase: Phase::Serving,
            shutdown: Some(shutdown),
            idle,
            last_request: Instant::now(),
            sniffed: false,
        }
    }

    /// Waits until bytes are buffered, the front's own event `woken` happens, or the
    /// connection is over: the peer closed, it was idle for `--idle-timeout` (not while
    /// `woken` is pending: a request is then in flight), or the drain after shutdown ended.
    /// A signalled shutdown starts the drain. The first bytes ever read are checked for
    /// another front's protocol, which is answered there.
    pub async fn wait_for_input(&mut self, woken: Option<impl Future<Output = ()>>) -> Input {
        let in_flight = woken.is_some();
        let woken = async move {
            match woken {
                Some(w) => w.await,
                None => std::future::pending().await,
            }
        };
        tokio::pin!(woken);
        loop {
            let now = Instant::now();
            let filled = match self.phase {
                Phase::Serving => {
                    let (reader, idle, shutdown) = (&mut self.reader, &mut self.idle, &mut self.shutdown);
                    tokio::select! {
                        filled = reader.fill_buf() => filled.map(|b| (b.len(), sniff(b))),
                        () = &mut woken => return Input::Woken,
                        _ = async { match shutdown { Some(rx) => { let _ = rx.recv().await; } None => std::future::pending().await } } => {
                            self.phase = Phase::Draining { until: now + DRAIN_MAX };
                            continue;
                        }
                        _ = async { if let Some((_, tick)) = idle { tick.tick().await; } }, if idle.is_some() && !in_flight => {
                            if self.idle.as_ref().is_some_and(|(limit, _)| self.last_request.elapsed() >= *limit) {
                                self.tally.conns_idle_closed += 1;
                                tracing::debug!(peer = %self.peer.addr, "closing an idle connection");
                                return Input::End(End::Clean);
                            }
                            continue;
                        }
                    }
                }
                Phase::Draining { until } => {
                    let wait = DRAIN_IDLE.min(until.saturating_duration_since(now));
                    let reader = &mut self.reader;
                    tokio::select! {
                        filled = tokio::time::timeout(wait, reader.fill_buf()) => match filled {
                            Ok(filled) => filled.map(|b| (b.len(), sniff(b))),
                            Err(_) => {
                                self.phase = Phase::Refusing { until: now + REFUSE_MAX };
                                continue;
                            }
                        },
                        () = &mut woken => return Input::Woken,
                    }
                }
                Phase::Refusing { until } => {
                    let wait = LAST_READ.min(until.saturating_duration_since(now));
                    match tokio::time::timeout(wait, self.reader.fill_buf()).await {
                        Ok(filled) => filled.map(|b| (b.len(), sniff(b))),
                        Err(_) => return Input::End(End::Clean),
                    }
                }
            };
            return self.arrived(filled).await;
        }
    }

    /// Decides what buffered bytes (or their absence) mean.
    async fn arrived(&mut self, filled: std::io::Result<(usize, Spoken)>) -> Input {
        match filled {
            Err(e) => Input::End(End::Failed(e.into())),
            Ok((0, _)) => Input::End(End::Clean),
            Ok((_, spoken)) => {
                if !self.sniffed {
                    self.sniffed = true;
                    if let Spoken::Front(other) = spoken
                        && other != self.peer.front
                    {
                        return Input::End(self.refuse_protocol(other).await);
                    }
                }
                self.last_request = Instant::now();
                Input::Ready
            }
        }
    }

    /// Answers a client that speaks `spoken` on this port, in its protocol, naming the
    /// port where that is served, and ends the connection.
    async fn refuse_protocol(&mut self, spoken: super::Front) -> End {
        self.tally.wrong_protocol += 1;
        let refusal = Refusal::WrongPort {
            here: self.peer.front,
            served_at: self.edge.addr(spoken),
        };
        if let Some(suppressed) = self.may_warn() {
            tracing::warn!(peer = %self.peer.addr, spoke = spoken.label(), port = self.peer.front.label(), suppressed, "a client spoke another front's protocol");
        }
        let _ = self.writer.write_all(&refusal.encode(spoken)).await;
        self.close_after_error().await;
        // Counted and logged above.
        End::Clean
    }

    /// Reads what is there into `buf` (at least one byte, or 0 at the end of the stream),
    /// taking what the read buffer already holds first, else straight from the socket (no
    /// copy through the read buffer: RESP keeps a buffer of its own).
    pub async fn read_into(&mut self, buf: &mut Vec<u8>) -> std::io::Result<usize> {
        let held = self.reader.buffer();
        if !held.is_empty() {
            let n = held.len();
            buf.extend_from_slice(held);
            self.reader.consume(n);
            return Ok(n);
        }
        self.reader.get_mut().read_buf(buf).await
    }

    /// Writes `bytes` straight to the socket (after what the write buffer holds), under the
    /// write deadline: for a front that builds its whole reply in a buffer of its own.
    pub async fn write_direct(&mut self, bytes: &[u8]) -> std::io::Result<()> {
        if !self.writer.buffer().is_empty() {
            self.writer.flush().await?;
        }
        self.writer.get_mut().write_all(bytes).await
    }

    /// Whether the request just read is run, refused, or not read at all (see [`Stage`]).
    pub fn stage(&mut self) -> Stage {
        if let Phase::Serving = self.phase {
            return Stage::Serve;
        }
        let now = Instant::now();
        match self.phase {
            Phase::Serving => Stage::Serve,
            Phase::Draining { until } if now < until => Stage::Serve,
            Phase::Draining { .. } => {
                self.phase = Phase::Refusing {
                    until: now + REFUSE_MAX,
                };
                Stage::Refuse
            }
            Phase::Refusing { until } if now < until => Stage::Refuse,
            Phase::Refusing { .. } => Stage::Over,
        }
    }

    /// When the request that begins now must have arrived whole: `--read-timeout` from
    /// now (a client trickling bytes holds nothing for longer), or sooner while draining.
    pub fn request_deadline(&self) -> Instant {
        let limit = self.edge.config.read_timeout;
        let limit = match self.phase {
            Phase::Serving => limit,
            _ => limit.min(DRAIN_IDLE * 5),
        };
        Instant::now() + limit
    }

    /// Counts a request that did not arrive whole by its deadline; the reason, for the log.
    pub fn read_timed_out(&mut self) -> ConnError {
        self.tally.conns_read_timeout += 1;
        ConnError::ReadTimeout(self.edge.config.read_timeout)
    }

    /// The token: where this connection stands, and presenting it.
    pub fn auth(&mut self) -> Auth<'_> {
        Auth {
            edge: &self.edge,
            peer: &mut self.peer,
            standing: &mut self.standing,
        }
    }

    /// Most bytes one request may carry now: `--max-frame`, or before the token a few KiB.
    pub fn request_limit(&self) -> usize {
        self.standing.request_limit(self.edge.config.max_frame as usize)
    }

    /// Makes sure the connection may hold `buffered` bytes in buffers, taking what that needs
    /// beyond its free allowance from the node's budget; waits for room until `deadline`
    /// (at most [`BUDGET_WAIT`]). False: no room came (the front refuses the request).
    pub async fn room_for(&mut self, buffered: usize, deadline: Instant) -> bool {
        let need = buffered.saturating_sub(FREE_PER_CONNECTION).saturating_sub(self.held);
        if need == 0 {
            return true;
        }
        let deadline = deadline.min(Instant::now() + BUDGET_WAIT);
        loop {
            if self.edge.budget.try_take(need) {
                self.held += need;
                return true;
            }
            if Instant::now() + BUDGET_RETRY > deadline {
                self.tally.buffer_budget_closed += 1;
                return false;
            }
            tokio::time::sleep(BUDGET_RETRY).await;
        }
    }

    /// Bytes a reply took from the budget (see `ReplyAllowance`), held until
    /// [`Conn::settle`].
    pub fn hold(&mut self, taken: usize) {
        self.held += taken;
    }

    /// After a reply is written: makes what is taken from the budget match the `buffered`
    /// bytes the connection keeps for the next request. False: the budget has no room to
    /// keep them, everything was given back, and the front must free its buffers.
    pub fn settle(&mut self, buffered: usize) -> bool {
        let keep = buffered.saturating_sub(FREE_PER_CONNECTION);
        if keep > self.held {
            if !self.edge.budget.try_take(keep - self.held) {
                self.edge.budget.give(std::mem::take(&mut self.held));
                return false;
            }
        } else {
            self.edge.budget.give(self.held - keep);
        }
        self.held = keep;
        true
    }

    /// Whether this connection may log a warning now (see `warn_limit`).
    pub fn may_warn(&mut self) -> Option<u64> {
        self.edge.may_warn(&mut self.peer)
    }

    /// Adds the local tally to the node's counters and starts it again from zero.
    pub fn publish(&mut self) {
        self.edge.counters.add_counts(self.peer.id, &self.tally);
        self.tally = Counts::default();
    }

    /// Takes the shutdown signal, for a front that watches it itself (HTTP).
    pub fn take_shutdown(&mut self) -> Option<broadcast::Receiver<()>> {
        self.shutdown.take()
    }

    /// Sends what is buffered, ends our side, and reads and drops what the peer still sends
    /// for a moment: closing with unread input makes the kernel send a reset, which can
    /// destroy the reason before the peer reads it.
    pub async fn close_after_error(&mut self) {
        self.publish();
        let _ = self.writer.flush().await;
        let _ = self.writer.shutdown().await;
        let until = Instant::now() + REFUSE_MAX;
        let mut sink = [0u8; 16 * 1024];
        let mut left: usize = 1 << 20;
        while let Ok(Ok(n)) = tokio::time::timeout_at(until, self.reader.read(&mut sink)).await
            && n > 0
            && left > n
        {
            left -= n;
        }
    }
}

impl Drop for Conn {
    fn drop(&mut self) {
        self.edge.budget.give(self.held);
        self.tally.conns_closed += 1;
        self.publish();
    }
}

/// A connection's standing with the token, to read and change.
pub(crate) struct Auth<'a> {
    edge: &'a Edge,
    peer: &'a mut Peer,
    standing: &'a mut Standing,
}

impl Auth<'_> {
    /// Whether requests may be run.
    pub fn admitted(&self) -> bool {
        self.standing.admitted()
    }

    /// Whether the node has a token at all.
    pub fn needs_token(&self) -> bool {
        self.edge.needs_token()
    }

    /// Presents `token`: true if it is the node's (or the node has none). A wrong one is
    /// counted for this front and logged within the limits.
    pub fn present(&mut self, token: &[u8]) -> bool {
        let right = self.edge.check_token(self.peer, token);
        if right && *self.standing == Standing::Waiting {
            *self.standing = Standing::Admitted;
        }
        right
    }

    /// Counts a request refused because the token was not presented first.
    pub fn refused(&mut self) {
        self.edge
            .auth_failed(self.peer, "refused a request sent without the token");
    }
}

/// HTTP's server drives the connection as one byte stream: reads come through the read
/// buffer (which may hold the first bytes already), writes through the write deadline.
impl AsyncRead for Conn {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().reader).poll_read(cx, buf)
    }
}

impl AsyncWrite for Conn {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.get_mut().writer).poll_write(cx, buf)
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().writer).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().writer).poll_shutdown(cx)
    }
}
