//! Times to live: how the expiry ops carry their arguments in an op's value, once for the
//! client, kvd's fronts and the store.
//!
//! A deadline is a Unix time in milliseconds (what Redis's `PXAT` takes and `PEXPIRETIME`
//! answers), so a replayed log or a replica reaches the same deadline as the leader did. A
//! time to live relative to "now" travels as such and becomes a deadline where the op runs:
//! against the node's clock in memory, and against the clock the leader wrote into the log
//! entry when it is applied from a log (every member and every replay reads the same one).

use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// The longest time to live or furthest deadline kvd takes, in milliseconds: past it, a
/// deadline in milliseconds could overflow when added to the clock (Redis refuses the same
/// way: "invalid expire time").
pub const MAX_TTL_MS: u64 = 1 << 52;

/// Milliseconds since the Unix epoch on this machine's clock (0 before 1970).
pub fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// When a key stops existing: at a Unix time, or a time after the op runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Deadline {
    /// At this Unix time in milliseconds (Redis `EXAT`/`PXAT`).
    At(u64),
    /// This many milliseconds after the op runs (Redis `EX`/`PX`).
    In(u64),
}

impl Deadline {
    /// A time to live from now.
    pub fn after(ttl: Duration) -> Deadline {
        Deadline::In(ttl.as_millis().min(u128::from(MAX_TTL_MS)) as u64)
    }

    /// The Unix time in milliseconds this deadline is for an op that runs at `now`.
    pub fn resolve(self, now: u64) -> u64 {
        match self {
            Deadline::At(at) => at,
            Deadline::In(ms) => now.saturating_add(ms),
        }
    }

    fn encode(self, out: &mut Vec<u8>) {
        let (relative, ms) = match self {
            Deadline::At(at) => (0u8, at),
            Deadline::In(ms) => (1u8, ms),
        };
        out.push(relative);
        out.extend_from_slice(&ms.to_le_bytes());
    }

    fn decode(bytes: &[u8]) -> Option<(Deadline, &[u8])> {
        let (&relative, rest) = bytes.split_first()?;
        let (ms, rest) = rest.split_first_chunk::<8>()?;
        let ms = u64::from_le_bytes(*ms);
        if ms > MAX_TTL_MS.saturating_mul(2) {
            return None;
        }
        match relative {
            0 => Some((Deadline::At(ms), rest)),
            1 => Some((Deadline::In(ms), rest)),
            _ => None,
        }
    }
}

/// What a put does to the key's time to live.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PutTtl {
    /// Removes it (what a plain `SET` does).
    Clear,
    /// Keeps it (`SET ... KEEPTTL`).
    Keep,
    /// Sets it (`SET ... EX|PX|EXAT|PXAT`, `SETEX`).
    Until(Deadline),
}

/// When a put stores its value.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PutIf {
    /// Always.
    Always,
    /// Only when the key is absent (`NX`).
    Absent,
    /// Only when the key is present (`XX`).
    Present,
}

/// The value of a `PutWith` op: `[condition u8][ttl tag u8][deadline: relative u8, ms
/// u64]?[the value]`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PutWith<'a> {
    /// When it stores.
    pub cond: PutIf,
    /// What it does to the time to live.
    pub ttl: PutTtl,
    /// What it stores.
    pub value: &'a [u8],
}

impl<'a> PutWith<'a> {
    /// The op's value bytes.
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(self.value.len() + 11);
        self.encode_into(&mut out);
        out
    }

    /// Appends the op's value bytes to `out`.
    pub fn encode_into(&self, out: &mut Vec<u8>) {
        out.push(match self.cond {
            PutIf::Always => 0,
            PutIf::Absent => 1,
            PutIf::Present => 2,
        });
        match self.ttl {
            PutTtl::Clear => out.push(0),
            PutTtl::Keep => out.push(1),
            PutTtl::Until(d) => {
                out.push(2);
                d.encode(out);
            }
        }
        out.extend_from_slice(self.value);
    }

    /// Reads an op's value; `None` when it is not one [`PutWith::encode`] makes.
    pub fn decode(bytes: &'a [u8]) -> Option<PutWith<'a>> {
        let [cond, tag, rest @ ..] = bytes else { return None };
        let cond = match cond {
            0 => PutIf::Always,
            1 => PutIf::Absent,
            2 => PutIf::Present,
            _ => return None,
        };
        let (ttl, value) = match tag {
            0 => (PutTtl::Clear, rest),
            1 => (PutTtl::Keep, rest),
            2 => {
                let (d, value) = Deadline::decode(rest)?;
                (PutTtl::Until(d), value)
            }
            _ => return None,
        };
        Some(PutWith { cond, ttl, value })
    }
}

/// What an `Expire` op does, as Redis's `EXPIRE` options and `PERSIST`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ExpireIf {
    /// Sets the deadline.
    Always,
    /// Only when the key has none (`NX`).
    NoTtl,
    /// Only when it has one (`XX`).
    HasTtl,
    /// Only when the new one is later (`GT`; no deadline counts as infinitely late).
    Later,
    /// Only when the new one is sooner (`LT`).
    Sooner,
    /// Removes the deadline (`PERSIST`); the op's deadline is ignored.
    Persist,
}

/// The value of an `Expire` op: `[condition u8][relative u8][ms u64]`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Expire {
    /// When it changes the deadline.
    pub cond: ExpireIf,
    /// The new deadline.
    pub deadline: Deadline,
}

const EXPIRE_IFS: [ExpireIf; 6] = [
    ExpireIf::Always,
    ExpireIf::NoTtl,
    ExpireIf::HasTtl,
    ExpireIf::Later,
    ExpireIf::Sooner,
    ExpireIf::Persist,
];

impl Expire {
    /// `PERSIST`.
    pub fn persist() -> Expire {
        Expire {
            cond: ExpireIf::Persist,
            deadline: Deadline::At(0),
        }
    }

    /// The op's value bytes.
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(10);
        out.push(EXPIRE_IFS.iter().position(|c| *c == self.cond).unwrap_or(0) as u8);
        self.deadline.encode(&mut out);
        out
    }

    /// Reads an op's value; `None` when it is not one [`Expire::encode`] makes.
    pub fn decode(bytes: &[u8]) -> Option<Expire> {
        let (&cond, rest) = bytes.split_first()?;
        let cond = *EXPIRE_IFS.get(usize::from(cond))?;
        let (deadline, rest) = Deadline::decode(rest)?;
        rest.is_empty().then_some(Expire { cond, deadline })
    }

    /// Whether the key, holding `current` (its deadline, if any), takes `new`.
    pub fn applies(self, current: Option<u64>, new: u64) -> bool {
        match (self.cond, current) {
            (ExpireIf::Always | ExpireIf::Persist, _) => true,
            (ExpireIf::NoTtl, c) => c.is_none(),
            (ExpireIf::HasTtl, c) => c.is_some(),
            (ExpireIf::Later, Some(c)) => new > c,
            (ExpireIf::Later, None) => false,
            (ExpireIf::Sooner, Some(c)) => new < c,
            (ExpireIf::Sooner, None) => true,
        }
    }
}

/// A `Clock` op's value: the Unix time in milliseconds the leader read when it logged the
/// batch; the batch's ops that look at time (expiry) use it instead of the clock of the
/// member applying it.
pub fn clock_value(ms: u64) -> [u8; 8] {
    ms.to_le_bytes()
}

/// Reads a `Clock` op's value.
pub fn clock_of(bytes: &[u8]) -> Option<u64> {
    <[u8; 8]>::try_from(bytes).ok().map(u64::from_le_bytes)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn args_round_trip_and_no_bytes_panic(bytes in proptest::collection::vec(any::<u8>(), 0..40),
                                              ms in 0..MAX_TTL_MS, cond in 0usize..6) {
            let _ = PutWith::decode(&bytes);
            let _ = Expire::decode(&bytes);
            let put = PutWith { cond: PutIf::Present, ttl: PutTtl::Until(Deadline::In(ms)), value: &bytes };
            let bytes = put.encode();
            prop_assert_eq!(PutWith::decode(&bytes), Some(put));
            let e = Expire { cond: EXPIRE_IFS[cond], deadline: Deadline::At(ms) };
            prop_assert_eq!(Expire::decode(&e.encode()), Some(e));
        }
    }

    #[test]
    fn conditions_are_redis_s() {
        let gt = Expire {
            cond: ExpireIf::Later,
            deadline: Deadline::At(0),
        };
        assert!(!gt.applies(None, 5), "GT: no deadline is later than any");
        assert!(gt.applies(Some(4), 5) && !gt.applies(Some(5), 5));
        let lt = Expire {
            cond: ExpireIf::Sooner,
            ..gt
        };
        assert!(lt.applies(None, 5) && lt.applies(Some(6), 5) && !lt.applies(Some(5), 5));
        assert_eq!(Deadline::In(10).resolve(100), 110);
        assert_eq!(Deadline::At(10).resolve(100), 10);
    }
}
