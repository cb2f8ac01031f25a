//! The neutral per-step output a transport hands the response writers, whatever the engine
//! protocol: which choice, the new token IDs, their decoded text, logprobs, and how the choice
//! ended; and the request's token counts.

use super::params::Api;
use crate::tokenize::MatchedStop;

/// Why a choice ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FinishReason {
    /// EOS, a stop token or a stop string.
    Stop,
    /// `max_tokens` (or the context) reached.
    Length,
    /// The engine aborted the request.
    Abort,
    /// The output was tool calls (a stop after calls the gateway parsed: OpenAI's
    /// `tool_calls`, Anthropic's `tool_use`).
    ToolCalls,
}

impl FinishReason {
    /// OpenAI's and SGLang's name.
    pub fn as_str(self) -> &'static str {
        match self {
            FinishReason::Stop => "stop",
            FinishReason::Length => "length",
            FinishReason::Abort => "abort",
            FinishReason::ToolCalls => "tool_calls",
        }
    }

    /// Anthropic's `stop_reason`.
    pub fn anthropic(self, matched: Option<&MatchedStop>) -> &'static str {
        match (self, matched) {
            (FinishReason::Stop, Some(MatchedStop::Text(_))) => "stop_sequence",
            (FinishReason::Stop, _) => "end_turn",
            (FinishReason::Length, _) => "max_tokens",
            // Anthropic has no abort; a refusal is the nearest ending that is not an error.
            (FinishReason::Abort, _) => "refusal",
            (FinishReason::ToolCalls, _) => "tool_use",
        }
    }
}

/// How a choice ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Finish {
    /// Why.
    pub reason: FinishReason,
    /// The stop that matched, when one did.
    pub matched: Option<MatchedStop>,
}

/// One alternative of a position's logprobs.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct TopLogprob {
    /// The token.
    pub token_id: u32,
    /// Its log probability.
    pub logprob: f32,
}

/// The logprob of one output token, with its alternatives.
#[derive(Clone, Debug, PartialEq)]
pub struct TokenLogprob {
    /// The sampled token.
    pub token_id: u32,
    /// Its log probability.
    pub logprob: f32,
    /// The most likely tokens at this position, most likely first.
    pub top: Vec<TopLogprob>,
}

/// One step of one choice: what the engine sent for it, decoded.
#[derive(Clone, Copy, Debug)]
pub struct Step<'a> {
    /// The choice (0 ..`n`).
    pub index: u32,
    /// The new token IDs.
    pub token_ids: &'a [u32],
    /// The text they complete (may be empty: held-back bytes or a possible stop's prefix).
    pub text: &'a str,
    /// Their logprobs, when asked.
    pub logprobs: &'a [TokenLogprob],
    /// Set on the choice's last step.
    pub finish: Option<&'a Finish>,
}

/// A request's token counts (`usage`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Usage {
    /// Prompt tokens (once per request, whatever `n`).
    pub prompt_tokens: u32,
    /// Output tokens of every choice.
    pub completion_tokens: u32,
    /// Prompt tokens the engine found in its cache (`prompt_tokens_details.cached_tokens`).
    pub cached_tokens: u32,
}

/// What identifies a response: its id, model and creation time.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ResponseMeta {
    /// `id` (`chatcmpl-...`, `cmpl-...`, `msg_...`; `/generate`'s `meta_info.id`).
    pub id: String,
    /// `model`.
    pub model: String,
    /// `created`, Unix seconds.
    pub created: u64,
}

impl ResponseMeta {
    /// A response's identity with an id in the API's style from a number unique to the
    /// request (`chatcmpl-`, `cmpl-`, `msg_` and 24 hex digits; `/generate`'s rid is the hex
    /// alone).
    pub fn for_api(api: Api, model: &str, unique: u128, created: u64) -> ResponseMeta {
        let prefix = match api {
            Api::Chat => "chatcmpl-",
            Api::Completion => "cmpl-",
            Api::Messages => "msg_",
            Api::Generate => "",
        };
        ResponseMeta {
            id: format!("{prefix}{:024x}", unique & ((1u128 << 96) - 1)),
            model: model.to_owned(),
            created,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_follow_each_api_style() {
        let meta = ResponseMeta::for_api(Api::Chat, "m", 0xabc, 5);
        assert_eq!(meta.id, "chatcmpl-000000000000000000000abc");
        assert_eq!(
            ResponseMeta::for_api(Api::Messages, "m", u128::MAX, 5)
                .id
                .len(),
            4 + 24
        );
        assert_eq!(ResponseMeta::for_api(Api::Generate, "m", 1, 5).id.len(), 24);
        assert_eq!((meta.model.as_str(), meta.created), ("m", 5));
    }
}
