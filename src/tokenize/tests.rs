//! The pipeline on a small word-level tokenizer built here (the real tokenizers are compared
//! with the Python `tokenizers` package in `tests/tokenize_reference.rs`).

use super::*;
use serde_json::json;

const WORDS: &[&str] = &[
    "hello",
    "world",
    "system",
    "user",
    "assistant",
    "be",
    "brief",
    "hi",
];

/// A word-level tokenizer: whitespace pre-tokenizer, added tokens `<|s|>` (100), `<|e|>` (101),
/// `<|b|>` (102, added before each sequence by the post-processor); `strip` makes `<|e|>`
/// swallow the whitespace on its left.
fn tokenizer_json(strip: bool) -> Vec<u8> {
    let vocab: serde_json::Map<String, serde_json::Value> =
        std::iter::once(("[UNK]".to_string(), json!(0)))
            .chain(
                WORDS
                    .iter()
                    .enumerate()
                    .map(|(i, w)| (w.to_string(), json!(i + 1))),
            )
            .chain([
                ("<|s|>".to_string(), json!(100)),
                ("<|e|>".to_string(), json!(101)),
                ("<|b|>".to_string(), json!(102)),
            ])
            .collect();
    let added = |id: u32, content: &str, lstrip: bool| {
        json!({"id": id, "content": content, "single_word": false, "lstrip": lstrip,
               "rstrip": false, "normalized": false, "special": true})
    };
    json!({
        "version": "1.0", "truncation": null, "padding": null,
        "added_tokens": [added(100, "<|s|>", false), added(101, "<|e|>", strip), added(102, "<|b|>", false)],
        "normalizer": null,
        "pre_tokenizer": {"type": "Whitespace"},
        "post_processor": {"type": "TemplateProcessing",
            "single": [{"SpecialToken": {"id": "<|b|>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
            "pair": [{"Sequence": {"id": "A", "type_id": 0}}, {"Sequence": {"id": "B", "type_id": 1}}],
            "special_tokens": {"<|b|>": {"id": "<|b|>", "ids": [102], "tokens": ["<|b|>"]}}},
        "decoder": null,
        "model": {"type": "WordLevel", "vocab": vocab, "unk_token": "[UNK]"}
    })
    .to_string()
    .into_bytes()
}

const TEMPLATE: &str = "{% for m in messages %}<|s|>{{ m.role }} {{ m.content }}<|e|>{% endfor %}{% if add_generation_prompt %}<|s|>assistant {% endif %}";

/// The word-level model (`strip`: `<|e|>` strips the whitespace on its left), with a template
/// that prints `<|s|>role content<|e|>` per message: also the router's tests' tokenizer.
pub(crate) fn model(strip: bool) -> Arc<ModelTokenizer> {
    let files = TokenizerFiles {
        tokenizer_json: tokenizer_json(strip),
        tokenizer_config_json: None,
        chat_template: Some(TEMPLATE.into()),
    };
    Arc::new(ModelTokenizer::new("test", files).expect("loads"))
}

fn cache() -> TokenCache {
    TokenCache::new(CacheConfig {
        l0_entries_max: 0,
        l1_bytes_max: 1 << 20,
    })
}

fn chat(model: &ModelTokenizer, user: &str) -> Prompt {
    let body = json!({"messages": [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": user}]})
    .to_string();
    model
        .prompt(PromptSource::Chat(body.as_bytes()))
        .expect("renders")
}

#[test]
fn chat_prompts_render_and_split_at_added_tokens() {
    let model = model(false);
    assert!(model.splits(), "{:?}", model.notes());
    let prompt = chat(&model, "hello world");
    assert_eq!(
        prompt.text,
        "<|s|>system be brief<|e|><|s|>user hello world<|e|><|s|>assistant "
    );
    let mut out = Vec::new();
    tokenize_inline(&model, prompt, &mut cache(), &mut out).unwrap();
    // Chat prompts get no post-processor tokens (no 102 in front).
    assert_eq!(out, [100, 3, 6, 7, 101, 100, 4, 1, 2, 101, 100, 5]);
}

#[test]
fn cached_segments_give_the_ids_of_uncached_tokenization() {
    let model = model(false);
    let mut cache = cache();
    let mut first = Vec::new();
    let Begun::Cold(work) = begin(&model, chat(&model, "hello"), &mut cache, &mut first) else {
        panic!("a new prompt has cold segments");
    };
    assert_eq!(
        work.cold_bytes(),
        "system be brief".len() + "user hello".len() + "assistant ".len()
    );
    finish(work.run(), &mut cache, &mut first).unwrap();
    // A second turn: only the new user segment is cold.
    let mut second = Vec::new();
    let Begun::Cold(work) = begin(&model, chat(&model, "hi world"), &mut cache, &mut second) else {
        panic!("the new turn is cold");
    };
    assert_eq!(work.cold_bytes(), "user hi world".len());
    finish(work.run(), &mut cache, &mut second).unwrap();
    let mut uncached = Vec::new();
    model
        .encode_pieces_uncached(&chat(&model, "hi world").text, &mut uncached)
        .unwrap();
    assert_eq!(second, uncached);
    assert_eq!(
        second,
        model.encode(&chat(&model, "hi world").text, false).unwrap()
    );
    // The same prompt again: nothing is cold.
    let mut third = Vec::new();
    assert!(matches!(
        begin(&model, chat(&model, "hi world"), &mut cache, &mut third),
        Begun::Done
    ));
    assert_eq!(third, second);
    assert!(cache.stats().l1_hits >= 5);
}

#[test]
fn completions_get_the_post_processors_tokens_around_cached_segments() {
    let model = model(false);
    let prompt = || {
        model
            .prompt(PromptSource::Completion("hello<|e|>world"))
            .unwrap()
    };
    let mut cache = cache();
    let mut out = Vec::new();
    tokenize_inline(&model, prompt(), &mut cache, &mut out).unwrap();
    assert_eq!(out, [102, 1, 101, 2]);
    assert_eq!(out, model.encode("hello<|e|>world", true).unwrap());
    tokenize_inline(&model, prompt(), &mut cache, &mut out).unwrap();
    assert_eq!(out, [102, 1, 101, 2]);
}

#[test]
fn a_token_that_strips_whitespace_makes_the_model_tokenize_whole_prompts() {
    let model = model(true);
    assert!(!model.splits());
    assert!(model.notes()[0].contains("<|e|>"), "{:?}", model.notes());
    let mut cache = TokenCache::new(CacheConfig {
        l0_entries_max: 4,
        l1_bytes_max: 1 << 20,
    });
    let mut out = Vec::new();
    let Begun::Cold(work) = begin(&model, chat(&model, "hello"), &mut cache, &mut out) else {
        panic!("cold");
    };
    assert_eq!(work.cold_bytes(), chat(&model, "hello").text.len());
    finish(work.run(), &mut cache, &mut out).unwrap();
    assert_eq!(
        out,
        model.encode(&chat(&model, "hello").text, false).unwrap()
    );
    // L0 remembers the whole prompt.
    let mut again = Vec::new();
    assert!(matches!(
        begin(&model, chat(&model, "hello"), &mut cache, &mut again),
        Begun::Done
    ));
    assert_eq!(again, out);
    assert_eq!(cache.l1_entries(), 0);
}

#[test]
fn bad_files_and_bodies_are_errors() {
    let error = ModelTokenizer::new("m", TokenizerFiles::default()).unwrap_err();
    assert!(
        error.to_string().starts_with("m: tokenizer.json"),
        "{error}"
    );
    let files = TokenizerFiles {
        tokenizer_json: tokenizer_json(false),
        tokenizer_config_json: Some(b"{not json".to_vec()),
        chat_template: None,
    };
    assert!(ModelTokenizer::new("m", files).is_err());
    let files = TokenizerFiles {
        tokenizer_json: tokenizer_json(false),
        tokenizer_config_json: None,
        chat_template: Some("{% for %}".into()),
    };
    assert!(ModelTokenizer::new("m", files).is_err());
    let model = model(false);
    assert_eq!(
        model.prompt(PromptSource::Chat(b"[]")).unwrap_err(),
        TokenizeError::Body
    );
    let no_template = ModelTokenizer::new(
        "m",
        TokenizerFiles {
            tokenizer_json: tokenizer_json(false),
            ..TokenizerFiles::default()
        },
    )
    .unwrap();
    let body = br#"{"messages":[{"role":"user","content":"hi"}]}"#;
    assert_eq!(
        no_template.prompt(PromptSource::Chat(body)).unwrap_err(),
        TokenizeError::NoTemplate
    );
}

#[test]
fn models_find_their_tokenizer_or_the_default() {
    let (a, b) = (model(false), model(true));
    let set = TokenizerSet::new(vec![(Some("a".into()), a.clone()), (None, b.clone())]);
    assert!(Arc::ptr_eq(&set.for_model("a").unwrap(), &a));
    assert!(Arc::ptr_eq(&set.for_model("other").unwrap(), &b));
    let only_a = TokenizerSet::new(vec![(Some("a".into()), a)]);
    assert!(only_a.for_model("other").is_none());
    assert!(TokenizerSet::default().is_empty());
}

#[test]
fn a_prompt_rendered_and_cut_off_the_core_gives_the_ids_of_begin() {
    let model = model(false);
    let body = json!({"messages": [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": "hello world"}]})
    .to_string();
    let mut inline = Vec::new();
    let prompt = model.prompt(PromptSource::Chat(body.as_bytes())).unwrap();
    tokenize_inline(&model, prompt, &mut cache(), &mut inline).unwrap();
    let work = RenderWork::new(&model, PromptSource::Chat(body.as_bytes()));
    assert_eq!(work.source_bytes(), body.len());
    let mut cache = cache();
    let mut out = Vec::new();
    let cut = work.run().expect("renders");
    let Begun::Cold(cold) = begin_cut(cut, &mut cache, &mut out) else {
        panic!("a new prompt has cold segments");
    };
    finish(cold.run(), &mut cache, &mut out).unwrap();
    assert_eq!(out, inline);
    // Cut again, it is found in the cache.
    let cut = RenderWork::new(&model, PromptSource::Chat(body.as_bytes())).run();
    assert!(matches!(
        begin_cut(cut.unwrap(), &mut cache, &mut out),
        Begun::Done
    ));
    assert_eq!(out, inline);
    // A body no template reads is an error of the work, not a panic.
    let broken = RenderWork::new(&model, PromptSource::Chat(b"{\"messages\":7}")).run();
    assert_eq!(broken.unwrap_err(), TokenizeError::Body);
}

#[test]
fn the_crate_refuses_a_word_past_the_pretoken_bound_and_takes_long_texts_of_words() {
    use crate::limits::TOKENIZER_PRETOKEN_BYTES_MAX;
    let model = model(false);
    let word = "h".repeat(TOKENIZER_PRETOKEN_BYTES_MAX + 1);
    assert_eq!(
        model.encode_with_crate(&word, false).unwrap_err(),
        TokenizeError::TooLarge("bytes in one word")
    );
    let words = "hello ".repeat(TOKENIZER_PRETOKEN_BYTES_MAX / 4);
    let ids = model.encode_with_crate(&words, false).expect("short words");
    assert_eq!(ids.len(), TOKENIZER_PRETOKEN_BYTES_MAX / 4);
}
