//! What the data cores and the control core exchange about workers, besides the worker table:
//! attempt outcomes for the circuit breakers, admin requests and their replies, and the
//! published model catalog.
//!
//! Owns [`WorkerShared`] (one field of the gateway's `Shared`), [`AttemptRecord`] (one
//! upstream attempt's outcome, pushed by a data core into its own bounded queue; a full queue
//! drops the record and counts it — a breaker then reacts a little later, routing stays correct)
//! and [`AdminRequest`] / [`AdminReply`] (an admin call handed to the control core, the only
//! writer; the data core polls the reply without blocking).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use arc_swap::ArcSwap;
use crossbeam_queue::ArrayQueue;

use super::{AdminRoute, ModelCatalog};
use crate::workers::breaker::AttemptOutcome;
use crate::workers::WorkerId;

/// Attempt records one data core may queue between two control-core turns. A turn is 10 ms; at
/// 100k attempts/s per core that is 1,000 records, so 16k leaves a wide margin.
pub const ATTEMPT_QUEUE_CAPACITY: usize = 16 << 10;

/// Admin requests queued at once: admin calls are rare; more in flight is abuse.
pub const ADMIN_QUEUE_CAPACITY: usize = 64;

/// One upstream attempt's outcome, for the worker's circuit breaker.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AttemptRecord {
    /// The worker tried.
    pub worker: WorkerId,
    /// What the attempt means for its circuit.
    pub outcome: AttemptOutcome,
}

/// The control core's answer to an admin request: status and JSON body.
#[derive(Debug, Default)]
pub struct AdminReply {
    answer: Mutex<Option<(u16, String)>>,
}

impl AdminReply {
    /// Store the answer (control core).
    pub fn set(&self, status: u16, body: String) {
        if let Ok(mut slot) = self.answer.lock() {
            *slot = Some((status, body));
        }
    }

    /// Take the answer if it is there (data core; never waits on the lock).
    pub fn try_take(&self) -> Option<(u16, String)> {
        self.answer.try_lock().ok()?.take()
    }
}

/// An admin call handed to the control core.
#[derive(Debug)]
pub struct AdminRequest {
    /// Which endpoint.
    pub route: AdminRoute,
    /// The request body (POST).
    pub body: Vec<u8>,
    /// Where the answer goes.
    pub reply: Arc<AdminReply>,
}

/// Worker state shared beyond the worker table.
#[derive(Debug)]
pub struct WorkerShared {
    /// One attempt-record queue per data core, drained by the control core.
    pub attempts: Box<[ArrayQueue<AttemptRecord>]>,
    /// Attempt records dropped because a queue was full.
    pub attempts_dropped: AtomicU64,
    /// Admin calls waiting for the control core.
    pub admin: ArrayQueue<AdminRequest>,
    /// Which workers serve which model (rebuilt by the control core on discovery).
    pub catalog: ArcSwap<ModelCatalog>,
}

impl WorkerShared {
    /// Queues for `data_cores` cores and an empty catalog (every model routable).
    pub fn new(data_cores: usize) -> Self {
        WorkerShared {
            attempts: (0..data_cores)
                .map(|_| ArrayQueue::new(ATTEMPT_QUEUE_CAPACITY))
                .collect(),
            attempts_dropped: AtomicU64::new(0),
            admin: ArrayQueue::new(ADMIN_QUEUE_CAPACITY),
            catalog: ArcSwap::from_pointee(ModelCatalog::default()),
        }
    }

    /// Record an attempt outcome from data core `core`.
    pub fn record_attempt(&self, core: usize, worker: WorkerId, outcome: AttemptOutcome) {
        let Some(queue) = self.attempts.get(core) else {
            return;
        };
        if queue.push(AttemptRecord { worker, outcome }).is_err() {
            self.attempts_dropped.fetch_add(1, Ordering::Relaxed);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn attempt_queue_is_bounded_and_counts_drops() {
        let shared = WorkerShared::new(1);
        for _ in 0..ATTEMPT_QUEUE_CAPACITY + 3 {
            shared.record_attempt(0, WorkerId(1), AttemptOutcome::Failure);
        }
        shared.record_attempt(9, WorkerId(1), AttemptOutcome::Failure);
        assert_eq!(shared.attempts[0].len(), ATTEMPT_QUEUE_CAPACITY);
        assert_eq!(shared.attempts_dropped.load(Ordering::Relaxed), 3);
    }

    #[test]
    fn reply_is_taken_once() {
        let reply = AdminReply::default();
        assert_eq!(reply.try_take(), None);
        reply.set(200, "{}".into());
        assert_eq!(reply.try_take(), Some((200, "{}".to_string())));
        assert_eq!(reply.try_take(), None);
    }
}
