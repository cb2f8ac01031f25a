//! Test and benchmark tooling for kvgate: `sim` (a simulated fleet of LLM engines), `replay` (the
//! trace-replay load generator) and `tokenize` (the deterministic text tokenizer both agree on).

pub mod replay;
pub mod sim;
pub mod tokenize;
