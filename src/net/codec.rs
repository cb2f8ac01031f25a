//! The HTTP/1.1 codec, sans I/O: request and response head parsing on `httparse` with a fixed
//! header array and a byte cap, body framing (`Framing`), the incremental `ChunkedDecoder`, and
//! the writers that rebuild heads for the other side with hop-by-hop headers removed (RFC 9110
//! section 7.6.1). Heads keep byte offsets into the caller's buffer instead of copies, so parsing
//! allocates nothing. Errors are `ProxyError`s of kind `MalformedRequest` / `HeadersTooLarge`
//! (downstream) or `UpstreamMalformed` (upstream).

use std::ops::Range;

use crate::copy;
use crate::error::{ErrorKind, ProxyError};
use crate::limits::{CHUNK_LINE_BYTES_MAX, CHUNK_TRAILER_BYTES_MAX, HEADERS_MAX, HEADER_BYTES_MAX};
use crate::request::Method;

/// A header's name and value as offsets into the buffer its head was parsed from. A head is
/// at most `HEADER_BYTES_MAX` bytes from the buffer's start, so `u16` offsets suffice: a
/// head's 64 spans take 512 bytes, not 1 KB, of every connection's task (a request's head
/// lives as long as its response streams).
#[derive(Clone, Copy, Debug, Default)]
struct HeaderSpan {
    name_start: u16,
    name_end: u16,
    value_start: u16,
    value_end: u16,
}

const _: () = assert!(HEADER_BYTES_MAX <= u16::MAX as usize);

/// An offset within a complete head as a span bound (heads are parsed only when they end
/// within `HEADER_BYTES_MAX`, so it never saturates).
fn span_offset(offset: usize) -> u16 {
    u16::try_from(offset).unwrap_or(u16::MAX)
}

/// The headers of one head, as spans into its buffer.
#[derive(Clone, Debug)]
pub struct HeaderSpans {
    spans: [HeaderSpan; HEADERS_MAX],
    len: usize,
}

impl HeaderSpans {
    fn new() -> Self {
        HeaderSpans {
            spans: [HeaderSpan::default(); HEADERS_MAX],
            len: 0,
        }
    }

    /// `(name, value)` pairs, read from `buf` (the buffer the head was parsed from).
    pub fn iter<'b>(&'b self, buf: &'b [u8]) -> impl Iterator<Item = (&'b [u8], &'b [u8])> + 'b {
        self.spans[..self.len].iter().map(move |s| {
            (
                &buf[s.name_start as usize..s.name_end as usize],
                &buf[s.value_start as usize..s.value_end as usize],
            )
        })
    }

    /// The first value of header `name` (case-insensitive). Called a few times a request:
    /// names of another length are passed over on their span alone, without slicing the buffer.
    pub fn get<'b>(&'b self, buf: &'b [u8], name: &str) -> Option<&'b [u8]> {
        let name = name.as_bytes();
        let span = self.spans[..self.len].iter().find(|s| {
            usize::from(s.name_end.wrapping_sub(s.name_start)) == name.len()
                && buf
                    .get(usize::from(s.name_start)..usize::from(s.name_end))
                    .is_some_and(|n| n.eq_ignore_ascii_case(name))
        })?;
        buf.get(usize::from(span.value_start)..usize::from(span.value_end))
    }
}

/// How a message body is delimited.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Framing {
    /// No body.
    Empty,
    /// Exactly this many bytes.
    Length(u64),
    /// `Transfer-Encoding: chunked`.
    Chunked,
    /// Until the sender closes (responses only).
    UntilClose,
}

/// What becomes of a connection after a message: kept for the next one, or closed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Connection {
    /// The connection serves another message.
    KeepAlive,
    /// The connection closes after this message (`connection: close` is sent).
    Close,
}

impl Connection {
    /// `KeepAlive` when `keep` holds.
    pub fn keep_if(keep: bool) -> Connection {
        if keep {
            Connection::KeepAlive
        } else {
            Connection::Close
        }
    }

    /// Whether the connection serves another message.
    pub fn is_kept(self) -> bool {
        self == Connection::KeepAlive
    }

    /// Kept only if both sides keep it.
    pub fn and(self, other: Connection) -> Connection {
        Connection::keep_if(self.is_kept() && other.is_kept())
    }
}

/// A parsed request head.
#[derive(Clone, Debug)]
pub struct RequestHead {
    /// The method.
    pub method: Method,
    /// Offsets of the method token in the buffer.
    method_span: Range<usize>,
    /// Offsets of the request target (path and query) in the buffer.
    pub target: Range<usize>,
    /// `1` for HTTP/1.1, `0` for HTTP/1.0.
    pub version_minor: u8,
    /// The headers.
    pub headers: HeaderSpans,
    /// How the body is delimited.
    pub framing: Framing,
    /// Whether the client wants the connection kept after this request.
    pub connection: Connection,
    /// Whether the client sent `Expect: 100-continue`.
    pub expect_continue: bool,
    /// Bytes of the head, including the final CRLF.
    pub head_len: usize,
}

impl RequestHead {
    /// The path and query.
    pub fn target<'b>(&self, buf: &'b [u8]) -> &'b [u8] {
        &buf[self.target.clone()]
    }

    /// The method token as sent (`DELETE`, ...), for endpoints beyond `Method`'s variants.
    pub fn method_text<'b>(&self, buf: &'b [u8]) -> &'b str {
        std::str::from_utf8(&buf[self.method_span.clone()]).unwrap_or("")
    }

    /// Whether a `Via` header names `pseudonym` as a proxy the request passed through (RFC 9110
    /// 7.6.3: `protocol received-by`, comma-separated): the request has looped back.
    pub fn via_names(&self, buf: &[u8], pseudonym: &[u8]) -> bool {
        self.headers
            .iter(buf)
            .filter(|(name, _)| name.eq_ignore_ascii_case(b"via"))
            .flat_map(|(_, value)| comma_tokens(value))
            .any(|hop| {
                hop.split(u8::is_ascii_whitespace)
                    .filter(|word| !word.is_empty())
                    .nth(1)
                    == Some(pseudonym)
            })
    }

    /// The path without the query.
    pub fn path<'b>(&self, buf: &'b [u8]) -> &'b [u8] {
        let target = self.target(buf);
        let end = target
            .iter()
            .position(|&b| b == b'?')
            .unwrap_or(target.len());
        &target[..end]
    }
}

/// A parsed response head.
#[derive(Clone, Debug)]
pub struct ResponseHead {
    /// The status code.
    pub status: u16,
    /// Offsets of the reason phrase.
    reason: Range<usize>,
    /// The headers.
    pub headers: HeaderSpans,
    /// How the body is delimited (already accounting for status codes without bodies).
    pub framing: Framing,
    /// Whether the worker keeps the connection open after this response.
    pub connection: Connection,
    /// Bytes of the head, including the final CRLF.
    pub head_len: usize,
}

/// Where `part` (a slice `httparse` returned) starts inside `buf`. Empty parts may not point
/// into `buf`; they get offset 0, which spans nothing either way.
fn offset_in(buf: &[u8], part: &[u8]) -> usize {
    if part.is_empty() {
        return 0;
    }
    let start = (part.as_ptr() as usize).wrapping_sub(buf.as_ptr() as usize);
    debug_assert!(start <= buf.len() && part.len() <= buf.len() - start);
    start.min(buf.len())
}

fn span_headers(buf: &[u8], parsed: &[httparse::Header<'_>]) -> HeaderSpans {
    let mut spans = HeaderSpans::new();
    for (slot, h) in spans.spans.iter_mut().zip(parsed) {
        let name_start = offset_in(buf, h.name.as_bytes());
        let value_start = offset_in(buf, h.value);
        *slot = HeaderSpan {
            name_start: span_offset(name_start),
            name_end: span_offset((name_start + h.name.len()).min(buf.len())),
            value_start: span_offset(value_start),
            value_end: span_offset((value_start + h.value.len()).min(buf.len())),
        };
    }
    spans.len = parsed.len();
    spans
}

/// What the framing and connection headers of a message say.
#[derive(Default)]
struct FramingHeaders {
    content_length: Option<u64>,
    chunked: bool,
    other_transfer_coding: bool,
    conn_close: bool,
    conn_keep_alive: bool,
    expect_continue: bool,
    /// `Host` header fields seen (RFC 9112 3.2: exactly one in an HTTP/1.1 request).
    host_fields: u8,
}

fn read_framing_headers(buf: &[u8], headers: &HeaderSpans) -> Result<FramingHeaders, ()> {
    let mut f = FramingHeaders::default();
    for (name, value) in headers.iter(buf) {
        if name.eq_ignore_ascii_case(b"content-length") {
            let n = parse_decimal(value).ok_or(())?;
            if f.content_length.is_some_and(|m| m != n) {
                return Err(());
            }
            f.content_length = Some(n);
        } else if name.eq_ignore_ascii_case(b"transfer-encoding") {
            for coding in comma_tokens(value) {
                // Only the final coding decides; anything after `chunked` is an error.
                f.other_transfer_coding |= f.chunked || !coding.eq_ignore_ascii_case(b"chunked");
                f.chunked |= coding.eq_ignore_ascii_case(b"chunked");
            }
        } else if name.eq_ignore_ascii_case(b"connection") {
            for token in comma_tokens(value) {
                f.conn_close |= token.eq_ignore_ascii_case(b"close");
                f.conn_keep_alive |= token.eq_ignore_ascii_case(b"keep-alive");
            }
        } else if name.eq_ignore_ascii_case(b"expect") {
            f.expect_continue |= value.eq_ignore_ascii_case(b"100-continue");
        } else if name.eq_ignore_ascii_case(b"host") {
            f.host_fields = f.host_fields.saturating_add(1);
        }
    }
    Ok(f)
}

fn parse_decimal(value: &[u8]) -> Option<u64> {
    let value = trim(value);
    if value.is_empty() || value.len() > 19 {
        return None;
    }
    value.iter().try_fold(0u64, |acc, &b| {
        b.is_ascii_digit().then(|| acc * 10 + u64::from(b - b'0'))
    })
}

fn trim(value: &[u8]) -> &[u8] {
    let start = value
        .iter()
        .position(|b| !b.is_ascii_whitespace())
        .unwrap_or(value.len());
    let end = value
        .iter()
        .rposition(|b| !b.is_ascii_whitespace())
        .map_or(start, |e| e + 1);
    &value[start..end]
}

/// The non-empty, trimmed elements of a comma-separated header value.
pub fn comma_tokens(value: &[u8]) -> impl Iterator<Item = &[u8]> {
    value
        .split(|&b| b == b',')
        .map(trim)
        .filter(|t| !t.is_empty())
}

fn request_error(kind: ErrorKind) -> ProxyError {
    ProxyError::downstream(kind, "parse request head")
}

/// Parses a request head from the start of `buf`: `Ok(None)` while incomplete.
pub fn parse_request_head(buf: &[u8]) -> Result<Option<RequestHead>, ProxyError> {
    let mut parsed = [httparse::EMPTY_HEADER; HEADERS_MAX];
    let mut request = httparse::Request::new(&mut parsed);
    let head_len = match request.parse(buf) {
        Ok(httparse::Status::Complete(n)) => n,
        Ok(httparse::Status::Partial) if buf.len() > HEADER_BYTES_MAX => {
            return Err(request_error(ErrorKind::HeadersTooLarge))
        }
        Ok(httparse::Status::Partial) => return Ok(None),
        Err(httparse::Error::TooManyHeaders) => {
            return Err(request_error(ErrorKind::HeadersTooLarge))
        }
        Err(_) => return Err(request_error(ErrorKind::MalformedRequest)),
    };
    if head_len > HEADER_BYTES_MAX {
        return Err(request_error(ErrorKind::HeadersTooLarge));
    }
    let malformed = || request_error(ErrorKind::MalformedRequest);
    let (Some(method), Some(path), Some(version_minor)) =
        (request.method, request.path, request.version)
    else {
        return Err(malformed());
    };
    let headers = span_headers(buf, request.headers);
    let f = read_framing_headers(buf, &headers).map_err(|()| malformed())?;
    // Both length and chunked is a smuggling vector (RFC 9112 6.1): refuse it outright.
    if f.other_transfer_coding || (f.chunked && f.content_length.is_some()) {
        return Err(malformed());
    }
    // RFC 9112 6.1: a Transfer-Encoding in an HTTP/1.0 request means the framing is faulty
    // (an HTTP/1.0 peer may not know chunked); RFC 9112 3.2: an HTTP/1.1 request carries
    // exactly one Host, and no request more than one.
    let transfer_coding = f.chunked || f.other_transfer_coding;
    if (version_minor == 0 && transfer_coding)
        || f.host_fields > 1
        || (version_minor == 1 && f.host_fields == 0)
    {
        return Err(malformed());
    }
    let framing = match (f.chunked, f.content_length) {
        (true, _) => Framing::Chunked,
        (false, Some(0) | None) => Framing::Empty,
        (false, Some(n)) => Framing::Length(n),
    };
    let method_start = offset_in(buf, method.as_bytes());
    let target_start = offset_in(buf, path.as_bytes());
    let target_end = (target_start + path.len()).min(buf.len());
    let target_start = target_start + origin_form_offset(path.as_bytes()).ok_or_else(malformed)?;
    Ok(Some(RequestHead {
        method: Method::of_token(method),
        method_span: method_start..method_start + method.len(),
        target: target_start..target_end,
        version_minor,
        headers,
        framing,
        // HTTP/1.0 clients are served one request per connection: keeping them would need an
        // explicit `Connection: keep-alive` in every answer, for clients nobody uses any more.
        connection: Connection::keep_if(version_minor == 1 && !f.conn_close),
        expect_continue: f.expect_continue && version_minor == 1,
        head_len,
    }))
}

/// Where the origin-form part (`/path?query`) of a request target starts: 0 for an
/// origin-form target; past the authority for an absolute-form one (`http://host/path`, RFC
/// 9112 3.2.2, which a server must accept), so it routes and is forwarded like origin-form.
/// `None` for an absolute-form target without a path.
fn origin_form_offset(target: &[u8]) -> Option<usize> {
    let scheme_len = [&b"http://"[..], b"https://"]
        .into_iter()
        .find_map(|scheme| {
            let prefix = target.get(..scheme.len())?;
            prefix.eq_ignore_ascii_case(scheme).then_some(scheme.len())
        });
    let Some(scheme_len) = scheme_len else {
        return Some(0);
    };
    let authority_len = target[scheme_len..].iter().position(|&b| b == b'/')?;
    Some(scheme_len + authority_len)
}

fn response_error() -> ProxyError {
    ProxyError::upstream(ErrorKind::UpstreamMalformed, "parse response head")
}

/// Parses a response head from the start of `buf`: `Ok(None)` while incomplete.
/// `request_method` decides whether a body follows (none for `HEAD`).
pub fn parse_response_head(
    buf: &[u8],
    request_method: Method,
) -> Result<Option<ResponseHead>, ProxyError> {
    let mut parsed = [httparse::EMPTY_HEADER; HEADERS_MAX];
    let mut response = httparse::Response::new(&mut parsed);
    let head_len = match response.parse(buf) {
        Ok(httparse::Status::Complete(n)) if n <= HEADER_BYTES_MAX => n,
        Ok(httparse::Status::Partial) if buf.len() <= HEADER_BYTES_MAX => return Ok(None),
        _ => return Err(response_error()),
    };
    let (Some(status), Some(version_minor)) = (response.code, response.version) else {
        return Err(response_error());
    };
    // httparse takes any three digits; below 100 is no status (RFC 9110 15), and would pass
    // as bodiless yet final, leaving its body on the connection.
    if status < 100 {
        return Err(response_error());
    }
    let reason = response.reason.unwrap_or("");
    let reason_start = if reason.is_empty() {
        0
    } else {
        offset_in(buf, reason.as_bytes())
    };
    let headers = span_headers(buf, response.headers);
    let f = read_framing_headers(buf, &headers).map_err(|()| response_error())?;
    let no_body = request_method == Method::Head || status < 200 || status == 204 || status == 304;
    let framing = if no_body {
        Framing::Empty
    } else if f.chunked && !f.other_transfer_coding {
        Framing::Chunked
    } else if f.other_transfer_coding {
        Framing::UntilClose
    } else {
        match f.content_length {
            Some(0) => Framing::Empty,
            Some(n) => Framing::Length(n),
            None => Framing::UntilClose,
        }
    };
    let keep_alive = framing != Framing::UntilClose
        && if version_minor == 0 {
            f.conn_keep_alive
        } else {
            !f.conn_close
        };
    Ok(Some(ResponseHead {
        status,
        reason: reason_start..reason_start + reason.len(),
        headers,
        framing,
        connection: Connection::keep_if(keep_alive),
        head_len,
    }))
}

/// Headers that describe one connection, not the message (RFC 9110 7.6.1), plus the framing
/// headers we always rewrite ourselves.
fn is_hop_by_hop(name: &[u8]) -> bool {
    const NAMES: [&[u8]; 9] = [
        b"connection",
        b"keep-alive",
        b"proxy-connection",
        b"te",
        b"trailer",
        b"transfer-encoding",
        b"upgrade",
        b"content-length",
        b"expect",
    ];
    NAMES.iter().any(|n| name.eq_ignore_ascii_case(n))
}

/// Whether `name` is listed in one of the message's `Connection` headers.
fn named_by_connection(buf: &[u8], headers: &HeaderSpans, name: &[u8]) -> bool {
    headers
        .iter(buf)
        .filter(|(n, _)| n.eq_ignore_ascii_case(b"connection"))
        .any(|(_, v)| comma_tokens(v).any(|t| t.eq_ignore_ascii_case(name)))
}

fn write_end_to_end_headers(out: &mut Vec<u8>, buf: &[u8], headers: &HeaderSpans, skip: &[&[u8]]) {
    let has_connection = headers.get(buf, "connection").is_some();
    for (name, value) in headers.iter(buf) {
        if is_hop_by_hop(name) || skip.iter().any(|s| name.eq_ignore_ascii_case(s)) {
            continue;
        }
        if has_connection && named_by_connection(buf, headers, name) {
            continue;
        }
        out.extend_from_slice(name);
        out.extend_from_slice(b": ");
        out.extend_from_slice(value);
        out.extend_from_slice(b"\r\n");
    }
}

/// Writes the head sent upstream: same method and target, `Host` set to the worker, end-to-end
/// headers kept, and the (already complete) body announced with `Content-Length`.
pub fn write_upstream_request_head(
    out: &mut Vec<u8>,
    head: &RequestHead,
    buf: &[u8],
    authority: &str,
    body_len: usize,
) {
    write_upstream_request_head_via(out, head, buf, authority, "", b"", body_len);
}

/// As [`write_upstream_request_head`], adding `Via: 1.1 <pseudonym>` (RFC 9110 7.6.3) after the
/// client's own `Via` headers, unless `pseudonym` is empty, and `request_id_line` (the
/// gateway's `x-request-id: <id>\r\n`, or nothing) as it is.
pub fn write_upstream_request_head_via(
    out: &mut Vec<u8>,
    head: &RequestHead,
    buf: &[u8],
    authority: &str,
    pseudonym: &str,
    request_id_line: &[u8],
    body_len: usize,
) {
    out.extend_from_slice(&buf[head.method_span.clone()]);
    out.push(b' ');
    out.extend_from_slice(head.target(buf));
    out.extend_from_slice(b" HTTP/1.1\r\nhost: ");
    out.extend_from_slice(authority.as_bytes());
    out.extend_from_slice(b"\r\n");
    write_end_to_end_headers(out, buf, &head.headers, &[b"host"]);
    if !pseudonym.is_empty() {
        out.extend_from_slice(b"via: 1.1 ");
        out.extend_from_slice(pseudonym.as_bytes());
        out.extend_from_slice(b"\r\n");
    }
    out.extend_from_slice(request_id_line);
    write_content_length(out, body_len as u64);
    out.extend_from_slice(b"\r\n");
}

/// How the body of a response is framed towards the client.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DownstreamFraming {
    /// `Content-Length: n`, bytes passed through.
    Length(u64),
    /// No body.
    Empty,
    /// Chunked bytes passed through unchanged (HTTP/1.1 clients).
    ChunkedPassthrough,
    /// Body bytes written raw, end marked by closing (HTTP/1.0 clients, close-delimited workers).
    UntilClose,
}

impl DownstreamFraming {
    /// The framing towards a client of HTTP/1.`client_minor` for an upstream body framed `up`.
    pub fn choose(up: Framing, client_minor: u8) -> Self {
        match up {
            Framing::Empty => DownstreamFraming::Empty,
            Framing::Length(n) => DownstreamFraming::Length(n),
            Framing::Chunked if client_minor >= 1 => DownstreamFraming::ChunkedPassthrough,
            Framing::Chunked | Framing::UntilClose => DownstreamFraming::UntilClose,
        }
    }
}

/// The header the gateway adds to a worker's response head when its index predicted the prompt
/// tokens the worker had cached (cache_aware, token IDs): benchmarks compare it with what the
/// engine then reports cached.
pub const PREDICTED_CACHED_TOKENS_HEADER: &[u8] = b"x-kvgate-predicted-cached-tokens";

/// What the gateway adds to a worker's response head.
#[derive(Clone, Copy, Debug)]
pub struct GatewayHeaders<'a> {
    /// `x-smg-routed-worker-id: <url>\r\n`.
    pub routed_worker_line: &'a [u8],
    /// Prompt tokens the index said the worker holds (0: no prediction, no header).
    pub predicted_cached_tokens: u32,
    /// `x-request-id: <id>\r\n`: the request's id replaces any the worker sent (as SMG's).
    pub request_id_line: &'a [u8],
}

/// Writes the head sent to the client: the worker's status and end-to-end headers, the gateway's
/// headers, our framing and our connection decision.
pub fn write_downstream_response_head(
    out: &mut Vec<u8>,
    head: &ResponseHead,
    buf: &[u8],
    gateway: GatewayHeaders<'_>,
    framing: DownstreamFraming,
    connection: Connection,
) {
    out.extend_from_slice(b"HTTP/1.1 ");
    write_status_code(out, head.status);
    out.push(b' ');
    out.extend_from_slice(&buf[head.reason.clone()]);
    out.extend_from_slice(b"\r\n");
    let skip: [&[u8]; 2] = [b"x-smg-routed-worker-id", b"x-request-id"];
    write_end_to_end_headers(out, buf, &head.headers, &skip);
    if head.headers.get(buf, "date").is_none() {
        // The worker's own Date passes through; one without gets the gateway's (RFC 9110 6.6.1).
        super::date::write_date_header(out);
    }
    out.extend_from_slice(gateway.routed_worker_line);
    out.extend_from_slice(gateway.request_id_line);
    if gateway.predicted_cached_tokens > 0 {
        out.extend_from_slice(PREDICTED_CACHED_TOKENS_HEADER);
        out.extend_from_slice(b": ");
        write_decimal(out, u64::from(gateway.predicted_cached_tokens));
        out.extend_from_slice(b"\r\n");
    }
    match framing {
        DownstreamFraming::Length(n) => write_content_length(out, n),
        DownstreamFraming::Empty if head.status >= 200 && head.status != 204 => {
            write_content_length(out, 0)
        }
        DownstreamFraming::ChunkedPassthrough => {
            out.extend_from_slice(b"transfer-encoding: chunked\r\n")
        }
        DownstreamFraming::Empty | DownstreamFraming::UntilClose => {}
    }
    if connection == Connection::Close {
        out.extend_from_slice(b"connection: close\r\n");
    }
    out.extend_from_slice(b"\r\n");
}

/// Writes a complete response the gateway answers itself.
pub fn write_local_response(
    out: &mut Vec<u8>,
    status: u16,
    content_type: &str,
    body: &[u8],
    connection: Connection,
) {
    write_local_response_with_id(out, status, content_type, body, connection, b"");
}

/// As [`write_local_response`], with the request's `x-request-id: <id>\r\n` line (the data
/// port's answers; empty: none).
pub fn write_local_response_with_id(
    out: &mut Vec<u8>,
    status: u16,
    content_type: &str,
    body: &[u8],
    connection: Connection,
    request_id_line: &[u8],
) {
    out.extend_from_slice(b"HTTP/1.1 ");
    write_status_code(out, status);
    out.push(b' ');
    out.extend_from_slice(reason_phrase(status).as_bytes());
    out.extend_from_slice(b"\r\ncontent-type: ");
    out.extend_from_slice(content_type.as_bytes());
    out.extend_from_slice(b"\r\n");
    super::date::write_date_header(out);
    out.extend_from_slice(request_id_line);
    if status == 401 {
        // RFC 9110 11.6.1: a 401 names its scheme; every credential the gateway checks is a
        // bearer token (`--api-key`, `--admin-api-key`).
        out.extend_from_slice(b"www-authenticate: Bearer\r\n");
    }
    write_content_length(out, body.len() as u64);
    if connection == Connection::Close {
        out.extend_from_slice(b"connection: close\r\n");
    }
    out.extend_from_slice(b"\r\n");
    out.extend_from_slice(body);
}

fn write_status_code(out: &mut Vec<u8>, status: u16) {
    let status = status.clamp(100, 999);
    out.extend_from_slice(&[
        b'0' + (status / 100) as u8,
        b'0' + (status / 10 % 10) as u8,
        b'0' + (status % 10) as u8,
    ]);
}

fn write_content_length(out: &mut Vec<u8>, n: u64) {
    out.extend_from_slice(b"content-length: ");
    write_decimal(out, n);
    out.extend_from_slice(b"\r\n");
}

fn write_decimal(out: &mut Vec<u8>, mut n: u64) {
    let mut digits = [0u8; 20];
    let mut i = digits.len();
    loop {
        i -= 1;
        digits[i] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    out.extend_from_slice(&digits[i..]);
}

/// The reason phrase of a status (RFC 9110 section 15, plus 429 and 431 of RFC 6585 and
/// nginx's 499): every status the gateway answers itself or a worker may send without one.
pub fn reason_phrase(status: u16) -> &'static str {
    match status {
        100 => "Continue",
        101 => "Switching Protocols",
        200 => "OK",
        201 => "Created",
        202 => "Accepted",
        203 => "Non-Authoritative Information",
        204 => "No Content",
        205 => "Reset Content",
        206 => "Partial Content",
        300 => "Multiple Choices",
        301 => "Moved Permanently",
        302 => "Found",
        303 => "See Other",
        304 => "Not Modified",
        307 => "Temporary Redirect",
        308 => "Permanent Redirect",
        400 => "Bad Request",
        401 => "Unauthorized",
        402 => "Payment Required",
        403 => "Forbidden",
        404 => "Not Found",
        405 => "Method Not Allowed",
        406 => "Not Acceptable",
        407 => "Proxy Authentication Required",
        408 => "Request Timeout",
        409 => "Conflict",
        410 => "Gone",
        411 => "Length Required",
        412 => "Precondition Failed",
        413 => "Content Too Large",
        414 => "URI Too Long",
        415 => "Unsupported Media Type",
        416 => "Range Not Satisfiable",
        417 => "Expectation Failed",
        421 => "Misdirected Request",
        422 => "Unprocessable Content",
        426 => "Upgrade Required",
        428 => "Precondition Required",
        429 => "Too Many Requests",
        431 => "Request Header Fields Too Large",
        499 => "Client Closed Request",
        500 => "Internal Server Error",
        501 => "Not Implemented",
        502 => "Bad Gateway",
        503 => "Service Unavailable",
        504 => "Gateway Timeout",
        505 => "HTTP Version Not Supported",
        507 => "Insufficient Storage",
        508 => "Loop Detected",
        // Not in the table: the name of its class (RFC 9110 15).
        _ => match status / 100 {
            1 => "Informational",
            2 => "Successful",
            3 => "Redirection",
            4 => "Client Error",
            _ => "Server Error",
        },
    }
}

/// Why a chunked body could not be decoded.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ChunkError {
    /// Not valid chunked framing.
    Malformed,
    /// A size line or the trailers exceed their limits.
    TooLong,
    /// A chunk size past 15 significant hex digits (2^60 bytes): valid syntax (a chunk size
    /// has no bound in RFC 9112), but larger than any body the gateway accepts.
    SizeTooLarge,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum ChunkState {
    /// Reading hex digits of a chunk size.
    Size,
    /// Skipping a chunk extension up to CR (a bare LF in it is refused: reading it as part of
    /// the extension would take the chunk data for more extension and desynchronize framing).
    Extension,
    /// Expecting LF after a size line.
    SizeLf,
    /// Inside chunk data, with this many bytes left.
    Data(u64),
    /// Expecting CR after chunk data.
    DataCr,
    /// Expecting LF after chunk data.
    DataLf,
    /// At the start of a trailer line (or the final empty line).
    TrailerStart,
    /// Inside a trailer line.
    TrailerLine,
    /// Expecting LF after a trailer line's CR.
    TrailerLf,
    /// Expecting the final LF.
    FinalLf,
    /// The body is complete.
    Done,
}

/// An incremental `Transfer-Encoding: chunked` decoder: feed it bytes as they arrive, in any
/// split; it reports the data bytes and where the body ends.
/// The first chunk size refused (2^60, 16 hex digits): past any body the gateway takes, and
/// small enough that reading one more digit cannot overflow.
const CHUNK_SIZE_LIMIT: u64 = 1 << 60;

#[derive(Clone, Debug)]
pub struct ChunkedDecoder {
    state: ChunkState,
    size: u64,
    size_digits: usize,
    line_bytes: usize,
    trailer_bytes: usize,
}

impl Default for ChunkedDecoder {
    fn default() -> Self {
        Self::new()
    }
}

impl ChunkedDecoder {
    /// A decoder at the start of a body.
    pub fn new() -> Self {
        ChunkedDecoder {
            state: ChunkState::Size,
            size: 0,
            size_digits: 0,
            line_bytes: 0,
            trailer_bytes: 0,
        }
    }

    /// Whether the terminating chunk and trailers have been read.
    pub fn is_done(&self) -> bool {
        self.state == ChunkState::Done
    }

    /// Whether the decoder sits between two chunks (nothing of the next size line read), so a
    /// whole chunk may be written after what was passed through without breaking the framing.
    pub fn at_chunk_boundary(&self) -> bool {
        self.state == ChunkState::Size && self.size_digits == 0
    }

    /// Data bytes announced by the chunk size read so far and not yet passed on: what is left
    /// of the current chunk, or the size on a size line still being read. Added to what was
    /// passed on, a lower bound of the body's size, known before its data arrives.
    pub fn announced_len_pending(&self) -> u64 {
        match self.state {
            ChunkState::Data(left) => left,
            ChunkState::Size | ChunkState::Extension | ChunkState::SizeLf => self.size,
            _ => 0,
        }
    }

    /// Consumes bytes of `input` up to the end of the body, passing chunk data to `on_data`.
    /// Returns how many bytes of `input` belong to the body.
    pub fn feed(
        &mut self,
        input: &[u8],
        mut on_data: impl FnMut(&[u8]),
    ) -> Result<usize, ChunkError> {
        let mut i = 0;
        while i < input.len() && self.state != ChunkState::Done {
            if let ChunkState::Data(left) = self.state {
                let take = self.take_data(left, input.len() - i);
                on_data(&input[i..i + take]);
                i += take;
                continue;
            }
            self.step(input[i])?;
            i += 1;
        }
        Ok(i)
    }

    /// As `feed`, decoding in place so a chunked body needs no second buffer: the chunk data
    /// found in `buf[read..]` is moved down to `write` (`write <= read`; data only ever moves
    /// toward the start, since the framing dropped before it is at least as long as the gap).
    /// Returns the new `(read, write)`: past the body bytes consumed, and past the data kept.
    pub fn decode_in_place(
        &mut self,
        buf: &mut [u8],
        mut read: usize,
        mut write: usize,
    ) -> Result<(usize, usize), ChunkError> {
        debug_assert!(write <= read);
        while read < buf.len() && self.state != ChunkState::Done {
            if let ChunkState::Data(left) = self.state {
                let take = self.take_data(left, buf.len() - read);
                copy::move_down(buf, read..read + take, write);
                read += take;
                write += take;
                continue;
            }
            self.step(buf[read])?;
            read += 1;
        }
        Ok((read, write))
    }

    /// Takes what of `available` bytes belongs to the chunk (`left` of it unread) and moves past
    /// it: to the chunk's CRLF once it is whole.
    fn take_data(&mut self, left: u64, available: usize) -> usize {
        let take = left.min(available as u64) as usize;
        let left = left - take as u64;
        self.state = if left == 0 {
            ChunkState::DataCr
        } else {
            ChunkState::Data(left)
        };
        take
    }

    fn step(&mut self, byte: u8) -> Result<(), ChunkError> {
        use ChunkState::*;
        self.state = match self.state {
            Size | Extension | SizeLf => {
                self.line_bytes += 1;
                if self.line_bytes > CHUNK_LINE_BYTES_MAX {
                    return Err(ChunkError::TooLong);
                }
                self.step_size_line(byte)?
            }
            DataCr if byte == b'\r' => DataLf,
            DataLf if byte == b'\n' => Size,
            TrailerStart | TrailerLine => {
                self.trailer_bytes += 1;
                if self.trailer_bytes > CHUNK_TRAILER_BYTES_MAX {
                    return Err(ChunkError::TooLong);
                }
                match (self.state, byte) {
                    (TrailerStart, b'\r') => FinalLf,
                    (TrailerLine, b'\r') => TrailerLf,
                    // Lines end with CRLF only: a bare LF is where two parsers disagree.
                    (_, b'\n') => return Err(ChunkError::Malformed),
                    _ => TrailerLine,
                }
            }
            TrailerLf if byte == b'\n' => TrailerStart,
            FinalLf if byte == b'\n' => Done,
            _ => return Err(ChunkError::Malformed),
        };
        Ok(())
    }

    fn step_size_line(&mut self, byte: u8) -> Result<ChunkState, ChunkError> {
        use ChunkState::*;
        Ok(match (self.state, byte) {
            (Size, b) if b.is_ascii_hexdigit() => {
                self.size_digits += 1;
                let digit = (b as char).to_digit(16).unwrap_or(0);
                // Below 2^60 before this digit, so no overflow; leading zeros add nothing.
                self.size = self.size * 16 + u64::from(digit);
                if self.size >= CHUNK_SIZE_LIMIT {
                    return Err(ChunkError::SizeTooLarge);
                }
                Size
            }
            (Size, b';' | b' ' | b'\t') if self.size_digits > 0 => Extension,
            (Size | Extension, b'\r') if self.size_digits > 0 => SizeLf,
            (Extension, b'\n') => return Err(ChunkError::Malformed),
            (Extension, _) => Extension,
            (SizeLf, b'\n') => {
                let size = std::mem::take(&mut self.size);
                self.size_digits = 0;
                self.line_bytes = 0;
                if size == 0 {
                    TrailerStart
                } else {
                    Data(size)
                }
            }
            _ => return Err(ChunkError::Malformed),
        })
    }
}

#[cfg(test)]
mod tests;

/// `ChunkedDecoder::decode_in_place` against `feed`, apart from the parser's own tests.
#[cfg(test)]
mod in_place_tests {
    use super::*;

    /// Decodes `wire` (after a 5-byte stand-in head) in place, `step` bytes arriving at a time
    /// as a connection's read buffer receives them; returns the body and what followed it.
    fn decode_arriving(wire: &[u8], step: usize) -> (Vec<u8>, Vec<u8>) {
        let mut decoder = ChunkedDecoder::new();
        let mut buf = b"HEAD:".to_vec();
        let (mut read, mut write) = (buf.len(), buf.len());
        let mut arrived = 0;
        while !decoder.is_done() {
            let end = (arrived + step).min(wire.len());
            buf.extend_from_slice(&wire[arrived..end]);
            arrived = end;
            (read, write) = decoder.decode_in_place(&mut buf, read, write).unwrap();
            // The framing consumed is dropped, as the server does.
            buf.drain(write..read);
            read = write;
        }
        buf.extend_from_slice(&wire[arrived..]);
        assert_eq!(&buf[..5], b"HEAD:");
        (buf[5..write].to_vec(), buf[write..].to_vec())
    }

    #[test]
    fn in_place_decoding_keeps_the_body_and_what_follows() {
        let body: Vec<u8> = (0..20_000u32).map(|i| b'a' + (i % 26) as u8).collect();
        let mut wire = Vec::new();
        for piece in body.chunks(3000).chain(body.chunks(7)) {
            wire.extend_from_slice(format!("{:x};ext=1\r\n", piece.len()).as_bytes());
            wire.extend_from_slice(piece);
            wire.extend_from_slice(b"\r\n");
        }
        wire.extend_from_slice(b"0\r\ntrailer: x\r\n\r\nGET /next HTTP/1.1\r\n\r\n");
        let mut expected = body.clone();
        expected.extend_from_slice(&body);
        for step in [1, 2, 5, 100, 4096, wire.len()] {
            let (decoded, rest) = decode_arriving(&wire, step);
            assert!(decoded == expected, "step {step}");
            assert_eq!(rest, b"GET /next HTTP/1.1\r\n\r\n", "step {step}");
        }
    }

    #[test]
    fn in_place_decoding_refuses_what_feed_refuses() {
        let mut buf = b"zz\r\n".to_vec();
        let mut decoder = ChunkedDecoder::new();
        assert_eq!(
            decoder.decode_in_place(&mut buf, 0, 0),
            Err(ChunkError::Malformed)
        );
    }
}
