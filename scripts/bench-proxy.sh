#!/usr/bin/env bash
# Proxy throughput: kvgate (1 data core) vs nginx (1 worker, upstream keepalive) in front of the
# same sim-engine (--instant), small non-streaming chat bodies, wrk -t1 -c64 -d8s --latency,
# alternating A B A B (settings: ../shared/BENCHMARKING.md). Prints one line per run and the
# ratio of the medians. Installs wrk and nginx-light with apt-get when missing.
#
# Pinning (BENCH_PIN=1, the default on 2+ cores): the proxy under test (kvgate or nginx) runs on
# CPU 1, wrk and sim-engine on CPU 0, so both proxies get the same CPU and neither competes with
# the load generator. BENCH_PIN=0 runs everything unpinned (the whole-box figure; kvgate still
# pins its own data core inside its process).
#
# Besides req/s and latency (which swing with whatever else runs on the box), each run reports
# the proxy's own CPU time per request (utime+stime of its processes from /proc, divided by the
# requests wrk completed): a cost figure that other load on the machine disturbs far less.
# Pinned, it also reports how busy each CPU was during the run and the hypervisor's steal time
# (/proc/stat): when CPU 0 (wrk and sim-engine) is full, the load generator, not the proxy, sets
# req/s.
#
# Usage: scripts/bench-proxy.sh [ROUNDS]   (default 3 rounds = A B A B A B)
#        BENCH_BODY=36k scripts/bench-proxy.sh   (36 KB bodies sharing one system prompt)
#        KVGATE_BIN=path/to/kvgate scripts/bench-proxy.sh   (another build, e.g. a baseline)
#        BENCH_FLOOR=1 scripts/bench-proxy.sh   (adds the floor: perf/floor_proxy.rs, a monoio
#          proxy that only relays bytes, on kvgate's ring setup; its ratio to nginx is the ceiling
#          of kvgate's on this host)
#        BENCH_PREBUILT=1 scripts/bench-proxy.sh   (target/release's binaries as they are, not
#          rebuilt: `cargo build -p` resolves features apart from a `--workspace` build and can
#          rebuild the dependencies)
#        BENCH_TLS=1 scripts/bench-proxy.sh   (adds kvgate-tls and nginx-tls: the same proxies
#          with TLS 1.3 on their client port (a self-signed P-256 certificate made with openssl;
#          nginx with ssl_session_cache), wrk over https, in the same rounds as the plain ones:
#          the cost of TLS per request, side by side)
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=lib/fleet.sh
source scripts/lib/fleet.sh
# shellcheck source=lib/wrk.sh
source scripts/lib/wrk.sh
ROUNDS="${1:-3}"
DURATION="${BENCH_DURATION:-8s}"
CONNECTIONS="${BENCH_CONNECTIONS:-64}"
PIN="${BENCH_PIN:-$([ "$(nproc)" -ge 2 ] && echo 1 || echo 0)}"
LOADGEN=(); LOADGEN_CPU=""; PROXY_CPU=""
if [ "$PIN" = 1 ]; then LOADGEN=(taskset -c 0); LOADGEN_CPU=0; PROXY_CPU=1; fi

if ! command -v wrk >/dev/null || ! command -v nginx >/dev/null; then
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq wrk nginx-light >/dev/null
fi
PREBUILT="${BENCH_PREBUILT:-0}"
[ "$PREBUILT" = 1 ] || cargo build --release -q -p kvgate --bin kvgate
KVGATE_BIN="${KVGATE_BIN:-target/release/kvgate}"
[ "$PREBUILT" = 1 ] || cargo build --release -q -p bench-harness --bin sim-engine --bin fleet
FLOOR="${BENCH_FLOOR:-0}"
TLS="${BENCH_TLS:-0}"
SYSTEMS=(kvgate nginx)
if [ "$FLOOR" = 1 ]; then
  [ "$PREBUILT" = 1 ] || cargo build --release -q -p kvgate --example floor_proxy
  SYSTEMS+=(floor)
fi
[ "$TLS" = 1 ] && SYSTEMS+=(kvgate-tls nginx-tls)

fleet_init target/release
WORK="$FLEET_WORK"
read -r SIM_PORT KVGATE_PORT NGINX_PORT FLOOR_PORT KVGATE_TLS_PORT NGINX_TLS_PORT < <(fleet_ports 1 2 1 1 2 1)
METRICS_PORT=$((KVGATE_PORT + 1))
FLEET_PIN="$LOADGEN_CPU" fleet_start_sim target/release "$SIM_PORT" --engines 1 --instant --threads 1
FLEET_PIN="$PROXY_CPU" fleet_start_kvgate "$KVGATE_BIN" "$KVGATE_PORT" "$METRICS_PORT" \
  "http://127.0.0.1:$SIM_PORT"
KVGATE_PLAIN_PID=$KVGATE_PID KVGATE_TLS_PID=""
if [ "$TLS" = 1 ]; then
  openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 1 -subj /CN=localhost \
    -addext subjectAltName=DNS:localhost,IP:127.0.0.1 \
    -keyout "$WORK/key.pem" -out "$WORK/cert.pem" 2>/dev/null
  FLEET_PIN="$PROXY_CPU" fleet_start_kvgate "$KVGATE_BIN" "$KVGATE_TLS_PORT" $((KVGATE_TLS_PORT + 1)) \
    "http://127.0.0.1:$SIM_PORT" --tls-cert-path "$WORK/cert.pem" --tls-key-path "$WORK/key.pem"
  KVGATE_TLS_PID=$KVGATE_PID
  export FLEET_NGINX_TLS="$NGINX_TLS_PORT $WORK/cert.pem $WORK/key.pem"
fi
KVGATE_PID=$KVGATE_PLAIN_PID

FLEET_PIN="$PROXY_CPU" fleet_start_nginx nginx "$NGINX_PORT" "$SIM_PORT" 1 4096
FLOOR_PID=""
if [ "$FLOOR" = 1 ]; then
  FLEET_PIN="$PROXY_CPU" fleet_start floor target/release/examples/floor_proxy \
    "127.0.0.1:$FLOOR_PORT" "127.0.0.1:$SIM_PORT"
  FLOOR_PID=$FLEET_PID
fi

# Several distinct chat bodies, cycled per request: small (~250 B), or with BENCH_BODY=36k a
# shared system prompt of about 36 KB (~9k words) before each distinct question.
SYSTEM_WORDS=0; [ "${BENCH_BODY:-small}" = 36k ] && SYSTEM_WORDS=3600
wrk_chat_script "$WORK/chat.lua" "$SYSTEM_WORDS" keeper

fleet_wait_port sim-engine "$SIM_PORT"
fleet_wait_port kvgate "$KVGATE_PORT"
fleet_wait_port nginx "$NGINX_PORT"
[ -z "$FLOOR_PID" ] || fleet_wait_port floor "$FLOOR_PORT"
# kvgate-tls answers only HTTPS: its plain metrics port says it is up.
[ -z "$KVGATE_TLS_PID" ] || fleet_wait kvgate-tls "http://127.0.0.1:$((KVGATE_TLS_PORT + 1))/metrics"
sleep 1  # let kvgate's control core fetch /v1/models once

proxy_pids() { # system -> its pids (nginx: master and workers)
  case "$1" in
    kvgate) echo "$KVGATE_PID" ;;
    kvgate-tls) echo "$KVGATE_TLS_PID" ;;
    floor) echo "$FLOOR_PID" ;;
    *) echo "$NGINX_PID" $(pgrep -P "$NGINX_PID") ;;
  esac
}

busy_shares() { # times_before times_after ("busy total steal" of CPU 0, then of CPU 1) -> "cpu0_busy% cpu1_busy% steal%"
  local x y
  read -ra x <<<"$1"; read -ra y <<<"$2"
  printf '%s%% %s%% %s%%' "$(fleet_stats --decimals 0 share $((y[0] - x[0])) $((y[1] - x[1])))" \
    "$(fleet_stats --decimals 0 share $((y[3] - x[3])) $((y[4] - x[4])))" \
    "$(fleet_stats --decimals 0 share $((y[2] - x[2] + y[5] - x[5])) $((y[1] - x[1] + y[4] - x[4])))"
}

run() { # name port -> "name req/s p50 p99 non2xx cpu_us_per_req [cpu0_busy cpu1_busy steal]"
  local out pids before after times_before times_after scheme=http
  case "$1" in *-tls) scheme=https ;; esac
  pids="$(proxy_pids "$1")"
  before="$(fleet_cpu_us $pids)"; times_before="$(fleet_host_cpu 0 1)"
  out="$("${LOADGEN[@]}" wrk -t1 -c"$CONNECTIONS" -d"$DURATION" --latency -s "$WORK/chat.lua" "$scheme://127.0.0.1:$2")"
  after="$(fleet_cpu_us $pids)"; times_after="$(fleet_host_cpu 0 1)"
  wrk_read "$out"
  local cpu_us
  cpu_us="$(fleet_stats --decimals 1 ratio $((after - before)) "$WRK_REQUESTS")"
  local shares=""
  [ "$PIN" = 1 ] && shares=" $(busy_shares "$times_before" "$times_after")"
  echo "$1 $WRK_RPS $WRK_P50 $WRK_P99 $WRK_NON2XX $cpu_us$shares"
}

echo "# wrk -t1 -c$CONNECTIONS -d$DURATION --latency, ${BENCH_BODY:-small} chat bodies, sim-engine --instant, pin=$PIN"
echo "# load average before: $(cut -d' ' -f1-3 /proc/loadavg)"
echo "# system req/s p50 p99 non2xx cpu_us_per_req$([ "$PIN" = 1 ] && echo " cpu0_busy cpu1_busy steal")"
RESULTS=()
for _ in $(seq "$ROUNDS"); do
  for system in "${SYSTEMS[@]}"; do
    case "$system" in
      kvgate) port=$KVGATE_PORT ;; nginx) port=$NGINX_PORT ;; floor) port=$FLOOR_PORT ;;
      kvgate-tls) port=$KVGATE_TLS_PORT ;; nginx-tls) port=$NGINX_TLS_PORT ;;
    esac
    line="$(run "$system" "$port")"
    echo "$line"
    RESULTS+=("$line")
  done
done
median() { # system column -> median of that column over the system's runs
  local line fields values=()
  for line in "${RESULTS[@]}"; do
    read -ra fields <<<"$line"
    if [ "${fields[0]}" = "$1" ]; then values+=("${fields[$2 - 1]}"); fi
  done
  fleet_stats median "${values[@]}"
}
ratio() { fleet_stats --decimals 2 ratio "$1" "$2"; }
K="$(median kvgate 2)"; N="$(median nginx 2)"
echo "median req/s: kvgate $(fleet_round 0 "$K"), nginx $(fleet_round 0 "$N"), ratio kvgate/nginx $(ratio "$K" "$N")"
KC="$(median kvgate 6)"; NC="$(median nginx 6)"
echo "median proxy CPU us/request: kvgate $(fleet_round 1 "$KC"), nginx $(fleet_round 1 "$NC"), ratio nginx/kvgate $(ratio "$NC" "$KC")"
if [ "$FLOOR" = 1 ]; then
  F="$(median floor 2)"; FC="$(median floor 6)"
  echo "median req/s: floor $(fleet_round 0 "$F"), ratio floor/nginx $(ratio "$F" "$N"), kvgate/floor $(ratio "$K" "$F")"
  echo "median proxy CPU us/request: floor $(fleet_round 1 "$FC"), ratio floor/nginx $(ratio "$FC" "$NC"), kvgate/floor $(ratio "$KC" "$FC")"
fi
if [ "$TLS" = 1 ]; then
  KT="$(median kvgate-tls 2)"; NT="$(median nginx-tls 2)"
  KTC="$(median kvgate-tls 6)"; NTC="$(median nginx-tls 6)"
  echo "median req/s over TLS: kvgate $(fleet_round 0 "$KT"), nginx $(fleet_round 0 "$NT"), ratio kvgate/nginx $(ratio "$KT" "$NT")"
  echo "median proxy CPU us/request over TLS: kvgate $(fleet_round 1 "$KTC"), nginx $(fleet_round 1 "$NTC"), ratio nginx/kvgate $(ratio "$NTC" "$KTC")"
  echo "TLS/plain CPU us/request: kvgate $(ratio "$KTC" "$KC"), nginx $(ratio "$NTC" "$NC")"
fi
echo "# load average after: $(cut -d' ' -f1-3 /proc/loadavg)"
