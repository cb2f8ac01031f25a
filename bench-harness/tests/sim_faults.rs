//! Every injected fault of `sim-engine`, observed from a client: by flag at start and through
//! `POST /sim/faults` at run time.

mod sim_support;

use std::io::{BufReader, Read};
use std::time::{Duration, Instant};

use serde_json::json;
use sim_support::{connect, request, stream, SimFleet};

const CHAT: &str = r#"{"messages":[{"role":"user","content":"hi"}],"max_tokens":5}"#;
const CHAT_STREAM: &str =
    r#"{"messages":[{"role":"user","content":"hi"}],"max_tokens":5,"stream":true}"#;

fn set_faults(port: u16, patch: serde_json::Value) {
    let response = request(port, "POST", "/sim/faults", Some(&patch.to_string()));
    assert_eq!(response.status, 200, "{}", response.text());
}

#[test]
fn injected_errors_answer_500_or_429_at_the_set_rate() {
    let fleet = SimFleet::start(1, &["--speedup", "100"]);
    let port = fleet.port(0);
    set_faults(port, json!({"error_rate": 1.0, "error_status": 429}));
    let refused = request(port, "POST", "/v1/chat/completions", Some(CHAT));
    assert_eq!(refused.status, 429);
    assert_eq!(refused.json()["error"]["code"], 429);
    set_faults(port, json!({"error_rate": 0.5, "error_status": 500}));
    let statuses: Vec<u16> = (0..40)
        .map(|_| request(port, "POST", "/v1/chat/completions", Some(CHAT)).status)
        .collect();
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
        request(port, "GET", "/health", None).status,
        200,
        "health is not an inference request"
    );
    set_faults(port, json!({"reset": true}));
    assert_eq!(
        request(port, "POST", "/v1/chat/completions", Some(CHAT)).status,
        200
    );
}

#[test]
fn added_latency_delays_answers() {
    let fleet = SimFleet::start(1, &["--instant", "--fault-latency-ms", "300"]);
    let start = Instant::now();
    assert_eq!(
        request(fleet.port(0), "POST", "/v1/chat/completions", Some(CHAT)).status,
        200
    );
    assert!(start.elapsed() >= Duration::from_millis(300));
    set_faults(fleet.port(0), json!({"latency_ms": 0}));
    let start = Instant::now();
    assert_eq!(request(fleet.port(0), "GET", "/health", None).status, 200);
    assert!(start.elapsed() < Duration::from_millis(300));
}

#[test]
fn a_hung_engine_answers_nothing_until_released() {
    let fleet = SimFleet::start(1, &["--instant"]);
    let port = fleet.port(0);
    set_faults(port, json!({"hang": true}));
    let mut hung = connect(port);
    hung.set_read_timeout(Some(Duration::from_millis(300)))
        .unwrap();
    std::io::Write::write_all(&mut hung, b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
    let mut buffer = [0u8; 64];
    let error = hung.read(&mut buffer).expect_err("no answer while hung");
    assert!(matches!(
        error.kind(),
        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
    ));
    assert_eq!(
        request(port, "GET", "/sim/stats", None).status,
        200,
        "admin still answers"
    );
    set_faults(port, json!({"hang": false}));
    hung.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let response = sim_support::read_response(&mut BufReader::new(hung)).expect("released");
    assert_eq!(response.status, 200);
}

#[test]
fn dropped_connections_truncate_streams_and_bodies() {
    let fleet = SimFleet::start(1, &["--speedup", "10"]);
    let port = fleet.port(0);
    set_faults(port, json!({"drop_mid_stream": true}));
    let streamed = stream(port, "/v1/chat/completions", CHAT_STREAM);
    assert_eq!(streamed.status, 200);
    assert!(!streamed.complete, "no terminating chunk");
    assert_eq!(
        streamed.data().len(),
        1,
        "the first chunk arrives, then the connection drops"
    );
    let mut whole = connect(port);
    let head = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: {}\r\n\r\n{CHAT}",
        CHAT.len()
    );
    std::io::Write::write_all(&mut whole, head.as_bytes()).unwrap();
    let mut received = Vec::new();
    let _ = whole.read_to_end(&mut received);
    let received = String::from_utf8_lossy(&received);
    let (head, body) = received.split_once("\r\n\r\n").expect("a head arrives");
    let length: usize = head
        .lines()
        .find_map(|line| line.strip_prefix("content-length: "))
        .and_then(|value| value.parse().ok())
        .expect("content-length");
    assert!(
        !body.is_empty() && body.len() < length,
        "{} of {length} bytes",
        body.len()
    );
}

#[test]
fn unhealthy_engines_fail_health_checks_only_where_set() {
    let fleet = SimFleet::start(
        2,
        &["--instant", "--fault-unhealthy", "--fault-engines", "1"],
    );
    assert_eq!(request(fleet.port(0), "GET", "/health", None).status, 200);
    let unhealthy = request(fleet.port(1), "GET", "/health", None);
    assert_eq!(unhealthy.status, 503);
    assert_eq!(unhealthy.json()["error"]["code"], 503);
    set_faults(fleet.port(1), json!({"unhealthy": false}));
    assert_eq!(request(fleet.port(1), "GET", "/health", None).status, 200);
    set_faults(fleet.port(0), json!({"unhealthy": true}));
    assert_eq!(request(fleet.port(0), "GET", "/health", None).status, 503);
}

#[test]
fn bad_fault_patches_are_refused() {
    let fleet = SimFleet::start(1, &["--instant"]);
    let response = request(
        fleet.port(0),
        "POST",
        "/sim/faults",
        Some(r#"{"error_rate": 3}"#),
    );
    assert_eq!(response.status, 400);
    let current = request(fleet.port(0), "GET", "/sim/faults", None).json();
    assert_eq!(current["error_rate"], 0.0);
}
