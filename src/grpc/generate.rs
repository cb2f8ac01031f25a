//! The `Generate` call in engine-neutral terms: [`GenerateInput`] (prompt token IDs, sampling
//! fields with the engines' own defaults, streaming) encoded as SGLang's or vLLM's
//! `GenerateRequest`, and each `GenerateResponse` decoded back into a [`GenerateEvent`]. The
//! proto3 scalars read 0 when unset, which is not the engines' default (temperature 1, top_p 1,
//! top_k -1, repetition_penalty 1), so every field is always written from [`Sampling`].

use bytes::Bytes;
use prost::Message;

use super::backend::Backend;
use super::call::CallError;
use super::framing;
use crate::engine_proto::{sglang_pb, vllm_pb};
pub use crate::frontend::Constraint;
use crate::frontend::{GenerateParams, TokenLogprob, TopLogprob};

/// Sampling fields as the engines read them, built by [`Sampling::for_request`].
#[derive(Clone, Debug, PartialEq)]
pub struct Sampling {
    /// Softmax temperature (1: unchanged).
    pub temperature: f32,
    /// Nucleus sampling mass (1: off).
    pub top_p: f32,
    /// Top-k (-1: off; vLLM's 0).
    pub top_k: i32,
    /// Minimum relative probability (0: off).
    pub min_p: f32,
    /// OpenAI's frequency penalty.
    pub frequency_penalty: f32,
    /// OpenAI's presence penalty.
    pub presence_penalty: f32,
    /// Multiplicative repetition penalty (1: off).
    pub repetition_penalty: f32,
    /// The most tokens to generate (`None`: the engine's limit).
    pub max_new_tokens: Option<u32>,
    /// The fewest tokens before a stop may end it.
    pub min_new_tokens: u32,
    /// Stop strings.
    pub stop: Vec<String>,
    /// Stop token IDs.
    pub stop_token_ids: Vec<u32>,
    /// Whether special tokens are left out of text.
    pub skip_special_tokens: bool,
    /// Whether special tokens are separated by spaces in text.
    pub spaces_between_special_tokens: bool,
    /// Whether EOS is ignored.
    pub ignore_eos: bool,
    /// Samples per prompt.
    pub n: u32,
    /// A seed (vLLM only: SGLang's protocol has none).
    pub seed: Option<i32>,
    /// The output's shape (`response_format`, `json_schema`, `regex`, `ebnf`).
    pub constraint: Option<Constraint>,
    /// A matched stop string stays in the output (SGLang's `no_stop_trim`, vLLM's
    /// `include_stop_str_in_output`).
    pub keep_stop: bool,
}

impl Sampling {
    /// The engine's fields for `params`: the client's values, and where it was silent the
    /// engines' defaults as `frontend::Sampling::resolved` gives them (their one source here).
    pub fn for_request(params: &GenerateParams) -> Sampling {
        let r = params.sampling.resolved();
        Sampling {
            temperature: r.temperature,
            top_p: r.top_p,
            top_k: r.top_k,
            min_p: r.min_p,
            frequency_penalty: r.frequency_penalty,
            presence_penalty: r.presence_penalty,
            repetition_penalty: r.repetition_penalty,
            max_new_tokens: r.max_tokens,
            min_new_tokens: r.min_tokens,
            stop: params.stop.clone(),
            stop_token_ids: params.stop_token_ids.clone(),
            skip_special_tokens: params.skip_special_tokens,
            spaces_between_special_tokens: true,
            ignore_eos: params.ignore_eos,
            n: params.n.max(1),
            seed: r.seed.map(|seed| seed as i32),
            constraint: params.constraint.clone(),
            keep_stop: params.keep_stop,
        }
    }
}

/// One generation request, for either engine.
#[derive(Clone, Debug, PartialEq)]
pub struct GenerateInput {
    /// The request's id (the engine's, for `Abort`).
    pub request_id: String,
    /// The prompt's token IDs.
    pub input_ids: Vec<u32>,
    /// The sampling fields.
    pub sampling: Sampling,
    /// Whether the engine streams chunks (else one `Complete`).
    pub stream: bool,
    /// Output logprobs, with this many alternatives per position (`None`: none).
    pub logprobs: Option<u32>,
}

impl GenerateInput {
    /// The request message for `backend`, framed.
    pub fn encode(&self, backend: Backend) -> Bytes {
        match backend {
            Backend::Sglang => framing::encode(&self.sglang()),
            Backend::Vllm => framing::encode(&self.vllm()),
        }
    }

    fn sglang(&self) -> sglang_pb::GenerateRequest {
        let s = &self.sampling;
        sglang_pb::GenerateRequest {
            request_id: self.request_id.clone(),
            tokenized: Some(sglang_pb::TokenizedInput {
                original_text: String::new(),
                input_ids: self.input_ids.clone(),
            }),
            sampling_params: Some(sglang_pb::SamplingParams {
                temperature: s.temperature,
                top_p: s.top_p,
                top_k: s.top_k,
                min_p: s.min_p,
                frequency_penalty: s.frequency_penalty,
                presence_penalty: s.presence_penalty,
                repetition_penalty: s.repetition_penalty,
                max_new_tokens: s.max_new_tokens,
                stop: s.stop.clone(),
                stop_token_ids: s.stop_token_ids.clone(),
                skip_special_tokens: s.skip_special_tokens,
                spaces_between_special_tokens: s.spaces_between_special_tokens,
                n: s.n,
                min_new_tokens: s.min_new_tokens,
                ignore_eos: s.ignore_eos,
                no_stop_trim: s.keep_stop,
                constraint: s.constraint.as_ref().map(sglang_constraint),
                ..Default::default()
            }),
            return_logprob: self.logprobs.is_some(),
            top_logprobs_num: self.logprobs.map_or(0, clamp_i32),
            // No prompt logprobs (SGLang's -1), only the output's.
            logprob_start_len: -1,
            stream: self.stream,
            ..Default::default()
        }
    }

    fn vllm(&self) -> vllm_pb::GenerateRequest {
        let s = &self.sampling;
        vllm_pb::GenerateRequest {
            request_id: self.request_id.clone(),
            input: Some(vllm_pb::generate_request::Input::Tokenized(
                vllm_pb::TokenizedInput {
                    original_text: String::new(),
                    input_ids: self.input_ids.clone(),
                },
            )),
            sampling_params: Some(vllm_pb::SamplingParams {
                temperature: Some(s.temperature),
                top_p: s.top_p,
                // vLLM's "off" is 0 (its field is unsigned).
                top_k: u32::try_from(s.top_k).unwrap_or(0),
                min_p: s.min_p,
                frequency_penalty: s.frequency_penalty,
                presence_penalty: s.presence_penalty,
                repetition_penalty: s.repetition_penalty,
                max_tokens: s.max_new_tokens,
                min_tokens: s.min_new_tokens,
                stop: s.stop.clone(),
                stop_token_ids: s.stop_token_ids.clone(),
                skip_special_tokens: s.skip_special_tokens,
                spaces_between_special_tokens: s.spaces_between_special_tokens,
                ignore_eos: s.ignore_eos,
                n: s.n,
                seed: s.seed,
                include_stop_str_in_output: s.keep_stop,
                constraint: s.constraint.as_ref().map(vllm_constraint),
                // vLLM's count of alternatives; 0 is the sampled token's logprob alone.
                logprobs: self.logprobs.map(clamp_i32),
                ..Default::default()
            }),
            stream: self.stream,
            ..Default::default()
        }
    }
}

fn clamp_i32(value: u32) -> i32 {
    i32::try_from(value).unwrap_or(i32::MAX)
}

/// The front end's logprobs from an engine's `OutputLogProbs` (the two protocols' messages have
/// the same fields): one per position while both the IDs and the values last.
macro_rules! token_logprobs {
    ($logprobs:expr) => {
        match $logprobs {
            None => Vec::new(),
            Some(lp) => lp
                .token_ids
                .iter()
                .zip(&lp.token_logprobs)
                .enumerate()
                .map(|(i, (&token_id, &logprob))| TokenLogprob {
                    token_id,
                    logprob,
                    top: lp.top_logprobs.get(i).map_or_else(Vec::new, |top| {
                        top.token_ids
                            .iter()
                            .zip(&top.values)
                            .map(|(&token_id, &logprob)| TopLogprob { token_id, logprob })
                            .collect()
                    }),
                })
                .collect(),
        }
    };
}

/// A constraint in SGLang's fields (any JSON object is the schema `{"type":"object"}`).
fn sglang_constraint(constraint: &Constraint) -> sglang_pb::sampling_params::Constraint {
    use sglang_pb::sampling_params::Constraint as C;
    match constraint {
        Constraint::JsonSchema(schema) => C::JsonSchema(schema.clone()),
        Constraint::JsonObject => C::JsonSchema(r#"{"type":"object"}"#.into()),
        Constraint::Regex(regex) => C::Regex(regex.clone()),
        Constraint::Ebnf(grammar) => C::EbnfGrammar(grammar.clone()),
    }
}

/// A constraint in vLLM's fields.
fn vllm_constraint(constraint: &Constraint) -> vllm_pb::sampling_params::Constraint {
    use vllm_pb::sampling_params::Constraint as C;
    match constraint {
        Constraint::JsonSchema(schema) => C::JsonSchema(schema.clone()),
        Constraint::JsonObject => C::JsonObject(true),
        Constraint::Regex(regex) => C::Regex(regex.clone()),
        Constraint::Ebnf(grammar) => C::Grammar(grammar.clone()),
    }
}

/// What ended a generation early, when a stop did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum MatchedStop {
    /// A stop token ID (EOS included).
    TokenId(u32),
    /// A stop string.
    Text(String),
}

/// One streamed piece of output.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Chunk {
    /// New token IDs.
    pub token_ids: Vec<u32>,
    /// Prompt tokens (cumulative counts, as the engines send them).
    pub prompt_tokens: u32,
    /// Tokens generated so far.
    pub completion_tokens: u32,
    /// Prompt tokens served from the engine's prefix cache.
    pub cached_tokens: u32,
    /// Which of `n` samples.
    pub index: u32,
    /// The new tokens' logprobs, when asked.
    pub logprobs: Vec<TokenLogprob>,
}

/// The end of one sample's generation.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Complete {
    /// All output IDs (unstreamed), or the last ones (SGLang's streamed complete may repeat none).
    pub output_ids: Vec<u32>,
    /// `stop`, `length` or `abort`.
    pub finish_reason: String,
    /// Prompt tokens.
    pub prompt_tokens: u32,
    /// Tokens generated.
    pub completion_tokens: u32,
    /// Prompt tokens served from cache.
    pub cached_tokens: u32,
    /// Which of `n` samples.
    pub index: u32,
    /// The stop that ended it, if one did.
    pub matched_stop: Option<MatchedStop>,
    /// The logprobs of `output_ids`, when asked.
    pub logprobs: Vec<TokenLogprob>,
}

/// One `GenerateResponse`, for either engine.
#[derive(Clone, Debug, PartialEq)]
pub enum GenerateEvent {
    /// Tokens.
    Chunk(Chunk),
    /// The end of a sample.
    Complete(Complete),
    /// A message with neither (skipped).
    Empty,
}

impl GenerateEvent {
    /// Decodes one response message of `backend`.
    pub fn decode(backend: Backend, message: Bytes) -> Result<GenerateEvent, CallError> {
        let malformed = |e: prost::DecodeError| CallError::Malformed(e.to_string());
        match backend {
            Backend::Sglang => {
                let response = sglang_pb::GenerateResponse::decode(message).map_err(malformed)?;
                use sglang_pb::generate_response::Response;
                Ok(match response.response {
                    Some(Response::Chunk(c)) => GenerateEvent::Chunk(Chunk {
                        token_ids: c.token_ids,
                        prompt_tokens: c.prompt_tokens,
                        completion_tokens: c.completion_tokens,
                        cached_tokens: c.cached_tokens,
                        index: c.index,
                        logprobs: token_logprobs!(c.output_logprobs),
                    }),
                    Some(Response::Complete(c)) => {
                        use sglang_pb::generate_complete::MatchedStop as M;
                        GenerateEvent::Complete(Complete {
                            output_ids: c.output_ids,
                            finish_reason: c.finish_reason,
                            prompt_tokens: c.prompt_tokens,
                            completion_tokens: c.completion_tokens,
                            cached_tokens: c.cached_tokens,
                            index: c.index,
                            matched_stop: c.matched_stop.map(|m| match m {
                                M::MatchedTokenId(id) => MatchedStop::TokenId(id),
                                M::MatchedStopStr(text) => MatchedStop::Text(text),
                            }),
                            logprobs: token_logprobs!(c.output_logprobs),
                        })
                    }
                    None => GenerateEvent::Empty,
                })
            }
            Backend::Vllm => {
                let response = vllm_pb::GenerateResponse::decode(message).map_err(malformed)?;
                use vllm_pb::generate_response::Response;
                Ok(match response.response {
                    Some(Response::Chunk(c)) => GenerateEvent::Chunk(Chunk {
                        token_ids: c.token_ids,
                        prompt_tokens: c.prompt_tokens,
                        completion_tokens: c.completion_tokens,
                        cached_tokens: c.cached_tokens,
                        index: c.index,
                        logprobs: token_logprobs!(c.output_logprobs),
                    }),
                    Some(Response::Complete(c)) => {
                        use vllm_pb::generate_complete::MatchedStop as M;
                        GenerateEvent::Complete(Complete {
                            output_ids: c.output_ids,
                            finish_reason: c.finish_reason,
                            prompt_tokens: c.prompt_tokens,
                            completion_tokens: c.completion_tokens,
                            cached_tokens: c.cached_tokens,
                            index: c.index,
                            matched_stop: c.matched_stop.map(|m| match m {
                                M::MatchedTokenId(id) => MatchedStop::TokenId(id),
                                M::MatchedStopStr(text) => MatchedStop::Text(text),
                            }),
                            logprobs: token_logprobs!(c.output_logprobs),
                        })
                    }
                    None => GenerateEvent::Empty,
                })
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn input() -> GenerateInput {
        // A request that sets nothing but its length and a stop.
        let body = br#"{"model":"m","prompt":"hi","max_tokens":8,"stop":"\n"}"#;
        let params = GenerateParams::parse(crate::frontend::Api::Completion, body).unwrap();
        GenerateInput {
            request_id: "req-1".into(),
            input_ids: vec![1, 2, 3],
            sampling: Sampling::for_request(&params),
            stream: true,
            logprobs: None,
        }
    }

    #[test]
    fn logprobs_are_asked_in_each_engines_fields_and_read_back() {
        let asked = GenerateInput {
            logprobs: Some(3),
            ..input()
        };
        let sglang =
            sglang_pb::GenerateRequest::decode(&asked.encode(Backend::Sglang)[5..]).unwrap();
        assert!(sglang.return_logprob);
        assert_eq!((sglang.top_logprobs_num, sglang.logprob_start_len), (3, -1));
        let vllm = vllm_pb::GenerateRequest::decode(&asked.encode(Backend::Vllm)[5..]).unwrap();
        assert_eq!(vllm.sampling_params.unwrap().logprobs, Some(3));
        let silent =
            sglang_pb::GenerateRequest::decode(&input().encode(Backend::Sglang)[5..]).unwrap();
        assert!(!silent.return_logprob);
        let silent = vllm_pb::GenerateRequest::decode(&input().encode(Backend::Vllm)[5..]).unwrap();
        assert_eq!(silent.sampling_params.unwrap().logprobs, None);

        let chunk = vllm_pb::GenerateResponse {
            response: Some(vllm_pb::generate_response::Response::Chunk(
                vllm_pb::GenerateStreamChunk {
                    token_ids: vec![7, 8],
                    output_logprobs: Some(vllm_pb::OutputLogProbs {
                        token_logprobs: vec![-0.5, -1.5],
                        token_ids: vec![7, 8],
                        top_logprobs: vec![vllm_pb::TopLogProbs {
                            values: vec![-0.5, -2.0],
                            token_ids: vec![7, 9],
                        }],
                    }),
                    ..Default::default()
                },
            )),
        };
        let GenerateEvent::Chunk(chunk) =
            GenerateEvent::decode(Backend::Vllm, chunk.encode_to_vec().into()).unwrap()
        else {
            panic!("a chunk expected");
        };
        let top = |token_id, logprob| TopLogprob { token_id, logprob };
        assert_eq!(
            chunk.logprobs,
            [
                TokenLogprob {
                    token_id: 7,
                    logprob: -0.5,
                    top: vec![top(7, -0.5), top(9, -2.0)],
                },
                // A position the engine gave no alternatives for has none.
                TokenLogprob {
                    token_id: 8,
                    logprob: -1.5,
                    top: Vec::new(),
                },
            ]
        );
    }

    #[test]
    fn unset_sampling_fields_carry_the_engines_defaults_not_proto_zeros() {
        let framed = input().encode(Backend::Sglang);
        let request = sglang_pb::GenerateRequest::decode(&framed[5..]).unwrap();
        let params = request.sampling_params.unwrap();
        assert_eq!(
            (params.temperature, params.top_p, params.top_k),
            (1.0, 1.0, -1)
        );
        assert_eq!(params.repetition_penalty, 1.0);
        assert!(params.skip_special_tokens);
        assert_eq!(params.max_new_tokens, Some(8));
        assert_eq!(request.tokenized.unwrap().input_ids, [1, 2, 3]);
        assert!(request.stream);

        let framed = input().encode(Backend::Vllm);
        let request = vllm_pb::GenerateRequest::decode(&framed[5..]).unwrap();
        let params = request.sampling_params.unwrap();
        assert_eq!(
            (params.temperature, params.top_p, params.top_k),
            (Some(1.0), 1.0, 0)
        );
        assert_eq!(params.max_tokens, Some(8));
        assert_eq!(params.stop, ["\n"]);
        let Some(vllm_pb::generate_request::Input::Tokenized(tokens)) = request.input else {
            panic!("tokenized input expected");
        };
        assert_eq!(tokens.input_ids, [1, 2, 3]);
    }

    #[test]
    fn both_engines_responses_decode_to_the_same_events() {
        let sglang = sglang_pb::GenerateResponse {
            request_id: "r".into(),
            response: Some(sglang_pb::generate_response::Response::Complete(
                sglang_pb::GenerateComplete {
                    output_ids: vec![5, 6],
                    finish_reason: "stop".into(),
                    completion_tokens: 2,
                    matched_stop: Some(sglang_pb::generate_complete::MatchedStop::MatchedTokenId(
                        6,
                    )),
                    ..Default::default()
                },
            )),
        };
        let vllm = vllm_pb::GenerateResponse {
            response: Some(vllm_pb::generate_response::Response::Complete(
                vllm_pb::GenerateComplete {
                    output_ids: vec![5, 6],
                    finish_reason: "stop".into(),
                    completion_tokens: 2,
                    matched_stop: Some(vllm_pb::generate_complete::MatchedStop::MatchedTokenId(6)),
                    ..Default::default()
                },
            )),
        };
        let a = GenerateEvent::decode(Backend::Sglang, sglang.encode_to_vec().into()).unwrap();
        let b = GenerateEvent::decode(Backend::Vllm, vllm.encode_to_vec().into()).unwrap();
        assert_eq!(a, b);
        let GenerateEvent::Complete(complete) = a else {
            panic!("a complete event expected");
        };
        assert_eq!(complete.matched_stop, Some(MatchedStop::TokenId(6)));
        let garbage = GenerateEvent::decode(Backend::Sglang, Bytes::from_static(&[0xff, 0xff]));
        assert!(matches!(garbage, Err(CallError::Malformed(_))));
    }
}
