//! What the threads share: the state the control core publishes for the data cores, and the
//! messages on the channels between them. No logic lives here; the planes read and write it.
//!
//! - [`Shared`]: one per gateway, behind an `Arc` every thread holds. The control core is the
//!   only writer of the published state (the worker table's slots and roster, the model catalog,
//!   the tree gauges); each data core writes only its own rows (in-flight credits, counters) and
//!   its own queues.
//! - Data core to control core, one bounded queue per data core and kind: [`DispatchRecord`]
//!   (the index learns where a request went, spec step 7), [`FlightRecord`] (a request on the
//!   KV-event index began or ended, for its in-flight overlay) and [`AttemptRecord`] (an upstream
//!   attempt's outcome, for the worker's circuit breaker). A full queue drops the message and the
//!   data core counts the drop: routing stays correct, only recency or a breaker's reaction lags.
//! - Admin calls: an [`AdminRequest`] queued for the control core (the only writer of worker
//!   state) and its [`AdminReply`], which the data core polls without blocking.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use arc_swap::ArcSwap;
use crossbeam_queue::ArrayQueue;

use crate::config::Config;
use crate::ids::WorkerId;
use crate::index::kv::{FlightEnd, FlightId};
use crate::index::ModelGauges;
use crate::kv_events::{IndexGauges, StreamStats};
use crate::limits::{
    ADMIN_QUEUE_CAPACITY, ATTEMPT_QUEUE_CAPACITY, DISPATCH_QUEUE_CAPACITY, KV_FLIGHT_QUEUE_CAPACITY,
};
use crate::mesh::MeshLink;
use crate::metrics::Metrics;
use crate::policy::{PolicyMetrics, RecordKey};
use crate::workers::admin::AdminRoute;
use crate::workers::breaker::AttemptOutcome;
use crate::workers::catalog::ModelCatalog;
use crate::workers::table::WorkerTable;

/// State shared by the control core (the only writer of what it publishes) and the data cores.
#[derive(Debug)]
pub struct Shared {
    /// The validated configuration.
    pub config: Config,
    /// Workers, their signals and in-flight credits.
    pub table: WorkerTable,
    /// Which workers serve which model, and the gateway's `/v1/models` answer.
    pub catalog: ArcSwap<ModelCatalog>,
    /// Tree gauges by model name, published by the control core after each eviction cycle.
    pub tree_gauges: ArcSwap<Vec<(String, ModelGauges)>>,
    /// Live heads of the hash index by model name, published after each sweep.
    pub placement_gauges: ArcSwap<Vec<(String, u64)>>,
    /// Each followed worker's KV-event stream, published when it changes.
    pub kv_streams: ArcSwap<Vec<StreamStats>>,
    /// The KV-event index's size, published with the streams.
    pub kv_index_gauges: ArcSwap<IndexGauges>,
    /// One dispatch-record queue per data core (`core_id`), drained by the control core.
    pub dispatch_queues: Box<[ArrayQueue<DispatchRecord>]>,
    /// One flight-record queue per data core (`core_id`): the KV-event index's in-flight
    /// overlay, drained by the control core.
    pub flight_queues: Box<[ArrayQueue<FlightRecord>]>,
    /// One attempt-record queue per data core (`core_id`), drained by the control core.
    pub attempt_queues: Box<[ArrayQueue<AttemptRecord>]>,
    /// Admin calls waiting for the control core.
    pub admin_queue: ArrayQueue<AdminRequest>,
    /// Per-core counters (each data core writes its own slot, the control core the last).
    pub metrics: Metrics,
    /// Per-data-core cache_aware decision counters (`smg_cache_aware_*`).
    pub policy_metrics: Box<[Arc<PolicyMetrics>]>,
    /// The mesh's queues and counters (`--enable-mesh`), shared by the control core and the
    /// mesh thread; data cores never touch it.
    pub mesh: Option<MeshLink>,
    shutdown: AtomicBool,
    started: Instant,
}

impl Shared {
    /// Shared state for `config`, with its workers in the table and empty queues.
    pub fn new(config: Config) -> Self {
        let cores = config.data_cores;
        Shared {
            table: WorkerTable::new(cores, &config.workers),
            catalog: ArcSwap::from_pointee(ModelCatalog::default()),
            tree_gauges: ArcSwap::from_pointee(Vec::new()),
            placement_gauges: ArcSwap::from_pointee(Vec::new()),
            kv_streams: ArcSwap::from_pointee(Vec::new()),
            kv_index_gauges: ArcSwap::from_pointee(IndexGauges::default()),
            dispatch_queues: (0..cores)
                .map(|_| ArrayQueue::new(DISPATCH_QUEUE_CAPACITY))
                .collect(),
            flight_queues: (0..cores)
                .map(|_| ArrayQueue::new(KV_FLIGHT_QUEUE_CAPACITY))
                .collect(),
            attempt_queues: (0..cores)
                .map(|_| ArrayQueue::new(ATTEMPT_QUEUE_CAPACITY))
                .collect(),
            admin_queue: ArrayQueue::new(ADMIN_QUEUE_CAPACITY),
            metrics: Metrics::new(cores),
            policy_metrics: (0..cores).map(|_| Arc::default()).collect(),
            mesh: config.mesh.as_ref().map(|_| MeshLink::default()),
            shutdown: AtomicBool::new(false),
            started: Instant::now(),
            config,
        }
    }

    /// Whether shutdown has begun.
    pub fn is_shutting_down(&self) -> bool {
        self.shutdown.load(Ordering::Relaxed)
    }

    /// Starts shutdown.
    pub fn begin_shutdown(&self) {
        self.shutdown.store(true, Ordering::Relaxed);
    }

    /// Milliseconds since the gateway started: the clock of dispatch records.
    pub fn tick_now(&self) -> u64 {
        self.started.elapsed().as_millis() as u64
    }
}

/// What a data core tells the control core about one dispatched request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DispatchRecord {
    /// The worker the request went to.
    pub worker: WorkerId,
    /// `Shared::tick_now` when it was dispatched.
    pub tick: u64,
    /// The request's index key (cache_aware): the index learns from every dispatch.
    pub key: RecordKey,
}

/// A request dispatched on the KV-event index, for its in-flight overlay: its start (the
/// worker has the request), then its end, from the same data core in that order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum FlightRecord {
    /// The worker has the request, whose prompt's block keys (those its engine had not
    /// confirmed when it was looked up) are `keys`.
    Dispatched {
        /// The request, as the overlay names it.
        id: FlightId,
        /// The worker it went to.
        worker: WorkerId,
        /// Its block keys (`index::kv::chain_hashes`), in order.
        keys: Box<[u64]>,
    },
    /// The request ended.
    Ended {
        /// The request.
        id: FlightId,
        /// How.
        end: FlightEnd,
    },
}

/// One upstream attempt's outcome, for the worker's circuit breaker.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AttemptRecord {
    /// The worker tried.
    pub worker: WorkerId,
    /// What the attempt means for its circuit.
    pub outcome: AttemptOutcome,
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

/// The control core's answer to an admin call: status and JSON body.
#[derive(Debug, Default)]
pub struct AdminReply {
    answer: Mutex<Option<(u16, String)>>,
}

impl AdminReply {
    /// Stores the answer (control core).
    pub fn set(&self, status: u16, body: String) {
        if let Ok(mut slot) = self.answer.lock() {
            *slot = Some((status, body));
        }
    }

    /// Takes the answer if it is there (data core; never waits on the lock).
    pub fn try_take(&self) -> Option<(u16, String)> {
        self.answer.try_lock().ok()?.take()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reply_is_taken_once() {
        let reply = AdminReply::default();
        assert_eq!(reply.try_take(), None);
        reply.set(200, "{}".into());
        assert_eq!(reply.try_take(), Some((200, "{}".to_string())));
        assert_eq!(reply.try_take(), None);
    }
}
