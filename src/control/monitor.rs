//! The control core's private per-worker state: health-check verdicts, circuit breakers, load
//! reports, discovered models, the drain of removed workers, and the probe schedule.
//!
//! Owns [`WorkerMonitor`] (never shared: data cores see only what the control core publishes
//! from the [`Change`]s it returns), [`ProbeJob`] and [`ProbeResult`] (what a probe round asks and
//! finds; `control::probes` runs them). Pure and clock-injected: every schedule is testable
//! without sleeping or sockets.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::error::ProxyError;
use crate::ids::WorkerId;
use crate::limits::{DRAIN_TIMEOUT, MODELS_REFRESH_INTERVAL};
use crate::net::client::ClientResponse;
use crate::workers::admin::{DrainClock, DrainStep};
use crate::workers::breaker::{AttemptOutcome, BreakerState, CircuitBreaker};
use crate::workers::catalog::{parse_models, ListedModel};
use crate::workers::health::{HealthTracker, HealthTransition, ProbeOutcome};
use crate::workers::load::{parse_load_body, LoadEndpoint, LoadReport};
use crate::workers::settings::{LoadPolling, WorkerSettings};
use crate::workers::spec::{Scheme, WorkerProtocol, WorkerSpec};

/// What a probe asks a worker.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ProbeKind {
    /// `GET` the health endpoint.
    Health,
    /// Read load from this endpoint (falling back to `/metrics` within the same job when
    /// `/v1/loads` is absent).
    Load(LoadEndpoint),
    /// `GET /v1/models`.
    Models,
}

/// One probe to run.
#[derive(Clone, Debug)]
pub struct ProbeJob {
    /// The worker.
    pub id: WorkerId,
    /// Where it listens.
    pub addr: SocketAddr,
    /// Plain HTTP or TLS.
    pub scheme: Scheme,
    /// Its `Host` header value.
    pub authority: String,
    /// What to ask.
    pub kind: ProbeKind,
    /// The path (health endpoint, load endpoint or `/v1/models`).
    pub path: String,
    /// Deadline of the whole probe.
    pub timeout: Duration,
    /// How it is asked: HTTP, or the engine's gRPC calls (`control::grpc_probe`).
    pub protocol: WorkerProtocol,
    /// The workers' API key, sent as a bearer token (`--api-key`, as SMG sends it).
    pub bearer: Option<Arc<str>>,
}

/// One probe's result.
#[derive(Debug)]
pub struct ProbeResult {
    /// The worker.
    pub id: WorkerId,
    /// What was asked; for loads, the endpoint that finally answered.
    pub kind: ProbeKind,
    /// The answer.
    pub response: Result<ClientResponse, ProxyError>,
}

/// A state change for the control core to publish in the worker table (and log).
#[derive(Clone, Debug, PartialEq)]
pub enum Change {
    /// New health verdict.
    Health(WorkerId, bool),
    /// New circuit state.
    Breaker(WorkerId, BreakerState),
    /// New load report (`None`: the worker lost its signal).
    Load(WorkerId, Option<LoadReport>),
    /// The worker's model list changed; republish the model catalog.
    Models(WorkerId),
    /// A removed worker finished draining: purge it from every index and free its slot.
    Purge(WorkerId),
    /// A worker's health check failed before it ever passed one (why): said at once, since
    /// the verdict waits for `--health-failure-threshold` checks and a URL mistyped at start
    /// would otherwise go unmentioned for minutes while requests to it fail over.
    FirstCheckFailed(WorkerId, String),
}

/// The control core's private state for one worker.
#[derive(Debug)]
struct Watched {
    addr: SocketAddr,
    scheme: Scheme,
    authority: String,
    protocol: WorkerProtocol,
    health: HealthTracker,
    breaker: CircuitBreaker,
    load_endpoint: LoadEndpoint,
    load: Option<LoadReport>,
    models: Option<Vec<ListedModel>>,
    drain: Option<DrainClock>,
    /// Whether its first health check's verdict is in (a failure of that one is said at once,
    /// `Change::FirstCheckFailed`).
    first_check_settled: bool,
}

/// Per-worker health, breaker, load and drain state, and the probe schedule.
#[derive(Debug)]
pub struct WorkerMonitor {
    config: WorkerSettings,
    /// The key probes send (`--api-key`).
    api_key: Option<Arc<str>>,
    workers: BTreeMap<WorkerId, Watched>,
    health_due: Instant,
    load_due: Instant,
    models_due: Instant,
}

impl WorkerMonitor {
    /// A monitor whose first probe rounds are due at `now`.
    pub fn new(config: WorkerSettings, now: Instant) -> Self {
        WorkerMonitor {
            config,
            api_key: None,
            workers: BTreeMap::new(),
            health_due: now,
            load_due: now,
            models_due: now,
        }
    }

    /// This monitor with its probes sending `key` as a bearer token: SMG forwards `--api-key`
    /// to the workers, whose own key (vLLM's, SGLang's `--api-key`) guards `/v1/models` and
    /// the load endpoints.
    pub fn with_api_key(mut self, key: Option<&str>) -> Self {
        self.api_key = key.map(Arc::from);
        self
    }

    /// The settings.
    pub fn config(&self) -> &WorkerSettings {
        &self.config
    }

    /// The key probes send, if any.
    pub fn api_key(&self) -> Option<&Arc<str>> {
        self.api_key.as_ref()
    }

    /// Start watching a worker (admitted healthy, circuit closed, no load signal yet).
    pub fn add(&mut self, id: WorkerId, spec: &WorkerSpec) {
        let watched = Watched {
            addr: spec.addr,
            scheme: spec.scheme,
            authority: spec.authority.clone(),
            protocol: spec.protocol,
            health: HealthTracker::new_healthy(),
            breaker: CircuitBreaker::new(),
            load_endpoint: LoadEndpoint::default(),
            load: None,
            models: None,
            drain: None,
            first_check_settled: false,
        };
        self.workers.insert(id, watched);
    }

    /// Start draining a removed worker: it should be unroutable from now on, and is purged by
    /// [`WorkerMonitor::tick`] once its in-flight count reaches zero or the drain times out.
    /// Returns false for an unknown worker.
    pub fn start_drain(&mut self, id: WorkerId, now: Instant) -> bool {
        match self.workers.get_mut(&id) {
            Some(w) => {
                w.drain.get_or_insert(DrainClock::new(now, DRAIN_TIMEOUT));
                true
            }
            None => false,
        }
    }

    /// Whether `id` is draining.
    pub fn is_draining(&self, id: WorkerId) -> bool {
        self.workers.get(&id).is_some_and(|w| w.drain.is_some())
    }

    /// The last load report of `id`.
    pub fn load(&self, id: WorkerId) -> Option<&LoadReport> {
        self.workers.get(&id)?.load.as_ref()
    }

    /// The discovered models of `id` (`None`: unknown).
    pub fn models(&self, id: WorkerId) -> Option<&[ListedModel]> {
        self.workers.get(&id)?.models.as_deref()
    }

    /// Set the models of `id` (from the admission probe).
    pub fn set_models(&mut self, id: WorkerId, models: Vec<ListedModel>) {
        if let Some(w) = self.workers.get_mut(&id) {
            w.models = Some(models);
        }
    }

    /// Every watched worker's discovered models, for the model catalog.
    pub fn all_models(&self) -> impl Iterator<Item = (WorkerId, Option<&[ListedModel]>)> + '_ {
        self.workers
            .iter()
            .filter(|(_, w)| w.drain.is_none())
            .map(|(id, w)| (*id, w.models.as_deref()))
    }

    /// Health verdict and circuit state of `id`.
    pub fn status(&self, id: WorkerId) -> Option<(bool, BreakerState)> {
        let w = self.workers.get(&id)?;
        Some((w.health.is_healthy(), w.breaker.state()))
    }

    /// The probes due at `now` (and reschedules the next rounds).
    pub fn due_probes(&mut self, now: Instant) -> Vec<ProbeJob> {
        let mut jobs = Vec::new();
        let health_due = now >= self.health_due;
        let load_due = now >= self.load_due;
        let models_due = now >= self.models_due;
        if health_due {
            self.health_due = now + self.config.health.interval;
        }
        if load_due {
            self.load_due = now + self.config.load_interval;
        }
        if models_due {
            self.models_due = now + MODELS_REFRESH_INTERVAL;
        }
        for (id, w) in self.workers.iter().filter(|(_, w)| w.drain.is_none()) {
            let job = |kind: ProbeKind, path: &str, timeout: Duration| ProbeJob {
                id: *id,
                addr: w.addr,
                scheme: w.scheme,
                authority: w.authority.clone(),
                kind,
                path: path.to_string(),
                timeout,
                protocol: w.protocol,
                bearer: self.api_key.clone(),
            };
            if health_due && !self.config.health.disabled {
                jobs.push(job(
                    ProbeKind::Health,
                    &self.config.health.endpoint,
                    self.config.health.timeout,
                ));
            }
            if models_due {
                jobs.push(job(
                    ProbeKind::Models,
                    "/v1/models",
                    self.config.health.timeout,
                ));
            }
            if load_due && self.config.load_polling == LoadPolling::On {
                let endpoint = w.load_endpoint;
                jobs.push(job(
                    ProbeKind::Load(endpoint),
                    endpoint.path(),
                    self.config.load_timeout,
                ));
            }
        }
        jobs
    }

    /// The earliest time a probe round is due.
    pub fn next_due(&self) -> Instant {
        self.health_due.min(self.load_due).min(self.models_due)
    }

    /// Apply probe results; returns what to publish.
    pub fn apply(&mut self, results: Vec<ProbeResult>) -> Vec<Change> {
        let mut changes = Vec::new();
        for result in results {
            let Some(w) = self.workers.get_mut(&result.id) else {
                continue;
            };
            match result.kind {
                ProbeKind::Health => {
                    let outcome = match &result.response {
                        Ok(r) => ProbeOutcome::from_status(r.status),
                        Err(_) => ProbeOutcome::Failure,
                    };
                    if !w.first_check_settled {
                        w.first_check_settled = true;
                        if outcome == ProbeOutcome::Failure {
                            let why = match &result.response {
                                Ok(r) => format!("health check answered {}", r.status),
                                Err(e) => e.to_string(),
                            };
                            changes.push(Change::FirstCheckFailed(result.id, why));
                        }
                    }
                    match w.health.record(outcome, &self.config.health) {
                        Some(HealthTransition::BecameHealthy) => {
                            changes.push(Change::Health(result.id, true))
                        }
                        Some(HealthTransition::BecameUnhealthy) => {
                            changes.push(Change::Health(result.id, false))
                        }
                        None => {}
                    }
                }
                ProbeKind::Load(endpoint) => {
                    w.load_endpoint = endpoint;
                    let report = result
                        .response
                        .ok()
                        .filter(|r| r.status == 200)
                        .and_then(|r| parse_load_body(endpoint, &r.body).ok());
                    if report != w.load {
                        w.load.clone_from(&report);
                        changes.push(Change::Load(result.id, report));
                    }
                }
                ProbeKind::Models => {
                    // A failed discovery keeps what was known: no signal is never a penalty.
                    let models = result
                        .response
                        .ok()
                        .filter(|r| r.status == 200)
                        .and_then(|r| parse_models(&r.body).ok());
                    if models.is_some() && models != w.models {
                        w.models = models;
                        changes.push(Change::Models(result.id));
                    }
                }
            }
        }
        changes
    }

    /// Record a request attempt's outcome reported by a data core.
    pub fn record_attempt(
        &mut self,
        id: WorkerId,
        outcome: AttemptOutcome,
        now: Instant,
    ) -> Option<Change> {
        let w = self.workers.get_mut(&id)?;
        let t = w.breaker.record(outcome, now, &self.config.breaker)?;
        Some(Change::Breaker(id, t.to))
    }

    /// Advance time: open circuits whose timeout passed turn half-open, drained workers are
    /// purged (and forgotten). `in_flight` reads a worker's in-flight count from the table.
    pub fn tick(&mut self, now: Instant, in_flight: impl Fn(WorkerId) -> u64) -> Vec<Change> {
        let mut changes = Vec::new();
        let mut purged = Vec::new();
        for (id, w) in self.workers.iter_mut() {
            if let Some(t) = w.breaker.tick(now, &self.config.breaker) {
                changes.push(Change::Breaker(*id, t.to));
            }
            if let Some(drain) = w.drain {
                if drain.step(in_flight(*id), now) == DrainStep::Purge {
                    purged.push(*id);
                }
            }
        }
        for id in purged {
            self.workers.remove(&id);
            changes.push(Change::Purge(id));
        }
        changes
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::ErrorKind;
    use crate::workers::settings::WorkerArgs;

    fn config() -> WorkerSettings {
        let mut c = WorkerArgs::default().validate().unwrap();
        c.health.failure_threshold = 2;
        c.health.success_threshold = 1;
        c.breaker.failure_threshold = 2;
        c.breaker.timeout = Duration::from_secs(5);
        c
    }

    fn spec(port: u16) -> WorkerSpec {
        WorkerSpec::resolve(&format!("http://127.0.0.1:{port}")).unwrap()
    }

    fn ok(status: u16, body: &str) -> Result<ClientResponse, ProxyError> {
        Ok(ClientResponse {
            status,
            body: body.as_bytes().to_vec(),
        })
    }

    fn timed_out() -> Result<ClientResponse, ProxyError> {
        Err(ProxyError::upstream(ErrorKind::UpstreamTimeout, "probe"))
    }

    fn result(
        id: u16,
        kind: ProbeKind,
        response: Result<ClientResponse, ProxyError>,
    ) -> ProbeResult {
        ProbeResult {
            id: WorkerId(id),
            kind,
            response,
        }
    }

    #[test]
    fn schedule_emits_health_models_and_load_jobs() {
        let t0 = Instant::now();
        let mut m = WorkerMonitor::new(config(), t0);
        m.add(WorkerId(0), &spec(1));
        let jobs = m.due_probes(t0);
        let kinds: Vec<_> = jobs
            .iter()
            .map(|j| (j.kind.clone(), j.path.clone()))
            .collect();
        assert_eq!(
            kinds,
            vec![
                (ProbeKind::Health, "/health".to_string()),
                (ProbeKind::Models, "/v1/models".to_string()),
                (
                    ProbeKind::Load(LoadEndpoint::V1Loads),
                    "/v1/loads".to_string()
                ),
            ]
        );
        // Nothing due again until the load interval (10 s) passes; then load (+ models, unknown).
        assert!(m.due_probes(t0 + Duration::from_secs(1)).is_empty());
        assert_eq!(m.next_due(), t0 + Duration::from_secs(10));
        let later = m.due_probes(t0 + Duration::from_secs(10));
        assert_eq!(later.len(), 2);
        assert!(later.iter().all(|j| j.kind != ProbeKind::Health));
    }

    #[test]
    fn only_a_failed_first_health_check_is_said_and_only_once() {
        let t0 = Instant::now();
        let mut m = WorkerMonitor::new(config(), t0);
        m.add(WorkerId(0), &spec(1));
        m.add(WorkerId(1), &spec(2));
        let first = m.apply(vec![
            result(0, ProbeKind::Health, ok(503, "")),
            result(1, ProbeKind::Health, ok(200, "")),
        ]);
        assert_eq!(
            first,
            vec![Change::FirstCheckFailed(
                WorkerId(0),
                "health check answered 503".into()
            )]
        );
        // Later failures of either go through the thresholds alone.
        let later = m.apply(vec![
            result(0, ProbeKind::Health, timed_out()),
            result(1, ProbeKind::Health, timed_out()),
        ]);
        assert_eq!(later, vec![Change::Health(WorkerId(0), false)]);
    }

    #[test]
    fn disabled_health_checks_send_no_health_probes() {
        let mut c = config();
        c.health.disabled = true;
        let t0 = Instant::now();
        let mut m = WorkerMonitor::new(c, t0);
        m.add(WorkerId(0), &spec(1));
        assert!(m.due_probes(t0).iter().all(|j| j.kind != ProbeKind::Health));
    }

    #[test]
    fn health_results_flip_after_thresholds() {
        let t0 = Instant::now();
        let mut m = WorkerMonitor::new(config(), t0);
        m.add(WorkerId(0), &spec(1));
        let fail = || vec![result(0, ProbeKind::Health, timed_out())];
        // The first check failing is said at once; the verdict waits for the threshold.
        assert!(matches!(
            m.apply(fail()).as_slice(),
            [Change::FirstCheckFailed(WorkerId(0), why)] if why.contains("probe")
        ));
        assert_eq!(m.apply(fail()), vec![Change::Health(WorkerId(0), false)]);
        assert_eq!(
            m.apply(vec![result(0, ProbeKind::Health, ok(200, ""))]),
            vec![Change::Health(WorkerId(0), true)]
        );
        assert_eq!(m.status(WorkerId(0)), Some((true, BreakerState::Closed)));
    }

    #[test]
    fn load_results_publish_only_changes_and_remember_the_endpoint() {
        let t0 = Instant::now();
        let mut m = WorkerMonitor::new(config(), t0);
        m.add(WorkerId(0), &spec(1));
        let metrics = ProbeKind::Load(LoadEndpoint::Metrics);
        let changes = m.apply(vec![result(
            0,
            metrics.clone(),
            ok(200, "sglang:num_queue_reqs 9\n"),
        )]);
        assert!(
            matches!(&changes[..], [Change::Load(WorkerId(0), Some(r))] if r.waiting_requests == 9)
        );
        assert!(m
            .apply(vec![result(
                0,
                metrics.clone(),
                ok(200, "sglang:num_queue_reqs 9\n")
            )])
            .is_empty());
        let jobs = m.due_probes(t0);
        assert!(jobs
            .iter()
            .any(|j| j.kind == metrics && j.path == "/metrics"));
        // A failed poll drops the signal (published as None), it does not invent zero load.
        assert_eq!(
            m.apply(vec![result(0, metrics, timed_out())]),
            vec![Change::Load(WorkerId(0), None)]
        );
        assert_eq!(m.load(WorkerId(0)), None);
    }

    #[test]
    fn models_are_kept_when_discovery_fails() {
        let t0 = Instant::now();
        let mut m = WorkerMonitor::new(config(), t0);
        m.add(WorkerId(0), &spec(1));
        let body = r#"{"data":[{"id":"m1"}]}"#;
        assert_eq!(
            m.apply(vec![result(0, ProbeKind::Models, ok(200, body))]),
            vec![Change::Models(WorkerId(0))]
        );
        assert!(m
            .apply(vec![result(0, ProbeKind::Models, ok(500, ""))])
            .is_empty());
        let ids: Vec<&str> = m
            .models(WorkerId(0))
            .unwrap()
            .iter()
            .map(|m| m.id.as_str())
            .collect();
        assert_eq!(ids, ["m1"]);
    }

    #[test]
    fn breaker_opens_and_reaches_half_open_on_tick() {
        let t0 = Instant::now();
        let mut m = WorkerMonitor::new(config(), t0);
        m.add(WorkerId(3), &spec(1));
        assert_eq!(
            m.record_attempt(WorkerId(3), AttemptOutcome::Failure, t0),
            None
        );
        assert_eq!(
            m.record_attempt(WorkerId(3), AttemptOutcome::Failure, t0),
            Some(Change::Breaker(WorkerId(3), BreakerState::Open))
        );
        assert!(m.tick(t0 + Duration::from_secs(4), |_| 0).is_empty());
        assert_eq!(
            m.tick(t0 + Duration::from_secs(5), |_| 0),
            vec![Change::Breaker(WorkerId(3), BreakerState::HalfOpen)]
        );
        assert_eq!(
            m.record_attempt(WorkerId(9), AttemptOutcome::Failure, t0),
            None
        );
    }

    #[test]
    fn drain_purges_when_in_flight_reaches_zero_and_stops_probes() {
        let t0 = Instant::now();
        let mut m = WorkerMonitor::new(config(), t0);
        m.add(WorkerId(1), &spec(1));
        m.add(WorkerId(2), &spec(2));
        assert!(m.start_drain(WorkerId(1), t0));
        assert!(!m.start_drain(WorkerId(7), t0));
        assert!(m.is_draining(WorkerId(1)));
        assert!(m.due_probes(t0).iter().all(|j| j.id == WorkerId(2)));
        assert_eq!(m.all_models().count(), 1);
        assert!(m.tick(t0, |_| 2).is_empty());
        assert_eq!(m.tick(t0, |_| 0), vec![Change::Purge(WorkerId(1))]);
        assert!(!m.is_draining(WorkerId(1)));
        assert_eq!(m.status(WorkerId(1)), None);
        // The drain timeout purges even with requests still in flight.
        m.start_drain(WorkerId(2), t0);
        assert_eq!(
            m.tick(t0 + DRAIN_TIMEOUT, |_| 5),
            vec![Change::Purge(WorkerId(2))]
        );
    }
}
