#!/usr/bin/env bash
# Churn soak: replay the Mooncake conversation trace through kvgate while workers are killed and
# restarted every 30 s, every engine injects 5% HTTP 500s, and one engine is slow. Reports
# requests sent, completed, failed by cause (what could not be retried), and the gateway's RSS
# over time.
#
#   scripts/soak.sh [--minutes 10] [--speedup S] [--engines 4] [--out-dir DIR] [--debug]
#
# --speedup defaults to the trace length (59 min) over --minutes, so the trace spans the soak.
# Everything runs on loopback on free ports; all children are killed on exit.
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=lib/fleet.sh
source scripts/lib/fleet.sh

MINUTES=10
SPEEDUP=""
ENGINES=4
OUT_DIR="target/soak"
PROFILE=release
CHURN_SECS=30      # a worker is killed every CHURN_SECS
DOWN_SECS=10       # ... and restarted DOWN_SECS later
ERROR_RATE=0.05    # injected 500s on every engine
SLOW_MS=200        # added latency of the slow engine (the last one)
SIM_SPEEDUP=50     # simulated-engine time scale (prefill/decode costs divided by this)
TRACE=../shared/traces/mooncake_conversation_trace.jsonl
[ -f "$TRACE" ] || TRACE=/work/shared/traces/mooncake_conversation_trace.jsonl

while [ $# -gt 0 ]; do
  case "$1" in
    --minutes) MINUTES="$2"; shift 2 ;;
    --speedup) SPEEDUP="$2"; shift 2 ;;
    --engines) ENGINES="$2"; shift 2 ;;
    --out-dir) OUT_DIR="$2"; shift 2 ;;
    --debug) PROFILE=debug; shift ;;
    *) echo "Error: unknown flag $1 (see the header of $0)" >&2; exit 2 ;;
  esac
done
[ "$ENGINES" -ge 2 ] || { echo "Error: --engines must be at least 2" >&2; exit 2; }
if [ -z "$SPEEDUP" ]; then
  SPEEDUP=$(python3 -c "print(round(59.0 / float('$MINUTES'), 3))")
fi
SOAK_SECS=$(python3 -c "print(int(float('$MINUTES') * 60))")

if [ "$PROFILE" = release ]; then
  cargo build --release -p kvgate -p bench-harness --bins >&2
  BIN=target/release
else
  cargo build -p kvgate -p bench-harness --bins >&2
  BIN=target/debug
fi
mkdir -p "$OUT_DIR"
OUT_DIR=$(cd "$OUT_DIR" && pwd)

# Logs stay in OUT_DIR; engines get consecutive ports, the gateway two more (client, metrics).
fleet_init "$BIN" "$OUT_DIR"
read -r BASE_PORT GW_PORT < <(fleet_ports "$ENGINES" 2)
PROM_PORT=$((GW_PORT + 1))

declare -a ENGINE_PIDS
start_engine() { # a restarted engine's log goes on after its earlier life's
  local i=$1
  local faults=(--fault-engines 0 --fault-error-rate "$ERROR_RATE")
  if [ "$i" -eq $((ENGINES - 1)) ]; then faults+=(--fault-latency-ms "$SLOW_MS"); fi
  FLEET_LOG_APPEND=1 fleet_start "engine-$i" "$BIN/sim-engine" --engines 1 \
    --base-port $((BASE_PORT + i)) --speedup "$SIM_SPEEDUP" --seed "$i" "${faults[@]}"
  ENGINE_PIDS[$i]=$FLEET_PID
}

for i in $(seq 0 $((ENGINES - 1))); do start_engine "$i"; done
URLS=()
for i in $(seq 0 $((ENGINES - 1))); do URLS+=("http://127.0.0.1:$((BASE_PORT + i))"); done
sleep 1

GATEWAY_CMD=("$BIN/kvgate" --host 127.0.0.1 --port "$GW_PORT" --prometheus-host 127.0.0.1
  --prometheus-port "$PROM_PORT" --worker-urls "${URLS[@]}"
  --health-check-interval-secs 2 --health-failure-threshold 2 --health-success-threshold 1
  --load-monitor-interval 2 --cb-timeout-duration-secs 10
  --retry-initial-backoff-ms 20 --retry-max-backoff-ms 500)
fleet_start kvgate "${GATEWAY_CMD[@]}"
GW_PID=$FLEET_PID
fleet_wait kvgate "http://127.0.0.1:$GW_PORT/liveness"

REPLAY_CMD=("$BIN/replay" --gateway "http://127.0.0.1:$GW_PORT" --trace "$TRACE"
  --speedup "$SPEEDUP" --model sim-model --timeout-s 120 --no-progress
  --out "$OUT_DIR/replay.json")
echo "gateway: ${GATEWAY_CMD[*]}" >"$OUT_DIR/commands.txt"
echo "replay:  ${REPLAY_CMD[*]}" >>"$OUT_DIR/commands.txt"
echo "engines: sim-engine --engines 1 --speedup $SIM_SPEEDUP --fault-engines 0 --fault-error-rate $ERROR_RATE (engine $((ENGINES - 1)): --fault-latency-ms $SLOW_MS)" >>"$OUT_DIR/commands.txt"
fleet_start replay "${REPLAY_CMD[@]}"
REPLAY_PID=$FLEET_PID

# RSS sampler and churn loop, until the replay ends or the soak time (plus a grace) is up.
echo "t_s,rss_kib" >"$OUT_DIR/rss.csv"
echo "t_s,event" >"$OUT_DIR/churn.csv"
START=$(date +%s)
NEXT_KILL=$((START + CHURN_SECS))
VICTIM=0
DOWN_PID_IDX=-1
RESTART_AT=0
DEADLINE=$((START + SOAK_SECS + 120))
while kill -0 "$REPLAY_PID" 2>/dev/null && [ "$(date +%s)" -lt "$DEADLINE" ]; do
  NOW=$(date +%s)
  RSS=$(fleet_rss_kb "$GW_PID" 2>/dev/null || echo 0)
  echo "$((NOW - START)),$RSS" >>"$OUT_DIR/rss.csv"
  if [ "$NOW" -ge "$NEXT_KILL" ] && [ "$DOWN_PID_IDX" -lt 0 ]; then
    kill -9 "${ENGINE_PIDS[$VICTIM]}" 2>/dev/null || true
    wait "${ENGINE_PIDS[$VICTIM]}" 2>/dev/null || true
    echo "$((NOW - START)),kill engine $VICTIM" >>"$OUT_DIR/churn.csv"
    DOWN_PID_IDX=$VICTIM
    RESTART_AT=$((NOW + DOWN_SECS))
    VICTIM=$(((VICTIM + 1) % ENGINES))
    NEXT_KILL=$((NOW + CHURN_SECS))
  fi
  if [ "$DOWN_PID_IDX" -ge 0 ] && [ "$NOW" -ge "$RESTART_AT" ]; then
    start_engine "$DOWN_PID_IDX"
    echo "$((NOW - START)),restart engine $DOWN_PID_IDX" >>"$OUT_DIR/churn.csv"
    DOWN_PID_IDX=-1
  fi
  sleep 5
done
if kill -0 "$REPLAY_PID" 2>/dev/null; then
  echo "soak: replay still running after the deadline; stopping it" >&2
  kill "$REPLAY_PID" 2>/dev/null || true
fi
wait "$REPLAY_PID" 2>/dev/null || true
curl -sf "http://127.0.0.1:$PROM_PORT/metrics" >"$OUT_DIR/gateway-metrics.txt" 2>/dev/null || true

python3 - "$OUT_DIR" <<'EOF'
import csv, json, sys, os
out = sys.argv[1]
print(open(os.path.join(out, "commands.txt")).read().rstrip())
try:
    r = json.load(open(os.path.join(out, "replay.json")))
except Exception as e:
    print(f"no replay report ({e}); see {out}/replay.log"); sys.exit(1)
r = r[0] if isinstance(r, list) else r
print(f"requests sent      {r.get('requests')}")
print(f"completed          {r.get('successes')}")
print(f"failed             {r.get('errors')}")
for kind, n in sorted(r.get('errors_by_kind', {}).items()):
    print(f"  {kind:<16} {n}")
print(f"throughput         {r.get('throughput_rps', 0):.2f} req/s over {r.get('duration_s', 0):.0f} s")
rows = list(csv.DictReader(open(os.path.join(out, "rss.csv"))))
rss = [(int(x['t_s']), int(x['rss_kib'])) for x in rows if x['rss_kib'] not in ('', '0')]
if rss:
    print("gateway RSS (MiB)  first %.1f  max %.1f  last %.1f" % (rss[0][1]/1024, max(v for _, v in rss)/1024, rss[-1][1]/1024))
    step = max(1, len(rss) // 10)
    print("  over time: " + ", ".join(f"{t}s={v/1024:.1f}" for t, v in rss[::step]))
metrics = {}
try:
    for line in open(os.path.join(out, "gateway-metrics.txt")):
        if line.startswith("kvgate_") and " " in line:
            name, value = line.rsplit(" ", 1)
            metrics[name] = float(value)
except OSError:
    pass
cut = int(metrics.get("kvgate_upstream_responses_cut_total", 0))
print(f"cut mid-response   {cut} (worker failed after bytes reached the client; replay counts")
print(f"                   these as completed: the stream ends with an SSE error event)")
print(f"gateway retries    {int(metrics.get('kvgate_upstream_retries_total', 0))}")
churn = sum(1 for _ in open(os.path.join(out, "churn.csv"))) - 1
print(f"churn events       {churn} (see {out}/churn.csv)")
EOF
