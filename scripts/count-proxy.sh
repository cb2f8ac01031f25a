#!/usr/bin/env bash
# User-space instructions per proxied request, counted by valgrind's callgrind: kvgate (one data
# core), nginx (one worker, master_process off) and the floor (perf/floor_proxy.rs) in front of
# the same sim-engine (--instant, not counted), each driven through COUNT and then 2*COUNT
# non-streaming chat requests over one keep-alive connection; the difference divided by COUNT is
# the cost of one request, start-up and shutdown cancelled. Unlike CPU time, the figure does not
# move with what else runs on the host, so it compares builds and proxies fairly on a busy
# 2-CPU machine (issue 41).
#
# Under valgrind io_uring is refused, so kvgate runs on its epoll fallback (its log says so):
# the count is that path's, the same in every build compared, not the io_uring path's.
#
# kvgate's threads are counted apart (callgrind --separate-threads): `data` is the data core's
# thread (the one whose count grows most with the requests: it does the request path), `other`
# the rest of the process (the control core applying each dispatch record to the index, plus its
# 10 ms turns, which grow with the run's length under valgrind rather than with the requests).
# kvgate's figure is their sum, the whole process, as nginx's and the floor's are.
#
# Usage: scripts/count-proxy.sh [BODY...]   (bodies: small, 36k; default both)
#        COUNT=200 scripts/count-proxy.sh small
#        KVGATE_BIN=path/to/kvgate scripts/count-proxy.sh   (another build, e.g. a baseline)
#        COUNT_SYSTEMS="kvgate" scripts/count-proxy.sh   (only some of kvgate nginx floor; the
#          floor is not in the default: its runtime is io_uring only, which valgrind does not run)
#        SKIP_BUILD=1 FLOOR_BIN=... scripts/count-proxy.sh   (use target/release as it is)
# Prints one line per system and body, the top functions of kvgate's data core per body, and
# last one line a script can read:
#   instructions per request kvgate/nginx: small R1, 36k R2
# Installs valgrind and nginx-light with apt-get when missing.
set -euo pipefail
cd "$(dirname "$0")/.."
COUNT="${COUNT:-300}"
BODIES=("$@")
[ ${#BODIES[@]} -gt 0 ] || BODIES=(small 36k)
read -r -a SYSTEMS <<<"${COUNT_SYSTEMS:-kvgate nginx}"

if ! command -v valgrind >/dev/null || ! command -v nginx >/dev/null; then
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq valgrind nginx-light >/dev/null
fi
source scripts/lib/fleet.sh
if [ "${SKIP_BUILD:-0}" != 1 ]; then
  fleet_build release
  cargo build --release -q -p kvgate --example floor_proxy
fi
KVGATE_BIN="${KVGATE_BIN:-target/release/kvgate}"
FLOOR_BIN="${FLOOR_BIN:-target/release/examples/floor_proxy}"
fleet_init target/release
WORK="$FLEET_WORK"
read -r SIM_PORT PROXY_PORT METRICS_PORT < <(fleet_ports 1 1 1)
fleet_start_sim target/release "$SIM_PORT" --engines 1 --instant --threads 1
fleet_wait_port sim-engine "$SIM_PORT"
# nginx's configuration, written by fleet_start_nginx; the process itself is started under
# callgrind below, as one process (master_process off) with one worker.
fleet_start_nginx nginx "$PROXY_PORT" "$SIM_PORT" 1 1024 "master_process off;"
kill "$NGINX_PID"; wait "$NGINX_PID" 2>/dev/null || true

# The client: N chat requests over one keep-alive connection, 16 distinct bodies cycled (as
# bench-proxy.sh's), each answer read whole; fails on any non-200.
cat >"$WORK/client.py" <<'EOF'
import http.client, json, sys
port, n, body_kind = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
words = 3600 if body_kind == "36k" else 0
system = "You are a helpful assistant. " + " ".join("keeper%d" % (i % 997) for i in range(1, words + 1))
bodies = [json.dumps({"model": "sim-model", "messages": [
    {"role": "system", "content": system},
    {"role": "user", "content": "Question %d: summarize the plot of a short story about a lighthouse keeper in one sentence." % i}],
    "max_tokens": 8}).encode() for i in range(1, 17)]
conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
for i in range(n):
    conn.request("POST", "/v1/chat/completions", body=bodies[i % 16], headers={"Content-Type": "application/json"})
    r = conn.getresponse(); r.read()
    if r.status != 200:
        sys.exit("request %d: status %d" % (i, r.status))
EOF

start_system() { # system out_prefix -> starts it under callgrind, sets SYSTEM_PID
  local vg=(valgrind --tool=callgrind --callgrind-out-file="$2.%p")
  case "$1" in
    kvgate) "${vg[@]}" --separate-threads=yes "$KVGATE_BIN" --host 127.0.0.1 --port "$PROXY_PORT" \
        --prometheus-host 127.0.0.1 --prometheus-port "$METRICS_PORT" --data-cores 1 \
        --log-level warn --worker-urls "http://127.0.0.1:$SIM_PORT" >"$2.log" 2>&1 & ;;
    nginx) "${vg[@]}" nginx -p "$WORK/nginx" -c "$WORK/nginx/nginx.conf" -g "daemon off;" >"$2.log" 2>&1 & ;;
    floor) "${vg[@]}" "$FLOOR_BIN" "127.0.0.1:$PROXY_PORT" \
        "127.0.0.1:$SIM_PORT" >"$2.log" 2>&1 & ;;
  esac
  SYSTEM_PID=$!
}

# Runs `system` through n requests; prints "thread:instructions" for each counted thread (one
# line, threads in the order callgrind numbers them; a single-threaded process has one).
count() { # system body n
  local prefix="$WORK/$1-$2-$3"
  start_system "$1" "$prefix"
  FLEET_WAIT_S=120 fleet_wait "$1-$2-$3" "http://127.0.0.1:$PROXY_PORT/health" >/dev/null
  [ "$1" = kvgate ] && sleep 2 # its control core fetches /v1/models once before routing
  python3 "$WORK/client.py" "$PROXY_PORT" "$3" "$2"
  kill -TERM "$SYSTEM_PID" 2>/dev/null || true
  wait "$SYSTEM_PID" 2>/dev/null || true
  local file line=""
  for file in "$prefix".*; do
    case "$file" in *.log) continue ;; esac
    line+="${file##*-}:$(awk '/^(summary|totals):/ {print $2; exit}' "$file") "
  done
  echo "$line"
}

# "t1:a t2:b" (n) and "t1:c t2:d" (2n) -> per-request growth of each thread, largest first.
growth() { # once twice n
  awk -v once="$1" -v twice="$2" -v n="$3" 'BEGIN {
    split(once, a, " "); split(twice, b, " ")
    for (i in a) { split(a[i], p, ":"); before[p[1]] = p[2] }
    for (i in b) { split(b[i], p, ":"); printf "%s %d\n", p[1], (p[2] - before[p[1]]) / n }
  }' | sort -k2 -n -r
}

top_functions() { # callgrind file -> its ten costliest functions by self instructions
  callgrind_annotate --threshold=100 "$1" 2>/dev/null | awk '/^-+$/ {n++; next} n == 3 && NF' | head -10
}

declare -A PER_REQUEST
echo "# system body instructions_per_request (callgrind; $COUNT vs $((2 * COUNT)) requests, one connection)"
for body in "${BODIES[@]}"; do
  for system in "${SYSTEMS[@]}"; do
    once="$(count "$system" "$body" "$COUNT")"
    twice="$(count "$system" "$body" $((2 * COUNT)))"
    rows="$(growth "$once" "$twice" "$COUNT")"
    total="$(awk '{s += $2} END {print s}' <<<"$rows")"
    PER_REQUEST[$system-$body]=$total
    if [ "$system" = kvgate ]; then
      data="$(head -1 <<<"$rows")"
      echo "kvgate $body $total (data core $(cut -d' ' -f2 <<<"$data"), other threads $((total - $(cut -d' ' -f2 <<<"$data"))))"
      echo "# kvgate's data core, $body, top functions by self instructions over $((2 * COUNT)) requests:"
      top_functions "$WORK/kvgate-$body-$((2 * COUNT)).$(ls "$WORK" | grep "^kvgate-$body-$((2 * COUNT))\.[0-9]*-$(cut -d' ' -f1 <<<"$data")$" | head -1 | sed "s/^kvgate-$body-$((2 * COUNT))\.//")" | sed 's/^/#   /'
    else
      echo "$system $body $total"
    fi
  done
done
ratios=()
for body in "${BODIES[@]}"; do
  k="${PER_REQUEST[kvgate-$body]:-}"; n="${PER_REQUEST[nginx-$body]:-}"
  if [ -n "$k" ] && [ -n "$n" ]; then
    ratios+=("$body $(fleet_stats --decimals 2 ratio "$k" "$n")")
  fi
done
if [ ${#ratios[@]} -gt 0 ]; then
  line="$(printf '%s, ' "${ratios[@]}")"
  echo "instructions per request kvgate/nginx: ${line%, }"
fi
