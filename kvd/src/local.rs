//! In-process nodes on 127.0.0.1 ports, for tests and benchmarks of the whole request path.

use std::net::SocketAddr;

use kvshared::routing::ShardId;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

use crate::node::{ClusterConfig, EngineConfig, NodeConfig};
use crate::server::Server;

/// One kvd running inside this process on the current tokio runtime.
pub struct LocalNode {
    pub addr: SocketAddr,
    stop: Option<oneshot::Sender<()>>,
    task: Option<JoinHandle<()>>,
}

impl LocalNode {
    /// Starts a node on a free 127.0.0.1 port.
    pub async fn start(config: NodeConfig) -> std::io::Result<LocalNode> {
        let server = Server::bind("127.0.0.1:0", config).await?;
        let addr = server.local_addr()?;
        let (stop, stopped) = oneshot::channel::<()>();
        let task = tokio::spawn(server.run(async {
            let _ = stopped.await;
        }));
        Ok(LocalNode {
            addr,
            stop: Some(stop),
            task: Some(task),
        })
    }

    /// Signals shutdown and waits until the node has answered its in-flight requests and stopped.
    pub async fn stop(mut self) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
        if let Some(t) = self.task.take() {
            let _ = t.await;
        }
    }
}

impl Drop for LocalNode {
    fn drop(&mut self) {
        if let Some(t) = &self.task {
            t.abort();
        }
    }
}

/// N in-process nodes, node i serving shard i/N.
pub struct LocalCluster {
    pub nodes: Vec<LocalNode>,
}

impl LocalCluster {
    /// Starts `n` nodes; `tune` may adjust each node's config (its shard is set already).
    pub async fn start(n: u32, tune: impl Fn(&mut NodeConfig)) -> std::io::Result<LocalCluster> {
        let mut nodes = Vec::new();
        for index in 0..n {
            let mut config = NodeConfig {
                cluster: ClusterConfig {
                    shard: ShardId { index, count: n },
                    ..ClusterConfig::default()
                },
                engine: EngineConfig {
                    map_shards: 8,
                    ..EngineConfig::default()
                },
                ..NodeConfig::default()
            };
            tune(&mut config);
            nodes.push(LocalNode::start(config).await?);
        }
        Ok(LocalCluster { nodes })
    }

    /// The `--nodes` list of this cluster, in shard order.
    pub fn addrs(&self) -> Vec<String> {
        self.nodes.iter().map(|n| n.addr.to_string()).collect()
    }
}
