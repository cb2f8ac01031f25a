//! The floor under kvgate's proxy figures: the least an HTTP/1.1 proxy on monoio can do per
//! request, on the same ring setup as a kvgate data core (`IORING_SETUP_COOP_TASKRUN`, mimalloc).
//!
//! It reads a request whose body is framed by `Content-Length`, writes its bytes unchanged to an
//! upstream connection of its own (one per client connection, kept alive), reads the response
//! the same way and writes it back unchanged. It parses no JSON, routes nothing, keeps no
//! metrics, sets no timers and rewrites no header, so a gateway built on this runtime can only
//! come near its throughput, not pass it. `scripts/bench-proxy.sh` runs it beside kvgate and
//! nginx with `BENCH_FLOOR=1`, which makes the ratio it reaches against nginx the ceiling of the
//! ratio kvgate can reach on the same host.
//!
//! Not a product: anything other than `Content-Length` framing (chunked bodies, `Expect`,
//! upgrades) closes the connection.
//!
//! Usage: `floor_proxy <listen addr> <upstream addr>`, e.g.
//! `target/release/examples/floor_proxy 127.0.0.1:21002 127.0.0.1:21100`.

use monoio::buf::IoBufMut;
use monoio::io::{AsyncReadRent, AsyncWriteRentExt};
use monoio::net::{TcpListener, TcpStream};
use std::net::SocketAddr;

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// Room for a request or response head and a small body before the buffer grows.
const BUFFER_START: usize = 16 * 1024;

fn main() {
    let mut args = std::env::args().skip(1);
    let (Some(listen), Some(upstream)) = (args.next(), args.next()) else {
        eprintln!("usage: floor_proxy <listen addr> <upstream addr>");
        std::process::exit(2);
    };
    let parse = |text: &str| -> SocketAddr {
        text.parse().unwrap_or_else(|error| {
            eprintln!("floor_proxy: {text:?} is not an address: {error}");
            std::process::exit(2)
        })
    };
    let (listen, upstream) = (parse(&listen), parse(&upstream));

    let mut ring = io_uring::IoUring::builder();
    ring.setup_coop_taskrun();
    let runtime = monoio::RuntimeBuilder::<monoio::IoUringDriver>::new()
        .with_entries(1024)
        .uring_builder(ring)
        .build();
    let mut runtime = runtime.unwrap_or_else(|error| {
        eprintln!("floor_proxy: no io_uring runtime: {error}");
        std::process::exit(1)
    });
    runtime.block_on(async move {
        let listener = TcpListener::bind(listen).unwrap_or_else(|error| {
            eprintln!("floor_proxy: cannot listen on {listen}: {error}");
            std::process::exit(1)
        });
        loop {
            match listener.accept().await {
                Ok((client, _)) => {
                    let _ = client.set_nodelay(true);
                    monoio::spawn(serve(client, upstream));
                }
                Err(error) => eprintln!("floor_proxy: accept: {error}"),
            }
        }
    });
}

/// Relays one client connection's requests, in order, over an upstream connection of its own.
async fn serve(mut client: TcpStream, upstream_addr: SocketAddr) {
    let mut upstream: Option<TcpStream> = None;
    let mut buffer = Vec::with_capacity(BUFFER_START);
    loop {
        let request;
        (request, buffer) = read_message(&mut client, buffer, Message::Request).await;
        let Some(length) = request else { return };
        let stream = match upstream.as_mut() {
            Some(stream) => stream,
            None => match TcpStream::connect(upstream_addr).await {
                Ok(stream) => {
                    let _ = stream.set_nodelay(true);
                    upstream.insert(stream)
                }
                Err(_) => return,
            },
        };
        buffer.truncate(length);
        let written;
        (written, buffer) = stream.write_all(buffer).await;
        if written.is_err() {
            return;
        }
        let response;
        (response, buffer) = read_message(stream, buffer, Message::Response).await;
        let Some(length) = response else { return };
        buffer.truncate(length);
        let written;
        (written, buffer) = client.write_all(buffer).await;
        if written.is_err() {
            return;
        }
        // wrk does not pipeline: whatever followed the message would be lost here, which is
        // why a pipelining client is outside this floor's job.
        buffer.clear();
    }
}

#[derive(Clone, Copy)]
enum Message {
    Request,
    Response,
}

/// Reads one whole message into `buffer` (cleared first) and returns its length, or `None` when
/// the peer closed, failed or sent something other than a `Content-Length` message.
async fn read_message(
    stream: &mut TcpStream,
    mut buffer: Vec<u8>,
    kind: Message,
) -> (Option<usize>, Vec<u8>) {
    buffer.clear();
    let mut length = None;
    loop {
        if length.is_none() {
            match message_length(&buffer, kind) {
                Framing::Whole(total) => length = Some(total),
                Framing::Incomplete => {}
                Framing::Unsupported => return (None, buffer),
            }
        }
        match length {
            Some(total) if buffer.len() >= total => return (Some(total), buffer),
            _ => {}
        }
        if buffer.capacity() - buffer.len() < 4096 {
            buffer.reserve(buffer.capacity());
        }
        let filled = buffer.len();
        let read;
        let slice;
        (read, slice) = stream.read(buffer.slice_mut(filled..)).await;
        buffer = slice.into_inner();
        match read {
            Ok(0) | Err(_) => return (None, buffer),
            Ok(_) => {}
        }
    }
}

enum Framing {
    /// The message is this many bytes, head and body.
    Whole(usize),
    Incomplete,
    Unsupported,
}

fn message_length(bytes: &[u8], kind: Message) -> Framing {
    let mut headers = [httparse::EMPTY_HEADER; 32];
    let parsed = match kind {
        Message::Request => httparse::Request::new(&mut headers).parse(bytes),
        Message::Response => httparse::Response::new(&mut headers).parse(bytes),
    };
    let head = match parsed {
        Ok(httparse::Status::Complete(head)) => head,
        Ok(httparse::Status::Partial) => return Framing::Incomplete,
        Err(_) => return Framing::Unsupported,
    };
    let mut body = 0;
    for header in headers.iter().take_while(|header| !header.name.is_empty()) {
        if header.name.eq_ignore_ascii_case("transfer-encoding") {
            return Framing::Unsupported;
        }
        if header.name.eq_ignore_ascii_case("content-length") {
            match std::str::from_utf8(header.value)
                .ok()
                .and_then(|value| value.trim().parse::<usize>().ok())
            {
                Some(value) => body = value,
                None => return Framing::Unsupported,
            }
        }
    }
    Framing::Whole(head + body)
}
