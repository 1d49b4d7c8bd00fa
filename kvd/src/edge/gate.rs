//! The token, the same for every front: who has presented it, and how much a connection
//! may hold before it has.
//!
//! The binary protocol presents it in an `AuthRequest` frame, RESP with `AUTH` or
//! `HELLO ... AUTH`, HTTP in every request's `Authorization: Bearer` header. Each front
//! parses its own way of presenting it and asks the edge ([`super::shared::Edge::check_token`]),
//! which compares in constant time, counts a failure for that front and logs it within the
//! rate limits.

use kvshared::auth::AuthToken;

/// Most bytes a connection may make the node hold before it has presented the token, on
/// every front: enough for `AUTH user token` or `HELLO 3 AUTH user token SETNAME name`
/// with a 1 KiB token, and for one HTTP request's headers.
pub const PRE_AUTH_BYTES: usize = 8 * 1024;

/// Where one connection stands with the token.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Standing {
    /// The node has no token: every request is welcome.
    Open,
    /// The node has one and this connection has not presented it.
    Waiting,
    /// It presented the right one.
    Admitted,
}

impl Standing {
    /// A new connection's standing on a node with `token`.
    pub fn at_start(token: Option<&AuthToken>) -> Standing {
        match token {
            None => Standing::Open,
            Some(_) => Standing::Waiting,
        }
    }

    /// Whether requests may be run.
    pub fn admitted(self) -> bool {
        self != Standing::Waiting
    }

    /// Most bytes one request may carry: [`PRE_AUTH_BYTES`] before the token, else `max`.
    pub fn request_limit(self, max: usize) -> usize {
        if self.admitted() { max } else { PRE_AUTH_BYTES.min(max) }
    }
}
