//! Fixtures for the worker integration tests: `sim-engine` and `kvgate` child processes on free
//! loopback ports (killed on drop), a minimal blocking HTTP/1.1 client, and bounded waiting.

#![allow(dead_code)]

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// Longest any single test HTTP exchange may take.
const HTTP_TIMEOUT: Duration = Duration::from_secs(20);

fn bin_dir() -> PathBuf {
    let kvgate = PathBuf::from(env!("CARGO_BIN_EXE_kvgate"));
    kvgate.parent().map(PathBuf::from).unwrap_or_default()
}

/// A free TCP port (bound then released; the child binds it right after).
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free loopback port")
}

/// `count` consecutive free ports.
fn free_port_run(count: u16) -> u16 {
    for _ in 0..200 {
        let base = free_port();
        if base > 65_000 - count {
            continue;
        }
        let all_free = (0..count).all(|i| TcpListener::bind(("127.0.0.1", base + i)).is_ok());
        if all_free {
            return base;
        }
    }
    panic!("no run of {count} free ports");
}

/// Polls `check` every 50 ms until it holds or `limit` passes.
pub fn wait_until(limit: Duration, mut check: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + limit;
    loop {
        if check() {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// A chat body for `sim-model`.
pub fn chat(text: &str) -> String {
    format!(
        r#"{{"model":"sim-model","max_tokens":4,"messages":[{{"role":"user","content":"{text}"}}]}}"#
    )
}

/// A child process killed on drop.
struct ChildGuard(Child);

impl Drop for ChildGuard {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A `sim-engine` fleet.
pub struct Sim {
    base_port: u16,
    engines: u16,
    _child: ChildGuard,
}

impl Sim {
    /// Start `engines` engines with extra flags; returns once they are ready.
    pub fn start(engines: u16, extra: &[&str]) -> Sim {
        let base_port = free_port_run(engines);
        let mut child = Command::new(bin_dir().join("sim-engine"))
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
            .expect("start sim-engine (build it: cargo build -p bench-harness --bins)");
        let stdout = child.stdout.take().expect("sim stdout");
        let guard = ChildGuard(child);
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if line.contains("ready") {
                    let _ = tx.send(());
                }
            }
        });
        rx.recv_timeout(Duration::from_secs(10))
            .expect("sim-engine ready");
        Sim {
            base_port,
            engines,
            _child: guard,
        }
    }

    /// Port of engine `i`.
    pub fn port(&self, i: u16) -> u16 {
        self.base_port + i
    }

    /// URL of engine `i`.
    pub fn url(&self, i: u16) -> String {
        format!("http://127.0.0.1:{}", self.port(i))
    }

    /// Every engine's URL.
    pub fn urls(&self) -> Vec<String> {
        (0..self.engines).map(|i| self.url(i)).collect()
    }

    /// Replace engine `i`'s faults (`POST /sim/faults`).
    pub fn set_faults(&self, i: u16, json: &str) {
        let r = post(self.port(i), "/sim/faults", json);
        assert_eq!(
            r.status,
            200,
            "sim faults: {}",
            String::from_utf8_lossy(&r.body)
        );
    }
}

/// A `kvgate` process.
pub struct Gateway {
    /// The main port.
    pub port: u16,
    /// The Prometheus port.
    pub metrics_port: u16,
    _child: ChildGuard,
}

impl Gateway {
    /// Start kvgate in front of `urls` (one data core) and wait for `/liveness`.
    pub fn start(urls: &[String], extra: &[&str]) -> Gateway {
        let port = free_port();
        let metrics_port = free_port();
        let child = Command::new(env!("CARGO_BIN_EXE_kvgate"))
            .args(["--host", "127.0.0.1", "--port", &port.to_string()])
            .args([
                "--prometheus-host",
                "127.0.0.1",
                "--prometheus-port",
                &metrics_port.to_string(),
            ])
            .args(["--data-cores", "1", "--log-level", "warn", "--worker-urls"])
            .args(urls)
            .args(extra)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start kvgate");
        let gw = Gateway {
            port,
            metrics_port,
            _child: ChildGuard(child),
        };
        let up = wait_until(Duration::from_secs(10), || {
            try_request(port, "GET", "/liveness", "", None).is_ok_and(|r| r.status == 200)
        });
        assert!(up, "kvgate did not start");
        gw
    }

    /// POST a JSON body.
    pub fn post(&self, path: &str, body: &str) -> Response {
        post(self.port, path, body)
    }

    /// Any request, with an optional bearer token.
    pub fn request(&self, method: &str, path: &str, body: &str, bearer: Option<&str>) -> Response {
        try_request(self.port, method, path, body, bearer)
            .unwrap_or_else(|e| panic!("{method} {path}: {e}"))
    }

    /// The `GET /workers` body.
    pub fn workers_json(&self) -> String {
        String::from_utf8_lossy(&self.request("GET", "/workers", "", None).body).to_string()
    }

    fn worker_field(&self, url: &str, field: &str) -> Option<serde_json::Value> {
        let v: serde_json::Value = serde_json::from_str(&self.workers_json()).ok()?;
        v["workers"]
            .as_array()?
            .iter()
            .find(|w| w["url"] == url)
            .map(|w| w[field].clone())
    }

    /// Whether `/workers` lists `url` as healthy.
    pub fn worker_healthy(&self, url: &str) -> bool {
        self.worker_field(url, "healthy") == Some(serde_json::Value::Bool(true))
    }

    /// The circuit state `/workers` lists for `url`.
    pub fn breaker_state(&self, url: &str) -> String {
        self.worker_field(url, "circuit_breaker")
            .and_then(|v| v.as_str().map(str::to_string))
            .unwrap_or_default()
    }

    /// The Prometheus page.
    pub fn metrics(&self) -> String {
        try_request(self.metrics_port, "GET", "/metrics", "", None)
            .map(|r| String::from_utf8_lossy(&r.body).to_string())
            .unwrap_or_default()
    }

    /// The value of the series `name{labels}` as written.
    pub fn metric_value(&self, series: &str) -> Option<f64> {
        self.metrics()
            .lines()
            .find_map(|l| l.strip_prefix(series)?.trim().parse().ok())
    }

    /// The sum of every series of metric `name`.
    pub fn metric_sum(&self, name: &str) -> f64 {
        self.metrics()
            .lines()
            .filter(|l| l.starts_with(&format!("{name}{{")) || l.starts_with(&format!("{name} ")))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum()
    }
}

/// A response read to the end of its body.
#[derive(Debug)]
pub struct Response {
    /// Status code.
    pub status: u16,
    /// Header lines, lower-cased names.
    pub headers: Vec<(String, String)>,
    /// Decoded body.
    pub body: Vec<u8>,
    /// Whether the body ended properly (length reached or final chunk seen).
    pub complete: bool,
}

impl Response {
    /// The `x-smg-routed-worker-id` header.
    pub fn routed_worker(&self) -> Option<String> {
        self.headers
            .iter()
            .find(|(n, _)| n == "x-smg-routed-worker-id")
            .map(|(_, v)| v.clone())
    }
}

/// POST a JSON body to `port`; panics on transport errors.
pub fn post(port: u16, path: &str, body: &str) -> Response {
    try_request(port, "POST", path, body, None).unwrap_or_else(|e| panic!("POST {path}: {e}"))
}

/// Send a streaming request, read the first bytes of the answer, then hang up.
pub fn post_and_hang_up(port: u16, path: &str, body: &str) {
    let Ok(mut s) = TcpStream::connect(("127.0.0.1", port)) else {
        return;
    };
    let _ = s.set_read_timeout(Some(Duration::from_secs(5)));
    let head = format!(
        "POST {path} HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    let _ = s.write_all(head.as_bytes());
    let mut buf = [0u8; 256];
    let _ = s.read(&mut buf);
}

/// One request on a fresh connection (`Connection: close`).
pub fn try_request(
    port: u16,
    method: &str,
    path: &str,
    body: &str,
    bearer: Option<&str>,
) -> Result<Response, String> {
    let mut s = TcpStream::connect(("127.0.0.1", port)).map_err(|e| e.to_string())?;
    s.set_read_timeout(Some(HTTP_TIMEOUT))
        .map_err(|e| e.to_string())?;
    let auth = bearer
        .map(|k| format!("Authorization: Bearer {k}\r\n"))
        .unwrap_or_default();
    let head = format!(
        "{method} {path} HTTP/1.1\r\nHost: t\r\nConnection: close\r\n{auth}Content-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    s.write_all(head.as_bytes()).map_err(|e| e.to_string())?;
    let mut raw = Vec::new();
    let _ = s.read_to_end(&mut raw);
    parse_response(&raw)
}

fn parse_response(raw: &[u8]) -> Result<Response, String> {
    let end = raw
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .ok_or("no response head")?;
    let head = String::from_utf8_lossy(&raw[..end]).to_string();
    let mut lines = head.split("\r\n");
    let status = lines
        .next()
        .and_then(|l| l.split(' ').nth(1))
        .and_then(|c| c.parse().ok())
        .ok_or("bad status line")?;
    let headers: Vec<(String, String)> = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(n, v)| (n.trim().to_ascii_lowercase(), v.trim().to_string()))
        .collect();
    let rest = &raw[end + 4..];
    let chunked = headers
        .iter()
        .any(|(n, v)| n == "transfer-encoding" && v.contains("chunked"));
    let length = headers
        .iter()
        .find(|(n, _)| n == "content-length")
        .and_then(|(_, v)| v.parse().ok());
    let (body, complete) = if chunked {
        dechunk(rest)
    } else if let Some(n) = length {
        (rest[..rest.len().min(n)].to_vec(), rest.len() >= n)
    } else {
        (rest.to_vec(), true)
    };
    Ok(Response {
        status,
        headers,
        body,
        complete,
    })
}

fn dechunk(mut rest: &[u8]) -> (Vec<u8>, bool) {
    let mut body = Vec::new();
    loop {
        let Some(line_end) = rest.windows(2).position(|w| w == b"\r\n") else {
            return (body, false);
        };
        let size_text = String::from_utf8_lossy(&rest[..line_end]).to_string();
        let Ok(size) = usize::from_str_radix(size_text.split(';').next().unwrap_or("").trim(), 16)
        else {
            return (body, false);
        };
        rest = &rest[line_end + 2..];
        if size == 0 {
            return (body, true);
        }
        if rest.len() < size + 2 {
            body.extend_from_slice(&rest[..rest.len().min(size)]);
            return (body, false);
        }
        body.extend_from_slice(&rest[..size]);
        rest = &rest[size + 2..];
    }
}
