//! The deterministic completion text of a simulated request.
//!
//! Output token `k` of a request is a word from [`VOCABULARY`] chosen by mixing the request's
//! output seed (a hash of its prompt, so the same request always gets the same answer) with `k`.
//! Every word is one token under the shared tokenizer (`crate::tokenize`), so the engine can cache
//! the generated tokens and a follow-up turn that quotes the answer hits them.

use std::sync::OnceLock;

use crate::tokenize::token_id;

/// Words the simulated model speaks (one token each).
pub const VOCABULARY: [&str; 32] = [
    "the",
    "cache",
    "routes",
    "a",
    "prefix",
    "to",
    "engine",
    "and",
    "token",
    "stream",
    "of",
    "fast",
    "model",
    "is",
    "page",
    "batch",
    "kv",
    "request",
    "queue",
    "gateway",
    "prompt",
    "with",
    "decode",
    "prefill",
    "on",
    "worker",
    "warm",
    "hit",
    "for",
    "reply",
    "simulated",
    "answer",
];

/// The word of output token `index` for a request with `seed`.
pub fn output_word(seed: u64, index: u32) -> &'static str {
    VOCABULARY[vocabulary_slot(seed, index)]
}

/// The token id of output token `index` (equal to `token_id(output_word(seed, index))`).
pub fn output_token(seed: u64, index: u32) -> u32 {
    static IDS: OnceLock<[u32; 32]> = OnceLock::new();
    let ids = IDS.get_or_init(|| VOCABULARY.map(token_id));
    ids[vocabulary_slot(seed, index)]
}

/// The whole completion text of `count` tokens: words joined by single spaces.
pub fn output_text(seed: u64, count: u32) -> String {
    let mut text = String::with_capacity(count as usize * 7);
    for index in 0..count {
        if index > 0 {
            text.push(' ');
        }
        text.push_str(output_word(seed, index));
    }
    text
}

/// The text a stream chunk carries for token `index`: the word, preceded by a space after the first.
pub fn output_delta(seed: u64, index: u32) -> String {
    let word = output_word(seed, index);
    if index == 0 {
        word.to_string()
    } else {
        format!(" {word}")
    }
}

fn vocabulary_slot(seed: u64, index: u32) -> usize {
    // splitmix64 finalizer: cheap, well mixed, deterministic.
    let mut z = seed.wrapping_add(u64::from(index).wrapping_mul(0x9e37_79b9_7f4a_7c15));
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^= z >> 31;
    (z % VOCABULARY.len() as u64) as usize
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tokenize::tokenize_text;

    #[test]
    fn vocabulary_words_need_no_json_escaping() {
        for word in VOCABULARY {
            assert!(word.bytes().all(|byte| byte.is_ascii_lowercase()), "{word}");
        }
    }

    #[test]
    fn output_is_deterministic_and_tokenizes_back() {
        let text = output_text(42, 20);
        assert_eq!(text, output_text(42, 20));
        assert_ne!(text, output_text(43, 20));
        let tokens = tokenize_text(&text);
        assert_eq!(tokens.len(), 20);
        for (index, token) in tokens.iter().enumerate() {
            assert_eq!(*token, output_token(42, index as u32));
        }
        let streamed: String = (0..20).map(|index| output_delta(42, index)).collect();
        assert_eq!(streamed, text);
    }
}
