//! How the edge says no, in the protocol the client speaks: one reason, three encodings.
//!
//! A refused client is told why, in words it can read, and the connection is closed: a
//! binary client gets an error frame for the connection as a whole, a Redis client an
//! error reply, an HTTP client a status with a JSON body.

use std::net::SocketAddr;

use kvshared::frame::{AlignedVec, CONNECTION_ERROR_ID, FrameKind};
use kvshared::wire::{ErrorCode, ErrorReply, encode_frame};

use super::front::Front;

/// Why a connection is not served.
#[derive(Clone, Debug)]
pub(crate) enum Refusal {
    /// Protected mode: no token, bound beyond loopback, the peer on another host.
    Protected,
    /// `--max-conns` connections are open.
    TooMany(usize),
    /// Plaintext on a TLS port.
    TlsOnly,
    /// The client spoke another front's protocol on `here`; that front is served at
    /// `served_at` (or not at all).
    WrongPort { here: Front, served_at: Option<SocketAddr> },
}

impl Refusal {
    /// The reason in words, for a client speaking `spoken`.
    pub fn message(&self, spoken: Front) -> String {
        match self {
            Refusal::Protected => "kvd is in protected mode: it has no token and serves only clients on its own host. \
                Start every kvd with --auth-token-file FILE and give clients the same token (kvd clients: the same file \
                or KV_AUTH_TOKEN_FILE; Redis clients: AUTH; HTTP: Authorization: Bearer), or, on a trusted network only, \
                start kvd with --insecure-no-auth"
                .into(),
            Refusal::TooMany(max) => format!("max connections reached ({max}); try again later"),
            Refusal::TlsOnly => "this port serves TLS only: connect with TLS (kvd tools: --tls-ca FILE; redis-cli: \
                --tls --cacert FILE; curl: https:// and --cacert FILE)"
                .into(),
            Refusal::WrongPort { here, served_at } => {
                let elsewhere = match served_at {
                    Some(addr) => format!("{} is served on {addr}", spoken.name()),
                    None => format!("this kvd does not serve {} (start it with {} ADDR)", spoken.name(), spoken.flag()),
                };
                format!("this is kvd's {} port ({}); {elsewhere}", here.label(), here.flag())
            }
        }
    }

    /// The whole reply, in `spoken`'s protocol.
    pub fn encode(&self, spoken: Front) -> Vec<u8> {
        let message = self.message(spoken);
        match spoken {
            Front::Binary => binary_error(self.code(), message),
            Front::Resp => {
                let prefix = match self {
                    Refusal::Protected => "DENIED",
                    _ => "ERR",
                };
                let line = match self {
                    // What Redis says, which client libraries recognise.
                    Refusal::TooMany(_) => format!("{prefix} max number of clients reached"),
                    _ => format!("{prefix} {message}"),
                };
                format!("-{}\r\n", line.replace(['\r', '\n'], " ")).into_bytes()
            }
            Front::Http => http_error(self.status(), &message),
        }
    }

    fn code(&self) -> ErrorCode {
        match self {
            Refusal::Protected => ErrorCode::AuthRequired,
            Refusal::TooMany(_) => ErrorCode::TooManyConnections,
            Refusal::TlsOnly | Refusal::WrongPort { .. } => ErrorCode::BadFrame,
        }
    }

    fn status(&self) -> &'static str {
        match self {
            Refusal::Protected => "403 Forbidden",
            Refusal::TooMany(_) => "503 Service Unavailable",
            Refusal::TlsOnly | Refusal::WrongPort { .. } => "400 Bad Request",
        }
    }
}

/// A binary error frame about the connection as a whole.
pub(crate) fn binary_error(code: ErrorCode, message: String) -> Vec<u8> {
    let mut out = AlignedVec::new();
    match encode_frame(
        FrameKind::ErrorResponse,
        CONNECTION_ERROR_ID,
        &ErrorReply { code, message },
        &mut out,
    ) {
        Ok(()) => out.to_vec(),
        Err(_) => Vec::new(),
    }
}

/// A complete HTTP/1.1 error response that closes the connection (written by the edge
/// itself: it is sent before, or instead of, the HTTP front).
pub(crate) fn http_error(status: &str, message: &str) -> Vec<u8> {
    let body = serde_json::json!({ "error": message }).to_string();
    format!(
        "HTTP/1.1 {status}\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_protocol_hears_the_reason_in_its_own_terms() {
        let wrong = Refusal::WrongPort {
            here: Front::Binary,
            served_at: Some("127.0.0.1:6379".parse().unwrap()),
        };
        let resp = String::from_utf8(wrong.encode(Front::Resp)).unwrap();
        assert!(resp.starts_with("-ERR this is kvd's binary port"), "{resp}");
        assert!(resp.contains("127.0.0.1:6379") && resp.ends_with("\r\n"), "{resp}");
        let http = String::from_utf8(Refusal::Protected.encode(Front::Http)).unwrap();
        assert!(http.starts_with("HTTP/1.1 403 Forbidden\r\n"), "{http}");
        assert!(http.contains("\"error\":\"kvd is in protected mode"), "{http}");
        let frame = Refusal::TooMany(3).encode(Front::Binary);
        let body = &frame[kvshared::frame::HEADER_LEN..];
        let mut aligned: AlignedVec = AlignedVec::new();
        aligned.extend_from_slice(body);
        let reply = kvshared::wire::parse_error_reply(&aligned).unwrap();
        assert_eq!(reply.code, ErrorCode::TooManyConnections);
        let not_served = Refusal::WrongPort {
            here: Front::Resp,
            served_at: None,
        };
        assert!(not_served.message(Front::Http).contains("start it with --http ADDR"));
    }
}
