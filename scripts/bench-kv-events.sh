#!/usr/bin/env bash
# Routing on the engines' KV events against routing on the gateway's trees (the benchmark of
# issue 18): round robin, cache_aware on its trees and cache_aware on the KV-event index
# (`cache_aware:kv`: the simulated engines publish their caches' events and the gateway follows
# them), each on a fresh fleet, with engine caches small enough that engines evict:
#
#   scripts/bench-kv-events.sh [OUT_DIR] [all|evicting|overloaded]
#                                           (about 30 minutes on 2 cores for all; default OUT_DIR
#                                            target/bench-kv-events)
#
# Workloads (every request sent as `/generate` `input_ids`, so both modes route on tokens):
#   synth-8k, synth-16k, synth-unbounded
#                  the generator's 4-turn conversations sharing system prompts (1,500 requests),
#                  4 engines of 8,192 / 16,384 / unbounded KV tokens each (the first two hold
#                  about a quarter and a half of the working set).
#   mooncake-256k  the first 3,000 rows of the Mooncake conversation trace at the trace's own
#                  load (paced 20x faster, engines simulated 20x faster), 8 engines of 262,144
#                  KV tokens each; once more with `--balance-abs-threshold 8` (the spill gate
#                  opens at 8 requests over the mean instead of 64).
#   overloaded     (issue 42) 16 groups x 2 conversations of 8 turns on 4,096-token system
#                  prompts, 1,500 requests at 200 req/s on 8 real-time engines of 262,144 tokens:
#                  more than the fleet serves, so a follow-up turn often arrives before its earlier
#                  turn's prefill has been published. The tree (which records its own dispatches),
#                  the KV-event index without its in-flight overlay (`cache_aware:kv:events-only`)
#                  and with it (`cache_aware:kv`); its ceiling: one engine, unbounded, one at a time.
# The ceiling of each finite-cache workload: the same requests, one at a time, on one engine
# whose cache is the whole fleet's (4 x 8,192, 4 x 16,384, 8 x 262,144 tokens) or unbounded: no
# router over the split caches can do better. The summary gives each mode's hit rate against
# that ceiling, and the fraction of the requests the gateway predicted cached tokens for whose
# engine then computed them (`prediction_misses`): how far each index drifts from the engines.
set -euo pipefail
cd "$(dirname "$0")/.."
out="${1:-target/bench-kv-events}"
which="${2:-all}"
mkdir -p "$out"
cargo build --release --workspace --bins
source scripts/lib/replay-compare-run.sh
policies=round_robin,cache_aware,cache_aware:kv
trace=../shared/traces/mooncake_conversation_trace.jsonl
synthetic=(--synthetic --turns 4 --form generate-ids --max-requests 1500)
mooncake=(--trace "$trace" --form generate-ids --max-requests 3000)
unbounded=1000000000

overloaded=(--synthetic --groups 16 --prompts-per-group 2 --system-prompt-len 4096
    --question-len 128 --output-len 64 --turns 8 --form generate-ids --max-requests 1500)

if [[ "$which" == all || "$which" == overloaded ]]; then
    run overloaded "${overloaded[@]}" --rate 200 --engines 8 --kv-capacity-tokens 262144 \
        --sim-speedup 1 --policies cache_aware,cache_aware:kv:events-only,cache_aware:kv
    run overloaded-ceiling "${overloaded[@]}" --concurrency 1 --engines 1 \
        --kv-capacity-tokens "$unbounded" --sim-speedup 1000 --policies round_robin
fi
if [[ "$which" == all || "$which" == evicting ]]; then
    for cache in 8192 16384 "$unbounded"; do
        name=$([ "$cache" = "$unbounded" ] && echo unbounded || echo "$((cache / 1024))k")
        run "synth-$name" "${synthetic[@]}" --engines 4 --kv-capacity-tokens "$cache" \
            --policies "$policies"
        run "synth-$name-ceiling" "${synthetic[@]}" --concurrency 1 --engines 1 \
            --kv-capacity-tokens "$([ "$cache" = "$unbounded" ] && echo "$cache" || echo $((4 * cache)))" \
            --sim-speedup 1000 --policies round_robin
    done
    run mooncake-256k "${mooncake[@]}" --speedup 20 --sim-speedup 20 --engines 8 \
        --kv-capacity-tokens 262144 --policies "$policies"
    run mooncake-256k-abs8 "${mooncake[@]}" --speedup 20 --sim-speedup 20 --engines 8 \
        --kv-capacity-tokens 262144 --policies cache_aware,cache_aware:kv \
        --gateway-arg=--balance-abs-threshold=8
    run mooncake-256k-ceiling "${mooncake[@]}" --concurrency 1 --engines 1 \
        --kv-capacity-tokens $((8 * 262144)) --sim-speedup 1000 --policies round_robin
fi

python3 - "$out" <<'EOF'
import json, os, sys
out = sys.argv[1]
def policies(name):
    return {p["label"]: p for p in json.load(open(f"{out}/{name}.json"))["policies"]}
for name, ceiling in [("overloaded", "overloaded-ceiling"),
                      ("synth-8k", "synth-8k-ceiling"), ("synth-16k", "synth-16k-ceiling"),
                      ("synth-unbounded", "synth-unbounded-ceiling"),
                      ("mooncake-256k", "mooncake-256k-ceiling"),
                      ("mooncake-256k-abs8", "mooncake-256k-ceiling")]:
    if not os.path.exists(f"{out}/{name}.json"):
        continue
    top = policies(ceiling)["round_robin"]["cache_hit_rate"]
    parts = []
    for label, p in policies(name).items():
        predicted = p.get("predicted_requests") or 0
        missed = f"{p['prediction_misses'] / predicted:.1%}" if predicted else "-"
        parts.append(f"{label} {p['cache_hit_rate']:.1%} ({p['cache_hit_rate'] / top:.2f} of "
                     f"ceiling, TTFT p50/p99 {p['ttft_ms']['p50']:.1f}/{p['ttft_ms']['p99']:.1f} ms, "
                     f"imbalance {p['imbalance']:.2f}, predictions missed {missed})")
    print(f"{name} (ceiling {top:.1%}): " + "; ".join(parts))
EOF
