//! [`SlotTable`]: the open-addressing table under the hash index and the KV-event index. A slot
//! is `W` atomic words, the first its key (0: empty); slots tile cache lines. Readers find a key
//! lock-free; one writer inserts and removes.
//!
//! - Linear probing from the key's home (multiply-shift, so any size works), at most
//!   `PLACEMENT_PROBE_MAX` slots.
//! - Readers ([`SlotTable::read`]) load the key with `Acquire`, the other words, then the key
//!   again after a fence: a slot emptied or reused for another key meanwhile reads as a miss.
//! - The writer stores a new entry's words before its key (`Release`), so a reader that sees the
//!   key sees them; deleting ([`SlotTable::remove`]) shifts the rest of the probe run back (no
//!   tombstones), telling the caller which entry moved where so it can move what it keeps per
//!   slot. A lookup racing a shift may miss the moving key: a miss, never another key's words.

use std::sync::atomic::{fence, AtomicU64, Ordering};

use super::raw::{prefetch, zeroed_lines, AtomicLine};
use crate::limits::PLACEMENT_PROBE_MAX;

/// Words of one cache line.
const LINE_WORDS: usize = 8;

/// Where a key's probe run led the writer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Probe {
    /// The key's slot.
    Found(usize),
    /// The first empty slot of the run: where the key would go.
    Vacant(usize),
    /// Neither within `PLACEMENT_PROBE_MAX` slots.
    RunFull,
}

/// Slots of `W` atomic words (the first the key), tiling cache lines.
pub struct SlotTable<const W: usize> {
    lines: Box<[AtomicLine]>,
    slots: usize,
}

impl<const W: usize> std::fmt::Debug for SlotTable<W> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SlotTable")
            .field("slots", &self.slots)
            .field("words", &W)
            .finish()
    }
}

impl<const W: usize> SlotTable<W> {
    const PER_LINE: usize = LINE_WORDS / W;
    const TILES: () = assert!(
        W >= 1 && W <= LINE_WORDS && LINE_WORDS.is_multiple_of(W),
        "slots tile a cache line"
    );

    /// A zeroed table of at least `slots` slots (its pages committed as first written).
    pub fn new(slots: usize) -> Self {
        let () = Self::TILES;
        let lines = slots.div_ceil(Self::PER_LINE).max(1);
        SlotTable {
            lines: zeroed_lines(lines),
            slots: lines * Self::PER_LINE,
        }
    }

    /// How many slots the table has.
    pub fn len(&self) -> usize {
        self.slots
    }

    /// Bytes of the table.
    pub fn memory_bytes(&self) -> usize {
        self.lines.len() * std::mem::size_of::<AtomicLine>()
    }

    /// The words of `slot`: the key, then the entry's words.
    pub fn words(&self, slot: usize) -> &[AtomicU64] {
        let start = slot % Self::PER_LINE * W;
        &self.lines[slot / Self::PER_LINE].0[start..start + W]
    }

    /// The slot a key's probe run starts at.
    pub fn home(&self, key: u64) -> usize {
        ((u128::from(key) * self.slots as u128) >> 64) as usize
    }

    fn next(&self, slot: usize) -> usize {
        if slot + 1 == self.slots {
            0
        } else {
            slot + 1
        }
    }

    /// How far `slot` lies past `home` along the (cyclic) probe run.
    fn distance(&self, home: usize, slot: usize) -> usize {
        (slot + self.slots - home) % self.slots
    }

    /// Reader: starts bringing `key`'s home line into cache (for a [`SlotTable::read`] soon).
    pub fn prefetch(&self, key: u64) {
        prefetch(&self.lines[self.home(key) / Self::PER_LINE]);
    }

    /// Reader: the words of `key`'s slot (the key first), if found and its own while read.
    pub fn read(&self, key: u64) -> Option<[u64; W]> {
        let mut slot = self.home(key);
        for _ in 0..PLACEMENT_PROBE_MAX {
            let words = self.words(slot);
            match words[0].load(Ordering::Acquire) {
                0 => return None,
                k if k == key => {
                    let mut read = [0u64; W];
                    for (out, word) in read.iter_mut().zip(words) {
                        *out = word.load(Ordering::Relaxed);
                    }
                    // The words were read before the key is read again: a slot the writer
                    // emptied or gave to another key meanwhile reads as a miss.
                    fence(Ordering::Acquire);
                    return (words[0].load(Ordering::Relaxed) == key).then_some(read);
                }
                _ => slot = self.next(slot),
            }
        }
        None
    }

    /// Writer: where `key` is, or where it would go.
    pub fn probe(&self, key: u64) -> Probe {
        let mut slot = self.home(key);
        for _ in 0..PLACEMENT_PROBE_MAX {
            match self.words(slot)[0].load(Ordering::Relaxed) {
                0 => return Probe::Vacant(slot),
                k if k == key => return Probe::Found(slot),
                _ => slot = self.next(slot),
            }
        }
        Probe::RunFull
    }

    /// Writer: fills the vacant `slot` with `key` and the entry's other words (`entry`, `W - 1`
    /// of them; stored before the key).
    pub fn insert(&self, slot: usize, key: u64, entry: &[u64]) {
        let target = self.words(slot);
        for (dst, value) in target[1..].iter().zip(entry) {
            dst.store(*value, Ordering::Relaxed);
        }
        target[0].store(key, Ordering::Release);
    }

    /// Writer: empties `slot` and shifts the rest of its probe run back; `moved(from, to)` is
    /// told of every entry that moved.
    pub fn remove(&self, slot: usize, mut moved: impl FnMut(usize, usize)) {
        let mut hole = slot;
        self.words(hole)[0].store(0, Ordering::Release);
        let mut next = self.next(hole);
        for _ in 0..self.slots {
            let key = self.words(next)[0].load(Ordering::Relaxed);
            if key == 0 {
                break;
            }
            // An entry may move back into the hole only if the hole lies on its probe run
            // (between its home and where it sits, cyclically).
            if self.distance(self.home(key), hole) < self.distance(self.home(key), next) {
                self.move_entry(next, hole);
                moved(next, hole);
                hole = next;
            }
            next = self.next(next);
        }
        for word in &self.words(hole)[1..] {
            word.store(0, Ordering::Relaxed);
        }
    }

    /// Copies the entry in `from` to the empty `to` (words, then key), then empties `from`.
    fn move_entry(&self, from: usize, to: usize) {
        let (source, target) = (self.words(from), self.words(to));
        for (dst, src) in target[1..].iter().zip(&source[1..]) {
            dst.store(src.load(Ordering::Relaxed), Ordering::Relaxed);
        }
        target[0].store(source[0].load(Ordering::Relaxed), Ordering::Release);
        source[0].store(0, Ordering::Release);
    }
}
