//! Polls every node's stats off the UI thread and sends the samples over a channel, so a
//! slow or dead node never stalls drawing.
//!
//! Each node has its own task. A node that fails is retried with exponential backoff (up to
//! 5 s) and picked up again as soon as it answers. Nodes can be added while running (the
//! members a replica group reports that `--nodes` did not list).

use std::sync::mpsc::Sender;
use std::time::{Duration, Instant};

use kvshared::client::{ClientConfig, Cluster};
use tokio::sync::watch;

use crate::state::Sample;

const MAX_BACKOFF: Duration = Duration::from_secs(5);

/// Most nodes polled at once (the members learned from groups included): a bound on tasks
/// and connections whatever the groups report.
pub const MAX_NODES: usize = 1024;

/// The polling tasks' shared settings; [`Collector::poll`] starts one more.
pub struct Collector {
    runtime: tokio::runtime::Handle,
    config: ClientConfig,
    interval: watch::Receiver<Duration>,
    samples: Sender<Sample>,
    polled: usize,
}

impl Collector {
    /// Starts polling `nodes` (row `i` is `nodes[i]`) on `runtime` every `interval` (which
    /// may change while running), with `config`'s timeouts. The tasks stop by themselves
    /// once the receiving end of `samples` is dropped.
    pub fn spawn(
        runtime: &tokio::runtime::Handle,
        nodes: &[String],
        config: &ClientConfig,
        interval: watch::Receiver<Duration>,
        samples: Sender<Sample>,
    ) -> anyhow::Result<Collector> {
        let mut collector = Collector {
            runtime: runtime.clone(),
            config: ClientConfig {
                conns_per_node: 1,
                pipeline: 4,
                ..config.clone()
            },
            interval,
            samples,
            polled: 0,
        };
        for (i, addr) in nodes.iter().enumerate() {
            collector.poll(i, addr)?;
        }
        Ok(collector)
    }

    /// Polls `addr`, whose samples go to row `node`; refused past [`MAX_NODES`].
    pub fn poll(&mut self, node: usize, addr: &str) -> anyhow::Result<()> {
        anyhow::ensure!(self.polled < MAX_NODES, "kvtui polls at most {MAX_NODES} nodes");
        self.polled += 1;
        let cluster = Cluster::new(&[addr.to_string()], self.config.clone())?;
        let (mut interval, samples) = (self.interval.clone(), self.samples.clone());
        self.runtime.spawn(async move {
            let mut backoff = *interval.borrow();
            loop {
                let result = cluster.stats(0).await.map_err(|e| e.to_string());
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
        Ok(())
    }
}
