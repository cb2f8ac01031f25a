//! One HTTP/2 connection to a gRPC worker, multiplexing many calls, driven by a task on the
//! owning thread's runtime. Owns [`Connection`] (a handle: cheap to clone, one per call) and
//! the driver task, which polls `h2`'s connection and PINGs the worker every
//! `GRPC_KEEPALIVE_INTERVAL` while calls are in flight; a PING unanswered within
//! `GRPC_KEEPALIVE_TIMEOUT` drops the connection, which ends its calls with an error.
//!
//! A connection is *usable* until it closes or the worker sends GOAWAY; after a GOAWAY its
//! calls already running finish (h2 drains them) while new calls go to another connection. It
//! has *room* while its open calls are fewer than the worker's `SETTINGS_MAX_CONCURRENT_STREAMS`
//! (`grpc::channels` opens a second connection when the first has none).

use std::cell::Cell;
use std::net::SocketAddr;
use std::rc::Rc;
use std::sync::Arc;

use bytes::Bytes;
use h2::client::{ResponseFuture, SendRequest};
use h2::{Ping, PingPong, SendStream};

use super::io::{self, GrpcIo};
use crate::limits::{
    GRPC_CONNECTION_WINDOW_BYTES, GRPC_KEEPALIVE_INTERVAL, GRPC_KEEPALIVE_TIMEOUT,
    GRPC_MESSAGE_BYTES_MAX, GRPC_STREAM_WINDOW_BYTES,
};

/// Why a connection could not be opened.
#[derive(Debug, thiserror::Error)]
pub enum OpenError {
    /// The TCP connect failed or timed out.
    #[error("connect: {0}")]
    Connect(#[from] std::io::Error),
    /// The HTTP/2 preface could not be sent.
    #[error("HTTP/2 handshake: {0}")]
    Handshake(#[from] h2::Error),
}

/// What the handles and the driver task share.
#[derive(Debug, Default)]
struct ConnectionState {
    /// The driver ended: the connection is gone.
    closed: Cell<bool>,
    /// The worker sent GOAWAY (seen as a refused new call): no new calls.
    going_away: Cell<bool>,
    /// Calls open on the connection (each [`OpenCall`] counts one until dropped).
    calls: Cell<usize>,
}

/// A handle on one HTTP/2 connection.
#[derive(Clone, Debug)]
pub struct Connection {
    send: SendRequest<Bytes>,
    state: Rc<ConnectionState>,
    /// `Bearer <--api-key>`, sent as `authorization` metadata on every call (as the HTTP
    /// probes send it), or `None`.
    authorization: Option<http::HeaderValue>,
}

/// One call's slot on its connection: counts it open until dropped.
#[derive(Debug)]
pub struct OpenCall {
    state: Rc<ConnectionState>,
}

impl Drop for OpenCall {
    fn drop(&mut self) {
        self.state
            .calls
            .set(self.state.calls.get().saturating_sub(1));
    }
}

impl Connection {
    /// Connects to `addr`, sends the HTTP/2 preface and starts the driver task on this
    /// thread's runtime. Every call on it sends `bearer` (the workers' API key), if any.
    pub async fn open(addr: SocketAddr, bearer: Option<Arc<str>>) -> Result<Connection, OpenError> {
        // A key that is no header value was refused when the flag was read; never sent broken.
        let authorization = bearer
            .and_then(|key| http::HeaderValue::try_from(format!("Bearer {key}")).ok())
            .map(|mut value| {
                value.set_sensitive(true);
                value
            });
        let io = io::connect(addr).await?;
        let (send, mut connection) = h2::client::Builder::new()
            .initial_window_size(GRPC_STREAM_WINDOW_BYTES)
            .initial_connection_window_size(GRPC_CONNECTION_WINDOW_BYTES)
            .max_send_buffer_size(GRPC_MESSAGE_BYTES_MAX)
            .enable_push(false)
            .handshake::<GrpcIo, Bytes>(io)
            .await?;
        let state = Rc::new(ConnectionState::default());
        let ping = connection.ping_pong();
        monoio::spawn(drive(connection, ping, state.clone()));
        Ok(Connection {
            send,
            state,
            authorization,
        })
    }

    /// The `authorization` metadata its calls send, if any.
    pub fn authorization(&self) -> Option<&http::HeaderValue> {
        self.authorization.as_ref()
    }

    /// Whether new calls may start here (open, and no GOAWAY seen).
    pub fn is_usable(&self) -> bool {
        !self.state.closed.get() && !self.state.going_away.get()
    }

    /// Whether a new call would stay within the worker's concurrent-stream limit.
    pub fn has_room(&self) -> bool {
        self.state.calls.get() < self.send.current_max_send_streams()
    }

    /// Calls open on the connection.
    pub fn calls(&self) -> usize {
        self.state.calls.get()
    }

    /// Whether both handles are on the same connection.
    pub fn same(&self, other: &Connection) -> bool {
        Rc::ptr_eq(&self.state, &other.state)
    }

    /// Opens a stream for `request` (its HEADERS sent once the connection has a stream free).
    /// A refusal after a GOAWAY marks the connection as going away.
    pub async fn start(
        &self,
        request: http::Request<()>,
    ) -> Result<(ResponseFuture, SendStream<Bytes>, OpenCall), h2::Error> {
        let result = async {
            let mut send = self.send.clone().ready().await?;
            send.send_request(request, false)
        }
        .await;
        match result {
            Ok((response, stream)) => {
                self.state.calls.set(self.state.calls.get() + 1);
                let call = OpenCall {
                    state: self.state.clone(),
                };
                Ok((response, stream, call))
            }
            Err(e) => {
                if e.is_go_away() || e.is_io() || e.reason() == Some(h2::Reason::REFUSED_STREAM) {
                    self.state.going_away.set(true);
                }
                Err(e)
            }
        }
    }

    /// Marks the connection as refusing new calls (its worker said GOAWAY, or a call on it
    /// found it broken).
    pub fn retire(&self) {
        self.state.going_away.set(true);
    }
}

/// The driver task: polls the connection until it ends, or until the keep-alive finds the
/// worker silent (then the connection is dropped, which fails its calls).
async fn drive(
    connection: h2::client::Connection<GrpcIo, Bytes>,
    ping: Option<PingPong>,
    state: Rc<ConnectionState>,
) {
    let connection = std::pin::pin!(connection);
    let keep_alive = std::pin::pin!(keep_alive(ping, state.clone()));
    let _ = futures::future::select(connection, keep_alive).await;
    state.closed.set(true);
}

/// PINGs the worker every `GRPC_KEEPALIVE_INTERVAL` while calls are open; returns when one is
/// not answered within `GRPC_KEEPALIVE_TIMEOUT`. Idle connections are not pinged: grpc-core
/// servers count pings without calls as abuse (GOAWAY `too_many_pings`).
async fn keep_alive(ping: Option<PingPong>, state: Rc<ConnectionState>) {
    let Some(mut ping) = ping else {
        return std::future::pending().await;
    };
    loop {
        monoio::time::sleep(GRPC_KEEPALIVE_INTERVAL).await;
        if state.calls.get() == 0 {
            continue;
        }
        let answered = monoio::time::timeout(GRPC_KEEPALIVE_TIMEOUT, ping.ping(Ping::opaque()));
        if !matches!(answered.await, Ok(Ok(_))) {
            return;
        }
    }
}
