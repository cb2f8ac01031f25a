//! Criterion benchmarks of routing-input extraction and the cache_aware decision.
//!
//! - `extract/*`: the routing-input reader (`request::extract`: since issue 21 the one-pass scanner;
//!   `perf/extract.rs` compares it with the serde visitors it replaced) against
//!   a bare validation pass (`IgnoredAny`, what the gateway did before routing read the body) and
//!   a full `serde_json::Value` DOM parse of the same body, side by side; throughput in bytes, so
//!   criterion prints the cost per KB.
//! - `decide/*`: extraction plus `cache_aware::select` (16 workers with load reports, a prefix
//!   match on 4 tenants) for 1k / 8k / 32k-token prompts, text (chat) and token (`/generate`)
//!   bodies; `select_only_*` the decision alone, `select_miss_*` the same request as a cache miss
//!   (step 6's placement over all 16 workers). The index lookup is the index's own benchmark.
//! - `decide_logging/*`: the data core's whole decision (`Router::choose`: the worker statuses,
//!   select, the branch counters and the `Cache-aware selection` debug line) with no subscriber,
//!   with the production filter `info` (the debug line off), and with
//!   `smg::policies::cache_aware=debug` writing to a sink, next to `select` alone: what the
//!   decision log costs when it is off, and when it is on.
//!
//! Run: `cargo bench -p kvgate --bench policy`. Inputs are built outside the timed loops from
//! fixed seeds; each run prints a checksum of its results so a broken bench cannot pass silently.
//! `tests/policy_perf.rs` runs every benchmark once with tiny prompts in the normal test pass.

use std::hint::black_box;

use criterion::{BenchmarkId, Criterion, Throughput};
use fastrand::Rng;
use kvgate::ids::WorkerId;
use kvgate::index::{Namespace, TreeMatch};
use kvgate::policy::{
    cache_aware, CacheAwareConfig, IndexKey, IndexLookup, Lookup, PolicyArgs, PolicyMetrics,
    Prepared, Router,
};
use kvgate::request::{extract, Endpoint, RoutingHeaders, RoutingInput, RoutingKey};

/// Workers in the decision snapshot.
#[path = "worker_loads.rs"]
mod worker_loads;

const WORKERS: usize = 16;

/// The prompt sizes the benchmarks run, in tokens (one word = one token, as in sim-engine).
pub struct Sizes {
    /// Every `extract/*` and `decide/*` benchmark runs once per size.
    pub prompt_tokens: Vec<usize>,
    /// The prompt of `decide_logging/*`.
    pub logging_prompt_tokens: usize,
}

impl Sizes {
    /// The sizes `cargo bench` measures.
    pub fn full() -> Sizes {
        Sizes {
            prompt_tokens: vec![1024, 8192, 32768],
            logging_prompt_tokens: 8192,
        }
    }

    /// Tiny sizes for the smoke run of the test pass.
    pub fn tiny() -> Sizes {
        Sizes {
            prompt_tokens: vec![16],
            logging_prompt_tokens: 16,
        }
    }
}

/// Every benchmark of this file over `sizes`; returns the checksums they print.
pub fn run_all(c: &mut Criterion, sizes: &Sizes) -> [u64; 3] {
    [
        bench_extract(c, sizes),
        bench_decide(c, sizes),
        bench_decide_logging(c, sizes),
    ]
}

fn words(count: usize, rng: &mut Rng) -> String {
    let mut text = String::with_capacity(count * 7);
    for i in 0..count {
        if i > 0 {
            text.push(' ');
        }
        for _ in 0..rng.usize(3..8) {
            text.push(rng.lowercase());
        }
    }
    text
}

/// A chat body: a system prompt (half the tokens) and a user turn (the rest), plus the usual
/// sampling fields the reader must skip.
fn chat_body(tokens: usize, rng: &mut Rng) -> Vec<u8> {
    let system = words(tokens / 2, rng);
    let user = words(tokens - tokens / 2, rng);
    serde_json::to_vec(&serde_json::json!({
        "model": "meta-llama/Llama-3.1-8B-Instruct",
        "messages": [
            {"role": "system", "content": system},
            {"role": "user", "content": [{"type": "text", "text": user}]}
        ],
        "temperature": 0.7, "max_tokens": 256, "stream": true,
        "stream_options": {"include_usage": true}
    }))
    .unwrap_or_default()
}

fn generate_body(tokens: usize, rng: &mut Rng) -> Vec<u8> {
    let ids: Vec<u32> = (0..tokens).map(|_| rng.u32(..128_000)).collect();
    serde_json::to_vec(&serde_json::json!({
        "input_ids": ids,
        "sampling_params": {"temperature": 0.0, "max_new_tokens": 128},
        "stream": false
    }))
    .unwrap_or_default()
}

fn bench_extract(c: &mut Criterion, sizes: &Sizes) -> u64 {
    let mut rng = Rng::with_seed(42);
    let mut group = c.benchmark_group("extract");
    let mut input = RoutingInput::new();
    let mut checksum = 0u64;
    for &tokens in &sizes.prompt_tokens {
        let body = chat_body(tokens, &mut rng);
        group.throughput(Throughput::Bytes(body.len() as u64));
        group.bench_with_input(
            BenchmarkId::new("visitor_chat", tokens),
            &body,
            |b, body| {
                b.iter(|| {
                    let ok = extract(
                        Endpoint::ChatCompletions,
                        black_box(body),
                        RoutingHeaders::default(),
                        &mut input,
                    );
                    black_box(ok.is_ok())
                })
            },
        );
        group.bench_with_input(
            BenchmarkId::new("validate_only_chat", tokens),
            &body,
            |b, body| {
                b.iter(|| {
                    black_box(
                        serde_json::from_slice::<serde::de::IgnoredAny>(black_box(body)).is_ok(),
                    )
                })
            },
        );
        group.bench_with_input(BenchmarkId::new("dom_chat", tokens), &body, |b, body| {
            b.iter(|| {
                black_box(serde_json::from_slice::<serde_json::Value>(black_box(body)).is_ok())
            })
        });
        let body = generate_body(tokens, &mut rng);
        group.throughput(Throughput::Bytes(body.len() as u64));
        group.bench_with_input(
            BenchmarkId::new("visitor_input_ids", tokens),
            &body,
            |b, body| {
                b.iter(|| {
                    let ok = extract(
                        Endpoint::Generate,
                        black_box(body),
                        RoutingHeaders::default(),
                        &mut input,
                    );
                    black_box(ok.is_ok())
                })
            },
        );
        group.bench_with_input(
            BenchmarkId::new("dom_input_ids", tokens),
            &body,
            |b, body| {
                b.iter(|| {
                    black_box(serde_json::from_slice::<serde_json::Value>(black_box(body)).is_ok())
                })
            },
        );
        checksum += key_len(&input) as u64;
    }
    group.finish();
    println!("extract checksum: {checksum}");
    checksum
}

fn key_len(input: &RoutingInput) -> usize {
    match input.key() {
        RoutingKey::Tokens(tokens) => tokens.len(),
        RoutingKey::Text(text) => text.len(),
    }
}

fn bench_decide(c: &mut Criterion, sizes: &Sizes) -> u64 {
    let mut rng = Rng::with_seed(7);
    let workers = worker_loads::random_workers(&mut rng, WORKERS);
    let config = CacheAwareConfig::default();
    let load_aware = CacheAwareConfig {
        load_aware_affinity: true,
        ..config
    };
    let mut group = c.benchmark_group("decide");
    let mut input = RoutingInput::new();
    let mut decision_rng = Rng::with_seed(1);
    let mut checksum = 0u64;
    for &tokens in &sizes.prompt_tokens {
        let bodies = [
            (
                "chat",
                Endpoint::ChatCompletions,
                chat_body(tokens, &mut rng),
            ),
            (
                "input_ids",
                Endpoint::Generate,
                generate_body(tokens, &mut rng),
            ),
        ];
        for (name, endpoint, body) in bodies {
            let tree = tree_match(&body, endpoint, &mut input);
            group.bench_with_input(
                BenchmarkId::new(format!("extract_select_{name}"), tokens),
                &body,
                |b, body| {
                    b.iter(|| {
                        let _ = extract(
                            endpoint,
                            black_box(body),
                            RoutingHeaders::default(),
                            &mut input,
                        );
                        let d = cache_aware::select(
                            Some(black_box(&tree)),
                            &workers,
                            &config,
                            tokens as u64,
                            &mut decision_rng,
                        );
                        black_box(d)
                    })
                },
            );
            // The same request as a cache miss: step 6's placement over the whole fleet.
            let miss = TreeMatch {
                matched_len: 0,
                tenants_len: 0,
                ..tree
            };
            // And the hit under --load-aware-affinity: every worker's completion cost.
            let cases = [
                ("select_only", &tree, &config),
                ("select_miss", &miss, &config),
                ("select_load_aware", &tree, &load_aware),
            ];
            for (kind, tree, config) in cases {
                group.bench_function(BenchmarkId::new(format!("{kind}_{name}"), tokens), |b| {
                    b.iter(|| {
                        black_box(cache_aware::select(
                            Some(black_box(tree)),
                            &workers,
                            config,
                            tokens as u64,
                            &mut decision_rng,
                        ))
                    })
                });
            }
            for (_, tree, config) in cases {
                let d = cache_aware::select(
                    Some(tree),
                    &workers,
                    config,
                    tokens as u64,
                    &mut decision_rng,
                );
                checksum += d.map_or(0, |d| u64::from(d.worker.0) + 1);
            }
        }
    }
    group.finish();
    println!("decide checksum: {checksum}");
    checksum
}

/// A lookup result for the body: 80% matched, held by 4 of the 16 workers.
fn tree_match(body: &[u8], endpoint: Endpoint, input: &mut RoutingInput) -> TreeMatch {
    let _ = extract(endpoint, body, RoutingHeaders::default(), input);
    let request_len = u32::try_from(key_len(input)).unwrap_or(u32::MAX);
    let mut tree = TreeMatch {
        matched_len: request_len / 5 * 4,
        request_len,
        tenants_len: 4,
        ..TreeMatch::default()
    };
    for (i, slot) in [3u16, 7, 11, 15].into_iter().enumerate() {
        tree.tenants[i] = WorkerId(slot);
    }
    tree
}

/// An index mode that answers every lookup with one fixed match (the benchmark's lookup result).
#[derive(Debug)]
struct FixedLookup(TreeMatch);

impl IndexLookup for FixedLookup {
    fn lookup(&self, _: Namespace, _: IndexKey<'_>, _: u64) -> Lookup {
        Lookup::Tree {
            matched: self.0,
            hint: Default::default(),
        }
    }

    fn quiesce(&mut self) {}
}

/// `Router::choose` for one chat request under three logging set-ups, and `select` alone.
fn bench_decide_logging(c: &mut Criterion, sizes: &Sizes) -> u64 {
    let mut rng = Rng::with_seed(11);
    let workers = worker_loads::random_workers(&mut rng, WORKERS);
    let urls: Vec<String> = (0..WORKERS).map(|i| format!("http://w{i}:8000")).collect();
    let tokens = sizes.logging_prompt_tokens;
    let body = chat_body(tokens, &mut rng);
    let mut input = RoutingInput::new();
    let tree = tree_match(&body, Endpoint::ChatCompletions, &mut input);
    let config = PolicyArgs::default()
        .validate()
        .expect("default policy config");
    let metrics = std::sync::Arc::new(PolicyMetrics::default());
    let index: Box<dyn IndexLookup> = Box::new(FixedLookup(tree));
    let mut router = Router::new(config, 1, Some(index), metrics);
    let mut prepared = Prepared::default();
    router
        .prepare(
            &mut prepared,
            Endpoint::ChatCompletions,
            RoutingHeaders::default(),
            &body,
            0,
        )
        .expect("a valid body");
    let active = || {
        urls.iter()
            .enumerate()
            .map(|(i, url)| (WorkerId(i as u16), url.as_str()))
    };
    let status_of = |id: WorkerId| workers[id.index()];
    let cache_aware_config = CacheAwareConfig::default();
    let mut decision_rng = Rng::with_seed(1);
    let mut group = c.benchmark_group("decide_logging");
    group.bench_function("select_only", |b| {
        b.iter(|| {
            black_box(cache_aware::select(
                Some(black_box(&tree)),
                &workers,
                &cache_aware_config,
                tokens as u64,
                &mut decision_rng,
            ))
        })
    });
    let checksum = router
        .choose(&prepared, active(), status_of)
        .map_or(0, |w| u64::from(w.0) + 1);
    let mut choose = || router.choose(black_box(&prepared), active(), status_of);
    group.bench_function("route_no_subscriber", |b| b.iter(|| black_box(choose())));
    let subscriber = |filter: &str| {
        tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::new(filter))
            .with_writer(std::io::sink)
            .finish()
    };
    tracing::subscriber::with_default(subscriber("info"), || {
        group.bench_function("route_filter_info", |b| b.iter(|| black_box(choose())));
    });
    tracing::subscriber::with_default(subscriber("info,smg::policies::cache_aware=debug"), || {
        group.bench_function("route_filter_debug_to_sink", |b| {
            b.iter(|| black_box(choose()))
        });
    });
    group.finish();
    println!("decide_logging checksum: {checksum}");
    checksum
}

fn main() {
    let mut criterion = Criterion::default().configure_from_args();
    run_all(&mut criterion, &Sizes::full());
    criterion.final_summary();
}
