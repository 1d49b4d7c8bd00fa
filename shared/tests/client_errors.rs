//! The client's typed errors against peers that are not (or no longer) kvd nodes.

use std::time::Duration;

use kvshared::client::{ClientConfig, ClientError, Cluster};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

/// Timeouts that only bound a hang: an answer (or a refusal) decides each test's outcome,
/// never the machine's speed.
fn config() -> ClientConfig {
    ClientConfig {
        request_timeout: kvtestkit::HANG,
        connect_timeout: kvtestkit::HANG,
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
    // (A peer that never answers: any timeout ends the wait.)
    let short = ClientConfig {
        request_timeout: Duration::from_millis(500),
        ..config()
    };
    let client = Cluster::new(&[addr], short).unwrap();
    let err = client.put(b"k", b"v").await.unwrap_err();
    assert!(matches!(err, ClientError::Timeout { .. }), "{err}");
    assert!(err.outcome_unknown());

    // A port held for the test that nothing listens on: refused.
    let closed = kvtestkit::addr();
    let client = Cluster::new(&[closed], config()).unwrap();
    let err = client.get(b"k").await.unwrap_err();
    assert!(matches!(err, ClientError::Connect { .. }), "{err}");
    assert!(!err.outcome_unknown());
}

/// A peer that applies every write and then breaks the connection instead of answering it
/// (a garbled reply, then close); reads are answered properly. The recorder must treat the
/// broken writes as unknown outcomes: they did take effect, and later reads see them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_applied_before_a_broken_reply_is_an_unknown_outcome_not_a_violation() {
    use std::collections::HashMap;
    use std::sync::{Arc, Mutex};

    use kvshared::client::{RecordConfig, record};
    use kvshared::frame::{AlignedVec, FrameKind, read_frame};
    use kvshared::history::{CheckOptions, Return, Verdict, check};
    use kvshared::wire::{BatchResponse, BatchView, OpKind, OpStatus, encode_frame};

    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let store: Arc<Mutex<HashMap<Vec<u8>, Vec<u8>>>> = Arc::default();
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let store = store.clone();
            tokio::spawn(async move {
                let mut stream = tokio::io::BufReader::new(stream);
                let (mut body, mut out, mut resp) = (AlignedVec::new(), AlignedVec::new(), BatchResponse::default());
                while let Ok(Some(h)) = read_frame(&mut stream, &mut body, u32::MAX).await {
                    let batch = BatchView::parse(&body).unwrap();
                    resp.reset(batch.len());
                    let mut wrote = false;
                    for i in 0..batch.len() {
                        let op = batch.op(i).unwrap();
                        let mut map = store.lock().unwrap();
                        match op.kind {
                            OpKind::Get => match map.get(op.key) {
                                Some(v) => {
                                    resp.set_found(i, v);
                                }
                                None => resp.set(i, OpStatus::NotFound),
                            },
                            OpKind::Put
                            | OpKind::PutIfAbsent
                            | OpKind::PutIfPresent
                            | OpKind::IncrBy
                            | OpKind::Append
                            | OpKind::SetRange
                            | OpKind::PutWith
                            | OpKind::Expire
                            | OpKind::Ttl
                            | OpKind::Expired
                            | OpKind::Clock
                            | OpKind::Atomic
                            | OpKind::Unchanged
                            | OpKind::IncrByFloat
                            | OpKind::Scan
                            | OpKind::KeyCount
                            | OpKind::Flush
                            | OpKind::Rename
                            | OpKind::SlotSet
                            | OpKind::SlotScan
                            | OpKind::Load
                            | OpKind::SlotMap
                            | OpKind::SlotLoad
                            | OpKind::SlotTrack => {
                                map.insert(op.key.to_vec(), op.value.to_vec());
                                wrote = true;
                            }
                            OpKind::Delete => {
                                map.remove(op.key);
                                wrote = true;
                            }
                        }
                    }
                    if wrote {
                        // Applied; now the reply goes wrong and the connection ends.
                        let _ = stream.get_mut().write_all(b"garbled reply!!!").await;
                        return;
                    }
                    encode_frame(FrameKind::BatchResponse, h.id, &resp, &mut out).unwrap();
                    stream.get_mut().write_all(&out).await.unwrap();
                }
            });
        }
    });
    let client = Arc::new(Cluster::new(&[addr], config()).unwrap());
    let recording = record(
        client,
        &RecordConfig {
            clients: 1,
            keys: 1,
            duration: Duration::from_secs(60),
            max_ops_per_client: 60,
            get_percent: 50,
            put_percent: 50,
            ..RecordConfig::default()
        },
    )
    .await;
    let ops = &recording.history.operations;
    assert!(ops.iter().any(|o| o.ret == Return::Unknown), "no write broke");
    assert!(
        ops.iter().any(|o| matches!(&o.ret, Return::Value { value: Some(_) })),
        "no read saw a broken write's value"
    );
    let verdict = check(&recording.history, &CheckOptions::default()).verdict;
    assert_eq!(verdict, Verdict::Linearizable);
}

/// A node that fails every request is not tried again on every request: after a failure
/// the client fails its requests at once for a growing pause.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_down_node_is_not_retried_on_every_request() {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicU64, Ordering};

    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let accepted = Arc::new(AtomicU64::new(0));
    tokio::spawn({
        let accepted = accepted.clone();
        async move {
            while let Ok((s, _)) = listener.accept().await {
                accepted.fetch_add(1, Ordering::Relaxed);
                drop(s);
            }
        }
    });
    let client = Cluster::new(&[addr], config()).unwrap();
    let mut unavailable = 0;
    for _ in 0..2000 {
        match client.get(b"k").await {
            Err(ClientError::Unavailable { .. }) => unavailable += 1,
            Err(_) => {}
            Ok(v) => panic!("a closing peer answered {v:?}"),
        }
    }
    assert!(unavailable > 1000, "only {unavailable} requests failed fast");
    let tries = accepted.load(Ordering::Relaxed);
    assert!(tries <= 50, "the node was tried {tries} times for 2000 requests");
}

/// Ops answered "try again" (their slot is being handed over) are sent again for as long as
/// the request's time lasts, not for a fixed count of retries: a hand-over off a saturated
/// source pauses its slots' writes for a while (here the peer answers "try again" 16 times),
/// and the writes go through once it ends. (Eight retries gave up after about 180 ms.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ops_answered_try_again_are_retried_while_the_request_lasts() {
    use std::sync::{Arc, Mutex};

    use kvshared::frame::{AlignedVec, FrameKind, read_frame};
    use kvshared::wire::{BatchResponse, BatchView, OpStatus, encode_frame};

    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    const REFUSALS: usize = 16;
    let asked: Arc<Mutex<usize>> = Arc::default();
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let asked = asked.clone();
            tokio::spawn(async move {
                let mut stream = tokio::io::BufReader::new(stream);
                let (mut body, mut out, mut resp) = (AlignedVec::new(), AlignedVec::new(), BatchResponse::default());
                while let Ok(Some(h)) = read_frame(&mut stream, &mut body, u32::MAX).await {
                    let batch = BatchView::parse(&body).unwrap();
                    let refuse = {
                        let mut asked = asked.lock().unwrap();
                        *asked += 1;
                        *asked <= REFUSALS
                    };
                    resp.reset(batch.len());
                    for i in 0..batch.len() {
                        resp.set(i, if refuse { OpStatus::TryAgain } else { OpStatus::Stored });
                    }
                    encode_frame(FrameKind::BatchResponse, h.id, &resp, &mut out).unwrap();
                    stream.get_mut().write_all(&out).await.unwrap();
                }
            });
        }
    });
    let client = Cluster::new(&[addr], config()).unwrap();
    client.put(b"k", b"v").await.expect("stored once the hand-over ended");
    assert!(
        client.redirects().1 >= REFUSALS as u64,
        "retried {} times",
        client.redirects().1
    );
}
