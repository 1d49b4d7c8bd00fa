//! Why a connection ended other than cleanly: one type for every front, for the log (the
//! client was told in its protocol, where it could be told at all).

use std::time::Duration;

use kvshared::frame::FrameError;
use kvshared::wire::WireError;

/// A connection's failure: the reason written to the log when it closes.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ConnError {
    /// Reading or writing the socket failed.
    #[error(transparent)]
    Io(#[from] std::io::Error),
    /// A request that had begun did not arrive whole in time.
    #[error("a request did not arrive whole within {0:?} (--read-timeout)")]
    ReadTimeout(Duration),
    /// The peer's bytes are not a frame of the binary protocol.
    #[error(transparent)]
    Frame(#[from] FrameError),
    /// A reply could not be encoded.
    #[error("cannot encode a reply: {0}")]
    Encode(#[from] WireError),
    /// A batch failed in a way that ends the connection (its outcome is unknown to the
    /// client). The front's own error, kept whole: the edge knows no node.
    #[error(transparent)]
    Batch(Box<dyn std::error::Error + Send + Sync>),
    /// The peer presented a wrong token.
    #[error("the client presented a wrong token")]
    WrongToken,
    /// The connection was refused for the reason it was told.
    #[error("{0}")]
    Refused(&'static str),
    /// TLS: no handshake began in time.
    #[error("no TLS handshake within --read-timeout")]
    NoTlsHandshake,
    /// TLS: the peer spoke a front's protocol in plaintext.
    #[error("plaintext on a TLS port")]
    PlaintextOnTls,
    /// TLS: the handshake began but did not finish in time.
    #[error("TLS handshake timed out")]
    TlsTimeout,
    /// TLS: the handshake failed.
    #[error("TLS handshake failed: {0}")]
    Tls(std::io::Error),
}
