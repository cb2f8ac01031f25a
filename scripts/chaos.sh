#!/usr/bin/env bash
# Seeded chaos test: one seed drives a replay through kvgate while sim-engines are killed,
# restarted, hung, slowed and made to fail, clients abort, and workers are removed and added
# through the admin API; then the invariants are checked (every request answered properly, zero
# in-flight credits after the drain, gauges and index consistent with the workers, RSS within
# 1.2x of its post-warm-up level, no panic). The driver is bench-harness's `chaos` binary
# (bench-harness/src/chaos/): it owns the processes and draws everything from the seed.
#
#   scripts/chaos.sh SEED [--minutes 1] [--release] [--out-dir target/chaos/SEED] [CHAOS FLAGS...] [-- KVGATE FLAGS...]
#
# CHAOS FLAGS are the binary's (`target/debug/chaos --help`: --engines, --rate, --abort-probes,
# --drain-timeout-s, ...). A failing seed exits 1 and prints the command that reproduces it;
# its plan, event log, report and every process's log stay in the out dir.
set -euo pipefail
cd "$(dirname "$0")/.."

[ $# -ge 1 ] && [[ "$1" =~ ^[0-9]+$ ]] || {
  echo "usage: $0 SEED [--minutes M] [--release] [--out-dir DIR] [CHAOS FLAGS...] [-- KVGATE FLAGS...]" >&2
  exit 2
}
SEED="$1"
shift
MINUTES=1
PROFILE=debug
OUT_DIR=""
REPRO=("scripts/chaos.sh" "$SEED")
PASS=()
while [ $# -gt 0 ]; do
  case "$1" in
    --minutes) MINUTES="$2"; REPRO+=(--minutes "$2"); shift 2 ;;
    --release) PROFILE=release; REPRO+=(--release); shift ;;
    --out-dir) OUT_DIR="$2"; shift 2 ;;
    *) PASS+=("$1"); REPRO+=("$1"); shift ;;
  esac
done
OUT_DIR="${OUT_DIR:-target/chaos/$SEED}"

if [ "$PROFILE" = release ]; then
  cargo build --release -p kvgate -p bench-harness --bins >&2
else
  cargo build -p kvgate -p bench-harness --bins >&2
fi
# Each request is a connection; kvgate inherits the raised limit.
ulimit -n "$(ulimit -Hn)" 2>/dev/null || ulimit -n 65536 2>/dev/null || true

exec "target/$PROFILE/chaos" --seed "$SEED" --minutes "$MINUTES" --out-dir "$OUT_DIR" \
  --repro "${REPRO[*]}" "${PASS[@]}"
