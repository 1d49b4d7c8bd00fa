//! kvd: one node of the sharded in-memory key-value store.
//!
//! # Layout
//!
//! * [`server`]: binds the listener, limits connections, runs the graceful shutdown.
//! * `connection`: one client connection's loop: frame in, execute, frame out.
//! * [`store`]: the sharded map and batch execution (knows nothing of sockets).
//! * [`durable`]: `--data-dir`: the shard's log (openraft: one voter, or a `--group`) over checked segment files.
//! * `budget`: the node-wide budget for connection buffers, and each reply's share of it.
//! * [`node`]: what connections share: config, store, counters, sampler; builds stats.
//! * `counters`: striped per-connection counters for the hot path.
//! * [`local`]: in-process nodes on 127.0.0.1 ports for tests and benchmarks.
//! * `sampler`: the once-a-second sysinfo thread (CPU, memory, network).
//! * `warn_limit`: rate limits for the warnings a peer can cause.
//! * [`cli`], [`client_cmd`] and `admin_cmd`: the command line, its client verbs, `kvd admin`.
//! * [`manager`]: `kvd manager`, which gives hot shards read replicas on spare members.
//!
//! Wire types, framing and routing come from `kvshared`; nothing here re-implements them.

mod admin_cmd;
mod budget;
pub mod cli;
pub mod client_cmd;
mod connection;
mod counters;
pub mod durable;
pub mod http;
mod latency;
pub mod local;
pub mod manager;
pub mod node;
pub mod resp;
mod sampler;
pub mod server;
pub mod store;
mod warn_limit;

#[cfg(test)]
mod fault_tests;
