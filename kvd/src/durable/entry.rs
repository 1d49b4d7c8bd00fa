//! The log's own entry format: what a logged batch means, defined here and versioned on its
//! own, independent of the client protocol.
//!
//! A raft entry's data ([`LogPayload`], openraft's `D`) is bytes in this format. The leader
//! converts a client's batch into it once, before proposing ([`encode_batch`]); every member
//! applies it and every replay reads it through [`LogPayload::batches`], whose views the
//! store runs as it runs a client's batch (`store::Ops`). A change of the client protocol
//! changes nothing here; a change here bumps [`ENTRY_FORMAT`] and keeps a reader for the
//! formats before it (`durable::legacy` reads the log of the builds before this one).
//!
//! Format 1, all integers little-endian:
//!
//! ```text
//! [format u8 = 1][batches u32]
//! per batch: [ops u32][kind u8 x ops][key length u32 x ops][value length u32 x ops][keys][values]
//! ```
//!
//! An op's kind is the log's own number ([`LogKind`]); its key and value are bytes, the value
//! of an op with arguments in the encoding `kvshared` gives them (`expiry::PutWith`,
//! `expiry::Expire`, `slots::SlotChange`, `slot_copy::encode_load`, `keyspace::Rename`, a
//! watched value, a count or offset as 8 bytes): the golden bytes of `kvd/tests/compat.rs`
//! hold those encodings too, so changing one is a new format, on purpose. A batch's first op
//! is its leader's clock (`Clock`, Unix ms): what every member applying it calls "now".
//!
//! A payload is checked whole when it is decoded (from a log segment or a peer's message):
//! every length within the payload, every kind known, nothing after the last batch. What does
//! not decode is an error naming what is wrong, never a batch applied as nothing.

use kvshared::wire::{MalformedOp, OpKind, OpRef};
use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::store::Ops;

/// The entry format this kvd writes.
pub const ENTRY_FORMAT: u8 = 1;

/// Most ops in one logged batch (a client's batch is bounded by `--max-frame` first).
const MAX_OPS: u32 = 1 << 24;

/// The kinds of op a log entry carries, by the log's own numbers (format 1). The client
/// protocol's numbers are mapped to these once, when the leader logs a batch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum LogKind {
    Get = 0,
    Put = 1,
    Delete = 2,
    PutIfAbsent = 3,
    PutIfPresent = 4,
    IncrBy = 5,
    Append = 6,
    SetRange = 7,
    PutWith = 8,
    Expire = 9,
    Ttl = 10,
    Expired = 11,
    Clock = 12,
    Atomic = 13,
    Unchanged = 14,
    IncrByFloat = 15,
    Flush = 18,
    Rename = 19,
    SlotSet = 20,
    Load = 22,
}

impl LogKind {
    /// The log's kind of a client's op; `None` for an op that is never logged (a node-wide
    /// read: a scan, a count, a slot copy's pages, the slot map or load, a tracking step).
    pub fn of(kind: OpKind) -> Option<LogKind> {
        Some(match kind {
            OpKind::Get => LogKind::Get,
            OpKind::Put => LogKind::Put,
            OpKind::Delete => LogKind::Delete,
            OpKind::PutIfAbsent => LogKind::PutIfAbsent,
            OpKind::PutIfPresent => LogKind::PutIfPresent,
            OpKind::IncrBy => LogKind::IncrBy,
            OpKind::Append => LogKind::Append,
            OpKind::SetRange => LogKind::SetRange,
            OpKind::PutWith => LogKind::PutWith,
            OpKind::Expire => LogKind::Expire,
            OpKind::Ttl => LogKind::Ttl,
            OpKind::Expired => LogKind::Expired,
            OpKind::Clock => LogKind::Clock,
            OpKind::Atomic => LogKind::Atomic,
            OpKind::Unchanged => LogKind::Unchanged,
            OpKind::IncrByFloat => LogKind::IncrByFloat,
            OpKind::Flush => LogKind::Flush,
            OpKind::Rename => LogKind::Rename,
            OpKind::SlotSet => LogKind::SlotSet,
            OpKind::Load => LogKind::Load,
            OpKind::Scan
            | OpKind::KeyCount
            | OpKind::SlotScan
            | OpKind::SlotMap
            | OpKind::SlotLoad
            | OpKind::SlotTrack => return None,
        })
    }

    /// The op the store runs for this kind.
    pub fn op(self) -> OpKind {
        match self {
            LogKind::Get => OpKind::Get,
            LogKind::Put => OpKind::Put,
            LogKind::Delete => OpKind::Delete,
            LogKind::PutIfAbsent => OpKind::PutIfAbsent,
            LogKind::PutIfPresent => OpKind::PutIfPresent,
            LogKind::IncrBy => OpKind::IncrBy,
            LogKind::Append => OpKind::Append,
            LogKind::SetRange => OpKind::SetRange,
            LogKind::PutWith => OpKind::PutWith,
            LogKind::Expire => OpKind::Expire,
            LogKind::Ttl => OpKind::Ttl,
            LogKind::Expired => OpKind::Expired,
            LogKind::Clock => OpKind::Clock,
            LogKind::Atomic => OpKind::Atomic,
            LogKind::Unchanged => OpKind::Unchanged,
            LogKind::IncrByFloat => OpKind::IncrByFloat,
            LogKind::Flush => OpKind::Flush,
            LogKind::Rename => OpKind::Rename,
            LogKind::SlotSet => OpKind::SlotSet,
            LogKind::Load => OpKind::Load,
        }
    }

    /// The kind of a logged byte; `None` for a byte format 1 does not define.
    pub fn from_byte(byte: u8) -> Option<LogKind> {
        const ALL: [LogKind; 20] = [
            LogKind::Get,
            LogKind::Put,
            LogKind::Delete,
            LogKind::PutIfAbsent,
            LogKind::PutIfPresent,
            LogKind::IncrBy,
            LogKind::Append,
            LogKind::SetRange,
            LogKind::PutWith,
            LogKind::Expire,
            LogKind::Ttl,
            LogKind::Expired,
            LogKind::Clock,
            LogKind::Atomic,
            LogKind::Unchanged,
            LogKind::IncrByFloat,
            LogKind::Flush,
            LogKind::Rename,
            LogKind::SlotSet,
            LogKind::Load,
        ];
        ALL.into_iter().find(|k| *k as u8 == byte)
    }
}

/// Why a payload or a batch could not be read or written.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EntryError {
    /// Written in a format this kvd does not read.
    #[error("entry format {0}; this kvd reads format {ENTRY_FORMAT}: run a kvd of the release that wrote it")]
    Format(u8),
    /// The payload ends before what its lengths say.
    #[error("the entry is cut short: {0}")]
    Short(&'static str),
    /// A batch holds an op kind the format does not define.
    #[error("batch {batch}, op {op}: kind {kind} is not an op of entry format {ENTRY_FORMAT}")]
    Kind {
        /// Which batch.
        batch: u32,
        /// Which op of it.
        op: u32,
        /// The byte found.
        kind: u8,
    },
    /// Bytes after the last batch.
    #[error("{0} bytes after the entry's last batch")]
    Trailing(usize),
    /// A batch too large to log (more ops or bytes than a length holds).
    #[error("a batch too large to log: {0}")]
    TooLarge(String),
    /// An op that is never logged (a node-wide read).
    #[error("a {0:?} op is not logged")]
    NotLogged(OpKind),
}

/// One batch in the log's format: `ops` as (kind, key, value), in order. Fails for an op
/// that is never logged, or a batch past what its lengths can say.
pub fn encode_batch<'a>(ops: impl Iterator<Item = (OpKind, &'a [u8], &'a [u8])>) -> Result<Vec<u8>, EntryError> {
    let ops: Vec<(LogKind, &[u8], &[u8])> = ops
        .map(|(kind, key, value)| {
            LogKind::of(kind)
                .map(|k| (k, key, value))
                .ok_or(EntryError::NotLogged(kind))
        })
        .collect::<Result<_, _>>()?;
    let n = ops.len();
    let count = u32::try_from(n)
        .ok()
        .filter(|&c| c <= MAX_OPS)
        .ok_or_else(|| EntryError::TooLarge(format!("{n} ops")))?;
    let (keys, values) = ops
        .iter()
        .fold((0, 0), |(k, v), (_, key, value)| (k + key.len(), v + value.len()));
    let mut out = Vec::with_capacity(4 + 9 * n + keys + values);
    out.extend_from_slice(&count.to_le_bytes());
    out.extend(ops.iter().map(|(kind, _, _)| *kind as u8));
    let length = |len: usize| u32::try_from(len).map_err(|_| EntryError::TooLarge(format!("an op of {len} bytes")));
    for (_, key, _) in &ops {
        out.extend_from_slice(&length(key.len())?.to_le_bytes());
    }
    for (_, _, value) in &ops {
        out.extend_from_slice(&length(value.len())?.to_le_bytes());
    }
    for (_, key, _) in &ops {
        out.extend_from_slice(key);
    }
    for (_, _, value) in &ops {
        out.extend_from_slice(value);
    }
    Ok(out)
}

/// A log entry's data: the batches of one entry, in the log's format (checked whole when
/// built or decoded).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LogPayload(Vec<u8>);

impl LogPayload {
    /// An entry of `batches`, each as [`encode_batch`] made it.
    pub fn from_batches<B: AsRef<[u8]>>(batches: &[B]) -> LogPayload {
        let len: usize = batches.iter().map(|b| b.as_ref().len()).sum();
        let mut out = Vec::with_capacity(5 + len);
        out.push(ENTRY_FORMAT);
        out.extend_from_slice(&(batches.len() as u32).to_le_bytes());
        for b in batches {
            out.extend_from_slice(b.as_ref());
        }
        LogPayload(out)
    }

    /// Checks `bytes` as a payload of this format.
    pub fn decode(bytes: Vec<u8>) -> Result<LogPayload, EntryError> {
        let payload = LogPayload(bytes);
        payload.batches()?;
        Ok(payload)
    }

    /// Its bytes, as stored and sent.
    pub fn bytes(&self) -> &[u8] {
        &self.0
    }

    /// The entry's batches, each a view the store runs.
    pub fn batches(&self) -> Result<Vec<LoggedBatch<'_>>, EntryError> {
        let mut r = Reader(&self.0);
        let format = r.u8("the format")?;
        if format != ENTRY_FORMAT {
            return Err(EntryError::Format(format));
        }
        let count = r.u32("the batch count")?;
        let mut batches = Vec::with_capacity((count as usize).min(1024));
        for b in 0..count {
            batches.push(LoggedBatch::read(&mut r, b)?);
        }
        match r.0.len() {
            0 => Ok(batches),
            n => Err(EntryError::Trailing(n)),
        }
    }
}

impl Serialize for LogPayload {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_bytes(&self.0)
    }
}

impl<'de> Deserialize<'de> for LogPayload {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<LogPayload, D::Error> {
        let bytes = serde_bytes::ByteBuf::deserialize(d)?.into_vec();
        LogPayload::decode(bytes).map_err(serde::de::Error::custom)
    }
}

/// Reads a payload from the front, every length checked.
struct Reader<'a>(&'a [u8]);

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize, what: &'static str) -> Result<&'a [u8], EntryError> {
        if self.0.len() < n {
            return Err(EntryError::Short(what));
        }
        let (head, rest) = self.0.split_at(n);
        self.0 = rest;
        Ok(head)
    }

    fn u8(&mut self, what: &'static str) -> Result<u8, EntryError> {
        Ok(self.take(1, what)?[0])
    }

    fn u32(&mut self, what: &'static str) -> Result<u32, EntryError> {
        let b = self.take(4, what)?;
        Ok(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    }
}

/// One logged batch, read in place: what the store runs when it applies the entry.
#[derive(Debug)]
pub struct LoggedBatch<'a> {
    kinds: &'a [u8],
    key_lens: &'a [u8],
    value_lens: &'a [u8],
    /// Where each op's key and value start (computed once when read).
    starts: Vec<(u32, u32)>,
    keys: &'a [u8],
    values: &'a [u8],
}

impl<'a> LoggedBatch<'a> {
    fn read(r: &mut Reader<'a>, batch: u32) -> Result<LoggedBatch<'a>, EntryError> {
        let n = r.u32("a batch's op count")?;
        if n > MAX_OPS {
            return Err(EntryError::TooLarge(format!("{n} ops in batch {batch}")));
        }
        let n = n as usize;
        let kinds = r.take(n, "a batch's kinds")?;
        if let Some((op, &kind)) = kinds
            .iter()
            .enumerate()
            .find(|(_, k)| LogKind::from_byte(**k).is_none())
        {
            return Err(EntryError::Kind {
                batch,
                op: op as u32,
                kind,
            });
        }
        let key_lens = r.take(4 * n, "a batch's key lengths")?;
        let value_lens = r.take(4 * n, "a batch's value lengths")?;
        let word = |b: &[u8]| u64::from(u32::from_le_bytes([b[0], b[1], b[2], b[3]]));
        let mut starts = Vec::with_capacity(n);
        let (mut key_at, mut value_at) = (0u64, 0u64);
        for (k, v) in key_lens.chunks_exact(4).zip(value_lens.chunks_exact(4)) {
            starts.push((key_at as u32, value_at as u32));
            key_at += word(k);
            value_at += word(v);
        }
        let whole = |total: u64, what| usize::try_from(total).map_err(|_| EntryError::Short(what));
        let keys = r.take(whole(key_at, "a batch's keys")?, "a batch's keys")?;
        let values = r.take(whole(value_at, "a batch's values")?, "a batch's values")?;
        if keys.len() > u32::MAX as usize || values.len() > u32::MAX as usize {
            return Err(EntryError::TooLarge(format!("batch {batch}'s bytes")));
        }
        Ok(LoggedBatch {
            kinds,
            key_lens,
            value_lens,
            starts,
            keys,
            values,
        })
    }

    fn span(lens: &[u8], bytes: &'a [u8], start: u32, i: usize) -> Option<&'a [u8]> {
        let len = u32::from_le_bytes(lens.get(4 * i..4 * i + 4)?.try_into().ok()?);
        bytes.get(start as usize..(start as usize).checked_add(len as usize)?)
    }
}

impl Ops for LoggedBatch<'_> {
    fn len(&self) -> usize {
        self.kinds.len()
    }

    fn op(&self, i: usize) -> Result<OpRef<'_>, MalformedOp> {
        let kind = self
            .kinds
            .get(i)
            .and_then(|&k| LogKind::from_byte(k))
            .ok_or(MalformedOp::IndexOutOfRange)?
            .op();
        let &(key_at, value_at) = self.starts.get(i).ok_or(MalformedOp::IndexOutOfRange)?;
        let key = Self::span(self.key_lens, self.keys, key_at, i).ok_or(MalformedOp::KeySpan)?;
        let value = Self::span(self.value_lens, self.values, value_at, i).ok_or(MalformedOp::ValueSpan)?;
        Ok(OpRef { kind, key, value })
    }

    fn contains(&self, kind: OpKind) -> bool {
        LogKind::of(kind).is_some_and(|k| self.kinds.contains(&(k as u8)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_logged_client_op_has_a_kind_and_comes_back_as_itself() {
        for kind in OpKind::ALL {
            match LogKind::of(kind) {
                Some(k) => {
                    assert_eq!(k.op(), kind);
                    assert_eq!(LogKind::from_byte(k as u8), Some(k));
                }
                None => assert!(kind.is_node_wide() && !kind.is_write(), "{kind:?} is a write"),
            }
        }
    }

    #[test]
    fn batches_round_trip_and_damage_is_an_error_not_nothing() {
        let a = encode_batch(
            [
                (OpKind::Clock, &b""[..], &7u64.to_le_bytes()[..]),
                (OpKind::Put, b"k", b"value"),
                (OpKind::Delete, b"gone", b""),
            ]
            .into_iter(),
        )
        .unwrap();
        let b = encode_batch([(OpKind::Flush, &b""[..], &b""[..])].into_iter()).unwrap();
        let payload = LogPayload::from_batches(&[a, b]);
        let back = LogPayload::decode(payload.bytes().to_vec()).unwrap();
        let batches = back.batches().unwrap();
        assert_eq!(batches.len(), 2);
        let op = batches[0].op(1).unwrap();
        assert_eq!((op.kind, op.key, op.value), (OpKind::Put, &b"k"[..], &b"value"[..]));
        assert_eq!(batches[0].op(2).unwrap().kind, OpKind::Delete);
        assert!(batches[1].contains(OpKind::Flush) && !batches[1].contains(OpKind::Put));
        let bytes = payload.bytes();
        for cut in 0..bytes.len() {
            assert!(LogPayload::decode(bytes[..cut].to_vec()).is_err(), "cut at {cut}");
        }
        let mut longer = bytes.to_vec();
        longer.push(0);
        assert_eq!(LogPayload::decode(longer), Err(EntryError::Trailing(1)));
        let mut other = bytes.to_vec();
        other[0] = 9;
        assert_eq!(LogPayload::decode(other), Err(EntryError::Format(9)));
        assert_eq!(
            encode_batch([(OpKind::Scan, &b""[..], &b""[..])].into_iter()),
            Err(EntryError::NotLogged(OpKind::Scan))
        );
    }
}
