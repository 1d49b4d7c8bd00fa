//! What a slot migration's copy sends (see [`crate::slots`] for the steps it serves): the
//! pages of keys read from the source (`SlotScan`, and `SlotTrack`'s pre-copy and changed
//! keys), and the `Load` ops that write them at the target.
//!
//! A move copies a slot's keys **before** freezing it, while the source still takes writes:
//! the source first starts tracking the keys written in those slots (`SlotTrack` `Start`,
//! under a token the admin drew), the admin copies every key (`Scan` pages), then, chunk by
//! chunk, freezes the slots and copies again only the keys written since (`Changed` pages:
//! each with its value now, or marked absent when it was removed). A node that restarted,
//! flushed, installed a snapshot or ran out of its tracking budget no longer holds the
//! token and answers `NotFound`: the admin then copies the chunk whole while it is frozen.
//!
//! Every decoder here reads bytes from a peer: lengths are checked, nothing panics.

use crate::keyspace::ScanRequest;
use crate::slots::{decode_ranges, encode_ranges};

/// One key of a slot being copied: what a page holds and a `Load` op writes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Copied<'a> {
    /// The key.
    pub key: &'a [u8],
    /// Its value; `None`: the key is absent at the source now (a changed key that was
    /// removed since the copy began), so the target removes it too.
    pub value: Option<&'a [u8]>,
    /// Its deadline (Unix milliseconds), if it has one.
    pub deadline: Option<u64>,
}

/// A value length that marks a key absent at the source in a page.
const ABSENT: u32 = u32::MAX;

/// The most bytes of keys and values a copy's page holds (a page stops past it). Larger
/// than a `SCAN` page: a copy off a saturated source waits in its queue once per page, so
/// fewer, fuller pages move the same keys in fewer waits.
pub const MAX_COPY_PAGE_BYTES: usize = 4 << 20;

/// A `SlotScan` op's value: a scan request (see [`crate::keyspace::ScanRequest`]) and the
/// slots wanted.
pub fn encode_slot_scan(req: ScanRequest, ranges: &[[u16; 2]]) -> Vec<u8> {
    let mut out = req.encode().to_vec();
    encode_ranges(ranges, &mut out);
    out
}

/// Reads a `SlotScan` op's value; `None` when it does not parse.
pub fn decode_slot_scan(bytes: &[u8]) -> Option<(ScanRequest, Vec<[u16; 2]>)> {
    let (req, rest) = bytes.split_at_checked(12)?;
    Some((ScanRequest::decode(req)?, decode_ranges(rest)?))
}

/// What a `Load` op writes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Loaded<'a> {
    /// The key's value and deadline as the source holds them.
    Value(&'a [u8], Option<u64>),
    /// The key is absent at the source: remove it.
    Absent,
}

/// A `Load` op's value: the deadline (u64, 0: none) then the value; no bytes at all for a
/// key absent at the source.
pub fn encode_load(value: Option<&[u8]>, deadline: Option<u64>, out: &mut Vec<u8>) {
    if let Some(value) = value {
        out.extend_from_slice(&deadline.unwrap_or(0).to_le_bytes());
        out.extend_from_slice(value);
    }
}

/// Reads a `Load` op's value; `None` when it does not parse.
pub fn decode_load(bytes: &[u8]) -> Option<Loaded<'_>> {
    if bytes.is_empty() {
        return Some(Loaded::Absent);
    }
    let (at, value) = bytes.split_first_chunk::<8>()?;
    let at = u64::from_le_bytes(*at);
    Some(Loaded::Value(value, (at != 0).then_some(at)))
}

/// Appends one copied key to a page: key length u32, value length u32 (`u32::MAX`: absent),
/// deadline u64 (0: none), key, value.
pub fn encode_copied(c: &Copied<'_>, out: &mut Vec<u8>) {
    out.extend_from_slice(&(c.key.len() as u32).to_le_bytes());
    out.extend_from_slice(&c.value.map_or(ABSENT, |v| v.len() as u32).to_le_bytes());
    out.extend_from_slice(&c.deadline.unwrap_or(0).to_le_bytes());
    out.extend_from_slice(c.key);
    out.extend_from_slice(c.value.unwrap_or_default());
}

/// Reads a page: the next cursor (0: done) and the keys; `None` when it does not parse.
pub fn decode_copied(bytes: &[u8]) -> Option<(u64, Vec<Copied<'_>>)> {
    let (next, mut rest) = bytes.split_first_chunk::<8>()?;
    let mut keys = Vec::new();
    while !rest.is_empty() {
        let (head, body) = rest.split_first_chunk::<16>()?;
        let klen = u32::from_le_bytes(head[..4].try_into().ok()?) as usize;
        let vlen = u32::from_le_bytes(head[4..8].try_into().ok()?);
        let at = u64::from_le_bytes(head[8..].try_into().ok()?);
        let key = body.get(..klen)?;
        let (value, used) = match vlen {
            ABSENT => (None, klen),
            n => {
                let end = klen.checked_add(n as usize)?;
                (Some(body.get(klen..end)?), end)
            }
        };
        keys.push(Copied {
            key,
            value,
            deadline: (at != 0).then_some(at),
        });
        rest = body.get(used..)?;
    }
    Some((u64::from_le_bytes(*next), keys))
}

/// A `SlotTrack` op's value: one step of a copy made while the slots take writes (see the
/// module's notes). Every step names the token its `Start` gave.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TrackRequest {
    /// Track the keys written in `ranges` from now on (replacing any tracking before).
    /// Answered `Stored`.
    Start {
        /// Drawn by the admin for this move.
        token: u64,
        /// The slots to track.
        ranges: Vec<[u16; 2]>,
    },
    /// A page of every key of `ranges`, as `SlotScan` pages them; answered `Found`, or
    /// `NotFound` when the node is not tracking under `token`.
    Scan {
        /// The move's token.
        token: u64,
        /// Where to start and how many keys.
        req: ScanRequest,
        /// The slots wanted.
        ranges: Vec<[u16; 2]>,
    },
    /// A page of the keys of `ranges` written since tracking began (their slots frozen by
    /// now), each with its value now or absent; the first page (cursor 0) collects them.
    /// Answered `Found`, or `NotFound` when the node is not tracking under `token`.
    Changed {
        /// The move's token.
        token: u64,
        /// Where to start (0: collect; then the cursor the last page gave) and how many.
        req: ScanRequest,
        /// The slots wanted.
        ranges: Vec<[u16; 2]>,
    },
    /// Stop tracking under `token` (another token's tracking is left alone). `Stored`.
    Stop {
        /// The move's token.
        token: u64,
    },
}

impl TrackRequest {
    /// Its bytes: the step (u8), the token (u64), a scan request for `Scan` and `Changed`,
    /// then the ranges (little-endian).
    pub fn encode(&self) -> Vec<u8> {
        let (step, token, req, ranges): (u8, u64, Option<ScanRequest>, &[[u16; 2]]) = match self {
            TrackRequest::Start { token, ranges } => (0, *token, None, ranges),
            TrackRequest::Scan { token, req, ranges } => (1, *token, Some(*req), ranges),
            TrackRequest::Changed { token, req, ranges } => (2, *token, Some(*req), ranges),
            TrackRequest::Stop { token } => (3, *token, None, &[]),
        };
        let mut out = vec![step];
        out.extend_from_slice(&token.to_le_bytes());
        if let Some(req) = req {
            out.extend_from_slice(&req.encode());
        }
        encode_ranges(ranges, &mut out);
        out
    }

    /// Reads one; `None` unless the bytes are exactly one.
    pub fn decode(bytes: &[u8]) -> Option<TrackRequest> {
        let (&step, rest) = bytes.split_first()?;
        let (token, rest) = rest.split_first_chunk::<8>()?;
        let token = u64::from_le_bytes(*token);
        let scan = |rest: &[u8]| -> Option<(ScanRequest, Vec<[u16; 2]>)> {
            let (req, ranges) = rest.split_at_checked(12)?;
            Some((ScanRequest::decode(req)?, decode_ranges(ranges)?))
        };
        match step {
            0 => Some(TrackRequest::Start {
                token,
                ranges: decode_ranges(rest)?,
            }),
            1 => scan(rest).map(|(req, ranges)| TrackRequest::Scan { token, req, ranges }),
            2 => scan(rest).map(|(req, ranges)| TrackRequest::Changed { token, req, ranges }),
            3 if rest.is_empty() => Some(TrackRequest::Stop { token }),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;
    use crate::routing::SLOTS;

    #[test]
    fn an_absent_key_loads_as_a_removal() {
        let mut v = Vec::new();
        encode_load(None, Some(5), &mut v);
        assert_eq!(decode_load(&v), Some(Loaded::Absent));
        encode_load(Some(b"x"), Some(5), &mut v);
        assert_eq!(decode_load(&v), Some(Loaded::Value(b"x", Some(5))));
        assert_eq!(decode_load(&[1, 2, 3]), None);
    }

    proptest! {
        /// Pages, loads and requests read back as written; any bytes decode without a panic.
        #[test]
        fn round_trips_and_never_panics(
            ranges in proptest::collection::vec((0u16..SLOTS, 0u16..SLOTS), 0..20),
            junk in proptest::collection::vec(any::<u8>(), 0..200),
            key in proptest::collection::vec(any::<u8>(), 0..20),
            at in any::<u64>(),
            present in any::<bool>(),
            token in any::<u64>(),
        ) {
            let ranges: Vec<[u16; 2]> = ranges.into_iter().map(|(a, b)| [a.min(b), a.max(b)]).collect();
            let _ = decode_copied(&junk);
            let _ = decode_load(&junk);
            let _ = decode_slot_scan(&junk);
            let _ = TrackRequest::decode(&junk);
            let c = Copied { key: &key, value: present.then_some(&junk[..]), deadline: (at != 0).then_some(at) };
            let mut page = 7u64.to_le_bytes().to_vec();
            encode_copied(&c, &mut page);
            encode_copied(&c, &mut page);
            prop_assert_eq!(decode_copied(&page), Some((7, vec![c.clone(), c])));
            let req = ScanRequest { cursor: at, count: 9 };
            prop_assert_eq!(decode_slot_scan(&encode_slot_scan(req, &ranges)), Some((req, ranges.clone())));
            for r in [
                TrackRequest::Start { token, ranges: ranges.clone() },
                TrackRequest::Scan { token, req, ranges: ranges.clone() },
                TrackRequest::Changed { token, req, ranges: ranges.clone() },
                TrackRequest::Stop { token },
            ] {
                prop_assert_eq!(TrackRequest::decode(&r.encode()), Some(r));
            }
        }
    }
}
