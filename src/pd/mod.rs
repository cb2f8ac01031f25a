//! Prefill/decode disaggregation (SMG's `--pd-disaggregation`), free of I/O: the flags and
//! their validation (`args`: [`PdArgs`] into [`PdConfig`] and [`WorkerStartup`]), and what
//! the two engines' handshakes do to a request and its answers (`handshake`: SGLang's
//! bootstrap fields, one room per item of a batch, and the merge of the prefill's input
//! logprobs; vLLM's `kv_transfer_params`). The data plane's side, two upstream requests ending
//! in one relayed answer, is `http::upstream::pd`.
//!
//! A flag that cannot be used is a `FlagError` naming it; a body the handshake cannot rewrite
//! (not a JSON object) is a [`handshake::RewriteError`], which the data plane answers 400.

pub mod args;
pub mod handshake;

pub use args::{Handshake, PdArgs, PdConfig, WorkerStartup};
