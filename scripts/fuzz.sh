#!/usr/bin/env bash
# Runs the libFuzzer targets of fuzz/ (cargo-fuzz; see ARCHITECTURE.md, "Fuzzing") one after the
# other, each for SECONDS (default 60), and prints one line per target: executions, executions
# per second, corpus size, and whether it crashed.
#
#   scripts/fuzz.sh [SECONDS] [TARGET...]     (targets: http_head chunked routing_header body
#                                               kv_events bpe; all of them by default; bpe
#                                               compares only where scripts/fetch-tokenizers.sh
#                                               has run, and accepts everything elsewhere)
#   FUZZ_RUNS=10000000 scripts/fuzz.sh 1800 body   (stop at 10M executions, or 30 min)
#   FUZZ_MAX_LEN=4096 scripts/fuzz.sh 600 bpe      (inputs of at most 4 KiB; default 64 KiB)
#
# Each target starts from its committed seeds (fuzz/corpus/TARGET/) plus what earlier runs here
# found (target/fuzz/corpus/TARGET/, where new inputs go, so the committed seeds stay as they
# are). A crash (a panic: every target asserts its invariants) stops that target, leaves the
# input in target/fuzz/artifacts/TARGET/ and makes the script exit 1 after the other targets;
# replay it with
#   fuzz/target/x86_64-unknown-linux-gnu/release/TARGET target/fuzz/artifacts/TARGET/crash-...
# and turn it into a regression test in the main crate.
#
# Builds once with `cargo +nightly fuzz build` (release, debug assertions and overflow checks on,
# no sanitizer: the one `unsafe` the targets reach, the index's shared text buffer, runs under ASan
# in scripts/test-sanitized.sh, and ASan would halve the executions; 16
# codegen units, so the large crates build on both cores).
# Needs a nightly toolchain (libFuzzer's instrumentation is unstable); without one it says so
# and exits 0, so the normal suite still runs on a stable-only machine. cargo-fuzz itself is
# installed by scripts/fetch-cargo-fuzz.sh under target/ on first use.
# FUZZ_JOBS=N runs N targets at a time (default 1: one core each).
set -euo pipefail
cd "$(dirname "$0")/.."
seconds="${1:-60}"
shift || true
targets=("$@")
if [ ${#targets[@]} -eq 0 ]; then
    targets=(http_head chunked routing_header body kv_events bpe)
fi
if ! cargo +nightly --version >/dev/null 2>&1; then
    echo "fuzz: skipped, no nightly toolchain (rustup toolchain install nightly)" >&2
    exit 0
fi
PATH="$(scripts/fetch-cargo-fuzz.sh):$PATH"
triple="$(rustc -vV | sed -n 's/^host: //p')"
# One named target builds alone; otherwise all of them, in one cargo invocation.
only=()
if [ ${#targets[@]} -eq 1 ]; then only=("${targets[0]}"); fi
cargo +nightly fuzz build --sanitizer none --codegen-units 16 --target "$triple" "${only[@]}" >&2
# FUZZ_BUILD_ONLY=1: build and stop (scripts/test.sh builds at low priority during the tests).
if [ "${FUZZ_BUILD_ONLY:-0}" = 1 ]; then
    exit 0
fi
bin_dir="fuzz/target/$triple/release"
work="target/fuzz"

# One target: libFuzzer's final stats give the executions; the log stays in target/fuzz/logs/.
run_one() {
    local t="$1"
    mkdir -p "$work/corpus/$t" "$work/artifacts/$t" "$work/logs"
    local log="$work/logs/$t.log" rc=0
    local runs=()
    if [ -n "${FUZZ_RUNS:-}" ]; then runs=("-runs=$FUZZ_RUNS"); fi
    "$bin_dir/$t" "$work/corpus/$t" "fuzz/corpus/$t" \
        -max_total_time="$seconds" "${runs[@]}" -print_final_stats=1 \
        -artifact_prefix="$work/artifacts/$t/" -timeout=10 -rss_limit_mb=2048 \
        -max_len="${FUZZ_MAX_LEN:-65536}" >"$log" 2>&1 || rc=$?
    local execs secs corpus
    execs="$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)"
    secs="$(sed -n 's/^Done [0-9]* runs in \([0-9]*\) second.*/\1/p' "$log" | tail -1)"
    corpus="$(find "$work/corpus/$t" "fuzz/corpus/$t" -type f | wc -l)"
    if [ "$rc" -ne 0 ]; then
        echo "fuzz: $t CRASHED (exit $rc) after ${execs:-?} executions; input and log:" \
            "$(ls "$work/artifacts/$t"/* 2>/dev/null | tr '\n' ' ')$log"
        grep -m5 -E "panicked|ERROR|assert" "$log" || true
        return 1
    fi
    echo "fuzz: $t ok: ${execs:-?} executions in ${secs:-?} s" \
        "($(( ${execs:-0} / ( ${secs:-1} > 0 ? ${secs:-1} : 1 ) )) exec/s), corpus $corpus inputs"
}

failed=0
jobs_max="${FUZZ_JOBS:-1}"
pids=()
for t in "${targets[@]}"; do
    if [ "$jobs_max" -le 1 ]; then
        run_one "$t" || failed=1
    else
        run_one "$t" &
        pids+=($!)
        if [ ${#pids[@]} -ge "$jobs_max" ]; then
            wait "${pids[0]}" || failed=1
            pids=("${pids[@]:1}")
        fi
    fi
done
for pid in "${pids[@]}"; do wait "$pid" || failed=1; done
exit "$failed"
