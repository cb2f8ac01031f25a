#!/usr/bin/env bash
# SSE streams held at once through one data core: the same --streams streamed completions sent
# straight to the engines, then through kvgate (one data core). Reports the gaps between a
# stream's consecutive chunks (p50/p99) in both runs, their difference (the delay kvgate adds),
# kvgate's RSS per stream (at the window's end, and the median of a reading every 250 ms) and
# its CPU per chunk relayed. bench-harness's `streams` is the client.
#
#   scripts/bench-streams.sh [--streams 9000] [--step-ms 1000] [--measure-s 15] [--debug]
#                            [--floor] [--rounds 1] [--prebuilt]
#
# --floor adds the floor (perf/floor_proxy.rs, a monoio proxy that relays each engine read to the
# client unchanged, round robin over the same engines) as a third run after kvgate, with its CPU
# per chunk and added gaps beside kvgate's; --rounds R runs direct, kvgate (and the floor) R
# times in turn, so the two proxies are measured interleaved under the same load. --prebuilt
# runs target/<profile>'s binaries as they are (no cargo build).
#
# Descriptors: kvgate holds two per stream (client and engine), and one process may hold at
# most the hard open-file limit (`ulimit -Hn`), so --streams is capped at (limit - 200) / 2.
# The engines decode one token per --step-ms for every running stream (a flat decode cost).
# Writes target/bench-streams/{direct,kvgate,floor}-ROUND.json.
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=lib/fleet.sh
source scripts/lib/fleet.sh

STREAMS=9000
STEP_MS=1000
MEASURE_S=15
PROFILE=release
FLOOR=0
ROUNDS=1
PREBUILT=0
while [ $# -gt 0 ]; do
  case "$1" in
    --streams) STREAMS="$2"; shift 2 ;;
    --step-ms) STEP_MS="$2"; shift 2 ;;
    --measure-s) MEASURE_S="$2"; shift 2 ;;
    --debug) PROFILE=debug; shift ;;
    --floor) FLOOR=1; shift ;;
    --rounds) ROUNDS="$2"; shift 2 ;;
    --prebuilt) PREBUILT=1; shift ;;
    *) echo "Error: unknown flag $1 (see the header of $0)" >&2; exit 2 ;;
  esac
done
[ "$PREBUILT" = 1 ] || fleet_build "$PROFILE"
BIN="target/$PROFILE"
SYSTEMS=(direct kvgate)
if [ "$FLOOR" = 1 ]; then
  if [ "$PREBUILT" = 1 ]; then
    :
  elif [ "$PROFILE" = release ]; then
    cargo build --release -q -p kvgate --example floor_proxy >&2
  else
    cargo build -q -p kvgate --example floor_proxy >&2
  fi
  SYSTEMS+=(floor)
fi
ulimit -n "$(ulimit -Hn)"
MAX=$(( ($(ulimit -n) - 200) / 2 ))
if [ "$STREAMS" -gt "$MAX" ]; then
  echo "Error: --streams $STREAMS needs $((2 * STREAMS + 200)) descriptors in kvgate; the limit is $(ulimit -n) (at most $MAX streams)" >&2
  exit 1
fi
# Long enough to outlast the ramp-up (about 1 s per 1,000 streams) and the measured window.
MAX_TOKENS=$(( (STREAMS / 1000 + MEASURE_S + 20) * 1000 / STEP_MS ))

# Ports come from fleet_ports, below the ephemeral range: a run's thousands of client sockets
# (and their TIME_WAITs) take ephemeral ports, so an engine's port + 1 there is often taken.
mkdir -p target/bench-streams
run() { # name round
  local name="$1" round="$2"
  fleet_init "$BIN"
  local sim_port gw_port prom_port
  read -r sim_port gw_port < <(fleet_ports 2 2)
  prom_port=$((gw_port + 1))
  # Two engines, each running every stream it gets in one batch, a flat --step-ms per token.
  fleet_start_sim "$BIN" "$sim_port" --engines 2 --max-running-requests "$STREAMS" \
    --kv-capacity-tokens $(( STREAMS * 2 * (MAX_TOKENS + 64) )) \
    --decode-constant-ms "$STEP_MS" --decode-linear-ms 0 --decode-quadratic-ms 0 \
    --decode-min-ms "$STEP_MS"
  fleet_wait_port sim-engine "$sim_port"
  fleet_wait_port sim-engine $((sim_port + 1))
  local targets=("127.0.0.1:$sim_port" "127.0.0.1:$((sim_port + 1))") rss=()
  if [ "$name" = kvgate ]; then
    fleet_start_kvgate "$BIN" "$gw_port" "$prom_port" \
      "http://127.0.0.1:$sim_port http://127.0.0.1:$((sim_port + 1))" --policy round_robin
    fleet_wait_port kvgate "$gw_port"
    sleep 1
    targets=("127.0.0.1:$gw_port")
    rss=(--rss-pid "$KVGATE_PID")
  elif [ "$name" = floor ]; then
    fleet_start floor "$BIN/examples/floor_proxy" "127.0.0.1:$gw_port" "${targets[@]}"
    fleet_wait_port floor "$gw_port"
    targets=("127.0.0.1:$gw_port")
    rss=(--rss-pid "$FLEET_PID")
  fi
  "$BIN/streams" --target "${targets[@]}" --streams "$STREAMS" --max-tokens "$MAX_TOKENS" \
    --measure-s "$MEASURE_S" "${rss[@]}" --out "target/bench-streams/$name-$round.json" >/dev/null
  if [ "$name" = kvgate ]; then
    echo "panics in the kvgate log: $(grep -c panicked "$FLEET_WORK/kvgate.log" || true)" >&2
  fi
  fleet_stop
  trap - EXIT
}
echo "# load average before: $(cut -d' ' -f1-3 /proc/loadavg)"
for round in $(seq "$ROUNDS"); do
  for system in "${SYSTEMS[@]}"; do run "$system" "$round"; done
done
python3 - "$STREAMS" "$ROUNDS" "${SYSTEMS[@]}" <<'PY'
import json, statistics, sys
streams, rounds, systems = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
def load(name, round):
    return json.load(open(f"target/bench-streams/{name}-{round}.json"))
print(f"{streams} streams, one kvgate data core, {rounds} round(s)")
print(f"{'round':6} {'':8} {'gap p50 ms':>11} {'gap p99 ms':>11} {'gap max ms':>11} {'chunks':>8} {'failed':>6} {'CPU us/chunk':>13}")
cpu = {name: [] for name in systems}
for round in range(1, rounds + 1):
    d = load("direct", round)
    for name in systems:
        r = load(name, round)
        per_chunk = r["cpu_per_chunk_us"]
        shown = f"{per_chunk:13.2f}" if per_chunk is not None else f"{'':13}"
        print(f"{round:<6} {name:8} {r['gap_p50_ms']:11.2f} {r['gap_p99_ms']:11.2f} {r['gap_max_ms']:11.2f} {r['chunks_measured']:8} {r['failed']:6} {shown}")
        if per_chunk is not None:
            cpu[name].append(per_chunk)
    for name in systems[1:]:
        r = load(name, round)
        print(f"       added by {name}: p50 {r['gap_p50_ms'] - d['gap_p50_ms']:+.2f} ms, p99 {r['gap_p99_ms'] - d['gap_p99_ms']:+.2f} ms")
k = load("kvgate", rounds)
print(f"kvgate RSS: {k['rss_before_kb']} KiB idle, {k['rss_window_end_kb']} KiB with the streams: {k['rss_per_stream_kb']:.1f} KiB per stream")
print(f"kvgate RSS over the window (every 250 ms): {k['rss_window_min_kb']}-{k['rss_window_max_kb']} KiB, median {k['rss_window_median_kb']}: {k['rss_per_stream_median_kb']:.1f} KiB per stream")
print(f"kvgate CPU per chunk relayed: {statistics.median(cpu['kvgate']):.2f} us (median of {rounds})")
if "floor" in systems:
    f = statistics.median(cpu["floor"])
    print(f"floor CPU per chunk relayed: {f:.2f} us (median of {rounds}); kvgate/floor {statistics.median(cpu['kvgate']) / f:.2f}")
PY
echo "# load average after: $(cut -d' ' -f1-3 /proc/loadavg)"
