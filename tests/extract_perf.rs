//! Runs every benchmark of `perf/extract.rs` once with tiny bodies, so the benchmarks build and
//! run in the normal test pass and cannot rot. Speed is not asserted; every benchmark must
//! produce a result (its checksum), and the readers must agree on each body (the bench asserts it).

use std::time::Duration;

use criterion::Criterion;

#[path = "../perf/extract.rs"]
#[allow(dead_code)]
mod bench;

#[test]
fn every_extraction_benchmark_runs_with_tiny_bodies() {
    let mut criterion = Criterion::default()
        .sample_size(10)
        .nresamples(10)
        .warm_up_time(Duration::from_millis(1))
        .measurement_time(Duration::from_millis(5))
        .without_plots();
    let [extract, routed] = bench::run_all(&mut criterion, &bench::Sizes::tiny());
    assert!(extract > 0, "extraction read no key");
    assert!(routed > 0, "no routed request picked a worker");
}
