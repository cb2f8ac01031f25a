//! TLS on a socket: a rustls connection (`rustls::Connection`, server or client side) driven by
//! the socket's readiness and non-waiting syscalls. `Socket` carries one when its connection is
//! encrypted (a client of `--tls-cert-path`, an `https://` worker) and hands each operation here;
//! a plain socket never reaches this module.
//!
//! Why readiness here, not the ring's owned-buffer reads: rustls takes ciphertext through
//! `io::Read` into a buffer of its own and decrypts it in place. A `recv` straight into that
//! buffer, once the socket is readable, moves each byte once and lends no buffer to the kernel,
//! so a wait cut by a deadline or a stop has no operation in flight to cancel (dropping the poll
//! cancels it). The `monoio-rustls` crate wraps rustls behind monoio's `AsyncReadRent` with a
//! second pair of buffers, and has no cancelable, non-waiting or readiness operations, which
//! every caller of `Socket` uses; this adapter is what `Socket` needs and no more.
//!
//! Owns `NowIo` (the kernel's side for rustls, never waiting), the handshake, reads (waiting,
//! or now), writes and the worker-side client configuration ([`upstream_config`]). Errors are
//! `io::Error`s as `Socket`'s are: a missed deadline is `TimedOut`, a TLS failure (bad record,
//! failed handshake, unknown certificate) `InvalidData` after its alert was sent when the socket
//! took it; a peer that closes without `close_notify` reads as the end of the stream, as a plain
//! socket's close does (HTTP's own framing tells a cut body from a whole one).

use std::future::Future;
use std::io::{self, BufRead, Write};
use std::os::unix::io::{AsRawFd, RawFd};
use std::sync::{Arc, OnceLock};
use std::time::Instant;

use monoio::net::TcpStream;
use rustls::pki_types::ServerName;
use rustls::{ClientConfig, ClientConnection, Connection, ServerConfig, ServerConnection};

use super::socket::{Cut, Watched};
use crate::config::tls as tls_flags;
use crate::limits::{TLS_PENDING_BYTES_MAX, TLS_READS_PER_CALL_MAX};

/// The configuration of every TLS connection to `https://` workers, fixed at start
/// ([`set_upstream_config`]); the system's roots when nothing was set.
static UPSTREAM_CONFIG: OnceLock<Arc<ClientConfig>> = OnceLock::new();

/// Fixes the configuration of TLS connections to workers (from `--ca-cert-paths` and
/// `--client-cert-path`), once, at start, before any core connects; `false` when one was fixed
/// already (it stays). A process-wide value because every side that connects to workers (the
/// data cores' proxy, the control core's probes, the admin API's admission check) uses the same
/// one, and rustls' session cache in it is what lets a new connection resume.
pub fn set_upstream_config(config: Arc<ClientConfig>) -> bool {
    UPSTREAM_CONFIG.set(config).is_ok()
}

/// The configuration of TLS connections to workers (see [`set_upstream_config`]).
pub fn upstream_config() -> Arc<ClientConfig> {
    let system_roots = || {
        let config = tls_flags::upstream_config(tls_flags::system_roots(), None);
        // Without a client certificate nothing can fail: the provider has the default versions.
        Arc::new(config.unwrap_or_else(|e| unreachable!("{e}")))
    };
    UPSTREAM_CONFIG.get_or_init(system_roots).clone()
}

/// A server session for a connection just accepted.
pub fn server_session(config: &Arc<ServerConfig>) -> io::Result<Box<Connection>> {
    let mut session = ServerConnection::new(config.clone()).map_err(invalid_data)?;
    session.set_buffer_limit(Some(TLS_PENDING_BYTES_MAX));
    Ok(Box::new(Connection::Server(session)))
}

/// A client session to the worker named `host` (a DNS name or an IP literal, which its
/// certificate must name).
pub fn client_session(host: &str) -> io::Result<Box<Connection>> {
    let name = ServerName::try_from(host).map_err(invalid_data)?.to_owned();
    let mut session = ClientConnection::new(upstream_config(), name).map_err(invalid_data)?;
    session.set_buffer_limit(Some(TLS_PENDING_BYTES_MAX));
    Ok(Box::new(Connection::Client(session)))
}

fn invalid_data(e: impl std::error::Error + Send + Sync + 'static) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, e)
}

fn timed_out() -> io::Error {
    io::Error::from(io::ErrorKind::TimedOut)
}

/// The kernel's side of a connection for rustls, never waiting: reads are `recv` and writes
/// `sendmsg` with `MSG_DONTWAIT` (a descriptor io_uring serves stays in blocking mode), so an
/// empty receive queue or a full send buffer is `WouldBlock`. Lives for one call, while the
/// socket that owns the descriptor is borrowed.
struct NowIo(RawFd);

impl io::Read for NowIo {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        // SAFETY: `buf` is valid for writes of `buf.len()` bytes and exclusively borrowed; the
        // descriptor stays open while the socket lending it is borrowed (a `NowIo` never
        // outlives the call that made it); MSG_DONTWAIT makes the call return at once.
        let read = unsafe {
            libc::recv(
                self.0,
                buf.as_mut_ptr().cast(),
                buf.len(),
                libc::MSG_DONTWAIT,
            )
        };
        usize::try_from(read).map_err(|_| io::Error::last_os_error())
    }
}

impl io::Write for NowIo {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.write_vectored(&[io::IoSlice::new(buf)])
    }

    /// One `sendmsg` for all of rustls' pending records (it hands over up to 64 at once).
    fn write_vectored(&mut self, bufs: &[io::IoSlice<'_>]) -> io::Result<usize> {
        // SAFETY: an all-zero `msghdr` is a valid one (null pointers with zero lengths: no
        // address, no control data); the vector is set below.
        let mut message: libc::msghdr = unsafe { std::mem::zeroed() };
        // `IoSlice` is ABI-compatible with `iovec` on Unix (std's documented guarantee);
        // `sendmsg` only reads through the pointer, whatever its mutability says.
        message.msg_iov = bufs.as_ptr().cast_mut().cast();
        message.msg_iovlen = bufs.len().min(libc::UIO_MAXIOV as usize) as _;
        // SAFETY: `message` points at `msg_iovlen` valid `iovec`s, each valid for reads of its
        // length while `bufs` is borrowed; the descriptor stays open (as for `read`);
        // MSG_DONTWAIT returns at once, MSG_NOSIGNAL turns a closed peer into EPIPE.
        let sent =
            unsafe { libc::sendmsg(self.0, &message, libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL) };
        usize::try_from(sent).map_err(|_| io::Error::last_os_error())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// Runs the handshake to its end, by `deadline`. The server's last flight (and its TLS 1.3
/// session tickets) is sent before it returns.
pub async fn handshake(
    stream: &TcpStream,
    tls: &mut Connection,
    deadline: Instant,
) -> io::Result<()> {
    let fd = stream.as_raw_fd();
    // One timer for every wait (armed at the first).
    let mut stop = std::pin::pin!(super::socket::at_deadline(deadline));
    // Bounded by the deadline: each pass moves bytes or waits for the socket.
    loop {
        match send_pending(fd, tls) {
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                wait(stream.writable(false), stop.as_mut()).await?;
                continue;
            }
            sent => sent?,
        }
        if !tls.is_handshaking() {
            return Ok(());
        }
        match tls.read_tls(&mut NowIo(fd)) {
            Ok(0) => return Err(io::Error::from(io::ErrorKind::UnexpectedEof)),
            Ok(_) => process(fd, tls)?,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                wait(stream.readable(false), stop.as_mut()).await?;
            }
            Err(e) => return Err(e),
        }
    }
}

/// Decrypts what `read_tls` brought; a TLS failure sends its alert (when the socket takes it)
/// and becomes `InvalidData`.
fn process(fd: RawFd, tls: &mut Connection) -> io::Result<()> {
    match tls.process_new_packets() {
        Ok(_) => Ok(()),
        Err(e) => {
            let _ = tls.write_tls(&mut NowIo(fd));
            Err(invalid_data(e))
        }
    }
}

/// Waits for `ready` (the socket's readiness) unless `stop` comes first: `Ok(None)` when it was
/// `Cut::Stop`, `TimedOut` for `Cut::Deadline`.
async fn wait(
    ready: impl Future<Output = io::Result<()>>,
    stop: impl Future<Output = Cut> + Unpin,
) -> io::Result<Option<()>> {
    monoio::select! {
        ready = ready => ready.map(Some),
        cut = stop => match cut {
            Cut::Deadline => Err(timed_out()),
            Cut::Stop => Ok(None),
        },
    }
}

/// Sends every record rustls has ready as far as the socket takes them now: `WouldBlock` when
/// some are left (the caller waits for the socket to drain, then sends again).
fn send_pending(fd: RawFd, tls: &mut Connection) -> io::Result<()> {
    // Bounded: each pass sends at least one byte or returns.
    while tls.wants_write() {
        if tls.write_tls(&mut NowIo(fd))? == 0 {
            return Err(io::Error::from(io::ErrorKind::WriteZero));
        }
    }
    Ok(())
}

/// Sends what rustls has ready as far as the socket takes it now (a reply rustls owes the peer
/// after a read: a key update, an alert); the rest goes with the next write.
fn flush_now(fd: RawFd, tls: &mut Connection) {
    while tls.wants_write() {
        match tls.write_tls(&mut NowIo(fd)) {
            Ok(n) if n > 0 => {}
            _ => return,
        }
    }
}

/// Moves decrypted bytes into `buf`'s spare capacity (never past it: what a read may hold is the
/// caller's to bound). `Ok(0)` at the end of the stream (the peer's `close_notify`, or its close
/// without one), `WouldBlock` when nothing is decrypted yet.
fn take_plaintext(tls: &mut Connection, buf: &mut Vec<u8>) -> io::Result<usize> {
    let room = buf.capacity() - buf.len();
    debug_assert!(room > 0, "a read needs room");
    let mut reader = tls.reader();
    let mut taken = 0;
    // Bounded by `room`: each pass takes at least one byte or stops.
    while taken < room {
        let chunk = match reader.fill_buf() {
            Ok(chunk) => chunk,
            Err(_) if taken > 0 => break,
            Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return Ok(0),
            Err(e) => return Err(e),
        };
        if chunk.is_empty() {
            // `close_notify` came: the end, once what came before it is taken.
            break;
        }
        let n = chunk.len().min(room - taken);
        buf.extend_from_slice(&chunk[..n]);
        reader.consume(n);
        taken += n;
    }
    Ok(taken)
}

/// Reads what the kernel holds now and appends the plaintext to `buf` (room made by the caller):
/// how many bytes, 0 at the end of the stream, `WouldBlock` when no plaintext is there yet
/// (nothing arrived, half a record, or records without data).
pub fn read_now(stream: &TcpStream, tls: &mut Connection, buf: &mut Vec<u8>) -> io::Result<usize> {
    let fd = stream.as_raw_fd();
    for _ in 0..TLS_READS_PER_CALL_MAX {
        match take_plaintext(tls, buf) {
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
            taken => return taken,
        }
        // 0 (the kernel's end of stream) is not returned from here: `take_plaintext` says
        // whether it came after `close_notify` or cut the stream, on the next pass.
        tls.read_tls(&mut NowIo(fd))?;
        process(fd, tls)?;
        flush_now(fd, tls);
    }
    Err(io::Error::from(io::ErrorKind::WouldBlock))
}

/// Whether a read would return at once: plaintext is decrypted and waiting, or the stream ended.
pub fn has_plaintext(tls: &mut Connection) -> bool {
    match tls.reader().fill_buf() {
        Ok(_) => true,
        Err(e) => e.kind() != io::ErrorKind::WouldBlock,
    }
}

/// Says the connection is closing (`close_notify`), as far as the socket takes it now: a peer
/// reading to the end of the stream then sees a clean end, not a cut.
/// A handshake that did not finish gets nothing: the peer may be anyone.
pub fn close_now(stream: &TcpStream, tls: &mut Connection) {
    if tls.is_handshaking() {
        return;
    }
    tls.send_close_notify();
    let _ = send_pending(stream.as_raw_fd(), tls);
}

/// `Socket::read_more_unless` on a TLS connection: appends plaintext to `buf` (room for `spare`
/// more made first), waiting for the socket's readiness until `stop` cuts the wait.
pub async fn read_more_unless(
    stream: &TcpStream,
    tls: &mut Connection,
    mut buf: Vec<u8>,
    spare: usize,
    mut stop: impl Future<Output = Cut> + Unpin,
) -> (Watched, Vec<u8>) {
    if buf.capacity() - buf.len() < spare.max(1) {
        buf.reserve(spare.max(1));
    }
    // Bounded by `stop`: each pass reads or waits for the socket.
    loop {
        match read_now(stream, tls, &mut buf) {
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
            read => return (Watched::Read(read), buf),
        }
        match wait(stream.readable(false), &mut stop).await {
            Ok(Some(())) => {}
            Ok(None) => return (Watched::Stopped, buf),
            Err(e) => return (Watched::Read(Err(e)), buf),
        }
    }
}

/// `Socket::write_range` on a TLS connection: encrypts `bytes` (at most `TLS_PENDING_BYTES_MAX`
/// at a time) and sends the records by `deadline`. The first records go out before the call
/// first yields when the socket takes them, as a plain socket's `write_now` would.
pub async fn write_all(
    stream: &TcpStream,
    tls: &mut Connection,
    mut bytes: &[u8],
    deadline: Instant,
) -> io::Result<()> {
    let fd = stream.as_raw_fd();
    // One timer for every wait (armed at the first): a connection's task stays small.
    let mut stop = std::pin::pin!(super::socket::at_deadline(deadline));
    // Bounded by the deadline: each pass sends records, waits for the socket to drain, or
    // encrypts at least one byte (rustls' buffer is empty once its records are sent).
    loop {
        match send_pending(fd, tls) {
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                wait(stream.writable(false), stop.as_mut()).await?;
                continue;
            }
            sent => sent?,
        }
        if bytes.is_empty() {
            return Ok(());
        }
        let taken = tls.writer().write(bytes)?;
        if taken == 0 {
            return Err(io::Error::from(io::ErrorKind::WriteZero));
        }
        bytes = &bytes[taken..];
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::net::socket::Socket;
    use rustls::pki_types::PrivatePkcs8KeyDer;
    use std::io::Read;
    use std::net::SocketAddr;
    use std::time::Duration;

    fn runtime() -> monoio::FusionRuntime<
        monoio::time::TimeDriver<monoio::IoUringDriver>,
        monoio::time::TimeDriver<monoio::LegacyDriver>,
    > {
        monoio::RuntimeBuilder::<monoio::FusionDriver>::new()
            .enable_timer()
            .build()
            .unwrap()
    }

    fn provider() -> Arc<rustls::crypto::CryptoProvider> {
        Arc::new(rustls::crypto::aws_lc_rs::default_provider())
    }

    /// A server configuration for `localhost` and a client one that trusts it.
    fn configs() -> (Arc<ServerConfig>, Arc<ClientConfig>) {
        let made = rcgen::generate_simple_self_signed(vec!["localhost".into()]).unwrap();
        let cert = made.cert.der().clone();
        let key = PrivatePkcs8KeyDer::from(made.signing_key.serialize_der());
        let server = ServerConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_no_client_auth()
            .with_single_cert(vec![cert.clone()], key.into())
            .unwrap();
        let mut roots = rustls::RootCertStore::empty();
        roots.add(cert).unwrap();
        let client = ClientConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_root_certificates(roots)
            .with_no_client_auth();
        (Arc::new(server), Arc::new(client))
    }

    /// A blocking rustls client on its own thread, connected to `addr`, running `talk`.
    fn client<T: Send + 'static>(
        addr: SocketAddr,
        config: Arc<ClientConfig>,
        talk: impl FnOnce(&mut rustls::StreamOwned<ClientConnection, std::net::TcpStream>) -> T
            + Send
            + 'static,
    ) -> std::thread::JoinHandle<T> {
        std::thread::spawn(move || {
            let tcp = std::net::TcpStream::connect(addr).unwrap();
            tcp.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
            let name = ServerName::try_from("localhost").unwrap();
            let session = ClientConnection::new(config, name).unwrap();
            let mut stream = rustls::StreamOwned::new(session, tcp);
            talk(&mut stream)
        })
    }

    /// A socket accepted on a fresh loopback port, with `connect` run against that port.
    async fn accept<T>(connect: impl FnOnce(SocketAddr) -> T) -> (Socket, T) {
        let listener = monoio::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let peer = connect(listener.local_addr().unwrap());
        let (stream, _) = listener.accept().await.unwrap();
        (Socket::new(stream), peer)
    }

    fn soon() -> Instant {
        Instant::now() + Duration::from_secs(10)
    }

    #[test]
    fn bytes_cross_a_tls_socket_both_ways_whole_and_in_order() {
        let (server, client_config) = configs();
        // Larger than rustls' pending limit and many records: the vectored sends and the
        // write loop carry it in order, and reads gather it whole.
        let payload: Vec<u8> = (0..200_000u32).map(|i| (i % 251) as u8).collect();
        let expected = payload.clone();
        runtime().block_on(async move {
            let (mut socket, peer) = accept(|addr| {
                client(addr, client_config, move |stream| {
                    stream.write_all(b"ping").unwrap();
                    let mut back = vec![0u8; 200_000];
                    stream.read_exact(&mut back).unwrap();
                    back
                })
            })
            .await;
            socket.accept_tls(&server, soon()).await.unwrap();
            assert!(socket.is_tls());
            let (read, buf) = socket.read_more(Vec::new(), 64, soon()).await;
            assert!(read.unwrap() > 0);
            assert_eq!(buf, b"ping");
            // A TLS socket takes nothing without waiting: its writes go through `write_range`.
            let now = socket.write_now(b"x").unwrap_err();
            assert_eq!(now.kind(), io::ErrorKind::WouldBlock);
            let (written, _) = socket.write_all(payload, soon()).await;
            written.unwrap();
            assert_eq!(peer.join().unwrap(), expected);
        });
    }

    #[test]
    fn reads_now_and_readiness_see_only_plaintext() {
        let (server, client_config) = configs();
        runtime().block_on(async move {
            let (gate_tx, gate_rx) = std::sync::mpsc::channel::<()>();
            let (mut socket, peer) = accept(|addr| {
                client(addr, client_config, move |stream| {
                    stream.write_all(b"first").unwrap();
                    gate_rx.recv().unwrap();
                    stream.write_all(b"second").unwrap();
                    stream.conn.send_close_notify();
                    stream.flush().unwrap();
                    // Until the gateway closes: a close with unread bytes (its session
                    // tickets) would be a reset, which may overtake what was sent.
                    let _ = stream.read_to_end(&mut Vec::new());
                })
            })
            .await;
            socket.accept_tls(&server, soon()).await.unwrap();
            let mut buf = Vec::new();
            let stop = || Box::pin(crate::net::socket::at_deadline(soon()));
            // Bounded: the peer sends within the deadline the readiness waits are cut at.
            let mut got = 0;
            while got == 0 {
                assert!(matches!(socket.readable_unless(stop()).await, Some(Ok(()))));
                match socket.read_now(&mut buf, 64) {
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                    read => got = read.unwrap(),
                }
            }
            assert_eq!(buf, b"first");
            // Nothing more is there: a read now does not wait.
            let nothing = socket.read_now(&mut buf, 64).unwrap_err();
            assert_eq!(nothing.kind(), io::ErrorKind::WouldBlock);
            gate_tx.send(()).unwrap();
            let (read, buf) = socket.read_more(buf, 64, soon()).await;
            assert_eq!(read.unwrap(), 6);
            assert_eq!(buf, b"firstsecond");
            // `close_notify`: the end of the stream.
            let (read, buf) = socket.read_more(buf, 64, soon()).await;
            assert_eq!(read.unwrap(), 0);
            assert_eq!(buf, b"firstsecond");
            drop(socket);
            // Joined without blocking the runtime, which has the close to carry out.
            for _ in 0..1000 {
                if peer.is_finished() {
                    break;
                }
                monoio::time::sleep(Duration::from_millis(5)).await;
            }
            peer.join().unwrap();
        });
    }

    #[test]
    fn a_silent_client_is_cut_at_the_handshake_deadline() {
        let (server, _) = configs();
        runtime().block_on(async move {
            let (mut socket, peer) = accept(std::net::TcpStream::connect).await;
            let peer = peer.unwrap();
            let started = Instant::now();
            let deadline = started + Duration::from_millis(100);
            let failed = socket.accept_tls(&server, deadline).await.unwrap_err();
            assert_eq!(failed.kind(), io::ErrorKind::TimedOut);
            assert!(started.elapsed() < Duration::from_secs(5));
            drop(peer);
        });
    }

    #[test]
    fn a_client_that_does_not_trust_the_certificate_fails_the_handshake() {
        let (server, _) = configs();
        let (_, stranger) = configs();
        runtime().block_on(async move {
            let (mut socket, peer) =
                accept(|addr| client(addr, stranger, |stream| stream.write_all(b"hello").is_err()))
                    .await;
            let failed = socket.accept_tls(&server, soon()).await.unwrap_err();
            assert_eq!(failed.kind(), io::ErrorKind::InvalidData);
            assert!(peer.join().unwrap(), "the client refused the certificate");
        });
    }
}
