//! Interoperability with a gRPC engine that is not kvgate's: a Python `grpcio` server built from
//! PyPI's `smg-grpc-proto` stubs (`tests/fixtures/grpc_engine_server.py`, SGLang's protocol).
//! kvgate detects its backend, probes it, routes `/generate` to it streamed and not, and a
//! client that goes makes the server see the call cancelled and an `Abort`. kvgate follows the
//! server's `SubscribeKvEvents` stream into its KV-event index (and routes on it), sends
//! `--api-key` on every call to a server that checks it, and stops an output at the EOS IDs of
//! its `GetModelInfo`.
//!
//! Needs the venv of `scripts/fetch-grpc-python.sh` (the test script runs it). Without it the
//! test says so and passes, unless `KVGATE_REQUIRE_GRPC_PYTHON=1` (the test script sets it).

mod utils;

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};

use utils::process::{free_port, wait_for_port, Gateway};
use utils::{wait_until, TIMEOUT};

/// The venv's Python, or `None` (with a message) when absent and not required.
fn python() -> Option<PathBuf> {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let dir = std::env::var("KVGATE_GRPC_PYTHON")
        .map(PathBuf::from)
        .unwrap_or_else(|_| root.join("target/grpc-python"));
    let python = dir.join("venv/bin/python");
    if python.exists() {
        return Some(python);
    }
    let required = std::env::var("KVGATE_REQUIRE_GRPC_PYTHON").is_ok_and(|v| v == "1");
    assert!(!required, "no venv: run scripts/fetch-grpc-python.sh");
    eprintln!("skipped: no venv (scripts/fetch-grpc-python.sh)");
    None
}

/// The Python server, killed when dropped; its stdout lines collected.
struct PythonEngine {
    child: Child,
    port: u16,
    lines: Arc<Mutex<Vec<String>>>,
}

impl PythonEngine {
    fn start(python: &PathBuf) -> PythonEngine {
        PythonEngine::start_with(python, "{}")
    }

    /// With the script's CONFIG_JSON (KV events to stream, an API key to require).
    fn start_with(python: &PathBuf, config: &str) -> PythonEngine {
        let port = free_port();
        let script =
            PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/grpc_engine_server.py");
        let mut child = Command::new(python)
            .arg(script)
            .arg(port.to_string())
            .arg(config)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .spawn()
            .expect("the Python engine starts");
        let stdout = child.stdout.take().expect("piped stdout");
        let lines = Arc::new(Mutex::new(Vec::new()));
        let collected = lines.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                collected.lock().unwrap().push(line);
            }
        });
        let engine = PythonEngine { child, port, lines };
        assert!(
            wait_until(TIMEOUT, || engine.saw("ready")) && wait_for_port(port, TIMEOUT),
            "the Python engine did not start"
        );
        engine
    }

    fn url(&self) -> String {
        format!("grpc://127.0.0.1:{}", self.port)
    }

    fn saw(&self, line: &str) -> bool {
        self.lines.lock().unwrap().iter().any(|l| l == line)
    }

    fn saw_prefix(&self, prefix: &str) -> bool {
        self.lines
            .lock()
            .unwrap()
            .iter()
            .any(|l| l.starts_with(prefix))
    }
}

impl Drop for PythonEngine {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn generate(first: u32, max_new_tokens: u32, stream: bool, rid: &str) -> String {
    serde_json::json!({
        "input_ids": [first, 2, 3],
        "sampling_params": {"max_new_tokens": max_new_tokens},
        "stream": stream,
        "rid": rid,
    })
    .to_string()
}

#[test]
fn kvgate_routes_streams_and_aborts_on_a_grpcio_engine() {
    let Some(python) = python() else { return };
    let engine = PythonEngine::start(&python);
    let gateway = Gateway::start(&[engine.url()], &[]);
    let mut client = gateway.client();

    let response = client.post_json("/generate", &generate(7, 4, false, "py-1"));
    assert_eq!(response.status, 200, "{}", response.text());
    let body = response.json();
    assert_eq!(
        body["output_ids"],
        serde_json::json!([1007, 1008, 1009, 1010]),
        "{body}"
    );
    assert_eq!(
        body["meta_info"]["finish_reason"]["type"], "length",
        "{body}"
    );
    assert_eq!(body["meta_info"]["prompt_tokens"], 3, "{body}");

    let response = client.post_json("/generate", &generate(1, 3, true, "py-2"));
    assert_eq!(response.status, 200);
    let data = response.sse_data();
    assert_eq!(data.last(), Some(&"[DONE]"), "{data:?}");
    let last: serde_json::Value = serde_json::from_str(data[data.len() - 2]).unwrap();
    assert_eq!(
        last["output_ids"],
        serde_json::json!([1001, 1002, 1003]),
        "{last}"
    );

    // The model came from GetModelInfo: a request naming it is served.
    let named = serde_json::json!({"model": "py-model", "input_ids": [4, 5], "sampling_params": {"max_new_tokens": 1}});
    let routed = wait_until(TIMEOUT, || {
        gateway
            .client()
            .post_json("/generate", &named.to_string())
            .status
            == 200
    });
    assert!(routed, "a request for the engine's model is routed");

    let mut leaving = gateway.client();
    leaving.send_request(
        "POST",
        "/generate",
        &[("content-type", "application/json")],
        generate(1, 10_000, true, "py-gone").as_bytes(),
    );
    assert_eq!(leaving.read_head_and_first_chunk(), 200);
    leaving.close();
    let seen = wait_until(TIMEOUT, || {
        engine.saw("cancelled py-gone") && engine.saw("abort py-gone")
    });
    assert!(seen, "{:?}", engine.lines.lock().unwrap());
}

/// The Python engine behind a gateway with Qwen3's tokenizer, and the tokenizer library's
/// reading of the same files; `None` (with a message) without the venv or the files.
fn tokenized_gateway() -> Option<(PythonEngine, Gateway, tokenizers::Tokenizer)> {
    let python = python()?;
    let dir = utils::tokenizer_dir("qwen3")?;
    let engine = PythonEngine::start(&python);
    let path = dir.to_string_lossy().to_string();
    let gateway = Gateway::start(&[engine.url()], &["--tokenizer-path", &path]);
    let reference = tokenizers::Tokenizer::from_file(dir.join("tokenizer.json")).unwrap();
    Some((engine, gateway, reference))
}

#[test]
fn openai_answers_from_a_grpcio_engine_are_the_models_text() {
    let Some((engine, gateway, reference)) = tokenized_gateway() else {
        return;
    };

    // A completions prompt of IDs: the engine answers 1007, 1008, ...; the text is what the
    // tokenizer library decodes of them, whole.
    let completion = serde_json::json!({"model": "py-model", "prompt": [7, 8, 9], "max_tokens": 5});
    let response = gateway
        .client()
        .post_json("/v1/completions", &completion.to_string());
    assert_eq!(response.status, 200, "{}", response.text());
    let body = response.json();
    let expected = reference
        .decode(&[1007, 1008, 1009, 1010, 1011], true)
        .unwrap();
    assert_eq!(body["object"], "text_completion", "{body}");
    assert_eq!(body["choices"][0]["text"], expected.as_str(), "{body}");
    assert_eq!(body["choices"][0]["finish_reason"], "length", "{body}");
    assert_eq!(body["usage"]["completion_tokens"], 5, "{body}");

    // A chat, unstreamed and streamed: the same text, in chat's shapes.
    let chat = |stream: bool| {
        serde_json::json!({
            "model": "py-model",
            "messages": [{"role": "user", "content": "hello"}],
            "max_tokens": 6,
            "stream": stream,
        })
        .to_string()
    };
    let response = gateway
        .client()
        .post_json("/v1/chat/completions", &chat(false));
    assert_eq!(response.status, 200, "{}", response.text());
    let body = response.json();
    let content = body["choices"][0]["message"]["content"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    assert!(!content.is_empty(), "{body}");
    assert_eq!(body["choices"][0]["finish_reason"], "length", "{body}");
    let response = gateway
        .client()
        .post_json("/v1/chat/completions", &chat(true));
    assert_eq!(response.status, 200);
    let data = response.sse_data();
    assert_eq!(data.last(), Some(&"[DONE]"), "{data:?}");
    let streamed: String = data[..data.len() - 1]
        .iter()
        .map(|d| serde_json::from_str::<serde_json::Value>(d).unwrap())
        .filter_map(|chunk| {
            chunk["choices"][0]["delta"]["content"]
                .as_str()
                .map(str::to_string)
        })
        .collect();
    assert_eq!(streamed, content);

    // A body the front end refuses is answered 400 with its reason, and no call is made.
    let calls_before = engine.lines.lock().unwrap().len();
    let bad = serde_json::json!({"model": "py-model", "messages": "not a list"});
    let response = gateway
        .client()
        .post_json("/v1/chat/completions", &bad.to_string());
    assert_eq!(response.status, 400, "{}", response.text());
    assert_eq!(engine.lines.lock().unwrap().len(), calls_before);
}

#[test]
fn logprobs_from_a_grpcio_engine_are_in_openais_shape() {
    let Some((_engine, gateway, reference)) = tokenized_gateway() else {
        return;
    };
    let token = |id: u32| reference.decode(&[id], false).unwrap();

    // Completions of a prompt starting with 7: tokens 1007, 1008, 1009, logprobs -0.25, -0.5,
    // -0.75, each with itself and the next ID one nat less likely.
    let body =
        serde_json::json!({"model": "py-model", "prompt": [7, 8], "max_tokens": 3, "logprobs": 2});
    let response = gateway
        .client()
        .post_json("/v1/completions", &body.to_string());
    assert_eq!(response.status, 200, "{}", response.text());
    let logprobs = response.json()["choices"][0]["logprobs"].clone();
    let tokens: Vec<String> = [1007, 1008, 1009].map(token).into();
    assert_eq!(logprobs["tokens"], serde_json::json!(tokens), "{logprobs}");
    assert_eq!(
        logprobs["token_logprobs"],
        serde_json::json!([-0.25, -0.5, -0.75]),
        "{logprobs}"
    );
    let mut top = serde_json::Map::new();
    top.insert(token(1007), serde_json::json!(-0.25));
    top.insert(token(1008), serde_json::json!(-1.25));
    assert_eq!(
        logprobs["top_logprobs"][0],
        serde_json::Value::Object(top),
        "{logprobs}"
    );

    // A streamed chat with top_logprobs 1: one entry per token, in the chunks that carry them.
    let chat = serde_json::json!({
        "model": "py-model",
        "messages": [{"role": "user", "content": "hello"}],
        "max_tokens": 4,
        "logprobs": true,
        "top_logprobs": 1,
        "stream": true,
    });
    let response = gateway
        .client()
        .post_json("/v1/chat/completions", &chat.to_string());
    assert_eq!(response.status, 200, "{}", response.text());
    let data = response.sse_data();
    let entries: Vec<serde_json::Value> = data[..data.len() - 1]
        .iter()
        .map(|d| serde_json::from_str::<serde_json::Value>(d).unwrap())
        .filter_map(|c| c["choices"][0]["logprobs"]["content"].as_array().cloned())
        .flatten()
        .collect();
    let values: Vec<f64> = entries
        .iter()
        .filter_map(|e| e["logprob"].as_f64())
        .collect();
    assert_eq!(values, [-0.25, -0.5, -0.75, -1.0], "{entries:?}");
    assert!(entries
        .iter()
        .all(|e| e["top_logprobs"].as_array().map(Vec::len) == Some(1)));
}

/// Tokens of the Python engine's KV-event family `family`: `blocks` blocks of 16 and a tail.
fn family(family: u32, blocks: usize) -> Vec<u32> {
    (0..(blocks * 16 + 5) as u32)
        .map(|i| family * 1_000_000 + i)
        .collect()
}

#[test]
fn kvgate_follows_a_grpcio_engines_kv_event_stream() {
    let Some(python) = python() else { return };
    // A serves no SubscribeKvEvents (UNIMPLEMENTED); B streams two batches: three blocks of
    // family 1, then a fourth under them.
    let quiet = PythonEngine::start(&python);
    let config = r#"{"kv_family": 1, "kv_blocks": 3, "block_size": 16}"#;
    let publishing = PythonEngine::start_with(&python, config);
    let gateway = Gateway::start(&[quiet.url(), publishing.url()], &[]);
    let url_b = publishing.url();
    let held = format!("kvgate_kv_index_worker_blocks{{worker=\"{url_b}\"}}");
    let applied =
        format!("kvgate_kv_event_batches_total{{worker=\"{url_b}\",outcome=\"applied\"}}");
    let up = format!("kvgate_kv_events_stream_up{{worker=\"{url_b}\"}}");
    assert!(
        wait_until(TIMEOUT, || gateway.metric(&held) == 4.0),
        "{}",
        gateway.metrics()
    );
    assert_eq!(gateway.metric(&applied), 2.0);
    assert_eq!(gateway.metric(&up), 1.0);
    assert!(publishing.saw("subscribe 0"));
    // The quiet engine publishes nothing, so it is not listed among the streams.
    let quiet_up = format!("kvgate_kv_events_stream_up{{worker=\"{}\"}}", quiet.url());
    assert_eq!(
        gateway.metric_value(&quiet_up),
        None,
        "{}",
        gateway.metrics()
    );
    // Routing follows the events: family 1's prompt goes to the engine that cached it, every
    // time, first time included.
    let body = serde_json::json!({
        "input_ids": family(1, 4),
        "sampling_params": {"max_new_tokens": 1},
    })
    .to_string();
    for _ in 0..4 {
        let response = gateway.client().post_json("/generate", &body);
        assert_eq!(response.status, 200, "{}", response.text());
        assert_eq!(response.routed_worker(), Some(url_b.as_str()));
    }
}

#[test]
fn grpc_calls_carry_the_workers_api_key() {
    let Some(python) = python() else { return };
    let engine = PythonEngine::start_with(&python, r#"{"api_key": "sk-py"}"#);
    let gateway = Gateway::start(&[engine.url()], &["--api-key", "sk-py"]);
    assert!(wait_until(TIMEOUT, || gateway.worker_healthy(&engine.url())));
    let body = generate(7, 2, false, "keyed");
    let response = gateway.request("POST", "/generate", &body, Some("sk-py"));
    assert_eq!(response.status, 200, "{}", response.text());
    let stream = generate(7, 2, true, "keyed-stream");
    let response = gateway.request("POST", "/generate", &stream, Some("sk-py"));
    assert_eq!(response.status, 200, "{}", response.text());
    assert!(!engine.saw_prefix("unauthenticated"), "{:?}", engine.lines);

    // The engine does check: a gateway without the key is refused by it.
    let keyless = Gateway::start(&[engine.url()], &[]);
    let response = keyless.client().post_json("/generate", &body);
    assert_ne!(response.status, 200, "{}", response.text());
    assert!(engine.saw_prefix("unauthenticated"), "{:?}", engine.lines);
}

#[test]
fn the_models_eos_ids_from_get_model_info_end_the_output() {
    let Some(python) = python() else { return };
    // The engine streams 1007, 1008, 1009, 1010 and says 1009 is its EOS.
    let engine = PythonEngine::start_with(&python, r#"{"eos_token_ids": [1009]}"#);
    let gateway = Gateway::start(&[engine.url()], &[]);
    // Once the catalog has the model (and its EOS IDs), a request that sets no stop IDs ends
    // at the EOS, as the engine's own front end would end it.
    let named = serde_json::json!({
        "model": "py-model",
        "input_ids": [7, 2, 3],
        "sampling_params": {"max_new_tokens": 4},
    })
    .to_string();
    let mut body = serde_json::Value::Null;
    let ended = wait_until(TIMEOUT, || {
        body = gateway.client().post_json("/generate", &named).json();
        body["meta_info"]["finish_reason"]["type"] == "stop"
    });
    assert!(ended, "{body}");
    assert_eq!(
        body["output_ids"],
        serde_json::json!([1007, 1008, 1009]),
        "{body}"
    );
    assert_eq!(body["meta_info"]["matched_stop"], 1009, "{body}");
    // `ignore_eos` lets it run to its length.
    let ignoring = serde_json::json!({
        "model": "py-model",
        "input_ids": [7, 2, 3],
        "sampling_params": {"max_new_tokens": 4, "ignore_eos": true},
    })
    .to_string();
    let body = gateway.client().post_json("/generate", &ignoring).json();
    assert_eq!(
        body["meta_info"]["finish_reason"]["type"], "length",
        "{body}"
    );
}

/// The chat content a gateway answers for one fixed chat, once it answers 200; while the
/// model's tokenizer is not loaded it must answer 503 naming the model. `None` if no 200 came.
fn chat_content_once_loaded(gateway: &Gateway) -> Option<String> {
    let chat = serde_json::json!({
        "model": "py-model",
        "messages": [{"role": "user", "content": "hello"}],
        "max_tokens": 6,
    })
    .to_string();
    let mut content = None;
    wait_until(TIMEOUT, || {
        let response = gateway.client().post_json("/v1/chat/completions", &chat);
        if response.status == 200 {
            let body = response.json();
            content = body["choices"][0]["message"]["content"]
                .as_str()
                .map(str::to_string);
            return true;
        }
        assert_eq!(response.status, 503, "{}", response.text());
        let message = response.json()["error"]["message"].to_string();
        assert!(message.contains("py-model"), "{message}");
        false
    });
    content
}

/// An engine serving Qwen3's tokenizer files over GetTokenizer, with `extra` config.
fn tokenizer_engine(
    python: &PathBuf,
    dir: &std::path::Path,
    extra: serde_json::Value,
) -> PythonEngine {
    let mut config = serde_json::json!({"tokenizer_dir": dir});
    if let (Some(config), Some(extra)) = (config.as_object_mut(), extra.as_object()) {
        config.extend(extra.clone());
    }
    PythonEngine::start_with(python, &config.to_string())
}

#[test]
fn a_grpc_workers_tokenizer_is_fetched_when_no_flag_gives_one() {
    let Some(python) = python() else { return };
    let Some(dir) = utils::tokenizer_dir("qwen3") else {
        return;
    };
    let engine = tokenizer_engine(&python, &dir, serde_json::json!({}));
    let fetched = Gateway::start(&[engine.url()], &[]);
    let content = chat_content_once_loaded(&fetched).expect("the fetched tokenizer serves chat");
    assert!(engine.saw("get_tokenizer"));
    // The same chat through a gateway given the same files by flag: the same text.
    let path = dir.to_string_lossy().to_string();
    let given = Gateway::start(&[engine.url()], &["--tokenizer-path", &path]);
    let expected = chat_content_once_loaded(&given).expect("the flag's tokenizer serves chat");
    assert!(!content.is_empty());
    assert_eq!(content, expected);
}

/// A gateway logging to a file, and the file's path.
fn logged_gateway(engine: &PythonEngine, name: &str) -> (Gateway, PathBuf) {
    let log = std::env::temp_dir().join(format!("kvgate-{name}-{}.log", std::process::id()));
    let file = std::fs::File::create(&log).expect("log file");
    (
        Gateway::start_logging(&[engine.url()], &[], Some(file)),
        log,
    )
}

#[test]
fn a_tokenizer_archive_with_a_wrong_digest_or_over_the_cap_is_refused() {
    let Some(python) = python() else { return };
    let Some(dir) = utils::tokenizer_dir("qwen3") else {
        return;
    };
    let cases = [
        (
            serde_json::json!({"tokenizer_sha256": "00".repeat(32)}),
            "SHA-256 mismatch",
        ),
        // kvgate's cap (limits::TOKENIZER_ARCHIVE_BYTES_MAX, 64 MiB) and a little more.
        (
            serde_json::json!({"tokenizer_padding_bytes": 65 << 20}),
            "the archive is over",
        ),
    ];
    for (i, (extra, why)) in cases.into_iter().enumerate() {
        let engine = tokenizer_engine(&python, &dir, extra);
        let (gateway, log) = logged_gateway(&engine, &format!("tokenizer-refused-{i}"));
        let read = || std::fs::read_to_string(&log).unwrap_or_default();
        assert!(wait_until(TIMEOUT, || read().contains(why)), "{}", read());
        assert!(
            read().contains("the worker's tokenizer is refused"),
            "{}",
            read()
        );
        // Still no tokenizer: chat is a 503 that names the model, not a panic or a hang.
        let chat = serde_json::json!({"model": "py-model", "messages": [{"role": "user", "content": "hi"}]});
        let response = gateway
            .client()
            .post_json("/v1/chat/completions", &chat.to_string());
        assert_eq!(response.status, 503, "{}", response.text());
        assert!(response.text().contains("py-model"), "{}", response.text());
        let _ = std::fs::remove_file(&log);
    }
}

#[test]
fn disable_tokenizer_autoload_never_calls_get_tokenizer() {
    let Some(python) = python() else { return };
    let Some(dir) = utils::tokenizer_dir("qwen3") else {
        return;
    };
    let engine = tokenizer_engine(&python, &dir, serde_json::json!({}));
    let gateway = Gateway::start(&[engine.url()], &["--disable-tokenizer-autoload"]);
    // Once the worker's model is in the catalog, a fetch would have started.
    let listed = || {
        gateway
            .client()
            .get("/v1/models")
            .text()
            .contains("py-model")
    };
    assert!(wait_until(TIMEOUT, listed));
    std::thread::sleep(std::time::Duration::from_millis(300));
    // IDs still work.
    let completion = serde_json::json!({"model": "py-model", "prompt": [7, 8], "max_tokens": 2});
    let response = gateway
        .client()
        .post_json("/v1/completions", &completion.to_string());
    assert_eq!(response.status, 200, "{}", response.text());
    let chat =
        serde_json::json!({"model": "py-model", "messages": [{"role": "user", "content": "hi"}]});
    let response = gateway
        .client()
        .post_json("/v1/chat/completions", &chat.to_string());
    assert_eq!(response.status, 400, "{}", response.text());
    assert!(response.text().contains("tokenizer"), "{}", response.text());
    assert!(!engine.saw("get_tokenizer"));
}
