//! Exporting the store for a snapshot (the format is in `dump`), without stopping it.
//!
//! A map shard is copied in steps of [`STEP`] table slots, each under the shard's read
//! lock for tens of microseconds. Meanwhile the shard notes every key written in it
//! ([`CopyWrites`], kept by `Shard::note_written` and `Shard::remove_at`), and every key a
//! delete shifts back to another slot (it may cross the copy's position). The last step,
//! under the write lock, takes those keys and copies their current pairs and the shard's
//! last log entry; every stepped copy of those keys is dropped. Every other key stayed in
//! its slot, unchanged, and was copied once. So the shard's section holds every key as of
//! that entry, exactly as a copy made under one lock would (what `dump`'s replay needs),
//! while a write to the shard waits for one step at most instead of the whole shard.
//!
//! Why: holding the read lock for the whole shard (12,500 pairs of a 200,000-key store on
//! 16 map shards) made every write to it wait, every read queue behind that write
//! (parking_lot's locks let no reader pass a waiting writer), and a 0.15-core node stop
//! serving for most of a 300-400 ms snapshot (docs/PERFORMANCE.md, "Snapshots that do not
//! stop the node").
//!
//! When the table grew meanwhile (every entry moves), the shard was replaced (a flush makes
//! a new one, without the notes) or the notes outgrew [`MAX_NOTED_BYTES`], the last step
//! copies the whole shard under its lock instead, as before.

use kvshared::routing::key_hash;

use super::Store;
use super::dump::{HAS_DEADLINE, SHARD_HEADER, SLOT_TABLE_FOLLOWS};
use super::memory::Shard;

/// Table slots copied per step under the shard's read lock (at most 4 in 5 hold an entry:
/// about 50 us here).
const STEP: usize = 512;
/// Key bytes a shard notes while it is copied before the copy gives up on steps and
/// copies the shard whole under its lock (a write burst of 8 MiB of keys in one shard
/// during its copy).
const MAX_NOTED_BYTES: usize = 8 << 20;

/// Keys written in a map shard while a snapshot copies it.
#[derive(Default)]
pub(super) struct CopyWrites {
    keys: Vec<Box<[u8]>>,
    bytes: usize,
    overflowed: bool,
}

impl CopyWrites {
    #[inline]
    pub(super) fn note(&mut self, key: &[u8]) {
        if self.overflowed {
            return;
        }
        self.bytes += key.len();
        if self.bytes > MAX_NOTED_BYTES {
            self.overflowed = true;
            self.keys = Vec::new();
        } else {
            self.keys.push(key.into());
        }
    }
}

/// How [`Store::export_into`] ended.
#[derive(Debug, PartialEq, Eq)]
pub enum Exported {
    /// Every map shard was written; this many pairs.
    Done(u64),
    /// A transaction or a slot change was applied during the copy, which may have split
    /// it: what was written is to be thrown away and the export made again.
    Interrupted,
}

impl Store {
    /// Exports the whole store through `write` (the header, then one map shard at a time),
    /// calling `between` after each step of a shard's copy. With `hold_gate`, holds the
    /// transaction gate (`Store::hold_transactions`) throughout, so nothing splits a
    /// transaction or a slot change; without, takes it only at the start and at the end,
    /// and answers [`Exported::Interrupted`] as soon as one was applied in between (its
    /// shards may have been copied on both sides of it), so that slot changes and
    /// transactions are not held back for a whole copy.
    pub fn export_into<E>(
        &self,
        hold_gate: bool,
        between: &mut dyn FnMut(),
        write: &mut dyn FnMut(&[u8]) -> Result<(), E>,
    ) -> Result<Exported, E> {
        let gate = self.hold_transactions();
        let passes = self.gate.passes();
        let mut buf = Vec::new();
        self.export_header(&mut buf);
        write(&buf)?;
        let gate = hold_gate.then_some(gate);
        let mut pairs = 0;
        for shard in 0..self.map_shards() {
            if gate.is_none() && self.gate.passes() != passes {
                // Interrupted already: stop copying for nothing.
                return Ok(Exported::Interrupted);
            }
            buf.clear();
            pairs += self.export_shard_between(shard, &mut buf, between);
            write(&buf)?;
        }
        if gate.is_none() {
            let _gate = self.hold_transactions();
            if self.gate.passes() != passes {
                return Ok(Exported::Interrupted);
            }
        }
        Ok(Exported::Done(pairs))
    }

    /// The whole store as a snapshot's data, made under the transaction gate (tests).
    #[cfg(test)]
    pub(super) fn export_all(&self) -> Vec<u8> {
        let mut out = Vec::new();
        let written = self.export_into(true, &mut || {}, &mut |b| {
            out.extend_from_slice(b);
            Ok::<(), ()>(())
        });
        assert!(matches!(written, Ok(Exported::Done(_))));
        out
    }

    /// Starts an export: the slot table (see `slots`), then the number of map shards that
    /// follow. (Made under the transaction gate, as every export's start.)
    fn export_header(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&SLOT_TABLE_FOLLOWS.to_le_bytes());
        self.export_slots(out);
        out.extend_from_slice(&(self.map.shards.len() as u32).to_le_bytes());
    }

    /// Appends map shard `i` (its last log entry and its pairs) to `out`, in steps (see the
    /// module docs), calling `between` after each step with no lock held (a snapshot rests
    /// there; a test writes); returns how many pairs. (A shard past the end adds nothing.)
    fn export_shard_between(&self, i: usize, out: &mut Vec<u8>, between: &mut dyn FnMut()) -> u64 {
        let Some(shard) = self.map.shards.get(i) else { return 0 };
        let header_at = out.len();
        out.extend_from_slice(&[0; SHARD_HEADER]);
        let body_at = out.len();
        {
            let mut s = shard.write();
            if s.copying.is_some() {
                // Another export of this shard is under way: copy it whole instead.
                return finish_whole(&s, out, header_at, body_at);
            }
            s.copying = Some(Box::default());
        }
        let slots = shard.read().table.slot_count();
        let (mut at, mut resized, mut pairs) = (0, false, 0);
        while at < slots {
            let s = shard.read();
            if s.table.slot_count() != slots {
                resized = true;
                break;
            }
            pairs += copy_slots(&s, at..(at + STEP).min(slots), out);
            drop(s);
            at += STEP;
            between();
        }
        let mut s = shard.write();
        let noted = match s.copying.take() {
            Some(c) if !c.overflowed && !resized => c.keys,
            _ => return finish_whole(&s, out, header_at, body_at),
        };
        // (In key order, so a snapshot's bytes do not depend on a hash seed.)
        let mut written: Vec<&[u8]> = noted.iter().map(|k| &k[..]).collect();
        written.sort_unstable();
        written.dedup();
        let mut last = Vec::new();
        for key in &written {
            if let Some(e) = s.table.find(key_hash(key), key).and_then(|at| s.table.at(at)) {
                put_pair(&mut last, &s, e.key(), e.value());
                pairs += 1;
            }
        }
        let applied = s.applied;
        drop(s);
        pairs -= drop_pairs_of(out, body_at, &written.iter().copied().collect());
        out.extend_from_slice(&last);
        write_header(out, header_at, applied);
        pairs
    }
}

/// Copies the whole shard (locked) after `out[..body_at]`, over any stepped copy.
fn finish_whole(s: &Shard, out: &mut Vec<u8>, header_at: usize, body_at: usize) -> u64 {
    out.truncate(body_at);
    let pairs = copy_slots(s, 0..s.table.slot_count(), out);
    write_header(out, header_at, s.applied);
    pairs
}

/// Appends the pairs in table slots `slots` of `s`; returns how many.
fn copy_slots(s: &Shard, slots: std::ops::Range<usize>, out: &mut Vec<u8>) -> u64 {
    let mut pairs = 0;
    for i in slots {
        s.table.copy_hint(i);
        if let Some(e) = s.table.at(i) {
            put_pair(out, s, e.key(), e.value());
            pairs += 1;
        }
    }
    pairs
}

/// Appends one pair (see `dump` for the layout).
fn put_pair(out: &mut Vec<u8>, s: &Shard, key: &[u8], value: &[u8]) {
    let deadline = s.expires.get(key);
    let flag = if deadline.is_some() { HAS_DEADLINE } else { 0 };
    out.extend_from_slice(&(key.len() as u32).to_le_bytes());
    out.extend_from_slice(&(value.len() as u32 | flag).to_le_bytes());
    out.extend_from_slice(key);
    out.extend_from_slice(value);
    if let Some(at) = deadline {
        out.extend_from_slice(&at.to_le_bytes());
    }
}

/// The keys written in a shard during its copy, each once. (A hash set: a sorted list's
/// binary search for every pair of the shard was a sixth of a snapshot's time under YCSB-A.)
type Noted<'a> = std::collections::HashSet<&'a [u8], foldhash::fast::RandomState>;

/// Fills in the section's header at `header_at`: its entry and its pairs' bytes. (The
/// pairs are counted as they are written: walking them again cost a tenth of a snapshot.)
fn write_header(out: &mut [u8], header_at: usize, applied: u64) {
    let body_at = header_at + SHARD_HEADER;
    let len = (out.len() - body_at) as u64;
    out[header_at..header_at + 8].copy_from_slice(&applied.to_le_bytes());
    out[header_at + 8..body_at].copy_from_slice(&len.to_le_bytes());
}

/// Removes from `out[body_at..]` (pairs this module wrote) every pair whose key is in
/// `keys`, keeping the others in order; returns how many it removed.
fn drop_pairs_of(out: &mut Vec<u8>, body_at: usize, keys: &Noted<'_>) -> u64 {
    if keys.is_empty() {
        return 0;
    }
    let (mut kept, mut at, mut dropped) = (body_at, body_at, 0);
    while let Some((keep, len)) = pair_at(out, at).map(|(k, len)| (!keys.contains(k), len)) {
        match keep {
            true => {
                out.copy_within(at..at + len, kept);
                kept += len;
            }
            false => dropped += 1,
        }
        at += len;
    }
    out.truncate(kept);
    dropped
}

/// The key and the length in bytes of the pair at `bytes[at..]` (written by this module:
/// not for bytes from a file), if one is there.
fn pair_at(bytes: &[u8], at: usize) -> Option<(&[u8], usize)> {
    let (header, body) = bytes.get(at..)?.split_first_chunk::<8>()?;
    let key_len = u32::from_le_bytes([header[0], header[1], header[2], header[3]]) as usize;
    let value_len = u32::from_le_bytes([header[4], header[5], header[6], header[7]]);
    let deadline = if value_len & HAS_DEADLINE != 0 { 8 } else { 0 };
    let len = 8 + key_len + (value_len & !HAS_DEADLINE) as usize + deadline;
    (len <= bytes.len() - at).then(|| (&body[..key_len], len))
}
