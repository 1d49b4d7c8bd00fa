//! A shard's log as an openraft log: a group of one voter, or with `--group` the members of
//! a replica group (over [`super::network`]), over the log files of [`super::log`], the
//! snapshots of [`super::catalog`] and the node's [`Store`](crate::store::Store).
//!
//! A log entry holds the write parts of the batches that arrived while earlier entries were
//! committing (see `propose`); each part is a batch frame body, validated again when
//! applied (a log file is untrusted input too). Applying runs the part through the store, so
//! ops on one key keep batch order; its reply goes back as an encoded response body.
//!
//! Snapshots are fuzzy, and exact per map shard: a snapshot says it holds the log up to index
//! `L` (what was applied when it began), but it copies one map shard at a time while later
//! entries go on being applied, so some shards' copies also hold writes after `L`. Each map
//! shard remembers the last entry whose writes reached it, and the snapshot stores that index
//! with the shard's pairs (under the same lock). Recovery loads it and replays every entry
//! after `L`, skipping, for each key, the entries its shard's copy already holds. (Replaying
//! a blind put or delete twice would be harmless; a conditional put, `SET NX`/`XX`, would not:
//! `XX a` then `NX b` from absent gives `b`, applied again on top of `b` gives `a`.) This is
//! what lets a snapshot of a large store be taken without stopping writes (only one map
//! shard's read lock is held at a time).
//!
//! # Layout (openraft's seams)
//!
//! * `types`: the raft types, what an entry carries, and how the log answers a batch.
//! * `log_store`: openraft's log storage over the segment files (`super::log`).
//! * `state_machine`: applying entries to the store; writing, loading and installing
//!   snapshots.
//! * `propose`: group commit above the log (batches queued meanwhile share an entry).
//! * `reads`: read-index rounds, and follower reads; `lease`: how fresh a member is, for
//!   bounded-staleness reads.
//! * `open`: opening (recovering) a shard and starting its group.
//! * `shard`: [`DurableShard`], what the node asks of its log; `figures` its stats.
//! * `campaign`: when a member campaigns (pre-votes; openraft's own timer is off in groups).
//! * `rpc`: answering the raft RPCs and admin requests that reach this member.
//! * `admin`: membership changes and hand-over, on the leader.
//! * `tasks`: the shard's background tasks, owned and ended with it.

mod admin;
mod campaign;
mod change_error;
mod entry_cache;
mod figures;
mod lease;
mod log_store;
mod open;
mod propose;
mod reads;
mod rpc;
mod shard;
mod state_machine;
mod tasks;
pub(crate) mod types;

pub use log_store::{decode_record, encode_record};
pub use open::Recovery;
pub use shard::DurableShard;
pub use types::{LogAnswer, ShardRaft, SubmitError};

#[cfg(test)]
mod tests;
