//! Integration tests of kvgate's data path against scripted origins (`utils::mock_origin`):
//! error statuses and bodies, connection keep-or-close decisions, request and response framing,
//! hop-by-hop headers, retries, timeouts and client disconnects. Each test starts its own
//! processes on free loopback ports and bounds every wait.

mod utils;

use std::time::{Duration, Instant};

use utils::mock_origin::{MockOrigin, Reply};
use utils::process::{free_port, Gateway};
use utils::{assert_error, ok_origin, wait_until, CHAT, TIMEOUT};

#[test]
fn malformed_http_gets_400_and_the_connection_closes() {
    let origin = ok_origin();
    let gateway = Gateway::start(&[origin.url()], &[]);
    let mut client = gateway.client();
    client.send_raw(b"GARBAGE\x01 / HTTP/1.1\r\n\r\n");
    let response = client.read_response();
    assert_error(&response, 400);
    assert_eq!(response.header("connection"), Some("close"));
    assert!(client.is_closed_by_peer(TIMEOUT));
    assert!(origin.requests().is_empty());
}

#[test]
fn body_over_the_limit_gets_413_for_both_framings() {
    let origin = ok_origin();
    let gateway = Gateway::start(&[origin.url()], &["--max-payload-size", "100"]);
    let big = format!(r#"{{"prompt":"{}"}}"#, "x".repeat(200));
    let response = gateway.client().post_json("/v1/completions", &big);
    assert_error(&response, 413);
    let mut client = gateway.client();
    let chunk = "y".repeat(150);
    client.send_raw(
        format!("POST /v1/completions HTTP/1.1\r\nhost: x\r\ntransfer-encoding: chunked\r\n\r\n{:x}\r\n{chunk}\r\n0\r\n\r\n", chunk.len())
            .as_bytes(),
    );
    assert_error(&client.read_response(), 413);
    assert!(client.is_closed_by_peer(TIMEOUT));
    let small = gateway
        .client()
        .post_json("/v1/completions", r#"{"prompt":"ok"}"#);
    assert_eq!(small.status, 200);
    assert_eq!(origin.requests().len(), 1);
}

#[test]
fn bad_json_404_and_405_keep_the_connection() {
    let origin = ok_origin();
    let gateway = Gateway::start(&[origin.url()], &[]);
    let mut client = gateway.client();
    assert_error(&client.post_json("/v1/chat/completions", "{not json"), 400);
    assert_error(&client.post_json("/generate", ""), 400);
    assert_error(&client.get("/no/such/path"), 404);
    assert_error(&client.get("/v1/chat/completions"), 405);
    let response = client.post_json("/v1/chat/completions", CHAT);
    assert_eq!(response.status, 200, "the connection survived the errors");
    assert_eq!(origin.requests().len(), 1);
}

#[test]
fn no_worker_gets_503_and_readiness_says_not_ready() {
    let gateway = Gateway::start(&[], &[]);
    let mut client = gateway.client();
    assert_error(&client.post_json("/v1/chat/completions", CHAT), 503);
    assert_eq!(client.get("/readiness").status, 503);
    assert_eq!(client.get("/liveness").status, 200);
    assert_eq!(client.get("/health").status, 200);
}

#[test]
fn upstream_timeout_gets_504_and_releases_the_credit() {
    let origin =
        MockOrigin::start(|_| Reply::Delay(Duration::from_secs(4), Box::new(Reply::json("{}"))));
    let gateway = Gateway::start(&[origin.url()], &["--request-timeout-secs", "1"]);
    let started = Instant::now();
    let response = gateway.client().post_json("/generate", r#"{"text":"a"}"#);
    assert_error(&response, 504);
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "took {:?}",
        started.elapsed()
    );
    let active = format!("smg_worker_requests_active{{worker=\"{}\"}}", origin.url());
    assert_eq!(gateway.metric(&active), 0.0);
    assert_eq!(gateway.metric("kvgate_upstream_timeouts_total"), 1.0);
}

#[test]
fn refused_and_reset_workers_are_retried_elsewhere_then_502() {
    let dead = format!("http://127.0.0.1:{}", free_port());
    let resetting = MockOrigin::start(|_| Reply::Reset);
    let good = ok_origin();
    // Round robin keeps sending to the bad workers (cache_aware would stick to `good`).
    let gateway = Gateway::start(
        &[dead.clone(), resetting.url(), good.url()],
        &["--policy", "round_robin"],
    );
    let mut client = gateway.client();
    for _ in 0..6 {
        let response = client.post_json("/v1/chat/completions", CHAT);
        assert_eq!(response.status, 200, "{}", response.text());
        assert_eq!(response.routed_worker(), Some(good.url().as_str()));
    }
    assert!(gateway.metric("kvgate_upstream_retries_total") >= 4.0);
    drop(good);
    let all_bad = Gateway::start(&[dead, resetting.url()], &[]);
    let started = Instant::now();
    let response = all_bad.client().post_json("/v1/chat/completions", CHAT);
    assert_error(&response, 502);
    assert!(started.elapsed() < Duration::from_secs(5));
}

#[test]
fn retries_never_return_to_a_failed_worker_while_an_untried_one_is_left() {
    // Four workers fail every request with a retryable status, one answers; the default
    // `--retry-max-retries 5` allows six attempts, enough to reach the fifth worker however the
    // policy orders them, if no attempt goes back to a worker that already failed the request.
    let failing: Vec<MockOrigin> = (0..4)
        .map(|_| {
            MockOrigin::start(|_| Reply::Full {
                status: 503,
                body: r#"{"error":"busy"}"#.into(),
                headers: Vec::new(),
            })
        })
        .collect();
    let good = ok_origin();
    let mut urls: Vec<String> = failing.iter().map(MockOrigin::url).collect();
    urls.push(good.url());
    let gateway = Gateway::start(
        &urls,
        &[
            "--policy",
            "random",
            "--retry-initial-backoff-ms",
            "1",
            "--retry-max-backoff-ms",
            "1",
            "--disable-circuit-breaker",
            "--disable-health-check",
        ],
    );
    let mut client = gateway.client();
    for i in 0..20 {
        let tag = format!("request {i}\"");
        let body = format!(r#"{{"messages":[{{"role":"user","content":"request {i}"}}]}}"#);
        let response = client.post_json("/v1/chat/completions", &body);
        assert_eq!(response.status, 200, "request {i}: {}", response.text());
        assert_eq!(response.routed_worker(), Some(good.url().as_str()));
        for origin in &failing {
            let attempts = origin
                .requests()
                .iter()
                .filter(|r| String::from_utf8_lossy(&r.body).contains(&tag))
                .count();
            assert!(
                attempts <= 1,
                "request {i} reached {} {attempts} times",
                origin.url()
            );
        }
    }
}

#[test]
fn chunked_request_bodies_and_100_continue_reach_the_worker_whole() {
    let origin = ok_origin();
    let gateway = Gateway::start(&[origin.url()], &[]);
    let mut client = gateway.client();
    client.send_raw(b"POST /generate HTTP/1.1\r\nhost: x\r\ntransfer-encoding: chunked\r\nexpect: 100-continue\r\n\r\n");
    let interim = client.read_response();
    assert_eq!(interim.status, 100);
    client.send_raw(b"9\r\n{\"text\":\"\r\n");
    std::thread::sleep(Duration::from_millis(50));
    client.send_raw(b"6;ext=1\r\nhi you\r\n2\r\n\"}\r\n0\r\nx-trailer: 1\r\n\r\n");
    let response = client.read_response();
    assert_eq!(response.status, 200);
    let received = &origin.requests()[0];
    assert_eq!(received.body, br#"{"text":"hi you"}"#);
    assert_eq!(received.header("content-length"), Some("17"));
    assert_eq!(received.header("transfer-encoding"), None);
    assert_eq!(received.header("expect"), None);
}

#[test]
fn a_chunk_extension_ending_in_a_bare_lf_is_a_400() {
    let origin = ok_origin();
    let gateway = Gateway::start(&[origin.url()], &[]);
    let mut client = gateway.client();
    client.send_raw(b"POST /generate HTTP/1.1\r\nhost: x\r\ntransfer-encoding: chunked\r\n\r\n5;ext\nhello\r\n0\r\n\r\n");
    let response = client.read_response();
    // Before: the LF was read as more extension, "hello" too, and the request hung to a 408.
    assert_error(&response, 400);
    assert!(client.is_closed_by_peer(TIMEOUT));
    assert!(origin.requests().is_empty());
}

#[test]
fn large_bodies_reach_the_worker_whole_from_both_framings_with_a_pipelined_request_behind() {
    let origin = ok_origin();
    let gateway = Gateway::start(&[origin.url()], &[]);
    // Far above the size a body is copied behind its head: written from the read buffer.
    let text: String = (0..300_000)
        .map(|i| (b'a' + (i % 26) as u8) as char)
        .collect();
    let body = format!(r#"{{"text":"{text}"}}"#);
    let mut chunked = Vec::new();
    for piece in body.as_bytes().chunks(40_000) {
        chunked.extend_from_slice(format!("{:x}\r\n", piece.len()).as_bytes());
        chunked.extend_from_slice(piece);
        chunked.extend_from_slice(b"\r\n");
    }
    chunked.extend_from_slice(b"0\r\n\r\n");
    let mut wire = format!(
        "POST /generate HTTP/1.1\r\nhost: x\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    )
    .into_bytes();
    wire.extend_from_slice(
        b"POST /generate HTTP/1.1\r\nhost: x\r\ntransfer-encoding: chunked\r\n\r\n",
    );
    wire.extend_from_slice(&chunked);
    wire.extend_from_slice(b"POST /generate HTTP/1.1\r\nhost: x\r\ncontent-length: 2\r\n\r\n{}");
    let mut client = gateway.client();
    client.send_raw(&wire);
    for _ in 0..3 {
        assert_eq!(client.read_response().status, 200);
    }
    let received = origin.requests();
    assert!(received[0].body == body.as_bytes(), "sized body changed");
    assert!(received[1].body == body.as_bytes(), "chunked body changed");
    assert_eq!(received[2].body, b"{}");
}

#[test]
fn bodies_past_the_cores_body_budget_get_503_until_it_frees() {
    let origin = ok_origin();
    let args = [
        "--max-payload-size",
        "1000",
        "--max-inflight-body-bytes-per-core",
        "1500",
    ];
    let gateway = Gateway::start(&[origin.url()], &args);
    // A client announces a 1000-byte body and sends 960 bytes of it: the core holds their
    // charge (what arrived, not what was announced).
    let mut holder = gateway.client();
    holder.send_raw(
        format!(
            "POST /generate HTTP/1.1\r\nhost: x\r\ncontent-length: 1000\r\n\r\n{{\"text\":\"{}",
            "a".repeat(960 - 9)
        )
        .as_bytes(),
    );
    let body = format!(r#"{{"text":"{}"}}"#, "b".repeat(780));
    let mut refused = None;
    assert!(
        wait_until(TIMEOUT, || {
            let response = gateway.client().post_json("/generate", &body);
            let is_503 = response.status == 503;
            refused = Some(response);
            is_503
        }),
        "a body past the budget was taken"
    );
    let refused = refused.expect("a response");
    assert_error(&refused, 503);
    assert_eq!(refused.header("connection"), Some("close"));
    let mut chunked = gateway.client();
    chunked.send_raw(b"POST /generate HTTP/1.1\r\nhost: x\r\ntransfer-encoding: chunked\r\n\r\n");
    chunked.send_raw(format!("258\r\n{}\r\n0\r\n\r\n", "c".repeat(600)).as_bytes());
    assert_error(&chunked.read_response(), 503);
    let rejected = gateway.metric("kvgate_body_budget_rejections_total");
    assert!(rejected >= 2.0, "{rejected}");
    // The holder finishes: its request is served and its charge given back.
    holder.send_raw(format!("{}\"}}", "a".repeat(1000 - 960 - 2)).as_bytes());
    assert_eq!(holder.read_response().status, 200);
    assert_eq!(gateway.client().post_json("/generate", &body).status, 200);
    assert_eq!(
        gateway.metric("kvgate_body_budget_rejections_total"),
        rejected
    );
}

#[test]
fn hop_by_hop_headers_are_dropped_both_ways() {
    let origin = MockOrigin::start(|_| Reply::Full {
        status: 201,
        body: "{}".into(),
        headers: vec![
            "connection: x-up-private".into(),
            "x-up-private: 1".into(),
            "x-kept: yes".into(),
            "keep-alive: timeout=5".into(),
        ],
    });
    let gateway = Gateway::start(&[origin.url()], &[]);
    let mut client = gateway.client();
    let headers = [
        ("connection", "x-private"),
        ("x-private", "secret"),
        ("te", "trailers"),
        ("authorization", "Bearer t"),
    ];
    let response = client.request("POST", "/v1/messages?beta=1", &headers, b"{}");
    assert_eq!(response.status, 201);
    assert_eq!(response.header("x-kept"), Some("yes"));
    assert_eq!(response.header("x-up-private"), None);
    assert_eq!(response.header("keep-alive"), None);
    assert_eq!(response.routed_worker(), Some(origin.url().as_str()));
    let received = &origin.requests()[0];
    assert_eq!(received.path, "/v1/messages?beta=1");
    assert_eq!(received.header("authorization"), Some("Bearer t"));
    assert_eq!(received.header("x-private"), None);
    assert_eq!(received.header("te"), None);
    assert_eq!(received.header("connection"), None);
}

#[test]
fn pipelined_requests_are_answered_in_order() {
    let origin = MockOrigin::start(|r| {
        Reply::json(&format!(
            r#"{{"echo":{}}}"#,
            String::from_utf8_lossy(&r.body)
        ))
    });
    let gateway = Gateway::start(&[origin.url()], &[]);
    let mut client = gateway.client();
    let one = "POST /generate HTTP/1.1\r\nhost: x\r\ncontent-length: 7\r\n\r\n{\"n\":1}";
    let two = "POST /generate HTTP/1.1\r\nhost: x\r\ncontent-length: 7\r\n\r\n{\"n\":2}";
    client.send_raw(format!("{one}{two}GET /health HTTP/1.1\r\nhost: x\r\n\r\n").as_bytes());
    assert_eq!(client.read_response().json()["echo"]["n"], 1);
    assert_eq!(client.read_response().json()["echo"]["n"], 2);
    assert_eq!(client.read_response().status, 200);
}

#[test]
fn streamed_responses_arrive_chunk_by_chunk() {
    let chunks: Vec<String> = (0..5).map(|i| format!("data: {{\"i\":{i}}}\n\n")).collect();
    let reply = Reply::Chunked {
        chunks: chunks.clone(),
        gap: Duration::from_millis(100),
    };
    let origin = MockOrigin::start(move |_| reply.clone());
    let gateway = Gateway::start(&[origin.url()], &[]);
    let mut client = gateway.client();
    let response = client.post_json("/v1/chat/completions", CHAT);
    assert_eq!(response.header("transfer-encoding"), Some("chunked"));
    assert_eq!(response.text(), chunks.concat());
    assert_eq!(response.chunk_times.len(), 5);
    let spread = response.chunk_times[4] - response.chunk_times[0];
    assert!(
        spread >= Duration::from_millis(300),
        "chunks were buffered: {spread:?}"
    );
    // The upstream connection was reusable after the terminating chunk.
    assert_eq!(client.post_json("/v1/chat/completions", CHAT).status, 200);
    assert_eq!(origin.accepted_connections(), 1);
}

#[test]
fn a_stream_to_a_client_that_stops_reading_arrives_whole_and_in_order() {
    // An event stream's bytes go to the client at once, as far as its socket takes them
    // (`Relay::Now`); past a full socket the rest goes through a ring write. 16 MB of events,
    // each numbered, against a client that reads nothing for half a second, cross that edge.
    let chunks: Vec<String> = (0..64)
        .map(|i| format!("data: {i:02} {}\n\n", "x".repeat(256 * 1024)))
        .collect();
    let reply = Reply::Chunked {
        chunks: chunks.clone(),
        gap: Duration::ZERO,
    };
    let origin = MockOrigin::start(move |_| reply.clone());
    let gateway = Gateway::start(&[origin.url()], &[]);
    let mut client = gateway.client();
    let body = r#"{"stream":true}"#;
    client.send_raw(
        format!(
            "POST /generate HTTP/1.1\r\nhost: x\r\ncontent-length: {}\r\n\r\n{body}",
            body.len()
        )
        .as_bytes(),
    );
    std::thread::sleep(Duration::from_millis(500));
    let response = client.read_response();
    assert_eq!(response.status, 200);
    assert!(
        response.text() == chunks.concat(),
        "the events arrived cut or out of order"
    );
    assert_eq!(client.post_json("/generate", r#"{"n":1}"#).status, 200);
}

#[test]
fn a_stream_lets_go_of_its_request_and_the_request_pipelined_behind_it_is_answered() {
    // A committed stream drops its request's bytes from the client's read buffer at once
    // (http::proxy, `Forwarded::release`); bytes pipelined behind it must survive that.
    let chunks: Vec<String> = (0..3).map(|i| format!("data: {{\"i\":{i}}}\n\n")).collect();
    let stream = Reply::Chunked {
        chunks: chunks.clone(),
        gap: Duration::from_millis(100),
    };
    let origin = MockOrigin::start(move |r| {
        if r.body.starts_with(b"{\"stream\"") {
            stream.clone()
        } else {
            Reply::json(&format!(
                r#"{{"echo":{}}}"#,
                String::from_utf8_lossy(&r.body)
            ))
        }
    });
    let gateway = Gateway::start(&[origin.url()], &[]);
    let mut client = gateway.client();
    let one = "POST /generate HTTP/1.1\r\nhost: x\r\ncontent-length: 15\r\n\r\n{\"stream\":true}";
    let two = "POST /generate HTTP/1.1\r\nhost: x\r\ncontent-length: 7\r\n\r\n{\"n\":2}";
    client.send_raw(format!("{one}{two}").as_bytes());
    let streamed = client.read_response();
    assert_eq!(streamed.status, 200);
    assert_eq!(streamed.text(), chunks.concat());
    assert_eq!(client.read_response().json()["echo"]["n"], 2);
    // And a third request on the same connection, after the read buffer was emptied.
    let three = client.post_json("/generate", r#"{"n":3}"#);
    assert_eq!(three.json()["echo"]["n"], 3);
}

#[test]
fn client_disconnect_mid_stream_closes_the_upstream_request() {
    let reply = Reply::Chunked {
        chunks: vec!["data: x\n\n".into(); 50],
        gap: Duration::from_millis(50),
    };
    let origin = MockOrigin::start(move |_| reply.clone());
    let gateway = Gateway::start(&[origin.url()], &[]);
    let mut client = gateway.client();
    client.send_raw(
        format!(
            "POST /v1/completions HTTP/1.1\r\nhost: x\r\ncontent-length: {}\r\n\r\n{CHAT}",
            CHAT.len()
        )
        .as_bytes(),
    );
    assert_eq!(client.read_head_and_first_chunk(), 200);
    client.close();
    assert!(
        wait_until(Duration::from_secs(3), || origin.stream_cut_offs() == 1),
        "upstream kept streaming"
    );
    let active = format!("smg_worker_requests_active{{worker=\"{}\"}}", origin.url());
    assert!(wait_until(TIMEOUT, || gateway.metric(&active) == 0.0));
    assert!(gateway.metric("kvgate_downstream_aborts_total") >= 1.0);
}

#[test]
fn client_gone_before_the_response_closes_the_upstream_request() {
    let origin = MockOrigin::start(|_| Reply::Silent);
    let gateway = Gateway::start(&[origin.url()], &[]);
    let mut client = gateway.client();
    let body = r#"{"model":"m","prompt":"hello","max_tokens":2500}"#;
    client.send_request("POST", "/v1/completions", &[], body.as_bytes());
    assert!(wait_until(TIMEOUT, || origin.requests().len() == 1));
    let active = format!("smg_worker_requests_active{{worker=\"{}\"}}", origin.url());
    assert_eq!(gateway.metric(&active), 1.0);
    client.close();
    assert!(
        wait_until(Duration::from_secs(3), || origin.hang_ups() == 1),
        "the worker kept a request nobody waits for"
    );
    assert!(wait_until(Duration::from_secs(3), || gateway
        .metric(&active)
        == 0.0));
    let aborted = "smg_http_responses_total{path=\"/v1/completions\",status_code=\"499\"}";
    assert_eq!(gateway.metric(aborted), 1.0);
    assert_eq!(gateway.metric("kvgate_downstream_aborts_total"), 1.0);
    // Not the worker's fault: its circuit stays closed.
    assert_eq!(gateway.metric("kvgate_upstream_timeouts_total"), 0.0);
}

#[test]
fn a_connection_idle_past_the_buffered_wait_serves_its_next_requests() {
    // After KEEPALIVE_BUFFERED_WAIT (1 s) an idle connection waits holding no buffer
    // (http::server::wait_for_next_request); what arrives then must be read whole.
    let origin = MockOrigin::start(|r| {
        Reply::json(&format!(
            r#"{{"echo":{}}}"#,
            String::from_utf8_lossy(&r.body)
        ))
    });
    let gateway = Gateway::start(&[origin.url()], &[]);
    let mut client = gateway.client();
    assert_eq!(
        client.post_json("/generate", r#"{"n":1}"#).json()["echo"]["n"],
        1
    );
    std::thread::sleep(Duration::from_millis(1_500));
    let two = "POST /generate HTTP/1.1\r\nhost: x\r\ncontent-length: 7\r\n\r\n{\"n\":2}";
    let three = "POST /generate HTTP/1.1\r\nhost: x\r\ncontent-length: 7\r\n\r\n{\"n\":3}";
    client.send_raw(format!("{two}{three}").as_bytes());
    assert_eq!(client.read_response().json()["echo"]["n"], 2);
    assert_eq!(client.read_response().json()["echo"]["n"], 3);
    assert_eq!(origin.requests().len(), 3);
}

#[test]
fn pipelined_requests_behind_a_slow_answer_are_not_a_disconnect() {
    let origin = MockOrigin::start(|r| {
        let echo = Reply::json(&format!(
            r#"{{"echo":{}}}"#,
            String::from_utf8_lossy(&r.body)
        ));
        // Long enough for the gateway to look at the client several times meanwhile.
        Reply::Delay(Duration::from_millis(800), Box::new(echo))
    });
    let gateway = Gateway::start(&[origin.url()], &[]);
    let mut client = gateway.client();
    let one = "POST /generate HTTP/1.1\r\nhost: x\r\ncontent-length: 7\r\n\r\n{\"n\":1}";
    let two = "POST /generate HTTP/1.1\r\nhost: x\r\ncontent-length: 7\r\n\r\n{\"n\":2}";
    client.send_raw(format!("{one}{two}").as_bytes());
    assert_eq!(client.read_response().json()["echo"]["n"], 1);
    assert_eq!(client.read_response().json()["echo"]["n"], 2);
    assert_eq!(gateway.metric("kvgate_downstream_aborts_total"), 0.0);
}

#[test]
fn a_silent_worker_gets_504_after_the_first_byte_timeout_and_its_circuit_opens() {
    // Its /health and /v1/models still answer (GETs): only requests hang, as in a stuck
    // scheduler.
    let origin = MockOrigin::start(|r| {
        if r.method == "GET" {
            Reply::json("{}")
        } else {
            Reply::Silent
        }
    });
    let args = [
        "--upstream-first-byte-timeout-secs",
        "1",
        "--cb-failure-threshold",
        "2",
        "--disable-retries",
    ];
    let gateway = Gateway::start(&[origin.url()], &args);
    for i in 0..2 {
        let started = Instant::now();
        let response = gateway.client().post_json("/generate", r#"{"text":"a"}"#);
        assert_error(&response, 504);
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "request {i} took {:?}",
            started.elapsed()
        );
    }
    assert_eq!(gateway.metric("kvgate_upstream_timeouts_total"), 2.0);
    assert!(wait_until(Duration::from_secs(3), || origin.hang_ups() == 2));
    assert!(wait_until(TIMEOUT, || gateway.breaker_state(&origin.url()) == "open"));
    let active = format!("smg_worker_requests_active{{worker=\"{}\"}}", origin.url());
    assert_eq!(gateway.metric(&active), 0.0);
}

#[test]
fn a_stream_whose_worker_falls_silent_ends_with_an_sse_error_event() {
    let reply = Reply::Chunked {
        chunks: vec!["data: a\n\n".into(), "data: b\n\n".into()],
        gap: Duration::from_secs(4),
    };
    let origin = MockOrigin::start(move |_| reply.clone());
    let args = ["--upstream-idle-timeout-secs", "1"];
    let gateway = Gateway::start(&[origin.url()], &args);
    let started = Instant::now();
    let response = gateway.client().post_json("/v1/chat/completions", CHAT);
    assert_eq!(response.status, 200);
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "{:?}",
        started.elapsed()
    );
    let data = response.sse_data();
    assert_eq!(data.first(), Some(&"a"), "{}", response.text());
    assert!(
        data.last().is_some_and(|d| d.contains("\"code\":504")),
        "{}",
        response.text()
    );
    assert_eq!(gateway.metric("kvgate_upstream_timeouts_total"), 1.0);
    assert_eq!(gateway.metric("kvgate_upstream_responses_cut_total"), 1.0);
}

#[test]
fn close_delimited_and_http10_responses_are_framed_for_the_client() {
    let origin = MockOrigin::start(|r| {
        if r.path == "/generate" {
            Reply::UntilClose {
                body: "{\"until\":\"close\"}".into(),
            }
        } else {
            Reply::Chunked {
                chunks: vec!["ab".into(), "cd".into()],
                gap: Duration::ZERO,
            }
        }
    });
    let gateway = Gateway::start(&[origin.url()], &[]);
    let mut client = gateway.client();
    let response = client.post_json("/generate", "{}");
    assert_eq!(response.text(), "{\"until\":\"close\"}");
    assert_eq!(response.header("connection"), Some("close"));
    let mut old = gateway.client();
    old.send_raw(b"POST /v1/completions HTTP/1.0\r\ncontent-length: 2\r\n\r\n{}");
    let response = old.read_response();
    assert_eq!(response.text(), "abcd", "de-chunked for HTTP/1.0");
    assert_eq!(response.header("transfer-encoding"), None);
}

#[test]
fn upstream_connections_are_reused_across_requests() {
    let origin = ok_origin();
    let gateway = Gateway::start(&[origin.url()], &[]);
    let mut client = gateway.client();
    for _ in 0..200 {
        assert_eq!(
            client
                .post_json("/v1/completions", r#"{"prompt":"a"}"#)
                .status,
            200
        );
    }
    assert_eq!(origin.accepted_connections(), 1);
    assert_eq!(
        gateway.metric("kvgate_upstream_connections_reused_total"),
        199.0
    );
}

#[test]
fn sigterm_exits_cleanly() {
    let origin = ok_origin();
    let mut gateway = Gateway::start(&[origin.url()], &[]);
    assert_eq!(gateway.client().post_json("/generate", "{}").status, 200);
    gateway.process.signal(libc::SIGTERM);
    let status = gateway
        .process
        .wait_exit(TIMEOUT)
        .expect("kvgate exits after SIGTERM");
    assert!(status.success(), "{status:?}");
}

#[test]
fn bad_flags_exit_nonzero_with_one_error_line() {
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_kvgate"))
        .args(["--data-cores", "0"])
        .output()
        .expect("run kvgate");
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(
        stderr.starts_with("Error: ") && stderr.contains("--data-cores"),
        "{stderr}"
    );
}

/// A flag clap itself refuses keeps clap's whole message: the value it could not read, the
/// accepted values, the flag it looks like, and where to read more.
#[test]
fn flags_clap_refuses_keep_its_hints() {
    let refused = |args: &[&str]| {
        let output = std::process::Command::new(env!("CARGO_BIN_EXE_kvgate"))
            .args(args)
            .env_remove("CLICOLOR_FORCE")
            .output()
            .expect("run kvgate");
        assert_eq!(output.status.code(), Some(2), "{args:?}");
        String::from_utf8_lossy(&output.stderr).into_owned()
    };
    let stderr = refused(&["--port", "notaport"]);
    assert!(
        stderr.starts_with("error: invalid value 'notaport' for '--port <PORT>'")
            && stderr.contains("try '--help'"),
        "{stderr}"
    );
    let stderr = refused(&["--policy", "fastest"]);
    assert!(
        stderr.contains("[possible values: cache_aware, random, round_robin"),
        "{stderr}"
    );
    let stderr = refused(&["--prot", "3000"]);
    assert!(
        stderr.contains("a similar argument exists: '--port'"),
        "{stderr}"
    );
}

/// Another process listening on the data port (even one that allows `SO_REUSEPORT` sharing,
/// as a second kvgate's listeners do) or on the metrics port stops the start with one line
/// naming the flag, instead of splitting the clients between the two processes.
#[test]
fn a_port_another_process_listens_on_is_refused() {
    for (flag, sharing) in [
        ("--port", true),
        ("--port", false),
        ("--prometheus-port", false),
    ] {
        let holder = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None)
            .expect("socket");
        holder.set_reuse_address(true).expect("SO_REUSEADDR");
        holder.set_reuse_port(sharing).expect("SO_REUSEPORT");
        let addr: std::net::SocketAddr = "127.0.0.1:0".parse().expect("addr");
        holder.bind(&addr.into()).expect("bind");
        holder.listen(16).expect("listen");
        let port = holder
            .local_addr()
            .expect("local addr")
            .as_socket()
            .expect("inet")
            .port()
            .to_string();
        let free = free_port().to_string();
        let (data, metrics) = if flag == "--port" {
            (port.as_str(), free.as_str())
        } else {
            (free.as_str(), port.as_str())
        };
        // Its stderr goes to a file and the wait is bounded: a kvgate that shares the port runs
        // on, and must fail this test rather than hang it.
        let log = std::env::temp_dir().join(format!("kvgate-port-{}-{port}", std::process::id()));
        let file = std::fs::File::create(&log).expect("stderr file");
        let mut process = utils::process::ChildProcess::spawn_with_stderr(
            "kvgate",
            std::process::Command::new(env!("CARGO_BIN_EXE_kvgate"))
                .args(["--host", "127.0.0.1", "--port", data])
                .args([
                    "--prometheus-host",
                    "127.0.0.1",
                    "--prometheus-port",
                    metrics,
                ])
                .args(["--worker-urls", "http://127.0.0.1:9"]),
            file.into(),
        );
        let status = process.wait_exit(TIMEOUT);
        let stderr = std::fs::read_to_string(&log).unwrap_or_default();
        let _ = std::fs::remove_file(&log);
        assert!(
            status.is_some_and(|s| !s.success()),
            "{flag} shared={sharing}: kvgate did not refuse to start ({status:?}): {stderr}"
        );
        let error = stderr.lines().last().unwrap_or_default();
        assert!(
            error.starts_with("Error: ") && error.contains(flag) && error.contains("in use"),
            "{flag} shared={sharing}: {stderr}"
        );
    }
}

/// A restart right after a stop takes the same ports again, every time.
#[test]
fn a_restart_right_after_a_stop_takes_the_same_ports() {
    let origin = ok_origin();
    let port = free_port().to_string();
    let metrics = free_port().to_string();
    for round in 0..20 {
        let mut process = utils::process::ChildProcess::spawn_with_stderr(
            "kvgate",
            std::process::Command::new(env!("CARGO_BIN_EXE_kvgate"))
                .args(["--host", "127.0.0.1", "--port", &port, "--data-cores", "1"])
                .args([
                    "--prometheus-host",
                    "127.0.0.1",
                    "--prometheus-port",
                    &metrics,
                ])
                .args(["--worker-urls", &origin.url()]),
            std::process::Stdio::null(),
        );
        let addr: std::net::SocketAddr = format!("127.0.0.1:{port}").parse().expect("addr");
        assert!(
            utils::process::wait_for_port(addr.port(), TIMEOUT),
            "round {round}: kvgate did not listen"
        );
        let mut client = utils::client::HttpClient::connect(addr);
        assert_eq!(
            client.post_json("/generate", "{}").status,
            200,
            "round {round}"
        );
        process.signal(libc::SIGTERM);
        let status = process
            .wait_exit(TIMEOUT)
            .expect("kvgate exits after SIGTERM");
        assert!(status.success(), "round {round}: {status:?}");
    }
}

#[test]
fn stale_pooled_connections_are_retried_on_a_fresh_one() {
    let origin = MockOrigin::start(|_| Reply::ThenClose(Box::new(Reply::json("{}"))));
    let gateway = Gateway::start(&[origin.url()], &[]);
    let mut client = gateway.client();
    for i in 0..10 {
        let response = client.post_json("/generate", "{}");
        assert_eq!(response.status, 200, "request {i}: {}", response.text());
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(
        origin.requests().len(),
        10,
        "each request reached the worker once"
    );
    assert_eq!(origin.accepted_connections(), 10);
    let stale = gateway.metric("kvgate_upstream_stale_connections_total");
    assert!(stale >= 1.0, "{stale}");
    assert_eq!(gateway.metric("kvgate_upstream_retries_total"), stale);
    // No request failed: a stale pooled socket is not a worker error.
    assert_eq!(gateway.metric("kvgate_upstream_closed_errors_total"), 0.0);
}

#[test]
fn sigterm_lets_an_inflight_stream_finish() {
    let chunks = vec!["data: x\n\n".to_string(); 6];
    let reply = Reply::Chunked {
        chunks: chunks.clone(),
        gap: Duration::from_millis(100),
    };
    let origin = MockOrigin::start(move |_| reply.clone());
    let mut gateway = Gateway::start(&[origin.url()], &[]);
    let mut client = gateway.client();
    client.send_raw(b"POST /v1/completions HTTP/1.1\r\nhost: x\r\ncontent-length: 2\r\n\r\n{}");
    std::thread::sleep(Duration::from_millis(150));
    gateway.process.signal(libc::SIGTERM);
    let response = client.read_response();
    assert_eq!(
        response.text(),
        chunks.concat(),
        "the stream was cut by shutdown"
    );
    let status = gateway
        .process
        .wait_exit(TIMEOUT)
        .expect("kvgate exits after draining");
    assert!(status.success(), "{status:?}");
}

#[test]
fn sigterm_closes_the_listener_refuses_new_requests_and_cuts_streams_after_the_grace_period() {
    let reply = Reply::Chunked {
        chunks: vec!["data: x\n\n".into(); 100],
        gap: Duration::from_millis(100),
    };
    let origin = MockOrigin::start(move |r| {
        if r.path == "/generate" {
            Reply::json("{}")
        } else {
            reply.clone()
        }
    });
    let log = std::env::temp_dir().join(format!("kvgate-shutdown-{}.log", std::process::id()));
    let file = std::fs::File::create(&log).expect("log file");
    let args = ["--shutdown-grace-period-secs", "1"];
    let mut gateway = Gateway::start_logging(&[origin.url()], &args, Some(file));
    let mut kept_alive = gateway.client();
    assert_eq!(kept_alive.post_json("/generate", "{}").status, 200);
    let mut streaming = gateway.client();
    streaming.send_request("POST", "/v1/completions", &[], b"{}");
    assert_eq!(streaming.read_until_body_contains(b"data:"), 200);
    gateway.process.signal(libc::SIGTERM);
    let refused = wait_until(Duration::from_secs(1), || {
        std::net::TcpStream::connect(gateway.addr()).is_err()
    });
    assert!(refused, "the listener still accepts after SIGTERM");
    let response = kept_alive.post_json("/generate", "{}");
    assert_error(&response, 503);
    assert_eq!(response.header("connection"), Some("close"));
    // The stream runs 10 s: the grace period (1 s) cuts it with an error event.
    let response = streaming.read_response();
    let data = response.sse_data();
    assert!(data.len() < 50, "{} events: not cut", data.len());
    let last = data.last().copied().unwrap_or_default();
    assert!(
        last.contains("shutting down") && last.contains("\"code\":503"),
        "{last}"
    );
    let status = gateway
        .process
        .wait_exit(TIMEOUT)
        .expect("kvgate exits after the grace period");
    assert!(status.success(), "{status:?}");
    let text = std::fs::read_to_string(&log).expect("read the log");
    let _ = std::fs::remove_file(&log);
    assert!(
        text.contains("cutting 1 requests still in flight"),
        "{text}"
    );
}

#[test]
fn slow_request_heads_get_408_and_idle_connections_close() {
    let origin = ok_origin();
    let timeouts = [
        "--header-read-timeout-ms",
        "300",
        "--client-idle-timeout-ms",
        "600",
    ];
    let gateway = Gateway::start(&[origin.url()], &timeouts);
    let mut slow = gateway.client();
    slow.send_raw(b"POST /generate HTTP/1.1\r\ncontent-le");
    let started = Instant::now();
    let response = slow.read_response();
    assert_error(&response, 408);
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "{:?}",
        started.elapsed()
    );
    assert!(slow.is_closed_by_peer(TIMEOUT));
    let mut stalled_body = gateway.client();
    stalled_body
        .send_raw(b"POST /generate HTTP/1.1\r\nhost: x\r\ncontent-length: 10\r\n\r\n{\"a\"");
    assert_error(&stalled_body.read_response(), 408);
    let mut idle = gateway.client();
    assert_eq!(idle.post_json("/generate", "{}").status, 200);
    let started = Instant::now();
    assert!(
        idle.is_closed_by_peer(TIMEOUT),
        "idle keep-alive connection never closed"
    );
    let waited = started.elapsed();
    assert!(
        waited >= Duration::from_millis(400) && waited < Duration::from_secs(3),
        "{waited:?}"
    );
    assert!(origin.requests().len() == 1);
}

#[test]
fn host_transfer_encoding_and_target_form_follow_rfc_9112() {
    let origin = ok_origin();
    let gateway = Gateway::start(&[origin.url()], &[]);
    for bad in [
        &b"GET /health HTTP/1.1\r\n\r\n"[..],
        b"GET /health HTTP/1.1\r\nhost: a\r\nhost: b\r\n\r\n",
        b"POST /generate HTTP/1.0\r\ntransfer-encoding: chunked\r\n\r\n2\r\n{}\r\n0\r\n\r\n",
    ] {
        let mut client = gateway.client();
        client.send_raw(bad);
        let response = client.read_response();
        assert_error(&response, 400);
        assert_eq!(response.header("connection"), Some("close"));
        assert!(client.is_closed_by_peer(TIMEOUT));
    }
    // Absolute-form (RFC 9112 3.2.2) routes like origin-form, and the worker gets origin-form.
    let mut client = gateway.client();
    let body = CHAT;
    client.send_raw(
        format!(
            "POST http://127.0.0.1:{}/v1/chat/completions?a=1 HTTP/1.1\r\nhost: x\r\ncontent-length: {}\r\n\r\n{body}",
            gateway.port,
            body.len()
        )
        .as_bytes(),
    );
    assert_eq!(client.read_response().status, 200);
    assert_eq!(origin.requests()[0].path, "/v1/chat/completions?a=1");
}

#[test]
fn a_body_that_is_not_utf8_is_a_400_that_says_so() {
    let origin = ok_origin();
    let gateway = Gateway::start(&[origin.url()], &[]);
    let mut client = gateway.client();
    let mut body = br#"{"model":"m","messages":[{"role":"user","content":"h"#.to_vec();
    body.extend_from_slice(b"\xff\xfei\"}]}");
    let response = client.request("POST", "/v1/chat/completions", &[], &body);
    assert_error(&response, 400);
    let message = response.json()["error"]["message"].to_string();
    assert!(message.contains("UTF-8"), "{message}");
    assert!(
        message.contains(&format!("offset {}", body.len() - 7)),
        "{message}"
    );
    assert_eq!(client.post_json("/v1/chat/completions", CHAT).status, 200);
    assert_eq!(origin.requests().len(), 1);
}

#[test]
fn a_model_that_is_not_a_string_is_a_400_not_a_404() {
    let origin = ok_origin();
    let gateway = Gateway::start(&[origin.url()], &[]);
    let mut client = gateway.client();
    let body = r#"{"model":5,"messages":[{"role":"user","content":"hi"}]}"#;
    assert_error(&client.post_json("/v1/chat/completions", body), 400);
    assert!(origin.requests().is_empty());
}

#[test]
fn a_chunk_size_over_the_limit_gets_413_before_its_data() {
    let origin = ok_origin();
    let gateway = Gateway::start(&[origin.url()], &["--max-payload-size", "1000"]);
    let mut client = gateway.client();
    // Only the size line is sent: the answer cannot wait for the 4 KiB it announces.
    client.send_raw(
        b"POST /generate HTTP/1.1\r\nhost: x\r\ntransfer-encoding: chunked\r\n\r\n1000\r\n",
    );
    let response = client.read_response();
    assert_error(&response, 413);
    assert_eq!(response.header("connection"), Some("close"));
    // A size past 15 hex digits is the same case (it was a 431, as if a header were too long).
    let mut client = gateway.client();
    client.send_raw(
        b"POST /generate HTTP/1.1\r\nhost: x\r\ntransfer-encoding: chunked\r\n\r\n10000000000000000\r\n",
    );
    assert_error(&client.read_response(), 413);
    assert!(origin.requests().is_empty());
}

#[test]
fn forwarded_requests_carry_our_via_and_one_that_already_does_is_a_508() {
    let origin = ok_origin();
    let gateway = Gateway::start(&[origin.url()], &[]);
    let mut client = gateway.client();
    assert_eq!(client.post_json("/v1/chat/completions", CHAT).status, 200);
    let via = origin.requests()[0]
        .header("via")
        .expect("forwarded with a Via header")
        .to_string();
    let pseudonym = via.strip_prefix("1.1 ").expect("Via: 1.1 <pseudonym>");
    assert!(pseudonym.starts_with("kvgate-"), "{via}");
    // Another kvgate in front of this one is a chain, not a loop.
    let other = [("via", "1.1 kvgate-zzzzzzzz")];
    let chained = client.request("POST", "/v1/chat/completions", &other, CHAT.as_bytes());
    assert_eq!(chained.status, 200);
    // Our own pseudonym coming back is a loop: refused before any worker sees it.
    let looped = format!("1.0 edge, 1.1 {pseudonym}");
    let headers = [("via", looped.as_str())];
    let response = client.request("POST", "/v1/chat/completions", &headers, CHAT.as_bytes());
    assert_error(&response, 508);
    assert_eq!(origin.requests().len(), 2);
    assert_eq!(client.get("/health").status, 200, "the connection is kept");
}

#[test]
fn api_key_guards_the_inference_routes_and_leaves_health_open() {
    let origin = ok_origin();
    let gateway = Gateway::start(&[origin.url()], &["--api-key", "sk-test"]);
    let mut client = gateway.client();
    for authorization in [
        None,
        Some("Bearer wrong"),
        Some("sk-test"),
        Some("Basic sk-test"),
    ] {
        let headers: Vec<(&str, &str)> = authorization
            .map(|a| ("authorization", a))
            .into_iter()
            .collect();
        for path in [
            "/v1/chat/completions",
            "/generate",
            "/v1/completions",
            "/v1/messages",
        ] {
            let response = client.request("POST", path, &headers, CHAT.as_bytes());
            assert_error(&response, 401);
            assert_eq!(response.header("www-authenticate"), Some("Bearer"));
        }
    }
    assert!(
        origin.requests().is_empty(),
        "nothing unauthenticated reached a worker"
    );
    for path in ["/health", "/liveness", "/readiness", "/v1/models"] {
        assert_ne!(client.get(path).status, 401, "{path} stays open");
    }
    assert!(gateway.metrics().contains("smg_http_requests_total"));
    let key = [("authorization", "Bearer sk-test")];
    let response = client.request("POST", "/v1/chat/completions", &key, CHAT.as_bytes());
    assert_eq!(response.status, 200, "the connection survived the refusals");
    // The worker gets the client's token, as SMG's --api-key forwards it.
    assert_eq!(
        origin.requests()[0].header("authorization"),
        Some("Bearer sk-test")
    );
    // No `100 Continue` for a request refused by its head.
    let mut client = gateway.client();
    client.send_raw(
        b"POST /generate HTTP/1.1\r\nhost: x\r\nexpect: 100-continue\r\ncontent-length: 2\r\n\r\n",
    );
    let first = client.read_response();
    assert_eq!(first.status, 401);
    assert_eq!(first.header("connection"), Some("close"));
}
