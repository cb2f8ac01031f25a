//! Criterion benchmarks of gateway tokenization with Qwen3's tokenizer (`tokenizer.json` and
//! `tokenizer_config.json` from `scripts/fetch-tokenizers.sh`, under `target/tokenizers/`).
//!
//! - `encode/{crate,kvgate}/{prose,code,cjk,cjk_unique}`: cold encoding of about 16 KB of text
//!   (English-like prose, Rust source, Chinese, Japanese and Korean phrases, their characters in
//!   random runs that never repeat, a different text each time) by the `tokenizers` crate and by kvgate's
//!   byte-level BPE (`ModelTokenizer::encode`), side by side in one run; then an alternating
//!   measurement (the crate, then kvgate, round after round, so a loaded machine's drift hits
//!   both alike) prints the median ratio per corpus: the figure to read.
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
//!   conversation's next turn): the target is 150 us at 8k (7.5k tokens seen before);
//!   `head_cached_crate_*` the same with the crate as the encoder.
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
    /// Bytes of each corpus of the encode group.
    pub encode_bytes: usize,
    /// Rounds of the alternating measurement.
    pub alternating_rounds: usize,
}

impl Sizes {
    /// What `cargo bench` measures.
    pub fn full() -> Sizes {
        Sizes {
            prompt_tokens: vec![1024, 8192, 32768],
            tail_tokens: TAIL_TOKENS,
            memory_bytes: 50 << 20,
            encode_bytes: 16 << 10,
            alternating_rounds: 41,
        }
    }

    /// The smoke run of the test pass.
    pub fn tiny() -> Sizes {
        Sizes {
            prompt_tokens: vec![96],
            tail_tokens: 16,
            memory_bytes: 64 << 10,
            encode_bytes: 256,
            alternating_rounds: 1,
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
pub fn qwen3() -> Option<ModelTokenizer> {
    let dir = fixtures_dir().join("qwen3");
    let files = TokenizerFiles {
        tokenizer_json: std::fs::read(dir.join("tokenizer.json")).ok()?,
        tokenizer_config_json: std::fs::read(dir.join("tokenizer_config.json")).ok(),
        chat_template: None,
    };
    Some(ModelTokenizer::new("qwen3", files).expect("Qwen3's tokenizer loads"))
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
pub fn run_all(c: &mut Criterion, sizes: &Sizes) -> Option<[u64; 4]> {
    // First, before loading the tokenizer frees memory the allocator would reuse for the cache.
    let memory = memory(sizes);
    let model = Arc::new(qwen3()?);
    assert!(model.wait_for_own_bpe(), "{}", model.encoder());
    let crate_model = Arc::new(qwen3()?.with_crate_encoder());
    Some([
        bench_encode(c, &model, sizes),
        bench_tokenize(c, &model, &crate_model, sizes),
        bench_prepare(c, &model, sizes),
        memory,
    ])
}

/// Phrases of Chinese and Japanese, joined at random between punctuation into the CJK corpus:
/// the runs of letters between two punctuation marks seldom repeat, as in real text (a corpus
/// of repeated sentences would measure the crate's word cache).
const CJK_PHRASES: &[&str] = &[
    "网关",
    "在每个请求到达时",
    "计算令牌",
    "然后把请求",
    "路由到",
    "缓存命中率最高的引擎",
    "如果前缀已经被缓存",
    "预填充的时间",
    "会大大缩短",
    "首个令牌的延迟",
    "也随之降低",
    "这个分词器",
    "必须与引擎使用的分词器",
    "完全一致",
    "否则",
    "路由的键就会出错",
    "东京的天气",
    "今天很好",
    "我们去公园散步吧",
    "数据中心",
    "模型推理",
    "显存",
    "キャッシュを意識した",
    "ルーティングは",
    "同じ接頭辞を持つ",
    "要求を",
    "同じエンジンに送ります",
    "トークナイザーの速度が",
    "遅いと",
    "最初のトークンまでの時間が",
    "長くなります",
    "日本語の文章には",
    "ひらがな",
    "カタカナ",
    "漢字が混ざっています",
    "모델은",
    "요청마다",
    "토큰을 계산합니다",
];

/// Punctuation between CJK phrases.
const CJK_PUNCTUATION: &[&str] = &["，", "。", "、", "！", "？", "：", "；", "「", "」", "\n"];

/// The corpora of the encode group, each about `bytes` long.
fn encode_corpora(model: &ModelTokenizer, bytes: usize) -> Vec<(&'static str, Vec<String>)> {
    let mut rng = Rng::with_seed(5);
    let mut prose = String::new();
    while prose.len() < bytes {
        prose.push_str(&text(model, 64, &mut rng));
        prose.push_str("\n\n");
    }
    let sources = [
        include_str!("../src/tokenize/mod.rs"),
        include_str!("../src/tokenize/split.rs"),
        include_str!("../src/tokenize/cache.rs"),
    ];
    let mut code = String::new();
    for source in sources.iter().cycle() {
        if code.len() >= bytes {
            break;
        }
        let mut end = (bytes - code.len()).min(source.len());
        while !source.is_char_boundary(end) {
            end -= 1;
        }
        code.push_str(&source[..end]);
    }
    let mut cjk = String::new();
    while cjk.len() < bytes {
        for _ in 0..rng.usize(1..4) {
            cjk.push_str(CJK_PHRASES[rng.usize(..CJK_PHRASES.len())]);
        }
        cjk.push_str(CJK_PUNCTUATION[rng.usize(..CJK_PUNCTUATION.len())]);
    }
    // The same characters in random order between punctuation: runs that never repeat, and a
    // different text each time (one of `FRESH_TEXTS`), so no word cache helps (real CJK text
    // sits between the two).
    let characters: Vec<char> = CJK_PHRASES.iter().flat_map(|p| p.chars()).collect();
    let cjk_unique = (0..FRESH_TEXTS)
        .map(|_| {
            let mut text = String::new();
            while text.len() < bytes {
                for _ in 0..rng.usize(4..20) {
                    text.push(characters[rng.usize(..characters.len())]);
                }
                text.push_str(CJK_PUNCTUATION[rng.usize(..CJK_PUNCTUATION.len())]);
            }
            text
        })
        .collect();
    vec![
        ("prose", vec![prose]),
        ("code", vec![code]),
        ("cjk", vec![cjk]),
        ("cjk_unique", cjk_unique),
    ]
}

/// Texts of the `cjk_unique` corpus, encoded in turn: together far more words than a word
/// cache holds (kvgate's keeps 2,048 per thread, the crate's 10,000).
const FRESH_TEXTS: usize = 64;

/// The next of `texts`, in turn.
fn in_turn<'a>(texts: &'a [String], turn: &std::cell::Cell<usize>) -> &'a str {
    let at = turn.get();
    turn.set((at + 1) % texts.len());
    &texts[at]
}

/// Cold encoding by the crate and by kvgate's BPE (see the module documentation).
fn bench_encode(c: &mut Criterion, model: &Arc<ModelTokenizer>, sizes: &Sizes) -> u64 {
    let mut group = c.benchmark_group("encode");
    let mut checksum = 0u64;
    let corpora = encode_corpora(model, sizes.encode_bytes);
    // For the Python package's figure (`scripts/tokenize-python-speed.py`): the same texts.
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("target/tokenize-bench");
    if std::fs::create_dir_all(&dir).is_ok() {
        for (name, texts) in &corpora {
            let _ = std::fs::write(dir.join(format!("{name}.txt")), &texts[0]);
        }
    }
    for (name, texts) in &corpora {
        let mut tokens = 0;
        for text in texts {
            let ours = model.encode(text, false).expect("encodes");
            let theirs = model.encode_with_crate(text, false).expect("encodes");
            assert_eq!(ours, theirs, "{name}: kvgate's BPE and the crate differ");
            tokens += ours.len();
        }
        checksum += tokens as u64;
        let (bytes, tokens) = (
            texts.iter().map(String::len).sum::<usize>() / texts.len(),
            tokens / texts.len(),
        );
        println!(
            "encode: {name}: {bytes} bytes, {tokens} tokens, {} text(s) in turn",
            texts.len()
        );
        group.throughput(Throughput::Elements(tokens as u64));
        let turn = std::cell::Cell::new(0);
        group.bench_with_input(BenchmarkId::new("crate", name), texts, |b, texts| {
            b.iter(|| {
                black_box(
                    model
                        .encode_with_crate(black_box(in_turn(texts, &turn)), false)
                        .map(|i| i.len()),
                )
            })
        });
        group.bench_with_input(BenchmarkId::new("kvgate", name), texts, |b, texts| {
            b.iter(|| {
                black_box(
                    model
                        .encode(black_box(in_turn(texts, &turn)), false)
                        .map(|i| i.len()),
                )
            })
        });
    }
    group.finish();
    for (name, texts) in &corpora {
        let (median, low, high) = alternating_ratio(model, texts, sizes.alternating_rounds);
        println!(
            "encode: {name}: kvgate is {median:.1}x the crate's speed (median of {} alternating rounds; {low:.1}x-{high:.1}x)",
            sizes.alternating_rounds
        );
    }
    // The worst case: one 16 MB "word", refused after a linear scan (the crate: 19 s, 1.4 GB).
    let word = "a".repeat((sizes.encode_bytes << 10) + 1);
    let before = resident_bytes();
    let start = std::time::Instant::now();
    let refused = model.encode(&word, false).is_err();
    println!(
        "encode: a {}-byte word: refused {refused} in {:.1} ms, resident +{} B",
        word.len(),
        start.elapsed().as_secs_f64() * 1e3,
        resident_bytes().saturating_sub(before)
    );
    println!("encode checksum: {checksum}");
    checksum
}

/// The crate's time over kvgate's on `texts` (each encode the next one), measured alternately
/// round after round: (median, lowest, highest).
fn alternating_ratio(model: &ModelTokenizer, texts: &[String], rounds: usize) -> (f64, f64, f64) {
    let turn = std::cell::Cell::new(0);
    let time = |f: &dyn Fn() -> usize| {
        let start = std::time::Instant::now();
        let mut n = 0;
        // About 20 ms of the crate per round: many encodes, so timer noise does not count.
        while start.elapsed() < std::time::Duration::from_millis(20) || n < 3 {
            black_box(f());
            n += 1;
        }
        start.elapsed().as_secs_f64() / n as f64
    };
    let mut ratios: Vec<f64> = (0..rounds)
        .map(|_| {
            let theirs = time(&|| {
                model
                    .encode_with_crate(in_turn(texts, &turn), false)
                    .map_or(0, |i| i.len())
            });
            let ours = time(&|| {
                model
                    .encode(in_turn(texts, &turn), false)
                    .map_or(0, |i| i.len())
            });
            theirs / ours
        })
        .collect();
    ratios.sort_by(f64::total_cmp);
    (
        ratios[ratios.len() / 2],
        ratios[0],
        ratios[ratios.len() - 1],
    )
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

fn bench_tokenize(
    c: &mut Criterion,
    model: &Arc<ModelTokenizer>,
    crate_model: &Arc<ModelTokenizer>,
    sizes: &Sizes,
) -> u64 {
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
        for (name, model) in [("head_cached", model), ("head_cached_crate", crate_model)] {
            group.bench_with_input(BenchmarkId::new(name, tokens), &body, |b, body| {
                b.iter_batched(
                    || head_cache(model, &warm_body),
                    |mut cache| black_box(ids_of(model, body, &mut cache, &mut out)),
                    BatchSize::SmallInput,
                )
            });
        }
        // The new message alone through kvgate's BPE (`crate_alone_tail` is the crate's).
        group.bench_with_input(BenchmarkId::new("kvgate_tail", tokens), &tail, |b, text| {
            b.iter(|| {
                black_box(
                    model
                        .encode(black_box(text.as_str()), false)
                        .map(|e| e.len()),
                )
            })
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
