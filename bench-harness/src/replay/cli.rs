//! The command line: clap types ([`Cli`]) and their checked conversion into [`ReplayOptions`] and
//! [`CompareOptions`]. Errors name the flag to change.

use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Parser, Subcommand, ValueEnum};

use super::compare::{sibling_binary, validate_policies, CompareOptions};
use super::form::{FormOptions, RequestForm, TenantOptions};
use super::limits::CONCURRENCY_MAX;
use super::pacing::Pacing;
use super::progress::ProgressMode;
use super::run::{ReplayOptions, Source};
use super::synthetic::{Popularity, SyntheticSpec};
use super::trace::TraceFormat;

/// Replays LLM request traces or generated shared-prefix workloads through a gateway and reports
/// cache hit rate, TTFT / ITL / end-to-end latency, throughput and load imbalance.
#[derive(Debug, Parser)]
#[command(name = "replay", version, args_conflicts_with_subcommands = true)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Option<Command>,
    #[command(flatten)]
    pub replay: ReplayArgs,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Start a sim-engine fleet and one kvgate per policy, replay the same workload through each,
    /// and print the results side by side.
    Compare(CompareArgs),
}

/// `replay --gateway URL ...`
#[derive(Debug, Args)]
pub struct ReplayArgs {
    /// The gateway (or engine) to send requests to, e.g. http://127.0.0.1:30000.
    #[arg(long)]
    pub gateway: Option<String>,
    #[command(flatten)]
    pub workload: WorkloadArgs,
    /// Write the JSON report here.
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// Write the SVG plot here (default: the --out path with .svg).
    #[arg(long)]
    pub plot: Option<PathBuf>,
}

/// `replay compare ...`
#[derive(Debug, Args)]
pub struct CompareArgs {
    #[command(flatten)]
    pub workload: WorkloadArgs,
    /// Policies to compare, comma-separated: kvgate --policy names, `cache_aware:hash`
    /// (cache_aware with --cache-index hash; its --cache-boundaries go in --gateway-args), and
    /// `direct` (no gateway).
    #[arg(long, value_delimiter = ',', default_value = "round_robin,cache_aware")]
    pub policies: Vec<String>,
    /// Simulated engines per fleet.
    #[arg(long, default_value_t = 4)]
    pub engines: u16,
    /// The sim-engine binary (default: next to this executable).
    #[arg(long)]
    pub sim_engine: Option<PathBuf>,
    /// The kvgate binary (default: next to this executable).
    #[arg(long)]
    pub kvgate: Option<PathBuf>,
    /// An extra sim-engine flag, e.g. --sim-arg=--page-size=32 (repeatable; not one set above).
    #[arg(long = "sim-arg", allow_hyphen_values = true)]
    pub sim_args: Vec<String>,
    /// An extra kvgate flag (repeatable).
    #[arg(long = "gateway-arg", allow_hyphen_values = true)]
    pub gateway_args: Vec<String>,
    /// KV cache capacity of each simulated engine, in tokens (sim-engine --kv-capacity-tokens).
    /// Smaller than the workload's shared prefixes so that where requests go matters.
    #[arg(long, default_value_t = 32_768)]
    pub kv_capacity_tokens: u64,
    /// Simulated time runs this many times faster than real time (sim-engine --speedup).
    #[arg(long, default_value_t = 5.0)]
    pub sim_speedup: f64,
    /// Directory for the children's logs.
    #[arg(long)]
    pub log_dir: Option<PathBuf>,
    /// Write the combined JSON report here.
    #[arg(long, default_value = "replay-compare.json")]
    pub out: PathBuf,
    /// Write the combined SVG plot here.
    #[arg(long, default_value = "replay-compare.svg")]
    pub plot: PathBuf,
}

/// Group popularity of the generator.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum PopularityArg {
    Uniform,
    Zipf,
}

/// Trace formats as flag values.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum TraceFormatArg {
    Mooncake,
    Azure,
}

/// What to send and how fast (shared by replay and compare).
#[derive(Clone, Debug, Args)]
pub struct WorkloadArgs {
    /// A trace file: Mooncake JSONL (.jsonl) or Azure CSV (.csv).
    #[arg(long, conflicts_with = "synthetic")]
    pub trace: Option<PathBuf>,
    /// The trace's format, when its extension does not say.
    #[arg(long, requires = "trace")]
    pub trace_format: Option<TraceFormatArg>,
    /// Generate a shared-prefix workload instead of reading a trace.
    #[arg(long)]
    pub synthetic: bool,
    /// Generator: groups (distinct system prompts).
    #[arg(long, default_value_t = 32)]
    pub groups: u32,
    /// Generator: conversations per group.
    #[arg(long, default_value_t = 8)]
    pub prompts_per_group: u32,
    /// Generator: system prompt length in tokens.
    #[arg(long, default_value_t = 2048)]
    pub system_prompt_len: u32,
    /// Generator: question length in tokens (per turn).
    #[arg(long, default_value_t = 128)]
    pub question_len: u32,
    /// Generator: output length in tokens (also the answer kept in later turns).
    #[arg(long, default_value_t = 32)]
    pub output_len: u32,
    /// Generator: how requests spread over groups.
    #[arg(long, value_enum, default_value_t = PopularityArg::Uniform)]
    pub popularity: PopularityArg,
    /// Generator: Zipf exponent (with --popularity zipf).
    #[arg(long, default_value_t = 1.0)]
    pub zipf_exponent: f64,
    /// Generator: turns per conversation (1 = single-turn).
    #[arg(long, default_value_t = 1)]
    pub turns: u32,
    /// Seed of the generator and of Poisson arrivals.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Pace by the trace's timestamps divided by this factor (default for traces: 1).
    #[arg(long, conflicts_with_all = ["rate", "concurrency"])]
    pub speedup: Option<f64>,
    /// Poisson arrivals at this many requests per second.
    #[arg(long, conflicts_with = "concurrency")]
    pub rate: Option<f64>,
    /// Closed loop: keep this many requests in flight (default for --synthetic: 8).
    #[arg(long)]
    pub concurrency: Option<usize>,
    /// Stop after this many requests.
    #[arg(long)]
    pub max_requests: Option<u64>,
    /// Repeat the trace (fresh content and ids per pass) until --max-requests.
    #[arg(long = "loop", requires = "max_requests")]
    pub repeat: bool,
    /// Request shape.
    #[arg(long, value_enum, default_value_t = RequestForm::Chat)]
    pub form: RequestForm,
    /// The model name sent in OpenAI-style bodies (sim-engine serves `sim-model`; `compare`
    /// starts its engines with this name).
    #[arg(long, default_value = "sim-model")]
    pub model: String,
    /// Spread requests over this many tenants (0 = none); see --tenant-salt and --tenant-lora.
    #[arg(long, default_value_t = 0)]
    pub tenants: u32,
    /// Give each tenant its own cache_salt.
    #[arg(long)]
    pub tenant_salt: bool,
    /// Give each tenant its own LoRA adapter (lora_path).
    #[arg(long)]
    pub tenant_lora: bool,
    /// Per-request timeout in seconds.
    #[arg(long, default_value_t = 600.0)]
    pub timeout_s: f64,
    /// Cap every request's output length at this many tokens (fewer streamed tokens per request).
    #[arg(long)]
    pub output_cap: Option<u32>,
    /// Sample this process's resident memory (e.g. the gateway's) at 10%, 50% and 100% of the run.
    #[arg(long)]
    pub watch_pid: Option<u32>,
    /// No progress output on stderr.
    #[arg(long)]
    pub no_progress: bool,
}

impl WorkloadArgs {
    fn source(&self) -> Result<Source, String> {
        if let Some(path) = &self.trace {
            let format = match self.trace_format {
                Some(TraceFormatArg::Mooncake) => TraceFormat::Mooncake,
                Some(TraceFormatArg::Azure) => TraceFormat::Azure,
                None => TraceFormat::from_path(path).ok_or_else(|| {
                    format!("--trace {}: cannot tell the format from the extension; pass --trace-format", path.display())
                })?,
            };
            return Ok(Source::Trace {
                path: path.clone(),
                format,
                repeat: self.repeat,
            });
        }
        if !self.synthetic {
            return Err("give a workload: --trace PATH or --synthetic".into());
        }
        if self.repeat {
            return Err("--loop repeats a trace; --synthetic takes --max-requests instead".into());
        }
        let popularity = match self.popularity {
            PopularityArg::Uniform => Popularity::Uniform,
            PopularityArg::Zipf => Popularity::Zipf {
                exponent: self.zipf_exponent,
            },
        };
        let spec = SyntheticSpec {
            groups: self.groups,
            prompts_per_group: self.prompts_per_group,
            system_prompt_tokens: self.system_prompt_len,
            question_tokens: self.question_len,
            output_tokens: self.output_len,
            popularity,
            turns: self.turns,
            seed: self.seed,
            requests: self.max_requests,
        };
        spec.validate()?;
        Ok(Source::Synthetic(spec))
    }

    fn pacing(&self, source: &Source) -> Result<Pacing, String> {
        let is_trace = matches!(source, Source::Trace { .. });
        match (self.speedup, self.rate, self.concurrency) {
            (Some(speedup), _, _) if !(speedup.is_finite() && speedup > 0.0) => {
                Err("--speedup must be above 0".into())
            }
            (Some(_), _, _) if !is_trace => Err(
                "--speedup paces by trace timestamps: use --rate or --concurrency with --synthetic"
                    .into(),
            ),
            (Some(speedup), _, _) => Ok(Pacing::Trace { speedup }),
            (_, Some(rate), _) if !(rate.is_finite() && rate > 0.0) => {
                Err("--rate must be above 0".into())
            }
            (_, Some(rate_per_s), _) => Ok(Pacing::Poisson {
                rate_per_s,
                seed: self.seed,
            }),
            (_, _, Some(c)) if c == 0 || c > CONCURRENCY_MAX => Err(format!(
                "--concurrency must be between 1 and {CONCURRENCY_MAX}"
            )),
            (_, _, Some(concurrency)) => Ok(Pacing::Closed { concurrency }),
            _ if is_trace => Ok(Pacing::Trace { speedup: 1.0 }),
            _ => Ok(Pacing::Closed {
                concurrency: SYNTHETIC_CONCURRENCY_DEFAULT,
            }),
        }
    }

    /// The replay these flags describe, against `gateway`.
    pub fn replay_options(&self, gateway: String) -> Result<ReplayOptions, String> {
        let source = self.source()?;
        let pacing = self.pacing(&source)?;
        if !(self.timeout_s.is_finite() && self.timeout_s > 0.0) {
            return Err("--timeout-s must be above 0".into());
        }
        let tenant = TenantOptions {
            tenants: self.tenants,
            cache_salt: self.tenant_salt,
            lora: self.tenant_lora,
        };
        if tenant.tenants > 0 && !tenant.cache_salt && !tenant.lora {
            return Err("--tenants needs --tenant-salt and/or --tenant-lora".into());
        }
        Ok(ReplayOptions {
            gateway,
            source,
            pacing,
            max_requests: self.max_requests,
            form: FormOptions {
                form: self.form,
                model: self.model.clone(),
                tenant,
                output_cap: self.output_cap,
            },
            request_timeout: Duration::from_secs_f64(self.timeout_s),
            label: "replay".into(),
            known_workers: Vec::new(),
            progress: if self.no_progress {
                ProgressMode::Off
            } else {
                ProgressMode::Auto
            },
            watch_pid: self.watch_pid,
        })
    }
}

/// Requests per policy of `replay compare` when neither a trace nor --max-requests is given:
/// with the generator's defaults and 4 engines, about 25 s per policy on 2 shared cores.
pub const COMPARE_REQUESTS_DEFAULT: u64 = 1500;

/// Closed-loop concurrency of a synthetic workload without a pacing flag: few enough in flight
/// that bursts of one new prefix are rare, so a comparison shows placement, not burst handling.
pub const SYNTHETIC_CONCURRENCY_DEFAULT: usize = 8;

impl CompareArgs {
    /// The workload flags, with compare's defaults: the generator when no trace is given, and
    /// [`COMPARE_REQUESTS_DEFAULT`] requests.
    fn demo_workload(&self) -> WorkloadArgs {
        let mut workload = self.workload.clone();
        if workload.trace.is_none() {
            workload.synthetic = true;
            workload.max_requests = workload.max_requests.or(Some(COMPARE_REQUESTS_DEFAULT));
        }
        workload
    }

    /// Flags for every sim-engine: capacity and speed, then any --sim-arg.
    fn sim_flags(&self) -> Vec<String> {
        let mut flags = vec![
            format!("--model-name={}", self.workload.model),
            format!("--kv-capacity-tokens={}", self.kv_capacity_tokens),
            format!("--speedup={}", self.sim_speedup),
        ];
        flags.extend(self.sim_args.iter().cloned());
        flags
    }

    /// The comparison these flags describe.
    pub fn compare_options(&self) -> Result<CompareOptions, String> {
        validate_policies(&self.policies)?;
        let binary = |given: &Option<PathBuf>, name: &str| {
            given.clone().or_else(|| sibling_binary(name)).ok_or_else(|| {
                format!("{name} not found next to this executable: build it (cargo build --release --workspace --bins) or pass --{name}")
            })
        };
        let log_dir = self.log_dir.clone().unwrap_or_else(|| {
            std::env::temp_dir().join(format!("replay-compare-{}", std::process::id()))
        });
        Ok(CompareOptions {
            policies: self.policies.clone(),
            engines: self.engines,
            sim_engine: binary(&self.sim_engine, "sim-engine")?,
            kvgate: binary(&self.kvgate, "kvgate")?,
            sim_args: self.sim_flags(),
            gateway_args: self.gateway_args.clone(),
            log_dir,
            replay: self.demo_workload().replay_options(String::new())?,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn the_cli_is_well_formed() {
        Cli::command().debug_assert();
    }

    #[test]
    fn conflicting_and_missing_flags_are_refused() {
        let parse = |args: &[&str]| Cli::try_parse_from([&["replay"], args].concat());
        assert!(parse(&[
            "--gateway",
            "http://x:1",
            "--synthetic",
            "--rate",
            "5",
            "--concurrency",
            "2"
        ])
        .is_err());
        assert!(parse(&["--gateway", "http://x:1", "--trace", "t.jsonl", "--loop"]).is_err());
        let cli = parse(&["--gateway", "http://x:1", "--synthetic", "--speedup", "2"]).unwrap();
        let err = cli
            .replay
            .workload
            .replay_options("http://x:1".into())
            .unwrap_err();
        assert!(err.contains("--rate or --concurrency"), "{err}");
        let cli = parse(&[
            "--gateway",
            "http://x:1",
            "--trace",
            "t.jsonl",
            "--speedup",
            "10",
        ])
        .unwrap();
        let options = cli
            .replay
            .workload
            .replay_options("http://x:1".into())
            .unwrap();
        assert_eq!(options.pacing, Pacing::Trace { speedup: 10.0 });
        let cli = parse(&[
            "compare",
            "--synthetic",
            "--policies",
            "round_robin,nonsense",
        ])
        .unwrap();
        let Some(Command::Compare(compare)) = cli.command else {
            panic!("not compare")
        };
        let err = compare.compare_options().unwrap_err();
        assert!(err.contains("unknown policy \"nonsense\""), "{err}");
    }
}
