//! The integration-test fixtures of the whole workspace (reuse them; keep them general). The
//! kvgate crate's tests include them as `mod utils;`, bench-harness's tests by path
//! (`#[path = "../../tests/utils/mod.rs"]`): they use kvgate's library not at all and
//! bench-harness's only for its process plumbing (`bench_harness::fleet`, a dev-dependency of
//! kvgate), and otherwise only dependencies both crates list (bench-harness has `httparse`,
//! `libc` and `socket2` as dev-dependencies for them).
//!
//! - `process`: free ports, child processes killed on drop, `SimFleet` (a running `sim-engine`,
//!   its fault and stats API) and `Gateway` (a running `kvgate`, its admin API and metrics),
//!   both on loopback and ready when `start` returns.
//! - `client`: a tiny blocking HTTP/1.1 client with timeouts that records when each body
//!   chunk arrived (for streaming assertions, down to SSE lines) and can read cut bodies.
//! - `mock_origin`: a scripted upstream (`MockOrigin`) that counts accepted connections,
//!   records requests, and can delay, stream slowly, close or reset on demand.
//!
//! Every wait is bounded (`TIMEOUT`), so a broken gateway fails a test instead of hanging it.
#![allow(dead_code)]

pub mod client;
pub mod mock_origin;
pub mod process;

use std::time::Duration;

/// A small chat request body.
pub const CHAT: &str = r#"{"model":"m","messages":[{"role":"user","content":"hello"}]}"#;

/// An origin that answers every request with `{"ok":true}`.
pub fn ok_origin() -> mock_origin::MockOrigin {
    mock_origin::MockOrigin::start(|_| mock_origin::Reply::json(r#"{"ok":true}"#))
}

/// Asserts `response` is an error answer of `status` with kvgate's JSON error body (code,
/// message, type).
pub fn assert_error(response: &client::Response, status: u16) {
    assert_eq!(response.status, status, "{}", response.text());
    let body = response.json();
    assert_eq!(body["error"]["code"], status, "{body}");
    assert!(body["error"]["message"].is_string(), "{body}");
    assert!(body["error"]["type"].is_string(), "{body}");
}

/// The longest any fixture waits for anything (start-up, a response, a condition).
pub const TIMEOUT: Duration = Duration::from_secs(10);

/// Polls `condition` every 20 ms until it holds or `timeout` passes; returns whether it held.
pub fn wait_until(timeout: Duration, mut condition: impl FnMut() -> bool) -> bool {
    let deadline = std::time::Instant::now() + timeout;
    while std::time::Instant::now() < deadline {
        if condition() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    condition()
}

/// A chat-completions body for the sim's model: one user message of `content`.
pub fn chat(content: &str, max_tokens: u32, stream: bool) -> String {
    serde_json::json!({
        "model": "sim-model",
        "messages": [{"role": "user", "content": content}],
        "max_tokens": max_tokens,
        "stream": stream,
    })
    .to_string()
}

/// A model's tokenizer directory of `scripts/fetch-tokenizers.sh` (`llama3`, `qwen3`), or
/// `None` with a message when it is absent and `KVGATE_REQUIRE_TOKENIZER_FIXTURES` is unset.
pub fn tokenizer_dir(model: &str) -> Option<std::path::PathBuf> {
    let dir = match std::env::var_os("KVGATE_TOKENIZER_FIXTURES") {
        Some(dir) => std::path::PathBuf::from(dir),
        None => std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("target/tokenizers"),
    }
    .join(model);
    if dir.join("tokenizer.json").is_file() {
        return Some(dir);
    }
    let required = std::env::var_os("KVGATE_REQUIRE_TOKENIZER_FIXTURES").is_some();
    assert!(
        !required,
        "{} is missing: run scripts/fetch-tokenizers.sh",
        dir.display()
    );
    eprintln!("skipped: no tokenizer files (scripts/fetch-tokenizers.sh)");
    None
}

/// The venv of `scripts/fetch-sdk-python.sh`'s Python (the openai and anthropic SDKs), or
/// `None` (with a message) when absent and not required (`KVGATE_REQUIRE_SDK_PYTHON=1`, which
/// the test script sets).
pub fn sdk_python() -> Option<std::path::PathBuf> {
    let root = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let dir = std::env::var("KVGATE_SDK_PYTHON")
        .map(std::path::PathBuf::from)
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
