//! TLS end to end, with certificates made at test time (`rcgen`: a CA, and certificates it signs
//! for `localhost` and `127.0.0.1`): a real TLS client (rustls) through kvgate's
//! `--tls-cert-path` to a plain worker, plain and streamed (SSE); kvgate to an `https://`
//! worker checked against `--ca-cert-paths` (a small rustls server here), its probes included;
//! a client certificate shown to a worker that asks (`--client-cert-path`); a client that never
//! finishes its handshake is cut at `--tls-handshake-timeout-ms`; a key
//! that is not the certificate's refuses the start with one line naming the file.

mod utils;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer, ServerName};
use rustls::{ClientConfig, ClientConnection, RootCertStore, ServerConfig, ServerConnection};
use utils::mock_origin::{MockOrigin, Reply};
use utils::process::{workspace_bin, Gateway};
use utils::{CHAT, TIMEOUT};

/// The test's certificates, written to a directory of their own.
struct Pki {
    dir: PathBuf,
    ca_der: CertificateDer<'static>,
    /// A certificate for `localhost` and `127.0.0.1` (the gateway's, and the worker's).
    leaf_der: CertificateDer<'static>,
    leaf_key_der: Vec<u8>,
}

impl Pki {
    fn new(name: &str) -> Pki {
        let dir = std::env::temp_dir().join(format!("kvgate-tls-{name}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let mut ca_params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        ca_params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        ca_params
            .distinguished_name
            .push(rcgen::DnType::CommonName, "kvgate test CA");
        let ca_key = rcgen::KeyPair::generate().unwrap();
        let ca = ca_params.self_signed(&ca_key).unwrap();
        let issuer = rcgen::Issuer::new(ca_params, ca_key);
        let names = vec!["localhost".to_string(), "127.0.0.1".to_string()];
        let leaf_key = rcgen::KeyPair::generate().unwrap();
        let leaf = rcgen::CertificateParams::new(names)
            .unwrap()
            .signed_by(&leaf_key, &issuer)
            .unwrap();
        let stranger = rcgen::KeyPair::generate().unwrap();
        std::fs::write(dir.join("ca.pem"), ca.pem()).unwrap();
        std::fs::write(dir.join("cert.pem"), leaf.pem()).unwrap();
        std::fs::write(dir.join("key.pem"), leaf_key.serialize_pem()).unwrap();
        std::fs::write(dir.join("other-key.pem"), stranger.serialize_pem()).unwrap();
        Pki {
            dir,
            ca_der: ca.der().clone(),
            leaf_der: leaf.der().clone(),
            leaf_key_der: leaf_key.serialize_der(),
        }
    }

    fn path(&self, file: &str) -> String {
        self.dir.join(file).display().to_string()
    }

    /// kvgate's flags for TLS on its data port.
    fn gateway_flags(&self) -> Vec<String> {
        let mut flags = vec!["--tls-cert-path".to_string(), self.path("cert.pem")];
        flags.extend(["--tls-key-path".to_string(), self.path("key.pem")]);
        flags
    }

    /// A client trusting the test CA alone.
    fn client_config(&self) -> Arc<ClientConfig> {
        let mut roots = RootCertStore::empty();
        roots.add(self.ca_der.clone()).unwrap();
        let mut config = ClientConfig::builder()
            .with_root_certificates(roots)
            .with_no_client_auth();
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        Arc::new(config)
    }

    /// The worker's side: the leaf certificate and its key.
    fn server_config(&self) -> Arc<ServerConfig> {
        let key = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(self.leaf_key_der.clone()));
        let config = ServerConfig::builder()
            .with_no_client_auth()
            .with_single_cert(vec![self.leaf_der.clone()], key)
            .unwrap();
        Arc::new(config)
    }

    /// The worker's side, asking for a client certificate the test CA signed (mTLS).
    fn mtls_server_config(&self) -> Arc<ServerConfig> {
        let mut roots = RootCertStore::empty();
        roots.add(self.ca_der.clone()).unwrap();
        let verifier = rustls::server::WebPkiClientVerifier::builder(Arc::new(roots))
            .build()
            .unwrap();
        let key = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(self.leaf_key_der.clone()));
        let config = ServerConfig::builder()
            .with_client_cert_verifier(verifier)
            .with_single_cert(vec![self.leaf_der.clone()], key)
            .unwrap();
        Arc::new(config)
    }
}

impl Drop for Pki {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

type TlsClient = rustls::StreamOwned<ClientConnection, TcpStream>;

/// A TLS connection to `addr` for the name `host`, bounded by `TIMEOUT` at every read.
fn tls_connect(addr: SocketAddr, host: &str, config: Arc<ClientConfig>) -> TlsClient {
    let tcp = TcpStream::connect_timeout(&addr, TIMEOUT).unwrap();
    tcp.set_read_timeout(Some(TIMEOUT)).unwrap();
    tcp.set_write_timeout(Some(TIMEOUT)).unwrap();
    let name = ServerName::try_from(host.to_string()).unwrap();
    rustls::StreamOwned::new(ClientConnection::new(config, name).unwrap(), tcp)
}

/// One request on a TLS connection, closing after it; returns the status and the body
/// (de-chunked), read to the connection's end.
fn tls_request(stream: &mut TlsClient, method: &str, path: &str, body: &str) -> (u16, String) {
    let request = format!(
        "{method} {path} HTTP/1.1\r\nhost: localhost\r\ncontent-type: application/json\r\n\
         content-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    );
    stream.write_all(request.as_bytes()).unwrap();
    let mut bytes = Vec::new();
    // kvgate ends the connection with `close_notify`: the end reads cleanly.
    stream.read_to_end(&mut bytes).unwrap();
    let mut headers = [httparse::EMPTY_HEADER; 32];
    let mut response = httparse::Response::new(&mut headers);
    let head_len = match response.parse(&bytes).unwrap() {
        httparse::Status::Complete(n) => n,
        httparse::Status::Partial => panic!("a cut head: {}", String::from_utf8_lossy(&bytes)),
    };
    let chunked = response.headers.iter().any(|h| {
        h.name.eq_ignore_ascii_case("transfer-encoding") && h.value.eq_ignore_ascii_case(b"chunked")
    });
    let status = response.code.unwrap();
    let raw = &bytes[head_len..];
    let body = if chunked { dechunk(raw) } else { raw.to_vec() };
    (status, String::from_utf8(body).unwrap())
}

/// A complete chunked body's data.
fn dechunk(mut raw: &[u8]) -> Vec<u8> {
    let mut data = Vec::new();
    loop {
        let line_end = raw
            .windows(2)
            .position(|w| w == b"\r\n")
            .expect("a size line");
        let size_text = std::str::from_utf8(&raw[..line_end]).unwrap();
        let size = usize::from_str_radix(size_text.split(';').next().unwrap(), 16).unwrap();
        raw = &raw[line_end + 2..];
        if size == 0 {
            return data;
        }
        data.extend_from_slice(&raw[..size]);
        raw = &raw[size + 2..];
    }
}

#[test]
fn a_tls_client_reaches_a_plain_worker_through_kvgate_whole_and_streamed() {
    let pki = Pki::new("front");
    let events = [
        "data: {\"n\":1}\n\n",
        "data: {\"n\":2}\n\n",
        "data: [DONE]\n\n",
    ];
    let origin = MockOrigin::start(move |request| {
        if request.body.windows(13).any(|w| w == b"\"stream\":true") {
            let chunks = events.iter().map(|e| e.to_string()).collect();
            Reply::Chunked {
                chunks,
                gap: Duration::from_millis(20),
            }
        } else {
            Reply::json(r#"{"ok":true}"#)
        }
    });
    let flags = pki.gateway_flags();
    let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
    let gateway = Gateway::start(&[origin.url()], &flags);
    let config = pki.client_config();

    let mut client = tls_connect(gateway.addr(), "localhost", config.clone());
    let (status, body) = tls_request(&mut client, "POST", "/v1/chat/completions", CHAT);
    assert_eq!((status, body.as_str()), (200, r#"{"ok":true}"#));
    assert_eq!(
        client.conn.alpn_protocol(),
        Some(&b"http/1.1"[..]),
        "HTTP/1.1 by ALPN"
    );
    assert_eq!(origin.requests().len(), 1, "the worker got the request");

    // The certificate names 127.0.0.1 too: a client dialing the address checks it as well.
    let mut by_address = tls_connect(gateway.addr(), "127.0.0.1", config.clone());
    let (status, _) = tls_request(&mut by_address, "GET", "/health", "");
    assert_eq!(status, 200);

    let streamed = CHAT.replace('{', r#"{"stream":true,"#);
    let mut client = tls_connect(gateway.addr(), "localhost", config);
    let (status, body) = tls_request(&mut client, "POST", "/v1/chat/completions", &streamed);
    assert_eq!(status, 200);
    assert_eq!(body, events.concat(), "every event, in order");

    // Plain HTTP on the TLS port gets no HTTP answer, and its connection is closed.
    let answer = closing_answer(gateway.addr(), b"GET /health HTTP/1.1\r\nhost: x\r\n\r\n");
    assert!(
        !answer.starts_with(b"HTTP/"),
        "a plain client is not served"
    );
}

/// Everything the gateway sends on a fresh connection after `bytes`, to the connection's end
/// (a test fails if it stays open past `TIMEOUT`).
fn closing_answer(addr: SocketAddr, bytes: &[u8]) -> Vec<u8> {
    let mut tcp = TcpStream::connect_timeout(&addr, TIMEOUT).unwrap();
    tcp.set_read_timeout(Some(TIMEOUT)).unwrap();
    tcp.write_all(bytes).unwrap();
    let mut answer = Vec::new();
    match tcp.read_to_end(&mut answer) {
        Ok(_) => {}
        Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => {}
        Err(e) => panic!("the connection was not closed: {e}"),
    }
    answer
}

#[test]
fn a_client_that_stalls_its_handshake_is_cut_at_the_limit() {
    let pki = Pki::new("stall");
    let mut flags = pki.gateway_flags();
    // Long enough for the healthy client's handshake below (debug rustls on both ends) on a
    // loaded machine: at 300 ms it was sometimes cut too, mid-request.
    flags.extend(["--tls-handshake-timeout-ms".to_string(), "2000".to_string()]);
    let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
    let origin = utils::ok_origin();
    let gateway = Gateway::start(&[origin.url()], &flags);
    // Half a ClientHello's record header, then nothing: closed at the limit, nothing said.
    let answer = closing_answer(gateway.addr(), &[0x16, 0x03]);
    assert!(answer.is_empty(), "{answer:?}");
    // The gateway still serves.
    let mut client = tls_connect(gateway.addr(), "localhost", pki.client_config());
    assert_eq!(tls_request(&mut client, "GET", "/health", "").0, 200);
}

#[test]
fn a_key_that_is_not_the_certificates_refuses_the_start_naming_the_file() {
    let pki = Pki::new("mismatch");
    let output = Command::new(workspace_bin("kvgate"))
        .args([
            "--host",
            "127.0.0.1",
            "--port",
            "0",
            "--prometheus-port",
            "0",
        ])
        .args(["--tls-cert-path", &pki.path("cert.pem")])
        .args(["--tls-key-path", &pki.path("other-key.pem")])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .output()
        .unwrap();
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    let lines: Vec<&str> = stderr.lines().filter(|l| !l.trim().is_empty()).collect();
    assert_eq!(lines.len(), 1, "one line: {stderr}");
    assert!(lines[0].contains("--tls-key-path"), "{stderr}");
    assert!(lines[0].contains("other-key.pem"), "{stderr}");
    let missing = Command::new(workspace_bin("kvgate"))
        .args(["--tls-cert-path", &pki.path("nothing.pem")])
        .args(["--tls-key-path", &pki.path("key.pem")])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .output()
        .unwrap();
    assert!(!missing.status.success());
    assert!(String::from_utf8_lossy(&missing.stderr).contains("nothing.pem"));
}

/// An `https://` worker: a rustls server on loopback answering `/health`, `/v1/models` and
/// chat completions on keep-alive connections; counts the requests it served by path.
struct HttpsWorker {
    port: u16,
    health_checks: Arc<AtomicUsize>,
    completions: Arc<AtomicUsize>,
}

impl HttpsWorker {
    fn start(config: Arc<ServerConfig>) -> HttpsWorker {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let health_checks = Arc::new(AtomicUsize::new(0));
        let completions = Arc::new(AtomicUsize::new(0));
        let counts = (health_checks.clone(), completions.clone());
        std::thread::spawn(move || {
            for tcp in listener.incoming() {
                let Ok(tcp) = tcp else { continue };
                let (config, counts) = (config.clone(), counts.clone());
                std::thread::spawn(move || serve_tls(tcp, config, &counts.0, &counts.1));
            }
        });
        HttpsWorker {
            port,
            health_checks,
            completions,
        }
    }
}

/// Serves one TLS connection's requests until it ends (bounded by `TIMEOUT` per read).
fn serve_tls(tcp: TcpStream, config: Arc<ServerConfig>, health: &AtomicUsize, done: &AtomicUsize) {
    let _ = tcp.set_read_timeout(Some(TIMEOUT));
    let Ok(session) = ServerConnection::new(config) else {
        return;
    };
    let mut stream = rustls::StreamOwned::new(session, tcp);
    let mut buf = Vec::new();
    loop {
        let (path, end) = loop {
            if let Some(parsed) = request_in(&buf) {
                break parsed;
            }
            let mut chunk = [0u8; 4096];
            match stream.read(&mut chunk) {
                Ok(n) if n > 0 => buf.extend_from_slice(&chunk[..n]),
                _ => return,
            }
        };
        buf.drain(..end);
        let body = match path.as_str() {
            "/health" => {
                health.fetch_add(1, Ordering::Relaxed);
                "{}".to_string()
            }
            "/v1/models" => r#"{"object":"list","data":[{"id":"m","object":"model"}]}"#.into(),
            "/v1/chat/completions" => {
                done.fetch_add(1, Ordering::Relaxed);
                r#"{"worker":"https"}"#.into()
            }
            _ => r#"{"error":"not here"}"#.into(),
        };
        let status = if body.contains("not here") {
            "404 Not Found"
        } else {
            "200 OK"
        };
        let response = format!(
            "HTTP/1.1 {status}\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
            body.len()
        );
        if stream.write_all(response.as_bytes()).is_err() {
            return;
        }
    }
}

/// The path of the complete request at the start of `buf` and where it ends.
fn request_in(buf: &[u8]) -> Option<(String, usize)> {
    let mut headers = [httparse::EMPTY_HEADER; 32];
    let mut request = httparse::Request::new(&mut headers);
    let head_len = match request.parse(buf).ok()? {
        httparse::Status::Complete(n) => n,
        httparse::Status::Partial => return None,
    };
    let length = request
        .headers
        .iter()
        .find(|h| h.name.eq_ignore_ascii_case("content-length"))
        .and_then(|h| std::str::from_utf8(h.value).ok()?.parse::<usize>().ok())
        .unwrap_or(0);
    let end = head_len + length;
    (buf.len() >= end).then(|| (request.path.unwrap_or("").to_string(), end))
}

#[test]
fn kvgate_proxies_and_probes_an_https_worker_checked_against_its_ca() {
    let pki = Pki::new("worker");
    let worker = HttpsWorker::start(pki.server_config());
    let url = format!("https://localhost:{}", worker.port);
    let ca = pki.path("ca.pem");
    let flags = [
        "--ca-cert-paths",
        ca.as_str(),
        "--health-check-interval-secs",
        "1",
    ];
    let gateway = Gateway::start(std::slice::from_ref(&url), &flags);
    for _ in 0..3 {
        let response = gateway.client().post_json("/v1/chat/completions", CHAT);
        assert_eq!(response.status, 200, "{}", response.text());
        assert_eq!(response.text(), r#"{"worker":"https"}"#);
        // The worker's identity keeps its scheme.
        assert_eq!(response.routed_worker(), Some(url.as_str()));
    }
    assert_eq!(worker.completions.load(Ordering::Relaxed), 3);
    // The control core's health checks reach it over TLS too.
    let probed = utils::wait_until(TIMEOUT, || worker.health_checks.load(Ordering::Relaxed) > 0);
    assert!(probed, "no health check reached the https worker");
}

#[test]
fn an_https_worker_whose_certificate_no_root_vouches_for_is_not_reached() {
    let pki = Pki::new("untrusted");
    let worker = HttpsWorker::start(pki.server_config());
    let url = format!("https://localhost:{}", worker.port);
    // No --ca-cert-paths: the system's roots do not know the test CA.
    let gateway = Gateway::start(std::slice::from_ref(&url), &[]);
    let response = gateway.client().post_json("/v1/chat/completions", CHAT);
    // 502 (the handshake failed), or 503 once failed health checks marked the worker down.
    assert!([502, 503].contains(&response.status), "{}", response.text());
    utils::assert_error(&response, response.status);
    assert_eq!(worker.completions.load(Ordering::Relaxed), 0);
    assert_eq!(
        worker.health_checks.load(Ordering::Relaxed),
        0,
        "no probe got through"
    );
}

#[test]
fn kvgate_shows_its_client_certificate_to_an_https_worker_that_asks_for_one() {
    let pki = Pki::new("mtls");
    let worker = HttpsWorker::start(pki.mtls_server_config());
    let url = format!("https://localhost:{}", worker.port);
    let (ca, cert, key) = (
        pki.path("ca.pem"),
        pki.path("cert.pem"),
        pki.path("key.pem"),
    );
    let without = Gateway::start(std::slice::from_ref(&url), &["--ca-cert-paths", &ca]);
    let refused = without.client().post_json("/v1/chat/completions", CHAT);
    assert_ne!(refused.status, 200, "no client certificate, no answer");
    assert_eq!(worker.completions.load(Ordering::Relaxed), 0);
    drop(without);
    let flags = [
        "--ca-cert-paths",
        ca.as_str(),
        "--client-cert-path",
        cert.as_str(),
        "--client-key-path",
        key.as_str(),
    ];
    let gateway = Gateway::start(std::slice::from_ref(&url), &flags);
    let response = gateway.client().post_json("/v1/chat/completions", CHAT);
    assert_eq!(response.status, 200, "{}", response.text());
    assert_eq!(worker.completions.load(Ordering::Relaxed), 1);
}
