//! OpenAI's response shapes: `chat.completion.chunk` and `text_completion` server-sent events,
//! and the non-streamed `chat.completion` and `text_completion` bodies, with `usage`
//! (`prompt_tokens_details.cached_tokens`) and logprobs in OpenAI's shape.
//!
//! The stream's framing follows SMG's gRPC router (and SGLang's OpenAI server, which it
//! mirrors): a chunk with the assistant role opens each choice, each content chunk carries
//! `role`, `content` and `reasoning_content: null`, `logprobs` and `finish_reason` are always
//! present (null until set), a choice's last chunk has an empty delta with its `finish_reason`
//! and SGLang's `matched_stop` (absent when none), the usage chunk has no choices, and the
//! stream ends with `data: [DONE]`. Completions chunks follow SMG's field order (`choices`
//! before `model`; each choice `text`, `index`, `logprobs` only when asked, `finish_reason`,
//! no `matched_stop`). One difference, on purpose: a step whose text is held back
//! (an incomplete character, a possible stop's beginning) but which carries logprobs is written
//! with empty content, where SMG drops the chunk and its logprobs with it.

use super::json::{push_escaped, push_f32, push_str, push_u64};
use super::output::{Finish, ResponseMeta, TokenLogprob, Usage};
use crate::tokenize::{DecodeTable, MatchedStop};

/// The fields around a response's choices, rendered once per response: chat chunks and bodies
/// put `model` before `choices`; SMG's `text_completion` chunks put it after.
#[derive(Debug)]
pub(super) struct Frame {
    /// `{"id":...,"object":...,"created":...[,"model":...],"choices":[`.
    head: Vec<u8>,
    /// `,"model":...` when it follows the choices, else empty.
    after_choices: Vec<u8>,
}

/// Where a frame puts `model`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum ModelField {
    /// Before `choices` (chat chunks, every body).
    First,
    /// After `choices` (completions chunks).
    Last,
}

impl Frame {
    pub(super) fn new(meta: &ResponseMeta, object: &str, model: ModelField) -> Frame {
        let mut head = Vec::with_capacity(96 + meta.id.len() + meta.model.len());
        head.extend_from_slice(b"{\"id\":");
        push_str(&mut head, &meta.id);
        head.extend_from_slice(b",\"object\":");
        push_str(&mut head, object);
        head.extend_from_slice(b",\"created\":");
        push_u64(&mut head, meta.created);
        let mut model_field = Vec::with_capacity(12 + meta.model.len());
        model_field.extend_from_slice(b",\"model\":");
        push_str(&mut model_field, &meta.model);
        let after_choices = match model {
            ModelField::First => {
                head.extend_from_slice(&model_field);
                Vec::new()
            }
            ModelField::Last => model_field,
        };
        head.extend_from_slice(b",\"choices\":[");
        Frame {
            head,
            after_choices,
        }
    }

    /// Opens an event (or a body, without `data: `) up to its first choice.
    pub(super) fn open(&self, out: &mut Vec<u8>, event: bool) {
        if event {
            out.extend_from_slice(b"data: ");
        }
        out.extend_from_slice(&self.head);
    }

    /// Closes the choices and what follows them, up to the object's closing brace (excluded).
    pub(super) fn close_choices(&self, out: &mut Vec<u8>) {
        out.push(b']');
        out.extend_from_slice(&self.after_choices);
    }

    /// Closes an event.
    pub(super) fn close_event(&self, out: &mut Vec<u8>) {
        self.close_choices(out);
        out.extend_from_slice(b"}\n\n");
    }
}

/// The chat stream's chunk that opens choice `index`.
pub(super) fn chat_role_chunk(out: &mut Vec<u8>, frame: &Frame, index: u32) {
    frame.open(out, true);
    out.extend_from_slice(b"{\"index\":");
    push_u64(out, u64::from(index));
    out.extend_from_slice(
        b",\"delta\":{\"role\":\"assistant\",\"reasoning_content\":null},\"logprobs\":null,\"finish_reason\":null}",
    );
    frame.close_event(out);
}

/// A chat content chunk.
pub(super) fn chat_content_chunk(
    out: &mut Vec<u8>,
    frame: &Frame,
    index: u32,
    text: &str,
    logprobs: Option<(&[TokenLogprob], &DecodeTable)>,
) {
    frame.open(out, true);
    out.extend_from_slice(b"{\"index\":");
    push_u64(out, u64::from(index));
    out.extend_from_slice(b",\"delta\":{\"role\":\"assistant\",\"content\":\"");
    push_escaped(out, text.as_bytes());
    out.extend_from_slice(b"\",\"reasoning_content\":null},\"logprobs\":");
    match logprobs {
        Some((logprobs, table)) => chat_logprobs(out, logprobs, table),
        None => out.extend_from_slice(b"null"),
    }
    out.extend_from_slice(b",\"finish_reason\":null}");
    frame.close_event(out);
}

/// A chat choice's last chunk: its finish reason.
pub(super) fn chat_finish_chunk(
    out: &mut Vec<u8>,
    frame: &Frame,
    index: u32,
    finish: &Finish,
    stops: &[String],
) {
    frame.open(out, true);
    out.extend_from_slice(b"{\"index\":");
    push_u64(out, u64::from(index));
    out.extend_from_slice(
        b",\"delta\":{\"reasoning_content\":null},\"logprobs\":null,\"finish_reason\":",
    );
    push_str(out, finish.reason.as_str());
    push_matched_stop(out, finish.matched.as_ref(), stops);
    out.push(b'}');
    frame.close_event(out);
}

/// One completions chunk's content.
pub(super) struct Chunk<'a> {
    pub index: u32,
    pub text: &'a str,
    pub logprobs: Option<(&'a [TokenLogprob], &'a DecodeTable)>,
    /// The choice's text length before this chunk (logprobs' `text_offset`).
    pub text_offset: usize,
}

/// A completions chunk: its text, and its finish reason when the choice ends.
pub(super) fn completion_chunk(
    out: &mut Vec<u8>,
    frame: &Frame,
    chunk: &Chunk<'_>,
    finish: Option<&Finish>,
) {
    frame.open(out, true);
    out.extend_from_slice(b"{\"text\":\"");
    push_escaped(out, chunk.text.as_bytes());
    out.extend_from_slice(b"\",\"index\":");
    push_u64(out, u64::from(chunk.index));
    if let Some((logprobs, table)) = chunk.logprobs {
        out.extend_from_slice(b",\"logprobs\":");
        completion_logprobs(out, logprobs, table, chunk.text_offset);
    }
    out.extend_from_slice(b",\"finish_reason\":");
    match finish {
        Some(finish) => push_str(out, finish.reason.as_str()),
        None => out.extend_from_slice(b"null"),
    }
    out.push(b'}');
    frame.close_event(out);
}

/// The usage chunk (`stream_options.include_usage`): no choices.
pub(super) fn usage_chunk(out: &mut Vec<u8>, frame: &Frame, usage: &Usage) {
    frame.open(out, true);
    frame.close_choices(out);
    out.extend_from_slice(b",\"usage\":");
    push_usage(out, usage);
    out.extend_from_slice(b"}\n\n");
}

/// The stream's last event.
pub(super) const DONE: &[u8] = b"data: [DONE]\n\n";

/// `,"matched_stop":...` (SGLang's extension): the stop string, or the stop token's ID.
pub(super) fn push_matched_stop(
    out: &mut Vec<u8>,
    matched: Option<&MatchedStop>,
    stops: &[String],
) {
    match matched {
        Some(MatchedStop::Text(i)) => {
            out.extend_from_slice(b",\"matched_stop\":");
            match stops.get(*i) {
                Some(stop) => push_str(out, stop),
                None => out.extend_from_slice(b"null"),
            }
        }
        Some(MatchedStop::Token(id)) => {
            out.extend_from_slice(b",\"matched_stop\":");
            push_u64(out, u64::from(*id));
        }
        None => {}
    }
}

/// OpenAI's `usage` object.
pub(super) fn push_usage(out: &mut Vec<u8>, usage: &Usage) {
    out.extend_from_slice(b"{\"prompt_tokens\":");
    push_u64(out, u64::from(usage.prompt_tokens));
    out.extend_from_slice(b",\"completion_tokens\":");
    push_u64(out, u64::from(usage.completion_tokens));
    out.extend_from_slice(b",\"total_tokens\":");
    push_u64(
        out,
        u64::from(usage.prompt_tokens) + u64::from(usage.completion_tokens),
    );
    out.extend_from_slice(b",\"prompt_tokens_details\":{\"cached_tokens\":");
    push_u64(out, u64::from(usage.cached_tokens));
    out.extend_from_slice(b"}}");
}

/// A token's text as logprobs show it (lossy UTF-8 of its bytes) and its bytes.
fn push_token(out: &mut Vec<u8>, table: &DecodeTable, id: u32) {
    let bytes = table.token_bytes(id);
    out.extend_from_slice(b"\"token\":");
    push_str(out, &String::from_utf8_lossy(&bytes));
    out.extend_from_slice(b",\"bytes\":[");
    for (i, b) in bytes.iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        push_u64(out, u64::from(*b));
    }
    out.push(b']');
}

/// Chat's `logprobs`: `{"content":[{"token","logprob","bytes","top_logprobs":[...]}]}`.
pub(super) fn chat_logprobs(out: &mut Vec<u8>, logprobs: &[TokenLogprob], table: &DecodeTable) {
    out.extend_from_slice(b"{\"content\":[");
    for (i, position) in logprobs.iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        out.push(b'{');
        push_token(out, table, position.token_id);
        out.extend_from_slice(b",\"logprob\":");
        push_f32(out, position.logprob);
        out.extend_from_slice(b",\"top_logprobs\":[");
        for (j, top) in position.top.iter().enumerate() {
            if j > 0 {
                out.push(b',');
            }
            out.push(b'{');
            push_token(out, table, top.token_id);
            out.extend_from_slice(b",\"logprob\":");
            push_f32(out, top.logprob);
            out.push(b'}');
        }
        out.extend_from_slice(b"]}");
    }
    out.extend_from_slice(b"]}");
}

/// Completions' `logprobs`: `{"tokens","token_logprobs","top_logprobs","text_offset"}`;
/// `offset` is the choice's text length before these tokens.
pub(super) fn completion_logprobs(
    out: &mut Vec<u8>,
    logprobs: &[TokenLogprob],
    table: &DecodeTable,
    offset: usize,
) {
    let texts: Vec<String> = logprobs
        .iter()
        .map(|p| String::from_utf8_lossy(&table.token_bytes(p.token_id)).into_owned())
        .collect();
    out.extend_from_slice(b"{\"tokens\":[");
    for (i, text) in texts.iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        push_str(out, text);
    }
    out.extend_from_slice(b"],\"token_logprobs\":[");
    for (i, p) in logprobs.iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        push_f32(out, p.logprob);
    }
    out.extend_from_slice(b"],\"top_logprobs\":[");
    for (i, p) in logprobs.iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        out.push(b'{');
        for (j, top) in p.top.iter().enumerate() {
            if j > 0 {
                out.push(b',');
            }
            push_str(
                out,
                &String::from_utf8_lossy(&table.token_bytes(top.token_id)),
            );
            out.push(b':');
            push_f32(out, top.logprob);
        }
        out.push(b'}');
    }
    out.extend_from_slice(b"],\"text_offset\":[");
    let mut at = offset;
    for (i, text) in texts.iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        push_u64(out, at as u64);
        at += text.len();
    }
    out.extend_from_slice(b"]}");
}
