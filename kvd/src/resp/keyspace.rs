//! The keyspace commands that span the cluster: `SCAN`, `KEYS`, `DBSIZE`, `FLUSHALL`,
//! `FLUSHDB`, `RANDOMKEY`. Each runs in a round of its own and asks the nodes one by one,
//! this node through [`Node::execute`] like any batch and the others through the cluster
//! client, with the node-wide ops (`Scan`, `KeyCount`, `Flush`).
//!
//! A SCAN cursor names a node and a place in it (`kvshared::keyspace::ClusterCursor`), so
//! a scan through one node covers the whole cluster with Redis's guarantee: a key present
//! for the whole scan is returned (exactly once, in fact). Without `--nodes` only this
//! node's keys are scanned, counted and flushed.

use kvshared::client::Cluster;
use kvshared::keyspace::{ClusterCursor, ScanPage, ScanRequest};
use kvshared::stats::Counts;
use kvshared::wire::{BatchRequest, BatchResponse, OpKind, OpReply};

use super::errors::CommandError;
use super::reply::{self, Proto};
use crate::edge::budget::{BufferBudget, ReplyAllowance};
use crate::node::Node;
use crate::node::Scratch;
use crate::routed::{forward_transaction, run_local};

/// Most keys `KEYS` answers with (past it, use `SCAN`).
pub const MAX_KEYS_REPLY: usize = 1_000_000;
/// Most bytes of keys `KEYS` gathers for one reply.
pub const MAX_KEYS_REPLY_BYTES: usize = 64 << 20;
/// Keys a `KEYS` or `RANDOMKEY` page asks a node for.
const PAGE: u32 = 1000;

/// A keyspace command, parsed, waiting for its round.
#[derive(Debug)]
pub enum Keyspace {
    Scan {
        cursor: ClusterCursor,
        pattern: Vec<u8>,
        count: u32,
        strings: bool,
    },
    Keys {
        pattern: Vec<u8>,
    },
    DbSize,
    Flush,
    RandomKey,
}

/// The nodes a keyspace command covers: the cluster's, or this one alone.
pub(super) fn nodes(node: &Node, forward: bool) -> Vec<u32> {
    let shard = node.config().cluster.shard;
    match forward {
        true => (0..shard.count).collect(),
        false => vec![shard.index],
    }
}

/// Where a keyspace command runs, and what its local batches may take.
pub struct Runner<'a> {
    pub node: &'a Node,
    pub cluster: Option<&'a Cluster>,
    pub budget: &'a BufferBudget,
    pub tally: &'a mut Counts,
    /// Bytes taken from `budget` for local answers (held until the reply is sent).
    pub taken: usize,
}

/// One node's answer to a node-wide op.
enum Answer {
    Page(Vec<u8>),
    Count(i64),
    Done,
}

impl Runner<'_> {
    /// Runs `cmd` and writes its reply to `out`.
    pub async fn run(&mut self, cmd: &Keyspace, proto: Proto, out: &mut Vec<u8>) {
        let result = match cmd {
            Keyspace::Scan {
                cursor,
                pattern,
                count,
                strings,
            } => self.scan(*cursor, pattern, *count, *strings, out).await,
            Keyspace::Keys { pattern } => self.keys(pattern, out).await,
            Keyspace::DbSize => self.sum().await.map(|n| reply::integer(out, n)),
            Keyspace::Flush => self.flush().await.map(|()| reply::simple(out, "OK")),
            Keyspace::RandomKey => self.random_key(proto, out).await,
        };
        if let Err(e) = result {
            reply::error(out, &e.to_string());
        }
    }

    fn targets(&self) -> Vec<u32> {
        nodes(self.node, self.cluster.is_some())
    }

    /// One node-wide op on node `target`.
    async fn ask(&mut self, target: u32, kind: OpKind, key: &[u8], value: &[u8]) -> Result<Answer, CommandError> {
        let mut batch = BatchRequest::new();
        batch.push(kind, key, value);
        let mut response = BatchResponse::default();
        let error = match self.cluster {
            Some(c) if target != self.node.config().cluster.shard.index => {
                forward_transaction(c, target, &batch, &mut response).await
            }
            _ => {
                let mut room = ReplyAllowance::new(self.budget, 1, self.node.config().edge.max_frame as usize);
                let (mut body, mut scratch) = (Default::default(), Scratch::default());
                let e = run_local(
                    self.node,
                    &batch,
                    &mut body,
                    &mut response,
                    &mut scratch,
                    &mut room,
                    self.tally,
                )
                .await;
                self.taken += room.taken();
                e
            }
        };
        error?;
        match response.result(0) {
            OpReply::Found(page) => Ok(Answer::Page(page.to_vec())),
            OpReply::Counted(n) => Ok(Answer::Count(n)),
            OpReply::Stored => Ok(Answer::Done),
            // The pattern was checked before: a scan refused is a cursor no node gave out.
            OpReply::Malformed(_) if kind == OpKind::Scan => Err(CommandError::InvalidCursor),
            OpReply::Malformed(why) => Err(CommandError::Refused {
                node: target,
                why: why.to_string(),
            }),
            other => Err(CommandError::Unexpected {
                node: target,
                what: format!("{other:?}"),
            }),
        }
    }

    /// One page of node `cursor.node`'s keys: the next cluster cursor and the keys.
    async fn page(
        &mut self,
        cursor: ClusterCursor,
        pattern: &[u8],
        count: u32,
    ) -> Result<(Option<ClusterCursor>, Vec<Vec<u8>>), CommandError> {
        let req = ScanRequest {
            cursor: cursor.at,
            count,
        }
        .encode();
        let Answer::Page(bytes) = self.ask(cursor.node, OpKind::Scan, pattern, &req).await? else {
            return Err(CommandError::Unexpected {
                node: cursor.node,
                what: "a scan without a page".into(),
            });
        };
        let page = ScanPage::decode(&bytes).ok_or_else(|| CommandError::Unexpected {
            node: cursor.node,
            what: "a scan page that does not parse".into(),
        })?;
        let keys = page.keys.iter().map(|k| k.to_vec()).collect();
        let next = match self.cluster {
            Some(_) => ClusterCursor::after(cursor.node, page.next, self.node.config().cluster.shard.count),
            None => (page.next != 0).then_some(ClusterCursor {
                node: cursor.node,
                at: page.next,
            }),
        };
        Ok((next, keys))
    }

    async fn scan(
        &mut self,
        cursor: ClusterCursor,
        pattern: &[u8],
        count: u32,
        strings: bool,
        out: &mut Vec<u8>,
    ) -> Result<(), CommandError> {
        // Without --nodes, cursor 0 starts at this node (the only one scanned).
        let cursor = match self.cluster {
            None => ClusterCursor {
                node: self.node.config().cluster.shard.index,
                ..cursor
            },
            Some(_) => cursor,
        };
        let (next, keys) = match strings {
            true => self.page(cursor, pattern, count).await?,
            false => (None, Vec::new()),
        };
        let next = next.map_or(0, |c| match self.cluster {
            None => c.at,
            Some(_) => c.to_u64(),
        });
        reply::array(out, 2);
        reply::bulk(out, next.to_string().as_bytes());
        reply::array(out, keys.len());
        for k in &keys {
            reply::bulk(out, k);
        }
        Ok(())
    }

    async fn keys(&mut self, pattern: &[u8], out: &mut Vec<u8>) -> Result<(), CommandError> {
        let first = *self.targets().first().unwrap_or(&0);
        let (mut cursor, mut all, mut bytes) = (Some(ClusterCursor { node: first, at: 0 }), Vec::new(), 0);
        while let Some(c) = cursor {
            let (next, keys) = self.page(c, pattern, PAGE).await?;
            bytes += keys.iter().map(Vec::len).sum::<usize>();
            all.extend(keys);
            if all.len() > MAX_KEYS_REPLY || bytes > MAX_KEYS_REPLY_BYTES {
                return Err(CommandError::TooManyKeys {
                    keys: MAX_KEYS_REPLY,
                    mib: MAX_KEYS_REPLY_BYTES >> 20,
                });
            }
            cursor = next;
        }
        reply::array(out, all.len());
        for k in &all {
            reply::bulk(out, k);
        }
        Ok(())
    }

    async fn sum(&mut self) -> Result<i64, CommandError> {
        let mut total = 0;
        for n in self.targets() {
            if let Answer::Count(c) = self.ask(n, OpKind::KeyCount, b"", b"").await? {
                total += c;
            }
        }
        Ok(total)
    }

    async fn flush(&mut self) -> Result<(), CommandError> {
        for n in self.targets() {
            self.ask(n, OpKind::Flush, b"", b"").await?;
        }
        Ok(())
    }

    /// A key from a random place: a random node and position, then on in scan order
    /// (wrapping once). Not uniform: a key after a long gap is likelier, as in Redis.
    async fn random_key(&mut self, proto: Proto, out: &mut Vec<u8>) -> Result<(), CommandError> {
        let nodes = self.targets();
        let start = rand::random_range(0..nodes.len());
        let mut cursor = ClusterCursor {
            node: nodes[start],
            at: u64::from(rand::random::<u32>()),
        };
        let mut wrapped = false;
        for _ in 0..1024 {
            let (next, keys) = self.page(cursor, b"", 1).await?;
            if let Some(k) = keys.first() {
                reply::bulk(out, k);
                return Ok(());
            }
            cursor = match next {
                Some(c) => c,
                None if !wrapped => {
                    wrapped = true;
                    ClusterCursor { node: nodes[0], at: 0 }
                }
                None => break,
            };
        }
        reply::null(out, proto);
        Ok(())
    }
}
