#!/usr/bin/env bash
# Scaling run for a many-core machine: kvgate (N data cores, default cache_aware routing) vs nginx
# (N workers, upstream keepalive) in front of the same sim-engine (--instant), for N = 1 2 4 8,
# alternating kvgate and nginx at each N. Layout as in ../shared/BENCHMARKING.md: sim-engine on
# CPUs 0-3, wrk on CPUs 4-7, the proxy under test on CPUs 8..8+N-1. Needs 16 CPUs.
#
# It builds nothing: it runs prebuilt binaries, so it also runs on a machine without cargo.
#   KVGATE=target/release/kvgate SIM=target/release/sim-engine FLEET=target/release/fleet \
#     WRK=wrk NGINX=nginx scripts/bench-scaling.sh [CORE_COUNTS...]
# Prints one line per run and, per N, the ratio kvgate/nginx; small (~250 B) chat bodies at every
# N, and 36 KB bodies (a shared ~8k-word system prompt) at N=1.
# FLOOR=target/release/examples/floor_proxy (`cargo build --release --example floor_proxy`) adds
# the floor at N=1: a one-core monoio proxy that only relays bytes (perf/floor_proxy.rs), the
# ceiling of kvgate's ratio to nginx on the machine.
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=lib/fleet.sh
source scripts/lib/fleet.sh
# shellcheck source=lib/wrk.sh
source scripts/lib/wrk.sh
KVGATE="${KVGATE:-target/release/kvgate}"
SIM="${SIM:-target/release/sim-engine}"
FLEET_TOOL="${FLEET:-target/release/fleet}"
WRK="${WRK:-wrk}"
NGINX="${NGINX:-nginx}"
FLOOR="${FLOOR:-}"
DURATION="${BENCH_DURATION:-8s}"
CONNECTIONS="${BENCH_CONNECTIONS:-256}"
COUNTS=("$@"); [ ${#COUNTS[@]} -gt 0 ] || COUNTS=(1 2 4 8)
[ "$(nproc)" -ge 16 ] || { echo "Error: bench-scaling.sh needs 16 CPUs, this machine has $(nproc)" >&2; exit 1; }

fleet_init "$(dirname "$FLEET_TOOL")"
WORK="$FLEET_WORK"
read -r SIM_PORT KVGATE_PORT NGINX_PORT FLOOR_PORT < <(fleet_ports 1 2 1 1)
METRICS_PORT=$((KVGATE_PORT + 1))
FLEET_PIN=0-3 fleet_start_sim "$SIM" "$SIM_PORT" --engines 1 --instant --threads 4

start_kvgate() { # cores
  FLEET_PIN="8-$((8 + $1 - 1))" FLEET_DATA_CORES="$1" fleet_start_kvgate "$KVGATE" "$KVGATE_PORT" \
    "$METRICS_PORT" "http://127.0.0.1:$SIM_PORT"
  fleet_wait_port kvgate "$KVGATE_PORT"; sleep 1
}
start_nginx() { # workers
  FLEET_PIN="8-$((8 + $1 - 1))" fleet_start_nginx "$NGINX" "$NGINX_PORT" "$SIM_PORT" "$1" 8192 \
    "worker_cpu_affinity auto;"
  fleet_wait_port nginx "$NGINX_PORT"
}
start_floor() {
  FLEET_PIN=8 fleet_start floor "$FLOOR" "127.0.0.1:$FLOOR_PORT" "127.0.0.1:$SIM_PORT"
  FLOOR_PID=$FLEET_PID
  fleet_wait_port floor "$FLOOR_PORT"
}
stop() { kill "$1" 2>/dev/null || true; wait "$1" 2>/dev/null || true; sleep 0.5; }

wrk_chat_script "$WORK/chat-0.lua" 0 w; wrk_chat_script "$WORK/chat-6000.lua" 6000 w
SMALL="$WORK/chat-0.lua"; LARGE="$WORK/chat-6000.lua"

run() { # system cores port script label
  wrk_read "$(taskset -c 4-7 "$WRK" -t4 -c"$CONNECTIONS" -d"$DURATION" --latency -s "$4" "http://127.0.0.1:$3")"
  echo "$5 $1 cores=$2 req/s=$WRK_RPS p50=$WRK_P50 p99=$WRK_P99 non2xx=$WRK_NON2XX"
  echo "$5 $1 $2 $WRK_RPS" >>"$WORK/results"
}

fleet_wait_port sim-engine "$SIM_PORT"
echo "# wrk -t4 -c$CONNECTIONS -d$DURATION; sim-engine --instant on CPUs 0-3; wrk on 4-7; proxy on 8..; $(nproc) CPUs"
for n in "${COUNTS[@]}"; do
  rounds=1; [ "$n" = 1 ] && rounds=2
  for _ in $(seq $rounds); do
    start_kvgate "$n"; run kvgate "$n" "$KVGATE_PORT" "$SMALL" small
    [ "$n" = 1 ] && run kvgate "$n" "$KVGATE_PORT" "$LARGE" 36KB
    stop "$KVGATE_PID"
    start_nginx "$n"; run nginx "$n" "$NGINX_PORT" "$SMALL" small
    [ "$n" = 1 ] && run nginx "$n" "$NGINX_PORT" "$LARGE" 36KB
    stop "$NGINX_PID"
    if [ "$n" = 1 ] && [ -n "$FLOOR" ]; then
      start_floor; run floor 1 "$FLOOR_PORT" "$SMALL" small; run floor 1 "$FLOOR_PORT" "$LARGE" 36KB
      stop "$FLOOR_PID"
    fi
  done
done
echo "# ratios kvgate/nginx (mean req/s per workload and N)"
mean_rps() { # label system cores -> mean req/s of those runs (empty when there are none)
  local label system cores rps values=()
  while read -r label system cores rps; do
    if [ "$label $system $cores" = "$1 $2 $3" ]; then values+=("$rps"); fi
  done <"$WORK/results"
  [ ${#values[@]} -eq 0 ] || fleet_stats mean "${values[@]}"
}
while read -r label cores; do
  n="$(mean_rps "$label" nginx "$cores")"
  echo "$label $cores kvgate/nginx $(fleet_stats --decimals 2 ratio "$(mean_rps "$label" kvgate "$cores")" "$n")"
  f="$(mean_rps "$label" floor "$cores")"
  if [ -n "$f" ]; then echo "$label $cores floor/nginx $(fleet_stats --decimals 2 ratio "$f" "$n")"; fi
done < <(while read -r label _ cores _; do echo "$label $cores"; done <"$WORK/results" | sort -u) |
  sort -k1,1 -k2,2n
