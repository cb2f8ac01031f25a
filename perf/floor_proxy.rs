//! The floor under kvgate's proxy figures: the least an HTTP/1.1 proxy on monoio can do per
//! request, on the same ring setup as a kvgate data core (`IORING_SETUP_COOP_TASKRUN`, mimalloc).
//!
//! It reads a request whose body is framed by `Content-Length`, writes its bytes unchanged to an
//! upstream connection of its own (one per client connection, kept alive), reads the response
//! the same way and writes it back unchanged. A chunked response (an SSE stream) is relayed as
//! it arrives, each upstream read written to the client as it is, until the chunked body's end.
//! It parses no JSON, routes nothing, keeps no metrics, sets no timers and rewrites no header,
//! so a gateway built on this runtime can only come near its throughput, not pass it.
//! `scripts/bench-proxy.sh` runs it beside kvgate and nginx with `BENCH_FLOOR=1`, which makes
//! the ratio it reaches against nginx the ceiling of the ratio kvgate can reach on the same
//! host; `scripts/bench-streams.sh --floor` runs it beside kvgate for held SSE streams.
//!
//! Not a product: anything else (chunked requests, `Expect`, upgrades) closes the connection.
//!
//! Usage: `floor_proxy <listen addr> <upstream addr>...`, e.g.
//! `target/release/examples/floor_proxy 127.0.0.1:21002 127.0.0.1:21100`; with several
//! upstreams, each client connection takes the next one round robin.

use monoio::buf::IoBufMut;
use monoio::io::{AsyncReadRent, AsyncWriteRentExt};
use monoio::net::{TcpListener, TcpStream};
use std::net::SocketAddr;

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// Room for a request or response head and a small body before the buffer grows.
const BUFFER_START: usize = 16 * 1024;

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [listen, upstreams @ ..] = args.as_slice() else {
        eprintln!("usage: floor_proxy <listen addr> <upstream addr>...");
        std::process::exit(2);
    };
    if upstreams.is_empty() {
        eprintln!("usage: floor_proxy <listen addr> <upstream addr>...");
        std::process::exit(2);
    }
    let parse = |text: &str| -> SocketAddr {
        text.parse().unwrap_or_else(|error| {
            eprintln!("floor_proxy: {text:?} is not an address: {error}");
            std::process::exit(2)
        })
    };
    let listen = parse(listen);
    let upstreams: Vec<SocketAddr> = upstreams.iter().map(|text| parse(text)).collect();

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
        for upstream in upstreams.iter().cycle() {
            match listener.accept().await {
                Ok((client, _)) => {
                    let _ = client.set_nodelay(true);
                    monoio::spawn(serve(client, *upstream));
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
        let Some(Body::Length(length)) = request else {
            return;
        };
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
        let written;
        match response {
            Some(Body::Length(length)) => {
                buffer.truncate(length);
                (written, buffer) = client.write_all(buffer).await;
            }
            Some(Body::Chunked(head)) => {
                (written, buffer) = relay_chunked(stream, &mut client, buffer, head).await;
            }
            None => return,
        }
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

/// How much of a message `read_message` has in its buffer.
#[derive(Clone, Copy)]
enum Body {
    /// The whole message, this many bytes, head and body.
    Length(usize),
    /// A response's head of this many bytes, then (some of) a chunked body.
    Chunked(usize),
}

/// Reads one whole message into `buffer` (cleared first) and returns its length, or for a
/// chunked response its head (and whatever followed it in the same reads); `None` when the peer
/// closed, failed or sent something this floor does not relay.
async fn read_message(
    stream: &mut TcpStream,
    mut buffer: Vec<u8>,
    kind: Message,
) -> (Option<Body>, Vec<u8>) {
    buffer.clear();
    let mut length = None;
    loop {
        if length.is_none() {
            match message_length(&buffer, kind) {
                Framing::Whole(total) => length = Some(total),
                Framing::Chunked(head) => return (Some(Body::Chunked(head)), buffer),
                Framing::Incomplete => {}
                Framing::Unsupported => return (None, buffer),
            }
        }
        match length {
            Some(total) if buffer.len() >= total => return (Some(Body::Length(total)), buffer),
            _ => {}
        }
        let read;
        (read, buffer) = read_more(stream, buffer).await;
        if read.is_none() {
            return (None, buffer);
        }
    }
}

/// One read appended to `buffer` (grown first when less than 4 KiB is free); `None` at the
/// peer's close or an error.
async fn read_more(stream: &mut TcpStream, mut buffer: Vec<u8>) -> (Option<usize>, Vec<u8>) {
    if buffer.capacity() - buffer.len() < 4096 {
        buffer.reserve(buffer.capacity());
    }
    let filled = buffer.len();
    let (read, slice) = stream.read(buffer.slice_mut(filled..)).await;
    match read {
        Ok(0) | Err(_) => (None, slice.into_inner()),
        Ok(read) => (Some(read), slice.into_inner()),
    }
}

/// Relays a chunked response whose head (`head` bytes) and first body bytes are in `buffer`:
/// writes what is there, then each upstream read as it comes, until the body's last chunk and
/// trailer have passed. An error is the client's write failing or the upstream closing early.
async fn relay_chunked(
    upstream: &mut TcpStream,
    client: &mut TcpStream,
    mut buffer: Vec<u8>,
    head: usize,
) -> (std::io::Result<usize>, Vec<u8>) {
    let mut body = ChunkedEnd::default();
    let mut end = body.feed(&buffer[head..]).map(|at| head + at);
    loop {
        if let Some(end) = end {
            buffer.truncate(end);
        }
        let written;
        (written, buffer) = client.write_all(buffer).await;
        if written.is_err() || end.is_some() {
            return (written, buffer);
        }
        buffer.clear();
        let read;
        (read, buffer) = read_more(upstream, buffer).await;
        if read.is_none() {
            return (Err(std::io::ErrorKind::UnexpectedEof.into()), buffer);
        }
        end = body.feed(&buffer);
    }
}

/// Finds where a chunked body ends, fed its bytes in order: only the sizes and the final
/// chunk's trailer are read, the chunks' data is stepped over (and not checked).
#[derive(Debug, PartialEq)]
enum ChunkedEnd {
    /// In a size line: the size so far, and whether an extension (or the line's `\r`) began.
    Size { size: u64, past_digits: bool },
    /// Inside a chunk: this many bytes of data and its closing CRLF left.
    Data(u64),
    /// After the last chunk's size line: whether the trailer's current line is empty so far.
    Trailer { line_empty: bool },
    /// Past the end.
    Done,
}

impl Default for ChunkedEnd {
    fn default() -> Self {
        ChunkedEnd::Size {
            size: 0,
            past_digits: false,
        }
    }
}

impl ChunkedEnd {
    /// Feeds the body's next bytes; returns the offset in `bytes` just past the body's end,
    /// once it is in them. A size that overflows ends the body where it stands.
    fn feed(&mut self, bytes: &[u8]) -> Option<usize> {
        let mut at = 0;
        while at < bytes.len() {
            match self {
                ChunkedEnd::Size { size, past_digits } => {
                    let byte = bytes[at];
                    at += 1;
                    if byte == b'\n' {
                        *self = match *size {
                            0 => ChunkedEnd::Trailer { line_empty: true },
                            size => ChunkedEnd::Data(size.saturating_add(2)),
                        };
                    } else if !*past_digits {
                        match (byte as char).to_digit(16) {
                            Some(digit) => match size.checked_mul(16) {
                                Some(shifted) => *size = shifted + u64::from(digit),
                                None => {
                                    *self = ChunkedEnd::Done;
                                    return Some(at);
                                }
                            },
                            None => *past_digits = true,
                        }
                    }
                }
                ChunkedEnd::Data(left) => {
                    let step = (*left).min((bytes.len() - at) as u64);
                    at += step as usize;
                    *left -= step;
                    if *left == 0 {
                        *self = ChunkedEnd::default();
                    }
                }
                ChunkedEnd::Trailer { line_empty } => {
                    let byte = bytes[at];
                    at += 1;
                    if byte == b'\n' {
                        if *line_empty {
                            *self = ChunkedEnd::Done;
                            return Some(at);
                        }
                        *line_empty = true;
                    } else if byte != b'\r' {
                        *line_empty = false;
                    }
                }
                ChunkedEnd::Done => return Some(at),
            }
        }
        None
    }
}

enum Framing {
    /// The message is this many bytes, head and body.
    Whole(usize),
    /// A response with a chunked body, after a head of this many bytes.
    Chunked(usize),
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
            return match kind {
                Message::Response if header.value.eq_ignore_ascii_case(b"chunked") => {
                    Framing::Chunked(head)
                }
                _ => Framing::Unsupported,
            };
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

#[cfg(test)]
mod tests {
    use super::ChunkedEnd;

    const BODY: &[u8] =
        b"5\r\nhello\r\n1a;ext=1\r\nabcdefghijklmnopqrstuvwxyz\r\n0\r\nX-T: 1\r\n\r\nNEXT";

    #[test]
    fn a_chunked_body_ends_after_its_trailer_however_it_is_split() {
        let end = BODY.len() - b"NEXT".len();
        for split in 0..=BODY.len() {
            let mut body = ChunkedEnd::default();
            let found = match body.feed(&BODY[..split]) {
                Some(at) => Some(at),
                None => body.feed(&BODY[split..]).map(|at| split + at),
            };
            assert_eq!(found, Some(end), "split at {split}");
        }
    }

    #[test]
    fn a_chunked_body_without_its_last_chunk_has_not_ended() {
        let mut body = ChunkedEnd::default();
        assert_eq!(body.feed(b"5\r\nhello\r\n0\r\n"), None);
        assert_eq!(body, ChunkedEnd::Trailer { line_empty: true });
        assert_eq!(body.feed(b"\r\n"), Some(2));
    }
}
