//! The edge: everything between a socket and a front's parser, the same for every front.
//!
//! kvd speaks three protocols: its binary protocol (`--listen`), RESP (`--resp`) and HTTP
//! (`--http`). A *front* (`crate::binary`, `crate::resp`, `crate::http`) parses its
//! protocol and dispatches to `Node::execute`; it decides no policy. Every rule about who may
//! connect, for how long and with how much memory lives here, once, and holds on every front:
//!
//! * binding with a backlog, one listener per front ([`listener`]);
//! * protected mode, decided from each listener's own address;
//! * TLS on every front when `--tls-cert` is given, and what a plaintext client is told;
//! * the connection limit (`--max-conns`, node-wide, within the process's file limit);
//! * another front's protocol on a port is answered in that protocol, naming the right
//!   port ([`sniff`], [`refusal`]);
//! * the token (`gate`): checked in constant time, failures counted per front, and before
//!   it a connection may hold no more than [`PRE_AUTH_BYTES`];
//! * deadlines: idle (`--idle-timeout`), a begun request (`--read-timeout`), a peer that
//!   reads none of its replies (`--write-timeout`, [`deadline`]);
//! * the node-wide buffer budget (`--max-buffer-memory`, [`budget`]);
//! * rate-limited warnings ([`warn_limit`]);
//! * the drain on shutdown: answer what was read, refuse what comes later, and close every
//!   connection within [`SHUTDOWN_GRACE`].
//!
//! A front gets a [`conn::Conn`]: the connection's two directions with these rules applied,
//! and asks it when to wait, until when to read, whether the peer may send more, and how to
//! end.

pub(crate) mod budget;
pub(crate) mod conn;
mod deadline;
mod front;
pub(crate) mod gate;
mod limits;
mod listener;
mod open;
mod refusal;
mod shared;
mod sniff;
pub(crate) mod warn_limit;

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;

use kvshared::client::Cluster;

pub use front::Front;
pub use gate::PRE_AUTH_BYTES;
pub use listener::SHUTDOWN_GRACE;
use listener::{Listener, Service};
pub(crate) use shared::{Edge, Peer};

use crate::node::{Node, NodeConfig};

/// A bound, not yet running, kvd: its node and one listener per front it serves.
pub struct Server {
    node: Arc<Node>,
    listeners: Vec<Listener>,
}

impl Server {
    /// Builds the node (opening `--data-dir`) and binds its binary protocol on `addr`
    /// (port 0: any free port).
    pub async fn bind(addr: &str, mut config: NodeConfig) -> std::io::Result<Server> {
        config.max_conns = limits::connection_slots(config.max_conns);
        let mut node = Node::new(config)?;
        node.open_data_dir().await?;
        let node = Arc::new(node);
        let binary = Listener::bind(addr, Front::Binary, Service::Binary, &node.config).await?;
        Ok(Server {
            node,
            listeners: vec![binary],
        })
    }

    /// Also speaks RESP on `addr`; `cluster` (from `--nodes`) forwards keys of other shards.
    pub async fn serve_resp(&mut self, addr: &str, cluster: Option<Arc<Cluster>>) -> std::io::Result<SocketAddr> {
        self.add(addr, Front::Resp, Service::Resp(cluster)).await
    }

    /// Also serves HTTP on `addr`; `cluster` (from `--nodes`) forwards keys of other shards.
    pub async fn serve_http(&mut self, addr: &str, cluster: Option<Arc<Cluster>>) -> std::io::Result<SocketAddr> {
        self.add(addr, Front::Http, Service::Http(cluster)).await
    }

    async fn add(&mut self, addr: &str, front: Front, service: Service) -> std::io::Result<SocketAddr> {
        if self.listeners.iter().any(|l| l.front == front) {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                format!("{} is served once", front.name()),
            ));
        }
        let listener = Listener::bind(addr, front, service, &self.node.config).await?;
        let local = listener.local_addr()?;
        self.listeners.push(listener);
        Ok(local)
    }

    /// The binary protocol's address.
    pub fn local_addr(&self) -> std::io::Result<SocketAddr> {
        self.addr_of(Front::Binary)
            .ok_or_else(|| std::io::Error::other("no binary listener"))
    }

    /// Where `front` listens, if it is served.
    pub fn addr_of(&self, front: Front) -> Option<SocketAddr> {
        self.listeners
            .iter()
            .find(|l| l.front == front)
            .and_then(|l| l.local_addr().ok())
    }

    /// The node behind every front.
    pub fn node(&self) -> Arc<Node> {
        self.node.clone()
    }

    /// Serves every front until `shutdown` resolves, drains the connections (within
    /// [`SHUTDOWN_GRACE`]) and closes the node's log.
    pub async fn run(self, shutdown: impl Future<Output = ()>) {
        let Server { node, listeners } = self;
        listener::serve(node.clone(), listeners, shutdown).await;
        node.close().await;
    }
}
