#!/usr/bin/env bash
# Copies of a large body (issue 23, defect 3): for each case a fresh kvgate (one data core, in
# front of one sim-engine, scripts/lib/fleet.sh) takes one request with a large text prompt,
# and the script reports how far its peak RSS (VmHWM) rose above its RSS before the request, in
# MB and in bodies. One copy of the body (the read buffer) plus the routing text the string tree
# keeps is 2 bodies for a prompt that is all text.
#
#   scripts/bench-body-memory.sh [--mb 60] [--debug]
#
# KVGATE_BIN=path/to/kvgate measures another build (a baseline) side by side: each case runs
# on it first, then on this build. Cases: a completions prompt without escapes and a chat of
# 1,000 messages with a newline escape every 80 bytes, each sent sized and chunked.
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=lib/fleet.sh
source scripts/lib/fleet.sh

MB=60
PROFILE=release
while [ $# -gt 0 ]; do
  case "$1" in
    --mb) MB="$2"; shift 2 ;;
    --debug) PROFILE=debug; shift ;;
    *) echo "Error: unknown flag $1 (see the header of $0)" >&2; exit 2 ;;
  esac
done
fleet_build "$PROFILE"
BIN="target/$PROFILE"
BUILDS=("$BIN")
if [ -n "${KVGATE_BIN:-}" ]; then
  BUILDS=("$(dirname "$KVGATE_BIN")" "$BIN")
fi


fleet_init "$BIN"
python3 - "$FLEET_WORK" "$MB" <<'EOF'
import json, sys
work, mb = sys.argv[1], int(sys.argv[2])
size = mb * 1_000_000
plain = "the quick brown fox jumps over the lazy dog " * (size // 44)
with open(f"{work}/completions.json", "w") as f:
    json.dump({"prompt": plain, "max_tokens": 1}, f)
line = "x" * 79 + "\n"
content = line * (size // 1000 // 80)
messages = [{"role": "user", "content": content} for _ in range(1000)]
with open(f"{work}/chat.json", "w") as f:
    json.dump({"messages": messages, "max_tokens": 1}, f)
EOF

SIM_PORT=$(fleet_ports 1)
fleet_start_sim "$BIN" "$SIM_PORT" --speedup 1000 --kv-capacity-tokens 100000000
fleet_wait_port sim-engine "$SIM_PORT"

printf '%-34s %-8s %-8s %12s %8s\n' build case framing "peak MB" bodies
for case in completions chat; do
  body="$FLEET_WORK/$case.json"
  body_mb=$(($(stat -c %s "$body") / 1000000))
  path=/v1/completions
  [ "$case" = chat ] && path=/v1/chat/completions
  for framing in sized chunked; do
    for build in "${BUILDS[@]}"; do
      GW_PORT=$(fleet_ports 2)
      PROM_PORT=$((GW_PORT + 1))
      fleet_start_kvgate "$build" "$GW_PORT" "$PROM_PORT" "http://127.0.0.1:$SIM_PORT"
      fleet_wait_port kvgate "$GW_PORT"
      sleep 1
      before=$(fleet_rss_kb "$KVGATE_PID")
      extra=()
      [ "$framing" = chunked ] && extra=(-H 'Transfer-Encoding: chunked')
      status=$(curl -s -o /dev/null -w '%{http_code}' -H 'content-type: application/json' \
        "${extra[@]}" --data-binary "@$body" "http://127.0.0.1:$GW_PORT$path")
      peak=$(fleet_rss_kb --peak "$KVGATE_PID")
      kill "$KVGATE_PID"
      wait "$KVGATE_PID" 2>/dev/null || true
      if [ "$status" != 200 ]; then
        echo "Error: $build answered $status to the $framing $case body" >&2
        exit 1
      fi
      rise=$(((peak - before) / 1000))
      printf '%-34s %-8s %-8s %12d %8s\n' "$build" "$case" "$framing" "$rise" \
        "$(fleet_stats --decimals 2 ratio "$rise" "$body_mb")"
    done
  done
done
