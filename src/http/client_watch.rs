//! Which clients of a data core's waiting requests have gone, checked for all of them at once.
//!
//! A request waiting on its worker (a prefill, or a stream between two tokens) must notice its
//! client closing, so the engine stops generating for nobody. Each waiting request used to poll
//! its own client every `CLIENT_GONE_POLL_INTERVAL`: with 9,000 streams on a core that is 36,000
//! timer wakeups, task polls and `poll` syscalls a second, most of the core's CPU while the
//! streams sit idle. Here a waiting request registers its client's socket in the core's
//! [`ClientWatch`] and waits on [`ClientGone`]; one sweep per interval (`sweep_forever`, spawned
//! with the core) asks the kernel about every registered socket in one `poll` and wakes only
//! the requests whose client went, or all of them once shutdown cuts the requests still
//! running.

use std::cell::RefCell;
use std::future::Future;
use std::os::unix::io::RawFd;
use std::pin::Pin;
use std::rc::Rc;
use std::task::{Context, Poll, Waker};

use super::core::DataCore;
use crate::limits::CLIENT_GONE_POLL_INTERVAL;
use crate::net::socket::{self, PeerPoll};

/// One registered client.
#[derive(Debug)]
struct Watched {
    fd: RawFd,
    gone: bool,
    waker: Option<Waker>,
}

/// The clients of one core's waiting requests.
#[derive(Debug, Default)]
pub struct ClientWatch {
    /// Registered clients by slot; `None` slots are free and listed in `free`.
    slots: Vec<Option<Watched>>,
    free: Vec<usize>,
    /// The sweep's `poll` array and the slot of each entry (kept between sweeps).
    polled: Vec<PeerPoll>,
    polled_slots: Vec<usize>,
}

impl ClientWatch {
    fn register(&mut self, fd: RawFd) -> usize {
        let watched = Watched {
            fd,
            gone: false,
            waker: None,
        };
        match self.free.pop() {
            Some(slot) => {
                self.slots[slot] = Some(watched);
                slot
            }
            None => {
                self.slots.push(Some(watched));
                self.slots.len() - 1
            }
        }
    }

    fn unregister(&mut self, slot: usize) {
        if let Some(entry) = self.slots.get_mut(slot) {
            if entry.take().is_some() {
                self.free.push(slot);
            }
        }
    }

    /// Clients registered now.
    pub fn len(&self) -> usize {
        self.slots.len() - self.free.len()
    }

    /// Whether no client is registered.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Asks the kernel about every registered client at once and wakes the requests whose
    /// client has gone; with `cut_all`, wakes every request (shutdown's cut).
    pub fn sweep(&mut self, cut_all: bool) {
        self.polled.clear();
        self.polled_slots.clear();
        for (slot, watched) in self.slots.iter().enumerate() {
            if let Some(watched) = watched.as_ref().filter(|w| !w.gone) {
                self.polled.push(PeerPoll::new(watched.fd));
                self.polled_slots.push(slot);
            }
        }
        if !cut_all {
            socket::poll_peers(&mut self.polled);
        }
        for (poll, &slot) in self.polled.iter().zip(&self.polled_slots) {
            let Some(Some(watched)) = self.slots.get_mut(slot) else {
                continue;
            };
            if cut_all || poll.peer_closed() {
                watched.gone = true;
                if let Some(waker) = watched.waker.take() {
                    waker.wake();
                }
            }
        }
    }
}

/// Completes once the sweep finds the client gone (or shutdown cuts the request); registered
/// while it lives.
pub struct ClientGone<'a> {
    watch: &'a RefCell<ClientWatch>,
    slot: usize,
}

impl<'a> ClientGone<'a> {
    /// Watches the client whose socket is `fd`.
    pub fn new(watch: &'a RefCell<ClientWatch>, fd: RawFd) -> Self {
        let slot = watch.borrow_mut().register(fd);
        ClientGone { watch, slot }
    }
}

impl Future for ClientGone<'_> {
    type Output = ();

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let mut watch = self.watch.borrow_mut();
        let Some(Some(watched)) = watch.slots.get_mut(self.slot) else {
            return Poll::Ready(());
        };
        if watched.gone {
            return Poll::Ready(());
        }
        match &mut watched.waker {
            Some(waker) if waker.will_wake(cx.waker()) => {}
            waker => *waker = Some(cx.waker().clone()),
        }
        Poll::Pending
    }
}

impl Drop for ClientGone<'_> {
    fn drop(&mut self) {
        self.watch.borrow_mut().unregister(self.slot);
    }
}

/// The core's sweep, every `CLIENT_GONE_POLL_INTERVAL` until shutdown has cut the requests
/// still running and none is left.
pub async fn sweep_forever(core: Rc<DataCore>) {
    loop {
        monoio::time::sleep(CLIENT_GONE_POLL_INTERVAL).await;
        let cut_all = core.cutting_requests.get();
        let mut watch = core.client_watch.borrow_mut();
        if !watch.is_empty() {
            watch.sweep(cut_all);
        }
        if core.shared.is_shutting_down() && core.requests_in_flight.get() == 0 {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::io::AsRawFd;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;
    use std::task::Wake;

    struct Count(AtomicUsize);
    impl Wake for Count {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, Ordering::Relaxed);
        }
    }

    fn pair() -> (std::net::TcpStream, std::net::TcpStream) {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let client = std::net::TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let (server, _) = listener.accept().unwrap();
        (server, client)
    }

    #[test]
    fn a_sweep_wakes_the_requests_whose_client_closed_and_only_those() {
        let watch = RefCell::new(ClientWatch::default());
        let (kept_server, _kept_client) = pair();
        let (gone_server, gone_client) = pair();
        let (pipelining_server, mut pipelining_client) = pair();
        let counts: Vec<Arc<Count>> = (0..3)
            .map(|_| Arc::new(Count(AtomicUsize::new(0))))
            .collect();
        let mut waits: Vec<ClientGone<'_>> = [&kept_server, &gone_server, &pipelining_server]
            .iter()
            .map(|s| ClientGone::new(&watch, s.as_raw_fd()))
            .collect();
        let poll_all = |waits: &mut Vec<ClientGone<'_>>| -> Vec<bool> {
            waits
                .iter_mut()
                .zip(&counts)
                .map(|(wait, count)| {
                    let waker = Waker::from(count.clone());
                    let mut cx = Context::from_waker(&waker);
                    Pin::new(wait).poll(&mut cx).is_ready()
                })
                .collect()
        };
        assert_eq!(poll_all(&mut waits), [false, false, false]);
        drop(gone_client);
        // Bytes of a next request are not a close.
        std::io::Write::write_all(&mut pipelining_client, b"GET / HTTP/1.1\r\n\r\n").unwrap();
        std::thread::sleep(std::time::Duration::from_millis(50));
        watch.borrow_mut().sweep(false);
        let woken: Vec<usize> = counts.iter().map(|c| c.0.load(Ordering::Relaxed)).collect();
        assert_eq!(woken, [0, 1, 0]);
        assert_eq!(poll_all(&mut waits), [false, true, false]);
        // Shutdown's cut wakes every request still waiting.
        watch.borrow_mut().sweep(true);
        assert_eq!(poll_all(&mut waits), [true, true, true]);
        assert_eq!(watch.borrow().len(), 3);
        drop(waits);
        assert!(watch.borrow().is_empty());
        // Slots are reused.
        let again = ClientGone::new(&watch, kept_server.as_raw_fd());
        assert_eq!(watch.borrow().slots.len(), 3);
        drop(again);
    }
}
