#!/usr/bin/env bash
# Hostile clients: a normal client measures p50/p99 latency of small completions through kvgate
# alone (quiet), then while 10,000 idle connections and 1,000 slow-header (slowloris) clients
# are held open (target: p99 within 2x of quiet). bench-harness's `slowloris` does both phases;
# kvgate runs with one data core in front of a two-engine sim-engine (scripts/lib/fleet.sh).
#
#   scripts/bench-hostile.sh [--idle 10000] [--slow 1000] [--measure-s 30] [--debug]
#
# Raises the open-file limit to the hard limit (kvgate and the client each hold one descriptor
# per connection); writes target/bench-hostile/result.json.
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=lib/fleet.sh
source scripts/lib/fleet.sh

IDLE=10000
SLOW=1000
MEASURE_S=30
PROFILE=release
while [ $# -gt 0 ]; do
  case "$1" in
    --idle) IDLE="$2"; shift 2 ;;
    --slow) SLOW="$2"; shift 2 ;;
    --measure-s) MEASURE_S="$2"; shift 2 ;;
    --debug) PROFILE=debug; shift ;;
    *) echo "Error: unknown flag $1 (see the header of $0)" >&2; exit 2 ;;
  esac
done
fleet_build "$PROFILE"
BIN="target/$PROFILE"
ulimit -n "$(ulimit -Hn)"
NEED=$((IDLE + SLOW + 1000))
if [ "$(ulimit -n)" -lt "$NEED" ]; then
  echo "Error: the open-file limit is $(ulimit -n), below the $NEED this run needs (raise the hard limit)" >&2
  exit 1
fi
echo "open-file limit $(ulimit -n)" >&2

fleet_init "$BIN"
read -r SIM_PORT GW_PORT < <(fleet_ports 2 2)
SIM_PORT2=$((SIM_PORT + 1))
PROM_PORT=$((GW_PORT + 1))
fleet_start_sim "$BIN" "$SIM_PORT" --engines 2 --speedup 50
fleet_wait_port sim-engine "$SIM_PORT"
fleet_wait_port sim-engine "$SIM_PORT2"
fleet_start_kvgate "$BIN" "$GW_PORT" "$PROM_PORT" \
  "http://127.0.0.1:$SIM_PORT http://127.0.0.1:$SIM_PORT2"
fleet_wait_port kvgate "$GW_PORT"
sleep 2

mkdir -p target/bench-hostile
"$BIN/slowloris" --target "127.0.0.1:$GW_PORT" --idle "$IDLE" --slow "$SLOW" \
  --measure-s "$MEASURE_S" --out target/bench-hostile/result.json
echo "kvgate RSS after the run: $(fleet_rss_kb "$KVGATE_PID") kB" >&2
echo "panics in the kvgate log: $(grep -c panicked "$FLEET_WORK/kvgate.log" || true)" >&2
