//! Gateway tokenization: a model's Hugging Face tokenizer and chat template, so chat,
//! completions and messages requests route on the token IDs the engine will compute (the token
//! tree and the hash index match IDs; engines reuse KV cache by pages of IDs).
//!
//! Key types: [`ModelTokenizer`] (one model's `tokenizer.json`, chat template and split rule,
//! built once at start from file contents: no I/O here), [`TokenizerSet`] (which model uses
//! which), [`TokenCache`] (one per data core: L0 whole prompts, L1 segments), and the request's
//! pipeline: [`ModelTokenizer::prompt`] renders the prompt, [`begin`] cuts it at the added
//! tokens (`split`), takes every segment it can from the cache and returns either the IDs or a
//! [`ColdWork`]: the segments never seen, to tokenize inline or on the tokenizer pool
//! ([`ColdWork::run`], pure and `Send`), after which [`finish`] caches them and assembles the
//! IDs. The engines' behaviour is kept: chat prompts are encoded without the post-processor's
//! special tokens (`apply_chat_template` does not add them), completions prompts with them.
//!
//! The encoder: text between added tokens is encoded by kvgate's own byte-level BPE
//! ([`bpe::ByteLevelBpe`]) when the model's `tokenizer.json` is of a kind it implements (Llama
//! 3's and Qwen2/3's), checked against the crate on probe strings at load (on a thread of its
//! own: `bpe::BpeSlot`, which logs the outcome); otherwise, while it is built, and for prompts
//! encoded with the post-processor's tokens in one piece, by the `tokenizers` crate.
//! [`ModelTokenizer::encoder`] says which.
//!
//! Errors: a file that does not load is a [`LoadError`] (a one-line start-up error); a request
//! that cannot be rendered or encoded is a [`TokenizeError`], and the request then routes on
//! its text, exactly as a model without a tokenizer does.

mod args;
pub mod bpe;
mod cache;
mod concat;
mod decode;
mod prompt;
mod split;
mod stop;
mod template;

use std::ops::Range;
use std::sync::{Arc, OnceLock};

use arc_swap::ArcSwap;
use tokenizers::Tokenizer;
use xxhash_rust::xxh3::{xxh3_64, xxh3_64_with_seed};

use crate::limits::{TOKENIZER_PRETOKEN_BYTES_MAX, TOKENIZE_PROMPT_BYTES_MAX};
pub use args::{ModelSpec, TokenizerArgs};
use bpe::BpeSlot;
pub use bpe::{ByteLevelBpe, PretokenTooLong};
pub use cache::{CacheConfig, CacheStats, TokenCache, ENTRY_OVERHEAD_BYTES, L0_ENTRY_TOKENS_MAX};
pub use decode::{DecodeStream, DecodeTable, DecoderKind, FirstSpace};
pub use prompt::{chat_input, messages_input};
pub use split::{chunks, Chunking, Piece, SpecialSplit, SplitSafety};
pub use stop::{MatchedStop, StopMatcher, StopSet, StopState};
pub use template::{ChatInput, ChatTemplate, ContentFormat, TemplateError};

/// A tokenizer's files could not be used (the message names what and why).
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct LoadError(pub String);

/// A request could not be tokenized: it routes on its text.
#[derive(Clone, Debug, thiserror::Error, PartialEq, Eq)]
pub enum TokenizeError {
    /// The body does not have the shape a template reads.
    #[error("the body has no messages a chat template can render")]
    Body,
    /// The model has a tokenizer but no chat template.
    #[error("no chat template")]
    NoTemplate,
    /// The template failed (e.g. `raise_exception`).
    #[error("{0}")]
    Template(String),
    /// The tokenizer failed.
    #[error("tokenizer: {0}")]
    Encode(String),
    /// The prompt is past what kvgate tokenizes (`TOKENIZE_PROMPT_BYTES_MAX` bytes,
    /// `TOKENIZE_MESSAGES_MAX` messages, or a word past `TOKENIZER_PRETOKEN_BYTES_MAX` for the
    /// crate): named by what is too large.
    #[error("too many {0} to tokenize")]
    TooLarge(&'static str),
}

/// What a request gives the tokenizer.
#[derive(Clone, Copy, Debug)]
pub enum PromptSource<'a> {
    /// A completions prompt, tokenized as given.
    Completion(&'a str),
    /// A chat completions body (OpenAI messages).
    Chat(&'a [u8]),
    /// An Anthropic Messages body.
    Messages(&'a [u8]),
}

impl PromptSource<'_> {
    /// Its bytes: the body, or the completions prompt.
    pub fn len(&self) -> usize {
        match self {
            PromptSource::Completion(text) => text.len(),
            PromptSource::Chat(body) | PromptSource::Messages(body) => body.len(),
        }
    }

    /// Whether it has no bytes.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// A copy that can go to another thread.
    fn to_owned_source(self) -> OwnedSource {
        match self {
            PromptSource::Completion(text) => OwnedSource::Completion(text.to_owned()),
            PromptSource::Chat(body) => OwnedSource::Chat(body.to_vec()),
            PromptSource::Messages(body) => OwnedSource::Messages(body.to_vec()),
        }
    }
}

/// A [`PromptSource`] copied for the tokenizer pool.
#[derive(Debug)]
enum OwnedSource {
    Completion(String),
    Chat(Vec<u8>),
    Messages(Vec<u8>),
}

impl OwnedSource {
    fn source(&self) -> PromptSource<'_> {
        match self {
            OwnedSource::Completion(text) => PromptSource::Completion(text),
            OwnedSource::Chat(body) => PromptSource::Chat(body),
            OwnedSource::Messages(body) => PromptSource::Messages(body),
        }
    }
}

/// The text the engine tokenizes, and whether the post-processor's special tokens are added.
#[derive(Debug, Default)]
pub struct Prompt {
    /// The prompt text (a chat's rendered template).
    pub text: String,
    /// True for completions prompts (the engines' `add_special_tokens` default), false for chat.
    pub add_special_tokens: bool,
}

/// The tokens the post-processor adds around one sequence (`add_special_tokens`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
struct Affixes {
    prefix: Vec<u32>,
    suffix: Vec<u32>,
}

/// One model's tokenizer, chat template and split rule. Built once at start; shared read-only
/// by the data cores and the tokenizer pool.
pub struct ModelTokenizer {
    label: String,
    tokenizer: Arc<Tokenizer>,
    template: Option<ChatTemplate>,
    /// The added-token cut, when pieces are exact for this tokenizer (`None`: whole prompts).
    split: Option<SpecialSplit>,
    /// Whether long pieces are cut into chunks too.
    chunking: Chunking,
    /// The post-processor's tokens, when they could be told apart (`None`: prompts encoded with
    /// special tokens are tokenized whole).
    affixes: Option<Affixes>,
    /// Seeds cache keys: two models never share entries.
    seed: u64,
    /// kvgate's encoder for text without added tokens, when it implements this tokenizer (built
    /// on its own thread at load).
    bpe: Arc<BpeSlot>,
    /// The detokenizer's table (a pass over the vocabulary), built once at load
    /// ([`ModelTokenizer::decode_table`]) and read by every core.
    decode: OnceLock<Arc<DecodeTable>>,
    notes: Vec<String>,
}

impl std::fmt::Debug for ModelTokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ModelTokenizer")
            .field("label", &self.label)
            .field("template", &self.template)
            .field("splits", &self.split.is_some())
            .field("encoder", &self.bpe.describe())
            .finish_non_exhaustive()
    }
}

/// The contents of one model's tokenizer files.
#[derive(Debug, Default)]
pub struct TokenizerFiles {
    /// `tokenizer.json`.
    pub tokenizer_json: Vec<u8>,
    /// `tokenizer_config.json`, if present (special tokens, and the template when no other).
    pub tokenizer_config_json: Option<Vec<u8>>,
    /// A chat template given apart (`--chat-template`, `chat_template.jinja`, ...).
    pub chat_template: Option<String>,
}

impl ModelTokenizer {
    /// Builds a model's tokenizer from its files' contents; `label` names it in messages.
    pub fn new(label: &str, files: TokenizerFiles) -> Result<ModelTokenizer, LoadError> {
        let tokenizer = Tokenizer::from_bytes(&files.tokenizer_json)
            .map_err(|e| LoadError(format!("{label}: tokenizer.json: {e}")))?;
        let config: Option<serde_json::Value> = match &files.tokenizer_config_json {
            Some(bytes) => Some(
                serde_json::from_slice(bytes)
                    .map_err(|e| LoadError(format!("{label}: tokenizer_config.json: {e}")))?,
            ),
            None => None,
        };
        let special_tokens = config.as_ref().map(special_tokens).unwrap_or_default();
        let source = files
            .chat_template
            .or_else(|| config.as_ref().and_then(config_template));
        let template = match source {
            Some(source) => Some(
                ChatTemplate::new(source, special_tokens)
                    .map_err(|e| LoadError(format!("{label}: {e}")))?,
            ),
            None => None,
        };
        let mut notes = Vec::new();
        let split = match SplitSafety::check(&tokenizer) {
            SplitSafety::Exact => SpecialSplit::new(&tokenizer)
                .map_err(|e| LoadError(format!("{label}: added tokens: {e}")))?,
            SplitSafety::Unsafe(reason) => {
                notes.push(format!(
                    "tokenizer of {label}: {reason}; segments would not be exact, whole prompts are tokenized"
                ));
                None
            }
        };
        let chunking = Chunking::of(&tokenizer);
        let mut model = ModelTokenizer {
            label: label.to_owned(),
            tokenizer: Arc::new(tokenizer),
            template,
            split,
            chunking,
            affixes: None,
            seed: xxh3_64(&files.tokenizer_json),
            bpe: Arc::default(),
            decode: OnceLock::new(),
            notes,
        };
        if model.split.is_some() {
            if let Err(probe) = model.probe_split() {
                model.notes.push(format!(
                    "tokenizer of {label}: pieces of {probe:?} tokenize differently from the whole; whole prompts are tokenized"
                ));
                model.split = None;
            }
        }
        model.affixes = model.probe_affixes();
        let has_added = !model.tokenizer.get_added_tokens_decoder().is_empty();
        model.bpe = if has_added && model.split.is_none() {
            BpeSlot::crate_only("the added-token cut is not exact")
        } else {
            BpeSlot::build(label, files.tokenizer_json, model.tokenizer.clone())
        };
        if model.template.is_none() {
            model.notes.push(format!(
                "tokenizer of {label}: no chat template; chat requests route on text"
            ));
        }
        Ok(model)
    }

    /// The detokenizer's table of this tokenizer, shared read-only by every core. The gateway
    /// starts building it when it loads the tokenizer (`config`); a caller that comes before
    /// the build ends waits for it, and one without that build builds it.
    pub fn decode_table(&self) -> &Arc<DecodeTable> {
        self.decode
            .get_or_init(|| Arc::new(DecodeTable::of(self.tokenizer.clone())))
    }

    /// Whether the detokenizer's table is built already.
    pub fn has_decode_table(&self) -> bool {
        self.decode.get().is_some()
    }

    /// Which encoder encodes this model's text now, and why.
    pub fn encoder(&self) -> String {
        self.bpe.describe()
    }

    /// Whether kvgate's byte-level BPE encodes this model's text now (false: the crate does,
    /// for good or while the BPE is built).
    pub fn uses_own_bpe(&self) -> bool {
        self.bpe.get().is_some()
    }

    /// Waits until kvgate's BPE is built (or refused); then [`ModelTokenizer::uses_own_bpe`].
    pub fn wait_for_own_bpe(&self) -> bool {
        self.bpe.wait()
    }

    /// This model with its text encoded by the `tokenizers` crate alone (kvgate's BPE dropped):
    /// the baseline of benchmarks and comparisons.
    pub fn with_crate_encoder(mut self) -> ModelTokenizer {
        self.bpe = BpeSlot::crate_only("kvgate's BPE turned off");
        self
    }

    /// What the log should say about this model at start (fallbacks and why).
    pub fn notes(&self) -> &[String] {
        &self.notes
    }

    /// Whether prompts are cut into cached segments (false: whole prompts, L0 only).
    pub fn splits(&self) -> bool {
        self.split.is_some()
    }

    /// Whether long segments are cut into chunks too.
    pub fn chunking(&self) -> Chunking {
        if self.split.is_some() {
            self.chunking
        } else {
            Chunking::Off
        }
    }

    /// The text ranges `range` of `text` is tokenized in: itself, or its chunks.
    fn text_ranges(&self, text: &str, range: Range<usize>, out: &mut Vec<Range<usize>>) {
        out.clear();
        match self.chunking {
            Chunking::AtSpaces => chunks(text, range, out),
            Chunking::Off => out.push(range),
        }
    }

    /// The chat template, if the model has one.
    pub fn template(&self) -> Option<&ChatTemplate> {
        self.template.as_ref()
    }

    /// The underlying tokenizer (for comparisons and benchmarks).
    pub fn inner(&self) -> &Tokenizer {
        &self.tokenizer
    }

    /// The prompt the engine tokenizes for `source`; a source or a rendered prompt longer than
    /// [`TOKENIZE_PROMPT_BYTES_MAX`] is [`TokenizeError::TooLarge`].
    pub fn prompt(&self, source: PromptSource<'_>) -> Result<Prompt, TokenizeError> {
        if source.len() > TOKENIZE_PROMPT_BYTES_MAX {
            return Err(TokenizeError::TooLarge("bytes"));
        }
        let input = match source {
            PromptSource::Completion(text) => {
                return Ok(Prompt {
                    text: text.to_owned(),
                    add_special_tokens: true,
                })
            }
            PromptSource::Chat(body) => chat_input(body)?,
            PromptSource::Messages(body) => messages_input(body)?,
        };
        let template = self.template.as_ref().ok_or(TokenizeError::NoTemplate)?;
        let text = template
            .render(&input)
            .map_err(|e| TokenizeError::Template(e.to_string()))?;
        if text.len() > TOKENIZE_PROMPT_BYTES_MAX {
            return Err(TokenizeError::TooLarge("bytes"));
        }
        Ok(Prompt {
            text,
            add_special_tokens: false,
        })
    }

    /// The IDs of `text`, a piece without added tokens (a segment or chunk of a prompt).
    fn encode_piece(&self, text: &str) -> Result<Vec<u32>, TokenizeError> {
        match self.bpe.get() {
            Some(bpe) => {
                let mut out = Vec::with_capacity(text.len() / 3);
                bpe.encode(text, &mut out).map_err(too_long)?;
                Ok(out)
            }
            None => self.encode_with_crate(text, false),
        }
    }

    /// The IDs of `text`, as the engine encodes it (`add_special_tokens` as given): kvgate's
    /// BPE between the added tokens when the model has it and no special tokens are added, the
    /// crate otherwise.
    pub fn encode(&self, text: &str, add_special_tokens: bool) -> Result<Vec<u32>, TokenizeError> {
        let Some(bpe) = self.bpe.get().filter(|_| !add_special_tokens) else {
            return self.encode_with_crate(text, add_special_tokens);
        };
        let mut out = Vec::with_capacity(text.len() / 3);
        let encoded = match &self.split {
            None => bpe.encode(text, &mut out),
            Some(split) => {
                let mut pieces = Vec::new();
                split.split(text, &mut pieces);
                pieces.into_iter().try_for_each(|piece| match piece {
                    Piece::Special(id) => {
                        out.push(id);
                        Ok(())
                    }
                    Piece::Text(range) => bpe.encode(&text[range], &mut out),
                })
            }
        };
        encoded.map_err(too_long)?;
        Ok(out)
    }

    /// The IDs of `text` from the `tokenizers` crate alone (the reference of kvgate's BPE). A
    /// text with a pre-token past [`TOKENIZER_PRETOKEN_BYTES_MAX`] is refused, as kvgate's BPE
    /// refuses it: the crate merges a long word in O(n log n) time and about 85 bytes a byte (a
    /// 16 MB word took 19 s and 1.4 GB).
    pub fn encode_with_crate(
        &self,
        text: &str,
        add_special_tokens: bool,
    ) -> Result<Vec<u32>, TokenizeError> {
        if text.len() > TOKENIZER_PRETOKEN_BYTES_MAX && self.has_long_word(text) {
            return Err(TokenizeError::TooLarge("bytes in one word"));
        }
        let encoding = self
            .tokenizer
            .encode_fast(text, add_special_tokens)
            .map_err(|e| TokenizeError::Encode(e.to_string()))?;
        Ok(encoding.get_ids().to_vec())
    }

    /// Whether a pre-token of `text` (as the model's pre-tokenizer cuts it; the whole text for
    /// a model without one) is longer than [`TOKENIZER_PRETOKEN_BYTES_MAX`].
    fn has_long_word(&self, text: &str) -> bool {
        use tokenizers::PreTokenizer;
        let Some(pre_tokenizer) = self.tokenizer.get_pre_tokenizer() else {
            return true;
        };
        let mut pieces = tokenizers::PreTokenizedString::from(text);
        if pre_tokenizer.pre_tokenize(&mut pieces).is_err() {
            return true;
        }
        pieces
            .get_splits(
                tokenizers::OffsetReferential::Original,
                tokenizers::OffsetType::Byte,
            )
            .iter()
            .any(|(piece, _, _)| piece.len() > TOKENIZER_PRETOKEN_BYTES_MAX)
    }

    /// Checks on probe strings around the added tokens that pieces tokenize like the whole;
    /// returns the first probe that does not.
    fn probe_split(&self) -> Result<(), String> {
        let mut specials: Vec<String> = self
            .tokenizer
            .get_added_tokens_decoder()
            .into_values()
            .map(|t| t.content)
            .collect();
        specials.sort();
        specials.truncate(4);
        let texts = [
            "Hello world",
            " leading space",
            "\n\nparagraph\n",
            "trailing  \t",
            "café 日本語 🎉 x̧",
            "  ",
            "123456 7.5e-3",
        ];
        for (i, special) in specials.iter().enumerate() {
            let mut probe = String::new();
            for (j, text) in texts.iter().enumerate() {
                probe.push_str(text);
                probe.push_str(&specials[(i + j) % specials.len()]);
            }
            probe.push_str(special);
            probe.push_str("end");
            let mut out = Vec::new();
            let whole = self.encode(&probe, false).map_err(|_| probe.clone())?;
            self.encode_pieces_uncached(&probe, &mut out)
                .map_err(|_| probe.clone())?;
            if whole != out {
                return Err(probe);
            }
        }
        Ok(())
    }

    /// The IDs of `text`, piece by piece, without the cache (exactness checks).
    pub fn encode_pieces_uncached(
        &self,
        text: &str,
        out: &mut Vec<u32>,
    ) -> Result<(), TokenizeError> {
        let Some(split) = &self.split else {
            out.extend(self.encode(text, false)?);
            return Ok(());
        };
        let (mut pieces, mut ranges) = (Vec::new(), Vec::new());
        split.split(text, &mut pieces);
        for piece in pieces {
            match piece {
                Piece::Special(id) => out.push(id),
                Piece::Text(range) => {
                    self.text_ranges(text, range, &mut ranges);
                    for range in &ranges {
                        out.extend(self.encode_piece(&text[range.clone()])?);
                    }
                }
            }
        }
        Ok(())
    }

    /// The post-processor's tokens around a sequence, found by encoding probes with and without
    /// them (`None` when two probes disagree: then those prompts are tokenized whole).
    fn probe_affixes(&self) -> Option<Affixes> {
        let mut found = None;
        for probe in ["a b", "Hello, world\n"] {
            let with = self.encode(probe, true).ok()?;
            let without = self.encode(probe, false).ok()?;
            let at = (0..=with.len().checked_sub(without.len())?)
                .find(|&at| with[at..at + without.len()] == without[..])?;
            let affixes = Affixes {
                prefix: with[..at].to_vec(),
                suffix: with[at + without.len()..].to_vec(),
            };
            if found.as_ref().is_some_and(|f| *f != affixes) {
                return None;
            }
            found = Some(affixes);
        }
        found
    }

    fn prompt_key(&self, prompt: &Prompt) -> u64 {
        let seed = self.seed ^ u64::from(prompt.add_special_tokens);
        xxh3_64_with_seed(prompt.text.as_bytes(), seed)
    }

    fn segment_key(&self, segment: &str) -> u64 {
        // Apart from prompt keys: a segment and a prompt of equal text hold different IDs.
        xxh3_64_with_seed(segment.as_bytes(), self.seed.rotate_left(17) ^ 2)
    }
}

/// The special tokens a template may print: every `*_token` of `tokenizer_config.json` that is
/// a string or an `{"content": ...}` object.
fn special_tokens(config: &serde_json::Value) -> Vec<(String, String)> {
    let Some(map) = config.as_object() else {
        return Vec::new();
    };
    map.iter()
        .filter(|(name, _)| name.ends_with("_token"))
        .filter_map(|(name, value)| {
            let token = value
                .as_str()
                .or_else(|| value.get("content").and_then(serde_json::Value::as_str))?;
            Some((name.clone(), token.to_owned()))
        })
        .collect()
}

/// `chat_template` of `tokenizer_config.json`: a string, or a list of named templates whose
/// `default` is used.
fn config_template(config: &serde_json::Value) -> Option<String> {
    match config.get("chat_template")? {
        serde_json::Value::String(source) => Some(source.clone()),
        serde_json::Value::Array(named) => named
            .iter()
            .find(|t| t.get("name").and_then(|n| n.as_str()) == Some("default"))
            .and_then(|t| t.get("template")?.as_str().map(str::to_owned)),
        _ => None,
    }
}

/// A word kvgate's BPE refused: past the caps, like the crate's refusal of the same word.
fn too_long(_: PretokenTooLong) -> TokenizeError {
    TokenizeError::TooLarge("bytes in one word")
}

/// Which model uses which tokenizer: by model name, else one fetched from a gRPC worker, else
/// the default (a tokenizer given without a model name).
///
/// The flags' tokenizers are fixed at start. Fetched ones (`GetTokenizer`, `control::
/// tokenizer_fetch`) come later: the control side publishes a new list with one atomic swap
/// ([`TokenizerSet::publish`]) and the data cores read it with one atomic load, no lock.
#[derive(Debug, Default)]
pub struct TokenizerSet {
    by_model: Vec<(String, Arc<ModelTokenizer>)>,
    default: Option<Arc<ModelTokenizer>>,
    /// Tokenizers fetched from gRPC workers, by model (written by the control side only).
    fetched: ArcSwap<Vec<(String, Arc<ModelTokenizer>)>>,
    /// Whether a gRPC worker's model without a tokenizer gets its worker's (`GetTokenizer`).
    autoload: bool,
}

impl TokenizerSet {
    /// A set from `(model name or None for the default, tokenizer)` pairs.
    pub fn new(models: Vec<(Option<String>, Arc<ModelTokenizer>)>) -> TokenizerSet {
        let mut set = TokenizerSet::default();
        for (name, tokenizer) in models {
            match name {
                Some(name) => set.by_model.push((name, tokenizer)),
                None => set.default = Some(tokenizer),
            }
        }
        set
    }

    /// This set, fetching gRPC workers' tokenizers when `autoload` (not
    /// `--disable-tokenizer-autoload`).
    pub fn with_autoload(mut self, autoload: bool) -> TokenizerSet {
        self.autoload = autoload;
        self
    }

    /// True when no model has a tokenizer, nor may get one from its worker.
    pub fn is_empty(&self) -> bool {
        self.by_model.is_empty() && self.default.is_none() && !self.autoload
    }

    /// Whether `model` should be given its worker's tokenizer: autoload is on and the model has
    /// none yet.
    pub fn wants_fetch(&self, model: &str) -> bool {
        self.autoload && self.for_model(model).is_none()
    }

    /// Adds `model`'s tokenizer fetched from its worker (the control side; a model that has one
    /// keeps it). The data cores see it on their next request.
    pub fn publish(&self, model: &str, tokenizer: Arc<ModelTokenizer>) {
        self.fetched.rcu(|current| {
            let mut next = Vec::clone(current);
            if !next.iter().any(|(name, _)| name == model) {
                next.push((model.to_owned(), tokenizer.clone()));
            }
            next
        });
    }

    /// The tokenizer of requests for `model`.
    pub fn for_model(&self, model: &str) -> Option<Arc<ModelTokenizer>> {
        let own = self.by_model.iter().find(|(name, _)| name == model);
        if let Some((_, t)) = own {
            return Some(t.clone());
        }
        let fetched = self.fetched.load();
        let fetched = fetched.iter().find(|(name, _)| name == model);
        fetched
            .map(|(_, t)| t.clone())
            .or_else(|| self.default.clone())
    }

    /// Every tokenizer given by the flags with its model name (`None`: the default).
    pub fn iter(&self) -> impl Iterator<Item = (Option<&str>, &Arc<ModelTokenizer>)> {
        let named = self.by_model.iter().map(|(n, t)| (Some(n.as_str()), t));
        named.chain(self.default.iter().map(|t| (None, t)))
    }
}

/// One part of a prompt's IDs while it is tokenized.
#[derive(Clone, Debug)]
enum Part {
    /// IDs already known: a range of [`ColdWork::known`].
    Known(Range<usize>),
    /// The cold segment of this index in [`ColdWork::cold`].
    Cold(usize),
}

/// How a prompt is tokenized.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Mode {
    /// Piece by piece; cold pieces go into L1; the post-processor's affixes around the whole.
    Segments,
    /// The whole prompt at once (the model's pieces are not exact, or its affixes unknown).
    Whole,
}

/// The segments of one prompt that no cache had: pure work for [`ColdWork::run`], inline or on
/// the tokenizer pool.
#[derive(Debug)]
pub struct ColdWork {
    model: Arc<ModelTokenizer>,
    prompt: Prompt,
    mode: Mode,
    parts: Vec<Part>,
    known: Vec<u32>,
    /// Byte ranges of the prompt and their L1 keys.
    cold: Vec<(Range<usize>, u64)>,
    /// The prompt's L0 key.
    prompt_key: u64,
}

impl ColdWork {
    /// Bytes of text left to tokenize.
    pub fn cold_bytes(&self) -> usize {
        self.cold.iter().map(|(range, _)| range.len()).sum()
    }

    /// Tokenizes the cold segments (no cache: safe on any thread).
    pub fn run(self) -> ColdDone {
        let encoded = self
            .cold
            .iter()
            .map(|(range, _)| {
                let text = &self.prompt.text[range.clone()];
                match self.mode {
                    Mode::Segments => self.model.encode_piece(text),
                    Mode::Whole => self.model.encode(text, self.prompt.add_special_tokens),
                }
            })
            .collect();
        ColdDone {
            work: self,
            encoded,
        }
    }
}

/// Cold work done: give it to [`finish`] on the data core that began it.
#[derive(Debug)]
pub struct ColdDone {
    work: ColdWork,
    encoded: Result<Vec<Vec<u32>>, TokenizeError>,
}

/// What [`begin`] left to do.
#[derive(Debug)]
pub enum Begun {
    /// Every piece was cached: the IDs are in `out`.
    Done,
    /// Some pieces are cold: run the work, then [`finish`].
    Cold(ColdWork),
}

/// A prompt to render and cut on the tokenizer pool ([`RenderWork::run`], pure and `Send`): a
/// body past `TOKENIZE_RENDER_INLINE_BYTES` is parsed, rendered and cut at its added tokens off
/// the data core, which then looks the pieces up in its cache ([`begin_cut`]).
#[derive(Debug)]
pub struct RenderWork {
    model: Arc<ModelTokenizer>,
    source: OwnedSource,
}

impl RenderWork {
    /// The work of tokenizing `source` for `model` (the source is copied).
    pub fn new(model: &Arc<ModelTokenizer>, source: PromptSource<'_>) -> RenderWork {
        RenderWork {
            model: model.clone(),
            source: source.to_owned_source(),
        }
    }

    /// Bytes of the body or prompt.
    pub fn source_bytes(&self) -> usize {
        self.source.source().len()
    }

    /// Renders the prompt and cuts it (no cache: safe on any thread).
    pub fn run(self) -> Result<Cut, TokenizeError> {
        let prompt = self.model.prompt(self.source.source())?;
        Ok(cut(&self.model, prompt))
    }
}

/// One piece of a cut prompt.
#[derive(Clone, Debug)]
enum CutPiece {
    /// An added token.
    Special(u32),
    /// Text between added tokens (a segment or a chunk), with its L1 key.
    Text(Range<usize>, u64),
}

/// A prompt cut at its added tokens into pieces with their cache keys: pure work, done inline
/// or on the pool, which [`begin_cut`] looks up in a core's cache.
#[derive(Debug)]
pub struct Cut {
    model: Arc<ModelTokenizer>,
    prompt: Prompt,
    prompt_key: u64,
    /// `None`: the prompt is tokenized whole (its pieces are not exact, or its affixes unknown).
    pieces: Option<Vec<CutPiece>>,
}

/// The post-processor's tokens around `prompt` (none for chat prompts); `None` when unknown.
fn affixes_of<'m>(model: &'m ModelTokenizer, prompt: &Prompt) -> Option<(&'m [u32], &'m [u32])> {
    match (&model.affixes, prompt.add_special_tokens) {
        (_, false) => Some((&[][..], &[][..])),
        (Some(a), true) => Some((&a.prefix[..], &a.suffix[..])),
        (None, true) => None,
    }
}

/// Cuts `prompt` for `model` (see [`Cut`]).
pub fn cut(model: &Arc<ModelTokenizer>, prompt: Prompt) -> Cut {
    let prompt_key = model.prompt_key(&prompt);
    let pieces = match (&model.split, affixes_of(model, &prompt)) {
        (Some(split), Some(_)) => Some(cut_pieces(model, split, &prompt.text)),
        _ => None,
    };
    Cut {
        model: model.clone(),
        prompt,
        prompt_key,
        pieces,
    }
}

fn cut_pieces(model: &ModelTokenizer, split: &SpecialSplit, text: &str) -> Vec<CutPiece> {
    let mut pieces = Vec::new();
    split.split(text, &mut pieces);
    let mut out = Vec::with_capacity(pieces.len());
    let mut ranges = Vec::new();
    for piece in pieces {
        match piece {
            Piece::Special(id) => out.push(CutPiece::Special(id)),
            Piece::Text(range) => {
                model.text_ranges(text, range, &mut ranges);
                for range in ranges.drain(..) {
                    let key = model.segment_key(&text[range.clone()]);
                    out.push(CutPiece::Text(range, key));
                }
            }
        }
    }
    out
}

/// Starts tokenizing `prompt` for `model`: the IDs of every piece the cache has, and the work
/// left (see the module documentation). `out` receives the IDs when nothing is cold.
pub fn begin(
    model: &Arc<ModelTokenizer>,
    prompt: Prompt,
    cache: &mut TokenCache,
    out: &mut Vec<u32>,
) -> Begun {
    out.clear();
    // A whole prompt the cache holds is not cut at all.
    if let Some(ids) = cache.get_prompt(model.prompt_key(&prompt)) {
        out.extend_from_slice(ids);
        return Begun::Done;
    }
    look_up_pieces(cut(model, prompt), cache, out)
}

/// [`begin`] for a prompt already cut (on the pool: [`RenderWork::run`]).
pub fn begin_cut(cut: Cut, cache: &mut TokenCache, out: &mut Vec<u32>) -> Begun {
    out.clear();
    if let Some(ids) = cache.get_prompt(cut.prompt_key) {
        out.extend_from_slice(ids);
        return Begun::Done;
    }
    look_up_pieces(cut, cache, out)
}

/// The IDs of the pieces the cache has (L1), and the cold ones as work.
fn look_up_pieces(cut: Cut, cache: &mut TokenCache, out: &mut Vec<u32>) -> Begun {
    let Cut {
        model,
        prompt,
        prompt_key,
        pieces,
    } = cut;
    let (Some(pieces), Some((prefix, suffix))) = (pieces, affixes_of(&model, &prompt)) else {
        return Begun::Cold(ColdWork {
            mode: Mode::Whole,
            parts: vec![Part::Cold(0)],
            known: Vec::new(),
            cold: vec![(0..prompt.text.len(), 0)],
            model,
            prompt,
            prompt_key,
        });
    };
    let mut known: Vec<u32> = Vec::with_capacity(prompt.text.len() / 3);
    known.extend_from_slice(prefix);
    let mut parts = Vec::with_capacity(pieces.len() + 2);
    let mut cold = Vec::new();
    let mut run_start = 0;
    for piece in pieces {
        let (range, key) = match piece {
            CutPiece::Special(id) => {
                known.push(id);
                continue;
            }
            CutPiece::Text(range, key) => (range, key),
        };
        match cache.get_segment(key) {
            Some(ids) => known.extend_from_slice(ids),
            None => {
                parts.push(Part::Known(run_start..known.len()));
                run_start = known.len();
                parts.push(Part::Cold(cold.len()));
                cold.push((range, key));
            }
        }
    }
    known.extend_from_slice(suffix);
    if cold.is_empty() {
        cache.put_prompt(prompt_key, &known);
        *out = known;
        return Begun::Done;
    }
    parts.push(Part::Known(run_start..known.len()));
    Begun::Cold(ColdWork {
        model,
        prompt,
        mode: Mode::Segments,
        parts,
        known,
        cold,
        prompt_key,
    })
}

/// Tokenization a data core hands to the tokenizer pool.
#[derive(Debug)]
pub enum Deferred {
    /// A long body to parse, render and cut.
    Render(RenderWork),
    /// Cold segments to encode.
    Encode(ColdWork),
}

impl Deferred {
    /// Does the work (pure: safe on any thread).
    pub fn run(self) -> DeferredDone {
        match self {
            Deferred::Render(work) => DeferredDone::Rendered(work.run()),
            Deferred::Encode(work) => DeferredDone::Encoded(work.run()),
        }
    }

    /// Bytes of the body or text it works on.
    pub fn bytes(&self) -> usize {
        match self {
            Deferred::Render(work) => work.source_bytes(),
            Deferred::Encode(work) => work.cold_bytes(),
        }
    }
}

/// What [`Deferred::run`] did, for the data core that deferred it.
#[derive(Debug)]
pub enum DeferredDone {
    /// The prompt cut into pieces, for [`begin_cut`], or why it is not tokenized.
    Rendered(Result<Cut, TokenizeError>),
    /// Cold segments encoded, for [`finish`].
    Encoded(ColdDone),
}

/// Caches what [`ColdWork::run`] tokenized and writes the prompt's IDs to `out`.
pub fn finish(
    done: ColdDone,
    cache: &mut TokenCache,
    out: &mut Vec<u32>,
) -> Result<(), TokenizeError> {
    let ColdDone { work, encoded } = done;
    let encoded = encoded?;
    out.clear();
    for part in &work.parts {
        match part {
            Part::Known(range) => out.extend_from_slice(&work.known[range.clone()]),
            Part::Cold(index) => {
                let ids = &encoded[*index];
                if work.mode == Mode::Segments {
                    cache.put_segment(work.cold[*index].1, ids);
                }
                out.extend_from_slice(ids);
            }
        }
    }
    cache.put_prompt(work.prompt_key, out);
    Ok(())
}

/// Tokenizes `prompt` on this thread, through the cache: [`begin`], then the cold work.
pub fn tokenize_inline(
    model: &Arc<ModelTokenizer>,
    prompt: Prompt,
    cache: &mut TokenCache,
    out: &mut Vec<u32>,
) -> Result<(), TokenizeError> {
    match begin(model, prompt, cache, out) {
        Begun::Done => Ok(()),
        Begun::Cold(work) => finish(work.run(), cache, out),
    }
}

#[cfg(test)]
pub(crate) mod tests;
