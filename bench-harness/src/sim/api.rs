//! The HTTP API shapes of the simulated engine: parsing request bodies into [`ParsedRequest`] and
//! rendering SGLang (`/generate`), OpenAI (`/v1/chat/completions`, `/v1/completions`) and
//! Anthropic (`/v1/messages`) responses, whole or as SSE chunks.
//!
//! Parsing errors are [`ApiError`]s: the server answers them with status 400 and an OpenAI-style
//! JSON body `{"error":{"message","type","code"}}`. Token ids are used as given; text goes through
//! the shared tokenizer (`crate::tokenize`). Bodies are deterministic: ids are `sim-<engine>-<n>`,
//! `created` is a constant, and the text is `sim::output` of the prompt's hash.

use std::fmt::Write;

use serde_json::{json, Value};
use xxhash_rust::xxh3::xxh3_64;

use super::output::{output_delta, output_text, prompt_seed};
use crate::tokenize::{chat_prompt_text, messages_prompt_text, tokenize_text};

/// Largest `max_tokens` a request may ask for: bounds one response's length and KV reservation.
pub const MAX_NEW_TOKENS_LIMIT: u32 = 1 << 16;

/// The `created` field of every response (bodies stay deterministic).
const CREATED_UNIX_S: u64 = 1_700_000_000;

/// Which API shape a request uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Endpoint {
    Generate,
    ChatCompletions,
    Completions,
    Messages,
}

/// A body that could not be used; answered with 400.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiError(pub String);

/// What the engine needs from a request body.
#[derive(Debug, Clone, PartialEq)]
pub struct ParsedRequest {
    pub endpoint: Endpoint,
    pub tokens: Vec<u32>,
    /// Requested output length, when the body names one.
    pub max_new_tokens: Option<u32>,
    pub stream: bool,
    /// Cache partition hash; 0 when no partition field is set.
    pub namespace: u64,
    /// The `model` field, if any (echoed back; the engine serves one model).
    pub model: Option<String>,
    /// SGLang's `return_logprob` (on `/generate`): the answer's `meta_info` carries
    /// `input_token_logprobs`.
    pub return_logprob: bool,
}

impl ParsedRequest {
    /// Seed of the deterministic output: a hash of namespace and prompt tokens.
    pub fn output_seed(&self) -> u64 {
        prompt_seed(&self.tokens) ^ self.namespace
    }
}

/// Parses a body for `endpoint`.
pub fn parse_request(endpoint: Endpoint, body: &[u8]) -> Result<ParsedRequest, ApiError> {
    let value: Value = serde_json::from_slice(body)
        .map_err(|error| ApiError(format!("invalid JSON body: {error}")))?;
    if !value.is_object() {
        return Err(ApiError("request body must be a JSON object".into()));
    }
    let tokens = match endpoint {
        Endpoint::Generate => generate_tokens(&value)?,
        Endpoint::ChatCompletions => {
            let messages = value.get("messages").filter(|m| m.is_array());
            let messages =
                messages.ok_or_else(|| ApiError("`messages` must be an array".into()))?;
            tokenize_text(&chat_prompt_text(messages))
        }
        Endpoint::Completions => completion_tokens(value.get("prompt"))?,
        Endpoint::Messages => {
            let messages = value.get("messages").filter(|m| m.is_array());
            let messages =
                messages.ok_or_else(|| ApiError("`messages` must be an array".into()))?;
            tokenize_text(&messages_prompt_text(value.get("system"), messages))
        }
    };
    let max_new_tokens = match endpoint {
        Endpoint::Generate => optional_count(
            value
                .get("sampling_params")
                .and_then(|s| s.get("max_new_tokens")),
        )?,
        _ => match optional_count(value.get("max_completion_tokens"))? {
            Some(count) => Some(count),
            None => optional_count(value.get("max_tokens"))?,
        },
    };
    Ok(ParsedRequest {
        endpoint,
        tokens,
        max_new_tokens,
        stream: value
            .get("stream")
            .and_then(Value::as_bool)
            .unwrap_or(false),
        namespace: namespace_of(&value),
        model: value
            .get("model")
            .and_then(Value::as_str)
            .map(str::to_string),
        return_logprob: endpoint == Endpoint::Generate
            && value.get("return_logprob").and_then(Value::as_bool) == Some(true),
    })
}

/// `/generate`: `input_ids` win over `text`; a batch uses its first sequence.
fn generate_tokens(value: &Value) -> Result<Vec<u32>, ApiError> {
    match value.get("input_ids") {
        Some(Value::Array(items)) if !items.is_empty() => return token_ids(first_sequence(items)),
        Some(Value::Array(_)) | Some(Value::Null) | None => {}
        Some(_) => return Err(ApiError("`input_ids` must be an array of token ids".into())),
    }
    match value.get("text") {
        Some(Value::String(text)) => Ok(tokenize_text(text)),
        Some(Value::Array(items)) => match items.first() {
            Some(Value::String(text)) => Ok(tokenize_text(text)),
            _ => Err(ApiError(
                "`text` must be a string or an array of strings".into(),
            )),
        },
        _ => Err(ApiError("`text` or `input_ids` is required".into())),
    }
}

/// `/v1/completions`: `prompt` as a string, strings, token ids or arrays of token ids.
fn completion_tokens(prompt: Option<&Value>) -> Result<Vec<u32>, ApiError> {
    match prompt {
        Some(Value::String(text)) => Ok(tokenize_text(text)),
        Some(Value::Array(items)) => match items.first() {
            Some(Value::String(text)) => Ok(tokenize_text(text)),
            Some(_) => token_ids(first_sequence(items)),
            None => Ok(Vec::new()),
        },
        _ => Err(ApiError("`prompt` must be a string or an array".into())),
    }
}

fn first_sequence(items: &[Value]) -> &[Value] {
    match items.first() {
        Some(Value::Array(inner)) => inner,
        _ => items,
    }
}

fn token_ids(items: &[Value]) -> Result<Vec<u32>, ApiError> {
    items
        .iter()
        .map(|item| {
            item.as_u64()
                .and_then(|id| u32::try_from(id).ok())
                .ok_or_else(|| ApiError(format!("invalid token id {item}")))
        })
        .collect()
}

fn optional_count(value: Option<&Value>) -> Result<Option<u32>, ApiError> {
    match value {
        None | Some(Value::Null) => Ok(None),
        Some(number) => match number.as_u64() {
            Some(count) if count <= u64::from(MAX_NEW_TOKENS_LIMIT) => Ok(Some(count as u32)),
            _ => Err(ApiError(format!(
                "max tokens must be an integer in 0..={MAX_NEW_TOKENS_LIMIT}, got {number}"
            ))),
        },
    }
}

/// Hash of the cache partition fields (`cache_salt`, `extra_key`, `lora_path` / `lora_id`;
/// empty strings count as unset); 0 when none is set.
pub fn namespace_of(value: &Value) -> u64 {
    let field = |name: &str| -> String {
        match value.get(name) {
            Some(Value::String(text)) => text.clone(),
            Some(Value::Array(items)) => items.first().and_then(Value::as_str).unwrap_or("").into(),
            Some(Value::Number(number)) => number.to_string(),
            _ => String::new(),
        }
    };
    let salt = field("cache_salt");
    let extra = field("extra_key");
    let mut lora = field("lora_path");
    if lora.is_empty() {
        lora = field("lora_id");
    }
    if salt.is_empty() && extra.is_empty() && lora.is_empty() {
        return 0;
    }
    let key = format!("salt={salt}\u{0}extra={extra}\u{0}lora={lora}");
    xxh3_64(key.as_bytes()) | 1
}

/// Everything a response body needs besides the request.
#[derive(Debug, Clone)]
pub struct ResponseContext {
    pub id: String,
    pub model: String,
    pub prompt_tokens: u32,
    pub cached_tokens: u32,
    pub completion_tokens: u32,
    /// Whether generation stopped at the requested `max_tokens` (else: a natural stop).
    pub hit_length_limit: bool,
    /// Simulated seconds from arrival to the last token.
    pub e2e_latency_s: f64,
    pub output_seed: u64,
    /// Prompt tokens whose logprobs `meta_info.input_token_logprobs` lists (`None`: no such
    /// field). A decode engine of a disaggregated pair lists none: the prefill computed them.
    pub input_logprobs: Option<u32>,
}

impl ResponseContext {
    fn openai_usage(&self) -> Value {
        json!({
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "total_tokens": self.prompt_tokens + self.completion_tokens,
            "prompt_tokens_details": {"cached_tokens": self.cached_tokens},
        })
    }

    fn finish_reason(&self) -> &'static str {
        if self.hit_length_limit {
            "length"
        } else {
            "stop"
        }
    }

    fn meta_info(&self, finished: bool) -> Value {
        let finish = if finished {
            json!({"type": self.finish_reason(), "length": self.completion_tokens})
        } else {
            Value::Null
        };
        let mut meta = json!({
            "id": self.id,
            "finish_reason": finish,
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "cached_tokens": self.cached_tokens,
            "e2e_latency": self.e2e_latency_s,
        });
        if let Some(count) = self.input_logprobs {
            // [logprob, token position, text]: deterministic values a merge can be checked by.
            let listed: Vec<Value> = (0..count)
                .map(|i| json!([-f64::from(i + 1) / 100.0, i, null]))
                .collect();
            meta["input_token_logprobs"] = Value::Array(listed);
        }
        meta
    }
}

/// The whole (non-streaming) response body.
pub fn full_body(endpoint: Endpoint, context: &ResponseContext) -> Value {
    let text = output_text(context.output_seed, context.completion_tokens);
    match endpoint {
        Endpoint::Generate => json!({"text": text, "meta_info": context.meta_info(true)}),
        Endpoint::ChatCompletions => json!({
            "id": context.id, "object": "chat.completion", "created": CREATED_UNIX_S,
            "model": context.model,
            "choices": [{"index": 0, "message": {"role": "assistant", "content": text},
                         "logprobs": null, "finish_reason": context.finish_reason()}],
            "usage": context.openai_usage(),
        }),
        Endpoint::Completions => json!({
            "id": context.id, "object": "text_completion", "created": CREATED_UNIX_S,
            "model": context.model,
            "choices": [{"index": 0, "text": text, "logprobs": null,
                         "finish_reason": context.finish_reason()}],
            "usage": context.openai_usage(),
        }),
        Endpoint::Messages => json!({
            "id": context.id, "type": "message", "role": "assistant", "model": context.model,
            "content": [{"type": "text", "text": text}],
            "stop_reason": if context.hit_length_limit { "max_tokens" } else { "end_turn" },
            "stop_sequence": null,
            "usage": anthropic_usage(context),
        }),
    }
}

fn anthropic_usage(context: &ResponseContext) -> Value {
    json!({
        "input_tokens": context.prompt_tokens - context.cached_tokens.min(context.prompt_tokens),
        "cache_read_input_tokens": context.cached_tokens,
        "cache_creation_input_tokens": 0,
        "output_tokens": context.completion_tokens,
    })
}

/// The SSE bytes for output token `context.completion_tokens` (1-based); `finished` adds the
/// closing events (usage, `[DONE]` or `message_stop`).
pub fn stream_chunk(endpoint: Endpoint, context: &ResponseContext, finished: bool) -> String {
    let index = context.completion_tokens.saturating_sub(1);
    let delta = output_delta(context.output_seed, index);
    let finish = if finished {
        json!(context.finish_reason())
    } else {
        Value::Null
    };
    let mut out = String::with_capacity(256);
    match endpoint {
        Endpoint::Generate => {
            let text = output_text(context.output_seed, context.completion_tokens);
            // Vocabulary words need no JSON escaping (checked in `output`'s tests).
            let _ = write!(out, "data: {{\"text\":\"{text}\",\"meta_info\":");
            out.push_str(&context.meta_info(finished).to_string());
            out.push_str(",\"index\":0}\n\n");
        }
        Endpoint::ChatCompletions => {
            let role = if index == 0 {
                "\"role\":\"assistant\","
            } else {
                ""
            };
            push_openai_chunk_head(&mut out, context, "chat.completion.chunk");
            let _ = write!(
                out,
                "\"choices\":[{{\"index\":0,\"delta\":{{{role}\"content\":\"{delta}\"}},\
                 \"logprobs\":null,\"finish_reason\":{finish}}}]}}\n\n"
            );
            if finished {
                push_data(
                    &mut out,
                    &openai_usage_chunk(context, "chat.completion.chunk"),
                );
            }
        }
        Endpoint::Completions => {
            push_openai_chunk_head(&mut out, context, "text_completion");
            let _ = write!(
                out,
                "\"choices\":[{{\"index\":0,\"text\":\"{delta}\",\"logprobs\":null,\
                 \"finish_reason\":{finish}}}]}}\n\n"
            );
            if finished {
                push_data(&mut out, &openai_usage_chunk(context, "text_completion"));
            }
        }
        Endpoint::Messages => return messages_chunk(context, index, &delta, finished),
    }
    if finished {
        out.push_str("data: [DONE]\n\n");
    }
    out
}

/// `data: {"id":..,"object":..,"created":..,"model":..,` written without building a JSON tree:
/// this runs once per streamed token.
fn push_openai_chunk_head(out: &mut String, context: &ResponseContext, object: &str) {
    let id = Value::from(context.id.as_str());
    let model = Value::from(context.model.as_str());
    let _ = write!(
        out,
        "data: {{\"id\":{id},\"object\":\"{object}\",\"created\":{CREATED_UNIX_S},\"model\":{model},"
    );
}

fn openai_usage_chunk(context: &ResponseContext, object: &str) -> Value {
    json!({
        "id": context.id, "object": object, "created": CREATED_UNIX_S, "model": context.model,
        "choices": [], "usage": context.openai_usage(),
    })
}

fn push_data(out: &mut String, value: &Value) {
    out.push_str("data: ");
    out.push_str(&value.to_string());
    out.push_str("\n\n");
}

fn push_event(out: &mut String, event: &str, value: &Value) {
    out.push_str("event: ");
    out.push_str(event);
    out.push('\n');
    push_data(out, value);
}

/// Anthropic's event sequence: `message_start` and `content_block_start` before the first
/// delta; `content_block_stop`, `message_delta` (usage) and `message_stop` after the last.
fn messages_chunk(context: &ResponseContext, index: u32, delta: &str, finished: bool) -> String {
    let mut out = String::new();
    if index == 0 {
        let mut usage = anthropic_usage(context);
        usage["output_tokens"] = json!(0);
        let message = json!({
            "id": context.id, "type": "message", "role": "assistant", "model": context.model,
            "content": [], "stop_reason": null, "stop_sequence": null, "usage": usage,
        });
        push_event(
            &mut out,
            "message_start",
            &json!({"type": "message_start", "message": message}),
        );
        let block = json!({"type": "content_block_start", "index": 0,
                           "content_block": {"type": "text", "text": ""}});
        push_event(&mut out, "content_block_start", &block);
    }
    let delta = json!({"type": "content_block_delta", "index": 0,
                       "delta": {"type": "text_delta", "text": delta}});
    push_event(&mut out, "content_block_delta", &delta);
    if finished {
        push_event(
            &mut out,
            "content_block_stop",
            &json!({"type": "content_block_stop", "index": 0}),
        );
        let stop_reason = if context.hit_length_limit {
            "max_tokens"
        } else {
            "end_turn"
        };
        let message_delta = json!({
            "type": "message_delta",
            "delta": {"stop_reason": stop_reason, "stop_sequence": null},
            "usage": anthropic_usage(context),
        });
        push_event(&mut out, "message_delta", &message_delta);
        push_event(&mut out, "message_stop", &json!({"type": "message_stop"}));
    }
    out
}

/// The JSON error body every non-2xx answer carries.
pub fn error_body(status: u16, kind: &str, message: &str) -> Value {
    json!({"error": {"message": message, "type": kind, "code": status}})
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tokenize::token_id;

    #[test]
    fn generate_prefers_input_ids_and_reads_max_new_tokens() {
        let body = br#"{"text":"a b c","input_ids":[5,6],"sampling_params":{"max_new_tokens":7},"stream":true}"#;
        let parsed = parse_request(Endpoint::Generate, body).unwrap();
        assert_eq!(parsed.tokens, vec![5, 6]);
        assert_eq!(parsed.max_new_tokens, Some(7));
        assert!(parsed.stream);
        let batch = parse_request(Endpoint::Generate, br#"{"input_ids":[[1,2,3],[4]]}"#).unwrap();
        assert_eq!(batch.tokens, vec![1, 2, 3]);
        let text = parse_request(Endpoint::Generate, br#"{"text":"hello world"}"#).unwrap();
        assert_eq!(text.tokens, vec![token_id("hello"), token_id("world")]);
        assert_eq!(text.max_new_tokens, None);
    }

    #[test]
    fn bad_bodies_are_api_errors() {
        for (endpoint, body) in [
            (Endpoint::Generate, &b"{not json"[..]),
            (Endpoint::Generate, b"[1,2]"),
            (Endpoint::Generate, b"{}"),
            (Endpoint::Generate, br#"{"input_ids":[-1]}"#),
            (Endpoint::ChatCompletions, br#"{"messages":"hi"}"#),
            (Endpoint::Completions, br#"{"prompt":5}"#),
            (
                Endpoint::ChatCompletions,
                br#"{"messages":[],"max_tokens":-3}"#,
            ),
            (Endpoint::Messages, br#"{"max_tokens":3}"#),
        ] {
            assert!(
                parse_request(endpoint, body).is_err(),
                "{}",
                String::from_utf8_lossy(body)
            );
        }
    }

    #[test]
    fn chat_and_completions_follow_the_tokenizer_contract() {
        let chat = br#"{"messages":[{"role":"user","content":"one two"},{"role":"user","content":[{"type":"text","text":"three"}]}],"max_tokens":4}"#;
        let parsed = parse_request(Endpoint::ChatCompletions, chat).unwrap();
        assert_eq!(parsed.tokens, tokenize_text("one two three"));
        assert_eq!(parsed.max_new_tokens, Some(4));
        let ids = parse_request(Endpoint::Completions, br#"{"prompt":[9,8,7]}"#).unwrap();
        assert_eq!(ids.tokens, vec![9, 8, 7]);
        let newer = br#"{"messages":[],"max_tokens":4,"max_completion_tokens":2}"#;
        assert_eq!(
            parse_request(Endpoint::ChatCompletions, newer)
                .unwrap()
                .max_new_tokens,
            Some(2)
        );
    }

    #[test]
    fn partition_fields_make_namespaces() {
        let ns = |body: &[u8]| parse_request(Endpoint::Generate, body).unwrap().namespace;
        let plain = ns(br#"{"text":"a"}"#);
        assert_eq!(plain, 0);
        assert_eq!(ns(br#"{"text":"a","cache_salt":""}"#), 0);
        let salt = ns(br#"{"text":"a","cache_salt":"s"}"#);
        let extra = ns(br#"{"text":"a","extra_key":"s"}"#);
        let lora = ns(br#"{"text":"a","lora_path":"s"}"#);
        assert!(salt != 0 && extra != 0 && lora != 0);
        assert!(salt != extra && extra != lora && salt != lora);
        assert_eq!(lora, ns(br#"{"text":"a","lora_id":"s"}"#));
    }

    fn context(completion_tokens: u32) -> ResponseContext {
        ResponseContext {
            id: "sim-0-1".into(),
            model: "m".into(),
            prompt_tokens: 10,
            cached_tokens: 4,
            completion_tokens,
            hit_length_limit: true,
            e2e_latency_s: 0.5,
            output_seed: 3,
            input_logprobs: None,
        }
    }

    #[test]
    fn bodies_carry_usage_with_cached_tokens() {
        let chat = full_body(Endpoint::ChatCompletions, &context(3));
        assert_eq!(chat["usage"]["prompt_tokens_details"]["cached_tokens"], 4);
        assert_eq!(chat["usage"]["completion_tokens"], 3);
        let generate = full_body(Endpoint::Generate, &context(3));
        assert_eq!(generate["meta_info"]["cached_tokens"], 4);
        assert_eq!(generate["text"].as_str().unwrap().split(' ').count(), 3);
        let messages = full_body(Endpoint::Messages, &context(3));
        assert_eq!(messages["usage"]["cache_read_input_tokens"], 4);
        assert_eq!(messages["usage"]["input_tokens"], 6);
    }

    #[test]
    fn streams_end_with_usage_and_done() {
        let last = stream_chunk(Endpoint::ChatCompletions, &context(2), true);
        assert!(last.ends_with("data: [DONE]\n\n"));
        assert!(last.contains("\"cached_tokens\":4"));
        let middle = stream_chunk(Endpoint::Completions, &context(1), false);
        assert!(!middle.contains("[DONE]"));
        let messages = stream_chunk(Endpoint::Messages, &context(1), true);
        assert!(messages.starts_with("event: message_start"));
        assert!(messages.ends_with("data: {\"type\":\"message_stop\"}\n\n"));
    }

    #[test]
    fn every_stream_chunk_is_valid_json() {
        let mut context = context(0);
        context.model = "we\"ird\\model".into();
        for endpoint in [
            Endpoint::Generate,
            Endpoint::ChatCompletions,
            Endpoint::Completions,
            Endpoint::Messages,
        ] {
            let mut streamed = String::new();
            for token in 1..=3 {
                context.completion_tokens = token;
                streamed.push_str(&stream_chunk(endpoint, &context, token == 3));
            }
            let mut text = String::new();
            for line in streamed
                .lines()
                .filter_map(|line| line.strip_prefix("data: "))
            {
                if line == "[DONE]" {
                    continue;
                }
                let value: Value =
                    serde_json::from_str(line).unwrap_or_else(|e| panic!("{e}: {line}"));
                if let Some(model) = value.get("model") {
                    assert_eq!(model, "we\"ird\\model");
                }
                let delta = match endpoint {
                    Endpoint::ChatCompletions => value["choices"][0]["delta"]["content"].as_str(),
                    Endpoint::Completions => value["choices"][0]["text"].as_str(),
                    Endpoint::Messages => value["delta"]["text"].as_str(),
                    Endpoint::Generate => None,
                };
                text.push_str(delta.unwrap_or(""));
            }
            if endpoint != Endpoint::Generate {
                assert_eq!(text, output_text(3, 3), "{endpoint:?}");
            }
        }
    }
}
