//! Which protocol a connection's first bytes speak, so that a client on the wrong port is
//! told where to go instead of waiting for a reply that never comes (`kvd get` at the RESP
//! port waited 5 s; redis-cli at the binary port 10 s).

use kvshared::frame::MAGIC;

use super::front::Front;

/// What a connection's first bytes look like.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Spoken {
    /// One of kvd's fronts.
    Front(Front),
    /// A TLS handshake.
    Tls,
    /// Nothing recognisable yet (too few bytes, or garbage): the listener's own front
    /// reads it and answers as its protocol says.
    Unknown,
}

/// Request methods an HTTP client starts with.
const HTTP_METHODS: [&[u8]; 9] = [
    b"GET", b"HEAD", b"POST", b"PUT", b"DELETE", b"OPTIONS", b"PATCH", b"TRACE", b"CONNECT",
];

/// The protocol `first` (the first bytes a connection sent) speaks.
pub(crate) fn sniff(first: &[u8]) -> Spoken {
    match first {
        [] => Spoken::Unknown,
        // A TLS record of type handshake, version 3.x.
        [0x16, 3, ..] => Spoken::Tls,
        // kvd's header: the magic, then a version byte (never printable).
        [m0, m1, version, ..] if [*m0, *m1] == MAGIC && !version.is_ascii_graphic() => Spoken::Front(Front::Binary),
        [b'*', ..] => Spoken::Front(Front::Resp),
        _ if is_http(first) => Spoken::Front(Front::Http),
        _ if is_inline_command(first) => Spoken::Front(Front::Resp),
        _ => Spoken::Unknown,
    }
}

/// `METHOD /...`, `METHOD *` or `METHOD http://...` (or HTTP/2's preface, `PRI * ...`).
fn is_http(first: &[u8]) -> bool {
    HTTP_METHODS.iter().chain([&&b"PRI"[..]]).any(|m| {
        first
            .strip_prefix(*m)
            .and_then(|rest| rest.strip_prefix(b" "))
            .is_some_and(|target| {
                let lower = target.get(..8).map(<[u8]>::to_ascii_lowercase).unwrap_or_default();
                matches!(target.first(), Some(b'/' | b'*')) || lower.starts_with(b"http://") || lower == b"https://"
            })
    })
}

/// A RESP inline command (`PING\r\n`, `GET key\r\n`): a letter, then a whole line of
/// printable text.
fn is_inline_command(first: &[u8]) -> bool {
    let Some(end) = first.iter().position(|&b| b == b'\n') else {
        return false;
    };
    let line = first[..end].strip_suffix(b"\r").unwrap_or(&first[..end]);
    line.first().is_some_and(u8::is_ascii_alphabetic)
        && line.iter().all(|&b| b == b' ' || b == b'\t' || b.is_ascii_graphic())
}

#[cfg(test)]
mod tests {
    use super::*;
    use kvshared::frame::{FrameHeader, FrameKind};

    #[test]
    fn each_protocol_is_known_by_its_first_bytes() {
        let header = FrameHeader {
            kind: FrameKind::BatchRequest,
            len: 10,
            id: 1,
        }
        .encode();
        assert_eq!(sniff(&header), Spoken::Front(Front::Binary));
        assert_eq!(sniff(b"*1\r\n$4\r\nPING\r\n"), Spoken::Front(Front::Resp));
        assert_eq!(sniff(b"PING\r\n"), Spoken::Front(Front::Resp));
        assert_eq!(sniff(b"get k\r\n"), Spoken::Front(Front::Resp));
        assert_eq!(sniff(b"GET /metrics HTTP/1.1\r\n"), Spoken::Front(Front::Http));
        assert_eq!(sniff(b"PUT /kv/a HTTP/1.1\r\nHost: x\r\n"), Spoken::Front(Front::Http));
        assert_eq!(sniff(b"OPTIONS * HTTP/1.1\r\n"), Spoken::Front(Front::Http));
        assert_eq!(sniff(&[0x16, 3, 1, 0, 200]), Spoken::Tls);
    }

    #[test]
    fn too_little_or_garbage_is_left_to_the_front() {
        assert_eq!(sniff(b""), Spoken::Unknown);
        assert_eq!(sniff(b"K"), Spoken::Unknown);
        assert_eq!(sniff(b"KV"), Spoken::Unknown);
        assert_eq!(sniff(b"GET"), Spoken::Unknown);
        assert_eq!(sniff(&[0, 1, 2, 255]), Spoken::Unknown);
        assert_eq!(sniff(b"hello"), Spoken::Unknown);
        assert_eq!(
            sniff(b"GET http\r\n"),
            Spoken::Front(Front::Resp),
            "an inline GET of the key http"
        );
    }

    proptest::proptest! {
        #[test]
        fn any_bytes_are_classified_without_a_panic(bytes in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..64)) {
            let _ = sniff(&bytes);
        }
    }
}
