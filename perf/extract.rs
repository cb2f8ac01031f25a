//! Criterion benchmarks of routing-input extraction (issue 21) and of the gateway's CPU per
//! routed request.
//!
//! - `extract/<reader>/<body>`: the readers side by side on the same bodies in one run:
//!   `reference` (the `serde_json` visitors, `request::extract_reference`, what the gateway ran
//!   before), `scan` (`request::extract`, the one-pass scanner the gateway runs now) and
//!   `sonic_lazy` (sonic-rs's lazy iterators reading the same fields of these body shapes: a
//!   candidate measured, not a full implementation of the extraction rules). Bodies: a small chat
//!   body (~300 B), the 36 KB chat body of `scripts/bench-proxy.sh` (`BENCH_BODY=36k`), an
//!   8k-token chat body (~48 KB, `perf/policy.rs`'s shape), the same with a `\n` escape every
//!   ten words, and `/generate` with 8,192 `input_ids`.
//! - `routed/<case>`: one routed request's gateway CPU outside I/O: `Router::prepare`
//!   (extraction, page hashes, the index lookup, here a fixed answer: the index has its own
//!   benchmark), `Router::choose` (the decision over 16 workers) and `Router::record` (the record
//!   key, one copy of the key), for the 8k-token chat body and `/generate` with 8k `input_ids`
//!   in tree mode, and `/generate` in hash mode (heads at 2048, 4096 and 8192 tokens).
//!
//! Run: `cargo bench -p kvgate --bench extract --features bench-sonic` (without the feature,
//! sonic-rs is left out: the test pass does not build it). Inputs are built outside the timed loops from
//! fixed seeds; each run prints a checksum so a broken bench cannot pass silently.
//! `tests/extract_perf.rs` runs every benchmark once in the normal test pass.

use std::hint::black_box;
use std::sync::Arc;

use criterion::{BenchmarkId, Criterion, Throughput};
use fastrand::Rng;
use kvgate::ids::WorkerId;
use kvgate::index::{Namespace, TreeMatch};
use kvgate::policy::{
    CacheIndexKind, IndexKey, IndexLookup, Lookup, PolicyArgs, PolicyMetrics, Prepared, Router,
};
use kvgate::request::{extract, extract_reference, Endpoint, RoutingHeaders, RoutingInput};
#[cfg(feature = "bench-sonic")]
use sonic_rs::JsonValueTrait;

/// Workers in the decision snapshot.
#[path = "worker_loads.rs"]
mod worker_loads;

const WORKERS: usize = 16;

/// The sizes the benchmarks run.
pub struct Sizes {
    /// Words in the 36 KB body's shared system prompt (3,600 in `bench-proxy.sh`).
    pub system_words: usize,
    /// Tokens of the large chat and `/generate` bodies.
    pub prompt_tokens: usize,
}

impl Sizes {
    /// The sizes `cargo bench` measures.
    pub fn full() -> Sizes {
        Sizes {
            system_words: 3600,
            prompt_tokens: 8192,
        }
    }

    /// Tiny sizes for the smoke run of the test pass.
    pub fn tiny() -> Sizes {
        Sizes {
            system_words: 8,
            prompt_tokens: 64,
        }
    }
}

/// Every benchmark of this file; returns the checksums they print.
pub fn run_all(c: &mut Criterion, sizes: &Sizes) -> [u64; 2] {
    [bench_extract(c, sizes), bench_routed(c, sizes)]
}

fn words(count: usize, rng: &mut Rng, newline_every: Option<usize>) -> String {
    let mut text = String::with_capacity(count * 7);
    for i in 0..count {
        if i > 0 {
            let newline = newline_every.is_some_and(|n| i % n == 0);
            text.push(if newline { '\n' } else { ' ' });
        }
        for _ in 0..rng.usize(3..8) {
            text.push(rng.lowercase());
        }
    }
    text
}

fn json(value: serde_json::Value) -> Vec<u8> {
    serde_json::to_vec(&value).unwrap_or_default()
}

/// `scripts/bench-proxy.sh`'s chat body: a system prompt, one question, `max_tokens`.
fn proxy_chat_body(system_words: usize) -> Vec<u8> {
    let mut system = String::from("You are a helpful assistant.");
    for i in 1..=system_words {
        system.push_str(&format!(" keeper{}", i % 997));
    }
    json(serde_json::json!({
        "model": "sim-model",
        "messages": [
            {"role": "system", "content": system},
            {"role": "user", "content": "Question 3: summarize the plot of a short story about a lighthouse keeper in one sentence."}
        ],
        "max_tokens": 8
    }))
}

/// `perf/policy.rs`'s chat body: a system prompt (half the tokens), a user turn of text parts
/// (the rest), and the usual sampling fields.
fn chat_body(tokens: usize, rng: &mut Rng, newline_every: Option<usize>) -> Vec<u8> {
    let system = words(tokens / 2, rng, newline_every);
    let user = words(tokens - tokens / 2, rng, newline_every);
    json(serde_json::json!({
        "model": "meta-llama/Llama-3.1-8B-Instruct",
        "messages": [
            {"role": "system", "content": system},
            {"role": "user", "content": [{"type": "text", "text": user}]}
        ],
        "temperature": 0.7, "max_tokens": 256, "stream": true,
        "stream_options": {"include_usage": true}
    }))
}

fn generate_body(tokens: usize, rng: &mut Rng) -> Vec<u8> {
    let ids: Vec<u32> = (0..tokens).map(|_| rng.u32(..128_000)).collect();
    json(serde_json::json!({
        "input_ids": ids,
        "sampling_params": {"temperature": 0.0, "max_new_tokens": 128},
        "stream": false
    }))
}

/// The `/generate` body as Python's `json.dumps` writes it (what a Python client sends): a
/// space after every comma and colon.
fn generate_body_spaced(tokens: usize, rng: &mut Rng) -> Vec<u8> {
    let ids: Vec<String> = (0..tokens)
        .map(|_| rng.u32(..128_000).to_string())
        .collect();
    format!(
        r#"{{"input_ids": [{}], "sampling_params": {{"temperature": 0.0, "max_new_tokens": 128}}, "stream": false}}"#,
        ids.join(", ")
    )
    .into_bytes()
}

/// The bodies of `extract/*`: name, endpoint, bytes.
pub fn bodies(sizes: &Sizes) -> Vec<(String, Endpoint, Vec<u8>)> {
    let mut rng = Rng::with_seed(42);
    let tokens = sizes.prompt_tokens;
    vec![
        (
            "chat_small".into(),
            Endpoint::ChatCompletions,
            proxy_chat_body(0),
        ),
        (
            "chat_36k".into(),
            Endpoint::ChatCompletions,
            proxy_chat_body(sizes.system_words),
        ),
        (
            format!("chat_{tokens}_tokens"),
            Endpoint::ChatCompletions,
            chat_body(tokens, &mut rng, None),
        ),
        (
            format!("chat_{tokens}_tokens_newlines"),
            Endpoint::ChatCompletions,
            chat_body(tokens, &mut rng, Some(10)),
        ),
        (
            format!("generate_{tokens}_ids"),
            Endpoint::Generate,
            generate_body(tokens, &mut rng),
        ),
        (
            format!("generate_{tokens}_ids_spaced"),
            Endpoint::Generate,
            generate_body_spaced(tokens, &mut rng),
        ),
    ]
}

#[cfg(feature = "bench-sonic")]
/// sonic-rs's lazy iterators over the fields these bodies carry: `model`, the messages'
/// `content` (a string or text parts), `max_tokens`, `input_ids`. Returns the key's length.
fn sonic_lazy(body: &[u8], text: &mut String, tokens: &mut Vec<u32>) -> Option<usize> {
    text.clear();
    tokens.clear();
    let mut model_len = 0;
    for entry in sonic_rs::to_object_iter(body) {
        let (key, value) = entry.ok()?;
        match &*key {
            "model" => model_len = value.as_str()?.len(),
            "messages" => {
                for message in sonic_rs::to_array_iter(value.as_raw_str()) {
                    let message = message.ok()?;
                    for field in sonic_rs::to_object_iter(message.as_raw_str()) {
                        let (name, content) = field.ok()?;
                        if name == "content" {
                            sonic_content(&content, text)?;
                        }
                    }
                }
            }
            "input_ids" => {
                *tokens = sonic_rs::from_str(value.as_raw_str()).ok()?;
            }
            _ => {}
        }
    }
    Some(model_len + text.len() + tokens.len())
}

#[cfg(feature = "bench-sonic")]
fn sonic_content(content: &sonic_rs::LazyValue<'_>, text: &mut String) -> Option<()> {
    if let Some(s) = content.as_str() {
        push_piece(text, s);
        return Some(());
    }
    for part in sonic_rs::to_array_iter(content.as_raw_str()) {
        let part = part.ok()?;
        for field in sonic_rs::to_object_iter(part.as_raw_str()) {
            let (name, value) = field.ok()?;
            if name == "text" {
                push_piece(text, value.as_str()?);
            }
        }
    }
    Some(())
}

#[cfg(feature = "bench-sonic")]
fn push_piece(text: &mut String, piece: &str) {
    if !text.is_empty() {
        text.push(' ');
    }
    text.push_str(piece);
}

fn bench_extract(c: &mut Criterion, sizes: &Sizes) -> u64 {
    let mut group = c.benchmark_group("extract");
    let mut input = RoutingInput::new();
    #[cfg(feature = "bench-sonic")]
    let (mut text, mut tokens) = (String::new(), Vec::new());
    let mut checksum = 0u64;
    for (name, endpoint, body) in bodies(sizes) {
        group.throughput(Throughput::Bytes(body.len() as u64));
        let headers = RoutingHeaders::default();
        group.bench_with_input(BenchmarkId::new("reference", &name), &body, |b, body| {
            b.iter(|| {
                black_box(extract_reference(
                    endpoint,
                    black_box(body),
                    headers,
                    &mut input,
                ))
            })
        });
        group.bench_with_input(BenchmarkId::new("scan", &name), &body, |b, body| {
            b.iter(|| black_box(extract(endpoint, black_box(body), headers, &mut input)))
        });
        #[cfg(feature = "bench-sonic")]
        group.bench_with_input(BenchmarkId::new("sonic_lazy", &name), &body, |b, body| {
            b.iter(|| black_box(sonic_lazy(black_box(body), &mut text, &mut tokens)))
        });
        // The readers must agree on what they read.
        let _ = extract(endpoint, &body, headers, &mut input);
        let scanned = format!("{:?}", input.key());
        let _ = extract_reference(endpoint, &body, headers, &mut input);
        assert_eq!(scanned, format!("{:?}", input.key()), "{name}");
        checksum += input.text().len() as u64;
        #[cfg(feature = "bench-sonic")]
        {
            let sonic = sonic_lazy(&body, &mut text, &mut tokens).unwrap_or(0);
            assert!(sonic > 0, "{name}: sonic-rs read nothing");
            checksum += sonic as u64;
        }
    }
    group.finish();
    println!("extract checksum: {checksum}");
    checksum
}

/// An index mode that answers every tree lookup with one match: 80% of the key, on 4 workers.
#[derive(Debug)]
struct FixedLookup;

impl IndexLookup for FixedLookup {
    fn lookup(&self, _: Namespace, key: IndexKey<'_>, _: u64) -> Lookup {
        let request_len = match key {
            IndexKey::Text(text) => text.len() as u32,
            IndexKey::Tokens(pages) => pages.request_tokens() as u32,
            IndexKey::Heads(heads) => heads.len() as u32,
        };
        let mut matched = TreeMatch {
            matched_len: request_len / 5 * 4,
            request_len,
            tenants_len: 4,
            ..TreeMatch::default()
        };
        for (i, slot) in [3u16, 7, 11, 15].into_iter().enumerate() {
            matched.tenants[i] = WorkerId(slot);
        }
        Lookup::Tree {
            matched,
            hint: Default::default(),
        }
    }

    fn quiesce(&mut self) {}
}

fn router(hash_mode: bool) -> Router {
    let mut args = PolicyArgs::default();
    let index: Option<Box<dyn IndexLookup>> = if hash_mode {
        args.cache_index = CacheIndexKind::Hash;
        args.cache_boundaries = vec![2048, 4096, 8192];
        // No index: the heads' match is their own, with no holder (the decision then reads
        // the recent dispatches, as on a cold index).
        None
    } else {
        Some(Box::new(FixedLookup))
    };
    let config = args.validate().expect("benchmark policy config");
    Router::new(config, 1, index, Arc::new(PolicyMetrics::default()))
}

fn bench_routed(c: &mut Criterion, sizes: &Sizes) -> u64 {
    let mut rng = Rng::with_seed(7);
    let workers = worker_loads::random_workers(&mut rng, WORKERS);
    let urls: Vec<String> = (0..WORKERS).map(|i| format!("http://w{i}:8000")).collect();
    let active = || {
        urls.iter()
            .enumerate()
            .map(|(i, url)| (WorkerId(i as u16), url.as_str()))
    };
    let status_of = |id: WorkerId| workers[id.index()];
    let tokens = sizes.prompt_tokens;
    let cases = [
        (
            "chat_tree",
            Endpoint::ChatCompletions,
            chat_body(tokens, &mut rng, None),
            false,
        ),
        (
            "generate_ids_tree",
            Endpoint::Generate,
            generate_body(tokens, &mut rng),
            false,
        ),
        (
            "generate_ids_hash",
            Endpoint::Generate,
            generate_body(tokens, &mut rng),
            true,
        ),
    ];
    let mut group = c.benchmark_group("routed");
    let mut checksum = 0u64;
    for (name, endpoint, body, hash_mode) in cases {
        let mut router = router(hash_mode);
        let mut prepared = Prepared::default();
        let mut now_ms = 0u64;
        let mut route = |router: &mut Router, prepared: &mut Prepared| {
            now_ms += 1;
            let headers = RoutingHeaders::default();
            router
                .prepare(prepared, endpoint, headers, black_box(&body), now_ms)
                .ok()?;
            let worker = router.choose(prepared, active(), status_of)?;
            let record = router.record(prepared, worker, now_ms);
            Some((worker, record.is_some()))
        };
        let first = route(&mut router, &mut prepared);
        checksum += first.map_or(0, |(w, _)| u64::from(w.0) + 1);
        group.bench_function(BenchmarkId::new(name, tokens), |b| {
            b.iter(|| black_box(route(&mut router, &mut prepared)))
        });
    }
    group.finish();
    println!("routed checksum: {checksum}");
    checksum
}

fn main() {
    let mut criterion = Criterion::default().configure_from_args();
    run_all(&mut criterion, &Sizes::full());
    criterion.final_summary();
}
