//! [`DataCore`]: one data core's state, shared by the tasks of its connections (one thread, so
//! `RefCell`s, never held across an `.await`). Besides the `Shared` state it reads, a core owns
//! its router (the policy and what it remembers), its upstream keep-alive pool, its counters and
//! its end of the queues to the control core.

use std::cell::{Cell, RefCell};
use std::sync::Arc;

use super::pool::UpstreamPool;
use crate::ids::WorkerId;
use crate::metrics::{CoreMetrics, Counter};
use crate::policy::{RecordKey, Router};
use crate::shared::{AttemptRecord, DispatchRecord, Shared};
use crate::workers::breaker::AttemptOutcome;

/// One data core's state.
#[derive(Debug)]
pub struct DataCore {
    /// This core's number: its slot in every per-core array.
    pub core_id: usize,
    /// State shared with the control core and the other data cores.
    pub shared: Arc<Shared>,
    /// Idle upstream connections.
    pub pool: RefCell<UpstreamPool>,
    /// The routing policy and what this core remembers of its dispatches.
    pub router: RefCell<Router>,
    /// Requests being served (for graceful shutdown).
    pub requests_in_flight: Cell<usize>,
    /// Set when shutdown's grace period is over: requests still waiting on a worker end now.
    pub cutting_requests: Cell<bool>,
}

impl DataCore {
    /// Data core `core_id` with `router` and an empty pool.
    pub fn new(core_id: usize, shared: Arc<Shared>, router: Router) -> Self {
        DataCore {
            core_id,
            shared,
            pool: RefCell::new(UpstreamPool::new()),
            router: RefCell::new(router),
            requests_in_flight: Cell::new(0),
            cutting_requests: Cell::new(false),
        }
    }

    /// This core's counters.
    pub fn metrics(&self) -> &CoreMetrics {
        self.shared.metrics.core(self.core_id)
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
