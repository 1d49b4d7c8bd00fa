//! The HTTP front (`kvd --http ADDR`, axum over hyper's HTTP/1.1): `GET /metrics`
//! (Prometheus), `GET /stats` (the JSON of `kvd stats --json`), `GET|PUT|DELETE /kv/{key}`
//! and `GET /healthz`. Keys go through the same pipeline as RESP commands, so through
//! `Node::execute` (and to their owner with `--nodes`). Errors are JSON:
//! `{"error": "..."}`. Docs: docs/HTTP.md.
//!
//! The edge accepts, limits and opens the connection; here hyper gets it with the edge's
//! deadlines as its own knobs (a request's headers within `--read-timeout`, which also
//! closes an idle keep-alive connection; a body within `--read-timeout` of its request,
//! paid from the buffer budget as it arrives) and drains it on shutdown.

mod body;
mod drain;
mod group_metrics;
mod key;
mod metrics;
mod process_metrics;

use std::sync::Arc;

use axum::Router;
use axum::body::Body;
use axum::extract::{RawQuery, Request, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use kvshared::client::Cluster;
use kvshared::stats::Counts;
use kvshared::wire::{OpKind, OpReply};

use crate::edge::budget::Held;
use crate::edge::conn::{Conn, Input};
use crate::edge::{Edge, Front, PRE_AUTH_BYTES, Peer};
use crate::routed::Routed;
use key::Key;

/// What the requests of one connection share.
struct Shared {
    edge: Arc<Edge>,
    /// The node this front serves.
    node: Arc<crate::node::Node>,
    cluster: Option<Arc<Cluster>>,
    /// The connection's peer, for counting and rate-limited warnings.
    peer: parking_lot::Mutex<Peer>,
}

/// The routes of one connection from `peer`, over `edge`'s node; `cluster` (from `--nodes`)
/// forwards keys of other shards.
fn router(
    edge: Arc<Edge>,
    node: Arc<crate::node::Node>,
    cluster: Option<Arc<Cluster>>,
    peer: Peer,
    gate: Arc<drain::Gate>,
) -> Router {
    let shared = Arc::new(Shared {
        edge,
        node,
        cluster,
        peer: parking_lot::Mutex::new(peer),
    });
    let guarded = Router::new()
        .route("/metrics", get(metrics_page))
        .route("/stats", get(stats))
        .route("/kv/{*key}", get(get_key).put(put_key).delete(delete_key))
        .route_layer(middleware::from_fn_with_state(shared.clone(), admit));
    let routes = Router::new()
        .route("/healthz", get(healthz))
        .merge(guarded)
        .fallback(not_found)
        .with_state(shared);
    // Around the whole router: axum adds `Allow` to a 405 after a route's own layers ran.
    Router::new()
        .fallback_service(routes)
        .layer(middleware::map_response(explain_method))
        .layer(middleware::from_fn_with_state(gate, drain::gate))
}

/// A 405 says, in the JSON body every error has, which methods the path takes (axum's own
/// 405 has the `Allow` header and an empty body).
async fn explain_method(response: Response) -> Response {
    if response.status() != StatusCode::METHOD_NOT_ALLOWED {
        return response;
    }
    let allow = response.headers().get(header::ALLOW).cloned();
    let methods = allow
        .as_ref()
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .replace(',', ", ");
    let mut out = json_error(
        StatusCode::METHOD_NOT_ALLOWED,
        format!("method not allowed here; this path takes {methods}"),
    );
    if let Some(v) = allow {
        out.headers_mut().insert(header::ALLOW, v);
    }
    out
}

/// Serves one connection (opened by the edge) until the client leaves, its keep-alive
/// idles out, or shutdown (which answers every request read: see `drain`). (The routes are
/// made per connection: HTTP connections are few and long, and the routes' state is the
/// connection's edge.)
pub(crate) async fn serve(mut conn: Conn, node: Arc<crate::node::Node>, cluster: Option<Arc<Cluster>>) {
    let peer = Peer::new(conn.peer.id, conn.peer.addr.clone(), Front::Http);
    let gate = drain::Gate::new();
    let app = router(conn.edge.clone(), node, cluster, peer, gate.clone());
    let config = &conn.edge.config;
    let headers_within = config
        .idle_timeout
        .map_or(config.read_timeout, |idle| idle.min(config.read_timeout));
    // The first bytes (checked by the edge for another front's protocol) come within the
    // time a request's headers have, as every later request's do.
    match tokio::time::timeout(headers_within, conn.wait_for_input(None::<std::future::Ready<()>>)).await {
        Ok(Input::Ready) => {}
        Ok(_) => return,
        Err(_) => {
            conn.tally.conns_idle_closed += 1;
            return;
        }
    }
    let mut shutdown = conn.take_shutdown();
    let mut builder = hyper::server::conn::http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(headers_within)
        .max_buf_size(PRE_AUTH_BYTES.max(8192))
        .keep_alive(true);
    let served = builder.serve_connection(TokioIo::new(conn), TowerToHyperService::new(app));
    tokio::pin!(served);
    let signal = async {
        match shutdown.as_mut() {
            Some(rx) => {
                let _ = rx.recv().await;
            }
            None => std::future::pending().await,
        }
    };
    tokio::select! {
        result = served.as_mut() => {
            if let Err(e) = result {
                tracing::debug!(error = %e, "HTTP connection ended");
            }
        }
        () = signal => drain::close(&gate, served, |s| s.graceful_shutdown()).await,
    }
}

/// Everything but /healthz: with `--auth-token-file`, the token as `Authorization: Bearer
/// TOKEN` (the scheme in any case, RFC 7235; Prometheus sends it with
/// `authorization: {credentials_file: ...}`). Protected mode is the edge's, per listener.
async fn admit(State(s): State<Arc<Shared>>, request: Request, next: Next) -> Response {
    if s.edge.needs_token() {
        let presented = request
            .headers()
            .get(header::AUTHORIZATION)
            .and_then(|v| bearer(v.as_bytes()));
        let mut peer = s.peer.lock();
        let right = match presented {
            Some(token) => s.edge.check_token(&mut peer, token),
            None => {
                s.edge
                    .auth_failed(&mut peer, "refused an HTTP request without the token");
                false
            }
        };
        drop(peer);
        if !right {
            let mut refusal = json_error(
                StatusCode::UNAUTHORIZED,
                "this node wants its token: Authorization: Bearer TOKEN",
            );
            refusal.headers_mut().insert(
                header::WWW_AUTHENTICATE,
                HeaderValue::from_static("Bearer realm=\"kvd\""),
            );
            return refusal;
        }
    }
    next.run(request).await
}

/// The credentials of an `Authorization: Bearer ...` value.
fn bearer(value: &[u8]) -> Option<&[u8]> {
    let (scheme, rest) = value.split_at_checked(6)?;
    (scheme.eq_ignore_ascii_case(b"bearer") && rest.first() == Some(&b' ')).then(|| rest[1..].trim_ascii())
}

fn json_error(status: StatusCode, message: impl Into<String>) -> Response {
    (status, axum::Json(serde_json::json!({ "error": message.into() }))).into_response()
}

async fn not_found() -> Response {
    json_error(
        StatusCode::NOT_FOUND,
        "no such path: kvd serves /metrics, /stats, /healthz and /kv/{key}",
    )
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

/// `/healthz`: serving, the shard, and the node's role in its replica group (`standalone`
/// for a node in none; else `leader`, `follower`, `learner`, `joining` or `removed`) with
/// the leader it knows.
async fn healthz(State(s): State<Arc<Shared>>) -> Response {
    let node = &s.node;
    let shard = node.config().cluster.shard.to_string();
    let group = node.group_figures();
    let role = match group.role {
        kvshared::stats::GroupRole::None => "standalone",
        other => other.as_str(),
    };
    let body = serde_json::json!({ "status": "serving", "shard": shard, "role": role, "leader": group.leader });
    axum::Json(body).into_response()
}

/// Runs one op (routed to its key's owner, as RESP's are) and maps its answer; found values
/// are paid from the buffer budget until the response is sent.
async fn one_op(
    s: &Shared,
    (kind, key, value): (OpKind, &[u8], &[u8]),
    map: impl FnOnce(OpReply<'_>, Held) -> Response,
) -> Response {
    let node = &s.node;
    let mut p = Routed::default();
    p.push(node, s.cluster.is_some(), kind, key, value);
    let mut tally = Counts::default();
    let taken = p
        .run(node, s.cluster.as_deref(), &s.edge.budget, &mut tally, None)
        .await;
    let held = Held::adopt(s.edge.budget.clone(), taken);
    node.counters().add_counts(Front::Http.first_id(), &tally);
    match p.outcome(0) {
        Ok(OpReply::Moved { owner, epoch, .. }) => json_error(
            StatusCode::MISDIRECTED_REQUEST,
            format!(
                "the key's slot belongs to shard group {owner} (epoch {epoch}); start kvd with --nodes to forward it"
            ),
        ),
        Ok(OpReply::TryAgain) => json_error(
            StatusCode::SERVICE_UNAVAILABLE,
            "the key's slot is being moved to another shard group; try again",
        ),
        Ok(OpReply::OutOfMemory) => json_error(
            StatusCode::INSUFFICIENT_STORAGE,
            "no memory for the write (--max-memory)",
        ),
        Ok(OpReply::TooLarge) => json_error(StatusCode::PAYLOAD_TOO_LARGE, "the value does not fit in a reply"),
        Ok(OpReply::Malformed(why)) => json_error(StatusCode::BAD_REQUEST, why),
        Ok(reply) => map(reply, held),
        Err(e) => json_error(StatusCode::SERVICE_UNAVAILABLE, e.to_string()),
    }
}

async fn get_key(State(s): State<Arc<Shared>>, key: Key) -> Response {
    one_op(&s, (OpKind::Get, &key.0, &[]), |r, held| match r {
        OpReply::Found(v) => (
            [(header::CONTENT_TYPE, "application/octet-stream")],
            Body::new(body::Guarded::new(v.to_vec(), held)),
        )
            .into_response(),
        _ => json_error(StatusCode::NOT_FOUND, format!("no key {:?}", key.shown())),
    })
    .await
}

/// A `?ttl=` that is not a time to live.
#[derive(Debug, thiserror::Error)]
enum TtlParamError {
    #[error("ttl={text}: {source}")]
    NotADuration {
        text: String,
        source: humantime::DurationError,
    },
    #[error("ttl={0}: give a time to live of 1ms or more")]
    OutOfRange(String),
}

/// `?ttl=DURATION` of a PUT (`10s`, `1500ms`, `1h`, or plain seconds): the key's time to
/// live, as `SET key value PX ms`; without it, a time to live the key had ends.
fn ttl_param(query: Option<&str>) -> Result<Option<std::time::Duration>, TtlParamError> {
    let Some(text) = query.unwrap_or("").split('&').find_map(|kv| kv.strip_prefix("ttl=")) else {
        return Ok(None);
    };
    let ttl = match text.parse::<u64>() {
        Ok(secs) => std::time::Duration::from_secs(secs),
        Err(_) => humantime::parse_duration(text).map_err(|source| TtlParamError::NotADuration {
            text: text.to_string(),
            source,
        })?,
    };
    if ttl.as_millis() == 0 || ttl.as_millis() > u128::from(kvshared::expiry::MAX_TTL_MS) {
        return Err(TtlParamError::OutOfRange(text.to_string()));
    }
    Ok(Some(ttl))
}

async fn put_key(State(s): State<Arc<Shared>>, key: Key, RawQuery(query): RawQuery, request: Body) -> Response {
    let ttl = match ttl_param(query.as_deref()) {
        Ok(ttl) => ttl,
        Err(e) => return json_error(StatusCode::BAD_REQUEST, e.to_string()),
    };
    let config = &s.edge.config;
    let value = match body::collect(request, &s.edge.budget, config.max_frame as usize, config.read_timeout).await {
        Ok(value) => value,
        Err(refused) => return refused.into_response(),
    };
    // With a time to live: SET key value PX ms.
    let put_with = ttl.map(|ttl| {
        use kvshared::expiry::{Deadline, PutIf, PutTtl, PutWith};
        let put = PutWith {
            cond: PutIf::Always,
            ttl: PutTtl::Until(Deadline::after(ttl)),
            value: &value.bytes,
        };
        put.encode()
    });
    one_op(
        &s,
        match &put_with {
            None => (OpKind::Put, &key.0, &value.bytes),
            Some(put) => (OpKind::PutWith, &key.0, put),
        },
        |_, _| StatusCode::NO_CONTENT.into_response(),
    )
    .await
}

async fn delete_key(State(s): State<Arc<Shared>>, key: Key) -> Response {
    one_op(&s, (OpKind::Delete, &key.0, &[]), |r, _| match r {
        OpReply::Deleted => StatusCode::NO_CONTENT.into_response(),
        _ => json_error(StatusCode::NOT_FOUND, format!("no key {:?}", key.shown())),
    })
    .await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_bearer_scheme_is_case_insensitive() {
        assert_eq!(bearer(b"Bearer abc"), Some(&b"abc"[..]));
        assert_eq!(bearer(b"bearer abc"), Some(&b"abc"[..]));
        assert_eq!(bearer(b"BEARER  abc "), Some(&b"abc"[..]));
        assert_eq!(bearer(b"Basic abc"), None);
        assert_eq!(bearer(b"Bearerabc"), None);
        assert_eq!(bearer(b"Bear"), None);
    }
}
