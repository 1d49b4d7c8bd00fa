//! The cluster client: routes ops to their owner nodes and merges the answers.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use rkyv::util::AlignedVec;
use tokio::sync::Mutex as AsyncMutex;

use super::connection::{Connection, InFlight, Reply};
use super::{ClientConfig, ClientError};
use crate::frame::FrameKind;
use crate::routing::{key_hash, owner_node};
use crate::stats::{ArchivedNodeStats, NodeStats};
use crate::wire::{BatchRequest, OpKind, OpReply, encode_empty_frame, encode_frame};

/// One operation for [`Cluster::batch`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op<'a> {
    Get(&'a [u8]),
    Put(&'a [u8], &'a [u8]),
    Delete(&'a [u8]),
}

impl<'a> Op<'a> {
    pub fn key(&self) -> &'a [u8] {
        match *self {
            Op::Get(k) | Op::Put(k, _) | Op::Delete(k) => k,
        }
    }
}

/// The result of one successful operation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    Value(Vec<u8>),
    NotFound,
    Stored,
    /// Delete: whether the key existed.
    Deleted(bool),
}

/// A node's connections; a dead connection is replaced on next use.
struct NodePool {
    addr: String,
    slots: Vec<AsyncMutex<Option<Arc<Connection>>>>,
    next: AtomicUsize,
}

/// A client of an n-node kvd cluster. Node `i` of `--nodes` must be the kvd started as `--shard i/n`.
pub struct Cluster {
    nodes: Vec<NodePool>,
    config: ClientConfig,
}

impl Cluster {
    /// A cluster client that connects lazily, on first use of each node (and reconnects after
    /// a failure). Never fails on a node being down; calls to that node do.
    pub fn new(nodes: &[String], config: ClientConfig) -> Result<Cluster, ClientError> {
        if nodes.is_empty() {
            return Err(ClientError::BadNodes("no nodes given".into()));
        }
        let nodes = nodes
            .iter()
            .map(|addr| NodePool {
                addr: addr.clone(),
                slots: (0..config.conns_per_node.max(1))
                    .map(|_| AsyncMutex::new(None))
                    .collect(),
                next: AtomicUsize::new(0),
            })
            .collect();
        Ok(Cluster { nodes, config })
    }

    /// Connects every connection to every node now; fails with the first node that refuses.
    pub async fn connect(nodes: &[String], config: ClientConfig) -> Result<Cluster, ClientError> {
        let cluster = Cluster::new(nodes, config)?;
        for node in 0..cluster.nodes.len() {
            for slot in 0..cluster.nodes[node].slots.len() {
                cluster.connection_in(node, slot).await?;
            }
        }
        Ok(cluster)
    }

    pub fn node_count(&self) -> usize {
        self.nodes.len()
    }

    pub fn addr(&self, node: usize) -> &str {
        &self.nodes[node].addr
    }

    pub fn config(&self) -> &ClientConfig {
        &self.config
    }

    /// The node that owns `key`.
    pub fn owner(&self, key: &[u8]) -> usize {
        owner_node(key_hash(key), self.nodes.len() as u32) as usize
    }

    async fn connection_in(&self, node: usize, slot: usize) -> Result<Arc<Connection>, ClientError> {
        let pool = &self.nodes[node];
        let mut guard = pool.slots[slot].lock().await;
        if let Some(conn) = guard.as_ref().filter(|c| c.is_alive()) {
            return Ok(conn.clone());
        }
        let c = &self.config;
        let conn = Arc::new(Connection::open(&pool.addr, c.pipeline, c.max_frame, c.connect_timeout).await?);
        *guard = Some(conn.clone());
        Ok(conn)
    }

    /// A connection to `node`, round-robin over its pool.
    pub async fn connection(&self, node: usize) -> Result<Arc<Connection>, ClientError> {
        let pool = &self.nodes[node];
        let slot = pool.next.fetch_add(1, Ordering::Relaxed) % pool.slots.len();
        self.connection_in(node, slot).await
    }

    /// Queues a batch for `node` (all its keys must belong to it) without waiting for the reply.
    pub async fn start_batch(&self, node: usize, batch: &BatchRequest) -> Result<InFlight, ClientError> {
        let conn = self.connection(node).await?;
        conn.start(|id, buf| encode_frame(FrameKind::BatchRequest, id, batch, buf))
            .await
    }

    /// Sends a batch to `node` and waits for the reply; read results with [`Reply::batch`].
    pub async fn send_batch(&self, node: usize, batch: &BatchRequest) -> Result<Reply, ClientError> {
        self.start_batch(node, batch)
            .await?
            .wait(self.config.request_timeout)
            .await
    }

    /// Runs `ops` across the cluster: splits them by owner, sends the parts to their nodes
    /// concurrently and returns one result per op, in op order. A node that fails fails only
    /// the ops routed to it.
    pub async fn batch(&self, ops: &[Op<'_>]) -> Vec<Result<Outcome, ClientError>> {
        let n = self.nodes.len();
        let mut parts: Vec<(BatchRequest, Vec<usize>)> = (0..n).map(|_| Default::default()).collect();
        for (i, op) in ops.iter().enumerate() {
            let (req, idx) = &mut parts[self.owner(op.key())];
            match *op {
                Op::Get(k) => req.push(OpKind::Get, k, &[]),
                Op::Put(k, v) => req.push(OpKind::Put, k, v),
                Op::Delete(k) => req.push(OpKind::Delete, k, &[]),
            }
            idx.push(i);
        }
        // Queue every part first, then collect: the nodes work concurrently.
        let mut started = Vec::with_capacity(n);
        for (node, (req, idx)) in parts.iter().enumerate() {
            if !idx.is_empty() {
                started.push((node, self.start_batch(node, req).await));
            }
        }
        let mut results: Vec<Option<Result<Outcome, ClientError>>> = vec![None; ops.len()];
        for (node, flight) in started {
            let idx = &parts[node].1;
            let reply = match flight {
                Ok(f) => f.wait(self.config.request_timeout).await,
                Err(e) => Err(e),
            };
            let view = reply.as_ref().map_err(Clone::clone).and_then(|r| r.batch());
            match view {
                Ok(view) if view.len() == idx.len() => {
                    for (j, &i) in idx.iter().enumerate() {
                        results[i] = Some(self.outcome(node, view.result(j)));
                    }
                }
                Ok(view) => {
                    let err = ClientError::Protocol {
                        addr: self.addr(node).to_string(),
                        reason: format!("{} results for {} ops", view.len(), idx.len()),
                    };
                    for &i in idx {
                        results[i] = Some(Err(err.clone()));
                    }
                }
                Err(err) => {
                    for &i in idx {
                        results[i] = Some(Err(err.clone()));
                    }
                }
            }
        }
        results
            .into_iter()
            .map(|r| {
                r.unwrap_or_else(|| {
                    Err(ClientError::Protocol {
                        addr: String::new(),
                        reason: "op was not sent".into(),
                    })
                })
            })
            .collect()
    }

    fn outcome(&self, node: usize, reply: OpReply<'_>) -> Result<Outcome, ClientError> {
        let addr = || self.addr(node).to_string();
        match reply {
            OpReply::Found(v) => Ok(Outcome::Value(v.to_vec())),
            OpReply::NotFound => Ok(Outcome::NotFound),
            OpReply::Stored => Ok(Outcome::Stored),
            OpReply::Deleted => Ok(Outcome::Deleted(true)),
            OpReply::Absent => Ok(Outcome::Deleted(false)),
            OpReply::WrongShard { owner, nodes } => Err(ClientError::WrongShard {
                addr: addr(),
                owner,
                nodes,
            }),
            OpReply::Malformed(reason) => Err(ClientError::MalformedOp {
                addr: addr(),
                reason: reason.to_string(),
            }),
        }
    }

    async fn one(&self, op: Op<'_>) -> Result<Outcome, ClientError> {
        self.batch(&[op]).await.pop().unwrap_or_else(|| {
            Err(ClientError::Protocol {
                addr: String::new(),
                reason: "no result".into(),
            })
        })
    }

    /// The value of `key`, or `None` if it is absent.
    pub async fn get(&self, key: &[u8]) -> Result<Option<Vec<u8>>, ClientError> {
        match self.one(Op::Get(key)).await? {
            Outcome::Value(v) => Ok(Some(v)),
            _ => Ok(None),
        }
    }

    pub async fn put(&self, key: &[u8], value: &[u8]) -> Result<(), ClientError> {
        self.one(Op::Put(key, value)).await.map(|_| ())
    }

    /// Deletes `key`; returns whether it existed.
    pub async fn delete(&self, key: &[u8]) -> Result<bool, ClientError> {
        Ok(matches!(self.one(Op::Delete(key)).await?, Outcome::Deleted(true)))
    }

    /// The statistics of node `node`.
    pub async fn stats(&self, node: usize) -> Result<NodeStats, ClientError> {
        let conn = self.connection(node).await?;
        let reply = conn
            .start(|id, buf: &mut AlignedVec| {
                encode_empty_frame(FrameKind::StatsRequest, id, buf);
                Ok(())
            })
            .await?
            .wait(self.config.request_timeout)
            .await?;
        if reply.kind != FrameKind::StatsResponse {
            return Err(reply.unexpected());
        }
        let protocol = |reason: String| ClientError::Protocol {
            addr: self.addr(node).to_string(),
            reason,
        };
        let archived = rkyv::access::<ArchivedNodeStats, rkyv::rancor::BoxedError>(&reply.body)
            .map_err(|e| protocol(e.to_string()))?;
        rkyv::deserialize::<NodeStats, rkyv::rancor::BoxedError>(archived).map_err(|e| protocol(e.to_string()))
    }

    /// Waits until every node answers a stats request, or `within` passes.
    pub async fn wait_ready(&self, within: Duration) -> Result<(), ClientError> {
        let deadline = tokio::time::Instant::now() + within;
        for node in 0..self.nodes.len() {
            loop {
                match self.stats(node).await {
                    Ok(_) => break,
                    Err(e) if tokio::time::Instant::now() >= deadline => return Err(e),
                    Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
                }
            }
        }
        Ok(())
    }
}
