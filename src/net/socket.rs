//! The owned-buffer socket every connection goes through: `Socket` wraps a monoio `TcpStream`
//! and a per-connection `Canceller`. Buffers are passed in and handed back with the result
//! (io_uring's rent model), and every operation takes a deadline: on expiry the kernel operation
//! is cancelled and awaited, so the buffer comes back before we return (monoio's `io-cancel`
//! guidance). Keeping all socket I/O here is what lets the runtime be swapped later.
//!
//! A socket may carry a TLS session (`net::tls`: a client of `--tls-cert-path`, an `https://`
//! worker); each operation then goes through it, after one test of which kind the socket is, and
//! the plain path is the same as before TLS existed.
//!
//! Errors are plain `io::Error`s; a missed deadline is `io::ErrorKind::TimedOut`. Callers map
//! them to `ProxyError`s with the side they know.

use std::io;
use std::net::SocketAddr;
use std::os::unix::io::AsRawFd;
use std::time::Instant;

use monoio::buf::{IoBuf, IoBufMut};
use monoio::io::{CancelableAsyncReadRent, CancelableAsyncWriteRent, Canceller};
use monoio::net::TcpStream;

use super::tls;
use crate::limits::UPSTREAM_CONNECT_TIMEOUT;
use crate::workers::spec::Scheme;

/// A TCP connection with owned-buffer, deadline-bounded reads and writes.
pub struct Socket {
    stream: TcpStream,
    canceller: Canceller,
    /// The TLS session of an encrypted connection. Boxed: rustls' state (about 1 KiB) stays out
    /// of every connection's task, and a plain socket pays one pointer for it.
    tls: Option<Box<rustls::Connection>>,
}

impl std::fmt::Debug for Socket {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Socket").finish_non_exhaustive()
    }
}

impl Drop for Socket {
    fn drop(&mut self) {
        if let Some(tls) = &mut self.tls {
            tls::close_now(&self.stream, tls);
        }
    }
}

fn timed_out() -> io::Error {
    io::Error::from(io::ErrorKind::TimedOut)
}

/// Runs a cancelable operation until it completes or `deadline` passes; on expiry it cancels
/// the kernel operation, waits for it to hand the buffer back, and reports `TimedOut` unless
/// the operation had completed anyway.
macro_rules! with_deadline {
    ($canceller:expr, $deadline:expr, |$handle:ident| $op:expr) => {{
        let $handle = $canceller.handle();
        let mut op = std::pin::pin!($op);
        let sleep = monoio::time::sleep_until(monoio::time::Instant::from_std($deadline));
        monoio::select! {
            result = &mut op => result,
            _ = sleep => {
                *$canceller = std::mem::take($canceller).cancel();
                let (result, buf) = op.await;
                match result {
                    Ok(n) if n > 0 => (Ok(n), buf),
                    _ => (Err(timed_out()), buf),
                }
            }
        }
    }};
}

/// What ends a watched operation early (`Socket::read_more_unless`, `Socket::readable_unless`):
/// the caller's one future decides both, so an operation arms one timer, not two (a monoio
/// timer is 640 bytes of the connection's task, and a stream waits in one for every token).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Cut {
    /// The operation's deadline passed: it ends as `TimedOut`.
    Deadline,
    /// The caller stopped it (`Watched::Stopped`).
    Stop,
}

/// A `Cut::Deadline` at `deadline`: the stop future of an operation nothing else interrupts.
pub async fn at_deadline(deadline: Instant) -> Cut {
    monoio::time::sleep_until(monoio::time::Instant::from_std(deadline)).await;
    Cut::Deadline
}

/// How a read raced against a `stop` future ended (`Socket::read_more_unless`).
#[derive(Debug)]
pub enum Watched {
    /// The read ended first (or `stop` came too late to keep the bytes from arriving).
    Read(io::Result<usize>),
    /// `stop` completed first: the read was cancelled and nothing was read.
    Stopped,
}

impl Socket {
    /// Wraps an accepted or connected stream.
    pub fn new(stream: TcpStream) -> Self {
        // Requests and SSE events are small writes that must leave at once.
        let _ = stream.set_nodelay(true);
        Socket {
            stream,
            canceller: Canceller::new(),
            tls: None,
        }
    }

    /// Whether the connection is encrypted.
    pub fn is_tls(&self) -> bool {
        self.tls.is_some()
    }

    /// Makes an accepted connection a TLS one: runs the server's handshake by `deadline`.
    pub async fn accept_tls(
        &mut self,
        config: &std::sync::Arc<rustls::ServerConfig>,
        deadline: Instant,
    ) -> io::Result<()> {
        let tls = self.tls.insert(tls::server_session(config)?);
        tls::handshake(&self.stream, tls, deadline).await
    }

    /// Connects to a worker at `addr` as its URL's `scheme` says: for `https://`, the TLS
    /// handshake with `host` (which its certificate must name) follows the connection. Each step
    /// gives up at `deadline` or after `UPSTREAM_CONNECT_TIMEOUT`, whichever comes first.
    pub async fn connect_to(
        addr: SocketAddr,
        scheme: Scheme,
        host: &str,
        deadline: Instant,
    ) -> io::Result<Self> {
        let mut socket = Self::connect_before(addr, deadline).await?;
        if scheme == Scheme::Https {
            let tls = socket.tls.insert(tls::client_session(host)?);
            let handshake_deadline = deadline.min(Instant::now() + UPSTREAM_CONNECT_TIMEOUT);
            tls::handshake(&socket.stream, tls, handshake_deadline).await?;
        }
        Ok(socket)
    }

    /// Connects to `addr`, giving up after `UPSTREAM_CONNECT_TIMEOUT`.
    pub async fn connect(addr: SocketAddr) -> io::Result<Self> {
        Self::connect_before(addr, Instant::now() + UPSTREAM_CONNECT_TIMEOUT).await
    }

    /// Connects to `addr`, giving up at `deadline` or after `UPSTREAM_CONNECT_TIMEOUT`, whichever
    /// comes first.
    pub async fn connect_before(addr: SocketAddr, deadline: Instant) -> io::Result<Self> {
        let left = deadline
            .saturating_duration_since(Instant::now())
            .min(UPSTREAM_CONNECT_TIMEOUT);
        match monoio::time::timeout(left, TcpStream::connect_addr(addr)).await {
            Ok(stream) => Ok(Socket::new(stream?)),
            Err(_) => Err(timed_out()),
        }
    }

    /// The local address of the connection.
    pub fn local_addr(&self) -> io::Result<SocketAddr> {
        self.stream.local_addr()
    }

    /// Reads whatever arrives (at least one byte, or 0 at end of stream) and appends it to
    /// `buf`, first making room for at least `spare` more bytes.
    pub async fn read_more(
        &mut self,
        buf: Vec<u8>,
        spare: usize,
        deadline: Instant,
    ) -> (io::Result<usize>, Vec<u8>) {
        let stop = std::pin::pin!(at_deadline(deadline));
        match self.read_more_unless(buf, spare, stop).await {
            (Watched::Read(result), buf) => (result, buf),
            // `at_deadline` only ever cuts at the deadline.
            (Watched::Stopped, buf) => (Err(timed_out()), buf),
        }
    }

    /// As `read_more`, until `stop` cuts it: then the read is cancelled (and awaited, so the
    /// kernel lets go of the buffer and of the socket, which can then really close). `stop` is
    /// pinned by the caller: a future passed by value would sit twice in this one's state.
    pub async fn read_more_unless(
        &mut self,
        buf: Vec<u8>,
        spare: usize,
        stop: impl std::future::Future<Output = Cut> + Unpin,
    ) -> (Watched, Vec<u8>) {
        // Each kind's read is a future of its own: the larger of the two, not their sum, is
        // what every connection's task holds for it.
        match &mut self.tls {
            Some(tls) => tls::read_more_unless(&self.stream, tls, buf, spare, stop).await,
            None => self.read_more_unless_plain(buf, spare, stop).await,
        }
    }

    /// `read_more_unless` on a plain connection: one ring read, cancelled when `stop` cuts it.
    async fn read_more_unless_plain(
        &mut self,
        mut buf: Vec<u8>,
        spare: usize,
        stop: impl std::future::Future<Output = Cut> + Unpin,
    ) -> (Watched, Vec<u8>) {
        if buf.capacity() - buf.len() < spare {
            buf.reserve(spare);
        }
        let start = buf.len();
        let Socket {
            stream, canceller, ..
        } = self;
        let tail = buf.slice_mut(start..);
        let mut read = std::pin::pin!(stream.cancelable_read(tail, canceller.handle()));
        let cut = monoio::select! {
            (result, tail) = &mut read => return (Watched::Read(result), tail.into_inner()),
            cut = stop => cut,
        };
        *canceller = std::mem::take(canceller).cancel();
        let (result, tail) = read.await;
        let watched = match (result, cut) {
            (Ok(n), _) if n > 0 => Watched::Read(Ok(n)),
            (_, Cut::Deadline) => Watched::Read(Err(timed_out())),
            (_, Cut::Stop) => Watched::Stopped,
        };
        (watched, tail.into_inner())
    }

    /// Waits, holding no buffer, until the connection has bytes to read (or its end, or an
    /// error: the read that follows tells which). `None` when `stop` cuts it with `Cut::Stop`;
    /// `Cut::Deadline` is `TimedOut`. Dropping the wait cancels the kernel's poll.
    pub async fn readable_unless(
        &mut self,
        stop: impl std::future::Future<Output = Cut> + Unpin,
    ) -> Option<io::Result<()>> {
        if self.tls.as_mut().is_some_and(|tls| tls::has_plaintext(tls)) {
            // Decrypted by an earlier read and not taken yet: the kernel has no more to say.
            return Some(Ok(()));
        }
        let ready = self.stream.readable(false);
        monoio::select! {
            result = ready => Some(result),
            cut = stop => match cut {
                Cut::Deadline => Some(Err(timed_out())),
                Cut::Stop => None,
            },
        }
    }

    /// Whether the peer has closed (or reset) its side: a poll without waiting, so bytes it
    /// sent before are left unread (a pipelined request is not a close). A peer that shut down
    /// only its sending side counts as gone, as nginx counts it.
    pub fn peer_closed(&self) -> bool {
        let mut poll = libc::pollfd {
            fd: self.stream.as_raw_fd(),
            events: libc::POLLRDHUP,
            revents: 0,
        };
        // SAFETY: `poll` is one valid, exclusively borrowed `pollfd` (nfds 1) and a zero
        // timeout returns at once; the fd stays open while `self` is borrowed.
        let ready = unsafe { libc::poll(&mut poll, 1, 0) };
        ready > 0 && poll.revents & (libc::POLLRDHUP | libc::POLLHUP | libc::POLLERR) != 0
    }

    /// Reads what the kernel holds now, without waiting, into `buf`'s spare room (at least
    /// `spare` bytes of it): a stream woken by readiness reads and relays its bytes within one
    /// poll of its task, so a decode step that wakes every stream of the core at once does not
    /// hold a buffer per stream (see `http::upstream::http1::read_upstream`). `WouldBlock` when
    /// nothing is there (a spurious wake); 0 at the end of the stream.
    pub fn read_now(&mut self, buf: &mut Vec<u8>, spare: usize) -> io::Result<usize> {
        buf.reserve(spare);
        if let Some(tls) = &mut self.tls {
            return tls::read_now(&self.stream, tls, buf);
        }
        let room = buf.spare_capacity_mut();
        // SAFETY: `room` is `buf`'s spare capacity, valid for writes of `room.len()` bytes and
        // exclusively borrowed; the fd stays open while `self` is borrowed; MSG_DONTWAIT makes
        // the call return at once.
        let read = unsafe {
            libc::recv(
                self.stream.as_raw_fd(),
                room.as_mut_ptr().cast(),
                room.len(),
                libc::MSG_DONTWAIT,
            )
        };
        let Ok(n) = usize::try_from(read) else {
            return Err(io::Error::last_os_error());
        };
        // SAFETY: the kernel initialized the first `n` bytes of the spare capacity (`n` is at
        // most `room.len()`).
        unsafe { buf.set_len(buf.len() + n) };
        Ok(n)
    }

    /// Writes as much of `bytes` as the kernel takes now, without waiting: how many bytes it
    /// took (`WouldBlock` when none). A small event to a client that keeps up goes out whole.
    /// A TLS connection takes none here (`WouldBlock`): bytes rustls encrypted must all reach
    /// the kernel before the caller moves on, which `write_range` sees to, and sends at once
    /// when the socket takes them, as this would.
    pub fn write_now(&self, bytes: &[u8]) -> io::Result<usize> {
        if self.tls.is_some() {
            return Err(io::Error::from(io::ErrorKind::WouldBlock));
        }
        // SAFETY: `bytes` is valid for reads of its length; the fd stays open while `self` is
        // borrowed; MSG_DONTWAIT makes the call return at once, MSG_NOSIGNAL turns a closed
        // peer into EPIPE instead of a signal.
        let sent = unsafe {
            libc::send(
                self.stream.as_raw_fd(),
                bytes.as_ptr().cast(),
                bytes.len(),
                libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL,
            )
        };
        usize::try_from(sent).map_err(|_| io::Error::last_os_error())
    }

    /// Writes `buf[range]` completely and hands `buf` back.
    pub async fn write_range(
        &mut self,
        buf: Vec<u8>,
        range: std::ops::Range<usize>,
        deadline: Instant,
    ) -> (io::Result<()>, Vec<u8>) {
        // As for reads, one future per kind of connection.
        match &mut self.tls {
            Some(tls) => {
                let result = tls::write_all(&self.stream, tls, &buf[range], deadline).await;
                (result, buf)
            }
            None => self.write_range_plain(buf, range, deadline).await,
        }
    }

    /// `write_range` on a plain connection: ring writes until the range is out.
    async fn write_range_plain(
        &mut self,
        buf: Vec<u8>,
        range: std::ops::Range<usize>,
        deadline: Instant,
    ) -> (io::Result<()>, Vec<u8>) {
        let mut written = range.start;
        let mut buf = buf;
        while written < range.end {
            let Socket {
                stream, canceller, ..
            } = self;
            let part = buf.slice(written..range.end);
            let (result, part) = with_deadline!(canceller, deadline, |handle| {
                stream.cancelable_write(part, handle)
            });
            buf = part.into_inner();
            match result {
                Ok(0) => return (Err(io::Error::from(io::ErrorKind::WriteZero)), buf),
                Ok(n) => written += n,
                Err(e) => return (Err(e), buf),
            }
        }
        (Ok(()), buf)
    }

    /// Writes all of `buf` and hands it back.
    pub async fn write_all(
        &mut self,
        buf: Vec<u8>,
        deadline: Instant,
    ) -> (io::Result<()>, Vec<u8>) {
        let len = buf.len();
        self.write_range(buf, 0..len, deadline).await
    }
}

/// How much room a read buffer gets before each read.
pub fn read_spare(buf: &[u8], minimum: usize) -> usize {
    minimum.max(buf.len() / 2)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};
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

    /// `read_now` retried for up to 5 s while nothing has arrived.
    async fn read_soon(socket: &mut Socket, buf: &mut Vec<u8>) -> usize {
        for _ in 0..1000 {
            match socket.read_now(buf, 64) {
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    monoio::time::sleep(Duration::from_millis(5)).await;
                }
                read => return read.unwrap(),
            }
        }
        panic!("nothing arrived in 5 s");
    }

    /// A loopback listener whose first connection `serve` handles on a thread of its own.
    fn peer<T: Send + 'static>(
        serve: impl FnOnce(std::net::TcpStream) -> T + Send + 'static,
    ) -> (SocketAddr, std::thread::JoinHandle<T>) {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let peer = std::thread::spawn(move || serve(listener.accept().unwrap().0));
        (addr, peer)
    }

    #[test]
    fn reads_and_writes_now_move_what_the_kernel_has_without_waiting() {
        let (addr, peer) = peer(|mut s| {
            s.write_all(b"first").unwrap();
            let mut b = [0u8; 4];
            s.read_exact(&mut b).unwrap();
            b
        });
        runtime().block_on(async move {
            let mut socket = Socket::connect(addr).await.unwrap();
            let mut buf = b"kept:".to_vec();
            // Nothing may have arrived yet: a read now does not wait for it.
            let first = read_soon(&mut socket, &mut buf).await;
            assert_eq!(first, 5);
            assert_eq!(buf, b"kept:first");
            let nothing = socket.read_now(&mut buf, 64).unwrap_err();
            assert_eq!(nothing.kind(), io::ErrorKind::WouldBlock);
            assert_eq!(buf, b"kept:first");
            assert_eq!(socket.write_now(b"back").unwrap(), 4);
            // The peer has read its four bytes and closed: the end of the stream reads as 0.
            let end = read_soon(&mut socket, &mut buf).await;
            assert_eq!(end, 0);
            assert_eq!(buf, b"kept:first");
        });
        assert_eq!(&peer.join().unwrap(), b"back");
    }

    #[test]
    fn read_deadline_cancels_and_returns_the_buffer() {
        let (addr, peer) = peer(|mut s| {
            let mut b = [0u8; 5];
            s.read_exact(&mut b).unwrap();
            std::thread::sleep(Duration::from_millis(300));
            s.write_all(b"late").unwrap();
            b
        });
        runtime().block_on(async move {
            let mut socket = Socket::connect(addr).await.unwrap();
            let deadline = Instant::now() + Duration::from_secs(5);
            let (r, buf) = socket.write_all(b"hello".to_vec(), deadline).await;
            r.unwrap();
            let mut buf = buf;
            buf.clear();
            buf.extend_from_slice(b"kept:");
            let started = Instant::now();
            let deadline = started + Duration::from_millis(50);
            let (r, buf) = socket.read_more(buf, 64, deadline).await;
            assert_eq!(r.unwrap_err().kind(), io::ErrorKind::TimedOut);
            assert!(started.elapsed() < Duration::from_millis(250));
            assert_eq!(buf, b"kept:");
            let deadline = Instant::now() + Duration::from_secs(5);
            let (r, buf) = socket.read_more(buf, 64, deadline).await;
            assert_eq!(r.unwrap(), 4);
            assert_eq!(buf, b"kept:late");
        });
        assert_eq!(&peer.join().unwrap(), b"hello");
    }
}
