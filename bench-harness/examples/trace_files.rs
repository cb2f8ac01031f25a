//! Writes one trace file per replay format with prompts of the same length
//! (`bench_harness::replay::samples`), for perf/results-replay.md's "Real prompts" section:
//!
//! ```text
//! cargo run --release -p bench-harness --example trace_files -- OUT_DIR LINES TOKENS
//! ```

use std::path::Path;

use bench_harness::replay::samples::write_samples;

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (Some(dir), Some(lines), Some(tokens)) = (
        args.first(),
        args.get(1).and_then(|a| a.parse::<u64>().ok()),
        args.get(2).and_then(|a| a.parse::<u64>().ok()),
    ) else {
        eprintln!("usage: trace_files OUT_DIR LINES TOKENS");
        std::process::exit(2);
    };
    if let Err(e) = write_samples(Path::new(dir), lines, tokens) {
        eprintln!("Error: {dir}: {e}");
        std::process::exit(1);
    }
    eprintln!("wrote the sample traces to {dir}");
}
