//! Sample trace files of every replay format with prompts of the same length, for measuring
//! `replay` on each side by side (`examples/trace_files.rs`, perf/results-replay.md): Mooncake
//! (hash ids), captured chat requests (`openai-log`), ShareGPT conversations (one JSON array, two
//! answered turns each, requests averaging the same length) and token ids, with a WordLevel
//! `tokenizer.json` of the words the ids stand for. Rows arrive 1 ms apart; prompts share their
//! first 512 tokens within groups of 16 rows; outputs are 16 tokens. Words are
//! [`synthetic_word`]s, one sim-engine token each. Generated inputs belong in a temporary
//! directory, never in the repository.

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::Path;

use serde_json::json;

use crate::tokenize::synthetic_word;

/// Words of the vocabulary (token ids are below it).
const VOCABULARY: u64 = 32_768;
/// Rows that share their first block.
const GROUP_ROWS: u64 = 16;
/// Tokens shared by the rows of a group (one Mooncake block).
const SHARED_TOKENS: u64 = 512;
const OUTPUT_TOKENS: u64 = 16;

/// The files [`write_samples`] writes into its directory, by `--trace-format`.
pub const SAMPLE_FILES: [(&str, &str); 4] = [
    ("mooncake", "mooncake.jsonl"),
    ("openai-log", "openai_log.jsonl"),
    ("sharegpt", "sharegpt.json"),
    ("token-ids", "token_ids.jsonl"),
];

/// The WordLevel tokenizer of the token-id sample's vocabulary, in the same directory.
pub const SAMPLE_TOKENIZER: &str = "tokenizer.json";

/// Writes one file per format into `dir`, each making `lines` requests of `tokens` tokens on
/// average (ShareGPT: `lines / 2` conversations of two answered turns), and the tokenizer.
pub fn write_samples(dir: &Path, lines: u64, tokens: u64) -> std::io::Result<()> {
    std::fs::create_dir_all(dir)?;
    write_mooncake(&dir.join(SAMPLE_FILES[0].1), lines, tokens)?;
    write_openai_log(&dir.join(SAMPLE_FILES[1].1), lines, tokens)?;
    write_sharegpt(&dir.join(SAMPLE_FILES[2].1), lines, tokens)?;
    write_token_ids(&dir.join(SAMPLE_FILES[3].1), lines, tokens)?;
    write_tokenizer(&dir.join(SAMPLE_TOKENIZER))
}

/// The ids of row `row`'s prompt: the group's shared block, then ids unique to the row.
fn row_ids(row: u64, tokens: u64) -> impl Iterator<Item = u64> {
    let group = row / GROUP_ROWS;
    let mut rng = fastrand::Rng::with_seed(row);
    let mut shared = fastrand::Rng::with_seed(group | 1 << 63);
    (0..tokens).map(move |i| {
        if i < SHARED_TOKENS {
            shared.u64(..VOCABULARY)
        } else {
            rng.u64(..VOCABULARY)
        }
    })
}

fn words(ids: impl Iterator<Item = u64>) -> String {
    ids.map(synthetic_word).collect::<Vec<_>>().join(" ")
}

fn create(path: &Path) -> std::io::Result<BufWriter<File>> {
    Ok(BufWriter::with_capacity(1 << 20, File::create(path)?))
}

fn write_mooncake(path: &Path, lines: u64, tokens: u64) -> std::io::Result<()> {
    let mut out = create(path)?;
    let blocks = tokens.div_ceil(SHARED_TOKENS);
    for row in 0..lines {
        let group = row / GROUP_ROWS;
        // Block 0 is the group's; the others are the row's own.
        let hash_ids: Vec<u64> = (0..blocks)
            .map(|b| if b == 0 { group } else { (row + 1) * 1_000 + b })
            .collect();
        let line = json!({"timestamp": row, "input_length": tokens,
                          "output_length": OUTPUT_TOKENS, "hash_ids": hash_ids});
        writeln!(out, "{line}")?;
    }
    out.flush()
}

fn write_openai_log(path: &Path, lines: u64, tokens: u64) -> std::io::Result<()> {
    let mut out = create(path)?;
    for row in 0..lines {
        let text = words(row_ids(row, tokens));
        let body = json!({"model": "sim-model", "messages": [{"role": "user", "content": text}],
                          "max_tokens": OUTPUT_TOKENS, "stream": true,
                          "stream_options": {"include_usage": true}});
        let line = json!({"timestamp_ms": row, "endpoint": "/v1/chat/completions", "body": body});
        writeln!(out, "{line}")?;
    }
    out.flush()
}

/// Two answered turns: the first request sends 3/4 of `tokens` words, the second that, the
/// answer and a question of half `tokens`, so the two average `tokens`.
fn write_sharegpt(path: &Path, lines: u64, tokens: u64) -> std::io::Result<()> {
    let mut out = create(path)?;
    let (first, answer) = (tokens * 3 / 4, OUTPUT_TOKENS);
    let second = (tokens / 2).saturating_sub(answer).max(1);
    writeln!(out, "[")?;
    let conversations = lines / 2;
    for c in 0..conversations {
        let ids: Vec<u64> = row_ids(c, first + answer + second).collect();
        let (a, rest) = ids.split_at(first as usize);
        let (b, q) = rest.split_at(answer as usize);
        let turns = json!({"id": c, "conversations": [
            {"from": "human", "value": words(a.iter().copied())},
            {"from": "gpt", "value": words(b.iter().copied())},
            {"from": "human", "value": words(q.iter().copied())},
            {"from": "gpt", "value": words(b.iter().copied())}]});
        let comma = if c + 1 < conversations { "," } else { "" };
        writeln!(out, "{turns}{comma}")?;
    }
    writeln!(out, "]")?;
    out.flush()
}

fn write_token_ids(path: &Path, lines: u64, tokens: u64) -> std::io::Result<()> {
    let mut out = create(path)?;
    for row in 0..lines {
        let ids: Vec<u64> = row_ids(row, tokens).collect();
        let line = json!({"input_toks": tokens, "output_toks": OUTPUT_TOKENS,
                          "arrival_time_ns": row * 1_000_000, "input_tok_ids": ids});
        writeln!(out, "{line}")?;
    }
    out.flush()
}

/// A WordLevel tokenizer whose id `n` is `synthetic_word(n)`, split on whitespace.
fn write_tokenizer(path: &Path) -> std::io::Result<()> {
    let vocab: serde_json::Map<String, serde_json::Value> = (0..VOCABULARY)
        .map(|n| (synthetic_word(n), json!(n)))
        .collect();
    let tokenizer = json!({
        "version": "1.0", "truncation": null, "padding": null, "added_tokens": [],
        "normalizer": null, "pre_tokenizer": {"type": "Whitespace"}, "post_processor": null,
        "decoder": null, "model": {"type": "WordLevel", "vocab": vocab, "unk_token": "w0"},
    });
    let mut out = create(path)?;
    writeln!(out, "{tokenizer}")?;
    out.flush()
}
