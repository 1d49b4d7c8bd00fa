//! What a RESP command's handler is given and gives back: the connection's session, the
//! context of a command ([`Ctx`]), the flow after it, and the small helpers every handler
//! shares. Below every handler and the dispatcher (no file of `resp/` that this imports
//! imports it back).

use super::errors::CommandError;
use super::parse::Args;
use super::pipeline::Pipeline;
use super::reply;
use super::tx_state::TxState;
use crate::edge::conn::Auth;
use crate::node::Node;

/// Redis Cluster's refusal of a command whose keys are of several shards.
pub const CROSSSLOT: &str = "CROSSSLOT Keys in request don't hash to the same slot";

/// A connection's Redis Cluster standing.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Reads {
    /// Reads of this shard's slots go to its master (Redis's default).
    #[default]
    Master,
    /// `READONLY`: a replica serves reads of its shard's slots.
    Replica,
}

/// What a connection remembers between commands.
pub struct Session {
    pub(super) id: u64,
    pub(super) peer: String,
    pub(super) name: Vec<u8>,
    /// MULTI's queue and WATCH's keys.
    pub(super) tx: TxState,
    /// READONLY or READWRITE (Redis Cluster).
    pub(super) reads: Reads,
}

impl Session {
    /// A new connection's session.
    pub fn new(id: u64, peer: String) -> Session {
        Session {
            id,
            peer,
            name: Vec::new(),
            tx: TxState::default(),
            reads: Default::default(),
        }
    }

    /// After a round: keeps what a WATCH in it found.
    pub fn after_round(&mut self, p: &Pipeline) {
        self.tx.after_round(p);
    }

    /// Bytes the session holds (queued commands, watched keys).
    pub fn held_bytes(&self) -> usize {
        self.tx.held_bytes()
    }
}

/// What a command may use: the node, whether other shards' keys are forwarded (or, in a
/// Redis Cluster node, redirected), the connection's session and its standing with the token.
pub struct Ctx<'a> {
    pub node: &'a Node,
    pub forward: bool,
    /// `--resp-cluster`: a command for another shard's keys is answered `-MOVED`.
    pub redirect: bool,
    /// The cluster as this node sees it (CLUSTER SLOTS, MOVED's addresses).
    pub view: Option<&'a crate::cluster_view::ClusterView>,
    pub session: &'a mut Session,
    pub auth: Auth<'a>,
    /// The port this node serves RESP on (INFO's `tcp_port`).
    pub port: u16,
}

pub(super) fn is(arg: &[u8], name: &str) -> bool {
    arg.eq_ignore_ascii_case(name.as_bytes())
}

pub(super) fn wrong_args(p: &mut Pipeline, name: &[u8]) {
    let name = String::from_utf8_lossy(name).to_ascii_lowercase();
    refuse(p, &CommandError::WrongArgs(name));
}

/// Answers `e` at once: the command is not run.
pub(super) fn refuse(p: &mut Pipeline, e: &CommandError) {
    p.immediate(|o| reply::error(o, &e.to_string()));
}

/// What the connection does after a command: go on, or close once its replies are sent.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Flow {
    Go,
    Close,
}

/// A command's handler: adds it to the pipeline (its ops, or a reply at once). The command
/// table (`table`) names one per command; the arity was checked before it runs.
pub type Handler = fn(&mut Ctx<'_>, &Args<'_>, &mut Pipeline) -> Flow;
