//! A tiny blocking HTTP/1.1 client for tests: one keep-alive connection, every read bounded by
//! `TIMEOUT`, `Content-Length`, chunked and close-delimited responses, and the arrival time of
//! every body chunk (so a test can tell streamed bodies from buffered ones).

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use super::TIMEOUT;

/// A complete response.
#[derive(Debug)]
pub struct Response {
    /// The status code.
    pub status: u16,
    /// Headers in order, names lower-cased.
    pub headers: Vec<(String, String)>,
    /// The body (de-chunked).
    pub body: Vec<u8>,
    /// When each body chunk (chunked) or read (otherwise) arrived.
    pub chunk_times: Vec<Instant>,
}

impl Response {
    /// The first value of header `name` (case-insensitive).
    pub fn header(&self, name: &str) -> Option<&str> {
        let name = name.to_ascii_lowercase();
        self.headers
            .iter()
            .find(|(n, _)| *n == name)
            .map(|(_, v)| v.as_str())
    }

    /// The body as text.
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }

    /// The body as JSON (panics with the body text if it is not JSON).
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body)
            .unwrap_or_else(|e| panic!("body is not JSON ({e}): {}", self.text()))
    }

    /// The `x-smg-routed-worker-id` header.
    pub fn routed_worker(&self) -> Option<&str> {
        self.header("x-smg-routed-worker-id")
    }
}

/// One client connection.
#[derive(Debug)]
pub struct HttpClient {
    stream: TcpStream,
    buf: Vec<u8>,
}

impl HttpClient {
    /// Connects to `addr`.
    pub fn connect(addr: SocketAddr) -> Self {
        let stream = TcpStream::connect_timeout(&addr, TIMEOUT).expect("connect");
        stream
            .set_read_timeout(Some(TIMEOUT))
            .expect("read timeout");
        stream
            .set_write_timeout(Some(TIMEOUT))
            .expect("write timeout");
        stream.set_nodelay(true).expect("nodelay");
        HttpClient {
            stream,
            buf: Vec::new(),
        }
    }

    /// Writes raw bytes.
    pub fn send_raw(&mut self, bytes: &[u8]) {
        self.stream.write_all(bytes).expect("write request");
    }

    /// Sends a request with a `Content-Length` body and reads the response.
    pub fn request(
        &mut self,
        method: &str,
        path: &str,
        headers: &[(&str, &str)],
        body: &[u8],
    ) -> Response {
        let mut head = format!("{method} {path} HTTP/1.1\r\nhost: test\r\n");
        for (name, value) in headers {
            head.push_str(&format!("{name}: {value}\r\n"));
        }
        if method != "GET" || !body.is_empty() {
            head.push_str(&format!("content-length: {}\r\n", body.len()));
        }
        head.push_str("\r\n");
        let mut bytes = head.into_bytes();
        bytes.extend_from_slice(body);
        self.send_raw(&bytes);
        self.read_response()
    }

    /// `POST path` with a JSON body.
    pub fn post_json(&mut self, path: &str, body: &str) -> Response {
        self.request(
            "POST",
            path,
            &[("content-type", "application/json")],
            body.as_bytes(),
        )
    }

    /// `GET path`.
    pub fn get(&mut self, path: &str) -> Response {
        self.request("GET", path, &[], b"")
    }

    /// Reads more bytes; returns 0 at end of stream.
    fn fill(&mut self) -> usize {
        let mut chunk = [0u8; 16 * 1024];
        let n = self
            .stream
            .read(&mut chunk)
            .expect("read response (timed out?)");
        self.buf.extend_from_slice(&chunk[..n]);
        n
    }

    /// Reads one response (a `100 Continue` is returned like any other response).
    pub fn read_response(&mut self) -> Response {
        let (status, headers, head_len) = loop {
            let mut parsed = [httparse::EMPTY_HEADER; 64];
            let mut response = httparse::Response::new(&mut parsed);
            if let httparse::Status::Complete(n) =
                response.parse(&self.buf).expect("valid response")
            {
                let headers = response
                    .headers
                    .iter()
                    .map(|h| {
                        (
                            h.name.to_ascii_lowercase(),
                            String::from_utf8_lossy(h.value).into_owned(),
                        )
                    })
                    .collect::<Vec<_>>();
                break (response.code.unwrap_or(0), headers, n);
            }
            assert!(self.fill() > 0, "connection closed before a response head");
        };
        self.buf.drain(..head_len);
        let find = |name: &str| {
            headers
                .iter()
                .find(|(n, _)| n == name)
                .map(|(_, v)| v.clone())
        };
        let mut response = Response {
            status,
            headers: headers.clone(),
            body: Vec::new(),
            chunk_times: Vec::new(),
        };
        if status < 200 || status == 204 {
            return response;
        }
        if find("transfer-encoding").is_some_and(|v| v.contains("chunked")) {
            self.read_chunked(&mut response);
        } else if let Some(length) = find("content-length") {
            let length: usize = length.trim().parse().expect("numeric content-length");
            while self.buf.len() < length {
                assert!(self.fill() > 0, "connection closed inside a body");
                response.chunk_times.push(Instant::now());
            }
            response.body = self.buf.drain(..length).collect();
        } else {
            while self.fill() > 0 {
                response.chunk_times.push(Instant::now());
            }
            response.body = std::mem::take(&mut self.buf);
        }
        response
    }

    fn read_line(&mut self) -> String {
        loop {
            if let Some(end) = self.buf.windows(2).position(|w| w == b"\r\n") {
                let line = String::from_utf8_lossy(&self.buf[..end]).into_owned();
                self.buf.drain(..end + 2);
                return line;
            }
            assert!(self.fill() > 0, "connection closed inside a chunked body");
        }
    }

    fn read_chunked(&mut self, response: &mut Response) {
        loop {
            let line = self.read_line();
            let size_hex = line.split(';').next().unwrap_or("").trim();
            let size = usize::from_str_radix(size_hex, 16).expect("hex chunk size");
            if size == 0 {
                while !self.read_line().is_empty() {}
                return;
            }
            while self.buf.len() < size + 2 {
                assert!(self.fill() > 0, "connection closed inside a chunk");
            }
            response.body.extend(self.buf.drain(..size));
            self.buf.drain(..2);
            response.chunk_times.push(Instant::now());
        }
    }

    /// Reads the first chunk of a chunked response and returns the head's status; the rest
    /// is left unread (for client-disconnect tests).
    pub fn read_head_and_first_chunk(&mut self) -> u16 {
        self.read_until(|buf| buf.windows(4).any(|w| w == b"\r\n\r\n") && buf.len() >= 40)
    }

    /// Reads until `needle` (e.g. `b"data:"`, the first SSE event) arrived after the head;
    /// returns the head's status and leaves the rest unread.
    pub fn read_until_body_contains(&mut self, needle: &[u8]) -> u16 {
        self.read_until(|buf| {
            let head_end = buf.windows(4).position(|w| w == b"\r\n\r\n");
            head_end.is_some_and(|end| buf[end..].windows(needle.len()).any(|w| w == needle))
        })
    }

    /// Reads until `done(buffer)`; returns the status of the head at the buffer's start.
    fn read_until(&mut self, done: impl Fn(&[u8]) -> bool) -> u16 {
        let started = Instant::now();
        while !done(&self.buf) {
            assert!(
                started.elapsed() < TIMEOUT,
                "response incomplete after {TIMEOUT:?}"
            );
            assert!(self.fill() > 0, "connection closed early");
        }
        let text = String::from_utf8_lossy(&self.buf);
        text.split(' ')
            .nth(1)
            .and_then(|s| s.parse().ok())
            .unwrap_or(0)
    }

    /// Whether the server closed the connection (waits up to `wait` for the close).
    pub fn is_closed_by_peer(&mut self, wait: Duration) -> bool {
        self.stream
            .set_read_timeout(Some(wait))
            .expect("read timeout");
        let mut byte = [0u8; 1];
        let closed = match self.stream.read(&mut byte) {
            Ok(0) => true,
            Ok(_) => false,
            Err(e) => !matches!(
                e.kind(),
                std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
            ),
        };
        self.stream
            .set_read_timeout(Some(TIMEOUT))
            .expect("read timeout");
        closed
    }

    /// Closes the connection now.
    pub fn close(self) {
        let _ = self.stream.shutdown(std::net::Shutdown::Both);
    }
}
