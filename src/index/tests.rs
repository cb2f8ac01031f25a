//! Unit tests of the index's public behaviour on small trees (the model-based and concurrent
//! checks live in `tests/index_*.rs`).

use super::*;

const NS: Namespace = Namespace {
    model: 1,
    partition: 0,
};

fn writer(block_size: u32) -> IndexWriter {
    IndexWriter::new(IndexConfig { block_size }).expect("index")
}

/// The page hashes of `tokens` for the token tests' indexes, whose block size is 4.
fn pages(tokens: &[u32]) -> TokenPages {
    TokenPages::of(tokens, 4)
}

#[test]
fn text_match_reports_chars_and_the_deepest_node_tenants() {
    let mut index = writer(16);
    index
        .insert_text(NS, "You are helpful. Answer in French.", WorkerId(1), 1)
        .expect("insert");
    index
        .insert_text(NS, "You are helpful. Write code.", WorkerId(2), 2)
        .expect("insert");
    let reader = index.reader().expect("reader");
    let found = reader.lookup_text(NS, "You are helpful. Answer in German.");
    assert_eq!(
        found.matched_len,
        "You are helpful. Answer in ".len() as u32
    );
    assert_eq!(found.request_len, 34);
    assert_eq!(found.tenants(), &[WorkerId(1)]);
    let shared = reader.lookup_text(NS, "You are helpful. Something");
    assert_eq!(shared.matched_len, 17);
    assert_eq!(
        shared.tenants(),
        &[WorkerId(2), WorkerId(1)],
        "most recent first"
    );
    let miss = reader.lookup_text(NS, "Nothing in common");
    assert_eq!((miss.matched_len, miss.tenants_len), (0, 0));
    let other = reader.lookup_text(
        Namespace {
            model: 1,
            partition: 9,
        },
        "You are helpful.",
    );
    assert_eq!(other.matched_len, 0, "partitions never match each other");
}

#[test]
fn text_matches_end_on_char_boundaries() {
    let mut index = writer(16);
    index
        .insert_text(NS, "préfixe é", WorkerId(3), 1)
        .expect("insert");
    // "ê" shares its first UTF-8 byte with "é".
    let found = index.lookup_text(NS, "préfixe ê");
    assert_eq!(found.matched_len, 8);
    assert_eq!(found.request_len, 9);
    assert_eq!(found.tenants(), &[WorkerId(3)]);
}

#[test]
fn token_matches_count_whole_pages_only() {
    let mut index = writer(4);
    let prompt: Vec<u32> = (0..10).collect();
    index
        .insert_tokens(NS, &prompt, WorkerId(0), 1)
        .expect("insert");
    let mut query = prompt.clone();
    query[6] = 99;
    let found = index.lookup_tokens(NS, &pages(&query));
    assert_eq!((found.matched_len, found.request_len), (4, 10));
    assert_eq!(found.tenants(), &[WorkerId(0)]);
    let short = index.lookup_tokens(NS, &pages(&prompt[..3]));
    assert_eq!(
        (short.matched_len, short.tenants_len),
        (0, 0),
        "shorter than a page"
    );
    index
        .insert_tokens(NS, &prompt[..3], WorkerId(1), 2)
        .expect("insert");
    assert_eq!(
        index.gauges()[0].token.units,
        8,
        "only whole pages are recorded"
    );
    // A page differing in its second token is a different child with the same first token.
    let mut sibling = prompt.clone();
    sibling[1] = 77;
    index
        .insert_tokens(NS, &sibling, WorkerId(2), 3)
        .expect("insert");
    assert_eq!(
        index.lookup_tokens(NS, &pages(&sibling)).tenants(),
        &[WorkerId(2)]
    );
    assert_eq!(index.lookup_tokens(NS, &pages(&prompt)).matched_len, 8);
}

#[test]
fn remove_worker_purges_and_merges() {
    let mut index = writer(16);
    index
        .insert_text(NS, "abcdef", WorkerId(1), 1)
        .expect("insert");
    index
        .insert_text(NS, "abcxyz", WorkerId(2), 2)
        .expect("insert");
    index
        .insert_text(NS, "abc", WorkerId(3), 3)
        .expect("insert");
    assert_eq!(index.gauges()[0].string.units, 6 + 6 + 3);
    assert_eq!(index.remove_worker(WorkerId(2)), 2);
    let found = index.lookup_text(NS, "abcxyz");
    assert_eq!(found.matched_len, 3);
    assert_eq!(found.tenants(), &[WorkerId(3), WorkerId(1)]);
    index.remove_worker(WorkerId(3));
    assert_eq!(index.memory().string.nodes, 2, "root and one merged leaf");
    assert_eq!(index.lookup_text(NS, "abcdef").tenants(), &[WorkerId(1)]);
    index.remove_worker(WorkerId(1));
    let gauges = index.gauges()[0].string;
    assert_eq!((gauges.units, gauges.entries, gauges.tenants), (0, 0, 0));
    assert_eq!(
        index.memory().string.nodes,
        0,
        "the empty namespace is gone"
    );
    assert_eq!(
        index.pending_reclaim(),
        0,
        "no reader online: everything freed"
    );
}

#[test]
fn eviction_removes_least_recent_leaves_until_within_budget() {
    let mut index = writer(16);
    index
        .insert_text(NS, "shared-old", WorkerId(1), 1)
        .expect("insert");
    index
        .insert_text(NS, "shared-new", WorkerId(2), 2)
        .expect("insert");
    index
        .insert_text(NS, "other", WorkerId(1), 3)
        .expect("insert");
    assert_eq!(index.gauges()[0].string.units, 25);
    let stats = index.evict(20);
    // Worker 1's "old" leaf goes first, then "shared-" becomes its oldest leaf (22 > 20).
    assert_eq!(
        stats,
        EvictStats {
            entries: 2,
            units: 10
        }
    );
    assert_eq!(
        index.lookup_text(NS, "shared-old").tenants(),
        &[WorkerId(2)]
    );
    assert_eq!(
        index.evict(20),
        EvictStats::default(),
        "within budget: nothing to do"
    );
    index.evict(5);
    let gauges = index.gauges()[0].string;
    assert!(gauges.units <= 5, "{gauges:?}");
    assert_eq!(index.lookup_text(NS, "other").matched_len, 5);
}

#[test]
fn mru_keeps_eight_most_recent_and_refills_after_removal() {
    let mut index = writer(16);
    for worker in 0..10u16 {
        index
            .insert_text(NS, "prompt", WorkerId(worker), u64::from(worker))
            .expect("insert");
    }
    let found = index.lookup_text(NS, "prompt");
    let expect: Vec<WorkerId> = (2..10u16).rev().map(WorkerId).collect();
    assert_eq!(found.tenants(), expect.as_slice());
    index.remove_worker(WorkerId(9));
    let found = index.lookup_text(NS, "prompt");
    let expect: Vec<WorkerId> = (1..9u16).rev().map(WorkerId).collect();
    assert_eq!(found.tenants(), expect.as_slice());
}

#[test]
fn stalled_reader_delays_reclamation_only() {
    let mut index = writer(16);
    let mut reader = index.reader().expect("reader");
    index
        .insert_text(NS, "abcdef", WorkerId(1), 1)
        .expect("insert");
    {
        let guard = reader.guard();
        assert_eq!(guard.lookup_text(NS, "abc").matched_len, 3);
        index.remove_worker(WorkerId(1));
        assert!(
            index.pending_reclaim() > 0,
            "the guard holds the retired nodes"
        );
        assert_eq!(
            guard.lookup_text(NS, "abcdef").matched_len,
            0,
            "new lookups see the purge"
        );
    }
    reader.quiesce();
    index.reclaim();
    assert_eq!(index.pending_reclaim(), 0);
    reader.go_offline();
    index
        .insert_text(NS, "abcdef", WorkerId(1), 2)
        .expect("insert");
    index.remove_worker(WorkerId(1));
    assert_eq!(
        index.pending_reclaim(),
        0,
        "an offline reader does not delay reclamation"
    );
}

#[test]
fn errors_are_typed() {
    assert_eq!(
        IndexWriter::new(IndexConfig { block_size: 0 }).err(),
        Some(IndexError::BlockSizeZero)
    );
    let mut index = writer(16);
    let err = index.insert_text(NS, "x", WorkerId(60_000), 1);
    assert_eq!(err, Err(IndexError::WorkerOutOfRange(WorkerId(60_000))));
    let readers: Vec<IndexReader> = (0..READERS_MAX)
        .map_while(|_| index.reader().ok())
        .collect();
    assert_eq!(readers.len(), READERS_MAX);
    assert_eq!(index.reader().err(), Some(IndexError::ReadersExhausted));
}

const OTHER_NS: Namespace = Namespace {
    model: 1,
    partition: 5,
};

fn key(prefix: std::ops::Range<u32>, tail: u32, tail_len: u32) -> Vec<u32> {
    prefix
        .chain((0..tail_len).map(|i| tail * 1000 + i))
        .collect()
}

/// Two indexes fed the same records, one with the lookup hints under test, one without: a hint
/// followed (or rejected) must build the same tree as a walk from the root.
struct Twins {
    hinted: IndexWriter,
    plain: IndexWriter,
}

impl Twins {
    /// Both indexes (pages of 4 tokens) holding `stored` for worker 1.
    fn holding(stored: &[u32]) -> Twins {
        let mut twins = Twins {
            hinted: writer(4),
            plain: writer(4),
        };
        twins.insert(NS, stored, 1, &LookupHint::default());
        twins
    }

    /// Inserts `key` for `worker` into both indexes, into `hinted` with `hint`.
    fn insert(&mut self, ns: Namespace, key: &[u32], worker: u16, hint: &LookupHint) {
        let counts = self.hinted.hint_counts();
        let tick = counts.followed + counts.stale + 100;
        self.hinted
            .insert_tokens_hinted(ns, &pages(key), WorkerId(worker), tick, hint)
            .expect("hinted insert");
        self.plain
            .insert_tokens(ns, key, WorkerId(worker), tick)
            .expect("plain insert");
    }

    /// Both indexes answer every query the same way (matched length and tenants).
    fn same_answers(&self, queries: &[Vec<u32>]) {
        for query in queries {
            for ns in [NS, OTHER_NS] {
                assert_eq!(
                    self.hinted.lookup_tokens(ns, &pages(query)),
                    self.plain.lookup_tokens(ns, &pages(query)),
                    "{ns:?} {query:?}"
                );
            }
        }
        assert_eq!(self.hinted.gauges(), self.plain.gauges());
    }
}

#[test]
fn a_fresh_hint_is_followed_and_builds_the_same_tree() {
    let stored = key(0..32, 1, 8);
    let mut twins = Twins::holding(&stored);
    let reader = twins.hinted.reader().expect("reader");
    // Ends inside the stored edge, at its end, and past it.
    let turns = [key(0..16, 2, 8), stored.clone(), key(0..40, 3, 8)];
    for (worker, turn) in turns.iter().enumerate() {
        let (_, hint) = reader.lookup_tokens_hinted(NS, &pages(turn));
        twins.insert(NS, turn, worker as u16 + 2, &hint);
    }
    assert_eq!(
        twins.hinted.hint_counts(),
        HintCounts {
            followed: 3,
            stale: 0
        }
    );
    twins.same_answers(&turns);
    let mut text = writer(4);
    text.insert_text(NS, "shared prefix, then a", WorkerId(1), 1)
        .expect("insert");
    let (_, hint) = text
        .reader()
        .expect("reader")
        .lookup_text_hinted(NS, "shared prefix, then b");
    text.insert_text_hinted(NS, "shared prefix, then b", WorkerId(2), 2, &hint)
        .expect("hinted text insert");
    assert_eq!(text.hint_counts().followed, 1);
    let found = text.lookup_text(NS, "shared prefix, then b");
    assert_eq!(
        (found.matched_len, found.tenants()),
        (21, &[WorkerId(2)][..])
    );
}

#[test]
fn a_split_above_the_hinted_end_is_followed_up_the_parents() {
    let stored = key(0..32, 1, 0);
    let mut twins = Twins::holding(&stored);
    let turn = key(0..16, 2, 8);
    let (_, hint) = twins.hinted.lookup_tokens_hinted(NS, &pages(&turn));
    // Cut the stored edge exactly where the lookup ended, then at 8 above it: the hinted node
    // keeps its id as the lower half both times.
    for cut in [16, 8] {
        let other = key(0..cut, 3 + cut, 4);
        twins.insert(NS, &other, 2, &LookupHint::default());
    }
    twins.insert(NS, &turn, 3, &hint);
    assert_eq!(twins.hinted.hint_counts().followed, 1);
    twins.same_answers(&[turn, stored, key(0..8, 11, 4)]);
}

#[test]
fn stale_hints_walk_from_the_root() {
    let stored = key(0..32, 1, 0);
    let turn = key(0..16, 2, 8);
    let mut twins = Twins::holding(&stored);
    let (_, hint) = twins.hinted.lookup_tokens_hinted(NS, &pages(&turn));
    for index in [&mut twins.hinted, &mut twins.plain] {
        index
            .insert_text(NS, "abcd", WorkerId(1), 1)
            .expect("text insert");
    }
    let (_, text_hint) = twins
        .hinted
        .reader()
        .expect("reader")
        .lookup_text_hinted(NS, "abcd");
    // Another namespace's tree, another kind's hint, another key length.
    twins.insert(OTHER_NS, &turn, 2, &hint);
    twins.insert(NS, &turn[..12], 2, &hint);
    twins.insert(NS, &turn, 2, &text_hint);
    // The hinted node merged away: purge the turn's worker and the split point goes.
    twins.hinted.remove_worker(WorkerId(2));
    twins.plain.remove_worker(WorkerId(2));
    twins.insert(NS, &turn, 3, &hint);
    // Evicted, reclaimed and its slot reused by other keys.
    let (_, hint) = twins.hinted.lookup_tokens_hinted(NS, &pages(&turn));
    twins.hinted.evict(0);
    twins.plain.evict(0);
    for other in 0..4 {
        let filler = key(100..108, 50 + other, 4);
        twins.insert(NS, &filler, 4, &LookupHint::default());
    }
    twins.insert(NS, &turn, 5, &hint);
    let counts = twins.hinted.hint_counts();
    assert_eq!((counts.followed, counts.stale), (0, 5), "{counts:?}");
    twins.same_answers(&[turn, stored, key(100..108, 51, 4)]);
}

/// `len` characters of a sequence chosen by `seed` (sequences of different seeds differ from
/// their first character).
fn long_text(seed: u8, len: usize) -> String {
    (0..len)
        .map(|i| char::from(b'a' + ((i * 7 + usize::from(seed) * 5) % 26) as u8))
        .collect()
}

#[test]
fn split_halves_share_their_label_buffer_and_merge_back_without_a_copy() {
    let mut index = writer(16);
    let (head, tail_a, tail_b) = (long_text(0, 300), long_text(1, 200), long_text(2, 200));
    let a = format!("{head}{tail_a}");
    index.insert_text(NS, &a, WorkerId(1), 1).expect("insert");
    let one_label = index.memory().string.label_bytes;
    // Same worker, same head: the split's halves keep the first label's buffer.
    index
        .insert_text(NS, &format!("{head}{tail_b}"), WorkerId(1), 2)
        .expect("insert");
    assert_eq!(index.memory().string.nodes, 4, "root, head, two tails");
    assert_eq!(
        index.memory().string.label_bytes,
        one_label + 200,
        "only the new tail was copied"
    );
    // The second tail is the oldest leaf once the first is touched again; evicting it leaves
    // the head with one child whose label continues the head's in the same buffer: merged.
    index.insert_text(NS, &a, WorkerId(1), 3).expect("insert");
    index.evict(500);
    assert_eq!(index.memory().string.nodes, 2, "root and the merged prompt");
    assert_eq!(index.memory().string.label_bytes, one_label);
    let found = index.lookup_text(NS, &a);
    assert_eq!(
        (found.matched_len, found.tenants()),
        (500, &[WorkerId(1)][..])
    );
    assert_eq!(
        index
            .lookup_text(NS, &format!("{head}{tail_b}"))
            .matched_len,
        300
    );
}

#[test]
fn long_one_child_chains_stay_unmerged_unless_their_labels_adjoin() {
    let mut index = writer(16);
    let (head, tail_a, tail_b) = (long_text(3, 300), long_text(4, 200), long_text(5, 200));
    let (a, b) = (format!("{head}{tail_a}"), format!("{head}{tail_b}"));
    index.insert_text(NS, &a, WorkerId(1), 1).expect("insert");
    index.insert_text(NS, &b, WorkerId(1), 2).expect("insert");
    // Evicting the first tail leaves the head (300 characters, the first buffer) over the second
    // tail (200, a buffer of its own): merging would copy 500 characters to save one node.
    index.evict(500);
    assert_eq!(index.memory().string.nodes, 3, "root, head, second tail");
    let found = index.lookup_text(NS, &b);
    assert_eq!(
        (found.matched_len, found.tenants()),
        (500, &[WorkerId(1)][..])
    );
    assert_eq!(index.lookup_text(NS, &a).matched_len, 300);
    assert_eq!(index.gauges()[0].string.units, 500);
    // Short edges still merge: a 10-character tail under the same head.
    let mut short = writer(16);
    let (c, d) = (
        format!("{head}{}", long_text(6, 10)),
        format!("{head}{}", long_text(7, 10)),
    );
    for (tick, text) in [(1, &c), (2, &d), (3, &c)] {
        short
            .insert_text(NS, text, WorkerId(1), tick)
            .expect("insert");
    }
    short.evict(310);
    assert_eq!(short.memory().string.nodes, 2, "root and the merged prompt");
    assert_eq!(short.lookup_text(NS, &c).matched_len, 310);
}

#[test]
fn every_bit_of_a_token_id_counts_and_pages_of_another_block_size_match_nothing() {
    let mut index = writer(4);
    let prompt: Vec<u32> = (0..16).map(|i| i << 24 | 0x00ab_cdef).collect();
    index
        .insert_tokens(NS, &prompt, WorkerId(3), 1)
        .expect("insert");
    let found = index.lookup_tokens(NS, &pages(&prompt));
    assert_eq!((found.matched_len, found.request_len), (16, 16));
    assert_eq!(found.tenants(), &[WorkerId(3)]);
    // Ids that differ only in their top byte part at that page.
    let mut other = prompt.clone();
    other[9] ^= 1 << 31;
    assert_eq!(index.lookup_tokens(NS, &pages(&other)).matched_len, 8);
    // Pages hashed with another block size are refused by the writer and match nothing.
    let eight = TokenPages::of(&prompt, 8);
    assert_eq!(index.lookup_tokens(NS, &eight).matched_len, 0);
    let none = LookupHint::default();
    assert_eq!(
        index.insert_tokens_hinted(NS, &eight, WorkerId(1), 2, &none),
        Err(IndexError::BlockSizeMismatch(8))
    );
    assert_eq!(index.gauges()[0].token.units, 16);
}
