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
use serde_json::value::RawValue;
use tokenizers::Decoder;

use super::flat_json::{self, FlatValue};
use super::limits::{OUTPUT_TOKENS_MAX, PROMPT_TOKENS_MAX, TOKENIZER_FILE_BYTES_MAX};
use super::skip::Skip;

/// The field names a token-id line is read with, for `--help`.
pub const TOKEN_IDS_FIELDS: &str = "input_tok_ids (or input_ids, prompt_token_ids): the \
prompt's token ids; output_toks (or output_len, output_length): tokens to generate; \
arrival_time_ns (ns) or timestamp_ms (ms), exactly one: the arrival time; input_toks (optional): \
checked against the number of ids. Other fields (output_tok_ids, session_id, ...) are ignored";

/// Token ids as the trace wrote them: the JSON array's text, checked (non-negative integers only)
/// and counted, so that they go on the wire as a copy and are parsed only to be decoded. Their
/// values are the engine's to judge, or the tokenizer's with `--tokenizer-path`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TokenIds {
    json: String,
    count: usize,
}

impl TokenIds {
    /// Checks a JSON array of token ids that serde_json has read (its elements must be integers
    /// of 0 or more).
    pub fn from_json(raw: &RawValue) -> Result<Self, Skip> {
        let json = raw.get().trim_ascii();
        let inner = json
            .strip_prefix('[')
            .and_then(|rest| rest.strip_suffix(']'))
            .ok_or_else(|| Skip::malformed("the input ids are not an array"))?;
        Ok(Self {
            json: json.to_string(),
            count: flat_json::integers(inner.as_bytes())
                .ok_or_else(|| Skip::malformed("input ids: not all integers of 0 or more"))?,
        })
    }

    /// The ids of `ids`.
    pub fn from_ids(ids: &[u32]) -> Self {
        let mut json = Vec::with_capacity(ids.len() * 7 + 2);
        write_ids(ids.iter().copied(), &mut json);
        Self {
            json: String::from_utf8(json).unwrap_or_default(),
            count: ids.len(),
        }
    }

    pub fn len(&self) -> usize {
        self.count
    }

    pub fn is_empty(&self) -> bool {
        self.count == 0
    }

    /// The array as JSON text.
    pub fn json(&self) -> &str {
        &self.json
    }

    /// The ids, parsed (an id of 2^32 or more reads as 2^32 - 1, which no vocabulary holds).
    pub fn ids(&self) -> impl Iterator<Item = u32> + '_ {
        let inner = &self.json.as_bytes()[1..self.json.len() - 1];
        let parts = inner.split(|&b| b == b',').take(self.count);
        parts.map(|part| {
            let digits = part.iter().filter(|b| b.is_ascii_digit());
            digits.fold(0u32, |id, &d| {
                id.saturating_mul(10).saturating_add(u32::from(d - b'0'))
            })
        })
    }

    /// The text of the ids of block `index` of `block` ids (or less at the end), for keys.
    pub fn block_text(&self, block: usize, index: usize) -> &str {
        let inner = &self.json[1..self.json.len() - 1];
        let mut commas = memchr::memchr_iter(b',', inner.as_bytes());
        let start = match index * block {
            0 => 0,
            n => commas.nth(n - 1).map_or(inner.len(), |at| at + 1),
        };
        let end = commas.nth(block - 1).unwrap_or(inner.len()).max(start);
        &inner[start..end]
    }

    /// Puts `id` before the first id.
    pub fn prepend(&mut self, id: u32) {
        let separator = if self.count > 0 { "," } else { "" };
        self.json.insert_str(1, &format!("{id}{separator}"));
        self.count += 1;
    }
}

/// `[1,2,3]`, digits written by `itoa`.
pub fn write_ids(ids: impl Iterator<Item = u32>, out: &mut Vec<u8>) {
    let mut digits = itoa::Buffer::new();
    out.push(b'[');
    for (i, id) in ids.enumerate() {
        if i > 0 {
            out.push(b',');
        }
        out.extend_from_slice(digits.format(id).as_bytes());
    }
    out.push(b']');
}

/// One valid line.
#[derive(Clone, Debug, PartialEq)]
pub struct TokenIdsRow {
    pub timestamp_ms: f64,
    pub ids: TokenIds,
    pub output_tokens: u32,
}

/// The fields of a line that a row is made of.
#[derive(Debug, PartialEq)]
struct Fields {
    ids: TokenIds,
    output_toks: u64,
    arrival_time_ns: Option<f64>,
    timestamp_ms: Option<f64>,
    input_toks: Option<u64>,
}

#[derive(Deserialize)]
struct RawLine<'a> {
    #[serde(borrow, alias = "input_ids", alias = "prompt_token_ids")]
    input_tok_ids: &'a RawValue,
    #[serde(alias = "output_len", alias = "output_length")]
    output_toks: u64,
    #[serde(default)]
    arrival_time_ns: Option<f64>,
    #[serde(default)]
    timestamp_ms: Option<f64>,
    #[serde(default)]
    input_toks: Option<u64>,
}

impl Fields {
    /// Reads a line: the flat scanner first (the shape of every token-id trace, and 20-30 ns
    /// per id faster), serde_json for anything it leaves (and for the error a user sees).
    fn read(line: &str) -> Result<Self, Skip> {
        match Self::scan(line) {
            Some(fields) => Ok(fields),
            None => Self::parse(line),
        }
    }

    fn parse(line: &str) -> Result<Self, Skip> {
        let raw: RawLine = serde_json::from_str(line)
            .map_err(|e| Skip::malformed(format!("not a token-id row: {e}")))?;
        Ok(Fields {
            ids: TokenIds::from_json(raw.input_tok_ids)?,
            output_toks: raw.output_toks,
            arrival_time_ns: raw.arrival_time_ns,
            timestamp_ms: raw.timestamp_ms,
            input_toks: raw.input_toks,
        })
    }

    /// What [`Fields::parse`] reads, when the line is flat and each field appears once (a
    /// repeated field is serde's error to report).
    fn scan(line: &str) -> Option<Self> {
        fn once<T>(slot: &mut Option<T>, value: Option<T>) -> Option<()> {
            match slot {
                None => *slot = Some(value?),
                Some(_) => return None,
            }
            Some(())
        }
        fn scalar<T: serde::de::DeserializeOwned>(value: FlatValue<'_>) -> Option<T> {
            match value {
                FlatValue::Scalar(text) => serde_json::from_str(text).ok(),
                _ => None,
            }
        }
        let (mut ids, mut output_toks, mut arrival_time_ns, mut timestamp_ms, mut input_toks) =
            (None, None, None, None, None);
        flat_json::scan(line, |key, value| match key {
            "input_tok_ids" | "input_ids" | "prompt_token_ids" => match value {
                FlatValue::Integers { json, count } => once(
                    &mut ids,
                    Some(TokenIds {
                        json: json.to_string(),
                        count,
                    }),
                ),
                _ => None,
            },
            "output_toks" | "output_len" | "output_length" => {
                once(&mut output_toks, scalar::<u64>(value))
            }
            "arrival_time_ns" => once(&mut arrival_time_ns, scalar::<Option<f64>>(value)),
            "timestamp_ms" => once(&mut timestamp_ms, scalar::<Option<f64>>(value)),
            "input_toks" => once(&mut input_toks, scalar::<Option<u64>>(value)),
            _ => Some(()),
        })?;
        Some(Fields {
            ids: ids?,
            output_toks: output_toks?,
            arrival_time_ns: arrival_time_ns.flatten(),
            timestamp_ms: timestamp_ms.flatten(),
            input_toks: input_toks.flatten(),
        })
    }
}

/// Parses one line of a token-id trace.
pub fn parse_token_ids_line(line: &str) -> Result<TokenIdsRow, Skip> {
    let raw = Fields::read(line)?;
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
    let ids = raw.ids;
    let count = ids.len();
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
        ids,
        // An engine always produces at least one token.
        output_tokens: (raw.output_toks as u32).max(1),
    })
}

/// A Hugging Face tokenizer that turns token ids back into text: what `Tokenizer::decode` does
/// with special tokens kept, with every id's token looked up once, when the file is loaded (the
/// tokenizer's own lookup goes through two hash maps and a new `String` per token).
pub struct TokenDecoder {
    tokenizer: tokenizers::Tokenizer,
    /// The token of each id below the vocabulary size (`None` for an id the tokenizer lacks).
    tokens: Vec<Option<Box<str>>>,
}

impl std::fmt::Debug for TokenDecoder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TokenDecoder")
            .field("vocab_size", &self.tokens.len())
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
        // The vocabulary is bounded by the file's size: every token is at least a few bytes of it.
        let vocab_size = tokenizer.get_vocab_size(true) as u32;
        let tokens = (0..vocab_size)
            .map(|id| tokenizer.id_to_token(id).map(String::into_boxed_str))
            .collect();
        Ok(Self { tokenizer, tokens })
    }

    /// The text of `ids`, special tokens included (the ids are the prompt as the engine would
    /// see it, template and all).
    pub fn decode(&self, ids: &TokenIds) -> Result<String, Skip> {
        let mut tokens: Vec<&str> = Vec::with_capacity(ids.len());
        for id in ids.ids() {
            match self.tokens.get(id as usize) {
                Some(token) => tokens.extend(token.as_deref()),
                None => {
                    return Err(Skip::out_of_bounds(format!(
                        "token id {id} is not in the tokenizer's vocabulary of {}",
                        self.tokens.len()
                    )))
                }
            }
        }
        match self.tokenizer.get_decoder() {
            Some(decoder) => {
                let owned = tokens.into_iter().map(str::to_string).collect();
                decoder.decode(owned).map_err(|e| {
                    Skip::malformed(format!("the tokenizer cannot decode the ids: {e}"))
                })
            }
            None => Ok(tokens.join(" ")),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::replay::skip::SkipKind;

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
                ids: TokenIds::from_ids(&[1, 2, 3]),
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

    /// A field of a token-id line: the known ones under each name, with good and bad values,
    /// and others.
    fn field() -> impl proptest::strategy::Strategy<Value = String> {
        use proptest::prelude::*;
        let key = prop_oneof![
            Just("input_tok_ids"),
            Just("input_ids"),
            Just("prompt_token_ids"),
            Just("output_toks"),
            Just("output_len"),
            Just("output_length"),
            Just("arrival_time_ns"),
            Just("timestamp_ms"),
            Just("input_toks"),
            Just("output_tok_ids"),
            Just("session_id"),
        ];
        let value = prop_oneof![
            "\\[ ?([0-9]{1,3}(, ?| ,)?){0,5}\\]",
            "-?[0-9]{1,4}(\\.5)?",
            Just("null".to_string()),
            Just("\"s\"".to_string()),
            Just("{\"x\":1}".to_string()),
        ];
        (key, value).prop_map(|(key, value)| format!("\"{key}\": {value}"))
    }

    proptest::proptest! {
        /// The flat scanner reads a line as serde_json does, or leaves it to serde_json.
        #[test]
        fn the_scanner_reads_what_serde_reads(fields in proptest::collection::vec(field(), 1..7)) {
            let line = format!("{{{}}}", fields.join(","));
            if let Some(scanned) = Fields::scan(&line) {
                proptest::prop_assert_eq!(Some(scanned), Fields::parse(&line).ok(), "{}", line);
            }
        }
    }

    #[test]
    fn the_scanner_reads_the_lines_of_real_traces() {
        for line in [
            r#"{"input_toks": 3, "output_toks": 8, "arrival_time_ns": 1500000, "input_tok_ids": [1, 2, 3], "output_tok_ids": [4, 5]}"#,
            r#"{"input_ids":[5],"output_len":0,"timestamp_ms":7,"session_id":"a b"}"#,
        ] {
            assert_eq!(
                Fields::scan(line),
                Some(Fields::parse(line).unwrap()),
                "{line}"
            );
        }
    }

    #[test]
    fn ids_stay_text_and_parse_back() {
        let raw = |text: &'static str| serde_json::from_str::<&RawValue>(text).unwrap();
        let mut ids = TokenIds::from_json(raw(" [ 7, 4294967295 ,0] ")).unwrap();
        assert_eq!(ids.len(), 3);
        assert_eq!(ids.ids().collect::<Vec<_>>(), vec![7, u32::MAX, 0]);
        ids.prepend(2);
        assert_eq!(ids.ids().collect::<Vec<_>>(), vec![2, 7, u32::MAX, 0]);
        for bad in ["[1.5]", "[1e3]", "{}", "[\"1\"]", "[-1]", "[[1]]"] {
            assert!(TokenIds::from_json(raw(bad)).is_err(), "{bad}");
        }
        assert!(TokenIds::from_json(raw("[ ]")).unwrap().is_empty());
        assert_eq!(TokenIds::from_json(raw("[\n1,\t2 ]")).unwrap().len(), 2);
        let many = TokenIds::from_ids(&(0..10).collect::<Vec<u32>>());
        assert_eq!(many.block_text(4, 0), "0,1,2,3");
        assert_eq!(many.block_text(4, 1), "4,5,6,7");
        assert_eq!(many.block_text(4, 2), "8,9");
        assert_eq!(many.block_text(4, 3), "");
    }

    #[test]
    fn decoding_matches_the_tokenizers_own_decode_with_or_without_a_decoder() {
        let fixture = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("fixtures/tokenizer_wordlevel.json");
        let mut json: serde_json::Value =
            serde_json::from_slice(&std::fs::read(fixture).unwrap()).unwrap();
        let decoders = [
            serde_json::Value::Null,
            serde_json::json!({"type": "Fuse"}),
            serde_json::json!({"type": "WordPiece", "prefix": "##", "cleanup": true}),
        ];
        let dir = tempfile::tempdir().unwrap();
        for decoder in decoders {
            json["decoder"] = decoder.clone();
            let path = dir.path().join("tokenizer.json");
            std::fs::write(&path, json.to_string()).unwrap();
            let ours = TokenDecoder::from_file(&path).unwrap();
            let theirs = tokenizers::Tokenizer::from_file(&path).unwrap();
            for ids in [vec![1u32, 2, 3, 4, 1, 5], vec![0, 19, 7], vec![11]] {
                let text = ours.decode(&TokenIds::from_ids(&ids)).unwrap();
                assert_eq!(text, theirs.decode(&ids, false).unwrap(), "{decoder}");
            }
            let unknown = ours.decode(&TokenIds::from_ids(&[3, 20])).unwrap_err();
            assert_eq!(unknown.kind, SkipKind::OutOfBounds);
        }
    }
}
