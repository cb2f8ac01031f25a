//! SGLang's native `/generate` response: `{"text","output_ids","meta_info"}` per choice (a
//! list when `n > 1`), streamed as server-sent events of the text and IDs so far (SGLang's
//! default, without `--incremental-streaming-output`) ending with `data: [DONE]`. `meta_info`
//! has SMG's fields in SMG's order: `id`, `finish_reason` (`{"type":"stop"}`,
//! `{"type":"length","length":N}`, `{"type":"abort"}`, null while running), `prompt_tokens`,
//! `weight_version`, `output_token_logprobs` (when asked), `completion_tokens`,
//! `cached_tokens`, `e2e_latency` (seconds), `matched_stop` (when one matched).

use super::json::{push_f32, push_f64, push_str, push_u64};
use super::output::{Finish, FinishReason, TokenLogprob, Usage};
use crate::tokenize::MatchedStop;

/// One choice as `/generate` reports it.
pub(super) struct GenerateChoice<'a> {
    pub text: &'a str,
    pub output_ids: &'a [u32],
    pub finish: Option<&'a Finish>,
    pub logprobs: Option<&'a [TokenLogprob]>,
    /// Seconds since the request arrived (`e2e_latency`).
    pub elapsed_s: f64,
}

/// `meta_info.finish_reason`, then (after the other fields) `matched_stop`.
fn push_finish(out: &mut Vec<u8>, finish: Option<&Finish>, length: usize) {
    match finish.map(|f| f.reason) {
        None => out.extend_from_slice(b"null"),
        Some(FinishReason::Length) => {
            out.extend_from_slice(b"{\"type\":\"length\",\"length\":");
            push_u64(out, length as u64);
            out.push(b'}');
        }
        Some(reason) => {
            out.extend_from_slice(b"{\"type\":");
            push_str(out, reason.as_str());
            out.push(b'}');
        }
    }
}

fn push_matched(out: &mut Vec<u8>, finish: Option<&Finish>, stops: &[String]) {
    match finish.and_then(|f| f.matched.as_ref()) {
        Some(MatchedStop::Text(i)) => {
            if let Some(stop) = stops.get(*i) {
                out.extend_from_slice(b",\"matched_stop\":");
                push_str(out, stop);
            }
        }
        Some(MatchedStop::Token(id)) => {
            out.extend_from_slice(b",\"matched_stop\":");
            push_u64(out, u64::from(*id));
        }
        None => {}
    }
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
    push_finish(out, choice.finish, choice.output_ids.len());
    out.extend_from_slice(b",\"prompt_tokens\":");
    push_u64(out, u64::from(usage.prompt_tokens));
    out.extend_from_slice(b",\"weight_version\":\"default\"");
    if let Some(logprobs) = choice.logprobs {
        push_logprobs(out, logprobs);
    }
    out.extend_from_slice(b",\"completion_tokens\":");
    push_u64(out, choice.output_ids.len() as u64);
    out.extend_from_slice(b",\"cached_tokens\":");
    push_u64(out, u64::from(usage.cached_tokens));
    out.extend_from_slice(b",\"e2e_latency\":");
    push_f64(out, choice.elapsed_s);
    push_matched(out, choice.finish, stops);
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
