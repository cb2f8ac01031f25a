//! Criterion benchmarks of the gRPC front end's output parsers (`frontend::parsers`), per
//! output token, on Qwen3's tokenizer (`scripts/fetch-tokenizers.sh`; without it, the committed
//! SentencePiece test tokenizer):
//!
//! - `parsers/plain/{format}`: one parser (that tool-call format, with Qwen3's `<think>`
//!   reasoning parser before it) fed an answer with no marker, one token's text per step: the
//!   cost a parser adds to every token of an ordinary answer (the issue's target: 0.2 us).
//! - `parsers/chat_off` and `parsers/chat_on`: a whole chat stream of [`Sizes::tokens`] tokens
//!   through `OutputDecoder` and `StreamWriter` (detokenization, framing), with the request's
//!   parsers off (no tools, `--reasoning-parser passthrough`) and on (tools with
//!   `--tool-call-parser qwen --reasoning-parser qwen3`): the gRPC mode's CPU per token either
//!   way, measured side by side in one run.
//! - `parsers/calls`: the same stream whose text is Qwen3 reasoning and tool calls.
//!
//! Throughput is in tokens, so criterion's time per element is the figure per token. Inputs are
//! built outside the timed loops; `tests/parsers_perf.rs` runs every benchmark once, short.
//!
//! Run: `cargo bench -p kvgate --bench parsers`.

use std::hint::black_box;
use std::path::PathBuf;
use std::sync::Arc;

use criterion::{Criterion, Throughput};
use kvgate::frontend::parsers::{OutputParser, ParseSetup, ReasoningFormat, ToolFormat};
use kvgate::frontend::{
    Api, FinishReason, GenerateParams, OutputDecoder, ParserFlags, ResponseMeta, Step,
    StreamWriter, Usage,
};
use kvgate::tokenize::DecodeTable;
use tokenizers::Tokenizer;

// The gateway's allocator.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// The sizes the benchmarks run.
pub struct Sizes {
    /// Output tokens per stream.
    pub tokens: usize,
}

impl Sizes {
    /// The measured run: 256-token streams.
    pub fn full() -> Sizes {
        Sizes { tokens: 256 }
    }

    /// The smoke run of the test pass.
    pub fn tiny() -> Sizes {
        Sizes { tokens: 16 }
    }
}

/// An ordinary answer: prose, code, CJK and emoji, no marker of any format.
const ANSWER: &str = "Sure! Here is a short answer. The function `parse_chat` reads the body \
    once and returns the parameters; errors become a 400 with the field named. 日本語の説明も\
    あります：トークンは一つずつ届きます。中文也可以。 Emoji work too 🎉👍🏽, as do \"quotes\" \
    and back\\slashes.\n\n1. First item\n2. Second item\n\tindented line\n";

/// Qwen3's reasoning and a tool call.
const CALLS: &str = "<think>\nThe user wants the weather in two cities; call the tool twice.\n\
    </think>\n\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", \
    \"unit\": \"celsius\"}}\n</tool_call>\n<tool_call>\n{\"name\": \"get_weather\", \
    \"arguments\": {\"city\": \"東京\", \"unit\": \"celsius\"}}\n</tool_call>";

fn tokenizer() -> (Arc<Tokenizer>, &'static str) {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let qwen = root.join("target/tokenizers/qwen3/tokenizer.json");
    match Tokenizer::from_file(&qwen) {
        Ok(t) => (Arc::new(t), "qwen3"),
        Err(_) => {
            let sp = root.join("tests/fixtures/detokenize-sp-strip.json");
            let t = Tokenizer::from_file(sp).unwrap_or_else(|e| panic!("the test tokenizer: {e}"));
            (Arc::new(t), "sentencepiece")
        }
    }
}

/// `tokens` output IDs of `text`, repeated.
fn output_ids(tokenizer: &Tokenizer, text: &str, tokens: usize) -> Vec<u32> {
    let one = tokenizer
        .encode(text, false)
        .map(|e| e.get_ids().to_vec())
        .unwrap_or_default();
    assert!(!one.is_empty(), "the text encodes to tokens");
    one.iter().copied().cycle().take(tokens).collect()
}

/// Each token's text as the detokenizer gives it (what a parser is fed per step).
fn token_texts(table: &Arc<DecodeTable>, ids: &[u32], params: &GenerateParams) -> Vec<String> {
    let mut decoder = OutputDecoder::new(table.clone(), params, &[]);
    ids.chunks(1)
        .map(|id| decoder.push(0, id).text.to_owned())
        .collect()
}

fn chat(tools: bool) -> GenerateParams {
    let body = match tools {
        true => {
            r#"{"messages":[],"stream":true,"tools":[{"type":"function","function":{"name":"get_weather"}}]}"#
        }
        false => r#"{"messages":[],"stream":true}"#,
    };
    let mut params =
        GenerateParams::parse(Api::Chat, body.as_bytes()).unwrap_or_else(|e| panic!("{e}"));
    let flags = match tools {
        true => ParserFlags::parse(Some("qwen"), Some("qwen3")),
        false => ParserFlags::parse(None, Some("passthrough")),
    };
    let flags = flags.unwrap_or_else(|(flag, e)| panic!("{flag}: {e}"));
    params.parsing = flags.setup("Qwen/Qwen3-8B", params.tools.as_ref());
    params
}

/// One whole chat stream: every ID through the decoder and writer; returns the bytes written.
fn run_stream(
    table: &Arc<DecodeTable>,
    params: &GenerateParams,
    ids: &[u32],
    out: &mut Vec<u8>,
) -> usize {
    let meta = ResponseMeta {
        id: "chatcmpl-8f3a2b".into(),
        model: "Qwen/Qwen3-8B".into(),
        created: 1_764_000_000,
    };
    let mut decoder = OutputDecoder::new(table.clone(), params, &[151_645]);
    let mut writer = StreamWriter::new(params, meta, 2048);
    let mut written = 0;
    out.clear();
    writer.start(out);
    for id in ids.chunks(1) {
        let d = decoder.push(0, id);
        let step = Step {
            index: 0,
            token_ids: &id[..d.ids_used],
            text: d.text,
            logprobs: &[],
            finish: d.finish,
        };
        writer.step(&step, table, out);
        written += out.len();
        out.clear();
    }
    let d = decoder.finish(0, FinishReason::Stop, None);
    let step = Step {
        index: 0,
        token_ids: &[],
        text: d.text,
        logprobs: &[],
        finish: d.finish,
    };
    writer.step(&step, table, out);
    let usage = Usage {
        prompt_tokens: 2048,
        completion_tokens: decoder.completion_tokens(),
        cached_tokens: 1024,
    };
    writer.end(&usage, out);
    written + out.len()
}

/// Runs every benchmark; returns a checksum, or `None` when nothing ran.
pub fn run_all(c: &mut Criterion, sizes: &Sizes) -> Option<u64> {
    let (tokenizer, name) = tokenizer();
    let table = Arc::new(DecodeTable::of(tokenizer.clone()));
    let ids = output_ids(&tokenizer, ANSWER, sizes.tokens);
    let texts = token_texts(&table, &ids, &chat(false));
    let mut checksum = 0u64;
    let mut group = c.benchmark_group("parsers");
    group.throughput(Throughput::Elements(ids.len() as u64));
    let qwen3 = ReasoningFormat::by_name("qwen3").ok().flatten();
    for format in [
        ToolFormat::Qwen,
        ToolFormat::Llama,
        ToolFormat::Json,
        ToolFormat::Mistral,
        ToolFormat::DeepSeek,
    ] {
        let setup = ParseSetup {
            tools: Some(format),
            reasoning: qwen3,
        };
        let run = || {
            let Some(mut parser) = OutputParser::new(&setup) else {
                return 0;
            };
            let mut events = 0;
            for text in &texts {
                events += parser.push(text).events().count();
            }
            events + parser.finish().events().count()
        };
        checksum += run() as u64;
        group.bench_function(format!("plain/{}/{name}", format.name()), |b| {
            b.iter(|| black_box(run()))
        });
    }
    let mut out = Vec::with_capacity(1024);
    let (off, on) = (chat(false), chat(true));
    let calls = output_ids(&tokenizer, CALLS, sizes.tokens);
    for (label, params, ids) in [
        ("chat_off", &off, &ids),
        ("chat_on", &on, &ids),
        ("calls", &on, &calls),
    ] {
        checksum += run_stream(&table, params, ids, &mut out) as u64;
        group.bench_function(format!("{label}/{name}"), |b| {
            b.iter(|| black_box(run_stream(&table, params, ids, &mut out)))
        });
    }
    group.finish();
    println!("parsers checksum: {checksum}");
    (checksum > 0).then_some(checksum)
}

fn main() {
    let mut criterion = Criterion::default().configure_from_args();
    run_all(&mut criterion, &Sizes::full());
    criterion.final_summary();
}
