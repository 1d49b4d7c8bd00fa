//! A fixed sample of every encoding kvd keeps on disk or sends between members: log entry
//! payloads, log records, a log segment, a snapshot and its store data, the vote and
//! committed files, and the raft messages and their answers. `kvd/tests/compat.rs` compares
//! them with the golden bytes committed under `kvd/tests/golden/bytes/`, so that changing a
//! layout is a choice (a version bumped, a reader kept), never an accident.
//!
//! Each sample's name carries the version of the format it is written in (`entry-1-...`,
//! `segment-3`, `raft-20-...`): bumping a version names new files, and the old ones stay
//! beside them with the readers that still accept them.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use kvshared::expiry::{Deadline, Expire, ExpireIf, PutIf, PutTtl, PutWith};
use kvshared::frame::RAFT_VERSION;
use kvshared::keyspace::Rename;
use kvshared::routing::ShardId;
use kvshared::slots::{SlotChange, SlotState};
use kvshared::wire::OpKind;
use openraft::raft::{AppendEntriesRequest, AppendEntriesResponse, InstallSnapshotRequest, VoteRequest, VoteResponse};
use openraft::{
    BasicNode, CommittedLeaderId, Entry, EntryPayload, LogId, Membership, SnapshotMeta, StoredMembership, Vote,
};

use super::entry::{ENTRY_FORMAT, LogPayload, encode_batch};
use super::network::{AdminReply, AdminRequest, MemberIdentity, RaftMessage, RaftRpc, RaftRpcReply};
use super::raft::ShardRaft;
use super::{segment, snapshot};

/// The leader's clock in every sample (2026-12-05 00:00:00 UTC).
pub const CLOCK_MS: u64 = 1_796_428_800_000;

/// Why a sample could not be made (a bug of this build: each encoder failed on fixed input).
#[derive(Debug, thiserror::Error)]
#[allow(missing_docs)] // each wraps the failing encoder's own error
pub enum SampleError {
    #[error(transparent)]
    Entry(#[from] super::entry::EntryError),
    #[error(transparent)]
    Postcard(#[from] postcard::Error),
    #[error(transparent)]
    Segment(#[from] segment::SegmentError),
    #[error(transparent)]
    Snapshot(#[from] snapshot::SnapshotError),
    #[error(transparent)]
    Io(#[from] std::io::Error),
    #[error("{}: {source}", path.display())]
    Read {
        path: std::path::PathBuf,
        source: std::io::Error,
    },
}

/// One encoding: its file name under `tests/golden/bytes/` and its bytes.
pub struct Sample {
    /// e.g. `entry-1-payload.bin`.
    pub name: String,
    /// What this build writes.
    pub bytes: Vec<u8>,
}

fn sample(name: String, bytes: Vec<u8>) -> Sample {
    Sample { name, bytes }
}

/// Every sample, each encoded by this build. `scratch` is an empty directory for the files.
pub fn all(scratch: &Path) -> Result<Vec<Sample>, SampleError> {
    let mut out = entries()?;
    out.extend(files(scratch)?);
    out.extend(raft_messages()?);
    Ok(out)
}

/// A first batch with every kind of logged op but the node-wide ones, in the encodings of
/// their values.
pub fn batch_of_every_kind() -> Result<Vec<u8>, SampleError> {
    let put_with = PutWith {
        cond: PutIf::Absent,
        ttl: PutTtl::Until(Deadline::In(60_000)),
        value: b"v-ttl",
    }
    .encode();
    let expire = Expire {
        cond: ExpireIf::Later,
        deadline: Deadline::At(CLOCK_MS + 3_600_000),
    }
    .encode();
    let load = {
        let mut v = Vec::new();
        kvshared::slot_copy::encode_load(Some(b"loaded"), Some(CLOCK_MS + 1_000), &mut v);
        v
    };
    let clock = kvshared::expiry::clock_value(CLOCK_MS);
    let ops: [(OpKind, &[u8], &[u8]); 17] = [
        (OpKind::Clock, b"", &clock),
        (OpKind::Get, b"k0", b""),
        (OpKind::Put, b"k1", b"value one"),
        (OpKind::Delete, b"k2", b""),
        (OpKind::PutIfAbsent, b"k3", b"three"),
        (OpKind::PutIfPresent, b"k1", b"one again"),
        (OpKind::IncrBy, b"n", &7i64.to_le_bytes()),
        (OpKind::Append, b"k1", b"+tail"),
        (OpKind::SetRange, b"k3", b"\x02\0\0\0\0\0\0\0XY"),
        (OpKind::PutWith, b"k4", &put_with),
        (OpKind::Expire, b"k1", &expire),
        (OpKind::Ttl, b"k4", b""),
        (OpKind::Expired, b"k5", b""),
        (OpKind::IncrByFloat, b"f", &1.5f64.to_le_bytes()),
        (OpKind::Load, b"k6", &load),
        (OpKind::Unchanged, b"k1", b""),
        (OpKind::Get, b"k1", b""),
    ];
    Ok(encode_batch(ops.into_iter())?)
}

/// Batches of the node-wide and atomic ops.
fn batches_of_node_ops() -> Result<Vec<Vec<u8>>, SampleError> {
    let clock = kvshared::expiry::clock_value(CLOCK_MS);
    let change = SlotChange {
        ranges: vec![[0, 99], [200, 200]],
        to: SlotState::Gone,
        owner: 1,
        epoch: 4,
    }
    .encode();
    let rename = Rename { to: b"k9", nx: false }.encode();
    let atomic: [(OpKind, &[u8], &[u8]); 4] = [
        (OpKind::Clock, b"", &clock),
        (OpKind::Atomic, b"", b""),
        (OpKind::Rename, b"k1", &rename),
        (OpKind::Put, b"k8", b"eight"),
    ];
    let slots: [(OpKind, &[u8], &[u8]); 2] = [(OpKind::Clock, b"", &clock), (OpKind::SlotSet, b"", &change)];
    let flush: [(OpKind, &[u8], &[u8]); 2] = [(OpKind::Clock, b"", &clock), (OpKind::Flush, b"", b"")];
    [&atomic[..], &slots[..], &flush[..]]
        .into_iter()
        .map(|ops| encode_batch(ops.iter().copied()).map_err(SampleError::from))
        .collect()
}

/// An entry payload of every batch above.
pub fn payload() -> Result<LogPayload, SampleError> {
    let mut batches = vec![batch_of_every_kind()?];
    batches.extend(batches_of_node_ops()?);
    Ok(LogPayload::from_batches(&batches))
}

fn log_id(term: u64, index: u64) -> LogId<u64> {
    LogId::new(CommittedLeaderId::new(term, 11), index)
}

fn membership() -> Membership<u64, BasicNode> {
    let voters: BTreeSet<u64> = [11, 12, 13].into();
    let nodes: BTreeMap<u64, BasicNode> = [
        (11, BasicNode::new("127.0.0.1:7001")),
        (12, BasicNode::new("127.0.0.1:7002")),
        (13, BasicNode::new("127.0.0.1:7003")),
        (14, BasicNode::new("127.0.0.1:7004")),
    ]
    .into();
    Membership::new(vec![voters], nodes)
}

/// The three kinds of log entry.
pub fn entries_of_every_kind() -> Result<Vec<Entry<ShardRaft>>, SampleError> {
    Ok(vec![
        Entry {
            log_id: log_id(2, 7),
            payload: EntryPayload::Blank,
        },
        Entry {
            log_id: log_id(2, 8),
            payload: EntryPayload::Membership(membership()),
        },
        Entry {
            log_id: log_id(2, 9),
            payload: EntryPayload::Normal(payload()?),
        },
    ])
}

fn entries() -> Result<Vec<Sample>, SampleError> {
    let mut out = vec![sample(
        format!("entry-{ENTRY_FORMAT}-payload.bin"),
        payload()?.bytes().to_vec(),
    )];
    for (entry, what) in entries_of_every_kind()?.iter().zip(["blank", "membership", "normal"]) {
        let record = super::raft::encode_record(entry)?;
        out.push(sample(format!("record-{ENTRY_FORMAT}-{what}.bin"), record));
    }
    Ok(out)
}

/// The files: a segment of the three records, a snapshot of a store that applied the
/// payload, the vote and the committed index.
fn files(scratch: &Path) -> Result<Vec<Sample>, SampleError> {
    let seg_path = scratch.join("sample.seg");
    let mut seg = segment::Segment::create(&seg_path)?;
    let records = entries_of_every_kind()?
        .iter()
        .map(super::raft::encode_record)
        .collect::<Result<Vec<_>, _>>()?;
    seg.append(&records)?;
    seg.sync()?;
    seg.mark(3, false)?;
    let read = |p: &Path| {
        std::fs::read(p).map_err(|source| SampleError::Read {
            path: p.to_path_buf(),
            source,
        })
    };
    let mut out = vec![sample(
        format!("segment-{}.bin", segment::FORMAT_VERSION),
        read(&seg_path)?,
    )];

    let data = store_data()?;
    out.push(sample(
        format!("store-dump-{}.bin", snapshot::FORMAT_VERSION),
        data.clone(),
    ));
    let meta = SnapshotMeta {
        last_log_id: Some(log_id(2, 9)),
        last_membership: StoredMembership::new(Some(log_id(2, 8)), membership()),
        snapshot_id: "2-9".into(),
    };
    let meta = postcard::to_allocvec(&meta)?;
    let snap_path = scratch.join("sample.snap");
    snapshot::write(&snap_path, &snapshot::Snapshot { meta, data })?;
    out.push(sample(
        format!("snapshot-{}.bin", snapshot::FORMAT_VERSION),
        read(&snap_path)?,
    ));
    let vote = postcard::to_allocvec(&Vote::new_committed(2, 11))?;
    out.push(sample("vote.bin".into(), vote));
    let committed = postcard::to_allocvec(&log_id(2, 9))?;
    out.push(sample("committed.bin".into(), committed));
    Ok(out)
}

/// A store's snapshot data after it applied [`payload`] at index 9.
fn store_data() -> Result<Vec<u8>, SampleError> {
    let store = crate::store::Store::new(ShardId::SOLO, 4, 0)?;
    let payload = payload()?;
    let mut response = kvshared::wire::BatchResponse::default();
    let mut scratch = crate::store::Scratch::default();
    scratch.log_index = 9;
    for batch in payload.batches()? {
        store.execute(
            &batch,
            &mut response,
            &mut crate::store::Unbounded,
            &mut scratch,
            &mut kvshared::stats::Counts::default(),
        );
    }
    let mut data = Vec::new();
    store.export_into(true, &mut || {}, &mut |b: &[u8]| {
        data.extend_from_slice(b);
        Ok::<(), SampleError>(())
    })?;
    Ok(data)
}

/// Every raft message and answer a member sends, with entries in the log's format.
fn raft_messages() -> Result<Vec<Sample>, SampleError> {
    let vote = Vote::new_committed(2, 11);
    let append = RaftRpc::Append(AppendEntriesRequest {
        vote,
        prev_log_id: Some(log_id(2, 6)),
        entries: entries_of_every_kind()?,
        leader_commit: Some(log_id(2, 6)),
    });
    let snapshot = RaftRpc::Snapshot(InstallSnapshotRequest {
        vote,
        meta: SnapshotMeta {
            last_log_id: Some(log_id(2, 9)),
            last_membership: StoredMembership::new(Some(log_id(2, 8)), membership()),
            snapshot_id: "2-9".into(),
        },
        offset: 0,
        data: b"snapshot bytes".to_vec(),
        done: true,
    });
    let requests = [
        ("append", append),
        (
            "vote",
            RaftRpc::Vote(VoteRequest {
                vote: Vote::new(3, 12),
                last_log_id: Some(log_id(2, 9)),
            }),
        ),
        ("install-snapshot", snapshot),
        (
            "admin-add-learner",
            RaftRpc::Admin(AdminRequest::AddLearner {
                addr: "127.0.0.1:7004".into(),
                why: "sample".into(),
            }),
        ),
        (
            "admin-pre-vote",
            RaftRpc::Admin(AdminRequest::PreVote {
                candidate: 12,
                last_log: Some(kvshared::admin::LogPosition {
                    term: 2,
                    leader: 11,
                    index: 9,
                }),
            }),
        ),
        (
            "admin-read-index",
            RaftRpc::Admin(AdminRequest::ReadIndex { member: 13 }),
        ),
    ];
    let mut out = Vec::new();
    for (what, rpc) in requests {
        let message = RaftMessage { group: 77, to: 12, rpc };
        let bytes = postcard::to_allocvec(&message)?;
        out.push(sample(format!("raft-{RAFT_VERSION}-{what}.bin"), bytes));
    }
    out.extend(raft_replies()?);
    Ok(out)
}

fn raft_replies() -> Result<Vec<Sample>, SampleError> {
    let vote = Vote::new_committed(2, 11);
    let replies = [
        ("reply-append", RaftRpcReply::Append(Ok(AppendEntriesResponse::Success))),
        (
            "reply-vote",
            RaftRpcReply::Vote(Ok(VoteResponse {
                vote,
                vote_granted: false,
                last_log_id: Some(log_id(2, 9)),
            })),
        ),
        ("reply-refused", RaftRpcReply::Refused("not a member".into())),
        (
            "reply-identity",
            RaftRpcReply::Admin(AdminReply::Identity(MemberIdentity {
                member: 12,
                group: Some(77),
                initialised: true,
                peers: vec!["127.0.0.1:7001".into()],
                shard: "0/1".into(),
            })),
        ),
    ];
    replies
        .into_iter()
        .map(|(what, reply)| {
            let bytes = postcard::to_allocvec(&reply)?;
            Ok(sample(format!("raft-{RAFT_VERSION}-{what}.bin"), bytes))
        })
        .collect()
}
