//! TLS for the binary protocol (rustls with the ring provider, through tokio-rustls).
//!
//! A server is given a certificate chain and its key (`--tls-cert`, `--tls-key`, PEM); a
//! client is given the CA file that signed it (`--tls-ca`, PEM) and checks the server's
//! certificate against the host or IP address it connects to. The token handshake
//! (see [`crate::auth`]) runs inside the encrypted stream, so the token never crosses the
//! network in the clear.

use std::path::Path;
use std::sync::Arc;

use tokio::net::TcpStream;
use tokio_rustls::rustls::pki_types::pem::PemObject;
use tokio_rustls::rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use tokio_rustls::rustls::{self, RootCertStore};
pub use tokio_rustls::{TlsAcceptor, TlsConnector, client, server};

/// Why TLS could not be set up.
#[derive(Debug, thiserror::Error)]
#[allow(missing_docs)]
pub enum TlsError {
    #[error("cannot read the {what} {path}: {reason}")]
    Read {
        what: &'static str,
        path: String,
        reason: String,
    },
    #[error("TLS setup failed: {0}")]
    Config(String),
}

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// Largest certificate, CA or key file read (a chain of a few certificates is a few KiB).
pub const MAX_PEM_FILE: u64 = 1 << 20;

/// The bytes of a PEM file, read with a bound on its size.
fn pem_bytes(what: &'static str, path: &Path) -> Result<Vec<u8>, TlsError> {
    crate::files::read_bounded(path, MAX_PEM_FILE).map_err(|e| TlsError::Read {
        what,
        path: path.display().to_string(),
        reason: e.to_string(),
    })
}

fn certificates(what: &'static str, path: &Path) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let read = |reason: String| TlsError::Read {
        what,
        path: path.display().to_string(),
        reason,
    };
    let bytes = pem_bytes(what, path)?;
    let certs = CertificateDer::pem_slice_iter(&bytes)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| read(e.to_string()))?;
    if certs.is_empty() {
        return Err(read("no PEM certificate in it".into()));
    }
    Ok(certs)
}

/// The server side of TLS: a certificate chain and its key.
#[derive(Clone)]
pub struct TlsServer {
    acceptor: TlsAcceptor,
}

impl std::fmt::Debug for TlsServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("TlsServer")
    }
}

impl TlsServer {
    /// Serves the certificate chain in `cert` with the private key in `key` (both PEM).
    pub fn from_files(cert: &Path, key: &Path) -> Result<TlsServer, TlsError> {
        Ok(TlsServer {
            acceptor: acceptor(cert, key)?,
        })
    }

    /// Runs the server side of the handshake on an accepted connection.
    pub async fn accept(&self, tcp: TcpStream) -> std::io::Result<server::TlsStream<TcpStream>> {
        self.acceptor.accept(tcp).await
    }
}

/// The server side: accepts TLS connections with the certificate chain in `cert` and the
/// private key in `key` (both PEM).
pub fn acceptor(cert: &Path, key: &Path) -> Result<TlsAcceptor, TlsError> {
    let chain = certificates("certificate file", cert)?;
    let key_pem = pem_bytes("key file", key)?;
    let key = PrivateKeyDer::from_pem_slice(&key_pem).map_err(|e| TlsError::Read {
        what: "key file",
        path: key.display().to_string(),
        reason: e.to_string(),
    })?;
    let config = rustls::ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| TlsError::Config(e.to_string()))?
        .with_no_client_auth()
        .with_single_cert(chain, key)
        .map_err(|e| TlsError::Config(format!("the certificate and key do not go together: {e}")))?;
    Ok(TlsAcceptor::from(Arc::new(config)))
}

/// The client side: trusts the CAs in one PEM file and checks each server's name.
#[derive(Clone)]
pub struct TlsClient {
    connector: TlsConnector,
}

impl std::fmt::Debug for TlsClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("TlsClient")
    }
}

impl TlsClient {
    /// Trusts the certificates in `ca` (PEM): a CA, or a server's self-signed certificate.
    pub fn from_ca_file(ca: &Path) -> Result<TlsClient, TlsError> {
        let mut roots = RootCertStore::empty();
        for cert in certificates("CA file", ca)? {
            roots
                .add(cert)
                .map_err(|e| TlsError::Config(format!("{}: {e}", ca.display())))?;
        }
        let config = rustls::ClientConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .map_err(|e| TlsError::Config(e.to_string()))?
            .with_root_certificates(roots)
            .with_no_client_auth();
        Ok(TlsClient {
            connector: TlsConnector::from(Arc::new(config)),
        })
    }

    /// Runs the TLS handshake on `tcp`, checking that the certificate names `addr`'s host.
    pub async fn connect(&self, addr: &str, tcp: TcpStream) -> std::io::Result<client::TlsStream<TcpStream>> {
        let name = ServerName::try_from(host_of(addr).to_string())
            .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidInput, format!("{addr}: {e}")))?;
        self.connector.connect(name, tcp).await
    }
}

/// The host part of `host:port` or `[v6]:port`.
fn host_of(addr: &str) -> &str {
    let host = addr.rsplit_once(':').map_or(addr, |(host, _)| host);
    host.trim_start_matches('[').trim_end_matches(']')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_host_is_what_the_certificate_must_name() {
        assert_eq!(host_of("127.0.0.1:7070"), "127.0.0.1");
        assert_eq!(host_of("[::1]:7070"), "::1");
        assert_eq!(host_of("db.example:7070"), "db.example");
    }

    #[test]
    fn missing_or_empty_files_are_named() {
        let e = acceptor(Path::new("/nonexistent/cert.pem"), Path::new("/nonexistent/key.pem"))
            .err()
            .unwrap()
            .to_string();
        assert!(e.contains("/nonexistent/cert.pem"), "{e}");
        let e = TlsClient::from_ca_file(Path::new("/dev/null"))
            .err()
            .unwrap()
            .to_string();
        assert!(e.contains("no PEM certificate"), "{e}");
        let e = acceptor(Path::new("/dev/zero"), Path::new("/dev/zero"))
            .err()
            .unwrap()
            .to_string();
        assert!(e.contains("/dev/zero") && e.contains("larger than"), "{e}");
    }
}
