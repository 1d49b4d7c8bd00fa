//! kvd: one node of the sharded in-memory key-value store.
//!
//! # Layout
//!
//! * [`edge`]: every listener and connection, whatever the protocol: binding, protected
//!   mode, TLS, the token, limits, deadlines, the buffer budget, rate-limited warnings and
//!   the drain on shutdown. The fronts below only parse and dispatch.
//! * [`server`]: a node and its listeners, each wired to its front.
//! * `binary`: the binary protocol's front: frame in, execute, frame out.
//! * [`resp`] and [`http`]: the RESP and HTTP fronts, which share [`routed`] (ops split
//!   between this node and the others).
//! * [`store`]: the sharded map and batch execution (knows nothing of sockets).
//! * [`durable`]: `--data-dir`: the shard's log (openraft: one voter, or a `--group`) over checked segment files.
//! * [`node`]: the one door to the engine (`Node::execute`, `NodeError`): config, store,
//!   counters, sampler; builds stats.
//! * `counters`: striped per-connection counters for the hot path.
//! * [`local`]: in-process nodes on 127.0.0.1 ports for tests and benchmarks.
//! * `sampler`: the once-a-second sysinfo thread (CPU, memory, network).
//! * [`cli`]: the command line.
//! * [`control`]: a client of the cluster: the client verbs, `kvd admin` (slot moves,
//!   rebalance, group membership) and `kvd manager` (hot shards).
//!
//! Wire types, framing and routing come from `kvshared`; nothing here re-implements them.

pub mod alloc;
mod binary;
pub mod cli;
pub mod cluster_view;
pub mod control;
mod counters;
pub mod durable;
pub mod edge;

pub mod http;
mod latency;
pub mod local;
pub mod node;
pub mod resp;
mod restart_check;
pub mod routed;
mod sampler;
pub mod server;
pub mod store;

#[cfg(test)]
mod fault_tests;
