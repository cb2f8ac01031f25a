//! The detokenizer against the Python `tokenizers` package's `decode`: the cases of
//! `tests/fixtures/detokenize-*.jsonl` (`scripts/detokenize-reference.py` made them), decoded
//! token by token; the two SentencePiece tokenizers are committed beside their cases, Llama 3's
//! and Qwen3's come from `scripts/fetch-tokenizers.sh` (absent: those tests say so and pass,
//! unless `KVGATE_REQUIRE_TOKENIZER_FIXTURES` is set).

use std::path::PathBuf;
use std::sync::Arc;

use tokenizers::Tokenizer;

use super::*;

struct Case {
    ids: Vec<u32>,
    skip: bool,
    text: String,
}

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn cases(name: &str) -> Vec<Case> {
    let path = root().join(format!("tests/fixtures/detokenize-{name}.jsonl"));
    let text = std::fs::read_to_string(&path).unwrap();
    text.lines()
        .map(|line| {
            let v: serde_json::Value = serde_json::from_str(line).unwrap();
            Case {
                ids: v["ids"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|i| i.as_u64().unwrap() as u32)
                    .collect(),
                skip: v["skip_special_tokens"].as_bool().unwrap(),
                text: v["text"].as_str().unwrap().to_owned(),
            }
        })
        .collect()
}

fn model_tokenizer(name: &str) -> Option<Arc<Tokenizer>> {
    let path = match name {
        "sp-strip" | "sp-metaspace" => {
            root().join(format!("tests/fixtures/detokenize-{name}.json"))
        }
        model => {
            let dir = match std::env::var_os("KVGATE_TOKENIZER_FIXTURES") {
                Some(dir) => PathBuf::from(dir),
                None => root().join("target/tokenizers"),
            };
            dir.join(model).join("tokenizer.json")
        }
    };
    match std::fs::read(&path) {
        Ok(bytes) => Some(Arc::new(Tokenizer::from_bytes(bytes).unwrap())),
        Err(_) if std::env::var_os("KVGATE_REQUIRE_TOKENIZER_FIXTURES").is_some() => {
            panic!(
                "{} is missing: run scripts/fetch-tokenizers.sh",
                path.display()
            )
        }
        Err(_) => {
            eprintln!(
                "skipped: {} is missing: run scripts/fetch-tokenizers.sh",
                path.display()
            );
            None
        }
    }
}

/// Streams every case token by token; returns how many cases there were.
fn check_stream(table: &DecodeTable, cases: &[Case], label: &str) -> usize {
    let mut out = String::new();
    let mut step = String::new();
    for case in cases {
        out.clear();
        let mut stream = DecodeStream::new(table, case.skip);
        for &id in &case.ids {
            step.clear();
            stream.step(table, id, &mut step);
            // Text without U+FFFD is never written with one, even for a moment.
            assert!(
                case.text.contains('\u{FFFD}') || !step.contains('\u{FFFD}'),
                "{label}: a replacement character mid-stream in {:?}",
                case.ids
            );
            out.push_str(&step);
            if table.kind == DecoderKind::ByteLevel {
                // Held bytes are at most an incomplete character.
                assert!(
                    stream.held.len() <= 3,
                    "{label}: {} bytes held",
                    stream.held.len()
                );
            }
        }
        stream.finish(table, &mut out);
        assert_eq!(
            out, case.text,
            "{label}: ids {:?} skip_special_tokens {}",
            case.ids, case.skip
        );
    }
    cases.len()
}

fn check_model(name: &str, kind: DecoderKind) {
    let Some(tokenizer) = model_tokenizer(name) else {
        return;
    };
    let table = DecodeTable::of(tokenizer.clone());
    assert_eq!(
        table.kind(),
        kind,
        "{name}: the decoder is modelled and agrees with the crate"
    );
    let cases = cases(name);
    assert!(check_stream(&table, &cases, name) >= 100);
    // The same cases through the crate itself (the Python package's code): the fixtures are
    // the crate's answers too.
    for case in &cases {
        assert_eq!(
            table.decode_whole(&case.ids, case.skip),
            case.text,
            "{name}: {:?}",
            case.ids
        );
    }
}

#[test]
fn llama3_streams_equal_python_decode() {
    check_model("llama3", DecoderKind::ByteLevel);
}

#[test]
fn qwen3_streams_equal_python_decode() {
    check_model("qwen3", DecoderKind::ByteLevel);
}

#[test]
fn sentencepiece_strip_streams_equal_python_decode() {
    check_model("sp-strip", DecoderKind::Pieces(FirstSpace::StripOnce));
}

#[test]
fn sentencepiece_metaspace_streams_equal_python_decode() {
    check_model(
        "sp-metaspace",
        DecoderKind::Pieces(FirstSpace::MetaspaceFirstToken),
    );
}

#[test]
fn window_decoder_equals_python_decode_on_text() {
    // The fallback for decoders kvgate does not model, on the cases made of real text (random
    // IDs make invalid UTF-8 whose replacement characters the window cannot place exactly).
    for name in ["sp-strip", "sp-metaspace", "qwen3"] {
        let Some(tokenizer) = model_tokenizer(name) else {
            continue;
        };
        let table = DecodeTable::build(tokenizer, DecoderKind::Window, false);
        let texts: Vec<Case> = cases(name)
            .into_iter()
            .filter(|c| !c.text.contains('\u{FFFD}'))
            .collect();
        assert!(check_stream(&table, &texts, name) > 10);
    }
}

#[test]
fn byte_level_holds_a_split_character_until_complete() {
    // Byte-level tokens for the bytes of "é" (C3 A9) and "🎉" (F0 9F 8E 89), one byte each.
    let Some(tokenizer) = model_tokenizer("qwen3") else {
        return;
    };
    let table = DecodeTable::of(tokenizer.clone());
    let byte_id = |b: u8| {
        let c = byte_level_chars()
            .into_iter()
            .find(|(_, v)| *v == b)
            .map(|(c, _)| c)
            .unwrap();
        tokenizer.token_to_id(&c.to_string()).unwrap()
    };
    let mut stream = DecodeStream::new(&table, true);
    let mut out = String::new();
    for b in [0xF0, 0x9F, 0x8E] {
        stream.step(&table, byte_id(b), &mut out);
        assert_eq!(out, "", "held while incomplete");
    }
    stream.step(&table, byte_id(0x89), &mut out);
    assert_eq!(out, "🎉");
    // An incomplete character at the end is one U+FFFD, as `decode` writes it.
    stream.step(&table, byte_id(0xC3), &mut out);
    assert_eq!(out, "🎉");
    stream.finish(&table, &mut out);
    assert_eq!(out, "🎉\u{FFFD}");
    // A byte that cannot continue a character is written at once.
    let mut out = String::new();
    let mut stream = DecodeStream::new(&table, true);
    stream.step(&table, byte_id(0xC3), &mut out);
    stream.step(&table, byte_id(b'a'), &mut out);
    assert_eq!(out, "\u{FFFD}a");
}

#[test]
fn byte_fallback_run_is_text_only_when_whole_run_is_valid() {
    let Some(tokenizer) = model_tokenizer("sp-strip") else {
        return;
    };
    let table = DecodeTable::of(tokenizer.clone());
    let byte = |b: u8| tokenizer.token_to_id(&format!("<0x{b:02X}>")).unwrap();
    let hello = tokenizer.token_to_id("▁Hello").unwrap();
    // "の" is E3 81 AE: held until the run ends, then text; the leading space is stripped once.
    let mut out = String::new();
    let mut stream = DecodeStream::new(&table, true);
    for id in [hello, byte(0xE3), byte(0x81), byte(0xAE)] {
        stream.step(&table, id, &mut out);
    }
    assert_eq!(out, "Hello");
    stream.step(&table, hello, &mut out);
    assert_eq!(out, "Helloの Hello");
    // A run that turns invalid is U+FFFD per byte, the valid start included, written as soon
    // as it is known.
    let mut out = String::new();
    let mut stream = DecodeStream::new(&table, true);
    for id in [byte(0xE3), byte(0x81), byte(0xFF)] {
        stream.step(&table, id, &mut out);
    }
    assert_eq!(out, "\u{FFFD}\u{FFFD}\u{FFFD}");
    stream.step(&table, byte(0x41), &mut out);
    assert_eq!(out, "\u{FFFD}\u{FFFD}\u{FFFD}\u{FFFD}");
    stream.finish(&table, &mut out);
    assert_eq!(
        out,
        table.decode_whole(&[byte(0xE3), byte(0x81), byte(0xFF), byte(0x41)], true)
    );
}

#[test]
fn unknown_ids_are_left_out() {
    let Some(tokenizer) = model_tokenizer("sp-metaspace") else {
        return;
    };
    let table = DecodeTable::of(tokenizer.clone());
    let hello = tokenizer.token_to_id("▁Hello").unwrap();
    let mut out = String::new();
    let mut stream = DecodeStream::new(&table, false);
    for id in [u32::MAX, hello, 1_000_000, hello] {
        stream.step(&table, id, &mut out);
    }
    stream.finish(&table, &mut out);
    assert_eq!(out, table.decode_whole(&[hello, hello], false));
    assert_eq!(out, "Hello Hello");
    assert!(table.token_bytes(u32::MAX).is_empty());
}

#[test]
fn a_model_tokenizer_shares_its_tokenizer_with_the_table() {
    let path = root().join("tests/fixtures/detokenize-sp-metaspace.json");
    let files = super::super::TokenizerFiles {
        tokenizer_json: std::fs::read(path).unwrap(),
        ..Default::default()
    };
    let model = ModelTokenizer::new("sp", files).unwrap();
    let table = DecodeTable::new(&model);
    assert!(Arc::ptr_eq(&table.tokenizer, &model.tokenizer));
    assert_eq!(
        table.kind(),
        DecoderKind::Pieces(FirstSpace::MetaspaceFirstToken)
    );
    assert!(table.is_special(1) && !table.is_special(3));
}
