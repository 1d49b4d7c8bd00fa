//! The durable shard's own tests: snapshots, recovery, conditional writes.

use std::path::Path;
use std::sync::Arc;

use super::*;
use crate::durable::catalog;
use crate::durable::log::FsyncPolicy;
use crate::durable::{DurableConfig, SnapshotEvery};
use crate::store::{Scratch, Store, Unbounded};
use kvshared::frame::AlignedVec;
use kvshared::routing::ShardId;
use kvshared::stats::Counts;
use kvshared::wire::{BatchRequest, OpKind, OpReply, ReplyView};
use kvshared::wire::{BatchResponse, BatchView, encode_body};

fn body(req: &BatchRequest) -> Vec<u8> {
    let mut body = AlignedVec::new();
    encode_body(req, &mut body).unwrap();
    body.to_vec()
}

/// `req`'s ops as a batch of a log entry (as `Node` converts a client's batch).
fn entry(req: &BatchRequest) -> Vec<u8> {
    let ops: Vec<_> = (0..req.len()).map(|i| req.op(i).unwrap()).collect();
    crate::durable::entry::encode_batch(ops.into_iter()).unwrap()
}

fn aligned(bytes: &[u8]) -> AlignedVec {
    let mut v = AlignedVec::new();
    v.extend_from_slice(bytes);
    v
}

fn config(segment_bytes: u64) -> DurableConfig {
    DurableConfig {
        log: crate::durable::LogSettings {
            fsync: FsyncPolicy::Always,
            snapshot_every: SnapshotEvery::Bytes(1 << 40),
            segment_bytes,
        },
        group: None,
    }
}

/// A path for a data directory (not made: kvd makes it) in a fresh temporary directory.
fn scratch_dir(name: &str) -> kvtestkit::Scratch {
    kvtestkit::scratch_file("raft", name)
}

async fn open(dir: &Path, segment_bytes: u64) -> Result<(DurableShard, Recovery, Arc<Store>), String> {
    let store = Arc::new(Store::new(ShardId::SOLO, 8, 0).unwrap());
    let (shard, recovery) = DurableShard::open(dir, store.clone(), Arc::default(), config(segment_bytes))
        .await
        .map_err(|e| e.to_string())?;
    Ok((shard, recovery, store))
}

async fn put(shard: &DurableShard, key: &str, value: &str) {
    let mut req = BatchRequest::new();
    req.push_put(key.as_bytes(), value.as_bytes());
    let reply = aligned(&shard.submit(entry(&req)).await.unwrap().unwrap());
    assert_eq!(ReplyView::parse(&reply).unwrap().result(0), OpReply::Stored);
}

fn value(store: &Store, key: &str) -> Option<String> {
    let mut req = BatchRequest::new();
    req.push_get(key.as_bytes());
    let frame = aligned(&body(&req));
    let batch = BatchView::parse(&frame).unwrap();
    let mut out = BatchResponse::default();
    store.execute(
        &batch,
        &mut out,
        &mut Unbounded,
        &mut Scratch::default(),
        &mut Counts::default(),
    );
    let mut reply = AlignedVec::new();
    encode_body(&out, &mut reply).unwrap();
    match ReplyView::parse(&reply).unwrap().result(0) {
        OpReply::Found(v) => Some(String::from_utf8(v.to_vec()).unwrap()),
        _ => None,
    }
}

/// Writes key `k{i % 50}` = `round-i` for `i` in `range`.
async fn write_rounds(shard: &DurableShard, range: std::ops::Range<u32>) {
    for i in range {
        put(shard, &format!("k{}", i % 50), &format!("round-{i}")).await;
    }
}

fn check_all(store: &Store, last_round: u32) {
    for k in 0..50 {
        let i = (0..=last_round).rev().find(|i| i % 50 == k).unwrap();
        assert_eq!(value(store, &format!("k{k}")), Some(format!("round-{i}")), "key k{k}");
    }
}

/// Snapshots cut the log (whole segments before the older kept snapshot go), and a
/// restart loads the newest snapshot and replays only the log after it. A damaged newest
/// snapshot falls back to the older one plus the log after it; with both damaged and the
/// log's start gone, kvd refuses to start and says what to do.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn snapshots_cut_the_log_and_recovery_falls_back_when_one_is_damaged() {
    let dir = scratch_dir("snapshots");
    let (shard, _, _) = open(&dir, 4 << 10).await.unwrap();
    write_rounds(&shard, 0..300).await;
    shard.snapshot_now().await.unwrap();
    write_rounds(&shard, 300..600).await;
    shard.snapshot_now().await.unwrap();
    write_rounds(&shard, 600..650).await;
    let figures = shard.figures();
    assert_eq!(figures.snapshots_taken, 2);
    assert!(figures.snapshot_bytes > 0 && figures.log_entries < 100, "{figures:?}");
    shard.shutdown().await;
    drop(shard);
    let snaps = catalog::list(&dir).unwrap();
    assert_eq!(snaps.len(), 2, "two snapshots kept: {snaps:?}");
    let first_segment = dir.join("log").join("log-00000000000000000000.seg");
    assert!(
        !first_segment.exists(),
        "segments before the older snapshot are deleted"
    );

    let (shard, recovery, store) = open(&dir, 4 << 10).await.unwrap();
    assert_eq!(
        recovery.snapshot.as_ref().map(|(p, _)| p.clone()),
        Some(snaps[0].1.clone())
    );
    assert!(
        recovery.entries_replayed <= 60,
        "replayed {}",
        recovery.entries_replayed
    );
    check_all(&store, 649);
    shard.shutdown().await;
    drop(shard);

    let mut bytes = std::fs::read(&snaps[0].1).unwrap();
    let mid = bytes.len() / 2;
    bytes[mid] ^= 0x40;
    std::fs::write(&snaps[0].1, &bytes).unwrap();
    let (shard, recovery, store) = open(&dir, 4 << 10).await.unwrap();
    assert_eq!(
        recovery.snapshot.as_ref().map(|(p, _)| p.clone()),
        Some(snaps[1].1.clone())
    );
    assert!(
        recovery.entries_replayed >= 300,
        "replayed {}",
        recovery.entries_replayed
    );
    check_all(&store, 649);
    shard.shutdown().await;
    drop(shard);

    let mut bytes = std::fs::read(&snaps[1].1).unwrap();
    bytes[20] ^= 0x01;
    std::fs::write(&snaps[1].1, &bytes).unwrap();
    let e = open(&dir, 4 << 10).await.err().unwrap();
    assert!(e.contains("snap-") && e.contains("restore the data directory"), "{e}");
}

/// A snapshot taken while writes go on is still a correct start: every write after its
/// index is replayed on top (blind puts and deletes are idempotent).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_snapshot_taken_under_writes_recovers_every_write() {
    let dir = scratch_dir("fuzzy");
    let (shard, _, _) = open(&dir, 1 << 20).await.unwrap();
    let shard = Arc::new(shard);
    let writer = {
        let shard = shard.clone();
        tokio::spawn(async move { write_rounds(&shard, 0..2000).await })
    };
    while !writer.is_finished() {
        shard.snapshot_now().await.unwrap();
    }
    writer.await.unwrap();
    shard.shutdown().await;
    drop(shard);
    let (shard, recovery, store) = open(&dir, 1 << 20).await.unwrap();
    assert!(recovery.snapshot.is_some());
    check_all(&store, 1999);
    shard.shutdown().await;
}

/// Conditional puts and deletes (whose outcome depends on the state they meet) while
/// snapshots are taken one after another: after a restart every key holds exactly what
/// it held before. (Here a snapshot's copy rarely overlaps a write; the overlap that makes
/// the per-shard skip matter is forced in `store::dump`'s
/// `replay_after_a_fuzzy_snapshot_skips_what_each_shard_already_holds`.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn conditional_writes_under_snapshots_recover_exactly() {
    let dir = scratch_dir("conditional");
    let (shard, _, live) = open(&dir, 1 << 20).await.unwrap();
    let shard = Arc::new(shard);
    let writer = {
        let shard = shard.clone();
        tokio::spawn(async move {
            for i in 0..1500u32 {
                let key = format!("k{}", i % 20);
                let mut req = BatchRequest::new();
                match i % 3 {
                    0 => req.push(OpKind::PutIfAbsent, key.as_bytes(), format!("nx-{i}").as_bytes()),
                    1 => req.push(OpKind::PutIfPresent, key.as_bytes(), format!("xx-{i}").as_bytes()),
                    _ if i % 7 == 0 => req.push_delete(key.as_bytes()),
                    _ => req.push(OpKind::PutIfPresent, key.as_bytes(), format!("xx-{i}").as_bytes()),
                }
                shard.submit(entry(&req)).await.unwrap().unwrap();
            }
        })
    };
    while !writer.is_finished() {
        shard.snapshot_now().await.unwrap();
    }
    writer.await.unwrap();
    let before: Vec<Option<String>> = (0..20).map(|k| value(&live, &format!("k{k}"))).collect();
    shard.shutdown().await;
    drop(shard);
    let (shard, recovery, store) = open(&dir, 1 << 20).await.unwrap();
    assert!(recovery.snapshot.is_some());
    let after: Vec<Option<String>> = (0..20).map(|k| value(&store, &format!("k{k}"))).collect();
    assert_eq!(after, before);
    shard.shutdown().await;
}

/// Writes go through the log; after a restart on the same directory the store is
/// rebuilt from it and every acknowledged write is there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acknowledged_writes_survive_a_restart() {
    let dir = scratch_dir("restart");
    let (shard, _, store) = open(&dir, 1 << 20).await.unwrap();
    for i in 0..50 {
        let mut req = BatchRequest::new();
        req.push_put(format!("k{i}").as_bytes(), format!("v{i}").as_bytes());
        req.push_get(format!("k{i}").as_bytes());
        let reply = aligned(&shard.submit(entry(&req)).await.unwrap().unwrap());
        let view = ReplyView::parse(&reply).unwrap();
        assert_eq!(view.result(0), OpReply::Stored);
        assert_eq!(view.result(1), OpReply::Found(format!("v{i}").as_bytes()));
    }
    shard.shutdown().await;
    drop(shard);
    assert_eq!(store.len(), 50);

    let (shard, _, again) = open(&dir, 1 << 20).await.unwrap();
    assert_eq!(again.len(), 50, "the log was replayed into the new store");
    let mut req = BatchRequest::new();
    req.push_get(b"k49");
    req.push_put(b"k50", b"after the restart");
    let reply = aligned(&shard.submit(entry(&req)).await.unwrap().unwrap());
    assert_eq!(ReplyView::parse(&reply).unwrap().result(0), OpReply::Found(b"v49"));
    shard.shutdown().await;
}

/// The log keeps only its newest entries in memory (64 KiB in unit tests): a shard that
/// wrote many times that much stays within it, and a restart replays every entry, read back
/// from the segment files in chunks (issue 32: bounded log memory).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_log_keeps_its_newest_entries_in_memory_and_reads_older_ones_back() {
    let dir = scratch_dir("log-cache");
    let (shard, _, _) = open(&dir, 64 << 10).await.unwrap();
    let pad = "x".repeat(1000);
    for i in 0..600 {
        put(&shard, &format!("k{i}"), &format!("{i}{pad}")).await;
    }
    let figures = shard.figures();
    let bound = (super::entry_cache::LOG_CACHE_BYTES + 4096) as u64;
    assert!(
        figures.log_bytes > 600_000 && figures.log_memory_bytes <= bound,
        "{figures:?}"
    );
    shard.shutdown().await;
    let (shard, recovery, store) = open(&dir, 64 << 10).await.unwrap();
    assert!(recovery.entries_replayed >= 600, "{recovery:?}");
    assert!(shard.figures().log_memory_bytes <= bound);
    for i in 0..600 {
        assert_eq!(value(&store, &format!("k{i}")), Some(format!("{i}{pad}")), "k{i}");
    }
    shard.shutdown().await;
}

/// Fail-stop: an entry the state machine cannot read stops openraft's core, and the watcher
/// kvd runs on every shard (which makes the process exit) learns why; the entry is never
/// applied as nothing. (Node only logs entries it encoded itself: this one is forged.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreadable_entry_stops_raft_and_the_watcher_is_told_why() {
    let dir = scratch_dir("fail-stop");
    let (shard, _, store) = open(&dir, 1 << 20).await.unwrap();
    put(&shard, "before", "1").await;
    let (tx, rx) = tokio::sync::oneshot::channel();
    tokio::spawn(super::open::stop_if_raft_fails(shard.raft.clone(), move |why| {
        let _ = tx.send(why);
    }));
    let answer = shard.submit(vec![7, 0, 0, 0, 99]);
    let why = tokio::time::timeout(kvtestkit::HANG, rx).await.unwrap().unwrap();
    assert!(why.contains("log entry") && why.contains("does not read"), "{why}");
    assert!(
        answer.await.map_or(true, |a| a.is_err()),
        "the forged entry was not answered as applied"
    );
    assert_eq!(value(&store, "before").as_deref(), Some("1"));
}
