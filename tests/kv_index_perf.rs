//! Runs the KV-event index benchmarks of `perf/kv_index.rs` once with tiny sizes, so they build
//! and run in the normal test pass and cannot rot. Speed is not asserted; the figures must be
//! sane.

use std::time::Duration;

use criterion::Criterion;

#[path = "../perf/kv_index.rs"]
#[allow(dead_code)]
mod bench;

#[test]
fn kv_index_benchmarks_run_with_tiny_sizes() {
    let mut criterion = Criterion::default()
        .sample_size(10)
        .nresamples(10)
        .warm_up_time(Duration::from_millis(1))
        .measurement_time(Duration::from_millis(5))
        .without_plots();
    let report = bench::run_all(&mut criterion, &bench::Sizes::tiny());
    assert!(
        report["ingested_blocks_per_second"].as_f64().unwrap_or(0.0) > 0.0,
        "blocks were ingested: {report}"
    );
    assert_eq!(report["lost_stores"].as_u64(), Some(0), "{report}");
    // 64 workers, each the 64-block system prompt and 4 chains of 32 blocks.
    let entries = report["entries"].as_u64().unwrap_or(0);
    assert_eq!(entries, 64 * (64 + 4 * 32), "{report}");
    let per_entry = report["bytes_per_entry"].as_f64().unwrap_or(f64::MAX);
    assert!(per_entry > 0.0 && per_entry < 400.0, "{report}");
}
