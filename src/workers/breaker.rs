//! The per-worker circuit breaker (closed, open, half-open) over a sliding failure window.
//!
//! Owns [`BreakerConfig`] (`--cb-*` flags), [`CircuitBreaker`] (one worker's state machine) and
//! [`BreakerState`] (exported as `smg_worker_cb_state`, 0 closed, 1 open, 2 half-open, SMG's
//! encoding). Pure and clock-injected: the control core owns one breaker per worker, feeds it the
//! [`AttemptOutcome`]s the data cores report, and publishes its state in the worker table
//! (`workers::signals`); data cores read the state, never the breaker.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

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
    fn state_encoding_round_trips() {
        for s in [
            BreakerState::Closed,
            BreakerState::Open,
            BreakerState::HalfOpen,
        ] {
            assert_eq!(BreakerState::from_u8(s as u8), s);
        }
        assert_eq!(BreakerState::from_u8(200), BreakerState::Closed);
    }
}
