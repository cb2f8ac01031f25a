//! One chaos run: start a fleet of single-engine `sim-engine` processes and a `kvgate` in front of
//! them, send the plan's requests while its faults are injected, heal the fleet, drain, and check
//! the invariants. The driver owns the processes because faults act on one engine at a time (a
//! kill and a restart on the same port).

use std::collections::BTreeSet;
use std::fmt::Write as _;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use serde::Serialize;
use tokio::process::{Child, Command};
use tokio::time::Instant;

use super::http::{send, Exchange, Verdict};
use super::metrics::{tree_and_worker_gauges_agree, Scrape};
use super::plan::{generate, Action, FaultEvent, Plan, PlanConfig, PlannedRequest, RequestKind};
use crate::fleet::{
    self, free_port_blocks, free_ports, procstat, spawn_logged, LogMode, STARTUP_TIMEOUT,
};

/// The admin key the driver starts kvgate with (sent as a bearer token on admin calls).
pub const ADMIN_KEY: &str = "chaos-admin-key";
const MODEL: &str = "sim-model";
/// Allowed growth of the gateway's RSS from the end of the warm-up to the end of the drain.
pub const RSS_GROWTH_MAX: f64 = 1.2;
const ADMIN_TIMEOUT: Duration = Duration::from_secs(30);
/// How long a probe of the gateway's or an engine's state may take.
const GET_TIMEOUT: Duration = Duration::from_secs(10);

/// Everything a run needs besides its plan.
#[derive(Clone, Debug)]
pub struct ChaosOptions {
    pub plan: PlanConfig,
    /// Where `kvgate` and `sim-engine` are.
    pub bin_dir: PathBuf,
    pub out_dir: PathBuf,
    /// Past this a request is a hang (a violation).
    pub client_timeout: Duration,
    /// How long in-flight counts may take to reach zero once the load and the faults are over.
    pub drain_timeout: Duration,
    /// sim-engine's `--speedup`.
    pub sim_speedup: f64,
    /// Added to kvgate's command line.
    pub kvgate_args: Vec<String>,
    /// The command that reproduces this run, printed when it fails.
    pub repro: String,
}

/// What the run observed and whether the invariants held.
#[derive(Debug, Default, Serialize)]
pub struct ChaosReport {
    pub seed: u64,
    pub duration_s: f64,
    pub requests: usize,
    pub outcomes: std::collections::BTreeMap<String, u64>,
    pub faults_injected: std::collections::BTreeMap<String, u64>,
    pub admin_calls: std::collections::BTreeMap<String, u64>,
    pub gateway_cut_responses: f64,
    pub drain_s: Option<f64>,
    pub rss_warmup_kib: Option<u64>,
    pub rss_peak_kib: Option<u64>,
    pub rss_final_kib: Option<u64>,
    /// `(seconds since the start, KiB)`, one per second.
    pub rss: Vec<(f64, u64)>,
    pub violations: Vec<String>,
}

struct Engine {
    port: u16,
    child: Option<Child>,
    starts: u32,
}

struct Fleet {
    options: ChaosOptions,
    engines: Vec<Engine>,
    gateway: Option<Child>,
    gateway_addr: SocketAddr,
    metrics_addr: SocketAddr,
}

impl Fleet {
    fn engine_url(&self, engine: usize) -> String {
        format!("http://127.0.0.1:{}", self.engines[engine].port)
    }

    fn start_engine(&mut self, engine: usize) -> Result<(), String> {
        let options = &self.options;
        let slot = &mut self.engines[engine];
        let log = options.out_dir.join(format!("engine-{engine}.log"));
        let mut command = Command::new(options.bin_dir.join("sim-engine"));
        command
            .arg("--engines")
            .arg("1")
            .arg("--base-port")
            .arg(slot.port.to_string())
            .arg("--speedup")
            .arg(options.sim_speedup.to_string())
            .arg("--model-name")
            .arg(MODEL)
            .arg("--seed")
            .arg((options.plan.seed.wrapping_mul(1000) + engine as u64).to_string());
        let mode = match slot.starts {
            0 => LogMode::Truncate,
            _ => LogMode::Append,
        };
        slot.child = Some(spawn_logged(command, &log, mode)?);
        slot.starts += 1;
        Ok(())
    }

    async fn kill_engine(&mut self, engine: usize) {
        if let Some(mut child) = self.engines[engine].child.take() {
            let _ = child.start_kill();
            let _ = tokio::time::timeout(Duration::from_secs(5), child.wait()).await;
        }
    }

    fn start_gateway(&mut self) -> Result<(), String> {
        let options = &self.options;
        let urls: Vec<String> = (0..self.engines.len())
            .map(|e| self.engine_url(e))
            .collect();
        let mut command = Command::new(options.bin_dir.join("kvgate"));
        command
            .args(["--host", "127.0.0.1", "--port"])
            .arg(self.gateway_addr.port().to_string())
            .args(["--prometheus-host", "127.0.0.1", "--prometheus-port"])
            .arg(self.metrics_addr.port().to_string())
            .arg("--worker-urls")
            .args(&urls)
            .args(["--admin-api-key", ADMIN_KEY])
            .args(["--health-check-interval-secs", "1"])
            .args(["--health-failure-threshold", "2"])
            .args(["--health-success-threshold", "1"])
            .args(["--load-monitor-interval", "1"])
            .args(["--cb-timeout-duration-secs", "5"])
            .args(["--retry-initial-backoff-ms", "20"])
            .args(["--retry-max-backoff-ms", "500"])
            .args(["--log-level", "info"])
            .args(&options.kvgate_args);
        let log = options.out_dir.join("kvgate.log");
        self.gateway = Some(spawn_logged(command, &log, LogMode::Truncate)?);
        Ok(())
    }

    fn gateway_pid(&self) -> Option<u32> {
        self.gateway.as_ref().and_then(Child::id)
    }

    async fn stop(&mut self) {
        if let Some(mut gateway) = self.gateway.take() {
            let _ = gateway.start_kill();
            let _ = gateway.wait().await;
        }
        for engine in 0..self.engines.len() {
            self.kill_engine(engine).await;
        }
    }
}

/// Waits until `addr` answers `GET /health` with 200 (a fresh engine or gateway has no faults).
async fn wait_healthy(addr: SocketAddr, what: &str) -> Result<(), String> {
    let never = fleet::never_stopped();
    fleet::wait_until_healthy(addr, "/health", STARTUP_TIMEOUT, never, || Ok(()))
        .await
        .map_err(|e| format!("{what}: {e}"))
}

/// A GET answered with its body (any status), or `None` when there is no answer.
async fn get(addr: SocketAddr, path: &str, bearer: Option<&str>) -> Option<(u16, String)> {
    let answer = fleet::http::get(addr, path, bearer, GET_TIMEOUT).await?;
    Some((answer.status, answer.body))
}

/// The registered worker URLs, from `GET /workers`.
async fn worker_urls(gateway: SocketAddr) -> Option<BTreeSet<String>> {
    let (status, body) = get(gateway, "/workers", Some(ADMIN_KEY)).await?;
    if status != 200 {
        return None;
    }
    let value: serde_json::Value = serde_json::from_str(&body).ok()?;
    Some(
        value["workers"]
            .as_array()?
            .iter()
            .filter_map(|w| w["url"].as_str().map(String::from))
            .collect(),
    )
}

async fn scrape(metrics: SocketAddr) -> Option<Scrape> {
    let (status, body) = get(metrics, "/metrics", None).await?;
    (status == 200).then(|| Scrape::parse(&body))
}

/// Requests an engine has queued and neither finished nor cancelled (`/sim/stats`).
async fn engine_in_flight(port: u16) -> Option<i64> {
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    let (_, body) = get(addr, "/sim/stats", None).await?;
    let stats: serde_json::Value = serde_json::from_str(&body).ok()?;
    let n = |key: &str| stats[key].as_i64().unwrap_or(0);
    Some(n("requests_queued") - n("requests_finished") - n("requests_cancelled"))
}

fn percent_encode(text: &str) -> String {
    text.bytes()
        .map(|b| {
            if b.is_ascii_alphanumeric() || b == b'.' || b == b'-' || b == b'_' {
                (b as char).to_string()
            } else {
                format!("%{b:02X}")
            }
        })
        .collect()
}

/// The prompt of `group` and `variant`: a shared prefix of 150 words and a suffix of 20.
pub fn prompt(group: u32, variant: u32) -> String {
    let mut text = String::new();
    for i in 0..150 {
        let _ = write!(text, "g{group}w{} ", (i * 7 + group) % 97);
    }
    for i in 0..20 {
        let _ = write!(text, "v{variant}x{i} ");
    }
    text
}

/// The JSON body of a planned request.
pub fn request_body(request: &PlannedRequest) -> (&'static str, Bytes) {
    let text = prompt(request.group, request.variant);
    match request.kind {
        RequestKind::Completion => (
            "/v1/completions",
            Bytes::from(
                serde_json::json!({"model": MODEL, "prompt": text,
                    "max_tokens": request.max_tokens, "stream": request.stream})
                .to_string(),
            ),
        ),
        RequestKind::Chat => (
            "/v1/chat/completions",
            Bytes::from(
                serde_json::json!({"model": MODEL,
                    "messages": [{"role": "user", "content": text}],
                    "max_tokens": request.max_tokens, "stream": request.stream})
                .to_string(),
            ),
        ),
        RequestKind::BadJson => (
            "/v1/completions",
            Bytes::from(format!(
                "{{\"model\": \"{MODEL}\", \"prompt\": \"{}",
                &text[..40]
            )),
        ),
    }
}

type Log = Arc<Mutex<Vec<String>>>;

fn note(log: &Log, line: String) {
    if let Ok(mut lines) = log.lock() {
        lines.push(line);
    }
}

/// Runs the whole chaos test and returns its report (violations inside).
pub async fn run_chaos(options: ChaosOptions) -> Result<ChaosReport, String> {
    std::fs::create_dir_all(&options.out_dir)
        .map_err(|e| format!("{}: {e}", options.out_dir.display()))?;
    let plan = generate(&options.plan);
    write_plan(&options.out_dir.join("plan.txt"), &plan)?;
    // One block per engine, not one for all: an engine is killed and restarted on its own port.
    let mut blocks = vec![1; options.plan.engines];
    blocks.push(2);
    let ports = free_port_blocks(&blocks)?;
    let engines = ports[..options.plan.engines]
        .iter()
        .map(|&port| Engine {
            port,
            child: None,
            starts: 0,
        })
        .collect();
    let gateway_port = ports[options.plan.engines];
    let gateway_addr = SocketAddr::from(([127, 0, 0, 1], gateway_port));
    let metrics_addr = SocketAddr::from(([127, 0, 0, 1], gateway_port + 1));
    let mut fleet = Fleet {
        options: options.clone(),
        engines,
        gateway: None,
        gateway_addr,
        metrics_addr,
    };
    let result = drive(&mut fleet, &plan).await;
    fleet.stop().await;
    result
}

async fn drive(fleet: &mut Fleet, plan: &Plan) -> Result<ChaosReport, String> {
    let options = fleet.options.clone();
    for engine in 0..fleet.engines.len() {
        fleet.start_engine(engine)?;
    }
    for engine in 0..fleet.engines.len() {
        let addr = SocketAddr::from(([127, 0, 0, 1], fleet.engines[engine].port));
        wait_healthy(addr, &format!("sim-engine {engine}")).await?;
    }
    fleet.start_gateway()?;
    wait_healthy(fleet.gateway_addr, "kvgate").await?;
    let expected: BTreeSet<String> = (0..fleet.engines.len())
        .map(|e| fleet.engine_url(e))
        .collect();
    let deadline = Instant::now() + STARTUP_TIMEOUT;
    while worker_urls(fleet.gateway_addr).await.as_ref() != Some(&expected) {
        if Instant::now() > deadline {
            return Err("kvgate does not list the engines".into());
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let gateway_pid = fleet.gateway_pid().ok_or("kvgate has no process id")?;
    let mut report = ChaosReport {
        seed: options.plan.seed,
        requests: plan.requests.len(),
        ..ChaosReport::default()
    };
    let start = Instant::now();
    let events: Log = Arc::default();
    note(&events, "t_s,engine,action,result".into());

    // RSS sampler, once a second until told to stop.
    let (stop_rss, mut rss_stopped) = tokio::sync::watch::channel(false);
    let rss_task = tokio::spawn(async move {
        let mut samples = Vec::new();
        loop {
            if let Some(kib) = procstat::rss_kb(gateway_pid) {
                samples.push((start.elapsed().as_secs_f64(), kib));
            }
            tokio::select! {
                _ = tokio::time::sleep(Duration::from_secs(1)) => {}
                _ = rss_stopped.changed() => return samples,
            }
        }
    });

    // The requests, each on its own task at its planned time.
    let gateway = fleet.gateway_addr;
    let client_timeout = options.client_timeout;
    let requests = plan.requests.clone();
    let sender = tokio::spawn(async move {
        let mut tasks = Vec::with_capacity(requests.len());
        for request in requests {
            tokio::time::sleep_until(start + request.at).await;
            tasks.push(tokio::spawn(async move {
                let (path, body) = request_body(&request);
                let verdict = send(
                    gateway,
                    Exchange {
                        method: "POST",
                        path,
                        body,
                        bearer: None,
                        abort_after: request.abort_after,
                        timeout: client_timeout,
                    },
                )
                .await;
                (request.id, verdict)
            }));
        }
        let mut verdicts = Vec::with_capacity(tasks.len());
        for task in tasks {
            if let Ok(pair) = task.await {
                verdicts.push(pair);
            }
        }
        verdicts
    });

    // The faults, in order, on this task (they change the fleet).
    let mut admin_verdicts = Vec::new();
    let mut warmup_rss = None;
    for event in &plan.faults {
        if warmup_rss.is_none() && event.at >= options.plan.warmup {
            tokio::time::sleep_until(start + options.plan.warmup).await;
            warmup_rss = procstat::rss_kb(gateway_pid);
        }
        tokio::time::sleep_until(start + event.at).await;
        let result = apply(fleet, event, &mut admin_verdicts).await;
        if event.action.is_fault() {
            *report
                .faults_injected
                .entry(fault_kind(&event.action))
                .or_default() += 1;
        }
        note(
            &events,
            format!(
                "{:.2},{},{},{}",
                start.elapsed().as_secs_f64(),
                event.engine,
                event.action.label().replace(',', ";"),
                result.replace(',', ";")
            ),
        );
    }
    if warmup_rss.is_none() {
        tokio::time::sleep_until(start + options.plan.warmup).await;
        warmup_rss = procstat::rss_kb(gateway_pid);
    }
    tokio::time::sleep_until(start + options.plan.duration).await;

    // Heal: every engine up and fault-free, every worker registered.
    heal(fleet, &events, start, &mut admin_verdicts).await;
    let verdicts = sender.await.map_err(|e| format!("request sender: {e}"))?;
    report.duration_s = start.elapsed().as_secs_f64();

    // Drain: no credit held by the gateway, no request left on an engine.
    let drain_start = Instant::now();
    let mut last = String::new();
    let mut drained = false;
    while drain_start.elapsed() < options.drain_timeout {
        let active = scrape(fleet.metrics_addr)
            .await
            .map(|s| s.sum("smg_worker_requests_active"));
        let mut on_engines = 0;
        for engine in &fleet.engines {
            // An engine that does not answer counts as one request in flight: not drained.
            on_engines += engine_in_flight(engine.port).await.unwrap_or(1).abs();
        }
        last = format!("gateway in flight {active:?}, engines in flight {on_engines}");
        if active == Some(0.0) && on_engines == 0 {
            drained = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    if drained {
        report.drain_s = Some(drain_start.elapsed().as_secs_f64());
    } else {
        report.violations.push(format!(
            "in-flight credits not zero {:?} after the load and the faults ended: {last}",
            options.drain_timeout
        ));
    }
    let final_rss = procstat::rss_kb(gateway_pid);
    let _ = stop_rss.send(true);
    report.rss = rss_task.await.unwrap_or_default();

    for (id, verdict) in &verdicts {
        *report.outcomes.entry(verdict.label()).or_default() += 1;
        if let Verdict::Improper(why) = verdict {
            report
                .violations
                .push(format!("request {id}: improper answer: {why}"));
        }
    }
    for (what, verdict) in &admin_verdicts {
        *report
            .admin_calls
            .entry(format!("{what} {}", verdict.label()))
            .or_default() += 1;
        if let Verdict::Improper(why) = verdict {
            report
                .violations
                .push(format!("admin {what}: improper answer: {why}"));
        }
    }

    let scraped = scrape(fleet.metrics_addr).await.unwrap_or_default();
    report.gateway_cut_responses = scraped.sum("kvgate_upstream_responses_cut_total");
    let cuts = report.outcomes.get("cut_after_head").copied().unwrap_or(0);
    if cuts as f64 > report.gateway_cut_responses {
        report.violations.push(format!(
            "{cuts} responses reached the client cut, the gateway counted {} \
             (kvgate_upstream_responses_cut_total): a cut it did not notice",
            report.gateway_cut_responses
        ));
    }
    match worker_urls(fleet.gateway_addr).await {
        Some(workers) => {
            if workers != expected {
                report.violations.push(format!(
                    "after healing the admin API lists {workers:?}, expected {expected:?}"
                ));
            }
            for problem in tree_and_worker_gauges_agree(&scraped, &workers) {
                report.violations.push(problem);
            }
        }
        None => report
            .violations
            .push("GET /workers does not answer after the run".into()),
    }
    check_rss(&mut report, warmup_rss, final_rss);
    check_trees_empty_without_workers(fleet, &mut report).await;
    check_gateway_log(fleet, &mut report);
    if let Ok(lines) = events.lock() {
        let path = options.out_dir.join("events.csv");
        std::fs::write(&path, lines.join("\n") + "\n")
            .map_err(|e| format!("{}: {e}", path.display()))?;
    }
    Ok(report)
}

fn fault_kind(action: &Action) -> String {
    match action {
        Action::SetFaults(patch) => patch
            .as_object()
            .and_then(|o| o.keys().next().cloned())
            .unwrap_or_else(|| "faults".into()),
        other => other.label(),
    }
}

async fn admin(
    fleet: &Fleet,
    method: &str,
    path: &str,
    body: Bytes,
    verdicts: &mut Vec<(String, Verdict)>,
    what: &str,
) -> Verdict {
    let verdict = send(
        fleet.gateway_addr,
        Exchange {
            method,
            path,
            body,
            bearer: Some(ADMIN_KEY),
            abort_after: None,
            timeout: ADMIN_TIMEOUT,
        },
    )
    .await;
    verdicts.push((what.to_string(), verdict.clone()));
    verdict
}

async fn sim_post(port: u16, path: &str, body: Bytes) -> Verdict {
    send(
        SocketAddr::from(([127, 0, 0, 1], port)),
        Exchange {
            method: "POST",
            path,
            body,
            bearer: None,
            abort_after: None,
            timeout: Duration::from_secs(10),
        },
    )
    .await
}

async fn apply(
    fleet: &mut Fleet,
    event: &FaultEvent,
    admin_verdicts: &mut Vec<(String, Verdict)>,
) -> String {
    let engine = event.engine;
    let port = fleet.engines[engine].port;
    let url = fleet.engine_url(engine);
    let verdict = match &event.action {
        Action::Kill => {
            fleet.kill_engine(engine).await;
            return "killed".into();
        }
        Action::Restart => {
            return match fleet.start_engine(engine) {
                Ok(()) => "started".into(),
                Err(e) => e,
            }
        }
        Action::SetFaults(patch) => {
            sim_post(port, "/sim/faults", Bytes::from(patch.to_string())).await
        }
        Action::ClearFaults => sim_post(port, "/sim/faults", Bytes::from("{\"reset\":true}")).await,
        Action::SimRestart => sim_post(port, "/sim/restart", Bytes::new()).await,
        Action::RemoveWorker => {
            let path = format!("/workers/{}", percent_encode(&url));
            admin(
                fleet,
                "DELETE",
                &path,
                Bytes::new(),
                admin_verdicts,
                "remove",
            )
            .await
        }
        Action::AddWorker => {
            let body = Bytes::from(serde_json::json!({ "url": url }).to_string());
            admin(fleet, "POST", "/workers", body, admin_verdicts, "add").await
        }
        Action::AddBogusWorker => {
            // A port nothing listens on (taken and released here): the probe must fail.
            let bogus = free_ports(1).map(|p| format!("http://127.0.0.1:{p}"));
            let body =
                Bytes::from(serde_json::json!({ "url": bogus.unwrap_or_default() }).to_string());
            admin(
                fleet,
                "POST",
                "/workers",
                body,
                admin_verdicts,
                "add_unreachable",
            )
            .await
        }
    };
    verdict.label()
}

/// Restarts dead engines, clears every engine's faults, registers missing workers.
async fn heal(
    fleet: &mut Fleet,
    events: &Log,
    start: Instant,
    admin_verdicts: &mut Vec<(String, Verdict)>,
) {
    for engine in 0..fleet.engines.len() {
        let running = match fleet.engines[engine].child.as_mut() {
            Some(child) => matches!(child.try_wait(), Ok(None)),
            None => false,
        };
        if !running {
            let result = fleet.start_engine(engine);
            note(
                events,
                format!(
                    "{:.2},{engine},heal restart,{result:?}",
                    start.elapsed().as_secs_f64()
                ),
            );
            // Only a restarted engine is waited for: a running one may fail its health check
            // on purpose until its faults are cleared below.
            let addr = SocketAddr::from(([127, 0, 0, 1], fleet.engines[engine].port));
            let _ = wait_healthy(addr, "sim-engine").await;
        }
        let verdict = sim_post(
            fleet.engines[engine].port,
            "/sim/faults",
            Bytes::from("{\"reset\":true}"),
        )
        .await;
        note(
            events,
            format!(
                "{:.2},{engine},heal clear faults,{}",
                start.elapsed().as_secs_f64(),
                verdict.label()
            ),
        );
    }
    let deadline = Instant::now() + ADMIN_TIMEOUT;
    loop {
        let listed = worker_urls(fleet.gateway_addr).await.unwrap_or_default();
        let missing: Vec<usize> = (0..fleet.engines.len())
            .filter(|&e| !listed.contains(&fleet.engine_url(e)))
            .collect();
        if missing.is_empty() || Instant::now() > deadline {
            return;
        }
        for engine in missing {
            let body =
                Bytes::from(serde_json::json!({ "url": fleet.engine_url(engine) }).to_string());
            let verdict = admin(fleet, "POST", "/workers", body, admin_verdicts, "heal_add").await;
            note(
                events,
                format!(
                    "{:.2},{engine},heal admin add,{}",
                    start.elapsed().as_secs_f64(),
                    verdict.label()
                ),
            );
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

fn check_rss(report: &mut ChaosReport, warmup: Option<u64>, final_rss: Option<u64>) {
    report.rss_warmup_kib = warmup;
    report.rss_final_kib = final_rss;
    report.rss_peak_kib = report.rss.iter().map(|&(_, kib)| kib).max();
    match (warmup, final_rss) {
        (Some(warmup), Some(last)) if last as f64 > warmup as f64 * RSS_GROWTH_MAX => {
            report.violations.push(format!(
                "gateway RSS grew from {warmup} KiB after the warm-up to {last} KiB after the drain \
                 (over {RSS_GROWTH_MAX}x)"
            ))
        }
        (Some(_), Some(_)) => {}
        _ => report
            .violations
            .push("the gateway's RSS could not be read (has it exited?)".into()),
    }
}

/// Removes every worker through the admin API: once each is drained and purged, the trees hold
/// no tenant (an index entry left for a removed worker would route to it).
async fn check_trees_empty_without_workers(fleet: &Fleet, report: &mut ChaosReport) {
    let mut verdicts = Vec::new();
    for engine in 0..fleet.engines.len() {
        let path = format!("/workers/{}", percent_encode(&fleet.engine_url(engine)));
        admin(
            fleet,
            "DELETE",
            &path,
            Bytes::new(),
            &mut verdicts,
            "final_remove",
        )
        .await;
    }
    for (what, verdict) in &verdicts {
        if !matches!(verdict, Verdict::Success) {
            report
                .violations
                .push(format!("admin {what}: {verdict:?} for a registered worker"));
        }
    }
    let deadline = Instant::now() + ADMIN_TIMEOUT;
    let mut last = String::new();
    while Instant::now() < deadline {
        let workers = worker_urls(fleet.gateway_addr).await;
        let scraped = scrape(fleet.metrics_addr).await.unwrap_or_default();
        let tenants = scraped.sum("smg_cache_tree_tenants");
        last = format!("workers {workers:?}, smg_cache_tree_tenants sum {tenants}");
        if workers.is_some_and(|w| w.is_empty()) && tenants == 0.0 {
            return;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    report.violations.push(format!(
        "after removing every worker the index still has tenants or workers: {last}"
    ));
}

fn check_gateway_log(fleet: &mut Fleet, report: &mut ChaosReport) {
    if let Some(gateway) = fleet.gateway.as_mut() {
        if let Ok(Some(status)) = gateway.try_wait() {
            report
                .violations
                .push(format!("kvgate exited during the run ({status})"));
        }
    }
    let log = fleet.options.out_dir.join("kvgate.log");
    let text = std::fs::read_to_string(&log).unwrap_or_default();
    if let Some(line) = text.lines().find(|l| l.contains("panicked")) {
        report.violations.push(format!(
            "panic in the gateway log ({}): {line}",
            log.display()
        ));
    }
}

fn write_plan(path: &Path, plan: &Plan) -> Result<(), String> {
    let mut text = String::new();
    for event in &plan.faults {
        let _ = writeln!(
            text,
            "fault {:>8.2}s engine {} {}",
            event.at.as_secs_f64(),
            event.engine,
            event.action.label()
        );
    }
    for r in &plan.requests {
        let _ = writeln!(
            text,
            "request {} {:>8.3}s {:?} stream={} group={} variant={} max_tokens={} abort_after={:?}",
            r.id,
            r.at.as_secs_f64(),
            r.kind,
            r.stream,
            r.group,
            r.variant,
            r.max_tokens,
            r.abort_after
        );
    }
    std::fs::write(path, text).map_err(|e| format!("{}: {e}", path.display()))
}
