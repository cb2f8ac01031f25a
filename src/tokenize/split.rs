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

use std::ops::Range;

use aho_corasick::{AhoCorasick, AhoCorasickBuilder, MatchKind};
use tokenizers::{AddedToken, Tokenizer};

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
