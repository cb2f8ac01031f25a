//! Runs every tokenization benchmark of `perf/tokenize.rs` once with tiny prompts, so the
//! benchmarks build and run in the normal test pass and cannot rot. Speed is not asserted;
//! every benchmark must produce a result (its checksum). Needs Qwen3's files
//! (`scripts/fetch-tokenizers.sh`; required when `KVGATE_REQUIRE_TOKENIZER_FIXTURES` is set).

use std::time::Duration;

use criterion::Criterion;

#[path = "../perf/tokenize.rs"]
#[allow(dead_code)]
mod bench;

#[test]
fn every_tokenize_benchmark_runs_with_tiny_prompts() {
    let mut criterion = Criterion::default()
        .sample_size(10)
        .nresamples(10)
        .warm_up_time(Duration::from_millis(1))
        .measurement_time(Duration::from_millis(5))
        .without_plots();
    let Some([encode, tokenize, prepare, memory]) =
        bench::run_all(&mut criterion, &bench::Sizes::tiny())
    else {
        let message = "Qwen3's tokenizer files are missing: run scripts/fetch-tokenizers.sh";
        assert!(
            std::env::var_os("KVGATE_REQUIRE_TOKENIZER_FIXTURES").is_none(),
            "{message}"
        );
        eprintln!("skipped: {message}");
        return;
    };
    assert!(encode > 0, "no corpus was encoded");
    assert!(tokenize > 0, "no prompt was tokenized");
    assert!(prepare > 0, "no request was prepared");
    assert!(memory > 0, "the cache held nothing");
}
