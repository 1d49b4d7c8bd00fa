//! Reads in a replica group: the leader's read-index rounds (one for every read queued when
//! it starts), and follower reads (a member asks its leader for a read index and serves once
//! it has applied that far).

use std::sync::Arc;

use super::types::{ShardRaft, SubmitError, leader_hint};
use crate::durable::network::{AdminReply, AdminRequest, Target};

/// Follower reads: how long a member waits for its leader's read index, how far behind it
/// may be and still wait to apply it (log entries), and how long it waits to apply it. All
/// well under the clients' stall detection (1 s of silence on a connection), so that a
/// slow member is refused and passed by, not taken for a dead one.
pub(super) const MEMBER_READ_ASK_LIMIT: std::time::Duration = std::time::Duration::from_millis(500);
pub(super) const MEMBER_READ_MAX_BEHIND: u64 = 64;
pub(super) const MEMBER_READ_APPLY_LIMIT: std::time::Duration = std::time::Duration::from_millis(300);

/// Longest a read-index round may take.
pub(super) const CONFIRM_LIMIT: std::time::Duration = std::time::Duration::from_secs(1);

/// Queues a read for a read-index round on `queue`.
pub(super) fn queue_for_read_index(
    queue: &tokio::sync::mpsc::UnboundedSender<ReadIndexWaiter>,
) -> tokio::sync::oneshot::Receiver<Result<u64, SubmitError>> {
    let (tx, rx) = tokio::sync::oneshot::channel();
    if let Err(tokio::sync::mpsc::error::SendError(tx)) = queue.send(tx) {
        let _ = tx.send(Err(SubmitError::NotLeader(None)));
    }
    rx
}

/// Where a read-index round's outcome goes: the read index, or why there is none.
pub type ReadIndexWaiter = tokio::sync::oneshot::Sender<Result<u64, SubmitError>>;

/// Confirms leadership for the reads that asked: one read-index round (a heartbeat to a
/// majority) for every request queued when it starts; requests that arrive during a round
/// wait for the next, which begins after their reads ran. Each is answered the read index
/// (what a follower must have applied before it may serve a read begun before the round).
pub(super) async fn confirm(
    raft: openraft::Raft<ShardRaft>,
    mut queue: tokio::sync::mpsc::UnboundedReceiver<ReadIndexWaiter>,
    events: Arc<super::open::RaftEvents>,
) {
    while let Some(first) = queue.recv().await {
        let mut waiting = vec![first];
        while let Ok(more) = queue.try_recv() {
            waiting.push(more);
        }
        events
            .read_index_rounds
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        // Bounded: a round can wait for an entry to be applied that a change of leader has
        // taken away, and every later read of this member would queue behind it. Reads
        // change nothing, so a round that runs out answers "not the leader": asked again.
        let outcome = match tokio::time::timeout(CONFIRM_LIMIT, raft.ensure_linearizable()).await {
            Ok(Ok(read)) => Ok(read.map_or(0, |l| l.index)),
            Ok(Err(e)) => Err(match e.forward_to_leader() {
                Some(f) => leader_hint(f),
                None => SubmitError::NotLeader(None),
            }),
            Err(_) => Err(SubmitError::NotLeader(None)),
        };
        for w in waiting {
            let _ = w.send(outcome.clone());
        }
    }
}

/// Bounded-staleness reads: while clients ask this member for them, it asks its leader for a
/// read index every `lease::PROBE_EVERY` and notes when it sent each request (see `lease`).
pub(super) async fn keep_lease(
    me: u64,
    raft: openraft::Raft<ShardRaft>,
    client: kvshared::client::ClientConfig,
    group: Arc<std::sync::atomic::AtomicU64>,
    lease: Arc<super::lease::Lease>,
) {
    let mut leader: Option<(String, Arc<kvshared::client::Cluster>)> = None;
    loop {
        tokio::time::sleep(super::lease::PROBE_EVERY).await;
        if !lease.wanted() {
            continue;
        }
        let Some((leader_id, addr)) = leader_of(&raft) else {
            continue;
        };
        if leader_id == me {
            lease.reset();
            continue;
        }
        let cluster = match &leader {
            Some((a, c)) if *a == addr => c.clone(),
            _ => match kvshared::client::Cluster::new(std::slice::from_ref(&addr), client.clone()) {
                Ok(c) => Arc::new(c),
                Err(_) => continue,
            },
        };
        leader = Some((addr, cluster.clone()));
        let to = Target {
            group: group.load(std::sync::atomic::Ordering::Relaxed),
            member: leader_id,
        };
        let sent = std::time::Instant::now();
        let asked = tokio::time::timeout(
            MEMBER_READ_ASK_LIMIT,
            kvshared::admin::call(&cluster, to, AdminRequest::ReadIndex { member: me }),
        )
        .await;
        if let Ok(Ok(AdminReply::ReadIndex(index))) = asked {
            lease.confirmed(sent, index);
        }
    }
}

/// The leader this member knows of: its id and address.
fn leader_of(raft: &openraft::Raft<ShardRaft>) -> Option<(u64, String)> {
    let m = raft.metrics();
    let m = m.borrow();
    m.current_leader.and_then(|id| {
        m.membership_config
            .membership()
            .get_node(&id)
            .map(|n| (id, n.addr.clone()))
    })
}

/// Follower reads: a follower or learner asks its leader for a read index, one request for
/// every read queued when it starts (requests arriving meanwhile wait for the next), and
/// answers each read once this member has applied that far. The reads then run here and
/// see every write acknowledged before they arrived: the leader's read index is at least
/// the commit index when its round began, which was after the reads arrived here (Raft's
/// read index, served by a follower, section 6.4 of Ongaro's thesis). A round that fails
/// (no leader known, the leader unreachable, deposed or slow to answer, this member more
/// than `MEMBER_READ_MAX_BEHIND` entries behind or slow to apply) answers "not the leader",
/// naming the leader: the client asks another member, or the leader.
pub(super) async fn follow_reads(
    me: u64,
    raft: openraft::Raft<ShardRaft>,
    mut queue: tokio::sync::mpsc::UnboundedReceiver<ReadIndexWaiter>,
    client: kvshared::client::ClientConfig,
    group: Arc<std::sync::atomic::AtomicU64>,
    tasks: Arc<super::tasks::Tasks>,
) {
    let mut leader: Option<(String, Arc<kvshared::client::Cluster>)> = None;
    while let Some(first) = queue.recv().await {
        let mut waiting = vec![first];
        while let Ok(more) = queue.try_recv() {
            waiting.push(more);
        }
        let Some((leader_id, addr)) = leader_of(&raft) else {
            for w in waiting {
                let _ = w.send(Err(SubmitError::NotLeader(None)));
            }
            continue;
        };
        let cluster = match &leader {
            Some((a, c)) if *a == addr => Some(c.clone()),
            _ => kvshared::client::Cluster::new(std::slice::from_ref(&addr), client.clone())
                .ok()
                .map(Arc::new),
        };
        let Some(cluster) = cluster else {
            for w in waiting {
                let _ = w.send(Err(SubmitError::NotLeader(Some(addr.clone()))));
            }
            continue;
        };
        leader = Some((addr.clone(), cluster.clone()));
        let asked = tokio::time::timeout(
            MEMBER_READ_ASK_LIMIT,
            kvshared::admin::call(
                &cluster,
                Target {
                    group: group.load(std::sync::atomic::Ordering::Relaxed),
                    member: leader_id,
                },
                AdminRequest::ReadIndex { member: me },
            ),
        )
        .await;
        let index = match asked {
            Ok(Ok(AdminReply::ReadIndex(index))) => index,
            Ok(Ok(AdminReply::NotLeader(named))) => {
                let named = named.or(Some(addr));
                for w in waiting {
                    let _ = w.send(Err(SubmitError::NotLeader(named.clone())));
                }
                continue;
            }
            _ => {
                for w in waiting {
                    let _ = w.send(Err(SubmitError::NotLeader(Some(addr.clone()))));
                }
                continue;
            }
        };
        // A member far behind (a learner catching up) would keep the reads waiting: the
        // client is better served by another member at once.
        let applied = raft.metrics().borrow().last_applied.map_or(0, |l| l.index);
        if applied.saturating_add(MEMBER_READ_MAX_BEHIND) < index {
            for w in waiting {
                let _ = w.send(Err(SubmitError::NotLeader(Some(addr.clone()))));
            }
            continue;
        }
        // Waiting to apply is this member's own business: the next round may begin.
        let raft = raft.clone();
        tasks.spawn(async move {
            let applied = raft
                .wait(Some(MEMBER_READ_APPLY_LIMIT))
                .applied_index_at_least(Some(index), "apply the read index")
                .await;
            let outcome = match applied {
                Ok(_) => Ok(index),
                Err(_) => Err(SubmitError::NotLeader(Some(addr))),
            };
            for w in waiting {
                let _ = w.send(outcome.clone());
            }
        });
    }
}
