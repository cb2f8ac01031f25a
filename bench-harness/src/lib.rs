//! Test and benchmark tooling for kvgate: `chaos` (the seeded chaos test), `sim` (a simulated fleet of LLM engines), `replay` (the
//! trace-replay load generator), `tokenize` (the deterministic text tokenizer both agree on) and
//! `flame` (flame graphs of a profiled kvgate, for `scripts/flamegraph.sh`).

pub mod chaos;
pub mod flame;
pub mod replay;
pub mod sim;
pub mod tokenize;
