#!/usr/bin/env bash
# The million-request benchmark: the Mooncake conversation trace repeated with --loop (fresh
# content every pass) through one kvgate to 16 simulated engines, via `replay compare` (which
# starts the fleet and the gateway, and kills both at the end). The JSON report holds the wall
# time (duration_s), replay's own CPU and peak memory (load_generator) and the gateway's RSS at
# 10%, 50% and 100% of the run (watched_process).
#
#   scripts/replay-million.sh [--requests N] [--policy NAME] [--speedup X] [--concurrency C]
#                             [--output-cap N] [--out PATH] [--no-build] [other compare flags]
#
# --speedup scales the engines' simulated time and, unless --concurrency is given, the trace's
# timestamps too (the fleet sees the trace's load pattern, compressed). --concurrency C replays
# as fast as C requests in flight allow instead (the highest rate the box sustains). --output-cap
# keeps the streamed token events per request low, so the run measures routing, not SSE framing.
# TRACE=path overrides the trace file.
set -euo pipefail
cd "$(dirname "$0")/.."

requests=1000000
policy=cache_aware
speedup=200
concurrency=
output_cap=16
out=replay-million.json
build=1
trace=${TRACE:-../shared/traces/mooncake_conversation_trace.jsonl}
extra=()
while (($#)); do
    case "$1" in
        --requests) requests=$2; shift 2 ;;
        --policy) policy=$2; shift 2 ;;
        --speedup) speedup=$2; shift 2 ;;
        --concurrency) concurrency=$2; shift 2 ;;
        --output-cap) output_cap=$2; shift 2 ;;
        --out) out=$2; shift 2 ;;
        --no-build) build=; shift ;;
        *) extra+=("$1"); shift ;;
    esac
done
if [[ -n $concurrency ]]; then pace=(--concurrency "$concurrency"); else pace=(--speedup "$speedup"); fi

[[ -z $build ]] || cargo build --release --workspace --bins
exec target/release/replay compare \
    --trace "$trace" --loop --max-requests "$requests" "${pace[@]}" --output-cap "$output_cap" \
    --engines 16 --kv-capacity-tokens 262144 --sim-speedup "$speedup" \
    --policies "$policy" --out "$out" --plot "${out%.json}.svg" \
    "${extra[@]}"
