//! Benchmarks of the prefix index (`src/index/`): lookups and records for prompts of 1k, 8k, 32k
//! and 128k tokens (and 4× as many characters) on trees of 1M+ indexed units across 16 and 256
//! workers, lookups while the writer is busy, the writer's insert rate, eviction of half a tree,
//! and bytes per indexed token.
//!
//! `cargo bench --bench index` runs the criterion set; `cargo bench --bench index -- --quick`
//! runs a reduced set with plain timing loops and prints one JSON object as its last line
//! (`scripts/bench-index.sh --quick`); `-- --evict` only halves a 30M-token tree.
//! `tests/index_perf.rs` runs the same code with tiny parameters in the normal test pass, so it
//! cannot rot.
//!
//! Batch figures are the running thread's CPU time (`cpu_now`), not wall time: the machine's two
//! cores are shared by several builds, and wall time would mostly measure waiting for a core.
//! Dispatch figures (`time_dispatches`: lookup plus record, the writer's insert rate) time each
//! step of a dispatch on its own with the monotonic clock (reading the thread's CPU clock costs
//! 0.6 us here), and take medians over dispatches, which a rare preemption does not move.
//!
//! Workload: every prompt starts with one of 16 shared system prompts (a quarter of its length);
//! the tree is filled with such prompts for random workers; a query (a "next turn") repeats the
//! first three quarters of a stored prompt and ends with a new tail.

use std::hint::black_box;
use std::time::{Duration, Instant};

use criterion::Criterion;
use kvgate::ids::WorkerId;
use kvgate::index::{
    token_key, IndexConfig, IndexReader, IndexWriter, LookupHint, Namespace, TokenPages,
};

/// Shared system prompts per tree.
const SYSTEMS: usize = 16;
/// Queries cycled through by each lookup benchmark.
const QUERIES: usize = 64;
/// Distinct queries of the cold-cache lookup measurement.
const COLD_QUERIES: usize = 1024;
/// Tokens per page (`--block-size` default).
const BLOCK_SIZE: u32 = 16;
/// Characters per token in the text workload (the "×4 characters").
const CHARS_PER_TOKEN: usize = 4;
const NS: Namespace = Namespace {
    model: 7,
    partition: 0,
};

/// The gateway's allocator (DESIGN.md section 7), so label and table allocations cost what they
/// cost in production.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// Sizes of one benchmark run.
#[derive(Clone, Debug)]
pub struct Sizes {
    /// Prompt lengths in tokens.
    pub prompt_tokens: Vec<usize>,
    /// Worker counts.
    pub workers: Vec<u16>,
    /// Units (tokens, or characters) the tree holds before measuring.
    pub tree_units: u64,
    /// Inserts timed per insert measurement.
    pub inserts: usize,
    /// Units of the tree whose half is evicted.
    pub evict_tree_units: u64,
    /// Lookups timed per lookup measurement.
    pub lookups: usize,
}

impl Sizes {
    /// The reduced set of `--quick` (under a minute on 2 shared cores).
    pub fn quick() -> Self {
        Self {
            prompt_tokens: vec![8 * 1024],
            workers: vec![16],
            tree_units: 1 << 20,
            inserts: 2_000,
            evict_tree_units: 4 << 20,
            lookups: 20_000,
        }
    }

    /// Tiny sizes for the normal test pass.
    pub fn tiny() -> Self {
        Self {
            prompt_tokens: vec![256],
            workers: vec![4],
            tree_units: 1 << 14,
            inserts: 64,
            evict_tree_units: 1 << 14,
            lookups: 256,
        }
    }
}

/// A filled index and the queries to run against it.
pub struct Fixture {
    /// The writer (for records).
    pub index: IndexWriter,
    /// One reader handle.
    pub reader: IndexReader,
    /// Token queries.
    pub token_queries: Vec<TokenPages>,
    /// Text queries (the same prompts, `CHARS_PER_TOKEN` characters per token).
    pub text_queries: Vec<String>,
    rng: fastrand::Rng,
    systems: Vec<Vec<u32>>,
    stored: Vec<Vec<u32>>,
    workers: u16,
    tick: u64,
    with_text: bool,
}

fn text_of(tokens: &[u32]) -> String {
    let mut text = String::with_capacity(tokens.len() * CHARS_PER_TOKEN);
    for token in tokens {
        for shift in [0, 5, 10] {
            text.push(char::from(b'a' + ((token >> shift) % 26) as u8));
        }
        text.push(' ');
    }
    text
}

impl Fixture {
    /// Fills both trees with prompts of `prompt_tokens` until each holds `tree_units` units.
    pub fn new(prompt_tokens: usize, workers: u16, tree_units: u64, seed: u64) -> Self {
        Self::build(prompt_tokens, workers, tree_units, seed, true)
    }

    /// `new` with the token tree only (`with_text` false) or both trees.
    pub fn build(
        prompt_tokens: usize,
        workers: u16,
        tree_units: u64,
        seed: u64,
        with_text: bool,
    ) -> Self {
        let mut rng = fastrand::Rng::with_seed(seed);
        let system_len = prompt_tokens / 4;
        let systems = (0..SYSTEMS)
            .map(|_| random_tokens(&mut rng, system_len).collect())
            .collect();
        let index = IndexWriter::new(IndexConfig {
            block_size: BLOCK_SIZE,
        })
        .expect("index");
        let reader = index.reader().expect("reader");
        let mut fixture = Self {
            index,
            reader,
            token_queries: Vec::new(),
            text_queries: Vec::new(),
            rng,
            systems,
            stored: Vec::new(),
            workers,
            tick: 0,
            with_text,
        };
        while fixture.units().0 < tree_units || (with_text && fixture.units().1 < tree_units) {
            let prompt = fixture.new_prompt(prompt_tokens);
            fixture.record(&prompt);
            fixture.stored.push(prompt);
        }
        for _ in 0..QUERIES {
            let query = fixture.next_turn();
            fixture.text_queries.push(text_of(&query));
            fixture
                .token_queries
                .push(TokenPages::of(&query, BLOCK_SIZE as usize));
        }
        fixture
    }

    /// (token units, character units) held.
    pub fn units(&self) -> (u64, u64) {
        let gauges = self.index.gauges();
        let tokens = gauges.iter().map(|g| g.token.units).sum();
        (tokens, gauges.iter().map(|g| g.string.units).sum())
    }

    fn new_prompt(&mut self, len: usize) -> Vec<u32> {
        let mut prompt = self.systems[self.rng.usize(..SYSTEMS)].clone();
        let tail = len.saturating_sub(prompt.len());
        prompt.extend(random_tokens(&mut self.rng, tail));
        prompt
    }

    /// A stored prompt's first three quarters with a new last quarter.
    pub fn next_turn(&mut self) -> Vec<u32> {
        let mut query = Vec::new();
        self.next_turn_into(&mut query);
        query
    }

    /// `next_turn` written into `query` (cleared first), allocating nothing once it is large
    /// enough: a temporary buffer freed just before a timed step would hand that step's next
    /// allocation of its size a block hot in cache, which no gateway core gets.
    pub fn next_turn_into(&mut self, query: &mut Vec<u32>) {
        let base = &self.stored[self.rng.usize(..self.stored.len())];
        let keep = base.len() * 3 / 4;
        query.clear();
        kvgate::copy::extend_from_slice(query, &base[..keep]);
        query.extend(random_tokens(&mut self.rng, base.len() - keep));
    }

    /// Records `prompt` for a random worker in the token tree (and the string tree).
    pub fn record(&mut self, prompt: &[u32]) {
        self.tick += 1;
        let worker = WorkerId(self.rng.u16(..self.workers));
        let inserted = self.index.insert_tokens(NS, prompt, worker, self.tick);
        assert_eq!(inserted, Ok(()), "insert tokens");
        if self.with_text {
            let inserted = self
                .index
                .insert_text(NS, &text_of(prompt), worker, self.tick);
            assert_eq!(inserted, Ok(()), "insert text");
        }
    }
}

/// Token ids drawn from a vocabulary as large as the largest in use (Gemma's 256k).
const VOCABULARY: u32 = 1 << 18;

fn random_tokens(rng: &mut fastrand::Rng, len: usize) -> impl Iterator<Item = u32> + '_ {
    (0..len).map(|_| rng.u32(..VOCABULARY))
}

/// Items timed together: one clock read per batch keeps the clock's cost out of the figure,
/// and per-batch figures let a report take the median.
const BATCH: usize = 16;

/// This thread's CPU time. Benchmarks here run on 2 cores shared by several builds (load
/// average near 10), where wall time mostly measures how long a thread waited for a core; the
/// thread's CPU clock counts only the time it ran, page faults included (kernel time).
pub fn cpu_now() -> Duration {
    let mut now = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `clock_gettime` writes one `timespec` through a valid, exclusive pointer; the
    // clock id is a constant the kernel supports for the calling thread.
    let failed = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut now) } != 0;
    if failed {
        return Duration::ZERO;
    }
    Duration::new(now.tv_sec as u64, now.tv_nsec as u32)
}

/// Timings of one measurement: the total, and ns per item of every batch.
#[derive(Clone, Debug, Default)]
pub struct Samples {
    /// Wall time of all items.
    pub total: Duration,
    /// ns per item, one figure per batch.
    pub per_item_ns: Vec<f64>,
}

impl Samples {
    fn push(&mut self, took: Duration, items: usize) {
        self.total += took;
        self.per_item_ns.push(took.as_nanos() as f64 / items as f64);
    }

    /// Median ns per item over batches.
    pub fn p50_ns(&self) -> f64 {
        self.quantile_ns(0.5)
    }

    /// The fastest batch's ns per item (closest to an unloaded machine).
    pub fn min_ns(&self) -> f64 {
        self.quantile_ns(0.0)
    }

    fn quantile_ns(&self, q: f64) -> f64 {
        quantile(&self.per_item_ns, q)
    }
}

/// The `q` quantile of `values` (the nearest rank), NaN for none.
pub fn quantile(values: &[f64], q: f64) -> f64 {
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    let at = ((sorted.len() as f64 - 1.0) * q).round() as usize;
    sorted.get(at).copied().unwrap_or(f64::NAN)
}

/// Token lookups cycling through the fixture's queries (a working set that stays in cache);
/// also a checksum of matches.
pub fn time_token_lookups(fixture: &Fixture, lookups: usize) -> (Samples, u64) {
    time_token_lookups_over(fixture, &fixture.token_queries, lookups)
}

/// Token lookups cycling through `queries`; also a checksum of matches.
pub fn time_token_lookups_over(
    fixture: &Fixture,
    queries: &[TokenPages],
    lookups: usize,
) -> (Samples, u64) {
    let mut checksum = 0u64;
    let mut samples = Samples::default();
    for batch in (0..lookups).collect::<Vec<_>>().chunks(BATCH) {
        let started = cpu_now();
        for i in batch {
            let query = &queries[i % queries.len()];
            let found = fixture.reader.lookup_tokens(NS, black_box(query));
            checksum += u64::from(found.matched_len) + u64::from(found.tenants_len);
        }
        samples.push(cpu_now().saturating_sub(started), batch.len());
    }
    (samples, checksum)
}

/// Text lookups cycling through the fixture's queries; also a checksum of matches.
pub fn time_text_lookups(fixture: &Fixture, lookups: usize) -> (Samples, u64) {
    let mut checksum = 0u64;
    let mut samples = Samples::default();
    for batch in (0..lookups).collect::<Vec<_>>().chunks(BATCH) {
        let started = cpu_now();
        for i in batch {
            let query = &fixture.text_queries[i % fixture.text_queries.len()];
            let found = fixture.reader.lookup_text(NS, black_box(query));
            checksum += u64::from(found.matched_len) + u64::from(found.tenants_len);
        }
        samples.push(cpu_now().saturating_sub(started), batch.len());
    }
    (samples, checksum)
}

/// What one timed batch of records does.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Record {
    /// Insert the next turn's tokens only (the writer's work per dispatch).
    Tokens,
    /// Look the next turn up on the reader, then insert it with the lookup's hint (the data
    /// core's lookup and the control core's insert of its dispatch record).
    LookupThenTokens,
    /// Insert the next turn's text only.
    Text,
}

impl Record {
    /// The eviction budget that keeps the recorded tree at its size: the token tree's tokens,
    /// or the string tree's characters. (One budget evicts both trees, so token records also
    /// shrink a larger string tree: text records are measured first.)
    pub fn budget(self, fixture: &Fixture) -> u64 {
        let (tokens, chars) = fixture.units();
        match self {
            Record::Tokens | Record::LookupThenTokens => tokens,
            Record::Text => chars,
        }
    }
}

/// Turns generated ahead of one timed chunk (bounds the memory of pre-generated prompts).
const RECORD_CHUNK: usize = 256;

/// `count` records of new turns (prompts generated before the clock starts), timed in batches;
/// after each chunk the tree is evicted back to `budget` (not timed).
pub fn time_records(fixture: &mut Fixture, count: usize, record: Record, budget: u64) -> Samples {
    let mut samples = Samples::default();
    let mut left = count;
    while left > 0 {
        let chunk = left.min(RECORD_CHUNK);
        time_records_chunk(fixture, chunk, record, &mut samples);
        fixture.index.evict(budget);
        left -= chunk;
    }
    samples
}

fn time_records_chunk(fixture: &mut Fixture, count: usize, record: Record, samples: &mut Samples) {
    let turns: Vec<Vec<u32>> = (0..count).map(|_| fixture.next_turn()).collect();
    let (texts, keys): (Vec<String>, Vec<TokenPages>) = match record {
        Record::Text => (turns.iter().map(|turn| text_of(turn)).collect(), Vec::new()),
        _ => (
            Vec::new(),
            turns
                .iter()
                .map(|turn| TokenPages::of(turn, BLOCK_SIZE as usize))
                .collect(),
        ),
    };
    let workers: Vec<WorkerId> = (0..count)
        .map(|_| WorkerId(fixture.rng.u16(..fixture.workers)))
        .collect();
    // A data core announces a quiescent state once per event-loop turn (`Router::prepare`
    // right after its lookup); a reader that never did would keep every retired label and table
    // alive, and the records would measure page faults on ever-fresh memory instead.
    fixture.reader.quiesce();
    for batch in (0..count).collect::<Vec<_>>().chunks(BATCH) {
        let started = cpu_now();
        for &i in batch {
            fixture.tick += 1;
            let tick = fixture.tick;
            let inserted = match record {
                Record::Tokens => {
                    let none = LookupHint::default();
                    let worker = workers[i];
                    fixture
                        .index
                        .insert_tokens_hinted(NS, &keys[i], worker, tick, &none)
                }
                Record::LookupThenTokens => {
                    // The data core's lookup, whose hint its dispatch record carries.
                    let (found, hint) = fixture.reader.lookup_tokens_hinted(NS, &keys[i]);
                    black_box(found);
                    fixture.reader.quiesce();
                    let worker = workers[i];
                    fixture
                        .index
                        .insert_tokens_hinted(NS, &keys[i], worker, tick, &hint)
                }
                Record::Text => fixture.index.insert_text(NS, &texts[i], workers[i], tick),
            };
            black_box(inserted.is_ok());
        }
        samples.push(cpu_now().saturating_sub(started), batch.len());
    }
}

/// What one measured dispatch does besides its insert.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Dispatch {
    /// The data core's lookup first, whose hint the record carries to the insert.
    Hinted,
    /// No lookup: the insert walks from the root (a stale hint's cost, the writer's worst case).
    Unhinted,
}

/// Per-dispatch figures, in ns, one entry per dispatch.
#[derive(Clone, Debug, Default)]
pub struct DispatchSamples {
    /// The data core's lookup (with its quiescent state).
    pub lookup: Vec<f64>,
    /// The data core's hashing of the request's pages (`TokenPages::hash`, part of extracting
    /// the routing input).
    pub hash: Vec<f64>,
    /// The data core's copy of the key into the record (`index::token_key`).
    pub key: Vec<f64>,
    /// The control core's insert of the record (and dropping it).
    pub insert: Vec<f64>,
    /// Lookup plus insert of the same dispatch.
    pub lookup_plus_insert: Vec<f64>,
    /// Lookup, key copy and insert of the same dispatch.
    pub whole: Vec<f64>,
    /// ns of all the eviction and reclamation passes between chunks of dispatches.
    pub upkeep_ns: f64,
}

impl DispatchSamples {
    /// Records per second the writer sustains with its upkeep: every insert plus the eviction
    /// and reclamation that keep the tree at its budget, over the whole run (a mean, not a
    /// median: upkeep comes in passes).
    pub fn writer_records_per_s(&self) -> f64 {
        let busy_ns: f64 = self.insert.iter().sum::<f64>() + self.upkeep_ns;
        self.insert.len() as f64 * 1e9 / busy_ns
    }
}

/// The median of per-operation figures.
pub fn median(values: &[f64]) -> f64 {
    quantile(values, 0.5)
}

/// `count` dispatches of new turns, each step of each dispatch timed on its own, as the gateway
/// runs them: the next turn is generated and written into a reused buffer, as extraction leaves
/// it on a data core (not timed); the data core hashes its pages (`TokenPages::hash`, timed
/// apart as `hash`), looks them up (`Dispatch::Hinted`) and copies the key into the record
/// (`index::token_key`); the control core inserts the record with the lookup's hint and drops
/// it. Every `RECORD_CHUNK` dispatches the tree is evicted back to `budget` and reclaimed, as
/// the control core's upkeep does (timed apart: `upkeep_ns`).
///
/// Wall-clock time around each step (a monotonic clock read costs about 30 ns here, included):
/// per-step timing leaves out the turn's generation, and the median over dispatches is robust
/// to the rare preemption inside a step of a few µs. `time_records` instead times batches of
/// turns generated 256 at a time beforehand, which leaves each query cold in memory where a
/// data core has just written it.
pub fn time_dispatches(
    fixture: &mut Fixture,
    count: usize,
    dispatch: Dispatch,
    budget: u64,
) -> DispatchSamples {
    let mut samples = DispatchSamples::default();
    let (mut ids, mut input): (Vec<u32>, TokenPages) = Default::default();
    let ns_between = |from: Instant, to: Instant| to.duration_since(from).as_nanos() as f64;
    for done in 1..=count {
        fixture.next_turn_into(&mut ids);
        fixture.tick += 1;
        let (tick, worker) = (fixture.tick, WorkerId(fixture.rng.u16(..fixture.workers)));
        let hashing = Instant::now();
        input.hash(black_box(&ids), BLOCK_SIZE as usize);
        let started = Instant::now();
        samples.hash.push(ns_between(hashing, started));
        let hint = match dispatch {
            Dispatch::Hinted => {
                let (found, hint) = fixture.reader.lookup_tokens_hinted(NS, black_box(&input));
                black_box(found);
                hint
            }
            Dispatch::Unhinted => LookupHint::default(),
        };
        fixture.reader.quiesce();
        let looked_up = Instant::now();
        let key = token_key(&input);
        let keyed = Instant::now();
        let inserted = fixture
            .index
            .insert_tokens_shared(NS, &key, worker, tick, &hint);
        drop(key);
        let recorded = Instant::now();
        black_box(inserted.is_ok());
        let (lookup, insert) = (ns_between(started, looked_up), ns_between(keyed, recorded));
        samples.lookup.push(lookup);
        samples.key.push(ns_between(looked_up, keyed));
        samples.insert.push(insert);
        samples.lookup_plus_insert.push(lookup + insert);
        samples.whole.push(ns_between(started, recorded));
        if done % RECORD_CHUNK == 0 {
            let started = Instant::now();
            fixture.index.evict(budget);
            fixture.index.reclaim();
            samples.upkeep_ns += ns_between(started, Instant::now());
        }
    }
    samples
}

/// Lookups on a reader thread while the writer records continuously on this one: the median
/// ns per lookup with the writer busy, and the writer's records per second (from its median).
pub fn time_lookups_while_writing(fixture: &mut Fixture, lookups: usize) -> (f64, f64) {
    let mut reader = fixture.reader.try_clone().expect("reader");
    let queries = fixture.token_queries.clone();
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let stop_reader = std::sync::Arc::clone(&stop);
    let lookup_thread = std::thread::spawn(move || {
        let mut samples = Samples::default();
        for batch in (0..lookups).collect::<Vec<_>>().chunks(BATCH) {
            let started = cpu_now();
            for i in batch {
                black_box(reader.lookup_tokens(NS, &queries[i % queries.len()]));
            }
            samples.push(cpu_now().saturating_sub(started), batch.len());
            reader.quiesce();
        }
        stop_reader.store(true, std::sync::atomic::Ordering::Relaxed);
        samples.p50_ns()
    });
    let budget = fixture.units().0;
    let mut records = Samples::default();
    while !stop.load(std::sync::atomic::Ordering::Relaxed) {
        let batch = time_records(fixture, 64, Record::Tokens, budget);
        records.per_item_ns.extend(batch.per_item_ns);
        fixture.index.reclaim();
    }
    let per_s = 1e9 / records.p50_ns();
    (lookup_thread.join().expect("lookup thread"), per_s)
}

/// Evicts half of a token tree of at least `units` tokens:
/// (seconds, entries evicted, tokens evicted, tokens held before).
pub fn time_evict_half(units: u64, prompt_tokens: usize, seed: u64) -> (f64, u64, u64, u64) {
    let mut fixture = Fixture::build(prompt_tokens, 16, units, seed, false);
    let held = fixture.units().0;
    let started = cpu_now();
    let stats = fixture.index.evict(held / 2);
    (
        cpu_now().saturating_sub(started).as_secs_f64(),
        stats.entries,
        stats.units,
        held,
    )
}

/// Bytes per indexed unit (counted in the index's arenas), token tree and string tree.
pub fn bytes_per_unit(fixture: &Fixture) -> (f64, f64) {
    let memory = fixture.index.memory();
    let (tokens, chars) = fixture.units();
    (
        memory.token.total_bytes() as f64 / tokens as f64,
        memory.string.total_bytes() as f64 / chars as f64,
    )
}

/// The reduced run: every figure `scripts/bench-index.sh --quick` reports, as JSON.
pub fn quick_report(sizes: &Sizes) -> serde_json::Value {
    let prompt = sizes.prompt_tokens[0];
    let mut fixture = Fixture::new(prompt, sizes.workers[0], sizes.tree_units, 1);
    let (token, token_sum) = time_token_lookups(&fixture, sizes.lookups);
    let (text, text_sum) = time_text_lookups(&fixture, sizes.lookups / 4);
    // Distinct next turns whose queries and paths do not fit in the caches (32 MiB at 8k).
    let cold: Vec<TokenPages> = (0..COLD_QUERIES)
        .map(|_| TokenPages::of(&fixture.next_turn(), BLOCK_SIZE as usize))
        .collect();
    let (cold_lookups, _) = time_token_lookups_over(&fixture, &cold, COLD_QUERIES);
    drop(cold);
    // Text records first: the token records' eviction would shrink the string tree.
    let text_budget = Record::Text.budget(&fixture);
    let text_insert = time_records(&mut fixture, sizes.inserts / 4, Record::Text, text_budget);
    let budget = Record::Tokens.budget(&fixture);
    let insert = time_records(&mut fixture, sizes.inserts, Record::Tokens, budget);
    let both = time_records(
        &mut fixture,
        sizes.inserts,
        Record::LookupThenTokens,
        budget,
    );
    let dispatches = time_dispatches(&mut fixture, sizes.inserts, Dispatch::Hinted, budget);
    let (busy_ns, busy_records) = time_lookups_while_writing(&mut fixture, sizes.lookups);
    let (bytes_token, bytes_char) = bytes_per_unit(&fixture);
    drop(fixture);
    let mut small = Fixture::build(1024, sizes.workers[0], sizes.tree_units, 2, false);
    let small_budget = small.units().0;
    let small_insert = time_records(&mut small, sizes.inserts * 4, Record::Tokens, small_budget);
    let small_hinted = time_dispatches(
        &mut small,
        sizes.inserts * 4,
        Dispatch::Hinted,
        small_budget,
    );
    let small_unhinted = time_dispatches(
        &mut small,
        sizes.inserts * 4,
        Dispatch::Unhinted,
        small_budget,
    );
    drop(small);
    let (evict_s, evict_entries, evict_units, evict_held) =
        time_evict_half(sizes.evict_tree_units, 1024, 3);
    let lookup_plus_record = median(&dispatches.lookup_plus_insert);
    let inserts_per_s = 1e9 / median(&small_hinted.insert);
    let mut report = serde_json::json!({
        "prompt_tokens": prompt,
        "workers": sizes.workers[0],
        "tree_tokens": budget,
        "note": "each figure: the median over `rounds` runs of the quick set on fresh fixtures (rounds_* lists each run's value of the targets' figures); within a run, lookup_plus_record_*, dispatch_*, writer_inserts_per_s and writer_inserts_unhinted_per_s: medians over dispatches of each step timed on its own (time_dispatches); the rest (and *_pregenerated*): thread CPU time, medians over batches of 16 of turns generated beforehand, *_min_ns the fastest batch",
        "lookup_8k_tokens_ns": token.p50_ns(),
        "lookup_8k_tokens_min_ns": token.min_ns(),
        "lookup_8k_tokens_cold_ns": cold_lookups.p50_ns(),
        "lookup_32k_chars_ns": text.p50_ns(),
        "lookup_32k_chars_min_ns": text.min_ns(),
        "record_8k_tokens_ns": insert.p50_ns(),
        "record_8k_tokens_min_ns": insert.min_ns(),
        "lookup_plus_record_8k_tokens_ns": lookup_plus_record,
        "dispatch_lookup_8k_tokens_ns": median(&dispatches.lookup),
        "dispatch_record_key_8k_tokens_ns": median(&dispatches.key),
        "dispatch_insert_8k_tokens_ns": median(&dispatches.insert),
        "dispatch_whole_8k_tokens_ns": median(&dispatches.whole),
        "lookup_plus_record_8k_tokens_pregenerated_ns": both.p50_ns(),
        "lookup_plus_record_8k_tokens_pregenerated_min_ns": both.min_ns(),
        "record_32k_chars_ns": text_insert.p50_ns(),
        "lookup_8k_tokens_writer_busy_ns": busy_ns,
        "writer_records_8k_per_s_during_lookups": busy_records,
        "writer_inserts_per_s": inserts_per_s,
        "writer_inserts_unhinted_per_s": 1e9 / median(&small_unhinted.insert),
        "writer_records_per_s_with_upkeep": small_hinted.writer_records_per_s(),
        "writer_records_unhinted_per_s_with_upkeep": small_unhinted.writer_records_per_s(),
        "writer_records_8k_per_s_with_upkeep": dispatches.writer_records_per_s(),
        "writer_inserts_pregenerated_per_s": 1e9 / small_insert.p50_ns(),
        "writer_inserts_pregenerated_per_s_best": 1e9 / small_insert.min_ns(),
        "writer_inserts_prompt_tokens": 1024,
        "evict_tree_tokens": evict_held,
        "evict_tokens_evicted": evict_units,
        "evict_half_s": evict_s,
        "evict_half_entries": evict_entries,
        "bytes_per_token": bytes_token,
        "bytes_per_char": bytes_char,
        "ratio_lookup_plus_record_8k_to_3us": lookup_plus_record / 3000.0,
        "ratio_lookup_32k_chars_to_5us": text.p50_ns() / 5000.0,
        "ratio_inserts_per_s_to_1m": inserts_per_s / 1e6,
        "ratio_bytes_per_token_to_16": bytes_token / 16.0,
        "checksum": token_sum + text_sum,
    });
    // Apart: one more field in the literal passes `json!`'s recursion limit.
    report["dispatch_hash_8k_tokens_ns"] = median(&dispatches.hash).into();
    report
}

/// Rounds of the quick set `--quick` runs by default: one round is half a second, and the
/// host's other tenants (sharing its caches and memory bandwidth) move one round's figures by up
/// to 2x between seconds, so one round says little about the build.
pub const QUICK_ROUNDS: usize = 7;

/// The figures whose every round `quick_rounds` also lists (the targets' own figures).
const TARGET_FIGURES: [&str; 4] = [
    "lookup_plus_record_8k_tokens_ns",
    "writer_inserts_per_s",
    "lookup_32k_chars_ns",
    "bytes_per_token",
];

/// `rounds` runs of the quick set, each on a fresh fixture, merged by `merge_rounds`.
pub fn quick_rounds(sizes: &Sizes, rounds: usize) -> serde_json::Value {
    let reports: Vec<serde_json::Value> = (0..rounds.max(1)).map(|_| quick_report(sizes)).collect();
    merge_rounds(&reports)
}

/// One report of several rounds: each figure is the median over the rounds (whole numbers stay
/// whole), text fields are the first round's, and `rounds_<figure>` lists every round's value of
/// the targets' figures, in order, so their spread is in the report.
pub fn merge_rounds(reports: &[serde_json::Value]) -> serde_json::Value {
    let Some(serde_json::Value::Object(first)) = reports.first() else {
        return serde_json::Value::Null;
    };
    let mut merged = serde_json::Map::new();
    for (name, value) in first {
        let values: Vec<&serde_json::Value> = reports.iter().filter_map(|r| r.get(name)).collect();
        let figures: Vec<f64> = values.iter().filter_map(|v| v.as_f64()).collect();
        let merged_value = if figures.len() < values.len() {
            value.clone()
        } else if values.iter().all(|v| v.is_u64()) {
            // Counts and checksums, far below 2^53: exact through f64.
            serde_json::json!(median(&figures) as u64)
        } else {
            serde_json::json!(median(&figures))
        };
        merged.insert(name.clone(), merged_value);
    }
    for name in TARGET_FIGURES {
        let each: Vec<serde_json::Value> = reports
            .iter()
            .filter_map(|r| r.get(name))
            .cloned()
            .collect();
        merged.insert(format!("rounds_{name}"), serde_json::Value::Array(each));
    }
    merged.insert("rounds".into(), serde_json::json!(reports.len()));
    serde_json::Value::Object(merged)
}

/// Records one measurement of the quick set many times, for `perf record` or callgrind:
/// `-- --profile record|lookup-record|text|insert-1k|dispatch-8k|dispatch-1k [RECORDS]`;
/// returns its median ns per record. The `dispatch-*` kinds run `time_dispatches` (hinted),
/// whose steps callgrind can single out with `--toggle-collect='*time_dispatches*'`.
pub fn profile_loop(kind: &str, records: usize) -> String {
    let sizes = Sizes::quick();
    let (prompt, record) = match kind {
        "record" => (sizes.prompt_tokens[0], Some(Record::Tokens)),
        "lookup-record" => (sizes.prompt_tokens[0], Some(Record::LookupThenTokens)),
        "text" => (sizes.prompt_tokens[0], Some(Record::Text)),
        "insert-1k" => (1024, Some(Record::Tokens)),
        "dispatch-8k" => (sizes.prompt_tokens[0], None),
        "dispatch-1k" => (1024, None),
        _ => {
            return format!(
            "unknown profile {kind:?}: record|lookup-record|text|insert-1k|dispatch-8k|dispatch-1k"
        )
        }
    };
    let with_text = record == Some(Record::Text);
    let mut fixture = Fixture::build(prompt, sizes.workers[0], sizes.tree_units, 2, with_text);
    let budget = record.unwrap_or(Record::Tokens).budget(&fixture);
    match record {
        Some(record) => {
            let samples = time_records(&mut fixture, records, record, budget);
            format!(
                "{kind}: {:.0} ns per record (median of batches)",
                samples.p50_ns()
            )
        }
        None => {
            let samples = time_dispatches(&mut fixture, records, Dispatch::Hinted, budget);
            format!(
                "{kind}: lookup {:.0} ns, key {:.0} ns, insert {:.0} ns (medians); {:.0} records/s with upkeep",
                median(&samples.lookup),
                median(&samples.key),
                median(&samples.insert),
                samples.writer_records_per_s()
            )
        }
    }
}

/// One benchmark body: runs `iters` iterations and returns the time they took (the shape of
/// criterion's `iter_custom`, so the normal test pass can call the same bodies directly).
pub type Body<'f> = Box<dyn FnMut(u64) -> Duration + 'f>;

/// Calls `run(group, name, body)` for every benchmark of the set: per prompt size and worker
/// count, token and text lookups and three kinds of records.
pub fn for_each_case(sizes: &Sizes, run: &mut dyn FnMut(&str, String, Body<'_>)) {
    for &prompt in &sizes.prompt_tokens {
        for &workers in &sizes.workers {
            let tree_units = sizes.tree_units.max(16 * prompt as u64);
            let seed = prompt as u64 ^ u64::from(workers);
            let fixture = std::cell::RefCell::new(Fixture::new(prompt, workers, tree_units, seed));
            let group = format!("index/{prompt}tok/{workers}w");
            run(
                &group,
                format!("lookup_tokens/{prompt}"),
                Box::new(|iters| {
                    let fixture = fixture.borrow();
                    let started = cpu_now();
                    black_box(time_token_lookups(&fixture, iters as usize));
                    cpu_now().saturating_sub(started)
                }),
            );
            let chars = prompt * CHARS_PER_TOKEN;
            run(
                &group,
                format!("lookup_text/{chars}"),
                Box::new(|iters| {
                    let fixture = fixture.borrow();
                    let started = cpu_now();
                    black_box(time_text_lookups(&fixture, iters as usize));
                    cpu_now().saturating_sub(started)
                }),
            );
            // Text first: the token records' eviction would shrink the string tree.
            let records = [
                ("record_text", Record::Text),
                ("record_tokens", Record::Tokens),
                ("lookup_plus_record_tokens", Record::LookupThenTokens),
            ];
            for (name, record) in records {
                let budget = record.budget(&fixture.borrow());
                run(
                    &group,
                    format!("{name}/{prompt}"),
                    Box::new(|iters| {
                        let mut fixture = fixture.borrow_mut();
                        time_records(&mut fixture, iters as usize, record, budget).total
                    }),
                );
            }
            // The quick set's lookup plus record: each dispatch's lookup and the hinted insert of
            // its record, timed apart from the turn's generation and the eviction between chunks.
            let budget = Record::Tokens.budget(&fixture.borrow());
            run(
                &group,
                format!("dispatch_lookup_plus_insert/{prompt}"),
                Box::new(|iters| {
                    let mut fixture = fixture.borrow_mut();
                    let dispatches =
                        time_dispatches(&mut fixture, iters as usize, Dispatch::Hinted, budget);
                    let ns: f64 = dispatches.lookup_plus_insert.iter().sum();
                    Duration::from_nanos(ns as u64)
                }),
            );
        }
    }
}

/// The criterion set (short runs: the machine is 2 shared cores).
pub fn criterion_set(c: &mut Criterion, sizes: &Sizes) {
    for_each_case(sizes, &mut |group, name, mut body| {
        let mut group = c.benchmark_group(group);
        group
            .sample_size(10)
            .warm_up_time(Duration::from_millis(300));
        group.measurement_time(Duration::from_secs(1));
        group.bench_function(name, |b| b.iter_custom(&mut body));
        group.finish();
    });
}

/// The full criterion sizes.
pub fn full_sizes() -> Sizes {
    Sizes {
        prompt_tokens: vec![1024, 8 * 1024, 32 * 1024, 128 * 1024],
        workers: vec![16, 256],
        tree_units: 1 << 20,
        inserts: 2_000,
        evict_tree_units: 30 << 20,
        lookups: 20_000,
    }
}

#[allow(dead_code)]
fn main() {
    let args: Vec<String> = std::env::args().collect();
    if args.iter().any(|arg| arg == "--evict") {
        let (evict_s, entries, units, held) =
            time_evict_half(full_sizes().evict_tree_units, 1024, 3);
        println!("evict_half: {units} of {held} tokens, {entries} entries in {evict_s:.3} s");
        return;
    }
    if let Some(at) = args.iter().position(|arg| arg == "--profile") {
        let kind = args.get(at + 1).map(String::as_str).unwrap_or("");
        let records = args.get(at + 2).and_then(|n| n.parse().ok());
        println!("{}", profile_loop(kind, records.unwrap_or(100_000)));
        return;
    }
    if args.iter().any(|arg| arg == "--quick") {
        let rounds = args
            .iter()
            .position(|arg| arg == "--rounds")
            .and_then(|at| args.get(at + 1)?.parse().ok())
            .unwrap_or(QUICK_ROUNDS);
        println!("{}", quick_rounds(&Sizes::quick(), rounds));
        return;
    }
    let mut criterion = Criterion::default().configure_from_args();
    let sizes = full_sizes();
    criterion_set(&mut criterion, &sizes);
    if args.iter().any(|arg| arg == "--bench") {
        let (evict_s, entries, units, held) = time_evict_half(sizes.evict_tree_units, 1024, 3);
        println!("evict_half: {units} of {held} tokens, {entries} entries in {evict_s:.3} s");
        println!("{}", quick_rounds(&Sizes::quick(), QUICK_ROUNDS));
    }
    criterion.final_summary();
}
