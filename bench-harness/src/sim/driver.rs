//! The async driver of one [`Engine`]: [`EngineHandle`] runs the engine's steps on a tokio task,
//! sleeping real time = simulated time / speedup, and routes each step's tokens to the requests'
//! channels.
//!
//! The engine's clock is authoritative: consecutive steps chain on it (the next step starts where
//! the last one ended), and a step that ends at simulated `t` is delivered at real
//! `start + t / speedup`. The timer's granularity is 1 ms, so at high speed-ups (a 6 ms decode
//! step is 60 µs at `--speedup 100`) the driver wakes late and then runs the steps it owes back to
//! back, yielding between them: tokens reach clients in small bursts, but simulated time stays
//! exact. A request is stamped with the real clock on arrival; an idle engine jumps to that
//! stamp, and no request is admitted before it. A request whose receiver is gone is cancelled in the engine,
//! so its KV pages return at once; [`RequestGuard`] does the same when a response is dropped.
//!
//! With an [`EventSink`], the cache changes of every engine call (an admission pass, a step's
//! end, a flush) leave as one KV-event batch, numbered before the engine's lock is released so
//! that batches keep the engine's order.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Instant;

use tokio::sync::{mpsc, Notify};

use super::engine::{Emit, Engine, EngineTotals, LoadSnapshot, RequestId, SimRequest, SubmitError};
use super::publisher::EventSink;

/// Steps a lagging driver runs before yielding to the connection tasks: bounds how long it
/// keeps the (current-thread) runtime while catching up, about a millisecond of work.
const STEPS_PER_TURN_MAX: u32 = 64;

/// Maps real time to simulated microseconds.
#[derive(Debug, Clone, Copy)]
pub struct SimClock {
    start: Instant,
    speedup: f64,
}

impl SimClock {
    /// A clock starting now, running `speedup` times faster than real time.
    pub fn new(speedup: f64) -> Self {
        SimClock {
            start: Instant::now(),
            speedup: speedup.max(f64::MIN_POSITIVE),
        }
    }

    /// Simulated microseconds since the start.
    pub fn now_us(&self) -> u64 {
        (self.start.elapsed().as_secs_f64() * 1e6 * self.speedup) as u64
    }

    /// The real instant at which simulated time `sim_us` is reached.
    pub fn instant_at(&self, sim_us: u64) -> Instant {
        self.start + std::time::Duration::from_secs_f64(sim_us as f64 / 1e6 / self.speedup)
    }
}

#[derive(Debug)]
struct Core {
    engine: Engine,
    streams: HashMap<RequestId, mpsc::UnboundedSender<Emit>>,
}

#[derive(Debug)]
struct Shared {
    core: Mutex<Core>,
    wake: Notify,
    clock: SimClock,
    /// Where the engine's KV events go, when it publishes them.
    events: Option<Arc<EventSink>>,
}

/// A running simulated engine; cheap to clone.
#[derive(Debug, Clone)]
pub struct EngineHandle {
    shared: Arc<Shared>,
}

/// Cancels its request in the engine when dropped (a finished request is unaffected).
#[derive(Debug)]
pub struct RequestGuard {
    handle: EngineHandle,
    id: RequestId,
    arrival_us: u64,
}

impl RequestGuard {
    /// The engine's id of the guarded request.
    pub fn id(&self) -> RequestId {
        self.id
    }

    /// Simulated arrival time of the guarded request.
    pub fn arrival_us(&self) -> u64 {
        self.arrival_us
    }
}

impl Drop for RequestGuard {
    fn drop(&mut self) {
        let mut core = self.handle.lock();
        core.streams.remove(&self.id);
        core.engine.cancel(self.id);
    }
}

impl EngineHandle {
    /// Starts `engine` on the current tokio runtime; its KV events (if it records them) go to
    /// `events`.
    pub fn spawn(engine: Engine, clock: SimClock, events: Option<Arc<EventSink>>) -> Self {
        let shared = Arc::new(Shared {
            core: Mutex::new(Core {
                engine,
                streams: HashMap::new(),
            }),
            wake: Notify::new(),
            clock,
            events,
        });
        let handle = EngineHandle { shared };
        tokio::spawn(handle.clone().drive());
        handle
    }

    /// Queues a request; its tokens arrive on the receiver, the last one with `finished`.
    pub fn submit(
        &self,
        request: SimRequest,
    ) -> Result<(RequestGuard, mpsc::UnboundedReceiver<Emit>), SubmitError> {
        let (sender, receiver) = mpsc::unbounded_channel();
        let (id, arrival_us) = {
            let mut core = self.lock();
            // Stamped under the lock, so arrival order is queue order.
            let arrival_us = self.shared.clock.now_us();
            let id = core.engine.submit_at(request, arrival_us)?;
            core.streams.insert(id, sender);
            (id, arrival_us)
        };
        self.shared.wake.notify_one();
        Ok((
            RequestGuard {
                handle: self.clone(),
                id,
                arrival_us,
            },
            receiver,
        ))
    }

    /// The load report now.
    pub fn loads(&self) -> LoadSnapshot {
        let now_us = self.shared.clock.now_us();
        self.lock().engine.loads(now_us)
    }

    /// Counters since the start.
    pub fn totals(&self) -> EngineTotals {
        self.lock().engine.totals()
    }

    /// Drops every unreferenced cached page.
    pub fn flush_cache(&self) {
        let mut core = self.lock();
        core.engine.flush_cache();
        self.publish_events(core);
    }

    /// A crash and restart (`Engine::restart`): requests in flight end without an answer, the
    /// cache empties silently, and the KV-event publisher restarts (`EventSink::restart`).
    pub fn restart(&self) {
        let mut core = self.lock();
        core.engine.restart();
        // Dropping the senders ends every response: streams are cut, whole answers fail.
        core.streams.clear();
        if let Some(events) = &self.shared.events {
            // Under the engine's lock: no batch from after the restart is numbered before it.
            events.restart();
        }
    }

    /// Every cached page's key, ascending.
    pub fn cached_keys(&self) -> Vec<u64> {
        self.lock().engine.cached_keys()
    }

    /// Hands the engine's logged cache changes to the sink as one batch. The sink's slot is
    /// taken before `core` is released, so batches are numbered in the engine's order; the
    /// encoding runs after.
    fn publish_events(&self, mut core: MutexGuard<'_, Core>) {
        let Some(sink) = &self.shared.events else {
            return;
        };
        let events = core.engine.take_cache_events();
        if events.is_empty() {
            return;
        }
        let slot = sink.reserve();
        drop(core);
        slot.publish(&events);
    }

    /// Simulated seconds since the start.
    pub fn now_s(&self) -> f64 {
        self.shared.clock.now_us() as f64 / 1e6
    }

    fn lock(&self) -> MutexGuard<'_, Core> {
        // A panic while holding the lock would be a bug in the engine model; keep serving with
        // the state as it is rather than poisoning every later request.
        self.shared
            .core
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    async fn drive(self) {
        let mut steps_since_yield = 0;
        loop {
            // The engine runs on its own clock: it continues where its last step ended, or
            // jumps to the stamped arrival of the next request when idle, so the host's wake-up
            // latency (multiplied by the speed-up) never leaks into simulated time.
            let step_end_us = {
                let mut core = self.lock();
                let step_end_us = core.engine.begin_step(0);
                // Evictions of the admission pass.
                self.publish_events(core);
                step_end_us
            };
            let Some(end_us) = step_end_us else {
                self.shared.wake.notified().await;
                steps_since_yield = 0;
                continue;
            };
            let deadline = self.shared.clock.instant_at(end_us);
            if deadline > Instant::now() {
                tokio::time::sleep_until(deadline.into()).await;
                steps_since_yield = 0;
            } else if steps_since_yield >= STEPS_PER_TURN_MAX {
                tokio::task::yield_now().await;
                steps_since_yield = 0;
            }
            // Steps already due run back to back, so each stream receives all its due tokens
            // before its connection task writes: one write per burst instead of per token.
            self.deliver_step();
            steps_since_yield += 1;
        }
    }

    fn deliver_step(&self) {
        let mut core = self.lock();
        let emits = core.engine.finish_step();
        for emit in emits {
            let delivered = match core.streams.get(&emit.id) {
                Some(sender) => sender.send(emit).is_ok(),
                None => false,
            };
            if emit.finished || !delivered {
                core.streams.remove(&emit.id);
            }
            if !delivered && !emit.finished {
                core.engine.cancel(emit.id);
            }
        }
        self.publish_events(core);
    }
}
