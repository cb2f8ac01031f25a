//! The deterministic text tokenizer shared by `sim-engine` (to count and cache tokens) and `replay`
//! (to build prompts of exact token lengths).
//!
//! The contract (HELPERS.md, "Shared facts"), which other crates rely on:
//! - A text prompt is split on ASCII whitespace (`str::split_ascii_whitespace`); every word is
//!   exactly one token. Leading, trailing and repeated whitespace produce no tokens.
//! - A word's token id is `xxh3_64(word bytes) & 0x7fff_ffff` ([`token_id`]): deterministic,
//!   below 2^31, equal words give equal ids.
//! - Chat messages: the text of each message (string `content`, or the `text` of each part of an
//!   array `content`), in order, joined by a single space ([`chat_prompt_text`]). Anthropic's
//!   top-level `system` (string or text blocks) comes first when present.
//! - `input_ids` are used as given (this module is not involved).
//!
//! Consequences: a prompt of T whitespace-separated words is T tokens, and two prompts whose first
//! K words are equal have equal first K tokens. [`synthetic_word`] gives a deterministic word per
//! number for building such prompts.

use serde_json::Value;
use xxhash_rust::xxh3::xxh3_64;

/// Token ids stay below 2^31 so they fit every engine's `int32` token id type.
pub const TOKEN_ID_MASK: u64 = 0x7fff_ffff;

/// The token id of one word (a maximal run of non-whitespace bytes).
pub fn token_id(word: &str) -> u32 {
    // Masked to 31 bits, so the narrowing cast is lossless.
    (xxh3_64(word.as_bytes()) & TOKEN_ID_MASK) as u32
}

/// The tokens of a text prompt: one per ASCII-whitespace-separated word.
pub fn tokenize_text(text: &str) -> Vec<u32> {
    text.split_ascii_whitespace().map(token_id).collect()
}

/// The number of tokens of a text prompt, without building them.
pub fn count_text_tokens(text: &str) -> usize {
    text.split_ascii_whitespace().count()
}

/// The text of chat messages (OpenAI `messages` array), in order, joined by a single space.
///
/// A message's `content` is either a string or an array of parts whose `text` fields count;
/// other parts (images, tool calls) and non-array `messages` contribute nothing.
pub fn chat_prompt_text(messages: &Value) -> String {
    let mut texts: Vec<&str> = Vec::new();
    if let Some(list) = messages.as_array() {
        for message in list {
            push_content_texts(message.get("content"), &mut texts);
        }
    }
    texts.join(" ")
}

/// Anthropic Messages prompt text: the top-level `system` (string or text blocks) first, then the
/// messages as in [`chat_prompt_text`], joined by a single space.
pub fn messages_prompt_text(system: Option<&Value>, messages: &Value) -> String {
    let mut texts: Vec<&str> = Vec::new();
    push_content_texts(system, &mut texts);
    if let Some(list) = messages.as_array() {
        for message in list {
            push_content_texts(message.get("content"), &mut texts);
        }
    }
    texts.join(" ")
}

/// The tokens of chat messages ([`chat_prompt_text`] then [`tokenize_text`]).
pub fn tokenize_chat(messages: &Value) -> Vec<u32> {
    tokenize_text(&chat_prompt_text(messages))
}

fn push_content_texts<'a>(content: Option<&'a Value>, texts: &mut Vec<&'a str>) {
    match content {
        Some(Value::String(text)) => texts.push(text),
        Some(Value::Array(parts)) => {
            for part in parts {
                if let Some(Value::String(text)) = part.get("text") {
                    texts.push(text);
                }
            }
        }
        _ => {}
    }
}

/// A deterministic word for `n` (`"w"` followed by `n` in base 36): distinct numbers give distinct
/// words, hence distinct tokens up to hash collisions of 31-bit ids.
pub fn synthetic_word(n: u64) -> String {
    const DIGITS: &[u8; 36] = b"0123456789abcdefghijklmnopqrstuvwxyz";
    let mut digits = Vec::with_capacity(14);
    let mut rest = n;
    loop {
        digits.push(DIGITS[(rest % 36) as usize]);
        rest /= 36;
        if rest == 0 {
            break;
        }
    }
    digits.push(b'w');
    digits.reverse();
    // Every byte comes from DIGITS or is b'w': ASCII, hence valid UTF-8.
    String::from_utf8(digits).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn words_are_tokens_and_whitespace_is_not() {
        assert_eq!(tokenize_text("  a\tb\n\nc  ").len(), 3);
        assert_eq!(tokenize_text(""), Vec::<u32>::new());
        assert_eq!(count_text_tokens("x y  z"), 3);
        assert_eq!(tokenize_text("a b"), vec![token_id("a"), token_id("b")]);
    }

    #[test]
    fn ids_are_deterministic_and_below_2_pow_31() {
        for word in ["hello", "Hello", "w0", "ü", "{\"x\":1}"] {
            assert_eq!(token_id(word), token_id(word));
            assert!(token_id(word) < (1 << 31));
        }
        assert_ne!(token_id("hello"), token_id("Hello"));
    }

    #[test]
    fn equal_word_prefixes_give_equal_token_prefixes() {
        let a = tokenize_text("sys prompt here then question one");
        let b = tokenize_text("sys prompt here then other");
        assert_eq!(a[..4], b[..4]);
        assert_ne!(a[4], b[4]);
    }

    #[test]
    fn chat_text_joins_string_and_part_contents_in_order() {
        let messages = json!([
            {"role": "system", "content": "be brief"},
            {"role": "user", "content": [
                {"type": "text", "text": "hello there"},
                {"type": "image_url", "image_url": {"url": "x"}},
                {"type": "text", "text": "again"}
            ]},
            {"role": "assistant", "content": null}
        ]);
        assert_eq!(chat_prompt_text(&messages), "be brief hello there again");
        assert_eq!(tokenize_chat(&messages).len(), 5);
        let system = json!([{"type": "text", "text": "sys"}]);
        assert_eq!(
            messages_prompt_text(Some(&system), &json!([{"role": "user", "content": "hi"}])),
            "sys hi"
        );
    }

    #[test]
    fn synthetic_words_are_distinct_single_tokens() {
        let words: Vec<String> = (0..1000).map(synthetic_word).collect();
        let unique: std::collections::HashSet<&String> = words.iter().collect();
        assert_eq!(unique.len(), 1000);
        assert_eq!(synthetic_word(0), "w0");
        assert_eq!(synthetic_word(36), "w10");
        assert_eq!(count_text_tokens(&words.join(" ")), 1000);
    }
}
