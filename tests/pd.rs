//! Prefill/decode disaggregation end to end: kvgate with `--pd-disaggregation` in front of two
//! `sim-engine` fleets, one `--role prefill`, one `--role decode`: both handshakes (SGLang's
//! bootstrap rooms, vLLM's `kv_transfer_params`), streaming and not, a batch, the logprob
//! merge, failures (a failing prefill retried, a failing decode, a missing role's 503), role
//! eligibility, the admin API's `worker_type`, and the flag errors.

mod utils;

use std::process::Command;
use std::time::Duration;

use serde_json::{json, Value};
use utils::process::{free_port, workspace_bin, Gateway, SimFleet};
use utils::{chat, wait_until, TIMEOUT};

/// A prefill fleet and a decode fleet of `engines` each, the transfer quick.
fn fleets(engines: u16, extra: &[&str]) -> (SimFleet, SimFleet) {
    let common = ["--speedup", "20", "--transfer-timeout-ms", "5000"];
    let prefill = SimFleet::start(
        engines,
        &[&["--role", "prefill"], &common[..], extra].concat(),
    );
    let decode = SimFleet::start(
        engines,
        &[&["--role", "decode"], &common[..], extra].concat(),
    );
    (prefill, decode)
}

/// kvgate in PD mode: each prefill engine's bootstrap server is its own HTTP port (the sim
/// serves it there), each decode engine a `--decode`.
fn pd_gateway(prefill: &SimFleet, decode: &SimFleet, args: &[&str]) -> Gateway {
    let mut flags: Vec<String> = vec!["--pd-disaggregation".into()];
    for i in 0..prefill.engines {
        flags.extend([
            "--prefill".into(),
            prefill.url(i),
            prefill.port(i).to_string(),
        ]);
    }
    for i in 0..decode.engines {
        flags.extend(["--decode".into(), decode.url(i)]);
    }
    flags.extend(args.iter().map(|a| a.to_string()));
    let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
    Gateway::start(&[], &flags)
}

/// Requests each engine of `fleet` admitted.
fn queued(fleet: &SimFleet) -> Vec<u64> {
    (0..fleet.engines)
        .map(|i| fleet.stats(i)["requests_queued"].as_u64().unwrap_or(0))
        .collect()
}

fn generate(text: &str, max_new_tokens: u32, stream: bool) -> String {
    json!({"text": text, "sampling_params": {"max_new_tokens": max_new_tokens}, "stream": stream})
        .to_string()
}

#[test]
fn sglang_pairs_answer_streaming_and_not_from_the_decode_side_with_each_role_in_its_place() {
    let (prefill, decode) = fleets(2, &[]);
    let gateway = pd_gateway(&prefill, &decode, &["--decode-policy", "round_robin"]);
    let mut client = gateway.client();
    let requests = 8u64;
    for i in 0..requests {
        let stream = i % 2 == 1;
        let response = client.post_json("/generate", &generate(&format!("story {i}"), 6, stream));
        assert_eq!(response.status, 200, "{}", response.text());
        let worker = response.routed_worker().unwrap_or_default().to_string();
        assert!(decode.urls().contains(&worker), "answered by {worker}");
        if stream {
            assert_eq!(response.header("content-type"), Some("text/event-stream"));
            assert!(
                response.text().trim_end().ends_with("data: [DONE]"),
                "{}",
                response.text()
            );
        } else {
            assert_eq!(response.json()["meta_info"]["completion_tokens"], 6);
        }
    }
    let chat_stream = client.post_json("/v1/chat/completions", &chat("hello there", 4, true));
    assert_eq!(chat_stream.status, 200, "{}", chat_stream.text());
    assert!(chat_stream.text().contains("[DONE]"));
    // Every request ran once on each side: a decode worker never got a prefill's request
    // (it would have refused it without its room) and the reverse.
    let total = requests + 1;
    assert_eq!(queued(&prefill).iter().sum::<u64>(), total);
    assert_eq!(queued(&decode).iter().sum::<u64>(), total);
    // round_robin on the decode side spreads; both decode engines served.
    assert!(
        queued(&decode).iter().all(|n| *n > 0),
        "{:?}",
        queued(&decode)
    );
    let listed = client.get("/workers").json();
    let types: Vec<&str> = listed["workers"]
        .as_array()
        .map(|w| w.iter().filter_map(|w| w["worker_type"].as_str()).collect())
        .unwrap_or_default();
    assert_eq!(types, ["prefill", "prefill", "decode", "decode"]);
    assert_eq!(listed["workers"][0]["bootstrap_port"], prefill.port(0));
    // Each worker's series carry its worker_type and its side's policy.
    let metrics = gateway.metrics();
    let selection = |worker_type: &str, policy: &str, url: &str| {
        format!(
            "smg_worker_selection_total{{worker_type=\"{worker_type}\",connection_mode=\"http\",\
             model=\"sim-model\",policy=\"{policy}\",worker=\"{url}\"}}"
        )
    };
    for (worker_type, policy, url) in [
        ("prefill", "cache_aware", prefill.url(0)),
        ("decode", "round_robin", decode.url(1)),
    ] {
        let series = selection(worker_type, policy, &url);
        assert!(metrics.contains(&series), "{series} not in\n{metrics}");
    }
}

#[test]
fn a_shared_prefix_goes_to_the_prefill_engine_that_holds_it_whatever_the_routing_tokens_header() {
    let (prefill, decode) = fleets(2, &[]);
    let gateway = pd_gateway(&prefill, &decode, &["--prefill-policy", "cache_aware"]);
    let mut client = gateway.client();
    let prefix = "the quick brown fox jumps over the lazy dog ".repeat(40);
    for i in 0..6u32 {
        let text = format!("{prefix} question {i}");
        // Distinct routing tokens on every request: in regular mode each would be its own key
        // (a miss, spread by load); in PD mode the spec ignores the header and the prompt routes.
        let tokens: Vec<String> = (0..256).map(|t| (i * 1000 + t).to_string()).collect();
        let tokens = tokens.join(",");
        let headers = [
            ("content-type", "application/json"),
            ("x-smg-routing-tokens", tokens.as_str()),
        ];
        let body = generate(&text, 2, false);
        let response = client.request("POST", "/generate", &headers, body.as_bytes());
        assert_eq!(response.status, 200, "{}", response.text());
    }
    // cache_aware on the prefill side: one engine got every request of the prefix.
    let counts = queued(&prefill);
    assert!(counts.contains(&6) && counts.contains(&0), "{counts:?}");
}

#[test]
fn a_batch_gets_one_room_per_item_and_logprobs_are_merged_from_the_prefill() {
    let (prefill, decode) = fleets(1, &[]);
    let gateway = pd_gateway(&prefill, &decode, &[]);
    let mut client = gateway.client();
    let batch = json!({"text": ["one two", "three four", "five six"],
        "sampling_params": {"max_new_tokens": 2}});
    let response = client.post_json("/generate", &batch.to_string());
    assert_eq!(response.status, 200, "{}", response.text());
    let text = "a b c d e f g";
    let logprobs = json!({"text": text, "return_logprob": true,
        "sampling_params": {"max_new_tokens": 3}});
    let response = client.post_json("/generate", &logprobs.to_string());
    assert_eq!(response.status, 200, "{}", response.text());
    // The decode engine lists no input logprobs; the prefill engine lists one per prompt
    // token: the answer has the prefill's, first.
    let merged = response.json()["meta_info"]["input_token_logprobs"].clone();
    let merged = merged.as_array().cloned().unwrap_or_default();
    assert_eq!(merged.len(), 7, "{}", response.text());
    assert_eq!(merged[0][1], 0);
    let mut streamed = logprobs.clone();
    streamed["stream"] = Value::Bool(true);
    // Enough tokens (about 0.2 s of the sim's decode) that a loaded machine, which can leave
    // the test's reader unscheduled for tens of milliseconds, still sees them in several reads.
    streamed["sampling_params"]["max_new_tokens"] = json!(32);
    let response = client.post_json("/generate", &streamed.to_string());
    assert_eq!(response.status, 200, "{}", response.text());
    // The decode's events are relayed as they come (more than one chunk), each with the
    // prefill's input logprobs merged in: the first already carries them.
    assert_eq!(
        response.header("transfer-encoding"),
        Some("chunked"),
        "{:?}",
        response.headers
    );
    assert!(
        response.chunk_times.len() > 1,
        "{} chunk(s): {}",
        response.chunk_times.len(),
        response.text()
    );
    assert_eq!(response.routed_worker(), Some(decode.url(0).as_str()));
    assert!(response.text().trim_end().ends_with("data: [DONE]"));
    let events: Vec<Value> = response
        .text()
        .lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .filter_map(|d| serde_json::from_str(d).ok())
        .collect();
    assert!(events.len() > 1, "{}", response.text());
    let first = events[0]["meta_info"]["input_token_logprobs"].clone();
    assert_eq!(first.as_array().map(Vec::len), Some(7), "{}", events[0]);
    assert_eq!(first[0][1], 0);
    for event in events {
        let listed = event["meta_info"]["input_token_logprobs"]
            .as_array()
            .map(Vec::len);
        assert_eq!(listed, Some(7), "{event}");
    }
    // A decode that drops its stream after the first event: the client gets that event merged,
    // then the relay's SSE error event, in a whole chunked body.
    decode.set_faults(0, json!({"drop_mid_stream": true}));
    let response = client.post_json("/generate", &streamed.to_string());
    assert_eq!(response.status, 200, "{}", response.text());
    assert!(response.complete, "{}", response.text());
    let text = response.text();
    assert!(text.contains("input_token_logprobs"), "{text}");
    assert!(
        text.contains("the worker closed the stream before it finished"),
        "{text}"
    );
}

#[test]
fn vllm_pairs_pass_the_prefills_kv_transfer_params_to_the_decode() {
    let (prefill, decode) = fleets(1, &[]);
    let gateway = pd_gateway(&prefill, &decode, &["--backend", "vllm"]);
    let mut client = gateway.client();
    for stream in [false, true] {
        let response = client.post_json("/v1/chat/completions", &chat("hi vllm", 5, stream));
        assert_eq!(response.status, 200, "{}", response.text());
        assert_eq!(response.routed_worker(), Some(decode.url(0).as_str()));
        if !stream {
            assert_eq!(response.json()["usage"]["completion_tokens"], 5);
        }
    }
    assert_eq!(queued(&prefill), [2]);
    assert_eq!(queued(&decode), [2]);
}

#[test]
fn without_backend_the_handshake_is_the_prefill_engines_as_its_models_list_names_it() {
    // Engines that say they are vLLM (`owned_by` in /v1/models), no --backend, and a prefill
    // whose bootstrap port is closed: SGLang's handshake would leave the decode waiting for a
    // transfer that never comes (a 500 after the sim's timeout); vLLM's passes the prefill's
    // kv_transfer_params instead and answers.
    let (prefill, decode) = fleets(1, &["--owned-by", "vllm"]);
    let closed = free_port().to_string();
    let flags = [
        "--pd-disaggregation",
        "--prefill",
        &prefill.url(0),
        &closed,
        "--decode",
        &decode.url(0),
    ];
    let gateway = Gateway::start(&[], &flags);
    let mut client = gateway.client();
    // The engines' /v1/models answered (the catalog lists the model with its owner).
    assert!(wait_until(TIMEOUT, || {
        let models = client.get("/v1/models").json();
        models["data"][0]["owned_by"] == "vllm"
    }));
    for stream in [false, true] {
        let response = client.post_json("/v1/chat/completions", &chat("hi vllm", 5, stream));
        assert_eq!(response.status, 200, "{}", response.text());
        assert_eq!(response.routed_worker(), Some(decode.url(0).as_str()));
    }
    assert_eq!(queued(&prefill), [2]);
    assert_eq!(queued(&decode), [2]);
}

#[test]
fn the_decision_log_names_the_side_each_worker_was_chosen_for() {
    let (prefill, decode) = fleets(1, &[]);
    let dir = std::env::temp_dir().join(format!("kvgate-pd-log-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let log_path = dir.join("kvgate.log");
    let log = std::fs::File::create(&log_path).expect("log file");
    let port = prefill.port(0).to_string();
    let flags = [
        "--pd-disaggregation",
        "--prefill",
        &prefill.url(0),
        &port,
        "--decode",
        &decode.url(0),
        "--policy",
        "cache_aware",
        "--log-level",
        "debug",
        "--log-json",
    ];
    let gateway = Gateway::start_logging(&[], &flags, Some(log));
    let response = gateway
        .client()
        .post_json("/generate", &generate("which side am I", 2, false));
    assert_eq!(response.status, 200, "{}", response.text());
    let decided = |worker_type: &'static str| {
        move |line: &Value| {
            line["message"] == "Cache-aware selection" && line["worker_type"] == worker_type
        }
    };
    let lines = || -> Vec<Value> {
        let text = std::fs::read_to_string(&log_path).unwrap_or_default();
        text.lines()
            .filter_map(|l| serde_json::from_str(l).ok())
            .collect()
    };
    assert!(
        wait_until(TIMEOUT, || {
            let lines = lines();
            lines.iter().any(decided("prefill")) && lines.iter().any(decided("decode"))
        }),
        "{:?}",
        lines()
    );
    // Each decision names its own side's worker.
    let lines = lines();
    let worker_of = |side| {
        let line = lines.iter().find(|l| decided(side)(l));
        line.map(|l| l["worker"].as_str().unwrap_or_default().to_string())
    };
    assert_eq!(worker_of("prefill"), Some(prefill.url(0)));
    assert_eq!(worker_of("decode"), Some(decode.url(0)));
    drop(gateway);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_failing_prefill_is_retried_on_another_and_a_failing_decode_fails_the_request() {
    let (prefill, decode) = fleets(2, &[]);
    let gateway = pd_gateway(&prefill, &decode, &["--prefill-policy", "round_robin"]);
    prefill.set_faults(0, json!({"error_rate": 1.0, "error_status": 500}));
    let mut client = gateway.client();
    for i in 0..4 {
        let response = client.post_json("/generate", &generate(&format!("retry {i}"), 2, false));
        assert_eq!(response.status, 200, "{}", response.text());
    }
    // The failing engine was tried (round robin) and every request still went through.
    let failing = prefill.stats(0)["requests_total"].as_u64().unwrap_or(0);
    assert!(failing > 0);
    assert_eq!(queued(&prefill)[1], 4);
    prefill.set_faults(0, json!({"reset": true}));
    for i in 0..2 {
        decode.set_faults(i, json!({"error_rate": 1.0, "error_status": 500}));
    }
    let response = client.post_json("/generate", &generate("no decode", 2, false));
    assert!(response.status >= 500, "{}", response.text());
}

#[test]
fn pd_records_stay_on_their_gateway_and_are_not_broadcast_over_the_mesh() {
    let (prefill, decode) = fleets(2, &[]);
    let secret = std::env::temp_dir().join(format!("kvgate-pd-mesh-{}", std::process::id()));
    std::fs::write(&secret, "kvgate-tests-pd-mesh-shared-secret-0123456789\n").expect("secret");
    let secret = secret.to_str().unwrap_or_default().to_string();
    let ports = [free_port(), free_port()];
    let mesh = |i: usize| {
        let mut args = vec![
            "--enable-mesh".to_string(),
            "--mesh-host".into(),
            "127.0.0.1".into(),
            "--mesh-port".into(),
            ports[i].to_string(),
            "--mesh-secret-file".into(),
            secret.clone(),
        ];
        if i == 1 {
            args.extend(["--mesh-peer-urls".into(), format!("127.0.0.1:{}", ports[0])]);
        }
        args
    };
    let gateways: Vec<Gateway> = (0..2)
        .map(|i| {
            let args = mesh(i);
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            pd_gateway(&prefill, &decode, &args)
        })
        .collect();
    let alive = |g: &Gateway| g.metric("kvgate_mesh_peers{state=\"alive\"}");
    assert!(wait_until(Duration::from_secs(40), || gateways
        .iter()
        .all(|g| alive(g) == 1.0)));
    let mut client = gateways[0].client();
    for i in 0..8 {
        let text = format!("{} family {i}", "shared words ".repeat(60));
        let response = client.post_json("/generate", &generate(&text, 2, false));
        assert_eq!(response.status, 200, "{}", response.text());
    }
    // Ten mesh rounds and more: a regular gateway has sent its deltas by then (tests/mesh.rs).
    std::thread::sleep(Duration::from_millis(1500));
    let sent = gateways[0].metric("kvgate_mesh_deltas_total{outcome=\"sent\"}");
    let received = gateways[1].metric("kvgate_mesh_deltas_total{outcome=\"received\"}");
    assert_eq!((sent, received), (0.0, 0.0));
    assert_eq!(queued(&prefill).iter().sum::<u64>(), 8);
}

#[test]
fn a_fleet_without_one_role_answers_503_naming_it() {
    let (prefill, decode) = fleets(1, &[]);
    let decode_only = Gateway::start(&[], &["--pd-disaggregation", "--decode", &decode.url(0)]);
    let response = decode_only
        .client()
        .post_json("/generate", &generate("x", 1, false));
    assert_eq!(response.status, 503, "{}", response.text());
    assert!(response.text().contains("prefill"), "{}", response.text());
    let port = prefill.port(0).to_string();
    let prefill_only = Gateway::start(
        &[],
        &["--pd-disaggregation", "--prefill", &prefill.url(0), &port],
    );
    let response = prefill_only
        .client()
        .post_json("/generate", &generate("x", 1, false));
    assert_eq!(response.status, 503, "{}", response.text());
    assert!(response.text().contains("decode"), "{}", response.text());
    // A decode worker added through the admin API completes the pair.
    let add = json!({"url": decode.url(0), "worker_type": "decode"});
    let added = prefill_only
        .client()
        .post_json("/workers", &add.to_string());
    assert!(added.status < 300, "{}", added.text());
    let regular = json!({"url": "http://127.0.0.1:9", "worker_type": "regular"});
    let refused = prefill_only
        .client()
        .post_json("/workers", &regular.to_string());
    assert_eq!(refused.status, 400, "{}", refused.text());
    let mut client = prefill_only.client();
    assert!(wait_until(TIMEOUT, || {
        client
            .post_json("/generate", &generate("x", 1, false))
            .status
            == 200
    }));
}

#[test]
fn a_decode_whose_transfer_never_comes_fails_with_the_engines_error() {
    let decode = SimFleet::start(1, &["--role", "decode", "--transfer-timeout-ms", "300"]);
    let body = json!({"text": "x", "bootstrap_host": "127.0.0.1", "bootstrap_port": 9,
        "bootstrap_room": 42});
    let response = decode.client(0).post_json("/generate", &body.to_string());
    assert_eq!(response.status, 500, "{}", response.text());
    assert!(
        response.text().contains("KVTransferError"),
        "{}",
        response.text()
    );
    let plain = decode
        .client(0)
        .post_json("/generate", &generate("x", 1, false));
    assert_eq!(plain.status, 400, "{}", plain.text());
    std::thread::sleep(Duration::from_millis(10));
}

#[test]
fn pd_flag_errors_are_one_line() {
    for (args, flag) in [
        (
            &[
                "--pd-disaggregation",
                "--prefill",
                "http://127.0.0.1:1",
                "0",
            ][..],
            "--prefill",
        ),
        (&["--pd-disaggregation", "--prefill", "9001"], "--prefill"),
        (
            &["--worker-startup-check-interval", "0"],
            "--worker-startup-check-interval",
        ),
    ] {
        let output = Command::new(workspace_bin("kvgate"))
            .args(args)
            .output()
            .expect("run kvgate");
        assert!(!output.status.success(), "{args:?}");
        let stderr = String::from_utf8_lossy(&output.stderr);
        let lines: Vec<&str> = stderr.lines().filter(|l| !l.trim().is_empty()).collect();
        assert_eq!(lines.len(), 1, "{stderr}");
        assert!(
            lines[0].starts_with("Error:") && lines[0].contains(flag),
            "{stderr}"
        );
    }
}

#[test]
fn the_openai_and_anthropic_sdks_talk_to_a_pd_fleet_whole_and_streamed() {
    let Some(python) = utils::sdk_python() else {
        return;
    };
    let (prefill, decode) = fleets(2, &[]);
    let gateway = pd_gateway(&prefill, &decode, &["--decode-policy", "round_robin"]);
    let script =
        std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/sdk_client.py");
    let output = Command::new(python)
        .arg(script)
        .arg(format!("http://127.0.0.1:{}", gateway.port))
        .arg("sim-model")
        .output()
        .expect("the SDK client runs");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "the SDK client failed:\n{stderr}");
    let answers: Value = serde_json::from_slice(&output.stdout).expect("one JSON line");
    for text in [
        "openai_text",
        "openai_stream_text",
        "anthropic_text",
        "anthropic_stream_text",
    ] {
        let text = answers[text].as_str().unwrap_or_default();
        assert!(!text.is_empty(), "{answers}");
    }
    assert_eq!(answers["openai_finish"], "length", "{answers}");
    assert_eq!(answers["openai_completion_tokens"], 8, "{answers}");
    assert_eq!(answers["openai_stream_finish"], "length", "{answers}");
    assert!(
        answers["openai_stream_chunks"].as_u64() > Some(2),
        "{answers}"
    );
    assert_eq!(answers["anthropic_stop"], "max_tokens", "{answers}");
    // Every one of the four went through a pair: each side admitted four requests.
    assert_eq!(queued(&prefill).iter().sum::<u64>(), 4);
    assert_eq!(queued(&decode).iter().sum::<u64>(), 4);
}
