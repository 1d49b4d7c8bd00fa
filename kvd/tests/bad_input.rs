//! Untrusted bytes: kvd never panics on them, answers with an error or closes that one
//! connection, and keeps serving everyone else.

use std::sync::Once;
use std::sync::atomic::{AtomicBool, Ordering};

use kvd::local::LocalNode;
use kvd::node::NodeConfig;
use kvshared::client::{ClientConfig, Cluster};
use kvshared::frame::AlignedVec;
use kvshared::frame::{FrameHeader, FrameKind, HEADER_LEN};
use kvshared::wire::{BatchRequest, ErrorCode, ReplyView, encode_frame, parse_error_reply};
use proptest::prelude::*;
use proptest::test_runner::{Config, TestRunner};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

static PANICKED: AtomicBool = AtomicBool::new(false);

/// Records any panic on any thread (a panicking connection task would otherwise be
/// swallowed by tokio and look like a closed connection).
fn watch_for_panics() {
    static HOOK: Once = Once::new();
    HOOK.call_once(|| {
        let default = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            PANICKED.store(true, Ordering::SeqCst);
            default(info);
        }));
    });
}

/// Sends `bytes`, half-closes, and returns everything the server sent back before closing.
async fn exchange(addr: std::net::SocketAddr, bytes: &[u8]) -> Vec<u8> {
    let mut s = TcpStream::connect(addr).await.unwrap();
    // The server may close early (e.g. on a bad header) and reset the rest of the write.
    let _ = s.write_all(bytes).await;
    let _ = s.shutdown().await;
    let mut out = Vec::new();
    let read = tokio::time::timeout(kvtestkit::HANG, s.read_to_end(&mut out)).await;
    assert!(read.is_ok(), "server neither answered nor closed the connection");
    out
}

/// Splits a server's output into frames, checking each is well formed. Bytes that began
/// like another front's protocol (RESP, HTTP) are answered in that protocol instead, one
/// line naming the port; that answer is checked and no frames are returned.
fn frames(mut out: &[u8]) -> Vec<(FrameHeader, AlignedVec)> {
    let mut v = Vec::new();
    if out.starts_with(b"-ERR this is kvd's binary port") || out.starts_with(b"HTTP/1.1 400 Bad Request") {
        let text = String::from_utf8_lossy(out);
        assert!(text.contains("this is kvd's binary port"), "{text}");
        return v;
    }
    while out.len() >= HEADER_LEN {
        let header: [u8; HEADER_LEN] = out[..HEADER_LEN].try_into().unwrap();
        let h = FrameHeader::decode(&header, u32::MAX).expect("server sent a bad header");
        let end = HEADER_LEN + h.len as usize;
        let mut body = AlignedVec::new();
        body.extend_from_slice(&out[HEADER_LEN..end]);
        v.push((h, body));
        out = &out[end..];
    }
    assert!(out.is_empty(), "server sent a partial frame");
    v
}

/// Whether `text` holds something like a pointer: `0x` and at least 8 hex digits.
fn names_an_address(text: &str) -> bool {
    text.match_indices("0x")
        .any(|(at, _)| text[at + 2..].chars().take_while(char::is_ascii_hexdigit).count() >= 8)
}

async fn good_client_still_works(addr: std::net::SocketAddr) {
    let client = Cluster::connect(&[addr.to_string()], ClientConfig::default())
        .await
        .unwrap();
    client.put(b"probe", b"alive").await.unwrap();
    assert_eq!(client.get(b"probe").await.unwrap(), Some(b"alive".to_vec()));
}

fn valid_batch_frame() -> AlignedVec {
    let mut req = BatchRequest::new();
    for i in 0..6u32 {
        req.push_put(format!("key{i}").as_bytes(), &i.to_le_bytes());
        req.push_get(format!("key{}", i / 2).as_bytes());
    }
    req.push_delete(b"key0");
    let mut frame = AlignedVec::new();
    encode_frame(FrameKind::BatchRequest, 99, &req, &mut frame).unwrap();
    frame
}

fn start() -> (tokio::runtime::Runtime, LocalNode) {
    watch_for_panics();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let node = rt
        .block_on(LocalNode::start(NodeConfig {
            edge: kvd::edge::EdgeConfig {
                max_frame: 1 << 20,
                ..Default::default()
            },
            ..NodeConfig::default()
        }))
        .unwrap();
    (rt, node)
}

#[test]
fn random_bytes_never_hurt_the_server() {
    let (rt, node) = start();
    let mut runner = TestRunner::new(Config {
        cases: 64,
        ..Config::default()
    });
    runner
        .run(&proptest::collection::vec(any::<u8>(), 0..600), |bytes| {
            let out = rt.block_on(exchange(node.addr, &bytes));
            for (h, _) in frames(&out) {
                prop_assert!(matches!(h.kind, FrameKind::ErrorResponse | FrameKind::BatchResponse));
            }
            Ok(())
        })
        .unwrap();
    rt.block_on(good_client_still_works(node.addr));
    assert!(!PANICKED.load(Ordering::SeqCst));
}

#[test]
fn mutated_valid_frames_get_an_answer_or_a_close_never_a_panic() {
    let (rt, node) = start();
    let frame = valid_batch_frame();
    let len = frame.len();
    let mut runner = TestRunner::new(Config {
        cases: 256,
        ..Config::default()
    });
    // Mostly body bytes (where validation and span checks matter), sometimes the header.
    let mutation = proptest::collection::vec((0..len, any::<u8>()), 1..8);
    runner
        .run(&mutation, |flips| {
            let mut bytes = frame.to_vec();
            for (at, v) in flips {
                bytes[at] = v;
            }
            let out = rt.block_on(exchange(node.addr, &bytes));
            for (h, body) in frames(&out) {
                match h.kind {
                    FrameKind::BatchResponse => {
                        let view = ReplyView::parse(&body).expect("server sent an invalid response");
                        for i in 0..view.len() {
                            let _ = view.result(i);
                        }
                    }
                    // A mutated kind byte can turn the frame into a stats request.
                    FrameKind::StatsResponse => {
                        kvshared::wire::decode_stats(&body).expect("server sent invalid stats");
                    }
                    FrameKind::ErrorResponse => {
                        let e = parse_error_reply(&body).expect("server sent an invalid error reply");
                        // A stable message, no internals such as heap addresses.
                        prop_assert!(!names_an_address(&e.message), "leaks internals: {}", e.message);
                    }
                    // ... or into a token offer, which a server without a token accepts,
                    // or (rarely) into a settings change whose body still validates.
                    FrameKind::AuthOk | FrameKind::ConfigOk => {
                        prop_assert!(body.is_empty(), "{:?} with a body", h.kind);
                    }
                    other => prop_assert!(false, "unexpected {other:?}"),
                }
            }
            Ok(())
        })
        .unwrap();
    rt.block_on(good_client_still_works(node.addr));
    assert!(!PANICKED.load(Ordering::SeqCst));
}

#[test]
fn truncated_frames_and_mid_frame_disconnects_close_only_that_connection() {
    let (rt, node) = start();
    let frame = valid_batch_frame();
    rt.block_on(async {
        for cut in [
            1,
            8,
            HEADER_LEN - 1,
            HEADER_LEN,
            HEADER_LEN + 1,
            frame.len() / 2,
            frame.len() - 1,
        ] {
            let out = exchange(node.addr, &frame[..cut]).await;
            assert!(frames(&out).is_empty(), "no answer to a frame that never finished");
        }
        // A peer that vanishes mid-frame without a clean shutdown.
        let mut s = TcpStream::connect(node.addr).await.unwrap();
        s.write_all(&frame[..frame.len() / 2]).await.unwrap();
        drop(s);
        good_client_still_works(node.addr).await;
        let stats = Cluster::connect(&[node.addr.to_string()], ClientConfig::default())
            .await
            .unwrap()
            .stats(0)
            .await
            .unwrap();
        assert!(stats.counts.io >= 6, "truncations counted: {:?}", stats.counts);
    });
    assert!(!PANICKED.load(Ordering::SeqCst));
}

#[test]
fn a_huge_length_prefix_is_refused_without_allocating() {
    let (rt, node) = start();
    rt.block_on(async {
        let header = FrameHeader {
            kind: FrameKind::BatchRequest,
            len: u32::MAX,
            id: 5,
        };
        let out = exchange(node.addr, &header.encode()).await;
        let replies = frames(&out);
        assert_eq!(replies.len(), 1);
        let (h, body) = &replies[0];
        assert_eq!(h.kind, FrameKind::ErrorResponse);
        let e = parse_error_reply(body).unwrap();
        assert_eq!(e.code, ErrorCode::FrameTooLarge);
        assert!(e.message.contains("4294967295"), "{}", e.message);
        good_client_still_works(node.addr).await;
    });
    assert!(!PANICKED.load(Ordering::SeqCst));
}

#[test]
fn a_peer_of_another_version_is_told_so() {
    let (rt, node) = start();
    rt.block_on(async {
        // A peer one version ahead of ours.
        let theirs = kvshared::frame::VERSION.wrapping_add(1);
        let mut bytes = valid_batch_frame().to_vec();
        bytes[2] = theirs;
        let replies = frames(&exchange(node.addr, &bytes).await);
        let e = parse_error_reply(&replies[0].1).unwrap();
        assert_eq!(e.code, ErrorCode::VersionMismatch);
        let ours = format!("v{}", kvshared::frame::VERSION);
        assert!(
            e.message.contains(&ours) && e.message.contains(&format!("v{theirs}")),
            "{}",
            e.message
        );

        // Another front's protocol, e.g. HTTP, is told where that is served.
        let out = exchange(node.addr, b"GET / HTTP/1.1\r\nHost: x\r\n\r\n").await;
        let text = String::from_utf8_lossy(&out);
        assert!(text.starts_with("HTTP/1.1 400 Bad Request"), "{text}");
        assert!(
            text.contains("this kvd does not serve HTTP (start it with --http ADDR)"),
            "{text}"
        );
        // Something that is no protocol at all gets a binary error frame.
        let replies = frames(&exchange(node.addr, b"\x00\x01garbage that is no protocol\r\n").await);
        assert_eq!(parse_error_reply(&replies[0].1).unwrap().code, ErrorCode::BadFrame);
        good_client_still_works(node.addr).await;
    });
    assert!(!PANICKED.load(Ordering::SeqCst));
}

#[test]
fn a_silent_client_does_not_block_anyone() {
    let (rt, node) = start();
    rt.block_on(async {
        let idle: Vec<TcpStream> = {
            let mut v = Vec::new();
            for _ in 0..10 {
                v.push(TcpStream::connect(node.addr).await.unwrap());
            }
            v
        };
        good_client_still_works(node.addr).await;
        drop(idle);
    });
    assert!(!PANICKED.load(Ordering::SeqCst));
}

#[test]
fn a_malformed_body_gets_an_error_and_the_connection_goes_on() {
    let (rt, node) = start();
    rt.block_on(async {
        let mut bytes = FrameHeader {
            kind: FrameKind::BatchRequest,
            len: 32,
            id: 11,
        }
        .encode()
        .to_vec();
        bytes.extend_from_slice(&[0xEE; 32]);
        // Then a good frame on the same connection.
        bytes.extend_from_slice(&valid_batch_frame());
        let replies = frames(&exchange(node.addr, &bytes).await);
        assert_eq!(replies.len(), 2);
        assert_eq!((replies[0].0.kind, replies[0].0.id), (FrameKind::ErrorResponse, 11));
        let e = parse_error_reply(&replies[0].1).unwrap();
        assert_eq!(e.code, ErrorCode::MalformedBody);
        assert_eq!(
            e.message,
            "malformed body: the bytes are not a valid archive of the expected type"
        );
        assert_eq!((replies[1].0.kind, replies[1].0.id), (FrameKind::BatchResponse, 99));
    });
    assert!(!PANICKED.load(Ordering::SeqCst));
}
