//! [`WordCache`]: the IDs of pre-tokens merged before, per thread, so a word seen again is a
//! hash and a copy instead of its merges (the `tokenizers` crate keeps such a cache too).
//!
//! Merging is a function of a pre-token's bytes and the model, so a hit is exact: a slot holds
//! its word's bytes and its model's [`VocabId`], and both are compared in full (the hash only
//! picks the slot). Direct-mapped and of fixed size: a newer word takes its slot, nothing grows,
//! and nothing is allocated after a thread's first use. Only words that merge are kept (a
//! single byte or a whole token is cheaper than a lookup here), and only up to
//! [`WORD_BYTES_MAX`] bytes and [`WORD_IDS_MAX`] IDs: longer words are rare and merge in
//! proportion to their length anyway.

use std::cell::RefCell;
use std::sync::atomic::{AtomicU64, Ordering};

use xxhash_rust::xxh3::xxh3_64;

/// Bytes of the longest word kept: a CJK run of 21 characters, most identifiers.
pub const WORD_BYTES_MAX: usize = 64;

/// IDs of the longest encoding kept (a CJK character is a token or two).
pub const WORD_IDS_MAX: usize = 32;

/// Slots per thread (a power of two): 2,048 of 208 bytes, 416 KiB per thread that encodes.
const SLOTS: usize = 2048;

const _: () = assert!(SLOTS.is_power_of_two() && WORD_BYTES_MAX <= u8::MAX as usize);

/// Which model a slot's IDs belong to: unique per model loaded in this process (0: none).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct VocabId(u64);

impl VocabId {
    /// A new model's identity.
    pub fn fresh() -> VocabId {
        static NEXT: AtomicU64 = AtomicU64::new(1);
        VocabId(NEXT.fetch_add(1, Ordering::Relaxed))
    }
}

#[derive(Clone, Copy)]
struct Slot {
    vocab: u64,
    len: u8,
    count: u8,
    bytes: [u8; WORD_BYTES_MAX],
    ids: [u32; WORD_IDS_MAX],
}

// The memory the module documentation and `SLOTS` state.
const _: () = assert!(std::mem::size_of::<Slot>() == 208);

const EMPTY: Slot = Slot {
    vocab: 0,
    len: 0,
    count: 0,
    bytes: [0; WORD_BYTES_MAX],
    ids: [0; WORD_IDS_MAX],
};

/// One thread's cache (see the module documentation).
pub struct WordCache {
    slots: Box<[Slot]>,
}

thread_local! {
    static WORDS: RefCell<Option<WordCache>> = const { RefCell::new(None) };
}

impl WordCache {
    fn new() -> WordCache {
        WordCache {
            slots: vec![EMPTY; SLOTS].into_boxed_slice(),
        }
    }

    /// Runs `f` with this thread's cache (`None` while the thread is being torn down).
    pub fn with<R>(f: impl FnOnce(Option<&mut WordCache>) -> R) -> R {
        let mut f = Some(f);
        let ran = WORDS.try_with(|words| match words.try_borrow_mut() {
            Ok(mut words) => {
                let cache = words.get_or_insert_with(WordCache::new);
                (f.take().expect("called once"))(Some(cache))
            }
            Err(_) => (f.take().expect("called once"))(None),
        });
        match ran {
            Ok(r) => r,
            Err(_) => (f.take().expect("not called: no thread-local"))(None),
        }
    }

    fn index(word: &[u8]) -> usize {
        xxh3_64(word) as usize & (SLOTS - 1)
    }

    /// Appends the IDs of `word` under `vocab` to `out` if it is here.
    #[inline]
    pub fn get(&self, vocab: VocabId, word: &[u8], out: &mut Vec<u32>) -> bool {
        if word.len() > WORD_BYTES_MAX {
            return false;
        }
        let slot = &self.slots[Self::index(word)];
        let hit = slot.vocab == vocab.0 && &slot.bytes[..usize::from(slot.len)] == word;
        if hit {
            out.extend_from_slice(&slot.ids[..usize::from(slot.count)]);
        }
        hit
    }

    /// Keeps `ids` as the IDs of `word` under `vocab`, if both fit.
    #[inline]
    pub fn put(&mut self, vocab: VocabId, word: &[u8], ids: &[u32]) {
        if word.len() > WORD_BYTES_MAX || ids.len() > WORD_IDS_MAX {
            return;
        }
        let slot = &mut self.slots[Self::index(word)];
        slot.vocab = vocab.0;
        slot.len = word.len() as u8;
        slot.count = ids.len() as u8;
        slot.bytes[..word.len()].copy_from_slice(word);
        slot.ids[..ids.len()].copy_from_slice(ids);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_hit_needs_the_same_model_and_bytes_and_a_newer_word_replaces_its_slot() {
        let (a, b) = (VocabId::fresh(), VocabId::fresh());
        assert_ne!(a, b);
        let mut cache = WordCache::new();
        let mut out = Vec::new();
        assert!(!cache.get(a, b"hello", &mut out));
        cache.put(a, b"hello", &[1, 2]);
        assert!(cache.get(a, b"hello", &mut out));
        assert_eq!(out, [1, 2]);
        // Another model, or a prefix of the word, misses.
        assert!(!cache.get(b, b"hello", &mut out));
        assert!(!cache.get(a, b"hell", &mut out));
        assert_eq!(out, [1, 2]);
        // Too long to keep: never stored, never found.
        let long = [b'x'; WORD_BYTES_MAX + 1];
        cache.put(a, &long, &[7]);
        assert!(!cache.get(a, &long, &mut out));
        let many = [9u32; WORD_IDS_MAX + 1];
        cache.put(a, b"many", &many);
        assert!(!cache.get(a, b"many", &mut out));
        // Two words of one slot: the newer replaces the older.
        let index = WordCache::index(b"hello");
        let other = (0u32..)
            .map(|n| n.to_string().into_bytes())
            .find(|w| WordCache::index(w) == index)
            .expect("some word shares the slot");
        cache.put(a, &other, &[3]);
        assert!(!cache.get(a, b"hello", &mut out));
        assert!(cache.get(a, &other, &mut out));
        assert_eq!(out, [1, 2, 3]);
    }

    #[test]
    fn each_thread_has_its_own_cache() {
        let a = VocabId::fresh();
        WordCache::with(|cache| cache.expect("a cache").put(a, b"word", &[5]));
        let mut out = Vec::new();
        assert!(WordCache::with(|c| c
            .expect("a cache")
            .get(a, b"word", &mut out)));
        let elsewhere = std::thread::spawn(move || {
            let mut out = Vec::new();
            WordCache::with(|c| c.expect("a cache").get(a, b"word", &mut out))
        })
        .join()
        .expect("the thread ran");
        assert!(!elsewhere);
    }
}
