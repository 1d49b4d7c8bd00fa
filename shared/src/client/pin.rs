//! Which replica group a shard's members must belong to, as this client believes.
//!
//! A client is given a shard's members by address (`--nodes A|B|C`). An address can be
//! wrong: a typo, a member moved to another group, a blank one wiped and not yet added back.
//! Before a grouped shard's first request the client asks its listed members for their group
//! id and believes the id a majority of them report; every connection to a member then
//! starts with a `PinGroup` frame naming it, and the member refuses (`WrongGroup`, nothing
//! ran) this and every later batch on that connection while it is not in that group. The
//! client passes such a member by like one it cannot reach. Until a majority answers (most
//! members down) the belief stays unknown and each connection is pinned to the group its
//! member is in when it is opened.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use rkyv::util::AlignedVec;
use tokio::sync::Mutex as AsyncMutex;

use super::ClientError;
use super::connection::Connection;
use crate::frame::{FrameHeader, FrameKind};

/// A shard's believed group id (0: not known yet) and the lock its learning takes.
#[derive(Default)]
pub(super) struct GroupPin {
    id: AtomicU64,
    learning: AsyncMutex<()>,
}

impl GroupPin {
    /// The believed group id (0: not known).
    pub fn get(&self) -> u64 {
        self.id.load(Ordering::Relaxed)
    }

    /// Learns the group id from the members' answers to `ask` (each member's own id, or an
    /// error), unless known: the id more than half of `members` report.
    pub async fn learn<F, Fut>(&self, members: &[String], ask: F)
    where
        F: Fn(String) -> Fut,
        Fut: std::future::Future<Output = Result<u64, ClientError>>,
    {
        let _learning = self.learning.lock().await;
        if self.get() != 0 {
            return;
        }
        let mut seen: Vec<(u64, usize)> = Vec::new();
        for addr in members {
            let Ok(id) = ask(addr.clone()).await else { continue };
            if id == 0 {
                continue;
            }
            match seen.iter_mut().find(|(g, _)| *g == id) {
                Some((_, n)) => *n += 1,
                None => seen.push((id, 1)),
            }
            if let Some(&(g, _)) = seen.iter().find(|(_, n)| *n * 2 > members.len()) {
                self.id.store(g, Ordering::Relaxed);
                return;
            }
        }
        tracing::debug!(?members, ?seen, "no majority of a group's members named one group yet");
    }
}

/// Pins `conn` to group `believed` (0: the member's own): returns the member's group id,
/// or the member's refusal (`WrongGroup`).
pub(super) async fn pin(conn: &Connection, believed: u64, timeout: Duration) -> Result<u64, ClientError> {
    let reply = conn
        .start(|id, buf: &mut AlignedVec| {
            buf.clear();
            let header = FrameHeader {
                kind: FrameKind::PinGroup,
                len: 8,
                id,
            };
            buf.extend_from_slice(&header.encode());
            buf.extend_from_slice(&believed.to_le_bytes());
            Ok(())
        })
        .await?
        .wait(timeout)
        .await?;
    match (reply.kind, <[u8; 8]>::try_from(&reply.body[..])) {
        (FrameKind::ConfigOk, Ok(id)) => Ok(u64::from_le_bytes(id)),
        _ => Err(reply.unexpected()),
    }
}
