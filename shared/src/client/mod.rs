//! The async cluster client: connection pools per node, pipelining, routing and merging.

mod cluster;
mod connection;
mod error;
mod layout;
mod node_batches;
mod pin;
mod recording;
mod rtt;

use std::time::Duration;

pub use cluster::{Cluster, Op, Outcome};

pub use connection::{InFlight, Reply};
pub use error::ClientError;
pub use layout::{LayoutProblem, check_layout, entry_shards, expand_members};
pub use node_batches::NodeBatches;
pub use recording::{RecordConfig, RecordProgress, Recording, record};
pub use rtt::{STALL_CEILING, STALL_FLOOR};

use crate::auth::AuthToken;
use crate::frame::DEFAULT_MAX_FRAME;
use crate::tls::TlsClient;

/// How the client talks to each node.
#[derive(Debug, Clone)]
pub struct ClientConfig {
    /// TCP connections per node.
    pub conns_per_node: usize,
    /// Requests that may be in flight at once on one connection.
    pub pipeline: usize,
    /// Every request fails with `Timeout` after this long without an answer.
    pub request_timeout: Duration,
    /// A connection attempt fails after this long.
    pub connect_timeout: Duration,
    /// Largest frame body the client will send or accept.
    pub max_frame: u32,
    /// The token presented on every new connection (needed when the nodes have one).
    pub auth: Option<AuthToken>,
    /// TLS to the nodes, trusting the CA it was made with (needed when they serve TLS).
    pub tls: Option<TlsClient>,
    /// Which members of a replica group serve batches of reads only.
    pub reads: ReadFrom,
}

/// Which members of a replica group serve a batch of reads only (`--reads`). Batches with
/// a write always go to the leader.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReadFrom {
    /// Only the leader.
    Leader,
    /// Every member, voters and learners, in turn; linearizable (a follower serves a read
    /// once it has applied the leader's read index).
    Replicas,
    /// Every member in turn, answering from its own store while it is at most this far
    /// behind its leader (else as `Replicas`): reads may miss writes acknowledged within the
    /// bound.
    Stale(Duration),
}

impl Default for ClientConfig {
    fn default() -> Self {
        ClientConfig {
            conns_per_node: 1,
            pipeline: 64,
            request_timeout: DEFAULT_TIMEOUT,
            connect_timeout: DEFAULT_TIMEOUT,
            max_frame: DEFAULT_MAX_FRAME,
            auth: None,
            tls: None,
            reads: ReadFrom::Replicas,
        }
    }
}

/// Default node address of a kvd started without `--listen`.
pub const DEFAULT_NODE: &str = "127.0.0.1:7070";
/// Default request and connect timeout of every tool (`--timeout`).
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(5);

/// Splits a `--nodes` list (`host:port,host:port`; a shard served by a replica group lists
/// its members separated by `|`: `a1:7070|a2:7070|a3:7070,b1:7070|...`), checking each
/// address has a port and none is listed twice.
pub fn parse_nodes(list: &str) -> Result<Vec<String>, ClientError> {
    let nodes: Vec<String> = list
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(str::to_string)
        .collect();
    if nodes.is_empty() {
        return Err(ClientError::BadNodes("empty node list".into()));
    }
    let addrs: Vec<&str> = nodes.iter().flat_map(|n| members(n)).collect();
    for n in &addrs {
        match n.rsplit_once(':') {
            Some((host, port)) if !host.is_empty() && port.parse::<u16>().is_ok() => {}
            _ => return Err(ClientError::BadNodes(format!("{n:?} is not HOST:PORT"))),
        }
    }
    for (i, n) in addrs.iter().enumerate() {
        if addrs[..i].contains(n) {
            return Err(ClientError::BadNodes(format!(
                "{n} is listed twice (each node serves one shard: list each once, in shard order)"
            )));
        }
    }
    Ok(nodes)
}

/// The members of one `--nodes` entry: `a:1|b:2` is a replica group of two, `a:1` a
/// single node.
pub fn members(entry: &str) -> impl Iterator<Item = &str> {
    entry.split('|').map(str::trim).filter(|m| !m.is_empty())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn node_lists() {
        assert_eq!(parse_nodes("a:1, b:2").unwrap(), vec!["a:1", "b:2"]);
        assert_eq!(parse_nodes("[::1]:7070").unwrap(), vec!["[::1]:7070"]);
        assert!(parse_nodes("").is_err());
        assert!(parse_nodes("localhost").is_err());
        assert!(parse_nodes("a:99999").is_err());
        assert_eq!(parse_nodes("a:1|a:2|a:3,b:1").unwrap(), vec!["a:1|a:2|a:3", "b:1"]);
        assert!(parse_nodes("a:1|a,b:1").is_err());
        assert!(
            parse_nodes("a:1|b:1,b:1")
                .unwrap_err()
                .to_string()
                .contains("b:1 is listed twice")
        );
        let twice = parse_nodes("a:1,b:2,a:1").unwrap_err().to_string();
        assert!(twice.contains("a:1 is listed twice"), "{twice}");
    }
}
