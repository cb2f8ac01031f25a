//! Integration tests of what hostile clients and faulty workers must not be able to do to the
//! data path (issue 35): hold a core's body budget or memory with bodies they announce and do
//! not send, trickle a body forever, be read before they are refused, or stall mid-stream
//! without their worker's circuit hearing of it. Each test starts its own processes on free
//! loopback ports and bounds every wait.

mod utils;

use std::io::{Read, Write};
use std::net::Shutdown;
use std::time::Duration;

use utils::client::PeerActivity;
use utils::mock_origin::{MockOrigin, Reply};
use utils::process::Gateway;
use utils::{assert_error, ok_origin, wait_until, CHAT, TIMEOUT};

/// A head announcing a body of `length` bytes, and the first bytes of that body.
fn announced(path: &str, length: u64, extra_headers: &str) -> Vec<u8> {
    format!(
        "POST {path} HTTP/1.1\r\nhost: x\r\ncontent-length: {length}\r\n{extra_headers}\r\n{{\"text\":\"a"
    )
    .into_bytes()
}

#[test]
fn announced_bodies_hold_no_budget_until_their_bytes_arrive() {
    // The defaults: 512 MiB bodies, a 1 GiB budget per core. Two clients announcing 512 MiB
    // each and sending a few bytes used to take the whole budget, and every other request got
    // 503 until they went.
    let origin = ok_origin();
    let gateway = Gateway::start(&[origin.url()], &[]);
    let mut holders: Vec<_> = (0..3).map(|_| gateway.client()).collect();
    for holder in &mut holders {
        holder.send_raw(&announced("/generate", 512 << 20, ""));
    }
    for i in 0..5 {
        let response = gateway.client().post_json("/generate", r#"{"text":"b"}"#);
        assert_eq!(response.status, 200, "request {i}: {}", response.text());
    }
    assert_eq!(gateway.metric("kvgate_body_budget_rejections_total"), 0.0);
    // The holders are still being read, not refused.
    for holder in &mut holders {
        assert_eq!(
            holder.wait_for_peer(Duration::from_millis(200)),
            PeerActivity::Silent
        );
    }
}

#[test]
fn a_refused_head_is_answered_before_its_body_is_read() {
    let origin = ok_origin();
    let gateway = Gateway::start(&[origin.url()], &["--api-key", "sk-test"]);
    // Unauthenticated, with a 512 MiB body announced and not sent: 401 at once, and the
    // connection closes (its body is never read).
    for path in ["/generate", "/v1/chat/completions"] {
        let mut client = gateway.client();
        client.send_raw(&announced(path, 512 << 20, ""));
        let response = client.read_response();
        assert_error(&response, 401);
        assert_eq!(response.header("connection"), Some("close"));
        assert!(client.is_closed_by_peer(TIMEOUT));
    }
    // No such route, or the wrong method: 404 and 405 the same way.
    for (path, status) in [("/no/such/path", 404), ("/health", 405)] {
        let mut client = gateway.client();
        client.send_raw(&announced(
            path,
            1 << 20,
            "authorization: Bearer sk-test\r\n",
        ));
        assert_error(&client.read_response(), status);
        assert!(client.is_closed_by_peer(TIMEOUT));
    }
    // A refused request whose small body came with its head still keeps its connection.
    let mut client = gateway.client();
    assert_error(&client.post_json("/generate", r#"{"text":"a"}"#), 401);
    let key = [("authorization", "Bearer sk-test")];
    let response = client.request("POST", "/v1/chat/completions", &key, CHAT.as_bytes());
    assert_eq!(response.status, 200, "{}", response.text());
    assert_eq!(origin.requests().len(), 1);
}

#[test]
fn a_body_trickled_past_the_stall_timeout_gets_408() {
    let origin = ok_origin();
    let args = ["--stream-body-stall-timeout-secs", "1"];
    let gateway = Gateway::start(&[origin.url()], &args);
    let chunked_head = "POST /generate HTTP/1.1\r\nhost: x\r\ntransfer-encoding: chunked\r\n\r\n";
    for head in [
        announced("/generate", 100, ""),
        chunked_head.as_bytes().to_vec(),
    ] {
        let chunked = head.starts_with(chunked_head.as_bytes());
        let mut client = gateway.client();
        client.send_raw(&head);
        // A byte every 200 ms: each read comes well within the 30 s pause allowed between two
        // reads, but the body as a whole does not come within a second.
        let mut answered = false;
        for _ in 0..25 {
            client.send_raw(if chunked { b"1\r\na\r\n" } else { b"a" });
            if client.wait_for_peer(Duration::from_millis(200)) != PeerActivity::Silent {
                answered = true;
                break;
            }
        }
        assert!(answered, "the trickled body was never cut");
        let response = client.read_response();
        assert_error(&response, 408);
        assert!(client.is_closed_by_peer(TIMEOUT));
    }
    assert!(origin.requests().is_empty());
    // A body that comes at once is unaffected.
    let response = gateway.client().post_json("/generate", r#"{"text":"b"}"#);
    assert_eq!(response.status, 200);
}

#[test]
fn a_worker_that_stalls_mid_stream_opens_its_circuit() {
    // The worker answers its head and first event at once, then falls silent: each attempt
    // ends with an idle timeout after a success status.
    let reply = Reply::Chunked {
        chunks: vec!["data: a\n\n".into(), "data: b\n\n".into()],
        gap: Duration::from_secs(4),
    };
    let origin = MockOrigin::start(move |r| {
        if r.method == "GET" {
            Reply::json("{}")
        } else {
            reply.clone()
        }
    });
    let args = [
        "--upstream-idle-timeout-secs",
        "1",
        "--cb-failure-threshold",
        "2",
        "--disable-retries",
    ];
    let gateway = Gateway::start(&[origin.url()], &args);
    for i in 0..2 {
        let response = gateway.client().post_json("/v1/chat/completions", CHAT);
        assert_eq!(response.status, 200, "request {i}");
        let data = response.sse_data();
        assert!(
            data.last().is_some_and(|d| d.contains("\"code\":504")),
            "request {i}: {}",
            response.text()
        );
    }
    assert!(
        wait_until(TIMEOUT, || gateway.breaker_state(&origin.url()) == "open"),
        "two stalled streams in a row leave the circuit {}",
        gateway.breaker_state(&origin.url())
    );
}

/// The gateway's resident set in MiB.
fn rss_mib(gateway: &Gateway) -> u64 {
    status_mib(gateway, "VmRSS:")
}

#[test]
fn the_memory_of_large_bodies_goes_back_to_the_system() {
    // No worker: each body is read whole, then answered 503. The core then goes quiet, and
    // the allocator used to keep every page the bodies took until it allocated again.
    let gateway = Gateway::start(&[], &[]);
    assert_eq!(gateway.client().get("/health").status, 200);
    let quiet = rss_mib(&gateway);
    let body = format!(r#"{{"text":"{}"}}"#, "a".repeat(40 << 20));
    let senders: Vec<_> = (0..4)
        .map(|_| {
            let mut client = gateway.client();
            let body = body.clone();
            std::thread::spawn(move || client.post_json("/generate", &body).status)
        })
        .collect();
    for sender in senders {
        assert_ne!(sender.join().expect("a sender"), 200);
    }
    let mut after = rss_mib(&gateway);
    let returned = wait_until(TIMEOUT, || {
        after = rss_mib(&gateway);
        after < quiet + 32
    });
    assert!(
        returned,
        "RSS {quiet} MiB quiet, {after} MiB after four 40 MiB bodies"
    );
}

#[test]
fn a_client_that_half_closes_during_a_fast_stream_is_a_hang_up() {
    // Events every 20 ms: the stream's reads never wait the quarter second after which a wait
    // on the worker polls for the client.
    let reply = Reply::Chunked {
        chunks: vec!["data: x\n\n".into(); 200],
        gap: Duration::from_millis(20),
    };
    let origin = MockOrigin::start(move |_| reply.clone());
    let gateway = Gateway::start(&[origin.url()], &[]);
    let mut stream = std::net::TcpStream::connect(gateway.addr()).expect("connect");
    stream.set_read_timeout(Some(TIMEOUT)).expect("timeout");
    let request = format!(
        "POST /v1/completions HTTP/1.1\r\nhost: x\r\ncontent-length: {}\r\n\r\n{CHAT}",
        CHAT.len()
    );
    stream.write_all(request.as_bytes()).expect("write");
    let mut seen = Vec::new();
    let mut buf = [0u8; 4096];
    while !seen.windows(7).any(|w| w == b"data: x") {
        let n = stream.read(&mut buf).expect("the stream's first event");
        assert!(n > 0, "closed before the first event");
        seen.extend_from_slice(&buf[..n]);
    }
    // The client stops sending (its side of the connection is shut) and keeps reading.
    stream.shutdown(Shutdown::Write).expect("half-close");
    loop {
        match stream.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => seen.extend_from_slice(&buf[..n]),
            Err(e) => panic!("the gateway neither streamed nor closed: {e}"),
        }
    }
    let events = seen.windows(7).filter(|w| *w == b"data: x").count();
    assert!(
        events < 200,
        "the whole stream went to a client that hung up"
    );
    assert!(gateway.metric("kvgate_downstream_aborts_total") >= 1.0);
    // The worker's request was closed (it notices at its next write, after its last event).
    assert!(wait_until(TIMEOUT, || origin.stream_cut_offs() == 1));
}

/// A field of the gateway's `/proc` status in MiB (`VmRSS`, `VmHWM`).
fn status_mib(gateway: &Gateway, field: &str) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{}/status", gateway.process.pid()))
        .expect("the gateway's /proc status");
    let line = status
        .lines()
        .find(|l| l.starts_with(field))
        .expect("the field");
    let kib: u64 = line
        .split_whitespace()
        .nth(1)
        .and_then(|v| v.parse().ok())
        .expect("a size in kB");
    kib / 1024
}

#[test]
fn a_chunked_body_peaks_without_the_buffers_it_outgrew() {
    // The body once in the read buffer and its prompt text once for the index: two bodies.
    // The buffers the read buffer outgrew while the size was unknown made a third.
    let gateway = Gateway::start(&[], &[]);
    assert_eq!(gateway.client().get("/health").status, 200);
    let before = status_mib(&gateway, "VmHWM:").max(status_mib(&gateway, "VmRSS:"));
    let size = 40 << 20;
    let body = format!(r#"{{"text":"{}"}}"#, "a".repeat(size - 11));
    let mut client = gateway.client();
    client.send_raw(b"POST /generate HTTP/1.1\r\nhost: x\r\ntransfer-encoding: chunked\r\n\r\n");
    for piece in body.as_bytes().chunks(64 << 10) {
        client.send_raw(format!("{:x}\r\n", piece.len()).as_bytes());
        client.send_raw(piece);
        client.send_raw(b"\r\n");
    }
    client.send_raw(b"0\r\n\r\n");
    assert_ne!(client.read_response().status, 200, "no worker");
    let peak = status_mib(&gateway, "VmHWM:") - before;
    let bodies = peak as f64 / (size >> 20) as f64;
    assert!(
        bodies < 2.5,
        "a {} MiB chunked body peaked at +{peak} MiB ({bodies:.2} bodies)",
        size >> 20
    );
}

#[test]
fn a_stream_gives_its_large_request_bodys_memory_back_while_it_lasts() {
    // The request's buffer is let go of when its stream commits; the stream then lasts.
    let reply = Reply::Chunked {
        chunks: vec!["data: a\n\n".into(), "data: b\n\n".into()],
        gap: Duration::from_secs(6),
    };
    let origin = MockOrigin::start(move |_| reply.clone());
    // round_robin: no index keeps the prompt's text.
    let gateway = Gateway::start(&[origin.url()], &["--policy", "round_robin"]);
    assert_eq!(gateway.client().get("/health").status, 200);
    let quiet = rss_mib(&gateway);
    let body = format!(r#"{{"text":"{}"}}"#, "a".repeat(40 << 20));
    let mut client = gateway.client();
    client.send_request("POST", "/generate", &[], body.as_bytes());
    assert_eq!(client.read_head_and_first_chunk(), 200);
    let mut during = rss_mib(&gateway);
    let returned = wait_until(Duration::from_secs(3), || {
        during = rss_mib(&gateway);
        during < quiet + 32
    });
    assert!(
        returned,
        "RSS {quiet} MiB quiet, {during} MiB during the stream"
    );
}
