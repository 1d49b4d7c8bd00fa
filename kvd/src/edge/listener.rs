//! The listeners: binding, protected mode per listener, admission under the node-wide
//! connection limit, and the bounded drain on shutdown.

use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use kvshared::stats::Counter;
use tokio::net::{TcpListener, TcpSocket, TcpStream};
use tokio::sync::broadcast;
use tokio::task::JoinSet;

use super::config::EdgeConfig;
use super::conn::Conn;
use super::front::Front;
use super::open::{open, refuse};
use super::refusal::Refusal;
use super::shared::{Edge, Peer};
use crate::counters::Counters;

/// How long shutdown waits for connections to answer what they read before it closes the
/// rest, on every front.
pub const SHUTDOWN_GRACE: Duration = Duration::from_secs(5);

/// Connections the kernel may queue before kvd accepts them (capped by `somaxconn`). The
/// standard library's 128 overflows when hundreds of clients connect at once, and a client
/// whose handshake is dropped waits a whole second to try again.
const LISTEN_BACKLOG: u32 = 4096;

/// What serves a listener's connections once the edge has opened them: the front's
/// parser and dispatcher (the edge knows no front; `crate::server` wires them).
pub(crate) type Handler = Arc<dyn Fn(Conn) -> Pin<Box<dyn Future<Output = ()> + Send>> + Send + Sync>;

/// One front's bound listener.
pub(crate) struct Listener {
    tcp: TcpListener,
    pub(crate) front: Front,
    handler: Handler,
    /// Protected mode, from this listener's own address: bound beyond loopback, no token,
    /// no `--insecure-no-auth`: only loopback peers are served.
    protected: bool,
}

impl Listener {
    /// Binds `addr` for `front`, and decides its protected mode (logging it).
    pub(crate) async fn bind(
        addr: &str,
        front: Front,
        handler: Handler,
        config: &EdgeConfig,
    ) -> std::io::Result<Listener> {
        let tcp = listen(addr).await?;
        let local = tcp.local_addr()?;
        let beyond_loopback = !local.ip().to_canonical().is_loopback();
        let protected = beyond_loopback && config.auth.is_none() && !config.insecure_no_auth;
        let port = front.label();
        if protected {
            tracing::warn!(
                "protected mode on the {port} port: {local} is reachable beyond this host but no token \
                 is set, so only loopback clients are served there; set --auth-token-file (and give \
                 clients the same token) or pass --insecure-no-auth"
            );
        } else if beyond_loopback && config.auth.is_none() {
            tracing::warn!("--insecure-no-auth: anyone who can reach {local} ({port}) can read and write every key");
        }
        Ok(Listener {
            tcp,
            front,
            handler,
            protected,
        })
    }

    /// The bound address.
    pub fn local_addr(&self) -> std::io::Result<SocketAddr> {
        self.tcp.local_addr()
    }

    /// The front it serves.
    pub fn front(&self) -> Front {
        self.front
    }
}

/// Binds the first address `addr` resolves to, with [`LISTEN_BACKLOG`]; or listens on the
/// inherited socket bound there (`super::inherited`).
async fn listen(addr: &str) -> std::io::Result<TcpListener> {
    let mut last = None;
    for candidate in tokio::net::lookup_host(addr).await? {
        if let Some(inherited) = super::inherited::take(candidate) {
            socket2::SockRef::from(&inherited).listen(LISTEN_BACKLOG as i32)?;
            inherited.set_nonblocking(true)?;
            tracing::debug!(%candidate, "serving on an inherited socket");
            return TcpListener::from_std(inherited);
        }
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

/// Accepts on every listener until `shutdown` resolves, then drains every connection
/// (within [`SHUTDOWN_GRACE`]; the rest are closed).
pub(crate) async fn serve(
    config: EdgeConfig,
    counters: Arc<Counters>,
    listeners: Vec<Listener>,
    shutdown: impl Future<Output = ()>,
) {
    let mut addrs = [None; 3];
    for l in &listeners {
        addrs[l.front.index()] = l.local_addr().ok();
    }
    let edge = Arc::new(Edge::new(config, counters, addrs));
    let mut by_front: [Option<Listener>; 3] = [None, None, None];
    for l in listeners {
        let i = l.front.index();
        by_front[i] = Some(l);
    }
    let mut admission = Admission {
        edge,
        ids: Front::ALL.map(|f| AtomicU64::new(f.first_id())),
        notify: broadcast::channel::<()>(1).0,
        conns: JoinSet::new(),
    };
    let [binary, resp, http] = &by_front;
    tokio::pin!(shutdown);
    loop {
        let (accepted, listener) = tokio::select! {
            a = accept(binary) => a,
            a = accept(resp) => a,
            a = accept(http) => a,
            () = &mut shutdown => break,
        };
        // Reap finished connection tasks so the set does not grow without bound.
        while admission.conns.try_join_next().is_some() {}
        match accepted {
            Ok((stream, peer)) => admission.admit(listener, stream, peer),
            Err(e) => {
                // e.g. out of file descriptors: back off instead of spinning.
                if let Some(suppressed) = admission.edge.warnings.admit() {
                    tracing::warn!(error = %e, front = listener.front.label(), suppressed, "accept failed");
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }
    drop(by_front);
    drain(admission.conns, admission.notify).await;
}

/// The next connection of `listener` (never, if the front is not served).
async fn accept(listener: &Option<Listener>) -> (std::io::Result<(TcpStream, SocketAddr)>, &Listener) {
    match listener {
        Some(l) => (l.tcp.accept().await, l),
        None => std::future::pending().await,
    }
}

/// What admitting a connection needs: the edge, connection ids, the shutdown signal, and
/// the connection tasks.
struct Admission {
    edge: Arc<Edge>,
    ids: [AtomicU64; 3],
    notify: broadcast::Sender<()>,
    conns: JoinSet<()>,
}

impl Admission {
    /// Serves, or refuses with a reason, one accepted connection.
    fn admit(&mut self, listener: &Listener, stream: TcpStream, peer: SocketAddr) {
        let front = listener.front;
        let edge = &self.edge;
        let refusal = if listener.protected && !peer.ip().to_canonical().is_loopback() {
            edge.counters.add(front.first_id(), Counter::ProtectedRefused, 1);
            let mut who = Peer::new(front.first_id(), peer.to_string(), front);
            if let Some(suppressed) = edge.may_warn(&mut who) {
                tracing::warn!(%peer, front = front.label(), suppressed, "refused a client from another host (protected mode)");
            }
            Refusal::Protected
        } else if let Ok(permit) = edge.slots.clone().try_acquire_owned() {
            let id = self.ids[front.index()].fetch_add(1, Ordering::Relaxed);
            let (edge, rx, handler) = (edge.clone(), self.notify.subscribe(), listener.handler.clone());
            self.conns.spawn(async move {
                if let Some(conn) = open(edge, front, stream, id, rx).await {
                    handler(conn).await;
                }
                drop(permit);
            });
            return;
        } else {
            // Over the limit: say so at once and close, as Redis does, rather than leave
            // the client waiting in the accept queue.
            edge.counters.add(front.first_id(), Counter::ConnsRefused, 1);
            tracing::debug!(%peer, front = front.label(), "refused a connection: max connections reached");
            Refusal::TooMany(edge.config.max_conns)
        };
        let Ok(slot) = edge.refusing.clone().try_acquire_owned() else {
            return; // Too many refusals in flight: close without a word.
        };
        let edge = edge.clone();
        self.conns.spawn(async move {
            refuse(&edge, front, stream, refusal).await;
            drop(slot);
        });
    }
}

/// Tells every connection to drain and waits for them, at most [`SHUTDOWN_GRACE`].
async fn drain(mut conns: JoinSet<()>, notify: broadcast::Sender<()>) {
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
        while conns.join_next().await.is_some() {}
    }
}
