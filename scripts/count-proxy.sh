#!/usr/bin/env bash
# User-space instructions per proxied request, counted by valgrind's callgrind: kvgate (one data
# core), nginx (one worker, `master_process off`) and the floor (perf/floor_proxy.rs), each in
# front of the same sim-engine --instant, each body (the small chat body and the 36 KB one of
# scripts/lib/wrk.sh) driven through it N and then 2N times (`fleet drive`, exactly that many
# requests over a few kept-alive connections). Unlike CPU time, the figures do not move with
# what else runs on the host, so they compare builds and proxies on a loaded box.
#
# How: each proxy runs under callgrind for the whole script; `callgrind_control --dump` closes
# a phase (callgrind counts every thread of the process, the kernel's work is not counted).
# Per body: a warm-up of N/4 requests, an idle phase of IDLE_S seconds with no requests, a phase
# of N requests, one of 2N; each phase ends SETTLE_S after its last answer, so that what a
# request leaves for later (kvgate's dispatch record, applied by its control core on its next
# turn) is counted in the phase of its request. What a proxy does on its own while idle grows
# with the time a phase takes, so each phase's idle rate (instructions per second of the idle
# phase) times its duration (dump to dump) is taken off before the difference:
#   per request = ((I(2N) - rate * t(2N)) - (I(N) - rate * t(N))) / N
# The top functions are each function's instructions in the 2N phase less those in the N phase,
# per request (so the idle work mostly cancels there too).
#
# kvgate and the floor run their io_uring driver unchanged: valgrind 3.19 knows io_uring_setup,
# io_uring_enter and io_uring_register, and callgrind does not need to see what the kernel writes
# into the rings. What does matter: valgrind runs one thread of a process at a time, and its
# default lock is unfair, so kvgate's control core could keep the data core from ever running;
# `--fair-sched=yes` hands the lock round in order. Even so its threads take turns on that
# lock, and a thread waiting in io_uring_enter appears to keep it (a control core waiting 1 s on
# its ring kept kvgate from answering for minutes): kvgate's control core, waiting on its ring
# for its next turn every 10 ms,
# held up the data core each time (400 36 KB requests took 307 s) and its turns, work that follows
# time and not requests, stayed in the difference. So kvgate runs with
# KVGATE_COUNT_CONTROL_TURN_MS=COUNT_TURN_MS (100): between turns its control core sleeps in
# nanosleep, which lets the data core run, and turns ten times less often (its only effect: the
# records the data core queued wait longer before the index learns them; the data core's path
# is the same), and SETTLE_S (2.5) is many turns. COUNT_TURN_MS=off counts it as it runs in
# production.
#
# Usage: scripts/count-proxy.sh [N]   (default 200 requests; the phases send N and 2N)
#        COUNT_SYSTEMS="kvgate floor" scripts/count-proxy.sh   (some of kvgate nginx floor)
#        COUNT_BODIES=small scripts/count-proxy.sh              (small, 36k or both)
#        KVGATE_BIN=path/to/kvgate scripts/count-proxy.sh        (another build; FLOOR_BIN too)
#        COUNT_TOP=15 (functions listed per system and body), COUNT_CONNECTIONS=4, IDLE_S=3,
#        SETTLE_S=2.5, COUNT_TURN_MS=100 (kvgate's control-core turn in counting mode, or off)
#        COUNT_WORK=dir (keeps the logs and callgrind's dumps there, for callgrind_annotate)
#        COUNT_PREBUILT=1 (target/debug's sim-engine and fleet as they are, not rebuilt)
# Installs valgrind and nginx-light with apt-get when missing. Ends with the line
#   instructions per request kvgate/nginx: small R1, 36k R2
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=lib/fleet.sh
source scripts/lib/fleet.sh
N="${1:-200}"
TOP="${COUNT_TOP:-12}"
CONNECTIONS="${COUNT_CONNECTIONS:-4}"
IDLE_S="${IDLE_S:-3}"
SETTLE_S="${SETTLE_S:-2.5}"
if [ "${COUNT_TURN_MS:-100}" != off ]; then export KVGATE_COUNT_CONTROL_TURN_MS="${COUNT_TURN_MS:-100}"; fi
read -ra SYSTEMS <<<"${COUNT_SYSTEMS:-kvgate nginx floor}"
read -ra BODIES <<<"${COUNT_BODIES:-small 36k}"

if ! command -v valgrind >/dev/null || ! command -v nginx >/dev/null; then
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq valgrind nginx-light >/dev/null
fi
counts() { [[ " ${SYSTEMS[*]} " == *" $1 "* ]]; }
if counts kvgate && [ -z "${KVGATE_BIN:-}" ]; then cargo build --release -q -p kvgate --bin kvgate; fi
if counts floor && [ -z "${FLOOR_BIN:-}" ]; then cargo build --release -q -p kvgate --example floor_proxy; fi
# The engine and the driver run outside valgrind and are not counted: a debug build will do.
[ "${COUNT_PREBUILT:-0}" = 1 ] || cargo build -q -p bench-harness --bin sim-engine --bin fleet
KVGATE_BIN="${KVGATE_BIN:-target/release/kvgate}"
FLOOR_BIN="${FLOOR_BIN:-target/release/examples/floor_proxy}"

fleet_init target/debug "${COUNT_WORK:-}"
WORK="$FLEET_WORK"
read -r SIM_PORT PROXY_PORT < <(fleet_ports 1 2)
fleet_start_sim target/debug "$SIM_PORT" --engines 1 --instant --threads 1
fleet_wait_port sim-engine "$SIM_PORT"
# Start-up under callgrind takes seconds.
export FLEET_WAIT_S=120

under_callgrind() { # name binary -> a script in $WORK that runs the binary under callgrind
  local bin="$2"
  case "$bin" in */*) bin="$(realpath "$bin")" ;; *) bin="$(command -v "$bin")" ;; esac
  printf '#!/bin/sh\nexec valgrind --tool=callgrind --fair-sched=yes --callgrind-out-file=%s %s "$@"\n' \
    "$WORK/$1.cg" "$bin" >"$WORK/$1-callgrind"
  chmod +x "$WORK/$1-callgrind"
  echo "$WORK/$1-callgrind"
}

start() { # system: under callgrind, listening on PROXY_PORT; its pid in PID
  rm -f "$WORK/$1".cg*
  CG="$WORK/$1.cg"
  case "$1" in
    kvgate)
      fleet_start_kvgate "$(under_callgrind kvgate "$KVGATE_BIN")" "$PROXY_PORT" $((PROXY_PORT + 1)) \
        "http://127.0.0.1:$SIM_PORT"
      PID=$KVGATE_PID ;;
    nginx)
      fleet_start_nginx "$(under_callgrind nginx nginx)" "$PROXY_PORT" "$SIM_PORT" 1 1024 "master_process off;"
      PID=$NGINX_PID ;;
    floor)
      fleet_start floor "$(under_callgrind floor "$FLOOR_BIN")" "127.0.0.1:$PROXY_PORT" "127.0.0.1:$SIM_PORT"
      PID=$FLEET_PID ;;
  esac
  fleet_wait_port "$1" "$PROXY_PORT"
  sleep 2 # kvgate's control core asks the engine for /v1/models once
  DUMPS=0
  LAST_DUMP_MS="$(now_ms)"
}

now_ms() { date +%s%3N; }

phase() { # name -> dumps what callgrind counted since the last dump; its file in DUMP_FILE,
  # the milliseconds since the last dump in PHASE_MS
  local now
  now="$(now_ms)"
  PHASE_MS=$((now - LAST_DUMP_MS))
  LAST_DUMP_MS="$now"
  callgrind_control --dump="$1" "$PID" >/dev/null 2>&1
  DUMPS=$((DUMPS + 1))
  DUMP_FILE="$CG.$DUMPS"
  local waited=0
  until [ -s "$DUMP_FILE" ] && grep -q '^totals:' "$DUMP_FILE"; do
    sleep 0.2; waited=$((waited + 1))
    [ "$waited" -lt 300 ] || { echo "count-proxy.sh: no callgrind dump $DUMP_FILE" >&2; exit 1; }
  done
}

total() { awk '/^totals:/ {print $2}' "$1"; }

drive() { # words count -> sends them, then waits SETTLE_S
  target/debug/fleet drive --system-words "$1" --connections "$CONNECTIONS" "$2" \
    "http://127.0.0.1:$PROXY_PORT/v1/chat/completions" >/dev/null
  sleep "$SETTLE_S"
}

functions() { # dump -> "instructions<TAB>function" for every function: its self cost, read
  # from callgrind's file (a cost line right after `calls=` is a call's inclusive cost, not the
  # caller's own; callgrind_annotate 3.19 counts those of the frames live at a dump as self cost)
  awk '
    function named(text,   id) {
      if (match(text, /^\([0-9]+\)/)) {
        id = substr(text, 1, RLENGTH)
        if (length(text) > RLENGTH) names[id] = substr(text, RLENGTH + 2)
        return id
      }
      names[text] = text
      return text
    }
    /^fn=/ { current = named(substr($0, 4)); next }
    /^cfn=/ { named(substr($0, 5)); next }
    /^calls=/ { call = 1; next }
    /^[0-9+*-]/ { if (call) call = 0; else cost[current] += $2; next }
    END { for (id in cost) if (cost[id] > 0) print cost[id] "\t" names[id] }' "$1"
}

declare -A PER_REQUEST
echo "# user-space instructions per request (callgrind), $N vs $((2 * N)) requests over $CONNECTIONS connections"
echo "# load average before: $(cut -d' ' -f1-3 /proc/loadavg) (the counts do not depend on it)"
for system in "${SYSTEMS[@]}"; do
  start "$system"
  phase start
  for body in "${BODIES[@]}"; do
    words=0; [ "$body" = 36k ] && words=3600
    drive "$words" $((N / 4))
    phase warm
    sleep "$IDLE_S"
    phase idle
    idle="$(total "$DUMP_FILE")"; idle_ms="$PHASE_MS"
    drive "$words" "$N"
    phase once
    once="$(total "$DUMP_FILE")"; once_file="$DUMP_FILE"; once_ms="$PHASE_MS"
    drive "$words" $((2 * N))
    phase twice
    twice="$(total "$DUMP_FILE")"; twice_file="$DUMP_FILE"; twice_ms="$PHASE_MS"
    per="$(awk -v i="$idle" -v ti="$idle_ms" -v a="$once" -v ta="$once_ms" -v b="$twice" -v tb="$twice_ms" -v n="$N" \
      'BEGIN { rate = i / ti; printf "%.0f", ((b - rate * tb) - (a - rate * ta)) / n }')"
    idle_share="$(awk -v i="$idle" -v ti="$idle_ms" -v b="$twice" -v tb="$twice_ms" \
      'BEGIN { printf "%.1f", 100 * i / ti * tb / b }')"
    PER_REQUEST[$system/$body]="$per"
    echo "$system $body: $per instructions per request (idle: $((idle * 1000 / idle_ms)) per second, $idle_share% of the ${twice_ms} ms 2N phase)"
    { functions "$twice_file"; functions "$once_file" | awk -F'\t' '{ print -$1 "\t" $2 }'; } |
      awk -F'\t' -v n="$N" '{ cost[$2] += $1 } END { for (f in cost) printf "%d\t%s\n", cost[f] / n, f }' |
      sort -rn | awk -F'\t' -v top="$TOP" 'NR <= top { printf "  %8d  %s\n", $1, $2 }'
  done
  # Under valgrind the floor, blocked in io_uring_enter, does not end on SIGTERM.
  kill "$PID" 2>/dev/null || true
  for _ in $(seq 50); do kill -0 "$PID" 2>/dev/null || break; sleep 0.1; done
  kill -KILL "$PID" 2>/dev/null || true
  wait "$PID" 2>/dev/null || true
done

ratio() { # body -> kvgate/nginx for that body, or n/a
  local k="${PER_REQUEST[kvgate/$1]:-}" g="${PER_REQUEST[nginx/$1]:-}"
  if [ -n "$k" ] && [ -n "$g" ]; then fleet_stats --decimals 2 ratio "$k" "$g"; else echo n/a; fi
}
echo "instructions per request kvgate/nginx: small $(ratio small), 36k $(ratio 36k)"
