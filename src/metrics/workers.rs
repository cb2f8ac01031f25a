//! The routing families SMG keeps per worker and per endpoint, under its names, types, labels
//! and buckets: `smg_worker_errors_total`, `smg_worker_selection_total`,
//! `smg_worker_retries_total` (each with SMG's labels plus `worker`), `smg_worker_retries_exhausted_total`,
//! `smg_worker_cb_transitions_total` and `smg_router_ttft_seconds`.
//!
//! The per-worker counters live in one slot per worker id (`WORKERS_MAX` of them), so the
//! `worker` label takes only the registered workers' URLs: a scrape renders the slots of the
//! roster's workers and nothing else. A slot a removed worker leaves is reused by a later one
//! with its counts (Prometheus' `rate` reads a series' first sample as its start, not as an
//! increase). Data cores write their own [`WorkerCounters`] (single writer: a relaxed load and
//! store, no locked instruction, no allocation); the breaker transitions are written by the
//! control core only.

use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use crate::error::ErrorKind;
use crate::ids::WorkerId;
use crate::limits::WORKERS_MAX;
use crate::request::Endpoint;
use crate::workers::breaker::BreakerState;

use super::{bump, latency_bucket, write_histogram, LATENCY_BUCKETS};

/// A failed exchange with a worker, by SMG's `error_type` label values for kvgate's kinds.
const ERROR_TYPES: [(ErrorKind, &str); 4] = [
    (ErrorKind::UpstreamConnect, "connect_error"),
    (ErrorKind::UpstreamClosed, "connection_closed"),
    (ErrorKind::UpstreamMalformed, "malformed_response"),
    (ErrorKind::UpstreamTimeout, "timeout"),
];

/// Per worker slot: the error counts in `ERROR_TYPES` order, the selections, then the retries
/// per endpoint.
const SELECTED: usize = ERROR_TYPES.len();
const RETRIES: usize = SELECTED + 1;
const WORKER_FIGURES: usize = RETRIES + Endpoint::COUNT;

/// Breaker states in their `BreakerState` discriminant order, for the transition matrix.
const BREAKER_STATES: [BreakerState; 3] = [
    BreakerState::Closed,
    BreakerState::Open,
    BreakerState::HalfOpen,
];

/// SMG's `endpoint` label value for a routed endpoint (`None`: not routed to a worker).
pub fn endpoint_label(endpoint: Endpoint) -> Option<&'static str> {
    match endpoint {
        Endpoint::Generate => Some("generate"),
        Endpoint::ChatCompletions => Some("chat"),
        Endpoint::Completions => Some("completions"),
        Endpoint::Messages => Some("messages"),
        _ => None,
    }
}

/// One data core's per-worker and per-endpoint routing counters. Only that core writes them.
#[derive(Debug)]
pub struct WorkerCounters {
    slots: Box<[[AtomicU64; WORKER_FIGURES]]>,
    retries_exhausted: [AtomicU64; Endpoint::COUNT],
    /// Time to first token per endpoint: non-cumulative bucket counts, sum in microseconds.
    ttft_buckets: [[AtomicU64; LATENCY_BUCKETS]; Endpoint::COUNT],
    ttft_sum_us: [AtomicU64; Endpoint::COUNT],
}

impl WorkerCounters {
    pub(super) fn new() -> Self {
        WorkerCounters {
            slots: (0..WORKERS_MAX)
                .map(|_| std::array::from_fn(|_| AtomicU64::new(0)))
                .collect(),
            retries_exhausted: std::array::from_fn(|_| AtomicU64::new(0)),
            ttft_buckets: std::array::from_fn(|_| std::array::from_fn(|_| AtomicU64::new(0))),
            ttft_sum_us: std::array::from_fn(|_| AtomicU64::new(0)),
        }
    }

    fn slot(&self, worker: WorkerId) -> Option<&[AtomicU64; WORKER_FIGURES]> {
        self.slots.get(worker.index())
    }

    /// Counts a failed exchange with `worker` (kinds other than the upstream ones are not the
    /// worker's errors and are not counted here).
    pub fn error(&self, worker: WorkerId, kind: ErrorKind) {
        let Some(i) = ERROR_TYPES.iter().position(|(k, _)| *k == kind) else {
            return;
        };
        if let Some(slot) = self.slot(worker) {
            bump(&slot[i], 1);
        }
    }

    /// Counts `worker` picked for an attempt.
    pub fn selected(&self, worker: WorkerId) {
        if let Some(slot) = self.slot(worker) {
            bump(&slot[SELECTED], 1);
        }
    }

    /// Counts a retry after an attempt on `worker` failed.
    pub fn retried(&self, worker: WorkerId, endpoint: Endpoint) {
        if let Some(slot) = self.slot(worker) {
            bump(&slot[RETRIES + endpoint as usize], 1);
        }
    }

    /// Counts a request whose attempts all failed.
    pub fn retries_exhausted(&self, endpoint: Endpoint) {
        bump(&self.retries_exhausted[endpoint as usize], 1);
    }

    /// Observes the time from the request read to the first body byte of a streamed answer.
    pub fn observe_ttft(&self, endpoint: Endpoint, elapsed: Duration) {
        let e = endpoint as usize;
        bump(
            &self.ttft_buckets[e][latency_bucket(elapsed.as_secs_f64())],
            1,
        );
        let micros = u64::try_from(elapsed.as_micros()).unwrap_or(u64::MAX);
        bump(&self.ttft_sum_us[e], micros);
    }
}

/// The circuit breakers' transitions per worker, `[from][to]`. Written by the control core only.
#[derive(Debug)]
pub struct BreakerTransitions {
    slots: Box<[[[AtomicU64; 3]; 3]]>,
}

impl BreakerTransitions {
    pub(super) fn new() -> Self {
        BreakerTransitions {
            slots: (0..WORKERS_MAX)
                .map(|_| std::array::from_fn(|_| std::array::from_fn(|_| AtomicU64::new(0))))
                .collect(),
        }
    }

    /// Counts `worker`'s breaker going from `from` to `to` (nothing when they are the same).
    pub fn record(&self, worker: WorkerId, from: BreakerState, to: BreakerState) {
        if from == to {
            return;
        }
        if let Some(slot) = self.slots.get(worker.index()) {
            bump(&slot[from as usize][to as usize], 1);
        }
    }
}

/// What the circuit breakers were told, per worker: SMG's `smg_worker_cb_outcomes_total`
/// (every attempt outcome a breaker hears) and its two gauges of the current streaks
/// (`smg_worker_cb_consecutive_{failures,successes}`: a success ends a failure streak and the
/// reverse, and a state change starts both again, as SMG's breaker counts them). Written by
/// the control core only.
#[derive(Debug)]
pub struct BreakerOutcomes {
    /// Per worker: successes, failures, the failure streak, the success streak.
    slots: Box<[[AtomicU64; 4]]>,
}

impl BreakerOutcomes {
    pub(super) fn new() -> Self {
        BreakerOutcomes {
            slots: (0..WORKERS_MAX)
                .map(|_| std::array::from_fn(|_| AtomicU64::new(0)))
                .collect(),
        }
    }

    /// Counts one outcome `worker`'s breaker heard.
    pub fn record(&self, worker: WorkerId, success: bool) {
        let Some(slot) = self.slots.get(worker.index()) else {
            return;
        };
        let (count, streak, ended) = if success { (0, 3, 2) } else { (1, 2, 3) };
        bump(&slot[count], 1);
        bump(&slot[streak], 1);
        slot[ended].store(0, Ordering::Relaxed);
    }

    /// `worker`'s breaker changed state: both streaks start again.
    pub fn restart_streaks(&self, worker: WorkerId) {
        if let Some(slot) = self.slots.get(worker.index()) {
            slot[2].store(0, Ordering::Relaxed);
            slot[3].store(0, Ordering::Relaxed);
        }
    }
}

/// A registered worker as its series are labelled: the id of its slot, its URL and model
/// (both already escaped for a label value).
#[derive(Debug)]
pub struct WorkerLabels {
    /// The worker's slot.
    pub id: WorkerId,
    /// `worker`: its URL.
    pub url: String,
    /// `model`: the model its series are counted under.
    pub model: String,
    /// `worker_type`: `regular`, or its side of a prefill/decode pair (SMG's label).
    pub worker_type: &'static str,
    /// `policy` of its selections: the gateway's, or in PD mode its side's (`None`: the
    /// gateway's, given to `render`).
    pub policy: Option<&'static str>,
}

/// Writes the families of this module, summing `cores`.
pub(super) fn render(
    cores: &[&WorkerCounters],
    (transitions, outcomes): (&BreakerTransitions, &BreakerOutcomes),
    workers: &[WorkerLabels],
    policy: &str,
    out: &mut String,
) {
    let sum = |get: &dyn Fn(&WorkerCounters) -> &AtomicU64| -> u64 {
        cores.iter().map(|c| get(c).load(Ordering::Relaxed)).sum()
    };
    let slot_sum = |id: WorkerId, figure: usize| -> u64 {
        sum(&|c: &WorkerCounters| &c.slots[id.index()][figure])
    };
    let header = |out: &mut String, name: &str, kind: &str, help: &str| {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}");
    };

    let name = "smg_worker_errors_total";
    header(
        out,
        name,
        "counter",
        "Failed exchanges with a worker by error_type (connect, closed mid-response, malformed, timeout)",
    );
    for w in workers {
        for (i, (_, error_type)) in ERROR_TYPES.iter().enumerate() {
            let n = slot_sum(w.id, i);
            let _ = writeln!(
                out,
                "{name}{{worker_type=\"{}\",connection_mode=\"http\",error_type=\"{error_type}\",worker=\"{}\"}} {n}",
                w.worker_type, w.url
            );
        }
    }

    let name = "smg_worker_selection_total";
    header(
        out,
        name,
        "counter",
        "Attempts the routing policy sent to each worker",
    );
    for w in workers {
        let n = slot_sum(w.id, SELECTED);
        let _ = writeln!(
            out,
            "{name}{{worker_type=\"{}\",connection_mode=\"http\",model=\"{}\",policy=\"{}\",worker=\"{}\"}} {n}",
            w.worker_type,
            w.model,
            w.policy.unwrap_or(policy),
            w.url
        );
    }

    let name = "smg_worker_retries_total";
    header(
        out,
        name,
        "counter",
        "Attempts retried on another worker (or a fresh connection) after one on this worker failed",
    );
    for w in workers {
        for endpoint in Endpoint::ALL {
            let Some(label) = endpoint_label(endpoint) else {
                continue;
            };
            let n = slot_sum(w.id, RETRIES + endpoint as usize);
            let _ = writeln!(
                out,
                "{name}{{worker_type=\"{}\",endpoint=\"{label}\",worker=\"{}\"}} {n}",
                w.worker_type, w.url
            );
        }
    }

    let name = "smg_worker_retries_exhausted_total";
    header(
        out,
        name,
        "counter",
        "Requests whose every attempt failed (no retry left or no worker left to try)",
    );
    for endpoint in Endpoint::ALL {
        let Some(label) = endpoint_label(endpoint) else {
            continue;
        };
        let n = sum(&|c: &WorkerCounters| &c.retries_exhausted[endpoint as usize]);
        let _ = writeln!(
            out,
            "{name}{{worker_type=\"regular\",endpoint=\"{label}\"}} {n}"
        );
    }

    let name = "smg_worker_cb_transitions_total";
    header(
        out,
        name,
        "counter",
        "Circuit breaker state transitions by worker, from and to",
    );
    for w in workers {
        let Some(matrix) = transitions.slots.get(w.id.index()) else {
            continue;
        };
        for from in BREAKER_STATES {
            for to in BREAKER_STATES {
                if from == to {
                    continue;
                }
                let n = matrix[from as usize][to as usize].load(Ordering::Relaxed);
                let _ = writeln!(
                    out,
                    "{name}{{worker=\"{}\",from=\"{}\",to=\"{}\"}} {n}",
                    w.url,
                    from.as_str(),
                    to.as_str()
                );
            }
        }
    }

    render_breaker_outcomes(outcomes, workers, out);
    render_pool_size(workers, out);

    let name = "smg_router_ttft_seconds";
    header(
        out,
        name,
        "histogram",
        "Time to first token: from the request read to the first body byte of a streamed answer",
    );
    for endpoint in Endpoint::ALL {
        let Some(label) = endpoint_label(endpoint) else {
            continue;
        };
        let e = endpoint as usize;
        let count_in = |bucket: usize| sum(&|c: &WorkerCounters| &c.ttft_buckets[e][bucket]);
        if (0..LATENCY_BUCKETS).map(count_in).sum::<u64>() == 0 {
            continue;
        }
        let labels = format!(
            "router_type=\"http\",backend_type=\"regular\",model=\"any\",endpoint=\"{label}\""
        );
        let sum_s = sum(&|c: &WorkerCounters| &c.ttft_sum_us[e]) as f64 / 1e6;
        write_histogram(out, name, &labels, &count_in, sum_s);
    }
}

/// `smg_worker_cb_outcomes_total` and the two streak gauges, per registered worker.
fn render_breaker_outcomes(outcomes: &BreakerOutcomes, workers: &[WorkerLabels], out: &mut String) {
    let families = [
        (
            "smg_worker_cb_outcomes_total",
            "counter",
            "Attempt outcomes the circuit breaker heard, by worker and outcome",
        ),
        (
            "smg_worker_cb_consecutive_failures",
            "gauge",
            "Failures in a row the circuit breaker heard (since its last success or state change)",
        ),
        (
            "smg_worker_cb_consecutive_successes",
            "gauge",
            "Successes in a row the circuit breaker heard (since its last failure or state change)",
        ),
    ];
    for (family, (name, kind, help)) in families.iter().enumerate() {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}");
        for w in workers {
            let Some(slot) = outcomes.slots.get(w.id.index()) else {
                continue;
            };
            let read = |i: usize| slot[i].load(Ordering::Relaxed);
            match family {
                0 => {
                    let url = &w.url;
                    let (ok, failed) = (read(0), read(1));
                    let _ = writeln!(out, "{name}{{worker=\"{url}\",outcome=\"success\"}} {ok}");
                    let _ = writeln!(
                        out,
                        "{name}{{worker=\"{url}\",outcome=\"failure\"}} {failed}"
                    );
                }
                1 => {
                    let _ = writeln!(out, "{name}{{worker=\"{}\"}} {}", w.url, read(2));
                }
                _ => {
                    let _ = writeln!(out, "{name}{{worker=\"{}\"}} {}", w.url, read(3));
                }
            }
        }
    }
}

/// `smg_worker_pool_size`: the registered workers per model (a worker counted under its
/// `model` label, as its other series are), SMG's labels.
fn render_pool_size(workers: &[WorkerLabels], out: &mut String) {
    let name = "smg_worker_pool_size";
    let _ = writeln!(
        out,
        "# HELP {name} Registered workers by model\n# TYPE {name} gauge"
    );
    let mut by_model: std::collections::BTreeMap<&str, usize> = std::collections::BTreeMap::new();
    for w in workers {
        *by_model.entry(w.model.as_str()).or_default() += 1;
    }
    for (model, n) in by_model {
        let _ = writeln!(
            out,
            "{name}{{worker_type=\"regular\",connection_mode=\"http\",model=\"{model}\"}} {n}"
        );
    }
}
