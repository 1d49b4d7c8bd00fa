//! The key of `/kv/{key}`, read from the request's path as sent: percent-decoded strictly
//! (RFC 3986: `%` and two hex digits), so that a key is never taken for something else.
//! A `%` not followed by two hex digits is refused (400) rather than taken literally, as
//! the router's own path extractor would; a decoded key may be any bytes.

use axum::extract::FromRequestParts;
use axum::http::StatusCode;
use axum::http::request::Parts;
use axum::response::Response;

/// The route's prefix before the key.
const PREFIX: &str = "/kv/";

/// A key from the path of `/kv/{key}`.
pub(super) struct Key(pub Vec<u8>);

impl Key {
    /// The key for messages (lossy where it is not UTF-8).
    pub fn shown(&self) -> String {
        String::from_utf8_lossy(&self.0).into_owned()
    }
}

impl<S: Send + Sync> FromRequestParts<S> for Key {
    type Rejection = Response;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Key, Response> {
        let path = parts.uri.path();
        let raw = path.strip_prefix(PREFIX).unwrap_or(path);
        decode(raw)
            .map(Key)
            .map_err(|why| super::json_error(StatusCode::BAD_REQUEST, why.to_string()))
    }
}

/// A `%` in a key's path that is not followed by two hex digits.
#[derive(Debug, PartialEq, thiserror::Error)]
#[error(
    "the key's path has {shown:?} at byte {at}: a % must be followed by two hex digits (write a % in a key as %25)"
)]
pub struct BadEscape {
    shown: String,
    at: usize,
}

/// `raw` with each `%XX` replaced by its byte; an error naming the first `%` that is not
/// followed by two hex digits.
fn decode(raw: &str) -> Result<Vec<u8>, BadEscape> {
    let bytes = raw.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while let Some(&b) = bytes.get(i) {
        if b != b'%' {
            out.push(b);
            i += 1;
            continue;
        }
        let digit = |at: usize| bytes.get(at).and_then(|&h| (h as char).to_digit(16));
        match (digit(i + 1), digit(i + 2)) {
            (Some(high), Some(low)) => out.push((high * 16 + low) as u8),
            _ => {
                let shown: String = raw[i..].chars().take(3).collect();
                return Err(BadEscape { shown, at: i });
            }
        }
        i += 3;
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::decode;
    use proptest::prelude::*;

    #[test]
    fn percent_escapes_are_decoded_strictly() {
        assert_eq!(decode("a%20b").unwrap(), b"a b");
        assert_eq!(decode("%25").unwrap(), b"%");
        assert_eq!(decode("%ff%00").unwrap(), [0xff, 0]);
        assert_eq!(decode("plain/with/slashes").unwrap(), b"plain/with/slashes");
        for bad in ["%zz", "%", "a%2", "%+f", "%2g"] {
            assert!(decode(bad).is_err(), "{bad}");
        }
    }

    proptest! {
        /// Any bytes, escaped, come back; no path panics.
        #[test]
        fn escaped_keys_round_trip_and_no_path_panics(key in proptest::collection::vec(any::<u8>(), 0..40), junk in ".{0,40}") {
            let escaped: String = key.iter().map(|b| format!("%{b:02X}")).collect();
            prop_assert_eq!(decode(&escaped).unwrap(), key);
            let _ = decode(&junk);
        }
    }
}
