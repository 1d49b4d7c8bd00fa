//! How stale a history's reads were: what `kvbench check --reads stale` reports, so that a
//! user can see whether a stated staleness bound (`--max-staleness`) held.
//!
//! For an acknowledged get that returned the value of put `W` (values are unique per put),
//! every acknowledged write to its key that *began after `W` returned* and *returned before
//! the get was called* was certainly in effect when the get began, and the get missed it.
//! The get is then stale by at least `call(get) - return(W')` for the earliest-returning such
//! write `W'` (a lower bound: it is what the history proves, whatever the clocks of the
//! nodes said). A get that returned nothing is judged the same way against the delete that
//! could explain it and returned last (any delete begun before the get returned; the start
//! when there is none). Gets whose value came
//! from a write of unknown outcome are never counted stale.

use std::collections::HashMap;

use super::{Call, History, Operation, Return};

/// The staleness a history proves.
#[derive(Clone, Debug, Default, PartialEq, serde::Serialize)]
pub struct Staleness {
    /// Acknowledged gets judged.
    pub gets: usize,
    /// Gets proven stale at all.
    pub stale: usize,
    /// The worst proven staleness, milliseconds.
    pub worst_ms: f64,
    /// Gets staler than the bound asked about (see [`staleness`]).
    pub over_bound: usize,
    /// The key and the labels of the worst get and the write it missed.
    pub worst: Option<(String, String, String)>,
}

/// The staleness of `history`'s gets, counting those staler than `bound_ns`.
pub fn staleness(history: &History, bound_ns: u64) -> Staleness {
    let mut by_key: HashMap<&str, Vec<&Operation>> = HashMap::new();
    for op in &history.operations {
        by_key.entry(op.key.as_str()).or_default().push(op);
    }
    let mut out = Staleness::default();
    for (key, ops) in by_key {
        one_key(key, &ops, bound_ns, &mut out);
    }
    out
}

fn one_key(key: &str, ops: &[&Operation], bound_ns: u64, out: &mut Staleness) {
    // Acknowledged writes, by call time; each put's return by value.
    let mut writes: Vec<&Operation> = ops
        .iter()
        .copied()
        .filter(|o| !matches!(o.call, Call::Get) && o.ret != Return::Unknown)
        .collect();
    writes.sort_by_key(|o| o.call_ns);
    let put_return: HashMap<&str, Option<u64>> = ops
        .iter()
        .filter_map(|o| match &o.call {
            Call::Put { value } | Call::PutTtl { value, .. } => {
                Some((value.as_str(), (o.ret != Return::Unknown).then_some(o.return_ns)))
            }
            _ => None,
        })
        .collect();
    for get in ops.iter().filter(|o| matches!(o.call, Call::Get)) {
        let Return::Value { value } = &get.ret else { continue };
        out.gets += 1;
        let origin = match value {
            Some(v) => match put_return.get(v.as_str()) {
                Some(Some(ret)) => *ret,
                _ => continue,
            },
            // Nothing: any delete that began before the get returned may explain it, and the
            // one that returned last proves the least. One of unknown outcome may have taken
            // effect at any time up to the get, so it proves nothing: the get is not judged.
            // (`Option`'s order puts `None` first: a max over returns with unknown ones as
            // `None` judged the get by a known delete instead.)
            None => {
                let deletes = ops
                    .iter()
                    .filter(|w| matches!(w.call, Call::Delete) && w.call_ns < get.return_ns);
                if deletes.clone().any(|w| w.ret == Return::Unknown) {
                    continue;
                }
                deletes.map(|w| w.return_ns).max().unwrap_or(0)
            }
        };
        let first = writes.partition_point(|w| w.call_ns <= origin);
        let missed = writes[first..]
            .iter()
            .take_while(|w| w.call_ns < get.call_ns)
            .filter(|w| w.return_ns < get.call_ns)
            .min_by_key(|w| w.return_ns);
        if let Some(w) = missed {
            let ns = get.call_ns - w.return_ns;
            out.stale += 1;
            if ns > bound_ns {
                out.over_bound += 1;
            }
            let ms = ns as f64 / 1e6;
            if ms > out.worst_ms {
                out.worst_ms = ms;
                out.worst = Some((key.to_string(), get.label(), w.label()));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn op(client: u32, call: Call, ret: Return, call_ms: u64, return_ms: u64) -> Operation {
        Operation {
            client,
            key: "k".into(),
            call,
            ret,
            call_ns: call_ms * 1_000_000,
            return_ns: return_ms * 1_000_000,
        }
    }

    fn put(v: &str, from: u64, to: u64) -> Operation {
        op(0, Call::Put { value: v.into() }, Return::Stored, from, to)
    }

    fn get(v: Option<&str>, from: u64, to: u64) -> Operation {
        op(
            1,
            Call::Get,
            Return::Value {
                value: v.map(Into::into),
            },
            from,
            to,
        )
    }

    #[test]
    fn a_get_that_misses_a_write_acknowledged_before_it_is_stale_by_the_gap() {
        let h = History {
            operations: vec![
                put("a", 0, 10),
                put("b", 20, 30),
                put("c", 40, 50),
                // Returns "a" at 2,000 ms: it missed "b" (acknowledged at 30 ms), stale by
                // 1,970 ms.
                get(Some("a"), 2_000, 2_010),
                // Returns "c": fresh.
                get(Some("c"), 2_000, 2_010),
                // Returns "b" at 60: missed "c" (returned at 50): stale by 10 ms.
                get(Some("b"), 60, 70),
                // Returns nothing before any delete: missed "a".
                get(None, 100, 110),
            ],
        };
        let mut with_delete = h.clone();
        // A delete concurrent with the nothing-get explains it: not stale; the get of "c" at
        // 2,000 ms now misses that delete (acknowledged at 400 ms).
        with_delete
            .operations
            .push(op(2, Call::Delete, Return::Deleted { existed: true }, 105, 400));
        let s = staleness(&with_delete, 500_000_000);
        assert_eq!((s.stale, s.over_bound), (3, 2));
        let s = staleness(&h, 500_000_000);
        assert_eq!((s.gets, s.stale, s.over_bound), (4, 3, 1));
        assert_eq!(s.worst_ms, 1_970.0);
        let (_, g, w) = s.worst.unwrap();
        assert_eq!((g.as_str(), w.as_str()), ("get→a", "put(b)"));
    }

    #[test]
    fn concurrent_writes_and_unknown_ones_are_not_counted() {
        let h = History {
            operations: vec![
                put("a", 0, 10),
                // Overlaps the get: the get may order before it.
                put("b", 20, 300),
                get(Some("a"), 100, 110),
                // A value from a write of unknown outcome: never judged stale.
                op(0, Call::Put { value: "x".into() }, Return::Unknown, 400, 5_000),
                put("c", 500, 510),
                get(Some("x"), 2_000, 2_010),
            ],
        };
        let s = staleness(&h, 1);
        assert_eq!(s.stale, 0);
    }

    /// The outside probe's smallest case: a read of nothing that a delete of unknown outcome
    /// explains is not stale, whatever known delete came before it.
    #[test]
    fn a_miss_that_an_unknown_delete_explains_is_not_stale() {
        let h = History {
            operations: vec![
                op(0, Call::Delete, Return::Deleted { existed: false }, 0, 1),
                put("a", 2, 3),
                op(0, Call::Delete, Return::Unknown, 4, 3_000),
                get(None, 3_001, 3_002),
            ],
        };
        let s = staleness(&h, 1_000_000);
        assert_eq!((s.stale, s.over_bound), (0, 0), "{s:?}");
    }
}
