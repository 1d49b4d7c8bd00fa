//! One pipeline of RESP commands: every complete command of one read becomes a step; the
//! data commands' ops go into one batch that runs through [`Node::execute`] (the same entry
//! point as the binary protocol, so no store logic lives here), ops on keys of other shards
//! go to their owners through the cluster client, and the replies are written in command
//! order into one buffer.

use std::ops::Range;

use kvshared::client::Cluster;
use kvshared::expiry::{Expire, PutWith, now_ms};
use kvshared::stats::Counts;
use kvshared::wire::{OpKind, OpReply, watch_value};

use super::errors::{CommandError, TRY_AGAIN, no_answer};
use super::reply::{self, Proto};
use crate::edge::budget::BufferBudget;
use crate::node::Node;
use crate::routed::{NoAnswer, OpResult, Routed};

/// Where one op of the pipeline runs: in this node's batch, or forwarded.
/// What one command's reply is made of.
enum Step {
    /// A reply already written (into `Pipeline::immediate`).
    Immediate(Range<usize>),
    /// GET: a bulk value or null.
    Get(usize),
    /// SET: `+OK`, or with GET the old value.
    Set { put: usize, old: Option<usize> },
    /// SETNX, EXPIRE, PERSIST: `:1` when stored (or changed), `:0` when not.
    SetNx(usize),
    /// TTL and its kin: the key's deadline read as the command wants it.
    Ttl { op: usize, shape: TtlShape },
    /// INCR, DECR, INCRBY, DECRBY: the sum as an integer.
    Incr(usize),
    /// INCRBYFLOAT: the sum as the text stored.
    IncrFloat(usize),
    /// GETDEL: the value the get found (the delete after it in the same batch).
    GetDel { get: usize, del: usize },
    /// STRLEN: the found value's length, 0 when absent.
    Strlen(usize),
    /// GETRANGE: the bytes of the found value between two Redis indexes.
    GetRange { get: usize, start: i64, end: i64 },
    /// TYPE: `string` when found, `none` when absent.
    Type(usize),
    /// DEL: how many of `n` ops found their key.
    Del { first: usize, n: usize },
    /// EXISTS: how many of `n` gets found their key.
    Exists { first: usize, n: usize },
    /// MGET: an array of `n` values.
    MGet { first: usize, n: usize },
    /// MSET: `+OK` once all `n` puts are stored.
    MSet { first: usize, n: usize },
    /// HELLO switched the protocol: the replies after it are in this one (no reply).
    Switch(Proto),
    /// WATCH: `+OK` once the `n` gets of the watched keys are answered (the session keeps
    /// what they found: see [`Pipeline::watched`]).
    Watch { first: usize, n: usize },
    /// A keyspace command's reply (it runs alone: see `keyspace`).
    Keyspace,
    /// RENAME (`nx`: RENAMENX): `+OK` (or 1), 0 when NX found the target, an error when
    /// the key is absent.
    Rename { op: usize, nx: bool },
    /// OBJECT ENCODING: Redis's name for how it would hold the found value.
    Encoding(usize),
    /// MEMORY USAGE: what the found entry costs the store.
    Memory { op: usize, key_len: usize },
}

/// A transaction's batch (EXEC): its ops go, with the `Atomic` marker and the watched keys'
/// `Unchanged` checks first, in one batch to the node that owns its keys.
#[derive(Clone, Copy)]
struct Txn {
    /// The node that owns every key of it.
    owner: u32,
    /// Ops before the commands' own: the marker and the checks.
    header: usize,
    /// MSETNX's (answered 1 or 0), not EXEC's (an array).
    set_if_none: bool,
    /// One command's (RENAME): answered as that command.
    alone: bool,
}

/// How a TTL-family command answers a key's deadline (-2: no key, -1: no deadline).
#[derive(Clone, Copy, Debug)]
pub enum TtlShape {
    /// TTL: seconds left, rounded.
    Seconds,
    /// PTTL: milliseconds left.
    Millis,
    /// EXPIRETIME: the Unix time in seconds.
    AtSeconds,
    /// PEXPIRETIME: the Unix time in milliseconds.
    AtMillis,
}

impl TtlShape {
    /// The reply for a deadline of `at` (Unix milliseconds) read at `now`.
    pub fn answer(self, at: i64, now: u64) -> i64 {
        if at < 0 {
            return at;
        }
        let left = (at as u64).saturating_sub(now) as i64;
        match self {
            TtlShape::Seconds => (left + 500) / 1000,
            TtlShape::Millis => left,
            TtlShape::AtSeconds => at / 1000,
            TtlShape::AtMillis => at,
        }
    }
}

/// What a command answered from one get makes of the value.
#[derive(Clone, Copy, Debug)]
pub enum ReadShape {
    /// STRLEN: its length.
    Strlen,
    /// GETRANGE start end: its bytes between the two (inclusive, negative from the end).
    Range(i64, i64),
    /// TYPE: `string` or `none`.
    Type,
}

/// The bytes of a value of `len` bytes that Redis's GETRANGE `start end` gives: negative
/// indexes count from the end, both ends clamped, an empty range when start passes end.
pub fn redis_range(len: usize, start: i64, end: i64) -> std::ops::Range<usize> {
    let len_i = i64::try_from(len).unwrap_or(i64::MAX);
    let fix = |i: i64| if i < 0 { (len_i + i).max(0) } else { i };
    let (start, end) = (fix(start), fix(end).min(len_i - 1));
    if len == 0 || start > end || start >= len_i {
        return 0..0;
    }
    start as usize..end as usize + 1
}

/// The steps and ops of one pipeline, reused from read to read.
#[derive(Default)]
pub struct Pipeline {
    steps: Vec<Step>,
    /// The commands' ops, here and at other shards' nodes.
    routed: Routed,
    immediate: Vec<u8>,
    /// The protocol the connection speaks now (after this pipeline's HELLOs so far).
    proto: Proto,
    /// The protocol it spoke when this pipeline began.
    start_proto: Proto,
    /// EXEC's batch, when this pipeline is one.
    txn: Option<Txn>,
    /// A keyspace command, when this pipeline is one, and its reply once run.
    keyspace: Option<super::keyspace::Keyspace>,
    keyspace_reply: Vec<u8>,
}

impl Pipeline {
    /// Starts a new pipeline (keeps the buffers).
    pub fn clear(&mut self) {
        self.steps.clear();
        self.routed.clear();
        self.immediate.clear();
        self.start_proto = self.proto;
        self.txn = None;
        self.keyspace = None;
        self.keyspace_reply.clear();
    }

    /// Makes this pipeline a keyspace command's (it runs alone, node by node).
    pub fn keyspace(&mut self, cmd: super::keyspace::Keyspace) {
        self.keyspace = Some(cmd);
        self.steps.push(Step::Keyspace);
    }

    /// Whether the commands added now run inside a transaction's batch (EXEC, RENAME).
    pub fn in_transaction(&self) -> bool {
        self.txn.is_some()
    }

    /// The protocol the connection speaks now.
    pub fn proto(&self) -> Proto {
        self.proto
    }

    /// HELLO: the replies from here on are in `proto`.
    pub fn switch(&mut self, proto: Proto) {
        self.proto = proto;
        self.steps.push(Step::Switch(proto));
    }

    /// Whether no command is waiting (an EXEC of nothing is one: it answers `*0`).
    pub fn is_empty(&self) -> bool {
        self.steps.is_empty() && self.txn.is_none()
    }

    /// Commands waiting.
    pub fn len(&self) -> usize {
        self.steps.len()
    }

    /// A command answered without the store (PING, an error, ...): `write` puts its reply.
    pub fn immediate(&mut self, write: impl FnOnce(&mut Vec<u8>)) {
        let start = self.immediate.len();
        write(&mut self.immediate);
        self.steps.push(Step::Immediate(start..self.immediate.len()));
    }

    /// Makes this pipeline EXEC's: the commands added next go, after the `Atomic` marker
    /// and a `Unchanged` check per watched key (its value as WATCH found it), in one batch
    /// to `owner`, which runs it as one.
    pub fn begin_transaction(&mut self, owner: u32, watched: &[(Vec<u8>, [u8; 9])]) {
        self.routed.push_header(OpKind::Atomic, &[], &[]);
        for (key, seen) in watched {
            self.routed.push_header(OpKind::Unchanged, key, seen);
        }
        self.txn = Some(Txn {
            owner,
            header: 1 + watched.len(),
            set_if_none: false,
            alone: false,
        });
    }

    /// Makes this pipeline one command's atomic batch (RENAME): answered as the command,
    /// not as EXEC's array.
    pub fn begin_alone(&mut self, owner: u32) {
        self.begin_transaction(owner, &[]);
        if let Some(t) = &mut self.txn {
            t.alone = true;
        }
    }

    /// Makes this pipeline MSETNX's: as [`Pipeline::begin_transaction`] with a check that
    /// each key is absent; answered 1 when the puts ran, 0 when a key was there.
    pub fn begin_set_if_none(&mut self, owner: u32, absent: &[(Vec<u8>, [u8; 9])]) {
        self.begin_transaction(owner, absent);
        if let Some(t) = &mut self.txn {
            t.set_if_none = true;
        }
    }

    /// For a command queued in MULTI, added alone to a scratch pipeline: the node of each of
    /// its keys, or the error it was answered with at once (it would abort the transaction).
    pub fn queued_owners(&self, node: &Node) -> Result<Vec<u32>, CommandError> {
        match self.steps.as_slice() {
            [Step::Immediate(r)] if self.immediate.get(r.start) == Some(&b'-') => {
                let text = String::from_utf8_lossy(&self.immediate[r.start + 1..r.end]);
                Err(CommandError::Answered(text.trim_end().to_string()))
            }
            [Step::Switch(_)] | [Step::Watch { .. }] | [] | [_, _, ..] => Err(CommandError::NotQueueable),
            [_] => Ok(self.routed.keys().map(|k| node.owner_of(k)).collect()),
        }
    }

    /// WATCH key...: a get of each key (the session keeps what they found).
    pub fn watch(&mut self, node: &Node, forward: bool, keys: &[&[u8]]) {
        let first = self.routed.len();
        for key in keys {
            self.op(node, forward, OpKind::Get, key, &[]);
        }
        self.steps.push(Step::Watch { first, n: keys.len() });
    }

    /// After a round with a WATCH: what its gets found, as `Unchanged` checks carry it; a
    /// get that found no answer (a value too large for the reply, a failed forward) gives a
    /// value no check matches, so EXEC then answers null.
    pub fn watched(&self) -> Vec<[u8; 9]> {
        let mut out = Vec::new();
        for step in &self.steps {
            if let Step::Watch { first, n } = *step {
                for i in first..first + n {
                    out.push(match self.outcome(i) {
                        Ok(OpReply::Found(v)) => watch_value(Some(v)),
                        Ok(OpReply::NotFound) => watch_value(None),
                        _ => [2; 9],
                    });
                }
            }
        }
        out
    }

    /// Adds an op (inside a transaction's batch, always this node's: the batch goes whole).
    fn op(&mut self, node: &Node, forward: bool, kind: OpKind, key: &[u8], value: &[u8]) -> usize {
        self.routed.push(node, forward && self.txn.is_none(), kind, key, value)
    }

    /// GET key.
    pub fn get(&mut self, node: &Node, forward: bool, key: &[u8]) {
        let op = self.op(node, forward, OpKind::Get, key, &[]);
        self.steps.push(Step::Get(op));
    }

    /// SET key value [GET]: with GET, a get of the key runs just before the put (the same
    /// batch keeps their order on the key, under one lock: nothing comes between).
    pub fn set(&mut self, node: &Node, forward: bool, key: &[u8], value: &[u8], get_old: bool) {
        self.set_if(node, forward, key, value, get_old, OpKind::Put);
    }

    /// SET key value [NX|XX] [GET]: `kind` is `Put`, `PutIfAbsent` (NX) or `PutIfPresent` (XX).
    pub fn set_if(&mut self, node: &Node, forward: bool, key: &[u8], value: &[u8], get_old: bool, kind: OpKind) {
        let old = get_old.then(|| self.op(node, forward, OpKind::Get, key, &[]));
        let put = self.op(node, forward, kind, key, value);
        self.steps.push(Step::Set { put, old });
    }

    /// SET with its options (a `PutWith`; with GET, a get first): `+OK`, the old value,
    /// or null when NX/XX did not hold.
    pub fn set_with(&mut self, node: &Node, forward: bool, key: &[u8], put: PutWith<'_>, get_old: bool) {
        let old = get_old.then(|| self.op(node, forward, OpKind::Get, key, &[]));
        let put = self.op(node, forward, OpKind::PutWith, key, &put.encode());
        self.steps.push(Step::Set { put, old });
    }

    /// EXPIRE and its kin, PERSIST: answered 1 when the deadline changed, 0 when not.
    pub fn expire(&mut self, node: &Node, forward: bool, key: &[u8], e: Expire) {
        let op = self.op(node, forward, OpKind::Expire, key, &e.encode());
        self.steps.push(Step::SetNx(op));
    }

    /// TTL and its kin.
    pub fn ttl(&mut self, node: &Node, forward: bool, key: &[u8], shape: TtlShape) {
        let op = self.op(node, forward, OpKind::Ttl, key, &[]);
        self.steps.push(Step::Ttl { op, shape });
    }

    /// GETEX: a get, then the deadline's change in the same batch (nothing between).
    pub fn getex(&mut self, node: &Node, forward: bool, key: &[u8], change: Option<Expire>) {
        let get = self.op(node, forward, OpKind::Get, key, &[]);
        if let Some(e) = change {
            self.op(node, forward, OpKind::Expire, key, &e.encode());
        }
        self.steps.push(Step::Get(get));
    }

    /// SETNX key value: a conditional put answered 1 or 0.
    pub fn setnx(&mut self, node: &Node, forward: bool, key: &[u8], value: &[u8]) {
        let put = self.op(node, forward, OpKind::PutIfAbsent, key, value);
        self.steps.push(Step::SetNx(put));
    }

    /// INCRBY key by (INCR, DECR and DECRBY are this with 1, -1, -by).
    pub fn incr_by(&mut self, node: &Node, forward: bool, key: &[u8], by: i64) {
        let op = self.op(node, forward, OpKind::IncrBy, key, &by.to_le_bytes());
        self.steps.push(Step::Incr(op));
    }

    /// INCRBYFLOAT key by: answered with the sum as text.
    pub fn incr_by_float(&mut self, node: &Node, forward: bool, key: &[u8], by: f64) {
        let op = self.op(node, forward, OpKind::IncrByFloat, key, &by.to_le_bytes());
        self.steps.push(Step::IncrFloat(op));
    }

    /// APPEND key value: answered with the new length.
    pub fn append(&mut self, node: &Node, forward: bool, key: &[u8], value: &[u8]) {
        let op = self.op(node, forward, OpKind::Append, key, value);
        self.steps.push(Step::Incr(op));
    }

    /// SETRANGE key offset value: answered with the new length.
    pub fn set_range(&mut self, node: &Node, forward: bool, key: &[u8], offset: u64, value: &[u8]) {
        let arg = [&offset.to_le_bytes()[..], value].concat();
        let op = self.op(node, forward, OpKind::SetRange, key, &arg);
        self.steps.push(Step::Incr(op));
    }

    /// GETDEL key: a get and a delete of the key back to back in one batch (under one
    /// lock: nothing comes between them).
    pub fn getdel(&mut self, node: &Node, forward: bool, key: &[u8]) {
        let get = self.op(node, forward, OpKind::Get, key, &[]);
        let del = self.op(node, forward, OpKind::Delete, key, &[]);
        self.steps.push(Step::GetDel { get, del });
    }

    /// A command answered from one get of `key`: STRLEN, GETRANGE, TYPE.
    pub fn read_of(&mut self, node: &Node, forward: bool, key: &[u8], shape: ReadShape) {
        let op = self.op(node, forward, OpKind::Get, key, &[]);
        self.steps.push(match shape {
            ReadShape::Strlen => Step::Strlen(op),
            ReadShape::Range(start, end) => Step::GetRange { get: op, start, end },
            ReadShape::Type => Step::Type(op),
        });
    }

    /// RENAME / RENAMENX key newkey (the caller checked both are of one node).
    pub fn rename(&mut self, node: &Node, forward: bool, key: &[u8], to: &[u8], nx: bool) {
        let value = kvshared::keyspace::Rename { to, nx }.encode();
        let op = self.op(node, forward, OpKind::Rename, key, &value);
        self.steps.push(Step::Rename { op, nx });
    }

    /// OBJECT ENCODING key.
    pub fn encoding(&mut self, node: &Node, forward: bool, key: &[u8]) {
        let op = self.op(node, forward, OpKind::Get, key, &[]);
        self.steps.push(Step::Encoding(op));
    }

    /// MEMORY USAGE key.
    pub fn memory_usage(&mut self, node: &Node, forward: bool, key: &[u8]) {
        let op = self.op(node, forward, OpKind::Get, key, &[]);
        self.steps.push(Step::Memory { op, key_len: key.len() });
    }

    /// DEL key... or EXISTS key...
    pub fn count(&mut self, node: &Node, forward: bool, keys: &[&[u8]], delete: bool) {
        let first = self.routed.len();
        let kind = if delete { OpKind::Delete } else { OpKind::Get };
        for key in keys {
            self.op(node, forward, kind, key, &[]);
        }
        let n = keys.len();
        self.steps.push(if delete {
            Step::Del { first, n }
        } else {
            Step::Exists { first, n }
        });
    }

    /// MGET key...
    pub fn mget(&mut self, node: &Node, forward: bool, keys: &[&[u8]]) {
        let first = self.routed.len();
        for key in keys {
            self.op(node, forward, OpKind::Get, key, &[]);
        }
        self.steps.push(Step::MGet { first, n: keys.len() });
    }

    /// MSET key value ...
    pub fn mset(&mut self, node: &Node, forward: bool, pairs: &[(&[u8], &[u8])]) {
        let first = self.routed.len();
        for (key, value) in pairs {
            self.op(node, forward, OpKind::Put, key, value);
        }
        self.steps.push(Step::MSet { first, n: pairs.len() });
    }

    /// Runs the ops (this node's through [`Node::execute`], the others' through `cluster`)
    /// and appends every reply, in command order, to `out`. Found values are paid from
    /// `budget` beyond a small allowance; returns the bytes taken (the caller holds them
    /// until the replies are sent).
    pub async fn run(
        &mut self,
        node: &Node,
        cluster: Option<&Cluster>,
        budget: &BufferBudget,
        tally: &mut Counts,
        out: &mut Vec<u8>,
    ) -> usize {
        let taken = self.execute(node, cluster, budget, tally).await;
        self.write_replies(out);
        taken
    }

    /// Runs the ops; their results are then read with [`Pipeline::outcome`]. Returns the
    /// bytes taken from `budget` for found values.
    pub async fn execute(
        &mut self,
        node: &Node,
        cluster: Option<&Cluster>,
        budget: &BufferBudget,
        tally: &mut Counts,
    ) -> usize {
        if let Some(cmd) = self.keyspace.take() {
            let mut runner = super::keyspace::Runner {
                node,
                cluster,
                budget,
                tally,
                taken: 0,
            };
            let mut reply = std::mem::take(&mut self.keyspace_reply);
            runner.run(&cmd, self.proto, &mut reply).await;
            self.keyspace_reply = reply;
            return runner.taken;
        }
        let txn = self.txn.map(|t| t.owner);
        self.routed.run(node, cluster, budget, tally, txn).await
    }

    /// Op `i`'s result after [`Pipeline::execute`]: what the store (here or at the owner)
    /// answered, or why there is no answer.
    pub fn outcome(&self, i: usize) -> Result<OpReply<'_>, NoAnswer> {
        self.routed.outcome(i)
    }

    fn result(&self, i: usize) -> OpResult<'_> {
        self.routed.result(i)
    }

    fn write_replies(&self, out: &mut Vec<u8>) {
        match self.txn {
            Some(txn) => self.write_transaction(txn, out),
            None => self.write_steps(out),
        }
    }

    /// EXEC's reply: the commands' replies in an array when the batch ran; a null array
    /// when a watched key had changed; else `EXECABORT` with why.
    fn write_transaction(&self, txn: Txn, out: &mut Vec<u8>) {
        if let Some(e) = self.routed.local_error() {
            return reply::error(out, &no_answer(e));
        }
        let response = self.routed.response();
        let changed = (1..txn.header).any(|j| response.result(j) == OpReply::NotStored);
        match response.result(0) {
            OpReply::Stored if txn.set_if_none => reply::integer(out, 1),
            OpReply::Stored if txn.alone => self.write_steps(out),
            OpReply::Stored => {
                reply::array(out, self.steps.len());
                self.write_steps(out);
            }
            _ if changed && txn.set_if_none => reply::integer(out, 0),
            _ if changed => reply::null_array(out, self.start_proto),
            _ => {
                let why = (0..response.len()).find_map(|j| match response.result(j) {
                    OpReply::Moved { owner, .. } => Some(format!("a key belongs to shard group {owner}")),
                    OpReply::TryAgain => Some("a key's slot is being moved; try again".into()),
                    OpReply::Malformed(w) => Some(w.to_string()),
                    _ => None,
                });
                let why = why.unwrap_or_else(|| "it could not run".into());
                reply::error(out, &format!("EXECABORT Transaction discarded: {why}"));
            }
        }
    }

    fn write_steps(&self, out: &mut Vec<u8>) {
        let result = |i: usize| self.result(i);
        let mut proto = self.start_proto;
        for step in &self.steps {
            match *step {
                Step::Immediate(ref r) => out.extend_from_slice(&self.immediate[r.clone()]),
                Step::Switch(p) => proto = p,
                Step::Keyspace => out.extend_from_slice(&self.keyspace_reply),
                Step::Rename { op, nx } => match result(op) {
                    OpResult::Reply(OpReply::Stored) if nx => reply::integer(out, 1),
                    OpResult::Reply(OpReply::Stored) => reply::simple(out, "OK"),
                    OpResult::Reply(OpReply::NotStored) => reply::integer(out, 0),
                    OpResult::Reply(OpReply::NotFound) => reply::error(out, "ERR no such key"),
                    other => error_reply(out, other),
                },
                Step::Encoding(op) => match result(op) {
                    OpResult::Reply(OpReply::Found(v)) => reply::bulk(out, redis_encoding(v).as_bytes()),
                    OpResult::Reply(OpReply::TooLarge) => reply::bulk(out, b"raw"),
                    OpResult::Reply(OpReply::NotFound) => reply::null(out, proto),
                    other => error_reply(out, other),
                },
                Step::Memory { op, key_len } => match result(op) {
                    OpResult::Reply(OpReply::Found(v)) => {
                        reply::integer(out, crate::node::memory_usage(key_len, v.len()) as i64)
                    }
                    OpResult::Reply(OpReply::NotFound) => reply::null(out, proto),
                    other => error_reply(out, other),
                },
                Step::Get(op) => value_reply(out, result(op), proto),
                Step::Set { put, old } => match (result(put), old) {
                    (OpResult::Reply(OpReply::Stored), None) => reply::simple(out, "OK"),
                    (OpResult::Reply(OpReply::Stored | OpReply::NotStored), Some(old)) => {
                        value_reply(out, result(old), proto)
                    }
                    // SET NX/XX whose condition did not hold: a null reply, as Redis.
                    (OpResult::Reply(OpReply::NotStored), None) => reply::null(out, proto),
                    (other, _) => error_reply(out, other),
                },
                Step::GetDel { get, del } => match result(del) {
                    OpResult::Reply(OpReply::Deleted | OpReply::Absent) => value_reply(out, result(get), proto),
                    other => error_reply(out, other),
                },
                Step::Strlen(op) => match result(op) {
                    OpResult::Reply(OpReply::Found(v)) => reply::integer(out, v.len() as i64),
                    OpResult::Reply(OpReply::NotFound) => reply::integer(out, 0),
                    other => error_reply(out, other),
                },
                Step::GetRange { get, start, end } => match result(get) {
                    OpResult::Reply(OpReply::Found(v)) => reply::bulk(out, &v[redis_range(v.len(), start, end)]),
                    OpResult::Reply(OpReply::NotFound) => reply::bulk(out, b""),
                    other => error_reply(out, other),
                },
                Step::Type(op) => match result(op) {
                    OpResult::Reply(OpReply::Found(_) | OpReply::TooLarge) => reply::simple(out, "string"),
                    OpResult::Reply(OpReply::NotFound) => reply::simple(out, "none"),
                    other => error_reply(out, other),
                },
                Step::Incr(op) => match result(op) {
                    OpResult::Reply(OpReply::Counted(sum)) => reply::integer(out, sum),
                    other => error_reply(out, other),
                },
                Step::IncrFloat(op) => match result(op) {
                    OpResult::Reply(OpReply::Found(v)) => reply::bulk(out, v),
                    OpResult::Reply(OpReply::NotAnInteger) => reply::error(out, "ERR value is not a valid float"),
                    OpResult::Reply(OpReply::Overflow) => {
                        reply::error(out, "ERR increment would produce NaN or Infinity")
                    }
                    other => error_reply(out, other),
                },
                Step::Ttl { op, shape } => match result(op) {
                    OpResult::Reply(OpReply::Counted(at)) => reply::integer(out, shape.answer(at, now_ms())),
                    OpResult::Reply(OpReply::NotFound) => reply::integer(out, -2),
                    other => error_reply(out, other),
                },
                Step::Watch { first, n } => match (first..first + n).map(result).find(|r| {
                    !matches!(
                        r,
                        OpResult::Reply(OpReply::Found(_) | OpReply::NotFound | OpReply::TooLarge)
                    )
                }) {
                    None => reply::simple(out, "OK"),
                    Some(f) => error_reply(out, f),
                },
                Step::SetNx(put) => match result(put) {
                    OpResult::Reply(OpReply::Stored) => reply::integer(out, 1),
                    OpResult::Reply(OpReply::NotStored) => reply::integer(out, 0),
                    other => error_reply(out, other),
                },
                Step::Del { first, n } | Step::Exists { first, n } => {
                    let mut count = 0;
                    let mut failed = None;
                    for i in first..first + n {
                        match result(i) {
                            OpResult::Reply(OpReply::Deleted | OpReply::Found(_) | OpReply::TooLarge) => count += 1,
                            OpResult::Reply(OpReply::Absent | OpReply::NotFound) => {}
                            other => failed = failed.or(Some(other)),
                        }
                    }
                    match failed {
                        None => reply::integer(out, count),
                        Some(f) => error_reply(out, f),
                    }
                }
                Step::MGet { first, n } => {
                    reply::array(out, n);
                    for i in first..first + n {
                        value_reply(out, result(i), proto);
                    }
                }
                Step::MSet { first, n } => {
                    match (first..first + n)
                        .map(result)
                        .find(|r| !matches!(r, OpResult::Reply(OpReply::Stored)))
                    {
                        None => reply::simple(out, "OK"),
                        Some(f) => error_reply(out, f),
                    }
                }
            }
        }
    }
}

/// How Redis 7 would encode a string value: `int` when it reads as a 64-bit integer
/// (canonically), `embstr` up to 44 bytes, `raw` past that.
pub fn redis_encoding(v: &[u8]) -> &'static str {
    match v.len() {
        _ if kvshared::wire::decimal_i64(v).is_some() => "int",
        0..=44 => "embstr",
        _ => "raw",
    }
}

fn value_reply(out: &mut Vec<u8>, r: OpResult<'_>, proto: Proto) {
    match r {
        OpResult::Reply(OpReply::Found(v)) => reply::bulk(out, v),
        OpResult::Reply(OpReply::NotFound) => reply::null(out, proto),
        other => error_reply(out, other),
    }
}

fn error_reply(out: &mut Vec<u8>, r: OpResult<'_>) {
    match r {
        OpResult::Failed(e) => reply::error(out, &no_answer(&e)),
        OpResult::Reply(OpReply::Moved { owner, epoch, .. }) => reply::error(
            out,
            &format!(
                "ERR the key's slot belongs to shard group {owner} (epoch {epoch}); start this kvd with --nodes so it can forward it, or send it there"
            ),
        ),
        OpResult::Reply(OpReply::TryAgain) => reply::error(out, TRY_AGAIN),
        OpResult::Reply(OpReply::OutOfMemory) => {
            reply::error(out, "OOM command not allowed when used memory > 'maxmemory'.")
        }
        OpResult::Reply(OpReply::Malformed(why)) if why == kvshared::wire::MalformedOp::BadRange.as_str() => {
            reply::error(out, "ERR string exceeds maximum allowed size (proto-max-bulk-len)")
        }
        OpResult::Reply(OpReply::Malformed(why)) => reply::error(out, &format!("ERR malformed: {why}")),
        // Redis's own texts, which clients match.
        OpResult::Reply(OpReply::NotAnInteger) => reply::error(out, &CommandError::NotAnInteger.to_string()),
        OpResult::Reply(OpReply::Overflow) => reply::error(out, "ERR increment or decrement would overflow"),
        OpResult::Reply(OpReply::Aborted) => reply::error(out, "EXECABORT Transaction discarded"),
        OpResult::Reply(OpReply::TooLarge) => reply::error(
            out,
            "ERR the pipeline's values do not fit in one reply (--max-frame): send fewer commands at once",
        ),
        OpResult::Reply(other) => reply::error(out, &format!("ERR unexpected result {other:?}")),
    }
}

#[cfg(test)]
mod tests {
    use super::redis_range;

    /// GETRANGE's indexes as Redis's: "Hello World" examples from its documentation.
    #[test]
    fn ranges_are_redis_s() {
        let v = b"This is a string";
        let at = |s, e| &v[redis_range(v.len(), s, e)];
        assert_eq!(at(0, 3), b"This");
        assert_eq!(at(-3, -1), b"ing");
        assert_eq!(at(0, -1), &v[..]);
        assert_eq!(at(10, 100), b"string");
        assert_eq!(at(5, 2), b"");
        assert_eq!(at(100, 200), b"");
        assert_eq!(at(-100, 1), b"Th");
        assert_eq!(redis_range(0, 0, -1), 0..0);
        assert_eq!(redis_range(3, i64::MIN, i64::MAX), 0..3);
    }
}
