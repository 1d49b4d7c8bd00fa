//! End-to-end behaviour of kvd through the real client: routing errors, pipelining,
//! graceful shutdown and statistics.

use std::sync::Arc;
use std::time::Duration;

use kvd::local::{LocalCluster, LocalNode};
use kvd::node::NodeConfig;
use kvshared::client::{ClientConfig, ClientError, Cluster, Op, Outcome};
use kvshared::routing::{ShardId, owner_node};
use kvshared::wire::{BatchRequest, OpReply};

fn config() -> ClientConfig {
    ClientConfig {
        request_timeout: Duration::from_secs(5),
        ..ClientConfig::default()
    }
}

#[tokio::test]
async fn a_node_refuses_keys_it_does_not_own_and_names_the_owner() {
    let node = LocalNode::start(NodeConfig {
        cluster: kvd::node::ClusterConfig {
            shard: ShardId { index: 1, count: 3 },
            ..Default::default()
        },
        ..NodeConfig::default()
    })
    .await
    .unwrap();
    // A misconfigured client that believes this node is the whole cluster.
    let client = Cluster::connect(&[node.addr.to_string()], config()).await.unwrap();
    let keys: Vec<String> = (0..60).map(|i| format!("user{i}")).collect();
    let ops: Vec<Op<'_>> = keys.iter().map(|k| Op::Put(k.as_bytes(), b"v")).collect();
    let results = client.batch(&ops).await;
    let mut refused = 0;
    for (k, r) in keys.iter().zip(results) {
        let owner = owner_node(k.as_bytes(), 3);
        match r {
            Ok(Outcome::Stored) => assert_eq!(owner, 1, "{k} stored on a node that does not own it"),
            Err(ClientError::Moved {
                owner: named, epoch, ..
            }) => {
                assert_eq!((named, epoch), (owner, 0));
                refused += 1;
            }
            other => panic!("unexpected {other:?}"),
        }
    }
    assert!(refused > 20, "most keys belong elsewhere");
    let foreign = keys.iter().find(|k| owner_node(k.as_bytes(), 3) != 1).unwrap();
    let text = client.get(foreign.as_bytes()).await.unwrap_err().to_string();
    assert!(text.contains("--nodes lists 1 groups"), "{text}");
    node.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_pipelined_requests_on_one_connection_each_get_their_own_answer() {
    let node = LocalNode::start(NodeConfig::default()).await.unwrap();
    let client = Arc::new(
        Cluster::connect(
            &[node.addr.to_string()],
            ClientConfig {
                conns_per_node: 1,
                pipeline: 32,
                ..config()
            },
        )
        .await
        .unwrap(),
    );
    let mut tasks = Vec::new();
    for t in 0..16u32 {
        let client = client.clone();
        tasks.push(tokio::spawn(async move {
            for round in 0..50u32 {
                let key = format!("t{t}-{round}");
                let value = format!("value of {key}");
                client.put(key.as_bytes(), value.as_bytes()).await.unwrap();
                assert_eq!(client.get(key.as_bytes()).await.unwrap(), Some(value.into_bytes()));
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    // All of that went over one connection (plus the one stats call opens none: it reuses it).
    let stats = client.stats(0).await.unwrap();
    assert_eq!(stats.counts.conns_opened, 1);
    assert_eq!((stats.counts.puts, stats.counts.gets), (800, 800));
    node.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_answers_the_batches_in_flight() {
    let node = LocalNode::start(NodeConfig::default()).await.unwrap();
    let client = Cluster::connect(
        &[node.addr.to_string()],
        ClientConfig {
            pipeline: 64,
            ..config()
        },
    )
    .await
    .unwrap();
    let mut batch = BatchRequest::new();
    for i in 0..2000u32 {
        batch.push_put(format!("k{i}").as_bytes(), b"some value");
    }
    // Queue 40 big batches, then ask the node to stop while they are in flight.
    let mut flights = Vec::new();
    for _ in 0..40 {
        flights.push(client.start_batch(0, &batch).await.unwrap());
    }
    let stopping = tokio::spawn(node.stop());
    let mut answered = 0;
    for f in flights {
        let reply = f
            .wait(Duration::from_secs(10))
            .await
            .expect("in-flight batch lost at shutdown");
        let view = reply.batch().unwrap();
        assert_eq!(view.len(), 2000);
        assert_eq!(view.result(1999), OpReply::Stored);
        answered += 1;
    }
    assert_eq!(answered, 40);
    tokio::time::timeout(Duration::from_secs(10), stopping)
        .await
        .expect("shutdown did not finish")
        .unwrap();
    // And the node is gone afterwards.
    assert!(client.get(b"k1").await.is_err());
}

#[tokio::test]
async fn stats_move_as_ops_are_served() {
    let cluster = LocalCluster::start(2, |_| {}).await.unwrap();
    let client = Cluster::connect(&cluster.addrs(), config()).await.unwrap();
    let mut before_stats = Vec::new();
    for n in 0..2 {
        before_stats.push(client.stats(n).await.unwrap());
    }
    let keys: Vec<String> = (0..100).map(|i| format!("s{i}")).collect();
    let puts: Vec<Op<'_>> = keys.iter().map(|k| Op::Put(k.as_bytes(), b"0123456789")).collect();
    let gets: Vec<Op<'_>> = keys
        .iter()
        .map(|k| Op::Get(k.as_bytes()))
        .chain([Op::Get(b"missing")])
        .collect();
    assert!(client.batch(&puts).await.iter().all(|r| r.is_ok()));
    assert!(client.batch(&gets).await.iter().all(|r| r.is_ok()));
    let mut total_puts = 0;
    let mut total_keys = 0;
    let mut total_misses = 0;
    for (n, b) in before_stats.iter().enumerate() {
        let a = client.stats(n).await.unwrap();
        let (ac, bc) = (&a.counts, &b.counts);
        assert_eq!(
            a.shard,
            ShardId {
                index: n as u32,
                count: 2
            }
        );
        assert!(ac.puts > bc.puts, "node {n} served puts");
        assert!(ac.bytes_in > bc.bytes_in && ac.bytes_out > bc.bytes_out);
        assert!(ac.batches > bc.batches);
        assert!(a.uptime_ms >= b.uptime_ms);
        assert!(
            a.system.host_mem_total_bytes > 0 && a.system.process_rss_bytes > 0,
            "sampler ran"
        );
        total_puts += ac.puts - bc.puts;
        total_keys += a.keys;
        total_misses += ac.misses;
    }
    assert_eq!(total_puts, 100);
    assert_eq!(total_keys, 100);
    assert_eq!(total_misses, 1);
}

/// Each node reports the load of its last window (reads/s, writes/s, server-side p99):
/// what a watcher of hot shards reads without keeping state of its own.
#[tokio::test]
async fn stats_carry_the_last_windows_load() {
    let cluster = LocalCluster::start(1, |_| {}).await.unwrap();
    let client = Cluster::connect(&cluster.addrs(), config()).await.unwrap();
    assert_eq!(
        client.stats(0).await.unwrap().recent.window_ms,
        0,
        "no window has ended yet"
    );
    let keys: Vec<String> = (0..200).map(|i| format!("w{i}")).collect();
    let puts: Vec<Op<'_>> = keys.iter().map(|k| Op::Put(k.as_bytes(), b"v")).collect();
    let gets: Vec<Op<'_>> = keys.iter().map(|k| Op::Get(k.as_bytes())).collect();
    assert!(client.batch(&puts).await.iter().all(|r| r.is_ok()));
    for _ in 0..3 {
        assert!(client.batch(&gets).await.iter().all(|r| r.is_ok()));
    }
    tokio::time::sleep(std::time::Duration::from_millis(1100)).await;
    let r = client.stats(0).await.unwrap().recent;
    assert!(r.window_ms >= 1000, "{r:?}");
    // 600 gets and 200 puts in a window of a second or a little more.
    let secs = r.window_ms as f64 / 1000.0;
    assert!((r.reads_per_sec * secs - 600.0).abs() < 1.0, "{r:?}");
    assert!((r.writes_per_sec * secs - 200.0).abs() < 1.0, "{r:?}");
    assert!(r.read_p99_us > 0.0 && r.write_p99_us > 0.0, "{r:?}");
    // The next window saw nothing (asked at once, it still reports the last full one).
    assert_eq!(client.stats(0).await.unwrap().recent, r);
}

#[tokio::test]
async fn a_node_going_down_fails_only_its_own_ops() {
    let mut cluster = LocalCluster::start(2, |_| {}).await.unwrap();
    let client = Cluster::connect(
        &cluster.addrs(),
        ClientConfig {
            request_timeout: Duration::from_secs(2),
            connect_timeout: Duration::from_secs(1),
            ..ClientConfig::default()
        },
    )
    .await
    .unwrap();
    let dead = cluster.nodes.pop().unwrap();
    dead.stop().await;
    let keys: Vec<String> = (0..40).map(|i| format!("d{i}")).collect();
    let ops: Vec<Op<'_>> = keys.iter().map(|k| Op::Put(k.as_bytes(), b"v")).collect();
    let results = client.batch(&ops).await;
    for (k, r) in keys.iter().zip(results) {
        if owner_node(k.as_bytes(), 2) == 0 {
            assert_eq!(r, Ok(Outcome::Stored));
        } else {
            let e = r.unwrap_err();
            assert!(
                matches!(
                    e,
                    ClientError::NodeDown { .. } | ClientError::Connect { .. } | ClientError::Unavailable { .. }
                ),
                "{e}"
            );
        }
    }
}

#[tokio::test]
async fn oversized_requests_are_refused_before_sending() {
    let node = LocalNode::start(NodeConfig::default()).await.unwrap();
    let client = Cluster::connect(
        &[node.addr.to_string()],
        ClientConfig {
            max_frame: 1024,
            ..config()
        },
    )
    .await
    .unwrap();
    let big = vec![7u8; 4096];
    assert!(matches!(
        client.put(b"big", &big).await,
        Err(ClientError::FrameTooLarge { .. })
    ));
    // The connection is still usable afterwards.
    client.put(b"small", b"ok").await.unwrap();
    node.stop().await;
}

/// Over `--max-conns`, a new connection is told why at once and closed (as Redis does), not
/// parked in the accept queue; once a slot is free, new clients are served again.
#[tokio::test]
async fn over_max_conns_a_client_is_refused_at_once_with_a_reason() {
    let node = LocalNode::start(NodeConfig {
        edge: kvd::edge::EdgeConfig {
            max_conns: 1,
            ..Default::default()
        },
        ..NodeConfig::default()
    })
    .await
    .unwrap();
    let addr = node.addr.to_string();
    let first = Cluster::connect(std::slice::from_ref(&addr), config()).await.unwrap();
    first.put(b"a", b"1").await.unwrap();
    let second = Cluster::new(std::slice::from_ref(&addr), config()).unwrap();
    let err = tokio::time::timeout(kvtestkit::HANG, second.get(b"a"))
        .await
        .expect("the extra client was parked instead of refused")
        .unwrap_err();
    assert!(err.to_string().contains("max connections reached (1)"), "{err}");
    let stats = first.stats(0).await.unwrap();
    assert_eq!(stats.counts.conns_refused, 1);
    drop(first);
    // The slot frees when the server sees the first connection close: wait for that event.
    let third = Cluster::new(std::slice::from_ref(&addr), config()).unwrap();
    let v = kvtestkit::until_async("the third client to be served", kvtestkit::HANG, || third.get(b"a")).await;
    assert_eq!(v, Some(b"1".to_vec()));
    node.stop().await;
}

/// A connection that sends nothing is closed after `--idle-timeout`; one that trickles a
/// frame is closed after `--read-timeout`. Meanwhile others are served.
#[tokio::test]
async fn idle_and_trickling_connections_are_closed() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let node = LocalNode::start(NodeConfig {
        edge: kvd::edge::EdgeConfig {
            idle_timeout: Some(Duration::from_millis(200)),
            read_timeout: Duration::from_millis(300),
            ..Default::default()
        },
        ..NodeConfig::default()
    })
    .await
    .unwrap();
    let mut idle = tokio::net::TcpStream::connect(node.addr).await.unwrap();
    let mut trickle = tokio::net::TcpStream::connect(node.addr).await.unwrap();
    trickle.write_all(b"KV").await.unwrap(); // 2 of the 16 header bytes, then nothing
    let client = Cluster::connect(&[node.addr.to_string()], config()).await.unwrap();
    client.put(b"k", b"v").await.unwrap();
    let mut buf = [0u8; 64];
    for (name, conn) in [("idle", &mut idle), ("trickling", &mut trickle)] {
        // The server closes it: EOF (or a reset), well within the deadline.
        let read = tokio::time::timeout(Duration::from_secs(10), conn.read(&mut buf))
            .await
            .unwrap_or_else(|_| panic!("the {name} connection was never closed"));
        assert!(matches!(read, Ok(0) | Err(_)), "{name}: {read:?}");
    }
    // A fresh connection (the first may itself have gone idle meanwhile).
    let fresh = Cluster::connect(&[node.addr.to_string()], config()).await.unwrap();
    let stats = fresh.stats(0).await.unwrap();
    assert!(stats.counts.conns_idle_closed >= 1);
    assert!(
        stats.counts.conns_read_timeout >= 1,
        "the trickle counted as a read timeout"
    );
    node.stop().await;
}

/// A client that keeps sending through a shutdown gets an answer for every request: served
/// during the drain, `ShuttingDown` after it; never silence.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_after_the_drain_are_answered_shutting_down() {
    use kvshared::frame::{AlignedVec, FrameKind, read_frame};
    use kvshared::wire::{ErrorCode, encode_frame, parse_error_reply};
    use tokio::io::AsyncWriteExt;

    let node = LocalNode::start(NodeConfig::default()).await.unwrap();
    let stream = tokio::net::TcpStream::connect(node.addr).await.unwrap();
    let mut node = Some(node);
    let (read, mut write) = stream.into_split();
    let mut read = tokio::io::BufReader::new(read);
    let mut batch = BatchRequest::new();
    batch.push_get(b"k");
    let (mut frame, mut body, mut burst) = (AlignedVec::new(), AlignedVec::new(), Vec::new());
    let (mut next_id, mut served, mut refused) = (1u64, 0u64, 0u64);
    let mut stopping = None;
    let deadline = tokio::time::Instant::now() + kvtestkit::HANG;
    // Bursts of 20 requests, each burst sent when the last one is fully answered, until the
    // node says it is shutting down (bounded by the deadline and a burst count).
    for _ in 0..100_000 {
        assert!(tokio::time::Instant::now() < deadline, "never saw ShuttingDown");
        burst.clear();
        for _ in 0..20 {
            encode_frame(FrameKind::BatchRequest, next_id, &batch, &mut frame).unwrap();
            burst.extend_from_slice(&frame);
            next_id += 1;
        }
        write.write_all(&burst).await.unwrap();
        for _ in 0..20 {
            let header = read_frame(&mut read, &mut body, u32::MAX)
                .await
                .expect("a request went unanswered")
                .expect("closed with requests unanswered");
            match header.kind {
                FrameKind::BatchResponse => served += 1,
                FrameKind::ErrorResponse => {
                    assert_eq!(parse_error_reply(&body).unwrap().code, ErrorCode::ShuttingDown);
                    refused += 1;
                }
                other => panic!("unexpected {other:?}"),
            }
        }
        if served >= 200
            && let Some(node) = node.take()
        {
            stopping = Some(tokio::spawn(node.stop()));
        }
        if refused > 0 {
            break;
        }
    }
    assert!(served >= 200 && refused > 0, "served {served}, refused {refused}");
    drop(write);
    let stop = stopping.unwrap();
    tokio::time::timeout(Duration::from_secs(10), stop)
        .await
        .expect("shutdown did not finish")
        .unwrap();
}
