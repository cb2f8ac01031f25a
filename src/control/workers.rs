//! Worker lifecycle on the control core: one [`WorkerDriver::turn`] per control-core turn drains
//! the data cores' attempt outcomes into the circuit breakers, runs due probe rounds, publishes
//! health, circuit, load and overload in the worker table, republishes the model catalog when a
//! worker's models change, serves admin calls, and drains then purges removed workers.
//!
//! Owns [`WorkerDriver`]. It never blocks: probes and the admission probe of `POST /workers` run
//! as tasks on the control core's runtime, and a later turn picks up their results. A purge
//! returns the worker's id from `turn` so the control core removes it from every index before
//! the slot can be reused.

use std::sync::mpsc;
use std::sync::Arc;
use std::time::Instant;

use super::monitor::{Change, ProbeKind, WorkerMonitor};
use super::probes::{probe_new_worker, ProbeRound};
use super::tokenizer_fetch::TokenizerFetches;
use crate::config::{is_own_listener, pd_speaks_http};
use crate::ids::WorkerId;
use crate::limits::{ADMIN_REPLY_MARGIN, ADMIN_REPLY_TIMEOUT, WORKERS_MAX};
use crate::pd::WorkerStartup;
use crate::shared::{AdminReply, AdminRequest, Shared};
use crate::workers::admin::{
    parse_add_worker, render_worker_list, AdminError, AdminRoute, WorkerRef, WorkerReport,
};
use crate::workers::breaker::{AttemptOutcome, BreakerState};
use crate::workers::catalog::{ListedModel, ModelCatalog};
use crate::workers::health::{HealthConfig, ProbeOutcome};
use crate::workers::role::WorkerRole;
use crate::workers::spec::{KvEventsSource, WorkerProtocol, WorkerSpec};
use crate::workers::table::{Health, Roster, WorkerEntry};

/// The admission probe's verdict: the worker's models (`None`: unknown), or why it is refused.
type Admission = Result<Option<Vec<ListedModel>>, String>;

/// A `POST /workers` waiting for its admission probe.
struct PendingAdd {
    spec: WorkerSpec,
    reply: Arc<AdminReply>,
    probed: mpsc::Receiver<Admission>,
    /// SMG worker-spec fields of the request that kvgate does not apply (in the answer).
    not_applied: Vec<String>,
}

/// The control core's worker management.
pub struct WorkerDriver {
    monitor: WorkerMonitor,
    probes: ProbeRound,
    pending_adds: Vec<PendingAdd>,
    /// gRPC workers' tokenizers being fetched (`GetTokenizer`) for models without one.
    tokenizer_fetches: TokenizerFetches,
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
        let settings = shared.config.worker_settings.clone();
        let mut monitor = WorkerMonitor::new(settings, Instant::now())
            .with_api_key(shared.config.api_key.as_deref());
        for w in &shared.table.roster().workers {
            monitor.add(w.id, &w.spec);
        }
        WorkerDriver {
            monitor,
            probes: ProbeRound::default(),
            pending_adds: Vec::new(),
            tokenizer_fetches: TokenizerFetches::default(),
        }
    }

    /// One turn (on the control core's runtime); returns the workers purged in it (remove them
    /// from every index).
    pub fn turn(&mut self, shared: &Shared) -> Vec<WorkerId> {
        let now = Instant::now();
        let mut changes = Vec::new();
        for queue in shared.attempt_queues.iter() {
            while let Some(record) = queue.pop() {
                let success = record.outcome == AttemptOutcome::Success;
                shared
                    .metrics
                    .breaker_outcomes()
                    .record(record.worker, success);
                changes.extend(
                    self.monitor
                        .record_attempt(record.worker, record.outcome, now),
                );
            }
        }
        if let Some(results) = self.probes.try_results() {
            for result in results.iter().filter(|r| r.kind == ProbeKind::Health) {
                let passed = matches!(&result.response,
                    Ok(r) if ProbeOutcome::from_status(r.status) == ProbeOutcome::Success);
                shared.metrics.count_health_check(passed);
            }
            changes.extend(self.monitor.apply(results));
        }
        if !self.probes.is_busy() && now >= self.monitor.next_due() {
            self.probes.submit(self.monitor.due_probes(now));
        }
        changes.extend(
            self.monitor
                .tick(now, |id| u64::from(shared.table.inflight(id))),
        );
        while let Some(request) = shared.admin_queue.pop() {
            self.carry_out_admin_call(shared, request, now);
        }
        self.finish_adds(shared);
        self.publish(shared, changes)
    }

    /// Publishes changes in the worker table; returns the purged workers.
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
                    let from = shared.table.signals(id).breaker_state();
                    shared.metrics.breaker_transitions().record(id, from, state);
                    if from != state {
                        shared.metrics.breaker_outcomes().restart_streaks(id);
                    }
                    shared.table.signals(id).set_breaker(state);
                }
                Change::Load(id, report) => {
                    let overload = &self.monitor.config().overload;
                    let signals = shared.table.signals(id);
                    let was_overloaded = signals.is_overloaded();
                    signals.set_load(report, overload);
                    let overloaded = signals.is_overloaded();
                    if overloaded != was_overloaded {
                        tracing::info!(worker = %url_of(shared, id), overloaded, "worker overload state changed");
                    }
                }
                Change::Models(_) => models_changed = true,
                Change::FirstCheckFailed(id, why) => {
                    tracing::warn!(worker = %url_of(shared, id), reason = %why, "worker failed its first health check: unreachable or not ready; requests sent to it fail over until it passes");
                }
                Change::Purge(id) => {
                    tracing::info!(worker = %url_of(shared, id), "worker drained and removed");
                    remove_from_roster(shared, id);
                    self.probes.forget_worker(id);
                    shared.table.signals(id).reset();
                    shared.table.set_health(id, Health::Healthy);
                    models_changed = true;
                    purged.push(id);
                }
            }
        }
        if models_changed {
            self.publish_catalog(shared);
        }
        purged
    }

    fn publish_catalog(&self, shared: &Shared) {
        let catalog = ModelCatalog::build(self.monitor.all_models());
        self.tokenizer_fetches.start_wanted(shared, &catalog);
        shared.catalog.store(Arc::new(catalog));
    }

    /// Carries out one admin call the data cores queued (list, remove, or start an add whose
    /// admission probe a later turn finishes) and sets its reply.
    fn carry_out_admin_call(&mut self, shared: &Shared, request: AdminRequest, now: Instant) {
        let answer = match request.route {
            AdminRoute::ListWorkers => Ok((200, self.list_workers(shared))),
            AdminRoute::RemoveWorker(worker) => self.remove_worker(shared, &worker, now),
            AdminRoute::AddWorker => match self.start_add(shared, &request.body, request.reply) {
                Ok(pending) => {
                    self.pending_adds.push(pending);
                    return;
                }
                Err((e, reply)) => {
                    reply.set(e.status, e.to_json());
                    return;
                }
            },
        };
        match answer {
            Ok((status, body)) => request.reply.set(status, body),
            Err(e) => request.reply.set(e.status, e.to_json()),
        }
    }

    fn list_workers(&self, shared: &Shared) -> String {
        let roster = shared.table.roster();
        let reports: Vec<WorkerReport<'_>> = roster
            .workers
            .iter()
            .map(|w| self.report(shared, w))
            .collect();
        render_worker_list(&reports)
    }

    /// One worker as `GET /workers` shows it: the monitor's view where it has one.
    fn report<'a>(&'a self, shared: &Shared, w: &'a WorkerEntry) -> WorkerReport<'a> {
        let (healthy, breaker) = self
            .monitor
            .status(w.id)
            .unwrap_or((shared.table.is_healthy(w.id), BreakerState::Closed));
        WorkerReport {
            id: w.id,
            url: &w.spec.url,
            role: w.spec.role,
            healthy,
            breaker,
            draining: shared.table.signals(w.id).is_draining(),
            in_flight: u64::from(shared.table.inflight(w.id)),
            models: self.monitor.models(w.id),
            load: self.monitor.load(w.id),
        }
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
            WorkerRef::Url(url) => w.spec.normalized_url() == url.trim_end_matches('/'),
        });
        let Some(entry) = entry else {
            return Err(AdminError::new(404, "not_found", "no such worker"));
        };
        shared.table.signals(entry.id).start_draining();
        self.monitor.start_drain(entry.id, now);
        tracing::info!(worker = %entry.spec.url, id = entry.id.0, "admin: worker removal requested; draining");
        let body = serde_json::json!({
            "status": "draining", "id": entry.id.0, "url": entry.spec.url,
            "in_flight": shared.table.inflight(entry.id),
        });
        Ok((202, body.to_string()))
    }

    /// Validates a `POST /workers` and starts its admission probe; on refusal, the error comes
    /// back with the reply it is for.
    fn start_add(
        &self,
        shared: &Shared,
        body: &[u8],
        reply: Arc<AdminReply>,
    ) -> Result<PendingAdd, (AdminError, Arc<AdminReply>)> {
        let refuse = |e| (e, reply.clone());
        let added = parse_add_worker(body).map_err(refuse)?;
        let url = added.url;
        // A host name is resolved here, on the control core: admin calls are rare.
        let mut spec = WorkerSpec::resolve(&url)
            .map_err(|e| refuse(AdminError::new(400, "invalid_request_error", e.to_string())))?;
        if is_own_listener(spec.addr, shared.config.listen_addr) {
            let e = AdminError::new(
                400,
                "invalid_request_error",
                format!("worker {url} is this gateway's own listener: requests would loop"),
            );
            return Err(refuse(e));
        }
        // Registered workers and those still in their admission probe alike: checking both here,
        // in the call that then reserves the endpoint (`pending_adds`), makes concurrent adds of
        // one worker register it once.
        let roster = shared.table.roster();
        let registered = roster.workers.iter().map(|w| &w.spec);
        let probing = self.pending_adds.iter().map(|p| &p.spec);
        if let Some(existing) = registered
            .chain(probing)
            .find(|w| w.same_endpoint(&spec) || w.normalized_url() == url)
        {
            // A worker being removed is still registered until its requests end: say so, or
            // the caller cannot tell why its add is refused.
            let draining = roster.workers.iter().any(|w| {
                std::ptr::eq(&w.spec, existing) && shared.table.signals(w.id).is_draining()
            });
            let state = match draining {
                true => "is draining (being removed); add it again once it is gone",
                false => "is already registered or being added",
            };
            let e = AdminError::new(
                409,
                "conflict",
                format!("worker {url} {state} (as {})", existing.url),
            );
            return Err(refuse(e));
        }
        if let Err(why) = shared
            .config
            .admits_role(added.role)
            .and_then(|()| pd_speaks_http(added.role, spec.protocol))
        {
            return Err(refuse(AdminError::new(400, "invalid_request_error", why)));
        }
        spec.kv_events = match (added.role, added.kv_events) {
            // The KV-event index follows the prefill engines (see `Config::from_cli`).
            (WorkerRole::Decode, KvEventsSource::Discover) => KvEventsSource::Off,
            (_, given) => given,
        };
        spec.role = added.role;
        // `--backend` names every gRPC worker's protocol, as for those of `--worker-urls`.
        if let WorkerProtocol::Grpc(backend) = &mut spec.protocol {
            *backend = shared.config.grpc_backend;
        }
        let health = self.monitor.config().health.clone();
        let startup = shared.config.worker_startup;
        let bearer = self.monitor.api_key().cloned();
        let (tx, probed) = mpsc::channel();
        let probed_spec = spec.clone();
        monoio::spawn(async move {
            let _ = tx.send(probe_starting_worker(probed_spec, health, startup, bearer).await);
        });
        Ok(PendingAdd {
            spec,
            reply,
            probed,
            not_applied: added.not_applied,
        })
    }

    fn finish_adds(&mut self, shared: &Shared) {
        let mut still_pending = Vec::new();
        for pending in std::mem::take(&mut self.pending_adds) {
            let answer = match pending.probed.try_recv() {
                Err(mpsc::TryRecvError::Empty) => {
                    still_pending.push(pending);
                    continue;
                }
                Err(mpsc::TryRecvError::Disconnected) => Err(AdminError::new(
                    500,
                    "internal_error",
                    "the admission probe ended without an answer",
                )),
                Ok(Err(reason)) => Err(AdminError::new(
                    503,
                    "worker_unhealthy",
                    format!("worker {} not added: {reason}", pending.spec.url),
                )),
                Ok(Ok(models)) => self.register_worker(shared, &pending.spec, models),
            };
            match answer {
                Ok(id) => {
                    tracing::info!(worker = %pending.spec.url, id = id.0, "admin: worker added");
                    let mut body =
                        serde_json::json!({"status": "added", "id": id.0, "url": pending.spec.url});
                    if !pending.not_applied.is_empty() {
                        body["not_applied"] = serde_json::json!(pending.not_applied);
                    }
                    pending.reply.set(201, body.to_string());
                }
                Err(e) => pending.reply.set(e.status, e.to_json()),
            }
        }
        self.pending_adds = still_pending;
    }

    /// Puts an admitted worker in a free slot and publishes it with the model catalog.
    fn register_worker(
        &mut self,
        shared: &Shared,
        spec: &WorkerSpec,
        models: Option<Vec<ListedModel>>,
    ) -> Result<WorkerId, AdminError> {
        let roster = shared.table.roster();
        let monitor = &self.monitor;
        let taken = |id: u16| {
            roster.workers.iter().any(|w| w.id.0 == id) || monitor.status(WorkerId(id)).is_some()
        };
        let Some(free) = (0..WORKERS_MAX as u16).find(|id| !taken(*id)) else {
            return Err(AdminError::new(
                507,
                "capacity",
                format!("at most {WORKERS_MAX} workers"),
            ));
        };
        let id = WorkerId(free);
        shared.table.signals(id).reset();
        shared.table.set_health(id, Health::Healthy);
        self.monitor.add(id, spec);
        if let Some(models) = models {
            self.monitor.set_models(id, models);
        }
        let mut workers: Vec<WorkerEntry> = roster
            .workers
            .iter()
            .map(|w| WorkerEntry::new(w.id, w.spec.clone()))
            .collect();
        workers.push(WorkerEntry::new(id, spec.clone()));
        shared.table.publish(Roster { workers });
        self.publish_catalog(shared);
        Ok(id)
    }
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

/// The admission probe under `--worker-startup-*` (SMG's registration): the first probe after
/// `delay`, then one every `check_interval` while the worker is not ready, for at most
/// `timeout`, and never past the admin call's own wait (`ADMIN_REPLY_TIMEOUT`): with SMG's
/// defaults (no delay, 30 s between probes) that is one probe, answered at once.
async fn probe_starting_worker(
    spec: WorkerSpec,
    health: HealthConfig,
    startup: WorkerStartup,
    bearer: Option<Arc<str>>,
) -> Result<Option<Vec<ListedModel>>, String> {
    let started = Instant::now();
    let window = startup
        .timeout
        .min(ADMIN_REPLY_TIMEOUT.saturating_sub(health.timeout + ADMIN_REPLY_MARGIN));
    if !startup.delay.is_zero() {
        monoio::time::sleep(startup.delay.min(window)).await;
    }
    loop {
        let probed = probe_new_worker(spec.clone(), health.clone(), bearer.clone()).await;
        let next = started.elapsed() + startup.check_interval;
        if probed.is_ok() || next >= window {
            return probed;
        }
        monoio::time::sleep(startup.check_interval).await;
    }
}
