//! The profiling workflow, end to end: `scripts/flamegraph.sh tiny` records the debug kvgate
//! under load with perf and draws an SVG that names kvgate's own functions.
//!
//! perf may be missing or refused (a container's seccomp profile, `perf_event_paranoid`): then
//! the test says why and passes, unless `KVGATE_REQUIRE_PERF=1` (set by `scripts/test.sh`, which
//! installs perf first), where that is a failure.

use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

mod utils;

fn script() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("scripts/flamegraph.sh")
}

/// `None` when perf can record here, else the script's reason.
fn perf_unavailable() -> Option<String> {
    let output = Command::new(script())
        .arg("--probe")
        .output()
        .expect("run scripts/flamegraph.sh --probe");
    match output.status.code() {
        Some(0) => None,
        Some(3) => Some(String::from_utf8_lossy(&output.stderr).trim().to_string()),
        other => panic!(
            "scripts/flamegraph.sh --probe exited with {other:?}:\n{}",
            String::from_utf8_lossy(&output.stderr)
        ),
    }
}

#[test]
fn tiny_scenario_draws_kvgate_functions() {
    if let Some(reason) = perf_unavailable() {
        let required = std::env::var("KVGATE_REQUIRE_PERF").is_ok_and(|v| v == "1");
        assert!(!required, "KVGATE_REQUIRE_PERF=1 but {reason}");
        eprintln!("SKIPPED: {reason} (KVGATE_REQUIRE_PERF=1 makes this a failure)");
        return;
    }
    // The debug binaries sit beside this test's kvgate (the suite builds them all first).
    utils::process::workspace_bin("flamegraph");
    let out = std::env::temp_dir().join(format!("kvgate-flamegraph-{}", std::process::id()));
    let base_port = utils::process::free_port_block(101);
    let started = Instant::now();
    let output = Command::new(script())
        .arg("tiny")
        .env("FLAMEGRAPH_BUILD", "debug")
        .env("FLAMEGRAPH_OUT", &out)
        .env("FLAMEGRAPH_BASE_PORT", base_port.to_string())
        .output()
        .expect("run scripts/flamegraph.sh tiny");
    let took = started.elapsed();
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
    let svg = std::fs::read_to_string(out.join("tiny.svg"));
    std::fs::remove_dir_all(&out).ok();
    assert!(
        output.status.success(),
        "scripts/flamegraph.sh tiny failed:\n{stderr}\n{stdout}"
    );
    let svg = svg.expect("flamegraph.sh tiny wrote tiny.svg");
    assert!(svg.starts_with("<?xml"), "tiny.svg is not an SVG");
    for function in [
        "kvgate::http::server::serve_connection",
        "kvgate::http::proxy::proxy_request",
    ] {
        assert!(svg.contains(function), "tiny.svg never names {function}");
    }
    // The summary: a line per widest kvgate frame, then the README row.
    let widest: Vec<&str> = stdout
        .lines()
        .filter(|line| line.trim_start().starts_with(|c: char| c.is_ascii_digit()))
        .filter(|line| line.contains("% ") && line.contains("kvgate::"))
        .collect();
    assert_eq!(widest.len(), 3, "three widest frames expected:\n{stdout}");
    assert!(
        stdout.lines().any(|line| line.starts_with("| `tiny` |")),
        "no README row:\n{stdout}"
    );
    assert!(
        took < Duration::from_secs(120),
        "the CI scenario took {took:?}"
    );
}
