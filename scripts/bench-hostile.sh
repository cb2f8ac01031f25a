#!/usr/bin/env bash
# Hostile clients: a normal client measures p50/p99 latency of small completions through kvgate
# alone (quiet), then while 10,000 idle connections and 1,000 slow-header (slowloris) clients
# are held open (target: p99 within 2x of quiet). bench-harness's `slowloris` does both phases;
# kvgate runs with one data core in front of a two-engine sim-engine (scripts/lib/fleet.sh).
#
#   scripts/bench-hostile.sh [--idle 10000] [--slow 1000] [--measure-s 30] [--debug]
#                            [--slow-body N] [--kvgate PATH] [-- KVGATE_FLAGS...]
#
# --slow-body N adds N connections that announce a 1 MiB body and send one byte of it every 10 s
# (issue 35); the JSON then has the measuring client's answered share and kvgate's RSS quiet,
# under attack and after the hostile connections close. --kvgate runs another kvgate binary (a
# build of an older commit, for a before/after); flags after `--` go to kvgate.
#
# Raises the open-file limit to the hard limit (kvgate and the client each hold one descriptor
# per connection); writes target/bench-hostile/result.json.
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=lib/fleet.sh
source scripts/lib/fleet.sh

IDLE=10000
SLOW=1000
SLOW_BODY=0
KVGATE=""
KVGATE_FLAGS=()
MEASURE_S=30
PROFILE=release
while [ $# -gt 0 ]; do
  case "$1" in
    --idle) IDLE="$2"; shift 2 ;;
    --slow) SLOW="$2"; shift 2 ;;
    --measure-s) MEASURE_S="$2"; shift 2 ;;
    --debug) PROFILE=debug; shift ;;
    --slow-body) SLOW_BODY="$2"; shift 2 ;;
    --kvgate) KVGATE="$2"; shift 2 ;;
    --) shift; KVGATE_FLAGS=("$@"); break ;;
    *) echo "Error: unknown flag $1 (see the header of $0)" >&2; exit 2 ;;
  esac
done
fleet_build "$PROFILE"
BIN="target/$PROFILE"
ulimit -n "$(ulimit -Hn)"
NEED=$((IDLE + SLOW + SLOW_BODY + 1000))
if [ "$(ulimit -n)" -lt "$NEED" ]; then
  echo "Error: the open-file limit is $(ulimit -n), below the $NEED this run needs (raise the hard limit)" >&2
  exit 1
fi
echo "open-file limit $(ulimit -n)" >&2

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
fleet_init
SIM_PORT=$(free_port)
SIM_PORT2=$((SIM_PORT + 1))
GW_PORT=$(free_port)
PROM_PORT=$(free_port)
fleet_start_sim "$BIN" "$SIM_PORT" --engines 2 --speedup 50
fleet_wait_port sim-engine "$SIM_PORT"
fleet_wait_port sim-engine "$SIM_PORT2"
KVGATE_DIR="$BIN"
if [ -n "$KVGATE" ]; then
  KVGATE_DIR="$FLEET_WORK/kvgate-bin"
  mkdir -p "$KVGATE_DIR"
  ln -s "$(realpath "$KVGATE")" "$KVGATE_DIR/kvgate"
fi
fleet_start_kvgate "$KVGATE_DIR" "$GW_PORT" "$PROM_PORT" \
  "http://127.0.0.1:$SIM_PORT http://127.0.0.1:$SIM_PORT2" "${KVGATE_FLAGS[@]}"
fleet_wait_port kvgate "$GW_PORT"
sleep 2

mkdir -p target/bench-hostile
"$BIN/slowloris" --target "127.0.0.1:$GW_PORT" --idle "$IDLE" --slow "$SLOW" \
  --slow-body "$SLOW_BODY" --pid "$KVGATE_PID" \
  --measure-s "$MEASURE_S" --out target/bench-hostile/result.json
echo "kvgate RSS after the run: $(awk '/VmRSS/ {print $2, $3}' "/proc/$KVGATE_PID/status")" >&2
echo "panics in the kvgate log: $(grep -c panicked "$FLEET_WORK/kvgate.log" || true)" >&2
