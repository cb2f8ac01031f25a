//! The PD flags, SMG's names and defaults: `--pd-disaggregation`, `--prefill URL
//! [BOOTSTRAP_PORT|none]` and `--decode URL` (each repeatable), `--prefill-policy` and
//! `--decode-policy` (each falls back to `--policy`), and the three `--worker-startup-*` flags, which SMG lists under the same heading but
//! which govern every worker's registration. Owns [`PdArgs`] (flattened into `config::Cli`),
//! [`PdConfig`], [`WorkerStartup`] and [`Handshake`] (what `--backend` means in PD mode).

use std::time::Duration;

use clap::ArgAction;

use crate::error::FlagError;
use crate::limits::REQUEST_TIMEOUT_SECS_MAX;
use crate::policy::{PolicyConfig, PolicyKind};
use crate::workers::role::{parse_bootstrap_port, WorkerRole};

/// The handshake a PD pair speaks: `--backend` (in `config::Cli`, which the gRPC workers read
/// too) when given, else the engine the prefill worker's `/v1/models` names (`owned_by`, SMG's
/// detection), else SGLang's.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Handshake {
    /// SGLang: the request goes to both workers at once with bootstrap_host, bootstrap_port
    /// and bootstrap_room; the decode worker's answer is the client's.
    #[default]
    Sglang,
    /// vLLM: the prefill worker first (one output token, kv_transfer_params asking for a
    /// remote decode), then the decode worker with the kv_transfer_params it returned.
    Vllm,
}

impl Handshake {
    /// The handshake `--backend` names (`None`: not given, detected per worker).
    pub fn from_backend(backend: Option<&str>) -> Option<Handshake> {
        match backend? {
            "vllm" => Some(Handshake::Vllm),
            _ => Some(Handshake::Sglang),
        }
    }

    /// The handshake of the engine a `/v1/models` `owned_by` names, as SMG reads it
    /// (`sglang` or `nvidia`: SGLang; `vllm`: vLLM; anything else: not known).
    pub fn from_owner(owned_by: &str) -> Option<Handshake> {
        match owned_by {
            "sglang" | "nvidia" => Some(Handshake::Sglang),
            "vllm" => Some(Handshake::Vllm),
            _ => None,
        }
    }

    /// The handshake of a pair: `configured` (`--backend`) when given, else the prefill
    /// worker's engine (`owned_by`), else SGLang's (SMG's default for an HTTP worker it could
    /// not identify).
    pub fn of_pair(configured: Option<Handshake>, prefill_owner: Option<&str>) -> Handshake {
        configured
            .or_else(|| prefill_owner.and_then(Handshake::from_owner))
            .unwrap_or_default()
    }
}

/// The PD flags as clap parses them.
#[derive(Clone, Debug, Default, clap::Args)]
#[command(next_help_heading = "PD Disaggregation")]
pub struct PdArgs {
    /// Route each request to a prefill worker and a decode worker (--prefill, --decode)
    /// instead of one regular worker (--worker-urls).
    #[arg(long = "pd-disaggregation")]
    pub pd_disaggregation: bool,
    /// A prefill worker, optionally with its bootstrap port (SGLang's disaggregation bootstrap
    /// server) or none; repeat for each, e.g. --prefill http://p1:30001 9001 --prefill
    /// http://p2:30002.
    // clap keeps the values of every occurrence in one list: a port or none follows its URL,
    // and a URL is never one, so `PdArgs::workers` regroups them.
    #[arg(
        long,
        action = ArgAction::Append,
        num_args = 1..=2,
        value_names = ["URL", "BOOTSTRAP_PORT"],
    )]
    pub prefill: Vec<String>,
    /// A decode worker; repeat for each.
    #[arg(long, action = ArgAction::Append, value_name = "URL")]
    pub decode: Vec<String>,
    /// The policy choosing prefill workers (default: --policy). cache_aware routes on the
    /// prompt as in regular mode: the prefix cache lives on the prefill engines.
    #[arg(long = "prefill-policy", value_enum)]
    pub prefill_policy: Option<PolicyKind>,
    /// The policy choosing decode workers (default: --policy).
    #[arg(long = "decode-policy", value_enum)]
    pub decode_policy: Option<PolicyKind>,
    /// Seconds a worker's registration (POST /workers) keeps probing a starting worker before
    /// it refuses it (within the admin call's own 30 s wait).
    #[arg(long = "worker-startup-timeout-secs", default_value_t = 1800)]
    pub worker_startup_timeout_secs: u64,
    /// Seconds registration waits before its first probe, leaving a loading engine alone.
    #[arg(long = "worker-startup-delay", default_value_t = 0)]
    pub worker_startup_delay: u64,
    /// Seconds between two startup probes.
    #[arg(long = "worker-startup-check-interval", default_value_t = 30)]
    pub worker_startup_check_interval: u64,
}

/// The validated PD mode.
#[derive(Clone, Debug)]
pub struct PdConfig {
    /// The policy choosing prefill workers, with `--policy`'s knobs.
    pub prefill: PolicyConfig,
    /// The policy choosing decode workers, with `--policy`'s knobs.
    pub decode: PolicyConfig,
    /// The engines' handshake as `--backend` names it (`None`: detected per prefill worker,
    /// `Handshake::of_pair`).
    pub handshake: Option<Handshake>,
}

/// How a worker's registration waits for it to start (`--worker-startup-*`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WorkerStartup {
    /// How long registration keeps probing.
    pub timeout: Duration,
    /// The wait before the first probe.
    pub delay: Duration,
    /// The wait between two probes.
    pub check_interval: Duration,
}

/// One `--prefill` or `--decode` worker: its URL and role.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PdWorker {
    /// The URL as given.
    pub url: String,
    /// Prefill (with its bootstrap port) or decode.
    pub role: WorkerRole,
    /// The flag it came from, for errors.
    pub flag: &'static str,
    /// A `--prefill` URL whose bootstrap port may still follow.
    port_open: bool,
}

impl PdArgs {
    /// The `--worker-startup-*` settings: the timeout and the interval above 0 (SMG's rule).
    pub fn worker_startup(&self) -> Result<WorkerStartup, FlagError> {
        let secs = |flag: &'static str, secs: u64, min: u64| {
            if secs < min || secs > REQUEST_TIMEOUT_SECS_MAX {
                let message = format!("must be {min}..={REQUEST_TIMEOUT_SECS_MAX} seconds");
                return Err(FlagError::new(flag, message));
            }
            Ok(Duration::from_secs(secs))
        };
        Ok(WorkerStartup {
            timeout: secs(
                "--worker-startup-timeout-secs",
                self.worker_startup_timeout_secs,
                1,
            )?,
            delay: secs("--worker-startup-delay", self.worker_startup_delay, 0)?,
            check_interval: secs(
                "--worker-startup-check-interval",
                self.worker_startup_check_interval,
                1,
            )?,
        })
    }

    /// The `--prefill` and `--decode` workers, prefill first, in flag order.
    pub fn workers(&self) -> Result<Vec<PdWorker>, FlagError> {
        let mut workers: Vec<PdWorker> = Vec::with_capacity(self.prefill.len() + self.decode.len());
        for text in &self.prefill {
            let port = parse_bootstrap_port(text);
            let last = workers.last_mut().filter(|w| w.port_open);
            match (last, port) {
                (Some(last), Ok(bootstrap_port)) => {
                    last.role = WorkerRole::Prefill { bootstrap_port };
                    last.port_open = false;
                }
                (None, Ok(_)) => {
                    let message = format!("{text} is a bootstrap port with no URL before it");
                    return Err(FlagError::new("--prefill", message));
                }
                (_, Err(_)) if !text.contains("://") => {
                    let message = format!(
                        "{text:?} is neither a worker URL nor a bootstrap port (1-65535) or none"
                    );
                    return Err(FlagError::new("--prefill", message));
                }
                (_, Err(_)) => workers.push(PdWorker {
                    url: text.clone(),
                    role: WorkerRole::Prefill {
                        bootstrap_port: None,
                    },
                    flag: "--prefill",
                    port_open: true,
                }),
            }
        }
        for url in &self.decode {
            workers.push(PdWorker {
                url: url.clone(),
                role: WorkerRole::Decode,
                flag: "--decode",
                port_open: false,
            });
        }
        Ok(workers)
    }

    /// The PD mode (`None` without `--pd-disaggregation`), each side's policy falling back to
    /// `policy`'s. SMG's compatibility rule: a side given `power_of_two` explicitly needs two
    /// of its workers on the command line.
    pub fn config(
        &self,
        policy: &PolicyConfig,
        handshake: Option<Handshake>,
    ) -> Result<Option<PdConfig>, FlagError> {
        if !self.pd_disaggregation {
            return Ok(None);
        }
        let side = |chosen: Option<PolicyKind>| PolicyConfig {
            kind: chosen.unwrap_or(policy.kind),
            ..policy.clone()
        };
        let (prefill, decode) = (side(self.prefill_policy), side(self.decode_policy));
        for (flag, chosen, count) in [
            ("--prefill-policy", self.prefill_policy, self.prefill_urls()),
            ("--decode-policy", self.decode_policy, self.decode.len()),
        ] {
            if chosen == Some(PolicyKind::PowerOfTwo) && count < 2 {
                let message = format!(
                    "power_of_two needs at least 2 of its workers ({count} given with {})",
                    &flag[..flag.len() - "-policy".len()]
                );
                return Err(FlagError::new(flag, message));
            }
        }
        Ok(Some(PdConfig {
            prefill,
            decode,
            handshake,
        }))
    }

    /// How many `--prefill` URLs were given (the values without their ports).
    fn prefill_urls(&self) -> usize {
        self.prefill.iter().filter(|v| v.contains("://")).count()
    }

    /// The PD flags given without `--pd-disaggregation`, which then does not use them (SMG
    /// ignores them too): said once in the log at start.
    pub fn unused_in_regular_mode(&self) -> Vec<&'static str> {
        let given = [
            ("--prefill", !self.prefill.is_empty()),
            ("--decode", !self.decode.is_empty()),
            ("--prefill-policy", self.prefill_policy.is_some()),
            ("--decode-policy", self.decode_policy.is_some()),
        ];
        match self.pd_disaggregation {
            true => Vec::new(),
            false => given.iter().filter(|(_, g)| *g).map(|(f, _)| *f).collect(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_backend_flag_wins_then_the_prefill_engines_owner_then_sglang() {
        let (vllm, sglang) = (Some(Handshake::Vllm), Some(Handshake::Sglang));
        assert_eq!(Handshake::from_backend(Some("vllm")), vllm);
        assert_eq!(Handshake::from_backend(Some("sglang")), sglang);
        assert_eq!(Handshake::from_backend(None), None);
        assert_eq!(Handshake::of_pair(sglang, Some("vllm")), Handshake::Sglang);
        assert_eq!(Handshake::of_pair(None, Some("vllm")), Handshake::Vllm);
        assert_eq!(Handshake::of_pair(None, Some("nvidia")), Handshake::Sglang);
        assert_eq!(Handshake::of_pair(vllm, Some("sglang")), Handshake::Vllm);
        assert_eq!(
            Handshake::of_pair(None, Some("sim-engine")),
            Handshake::Sglang
        );
        assert_eq!(Handshake::of_pair(None, None), Handshake::Sglang);
    }
}
