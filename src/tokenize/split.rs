//! [`SpecialSplit`]: cuts a rendered prompt at its added tokens (`<|im_start|>`, `<|eot_id|>`,
//! ...) into [`Piece`]s, exactly where the `tokenizers` pipeline cuts it. That pipeline extracts
//! added tokens first and normalizes, pre-tokenizes and runs BPE on each piece between them on
//! its own, so a piece's IDs never depend on its neighbours: each text piece can be tokenized
//! once and its IDs cached (`super::cache`).
//!
//! The cut is the library's: Aho-Corasick, leftmost-longest, first over the added tokens matched
//! on raw text, then over the gaps with those matched on normalized text (only offered when the
//! tokenizer has no normalizer, so normalized text is raw text). [`SplitSafety::check`] refuses
//! what would make pieces interact: an added token that strips neighbouring whitespace or
//! matches single words only, normalized added tokens under a normalizer, and a Metaspace
//! pre-tokenizer that prepends to the first piece only (every piece would look first). The
//! model then tokenizes whole prompts (`ModelTokenizer` logs why at start).
//!
//! Long text pieces are cut once more, into chunks ([`Chunking`]), for the byte-level BPE
//! tokenizers of the GPT-4 family of split patterns (Llama 3's and Qwen2's, recognized by their
//! exact pre-tokenizer): a user message that repeats most of an earlier one (a RAG document, a
//! pasted file) then reuses its chunks. A chunk ends after an ASCII letter or digit followed by a
//! space, at the first such place past each [`TOKENIZER_CHUNK_BYTES`] of the piece. There the
//! pattern always ends a pre-token: no alternative matches a letter or digit and then a space,
//! and none looks behind, so matching resumes at the space exactly as on a new string; NFC (the
//! only normalizer allowed) never composes a space with what precedes it; byte-level mapping and
//! BPE work per pre-token. Cuts are placed by offsets within the piece, so two pieces that share
//! a head share its chunks.

use std::ops::Range;

use aho_corasick::{AhoCorasick, AhoCorasickBuilder, MatchKind};
use tokenizers::{AddedToken, Tokenizer};

use crate::limits::TOKENIZER_CHUNK_BYTES;

/// One piece of a prompt: an added token, or the text between two of them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Piece {
    /// An added token: its ID.
    Special(u32),
    /// Text between added tokens: a byte range of the prompt, never empty.
    Text(Range<usize>),
}

/// The added-token matchers of one tokenizer.
#[derive(Debug)]
pub struct SpecialSplit {
    raw: Option<(AhoCorasick, Vec<u32>)>,
    normalized: Option<(AhoCorasick, Vec<u32>)>,
}

/// Whether pieces tokenize independently for a tokenizer (see the module documentation).
#[derive(Debug, PartialEq, Eq)]
pub enum SplitSafety {
    /// Pieces are exact.
    Exact,
    /// Pieces could differ from the whole prompt's tokens, for this reason.
    Unsafe(String),
}

impl SplitSafety {
    /// The structural checks (the probe comparison is `ModelTokenizer`'s).
    pub fn check(tokenizer: &Tokenizer) -> SplitSafety {
        let has_normalizer = tokenizer.get_normalizer().is_some();
        for token in tokenizer.get_added_tokens_decoder().values() {
            if token.lstrip || token.rstrip || token.single_word {
                return SplitSafety::Unsafe(format!(
                    "added token {:?} strips whitespace or matches single words",
                    token.content
                ));
            }
            if token.normalized && has_normalizer {
                return SplitSafety::Unsafe(format!(
                    "added token {:?} is matched on normalized text",
                    token.content
                ));
            }
        }
        let pre_tokenizer = tokenizer
            .get_pre_tokenizer()
            .and_then(|p| serde_json::to_value(p).ok())
            .map(|v| v.to_string())
            .unwrap_or_default();
        if pre_tokenizer.contains("\"prepend_scheme\":\"first\"") {
            return SplitSafety::Unsafe(
                "the Metaspace pre-tokenizer prepends to the first piece only".into(),
            );
        }
        SplitSafety::Exact
    }
}

impl SpecialSplit {
    /// The matchers of `tokenizer`'s added tokens (`None` when it has none).
    pub fn new(tokenizer: &Tokenizer) -> Result<Option<SpecialSplit>, aho_corasick::BuildError> {
        let mut tokens: Vec<(u32, AddedToken)> =
            tokenizer.get_added_tokens_decoder().into_iter().collect();
        // The library's order: by ID (its tries are built from its added tokens in that order).
        tokens.sort_by_key(|(id, _)| *id);
        let build = |normalized: bool| -> Result<_, aho_corasick::BuildError> {
            let (ids, patterns): (Vec<u32>, Vec<&str>) = tokens
                .iter()
                .filter(|(_, t)| t.normalized == normalized && !t.content.is_empty())
                .map(|(id, t)| (*id, t.content.as_str()))
                .unzip();
            if patterns.is_empty() {
                return Ok(None);
            }
            let matcher = AhoCorasickBuilder::new()
                .match_kind(MatchKind::LeftmostLongest)
                .build(patterns)?;
            Ok(Some((matcher, ids)))
        };
        let split = SpecialSplit {
            raw: build(false)?,
            normalized: build(true)?,
        };
        Ok((split.raw.is_some() || split.normalized.is_some()).then_some(split))
    }

    /// Appends the pieces of `text` to `out`, in order.
    pub fn split(&self, text: &str, out: &mut Vec<Piece>) {
        let start = out.len();
        match &self.raw {
            Some(raw) => cut(text, 0..text.len(), raw, out),
            None if !text.is_empty() => out.push(Piece::Text(0..text.len())),
            None => {}
        }
        let Some(normalized) = &self.normalized else {
            return;
        };
        // Second pass: the normalized tokens, inside the text pieces of the first.
        let first: Vec<Piece> = out.drain(start..).collect();
        for piece in first {
            match piece {
                Piece::Text(range) => cut(text, range, normalized, out),
                special => out.push(special),
            }
        }
    }
}

/// Whether long text pieces may be cut into chunks (see the module documentation).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Chunking {
    /// Pieces longer than [`TOKENIZER_CHUNK_BYTES`] are cut after a letter or digit and a space.
    AtSpaces,
    /// Pieces are tokenized whole.
    Off,
}

impl Chunking {
    /// `AtSpaces` for a tokenizer with no normalizer or NFC, and the pre-tokenizer
    /// `Split(Llama 3's or Qwen2's pattern, Isolated)` then `ByteLevel` without a prefix space
    /// (`bpe::pre_tokenizer_pattern`).
    pub fn of(tokenizer: &Tokenizer) -> Chunking {
        let json = |v: Option<serde_json::Value>| v.unwrap_or(serde_json::Value::Null);
        let normalizer = json(
            tokenizer
                .get_normalizer()
                .and_then(|n| serde_json::to_value(n).ok()),
        );
        let normalizer_ok = normalizer.is_null() || normalizer["type"] == "NFC";
        let pre = json(
            tokenizer
                .get_pre_tokenizer()
                .and_then(|p| serde_json::to_value(p).ok()),
        );
        // The GPT-4 family of split patterns, exactly (the byte-level BPE's recognizer).
        let chunkable = super::bpe::pre_tokenizer_pattern(&pre).is_some();
        if normalizer_ok && chunkable {
            Chunking::AtSpaces
        } else {
            Chunking::Off
        }
    }
}

/// Cuts `text[range]` into chunks (see the module documentation), pushing their ranges.
pub fn chunks(text: &str, range: Range<usize>, out: &mut Vec<Range<usize>>) {
    let bytes = text.as_bytes();
    let mut start = range.start;
    let mut target = range.start + TOKENIZER_CHUNK_BYTES;
    while target + 1 < range.end {
        // The first place at or past `target` after a letter or digit followed by a space.
        let cut = (target..range.end - 1).find(|&p| {
            bytes[p] == b' ' && bytes[p - 1].is_ascii_alphanumeric() && bytes[p + 1] != b' '
        });
        let Some(cut) = cut else {
            break;
        };
        out.push(start..cut);
        start = cut;
        target = cut + TOKENIZER_CHUNK_BYTES;
    }
    out.push(start..range.end);
}

/// Cuts `text[range]` at the matches of `matcher`, pushing text and special pieces.
fn cut(
    text: &str,
    range: Range<usize>,
    (matcher, ids): &(AhoCorasick, Vec<u32>),
    out: &mut Vec<Piece>,
) {
    let mut at = range.start;
    for found in matcher.find_iter(&text[range.clone()]) {
        let (start, end) = (range.start + found.start(), range.start + found.end());
        if start > at {
            out.push(Piece::Text(at..start));
        }
        out.push(Piece::Special(ids[found.pattern().as_usize()]));
        at = end;
    }
    if range.end > at {
        out.push(Piece::Text(at..range.end));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunks_end_after_a_letter_or_digit_and_a_space_past_each_bound() {
        let word = "abcdefg ";
        let text = word.repeat(3 * TOKENIZER_CHUNK_BYTES / word.len());
        let mut out = Vec::new();
        chunks(&text, 0..text.len(), &mut out);
        assert!(out.len() >= 3, "{out:?}");
        assert_eq!(out.first().map(|r| r.start), Some(0));
        assert_eq!(out.last().map(|r| r.end), Some(text.len()));
        for pair in out.windows(2) {
            assert_eq!(pair[0].end, pair[1].start);
            let cut = pair[0].end;
            assert_eq!(&text[cut - 1..=cut + 1], "g a");
            assert!(pair[0].len() >= TOKENIZER_CHUNK_BYTES);
        }
        // No place to cut (no space after a letter): one chunk.
        let dense = "é".repeat(2 * TOKENIZER_CHUNK_BYTES);
        out.clear();
        chunks(&dense, 0..dense.len(), &mut out);
        assert_eq!(
            out,
            vec![Range {
                start: 0,
                end: dense.len()
            }]
        );
        // A piece shorter than a chunk stays whole; ranges are relative to the whole text.
        out.clear();
        chunks("xx hello world", 3..14, &mut out);
        assert_eq!(out, vec![Range { start: 3, end: 14 }]);
    }
}
