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
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::mpsc;

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
        match rx.recv_timeout(TIMEOUT) {
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
        let loaded = wait_until(TIMEOUT, || {
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
