//! The sequential specification the checker holds histories to: one register per key with
//! get, put and delete, starting absent.
//!
//! Values are interned to small integers per key (0 = absent) so a model state is one `u32`
//! and the checker's memo table stays small.

use std::collections::HashMap;

use super::{Call, Operation, Return};

/// An operation of one key's partition, reduced to what the model needs.
#[derive(Clone, Copy, Debug)]
pub(crate) struct ModelOp {
    pub kind: Kind,
    pub call: u64,
    /// `u64::MAX` when the outcome is unknown.
    pub ret: u64,
    /// An op that must be placed before this one (an expiry's put).
    pub after: Option<usize>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Kind {
    /// Get that returned this state (0 = not found).
    Get(u32),
    /// Get with no known answer.
    GetUnknown,
    Put(u32),
    Delete {
        existed: bool,
    },
    DeleteUnknown,
    /// A time to live ran out: the key goes if it holds this value.
    ExpireIf(u32),
}

impl Kind {
    /// Whether the op never changes the state, wherever it applies (a read, or a delete
    /// that found nothing). Such an op, once it may be placed, can be placed at once: see
    /// the checker's search.
    #[inline]
    pub(crate) fn is_observer(self) -> bool {
        matches!(self, Kind::Get(_) | Kind::GetUnknown | Kind::Delete { existed: false })
    }

    /// [`Kind::is_observer`] from `state`: also an expiry of a value the key no longer
    /// holds. Its put was placed before it (`ModelOp::after`), and values are unique, so
    /// that value never comes back: the expiry changes nothing wherever it goes from here.
    #[inline]
    pub(crate) fn is_observer_at(self, state: u32) -> bool {
        match self {
            Kind::ExpireIf(v) => v != state,
            k => k.is_observer(),
        }
    }
}

/// The state after `op` from `state`, or `None` if `op`'s answer is impossible there.
#[inline]
pub(crate) fn step(state: u32, op: Kind) -> Option<u32> {
    match op {
        Kind::Get(seen) => (seen == state).then_some(state),
        Kind::GetUnknown => Some(state),
        Kind::Put(v) => Some(v),
        Kind::Delete { existed } => (existed == (state != 0)).then_some(0),
        Kind::DeleteUnknown => Some(0),
        Kind::ExpireIf(v) => Some(if state == v { 0 } else { state }),
    }
}

/// Interns values of one key: the same string always gets the same id; 0 is "absent".
#[derive(Default)]
struct Interner<'a> {
    ids: HashMap<&'a str, u32>,
}

impl<'a> Interner<'a> {
    fn id(&mut self, value: Option<&'a str>) -> u32 {
        match value {
            None => 0,
            Some(v) => {
                let next = self.ids.len() as u32 + 1;
                *self.ids.entry(v).or_insert(next)
            }
        }
    }
}

/// The state after a put of a value that no get of the key ever returned. Every such value
/// behaves the same in the model (no read can match it, a delete finds it), so they are one
/// state: orders that differ only in which unread value is current are the same to the
/// search.
pub(crate) const UNREAD: u32 = u32::MAX;

/// Converts one key's operations, interning values. With `merge_unread`, every value no get
/// returned becomes [`UNREAD`].
pub(crate) fn reduce(ops: &[&Operation], merge_unread: bool) -> Vec<ModelOp> {
    let mut values = Interner::default();
    let read: std::collections::HashSet<&str> = ops
        .iter()
        .filter_map(|op| match (&op.call, &op.ret) {
            (_, Return::Value { value: Some(v) }) => Some(v.as_str()),
            // A value with a time to live has its own state: its expiry names it.
            (Call::Expiry { value }, _) => Some(value.as_str()),
            _ => None,
        })
        .collect();
    let mut model = ops
        .iter()
        .map(|op| {
            let kind = match (&op.call, &op.ret) {
                (Call::Put { value }, _) if merge_unread && !read.contains(value.as_str()) => Kind::Put(UNREAD),
                (Call::Put { value }, _) => Kind::Put(values.id(Some(value.as_str()))),
                (Call::PutTtl { value, .. }, _) if merge_unread && !read.contains(value.as_str()) => Kind::Put(UNREAD),
                (Call::PutTtl { value, .. }, _) => Kind::Put(values.id(Some(value.as_str()))),
                (Call::Expiry { value }, _) => Kind::ExpireIf(values.id(Some(value.as_str()))),
                (Call::Get, Return::Value { value }) => Kind::Get(values.id(value.as_deref())),
                (Call::Get, _) => Kind::GetUnknown,
                (Call::Delete, Return::Deleted { existed }) => Kind::Delete { existed: *existed },
                (Call::Delete, _) => Kind::DeleteUnknown,
            };
            let ret = if op.ret == Return::Unknown {
                u64::MAX
            } else {
                op.return_ns.max(op.call_ns)
            };
            ModelOp {
                kind,
                call: op.call_ns,
                ret,
                after: None,
            }
        })
        .collect::<Vec<_>>();
    // Each expiry after its put (the one put of its value: values are unique).
    let puts: HashMap<&str, usize> = ops
        .iter()
        .enumerate()
        .filter_map(|(i, op)| match &op.call {
            Call::PutTtl { value, .. } => Some((value.as_str(), i)),
            _ => None,
        })
        .collect();
    for (m, op) in model.iter_mut().zip(ops) {
        if let Call::Expiry { value } = &op.call {
            m.after = puts.get(value.as_str()).copied();
        }
    }
    model
}
