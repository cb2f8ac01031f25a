//! A data core's upstream keep-alive pool: per worker, a bounded stack of idle connections,
//! most recently used on top (hot sockets, warm caches). A connection idle longer than
//! `UPSTREAM_IDLE_TIMEOUT` is closed instead of reused, the oldest is dropped when a worker's
//! stack is full, and `sweep` closes expired ones so engines never see us hold sockets forever.
//! Connections remember the address they were opened to, so a reused worker id never gets a
//! socket to its predecessor. A connection's buffers that grew past
//! `UPSTREAM_BUF_BYTES_RETAINED_MAX` are given back to the allocator as it enters the pool: an
//! idle connection does not pin the memory of the largest response it ever carried.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use crate::ids::WorkerId;
use crate::limits::{
    UPSTREAM_BUF_BYTES_RETAINED_MAX, UPSTREAM_IDLE_PER_WORKER_MAX, UPSTREAM_IDLE_TIMEOUT,
};
use crate::net::socket::Socket;

/// An upstream connection with its buffers.
#[derive(Debug)]
pub struct UpstreamConn {
    /// The socket.
    pub socket: Socket,
    /// Response bytes read from the worker.
    pub read_buf: Vec<u8>,
    /// The request being written to the worker.
    pub write_buf: Vec<u8>,
    /// The worker address it was opened to.
    pub addr: SocketAddr,
    /// Whether it served a request before (a failure on it may just be a stale socket).
    pub reused: bool,
}

impl UpstreamConn {
    /// Wraps a freshly connected socket.
    pub fn new(socket: Socket, addr: SocketAddr) -> Self {
        UpstreamConn {
            socket,
            // Borrowed from the core's spare buffers when the connection has bytes to move.
            read_buf: Vec::new(),
            write_buf: Vec::new(),
            addr,
            reused: false,
        }
    }

    /// Empties the buffers, and frees those that grew past `UPSTREAM_BUF_BYTES_RETAINED_MAX`
    /// (the next use borrows a typical-sized one: `shrink_to` may keep the block in place).
    fn shed_large_buffers(&mut self) {
        for buf in [&mut self.read_buf, &mut self.write_buf] {
            buf.clear();
            if buf.capacity() > UPSTREAM_BUF_BYTES_RETAINED_MAX {
                *buf = Vec::new();
            }
        }
    }
}

#[derive(Debug)]
struct IdleConn {
    conn: UpstreamConn,
    idle_since: Instant,
}

/// Idle upstream connections of one data core, by worker.
#[derive(Debug)]
pub struct UpstreamPool {
    by_worker: Vec<Vec<IdleConn>>,
    /// `--upstream-pool-idle-timeout-secs` (`None`: idle connections are kept).
    idle_timeout: Option<Duration>,
}

impl Default for UpstreamPool {
    fn default() -> Self {
        Self::with_idle_timeout(Some(UPSTREAM_IDLE_TIMEOUT))
    }
}

impl UpstreamPool {
    /// An empty pool closing connections idle past `UPSTREAM_IDLE_TIMEOUT`.
    pub fn new() -> Self {
        Self::default()
    }

    /// An empty pool closing connections idle past `idle_timeout` (`None`: never).
    pub fn with_idle_timeout(idle_timeout: Option<Duration>) -> Self {
        UpstreamPool {
            by_worker: Vec::new(),
            idle_timeout,
        }
    }

    /// The most recently returned live connection to `worker` at `addr`, if any.
    pub fn take(
        &mut self,
        worker: WorkerId,
        addr: SocketAddr,
        now: Instant,
    ) -> Option<UpstreamConn> {
        let idle_timeout = self.idle_timeout;
        let stack = self.by_worker.get_mut(worker.index())?;
        while let Some(idle) = stack.pop() {
            let fresh = idle_timeout.is_none_or(|t| now.duration_since(idle.idle_since) < t);
            if idle.conn.addr == addr && fresh {
                let mut conn = idle.conn;
                conn.reused = true;
                return Some(conn);
            }
        }
        None
    }

    /// Returns a connection whose last response was read completely.
    pub fn put(&mut self, worker: WorkerId, mut conn: UpstreamConn, now: Instant) {
        if self.by_worker.len() <= worker.index() {
            self.by_worker.resize_with(worker.index() + 1, Vec::new);
        }
        let stack = &mut self.by_worker[worker.index()];
        if stack.len() >= UPSTREAM_IDLE_PER_WORKER_MAX {
            stack.remove(0);
        }
        conn.shed_large_buffers();
        stack.push(IdleConn {
            conn,
            idle_since: now,
        });
    }

    /// Closes every idle connection to `worker`: after one pooled socket turned out dead (an
    /// engine restart), its siblings are most likely dead too.
    pub fn clear_worker(&mut self, worker: WorkerId) {
        if let Some(stack) = self.by_worker.get_mut(worker.index()) {
            stack.clear();
        }
    }

    /// Closes connections idle past the pool's idle timeout.
    pub fn sweep(&mut self, now: Instant) {
        let Some(timeout) = self.idle_timeout else {
            return;
        };
        for stack in &mut self.by_worker {
            stack.retain(|idle| now.duration_since(idle.idle_since) < timeout);
        }
    }

    /// Idle connections held, over all workers.
    pub fn idle_count(&self) -> usize {
        self.by_worker.iter().map(Vec::len).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Runs `body` with `count` fresh upstream connections to a local listener.
    fn with_conns(count: usize, body: impl FnOnce(SocketAddr, Vec<UpstreamConn>)) {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let mut runtime = monoio::RuntimeBuilder::<monoio::FusionDriver>::new()
            .enable_timer()
            .build()
            .unwrap();
        runtime.block_on(async move {
            let mut conns = Vec::new();
            for _ in 0..count {
                conns.push(UpstreamConn::new(
                    Socket::connect(addr).await.unwrap(),
                    addr,
                ));
            }
            body(addr, conns);
        });
    }

    #[test]
    fn most_recent_first_and_marked_reused() {
        with_conns(2, |addr, mut conns| {
            let mut pool = UpstreamPool::new();
            let now = Instant::now();
            let second = conns.pop().unwrap();
            let first = conns.pop().unwrap();
            let second_port = second.socket.local_addr().unwrap().port();
            pool.put(WorkerId(3), first, now);
            pool.put(WorkerId(3), second, now);
            assert_eq!(pool.idle_count(), 2);
            let taken = pool.take(WorkerId(3), addr, now).unwrap();
            assert!(taken.reused);
            let port = taken.socket.local_addr().unwrap().port();
            assert_eq!(port, second_port, "the last one returned comes back first");
            assert!(pool.take(WorkerId(2), addr, now).is_none());
            assert_eq!(pool.idle_count(), 1);
        });
    }

    #[test]
    fn expired_and_foreign_connections_are_dropped() {
        with_conns(2, |addr, mut conns| {
            let mut pool = UpstreamPool::new();
            let now = Instant::now();
            pool.put(WorkerId(0), conns.pop().unwrap(), now);
            let later = now + UPSTREAM_IDLE_TIMEOUT;
            assert!(
                pool.take(WorkerId(0), addr, later).is_none(),
                "idle too long"
            );
            assert_eq!(pool.idle_count(), 0);
            pool.put(WorkerId(0), conns.pop().unwrap(), now);
            let other: SocketAddr = "127.0.0.1:1".parse().unwrap();
            assert!(
                pool.take(WorkerId(0), other, now).is_none(),
                "id reused for another worker"
            );
            assert_eq!(pool.idle_count(), 0);
        });
    }

    #[test]
    fn pooled_connections_give_back_buffers_past_the_retained_bound() {
        with_conns(1, |addr, mut conns| {
            let mut pool = UpstreamPool::new();
            let now = Instant::now();
            let mut conn = conns.pop().unwrap();
            // A 60 MB response went through its read buffer; its write buffer stayed typical.
            conn.read_buf.resize(60 << 20, b'x');
            conn.write_buf.resize(UPSTREAM_BUF_BYTES_RETAINED_MAX, b'y');
            let kept_write_buf = conn.write_buf.as_ptr();
            pool.put(WorkerId(0), conn, now);
            let conn = pool.take(WorkerId(0), addr, now).unwrap();
            assert!(conn.read_buf.is_empty() && conn.write_buf.is_empty());
            assert_eq!(conn.read_buf.capacity(), 0);
            assert_eq!(conn.write_buf.capacity(), UPSTREAM_BUF_BYTES_RETAINED_MAX);
            assert_eq!(
                conn.write_buf.as_ptr(),
                kept_write_buf,
                "a buffer within the bound is kept"
            );
        });
    }

    #[test]
    fn the_idle_timeout_is_the_pools_and_none_keeps_connections() {
        with_conns(2, |addr, mut conns| {
            let now = Instant::now();
            let hour = Duration::from_secs(3600);
            let mut forever = UpstreamPool::with_idle_timeout(None);
            forever.put(WorkerId(0), conns.pop().unwrap(), now);
            forever.sweep(now + hour);
            assert_eq!(forever.idle_count(), 1);
            assert!(forever.take(WorkerId(0), addr, now + hour).is_some());
            let mut short = UpstreamPool::with_idle_timeout(Some(Duration::from_secs(1)));
            short.put(WorkerId(0), conns.pop().unwrap(), now);
            short.sweep(now + Duration::from_millis(999));
            assert_eq!(short.idle_count(), 1);
            assert!(short
                .take(WorkerId(0), addr, now + Duration::from_secs(1))
                .is_none());
        });
    }

    #[test]
    fn sweep_closes_expired_connections() {
        with_conns(2, |_, mut conns| {
            let mut pool = UpstreamPool::new();
            let now = Instant::now();
            pool.put(WorkerId(1), conns.pop().unwrap(), now);
            pool.sweep(now);
            assert_eq!(pool.idle_count(), 1);
            pool.sweep(now + UPSTREAM_IDLE_TIMEOUT);
            assert_eq!(pool.idle_count(), 0);
            pool.put(WorkerId(1), conns.pop().unwrap(), now);
            pool.clear_worker(WorkerId(0));
            assert_eq!(pool.idle_count(), 1);
            pool.clear_worker(WorkerId(1));
            assert_eq!(pool.idle_count(), 0);
        });
    }
}
