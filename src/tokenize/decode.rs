//! Incremental detokenization: the text of an engine's output token IDs as they stream, whose
//! concatenation equals the `tokenizers` package's `decode` of the whole sequence (Python's and
//! the crate's are the same code), with `skip_special_tokens` on or off.
//!
//! Key types: [`DecodeTable`], built once per model from its [`ModelTokenizer`] (each token's
//! bytes as the model's decoder writes them, which tokens are special), and [`DecodeStream`],
//! one per output sequence, which appends each token's finished text to the caller's `String`.
//!
//! Three decoders, chosen at build and checked against the crate's `decode` on probe sequences
//! (a decoder that disagrees falls back to the window):
//! - **byte-level** (GPT-2's, Llama 3's, Qwen's `ByteLevel`): a token is bytes; the stream
//!   holds back the bytes of a UTF-8 character not yet complete and writes U+FFFD where the
//!   bytes cannot form one, exactly as `String::from_utf8_lossy` of the whole does;
//! - **pieces** (SentencePiece: `Metaspace`, or `Replace("▁", " ")` + `ByteFallback` + `Fuse` +
//!   `Strip`): a token is text with `▁` as a space, or one `<0xNN>` byte; a run of byte tokens
//!   becomes its text when the whole run is valid UTF-8 and one U+FFFD per byte otherwise, so a
//!   run is held back until it ends or is already invalid; the first token's leading space is
//!   dropped as the model's decoder drops it;
//! - **window** (any other decoder): the engines' incremental detokenizer, two offsets into the
//!   IDs (`prefix`, `read`): the text of `ids[prefix..]` minus that of `ids[prefix..read]` is
//!   new once it does not end in U+FFFD; the window then slides, so the work per token is
//!   bounded by the window, not the sequence.
//!
//! Each step costs a table lookup and a UTF-8 check of the few held bytes; nothing is
//! allocated per token after the first.

use std::sync::Arc;

use serde_json::Value;
use tokenizers::Tokenizer;

use super::ModelTokenizer;
use crate::limits::DECODE_WINDOW_TOKENS_MAX;

/// How a model's decoder turns tokens into text.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DecoderKind {
    /// Byte-level: each token is bytes; lossy UTF-8 of the whole.
    ByteLevel,
    /// SentencePiece pieces with byte fallback and the first token's space dropped.
    Pieces(FirstSpace),
    /// Any other decoder, through the crate's `decode` on a sliding window of IDs.
    Window,
}

/// How a SentencePiece decoder drops the space that the pre-tokenizer prepended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FirstSpace {
    /// `Metaspace` (prepend scheme `always` or `first`): every `▁` of the first token is
    /// dropped.
    MetaspaceFirstToken,
    /// `Strip(" ", 1, 0)` after `Fuse`: one leading space of the whole text is dropped.
    StripOnce,
    /// Nothing is dropped.
    Keep,
}

/// What one token is to the decoder.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Entry {
    /// Bytes of `DecodeTable::bytes` (`start..end`).
    Text { start: u32, end: u32 },
    /// A `<0xNN>` byte-fallback token.
    Byte(u8),
    /// An ID the tokenizer does not know: `decode` leaves it out.
    Unknown,
}

/// One model's tokens as its decoder writes them; shared read-only by every stream of the model.
pub struct DecodeTable {
    tokenizer: Arc<Tokenizer>,
    kind: DecoderKind,
    entries: Vec<Entry>,
    /// Whether each ID is a special added token (left out under `skip_special_tokens`).
    special: Vec<bool>,
    bytes: Vec<u8>,
    /// The text of each ID's first-token form (`▁` dropped), for `MetaspaceFirstToken`.
    first_forms: Vec<(u32, u32)>,
}

impl std::fmt::Debug for DecodeTable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DecodeTable")
            .field("kind", &self.kind)
            .field("tokens", &self.entries.len())
            .finish_non_exhaustive()
    }
}

/// GPT-2's byte-level alphabet reversed: the byte each of the 256 characters stands for.
fn byte_level_chars() -> std::collections::HashMap<char, u8> {
    let mut printable: Vec<u8> = (b'!'..=b'~').collect();
    printable.extend(0xA1..=0xAC);
    printable.extend(0xAE..=0xFF);
    let mut map = std::collections::HashMap::with_capacity(256);
    let mut next = 0u32;
    for b in 0..=255u8 {
        let c = if printable.contains(&b) {
            u32::from(b)
        } else {
            next += 1;
            255 + next
        };
        if let Some(c) = char::from_u32(c) {
            map.insert(c, b);
        }
    }
    map
}

/// `<0xNN>`'s byte, as `ByteFallback` reads it.
fn fallback_byte(token: &str) -> Option<u8> {
    let hex = token.strip_prefix("<0x")?.strip_suffix('>')?;
    if hex.len() != 2 {
        return None;
    }
    u8::from_str_radix(hex, 16).ok()
}

/// The decoder's kind from its JSON (`tokenizer.json`'s `decoder`).
fn decoder_kind(decoder: &Value) -> (DecoderKind, bool) {
    let kind = |v: &Value| v.get("type").and_then(Value::as_str).map(str::to_owned);
    match kind(decoder).as_deref() {
        Some("ByteLevel") => (DecoderKind::ByteLevel, false),
        Some("Metaspace") => {
            let prepends = match decoder.get("prepend_scheme").and_then(Value::as_str) {
                Some(scheme) => scheme != "never",
                None => decoder.get("add_prefix_space").and_then(Value::as_bool) != Some(false),
            };
            let first = if prepends {
                FirstSpace::MetaspaceFirstToken
            } else {
                FirstSpace::Keep
            };
            // A lone Metaspace decoder keeps `<0xNN>` as text.
            (DecoderKind::Pieces(first), false)
        }
        Some("Sequence") => {
            let steps: Vec<String> = decoder
                .get("decoders")
                .and_then(Value::as_array)
                .map(|d| d.iter().filter_map(kind).collect())
                .unwrap_or_default();
            let replaces_meta = decoder
                .get("decoders")
                .and_then(Value::as_array)
                .and_then(|d| d.first())
                .is_some_and(|r| {
                    r.get("pattern")
                        .and_then(|p| p.get("String"))
                        .and_then(Value::as_str)
                        == Some("▁")
                        && r.get("content").and_then(Value::as_str) == Some(" ")
                });
            let strip_once = decoder
                .get("decoders")
                .and_then(Value::as_array)
                .and_then(|d| d.last())
                .is_some_and(|s| {
                    s.get("content").and_then(Value::as_str) == Some(" ")
                        && s.get("start").and_then(Value::as_u64) == Some(1)
                        && s.get("stop").and_then(Value::as_u64) == Some(0)
                });
            match steps.iter().map(String::as_str).collect::<Vec<_>>()[..] {
                ["Replace", "ByteFallback", "Fuse", "Strip"] if replaces_meta && strip_once => {
                    (DecoderKind::Pieces(FirstSpace::StripOnce), true)
                }
                ["Replace", "ByteFallback", "Fuse"] if replaces_meta => {
                    (DecoderKind::Pieces(FirstSpace::Keep), true)
                }
                _ => (DecoderKind::Window, false),
            }
        }
        _ => (DecoderKind::Window, false),
    }
}

impl DecodeTable {
    /// The table of `model`'s tokenizer (a pass over the vocabulary; done once per model).
    pub fn new(model: &ModelTokenizer) -> DecodeTable {
        DecodeTable::of(model.tokenizer.clone())
    }

    /// The table of a bare tokenizer.
    pub fn of(tokenizer: Arc<Tokenizer>) -> DecodeTable {
        let decoder = tokenizer
            .get_decoder()
            .and_then(|d| serde_json::to_value(d).ok())
            .unwrap_or(Value::Null);
        let (kind, byte_fallback) = decoder_kind(&decoder);
        let table = DecodeTable::build(tokenizer, kind, byte_fallback);
        if kind != DecoderKind::Window && !table.agrees_with_crate() {
            let tokenizer = table.tokenizer.clone();
            return DecodeTable::build(tokenizer, DecoderKind::Window, false);
        }
        table
    }

    fn build(tokenizer: Arc<Tokenizer>, kind: DecoderKind, byte_fallback: bool) -> DecodeTable {
        let size = tokenizer.get_vocab_size(true);
        let added = tokenizer.get_added_tokens_decoder();
        let highest = added.keys().copied().max().map_or(0, |id| id as usize + 1);
        let size = size.max(highest);
        let chars = byte_level_chars();
        let mut table = DecodeTable {
            tokenizer: tokenizer.clone(),
            kind,
            entries: Vec::with_capacity(size),
            special: vec![false; size],
            bytes: Vec::with_capacity(size * 6),
            first_forms: Vec::new(),
        };
        for (id, token) in &added {
            if token.special {
                table.special[*id as usize] = true;
            }
        }
        for id in 0..size {
            let Some(token) = u32::try_from(id)
                .ok()
                .and_then(|id| tokenizer.id_to_token(id))
            else {
                table.entries.push(Entry::Unknown);
                continue;
            };
            let start = table.bytes.len() as u32;
            match kind {
                DecoderKind::ByteLevel => {
                    let mapped: Option<Vec<u8>> =
                        token.chars().map(|c| chars.get(&c).copied()).collect();
                    match mapped {
                        Some(bytes) => table.bytes.extend_from_slice(&bytes),
                        None => table.bytes.extend_from_slice(token.as_bytes()),
                    }
                }
                DecoderKind::Pieces(_) => {
                    if let Some(byte) = fallback_byte(&token).filter(|_| byte_fallback) {
                        table.entries.push(Entry::Byte(byte));
                        continue;
                    }
                    for c in token.chars() {
                        let c = if c == '▁' { ' ' } else { c };
                        let mut buf = [0u8; 4];
                        table
                            .bytes
                            .extend_from_slice(c.encode_utf8(&mut buf).as_bytes());
                    }
                }
                DecoderKind::Window => {}
            }
            let end = table.bytes.len() as u32;
            table.entries.push(Entry::Text { start, end });
        }
        if kind == DecoderKind::Pieces(FirstSpace::MetaspaceFirstToken) {
            table.build_first_forms();
        }
        table
    }

    /// For Metaspace: each token's text with every `▁` dropped (its form as the first token).
    fn build_first_forms(&mut self) {
        self.first_forms = Vec::with_capacity(self.entries.len());
        for id in 0..self.entries.len() {
            let start = self.bytes.len() as u32;
            if let Some(token) = self.tokenizer.id_to_token(id as u32) {
                let dropped: String = token.chars().filter(|c| *c != '▁').collect();
                self.bytes.extend_from_slice(dropped.as_bytes());
            }
            self.first_forms.push((start, self.bytes.len() as u32));
        }
    }

    /// Which decoder this table uses.
    pub fn kind(&self) -> DecoderKind {
        self.kind
    }

    /// Whether `id` is a special added token (`skip_special_tokens` leaves it out).
    pub fn is_special(&self, id: u32) -> bool {
        self.special.get(id as usize).copied().unwrap_or(false)
    }

    /// The bytes of `id` decoded alone (logprobs' `token` and `bytes`); empty for an ID the
    /// tokenizer does not know. Byte-fallback tokens are their byte.
    pub fn token_bytes(&self, id: u32) -> std::borrow::Cow<'_, [u8]> {
        match self.entries.get(id as usize) {
            Some(Entry::Text { start, end }) if self.kind != DecoderKind::Window => {
                std::borrow::Cow::Borrowed(&self.bytes[*start as usize..*end as usize])
            }
            Some(Entry::Byte(b)) => std::borrow::Cow::Owned(vec![*b]),
            Some(Entry::Text { .. }) => std::borrow::Cow::Owned(
                self.tokenizer
                    .decode(&[id], false)
                    .map(String::into_bytes)
                    .unwrap_or_default(),
            ),
            Some(Entry::Unknown) | None => std::borrow::Cow::Borrowed(&[]),
        }
    }

    /// The crate's `decode` of `ids` (the reference; allocates).
    pub fn decode_whole(&self, ids: &[u32], skip_special_tokens: bool) -> String {
        self.tokenizer
            .decode(ids, skip_special_tokens)
            .unwrap_or_default()
    }

    /// Whether streams of this table equal the crate's `decode` on probe sequences: random IDs
    /// (seeded), with and without special tokens skipped.
    fn agrees_with_crate(&self) -> bool {
        let mut rng = fastrand::Rng::with_seed(0x6465_636f_6465);
        let size = self.entries.len() as u32;
        if size == 0 {
            return true;
        }
        let mut text = String::new();
        for round in 0..64 {
            let len = 1 + rng.usize(..24);
            let ids: Vec<u32> = (0..len).map(|_| rng.u32(..size)).collect();
            let skip = round % 2 == 0;
            text.clear();
            let mut stream = DecodeStream::new(self, skip);
            for &id in &ids {
                stream.step(self, id, &mut text);
            }
            stream.finish(self, &mut text);
            if text != self.decode_whole(&ids, skip) {
                return false;
            }
        }
        true
    }
}

/// One output sequence's detokenization state. It borrows nothing: each call is given the
/// table, so a stream can live in a request's state beside an `Arc<DecodeTable>`.
#[derive(Debug, Default)]
pub struct DecodeStream {
    skip_special_tokens: bool,
    /// Bytes decoded but not yet written: an incomplete UTF-8 character (byte-level), or the
    /// current run of byte-fallback tokens (pieces).
    held: Vec<u8>,
    /// Pieces: whether the held run already failed UTF-8 (then each byte is written as U+FFFD).
    run_invalid: bool,
    /// Whether a token has reached the decoder (pieces: the first token's space rule).
    started: bool,
    /// Pieces with `StripOnce`: whether the one leading space is still to drop.
    strip_pending: bool,
    /// Window: the IDs of the window, and the offsets into it.
    ids: Vec<u32>,
    prefix_offset: usize,
    read_offset: usize,
}

impl DecodeStream {
    /// A stream for `table`'s model.
    pub fn new(table: &DecodeTable, skip_special_tokens: bool) -> DecodeStream {
        DecodeStream {
            skip_special_tokens,
            strip_pending: table.kind == DecoderKind::Pieces(FirstSpace::StripOnce),
            ..DecodeStream::default()
        }
    }

    /// Decodes one more token; appends the text it completes to `out` (maybe none yet).
    pub fn step(&mut self, table: &DecodeTable, id: u32, out: &mut String) {
        if self.skip_special_tokens && table.is_special(id) {
            return;
        }
        let entry = table
            .entries
            .get(id as usize)
            .copied()
            .unwrap_or(Entry::Unknown);
        if entry == Entry::Unknown {
            return;
        }
        match table.kind {
            DecoderKind::ByteLevel => {
                if let Entry::Text { start, end } = entry {
                    self.held
                        .extend_from_slice(&table.bytes[start as usize..end as usize]);
                    write_lossy(&mut self.held, out, Flush::Complete);
                }
            }
            DecoderKind::Pieces(first) => self.step_piece(table, first, id, entry, out),
            DecoderKind::Window => self.step_window(table, id, out),
        }
    }

    /// Ends the sequence: writes what was held (incomplete bytes as U+FFFD, as `decode` does).
    pub fn finish(&mut self, table: &DecodeTable, out: &mut String) {
        match table.kind {
            DecoderKind::ByteLevel => write_lossy(&mut self.held, out, Flush::All),
            DecoderKind::Pieces(_) => self.end_run(out),
            DecoderKind::Window => {
                let ids = &self.ids[self.prefix_offset..];
                let whole = table.decode_whole(ids, self.skip_special_tokens);
                let before = table.decode_whole(
                    &self.ids[self.prefix_offset..self.read_offset],
                    self.skip_special_tokens,
                );
                if let Some(new) = whole.get(before.len()..) {
                    out.push_str(new);
                }
                self.ids.clear();
                self.prefix_offset = 0;
                self.read_offset = 0;
            }
        }
    }

    fn step_piece(
        &mut self,
        table: &DecodeTable,
        first: FirstSpace,
        id: u32,
        entry: Entry,
        out: &mut String,
    ) {
        let is_first = !self.started;
        self.started = true;
        match entry {
            Entry::Byte(byte) => {
                self.held.push(byte);
                if self.run_invalid {
                    self.push_text(out, "\u{FFFD}");
                    self.held.clear();
                } else if let Err(e) = std::str::from_utf8(&self.held) {
                    if e.error_len().is_some() {
                        // The run can no longer be valid: ByteFallback writes U+FFFD per byte.
                        self.run_invalid = true;
                        for _ in 0..self.held.len() {
                            self.push_text(out, "\u{FFFD}");
                        }
                        self.held.clear();
                    }
                }
            }
            Entry::Text { start, end } => {
                self.end_run(out);
                let (start, end) = match (first, is_first) {
                    (FirstSpace::MetaspaceFirstToken, true) => table
                        .first_forms
                        .get(id as usize)
                        .copied()
                        .unwrap_or((start, end)),
                    _ => (start, end),
                };
                let bytes = &table.bytes[start as usize..end as usize];
                // The table's text entries are built from `str`s.
                if let Ok(text) = std::str::from_utf8(bytes) {
                    self.push_text(out, text);
                }
            }
            Entry::Unknown => {}
        }
    }

    /// Ends a run of byte-fallback tokens: its text if valid, else U+FFFD per byte.
    fn end_run(&mut self, out: &mut String) {
        if self.held.is_empty() {
            self.run_invalid = false;
            return;
        }
        let held = std::mem::take(&mut self.held);
        match std::str::from_utf8(&held) {
            Ok(text) => self.push_text(out, text),
            Err(_) => {
                for _ in 0..held.len() {
                    self.push_text(out, "\u{FFFD}");
                }
            }
        }
        self.held = held;
        self.held.clear();
        self.run_invalid = false;
    }

    /// Writes decoded text, dropping the one leading space of `StripOnce`.
    fn push_text(&mut self, out: &mut String, text: &str) {
        if self.strip_pending && !text.is_empty() {
            self.strip_pending = false;
            out.push_str(text.strip_prefix(' ').unwrap_or(text));
        } else {
            out.push_str(text);
        }
    }

    fn step_window(&mut self, table: &DecodeTable, id: u32, out: &mut String) {
        self.ids.push(id);
        let skip = self.skip_special_tokens;
        let before = table.decode_whole(&self.ids[self.prefix_offset..self.read_offset], skip);
        let whole = table.decode_whole(&self.ids[self.prefix_offset..], skip);
        if whole.len() > before.len() && !whole.ends_with('\u{FFFD}') {
            if let Some(new) = whole.get(before.len()..) {
                out.push_str(new);
            }
            self.prefix_offset = self.read_offset;
            self.read_offset = self.ids.len();
        }
        // Slide: drop IDs before the prefix once the window is long.
        if self.prefix_offset > DECODE_WINDOW_TOKENS_MAX {
            self.ids.drain(..self.prefix_offset);
            self.read_offset -= self.prefix_offset;
            self.prefix_offset = 0;
        }
    }
}

/// How much of the held bytes [`write_lossy`] writes.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Flush {
    /// All but an incomplete character at the end.
    Complete,
    /// Everything (the end of the sequence: an incomplete character is U+FFFD).
    All,
}

/// Writes `held`'s bytes as `String::from_utf8_lossy` would, keeping an incomplete character at
/// the end unless `flush` is `All`.
fn write_lossy(held: &mut Vec<u8>, out: &mut String, flush: Flush) {
    let mut at = 0;
    loop {
        match std::str::from_utf8(&held[at..]) {
            Ok(text) => {
                out.push_str(text);
                at = held.len();
                break;
            }
            Err(e) => {
                let valid = at + e.valid_up_to();
                // `valid_up_to` bytes are UTF-8 by definition.
                if let Ok(text) = std::str::from_utf8(&held[at..valid]) {
                    out.push_str(text);
                }
                match e.error_len() {
                    Some(bad) => {
                        out.push('\u{FFFD}');
                        at = valid + bad;
                    }
                    None if flush == Flush::All => {
                        out.push('\u{FFFD}');
                        at = held.len();
                        break;
                    }
                    None => {
                        at = valid;
                        break;
                    }
                }
            }
        }
    }
    held.drain(..at);
}

#[cfg(test)]
mod tests;
