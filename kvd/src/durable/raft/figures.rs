//! What a durable shard reports: its log and snapshots, and its place in its group.

use kvshared::stats::{Durability, GroupRole};

use super::shard::DurableShard;
use crate::durable::log::FsyncPolicy;

impl DurableShard {
    /// This member's place in its group, as its raft metrics say.
    pub fn group_figures(&self) -> kvshared::stats::GroupFigures {
        let m = self.raft.metrics().borrow().clone();
        let membership = m.membership_config.membership();
        let role = match m.state {
            openraft::ServerState::Leader => GroupRole::Leader,
            // Started with --join and not added yet, or removed from the group.
            _ if membership.nodes().next().is_none() => GroupRole::Joining,
            _ if membership.get_node(&self.me).is_none() => GroupRole::Removed,
            openraft::ServerState::Learner => GroupRole::Learner,
            _ => GroupRole::Follower,
        };
        let addr = |id: u64| membership.get_node(&id).map(|n| n.addr.clone()).unwrap_or_default();
        let last = m.last_log_index.unwrap_or(0);
        let commit_index = match &m.replication {
            // The leader: the highest index a majority of voters holds.
            Some(matched) if m.state == openraft::ServerState::Leader => {
                let mut held: Vec<u64> = membership
                    .voter_ids()
                    .map(|id| match id == self.me {
                        true => last,
                        false => matched.get(&id).copied().flatten().map_or(0, |l| l.index),
                    })
                    .collect();
                held.sort_unstable_by(|a, b| b.cmp(a));
                held.get(held.len() / 2).copied().unwrap_or(0)
            }
            _ => self.leader_commit.load(std::sync::atomic::Ordering::Relaxed),
        };
        let applied_index = m.last_applied.map_or(0, |l| l.index);
        kvshared::stats::GroupFigures {
            role,
            group_id: self.group_id().unwrap_or(0),
            term: m.current_term,
            leader: m.current_leader.map(addr).unwrap_or_default(),
            log_index: last,
            commit_index: commit_index.max(applied_index),
            applied_index,
            elections: self.events.elections.load(std::sync::atomic::Ordering::Relaxed),
            leader_changes: self.events.leader_changes.load(std::sync::atomic::Ordering::Relaxed),
            read_index_rounds: self.events.read_index_rounds.load(std::sync::atomic::Ordering::Relaxed),
            lag: m
                .replication
                .iter()
                .flatten()
                .filter(|(id, _)| **id != self.me)
                .map(|(id, matched)| kvshared::stats::FollowerLag {
                    addr: addr(*id),
                    behind: last.saturating_sub(matched.map_or(0, |l| l.index)),
                })
                .collect(),
            members: sorted(membership.voter_ids().map(addr)),
            learners: sorted(membership.learner_ids().map(addr)),
            changes: match m.state {
                openraft::ServerState::Leader => self.changes.lock().iter().cloned().collect(),
                _ => Vec::new(),
            },
        }
    }

    /// The log's and snapshots' figures, for stats.
    pub fn figures(&self) -> Durability {
        let w = self.writer.figures();
        let applied = self.applied_index();
        let s = self.snapshots.lock();
        let (snapshot_index, snapshot_bytes) = s
            .current
            .as_ref()
            .map_or((0, 0), |(m, _, size)| (m.last_log_id.map_or(0, |l| l.index), *size));
        let stall = self.health.figures();
        Durability {
            mode: match self.fsync {
                FsyncPolicy::Always => "always",
                FsyncPolicy::EverySecond => "1s",
                FsyncPolicy::Never => "never",
            }
            .into(),
            log_bytes: w.disk_bytes,
            log_entries: applied.saturating_sub(snapshot_index),
            log_memory_bytes: self.log_memory_bytes(),
            last_applied: applied,
            snapshot_index,
            snapshot_bytes,
            snapshot_age_ms: s.taken_at.map_or(0, |t| t.elapsed().as_millis() as u64),
            snapshots_taken: s.taken,
            last_snapshot_ms: s.last_took.as_millis() as u64,
            fsyncs: w.fsyncs,
            log_records_written: w.records,
            fsync: kvshared::latency::Latency::from_dense(&w.fsync_buckets, w.fsync_sum_ns),
            stalled_since_unix_ms: stall.since_unix_ms,
            stall_reason: stall.reason,
            disk_stalls: stall.stalls,
        }
    }
}

impl DurableShard {
    /// Bytes of log entries held in memory.
    fn log_memory_bytes(&self) -> u64 {
        self.log.lock().cache.bytes() as u64
    }
}

pub(super) fn sorted(addrs: impl Iterator<Item = String>) -> Vec<String> {
    let mut v: Vec<String> = addrs.collect();
    v.sort();
    v
}
