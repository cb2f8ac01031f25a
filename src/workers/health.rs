//! Active health checks: per-worker consecutive failure and success thresholds.
//!
//! Owns [`HealthConfig`] (from `--health-check-*` and `--health-failure-threshold` /
//! `--health-success-threshold`), [`HealthTracker`] (one worker's state machine: healthy until
//! `failure_threshold` consecutive failed probes, unhealthy until `success_threshold` consecutive
//! good ones) and [`ProbeOutcome`]. The tracker is pure: the control core feeds it probe outcomes
//! (`control::probes`) and publishes the transition it returns in the worker table.

use std::time::Duration;

/// Health-check settings, SMG's defaults.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HealthConfig {
    /// Path probed on each worker (`--health-check-endpoint`).
    pub endpoint: String,
    /// Time between probe rounds (`--health-check-interval-secs`).
    pub interval: Duration,
    /// A probe that has not answered by then is a failure (`--health-check-timeout-secs`).
    pub timeout: Duration,
    /// Consecutive failures that mark a healthy worker unhealthy (`--health-failure-threshold`).
    pub failure_threshold: u32,
    /// Consecutive successes that mark an unhealthy worker healthy (`--health-success-threshold`).
    pub success_threshold: u32,
    /// `--disable-health-check`: no probes; every worker stays healthy.
    pub disabled: bool,
}

impl Default for HealthConfig {
    fn default() -> Self {
        HealthConfig {
            endpoint: "/health".to_string(),
            interval: Duration::from_secs(60),
            timeout: Duration::from_secs(5),
            failure_threshold: 3,
            success_threshold: 2,
            disabled: false,
        }
    }
}

/// What one probe found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ProbeOutcome {
    /// The worker answered 2xx in time.
    Success,
    /// Refused, reset, timed out or answered non-2xx.
    Failure,
}

impl ProbeOutcome {
    /// Classify an HTTP status: 2xx is a success, anything else a failure.
    pub fn from_status(status: u16) -> ProbeOutcome {
        if (200..300).contains(&status) {
            ProbeOutcome::Success
        } else {
            ProbeOutcome::Failure
        }
    }
}

/// A change of a worker's health, for the control core to publish and log.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HealthTransition {
    /// The worker reached the failure threshold and leaves routing.
    BecameUnhealthy,
    /// The worker reached the success threshold and returns to routing.
    BecameHealthy,
}

/// One worker's health state machine. Starts healthy (SMG admits a worker as healthy; the
/// admin API probes a new worker before adding it).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HealthTracker {
    healthy: bool,
    consecutive_failures: u32,
    consecutive_successes: u32,
}

impl Default for HealthTracker {
    fn default() -> Self {
        HealthTracker::new_healthy()
    }
}

impl HealthTracker {
    /// A tracker for a worker admitted as healthy.
    pub fn new_healthy() -> Self {
        HealthTracker {
            healthy: true,
            consecutive_failures: 0,
            consecutive_successes: 0,
        }
    }

    /// Whether the worker is routable as far as health checks go.
    pub fn is_healthy(&self) -> bool {
        self.healthy
    }

    /// Consecutive failed probes so far.
    pub fn consecutive_failures(&self) -> u32 {
        self.consecutive_failures
    }

    /// Consecutive successful probes so far.
    pub fn consecutive_successes(&self) -> u32 {
        self.consecutive_successes
    }

    /// Feed one probe outcome; returns the transition it caused, if any. A threshold of 0 is
    /// treated as 1 (config validation rejects 0; this keeps the machine total).
    pub fn record(
        &mut self,
        outcome: ProbeOutcome,
        config: &HealthConfig,
    ) -> Option<HealthTransition> {
        match outcome {
            ProbeOutcome::Success => {
                self.consecutive_failures = 0;
                self.consecutive_successes = self.consecutive_successes.saturating_add(1);
                if !self.healthy && self.consecutive_successes >= config.success_threshold.max(1) {
                    self.healthy = true;
                    self.consecutive_successes = 0;
                    return Some(HealthTransition::BecameHealthy);
                }
            }
            ProbeOutcome::Failure => {
                self.consecutive_successes = 0;
                self.consecutive_failures = self.consecutive_failures.saturating_add(1);
                if self.healthy && self.consecutive_failures >= config.failure_threshold.max(1) {
                    self.healthy = false;
                    self.consecutive_failures = 0;
                    return Some(HealthTransition::BecameUnhealthy);
                }
            }
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(failures: u32, successes: u32) -> HealthConfig {
        HealthConfig {
            failure_threshold: failures,
            success_threshold: successes,
            ..HealthConfig::default()
        }
    }

    #[test]
    fn defaults_match_smg() {
        let c = HealthConfig::default();
        assert_eq!(c.endpoint, "/health");
        assert_eq!(c.interval, Duration::from_secs(60));
        assert_eq!(c.timeout, Duration::from_secs(5));
        assert_eq!((c.failure_threshold, c.success_threshold), (3, 2));
        assert!(!c.disabled);
    }

    #[test]
    fn healthy_to_unhealthy_after_exactly_failure_threshold() {
        let c = config(3, 2);
        let mut t = HealthTracker::new_healthy();
        assert_eq!(t.record(ProbeOutcome::Failure, &c), None);
        assert_eq!(t.record(ProbeOutcome::Failure, &c), None);
        assert!(t.is_healthy());
        assert_eq!(
            t.record(ProbeOutcome::Failure, &c),
            Some(HealthTransition::BecameUnhealthy)
        );
        assert!(!t.is_healthy());
        // Further failures change nothing.
        assert_eq!(t.record(ProbeOutcome::Failure, &c), None);
        assert!(!t.is_healthy());
    }

    #[test]
    fn a_success_resets_the_failure_streak() {
        let c = config(3, 2);
        let mut t = HealthTracker::new_healthy();
        t.record(ProbeOutcome::Failure, &c);
        t.record(ProbeOutcome::Failure, &c);
        t.record(ProbeOutcome::Success, &c);
        assert_eq!(t.consecutive_failures(), 0);
        t.record(ProbeOutcome::Failure, &c);
        t.record(ProbeOutcome::Failure, &c);
        assert!(t.is_healthy());
    }

    #[test]
    fn unhealthy_to_healthy_after_exactly_success_threshold() {
        let c = config(1, 2);
        let mut t = HealthTracker::new_healthy();
        assert_eq!(
            t.record(ProbeOutcome::Failure, &c),
            Some(HealthTransition::BecameUnhealthy)
        );
        assert_eq!(t.record(ProbeOutcome::Success, &c), None);
        assert!(!t.is_healthy());
        assert_eq!(
            t.record(ProbeOutcome::Success, &c),
            Some(HealthTransition::BecameHealthy)
        );
        assert!(t.is_healthy());
    }

    #[test]
    fn a_failure_resets_the_success_streak_while_unhealthy() {
        let c = config(1, 2);
        let mut t = HealthTracker::new_healthy();
        t.record(ProbeOutcome::Failure, &c);
        t.record(ProbeOutcome::Success, &c);
        t.record(ProbeOutcome::Failure, &c);
        assert_eq!(t.consecutive_successes(), 0);
        assert_eq!(t.record(ProbeOutcome::Success, &c), None);
        assert!(!t.is_healthy());
    }

    #[test]
    fn zero_thresholds_act_as_one() {
        let c = config(0, 0);
        let mut t = HealthTracker::new_healthy();
        assert_eq!(
            t.record(ProbeOutcome::Failure, &c),
            Some(HealthTransition::BecameUnhealthy)
        );
        assert_eq!(
            t.record(ProbeOutcome::Success, &c),
            Some(HealthTransition::BecameHealthy)
        );
    }

    #[test]
    fn status_classification() {
        assert_eq!(ProbeOutcome::from_status(200), ProbeOutcome::Success);
        assert_eq!(ProbeOutcome::from_status(204), ProbeOutcome::Success);
        for s in [0, 101, 301, 404, 500, 503] {
            assert_eq!(ProbeOutcome::from_status(s), ProbeOutcome::Failure);
        }
    }
}
