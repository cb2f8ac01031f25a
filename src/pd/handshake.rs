//! What the engines' PD handshakes do to a request body and to the answers, as pure functions
//! over bytes and JSON values: the data plane (`http::upstream::pd`) sends and relays, this
//! module decides what. Owns [`RequestShape`] (what of the body the handshake reads: batch
//! size, streaming, logprobs), [`write_bootstrap_body`] (SGLang: the body with
//! `bootstrap_host`, `bootstrap_port` and `bootstrap_room`, one of each per item of a batch),
//! [`merge_input_logprobs`] and [`merge_event_logprobs`] (SGLang: the prefill's input
//! logprobs put ahead of the decode's, as SGLang's router does), and vLLM's two bodies
//! ([`write_vllm_prefill_body`], [`write_vllm_decode_body`], [`kv_transfer_params_of`]).
//!
//! Errors: a body that is not a JSON object, or a prefill answer without what the decode
//! needs, is a [`RewriteError`] saying why; the data plane answers the first 400 and counts the
//! second as the prefill worker's failure.

use serde_json::{Map, Value};

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

/// What the handshake reads of a request body.
#[derive(Clone, Debug, PartialEq)]
pub struct RequestShape {
    /// The body, parsed once (the handshake rewrites it).
    pub body: Map<String, Value>,
    /// Items in a batch request (`None`: one request). SGLang wants one room per item.
    pub batch_size: Option<usize>,
    /// The client asked for a stream of events.
    pub stream: bool,
    /// The client asked for logprobs: the prefill's input logprobs are merged in.
    pub return_logprob: bool,
}

impl RequestShape {
    /// Reads `body` for `endpoint`. A batch is, as the engines read it: on `/generate` a list
    /// of texts or of token-ID lists; on `/v1/completions` a list of prompts (a list of token
    /// IDs is one prompt); on `/v1/chat/completions` `n` above 1 (SMG's rule: the engine
    /// expands the choices into a batch).
    pub fn read(endpoint: Endpoint, body: &[u8]) -> Result<RequestShape, RewriteError> {
        let value: Value =
            serde_json::from_slice(body).map_err(|e| RewriteError::NotAnObject(e.to_string()))?;
        let Value::Object(body) = value else {
            return Err(RewriteError::NotAnObject("not an object".into()));
        };
        let list_len = |field: &str, item_is_list: bool| match body.get(field) {
            Some(Value::Array(items))
                if !items.is_empty() && items.iter().all(|i| i.is_array() == item_is_list) =>
            {
                Some(items.len())
            }
            _ => None,
        };
        let batch_size = match endpoint {
            Endpoint::Generate => list_len("text", false).or_else(|| list_len("input_ids", true)),
            Endpoint::Completions => list_len("prompt", false)
                .filter(|_| !body["prompt"][0].is_number())
                .or_else(|| list_len("prompt", true)),
            Endpoint::ChatCompletions => body
                .get("n")
                .and_then(Value::as_u64)
                .filter(|n| *n > 1)
                .and_then(|n| usize::try_from(n).ok()),
            _ => None,
        };
        let flag = |field: &str| body.get(field).and_then(Value::as_bool).unwrap_or(false);
        let return_logprob = match endpoint {
            Endpoint::Generate => flag("return_logprob"),
            Endpoint::ChatCompletions => flag("logprobs"),
            Endpoint::Completions => body.get("logprobs").is_some_and(|v| !v.is_null()),
            _ => false,
        };
        Ok(RequestShape {
            stream: flag("stream"),
            return_logprob,
            batch_size,
            body,
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

/// Writes into `out` the body both workers get under SGLang's handshake: `shape`'s body with
/// `bootstrap_host`, `bootstrap_port` and `bootstrap_room` set (lists of one per item for a
/// batch, each item its own room). Returns the rooms drawn, first item first.
pub fn write_bootstrap_body(
    shape: &RequestShape,
    bootstrap: Bootstrap<'_>,
    rng: &mut fastrand::Rng,
    out: &mut Vec<u8>,
) -> Vec<u64> {
    let mut body = shape.body.clone();
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
    body.insert("bootstrap_host".into(), host);
    body.insert("bootstrap_port".into(), port);
    body.insert("bootstrap_room".into(), room);
    write_object(&body, out);
    rooms
}

fn write_object(body: &Map<String, Value>, out: &mut Vec<u8>) {
    out.clear();
    // Writing a map of JSON values into a Vec cannot fail.
    let _ = serde_json::to_writer(&mut *out, body);
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

/// The body the prefill worker gets under vLLM's handshake: one output token, no stream, and
/// `kv_transfer_params` asking it to keep the KV cache for a remote decode.
pub fn write_vllm_prefill_body(shape: &RequestShape, out: &mut Vec<u8>) {
    let mut body = shape.body.clone();
    body.insert(
        "kv_transfer_params".into(),
        serde_json::json!({
            "do_remote_decode": true,
            "do_remote_prefill": false,
            "remote_engine_id": null,
            "remote_block_ids": null,
            "remote_host": null,
            "remote_port": null,
        }),
    );
    body.insert("max_tokens".into(), Value::from(1));
    if body.contains_key("max_completion_tokens") {
        body.insert("max_completion_tokens".into(), Value::from(1));
    }
    body.insert("stream".into(), Value::Bool(false));
    body.remove("stream_options");
    write_object(&body, out);
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

/// The body the decode worker gets under vLLM's handshake: the client's, with the
/// `kv_transfer_params` the prefill worker returned.
pub fn write_vllm_decode_body(shape: &RequestShape, params: Value, out: &mut Vec<u8>) {
    let mut body = shape.body.clone();
    body.insert("kv_transfer_params".into(), params);
    write_object(&body, out);
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
        let one = shape(Endpoint::Generate, r#"{"text":"hi","bootstrap_room":5}"#);
        let bootstrap = Bootstrap {
            host: "10.0.0.1",
            port: Some(8998),
        };
        let rooms = write_bootstrap_body(&one, bootstrap, &mut rng, &mut out);
        let body: Value = serde_json::from_slice(&out).unwrap();
        assert_eq!(body["text"], "hi");
        assert_eq!(body["bootstrap_host"], "10.0.0.1");
        assert_eq!(body["bootstrap_port"], 8998);
        assert_eq!(body["bootstrap_room"], rooms[0]);
        assert!(rooms[0] <= i64::MAX as u64);
        let batch = shape(Endpoint::Generate, r#"{"text":["a","b","c"]}"#);
        let no_port = Bootstrap {
            host: "p",
            port: None,
        };
        let rooms = write_bootstrap_body(&batch, no_port, &mut rng, &mut out);
        let body: Value = serde_json::from_slice(&out).unwrap();
        assert_eq!(body["bootstrap_host"], serde_json::json!(["p", "p", "p"]));
        assert_eq!(
            body["bootstrap_port"],
            serde_json::json!([null, null, null])
        );
        assert_eq!(body["bootstrap_room"], serde_json::json!(rooms));
        assert_eq!(rooms.len(), 3);
        assert!(rooms[0] != rooms[1] && rooms[1] != rooms[2]);
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
        let request = shape(
            Endpoint::ChatCompletions,
            r#"{"messages":[],"stream":true,"stream_options":{"include_usage":true},"max_tokens":50}"#,
        );
        let mut out = Vec::new();
        write_vllm_prefill_body(&request, &mut out);
        let prefill: Value = serde_json::from_slice(&out).unwrap();
        assert_eq!(prefill["max_tokens"], 1);
        assert_eq!(prefill["stream"], false);
        assert!(prefill.get("stream_options").is_none());
        assert_eq!(prefill["kv_transfer_params"]["do_remote_decode"], true);
        let answer = br#"{"choices":[],"kv_transfer_params":{"remote_engine_id":"e1","remote_block_ids":[1,2]}}"#;
        let params = kv_transfer_params_of(answer).unwrap();
        write_vllm_decode_body(&request, params, &mut out);
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
