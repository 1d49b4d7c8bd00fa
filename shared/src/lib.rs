//! The library both sides of the kvd store use.
//!
//! # Layout
//!
//! * [`auth`]: the shared-secret token: loading it, comparing it in constant time.
//! * [`routing`]: the one key hash and the functions that pick a key's node and map shard.
//! * [`frame`]: the 16-byte frame header, the size limit, reading a frame off a stream.
//! * [`wire`]: the rkyv body types (column-wise batches and results) and checked views over them.
//! * [`expiry`]: times to live: the expiry ops' arguments, deadlines, the log's clock.
//! * [`stats`]: per-node statistics as served by kvd, and rates between two samples.
//! * [`stdout`]: `out!`/`outln!`, printing that ends quietly when the reader closes the pipe.
//! * [`units`]: human-readable numbers (1.2M op/s, 734 KB/s) for every tool's output.
//! * [`history`]: recorded histories and the linearizability checker (no network code).
//! * [`tls`]: TLS set-up for servers (certificate and key) and clients (a CA file).
//! * [`files`]: reading small files an operator names, with a bound on their size.
//! * [`slots`]: the hash-slot table; [`slot_copy`]: what a slot migration's copy sends.
//! * [`client`]: the async cluster client (pools, pipelining, routing, merging, timeouts).
//! * `cli` (feature `cli`): the flags every tool shares, logging setup, exit statuses.
//!
//! Nothing in this crate starts a server; kvd owns the store and the serving loop.

#![warn(missing_docs)]

pub mod admin;
pub mod auth;
#[cfg(feature = "cli")]
pub mod cli;
pub mod client;
pub mod expiry;
pub mod files;
pub mod frame;
pub mod history;
pub mod keyspace;
pub mod latency;
pub mod pattern;
pub mod routing;
pub mod slot_copy;
pub mod slots;
pub mod stats;
pub mod stdout;
pub mod tls;
pub mod units;
pub mod wire;
