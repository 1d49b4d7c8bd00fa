//! The linearizability checker: Wing & Gong's search with Lowe's memoisation (the algorithm
//! Porcupine uses), run per key.
//!
//! A register per key is independent of every other key, so a history is linearizable iff
//! each key's sub-history is (locality). Partitions are checked in parallel on scoped threads,
//! largest first, and the first failure cancels the rest.
//!
//! The search walks a list of call and return events in time order. At a call it tries to
//! linearize that op next (if the model allows its answer); reaching a return whose op is not
//! yet linearized means the current order cannot work, so it backtracks. The memo table of
//! (set of linearized ops, model state) pairs prunes every configuration already explored,
//! which is what makes this fast on real histories. Three further rules (observers first, one
//! state for every unread value, one of each kind of candidate; each argued where it is
//! applied) keep highly concurrent single-key histories from going exponential.

use std::collections::{BTreeMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use serde::{Deserialize, Serialize};

use super::model::{ModelOp, reduce, step};
use super::{Call, History, Operation, Return};

/// How to run a check.
#[derive(Clone, Debug)]
pub struct CheckOptions {
    /// Give up (verdict `Unknown`) after this long.
    pub deadline: Option<Duration>,
    /// Worker threads; 0 means one per CPU.
    pub threads: usize,
    /// The search's three pruning rules (see `check_partition`): observers first, one
    /// unread-value state, one of each kind of op among the candidates. On by default; off
    /// gives the plain WGL search with Porcupine's memoisation, kept to measure against and
    /// to test the rules.
    pub prune: bool,
}

impl Default for CheckOptions {
    fn default() -> Self {
        CheckOptions {
            deadline: Some(Duration::from_secs(60)),
            threads: 0,
            prune: true,
        }
    }
}

/// A key the check did not decide before its deadline.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Undecided {
    /// The key.
    pub key: String,
    /// Its operations.
    pub operations: usize,
    /// The most of them the search had placed in a valid order (0: not started).
    pub placed: usize,
}

/// Why a history is not linearizable: one key whose operations admit no valid order.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Failure {
    /// The key whose operations could not be ordered.
    pub key: String,
    /// Every operation on that key, in call order.
    pub operations: Vec<Operation>,
    /// The longest valid order found: indexes into `operations`.
    pub longest_prefix: Vec<usize>,
    /// An operation that could not come next after that prefix (index into `operations`).
    pub stuck: Option<usize>,
}

/// The checker's answer.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "verdict", rename_all = "snake_case")]
pub enum Verdict {
    /// Every key's operations have a valid order.
    Linearizable,
    /// A key's operations have none.
    NotLinearizable(Box<Failure>),
    /// The deadline passed before every key was decided.
    Unknown {
        /// What was left undecided, and how to give the check more time.
        reason: String,
        /// Every key left undecided.
        #[serde(default)]
        undecided: Vec<Undecided>,
    },
}

/// The verdict and what it took.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct CheckReport {
    /// The answer.
    pub verdict: Verdict,
    /// Operations in the history.
    pub operations: usize,
    /// Distinct keys (each checked on its own).
    pub keys: usize,
    /// Time the check took.
    pub elapsed_ms: f64,
}

enum PartitionResult {
    Linearizable,
    NotLinearizable {
        longest: Vec<usize>,
        stuck: Option<usize>,
    },
    /// Stopped by the deadline or another key's failure, after placing at most `placed` ops.
    Cancelled {
        placed: usize,
    },
}

/// Checks `history` against the per-key register model.
pub fn check(history: &History, options: &CheckOptions) -> CheckReport {
    let start = Instant::now();
    let mut by_key: BTreeMap<&str, Vec<&Operation>> = BTreeMap::new();
    let expiries = expiries(history);
    for op in history.operations.iter().chain(&expiries) {
        by_key.entry(op.key.as_str()).or_default().push(op);
    }
    let mut partitions: Vec<(&str, Vec<&Operation>)> = by_key.into_iter().collect();
    for (_, ops) in &mut partitions {
        ops.sort_by_key(|o| (o.call_ns, o.return_ns));
    }
    // Largest first, so the slowest partition starts early.
    partitions.sort_by_key(|(_, ops)| std::cmp::Reverse(ops.len()));
    let keys = partitions.len();

    let until = options.deadline.map(|d| start + d);
    let cancel = AtomicBool::new(false);
    let timed_out = AtomicBool::new(false);
    let next = AtomicUsize::new(0);
    let failure: Mutex<Option<Failure>> = Mutex::new(None);
    // Per partition: decided, or how far its search got when it was stopped.
    let progress: Mutex<Vec<Option<usize>>> = Mutex::new(vec![Some(0); partitions.len()]);
    let threads = match options.threads {
        0 => std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1),
        n => n,
    }
    .min(partitions.len().max(1));

    std::thread::scope(|scope| {
        for _ in 0..threads {
            scope.spawn(|| {
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    let Some((key, ops)) = partitions.get(i) else { break };
                    if cancel.load(Ordering::Relaxed) {
                        break;
                    }
                    let model_ops = reduce(ops, options.prune);
                    let result = check_partition(&model_ops, until, &cancel, options.prune);
                    progress.lock()[i] = match &result {
                        PartitionResult::Cancelled { placed } => Some(*placed),
                        _ => None,
                    };
                    match result {
                        PartitionResult::Linearizable => {}
                        PartitionResult::NotLinearizable { longest, stuck } => {
                            let mut f = failure.lock();
                            if f.is_none() {
                                *f = Some(Failure {
                                    key: key.to_string(),
                                    operations: ops.iter().map(|o| (*o).clone()).collect(),
                                    longest_prefix: longest,
                                    stuck,
                                });
                            }
                            cancel.store(true, Ordering::Relaxed);
                        }
                        PartitionResult::Cancelled { .. } => {
                            if until.is_some_and(|u| Instant::now() >= u) {
                                timed_out.store(true, Ordering::Relaxed);
                            }
                            cancel.store(true, Ordering::Relaxed);
                        }
                    }
                }
            });
        }
    });

    let verdict = match failure.into_inner() {
        Some(f) => Verdict::NotLinearizable(Box::new(f)),
        None if timed_out.load(Ordering::Relaxed) => {
            let undecided: Vec<Undecided> = partitions
                .iter()
                .zip(progress.into_inner())
                .filter_map(|((key, ops), placed)| {
                    Some(Undecided {
                        key: key.to_string(),
                        operations: ops.len(),
                        placed: placed?,
                    })
                })
                .collect();
            let shown: Vec<String> = undecided
                .iter()
                .take(5)
                .map(|u| format!("{:?} ({} of {} ops placed)", u.key, u.placed, u.operations))
                .collect();
            Verdict::Unknown {
                reason: format!(
                    "deadline of {:?} passed with {} of {keys} keys undecided: {}{}; no verdict was \
                     reached for them, so give the check more time (kvbench check --deadline)",
                    options.deadline.unwrap_or_default(),
                    undecided.len(),
                    shown.join(", "),
                    if undecided.len() > shown.len() { ", ..." } else { "" }
                ),
                undecided,
            }
        }
        None => Verdict::Linearizable,
    };
    CheckReport {
        verdict,
        operations: history.operations.len(),
        keys,
        elapsed_ms: start.elapsed().as_secs_f64() * 1000.0,
    }
}

/// How far a time to live's end may stray from its put's interval, each way: the server
/// keeps deadlines in whole milliseconds of its wall clock, the history another clock.
pub const EXPIRY_SLACK_NS: u64 = 2_000_000;

/// For every put with a time to live, the moment its time ran out, as an op (`Expiry`)
/// the search places like any other: somewhere from the put's call plus its time to live
/// to its return plus its time to live (widened by `EXPIRY_SLACK_NS`, 2 ms), since the server
/// starts the clock when the put takes effect; and only after its put is placed (the
/// search holds it to that: `ModelOp::after`). It removes the key only if the key still
/// holds that put's value (a later write ended the time to live). So a read that returns a
/// value after its time surely ran out has no valid order. (Public for the reference checker in the tests.)
pub fn expiries(history: &History) -> Vec<Operation> {
    let expiry = |op: &Operation, value: &str, ttl_ms: u64| {
        let ttl = ttl_ms.saturating_mul(1_000_000);
        Operation {
            client: u32::MAX,
            key: op.key.clone(),
            call: Call::Expiry {
                value: value.to_string(),
            },
            ret: Return::Stored,
            call_ns: op.call_ns.saturating_add(ttl).saturating_sub(EXPIRY_SLACK_NS),
            return_ns: op.return_ns.saturating_add(ttl).saturating_add(EXPIRY_SLACK_NS),
        }
    };
    // An unknown put has none: it may take effect at any time after its call, so nothing
    // would keep its expiry after it (the model lets its value live on: lenient, never wrong).
    let ttl_puts = history.operations.iter().filter_map(|op| match (&op.call, &op.ret) {
        (_, Return::Unknown) => None,
        (Call::PutTtl { value, ttl_ms }, _) => Some(expiry(op, value, *ttl_ms)),
        _ => None,
    });
    ttl_puts.collect()
}

/// The set of linearized ops, kept so that its memo key stays small.
///
/// Ops are indexed in call order, and the search linearizes them roughly in that order, so
/// the set is nearly always "every op below some frontier, plus a few beyond it". The memo
/// key is exactly that: the frontier and the few extra indexes. It identifies the set exactly
/// (no hashing shortcuts) while costing a few words instead of n bits per memo entry.
struct Linearized {
    words: Vec<u64>,
    /// Every op below `frontier` is linearized; op `frontier` is not.
    frontier: usize,
    count: usize,
    n: usize,
}

impl Linearized {
    fn new(n: usize) -> Linearized {
        Linearized {
            words: vec![0; n.div_ceil(64)],
            frontier: 0,
            count: 0,
            n,
        }
    }

    fn set(&mut self, i: usize) {
        self.words[i / 64] |= 1 << (i % 64);
        self.count += 1;
        if i == self.frontier {
            self.advance();
        }
    }

    fn contains(&self, i: usize) -> bool {
        self.words.get(i / 64).is_some_and(|w| w & (1 << (i % 64)) != 0)
    }

    fn clear(&mut self, i: usize) {
        self.words[i / 64] &= !(1 << (i % 64));
        self.count -= 1;
        self.frontier = self.frontier.min(i);
    }

    /// Moves the frontier past set bits, a word at a time.
    fn advance(&mut self) {
        while self.frontier < self.n {
            let (w, b) = (self.frontier / 64, self.frontier % 64);
            let ones = (self.words[w] >> b).trailing_ones() as usize;
            if ones == 0 {
                break;
            }
            self.frontier += ones.min(64 - b);
        }
        self.frontier = self.frontier.min(self.n);
    }

    /// The frontier followed by the linearized indexes above it.
    fn key(&self) -> Box<[u32]> {
        let mut extra = self.count - self.frontier;
        let mut key = Vec::with_capacity(extra + 1);
        key.push(self.frontier as u32);
        let mut w = self.frontier / 64;
        let mut word = self.words.get(w).copied().unwrap_or(0) & (!0u64 << (self.frontier % 64));
        while extra > 0 {
            while word == 0 {
                w += 1;
                word = self.words[w];
            }
            let bit = word.trailing_zeros() as usize;
            key.push((w * 64 + bit) as u32);
            word &= word - 1;
            extra -= 1;
        }
        key.into_boxed_slice()
    }
}

const NIL: usize = usize::MAX;

/// One call or return in the time-ordered event list.
#[derive(Clone, Copy)]
struct Event {
    op: usize,
    is_return: bool,
    /// For a call: the index of its return event.
    partner: usize,
}

/// Decides one key's history. `ops` are in call order.
fn check_partition(ops: &[ModelOp], until: Option<Instant>, cancel: &AtomicBool, prune: bool) -> PartitionResult {
    let n = ops.len();
    if n == 0 {
        return PartitionResult::Linearizable;
    }
    // Events in time order; at equal times calls come first (treating touching intervals as
    // concurrent, the permissive reading).
    let mut order: Vec<(u64, bool, usize)> = Vec::with_capacity(2 * n);
    for (i, op) in ops.iter().enumerate() {
        order.push((op.call, false, i));
        order.push((op.ret, true, i));
    }
    order.sort_unstable();
    let mut events: Vec<Event> = order
        .iter()
        .map(|&(_, is_return, op)| Event {
            op,
            is_return,
            partner: NIL,
        })
        .collect();
    let mut return_at = vec![NIL; n];
    for (pos, e) in events.iter().enumerate() {
        if e.is_return {
            return_at[e.op] = pos;
        }
    }
    for e in events.iter_mut() {
        if !e.is_return {
            e.partner = return_at[e.op];
        }
    }

    // Doubly linked list over event positions; `head` is a sentinel.
    let m = events.len();
    let head = m;
    let mut next: Vec<usize> = (1..=m).collect();
    next[m - 1] = NIL;
    next.push(0);
    let mut prev: Vec<usize> = std::iter::once(head).chain(0..m - 1).collect();
    prev.push(NIL);

    let unlink = |next: &mut Vec<usize>, prev: &mut Vec<usize>, e: usize| {
        next[prev[e]] = next[e];
        if next[e] != NIL {
            prev[next[e]] = prev[e];
        }
    };
    let relink = |next: &mut Vec<usize>, prev: &mut Vec<usize>, e: usize| {
        next[prev[e]] = e;
        if next[e] != NIL {
            prev[next[e]] = e;
        }
    };

    let mut state = 0u32;
    let mut linearized = Linearized::new(n);
    let mut memo: HashSet<(Box<[u32]>, u32)> = HashSet::new();
    // (call event, state before it, whether it was an observer placed by the rule below)
    let mut stack: Vec<(usize, u32, bool)> = Vec::new();
    let mut best: Vec<usize> = Vec::new();
    let mut best_stuck: Option<usize> = None;
    let mut entry = next[head];
    // True when the search has just arrived at a configuration (after placing an op).
    let mut fresh = true;
    let mut steps: u64 = 0;
    // The most ops placed at once so far, for the report when the deadline stops the search.
    let mut deepest = 0;

    'search: loop {
        deepest = deepest.max(stack.len());
        if next[head] == NIL {
            return PartitionResult::Linearizable;
        }
        steps += 1;
        if steps.is_multiple_of(4096) && (cancel.load(Ordering::Relaxed) || until.is_some_and(|u| Instant::now() >= u))
        {
            return PartitionResult::Cancelled { placed: deepest };
        }
        // Observers first. An op that never changes the state (a read, a delete that found
        // nothing) and may be placed now can be placed now: in any valid order from here,
        // moving it to the front keeps every answer right (the state it sees is this one,
        // and it changes nothing for the ops it jumps) and keeps real-time order (every op
        // that returned before it was called is placed already). So this configuration
        // succeeds exactly when it succeeds with that observer next, and the search never
        // tries orders that only differ in where such ops go: the exponential corner of
        // many concurrent reads and empty deletes.
        let mut backtrack = false;
        if fresh && prune {
            fresh = false;
            let mut e = next[head];
            while e != NIL && !events[e].is_return {
                let kind = ops[events[e].op].kind;
                let ready = ops[events[e].op].after.is_none_or(|j| linearized.contains(j));
                if ready && kind.is_observer_at(state) && step(state, kind).is_some() {
                    let op = events[e].op;
                    linearized.set(op);
                    if memo.insert((linearized.key(), state)) {
                        stack.push((e, state, true));
                        unlink(&mut next, &mut prev, e);
                        unlink(&mut next, &mut prev, events[e].partner);
                        entry = next[head];
                        fresh = true;
                        continue 'search;
                    }
                    // Explored before, and it failed: so does this configuration.
                    linearized.clear(op);
                    backtrack = true;
                    break;
                }
                e = next[e];
            }
        }
        // Reaching the end of the list cannot happen while it still holds a call and its
        // return (the return comes later); if it did, backtrack as at a return.
        //
        // Among candidates of one kind (the same put value, or two deletes that found the
        // key), only the one that returns first is tried: in any valid order from here that
        // starts with another of them, swapping the two gives a valid order too (same state
        // changes; and the one returning first may go first in real time). So trying the
        // others too would only repeat work.
        if !backtrack && entry != NIL && !events[entry].is_return {
            let ev = events[entry];
            let kind = ops[ev.op].kind;
            let twin_first = prune && {
                let me = (ops[ev.op].ret, ev.op);
                let mut e = next[head];
                let mut found = false;
                while e != NIL && !events[e].is_return {
                    let other = events[e].op;
                    if e != entry && ops[other].kind == kind && (ops[other].ret, other) < me {
                        found = true;
                        break;
                    }
                    e = next[e];
                }
                found
            };
            // An expiry goes only after its put.
            let ready = ops[ev.op].after.is_none_or(|j| linearized.contains(j));
            if let Some(new_state) = step(state, kind).filter(|_| ready && !twin_first) {
                linearized.set(ev.op);
                if memo.insert((linearized.key(), new_state)) {
                    stack.push((entry, state, false));
                    state = new_state;
                    unlink(&mut next, &mut prev, entry);
                    unlink(&mut next, &mut prev, ev.partner);
                    entry = next[head];
                    fresh = true;
                    continue;
                }
                linearized.clear(ev.op);
            }
            entry = next[entry];
            continue;
        }
        // An op's return came before it could be placed: the order so far is wrong.
        // Remember the deepest such point for the report (copied only here, at a
        // backtrack, so a search that never backtracks stays linear).
        if !backtrack && entry != NIL && (stack.len() > best.len() || best.is_empty() && best_stuck.is_none()) {
            best = stack.iter().map(|&(e, _, _)| events[e].op).collect();
            best_stuck = Some(events[entry].op);
        }
        // Undo the last placement and try the next candidate after it; an observer placed
        // by the rule has no alternative at its configuration, so undo past it too.
        loop {
            let Some((call_e, prev_state, observer)) = stack.pop() else {
                break 'search;
            };
            let call = events[call_e];
            linearized.clear(call.op);
            state = prev_state;
            relink(&mut next, &mut prev, call.partner);
            relink(&mut next, &mut prev, call_e);
            if !observer {
                entry = next[call_e];
                break;
            }
        }
    }
    PartitionResult::NotLinearizable {
        longest: best,
        stuck: best_stuck,
    }
}

#[cfg(test)]
mod tests {
    use super::super::{Call, Return};
    use super::*;

    fn op(client: u32, call: Call, ret: Return, t0: u64, t1: u64) -> Operation {
        Operation {
            client,
            key: "k".into(),
            call,
            ret,
            call_ns: t0,
            return_ns: t1,
        }
    }
    fn put(c: u32, v: &str, t0: u64, t1: u64) -> Operation {
        op(c, Call::Put { value: v.into() }, Return::Stored, t0, t1)
    }
    fn get(c: u32, v: Option<&str>, t0: u64, t1: u64) -> Operation {
        op(
            c,
            Call::Get,
            Return::Value {
                value: v.map(String::from),
            },
            t0,
            t1,
        )
    }
    fn del(c: u32, existed: bool, t0: u64, t1: u64) -> Operation {
        op(c, Call::Delete, Return::Deleted { existed }, t0, t1)
    }
    fn verdict(ops: Vec<Operation>) -> Verdict {
        check(&History { operations: ops }, &CheckOptions::default()).verdict
    }
    fn is_lin(ops: Vec<Operation>) -> bool {
        matches!(verdict(ops), Verdict::Linearizable)
    }

    const MS: u64 = 1_000_000;

    fn put_ttl(c: u32, v: &str, ttl_ms: u64, t0: u64, t1: u64) -> Operation {
        let call = Call::PutTtl {
            value: v.into(),
            ttl_ms,
        };
        op(c, call, Return::Stored, t0 * MS, t1 * MS)
    }

    fn get_ms(c: u32, v: Option<&str>, t0: u64, t1: u64) -> Operation {
        get(c, v, t0 * MS, t1 * MS)
    }

    /// A value read after its time to live surely ran out is caught, and so is one gone
    /// before its time could have run out; a later write ends the time to live.
    #[test]
    fn times_to_live_hold_reads_to_them() {
        // Read while alive, missing once surely gone: fine.
        assert!(is_lin(vec![
            put_ttl(0, "a", 10, 0, 1),
            get_ms(1, Some("a"), 5, 6),
            get_ms(1, None, 20, 21),
        ]));
        // Read 19 ms after a 10 ms time to live began: caught.
        match verdict(vec![put_ttl(0, "a", 10, 0, 1), get_ms(1, Some("a"), 20, 21)]) {
            Verdict::NotLinearizable(f) => {
                assert!(f.operations.iter().any(|o| o.label() == "expiry(a)"), "{f:?}");
            }
            v => panic!("a read after the deadline passed: {v:?}"),
        }
        // Gone 3 ms into a 10 ms time to live: caught.
        assert!(!is_lin(vec![put_ttl(0, "a", 10, 0, 1), get_ms(1, None, 3, 4)]));
        // Near the deadline either answer is right (the put's interval and the slack).
        assert!(is_lin(vec![put_ttl(0, "a", 10, 0, 2), get_ms(1, Some("a"), 11, 11)]));
        assert!(is_lin(vec![put_ttl(0, "a", 10, 0, 2), get_ms(1, None, 9, 9)]));
        // A plain put after it ends the time to live; another put's has its own.
        assert!(is_lin(vec![
            put_ttl(0, "a", 10, 0, 1),
            put(0, "b", 2 * MS, 3 * MS),
            get_ms(1, Some("b"), 30, 31),
        ]));
        assert!(!is_lin(vec![
            put_ttl(0, "a", 100, 0, 1),
            put_ttl(0, "b", 10, 2, 3),
            get_ms(1, Some("b"), 30, 31),
        ]));
        // A slow put whose time ran out before its reply came: the key may be gone while
        // the put is still in flight (seen in a durable run: a 2 ms time to live, a 1.7 ms put).
        assert!(is_lin(vec![
            put(0, "b", 0, MS / 10),
            get_ms(1, Some("b"), 1, 1),
            put_ttl(0, "a", 2, 2, 6),
            get_ms(1, None, 5, 5),
            get_ms(1, None, 9, 9),
        ]));
        // But never before the put was called.
        assert!(!is_lin(vec![
            put(0, "b", 0, MS / 10),
            get_ms(1, None, 1, 1),
            put_ttl(0, "a", 2, 2, 6)
        ]));
        // An unknown put with a time to live may or may not have happened (and its value
        // may live on: it has no expiry).
        let lost = op(
            0,
            Call::PutTtl {
                value: "a".into(),
                ttl_ms: 10,
            },
            Return::Unknown,
            0,
            MS,
        );
        assert!(is_lin(vec![lost, get_ms(1, Some("a"), 5, 6)]));
    }

    #[test]
    fn sequential_histories() {
        assert!(is_lin(vec![]));
        assert!(is_lin(vec![
            get(0, None, 0, 1),
            put(0, "a", 2, 3),
            get(0, Some("a"), 4, 5)
        ]));
        assert!(is_lin(vec![
            put(0, "a", 0, 1),
            del(0, true, 2, 3),
            del(0, false, 4, 5),
            get(0, None, 6, 7)
        ]));
        assert!(!is_lin(vec![put(0, "a", 0, 1), get(0, None, 2, 3)]));
    }

    #[test]
    fn overlapping_operations_may_take_effect_in_either_order() {
        // Two overlapping puts; readers after both may see either, but all must agree.
        assert!(is_lin(vec![
            put(0, "a", 0, 10),
            put(1, "b", 1, 9),
            get(2, Some("a"), 11, 12),
            get(3, Some("a"), 13, 14)
        ]));
        assert!(is_lin(vec![
            put(0, "a", 0, 10),
            put(1, "b", 1, 9),
            get(2, Some("b"), 11, 12)
        ]));
        assert!(!is_lin(vec![
            put(0, "a", 0, 10),
            put(1, "b", 1, 9),
            get(2, Some("b"), 11, 12),
            get(3, Some("a"), 13, 14)
        ]));
        // A read overlapping a write may see the old or the new value.
        assert!(is_lin(vec![
            put(0, "a", 0, 1),
            put(1, "b", 2, 10),
            get(2, Some("a"), 3, 4)
        ]));
        assert!(is_lin(vec![
            put(0, "a", 0, 1),
            put(1, "b", 2, 10),
            get(2, Some("b"), 3, 4)
        ]));
    }

    #[test]
    fn a_stale_read_is_caught() {
        let v = verdict(vec![put(0, "a", 0, 1), put(0, "b", 2, 3), get(1, Some("a"), 4, 5)]);
        let Verdict::NotLinearizable(f) = v else {
            panic!("stale read accepted: {v:?}")
        };
        assert_eq!(f.key, "k");
        assert_eq!(f.longest_prefix, vec![0, 1]);
        assert_eq!(f.stuck, Some(2));
    }

    #[test]
    fn a_lost_update_is_caught() {
        // Both writes were acknowledged before the reads; the reads disagree with any order.
        assert!(!is_lin(vec![
            put(0, "a", 0, 1),
            put(1, "b", 0, 1),
            get(2, Some("a"), 2, 3),
            get(2, Some("b"), 4, 5),
        ]));
    }

    #[test]
    fn a_value_never_written_is_caught() {
        assert!(!is_lin(vec![put(0, "a", 0, 1), get(1, Some("zzz"), 2, 3)]));
    }

    #[test]
    fn a_read_that_sees_a_write_before_it_was_called_is_caught() {
        assert!(!is_lin(vec![get(1, Some("a"), 0, 1), put(0, "a", 2, 3)]));
        // But a read overlapping the put's call may see it.
        assert!(is_lin(vec![get(1, Some("a"), 0, 3), put(0, "a", 2, 4)]));
    }

    #[test]
    fn unknown_outcomes_may_or_may_not_have_happened() {
        let lost = op(0, Call::Put { value: "a".into() }, Return::Unknown, 0, 1);
        assert!(is_lin(vec![lost.clone(), get(1, None, 5, 6)]));
        assert!(is_lin(vec![lost.clone(), get(1, Some("a"), 5, 6)]));
        // If it took effect it did so after its call, never before.
        assert!(!is_lin(vec![get(1, Some("a"), 0, 1), lost_at(2)]));
        fn lost_at(t: u64) -> Operation {
            op(0, Call::Put { value: "a".into() }, Return::Unknown, t, t + 1)
        }
    }

    #[test]
    fn keys_are_independent() {
        let mut other = put(0, "x", 0, 1);
        other.key = "other".into();
        let mut read_other = get(1, Some("x"), 2, 3);
        read_other.key = "other".into();
        assert!(is_lin(vec![
            put(0, "a", 0, 1),
            other,
            get(1, Some("a"), 2, 3),
            read_other
        ]));
    }

    #[test]
    fn the_memo_key_is_the_frontier_and_the_extras() {
        let mut l = Linearized::new(200);
        for i in [0, 1, 2, 5, 130] {
            l.set(i);
        }
        assert_eq!(&*l.key(), &[3, 5, 130]);
        l.set(3);
        l.set(4);
        assert_eq!(&*l.key(), &[6, 130]);
        l.clear(1);
        assert_eq!(&*l.key(), &[1, 2, 3, 4, 5, 130]);
        for i in (0..200).filter(|&i| i != 1) {
            if ![0, 2, 3, 4, 5, 130].contains(&i) {
                l.set(i);
            }
        }
        l.set(1);
        assert_eq!(&*l.key(), &[200]);
    }

    #[test]
    fn the_deadline_gives_unknown() {
        // Many fully concurrent puts and gets: a large search, cut short by a zero deadline.
        let mut ops = Vec::new();
        for i in 0..200u64 {
            ops.push(put(i as u32, &format!("v{i}"), 0, 1000));
            ops.push(get(i as u32, Some(&format!("v{}", (i * 7) % 200)), 0, 1000));
        }
        ops.push(get(999, Some("never"), 2000, 2001));
        let r = check(
            &History { operations: ops },
            &CheckOptions {
                deadline: Some(Duration::ZERO),
                threads: 1,
                prune: false,
            },
        );
        let Verdict::Unknown { reason, undecided } = &r.verdict else {
            panic!("{:?}", r.verdict)
        };
        assert_eq!(undecided.len(), 1);
        assert_eq!((undecided[0].key.as_str(), undecided[0].operations), ("k", 401));
        assert!(
            reason.contains("1 of 1 keys undecided") && reason.contains("--deadline"),
            "{reason}"
        );
    }
}
