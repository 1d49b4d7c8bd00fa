//! Accepting connections, limiting them, and shutting down gracefully.
//!
//! Shutdown: when the `shutdown` future resolves the listener stops accepting, every
//! connection is told through a broadcast channel, answers the requests already in flight,
//! and closes. `run` returns once all connections have ended (or after a grace period).

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tokio::net::{TcpListener, TcpSocket};
use tokio::sync::{Semaphore, broadcast};
use tokio::task::JoinSet;

use crate::connection::{Connection, refuse};
use crate::node::{Node, NodeConfig};
use kvshared::stats::Counter;
use kvshared::wire::ErrorCode;

/// What a client from another host is told in protected mode.
const PROTECTED_MODE: &str = "kvd is in protected mode: it has no token and serves only clients on its \
    own host. Start every kvd with --auth-token-file FILE and give clients the same file (or \
    KV_AUTH_TOKEN_FILE), or, on a trusted network only, start kvd with --insecure-no-auth";

/// How long shutdown waits for connections to finish their in-flight requests.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(5);

/// Connections the kernel may queue before kvd accepts them (capped by `somaxconn`). The
/// standard library's 128 overflows when hundreds of clients connect at once, and a
/// client whose handshake is dropped waits a whole second to try again.
const LISTEN_BACKLOG: u32 = 4096;

/// Binds the first address `addr` resolves to, with [`LISTEN_BACKLOG`].
async fn listen(addr: &str) -> std::io::Result<TcpListener> {
    let mut last = None;
    for candidate in tokio::net::lookup_host(addr).await? {
        let socket = if candidate.is_ipv4() {
            TcpSocket::new_v4()?
        } else {
            TcpSocket::new_v6()?
        };
        socket.set_reuseaddr(true)?;
        match socket.bind(candidate).and_then(|()| socket.listen(LISTEN_BACKLOG)) {
            Ok(listener) => return Ok(listener),
            Err(e) => last = Some(e),
        }
    }
    Err(last
        .unwrap_or_else(|| std::io::Error::new(std::io::ErrorKind::InvalidInput, format!("{addr} names no address"))))
}

/// A bound, not yet running, kvd server.
pub struct Server {
    listener: TcpListener,
    node: Arc<Node>,
}

impl Server {
    /// Binds `addr` (use port 0 for any free port) and builds the node's store.
    ///
    /// Protected mode: bound beyond loopback with no token and without
    /// `--insecure-no-auth`, the node serves only loopback peers and tells others how to
    /// configure it (as Redis does), rather than serve the network unauthenticated.
    pub async fn bind(addr: &str, config: NodeConfig) -> std::io::Result<Server> {
        let listener = listen(addr).await?;
        let local = listener.local_addr()?;
        let beyond_loopback = !local.ip().to_canonical().is_loopback();
        let mut node = Node::new(config)?;
        node.open_data_dir().await?;
        node.protected = beyond_loopback && node.config.auth.is_none() && !node.config.insecure_no_auth;
        if node.protected {
            tracing::warn!(
                "protected mode: {local} is reachable beyond this host but no token is set, so only \
                 loopback clients are served; set --auth-token-file (and give clients the same \
                 token) or pass --insecure-no-auth"
            );
        } else if beyond_loopback && node.config.auth.is_none() {
            tracing::warn!("--insecure-no-auth: anyone who can reach {local} can read and write every key");
        }
        Ok(Server {
            listener,
            node: Arc::new(node),
        })
    }

    pub fn local_addr(&self) -> std::io::Result<SocketAddr> {
        self.listener.local_addr()
    }

    pub fn node(&self) -> Arc<Node> {
        self.node.clone()
    }

    /// Serves until `shutdown` resolves, then drains connections and returns.
    pub async fn run(self, shutdown: impl Future<Output = ()>) {
        let Server { listener, node } = self;
        let (notify, _) = broadcast::channel::<()>(1);
        let limit = Arc::new(Semaphore::new(node.config.max_conns.max(1)));
        let next_id = AtomicU64::new(0);
        let mut conns = JoinSet::new();
        tokio::pin!(shutdown);
        loop {
            let accepted = tokio::select! {
                a = listener.accept() => a,
                _ = &mut shutdown => break,
            };
            // Reap finished connection tasks so the set does not grow without bound.
            while conns.try_join_next().is_some() {}
            match accepted {
                Ok((stream, peer)) if node.protected && !peer.ip().to_canonical().is_loopback() => {
                    node.counters.add(0, Counter::ProtectedRefused, 1);
                    if let Some(suppressed) = node.warnings.admit() {
                        tracing::warn!(%peer, suppressed, "refused a client from another host (protected mode)");
                    }
                    conns.spawn(refuse(
                        stream,
                        node.config.tls.clone(),
                        ErrorCode::AuthRequired,
                        PROTECTED_MODE.into(),
                    ));
                }
                Ok((stream, peer)) => {
                    // Over the limit: say so at once and close, as Redis does, rather than
                    // leave the client waiting in the accept queue.
                    let Ok(permit) = limit.clone().try_acquire_owned() else {
                        node.counters.add(0, Counter::ConnsRefused, 1);
                        tracing::debug!(%peer, "refused a connection: max connections reached");
                        let why = format!("max connections reached ({}); try again later", node.config.max_conns);
                        conns.spawn(refuse(
                            stream,
                            node.config.tls.clone(),
                            ErrorCode::TooManyConnections,
                            why,
                        ));
                        continue;
                    };
                    let id = next_id.fetch_add(1, Ordering::Relaxed);
                    let node = node.clone();
                    let rx = notify.subscribe();
                    conns.spawn(async move {
                        Connection::serve(node, id, stream, rx).await;
                        drop(permit);
                    });
                }
                Err(e) => {
                    // e.g. out of file descriptors: back off instead of spinning.
                    if let Some(suppressed) = node.warnings.admit() {
                        tracing::warn!(error = %e, suppressed, "accept failed");
                    }
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            }
        }
        drop(listener);
        let open = conns.len();
        tracing::info!(open, "shutting down: answering in-flight requests");
        let _ = notify.send(());
        let drained = tokio::time::timeout(SHUTDOWN_GRACE, async { while conns.join_next().await.is_some() {} }).await;
        if drained.is_err() {
            tracing::warn!(
                left = conns.len(),
                "connections still open after the grace period; closing them"
            );
            conns.abort_all();
        }
        node.close().await;
    }
}
