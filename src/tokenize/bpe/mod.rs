//! [`ByteLevelBpe`]: kvgate's own encoder for the byte-level BPE tokenizers of the GPT-4 family
//! of split patterns (Llama 3's and Qwen2/3's), the IDs of the `tokenizers` crate at about ten
//! times its speed. Built from the same `tokenizer.json`, only when every part of it that
//! changes IDs is one this encoder implements ([`ByteLevelBpe::new`] says which part is not,
//! and the model then keeps the crate):
//!
//! - no normalizer, or NFC (`unicode-normalization-alignments`, the crate's own);
//! - the pre-tokenizer `Sequence[Split(one of our patterns, Isolated), ByteLevel(no prefix
//!   space, no regex)]`: a hand-written scanner ([`pretokens`]), then bytes as they are;
//! - a BPE model without dropout, whose 256 bytes are all tokens, with merges
//!   ([`merge::Vocab`]; the IDs of words merged before come from a per-thread cache,
//!   [`words::WordCache`]);
//! - no truncation, no padding; a byte-level decoder; a post-processor that adds nothing
//!   without `add_special_tokens` (none, ByteLevel, TemplateProcessing, or a Sequence of them).
//!
//! Added tokens are not its business: it encodes the text between them (`super::split` cuts
//! there, as the crate does). One pre-token longer than [`TOKENIZER_PRETOKEN_BYTES_MAX`] is
//! refused ([`PretokenTooLong`]): the request routes on its text instead of merging megabytes.

mod chars;
mod merge;
pub mod pretokens;
mod slot;
mod words;

use std::borrow::Cow;

use serde::Deserialize;
use unicode_normalization_alignments::{is_nfc_quick, IsNormalized, UnicodeNormalization};

use crate::limits::TOKENIZER_PRETOKEN_BYTES_MAX;
use merge::Vocab;
use pretokens::{CharClasses, Pretokens, SplitPattern};
pub use slot::BpeSlot;
use words::WordCache;

/// A pre-token longer than [`TOKENIZER_PRETOKEN_BYTES_MAX`]: the text is not encoded.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("a pre-token of {0} bytes is longer than {TOKENIZER_PRETOKEN_BYTES_MAX}")]
pub struct PretokenTooLong(pub usize);

/// The encoder of one tokenizer (see the module documentation).
pub struct ByteLevelBpe {
    nfc: bool,
    pattern: SplitPattern,
    classes: &'static CharClasses,
    vocab: Vocab,
}

impl std::fmt::Debug for ByteLevelBpe {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ByteLevelBpe")
            .field("nfc", &self.nfc)
            .field("pattern", &self.pattern)
            .field("vocab", &self.vocab)
            .finish_non_exhaustive()
    }
}

/// The parts of `tokenizer.json` that decide the IDs of text without added tokens.
#[derive(Deserialize)]
struct TokenizerJson<'a> {
    #[serde(default)]
    truncation: serde_json::Value,
    #[serde(default)]
    padding: serde_json::Value,
    #[serde(default)]
    normalizer: serde_json::Value,
    #[serde(default)]
    pre_tokenizer: serde_json::Value,
    #[serde(default)]
    post_processor: serde_json::Value,
    #[serde(default)]
    decoder: serde_json::Value,
    #[serde(borrow)]
    model: BpeJson<'a>,
}

/// A BPE model as `tokenizer.json` writes it; an unknown field refuses it (it might change IDs).
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct BpeJson<'a> {
    #[serde(rename = "type")]
    kind: String,
    #[serde(default)]
    dropout: Option<f32>,
    /// Never used: every byte is a token (checked), so no character is unknown.
    #[serde(default)]
    #[allow(dead_code)]
    unk_token: Option<String>,
    #[serde(default)]
    continuing_subword_prefix: Option<String>,
    #[serde(default)]
    end_of_word_suffix: Option<String>,
    /// Never used, as `unk_token`.
    #[serde(default)]
    #[allow(dead_code)]
    fuse_unk: bool,
    /// Never used, as `unk_token` (it applies to unknown characters only).
    #[serde(default)]
    #[allow(dead_code)]
    byte_fallback: bool,
    #[serde(default)]
    ignore_merges: bool,
    #[serde(borrow)]
    vocab: VocabJson<'a>,
    #[serde(borrow)]
    merges: Vec<MergeJson<'a>>,
}

/// A JSON string, borrowed from the file unless it has escapes (the vocabulary and merges are
/// most of the file: a debug build's load time is mostly their allocations).
struct Text<'a>(Cow<'a, str>);

impl<'de: 'a, 'a> Deserialize<'de> for Text<'a> {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Visit<'a>(std::marker::PhantomData<&'a ()>);
        impl<'de: 'a, 'a> serde::de::Visitor<'de> for Visit<'a> {
            type Value = Text<'a>;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a string")
            }
            fn visit_borrowed_str<E>(self, text: &'de str) -> Result<Text<'a>, E> {
                Ok(Text(Cow::Borrowed(text)))
            }
            fn visit_str<E>(self, text: &str) -> Result<Text<'a>, E> {
                Ok(Text(Cow::Owned(text.to_owned())))
            }
        }
        d.deserialize_str(Visit(std::marker::PhantomData))
    }
}

/// The vocabulary, its entries in file order (a duplicate key is two entries, which
/// [`Vocab::with_tokens`] refuses).
struct VocabJson<'a>(Vec<(Text<'a>, u32)>);

impl<'de: 'a, 'a> Deserialize<'de> for VocabJson<'a> {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Visit<'a>(std::marker::PhantomData<&'a ()>);
        impl<'de: 'a, 'a> serde::de::Visitor<'de> for Visit<'a> {
            type Value = VocabJson<'a>;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a map of tokens to IDs")
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(
                self,
                mut map: A,
            ) -> Result<VocabJson<'a>, A::Error> {
                let mut entries = Vec::with_capacity(map.size_hint().unwrap_or(0));
                while let Some(entry) = map.next_entry()? {
                    entries.push(entry);
                }
                Ok(VocabJson(entries))
            }
        }
        d.deserialize_map(Visit(std::marker::PhantomData))
    }
}

/// One merge: a pair, or a `"left right"` string (older files).
enum MergeJson<'a> {
    Pair(Text<'a>, Text<'a>),
    Joined(Text<'a>),
}

impl<'de: 'a, 'a> Deserialize<'de> for MergeJson<'a> {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Visit<'a>(std::marker::PhantomData<&'a ()>);
        impl<'de: 'a, 'a> serde::de::Visitor<'de> for Visit<'a> {
            type Value = MergeJson<'a>;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a pair of strings or a string")
            }
            fn visit_borrowed_str<E>(self, text: &'de str) -> Result<MergeJson<'a>, E> {
                Ok(MergeJson::Joined(Text(Cow::Borrowed(text))))
            }
            fn visit_str<E>(self, text: &str) -> Result<MergeJson<'a>, E> {
                Ok(MergeJson::Joined(Text(Cow::Owned(text.to_owned()))))
            }
            fn visit_seq<A: serde::de::SeqAccess<'de>>(
                self,
                mut seq: A,
            ) -> Result<MergeJson<'a>, A::Error> {
                use serde::de::Error;
                let left = seq
                    .next_element()?
                    .ok_or_else(|| A::Error::invalid_length(0, &self))?;
                let right = seq
                    .next_element()?
                    .ok_or_else(|| A::Error::invalid_length(1, &self))?;
                if seq.next_element::<Text<'a>>()?.is_some() {
                    return Err(A::Error::invalid_length(3, &self));
                }
                Ok(MergeJson::Pair(left, right))
            }
        }
        d.deserialize_any(Visit(std::marker::PhantomData))
    }
}

impl ByteLevelBpe {
    /// The encoder of `tokenizer_json`, or why this tokenizer is not one it implements.
    pub fn new(tokenizer_json: &[u8]) -> Result<ByteLevelBpe, String> {
        // One typed pass (the vocabulary and merges are most of the file): a model of another
        // kind or with an unknown field fails it.
        let json: TokenizerJson = serde_json::from_slice(tokenizer_json)
            .map_err(|e| format!("not a BPE model of a known shape: {e}"))?;
        if !json.truncation.is_null() || !json.padding.is_null() {
            return Err("truncation or padding is set".into());
        }
        let nfc = match &json.normalizer {
            serde_json::Value::Null => false,
            n if *n == serde_json::json!({"type": "NFC"}) => true,
            n => return Err(format!("normalizer {n}")),
        };
        let pattern = pre_tokenizer_pattern(&json.pre_tokenizer)
            .ok_or_else(|| format!("pre-tokenizer {}", json.pre_tokenizer))?;
        if json.decoder["type"] != "ByteLevel" {
            return Err(format!("decoder {}", json.decoder));
        }
        if !post_processor_adds_nothing(&json.post_processor) {
            return Err(format!("post-processor {}", json.post_processor));
        }
        let vocab = vocab(json.model)?;
        let classes = pretokens::classes()?;
        Ok(ByteLevelBpe {
            nfc,
            pattern,
            classes,
            vocab,
        })
    }

    /// What this encoder implements, for the start-up log.
    pub fn describe(&self) -> String {
        let pattern = match self.pattern {
            SplitPattern::Llama3 => "Llama 3's split pattern",
            SplitPattern::Qwen2 => "Qwen2's split pattern",
        };
        let nfc = if self.nfc { ", NFC" } else { "" };
        let chars = match self.vocab.char_tokens() {
            0 => "merging from bytes: ranks not monotone".to_string(),
            n => format!("{n} characters may start as their token"),
        };
        format!("kvgate's byte-level BPE ({pattern}{nfc}, {chars})")
    }

    /// Appends the IDs of `text` (text without added tokens) to `out`. On an error `out` may
    /// hold some of the IDs.
    pub fn encode(&self, text: &str, out: &mut Vec<u32>) -> Result<(), PretokenTooLong> {
        let composed: String;
        let text =
            if self.nfc && !text.is_ascii() && is_nfc_quick(text.chars()) != IsNormalized::Yes {
                composed = text.nfc().map(|(c, _)| c).collect();
                &composed
            } else {
                text
            };
        let bytes = text.as_bytes();
        WordCache::with(|mut words| {
            for range in Pretokens::new(text, self.pattern, self.classes) {
                if range.len() > TOKENIZER_PRETOKEN_BYTES_MAX {
                    return Err(PretokenTooLong(range.len()));
                }
                let pretoken = &bytes[range];
                match words.as_deref_mut() {
                    Some(words) => self.vocab.encode_pretoken_cached(pretoken, out, words),
                    None => self.vocab.encode_pretoken(pretoken, out),
                }
            }
            Ok(())
        })
    }
}

/// The split pattern of `Sequence[Split(pattern, Isolated), ByteLevel(no prefix space, no
/// regex)]`, exactly that shape.
pub fn pre_tokenizer_pattern(pre: &serde_json::Value) -> Option<SplitPattern> {
    let keys = |v: &serde_json::Value, want: &[&str]| {
        v.as_object()
            .is_some_and(|o| o.len() == want.len() && want.iter().all(|k| o.contains_key(*k)))
    };
    if !keys(pre, &["type", "pretokenizers"]) || pre["type"] != "Sequence" {
        return None;
    }
    let [split, byte_level] = pre["pretokenizers"].as_array()?.as_slice() else {
        return None;
    };
    let split_ok = keys(split, &["type", "pattern", "behavior", "invert"])
        && split["type"] == "Split"
        && split["behavior"] == "Isolated"
        && split["invert"] == false
        && keys(&split["pattern"], &["Regex"]);
    let byte_level_ok = keys(
        byte_level,
        &["type", "add_prefix_space", "trim_offsets", "use_regex"],
    ) && byte_level["type"] == "ByteLevel"
        && byte_level["add_prefix_space"] == false
        && byte_level["use_regex"] == false;
    if !(split_ok && byte_level_ok) {
        return None;
    }
    SplitPattern::of_regex(split["pattern"]["Regex"].as_str()?)
}

/// Whether a post-processor leaves the IDs alone when special tokens are not added.
fn post_processor_adds_nothing(post: &serde_json::Value) -> bool {
    match post["type"].as_str() {
        None => post.is_null(),
        Some("ByteLevel" | "TemplateProcessing") => true,
        Some("Sequence") => post["processors"].as_array().is_some_and(|all| {
            all.iter()
                .all(|p| p.is_object() && post_processor_adds_nothing(p))
        }),
        Some(_) => false,
    }
}

/// GPT-2's byte-level alphabet: the character each byte is written as in the vocabulary.
fn byte_level_chars() -> [char; 256] {
    let mut chars = ['\0'; 256];
    let mut shifted = 0u32;
    for byte in 0..=255u8 {
        let printable = matches!(byte, b'!'..=b'~' | 0xa1..=0xac | 0xae..=0xff);
        let code = if printable {
            u32::from(byte)
        } else {
            shifted += 1;
            255 + shifted
        };
        chars[usize::from(byte)] = char::from_u32(code).unwrap_or('\0');
    }
    chars
}

/// The model's tokens as bytes and its merges by rank (checked as the crate checks them).
fn vocab(model: BpeJson<'_>) -> Result<Vocab, String> {
    if model.kind != "BPE" {
        return Err(format!("model {}", model.kind));
    }
    if model.dropout.is_some_and(|d| d != 0.0) {
        return Err("BPE dropout".into());
    }
    let affix = |a: &Option<String>| a.as_deref().is_some_and(|s| !s.is_empty());
    if affix(&model.continuing_subword_prefix) || affix(&model.end_of_word_suffix) {
        return Err("a subword prefix or suffix".into());
    }
    // By code point: the alphabet's characters are all below U+0144.
    let mut byte_of = [None; 0x144];
    for (byte, c) in byte_level_chars().into_iter().enumerate() {
        byte_of[c as usize] = Some(byte as u8);
    }
    // The bytes `text` spells in the alphabet, into `out` (false: a character outside it).
    let spell = |text: &str, out: &mut Vec<u8>| {
        out.clear();
        text.chars()
            .all(|c| match byte_of.get(c as usize).copied().flatten() {
                Some(byte) => {
                    out.push(byte);
                    true
                }
                None => false,
            })
    };
    // A token with a character outside the alphabet can never be made from bytes: left out.
    let mut bytes = Vec::new();
    let mut tokens: Vec<(u32, Vec<u8>)> = Vec::with_capacity(model.vocab.0.len());
    for (text, id) in &model.vocab.0 {
        if spell(&text.0, &mut bytes) {
            tokens.push((*id, bytes.clone()));
        }
    }
    let mut vocab = Vocab::with_tokens(tokens, model.ignore_merges)?;
    let (mut left, mut right) = (Vec::new(), Vec::new());
    for merge in &model.merges {
        let (l, r) = match merge {
            MergeJson::Pair(l, r) => (&*l.0, &*r.0),
            MergeJson::Joined(line) => match line.0.split(' ').collect::<Vec<_>>()[..] {
                [l, r] => (l, r),
                _ => return Err(format!("merge {:?}", line.0)),
            },
        };
        let spelled = spell(l, &mut left) && spell(r, &mut right);
        vocab.push_merge(spelled.then_some((&left[..], &right[..])))?;
    }
    Ok(vocab.finish())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_byte_level_alphabet_is_gpt2s() {
        let chars = byte_level_chars();
        assert_eq!(chars[usize::from(b' ')], 'Ġ');
        assert_eq!(chars[usize::from(b'\n')], 'Ċ');
        assert_eq!(chars[usize::from(b'a')], 'a');
        assert_eq!(chars[0xad], 'Ń');
        let distinct: std::collections::HashSet<char> = chars.iter().copied().collect();
        assert_eq!(distinct.len(), 256);
    }

    #[test]
    fn unknown_shapes_are_refused_with_the_part_named() {
        let refuse = |json: serde_json::Value| {
            ByteLevelBpe::new(json.to_string().as_bytes()).expect_err("refused")
        };
        let pre = serde_json::json!({"type": "Sequence", "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": pretokens::QWEN2_PATTERN}, "behavior": "Isolated", "invert": false},
            {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": false, "use_regex": false}]});
        assert_eq!(pre_tokenizer_pattern(&pre), Some(SplitPattern::Qwen2));
        let mut other = pre.clone();
        other["pretokenizers"][1]["add_prefix_space"] = true.into();
        assert_eq!(pre_tokenizer_pattern(&other), None);
        let base = serde_json::json!({"normalizer": null, "pre_tokenizer": pre,
            "decoder": {"type": "ByteLevel"}, "post_processor": null,
            "model": {"type": "BPE", "vocab": {}, "merges": []}});
        let mut nfkc = base.clone();
        nfkc["normalizer"] = serde_json::json!({"type": "NFKC"});
        assert!(refuse(nfkc).starts_with("normalizer"));
        let mut word_level = base.clone();
        word_level["model"] =
            serde_json::json!({"type": "WordLevel", "vocab": {}, "unk_token": "x"});
        assert!(refuse(word_level).starts_with("not a BPE model"));
        let mut dropout = base.clone();
        dropout["model"]["dropout"] = 0.1.into();
        assert!(refuse(dropout).contains("dropout"));
        // The bytes are not all tokens.
        assert!(refuse(base).contains("byte 0x00"));
    }
}
