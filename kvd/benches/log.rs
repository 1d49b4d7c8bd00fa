//! Group commit on this machine's disk: appends per second and appends per fsync with
//! 1, 8 and 64 writers each waiting for its own append (as connections wait for their
//! batches), under `--fsync always`. A benchmark, not a test: run with
//! `cargo bench -p kvd --bench log`.

use std::sync::mpsc;
use std::time::{Duration, Instant};

use kvd::durable::log::{FsyncPolicy, GroupCommit, LogFiles};

fn main() {
    let dir = std::env::temp_dir().join(format!("kvd-log-bench-{}", std::process::id()));
    for writers in [1usize, 8, 64] {
        let _ = std::fs::remove_dir_all(&dir);
        let files = LogFiles::open(&dir, 1, &mut |_, _| Ok(()), &mut |_, r| Ok(r)).expect("open the log");
        let log = std::sync::Arc::new(GroupCommit::start(files, FsyncPolicy::Always, Default::default()).unwrap());
        let next = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(1));
        let order = std::sync::Arc::new(parking_lot::Mutex::new(()));
        let run_for = Duration::from_secs(3);
        let start = Instant::now();
        let threads: Vec<_> = (0..writers)
            .map(|_| {
                let (log, next, order) = (log.clone(), next.clone(), order.clone());
                std::thread::spawn(move || {
                    let payload = vec![0x5au8; 64 * 140]; // a batch of 64 puts of 128 B
                    let mut done = 0u64;
                    while start.elapsed() < run_for {
                        let (tx, rx) = mpsc::channel();
                        {
                            // Indexes must reach the writer in order.
                            let _g = order.lock();
                            let i = next.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                            log.append(i, vec![payload.clone()], move |r| {
                                let _ = tx.send(r);
                            });
                        }
                        rx.recv().expect("writer alive").expect("append");
                        done += 1;
                    }
                    done
                })
            })
            .collect();
        let appends: u64 = threads.into_iter().map(|t| t.join().expect("writer")).sum();
        let secs = start.elapsed().as_secs_f64();
        let f = log.figures();
        println!(
            "log: {writers:>2} writers: {:>8.0} appends/s, {:>6.0} fsyncs/s, {:>5.1} appends per fsync",
            appends as f64 / secs,
            f.fsyncs as f64 / secs,
            f.appends as f64 / f.fsyncs.max(1) as f64
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}
