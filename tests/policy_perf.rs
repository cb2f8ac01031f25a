//! Runs every routing benchmark of `perf/policy.rs` once with tiny prompts, so the benchmarks
//! build and run in the normal test pass and cannot rot. Speed is not asserted; every benchmark
//! must produce a result (its checksum).

use std::time::Duration;

use criterion::Criterion;

#[path = "../perf/policy.rs"]
#[allow(dead_code)]
mod bench;

#[test]
fn every_policy_benchmark_runs_with_tiny_prompts() {
    let mut criterion = Criterion::default()
        .sample_size(10)
        .nresamples(10)
        .warm_up_time(Duration::from_millis(1))
        .measurement_time(Duration::from_millis(5))
        .without_plots();
    let [extract, decide, decide_logging] = bench::run_all(&mut criterion, &bench::Sizes::tiny());
    assert!(extract > 0, "extraction read no key");
    assert!(decide > 0, "no decision picked a worker");
    assert!(decide_logging > 0, "the router picked no worker");
}
