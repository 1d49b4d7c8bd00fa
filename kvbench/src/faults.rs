//! `kvbench check --faults FILE`: how long each injected fault kept its shard from
//! answering, as the recording clients saw it.
//!
//! The fault log is what `scripts/run-cluster.sh --nemesis` writes, one fault a line,
//! tab-separated: the time it was injected (Unix ms), the shard it hit, the fault's name,
//! and free text. A fault's unavailability is the time from the fault to the return of the
//! first op on that shard begun after it that was acknowledged: for a follower's pause
//! that is one round trip, for a leader's death the election and the client's retries.

use kvshared::history::{History, Return};
use kvshared::routing::owner_node;

/// One injected fault.
#[derive(Debug, Clone, PartialEq)]
pub struct Fault {
    pub unix_ms: u64,
    pub shard: u32,
    pub name: String,
    pub note: String,
}

/// Reads a fault log; a line that does not parse is refused with its number.
pub fn parse(text: &str) -> Result<Vec<Fault>, String> {
    let mut out = Vec::new();
    for (n, line) in text.lines().enumerate() {
        if line.trim().is_empty() || line.starts_with('#') {
            continue;
        }
        let mut f = line.splitn(4, '\t');
        let bad = |what: &str| format!("line {}: {what} ({line:?})", n + 1);
        let unix_ms = f
            .next()
            .and_then(|t| t.trim().parse().ok())
            .ok_or_else(|| bad("no time in Unix ms"))?;
        let shard = f
            .next()
            .and_then(|t| t.trim().parse().ok())
            .ok_or_else(|| bad("no shard number"))?;
        let name = f
            .next()
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .ok_or_else(|| bad("no fault name"))?;
        out.push(Fault {
            unix_ms,
            shard,
            name: name.to_string(),
            note: f.next().unwrap_or("").trim().to_string(),
        });
    }
    Ok(out)
}

/// For each fault, the milliseconds until its shard acknowledged an op begun after it
/// (`None`: none was, before the recording ended). `started_unix_ms` is the Unix time of
/// the history's clock zero; `shards`, the cluster's shard count.
pub fn unavailability(history: &History, faults: &[Fault], started_unix_ms: u64, shards: u32) -> Vec<Option<f64>> {
    faults
        .iter()
        .map(|f| {
            let at_ns = f.unix_ms.saturating_sub(started_unix_ms) * 1_000_000;
            history
                .operations
                .iter()
                .filter(|o| o.ret != Return::Unknown && o.call_ns >= at_ns)
                .filter(|o| owner_node(o.key.as_bytes(), shards.max(1)) == f.shard)
                .map(|o| o.return_ns)
                .min()
                .map(|ns| (ns - at_ns) as f64 / 1e6)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use kvshared::history::{Call, Operation};

    fn op(key: &str, call_ms: u64, return_ms: u64, ret: Return) -> Operation {
        Operation {
            client: 0,
            key: key.into(),
            call: Call::Get,
            ret,
            call_ns: call_ms * 1_000_000,
            return_ns: return_ms * 1_000_000,
        }
    }

    #[test]
    fn a_fault_lasts_until_its_shard_acknowledges_an_op_begun_after_it() {
        let faults = parse("1000100\t0\tkill\thost 0\n# a comment\n\n1000300\t0\tpause\n").unwrap();
        assert_eq!(faults.len(), 2);
        assert_eq!(faults[1].note, "");
        let found = Return::Value { value: None };
        let history = History {
            operations: vec![
                // Begun before the first fault: does not count for it.
                op("a", 90, 95, found.clone()),
                op("a", 101, 2000, Return::Unknown),
                op("a", 150, 1500, found.clone()),
                op("a", 1400, 1450, found.clone()),
            ],
        };
        let got = unavailability(&history, &faults, 1_000_000, 1);
        assert_eq!(got, vec![Some(1350.0), Some(1150.0)]);
        // A shard no op went to never answered.
        let other = parse("1000100\t1\tkill\n").unwrap();
        assert_eq!(
            unavailability(&history, &other, 1_000_000, 2)[0].is_none(),
            owner_node(b"a", 2) != 1
        );
    }

    #[test]
    fn a_bad_line_is_refused_with_its_number() {
        let e = parse("1\t0\tkill\nsoon\t0\tkill\n").unwrap_err();
        assert!(e.starts_with("line 2: no time"), "{e}");
        assert!(parse("1\tx\tkill").unwrap_err().contains("no shard"));
        assert!(parse("1\t0\t").unwrap_err().contains("no fault name"));
    }
}
