//! Every injected fault of `sim-engine`, observed from a client: by flag at start and through
//! `POST /sim/faults` at run time.

#[path = "../../tests/utils/mod.rs"]
mod utils;

use std::time::{Duration, Instant};

use serde_json::json;
use utils::client::{PeerActivity, Response};
use utils::process::SimFleet;

const CHAT: &str = r#"{"messages":[{"role":"user","content":"hi"}],"max_tokens":5}"#;
const CHAT_STREAM: &str =
    r#"{"messages":[{"role":"user","content":"hi"}],"max_tokens":5,"stream":true}"#;

/// `CHAT` to engine 0 on a new connection.
fn chat(fleet: &SimFleet) -> Response {
    fleet.client(0).post_json("/v1/chat/completions", CHAT)
}

#[test]
fn injected_errors_answer_500_or_429_at_the_set_rate() {
    let fleet = SimFleet::start(1, &["--speedup", "100"]);
    fleet.set_faults(0, json!({"error_rate": 1.0, "error_status": 429}));
    let refused = chat(&fleet);
    assert_eq!(refused.status, 429);
    assert_eq!(refused.json()["error"]["code"], 429);
    fleet.set_faults(0, json!({"error_rate": 0.5, "error_status": 500}));
    let statuses: Vec<u16> = (0..40).map(|_| chat(&fleet).status).collect();
    let failures = statuses.iter().filter(|status| **status == 500).count();
    assert!(
        (8..=32).contains(&failures),
        "{failures} of 40 failed at rate 0.5"
    );
    assert_eq!(
        failures + statuses.iter().filter(|s| **s == 200).count(),
        40
    );
    assert_eq!(
        fleet.client(0).get("/health").status,
        200,
        "health is not an inference request"
    );
    fleet.set_faults(0, json!({"reset": true}));
    assert_eq!(chat(&fleet).status, 200);
}

#[test]
fn added_latency_delays_answers() {
    let fleet = SimFleet::start(1, &["--instant", "--fault-latency-ms", "300"]);
    let start = Instant::now();
    assert_eq!(chat(&fleet).status, 200);
    assert!(start.elapsed() >= Duration::from_millis(300));
    fleet.set_faults(0, json!({"latency_ms": 0}));
    let start = Instant::now();
    assert_eq!(fleet.client(0).get("/health").status, 200);
    assert!(start.elapsed() < Duration::from_millis(300));
}

#[test]
fn a_hung_engine_answers_nothing_until_released() {
    let fleet = SimFleet::start(1, &["--instant"]);
    fleet.set_faults(0, json!({"hang": true}));
    let mut hung = fleet.client(0);
    hung.send_request("GET", "/health", &[], b"");
    assert_eq!(
        hung.wait_for_peer(Duration::from_millis(300)),
        PeerActivity::Silent,
        "no answer while hung"
    );
    assert_eq!(
        fleet.client(0).get("/sim/stats").status,
        200,
        "admin still answers"
    );
    fleet.set_faults(0, json!({"hang": false}));
    let response = hung.read_response();
    assert_eq!(response.status, 200);
}

#[test]
fn dropped_connections_truncate_streams_and_bodies() {
    let fleet = SimFleet::start(1, &["--speedup", "10"]);
    fleet.set_faults(0, json!({"drop_mid_stream": true}));
    let streamed = fleet
        .client(0)
        .post_json_even_if_cut("/v1/chat/completions", CHAT_STREAM);
    assert_eq!(streamed.status, 200);
    assert!(!streamed.complete, "no terminating chunk");
    assert_eq!(
        streamed.sse_data().len(),
        1,
        "the first chunk arrives, then the connection drops"
    );
    let mut whole = fleet.client(0);
    whole.send_request("POST", "/v1/chat/completions", &[], CHAT.as_bytes());
    let response = whole.read_response_even_if_cut();
    let length: usize = response
        .header("content-length")
        .and_then(|value| value.parse().ok())
        .expect("content-length");
    assert!(
        !response.body.is_empty() && response.body.len() < length,
        "{} of {length} bytes",
        response.body.len()
    );
}

#[test]
fn unhealthy_engines_fail_health_checks_only_where_set() {
    let fleet = SimFleet::start(
        2,
        &["--instant", "--fault-unhealthy", "--fault-engines", "1"],
    );
    assert_eq!(fleet.client(0).get("/health").status, 200);
    let unhealthy = fleet.client(1).get("/health");
    assert_eq!(unhealthy.status, 503);
    assert_eq!(unhealthy.json()["error"]["code"], 503);
    fleet.set_faults(1, json!({"unhealthy": false}));
    assert_eq!(fleet.client(1).get("/health").status, 200);
    fleet.set_faults(0, json!({"unhealthy": true}));
    assert_eq!(fleet.client(0).get("/health").status, 503);
}

#[test]
fn bad_fault_patches_are_refused() {
    let fleet = SimFleet::start(1, &["--instant"]);
    let response = fleet
        .client(0)
        .post_json("/sim/faults", r#"{"error_rate": 3}"#);
    assert_eq!(response.status, 400);
    let current = fleet.client(0).get("/sim/faults").json();
    assert_eq!(current["error_rate"], 0.0);
}
