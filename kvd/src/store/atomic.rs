//! Atomic batches (Redis's `MULTI`/`EXEC`, with `WATCH`): a batch holding an `Atomic` op
//! runs as one. Every map shard it touches is write-locked first, in ascending order (no
//! other batch holds two shard locks, so there is no deadlock), then its `Unchanged`
//! checks are made, then its ops run in batch order; the locks go only after the last op,
//! so no other batch's op comes between two of its ops.
//!
//! All or nothing: an op that cannot run (malformed, a key of another node, a client's
//! clock op) or a failed check means no op runs (answered `Aborted`). Once it runs, each op
//! answers as it would alone (an increment of text answers `NotAnInteger` and the others
//! still run: Redis does not roll back either).
//!
//! Durable: the batch is one log entry, applied the same way on every member. A fuzzy
//! snapshot must not split one (checks on a shard copied after it could fail on replay
//! while a shard copied before it needs it applied): a logged atomic batch passes the
//! transaction gate (shared) and counts itself (`Store::gate_passes`); a snapshot takes the
//! gate (exclusive) at its start and end and makes its copy again when the count moved in
//! between, or holds the gate throughout (see `export`).

use super::Ops;
use kvshared::routing::{key_hash, map_shard};
use kvshared::stats::Counts;
use kvshared::wire::{BatchResponse, MalformedOp, OpKind, OpStatus, watch_value};
use parking_lot::RwLockWriteGuard;

use super::expiry::batch_clock;
use super::memory::Shard;
use super::pipeline::Pending;
use super::{Answers, ReplyRoom, Scratch, Store};

impl Store {
    /// While the guard lives, no atomic batch is applied from the log (a snapshot's copy).
    pub(super) fn hold_transactions(&self) -> parking_lot::RwLockWriteGuard<'_, ()> {
        self.gate.close()
    }

    /// Runs an atomic batch (see the module's notes). `out` is reset already.
    pub(super) fn execute_atomic(
        &self,
        batch: &impl Ops,
        out: &mut BatchResponse,
        room: &mut impl ReplyRoom,
        scratch: &mut Scratch,
        tally: &mut Counts,
    ) {
        let n = batch.len();
        let (mut runnable, mut shards) = (true, Vec::new());
        let slot_changes = self.own.slots.changes();
        scratch.hashes.clear();
        scratch.hashes.resize(n, 0);
        for i in 0..n {
            match self.check_atomic_op(batch, i, scratch, out, tally) {
                Ok(needs) => shards.extend(needs.into_iter().flatten()),
                Err(()) => runnable = false,
            }
        }
        shards.sort_unstable();
        shards.dedup();
        if self.replay_holds_all(&shards, batch, scratch) {
            return;
        }
        let _gate = (scratch.log_index > 0).then(|| self.gate.pass_shared());
        let mut guards: Vec<(usize, RwLockWriteGuard<'_, Shard>)> =
            shards.iter().map(|&s| (s, self.map.shards[s].write())).collect();
        for (_, g) in guards.iter_mut() {
            g.applied = g.applied.max(scratch.log_index);
        }
        let mut ans = Answers {
            out,
            room,
            tally,
            now: self.now(),
            clock: batch_clock(batch, scratch.log_index),
            log_index: scratch.log_index,
            slot_changes,
        };
        if self.own.slots.changes() != slot_changes {
            // A slot changed hands since the ops were checked: nothing runs; sent again,
            // the batch is checked against the new table.
            for i in 0..n {
                ans.out.set(i, OpStatus::TryAgain);
            }
            return;
        }
        if runnable {
            runnable = self.checks_hold(batch, &scratch.hashes, &guards, &mut ans);
        }
        if !runnable {
            abort(batch, ans.out);
            return;
        }
        for i in 0..n {
            let Ok(op) = batch.op(i) else { continue };
            match op.kind {
                OpKind::Atomic => {
                    ans.out.set(i, OpStatus::Stored);
                    continue;
                }
                OpKind::Clock | OpKind::Unchanged => continue,
                _ => {}
            }
            let hash = scratch.hashes[i];
            let shard = map_shard(hash, self.map.shards.len());
            if op.kind == OpKind::Rename {
                let Ok(to) = self.rename_target_shard(op.value) else {
                    continue;
                };
                if let Some((src, dst)) = two_guards(&mut guards, shard, to) {
                    self.rename((shard, src), dst.map(|d| (to, d)), op.key, op.value, i, &mut ans);
                }
                continue;
            }
            let Some(g) = guard_of(&mut guards, shard) else {
                continue;
            };
            match op.kind {
                OpKind::Get => {
                    let mut pending = Pending::new();
                    self.probe_get(shard, g, hash, op.key, i, &mut ans, &mut pending);
                    self.deliver_all(shard, g, &mut ans, &mut pending);
                }
                OpKind::Ttl => Self::ttl_of(g, hash, op.key, i, &mut ans),
                _ => {
                    let expired = self.expire_if_due(g, hash, op.key, &mut ans);
                    self.write_one(shard, g, hash, op, expired, i, &mut ans);
                }
            }
        }
    }

    /// Checks op `i` of an atomic batch before anything runs: the map shards it needs (none
    /// for the marker and a log's clock; a rename's target's too), or `Err` when it cannot
    /// run (answered with why).
    fn check_atomic_op(
        &self,
        batch: &impl Ops,
        i: usize,
        scratch: &mut Scratch,
        out: &mut BatchResponse,
        tally: &mut Counts,
    ) -> Result<[Option<usize>; 2], ()> {
        let mut refuse = |why| {
            out.set_malformed(i, why);
            tally.malformed_op += 1;
        };
        let op = batch.op(i).map_err(&mut refuse)?;
        match op.kind {
            OpKind::Atomic => Ok([None; 2]),
            OpKind::Clock if scratch.log_index > 0 => {
                out.set(i, OpStatus::Stored);
                Ok([None; 2])
            }
            OpKind::Clock => {
                refuse(MalformedOp::LogOnly);
                Err(())
            }
            _ if op.kind.is_node_wide() => {
                refuse(MalformedOp::NotAlone);
                Err(())
            }
            _ => {
                if self.refuse_unserved(op.kind, op.key, i, out, tally)
                    || self.refuse_unlogged_write(op.kind, scratch.log_index, i, out, tally)
                {
                    return Err(());
                }
                let hash = key_hash(op.key);
                scratch.hashes[i] = hash;
                let target = match op.kind {
                    OpKind::Rename => Some(self.rename_target_shard(op.value).map_err(|why| {
                        out.set_malformed(i, why);
                        tally.malformed_op += 1;
                    })?),
                    _ => None,
                };
                Ok([Some(map_shard(hash, self.map.shards.len())), target])
            }
        }
    }

    /// Replaying the log after a snapshot whose copies of these map shards already hold this
    /// entry (a snapshot never splits an atomic batch: all of them or none).
    fn replay_holds_all(&self, shards: &[usize], batch: &impl Ops, scratch: &Scratch) -> bool {
        if scratch.log_index == 0 {
            return false;
        }
        let replay = self.gate.replay.read();
        let Some(held) = replay.as_ref() else { return false };
        let mut any = false;
        for i in 0..batch.len() {
            if let Ok(op) = batch.op(i)
                && !matches!(op.kind, OpKind::Atomic | OpKind::Clock)
            {
                let h = held.get(map_shard(scratch.hashes[i], held.len())).copied().unwrap_or(0);
                if scratch.log_index > h {
                    return false;
                }
                any = true;
            }
        }
        any || shards.is_empty()
    }

    /// Whether every `Unchanged` check of the batch holds: the key's value (absent, or
    /// past its deadline, counts as absent) is still the one watched.
    fn checks_hold(
        &self,
        batch: &impl Ops,
        hashes: &[u64],
        guards: &[(usize, RwLockWriteGuard<'_, Shard>)],
        ans: &mut Answers<'_, impl ReplyRoom>,
    ) -> bool {
        let mut hold = true;
        for (i, &hash) in hashes.iter().enumerate() {
            let Ok(op) = batch.op(i) else { continue };
            if op.kind != OpKind::Unchanged {
                continue;
            }
            let shard = map_shard(hash, self.map.shards.len());
            let Ok(at) = guards.binary_search_by_key(&shard, |(s, _)| *s) else {
                continue;
            };
            let s = &guards[at].1;
            let value = s
                .table
                .find(hash, op.key)
                .filter(|_| !s.expires.is_due(op.key, ans.clock))
                .and_then(|slot| s.table.at(slot))
                .map(|e| e.value());
            let same = watch_value(value) == *op.value;
            ans.out
                .set(i, if same { OpStatus::Stored } else { OpStatus::NotStored });
            hold &= same;
        }
        hold
    }
}

/// The guard of map shard `shard`, if the batch locked it.
fn guard_of<'g, 'a>(guards: &'g mut [(usize, RwLockWriteGuard<'a, Shard>)], shard: usize) -> Option<&'g mut Shard> {
    let at = guards.binary_search_by_key(&shard, |(s, _)| *s).ok()?;
    Some(&mut *guards[at].1)
}

/// The guards of map shards `a` and `b` (`None` for `b` when it is `a`), if the batch
/// locked them.
#[allow(clippy::type_complexity)]
fn two_guards<'g, 'a>(
    guards: &'g mut [(usize, RwLockWriteGuard<'a, Shard>)],
    a: usize,
    b: usize,
) -> Option<(&'g mut Shard, Option<&'g mut Shard>)> {
    let ia = guards.binary_search_by_key(&a, |(s, _)| *s).ok()?;
    if a == b {
        return Some((&mut *guards[ia].1, None));
    }
    let ib = guards.binary_search_by_key(&b, |(s, _)| *s).ok()?;
    let (lo, hi) = guards.split_at_mut(ia.max(ib));
    let (first, second) = (&mut *lo[ia.min(ib)].1, &mut *hi[0].1);
    Some(if ia < ib {
        (first, Some(second))
    } else {
        (second, Some(first))
    })
}

/// Answers every op of an aborted batch that has no answer of its own yet `Aborted`.
fn abort(batch: &impl Ops, out: &mut BatchResponse) {
    for i in 0..batch.len() {
        let kept = matches!(
            out.status(i),
            Some(OpStatus::Malformed | OpStatus::Moved | OpStatus::TryAgain | OpStatus::NotStored)
        ) || batch.op(i).is_ok_and(|op| op.kind == OpKind::Clock);
        if !kept {
            out.set(i, OpStatus::Aborted);
        }
    }
}

#[cfg(test)]
mod tests {
    use kvshared::routing::{ShardId, key_slot};
    use kvshared::wire::{BatchRequest, OpReply, watch_value};

    use super::*;
    use crate::store::expiry::tests_support::run_at;

    fn txn(ops: &[(OpKind, &[u8], &[u8])]) -> BatchRequest {
        let mut req = BatchRequest::new();
        req.push(OpKind::Atomic, b"", b"");
        for (kind, key, value) in ops {
            req.push(*kind, key, value);
        }
        req
    }

    /// A transaction runs in order and answers each op; a failed check or an op that
    /// cannot run means nothing runs; a check outside a transaction is malformed.
    #[test]
    fn all_or_nothing() {
        let store = Store::new(ShardId::SOLO, 8, 0).unwrap();
        let one = 1i64.to_le_bytes();
        let seen = watch_value(None);
        let req = txn(&[
            (OpKind::Unchanged, b"a", &seen),
            (OpKind::Put, b"a", b"1"),
            (OpKind::IncrBy, b"a", &one),
            (OpKind::Put, b"b", b"x"),
            (OpKind::Get, b"a", b""),
        ]);
        let (r, _) = run_at(&store, 0, &req);
        assert_eq!(
            r,
            [
                OpReply::Stored,
                OpReply::Stored,
                OpReply::Stored,
                OpReply::Counted(2),
                OpReply::Stored,
                OpReply::Found(b"2")
            ]
        );
        // The watched value changed: nothing runs.
        let (r, _) = run_at(
            &store,
            0,
            &txn(&[(OpKind::Unchanged, b"a", &seen), (OpKind::Put, b"b", b"y")]),
        );
        assert_eq!(r, [OpReply::Aborted, OpReply::NotStored, OpReply::Aborted]);
        let now = watch_value(Some(b"2"));
        let (r, _) = run_at(
            &store,
            0,
            &txn(&[(OpKind::Unchanged, b"a", &now), (OpKind::Get, b"b", b"")]),
        );
        assert_eq!(r, [OpReply::Stored, OpReply::Stored, OpReply::Found(b"x")]);
        // A client's clock op, or a malformed one: nothing runs.
        let (r, _) = run_at(
            &store,
            0,
            &txn(&[(OpKind::Put, b"b", b"z"), (OpKind::Clock, b"", &[0; 8])]),
        );
        assert_eq!(r[..2], [OpReply::Aborted, OpReply::Aborted]);
        assert!(matches!(r[2], OpReply::Malformed(_)));
        let (r, _) = run_at(
            &store,
            0,
            &txn(&[(OpKind::Put, b"b", b"z"), (OpKind::IncrBy, b"b", b"bad")]),
        );
        assert_eq!(
            r[..2],
            [OpReply::Stored, OpReply::Stored],
            "an op's own failure is its own: {r:?}"
        );
        let mut check = BatchRequest::new();
        check.push(OpKind::Unchanged, b"a", &now);
        assert!(matches!(run_at(&store, 0, &check).0[0], OpReply::Malformed(_)));
        let mut get = BatchRequest::new();
        get.push_get(b"b");
        assert_eq!(run_at(&store, 0, &get).0, [OpReply::Found(b"z")]);
    }

    /// A key of another node aborts the transaction, with the owner named.
    #[test]
    fn another_node_s_key_aborts_it() {
        let store = Store::new(ShardId { index: 0, count: 2 }, 8, 0).unwrap();
        let other = (0..)
            .map(|i| format!("k{i}"))
            .find(|k| !ShardId { index: 0, count: 2 }.owns(key_slot(k.as_bytes())))
            .unwrap();
        let mine = (0..)
            .map(|i| format!("k{i}"))
            .find(|k| ShardId { index: 0, count: 2 }.owns(key_slot(k.as_bytes())))
            .unwrap();
        let (r, _) = run_at(
            &store,
            0,
            &txn(&[
                (OpKind::Put, mine.as_bytes(), b"1"),
                (OpKind::Put, other.as_bytes(), b"1"),
            ]),
        );
        assert_eq!(r[..2], [OpReply::Aborted, OpReply::Aborted]);
        assert!(matches!(r[2], OpReply::Moved { owner: 1, epoch: 0, .. }));
        assert_eq!(store.len(), 0);
    }
}
