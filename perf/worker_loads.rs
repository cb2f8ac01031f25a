//! The workers the policy and extraction benchmarks decide over: random loads drawn from a
//! seeded generator, so every run decides over the same workers. (Not `fleet`: that word names
//! the processes a benchmark starts, `bench_harness::fleet`.)

use fastrand::Rng;
use kvgate::policy::{WorkerLoad, WorkerStatus};

/// `workers` eligible workers with random in-flight counts, engine loads and credited tokens.
pub fn random_workers(rng: &mut Rng, workers: usize) -> Vec<WorkerStatus> {
    (0..workers)
        .map(|_| WorkerStatus {
            eligible: true,
            in_flight: rng.u32(0..40),
            load: Some(WorkerLoad {
                running: rng.u32(0..32),
                waiting: rng.u32(0..8),
                waiting_uncached_tokens: rng.u64(0..20_000),
                token_usage: rng.f64() * 0.8,
                gen_throughput: 2_000.0 + rng.f64() * 1_000.0,
                kv_capacity_tokens: 1 << 20,
            }),
            credited_tokens: rng.u64(0..4_000),
            resident_tokens: rng.u64(0..40_000),
            drained_tokens: rng.u64(0..2_000),
            placed_tokens: rng.f64() * 100.0,
            // Read only under --bounded-load-margin; no draw, so the workers stay those of
            // earlier runs.
            dispatched: 0,
        })
        .collect()
}
