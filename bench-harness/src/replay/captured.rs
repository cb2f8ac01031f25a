//! Captured request logs (`--trace-format openai-log`): one request per line,
//! `{"timestamp_ms": 1712345678901.5, "endpoint": "/v1/chat/completions", "body": {...}}`.
//! [`parse_captured_line`] checks a line into a [`CapturedRequest`] (its [`CapturedEndpoint`] and
//! body) or a [`Skip`]; [`CapturedRequest::write_body`] writes the body back as captured, with the
//! fields the replay's flags override (model, output cap, tenant) replaced.
//!
//! The output cap goes where each API reads its length: chat `max_completion_tokens` and
//! `max_tokens` (each that is present; `max_tokens` when neither is), completions and messages
//! `max_tokens`, `/generate` `sampling_params.max_new_tokens`.

use serde::de::{Deserializer, MapAccess, Visitor};
use serde::Deserialize;
use serde_json::value::RawValue;
use serde_json::Value;

use super::limits::OUTPUT_TOKENS_MAX;
use super::skip::Skip;

/// The endpoints a captured line may name.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CapturedEndpoint {
    ChatCompletions,
    Completions,
    Generate,
    Messages,
}

impl CapturedEndpoint {
    pub const ALL: [Self; 4] = [
        Self::ChatCompletions,
        Self::Completions,
        Self::Generate,
        Self::Messages,
    ];

    /// The request path.
    pub fn path(self) -> &'static str {
        match self {
            Self::ChatCompletions => "/v1/chat/completions",
            Self::Completions => "/v1/completions",
            Self::Generate => "/generate",
            Self::Messages => "/v1/messages",
        }
    }

    /// The endpoint of `path` (a query string or trailing slash is not accepted).
    pub fn from_path(path: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|e| e.path() == path)
    }

    /// The body fields that carry the requested output length.
    fn output_keys(self) -> &'static [&'static str] {
        match self {
            Self::ChatCompletions => &["max_completion_tokens", "max_tokens"],
            Self::Completions | Self::Messages => &["max_tokens"],
            Self::Generate => &[],
        }
    }
}

/// The top-level fields of a body, in their order, each value as the captured JSON text: written
/// back byte for byte, never parsed unless the replay changes it.
#[derive(Clone, Debug, Default)]
pub struct Fields(Vec<(String, Box<RawValue>)>);

impl PartialEq for Fields {
    fn eq(&self, other: &Self) -> bool {
        let texts = |f: &Fields| -> Vec<(String, String)> {
            f.0.iter()
                .map(|(k, v)| (k.clone(), v.get().to_string()))
                .collect()
        };
        texts(self) == texts(other)
    }
}

impl<'de> Deserialize<'de> for Fields {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct FieldsVisitor;
        impl<'de> Visitor<'de> for FieldsVisitor {
            type Value = Fields;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a JSON object")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Fields, A::Error> {
                let mut fields = Vec::new();
                while let Some(field) = map.next_entry::<String, Box<RawValue>>()? {
                    fields.push(field);
                }
                Ok(Fields(fields))
            }
        }
        deserializer.deserialize_map(FieldsVisitor)
    }
}

/// One valid captured request.
#[derive(Clone, Debug, PartialEq)]
pub struct CapturedRequest {
    pub endpoint: CapturedEndpoint,
    body: Fields,
}

/// One valid line: the request and when it arrived.
#[derive(Clone, Debug, PartialEq)]
pub struct CapturedLine {
    pub timestamp_ms: f64,
    pub request: CapturedRequest,
}

#[derive(Deserialize)]
struct RawLine {
    timestamp_ms: f64,
    endpoint: String,
    body: Fields,
}

/// Parses one line of a captured request log.
pub fn parse_captured_line(line: &str) -> Result<CapturedLine, Skip> {
    let raw: RawLine = serde_json::from_str(line)
        .map_err(|e| Skip::malformed(format!("not a captured request: {e}")))?;
    if !raw.timestamp_ms.is_finite() || raw.timestamp_ms < 0.0 {
        let detail = format!("timestamp_ms {} is not a time", raw.timestamp_ms);
        return Err(Skip::out_of_bounds(detail));
    }
    let endpoint = CapturedEndpoint::from_path(&raw.endpoint).ok_or_else(|| {
        let known: Vec<&str> = CapturedEndpoint::ALL.iter().map(|e| e.path()).collect();
        Skip::unsupported(format!(
            "endpoint {:?} is not one of {}",
            raw.endpoint,
            known.join(", ")
        ))
    })?;
    let request = CapturedRequest {
        endpoint,
        body: raw.body,
    };
    request.check_prompt_field()?;
    Ok(CapturedLine {
        timestamp_ms: raw.timestamp_ms,
        request,
    })
}

/// The shape of a (valid) JSON text, from its first bytes.
fn json_kind(raw: &RawValue) -> (u8, bool) {
    let text = raw.get().trim_start();
    let first = text.bytes().next().unwrap_or(b' ');
    let empty = matches!(first, b'[' | b'{') && text[1..].trim_start().len() == 1;
    (first, empty)
}

impl CapturedRequest {
    /// The captured text of field `key`.
    pub fn field(&self, key: &str) -> Option<&RawValue> {
        self.body
            .0
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| &**v)
    }

    /// The body as a JSON value (for tests and inspection; the wire never parses it).
    pub fn body_value(&self) -> Value {
        let mut out = Vec::new();
        self.write_body(&[], &mut out);
        serde_json::from_slice(&out).unwrap_or(Value::Null)
    }

    /// A body without the field its endpoint reads the prompt from would only be a 400.
    fn check_prompt_field(&self) -> Result<(), Skip> {
        let has = |key: &str, kinds: &[u8]| {
            self.field(key).is_some_and(|raw| {
                let (first, empty) = json_kind(raw);
                kinds.contains(&first) && !empty
            })
        };
        let (ok, wanted) = match self.endpoint {
            CapturedEndpoint::ChatCompletions | CapturedEndpoint::Messages => {
                (has("messages", b"["), "a non-empty `messages` array")
            }
            CapturedEndpoint::Completions => (has("prompt", b"\"["), "a `prompt` string or array"),
            CapturedEndpoint::Generate => (
                has("text", b"\"[") || has("input_ids", b"["),
                "`text` or `input_ids`",
            ),
        };
        if ok {
            Ok(())
        } else {
            Err(Skip::malformed(format!(
                "a {} body needs {wanted}",
                self.endpoint.path()
            )))
        }
    }

    fn parsed(&self, key: &str) -> Option<Value> {
        serde_json::from_str(self.field(key)?.get()).ok()
    }

    /// The output length the body asks for, if it names one (at most [`OUTPUT_TOKENS_MAX`]).
    pub fn output_tokens(&self) -> Option<u32> {
        let value = match self.endpoint {
            CapturedEndpoint::Generate => self
                .parsed("sampling_params")?
                .get("max_new_tokens")
                .and_then(Value::as_u64),
            endpoint => endpoint
                .output_keys()
                .iter()
                .find_map(|key| self.parsed(key).and_then(|v| v.as_u64())),
        };
        Some(value?.min(u64::from(OUTPUT_TOKENS_MAX)) as u32)
    }

    /// The fields that cap the output at `cap` tokens: each length field present, lowered to the
    /// cap if above it; the endpoint's main one set to the cap when none is present.
    pub fn output_cap_fields(&self, cap: u32) -> Vec<(&'static str, Value)> {
        let capped = |value: Option<&Value>| {
            let asked = value.and_then(Value::as_u64);
            Value::from(asked.map_or(u64::from(cap), |n| n.min(u64::from(cap))))
        };
        if self.endpoint == CapturedEndpoint::Generate {
            let mut params = match self.parsed("sampling_params") {
                Some(Value::Object(params)) => params,
                _ => serde_json::Map::new(),
            };
            let max_new = capped(params.get("max_new_tokens"));
            params.insert("max_new_tokens".into(), max_new);
            return vec![("sampling_params", Value::Object(params))];
        }
        let keys = self.endpoint.output_keys();
        let present: Vec<(&'static str, Value)> = keys
            .iter()
            .filter_map(|key| Some((*key, self.parsed(key).filter(|v| !v.is_null())?)))
            .map(|(key, value)| (key, capped(Some(&value))))
            .collect();
        if present.is_empty() {
            // The last key is the one every server of the endpoint reads (`max_tokens`).
            let key = keys[keys.len() - 1];
            return vec![(key, Value::from(cap))];
        }
        present
    }

    /// Writes the body as captured, except that each field named in `overrides` takes its value
    /// there, in its place (at the end when the body lacks it).
    pub fn write_body(&self, overrides: &[(&'static str, Value)], out: &mut Vec<u8>) {
        out.push(b'{');
        let mut first = true;
        let mut separate = |out: &mut Vec<u8>, key: &str| {
            if !first {
                out.push(b',');
            }
            first = false;
            // Writing JSON into a Vec cannot fail.
            let _ = serde_json::to_writer(&mut *out, key);
            out.push(b':');
        };
        for (key, raw) in &self.body.0 {
            separate(out, key);
            match overrides.iter().find(|(k, _)| k == key) {
                Some((_, value)) => {
                    let _ = serde_json::to_writer(&mut *out, value);
                }
                None => out.extend_from_slice(raw.get().as_bytes()),
            }
        }
        for (key, value) in overrides {
            if self.field(key).is_none() {
                separate(out, key);
                let _ = serde_json::to_writer(&mut *out, value);
            }
        }
        out.push(b'}');
    }

    /// Makes the prompt new to every cache for pass `pass` (≥ 1) of `--loop`: text prompts start
    /// with the word `loop-<pass>`, token-id prompts with one more id, `pass`. False when the
    /// prompt has no shape that can be marked (an image first, say): it is then sent as it was.
    pub fn mark_pass(&mut self, pass: u64) -> bool {
        let key = match self.endpoint {
            CapturedEndpoint::ChatCompletions | CapturedEndpoint::Messages => "messages",
            CapturedEndpoint::Completions => "prompt",
            CapturedEndpoint::Generate if self.field("input_ids").is_some() => "input_ids",
            CapturedEndpoint::Generate => "text",
        };
        let Some(mut value) = self.parsed(key) else {
            return false;
        };
        let marked = match self.endpoint {
            CapturedEndpoint::ChatCompletions | CapturedEndpoint::Messages => value
                .get_mut(0)
                .and_then(|m| m.get_mut("content"))
                .is_some_and(|content| mark_text_or_ids(content, pass)),
            _ => mark_text_or_ids(&mut value, pass),
        };
        let raw = serde_json::value::to_raw_value(&value);
        let slot = self.body.0.iter_mut().find(|(k, _)| k == key);
        match (marked, raw, slot) {
            (true, Ok(raw), Some((_, slot))) => {
                *slot = raw;
                true
            }
            _ => false,
        }
    }
}

/// Prefixes a string, the first string or text part of an array, or an array of ids (the first
/// sequence of a batch); false when `value` is none of those.
fn mark_text_or_ids(value: &mut Value, pass: u64) -> bool {
    match value {
        Value::String(text) => {
            text.insert_str(0, &format!("loop-{pass} "));
            true
        }
        Value::Array(items) => match items.first() {
            Some(Value::Number(_)) => {
                items.insert(0, Value::from(pass));
                true
            }
            Some(Value::String(_) | Value::Array(_)) => mark_text_or_ids(&mut items[0], pass),
            Some(Value::Object(_)) => items[0]
                .get_mut("text")
                .is_some_and(|text| mark_text_or_ids(text, pass)),
            _ => false,
        },
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::replay::skip::SkipKind;
    use serde_json::json;

    fn line(endpoint: &str, body: Value) -> String {
        json!({"timestamp_ms": 5.0, "endpoint": endpoint, "body": body}).to_string()
    }

    fn request(endpoint: &str, body: Value) -> CapturedRequest {
        parse_captured_line(&line(endpoint, body)).unwrap().request
    }

    fn body_after(request: &CapturedRequest, overrides: &[(&'static str, Value)]) -> Value {
        let mut out = Vec::new();
        request.write_body(overrides, &mut out);
        serde_json::from_slice(&out).unwrap()
    }

    #[test]
    fn bad_lines_are_refused_by_kind() {
        let kind = |text: &str| parse_captured_line(text).unwrap_err().kind;
        assert_eq!(kind("{"), SkipKind::Malformed);
        assert_eq!(
            kind(r#"{"timestamp_ms":1,"endpoint":"/v1/chat/completions","body":[]}"#),
            SkipKind::Malformed
        );
        let chat = json!({"messages": [{"role": "user", "content": "x"}]});
        assert_eq!(
            kind(&line("/v1/embeddings", chat.clone())),
            SkipKind::Unsupported
        );
        assert_eq!(
            kind(&line("/v1/chat/completions", json!({"messages": []}))),
            SkipKind::Malformed
        );
        let negative = json!({"timestamp_ms": -1, "endpoint": "/generate", "body": {"text": "x"}});
        assert_eq!(kind(&negative.to_string()), SkipKind::OutOfBounds);
        let ok = parse_captured_line(&line("/v1/chat/completions", chat)).unwrap();
        assert_eq!(ok.timestamp_ms, 5.0);
        assert_eq!(ok.request.endpoint, CapturedEndpoint::ChatCompletions);
    }

    #[test]
    fn the_output_cap_lowers_each_length_field_or_adds_one() {
        let messages = json!([{"role": "user", "content": "x"}]);
        let chat = |mut body: Value| {
            body["messages"] = messages.clone();
            request("/v1/chat/completions", body)
        };
        let both = chat(json!({"max_tokens": 500, "max_completion_tokens": 8, "model": "m"}));
        assert_eq!(both.output_tokens(), Some(8));
        let capped = body_after(&both, &both.output_cap_fields(16));
        assert_eq!(capped["max_tokens"], 16);
        assert_eq!(capped["max_completion_tokens"], 8);
        assert_eq!(capped["model"], "m");
        let none = chat(json!({"max_tokens": null}));
        assert_eq!(
            body_after(&none, &none.output_cap_fields(16))["max_tokens"],
            16
        );
        let generate = request(
            "/generate",
            json!({"text": "x", "sampling_params": {"temperature": 0, "max_new_tokens": 99}}),
        );
        assert_eq!(generate.output_tokens(), Some(99));
        let capped = body_after(&generate, &generate.output_cap_fields(16));
        assert_eq!(
            capped["sampling_params"],
            json!({"temperature": 0, "max_new_tokens": 16})
        );
    }

    #[test]
    fn a_loop_pass_marks_text_and_ids() {
        let mut chat = parse_captured_line(&line(
            "/v1/chat/completions",
            json!({"messages": [{"role": "system", "content": [{"type": "text", "text": "sys"}]}]}),
        ))
        .unwrap()
        .request;
        assert!(chat.mark_pass(2));
        assert_eq!(
            chat.body_value()["messages"][0]["content"][0]["text"],
            "loop-2 sys"
        );
        let mut ids = parse_captured_line(&line("/generate", json!({"input_ids": [7, 8]})))
            .unwrap()
            .request;
        assert!(ids.mark_pass(3));
        assert_eq!(ids.body_value()["input_ids"], json!([3, 7, 8]));
        let mut batch = parse_captured_line(&line("/v1/completions", json!({"prompt": [[7, 8]]})))
            .unwrap()
            .request;
        assert!(batch.mark_pass(1));
        assert_eq!(batch.body_value()["prompt"], json!([[1, 7, 8]]));
    }
}
