//! The paged prefix cache of one simulated engine: [`PrefixCache`].
//!
//! KV memory is `capacity_pages` pages of `page_size` tokens. A *full* page of a prompt is keyed by
//! a chained hash ([`page_keys`]): the hash of the namespace, the previous page's key and the page's
//! tokens, so equal keys mean equal namespace and equal prefix up to that page (radix-tree
//! semantics without the tree). A page is either
//! - *cached and pinned* (referenced by at least one running request),
//! - *cached and evictable* (no references; kept in LRU order), or
//! - *reserved* (private to one request: partial pages, pages being prefilled, decode output).
//!
//! Eviction removes the least recently used evictable page; among pages last used at the same tick,
//! deeper pages go first, so a prefix's leaf pages leave before its root (a lookup touches every
//! page of the matched prefix, so a parent is never older than its child). Errors are not possible:
//! a reservation that does not fit returns `false` and changes nothing.

use std::cmp::Reverse;
use std::collections::{BTreeSet, HashMap};

use xxhash_rust::xxh3::xxh3_64_with_seed;

/// The chained keys of the full pages of `tokens` in `namespace`.
pub fn page_keys(namespace: u64, tokens: &[u32], page_size: usize) -> Vec<u64> {
    let page_size = page_size.max(1);
    let mut keys = Vec::with_capacity(tokens.len() / page_size);
    let mut previous = namespace;
    let mut bytes = Vec::with_capacity(page_size * 4);
    for page in tokens.chunks_exact(page_size) {
        bytes.clear();
        for token in page {
            bytes.extend_from_slice(&token.to_le_bytes());
        }
        previous = xxh3_64_with_seed(&bytes, previous);
        keys.push(previous);
    }
    keys
}

#[derive(Debug, Clone, Copy)]
struct Page {
    refs: u32,
    last_use_tick: u64,
    depth: u32,
}

type LruEntry = (u64, Reverse<u32>, u64);

/// Paged KV memory with a hash-chained prefix cache and LRU eviction.
#[derive(Debug)]
pub struct PrefixCache {
    capacity_pages: u64,
    reserved_pages: u64,
    pages: HashMap<u64, Page>,
    /// Evictable pages ordered by (last use, deeper first, key).
    evictable: BTreeSet<LruEntry>,
    tick: u64,
    evicted_pages_total: u64,
}

impl PrefixCache {
    /// An empty cache of `capacity_pages` pages.
    pub fn new(capacity_pages: u64) -> Self {
        PrefixCache {
            capacity_pages,
            reserved_pages: 0,
            pages: HashMap::new(),
            evictable: BTreeSet::new(),
            tick: 0,
            evicted_pages_total: 0,
        }
    }

    /// Total pages of KV memory.
    pub fn capacity_pages(&self) -> u64 {
        self.capacity_pages
    }

    /// Pages neither cached nor reserved.
    pub fn free_pages(&self) -> u64 {
        self.capacity_pages
            .saturating_sub(self.pages.len() as u64 + self.reserved_pages)
    }

    /// Pages a reservation could obtain now: free plus evictable.
    pub fn available_pages(&self) -> u64 {
        self.free_pages() + self.evictable.len() as u64
    }

    /// Cached pages referenced by at least one request.
    pub fn pinned_pages(&self) -> u64 {
        (self.pages.len() - self.evictable.len()) as u64
    }

    /// Cached pages, pinned or not.
    pub fn cached_pages(&self) -> u64 {
        self.pages.len() as u64
    }

    /// Pages reserved privately by requests.
    pub fn reserved_pages(&self) -> u64 {
        self.reserved_pages
    }

    /// Pages evicted since the start.
    pub fn evicted_pages_total(&self) -> u64 {
        self.evicted_pages_total
    }

    /// How many leading `keys` are cached (no side effects).
    pub fn matched_pages(&self, keys: &[u64]) -> usize {
        keys.iter()
            .take_while(|key| self.pages.contains_key(key))
            .count()
    }

    /// References the first `count` keys (all must be cached: use [`Self::matched_pages`] first)
    /// and marks them used now. Returns how many were pinned (stops at the first missing key).
    pub fn pin(&mut self, keys: &[u64], count: usize) -> usize {
        self.tick += 1;
        let tick = self.tick;
        let mut pinned = 0;
        for key in keys.iter().take(count) {
            let Some(page) = self.pages.get_mut(key) else {
                break;
            };
            if page.refs == 0 {
                self.evictable
                    .remove(&(page.last_use_tick, Reverse(page.depth), *key));
            }
            page.refs += 1;
            page.last_use_tick = tick;
            pinned += 1;
        }
        pinned
    }

    /// Drops one reference from each key; pages left unreferenced become evictable, used now.
    pub fn unpin(&mut self, keys: &[u64]) {
        self.tick += 1;
        let tick = self.tick;
        for key in keys {
            let Some(page) = self.pages.get_mut(key) else {
                continue;
            };
            page.refs = page.refs.saturating_sub(1);
            page.last_use_tick = tick;
            if page.refs == 0 {
                self.evictable.insert((tick, Reverse(page.depth), *key));
            }
        }
    }

    /// Reserves `count` private pages, evicting LRU pages if needed. `false` (and no change) when
    /// free plus evictable pages are fewer than `count`.
    pub fn reserve(&mut self, count: u64) -> bool {
        if self.available_pages() < count {
            return false;
        }
        while self.free_pages() < count {
            let Some(oldest) = self.evictable.pop_first() else {
                return false;
            };
            self.pages.remove(&oldest.2);
            self.evicted_pages_total += 1;
        }
        self.reserved_pages += count;
        true
    }

    /// Returns `count` private pages to the free pool.
    pub fn unreserve(&mut self, count: u64) {
        self.reserved_pages = self.reserved_pages.saturating_sub(count);
    }

    /// Turns one reserved page per key into a cached page pinned by the caller. `first_depth` is
    /// the page index of `keys[0]` in its prompt. A key already cached (another request computed
    /// the same page meanwhile) is pinned instead and its reserved page freed. Returns the keys
    /// now pinned by the caller (all of them).
    pub fn commit(&mut self, keys: &[u64], first_depth: u32) {
        self.tick += 1;
        let tick = self.tick;
        for (offset, key) in keys.iter().enumerate() {
            self.reserved_pages = self.reserved_pages.saturating_sub(1);
            match self.pages.get_mut(key) {
                Some(page) => {
                    if page.refs == 0 {
                        self.evictable
                            .remove(&(page.last_use_tick, Reverse(page.depth), *key));
                    }
                    page.refs += 1;
                    page.last_use_tick = tick;
                }
                None => {
                    let depth = first_depth.saturating_add(offset as u32);
                    self.pages.insert(
                        *key,
                        Page {
                            refs: 1,
                            last_use_tick: tick,
                            depth,
                        },
                    );
                }
            }
        }
    }

    /// Drops every unreferenced page (SGLang's `/flush_cache`).
    pub fn flush(&mut self) {
        for (_, _, key) in std::mem::take(&mut self.evictable) {
            self.pages.remove(&key);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tokens(range: std::ops::Range<u32>) -> Vec<u32> {
        range.collect()
    }

    /// Simulates one request: match, pin, reserve and commit its uncached full pages.
    fn load(cache: &mut PrefixCache, keys: &[u64]) -> usize {
        let hit = cache.matched_pages(keys);
        assert_eq!(cache.pin(keys, hit), hit);
        let new = (keys.len() - hit) as u64;
        assert!(cache.reserve(new));
        cache.commit(&keys[hit..], hit as u32);
        hit
    }

    #[test]
    fn only_whole_pages_get_keys_and_keys_chain_the_prefix() {
        let keys = page_keys(0, &tokens(0..40), 16);
        assert_eq!(keys.len(), 2);
        let other = page_keys(0, &[tokens(0..16), tokens(100..116)].concat(), 16);
        assert_eq!(keys[0], other[0]);
        assert_ne!(keys[1], other[1]);
        // Same second page after a different first page: different key (chained).
        let shifted = page_keys(0, &[tokens(50..66), tokens(16..32)].concat(), 16);
        assert_ne!(keys[1], shifted[1]);
        assert!(page_keys(0, &tokens(0..15), 16).is_empty());
    }

    #[test]
    fn a_repeated_prefix_hits_and_page_granularity_holds() {
        let mut cache = PrefixCache::new(100);
        let first = page_keys(0, &tokens(0..50), 16);
        assert_eq!(load(&mut cache, &first), 0);
        cache.unpin(&first);
        // Shares 40 tokens = 2 whole pages + 8 tokens: only the 2 pages hit.
        let second = page_keys(0, &[tokens(0..40), tokens(900..920)].concat(), 16);
        assert_eq!(cache.matched_pages(&second), 2);
    }

    #[test]
    fn namespaces_never_share_pages() {
        let mut cache = PrefixCache::new(100);
        let salted = page_keys(7, &tokens(0..64), 16);
        load(&mut cache, &salted);
        cache.unpin(&salted);
        assert_eq!(cache.matched_pages(&page_keys(0, &tokens(0..64), 16)), 0);
        assert_eq!(cache.matched_pages(&page_keys(8, &tokens(0..64), 16)), 0);
        assert_eq!(cache.matched_pages(&page_keys(7, &tokens(0..64), 16)), 4);
    }

    #[test]
    fn eviction_takes_least_recently_used_leaves_first() {
        let mut cache = PrefixCache::new(6);
        let a = page_keys(0, &tokens(0..32), 16);
        let b = page_keys(0, &tokens(1000..1032), 16);
        let c = page_keys(0, &tokens(2000..2032), 16);
        for keys in [&a, &b, &c] {
            load(&mut cache, keys);
            cache.unpin(keys);
        }
        // Touch `a` so `b` is now the least recently used.
        cache.pin(&a, 2);
        cache.unpin(&a);
        assert!(cache.reserve(1));
        assert_eq!(cache.matched_pages(&b), 1, "b's leaf page goes first");
        assert_eq!(cache.matched_pages(&a), 2);
        assert!(cache.reserve(1));
        assert_eq!(cache.matched_pages(&b), 0);
        assert_eq!(cache.matched_pages(&c), 2);
        assert_eq!(cache.evicted_pages_total(), 2);
    }

    #[test]
    fn pinned_pages_are_never_evicted() {
        let mut cache = PrefixCache::new(4);
        let a = page_keys(0, &tokens(0..64), 16);
        load(&mut cache, &a);
        assert_eq!(cache.pinned_pages(), 4);
        assert!(!cache.reserve(1), "all pages pinned");
        assert_eq!(cache.reserved_pages(), 0);
        cache.unpin(&a);
        assert!(cache.reserve(3));
        assert_eq!(
            cache.matched_pages(&a),
            1,
            "three leaf pages evicted, root kept"
        );
        cache.unreserve(3);
        assert_eq!(cache.free_pages(), 3);
    }

    #[test]
    fn a_shared_page_stays_pinned_until_its_last_user_leaves() {
        let mut cache = PrefixCache::new(8);
        let a = page_keys(0, &tokens(0..32), 16);
        load(&mut cache, &a);
        assert_eq!(load(&mut cache, &a), 2);
        cache.unpin(&a);
        assert_eq!(cache.pinned_pages(), 2);
        cache.unpin(&a);
        assert_eq!(cache.pinned_pages(), 0);
        assert_eq!(cache.available_pages(), 8);
    }

    #[test]
    fn committing_an_already_cached_page_frees_the_reservation() {
        let mut cache = PrefixCache::new(8);
        let a = page_keys(0, &tokens(0..32), 16);
        // Two requests reserve for the same pages before either commits.
        assert!(cache.reserve(2));
        assert!(cache.reserve(2));
        cache.commit(&a, 0);
        cache.commit(&a, 0);
        assert_eq!(cache.cached_pages(), 2);
        assert_eq!(cache.reserved_pages(), 0);
        assert_eq!(cache.free_pages(), 6);
        cache.flush();
        assert_eq!(cache.cached_pages(), 2, "pinned pages survive a flush");
        cache.unpin(&a);
        cache.unpin(&a);
        cache.flush();
        assert_eq!(cache.cached_pages(), 0);
    }
}
