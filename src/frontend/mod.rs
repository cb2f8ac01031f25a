//! The engine-independent front end of gRPC workers: what the gateway does in place of the
//! engine's own HTTP server when it sends token IDs and gets token IDs back. It owns the
//! request side (a body into neutral [`GenerateParams`]) and the response side (token IDs into
//! text, stops, and the bytes of the client's API); the transport owns the wire to the engine.
//! No I/O here, nothing engine-specific: `GenerateParams` carries every field a
//! `GenerateRequest` needs, and the writers take neutral [`Step`]s.
//!
//! # How a transport uses it
//!
//! Once per model (at start, or when its tokenizer is fetched): an
//! `Arc<tokenize::DecodeTable>` from the model's `tokenize::ModelTokenizer`
//! (`ModelTokenizer::decode_table`), and the model's EOS token IDs (`GetModelInfo`).
//!
//! Per request:
//! 1. `GenerateParams::parse(api, body)` (or `parse_chat` / `parse_completion` /
//!    `parse_messages` / `parse_generate`). On `Err(e)` answer `e.status()` (400) with
//!    `e.write_body(&mut out)`; nothing is sent to an engine. `params.input` says what to
//!    tokenize: `Conversation` (render with `ModelTokenizer::prompt`), `Text` (a completions
//!    prompt) or `Ids`.
//! 2. Build the engine request from `params`: `params.sampling` holds what the client set
//!    (`None` where silent: leave the proto field unset, or use `sampling.resolved()` for the
//!    engines' semantic defaults; proto3 zeros are not defaults), `stop`, `stop_token_ids`,
//!    `ignore_eos`, `skip_special_tokens` (the gateway detokenizes: ask the engine for IDs),
//!    `keep_stop` (`no_stop_trim`), `n`, `logprobs` (`top`), `constraint`, `stream`.
//! 3. `OutputDecoder::new(table.clone(), &params, &eos_ids)`, and either
//!    `StreamWriter::new(&params, meta, prompt_tokens)` (`params.stream`) or
//!    `FullWriter::new(&params, meta)`; `ResponseMeta` is the response id (`chatcmpl-...`,
//!    `cmpl-...`, `msg_...`, or the `/generate` rid), the model name and the Unix time
//!    (`ResponseMeta::for_api` makes the id from a number unique to the request).
//!    Streaming: `writer.start(&mut out)` once, before the first token (Anthropic's
//!    `message_start`; nothing for the others).
//! 4. For each engine chunk of choice `i` with new IDs `ids` (and logprobs `lp`, converted to
//!    [`TokenLogprob`]s): `let d = decoder.push(i, ids)`; then `writer.step(&Step { index: i,
//!    token_ids: &ids[..d.ids_used], text: d.text, logprobs: &lp[..d.ids_used.min(lp.len())],
//!    finish: d.finish }, &table, &mut out)` (`table`: the model's `Arc<DecodeTable>`, since
//!    `d` borrows the decoder; `FullWriter::step` takes the step alone). When `d.finish` is set the gateway itself ended the choice (a stop string or
//!    stop token): stop reading it and, when every choice ended (`decoder.all_finished()`),
//!    cancel the engine's stream (`Abort`).
//! 5. When the engine ends choice `i` (its finish reason, `FinishReason::{Stop, Length,
//!    Abort}`, and matched stop if it names one): `let d = decoder.finish(i, reason,
//!    matched)` flushes the held text; write it as a step with `finish: d.finish`.
//! 6. When every choice ended: `Usage { prompt_tokens, completion_tokens, cached_tokens }`
//!    (the engine's counts; `decoder.completion_tokens()` when it gives none), then
//!    `StreamWriter::end(&usage, &mut out)` (usage chunk if asked, `[DONE]`, or Anthropic's
//!    closing events) or `FullWriter::write(&usage, &table, &mut out)` (the JSON body).
//!    A worker that fails mid-stream: `StreamWriter::error(message, &mut out)`. `/generate`
//!    reports `e2e_latency`: call the writer's `set_elapsed(seconds)` before writing.
//!
//! Every writer appends to a caller's `Vec<u8>`, so a transport reuses one buffer per
//! stream; without logprobs nothing is allocated per token on the OpenAI and Anthropic stream
//! paths after the first chunk (`/generate` keeps the cumulative text and IDs it reports).
//!
//! Key types: [`GenerateParams`] (and [`Sampling`], [`Constraint`], [`ParamError`]),
//! [`OutputDecoder`], [`Step`], [`Finish`], [`Usage`], [`StreamWriter`], [`FullWriter`].
//! Errors: a body that cannot be served is a [`ParamError`] (400, the project's JSON error
//! body with `param`); nothing after parsing fails: odd engine output (an unknown ID, an index
//! past `n`) is skipped.

mod anthropic;
mod choice;
mod generate;
mod json;
mod openai;
mod output;
mod params;
pub mod parsers;
mod writer;

pub use choice::{Decoded, OutputDecoder};
pub use output::{Finish, FinishReason, ResponseMeta, Step, TokenLogprob, TopLogprob, Usage};
pub use params::{
    parse_chat, parse_completion, parse_generate, parse_messages, Api, Constraint, GenerateParams,
    LogprobRequest, ParamError, PromptInput, ResolvedSampling, Sampling,
    GENERATE_MAX_NEW_TOKENS_DEFAULT,
};
pub use parsers::{ParseSetup, ParserFlags, ToolChoice, ToolRequest};
pub use writer::{FullWriter, StreamWriter};

#[cfg(test)]
mod tests;
