//! Tool calls and reasoning through kvgate's gRPC front end: a `sim-engine --grpc sglang` whose
//! completions are scripted Qwen3 output (`--grpc-completion-ids`: `<think>` reasoning and
//! `<tool_call>` markup as the Qwen3 tokenizer's IDs) behind a gateway with the Qwen3 tokenizer
//! and `--tool-call-parser qwen --reasoning-parser qwen3`. The OpenAI shapes are checked field
//! by field, streamed and not; markup that does not parse comes back as content and is counted
//! in `/metrics`; and the official openai and anthropic Python SDKs run their tool-calling loops
//! (`tests/fixtures/sdk_tools_client.py`) through it.

mod utils;

use std::path::PathBuf;
use std::process::Command;
use std::sync::Mutex;

use serde_json::{json, Value};
use utils::process::{Gateway, SimFleet};

const TOOL_CALL: &str = "<think>\nThe user wants the weather; I will call the tool.\n</think>\n\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>";
const ANSWER: &str = "<think>\nThe tool answered.\n</think>\n\nIt is 18 degrees in Paris.";
const BROKEN: &str = "Sure. <tool_call>\n{not json}\n</tool_call>";

/// The Qwen3 tokenizer's folder (`scripts/fetch-tokenizers.sh`), or `None` when absent.
fn qwen3() -> Option<PathBuf> {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("target/tokenizers/qwen3");
    if dir.join("tokenizer.json").exists() {
        return Some(dir);
    }
    eprintln!("skipped: no Qwen3 tokenizer (scripts/fetch-tokenizers.sh)");
    None
}

/// `text` as the Qwen3 tokenizer's IDs, comma-separated (`--grpc-completion-ids`).
fn ids(dir: &std::path::Path, text: &str) -> String {
    let tokenizer =
        tokenizers::Tokenizer::from_file(dir.join("tokenizer.json")).expect("tokenizer");
    let encoding = tokenizer.encode(text, false).expect("encodes");
    let ids: Vec<String> = encoding.get_ids().iter().map(u32::to_string).collect();
    ids.join(",")
}

/// One fleet at a time: each gateway loads the Qwen3 tokenizer, which in a debug build on a
/// loaded machine can outlast the start timeout when three do it at once.
static SERIAL: Mutex<()> = Mutex::new(());

/// A one-engine gRPC fleet answering with `completions` in turn, and a gateway in front.
fn fleet(dir: &std::path::Path, completions: &[&str]) -> (SimFleet, Gateway) {
    let lists: Vec<String> = completions.iter().map(|c| ids(dir, c)).collect();
    let mut args = vec!["--grpc", "sglang"];
    for list in &lists {
        args.extend(["--grpc-completion-ids", list.as_str()]);
    }
    let sim = SimFleet::start(1, &args);
    let url = format!("grpc://127.0.0.1:{}", sim.port(0));
    let path = dir.display().to_string();
    let gateway = Gateway::start(
        &[url],
        &[
            "--tokenizer-path",
            &path,
            "--tool-call-parser",
            "qwen",
            "--reasoning-parser",
            "qwen3",
        ],
    );
    (sim, gateway)
}

fn chat(stream: bool) -> String {
    json!({
        "model": "sim-model",
        "messages": [{"role": "user", "content": "What is the weather in Paris?"}],
        "tools": [{"type": "function", "function": {"name": "get_weather",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}],
        "max_tokens": 200,
        "stream": stream,
    })
    .to_string()
}

#[test]
fn tool_calls_and_reasoning_come_back_in_openai_shape_streamed_and_not() {
    let Some(dir) = qwen3() else {
        return;
    };
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let (_sim, gateway) = fleet(&dir, &[TOOL_CALL]);
    let response = gateway
        .client()
        .post_json("/v1/chat/completions", &chat(false));
    assert_eq!(response.status, 200, "{}", response.text());
    let body = response.json();
    let choice = &body["choices"][0];
    assert_eq!(choice["finish_reason"], "tool_calls", "{body}");
    let message = &choice["message"];
    assert_eq!(message["content"], Value::Null, "{body}");
    assert_eq!(
        message["reasoning_content"],
        "The user wants the weather; I will call the tool.\n"
    );
    let call = &message["tool_calls"][0];
    assert_eq!(call["function"]["name"], "get_weather");
    let arguments: Value =
        serde_json::from_str(call["function"]["arguments"].as_str().expect("a string"))
            .expect("JSON arguments");
    assert_eq!(arguments, json!({"city": "Paris"}));

    let response = gateway
        .client()
        .post_json("/v1/chat/completions", &chat(true));
    assert_eq!(response.status, 200);
    let (mut name, mut args, mut reasoning, mut content, mut finish) = (
        String::new(),
        String::new(),
        String::new(),
        String::new(),
        None,
    );
    for data in response.sse_data() {
        if data == "[DONE]" {
            continue;
        }
        let chunk: Value = serde_json::from_str(data).expect("a JSON chunk");
        let choice = &chunk["choices"][0];
        let delta = &choice["delta"];
        reasoning.push_str(delta["reasoning_content"].as_str().unwrap_or(""));
        content.push_str(delta["content"].as_str().unwrap_or(""));
        if let Some(call) = delta["tool_calls"].get(0) {
            name.push_str(call["function"]["name"].as_str().unwrap_or(""));
            args.push_str(call["function"]["arguments"].as_str().unwrap_or(""));
        }
        if let Some(reason) = choice["finish_reason"].as_str() {
            finish = Some(reason.to_owned());
        }
    }
    assert_eq!(
        reasoning,
        "The user wants the weather; I will call the tool.\n"
    );
    assert_eq!(content, "", "no markup leaks as content");
    assert_eq!(name, "get_weather");
    assert_eq!(
        serde_json::from_str::<Value>(&args).expect("JSON"),
        json!({"city": "Paris"})
    );
    assert_eq!(finish.as_deref(), Some("tool_calls"));
    assert_eq!(gateway.metric("kvgate_tool_parse_failures_total"), 0.0);
}

#[test]
fn markup_that_does_not_parse_comes_back_as_content_and_is_counted() {
    let Some(dir) = qwen3() else {
        return;
    };
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let (_sim, gateway) = fleet(&dir, &[BROKEN]);
    let body = gateway
        .client()
        .post_json("/v1/chat/completions", &chat(false))
        .json();
    assert_eq!(body["choices"][0]["message"]["content"], BROKEN, "{body}");
    assert_eq!(body["choices"][0]["finish_reason"], "stop");
    assert!(body["choices"][0]["message"].get("tool_calls").is_none());
    assert_eq!(gateway.metric("kvgate_tool_parse_failures_total"), 1.0);
}

/// The venv of `scripts/fetch-sdk-python.sh`'s Python, or `None` (with a message) when absent
/// and not required (`KVGATE_REQUIRE_SDK_PYTHON=1`).
fn sdk_python() -> Option<PathBuf> {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let dir = std::env::var("KVGATE_SDK_PYTHON")
        .map(PathBuf::from)
        .unwrap_or_else(|_| root.join("target/sdk-python"));
    let python = dir.join("venv/bin/python");
    if python.exists() {
        return Some(python);
    }
    let required = std::env::var("KVGATE_REQUIRE_SDK_PYTHON").is_ok_and(|v| v == "1");
    assert!(!required, "no venv: run scripts/fetch-sdk-python.sh");
    eprintln!("skipped: no venv (scripts/fetch-sdk-python.sh)");
    None
}

#[test]
fn the_openai_and_anthropic_sdks_run_their_tool_loops_through_grpc_workers() {
    let (Some(dir), Some(python)) = (qwen3(), sdk_python()) else {
        return;
    };
    // The engine answers a tool call, then (with the tool's result) the answer, in turn.
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let (_sim, gateway) = fleet(&dir, &[TOOL_CALL, ANSWER]);
    let script =
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/sdk_tools_client.py");
    let output = Command::new(python)
        .arg(script)
        .arg(format!("http://127.0.0.1:{}", gateway.port))
        .arg("sim-model")
        .output()
        .expect("the SDK client runs");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "the SDK client failed:\n{stderr}");
    let got: Value = serde_json::from_slice(&output.stdout).expect("one JSON line");
    let weather = json!([["get_weather", {"city": "Paris"}]]);
    assert_eq!(got["openai_finish"], "tool_calls", "{got}");
    assert_eq!(got["openai_calls"], weather, "{got}");
    assert_eq!(
        got["openai_reasoning"],
        "The user wants the weather; I will call the tool.\n"
    );
    assert_eq!(got["openai_answer"], "It is 18 degrees in Paris.", "{got}");
    assert_eq!(got["openai_answer_finish"], "stop");
    assert_eq!(got["openai_stream_finish"], "tool_calls", "{got}");
    assert_eq!(got["openai_stream_calls"], weather, "{got}");
    assert_eq!(got["openai_stream_content"], "");
    assert_eq!(
        got["openai_stream_reasoning"],
        "The user wants the weather; I will call the tool.\n"
    );
    assert_eq!(got["openai_stream_answer"], "It is 18 degrees in Paris.");
    assert_eq!(got["anthropic_stop"], "tool_use", "{got}");
    assert_eq!(
        got["anthropic_blocks"],
        json!(["thinking", "tool_use"]),
        "{got}"
    );
    assert_eq!(got["anthropic_calls"], weather, "{got}");
    assert_eq!(
        got["anthropic_answer"], "It is 18 degrees in Paris.",
        "{got}"
    );
    assert_eq!(got["anthropic_stream_stop"], "tool_use", "{got}");
    assert_eq!(
        got["anthropic_stream_blocks"],
        json!(["thinking", "tool_use"]),
        "{got}"
    );
    assert_eq!(got["anthropic_stream_calls"], weather, "{got}");
    assert_eq!(
        got["anthropic_stream_thinking"],
        "The user wants the weather; I will call the tool.\n"
    );
}
