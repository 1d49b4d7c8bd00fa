//! What the edge is told: the limits and the token every front's connections are held to.
//! (The edge needs no more of the node than this and its counters.)

use std::time::Duration;

use kvshared::auth::AuthToken;
use kvshared::tls::TlsServer;

/// The edge's settings (the serving flags about connections).
#[derive(Clone, Debug)]
pub struct EdgeConfig {
    /// Most connections served at once, over every front (`--max-conns`).
    pub max_conns: usize,
    /// Largest frame or request body accepted (`--max-frame`).
    pub max_frame: u32,
    /// Close a connection that sends no request for this long (`None`: never).
    pub idle_timeout: Option<Duration>,
    /// A request that has begun must arrive whole within this long.
    pub read_timeout: Duration,
    /// A peer that reads none of its replies for this long loses its connection.
    pub write_timeout: Duration,
    /// Bytes all connections together may hold in buffers beyond a small allowance each.
    pub max_buffer_memory: usize,
    /// The token clients must present first (`None`: no token).
    pub auth: Option<AuthToken>,
    /// Serve clients from other hosts without a token (turns protected mode off).
    pub insecure_no_auth: bool,
    /// Serve TLS only (`--tls-cert`, `--tls-key`).
    pub tls: Option<TlsServer>,
}
