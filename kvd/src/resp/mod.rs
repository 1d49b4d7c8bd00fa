//! The RESP front (`kvd --resp ADDR`): Redis clients and tools talk to kvd. Commands become
//! ops through [`crate::node::Node::execute`], the one entry point the binary protocol uses
//! too; ops on keys of other shards are forwarded to their owners with the cluster client
//! when kvd is given `--nodes`. Docs: docs/RESP.md.

mod commands;
mod connection;
mod info;
pub mod parse;
pub(crate) mod pipeline;
mod reply;

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use kvshared::client::Cluster;
use kvshared::stats::Counter;
use tokio::io::AsyncWriteExt;
use tokio::net::TcpListener;
use tokio::sync::{Semaphore, broadcast};
use tokio::task::JoinSet;

use crate::node::Node;

/// Connection ids of the RESP front start here, apart from the binary protocol's.
const FIRST_ID: u64 = 1 << 40;

/// A bound RESP listener.
pub struct RespServer {
    listener: TcpListener,
    node: Arc<Node>,
    cluster: Option<Arc<Cluster>>,
}

impl RespServer {
    /// Binds `addr`; `cluster` (from `--nodes`) forwards keys of other shards.
    pub async fn bind(addr: &str, node: Arc<Node>, cluster: Option<Arc<Cluster>>) -> std::io::Result<RespServer> {
        let listener = TcpListener::bind(addr).await?;
        Ok(RespServer {
            listener,
            node,
            cluster,
        })
    }

    /// The bound address.
    pub fn local_addr(&self) -> std::io::Result<SocketAddr> {
        self.listener.local_addr()
    }

    /// Serves until `shutdown` fires, then closes the connections.
    pub async fn run(self, mut shutdown: broadcast::Receiver<()>) {
        let RespServer {
            listener,
            node,
            cluster,
        } = self;
        let limit = Arc::new(Semaphore::new(node.config.max_conns.max(1)));
        let (notify, _) = broadcast::channel::<()>(1);
        let next_id = AtomicU64::new(FIRST_ID);
        let mut conns = JoinSet::new();
        loop {
            let accepted = tokio::select! {
                a = listener.accept() => a,
                _ = shutdown.recv() => break,
            };
            while conns.try_join_next().is_some() {}
            let Ok((mut stream, peer)) = accepted else {
                tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                continue;
            };
            if node.protected && !peer.ip().to_canonical().is_loopback() {
                node.counters.add(0, Counter::ProtectedRefused, 1);
                conns.spawn(async move {
                    let _ = stream
                        .write_all(b"-DENIED kvd is in protected mode: set --auth-token-file (clients send AUTH) or pass --insecure-no-auth\r\n")
                        .await;
                });
                continue;
            }
            let Ok(permit) = limit.clone().try_acquire_owned() else {
                node.counters.add(0, Counter::ConnsRefused, 1);
                conns.spawn(async move {
                    let _ = stream.write_all(b"-ERR max number of clients reached\r\n").await;
                });
                continue;
            };
            let id = next_id.fetch_add(1, Ordering::Relaxed);
            let (node, cluster, rx) = (node.clone(), cluster.clone(), notify.subscribe());
            conns.spawn(async move {
                connection::serve(node, cluster, stream, id, rx).await;
                drop(permit);
            });
        }
        let _ = notify.send(());
        while conns.join_next().await.is_some() {}
    }
}
