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
//!
//! With [`PrefixCache::record_events`] on, the cache also logs what happened to its cached pages
//! as [`CacheEvent`]s (stored runs, removals, a clear), in order, for the engine to publish as KV
//! events (`sim::kv_events`); [`PrefixCache::take_events`] drains the log.

use std::cmp::Reverse;
use std::collections::{BTreeSet, HashMap};
use std::ops::Range;

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

/// A change to the set of cached pages, as a KV-event publisher reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CacheEvent {
    /// Consecutive pages of one sequence's chain entered the cache.
    Stored {
        /// The pages' keys, in chain order.
        keys: Vec<u64>,
        /// The key of the page before `keys[0]`; `None` when it is the sequence's first page.
        parent_key: Option<u64>,
        /// The pages' tokens: `keys.len()` pages of `page_size` tokens.
        tokens: Vec<u32>,
    },
    /// Pages left the cache, in the order they were dropped.
    Removed { keys: Vec<u64> },
    /// Every page left the cache.
    Cleared,
}

/// Full pages of one sequence to cache ([`PrefixCache::commit`]).
#[derive(Debug, Clone, Copy)]
pub struct PageRun<'a> {
    /// The pages' keys, in chain order.
    pub keys: &'a [u64],
    /// The page index of `keys[0]` in its sequence.
    pub first_depth: u32,
    /// The key of the page before `keys[0]`; `None` when it is the sequence's first page.
    pub parent_key: Option<u64>,
    /// The pages' tokens, `page_size` per key (only read when events are recorded).
    pub tokens: &'a [u32],
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
    /// The event log, when recording (`None`: no KV events, nothing kept).
    events: Option<Vec<CacheEvent>>,
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
            events: None,
        }
    }

    /// Starts logging [`CacheEvent`]s (for an engine that publishes KV events).
    pub fn record_events(&mut self) {
        self.events.get_or_insert_with(Vec::new);
    }

    /// The events logged since the last call, oldest first (empty when not recording).
    pub fn take_events(&mut self) -> Vec<CacheEvent> {
        match &mut self.events {
            Some(events) => std::mem::take(events),
            None => Vec::new(),
        }
    }

    /// Every cached page's key, pinned or not, ascending.
    pub fn cached_keys(&self) -> Vec<u64> {
        let mut keys: Vec<u64> = self.pages.keys().copied().collect();
        keys.sort_unstable();
        keys
    }

    fn log(&mut self, event: CacheEvent) {
        if let Some(events) = &mut self.events {
            events.push(event);
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
        let mut evicted = Vec::new();
        while self.free_pages() < count {
            let Some(oldest) = self.evictable.pop_first() else {
                // Unreachable: `available_pages` counted enough evictable pages above.
                if !evicted.is_empty() {
                    self.log(CacheEvent::Removed { keys: evicted });
                }
                return false;
            };
            self.pages.remove(&oldest.2);
            self.evicted_pages_total += 1;
            if self.events.is_some() {
                evicted.push(oldest.2);
            }
        }
        if !evicted.is_empty() {
            self.log(CacheEvent::Removed { keys: evicted });
        }
        self.reserved_pages += count;
        true
    }

    /// Returns `count` private pages to the free pool.
    pub fn unreserve(&mut self, count: u64) {
        self.reserved_pages = self.reserved_pages.saturating_sub(count);
    }

    /// Turns one reserved page per key of `run` into a cached page pinned by the caller. A key
    /// already cached (another request computed the same page meanwhile) is pinned instead and
    /// its reserved page freed. When recording, each stretch of newly cached pages is logged as
    /// one [`CacheEvent::Stored`], its parent the page before it.
    pub fn commit(&mut self, run: PageRun<'_>) {
        self.tick += 1;
        let tick = self.tick;
        // The stretch of newly cached pages being built: (offset of its first page, its parent).
        let mut stretch: Option<(usize, Option<u64>)> = None;
        for (offset, key) in run.keys.iter().enumerate() {
            self.reserved_pages = self.reserved_pages.saturating_sub(1);
            match self.pages.get_mut(key) {
                Some(page) => {
                    if page.refs == 0 {
                        self.evictable
                            .remove(&(page.last_use_tick, Reverse(page.depth), *key));
                    }
                    page.refs += 1;
                    page.last_use_tick = tick;
                    if let Some((first, parent_key)) = stretch.take() {
                        self.log_stored(&run, first..offset, parent_key);
                    }
                }
                None => {
                    let depth = run.first_depth.saturating_add(offset as u32);
                    self.pages.insert(
                        *key,
                        Page {
                            refs: 1,
                            last_use_tick: tick,
                            depth,
                        },
                    );
                    if stretch.is_none() {
                        let parent_key = match offset {
                            0 => run.parent_key,
                            _ => Some(run.keys[offset - 1]),
                        };
                        stretch = Some((offset, parent_key));
                    }
                }
            }
        }
        if let Some((first, parent_key)) = stretch {
            self.log_stored(&run, first..run.keys.len(), parent_key);
        }
    }

    /// Logs pages `pages` of `run` as one stored stretch.
    fn log_stored(&mut self, run: &PageRun<'_>, pages: Range<usize>, parent_key: Option<u64>) {
        if self.events.is_none() || run.keys.is_empty() {
            return;
        }
        let page_size = run.tokens.len() / run.keys.len();
        debug_assert_eq!(page_size * run.keys.len(), run.tokens.len(), "whole pages");
        let tokens = run
            .tokens
            .get(pages.start * page_size..pages.end * page_size)
            .unwrap_or_default()
            .to_vec();
        self.log(CacheEvent::Stored {
            keys: run.keys[pages].to_vec(),
            parent_key,
            tokens,
        });
    }

    /// Drops every unreferenced page (SGLang's `/flush_cache`). Logged as [`CacheEvent::Cleared`]
    /// when the cache is left empty; pages pinned by running requests stay, so then the dropped
    /// pages are logged as removed instead (a clear would tell subscribers the pinned ones left
    /// too).
    pub fn flush(&mut self) {
        let mut dropped = Vec::new();
        for (_, _, key) in std::mem::take(&mut self.evictable) {
            self.pages.remove(&key);
            if self.events.is_some() {
                dropped.push(key);
            }
        }
        if self.pages.is_empty() {
            self.log(CacheEvent::Cleared);
        } else if !dropped.is_empty() {
            self.log(CacheEvent::Removed { keys: dropped });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tokens(range: std::ops::Range<u32>) -> Vec<u32> {
        range.collect()
    }

    /// A run of `keys` from page `first_depth` on, without tokens (read only when recording).
    fn run(keys: &[u64], first_depth: u32) -> PageRun<'_> {
        PageRun {
            keys,
            first_depth,
            parent_key: None,
            tokens: &[],
        }
    }

    /// Simulates one request: match, pin, reserve and commit its uncached full pages.
    fn load(cache: &mut PrefixCache, keys: &[u64]) -> usize {
        let hit = cache.matched_pages(keys);
        assert_eq!(cache.pin(keys, hit), hit);
        let new = (keys.len() - hit) as u64;
        assert!(cache.reserve(new));
        cache.commit(run(&keys[hit..], hit as u32));
        hit
    }

    /// [`load`] of a prompt `tokens` with its tokens and parent, as the engine commits it.
    fn load_tokens(cache: &mut PrefixCache, tokens: &[u32]) -> Vec<u64> {
        let keys = page_keys(0, tokens, 16);
        let hit = cache.matched_pages(&keys);
        cache.pin(&keys, hit);
        assert!(cache.reserve((keys.len() - hit) as u64));
        cache.commit(PageRun {
            keys: &keys[hit..],
            first_depth: hit as u32,
            parent_key: hit.checked_sub(1).map(|parent| keys[parent]),
            tokens: &tokens[hit * 16..keys.len() * 16],
        });
        keys
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
        cache.commit(run(&a, 0));
        cache.commit(run(&a, 0));
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

    #[test]
    fn stored_events_carry_the_new_pages_their_parent_and_tokens() {
        let mut cache = PrefixCache::new(100);
        cache.record_events();
        let prompt = tokens(0..50);
        let first = load_tokens(&mut cache, &prompt);
        cache.unpin(&first);
        assert_eq!(
            cache.take_events(),
            vec![CacheEvent::Stored {
                keys: first.clone(),
                parent_key: None,
                tokens: tokens(0..48),
            }]
        );
        // Shares the first two pages, then adds two: one stretch whose parent is page 1.
        let longer = [tokens(0..32), tokens(500..532)].concat();
        let second = load_tokens(&mut cache, &longer);
        assert_eq!(second[..2], first[..2]);
        assert_eq!(
            cache.take_events(),
            vec![CacheEvent::Stored {
                keys: second[2..].to_vec(),
                parent_key: Some(first[1]),
                tokens: tokens(500..532),
            }]
        );
        assert!(cache.take_events().is_empty(), "the log is drained");
    }

    #[test]
    fn a_page_cached_meanwhile_splits_the_stored_stretch() {
        let mut cache = PrefixCache::new(100);
        cache.record_events();
        let prompt = tokens(0..64);
        let keys = page_keys(0, &prompt, 16);
        // Another request cached page 1 while this one prefilled pages 0..4.
        assert!(cache.reserve(1));
        cache.commit(PageRun {
            keys: &keys[1..2],
            first_depth: 1,
            parent_key: Some(keys[0]),
            tokens: &prompt[16..32],
        });
        cache.take_events();
        assert!(cache.reserve(4));
        cache.commit(PageRun {
            keys: &keys,
            first_depth: 0,
            parent_key: None,
            tokens: &prompt,
        });
        assert_eq!(
            cache.take_events(),
            vec![
                CacheEvent::Stored {
                    keys: keys[..1].to_vec(),
                    parent_key: None,
                    tokens: tokens(0..16),
                },
                CacheEvent::Stored {
                    keys: keys[2..].to_vec(),
                    parent_key: Some(keys[1]),
                    tokens: tokens(32..64),
                },
            ]
        );
        assert_eq!(cache.cached_keys().len(), 4);
    }

    #[test]
    fn evictions_and_flushes_are_logged() {
        let mut cache = PrefixCache::new(4);
        cache.record_events();
        let a = load_tokens(&mut cache, &tokens(0..32));
        cache.unpin(&a);
        let b = load_tokens(&mut cache, &tokens(100..132));
        cache.take_events();
        // Two more pages: `a`'s two pages go, leaf first.
        assert!(cache.reserve(2));
        assert_eq!(
            cache.take_events(),
            vec![CacheEvent::Removed {
                keys: vec![a[1], a[0]]
            }]
        );
        cache.unreserve(2);
        // `b` is pinned: a flush cannot clear the cache.
        cache.flush();
        assert!(cache.take_events().is_empty(), "nothing was unreferenced");
        cache.unpin(&b);
        cache.flush();
        assert_eq!(cache.take_events(), vec![CacheEvent::Cleared]);
        assert_eq!(cache.cached_keys(), Vec::<u64>::new());
    }

    #[test]
    fn a_flush_beside_pinned_pages_logs_removals() {
        let mut cache = PrefixCache::new(8);
        cache.record_events();
        let a = load_tokens(&mut cache, &tokens(0..32));
        let b = load_tokens(&mut cache, &tokens(100..132));
        cache.unpin(&a);
        cache.take_events();
        cache.flush();
        assert_eq!(
            cache.take_events(),
            vec![CacheEvent::Removed {
                keys: vec![a[1], a[0]]
            }]
        );
        let mut pinned = b.clone();
        pinned.sort_unstable();
        assert_eq!(cache.cached_keys(), pinned);
    }

    #[test]
    fn nothing_is_logged_unless_recording() {
        let mut cache = PrefixCache::new(4);
        let a = load_tokens(&mut cache, &tokens(0..32));
        cache.unpin(&a);
        cache.flush();
        assert!(cache.take_events().is_empty());
    }
}
