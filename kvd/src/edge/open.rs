//! Opening an accepted connection: TLS when the node serves it (on every front), and the
//! reply to a client that is not served at all.

use std::sync::Arc;
use std::time::Duration;

use kvshared::stats::Counter;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::broadcast;
use tokio::time::Instant;

use super::conn::{Conn, ConnError, LAST_READ, ReadHalf};
use super::deadline::DeadlineWriter;
use super::front::Front;
use super::refusal::Refusal;
use super::shared::{Edge, Peer};
use super::sniff::{Spoken, sniff};

/// The two directions of a connection, plain or TLS.
type Halves = (ReadHalf, Box<dyn tokio::io::AsyncWrite + Send + Unpin>);

/// Opens `stream` for `front`: the TLS handshake if the node serves TLS (within
/// `--read-timeout`); a plaintext client on a TLS port is told so in its own protocol.
/// `None`: the connection is over (counted).
pub(crate) async fn open(
    edge: Arc<Edge>,
    front: Front,
    stream: TcpStream,
    id: u64,
    shutdown: broadcast::Receiver<()>,
) -> Option<Conn> {
    let addr = stream.peer_addr().map(|a| a.to_string()).unwrap_or_else(|_| "?".into());
    let _ = stream.set_nodelay(true);
    let mut peer = Peer::new(id, addr, front);
    edge.count(&peer, Counter::ConnsOpened, 1);
    let config = &edge.config;
    let halves = match &config.tls {
        None => Ok(split_plain(stream)),
        Some(_) => handshake(&edge, &mut peer, stream, config.read_timeout).await,
    };
    match halves {
        Ok((read, write)) => {
            let write = DeadlineWriter::new(write, config.write_timeout, edge.counters.clone(), id);
            Some(Conn::new(edge, peer, read, write, shutdown))
        }
        Err(why) => {
            tracing::debug!(peer = %peer.addr, %why, "connection not opened");
            edge.count(&peer, Counter::ConnsClosed, 1);
            None
        }
    }
}

fn split_plain(stream: TcpStream) -> Halves {
    let (read, write) = stream.into_split();
    (Box::new(read), Box::new(write))
}

/// The server side of TLS, after a look at the first bytes: a client that speaks one of
/// the fronts' protocols in plaintext is told, in that protocol, to use TLS.
async fn handshake(edge: &Edge, peer: &mut Peer, stream: TcpStream, within: Duration) -> Result<Halves, ConnError> {
    let Some(tls) = &edge.config.tls else {
        return Ok(split_plain(stream));
    };
    let mut first = [0u8; 16];
    let spoken = match tokio::time::timeout(within, stream.peek(&mut first)).await {
        Ok(Ok(n)) => sniff(first.get(..n).unwrap_or_default()),
        Ok(Err(e)) => return Err(e.into()),
        Err(_) => return Err(ConnError::NoTlsHandshake),
    };
    if let Spoken::Front(spoken) = spoken {
        edge.count(peer, Counter::WrongProtocol, 1);
        if let Some(suppressed) = edge.may_warn(peer) {
            tracing::warn!(peer = %peer.addr, suppressed, "refused a plaintext client on a TLS port");
        }
        let (read, write) = split_plain(stream);
        say_and_close(read, write, &Refusal::TlsOnly.encode(spoken)).await;
        return Err(ConnError::PlaintextOnTls);
    }
    let stream = tokio::time::timeout(within, tls.accept(stream))
        .await
        .map_err(|_| ConnError::TlsTimeout)?
        .map_err(ConnError::Tls)?;
    let (read, write) = tokio::io::split(stream);
    Ok((Box::new(read), Box::new(write)))
}

/// Tells a connection that is not served why (protected mode, over `--max-conns`) in
/// `front`'s protocol, inside TLS when the node serves TLS, then closes it.
pub(crate) async fn refuse(edge: &Edge, front: Front, stream: TcpStream, refusal: Refusal) {
    let id = front.first_id();
    let mut peer = Peer::new(id, String::new(), front);
    let halves = match &edge.config.tls {
        None => Ok(split_plain(stream)),
        Some(_) => handshake(edge, &mut peer, stream, LAST_READ * 10).await,
    };
    if let Ok((read, write)) = halves {
        say_and_close(read, write, &refusal.encode(front)).await;
    }
}

/// Writes `reply`, ends our side, and reads and drops what the client already sent (at
/// most a little, briefly): closing with unread input resets the connection, which can
/// destroy the reason before it is read.
async fn say_and_close(mut read: ReadHalf, mut write: Box<dyn tokio::io::AsyncWrite + Send + Unpin>, reply: &[u8]) {
    let _ = tokio::time::timeout(Duration::from_secs(1), async {
        let _ = write.write_all(reply).await;
        let _ = write.shutdown().await;
    })
    .await;
    let mut sink = [0u8; 4096];
    let until = Instant::now() + LAST_READ;
    let mut left = 1 << 20;
    while let Ok(Ok(n)) = tokio::time::timeout_at(until, read.read(&mut sink)).await
        && n > 0
        && left > n
    {
        left -= n;
    }
}
