//! `MockOrigin`: a scripted upstream worker on loopback for tests that need exact control
//! (slow streams, hangs, resets, odd framing) or exact observation (accepted connections,
//! received heads and bodies, whether a streamed response was cut off). One thread per
//! connection; a `handler` decides each reply from the recorded request.
//!
//! The gateway's control core also talks to workers (`GET /v1/models`, later health and load
//! polls). Those are GETs; the data path only proxies POSTs. So `requests` and
//! `accepted_connections` count only POST traffic, and `all_requests` has everything.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// A request as the origin received it.
#[derive(Clone, Debug)]
pub struct RecordedRequest {
    /// The method.
    pub method: String,
    /// The target (path and query).
    pub path: String,
    /// Headers in order, names lower-cased.
    pub headers: Vec<(String, String)>,
    /// The body (the gateway always sends `Content-Length`).
    pub body: Vec<u8>,
}

impl RecordedRequest {
    /// The first value of header `name`.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }
}

/// How the origin answers one request.
#[derive(Clone, Debug)]
pub enum Reply {
    /// A complete response with `Content-Length`, plus extra header lines (`"name: value"`).
    Full {
        status: u16,
        body: String,
        headers: Vec<String>,
    },
    /// A chunked response: one chunk per element, `gap` apart.
    Chunked { chunks: Vec<String>, gap: Duration },
    /// A body delimited by closing the connection.
    UntilClose { body: String },
    /// Wait, then answer.
    Delay(Duration, Box<Reply>),
    /// Answer, then close the connection although the answer allowed keep-alive (a worker
    /// that drops idle connections: the gateway's pooled socket goes stale).
    ThenClose(Box<Reply>),
    /// Close the connection without answering.
    Close,
    /// Reset the connection (RST) without answering.
    Reset,
    /// Never answer: a hung engine. Reads until the gateway closes the connection (counted by
    /// `hang_ups`) or `TIMEOUT` three times over passes.
    Silent,
}

impl Reply {
    /// `200` with a JSON body.
    pub fn json(body: &str) -> Reply {
        Reply::Full {
            status: 200,
            body: body.to_string(),
            headers: vec!["content-type: application/json".into()],
        }
    }
}

type Handler = dyn Fn(&RecordedRequest) -> Reply + Send + Sync;

#[derive(Default)]
struct OriginState {
    /// Connections that carried at least one POST.
    accepted: AtomicUsize,
    stream_cut_offs: AtomicUsize,
    hang_ups: AtomicUsize,
    requests: Mutex<Vec<RecordedRequest>>,
    stopping: AtomicBool,
}

/// A running scripted origin; stops when dropped.
pub struct MockOrigin {
    addr: SocketAddr,
    state: Arc<OriginState>,
}

impl std::fmt::Debug for MockOrigin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MockOrigin")
            .field("addr", &self.addr)
            .finish()
    }
}

impl MockOrigin {
    /// Starts an origin answering every request with `handler`'s reply.
    pub fn start(handler: impl Fn(&RecordedRequest) -> Reply + Send + Sync + 'static) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind mock origin");
        let addr = listener.local_addr().expect("local addr");
        let state = Arc::new(OriginState::default());
        let handler: Arc<Handler> = Arc::new(handler);
        let accept_state = state.clone();
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                if accept_state.stopping.load(Ordering::Relaxed) {
                    return;
                }
                let Ok(stream) = stream else { continue };
                let (state, handler) = (accept_state.clone(), handler.clone());
                std::thread::spawn(move || serve(stream, &state, &*handler));
            }
        });
        MockOrigin { addr, state }
    }

    /// The URL to give `--worker-urls`.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// TCP connections accepted so far that carried at least one POST (data-path traffic).
    pub fn accepted_connections(&self) -> usize {
        self.state.accepted.load(Ordering::Relaxed)
    }

    /// Chunked replies that could not be written completely (the peer went away).
    pub fn stream_cut_offs(&self) -> usize {
        self.state.stream_cut_offs.load(Ordering::Relaxed)
    }

    /// Connections the gateway closed while a `Reply::Silent` request was unanswered.
    pub fn hang_ups(&self) -> usize {
        self.state.hang_ups.load(Ordering::Relaxed)
    }

    /// POST requests received so far (data-path traffic).
    pub fn requests(&self) -> Vec<RecordedRequest> {
        let all = self.all_requests();
        all.into_iter().filter(|r| r.method == "POST").collect()
    }

    /// Every request received so far, control-plane GETs included.
    pub fn all_requests(&self) -> Vec<RecordedRequest> {
        self.state.requests.lock().expect("requests lock").clone()
    }
}

impl Drop for MockOrigin {
    fn drop(&mut self) {
        self.state.stopping.store(true, Ordering::Relaxed);
        let _ = TcpStream::connect(self.addr);
    }
}

fn serve(mut stream: TcpStream, state: &OriginState, handler: &Handler) {
    let _ = stream.set_read_timeout(Some(super::TIMEOUT));
    let _ = stream.set_nodelay(true);
    let mut buf = Vec::new();
    let mut counted = false;
    while let Some(request) = read_request(&mut stream, &mut buf) {
        if request.method == "POST" && !counted {
            counted = true;
            state.accepted.fetch_add(1, Ordering::Relaxed);
        }
        state
            .requests
            .lock()
            .expect("requests lock")
            .push(request.clone());
        if !reply(&mut stream, state, &handler(&request)) {
            return;
        }
    }
}

fn read_request(stream: &mut TcpStream, buf: &mut Vec<u8>) -> Option<RecordedRequest> {
    loop {
        let mut parsed = [httparse::EMPTY_HEADER; 64];
        let mut request = httparse::Request::new(&mut parsed);
        if let Ok(httparse::Status::Complete(head_len)) = request.parse(buf) {
            let headers: Vec<(String, String)> = request
                .headers
                .iter()
                .map(|h| {
                    (
                        h.name.to_ascii_lowercase(),
                        String::from_utf8_lossy(h.value).into_owned(),
                    )
                })
                .collect();
            let length = headers
                .iter()
                .find(|(n, _)| n == "content-length")
                .and_then(|(_, v)| v.trim().parse::<usize>().ok())
                .unwrap_or(0);
            let (method, path) = (request.method?.to_string(), request.path?.to_string());
            while buf.len() < head_len + length {
                fill(stream, buf)?;
            }
            let body = buf[head_len..head_len + length].to_vec();
            buf.drain(..head_len + length);
            return Some(RecordedRequest {
                method,
                path,
                headers,
                body,
            });
        }
        fill(stream, buf)?;
    }
}

fn fill(stream: &mut TcpStream, buf: &mut Vec<u8>) -> Option<()> {
    let mut chunk = [0u8; 16 * 1024];
    match stream.read(&mut chunk) {
        Ok(0) | Err(_) => None,
        Ok(n) => {
            buf.extend_from_slice(&chunk[..n]);
            Some(())
        }
    }
}

/// Writes one reply; returns whether the connection stays usable.
fn reply(stream: &mut TcpStream, state: &OriginState, reply: &Reply) -> bool {
    match reply {
        Reply::Full {
            status,
            body,
            headers,
        } => {
            let mut head = format!("HTTP/1.1 {status} X\r\ncontent-length: {}\r\n", body.len());
            for line in headers {
                head.push_str(line);
                head.push_str("\r\n");
            }
            head.push_str("\r\n");
            stream.write_all(format!("{head}{body}").as_bytes()).is_ok()
        }
        Reply::Chunked { chunks, gap } => {
            let head = "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n";
            let mut ok = stream.write_all(head.as_bytes()).is_ok();
            for (i, chunk) in chunks.iter().enumerate() {
                if i > 0 {
                    std::thread::sleep(*gap);
                }
                let framed = format!("{:x}\r\n{chunk}\r\n", chunk.len());
                ok = ok && stream.write_all(framed.as_bytes()).is_ok();
            }
            ok = ok && stream.write_all(b"0\r\n\r\n").is_ok();
            if !ok {
                state.stream_cut_offs.fetch_add(1, Ordering::Relaxed);
            }
            ok
        }
        Reply::UntilClose { body } => {
            let _ = stream.write_all(format!("HTTP/1.1 200 OK\r\n\r\n{body}").as_bytes());
            false
        }
        Reply::Delay(wait, then) => {
            std::thread::sleep(*wait);
            self::reply(stream, state, then)
        }
        Reply::ThenClose(first) => {
            self::reply(stream, state, first);
            false
        }
        Reply::Close => false,
        Reply::Reset => {
            let _ = socket2::SockRef::from(&*stream).set_linger(Some(Duration::ZERO));
            false
        }
        Reply::Silent => {
            let mut byte = [0u8; 1024];
            for _ in 0..3 {
                match stream.read(&mut byte) {
                    Ok(0) => {
                        state.hang_ups.fetch_add(1, Ordering::Relaxed);
                        return false;
                    }
                    Ok(_) => {}
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
                    Err(e) if e.kind() == std::io::ErrorKind::TimedOut => {}
                    Err(_) => {
                        state.hang_ups.fetch_add(1, Ordering::Relaxed);
                        return false;
                    }
                }
            }
            false
        }
    }
}
