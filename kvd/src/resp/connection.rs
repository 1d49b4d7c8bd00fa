//! One RESP client connection: read, run every complete command of the read as one
//! pipeline, write all replies with one write. The edge's connection decides when to wait,
//! how long a begun command may take, how much may be buffered, and the drain.

use std::ops::Range;
use std::sync::Arc;

use kvshared::client::Cluster;
use kvshared::stats::Counter;
use tokio::io::AsyncWriteExt;
use tokio::time::Instant;

use super::ctx::{Ctx, Session};
use super::dispatch::dispatch;
use super::parse::{Args, Parsed, parse};
use super::pipeline::Pipeline;
use super::reply;
use crate::cluster_view::ClusterView;
use crate::edge::conn::{Conn, ConnError, End, Input, Stage};
use crate::node::Node;

/// Most commands run as one pipeline (the rest of a read waits for the next round).
const MAX_PIPELINE: usize = 4096;
/// Bytes read at a time.
const READ_CHUNK: usize = 16 * 1024;
/// A read buffer grown past this by a large command is freed once the command is done.
const KEEP_BUFFER_BYTES: usize = 1 << 20;

/// One RESP connection's state between reads.
struct Resp {
    conn: Conn,
    node: Arc<Node>,
    cluster: Option<Arc<Cluster>>,
    view: Arc<ClusterView>,
    redirect: bool,
    session: Session,
    /// Bytes read and not yet run; commands start at `start`.
    buf: Vec<u8>,
    start: usize,
    out: Vec<u8>,
    ranges: Vec<Range<usize>>,
    pipeline: Pipeline,
    /// When the command at `start`, begun but incomplete, must have arrived whole.
    deadline: Option<Instant>,
    /// The round ended at a command that runs in a round of its own (EXEC, WATCH) with
    /// complete commands left: run them before reading more.
    split: bool,
}

/// What one round of commands ended with.
enum Round {
    /// Read more.
    More,
    /// Close after the replies (QUIT, a protocol error, or the drain is over).
    Close,
}

/// Serves one RESP connection until the client leaves, QUIT, a protocol error, the idle
/// timeout or shutdown.
pub(crate) async fn serve(conn: Conn, setup: super::Setup) {
    let session = Session::new(conn.peer.id, conn.peer.addr.clone());
    let mut r = Resp {
        node: setup.node.clone(),
        conn,
        // A Redis Cluster node redirects rather than forwards.
        cluster: setup.cluster.filter(|_| !setup.redirect),
        view: setup.view,
        redirect: setup.redirect,
        session,
        buf: Vec::with_capacity(READ_CHUNK),
        start: 0,
        out: Vec::with_capacity(READ_CHUNK),
        ranges: Vec::new(),
        pipeline: Pipeline::default(),
        deadline: None,
        split: false,
    };
    let end = r.run().await;
    let _ = r.conn.writer.flush().await;
    let _ = r.conn.writer.shutdown().await;
    if let End::Failed(why) = end {
        tracing::debug!(peer = %r.conn.peer.addr, %why, "RESP connection ended");
    }
}

impl Resp {
    async fn run(&mut self) -> End {
        loop {
            match self.round().await {
                Ok(Round::More) => {}
                Ok(Round::Close) => return End::Clean,
                Err(e) => return End::Failed(e),
            }
            self.compact();
            if let Some(end) = self.read_more().await {
                return end;
            }
        }
    }

    /// Runs every complete command buffered (at most [`MAX_PIPELINE`]) as one pipeline, or
    /// refuses them during shutdown, and writes the replies.
    async fn round(&mut self) -> Result<Round, ConnError> {
        let stage = if self.start < self.buf.len() {
            self.conn.stage()
        } else {
            Stage::Serve
        };
        if stage == Stage::Over {
            return self.refuse_the_rest().await;
        }
        self.pipeline.clear();
        self.out.clear();
        let close = self.parse_commands(stage);
        self.run_pipeline().await?;
        Ok(if close { Round::Close } else { Round::More })
    }

    /// The drain is over: every complete command already read is answered "shutting down"
    /// (not run), then the connection closes. (Closing at once left the last commands of a
    /// pipelining client, read but not run, with no answer at all.)
    async fn refuse_the_rest(&mut self) -> Result<Round, ConnError> {
        loop {
            let before = self.start;
            self.pipeline.clear();
            self.out.clear();
            self.split = false;
            let close = self.parse_commands(Stage::Over);
            self.run_pipeline().await?;
            if close || self.start == before || self.start >= self.buf.len() {
                return Ok(Round::Close);
            }
        }
    }

    /// Runs the pipeline built (if any) and writes its replies.
    async fn run_pipeline(&mut self) -> Result<(), ConnError> {
        if self.pipeline.is_empty() {
            return Ok(());
        }
        let budget = self.conn.edge.budget.clone();
        let taken = self
            .pipeline
            .run(
                &self.node,
                self.cluster.as_deref(),
                &budget,
                &mut self.conn.tally,
                &mut self.out,
            )
            .await;
        self.conn.hold(taken);
        self.session.after_round(&self.pipeline);
        self.send().await
    }

    /// Adds the complete commands at `start` to the pipeline (or, while refusing, answers
    /// each "shutting down"); true when the connection closes after their replies.
    fn parse_commands(&mut self, stage: Stage) -> bool {
        let max_bulk = self.conn.request_limit();
        loop {
            let rest = &self.buf[self.start..];
            match parse(rest, max_bulk, &mut self.ranges) {
                Ok(Parsed::Command { consumed }) => {
                    let args = Args::new(&rest[..consumed], &self.ranges);
                    // EXEC and WATCH run in a round of their own (see `transaction`).
                    let alone = super::dispatch::own_round(&self.session, args.get(0));
                    if alone && !self.pipeline.is_empty() {
                        self.split = true;
                        return false;
                    }
                    let close = match (args.is_empty(), stage) {
                        (true, _) => false,
                        (false, Stage::Serve) => {
                            let port = self.conn.edge.addr(crate::edge::Front::Resp).map_or(0, |a| a.port());
                            let mut ctx = Ctx {
                                node: &self.node,
                                forward: self.cluster.is_some(),
                                redirect: self.redirect,
                                view: Some(&self.view),
                                session: &mut self.session,
                                auth: self.conn.auth(),
                                port,
                            };
                            dispatch(&mut ctx, &args, &mut self.pipeline)
                        }
                        (false, _) => {
                            self.pipeline
                                .immediate(|o| reply::error(o, "ERR kvd is shutting down; the command was not run"));
                            false
                        }
                    };
                    self.start += consumed;
                    self.deadline = None;
                    if close || self.pipeline.len() >= MAX_PIPELINE {
                        return close;
                    }
                    if alone {
                        self.split = self.start < self.buf.len();
                        return false;
                    }
                }
                Ok(Parsed::Incomplete) => return false,
                Err(e) => {
                    self.conn.tally.malformed_body += 1;
                    self.pipeline
                        .immediate(|o| reply::error(o, &format!("ERR Protocol error: {e}")));
                    return true;
                }
            }
        }
    }

    /// Writes the replies of one round and gives back the budget their values took.
    async fn send(&mut self) -> Result<(), ConnError> {
        self.conn.tally.bytes_out += self.out.len() as u64;
        self.conn.write_direct(&self.out).await?;
        self.conn.publish();
        if self.out.capacity() > KEEP_BUFFER_BYTES {
            self.out = Vec::with_capacity(READ_CHUNK);
        }
        if !self
            .conn
            .settle(self.buf.capacity() + self.out.capacity() + self.session.held_bytes())
        {
            self.out = Vec::with_capacity(READ_CHUNK);
        }
        Ok(())
    }

    /// Drops the commands already run from the read buffer (and a buffer a large command
    /// grew, once it is empty).
    fn compact(&mut self) {
        if self.start == self.buf.len() {
            self.buf.clear();
            self.start = 0;
            if self.buf.capacity() > KEEP_BUFFER_BYTES {
                self.buf = Vec::with_capacity(READ_CHUNK);
                self.conn.settle(self.buf.capacity() + self.out.capacity());
            }
        } else if self.start > 0 {
            self.buf.drain(..self.start);
            self.start = 0;
        }
    }

    /// Reads more bytes: between commands, waits as the edge says (idle, shutdown, the
    /// drain); inside a command, until the deadline set when it began. `Some`: the end.
    async fn read_more(&mut self) -> Option<End> {
        if (self.pipeline.len() >= MAX_PIPELINE || std::mem::take(&mut self.split)) && self.start < self.buf.len() {
            return None; // More complete commands are buffered: run them first.
        }
        if self.buf.is_empty() && self.conn.reader.buffer().is_empty() {
            match self.conn.wait_for_input(None::<std::future::Ready<()>>).await {
                Input::Ready => {}
                Input::Woken => return None,
                Input::End(end) => return Some(end),
            }
        }
        let deadline = *self.deadline.get_or_insert_with(|| self.conn.request_deadline());
        if let Some(end) = self.make_room(deadline).await {
            return Some(end);
        }
        match tokio::time::timeout_at(deadline, self.conn.read_into(&mut self.buf)).await {
            Ok(Ok(0)) => Some(End::Clean),
            Ok(Ok(n)) => {
                self.conn.tally.bytes_in += n as u64;
                None
            }
            Ok(Err(e)) => {
                self.conn.tally.io += 1;
                Some(End::Failed(e.into()))
            }
            Err(_) => Some(End::Failed(self.conn.read_timed_out())),
        }
    }

    /// Makes room in the read buffer for the next read: a command may be as large as the
    /// connection's request limit (a few KiB before the token), and growth beyond the free
    /// allowance is paid from the node's budget. `Some`: refused, the connection ends.
    async fn make_room(&mut self, deadline: Instant) -> Option<End> {
        let limit = self.conn.request_limit();
        let most = if self.conn.auth().admitted() {
            limit.saturating_add(64 * 1024)
        } else {
            limit
        };
        if self.buf.len() >= most {
            let (why, counter) = if self.conn.auth().admitted() {
                (
                    "ERR Protocol error: request too large (--max-frame)",
                    Counter::FrameTooLarge,
                )
            } else {
                self.conn.auth().refused();
                (
                    "NOAUTH Authentication required (a command before AUTH is limited to a few KiB).",
                    Counter::FrameTooLarge,
                )
            };
            return Some(self.refuse(why, counter).await);
        }
        let wanted = (self.buf.len() + READ_CHUNK).min(most);
        if wanted > self.buf.capacity() {
            let target = (self.buf.capacity() * 2).max(wanted).min(most);
            if !self.conn.room_for(target + self.out.capacity(), deadline).await {
                let why = "ERR Protocol error: the node's buffer memory is full (--max-buffer-memory); try again later";
                return Some(self.refuse(why, Counter::BufferBudgetClosed).await);
            }
            self.buf.reserve_exact(target - self.buf.len());
        }
        None
    }

    /// Answers `why` and ends the connection, counting `counter` (the budget's refusals
    /// are counted where they happen).
    async fn refuse(&mut self, why: &'static str, counter: Counter) -> End {
        if counter != Counter::BufferBudgetClosed {
            *self.conn.tally.get_mut(counter) += 1;
        }
        self.out.clear();
        reply::error(&mut self.out, why);
        let _ = self.conn.writer.write_all(&self.out).await;
        self.conn.close_after_error().await;
        End::Failed(ConnError::Refused(why))
    }
}
