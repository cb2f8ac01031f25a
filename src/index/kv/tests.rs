//! The KV-event index against its rules, and a model test against a brute force.

use std::collections::{HashMap, HashSet};

use proptest::prelude::*;

use super::*;
use crate::index::TokenPages;

const BS: usize = 4;

/// A sequence of `blocks` blocks whose tokens are `seed`-derived (equal seeds, equal content).
fn tokens(seeds: &[u32]) -> Vec<u32> {
    seeds
        .iter()
        .flat_map(|&s| (0..BS as u32).map(move |i| s * 100 + i))
        .collect()
}

/// The request side's keys for `tokens`.
fn chain_of(tokens: &[u32]) -> Vec<u64> {
    let pages = TokenPages::of(tokens, BS);
    let mut chain = Vec::new();
    chain_hashes(pages.pages(), &mut chain);
    chain
}

fn held(found: &BlockMatch) -> Vec<(u16, u32)> {
    let mut held: Vec<(u16, u32)> = found.holders().iter().map(|(w, n)| (w.0, *n)).collect();
    held.sort_unstable();
    held
}

#[test]
fn workers_are_scored_by_the_consecutive_leading_blocks_they_hold() {
    let mut writer = KvIndexWriter::new(1024);
    let reader = writer.reader();
    assert!(!reader.is_live() && reader.publishing(7).is_none());
    for w in [1, 2, 3] {
        writer.attach(WorkerId(w)).unwrap();
    }
    assert!(reader.is_live());
    // Worker 1 holds blocks a b c; worker 2 a b (engine hashes of its own scheme); worker 3
    // only c's content, but under another parent: a different key.
    writer
        .store(WorkerId(1), &[11, 12, 13], None, &tokens(&[1, 2, 3]), BS)
        .unwrap();
    writer
        .store(WorkerId(2), &[901, 902], None, &tokens(&[1, 2]), BS)
        .unwrap();
    writer
        .store(WorkerId(3), &[31], None, &tokens(&[3]), BS)
        .unwrap();
    assert_eq!(writer.block_size_of(WorkerId(1)), Some(BS as u32));
    assert_eq!(writer.block_size_of(WorkerId(9)), None);
    let found = reader.lookup(&chain_of(&tokens(&[1, 2, 3, 4])), BS);
    assert_eq!(found.request_blocks, 4);
    assert_eq!(
        held(&found),
        [(1, 3), (2, 2)],
        "worker 3 does not hold the first block"
    );
    assert_eq!(found.holders()[0], (WorkerId(1), 3), "most blocks first");
    // A block of the request's own tail that nobody holds ends nobody's run early.
    assert_eq!(
        held(&reader.lookup(&chain_of(&tokens(&[1, 9])), BS)),
        [(1, 1), (2, 1)]
    );
    assert!(reader
        .lookup(&chain_of(&tokens(&[7, 1])), BS)
        .holders()
        .is_empty());
    assert!(reader.lookup(&[], BS).holders().is_empty());
}

#[test]
fn children_chain_from_their_parent_and_orphans_are_not_stored() {
    let mut writer = KvIndexWriter::new(1024);
    let reader = writer.reader();
    writer.attach(WorkerId(0)).unwrap();
    writer
        .store(WorkerId(0), &[1, 2], None, &tokens(&[1, 2]), BS)
        .unwrap();
    let child = writer
        .store(WorkerId(0), &[3], Some(2), &tokens(&[3]), BS)
        .unwrap();
    assert_eq!((child.stored, child.orphans), (1, 0));
    assert_eq!(
        held(&reader.lookup(&chain_of(&tokens(&[1, 2, 3])), BS)),
        [(0, 3)]
    );
    let orphan = writer
        .store(WorkerId(0), &[5], Some(999), &tokens(&[5]), BS)
        .unwrap();
    assert_eq!((orphan.stored, orphan.orphans), (0, 1));
    assert_eq!(writer.blocks_of(WorkerId(0)), 3);
}

#[test]
fn removals_clears_and_detaches_take_blocks_away() {
    let mut writer = KvIndexWriter::new(1024);
    let reader = writer.reader();
    for w in [0, 1] {
        writer.attach(WorkerId(w)).unwrap();
        writer
            .store(WorkerId(w), &[1, 2, 3], None, &tokens(&[1, 2, 3]), BS)
            .unwrap();
    }
    assert_eq!(writer.live_blocks(), 3, "shared blocks are one entry each");
    let request = chain_of(&tokens(&[1, 2, 3]));
    assert_eq!(writer.remove(WorkerId(0), &[2, 77]), 1);
    assert_eq!(
        held(&reader.lookup(&request, BS)),
        [(0, 1), (1, 3)],
        "a gap ends the run"
    );
    assert_eq!(writer.clear(WorkerId(1)), 3);
    assert_eq!(held(&reader.lookup(&request, BS)), [(0, 1)]);
    assert_eq!(writer.live_blocks(), 2, "blocks 1 and 3 of worker 0");
    writer.detach(WorkerId(0));
    assert!(reader.lookup(&request, BS).holders().is_empty());
    assert_eq!(writer.live_blocks(), 0);
    assert!(reader.is_live(), "worker 1 still publishes");
    writer.detach(WorkerId(1));
    assert!(!reader.is_live());
    assert_eq!(
        writer.store(WorkerId(1), &[1], None, &tokens(&[1]), BS),
        Err(KvIndexError::NotAttached(WorkerId(1)))
    );
}

#[test]
fn the_most_blocks_and_the_most_publishers_are_bounded() {
    let mut writer = KvIndexWriter::new(4);
    writer.attach(WorkerId(0)).unwrap();
    let stats = writer
        .store(
            WorkerId(0),
            &[1, 2, 3, 4, 5, 6],
            None,
            &tokens(&[1, 2, 3, 4, 5, 6]),
            BS,
        )
        .unwrap();
    assert_eq!((stats.stored, stats.refused), (4, 1));
    assert_eq!(writer.live_blocks(), 4);
    for w in 1..KV_EVENT_WORKERS_MAX as u16 {
        writer.attach(WorkerId(w)).unwrap();
    }
    assert_eq!(
        writer.attach(WorkerId(999)),
        Err(KvIndexError::TooManyWorkers)
    );
    assert!(
        writer.attach(WorkerId(5)).is_ok(),
        "attaching twice is no new bit"
    );
}

/// Operations of the model test.
#[derive(Clone, Debug)]
enum Op {
    /// Worker stores a path of block seeds (a prefix of one of a few sequences).
    Store {
        worker: u16,
        sequence: usize,
        blocks: usize,
    },
    Remove {
        worker: u16,
        sequence: usize,
        block: usize,
    },
    Clear {
        worker: u16,
    },
}

/// A few sequences sharing prefixes, as block seeds.
const SEQUENCES: [[u32; 5]; 3] = [[1, 2, 3, 4, 5], [1, 2, 6, 7, 8], [9, 2, 3, 4, 5]];

/// A worker's engine hash of block `i` of a sequence: its own scheme (worker-dependent).
fn engine_hash(worker: u16, sequence: usize, i: usize) -> u64 {
    let path: Vec<u32> = SEQUENCES[sequence][..=i].to_vec();
    let mut h = 1469598103934665603u64 ^ u64::from(worker);
    for seed in path {
        h = (h ^ u64::from(seed)).wrapping_mul(1099511628211);
    }
    h
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (0u16..3, 0usize..3, 1usize..=5).prop_map(|(worker, sequence, blocks)| Op::Store { worker, sequence, blocks }),
        2 => (0u16..3, 0usize..3, 0usize..5).prop_map(|(worker, sequence, block)| Op::Remove { worker, sequence, block }),
        1 => (0u16..3).prop_map(|worker| Op::Clear { worker }),
    ]
}

proptest! {
    /// Every request's scores equal a brute force over each worker's set of held block paths.
    #[test]
    fn lookups_equal_a_brute_force(ops in proptest::collection::vec(op(), 1..60)) {
        let mut writer = KvIndexWriter::new(1024);
        let reader = writer.reader();
        let mut model: HashMap<u16, HashSet<Vec<u32>>> = HashMap::new();
        for w in 0..3 {
            writer.attach(WorkerId(w)).unwrap();
        }
        for op in &ops {
            match *op {
                Op::Store { worker, sequence, blocks } => {
                    // Stored from the root, as an engine does for a new sequence.
                    let seq = &SEQUENCES[sequence][..blocks];
                    let hashes: Vec<u64> = (0..blocks).map(|i| engine_hash(worker, sequence, i)).collect();
                    writer.store(WorkerId(worker), &hashes, None, &tokens(seq), BS).unwrap();
                    for i in 0..blocks {
                        model.entry(worker).or_default().insert(seq[..=i].to_vec());
                    }
                }
                Op::Remove { worker, sequence, block } => {
                    writer.remove(WorkerId(worker), &[engine_hash(worker, sequence, block)]);
                    if let Some(paths) = model.get_mut(&worker) {
                        paths.remove(&SEQUENCES[sequence][..=block].to_vec());
                    }
                }
                Op::Clear { worker } => {
                    writer.clear(WorkerId(worker));
                    model.remove(&worker);
                }
            }
            for sequence in SEQUENCES {
                let found = reader.lookup(&chain_of(&tokens(&sequence)), BS);
                let mut want = Vec::new();
                for (worker, paths) in &model {
                    let run = (0..sequence.len()).take_while(|&i| paths.contains(&sequence[..=i].to_vec())).count();
                    if run > 0 {
                        want.push((*worker, run as u32));
                    }
                }
                want.sort_unstable();
                prop_assert_eq!(held(&found), want, "{:?}", sequence);
            }
        }
    }
}

#[test]
fn added_holders_keep_the_most_blocks_first_and_never_lower_a_count() {
    let mut found = BlockMatch::default();
    found.add_holder(WorkerId(1), 2);
    found.add_holder(WorkerId(2), 5);
    found.add_holder(WorkerId(1), 1);
    assert_eq!(found.holders(), &[(WorkerId(2), 5), (WorkerId(1), 2)]);
    found.add_holder(WorkerId(1), 7);
    assert_eq!(found.holders(), &[(WorkerId(1), 7), (WorkerId(2), 5)]);
}

#[test]
fn an_added_holder_is_provisional_and_its_mark_moves_with_it() {
    let (mut writer, reader) = overlay_writer();
    writer
        .store(WorkerId(2), &[21, 22], None, &tokens(&[1, 2]), BS)
        .unwrap();
    let mut found = reader.lookup(&chain_of(&tokens(&[1, 2, 3])), BS);
    assert_eq!(found.held_by(WorkerId(2)), (2, Provenance::Engine));
    // This core's recent dispatch of the whole prompt to worker 1 passes worker 2.
    found.add_holder(WorkerId(1), 3);
    assert_eq!(found.holders(), &[(WorkerId(1), 3), (WorkerId(2), 2)]);
    assert_eq!(found.held_by(WorkerId(1)), (3, Provenance::InFlight));
    assert_eq!(found.held_by(WorkerId(2)), (2, Provenance::Engine));
    assert_eq!(found.held_by(WorkerId(5)), (0, Provenance::Engine));
}

#[test]
fn publishing_models_answer_with_their_block_size_or_for_any_model() {
    let models = PublishingModels {
        models: vec![(7, 16), (8, 0)],
        any_model: None,
    };
    assert_eq!(models.of(7), Some(Some(16)));
    assert_eq!(
        models.of(8),
        Some(None),
        "publishing, no block reported yet"
    );
    assert_eq!(models.of(9), None);
    let wildcard = PublishingModels {
        any_model: Some(32),
        ..models
    };
    assert_eq!(wildcard.of(9), Some(Some(32)));
    let writer = KvIndexWriter::new(16);
    let reader = writer.reader();
    writer.publish_models(wildcard);
    assert_eq!(reader.publishing(9), Some(Some(32)));
}

#[test]
fn a_worker_storing_millions_fills_its_share_not_the_index() {
    let mut writer = KvIndexWriter::new(100);
    let reader = writer.reader();
    for w in [1, 2] {
        writer.attach(WorkerId(w)).unwrap();
    }
    assert_eq!(writer.share(), 50);
    // Both hold a system prompt of 10 blocks: shared blocks never count against a share.
    let system: Vec<u32> = (1..=10).collect();
    for w in [1, 2] {
        let hashes: Vec<u64> = (1..=10).map(|h| h + 100 * w).collect();
        let stats = writer
            .store(WorkerId(w as u16), &hashes, None, &tokens(&system), BS)
            .unwrap();
        assert_eq!(stats.stored, 10);
    }
    // Worker 1 stores 200 blocks, one sequence: it adds its share, the rest is refused.
    let flood: Vec<u32> = (1000..1200).collect();
    let hashes: Vec<u64> = (1001..=1200).collect();
    let stats = writer
        .store(WorkerId(1), &hashes, None, &tokens(&flood), BS)
        .unwrap();
    assert_eq!((stats.stored, stats.over_share), (50, 150));
    assert_eq!(writer.blocks_of(WorkerId(1)), 60);
    // Worker 2's new prefix is stored whole, and found.
    let own = tokens(&[501, 502, 503, 504]);
    let stats = writer
        .store(WorkerId(2), &[21, 22, 23, 24], None, &own, BS)
        .unwrap();
    assert_eq!((stats.stored, stats.over_share, stats.refused), (4, 0, 0));
    assert_eq!(held(&reader.lookup(&chain_of(&own), BS)), [(2, 4)]);
    // At its share, worker 1 may still list blocks others hold, and re-store its own.
    let joined = writer
        .store(WorkerId(1), &[51, 52], None, &own[..2 * BS], BS)
        .unwrap();
    assert_eq!((joined.stored, joined.over_share), (2, 0));
    let again = writer
        .store(WorkerId(1), &hashes[..1], None, &tokens(&flood[..1]), BS)
        .unwrap();
    assert_eq!(again.over_share, 0);
    // Once worker 2 evicts what they shared, those blocks are worker 1's alone: still at its
    // share, it adds nothing new until it evicts.
    writer.remove(WorkerId(2), &[21, 22]);
    let more = writer
        .store(WorkerId(1), &[1300], Some(1050), &tokens(&[1300]), BS)
        .unwrap();
    assert_eq!(more.over_share, 1);
    // Alone again, worker 2 may hold the whole index.
    writer.detach(WorkerId(1));
    assert_eq!(writer.share(), 100);
}

#[test]
fn blocks_salted_by_a_lora_or_extra_keys_are_never_predicted_for_a_plain_request() {
    let mut writer = KvIndexWriter::new(1024);
    let reader = writer.reader();
    for w in [1, 2] {
        writer.attach(WorkerId(w)).unwrap();
    }
    let content = tokens(&[1, 2, 3]);
    // Worker 1 cached the content under a LoRA (every block salted); worker 2 with a
    // cache_salt (the first block salted, so its children differ too).
    writer
        .store_salted(WorkerId(1), &[11, 12, 13], None, &content, BS, &[7, 7, 7])
        .unwrap();
    writer
        .store_salted(WorkerId(2), &[21, 22, 23], None, &content, BS, &[9, 0, 0])
        .unwrap();
    assert!(reader.lookup(&chain_of(&content), BS).holders().is_empty());
    // Stored plain, it is found.
    writer
        .store_salted(WorkerId(2), &[31, 32], None, &content[..2 * BS], BS, &[])
        .unwrap();
    assert_eq!(held(&reader.lookup(&chain_of(&content), BS)), [(2, 2)]);
}

/// The in-flight overlay's lifecycle: a writer with it on, workers 1 and 2 publishing.
fn overlay_writer() -> (KvIndexWriter, KvIndexReader) {
    let mut writer =
        KvIndexWriter::new(1024).with_inflight_overlay(std::time::Duration::from_secs(30));
    let reader = writer.reader();
    for w in [1, 2] {
        writer.attach(WorkerId(w)).unwrap();
    }
    (writer, reader)
}

/// `(worker, blocks held, whether some are only in flight)` of a lookup, by worker.
fn held_confirmed(found: &BlockMatch) -> Vec<(u16, u32, bool)> {
    let mut held: Vec<(u16, u32, bool)> = found
        .holders()
        .iter()
        .map(|(w, n)| {
            let (blocks, provenance) = found.held_by(*w);
            assert_eq!(blocks, *n);
            (w.0, *n, provenance == Provenance::InFlight)
        })
        .collect();
    held.sort_unstable();
    held
}

#[test]
fn a_dispatch_holds_its_blocks_provisionally_until_its_engine_confirms_them() {
    let (mut writer, reader) = overlay_writer();
    // Worker 1's engine holds a b; a request for a b c d goes to it.
    writer
        .store(WorkerId(1), &[11, 12], None, &tokens(&[1, 2]), BS)
        .unwrap();
    let chain = chain_of(&tokens(&[1, 2, 3, 4]));
    let stats = writer.dispatched(FlightId(7), WorkerId(1), &chain, 0);
    assert_eq!((stats.claimed, stats.confirmed, stats.refused), (2, 2, 0));
    assert_eq!(writer.inflight(), (1, 2));
    let found = reader.lookup(&chain, BS);
    assert_eq!(held_confirmed(&found), [(1, 4, true)], "c d in flight");
    // Never written into the engines' truth.
    assert_eq!(
        (writer.live_blocks(), writer.blocks_of(WorkerId(1))),
        (2, 2)
    );
    // The engine stores c d: confirmed, the claims are gone though the request runs on.
    writer
        .store(WorkerId(1), &[13, 14], Some(12), &tokens(&[3, 4]), BS)
        .unwrap();
    assert_eq!(writer.inflight(), (1, 0));
    assert_eq!(held_confirmed(&reader.lookup(&chain, BS)), [(1, 4, false)]);
    // It evicts d: the lookup follows the engine, the ended flight releases nothing twice.
    writer.remove(WorkerId(1), &[14]);
    writer.flight_ended(FlightId(7), FlightEnd::Failed, 5);
    assert_eq!(writer.inflight(), (0, 0));
    assert_eq!(held_confirmed(&reader.lookup(&chain, BS)), [(1, 3, false)]);
}

#[test]
fn a_failed_or_aborted_request_lets_go_at_once_and_an_answered_one_after_the_grace() {
    let (mut writer, reader) = overlay_writer();
    let chain = chain_of(&tokens(&[5, 6, 7]));
    writer.dispatched(FlightId(1), WorkerId(1), &chain, 0);
    writer.dispatched(FlightId(2), WorkerId(2), &chain, 0);
    assert_eq!(
        held_confirmed(&reader.lookup(&chain, BS)),
        [(1, 3, true), (2, 3, true)]
    );
    // Failure, abort and timeout all end as failed: worker 1's claim goes now.
    writer.flight_ended(FlightId(1), FlightEnd::Failed, 10);
    assert_eq!(held_confirmed(&reader.lookup(&chain, BS)), [(2, 3, true)]);
    // Worker 2 answered, but its engine never confirmed: the claim outlives the answer by the
    // grace only.
    writer.flight_ended(FlightId(2), FlightEnd::Answered, 10);
    let grace = crate::limits::KV_INFLIGHT_CONFIRM_GRACE.as_millis() as u64;
    assert_eq!(writer.expire_flights(10 + grace - 1), 0);
    assert_eq!(held_confirmed(&reader.lookup(&chain, BS)), [(2, 3, true)]);
    assert_eq!(writer.expire_flights(10 + grace), 1);
    assert!(reader.lookup(&chain, BS).holders().is_empty());
    assert_eq!(writer.inflight(), (0, 0));
    // An end heard twice, or for a flight never started, changes nothing.
    writer.flight_ended(FlightId(2), FlightEnd::Failed, 20);
    writer.flight_ended(FlightId(99), FlightEnd::Answered, 20);
    assert_eq!(writer.inflight(), (0, 0));
}

#[test]
fn a_flight_whose_end_is_never_heard_expires_after_the_ttl() {
    let (mut writer, reader) = overlay_writer();
    let chain = chain_of(&tokens(&[8, 9]));
    writer.dispatched(FlightId(3), WorkerId(2), &chain, 1_000);
    assert_eq!(writer.expire_flights(30_999), 0);
    assert_eq!(held_confirmed(&reader.lookup(&chain, BS)), [(2, 2, true)]);
    assert_eq!(writer.expire_flights(31_000), 1);
    assert!(reader.lookup(&chain, BS).holders().is_empty());
}

#[test]
fn flights_sharing_a_prefix_keep_it_until_the_last_ends_and_a_removed_worker_drops_all() {
    let (mut writer, reader) = overlay_writer();
    let system = chain_of(&tokens(&[1, 2]));
    let first = chain_of(&tokens(&[1, 2, 3]));
    let second = chain_of(&tokens(&[1, 2, 4]));
    writer.dispatched(FlightId(1), WorkerId(1), &first, 0);
    writer.dispatched(FlightId(2), WorkerId(1), &second, 0);
    writer.dispatched(FlightId(3), WorkerId(2), &system, 0);
    assert_eq!(writer.inflight(), (3, 4 + 2));
    writer.flight_ended(FlightId(1), FlightEnd::Failed, 1);
    // The shared system blocks stay for flight 2; block 3 went with flight 1.
    assert_eq!(
        held_confirmed(&reader.lookup(&first, BS)),
        [(1, 2, true), (2, 2, true)]
    );
    assert_eq!(
        held_confirmed(&reader.lookup(&second, BS)),
        [(1, 3, true), (2, 2, true)]
    );
    // Worker 1 is removed: its flights and claims go, worker 2's stay.
    writer.detach(WorkerId(1));
    assert_eq!(held_confirmed(&reader.lookup(&second, BS)), [(2, 2, true)]);
    assert_eq!(writer.inflight(), (1, 2));
    // A worker that does not publish claims nothing.
    let stats = writer.dispatched(FlightId(4), WorkerId(9), &second, 2);
    assert_eq!(stats, FlightStats::default());
    assert_eq!(writer.inflight(), (1, 2));
}

#[test]
fn without_the_overlay_a_dispatch_changes_nothing() {
    let mut writer = KvIndexWriter::new(1024);
    let reader = writer.reader();
    writer.attach(WorkerId(1)).unwrap();
    let chain = chain_of(&tokens(&[1, 2]));
    assert_eq!(
        writer.dispatched(FlightId(1), WorkerId(1), &chain, 0),
        FlightStats::default()
    );
    assert!(reader.lookup(&chain, BS).holders().is_empty());
    assert_eq!(writer.inflight(), (0, 0));
}

#[test]
fn the_overlay_refuses_claims_past_its_most_blocks_and_counts_them() {
    // An index of 4 blocks sizes its overlay for 4.
    let mut writer = KvIndexWriter::new(4).with_inflight_overlay(std::time::Duration::from_secs(5));
    let reader = writer.reader();
    writer.attach(WorkerId(1)).unwrap();
    let chain = chain_of(&tokens(&[1, 2, 3, 4, 5, 6]));
    let stats = writer.dispatched(FlightId(1), WorkerId(1), &chain, 0);
    assert_eq!((stats.claimed, stats.refused), (4, 2));
    assert_eq!(held_confirmed(&reader.lookup(&chain, BS)), [(1, 4, true)]);
    writer.flight_ended(FlightId(1), FlightEnd::Failed, 1);
    assert!(reader.lookup(&chain, BS).holders().is_empty());
}
