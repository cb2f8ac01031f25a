//! [`DataCore`]: one data core's state, shared by the tasks of its connections (one thread, so
//! `RefCell`s, never held across an `.await`). Besides the `Shared` state it reads, a core owns
//! its router (the policy and what it remembers), its upstream keep-alive pool, its counters and
//! its end of the queues to the control core.

use std::cell::{Cell, RefCell};
use std::rc::Rc;
use std::sync::Arc;

use super::buffers::SpareBuffers;
use super::pool::UpstreamPool;
use crate::error::ErrorKind;
use crate::grpc::Channels;
use crate::ids::WorkerId;
use crate::index::kv::{FlightEnd, FlightId};
use crate::limits::MEMORY_RETURN_DELAY;
use crate::metrics::{CoreMetrics, Counter};
use crate::net::memory;
use crate::policy::{RecordKey, Router};
use crate::shared::{AttemptRecord, DispatchRecord, FlightRecord, Shared};
use crate::workers::breaker::AttemptOutcome;

/// The request body bytes a data core holds, against `--max-inflight-body-bytes-per-core`
/// (one thread: a `Cell`). A connection holds a charge for the body it reads and releases it
/// when the request is done.
#[derive(Debug)]
pub struct BodyBudget {
    held_bytes: Cell<usize>,
    max_bytes: usize,
}

impl BodyBudget {
    /// A budget of `max_bytes`, none held.
    pub fn new(max_bytes: usize) -> Self {
        BodyBudget {
            held_bytes: Cell::new(0),
            max_bytes,
        }
    }

    /// Raises a connection's `charged` bytes to `bytes` when the budget has room; returns
    /// whether it did (a charge never shrinks here).
    pub fn charge_up_to(&self, charged: &mut usize, bytes: usize) -> bool {
        let more = bytes.saturating_sub(*charged);
        let held = self.held_bytes.get();
        if more > self.max_bytes - held {
            return false;
        }
        self.held_bytes.set(held + more);
        *charged += more;
        true
    }

    /// Gives back a connection's whole charge.
    pub fn release(&self, charged: &mut usize) {
        self.held_bytes.set(self.held_bytes.get() - *charged);
        *charged = 0;
    }

    /// Bytes held now.
    pub fn held_bytes(&self) -> usize {
        self.held_bytes.get()
    }
}

/// One data core's state.
#[derive(Debug)]
pub struct DataCore {
    /// This core's number: its slot in every per-core array.
    pub core_id: usize,
    /// State shared with the control core and the other data cores.
    pub shared: Arc<Shared>,
    /// Idle upstream connections.
    pub pool: RefCell<UpstreamPool>,
    /// HTTP/2 connections to gRPC workers, multiplexed by every request of this core.
    pub grpc: RefCell<Channels>,
    /// Empty buffers lent by streams while they wait for their worker.
    pub spare_buffers: RefCell<SpareBuffers>,
    /// The routing policy and what this core remembers of its dispatches (in PD mode, the
    /// prefill side's, which owns the index).
    pub router: RefCell<Router>,
    /// The decode side's policy under `--pd-disaggregation` (no index: decode placement is
    /// about load); `None` in regular mode.
    pub decode_router: Option<RefCell<Router>>,
    /// Requests being served (for graceful shutdown).
    pub requests_in_flight: Cell<usize>,
    /// Request body bytes held, against `--max-inflight-body-bytes-per-core`.
    pub body_budget: BodyBudget,
    /// Set when shutdown's grace period is over: requests still waiting on a worker end now.
    pub cutting_requests: Cell<bool>,
    /// A return of freed pages to the system is scheduled (`return_memory_soon`).
    memory_return_pending: Cell<bool>,
    /// Requests this core sent to the KV-event index's in-flight overlay (their ids).
    flights_sent: Cell<u64>,
}

impl DataCore {
    /// Data core `core_id` with `router` and an empty pool.
    pub fn new(core_id: usize, shared: Arc<Shared>, router: Router) -> Self {
        let max_body_bytes = shared.config.max_inflight_body_bytes_per_core;
        let pool_idle_timeout = shared.config.upstream_pool_idle_timeout;
        let bearer = shared.config.api_key.as_deref().map(Arc::from);
        DataCore {
            core_id,
            shared,
            pool: RefCell::new(UpstreamPool::with_idle_timeout(pool_idle_timeout)),
            grpc: RefCell::new(Channels::with_bearer(bearer)),
            spare_buffers: RefCell::new(SpareBuffers::new()),
            router: RefCell::new(router),
            decode_router: None,
            requests_in_flight: Cell::new(0),
            cutting_requests: Cell::new(false),
            memory_return_pending: Cell::new(false),
            flights_sent: Cell::new(0),
            body_budget: BodyBudget::new(max_body_bytes),
        }
    }

    /// This core with `router` choosing the decode side of prefill/decode pairs.
    pub fn with_decode_router(mut self, router: Router) -> Self {
        self.decode_router = Some(RefCell::new(router));
        self
    }

    /// Gives the pages of the buffers this core freed back to the system in
    /// `MEMORY_RETURN_DELAY`: called when a connection lets go of a grown read buffer (a large
    /// body), so that memory a burst of large bodies took is returned once the burst is over,
    /// even if the core then goes quiet. One return for all the buffers freed meanwhile.
    pub fn return_memory_soon(self: &Rc<Self>) {
        if self.memory_return_pending.replace(true) {
            return;
        }
        let core = Rc::clone(self);
        monoio::spawn(async move {
            monoio::time::sleep(MEMORY_RETURN_DELAY).await;
            core.memory_return_pending.set(false);
            memory::return_freed_pages();
        });
    }

    /// This core's counters.
    pub fn metrics(&self) -> &CoreMetrics {
        self.shared.metrics.core(self.core_id)
    }

    /// Counts a failed exchange with a worker, or a client that went, by its kind (other kinds
    /// are counted by the status they are answered with).
    pub fn count_error(&self, kind: ErrorKind) {
        let counter = match kind {
            ErrorKind::UpstreamConnect => Counter::UpstreamConnectErrors,
            ErrorKind::UpstreamClosed => Counter::UpstreamClosedErrors,
            ErrorKind::UpstreamMalformed => Counter::UpstreamMalformedErrors,
            ErrorKind::UpstreamTimeout => Counter::UpstreamTimeouts,
            ErrorKind::ClientClosed => Counter::DownstreamAborts,
            _ => return,
        };
        self.metrics().incr(counter);
    }

    /// Tells the control core what an attempt means for `worker`'s circuit breaker.
    pub fn report_attempt(&self, worker: WorkerId, outcome: AttemptOutcome) {
        let record = AttemptRecord { worker, outcome };
        if self.shared.attempt_queues[self.core_id]
            .push(record)
            .is_err()
        {
            self.metrics().incr(Counter::AttemptRecordsDropped);
        }
    }

    /// Tells the KV-event index's in-flight overlay that `worker` has a request whose block keys
    /// are `keys`; the id names the request's end ([`DataCore::send_flight_end`]). `None`: the
    /// queue was full (counted with the dispatch records), the overlay never hears of it.
    pub fn send_flight_start(&self, worker: WorkerId, keys: Box<[u64]>) -> Option<FlightId> {
        let sent = self.flights_sent.get();
        self.flights_sent.set(sent.wrapping_add(1));
        // This core's number above its sequence: ids from different cores never meet.
        let id = FlightId(((self.core_id as u64) << 48) | (sent & ((1 << 48) - 1)));
        let record = FlightRecord::Dispatched { id, worker, keys };
        match self.shared.flight_queues[self.core_id].push(record) {
            Ok(()) => Some(id),
            Err(_) => {
                self.metrics().incr(Counter::DispatchRecordsDropped);
                None
            }
        }
    }

    /// Tells the in-flight overlay that request `id` ended (`end`).
    pub fn send_flight_end(&self, id: FlightId, end: FlightEnd) {
        let record = FlightRecord::Ended { id, end };
        if self.shared.flight_queues[self.core_id]
            .push(record)
            .is_err()
        {
            self.metrics().incr(Counter::DispatchRecordsDropped);
        }
    }

    /// Sends the control core a dispatch record: the index learns `key` went to `worker`.
    pub fn send_dispatch_record(&self, worker: WorkerId, tick: u64, key: RecordKey) {
        let record = DispatchRecord { worker, tick, key };
        if self.shared.dispatch_queues[self.core_id]
            .push(record)
            .is_err()
        {
            self.metrics().incr(Counter::DispatchRecordsDropped);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn body_budget_charges_up_to_its_bound_and_releases_whole_charges() {
        let budget = BodyBudget::new(100);
        let (mut a, mut b) = (0, 0);
        assert!(budget.charge_up_to(&mut a, 60));
        assert!(budget.charge_up_to(&mut a, 30), "a charge never shrinks");
        assert_eq!(a, 60);
        assert!(!budget.charge_up_to(&mut b, 41));
        assert_eq!((b, budget.held_bytes()), (0, 60));
        assert!(budget.charge_up_to(&mut b, 40));
        assert!(!budget.charge_up_to(&mut a, 61), "full");
        budget.release(&mut a);
        assert_eq!((a, budget.held_bytes()), (0, 40));
        assert!(budget.charge_up_to(&mut b, 100));
        budget.release(&mut b);
        assert_eq!(budget.held_bytes(), 0);
    }
}
