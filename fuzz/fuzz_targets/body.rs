//! Body extraction (`kvgate::request::extract`): the one-pass reader of the routing fields of a
//! chat/completions/generate/messages body. The first byte picks the endpoint; the rest is the
//! body.
//!
//! Checked beyond "no panic", against `serde_json`'s own reading of the body:
//! - a body `serde_json` cannot even skip as one JSON value is refused; a JSON object whose
//!   `model` is a string (or absent) is accepted, with that `model`;
//! - the output budget (`max_completion_tokens` / `max_tokens` / `sampling_params.
//!   max_new_tokens`, per endpoint), the completions `prompt` / generate `text`, and the cache
//!   partition namespace equal what the parsed document says;
//! - the text, model and token IDs are no longer than the body;
//! - a `RoutingInput` reused from the previous input extracts exactly what a fresh one does (its
//!   buffers are cleared, not appended to);
//! - the one-pass scanner (`extract`) reads exactly what the reference `serde_json` visitors
//!   (`extract_reference`) read, error or not (issue 21), and so does the scanner building the
//!   text in a shared buffer as it does for large bodies (`extract_shared_text`).
#![no_main]

use std::cell::RefCell;

use kvgate::request::{
    extract, extract_reference, extract_shared_text, Endpoint, PartitionFields, RoutingHeaders,
    RoutingInput, RoutingKey,
};
use libfuzzer_sys::fuzz_target;
use serde_json::Value;

thread_local! {
    static REUSED: RefCell<RoutingInput> = RefCell::new(RoutingInput::new());
}

/// Everything extraction exposes, for comparing two extractions.
#[derive(Debug, PartialEq)]
struct Seen {
    ok: bool,
    endpoint: Option<Endpoint>,
    model: String,
    key: String,
    source: String,
    namespace: u64,
    text: String,
    max_output_tokens: Option<u32>,
}

fn seen(ok: bool, input: &RoutingInput) -> Seen {
    Seen {
        ok,
        endpoint: input.endpoint(),
        model: input.model().to_owned(),
        key: format!("{:?}", input.key()),
        source: format!("{:?}", input.key_source()),
        namespace: input.namespace().0,
        text: input.text().to_owned(),
        max_output_tokens: input.max_output_tokens(),
    }
}

/// A field as `LenientStr` reads it: a string, an integer's digits, a batch's first such value.
fn lenient_str(value: &Value) -> Option<String> {
    match value {
        Value::String(s) => Some(s.clone()),
        Value::Number(n) if n.is_u64() || n.is_i64() => Some(n.to_string()),
        Value::Array(items) => items.first().and_then(lenient_str),
        _ => None,
    }
}

/// `prompt` / `text`: a string, or a batch's first text (nested batches too).
fn first_text(value: &Value) -> String {
    match value {
        Value::String(s) => s.clone(),
        Value::Array(items) => items.first().map(first_text).unwrap_or_default(),
        _ => String::new(),
    }
}

fn budget(value: Option<&Value>) -> Option<u32> {
    value?.as_u64().and_then(|n| u32::try_from(n).ok())
}

fn check_against_document(endpoint: Endpoint, body: &[u8], ok: bool, input: &RoutingInput) {
    let Ok(Value::Object(doc)) = serde_json::from_slice::<Value>(body) else {
        return;
    };
    let model = doc.get("model");
    if !matches!(model, None | Some(Value::String(_))) {
        return;
    }
    assert!(ok, "a JSON object with a string model was refused");
    assert_eq!(input.model(), model.and_then(Value::as_str).unwrap_or(""));
    let expected_budget = match endpoint {
        Endpoint::ChatCompletions => {
            budget(doc.get("max_completion_tokens")).or_else(|| budget(doc.get("max_tokens")))
        }
        Endpoint::Generate => doc
            .get("sampling_params")
            .and_then(Value::as_object)
            .and_then(|params| budget(params.get("max_new_tokens"))),
        _ => budget(doc.get("max_tokens")),
    };
    assert_eq!(input.max_output_tokens(), expected_budget, "output budget");
    let text_field = match endpoint {
        Endpoint::Completions => Some("prompt"),
        Endpoint::Generate => Some("text"),
        _ => None,
    };
    if let Some(field) = text_field {
        let text = doc.get(field).map(first_text).unwrap_or_default();
        assert_eq!(input.text(), text, "{field}");
    }
    let field = |name| doc.get(name).and_then(lenient_str);
    let (salt, extra, lora_path) = (field("cache_salt"), field("extra_key"), field("lora_path"));
    let lora_id = (endpoint == Endpoint::Generate)
        .then(|| field("lora_id"))
        .flatten();
    let namespace = PartitionFields {
        cache_salt: salt.as_deref(),
        extra_key: extra.as_deref(),
        lora_path: lora_path.as_deref(),
        lora_id: lora_id.as_deref(),
    }
    .namespace();
    assert_eq!(input.namespace(), namespace, "partition namespace");
}

fuzz_target!(|data: &[u8]| {
    let Some((&selector, body)) = data.split_first() else {
        return;
    };
    let endpoint = Endpoint::ALL[usize::from(selector) % Endpoint::COUNT];
    let mut input = RoutingInput::new();
    let ok = extract(endpoint, body, RoutingHeaders::default(), &mut input).is_ok();
    if ok {
        assert!(
            serde_json::from_slice::<serde::de::IgnoredAny>(body).is_ok(),
            "accepted a body that is not one JSON value"
        );
        assert!(input.text().len() <= body.len() && input.model().len() <= body.len());
        if let RoutingKey::Tokens(ids) = input.key() {
            assert!(ids.len() <= body.len());
        }
    }
    check_against_document(endpoint, body, ok, &input);
    let fresh = seen(ok, &input);
    let mut reference = RoutingInput::new();
    let reference_ok =
        extract_reference(endpoint, body, RoutingHeaders::default(), &mut reference).is_ok();
    assert_eq!(
        fresh,
        seen(reference_ok, &reference),
        "the scanner and the reference reader differ"
    );
    let mut shared = RoutingInput::new();
    let shared_ok =
        extract_shared_text(endpoint, body, RoutingHeaders::default(), &mut shared).is_ok();
    assert_eq!(
        fresh,
        seen(shared_ok, &shared),
        "the scanner building a shared text differs"
    );
    let reused = REUSED.with(|reused| {
        let mut reused = reused.borrow_mut();
        let ok = extract(endpoint, body, RoutingHeaders::default(), &mut reused).is_ok();
        seen(ok, &reused)
    });
    assert_eq!(fresh, reused, "a reused input differs from a fresh one");
});
