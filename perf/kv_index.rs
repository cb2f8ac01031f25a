//! Benchmarks of the KV-event index (`src/index/kv.rs`, `src/kv_events/wire.rs`):
//!
//! - ingestion on the control core: decode one engine batch (SGLang's msgpack layout) and apply
//!   it, in a steady state where 64 workers each store a 32-block chain under a shared 64-block
//!   system prompt and evict the chain they stored `WINDOW` batches earlier (so the index stays
//!   at its working set, ~1M blocks at full size); reported per block;
//! - the data core's query for 8k, 32k and 128k-token requests whose blocks 64 workers hold to
//!   64 different depths (every block has holders to intersect), in an index that also holds
//!   `filler_blocks` other blocks (so the request's blocks are cache misses, as in a gateway
//!   whose engines cache millions of blocks): the block keys chained from the request's page
//!   hashes plus the lookup, and the same with the page hashing (which the request pays once
//!   for every index mode);
//! - memory per indexed block.
//!
//! `cargo bench --bench kv_index` runs the criterion set and prints one JSON line with the
//! memory figures; `tests/kv_index_perf.rs` runs it with tiny sizes in the test pass. Targets
//! (issue #18): ingestion >= 20M blocks/s on one core; query <= 2 us at 8k tokens over 64
//! workers; <= 32 bytes per indexed block.

use std::hint::black_box;
use std::time::{Duration, Instant};

use criterion::Criterion;
use kvgate::control::kv_events::apply_batch;
use kvgate::ids::WorkerId;
use kvgate::index::kv::{chain_hashes, KvIndexWriter};
use kvgate::index::TokenPages;
use kvgate::kv_events::{EventBatch, StreamStats};
use rmp::encode::{write_array_len, write_f64, write_nil, write_sint, write_str, write_uint};

const WORKERS: usize = 64;
const BLOCK: usize = 16;
/// Blocks in each stored chain (one batch stores one chain and evicts an older one).
const CHAIN_BLOCKS: usize = 32;
/// Blocks of the system prompt every chain hangs off.
const SYSTEM_BLOCKS: usize = 64;
/// Workers sharing each chain's content (their blocks share keys).
const SHARING: usize = 8;

/// The sizes a run uses.
pub struct Sizes {
    /// Chains each worker keeps before evicting its oldest.
    pub window: usize,
    /// Request lengths of the query benchmark.
    pub query_tokens: Vec<usize>,
    /// Other blocks in the query benchmark's index.
    pub filler_blocks: usize,
}

impl Sizes {
    /// What `cargo bench` measures: ~1M live blocks, the request lengths.
    pub fn full() -> Sizes {
        Sizes {
            window: 512,
            query_tokens: vec![8192, 32_768, 131_072],
            filler_blocks: 1 << 20,
        }
    }

    /// Tiny sizes for the smoke run of the test pass.
    pub fn tiny() -> Sizes {
        Sizes {
            window: 4,
            query_tokens: vec![256],
            // A chain per worker: each holds alone well under its share of the index.
            filler_blocks: 2048,
        }
    }
}

/// The content of chain `chain` as worker `worker` stores it (shared by `SHARING` workers).
fn chain_tokens(worker: usize, chain: usize) -> Vec<u32> {
    let content = (chain * (WORKERS / SHARING) + worker % (WORKERS / SHARING)) as u32;
    (0..(CHAIN_BLOCKS * BLOCK) as u32)
        .map(|i| 1_000_000 + content.wrapping_mul(7919) + i)
        .collect()
}

fn system_tokens() -> Vec<u32> {
    (0..(SYSTEM_BLOCKS * BLOCK) as u32).collect()
}

/// The engine's hash of block `block` of chain `chain` on `worker` (unique per worker).
fn engine_hash(worker: usize, chain: usize, block: usize) -> i64 {
    ((worker as i64) << 48) | ((chain as i64) << 12) | block as i64 | 1 << 62
}

fn system_hash(worker: usize, block: usize) -> i64 {
    -(((worker as i64) << 16) | block as i64) - 1
}

fn write_stored(out: &mut Vec<u8>, hashes: &[i64], parent: Option<i64>, tokens: &[u32]) {
    write_array_len(out, 6).unwrap();
    write_str(out, "BlockStored").unwrap();
    write_array_len(out, hashes.len() as u32).unwrap();
    for h in hashes {
        write_sint(out, *h).unwrap();
    }
    match parent {
        Some(p) => {
            write_sint(out, p).unwrap();
        }
        None => write_nil(out).unwrap(),
    }
    write_array_len(out, tokens.len() as u32).unwrap();
    for t in tokens {
        write_uint(out, u64::from(*t)).unwrap();
    }
    write_uint(out, BLOCK as u64).unwrap();
    write_nil(out).unwrap();
}

fn write_batch_header(out: &mut Vec<u8>, events: u32) {
    write_array_len(out, 2).unwrap();
    write_f64(out, 1.0).unwrap();
    write_array_len(out, events).unwrap();
}

/// Worker `worker` stores chain `chain` and, once it keeps `window`, evicts `chain - window`.
fn chain_batch(worker: usize, chain: usize, window: usize) -> Vec<u8> {
    let mut out = Vec::with_capacity(4096);
    let evicts = chain >= window;
    write_batch_header(&mut out, 1 + u32::from(evicts));
    if evicts {
        write_array_len(&mut out, 2).unwrap();
        write_str(&mut out, "BlockRemoved").unwrap();
        write_array_len(&mut out, CHAIN_BLOCKS as u32).unwrap();
        for block in 0..CHAIN_BLOCKS {
            write_sint(&mut out, engine_hash(worker, chain - window, block)).unwrap();
        }
    }
    let hashes: Vec<i64> = (0..CHAIN_BLOCKS)
        .map(|b| engine_hash(worker, chain, b))
        .collect();
    let parent = system_hash(worker, SYSTEM_BLOCKS - 1);
    write_stored(
        &mut out,
        &hashes,
        Some(parent),
        &chain_tokens(worker, chain),
    );
    out
}

/// What ingesting batches did.
#[derive(Clone, Copy, Debug, Default)]
struct Ingested {
    /// Blocks stored and removed.
    blocks: u64,
    /// Stores refused (the table full, or a probe run too long) or orphaned: a benchmark that
    /// meets one measures less work than it claims.
    lost: u64,
}

/// Decodes and applies one batch of `worker`'s, as the control core does
/// (`control::kv_events::apply_batch`).
fn ingest(
    writer: &mut KvIndexWriter,
    batch: &mut EventBatch,
    worker: usize,
    payload: &[u8],
) -> Ingested {
    let mut done = Ingested::default();
    if batch.decode(payload).is_err() {
        done.lost += 1;
        return done;
    }
    let mut stats = StreamStats::default();
    apply_batch(writer, WorkerId(worker as u16), batch, &mut stats);
    done.blocks = stats.blocks_stored + stats.blocks_removed;
    done.lost = stats.blocks_orphaned + stats.blocks_refused + stats.blocks_over_share;
    done
}

/// An index where every worker holds the system prompt and `window` chains, its table sized for
/// the distinct blocks of that working set (plus the chains in flight), as
/// `--kv-indexer-max-entries` would size it.
fn steady_index(window: usize) -> (KvIndexWriter, Vec<usize>, u64) {
    let chains = (window + WORKERS) * (WORKERS / SHARING);
    let mut writer = KvIndexWriter::new(chains * CHAIN_BLOCKS + SYSTEM_BLOCKS);
    let mut batch = EventBatch::default();
    let system = system_tokens();
    let mut lost = 0;
    for worker in 0..WORKERS {
        writer.attach(WorkerId(worker as u16)).unwrap();
        let hashes: Vec<i64> = (0..SYSTEM_BLOCKS).map(|b| system_hash(worker, b)).collect();
        let mut payload = Vec::new();
        write_batch_header(&mut payload, 1);
        write_stored(&mut payload, &hashes, None, &system);
        lost += ingest(&mut writer, &mut batch, worker, &payload).lost;
        for chain in 0..window {
            let payload = chain_batch(worker, chain, window);
            lost += ingest(&mut writer, &mut batch, worker, &payload).lost;
        }
    }
    (writer, vec![window; WORKERS], lost)
}

/// Ingestion: blocks per second, measured over whole batches (encoding is not timed), and the
/// stores lost in all (none, in a benchmark that measures what it says).
fn bench_ingestion(c: &mut Criterion, sizes: &Sizes) -> (KvIndexWriter, f64, u64) {
    let (mut writer, mut next_chain, mut lost) = steady_index(sizes.window);
    let mut batch = EventBatch::default();
    let mut worker = 0usize;
    let (mut blocks_total, mut time_total) = (0u64, Duration::ZERO);
    let mut group = c.benchmark_group("kv_index");
    group.bench_function("ingest_batch_32_stored_32_removed", |b| {
        b.iter_custom(|iters| {
            let payloads: Vec<(usize, Vec<u8>)> = (0..iters)
                .map(|_| {
                    worker = (worker + 1) % WORKERS;
                    let chain = next_chain[worker];
                    next_chain[worker] += 1;
                    (worker, chain_batch(worker, chain, sizes.window))
                })
                .collect();
            let started = Instant::now();
            for (worker, payload) in &payloads {
                let done = black_box(ingest(&mut writer, &mut batch, *worker, payload));
                blocks_total += done.blocks;
                lost += done.lost;
            }
            let elapsed = started.elapsed();
            time_total += elapsed;
            elapsed
        })
    });
    group.finish();
    let blocks_per_second = blocks_total as f64 / time_total.as_secs_f64().max(1e-9);
    (writer, blocks_per_second, lost)
}

/// Attaches every worker and stores `blocks` blocks of unrelated 32-block chains, spread over
/// them.
fn fill(writer: &mut KvIndexWriter, blocks: usize) {
    for worker in 0..WORKERS {
        writer.attach(WorkerId(worker as u16)).unwrap();
    }
    let chains = blocks / CHAIN_BLOCKS;
    let mut tokens = vec![0u32; CHAIN_BLOCKS * BLOCK];
    for chain in 0..chains {
        for (i, t) in tokens.iter_mut().enumerate() {
            *t = (chain * CHAIN_BLOCKS * BLOCK + i) as u32 | 1 << 31;
        }
        let hashes: Vec<u64> = (0..CHAIN_BLOCKS)
            .map(|b| (1 << 63) | ((chain * CHAIN_BLOCKS + b) as u64))
            .collect();
        let worker = WorkerId((chain % WORKERS) as u16);
        writer.store(worker, &hashes, None, &tokens, BLOCK).unwrap();
    }
}

/// Queries: a request whose blocks worker w holds to depth (w + 1) / 64 of the request.
fn bench_queries(c: &mut Criterion, sizes: &Sizes) {
    let mut group = c.benchmark_group("kv_index");
    for &tokens in &sizes.query_tokens {
        // Half full: a table at its most refuses a few stores (probe runs too long), and the
        // benchmark's request must be held whole.
        let mut writer = KvIndexWriter::new(2 * (sizes.filler_blocks + tokens / BLOCK + 1));
        fill(&mut writer, sizes.filler_blocks);
        let request: Vec<u32> = (0..tokens as u32)
            .map(|i| i.wrapping_mul(2_654_435_761))
            .collect();
        let blocks = tokens / BLOCK;
        for worker in 0..WORKERS {
            let depth = (blocks * (worker + 1) / WORKERS).max(1);
            let hashes: Vec<u64> = (0..depth).map(|b| ((worker << 32) | b) as u64).collect();
            writer
                .store(
                    WorkerId(worker as u16),
                    &hashes,
                    None,
                    &request[..depth * BLOCK],
                    BLOCK,
                )
                .unwrap();
        }
        let reader = writer.reader();
        let pages = TokenPages::of(&request, BLOCK);
        let mut chain = Vec::new();
        let found = {
            chain_hashes(pages.pages(), &mut chain);
            reader.lookup(&chain, BLOCK)
        };
        assert_eq!(
            found.holders().len(),
            WORKERS,
            "every worker holds the first block"
        );
        assert_eq!(
            found.holders()[0].1 as usize,
            blocks,
            "the deepest worker holds the whole request: the walk goes to its end"
        );
        group.bench_function(format!("query_{tokens}_tokens_64_workers"), |b| {
            b.iter(|| {
                chain_hashes(black_box(pages.pages()), &mut chain);
                black_box(reader.lookup(&chain, BLOCK).len)
            })
        });
        let mut hashed = TokenPages::default();
        group.bench_function(
            format!("query_{tokens}_tokens_64_workers_with_page_hashing"),
            |b| {
                b.iter(|| {
                    hashed.hash(black_box(&request), BLOCK);
                    chain_hashes(hashed.pages(), &mut chain);
                    black_box(reader.lookup(&chain, BLOCK).len)
                })
            },
        );
    }
    group.finish();
}

/// Runs the benchmarks; returns the ingestion rate and memory figures as JSON (also printed).
pub fn run_all(c: &mut Criterion, sizes: &Sizes) -> serde_json::Value {
    let (writer, blocks_per_second, lost) = bench_ingestion(c, sizes);
    bench_queries(c, sizes);
    let entries: usize = (0..WORKERS)
        .map(|w| writer.blocks_of(WorkerId(w as u16)))
        .sum();
    let memory = writer.memory_bytes();
    let report = serde_json::json!({
        "ingested_blocks_per_second": blocks_per_second,
        "lost_stores": lost,
        "distinct_blocks": writer.live_blocks(),
        "entries": entries,
        "memory_bytes": memory,
        "bytes_per_entry": memory as f64 / entries.max(1) as f64,
        "bytes_per_distinct_block": memory as f64 / writer.live_blocks().max(1) as f64,
    });
    println!("{report}");
    report
}

fn main() {
    let mut criterion = Criterion::default()
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(3))
        .configure_from_args();
    run_all(&mut criterion, &Sizes::full());
    criterion.final_summary();
}
