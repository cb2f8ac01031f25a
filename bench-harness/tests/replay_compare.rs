//! `replay compare` end to end, through the real binaries: a fresh `sim-engine` fleet and a real
//! `kvgate` per policy, the same tiny shared-prefix workload through each. Needs `kvgate` built
//! next to `replay` (`cargo build --workspace --bins`, as scripts/test.sh does first).
//!
//! Also checks that children never outlive `replay`: not on success, not on Ctrl-C, and that an
//! unknown policy is refused before anything starts.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

/// The policies compared. Round robin runs twice: fresh fleets make both runs see the same hit
/// rate (a reused, warm fleet would flatter the second), and cache_aware must beat it. `direct`
/// sends to the engines without a gateway: the baseline of the gateway's added latency.
const POLICIES: &str = "round_robin,cache_aware,round_robin,direct";

/// Requests per policy.
const REQUESTS: u64 = 128;

fn replay_binary() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_replay"))
}

fn kvgate_binary() -> PathBuf {
    let path = replay_binary().with_file_name("kvgate");
    assert!(
        path.is_file(),
        "{} is missing: run `cargo build --workspace --bins` first",
        path.display()
    );
    path
}

/// `replay compare` with a tiny workload: 8 groups of 2 conversations, 512-token system prompts,
/// on 4 engines of 2,048 tokens of KV cache each.
fn compare_command(dir: &Path, policies: &str, requests: u64) -> Command {
    let mut command = Command::new(replay_binary());
    command
        .arg("compare")
        .args(["--synthetic", "--groups", "8", "--prompts-per-group", "2"]);
    command.args([
        "--system-prompt-len",
        "512",
        "--question-len",
        "32",
        "--output-len",
        "4",
    ]);
    command.args([
        "--max-requests",
        &requests.to_string(),
        "--concurrency",
        "2",
        "--engines",
        "4",
        // Two groups' system prompts fit an engine, eight do not: where requests go matters.
        "--kv-capacity-tokens",
        "2048",
    ]);
    command.args([
        "--policies",
        policies,
        "--no-progress",
        "--sim-speedup",
        "20",
    ]);
    command
        .arg("--sim-engine")
        .arg(env!("CARGO_BIN_EXE_sim-engine"));
    command.arg("--kvgate").arg(kvgate_binary());
    command.arg("--out").arg(dir.join("compare.json"));
    command.arg("--plot").arg(dir.join("compare.svg"));
    command.arg("--log-dir").arg(dir.join("logs"));
    command.stdout(Stdio::piped()).stderr(Stdio::piped());
    command
}

/// Waits for `child` at most `limit`, killing it (and failing) if it takes longer.
fn wait_bounded(mut child: Child, limit: Duration) -> Output {
    let deadline = Instant::now() + limit;
    while child.try_wait().unwrap().is_none() {
        if Instant::now() > deadline {
            let _ = child.kill();
            let output = child.wait_with_output().unwrap();
            panic!(
                "replay compare took over {limit:?}; stderr:\n{}",
                String::from_utf8_lossy(&output.stderr)
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    child.wait_with_output().unwrap()
}

/// Process ids whose parent is `pid` (from /proc).
fn children_of(pid: u32) -> Vec<u32> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|child| {
            let stat = std::fs::read_to_string(format!("/proc/{child}/stat")).unwrap_or_default();
            let after_name = stat.rfind(')').map_or("", |i| &stat[i + 2..]);
            after_name.split_whitespace().nth(1) == Some(&pid.to_string())
        })
        .collect()
}

fn is_running(pid: u32) -> bool {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let state = stat.rfind(')').and_then(|i| stat[i + 2..].chars().next());
    matches!(state, Some(s) if s != 'Z' && s != 'X')
}

#[test]
fn cache_aware_beats_round_robin_on_fresh_fleets() {
    let dir = tempfile::tempdir().unwrap();
    let child = compare_command(dir.path(), POLICIES, REQUESTS)
        .spawn()
        .unwrap();
    let output = wait_bounded(child, Duration::from_secs(120));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "replay compare failed:\n{stderr}");
    let table = String::from_utf8_lossy(&output.stdout);
    assert!(
        table.contains("round_robin") && table.contains("cache hit rate"),
        "{table}"
    );

    let json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.path().join("compare.json")).unwrap())
            .unwrap();
    let reports = json["policies"].as_array().unwrap();
    let labels: Vec<&str> = reports
        .iter()
        .map(|r| r["label"].as_str().unwrap())
        .collect();
    assert_eq!(labels.join(","), POLICIES);
    for report in reports {
        let summary = format!(
            "{}: {} errors {}",
            report["label"], report["errors"], report["errors_by_kind"]
        );
        assert_eq!(report["requests"], REQUESTS, "{summary}");
        assert_eq!(report["errors"], 0, "{summary}");
        let per_worker = report["per_worker"].as_object().unwrap();
        assert_eq!(per_worker.len(), 4, "every engine of the fleet is listed");
        let routed: u64 = per_worker
            .values()
            .map(|w| w["requests"].as_u64().unwrap())
            .sum();
        assert_eq!(routed, REQUESTS, "every response named its worker");
        assert!(report["cache_hit_rate"].as_f64().unwrap() > 0.0);
        if report["label"] == "direct" {
            assert!(report["watched_process"].is_null(), "no gateway to watch");
            assert!(report["added_latency_ms"].is_null());
        } else {
            let samples = report["watched_process"]["samples"].as_array().unwrap();
            assert_eq!(samples.len(), 3, "gateway RSS at 10%, 50%, 100%");
            assert!(report["added_latency_ms"]["ttft_p50"].is_f64(), "{summary}");
        }
    }
    assert!(table.contains("TTFT p50 over direct (ms)"), "{table}");
    let hit = |i: usize| reports[i]["cache_hit_rate"].as_f64().unwrap();
    // Fresh engines per policy: the second round robin starts as cold as the first.
    assert!(
        (hit(0) - hit(2)).abs() < 0.1,
        "round robin {:.3} then {:.3}",
        hit(0),
        hit(2)
    );
    // Round robin sends every group to every engine, more than an engine's cache holds.
    assert!(hit(0) > 0.2, "round robin {:.3}", hit(0));
    assert!(
        reports[0]["imbalance"].as_f64().unwrap() <= 1.01,
        "round robin is even"
    );
    // cache_aware keeps each group on the engine that has its system prompt, and two groups fit.
    assert!(
        hit(1) > hit(0) + 0.15,
        "cache_aware {:.3} vs round robin {:.3}",
        hit(1),
        hit(0)
    );
    let svg = std::fs::read_to_string(dir.path().join("compare.svg")).unwrap();
    assert!(svg.contains("round_robin") && svg.contains("cache_aware"));
}

#[test]
fn an_unknown_policy_is_refused_before_anything_starts() {
    let dir = tempfile::tempdir().unwrap();
    let output = compare_command(dir.path(), "round_robin,fastest", 4)
        .output()
        .unwrap();
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("unknown policy \"fastest\""), "{stderr}");
    assert!(!dir.path().join("logs").exists(), "nothing was started");
}

#[test]
fn ctrl_c_stops_the_replay_and_its_children() {
    let dir = tempfile::tempdir().unwrap();
    // Long enough that the interrupt arrives mid-replay.
    let child = compare_command(dir.path(), "round_robin", 1_000_000)
        .spawn()
        .unwrap();
    let pid = child.id();
    let gateway_log = dir.path().join("logs/round_robin-kvgate.log");
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut started = Vec::new();
    while started.len() < 2 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(100));
        started = if gateway_log.exists() {
            children_of(pid)
        } else {
            Vec::new()
        };
    }
    assert_eq!(started.len(), 2, "sim-engine and kvgate should be running");
    std::thread::sleep(Duration::from_millis(500));
    let interrupted = Command::new("kill")
        .args(["-INT", &pid.to_string()])
        .status()
        .unwrap();
    assert!(interrupted.success());
    let output = wait_bounded(child, Duration::from_secs(20));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("stopping"), "{stderr}");
    std::thread::sleep(Duration::from_millis(200));
    for child in started {
        assert!(!is_running(child), "child {child} outlived replay");
    }
}

#[test]
fn a_pd_fleet_compares_prefill_policies_by_the_prefill_engines_hit_rate() {
    let dir = tempfile::tempdir().unwrap();
    let mut command = compare_command(dir.path(), "round_robin,cache_aware", REQUESTS);
    command.args(["--pd", "2:2"]);
    let output = wait_bounded(command.spawn().unwrap(), Duration::from_secs(120));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success(),
        "replay compare --pd failed:\n{stderr}"
    );
    let json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.path().join("compare.json")).unwrap())
            .unwrap();
    let reports = json["policies"].as_array().unwrap();
    for report in reports {
        assert_eq!(report["requests"], REQUESTS, "{}", report["errors_by_kind"]);
        assert_eq!(report["errors"], 0, "{}", report["errors_by_kind"]);
        // The answers come from the decode engines, two of them.
        assert_eq!(report["per_worker"].as_object().unwrap().len(), 2);
    }
    let hit = |i: usize| reports[i]["cache_hit_rate"].as_f64().unwrap();
    // Two prefill engines hold four of the eight groups' prompts: cache_aware keeps each group
    // on one, round robin sends every group to both.
    assert!(
        hit(1) > hit(0) + 0.1,
        "cache_aware {:.3} vs round robin {:.3}",
        hit(1),
        hit(0)
    );
    // `direct` has no meaning on a PD fleet: refused before anything starts.
    let other = tempfile::tempdir().unwrap();
    let mut direct = compare_command(other.path(), "direct", 4);
    direct.args(["--pd", "2:2"]);
    let refused = direct.output().unwrap();
    assert!(!refused.status.success());
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(
        stderr.contains("direct") && stderr.contains("--pd"),
        "{stderr}"
    );
    assert!(!other.path().join("logs").exists(), "nothing was started");
}

/// `replay compare` of `policies` over `workload` (synthetic flags), `requests` at `rate` req/s on
/// 4 real-time engines of 262,144 tokens, token IDs sent (`/generate`); its JSON reports by label.
fn compare_open_loop(
    dir: &Path,
    workload: &[&str],
    (requests, rate): (u64, u32),
    policies: &str,
    gateway_args: &[&str],
) -> Vec<serde_json::Value> {
    let mut command = Command::new(replay_binary());
    command.arg("compare").arg("--synthetic").args(workload);
    command.args([
        "--form",
        "generate-ids",
        "--max-requests",
        &requests.to_string(),
    ]);
    command.args(["--rate", &rate.to_string(), "--engines", "4"]);
    command.args(["--kv-capacity-tokens", "262144", "--sim-speedup", "1"]);
    command.args(["--policies", policies, "--no-progress"]);
    for arg in gateway_args {
        command.arg(format!("--gateway-arg={arg}"));
    }
    command
        .arg("--sim-engine")
        .arg(env!("CARGO_BIN_EXE_sim-engine"));
    command.arg("--kvgate").arg(kvgate_binary());
    command.arg("--out").arg(dir.join("compare.json"));
    command.arg("--plot").arg(dir.join("compare.svg"));
    command.arg("--log-dir").arg(dir.join("logs"));
    command.stdout(Stdio::piped()).stderr(Stdio::piped());
    let output = wait_bounded(command.spawn().unwrap(), Duration::from_secs(240));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "replay compare failed:\n{stderr}");
    let json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("compare.json")).unwrap()).unwrap();
    let reports = json["policies"].as_array().unwrap().clone();
    for report in &reports {
        assert_eq!(report["requests"], requests, "{}", report["label"]);
        assert_eq!(report["errors"], 0, "{}", report["label"]);
    }
    reports
}

fn figure(reports: &[serde_json::Value], label: &str, name: &str) -> f64 {
    let report = reports.iter().find(|r| r["label"] == label).unwrap();
    report[name].as_f64().unwrap()
}

/// Not in the test pass: whether a follow-up arrives before its engine published the earlier
/// turn depends on how fast this machine runs the engines (on a quiet one they publish in time
/// and both policies hit 96%), so the comparison is a benchmark:
/// `scripts/bench-kv-events.sh OUT overloaded`. Run it with `--ignored` on a loaded machine.
/// The overlay's behaviour is tested without timing in `index::kv`'s unit tests and
/// `tests/kv_events.rs`.
#[test]
#[ignore = "timing-dependent comparison: scripts/bench-kv-events.sh OUT overloaded"]
fn the_in_flight_overlay_keeps_follow_ups_that_arrive_before_their_engine_reports() {
    // Four conversations of 8 turns on 4,096-token system prompts at 100 req/s: each
    // conversation's next turn arrives every ~40 ms, before its earlier turn's prefill (queued
    // behind the others') has been published. Without the overlay the KV-event index knows only
    // the system prompt then; with it, where the earlier turn went.
    let dir = tempfile::tempdir().unwrap();
    let workload = [
        "--groups",
        "4",
        "--prompts-per-group",
        "1",
        "--system-prompt-len",
        "4096",
        "--question-len",
        "64",
        "--output-len",
        "16",
        "--turns",
        "8",
    ];
    let policies = "cache_aware:kv:events-only,cache_aware:kv";
    let reports = compare_open_loop(dir.path(), &workload, (200, 100), policies, &[]);
    let hit = |label| figure(&reports, label, "cache_hit_rate");
    eprintln!(
        "hit rate with the overlay {:.3}, events only {:.3}",
        hit("cache_aware:kv"),
        hit("cache_aware:kv:events-only")
    );
    // Measured on a loaded box in three runs: 91.8-93.4% without, 95.2-95.7% with.
    assert!(
        hit("cache_aware:kv") > hit("cache_aware:kv:events-only"),
        "with the overlay {:.3}, events only {:.3}",
        hit("cache_aware:kv"),
        hit("cache_aware:kv:events-only")
    );
}

#[test]
fn load_aware_affinity_spreads_a_hot_prefix_on_the_kv_event_and_hash_indexes() {
    // Two Zipf-skewed 4,096-token system prompts with 64-token answers at 60 req/s on 4 engines:
    // by default each index keeps a prompt on its first holder (imbalance 2.25 on the KV-event
    // index, 3.08 on the hash index in a measured run); load-aware, its holders replicate it.
    let dir = tempfile::tempdir().unwrap();
    let workload = [
        "--groups",
        "2",
        "--prompts-per-group",
        "50",
        "--system-prompt-len",
        "4096",
        "--question-len",
        "64",
        "--output-len",
        "64",
        "--popularity",
        "zipf",
        "--zipf-exponent",
        "1.5",
    ];
    let policies = "cache_aware:kv,cache_aware:kv:load,cache_aware:hash,cache_aware:hash:load";
    let boundaries = ["--cache-boundaries=1024,4096"];
    let reports = compare_open_loop(dir.path(), &workload, (300, 60), policies, &boundaries);
    let imbalance = |label| figure(&reports, label, "imbalance");
    for (default, load) in [
        ("cache_aware:kv", "cache_aware:kv:load"),
        ("cache_aware:hash", "cache_aware:hash:load"),
    ] {
        assert!(
            imbalance(load) < imbalance(default) && imbalance(load) <= 1.5,
            "{load} {:.2} vs {default} {:.2}",
            imbalance(load),
            imbalance(default)
        );
        assert!(figure(&reports, load, "cache_hit_rate") > 0.9, "{load}");
    }
}

#[test]
fn the_bounded_load_margin_evens_out_the_requests_each_engine_serves() {
    // 8 groups of Zipf popularity (exponent 1: the first draws 37% of the requests) on 4
    // engines: cache_aware keeps the hot group on its first holder, so one engine serves far
    // above the mean; --bounded-load-margin 4 keeps every engine within 4 requests of the
    // mean count (64 here), replicating the hot group where it must.
    let dir = tempfile::tempdir().unwrap();
    let policies = "cache_aware,cache_aware:bounded-4";
    let mut command = compare_command(dir.path(), policies, 256);
    command.args(["--popularity", "zipf", "--zipf-exponent", "1.0"]);
    let output = wait_bounded(command.spawn().unwrap(), Duration::from_secs(120));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "replay compare failed:\n{stderr}");
    let json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.path().join("compare.json")).unwrap())
            .unwrap();
    let reports = json["policies"].as_array().unwrap().clone();
    let imbalance = |label| figure(&reports, label, "imbalance");
    let hit = |label| figure(&reports, label, "cache_hit_rate");
    let table = String::from_utf8_lossy(&output.stdout);
    // Within the margin plus a request or two decided at once on the gateway's cores.
    assert!(
        imbalance("cache_aware:bounded-4") <= (64.0 + 4.0 + 2.0) / 64.0,
        "{table}"
    );
    assert!(imbalance("cache_aware") > 1.3, "{table}");
    assert!(
        hit("cache_aware:bounded-4") > 0.8 * hit("cache_aware"),
        "{table}"
    );
}
