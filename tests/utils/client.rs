//! A tiny blocking HTTP/1.1 client for tests: one keep-alive connection, every read bounded by
//! `TIMEOUT`, `Content-Length`, chunked and close-delimited responses, and the arrival time of
//! every body chunk (so a test can tell streamed bodies from buffered ones, down to each SSE
//! line). `read_response` fails the test when a body is cut short; `read_response_even_if_cut`
//! returns what came, for tests of cut streams and truncated bodies.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use super::TIMEOUT;

/// The content-type header of a JSON request.
pub const JSON: (&str, &str) = ("content-type", "application/json");

/// A response, read to the end of its body (or to where the peer cut it).
#[derive(Debug)]
pub struct Response {
    /// The status code.
    pub status: u16,
    /// Headers in order, names lower-cased.
    pub headers: Vec<(String, String)>,
    /// The body (de-chunked; a cut chunked body keeps only its whole chunks).
    pub body: Vec<u8>,
    /// When each body chunk (chunked) or read (otherwise) arrived.
    pub chunk_times: Vec<Instant>,
    /// The body's length once each of those chunks or reads had arrived (one per chunk time).
    chunk_ends: Vec<usize>,
    /// Whether the body ended where its framing says: the last chunk, all of `Content-Length`,
    /// or the close of a close-delimited body. Only `read_response_even_if_cut` returns `false`.
    pub complete: bool,
}

/// One non-empty line of a streamed (SSE) body and when the chunk completing it arrived.
#[derive(Clone, Debug)]
pub struct SseLine<'a> {
    /// When the line's last byte arrived.
    pub at: Instant,
    /// The line, without its line break (`data: …`, `event: …`).
    pub line: &'a str,
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

    /// Notes that the body reached `body_len` bytes now.
    fn arrived(&mut self, body_len: usize) {
        self.chunk_times.push(Instant::now());
        self.chunk_ends.push(body_len);
    }

    /// The complete, non-empty lines of a chunked body, each with the arrival time of the chunk
    /// that completed it. Only a chunked body was streamed: any other body has no lines, so a
    /// stream that came buffered fails the tests that count its events.
    pub fn sse_lines(&self) -> Vec<SseLine<'_>> {
        if !self
            .header("transfer-encoding")
            .is_some_and(|v| v.contains("chunked"))
        {
            return Vec::new();
        }
        let text = std::str::from_utf8(&self.body)
            .unwrap_or_else(|e| panic!("SSE body is not UTF-8 ({e}): {}", self.text()));
        let mut lines = Vec::new();
        let mut end = 0;
        for piece in text.split_inclusive('\n') {
            end += piece.len();
            let line = piece.trim_end();
            // A last piece without its line break has not fully arrived.
            if !piece.ends_with('\n') || line.is_empty() {
                continue;
            }
            // The last chunk ends at the body's end, so some chunk ends at or after `end`.
            let chunk = self
                .chunk_ends
                .partition_point(|&chunk_end| chunk_end < end);
            lines.push(SseLine {
                at: self.chunk_times[chunk],
                line,
            });
        }
        lines
    }

    /// The payloads of the `data: ` lines of a chunked body, in order.
    pub fn sse_data(&self) -> Vec<&str> {
        self.sse_lines()
            .into_iter()
            .filter_map(|l| l.line.strip_prefix("data: "))
            .collect()
    }
}

/// What the peer did while a client waited for it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PeerActivity {
    /// Bytes arrived (kept for the next read).
    Sent,
    /// The connection closed or was reset.
    Closed,
    /// Nothing happened.
    Silent,
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
        let stream = TcpStream::connect_timeout(&addr, TIMEOUT)
            .unwrap_or_else(|e| panic!("connect to {addr}: {e}"));
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

    /// Sends a request with a `Content-Length` body without reading the response.
    pub fn send_request(
        &mut self,
        method: &str,
        path: &str,
        headers: &[(&str, &str)],
        body: &[u8],
    ) {
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
    }

    /// Sends a request with a `Content-Length` body and reads the response.
    pub fn request(
        &mut self,
        method: &str,
        path: &str,
        headers: &[(&str, &str)],
        body: &[u8],
    ) -> Response {
        self.send_request(method, path, headers, body);
        self.read_response()
    }

    /// `POST path` with a JSON body.
    pub fn post_json(&mut self, path: &str, body: &str) -> Response {
        self.request("POST", path, &[JSON], body.as_bytes())
    }

    /// `POST path` with a JSON body; the response may be cut short (see `complete`).
    pub fn post_json_even_if_cut(&mut self, path: &str, body: &str) -> Response {
        self.send_request("POST", path, &[JSON], body.as_bytes());
        self.read_response_even_if_cut()
    }

    /// `GET path`.
    pub fn get(&mut self, path: &str) -> Response {
        self.request("GET", path, &[], b"")
    }

    /// Reads more bytes into the buffer; `Ok(0)` at end of stream.
    fn read_more(&mut self) -> std::io::Result<usize> {
        let mut chunk = [0u8; 16 * 1024];
        let n = self.stream.read(&mut chunk)?;
        self.buf.extend_from_slice(&chunk[..n]);
        Ok(n)
    }

    /// Reads more bytes; `Err` says why none came (closed, reset, silent past the timeout).
    fn fill(&mut self) -> Result<(), String> {
        match self.read_more() {
            Ok(0) => Err("the connection closed".to_string()),
            Ok(_) => Ok(()),
            Err(e) => Err(format!("the read failed ({e}; timeout {TIMEOUT:?})")),
        }
    }

    /// Reads one response (a `100 Continue` is returned like any other response); fails the
    /// test if its body is cut short.
    pub fn read_response(&mut self) -> Response {
        let (response, cut) = self.read_any_response();
        if let Some(why) = cut {
            panic!(
                "{why} inside the body of a {} response ({} bytes in)",
                response.status,
                response.body.len()
            );
        }
        response
    }

    /// Reads one response like `read_response`, but a body cut short (the peer closed or reset
    /// the connection, or sent nothing for `TIMEOUT`) is returned as far as it came, with
    /// `complete == false`.
    pub fn read_response_even_if_cut(&mut self) -> Response {
        self.read_any_response().0
    }

    /// Reads one response; the second value says why its body was cut short, if it was.
    fn read_any_response(&mut self) -> (Response, Option<String>) {
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
            if let Err(why) = self.fill() {
                panic!("{why} before a response head");
            }
        };
        self.buf.drain(..head_len);
        let mut response = Response {
            status,
            headers,
            body: Vec::new(),
            chunk_times: Vec::new(),
            chunk_ends: Vec::new(),
            complete: true,
        };
        if status < 200 || status == 204 {
            return (response, None);
        }
        let cut = if response
            .header("transfer-encoding")
            .is_some_and(|v| v.contains("chunked"))
        {
            self.read_chunked(&mut response).err()
        } else if let Some(length) = response.header("content-length") {
            let length: usize = length.trim().parse().expect("numeric content-length");
            self.read_sized(&mut response, length).err()
        } else {
            self.read_to_close(&mut response).err()
        };
        response.complete = cut.is_none();
        (response, cut)
    }

    /// Reads a `Content-Length` body; on a cut, keeps what came.
    fn read_sized(&mut self, response: &mut Response, length: usize) -> Result<(), String> {
        while self.buf.len() < length {
            if let Err(why) = self.fill() {
                response.body = std::mem::take(&mut self.buf);
                return Err(why);
            }
            response.arrived(self.buf.len().min(length));
        }
        response.body = self.buf.drain(..length).collect();
        Ok(())
    }

    /// Reads a body that ends when the connection closes; a failed read is a cut.
    fn read_to_close(&mut self, response: &mut Response) -> Result<(), String> {
        let result = loop {
            match self.read_more() {
                Ok(0) => break Ok(()),
                Ok(_) => response.arrived(self.buf.len()),
                Err(e) => break Err(format!("the read failed ({e}; timeout {TIMEOUT:?})")),
            }
        };
        response.body = std::mem::take(&mut self.buf);
        result
    }

    fn read_line(&mut self) -> Result<String, String> {
        loop {
            if let Some(end) = self.buf.windows(2).position(|w| w == b"\r\n") {
                let line = String::from_utf8_lossy(&self.buf[..end]).into_owned();
                self.buf.drain(..end + 2);
                return Ok(line);
            }
            self.fill()?;
        }
    }

    /// Reads a chunked body; on a cut, keeps the chunks that arrived whole.
    fn read_chunked(&mut self, response: &mut Response) -> Result<(), String> {
        loop {
            let line = self.read_line()?;
            let size_hex = line.split(';').next().unwrap_or("").trim();
            let size = usize::from_str_radix(size_hex, 16)
                .unwrap_or_else(|e| panic!("chunk size {line:?} is not hex: {e}"));
            if size == 0 {
                while !self.read_line()?.is_empty() {}
                return Ok(());
            }
            while self.buf.len() < size + 2 {
                self.fill()?;
            }
            response.body.extend(self.buf.drain(..size));
            self.buf.drain(..2);
            let body_len = response.body.len();
            response.arrived(body_len);
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
            if let Err(why) = self.fill() {
                panic!("{why} early");
            }
        }
        let text = String::from_utf8_lossy(&self.buf);
        text.split(' ')
            .nth(1)
            .and_then(|s| s.parse().ok())
            .unwrap_or(0)
    }

    /// Waits up to `wait` for the peer to send something or close the connection.
    pub fn wait_for_peer(&mut self, wait: Duration) -> PeerActivity {
        self.stream
            .set_read_timeout(Some(wait))
            .expect("read timeout");
        let activity = match self.read_more() {
            Ok(0) => PeerActivity::Closed,
            Ok(_) => PeerActivity::Sent,
            Err(e) => match e.kind() {
                std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut => {
                    PeerActivity::Silent
                }
                _ => PeerActivity::Closed,
            },
        };
        self.stream
            .set_read_timeout(Some(TIMEOUT))
            .expect("read timeout");
        activity
    }

    /// Whether the server closed the connection (waits up to `wait` for the close).
    pub fn is_closed_by_peer(&mut self, wait: Duration) -> bool {
        self.wait_for_peer(wait) == PeerActivity::Closed
    }

    /// Closes the connection now.
    pub fn close(self) {
        let _ = self.stream.shutdown(std::net::Shutdown::Both);
    }
}
