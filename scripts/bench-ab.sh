#!/usr/bin/env bash
# Two kvgate builds side by side: both run at once (each pinned to CPU 1, one data core) in front
# of one sim-engine --instant (CPU 0); wrk (CPU 0) loads them in turn, ROUNDS times, 8 s each,
# with the chat bodies of scripts/bench-proxy.sh. Prints each run's req/s and the build's own
# CPU per request (utime+stime from /proc): a before/after figure that the box's noise disturbs
# less than two separate bench-proxy runs. Installs wrk with apt-get when missing.
#
# Usage: scripts/bench-ab.sh BEFORE_BIN AFTER_BIN [ROUNDS]   (default 5 rounds)
#        BENCH_BODY=36k scripts/bench-ab.sh ...              (36 KB bodies)
set -euo pipefail
cd "$(dirname "$0")/.."
BEFORE_BIN="$1"; AFTER_BIN="$2"; ROUNDS="${3:-5}"; BODY="${BENCH_BODY:-small}"
command -v wrk >/dev/null || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq wrk >/dev/null; }
cargo build --release -q -p bench-harness --bin sim-engine
WORK="$(mktemp -d)"; PIDS=()
cleanup() { for pid in "${PIDS[@]}"; do kill "$pid" 2>/dev/null || true; done; rm -rf "$WORK"; }
trap cleanup EXIT
taskset -c 0 target/release/sim-engine --engines 1 --base-port 22100 --instant --threads 1 >"$WORK/sim.log" 2>&1 &
PIDS+=($!)
start() { # bin port metrics_port
  taskset -c 1 "$1" --host 127.0.0.1 --port "$2" --prometheus-host 127.0.0.1 --prometheus-port "$3" \
    --data-cores 1 --log-level warn --worker-urls http://127.0.0.1:22100 >"$WORK/$2.log" 2>&1 &
  PIDS+=($!)
}
start "$BEFORE_BIN" 22001 22091; BEFORE_PID=${PIDS[-1]}
start "$AFTER_BIN" 22002 22092; AFTER_PID=${PIDS[-1]}
SYSTEM_WORDS=0; [ "$BODY" = 36k ] && SYSTEM_WORDS=3600
# The request bodies are bench-proxy.sh's (its wrk script, taken from between its heredoc marks).
{ echo "local system_words = $SYSTEM_WORDS"
  sed -n '/^cat >>"\$WORK\/chat.lua" <<.EOF.$/,/^EOF$/p' scripts/bench-proxy.sh | sed '1d;$d'
} >"$WORK/chat.lua"
sleep 2
ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }
run() { # name pid port
  local before after out n rps
  before=$(ticks "$2")
  out="$(taskset -c 0 wrk -t1 -c64 -d8s --latency -s "$WORK/chat.lua" "http://127.0.0.1:$3")"
  after=$(ticks "$2")
  n="$(awk '/requests in/ {print $1}' <<<"$out")"; rps="$(awk '/Requests\/sec/ {print $2}' <<<"$out")"
  awk -v name="$1" -v t=$((after - before)) -v hz="$(getconf CLK_TCK)" -v n="$n" -v rps="$rps" \
    'BEGIN {printf "%s %s req/s %.1f us/req\n", name, rps, t / hz * 1e6 / n}'
}
echo "# $BODY bodies, $(date -u +%FT%TZ), load average $(cut -d' ' -f1-3 /proc/loadavg)"
for _ in $(seq "$ROUNDS"); do run before "$BEFORE_PID" 22001; run after "$AFTER_PID" 22002; done
