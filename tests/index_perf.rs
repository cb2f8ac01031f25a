//! Runs every index benchmark of `perf/index.rs` with tiny parameters, so the benchmarks build and
//! run in the normal test pass and cannot rot. Speed is not asserted; the results must be sane.

#[path = "../perf/index.rs"]
#[allow(dead_code)]
mod bench;

#[test]
fn quick_report_runs_with_tiny_sizes() {
    let report = bench::quick_report(&bench::Sizes::tiny());
    for field in [
        "lookup_8k_tokens_ns",
        "lookup_32k_chars_ns",
        "writer_inserts_per_s",
        "bytes_per_token",
    ] {
        let value = report[field].as_f64().unwrap_or(-1.0);
        assert!(
            value > 0.0 && value.is_finite(),
            "{field} = {value} in {report}"
        );
    }
    assert!(
        report["checksum"].as_u64().unwrap_or(0) > 0,
        "lookups matched: {report}"
    );
    assert!(
        report["evict_half_entries"].as_u64().unwrap_or(0) > 0,
        "eviction ran: {report}"
    );
}

#[test]
fn every_criterion_body_runs_with_tiny_sizes() {
    let mut cases = Vec::new();
    bench::for_each_case(&bench::Sizes::tiny(), &mut |group, name, mut body| {
        let took = body(3);
        cases.push(format!("{group}/{name}"));
        assert!(took.as_nanos() > 0, "{group}/{name} measured nothing");
    });
    assert_eq!(cases.len(), 6, "{cases:?}");
}

#[test]
fn rounds_merge_into_medians_and_keep_each_rounds_target_figures() {
    let round = |lookup: f64, inserts: f64, checksum: u64| {
        serde_json::json!({
            "note": "text",
            "lookup_plus_record_8k_tokens_ns": lookup,
            "writer_inserts_per_s": inserts,
            "checksum": checksum,
        })
    };
    let rounds = [
        round(3100.0, 0.9e6, 7),
        round(2500.0, 1.4e6, 9),
        round(2800.0, 1.1e6, 8),
    ];
    let merged = bench::merge_rounds(&rounds);
    assert_eq!(merged["lookup_plus_record_8k_tokens_ns"], 2800.0);
    assert_eq!(merged["writer_inserts_per_s"], 1.1e6);
    assert_eq!(merged["checksum"].as_u64(), Some(8));
    assert_eq!(merged["note"], "text");
    assert_eq!(merged["rounds"], 3);
    assert_eq!(
        merged["rounds_lookup_plus_record_8k_tokens_ns"],
        serde_json::json!([3100.0, 2500.0, 2800.0])
    );
}
