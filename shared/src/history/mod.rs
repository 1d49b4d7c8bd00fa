//! Histories of concurrent operations and the linearizability checker.
//!
//! A [`History`] is what clients observed: each operation with the monotonic times just
//! before it was sent and just after its answer arrived. [`check`] decides whether some
//! order of the operations, consistent with those real-time intervals, explains every
//! answer under a per-key register model. No network code lives here: recording is done by
//! whoever runs the operations (kvbench check, the end-to-end tests).

mod checker;
mod model;
mod timeline;

use std::time::Instant;

use serde::{Deserialize, Serialize};

pub use checker::{CheckOptions, CheckReport, Failure, Verdict, check};
pub use timeline::render_timeline;

/// What an operation asked for.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum Call {
    Get,
    Put { value: String },
    Delete,
}

/// What the operation's answer said.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "result", rename_all = "snake_case")]
pub enum Return {
    /// A get's answer; `None` means not found.
    Value { value: Option<String> },
    /// A put was acknowledged.
    Stored,
    /// A delete's answer: whether the key existed.
    Deleted { existed: bool },
    /// No answer (timeout, connection lost): the op may or may not have taken effect. The
    /// checker treats its return as the end of the history and accepts any outcome.
    Unknown,
}

/// One operation as a client saw it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Operation {
    pub client: u32,
    pub key: String,
    pub call: Call,
    #[serde(rename = "return")]
    pub ret: Return,
    /// Nanoseconds on the recording clock just before the request was sent.
    pub call_ns: u64,
    /// Nanoseconds just after the answer arrived (for `Unknown`, when the client gave up).
    pub return_ns: u64,
}

impl Operation {
    /// A short label such as `put(c1-7)`, `get→c1-7`, `get→∅`, `del→true`, `put(x)?`.
    pub fn label(&self) -> String {
        let unknown = matches!(self.ret, Return::Unknown);
        let mut s = match (&self.call, &self.ret) {
            (Call::Put { value }, _) => format!("put({value})"),
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
    pub operations: Vec<Operation>,
}

impl History {
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
    pub fn new() -> Clock {
        Clock::default()
    }

    /// Nanoseconds since the clock was made.
    pub fn now_ns(&self) -> u64 {
        self.base.elapsed().as_nanos() as u64
    }
}
