#!/usr/bin/env bash
# Instructions per routing-input extraction (`request::extract`) on perf/extract.rs's bodies,
# counted by valgrind's callgrind: the difference between COUNT and 2*COUNT extractions divided
# by COUNT, so the setup cancels. Unlike wall time, the figure does not move with what else runs
# on the host: use it for before/after comparisons of the scanner (issue 21).
#
# Usage: scripts/count-extract.sh [BODY...]   (default: every body)
#        EXTRACT_COUNT_BIN=path/to/extract_count scripts/count-extract.sh   (another build)
#        COUNT=50 scripts/count-extract.sh chat_36k
# Installs valgrind with apt-get when missing.
set -euo pipefail
cd "$(dirname "$0")/.."
COUNT="${COUNT:-100}"
if ! command -v valgrind >/dev/null; then
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq valgrind >/dev/null
fi
if [ -z "${EXTRACT_COUNT_BIN:-}" ]; then
  cargo build --release -q -p kvgate --example extract_count
  EXTRACT_COUNT_BIN=target/release/examples/extract_count
fi
BODIES=("$@")
[ ${#BODIES[@]} -gt 0 ] || mapfile -t BODIES < <("$EXTRACT_COUNT_BIN" --list)

instructions() { # body count -> instructions of the whole run
  valgrind --tool=callgrind --callgrind-out-file=/dev/null "$EXTRACT_COUNT_BIN" "$1" "$2" 2>&1 |
    awk '/Collected/ {print $4}'
}
echo "# body instructions_per_extraction (callgrind, $COUNT vs $((2 * COUNT)) extractions)"
for body in "${BODIES[@]}"; do
  once="$(instructions "$body" "$COUNT")"; twice="$(instructions "$body" $((2 * COUNT)))"
  [ -n "$once" ] && [ -n "$twice" ] || { echo "count-extract.sh: no count for $body" >&2; exit 1; }
  echo "$body $(((twice - once) / COUNT))"
done
