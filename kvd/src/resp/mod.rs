//! The RESP front (`kvd --resp ADDR`): Redis clients and tools talk to kvd. Commands become
//! ops through [`crate::node::Node::execute`], the one entry point the binary protocol uses
//! too; ops on keys of other shards are forwarded to their owners with the cluster client
//! when kvd is given `--nodes`. The edge (`crate::edge`) accepts, limits and times the
//! connections; this module only parses and dispatches. Docs: docs/RESP.md.
//!
//! # Layout
//!
//! `parse` (commands read in place) -> `commands` (what each command becomes) ->
//! `pipeline` (one batch through the node, forwarding, replies in order) -> `reply`
//! (RESP writers); `expiry` reads the expiry commands' arguments; `transaction` runs MULTI/EXEC/WATCH; `keyspace` runs the commands
//! that span the cluster (SCAN, KEYS, DBSIZE, FLUSHALL, RANDOMKEY); `info` answers INFO; `connection` runs the loop.

mod commands;
mod connection;
mod expiry;
mod info;
mod keyspace;
pub mod parse;
pub(crate) mod pipeline;
mod reply;
mod transaction;

pub(crate) use connection::serve;
