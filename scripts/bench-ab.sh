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
# shellcheck source=lib/fleet.sh
source scripts/lib/fleet.sh
# shellcheck source=lib/wrk.sh
source scripts/lib/wrk.sh
BEFORE_BIN="$1"; AFTER_BIN="$2"; ROUNDS="${3:-5}"; BODY="${BENCH_BODY:-small}"
command -v wrk >/dev/null || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq wrk >/dev/null; }
cargo build --release -q -p bench-harness --bin sim-engine --bin fleet
fleet_init target/release
WORK="$FLEET_WORK"
read -r SIM_PORT BEFORE_PORT AFTER_PORT < <(fleet_ports 1 2 2)
FLEET_PIN=0 fleet_start_sim target/release "$SIM_PORT" --engines 1 --instant --threads 1
start() { # name bin port (metrics on port + 1)
  FLEET_PIN=1 fleet_start "$1" "$2" --host 127.0.0.1 --port "$3" --prometheus-host 127.0.0.1 \
    --prometheus-port $(($3 + 1)) --data-cores 1 --log-level warn \
    --worker-urls "http://127.0.0.1:$SIM_PORT"
}
start before "$BEFORE_BIN" "$BEFORE_PORT"; BEFORE_PID=$FLEET_PID
start after "$AFTER_BIN" "$AFTER_PORT"; AFTER_PID=$FLEET_PID
SYSTEM_WORDS=0; [ "$BODY" = 36k ] && SYSTEM_WORDS=3600
# The request bodies are bench-proxy.sh's.
wrk_chat_script "$WORK/chat.lua" "$SYSTEM_WORDS" keeper
fleet_wait_port sim-engine "$SIM_PORT"
fleet_wait_port before "$BEFORE_PORT"
fleet_wait_port after "$AFTER_PORT"
sleep 1  # let each kvgate's control core fetch /v1/models once
run() { # name pid port
  local before after
  before=$(fleet_cpu_us "$2")
  wrk_read "$(taskset -c 0 wrk -t1 -c64 -d8s --latency -s "$WORK/chat.lua" "http://127.0.0.1:$3")"
  after=$(fleet_cpu_us "$2")
  echo "$1 $WRK_RPS req/s $(fleet_stats --decimals 1 ratio $((after - before)) "$WRK_REQUESTS") us/req"
}
echo "# $BODY bodies, $(date -u +%FT%TZ), load average $(cut -d' ' -f1-3 /proc/loadavg)"
for _ in $(seq "$ROUNDS"); do run before "$BEFORE_PID" "$BEFORE_PORT"; run after "$AFTER_PID" "$AFTER_PORT"; done
