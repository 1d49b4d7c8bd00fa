//! A connection's transaction state: MULTI's queue, the watched keys and what WATCH found.
//! (The commands that change it are `transaction`'s.)

use std::ops::Range;

use super::pipeline::Pipeline;

/// A connection's transaction state.
#[derive(Default)]
pub struct TxState {
    pub(super) multi: Multi,
    /// Watched keys and what WATCH found (see `wire::watch_value`).
    pub(super) watched: Vec<(Vec<u8>, [u8; 9])>,
    /// The keys of a WATCH in the round now running, until `after_round` keeps what it found.
    pub(super) watching: Vec<Vec<u8>>,
    /// EXEC's queued commands, for the dispatcher to add to EXEC's batch.
    pub(super) to_run: Vec<(Vec<u8>, Vec<Range<usize>>)>,
}

/// Whether MULTI is queuing, and its queue.
#[derive(Default)]
pub(super) enum Multi {
    #[default]
    Off,
    Queuing(Queue),
}

/// MULTI's queue.
#[derive(Default)]
pub(super) struct Queue {
    pub(super) commands: Vec<(Vec<u8>, Vec<Range<usize>>)>,
    pub(super) bytes: usize,
    /// The node that owns every key queued so far.
    pub(super) owner: Option<u32>,
    /// A command was refused when queued: EXEC answers EXECABORT.
    pub(super) failed: bool,
}

impl TxState {
    /// EXEC's queued commands, taken by the dispatcher to add them to EXEC's batch.
    pub fn take_to_run(&mut self) -> Vec<(Vec<u8>, Vec<Range<usize>>)> {
        std::mem::take(&mut self.to_run)
    }

    /// After a round: keeps what its WATCH found.
    pub fn after_round(&mut self, p: &Pipeline) {
        if self.watching.is_empty() {
            return;
        }
        let seen = p.watched();
        for (key, value) in std::mem::take(&mut self.watching).into_iter().zip(seen) {
            match self.watched.iter_mut().find(|(k, _)| *k == key) {
                Some(w) => w.1 = value,
                None => self.watched.push((key, value)),
            }
        }
    }

    /// Whether MULTI is queuing commands.
    pub fn is_queuing(&self) -> bool {
        matches!(self.multi, Multi::Queuing(_))
    }

    /// Bytes the queued commands and watched keys hold (charged to the buffer budget).
    pub fn held_bytes(&self) -> usize {
        let queued = match &self.multi {
            Multi::Queuing(q) => q.bytes,
            Multi::Off => 0,
        };
        queued + self.watched.iter().map(|(k, _)| k.len() + 9).sum::<usize>()
    }
}
