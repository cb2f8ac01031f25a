//! Token-id traces (`--trace-format token-ids`): one JSON object per line with the prompt's real
//! token ids, the output length and the arrival time, in the shape of the LLMServingSim workloads
//! (`{"input_toks": 3, "output_toks": 8, "arrival_time_ns": 1500000, "input_tok_ids": [..]}`).
//! [`parse_token_ids_line`] checks a line into a [`TokenIdsRow`] or a [`Skip`]; a
//! [`TokenDecoder`] (`--tokenizer-path`, a Hugging Face `tokenizer.json`) turns the ids back into
//! the text they encode, for gateways that tokenize text themselves.
//!
//! Field names ([`TOKEN_IDS_FIELDS`]): the ids `input_tok_ids` (or `input_ids`,
//! `prompt_token_ids`); the output length `output_toks` (or `output_len`, `output_length`); the
//! arrival `arrival_time_ns` (nanoseconds) or `timestamp_ms` (milliseconds), exactly one; an
//! optional `input_toks`, which must equal the number of ids. Other fields are ignored.

use std::io::Read;
use std::path::Path;

use serde::Deserialize;

use super::limits::{OUTPUT_TOKENS_MAX, PROMPT_TOKENS_MAX, TOKENIZER_FILE_BYTES_MAX};
use super::workload::Skip;

/// The field names a token-id line is read with, for `--help`.
pub const TOKEN_IDS_FIELDS: &str = "input_tok_ids (or input_ids, prompt_token_ids): the \
prompt's token ids; output_toks (or output_len, output_length): tokens to generate; \
arrival_time_ns (ns) or timestamp_ms (ms), exactly one: the arrival time; input_toks (optional): \
checked against the number of ids. Other fields (output_tok_ids, session_id, ...) are ignored";

/// One valid line.
#[derive(Clone, Debug, PartialEq)]
pub struct TokenIdsRow {
    pub timestamp_ms: f64,
    pub ids: Vec<u32>,
    pub output_tokens: u32,
}

#[derive(Deserialize)]
struct RawLine {
    #[serde(alias = "input_ids", alias = "prompt_token_ids")]
    input_tok_ids: Vec<u32>,
    #[serde(alias = "output_len", alias = "output_length")]
    output_toks: u64,
    #[serde(default)]
    arrival_time_ns: Option<f64>,
    #[serde(default)]
    timestamp_ms: Option<f64>,
    #[serde(default)]
    input_toks: Option<u64>,
}

/// Parses one line of a token-id trace.
pub fn parse_token_ids_line(line: &str) -> Result<TokenIdsRow, Skip> {
    let raw: RawLine = serde_json::from_str(line)
        .map_err(|e| Skip::malformed(format!("not a token-id row: {e}")))?;
    let timestamp_ms = match (raw.arrival_time_ns, raw.timestamp_ms) {
        (Some(ns), None) => ns / 1e6,
        (None, Some(ms)) => ms,
        (None, None) => {
            return Err(Skip::malformed(
                "no arrival time (arrival_time_ns or timestamp_ms)",
            ))
        }
        (Some(_), Some(_)) => {
            return Err(Skip::malformed(
                "two arrival times: give arrival_time_ns or timestamp_ms",
            ))
        }
    };
    if !timestamp_ms.is_finite() || timestamp_ms < 0.0 {
        return Err(Skip::out_of_bounds(format!(
            "arrival time {timestamp_ms} ms is not a time"
        )));
    }
    let count = raw.input_tok_ids.len();
    if count == 0 || count > PROMPT_TOKENS_MAX as usize {
        return Err(Skip::out_of_bounds(format!(
            "{count} input token ids, outside 1..={PROMPT_TOKENS_MAX}"
        )));
    }
    if let Some(stated) = raw.input_toks.filter(|&n| n != count as u64) {
        return Err(Skip::malformed(format!(
            "input_toks is {stated} but the line has {count} ids"
        )));
    }
    if raw.output_toks > u64::from(OUTPUT_TOKENS_MAX) {
        return Err(Skip::out_of_bounds(format!(
            "output length {} is above {OUTPUT_TOKENS_MAX}",
            raw.output_toks
        )));
    }
    Ok(TokenIdsRow {
        timestamp_ms,
        ids: raw.input_tok_ids,
        // An engine always produces at least one token.
        output_tokens: (raw.output_toks as u32).max(1),
    })
}

/// A Hugging Face tokenizer that turns token ids back into text.
pub struct TokenDecoder {
    tokenizer: tokenizers::Tokenizer,
    vocab_size: usize,
}

impl std::fmt::Debug for TokenDecoder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TokenDecoder")
            .field("vocab_size", &self.vocab_size)
            .finish()
    }
}

impl TokenDecoder {
    /// Loads a `tokenizer.json` (at most [`TOKENIZER_FILE_BYTES_MAX`] bytes).
    pub fn from_file(path: &Path) -> Result<Self, String> {
        let name = path.display();
        let file = std::fs::File::open(path).map_err(|e| format!("{name}: {e}"))?;
        let mut bytes = Vec::new();
        file.take(TOKENIZER_FILE_BYTES_MAX + 1)
            .read_to_end(&mut bytes)
            .map_err(|e| format!("{name}: {e}"))?;
        if bytes.len() as u64 > TOKENIZER_FILE_BYTES_MAX {
            return Err(format!(
                "{name}: larger than {TOKENIZER_FILE_BYTES_MAX} bytes: not a tokenizer.json"
            ));
        }
        let tokenizer = tokenizers::Tokenizer::from_bytes(&bytes)
            .map_err(|e| format!("{name}: not a Hugging Face tokenizer.json: {e}"))?;
        let vocab_size = tokenizer.get_vocab_size(true);
        Ok(Self {
            tokenizer,
            vocab_size,
        })
    }

    /// The text of `ids`, special tokens included (the ids are the prompt as the engine would
    /// see it, template and all).
    pub fn decode(&self, ids: &[u32]) -> Result<String, Skip> {
        if let Some(id) = ids.iter().find(|&&id| id as usize >= self.vocab_size) {
            return Err(Skip::out_of_bounds(format!(
                "token id {id} is not in the tokenizer's vocabulary of {}",
                self.vocab_size
            )));
        }
        self.tokenizer
            .decode(ids, false)
            .map_err(|e| Skip::malformed(format!("the tokenizer cannot decode the ids: {e}")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::replay::workload::SkipKind;

    #[test]
    fn llmservingsim_lines_and_their_aliases_parse() {
        let row = parse_token_ids_line(
            r#"{"input_toks":3,"output_toks":8,"arrival_time_ns":1500000,"input_tok_ids":[1,2,3],"output_tok_ids":[4]}"#,
        )
        .unwrap();
        assert_eq!(
            row,
            TokenIdsRow {
                timestamp_ms: 1.5,
                ids: vec![1, 2, 3],
                output_tokens: 8
            }
        );
        let alias =
            parse_token_ids_line(r#"{"input_ids":[5],"output_len":0,"timestamp_ms":7}"#).unwrap();
        assert_eq!((alias.timestamp_ms, alias.output_tokens), (7.0, 1));
    }

    #[test]
    fn bad_lines_are_refused_by_kind() {
        let kind = |text: &str| parse_token_ids_line(text).unwrap_err().kind;
        let ok = r#""output_toks":1,"arrival_time_ns":0"#;
        assert_eq!(kind(r#"{"input_tok_ids":[1]}"#), SkipKind::Malformed);
        assert_eq!(
            kind(&format!(r#"{{"input_tok_ids":[-1],{ok}}}"#)),
            SkipKind::Malformed
        );
        assert_eq!(
            kind(&format!(r#"{{"input_tok_ids":[],{ok}}}"#)),
            SkipKind::OutOfBounds
        );
        assert_eq!(
            kind(&format!(r#"{{"input_toks":2,"input_tok_ids":[1],{ok}}}"#)),
            SkipKind::Malformed
        );
        assert_eq!(
            kind(r#"{"input_tok_ids":[1],"output_toks":1,"arrival_time_ns":1,"timestamp_ms":1}"#),
            SkipKind::Malformed
        );
        assert_eq!(
            kind(r#"{"input_tok_ids":[1],"output_toks":99999999,"timestamp_ms":1}"#),
            SkipKind::OutOfBounds
        );
    }
}
