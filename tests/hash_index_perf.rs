//! Runs the hash-index benchmarks of `perf/hash_index.rs` once with tiny sizes, so they build and
//! run in the normal test pass and cannot rot. Speed is not asserted; the figures must be sane.

use std::time::Duration;

use criterion::Criterion;

#[path = "../perf/hash_index.rs"]
#[allow(dead_code)]
mod bench;

#[test]
fn hash_index_benchmarks_run_with_tiny_sizes() {
    let mut criterion = Criterion::default()
        .sample_size(10)
        .nresamples(10)
        .warm_up_time(Duration::from_millis(1))
        .measurement_time(Duration::from_millis(5))
        .without_plots();
    let report = bench::run_all(&mut criterion, &bench::Sizes::tiny());
    let live = report["live_heads"].as_u64().unwrap_or(0);
    assert!(live > 3_000, "the map was filled: {report}");
    assert!(
        report["holders_seen"].as_u64().unwrap_or(0) > 0,
        "lookups found holders: {report}"
    );
    let per_head = report["bytes_per_live_head"].as_f64().unwrap_or(f64::MAX);
    assert!(per_head > 0.0 && per_head < 200.0, "{report}");
}
