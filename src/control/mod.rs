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
//! index). Beside the loop, `exposition` serves Prometheus `/metrics`. With `--enable-mesh`,
//! `mesh_link` runs the mesh on a thread of its own: the control core queues its tree inserts
//! for it (`MeshOut`) and applies the peers' inserts it queues back.

pub mod discovery;
pub mod exposition;
pub mod grpc_probe;
pub mod index_upkeep;
pub mod kv_events;
pub mod kv_subscriber;
pub mod mesh_link;
pub mod monitor;
pub mod probes;
pub mod tokenizer_fetch;
pub mod workers;

use std::collections::HashMap;
use std::net::TcpListener as StdTcpListener;
use std::rc::Rc;
use std::sync::Arc;
use std::time::{Duration, Instant};

use monoio::net::TcpListener;

use crate::ids::WorkerId;
use crate::index::kv::KvIndexWriter;
use crate::limits::CONTROL_TURN;
use crate::limits::MESH_INSERTS_PER_TURN_MAX;
use crate::mesh::{is_shareable_worker, tree_kind, LocalInsert, MeshCounter};
use crate::metrics::Counter;
use crate::policy::MeshShare;
use crate::shared::{DispatchRecord, Shared};
use crate::workers::table::Roster;
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
    /// Worker URLs by id for the mesh (which names workers by URL), per published roster.
    mesh_urls: MeshUrls,
}

/// The roster's URLs, rebuilt when the control core publishes a new roster.
#[derive(Debug, Default)]
struct MeshUrls {
    roster: Option<Arc<Roster>>,
    by_id: HashMap<WorkerId, Arc<str>>,
    by_url: HashMap<Arc<str>, WorkerId>,
}

impl MeshUrls {
    fn refresh(&mut self, shared: &Shared) {
        let roster = shared.table.roster();
        if self
            .roster
            .as_ref()
            .is_some_and(|r| Arc::ptr_eq(r, &roster))
        {
            return;
        }
        self.by_id.clear();
        self.by_url.clear();
        for worker in &roster.workers {
            let url: Arc<str> = Arc::from(worker.spec.url.as_str());
            self.by_id.insert(worker.id, url.clone());
            self.by_url.insert(url, worker.id);
        }
        self.roster = Some(Arc::clone(&roster));
    }
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
        let api_key = shared.config.api_key.as_deref();
        let kv_events = kv_writer.map(|writer| KvEvents::new(writer, ttl).with_api_key(api_key));
        ControlCore {
            shared,
            index,
            kv_events,
            mesh_urls: MeshUrls::default(),
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
        let count_turn = count_turn();
        while !shared.is_shutting_down() {
            self.drain_records();
            self.apply_mesh_inserts();
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
            match count_turn {
                None => monoio::time::sleep(CONTROL_TURN).await,
                Some(turn) => {
                    // The runtime's other tasks (probes, /metrics) run in a short wait on the
                    // ring; the thread then sleeps in a call valgrind knows blocks.
                    monoio::time::sleep(COUNT_TASKS_WAIT).await;
                    std::thread::sleep(turn);
                }
            }
        }
        self.drain_records();
    }

    /// Applies every queued dispatch record.
    fn drain_records(&mut self) {
        let mut applied = 0u64;
        let shared = self.shared.clone();
        for queue in shared.dispatch_queues.iter() {
            while let Some(record) = queue.pop() {
                self.share_with_mesh(&record);
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
        self.drain_flights();
    }

    /// Applies every queued flight record to the KV-event index's in-flight overlay (drained,
    /// and dropped, when there is no KV-event index).
    fn drain_flights(&mut self) {
        let now_ms = self.shared.tick_now();
        for queue in self.shared.flight_queues.iter() {
            while let Some(record) = queue.pop() {
                if let Some(kv_events) = &mut self.kv_events {
                    kv_events.apply_flight(record, now_ms);
                }
            }
        }
    }

    /// Queues a tree insert for the mesh's next gossip round (`--enable-mesh`): string and
    /// token trees only, not KV-pressure picks, never a host-local worker. A full queue drops
    /// it (counted); the control core never waits for the mesh.
    fn share_with_mesh(&mut self, record: &DispatchRecord) {
        let Some(link) = self.shared.mesh.as_ref() else {
            return;
        };
        if self.index.is_none()
            || record.key.mesh == MeshShare::Local
            || tree_kind(&record.key.key).is_none()
        {
            return;
        }
        self.mesh_urls.refresh(&self.shared);
        let Some(url) = self.mesh_urls.by_id.get(&record.worker) else {
            return;
        };
        if !is_shareable_worker(url) {
            return;
        }
        let insert = LocalInsert {
            namespace: record.key.namespace,
            key: record.key.key.clone(),
            worker_url: url.clone(),
        };
        if link.outbound.push(insert).is_err() {
            link.counters.add(MeshCounter::DeltasDropped, 1);
        }
    }

    /// Applies the inserts peers taught the mesh, for workers this gateway routes to too.
    fn apply_mesh_inserts(&mut self) {
        let (Some(link), Some(index)) = (self.shared.mesh.as_ref(), self.index.as_mut()) else {
            return;
        };
        if link.inbound.is_empty() {
            return;
        }
        let started = Instant::now();
        self.mesh_urls.refresh(&self.shared);
        let tick = self.shared.tick_now();
        let mut applied = 0;
        for _ in 0..MESH_INSERTS_PER_TURN_MAX {
            let Some(insert) = link.inbound.pop() else {
                break;
            };
            let Some(&worker) = self.mesh_urls.by_url.get(&insert.worker_url) else {
                continue;
            };
            if index.apply_remote(insert.namespace, &insert.key, worker, tick) {
                applied += 1;
            }
        }
        link.counters.add(MeshCounter::InsertsApplied, applied);
        let micros = started.elapsed().as_micros() as u64;
        link.counters.add(MeshCounter::ApplyMicros, micros);
    }
}

/// The environment variable that sets the control core's counting mode, for instruction counts
/// only (`scripts/count-proxy.sh`).
const COUNT_TURN_ENV: &str = "KVGATE_COUNT_CONTROL_TURN_MS";
/// In counting mode, how long each turn lets the control core's own tasks run.
const COUNT_TASKS_WAIT: Duration = Duration::from_millis(1);

/// The counting mode's turn: `KVGATE_COUNT_CONTROL_TURN_MS` milliseconds when that is set to a
/// number (`scripts/count-proxy.sh` sets it, nothing else should), `None` otherwise. Under
/// valgrind a process's threads take turns on one lock, and a thread waiting in
/// `io_uring_enter` appears to keep it (a control core waiting 1 s on its ring between turns
/// kept kvgate from answering for minutes): the control core's wait for its next turn held up
/// the data core each time, and its turns every 10 ms, work that follows time and not
/// requests, stayed in a per-request count.
/// In counting mode the control core waits in `nanosleep` instead, which lets the data core run,
/// and turns less often. The data core's path is the same: its records wait longer in their
/// queue (16 Ki deep) before the index learns them.
fn count_turn() -> Option<Duration> {
    let ms = std::env::var(COUNT_TURN_ENV).ok()?.parse().ok()?;
    Some(Duration::from_millis(ms))
}
