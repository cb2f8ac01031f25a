//! A small blocking HTTP/1.1 `GET` client for the control core's probe threads.
//!
//! Owns [`HttpUrl`] (a validated `http://host:port` worker URL) and [`get`], which fetches one
//! path with a hard deadline over a fresh connection (`Connection: close`), decoding
//! `Content-Length`, chunked and close-delimited bodies up to a caller-given byte cap. Probes run
//! on helper threads owned by the control core, never on a data core, so blocking I/O is fine
//! here; every wait is bounded by the deadline. Errors are typed [`ProbeError`]s; nothing panics.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream, ToSocketAddrs};
use std::time::{Duration, Instant};

/// The most bytes of response head a probe reads. Engine health and load responses have a
/// handful of headers; a head larger than this is not an engine.
pub const PROBE_HEAD_BYTES_MAX: usize = 64 << 10;

/// The most headers a probe response may carry (fixed `httparse` array).
const PROBE_HEADERS_MAX: usize = 64;

/// The longest host name accepted in a worker URL (DNS limit).
const HOST_LEN_MAX: usize = 253;

/// A worker base URL: `http://host:port` with an optional trailing `/`, nothing else.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HttpUrl {
    /// Host name or IP literal (IPv6 without brackets).
    pub host: String,
    /// TCP port.
    pub port: u16,
}

/// Why a URL is not a usable worker URL.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum UrlError {
    /// Only plain `http://` workers are proxied.
    #[error("worker URL must start with http:// (got {0:?})")]
    Scheme(String),
    /// Missing or malformed host.
    #[error("worker URL has no valid host: {0:?}")]
    Host(String),
    /// Missing or malformed port.
    #[error("worker URL needs an explicit port 1-65535: {0:?}")]
    Port(String),
    /// A path, query, user info or fragment was given.
    #[error("worker URL must be http://host:port without a path: {0:?}")]
    Path(String),
}

impl HttpUrl {
    /// Parse and validate `http://host:port`.
    pub fn parse(url: &str) -> Result<HttpUrl, UrlError> {
        let rest = url
            .strip_prefix("http://")
            .ok_or_else(|| UrlError::Scheme(url.to_string()))?;
        let rest = rest.strip_suffix('/').unwrap_or(rest);
        if rest.contains(['/', '?', '#', '@']) || rest.chars().any(|c| c.is_whitespace()) {
            return Err(UrlError::Path(url.to_string()));
        }
        let (host, port) = if let Some(v6) = rest.strip_prefix('[') {
            let (host, after) = v6
                .split_once(']')
                .ok_or_else(|| UrlError::Host(url.to_string()))?;
            let port = after
                .strip_prefix(':')
                .ok_or_else(|| UrlError::Port(url.to_string()))?;
            (host, port)
        } else {
            rest.rsplit_once(':')
                .ok_or_else(|| UrlError::Port(url.to_string()))?
        };
        let host_ok = !host.is_empty()
            && host.len() <= HOST_LEN_MAX
            && host
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | ':' | '_'));
        if !host_ok {
            return Err(UrlError::Host(url.to_string()));
        }
        let port: u16 = port
            .parse()
            .ok()
            .filter(|p| *p != 0)
            .ok_or_else(|| UrlError::Port(url.to_string()))?;
        Ok(HttpUrl {
            host: host.to_string(),
            port,
        })
    }

    fn host_header(&self) -> String {
        if self.host.contains(':') {
            format!("[{}]:{}", self.host, self.port)
        } else {
            format!("{}:{}", self.host, self.port)
        }
    }

    fn socket_addr(&self) -> Result<SocketAddr, ProbeError> {
        (self.host.as_str(), self.port)
            .to_socket_addrs()
            .map_err(|e| ProbeError::Resolve(e.to_string()))?
            .next()
            .ok_or_else(|| ProbeError::Resolve(self.host.clone()))
    }
}

/// A probe's answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProbeResponse {
    /// HTTP status code.
    pub status: u16,
    /// The decoded body.
    pub body: Vec<u8>,
}

/// Why a probe got no usable answer.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ProbeError {
    /// The host did not resolve.
    #[error("cannot resolve worker host: {0}")]
    Resolve(String),
    /// Connection refused or reset, or another socket error.
    #[error("worker connection failed: {0}")]
    Io(String),
    /// The deadline passed.
    #[error("worker did not answer in time")]
    Timeout,
    /// The response is not valid HTTP/1.x or breaks a bound.
    #[error("malformed worker response: {0}")]
    Malformed(&'static str),
    /// The body is larger than the caller's cap.
    #[error("worker response body over {0} bytes")]
    TooLarge(usize),
}

fn io_error(e: std::io::Error) -> ProbeError {
    match e.kind() {
        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut => ProbeError::Timeout,
        _ => ProbeError::Io(e.to_string()),
    }
}

/// A stream whose every read is bounded by one overall deadline.
struct DeadlineStream {
    stream: TcpStream,
    deadline: Instant,
}

impl DeadlineStream {
    fn read_some(&mut self, buf: &mut [u8]) -> Result<usize, ProbeError> {
        let left = self
            .deadline
            .checked_duration_since(Instant::now())
            .filter(|d| !d.is_zero())
            .ok_or(ProbeError::Timeout)?;
        self.stream.set_read_timeout(Some(left)).map_err(io_error)?;
        self.stream.read(buf).map_err(io_error)
    }
}

/// `GET path` on `url` with an overall `timeout`, reading at most `body_bytes_max` of body.
pub fn get(
    url: &HttpUrl,
    path: &str,
    timeout: Duration,
    body_bytes_max: usize,
) -> Result<ProbeResponse, ProbeError> {
    let deadline = Instant::now() + timeout;
    let addr = url.socket_addr()?;
    let stream = TcpStream::connect_timeout(&addr, timeout).map_err(io_error)?;
    stream.set_nodelay(true).map_err(io_error)?;
    stream.set_write_timeout(Some(timeout)).map_err(io_error)?;
    let request = format!(
        "GET {path} HTTP/1.1\r\nHost: {}\r\nAccept: */*\r\nConnection: close\r\nUser-Agent: kvgate\r\n\r\n",
        url.host_header()
    );
    (&stream).write_all(request.as_bytes()).map_err(io_error)?;
    let mut conn = DeadlineStream { stream, deadline };
    let (status, framing, mut buffered) = read_head(&mut conn)?;
    let body = match framing {
        BodyFraming::Length(n) if n > body_bytes_max => {
            return Err(ProbeError::TooLarge(body_bytes_max))
        }
        BodyFraming::Length(n) => read_exact_body(&mut conn, buffered, n)?,
        BodyFraming::Chunked => decode_chunked(&mut conn, &mut buffered, body_bytes_max)?,
        BodyFraming::Close => read_to_close(&mut conn, buffered, body_bytes_max)?,
    };
    Ok(ProbeResponse { status, body })
}

enum BodyFraming {
    Length(usize),
    Chunked,
    Close,
}

/// Read and parse the response head; returns status, framing and any body bytes already read.
fn read_head(conn: &mut DeadlineStream) -> Result<(u16, BodyFraming, Vec<u8>), ProbeError> {
    let mut buf = Vec::with_capacity(4096);
    let mut chunk = [0u8; 4096];
    loop {
        let n = conn.read_some(&mut chunk)?;
        if n == 0 {
            return Err(ProbeError::Malformed(
                "connection closed before the response head",
            ));
        }
        buf.extend_from_slice(&chunk[..n]);
        let mut headers = [httparse::EMPTY_HEADER; PROBE_HEADERS_MAX];
        let mut response = httparse::Response::new(&mut headers);
        match response.parse(&buf) {
            Ok(httparse::Status::Complete(head_len)) => {
                let status = response.code.ok_or(ProbeError::Malformed("no status"))?;
                let framing = framing_of(response.headers)?;
                let rest = buf.split_off(head_len);
                return Ok((status, framing, rest));
            }
            Ok(httparse::Status::Partial) if buf.len() < PROBE_HEAD_BYTES_MAX => {}
            Ok(httparse::Status::Partial) => return Err(ProbeError::Malformed("head too large")),
            Err(_) => return Err(ProbeError::Malformed("invalid response head")),
        }
    }
}

fn framing_of(headers: &[httparse::Header<'_>]) -> Result<BodyFraming, ProbeError> {
    let mut framing = BodyFraming::Close;
    for h in headers {
        if h.name.eq_ignore_ascii_case("transfer-encoding") {
            let chunked = std::str::from_utf8(h.value)
                .map(|v| v.to_ascii_lowercase().contains("chunked"))
                .unwrap_or(false);
            if chunked {
                return Ok(BodyFraming::Chunked);
            }
        } else if h.name.eq_ignore_ascii_case("content-length") {
            let n = std::str::from_utf8(h.value)
                .ok()
                .and_then(|v| v.trim().parse::<usize>().ok())
                .ok_or(ProbeError::Malformed("bad content-length"))?;
            framing = BodyFraming::Length(n);
        }
    }
    Ok(framing)
}

fn read_exact_body(
    conn: &mut DeadlineStream,
    mut body: Vec<u8>,
    len: usize,
) -> Result<Vec<u8>, ProbeError> {
    let mut chunk = [0u8; 8192];
    while body.len() < len {
        let n = conn.read_some(&mut chunk)?;
        if n == 0 {
            return Err(ProbeError::Malformed("body shorter than content-length"));
        }
        body.extend_from_slice(&chunk[..n]);
    }
    body.truncate(len);
    Ok(body)
}

fn read_to_close(
    conn: &mut DeadlineStream,
    mut body: Vec<u8>,
    cap: usize,
) -> Result<Vec<u8>, ProbeError> {
    let mut chunk = [0u8; 8192];
    loop {
        if body.len() > cap {
            return Err(ProbeError::TooLarge(cap));
        }
        let n = conn.read_some(&mut chunk)?;
        if n == 0 {
            return Ok(body);
        }
        body.extend_from_slice(&chunk[..n]);
    }
}

/// Decode a chunked body; `buf` holds bytes already read past the head.
fn decode_chunked(
    conn: &mut DeadlineStream,
    buf: &mut Vec<u8>,
    cap: usize,
) -> Result<Vec<u8>, ProbeError> {
    let mut body = Vec::new();
    let mut pos = 0usize;
    loop {
        let line_end = fill_until_crlf(conn, buf, pos)?;
        let size_text = std::str::from_utf8(&buf[pos..line_end])
            .map_err(|_| ProbeError::Malformed("chunk size"))?;
        let size_hex = size_text.split(';').next().unwrap_or("").trim();
        let size =
            usize::from_str_radix(size_hex, 16).map_err(|_| ProbeError::Malformed("chunk size"))?;
        pos = line_end + 2;
        if size == 0 {
            return Ok(body);
        }
        if body.len() + size > cap {
            return Err(ProbeError::TooLarge(cap));
        }
        fill_to(conn, buf, pos + size + 2)?;
        body.extend_from_slice(&buf[pos..pos + size]);
        if &buf[pos + size..pos + size + 2] != b"\r\n" {
            return Err(ProbeError::Malformed("chunk not followed by CRLF"));
        }
        pos += size + 2;
    }
}

fn fill_until_crlf(
    conn: &mut DeadlineStream,
    buf: &mut Vec<u8>,
    from: usize,
) -> Result<usize, ProbeError> {
    loop {
        if let Some(i) = buf[from.min(buf.len())..]
            .windows(2)
            .position(|w| w == b"\r\n")
        {
            return Ok(from + i);
        }
        if buf.len() - from.min(buf.len()) > PROBE_HEAD_BYTES_MAX {
            return Err(ProbeError::Malformed("chunk size line too long"));
        }
        let len = buf.len();
        fill_to(conn, buf, len + 1)?;
    }
}

fn fill_to(conn: &mut DeadlineStream, buf: &mut Vec<u8>, len: usize) -> Result<(), ProbeError> {
    let mut chunk = [0u8; 8192];
    while buf.len() < len {
        let n = conn.read_some(&mut chunk)?;
        if n == 0 {
            return Err(ProbeError::Malformed("connection closed inside a chunk"));
        }
        buf.extend_from_slice(&chunk[..n]);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::TcpListener;

    /// Serve one canned response (split in two writes) on a fresh port; returns the URL.
    fn serve_once(parts: Vec<Vec<u8>>, delay: Duration) -> HttpUrl {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        std::thread::spawn(move || {
            if let Ok((mut s, _)) = listener.accept() {
                let mut req = [0u8; 1024];
                let _ = s.read(&mut req);
                for p in parts {
                    std::thread::sleep(delay);
                    let _ = s.write_all(&p);
                }
            }
        });
        HttpUrl {
            host: "127.0.0.1".into(),
            port,
        }
    }

    const SECOND: Duration = Duration::from_secs(1);

    #[test]
    fn url_validation() {
        assert_eq!(
            HttpUrl::parse("http://127.0.0.1:8000").unwrap(),
            HttpUrl {
                host: "127.0.0.1".into(),
                port: 8000
            }
        );
        assert_eq!(
            HttpUrl::parse("http://worker-1.local:30001/").unwrap().port,
            30001
        );
        assert_eq!(HttpUrl::parse("http://[::1]:9").unwrap().host, "::1");
        assert!(matches!(
            HttpUrl::parse("https://a:1"),
            Err(UrlError::Scheme(_))
        ));
        assert!(matches!(HttpUrl::parse("a:1"), Err(UrlError::Scheme(_))));
        assert!(matches!(HttpUrl::parse("http://a"), Err(UrlError::Port(_))));
        assert!(matches!(
            HttpUrl::parse("http://a:0"),
            Err(UrlError::Port(_))
        ));
        assert!(matches!(
            HttpUrl::parse("http://a:70000"),
            Err(UrlError::Port(_))
        ));
        assert!(matches!(
            HttpUrl::parse("http://:80"),
            Err(UrlError::Host(_))
        ));
        assert!(matches!(
            HttpUrl::parse("http://a:80/v1"),
            Err(UrlError::Path(_))
        ));
        assert!(matches!(
            HttpUrl::parse("http://u@a:80"),
            Err(UrlError::Path(_))
        ));
        assert!(matches!(
            HttpUrl::parse("http://a b:80"),
            Err(UrlError::Path(_))
        ));
        assert!(matches!(
            HttpUrl::parse("http://a%b:80"),
            Err(UrlError::Host(_))
        ));
    }

    #[test]
    fn content_length_body_split_across_reads() {
        let url = serve_once(
            vec![
                b"HTTP/1.1 200 OK\r\nContent-Length: 11\r\n\r\nhello".to_vec(),
                b" world".to_vec(),
            ],
            Duration::from_millis(5),
        );
        let r = get(&url, "/health", SECOND, 1024).unwrap();
        assert_eq!(r.status, 200);
        assert_eq!(r.body, b"hello world");
    }

    #[test]
    fn chunked_body_is_decoded() {
        let url = serve_once(
            vec![
                b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhel".to_vec(),
                b"lo\r\n6;ext=1\r\n world\r\n0\r\n\r\n".to_vec(),
            ],
            Duration::from_millis(5),
        );
        let r = get(&url, "/v1/loads", SECOND, 1024).unwrap();
        assert_eq!(r.body, b"hello world");
    }

    #[test]
    fn close_delimited_body_and_error_status() {
        let url = serve_once(
            vec![b"HTTP/1.1 503 Busy\r\n\r\ndown".to_vec()],
            Duration::ZERO,
        );
        let r = get(&url, "/health", SECOND, 1024).unwrap();
        assert_eq!((r.status, r.body.as_slice()), (503, &b"down"[..]));
    }

    #[test]
    fn body_cap_is_enforced() {
        let url = serve_once(
            vec![b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n".to_vec()],
            Duration::ZERO,
        );
        assert_eq!(get(&url, "/", SECOND, 10), Err(ProbeError::TooLarge(10)));
    }

    #[test]
    fn garbage_and_truncation_are_malformed() {
        let url = serve_once(vec![b"SSH-2.0-OpenSSH\r\n\r\n".to_vec()], Duration::ZERO);
        assert!(matches!(
            get(&url, "/", SECOND, 10),
            Err(ProbeError::Malformed(_))
        ));
        let url = serve_once(
            vec![b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nabc".to_vec()],
            Duration::ZERO,
        );
        assert!(matches!(
            get(&url, "/", SECOND, 100),
            Err(ProbeError::Malformed(_))
        ));
    }

    #[test]
    fn hanging_worker_times_out_by_the_deadline() {
        let url = serve_once(
            vec![b"HTTP/1.1 200 OK\r\n".to_vec()],
            Duration::from_secs(3),
        );
        let started = Instant::now();
        assert_eq!(
            get(&url, "/", Duration::from_millis(200), 10),
            Err(ProbeError::Timeout)
        );
        assert!(started.elapsed() < Duration::from_secs(2));
    }

    #[test]
    fn refused_connection_is_an_io_error() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        drop(listener);
        let url = HttpUrl {
            host: "127.0.0.1".into(),
            port,
        };
        assert!(matches!(get(&url, "/", SECOND, 10), Err(ProbeError::Io(_))));
    }
}
