//! The RESP front (`kvd --resp ADDR`): Redis clients and tools talk to kvd. Commands become
//! ops through [`crate::node::Node::execute`], the one entry point the binary protocol uses
//! too; ops on keys of other shards are forwarded to their owners with the cluster client
//! when kvd is given `--nodes`. The edge (`crate::edge`) accepts, limits and times the
//! connections; this module only parses and dispatches. Docs: docs/RESP.md.
//!
//! # Layout (each line imports only from the lines above it: no circle)
//!
//! - `reply` (RESP writers), `parse` (commands read in place), `errors` (RESP's texts for
//!   what has no answer);
//! - `keyspace` runs the commands that span the cluster (SCAN, KEYS, DBSIZE, FLUSHALL,
//!   RANDOMKEY) node by node; `pipeline` is one pipeline's steps over `crate::routed` (the
//!   ops split between this node and others, shared with HTTP) and writes the replies;
//! - `tx_state` (MULTI's queue, the watched keys), `ctx` (a connection's session, what a
//!   handler is given, the flow after it);
//! - the handlers: `commands` (strings, connection, server), `expiry`, `keyspace_args`,
//!   `transaction` (MULTI/EXEC/WATCH), `cluster` (Redis Cluster: `CLUSTER ...`, `-MOVED`
//!   with `--resp-cluster`), `info`;
//! - `table`, the one command table (names, arity, keys, flags, handler);
//! - `dispatch` (the gate, the redirect, MULTI's queue, the arity, then the handler), and
//!   `connection`, the loop.

mod cluster;
mod commands;
mod connection;
mod ctx;
mod dispatch;
mod errors;
mod expiry;
mod info;
mod keyspace;
mod keyspace_args;
pub mod parse;
pub(crate) mod pipeline;
mod reply;
mod table;
mod transaction;
mod tx_state;

pub(crate) use connection::serve;

use std::sync::Arc;

/// What every connection of a RESP front shares.
#[derive(Clone)]
pub struct Setup {
    /// The node this front serves.
    pub node: Arc<crate::node::Node>,
    /// The cluster client that forwards other shards' keys (from `--nodes`).
    pub cluster: Option<Arc<kvshared::client::Cluster>>,
    /// The cluster as this node sees it.
    pub view: Arc<crate::cluster_view::ClusterView>,
    /// `--resp-cluster`: redirect (`-MOVED`) instead of forwarding.
    pub redirect: bool,
}
