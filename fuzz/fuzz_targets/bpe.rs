//! kvgate's byte-level BPE (`kvgate::tokenize::bpe`) against the `tokenizers` crate: arbitrary
//! text encoded by both, for Qwen3's and Llama 3's real `tokenizer.json`, must give equal IDs
//! (`ModelTokenizer::encode`: the added-token cut, then kvgate's pre-tokenizer scanner and
//! merging, against `encode_with_crate`: the crate alone, added tokens and all), and so must the
//! pieces and chunks the segment cache stores (`encode_pieces_uncached`).
//!
//! The input is its own text when it is UTF-8; otherwise it is read as code points (three
//! bytes each, a leading selector byte steering half of them into ASCII so words, spaces and
//! digits mix with the rest of Unicode), so every character is reachable.
//!
//! Inputs of a few KiB check everything longer ones do (pre-tokens past the stack's 128 bytes
//! take the heap, texts past a chunk's ~1 KiB are cut into chunks) at a fraction of the crate's
//! time per input: run it with `FUZZ_MAX_LEN=4096 scripts/fuzz.sh SECONDS bpe` (words of up to
//! 256 KiB are `tests/tokenize_reference.rs`'s). kvgate's word cache is on, as in the gateway:
//! a word's first encoding is merged and compared here, later ones are the cache's.
//!
//! The tokenizer files come from `scripts/fetch-tokenizers.sh` (`target/tokenizers/`, or
//! `KVGATE_TOKENIZER_FIXTURES`). Without them the target has nothing to compare: it says so
//! once and accepts every input, so `scripts/fuzz.sh` runs it (uselessly but cleanly) anywhere.
#![no_main]

use std::borrow::Cow;
use std::path::PathBuf;
use std::sync::{Arc, OnceLock};

use kvgate::tokenize::{ModelTokenizer, TokenizerFiles};
use libfuzzer_sys::fuzz_target;

fn models() -> &'static [Arc<ModelTokenizer>] {
    static MODELS: OnceLock<Vec<Arc<ModelTokenizer>>> = OnceLock::new();
    MODELS.get_or_init(|| {
        let dir = std::env::var_os("KVGATE_TOKENIZER_FIXTURES")
            .map(PathBuf::from)
            .unwrap_or_else(|| PathBuf::from("target/tokenizers"));
        let mut models = Vec::new();
        for name in ["qwen3", "llama3"] {
            let Ok(tokenizer_json) = std::fs::read(dir.join(name).join("tokenizer.json")) else {
                eprintln!(
                    "bpe: no {name} tokenizer under {}: nothing to compare (scripts/fetch-tokenizers.sh)",
                    dir.display()
                );
                continue;
            };
            let files = TokenizerFiles {
                tokenizer_json,
                tokenizer_config_json: None,
                chat_template: None,
            };
            let model = ModelTokenizer::new(name, files).expect("the tokenizer loads");
            assert!(model.wait_for_own_bpe(), "{name}: {}", model.encoder());
            models.push(Arc::new(model));
        }
        models
    })
}

/// The input as text (see the module documentation).
fn text_of(data: &[u8]) -> Cow<'_, str> {
    if let Ok(text) = std::str::from_utf8(data) {
        return Cow::Borrowed(text);
    }
    data.chunks(3)
        .filter_map(|c| {
            let [selector, rest @ ..] = c else {
                return None;
            };
            if selector & 1 == 0 {
                return Some(char::from(selector >> 1));
            }
            let high = rest.first().copied().unwrap_or(0);
            let low = rest.get(1).copied().unwrap_or(0);
            let code = (u32::from(selector >> 1) << 16 | u32::from(high) << 8 | u32::from(low))
                % (char::MAX as u32 + 1);
            char::from_u32(code)
        })
        .collect::<String>()
        .into()
}

fuzz_target!(
    init: {
        // Loading takes seconds: before the first input, outside libFuzzer's per-input timeout.
        models();
    },
    |data: &[u8]| {
        let text = text_of(data);
        for model in models() {
            let ours = model.encode(&text, false);
            let theirs = model.encode_with_crate(&text, false);
            assert_eq!(ours, theirs, "{model:?} on {text:?}");
            // Piece by piece, long pieces in chunks (what the segment cache stores): the same IDs.
            let mut pieces = Vec::new();
            let pieced = model.encode_pieces_uncached(&text, &mut pieces).map(|()| pieces);
            assert_eq!(pieced, theirs, "{model:?} piece by piece on {text:?}");
        }
    }
);
