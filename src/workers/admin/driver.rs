//! The control-core side of worker management: one [`WorkerDriver::turn`] per control-core turn
//! drains attempt outcomes into the circuit breakers, runs due probe rounds (on the probe
//! thread), publishes health, circuit, load and overload in the worker table, rebuilds the model
//! catalog, serves admin calls, and drains then purges removed workers.
//!
//! Owns [`WorkerDriver`]. It never blocks: probes run on `ProbeThread`, a `POST /workers`
//! health probe on a short-lived helper thread whose result a later turn picks up. A purge
//! returns the worker's id from `turn` so the control core removes it from every index before
//! the slot can be reused.

use std::sync::mpsc;
use std::sync::Arc;
use std::time::Instant;

use super::shared::{AdminReply, AdminRequest};
use super::{
    parse_add_worker, parse_models, render_worker_list, AdminError, AdminRoute, ModelCatalog,
    WorkerRef, WorkerView,
};
use crate::config::parse_worker_url;
use crate::runtime::Shared;
use crate::workers::breaker::BreakerState;
use crate::workers::health::monitor::{Change, ProbeThread, WorkerMonitor};
use crate::workers::health::probe::{self, HttpUrl};
use crate::workers::health::ProbeOutcome;
use crate::workers::table::{Health, Roster, WorkerEntry};
use crate::workers::{WorkerId, WORKERS_MAX};

/// A `POST /workers` waiting for its health probe.
struct PendingAdd {
    url: String,
    reply: Arc<AdminReply>,
    /// `Ok(models)` when the worker answered its health check (models `None` if discovery failed).
    probed: mpsc::Receiver<Result<Option<Vec<String>>, String>>,
}

/// The control core's worker management.
pub struct WorkerDriver {
    monitor: WorkerMonitor,
    probes: Option<ProbeThread>,
    pending_adds: Vec<PendingAdd>,
}

impl std::fmt::Debug for WorkerDriver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WorkerDriver")
            .field("monitor", &self.monitor)
            .field("pending_adds", &self.pending_adds.len())
            .finish()
    }
}

impl WorkerDriver {
    /// A driver watching the configured workers.
    pub fn new(shared: &Shared) -> Self {
        let now = Instant::now();
        let mut monitor = WorkerMonitor::new(shared.config.worker_policy.clone(), now);
        for w in &shared.table.roster().workers {
            match HttpUrl::parse(&w.spec.url) {
                Ok(addr) => monitor.add(w.id, addr),
                Err(e) => tracing::warn!(worker = %w.spec.url, "not monitored: {e}"),
            }
        }
        let probes = ProbeThread::spawn()
            .map_err(|e| {
                tracing::error!(
                    "cannot start the probe thread; health and load are not monitored: {e}"
                )
            })
            .ok();
        WorkerDriver {
            monitor,
            probes,
            pending_adds: Vec::new(),
        }
    }

    /// One turn; returns the workers purged in it (remove them from every index).
    pub fn turn(&mut self, shared: &Shared) -> Vec<WorkerId> {
        let now = Instant::now();
        let mut changes = Vec::new();
        for queue in shared.workers.attempts.iter() {
            while let Some(record) = queue.pop() {
                changes.extend(
                    self.monitor
                        .record_attempt(record.worker, record.outcome, now),
                );
            }
        }
        if let Some(probes) = &mut self.probes {
            if let Some(results) = probes.try_results() {
                changes.extend(self.monitor.apply(results));
            }
            if !probes.is_busy() && now >= self.monitor.next_due() {
                probes.submit(self.monitor.due_probes(now));
            }
        }
        changes.extend(
            self.monitor
                .tick(now, |id| u64::from(shared.table.inflight(id))),
        );
        while let Some(request) = shared.workers.admin.pop() {
            self.serve_admin(shared, request, now);
        }
        self.finish_adds(shared);
        self.publish(shared, changes)
    }

    /// Publish changes in the worker table; returns the purged workers.
    fn publish(&mut self, shared: &Shared, changes: Vec<Change>) -> Vec<WorkerId> {
        let mut purged = Vec::new();
        let mut models_changed = false;
        for change in changes {
            match change {
                Change::Health(id, healthy) => {
                    tracing::info!(worker = %url_of(shared, id), healthy, "worker health changed");
                    let health = if healthy {
                        Health::Healthy
                    } else {
                        Health::Unhealthy
                    };
                    shared.table.set_health(id, health);
                }
                Change::Breaker(id, state) => {
                    tracing::info!(worker = %url_of(shared, id), state = state.as_str(), "circuit breaker state changed");
                    shared.table.signals(id).set_breaker(state);
                }
                Change::Load(id, report) => {
                    shared
                        .table
                        .signals(id)
                        .set_load(report, &self.monitor.config().overload);
                }
                Change::Models(_) => models_changed = true,
                Change::Purge(id) => {
                    tracing::info!(worker = %url_of(shared, id), "worker drained and removed");
                    remove_from_roster(shared, id);
                    shared.table.signals(id).reset();
                    shared.table.set_health(id, Health::Healthy);
                    models_changed = true;
                    purged.push(id);
                }
            }
        }
        if models_changed {
            shared
                .workers
                .catalog
                .store(Arc::new(ModelCatalog::build(self.monitor.all_models())));
        }
        purged
    }

    fn serve_admin(&mut self, shared: &Shared, request: AdminRequest, now: Instant) {
        let answer = match request.route {
            AdminRoute::ListWorkers => Ok((200, self.list_workers(shared))),
            AdminRoute::RemoveWorker(worker) => self.remove_worker(shared, &worker, now),
            AdminRoute::AddWorker => match self.start_add(shared, &request.body) {
                Ok(pending) => {
                    self.pending_adds.push(PendingAdd {
                        reply: request.reply,
                        ..pending
                    });
                    return;
                }
                Err(e) => Err(e),
            },
        };
        match answer {
            Ok((status, body)) => request.reply.set(status, body),
            Err(e) => request.reply.set(e.status, e.to_json()),
        }
    }

    fn list_workers(&self, shared: &Shared) -> String {
        let roster = shared.table.roster();
        let views: Vec<WorkerView<'_>> = roster
            .workers
            .iter()
            .map(|w| worker_view(shared, &self.monitor, w))
            .collect();
        render_worker_list(&views)
    }

    fn remove_worker(
        &mut self,
        shared: &Shared,
        worker: &WorkerRef,
        now: Instant,
    ) -> Result<(u16, String), AdminError> {
        let roster = shared.table.roster();
        let entry = roster.workers.iter().find(|w| match worker {
            WorkerRef::Id(id) => w.id == *id,
            WorkerRef::Url(url) => w.spec.url.trim_end_matches('/') == url.trim_end_matches('/'),
        });
        let Some(entry) = entry else {
            return Err(AdminError::new(404, "not_found", "no such worker"));
        };
        shared.table.signals(entry.id).set_draining(true);
        self.monitor.start_drain(entry.id, now);
        tracing::info!(worker = %entry.spec.url, id = entry.id.0, "admin: worker removal requested; draining");
        let body = serde_json::json!({
            "status": "draining", "id": entry.id.0, "url": entry.spec.url,
            "in_flight": shared.table.inflight(entry.id),
        });
        Ok((202, body.to_string()))
    }

    fn start_add(&self, shared: &Shared, body: &[u8]) -> Result<PendingAdd, AdminError> {
        let url = parse_add_worker(body)?;
        let roster = shared.table.roster();
        if roster
            .workers
            .iter()
            .any(|w| w.spec.url.trim_end_matches('/') == url)
        {
            return Err(AdminError::new(
                409,
                "conflict",
                format!("worker {url} is already registered"),
            ));
        }
        let addr = HttpUrl::parse(&url)
            .map_err(|e| AdminError::new(400, "invalid_request_error", e.to_string()))?;
        let health = self.monitor.config().health.clone();
        let (tx, rx) = mpsc::channel();
        let spawned = std::thread::Builder::new()
            .name("kvgate-admin-probe".into())
            .spawn(move || {
                let healthy = probe::get(&addr, &health.endpoint, health.timeout, 64 << 10);
                let result = match healthy {
                    Ok(r) if ProbeOutcome::from_status(r.status) == ProbeOutcome::Success => {
                        let models = probe::get(&addr, "/v1/models", health.timeout, 256 << 10)
                            .ok()
                            .filter(|r| r.status == 200)
                            .and_then(|r| parse_models(&r.body).ok());
                        Ok(models)
                    }
                    Ok(r) => Err(format!(
                        "health check {} answered {}",
                        health.endpoint, r.status
                    )),
                    Err(e) => Err(format!("health check {} failed: {e}", health.endpoint)),
                };
                let _ = tx.send(result);
            });
        spawned
            .map_err(|e| AdminError::new(500, "internal_error", format!("cannot probe: {e}")))?;
        Ok(PendingAdd {
            url,
            reply: Arc::new(AdminReply::default()),
            probed: rx,
        })
    }

    fn finish_adds(&mut self, shared: &Shared) {
        let mut still_pending = Vec::new();
        for pending in self.pending_adds.drain(..) {
            match pending.probed.try_recv() {
                Err(mpsc::TryRecvError::Empty) => still_pending.push(pending),
                Err(mpsc::TryRecvError::Disconnected) => {
                    let e = AdminError::new(
                        500,
                        "internal_error",
                        "health probe thread ended without an answer",
                    );
                    pending.reply.set(e.status, e.to_json());
                }
                Ok(Err(reason)) => {
                    let e = AdminError::new(
                        503,
                        "worker_unhealthy",
                        format!("worker {} not added: {reason}", pending.url),
                    );
                    pending.reply.set(e.status, e.to_json());
                }
                Ok(Ok(models)) => {
                    let answer = register_worker(shared, &mut self.monitor, &pending.url, models);
                    match answer {
                        Ok(id) => {
                            shared
                                .workers
                                .catalog
                                .store(Arc::new(ModelCatalog::build(self.monitor.all_models())));
                            let body = serde_json::json!({"status": "added", "id": id.0, "url": pending.url});
                            tracing::info!(worker = %pending.url, id = id.0, "admin: worker added");
                            pending.reply.set(201, body.to_string());
                        }
                        Err(e) => pending.reply.set(e.status, e.to_json()),
                    }
                }
            }
        }
        self.pending_adds = still_pending;
    }
}

/// Put a probed worker in a free slot and publish it.
fn register_worker(
    shared: &Shared,
    monitor: &mut WorkerMonitor,
    url: &str,
    models: Option<Vec<String>>,
) -> Result<WorkerId, AdminError> {
    let spec = parse_worker_url(url)
        .map_err(|e| AdminError::new(400, "invalid_request_error", e.to_string()))?;
    let addr = HttpUrl::parse(url)
        .map_err(|e| AdminError::new(400, "invalid_request_error", e.to_string()))?;
    let roster = shared.table.roster();
    let taken = |id: u16| {
        roster.workers.iter().any(|w| w.id.0 == id) || monitor.status(WorkerId(id)).is_some()
    };
    let free = (0..WORKERS_MAX as u16).find(|id| !taken(*id));
    let Some(free) = free else {
        return Err(AdminError::new(
            507,
            "capacity",
            format!("at most {WORKERS_MAX} workers"),
        ));
    };
    let id = WorkerId(free);
    shared.table.signals(id).reset();
    shared.table.set_health(id, Health::Healthy);
    monitor.add(id, addr);
    if let Some(models) = models {
        monitor.set_models(id, models);
    }
    let mut workers: Vec<WorkerEntry> = roster
        .workers
        .iter()
        .map(|w| WorkerEntry::new(w.id, w.spec.clone()))
        .collect();
    workers.push(WorkerEntry::new(id, spec));
    shared.table.publish(Roster { workers });
    Ok(id)
}

fn remove_from_roster(shared: &Shared, id: WorkerId) {
    let roster = shared.table.roster();
    let workers = roster
        .workers
        .iter()
        .filter(|w| w.id != id)
        .map(|w| WorkerEntry::new(w.id, w.spec.clone()))
        .collect();
    shared.table.publish(Roster { workers });
}

fn url_of(shared: &Shared, id: WorkerId) -> String {
    shared
        .table
        .roster()
        .get(id)
        .map_or_else(|| format!("#{}", id.0), |w| w.spec.url.clone())
}

fn worker_view<'a>(
    shared: &'a Shared,
    monitor: &'a WorkerMonitor,
    w: &'a WorkerEntry,
) -> WorkerView<'a> {
    let (healthy, breaker) = monitor
        .status(w.id)
        .unwrap_or((shared.table.is_healthy(w.id), BreakerState::Closed));
    WorkerView {
        id: w.id,
        url: &w.spec.url,
        healthy,
        breaker,
        draining: shared.table.signals(w.id).is_draining(),
        in_flight: u64::from(shared.table.inflight(w.id)),
        models: monitor.models(w.id),
        load: monitor.load(w.id),
    }
}

/// Append the per-worker gauges (`smg_engine_*`, `smg_worker_cb_state`, `smg_worker_health`)
/// for the gateway's `/metrics`, from the published table (callable from any thread).
pub fn render_worker_gauges(shared: &Shared, out: &mut String) {
    let roster = shared.table.roster();
    let loads: Vec<_> = roster
        .workers
        .iter()
        .map(|w| shared.table.signals(w.id).load())
        .collect();
    let views: Vec<WorkerView<'_>> = roster
        .workers
        .iter()
        .zip(&loads)
        .map(|(w, load)| WorkerView {
            id: w.id,
            url: &w.spec.url,
            healthy: shared.table.is_healthy(w.id),
            breaker: shared.table.signals(w.id).breaker_state(),
            draining: shared.table.signals(w.id).is_draining(),
            in_flight: u64::from(shared.table.inflight(w.id)),
            models: None,
            load: load.as_deref(),
        })
        .collect();
    super::render_worker_metrics(out, &views);
}
