//! The control plane: the control core, the single writer of shared state. It runs on its own
//! thread (`kvgate-control`) with its own monoio runtime; nothing here is on a data core's
//! request path, and no data core ever waits for it.
//!
//! [`ControlCore::run`] turns every `CONTROL_TURN`: it drains the data cores' dispatch records
//! into the index (`index_upkeep`), lets the worker lifecycle take its turn (`workers`: attempt
//! outcomes into the circuit breakers, probe rounds from `monitor`'s schedule run by `probes`,
//! admin calls, drains and purges), purges removed workers from the index, and keeps the index
//! within budget; in tree mode it also runs the KV-event side (`kv_events`: subscriptions on
//! their own thread, `kv_subscriber`, and the events they hand on, applied to the KV-event
//! index). Beside the loop, `exposition` serves Prometheus `/metrics`.

pub mod exposition;
pub mod index_upkeep;
pub mod kv_events;
pub mod kv_subscriber;
pub mod monitor;
pub mod probes;
pub mod workers;

use std::net::TcpListener as StdTcpListener;
use std::rc::Rc;
use std::sync::Arc;

use monoio::net::TcpListener;

use crate::index::kv::KvIndexWriter;
use crate::limits::CONTROL_TURN;
use crate::metrics::Counter;
use crate::shared::Shared;
use index_upkeep::{IndexUpkeep, IndexWriters};
use kv_events::KvEvents;
use workers::WorkerDriver;

/// The control core's state, owned by its thread.
#[derive(Debug)]
pub struct ControlCore {
    shared: Arc<Shared>,
    /// The index (cache_aware only; `None` also when it could not start).
    index: Option<IndexUpkeep>,
    /// The KV-event index and its subscriptions (cache_aware in tree mode).
    kv_events: Option<KvEvents>,
}

impl ControlCore {
    /// A control core over `shared`, the only writer of the index `writer` writes and of the
    /// KV-event index `kv_writer` writes.
    pub fn new(
        shared: Arc<Shared>,
        writer: Option<IndexWriters>,
        kv_writer: Option<KvIndexWriter>,
    ) -> Self {
        let index = writer.map(|writer| IndexUpkeep::new(writer, &shared.config.policy));
        let ttl = shared.config.policy.kv_indexer_ttl;
        let kv_events = kv_writer.map(|writer| KvEvents::new(writer, ttl));
        ControlCore {
            shared,
            index,
            kv_events,
        }
    }

    /// Runs until shutdown, with the metrics server as a task beside the loop.
    pub async fn run(mut self, metrics_listener: StdTcpListener) {
        let shared = self.shared.clone();
        match TcpListener::from_std(metrics_listener) {
            Ok(listener) => {
                monoio::spawn(exposition::serve_metrics(Rc::new(listener), shared.clone()));
            }
            Err(e) => tracing::error!("metrics listener unusable: {e}"),
        }
        if let Some(index) = &self.index {
            index.publish_gauges(&shared);
        }
        let mut workers = WorkerDriver::new(&shared);
        while !shared.is_shutting_down() {
            self.drain_records();
            for id in workers.turn(&shared) {
                if let Some(index) = &mut self.index {
                    index.purge_worker(id, &shared);
                }
                if let Some(kv_events) = &mut self.kv_events {
                    kv_events.purge_worker(id);
                }
            }
            if let Some(kv_events) = &mut self.kv_events {
                kv_events.turn(&shared);
            }
            if let Some(index) = &mut self.index {
                index.upkeep(&shared);
            }
            monoio::time::sleep(CONTROL_TURN).await;
        }
        self.drain_records();
    }

    /// Applies every queued dispatch record.
    fn drain_records(&mut self) {
        let mut applied = 0u64;
        for queue in self.shared.dispatch_queues.iter() {
            while let Some(record) = queue.pop() {
                if let Some(index) = &mut self.index {
                    index.apply_record(record, &self.shared);
                }
                applied += 1;
            }
        }
        if applied > 0 {
            let counters = self.shared.metrics.control();
            counters.add(Counter::DispatchRecordsApplied, applied);
        }
    }
}
