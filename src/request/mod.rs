//! Endpoint classification and extraction of the routing input (model, token IDs or text, cache
//! partition namespace) from a request head and body.
//!
//! Key types: [`Endpoint`] and [`Method`] (what a request targets), [`RoutingInput`] (a reusable, per-connection
//! buffer that [`extract`] fills; it keeps its capacity so the steady state does not allocate) and
//! [`RoutingKey`] (what the policy looks up: token IDs or text, never both).
//!
//! Precedence, per the spec ("How the Prefix Index Works"): a valid `x-smg-routing-tokens` header
//! (regular mode only) beats `/generate` `input_ids`, which beat text. A malformed or oversized header
//! is ignored, never an error. Errors: only a body that is not a JSON object is an error
//! ([`RequestError`]); the gateway answers it with its [`RequestError::status`] (400). Fields of an
//! unexpected type are ignored: the engine, not the router, rejects them.

mod body;
mod endpoint;
mod header;
pub mod id;
mod partition;
mod scan;

pub use endpoint::{Endpoint, Handling, Method};
pub use header::{parse_routing_tokens, ROUTING_TOKENS_BYTES_MAX, ROUTING_TOKENS_IDS_MAX};
pub use partition::{PartitionFields, PartitionNamespace};

use std::sync::Arc;

use scan::{TextMode, TextPiece};

/// When the policy records text keys ([`RoutingInput::build_text_for_index`]), bodies from this
/// size up have their prompt text built once in a shared buffer that the dispatch record and
/// the index keep as they are (`RoutingInput::shared_text`), instead of in the connection's
/// text buffer, which the record would then copy into a fresh buffer: the text exists once
/// besides the body, and the gateway writes it once. Below it the reused buffer saves an
/// allocation (the record's copy of a short text is cheap).
pub const SHARED_TEXT_BODY_BYTES_MIN: usize = 4096;

/// The header carrying the prompt's leading token IDs (comma-separated decimals).
pub const ROUTING_TOKENS_HEADER: &str = "x-smg-routing-tokens";
/// The header naming a routing key for `--policy consistent_hashing`.
pub const ROUTING_KEY_HEADER: &str = "x-smg-routing-key";
/// The header naming the exact worker URL for `--policy consistent_hashing`.
pub const TARGET_WORKER_HEADER: &str = "x-smg-target-worker";

/// Whether the gateway runs in regular mode or prefill-decode disaggregated (PD) mode. The
/// `x-smg-routing-tokens` hint applies in regular mode only.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum RoutingMode {
    /// One worker serves the whole request.
    #[default]
    Regular,
    /// Prefill and decode run on separate workers.
    PrefillDecode,
}

/// The request-head facts extraction reads besides the body.
#[derive(Clone, Copy, Debug, Default)]
pub struct RoutingHeaders<'a> {
    /// Regular or PD mode.
    pub mode: RoutingMode,
    /// The raw value of `x-smg-routing-tokens`, if present.
    pub routing_tokens: Option<&'a [u8]>,
    /// The raw value of `x-smg-routing-key`, if present.
    pub routing_key: Option<&'a [u8]>,
    /// The raw value of `x-smg-target-worker`, if present.
    pub target_worker: Option<&'a [u8]>,
}

/// Where the routing key of a request came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KeySource {
    /// The `x-smg-routing-tokens` header.
    TokensHeader,
    /// `/generate` `input_ids` (the first sequence of a batch).
    InputIds,
    /// The prompt text (or the messages' text in order).
    Text,
    /// The gateway's tokenizer: the IDs the engine computes for the prompt (chat rendered
    /// with the model's template), filled by the router through [`RoutingInput::tokenizer_output`].
    Tokenized,
}

/// What the policy looks up in the index: token IDs (token tree) or text (string tree). Text and
/// token requests never match each other.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RoutingKey<'a> {
    /// Token IDs: looked up in the token tree.
    Tokens(&'a [u32]),
    /// Text: looked up in the string tree (may be empty: nothing to match).
    Text(&'a str),
}

impl RoutingKey<'_> {
    /// True when there is nothing to look up.
    pub fn is_empty(&self) -> bool {
        match self {
            RoutingKey::Tokens(tokens) => tokens.is_empty(),
            RoutingKey::Text(text) => text.is_empty(),
        }
    }
}

/// The body is not usable as a routed request. Each kind maps to HTTP 400.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum RequestError {
    /// The body is not valid JSON.
    #[error("request body is not valid JSON: {category} at line {line} column {column}")]
    MalformedJson {
        /// serde_json's error category (`syntax`, `eof`, `data`, `io`).
        category: &'static str,
        /// 1-based line of the error.
        line: usize,
        /// 1-based column of the error.
        column: usize,
    },
    /// The body is not UTF-8, as JSON text must be (RFC 8259 §8.1).
    #[error(
        "request body is not valid UTF-8 (JSON text must be): invalid byte at offset {offset}"
    )]
    InvalidUtf8 {
        /// Offset of the first byte that is not UTF-8.
        offset: usize,
    },
}

impl RequestError {
    /// The HTTP status the gateway answers with.
    pub fn status(&self) -> u16 {
        400
    }

    /// The OpenAI-style error `type` for the JSON error body.
    pub fn error_type(&self) -> &'static str {
        "invalid_request_error"
    }
}

/// The routing input of one request, reused across requests: [`extract`] clears and refills it,
/// keeping the buffers' capacity.
#[derive(Debug, Default)]
pub struct RoutingInput {
    endpoint: Option<Endpoint>,
    model: String,
    text: String,
    /// The text of a large body (`SHARED_TEXT_BODY_BYTES_MIN`), instead of `text`.
    shared_text: Option<Arc<str>>,
    /// Where the scanner found the text, for `shared_text`.
    text_pieces: Vec<TextPiece>,
    tokens: Vec<u32>,
    source: Option<KeySource>,
    namespace: PartitionNamespace,
    routing_key_hash: Option<u64>,
    target_worker: String,
    /// Scratch for the Messages API `system` field, prepended to the messages' text.
    system: String,
    /// Where the scanner found the `system` field's text, for `shared_text`.
    system_pieces: Vec<TextPiece>,
    /// Scratch for decoding strings with escapes (`scan`).
    scratch: Vec<u8>,
    /// The request's output budget: `max_completion_tokens` or `max_tokens`, or `/generate`'s
    /// `sampling_params.max_new_tokens`.
    max_output_tokens: Option<u32>,
    /// Set by `build_text_for_index`; kept across extractions.
    text_for_index: bool,
}

impl RoutingInput {
    /// An empty input; buffers grow on first use and are kept.
    pub fn new() -> Self {
        Self::default()
    }

    /// The most tokens the request asks to generate (`max_completion_tokens`, else `max_tokens`;
    /// `/generate`: `sampling_params.max_new_tokens`); `None` when it sets none.
    pub fn max_output_tokens(&self) -> Option<u32> {
        self.max_output_tokens
    }

    /// The endpoint of the last extraction.
    pub fn endpoint(&self) -> Option<Endpoint> {
        self.endpoint
    }

    /// The `model` field (empty when absent, as on most `/generate` requests).
    pub fn model(&self) -> &str {
        &self.model
    }

    /// The routing key: token IDs when the request carries them, its text otherwise.
    pub fn key(&self) -> RoutingKey<'_> {
        match self.source {
            Some(KeySource::TokensHeader | KeySource::InputIds | KeySource::Tokenized) => {
                RoutingKey::Tokens(&self.tokens)
            }
            _ => RoutingKey::Text(self.text()),
        }
    }

    /// Where the key came from (`None` before the first extraction).
    pub fn key_source(&self) -> Option<KeySource> {
        self.source
    }

    /// The cache partition namespace (unpartitioned unless a partition field was set).
    pub fn namespace(&self) -> PartitionNamespace {
        self.namespace
    }

    /// xxh3 of the `x-smg-routing-key` header value, if present and non-empty.
    pub fn routing_key_hash(&self) -> Option<u64> {
        self.routing_key_hash
    }

    /// The `x-smg-target-worker` header value, if present and non-empty.
    pub fn target_worker(&self) -> Option<&str> {
        (!self.target_worker.is_empty()).then_some(self.target_worker.as_str())
    }

    /// The prompt text extracted (the routing key unless the request carries or was given
    /// token IDs; a completions prompt exactly as sent).
    pub fn text(&self) -> &str {
        self.shared_text.as_deref().unwrap_or(&self.text)
    }

    /// The text when it was built in a shared buffer (a body of `SHARED_TEXT_BODY_BYTES_MIN`
    /// or more): the dispatch record keeps it as it is instead of copying it.
    pub fn shared_text(&self) -> Option<&Arc<str>> {
        self.shared_text.as_ref()
    }

    /// Lets go of a shared text (the record and the index keep their own references).
    pub fn release_shared_text(&mut self) {
        self.shared_text = None;
    }

    /// The buffer, emptied, that the gateway's tokenizer fills with the prompt's IDs;
    /// [`RoutingInput::set_tokenized`] then makes them the key.
    pub fn tokenizer_output(&mut self) -> &mut Vec<u32> {
        self.tokens.clear();
        &mut self.tokens
    }

    /// Makes the IDs written to [`RoutingInput::tokenizer_output`] the routing key (no IDs:
    /// the key stays the text).
    pub fn set_tokenized(&mut self) {
        if !self.tokens.is_empty() {
            self.source = Some(KeySource::Tokenized);
        }
    }

    /// Whether the next extractions build a large body's text for the index (see
    /// [`SHARED_TEXT_BODY_BYTES_MIN`]): set when the policy records text keys, left off by
    /// policies that never keep the text (a reused buffer serves them best).
    pub fn build_text_for_index(&mut self, yes: bool) {
        self.text_for_index = yes;
    }

    /// Bytes of buffer kept for the next extraction.
    pub fn retained_bytes(&self) -> usize {
        self.model.capacity()
            + self.text.capacity()
            + self.tokens.capacity() * std::mem::size_of::<u32>()
            + self.target_worker.capacity()
            + self.system.capacity()
            + self.scratch.capacity()
            + (self.text_pieces.capacity() + self.system_pieces.capacity())
                * std::mem::size_of::<TextPiece>()
    }

    fn clear(&mut self) {
        self.endpoint = None;
        self.clear_body_fields(TokensRead::FromBody);
        self.source = None;
        self.namespace = PartitionNamespace::UNPARTITIONED;
        self.routing_key_hash = None;
        self.target_worker.clear();
    }

    /// Forgets what a body reader writes: before a request, and before the reference reader
    /// starts again where the scanner gave up. The token IDs stay when they came from the
    /// routing-tokens header, which no body reader touches.
    fn clear_body_fields(&mut self, tokens: TokensRead) {
        self.model.clear();
        self.text.clear();
        self.shared_text = None;
        self.text_pieces.clear();
        if tokens == TokensRead::FromBody {
            self.tokens.clear();
        }
        self.system.clear();
        self.system_pieces.clear();
        self.max_output_tokens = None;
    }
}

/// Fills `input` with the routing input of one request: classify-then-extract is the gateway's
/// job; this reads the body (one pass, without building a DOM: `scan`, which hands invalid and
/// unusual bodies to the reference reader `body`) and the routing headers.
pub fn extract(
    endpoint: Endpoint,
    body: &[u8],
    headers: RoutingHeaders<'_>,
    input: &mut RoutingInput,
) -> Result<(), RequestError> {
    let text_mode = if input.text_for_index && body.len() >= SHARED_TEXT_BODY_BYTES_MIN {
        TextMode::Shared
    } else {
        TextMode::Reused
    };
    extract_with(BodyReader::Scan(text_mode), endpoint, body, headers, input)
}

/// [`extract`] building the text in a shared buffer whatever the body's size: the equivalence
/// tests and the fuzz target check it against the reference on small bodies too. Not for the
/// gateway's use.
#[doc(hidden)]
pub fn extract_shared_text(
    endpoint: Endpoint,
    body: &[u8],
    headers: RoutingHeaders<'_>,
    input: &mut RoutingInput,
) -> Result<(), RequestError> {
    let reader = BodyReader::Scan(TextMode::Shared);
    extract_with(reader, endpoint, body, headers, input)
}

/// [`extract`] with the reference body reader alone (`serde_json` visitors), which the fast
/// reader hands unusual bodies to: the oracle of the equivalence tests and the baseline of the
/// extraction benchmark (`perf/extract.rs`). Not for the gateway's use.
#[doc(hidden)]
pub fn extract_reference(
    endpoint: Endpoint,
    body: &[u8],
    headers: RoutingHeaders<'_>,
    input: &mut RoutingInput,
) -> Result<(), RequestError> {
    extract_with(BodyReader::Reference, endpoint, body, headers, input)
}

/// Where a request's token IDs are read from (see `RoutingInput::clear_body_fields`).
#[derive(Clone, Copy, PartialEq, Eq)]
enum TokensRead {
    /// The routing-tokens header, already parsed into the input.
    FromHeader,
    /// The body (`input_ids`), or nowhere.
    FromBody,
}

/// Which reader reads the body.
#[derive(Clone, Copy, PartialEq, Eq)]
enum BodyReader {
    /// The one-pass scanner (`scan`), handing what it is unsure of to the reference reader.
    Scan(TextMode),
    /// The `serde_json` visitors (`body`) alone.
    Reference,
}

fn extract_with(
    reader: BodyReader,
    endpoint: Endpoint,
    body: &[u8],
    headers: RoutingHeaders<'_>,
    input: &mut RoutingInput,
) -> Result<(), RequestError> {
    input.clear();
    input.endpoint = Some(endpoint);
    let header_tokens = headers.mode == RoutingMode::Regular
        && headers
            .routing_tokens
            .is_some_and(|value| parse_routing_tokens(value, &mut input.tokens));
    if !header_tokens {
        input.tokens.clear();
    }
    let key_fields = if header_tokens {
        body::KeyFields::Skip
    } else {
        body::KeyFields::Read
    };
    let scanned = match reader {
        BodyReader::Scan(text_mode) => {
            scan::read(endpoint, body, key_fields, text_mode, input).ok()
        }
        BodyReader::Reference => None,
    };
    let partition = match scanned {
        Some(partition) => partition,
        None => {
            // The scanner may have read part of the body, or all of it before the shared
            // text's UTF-8 check refused it: start again from a clean input.
            let tokens = if header_tokens {
                TokensRead::FromHeader
            } else {
                TokensRead::FromBody
            };
            input.clear_body_fields(tokens);
            body::read(endpoint, body, key_fields, input)?
        }
    };
    input.namespace = partition;
    input.source = Some(if header_tokens {
        KeySource::TokensHeader
    } else if !input.tokens.is_empty() {
        KeySource::InputIds
    } else {
        KeySource::Text
    });
    if !input.system.is_empty() && !header_tokens {
        join_system_prompt(&mut input.text, &input.system);
    }
    read_hashing_headers(headers, input);
    Ok(())
}

/// Messages API: the `system` prompt comes first, then the messages, one space between.
fn join_system_prompt(text: &mut String, system: &str) {
    if text.is_empty() {
        text.push_str(system);
    } else {
        text.insert(0, ' ');
        text.insert_str(0, system);
    }
}

fn read_hashing_headers(headers: RoutingHeaders<'_>, input: &mut RoutingInput) {
    if let Some(key) = headers.routing_key.filter(|k| !k.is_empty()) {
        input.routing_key_hash = Some(xxhash_rust::xxh3::xxh3_64(key));
    }
    if let Some(url) = headers
        .target_worker
        .and_then(|v| std::str::from_utf8(v).ok())
    {
        input.target_worker.push_str(url.trim());
    }
}

#[cfg(test)]
mod tests;

#[cfg(test)]
mod equivalence;
