//! The per-worker circuit breaker (closed, open, half-open) over a sliding failure window, the
//! retry policy, and worker overload protection.
//!
//! Owns [`BreakerConfig`] / [`CircuitBreaker`] (`--cb-*` flags; state exported as
//! `smg_worker_cb_state`, 0 closed, 1 open, 2 half-open, SMG's encoding), [`RetryPolicy`]
//! (`--retry-*` flags: which attempt failures are retried, the backoff, and [`TriedWorkers`] so a
//! retry goes to a different worker when one exists) and [`OverloadConfig`]
//! (`--worker-overload-*`). All of it is pure and clock-injected: the control core owns one
//! breaker per worker, feeds it the outcomes the data cores report, and publishes its state as an
//! atomic in the worker table; data cores read the state, never the breaker.

use std::collections::VecDeque;
use std::fmt::Write as _;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU8, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use arc_swap::ArcSwapOption;

use super::load::{escape_label, LoadReport};
use super::WorkerId;

/// Circuit-breaker settings, SMG's defaults.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BreakerConfig {
    /// Failures within the window that open the circuit (`--cb-failure-threshold`).
    pub failure_threshold: u32,
    /// Successes in half-open that close it again (`--cb-success-threshold`).
    pub success_threshold: u32,
    /// How long the circuit stays open before it lets trial traffic through
    /// (`--cb-timeout-duration-secs`).
    pub timeout: Duration,
    /// Failures count toward opening only while they all fall within this window
    /// (`--cb-window-duration-secs`).
    pub window: Duration,
    /// `--disable-circuit-breaker`: the circuit never opens.
    pub disabled: bool,
}

impl Default for BreakerConfig {
    fn default() -> Self {
        BreakerConfig {
            failure_threshold: 10,
            success_threshold: 3,
            timeout: Duration::from_secs(60),
            window: Duration::from_secs(120),
            disabled: false,
        }
    }
}

/// The state of a worker's circuit, as published in the worker table (`as u8`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
#[repr(u8)]
pub enum BreakerState {
    /// Normal operation: traffic flows, failures are counted.
    #[default]
    Closed = 0,
    /// Tripped: no traffic until the timeout passes.
    Open = 1,
    /// Trial: traffic flows; enough successes close the circuit, one failure reopens it.
    HalfOpen = 2,
}

impl BreakerState {
    /// Decode a published state; unknown values read as closed (never block traffic on a
    /// corrupted value — the control core is the only writer and writes only valid states).
    pub fn from_u8(v: u8) -> BreakerState {
        match v {
            1 => BreakerState::Open,
            2 => BreakerState::HalfOpen,
            _ => BreakerState::Closed,
        }
    }

    /// Whether requests may be sent to a worker in this state.
    pub fn allows_traffic(self) -> bool {
        self != BreakerState::Open
    }

    /// The lower-case name SMG logs.
    pub fn as_str(self) -> &'static str {
        match self {
            BreakerState::Closed => "closed",
            BreakerState::Open => "open",
            BreakerState::HalfOpen => "half_open",
        }
    }
}

/// What a finished request attempt means for the worker's circuit.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AttemptOutcome {
    /// The worker answered with a non-failure status.
    Success,
    /// Connect failure, reset, timeout, or a 5xx / 408 / 429 status.
    Failure,
}

/// A state change, for the control core to publish and log.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BreakerTransition {
    /// State before.
    pub from: BreakerState,
    /// State after.
    pub to: BreakerState,
}

/// One worker's circuit breaker.
#[derive(Clone, Debug)]
pub struct CircuitBreaker {
    state: BreakerState,
    /// Times of the current failure streak, newest last, at most `failure_threshold` long.
    failure_times: VecDeque<Instant>,
    half_open_successes: u32,
    opened_at: Option<Instant>,
}

impl Default for CircuitBreaker {
    fn default() -> Self {
        CircuitBreaker::new()
    }
}

impl CircuitBreaker {
    /// A closed breaker.
    pub fn new() -> Self {
        CircuitBreaker {
            state: BreakerState::Closed,
            failure_times: VecDeque::new(),
            half_open_successes: 0,
            opened_at: None,
        }
    }

    /// The current state, without advancing time.
    pub fn state(&self) -> BreakerState {
        self.state
    }

    /// Advance time: an open circuit whose timeout has passed becomes half-open.
    pub fn tick(&mut self, now: Instant, config: &BreakerConfig) -> Option<BreakerTransition> {
        let opened_at = self.opened_at?;
        if self.state == BreakerState::Open
            && now.saturating_duration_since(opened_at) >= config.timeout
        {
            self.half_open_successes = 0;
            return Some(self.move_to(BreakerState::HalfOpen, now));
        }
        None
    }

    /// Record one attempt's outcome; returns the transition it caused, if any.
    pub fn record(
        &mut self,
        outcome: AttemptOutcome,
        now: Instant,
        config: &BreakerConfig,
    ) -> Option<BreakerTransition> {
        if config.disabled {
            return None;
        }
        if let Some(t) = self.tick(now, config) {
            // Apply the outcome on top of the timeout transition; report the net change.
            let next = self.record_in_state(outcome, now, config);
            return Some(BreakerTransition {
                from: t.from,
                to: next.map_or(t.to, |n| n.to),
            });
        }
        self.record_in_state(outcome, now, config)
    }

    fn record_in_state(
        &mut self,
        outcome: AttemptOutcome,
        now: Instant,
        config: &BreakerConfig,
    ) -> Option<BreakerTransition> {
        match (self.state, outcome) {
            (BreakerState::Closed, AttemptOutcome::Success) => {
                self.failure_times.clear();
                None
            }
            (BreakerState::Closed, AttemptOutcome::Failure) => {
                let threshold = config.failure_threshold.max(1) as usize;
                self.failure_times.push_back(now);
                while self.failure_times.len() > threshold {
                    self.failure_times.pop_front();
                }
                let oldest = *self.failure_times.front()?;
                let in_window = now.saturating_duration_since(oldest) <= config.window;
                (self.failure_times.len() == threshold && in_window)
                    .then(|| self.move_to(BreakerState::Open, now))
            }
            (BreakerState::HalfOpen, AttemptOutcome::Success) => {
                self.half_open_successes += 1;
                (self.half_open_successes >= config.success_threshold.max(1))
                    .then(|| self.move_to(BreakerState::Closed, now))
            }
            (BreakerState::HalfOpen, AttemptOutcome::Failure) => {
                Some(self.move_to(BreakerState::Open, now))
            }
            // Outcomes of requests sent before the circuit opened change nothing.
            (BreakerState::Open, _) => None,
        }
    }

    fn move_to(&mut self, to: BreakerState, now: Instant) -> BreakerTransition {
        let from = self.state;
        self.state = to;
        self.failure_times.clear();
        self.half_open_successes = 0;
        self.opened_at = (to == BreakerState::Open).then_some(now);
        BreakerTransition { from, to }
    }
}

/// The per-worker signals the control core publishes in a worker-table slot and data cores read
/// lock-free: circuit state, overload exclusion, draining (removed, waiting for its in-flight
/// requests), and the last load report. Written by the control core only.
#[derive(Debug, Default)]
pub struct WorkerSignals {
    breaker: AtomicU8,
    overloaded: AtomicBool,
    draining: AtomicBool,
    load: ArcSwapOption<LoadReport>,
    /// Bumped after every report published by `set_load`, and by `reset`: dispatch credits
    /// taken under an older generation are already in (or older than) the published report. A
    /// failed poll (`set_load(None)`) does not bump it: no report counted those dispatches, so
    /// their credits still stand for the work the worker has.
    load_generation: AtomicU32,
}

impl WorkerSignals {
    /// Whether these signals let routing pick the worker (health is checked separately).
    pub fn allows_traffic(&self) -> bool {
        self.breaker_state().allows_traffic()
            && !self.overloaded.load(Ordering::Acquire)
            && !self.draining.load(Ordering::Acquire)
    }

    /// The published circuit state.
    pub fn breaker_state(&self) -> BreakerState {
        BreakerState::from_u8(self.breaker.load(Ordering::Acquire))
    }

    /// Whether the worker is draining.
    pub fn is_draining(&self) -> bool {
        self.draining.load(Ordering::Acquire)
    }

    /// Whether overload protection excludes the worker.
    pub fn is_overloaded(&self) -> bool {
        self.overloaded.load(Ordering::Acquire)
    }

    /// The last load report (`None`: no signal).
    pub fn load(&self) -> Option<Arc<LoadReport>> {
        self.load.load_full()
    }

    /// The last load report for one routing decision: unlike `load`, it writes no shared
    /// reference count (arc-swap's per-thread debt slots), so data cores reading every worker's
    /// report per request do not bounce its cache line between them.
    pub fn peek_load(&self) -> arc_swap::Guard<Option<Arc<LoadReport>>> {
        self.load.load()
    }

    /// Which load report is published: changes with every report `set_load` publishes and with
    /// `reset`, not when a failed poll withdraws the report.
    pub fn load_generation(&self) -> u32 {
        self.load_generation.load(Ordering::Acquire)
    }

    /// Publish the circuit state. Control core only.
    pub fn set_breaker(&self, state: BreakerState) {
        self.breaker.store(state as u8, Ordering::Release);
    }

    /// Publish the draining flag. Control core only.
    pub fn set_draining(&self, draining: bool) {
        self.draining.store(draining, Ordering::Release);
    }

    /// Publish a load report and the overload verdict it implies. Control core only.
    pub fn set_load(&self, report: Option<LoadReport>, overload: &OverloadConfig) {
        self.overloaded
            .store(overload.is_overloaded(report.as_ref()), Ordering::Release);
        let reported = report.is_some();
        self.load.store(report.map(Arc::new));
        if reported {
            self.load_generation.fetch_add(1, Ordering::Release);
        }
    }

    /// Back to a fresh slot (closed, not overloaded, not draining, no load). Control core only,
    /// after the worker was purged.
    pub fn reset(&self) {
        self.set_breaker(BreakerState::Closed);
        self.overloaded.store(false, Ordering::Release);
        self.draining.store(false, Ordering::Release);
        self.load.store(None);
        self.load_generation.fetch_add(1, Ordering::Release);
    }
}

/// Append the `smg_worker_cb_state` gauge (0 closed, 1 open, 2 half-open), one series per worker.
pub fn render_cb_state<'a>(
    out: &mut String,
    workers: impl Iterator<Item = (&'a str, BreakerState)>,
) {
    out.push_str(
        "# HELP smg_worker_cb_state Circuit breaker state (0 closed, 1 open, 2 half-open)\n",
    );
    out.push_str("# TYPE smg_worker_cb_state gauge\n");
    for (url, state) in workers {
        let _ = writeln!(
            out,
            "smg_worker_cb_state{{worker=\"{}\"}} {}",
            escape_label(url),
            state as u8
        );
    }
}

/// The most retries `--retry-max-retries` accepts: beyond this a request would outlive any
/// sensible client timeout at the default backoff, and [`TriedWorkers`] is sized by it.
pub const RETRIES_MAX: u32 = 32;

/// Retry settings, SMG's defaults.
#[derive(Clone, Debug, PartialEq)]
pub struct RetryPolicy {
    /// Retries after the first attempt (`--retry-max-retries`).
    pub max_retries: u32,
    /// Backoff before the first retry (`--retry-initial-backoff-ms`).
    pub initial_backoff: Duration,
    /// Largest backoff (`--retry-max-backoff-ms`).
    pub max_backoff: Duration,
    /// Growth per retry (`--retry-backoff-multiplier`).
    pub backoff_multiplier: f64,
    /// Relative jitter in `[0, 1]` (`--retry-jitter-factor`).
    pub jitter_factor: f64,
    /// `--disable-retries`.
    pub disabled: bool,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        RetryPolicy {
            max_retries: 5,
            initial_backoff: Duration::from_millis(50),
            max_backoff: Duration::from_millis(30_000),
            backoff_multiplier: 1.5,
            jitter_factor: 0.2,
            disabled: false,
        }
    }
}

/// How an attempt on a worker failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AttemptFailure {
    /// The worker answered with this status.
    Status(u16),
    /// The connection could not be opened (refused, unreachable, connect timeout).
    Connect,
    /// The worker closed or reset the connection before any response byte.
    ResetBeforeResponse,
    /// The gateway's request timeout expired; the request may still run on the worker.
    Timeout,
}

impl AttemptFailure {
    /// Whether this failure counts against the worker's circuit.
    pub fn breaker_outcome(self) -> AttemptOutcome {
        match self {
            AttemptFailure::Status(s) if !is_retryable_status(s) && s < 500 => {
                AttemptOutcome::Success
            }
            _ => AttemptOutcome::Failure,
        }
    }
}

/// Whether any byte of the response has been written to the client. Once it has, the response
/// is committed and no retry is possible.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DownstreamProgress {
    /// Nothing written yet: the attempt may be retried.
    NothingSent,
    /// Some bytes reached the client.
    BytesSent,
}

/// The retry loop's next step.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum RetryDecision {
    /// Wait `backoff`, then try again on another eligible worker.
    Retry {
        /// The delay before the next attempt.
        backoff: Duration,
    },
    /// Report the failure to the client.
    GiveUp(GiveUpReason),
}

/// Why the retry loop stopped.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GiveUpReason {
    /// `--disable-retries`.
    Disabled,
    /// The failure is not one SMG retries.
    NotRetryable,
    /// Bytes already reached the client.
    ResponseStarted,
    /// `--retry-max-retries` retries were spent.
    Exhausted,
}

/// Statuses SMG retries on: 408, 429, 500, 502, 503, 504.
pub fn is_retryable_status(status: u16) -> bool {
    matches!(status, 408 | 429 | 500 | 502 | 503 | 504)
}

impl RetryPolicy {
    /// Decide after a failed attempt. `retries_done` counts retries already made (0 after the
    /// first attempt); `unit_random` is a uniform draw in `[0, 1)` for the jitter.
    pub fn decide(
        &self,
        retries_done: u32,
        failure: AttemptFailure,
        progress: DownstreamProgress,
        unit_random: f64,
    ) -> RetryDecision {
        let retryable = match failure {
            AttemptFailure::Status(s) => is_retryable_status(s),
            AttemptFailure::Connect | AttemptFailure::ResetBeforeResponse => true,
            AttemptFailure::Timeout => false,
        };
        let reason = if self.disabled {
            Some(GiveUpReason::Disabled)
        } else if progress == DownstreamProgress::BytesSent {
            Some(GiveUpReason::ResponseStarted)
        } else if !retryable {
            Some(GiveUpReason::NotRetryable)
        } else if retries_done >= self.max_retries.min(RETRIES_MAX) {
            Some(GiveUpReason::Exhausted)
        } else {
            None
        };
        match reason {
            Some(r) => RetryDecision::GiveUp(r),
            None => RetryDecision::Retry {
                backoff: self.backoff(retries_done, unit_random),
            },
        }
    }

    /// The delay before retry number `retry_index` (0-based):
    /// `min(initial * multiplier^i, max) * (1 + jitter * (2u - 1))`.
    pub fn backoff(&self, retry_index: u32, unit_random: f64) -> Duration {
        let exponent = i32::try_from(retry_index.min(RETRIES_MAX)).unwrap_or(0);
        let base_ms =
            self.initial_backoff.as_secs_f64() * 1000.0 * self.backoff_multiplier.powi(exponent);
        let capped_ms = base_ms.min(self.max_backoff.as_secs_f64() * 1000.0);
        let u = if unit_random.is_finite() {
            unit_random.clamp(0.0, 1.0)
        } else {
            0.5
        };
        let jittered_ms = capped_ms * (1.0 + self.jitter_factor * (2.0 * u - 1.0));
        if !jittered_ms.is_finite() || jittered_ms <= 0.0 {
            return Duration::ZERO;
        }
        Duration::from_secs_f64(jittered_ms / 1000.0)
    }
}

/// Workers a request has already tried, so a retry picks a different one when it can. Fixed
/// capacity (one slot per attempt, [`RETRIES_MAX`] + 1): no allocation on the data path.
#[derive(Clone, Debug)]
pub struct TriedWorkers {
    ids: [WorkerId; RETRIES_MAX as usize + 1],
    len: usize,
}

impl Default for TriedWorkers {
    fn default() -> Self {
        TriedWorkers {
            ids: [WorkerId(0); RETRIES_MAX as usize + 1],
            len: 0,
        }
    }
}

impl TriedWorkers {
    /// Remember a worker as tried (ignored once full: later attempts may then repeat workers).
    pub fn push(&mut self, id: WorkerId) {
        if self.len < self.ids.len() && !self.contains(id) {
            self.ids[self.len] = id;
            self.len += 1;
        }
    }

    /// Whether `id` was tried.
    pub fn contains(&self, id: WorkerId) -> bool {
        self.ids[..self.len].contains(&id)
    }

    /// How many distinct workers were tried.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether no worker was tried yet.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Pick the retry target from `eligible` (in the policy's preference order): the first one
    /// not tried yet, else the first one at all (a single-worker fleet retries in place).
    pub fn pick(&self, eligible: impl Iterator<Item = WorkerId> + Clone) -> Option<WorkerId> {
        eligible
            .clone()
            .find(|id| !self.contains(*id))
            .or_else(|| eligible.clone().next())
    }
}

/// Worker overload protection (`--worker-overload-token-usage`,
/// `--worker-overload-waiting-requests`); unset limits are off (SMG's default).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct OverloadConfig {
    /// Exclude a worker whose reported KV usage is above this fraction.
    pub token_usage: Option<f64>,
    /// Exclude a worker whose reported queue is longer than this.
    pub waiting_requests: Option<u64>,
}

impl OverloadConfig {
    /// Whether the worker is over a limit. A worker without a report, or without the field a
    /// limit reads, is never excluded: no signal is never a penalty.
    pub fn is_overloaded(&self, report: Option<&LoadReport>) -> bool {
        let Some(r) = report else { return false };
        let usage_over =
            matches!((self.token_usage, r.token_usage), (Some(limit), Some(u)) if u > limit);
        let queue_over = matches!(self.waiting_requests, Some(limit) if r.waiting_requests > limit);
        usage_over || queue_over
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(failures: u32, successes: u32) -> BreakerConfig {
        BreakerConfig {
            failure_threshold: failures,
            success_threshold: successes,
            timeout: Duration::from_secs(60),
            window: Duration::from_secs(120),
            disabled: false,
        }
    }

    fn secs(t0: Instant, s: u64) -> Instant {
        t0 + Duration::from_secs(s)
    }

    #[test]
    fn closed_opens_after_threshold_failures_within_window() {
        let c = cfg(3, 2);
        let t0 = Instant::now();
        let mut b = CircuitBreaker::new();
        assert_eq!(b.record(AttemptOutcome::Failure, t0, &c), None);
        assert_eq!(b.record(AttemptOutcome::Failure, secs(t0, 1), &c), None);
        assert_eq!(
            b.record(AttemptOutcome::Failure, secs(t0, 2), &c),
            Some(BreakerTransition {
                from: BreakerState::Closed,
                to: BreakerState::Open
            })
        );
        assert!(!b.state().allows_traffic());
    }

    #[test]
    fn failures_spread_beyond_the_window_do_not_open() {
        let c = cfg(3, 2);
        let t0 = Instant::now();
        let mut b = CircuitBreaker::new();
        b.record(AttemptOutcome::Failure, t0, &c);
        b.record(AttemptOutcome::Failure, secs(t0, 100), &c);
        // The first failure is 121 s old: outside the 120 s window.
        assert_eq!(b.record(AttemptOutcome::Failure, secs(t0, 121), &c), None);
        assert_eq!(b.state(), BreakerState::Closed);
        // The three most recent (100, 121, 122) are within 120 s.
        assert!(b
            .record(AttemptOutcome::Failure, secs(t0, 122), &c)
            .is_some());
        assert_eq!(b.state(), BreakerState::Open);
    }

    #[test]
    fn a_success_resets_the_failure_streak() {
        let c = cfg(3, 2);
        let t0 = Instant::now();
        let mut b = CircuitBreaker::new();
        b.record(AttemptOutcome::Failure, t0, &c);
        b.record(AttemptOutcome::Failure, t0, &c);
        b.record(AttemptOutcome::Success, t0, &c);
        b.record(AttemptOutcome::Failure, t0, &c);
        assert_eq!(b.record(AttemptOutcome::Failure, t0, &c), None);
        assert_eq!(b.state(), BreakerState::Closed);
    }

    #[test]
    fn open_becomes_half_open_after_timeout_then_closes_on_successes() {
        let c = cfg(1, 2);
        let t0 = Instant::now();
        let mut b = CircuitBreaker::new();
        b.record(AttemptOutcome::Failure, t0, &c);
        assert_eq!(b.tick(secs(t0, 59), &c), None);
        // Outcomes while open change nothing.
        assert_eq!(b.record(AttemptOutcome::Success, secs(t0, 30), &c), None);
        assert_eq!(b.state(), BreakerState::Open);
        assert_eq!(
            b.tick(secs(t0, 60), &c),
            Some(BreakerTransition {
                from: BreakerState::Open,
                to: BreakerState::HalfOpen
            })
        );
        assert!(b.state().allows_traffic());
        assert_eq!(b.record(AttemptOutcome::Success, secs(t0, 61), &c), None);
        assert_eq!(
            b.record(AttemptOutcome::Success, secs(t0, 62), &c),
            Some(BreakerTransition {
                from: BreakerState::HalfOpen,
                to: BreakerState::Closed
            })
        );
    }

    #[test]
    fn half_open_failure_reopens_and_restarts_the_timeout() {
        let c = cfg(1, 3);
        let t0 = Instant::now();
        let mut b = CircuitBreaker::new();
        b.record(AttemptOutcome::Failure, t0, &c);
        b.tick(secs(t0, 60), &c);
        b.record(AttemptOutcome::Success, secs(t0, 61), &c);
        assert_eq!(
            b.record(AttemptOutcome::Failure, secs(t0, 62), &c),
            Some(BreakerTransition {
                from: BreakerState::HalfOpen,
                to: BreakerState::Open
            })
        );
        assert_eq!(b.tick(secs(t0, 121), &c), None);
        assert_eq!(
            b.tick(secs(t0, 122), &c).map(|t| t.to),
            Some(BreakerState::HalfOpen)
        );
    }

    #[test]
    fn record_after_timeout_applies_on_half_open() {
        let c = cfg(1, 1);
        let t0 = Instant::now();
        let mut b = CircuitBreaker::new();
        b.record(AttemptOutcome::Failure, t0, &c);
        // No tick in between: the outcome arrives after the timeout and closes the circuit.
        assert_eq!(
            b.record(AttemptOutcome::Success, secs(t0, 70), &c),
            Some(BreakerTransition {
                from: BreakerState::Open,
                to: BreakerState::Closed
            })
        );
    }

    #[test]
    fn disabled_breaker_never_opens() {
        let c = BreakerConfig {
            disabled: true,
            ..cfg(1, 1)
        };
        let t0 = Instant::now();
        let mut b = CircuitBreaker::new();
        for _ in 0..100 {
            assert_eq!(b.record(AttemptOutcome::Failure, t0, &c), None);
        }
        assert_eq!(b.state(), BreakerState::Closed);
    }

    #[test]
    fn state_encoding_round_trips_and_renders() {
        for s in [
            BreakerState::Closed,
            BreakerState::Open,
            BreakerState::HalfOpen,
        ] {
            assert_eq!(BreakerState::from_u8(s as u8), s);
        }
        assert_eq!(BreakerState::from_u8(200), BreakerState::Closed);
        let mut out = String::new();
        render_cb_state(
            &mut out,
            [
                ("http://a:1", BreakerState::Open),
                ("http://b:2", BreakerState::HalfOpen),
            ]
            .into_iter(),
        );
        assert!(out.contains("# TYPE smg_worker_cb_state gauge\n"));
        assert!(out.contains("smg_worker_cb_state{worker=\"http://a:1\"} 1\n"));
        assert!(out.contains("smg_worker_cb_state{worker=\"http://b:2\"} 2\n"));
    }

    #[test]
    fn retryable_statuses_are_exactly_smgs() {
        for s in [408, 429, 500, 502, 503, 504] {
            assert!(is_retryable_status(s));
        }
        for s in [200, 400, 401, 404, 413, 501, 505] {
            assert!(!is_retryable_status(s));
        }
    }

    #[test]
    fn retry_decisions() {
        let p = RetryPolicy::default();
        let none = DownstreamProgress::NothingSent;
        assert!(matches!(
            p.decide(0, AttemptFailure::Status(503), none, 0.5),
            RetryDecision::Retry { .. }
        ));
        assert!(matches!(
            p.decide(0, AttemptFailure::Connect, none, 0.5),
            RetryDecision::Retry { .. }
        ));
        assert!(matches!(
            p.decide(0, AttemptFailure::ResetBeforeResponse, none, 0.5),
            RetryDecision::Retry { .. }
        ));
        assert_eq!(
            p.decide(0, AttemptFailure::Status(400), none, 0.5),
            RetryDecision::GiveUp(GiveUpReason::NotRetryable)
        );
        assert_eq!(
            p.decide(0, AttemptFailure::Timeout, none, 0.5),
            RetryDecision::GiveUp(GiveUpReason::NotRetryable)
        );
        assert_eq!(
            p.decide(
                0,
                AttemptFailure::Status(503),
                DownstreamProgress::BytesSent,
                0.5
            ),
            RetryDecision::GiveUp(GiveUpReason::ResponseStarted)
        );
        assert!(matches!(
            p.decide(4, AttemptFailure::Status(500), none, 0.5),
            RetryDecision::Retry { .. }
        ));
        assert_eq!(
            p.decide(5, AttemptFailure::Status(500), none, 0.5),
            RetryDecision::GiveUp(GiveUpReason::Exhausted)
        );
        let off = RetryPolicy {
            disabled: true,
            ..RetryPolicy::default()
        };
        assert_eq!(
            off.decide(0, AttemptFailure::Connect, none, 0.5),
            RetryDecision::GiveUp(GiveUpReason::Disabled)
        );
    }

    #[test]
    fn backoff_progression_matches_smg_table_without_jitter() {
        let p = RetryPolicy::default();
        // u = 0.5 means zero jitter: 50, 75, 112.5, 168.75, 253.125 ms.
        let ms: Vec<u128> = (0..5)
            .map(|i| p.backoff(i, 0.5).as_micros() / 1000)
            .collect();
        assert_eq!(ms, vec![50, 75, 112, 168, 253]);
    }

    #[test]
    fn backoff_is_capped_and_jitter_bounded() {
        let p = RetryPolicy {
            max_backoff: Duration::from_millis(100),
            ..RetryPolicy::default()
        };
        assert_eq!(p.backoff(30, 0.5), Duration::from_millis(100));
        assert_eq!(p.backoff(30, 0.0), Duration::from_millis(80));
        assert_eq!(p.backoff(30, 1.0), Duration::from_millis(120));
        assert_eq!(p.backoff(30, f64::NAN), Duration::from_millis(100));
        let zero = RetryPolicy {
            initial_backoff: Duration::ZERO,
            ..RetryPolicy::default()
        };
        assert_eq!(zero.backoff(3, 0.9), Duration::ZERO);
    }

    #[test]
    fn breaker_outcome_of_failures() {
        assert_eq!(
            AttemptFailure::Status(400).breaker_outcome(),
            AttemptOutcome::Success
        );
        assert_eq!(
            AttemptFailure::Status(429).breaker_outcome(),
            AttemptOutcome::Failure
        );
        assert_eq!(
            AttemptFailure::Status(501).breaker_outcome(),
            AttemptOutcome::Failure
        );
        assert_eq!(
            AttemptFailure::Connect.breaker_outcome(),
            AttemptOutcome::Failure
        );
        assert_eq!(
            AttemptFailure::Timeout.breaker_outcome(),
            AttemptOutcome::Failure
        );
    }

    #[test]
    fn retries_prefer_untried_workers() {
        let mut tried = TriedWorkers::default();
        let fleet = [WorkerId(3), WorkerId(1), WorkerId(2)];
        assert_eq!(tried.pick(fleet.iter().copied()), Some(WorkerId(3)));
        tried.push(WorkerId(3));
        tried.push(WorkerId(3));
        assert_eq!(tried.len(), 1);
        assert_eq!(tried.pick(fleet.iter().copied()), Some(WorkerId(1)));
        tried.push(WorkerId(1));
        tried.push(WorkerId(2));
        // Everyone tried: fall back to the policy's first choice.
        assert_eq!(tried.pick(fleet.iter().copied()), Some(WorkerId(3)));
        assert_eq!(tried.pick(std::iter::empty()), None);
        let mut full = TriedWorkers::default();
        for i in 0..100 {
            full.push(WorkerId(i));
        }
        assert_eq!(full.len(), RETRIES_MAX as usize + 1);
    }

    #[test]
    fn signals_gate_traffic() {
        let s = WorkerSignals::default();
        assert!(s.allows_traffic());
        s.set_breaker(BreakerState::Open);
        assert!(!s.allows_traffic());
        s.set_breaker(BreakerState::HalfOpen);
        assert!(s.allows_traffic());
        let limits = OverloadConfig {
            token_usage: None,
            waiting_requests: Some(1),
        };
        let busy = LoadReport {
            waiting_requests: 5,
            ..LoadReport::default()
        };
        s.set_load(Some(busy), &limits);
        assert!(s.is_overloaded() && !s.allows_traffic());
        assert_eq!(s.load().map(|r| r.waiting_requests), Some(5));
        s.set_load(None, &limits);
        assert!(s.allows_traffic());
        s.set_draining(true);
        assert!(!s.allows_traffic());
        s.reset();
        assert!(s.allows_traffic() && s.load().is_none() && !s.is_draining());
    }

    #[test]
    fn overload_predicate() {
        let c = OverloadConfig {
            token_usage: Some(0.9),
            waiting_requests: Some(10),
        };
        let mut r = LoadReport {
            token_usage: Some(0.5),
            waiting_requests: 3,
            ..LoadReport::default()
        };
        assert!(!c.is_overloaded(Some(&r)));
        r.token_usage = Some(0.95);
        assert!(c.is_overloaded(Some(&r)));
        r.token_usage = None;
        assert!(!c.is_overloaded(Some(&r)));
        r.waiting_requests = 11;
        assert!(c.is_overloaded(Some(&r)));
        assert!(!c.is_overloaded(None));
        assert!(!OverloadConfig::default().is_overloaded(Some(&r)));
    }
}
