//! The checker against a reference that is simple and obviously right: try every order of
//! the operations that respects real time (an op that returned before another was called
//! comes first), letting each op with an unknown outcome either happen somewhere after its
//! call or not at all, and run each order through a plain map. On random small histories,
//! with unknown outcomes and mutated answers, both must give the same verdict, with and
//! without the checker's observers-first rule.

use std::collections::{HashMap, HashSet};

use kvshared::history::{Call, CheckOptions, History, Operation, Return, Verdict, check, expiries};
use proptest::prelude::*;

/// Whether some real-time-respecting order explains every answer. A search over orders,
/// remembering each (ops placed, map) state already found to lead nowhere: without that, a
/// history of nine concurrent puts with a time to live (eighteen ops with their expiries)
/// whose verdict is "no" tried every order and ran for hours.
fn reference(ops: &[Operation]) -> bool {
    fn apply(op: &Operation, map: &mut HashMap<String, String>) -> bool {
        let now = map.get(&op.key).cloned();
        let ok = match (&op.call, &op.ret) {
            (_, Return::Unknown) => true,
            (Call::Get, Return::Value { value }) => *value == now,
            (Call::Put { .. } | Call::PutTtl { .. } | Call::Expiry { .. }, Return::Stored) => true,
            (Call::Delete, Return::Deleted { existed }) => *existed == now.is_some(),
            _ => false,
        };
        if ok {
            match &op.call {
                Call::Put { value } | Call::PutTtl { value, .. } => {
                    map.insert(op.key.clone(), value.clone());
                }
                Call::Delete => {
                    map.remove(&op.key);
                }
                Call::Expiry { value } if now.as_ref() == Some(value) => {
                    map.remove(&op.key);
                }
                Call::Get | Call::Expiry { .. } => {}
            }
        }
        ok
    }
    fn must_precede(a: &Operation, b: &Operation) -> bool {
        a.ret != Return::Unknown && a.return_ns < b.call_ns
    }
    type Failed = HashSet<(Vec<bool>, Vec<(String, String)>)>;
    fn search(ops: &[Operation], done: &mut Vec<bool>, map: &HashMap<String, String>, failed: &mut Failed) -> bool {
        // Finished when every op with a known answer is placed (unknown ones may never happen).
        if ops.iter().zip(done.iter()).all(|(o, &d)| d || o.ret == Return::Unknown) {
            return true;
        }
        let mut state: Vec<(String, String)> = map.iter().map(|(k, v)| (k.clone(), v.clone())).collect();
        state.sort_unstable();
        let state = (done.clone(), state);
        if failed.contains(&state) {
            return false;
        }
        for i in 0..ops.len() {
            if done[i] {
                continue;
            }
            // Every op that must come before this one is placed already.
            if (0..ops.len()).any(|j| !done[j] && j != i && must_precede(&ops[j], &ops[i])) {
                continue;
            }
            // An expiry comes after its put.
            if let Call::Expiry { value } = &ops[i].call {
                let put_done = (0..ops.len()).any(|j| {
                    done[j]
                        && ops[j].key == ops[i].key
                        && matches!(&ops[j].call, Call::PutTtl { value: v, .. } if v == value)
                });
                if !put_done {
                    continue;
                }
            }
            let mut next = map.clone();
            if apply(&ops[i], &mut next) {
                done[i] = true;
                if search(ops, done, &next, failed) {
                    return true;
                }
                done[i] = false;
            }
        }
        failed.insert(state);
        // An unknown op that is never placed: allowed, as long as the rest can be ordered.
        // (Covered above: unknown ops are not required for the finish.)
        false
    }
    // A put with a time to live brings its expiry, placed like any op (the window is the
    // checker's `expiries`; what is checked here is the search).
    let all: Vec<Operation> = ops
        .iter()
        .cloned()
        .chain(expiries(&History {
            operations: ops.to_vec(),
        }))
        .collect();
    search(&all, &mut vec![false; all.len()], &HashMap::new(), &mut HashSet::new())
}

fn history() -> impl Strategy<Value = Vec<Operation>> {
    let op = (
        0u32..4,
        0u8..2,
        0u8..4,
        0u8..4,
        0u64..10,
        0u64..8,
        proptest::bool::weighted(0.2),
    );
    proptest::collection::vec(op, 1..10).prop_map(|raw| {
        raw.into_iter()
            .enumerate()
            .map(|(i, (client, key, kind, answer, start, len, unknown))| {
                // Answers are drawn from a few values, so many are wrong (mutated) and some
                // are right by chance: both verdicts occur often.
                let seen = match answer {
                    0 => None,
                    3 if i % 3 == 0 => Some("t1".to_string()),
                    a => Some(format!("v{}", a + i as u8 % 2)),
                };
                let (call, ret) = match kind {
                    0 => (Call::Get, Return::Value { value: seen }),
                    // A value of its own (an expiry names it), read back by chance: `t1`.
                    3 => (
                        Call::PutTtl {
                            value: format!("t{i}"),
                            ttl_ms: u64::from(answer % 2),
                        },
                        Return::Stored,
                    ),
                    1 => (
                        Call::Put {
                            value: format!("v{}", 1 + i % 2),
                        },
                        Return::Stored,
                    ),
                    _ => (
                        Call::Delete,
                        Return::Deleted {
                            existed: answer % 2 == 0,
                        },
                    ),
                };
                Operation {
                    client,
                    key: format!("k{key}"),
                    call,
                    ret: if unknown { Return::Unknown } else { ret },
                    call_ns: start,
                    return_ns: start + len,
                }
            })
            .collect()
    })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 4000, ..ProptestConfig::default() })]

    #[test]
    fn the_checker_agrees_with_the_exhaustive_reference(ops in history()) {
        let expected = reference(&ops);
        let h = History { operations: ops };
        for prune in [true, false] {
            let options = CheckOptions { threads: 1, prune, ..CheckOptions::default() };
            let got = match check(&h, &options).verdict {
                Verdict::Linearizable => true,
                Verdict::NotLinearizable(_) => false,
                v @ Verdict::Unknown { .. } => panic!("no verdict on a tiny history: {v:?}"),
            };
            prop_assert_eq!(got, expected, "prune {}: {:#?}", prune, h);
        }
    }
}

/// The reference and the checker agree on the hand-made cases too (a sanity check of the
/// reference itself).
#[test]
fn the_reference_decides_known_cases() {
    let op = |call, ret, t0, t1| Operation {
        client: 0,
        key: "k".into(),
        call,
        ret,
        call_ns: t0,
        return_ns: t1,
    };
    let put = |v: &str, t0, t1| op(Call::Put { value: v.into() }, Return::Stored, t0, t1);
    let get = |v: Option<&str>, t0, t1| {
        op(
            Call::Get,
            Return::Value {
                value: v.map(String::from),
            },
            t0,
            t1,
        )
    };
    assert!(reference(&[put("a", 0, 1), get(Some("a"), 2, 3)]));
    assert!(!reference(&[put("a", 0, 1), put("b", 2, 3), get(Some("a"), 4, 5)]));
    assert!(reference(&[put("a", 0, 10), put("b", 1, 9), get(Some("a"), 11, 12)]));
    let lost = op(Call::Put { value: "a".into() }, Return::Unknown, 0, 1);
    assert!(reference(&[lost.clone(), get(None, 5, 6)]));
    assert!(reference(&[lost, get(Some("a"), 5, 6)]));
}

/// Two small, highly concurrent single-key histories that once sent the search into an
/// exponential corner (1 s and more than 60 s; a reference implementation of Porcupine
/// decides them in under a millisecond). Decided within the deadline, or the test fails.
#[test]
fn the_concurrent_single_key_cases_are_decided() {
    for (name, text) in [
        ("one-key-22-ops", include_str!("data/one-key-22-ops.json")),
        ("one-key-75-ops", include_str!("data/one-key-75-ops.json")),
    ] {
        let h: History = serde_json::from_str(text).unwrap();
        h.validate().unwrap();
        let options = CheckOptions {
            deadline: Some(std::time::Duration::from_secs(20)),
            threads: 1,
            ..CheckOptions::default()
        };
        assert_eq!(check(&h, &options).verdict, Verdict::Linearizable, "{name}");
    }
}
