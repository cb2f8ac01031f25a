//! The trace parsers on the fixture slices: valid rows read exactly, malformed lines skipped,
//! counted and named by line number, hash ids expanded to equal content and exact lengths, and
//! `--loop` passes made of fresh content after the previous pass.

use std::collections::HashSet;
use std::path::PathBuf;

use bench_harness::replay::content::Prompt;
use bench_harness::replay::trace::{expand_hash_ids, TraceFormat, TraceWorkload};
use bench_harness::replay::workload::{Limited, WorkItem, Workload};

fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("fixtures")
        .join(name)
}

fn read_all(name: &str, format: TraceFormat) -> (Vec<WorkItem>, TraceWorkload) {
    let mut trace = TraceWorkload::open(&fixture(name), format, false).unwrap();
    let items = std::iter::from_fn(|| trace.next_item()).collect();
    (items, trace)
}

fn prompt(item: &WorkItem) -> &Prompt {
    item.generated().expect("a generated prompt")
}

fn tokens(prompt: &Prompt) -> Vec<u32> {
    prompt.symbols().collect()
}

#[test]
fn mooncake_rows_become_prompts_of_exact_length_with_shared_blocks() {
    let (items, trace) = read_all("mooncake_slice.jsonl", TraceFormat::Mooncake);
    assert_eq!(items.len(), 40);
    assert_eq!(trace.warnings().skipped_lines, 0);
    // Row 1: 6,758 input tokens, 500 output, timestamp 0; row 11 is at 3,000 ms.
    assert_eq!(
        (prompt(&items[0]).len_tokens(), items[0].output_tokens),
        (6758, 500)
    );
    assert_eq!(items[0].arrival_ms, Some(0.0));
    assert_eq!(items[10].arrival_ms, Some(3000.0));
    let (first, second) = (tokens(prompt(&items[0])), tokens(prompt(&items[1])));
    assert_eq!(first.len(), 6758);
    // Both rows start with hash id 0 (512 shared tokens), then differ.
    assert_eq!(first[..512], second[..512]);
    assert_ne!(first[512..1024], second[512..1024]);
}

#[test]
fn equal_hash_ids_give_equal_content_and_lengths_are_exact() {
    let a = expand_hash_ids(&[7, 8, 9], 1100, 0, 1);
    let b = expand_hash_ids(&[7, 8, 10], 1300, 0, 2);
    assert_eq!((a.len_tokens(), b.len_tokens()), (1100, 1300));
    let (ta, tb) = (tokens(&a), tokens(&b));
    assert_eq!(ta[..1024], tb[..1024], "ids 7 and 8 are shared");
    assert_ne!(ta[1024..1100], tb[1024..1100], "id 9 is not id 10");
    // The last block is cut, not padded: 1,100 = 2 × 512 + 76.
    assert_eq!(
        ta[1024..],
        tokens(&expand_hash_ids(&[7, 8, 9], 1100, 0, 99))[1024..]
    );
    // Too few ids for the length: the rest is unique to the request, and the length still exact.
    let short = expand_hash_ids(&[7], 600, 0, 5);
    assert_eq!(short.len_tokens(), 600);
    assert_eq!(tokens(&short)[..512], ta[..512]);
    assert_ne!(
        tokens(&short)[512..],
        tokens(&expand_hash_ids(&[7], 600, 0, 6))[512..]
    );
    // Fewer tokens than ids: cut after the first block.
    assert_eq!(expand_hash_ids(&[7, 8, 9], 100, 0, 1).len_tokens(), 100);
    // A different pass of --loop is different content for the same id.
    assert_ne!(tokens(&expand_hash_ids(&[7], 512, 1, 1)), ta[..512]);
}

#[test]
fn malformed_mooncake_lines_are_skipped_counted_and_named() {
    let (items, trace) = read_all("mooncake_malformed.jsonl", TraceFormat::Mooncake);
    assert_eq!(items.len(), 6, "rows 1-6 of the real trace survive");
    let warnings = trace.warnings();
    assert_eq!(warnings.skipped_lines, 3, "{warnings:?}");
    for (message, line) in warnings.messages.iter().zip([4, 6, 8]) {
        assert!(
            message.contains(&format!("mooncake_malformed.jsonl:{line}:")),
            "{message}"
        );
    }
    assert_eq!(prompt(&items[3]).len_tokens(), 2290);
}

#[test]
fn azure_rows_have_lengths_relative_times_and_no_shared_content() {
    let (items, trace) = read_all("azure_code_slice.csv", TraceFormat::Azure);
    assert_eq!(items.len(), 30);
    assert_eq!(trace.warnings().skipped_lines, 0);
    assert_eq!(
        (prompt(&items[0]).len_tokens(), items[0].output_tokens),
        (4808, 10)
    );
    assert_eq!(items[0].arrival_ms, Some(0.0));
    let second = items[1].arrival_ms.unwrap();
    assert!((second - 52.0).abs() < 0.01, "{second}");
    let (a, b) = (tokens(prompt(&items[0])), tokens(prompt(&items[1])));
    assert_ne!(a[..64], b[..64]);
}

#[test]
fn malformed_azure_lines_are_skipped_counted_and_named() {
    let (items, trace) = read_all("azure_malformed.csv", TraceFormat::Azure);
    assert_eq!(items.len(), 4);
    let warnings = trace.warnings();
    assert_eq!(warnings.skipped_lines, 3, "{warnings:?}");
    for (message, line) in warnings.messages.iter().zip([4, 6, 7]) {
        assert!(
            message.contains(&format!("azure_malformed.csv:{line}:")),
            "{message}"
        );
    }
}

#[test]
fn looping_repeats_the_trace_with_fresh_content_and_later_timestamps() {
    let trace = TraceWorkload::open(
        &fixture("mooncake_slice.jsonl"),
        TraceFormat::Mooncake,
        true,
    )
    .unwrap();
    let mut looped = Limited::new(trace, 100);
    let items: Vec<WorkItem> = std::iter::from_fn(|| looped.next_item()).collect();
    assert_eq!(items.len(), 100, "40-row trace looped to 100 requests");
    let ids: HashSet<u64> = items.iter().map(|i| i.id).collect();
    assert_eq!(ids.len(), 100);
    // Pass 2 starts one mean gap (12,000 ms / 39) after pass 1's last row, at 12,000 ms.
    let pass_two = items[40].arrival_ms.unwrap();
    assert!(
        (pass_two - (12_000.0 + 12_000.0 / 39.0)).abs() < 1e-6,
        "{pass_two}"
    );
    assert!(items.windows(2).all(|w| w[0].arrival_ms <= w[1].arrival_ms));
    // Same row, next pass: same length, different content (a fresh request, not a cache hit).
    assert_eq!(
        prompt(&items[0]).len_tokens(),
        prompt(&items[40]).len_tokens()
    );
    assert_ne!(
        tokens(prompt(&items[0]))[..512],
        tokens(prompt(&items[40]))[..512]
    );
    // Within a pass, the shared system-prompt block is still shared.
    assert_eq!(
        tokens(prompt(&items[40]))[..512],
        tokens(prompt(&items[41]))[..512]
    );
}

#[test]
fn text_prompts_keep_the_sim_engine_tokenizer_contract() {
    use bench_harness::tokenize::tokenize_text;
    let (items, _) = read_all("mooncake_slice.jsonl", TraceFormat::Mooncake);
    let (a, b) = (
        tokenize_text(&prompt(&items[0]).text()),
        tokenize_text(&prompt(&items[1]).text()),
    );
    // T tokens are T words, and the shared first block is an equal token prefix.
    assert_eq!(a.len() as u64, prompt(&items[0]).len_tokens());
    assert_eq!(b.len() as u64, prompt(&items[1]).len_tokens());
    assert_eq!(a[..512], b[..512]);
    assert_ne!(a[512..528], b[512..528]);
}
