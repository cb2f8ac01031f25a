//! [`TokenCache`]: one data core's tokenization cache, SMG's two levels (`--tokenizer-cache-*`).
//!
//! - L1, the segment cache: the IDs of each text piece between added tokens (a system prompt,
//!   an earlier turn, the tool definitions), keyed by a hash of the piece's bytes under the
//!   model's seed, bounded by bytes (`--tokenizer-cache-l1-max-memory`, split over the data
//!   cores).
//! - L0, whole prompts: the IDs of a rendered prompt, keyed by its hash, bounded by entries
//!   (`--tokenizer-cache-l0-max-entries`, split over the data cores) and by the size of one
//!   entry ([`L0_ENTRY_TOKENS_MAX`]); the only cache of a model whose prompts cannot be split.
//!
//! Both evict by CLOCK (second chance): a hit marks its entry, eviction walks the entries in
//! insertion order, spares a marked one once and drops the first unmarked one. One per core, never
//! shared: no lock, no atomic. Keys are 64-bit hashes, as the token tree's pages are: two pieces
//! with equal hashes would share IDs (about 2^-64 per pair), which changes a routing guess,
//! never what an engine computes.

use std::collections::{HashMap, VecDeque};
use std::hash::{BuildHasherDefault, Hasher};

use crate::limits::TOKENIZER_L0_ENTRY_TOKENS_MAX;

/// The most tokens one L0 entry keeps: longer prompts are cached by segments only.
pub const L0_ENTRY_TOKENS_MAX: usize = TOKENIZER_L0_ENTRY_TOKENS_MAX;

/// Bytes one entry costs besides its IDs: the map's slot (key, boxed slice, mark), the
/// eviction queue's key and the allocation's rounding, counted against the bound.
pub const ENTRY_OVERHEAD_BYTES: usize = 64;

/// The cache settings of one data core.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CacheConfig {
    /// Whole-prompt entries this core keeps (0: L0 off).
    pub l0_entries_max: usize,
    /// Bytes of segment entries this core keeps (0: L1 off).
    pub l1_bytes_max: usize,
}

/// Hits and misses of one core's cache, by level.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CacheStats {
    /// Whole prompts found.
    pub l0_hits: u64,
    /// Whole prompts looked up and not found.
    pub l0_misses: u64,
    /// Segments found.
    pub l1_hits: u64,
    /// Segments looked up and not found.
    pub l1_misses: u64,
}

/// One core's tokenization cache. See the module documentation.
#[derive(Debug, Default)]
pub struct TokenCache {
    l0: ClockMap,
    l1: ClockMap,
    stats: CacheStats,
}

impl TokenCache {
    /// An empty cache with `config`'s bounds.
    pub fn new(config: CacheConfig) -> TokenCache {
        TokenCache {
            l0: ClockMap::new(usize::MAX, config.l0_entries_max),
            l1: ClockMap::new(config.l1_bytes_max, usize::MAX),
            stats: CacheStats::default(),
        }
    }

    /// Whether whole prompts are cached.
    pub fn l0_enabled(&self) -> bool {
        self.l0.entries_max > 0
    }

    /// Whether segments are cached.
    pub fn l1_enabled(&self) -> bool {
        self.l1.bytes_max > 0
    }

    /// The IDs of the whole prompt hashed `key`, if cached.
    pub fn get_prompt(&mut self, key: u64) -> Option<&[u32]> {
        if !self.l0_enabled() {
            return None;
        }
        let found = self.l0.get(key);
        match found {
            Some(_) => self.stats.l0_hits += 1,
            None => self.stats.l0_misses += 1,
        }
        found
    }

    /// Caches the IDs of the whole prompt hashed `key` (prompts over [`L0_ENTRY_TOKENS_MAX`]
    /// tokens are not kept).
    pub fn put_prompt(&mut self, key: u64, ids: &[u32]) {
        if self.l0_enabled() && ids.len() <= L0_ENTRY_TOKENS_MAX {
            self.l0.insert(key, ids);
        }
    }

    /// The IDs of the segment hashed `key`, if cached.
    pub fn get_segment(&mut self, key: u64) -> Option<&[u32]> {
        if !self.l1_enabled() {
            return None;
        }
        let found = self.l1.get(key);
        match found {
            Some(_) => self.stats.l1_hits += 1,
            None => self.stats.l1_misses += 1,
        }
        found
    }

    /// Caches the IDs of the segment hashed `key`.
    pub fn put_segment(&mut self, key: u64, ids: &[u32]) {
        if self.l1_enabled() {
            self.l1.insert(key, ids);
        }
    }

    /// Hits and misses so far.
    pub fn stats(&self) -> CacheStats {
        self.stats
    }

    /// Whole-prompt entries held.
    pub fn l0_entries(&self) -> usize {
        self.l0.map.len()
    }

    /// Bytes the segment entries count against their bound (IDs plus
    /// [`ENTRY_OVERHEAD_BYTES`] each).
    pub fn l1_bytes(&self) -> usize {
        self.l1.bytes
    }

    /// Segment entries held.
    pub fn l1_entries(&self) -> usize {
        self.l1.map.len()
    }
}

/// A map from already-hashed keys: the key is its own hash (this cache's, and the BPE
/// encoder's vocabulary and merge maps).
#[derive(Default)]
pub(super) struct KeyIsHash(u64);

impl Hasher for KeyIsHash {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        // Only u64 keys are hashed; fold anything else in so the hasher stays total.
        for &b in bytes {
            self.0 = self.0.rotate_left(8) ^ u64::from(b);
        }
    }

    fn write_u64(&mut self, key: u64) {
        self.0 = key;
    }
}

#[derive(Debug)]
struct Entry {
    ids: Box<[u32]>,
    /// Read since eviction last passed it.
    marked: bool,
}

/// A CLOCK-evicted map bounded by bytes and by entries.
#[derive(Debug, Default)]
struct ClockMap {
    map: HashMap<u64, Entry, BuildHasherDefault<KeyIsHash>>,
    /// Keys in insertion order (the clock's hand is its front).
    order: VecDeque<u64>,
    bytes: usize,
    bytes_max: usize,
    entries_max: usize,
}

impl ClockMap {
    fn new(bytes_max: usize, entries_max: usize) -> ClockMap {
        ClockMap {
            bytes_max,
            entries_max,
            ..ClockMap::default()
        }
    }

    fn get(&mut self, key: u64) -> Option<&[u32]> {
        let entry = self.map.get_mut(&key)?;
        entry.marked = true;
        Some(&entry.ids)
    }

    fn insert(&mut self, key: u64, ids: &[u32]) {
        let cost = entry_bytes(ids.len());
        if cost > self.bytes_max || self.entries_max == 0 || self.map.contains_key(&key) {
            return;
        }
        // Each marked entry is spared once, so two rounds of the clock always free room.
        let mut steps = 2 * self.order.len();
        while (self.bytes + cost > self.bytes_max || self.map.len() >= self.entries_max)
            && steps > 0
        {
            steps -= 1;
            let Some(oldest) = self.order.pop_front() else {
                break;
            };
            let Some(entry) = self.map.get_mut(&oldest) else {
                continue;
            };
            if entry.marked {
                entry.marked = false;
                self.order.push_back(oldest);
            } else if let Some(entry) = self.map.remove(&oldest) {
                self.bytes -= entry_bytes(entry.ids.len());
            }
        }
        if self.bytes + cost > self.bytes_max || self.map.len() >= self.entries_max {
            return;
        }
        self.map.insert(
            key,
            Entry {
                ids: ids.into(),
                marked: false,
            },
        );
        self.order.push_back(key);
        self.bytes += cost;
    }
}

fn entry_bytes(ids: usize) -> usize {
    ids * std::mem::size_of::<u32>() + ENTRY_OVERHEAD_BYTES
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn segments_stay_within_their_byte_bound_and_hits_survive_eviction() {
        let bound = 10 * entry_bytes(100);
        let mut cache = TokenCache::new(CacheConfig {
            l0_entries_max: 0,
            l1_bytes_max: bound,
        });
        let ids = vec![7u32; 100];
        cache.put_segment(0, &ids);
        for key in 1..50u64 {
            // Key 0 is read before every insert: CLOCK keeps it.
            assert!(
                cache.get_segment(0).is_some(),
                "key 0 evicted at insert {key}"
            );
            cache.put_segment(key, &ids);
            assert!(cache.l1_bytes() <= bound);
        }
        assert_eq!(cache.l1_entries(), 10);
        assert!(
            cache.get_segment(1).is_none(),
            "an unread old entry was evicted"
        );
        assert!(cache.get_segment(49).is_some());
        let stats = cache.stats();
        assert_eq!(stats.l1_hits, 50);
        assert_eq!(stats.l1_misses, 1);
    }

    #[test]
    fn whole_prompts_are_bounded_by_entries_and_size() {
        let mut cache = TokenCache::new(CacheConfig {
            l0_entries_max: 2,
            l1_bytes_max: 0,
        });
        cache.put_prompt(1, &[1]);
        cache.put_prompt(2, &[2]);
        cache.put_prompt(3, &[3]);
        assert_eq!(cache.l0_entries(), 2);
        assert_eq!(cache.get_prompt(3), Some(&[3u32][..]));
        cache.put_prompt(4, &vec![0; L0_ENTRY_TOKENS_MAX + 1]);
        assert!(cache.get_prompt(4).is_none());
        // L1 off: nothing is kept or counted.
        cache.put_segment(9, &[9]);
        assert!(cache.get_segment(9).is_none());
        assert_eq!(cache.stats().l1_misses, 0);
    }
}
