//! Integration tests of `sim-engine` over real loopback HTTP: API shapes, honest cached_tokens,
//! incremental streaming, load reports and metrics, connection counting.

#[path = "../../tests/utils/mod.rs"]
mod utils;

use std::time::Duration;

use serde_json::{json, Value};
use utils::client::Response;
use utils::process::SimFleet;
use utils::wait_until;

/// A text prompt of `count` distinct words (one sim-engine token each) from word `first` on.
fn words(first: u64, count: u64) -> String {
    (first..first + count)
        .map(bench_harness::tokenize::synthetic_word)
        .collect::<Vec<_>>()
        .join(" ")
}

/// A streamed chat answer of `max_tokens` tokens to "hi" from engine 0.
fn stream_hi(fleet: &SimFleet, max_tokens: u32) -> Response {
    let body = json!({"messages": [{"role": "user", "content": "hi"}], "max_tokens": max_tokens, "stream": true});
    fleet
        .client(0)
        .post_json_even_if_cut("/v1/chat/completions", &body.to_string())
}

#[test]
fn the_same_prompt_twice_reports_cached_tokens_zero_then_more() {
    let fleet = SimFleet::start(1, &["--speedup", "20"]);
    let body = json!({"text": words(0, 200), "sampling_params": {"max_new_tokens": 4}}).to_string();
    let first = fleet.client(0).post_json("/generate", &body);
    assert_eq!(first.status, 200, "{}", first.text());
    let first = first.json();
    assert_eq!(first["meta_info"]["prompt_tokens"], 200);
    assert_eq!(first["meta_info"]["cached_tokens"], 0);
    assert_eq!(first["meta_info"]["completion_tokens"], 4);
    let second = fleet.client(0).post_json("/generate", &body).json();
    assert_eq!(
        second["meta_info"]["cached_tokens"], 192,
        "12 whole pages of 16"
    );
    assert_eq!(second["text"], first["text"], "deterministic bodies");

    let chat = json!({"messages": [{"role": "user", "content": words(0, 200)}], "max_tokens": 2});
    let chat = fleet
        .client(0)
        .post_json("/v1/chat/completions", &chat.to_string())
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
    let cached = |engine: u16, body: &Value| {
        let response = fleet
            .client(engine)
            .post_json("/v1/completions", &body.to_string())
            .json();
        response["usage"]["prompt_tokens_details"]["cached_tokens"]
            .as_u64()
            .unwrap()
    };
    assert_eq!(cached(0, &plain), 0);
    assert_eq!(cached(0, &salted), 0, "a salt is its own namespace");
    assert_eq!(cached(1, &plain), 0, "engines do not share caches");
    assert_eq!(cached(0, &plain), 48);
    assert_eq!(cached(0, &salted), 48);
}

#[test]
fn streams_arrive_incrementally_and_end_with_done() {
    let fleet = SimFleet::start(1, &[]);
    let body = json!({"messages": [{"role": "user", "content": "hello there"}], "max_tokens": 40, "stream": true});
    let streamed = fleet
        .client(0)
        .post_json_even_if_cut("/v1/chat/completions", &body.to_string());
    assert_eq!(streamed.status, 200);
    assert!(streamed.complete);
    let data = streamed.sse_data();
    assert_eq!(data.last(), Some(&"[DONE]"));
    assert_eq!(
        data.len(),
        40 + 2,
        "one chunk per token, a usage chunk, [DONE]"
    );
    let usage: Value = serde_json::from_str(data[40]).unwrap();
    assert_eq!(usage["usage"]["completion_tokens"], 40);
    let lines = streamed.sse_lines();
    let spread = lines.last().expect("SSE lines").at - lines[0].at;
    // 39 decode steps of at least 5.7 simulated ms at speedup 1 (224 ms): a step is never
    // delivered before it ends, so only a first chunk delayed by over 170 ms could shrink this.
    assert!(
        spread >= Duration::from_millis(50),
        "chunks arrived within {spread:?}"
    );

    let generate =
        json!({"input_ids": [1, 2, 3], "stream": true, "sampling_params": {"max_new_tokens": 3}});
    let streamed = fleet
        .client(0)
        .post_json_even_if_cut("/generate", &generate.to_string());
    let data = streamed.sse_data();
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
    let models = fleet.client(0).get("/v1/models").json();
    assert_eq!(models["data"][0]["id"], "my-model");
    assert_eq!(fleet.client(0).get("/health").status, 200);
    let messages = json!({"system": "be brief", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3});
    let messages = fleet
        .client(0)
        .post_json("/v1/messages", &messages.to_string())
        .json();
    assert_eq!(messages["type"], "message");
    assert_eq!(messages["usage"]["input_tokens"], 3);
    assert_eq!(messages["usage"]["output_tokens"], 3);
    let streamed = fleet.client(0).post_json_even_if_cut(
        "/v1/messages",
        &json!({"messages": [], "max_tokens": 2, "stream": true}).to_string(),
    );
    let events: Vec<&str> = streamed
        .sse_lines()
        .into_iter()
        .filter_map(|l| l.line.strip_prefix("event: "))
        .collect();
    assert_eq!(events.first(), Some(&"message_start"));
    assert_eq!(events.last(), Some(&"message_stop"));
    let completions = json!({"prompt": [5, 6, 7], "max_tokens": 2, "stream": true});
    let streamed = fleet
        .client(0)
        .post_json_even_if_cut("/v1/completions", &completions.to_string());
    assert_eq!(streamed.sse_data().last(), Some(&"[DONE]"));
    let default_length = fleet
        .client(0)
        .post_json("/v1/completions", r#"{"prompt":"x"}"#)
        .json();
    assert_eq!(
        default_length["usage"]["completion_tokens"], 128,
        "--default-max-tokens"
    );
    assert_eq!(default_length["choices"][0]["finish_reason"], "stop");
}

#[test]
fn bad_requests_get_json_errors() {
    let fleet = SimFleet::start(1, &["--kv-capacity-tokens", "1024"]);
    let malformed = fleet
        .client(0)
        .post_json("/v1/chat/completions", "{\"messages\": [");
    assert_eq!(malformed.status, 400);
    assert_eq!(malformed.json()["error"]["code"], 400);
    let unknown = fleet.client(0).get("/nope");
    assert_eq!(unknown.status, 404);
    assert!(unknown.json()["error"]["message"].is_string());
    assert_eq!(fleet.client(0).get("/generate").status, 405);
    let too_long = json!({"text": words(0, 2000)});
    let too_long = fleet
        .client(0)
        .post_json("/generate", &too_long.to_string());
    assert_eq!(too_long.status, 400);
    assert!(too_long.text().contains("KV capacity"));
}

fn first_load(fleet: &SimFleet) -> Value {
    fleet.client(0).get("/v1/loads").json()["loads"][0].clone()
}

#[test]
fn loads_and_metrics_reflect_a_running_stream() {
    let fleet = SimFleet::start(1, &["--metrics-flavor", "sglang"]);
    assert_eq!(first_load(&fleet)["num_running_reqs"], 0);
    let body =
        json!({"text": words(0, 500), "stream": true, "sampling_params": {"max_new_tokens": 300}});
    let mut client = fleet.client(0);
    let client =
        std::thread::spawn(move || client.post_json_even_if_cut("/generate", &body.to_string()));
    assert!(wait_until(Duration::from_secs(5), || first_load(&fleet)
        ["num_running_reqs"]
        == 1));
    let load = first_load(&fleet);
    assert!(load["num_used_tokens"].as_u64().unwrap() >= 500, "{load}");
    assert!(load["token_usage"].as_f64().unwrap() > 0.0);
    assert_eq!(load["max_total_num_tokens"], 262_144);
    let metrics = fleet.client(0).get("/metrics").text();
    assert!(
        metrics.contains("sglang:num_running_reqs{model_name=\"sim-model\"} 1\n"),
        "{metrics}"
    );
    assert!(metrics.contains("sglang:num_queue_reqs{model_name=\"sim-model\"} 0\n"));
    let streamed = client.join().expect("the streaming client failed");
    assert!(streamed.complete);
    let load = first_load(&fleet);
    assert_eq!(load["num_running_reqs"], 0);
    assert!(load["gen_throughput"].as_f64().unwrap() > 0.0, "{load}");
    let metrics = fleet.client(0).get("/metrics").text();
    assert!(metrics.contains("sglang:num_running_reqs{model_name=\"sim-model\"} 0\n"));
    assert!(metrics.contains("sglang:generation_tokens_total{model_name=\"sim-model\"} 300\n"));
}

#[test]
fn vllm_flavor_uses_vllm_names() {
    let fleet = SimFleet::start(1, &["--metrics-flavor", "vllm"]);
    let metrics = fleet.client(0).get("/metrics").text();
    assert!(metrics.contains("vllm:num_requests_running{model_name=\"sim-model\"} 0\n"));
    assert!(metrics.contains("vllm:num_requests_waiting"));
    assert!(!metrics.contains("sglang:"));
}

#[test]
fn accepted_connections_are_counted_per_engine() {
    let fleet = SimFleet::start(2, &["--instant"]);
    let accepted = |engine: u16| -> u64 {
        let stats = fleet.stats(engine);
        stats["connections_accepted"]
            .as_u64()
            .unwrap_or_else(|| panic!("no connections_accepted: {stats}"))
    };
    let before = accepted(0);
    let mut client = fleet.client(0);
    for _ in 0..20 {
        let response = client.post_json("/v1/completions", r#"{"prompt":"a b","max_tokens":2}"#);
        assert_eq!(response.status, 200);
    }
    // The stats request itself is one more connection.
    assert_eq!(accepted(0), before + 2, "keep-alive reuses one connection");
    for _ in 0..3 {
        fleet.client(0).get("/health");
    }
    assert_eq!(accepted(0), before + 6);
    assert_eq!(accepted(1), 1, "engine 1 counts only its own");
}

#[test]
fn instant_mode_answers_every_shape_at_once() {
    let fleet = SimFleet::start(1, &["--instant"]);
    let streamed = stream_hi(&fleet, 50);
    assert_eq!(streamed.sse_data().len(), 52);
    let generate = fleet
        .client(0)
        .post_json("/generate", r#"{"text":"a b c"}"#)
        .json();
    assert_eq!(generate["meta_info"]["prompt_tokens"], 3);
    assert_eq!(generate["meta_info"]["cached_tokens"], 0);
    // Repeated bodies are answered from the instant cache: same bytes, faults still apply.
    let again = fleet
        .client(0)
        .post_json("/generate", r#"{"text":"a b c"}"#);
    assert_eq!(again.json(), generate);
    let streamed_again = stream_hi(&fleet, 50);
    assert_eq!(streamed_again.sse_data(), streamed.sse_data());
    fleet.set_faults(0, json!({"error_rate": 1.0, "error_status": 429}));
    let refused = fleet
        .client(0)
        .post_json("/generate", r#"{"text":"a b c"}"#);
    assert_eq!(refused.status, 429);
}

#[test]
fn reported_latency_is_simulated_time_at_any_speedup() {
    let fleet = SimFleet::start(1, &["--speedup", "100"]);
    let cost = bench_harness::sim::cost::CostModel::default();
    let body = json!({"text": words(0, 1000), "sampling_params": {"max_new_tokens": 10}});
    let response = fleet
        .client(0)
        .post_json("/generate", &body.to_string())
        .json();
    let e2e_ms = response["meta_info"]["e2e_latency"].as_f64().unwrap() * 1000.0;
    // Prefill of 1000 uncached tokens, then 9 decode steps holding about 1005 KV tokens.
    let expected_ms = cost.prefill_ms(1000) + 9.0 * cost.decode_ms_holding(1005);
    assert!(
        (e2e_ms - expected_ms).abs() < 0.5,
        "e2e {e2e_ms:.3} ms, model {expected_ms:.3} ms"
    );
}

#[test]
fn a_multi_threaded_runtime_serves_the_same_answers() {
    let fleet = SimFleet::start(2, &["--threads", "2", "--speedup", "50"]);
    let body = json!({"text": words(0, 100), "sampling_params": {"max_new_tokens": 3}}).to_string();
    let first = fleet.client(1).post_json("/generate", &body).json();
    let second = fleet.client(1).post_json("/generate", &body).json();
    assert_eq!(first["text"], second["text"]);
    assert_eq!(second["meta_info"]["cached_tokens"], 96);
    let streamed = stream_hi(&fleet, 4);
    assert_eq!(streamed.sse_data().len(), 6);
}

#[test]
fn a_client_that_disconnects_cancels_its_request() {
    let fleet = SimFleet::start(1, &[]);
    for (round, stream_flag) in [false, true].into_iter().enumerate() {
        let body =
            json!({"prompt": "a b c", "max_tokens": 5000, "stream": stream_flag}).to_string();
        let mut client = fleet.client(0);
        client.send_request("POST", "/v1/completions", &[], body.as_bytes());
        assert!(wait_until(Duration::from_secs(5), || first_load(&fleet)
            ["num_running_reqs"]
            == 1));
        client.close();
        assert!(
            wait_until(Duration::from_secs(5), || first_load(&fleet)
                ["num_running_reqs"]
                == 0),
            "stream={stream_flag}: the engine stops generating for a gone client"
        );
        let stats = fleet.stats(0);
        assert_eq!(stats["requests_cancelled"], round as u64 + 1);
        assert_eq!(
            first_load(&fleet)["num_used_tokens"],
            0,
            "its KV pages are released"
        );
    }
}
