//! The protocols kvd speaks: one listener, and one parser, each.

/// A protocol kvd serves on a listener of its own.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Front {
    /// kvd's own batched protocol (`--listen`).
    Binary,
    /// The Redis protocol (`--resp`).
    Resp,
    /// HTTP: metrics, stats, `/kv` (`--http`).
    Http,
}

impl Front {
    /// Every front, in the order of [`Front::index`].
    pub const ALL: [Front; 3] = [Front::Binary, Front::Resp, Front::Http];

    /// A small index, for per-front tables.
    pub fn index(self) -> usize {
        match self {
            Front::Binary => 0,
            Front::Resp => 1,
            Front::Http => 2,
        }
    }

    /// The protocol's name as people say it.
    pub fn name(self) -> &'static str {
        match self {
            Front::Binary => "kvd's binary protocol",
            Front::Resp => "RESP (Redis)",
            Front::Http => "HTTP",
        }
    }

    /// A short name, for logs, stats and metric labels.
    pub fn label(self) -> &'static str {
        match self {
            Front::Binary => "binary",
            Front::Resp => "resp",
            Front::Http => "http",
        }
    }

    /// The flag that gives the front its address.
    pub fn flag(self) -> &'static str {
        match self {
            Front::Binary => "--listen",
            Front::Resp => "--resp",
            Front::Http => "--http",
        }
    }

    /// Connection ids of each front start apart (ids pick the counters' stripe and name
    /// the connection in `CLIENT ID`).
    pub(crate) fn first_id(self) -> u64 {
        (self.index() as u64) << 40
    }
}
