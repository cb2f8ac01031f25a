//! Criterion benchmarks of gateway tokenization with Qwen3's tokenizer (`tokenizer.json` and
//! `tokenizer_config.json` from `scripts/fetch-tokenizers.sh`, under `target/tokenizers/`).
//!
//! Chat bodies of 1k / 8k / 32k tokens: a system prompt (half the tokens), earlier turns, and a
//! last user message of [`TAIL_TOKENS`] tokens; English-like text from a fixed vocabulary.
//! - `tokenize/crate_alone_*`: the `tokenizers` crate encoding the rendered prompt, nothing else
//!   (`Tokenizer::encode_fast`): the baseline of the cold target (within 1.2x).
//! - `tokenize/crate_alone_tail_*`: the crate encoding the last user message alone: what a next
//!   turn cannot avoid, the floor of `head_cached`.
//! - `tokenize/cold_*`: body to IDs through an empty cache: the body read for the template,
//!   rendering, the cut at added tokens, every segment encoded and cached.
//! - `tokenize/head_cached_*`: the same with every segment but the last user message cached (a
//!   conversation's next turn): the target is 50 us at 8k (7.5k tokens seen before).
//! - `tokenize/all_cached_*`: every segment cached (the same prompt again).
//! - `tokenize/render_*`: the body read and the template rendered, alone.
//! - `prepare/*`: the data core's whole preparation (`Router::prepare`: extraction, tokenization
//!   with the head cached, page hashes; no index) next to the same request routed on its text.
//! - `memory`: the L1 cache filled past its bound with 64-token to 2k-token segments: entries,
//!   counted bytes and the process's resident growth (printed, not timed).
//!
//! Run: `cargo bench -p kvgate --bench tokenize` (with mimalloc, the gateway's allocator). Inputs are built outside the timed loops from
//! fixed seeds; each group prints a checksum (`tests/tokenize_perf.rs` runs every benchmark
//! once with tiny sizes in the test pass).

use std::hint::black_box;
use std::path::PathBuf;
use std::sync::Arc;

use criterion::{BatchSize, BenchmarkId, Criterion, Throughput};
use fastrand::Rng;
use kvgate::policy::{PolicyArgs, PolicyMetrics, Prepared, Router};
use kvgate::request::{Endpoint, RoutingHeaders};
use kvgate::tokenize::{
    tokenize_inline, CacheConfig, ModelTokenizer, PromptSource, TokenCache, TokenizerFiles,
    TokenizerSet,
};

// The gateway's allocator: tokenization allocates per piece and per token, and glibc's malloc
// took 60% of the time of `tokenizers` alone under the system allocator.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// Tokens of the last user message: the part of a next turn never seen before.
pub const TAIL_TOKENS: usize = 512;

/// The sizes the benchmarks run.
pub struct Sizes {
    /// Prompt lengths in tokens.
    pub prompt_tokens: Vec<usize>,
    /// Tokens of the last user message.
    pub tail_tokens: usize,
    /// The L1 bound of the memory figure.
    pub memory_bytes: usize,
}

impl Sizes {
    /// What `cargo bench` measures.
    pub fn full() -> Sizes {
        Sizes {
            prompt_tokens: vec![1024, 8192, 32768],
            tail_tokens: TAIL_TOKENS,
            memory_bytes: 50 << 20,
        }
    }

    /// The smoke run of the test pass.
    pub fn tiny() -> Sizes {
        Sizes {
            prompt_tokens: vec![96],
            tail_tokens: 16,
            memory_bytes: 64 << 10,
        }
    }
}

/// Where `scripts/fetch-tokenizers.sh` put the files.
pub fn fixtures_dir() -> PathBuf {
    match std::env::var_os("KVGATE_TOKENIZER_FIXTURES") {
        Some(dir) => PathBuf::from(dir),
        None => PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("target/tokenizers"),
    }
}

/// Qwen3's tokenizer, if its files are there.
pub fn qwen3() -> Option<Arc<ModelTokenizer>> {
    let dir = fixtures_dir().join("qwen3");
    let files = TokenizerFiles {
        tokenizer_json: std::fs::read(dir.join("tokenizer.json")).ok()?,
        tokenizer_config_json: std::fs::read(dir.join("tokenizer_config.json")).ok(),
        chat_template: None,
    };
    Some(Arc::new(
        ModelTokenizer::new("qwen3", files).expect("Qwen3's tokenizer loads"),
    ))
}

const WORDS: &[&str] = &[
    "the",
    "model",
    "answer",
    "question",
    "carefully",
    "system",
    "request",
    "user",
    "cache",
    "engine",
    "token",
    "prefix",
    "worker",
    "latency",
    "throughput",
    "memory",
    "policy",
    "route",
    "because",
    "however",
    "therefore",
    "example",
    "function",
    "value",
    "return",
    "error",
    "document",
    "summary",
    "paragraph",
    "important",
    "consider",
    "following",
    "instructions",
    "always",
    "never",
    "should",
    "would",
    "could",
    "between",
    "within",
    "without",
    "during",
    "before",
    "after",
    "large",
    "small",
    "quickly",
    "slowly",
    "number",
    "string",
    "list",
    "internationalization",
    "configuration",
    "approximately",
    "kvgate",
    "gateway",
    "42",
    "2024",
];

/// Text of about `tokens` tokens (measured with `model`), words with punctuation.
fn text(model: &ModelTokenizer, tokens: usize, rng: &mut Rng) -> String {
    let mut out = String::new();
    loop {
        for _ in 0..32 {
            let word = WORDS[rng.usize(..WORDS.len())];
            if !out.is_empty() {
                out.push(if rng.u8(..12) == 0 { '\n' } else { ' ' });
            }
            out.push_str(word);
            match rng.u8(..10) {
                0 => out.push(','),
                1 => out.push('.'),
                _ => {}
            }
        }
        let count = model.encode(&out, false).map_or(tokens, |ids| ids.len());
        if count >= tokens {
            return out;
        }
    }
}

/// A chat body of about `tokens` tokens: a system prompt of half, earlier turns, and a last user
/// message of `tail` tokens seeded by `tail_seed` (equal seeds, equal tails).
fn chat_body(model: &ModelTokenizer, tokens: usize, tail: usize, tail_seed: u64) -> Vec<u8> {
    let mut rng = Rng::with_seed(tokens as u64);
    let head = tokens.saturating_sub(tail);
    let mut messages =
        vec![serde_json::json!({"role": "system", "content": text(model, head / 2, &mut rng)})];
    let turns = 4;
    let per_message = (head - head / 2) / (2 * turns);
    for _ in 0..turns {
        messages.push(
            serde_json::json!({"role": "user", "content": text(model, per_message, &mut rng)}),
        );
        messages.push(
            serde_json::json!({"role": "assistant", "content": text(model, per_message, &mut rng)}),
        );
    }
    let mut tail_rng = Rng::with_seed(tail_seed);
    messages.push(serde_json::json!({"role": "user", "content": text(model, tail, &mut tail_rng)}));
    serde_json::to_vec(&serde_json::json!({
        "model": "qwen3", "messages": messages, "stream": true, "max_tokens": 256
    }))
    .unwrap_or_default()
}

fn l1_only(bytes: usize) -> CacheConfig {
    CacheConfig {
        l0_entries_max: 0,
        l1_bytes_max: bytes,
    }
}

/// Every benchmark over `sizes`, or `None` without Qwen3's files; returns the checksums.
pub fn run_all(c: &mut Criterion, sizes: &Sizes) -> Option<[u64; 3]> {
    // First, before loading the tokenizer frees memory the allocator would reuse for the cache.
    let memory = memory(sizes);
    let model = qwen3()?;
    Some([
        bench_tokenize(c, &model, sizes),
        bench_prepare(c, &model, sizes),
        memory,
    ])
}

fn ids_of(
    model: &Arc<ModelTokenizer>,
    body: &[u8],
    cache: &mut TokenCache,
    out: &mut Vec<u32>,
) -> usize {
    let prompt = model.prompt(PromptSource::Chat(body)).expect("renders");
    tokenize_inline(model, prompt, cache, out).expect("tokenizes");
    out.len()
}

fn bench_tokenize(c: &mut Criterion, model: &Arc<ModelTokenizer>, sizes: &Sizes) -> u64 {
    let mut group = c.benchmark_group("tokenize");
    let mut checksum = 0u64;
    let mut out = Vec::new();
    for &tokens in &sizes.prompt_tokens {
        let body = chat_body(model, tokens, sizes.tail_tokens, 1);
        let rendered = model
            .prompt(PromptSource::Chat(&body))
            .expect("renders")
            .text;
        let real_tokens = model.encode(&rendered, false).map_or(0, |ids| ids.len());
        println!(
            "tokenize: {tokens}-token body: {real_tokens} tokens, {} bytes rendered",
            rendered.len()
        );
        group.throughput(Throughput::Elements(real_tokens as u64));
        group.bench_with_input(
            BenchmarkId::new("crate_alone", tokens),
            &rendered,
            |b, text| {
                b.iter(|| {
                    black_box(
                        model
                            .inner()
                            .encode_fast(black_box(text.as_str()), false)
                            .map(|e| e.len()),
                    )
                })
            },
        );
        // The last user message alone, as the template renders it: what a next turn must encode.
        let tail = last_message_segment(&rendered);
        group.bench_with_input(
            BenchmarkId::new("crate_alone_tail", tokens),
            &tail,
            |b, text| {
                b.iter(|| {
                    black_box(
                        model
                            .inner()
                            .encode_fast(black_box(text.as_str()), false)
                            .map(|e| e.len()),
                    )
                })
            },
        );
        group.bench_with_input(BenchmarkId::new("cold", tokens), &body, |b, body| {
            b.iter_batched(
                || TokenCache::new(l1_only(64 << 20)),
                |mut cache| black_box(ids_of(model, body, &mut cache, &mut out)),
                BatchSize::SmallInput,
            )
        });
        // The head warmed by the same conversation ending in another last message.
        let warm_body = chat_body(model, tokens, sizes.tail_tokens, 2);
        group.bench_with_input(BenchmarkId::new("head_cached", tokens), &body, |b, body| {
            b.iter_batched(
                || head_cache(model, &warm_body),
                |mut cache| black_box(ids_of(model, body, &mut cache, &mut out)),
                BatchSize::SmallInput,
            )
        });
        let mut all = TokenCache::new(l1_only(64 << 20));
        checksum += ids_of(model, &body, &mut all, &mut out) as u64;
        group.bench_with_input(BenchmarkId::new("all_cached", tokens), &body, |b, body| {
            b.iter(|| black_box(ids_of(model, body, &mut all, &mut out)))
        });
        group.bench_with_input(BenchmarkId::new("render", tokens), &body, |b, body| {
            b.iter(|| black_box(model.prompt(PromptSource::Chat(body)).map(|p| p.text.len())))
        });
        checksum += ids_of(model, &body, &mut all, &mut out) as u64;
    }
    group.finish();
    println!("tokenize checksum: {checksum}");
    checksum
}

/// The text of the prompt's last user message (between its `<|im_start|>` and `<|im_end|>`).
fn last_message_segment(rendered: &str) -> String {
    let end = rendered.rfind("<|im_end|>").unwrap_or(rendered.len());
    let start = rendered[..end]
        .rfind("<|im_start|>")
        .map_or(0, |s| s + "<|im_start|>".len());
    rendered[start..end].to_owned()
}

/// A cache holding the segments of `warm_body`: a conversation whose head the measured body
/// shares (built anew for each iteration, so the measured tail is always cold).
fn head_cache(model: &Arc<ModelTokenizer>, warm_body: &[u8]) -> TokenCache {
    let mut cache = TokenCache::new(l1_only(64 << 20));
    ids_of(model, warm_body, &mut cache, &mut Vec::new());
    cache
}

fn bench_prepare(c: &mut Criterion, model: &Arc<ModelTokenizer>, sizes: &Sizes) -> u64 {
    let mut group = c.benchmark_group("prepare");
    let config = PolicyArgs::default().validate().expect("default policy");
    let set = Arc::new(TokenizerSet::new(vec![(None, model.clone())]));
    let mut checksum = 0u64;
    for &tokens in &sizes.prompt_tokens {
        let body = chat_body(model, tokens, sizes.tail_tokens, 1);
        let mut text_router =
            Router::new(config.clone(), 1, None, Arc::new(PolicyMetrics::default()));
        let mut prepared = Prepared::default();
        let prepare = |router: &mut Router, prepared: &mut Prepared| {
            router
                .prepare(
                    prepared,
                    Endpoint::ChatCompletions,
                    RoutingHeaders::default(),
                    &body,
                    0,
                )
                .expect("a JSON object");
            prepared.request_tokens()
        };
        group.bench_function(BenchmarkId::new("text", tokens), |b| {
            b.iter(|| black_box(prepare(&mut text_router, &mut prepared)))
        });
        let router = || {
            Router::new(config.clone(), 1, None, Arc::new(PolicyMetrics::default()))
                .with_tokenizers(set.clone(), l1_only(64 << 20), usize::MAX)
        };
        let warm_body = chat_body(model, tokens, sizes.tail_tokens, 2);
        group.bench_function(BenchmarkId::new("tokens_head_cached", tokens), |b| {
            b.iter_batched(
                || {
                    let mut router = router();
                    let mut prepared = Prepared::default();
                    router
                        .prepare(
                            &mut prepared,
                            Endpoint::ChatCompletions,
                            RoutingHeaders::default(),
                            &warm_body,
                            0,
                        )
                        .expect("a JSON object");
                    (router, prepared)
                },
                |(mut router, mut prepared)| black_box(prepare(&mut router, &mut prepared)),
                BatchSize::SmallInput,
            )
        });
        let mut warm_router = router();
        checksum += prepare(&mut warm_router, &mut prepared);
        group.bench_function(BenchmarkId::new("tokens_all_cached", tokens), |b| {
            b.iter(|| black_box(prepare(&mut warm_router, &mut prepared)))
        });
        checksum += prepare(&mut warm_router, &mut prepared);
    }
    group.finish();
    println!("prepare checksum: {checksum}");
    checksum
}

/// Resident bytes of this process (`/proc/self/statm`), 0 where unreadable.
fn resident_bytes() -> usize {
    let statm = std::fs::read_to_string("/proc/self/statm").unwrap_or_default();
    let pages: usize = statm
        .split_whitespace()
        .nth(1)
        .and_then(|p| p.parse().ok())
        .unwrap_or(0);
    pages * 4096
}

/// Fills an L1 cache past its bound with segments of 64 to 2,048 tokens and prints what it holds.
fn memory(sizes: &Sizes) -> u64 {
    let mut rng = Rng::with_seed(99);
    let before = resident_bytes();
    let mut cache = TokenCache::new(l1_only(sizes.memory_bytes));
    let mut inserted = 0usize;
    let mut ids_bytes = 0usize;
    while ids_bytes < 2 * sizes.memory_bytes {
        let len = 64 << rng.u32(..6);
        let ids: Vec<u32> = (0..len).map(|_| rng.u32(..150_000)).collect();
        // Random keys: distinct segments.
        cache.put_segment(rng.u64(..), &ids);
        ids_bytes += ids.len() * 4;
        inserted += 1;
    }
    let grown = resident_bytes().saturating_sub(before);
    println!(
        "memory: bound {} B, {} segments inserted ({} B of IDs), {} held, {} B counted, resident +{} B",
        sizes.memory_bytes,
        inserted,
        ids_bytes,
        cache.l1_entries(),
        cache.l1_bytes(),
        grown
    );
    let checksum = cache.l1_entries() as u64;
    println!("memory checksum: {checksum}");
    checksum
}

fn main() {
    let mut criterion = Criterion::default().configure_from_args();
    if run_all(&mut criterion, &Sizes::full()).is_none() {
        eprintln!("Qwen3's tokenizer files are missing: run scripts/fetch-tokenizers.sh first");
        std::process::exit(1);
    }
    criterion.final_summary();
}
