//! Waiting for a started process to be ready, always within a deadline: [`wait_for_port`]
//! (something accepts TCP connections; blocking, for the test fixtures) and
//! [`wait_until_healthy`] (an HTTP GET answers 200; async, for the tools, which also give up
//! early when a child exits or the user stops the run).

use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use tokio::sync::watch;

use super::http;

/// How long a started engine or gateway may take to answer its health check: seconds for a
/// debug build on a loaded two-core machine, so 30 s means it is not coming up.
pub const STARTUP_TIMEOUT: Duration = Duration::from_secs(30);

/// How often a wait tries again: short next to a process's start-up, long next to a probe.
const POLL_INTERVAL: Duration = Duration::from_millis(50);

/// How long one probe may take: a local process that is up answers in microseconds.
const PROBE_TIMEOUT: Duration = Duration::from_millis(500);

/// Whether something accepts TCP connections on `addr` within `timeout`.
pub fn wait_for_port(addr: SocketAddr, timeout: Duration) -> bool {
    let deadline = Instant::now() + timeout;
    loop {
        if TcpStream::connect_timeout(&addr, PROBE_TIMEOUT).is_ok() {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(POLL_INTERVAL);
    }
}

/// Waits until `GET path` on `addr` answers 200. Before each probe `still_starting` says whether
/// to go on (its error, e.g. "the process exited", ends the wait); `stop` turning true ends it
/// with `"stopped"`; past `timeout` the error names the address and the last answer.
pub async fn wait_until_healthy(
    addr: SocketAddr,
    path: &str,
    timeout: Duration,
    mut stop: watch::Receiver<bool>,
    mut still_starting: impl FnMut() -> Result<(), String>,
) -> Result<(), String> {
    let deadline = tokio::time::Instant::now() + timeout;
    let mut last = "no answer".to_string();
    loop {
        still_starting()?;
        match http::get(addr, path, None, PROBE_TIMEOUT).await {
            Some(answer) if answer.status == 200 => return Ok(()),
            Some(answer) => last = format!("status {}", answer.status),
            None => {}
        }
        if tokio::time::Instant::now() > deadline {
            return Err(format!(
                "GET {path} on {addr} did not answer 200 within {timeout:.1?} ({last})"
            ));
        }
        tokio::select! {
            _ = tokio::time::sleep(POLL_INTERVAL) => {}
            _ = stop_requested(&mut stop) => return Err("stopped".into()),
        }
    }
}

/// Resolves once `stop` turns true; never when its sender is gone (no stop can come then).
pub async fn stop_requested(stop: &mut watch::Receiver<bool>) {
    if stop.wait_for(|s| *s).await.is_err() {
        std::future::pending::<()>().await;
    }
}

/// A stop signal that never fires, for a wait nobody can interrupt.
pub fn never_stopped() -> watch::Receiver<bool> {
    watch::channel(false).1
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_port_nobody_listens_on_is_not_waited_for_past_the_timeout() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        assert!(wait_for_port(addr, Duration::from_secs(1)));
        drop(listener);
        let started = Instant::now();
        assert!(!wait_for_port(addr, Duration::from_millis(200)));
        assert!(started.elapsed() < Duration::from_secs(5));
    }

    #[tokio::test]
    async fn a_listener_that_never_answers_200_times_out_naming_its_status() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move {
            use tokio::io::{AsyncReadExt, AsyncWriteExt};
            while let Ok((mut socket, _)) = listener.accept().await {
                let mut buf = [0u8; 1024];
                let _ = socket.read(&mut buf).await;
                let _ = socket
                    .write_all(b"HTTP/1.1 503 Service Unavailable\r\ncontent-length: 0\r\n\r\n")
                    .await;
            }
        });
        let (_stop, stopped) = watch::channel(false);
        let error =
            wait_until_healthy(addr, "/health", Duration::from_millis(300), stopped, || {
                Ok(())
            })
            .await
            .unwrap_err();
        assert!(error.contains("status 503"), "{error}");
    }

    #[tokio::test]
    async fn a_stop_ends_the_wait_and_without_one_the_timeout_does() {
        let addr = SocketAddr::from(([127, 0, 0, 1], crate::fleet::free_ports(1).unwrap()));
        let wait = |timeout, stop| wait_until_healthy(addr, "/health", timeout, stop, || Ok(()));
        let (stop, stopped) = watch::channel(false);
        stop.send(true).unwrap();
        let error = wait(Duration::from_secs(30), stopped).await.unwrap_err();
        assert_eq!(error, "stopped");
        // A stop signal whose sender is gone never fires: the deadline still ends the wait.
        let error = wait(Duration::from_millis(300), never_stopped())
            .await
            .unwrap_err();
        assert!(error.contains("did not answer 200"), "{error}");
    }
}
