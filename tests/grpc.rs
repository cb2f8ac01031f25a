//! gRPC workers end to end: a real `kvgate` in front of `sim-engine --grpc sglang|vllm` fleets.
//! `/generate` is routed to `grpc://` workers (the backend detected, or given by `--backend`),
//! answered in SGLang's native shape streamed and not; a client that goes makes the engine see
//! its stream reset and an `Abort`; a worker killed mid-stream ends the client's stream with an
//! SSE error event; an engine announcing `MAX_CONCURRENT_STREAMS` 1 gets more connections; a
//! worker unreachable at start does not fail requests. KV events over `SubscribeKvEvents`
//! resume where a broken stream stopped (and batches lost past the engine's buffer are a gap);
//! `POST /workers` takes `--backend`; a removed worker's connections close; a GOAWAY under
//! traffic fails no stream; a stalled stream ends at the idle timeout. The engines write
//! each connection, reset, `Abort` and subscription on stderr, which these tests read from a
//! file.

mod utils;

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::mpsc;

use bench_harness::sim::output::{
    output_logprobs, output_text, prompt_seed, OutputVocabulary, VOCABULARY,
};
use kvgate::tokenize::{ModelTokenizer, PromptSource, TokenizerFiles};
use utils::client::HttpClient;
use utils::process::{free_port, free_port_block, workspace_bin, ChildProcess, Gateway};
use utils::{wait_until, TIMEOUT};

/// A `sim-engine --grpc` fleet whose stderr goes to a file.
struct GrpcSim {
    process: ChildProcess,
    base_port: u16,
    engines: u16,
    log: PathBuf,
}

impl GrpcSim {
    /// Starts `engines` engines speaking `protocol` with extra flags; returns once ready.
    fn start(engines: u16, protocol: &str, args: &[&str]) -> GrpcSim {
        for _ in 0..5 {
            if let Some(sim) = Self::try_start(engines, protocol, args) {
                return sim;
            }
        }
        panic!("sim-engine --grpc {protocol} did not start");
    }

    fn try_start(engines: u16, protocol: &str, args: &[&str]) -> Option<GrpcSim> {
        let base_port = free_port_block(engines);
        let log = std::env::temp_dir().join(format!(
            "kvgate-grpc-sim-{}-{base_port}.log",
            std::process::id()
        ));
        let file = std::fs::File::create(&log).expect("sim log");
        let mut command = Command::new(workspace_bin("sim-engine"));
        command
            .args(["--engines", &engines.to_string()])
            .args(["--base-port", &base_port.to_string()])
            .args(["--grpc", protocol])
            .args(args)
            .stdout(Stdio::piped());
        let mut process = ChildProcess::spawn_with_stderr("sim-engine", &mut command, file.into());
        let stdout = process_stdout(&mut process);
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if line.contains("sim-engine: ready") {
                    let _ = tx.send(());
                }
            }
        });
        // A model's tokenizer takes seconds to load in a debug build on a loaded machine.
        let tokenizer = args.contains(&"--tokenizer-path");
        match rx.recv_timeout(if tokenizer { 6 * TIMEOUT } else { TIMEOUT }) {
            Ok(()) => Some(GrpcSim {
                process,
                base_port,
                engines,
                log,
            }),
            Err(_) => None,
        }
    }

    fn url(&self, i: u16) -> String {
        format!("grpc://127.0.0.1:{}", self.base_port + i)
    }

    fn urls(&self) -> Vec<String> {
        (0..self.engines).map(|i| self.url(i)).collect()
    }

    /// The engines' stderr so far.
    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// HTTP/2 connections the engines accepted and saw closed.
    fn connections(&self) -> (usize, usize) {
        let log = self.log();
        let opened = log.lines().filter(|l| l.ends_with(" connection")).count();
        (opened, self.count("connection closed"))
    }

    /// Lines of the log containing `needle`.
    fn count(&self, needle: &str) -> usize {
        self.log().lines().filter(|l| l.contains(needle)).count()
    }
}

impl Drop for GrpcSim {
    fn drop(&mut self) {
        self.process.kill();
        let _ = std::fs::remove_file(&self.log);
    }
}

fn process_stdout(process: &mut ChildProcess) -> std::process::ChildStdout {
    process.stdout().expect("piped stdout")
}

fn generate(input_ids: &[u32], max_new_tokens: u32, stream: bool, rid: &str) -> String {
    serde_json::json!({
        "input_ids": input_ids,
        "sampling_params": {"max_new_tokens": max_new_tokens, "temperature": 0.0},
        "stream": stream,
        "rid": rid,
    })
    .to_string()
}

/// The JSON of each `data:` event but `[DONE]`, and whether `[DONE]` came last.
fn events(response: &utils::client::Response) -> (Vec<serde_json::Value>, bool) {
    let data = response.sse_data();
    let done = data.last() == Some(&"[DONE]");
    let events = data
        .iter()
        .filter(|d| **d != "[DONE]")
        .map(|d| serde_json::from_str(d).unwrap_or_else(|e| panic!("{d}: {e}")))
        .collect();
    (events, done)
}

#[test]
fn generate_is_routed_to_grpc_workers_streamed_and_not() {
    for protocol in ["sglang", "vllm"] {
        let sim = GrpcSim::start(2, protocol, &[]);
        let gateway = Gateway::start(&sim.urls(), &[]);
        let mut client = gateway.client();
        let response = client.post_json("/generate", &generate(&[1, 2, 3, 4], 6, false, "a"));
        assert_eq!(response.status, 200, "{protocol}: {}", response.text());
        let worker = response.routed_worker().unwrap_or_default().to_string();
        assert!(
            sim.urls().contains(&worker),
            "{protocol}: routed to {worker}"
        );
        let body = response.json();
        assert_eq!(
            body["output_ids"].as_array().map(Vec::len),
            Some(6),
            "{body}"
        );
        assert_eq!(
            body["meta_info"]["finish_reason"]["type"], "length",
            "{body}"
        );
        assert_eq!(body["meta_info"]["prompt_tokens"], 4, "{body}");
        assert_eq!(body["meta_info"]["completion_tokens"], 6, "{body}");
        assert_eq!(body["meta_info"]["id"], "a", "{body}");

        // The same prompt streamed: the same tokens, one event per token, then [DONE].
        let response = client.post_json("/generate", &generate(&[1, 2, 3, 4], 6, true, "b"));
        assert_eq!(response.status, 200, "{protocol}");
        assert_eq!(response.header("content-type"), Some("text/event-stream"));
        let (events, done) = events(&response);
        assert!(done, "{protocol}: the stream ends with [DONE]");
        let last = events.last().expect("events");
        assert_eq!(last["output_ids"], body["output_ids"], "{protocol}");
        assert_eq!(last["meta_info"]["finish_reason"]["type"], "length");
        assert!(events[..events.len() - 1]
            .iter()
            .all(|e| e["meta_info"]["finish_reason"].is_null()));
        let lengths: Vec<usize> = events
            .iter()
            .map(|e| e["output_ids"].as_array().map_or(0, Vec::len))
            .collect();
        assert_eq!(lengths, [1, 2, 3, 4, 5, 6, 6], "{protocol}");
    }
}

#[test]
fn the_configured_backend_is_used_without_detection() {
    let sim = GrpcSim::start(1, "vllm", &[]);
    let gateway = Gateway::start(&sim.urls(), &["--backend", "vllm"]);
    let response = gateway
        .client()
        .post_json("/generate", &generate(&[5, 6, 7], 3, false, "v"));
    assert_eq!(response.status, 200, "{}", response.text());
    // A gateway told the wrong backend gets the engine's UNIMPLEMENTED: a 501, not retried.
    let wrong = Gateway::start(&sim.urls(), &["--backend", "sglang"]);
    let response = wrong
        .client()
        .post_json("/generate", &generate(&[5, 6, 7], 3, false, "w"));
    assert_eq!(response.status, 501, "{}", response.text());
}

#[test]
fn a_client_that_goes_resets_the_stream_and_the_engine_gets_abort() {
    let sim = GrpcSim::start(1, "sglang", &["--speedup", "0.05"]);
    let gateway = Gateway::start(&sim.urls(), &[]);
    let mut client = gateway.client();
    client.send_request(
        "POST",
        "/generate",
        &[("content-type", "application/json")],
        generate(&[1, 2, 3], 100_000, true, "gone-1").as_bytes(),
    );
    assert_eq!(client.read_head_and_first_chunk(), 200);
    client.close();
    let seen = wait_until(TIMEOUT, || {
        sim.count("stream reset gone-1") == 1 && sim.count("Abort gone-1") == 1
    });
    assert!(seen, "the engine saw no reset and Abort:\n{}", sim.log());
}

#[test]
fn a_worker_killed_mid_stream_ends_the_stream_with_an_error_event() {
    let mut sim = GrpcSim::start(1, "sglang", &["--speedup", "0.05"]);
    let gateway = Gateway::start(&sim.urls(), &[]);
    let mut client = gateway.client();
    client.send_request(
        "POST",
        "/generate",
        &[("content-type", "application/json")],
        generate(&[1, 2, 3], 100_000, true, "killed").as_bytes(),
    );
    assert_eq!(client.read_head_and_first_chunk(), 200);
    sim.process.kill();
    let response = client.read_response_even_if_cut();
    let data = response.sse_data();
    let error = data.last().expect("events");
    let error: serde_json::Value = serde_json::from_str(error).expect("an error event");
    assert_eq!(error["error"]["code"], 502, "{error}");
    assert_eq!(error["error"]["type"], "upstream_error", "{error}");
}

#[test]
fn an_engine_with_one_stream_per_connection_gets_a_connection_per_call() {
    let sim = GrpcSim::start(
        1,
        "sglang",
        &["--grpc-max-concurrent-streams", "1", "--speedup", "0.2"],
    );
    let gateway = Gateway::start(&sim.urls(), &["--disable-health-check"]);
    let clients: Vec<HttpClient> = (0..3)
        .map(|i| {
            let mut client = gateway.client();
            client.send_request(
                "POST",
                "/generate",
                &[("content-type", "application/json")],
                generate(&[i, 1, 2], 40, true, &format!("mcs-{i}")).as_bytes(),
            );
            client
        })
        .collect();
    for mut client in clients {
        let response = client.read_response();
        assert_eq!(response.status, 200);
        let (events, done) = events(&response);
        assert!(done);
        assert_eq!(
            events.last().unwrap()["output_ids"]
                .as_array()
                .map(Vec::len),
            Some(40)
        );
    }
    // Three calls at once on a worker that takes one per connection: three connections from
    // the data core (the control core's probes add theirs).
    assert!(sim.connections().0 >= 3, "{}", sim.log());
}

#[test]
fn a_worker_unreachable_at_start_does_not_fail_requests() {
    let sim = GrpcSim::start(1, "sglang", &[]);
    let dead = format!("grpc://127.0.0.1:{}", free_port());
    let gateway = Gateway::start(&[dead, sim.url(0)], &["--policy", "round_robin"]);
    for i in 0..6 {
        let response = gateway.client().post_json(
            "/generate",
            &generate(&[i, 7, 7], 2, false, &format!("u{i}")),
        );
        assert_eq!(response.status, 200, "request {i}: {}", response.text());
        assert_eq!(response.routed_worker(), Some(sim.url(0).as_str()));
    }
}

#[test]
fn a_grpc_url_without_a_port_is_refused_at_start() {
    let output = Command::new(workspace_bin("kvgate"))
        .args(["--worker-urls", "grpc://127.0.0.1"])
        .output()
        .expect("run kvgate");
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("grpc://host:port"), "{stderr}");
}

/// A sim fleet of `protocol` generating the token IDs of `dir`'s model, behind a gateway that
/// detokenizes with the same files; the sim's words as the model's IDs.
fn tokenized_fleet(
    protocol: &str,
    dir: &Path,
    sim_args: &[&str],
) -> (GrpcSim, Gateway, OutputVocabulary) {
    let path = dir.to_string_lossy().to_string();
    let mut args = vec!["--tokenizer-path", &path];
    args.extend_from_slice(sim_args);
    let sim = GrpcSim::start(2, protocol, &args);
    let gateway = Gateway::start(&sim.urls(), &["--tokenizer-path", &path]);
    let vocabulary = OutputVocabulary::from_tokenizer_file(dir).expect("the sim's words");
    (sim, gateway, vocabulary)
}

/// The streamed chat deltas' `content`, joined.
fn streamed_content(response: &utils::client::Response) -> String {
    let (events, done) = events(response);
    assert!(done, "the stream ends with [DONE]");
    events
        .iter()
        .filter_map(|e| e["choices"][0]["delta"]["content"].as_str())
        .collect()
}

#[test]
fn grpc_sims_generate_the_models_token_ids_and_the_gateway_their_text() {
    let Some(dir) = utils::tokenizer_dir("qwen3") else {
        return;
    };
    let reference = tokenizers::Tokenizer::from_file(dir.join("tokenizer.json")).unwrap();
    for protocol in ["sglang", "vllm"] {
        let (sim, gateway, vocabulary) = tokenized_fleet(protocol, &dir, &[]);
        let mut client = gateway.client();

        // /generate of IDs: the sim's answer to this prompt, as the model's IDs and its text.
        let prompt = [9707u32, 11, 1879, 0];
        let seed = prompt_seed(&prompt);
        let response = client.post_json("/generate", &generate(&prompt, 8, false, "t"));
        assert_eq!(response.status, 200, "{protocol}: {}", response.text());
        let body = response.json();
        let ids: Vec<u32> = (0..8).map(|k| vocabulary.token(seed, k)).collect();
        assert_eq!(
            body["output_ids"],
            serde_json::json!(ids),
            "{protocol}: {body}"
        );
        assert_eq!(body["text"], output_text(seed, 8), "{protocol}: {body}");
        assert_eq!(reference.decode(&ids, true).unwrap(), output_text(seed, 8));

        // A completions prompt of IDs: the same text, streamed and not.
        let completion = |stream: bool| {
            serde_json::json!({"model": "sim-model", "prompt": prompt, "max_tokens": 8, "stream": stream})
                .to_string()
        };
        let body = client
            .post_json("/v1/completions", &completion(false))
            .json();
        assert_eq!(
            body["choices"][0]["text"],
            output_text(seed, 8),
            "{protocol}: {body}"
        );
        assert_eq!(body["usage"]["completion_tokens"], 8, "{body}");
        let (chunks, done) = events(&client.post_json("/v1/completions", &completion(true)));
        assert!(done);
        let streamed: String = chunks
            .iter()
            .filter_map(|c| c["choices"][0]["text"].as_str())
            .collect();
        assert_eq!(streamed, output_text(seed, 8), "{protocol}");

        // A chat, rendered and tokenized by the gateway: the sim's words, one per token, the
        // same streamed and not.
        let response = client.post_json(
            "/v1/chat/completions",
            &utils::chat("hello there", 12, false),
        );
        assert_eq!(response.status, 200, "{protocol}: {}", response.text());
        let body = response.json();
        let content = body["choices"][0]["message"]["content"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        let words: Vec<&str> = content.split(' ').collect();
        assert_eq!(words.len(), 12, "{protocol}: {content:?}");
        assert!(
            words.iter().all(|w| VOCABULARY.contains(w)),
            "{protocol}: {content:?}"
        );
        assert_eq!(body["usage"]["completion_tokens"], 12, "{body}");
        assert_eq!(body["choices"][0]["finish_reason"], "length", "{body}");
        let streamed = client.post_json(
            "/v1/chat/completions",
            &utils::chat("hello there", 12, true),
        );
        assert_eq!(streamed_content(&streamed), content, "{protocol}");

        // A policy that routes on text leaves the rendering and tokenizing to the front end:
        // the same answer (the same prompt IDs), and an Anthropic message too.
        if protocol == "sglang" {
            let path = dir.to_string_lossy().to_string();
            let text_routed = Gateway::start(
                &sim.urls(),
                &["--tokenizer-path", &path, "--policy", "round_robin"],
            );
            let mut client = text_routed.client();
            let body = utils::chat("hello there", 12, false);
            let response = client.post_json("/v1/chat/completions", &body);
            assert_eq!(response.status, 200, "{}", response.text());
            assert_eq!(response.json()["choices"][0]["message"]["content"], content);
            let message = serde_json::json!({"model": "sim-model", "max_tokens": 3,
                "messages": [{"role": "user", "content": "hi"}]});
            let response = client.post_json("/v1/messages", &message.to_string());
            assert_eq!(response.status, 200, "{}", response.text());
            let text = response.json()["content"][0]["text"]
                .as_str()
                .unwrap_or_default()
                .to_string();
            assert_eq!(text.split(' ').count(), 3, "{text:?}");
        }
    }
}

#[test]
fn logprobs_over_grpc_are_the_engines_in_each_apis_shape() {
    let Some(dir) = utils::tokenizer_dir("qwen3") else {
        return;
    };
    let reference = tokenizers::Tokenizer::from_file(dir.join("tokenizer.json")).unwrap();
    let token_text = |id: u32| reference.decode(&[id], false).unwrap();
    for protocol in ["sglang", "vllm"] {
        let (_sim, gateway, vocabulary) = tokenized_fleet(protocol, &dir, &[]);
        let mut client = gateway.client();
        let prompt = [100u32, 200, 300];
        let seed = prompt_seed(&prompt);
        let expected = |k: u32, top: u32| output_logprobs(&vocabulary, seed, k, top);

        // Completions, `logprobs: 2`, unstreamed: tokens, their logprobs, two alternatives each.
        let body = serde_json::json!({"model": "sim-model", "prompt": prompt, "max_tokens": 5, "logprobs": 2});
        let response = client.post_json("/v1/completions", &body.to_string());
        assert_eq!(response.status, 200, "{protocol}: {}", response.text());
        let body = response.json();
        let logprobs = &body["choices"][0]["logprobs"];
        for k in 0..5u32 {
            let (logprob, top) = expected(k, 2);
            let token = token_text(vocabulary.token(seed, k));
            assert_eq!(
                logprobs["tokens"][k as usize],
                token.as_str(),
                "{protocol}: {logprobs}"
            );
            assert_eq!(
                logprobs["token_logprobs"][k as usize],
                f64::from(logprob),
                "{logprobs}"
            );
            let alternatives: serde_json::Map<String, serde_json::Value> = top
                .iter()
                .map(|(id, lp)| (token_text(*id), serde_json::json!(f64::from(*lp))))
                .collect();
            assert_eq!(
                logprobs["top_logprobs"][k as usize],
                serde_json::Value::Object(alternatives)
            );
        }

        // Chat, `top_logprobs: 3`, streamed and not: one entry per token, its text the content.
        for stream in [false, true] {
            let body = serde_json::json!({
                "model": "sim-model",
                "messages": [{"role": "user", "content": "hi"}],
                "max_tokens": 6,
                "logprobs": true,
                "top_logprobs": 3,
                "stream": stream,
            });
            let response = client.post_json("/v1/chat/completions", &body.to_string());
            assert_eq!(response.status, 200, "{protocol}: {}", response.text());
            let (content, entries) = if stream {
                let (chunks, _) = events(&response);
                let entries: Vec<serde_json::Value> = chunks
                    .iter()
                    .filter_map(|c| c["choices"][0]["logprobs"]["content"].as_array())
                    .flatten()
                    .cloned()
                    .collect();
                (streamed_content(&response), entries)
            } else {
                let body = response.json();
                let content = body["choices"][0]["message"]["content"]
                    .as_str()
                    .unwrap_or_default()
                    .to_string();
                let entries = body["choices"][0]["logprobs"]["content"]
                    .as_array()
                    .cloned()
                    .unwrap_or_default();
                (content, entries)
            };
            assert_eq!(entries.len(), 6, "{protocol} stream {stream}: {entries:?}");
            let joined: String = entries.iter().filter_map(|e| e["token"].as_str()).collect();
            assert_eq!(joined, content, "{protocol} stream {stream}");
            for entry in &entries {
                let top = entry["top_logprobs"].as_array().expect("top_logprobs");
                assert_eq!(top.len(), 3, "{entry}");
                // The sim's most likely alternative is the sampled token.
                assert_eq!(top[0]["token"], entry["token"], "{entry}");
                assert_eq!(top[0]["logprob"], entry["logprob"], "{entry}");
                let bytes: Vec<u8> = entry["bytes"]
                    .as_array()
                    .expect("bytes")
                    .iter()
                    .filter_map(|b| b.as_u64().map(|b| b as u8))
                    .collect();
                assert_eq!(
                    bytes,
                    entry["token"].as_str().unwrap_or_default().as_bytes()
                );
            }
        }

        // /generate with return_logprob: SGLang's [[logprob, id, null], ...].
        let body = serde_json::json!({
            "input_ids": prompt,
            "sampling_params": {"max_new_tokens": 4},
            "return_logprob": true,
            "top_logprobs_num": 1,
        });
        let body = client.post_json("/generate", &body.to_string()).json();
        let logprobs = &body["meta_info"]["output_token_logprobs"];
        for k in 0..4u32 {
            let id = vocabulary.token(seed, k);
            let (logprob, _) = expected(k, 1);
            assert_eq!(
                logprobs[k as usize],
                serde_json::json!([f64::from(logprob), id, null]),
                "{protocol}: {body}"
            );
        }
        assert_eq!(
            body["meta_info"]["output_top_logprobs"][0][0][1],
            vocabulary.token(seed, 0),
            "{body}"
        );

        // Not asked: none.
        let body = client
            .post_json("/generate", &generate(&prompt, 2, false, "n"))
            .json();
        assert!(
            body["meta_info"].get("output_token_logprobs").is_none(),
            "{body}"
        );
    }
}

/// What the sim answers a prompt the gateway renders from `body` (`source` says how) with
/// `dir`'s model: `n` of its words, and the prompt's length.
fn sim_answer(dir: &Path, body: &str, source: &str, n: u32) -> (String, usize) {
    let read = |f: &str| std::fs::read(dir.join(f)).expect("a tokenizer file");
    let files = TokenizerFiles {
        tokenizer_json: read("tokenizer.json"),
        tokenizer_config_json: Some(read("tokenizer_config.json")),
        chat_template: None,
    };
    let model = ModelTokenizer::new("m", files).expect("the tokenizer loads");
    let source = match source {
        "chat" => PromptSource::Chat(body.as_bytes()),
        _ => PromptSource::Messages(body.as_bytes()),
    };
    let prompt = model.prompt(source).expect("the body renders");
    let ids = model
        .encode(&prompt.text, prompt.add_special_tokens)
        .expect("the prompt encodes");
    (output_text(prompt_seed(&ids), n), ids.len())
}

#[test]
fn the_openai_and_anthropic_sdks_talk_to_grpc_sims_whole_and_streamed() {
    let Some(python) = utils::sdk_python() else {
        return;
    };
    let Some(dir) = utils::tokenizer_dir("qwen3") else {
        return;
    };
    // What tests/fixtures/sdk_client.py sends, rendered as the gateway renders it.
    let messages =
        serde_json::json!([{"role": "user", "content": "Tell me a story about a lighthouse."}]);
    let body = serde_json::json!({"model": "sim-model", "max_tokens": 8, "messages": messages})
        .to_string();
    let (openai_text, prompt_tokens) = sim_answer(&dir, &body, "chat", 8);
    let (anthropic_text, _) = sim_answer(&dir, &body, "messages", 8);
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/sdk_client.py");
    for protocol in ["sglang", "vllm"] {
        let (_sim, gateway, _) = tokenized_fleet(protocol, &dir, &[]);
        let output = Command::new(&python)
            .arg(&script)
            .arg(format!("http://127.0.0.1:{}", gateway.port))
            .arg("sim-model")
            .output()
            .expect("the SDK client runs");
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(
            output.status.success(),
            "{protocol}: the SDK client failed:\n{stderr}"
        );
        let answers: serde_json::Value =
            serde_json::from_slice(&output.stdout).expect("one JSON line");
        assert_eq!(
            answers["openai_text"],
            openai_text.as_str(),
            "{protocol}: {answers}"
        );
        assert_eq!(
            answers["openai_stream_text"],
            openai_text.as_str(),
            "{protocol}: {answers}"
        );
        assert_eq!(
            answers["anthropic_text"],
            anthropic_text.as_str(),
            "{protocol}: {answers}"
        );
        assert_eq!(
            answers["anthropic_stream_text"],
            anthropic_text.as_str(),
            "{protocol}: {answers}"
        );
        assert_eq!(answers["openai_finish"], "length", "{answers}");
        assert_eq!(answers["openai_stream_finish"], "length", "{answers}");
        assert_eq!(answers["openai_completion_tokens"], 8, "{answers}");
        assert_eq!(answers["openai_prompt_tokens"], prompt_tokens, "{answers}");
        assert_eq!(answers["anthropic_output_tokens"], 8, "{answers}");
        assert_eq!(answers["anthropic_stop"], "max_tokens", "{answers}");
        // One chunk per token at least (the role's, the tokens', the finish's).
        assert!(
            answers["openai_stream_chunks"].as_u64() >= Some(9),
            "{answers}"
        );
    }
}

/// The `start_sequence_number` of each `SubscribeKvEvents` call the engines logged, in order.
fn subscriptions(sim: &GrpcSim) -> Vec<u64> {
    let calls = sim.log();
    let starts = calls.lines().filter_map(|l| {
        let (_, start) = l.split_once("SubscribeKvEvents from ")?;
        start.trim().parse().ok()
    });
    starts.collect()
}

/// 64 tokens of prompt family `family` (four 16-token pages of the sim's cache).
fn family(family: u32) -> Vec<u32> {
    (0..64).map(|i| family * 1000 + i).collect()
}

#[test]
fn kv_events_over_grpc_resume_where_the_stream_broke() {
    let kv_port = free_port_block(2).to_string();
    // Each stream ends after two batches: the gateway must resume at the third.
    let args = [
        "--kv-events-base-port",
        &kv_port,
        "--grpc-kv-stream-batches",
        "2",
    ];
    let sim = GrpcSim::start(1, "sglang", &args);
    let gateway = Gateway::start(&sim.urls(), &[]);
    let url = sim.url(0);
    let applied = format!("kvgate_kv_event_batches_total{{worker=\"{url}\",outcome=\"applied\"}}");
    let held = format!("kvgate_kv_index_worker_blocks{{worker=\"{url}\"}}");
    for i in 0..6 {
        let batches = gateway.metric(&applied);
        let body = generate(&family(i), 1, false, &format!("kv{i}"));
        let response = gateway.client().post_json("/generate", &body);
        assert_eq!(response.status, 200, "{}", response.text());
        // One at a time, each applied before the next: every stream break falls between them.
        assert!(
            wait_until(TIMEOUT, || gateway.metric(&applied) > batches),
            "{}\n{}",
            gateway.metrics(),
            sim.log()
        );
    }
    let starts = subscriptions(&sim);
    assert!(starts.len() >= 3, "{}", sim.log());
    // Each stream asked for the batch after the last one the gateway had: none lost, none twice.
    for (i, start) in starts.iter().enumerate() {
        assert_eq!(*start, 2 * i as u64, "{starts:?}");
    }
    for reason in ["gap", "restart", "unverified"] {
        let resets =
            format!("kvgate_kv_event_resets_total{{worker=\"{url}\",reason=\"{reason}\"}}");
        assert_eq!(gateway.metric(&resets), 0.0, "{}", gateway.metrics());
    }
    // Six prompts of four pages each, every one still held.
    assert!(
        wait_until(TIMEOUT, || gateway.metric(&held) == 24.0),
        "{}",
        gateway.metrics()
    );
}

#[test]
fn kv_events_over_grpc_lost_past_the_engines_buffer_are_a_gap_and_rebuilt() {
    let kv_port = free_port_block(2).to_string();
    // The engine keeps one batch and ends each stream after one: batches published while the
    // gateway reconnects are lost for good.
    let args = [
        "--kv-events-base-port",
        &kv_port,
        "--kv-events-replay-buffer",
        "1",
        "--grpc-kv-stream-batches",
        "1",
    ];
    let sim = GrpcSim::start(1, "sglang", &args);
    let gateway = Gateway::start(&sim.urls(), &[]);
    let url = sim.url(0);
    let gaps = format!("kvgate_kv_event_resets_total{{worker=\"{url}\",reason=\"gap\"}}");
    let held = format!("kvgate_kv_index_worker_blocks{{worker=\"{url}\"}}");
    let mut round = 0;
    let lost = wait_until(TIMEOUT, || {
        // Eight prompts at once: several batches within one reconnection's backoff.
        let clients: Vec<_> = (0..8)
            .map(|i| {
                let body = generate(&family(round * 8 + i), 1, false, "burst");
                let gateway_addr = gateway.addr();
                std::thread::spawn(move || {
                    HttpClient::connect(gateway_addr)
                        .post_json("/generate", &body)
                        .status
                })
            })
            .collect();
        for client in clients {
            assert_eq!(client.join().unwrap(), 200);
        }
        round += 1;
        gateway.metric(&gaps) > 0.0
    });
    assert!(lost, "{}\n{}", gateway.metrics(), sim.log());
    // The stream went on from what the engine still had: a start past a batch it no longer
    // keeps, and entries rebuilt from the batches after the gap.
    assert!(subscriptions(&sim).len() >= 2);
    let body = generate(&family(9999), 1, false, "after");
    assert_eq!(gateway.client().post_json("/generate", &body).status, 200);
    assert!(
        wait_until(TIMEOUT, || gateway.metric(&held) > 0.0),
        "{}",
        gateway.metrics()
    );
}

#[test]
fn post_workers_applies_the_backend_flag_to_grpc_workers() {
    let sim = GrpcSim::start(1, "vllm", &[]);
    let add = serde_json::json!({ "url": sim.url(0) }).to_string();
    // Told that gRPC workers speak SGLang's protocol, the gateway asks SGLang's service of this
    // vLLM engine, and the admission fails; detected, the same worker is admitted.
    let told = Gateway::start(&[], &["--backend", "sglang"]);
    let refused = told.request("POST", "/workers", &add, None);
    assert_ne!(refused.status / 100, 2, "{}", refused.text());
    let detected = Gateway::start(&[], &[]);
    let admitted = detected.request("POST", "/workers", &add, None);
    assert_eq!(admitted.status / 100, 2, "{}", admitted.text());
    assert!(wait_until(TIMEOUT, || detected.worker_healthy(&sim.url(0))));
}

#[test]
fn a_removed_workers_grpc_connections_close_without_a_failure() {
    let sim = GrpcSim::start(1, "sglang", &[]);
    let gateway = Gateway::start(&sim.urls(), &[]);
    let body = generate(&[1, 2, 3], 2, false, "before");
    assert_eq!(gateway.client().post_json("/generate", &body).status, 200);
    let (opened, closed) = sim.connections();
    // Some stay open while the worker is in the roster: the data core's and the probes'.
    assert!(opened > closed, "{}", sim.log());
    let removed = gateway.request("DELETE", "/workers/0", "", None);
    assert_eq!(removed.status / 100, 2, "{}", removed.text());
    // The data core's connection and the control core's (probes, KV events) all close: the
    // engine is healthy, so nothing but the removal can close them.
    let all_closed = wait_until(TIMEOUT, || {
        let (opened, closed) = sim.connections();
        closed == opened
    });
    assert!(all_closed, "{}", sim.log());
}

#[test]
fn goaway_under_traffic_drains_its_streams_and_new_calls_take_a_new_connection() {
    // Every connection says GOAWAY after its fourth stream: under 24 concurrent streamed
    // requests the data core's connections are told to go while calls run on them.
    let sim = GrpcSim::start(1, "sglang", &["--grpc-goaway-after-streams", "4"]);
    let gateway = Gateway::start(&sim.urls(), &[]);
    let addr = gateway.addr();
    let clients: Vec<_> = (0..24)
        .map(|i| {
            std::thread::spawn(move || {
                let body = generate(&[i, 5, 6], 16, true, &format!("g{i}"));
                HttpClient::connect(addr).post_json("/generate", &body)
            })
        })
        .collect();
    for (i, client) in clients.into_iter().enumerate() {
        let response = client.join().unwrap();
        assert_eq!(response.status, 200, "request {i}: {}", response.text());
        let (events, done) = events(&response);
        // Every stream ran to its end: no error event, all 16 tokens, then [DONE].
        assert!(done, "request {i}: {}", response.text());
        let last = events.last().expect("events");
        assert_eq!(
            last["meta_info"]["completion_tokens"], 16,
            "request {i}: {last}"
        );
        assert!(
            events.iter().all(|e| e.get("error").is_none()),
            "{events:?}"
        );
    }
    assert!(sim.count("GOAWAY") >= 2, "{}", sim.log());
    // More connections than one: each GOAWAY sent the next calls to a new one.
    assert!(sim.connections().0 >= 4, "{}", sim.log());
}

#[test]
fn a_stalled_stream_ends_at_the_idle_timeout_with_an_error_event() {
    let sim = GrpcSim::start(1, "sglang", &["--grpc-stall-after-tokens", "2"]);
    let args = ["--upstream-idle-timeout-secs", "1"];
    let gateway = Gateway::start(&sim.urls(), &args);
    let started = std::time::Instant::now();
    let body = generate(&[1, 2, 3], 10, true, "stalled");
    let response = gateway.client().post_json_even_if_cut("/generate", &body);
    assert_eq!(response.status, 200, "{}", response.text());
    let (events, done) = events(&response);
    // Two tokens came, then the silence ended the stream with an error event, not a hang.
    assert!(!done, "{}", response.text());
    assert!(
        events.iter().any(|e| e.get("error").is_some()),
        "{}",
        response.text()
    );
    assert!(started.elapsed() < TIMEOUT);
    // The engine's stream was reset when the gateway gave up on it.
    assert!(
        wait_until(TIMEOUT, || sim.count("stream reset stalled") == 1),
        "{}",
        sim.log()
    );
}

#[test]
fn a_sim_engines_tokenizer_is_fetched_with_get_tokenizer_and_serves_chat() {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("target/tokenizers/qwen3");
    if !dir.join("tokenizer.json").is_file() {
        eprintln!("skipped: no tokenizer files (scripts/fetch-tokenizers.sh)");
        return;
    }
    let path = dir.to_string_lossy().to_string();
    let sim = GrpcSim::start(1, "sglang", &["--grpc-tokenizer-dir", &path]);
    let chat = serde_json::json!({
        "model": "sim-model",
        "messages": [{"role": "user", "content": "hello there"}],
        "max_tokens": 4,
    })
    .to_string();
    let answer = |gateway: &Gateway| {
        let mut body = serde_json::Value::Null;
        // Fetched or given, Qwen3's tokenizer takes seconds to load in a debug build on a loaded
        // machine (the whole suite ran past 10 s here), as the sim's own start allows for.
        let loaded = wait_until(6 * TIMEOUT, || {
            let response = gateway.client().post_json("/v1/chat/completions", &chat);
            if response.status == 200 {
                body = response.json();
                return true;
            }
            assert_eq!(response.status, 503, "{}", response.text());
            false
        });
        assert!(loaded, "no tokenizer was loaded");
        body["choices"][0]["message"]["content"].clone()
    };
    let fetched = answer(&Gateway::start(&sim.urls(), &[]));
    let given = answer(&Gateway::start(&sim.urls(), &["--tokenizer-path", &path]));
    assert!(fetched.is_string());
    assert_eq!(fetched, given);
}
