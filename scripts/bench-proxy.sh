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
set -euo pipefail
cd "$(dirname "$0")/.."
ROUNDS="${1:-3}"
DURATION="${BENCH_DURATION:-8s}"
CONNECTIONS="${BENCH_CONNECTIONS:-64}"
PIN="${BENCH_PIN:-$([ "$(nproc)" -ge 2 ] && echo 1 || echo 0)}"
LOADGEN=(); PROXY=()
if [ "$PIN" = 1 ]; then LOADGEN=(taskset -c 0); PROXY=(taskset -c 1); fi

if ! command -v wrk >/dev/null || ! command -v nginx >/dev/null; then
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq wrk nginx-light >/dev/null
fi
cargo build --release -q -p kvgate --bin kvgate
KVGATE_BIN="${KVGATE_BIN:-target/release/kvgate}"
cargo build --release -q -p bench-harness --bin sim-engine
FLOOR="${BENCH_FLOOR:-0}"
SYSTEMS=(kvgate nginx)
if [ "$FLOOR" = 1 ]; then
  cargo build --release -q -p kvgate --example floor_proxy
  SYSTEMS+=(floor)
fi

WORK="$(mktemp -d)"
PIDS=()
cleanup() { for pid in "${PIDS[@]}"; do kill "$pid" 2>/dev/null || true; done; rm -rf "$WORK"; }
trap cleanup EXIT

# Below the ephemeral range (32768+), so an outgoing connection never holds one of them.
SIM_PORT=21100; KVGATE_PORT=21000; NGINX_PORT=21001; FLOOR_PORT=21002; METRICS_PORT=21099
"${LOADGEN[@]}" target/release/sim-engine --engines 1 --base-port "$SIM_PORT" --instant --threads 1 >"$WORK/sim.log" 2>&1 &
PIDS+=($!)
"${PROXY[@]}" "$KVGATE_BIN" --host 127.0.0.1 --port "$KVGATE_PORT" --prometheus-host 127.0.0.1 \
  --prometheus-port "$METRICS_PORT" --data-cores 1 --log-level warn \
  --worker-urls "http://127.0.0.1:$SIM_PORT" >"$WORK/kvgate.log" 2>&1 &
PIDS+=($!)

mkdir -p "$WORK/nginx/logs"
cat >"$WORK/nginx/nginx.conf" <<EOF
worker_processes 1;
pid $WORK/nginx/nginx.pid;
error_log $WORK/nginx/logs/error.log warn;
events { worker_connections 4096; }
http {
  access_log off;
  client_body_temp_path $WORK/nginx/body; proxy_temp_path $WORK/nginx/proxy;
  fastcgi_temp_path $WORK/nginx/fastcgi; uwsgi_temp_path $WORK/nginx/uwsgi; scgi_temp_path $WORK/nginx/scgi;
  keepalive_requests 1000000;
  client_body_buffer_size 128k;
  upstream sim { server 127.0.0.1:$SIM_PORT; keepalive 256; }
  server {
    listen 127.0.0.1:$NGINX_PORT reuseport;
    location / {
      proxy_pass http://sim;
      proxy_http_version 1.1;
      proxy_set_header Connection "";
      proxy_buffering off;
    }
  }
}
EOF
"${PROXY[@]}" nginx -p "$WORK/nginx" -c "$WORK/nginx/nginx.conf" -g "daemon off;" &
PIDS+=($!)
KVGATE_PID="${PIDS[1]}"; NGINX_PID="${PIDS[2]}"; FLOOR_PID=""
if [ "$FLOOR" = 1 ]; then
  "${PROXY[@]}" target/release/examples/floor_proxy "127.0.0.1:$FLOOR_PORT" "127.0.0.1:$SIM_PORT" \
    >"$WORK/floor.log" 2>&1 &
  PIDS+=($!); FLOOR_PID=$!
fi

# Several distinct chat bodies, cycled per request: small (~250 B), or with BENCH_BODY=36k a
# shared system prompt of about 36 KB (~9k words) before each distinct question.
SYSTEM_WORDS=0; [ "${BENCH_BODY:-small}" = 36k ] && SYSTEM_WORDS=3600
echo "local system_words = $SYSTEM_WORDS" >"$WORK/chat.lua"
cat >>"$WORK/chat.lua" <<'EOF'
wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"
local words = {}
for i = 1, system_words do words[i] = "keeper" .. (i % 997) end
local system = "You are a helpful assistant. " .. table.concat(words, " ")
local bodies = {}
for i = 1, 16 do
  bodies[i] = string.format('{"model":"sim-model","messages":[{"role":"system","content":"%s"},{"role":"user","content":"Question %d: summarize the plot of a short story about a lighthouse keeper in one sentence."}],"max_tokens":8}', system, i)
end
local n = 0
request = function()
  n = n % #bodies + 1
  return wrk.format(nil, "/v1/chat/completions", nil, bodies[n])
end
EOF

for port in "$SIM_PORT" "$KVGATE_PORT" "$NGINX_PORT" ${FLOOR_PID:+"$FLOOR_PORT"}; do
  for _ in $(seq 100); do (echo >/dev/tcp/127.0.0.1/"$port") 2>/dev/null && break; sleep 0.1; done
done
sleep 1  # let kvgate's control core fetch /v1/models once

cpu_ticks() { # pids... -> summed utime+stime clock ticks
  local total=0 pid
  for pid in "$@"; do
    total=$((total + $(awk '{print $14 + $15}' "/proc/$pid/stat")))
  done
  echo "$total"
}
proxy_pids() { # system -> its pids (nginx: master and workers)
  case "$1" in
    kvgate) echo "$KVGATE_PID" ;;
    floor) echo "$FLOOR_PID" ;;
    *) echo "$NGINX_PID" $(pgrep -P "$NGINX_PID") ;;
  esac
}

cpu_times() { # -> "busy total steal" jiffies of CPU 0, then of CPU 1 (/proc/stat)
  awk '$1 == "cpu0" || $1 == "cpu1" {printf "%d %d %d ", $2 + $3 + $4 + $7 + $8, $2 + $3 + $4 + $5 + $6 + $7 + $8 + $9, $9}' /proc/stat
}
busy_shares() { # times_before times_after -> "cpu0_busy% cpu1_busy% steal%"
  awk -v a="$1" -v b="$2" 'BEGIN {
    split(a, x, " "); split(b, y, " ")
    total = y[2] - x[2] + y[5] - x[5]
    printf "%.0f%% %.0f%% %.0f%%", 100 * (y[1] - x[1]) / (y[2] - x[2]), 100 * (y[4] - x[4]) / (y[5] - x[5]),
      100 * (y[3] - x[3] + y[6] - x[6]) / total
  }'
}

run() { # name port -> "name req/s p50 p99 non2xx cpu_us_per_req [cpu0_busy cpu1_busy steal]"
  local out pids before after times_before times_after
  pids="$(proxy_pids "$1")"
  before="$(cpu_ticks $pids)"; times_before="$(cpu_times)"
  out="$("${LOADGEN[@]}" wrk -t1 -c"$CONNECTIONS" -d"$DURATION" --latency -s "$WORK/chat.lua" "http://127.0.0.1:$2")"
  after="$(cpu_ticks $pids)"; times_after="$(cpu_times)"
  local rps p50 p99 non2xx requests
  rps="$(awk '/Requests\/sec/ {print $2}' <<<"$out")"
  p50="$(awk '$1=="50%" {print $2}' <<<"$out")"
  p99="$(awk '$1=="99%" {print $2}' <<<"$out")"
  non2xx="$(awk '/Non-2xx/ {print $4}' <<<"$out")"
  requests="$(awk '/requests in/ {print $1}' <<<"$out")"
  local cpu_us
  cpu_us="$(awk -v t=$((after - before)) -v hz="$(getconf CLK_TCK)" -v n="$requests" 'BEGIN {printf "%.1f", t / hz * 1e6 / n}')"
  local shares=""
  [ "$PIN" = 1 ] && shares=" $(busy_shares "$times_before" "$times_after")"
  echo "$1 $rps $p50 $p99 ${non2xx:-0} $cpu_us$shares"
}

echo "# wrk -t1 -c$CONNECTIONS -d$DURATION --latency, ${BENCH_BODY:-small} chat bodies, sim-engine --instant, pin=$PIN"
echo "# load average before: $(cut -d' ' -f1-3 /proc/loadavg)"
echo "# system req/s p50 p99 non2xx cpu_us_per_req$([ "$PIN" = 1 ] && echo " cpu0_busy cpu1_busy steal")"
RESULTS=()
for _ in $(seq "$ROUNDS"); do
  for system in "${SYSTEMS[@]}"; do
    case "$system" in kvgate) port=$KVGATE_PORT ;; nginx) port=$NGINX_PORT ;; floor) port=$FLOOR_PORT ;; esac
    line="$(run "$system" "$port")"
    echo "$line"
    RESULTS+=("$line")
  done
done
median() { # system column -> median of that column over the system's runs
  printf '%s\n' "${RESULTS[@]}" | awk -v s="$1" -v c="$2" '$1 == s {print $c}' | sort -n |
    awk '{v[NR] = $1} END {print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2}'
}
K="$(median kvgate 2)"; N="$(median nginx 2)"
awk -v k="$K" -v n="$N" 'BEGIN {printf "median req/s: kvgate %.0f, nginx %.0f, ratio kvgate/nginx %.2f\n", k, n, k / n}'
KC="$(median kvgate 6)"; NC="$(median nginx 6)"
awk -v k="$KC" -v n="$NC" 'BEGIN {printf "median proxy CPU us/request: kvgate %.1f, nginx %.1f, ratio nginx/kvgate %.2f\n", k, n, n / k}'
if [ "$FLOOR" = 1 ]; then
  F="$(median floor 2)"; FC="$(median floor 6)"
  awk -v f="$F" -v n="$N" -v k="$K" 'BEGIN {printf "median req/s: floor %.0f, ratio floor/nginx %.2f, kvgate/floor %.2f\n", f, f / n, k / f}'
  awk -v f="$FC" -v n="$NC" -v k="$KC" 'BEGIN {printf "median proxy CPU us/request: floor %.1f, ratio floor/nginx %.2f, kvgate/floor %.2f\n", f, f / n, k / f}'
fi
echo "# load average after: $(cut -d' ' -f1-3 /proc/loadavg)"
