//! The transport against a real HTTP/2 server: `h2`'s own server on a tokio thread, scripted
//! per method path. Each test asserts what the server saw (streams reset, connections opened)
//! as well as what the client got.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use prost::Message;

use super::call::{unary, Call, CallError};
use super::channels::{connection_for, Channels};
use super::framing;
use super::status::Code;
use crate::engine_proto::sglang_pb;
use crate::ids::WorkerId;

/// What the scripted server counted.
#[derive(Debug, Default)]
struct Seen {
    connections: AtomicUsize,
    calls: AtomicUsize,
    resets: AtomicUsize,
}

/// The server's behaviour.
#[derive(Clone, Copy, Debug)]
struct Script {
    /// `SETTINGS_MAX_CONCURRENT_STREAMS`.
    max_streams: u32,
    /// Send GOAWAY (graceful) once this many calls arrived on a connection (0: never).
    goaway_after: usize,
}

fn block_on<F: std::future::Future>(future: F) -> F::Output {
    monoio::RuntimeBuilder::<monoio::FusionDriver>::new()
        .enable_timer()
        .build()
        .expect("a runtime")
        .block_on(future)
}

/// Starts the server on a loopback port; it lives as long as the test process.
fn serve(script: Script) -> (SocketAddr, Arc<Seen>) {
    let std_listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = std_listener.local_addr().unwrap();
    std_listener.set_nonblocking(true).unwrap();
    let seen = Arc::new(Seen::default());
    let counted = seen.clone();
    std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        runtime.block_on(async move {
            let listener = tokio::net::TcpListener::from_std(std_listener).unwrap();
            loop {
                let Ok((socket, _)) = listener.accept().await else {
                    return;
                };
                counted.connections.fetch_add(1, Ordering::SeqCst);
                tokio::spawn(serve_connection(socket, script, counted.clone()));
            }
        });
    });
    (addr, seen)
}

async fn serve_connection(socket: tokio::net::TcpStream, script: Script, seen: Arc<Seen>) {
    let mut builder = h2::server::Builder::new();
    builder.max_concurrent_streams(script.max_streams);
    let Ok(mut connection) = builder.handshake::<_, Bytes>(socket).await else {
        return;
    };
    let mut calls = 0;
    while let Some(Ok((request, respond))) = connection.accept().await {
        calls += 1;
        seen.calls.fetch_add(1, Ordering::SeqCst);
        tokio::spawn(answer(request, respond, seen.clone()));
        if calls == script.goaway_after {
            connection.graceful_shutdown();
        }
    }
}

/// Answers by path: `HealthCheck` (unary, healthy), `Generate` (one chunk every 20 ms, 10 in
/// all, then OK), `Unavailable` (trailers-only status 14).
async fn answer(
    request: http::Request<h2::RecvStream>,
    mut respond: h2::server::SendResponse<Bytes>,
    seen: Arc<Seen>,
) {
    let path = request.uri().path().to_string();
    let grpc = http::Response::builder()
        .header("content-type", "application/grpc")
        .body(())
        .unwrap();
    if path.ends_with("/Unavailable") {
        let only = http::Response::builder()
            .header("content-type", "application/grpc")
            .header("grpc-status", "14")
            .header("grpc-message", "draining")
            .body(())
            .unwrap();
        let _ = respond.send_response(only, true);
        return;
    }
    let Ok(mut send) = respond.send_response(grpc, false) else {
        return;
    };
    let mut trailers = http::HeaderMap::new();
    trailers.insert("grpc-status", "0".parse().unwrap());
    if path.ends_with("/HealthCheck") {
        let answer = sglang_pb::HealthCheckResponse {
            healthy: true,
            message: "ok".into(),
        };
        let _ = send.send_data(framing::encode(&answer), false);
        let _ = send.send_trailers(trailers);
        return;
    }
    for i in 0..10u32 {
        tokio::time::sleep(Duration::from_millis(20)).await;
        let chunk = sglang_pb::GenerateResponse {
            request_id: "r".into(),
            response: Some(sglang_pb::generate_response::Response::Chunk(
                sglang_pb::GenerateStreamChunk {
                    token_ids: vec![i],
                    ..Default::default()
                },
            )),
        };
        // Did the client reset the stream meanwhile?
        let reset = std::future::poll_fn(|cx| send.poll_reset(cx));
        if let Some(Ok(reason)) = futures::FutureExt::now_or_never(reset) {
            if reason == h2::Reason::CANCEL {
                seen.resets.fetch_add(1, Ordering::SeqCst);
            }
            return;
        }
        if send.send_data(framing::encode(&chunk), false).is_err() {
            return;
        }
    }
    let _ = send.send_trailers(trailers);
}

const AUTHORITY: &str = "worker";
const HEALTH: &str = "/sglang.grpc.scheduler.SglangScheduler/HealthCheck";
const GENERATE: &str = "/sglang.grpc.scheduler.SglangScheduler/Generate";

fn generate_request() -> Bytes {
    framing::encode(&sglang_pb::GenerateRequest::default())
}

/// Reads a streamed call to its end; the token IDs it carried.
async fn read_all(mut call: Call) -> Result<Vec<u32>, CallError> {
    let mut ids = Vec::new();
    while let Some(message) = call.message().await? {
        let response = sglang_pb::GenerateResponse::decode(message).unwrap();
        if let Some(sglang_pb::generate_response::Response::Chunk(chunk)) = response.response {
            ids.extend(chunk.token_ids);
        }
    }
    Ok(ids)
}

#[test]
fn a_unary_call_and_a_streamed_call_share_one_connection() {
    let (addr, seen) = serve(Script {
        max_streams: 100,
        goaway_after: 0,
    });
    let channels = std::cell::RefCell::new(Channels::new());
    block_on(async {
        let worker = WorkerId(1);
        let connection = connection_for(&channels, worker, addr).await.unwrap();
        let answer: sglang_pb::HealthCheckResponse = unary(
            &connection,
            AUTHORITY,
            HEALTH,
            &sglang_pb::HealthCheckRequest {},
        )
        .await
        .unwrap();
        assert!(answer.healthy);
        let connection = connection_for(&channels, worker, addr).await.unwrap();
        let call = Call::start(&connection, AUTHORITY, GENERATE, generate_request())
            .await
            .unwrap();
        assert_eq!(read_all(call).await.unwrap(), (0..10).collect::<Vec<_>>());
        assert_eq!(channels.borrow().connections(worker), 1);
    });
    assert_eq!(seen.connections.load(Ordering::SeqCst), 1);
}

#[test]
fn a_trailers_only_error_is_the_calls_status() {
    let (addr, _) = serve(Script {
        max_streams: 100,
        goaway_after: 0,
    });
    let channels = std::cell::RefCell::new(Channels::new());
    block_on(async {
        let connection = connection_for(&channels, WorkerId(1), addr).await.unwrap();
        let path = "/sglang.grpc.scheduler.SglangScheduler/Unavailable";
        let call = Call::start(&connection, AUTHORITY, path, generate_request()).await;
        let error = read_all(call.unwrap()).await.unwrap_err();
        let CallError::Status(status) = error else {
            panic!("a status expected, got {error:?}");
        };
        assert_eq!(
            (status.code, status.message.as_str()),
            (Code::Unavailable, "draining")
        );
    });
}

#[test]
fn a_worker_with_one_stream_per_connection_gets_a_second_connection() {
    let (addr, seen) = serve(Script {
        max_streams: 1,
        goaway_after: 0,
    });
    let channels = std::cell::RefCell::new(Channels::new());
    block_on(async {
        let worker = WorkerId(7);
        // The first connection learns the limit from the worker's SETTINGS on its first call.
        let first = connection_for(&channels, worker, addr).await.unwrap();
        let warm: Result<sglang_pb::HealthCheckResponse, _> =
            unary(&first, AUTHORITY, HEALTH, &sglang_pb::HealthCheckRequest {}).await;
        warm.unwrap();
        let one = connection_for(&channels, worker, addr).await.unwrap();
        let a = Call::start(&one, AUTHORITY, GENERATE, generate_request())
            .await
            .unwrap();
        let two = connection_for(&channels, worker, addr).await.unwrap();
        assert!(!one.same(&two), "a full connection takes no second call");
        let b = Call::start(&two, AUTHORITY, GENERATE, generate_request())
            .await
            .unwrap();
        let (a, b) = futures::join!(read_all(a), read_all(b));
        assert_eq!(a.unwrap().len(), 10);
        assert_eq!(b.unwrap().len(), 10);
        assert_eq!(channels.borrow().connections(worker), 2);
    });
    assert_eq!(seen.connections.load(Ordering::SeqCst), 2);
}

#[test]
fn after_goaway_the_running_call_finishes_and_new_calls_use_a_new_connection() {
    let (addr, seen) = serve(Script {
        max_streams: 100,
        goaway_after: 1,
    });
    let channels = std::cell::RefCell::new(Channels::new());
    block_on(async {
        let worker = WorkerId(3);
        let first = connection_for(&channels, worker, addr).await.unwrap();
        let call = Call::start(&first, AUTHORITY, GENERATE, generate_request())
            .await
            .unwrap();
        // The GOAWAY reaches the client while this call streams; the call completes whole.
        assert_eq!(read_all(call).await.unwrap().len(), 10);
        let mut attempts = 0;
        let answer = loop {
            attempts += 1;
            let connection = connection_for(&channels, worker, addr).await.unwrap();
            match unary::<sglang_pb::HealthCheckResponse>(
                &connection,
                AUTHORITY,
                HEALTH,
                &sglang_pb::HealthCheckRequest {},
            )
            .await
            {
                Ok(answer) => break answer,
                // A call raced the GOAWAY on the old connection: refused, never run.
                Err(CallError::Refused(_)) if attempts < 3 => continue,
                Err(e) => panic!("attempt {attempts}: {e}"),
            }
        };
        assert!(answer.healthy);
    });
    assert_eq!(seen.connections.load(Ordering::SeqCst), 2);
}

#[test]
fn dropping_a_call_resets_its_stream_on_the_worker() {
    let (addr, seen) = serve(Script {
        max_streams: 100,
        goaway_after: 0,
    });
    let channels = std::cell::RefCell::new(Channels::new());
    block_on(async {
        let connection = connection_for(&channels, WorkerId(1), addr).await.unwrap();
        let mut call = Call::start(&connection, AUTHORITY, GENERATE, generate_request())
            .await
            .unwrap();
        assert!(call.message().await.unwrap().is_some());
        drop(call);
        // The reset reaches the server while the connection runs.
        for _ in 0..100 {
            if seen.resets.load(Ordering::SeqCst) == 1 {
                break;
            }
            monoio::time::sleep(Duration::from_millis(10)).await;
        }
    });
    assert_eq!(seen.resets.load(Ordering::SeqCst), 1);
    assert_eq!(seen.calls.load(Ordering::SeqCst), 1);
}
