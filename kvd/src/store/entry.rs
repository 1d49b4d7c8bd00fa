//! One stored pair, and what it takes to keep it.

use std::sync::atomic::{AtomicU32, Ordering};

/// One stored pair: key and value share a single allocation.
pub(super) struct Entry {
    data: Box<[u8]>,
    key_len: u32,
    /// When the entry was last read or written, on the store's LRU clock (see `memory`).
    /// Atomic so that reads, under the shard's shared lock, can touch it.
    touched: AtomicU32,
}

impl Entry {
    /// A new entry, or `None` when there is no memory for it (refused, not an abort).
    pub(super) fn new(key: &[u8], value: &[u8], now: u32) -> Option<Entry> {
        let mut data = Vec::new();
        data.try_reserve_exact(key.len() + value.len()).ok()?;
        data.extend_from_slice(key);
        data.extend_from_slice(value);
        Some(Entry {
            data: data.into_boxed_slice(),
            key_len: key.len() as u32,
            touched: AtomicU32::new(now),
        })
    }

    pub(super) fn key(&self) -> &[u8] {
        self.data.get(..self.key_len as usize).unwrap_or_default()
    }

    pub(super) fn value(&self) -> &[u8] {
        self.data.get(self.key_len as usize..).unwrap_or_default()
    }

    /// Replaces the value, in place when the length is unchanged (the common YCSB update).
    /// Returns false, leaving the old value, when there is no memory for the new one.
    pub(super) fn set_value(&mut self, value: &[u8], now: u32) -> bool {
        let k = self.key_len as usize;
        self.touch(now);
        if self.data.len() - k == value.len() {
            self.data[k..].copy_from_slice(value);
            return true;
        }
        match Entry::new(&self.data[..k], value, now) {
            Some(e) => {
                *self = e;
                true
            }
            None => false,
        }
    }

    /// Bytes the key and value take.
    pub(super) fn len(&self) -> usize {
        self.data.len()
    }

    /// Marks the entry used at `now`. Written only when the clock moved, so a hot key read
    /// from several cores does not bounce its cache line on every read.
    #[inline]
    pub(super) fn touch(&self, now: u32) {
        if self.touched.load(Ordering::Relaxed) != now {
            self.touched.store(now, Ordering::Relaxed);
        }
    }

    /// When the entry was last used.
    pub(super) fn touched(&self) -> u32 {
        self.touched.load(Ordering::Relaxed)
    }
}
