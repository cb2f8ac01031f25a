//! The deterministic completion text of a simulated request.
//!
//! Output token `k` of a request is a word from [`VOCABULARY`] chosen by mixing the request's
//! output seed (a hash of its prompt, so the same request always gets the same answer) with `k`.
//! Every word is one token under the shared tokenizer (`crate::tokenize`), so the engine can cache
//! the generated tokens and a follow-up turn that quotes the answer hits them.
//!
//! Over gRPC the gateway detokenizes, so the IDs must be a real model's: [`OutputVocabulary`]
//! maps the words to the IDs of a `tokenizer.json` (`sim-engine --tokenizer-path`), the first
//! token of an answer without its leading space and every later one with it, so the gateway's
//! decoding of output tokens `0..n` is exactly [`output_text`] of `n`.

use std::path::Path;
use std::sync::OnceLock;

use xxhash_rust::xxh3::xxh3_64;

use crate::tokenize::token_id;

/// Words the simulated model speaks: one token each, under the shared tokenizer and, with and
/// without a leading space, under Llama 3's and Qwen3's (the gRPC engines' real IDs).
pub const VOCABULARY: [&str; 32] = [
    "the", "cache", "routes", "a", "prefix", "to", "engine", "and", "token", "stream", "of",
    "fast", "model", "is", "page", "batch", "kv", "request", "queue", "gateway", "prompt", "with",
    "decode", "fill", "on", "worker", "warm", "hit", "for", "reply", "sample", "answer",
];

/// The output seed of a prompt of `tokens`: the same prompt always gets the same answer.
pub fn prompt_seed(tokens: &[u32]) -> u64 {
    let mut bytes = Vec::with_capacity(tokens.len() * 4);
    for token in tokens {
        bytes.extend_from_slice(&token.to_le_bytes());
    }
    xxh3_64(&bytes)
}

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

/// The token IDs the engine emits for the vocabulary's words: the shared tokenizer's (HTTP
/// mode), or a real model's (`--tokenizer-path`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OutputVocabulary {
    /// Each word's ID as an answer's first token (no leading space).
    first: [u32; VOCABULARY.len()],
    /// Each word's ID after another word (`" word"`).
    rest: [u32; VOCABULARY.len()],
}

impl Default for OutputVocabulary {
    /// The shared tokenizer's IDs: [`output_token`]'s.
    fn default() -> Self {
        let ids = VOCABULARY.map(token_id);
        OutputVocabulary {
            first: ids,
            rest: ids,
        }
    }
}

impl OutputVocabulary {
    /// The IDs of the words in the model whose `tokenizer.json` is at `path` (or in the
    /// directory `path`, as a gateway's `--tokenizer-path` takes it); an error names a word the
    /// model does not encode as one token (its text could not be streamed token by token).
    pub fn from_tokenizer_file(path: &Path) -> Result<OutputVocabulary, String> {
        let file = match path.is_dir() {
            true => path.join("tokenizer.json"),
            false => path.to_path_buf(),
        };
        let tokenizer = tokenizers::Tokenizer::from_file(&file)
            .map_err(|e| format!("--tokenizer-path {}: {e}", path.display()))?;
        Self::from_tokenizer(&tokenizer)
            .map_err(|e| format!("--tokenizer-path {}: {e}", path.display()))
    }

    /// The IDs of the words under `tokenizer`.
    pub fn from_tokenizer(tokenizer: &tokenizers::Tokenizer) -> Result<OutputVocabulary, String> {
        let one_token = |text: &str| -> Result<u32, String> {
            let encoding = tokenizer
                .encode(text, false)
                .map_err(|e| format!("encoding {text:?}: {e}"))?;
            match encoding.get_ids() {
                [id] => Ok(*id),
                ids => Err(format!("{text:?} is {} tokens, not one", ids.len())),
            }
        };
        let mut vocabulary = OutputVocabulary::default();
        for (slot, word) in VOCABULARY.iter().enumerate() {
            vocabulary.first[slot] = one_token(word)?;
            vocabulary.rest[slot] = one_token(&format!(" {word}"))?;
        }
        Ok(vocabulary)
    }

    /// The ID of output token `index` of a request with `seed`: `decode` of tokens `0..n` is
    /// [`output_text`]`(seed, n)`.
    pub fn token(&self, seed: u64, index: u32) -> u32 {
        let slot = vocabulary_slot(seed, index);
        if index == 0 {
            self.first[slot]
        } else {
            self.rest[slot]
        }
    }
}

/// The logprob the simulated model gives output token `index` (a multiple of 1/16 in
/// `-0.5..=-0.0625`, so it survives any float formatting), and `top` alternatives: the token
/// itself, then the next words of the vocabulary, each one nat less likely than the one before.
pub fn output_logprobs(
    vocabulary: &OutputVocabulary,
    seed: u64,
    index: u32,
    top: u32,
) -> (f32, Vec<(u32, f32)>) {
    let slot = vocabulary_slot(seed, index);
    let logprob = -0.0625 * (1 + slot % 8) as f32;
    let ids = if index == 0 {
        &vocabulary.first
    } else {
        &vocabulary.rest
    };
    let alternatives = (0..top.min(VOCABULARY.len() as u32))
        .map(|k| {
            let id = ids[(slot + k as usize) % VOCABULARY.len()];
            (id, logprob - k as f32)
        })
        .collect();
    (logprob, alternatives)
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

    #[test]
    fn a_models_ids_of_the_words_decode_to_the_answers_text() {
        let fixtures = Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/tokenizers");
        for model in ["qwen3", "llama3"] {
            let dir = fixtures.join(model);
            if !dir.join("tokenizer.json").is_file() {
                eprintln!("skipped {model}: no tokenizer files (scripts/fetch-tokenizers.sh)");
                continue;
            }
            let vocabulary = OutputVocabulary::from_tokenizer_file(&dir).unwrap();
            assert_ne!(vocabulary, OutputVocabulary::default());
            let tokenizer = tokenizers::Tokenizer::from_file(dir.join("tokenizer.json")).unwrap();
            for seed in [1, 42, u64::MAX] {
                let ids: Vec<u32> = (0..40).map(|k| vocabulary.token(seed, k)).collect();
                assert_eq!(
                    tokenizer.decode(&ids, true).unwrap(),
                    output_text(seed, 40),
                    "{model}"
                );
            }
        }
        // A file that is not a tokenizer is refused with its path.
        let error = OutputVocabulary::from_tokenizer_file(Path::new("/nonexistent/tokenizer.json"));
        assert!(error.unwrap_err().contains("/nonexistent"));
    }

    #[test]
    fn logprobs_are_exact_and_their_alternatives_begin_with_the_token() {
        let vocabulary = OutputVocabulary::default();
        let (logprob, top) = output_logprobs(&vocabulary, 7, 3, 3);
        assert_eq!(top.len(), 3);
        assert_eq!(top[0], (vocabulary.token(7, 3), logprob));
        assert_eq!(top[2].1, logprob - 2.0);
        assert!((-0.5..0.0).contains(&logprob));
        assert_eq!(logprob * 16.0, (logprob * 16.0).round());
        assert!(output_logprobs(&vocabulary, 7, 3, 0).1.is_empty());
    }
}
