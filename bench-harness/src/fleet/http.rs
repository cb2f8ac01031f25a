//! The one small HTTP/1.1 client of the plumbing (hyper): [`get`] asks a local process for a
//! page (a health check, `/metrics`, the admin API's `/workers`, an engine's `/sim/stats`) on a
//! connection of its own and reads the whole answer. The load generators have their own clients
//! ([`crate::replay::client`], [`crate::chaos::http`]): they time and judge what they read.

use std::net::SocketAddr;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Empty, Limited};
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;

/// The largest body [`get`] reads: a gateway's `/metrics` with many workers is a few hundred KiB.
pub const BODY_BYTES_MAX: usize = 16 << 20;

/// A complete answer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Answer {
    pub status: u16,
    /// The body as text (bytes that are not UTF-8 replaced).
    pub body: String,
}

/// `GET path` on `addr`, with `Authorization: Bearer <key>` when `bearer` is given; `None` when
/// nothing complete came back within `timeout` (no listener, a closed connection, a body over
/// [`BODY_BYTES_MAX`]).
pub async fn get(
    addr: SocketAddr,
    path: &str,
    bearer: Option<&str>,
    timeout: Duration,
) -> Option<Answer> {
    tokio::time::timeout(timeout, exchange(addr, path, bearer))
        .await
        .ok()
        .flatten()
}

async fn exchange(addr: SocketAddr, path: &str, bearer: Option<&str>) -> Option<Answer> {
    let stream = TcpStream::connect(addr).await.ok()?;
    let (mut sender, connection) =
        hyper::client::conn::http1::handshake::<_, Empty<Bytes>>(TokioIo::new(stream))
            .await
            .ok()?;
    let connection = tokio::spawn(connection);
    let mut request = hyper::Request::get(path).header(hyper::header::HOST, addr.to_string());
    if let Some(key) = bearer {
        request = request.header(hyper::header::AUTHORIZATION, format!("Bearer {key}"));
    }
    let response = sender
        .send_request(request.body(Empty::new()).ok()?)
        .await
        .ok();
    let answer = match response {
        Some(response) => {
            let status = response.status().as_u16();
            let body = Limited::new(response.into_body(), BODY_BYTES_MAX)
                .collect()
                .await
                .ok()
                .map(|body| String::from_utf8_lossy(&body.to_bytes()).into_owned());
            body.map(|body| Answer { status, body })
        }
        None => None,
    };
    connection.abort();
    answer
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn reads_a_chunked_answer_and_sends_the_bearer() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let server = tokio::spawn(async move {
            use tokio::io::{AsyncReadExt, AsyncWriteExt};
            let (mut socket, _) = listener.accept().await.unwrap();
            let mut head = Vec::new();
            let mut buf = [0u8; 1024];
            while !head.windows(4).any(|w| w == b"\r\n\r\n") {
                let n = socket.read(&mut buf).await.unwrap();
                head.extend_from_slice(&buf[..n]);
            }
            let answer: &[u8] = b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n\
                3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n";
            socket.write_all(answer).await.unwrap();
            String::from_utf8(head).unwrap()
        });
        let answer = get(addr, "/workers", Some("k3y"), Duration::from_secs(5)).await;
        assert_eq!(
            answer,
            Some(Answer {
                status: 200,
                body: "abcde".into()
            })
        );
        let head = server.await.unwrap().to_ascii_lowercase();
        assert!(head.starts_with("get /workers http/1.1"), "{head}");
        assert!(head.contains("authorization: bearer k3y"), "{head}");
    }

    #[tokio::test]
    async fn nothing_listening_is_no_answer() {
        let addr = SocketAddr::from(([127, 0, 0, 1], crate::fleet::free_ports(1).unwrap()));
        assert_eq!(
            get(addr, "/health", None, Duration::from_secs(2)).await,
            None
        );
    }
}
