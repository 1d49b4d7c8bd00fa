//! What every connection of every front shares: the settings, the counters, the token check, the buffer
//! budget, the warning limits, where each front listens, and the connection slots.

use std::net::SocketAddr;
use std::sync::Arc;

use kvshared::stats::Counter;
use tokio::sync::Semaphore;

use super::budget::BufferBudget;
use super::config::EdgeConfig;
use super::front::Front;
use super::warn_limit::{PER_CONNECTION, WarnLimit};
use crate::counters::Counters;

/// Refusals (over the limit, protected mode) being written at once; past this, a refused
/// connection is closed without a word rather than hold another descriptor.
const MAX_REFUSING: usize = 64;

/// The node-wide state of the edge.
pub(crate) struct Edge {
    /// The limits and the token.
    pub config: EdgeConfig,
    /// Where connections are counted (the node's counters).
    pub counters: Arc<Counters>,
    /// What the connections' buffers may hold together (`--max-buffer-memory`).
    pub budget: Arc<BufferBudget>,
    /// How many warnings peers may cause.
    pub warnings: WarnLimit,
    /// Where each front listens (`None`: not served), to name the right port.
    pub addrs: [Option<SocketAddr>; 3],
    /// `--max-conns`, over every front together.
    pub slots: Arc<Semaphore>,
    /// Refusals in flight (see [`MAX_REFUSING`]).
    pub refusing: Arc<Semaphore>,
}

/// Who is on the other end of a connection, for counting and rate-limited logging.
pub(crate) struct Peer {
    /// The connection's id (it picks the counters' stripe).
    pub id: u64,
    /// Its address, for the log.
    pub addr: String,
    /// Which front it came in by.
    pub front: Front,
    /// Warnings it has caused in the log.
    warned: u32,
}

impl Peer {
    /// A peer of `front` at `addr`.
    pub fn new(id: u64, addr: String, front: Front) -> Peer {
        Peer {
            id,
            addr,
            front,
            warned: 0,
        }
    }
}

impl Edge {
    /// The edge held to `config`, counting into `counters`, whose fronts listen on `addrs`.
    pub fn new(config: EdgeConfig, counters: Arc<Counters>, addrs: [Option<SocketAddr>; 3]) -> Edge {
        Edge {
            budget: Arc::new(BufferBudget::new(config.max_buffer_memory)),
            warnings: WarnLimit::default(),
            slots: Arc::new(Semaphore::new(config.max_conns.clamp(1, Semaphore::MAX_PERMITS))),
            refusing: Arc::new(Semaphore::new(MAX_REFUSING)),
            addrs,
            config,
            counters,
        }
    }

    /// Where `front` listens.
    pub fn addr(&self, front: Front) -> Option<SocketAddr> {
        self.addrs[front.index()]
    }

    /// Adds `n` to counter `c` for `peer`.
    pub fn count(&self, peer: &Peer, c: Counter, n: u64) {
        self.counters.add(peer.id, c, n);
    }

    /// Whether `peer` may log a warning now (a few per connection, a few per second for
    /// the node): `Some(n)` with the number suppressed node-wide since the last one written.
    pub fn may_warn(&self, peer: &mut Peer) -> Option<u64> {
        if peer.warned >= PER_CONNECTION {
            self.count(peer, Counter::LogSuppressed, 1);
            return None;
        }
        match self.warnings.admit() {
            Some(suppressed) => {
                peer.warned += 1;
                Some(suppressed)
            }
            None => {
                self.count(peer, Counter::LogSuppressed, 1);
                None
            }
        }
    }

    /// Whether the node needs a token.
    pub fn needs_token(&self) -> bool {
        self.config.auth.is_some()
    }

    /// Whether `presented` is the node's token (always, when it has none). A wrong one is
    /// counted for the peer's front and logged within the limits.
    pub fn check_token(&self, peer: &mut Peer, presented: &[u8]) -> bool {
        let Some(token) = &self.config.auth else {
            return true;
        };
        if token.matches(presented) {
            return true;
        }
        self.auth_failed(peer, "refused a wrong token");
        false
    }

    /// Counts a request refused for want of the token (or a wrong one), for the peer's
    /// front, and logs it within the limits.
    pub fn auth_failed(&self, peer: &mut Peer, what: &'static str) {
        self.count(peer, Counter::AuthFailed, 1);
        match peer.front {
            Front::Binary => {}
            Front::Resp => self.count(peer, Counter::AuthFailedResp, 1),
            Front::Http => self.count(peer, Counter::AuthFailedHttp, 1),
        }
        if let Some(suppressed) = self.may_warn(peer) {
            tracing::warn!(peer = %peer.addr, front = peer.front.label(), suppressed, "{what}");
        }
    }
}
