//! Polls every node's stats off the UI thread and sends the samples over a channel, so a
//! slow or dead node never stalls drawing.
//!
//! Each node has its own task. A node that fails is retried with exponential backoff (up to
//! 5 s) and picked up again as soon as it answers.

use std::sync::Arc;
use std::sync::mpsc::Sender;
use std::time::{Duration, Instant};

use kvshared::client::{ClientConfig, Cluster};
use tokio::sync::watch;

use crate::state::Sample;

const MAX_BACKOFF: Duration = Duration::from_secs(5);

/// Starts polling `nodes` on `runtime` every `interval` (which may change while running),
/// with `config`'s timeouts. Stops by itself once the receiving end of `samples` is dropped.
pub fn spawn(
    runtime: &tokio::runtime::Handle,
    nodes: &[String],
    config: &ClientConfig,
    interval: watch::Receiver<Duration>,
    samples: Sender<Sample>,
) -> anyhow::Result<()> {
    let cluster = Arc::new(Cluster::new(
        nodes,
        ClientConfig {
            conns_per_node: 1,
            pipeline: 4,
            ..config.clone()
        },
    )?);
    for node in 0..nodes.len() {
        let (cluster, mut interval, samples) = (cluster.clone(), interval.clone(), samples.clone());
        runtime.spawn(async move {
            let mut backoff = *interval.borrow();
            loop {
                let result = cluster.stats(node).await.map_err(|e| e.to_string());
                let ok = result.is_ok();
                let sample = Sample {
                    node,
                    at: Instant::now(),
                    result,
                };
                if samples.send(sample).is_err() {
                    return;
                }
                let every = *interval.borrow();
                backoff = if ok {
                    every
                } else {
                    (backoff * 2).clamp(every, MAX_BACKOFF)
                };
                // A new interval (`+`/`-`) takes effect now, not after the old one's sleep.
                tokio::select! {
                    _ = tokio::time::sleep(backoff) => {}
                    changed = interval.changed() => {
                        if changed.is_err() {
                            return;
                        }
                        backoff = *interval.borrow();
                    }
                }
            }
        });
    }
    Ok(())
}
