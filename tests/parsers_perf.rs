//! Runs every benchmark of `perf/parsers.rs` once with a short stream, so the benchmarks build
//! and run in the normal test pass and cannot rot. Speed is not asserted; every benchmark must
//! produce output (its checksum).

use std::time::Duration;

use criterion::Criterion;

#[path = "../perf/parsers.rs"]
#[allow(dead_code)]
mod bench;

#[test]
fn every_parsers_benchmark_runs_with_a_short_stream() {
    let mut criterion = Criterion::default()
        .sample_size(10)
        .nresamples(10)
        .warm_up_time(Duration::from_millis(1))
        .measurement_time(Duration::from_millis(5))
        .without_plots();
    let checksum = bench::run_all(&mut criterion, &bench::Sizes::tiny());
    assert!(checksum.is_some_and(|c| c > 0), "no output");
}
