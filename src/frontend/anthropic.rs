//! Anthropic's Messages response shapes: the streamed event sequence (`message_start`,
//! `content_block_start`, `content_block_delta`..., `content_block_stop`, `message_delta`,
//! `message_stop`) and the non-streamed `message`, with fields in the order and presence of
//! SMG's Messages types (`stop_sequence` and `cache_read_input_tokens` left out of a
//! `message_delta` when none).

use super::json::{push_escaped, push_str, push_u64};
use super::output::{Finish, ResponseMeta, Usage};
use crate::tokenize::MatchedStop;

/// `usage` as Anthropic counts it: input tokens apart from those read from the cache
/// (`cache_read_input_tokens`, absent when none), in SMG's field order.
fn push_usage(out: &mut Vec<u8>, usage: &Usage) {
    out.extend_from_slice(b"{\"input_tokens\":");
    push_u64(
        out,
        u64::from(usage.prompt_tokens.saturating_sub(usage.cached_tokens)),
    );
    out.extend_from_slice(b",\"output_tokens\":");
    push_u64(out, u64::from(usage.completion_tokens));
    push_cache_read(out, usage);
    out.push(b'}');
}

fn push_cache_read(out: &mut Vec<u8>, usage: &Usage) {
    if usage.cached_tokens > 0 {
        out.extend_from_slice(b",\"cache_read_input_tokens\":");
        push_u64(out, u64::from(usage.cached_tokens));
    }
}

pub(super) fn event(out: &mut Vec<u8>, name: &str) {
    out.extend_from_slice(b"event: ");
    out.extend_from_slice(name.as_bytes());
    out.extend_from_slice(b"\ndata: ");
}

/// A `message` object: `id`, `type`, `role`, `content` (the array `content` writes), `model`,
/// the stop fields (null while running) and `usage`, in SMG's order.
fn push_message(
    out: &mut Vec<u8>,
    meta: &ResponseMeta,
    content: &dyn Fn(&mut Vec<u8>),
    stop: Option<(&Finish, &[String])>,
    usage: &Usage,
) {
    out.extend_from_slice(b"{\"id\":");
    push_str(out, &meta.id);
    out.extend_from_slice(b",\"type\":\"message\",\"role\":\"assistant\",\"content\":");
    content(out);
    out.extend_from_slice(b",\"model\":");
    push_str(out, &meta.model);
    match stop {
        Some((finish, stops)) => {
            out.extend_from_slice(b",\"stop_reason\":");
            push_str(out, finish.reason.anthropic(finish.matched.as_ref()));
            out.extend_from_slice(b",\"stop_sequence\":");
            match stop_sequence(finish, stops) {
                Some(stop) => push_str(out, stop),
                None => out.extend_from_slice(b"null"),
            }
        }
        None => out.extend_from_slice(b",\"stop_reason\":null,\"stop_sequence\":null"),
    }
    out.extend_from_slice(b",\"usage\":");
    push_usage(out, usage);
    out.push(b'}');
}

/// The stop string that ended the message, if one did.
fn stop_sequence<'a>(finish: &Finish, stops: &'a [String]) -> Option<&'a str> {
    match &finish.matched {
        Some(MatchedStop::Text(i)) => stops.get(*i).map(String::as_str),
        _ => None,
    }
}

/// `message_start` and the text block's `content_block_start`; `prompt_tokens` is known
/// before the engine answers.
pub(super) fn start(out: &mut Vec<u8>, meta: &ResponseMeta, prompt_tokens: u32) {
    message_start(out, meta, prompt_tokens);
    event(out, "content_block_start");
    out.extend_from_slice(
        b"{\"type\":\"content_block_start\",\"index\":0,\"content_block\":{\"type\":\"text\",\"text\":\"\"}}\n\n",
    );
}

/// `message_start` alone (a parsed message opens its blocks as they come).
pub(super) fn message_start(out: &mut Vec<u8>, meta: &ResponseMeta, prompt_tokens: u32) {
    event(out, "message_start");
    out.extend_from_slice(b"{\"type\":\"message_start\",\"message\":");
    let usage = Usage {
        prompt_tokens,
        ..Usage::default()
    };
    push_message(out, meta, &|out| out.extend_from_slice(b"[]"), None, &usage);
    out.extend_from_slice(b"}\n\n");
}

/// A `text_delta`.
pub(super) fn delta(out: &mut Vec<u8>, text: &str) {
    event(out, "content_block_delta");
    out.extend_from_slice(
        b"{\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"",
    );
    push_escaped(out, text.as_bytes());
    out.extend_from_slice(b"\"}}\n\n");
}

/// `content_block_stop`, `message_delta` (stop reason, usage) and `message_stop`.
pub(super) fn end(out: &mut Vec<u8>, finish: &Finish, stops: &[String], usage: &Usage) {
    event(out, "content_block_stop");
    out.extend_from_slice(b"{\"type\":\"content_block_stop\",\"index\":0}\n\n");
    end_message(out, finish, stops, usage);
}

/// `message_delta` (stop reason, usage) and `message_stop`, after the last block's stop.
pub(super) fn end_message(out: &mut Vec<u8>, finish: &Finish, stops: &[String], usage: &Usage) {
    event(out, "message_delta");
    out.extend_from_slice(b"{\"type\":\"message_delta\",\"delta\":{\"stop_reason\":");
    push_str(out, finish.reason.anthropic(finish.matched.as_ref()));
    if let Some(stop) = stop_sequence(finish, stops) {
        out.extend_from_slice(b",\"stop_sequence\":");
        push_str(out, stop);
    }
    out.extend_from_slice(b"},\"usage\":{\"output_tokens\":");
    push_u64(out, u64::from(usage.completion_tokens));
    out.extend_from_slice(b",\"input_tokens\":");
    push_u64(
        out,
        u64::from(usage.prompt_tokens.saturating_sub(usage.cached_tokens)),
    );
    push_cache_read(out, usage);
    out.extend_from_slice(b"}}\n\n");
    event(out, "message_stop");
    out.extend_from_slice(b"{\"type\":\"message_stop\"}\n\n");
}

/// An `error` event (the stream cannot finish).
pub(super) fn error(out: &mut Vec<u8>, message: &str) {
    event(out, "error");
    out.extend_from_slice(b"{\"type\":\"error\",\"error\":{\"type\":\"api_error\",\"message\":");
    push_str(out, message);
    out.extend_from_slice(b"}}\n\n");
}

/// The non-streamed `message` with one text block.
pub(super) fn message(
    out: &mut Vec<u8>,
    meta: &ResponseMeta,
    text: &str,
    finish: &Finish,
    stops: &[String],
    usage: &Usage,
) {
    let content = |out: &mut Vec<u8>| {
        out.extend_from_slice(b"[{\"type\":\"text\",\"text\":");
        push_str(out, text);
        out.extend_from_slice(b"}]");
    };
    push_message(out, meta, &content, Some((finish, stops)), usage);
}

/// The non-streamed `message` whose `content` array `content` writes (a parsed message's
/// blocks).
pub(super) fn message_with(
    out: &mut Vec<u8>,
    meta: &ResponseMeta,
    content: &dyn Fn(&mut Vec<u8>),
    finish: &Finish,
    stops: &[String],
    usage: &Usage,
) {
    push_message(out, meta, content, Some((finish, stops)), usage);
}
