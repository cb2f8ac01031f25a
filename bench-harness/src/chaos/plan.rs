//! The seeded plan of one chaos run: every request (when it is sent, what it asks, whether and
//! when its client gives up) and every fault (when, on which engine, for how long), drawn from one
//! seed before anything starts, so a seed names the same run on every machine. Pure: no I/O.

use std::time::Duration;

/// What a run is sized by (the seed included).
#[derive(Clone, Debug, PartialEq)]
pub struct PlanConfig {
    pub seed: u64,
    /// Load time: requests are due within it; every fault ends within it.
    pub duration: Duration,
    /// Warm-up at the start: load without faults, after which the gateway's RSS is the baseline.
    pub warmup: Duration,
    pub engines: usize,
    /// Mean requests per second (Poisson arrivals).
    pub rate: f64,
    /// Mean seconds between two faults.
    pub fault_every_s: f64,
    /// Long requests whose clients leave early, sent in the last seconds of the load.
    pub abort_probes: u32,
}

/// Prompt families: a request's prompt is one of `PREFIX_GROUPS` shared prefixes plus one of
/// `VARIANTS` suffixes, so the gateway's trees reach their size during the warm-up and RSS
/// growth after it means a leak, not a bigger working set.
pub const PREFIX_GROUPS: u32 = 8;
pub const VARIANTS: u32 = 16;

/// The body a request sends.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RequestKind {
    /// `POST /v1/completions`.
    Completion,
    /// `POST /v1/chat/completions`.
    Chat,
    /// `POST /v1/completions` with a body that is not JSON (must get a JSON 400).
    BadJson,
}

/// One planned request.
#[derive(Clone, Debug, PartialEq)]
pub struct PlannedRequest {
    pub id: u64,
    /// Send time from the start of the load.
    pub at: Duration,
    pub kind: RequestKind,
    pub stream: bool,
    pub group: u32,
    pub variant: u32,
    pub max_tokens: u32,
    /// The client closes its connection this long after sending, unless answered before.
    pub abort_after: Option<Duration>,
}

/// What is done to an engine (or to its registration) at one instant.
#[derive(Clone, Debug, PartialEq)]
pub enum Action {
    /// SIGKILL the engine's process.
    Kill,
    /// Start the engine's process again, on its port.
    Restart,
    /// `POST /sim/faults` with this JSON patch.
    SetFaults(serde_json::Value),
    /// `POST /sim/faults {"reset": true}`.
    ClearFaults,
    /// `POST /sim/restart`: the engine loses its cache and its requests in flight.
    SimRestart,
    /// `DELETE /workers/{url}` on the gateway's admin API.
    RemoveWorker,
    /// `POST /workers {"url": ...}` on the gateway's admin API.
    AddWorker,
    /// `POST /workers` of a URL where nothing listens: must be refused with a JSON error.
    AddBogusWorker,
}

impl Action {
    pub fn label(&self) -> String {
        match self {
            Action::Kill => "kill".into(),
            Action::Restart => "restart".into(),
            Action::SetFaults(patch) => format!("faults {patch}"),
            Action::ClearFaults => "clear faults".into(),
            Action::SimRestart => "sim restart".into(),
            Action::RemoveWorker => "admin remove".into(),
            Action::AddWorker => "admin add".into(),
            Action::AddBogusWorker => "admin add unreachable".into(),
        }
    }

    /// True for the actions that start a fault (the rest end one, or are instantaneous).
    pub fn is_fault(&self) -> bool {
        matches!(
            self,
            Action::Kill
                | Action::SetFaults(_)
                | Action::SimRestart
                | Action::RemoveWorker
                | Action::AddBogusWorker
        )
    }
}

/// One scheduled action.
#[derive(Clone, Debug, PartialEq)]
pub struct FaultEvent {
    pub at: Duration,
    pub engine: usize,
    pub action: Action,
}

/// The whole run.
#[derive(Clone, Debug, PartialEq)]
pub struct Plan {
    pub requests: Vec<PlannedRequest>,
    /// Sorted by time.
    pub faults: Vec<FaultEvent>,
}

/// Fraction of requests whose client aborts; of requests sent as malformed JSON.
const ABORT_RATE: f64 = 0.15;
const BAD_JSON_RATE: f64 = 0.03;
/// Client abort delays: most fall before the first byte of a long answer, the rest anywhere.
const ABORT_EARLY_MAX_MS: u64 = 500;
const ABORT_AFTER_MAX_MS: u64 = 3_000;
/// Fraction of long requests (an output budget of thousands of tokens: seconds of decoding, so
/// a client that leaves holds an engine and a gateway credit until the gateway notices).
const LONG_RATE: f64 = 0.1;
/// The abort probes are sent over the last seconds of the load.
const ABORT_PROBE_SPREAD_S: f64 = 2.0;
/// Shortest and longest fault.
const FAULT_MIN_MS: u64 = 2_000;
const FAULT_MAX_MS: u64 = 12_000;

/// Draws the plan of `config` (the same plan for the same config).
pub fn generate(config: &PlanConfig) -> Plan {
    let mut rng = fastrand::Rng::with_seed(config.seed);
    let requests = plan_requests(config, &mut fastrand::Rng::with_seed(rng.u64(..)));
    let faults = plan_faults(config, &mut rng);
    Plan { requests, faults }
}

fn exponential(rng: &mut fastrand::Rng, mean: f64) -> f64 {
    // 1 - f64() is in (0, 1], so the logarithm is finite.
    -mean * (1.0 - rng.f64()).ln()
}

fn plan_requests(config: &PlanConfig, rng: &mut fastrand::Rng) -> Vec<PlannedRequest> {
    let mut requests = Vec::new();
    if config.rate <= 0.0 {
        return requests;
    }
    let end = config.duration.as_secs_f64();
    let mut t = 0.0;
    loop {
        t += exponential(rng, 1.0 / config.rate);
        if t >= end {
            break;
        }
        let draw = rng.f64();
        let kind = if draw < BAD_JSON_RATE {
            RequestKind::BadJson
        } else if rng.bool() {
            RequestKind::Completion
        } else {
            RequestKind::Chat
        };
        let abort_after = (rng.f64() < ABORT_RATE).then(|| {
            let max = if rng.f64() < 0.7 {
                ABORT_EARLY_MAX_MS
            } else {
                ABORT_AFTER_MAX_MS
            };
            Duration::from_millis(rng.u64(0..=max))
        });
        let max_tokens = if rng.f64() < LONG_RATE {
            rng.u32(1_000..=2_000)
        } else {
            rng.u32(1..=48)
        };
        requests.push(PlannedRequest {
            id: requests.len() as u64,
            at: Duration::from_secs_f64(t),
            kind,
            stream: rng.bool(),
            group: rng.u32(0..PREFIX_GROUPS),
            variant: rng.u32(0..VARIANTS),
            max_tokens,
            abort_after,
        });
    }
    // Abort probes in the last seconds: requests decoding for about a minute (at sim-engine's
    // --speedup 2) whose clients leave before the first byte, so the drain that follows finds
    // their credits held unless the gateway ended them when their clients left.
    let probes_from = (end - ABORT_PROBE_SPREAD_S).max(0.0);
    for i in 0..config.abort_probes {
        requests.push(PlannedRequest {
            id: requests.len() as u64,
            at: Duration::from_secs_f64(
                probes_from + ABORT_PROBE_SPREAD_S * f64::from(i) / f64::from(config.abort_probes),
            ),
            kind: if rng.bool() {
                RequestKind::Completion
            } else {
                RequestKind::Chat
            },
            stream: rng.bool(),
            group: rng.u32(0..PREFIX_GROUPS),
            variant: rng.u32(0..VARIANTS),
            max_tokens: rng.u32(16_000..=20_000),
            abort_after: Some(Duration::from_millis(rng.u64(50..=300))),
        });
    }
    requests.sort_by_key(|r| r.at);
    requests
}

fn plan_faults(config: &PlanConfig, rng: &mut fastrand::Rng) -> Vec<FaultEvent> {
    let mut events = Vec::new();
    if config.engines < 2 {
        return events;
    }
    let start = config.warmup.as_millis() as u64;
    let end = config.duration.as_millis() as u64;
    // When each engine is free again (its current fault over).
    let mut busy_until = vec![0u64; config.engines];
    let mut t = start;
    loop {
        t += (exponential(rng, config.fault_every_s) * 1000.0) as u64;
        if t + FAULT_MIN_MS > end {
            break;
        }
        let free: Vec<usize> = (0..config.engines)
            .filter(|&e| busy_until[e] <= t)
            .collect();
        // At least one engine always stays free of faults, so the fleet can answer.
        if free.len() < 2 {
            continue;
        }
        let engine = free[rng.usize(..free.len())];
        let length = rng.u64(FAULT_MIN_MS..=FAULT_MAX_MS).min(end - t);
        let stop = t + length;
        let at = Duration::from_millis(t);
        let until = Duration::from_millis(stop);
        let mut pair = |start: Action, finish: Option<Action>| {
            events.push(FaultEvent {
                at,
                engine,
                action: start,
            });
            if let Some(finish) = finish {
                events.push(FaultEvent {
                    at: until,
                    engine,
                    action: finish,
                });
            }
        };
        match rng.u32(0..9) {
            0 => pair(Action::Kill, Some(Action::Restart)),
            1 => pair(
                Action::SetFaults(serde_json::json!({"hang": true})),
                Some(Action::ClearFaults),
            ),
            2 => pair(
                Action::SetFaults(serde_json::json!({"latency_ms": rng.u64(200..=3_000)})),
                Some(Action::ClearFaults),
            ),
            3 => {
                let status = [500, 429, 503][rng.usize(0..3)];
                let rate = (rng.u32(20..=100) as f64) / 100.0;
                pair(
                    Action::SetFaults(
                        serde_json::json!({"error_rate": rate, "error_status": status}),
                    ),
                    Some(Action::ClearFaults),
                )
            }
            4 => pair(
                Action::SetFaults(serde_json::json!({"drop_mid_stream": true})),
                Some(Action::ClearFaults),
            ),
            5 => pair(
                Action::SetFaults(serde_json::json!({"unhealthy": true})),
                Some(Action::ClearFaults),
            ),
            6 => pair(Action::RemoveWorker, Some(Action::AddWorker)),
            7 => pair(Action::SimRestart, None),
            _ => pair(Action::AddBogusWorker, None),
        }
        busy_until[engine] = stop;
    }
    // Stable: a fault's end and the next fault's start on one engine keep their order.
    events.sort_by_key(|e| e.at);
    events
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(seed: u64) -> PlanConfig {
        PlanConfig {
            seed,
            duration: Duration::from_secs(120),
            warmup: Duration::from_secs(15),
            engines: 4,
            rate: 10.0,
            fault_every_s: 3.0,
            abort_probes: 8,
        }
    }

    #[test]
    fn a_seed_names_one_plan() {
        assert_eq!(generate(&config(7)), generate(&config(7)));
        assert_ne!(generate(&config(7)), generate(&config(8)));
    }

    #[test]
    fn faults_start_after_the_warmup_end_within_the_run_and_spare_one_engine() {
        for seed in 0..50 {
            let plan = generate(&config(seed));
            assert!(!plan.faults.is_empty());
            let mut faulted = [false; 4];
            for event in &plan.faults {
                assert!(event.at >= Duration::from_secs(15), "{event:?}");
                assert!(event.at <= Duration::from_secs(120), "{event:?}");
                match event.action {
                    Action::Kill | Action::SetFaults(_) | Action::RemoveWorker => {
                        faulted[event.engine] = true
                    }
                    Action::Restart | Action::ClearFaults | Action::AddWorker => {
                        faulted[event.engine] = false
                    }
                    _ => {}
                }
                assert!(
                    faulted.iter().any(|f| !f),
                    "seed {seed}: every engine faulted"
                );
            }
            assert!(
                !faulted.iter().any(|&f| f),
                "seed {seed}: a fault never ends"
            );
        }
    }

    #[test]
    fn requests_are_paced_and_some_abort() {
        let plan = generate(&config(3));
        let n = plan.requests.len() as f64;
        assert!(
            (900.0..1500.0).contains(&n),
            "{n} requests for 10/s over 120 s"
        );
        assert!(plan.requests.windows(2).all(|w| w[0].at <= w[1].at));
        let aborts = plan
            .requests
            .iter()
            .filter(|r| r.abort_after.is_some())
            .count() as f64;
        assert!((0.08..0.25).contains(&(aborts / n)));
    }
}
