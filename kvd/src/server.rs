//! A kvd server: its node, and one listener per front it serves, each wired to its front's
//! parser. Everything about the connections themselves is the edge's (`crate::edge`).

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;

use kvshared::client::Cluster;

use crate::edge::{self, Front, Handler, Listener};
use crate::node::{Node, NodeConfig};

/// A bound, not yet running, kvd.
pub struct Server {
    node: Arc<Node>,
    listeners: Vec<Listener>,
}

impl Server {
    /// Builds the node (opening `--data-dir`) and binds its binary protocol on `addr`
    /// (port 0: any free port).
    pub async fn bind(addr: &str, mut config: NodeConfig) -> std::io::Result<Server> {
        config.edge.max_conns = edge::connection_slots(config.edge.max_conns);
        let mut node = Node::new(config)?;
        node.open_data_dir().await?;
        let node = Arc::new(node);
        crate::node::expiry_task::start(&node);
        let served = node.clone();
        let binary: Handler = Arc::new(move |conn| Box::pin(crate::binary::serve(conn, served.clone())));
        let listener = Listener::bind(addr, Front::Binary, binary, &node.config().edge).await?;
        Ok(Server {
            node,
            listeners: vec![listener],
        })
    }

    /// Also speaks RESP on `addr`; `cluster` (from `--nodes`) forwards keys of other shards.
    pub async fn serve_resp(&mut self, addr: &str, cluster: Option<Arc<Cluster>>) -> std::io::Result<SocketAddr> {
        self.serve_resp_with(addr, cluster, &[], false).await
    }

    /// Also speaks RESP on `addr`: `cluster` (from `--nodes`) forwards keys of other
    /// shards, or with `redirect` (`--resp-cluster`) they are answered `-MOVED` to the owner
    /// as a Redis Cluster node does; `nodes` (`--nodes`) is where the view of the cluster
    /// comes from (`CLUSTER SLOTS`).
    pub async fn serve_resp_with(
        &mut self,
        addr: &str,
        cluster: Option<Arc<Cluster>>,
        nodes: &[String],
        redirect: bool,
    ) -> std::io::Result<SocketAddr> {
        // The view needs the bound address; connections are accepted only once `run` starts,
        // after it is set.
        let setup: Arc<std::sync::OnceLock<crate::resp::Setup>> = Arc::default();
        let set = setup.clone();
        let resp: Handler = Arc::new(move |conn| {
            let setup = set.get().cloned();
            Box::pin(async move {
                if let Some(setup) = setup {
                    crate::resp::serve(conn, setup).await;
                }
            })
        });
        let bound = self.add(addr, Front::Resp, resp).await?;
        self.node.set_resp_addr(bound);
        let config = cluster.as_ref().map(|c| c.config().clone()).unwrap_or_default();
        let view = crate::cluster_view::ClusterView::start(self.node.clone(), nodes, config);
        let _ = setup.set(crate::resp::Setup {
            node: self.node.clone(),
            cluster,
            view,
            redirect,
        });
        Ok(bound)
    }

    /// Also serves HTTP on `addr`; `cluster` (from `--nodes`) forwards keys of other shards.
    pub async fn serve_http(&mut self, addr: &str, cluster: Option<Arc<Cluster>>) -> std::io::Result<SocketAddr> {
        let node = self.node.clone();
        let http: Handler = Arc::new(move |conn| Box::pin(crate::http::serve(conn, node.clone(), cluster.clone())));
        self.add(addr, Front::Http, http).await
    }

    async fn add(&mut self, addr: &str, front: Front, handler: Handler) -> std::io::Result<SocketAddr> {
        if self.addr_of(front).is_some() {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                format!("{} is served once", front.name()),
            ));
        }
        let listener = Listener::bind(addr, front, handler, &self.node.config().edge).await?;
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
            .find(|l| l.front() == front)
            .and_then(|l| l.local_addr().ok())
    }

    /// The node behind every front.
    pub fn node(&self) -> Arc<Node> {
        self.node.clone()
    }

    /// Serves every front until `shutdown` resolves, drains the connections (within
    /// [`edge::SHUTDOWN_GRACE`]) and closes the node's log.
    pub async fn run(self, shutdown: impl Future<Output = ()>) {
        let Server { node, listeners } = self;
        edge::serve(node.config().edge.clone(), node.counters().clone(), listeners, shutdown).await;
        node.close().await;
    }
}
