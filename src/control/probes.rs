//! Probing workers from the control core: health checks, load polls and model discovery, each a
//! one-shot `GET` (`net::client`) run as a task on the control core's runtime.
//!
//! Owns [`ProbeRound`] (one round of [`ProbeJob`]s from the monitor's schedule, all in flight at
//! once, so a hanging worker costs its own probe's timeout and never delays the others' or the
//! control loop), [`run_probe_job`] (one job; a load poll falls back from `/v1/loads` to
//! `/metrics` within the job) and [`probe_new_worker`] (the admin API's admission check). Every
//! probe is bounded by its timeout; failures are results, never panics.

use std::cell::RefCell;
use std::rc::Rc;
use std::sync::Arc;
use std::time::Instant;

use super::grpc_probe::{admit_grpc_worker, run_grpc_probe};
use super::monitor::{ProbeJob, ProbeKind, ProbeResult};
use crate::grpc::Channels;
use crate::ids::WorkerId;
use crate::limits::{LOAD_BODY_BYTES_MAX, PROBE_BODY_BYTES_MAX};
use crate::net::client;
use crate::workers::catalog::{parse_models, ListedModel};
use crate::workers::health::{HealthConfig, ProbeOutcome};
use crate::workers::spec::{WorkerProtocol, WorkerSpec};

/// Runs one probe job (a gRPC worker's through `grpc_probe`, on `channels`).
pub async fn run_probe_job(job: ProbeJob, channels: &RefCell<Channels>) -> ProbeResult {
    if let WorkerProtocol::Grpc(backend) = job.protocol {
        let (kind, response) = run_grpc_probe(&job, backend, channels).await;
        let id = job.id;
        return ProbeResult { id, kind, response };
    }
    let cap = match job.kind {
        ProbeKind::Load(_) => LOAD_BODY_BYTES_MAX,
        _ => PROBE_BODY_BYTES_MAX,
    };
    let started = Instant::now();
    let (addr, scheme, authority) = (job.addr, job.scheme, job.authority.as_str());
    let bearer = job.bearer.as_deref();
    let mut response =
        client::get(addr, scheme, authority, &job.path, bearer, job.timeout, cap).await;
    let mut kind = job.kind.clone();
    if let (ProbeKind::Load(endpoint), Ok(r)) = (&job.kind, &response) {
        let next = endpoint.after_status(r.status);
        if next != *endpoint {
            let left = job.timeout.saturating_sub(started.elapsed());
            response = client::get(addr, scheme, authority, next.path(), bearer, left, cap).await;
            kind = ProbeKind::Load(next);
        }
    }
    ProbeResult {
        id: job.id,
        kind,
        response,
    }
}

/// One probe round in flight on the control core's runtime. One round at a time: a round
/// still running when the next is due delays that round instead of piling probes up.
#[derive(Debug, Default)]
pub struct ProbeRound {
    /// Results so far, with their job's position; shared with the round's tasks.
    results: Rc<RefCell<Vec<(usize, ProbeResult)>>>,
    /// Jobs in the running round (0: none running).
    jobs: usize,
    /// The control core's connections to gRPC workers, shared by its probes.
    grpc_channels: Rc<RefCell<Channels>>,
}

impl ProbeRound {
    /// Drops the probes' gRPC connections to `worker` (removed from the roster).
    pub fn forget_worker(&self, worker: WorkerId) {
        self.grpc_channels.borrow_mut().forget(worker);
    }

    /// Whether a round is running.
    pub fn is_busy(&self) -> bool {
        self.jobs > 0
    }

    /// Starts a round: one task per job (must be called on the control core's runtime).
    /// Ignored when empty or when a round is running; returns whether it started.
    pub fn submit(&mut self, jobs: Vec<ProbeJob>) -> bool {
        if self.is_busy() || jobs.is_empty() {
            return false;
        }
        self.jobs = jobs.len();
        for (position, job) in jobs.into_iter().enumerate() {
            let results = self.results.clone();
            let channels = self.grpc_channels.clone();
            monoio::spawn(async move {
                let result = run_probe_job(job, &channels).await;
                results.borrow_mut().push((position, result));
            });
        }
        true
    }

    /// The round's results in job order, once every probe has finished (never waits).
    pub fn try_results(&mut self) -> Option<Vec<ProbeResult>> {
        if !self.is_busy() || self.results.borrow().len() < self.jobs {
            return None;
        }
        self.jobs = 0;
        let mut results = std::mem::take(&mut *self.results.borrow_mut());
        results.sort_by_key(|(position, _)| *position);
        Some(results.into_iter().map(|(_, result)| result).collect())
    }
}

/// The admission check of `POST /workers`: the health endpoint must answer 2xx; then the
/// worker's models are read (`None` when discovery fails: the worker then serves any model).
/// `Err` says why the worker is refused. `bearer`: the workers' API key, as the probes send it.
pub async fn probe_new_worker(
    spec: WorkerSpec,
    health: HealthConfig,
    bearer: Option<Arc<str>>,
) -> Result<Option<Vec<ListedModel>>, String> {
    if let WorkerProtocol::Grpc(backend) = spec.protocol {
        return admit_grpc_worker(&spec, backend, health.timeout, bearer).await;
    }
    let (addr, scheme, authority) = (spec.addr, spec.scheme, spec.authority.as_str());
    let bearer = bearer.as_deref();
    let checked = client::get(
        addr,
        scheme,
        authority,
        &health.endpoint,
        bearer,
        health.timeout,
        PROBE_BODY_BYTES_MAX,
    )
    .await;
    match checked {
        Ok(r) if ProbeOutcome::from_status(r.status) == ProbeOutcome::Success => {}
        Ok(r) => {
            return Err(format!(
                "health check {} answered {}",
                health.endpoint, r.status
            ))
        }
        Err(e) => return Err(format!("health check {} failed: {e}", health.endpoint)),
    }
    let listed = client::get(
        addr,
        scheme,
        authority,
        "/v1/models",
        bearer,
        health.timeout,
        PROBE_BODY_BYTES_MAX,
    )
    .await;
    Ok(listed
        .ok()
        .filter(|r| r.status == 200)
        .and_then(|r| parse_models(&r.body).ok()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::ErrorKind;
    use crate::ids::WorkerId;
    use crate::workers::load::LoadEndpoint;
    use std::io::{Read, Write};
    use std::net::{TcpListener, TcpStream};
    use std::time::Duration;

    fn block_on<F: std::future::Future>(future: F) -> F::Output {
        monoio::RuntimeBuilder::<monoio::FusionDriver>::new()
            .enable_timer()
            .build()
            .expect("a runtime")
            .block_on(future)
    }

    /// The path of the request on `stream`.
    fn read_path(stream: &mut TcpStream) -> String {
        read_request(stream).0
    }

    /// The path of the request on `stream`, and whether it carries `Bearer key`.
    fn read_request(stream: &mut TcpStream) -> (String, Option<String>) {
        let mut buf = [0u8; 2048];
        let n = stream.read(&mut buf).unwrap_or(0);
        let head = String::from_utf8_lossy(&buf[..n]).to_string();
        let path = head.split_whitespace().nth(1).unwrap_or("").to_string();
        let bearer = head.lines().find_map(|line| {
            let (name, value) = line.split_once(':')?;
            let token = value.trim().strip_prefix("Bearer ")?;
            name.eq_ignore_ascii_case("authorization")
                .then(|| token.to_owned())
        });
        (path, bearer)
    }

    fn reply(stream: &mut TcpStream, status: u16, body: &str) {
        let reply = format!(
            "HTTP/1.1 {status} X\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        );
        let _ = stream.write_all(reply.as_bytes());
    }

    type Routes = &'static [(&'static str, u16, &'static str)];

    /// A loopback server answering each path with a canned (status, body), 404 otherwise.
    fn serve(routes: Routes) -> WorkerSpec {
        serve_keyed(None, routes)
    }

    /// [`serve`], answering 401 to a request without `Bearer key` when `key` is set (an engine
    /// started with `--api-key`).
    fn serve_keyed(key: Option<&'static str>, routes: Routes) -> WorkerSpec {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        std::thread::spawn(move || {
            for mut stream in listener.incoming().flatten() {
                let (path, bearer) = read_request(&mut stream);
                let (status, body) = match key {
                    Some(key) if bearer.as_deref() != Some(key) => (401, ""),
                    _ => routes
                        .iter()
                        .find(|r| r.0 == path)
                        .map_or((404, ""), |r| (r.1, r.2)),
                };
                reply(&mut stream, status, body);
            }
        });
        WorkerSpec::resolve(&format!("http://127.0.0.1:{port}")).unwrap()
    }

    fn job(id: u16, spec: &WorkerSpec, kind: ProbeKind, path: &str) -> ProbeJob {
        ProbeJob {
            id: WorkerId(id),
            addr: spec.addr,
            scheme: spec.scheme,
            authority: spec.authority.clone(),
            kind,
            path: path.into(),
            timeout: Duration::from_secs(5),
            protocol: spec.protocol,
            bearer: None,
        }
    }

    /// Drives `round` on the current runtime until its results are in.
    async fn finish(round: &mut ProbeRound) -> Vec<ProbeResult> {
        loop {
            if let Some(results) = round.try_results() {
                return results;
            }
            monoio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    #[test]
    fn load_probe_falls_back_to_metrics_within_the_job() {
        let spec = serve(&[("/metrics", 200, "vllm:num_requests_waiting 4\n")]);
        let load = ProbeKind::Load(LoadEndpoint::V1Loads);
        let r = block_on(run_probe_job(
            job(0, &spec, load, "/v1/loads"),
            &Default::default(),
        ));
        assert_eq!(r.kind, ProbeKind::Load(LoadEndpoint::Metrics));
        let r = r.response.unwrap();
        assert_eq!(
            (r.status, r.body.as_slice()),
            (200, &b"vllm:num_requests_waiting 4\n"[..])
        );
    }

    #[test]
    fn a_round_runs_one_at_a_time_and_returns_results_in_job_order() {
        let spec = serve(&[("/health", 200, "ok"), ("/v1/models", 500, "")]);
        let results = block_on(async {
            let mut round = ProbeRound::default();
            let jobs = vec![
                job(1, &spec, ProbeKind::Health, "/health"),
                job(2, &spec, ProbeKind::Models, "/v1/models"),
            ];
            assert!(!round.submit(Vec::new()));
            assert!(round.submit(jobs.clone()));
            assert!(round.is_busy());
            assert!(!round.submit(jobs));
            let results = finish(&mut round).await;
            assert!(!round.is_busy());
            results
        });
        let statuses: Vec<(WorkerId, u16)> = results
            .iter()
            .map(|r| (r.id, r.response.as_ref().map_or(0, |r| r.status)))
            .collect();
        assert_eq!(statuses, [(WorkerId(1), 200), (WorkerId(2), 500)]);
    }

    #[test]
    fn a_rounds_probes_are_in_flight_together() {
        // The worker answers nobody until all four probes have connected: probes run one after
        // another would each wait out their timeout instead.
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        std::thread::spawn(move || {
            let mut waiting = Vec::new();
            for mut stream in listener.incoming().flatten() {
                read_path(&mut stream);
                waiting.push(stream);
                if waiting.len() == 4 {
                    for mut stream in waiting.drain(..) {
                        reply(&mut stream, 200, "ok");
                    }
                }
            }
        });
        let spec = WorkerSpec::resolve(&format!("http://127.0.0.1:{port}")).unwrap();
        let results = block_on(async {
            let mut round = ProbeRound::default();
            let jobs = (0..4)
                .map(|i| job(i, &spec, ProbeKind::Health, "/health"))
                .collect();
            round.submit(jobs);
            finish(&mut round).await
        });
        assert_eq!(results.len(), 4);
        for r in &results {
            assert_eq!(
                r.response.as_ref().map(|r| r.status).ok(),
                Some(200),
                "{r:?}"
            );
        }
    }

    #[test]
    fn a_new_worker_is_admitted_only_when_healthy() {
        let healthy = serve(&[
            ("/health", 200, "ok"),
            ("/v1/models", 200, r#"{"data":[{"id":"m"}]}"#),
        ]);
        let health = HealthConfig::default();
        let models = block_on(probe_new_worker(healthy, health.clone(), None)).unwrap();
        assert_eq!(models.map(|m| m.len()), Some(1));
        let no_models = serve(&[("/health", 200, "ok")]);
        assert_eq!(
            block_on(probe_new_worker(no_models, health.clone(), None)),
            Ok(None)
        );
        let sick = serve(&[("/health", 503, "")]);
        let refused = block_on(probe_new_worker(sick, health.clone(), None)).unwrap_err();
        assert!(refused.contains("answered 503"), "{refused}");
        let closed = TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap();
        let gone = WorkerSpec::resolve(&format!("http://{closed}")).unwrap();
        let refused = block_on(probe_new_worker(gone, health, None)).unwrap_err();
        assert!(refused.contains("failed"), "{refused}");
        let _ = ErrorKind::UpstreamConnect;
    }

    #[test]
    fn probes_send_the_workers_api_key() {
        const ROUTES: Routes = &[
            ("/health", 200, "ok"),
            ("/v1/models", 200, r#"{"data":[{"id":"m"}]}"#),
            ("/v1/loads", 200, r#"{"loads":[]}"#),
        ];
        let keyed = serve_keyed(Some("sk-worker"), ROUTES);
        let key: Option<Arc<str>> = Some(Arc::from("sk-worker"));
        // Without the key the engine refuses everything, admission included.
        let refused = block_on(probe_new_worker(
            keyed.clone(),
            HealthConfig::default(),
            None,
        ));
        assert!(refused.unwrap_err().contains("answered 401"));
        let admitted = block_on(probe_new_worker(
            keyed.clone(),
            HealthConfig::default(),
            key.clone(),
        ));
        assert_eq!(admitted.unwrap().map(|m| m.len()), Some(1));
        // A round's jobs, as the monitor builds them, carry the key.
        let settings = crate::workers::settings::WorkerArgs::default()
            .validate()
            .unwrap();
        let mut monitor = crate::control::monitor::WorkerMonitor::new(settings, Instant::now())
            .with_api_key(Some("sk-worker"));
        monitor.add(WorkerId(7), &keyed);
        let jobs = monitor.due_probes(Instant::now());
        assert!(jobs.len() >= 2, "{jobs:?}");
        let results = block_on(async {
            let mut round = ProbeRound::default();
            round.submit(jobs);
            finish(&mut round).await
        });
        for r in &results {
            let status = r.response.as_ref().map(|r| r.status).ok();
            assert_eq!(status, Some(200), "{r:?}");
        }
    }
}
