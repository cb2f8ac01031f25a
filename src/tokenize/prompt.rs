//! The prompt a request's body makes for the engine: a completions prompt as given, or chat
//! messages rendered with the model's template. Chat bodies are read a second time here (the
//! routing extraction keeps no structure), straight into the template's values (no JSON tree in
//! between: one copy of each string) and only the fields a template reads: `messages`, `tools`,
//! `documents`, `add_generation_prompt` and `chat_template_kwargs`.
//!
//! Anthropic Messages bodies are converted to the OpenAI shape first: `system` becomes the first
//! message, text blocks the content, `tool_use` blocks the assistant's `tool_calls`, each
//! `tool_result` block a `tool` message before the rest of its turn, and `tools`' `input_schema`
//! the function's `parameters`. Requests the engines would render differently
//! (`continue_final_message`) are not tokenized: they route on their text.
//!
//! A body of more than [`TOKENIZE_MESSAGES_MAX`] messages is not tokenized either
//! ([`TokenizeError::TooLarge`]): its messages are read up to the cap, the rest skipped unbuilt.

use std::collections::BTreeMap;
use std::fmt;
use std::marker::PhantomData;

use minijinja::value::{Serde, ValueKind};
use minijinja::Value;
use serde::de::{IgnoredAny, SeqAccess, Visitor};
use serde::{Deserialize, Deserializer};
use serde_json::{json, Value as Json};

use super::template::{with_content, ChatInput};
use super::TokenizeError;
use crate::limits::TOKENIZE_MESSAGES_MAX;

/// A body's `messages`, built up to [`TOKENIZE_MESSAGES_MAX`] (anything but a list fails to
/// parse: the body is not one a template reads): template values for a chat body, JSON for an
/// Anthropic one, which is converted first.
#[derive(Debug, Default)]
enum MessageList<T> {
    /// No `messages` field.
    #[default]
    Absent,
    /// Every message.
    Read(Vec<T>),
    /// More than the cap: the rest was skipped without being built.
    TooMany,
}

impl<T> MessageList<T> {
    /// The messages, or why the body is not tokenized (`absent_is_empty`: a missing field is
    /// an empty list rather than a body no template reads).
    fn into_list(self, absent_is_empty: bool) -> Result<Vec<T>, TokenizeError> {
        match self {
            MessageList::Read(list) => Ok(list),
            MessageList::Absent if absent_is_empty => Ok(Vec::new()),
            MessageList::Absent => Err(TokenizeError::Body),
            MessageList::TooMany => Err(TokenizeError::TooLarge("messages")),
        }
    }
}

impl<'de, T: Deserialize<'de>> Deserialize<'de> for MessageList<T> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_seq(MessageListVisitor(PhantomData))
    }
}

struct MessageListVisitor<T>(PhantomData<T>);

impl<'de, T: Deserialize<'de>> Visitor<'de> for MessageListVisitor<T> {
    type Value = MessageList<T>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a list of messages")
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<MessageList<T>, A::Error> {
        let mut list = Vec::new();
        loop {
            if list.len() == TOKENIZE_MESSAGES_MAX {
                let mut more = false;
                while seq.next_element::<IgnoredAny>()?.is_some() {
                    more = true;
                }
                return Ok(if more {
                    MessageList::TooMany
                } else {
                    MessageList::Read(list)
                });
            }
            match seq.next_element::<T>()? {
                Some(message) => list.push(message),
                None => return Ok(MessageList::Read(list)),
            }
        }
    }
}

/// The fields of a chat completions body a template reads, as its values (a JSON `null` is an
/// absent field).
#[derive(Deserialize)]
struct ChatBody {
    #[serde(default)]
    messages: MessageList<Value>,
    #[serde(default)]
    tools: Option<Value>,
    #[serde(default)]
    documents: Option<Value>,
    #[serde(default)]
    add_generation_prompt: Option<bool>,
    #[serde(default)]
    continue_final_message: Option<bool>,
    #[serde(default)]
    chat_template_kwargs: Option<BTreeMap<String, Value>>,
}

/// The chat template's input of a chat completions body.
pub fn chat_input(body: &[u8]) -> Result<ChatInput, TokenizeError> {
    let body: ChatBody = serde_json::from_slice(body).map_err(|_| TokenizeError::Body)?;
    if body.continue_final_message == Some(true) {
        return Err(TokenizeError::Body);
    }
    let messages = body.messages.into_list(false)?;
    // An assistant turn of tool calls has `content: null` (or none): SGLang hands templates ""
    // (Qwen3's calls `content.lstrip` on it), so the agents' loops render.
    let messages = messages.into_iter().map(|message| {
        let has_content = message.kind() != ValueKind::Map
            || message
                .get_attr("content")
                .is_ok_and(|c| !c.is_undefined() && !c.is_none());
        if has_content {
            message
        } else {
            with_content(&message, Value::from(""))
        }
    });
    Ok(ChatInput {
        messages: messages.collect(),
        tools: body.tools,
        documents: body.documents,
        add_generation_prompt: body.add_generation_prompt.unwrap_or(true),
        kwargs: body.chat_template_kwargs.unwrap_or_default(),
    })
}

/// The fields of an Anthropic Messages body a template reads.
#[derive(Deserialize)]
struct MessagesBody {
    #[serde(default)]
    system: Option<Json>,
    #[serde(default)]
    messages: MessageList<Json>,
    #[serde(default)]
    tools: Option<Vec<Json>>,
}

/// The chat template's input of an Anthropic Messages body (see the module documentation).
pub fn messages_input(body: &[u8]) -> Result<ChatInput, TokenizeError> {
    let body: MessagesBody = serde_json::from_slice(body).map_err(|_| TokenizeError::Body)?;
    let listed = body.messages.into_list(true)?;
    let mut messages = Vec::with_capacity(listed.len() + 1);
    if let Some(system) = body.system.as_ref().and_then(block_text) {
        messages.push(json!({"role": "system", "content": system}));
    }
    for message in &listed {
        convert_message(message, &mut messages)?;
    }
    let tools = body.tools.map(|tools| {
        let converted = tools.iter().map(|tool| {
            json!({"type": "function", "function": {
                "name": tool.get("name").cloned().unwrap_or(Json::Null),
                "description": tool.get("description").cloned().unwrap_or(Json::Null),
                "parameters": tool.get("input_schema").cloned().unwrap_or(Json::Null),
            }})
        });
        Json::Array(converted.collect())
    });
    Ok(ChatInput {
        messages: messages.iter().map(|m| Value::from(Serde(m))).collect(),
        tools: tools.as_ref().map(|t| Value::from(Serde(t))),
        documents: None,
        add_generation_prompt: true,
        kwargs: BTreeMap::new(),
    })
}

/// A string, or the text of text blocks joined by `"\n"` (`None` for anything else).
fn block_text(content: &Json) -> Option<String> {
    match content {
        Json::String(text) => Some(text.clone()),
        Json::Array(blocks) => Some(
            blocks
                .iter()
                .filter(|b| b.get("type").and_then(Json::as_str) == Some("text"))
                .filter_map(|b| b.get("text").and_then(Json::as_str))
                .collect::<Vec<_>>()
                .join("\n"),
        ),
        _ => None,
    }
}

fn convert_message(message: &Json, out: &mut Vec<Json>) -> Result<(), TokenizeError> {
    let role = message
        .get("role")
        .and_then(Json::as_str)
        .ok_or(TokenizeError::Body)?;
    let content = message.get("content").ok_or(TokenizeError::Body)?;
    let Some(blocks) = content.as_array() else {
        let text = content.as_str().ok_or(TokenizeError::Body)?;
        out.push(json!({"role": role, "content": text}));
        return Ok(());
    };
    let mut tool_calls = Vec::new();
    for block in blocks {
        match block.get("type").and_then(Json::as_str) {
            Some("tool_use") => {
                let input = block.get("input").cloned().unwrap_or_else(|| json!({}));
                tool_calls.push(json!({
                    "id": block.get("id").cloned().unwrap_or(Json::Null),
                    "type": "function",
                    "function": {
                        "name": block.get("name").cloned().unwrap_or(Json::Null),
                        "arguments": input.to_string(),
                    },
                }));
            }
            Some("tool_result") => {
                let text = block
                    .get("content")
                    .and_then(block_text)
                    .unwrap_or_default();
                out.push(json!({
                    "role": "tool",
                    "tool_call_id": block.get("tool_use_id").cloned().unwrap_or(Json::Null),
                    "content": text,
                }));
            }
            _ => {}
        }
    }
    let text = block_text(content).unwrap_or_default();
    let has_text = blocks
        .iter()
        .any(|b| b.get("type").and_then(Json::as_str) == Some("text"));
    if has_text || !tool_calls.is_empty() {
        let mut converted = json!({"role": role, "content": text});
        if !tool_calls.is_empty() {
            converted["tool_calls"] = Json::Array(tool_calls);
        }
        out.push(converted);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tool_call_turn_without_content_gets_an_empty_string() {
        let body = br#"{"messages":[{"role":"user","content":"hi"},
            {"role":"assistant","content":null,"tool_calls":[{"id":"c","type":"function",
             "function":{"name":"f","arguments":"{}"}}]},
            {"role":"assistant","tool_calls":[]}]}"#;
        let messages = json_of(&chat_input(body).unwrap().messages);
        assert_eq!(messages[1]["content"], "");
        assert_eq!(messages[2]["content"], "");
        assert_eq!(messages[0]["content"], "hi");
        // In place when the key was there, last when it was not (as tojson prints them).
        let keys = |i: usize| {
            messages[i]
                .as_object()
                .unwrap()
                .keys()
                .cloned()
                .collect::<Vec<_>>()
        };
        assert_eq!(keys(1), ["role", "content", "tool_calls"]);
        assert_eq!(keys(2), ["role", "tool_calls", "content"]);
    }

    #[test]
    fn chat_bodies_keep_what_templates_read() {
        let body = br#"{"model":"m","messages":[{"role":"user","content":"hi"}],"stream":true,
            "tools":null,"chat_template_kwargs":{"enable_thinking":false}}"#;
        let input = chat_input(body).unwrap();
        assert_eq!(
            json_of(&input.messages),
            json!([{"role": "user", "content": "hi"}])
        );
        assert!(input.tools.is_none());
        assert!(input.add_generation_prompt);
        assert_eq!(
            input.kwargs.get("enable_thinking"),
            Some(&Value::from(false))
        );
        let no_prompt = br#"{"messages":[],"add_generation_prompt":false}"#;
        assert!(!chat_input(no_prompt).unwrap().add_generation_prompt);
        assert!(chat_input(br#"{"messages":"x"}"#).is_err());
        assert!(chat_input(br#"{"messages":[],"continue_final_message":true}"#).is_err());
    }

    #[test]
    fn anthropic_messages_become_openai_messages() {
        let body = br#"{"model":"m","system":[{"type":"text","text":"be brief"}],
            "tools":[{"name":"get","description":"d","input_schema":{"type":"object"}}],
            "messages":[
              {"role":"user","content":"weather?"},
              {"role":"assistant","content":[{"type":"text","text":"checking"},
                 {"type":"tool_use","id":"t1","name":"get","input":{"city":"Oslo"}}]},
              {"role":"user","content":[{"type":"tool_result","tool_use_id":"t1","content":"rain"},
                 {"type":"text","text":"thanks"}]}]}"#;
        let input = messages_input(body).unwrap();
        let expected = json!([
            {"role": "system", "content": "be brief"},
            {"role": "user", "content": "weather?"},
            {"role": "assistant", "content": "checking", "tool_calls": [{"id": "t1",
                "type": "function", "function": {"name": "get", "arguments": "{\"city\":\"Oslo\"}"}}]},
            {"role": "tool", "tool_call_id": "t1", "content": "rain"},
            {"role": "user", "content": "thanks"},
        ]);
        assert_eq!(json_of(&input.messages), expected);
        let tools = json_of(&input.tools.unwrap());
        assert_eq!(
            tools[0]["function"]["parameters"],
            json!({"type": "object"})
        );
    }

    #[test]
    fn a_chat_past_the_message_cap_is_not_built() {
        let chat = |count: usize| {
            let message = r#"{"role":"user","content":"hi"}"#;
            let list = vec![message; count].join(",");
            format!(r#"{{"model":"m","messages":[{list}],"stream":false}}"#)
        };
        let at_cap = chat_input(chat(TOKENIZE_MESSAGES_MAX).as_bytes()).unwrap();
        assert_eq!(
            input_len(&at_cap),
            TOKENIZE_MESSAGES_MAX,
            "the cap itself is read"
        );
        let past = chat(TOKENIZE_MESSAGES_MAX + 1);
        assert_eq!(
            chat_input(past.as_bytes()).unwrap_err(),
            TokenizeError::TooLarge("messages")
        );
        let anthropic = past.replace(r#""stream":false"#, r#""system":"s""#);
        assert_eq!(
            messages_input(anthropic.as_bytes()).unwrap_err(),
            TokenizeError::TooLarge("messages")
        );
        // Still a body error when the list is malformed after the cap.
        let broken = past.replace("]", "");
        assert_eq!(
            chat_input(broken.as_bytes()).unwrap_err(),
            TokenizeError::Body
        );
        assert_eq!(
            chat_input(br#"{"model":"m"}"#).unwrap_err(),
            TokenizeError::Body
        );
        assert!(messages_input(br#"{"model":"m"}"#).is_ok());
    }

    fn input_len(input: &ChatInput) -> usize {
        input.messages.len().unwrap_or(0)
    }

    /// A template value as JSON, to compare with `json!`.
    fn json_of(value: &Value) -> Json {
        serde_json::to_value(value).expect("a value of JSON")
    }
}
