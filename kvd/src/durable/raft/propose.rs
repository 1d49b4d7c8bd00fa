//! Group commit above the log: every batch queued while earlier entries were committing goes
//! into the next entry, and each batch gets its own answer.

use std::sync::Arc;

use super::types::{LogAnswer, ShardRaft, SubmitError, leader_hint};
use crate::durable::entry::LogPayload;

/// Most batches in one entry.
pub(super) const MAX_BATCHES_PER_ENTRY: usize = 1024;
/// Most bytes of batches in one entry (a batch larger than this is an entry alone): an
/// entry travels to the other members whole, in a frame within their `--max-frame`, and
/// six queued batches of 20 MiB made one entry of 120 MiB that no member could take.
pub(super) const MAX_ENTRY_BYTES: usize = 8 << 20;
/// Entries proposed and not yet applied at once. One: the next entry takes every batch that
/// arrived while this one was committed, so each fsync carries as many batches as possible.
/// Measured A B A B (YCSB-B batch 64, --fsync always): 1 in flight 2.59M and 2.96M op/s, 4 in
/// flight 1.98M and 2.04M (more, smaller entries: more fsyncs and more per-entry work); 2, 8
/// and 16 were no better. Replica groups, with a network round trip per commit, may want more.
pub(super) const PROPOSALS_IN_FLIGHT: usize = 1;

/// Longest a proposed entry may take to commit before its batches are answered "outcome
/// unknown" (their connections close).
pub(super) const PROPOSE_LIMIT: std::time::Duration = std::time::Duration::from_secs(3);

/// A batch waiting for the proposer (in the log's own format: `durable::entry`), and where its
/// answer goes.
pub(super) type Proposal = (Vec<u8>, tokio::sync::oneshot::Sender<LogAnswer>);

/// Group commit above the log: takes every batch queued while earlier entries were being
/// committed, proposes them as one entry (up to [`PROPOSALS_IN_FLIGHT`] entries at once), and
/// hands each batch its own answer.
/// While `quiet` (a leader handing over), batches are answered "not the leader" unproposed.
pub(super) async fn propose(
    raft: openraft::Raft<ShardRaft>,
    mut queue: tokio::sync::mpsc::UnboundedReceiver<Proposal>,
    quiet: Arc<std::sync::atomic::AtomicBool>,
    tasks: Arc<super::tasks::Tasks>,
    health: Arc<crate::durable::health::DiskHealth>,
) {
    let slots = Arc::new(tokio::sync::Semaphore::new(PROPOSALS_IN_FLIGHT));
    let mut held: Option<Proposal> = None;
    loop {
        let first = match held.take() {
            Some(p) => p,
            None => match queue.recv().await {
                Some(p) => p,
                None => return,
            },
        };
        let Ok(slot) = slots.clone().acquire_owned().await else {
            return;
        };
        let mut bytes = first.0.len();
        let mut waiting = vec![first];
        while waiting.len() < MAX_BATCHES_PER_ENTRY {
            match queue.try_recv() {
                Ok(p) if bytes + p.0.len() > MAX_ENTRY_BYTES => {
                    held = Some(p);
                    break;
                }
                Ok(p) => {
                    bytes += p.0.len();
                    waiting.push(p);
                }
                Err(_) => break,
            }
        }
        if quiet.load(std::sync::atomic::Ordering::Relaxed) {
            // Nothing of these ran; the client asks again, of the next leader.
            for (_, answer) in waiting {
                let _ = answer.send(Err(SubmitError::NotLeader(None)));
            }
            continue;
        }
        let (bodies, answers): (Vec<_>, Vec<_>) = waiting.into_iter().unzip();
        let (raft, health) = (raft.clone(), health.clone());
        tasks.spawn(async move {
            // Bounded: openraft 0.9 may never answer an entry a change of leader has taken
            // away, and this slot would then hold every later write of the shard.
            let payload = LogPayload::from_batches(&bodies);
            drop(bodies);
            let result = tokio::time::timeout(PROPOSE_LIMIT, raft.client_write(payload)).await;
            drop(slot);
            let result = match result {
                Ok(r) => r,
                Err(_) => {
                    // A disk that stopped taking writes meanwhile is the likelier reason: say so.
                    let why = SubmitError::Failed(match health.stall_reason() {
                        Some(disk) => format!(
                            "the node's disk refuses writes ({disk}): the write is queued in the log and the outcome is unknown until the disk takes writes again"
                        ),
                        None => format!("no commit within {PROPOSE_LIMIT:?} (a change of leader?): the outcome is unknown"),
                    });
                    for answer in answers {
                        let _ = answer.send(Err(why.clone()));
                    }
                    return;
                }
            };
            match result {
                Ok(written) => {
                    for (answer, reply) in answers.into_iter().zip(written.data.0) {
                        let _ = answer.send(Ok(reply));
                    }
                }
                Err(e) => {
                    let why = match e.forward_to_leader() {
                        Some(f) => leader_hint(f),
                        None => SubmitError::Failed(e.to_string()),
                    };
                    for answer in answers {
                        let _ = answer.send(Err(why.clone()));
                    }
                }
            }
        });
    }
}
