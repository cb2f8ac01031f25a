//! Test fixtures for `sim-engine` integration tests: [`SimFleet`] starts the real binary on free
//! loopback ports and kills it on drop; [`request`] and [`stream`] are a minimal blocking
//! HTTP/1.1 client with timeouts (chunked decoding, arrival time of every SSE line).

#![allow(dead_code)]

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// Every socket read or write of the test client gives up after this long.
pub const IO_TIMEOUT: Duration = Duration::from_secs(10);

/// Start attempts before giving up on finding free ports.
const START_ATTEMPTS: usize = 20;

/// A running `sim-engine` process.
pub struct SimFleet {
    child: Child,
    pub base_port: u16,
}

impl SimFleet {
    /// Starts `sim-engine --engines <engines> --base-port <free> <extra...>`.
    pub fn start(engines: u16, extra: &[&str]) -> SimFleet {
        for _ in 0..START_ATTEMPTS {
            let base_port = fastrand::u16(20_000..60_000);
            if let Some(fleet) = Self::try_start(engines, base_port, extra) {
                return fleet;
            }
        }
        panic!("sim-engine did not start after {START_ATTEMPTS} attempts");
    }

    fn try_start(engines: u16, base_port: u16, extra: &[&str]) -> Option<SimFleet> {
        let mut child = Command::new(env!("CARGO_BIN_EXE_sim-engine"))
            .args([
                "--engines",
                &engines.to_string(),
                "--base-port",
                &base_port.to_string(),
            ])
            .args(extra)
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn sim-engine");
        let stdout = child.stdout.take().expect("piped stdout");
        let (ready_sender, ready) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if line == "sim-engine: ready" {
                    let _ = ready_sender.send(());
                }
            }
        });
        let fleet = SimFleet { child, base_port };
        match ready.recv_timeout(Duration::from_secs(10)) {
            Ok(()) => Some(fleet),
            Err(_) => None, // bind failed (port taken) or too slow: dropped, killed, retried
        }
    }

    /// Process id (for CPU accounting in benchmarks).
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Port of engine `index`.
    pub fn port(&self, index: u16) -> u16 {
        self.base_port + index
    }
}

impl Drop for SimFleet {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A whole response.
#[derive(Debug)]
pub struct HttpResponse {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl HttpResponse {
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body)
            .unwrap_or_else(|error| panic!("{error}: {}", String::from_utf8_lossy(&self.body)))
    }

    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }

    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(key, _)| key.eq_ignore_ascii_case(name))
            .map(|(_, value)| value.as_str())
    }
}

/// One SSE line (`data: ...` or `event: ...`) and when it arrived.
#[derive(Debug, Clone)]
pub struct SseLine {
    pub at: Instant,
    pub line: String,
}

/// A streamed response: status, lines, and whether the body ended cleanly.
#[derive(Debug)]
pub struct Streamed {
    pub status: u16,
    pub lines: Vec<SseLine>,
    /// The terminating zero-length chunk arrived.
    pub complete: bool,
}

impl Streamed {
    pub fn data(&self) -> Vec<&str> {
        self.lines
            .iter()
            .filter_map(|l| l.line.strip_prefix("data: "))
            .collect()
    }
}

pub fn connect(port: u16) -> TcpStream {
    let stream = TcpStream::connect(("127.0.0.1", port)).expect("connect to sim-engine");
    stream
        .set_read_timeout(Some(IO_TIMEOUT))
        .expect("read timeout");
    stream
        .set_write_timeout(Some(IO_TIMEOUT))
        .expect("write timeout");
    stream
}

fn write_request(
    stream: &mut TcpStream,
    method: &str,
    path: &str,
    body: Option<&str>,
    close: bool,
) {
    let body = body.unwrap_or("");
    let connection = if close { "close" } else { "keep-alive" };
    let head = format!(
        "{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\nConnection: {connection}\r\n\r\n",
        body.len()
    );
    stream.write_all(head.as_bytes()).expect("write head");
    stream.write_all(body.as_bytes()).expect("write body");
}

/// Sends one request on a new connection and reads the whole response.
pub fn request(port: u16, method: &str, path: &str, body: Option<&str>) -> HttpResponse {
    let mut stream = connect(port);
    write_request(&mut stream, method, path, body, true);
    read_response(&mut BufReader::new(stream)).expect("read response")
}

/// Sends one request on an existing keep-alive connection and reads its response.
pub fn request_on(
    reader: &mut BufReader<TcpStream>,
    method: &str,
    path: &str,
    body: Option<&str>,
) -> HttpResponse {
    write_request(reader.get_mut(), method, path, body, false);
    read_response(reader).expect("read response")
}

fn read_head(reader: &mut BufReader<TcpStream>) -> std::io::Result<(u16, Vec<(String, String)>)> {
    let mut status_line = String::new();
    reader.read_line(&mut status_line)?;
    let status = status_line
        .split_whitespace()
        .nth(1)
        .and_then(|code| code.parse().ok())
        .ok_or_else(|| std::io::Error::other(format!("bad status line {status_line:?}")))?;
    let mut headers = Vec::new();
    loop {
        let mut line = String::new();
        if reader.read_line(&mut line)? == 0 {
            return Err(std::io::Error::other("EOF in headers"));
        }
        let line = line.trim_end();
        if line.is_empty() {
            return Ok((status, headers));
        }
        if let Some((key, value)) = line.split_once(':') {
            headers.push((key.trim().to_string(), value.trim().to_string()));
        }
    }
}

fn is_chunked(headers: &[(String, String)]) -> bool {
    headers
        .iter()
        .any(|(k, v)| k.eq_ignore_ascii_case("transfer-encoding") && v.contains("chunked"))
}

/// Reads one chunk; `Ok(None)` for the terminating chunk.
fn read_chunk(reader: &mut BufReader<TcpStream>) -> std::io::Result<Option<Vec<u8>>> {
    let mut size_line = String::new();
    if reader.read_line(&mut size_line)? == 0 {
        return Err(std::io::Error::other("EOF before chunk"));
    }
    let size = usize::from_str_radix(size_line.trim(), 16).map_err(std::io::Error::other)?;
    let mut data = vec![0; size + 2];
    reader.read_exact(&mut data)?;
    data.truncate(size);
    Ok((size > 0).then_some(data))
}

pub fn read_response(reader: &mut BufReader<TcpStream>) -> std::io::Result<HttpResponse> {
    let (status, headers) = read_head(reader)?;
    let mut body = Vec::new();
    if is_chunked(&headers) {
        while let Some(chunk) = read_chunk(reader)? {
            body.extend_from_slice(&chunk);
        }
    } else if let Some((_, length)) = headers
        .iter()
        .find(|(k, _)| k.eq_ignore_ascii_case("content-length"))
    {
        let length: usize = length.parse().map_err(std::io::Error::other)?;
        body.resize(length, 0);
        reader.read_exact(&mut body)?;
    } else {
        reader.read_to_end(&mut body)?;
    }
    Ok(HttpResponse {
        status,
        headers,
        body,
    })
}

/// POSTs a streaming request and records every SSE line as it arrives.
pub fn stream(port: u16, path: &str, body: &str) -> Streamed {
    let mut stream = connect(port);
    write_request(&mut stream, "POST", path, Some(body), true);
    let mut reader = BufReader::new(stream);
    let (status, headers) = read_head(&mut reader).expect("read stream head");
    let mut lines = Vec::new();
    let mut complete = false;
    if !is_chunked(&headers) {
        return Streamed {
            status,
            lines,
            complete,
        };
    }
    let mut pending = String::new();
    loop {
        match read_chunk(&mut reader) {
            Ok(Some(chunk)) => {
                let at = Instant::now();
                pending.push_str(&String::from_utf8_lossy(&chunk));
                while let Some(end) = pending.find('\n') {
                    let line: String = pending.drain(..=end).collect();
                    let line = line.trim_end().to_string();
                    if !line.is_empty() {
                        lines.push(SseLine { at, line });
                    }
                }
            }
            Ok(None) => {
                complete = true;
                break;
            }
            Err(_) => break,
        }
    }
    Streamed {
        status,
        lines,
        complete,
    }
}

/// Polls `probe` every 10 ms until it returns true or `limit` passes.
pub fn wait_until(limit: Duration, mut probe: impl FnMut() -> bool) -> bool {
    let start = Instant::now();
    while start.elapsed() < limit {
        if probe() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    false
}

/// A text prompt of `count` distinct words starting at word `first`.
pub fn words(first: u64, count: u64) -> String {
    (first..first + count)
        .map(bench_harness::tokenize::synthetic_word)
        .collect::<Vec<_>>()
        .join(" ")
}
