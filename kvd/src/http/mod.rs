//! The HTTP front (`kvd --http ADDR`, axum): `GET /metrics` (Prometheus), `GET /stats` (the
//! JSON of `kvd stats --json`), `GET|PUT|DELETE /kv/{key}` and `GET /healthz`. Keys go
//! through the same pipeline as RESP commands, so through `Node::execute` (and to their
//! owner with `--nodes`). Errors are JSON: `{"error": "..."}`. Docs: docs/HTTP.md.

mod metrics;

use std::net::SocketAddr;
use std::sync::Arc;

use axum::Router;
use axum::body::Bytes;
use axum::extract::{ConnectInfo, DefaultBodyLimit, Path, Request, State};
use axum::http::{StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use kvshared::client::Cluster;
use kvshared::stats::Counts;
use kvshared::wire::OpReply;
use tokio::net::TcpListener;
use tokio::sync::broadcast;

use crate::node::Node;
use crate::resp::pipeline::Pipeline;

struct Shared {
    node: Arc<Node>,
    cluster: Option<Arc<Cluster>>,
    /// Bound beyond loopback with no token and without `--insecure-no-auth`: only loopback
    /// peers are served (as the binary protocol's protected mode).
    protected: bool,
}

/// A bound HTTP listener.
pub struct HttpServer {
    listener: TcpListener,
    app: Router,
}

impl HttpServer {
    /// Binds `addr`; `cluster` (from `--nodes`) forwards keys of other shards.
    pub async fn bind(addr: &str, node: Arc<Node>, cluster: Option<Arc<Cluster>>) -> std::io::Result<HttpServer> {
        let listener = TcpListener::bind(addr).await?;
        let limit = node.config.max_frame as usize;
        let beyond_loopback = !listener.local_addr()?.ip().to_canonical().is_loopback();
        let protected = beyond_loopback && node.config.auth.is_none() && !node.config.insecure_no_auth;
        let shared = Arc::new(Shared {
            node,
            cluster,
            protected,
        });
        let guarded = Router::new()
            .route("/metrics", get(metrics_page))
            .route("/stats", get(stats))
            .route("/kv/{*key}", get(get_key).put(put_key).delete(delete_key))
            .route_layer(middleware::from_fn_with_state(shared.clone(), admit));
        let app = Router::new()
            .route("/healthz", get(healthz))
            .merge(guarded)
            .layer(DefaultBodyLimit::max(limit))
            .with_state(shared);
        Ok(HttpServer { listener, app })
    }

    /// The bound address.
    pub fn local_addr(&self) -> std::io::Result<SocketAddr> {
        self.listener.local_addr()
    }

    /// Serves until `shutdown` fires.
    pub async fn run(self, mut shutdown: broadcast::Receiver<()>) {
        let app = self.app.into_make_service_with_connect_info::<SocketAddr>();
        let served = axum::serve(self.listener, app).with_graceful_shutdown(async move {
            let _ = shutdown.recv().await;
        });
        if let Err(e) = served.await {
            tracing::warn!(error = %e, "the HTTP front stopped");
        }
    }
}

/// Everything but /healthz: with `--auth-token-file`, the token as `Authorization: Bearer
/// TOKEN` (Prometheus sends it with `authorization: {credentials_file: ...}`); in protected
/// mode, loopback peers only.
async fn admit(
    State(s): State<Arc<Shared>>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    request: Request,
    next: Next,
) -> Response {
    if let Some(token) = &s.node.config.auth {
        let presented = request
            .headers()
            .get(header::AUTHORIZATION)
            .and_then(|v| v.as_bytes().strip_prefix(b"Bearer "));
        if !presented.is_some_and(|p| token.matches(p)) {
            return json_error(
                StatusCode::UNAUTHORIZED,
                "this node wants its token: Authorization: Bearer TOKEN",
            );
        }
    } else if s.protected && !peer.ip().to_canonical().is_loopback() {
        return json_error(
            StatusCode::FORBIDDEN,
            "protected mode: kvd has no token and was not told --insecure-no-auth, so only this host is served",
        );
    }
    next.run(request).await
}

fn json_error(status: StatusCode, message: impl Into<String>) -> Response {
    (status, axum::Json(serde_json::json!({ "error": message.into() }))).into_response()
}

async fn metrics_page(State(s): State<Arc<Shared>>) -> Response {
    (
        [(header::CONTENT_TYPE, "text/plain; version=0.0.4; charset=utf-8")],
        metrics::render(&s.node.stats()),
    )
        .into_response()
}

async fn stats(State(s): State<Arc<Shared>>) -> Response {
    axum::Json(s.node.stats()).into_response()
}

async fn healthz(State(s): State<Arc<Shared>>) -> Response {
    let shard = s.node.config.shard.to_string();
    axum::Json(serde_json::json!({ "status": "serving", "shard": shard, "role": "standalone" })).into_response()
}

/// Runs one op through the shared pipeline and maps its answer.
async fn one_op(
    s: &Shared,
    add: impl FnOnce(&mut Pipeline, &Node, bool),
    map: impl FnOnce(OpReply<'_>) -> Response,
) -> Response {
    let mut p = Pipeline::default();
    add(&mut p, &s.node, s.cluster.is_some());
    let mut tally = Counts::default();
    p.execute(&s.node, s.cluster.as_deref(), &mut tally).await;
    s.node.counters.add_counts(0, &tally);
    match p.outcome(0) {
        Ok(OpReply::WrongShard { owner, nodes }) => json_error(
            StatusCode::MISDIRECTED_REQUEST,
            format!("the key belongs to node {owner} of {nodes}; start kvd with --nodes to forward it"),
        ),
        Ok(OpReply::OutOfMemory) => json_error(
            StatusCode::INSUFFICIENT_STORAGE,
            "no memory for the write (--max-memory)",
        ),
        Ok(OpReply::TooLarge) => json_error(StatusCode::PAYLOAD_TOO_LARGE, "the value does not fit in a reply"),
        Ok(OpReply::Malformed(why)) => json_error(StatusCode::BAD_REQUEST, why),
        Ok(reply) => map(reply),
        Err(e) => json_error(
            StatusCode::SERVICE_UNAVAILABLE,
            e.trim_start_matches("ERR ").to_string(),
        ),
    }
}

async fn get_key(State(s): State<Arc<Shared>>, Path(key): Path<String>) -> Response {
    one_op(
        &s,
        |p, node, fwd| p.get(node, fwd, key.as_bytes()),
        |r| match r {
            OpReply::Found(v) => ([(header::CONTENT_TYPE, "application/octet-stream")], v.to_vec()).into_response(),
            _ => json_error(StatusCode::NOT_FOUND, format!("no key {key:?}")),
        },
    )
    .await
}

async fn put_key(State(s): State<Arc<Shared>>, Path(key): Path<String>, body: Bytes) -> Response {
    one_op(
        &s,
        |p, node, fwd| p.set(node, fwd, key.as_bytes(), &body, false),
        |_| StatusCode::NO_CONTENT.into_response(),
    )
    .await
}

async fn delete_key(State(s): State<Arc<Shared>>, Path(key): Path<String>) -> Response {
    one_op(
        &s,
        |p, node, fwd| p.count(node, fwd, &[key.as_bytes()], true),
        |r| match r {
            OpReply::Deleted => StatusCode::NO_CONTENT.into_response(),
            _ => json_error(StatusCode::NOT_FOUND, format!("no key {key:?}")),
        },
    )
    .await
}
