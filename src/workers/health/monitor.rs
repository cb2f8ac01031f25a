//! What the control core runs per worker: health probes, load polls, model discovery, the
//! circuit breaker and the drain of removed workers.
//!
//! Owns [`WorkerMonitor`], the control core's private per-worker state (never shared: data cores
//! see only what the control core publishes from the [`Change`]s it returns), [`ProbeJob`] /
//! [`ProbeResult`] and [`run_probe_jobs`], which performs one round of blocking probes in parallel
//! on a bounded set of helper threads so that a hanging worker costs one thread its timeout and
//! never delays the others. Time is passed in, so every schedule is testable without sleeping.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use super::probe::{self, HttpUrl, ProbeError, ProbeResponse};
use super::{HealthTracker, HealthTransition, ProbeOutcome};
use crate::workers::admin::{parse_models, DrainClock, DrainStep, WorkerConfig, DRAIN_TIMEOUT};
use crate::workers::breaker::{AttemptOutcome, BreakerState, CircuitBreaker};
use crate::workers::load::{parse_load_body, LoadEndpoint, LoadReport, LOAD_BODY_BYTES_MAX};
use crate::workers::WorkerId;

/// The most probe threads one round uses: enough that a fleet of slow workers is probed in a
/// few timeouts, few enough that a round never floods the 2-core box with threads.
pub const PROBE_THREADS_MAX: usize = 32;

/// The largest health or models body read (both are small JSON documents).
const SMALL_BODY_BYTES_MAX: usize = 256 << 10;

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
    pub addr: HttpUrl,
    /// What to ask.
    pub kind: ProbeKind,
    /// The path (health endpoint, load endpoint or `/v1/models`).
    pub path: String,
    /// Deadline of the whole probe.
    pub timeout: Duration,
}

/// One probe's result.
#[derive(Clone, Debug)]
pub struct ProbeResult {
    /// The worker.
    pub id: WorkerId,
    /// What was asked; for loads, the endpoint that finally answered.
    pub kind: ProbeKind,
    /// The answer.
    pub response: Result<ProbeResponse, ProbeError>,
}

/// Run one job (blocking).
pub fn run_probe_job(job: &ProbeJob) -> ProbeResult {
    let cap = match job.kind {
        ProbeKind::Load(_) => LOAD_BODY_BYTES_MAX,
        _ => SMALL_BODY_BYTES_MAX,
    };
    let started = Instant::now();
    let mut response = probe::get(&job.addr, &job.path, job.timeout, cap);
    let mut kind = job.kind.clone();
    if let (ProbeKind::Load(endpoint), Ok(r)) = (&job.kind, &response) {
        let next = endpoint.after_status(r.status);
        if next != *endpoint {
            let left = job.timeout.saturating_sub(started.elapsed());
            response = probe::get(&job.addr, next.path(), left, cap);
            kind = ProbeKind::Load(next);
        }
    }
    ProbeResult {
        id: job.id,
        kind,
        response,
    }
}

/// Run every job in parallel on at most [`PROBE_THREADS_MAX`] scoped threads (blocking; call it
/// from a helper thread, never from a data core). Results come back in job order.
pub fn run_probe_jobs(jobs: &[ProbeJob]) -> Vec<ProbeResult> {
    let next = AtomicUsize::new(0);
    let results: Mutex<Vec<(usize, ProbeResult)>> = Mutex::new(Vec::with_capacity(jobs.len()));
    let threads = jobs.len().min(PROBE_THREADS_MAX);
    std::thread::scope(|scope| {
        for _ in 0..threads {
            scope.spawn(|| loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                let Some(job) = jobs.get(i) else { break };
                let result = run_probe_job(job);
                if let Ok(mut all) = results.lock() {
                    all.push((i, result));
                }
            });
        }
    });
    let mut all = results
        .into_inner()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    all.sort_by_key(|(i, _)| *i);
    all.into_iter().map(|(_, r)| r).collect()
}

/// The helper thread that runs probe rounds for the control core, so the control core's event
/// loop never blocks on a worker. One round at a time: a round still running when the next is due
/// delays that round instead of piling threads up.
#[derive(Debug)]
pub struct ProbeThread {
    jobs: Option<std::sync::mpsc::Sender<Vec<ProbeJob>>>,
    results: std::sync::mpsc::Receiver<Vec<ProbeResult>>,
    round_running: bool,
    handle: Option<std::thread::JoinHandle<()>>,
}

impl ProbeThread {
    /// Start the thread (`kvgate-probe`).
    pub fn spawn() -> std::io::Result<Self> {
        let (jobs_tx, jobs_rx) = std::sync::mpsc::channel::<Vec<ProbeJob>>();
        let (results_tx, results_rx) = std::sync::mpsc::channel();
        let handle = std::thread::Builder::new()
            .name("kvgate-probe".into())
            .spawn(move || {
                while let Ok(jobs) = jobs_rx.recv() {
                    if results_tx.send(run_probe_jobs(&jobs)).is_err() {
                        break;
                    }
                }
            })?;
        Ok(ProbeThread {
            jobs: Some(jobs_tx),
            results: results_rx,
            round_running: false,
            handle: Some(handle),
        })
    }

    /// Whether a round is running.
    pub fn is_busy(&self) -> bool {
        self.round_running
    }

    /// Start a round (ignored when empty or when one is running; returns whether it started).
    pub fn submit(&mut self, jobs: Vec<ProbeJob>) -> bool {
        if self.round_running || jobs.is_empty() {
            return false;
        }
        let sent = self.jobs.as_ref().is_some_and(|tx| tx.send(jobs).is_ok());
        self.round_running = sent;
        sent
    }

    /// The finished round's results, if it finished (never blocks).
    pub fn try_results(&mut self) -> Option<Vec<ProbeResult>> {
        let results = self.results.try_recv().ok()?;
        self.round_running = false;
        Some(results)
    }
}

impl Drop for ProbeThread {
    fn drop(&mut self) {
        // Closing the job channel ends the thread after its current round (bounded by the probe
        // timeouts); joining is skipped so shutdown never waits on a hanging worker.
        self.jobs = None;
        drop(self.handle.take());
    }
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
}

/// The control core's private state for one worker.
#[derive(Debug)]
struct Watched {
    addr: HttpUrl,
    health: HealthTracker,
    breaker: CircuitBreaker,
    load_endpoint: LoadEndpoint,
    load: Option<LoadReport>,
    models: Option<Vec<String>>,
    drain: Option<DrainClock>,
}

/// Per-worker health, breaker, load and drain state, and the probe schedule.
#[derive(Debug)]
pub struct WorkerMonitor {
    config: WorkerConfig,
    workers: BTreeMap<WorkerId, Watched>,
    health_due: Instant,
    load_due: Instant,
}

impl WorkerMonitor {
    /// A monitor whose first probe rounds are due at `now`.
    pub fn new(config: WorkerConfig, now: Instant) -> Self {
        WorkerMonitor {
            config,
            workers: BTreeMap::new(),
            health_due: now,
            load_due: now,
        }
    }

    /// The settings.
    pub fn config(&self) -> &WorkerConfig {
        &self.config
    }

    /// Start watching a worker (admitted healthy, circuit closed, no load signal yet).
    pub fn add(&mut self, id: WorkerId, addr: HttpUrl) {
        let watched = Watched {
            addr,
            health: HealthTracker::new_healthy(),
            breaker: CircuitBreaker::new(),
            load_endpoint: LoadEndpoint::default(),
            load: None,
            models: None,
            drain: None,
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
    pub fn models(&self, id: WorkerId) -> Option<&[String]> {
        self.workers.get(&id)?.models.as_deref()
    }

    /// Set the models of `id` (from the admission probe).
    pub fn set_models(&mut self, id: WorkerId, models: Vec<String>) {
        if let Some(w) = self.workers.get_mut(&id) {
            w.models = Some(models);
        }
    }

    /// Every watched worker's discovered models, for the model catalog.
    pub fn all_models(&self) -> impl Iterator<Item = (WorkerId, Option<&[String]>)> + '_ {
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
        if health_due {
            self.health_due = now + self.config.health.interval;
        }
        if load_due {
            self.load_due = now + self.config.load_interval;
        }
        for (id, w) in self.workers.iter().filter(|(_, w)| w.drain.is_none()) {
            let job = |kind: ProbeKind, path: &str, timeout: Duration| ProbeJob {
                id: *id,
                addr: w.addr.clone(),
                kind,
                path: path.to_string(),
                timeout,
            };
            if health_due && !self.config.health.disabled {
                jobs.push(job(
                    ProbeKind::Health,
                    &self.config.health.endpoint,
                    self.config.health.timeout,
                ));
            }
            if health_due || (load_due && w.models.is_none()) {
                jobs.push(job(
                    ProbeKind::Models,
                    "/v1/models",
                    self.config.health.timeout,
                ));
            }
            if load_due {
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
        self.health_due.min(self.load_due)
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
    use crate::workers::admin::WorkerArgs;
    use std::io::{Read, Write};
    use std::net::TcpListener;

    fn config() -> WorkerConfig {
        let mut c = WorkerArgs::default().validate().unwrap();
        c.health.failure_threshold = 2;
        c.health.success_threshold = 1;
        c.breaker.failure_threshold = 2;
        c.breaker.timeout = Duration::from_secs(5);
        c
    }

    fn addr(port: u16) -> HttpUrl {
        HttpUrl {
            host: "127.0.0.1".into(),
            port,
        }
    }

    fn ok(status: u16, body: &str) -> Result<ProbeResponse, ProbeError> {
        Ok(ProbeResponse {
            status,
            body: body.as_bytes().to_vec(),
        })
    }

    fn result(
        id: u16,
        kind: ProbeKind,
        response: Result<ProbeResponse, ProbeError>,
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
        m.add(WorkerId(0), addr(1));
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
    fn disabled_health_checks_send_no_health_probes() {
        let mut c = config();
        c.health.disabled = true;
        let t0 = Instant::now();
        let mut m = WorkerMonitor::new(c, t0);
        m.add(WorkerId(0), addr(1));
        assert!(m.due_probes(t0).iter().all(|j| j.kind != ProbeKind::Health));
    }

    #[test]
    fn health_results_flip_after_thresholds() {
        let t0 = Instant::now();
        let mut m = WorkerMonitor::new(config(), t0);
        m.add(WorkerId(0), addr(1));
        let fail = || vec![result(0, ProbeKind::Health, Err(ProbeError::Timeout))];
        assert!(m.apply(fail()).is_empty());
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
        m.add(WorkerId(0), addr(1));
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
            m.apply(vec![result(0, metrics, Err(ProbeError::Timeout))]),
            vec![Change::Load(WorkerId(0), None)]
        );
        assert_eq!(m.load(WorkerId(0)), None);
    }

    #[test]
    fn models_are_kept_when_discovery_fails() {
        let t0 = Instant::now();
        let mut m = WorkerMonitor::new(config(), t0);
        m.add(WorkerId(0), addr(1));
        let body = r#"{"data":[{"id":"m1"}]}"#;
        assert_eq!(
            m.apply(vec![result(0, ProbeKind::Models, ok(200, body))]),
            vec![Change::Models(WorkerId(0))]
        );
        assert!(m
            .apply(vec![result(0, ProbeKind::Models, ok(500, ""))])
            .is_empty());
        assert_eq!(m.models(WorkerId(0)), Some(&["m1".to_string()][..]));
    }

    #[test]
    fn breaker_opens_and_reaches_half_open_on_tick() {
        let t0 = Instant::now();
        let mut m = WorkerMonitor::new(config(), t0);
        m.add(WorkerId(3), addr(1));
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
        m.add(WorkerId(1), addr(1));
        m.add(WorkerId(2), addr(2));
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

    /// A tiny loopback server answering each path with a canned (status, body); `/hang` never
    /// answers. Serves until the test process exits.
    fn serve(routes: &'static [(&'static str, u16, &'static str)]) -> u16 {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        std::thread::spawn(move || {
            for stream in listener.incoming().flatten() {
                std::thread::spawn(move || {
                    let mut s = stream;
                    let mut buf = [0u8; 2048];
                    let n = s.read(&mut buf).unwrap_or(0);
                    let head = String::from_utf8_lossy(&buf[..n]).to_string();
                    let path = head.split_whitespace().nth(1).unwrap_or("").to_string();
                    if path == "/hang" {
                        std::thread::sleep(Duration::from_secs(5));
                        return;
                    }
                    let (status, body) = routes
                        .iter()
                        .find(|r| r.0 == path)
                        .map_or((404, ""), |r| (r.1, r.2));
                    let reply = format!(
                        "HTTP/1.1 {status} X\r\nContent-Length: {}\r\n\r\n{body}",
                        body.len()
                    );
                    let _ = s.write_all(reply.as_bytes());
                });
            }
        });
        port
    }

    #[test]
    fn load_probe_falls_back_to_metrics_within_the_job() {
        let port = serve(&[("/metrics", 200, "vllm:num_requests_waiting 4\n")]);
        let job = ProbeJob {
            id: WorkerId(0),
            addr: addr(port),
            kind: ProbeKind::Load(LoadEndpoint::V1Loads),
            path: "/v1/loads".into(),
            timeout: Duration::from_secs(2),
        };
        let r = run_probe_job(&job);
        assert_eq!(r.kind, ProbeKind::Load(LoadEndpoint::Metrics));
        let t0 = Instant::now();
        let mut m = WorkerMonitor::new(config(), t0);
        m.add(WorkerId(0), addr(port));
        let changes = m.apply(vec![r]);
        assert!(matches!(&changes[..], [Change::Load(_, Some(l))] if l.waiting_requests == 4));
    }

    #[test]
    fn probe_thread_runs_one_round_at_a_time() {
        let port = serve(&[("/health", 200, "ok")]);
        let mut thread = ProbeThread::spawn().unwrap();
        let job = ProbeJob {
            id: WorkerId(1),
            addr: addr(port),
            kind: ProbeKind::Health,
            path: "/health".into(),
            timeout: Duration::from_secs(2),
        };
        assert!(!thread.submit(Vec::new()));
        assert!(thread.submit(vec![job.clone()]));
        assert!(thread.is_busy());
        assert!(!thread.submit(vec![job]));
        let deadline = Instant::now() + Duration::from_secs(3);
        let results = loop {
            if let Some(r) = thread.try_results() {
                break r;
            }
            assert!(Instant::now() < deadline, "probe round did not finish");
            std::thread::sleep(Duration::from_millis(5));
        };
        assert!(!thread.is_busy());
        assert_eq!(results[0].response.as_ref().map(|r| r.status), Ok(200));
    }

    #[test]
    fn a_hanging_worker_does_not_delay_the_others_probes() {
        let port = serve(&[("/health", 200, "ok")]);
        let timeout = Duration::from_millis(300);
        let mut jobs: Vec<ProbeJob> = (0..4)
            .map(|i| ProbeJob {
                id: WorkerId(i),
                addr: addr(port),
                kind: ProbeKind::Health,
                path: "/hang".into(),
                timeout,
            })
            .collect();
        jobs.push(ProbeJob {
            id: WorkerId(9),
            addr: addr(port),
            kind: ProbeKind::Health,
            path: "/health".into(),
            timeout,
        });
        let started = Instant::now();
        let results = run_probe_jobs(&jobs);
        // All five ran concurrently: the round takes about one timeout, not five.
        assert!(
            started.elapsed() < Duration::from_millis(1200),
            "{:?}",
            started.elapsed()
        );
        assert_eq!(results.len(), 5);
        assert!(results[..4]
            .iter()
            .all(|r| r.response == Err(ProbeError::Timeout)));
        assert_eq!(results[4].id, WorkerId(9));
        assert_eq!(results[4].response.as_ref().map(|r| r.status), Ok(200));
    }
}
