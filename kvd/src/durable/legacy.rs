//! The log of the builds before the log had an entry format of its own (log segments of
//! format 2): read, and converted into entry format 1 as it is read.
//!
//! Those builds logged each batch as the client's frame body: an rkyv `BatchRequest` of the
//! client protocol of frame version 19, its op kinds numbered as that protocol numbered them.
//! This module keeps its own copy of that layout ([`BatchRequestV19`]) and of those numbers,
//! so that later changes of the client protocol do not change what an old log means. A log
//! record was postcard's encoding of openraft's `Entry`, whose data was a list of bodies.

use openraft::{Entry, EntryPayload};

use super::entry::{EntryError, LogPayload, encode_batch};
use super::raft::ShardRaft;
use kvshared::wire::OpKind;

/// The op of a kind byte of frame version 19.
fn kind_v19(byte: u8) -> Option<OpKind> {
    const V19: [OpKind; 26] = [
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
    V19.get(usize::from(byte)).copied()
}

/// A batch body of frame version 19 as a batch of entry format 1.
pub(crate) fn batch_v19(body: &[u8]) -> Result<Vec<u8>, EntryError> {
    let raw = kvshared::wire::v19::batch_ops(body)
        .map_err(|e| EntryError::TooLarge(format!("a batch of the old log does not decode: {e}")))?;
    let mut ops = Vec::with_capacity(raw.len());
    for (i, op) in raw.iter().enumerate() {
        let kind = kind_v19(op.kind).ok_or(EntryError::Kind {
            batch: 0,
            op: i as u32,
            kind: op.kind,
        })?;
        ops.push((kind, op.key.as_slice(), op.value.as_slice()));
    }
    encode_batch(ops.iter().copied())
}

/// The entry data of the old log: the batches' bodies.
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize, PartialEq, Eq)]
pub(crate) struct WriteBatchV2(pub Vec<serde_bytes::ByteBuf>);

openraft::declare_raft_types!(
    /// The raft types of the old log, only to read its records.
    pub(crate) LegacyRaft:
        D = WriteBatchV2,
        R = (),
        NodeId = u64,
        Node = openraft::BasicNode,
        Entry = Entry<LegacyRaft>,
        SnapshotData = tokio::fs::File,
        AsyncRuntime = openraft::TokioRuntime,
);

/// Why a record of an older log format does not read.
#[derive(Debug, thiserror::Error)]
pub enum LegacyError {
    #[error("does not decode: {0}")]
    Decode(#[from] postcard::Error),
    #[error(transparent)]
    Batch(#[from] EntryError),
}

/// A log record of segment format 2 as an entry of this build.
pub(crate) fn entry_v2(record: &[u8]) -> Result<Entry<ShardRaft>, LegacyError> {
    let old: Entry<LegacyRaft> = postcard::from_bytes(record)?;
    let payload = match old.payload {
        EntryPayload::Blank => EntryPayload::Blank,
        EntryPayload::Membership(m) => EntryPayload::Membership(m),
        EntryPayload::Normal(WriteBatchV2(bodies)) => {
            let batches = bodies.iter().map(|b| batch_v19(b)).collect::<Result<Vec<_>, _>>()?;
            EntryPayload::Normal(LogPayload::from_batches(&batches))
        }
    };
    Ok(Entry {
        log_id: old.log_id,
        payload,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::Ops;
    use kvshared::wire::{BatchRequest, encode_body};

    /// This build's client protocol is still frame version 19: a body it encodes reads
    /// back through the copy of that layout as the same ops. (Once the protocol changes, the
    /// golden data directories of log format 2 hold the old layout instead.)
    #[test]
    fn a_version_19_body_reads_back_as_the_same_ops() {
        assert_eq!(
            kvshared::frame::VERSION,
            19,
            "the protocol changed: keep this test on golden bytes"
        );
        let mut req = BatchRequest::new();
        req.push(OpKind::Clock, b"", &5u64.to_le_bytes());
        req.push_put(b"key", b"value");
        req.push(OpKind::SlotSet, b"", b"change");
        req.push_delete(b"other");
        let mut body = kvshared::frame::AlignedVec::new();
        encode_body(&req, &mut body).unwrap();
        let batch = batch_v19(&body).unwrap();
        let payload = LogPayload::from_batches(&[batch]);
        let batches = payload.batches().unwrap();
        let got: Vec<_> = (0..batches[0].len())
            .map(|i| {
                let op = batches[0].op(i).unwrap();
                (op.kind, op.key.to_vec(), op.value.to_vec())
            })
            .collect();
        let want: Vec<_> = (0..req.len())
            .map(|i| {
                let (k, key, value) = req.op(i).unwrap();
                (k, key.to_vec(), value.to_vec())
            })
            .collect();
        assert_eq!(got, want);
        assert!(batch_v19(&body[..body.len() - 1]).is_err(), "a cut body is an error");
    }
}
