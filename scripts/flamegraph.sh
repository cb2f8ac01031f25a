#!/usr/bin/env bash
# Flame graph of kvgate under a named load: starts sim-engine and kvgate (one data core, pinned
# to the CPU after its control core), records kvgate alone with perf while `replay` sends the
# scenario's requests, and writes flamegraphs/SCENARIO.svg, then prints the widest kvgate frames
# and the README line (flamegraphs/README.md lists every committed graph).
#
# Usage: scripts/flamegraph.sh SCENARIO     scenarios below (`tiny`: a few seconds, for CI)
#        scripts/flamegraph.sh --probe      exit 0 if perf can record here, else 3 with the reason
#        scripts/flamegraph.sh --setup      install perf (Debian linux-perf, apt-get) when
#                                           missing, then --probe
# Environment:
#   FLAMEGRAPH_BUILD=release  the build profiled: release (built here first; its line tables
#                             name the functions) or debug (the binaries `cargo build --workspace
#                             --bins` left; nothing is built: what the test suite uses)
#   FLAMEGRAPH_OUT=flamegraphs  where SCENARIO.svg goes, and SCENARIO.folded (the stacks, for
#                             inferno-diff-folded; not committed)
#   FLAMEGRAPH_BASE_PORT=PORT   kvgate's port; metrics on +99, engines from +100 (default: free
#                             ports from scripts/lib/fleet.sh)
#   FLAMEGRAPH_TRACE=../shared/traces/mooncake_conversation_trace.jsonl  (mooncake)
#
# perf records the `cpu-clock` software event (no hardware counters needed, so it works in VMs
# and containers) with DWARF call graphs (the release profile keeps line tables but no frame
# pointers). `flamegraph` (bench-harness, on the inferno crate) collapses and draws the stacks.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/lib/fleet.sh

probe_perf() { # -> 0, or 3 with the reason on stderr
  if ! command -v perf >/dev/null; then
    echo "perf is not installed (Debian: apt-get install linux-perf; or scripts/flamegraph.sh --setup)" >&2
    return 3
  fi
  local out
  if ! out="$(perf record -q -e cpu-clock -o /dev/null -- true 2>&1)"; then
    echo "perf cannot record here: ${out//$'\n'/ } (kernel.perf_event_paranoid is" \
      "$(cat /proc/sys/kernel/perf_event_paranoid 2>/dev/null || echo unknown): above 1 an unprivileged user cannot" \
      "profile kernel code, Debian's 3 forbids perf to them (run as root or sysctl kernel.perf_event_paranoid=1);" \
      "in a container, the seccomp profile may block perf_event_open (docker run --cap-add PERFMON)" >&2
    return 3
  fi
}

case "${1:-}" in
  --probe) probe_perf; exit ;;
  --setup)
    if ! command -v perf >/dev/null; then
      apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq linux-perf >/dev/null
    fi
    probe_perf; exit ;;
  -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit ;;
  "") echo "Error: no scenario (scripts/flamegraph.sh --help)" >&2; exit 2 ;;
esac
SCENARIO="$1"
BUILD="${FLAMEGRAPH_BUILD:-release}"
OUT="${FLAMEGRAPH_OUT:-flamegraphs}"
TRACE="${FLAMEGRAPH_TRACE:-../shared/traces/mooncake_conversation_trace.jsonl}"

# Per scenario: the fleet (sim-engine flags) and the load (replay flags). Prompts are the
# generator's words (4 bytes a token as text), so bodies are about 4 bytes per prompt token plus
# the JSON around them. Each runs about 5-15 s on 2 CPUs (release build).
HZ=999 # perf's samples per second of each kvgate thread's CPU
case "$SCENARIO" in
  tiny) # 2,000 small chats, 8 in flight: about a second of load (seconds in a debug build)
    SIM=(--engines 1 --instant)
    LOAD=(--synthetic --groups 8 --prompts-per-group 250 --system-prompt-len 64 --question-len 16 --output-len 4 --concurrency 8) ;;
  small-chat) # ~350-byte chat bodies (64 prompt tokens), 64 in flight, instant engine
    SIM=(--engines 1 --instant)
    LOAD=(--synthetic --groups 64 --prompts-per-group 1000 --system-prompt-len 48 --question-len 16 --output-len 8 --concurrency 64) ;;
  chat-36k) # 36 KB chat bodies (9,088 prompt tokens: 16 shared system prompts), 64 in flight
    SIM=(--engines 1 --instant)
    LOAD=(--synthetic --groups 16 --prompts-per-group 1000 --system-prompt-len 8960 --question-len 128 --output-len 8 --concurrency 64) ;;
  generate-8k-ids) # /generate with 8,192 input_ids (16 shared 7,936-token heads), 64 in flight
    SIM=(--engines 1 --instant)
    LOAD=(--synthetic --form generate-ids --groups 16 --prompts-per-group 1000 --system-prompt-len 7936 --question-len 256 --output-len 8 --concurrency 64) ;;
  sse-1000) # 1,000 concurrent SSE streams of 128 tokens each from 4 engines at 2x speed
    SIM=(--engines 4 --speedup 2 --max-running-requests 512)
    LOAD=(--synthetic --groups 64 --prompts-per-group 80 --system-prompt-len 256 --question-len 32 --output-len 128 --concurrency 1000) ;;
  mooncake) # the Mooncake conversation trace at 100x speed on 4 engines, first 4,000 requests
    [ -f "$TRACE" ] || { echo "Error: no Mooncake trace at $TRACE (set FLAMEGRAPH_TRACE)" >&2; exit 2; }
    SIM=(--engines 4 --speedup 100)
    LOAD=(--trace "$TRACE" --speedup 100 --max-requests 4000) ;;
  *) echo "Error: unknown scenario '$SCENARIO' (tiny, small-chat, chat-36k, generate-8k-ids, sse-1000, mooncake)" >&2; exit 2 ;;
esac

probe_perf || { echo "Error: perf cannot profile here; see above" >&2; exit 3; }
case "$BUILD" in
  release) cargo build --release -q --workspace --bins; BIN=target/release ;;
  debug) BIN=target/debug ;;
  *) echo "Error: FLAMEGRAPH_BUILD must be release or debug, not '$BUILD'" >&2; exit 2 ;;
esac
for bin in kvgate sim-engine replay flamegraph fleet; do
  [ -x "$BIN/$bin" ] || { echo "Error: $BIN/$bin is missing: run cargo build --workspace --bins" >&2; exit 2; }
done

fleet_init "$BIN"
ENGINES="${SIM[1]}"
if [ -n "${FLAMEGRAPH_BASE_PORT:-}" ]; then
  PORT="$FLAMEGRAPH_BASE_PORT"; METRICS_PORT=$((PORT + 99)); SIM_PORT=$((PORT + 100))
else
  read -r PORT SIM_PORT < <(fleet_ports 2 "$ENGINES")
  METRICS_PORT=$((PORT + 1))
fi
fleet_start_sim "$BIN" "$SIM_PORT" "${SIM[@]}"
WORKERS=()
for i in $(seq 0 $((ENGINES - 1))); do WORKERS+=("http://127.0.0.1:$((SIM_PORT + i))"); done
fleet_start_kvgate "$BIN" "$PORT" "$METRICS_PORT" "${WORKERS[*]}"
fleet_wait sim-engine "${WORKERS[@]/%//health}"
fleet_wait_port kvgate "$PORT"
sleep 1 # kvgate's control core fetches the workers' /v1/models once before routing

# 65528 bytes of stack per sample (perf's most): with less, the unwinder stops short of the
# runtime's frames on monoio's deep poll stacks and the stack hangs off an `[unknown]` root.
perf record -q -e cpu-clock -F "$HZ" --call-graph dwarf,65528 -p "$KVGATE_PID" \
  -o "$FLEET_WORK/perf.data" 2>"$FLEET_WORK/perf.log" &
PERF_PID=$!
FLEET_PIDS+=("$PERF_PID")
sleep 0.5 # perf attaches to every thread of kvgate
echo "== $SCENARIO: replay ${LOAD[*]}" >&2
"$BIN/replay" --gateway "http://127.0.0.1:$PORT" "${LOAD[@]}" --no-progress \
  --out "$FLEET_WORK/replay.json" >"$FLEET_WORK/replay.txt"
kill -INT "$PERF_PID"
PERF_STATUS=0; wait "$PERF_PID" || PERF_STATUS=$?
# Stopped by SIGINT, perf writes its data and exits with the signal's status (130).
if [ "$PERF_STATUS" != 0 ] && [ "$PERF_STATUS" != 130 ]; then
  echo "Error: perf record failed ($PERF_STATUS):" >&2; cat "$FLEET_WORK/perf.log" >&2; exit 1
fi
grep -E '^(requests|failures|throughput)' "$FLEET_WORK/replay.txt" >&2 || true

# --no-inline: real symbols only, with their full paths (kvgate::http::...), and seconds instead
# of minutes of addr2line.
perf script --no-inline -i "$FLEET_WORK/perf.data" >"$FLEET_WORK/perf.txt" 2>"$FLEET_WORK/perf-script.log"
mkdir -p "$OUT"
COMMIT="$(git rev-parse --short=12 HEAD 2>/dev/null || echo unknown)"
DATE="$(date -u +%F)"
"$BIN/flamegraph" --perf-script "$FLEET_WORK/perf.txt" --svg "$OUT/$SCENARIO.svg" \
  --folded "$OUT/$SCENARIO.folded" --title "kvgate: $SCENARIO" \
  --subtitle "scripts/flamegraph.sh $SCENARIO, $BUILD build, commit $COMMIT, $DATE, perf cpu-clock ${HZ} Hz" \
  | tee "$FLEET_WORK/widest.txt"
echo "wrote $OUT/$SCENARIO.svg" >&2
WIDEST="$(awk 'NR > 1 {share = $1; sub(/^ *[0-9.]+% +[0-9]+ /, ""); printf "%s`%s` %s", (NR > 2 ? ", " : ""), $0, share}' "$FLEET_WORK/widest.txt")"
echo "| \`$SCENARIO\` | \`scripts/flamegraph.sh $SCENARIO\` | $COMMIT | $DATE | $WIDEST |"
