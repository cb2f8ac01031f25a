//! A fixed number of chat requests through a proxy, for instruction counts
//! (`scripts/count-proxy.sh`): unlike wrk, which runs for a time, [`drive`] sends exactly
//! `count` requests, so that the difference between a run of N and one of 2N divided by N is the
//! cost of one request. The bodies are [`chat_bodies`], the ones `scripts/lib/wrk.sh` gives wrk.

use std::net::SocketAddr;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;

/// How many distinct bodies [`chat_bodies`] makes (cycled per request, as wrk's script does).
pub const CHAT_BODIES: usize = 16;

/// `scripts/lib/wrk.sh`'s chat bodies: a system prompt of `system_words` words (`keeper0` ..
/// `keeper996`, shared by all of them) before each of [`CHAT_BODIES`] distinct questions.
pub fn chat_bodies(system_words: usize) -> Vec<Bytes> {
    let mut system = String::from("You are a helpful assistant. ");
    let words: Vec<String> = (1..=system_words)
        .map(|i| format!("keeper{}", i % 997))
        .collect();
    system.push_str(&words.join(" "));
    (1..=CHAT_BODIES)
        .map(|i| {
            Bytes::from(format!(
                "{{\"model\":\"sim-model\",\"messages\":[{{\"role\":\"system\",\"content\":\"{system}\"}},\
                 {{\"role\":\"user\",\"content\":\"Question {i}: summarize the plot of a short story about \
                 a lighthouse keeper in one sentence.\"}}],\"max_tokens\":8}}"
            ))
        })
        .collect()
}

/// Sends `count` POSTs of `bodies` (cycled) to `path` on `addr` over `connections` kept-alive
/// connections, each its share one after the other; fails on the first answer that is not 200
/// or not complete.
pub async fn drive(
    addr: SocketAddr,
    path: &str,
    bodies: &[Bytes],
    count: usize,
    connections: usize,
) -> Result<(), String> {
    if bodies.is_empty() || connections == 0 {
        return Err("no bodies or no connections".into());
    }
    let mut tasks = tokio::task::JoinSet::new();
    for c in 0..connections {
        let share = count / connections + usize::from(c < count % connections);
        let bodies: Vec<Bytes> = bodies.to_vec();
        let path = path.to_string();
        tasks.spawn(async move { one_connection(addr, &path, &bodies, c, share).await });
    }
    while let Some(done) = tasks.join_next().await {
        done.map_err(|e| format!("a connection's task failed: {e}"))??;
    }
    Ok(())
}

async fn one_connection(
    addr: SocketAddr,
    path: &str,
    bodies: &[Bytes],
    first: usize,
    count: usize,
) -> Result<(), String> {
    let stream = TcpStream::connect(addr)
        .await
        .map_err(|e| format!("connect {addr}: {e}"))?;
    let _ = stream.set_nodelay(true);
    let (mut sender, connection) =
        hyper::client::conn::http1::handshake::<_, Full<Bytes>>(TokioIo::new(stream))
            .await
            .map_err(|e| format!("handshake with {addr}: {e}"))?;
    let connection = tokio::spawn(connection);
    let mut result = Ok(());
    for n in 0..count {
        let body = bodies[(first + n) % bodies.len()].clone();
        let request = hyper::Request::post(path)
            .header(hyper::header::HOST, addr.to_string())
            .header(hyper::header::CONTENT_TYPE, "application/json")
            .body(Full::new(body))
            .map_err(|e| format!("request: {e}"))?;
        let answer = match sender.send_request(request).await {
            Ok(response) => {
                let status = response.status().as_u16();
                match response.into_body().collect().await {
                    Ok(_) if status == 200 => Ok(()),
                    Ok(body) => Err(format!(
                        "{addr} answered {status}: {}",
                        String::from_utf8_lossy(&body.to_bytes())
                    )),
                    Err(e) => Err(format!("reading {addr}'s answer: {e}")),
                }
            }
            Err(e) => Err(format!("sending to {addr}: {e}")),
        };
        if answer.is_err() {
            result = answer;
            break;
        }
    }
    connection.abort();
    result
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bodies_are_wrk_s_chat_bodies() {
        let small = chat_bodies(0);
        assert_eq!(small.len(), CHAT_BODIES);
        let first = std::str::from_utf8(&small[0]).unwrap();
        let parsed: serde_json::Value = serde_json::from_str(first).unwrap();
        assert_eq!(parsed["messages"][1]["content"].as_str().unwrap().len(), 90);
        assert_ne!(small[0], small[1]);
        // 36 KB: 3,600 words of 7-9 characters and their spaces.
        let large = chat_bodies(3600);
        assert!(
            (30_000..40_000).contains(&large[0].len()),
            "{}",
            large[0].len()
        );
        assert!(std::str::from_utf8(&large[3])
            .unwrap()
            .contains("keeper996 keeper0"));
    }

    #[tokio::test]
    async fn sends_exactly_count_requests_over_the_connections() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let served = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let counter = served.clone();
        tokio::spawn(async move {
            loop {
                let (mut socket, _) = listener.accept().await.unwrap();
                let counter = counter.clone();
                tokio::spawn(async move {
                    let mut seen = Vec::new();
                    let mut buf = [0u8; 4096];
                    loop {
                        let Ok(n) = socket.read(&mut buf).await else {
                            return;
                        };
                        if n == 0 {
                            return;
                        }
                        seen.extend_from_slice(&buf[..n]);
                        // Each body ends with `}}` after max_tokens: one answer per body.
                        while let Some(end) =
                            seen.windows(3).position(|w| w == b"8}\n" || w == b":8}")
                        {
                            seen.drain(..end + 3);
                            counter.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                            let ok = b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok";
                            if socket.write_all(ok).await.is_err() {
                                return;
                            }
                        }
                    }
                });
            }
        });
        drive(addr, "/v1/chat/completions", &chat_bodies(0), 7, 3)
            .await
            .unwrap();
        assert_eq!(served.load(std::sync::atomic::Ordering::SeqCst), 7);
    }
}
