//! A text timeline of one key's operations, one row per client, for a person to read
//! when a check fails.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use super::checker::Failure;

/// Width of the time axis in characters.
const WIDTH: usize = 72;
/// At most this many operations are drawn (those nearest the failure).
const MAX_OPS: usize = 24;

/// Renders the operations around a failure: a bar per op (`[` call, `]` return) on its
/// client's row, the stuck op marked `!`, then the list of those ops with exact times.
pub fn render_timeline(f: &Failure) -> String {
    let ops = &f.operations;
    if ops.is_empty() {
        return String::new();
    }
    // Choose the ops nearest (in call time) to the one that got stuck.
    let focus = f.stuck.or_else(|| f.longest_prefix.last().copied()).unwrap_or(0);
    let focus_t = ops.get(focus).map(|o| o.call_ns).unwrap_or(0);
    let mut idx: Vec<usize> = (0..ops.len()).collect();
    idx.sort_by_key(|&i| ops[i].call_ns.abs_diff(focus_t));
    idx.truncate(MAX_OPS);
    idx.sort_by_key(|&i| (ops[i].call_ns, i));

    let t0 = idx.iter().map(|&i| ops[i].call_ns).min().unwrap_or(0);
    let end = |i: usize| {
        if ops[i].ret == super::Return::Unknown {
            ops[i].call_ns
        } else {
            ops[i].return_ns
        }
    };
    // The axis spans every drawn call and end, so no column can fall off the row, whatever
    // the times (a checked history has end >= call, but drawing must not rely on it).
    let t1 = idx
        .iter()
        .map(|&i| end(i).max(ops[i].call_ns))
        .max()
        .unwrap_or(t0)
        .max(t0.saturating_add(1));
    let col = |t: u64| {
        let c = ((t.saturating_sub(t0)) as f64 / (t1 - t0) as f64 * (WIDTH - 1) as f64) as usize;
        c.min(WIDTH - 1)
    };

    let mut rows: BTreeMap<u32, Vec<char>> = BTreeMap::new();
    let mut labels: BTreeMap<u32, Vec<String>> = BTreeMap::new();
    for &i in &idx {
        let o = &ops[i];
        let row = rows.entry(o.client).or_insert_with(|| vec![' '; WIDTH]);
        let (a, b) = (col(o.call_ns), col(end(i)).max(col(o.call_ns)));
        for c in row.iter_mut().take(b + 1).skip(a) {
            *c = '-';
        }
        row[a] = '[';
        row[b] = if o.ret == super::Return::Unknown { '>' } else { ']' };
        if Some(i) == f.stuck {
            row[a] = '!';
        }
        labels.entry(o.client).or_default().push(format!("#{i} {}", o.label()));
    }

    let mut s = String::new();
    let _ = writeln!(
        s,
        "key {:?}: {} ops drawn of {}, over {:.1} us ('!' = could not be placed next, '>' = no answer)",
        f.key,
        idx.len(),
        ops.len(),
        (t1 - t0) as f64 / 1000.0
    );
    for (client, row) in &rows {
        let line: String = row.iter().collect();
        let _ = writeln!(
            s,
            "client {client:>3} |{}| {}",
            line.trim_end(),
            labels[client].join(", ")
        );
    }
    let _ = writeln!(s);
    for &i in &idx {
        let o = &ops[i];
        let mark = if Some(i) == f.stuck { "  <- stuck" } else { "" };
        let _ = writeln!(
            s,
            "  #{i:<4} client {:>3}  {:<24} call {:>12} ns  return {:>12} ns{mark}",
            o.client,
            o.label(),
            o.call_ns,
            if o.ret == super::Return::Unknown {
                "?".to_string()
            } else {
                o.return_ns.to_string()
            }
        );
    }
    let prefix: Vec<String> = f.longest_prefix.iter().map(|i| format!("#{i}")).collect();
    let _ = writeln!(
        s,
        "longest valid order found ({} of {} ops): {}",
        prefix.len(),
        ops.len(),
        if prefix.len() > 30 {
            format!("... {}", prefix[prefix.len() - 30..].join(" "))
        } else {
            prefix.join(" ")
        }
    );
    s
}

#[cfg(test)]
mod tests {
    use super::super::{Call, Operation, Return};
    use super::*;

    #[test]
    fn a_stale_read_draws_one_row_per_client_and_marks_the_culprit() {
        let op = |client, call, ret, t0, t1| Operation {
            client,
            key: "user7".into(),
            call,
            ret,
            call_ns: t0,
            return_ns: t1,
        };
        let f = Failure {
            key: "user7".into(),
            operations: vec![
                op(0, Call::Put { value: "a".into() }, Return::Stored, 0, 1000),
                op(0, Call::Put { value: "b".into() }, Return::Stored, 2000, 3000),
                op(
                    1,
                    Call::Get,
                    Return::Value {
                        value: Some("a".into()),
                    },
                    4000,
                    5000,
                ),
            ],
            longest_prefix: vec![0, 1],
            stuck: Some(2),
        };
        let text = render_timeline(&f);
        assert!(text.contains("client   0 |["), "{text}");
        assert!(text.contains("client   1 |"), "{text}");
        assert!(text.contains("get→a") && text.contains("put(b)"));
        assert!(text.contains("<- stuck"));
        assert!(
            text.lines().any(|l| l.starts_with("client   1") && l.contains('!')),
            "{text}"
        );
    }
}
