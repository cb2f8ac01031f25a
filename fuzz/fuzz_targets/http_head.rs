//! The HTTP/1.1 head parser (`kvgate::net::codec`): every input is parsed as a client's request
//! head and as an engine's response head, and a request head that parses is rebuilt as the
//! gateway sends it upstream.
//!
//! Checked beyond "no panic": every span the parser returns lies inside the head it measured,
//! the head is no longer than the input nor `HEADER_BYTES_MAX`, an incomplete input is never
//! longer than the cap, framing and connection follow from the headers, parsing is prefix-stable
//! (the head alone parses to the same head, one byte less is not a head), and the upstream head
//! re-parses with the same method and target, one `Host`, one `Content-Length` and no
//! hop-by-hop header, so nothing a client sends can change how the engine frames the request.
#![no_main]

use kvgate::error::ErrorKind;
use kvgate::limits::{HEADERS_MAX, HEADER_BYTES_MAX};
use kvgate::net::codec::{
    parse_request_head, parse_response_head, write_upstream_request_head, Framing, HeaderSpans,
    RequestHead,
};
use kvgate::request::Method;
use libfuzzer_sys::fuzz_target;

const AUTHORITY: &str = "127.0.0.1:30000";

fuzz_target!(|data: &[u8]| {
    check_request(data);
    check_response(data, Method::Post);
    check_response(data, Method::Head);
});

/// Whether `part` is a subslice of `buf[..end]`.
fn within(buf: &[u8], end: usize, part: &[u8]) -> bool {
    let start = buf.as_ptr() as usize;
    let at = part.as_ptr() as usize;
    part.is_empty() || (at >= start && at + part.len() <= start + end)
}

fn check_headers(buf: &[u8], head_len: usize, headers: &HeaderSpans) {
    let mut count = 0;
    for (name, value) in headers.iter(buf) {
        assert!(!name.is_empty(), "empty header name");
        assert!(within(buf, head_len, name), "header name outside the head");
        assert!(
            within(buf, head_len, value),
            "header value outside the head"
        );
        count += 1;
    }
    assert!(count <= HEADERS_MAX);
}

fn has_header(buf: &[u8], headers: &HeaderSpans, name: &str) -> bool {
    headers.get(buf, name).is_some()
}

fn check_request(buf: &[u8]) {
    let head = match parse_request_head(buf) {
        Err(e) => {
            assert!(
                matches!(
                    e.kind,
                    ErrorKind::MalformedRequest | ErrorKind::HeadersTooLarge
                ),
                "request head error of kind {:?}",
                e.kind
            );
            return;
        }
        Ok(None) => {
            assert!(
                buf.len() <= HEADER_BYTES_MAX,
                "incomplete head past the cap"
            );
            return;
        }
        Ok(Some(head)) => head,
    };
    let n = head.head_len;
    assert!(n <= buf.len() && n <= HEADER_BYTES_MAX, "head_len {n}");
    assert!(head.target.start <= head.target.end && head.target.end <= n);
    let method = head.method_text(buf);
    assert!(!method.is_empty() && within(buf, n, method.as_bytes()));
    assert_eq!(head.method, Method::of_token(method));
    assert!(head.path(buf).len() <= head.target(buf).len());
    assert!(head.version_minor <= 1);
    check_headers(buf, n, &head.headers);
    match head.framing {
        Framing::Length(len) => {
            assert!(len > 0);
            assert!(has_header(buf, &head.headers, "content-length"));
        }
        Framing::Chunked => assert!(has_header(buf, &head.headers, "transfer-encoding")),
        Framing::Empty => {}
        Framing::UntilClose => panic!("a request framed until close"),
    }
    assert!(!head.expect_continue || head.version_minor == 1);
    assert!(!head.connection.is_kept() || head.version_minor == 1);
    // The head alone is the same head; one byte less is not a head yet.
    let again = parse_request_head(&buf[..n])
        .ok()
        .flatten()
        .expect("the head alone parses");
    assert_eq!(again.head_len, n);
    assert_eq!(again.target, head.target);
    assert_eq!(again.framing, head.framing);
    assert!(!matches!(parse_request_head(&buf[..n - 1]), Ok(Some(_))));
    check_upstream_head(buf, &head);
}

/// The head the gateway writes upstream, re-parsed with plain `httparse` (room for every header
/// the writer may add: the gateway's own caps are for clients, not for what it writes).
fn check_upstream_head(buf: &[u8], head: &RequestHead) {
    let body_len = buf.len() - head.head_len;
    let mut out = Vec::new();
    write_upstream_request_head(&mut out, head, buf, AUTHORITY, body_len);
    let mut parsed = [httparse::EMPTY_HEADER; HEADERS_MAX + 2];
    let mut request = httparse::Request::new(&mut parsed);
    let status = request.parse(&out);
    assert!(
        matches!(status, Ok(httparse::Status::Complete(n)) if n == out.len()),
        "the upstream head does not re-parse whole: {status:?} {:?}",
        String::from_utf8_lossy(&out)
    );
    assert_eq!(request.method, Some(head.method_text(buf)));
    assert_eq!(request.path.map(str::as_bytes), Some(head.target(buf)));
    let (mut hosts, mut lengths) = (0, 0);
    for h in request.headers.iter() {
        let name = h.name.to_ascii_lowercase();
        match name.as_str() {
            "host" => {
                hosts += 1;
                assert_eq!(h.value, AUTHORITY.as_bytes());
            }
            "content-length" => {
                lengths += 1;
                assert_eq!(h.value, body_len.to_string().as_bytes());
            }
            "connection" | "keep-alive" | "proxy-connection" | "te" | "trailer"
            | "transfer-encoding" | "upgrade" | "expect" => {
                panic!("hop-by-hop header {name} sent upstream")
            }
            _ => {}
        }
    }
    assert_eq!((hosts, lengths), (1, 1), "one Host and one Content-Length");
}

fn check_response(buf: &[u8], method: Method) {
    let head = match parse_response_head(buf, method) {
        Err(e) => {
            assert_eq!(e.kind, ErrorKind::UpstreamMalformed);
            return;
        }
        Ok(None) => {
            assert!(
                buf.len() <= HEADER_BYTES_MAX,
                "incomplete head past the cap"
            );
            return;
        }
        Ok(Some(head)) => head,
    };
    let n = head.head_len;
    assert!(n <= buf.len() && n <= HEADER_BYTES_MAX, "head_len {n}");
    assert!((100..=999).contains(&head.status), "status {}", head.status);
    check_headers(buf, n, &head.headers);
    let bodiless =
        method == Method::Head || head.status < 200 || head.status == 204 || head.status == 304;
    match head.framing {
        Framing::Empty => {}
        Framing::Length(len) => assert!(len > 0 && !bodiless),
        Framing::Chunked => {
            assert!(!bodiless && has_header(buf, &head.headers, "transfer-encoding"))
        }
        Framing::UntilClose => assert!(!bodiless && !head.connection.is_kept()),
    }
    if bodiless {
        assert_eq!(head.framing, Framing::Empty);
    }
    let again = parse_response_head(&buf[..n], method)
        .ok()
        .flatten()
        .expect("the head alone parses");
    assert_eq!((again.head_len, again.status), (n, head.status));
    assert_eq!(again.framing, head.framing);
    assert!(!matches!(
        parse_response_head(&buf[..n - 1], method),
        Ok(Some(_))
    ));
}
