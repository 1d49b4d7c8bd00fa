//! The client's typed errors against peers that are not (or no longer) kvd nodes.

use std::time::Duration;

use kvshared::client::{ClientConfig, ClientError, Cluster};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

fn config() -> ClientConfig {
    ClientConfig {
        request_timeout: Duration::from_millis(500),
        connect_timeout: Duration::from_millis(500),
        ..ClientConfig::default()
    }
}

#[tokio::test]
async fn a_peer_speaking_another_protocol_is_a_protocol_error() {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    tokio::spawn(async move {
        if let Ok((mut s, _)) = listener.accept().await {
            let mut buf = [0u8; 64];
            let _ = s.read(&mut buf).await;
            let _ = s.write_all(b"HTTP/1.1 400 Bad Request\r\n\r\n").await;
        }
    });
    let client = Cluster::new(&[addr], config()).unwrap();
    let err = client.get(b"k").await.unwrap_err();
    assert!(matches!(err, ClientError::Protocol { .. }), "{err}");
    assert!(err.to_string().contains("not a kvd"), "{err}");
}

#[tokio::test]
async fn a_silent_peer_is_a_timeout_and_a_closed_port_a_connect_error() {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let _hold = tokio::spawn(async move {
        let conn = listener.accept().await;
        tokio::time::sleep(Duration::from_secs(5)).await;
        drop(conn);
    });
    let client = Cluster::new(&[addr], config()).unwrap();
    let err = client.put(b"k", b"v").await.unwrap_err();
    assert!(matches!(err, ClientError::Timeout { .. }), "{err}");
    assert!(err.outcome_unknown());

    let closed = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let client = Cluster::new(&[closed.to_string()], config()).unwrap();
    let err = client.get(b"k").await.unwrap_err();
    assert!(matches!(err, ClientError::Connect { .. }), "{err}");
    assert!(!err.outcome_unknown());
}
