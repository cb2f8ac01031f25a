//! SGLang's native `/generate` response: `{"text","output_ids","meta_info"}` per choice (a
//! list when `n > 1`), streamed as server-sent events of the text and IDs so far (SGLang's
//! default, without `--incremental-streaming-output`) ending with `data: [DONE]`.

use super::json::{push_f32, push_str, push_u64};
use super::output::{Finish, FinishReason, TokenLogprob, Usage};
use crate::tokenize::MatchedStop;

/// One choice as `/generate` reports it.
pub(super) struct GenerateChoice<'a> {
    pub text: &'a str,
    pub output_ids: &'a [u32],
    pub finish: Option<&'a Finish>,
    pub logprobs: Option<&'a [TokenLogprob]>,
}

/// `meta_info.finish_reason`: `{"type":"stop","matched":...}`, `{"type":"length","length":N}`,
/// `{"type":"abort","message":...}`, or null while running.
fn push_finish(out: &mut Vec<u8>, finish: Option<&Finish>, stops: &[String], length: usize) {
    let Some(finish) = finish else {
        out.extend_from_slice(b"null");
        return;
    };
    out.extend_from_slice(b"{\"type\":");
    push_str(out, finish.reason.as_str());
    match (finish.reason, &finish.matched) {
        (FinishReason::Stop, Some(MatchedStop::Text(i))) => {
            out.extend_from_slice(b",\"matched\":");
            match stops.get(*i) {
                Some(stop) => push_str(out, stop),
                None => out.extend_from_slice(b"null"),
            }
        }
        (FinishReason::Stop, Some(MatchedStop::Token(id))) => {
            out.extend_from_slice(b",\"matched\":");
            push_u64(out, u64::from(*id));
        }
        (FinishReason::Length, _) => {
            out.extend_from_slice(b",\"length\":");
            push_u64(out, length as u64);
        }
        (FinishReason::Abort, _) => out.extend_from_slice(b",\"message\":null"),
        (FinishReason::Stop, None) => {}
    }
    out.push(b'}');
}

/// `[[logprob, id, null], ...]` and `[[[logprob, id, null], ...], ...]`.
fn push_logprobs(out: &mut Vec<u8>, logprobs: &[TokenLogprob]) {
    out.extend_from_slice(b",\"output_token_logprobs\":[");
    for (i, p) in logprobs.iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        out.push(b'[');
        push_f32(out, p.logprob);
        out.push(b',');
        push_u64(out, u64::from(p.token_id));
        out.extend_from_slice(b",null]");
    }
    out.extend_from_slice(b"],\"output_top_logprobs\":[");
    for (i, p) in logprobs.iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        out.push(b'[');
        for (j, top) in p.top.iter().enumerate() {
            if j > 0 {
                out.push(b',');
            }
            out.push(b'[');
            push_f32(out, top.logprob);
            out.push(b',');
            push_u64(out, u64::from(top.token_id));
            out.extend_from_slice(b",null]");
        }
        out.push(b']');
    }
    out.push(b']');
}

/// One choice's object.
pub(super) fn choice(
    out: &mut Vec<u8>,
    id: &str,
    choice: &GenerateChoice<'_>,
    stops: &[String],
    usage: &Usage,
) {
    out.extend_from_slice(b"{\"text\":");
    push_str(out, choice.text);
    out.extend_from_slice(b",\"output_ids\":[");
    for (i, t) in choice.output_ids.iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        push_u64(out, u64::from(*t));
    }
    out.extend_from_slice(b"],\"meta_info\":{\"id\":");
    push_str(out, id);
    out.extend_from_slice(b",\"finish_reason\":");
    push_finish(out, choice.finish, stops, choice.output_ids.len());
    out.extend_from_slice(b",\"prompt_tokens\":");
    push_u64(out, u64::from(usage.prompt_tokens));
    out.extend_from_slice(b",\"completion_tokens\":");
    push_u64(out, choice.output_ids.len() as u64);
    out.extend_from_slice(b",\"cached_tokens\":");
    push_u64(out, u64::from(usage.cached_tokens));
    if let Some(logprobs) = choice.logprobs {
        push_logprobs(out, logprobs);
    }
    out.extend_from_slice(b"}}");
}

/// One streamed event of a choice.
pub(super) fn event(
    out: &mut Vec<u8>,
    id: &str,
    generate_choice: &GenerateChoice<'_>,
    stops: &[String],
    usage: &Usage,
) {
    out.extend_from_slice(b"data: ");
    choice(out, id, generate_choice, stops, usage);
    out.extend_from_slice(b"\n\n");
}
