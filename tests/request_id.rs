//! The request ID end to end (SMG's `--request-id-headers`, `x-request-id`): taken from the
//! client's headers in the configured order or generated in OpenAI's shape, on every answer
//! (proxied, local, refused), replacing a worker's own, given to the worker, and named in the
//! request's debug logs.

mod utils;

use std::collections::HashSet;

use utils::mock_origin::{MockOrigin, Reply};
use utils::process::Gateway;
use utils::{wait_until, CHAT, TIMEOUT};

const JSON: (&str, &str) = ("content-type", "application/json");

/// An origin that answers with its own `x-request-id`, which the client must never see.
fn origin_with_its_own_id() -> MockOrigin {
    MockOrigin::start(|_| Reply::Full {
        status: 200,
        body: r#"{"ok":true}"#.into(),
        headers: vec![
            "content-type: application/json".into(),
            "x-request-id: from-the-engine".into(),
        ],
    })
}

/// The random part of a generated id after `prefix`: 24 letters and digits.
fn assert_generated(id: &str, prefix: &str) {
    let random = id
        .strip_prefix(prefix)
        .unwrap_or_else(|| panic!("{id} lacks {prefix}"));
    assert_eq!(random.len(), 24, "{id}");
    assert!(random.bytes().all(|b| b.is_ascii_alphanumeric()), "{id}");
}

#[test]
fn a_client_id_is_echoed_and_passed_to_the_worker_in_smgs_header_order() {
    let origin = origin_with_its_own_id();
    let gateway = Gateway::start(&[origin.url()], &[]);
    let mut client = gateway.client();
    let body = CHAT.as_bytes();
    // SMG's default order: x-request-id, x-correlation-id, x-trace-id, request-id.
    let headers = [JSON, ("request-id", "r-4"), ("x-correlation-id", "corr-2")];
    let response = client.request("POST", "/v1/chat/completions", &headers, body);
    assert_eq!(response.status, 200);
    assert_eq!(response.header("x-request-id"), Some("corr-2"));
    let seen = origin.requests();
    let forwarded = seen.last().expect("the worker got the request");
    // The client's headers go through as sent, and the id is added under SMG's name.
    assert_eq!(forwarded.header("x-correlation-id"), Some("corr-2"));
    assert_eq!(forwarded.header("x-request-id"), Some("corr-2"));
    // The client's own x-request-id is the worker's, once.
    let headers = [JSON, ("X-Request-Id", "mine-1"), ("x-trace-id", "t-3")];
    let response = client.request("POST", "/generate", &headers, br#"{"text":"a"}"#);
    assert_eq!(response.header("x-request-id"), Some("mine-1"));
    let seen = origin.requests();
    let forwarded = seen.last().expect("the worker got the request");
    let ids: Vec<_> = forwarded
        .headers
        .iter()
        .filter(|(n, _)| n == "x-request-id")
        .collect();
    assert_eq!(ids.len(), 1, "{:?}", forwarded.headers);
    assert_eq!(ids[0].1, "mine-1");
}

#[test]
fn without_a_client_id_one_is_generated_per_request_with_the_endpoints_prefix() {
    let origin = origin_with_its_own_id();
    let gateway = Gateway::start(&[origin.url()], &[]);
    let mut client = gateway.client();
    let mut ids = HashSet::new();
    for (path, body, prefix) in [
        ("/v1/chat/completions", CHAT, "chatcmpl-"),
        ("/v1/completions", r#"{"prompt":"a"}"#, "cmpl-"),
        ("/generate", r#"{"text":"a"}"#, "gnt-"),
        ("/v1/messages", CHAT, "msg_"),
    ] {
        let response = client.post_json(path, body);
        assert_eq!(response.status, 200, "{path}");
        let id = response.header("x-request-id").expect("an id").to_string();
        assert_generated(&id, prefix);
        let seen = origin.requests();
        let forwarded = seen.last().expect("the worker got the request");
        assert_eq!(
            forwarded.header("x-request-id"),
            Some(id.as_str()),
            "{path}"
        );
        assert!(ids.insert(id), "ids repeat");
    }
    // The gateway's own answers carry one too: local, refused and not found.
    for (path, status) in [("/health", 200), ("/v1/models", 200), ("/nowhere", 404)] {
        let response = client.get(path);
        assert_eq!(response.status, status, "{path}");
        let id = response.header("x-request-id").expect("an id");
        assert_generated(id, "req-");
    }
    let headers = [JSON, ("x-request-id", "bad-json-1")];
    let response = client.request("POST", "/v1/chat/completions", &headers, b"{not json");
    assert_eq!(response.status, 400);
    assert_eq!(response.header("x-request-id"), Some("bad-json-1"));
}

#[test]
fn the_flag_names_the_headers_and_unusable_values_are_passed_over() {
    let origin = origin_with_its_own_id();
    let flags = ["--request-id-headers", "x-amzn-trace-id", "X-Trace-Id"];
    let gateway = Gateway::start(&[origin.url()], &flags);
    let mut client = gateway.client();
    let body = br#"{"text":"a"}"#;
    // x-request-id is not among the flag's headers: the id is the trace id.
    let headers = [JSON, ("x-request-id", "ignored"), ("x-trace-id", "t-9")];
    let response = client.request("POST", "/generate", &headers, body);
    assert_eq!(response.header("x-request-id"), Some("t-9"));
    // A value past 128 bytes is passed over for the next header.
    let long = "a".repeat(129);
    let headers = [
        JSON,
        ("x-amzn-trace-id", long.as_str()),
        ("x-trace-id", "t-10"),
    ];
    let response = client.request("POST", "/generate", &headers, body);
    assert_eq!(response.header("x-request-id"), Some("t-10"));
    // None usable: generated; an early refusal (405) carries it too.
    let headers = [JSON, ("x-amzn-trace-id", "")];
    let response = client.request("POST", "/generate", &headers, body);
    assert_generated(response.header("x-request-id").unwrap_or(""), "gnt-");
    let response = client.get("/generate");
    assert_eq!(response.status, 405);
    assert_generated(response.header("x-request-id").unwrap_or(""), "gnt-");
}

#[test]
fn a_bad_request_id_flag_is_refused_at_start() {
    let output = std::process::Command::new(utils::process::workspace_bin("kvgate"))
        .args(["--request-id-headers", "x trace", "--port", "1"])
        .output()
        .expect("run kvgate");
    assert_eq!(output.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("--request-id-headers"), "{stderr}");
}

#[test]
fn the_requests_debug_logs_name_its_id() {
    // A streamed answer too: its request's bytes are let go of before the last log line.
    let origin = MockOrigin::start(|request| match request.path.as_str() {
        "/generate" => Reply::Chunked {
            chunks: vec![
                "data: {\"text\":\"a\"}\n\n".into(),
                "data: [DONE]\n\n".into(),
            ],
            gap: std::time::Duration::from_millis(10),
        },
        _ => Reply::json(r#"{"ok":true}"#),
    });
    let dir = std::env::temp_dir().join(format!("kvgate-request-id-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let log_path = dir.join("kvgate.log");
    let log = std::fs::File::create(&log_path).expect("log file");
    let flags = [
        "--log-level",
        "debug",
        "--log-json",
        "--policy",
        "cache_aware",
    ];
    let gateway = Gateway::start_logging(&[origin.url()], &flags, Some(log));
    let headers = [JSON, ("x-request-id", "logged-7")];
    let response =
        gateway
            .client()
            .request("POST", "/v1/chat/completions", &headers, CHAT.as_bytes());
    assert_eq!(response.status, 200);
    let headers = [JSON, ("x-request-id", "streamed-8")];
    let body = br#"{"text":"a","stream":true}"#;
    let streamed = gateway
        .client()
        .request("POST", "/generate", &headers, body);
    assert_eq!(streamed.status, 200);
    assert_eq!(streamed.header("x-request-id"), Some("streamed-8"));
    let finished = |id: &'static str| {
        move |line: &serde_json::Value| {
            line["message"] == "finished processing request" && line["request_id"] == id
        }
    };
    let decided = |line: &serde_json::Value| {
        line["message"] == "Cache-aware selection" && line["span"]["request_id"] == "logged-7"
    };
    let lines = || -> Vec<serde_json::Value> {
        let text = std::fs::read_to_string(&log_path).unwrap_or_default();
        text.lines()
            .filter_map(|l| serde_json::from_str(l).ok())
            .collect()
    };
    let logged = wait_until(TIMEOUT, || {
        let lines = lines();
        lines.iter().any(finished("logged-7"))
            && lines.iter().any(finished("streamed-8"))
            && lines.iter().any(decided)
    });
    assert!(logged, "no log line names the id: {:?}", lines());
    let _ = std::fs::remove_dir_all(&dir);
}
