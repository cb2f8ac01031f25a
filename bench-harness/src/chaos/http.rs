//! One HTTP exchange of the chaos driver, on its own connection (so an abort closes exactly that
//! request's socket), and the verdict on what came back: [`send`] and [`Verdict`].
//!
//! A proper answer is a 2xx with a complete body (a JSON document, or an SSE stream that ends
//! with `data: [DONE]` or an SSE error event), or an error status with the gateway's JSON error
//! body `{"error":{"message","type","code"}}`. A response cut after its head (the worker failed
//! once bytes had reached the client, where no error event fits the framing) is counted apart and
//! checked against the gateway's own count of cut responses.

use std::net::SocketAddr;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;

/// Largest body read: the chaos workload's answers are a few KiB.
const BODY_BYTES_MAX: usize = 4 << 20;

/// What one request got.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// 2xx and a complete body.
    Success,
    /// A 2xx SSE stream that ended with the gateway's SSE error event.
    StreamError,
    /// An error status with the JSON error body.
    Error(u16),
    /// The client closed the connection before the answer was complete (excluded from checks).
    Aborted,
    /// The head arrived, then the connection closed before the body's end.
    Cut,
    /// A violation: the text says what was wrong.
    Improper(String),
}

impl Verdict {
    /// The key under which the report counts it.
    pub fn label(&self) -> String {
        match self {
            Verdict::Success => "success".into(),
            Verdict::StreamError => "sse_error_event".into(),
            Verdict::Error(status) => format!("error_{status}"),
            Verdict::Aborted => "client_aborted".into(),
            Verdict::Cut => "cut_after_head".into(),
            Verdict::Improper(_) => "improper".into(),
        }
    }
}

/// A request to send.
pub struct Exchange<'a> {
    pub method: &'a str,
    pub path: &'a str,
    pub body: Bytes,
    pub bearer: Option<&'a str>,
    /// Close the connection this long after the start, unless the answer is complete before.
    pub abort_after: Option<Duration>,
    /// Past this the request is a hang (a violation).
    pub timeout: Duration,
}

/// Sends `exchange` to `addr` on a new connection and judges the answer.
pub async fn send(addr: SocketAddr, exchange: Exchange<'_>) -> Verdict {
    let timeout = exchange.timeout;
    let abort_after = exchange.abort_after;
    let work = exchange_once(addr, exchange);
    tokio::pin!(work);
    let abort = async {
        match abort_after {
            Some(after) => tokio::time::sleep(after).await,
            None => std::future::pending().await,
        }
    };
    tokio::select! {
        verdict = &mut work => verdict,
        _ = abort => Verdict::Aborted,
        _ = tokio::time::sleep(timeout) => Verdict::Improper(format!("no complete answer within {timeout:?}")),
    }
}

async fn exchange_once(addr: SocketAddr, exchange: Exchange<'_>) -> Verdict {
    let stream = match TcpStream::connect(addr).await {
        Ok(stream) => stream,
        Err(e) => return Verdict::Improper(format!("connect: {e}")),
    };
    let _ = stream.set_nodelay(true);
    let (mut sender, connection) =
        match hyper::client::conn::http1::handshake::<_, Full<Bytes>>(TokioIo::new(stream)).await {
            Ok(pair) => pair,
            Err(e) => return Verdict::Improper(format!("handshake: {e}")),
        };
    // Aborted with this future (a client abort drops it): the socket closes with it.
    let connection = AbortOnDrop(tokio::spawn(async move {
        let _ = connection.await;
    }));
    let mut builder = hyper::Request::builder()
        .method(exchange.method)
        .uri(exchange.path)
        .header(hyper::header::HOST, addr.to_string())
        .header(hyper::header::CONTENT_TYPE, "application/json");
    if let Some(key) = exchange.bearer {
        builder = builder.header(hyper::header::AUTHORIZATION, format!("Bearer {key}"));
    }
    let request = match builder.body(Full::new(exchange.body)) {
        Ok(request) => request,
        Err(e) => return Verdict::Improper(format!("request: {e}")),
    };
    let response = match sender.send_request(request).await {
        Ok(response) => response,
        Err(e) => return Verdict::Improper(format!("no response head: {e}")),
    };
    let status = response.status().as_u16();
    let content_type = response
        .headers()
        .get(hyper::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_string();
    let mut body = response.into_body();
    let mut bytes = Vec::new();
    let mut complete = true;
    while let Some(frame) = body.frame().await {
        match frame {
            Ok(frame) => {
                if let Ok(data) = frame.into_data() {
                    if bytes.len() + data.len() > BODY_BYTES_MAX {
                        return Verdict::Improper(format!("body over {BODY_BYTES_MAX} bytes"));
                    }
                    bytes.extend_from_slice(&data);
                }
            }
            Err(_) => {
                complete = false;
                break;
            }
        }
    }
    drop(connection);
    judge(status, &content_type, &bytes, complete)
}

/// Judges a response from its status, content type, body and whether the body was complete.
pub fn judge(status: u16, content_type: &str, body: &[u8], complete: bool) -> Verdict {
    let is_sse = content_type.starts_with("text/event-stream");
    if (200..300).contains(&status) {
        if is_sse {
            let text = String::from_utf8_lossy(body);
            if sse_has_error_event(&text) {
                return if complete {
                    Verdict::StreamError
                } else {
                    Verdict::Improper("SSE error event without the stream's end".into())
                };
            }
            if !complete {
                return Verdict::Cut;
            }
            return if text.contains("data: [DONE]") {
                Verdict::Success
            } else {
                Verdict::Improper("SSE stream ended without [DONE] or an error event".into())
            };
        }
        if !complete {
            return Verdict::Cut;
        }
        return match serde_json::from_slice::<serde_json::Value>(body) {
            Ok(_) => Verdict::Success,
            Err(e) => Verdict::Improper(format!("{status} body is not JSON: {e}")),
        };
    }
    if !complete {
        return Verdict::Improper(format!("{status} error body cut"));
    }
    if status < 400 {
        return Verdict::Improper(format!("unexpected status {status}"));
    }
    if !content_type.starts_with("application/json") {
        return Verdict::Improper(format!("{status} with content type {content_type:?}"));
    }
    match serde_json::from_slice::<serde_json::Value>(body) {
        Ok(value) if is_error_body(&value) => Verdict::Error(status),
        Ok(value) => Verdict::Improper(format!("{status} body is not the error shape: {value}")),
        Err(e) => Verdict::Improper(format!("{status} body is not JSON: {e}")),
    }
}

/// `{"error":{"message": string, "type": string, "code": ...}}`.
fn is_error_body(value: &serde_json::Value) -> bool {
    let error = &value["error"];
    error["message"].is_string() && error["type"].is_string() && !error["code"].is_null()
}

/// An SSE event whose data is a JSON error object, or an `event: error` line.
fn sse_has_error_event(text: &str) -> bool {
    text.lines().any(|line| {
        line.trim_end() == "event: error"
            || line
                .strip_prefix("data: ")
                .and_then(|data| serde_json::from_str::<serde_json::Value>(data).ok())
                .is_some_and(|value| is_error_body(&value))
    })
}

struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const ERROR: &[u8] =
        br#"{"error":{"message":"no worker","type":"service_unavailable","code":503}}"#;

    #[test]
    fn errors_need_the_json_error_shape() {
        assert_eq!(
            judge(503, "application/json", ERROR, true),
            Verdict::Error(503)
        );
        assert!(matches!(
            judge(503, "text/plain", ERROR, true),
            Verdict::Improper(_)
        ));
        assert!(matches!(
            judge(502, "application/json", br#"{"detail":"x"}"#, true),
            Verdict::Improper(_)
        ));
        assert!(matches!(
            judge(500, "application/json", ERROR, false),
            Verdict::Improper(_)
        ));
    }

    #[test]
    fn streams_end_with_done_or_an_error_event() {
        let done = b"data: {\"choices\":[]}\n\ndata: [DONE]\n\n";
        assert_eq!(
            judge(200, "text/event-stream", done, true),
            Verdict::Success
        );
        let cut = b"data: {\"choices\":[]}\n\n";
        assert!(matches!(
            judge(200, "text/event-stream", cut, true),
            Verdict::Improper(_)
        ));
        assert_eq!(judge(200, "text/event-stream", cut, false), Verdict::Cut);
        let mut error = cut.to_vec();
        error.extend_from_slice(b"data: ");
        error.extend_from_slice(ERROR);
        error.extend_from_slice(b"\n\n");
        assert_eq!(
            judge(200, "text/event-stream", &error, true),
            Verdict::StreamError
        );
    }

    #[test]
    fn json_successes_must_parse() {
        assert_eq!(
            judge(200, "application/json", b"{\"id\":1}", true),
            Verdict::Success
        );
        assert!(matches!(
            judge(200, "application/json", b"{\"id\"", true),
            Verdict::Improper(_)
        ));
        assert_eq!(
            judge(200, "application/json", b"{\"id\"", false),
            Verdict::Cut
        );
    }
}
