//! A batch of ops routed between this node and the others: what RESP and HTTP share
//! between parsing a request and writing its reply. Each op is pushed with its key; an op
//! on a key of this node's slots joins one batch that runs through [`Node::execute`], an op
//! on another shard's key is forwarded to its owner with the cluster client (`--nodes`),
//! and each op's result is then read back by the index it was pushed at. The front decides
//! what the results mean in its protocol; nothing here knows one.

use std::ops::Range;

use kvshared::client::{ClientError, Cluster, Op, Outcome};
use kvshared::frame::AlignedVec;
use kvshared::stats::Counts;
use kvshared::wire::{BatchRequest, BatchResponse, BatchView, OpKind, OpReply, ReplyView, encode_body};

use crate::edge::budget::{BufferBudget, ReplyAllowance};
use crate::node::{Node, NodeError, Scratch};

/// Why an op has no answer (its outcome, for `Node`, is said by the variant).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NoAnswer {
    /// The node could not answer this node's batch.
    #[error(transparent)]
    Node(#[from] NodeError),
    /// The batch or an answer did not encode or parse.
    #[error("{0}")]
    Malformed(String),
    /// The key's owner was not reached (the op may have run there).
    #[error("forwarding to the key's owner failed: {0}")]
    Forward(String),
    /// A transaction's owner was not reached (it may have run there).
    #[error("forwarding the transaction to its keys' owner failed: {0}")]
    ForwardTransaction(String),
    /// The cluster client gave no answer for the op.
    #[error("no node to forward the key to")]
    NoOwner,
    /// The log gave no answer.
    #[error("the shard's log did not answer")]
    LogSilent,
    /// An index that was not pushed.
    #[error("internal: op out of range")]
    OutOfRange,
}

/// One op's result, wherever it ran.
pub enum OpResult<'a> {
    /// What the store that holds the key answered.
    Reply(OpReply<'a>),
    /// Why there is none.
    Failed(NoAnswer),
}

#[derive(Clone, Copy)]
enum OpAt {
    Local(usize),
    Remote(usize),
}

/// The ops of one request or pipeline, and then their results (buffers kept from use to use).
#[derive(Default)]
pub struct Routed {
    ops: Vec<OpAt>,
    local: BatchRequest,
    remote: Vec<(OpKind, Range<usize>, Range<usize>)>,
    remote_bytes: Vec<u8>,
    response: BatchResponse,
    remote_results: Vec<Result<Outcome, ClientError>>,
    local_error: Option<NoAnswer>,
    body: AlignedVec,
    scratch: Scratch,
}

impl Routed {
    /// Forgets the ops and their results (keeps the buffers).
    pub fn clear(&mut self) {
        self.ops.clear();
        self.local.clear();
        self.remote.clear();
        self.remote_bytes.clear();
        self.remote_results.clear();
        self.local_error = None;
    }

    /// Adds an op; returns its index for [`Routed::result`]. It runs here unless `forward`
    /// and its key's slot belongs to another shard group.
    pub fn push(&mut self, node: &Node, forward: bool, kind: OpKind, key: &[u8], value: &[u8]) -> usize {
        // (A node that serves every slot computes no key's slot: 3.5% of kvd's CPU under
        // memtier's load on one node.)
        let local = !forward || node.serves_every_slot() || node.owner_of(key) == node.config().cluster.shard.index;
        let at = if local {
            self.local.push(kind, key, value);
            OpAt::Local(self.local.len() - 1)
        } else {
            let k = self.remote_bytes.len()..self.remote_bytes.len() + key.len();
            self.remote_bytes.extend_from_slice(key);
            let v = self.remote_bytes.len()..self.remote_bytes.len() + value.len();
            self.remote_bytes.extend_from_slice(value);
            self.remote.push((kind, k, v));
            OpAt::Remote(self.remote.len() - 1)
        };
        self.ops.push(at);
        self.ops.len() - 1
    }

    /// Adds an op to this node's batch that is not one of the request's (a transaction's
    /// `Atomic` marker and `Unchanged` checks): its result is read from [`Routed::response`].
    pub fn push_header(&mut self, kind: OpKind, key: &[u8], value: &[u8]) {
        self.local.push(kind, key, value);
    }

    /// How many ops were pushed.
    pub fn len(&self) -> usize {
        self.ops.len()
    }

    /// Whether no op was pushed.
    pub fn is_empty(&self) -> bool {
        self.ops.is_empty()
    }

    /// The keys of every op pushed (here, then forwarded).
    pub fn keys(&self) -> impl Iterator<Item = &[u8]> {
        let local = (0..self.local.len()).filter_map(|i| self.local.key(i));
        let remote = self.remote.iter().map(|(_, k, _)| &self.remote_bytes[k.clone()]);
        local.chain(remote)
    }

    /// Runs the ops: this node's batch through [`Node::execute`], the others' through
    /// `cluster`; with `transaction_owner`, this node's batch is a transaction of that
    /// group's keys and goes there whole. Found values are paid from `budget` beyond a
    /// small allowance; returns the bytes taken (the caller holds them until the replies
    /// are sent).
    pub async fn run(
        &mut self,
        node: &Node,
        cluster: Option<&Cluster>,
        budget: &BufferBudget,
        tally: &mut Counts,
        transaction_owner: Option<u32>,
    ) -> usize {
        if let (Some(owner), Some(c)) = (transaction_owner, cluster)
            && owner != node.config().cluster.shard.index
        {
            self.local_error = forward_transaction(c, owner, &self.local, &mut self.response)
                .await
                .err();
            return 0;
        }
        let remote: Vec<Op<'_>> = self
            .remote
            .iter()
            .map(|(kind, k, v)| Op::Raw(*kind, &self.remote_bytes[k.clone()], &self.remote_bytes[v.clone()]))
            .collect();
        let forwarded = async {
            match cluster {
                Some(c) if !remote.is_empty() => c.batch(&remote).await,
                _ => Vec::new(),
            }
        };
        let mut room = ReplyAllowance::new(budget, self.local.len(), node.config().edge.max_frame as usize);
        let local = run_local(
            node,
            &self.local,
            &mut self.body,
            &mut self.response,
            &mut self.scratch,
            &mut room,
            tally,
        );
        let (local_result, remote_results) = tokio::join!(local, forwarded);
        self.local_error = local_result.err();
        self.remote_results = remote_results;
        room.taken()
    }

    /// This node's batch's response (a transaction's header results among them).
    pub fn response(&self) -> &BatchResponse {
        &self.response
    }

    /// Why this node's batch has no answer, if it has none.
    pub fn local_error(&self) -> Option<&NoAnswer> {
        self.local_error.as_ref()
    }

    /// Op `i`'s result after [`Routed::run`].
    pub fn result(&self, i: usize) -> OpResult<'_> {
        match self.ops.get(i) {
            Some(OpAt::Local(j)) => match &self.local_error {
                Some(e) => OpResult::Failed(e.clone()),
                None => OpResult::Reply(self.response.result(*j)),
            },
            Some(OpAt::Remote(j)) => match self.remote_results.get(*j) {
                Some(Ok(outcome)) => OpResult::Reply(reply_of(outcome)),
                Some(Err(e)) => OpResult::Failed(NoAnswer::Forward(e.to_string())),
                None => OpResult::Failed(NoAnswer::NoOwner),
            },
            None => OpResult::Failed(NoAnswer::OutOfRange),
        }
    }

    /// Op `i`'s result as a `Result`.
    pub fn outcome(&self, i: usize) -> Result<OpReply<'_>, NoAnswer> {
        match self.result(i) {
            OpResult::Reply(r) => Ok(r),
            OpResult::Failed(e) => Err(e),
        }
    }
}

/// A forwarded op's outcome as the store's reply.
fn reply_of(outcome: &Outcome) -> OpReply<'_> {
    match outcome {
        Outcome::Value(v) => OpReply::Found(v),
        Outcome::NotFound => OpReply::NotFound,
        Outcome::Stored => OpReply::Stored,
        Outcome::Deleted(true) => OpReply::Deleted,
        Outcome::Deleted(false) => OpReply::Absent,
        Outcome::NotStored => OpReply::NotStored,
        Outcome::Counted(sum) => OpReply::Counted(*sum),
        Outcome::NotAnInteger => OpReply::NotAnInteger,
        Outcome::Overflow => OpReply::Overflow,
        Outcome::Aborted => OpReply::Aborted,
    }
}

/// Sends a transaction's batch to `owner` (the node of its keys) and puts its answer in
/// `out`.
pub async fn forward_transaction(
    c: &Cluster,
    owner: u32,
    batch: &BatchRequest,
    out: &mut BatchResponse,
) -> Result<(), NoAnswer> {
    let reply = c
        .send_batch(owner as usize, batch)
        .await
        .map_err(|e| NoAnswer::ForwardTransaction(e.to_string()))?;
    let view: ReplyView<'_> = reply.batch().map_err(|e| NoAnswer::Malformed(e.to_string()))?;
    out.reset(view.len());
    for j in 0..view.len() {
        out.copy_result(j, &view, j, |_| true);
    }
    Ok(())
}

/// Runs this node's batch through [`Node::execute`] (the same validated view as a binary
/// frame), waiting for the log when it has one.
pub async fn run_local(
    node: &Node,
    batch: &BatchRequest,
    body: &mut AlignedVec,
    response: &mut BatchResponse,
    scratch: &mut Scratch,
    room: &mut ReplyAllowance<'_>,
    tally: &mut Counts,
) -> Result<(), NoAnswer> {
    if batch.is_empty() {
        return Ok(());
    }
    encode_body(batch, body).map_err(|e| NoAnswer::Malformed(e.to_string()))?;
    let view = BatchView::parse(body).map_err(|e| NoAnswer::Malformed(e.to_string()))?;
    tally.batches += 1;
    let max_reply = node.config().edge.max_frame as usize;
    // In memory the batch is done here; with a data dir its writes wait for the log.
    let Some(mut log) = node.execute(&view, response, room, scratch, tally) else {
        return Ok(());
    };
    log.wait().await;
    match log.finish(response, max_reply) {
        Some(result) => result.map_err(NoAnswer::Node),
        None => Err(NoAnswer::LogSilent),
    }
}
