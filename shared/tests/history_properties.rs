//! Properties of the checker: histories made from a real sequential execution, with random
//! overlapping intervals around each op's moment of effect, are always linearizable; the
//! same histories with one injected anomaly are always caught.

use std::collections::HashMap;

use kvshared::history::{Call, CheckOptions, History, Operation, Return, Verdict, check};
use proptest::prelude::*;

#[derive(Clone, Debug)]
struct Step {
    kind: u8,
    key: u8,
    client: u32,
    before: u64,
    after: u64,
    unknown: bool,
}

fn steps() -> impl Strategy<Value = Vec<Step>> {
    proptest::collection::vec(
        (
            0u8..3,
            0u8..3,
            0u32..6,
            0u64..40,
            0u64..40,
            proptest::bool::weighted(0.05),
        )
            .prop_map(|(kind, key, client, before, after, unknown)| Step {
                kind,
                key,
                client,
                before,
                after,
                unknown,
            }),
        1..80,
    )
}

/// Runs the steps one at a time against a map (op i takes effect at time 10*i + 50) and
/// records each with an interval around that moment.
fn history(steps: &[Step]) -> History {
    let mut map: HashMap<u8, String> = HashMap::new();
    let mut ops = Vec::new();
    for (i, s) in steps.iter().enumerate() {
        let at = 10 * i as u64 + 50;
        let key = format!("k{}", s.key);
        let (call, ret) = match s.kind {
            0 => (
                Call::Get,
                Return::Value {
                    value: map.get(&s.key).cloned(),
                },
            ),
            1 => {
                let v = format!("v{i}");
                map.insert(s.key, v.clone());
                (Call::Put { value: v }, Return::Stored)
            }
            _ => (
                Call::Delete,
                Return::Deleted {
                    existed: map.remove(&s.key).is_some(),
                },
            ),
        };
        // An op whose answer was lost still took effect here; the checker must allow that.
        let ret = if s.unknown { Return::Unknown } else { ret };
        ops.push(Operation {
            client: s.client,
            key,
            call,
            ret,
            call_ns: at - s.before,
            return_ns: at + s.after,
        });
    }
    History { operations: ops }
}

fn verdict(h: &History) -> Verdict {
    check(h, &CheckOptions::default()).verdict
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 300, ..ProptestConfig::default() })]

    #[test]
    fn histories_of_a_sequential_execution_are_linearizable(steps in steps()) {
        let h = history(&steps);
        prop_assert_eq!(verdict(&h), Verdict::Linearizable);
    }

    #[test]
    fn a_read_of_a_value_never_written_is_caught(steps in steps(), pick in any::<prop::sample::Index>()) {
        let mut h = history(&steps);
        let gets: Vec<usize> = (0..h.operations.len())
            .filter(|&i| matches!(h.operations[i].ret, Return::Value { .. }))
            .collect();
        prop_assume!(!gets.is_empty());
        let g = gets[pick.index(gets.len())];
        h.operations[g].ret = Return::Value { value: Some("ghost".into()) };
        prop_assert!(matches!(verdict(&h), Verdict::NotLinearizable(_)));
    }

    #[test]
    fn a_stale_read_is_caught(steps in steps(), pick in any::<prop::sample::Index>()) {
        let mut h = history(&steps);
        let ops = &h.operations;
        let known_put = |i: usize| matches!(ops[i].call, Call::Put { .. }) && ops[i].ret == Return::Stored;
        // (get, stale value): a put P1 of the value, then a put P2 of the same key strictly
        // after P1, both finished before the get was called.
        let mut candidates = Vec::new();
        for g in 0..ops.len() {
            if !matches!(ops[g].ret, Return::Value { .. }) {
                continue;
            }
            for p1 in (0..ops.len()).filter(|&i| known_put(i) && ops[i].key == ops[g].key) {
                let overwritten = (0..ops.len()).any(|p2| {
                    known_put(p2)
                        && ops[p2].key == ops[g].key
                        && ops[p1].return_ns < ops[p2].call_ns
                        && ops[p2].return_ns < ops[g].call_ns
                });
                if overwritten && let Call::Put { value } = &ops[p1].call {
                    candidates.push((g, value.clone()));
                }
            }
        }
        prop_assume!(!candidates.is_empty());
        let (g, stale) = candidates[pick.index(candidates.len())].clone();
        h.operations[g].ret = Return::Value { value: Some(stale) };
        prop_assert!(matches!(verdict(&h), Verdict::NotLinearizable(_)));
    }
}
