//! The shared secret that lets a client in (`--auth-token-file`).
//!
//! A token is read from a file (`--auth-token-file`, or the file named by
//! `KV_AUTH_TOKEN_FILE`) or from `KV_AUTH_TOKEN`; never from a flag's value, where `ps`
//! would show it to every user of the machine. Server and clients load it the same way.
//!
//! On the wire, a client's first frame is an `AuthRequest` whose body is the token; the
//! server compares it in constant time (the time taken says nothing about how much of a
//! guess was right) and answers `AuthOk`, or an error and a close.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use subtle::ConstantTimeEq;

/// Environment variable naming the token file (the default of `--auth-token-file`).
pub const TOKEN_FILE_ENV: &str = "KV_AUTH_TOKEN_FILE";
/// Environment variable holding the token itself (used when no file is named).
pub const TOKEN_ENV: &str = "KV_AUTH_TOKEN";
/// Longest token accepted, and the largest frame a connection may send before it has
/// presented one (an unauthenticated peer cannot make a node allocate more).
pub const MAX_TOKEN_LEN: usize = 1024;
/// Shortest token accepted: a short secret can be guessed.
pub const MIN_TOKEN_LEN: usize = 16;
/// Largest token file read (a token and surrounding white space).
pub const MAX_TOKEN_FILE: u64 = 64 * 1024;

/// Warns when users other than the owner may read the token file.
fn warn_if_readable_by_others(path: &Path) {
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        if let Ok(meta) = std::fs::metadata(path)
            && meta.permissions().mode() & 0o044 != 0
        {
            tracing::warn!(
                "the token file {} may be read by other users of this machine (mode {:o}): chmod 600 it",
                path.display(),
                meta.permissions().mode() & 0o777
            );
        }
    }
}

/// Why a token could not be loaded.
#[derive(Debug, thiserror::Error)]
#[allow(missing_docs)]
pub enum AuthError {
    #[error("cannot read the token file {path}: {source}")]
    Read { path: PathBuf, source: std::io::Error },
    #[error(
        "the token in {from} is {len} bytes; it must be {MIN_TOKEN_LEN} to {MAX_TOKEN_LEN} bytes (e.g. `openssl rand -hex 32`)"
    )]
    Length { from: String, len: usize },
}

/// A shared secret. Its `Debug` output never shows it.
#[derive(Clone)]
pub struct AuthToken(Arc<[u8]>);

impl std::fmt::Debug for AuthToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("AuthToken(<redacted>)")
    }
}

impl AuthToken {
    /// A token from its bytes (surrounding whitespace, such as a file's final newline, is
    /// not part of it).
    pub fn new(bytes: &[u8], from: &str) -> Result<AuthToken, AuthError> {
        let token = bytes.trim_ascii();
        if !(MIN_TOKEN_LEN..=MAX_TOKEN_LEN).contains(&token.len()) {
            return Err(AuthError::Length {
                from: from.to_string(),
                len: token.len(),
            });
        }
        Ok(AuthToken(token.into()))
    }

    /// Reads the token from `path`: at most [`MAX_TOKEN_FILE`] bytes (a path such as
    /// `/dev/zero` is refused, not read for ever). A file that other users may read is
    /// taken with a warning, as ssh warns of a readable key.
    pub fn from_file(path: &Path) -> Result<AuthToken, AuthError> {
        let read = |source| AuthError::Read {
            path: path.to_path_buf(),
            source,
        };
        let bytes = crate::files::read_bounded(path, MAX_TOKEN_FILE).map_err(read)?;
        warn_if_readable_by_others(path);
        AuthToken::new(&bytes, &path.display().to_string())
    }

    /// The token from `file` if given, else from `KV_AUTH_TOKEN`, else none.
    pub fn load(file: Option<&Path>) -> Result<Option<AuthToken>, AuthError> {
        if let Some(path) = file {
            return AuthToken::from_file(path).map(Some);
        }
        match std::env::var_os(TOKEN_ENV) {
            Some(value) if !value.is_empty() => AuthToken::new(value.as_encoded_bytes(), TOKEN_ENV).map(Some),
            _ => Ok(None),
        }
    }

    /// Whether `presented` is this token, compared in constant time.
    pub fn matches(&self, presented: &[u8]) -> bool {
        // Lengths are compared openly: the length of a secret of this size gives nothing away.
        presented.len() == self.0.len() && bool::from(self.0.ct_eq(presented))
    }

    /// The token's bytes, to present to a server.
    pub fn as_bytes(&self) -> &[u8] {
        &self.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_token_matches_only_itself_and_never_shows() {
        let t = AuthToken::new(b"  0123456789abcdef0123\n", "test").unwrap();
        assert!(t.matches(b"0123456789abcdef0123"));
        assert!(!t.matches(b"0123456789abcdef0124"));
        assert!(!t.matches(b"0123456789abcdef012"));
        assert!(!t.matches(b""));
        assert!(!format!("{t:?}").contains("0123"));
    }

    #[test]
    fn short_or_huge_tokens_are_refused_with_advice() {
        let e = AuthToken::new(b"secret", "FILE").unwrap_err().to_string();
        assert!(e.contains("FILE") && e.contains("openssl rand"), "{e}");
        assert!(AuthToken::new(&[b'x'; MAX_TOKEN_LEN + 1], "FILE").is_err());
    }
}
