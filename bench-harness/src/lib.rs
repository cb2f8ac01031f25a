//! Test and benchmark tooling for kvgate: `chaos` (the seeded chaos test), `sim` (a simulated fleet of LLM engines), `replay` (the
//! trace-replay load generator), `tokenize` (the deterministic text tokenizer both agree on),
//! `flame` (flame graphs of a profiled kvgate, for `scripts/flamegraph.sh`), `fleet` (starting,
//! waiting for and measuring the processes of a fleet: ports, logs, health, `/proc`), `stats`
//! (the scripts' medians and ratios) and `cli` (the binaries' runtime and exit codes).

pub mod chaos;
pub mod cli;
pub mod flame;
pub mod fleet;
pub mod replay;
pub mod sim;
pub mod stats;
pub mod tokenize;
