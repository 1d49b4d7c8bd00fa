//! One RESP client connection: read, run every complete command of the read as one
//! pipeline, write all replies with one write.

use std::ops::Range;
use std::sync::Arc;

use kvshared::client::Cluster;
use kvshared::stats::{Counter, Counts};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::broadcast;

use super::commands::{Session, dispatch};
use super::parse::{Parsed, parse};
use super::pipeline::Pipeline;
use super::reply;
use crate::budget::FREE_PER_CONNECTION;
use crate::node::Node;

/// Most commands run as one pipeline (the rest of a read waits for the next round).
const MAX_PIPELINE: usize = 4096;
/// Bytes read at a time.
const READ_CHUNK: usize = 16 * 1024;

/// The arguments of one command, as ranges of the read buffer.
pub struct Args<'a> {
    buf: &'a [u8],
    ranges: &'a [Range<usize>],
}

impl<'a> Args<'a> {
    /// Argument `i` (0 is the command name), empty past the end.
    pub fn get(&self, i: usize) -> &'a [u8] {
        self.ranges
            .get(i)
            .and_then(|r| self.buf.get(r.clone()))
            .unwrap_or_default()
    }

    /// How many arguments, the name included.
    pub fn len(&self) -> usize {
        self.ranges.len()
    }

    /// Whether there is none (not even a name).
    pub fn is_empty(&self) -> bool {
        self.ranges.is_empty()
    }

    /// Arguments `from..`.
    pub fn rest(&self, from: usize) -> impl Iterator<Item = &'a [u8]> + '_ {
        (from..self.len()).map(|i| self.get(i))
    }
}

/// Serves one RESP connection until the client leaves, QUIT, a protocol error, the idle
/// timeout or shutdown.
pub async fn serve(
    node: Arc<Node>,
    cluster: Option<Arc<Cluster>>,
    mut stream: TcpStream,
    id: u64,
    mut shutdown: broadcast::Receiver<()>,
) {
    node.counters.add(id, Counter::ConnsOpened, 1);
    let _ = stream.set_nodelay(true);
    let peer = stream.peer_addr().map(|a| a.to_string()).unwrap_or_default();
    let mut session = Session::new(id, peer, node.config.auth.is_none());
    let mut buf: Vec<u8> = Vec::with_capacity(READ_CHUNK);
    let mut start = 0usize;
    let mut out: Vec<u8> = Vec::with_capacity(READ_CHUNK);
    let mut ranges: Vec<Range<usize>> = Vec::new();
    let mut pipeline = Pipeline::default();
    let mut tally = Counts::default();
    let max_bulk = node.config.max_frame as usize;
    let idle = node.config.idle_timeout;
    // Read-buffer bytes beyond the free allowance, taken from --max-buffer-memory (as the
    // binary protocol does): a peer announcing large commands on many connections cannot make
    // the node hold more than the budget.
    let mut held = 0usize;
    loop {
        pipeline.clear();
        out.clear();
        let mut close = false;
        loop {
            match parse(&buf[start..], max_bulk, &mut ranges) {
                Ok(Parsed::Command { consumed }) => {
                    let args = Args {
                        buf: &buf[start..start + consumed],
                        ranges: &ranges,
                    };
                    if !args.is_empty() {
                        close = dispatch(&node, cluster.is_some(), &mut session, &args, &mut pipeline);
                    }
                    start += consumed;
                    if close || pipeline.len() >= MAX_PIPELINE {
                        break;
                    }
                }
                Ok(Parsed::Incomplete) => break,
                Err(e) => {
                    tally.malformed_body += 1;
                    pipeline.immediate(|o| reply::error(o, &format!("ERR Protocol error: {e}")));
                    close = true;
                    break;
                }
            }
        }
        if !pipeline.is_empty() {
            pipeline.run(&node, cluster.as_deref(), &mut tally, &mut out).await;
            tally.bytes_out += out.len() as u64;
            if stream.write_all(&out).await.is_err() {
                break;
            }
            node.counters.add_counts(id, &tally);
            tally = Counts::default();
        }
        if close {
            break;
        }
        if start == buf.len() {
            buf.clear();
            start = 0;
            if held > 0 {
                buf = Vec::with_capacity(READ_CHUNK);
                node.buffers.give(std::mem::take(&mut held));
            }
        } else if start > 0 {
            buf.drain(..start);
            start = 0;
        }
        if pipeline.len() >= MAX_PIPELINE {
            continue;
        }
        // A command still incomplete past the frame limit is refused (its bulk lengths were
        // each within the limit, but not all of them together).
        if buf.len() > max_bulk.saturating_add(64 * 1024) {
            out.clear();
            reply::error(&mut out, "ERR Protocol error: request too large (--max-frame)");
            let _ = stream.write_all(&out).await;
            node.counters.add(id, Counter::FrameTooLarge, 1);
            break;
        }
        let wanted = buf.len() + READ_CHUNK;
        if wanted > buf.capacity() {
            let mut allowed = FREE_PER_CONNECTION + held;
            if wanted > allowed {
                // Beyond the free allowance, growth is paid from the budget, in doublings
                // (a big command costs a few budget operations).
                let step = (wanted * 2).saturating_sub(allowed);
                if !node.buffers.try_take(step) {
                    out.clear();
                    reply::error(
                        &mut out,
                        "ERR Protocol error: the node's buffer memory is full (--max-buffer-memory); try again later",
                    );
                    let _ = stream.write_all(&out).await;
                    node.counters.add(id, Counter::BufferBudgetClosed, 1);
                    break;
                }
                held += step;
                allowed += step;
            }
            let target = (buf.capacity() * 2).max(wanted).min(allowed);
            buf.reserve_exact(target - buf.len());
        }
        // A command that has begun must arrive whole within --read-timeout; between commands
        // the idle timeout applies.
        let limit = if buf.is_empty() {
            idle
        } else {
            Some(node.config.read_timeout)
        };
        let read = async {
            match limit {
                Some(limit) => tokio::time::timeout(limit, stream.read_buf(&mut buf)).await.ok(),
                None => Some(stream.read_buf(&mut buf).await),
            }
        };
        let read = tokio::select! {
            r = read => r,
            _ = shutdown.recv() => break,
        };
        match read {
            None if buf.is_empty() => {
                node.counters.add(id, Counter::ConnsIdleClosed, 1);
                break;
            }
            None => {
                // A partial command stalled past --read-timeout.
                tally.io += 1;
                break;
            }
            Some(Ok(0)) => break,
            Some(Ok(n)) => tally.bytes_in += n as u64,
            Some(Err(_)) => {
                tally.io += 1;
                break;
            }
        }
    }
    let _ = stream.shutdown().await;
    node.buffers.give(held);
    node.counters.add_counts(id, &tally);
    node.counters.add(id, Counter::ConnsClosed, 1);
}
