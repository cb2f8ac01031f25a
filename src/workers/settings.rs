//! The worker flags (health checks, circuit breaker, retries, overload protection, load
//! monitoring, admin key) with SMG's names and defaults, and their validation.
//!
//! Owns [`WorkerArgs`] (a clap `Args` struct the gateway flattens into its command line) and
//! [`WorkerSettings`] (the validated settings the control core and data cores use). A bad value
//! is a [`FlagError`] naming the flag, so `kvgate` exits with one clear line.

use std::time::Duration;

use clap::Args;

use super::admin::AdminAccess;
use super::breaker::BreakerConfig;
use super::health::HealthConfig;
use super::load::OverloadConfig;
use super::retry::RetryConfig;
use crate::error::FlagError;
use crate::limits::{LOAD_POLL_TIMEOUT, RETRIES_MAX};

/// The longest interval or timeout accepted, in seconds (one day): beyond it a typo, not intent.
pub const INTERVAL_SECS_MAX: u64 = 86_400;

/// The largest backoff accepted, in ms (10 minutes): a longer wait outlives any client.
pub const BACKOFF_MS_MAX: u64 = 600_000;

/// The largest consecutive-outcome threshold accepted: a breaker or health check that needs
/// more than this many events never reacts.
pub const THRESHOLD_MAX: u32 = 10_000;

/// The load-monitoring and overload flags (SMG's "Load Monitoring").
#[derive(Args, Debug, Clone, PartialEq)]
pub struct LoadArgs {
    /// Seconds between load polls of every worker.
    #[arg(help_heading = "Load Monitoring", long, default_value_t = 10)]
    pub load_monitor_interval: u64,
    /// Poll worker loads only when something reads them: a load-aware policy (cache_aware,
    /// least_load, power_of_two) or overload protection. Without it every worker is polled.
    #[arg(help_heading = "Load Monitoring", long)]
    pub disable_load_monitoring: bool,

    /// Exclude a worker from routing while its reported KV usage is at or above this fraction.
    #[arg(help_heading = "Load Monitoring", long)]
    pub worker_overload_token_usage: Option<f64>,
    /// Exclude a worker from routing while it reports at least this many waiting requests.
    #[arg(help_heading = "Load Monitoring", long)]
    pub worker_overload_waiting_requests: Option<u64>,
    /// Turn overload protection on with SMG's default threshold: KV usage 0.9 unless
    /// --worker-overload-token-usage says otherwise (either threshold alone turns it on too).
    #[arg(help_heading = "Load Monitoring", long)]
    pub worker_overload_protection: bool,
}

/// The retry, circuit-breaker and health-check flags (SMG's headings, in its order).
#[derive(Args, Debug, Clone, PartialEq)]
pub struct ResilienceArgs {
    /// Retries after the first attempt, each on another worker when one is eligible.
    #[arg(help_heading = "Retry Configuration", long, default_value_t = 5)]
    pub retry_max_retries: u32,
    /// Backoff before the first retry, in milliseconds.
    #[arg(help_heading = "Retry Configuration", long, default_value_t = 50)]
    pub retry_initial_backoff_ms: u64,
    /// Largest backoff, in milliseconds.
    #[arg(help_heading = "Retry Configuration", long, default_value_t = 30_000)]
    pub retry_max_backoff_ms: u64,
    /// Backoff growth per retry.
    #[arg(help_heading = "Retry Configuration", long, default_value_t = 1.5)]
    pub retry_backoff_multiplier: f64,
    /// Relative jitter applied to each backoff (0 to 1).
    #[arg(help_heading = "Retry Configuration", long, default_value_t = 0.2)]
    pub retry_jitter_factor: f64,
    /// Never retry.
    #[arg(help_heading = "Retry Configuration", long)]
    pub disable_retries: bool,

    /// Failures within the window that open a worker's circuit.
    #[arg(help_heading = "Circuit Breaker", long, default_value_t = 10)]
    pub cb_failure_threshold: u32,
    /// Successes in half-open that close the circuit.
    #[arg(help_heading = "Circuit Breaker", long, default_value_t = 3)]
    pub cb_success_threshold: u32,
    /// Seconds an open circuit waits before letting trial traffic through.
    #[arg(help_heading = "Circuit Breaker", long, default_value_t = 60)]
    pub cb_timeout_duration_secs: u64,
    /// Seconds within which failures count toward opening the circuit.
    #[arg(help_heading = "Circuit Breaker", long, default_value_t = 120)]
    pub cb_window_duration_secs: u64,
    /// Never open circuits.
    #[arg(help_heading = "Circuit Breaker", long)]
    pub disable_circuit_breaker: bool,

    /// Path probed on each worker by health checks.
    #[arg(help_heading = "Health Checks", long, default_value = "/health")]
    pub health_check_endpoint: String,
    /// Seconds between health-check rounds.
    #[arg(help_heading = "Health Checks", long, default_value_t = 60)]
    pub health_check_interval_secs: u64,
    /// Seconds before a health probe counts as failed.
    #[arg(help_heading = "Health Checks", long, default_value_t = 5)]
    pub health_check_timeout_secs: u64,
    /// Consecutive failed probes that mark a worker unhealthy.
    #[arg(help_heading = "Health Checks", long, default_value_t = 3)]
    pub health_failure_threshold: u32,
    /// Consecutive good probes that mark an unhealthy worker healthy again.
    #[arg(help_heading = "Health Checks", long, default_value_t = 2)]
    pub health_success_threshold: u32,
    /// Do not run health checks; every worker stays healthy.
    #[arg(help_heading = "Health Checks", long)]
    pub disable_health_check: bool,
}

/// The admin API's flags (SMG's "Control Plane Authentication").
#[derive(Args, Debug, Clone, PartialEq)]
pub struct AdminArgs {
    /// Bearer token required by the admin API (`/workers`). Without it (or
    /// --admin-api-insecure) the admin API answers 403 to every call.
    #[arg(help_heading = "Control Plane Authentication", long)]
    pub admin_api_key: Option<String>,
    /// Open the admin API (`/workers`) to anyone who reaches the main port, without a key: for
    /// a trusted network or a test only.
    #[arg(
        help_heading = "Control Plane Authentication",
        long,
        conflicts_with = "admin_api_key"
    )]
    pub admin_api_insecure: bool,
}

/// Every worker flag: the three groups the command line shows under SMG's headings, apart
/// (`config::Cli` flattens each where SMG lists it), validated together.
#[derive(Args, Debug, Clone, PartialEq)]
pub struct WorkerArgs {
    /// Load monitoring and overload protection.
    #[command(flatten)]
    pub load: LoadArgs,
    /// Retries, circuit breaker, health checks.
    #[command(flatten)]
    pub resilience: ResilienceArgs,
    /// The admin API's access.
    #[command(flatten)]
    pub admin: AdminArgs,
}

impl Default for WorkerArgs {
    fn default() -> Self {
        use clap::Parser;
        #[derive(Parser)]
        struct Wrapper {
            #[command(flatten)]
            args: WorkerArgs,
        }
        // Parsing no arguments applies the declared defaults; it cannot fail.
        Wrapper::try_parse_from(["kvgate"]).map_or_else(|_| unreachable_defaults(), |w| w.args)
    }
}

/// Never reached (an empty command line always parses); kept total instead of panicking.
fn unreachable_defaults() -> WorkerArgs {
    WorkerArgs {
        load: LoadArgs {
            load_monitor_interval: 10,
            disable_load_monitoring: false,
            worker_overload_token_usage: None,
            worker_overload_waiting_requests: None,
            worker_overload_protection: false,
        },
        resilience: ResilienceArgs {
            health_check_endpoint: "/health".into(),
            health_check_interval_secs: 60,
            health_check_timeout_secs: 5,
            health_failure_threshold: 3,
            health_success_threshold: 2,
            disable_health_check: false,
            cb_failure_threshold: 10,
            cb_success_threshold: 3,
            cb_timeout_duration_secs: 60,
            cb_window_duration_secs: 120,
            disable_circuit_breaker: false,
            retry_max_retries: 5,
            retry_initial_backoff_ms: 50,
            retry_max_backoff_ms: 30_000,
            retry_backoff_multiplier: 1.5,
            retry_jitter_factor: 0.2,
            disable_retries: false,
        },
        admin: AdminArgs {
            admin_api_key: None,
            admin_api_insecure: false,
        },
    }
}

fn bad(flag: &'static str, reason: impl Into<String>) -> FlagError {
    FlagError::new(flag, reason)
}

fn secs_in_range(flag: &'static str, v: u64) -> Result<Duration, FlagError> {
    if v == 0 || v > INTERVAL_SECS_MAX {
        return Err(bad(
            flag,
            format!("{v} must be between 1 and {INTERVAL_SECS_MAX} seconds"),
        ));
    }
    Ok(Duration::from_secs(v))
}

fn threshold(flag: &'static str, v: u32) -> Result<u32, FlagError> {
    if v == 0 || v > THRESHOLD_MAX {
        return Err(bad(
            flag,
            format!("{v} must be between 1 and {THRESHOLD_MAX}"),
        ));
    }
    Ok(v)
}

/// `--worker-overload-protection` alone: the KV usage above which a worker leaves routing
/// (SMG's default; usage means the same on every engine, a queue ceiling does not, so the
/// waiting-requests threshold has no default).
pub const OVERLOAD_TOKEN_USAGE_DEFAULT: f64 = 0.9;

/// Whether the routing policy reads the workers' load reports (SMG's load-aware policies).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PolicyLoads {
    /// cache_aware, least_load, power_of_two: polled whatever `--disable-load-monitoring` says.
    Read,
    /// The others.
    Ignored,
}

/// Whether the control core polls the workers' loads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LoadPolling {
    /// Every `--load-monitor-interval` (the default).
    On,
    /// `--disable-load-monitoring` and nothing reads them: no polls, no `smg_engine_*` gauges.
    Off,
}

/// The validated worker settings.
#[derive(Debug, Clone, PartialEq)]
pub struct WorkerSettings {
    /// Health checks.
    pub health: HealthConfig,
    /// Circuit breaker.
    pub breaker: BreakerConfig,
    /// Retries.
    pub retry: RetryConfig,
    /// Overload protection.
    pub overload: OverloadConfig,
    /// Time between load polls.
    pub load_interval: Duration,
    /// Whether loads are polled at all.
    pub load_polling: LoadPolling,
    /// Deadline of one load poll.
    pub load_timeout: Duration,
    /// Who may call the admin API.
    pub admin_access: AdminAccess,
}

impl WorkerArgs {
    /// Check every value and build the settings, for a policy that reads loads (the default).
    pub fn validate(&self) -> Result<WorkerSettings, FlagError> {
        self.validate_for(PolicyLoads::Read)
    }

    /// Check every value and build the settings for a policy that reads loads or not.
    pub fn validate_for(&self, policy: PolicyLoads) -> Result<WorkerSettings, FlagError> {
        let overload = self.validate_overload()?;
        let polls_needed = policy == PolicyLoads::Read || overload != OverloadConfig::default();
        let load_polling = if self.load.disable_load_monitoring && !polls_needed {
            LoadPolling::Off
        } else {
            LoadPolling::On
        };
        Ok(WorkerSettings {
            health: self.validate_health()?,
            breaker: self.validate_breaker()?,
            retry: self.validate_retry()?,
            overload,
            load_polling,
            load_interval: secs_in_range(
                "--load-monitor-interval",
                self.load.load_monitor_interval,
            )?,
            load_timeout: LOAD_POLL_TIMEOUT,
            admin_access: match &self.admin.admin_api_key {
                Some(k) if k.trim().is_empty() => {
                    return Err(bad("--admin-api-key", "must not be empty"))
                }
                Some(k) => AdminAccess::Bearer(k.clone()),
                None if self.admin.admin_api_insecure => AdminAccess::Open,
                None => AdminAccess::Closed,
            },
        })
    }

    fn validate_health(&self) -> Result<HealthConfig, FlagError> {
        let endpoint = &self.resilience.health_check_endpoint;
        let endpoint_ok = endpoint.starts_with('/')
            && endpoint.len() <= 1024
            && endpoint.bytes().all(|b| b.is_ascii_graphic());
        if !endpoint_ok {
            return Err(bad(
                "--health-check-endpoint",
                format!("{endpoint:?} must be a path starting with /"),
            ));
        }
        Ok(HealthConfig {
            endpoint: endpoint.clone(),
            interval: secs_in_range(
                "--health-check-interval-secs",
                self.resilience.health_check_interval_secs,
            )?,
            timeout: secs_in_range(
                "--health-check-timeout-secs",
                self.resilience.health_check_timeout_secs,
            )?,
            failure_threshold: threshold(
                "--health-failure-threshold",
                self.resilience.health_failure_threshold,
            )?,
            success_threshold: threshold(
                "--health-success-threshold",
                self.resilience.health_success_threshold,
            )?,
            disabled: self.resilience.disable_health_check,
        })
    }

    fn validate_breaker(&self) -> Result<BreakerConfig, FlagError> {
        Ok(BreakerConfig {
            failure_threshold: threshold(
                "--cb-failure-threshold",
                self.resilience.cb_failure_threshold,
            )?,
            success_threshold: threshold(
                "--cb-success-threshold",
                self.resilience.cb_success_threshold,
            )?,
            timeout: secs_in_range(
                "--cb-timeout-duration-secs",
                self.resilience.cb_timeout_duration_secs,
            )?,
            window: secs_in_range(
                "--cb-window-duration-secs",
                self.resilience.cb_window_duration_secs,
            )?,
            disabled: self.resilience.disable_circuit_breaker,
        })
    }

    fn validate_retry(&self) -> Result<RetryConfig, FlagError> {
        if self.resilience.retry_max_retries as usize > RETRIES_MAX {
            return Err(bad(
                "--retry-max-retries",
                format!(
                    "{} is above the maximum {RETRIES_MAX}",
                    self.resilience.retry_max_retries
                ),
            ));
        }
        for (flag, ms) in [
            (
                "--retry-initial-backoff-ms",
                self.resilience.retry_initial_backoff_ms,
            ),
            (
                "--retry-max-backoff-ms",
                self.resilience.retry_max_backoff_ms,
            ),
        ] {
            if ms > BACKOFF_MS_MAX {
                return Err(bad(
                    flag,
                    format!("{ms} is above the maximum {BACKOFF_MS_MAX} ms"),
                ));
            }
        }
        if self.resilience.retry_initial_backoff_ms > self.resilience.retry_max_backoff_ms {
            return Err(bad(
                "--retry-initial-backoff-ms",
                "must not exceed --retry-max-backoff-ms",
            ));
        }
        let m = self.resilience.retry_backoff_multiplier;
        if !m.is_finite() || !(1.0..=100.0).contains(&m) {
            return Err(bad(
                "--retry-backoff-multiplier",
                format!("{m} must be between 1 and 100"),
            ));
        }
        let j = self.resilience.retry_jitter_factor;
        if !j.is_finite() || !(0.0..=1.0).contains(&j) {
            return Err(bad(
                "--retry-jitter-factor",
                format!("{j} must be between 0 and 1"),
            ));
        }
        Ok(RetryConfig {
            max_retries: self.resilience.retry_max_retries,
            initial_backoff: Duration::from_millis(self.resilience.retry_initial_backoff_ms),
            max_backoff: Duration::from_millis(self.resilience.retry_max_backoff_ms),
            backoff_multiplier: m,
            jitter_factor: j,
            disabled: self.resilience.disable_retries,
        })
    }

    fn validate_overload(&self) -> Result<OverloadConfig, FlagError> {
        if let Some(u) = self.load.worker_overload_token_usage {
            if !u.is_finite() || u <= 0.0 || u > 1.0 {
                return Err(bad(
                    "--worker-overload-token-usage",
                    format!("{u} must be in (0, 1]"),
                ));
            }
        }
        if self.load.worker_overload_waiting_requests == Some(0) {
            // At or above 0 would exclude every worker that reports a queue.
            return Err(bad(
                "--worker-overload-waiting-requests",
                "0 must be at least 1",
            ));
        }
        let default_usage =
            (self.load.worker_overload_protection).then_some(OVERLOAD_TOKEN_USAGE_DEFAULT);
        Ok(OverloadConfig {
            token_usage: self.load.worker_overload_token_usage.or(default_usage),
            waiting_requests: self.load.worker_overload_waiting_requests,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::{CommandFactory, Parser};

    #[derive(Parser, Debug)]
    struct Cli {
        #[command(flatten)]
        workers: WorkerArgs,
    }

    fn parse(extra: &[&str]) -> WorkerArgs {
        let mut argv = vec!["kvgate"];
        argv.extend_from_slice(extra);
        Cli::try_parse_from(argv).unwrap().workers
    }

    #[test]
    fn clap_definition_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn defaults_are_smgs() {
        let c = WorkerArgs::default().validate().unwrap();
        assert_eq!(c.health, HealthConfig::default());
        assert_eq!(c.breaker, BreakerConfig::default());
        assert_eq!(c.retry, RetryConfig::default());
        assert_eq!(c.overload, OverloadConfig::default());
        assert_eq!(c.load_interval, Duration::from_secs(10));
        assert_eq!(c.load_timeout, Duration::from_secs(5));
        assert_eq!(c.admin_access, AdminAccess::Closed);
        assert_eq!(WorkerArgs::default(), unreachable_defaults());
    }

    #[test]
    fn flags_parse_into_config() {
        let c = parse(&[
            "--health-check-endpoint",
            "/ready",
            "--health-check-interval-secs",
            "2",
            "--health-failure-threshold",
            "1",
            "--disable-health-check",
            "--cb-failure-threshold",
            "4",
            "--cb-timeout-duration-secs",
            "7",
            "--retry-max-retries",
            "2",
            "--retry-initial-backoff-ms",
            "10",
            "--retry-max-backoff-ms",
            "40",
            "--retry-backoff-multiplier",
            "2",
            "--retry-jitter-factor",
            "0",
            "--disable-retries",
            "--worker-overload-token-usage",
            "0.9",
            "--worker-overload-waiting-requests",
            "50",
            "--load-monitor-interval",
            "1",
            "--admin-api-key",
            "k",
        ])
        .validate()
        .unwrap();
        assert_eq!(c.health.endpoint, "/ready");
        assert_eq!(c.health.interval, Duration::from_secs(2));
        assert_eq!(c.health.failure_threshold, 1);
        assert!(c.health.disabled);
        assert_eq!(c.breaker.failure_threshold, 4);
        assert_eq!(c.breaker.timeout, Duration::from_secs(7));
        assert_eq!(c.retry.max_retries, 2);
        assert_eq!(c.retry.backoff(1, 0.5), Duration::from_millis(20));
        assert!(c.retry.disabled);
        assert_eq!(c.overload.token_usage, Some(0.9));
        assert_eq!(c.overload.waiting_requests, Some(50));
        assert_eq!(c.load_interval, Duration::from_secs(1));
        assert_eq!(c.admin_access, AdminAccess::Bearer("k".into()));
        let open = parse(&["--admin-api-insecure"]).validate().unwrap();
        assert_eq!(open.admin_access, AdminAccess::Open);
        let both = ["kvgate", "--admin-api-key", "k", "--admin-api-insecure"];
        assert!(Cli::try_parse_from(both).is_err(), "the two flags conflict");
    }

    #[test]
    fn overload_protection_alone_applies_the_default_usage_threshold() {
        let on = parse(&["--worker-overload-protection"]).validate().unwrap();
        assert_eq!(on.overload.token_usage, Some(OVERLOAD_TOKEN_USAGE_DEFAULT));
        assert_eq!(on.overload.waiting_requests, None);
        let explicit = [
            "--worker-overload-protection",
            "--worker-overload-token-usage",
            "0.5",
        ];
        let c = parse(&explicit).validate().unwrap();
        assert_eq!(c.overload.token_usage, Some(0.5));
        assert_eq!(
            WorkerArgs::default()
                .validate()
                .unwrap()
                .overload
                .token_usage,
            None
        );
        // The effect: a worker at 95% KV usage leaves routing only with the flag.
        let full = crate::workers::load::LoadReport {
            token_usage: Some(0.95),
            ..Default::default()
        };
        assert!(on.overload.is_overloaded(Some(&full)));
        let default = WorkerArgs::default().validate().unwrap();
        assert!(!default.overload.is_overloaded(Some(&full)));
    }

    #[test]
    fn load_monitoring_stops_only_when_nothing_reads_the_loads() {
        let off = parse(&["--disable-load-monitoring"]);
        let polling = |args: &WorkerArgs, policy| args.validate_for(policy).unwrap().load_polling;
        assert_eq!(polling(&off, PolicyLoads::Ignored), LoadPolling::Off);
        assert_eq!(polling(&off, PolicyLoads::Read), LoadPolling::On);
        let guarded = parse(&["--disable-load-monitoring", "--worker-overload-protection"]);
        assert_eq!(polling(&guarded, PolicyLoads::Ignored), LoadPolling::On);
        let default = WorkerArgs::default();
        assert_eq!(polling(&default, PolicyLoads::Ignored), LoadPolling::On);
    }

    #[test]
    fn bad_values_name_their_flag() {
        let cases: &[(&[&str], &str)] = &[
            (
                &["--health-check-endpoint", "health"],
                "health-check-endpoint",
            ),
            (
                &["--health-check-interval-secs", "0"],
                "health-check-interval-secs",
            ),
            (
                &["--health-check-timeout-secs", "0"],
                "health-check-timeout-secs",
            ),
            (
                &["--health-failure-threshold", "0"],
                "health-failure-threshold",
            ),
            (
                &["--health-success-threshold", "0"],
                "health-success-threshold",
            ),
            (&["--cb-failure-threshold", "0"], "cb-failure-threshold"),
            (&["--cb-success-threshold", "0"], "cb-success-threshold"),
            (
                &["--cb-timeout-duration-secs", "0"],
                "cb-timeout-duration-secs",
            ),
            (
                &["--cb-window-duration-secs", "999999"],
                "cb-window-duration-secs",
            ),
            (&["--retry-max-retries", "33"], "retry-max-retries"),
            (
                &[
                    "--retry-initial-backoff-ms",
                    "500",
                    "--retry-max-backoff-ms",
                    "100",
                ],
                "retry-initial-backoff-ms",
            ),
            (
                &["--retry-max-backoff-ms", "999999999"],
                "retry-max-backoff-ms",
            ),
            (
                &["--retry-backoff-multiplier", "0.5"],
                "retry-backoff-multiplier",
            ),
            (
                &["--retry-backoff-multiplier", "NaN"],
                "retry-backoff-multiplier",
            ),
            (&["--retry-jitter-factor", "1.5"], "retry-jitter-factor"),
            (
                &["--worker-overload-token-usage", "0"],
                "worker-overload-token-usage",
            ),
            (
                &["--worker-overload-token-usage", "2"],
                "worker-overload-token-usage",
            ),
            (
                &["--worker-overload-waiting-requests", "0"],
                "worker-overload-waiting-requests",
            ),
            (&["--load-monitor-interval", "0"], "load-monitor-interval"),
            (&["--admin-api-key", " "], "admin-api-key"),
        ];
        for (argv, flag) in cases {
            let err = parse(argv).validate().unwrap_err();
            assert_eq!(err.flag, format!("--{flag}"), "{argv:?}");
            assert!(err
                .to_string()
                .starts_with(&format!("invalid value for --{flag}: ")));
        }
    }

    #[test]
    fn non_numbers_are_rejected_by_clap() {
        assert!(Cli::try_parse_from(["kvgate", "--cb-failure-threshold", "ten"]).is_err());
        assert!(Cli::try_parse_from(["kvgate", "--retry-max-retries", "-1"]).is_err());
    }
}
