//! A guard in front of the ZeroMQ library's decoder ([`Guard`]): a loopback listener the
//! library's socket connects to instead of the publisher; each connection is relayed to the
//! publisher, and the publisher's bytes are read through `kv_events::FrameSizes` before they
//! are passed on. A message announced past `KV_EVENTS_MESSAGE_BYTES_MAX` cuts the connection
//! before the library sees its header (it would reserve the announced size: a header claiming
//! 2^62 bytes aborts the process), and the subscriber hears of it ([`Guard::tripped`]).
//!
//! The library (`zeromq` 0.6) has no frame-size option and no way to plug in a transport, so
//! the guard sits on the byte stream; the relay costs one loopback hop and one copy of the
//! events, a few MB/s at most.

use std::io;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio::task::{JoinHandle, JoinSet};

use crate::kv_events::{FrameSizes, TooLarge};
use crate::limits::{KV_EVENTS_CONNECT_TIMEOUT, KV_EVENTS_RELAY_READ_BYTES};

/// A loopback endpoint relaying to one publisher; dropped, it closes its listener and every
/// connection it relays.
#[derive(Debug)]
pub(super) struct Guard {
    /// `tcp://127.0.0.1:P`, for the library's socket to connect to.
    pub endpoint: String,
    trips: mpsc::Receiver<TooLarge>,
    task: JoinHandle<()>,
}

impl Guard {
    /// Listens on a loopback port and relays each connection to `upstream`
    /// (`tcp://host:port`), refusing messages past `limit_bytes`.
    pub async fn start(upstream: &str, limit_bytes: u64) -> io::Result<Guard> {
        let address = upstream
            .strip_prefix("tcp://")
            .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, upstream.to_string()))?
            .to_string();
        let listener = TcpListener::bind(("127.0.0.1", 0)).await?;
        let endpoint = format!("tcp://{}", listener.local_addr()?);
        // One trip is enough to act on; later ones are dropped.
        let (tripped, trips) = mpsc::channel(1);
        let task = tokio::spawn(async move {
            // Relays end with the guard: the set aborts them when dropped.
            let mut relays = JoinSet::new();
            loop {
                tokio::select! {
                    accepted = listener.accept() => {
                        let Ok((inbound, _)) = accepted else { continue };
                        relays.spawn(relay(inbound, address.clone(), limit_bytes, tripped.clone()));
                    }
                    // Reap finished relays so the set does not grow.
                    Some(_) = relays.join_next(), if !relays.is_empty() => {}
                }
            }
        });
        Ok(Guard {
            endpoint,
            trips,
            task,
        })
    }

    /// Waits until a relayed connection was cut for a message past the limit.
    pub async fn tripped(&mut self) -> TooLarge {
        match self.trips.recv().await {
            Some(too_large) => too_large,
            // The relaying task is gone (it never ends before the guard): wait forever.
            None => std::future::pending().await,
        }
    }
}

impl Drop for Guard {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Relays `inbound` (the library's socket) to `upstream` until either side closes or the
/// publisher announces a message past `limit_bytes` (reported on `tripped`).
async fn relay(
    inbound: TcpStream,
    upstream: String,
    limit_bytes: u64,
    tripped: mpsc::Sender<TooLarge>,
) {
    // A publisher that cannot be reached closes the inbound side: the library's connect fails.
    let connected = tokio::time::timeout(KV_EVENTS_CONNECT_TIMEOUT, TcpStream::connect(upstream));
    let Ok(Ok(outbound)) = connected.await else {
        return;
    };
    let _ = (inbound.set_nodelay(true), outbound.set_nodelay(true));
    let (mut from_library, mut to_library) = inbound.into_split();
    let (mut from_publisher, mut to_publisher) = outbound.into_split();
    // The library's side sends its greeting, subscriptions and replay requests: small.
    let upward = tokio::io::copy(&mut from_library, &mut to_publisher);
    let downward = async {
        let mut sizes = FrameSizes::new(limit_bytes);
        let mut buffer = vec![0u8; KV_EVENTS_RELAY_READ_BYTES];
        loop {
            let read = from_publisher.read(&mut buffer).await?;
            if read == 0 {
                return Ok(None);
            }
            if let Err(too_large) = sizes.scan(&buffer[..read]) {
                return Ok(Some(too_large));
            }
            to_library.write_all(&buffer[..read]).await?;
        }
    };
    tokio::select! {
        _ = upward => {}
        cut = downward => {
            if let Ok::<_, io::Error>(Some(too_large)) = cut {
                let _ = tripped.try_send(too_large);
            }
        }
    }
    // Both connections close here, dropped.
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A publisher that writes `stream` to its first connection and keeps it open.
    async fn publisher(stream: Vec<u8>) -> String {
        let listener = TcpListener::bind(("127.0.0.1", 0)).await.unwrap();
        let address = format!("tcp://{}", listener.local_addr().unwrap());
        tokio::spawn(async move {
            let (mut socket, _) = listener.accept().await.unwrap();
            socket.write_all(&stream).await.unwrap();
            let mut sink = [0u8; 64];
            while socket.read(&mut sink).await.is_ok_and(|n| n > 0) {}
        });
        address
    }

    fn run(test: impl std::future::Future<Output = ()>) {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        runtime.block_on(test);
    }

    #[test]
    fn a_huge_header_cuts_the_connection_before_the_library_reads_it() {
        run(async {
            let mut stream = vec![0xff];
            stream.resize(64, 0);
            stream.extend_from_slice(&[0x00, 2, b'o', b'k', 0x02]);
            stream.extend_from_slice(&(1u64 << 62).to_be_bytes());
            stream.extend_from_slice(b"trailing bytes never passed on");
            let upstream = publisher(stream.clone()).await;
            let mut guard = Guard::start(&upstream, 1 << 20).await.unwrap();
            let address = guard.endpoint.strip_prefix("tcp://").unwrap().to_string();
            let mut library = TcpStream::connect(address).await.unwrap();
            let timeout = std::time::Duration::from_secs(10);
            let tripped = tokio::time::timeout(timeout, guard.tripped()).await;
            assert_eq!(tripped, Ok(TooLarge { announced: 1 << 62 }));
            // What came before the header may have been passed on; the header never is.
            let mut got = Vec::new();
            let read = tokio::time::timeout(timeout, library.read_to_end(&mut got)).await;
            assert!(read.is_ok_and(|r| r.is_ok()), "the connection was closed");
            assert!(got.len() <= 64 + 4, "{} bytes passed on", got.len());
        });
    }

    #[test]
    fn frames_within_the_limit_are_relayed_unchanged() {
        run(async {
            let mut stream = vec![0xff];
            stream.resize(64, 0);
            stream.extend_from_slice(&[0x02]);
            stream.extend_from_slice(&1000u64.to_be_bytes());
            stream.extend((0..1000).map(|i| i as u8));
            let upstream = publisher(stream.clone()).await;
            let guard = Guard::start(&upstream, 1 << 20).await.unwrap();
            let address = guard.endpoint.strip_prefix("tcp://").unwrap().to_string();
            let mut library = TcpStream::connect(address).await.unwrap();
            let mut got = vec![0u8; stream.len()];
            let timeout = std::time::Duration::from_secs(10);
            let read = tokio::time::timeout(timeout, library.read_exact(&mut got)).await;
            assert!(read.is_ok_and(|r| r.is_ok()));
            assert_eq!(got, stream);
        });
    }
}
