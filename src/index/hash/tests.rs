//! The hash index against its rules: heads per boundary, deepest-first lookups, the three-holder
//! cap, TTL expiry on read and by the sweep, worker removal, per-model gauges, and a model test of
//! the table (probe runs and back-shifting deletes) against a plain map.

use std::collections::HashMap;

use proptest::prelude::*;

use super::*;

const NS: Namespace = Namespace {
    model: 7,
    partition: 0,
};
const TTL_MS: u64 = 180_000;

fn heads(ns: Namespace, tokens: &[u32], boundaries: &[u32]) -> Vec<Head> {
    let pages = TokenPages::of(tokens, 16);
    let mut out = Vec::new();
    request_heads(ns, tokens, &pages, boundaries, &mut out);
    out
}

fn hashes(heads: &[Head]) -> Vec<u64> {
    heads.iter().map(|h| h.hash).collect()
}

fn ids(n: u32) -> Vec<u32> {
    (0..n).map(|i| i * 7 + 3).collect()
}

#[test]
fn a_request_has_a_head_at_each_boundary_it_reaches() {
    let tokens = ids(300);
    let found = heads(NS, &tokens, &[64, 100, 256, 512]);
    let depths: Vec<u32> = found.iter().map(|h| h.tokens).collect();
    assert_eq!(depths, [64, 100, 256], "512 is beyond the request");
    assert!(found.iter().all(|h| h.hash != 0));
    // Equal first N tokens give equal heads whatever follows; one id apart, none past it.
    let mut other = tokens[..256].to_vec();
    other.extend(ids(50).iter().map(|i| i + 1));
    other[120] += 1;
    let theirs = heads(NS, &other, &[64, 100, 256]);
    assert_eq!(theirs[..2], found[..2]);
    assert_ne!(theirs[2], found[2]);
    // Heads off the page grid (100 = 6 pages and 4 ids) count those ids.
    let mut tail = tokens.clone();
    tail[97] += 1;
    assert_eq!(heads(NS, &tail, &[64, 100])[0], found[0]);
    assert_ne!(heads(NS, &tail, &[64, 100])[1], found[1]);
    // Shorter than the smallest boundary: no head.
    assert!(heads(NS, &ids(63), &[64, 100]).is_empty());
}

#[test]
fn namespaces_never_share_a_head() {
    let tokens = ids(128);
    let salted = Namespace {
        partition: 99,
        ..NS
    };
    let other_model = Namespace { model: 8, ..NS };
    let mine = heads(NS, &tokens, &[64, 128]);
    assert_ne!(hashes(&mine), hashes(&heads(salted, &tokens, &[64, 128])));
    assert_ne!(
        hashes(&mine),
        hashes(&heads(other_model, &tokens, &[64, 128]))
    );
    let mut writer = HashIndexWriter::new(64, TTL_MS);
    let reader = writer.reader();
    writer
        .record(NS.model, &hashes(&mine), WorkerId(1), 0)
        .unwrap();
    let theirs = reader.lookup(&heads(salted, &tokens, &[64, 128]), 0);
    assert!(!theirs.has_holder());
}

#[test]
fn lookups_answer_deepest_head_first_with_the_latest_holder_first() {
    let mut writer = HashIndexWriter::new(64, TTL_MS);
    let reader = writer.reader();
    let short = heads(NS, &ids(100), &[64, 128, 256]);
    let long = heads(NS, &ids(300), &[64, 128, 256]);
    writer
        .record(NS.model, &hashes(&short), WorkerId(2), 10)
        .unwrap();
    writer
        .record(NS.model, &hashes(&long), WorkerId(5), 20)
        .unwrap();
    let found = reader.lookup(&long, 30);
    let depths: Vec<u32> = found.hits().iter().map(|h| h.head.tokens).collect();
    assert_eq!(depths, [256, 128, 64], "deepest first");
    assert_eq!(found.hits()[0].holders(), [WorkerId(5)]);
    assert_eq!(found.hits()[1].holders(), [WorkerId(5)]);
    assert_eq!(found.hits()[2].holders(), [WorkerId(5), WorkerId(2)]);
}

#[test]
fn a_head_keeps_three_holders_and_a_fourth_evicts_the_stalest() {
    let mut writer = HashIndexWriter::new(64, TTL_MS);
    let reader = writer.reader();
    let head = heads(NS, &ids(64), &[64]);
    for (worker, tick) in [(1, 100), (2, 50), (3, 200)] {
        writer
            .record(NS.model, &hashes(&head), WorkerId(worker), tick)
            .unwrap();
    }
    // Refreshing a holder moves it, it is not added twice.
    writer
        .record(NS.model, &hashes(&head), WorkerId(2), 300)
        .unwrap();
    let holders = |now| reader.lookup(&head, now).hits()[0].holders().to_vec();
    assert_eq!(holders(300), [WorkerId(2), WorkerId(3), WorkerId(1)]);
    writer
        .record(NS.model, &hashes(&head), WorkerId(4), 400)
        .unwrap();
    assert_eq!(
        holders(400),
        [WorkerId(4), WorkerId(2), WorkerId(3)],
        "1 was stalest"
    );
    // An older tick arriving late does not move a holder back.
    writer
        .record(NS.model, &hashes(&head), WorkerId(4), 10)
        .unwrap();
    assert_eq!(holders(400)[0], WorkerId(4));
}

#[test]
fn with_a_higher_cap_a_head_keeps_more_holders_and_one_more_evicts_the_stalest() {
    let mut writer = HashIndexWriter::new(64, TTL_MS).with_holders_max(5);
    let reader = writer.reader();
    let head = heads(NS, &ids(64), &[64]);
    for (worker, tick) in [(1, 100), (2, 50), (3, 200), (4, 300), (5, 250)] {
        writer
            .record(NS.model, &hashes(&head), WorkerId(worker), tick)
            .unwrap();
    }
    let holders = |now| reader.lookup(&head, now).hits()[0].holders().to_vec();
    let five = [
        WorkerId(4),
        WorkerId(5),
        WorkerId(3),
        WorkerId(1),
        WorkerId(2),
    ];
    assert_eq!(holders(300), five, "five kept, latest first");
    writer
        .record(NS.model, &hashes(&head), WorkerId(6), 400)
        .unwrap();
    let six = [
        WorkerId(6),
        WorkerId(4),
        WorkerId(5),
        WorkerId(3),
        WorkerId(1),
    ];
    assert_eq!(holders(400), six, "2 was stalest");
    // Out of range: clamped to 1..=PLACEMENT_HOLDERS_MAX.
    let one = HashIndexWriter::new(8, TTL_MS).with_holders_max(0);
    assert_eq!(one.holders_max, 1);
    let most = HashIndexWriter::new(8, TTL_MS).with_holders_max(99);
    assert_eq!(most.holders_max, PLACEMENT_HOLDERS_MAX);
}

#[test]
fn holders_expire_on_read_and_the_sweep_drops_them_and_counts_per_model() {
    let mut writer = HashIndexWriter::new(64, 1_000);
    let reader = writer.reader();
    let a = heads(NS, &ids(64), &[64]);
    let other = Namespace { model: 9, ..NS };
    let b = heads(other, &ids(128), &[64, 128]);
    writer
        .record(NS.model, &hashes(&a), WorkerId(1), 0)
        .unwrap();
    writer
        .record(other.model, &hashes(&b), WorkerId(2), 500)
        .unwrap();
    assert_eq!(writer.gauges(), [(7, 1), (9, 2)]);
    assert!(
        reader.lookup(&a, 1_000).has_holder(),
        "at the TTL, still live"
    );
    assert!(
        !reader.lookup(&a, 1_001).has_holder(),
        "past it, not on read"
    );
    assert_eq!(
        writer.live_heads(),
        3,
        "the map still holds it until the sweep"
    );
    let swept = writer.sweep(1_200);
    assert_eq!((swept.holders_dropped, swept.heads_removed), (1, 1));
    assert_eq!(writer.gauges(), [(7, 0), (9, 2)]);
    assert!(reader.lookup(&b, 1_200).has_holder());
    writer.sweep(1_501);
    assert_eq!(writer.gauges(), [(7, 0), (9, 0)]);
    assert_eq!(writer.live_heads(), 0);
}

#[test]
fn a_removed_workers_holdings_go_at_once() {
    let mut writer = HashIndexWriter::new(64, TTL_MS);
    let reader = writer.reader();
    let head = heads(NS, &ids(128), &[64, 128]);
    writer
        .record(NS.model, &hashes(&head[..1]), WorkerId(1), 0)
        .unwrap();
    writer
        .record(NS.model, &hashes(&head), WorkerId(3), 0)
        .unwrap();
    assert_eq!(writer.remove_worker(WorkerId(3)), 2);
    let found = reader.lookup(&head, 0);
    assert!(found.hits()[0].holders().is_empty(), "its only holder went");
    assert_eq!(found.hits()[1].holders(), [WorkerId(1)]);
    assert_eq!(writer.live_heads(), 1);
}

#[test]
fn a_full_map_refuses_new_heads_until_the_sweep() {
    let mut writer = HashIndexWriter::new(8, 100);
    let all: Vec<Vec<Head>> = (0..9).map(|i| heads(NS, &ids(64 + i), &[64 + i])).collect();
    for head in &all[..8] {
        writer
            .record(NS.model, &hashes(head), WorkerId(0), 0)
            .unwrap();
    }
    let refused = writer.record(NS.model, &hashes(&all[8]), WorkerId(0), 0);
    assert_eq!(refused, Err(HashIndexError::Full));
    // An existing head still takes holders.
    writer
        .record(NS.model, &hashes(&all[0]), WorkerId(1), 150)
        .unwrap();
    writer.sweep(150);
    assert_eq!(writer.live_heads(), 1);
    writer
        .record(NS.model, &hashes(&all[8]), WorkerId(0), 150)
        .unwrap();
    assert_eq!(
        writer.record(NS.model, &[1], WorkerId(WORKERS_MAX as u16), 0),
        Err(HashIndexError::WorkerOutOfRange(WorkerId(
            WORKERS_MAX as u16
        )))
    );
}

/// Operations of the model test; the clock moves forward by `advance` ms before each.
#[derive(Clone, Debug)]
enum Op {
    Record { key: u64, worker: u16, advance: u64 },
    Sweep { advance: u64 },
    Remove { worker: u16 },
}

/// Few distinct keys: their homes cluster, so probe runs are long and deletes shift entries.
fn key(k: u64) -> u64 {
    k.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        6 => (1u64..40, 0u16..5, 1u64..200).prop_map(|(k, worker, advance)| Op::Record {
            key: key(k),
            worker,
            advance
        }),
        1 => (1u64..400).prop_map(|advance| Op::Sweep { advance }),
        1 => (0u16..5).prop_map(|worker| Op::Remove { worker }),
    ]
}

proptest! {
    /// After every operation, lookups at the current tick see exactly the live holders a plain
    /// map keeps: at most three, the stalest evicted, expired ones gone, sweeps and removals
    /// applied, nothing lost to the back-shifts of deletes.
    #[test]
    fn the_table_answers_as_a_plain_map(
        ops in proptest::collection::vec(op(), 1..200),
        holders_max in 1..=PLACEMENT_HOLDERS_MAX,
    ) {
        let ttl = 500;
        let mut writer = HashIndexWriter::new(32, ttl).with_holders_max(holders_max);
        let reader = writer.reader();
        let mut model: HashMap<u64, Vec<(u16, u64)>> = HashMap::new();
        let mut clock = 0;
        let live = |t: u64, now: u64| now - t <= ttl;
        for op in &ops {
            match *op {
                Op::Record { key, worker, advance } => {
                    clock += advance;
                    if writer.record(NS.model, &[key], WorkerId(worker), clock).is_err() {
                        prop_assert!(!model.contains_key(&key));
                        prop_assert_eq!(writer.live_heads(), 32);
                        continue;
                    }
                    let holders = model.entry(key).or_default();
                    if let Some(h) = holders.iter_mut().find(|(w, _)| *w == worker) {
                        h.1 = clock;
                        continue;
                    }
                    holders.retain(|(_, t)| live(*t, clock));
                    if holders.len() == holders_max {
                        let stalest = (0..holders.len()).min_by_key(|&i| holders[i].1);
                        holders.remove(stalest.unwrap_or(0));
                    }
                    holders.push((worker, clock));
                }
                Op::Sweep { advance } => {
                    clock += advance;
                    writer.sweep(clock);
                    for holders in model.values_mut() {
                        holders.retain(|(_, t)| live(*t, clock));
                    }
                    model.retain(|_, holders| !holders.is_empty());
                }
                Op::Remove { worker } => {
                    writer.remove_worker(WorkerId(worker));
                    for holders in model.values_mut() {
                        holders.retain(|(w, _)| *w != worker);
                    }
                    model.retain(|_, holders| !holders.is_empty());
                }
            }
            for k in 1u64..40 {
                let head = Head { tokens: 64, hash: key(k) };
                let found = reader.lookup(&[head], clock);
                let got: Vec<u16> = found.hits()[0].holders().iter().map(|w| w.0).collect();
                let mut want: Vec<(u16, u64)> = model
                    .get(&key(k))
                    .map(|h| h.iter().filter(|(_, t)| live(*t, clock)).copied().collect())
                    .unwrap_or_default();
                want.sort_unstable_by_key(|(_, tick)| std::cmp::Reverse(*tick));
                let want: Vec<u16> = want.iter().map(|(w, _)| *w).collect();
                prop_assert_eq!(got, want, "key {}", k);
            }
        }
    }
}

#[test]
fn memory_per_live_head_at_the_most_heads() {
    let writer = HashIndexWriter::new(crate::limits::PLACEMENT_HEADS_MAX, TTL_MS);
    let per_head = writer.memory_bytes() as f64 / crate::limits::PLACEMENT_HEADS_MAX as f64;
    // A slot is a cache line, a third more slots than heads, and the writer's model index.
    assert!(per_head <= 91.0, "{per_head} bytes per live head");
}
