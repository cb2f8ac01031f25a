//! Real prompts: captured request logs (`openai-log`), ShareGPT conversations (JSONL and one JSON
//! array) and token-id traces, from the fixtures written for these tests. At the workload level:
//! every valid line becomes one request, in order, with its arrival time; bad lines are counted by
//! kind and named by line number; `--loop` passes are fresh content. Through the `replay` binary:
//! against a real `sim-engine`, whose counters say what it received (requests, prompt and output
//! tokens, cached tokens), and against a recording origin, which keeps every body in order. The
//! benchmark of perf/results-replay.md runs here with small files (`samples`).

#[path = "../../tests/utils/mod.rs"]
mod utils;

use std::path::PathBuf;
use std::process::Command;

use bench_harness::replay::captured::CapturedEndpoint;
use bench_harness::replay::samples::{write_samples, SAMPLE_FILES, SAMPLE_TOKENIZER};
use bench_harness::replay::sharegpt::{ShareGptOptions, ShareGptWorkload};
use bench_harness::replay::token_ids::TokenDecoder;
use bench_harness::replay::trace::{TraceFormat, TraceWorkload};
use bench_harness::replay::workload::{Content, Limited, WorkItem, Workload};
use serde_json::{json, Value};
use utils::mock_origin::{MockOrigin, Reply};
use utils::process::{workspace_bin, SimFleet};

fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("fixtures")
        .join(name)
}

fn drain(workload: &mut dyn Workload) -> Vec<WorkItem> {
    std::iter::from_fn(|| workload.next_item()).collect()
}

fn trace(name: &str, format: TraceFormat) -> TraceWorkload {
    TraceWorkload::open(&fixture(name), format, false).unwrap()
}

fn sharegpt(name: &str, active_conversations: usize, repeat: bool) -> ShareGptWorkload {
    let options = ShareGptOptions {
        active_conversations,
        seed: 1,
        repeat,
    };
    ShareGptWorkload::open(&fixture(name), options).unwrap()
}

/// The skipped line numbers named in the warnings, and the counts by kind.
fn skipped(workload: &dyn Workload, file: &str) -> (Vec<u64>, Vec<(String, u64)>) {
    let warnings = workload.warnings();
    let lines = warnings
        .messages
        .iter()
        .map(|m| {
            let rest = m.split_once(&format!("{file}:")).unwrap().1;
            rest.split(':').next().unwrap().parse().unwrap()
        })
        .collect();
    let kinds = warnings.skipped_by_kind.clone().into_iter().collect();
    assert_eq!(warnings.skipped_lines, warnings.messages.len() as u64);
    (lines, kinds)
}

fn kinds(pairs: &[(&str, u64)]) -> Vec<(String, u64)> {
    pairs.iter().map(|(k, n)| (k.to_string(), *n)).collect()
}

/// The captured bodies of the fixture's valid lines, in file order.
fn captured_bodies() -> Vec<(String, Value)> {
    let text = std::fs::read_to_string(fixture("openai_log.jsonl")).unwrap();
    [1, 2, 4, 6, 9, 10]
        .iter()
        .map(|&n| {
            let line: Value = serde_json::from_str(text.lines().nth(n - 1).unwrap()).unwrap();
            (
                line["endpoint"].as_str().unwrap().to_string(),
                line["body"].clone(),
            )
        })
        .collect()
}

fn chat_texts(item: &WorkItem) -> Vec<String> {
    match &item.content {
        Content::Chat(chat) => chat.turns().iter().map(|t| t.text()).collect(),
        other => panic!("not chat: {other:?}"),
    }
}

#[test]
fn a_captured_log_keeps_every_valid_request_in_order_with_its_time() {
    let mut log = trace("openai_log.jsonl", TraceFormat::OpenaiLog);
    let items = drain(&mut log);
    let sent: Vec<(String, Value)> = items
        .iter()
        .map(|item| match &item.content {
            Content::Captured(r) => (r.endpoint.path().to_string(), r.body_value()),
            other => panic!("not captured: {other:?}"),
        })
        .collect();
    assert_eq!(sent, captured_bodies());
    let arrivals: Vec<f64> = items.iter().map(|i| i.arrival_ms.unwrap()).collect();
    assert_eq!(arrivals, vec![0.0, 50.0, 100.0, 200.0, 300.0, 400.0]);
    let outputs: Vec<u32> = items.iter().map(|i| i.output_tokens).collect();
    assert_eq!(outputs, vec![5, 2, 4, 7, 3, 1]);
    let (lines, by_kind) = skipped(&log, "openai_log.jsonl");
    assert_eq!(lines, vec![3, 5, 8, 11]);
    let expected = [("malformed", 2), ("out_of_bounds", 1), ("unsupported", 1)];
    assert_eq!(by_kind, kinds(&expected));
}

#[test]
fn a_looped_captured_log_is_fresh_text_and_ids_on_the_next_pass() {
    let log = TraceWorkload::open(&fixture("openai_log.jsonl"), TraceFormat::OpenaiLog, true);
    let mut looped = Limited::new(log.unwrap(), 12);
    let items = drain(&mut looped);
    assert_eq!(items.len(), 12);
    let body = |i: usize| match &items[i].content {
        Content::Captured(r) => r.body_value(),
        other => panic!("{other:?}"),
    };
    assert_eq!(
        body(6)["messages"][0]["content"],
        "loop-1 you are a terse assistant"
    );
    assert_eq!(body(7)["prompt"], "loop-1 once upon a time there was");
    assert_eq!(body(11)["input_ids"][0], 1);
    assert_eq!(body(11)["input_ids"][1], 11);
    // The second pass starts one mean gap (400 / 5 ms) after the first pass's last request.
    assert_eq!(items[6].arrival_ms, Some(480.0));
}

#[test]
fn sharegpt_answers_become_requests_whose_history_is_the_data() {
    for (file, bad_lines) in [
        ("sharegpt.jsonl", vec![2, 4, 6]),
        ("sharegpt_array.json", vec![23, 41, 63]),
    ] {
        let mut conversations = sharegpt(file, 1, false);
        let items = drain(&mut conversations);
        let texts: Vec<Vec<String>> = items.iter().map(chat_texts).collect();
        let first = "alpha bravo charlie delta echo foxtrot golf hotel india juliet";
        let expected = vec![
            vec![first.to_string()],
            vec![
                first.to_string(),
                "kilo lima mike".into(),
                "november oscar papa quebec".into(),
            ],
            vec!["sys words here".into(), "tango uniform".into()],
            vec!["zulu one two".into()],
        ];
        assert_eq!(texts, expected, "{file}");
        let outputs: Vec<u32> = items.iter().map(|i| i.output_tokens).collect();
        assert_eq!(outputs, vec![3, 2, 4, 1], "answer lengths in words, {file}");
        assert!(items.iter().all(|i| i.arrival_ms.is_none()));
        assert_eq!(items[0].tenant_key, items[1].tenant_key);
        let (lines, by_kind) = skipped(&conversations, file);
        assert_eq!(lines, bad_lines, "{file}");
        assert_eq!(by_kind, kinds(&[("malformed", 1), ("unsupported", 2)]));
    }
}

#[test]
fn sharegpt_conversations_interleave_by_seed_each_in_order() {
    let order = |seed: u64| {
        let options = ShareGptOptions {
            active_conversations: 3,
            seed,
            repeat: true,
        };
        let workload = ShareGptWorkload::open(&fixture("sharegpt.jsonl"), options).unwrap();
        let items = drain(&mut Limited::new(workload, 40));
        items.iter().map(chat_texts).collect::<Vec<_>>()
    };
    let one = order(7);
    assert_eq!(one, order(7), "the same seed, the same order");
    assert_ne!(one, order(8), "another seed, another interleaving");
    assert_eq!(one.len(), 40, "--loop reads the file again");
    // Within a conversation the second request still follows the first, in every pass.
    for pass in 0..10 {
        let marker = if pass == 0 {
            String::new()
        } else {
            format!("loop-{pass} ")
        };
        let first = format!("{marker}alpha bravo");
        let position = |turns: usize| {
            one.iter()
                .position(|t| t.len() == turns && t[0].starts_with(&first))
        };
        if let (Some(a), Some(b)) = (position(1), position(3)) {
            assert!(a < b, "pass {pass}: {a} {b}");
        }
    }
    // Each pass is new text to the caches: pass 1's first turn is marked.
    assert!(one.iter().any(|t| t[0].starts_with("loop-1 alpha")));
}

#[test]
fn token_id_lines_become_input_ids_with_arrival_times() {
    let mut ids = trace("token_ids.jsonl", TraceFormat::TokenIds);
    let items = drain(&mut ids);
    let prompts: Vec<Vec<u32>> = items
        .iter()
        .map(|i| match &i.content {
            Content::TokenIds(ids) => ids.ids().collect(),
            other => panic!("{other:?}"),
        })
        .collect();
    let expected = vec![
        vec![1, 2, 3, 4, 1, 5],
        vec![1, 2, 3, 4, 1, 5, 11, 13],
        vec![6, 7, 8, 9, 10],
        vec![6, 99],
    ];
    assert_eq!(prompts, expected);
    let arrivals: Vec<f64> = items.iter().map(|i| i.arrival_ms.unwrap()).collect();
    assert_eq!(arrivals, vec![0.0, 20.0, 100.0, 150.0]);
    let outputs: Vec<u32> = items.iter().map(|i| i.output_tokens).collect();
    assert_eq!(outputs, vec![3, 2, 4, 1]);
    let (lines, by_kind) = skipped(&ids, "token_ids.jsonl");
    assert_eq!(lines, vec![3, 4, 7]);
    assert_eq!(by_kind, kinds(&[("malformed", 3)]));
}

#[test]
fn a_tokenizer_file_decodes_token_ids_to_their_words() {
    let decoder = TokenDecoder::from_file(&fixture("tokenizer_wordlevel.json")).unwrap();
    let mut ids = trace("token_ids.jsonl", TraceFormat::TokenIds).decoding_with(decoder);
    let items = drain(&mut ids);
    let texts: Vec<Vec<String>> = items.iter().map(chat_texts).collect();
    let expected = vec![
        vec!["the cat sat on the mat".to_string()],
        vec!["the cat sat on the mat and slept".to_string()],
        vec!["a dog ran far away".to_string()],
    ];
    assert_eq!(texts, expected);
    // Id 99 is outside the 20-word vocabulary: that line is skipped, not sent as nonsense.
    let (lines, by_kind) = skipped(&ids, "token_ids.jsonl");
    assert_eq!(lines, vec![3, 4, 6, 7]);
    assert_eq!(by_kind, kinds(&[("malformed", 3), ("out_of_bounds", 1)]));
    assert!(TokenDecoder::from_file(&fixture("token_ids.jsonl")).is_err());
}

/// Runs the `replay` binary against `gateway`; returns its JSON report.
fn replay(gateway: &str, args: &[&str]) -> Value {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("report.json");
    let output = Command::new(workspace_bin("replay"))
        .args(["--gateway", gateway, "--no-progress", "--timeout-s", "10"])
        .arg("--out")
        .arg(&out)
        .args(args)
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "replay {args:?}: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    serde_json::from_str(&std::fs::read_to_string(&out).unwrap()).unwrap()
}

fn fixture_arg(name: &str) -> String {
    fixture(name).display().to_string()
}

/// Engine 0's counters of what it received.
fn engine_totals(fleet: &SimFleet) -> [u64; 4] {
    let stats = fleet.stats(0);
    let field = |name: &str| stats[name].as_u64().unwrap();
    [
        field("requests_finished"),
        field("prompt_tokens_total"),
        field("generation_tokens_total"),
        field("cached_tokens_total"),
    ]
}

/// 4-token pages, fast simulated time.
const SIM_ARGS: [&str; 4] = ["--page-size", "4", "--speedup", "100"];

#[test]
fn sim_engine_receives_every_captured_request_with_the_output_cap() {
    let fleet = SimFleet::start(1, &SIM_ARGS);
    let log = fixture_arg("openai_log.jsonl");
    let report = replay(
        &fleet.url(0),
        &[
            "--trace",
            &log,
            "--trace-format",
            "openai-log",
            "--speedup",
            "10",
            "--output-cap",
            "3",
        ],
    );
    assert_eq!(
        (report["requests"].as_u64(), report["errors"].as_u64()),
        (Some(6), Some(0))
    );
    assert_eq!(report["trace_format"], "openai-log");
    assert_eq!(report["skipped_lines"], 4);
    assert_eq!(
        report["skipped_by_kind"],
        json!({"malformed": 2, "out_of_bounds": 1, "unsupported": 1})
    );
    // Prompt words 8 + 6 + 4 + 3 + 4 (Anthropic system and message) + 8 ids; outputs 5, 2, 4, 7,
    // 3, 1 capped at 3.
    assert_eq!(engine_totals(&fleet)[..3], [6, 33, 15]);
}

#[test]
fn sim_engine_sees_a_sharegpt_conversation_grow_and_hits_its_first_turn() {
    let fleet = SimFleet::start(1, &SIM_ARGS);
    let file = fixture_arg("sharegpt_array.json");
    let report = replay(
        &fleet.url(0),
        &[
            "--trace",
            &file,
            "--trace-format",
            "sharegpt",
            "--concurrency",
            "1",
            "--active-conversations",
            "1",
        ],
    );
    assert_eq!(
        (report["requests"].as_u64(), report["errors"].as_u64()),
        (Some(4), Some(0))
    );
    assert_eq!(report["trace_format"], "sharegpt");
    assert_eq!(report["skipped_lines"], 3);
    // Prompts of 10, 10 + 3 + 4, 3 + 2 and 3 words; answers of 3, 2, 4 and 1 words. The second
    // request starts with the first one's 10 words: two whole 4-token pages are cached.
    assert_eq!(engine_totals(&fleet), [4, 35, 10, 8]);
    assert_eq!(report["cached_tokens"], 8);
}

#[test]
fn sim_engine_receives_token_ids_as_ids_or_as_decoded_text() {
    let ids = fixture_arg("token_ids.jsonl");
    let tokenizer = fixture_arg("tokenizer_wordlevel.json");
    let as_ids = [
        "--trace",
        &ids,
        "--trace-format",
        "token-ids",
        "--concurrency",
        "1",
    ];
    let fleet = SimFleet::start(1, &SIM_ARGS);
    let report = replay(&fleet.url(0), &as_ids);
    assert_eq!(
        (
            report["requests"].as_u64(),
            report["skipped_lines"].as_u64()
        ),
        (Some(4), Some(3))
    );
    // 6 + 8 + 5 + 2 ids; the second prompt repeats the first one's 6 ids: one page cached.
    assert_eq!(engine_totals(&fleet), [4, 21, 10, 4]);
    let fleet = SimFleet::start(1, &SIM_ARGS);
    let as_text = [
        &as_ids[..],
        &["--tokenizer-path", &tokenizer, "--form", "completions"],
    ]
    .concat();
    let report = replay(&fleet.url(0), &as_text);
    assert_eq!(
        (
            report["requests"].as_u64(),
            report["skipped_lines"].as_u64()
        ),
        (Some(3), Some(4))
    );
    // One word per id: the engine counts the same tokens, and the shared page again.
    assert_eq!(engine_totals(&fleet), [3, 19, 9, 4]);
}

/// A recording origin answering every request with a small JSON completion.
fn recording_origin() -> MockOrigin {
    MockOrigin::start(|_| Reply::json(r#"{"usage":{"prompt_tokens":1,"completion_tokens":1}}"#))
}

fn bodies(origin: &MockOrigin) -> Vec<(String, Value)> {
    let requests = origin.requests();
    let body = |b: &[u8]| serde_json::from_slice::<Value>(b).unwrap();
    requests
        .iter()
        .map(|r| (r.path.clone(), body(&r.body)))
        .collect()
}

#[test]
fn the_origin_receives_captured_bodies_as_captured_in_order() {
    let origin = recording_origin();
    let log = fixture_arg("openai_log.jsonl");
    let args = [
        "--trace",
        &log,
        "--trace-format",
        "openai-log",
        "--concurrency",
        "1",
    ];
    let report = replay(&origin.url(), &args);
    assert_eq!(report["requests"], 6);
    assert_eq!(bodies(&origin), captured_bodies());
    // --model replaces the model of every body that names one, and --output-cap lowers lengths.
    let origin = recording_origin();
    let capped = [&args[..], &["--model", "sim-model", "--output-cap", "2"]].concat();
    replay(&origin.url(), &capped);
    let received = bodies(&origin);
    let chat = CapturedEndpoint::ChatCompletions.path();
    assert_eq!(received[0].0, chat);
    assert_eq!(
        (&received[0].1["model"], &received[0].1["max_tokens"]),
        (&json!("sim-model"), &json!(2))
    );
    assert_eq!(
        received[2].1["sampling_params"],
        json!({"max_new_tokens": 2, "temperature": 0})
    );
    assert_eq!(received[3].1["max_completion_tokens"], 2);
    assert_eq!(received[4].1["model"], "sim-model");
    assert_eq!(received[5].1.get("model"), None, "/generate names no model");
}

#[test]
fn the_origin_sees_the_second_sharegpt_request_carry_the_first_turn() {
    let origin = recording_origin();
    let file = fixture_arg("sharegpt.jsonl");
    let args = [
        "--trace",
        &file,
        "--trace-format",
        "sharegpt",
        "--concurrency",
        "1",
        "--active-conversations",
        "1",
        "--output-cap",
        "2",
    ];
    replay(&origin.url(), &args);
    let received = bodies(&origin);
    assert_eq!(received.len(), 4);
    assert!(received
        .iter()
        .all(|(path, _)| path == "/v1/chat/completions"));
    let first = &received[0].1;
    let second = &received[1].1;
    assert_eq!(first["messages"].as_array().unwrap().len(), 1);
    assert_eq!(second["messages"][0], first["messages"][0]);
    assert_eq!(
        second["messages"][1],
        json!({"role": "assistant", "content": "kilo lima mike"})
    );
    assert_eq!(second["messages"][2]["role"], "user");
    assert_eq!(
        (&first["max_tokens"], &second["max_tokens"]),
        (&json!(2), &json!(2))
    );
    assert_eq!(second["model"], "sim-model");
}

#[test]
fn the_benchmark_samples_replay_with_equal_prompt_lengths_in_every_format() {
    let dir = tempfile::tempdir().unwrap();
    write_samples(dir.path(), 40, 600).unwrap();
    let fleet = SimFleet::start(1, &["--instant"]);
    let tokenizer = dir.path().join(SAMPLE_TOKENIZER).display().to_string();
    let mut runs: Vec<(String, Vec<String>)> = SAMPLE_FILES
        .iter()
        .map(|(format, file)| {
            let path = dir.path().join(file).display().to_string();
            let args = vec![
                "--trace".into(),
                path,
                "--trace-format".into(),
                format.to_string(),
            ];
            (format.to_string(), args)
        })
        .collect();
    let mut decoded = runs[3].1.clone();
    decoded.extend(["--tokenizer-path".to_string(), tokenizer]);
    runs.push(("token-ids decoded".into(), decoded));
    let mut checksum = 0;
    for (name, args) in runs {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let report = replay(
            &fleet.url(0),
            &[&args[..], &["--concurrency", "4"]].concat(),
        );
        let requests = report["requests"].as_u64().unwrap();
        assert_eq!(
            (requests, report["errors"].as_u64()),
            (40, Some(0)),
            "{name}"
        );
        let prompt_tokens = report["prompt_tokens"].as_u64().unwrap();
        assert_eq!(
            prompt_tokens,
            40 * 600,
            "{name}: the same prompt lengths in every format"
        );
        checksum += prompt_tokens + report["output_tokens"].as_u64().unwrap();
    }
    println!("checksum {checksum}");
    assert_eq!(checksum, 5 * 40 * (600 + 16));
}
