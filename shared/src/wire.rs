//! Wire types: what a batch request and its response look like inside a frame body.
//!
//! A batch is laid out by column rather than as a list of op structs: one array of op kinds,
//! one byte string holding every key back to back with an array of end offsets, and the same
//! for values. This is what makes the hot path cheap on both sides:
//!
//! * the client appends into five reusable vectors, with no allocation per op, and rkyv copies
//!   each column into the frame with one `memcpy`;
//! * validating the archive (`rkyv::access`, bytecheck) checks five arrays, not one struct per
//!   op; the byte columns cost a bounds check each, whatever the batch size;
//! * the server reads keys and values in place out of the received frame.
//!
//! Offsets inside a validated archive are still untrusted numbers: [`BatchView::op`] and
//! [`ReplyView::result`] bounds-check every span and turn a bad one into a per-op error,
//! never a panic.

use rkyv::rancor;
use rkyv::util::AlignedVec;
use rkyv::{Archive, Deserialize, Serialize};

use crate::frame::{FrameHeader, FrameKind, HEADER_LEN, MAX_FRAME_LIMIT};
use crate::stats::{ArchivedNodeStats, NodeStats};

/// The operation of one entry in a batch.
#[derive(Archive, Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[rkyv(derive(Debug, Clone, Copy, PartialEq, Eq))]
#[repr(u8)]
pub enum OpKind {
    /// Read the key.
    Get = 0,
    /// Store the value under the key.
    Put = 1,
    /// Remove the key.
    Delete = 2,
    /// Store the value only if the key is absent (Redis `SET NX`).
    PutIfAbsent = 3,
    /// Store the value only if the key is present (Redis `SET XX`).
    PutIfPresent = 4,
    /// Add the value (8 bytes, a little-endian `i64`) to the key's value read as a decimal
    /// integer (an absent key counts as 0) and store the sum in decimal (Redis `INCRBY`);
    /// answered `Counted` with the sum, `NotAnInteger` or `Overflow` (nothing changed).
    IncrBy = 5,
    /// Append the value to the key's value (an absent key starts empty; Redis `APPEND`);
    /// answered `Counted` with the new length.
    Append = 6,
    /// Overwrite the key's value from an offset (the value: the offset as 8 bytes, a
    /// little-endian `u64`, then the bytes), padding with zero bytes up to it (Redis
    /// `SETRANGE`); an absent key with no bytes to write stays absent. Answered `Counted`
    /// with the new length. Past [`MAX_STRING`] it is malformed.
    SetRange = 7,
    /// Store the value with a condition and what happens to the key's time to live (the
    /// value: a [`crate::expiry::PutWith`]; Redis `SET` with its options). Answered
    /// `Stored`, or `NotStored` when the condition does not hold.
    PutWith = 8,
    /// Set or remove the key's deadline (the value: a [`crate::expiry::Expire`]; Redis
    /// `EXPIRE`, `PEXPIREAT`, `PERSIST`, ...). Answered `Stored` when it changed it,
    /// `NotStored` when the key is absent or the condition does not hold.
    Expire = 9,
    /// Read the key's deadline: answered `Counted` with it (Unix milliseconds), `Counted`
    /// -1 for a key without one, `NotFound` for an absent key.
    Ttl = 10,
    /// Remove the key if its deadline has passed (a leader's expiry, through its log);
    /// answered `Deleted`, or `Absent` when it is absent or still alive.
    Expired = 11,
    /// The time the batch's ops see (8 bytes, Unix milliseconds). Only a log entry carries
    /// one (its leader's clock when it logged the batch); from a client it is malformed.
    Clock = 12,
    /// Run the whole batch as one (a transaction, Redis's `MULTI`/`EXEC`): every map shard
    /// it touches is locked first, so no other batch's op comes between its ops; if any op
    /// cannot run (malformed, another node's key) or a `Unchanged` check fails, none runs.
    /// No key (an empty one); answered `Stored` when the batch ran, `Aborted` when not.
    Atomic = 13,
    /// In an atomic batch: the batch runs only if the key's value is still the one watched
    /// (the value: [`watch_value`] of it; Redis's `WATCH`). Answered `Stored` when it is,
    /// `NotStored` when it changed (and every other op `Aborted`).
    Unchanged = 14,
    /// Add the value (8 bytes, a little-endian `f64`) to the key's value read as a decimal
    /// number (absent: 0) and store the sum as text (Redis `INCRBYFLOAT`); answered `Found`
    /// with the text stored, `NotAnInteger` when the value is not a number, `Overflow`
    /// when the sum is not finite (nothing changed).
    IncrByFloat = 15,
    /// A page of the node's keys (Redis's `SCAN`): the value is a
    /// [`crate::keyspace::ScanRequest`], the key a Redis glob pattern (empty: every key).
    /// Node-wide: alone in its batch (a log entry's clock aside). Answered `Found` with a
    /// [`crate::keyspace::ScanPage`].
    Scan = 16,
    /// How many keys the node holds (Redis's `DBSIZE`); node-wide, no key. Answered `Counted`.
    KeyCount = 17,
    /// Remove every key of the node (Redis's `FLUSHALL`); node-wide, no key, a write (with a
    /// data dir, one log entry). Answered `Stored`.
    Flush = 18,
    /// In an atomic batch: move the key's value and deadline to another key of this node
    /// (the value: a [`crate::keyspace::Rename`]; Redis's `RENAME`/`RENAMENX`). Answered
    /// `Stored`, `NotFound` when the key is absent, `NotStored` when `nx` and the target exists.
    Rename = 19,
    /// Change slots' states at this node (the value: a [`crate::slots::SlotChange`]; a
    /// migration's step, see [`crate::slots`]); node-wide, no key, a write (with a data dir,
    /// one log entry). Answered `Stored`, or `NotStored` when the node's slots are not where
    /// the change may start from (nothing changed).
    SlotSet = 20,
    /// A page of the keys of some slots with their values and deadlines (the value:
    /// [`crate::slot_copy::encode_slot_scan`]): a migration's copy. Node-wide, a read. Answered
    /// `Found` with a page ([`crate::slot_copy::decode_copied`]).
    SlotScan = 21,
    /// Store a migrated key (the value: [`crate::slot_copy::encode_load`]): accepted only while
    /// the key's slot is importing here. Answered `Stored`.
    Load = 22,
    /// The node's slot table ([`crate::slots::SlotTable::encode`]); node-wide, no key, a read.
    /// Answered `Found` with it.
    SlotMap = 23,
    /// How many ops each slot has had here, sampled (one op in
    /// [`crate::slots::SLOT_LOAD_SAMPLE_EVERY`] counted), since the node started: 16,384
    /// little-endian `u32`s that wrap; node-wide, no key, a read. Answered `Found` with them.
    /// Two readings apart give each slot's load over the time between (`kvd admin
    /// rebalance --by load`).
    SlotLoad = 24,
    /// A step of a slot migration's copy made while the slots still take writes (the value:
    /// a [`crate::slot_copy::TrackRequest`]): track the keys written in some slots, page
    /// all their keys, page the ones written since. Node-wide, a read (it changes no key;
    /// the tracking lives in the serving member's memory only). Answered as the request says.
    SlotTrack = 25,
}

impl OpKind {
    /// Every kind, in the order of its byte.
    pub const ALL: [OpKind; 26] = [
        OpKind::Get,
        OpKind::Put,
        OpKind::Delete,
        OpKind::PutIfAbsent,
        OpKind::PutIfPresent,
        OpKind::IncrBy,
        OpKind::Append,
        OpKind::SetRange,
        OpKind::PutWith,
        OpKind::Expire,
        OpKind::Ttl,
        OpKind::Expired,
        OpKind::Clock,
        OpKind::Atomic,
        OpKind::Unchanged,
        OpKind::IncrByFloat,
        OpKind::Scan,
        OpKind::KeyCount,
        OpKind::Flush,
        OpKind::Rename,
        OpKind::SlotSet,
        OpKind::SlotScan,
        OpKind::Load,
        OpKind::SlotMap,
        OpKind::SlotLoad,
        OpKind::SlotTrack,
    ];

    /// Whether the op concerns the whole node rather than one key (no key routes it): a
    /// bit test on the hot path (one per op); `node_wide` is the exhaustive list, and
    /// `tests::node_wide_kinds_agree` holds the two equal.
    #[inline]
    pub fn is_node_wide(self) -> bool {
        matches!(
            self,
            OpKind::Scan
                | OpKind::KeyCount
                | OpKind::Flush
                | OpKind::SlotSet
                | OpKind::SlotScan
                | OpKind::SlotMap
                | OpKind::SlotLoad
                | OpKind::SlotTrack
        )
    }

    /// The node-wide op this is, if it is one. Every kind is named here, so a kind added
    /// later must be placed on one side or the other (a node-wide op that fell through to
    /// another's handling once could have emptied the node).
    pub fn node_wide(self) -> Option<NodeWide> {
        match self {
            OpKind::Scan => Some(NodeWide::Scan),
            OpKind::KeyCount => Some(NodeWide::KeyCount),
            OpKind::Flush => Some(NodeWide::Flush),
            OpKind::SlotSet => Some(NodeWide::SlotSet),
            OpKind::SlotScan => Some(NodeWide::SlotScan),
            OpKind::SlotMap => Some(NodeWide::SlotMap),
            OpKind::SlotLoad => Some(NodeWide::SlotLoad),
            OpKind::SlotTrack => Some(NodeWide::SlotTrack),
            OpKind::Get
            | OpKind::Put
            | OpKind::Delete
            | OpKind::PutIfAbsent
            | OpKind::PutIfPresent
            | OpKind::IncrBy
            | OpKind::Append
            | OpKind::SetRange
            | OpKind::PutWith
            | OpKind::Expire
            | OpKind::Ttl
            | OpKind::Expired
            | OpKind::Clock
            | OpKind::Atomic
            | OpKind::Unchanged
            | OpKind::IncrByFloat
            | OpKind::Rename
            | OpKind::Load => None,
        }
    }
}

/// The ops that concern a whole node, each alone in its batch (see [`OpKind::node_wide`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NodeWide {
    /// [`OpKind::Scan`].
    Scan,
    /// [`OpKind::KeyCount`].
    KeyCount,
    /// [`OpKind::Flush`].
    Flush,
    /// [`OpKind::SlotSet`].
    SlotSet,
    /// [`OpKind::SlotScan`].
    SlotScan,
    /// [`OpKind::SlotMap`].
    SlotMap,
    /// [`OpKind::SlotLoad`].
    SlotLoad,
    /// [`OpKind::SlotTrack`].
    SlotTrack,
}

/// The longest value a read-modify-write op may make (Redis's default `proto-max-bulk-len`).
pub const MAX_STRING: u64 = 512 << 20;

impl OpKind {
    /// Whether the op carries a value (the puts, and an increment's delta).
    pub fn has_value(self) -> bool {
        matches!(
            self,
            OpKind::Put
                | OpKind::PutIfAbsent
                | OpKind::PutIfPresent
                | OpKind::IncrBy
                | OpKind::Append
                | OpKind::SetRange
                | OpKind::PutWith
                | OpKind::Expire
                | OpKind::Clock
                | OpKind::Unchanged
                | OpKind::IncrByFloat
                | OpKind::Scan
                | OpKind::Rename
                | OpKind::SlotSet
                | OpKind::SlotScan
                | OpKind::Load
                | OpKind::SlotTrack
        )
    }

    /// Whether the op changes the store (everything but the reads, get and ttl, and a
    /// transaction's marker and checks).
    pub fn is_write(self) -> bool {
        !matches!(
            self,
            OpKind::Get
                | OpKind::Ttl
                | OpKind::Atomic
                | OpKind::Unchanged
                | OpKind::Scan
                | OpKind::KeyCount
                | OpKind::SlotScan
                | OpKind::SlotMap
                | OpKind::SlotLoad
                | OpKind::SlotTrack
        )
    }
}

impl OpKind {
    /// Whether a follower of a replica group may serve the op (once it has applied its
    /// leader's read index): every read but a slot copy's `SlotTrack`, whose tracking lives
    /// in the leader alone. Clients send a batch of such ops to any member; a follower
    /// refuses the rest, naming the leader.
    pub fn follower_may_serve(self) -> bool {
        !self.is_write() && self != OpKind::SlotTrack
    }
}

impl From<&ArchivedOpKind> for OpKind {
    fn from(k: &ArchivedOpKind) -> OpKind {
        match k {
            ArchivedOpKind::Get => OpKind::Get,
            ArchivedOpKind::Put => OpKind::Put,
            ArchivedOpKind::Delete => OpKind::Delete,
            ArchivedOpKind::PutIfAbsent => OpKind::PutIfAbsent,
            ArchivedOpKind::PutIfPresent => OpKind::PutIfPresent,
            ArchivedOpKind::IncrBy => OpKind::IncrBy,
            ArchivedOpKind::Append => OpKind::Append,
            ArchivedOpKind::SetRange => OpKind::SetRange,
            ArchivedOpKind::PutWith => OpKind::PutWith,
            ArchivedOpKind::Expire => OpKind::Expire,
            ArchivedOpKind::Ttl => OpKind::Ttl,
            ArchivedOpKind::Expired => OpKind::Expired,
            ArchivedOpKind::Clock => OpKind::Clock,
            ArchivedOpKind::Atomic => OpKind::Atomic,
            ArchivedOpKind::Unchanged => OpKind::Unchanged,
            ArchivedOpKind::IncrByFloat => OpKind::IncrByFloat,
            ArchivedOpKind::Scan => OpKind::Scan,
            ArchivedOpKind::KeyCount => OpKind::KeyCount,
            ArchivedOpKind::Flush => OpKind::Flush,
            ArchivedOpKind::Rename => OpKind::Rename,
            ArchivedOpKind::SlotSet => OpKind::SlotSet,
            ArchivedOpKind::SlotScan => OpKind::SlotScan,
            ArchivedOpKind::Load => OpKind::Load,
            ArchivedOpKind::SlotMap => OpKind::SlotMap,
            ArchivedOpKind::SlotLoad => OpKind::SlotLoad,
            ArchivedOpKind::SlotTrack => OpKind::SlotTrack,
        }
    }
}

/// What a `Unchanged` op carries for a key's value as it was watched (absent: `None`): a
/// presence byte and a 64-bit digest of the bytes. (A write that puts back the very same
/// value is therefore not seen as a change; Redis's `WATCH` would see it.)
pub fn watch_value(value: Option<&[u8]>) -> [u8; 9] {
    let mut out = [0u8; 9];
    if let Some(v) = value {
        out[0] = 1;
        out[1..].copy_from_slice(&crate::routing::key_hash(v).to_le_bytes());
    }
    out
}

/// A number as Redis's `INCRBYFLOAT` reads one (stored values and its argument): decimal
/// or exponent notation, no spaces, finite.
pub fn decimal_f64(bytes: &[u8]) -> Option<f64> {
    let text = std::str::from_utf8(bytes).ok()?;
    let plain = !text.is_empty() && text.bytes().all(|b| b.is_ascii_digit() || b"+-.eE".contains(&b));
    text.parse::<f64>().ok().filter(|v| plain && v.is_finite())
}

/// How `INCRBYFLOAT` writes a sum: the shortest text that reads back as the same double,
/// without an exponent, and at most 17 digits after the point, trailing zeros cut (Redis
/// prints its long double with `%.17Lf`: the same for most sums, a few more digits of a
/// long double for some; a sum below 1e-17 is `0`, as in Redis).
pub fn float_text(v: f64) -> String {
    let mut text = format!("{v}");
    if text.split_once('.').is_some_and(|(_, fraction)| fraction.len() > 17) {
        text = format!("{v:.17}");
        let kept = text.trim_end_matches('0').trim_end_matches('.').len();
        text.truncate(kept);
    }
    if text == "-0" { "0".into() } else { text }
}

/// A decimal 64-bit integer as Redis reads one (`INCR`'s stored values, `INCRBY`'s
/// argument): no sign but `-`, no spaces, no leading zeros but `0` itself, within `i64`.
pub fn decimal_i64(bytes: &[u8]) -> Option<i64> {
    let digits = bytes.strip_prefix(b"-").unwrap_or(bytes);
    let canonical = match digits {
        [b'0'] => bytes.len() == 1,
        [b'1'..=b'9', rest @ ..] => rest.iter().all(u8::is_ascii_digit),
        _ => false,
    };
    if !canonical || bytes.len() > 20 {
        return None;
    }
    std::str::from_utf8(bytes).ok()?.parse().ok()
}

/// A batch of operations for one node, built in place and reused between batches.
#[derive(Archive, Serialize, Default, Debug, Clone, PartialEq, Eq)]
pub struct BatchRequest {
    kinds: Vec<OpKind>,
    key_ends: Vec<u32>,
    keys: Vec<u8>,
    value_ends: Vec<u32>,
    values: Vec<u8>,
}

impl BatchRequest {
    /// An empty batch.
    pub fn new() -> Self {
        Self::default()
    }

    /// An empty batch with room for `ops` ops of `key_bytes` and `value_bytes` in all.
    pub fn with_capacity(ops: usize, key_bytes: usize, value_bytes: usize) -> Self {
        BatchRequest {
            kinds: Vec::with_capacity(ops),
            key_ends: Vec::with_capacity(ops),
            keys: Vec::with_capacity(key_bytes),
            value_ends: Vec::with_capacity(ops),
            values: Vec::with_capacity(value_bytes),
        }
    }

    /// Empties the batch, keeping its capacity.
    pub fn clear(&mut self) {
        self.kinds.clear();
        self.key_ends.clear();
        self.keys.clear();
        self.value_ends.clear();
        self.values.clear();
    }

    /// Ops in the batch.
    pub fn len(&self) -> usize {
        self.kinds.len()
    }

    /// Whether every op is one a follower may serve (and there is one): see
    /// [`OpKind::follower_may_serve`].
    pub fn reads_only(&self) -> bool {
        !self.kinds.is_empty() && self.kinds.iter().all(|k| k.follower_may_serve())
    }

    /// Whether the batch holds no op.
    pub fn is_empty(&self) -> bool {
        self.kinds.is_empty()
    }

    /// Appends an op whose key `append_key` appends to the keys column in place (it must
    /// only append), with no buffer of the caller's to copy it from: as
    /// [`BatchRequest::push`] otherwise. A load generator's keys are made here.
    #[inline]
    pub fn push_appending_key(&mut self, kind: OpKind, append_key: impl FnOnce(&mut Vec<u8>), value: &[u8]) {
        let start = self.keys.len();
        append_key(&mut self.keys);
        debug_assert!(self.keys.len() >= start, "a key is appended, nothing taken away");
        self.kinds.push(kind);
        self.key_ends.push(self.keys.len() as u32);
        if kind.has_value() {
            self.values.extend_from_slice(value);
        }
        self.value_ends.push(self.values.len() as u32);
    }

    /// Appends an op; `value` is ignored (stored empty) for get and delete.
    #[inline]
    pub fn push(&mut self, kind: OpKind, key: &[u8], value: &[u8]) {
        self.push_appending_key(kind, |keys| keys.extend_from_slice(key), value);
    }

    /// The key of op `i`.
    pub fn key(&self, i: usize) -> Option<&[u8]> {
        let start = match i {
            0 => 0,
            _ => *self.key_ends.get(i - 1)? as usize,
        };
        self.keys.get(start..*self.key_ends.get(i)? as usize)
    }

    /// Op `i`: its kind, key and value (empty for kinds without one).
    pub fn op(&self, i: usize) -> Option<(OpKind, &[u8], &[u8])> {
        let start = match i {
            0 => 0,
            _ => *self.value_ends.get(i - 1)? as usize,
        };
        let value = self.values.get(start..*self.value_ends.get(i)? as usize)?;
        Some((*self.kinds.get(i)?, self.key(i)?, value))
    }

    /// Appends a get.
    pub fn push_get(&mut self, key: &[u8]) {
        self.push(OpKind::Get, key, &[]);
    }

    /// Appends a put.
    pub fn push_put(&mut self, key: &[u8], value: &[u8]) {
        self.push(OpKind::Put, key, value);
    }

    /// Appends a delete.
    pub fn push_delete(&mut self, key: &[u8]) {
        self.push(OpKind::Delete, key, &[]);
    }
}

/// What happened to one op, as the server reports it.
#[derive(Archive, Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq)]
#[rkyv(derive(Debug, Clone, Copy, PartialEq, Eq))]
#[repr(u8)]
pub enum OpStatus {
    /// Get found the key; the value follows in the value column.
    Found = 0,
    /// Get did not find the key.
    NotFound = 1,
    /// Put stored the value.
    Stored = 2,
    /// Delete removed an existing key.
    Deleted = 3,
    /// Delete found no such key.
    Absent = 4,
    /// The key's slot belongs to another shard group: the owner's index and the epoch of
    /// its ownership are in the op's value slots. Not run.
    Moved = 5,
    /// The op itself was malformed (bad span); the [`MalformedOp`] code is in its value slot.
    Malformed = 6,
    /// A get found the key, but its value did not fit in the reply (the server bounds a reply
    /// by its frame limit). Ask for it again in a smaller batch; the first value of a reply
    /// always fits.
    TooLarge = 7,
    /// The server had no memory for the op (a put's entry, or a found value's room in the
    /// reply); it was not run.
    OutOfMemory = 8,
    /// A conditional put's condition did not hold (the key was present for `PutIfAbsent`,
    /// absent for `PutIfPresent`); nothing changed.
    NotStored = 9,
    /// An increment stored this sum (an `i64`: its low half in the value offset slot, its
    /// high half in the value length slot).
    Counted = 10,
    /// An increment found a value that is not a decimal 64-bit integer; nothing changed.
    NotAnInteger = 11,
    /// An increment's sum would overflow 64 bits; nothing changed.
    Overflow = 12,
    /// Not run: the atomic batch it belongs to did not run (a watched key changed, or
    /// another of its ops could not run).
    Aborted = 13,
    /// Not run: the key's slot is being handed over to another group (Redis's `-TRYAGAIN`);
    /// send it again shortly (it will then run, or be answered `Moved`).
    TryAgain = 14,
}

/// Why an op in a received batch is malformed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u32)]
pub enum MalformedOp {
    /// The op index is past the end of a column.
    IndexOutOfRange = 0,
    /// The key's end offsets do not describe a span of the key column.
    KeySpan = 1,
    /// The value's end offsets do not describe a span of the value column.
    ValueSpan = 2,
    /// An increment's value is not 8 bytes (a little-endian `i64`, or a finite `f64`).
    BadIncrement = 3,
    /// A range write's value is shorter than its 8-byte offset, or a range write or an
    /// append would make a value longer than [`MAX_STRING`] (or the node's `--max-frame`).
    BadRange = 4,
    /// An expiry op's arguments do not parse (see [`crate::expiry`]).
    BadExpiry = 5,
    /// A clock op from a client: only a log entry carries one.
    LogOnly = 6,
    /// A `Unchanged` check outside an atomic batch.
    NotAtomic = 7,
    /// A node-wide op (scan, key count, flush) in a batch with other ops.
    NotAlone = 8,
    /// A scan's request or a rename's target does not parse, or names a map shard the
    /// node does not have.
    BadKeyspace = 9,
}

impl MalformedOp {
    /// The reason, for people.
    pub fn as_str(self) -> &'static str {
        match self {
            MalformedOp::IndexOutOfRange => "op index out of range",
            MalformedOp::KeySpan => "key span out of bounds",
            MalformedOp::ValueSpan => "value span out of bounds",
            MalformedOp::BadIncrement => "an increment's value is not 8 bytes",
            MalformedOp::BadRange => {
                "a range write lacks its 8-byte offset, or a range write or append reaches past the longest value (512 MiB, or the node's --max-frame)"
            }
            MalformedOp::BadExpiry => "an expiry op's arguments do not parse",
            MalformedOp::LogOnly => "a clock op is carried only by a log entry",
            MalformedOp::NotAtomic => "a watch check or rename outside an atomic batch",
            MalformedOp::NotAlone => "a node-wide op (scan, key count, flush) must be alone in its batch",
            MalformedOp::BadKeyspace => {
                "a scan's cursor or pattern, or a rename's target, is bad (does not parse, or another node's key)"
            }
        }
    }

    fn from_code(code: u32) -> Option<MalformedOp> {
        [
            MalformedOp::IndexOutOfRange,
            MalformedOp::KeySpan,
            MalformedOp::ValueSpan,
            MalformedOp::BadIncrement,
            MalformedOp::BadRange,
            MalformedOp::BadExpiry,
            MalformedOp::LogOnly,
            MalformedOp::NotAtomic,
            MalformedOp::NotAlone,
            MalformedOp::BadKeyspace,
        ]
        .into_iter()
        .find(|m| *m as u32 == code)
    }
}

impl std::fmt::Display for MalformedOp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Bytes a response needs besides its values: the archive's root and column padding.
const RESPONSE_OVERHEAD: usize = 64;
/// Bytes a response needs per op besides its value: status, value offset, value length.
const RESPONSE_BYTES_PER_OP: usize = 9;

/// One result per op of a batch, in op order, built in place and reused by the server.
///
/// Every op costs the same nine bytes whatever happened to it: an error's detail (the owner
/// of a wrong-shard key, a malformed op's reason) rides in the op's value offset and length
/// slots, which only a found value needs. So a reply is never larger than its request
/// plus the values it returns, and a request full of bad ops cannot make a huge reply.
#[derive(Archive, Serialize, Default, Debug, Clone)]
pub struct BatchResponse {
    status: Vec<OpStatus>,
    value_offsets: Vec<u32>,
    value_lens: Vec<u32>,
    values: Vec<u8>,
}

impl BatchResponse {
    /// Prepares for a batch of `n` ops; results may then be set in any order.
    pub fn reset(&mut self, n: usize) {
        self.status.clear();
        self.status.resize(n, OpStatus::NotFound);
        self.value_offsets.clear();
        self.value_offsets.resize(n, 0);
        self.value_lens.clear();
        self.value_lens.resize(n, 0);
        self.values.clear();
    }

    /// Value bytes a reply to `n` ops may carry within `max_reply` encoded bytes.
    pub fn value_room(n: usize, max_reply: usize) -> usize {
        max_reply.saturating_sub(RESPONSE_OVERHEAD + RESPONSE_BYTES_PER_OP * n)
    }

    /// Results in the response.
    pub fn len(&self) -> usize {
        self.status.len()
    }

    /// Heap memory the response holds on to (its capacity), to decide when to free it.
    pub fn heap_bytes(&self) -> usize {
        self.status.capacity()
            + 4 * (self.value_offsets.capacity() + self.value_lens.capacity())
            + self.values.capacity()
    }

    /// Whether the response holds no result.
    pub fn is_empty(&self) -> bool {
        self.status.is_empty()
    }

    /// Sets a status that carries no value or detail.
    pub fn set(&mut self, i: usize, status: OpStatus) {
        self.status[i] = status;
    }

    /// Records a found value for op `i`, or `OutOfMemory` when there is no memory for it.
    /// Returns the status set. (Keeping the reply within a size is the caller's job: see
    /// [`BatchResponse::value_room`] and `OpStatus::TooLarge`.)
    pub fn set_found(&mut self, i: usize, value: &[u8]) -> OpStatus {
        if self.values.try_reserve(value.len()).is_err() {
            self.status[i] = OpStatus::OutOfMemory;
            return OpStatus::OutOfMemory;
        }
        self.status[i] = OpStatus::Found;
        self.value_offsets[i] = self.values.len() as u32;
        self.value_lens[i] = value.len() as u32;
        self.values.extend_from_slice(value);
        OpStatus::Found
    }

    /// Op `i`'s status as set so far.
    pub fn status(&self, i: usize) -> Option<OpStatus> {
        self.status.get(i).copied()
    }

    /// Records that op `i`'s slot `slot` belongs to group `owner` as of `epoch`.
    pub fn set_moved(&mut self, i: usize, slot: u16, owner: u16, epoch: u32) {
        self.status[i] = OpStatus::Moved;
        self.value_offsets[i] = u32::from(slot) << 16 | u32::from(owner);
        self.value_lens[i] = epoch;
    }

    /// Records that increment `i` stored `sum`.
    pub fn set_counted(&mut self, i: usize, sum: i64) {
        let bits = sum as u64;
        self.status[i] = OpStatus::Counted;
        self.value_offsets[i] = bits as u32;
        self.value_lens[i] = (bits >> 32) as u32;
    }

    /// Records that op `i` was malformed, and why.
    pub fn set_malformed(&mut self, i: usize, why: MalformedOp) {
        self.status[i] = OpStatus::Malformed;
        self.value_offsets[i] = why as u32;
    }

    /// Op `i`'s result as set so far: for a front that answers in another protocol (RESP)
    /// and reads the results where they were built, without encoding them first.
    pub fn result(&self, i: usize) -> OpReply<'_> {
        match (self.status.get(i), self.value_offsets.get(i), self.value_lens.get(i)) {
            (Some(&status), Some(&off), Some(&len)) => op_reply(status, off, len, &self.values),
            _ => OpReply::Malformed("result index out of range"),
        }
    }

    /// Value bytes the response holds so far.
    pub fn value_bytes(&self) -> usize {
        self.values.len()
    }

    /// Sets op `i`'s result to result `j` of another response (a durable node's logged ops
    /// come back as a response of their own). A found value goes in only if `admit` lets its
    /// length in; otherwise the op is answered `TooLarge`.
    pub fn copy_result(&mut self, i: usize, from: &ReplyView<'_>, j: usize, admit: impl FnOnce(usize) -> bool) {
        match from.result(j) {
            OpReply::Found(v) if admit(v.len()) => {
                self.set_found(i, v);
            }
            OpReply::Found(_) | OpReply::TooLarge => self.set(i, OpStatus::TooLarge),
            OpReply::NotFound => self.set(i, OpStatus::NotFound),
            OpReply::Stored => self.set(i, OpStatus::Stored),
            OpReply::Deleted => self.set(i, OpStatus::Deleted),
            OpReply::Absent => self.set(i, OpStatus::Absent),
            OpReply::OutOfMemory => self.set(i, OpStatus::OutOfMemory),
            OpReply::NotStored => self.set(i, OpStatus::NotStored),
            OpReply::Counted(sum) => self.set_counted(i, sum),
            OpReply::NotAnInteger => self.set(i, OpStatus::NotAnInteger),
            OpReply::Overflow => self.set(i, OpStatus::Overflow),
            OpReply::Aborted => self.set(i, OpStatus::Aborted),
            OpReply::Moved { slot, owner, epoch } => self.set_moved(i, slot, owner, epoch),
            OpReply::TryAgain => self.set(i, OpStatus::TryAgain),
            OpReply::Malformed(_) => {
                let code = from.archived.value_offsets.get(j).map_or(0, |c| c.to_native());
                self.set_malformed(i, MalformedOp::from_code(code).unwrap_or(MalformedOp::IndexOutOfRange));
            }
        }
    }
}

/// A change to a node's settings at run time (the body of a `ConfigRequest` frame), as
/// Redis's `CONFIG SET maxmemory` and `FLUSHALL`: what a cache benchmark needs between points.
#[derive(Archive, Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq)]
#[rkyv(derive(Debug))]
pub struct ConfigRequest {
    /// The new `--max-memory` in bytes; `Some(0)` removes the cap, `None` leaves it.
    pub max_memory_bytes: Option<u64>,
    /// Remove every key first.
    pub flush: bool,
}

/// Validates and reads a config request body.
pub fn parse_config_request(body: &[u8]) -> Result<ConfigRequest, WireError> {
    let archived = rkyv::access::<ArchivedConfigRequest, rancor::BoxedError>(body).map_err(invalid)?;
    rkyv::deserialize::<ConfigRequest, rancor::BoxedError>(archived).map_err(invalid)
}

/// The kind of failure of a whole request.
#[derive(Archive, Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq)]
#[rkyv(derive(Debug, Clone, Copy, PartialEq, Eq))]
#[repr(u8)]
pub enum ErrorCode {
    /// The frame header was not ours (magic, unknown kind).
    BadFrame = 0,
    /// The peer speaks another protocol version.
    VersionMismatch = 1,
    /// The length prefix exceeded the server's `--max-frame`.
    FrameTooLarge = 2,
    /// The body failed validation.
    MalformedBody = 3,
    /// The server is shutting down and did not run the request.
    ShuttingDown = 4,
    /// The server already serves `--max-conns` connections; this one is closed.
    TooManyConnections = 5,
    /// The server could not find room for the frame (its buffer budget stayed full);
    /// the connection is closed.
    OutOfMemory = 6,
    /// The server requires a token (or, in protected mode, a loopback peer) before any
    /// other request; the connection is closed.
    AuthRequired = 7,
    /// The token presented was wrong; the connection is closed.
    AuthFailed = 8,
    /// The node will not do this request in its mode (e.g. a flush on a durable node); the
    /// message says why and what to do instead. The connection goes on.
    Refused = 9,
    /// The member belongs to another replica group than the client believes (or to none):
    /// nothing ran; another member of the group may serve it.
    WrongGroup = 10,
}

/// Why a whole request failed (the body of an `ErrorResponse` frame).
#[derive(Archive, Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[rkyv(derive(Debug))]
pub struct ErrorReply {
    /// The kind of failure, for programs.
    pub code: ErrorCode,
    /// What went wrong, for people.
    pub message: String,
}

/// A body that failed validation or could not be encoded.
///
/// Its message is stable and safe to send to any peer. The validator's own account, which
/// can name memory addresses, is kept apart in [`WireError::detail`], for debug logs only.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("malformed body: {message}")]
pub struct WireError {
    message: String,
    detail: Option<String>,
}

impl WireError {
    /// An error whose message says it all.
    fn shape(message: impl Into<String>) -> WireError {
        WireError {
            message: message.into(),
            detail: None,
        }
    }

    /// A request that could not be run for a reason on the server's side (for its log).
    pub fn unavailable(reason: &str) -> WireError {
        WireError {
            message: format!("the node could not run the request: {reason}"),
            detail: None,
        }
    }

    /// What the validator or serializer said, for a debug log (never for a peer).
    pub fn detail(&self) -> &str {
        self.detail.as_deref().unwrap_or(&self.message)
    }
}

fn invalid(e: rancor::BoxedError) -> WireError {
    WireError {
        message: "the bytes are not a valid archive of the expected type".into(),
        detail: Some(e.to_string()),
    }
}

fn unencodable(e: rancor::BoxedError) -> WireError {
    WireError {
        message: "the value could not be encoded".into(),
        detail: Some(e.to_string()),
    }
}

/// Serialises `value` as one whole frame (header and body) into `out`, reusing its memory.
///
/// The body starts 16 bytes in, so it stays 16-byte aligned inside `out`.
pub fn encode_frame<T>(kind: FrameKind, id: u64, value: &T, out: &mut AlignedVec) -> Result<(), WireError>
where
    T: for<'a> rkyv::Serialize<
            rkyv::api::high::HighSerializer<AlignedVec, rkyv::ser::allocator::ArenaHandle<'a>, rancor::BoxedError>,
        >,
{
    let mut buf = std::mem::take(out);
    buf.clear();
    buf.extend_from_slice(&[0u8; HEADER_LEN]);
    let mut buf = rkyv::api::high::to_bytes_in::<_, rancor::BoxedError>(value, buf).map_err(unencodable)?;
    let header = header_for(kind, id, buf.len())?;
    buf.as_mut_slice()[..HEADER_LEN].copy_from_slice(&header);
    *out = buf;
    Ok(())
}

/// Writes one whole frame into `out` (cleared first) whose body `body` appends in place, in
/// whatever encoding the frame kind carries (the members' raft messages are postcard): no
/// body buffer to copy from.
pub fn encode_frame_with(
    kind: FrameKind,
    id: u64,
    out: &mut AlignedVec,
    body: impl FnOnce(&mut AlignedVec) -> Result<(), String>,
) -> Result<(), WireError> {
    out.clear();
    out.extend_from_slice(&[0u8; HEADER_LEN]);
    body(out).map_err(|why| WireError::shape(format!("the body could not be encoded: {why}")))?;
    let header = header_for(kind, id, out.len())?;
    out.as_mut_slice()[..HEADER_LEN].copy_from_slice(&header);
    Ok(())
}

/// The header of a frame of `frame_len` bytes (header included), refusing a body over the
/// frame limit.
fn header_for(kind: FrameKind, id: u64, frame_len: usize) -> Result<[u8; HEADER_LEN], WireError> {
    let body = frame_len.saturating_sub(HEADER_LEN);
    let len = u32::try_from(body)
        .ok()
        .filter(|&len| len <= MAX_FRAME_LIMIT)
        .ok_or_else(|| WireError::shape(format!("a body of {body} bytes is over the frame limit")))?;
    Ok(FrameHeader { kind, len, id }.encode())
}

/// Serialises `value` as a frame body alone (no header) into `out`, reusing its memory: a
/// body to keep, log or validate without sending it (a log entry, a batch a RESP pipeline
/// runs through the same validated view as a received frame).
pub fn encode_body<T>(value: &T, out: &mut AlignedVec) -> Result<(), WireError>
where
    T: for<'a> rkyv::Serialize<
            rkyv::api::high::HighSerializer<AlignedVec, rkyv::ser::allocator::ArenaHandle<'a>, rancor::BoxedError>,
        >,
{
    let mut buf = std::mem::take(out);
    buf.clear();
    let buf = rkyv::api::high::to_bytes_in::<_, rancor::BoxedError>(value, buf).map_err(unencodable)?;
    if buf.len() > MAX_FRAME_LIMIT as usize {
        return Err(WireError::shape(format!(
            "a body of {} bytes is over the frame limit",
            buf.len()
        )));
    }
    *out = buf;
    Ok(())
}

/// Encodes a frame with an empty body (e.g. a stats request).
pub fn encode_empty_frame(kind: FrameKind, id: u64, out: &mut AlignedVec) {
    out.clear();
    out.extend_from_slice(&FrameHeader { kind, len: 0, id }.encode());
}

/// One op read out of a received batch, borrowing the frame's bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OpRef<'a> {
    /// The op.
    pub kind: OpKind,
    /// Its key, in place in the frame.
    pub key: &'a [u8],
    /// Its value (empty unless a put), in place in the frame.
    pub value: &'a [u8],
}

/// A validated, received batch request. Borrowing the frame, it reads ops in place.
pub struct BatchView<'a> {
    archived: &'a ArchivedBatchRequest,
    body: &'a [u8],
}

impl<'a> BatchView<'a> {
    /// Validates `body` (exactly one frame's body, aligned) as a batch request.
    pub fn parse(body: &'a [u8]) -> Result<BatchView<'a>, WireError> {
        let archived = rkyv::access::<ArchivedBatchRequest, rancor::BoxedError>(body).map_err(invalid)?;
        let n = archived.kinds.len();
        if archived.key_ends.len() != n || archived.value_ends.len() != n {
            return Err(WireError::shape(format!(
                "column lengths differ: {} kinds, {} key ends, {} value ends",
                n,
                archived.key_ends.len(),
                archived.value_ends.len()
            )));
        }
        Ok(BatchView { archived, body })
    }

    /// The frame body it was parsed from (to keep a copy of the batch for later).
    pub fn body(&self) -> &'a [u8] {
        self.body
    }

    /// Ops in the batch.
    pub fn len(&self) -> usize {
        self.archived.kinds.len()
    }

    /// Whether the batch holds no op.
    pub fn is_empty(&self) -> bool {
        self.archived.kinds.is_empty()
    }

    /// Whether the batch holds an `Atomic` op: it runs as one (a transaction).
    pub fn is_atomic(&self) -> bool {
        self.archived.kinds.contains(&ArchivedOpKind::Atomic)
    }

    /// Whether the batch holds an op of `kind` (a scan of the kinds column only).
    #[inline]
    pub fn contains(&self, kind: OpKind) -> bool {
        self.archived.kinds.iter().any(|k| OpKind::from(k) == kind)
    }

    /// Op `i`, with its key and value spans bounds-checked.
    pub fn op(&self, i: usize) -> Result<OpRef<'a>, MalformedOp> {
        let a = self.archived;
        let kind = a.kinds.get(i).ok_or(MalformedOp::IndexOutOfRange)?.into();
        let key = span(&a.key_ends, &a.keys, i).ok_or(MalformedOp::KeySpan)?;
        let value = span(&a.value_ends, &a.values, i).ok_or(MalformedOp::ValueSpan)?;
        Ok(OpRef { kind, key, value })
    }
}

/// The `i`th span of a column described by end offsets; `None` if the offsets are bad.
fn span<'a>(ends: &'a [rkyv::rend::u32_le], bytes: &'a [u8], i: usize) -> Option<&'a [u8]> {
    let start = match i {
        0 => 0,
        _ => ends.get(i - 1)?.to_native() as usize,
    };
    let end = ends.get(i)?.to_native() as usize;
    bytes.get(start..end)
}

/// One op's result as the client sees it, borrowing the response frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OpReply<'a> {
    /// A get found this value.
    Found(&'a [u8]),
    /// A get found nothing.
    NotFound,
    /// A put was stored.
    Stored,
    /// A delete removed the key.
    Deleted,
    /// A delete found no such key.
    Absent,
    /// The key's slot `slot` belongs to group `owner` as of `epoch`; not run.
    #[allow(missing_docs)]
    Moved { slot: u16, owner: u16, epoch: u32 },
    /// The key's slot is being handed over; not run: send it again shortly.
    TryAgain,
    /// The op was malformed, for this reason.
    Malformed(&'a str),
    /// The value was found but did not fit in this reply; ask again in a smaller batch.
    TooLarge,
    /// The server had no memory for the op; it was not run.
    OutOfMemory,
    /// A conditional put's condition did not hold; nothing changed.
    NotStored,
    /// An increment stored this sum.
    Counted(i64),
    /// An increment found a value that is not a decimal 64-bit integer; nothing changed.
    NotAnInteger,
    /// An increment's sum would overflow; nothing changed.
    Overflow,
    /// Not run: its atomic batch did not run.
    Aborted,
}

/// A validated batch response.
pub struct ReplyView<'a> {
    archived: &'a ArchivedBatchResponse,
}

impl<'a> ReplyView<'a> {
    /// Validates `body` (exactly one frame's body, aligned) as a batch response.
    pub fn parse(body: &'a [u8]) -> Result<ReplyView<'a>, WireError> {
        let archived = rkyv::access::<ArchivedBatchResponse, rancor::BoxedError>(body).map_err(invalid)?;
        let n = archived.status.len();
        if archived.value_offsets.len() != n || archived.value_lens.len() != n {
            return Err(WireError::shape("response column lengths differ"));
        }
        Ok(ReplyView { archived })
    }

    /// Results in the response.
    pub fn len(&self) -> usize {
        self.archived.status.len()
    }

    /// Whether the response holds no result.
    pub fn is_empty(&self) -> bool {
        self.archived.status.is_empty()
    }

    /// The status of op `i` alone, without looking at values (the cheap path for benchmarks).
    pub fn status(&self, i: usize) -> Option<OpStatus> {
        Some(match self.archived.status.get(i)? {
            ArchivedOpStatus::Found => OpStatus::Found,
            ArchivedOpStatus::NotFound => OpStatus::NotFound,
            ArchivedOpStatus::Stored => OpStatus::Stored,
            ArchivedOpStatus::Deleted => OpStatus::Deleted,
            ArchivedOpStatus::Absent => OpStatus::Absent,
            ArchivedOpStatus::Moved => OpStatus::Moved,
            ArchivedOpStatus::Malformed => OpStatus::Malformed,
            ArchivedOpStatus::TooLarge => OpStatus::TooLarge,
            ArchivedOpStatus::OutOfMemory => OpStatus::OutOfMemory,
            ArchivedOpStatus::NotStored => OpStatus::NotStored,
            ArchivedOpStatus::Counted => OpStatus::Counted,
            ArchivedOpStatus::NotAnInteger => OpStatus::NotAnInteger,
            ArchivedOpStatus::Overflow => OpStatus::Overflow,
            ArchivedOpStatus::Aborted => OpStatus::Aborted,
            ArchivedOpStatus::TryAgain => OpStatus::TryAgain,
        })
    }

    /// The full result of op `i`; bad spans from the server become `Malformed`.
    pub fn result(&self, i: usize) -> OpReply<'a> {
        let a = self.archived;
        match (self.status(i), a.value_offsets.get(i), a.value_lens.get(i)) {
            (Some(status), Some(off), Some(len)) => op_reply(status, off.to_native(), len.to_native(), &a.values),
            _ => OpReply::Malformed("result index out of range"),
        }
    }
}

/// One op's result from its status and its value slots (a found value's span in `values`,
/// or an error's detail), the same for a received reply and one being built.
fn op_reply(status: OpStatus, off: u32, len: u32, values: &[u8]) -> OpReply<'_> {
    match status {
        OpStatus::Found => {
            let start = off as usize;
            match start.checked_add(len as usize).and_then(|end| values.get(start..end)) {
                Some(v) => OpReply::Found(v),
                None => OpReply::Malformed("value span out of bounds"),
            }
        }
        OpStatus::NotFound => OpReply::NotFound,
        OpStatus::Stored => OpReply::Stored,
        OpStatus::Deleted => OpReply::Deleted,
        OpStatus::Absent => OpReply::Absent,
        OpStatus::Moved => OpReply::Moved {
            slot: (off >> 16) as u16,
            owner: off as u16,
            epoch: len,
        },
        OpStatus::Malformed => {
            OpReply::Malformed(MalformedOp::from_code(off).map_or("malformed op", MalformedOp::as_str))
        }
        OpStatus::TooLarge => OpReply::TooLarge,
        OpStatus::OutOfMemory => OpReply::OutOfMemory,
        OpStatus::NotStored => OpReply::NotStored,
        OpStatus::Counted => OpReply::Counted((u64::from(len) << 32 | u64::from(off)) as i64),
        OpStatus::NotAnInteger => OpReply::NotAnInteger,
        OpStatus::Overflow => OpReply::Overflow,
        OpStatus::Aborted => OpReply::Aborted,
        OpStatus::TryAgain => OpReply::TryAgain,
    }
}

/// Validates and reads a stats reply body.
pub fn decode_stats(body: &[u8]) -> Result<NodeStats, WireError> {
    let archived = rkyv::access::<ArchivedNodeStats, rancor::BoxedError>(body).map_err(invalid)?;
    rkyv::deserialize::<NodeStats, rancor::BoxedError>(archived).map_err(invalid)
}

/// Validates and reads an error reply body.
pub fn parse_error_reply(body: &[u8]) -> Result<ErrorReply, WireError> {
    let archived = rkyv::access::<ArchivedErrorReply, rancor::BoxedError>(body).map_err(invalid)?;
    let code = match archived.code {
        ArchivedErrorCode::BadFrame => ErrorCode::BadFrame,
        ArchivedErrorCode::VersionMismatch => ErrorCode::VersionMismatch,
        ArchivedErrorCode::FrameTooLarge => ErrorCode::FrameTooLarge,
        ArchivedErrorCode::MalformedBody => ErrorCode::MalformedBody,
        ArchivedErrorCode::ShuttingDown => ErrorCode::ShuttingDown,
        ArchivedErrorCode::TooManyConnections => ErrorCode::TooManyConnections,
        ArchivedErrorCode::OutOfMemory => ErrorCode::OutOfMemory,
        ArchivedErrorCode::AuthRequired => ErrorCode::AuthRequired,
        ArchivedErrorCode::AuthFailed => ErrorCode::AuthFailed,
        ArchivedErrorCode::Refused => ErrorCode::Refused,
        ArchivedErrorCode::WrongGroup => ErrorCode::WrongGroup,
    };
    Ok(ErrorReply {
        code,
        message: archived.message.as_str().to_owned(),
    })
}

/// The batch layout of frame version 19, kept to read what was written in it after the
/// protocol moves on: kvd's log before it had an entry format of its own stored batches so
/// (kvd's `durable::legacy` converts them). Only read, never written.
pub mod v19 {
    use rkyv::{Archive, Serialize};

    use super::{WireError, invalid};

    /// `BatchRequest` as frame version 19 laid it out, its kinds as bytes. (Only its archived
    /// form is read; the type itself is never built.)
    #[derive(Archive, Serialize)]
    #[allow(dead_code)]
    struct BatchRequestV19 {
        kinds: Vec<u8>,
        key_ends: Vec<u32>,
        keys: Vec<u8>,
        value_ends: Vec<u32>,
        values: Vec<u8>,
    }

    /// One op of a version-19 batch: its kind byte (that version's numbers), key and value.
    #[derive(Debug, Clone, PartialEq, Eq)]
    pub struct OpV19 {
        /// The kind byte, as version 19 numbered kinds.
        pub kind: u8,
        /// The key.
        pub key: Vec<u8>,
        /// The value (an op's arguments for ops that take some).
        pub value: Vec<u8>,
    }

    /// The ops of a version-19 batch body, validated (every span checked, nothing indexed
    /// unchecked). Only the upgrade of an old log reads these, so they are copied out.
    pub fn batch_ops(body: &[u8]) -> Result<Vec<OpV19>, WireError> {
        let mut aligned = rkyv::util::AlignedVec::<16>::with_capacity(body.len());
        aligned.extend_from_slice(body);
        let a = rkyv::access::<ArchivedBatchRequestV19, rkyv::rancor::BoxedError>(&aligned).map_err(invalid)?;
        let n = a.kinds.len();
        if a.key_ends.len() != n || a.value_ends.len() != n {
            return Err(WireError::shape("a version-19 batch's columns differ in length"));
        }
        let mut ops = Vec::with_capacity(n);
        let (mut key_start, mut value_start) = (0usize, 0usize);
        for ((kind, key_end), value_end) in a.kinds.iter().zip(a.key_ends.iter()).zip(a.value_ends.iter()) {
            let (key_end, value_end) = (key_end.to_native() as usize, value_end.to_native() as usize);
            let key = a
                .keys
                .get(key_start..key_end)
                .ok_or_else(|| WireError::shape("a version-19 key span"))?;
            let value = a
                .values
                .get(value_start..value_end)
                .ok_or_else(|| WireError::shape("a version-19 value span"))?;
            ops.push(OpV19 {
                kind: *kind,
                key: key.to_vec(),
                value: value.to_vec(),
            });
            (key_start, value_start) = (key_end, value_end);
        }
        Ok(ops)
    }
}

#[cfg(test)]
mod tests {
    /// `INCRBYFLOAT`'s sums as Redis writes them: no exponent, at most 17 decimals (a tiny
    /// sum is `0`, not 325 characters), the shortest text otherwise.
    #[test]
    fn float_sums_are_written_as_redis_writes_them() {
        use super::float_text;
        assert_eq!(float_text(1e-320), "0");
        assert_eq!(float_text(-1e-320), "0");
        assert_eq!(float_text(1.1), "1.1");
        assert_eq!(float_text(3.0), "3");
        assert_eq!(float_text(-2.5), "-2.5");
        assert_eq!(float_text(1.234567890123e-10), "0.00000000012345679");
        assert_eq!(float_text(1e20), "100000000000000000000");
    }

    /// `OpKind::ALL` holds every kind at its byte (the match fails to compile when a kind
    /// is added, so the list is kept whole).
    #[test]
    fn all_kinds_are_listed_in_byte_order() {
        for (i, k) in OpKind::ALL.iter().enumerate() {
            assert_eq!(*k as usize, i);
            match k {
                OpKind::Get
                | OpKind::Put
                | OpKind::Delete
                | OpKind::PutIfAbsent
                | OpKind::PutIfPresent
                | OpKind::IncrBy
                | OpKind::Append
                | OpKind::SetRange
                | OpKind::PutWith
                | OpKind::Expire
                | OpKind::Ttl
                | OpKind::Expired
                | OpKind::Clock
                | OpKind::Atomic
                | OpKind::Unchanged
                | OpKind::IncrByFloat
                | OpKind::Scan
                | OpKind::KeyCount
                | OpKind::Flush
                | OpKind::Rename
                | OpKind::SlotSet
                | OpKind::SlotScan
                | OpKind::Load
                | OpKind::SlotMap
                | OpKind::SlotLoad
                | OpKind::SlotTrack => {}
            }
        }
    }
    use super::*;

    #[test]
    fn node_wide_kinds_agree() {
        for kind in OpKind::ALL {
            assert_eq!(kind.is_node_wide(), kind.node_wide().is_some(), "{kind:?}");
        }
    }

    /// A slot copy's tracking is the leader's: a batch holding it goes to the leader even
    /// when a client spreads reads over followers, and a follower refuses it.
    #[test]
    fn only_reads_a_follower_may_serve_make_a_reads_only_batch() {
        assert!(OpKind::Get.follower_may_serve() && OpKind::SlotScan.follower_may_serve());
        assert!(!OpKind::SlotTrack.follower_may_serve() && !OpKind::Put.follower_may_serve());
        let mut b = BatchRequest::new();
        b.push_get(b"k");
        assert!(b.reads_only());
        b.push(OpKind::SlotTrack, b"", &[]);
        assert!(!b.reads_only());
    }

    /// A frame whose body is written in place has the header of one whose body was
    /// copied in, and a body past the frame limit or one that fails to encode is refused.
    #[test]
    fn a_body_written_in_place_gets_its_header() {
        let mut frame = AlignedVec::new();
        frame.extend_from_slice(b"old bytes, cleared first");
        encode_frame_with(FrameKind::RaftRequest, 7, &mut frame, |b| {
            b.extend_from_slice(b"hello");
            Ok(())
        })
        .unwrap();
        let head: [u8; HEADER_LEN] = frame[..HEADER_LEN].try_into().unwrap();
        let header = FrameHeader::decode(&head, MAX_FRAME_LIMIT).unwrap();
        assert_eq!((header.kind, header.len, header.id), (FrameKind::RaftRequest, 5, 7));
        assert_eq!(&frame[HEADER_LEN..], b"hello");
        let failed = encode_frame_with(FrameKind::RaftRequest, 8, &mut frame, |_| Err("no".into()));
        assert!(failed.unwrap_err().to_string().contains("could not be encoded: no"));
        let over = header_for(FrameKind::RaftRequest, 9, HEADER_LEN + MAX_FRAME_LIMIT as usize + 1);
        assert!(over.unwrap_err().to_string().contains("over the frame limit"));
        assert!(header_for(FrameKind::RaftRequest, 9, HEADER_LEN + MAX_FRAME_LIMIT as usize).is_ok());
    }

    #[test]
    fn decimal_i64_reads_what_redis_reads() {
        for (text, want) in [
            (&b"0"[..], Some(0)),
            (b"-7", Some(-7)),
            (b"9223372036854775807", Some(i64::MAX)),
            (b"-9223372036854775808", Some(i64::MIN)),
            (b"9223372036854775808", None),
            (b"007", None),
            (b"-0", None),
            (b"+1", None),
            (b" 1", None),
            (b"", None),
            (b"1.5", None),
        ] {
            assert_eq!(decimal_i64(text), want, "{:?}", String::from_utf8_lossy(text));
        }
    }

    proptest::proptest! {
        #[test]
        fn decimal_i64_reads_back_every_i64(n in proptest::prelude::any::<i64>()) {
            proptest::prop_assert_eq!(decimal_i64(n.to_string().as_bytes()), Some(n));
        }
    }

    fn body_of(frame: &AlignedVec) -> AlignedVec {
        let mut body: AlignedVec = AlignedVec::new();
        body.extend_from_slice(&frame[HEADER_LEN..]);
        body
    }

    #[test]
    fn batch_round_trips_through_a_frame() {
        let mut req = BatchRequest::new();
        req.push_get(b"k1");
        req.push_put(b"k2", b"value two");
        req.push_delete(b"");
        req.push(OpKind::Get, b"123", b"ignored");
        assert_eq!(req.op(1), Some((OpKind::Put, &b"k2"[..], &b"value two"[..])));
        assert_eq!(req.op(3), Some((OpKind::Get, &b"123"[..], &b""[..])));
        assert_eq!(req.op(4), None);
        let mut frame = AlignedVec::new();
        encode_frame(FrameKind::BatchRequest, 42, &req, &mut frame).unwrap();
        let header: [u8; HEADER_LEN] = frame[..HEADER_LEN].try_into().unwrap();
        let h = FrameHeader::decode(&header, u32::MAX).unwrap();
        assert_eq!(
            (h.kind, h.id, h.len as usize),
            (FrameKind::BatchRequest, 42, frame.len() - HEADER_LEN)
        );

        let body = body_of(&frame);
        let view = BatchView::parse(&body).unwrap();
        assert_eq!(view.len(), 4);
        let ops: Vec<_> = (0..4).map(|i| view.op(i).unwrap()).collect();
        assert_eq!(
            ops[0],
            OpRef {
                kind: OpKind::Get,
                key: b"k1",
                value: b""
            }
        );
        assert_eq!(
            ops[1],
            OpRef {
                kind: OpKind::Put,
                key: b"k2",
                value: b"value two"
            }
        );
        assert_eq!(
            ops[2],
            OpRef {
                kind: OpKind::Delete,
                key: b"",
                value: b""
            }
        );
        assert_eq!(ops[3].key, b"123");
        assert!(view.op(4).is_err());
    }

    #[test]
    fn response_round_trips_in_any_fill_order() {
        let mut resp = BatchResponse::default();
        resp.reset(5);
        resp.set_found(3, b"three");
        resp.set_found(0, b"zero");
        resp.set(1, OpStatus::Stored);
        resp.set_moved(2, 77, 1, 3);
        resp.set_malformed(4, MalformedOp::KeySpan);
        let mut frame = AlignedVec::new();
        encode_frame(FrameKind::BatchResponse, 1, &resp, &mut frame).unwrap();
        let body = body_of(&frame);
        let view = ReplyView::parse(&body).unwrap();
        assert_eq!(view.result(0), OpReply::Found(b"zero"));
        assert_eq!(view.result(1), OpReply::Stored);
        assert_eq!(
            view.result(2),
            OpReply::Moved {
                slot: 77,
                owner: 1,
                epoch: 3
            }
        );
        assert_eq!(view.result(3), OpReply::Found(b"three"));
        assert_eq!(view.result(4), OpReply::Malformed("key span out of bounds"));
        assert!(matches!(view.result(5), OpReply::Malformed(_)));
    }

    /// 200,000 failed ops in one reply: each found by its index (a linear search per op
    /// made this quadratic: minutes for a million).
    #[test]
    fn many_failed_ops_in_one_reply_are_each_found() {
        let n = 200_000;
        let mut resp = BatchResponse::default();
        resp.reset(n);
        for i in 0..n {
            if i % 2 == 0 {
                resp.set_moved(i, i as u16, (i % 7) as u16, 9);
            } else {
                resp.set_malformed(i, MalformedOp::KeySpan);
            }
        }
        let mut frame = AlignedVec::new();
        encode_frame(FrameKind::BatchResponse, 1, &resp, &mut frame).unwrap();
        let body = body_of(&frame);
        let view = ReplyView::parse(&body).unwrap();
        for i in 0..n {
            let expected = if i % 2 == 0 {
                OpReply::Moved {
                    slot: i as u16,
                    owner: (i % 7) as u16,
                    epoch: 9,
                }
            } else {
                OpReply::Malformed("key span out of bounds")
            };
            assert_eq!(view.result(i), expected);
        }
    }

    #[test]
    fn garbage_is_an_error_not_a_panic() {
        let mut body: AlignedVec = AlignedVec::new();
        body.extend_from_slice(&[0xff; 64]);
        assert!(BatchView::parse(&body).is_err());
        assert!(ReplyView::parse(&body).is_err());
        assert!(parse_error_reply(&body).is_err());
        assert!(BatchView::parse(&[]).is_err());
    }
}
