#!/usr/bin/env bash
# The whole test suite, as CI runs it: formatting, lints, then every test of the workspace.
# Needs the Rust toolchain (nightly too for the sanitizer pass and the fuzz targets, which are
# skipped without it), npm and python3 (installed with apt-get when missing) for the tokenizer
# fixtures and the KV-event compatibility test, perf (likewise) for the flame-graph test;
# integration tests start sim-engine and kvgate on loopback.
set -euo pipefail
cd "$(dirname "$0")/.."
# Each step's duration on stderr when it ends, so a slow CI run shows where its time went.
step_start=$SECONDS
step_done() {
  echo "test.sh: $1 done after $((SECONDS - step_start)) s ($SECONDS s in all)" >&2
  step_start=$SECONDS
}
cargo fmt --all -- --check
cargo clippy --workspace --all-targets -- -D warnings
# Binaries first: the integration tests start target/debug/{kvgate,sim-engine,replay}.
cargo build --workspace --bins
step_done "fmt, clippy and the build"
# The sanitizer and fuzz passes' builds (nightly, their own target directories) start now at
# the lowest priority: they take the CPU the tests leave idle while waiting on processes and
# sockets, and the passes below then find them built. Their output goes to a log, printed if
# they fail (the passes would then fail the same way).
prebuild_log=target/prebuild.log
mkdir -p target
# Its own process group (setsid), so an early exit stops the whole build with it.
setsid nice -n 19 bash -c 'SANITIZED_BUILD_ONLY=1 scripts/test-sanitized.sh \
    && FUZZ_BUILD_ONLY=1 scripts/fuzz.sh' >"$prebuild_log" 2>&1 &
prebuild=$!
trap 'kill -- "-$prebuild" 2>/dev/null || true' EXIT
# Real tokenizer files and the Python reference IDs (cached under target/tokenizers), pyzmq and
# msgspec for the KV-event compatibility test (under target/kv-events-python), grpcio with
# smg-grpc-proto for the gRPC interoperability test (under target/grpc-python), the openai and
# anthropic clients for the SDK test (under target/sdk-python), promtool for the
# exposition check (Debian's prometheus package); the tests that need them fail rather than skip
# without them here.
scripts/fetch-tokenizers.sh
scripts/fetch-kv-events-python.sh
scripts/fetch-grpc-python.sh
scripts/fetch-sdk-python.sh
scripts/fetch-promtool.sh
# perf (Debian linux-perf, with apt-get when missing) for tests/flamegraph.rs, which then fails
# rather than skips without it. Where perf is installed but cannot record (a container whose
# seccomp profile blocks perf_event_open), the setup prints why and the test is skipped with
# that reason rather than failing the suite; KVGATE_REQUIRE_PERF=0 skips it outright.
if [ "${KVGATE_REQUIRE_PERF:-1}" = 1 ] && scripts/flamegraph.sh --setup; then
  export KVGATE_REQUIRE_PERF=1
else
  echo "warning: perf cannot profile here; tests/flamegraph.rs is skipped" >&2
  export KVGATE_REQUIRE_PERF=0
fi
KVGATE_REQUIRE_TOKENIZER_FIXTURES=1 KVGATE_REQUIRE_PYTHON_COMPAT=1 KVGATE_REQUIRE_PROMTOOL=1 \
    KVGATE_REQUIRE_GRPC_PYTHON=1 KVGATE_REQUIRE_SDK_PYTHON=1 cargo test --workspace
step_done "cargo test"
# One short seed of the chaos test (about a minute; scripts/chaos.sh, bench-harness/src/chaos/),
# on the debug binaries built above; its abort probes check that a departed client's request
# gives its credit back at once.
scripts/chaos.sh 20 --minutes 0.75 --fault-every-s 1.5
step_done "the chaos seed"
if ! wait "$prebuild"; then
  cat "$prebuild_log" >&2
  echo "test.sh: building the sanitizer or fuzz pass failed (log above)" >&2
  exit 1
fi
step_done "waiting for the sanitizer and fuzz builds"
# The index's unsafe code under AddressSanitizer (needs nightly; skipped with a note without it).
scripts/test-sanitized.sh
step_done "the sanitizer pass"
# Each fuzz target for 30 s, two at a time on two cores (needs nightly; skipped with a note
# without it). Installs cargo-fuzz under target/ on first use.
FUZZ_JOBS=2 scripts/fuzz.sh 30
step_done "the fuzz pass"
