//! Big raft appends on a lane of their own, so that a member being sent megabytes of values
//! still hears from its leader every heartbeat.
//!
//! openraft 0.9 gives every append one heartbeat interval (75 ms) and sends it again after
//! a timeout. An append of tens of MiB can take longer than that on a loaded machine: sent
//! again and again on the one connection, it queued the heartbeats behind copies of itself,
//! the member started elections, and the group could lose its leader for good (issue 58).
//!
//! Here an append above [`BULK_BYTES`] is sent once, by a task of its own on a second
//! connection, with a deadline that grows with its size; openraft's repeats of it (the same
//! leader's vote and the same range, or a range it starts) wait for that one send instead
//! of sending again. While it is under way each repeat is answered by a heartbeat on the
//! ordinary connection (an append of no entries after the same entry, what openraft itself
//! sends between appends), so the member's election timer is reset and the leader's lease
//! kept; the leader is told "matched up to where it was", which is true, and asks again.

use std::time::Duration;

use openraft::error::RaftError;
use openraft::raft::{AppendEntriesRequest, AppendEntriesResponse};
use openraft::{LogId, Vote};
use tokio::sync::watch;

use super::raft::types::ShardRaft;

/// An append of at least this many bytes of entries goes on the bulk lane.
pub const BULK_BYTES: usize = 1 << 20;

/// Why a bulk send got no answer: the transport's reason, and whether the member could not
/// be reached at all (openraft then backs off before it tries again, as for any RPC).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NoReply {
    /// The member could not be reached (no connection).
    pub unreachable: bool,
    /// Why, in words.
    pub why: String,
}

impl NoReply {
    /// A failure after the member was reached (or before: `unreachable` false).
    pub fn failed(why: impl Into<String>) -> NoReply {
        NoReply {
            unreachable: false,
            why: why.into(),
        }
    }
}

/// How a member answered an append, or why it did not.
pub type Outcome = Result<Result<AppendEntriesResponse<u64>, RaftError<u64>>, NoReply>;

/// The bytes of entries an append carries (payloads; raft's own entries count a little).
pub fn entry_bytes(rpc: &AppendEntriesRequest<ShardRaft>) -> usize {
    rpc.entries
        .iter()
        .map(|e| match &e.payload {
            openraft::EntryPayload::Normal(p) => p.bytes().len(),
            _ => 1024,
        })
        .sum()
}

/// How long one bulk send may take: 5 s, and a second per 16 MiB.
pub fn deadline(bytes: usize) -> Duration {
    Duration::from_secs(5) + Duration::from_secs((bytes >> 24) as u64)
}

/// Which append a send is: the leader's vote and the range of log ids it covers.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Key {
    vote: Vote<u64>,
    prev: Option<LogId<u64>>,
    last: Option<LogId<u64>>,
}

impl Key {
    pub fn of(rpc: &AppendEntriesRequest<ShardRaft>) -> Key {
        Key {
            vote: rpc.vote,
            prev: rpc.prev_log_id,
            last: rpc.entries.last().map(|e| e.log_id).or(rpc.prev_log_id),
        }
    }

    /// Whether an answer to `self` answers `asked` too: the same leader and start, and `self`
    /// ends no later (a member that took `self` matches up to its end).
    fn starts(&self, asked: &Key) -> bool {
        self.vote == asked.vote && self.prev == asked.prev && self.last <= asked.last
    }
}

/// The one bulk send to a member under way or done, and its answer once there is one.
struct Sending {
    key: Key,
    done: watch::Receiver<Option<Outcome>>,
}

/// A member's bulk lane: at most one big append in flight.
#[derive(Default)]
pub struct Lane {
    sending: parking_lot::Mutex<Option<Sending>>,
}

/// What to answer openraft for a big append (made once per heartbeat: its size does not matter).
#[allow(clippy::large_enum_variant)]
pub enum Step {
    /// The member's answer to it (or to the part of it sent: see [`Key`]).
    Answered(Outcome),
    /// Still being sent: answer with a heartbeat.
    Sending,
}

impl Lane {
    /// Sends `rpc` (big) unless a send that answers it is under way, with `send` on a task
    /// of its own; waits up to `wait` for the answer.
    pub async fn append<F>(&self, rpc: AppendEntriesRequest<ShardRaft>, wait: Duration, send: F) -> Step
    where
        F: FnOnce(AppendEntriesRequest<ShardRaft>) -> tokio::task::JoinHandle<Outcome>,
    {
        let asked = Key::of(&rpc);
        let mut done = {
            let mut slot = self.sending.lock();
            match slot.as_ref() {
                Some(s) if s.key.starts(&asked) => s.done.clone(),
                // Another append still under way: one at a time, so that no member is sent
                // copies faster than it takes them.
                Some(s) if s.done.borrow().is_none() => s.done.clone(),
                _ => {
                    let (tx, rx) = watch::channel(None);
                    let task = send(rpc);
                    tokio::spawn(async move {
                        let outcome = task
                            .await
                            .unwrap_or_else(|e| Err(NoReply::failed(format!("the send failed: {e}"))));
                        let _ = tx.send(Some(outcome));
                    });
                    *slot = Some(Sending {
                        key: asked.clone(),
                        done: rx.clone(),
                    });
                    rx
                }
            }
        };
        if tokio::time::timeout(wait, done.wait_for(Option::is_some))
            .await
            .is_err()
        {
            return Step::Sending;
        }
        let mut slot = self.sending.lock();
        match slot.take() {
            Some(s) if s.key.starts(&asked) => Step::Answered(answer(&s, &asked)),
            // Another append's answer: this one is sent on the next ask.
            _ => Step::Sending,
        }
    }
}

/// The answer of a finished send `s` to the append `asked`.
fn answer(s: &Sending, asked: &Key) -> Outcome {
    let done = s.done.borrow();
    match done.as_ref() {
        Some(Ok(Ok(AppendEntriesResponse::Success))) if s.key.last < asked.last => {
            Ok(Ok(AppendEntriesResponse::PartialSuccess(s.key.last)))
        }
        Some(Ok(Ok(r))) => Ok(Ok(copy(r))),
        Some(Ok(Err(e))) => Ok(Err(e.clone())),
        Some(Err(e)) => Err(e.clone()),
        None => Err(NoReply::failed("no answer")),
    }
}

/// A copy of an answer (openraft's type is not `Clone`).
fn copy(r: &AppendEntriesResponse<u64>) -> AppendEntriesResponse<u64> {
    match r {
        AppendEntriesResponse::Success => AppendEntriesResponse::Success,
        AppendEntriesResponse::PartialSuccess(m) => AppendEntriesResponse::PartialSuccess(*m),
        AppendEntriesResponse::Conflict => AppendEntriesResponse::Conflict,
        AppendEntriesResponse::HigherVote(v) => AppendEntriesResponse::HigherVote(*v),
    }
}

/// The heartbeat that stands for `rpc` while it is being sent: the same leader, entry and
/// commit index, no entries.
pub fn heartbeat(rpc: &AppendEntriesRequest<ShardRaft>) -> AppendEntriesRequest<ShardRaft> {
    AppendEntriesRequest {
        vote: rpc.vote,
        prev_log_id: rpc.prev_log_id,
        leader_commit: rpc.leader_commit,
        entries: Vec::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use openraft::{CommittedLeaderId, Entry, EntryPayload};
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};

    fn id(index: u64) -> LogId<u64> {
        LogId::new(CommittedLeaderId::new(1, 1), index)
    }

    fn append(prev: u64, last: u64) -> AppendEntriesRequest<ShardRaft> {
        AppendEntriesRequest {
            vote: Vote::new_committed(1, 1),
            prev_log_id: Some(id(prev)),
            leader_commit: Some(id(prev)),
            entries: (prev + 1..=last)
                .map(|i| Entry {
                    log_id: id(i),
                    payload: EntryPayload::Blank,
                })
                .collect(),
        }
    }

    /// A send that answers `Success` when `go` is notified, counting the sends begun.
    fn sender(
        sent: Arc<AtomicUsize>,
        go: Arc<tokio::sync::Notify>,
    ) -> impl Fn(AppendEntriesRequest<ShardRaft>) -> tokio::task::JoinHandle<Outcome> {
        move |_| {
            sent.fetch_add(1, Ordering::SeqCst);
            let go = go.clone();
            tokio::spawn(async move {
                go.notified().await;
                Ok(Ok(AppendEntriesResponse::Success))
            })
        }
    }

    #[tokio::test]
    async fn repeats_wait_for_the_one_send_and_a_longer_range_is_told_where_it_matched() {
        let lane = Lane::default();
        let (sent, go) = (Arc::new(AtomicUsize::new(0)), Arc::new(tokio::sync::Notify::new()));
        let short = Duration::from_millis(5);
        for _ in 0..3 {
            let step = lane.append(append(3, 5), short, sender(sent.clone(), go.clone())).await;
            assert!(matches!(step, Step::Sending));
        }
        assert_eq!(sent.load(Ordering::SeqCst), 1, "a repeat is never sent again");
        go.notify_one();
        let step = lane
            .append(append(3, 6), Duration::from_secs(60), sender(sent.clone(), go.clone()))
            .await;
        match step {
            Step::Answered(Ok(Ok(AppendEntriesResponse::PartialSuccess(m)))) => assert_eq!(m, Some(id(5))),
            _ => panic!("the longer range is told the member matched up to 5"),
        }
        // The lane is free again: the next append is sent.
        let _ = lane.append(append(5, 6), short, sender(sent.clone(), go.clone())).await;
        assert_eq!(sent.load(Ordering::SeqCst), 2);
    }

    #[tokio::test]
    async fn another_append_waits_until_the_one_under_way_is_done() {
        let lane = Lane::default();
        let (sent, go) = (Arc::new(AtomicUsize::new(0)), Arc::new(tokio::sync::Notify::new()));
        let short = Duration::from_millis(5);
        let _ = lane.append(append(3, 5), short, sender(sent.clone(), go.clone())).await;
        // A new leader's append (another vote) while the old one is under way: not sent yet.
        let mut other = append(3, 5);
        other.vote = Vote::new_committed(2, 2);
        let step = lane
            .append(other.clone(), short, sender(sent.clone(), go.clone()))
            .await;
        assert!(matches!(step, Step::Sending));
        assert_eq!(sent.load(Ordering::SeqCst), 1);
        go.notify_one();
        // The old one done (its answer is not this one's): taken off, and this one sent.
        for _ in 0..10_000 {
            if sent.load(Ordering::SeqCst) == 2 {
                break;
            }
            let step = lane
                .append(other.clone(), short, sender(sent.clone(), go.clone()))
                .await;
            assert!(matches!(step, Step::Sending));
        }
        assert_eq!(sent.load(Ordering::SeqCst), 2);
        go.notify_one();
        let step = lane
            .append(other, Duration::from_secs(60), sender(sent.clone(), go.clone()))
            .await;
        assert!(matches!(step, Step::Answered(Ok(Ok(AppendEntriesResponse::Success)))));
        assert_eq!(sent.load(Ordering::SeqCst), 2);
    }

    #[test]
    fn the_deadline_grows_with_the_bytes() {
        assert_eq!(deadline(0), Duration::from_secs(5));
        assert_eq!(deadline(64 << 20), Duration::from_secs(9));
    }
}
