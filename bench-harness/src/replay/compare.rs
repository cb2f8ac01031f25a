//! `replay compare`: the same workload through one fresh fleet and one gateway per policy.
//!
//! For each policy it starts a new `sim-engine` fleet (so a cache warmed by the previous policy
//! does not flatter the next) and a `kvgate --policy <name>` in front of it, waits until both
//! answer `/health`, replays, and stops both. The processes are [`Children`]: killed when
//! dropped, so an error, a panic or Ctrl-C (which makes the replay return early) never leaves
//! them running. Ports, logs and waits are [`crate::fleet`]'s.
//!
//! With `--pd P:D` each policy runs on a prefill/decode fleet instead ([`PdFleet`]): P
//! `sim-engine --role prefill` engines and D `--role decode` ones, and `kvgate
//! --pd-disaggregation` with the policy on the prefill side (`--prefill-policy`; the decode side
//! keeps `--policy`'s default, cache_aware, which without an index places by expected wait). The
//! decode engines report the prefill engines' cached tokens, so the hit rate is the prefill
//! side's; `direct` has no meaning there and is refused.

use std::net::SocketAddr;
use std::path::PathBuf;

use tokio::process::Command;
use tokio::sync::watch;

use crate::fleet::{free_port_blocks, free_ports, Children, STARTUP_TIMEOUT};

use super::limits::{COMPARE_POLICIES_MAX, FLEET_ENGINES_MAX};
use super::report::{AddedLatency, ReplayReport};
use super::run::{run_replay, ReplayOptions};

/// SMG's policy names (`--policy`); kvgate accepts the same set.
pub const KNOWN_POLICIES: [&str; 7] = [
    "random",
    "round_robin",
    "power_of_two",
    "least_load",
    "prefix_hash",
    "consistent_hashing",
    "cache_aware",
];

/// The pseudo-policy without a gateway: replay sends to the engines itself, in turn. Its latency
/// is the baseline the others' added latency is measured against.
pub const DIRECT: &str = "direct";

/// cache_aware on the hash index (`--policy cache_aware --cache-index hash`; give the gateway its
/// `--cache-boundaries` with `--gateway-args`, which also set `prefix_hash`'s depth).
pub const CACHE_AWARE_HASH: &str = "cache_aware:hash";

/// cache_aware on the KV-event index: the engines publish KV events (`sim-engine
/// --kv-events-base-port`) and the gateway routes token-ID requests on what they report caching
/// (it learns the endpoints from their `/server_info`).
pub const CACHE_AWARE_KV: &str = "cache_aware:kv";

/// cache_aware with `--load-aware-affinity`: holders kept only while they are the cheaper place
/// to run the request, so a hot prefix replicates.
pub const CACHE_AWARE_LOAD: &str = "cache_aware:load";

/// The pseudo-policies beside `--policy` names.
const PSEUDO_POLICIES: [&str; 4] = [DIRECT, CACHE_AWARE_HASH, CACHE_AWARE_KV, CACHE_AWARE_LOAD];

/// The modifiers a `cache_aware:` pseudo-policy may join with `:`, in any order (`hash` and
/// `kv` exclusive): `cache_aware:kv:load` is cache_aware on the KV-event index with
/// `--load-aware-affinity`; `events-only` turns the KV-event index's in-flight overlay off;
/// `holders-7` lets the hash index keep seven holders per head instead of the spec's three;
/// `bounded-8` keeps every worker within 8 requests of the fleet's mean dispatched count
/// (`--bounded-load-margin 8`), `bounded-4` within 4 (one of the two).
const CACHE_AWARE_MODIFIERS: [(&str, &[&str]); 7] = [
    ("hash", &["--cache-index", "hash"]),
    ("kv", &[]),
    ("load", &["--load-aware-affinity"]),
    ("events-only", &["--kv-inflight-ttl-secs", "0"]),
    ("holders-7", &["--cache-holders-max", "7"]),
    ("bounded-4", &["--bounded-load-margin", "4"]),
    ("bounded-8", &["--bounded-load-margin", "8"]),
];

/// The modifiers of a `cache_aware:...` pseudo-policy, each once; `None`: not one.
fn cache_aware_modifiers(policy: &str) -> Option<Vec<&'static str>> {
    let rest = policy.strip_prefix("cache_aware:")?;
    let mut modifiers: Vec<&'static str> = Vec::new();
    for part in rest.split(':') {
        let (name, _) = CACHE_AWARE_MODIFIERS.iter().find(|(m, _)| *m == part)?;
        if modifiers.contains(name) {
            return None;
        }
        modifiers.push(name);
    }
    let exclusive = (modifiers.contains(&"hash") && modifiers.contains(&"kv"))
        || (modifiers.contains(&"bounded-4") && modifiers.contains(&"bounded-8"));
    (!exclusive).then_some(modifiers)
}

/// Whether `policy`'s engines publish KV events.
fn publishes_kv_events(policy: &str) -> bool {
    cache_aware_modifiers(policy).is_some_and(|m| m.contains(&"kv"))
}

/// The gateway flags that run one entry of `--policies`.
fn policy_flags(policy: &str) -> Vec<&str> {
    match cache_aware_modifiers(policy) {
        Some(modifiers) => {
            let mut flags = vec!["--policy", "cache_aware"];
            for (name, modifier_flags) in CACHE_AWARE_MODIFIERS {
                if modifiers.contains(&name) {
                    flags.extend_from_slice(modifier_flags);
                }
            }
            flags
        }
        None => vec!["--policy", policy],
    }
}

/// The kvgate flags one entry of `--policies` ran with (its policy's and every `--gateway-arg`),
/// as the table's legend prints them: what to start to get that column. `direct` has no gateway.
pub fn gateway_flags(options: &CompareOptions, policy: &str) -> String {
    if policy == DIRECT {
        return "(no gateway: the engines directly)".into();
    }
    let mut words = match options.pd {
        Some(_) => pd_policy_flags(policy),
        None => policy_flags(policy),
    };
    words.extend(options.gateway_args.iter().map(String::as_str));
    format!("kvgate {}", words.join(" "))
}

/// Tries to start a fleet and its gateway before giving up.
const STARTUP_ATTEMPTS: u32 = 3;

/// A prefill/decode fleet (`--pd P:D`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PdFleet {
    pub prefill: u16,
    pub decode: u16,
}

impl PdFleet {
    /// `P:D`, each 1 to `FLEET_ENGINES_MAX`.
    pub fn parse(text: &str) -> Result<PdFleet, String> {
        let bad =
            || format!("--pd {text:?}: expected P:D, e.g. 2:2 (1 to {FLEET_ENGINES_MAX} each)");
        let (p, d) = text.split_once(':').ok_or_else(bad)?;
        let count = |n: &str| {
            n.parse::<u16>()
                .ok()
                .filter(|n| (1..=FLEET_ENGINES_MAX).contains(n))
                .ok_or_else(bad)
        };
        Ok(PdFleet {
            prefill: count(p)?,
            decode: count(d)?,
        })
    }
}

/// Settings of a comparison.
#[derive(Clone, Debug, PartialEq)]
pub struct CompareOptions {
    pub policies: Vec<String>,
    pub engines: u16,
    /// A prefill/decode fleet instead of `engines` regular ones.
    pub pd: Option<PdFleet>,
    /// The engines speak this gRPC protocol (`sim-engine --grpc`), the gateways front them.
    pub grpc: Option<&'static str>,
    pub sim_engine: PathBuf,
    pub kvgate: PathBuf,
    /// Extra flags for every `sim-engine` (e.g. `--kv-capacity-tokens=...`).
    pub sim_args: Vec<String>,
    /// Extra flags for every `kvgate`.
    pub gateway_args: Vec<String>,
    /// Where child logs go (one file per child and policy).
    pub log_dir: PathBuf,
    /// The replay to run against each gateway (`gateway`, `label` and `known_workers` are set
    /// per policy).
    pub replay: ReplayOptions,
}

/// Checks the policy list before anything starts; the error names the flag.
pub fn validate_policies(policies: &[String]) -> Result<(), String> {
    if policies.is_empty() || policies.len() > COMPARE_POLICIES_MAX {
        return Err(format!(
            "--policies takes 1 to {COMPARE_POLICIES_MAX} policy names"
        ));
    }
    for policy in policies {
        let pseudo = policy == DIRECT || cache_aware_modifiers(policy).is_some();
        if !pseudo && !KNOWN_POLICIES.contains(&policy.as_str()) {
            return Err(format!(
                "--policies: unknown policy {policy:?} (known: {}, and {}; cache_aware:'s \
                 modifiers join with ':': {})",
                KNOWN_POLICIES.join(", "),
                PSEUDO_POLICIES.join(", "),
                CACHE_AWARE_MODIFIERS.map(|(m, _)| m).join(", ")
            ));
        }
    }
    Ok(())
}

/// Checks a comparison's settings before anything starts: the policies, the fleet's size and
/// that both binaries are there.
pub fn validate(options: &CompareOptions) -> Result<(), String> {
    validate_policies(&options.policies)?;
    if options.pd.is_some() && options.policies.iter().any(|p| p == DIRECT) {
        return Err(
            "--policies: direct needs a gateway-free fleet; it has no meaning with --pd".into(),
        );
    }
    if options.engines == 0 || options.engines > FLEET_ENGINES_MAX {
        return Err(format!(
            "--engines must be between 1 and {FLEET_ENGINES_MAX}"
        ));
    }
    for binary in [&options.sim_engine, &options.kvgate] {
        if !binary.is_file() {
            return Err(format!("{} not found: build it (cargo build --release --workspace --bins) or pass its path", binary.display()));
        }
    }
    Ok(())
}

/// Replays through each policy in turn and returns one report per policy.
pub async fn run_compare(
    options: &CompareOptions,
    stop: watch::Receiver<bool>,
) -> Result<Vec<ReplayReport>, String> {
    validate(options)?;
    std::fs::create_dir_all(&options.log_dir)
        .map_err(|e| format!("{}: {e}", options.log_dir.display()))?;
    let mut reports = Vec::with_capacity(options.policies.len());
    for policy in &options.policies {
        if *stop.borrow() {
            break;
        }
        let report = run_policy(options, policy, stop.clone()).await?;
        eprintln!(
            "[{policy}] done: {} requests, hit rate {:.1}%",
            report.requests,
            report.cache_hit_rate * 100.0
        );
        reports.push(report);
    }
    set_added_latency(&mut reports);
    Ok(reports)
}

/// With a `direct` run among `reports`, gives every other report its latency above it.
fn set_added_latency(reports: &mut [ReplayReport]) {
    let Some(direct) = reports.iter().find(|r| r.label == DIRECT).cloned() else {
        return;
    };
    for report in reports.iter_mut().filter(|r| r.label != DIRECT) {
        report.added_latency_ms = Some(AddedLatency {
            ttft_p50: report.ttft_ms.p50 - direct.ttft_ms.p50,
            ttft_p99: report.ttft_ms.p99 - direct.ttft_ms.p99,
            e2e_p50: report.e2e_ms.p50 - direct.e2e_ms.p50,
        });
    }
}

async fn run_policy(
    options: &CompareOptions,
    policy: &str,
    stop: watch::Receiver<bool>,
) -> Result<ReplayReport, String> {
    let (mut fleet, workers, gateway, gateway_pid) =
        start_with_retries(options, policy, &stop).await?;
    let mut replay = options.replay.clone();
    replay.gateway = gateway;
    replay.label = policy.to_string();
    replay.known_workers = workers;
    replay.watch_pid = replay.watch_pid.or(gateway_pid);
    let report = run_replay(&replay, stop).await;
    fleet.stop().await;
    report
}

/// Starts the fleet and the gateway; a start that fails (most often a port taken between
/// choosing it and binding it) is retried on new ports.
async fn start_with_retries(
    options: &CompareOptions,
    policy: &str,
    stop: &watch::Receiver<bool>,
) -> Result<(Children, Vec<String>, String, Option<u32>), String> {
    let mut last_error = String::new();
    for attempt in 1..=STARTUP_ATTEMPTS {
        let mut fleet = Children::default();
        let started = async {
            if let Some(pd) = options.pd {
                let (decode, prefill_flags) =
                    start_pd_engines(options, pd, policy, &mut fleet, stop.clone()).await?;
                let gateway =
                    start_gateway(options, policy, &prefill_flags, &mut fleet, stop.clone())
                        .await?;
                return Ok((decode, gateway));
            }
            let workers = start_engines(options, policy, &mut fleet, stop.clone()).await?;
            if policy == DIRECT {
                return Ok((workers.clone(), (workers.join(","), None)));
            }
            let gateway =
                start_gateway(options, policy, &workers, &mut fleet, stop.clone()).await?;
            Ok::<_, String>((workers, gateway))
        }
        .await;
        match started {
            Ok((workers, (url, pid))) => return Ok((fleet, workers, url, pid)),
            Err(e) if *stop.borrow() => return Err(e),
            Err(e) => {
                eprintln!("[{policy}] start attempt {attempt} of {STARTUP_ATTEMPTS} failed: {e}");
                last_error = e;
                fleet.stop().await;
            }
        }
    }
    Err(last_error)
}

/// Starts a fresh `sim-engine` fleet and waits until every engine answers; returns their URLs.
async fn start_engines(
    options: &CompareOptions,
    policy: &str,
    fleet: &mut Children,
    stop: watch::Receiver<bool>,
) -> Result<Vec<String>, String> {
    // With KV events, PUB sockets on kv_base + i and replay sockets on kv_base + engines + i.
    let blocks = match publishes_kv_events(policy) {
        true => vec![options.engines, 2 * options.engines],
        false => vec![options.engines],
    };
    let ports = free_port_blocks(&blocks)?;
    let base_port = ports[0];
    let mut sim = Command::new(&options.sim_engine);
    let (engines, base) = (options.engines.to_string(), base_port.to_string());
    sim.args(["--engines", &engines, "--base-port", &base]);
    sim.args(&options.sim_args);
    if let Some(protocol) = options.grpc {
        sim.args(["--grpc", protocol]);
    }
    if let Some(kv_base) = ports.get(1) {
        sim.args(["--kv-events-base-port", &kv_base.to_string()]);
    }
    let log = options
        .log_dir
        .join(format!("{}-sim-engine.log", policy.replace(':', "-")));
    fleet.start("sim-engine", sim, &log)?;
    for i in 0..options.engines {
        let addr = SocketAddr::from(([127, 0, 0, 1], base_port + i));
        match options.grpc {
            // A gRPC engine has no `GET /health`; it listens once it serves.
            Some(_) => {
                fleet
                    .wait_until_listening(addr, STARTUP_TIMEOUT, stop.clone())
                    .await?
            }
            None => {
                fleet
                    .wait_until_healthy(addr, STARTUP_TIMEOUT, stop.clone())
                    .await?
            }
        }
    }
    let scheme = if options.grpc.is_some() {
        "grpc"
    } else {
        "http"
    };
    let urls = (0..options.engines).map(|i| format!("{scheme}://127.0.0.1:{}", base_port + i));
    Ok(urls.collect())
}

/// Starts `kvgate --policy <policy>` in front of `workers` and waits until it answers; returns
/// its URL and process id.
async fn start_gateway(
    options: &CompareOptions,
    policy: &str,
    workers: &[String],
    fleet: &mut Children,
    stop: watch::Receiver<bool>,
) -> Result<(String, Option<u32>), String> {
    // Its own metrics port too: the default (29000) would collide with any other gateway.
    let port = free_ports(2)?;
    let metrics_port = port + 1;
    let mut gateway = Command::new(&options.kvgate);
    let (port_text, metrics_text) = (port.to_string(), metrics_port.to_string());
    gateway.args(["--host", "127.0.0.1", "--port", &port_text]);
    match options.pd {
        // `workers` are the PD flags; the policy picks the prefill side.
        Some(_) => gateway.args(pd_policy_flags(policy)),
        None => gateway.args(policy_flags(policy)),
    };
    gateway.args([
        "--prometheus-host",
        "127.0.0.1",
        "--prometheus-port",
        &metrics_text,
    ]);
    match options.pd {
        Some(_) => gateway.args(workers),
        None => gateway.arg("--worker-urls").args(workers),
    };
    gateway.args(&options.gateway_args);
    let log = options
        .log_dir
        .join(format!("{}-kvgate.log", policy.replace(':', "-")));
    let pid = fleet.start("kvgate", gateway, &log)?;
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    fleet
        .wait_until_healthy(addr, STARTUP_TIMEOUT, stop)
        .await?;
    Ok((format!("http://127.0.0.1:{port}"), pid))
}

/// The gateway flags that run one entry of `--policies` on the prefill side of a PD fleet.
fn pd_policy_flags(policy: &str) -> Vec<&str> {
    let mut flags = policy_flags(policy);
    if let Some(flag) = flags.iter_mut().find(|f| **f == "--policy") {
        *flag = "--prefill-policy";
    }
    flags.insert(0, "--pd-disaggregation");
    flags
}

/// Starts the prefill and the decode fleet of `pd` (one `sim-engine` process each) and waits
/// until every engine answers; returns the decode URLs (the answers come from them) and the
/// gateway's `--prefill URL PORT` and `--decode URL` flags (each prefill engine's bootstrap
/// server is its own HTTP port).
async fn start_pd_engines(
    options: &CompareOptions,
    pd: PdFleet,
    policy: &str,
    fleet: &mut Children,
    stop: watch::Receiver<bool>,
) -> Result<(Vec<String>, Vec<String>), String> {
    let ports = free_port_blocks(&[pd.prefill, pd.decode])?;
    let mut flags = Vec::new();
    let mut decode_urls = Vec::new();
    for ((role, engines), base_port) in [("prefill", pd.prefill), ("decode", pd.decode)]
        .into_iter()
        .zip(ports)
    {
        let mut sim = Command::new(&options.sim_engine);
        let (count, base) = (engines.to_string(), base_port.to_string());
        sim.args(["--engines", &count, "--base-port", &base, "--role", role]);
        sim.args(&options.sim_args);
        let log = options.log_dir.join(format!(
            "{}-sim-engine-{role}.log",
            policy.replace(':', "-")
        ));
        fleet.start("sim-engine", sim, &log)?;
        for i in 0..engines {
            let port = base_port + i;
            let addr = SocketAddr::from(([127, 0, 0, 1], port));
            fleet
                .wait_until_healthy(addr, STARTUP_TIMEOUT, stop.clone())
                .await?;
            let url = format!("http://127.0.0.1:{port}");
            match role {
                "prefill" => flags.extend(["--prefill".to_string(), url, port.to_string()]),
                _ => {
                    flags.extend(["--decode".to_string(), url.clone()]);
                    decode_urls.push(url);
                }
            }
        }
    }
    Ok((decode_urls, flags))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_hash_variant_runs_cache_aware_on_the_hash_index() {
        let policies = |names: &[&str]| names.iter().map(|n| n.to_string()).collect::<Vec<_>>();
        assert!(validate_policies(&policies(&["round_robin", CACHE_AWARE_HASH, DIRECT])).is_ok());
        let unknown = validate_policies(&policies(&["cache_aware:trie"])).unwrap_err();
        assert!(unknown.contains("cache_aware:hash"), "{unknown}");
        assert_eq!(
            policy_flags(CACHE_AWARE_HASH),
            ["--policy", "cache_aware", "--cache-index", "hash"]
        );
        assert_eq!(policy_flags("prefix_hash"), ["--policy", "prefix_hash"]);
        assert!(validate_policies(&policies(&[CACHE_AWARE_KV])).is_ok());
        assert!(validate_policies(&policies(&[CACHE_AWARE_LOAD])).is_ok());
        assert_eq!(
            policy_flags(CACHE_AWARE_LOAD),
            ["--policy", "cache_aware", "--load-aware-affinity"]
        );
        assert_eq!(policy_flags(CACHE_AWARE_KV), ["--policy", "cache_aware"]);
    }

    #[test]
    fn a_pd_fleet_is_p_colon_d_and_its_policy_picks_the_prefill_side() {
        assert_eq!(
            PdFleet::parse("2:3"),
            Ok(PdFleet {
                prefill: 2,
                decode: 3
            })
        );
        for bad in ["2", "0:1", "1:x", "2:2:2", ""] {
            assert!(PdFleet::parse(bad).is_err(), "{bad}");
        }
        assert_eq!(
            pd_policy_flags(CACHE_AWARE_HASH),
            [
                "--pd-disaggregation",
                "--prefill-policy",
                "cache_aware",
                "--cache-index",
                "hash"
            ]
        );
        assert_eq!(
            pd_policy_flags("round_robin"),
            ["--pd-disaggregation", "--prefill-policy", "round_robin"]
        );
    }

    #[test]
    fn cache_aware_modifiers_combine_in_any_order_once_each() {
        let policies = |names: &[&str]| names.iter().map(|n| n.to_string()).collect::<Vec<_>>();
        assert_eq!(
            policy_flags("cache_aware:load:hash"),
            [
                "--policy",
                "cache_aware",
                "--cache-index",
                "hash",
                "--load-aware-affinity"
            ]
        );
        assert_eq!(
            policy_flags("cache_aware:kv:load"),
            ["--policy", "cache_aware", "--load-aware-affinity"]
        );
        assert!(publishes_kv_events("cache_aware:kv:load"));
        assert!(publishes_kv_events("cache_aware:events-only:kv"));
        assert!(!publishes_kv_events("cache_aware:hash:load"));
        assert_eq!(
            policy_flags("cache_aware:kv:events-only"),
            ["--policy", "cache_aware", "--kv-inflight-ttl-secs", "0"]
        );
        assert_eq!(
            policy_flags("cache_aware:hash:load:holders-7"),
            [
                "--policy",
                "cache_aware",
                "--cache-index",
                "hash",
                "--load-aware-affinity",
                "--cache-holders-max",
                "7"
            ]
        );
        assert_eq!(
            policy_flags("cache_aware:bounded-4"),
            ["--policy", "cache_aware", "--bounded-load-margin", "4"]
        );
        assert_eq!(
            policy_flags("cache_aware:bounded-8"),
            ["--policy", "cache_aware", "--bounded-load-margin", "8"]
        );
        for bad in [
            "cache_aware:bounded-4:bounded-8",
            "cache_aware:hash:kv",
            "cache_aware:load:load",
            "cache_aware:",
            "cache_aware:x",
        ] {
            assert!(validate_policies(&policies(&[bad])).is_err(), "{bad}");
        }
        assert!(
            validate_policies(&policies(&["cache_aware:kv:load", "cache_aware:hash:load"])).is_ok()
        );
    }
}
