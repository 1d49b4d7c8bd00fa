//! The collector keeps polling a node that is down and picks it up again when it comes back.

use std::sync::mpsc::channel;
use std::time::{Duration, Instant};

use kvd::node::NodeConfig;
use kvd::server::Server;
use tokio::sync::watch;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_that_comes_back_is_picked_up_again() {
    // An address with nothing behind it yet (held for the test: it refuses until kvd runs).
    let addr = kvtestkit::addr();
    let (tx, rx) = channel();
    let (_interval_tx, interval) = watch::channel(Duration::from_millis(100));
    kvtui::collector::Collector::spawn(
        &tokio::runtime::Handle::current(),
        std::slice::from_ref(&addr),
        &kvshared::client::ClientConfig::default(),
        interval,
        tx,
    )
    .unwrap();

    let first = tokio::task::spawn_blocking(move || {
        let s = rx.recv_timeout(kvtestkit::HANG).unwrap();
        (s, rx)
    })
    .await
    .unwrap();
    let (sample, rx) = first;
    assert!(sample.result.is_err(), "nothing listens yet");

    // Now the node starts on that address.
    let node = tokio::task::spawn_blocking(move || kvtestkit::kvd::start(&["--listen", &addr]))
        .await
        .unwrap();
    let came_back = tokio::task::spawn_blocking(move || {
        let deadline = Instant::now() + kvtestkit::HANG;
        while Instant::now() < deadline {
            if let Ok(s) = rx.recv_timeout(Duration::from_millis(500))
                && s.result.is_ok()
            {
                return true;
            }
        }
        false
    })
    .await
    .unwrap();
    assert!(came_back, "the collector never picked the node up");
    drop(node);
}

/// After `-` from a 10 s interval the next poll comes at once, not when the old 10 s sleep
/// would have ended.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shorter_interval_takes_effect_at_once() {
    let server = Server::bind("127.0.0.1:0", NodeConfig::default()).await.unwrap();
    let addr = server.local_addr().unwrap().to_string();
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let running = tokio::spawn(server.run(async {
        let _ = stop_rx.await;
    }));
    let (tx, rx) = channel();
    let (interval_tx, interval) = watch::channel(Duration::from_secs(10));
    kvtui::collector::Collector::spawn(
        &tokio::runtime::Handle::current(),
        std::slice::from_ref(&addr),
        &kvshared::client::ClientConfig::default(),
        interval,
        tx,
    )
    .unwrap();
    let rx = tokio::task::spawn_blocking(move || {
        let first = rx.recv_timeout(Duration::from_secs(5)).unwrap();
        assert!(first.result.is_ok());
        rx
    })
    .await
    .unwrap();
    interval_tx.send(Duration::from_millis(100)).unwrap();
    let next = tokio::task::spawn_blocking(move || rx.recv_timeout(Duration::from_secs(5)).is_ok())
        .await
        .unwrap();
    assert!(next, "no poll within 5 s of the interval going from 10 s to 100 ms");
    let _ = stop_tx.send(());
    let _ = running.await;
}
