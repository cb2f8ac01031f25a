//! What the engines' PD handshakes do to a request body and to the answers, as pure functions
//! over bytes and JSON values: the data plane (`http::upstream::pd`) sends and relays, this
//! module decides what. Owns [`RequestShape`] (what of the body the handshake reads: batch
//! size, streaming, logprobs), [`write_bootstrap_body`] (SGLang: the body with
//! `bootstrap_host`, `bootstrap_port` and `bootstrap_room`, one of each per item of a batch),
//! [`merge_input_logprobs`] and [`merge_event_logprobs`] (SGLang: the prefill's input
//! logprobs put ahead of the decode's, as SGLang's router does), and vLLM's two bodies
//! ([`write_vllm_prefill_body`], [`write_vllm_decode_body`], [`kv_transfer_params_of`]).
//!
//! The request body is never rebuilt: the shape is read in one pass that copies nothing of the
//! prompt, and the handshake's fields are appended before the body's closing brace. A field the
//! client sent too (its own `bootstrap_room`, `max_tokens`) then appears twice and the last,
//! the gateway's, is the one the engines keep: they read JSON as Python's `json` does.
//!
//! Errors: a body that is not a JSON object, or a prefill answer without what the decode
//! needs, is a [`RewriteError`] saying why; the data plane answers the first 400 and counts the
//! second as the prefill worker's failure.

use std::fmt;

use serde::de::{self, Deserializer, IgnoredAny, SeqAccess, Visitor};
use serde::Deserialize;
use serde_json::Value;

use crate::request::Endpoint;

/// Why a body could not be rewritten for the handshake.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum RewriteError {
    /// The request body is not a JSON object.
    #[error("the request body is not a JSON object: {0}")]
    NotAnObject(String),
    /// The prefill worker's answer lacks `kv_transfer_params` (vLLM).
    #[error("the prefill worker's answer has no kv_transfer_params object")]
    NoTransferParams,
}

/// What the handshake reads of a request body: read in one pass without building a document
/// (the prompt's text is skipped, not copied), since the body itself is forwarded as it is with
/// the handshake's fields appended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RequestShape {
    /// Items in a batch request (`None`: one request). SGLang wants one room per item.
    pub batch_size: Option<usize>,
    /// The client asked for a stream of events.
    pub stream: bool,
    /// The client asked for logprobs: the prefill's input logprobs are merged in.
    pub return_logprob: bool,
    /// The body names `max_completion_tokens` (vLLM's prefill gets it set to 1 too).
    pub max_completion_tokens: bool,
}

/// The fields of a body the shape reads; every other field is skipped.
#[derive(Deserialize)]
struct Fields {
    text: Option<ListShape>,
    input_ids: Option<ListShape>,
    prompt: Option<ListShape>,
    n: Option<IgnoredNumber>,
    stream: Option<IgnoredBool>,
    return_logprob: Option<IgnoredBool>,
    logprobs: Option<Logprobs>,
    max_completion_tokens: Option<IgnoredAny>,
}

/// A field's value as far as batches go: not a list, or a list of `len` items whose first is
/// itself a list (`nested`) or a number.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct ListShape {
    list: bool,
    len: usize,
    nested: bool,
    numbers: bool,
}

/// What an item of a list is.
#[derive(Clone, Copy, PartialEq, Eq)]
enum ItemKind {
    List,
    Number,
    Other,
}

impl<'de> Deserialize<'de> for ListShape {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct ShapeVisitor;
        impl<'de> Visitor<'de> for ShapeVisitor {
            type Value = ListShape;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("any JSON value")
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<ListShape, A::Error> {
                let mut shape = ListShape {
                    list: true,
                    ..ListShape::default()
                };
                while let Some(kind) = seq.next_element::<ItemKind>()? {
                    if shape.len == 0 {
                        shape.nested = kind == ItemKind::List;
                        shape.numbers = kind == ItemKind::Number;
                    }
                    shape.len += 1;
                }
                Ok(shape)
            }
            fn visit_str<E: de::Error>(self, _: &str) -> Result<ListShape, E> {
                Ok(ListShape::default())
            }
            fn visit_bool<E: de::Error>(self, _: bool) -> Result<ListShape, E> {
                Ok(ListShape::default())
            }
            fn visit_i64<E: de::Error>(self, _: i64) -> Result<ListShape, E> {
                Ok(ListShape::default())
            }
            fn visit_u64<E: de::Error>(self, _: u64) -> Result<ListShape, E> {
                Ok(ListShape::default())
            }
            fn visit_f64<E: de::Error>(self, _: f64) -> Result<ListShape, E> {
                Ok(ListShape::default())
            }
            fn visit_unit<E: de::Error>(self) -> Result<ListShape, E> {
                Ok(ListShape::default())
            }
            fn visit_map<A: de::MapAccess<'de>>(self, mut map: A) -> Result<ListShape, A::Error> {
                while map.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {}
                Ok(ListShape::default())
            }
        }
        deserializer.deserialize_any(ShapeVisitor)
    }
}

impl<'de> Deserialize<'de> for ItemKind {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct KindVisitor;
        impl<'de> Visitor<'de> for KindVisitor {
            type Value = ItemKind;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("any JSON value")
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<ItemKind, A::Error> {
                while seq.next_element::<IgnoredAny>()?.is_some() {}
                Ok(ItemKind::List)
            }
            fn visit_i64<E: de::Error>(self, _: i64) -> Result<ItemKind, E> {
                Ok(ItemKind::Number)
            }
            fn visit_u64<E: de::Error>(self, _: u64) -> Result<ItemKind, E> {
                Ok(ItemKind::Number)
            }
            fn visit_f64<E: de::Error>(self, _: f64) -> Result<ItemKind, E> {
                Ok(ItemKind::Number)
            }
            fn visit_str<E: de::Error>(self, _: &str) -> Result<ItemKind, E> {
                Ok(ItemKind::Other)
            }
            fn visit_bool<E: de::Error>(self, _: bool) -> Result<ItemKind, E> {
                Ok(ItemKind::Other)
            }
            fn visit_unit<E: de::Error>(self) -> Result<ItemKind, E> {
                Ok(ItemKind::Other)
            }
            fn visit_map<A: de::MapAccess<'de>>(self, mut map: A) -> Result<ItemKind, A::Error> {
                while map.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {}
                Ok(ItemKind::Other)
            }
        }
        deserializer.deserialize_any(KindVisitor)
    }
}

/// A field read as a number when it is one (anything else: `None`).
#[derive(Clone, Copy)]
struct IgnoredNumber(Option<u64>);

impl<'de> Deserialize<'de> for IgnoredNumber {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let value = Value::deserialize(deserializer)?;
        Ok(IgnoredNumber(value.as_u64()))
    }
}

/// A field read as a boolean when it is one (anything else: false).
#[derive(Clone, Copy)]
struct IgnoredBool(bool);

impl<'de> Deserialize<'de> for IgnoredBool {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let value = Value::deserialize(deserializer)?;
        Ok(IgnoredBool(value.as_bool() == Some(true)))
    }
}

/// `logprobs`: `true` on chat, a number on completions; `null` or `false` asks for none.
#[derive(Clone, Copy)]
struct Logprobs(bool);

impl<'de> Deserialize<'de> for Logprobs {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let value = Value::deserialize(deserializer)?;
        Ok(Logprobs(!value.is_null() && value != Value::Bool(false)))
    }
}

impl RequestShape {
    /// Reads `body` for `endpoint`. A batch is, as the engines read it: on `/generate` a list
    /// of texts or of token-ID lists; on `/v1/completions` a list of prompts (a list of token
    /// IDs is one prompt); on `/v1/chat/completions` `n` above 1 (SMG's rule: the engine
    /// expands the choices into a batch).
    pub fn read(endpoint: Endpoint, body: &[u8]) -> Result<RequestShape, RewriteError> {
        let fields: Fields =
            serde_json::from_slice(body).map_err(|e| RewriteError::NotAnObject(e.to_string()))?;
        let batch = |shape: Option<ListShape>, nested: bool| {
            shape
                .filter(|s| s.list && s.len > 0 && s.nested == nested && (nested || !s.numbers))
                .map(|s| s.len)
        };
        let batch_size = match endpoint {
            Endpoint::Generate => batch(fields.text, false).or(batch(fields.input_ids, true)),
            Endpoint::Completions => batch(fields.prompt, false).or(batch(fields.prompt, true)),
            Endpoint::ChatCompletions => (fields.n)
                .and_then(|n| n.0)
                .filter(|n| *n > 1)
                .and_then(|n| usize::try_from(n).ok()),
            _ => None,
        };
        let flag = |field: Option<IgnoredBool>| field.is_some_and(|f| f.0);
        let return_logprob = match endpoint {
            Endpoint::Generate => flag(fields.return_logprob),
            Endpoint::ChatCompletions | Endpoint::Completions => {
                fields.logprobs.is_some_and(|l| l.0)
            }
            _ => false,
        };
        Ok(RequestShape {
            stream: flag(fields.stream),
            return_logprob,
            batch_size,
            max_completion_tokens: fields.max_completion_tokens.is_some(),
        })
    }
}

/// The prefill worker's side of SGLang's bootstrap: where the decode worker meets it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Bootstrap<'a> {
    /// The prefill worker's host, as its URL names it.
    pub host: &'a str,
    /// Its bootstrap server's port (`None`: sent as `null`, the engine's default).
    pub port: Option<u16>,
}

/// A bootstrap room: a random number in `[0, 2^63)`, as SGLang's router draws it.
pub fn draw_room(rng: &mut fastrand::Rng) -> u64 {
    rng.u64(..) & (i64::MAX as u64)
}

/// Writes into `out` the client's `body` (a JSON object, as `RequestShape::read` found it)
/// with `fields` appended before its closing brace. A field the client sent too appears twice;
/// the engines read JSON as Python does, and the last occurrence wins: the gateway's.
fn write_with_fields(body: &[u8], fields: impl FnOnce(&mut Vec<u8>), out: &mut Vec<u8>) {
    out.clear();
    let end = body.iter().rposition(|b| *b == b'}').unwrap_or(body.len());
    let inner = body[..end].iter().rposition(|b| !b.is_ascii_whitespace());
    out.extend_from_slice(&body[..end]);
    // `{` alone before the brace: an empty object takes no comma.
    if inner.is_some_and(|i| body[i] != b'{') {
        out.push(b',');
    }
    fields(out);
    out.push(b'}');
}

/// Appends `"name":value` (with a comma before it unless it is the first).
fn push_field(out: &mut Vec<u8>, first: bool, name: &str, value: &Value) {
    if !first {
        out.push(b',');
    }
    // Writing JSON strings and values into a Vec cannot fail.
    let _ = serde_json::to_writer(&mut *out, name);
    out.push(b':');
    let _ = serde_json::to_writer(&mut *out, value);
}

/// Writes into `out` the body both workers get under SGLang's handshake: the client's `body`
/// with `bootstrap_host`, `bootstrap_port` and `bootstrap_room` (lists of one per item for a
/// batch, each item its own room). Returns the rooms drawn, first item first.
pub fn write_bootstrap_body(
    body: &[u8],
    shape: &RequestShape,
    bootstrap: Bootstrap<'_>,
    rng: &mut fastrand::Rng,
    out: &mut Vec<u8>,
) -> Vec<u64> {
    let port = bootstrap.port.map_or(Value::Null, Value::from);
    let rooms: Vec<u64> = (0..shape.batch_size.unwrap_or(1))
        .map(|_| draw_room(rng))
        .collect();
    let (host, port, room) = match shape.batch_size {
        None => (Value::from(bootstrap.host), port, Value::from(rooms[0])),
        Some(n) => (
            Value::Array(vec![Value::from(bootstrap.host); n]),
            Value::Array(vec![port; n]),
            Value::Array(rooms.iter().map(|r| Value::from(*r)).collect()),
        ),
    };
    write_with_fields(
        body,
        |out| {
            push_field(out, true, "bootstrap_host", &host);
            push_field(out, false, "bootstrap_port", &port);
            push_field(out, false, "bootstrap_room", &room);
        },
        out,
    );
    rooms
}

/// Puts the prefill answer's `meta_info.input_token_logprobs` ahead of the decode answer's
/// (SGLang's router: the prefill worker computed the prompt's logprobs, the decode worker only
/// the rest). A batch answer (a list) is merged item by item. Returns whether anything was
/// merged.
pub fn merge_input_logprobs(prefill: &Value, decode: &mut Value) -> bool {
    match (prefill, decode) {
        (Value::Array(prefills), Value::Array(decodes)) => {
            let mut merged = false;
            for (p, d) in prefills.iter().zip(decodes.iter_mut()) {
                merged |= merge_input_logprobs(p, d);
            }
            merged
        }
        (prefill, decode) => {
            let from = prefill.pointer("/meta_info/input_token_logprobs");
            let to = decode.pointer_mut("/meta_info/input_token_logprobs");
            match (from, to) {
                (Some(Value::Array(from)), Some(Value::Array(to))) => {
                    let tail = std::mem::take(to);
                    to.reserve(from.len() + tail.len());
                    to.extend(from.iter().cloned());
                    to.extend(tail);
                    true
                }
                _ => false,
            }
        }
    }
}

/// The prefill's input logprobs merged into one SSE event's `data:` payload (`data` without
/// the `data: ` prefix); `None` when the event carries none to merge into (`[DONE]`, not
/// JSON): it is then relayed unchanged.
pub fn merge_event_logprobs(prefill: &Value, data: &[u8]) -> Option<Vec<u8>> {
    let mut event: Value = serde_json::from_slice(data).ok()?;
    if !merge_input_logprobs(prefill, &mut event) {
        return None;
    }
    serde_json::to_vec(&event).ok()
}

/// The body the prefill worker gets under vLLM's handshake: the client's `body` with one
/// output token, no stream and `kv_transfer_params` asking it to keep the KV cache for a remote
/// decode.
pub fn write_vllm_prefill_body(body: &[u8], shape: &RequestShape, out: &mut Vec<u8>) {
    let params = serde_json::json!({
        "do_remote_decode": true,
        "do_remote_prefill": false,
        "remote_engine_id": null,
        "remote_block_ids": null,
        "remote_host": null,
        "remote_port": null,
    });
    write_with_fields(
        body,
        |out| {
            push_field(out, true, "kv_transfer_params", &params);
            push_field(out, false, "max_tokens", &Value::from(1));
            if shape.max_completion_tokens {
                push_field(out, false, "max_completion_tokens", &Value::from(1));
            }
            push_field(out, false, "stream", &Value::Bool(false));
            push_field(out, false, "stream_options", &Value::Null);
        },
        out,
    );
}

/// The `kv_transfer_params` object of the prefill worker's answer (vLLM).
pub fn kv_transfer_params_of(prefill_answer: &[u8]) -> Result<Value, RewriteError> {
    let answer: Value =
        serde_json::from_slice(prefill_answer).map_err(|_| RewriteError::NoTransferParams)?;
    match answer.get("kv_transfer_params") {
        Some(params @ Value::Object(_)) => Ok(params.clone()),
        _ => Err(RewriteError::NoTransferParams),
    }
}

/// The body the decode worker gets under vLLM's handshake: the client's `body`, with the
/// `kv_transfer_params` the prefill worker returned.
pub fn write_vllm_decode_body(body: &[u8], params: Value, out: &mut Vec<u8>) {
    write_with_fields(
        body,
        |out| push_field(out, true, "kv_transfer_params", &params),
        out,
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shape(endpoint: Endpoint, body: &str) -> RequestShape {
        RequestShape::read(endpoint, body.as_bytes()).unwrap()
    }

    #[test]
    fn batches_are_read_as_the_engines_read_them() {
        let batch = |endpoint, body| shape(endpoint, body).batch_size;
        assert_eq!(batch(Endpoint::Generate, r#"{"text":"a"}"#), None);
        assert_eq!(batch(Endpoint::Generate, r#"{"text":["a","b"]}"#), Some(2));
        assert_eq!(batch(Endpoint::Generate, r#"{"input_ids":[1,2,3]}"#), None);
        assert_eq!(
            batch(Endpoint::Generate, r#"{"input_ids":[[1],[2],[3]]}"#),
            Some(3)
        );
        assert_eq!(batch(Endpoint::Completions, r#"{"prompt":"a"}"#), None);
        assert_eq!(batch(Endpoint::Completions, r#"{"prompt":[1,2]}"#), None);
        assert_eq!(
            batch(Endpoint::Completions, r#"{"prompt":["a","b"]}"#),
            Some(2)
        );
        assert_eq!(
            batch(Endpoint::Completions, r#"{"prompt":[[1],[2]]}"#),
            Some(2)
        );
        assert_eq!(batch(Endpoint::ChatCompletions, r#"{"n":1}"#), None);
        assert_eq!(batch(Endpoint::ChatCompletions, r#"{"n":4}"#), Some(4));
        assert!(RequestShape::read(Endpoint::Generate, b"[1]").is_err());
        assert!(RequestShape::read(Endpoint::Generate, b"{").is_err());
        let flags = shape(
            Endpoint::Generate,
            r#"{"stream":true,"return_logprob":true}"#,
        );
        assert!(flags.stream && flags.return_logprob);
        assert!(shape(Endpoint::Completions, r#"{"logprobs":2}"#).return_logprob);
        assert!(!shape(Endpoint::Completions, r#"{"logprobs":null}"#).return_logprob);
    }

    #[test]
    fn bootstrap_fields_are_added_once_or_per_item_with_distinct_rooms() {
        let mut rng = fastrand::Rng::with_seed(7);
        let mut out = Vec::new();
        let one_body = r#"{"text":"hi","bootstrap_room":5}"#;
        let one = shape(Endpoint::Generate, one_body);
        let bootstrap = Bootstrap {
            host: "10.0.0.1",
            port: Some(8998),
        };
        let rooms = write_bootstrap_body(one_body.as_bytes(), &one, bootstrap, &mut rng, &mut out);
        // The client's own bootstrap_room stays in the text; the gateway's, last, is the one
        // a JSON reader keeps (Python's, the engines', as serde_json's).
        let body: Value = serde_json::from_slice(&out).unwrap();
        assert_eq!(body["text"], "hi");
        assert_eq!(body["bootstrap_host"], "10.0.0.1");
        assert_eq!(body["bootstrap_port"], 8998);
        assert_eq!(body["bootstrap_room"], rooms[0]);
        assert!(rooms[0] <= i64::MAX as u64);
        let batch_body = r#" { "text" : ["a","b","c"] }  "#;
        let batch = shape(Endpoint::Generate, batch_body);
        let no_port = Bootstrap {
            host: "p",
            port: None,
        };
        let rooms =
            write_bootstrap_body(batch_body.as_bytes(), &batch, no_port, &mut rng, &mut out);
        let body: Value = serde_json::from_slice(&out).unwrap();
        assert_eq!(body["bootstrap_host"], serde_json::json!(["p", "p", "p"]));
        assert_eq!(
            body["bootstrap_port"],
            serde_json::json!([null, null, null])
        );
        assert_eq!(body["bootstrap_room"], serde_json::json!(rooms));
        assert_eq!(rooms.len(), 3);
        assert!(rooms[0] != rooms[1] && rooms[1] != rooms[2]);
        // An empty object takes the fields without a comma.
        let empty = shape(Endpoint::Generate, "{ }");
        write_bootstrap_body(b"{ }", &empty, no_port, &mut rng, &mut out);
        let body: Value = serde_json::from_slice(&out).unwrap();
        assert_eq!(body["bootstrap_host"], "p");
    }

    #[test]
    fn input_logprobs_of_the_prefill_come_first() {
        let prefill =
            serde_json::json!({"meta_info": {"input_token_logprobs": [[-1.0, 1], [-2.0, 2]]}});
        let mut decode =
            serde_json::json!({"text": "x", "meta_info": {"input_token_logprobs": [[-3.0, 3]]}});
        assert!(merge_input_logprobs(&prefill, &mut decode));
        assert_eq!(
            decode["meta_info"]["input_token_logprobs"],
            serde_json::json!([[-1.0, 1], [-2.0, 2], [-3.0, 3]])
        );
        let mut batch = serde_json::json!([{"meta_info": {"input_token_logprobs": []}}]);
        assert!(merge_input_logprobs(
            &serde_json::json!([prefill.clone()]),
            &mut batch
        ));
        assert_eq!(batch[0]["meta_info"]["input_token_logprobs"][1][1], 2);
        let mut none = serde_json::json!({"text": "x"});
        assert!(!merge_input_logprobs(&prefill, &mut none));
        let event = br#"{"text":"x","meta_info":{"input_token_logprobs":[]}}"#;
        let merged = merge_event_logprobs(&prefill, event).unwrap();
        let merged: Value = serde_json::from_slice(&merged).unwrap();
        assert_eq!(merged["meta_info"]["input_token_logprobs"][0][1], 1);
        assert_eq!(merge_event_logprobs(&prefill, b"[DONE]"), None);
    }

    #[test]
    fn vllm_bodies_ask_for_a_remote_decode_then_pass_its_params_on() {
        let client = r#"{"messages":[],"stream":true,"stream_options":{"include_usage":true},"max_tokens":50}"#;
        let request = shape(Endpoint::ChatCompletions, client);
        let mut out = Vec::new();
        write_vllm_prefill_body(client.as_bytes(), &request, &mut out);
        let prefill: Value = serde_json::from_slice(&out).unwrap();
        assert_eq!(prefill["max_tokens"], 1);
        assert_eq!(prefill["stream"], false);
        assert_eq!(prefill["stream_options"], Value::Null);
        assert!(prefill.get("max_completion_tokens").is_none());
        assert_eq!(prefill["kv_transfer_params"]["do_remote_decode"], true);
        let answer = br#"{"choices":[],"kv_transfer_params":{"remote_engine_id":"e1","remote_block_ids":[1,2]}}"#;
        let params = kv_transfer_params_of(answer).unwrap();
        write_vllm_decode_body(client.as_bytes(), params, &mut out);
        let decode: Value = serde_json::from_slice(&out).unwrap();
        assert_eq!(decode["max_tokens"], 50);
        assert_eq!(decode["stream"], true);
        assert_eq!(decode["kv_transfer_params"]["remote_engine_id"], "e1");
        assert_eq!(
            kv_transfer_params_of(br#"{"choices":[]}"#),
            Err(RewriteError::NoTransferParams)
        );
    }
}
