//! A manager's decision as it is printed: what it asked (`add`, `remove`, `move`), then how
//! it ended (`added`, `removed`, `moved`, `failed`), each with the figures or the reason, as
//! one line of text or one JSON object (`--json`). Both levers print through here.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde::Serialize;

/// A decision as printed (one line, or one JSON object with `--json`).
#[derive(Serialize, Clone, Debug)]
pub struct DecisionLine {
    unix_ms: u64,
    shard: usize,
    /// `add`, `remove`, `added`, `removed`, `move` (slots from group `shard` to the group
    /// `member` names), `moved` or `failed`.
    action: String,
    member: String,
    why: String,
}

fn unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

pub fn decision(shard: usize, action: &str, member: &str, why: &str) -> DecisionLine {
    DecisionLine {
        unix_ms: unix_ms(),
        shard,
        action: action.into(),
        member: member.into(),
        why: why.into(),
    }
}

pub fn finished(asked: DecisionLine, done: &str, outcome: crate::control::error::Result<String>) -> DecisionLine {
    let (action, why) = match outcome {
        Ok(what) => (done.to_string(), what),
        Err(e) => (
            "failed".to_string(),
            format!("{} {}: {e:#}", asked.action, asked.member),
        ),
    };
    DecisionLine {
        unix_ms: unix_ms(),
        action,
        why,
        ..asked
    }
}

pub fn print(line: &DecisionLine, json: bool) -> crate::control::error::Result<()> {
    tracing::debug!(shard = line.shard, action = %line.action, member = %line.member, why = %line.why, "shard manager");
    if json {
        kvshared::outln!("{}", serde_json::to_string(line)?)?;
    } else {
        kvshared::outln!(
            "{} shard {} {} {}: {}",
            humantime::format_rfc3339_seconds(UNIX_EPOCH + Duration::from_millis(line.unix_ms)),
            line.shard,
            line.action,
            line.member,
            line.why
        )?;
    }
    Ok(())
}
