//! The per-core recent-dispatch map (DESIGN.md section 2, step 6): the keys this core dispatched
//! in the last [`RECENT_DISPATCH_WINDOW_MS`], so a burst of the same new prefix routes to the
//! same worker before the control core's insert reaches the index. A cache miss is pushed when
//! it is decided, a hit with its record once the worker has the request. A lookup compares the
//! request against each live entry (longest common prefix, in the tree's units) and the result
//! is merged into the index's answer, never replacing a longer tree match; in hash mode a recent
//! dispatch of one of the request's heads makes its worker a holder of that head, and for the
//! KV-event index a recent dispatch sharing leading blocks makes its worker a holder of them
//! (the engine reports blocks only once it computed them). The caller consults it only on an
//! index miss (the burst case), so a warm index never pays for the comparisons.
//!
//! A common prefix is known to the checkpoint at or below it ([`CHECKPOINTS`]: every length to
//! 16 units, then 1/16 longer each): exact to 16 units, at most 6% short beyond (it only decides
//! affinity). A text key up to [`RECENT_KEY_KEPT_BYTES_MAX`] is kept as itself, the dispatch
//! record's shared copy (no copy, no hashing at dispatch: the push is on every request, the
//! comparison only on an index miss), and compared byte by byte, the result rounded down to
//! that checkpoint; so sixteen entries pin at most 1 MiB. A longer key, and a token key, is
//! remembered as the hashes of its prefixes at those lengths ([`Prefixes`], at most
//! [`RECENT_KEY_CHECKPOINTS_MAX`] words), so sixteen 60 MB prompts cost the ring a few KiB
//! instead of pinning 960 MB. Both forms give the same match (up to a 64-bit hash collision).

use std::sync::Arc;

use xxhash_rust::xxh3::xxh3_64_with_seed;

use super::prepared::IndexKey;
use super::record::KeyData;
use crate::ids::WorkerId;
use crate::index::hash::HeadMatch;
use crate::index::kv::BlockMatch;
use crate::index::{common_prefix, count_chars, Namespace, TokenPages, TreeMatch};
use crate::limits::MATCH_TENANTS_MAX;

/// Entries kept per core: a burst of distinct new prefixes larger than this within the window
/// loses the oldest, which only costs affinity, never correctness.
pub const RECENT_DISPATCHES_MAX: usize = 16;
/// How long an entry stands in for the index: ten control-core turns (10 ms each), far longer
/// than the insert normally takes, short enough that the map never outlives an eviction.
pub const RECENT_DISPATCH_WINDOW_MS: u64 = 100;
/// The most prefix hashes an entry keeps (8 bytes each): [`CHECKPOINTS`] reach past 2^30
/// units within 512 (a 60 MB prompt needs about 270).
pub const RECENT_KEY_CHECKPOINTS_MAX: usize = 512;

/// The longest text key an entry keeps as itself (a shared reference, not a copy): sixteen
/// entries pin at most 1 MiB, and a 36 KB chat's routing text is not hashed at each dispatch.
pub const RECENT_KEY_KEPT_BYTES_MAX: usize = 64 * 1024;

/// The prefix lengths remembered, in units (bytes of text, pages of tokens): 1 to 16, then each
/// 1/16 longer than the one before.
pub const CHECKPOINTS: [usize; RECENT_KEY_CHECKPOINTS_MAX] = checkpoint_lengths();

/// The longest checkpoint at or below `units` (0 below the first): what a comparison of prefix
/// hashes finds for a common prefix of `units`.
fn checkpoint_at_or_below(units: usize) -> usize {
    match CHECKPOINTS.partition_point(|length| *length <= units) {
        0 => 0,
        k => CHECKPOINTS[k - 1],
    }
}

const fn checkpoint_lengths() -> [usize; RECENT_KEY_CHECKPOINTS_MAX] {
    let mut lengths = [0; RECENT_KEY_CHECKPOINTS_MAX];
    let (mut k, mut length) = (0, 1usize);
    while k < RECENT_KEY_CHECKPOINTS_MAX {
        lengths[k] = length;
        let step = if length >> 4 > 1 { length >> 4 } else { 1 };
        length = length.saturating_add(step);
        k += 1;
    }
    lengths
}

/// The hashes of a key's prefixes at [`CHECKPOINTS`] (as many as the key reaches), each chained
/// from the one before over the units between.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
struct Prefixes {
    hashes: Vec<u64>,
}

/// A key as an entry remembers it.
#[derive(Clone, Debug)]
enum Remembered {
    /// A text key up to [`RECENT_KEY_KEPT_BYTES_MAX`]: itself, shared with the dispatch record.
    Text(Arc<str>),
    /// A longer text key: prefixes of its bytes.
    TextPrefixes(Prefixes),
    /// A token key: prefixes of its page hashes, pages of `block_size` tokens.
    Pages {
        prefixes: Prefixes,
        block_size: usize,
    },
    /// Heads (hash index): their hashes, as few as the boundaries.
    Heads(Arc<[u64]>),
}

impl Remembered {
    fn of(key: KeyData) -> Remembered {
        match key {
            KeyData::Text(text) if text.len() <= RECENT_KEY_KEPT_BYTES_MAX => {
                Remembered::Text(text)
            }
            KeyData::Text(text) => Remembered::TextPrefixes(Prefixes::of_text(text.as_bytes())),
            KeyData::Tokens(tokens) => Remembered::Pages {
                prefixes: Prefixes::of_pages(tokens.pages()),
                block_size: tokens.block_size(),
            },
            KeyData::Heads(heads) => Remembered::Heads(heads),
        }
    }
}

/// A key's units (bytes of text, page hashes of tokens), hashed a segment at a time.
trait Units {
    /// How many units the key has.
    fn len(&self) -> usize;
    /// The hash of units `from..to` chained on from `seed`, the hash of those before.
    fn chain(&self, seed: u64, from: usize, to: usize) -> u64;
}

impl Units for [u8] {
    fn len(&self) -> usize {
        <[u8]>::len(self)
    }
    fn chain(&self, seed: u64, from: usize, to: usize) -> u64 {
        xxh3_64_with_seed(&self[from..to], seed)
    }
}

impl Units for [u64] {
    fn len(&self) -> usize {
        <[u64]>::len(self)
    }
    fn chain(&self, seed: u64, from: usize, to: usize) -> u64 {
        // The units are hashes already: one multiply each folds them in order.
        self[from..to].iter().fold(seed, |hash, page| {
            (hash ^ page)
                .wrapping_mul(0x9e37_79b9_7f4a_7c15)
                .rotate_left(27)
        })
    }
}

impl Prefixes {
    fn of_text(bytes: &[u8]) -> Prefixes {
        Prefixes::of(bytes)
    }

    fn of_pages(pages: &[u64]) -> Prefixes {
        Prefixes::of(pages)
    }

    fn of<U: Units + ?Sized>(units: &U) -> Prefixes {
        let mut hashes = Vec::new();
        let (mut hash, mut from) = (0u64, 0);
        for to in CHECKPOINTS.iter().take_while(|to| **to <= units.len()) {
            hash = units.chain(hash, from, *to);
            hashes.push(hash);
            from = *to;
        }
        Prefixes { hashes }
    }
}

/// A request key's prefix hashes, computed as far as a comparison needs them (on a miss, once
/// for all entries: a burst of one long prompt hashes it once).
struct RequestPrefixes<'a, U: Units + ?Sized> {
    units: &'a U,
    hashes: [u64; RECENT_KEY_CHECKPOINTS_MAX],
    computed: usize,
}

impl<'a, U: Units + ?Sized> RequestPrefixes<'a, U> {
    fn new(units: &'a U) -> Self {
        RequestPrefixes {
            units,
            hashes: [0; RECENT_KEY_CHECKPOINTS_MAX],
            computed: 0,
        }
    }

    /// The hash of prefix `k`, if the request reaches [`CHECKPOINTS`]`[k]`.
    fn get(&mut self, k: usize) -> Option<u64> {
        while self.computed <= k {
            let to = *CHECKPOINTS.get(self.computed)?;
            if to > self.units.len() {
                return None;
            }
            let (seed, from) = match self.computed {
                0 => (0, 0),
                n => (self.hashes[n - 1], CHECKPOINTS[n - 1]),
            };
            self.hashes[self.computed] = self.units.chain(seed, from, to);
            self.computed += 1;
        }
        Some(self.hashes[k])
    }

    /// The longest common prefix with `remembered`, in units: a checkpoint's length, or 0.
    fn common(&mut self, remembered: &Prefixes) -> usize {
        let mut matched = 0;
        for (k, hash) in remembered.hashes.iter().enumerate() {
            if self.get(k) != Some(*hash) {
                break;
            }
            matched = CHECKPOINTS[k];
        }
        matched
    }
}

#[derive(Clone, Debug)]
struct Entry {
    namespace: Namespace,
    key: Remembered,
    worker: WorkerId,
    tick_ms: u64,
}

impl Entry {
    fn live(&self, namespace: Namespace, now_ms: u64) -> bool {
        self.namespace == namespace
            && now_ms.saturating_sub(self.tick_ms) <= RECENT_DISPATCH_WINDOW_MS
    }
}

/// A small ring of this core's recent dispatches.
#[derive(Debug, Default)]
pub struct RecentDispatches {
    entries: Vec<Entry>,
    next: usize,
}

impl RecentDispatches {
    /// Remembers a dispatch (overwriting the oldest entry when full); `key` itself is not kept.
    pub fn push(&mut self, namespace: Namespace, key: KeyData, worker: WorkerId, tick_ms: u64) {
        let entry = Entry {
            namespace,
            key: Remembered::of(key),
            worker,
            tick_ms,
        };
        if self.entries.len() < RECENT_DISPATCHES_MAX {
            self.entries.push(entry);
        } else {
            self.entries[self.next] = entry;
            self.next = (self.next + 1) % RECENT_DISPATCHES_MAX;
        }
    }

    /// Entries held (at most [`RECENT_DISPATCHES_MAX`]).
    #[cfg(test)]
    pub fn entries_held(&self) -> usize {
        self.entries.len()
    }

    /// Bytes the entries hold beyond the ring itself.
    pub fn held_bytes(&self) -> usize {
        let bytes = |entry: &Entry| match &entry.key {
            Remembered::Text(text) => text.len(),
            Remembered::TextPrefixes(prefixes) | Remembered::Pages { prefixes, .. } => {
                prefixes.hashes.capacity() * std::mem::size_of::<u64>()
            }
            Remembered::Heads(heads) => heads.len() * std::mem::size_of::<u64>(),
        };
        self.entries.iter().map(bytes).sum::<usize>()
    }

    /// Merges recent dispatches into `tree` (the index's answer for `key`): a longer recent
    /// match replaces it with that worker as the only tenant; an equal one adds its worker.
    pub fn merge_into(
        &self,
        tree: &mut TreeMatch,
        namespace: Namespace,
        key: IndexKey<'_>,
        now_ms: u64,
    ) {
        let live = || self.entries.iter().filter(|e| e.live(namespace, now_ms));
        match key {
            IndexKey::Text(text) => {
                let mut request = RequestPrefixes::new(text.as_bytes());
                for entry in live() {
                    let mut bytes = match &entry.key {
                        Remembered::Text(kept) => {
                            checkpoint_at_or_below(common_prefix(kept.as_bytes(), text.as_bytes()))
                        }
                        Remembered::TextPrefixes(prefixes) => request.common(prefixes),
                        _ => continue,
                    };
                    while !text.is_char_boundary(bytes) {
                        bytes -= 1;
                    }
                    let chars = count_chars(&text.as_bytes()[..bytes]);
                    merge_one(tree, units(chars), entry.worker);
                }
            }
            IndexKey::Tokens(pages) => {
                let mut request = RequestPrefixes::new(pages.pages());
                for entry in live() {
                    let Remembered::Pages { prefixes, .. } = &entry.key else {
                        continue;
                    };
                    let matched = (request.common(prefixes) * pages.block_size()) as u64;
                    merge_one(tree, units(matched), entry.worker);
                }
            }
            IndexKey::Heads(_) => {}
        }
    }
}

/// A count of units as a tree match counts them.
fn units(n: u64) -> u32 {
    u32::try_from(n).unwrap_or(u32::MAX)
}

/// Merges one recent dispatch to `worker` matching `matched` units into `tree`.
fn merge_one(tree: &mut TreeMatch, matched: u32, worker: WorkerId) {
    if matched == 0 || matched < tree.matched_len {
        return;
    }
    if matched > tree.matched_len {
        tree.matched_len = matched;
        tree.tenants_len = 0;
    }
    let len = usize::from(tree.tenants_len);
    if len < MATCH_TENANTS_MAX && !tree.tenants().contains(&worker) {
        tree.tenants[len] = worker;
        tree.tenants_len += 1;
    }
}

impl RecentDispatches {
    /// Hash mode: adds the worker of each live recent dispatch that recorded one of the
    /// request's heads as a holder of that head (`heads`, the index's answer, has none).
    pub fn merge_heads_into(&self, heads: &mut HeadMatch, namespace: Namespace, now_ms: u64) {
        for entry in &self.entries {
            let Remembered::Heads(recorded) = &entry.key else {
                continue;
            };
            if !entry.live(namespace, now_ms) {
                continue;
            }
            for index in 0..usize::from(heads.len) {
                if recorded.contains(&heads.hits[index].head.hash) {
                    heads.add_holder(index, entry.worker);
                }
            }
        }
    }
}

impl RecentDispatches {
    /// KV-event mode: adds the worker of each live recent dispatch sharing leading blocks with
    /// the request (`pages`, of `blocks.block_size` tokens) as a holder of that many: its engine
    /// is computing them and has not reported them yet.
    pub fn merge_blocks_into(
        &self,
        blocks: &mut BlockMatch,
        namespace: Namespace,
        pages: &TokenPages,
        now_ms: u64,
    ) {
        let mut request = RequestPrefixes::new(pages.pages());
        for entry in &self.entries {
            let Remembered::Pages {
                prefixes,
                block_size,
            } = &entry.key
            else {
                continue;
            };
            if !entry.live(namespace, now_ms) || *block_size != pages.block_size() {
                continue;
            }
            let shared = request.common(prefixes);
            if shared > 0 {
                blocks.add_holder(entry.worker, units(shared as u64));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::index::TokenPages;

    const NS: Namespace = Namespace {
        model: 1,
        partition: 0,
    };

    fn miss(request_len: u32) -> TreeMatch {
        TreeMatch {
            request_len,
            ..TreeMatch::default()
        }
    }

    #[test]
    fn a_recent_dispatch_stands_in_for_the_index_within_the_window() {
        let mut recent = RecentDispatches::default();
        recent.push(
            NS,
            KeyData::of(IndexKey::Text("shared prefix one")),
            WorkerId(3),
            1000,
        );
        let key = IndexKey::Text("shared prefix two");
        let short = TokenPages::of(&[1, 2, 3], 1);
        let mut tree = miss(17);
        recent.merge_into(&mut tree, NS, key, 1050);
        assert_eq!((tree.matched_len, tree.tenants()), (14, &[WorkerId(3)][..]));
        // Too old, another namespace, or another key kind: no effect.
        for (ns, now, k) in [
            (NS, 1000 + RECENT_DISPATCH_WINDOW_MS + 1, key),
            (
                Namespace {
                    model: 1,
                    partition: 9,
                },
                1050,
                key,
            ),
            (NS, 1050, IndexKey::Tokens(&short)),
        ] {
            let mut tree = miss(17);
            recent.merge_into(&mut tree, ns, k, now);
            assert_eq!(tree.tenants_len, 0);
        }
    }

    #[test]
    fn tokens_match_in_whole_pages_and_never_shorten_a_tree_match() {
        let mut recent = RecentDispatches::default();
        let old: Vec<u32> = (0..40).collect();
        let old = TokenPages::of(&old, 16);
        recent.push(NS, KeyData::of(IndexKey::Tokens(&old)), WorkerId(1), 0);
        let mut new: Vec<u32> = (0..35).collect();
        new.push(999);
        let new = TokenPages::of(&new, 16);
        let mut tree = miss(36);
        recent.merge_into(&mut tree, NS, IndexKey::Tokens(&new), 10);
        assert_eq!((tree.matched_len, tree.tenants()), (32, &[WorkerId(1)][..]));
        let mut longer = TreeMatch {
            matched_len: 48,
            request_len: 64,
            tenants_len: 1,
            ..TreeMatch::default()
        };
        longer.tenants[0] = WorkerId(5);
        recent.merge_into(&mut longer, NS, IndexKey::Tokens(&new), 10);
        assert_eq!(
            (longer.matched_len, longer.tenants()),
            (48, &[WorkerId(5)][..])
        );
    }

    #[test]
    fn recent_dispatches_stand_in_for_blocks_the_engine_has_not_reported() {
        let mut recent = RecentDispatches::default();
        let sent: Vec<u32> = (0..64).collect();
        let key = KeyData::of(IndexKey::Tokens(&TokenPages::of(&sent, 16)));
        recent.push(NS, key, WorkerId(3), 1_000);
        // A longer request sharing the 4 blocks sent to worker 3.
        let request: Vec<u32> = (0..100).collect();
        let pages = TokenPages::of(&request, 16);
        let mut blocks = BlockMatch {
            request_blocks: 6,
            block_size: 16,
            ..BlockMatch::default()
        };
        recent.merge_blocks_into(&mut blocks, NS, &pages, 1_050);
        assert_eq!(blocks.holders(), &[(WorkerId(3), 4)]);
        // Past the window, in another namespace, or in pages of another size: nothing.
        let mut late = BlockMatch::default();
        recent.merge_blocks_into(&mut late, NS, &pages, 1_000 + RECENT_DISPATCH_WINDOW_MS + 1);
        let other = Namespace { partition: 9, ..NS };
        recent.merge_blocks_into(&mut late, other, &pages, 1_050);
        recent.merge_blocks_into(&mut late, NS, &TokenPages::of(&request, 8), 1_050);
        assert!(late.holders().is_empty());
    }

    #[test]
    fn multibyte_text_is_counted_in_characters() {
        let mut recent = RecentDispatches::default();
        recent.push(
            NS,
            KeyData::of(IndexKey::Text("héllo wörld")),
            WorkerId(2),
            0,
        );
        let mut tree = miss(11);
        recent.merge_into(&mut tree, NS, IndexKey::Text("héllo wörst"), 0);
        assert_eq!(tree.matched_len, 9);
    }

    #[test]
    fn the_ring_keeps_the_newest_entries() {
        let mut recent = RecentDispatches::default();
        for i in 0..(RECENT_DISPATCHES_MAX as u16 + 4) {
            recent.push(
                NS,
                KeyData::of(IndexKey::Text(&format!("key {i}"))),
                WorkerId(i),
                0,
            );
        }
        let mut tree = miss(5);
        recent.merge_into(&mut tree, NS, IndexKey::Text("key 0"), 0);
        assert!(
            !tree.tenants().contains(&WorkerId(0)),
            "the oldest entry was overwritten"
        );
        let mut tree = miss(6);
        recent.merge_into(&mut tree, NS, IndexKey::Text("key 19"), 0);
        assert!(tree.tenants().contains(&WorkerId(19)));
    }

    #[test]
    fn an_entry_keeps_prefix_hashes_not_the_prompt() {
        let mut recent = RecentDispatches::default();
        // An 8 MB prompt sharing its first 6 MB with the request.
        let prompt: String = (0..8 << 20)
            .map(|i| char::from(b'a' + (i % 23) as u8))
            .collect();
        let key = KeyData::of(IndexKey::Text(&prompt));
        let KeyData::Text(text) = &key else {
            unreachable!("a text key")
        };
        let text = text.clone();
        recent.push(NS, key, WorkerId(4), 0);
        assert_eq!(Arc::strong_count(&text), 1, "the ring holds no reference");
        assert!(recent.held_bytes() <= RECENT_KEY_CHECKPOINTS_MAX * 8);
        let mut request = prompt[..6 << 20].to_string();
        request.push_str("and then something else entirely");
        let mut tree = miss(request.len() as u32);
        recent.merge_into(&mut tree, NS, IndexKey::Text(&request), 0);
        let exact = 6 << 20;
        let matched = tree.matched_len as usize;
        assert!(matched <= exact && matched * 17 / 16 >= exact, "{matched}");
        assert_eq!(tree.tenants(), &[WorkerId(4)]);
    }

    /// The match of `request` against one entry remembering `key` as `remembered`.
    fn matched_against(remembered: Remembered, request: &str) -> (u32, usize) {
        let recent = RecentDispatches {
            entries: vec![Entry {
                namespace: NS,
                key: remembered,
                worker: WorkerId(7),
                tick_ms: 0,
            }],
            next: 0,
        };
        let mut tree = miss(request.len() as u32);
        recent.merge_into(&mut tree, NS, IndexKey::Text(request), 0);
        (tree.matched_len, tree.tenants().len())
    }

    #[test]
    fn a_kept_text_key_matches_as_its_prefix_hashes_would() {
        // Keys sharing prefixes of every length around the checkpoints (exact to 16 bytes, a
        // sixteenth apart beyond), with multibyte characters at some of the cuts.
        let base: String = (0..400)
            .map(|i| {
                if i % 37 == 5 {
                    'é'
                } else {
                    char::from(b'a' + (i % 26) as u8)
                }
            })
            .collect();
        let mut compared = 0;
        for cut in (0..base.len()).filter(|cut| base.is_char_boundary(*cut)) {
            for tail in ["", "x", "zzzz, a different ending"] {
                let request = format!("{}{tail}", &base[..cut]);
                for key in [&base[..], &base[..cut.min(200)]] {
                    let kept = Remembered::Text(Arc::from(key));
                    let hashed = Remembered::TextPrefixes(Prefixes::of_text(key.as_bytes()));
                    assert_eq!(
                        matched_against(kept, &request),
                        matched_against(hashed, &request),
                        "key of {} bytes, request cut at {cut} + {tail:?}",
                        key.len()
                    );
                    compared += 1;
                }
            }
        }
        assert!(compared > 2000);
    }

    #[test]
    fn a_short_text_key_is_shared_with_the_record_not_copied_or_hashed() {
        let mut recent = RecentDispatches::default();
        let key = KeyData::of(IndexKey::Text("a short chat prompt"));
        let KeyData::Text(text) = &key else {
            unreachable!("a text key")
        };
        let text = text.clone();
        recent.push(NS, key, WorkerId(1), 0);
        assert_eq!(
            Arc::strong_count(&text),
            2,
            "the ring holds the record's copy"
        );
        assert!(matches!(recent.entries[0].key, Remembered::Text(_)));
        // The longest kept key, sixteen times over, stays within 1 MiB.
        let longest = "k".repeat(RECENT_KEY_KEPT_BYTES_MAX);
        for i in 0..RECENT_DISPATCHES_MAX as u16 {
            recent.push(NS, KeyData::of(IndexKey::Text(&longest)), WorkerId(i), 0);
        }
        assert!(recent.held_bytes() <= 1 << 20);
        let longer = "k".repeat(RECENT_KEY_KEPT_BYTES_MAX + 1);
        recent.push(NS, KeyData::of(IndexKey::Text(&longer)), WorkerId(0), 0);
        assert!(recent
            .entries
            .iter()
            .any(|entry| matches!(entry.key, Remembered::TextPrefixes(_))));
    }

    #[test]
    fn checkpoints_are_exact_to_16_then_a_sixteenth_apart() {
        assert_eq!(&CHECKPOINTS[..17], &(1..=17).collect::<Vec<_>>()[..]);
        for pair in CHECKPOINTS.windows(2) {
            assert!(pair[1] > pair[0] && pair[1] - pair[0] <= pair[0].div_ceil(16).max(1));
        }
        assert!(CHECKPOINTS[RECENT_KEY_CHECKPOINTS_MAX - 1] > 1 << 30);
    }
}
