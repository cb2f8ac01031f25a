//! The per-core recent-dispatch map (DESIGN.md section 2, step 6): the keys this core dispatched
//! in the last [`RECENT_DISPATCH_WINDOW_MS`], so a burst of the same new prefix routes to the
//! same worker before the control core's insert reaches the index. A lookup compares the request
//! against each live entry (longest common prefix, in the tree's units) and the result is merged
//! into the index's answer, never replacing a longer tree match; in hash mode a recent dispatch
//! of one of the request's heads makes its worker a holder of that head, and for the KV-event
//! index a recent dispatch sharing leading blocks makes its worker a holder of them (the engine
//! reports blocks only once it computed them). The caller consults it only on an index miss (the
//! burst case), so a warm index never pays for the comparisons.

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

#[derive(Clone, Debug)]
struct Entry {
    namespace: Namespace,
    key: KeyData,
    worker: WorkerId,
    tick_ms: u64,
}

/// A small ring of this core's recent dispatches.
#[derive(Debug, Default)]
pub struct RecentDispatches {
    entries: Vec<Entry>,
    next: usize,
}

impl RecentDispatches {
    /// Remembers a dispatch (overwriting the oldest entry when full).
    pub fn push(&mut self, namespace: Namespace, key: KeyData, worker: WorkerId, tick_ms: u64) {
        let entry = Entry {
            namespace,
            key,
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

    /// Merges recent dispatches into `tree` (the index's answer for `key`): a longer recent
    /// match replaces it with that worker as the only tenant; an equal one adds its worker.
    pub fn merge_into(
        &self,
        tree: &mut TreeMatch,
        namespace: Namespace,
        key: IndexKey<'_>,
        now_ms: u64,
    ) {
        for entry in &self.entries {
            if entry.namespace != namespace
                || now_ms.saturating_sub(entry.tick_ms) > RECENT_DISPATCH_WINDOW_MS
            {
                continue;
            }
            let Some(matched) = common_prefix_units(&entry.key, key) else {
                continue;
            };
            if matched == 0 || matched < tree.matched_len {
                continue;
            }
            if matched > tree.matched_len {
                tree.matched_len = matched;
                tree.tenants_len = 0;
            }
            let len = usize::from(tree.tenants_len);
            if len < MATCH_TENANTS_MAX && !tree.tenants().contains(&entry.worker) {
                tree.tenants[len] = entry.worker;
                tree.tenants_len += 1;
            }
        }
    }
}

impl RecentDispatches {
    /// Hash mode: adds the worker of each live recent dispatch that recorded one of the
    /// request's heads as a holder of that head (`heads`, the index's answer, has none).
    pub fn merge_heads_into(&self, heads: &mut HeadMatch, namespace: Namespace, now_ms: u64) {
        for entry in &self.entries {
            let KeyData::Heads(recorded) = &entry.key else {
                continue;
            };
            if entry.namespace != namespace
                || now_ms.saturating_sub(entry.tick_ms) > RECENT_DISPATCH_WINDOW_MS
            {
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
        for entry in &self.entries {
            let KeyData::Tokens(sent) = &entry.key else {
                continue;
            };
            let stale = now_ms.saturating_sub(entry.tick_ms) > RECENT_DISPATCH_WINDOW_MS;
            if stale || entry.namespace != namespace || sent.block_size() != pages.block_size() {
                continue;
            }
            let shared = common_prefix(sent.pages(), pages.pages());
            if shared > 0 {
                blocks.add_holder(entry.worker, u32::try_from(shared).unwrap_or(u32::MAX));
            }
        }
    }
}

/// The common prefix of a remembered key and a request key in the tree's units: characters for
/// text, whole pages for tokens. `None` when the kinds differ (text never matches tokens).
fn common_prefix_units(remembered: &KeyData, key: IndexKey<'_>) -> Option<u32> {
    let units = match (remembered, key) {
        (KeyData::Text(old), IndexKey::Text(new)) => {
            let mut bytes = common_prefix(old.as_bytes(), new.as_bytes());
            while !new.is_char_boundary(bytes) {
                bytes -= 1;
            }
            count_chars(&new.as_bytes()[..bytes])
        }
        (KeyData::Tokens(old), IndexKey::Tokens(new)) => {
            (common_prefix(old.pages(), new.pages()) * new.block_size()) as u64
        }
        _ => return None,
    };
    Some(u32::try_from(units).unwrap_or(u32::MAX))
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
}
