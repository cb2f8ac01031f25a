//! Readers look up continuously while the writer churns (inserts, splits, merges, evictions,
//! purges, reclamation). Every answer must be a prefix of a key that was inserted, held by a
//! worker that was sent such a key. One reader also stalls inside a guard for a while: its
//! lookups must stay valid and reclamation must wait for it. Readers also hand the hints of
//! their lookups of inserted keys to the writer (as data cores do through dispatch records),
//! which inserts those keys with them while the tree churns: hints arrive stale, and a stale
//! hint followed would build a tree whose answers the readers reject.
//! Half the inserts pass the key in a shared buffer (a dispatch record's), which new leaves may
//! keep after the caller dropped its own reference.
//!
//! `stress_short` runs in the normal pass (seconds); `stress_long` is `#[ignore]`d. Set
//! `INDEX_STRESS_SEED` to replay a seed; a failure prints its seed.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crossbeam_queue::ArrayQueue;
use kvgate::ids::WorkerId;
use kvgate::index::{
    token_key, IndexConfig, IndexReader, IndexWriter, LookupHint, Namespace, TokenPages, TreeMatch,
};

const BLOCK_SIZE: usize = 4;
const FAMILIES: usize = 6;
const CONTINUATIONS: usize = 12;
/// Continuations of the one wide family: more than a child table's unsorted tail holds.
const WIDE_CONTINUATIONS: usize = 64;
const NAMESPACES: [Namespace; 2] = [
    Namespace {
        model: 1,
        partition: 0,
    },
    Namespace {
        model: 1,
        partition: 3,
    },
];
/// Hinted records queued for the writer: few, so that some hints are still fresh when the
/// writer takes them (older ones mostly name nodes evicted since).
const RECORDS_QUEUED_MAX: usize = 8;
/// Letters of the text keys, one of them two bytes long in UTF-8.
const LETTERS: [char; 5] = ['a', 'b', 'c', 'ß', 'd'];

/// The fixed universe of keys: families sharing a system prompt, each with continuations.
struct Universe {
    tokens: Vec<Vec<u32>>,
    texts: Vec<String>,
}

impl Universe {
    fn new(seed: u64) -> Self {
        let mut rng = fastrand::Rng::with_seed(seed);
        let mut tokens = Vec::new();
        for family in 0..FAMILIES {
            let system: Vec<u32> = (0..rng.usize(8..200)).map(|_| rng.u32(0..6)).collect();
            // One wide family: its system node's child table sees appends into its spare
            // capacity and rebuilds (tail full, capacity full) while readers scan it.
            let continuations = if family == 0 {
                WIDE_CONTINUATIONS
            } else {
                CONTINUATIONS
            };
            for _ in 0..continuations {
                let mut key = system.clone();
                key.extend((0..rng.usize(0..120)).map(|_| rng.u32(0..6)));
                tokens.push(key);
            }
        }
        let texts = tokens
            .iter()
            .map(|key| key.iter().map(|t| LETTERS[*t as usize % 5]).collect())
            .collect();
        Self { tokens, texts }
    }

    /// The only workers that are ever sent key `k`.
    fn workers(k: usize) -> [u16; 3] {
        [(k % 5) as u16, 5 + (k % 3) as u16, 8 + ((k / 3) % 4) as u16]
    }

    fn check_tokens(&self, query: &[u32], found: &TreeMatch) -> Result<(), String> {
        let matched = found.matched_len as usize;
        if !matched.is_multiple_of(BLOCK_SIZE)
            || matched > query.len()
            || found.request_len as usize != query.len()
        {
            return Err(format!("bad lengths {found:?} for {} tokens", query.len()));
        }
        let holders = |k: usize| self.tokens[k].starts_with(&query[..matched]);
        self.check_tenants(matched, found, holders)
    }

    fn check_text(&self, query: &str, found: &TreeMatch) -> Result<(), String> {
        let matched = found.matched_len as usize;
        let Some((end, _)) = query
            .char_indices()
            .nth(matched)
            .or(Some((query.len(), ' ')))
        else {
            return Err("unreachable".into());
        };
        if matched > query.chars().count() || found.request_len as usize != query.chars().count() {
            return Err(format!("bad lengths {found:?}"));
        }
        let holders = |k: usize| self.texts[k].starts_with(&query[..end]);
        self.check_tenants(matched, found, holders)
    }

    fn check_tenants(
        &self,
        matched: usize,
        found: &TreeMatch,
        holds: impl Fn(usize) -> bool,
    ) -> Result<(), String> {
        let keys: Vec<usize> = (0..self.tokens.len()).filter(|k| holds(*k)).collect();
        if matched > 0 && keys.is_empty() {
            return Err(format!(
                "matched {matched} units that no inserted key has: {found:?}"
            ));
        }
        if matched == 0 && found.tenants_len > 0 {
            return Err(format!("tenants without a match: {found:?}"));
        }
        let tenants = found.tenants();
        for (i, tenant) in tenants.iter().enumerate() {
            if tenants[..i].contains(tenant) {
                return Err(format!("duplicate tenant {found:?}"));
            }
            if !keys
                .iter()
                .any(|k| Universe::workers(*k).contains(&tenant.0))
            {
                return Err(format!(
                    "tenant {tenant:?} was never sent this prefix: {found:?}"
                ));
            }
        }
        Ok(())
    }
}

/// A query: a universe key, cut short or with a changed tail; with the key's index when it is
/// a prefix of that key unchanged.
fn query_tokens(universe: &Universe, rng: &mut fastrand::Rng) -> (Vec<u32>, Option<usize>) {
    let k = rng.usize(..universe.tokens.len());
    let mut query = universe.tokens[k].clone();
    query.truncate(rng.usize(0..=query.len()));
    if rng.bool() && !query.is_empty() {
        let at = rng.usize(..query.len());
        query[at] = 99;
        return (query, None);
    }
    (query, Some(k))
}

/// A reader's lookup handed to the writer: key `k` cut to `len` tokens, in `ns`, with the
/// lookup's hint.
#[derive(Clone, Copy, Debug)]
struct HintedRecord {
    k: usize,
    len: usize,
    ns: Namespace,
    hint: LookupHint,
}

/// Hinted records on their way to the writer (a bounded queue, like the data cores' rings).
type Records = ArrayQueue<HintedRecord>;

fn query_text(universe: &Universe, rng: &mut fastrand::Rng) -> String {
    let key = &universe.texts[rng.usize(..universe.texts.len())];
    let mut query: String = key
        .chars()
        .take(rng.usize(0..=key.chars().count()))
        .collect();
    if rng.bool() {
        query.push('z');
        query.push_str(&key.chars().take(7).collect::<String>());
    }
    query
}

fn reader_loop(
    mut reader: IndexReader,
    universe: Arc<Universe>,
    records: Arc<Records>,
    stop: Arc<AtomicBool>,
    seed: u64,
) -> Result<u64, String> {
    let mut rng = fastrand::Rng::with_seed(seed);
    let mut lookups = 0u64;
    while !stop.load(Ordering::Relaxed) {
        for _ in 0..32 {
            let ns = NAMESPACES[rng.usize(..NAMESPACES.len())];
            let (tokens, key) = query_tokens(&universe, &mut rng);
            let (found, hint) =
                reader.lookup_tokens_hinted(ns, &TokenPages::of(&tokens, BLOCK_SIZE));
            universe.check_tokens(&tokens, &found)?;
            if let Some(k) = key {
                let len = tokens.len();
                // A full queue drops the record, as a data core's full ring would.
                let _ = records.push(HintedRecord { k, len, ns, hint });
            }
            let text = query_text(&universe, &mut rng);
            universe.check_text(&text, &reader.lookup_text(ns, &text))?;
            lookups += 2;
        }
        reader.quiesce();
    }
    Ok(lookups)
}

/// Holds one guard across many writer steps, then checks its lookups are still valid.
fn stalled_reader(
    reader: IndexReader,
    universe: Arc<Universe>,
    stop: Arc<AtomicBool>,
    seed: u64,
) -> Result<u64, String> {
    let mut rng = fastrand::Rng::with_seed(seed);
    let guard = reader.guard();
    let mut lookups = 0;
    let started = Instant::now();
    while !stop.load(Ordering::Relaxed) && started.elapsed() < Duration::from_millis(300) {
        let (tokens, _) = query_tokens(&universe, &mut rng);
        let found = guard.lookup_tokens(NAMESPACES[0], &TokenPages::of(&tokens, BLOCK_SIZE));
        universe.check_tokens(&tokens, &found)?;
        lookups += 1;
        std::thread::sleep(Duration::from_millis(1));
    }
    Ok(lookups)
}

fn churn(
    index: &mut IndexWriter,
    universe: &Universe,
    records: &Records,
    rng: &mut fastrand::Rng,
    tick: u64,
    budget: u64,
) {
    let k = rng.usize(..universe.tokens.len());
    let ns = NAMESPACES[rng.usize(..NAMESPACES.len())];
    let worker = WorkerId(Universe::workers(k)[rng.usize(..3)]);
    match rng.u32(0..100) {
        0..=29 if !records.is_empty() => {
            let Some(HintedRecord { k, len, ns, hint }) = records.pop() else {
                return;
            };
            let worker = WorkerId(Universe::workers(k)[rng.usize(..3)]);
            // The control core's insert: the record's key buffer, which a new leaf may keep.
            let key = token_key(&TokenPages::of(&universe.tokens[k][..len], BLOCK_SIZE));
            let inserted = index.insert_tokens_shared(ns, &key, worker, tick, &hint);
            assert!(inserted.is_ok(), "hinted insert: {inserted:?}");
        }
        0..=79 => {
            let len = rng.usize(0..=universe.tokens[k].len());
            let text = || -> String { universe.texts[k].chars().take(len).collect() };
            let none = LookupHint::default();
            let inserted = match rng.u32(0..4) {
                0 => index.insert_tokens(ns, &universe.tokens[k][..len], worker, tick),
                1 => {
                    let key = token_key(&TokenPages::of(&universe.tokens[k][..len], BLOCK_SIZE));
                    index.insert_tokens_shared(ns, &key, worker, tick, &none)
                }
                2 => index.insert_text(ns, &text(), worker, tick),
                _ => index.insert_text_shared(ns, &Arc::from(text()), worker, tick, &none),
            };
            assert!(inserted.is_ok(), "insert: {inserted:?}");
        }
        80..=93 => {
            index.evict(budget);
        }
        94..=95 => {
            index.remove_worker(WorkerId(rng.u16(0..12)));
        }
        _ => {
            index.reclaim();
        }
    }
}

fn stress(writer_ops: u64, readers: usize) {
    let seed = std::env::var("INDEX_STRESS_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| fastrand::u64(..));
    eprintln!("index stress seed {seed} (INDEX_STRESS_SEED={seed} to replay)");
    let universe = Arc::new(Universe::new(seed));
    let mut index = IndexWriter::new(IndexConfig {
        block_size: BLOCK_SIZE as u32,
    })
    .expect("index");
    let stop = Arc::new(AtomicBool::new(false));
    let records = Arc::new(Records::new(RECORDS_QUEUED_MAX));
    let mut handles = Vec::new();
    for r in 0..readers {
        let (reader, universe, records, stop) = (
            index.reader().expect("reader"),
            Arc::clone(&universe),
            Arc::clone(&records),
            Arc::clone(&stop),
        );
        handles.push(std::thread::spawn(move || {
            reader_loop(reader, universe, records, stop, seed ^ r as u64)
        }));
    }
    let stalled = {
        let (reader, universe, stop) = (
            index.reader().expect("reader"),
            Arc::clone(&universe),
            Arc::clone(&stop),
        );
        std::thread::spawn(move || stalled_reader(reader, universe, stop, seed))
    };
    let mut rng = fastrand::Rng::with_seed(seed);
    let max_pending = AtomicU64::new(0);
    for tick in 1..=writer_ops {
        churn(&mut index, &universe, &records, &mut rng, tick, 3_000);
        if tick % 1024 == 0 {
            max_pending.fetch_max(index.pending_reclaim() as u64, Ordering::Relaxed);
            std::thread::yield_now();
        }
    }
    stop.store(true, Ordering::Relaxed);
    let mut lookups = 0;
    for handle in handles {
        lookups += handle
            .join()
            .expect("reader thread")
            .unwrap_or_else(|e| panic!("seed {seed}: {e}"));
    }
    let stalled_lookups = stalled
        .join()
        .expect("stalled thread")
        .unwrap_or_else(|e| panic!("seed {seed}: {e}"));
    assert!(
        lookups > 0 && stalled_lookups > 0,
        "readers ran: {lookups} {stalled_lookups}"
    );
    index.evict(3_000);
    for gauges in index.gauges() {
        assert!(
            gauges.string.units <= 3_000 && gauges.token.units <= 3_000,
            "{gauges:?}"
        );
    }
    index.reclaim();
    assert_eq!(
        index.pending_reclaim(),
        0,
        "every reader handle is gone: all retired memory freed"
    );
    let hints = index.hint_counts();
    assert!(
        hints.followed > 0,
        "hinted records were followed: {hints:?}"
    );
    eprintln!(
        "{writer_ops} writer ops, {lookups} lookups, max pending {max_pending:?}, hints {hints:?}"
    );
}

#[test]
fn stress_short() {
    stress(20_000, 2);
}

#[test]
#[ignore = "long stress run (2–3 minutes in release): cargo test --release --test index_stress -- --ignored"]
fn stress_long() {
    stress(3_000_000, 3);
}
