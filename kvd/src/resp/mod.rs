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
//! `table` is the command table (names, where the keys are); `cluster` is Redis Cluster
//! (`CLUSTER ...`, and `-MOVED` with `--resp-cluster`, where keyspace commands cover this
//! node alone, as in Redis Cluster).

mod cluster;
mod commands;
mod connection;
mod dispatch;
mod expiry;
mod info;
mod keyspace;
pub mod parse;
pub(crate) mod pipeline;
mod reply;
mod table;
mod transaction;

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
