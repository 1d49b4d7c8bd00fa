//! Histories of concurrent operations and the linearizability checker.
//!
//! A [`History`] is what clients observed: each operation with the monotonic times just
//! before it was sent and just after its answer arrived. [`check`] decides whether some
//! order of the operations, consistent with those real-time intervals, explains every
//! answer under a per-key register model. No network code lives here: recording is done by
//! whoever runs the operations (kvbench check, the end-to-end tests).

mod checker;
mod model;
mod staleness;
mod timeline;

use std::time::Instant;

use serde::{Deserialize, Serialize};

pub use checker::{CheckOptions, CheckReport, Failure, Verdict, check, expiries};
pub use staleness::{Staleness, staleness};
pub use timeline::render_timeline;

/// What an operation asked for.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum Call {
    /// Read the key.
    Get,
    /// Write `value` to the key.
    Put {
        /// The value written (unique per put in a recorded history).
        value: String,
    },
    /// Remove the key.
    Delete,
    /// Write `value` with a time to live: the key is gone `ttl_ms` after the write takes
    /// effect, unless another write came first.
    PutTtl {
        /// The value written (unique per put in a recorded history).
        value: String,
        /// Its time to live, in milliseconds.
        ttl_ms: u64,
    },
    /// Not recorded by a client: the checker's stand-in for the moment a `PutTtl`'s time
    /// ran out (the key goes if it still holds `value`), placed in a window its put's
    /// interval and time to live give (see `checker::expiries`).
    Expiry {
        /// The value whose time ran out.
        value: String,
    },
}

/// What the operation's answer said.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "result", rename_all = "snake_case")]
pub enum Return {
    /// A get's answer; `None` means not found.
    Value {
        /// The value read.
        value: Option<String>,
    },
    /// A put was acknowledged.
    Stored,
    /// A delete's answer: whether the key existed.
    Deleted {
        /// Whether the key existed before the delete.
        existed: bool,
    },
    /// No answer (timeout, connection lost): the op may or may not have taken effect. The
    /// checker treats its return as the end of the history and accepts any outcome.
    Unknown,
}

/// One operation as a client saw it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Operation {
    /// The client that ran it (a client runs one op at a time).
    pub client: u32,
    /// The key it was about.
    pub key: String,
    /// What it asked for.
    pub call: Call,
    /// What the answer said.
    #[serde(rename = "return")]
    pub ret: Return,
    /// Nanoseconds on the recording clock just before the request was sent.
    pub call_ns: u64,
    /// Nanoseconds just after the answer arrived (for `Unknown`, when the client gave up).
    pub return_ns: u64,
}

impl Call {
    /// `get`, `put`, `delete`, `put_ttl` or `expiry`.
    pub fn name(&self) -> &'static str {
        match self {
            Call::Get => "get",
            Call::Put { .. } => "put",
            Call::Delete => "delete",
            Call::PutTtl { .. } => "put_ttl",
            Call::Expiry { .. } => "expiry",
        }
    }
}

impl Operation {
    /// A short label such as `put(c1-7)`, `get→c1-7`, `get→∅`, `del→true`, `put(x)?`.
    pub fn label(&self) -> String {
        let unknown = matches!(self.ret, Return::Unknown);
        let mut s = match (&self.call, &self.ret) {
            (Call::Put { value }, _) => format!("put({value})"),
            (Call::PutTtl { value, ttl_ms }, _) => format!("put({value}, ttl {ttl_ms}ms)"),
            (Call::Expiry { value }, _) => format!("expiry({value})"),
            (Call::Get, Return::Value { value: Some(v) }) => format!("get→{v}"),
            (Call::Get, Return::Value { value: None }) => "get→∅".to_string(),
            (Call::Get, _) => "get".to_string(),
            (Call::Delete, Return::Deleted { existed }) => format!("del→{existed}"),
            (Call::Delete, _) => "del".to_string(),
        };
        if unknown {
            s.push('?');
        }
        s
    }
}

/// A recorded history, as saved with `kvbench check --history`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct History {
    /// Every operation, in any order.
    pub operations: Vec<Operation>,
}

/// Largest history `validate` accepts, in operations.
pub const MAX_OPERATIONS: usize = 50_000_000;
/// Longest key or value `validate` accepts, in bytes.
pub const MAX_TEXT_LEN: usize = 1 << 20;

/// Why a history cannot be checked: the first operation that breaks a rule.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HistoryError {
    /// More operations than the checker takes.
    #[error("{count} operations, more than the {max} a history may hold")]
    TooLarge {
        /// Operations in the history.
        count: usize,
        /// The limit.
        max: usize,
    },
    /// An operation that breaks a rule.
    #[error("operation #{index} (client {client}, key {key:?}): {problem}")]
    BadOperation {
        /// Its position in the file.
        index: usize,
        /// Its client label.
        client: u32,
        /// Its key, cut to 40 characters.
        key: String,
        /// What is wrong with it.
        problem: String,
    },
}

impl History {
    /// Checks what the checker and the timeline rely on, for a history read from a file
    /// (untrusted input): every op returns no earlier than it was called, each answer fits
    /// its call (a get answers a value, a put `stored`, a delete `deleted`; any op may be
    /// `unknown`), and sizes are bounded.
    pub fn validate(&self) -> Result<(), HistoryError> {
        if self.operations.len() > MAX_OPERATIONS {
            return Err(HistoryError::TooLarge {
                count: self.operations.len(),
                max: MAX_OPERATIONS,
            });
        }
        let mut ttl_values = std::collections::HashSet::new();
        let plain: std::collections::HashSet<(&str, &str)> = self
            .operations
            .iter()
            .filter_map(|o| match &o.call {
                Call::Put { value } => Some((o.key.as_str(), value.as_str())),
                _ => None,
            })
            .collect();
        for (index, op) in self.operations.iter().enumerate() {
            let bad = |problem: String| HistoryError::BadOperation {
                index,
                client: op.client,
                key: op.key.chars().take(40).collect(),
                problem,
            };
            if op.return_ns < op.call_ns {
                return Err(bad(format!(
                    "returns at {} ns, before its call at {} ns",
                    op.return_ns, op.call_ns
                )));
            }
            if matches!(op.call, Call::Expiry { .. }) {
                return Err(bad("an expiry is the checker's, not a recorded op".into()));
            }
            if let Call::PutTtl { ttl_ms, value } = &op.call {
                if *ttl_ms > crate::expiry::MAX_TTL_MS {
                    return Err(bad(format!("a time to live past {} ms", crate::expiry::MAX_TTL_MS)));
                }
                let key_value = (op.key.as_str(), value.as_str());
                if !ttl_values.insert(key_value) || plain.contains(&key_value) {
                    return Err(bad("a put with a time to live writes a value another put of the key writes too (its expiry names it: values must be unique)".into()));
                }
            }
            let fits = matches!(
                (&op.call, &op.ret),
                (_, Return::Unknown)
                    | (Call::Get, Return::Value { .. })
                    | (Call::Put { .. } | Call::PutTtl { .. }, Return::Stored)
                    | (Call::Delete, Return::Deleted { .. })
            );
            if !fits {
                return Err(bad(format!("a {} cannot answer {:?}", op.call.name(), op.ret)));
            }
            let value_len = match (&op.call, &op.ret) {
                (Call::Put { value } | Call::PutTtl { value, .. }, _) => value.len(),
                (_, Return::Value { value: Some(v) }) => v.len(),
                _ => 0,
            };
            if op.key.len() > MAX_TEXT_LEN || value_len > MAX_TEXT_LEN {
                return Err(bad(format!("key or value longer than {MAX_TEXT_LEN} bytes")));
            }
        }
        Ok(())
    }

    /// Joins per-client logs into one history.
    pub fn from_clients(logs: Vec<Vec<Operation>>) -> History {
        History {
            operations: logs.into_iter().flatten().collect(),
        }
    }
}

/// The monotonic clock a recording uses; all clients of one history share it.
#[derive(Clone, Copy, Debug)]
pub struct Clock {
    base: Instant,
}

impl Default for Clock {
    fn default() -> Self {
        Clock { base: Instant::now() }
    }
}

impl Clock {
    /// A clock starting now.
    pub fn new() -> Clock {
        Clock::default()
    }

    /// Nanoseconds since the clock was made.
    pub fn now_ns(&self) -> u64 {
        self.base.elapsed().as_nanos() as u64
    }
}
