//! The client side of a data core's connections, as every module of `http` sees it: the
//! connection ([`Downstream`]: socket, buffers, the routing scratch), one complete request
//! ([`Request`]), how it was answered ([`Answered`]), the one ring write that sends bytes to
//! the client ([`write_to_client`]), and the one error answer ([`answer_error`]: an
//! `ErrorKind`'s JSON body, status and keep-or-close decision). `server` reads requests into these; `proxy` and `admin`
//! answer them. While a routed request is proxied its connection is split in two:
//! [`Forwarded`] (the request, in the read buffer, and its routing scratch) and [`ClientSide`]
//! (the socket and the write buffer the response goes through). No errors of its own: a failed
//! write is `false`, and the caller closes.

use std::ops::Range;
use std::time::Instant;

use super::buffers::SpareBuffers;
use crate::error::{write_error_body, ErrorKind};
use crate::limits::DOWNSTREAM_WRITE_TIMEOUT;
use crate::net::codec::{self, Connection, RequestHead};
use crate::net::socket::Socket;
use crate::policy::Prepared;
use crate::request::id::RequestId;
use crate::request::Endpoint;

/// How a request was answered: the status (for metrics) and what becomes of the connection.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Answered {
    /// The status the client got (or would have got, when it was gone).
    pub status: u16,
    /// Whether the connection serves another request.
    pub connection: Connection,
}

/// A client connection and its buffers.
#[derive(Debug)]
pub struct Downstream {
    /// The socket.
    pub socket: Socket,
    /// Bytes read from the client; requests are parsed in place.
    pub read_buf: Vec<u8>,
    /// Bytes being written to the client.
    pub write_buf: Vec<u8>,
    /// The request prepared for routing (reused from one request to the next).
    pub prepared: PreparedSlot,
    /// Body bytes charged to the core's body budget for the current request.
    pub(super) body_charged_bytes: usize,
    /// Bytes at the front of `read_buf` that belong to the request being served (0 once a
    /// committed stream let go of them early).
    pub request_end: usize,
    /// The current request's id (`x-request-id`), in a buffer the connection reuses.
    pub request_id: RequestId,
}

/// A connection's routing scratch ([`Prepared`]), boxed: allocated by the connection's first
/// routed request and reused by the next, and dropped when a response commits to a stream, so
/// that a connection holding a stream for minutes does not carry it (904 bytes, and the buffers
/// it grew) in its task.
#[derive(Debug, Default)]
pub struct PreparedSlot(Option<Box<Prepared>>);

impl PreparedSlot {
    /// The scratch, allocated if the connection has none.
    pub fn get(&mut self) -> &mut Prepared {
        self.0.get_or_insert_with(Box::default)
    }

    /// Drops the scratch: the request it prepared is committed and will not be routed again.
    pub fn release(&mut self) {
        self.0 = None;
    }

    /// Bounds what a connection keeps between requests ([`Prepared::shed_large_buffers`]).
    pub(super) fn shed_large_buffers(&mut self) {
        if let Some(prepared) = &mut self.0 {
            prepared.shed_large_buffers();
        }
    }
}

/// A complete request: its head and body, both inside `read_buf` (a chunked body de-chunked
/// in place).
#[derive(Clone, Debug)]
pub struct Request {
    /// The parsed head (spans index `read_buf`).
    pub head: RequestHead,
    /// Where the body lies in `read_buf`.
    pub body: Range<usize>,
    /// Bytes of `read_buf` this request used.
    pub(super) end: usize,
}

impl Request {
    /// The body bytes.
    pub fn body<'d>(&self, down_read_buf: &'d [u8]) -> &'d [u8] {
        &down_read_buf[self.body.clone()]
    }
}

/// A routed request as its attempts forward it: the client's read buffer itself, so a large
/// body is written from where it was read (the buffer is lent to the write and comes back), and
/// the connection's routing scratch, which every attempt selects from.
#[derive(Debug)]
pub struct Forwarded<'a> {
    /// The request's head (its spans index `read_buf`).
    pub head: &'a RequestHead,
    /// The client's read buffer: the head's spans and `body` index it.
    pub read_buf: &'a mut Vec<u8>,
    /// Where the body lies in `read_buf`.
    pub body: Range<usize>,
    /// How many bytes at the front of `read_buf` are this request's.
    pub request_end: &'a mut usize,
    /// The request prepared for routing.
    pub prepared: &'a mut PreparedSlot,
    /// The request's id: the worker gets it when the client did not send `x-request-id`.
    pub request_id: &'a RequestId,
}

impl Forwarded<'_> {
    /// Lets go of the request once its response is committed to the client (no attempt will
    /// send it again): its bytes leave the client's read buffer now instead of when a stream
    /// that may last minutes ends, the emptied buffer is lent to the core, and the routing
    /// scratch is dropped. The head's spans and `body` are stale afterwards.
    pub fn release(&mut self, spare: &mut SpareBuffers) {
        self.read_buf.drain(..std::mem::take(self.request_end));
        spare.lend(self.read_buf);
        self.prepared.release();
    }
}

/// The client half of a connection while its request is proxied, split from its read buffer
/// (which holds the request): where the response goes.
#[derive(Debug)]
pub struct ClientSide<'a> {
    /// The client's socket.
    pub socket: &'a mut Socket,
    /// The response's head and the bytes relayed through the gateway's own buffer.
    pub write_buf: &'a mut Vec<u8>,
    /// The client's HTTP/1.x minor version (an HTTP/1.0 client gets no chunked framing).
    pub version_minor: u8,
    /// What the client asked of its connection.
    pub connection: Connection,
    /// The path's metrics slot.
    pub endpoint: Endpoint,
    /// When the request was read: the time to first byte is observed when the response head
    /// is written.
    pub started: Instant,
    /// The request's id, which the response head carries.
    pub request_id: &'a RequestId,
}

/// Writes the JSON error answer for `kind` (unless the client is gone): the connection stays
/// as the request asked only when `kind` allows it.
pub async fn answer_error(
    down: &mut Downstream,
    kind: ErrorKind,
    connection: Connection,
) -> Answered {
    let connection = connection.and(Connection::keep_if(kind.keeps_connection()));
    let answered = Answered {
        status: kind.status(),
        connection,
    };
    if !kind.answers_client() {
        return answered;
    }
    let mut body = Vec::with_capacity(128);
    write_error_body(&mut body, kind);
    down.write_buf.clear();
    codec::write_local_response_with_id(
        &mut down.write_buf,
        kind.status(),
        "application/json",
        &body,
        connection,
        down.request_id.header_line(),
    );
    write_to_client(&mut down.socket, &mut down.write_buf, 0).await;
    answered
}

/// Writes `buf[from..]` to the client through a ring write, within `DOWNSTREAM_WRITE_TIMEOUT`:
/// the ring holds `buf` meanwhile, and it is put back. Returns whether it all went out.
pub async fn write_to_client(socket: &mut Socket, buf: &mut Vec<u8>, from: usize) -> bool {
    let deadline = Instant::now() + DOWNSTREAM_WRITE_TIMEOUT;
    let len = buf.len();
    let (result, written) = socket
        .write_range(std::mem::take(buf), from..len, deadline)
        .await;
    *buf = written;
    result.is_ok()
}
