//! Integration tests of `sim-engine` over real loopback HTTP: API shapes, honest cached_tokens,
//! incremental streaming, load reports and metrics, connection counting.

mod sim_support;

use std::io::BufReader;
use std::time::Duration;

use serde_json::{json, Value};
use sim_support::{connect, request, request_on, stream, wait_until, words, SimFleet};

#[test]
fn the_same_prompt_twice_reports_cached_tokens_zero_then_more() {
    let fleet = SimFleet::start(1, &["--speedup", "20"]);
    let body = json!({"text": words(0, 200), "sampling_params": {"max_new_tokens": 4}}).to_string();
    let first = request(fleet.port(0), "POST", "/generate", Some(&body));
    assert_eq!(first.status, 200, "{}", first.text());
    let first = first.json();
    assert_eq!(first["meta_info"]["prompt_tokens"], 200);
    assert_eq!(first["meta_info"]["cached_tokens"], 0);
    assert_eq!(first["meta_info"]["completion_tokens"], 4);
    let second = request(fleet.port(0), "POST", "/generate", Some(&body)).json();
    assert_eq!(
        second["meta_info"]["cached_tokens"], 192,
        "12 whole pages of 16"
    );
    assert_eq!(second["text"], first["text"], "deterministic bodies");

    let chat = json!({"messages": [{"role": "user", "content": words(0, 200)}], "max_tokens": 2});
    let chat = request(
        fleet.port(0),
        "POST",
        "/v1/chat/completions",
        Some(&chat.to_string()),
    )
    .json();
    assert_eq!(chat["usage"]["prompt_tokens"], 200);
    assert_eq!(
        chat["usage"]["prompt_tokens_details"]["cached_tokens"], 192,
        "same words, same tokens"
    );
    assert_eq!(
        chat["choices"][0]["message"]["content"]
            .as_str()
            .unwrap()
            .split(' ')
            .count(),
        2
    );
}

#[test]
fn cache_partitions_and_engines_are_separate() {
    let fleet = SimFleet::start(2, &["--speedup", "20"]);
    let plain = json!({"prompt": words(0, 64), "max_tokens": 1});
    let salted = json!({"prompt": words(0, 64), "max_tokens": 1, "cache_salt": "tenant-a"});
    let cached = |port: u16, body: &Value| {
        let response = request(port, "POST", "/v1/completions", Some(&body.to_string())).json();
        response["usage"]["prompt_tokens_details"]["cached_tokens"]
            .as_u64()
            .unwrap()
    };
    assert_eq!(cached(fleet.port(0), &plain), 0);
    assert_eq!(
        cached(fleet.port(0), &salted),
        0,
        "a salt is its own namespace"
    );
    assert_eq!(
        cached(fleet.port(1), &plain),
        0,
        "engines do not share caches"
    );
    assert_eq!(cached(fleet.port(0), &plain), 48);
    assert_eq!(cached(fleet.port(0), &salted), 48);
}

#[test]
fn streams_arrive_incrementally_and_end_with_done() {
    let fleet = SimFleet::start(1, &[]);
    let body = json!({"messages": [{"role": "user", "content": "hello there"}], "max_tokens": 20, "stream": true});
    let streamed = stream(fleet.port(0), "/v1/chat/completions", &body.to_string());
    assert_eq!(streamed.status, 200);
    assert!(streamed.complete);
    let data = streamed.data();
    assert_eq!(data.last(), Some(&"[DONE]"));
    assert_eq!(
        data.len(),
        20 + 2,
        "one chunk per token, a usage chunk, [DONE]"
    );
    let usage: Value = serde_json::from_str(data[20]).unwrap();
    assert_eq!(usage["usage"]["completion_tokens"], 20);
    let spread = streamed.lines.last().unwrap().at - streamed.lines[0].at;
    // 19 decode steps of at least 5.7 simulated ms at speedup 1.
    assert!(
        spread >= Duration::from_millis(50),
        "chunks arrived within {spread:?}"
    );

    let generate =
        json!({"input_ids": [1, 2, 3], "stream": true, "sampling_params": {"max_new_tokens": 3}});
    let streamed = stream(fleet.port(0), "/generate", &generate.to_string());
    let data = streamed.data();
    assert_eq!(data.len(), 4);
    let last: Value = serde_json::from_str(data[2]).unwrap();
    assert_eq!(last["meta_info"]["completion_tokens"], 3);
    assert_eq!(
        last["text"].as_str().unwrap().split(' ').count(),
        3,
        "cumulative text"
    );
}

#[test]
fn every_endpoint_answers_in_its_shape() {
    let fleet = SimFleet::start(1, &["--speedup", "50", "--model-name", "my-model"]);
    let port = fleet.port(0);
    let models = request(port, "GET", "/v1/models", None).json();
    assert_eq!(models["data"][0]["id"], "my-model");
    assert_eq!(request(port, "GET", "/health", None).status, 200);
    let messages = json!({"system": "be brief", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3});
    let messages = request(port, "POST", "/v1/messages", Some(&messages.to_string())).json();
    assert_eq!(messages["type"], "message");
    assert_eq!(messages["usage"]["input_tokens"], 3);
    assert_eq!(messages["usage"]["output_tokens"], 3);
    let streamed = stream(
        port,
        "/v1/messages",
        &json!({"messages": [], "max_tokens": 2, "stream": true}).to_string(),
    );
    let events: Vec<&str> = streamed
        .lines
        .iter()
        .filter_map(|l| l.line.strip_prefix("event: "))
        .collect();
    assert_eq!(events.first(), Some(&"message_start"));
    assert_eq!(events.last(), Some(&"message_stop"));
    let completions = json!({"prompt": [5, 6, 7], "max_tokens": 2, "stream": true});
    let streamed = stream(port, "/v1/completions", &completions.to_string());
    assert_eq!(streamed.data().last(), Some(&"[DONE]"));
    let default_length = request(port, "POST", "/v1/completions", Some(r#"{"prompt":"x"}"#)).json();
    assert_eq!(
        default_length["usage"]["completion_tokens"], 128,
        "--default-max-tokens"
    );
    assert_eq!(default_length["choices"][0]["finish_reason"], "stop");
}

#[test]
fn bad_requests_get_json_errors() {
    let fleet = SimFleet::start(1, &["--kv-capacity-tokens", "1024"]);
    let port = fleet.port(0);
    let malformed = request(
        port,
        "POST",
        "/v1/chat/completions",
        Some("{\"messages\": ["),
    );
    assert_eq!(malformed.status, 400);
    assert_eq!(malformed.json()["error"]["code"], 400);
    let unknown = request(port, "GET", "/nope", None);
    assert_eq!(unknown.status, 404);
    assert!(unknown.json()["error"]["message"].is_string());
    assert_eq!(request(port, "GET", "/generate", None).status, 405);
    let too_long = json!({"text": words(0, 2000)});
    let too_long = request(port, "POST", "/generate", Some(&too_long.to_string()));
    assert_eq!(too_long.status, 400);
    assert!(too_long.text().contains("KV capacity"));
}

fn first_load(port: u16) -> Value {
    request(port, "GET", "/v1/loads", None).json()["loads"][0].clone()
}

#[test]
fn loads_and_metrics_reflect_a_running_stream() {
    let fleet = SimFleet::start(1, &["--metrics-flavor", "sglang"]);
    let port = fleet.port(0);
    assert_eq!(first_load(port)["num_running_reqs"], 0);
    let body =
        json!({"text": words(0, 500), "stream": true, "sampling_params": {"max_new_tokens": 150}});
    let client = std::thread::spawn(move || stream(port, "/generate", &body.to_string()));
    assert!(wait_until(Duration::from_secs(5), || first_load(port)
        ["num_running_reqs"]
        == 1));
    let load = first_load(port);
    assert!(load["num_used_tokens"].as_u64().unwrap() >= 500, "{load}");
    assert!(load["token_usage"].as_f64().unwrap() > 0.0);
    assert_eq!(load["max_total_num_tokens"], 262_144);
    let metrics = request(port, "GET", "/metrics", None).text();
    assert!(
        metrics.contains("sglang:num_running_reqs{model_name=\"sim-model\"} 1\n"),
        "{metrics}"
    );
    assert!(metrics.contains("sglang:num_queue_reqs{model_name=\"sim-model\"} 0\n"));
    let streamed = client.join().unwrap();
    assert!(streamed.complete);
    let load = first_load(port);
    assert_eq!(load["num_running_reqs"], 0);
    assert!(load["gen_throughput"].as_f64().unwrap() > 0.0, "{load}");
    let metrics = request(port, "GET", "/metrics", None).text();
    assert!(metrics.contains("sglang:num_running_reqs{model_name=\"sim-model\"} 0\n"));
    assert!(metrics.contains("sglang:generation_tokens_total{model_name=\"sim-model\"} 150\n"));
}

#[test]
fn vllm_flavor_uses_vllm_names() {
    let fleet = SimFleet::start(1, &["--metrics-flavor", "vllm"]);
    let metrics = request(fleet.port(0), "GET", "/metrics", None).text();
    assert!(metrics.contains("vllm:num_requests_running{model_name=\"sim-model\"} 0\n"));
    assert!(metrics.contains("vllm:num_requests_waiting"));
    assert!(!metrics.contains("sglang:"));
}

#[test]
fn accepted_connections_are_counted_per_engine() {
    let fleet = SimFleet::start(2, &["--instant"]);
    let accepted = |port: u16| -> u64 {
        let stats = request(port, "GET", "/sim/stats", None).json();
        stats["connections_accepted"].as_u64().unwrap()
    };
    let before = accepted(fleet.port(0));
    let mut reader = BufReader::new(connect(fleet.port(0)));
    for _ in 0..20 {
        let response = request_on(
            &mut reader,
            "POST",
            "/v1/completions",
            Some(r#"{"prompt":"a b","max_tokens":2}"#),
        );
        assert_eq!(response.status, 200);
    }
    // The stats request itself is one more connection.
    assert_eq!(
        accepted(fleet.port(0)),
        before + 2,
        "keep-alive reuses one connection"
    );
    for _ in 0..3 {
        request(fleet.port(0), "GET", "/health", None);
    }
    assert_eq!(accepted(fleet.port(0)), before + 6);
    assert_eq!(accepted(fleet.port(1)), 1, "engine 1 counts only its own");
}

#[test]
fn instant_mode_answers_every_shape_at_once() {
    let fleet = SimFleet::start(1, &["--instant"]);
    let body =
        json!({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 50, "stream": true});
    let streamed = stream(fleet.port(0), "/v1/chat/completions", &body.to_string());
    assert_eq!(streamed.data().len(), 52);
    let generate = request(
        fleet.port(0),
        "POST",
        "/generate",
        Some(r#"{"text":"a b c"}"#),
    )
    .json();
    assert_eq!(generate["meta_info"]["prompt_tokens"], 3);
    assert_eq!(generate["meta_info"]["cached_tokens"], 0);
}
