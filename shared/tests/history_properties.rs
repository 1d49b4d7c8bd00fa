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

mod untrusted_files {
    use kvshared::history::{CheckOptions, History, check, render_timeline};
    use proptest::prelude::*;

    const VALID: &str = r#"{"operations":[
        {"client":0,"key":"k","call":{"op":"put","value":"a"},"return":{"result":"stored"},"call_ns":0,"return_ns":10},
        {"client":1,"key":"k","call":{"op":"get"},"return":{"result":"value","value":"b"},"call_ns":20,"return_ns":30},
        {"client":2,"key":"k","call":{"op":"delete"},"return":{"result":"deleted","existed":true},"call_ns":5,"return_ns":25},
        {"client":3,"key":"j","call":{"op":"put","value":"c"},"return":{"result":"unknown"},"call_ns":7,"return_ns":9}
    ]}"#;

    /// What `kvbench check --from` does with a file: parse, validate, and only then check
    /// and draw. Must never panic, whatever the bytes.
    fn load_and_check(bytes: &[u8]) {
        let Ok(history) = serde_json::from_slice::<History>(bytes) else {
            return;
        };
        if history.validate().is_err() {
            return;
        }
        let report = check(&history, &CheckOptions::default());
        if let kvshared::history::Verdict::NotLinearizable(f) = &report.verdict {
            let _ = render_timeline(f);
        }
    }

    #[test]
    fn a_return_before_its_call_is_refused_with_the_operation_named() {
        let bad = VALID.replace(r#""call_ns":20,"return_ns":30"#, r#""call_ns":20,"return_ns":3"#);
        let h: History = serde_json::from_str(&bad).unwrap();
        let err = h.validate().unwrap_err().to_string();
        assert!(err.contains("operation #1") && err.contains("before its call"), "{err}");
        let mismatched = VALID.replace(r#"{"result":"stored"}"#, r#"{"result":"deleted","existed":true}"#);
        let h: History = serde_json::from_str(&mismatched).unwrap();
        assert!(h.validate().unwrap_err().to_string().contains("put cannot answer"));
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

        #[test]
        fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..400)) {
            load_and_check(&bytes);
        }

        /// Valid JSON with its numbers and words changed: times out of order, huge or zero,
        /// kinds swapped, values missing.
        #[test]
        fn mutated_histories_never_panic(
            edits in proptest::collection::vec((0usize..VALID.len(), 0usize..8, any::<u64>()), 1..6)
        ) {
            let mut text = VALID.to_string();
            for (at, what, n) in edits {
                let at = (0..=at.min(text.len())).rev().find(|&i| text.is_char_boundary(i)).unwrap_or(0);
                let insert = match what {
                    0 => n.to_string(),
                    1 => "\"get\"".into(),
                    2 => "\"put\"".into(),
                    3 => "null".into(),
                    4 => "18446744073709551615".into(),
                    5 => "\"unknown\"".into(),
                    6 => "0".into(),
                    _ => String::new(),
                };
                let cut = (at + (n % 4) as usize).min(text.len());
                let cut = (cut..=text.len()).find(|&i| text.is_char_boundary(i)).unwrap_or(text.len());
                text.replace_range(at..cut, &insert);
            }
            load_and_check(text.as_bytes());
        }

        /// Any structurally valid history with times in any order: validation refuses the
        /// bad ones, and whatever passes can be checked and drawn.
        #[test]
        fn histories_with_any_times_never_panic(
            ops in proptest::collection::vec((0u32..4, 0u8..3, any::<u64>(), any::<u64>(), any::<bool>()), 0..30)
        ) {
            let operations = ops.into_iter().enumerate().map(|(i, (client, kind, t0, t1, unknown))| {
                use kvshared::history::{Call, Operation, Return};
                let (call, ret) = match kind {
                    0 => (Call::Get, Return::Value { value: Some(format!("v{}", i % 3)) }),
                    1 => (Call::Put { value: format!("v{i}") }, Return::Stored),
                    _ => (Call::Delete, Return::Deleted { existed: i % 2 == 0 }),
                };
                Operation { client, key: "k".into(), call, ret: if unknown { Return::Unknown } else { ret }, call_ns: t0, return_ns: t1 }
            }).collect();
            let h = History { operations };
            let valid = h.validate().is_ok();
            prop_assert_eq!(valid, h.operations.iter().all(|o| o.return_ns >= o.call_ns));
            let report = check(&h, &CheckOptions::default());
            if let kvshared::history::Verdict::NotLinearizable(f) = &report.verdict {
                let _ = render_timeline(f);
            }
        }
    }
}
