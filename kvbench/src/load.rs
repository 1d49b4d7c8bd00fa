//! `kvbench load`: write records 0..N-1 in large batches, with progress.

use std::io::IsTerminal;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::Context;
use indicatif::{ProgressBar, ProgressStyle};
use kvshared::client::{Cluster, NodeBatches, Outcome};
use kvshared::units::{grouped, si};
use kvshared::wire::{BatchRequest, OpReply};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

use crate::cli::LoadArgs;
use crate::connect;
use crate::workload::write_key;

/// What a load did.
#[derive(Debug, Clone, Copy)]
pub struct Loaded {
    pub records: u64,
    pub elapsed: Duration,
}

/// What to load.
#[derive(Debug, Clone)]
pub struct LoadPlan {
    pub records: u64,
    pub value_size: usize,
    pub key_prefix: String,
    /// Puts per batch per node.
    pub batch: usize,
    pub tasks: usize,
    pub seed: u64,
    /// `--ttl`: each put's time to live is drawn from it.
    pub ttl: Option<crate::workload::ttl::TtlRange>,
}

impl From<&LoadArgs> for LoadPlan {
    fn from(a: &LoadArgs) -> LoadPlan {
        LoadPlan {
            records: a.data.records,
            value_size: a.data.value_size,
            key_prefix: a.data.key_prefix.clone(),
            batch: a.batch,
            tasks: a.tasks,
            seed: a.seed,
            ttl: a.data.ttl,
        }
    }
}

/// Writes records `0..records` using `tasks` concurrent tasks, counting stored records in `done`.
/// Fails on the first batch that is not fully stored: a partial load would skew every run after it.
pub async fn load(cluster: Arc<Cluster>, plan: &LoadPlan, done: Arc<AtomicU64>) -> anyhow::Result<Loaded> {
    let LoadPlan {
        records,
        value_size,
        batch,
        seed,
        ttl,
        ..
    } = *plan;
    let start = Instant::now();
    let tasks = plan.tasks.clamp(1, records.max(1) as usize);
    let per_task = records.div_ceil(tasks as u64);
    let mut handles = Vec::new();
    for t in 0..tasks as u64 {
        let range = (t * per_task)..((t + 1) * per_task).min(records);
        let (cluster, prefix, done) = (cluster.clone(), plan.key_prefix.clone(), done.clone());
        handles.push(tokio::spawn(async move {
            let shape = (value_size, batch.max(1), ttl);
            load_range(&cluster, range, shape, &prefix, seed ^ t, &done).await
        }));
    }
    for h in handles {
        h.await.context("a loading task stopped")??;
    }
    Ok(Loaded {
        records,
        elapsed: start.elapsed(),
    })
}

async fn load_range(
    cluster: &Cluster,
    range: std::ops::Range<u64>,
    (value_size, batch, ttl): (usize, usize, Option<crate::workload::ttl::TtlRange>),
    prefix: &str,
    seed: u64,
    done: &AtomicU64,
) -> anyhow::Result<()> {
    // Routed by the client's table (read from the groups when it connected, and learning
    // from redirects): slots may have moved since the cluster started.
    let mut batches = NodeBatches::with_table(cluster.node_count(), cluster.slots().clone());
    let mut value = vec![0u8; value_size];
    let mut rng = SmallRng::seed_from_u64(seed);
    rng.fill_bytes(&mut value);
    let mut key = Vec::new();
    let mut arg = Vec::new();
    for index in range {
        key.clear();
        write_key(&mut key, prefix, index);
        let n = value.len().min(8);
        value[..n].copy_from_slice(&index.to_le_bytes()[..n]);
        let node = batches.owner(&key);
        let ttl = ttl.map(|t| (t, &mut rng));
        crate::workload::ttl::push_put(&mut batches, node, &key, &value, ttl, &mut arg);
        if batches.batch(node).len() >= batch {
            send(cluster, node, batches.batch(node), done).await?;
            batches.clear(node);
        }
    }
    for (node, b) in batches.non_empty() {
        send(cluster, node, b, done).await?;
    }
    Ok(())
}

async fn send(cluster: &Cluster, node: usize, batch: &BatchRequest, done: &AtomicU64) -> anyhow::Result<()> {
    let reply = cluster.send_batch(node, batch).await?;
    let view = reply.batch()?;
    let mut redirected = Vec::new();
    for i in 0..view.len() {
        match view.result(i) {
            OpReply::Stored => {}
            OpReply::Moved { slot, owner, epoch } => {
                cluster.learn_moved(slot, owner, epoch);
                redirected.push(i);
            }
            OpReply::TryAgain => redirected.push(i),
            other => anyhow::bail!("{} did not store a record: {other:?}", cluster.addr(node)),
        }
    }
    // Records whose slot moved (or is moving): sent again through the cluster client, which
    // routes them by its table, follows redirects and waits out a hand-over.
    for result in cluster.batch(&crate::engine::ops_at(batch, &redirected)).await {
        match result {
            Ok(Outcome::Stored) => {}
            other => anyhow::bail!("a record whose slot moved was not stored: {other:?}"),
        }
    }
    done.fetch_add(view.len() as u64, Ordering::Relaxed);
    Ok(())
}

/// `kvbench load`.
pub async fn command(args: LoadArgs) -> anyhow::Result<()> {
    let cluster = connect::cluster(&args.cluster).await?;
    let done = Arc::new(AtomicU64::new(0));
    let bar = (!args.quiet && std::io::stderr().is_terminal()).then(|| {
        let bar = ProgressBar::new(args.data.records);
        bar.set_style(
            ProgressStyle::with_template("loading {wide_bar} {pos}/{len} records ({per_sec}, eta {eta})")
                .unwrap_or_else(|_| ProgressStyle::default_bar()),
        );
        bar
    });
    let ticker = bar.clone().map(|bar| {
        let done = done.clone();
        tokio::spawn(async move {
            loop {
                bar.set_position(done.load(Ordering::Relaxed));
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        })
    });
    let result = load(cluster.clone(), &LoadPlan::from(&args), done.clone()).await;
    if let Some(t) = ticker {
        t.abort();
    }
    if let Some(b) = bar {
        b.finish_and_clear();
    }
    let loaded = result.map_err(|e| {
        e.context(format!(
            "the load stopped after {} of {} records were stored; running `kvbench load` again stores them all again from the first (it does not resume; a record stored twice is simply overwritten)",
            grouped(done.load(Ordering::Relaxed)),
            grouped(args.data.records)
        ))
    })?;
    let secs = loaded.elapsed.as_secs_f64();
    let mut keys = 0;
    for n in 0..cluster.node_count() {
        keys += cluster.stats(n).await.map(|s| s.keys).unwrap_or(0);
    }
    kvshared::outln!(
        "loaded {} records of {} B in {:.2} s: {} records/s ({} keys now in the cluster)",
        grouped(loaded.records),
        args.data.value_size,
        secs,
        si(loaded.records as f64 / secs.max(1e-9)),
        grouped(keys)
    )?;
    Ok(())
}
