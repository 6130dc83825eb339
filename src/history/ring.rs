//! The generic fixed-size stores: a ring of the newest values and a wheel indexed by the
//! second, each allocated once.

use std::ops::{Range, RangeInclusive};

/// A fixed-capacity ring, oldest first; allocated once.
pub(super) struct Ring<T> {
    pub(super) buf: Vec<T>,
    cap: usize,
    /// Index of the oldest element once the ring is full.
    head: usize,
}

impl<T: Copy> Ring<T> {
    pub(super) fn new(cap: usize) -> Ring<T> {
        Ring {
            buf: Vec::with_capacity(cap),
            cap,
            head: 0,
        }
    }

    pub(super) fn push(&mut self, v: T) {
        if self.buf.len() < self.cap {
            self.buf.push(v);
        } else {
            self.buf[self.head] = v;
            self.head = (self.head + 1) % self.cap;
        }
    }

    pub(super) fn last_mut(&mut self) -> Option<&mut T> {
        if self.buf.is_empty() {
            return None;
        }
        let i = (self.head + self.buf.len() - 1) % self.buf.len();
        self.buf.get_mut(i)
    }

    pub(super) fn iter(&self) -> impl DoubleEndedIterator<Item = &T> {
        let (a, b) = self.buf.split_at(self.head);
        b.iter().chain(a.iter())
    }

    pub(super) fn bytes(&self) -> usize {
        self.buf.capacity() * std::mem::size_of::<T>()
    }
}

/// A slot per key (a Unix second, or a step) for the last `slots.len()` keys up to the
/// newest one written, key `k` at `k % len`; allocated once. Moving to a newer key
/// empties the slots of the keys passed, whose slots held keys that fell out.
pub(super) struct Wheel<T> {
    pub(super) slots: Vec<T>,
    /// The newest key written.
    head: Option<u32>,
}

impl<T: Copy + Default> Wheel<T> {
    pub(super) fn new(n: usize) -> Wheel<T> {
        Wheel {
            slots: vec![T::default(); n],
            head: None,
        }
    }

    pub(super) fn len(&self) -> u32 {
        self.slots.len() as u32
    }

    /// Writes key `k`, which is not older than the newest.
    pub(super) fn set(&mut self, k: u32, v: T) {
        let n = self.len();
        if let Some(h) = self.head.filter(|&h| k > h) {
            for key in passed(h, k, n) {
                self.slots[(key % n) as usize] = T::default();
            }
        }
        self.head = Some(self.head.map_or(k, |h| h.max(k)));
        self.slots[(k % n) as usize] = v;
    }

    /// The keys at or after `from` the wheel still holds, oldest first, with their slots.
    pub(super) fn since(&self, from: u32) -> impl Iterator<Item = (u32, T)> + '_ {
        let keys = match self.head {
            Some(h) => held(h, from, self.len()),
            None => 0..0,
        };
        keys.clone()
            .zip(slots_from(keys.start, keys.len(), self.slots.len()))
            .map(|(k, i)| (k, self.slots[i]))
    }

    pub(super) fn bytes(&self) -> usize {
        self.slots.capacity() * std::mem::size_of::<T>()
    }
}

/// The keys a ring of `len` slots whose newest key is `h` clears to take `k`, newer
/// than `h`: those after `h`, the last `len` at most.
pub(super) fn passed(h: u32, k: u32, len: u32) -> RangeInclusive<u32> {
    (h + 1).max(k.saturating_sub(len - 1))..=k
}

/// The keys at or after `from` that a ring of `len` slots whose newest key is `h` still
/// holds.
pub(super) fn held(h: u32, from: u32, len: u32) -> Range<u32> {
    from.max((h + 1).saturating_sub(len))..h + 1
}

/// The slot indices of `n` keys from `key` in a wheel of `len` slots, without a
/// division per key.
pub(super) fn slots_from(key: u32, n: usize, len: usize) -> impl Iterator<Item = usize> {
    let start = key as usize % len;
    (start..start + n).map(move |i| if i >= len { i - len } else { i })
}
