//! Running a checkable workload: concurrent clients doing random single-key ops on a few
//! keys, with unique values, each op recorded with its call and return times.
//!
//! Used by `kvbench check` and the end-to-end linearizability tests; the checker itself
//! (`crate::history`) has no network code.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use rand::rngs::SmallRng;
use rand::{RngExt, SeedableRng};

use super::{ClientError, Cluster};
use crate::history::{Call, Clock, History, Operation, Return};

/// What to run.
#[derive(Clone, Debug)]
pub struct RecordConfig {
    /// Concurrent clients, each doing one op at a time.
    pub clients: usize,
    /// Distinct keys the clients share.
    pub keys: usize,
    /// Keys are `{key_prefix}{i}`; a unique prefix keeps a check apart from other data.
    pub key_prefix: String,
    /// How long to record at most (a run with [`RecordConfig::progress`] usually ends
    /// earlier, when told to).
    pub duration: Duration,
    /// Each client stops after this many ops even if time remains.
    pub max_ops_per_client: u64,
    /// Seed of the clients' op choices.
    pub seed: u64,
    /// Percent of gets; the rest are puts and deletes.
    pub get_percent: u32,
    /// Percent of puts; the rest are deletes.
    pub put_percent: u32,
    /// Puts carry a time to live drawn from this range (milliseconds, both ends included):
    /// the checker then holds reads to it too (no read returns a value after its time).
    pub ttl_ms: Option<(u64, u64)>,
    /// Shared with the caller: how many ops are recorded so far, and a way to end the
    /// recording at an event rather than after [`RecordConfig::duration`].
    pub progress: Option<Arc<RecordProgress>>,
}

/// A recording's progress, shared with whoever started it: a test waits for ops recorded
/// around an event (a kill, a move), then stops the recording, instead of guessing a time.
#[derive(Debug, Default)]
pub struct RecordProgress {
    recorded: AtomicU64,
    stop: AtomicBool,
}

impl RecordProgress {
    /// A new progress to hand to [`RecordConfig::progress`].
    pub fn new() -> Arc<RecordProgress> {
        Arc::default()
    }

    /// Ops recorded so far (every op that may have taken effect).
    pub fn recorded(&self) -> u64 {
        self.recorded.load(Ordering::Relaxed)
    }

    /// Ends the recording: each client finishes the op it is in and stops.
    pub fn stop(&self) {
        self.stop.store(true, Ordering::Relaxed);
    }

    fn stopped(&self) -> bool {
        self.stop.load(Ordering::Relaxed)
    }
}

impl Default for RecordConfig {
    fn default() -> Self {
        RecordConfig {
            clients: 16,
            keys: 100,
            key_prefix: "lin-".into(),
            duration: Duration::from_secs(10),
            max_ops_per_client: 1_000_000,
            seed: 1,
            get_percent: 50,
            put_percent: 40,
            ttl_ms: None,
            progress: None,
        }
    }
}

/// How long a client waits after an op was refused before its next one.
const REFUSED_PAUSE: Duration = Duration::from_millis(2);

/// The recorded history plus counts of ops that failed outright (and so never took effect).
#[derive(Debug, Default)]
pub struct Recording {
    /// Every op that may have taken effect, with its call and return times.
    pub history: History,
    /// Ops that failed before they could take effect (node down or known down, wrong
    /// shard, malformed), by kind (`ClientError::kind`): how many, and the first error seen.
    /// They are not in the history.
    pub refused: BTreeMap<&'static str, (u64, String)>,
    /// Ops whose outcome is unknown (they may have taken effect: a timeout, a connection lost
    /// after sending). They are in the history as such.
    pub unknown: u64,
}

impl Recording {
    /// Ops refused, of every kind.
    pub fn refused_total(&self) -> u64 {
        self.refused.values().map(|(n, _)| n).sum()
    }
}

/// Runs the workload against `cluster` and returns what every client observed.
pub async fn record(cluster: Arc<Cluster>, config: &RecordConfig) -> Recording {
    let clock = Clock::new();
    let deadline = tokio::time::Instant::now() + config.duration;
    let mut tasks = Vec::new();
    for client in 0..config.clients.max(1) {
        let (cluster, config) = (cluster.clone(), config.clone());
        tasks.push(tokio::spawn(async move {
            run_client(client as u32, &cluster, &config, clock, deadline).await
        }));
    }
    let mut logs = Vec::new();
    let mut refused: BTreeMap<&'static str, (u64, String)> = BTreeMap::new();
    for t in tasks {
        if let Ok((log, r)) = t.await {
            logs.push(log);
            for (kind, (n, first)) in r {
                refused.entry(kind).or_insert((0, first)).0 += n;
            }
        }
    }
    let history = History::from_clients(logs);
    let unknown = history
        .operations
        .iter()
        .filter(|o| matches!(o.ret, Return::Unknown))
        .count() as u64;
    Recording {
        history,
        refused,
        unknown,
    }
}

async fn run_client(
    client: u32,
    cluster: &Cluster,
    config: &RecordConfig,
    clock: Clock,
    deadline: tokio::time::Instant,
) -> (Vec<Operation>, BTreeMap<&'static str, (u64, String)>) {
    let mut rng = SmallRng::seed_from_u64(config.seed.wrapping_mul(1_000_003).wrapping_add(u64::from(client)));
    let mut log = Vec::new();
    let mut refused: BTreeMap<&'static str, (u64, String)> = BTreeMap::new();
    for n in 0..config.max_ops_per_client {
        if tokio::time::Instant::now() >= deadline || config.progress.as_ref().is_some_and(|p| p.stopped()) {
            break;
        }
        let key = format!("{}{}", config.key_prefix, rng.random_range(0..config.keys.max(1)));
        let roll = rng.random_range(0..100u32);
        let call = if roll < config.get_percent {
            Call::Get
        } else if roll < config.get_percent + config.put_percent {
            let value = format!("c{client}-{n}");
            match config.ttl_ms {
                Some((lo, hi)) => Call::PutTtl {
                    value,
                    ttl_ms: rng.random_range(lo..=hi.max(lo)),
                },
                None => Call::Put { value },
            }
        } else {
            Call::Delete
        };
        let call_ns = clock.now_ns();
        let ret: Result<Return, ClientError> = match &call {
            Call::Get => cluster.get(key.as_bytes()).await.map(|v| Return::Value {
                value: v.map(|b| String::from_utf8_lossy(&b).into_owned()),
            }),
            Call::Put { value } => cluster
                .put(key.as_bytes(), value.as_bytes())
                .await
                .map(|_| Return::Stored),
            Call::PutTtl { value, ttl_ms } => cluster
                .put_for(key.as_bytes(), value.as_bytes(), Duration::from_millis(*ttl_ms))
                .await
                .map(|_| Return::Stored),
            Call::Delete => cluster
                .delete(key.as_bytes())
                .await
                .map(|existed| Return::Deleted { existed }),
            // Only the checker makes these.
            Call::Expiry { .. } => continue,
        };
        let return_ns = clock.now_ns();
        let ret = match ret {
            Ok(r) => r,
            Err(e) if e.outcome_unknown() => Return::Unknown,
            Err(e) => {
                // Refused (node down, wrong shard, malformed): it did not take effect;
                // nothing to record. A short pause, so a client facing a node that is down
                // (and refused at once) does not spin through its op budget.
                let took = Duration::from_nanos(return_ns.saturating_sub(call_ns));
                refused
                    .entry(e.kind())
                    .or_insert_with(|| (0, format!("{e} (after {took:?})")))
                    .0 += 1;
                tokio::time::sleep(REFUSED_PAUSE).await;
                continue;
            }
        };
        if let Some(p) = &config.progress {
            p.recorded.fetch_add(1, Ordering::Relaxed);
        }
        log.push(Operation {
            client,
            key,
            call,
            ret,
            call_ns,
            return_ns,
        });
    }
    (log, refused)
}
