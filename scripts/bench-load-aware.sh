#!/usr/bin/env bash
# cache_aware with --load-aware-affinity (`cache_aware:load`) against round_robin, least_load,
# prefix_hash and cache_aware's default (the benchmark of issue 24), each policy on a fresh fleet
# of 8 simulated engines:
#
#   scripts/bench-load-aware.sh [OUT_DIR] [hot|modes|holders|routing|all]   (about 35 minutes on 2 cores
#                                                              for hot and routing, 20 more for
#                                                              modes; default OUT_DIR
#                                                              target/bench-load-aware)
#
# POLICIES=a,b,... replaces the five policies (a rerun of two of them, for the run-to-run spread).
#
# Workloads:
#   hot-spot-R   6 system prompts of 8,192 tokens, Zipf-skewed (exponent 1.5: the hottest carries
#                about 55% of requests), 2-turn conversations with 256-token questions and
#                384-token answers, 2,400 requests at R = 30, 40, 50 req/s (near the fleet's
#                capacity), engines in real time with 1,048,576 KV tokens each. Its ceiling: the
#                same requests one at a time on one engine with an unbounded cache.
#   hot-spot-R-modes  (issue 42) the hot-spot workload sent as token IDs (`--form generate-ids`)
#                at the same rates, --load-aware-affinity in all three index modes: the trees
#                (`cache_aware:load`, token tree), the hash index (`cache_aware:hash:load`, heads at
#                2,048 and 8,192 tokens) and the KV-event index (`cache_aware:kv:load`), against
#                round robin; its ceiling is the text run's (the same tokens).
#   hot-spot-R-holders  (issue 42) the token-ID hot spot at the same rates on the hash index with
#                --load-aware-affinity: the spec's three holders per head (`cache_aware:hash:load`)
#                against seven (`cache_aware:hash:load:holders-7`, --cache-holders-max 7), with
#                round robin; the summary prints each policy's per-engine shares of requests.
#   shared-prefix, mooncake-1x, mooncake-6x   scripts/bench-routing.sh's workloads (their ceilings
#                and floors are that script's).
# Each run's table is kept in OUT_DIR/*.txt, its JSON report in OUT_DIR/*.json; the summary at
# the end prints, per workload, each policy's figures against the targets of issue 24.
set -euo pipefail
cd "$(dirname "$0")/.."
out="${1:-target/bench-load-aware}"
which="${2:-all}"
mkdir -p "$out"
cargo build --release --workspace --bins
source scripts/lib/replay-compare-run.sh
policies=${POLICIES:-round_robin,least_load,prefix_hash,cache_aware,cache_aware:load}
hot=(--synthetic --groups 6 --prompts-per-group 200 --system-prompt-len 8192 --question-len 256
    --output-len 384 --popularity zipf --zipf-exponent 1.5 --turns 2 --max-requests 2400)
trace=../shared/traces/mooncake_conversation_trace.jsonl
synthetic=(--synthetic --groups 128 --prompts-per-group 8 --system-prompt-len 2048
    --question-len 64 --output-len 16 --max-requests 6000)
mooncake=(--trace "$trace" --max-requests 3000)

if [[ "$which" == hot || "$which" == all ]]; then
    run hot-spot-ceiling "${hot[@]}" --concurrency 1 --engines 1 \
        --kv-capacity-tokens 1000000000 --sim-speedup 1000 --policies round_robin
    for rate in 30 40 50; do
        run "hot-spot-$rate" "${hot[@]}" --rate "$rate" --sim-speedup 1 --engines 8 \
            --kv-capacity-tokens 1048576 --policies "$policies"
    done
fi
if [[ "$which" == modes || "$which" == all ]]; then
    [[ -f "$out/hot-spot-ceiling.json" ]] || run hot-spot-ceiling "${hot[@]}" --concurrency 1 \
        --engines 1 --kv-capacity-tokens 1000000000 --sim-speedup 1000 --policies round_robin
    for rate in 30 40 50; do
        run "hot-spot-$rate-modes" "${hot[@]}" --form generate-ids --rate "$rate" \
            --sim-speedup 1 --engines 8 --kv-capacity-tokens 1048576 \
            --gateway-arg=--cache-boundaries=2048,8192 \
            --policies "${MODES_POLICIES:-round_robin,cache_aware:load,cache_aware:hash:load,cache_aware:kv:load}"
    done
fi
if [[ "$which" == holders || "$which" == all ]]; then
    [[ -f "$out/hot-spot-ceiling.json" ]] || run hot-spot-ceiling "${hot[@]}" --concurrency 1 \
        --engines 1 --kv-capacity-tokens 1000000000 --sim-speedup 1000 --policies round_robin
    for rate in 30 40 50; do
        run "hot-spot-$rate-holders" "${hot[@]}" --form generate-ids --rate "$rate" \
            --sim-speedup 1 --engines 8 --kv-capacity-tokens 1048576 \
            --gateway-arg=--cache-boundaries=2048,8192 \
            --policies round_robin,cache_aware:hash:load,cache_aware:hash:load:holders-7
    done
fi
if [[ "$which" == routing || "$which" == all ]]; then
    run shared-prefix "${synthetic[@]}" --rate 120 --engines 8 --kv-capacity-tokens 65536 \
        --sim-speedup 1 --policies "$policies"
    run mooncake-1x "${mooncake[@]}" --speedup 20 --sim-speedup 20 --engines 8 \
        --kv-capacity-tokens 2097152 --policies "$policies"
    run mooncake-6x "${mooncake[@]}" --speedup 30 --sim-speedup 5 --engines 8 \
        --kv-capacity-tokens 2097152 --policies "$policies"
fi

python3 - "$out" <<'PY'
import json, os, sys
out = sys.argv[1]
def load(name):
    path = f"{out}/{name}.json"
    return {p["label"]: p for p in json.load(open(path))["policies"]} if os.path.exists(path) else None
ceiling = load("hot-spot-ceiling")
names = ["hot-spot-30", "hot-spot-40", "hot-spot-50", "hot-spot-30-modes", "hot-spot-40-modes",
         "hot-spot-50-modes", "hot-spot-30-holders", "hot-spot-40-holders", "hot-spot-50-holders",
         "shared-prefix", "mooncake-1x", "mooncake-6x"]
for name in names:
    runs = load(name)
    if runs is None:
        continue
    print(f"{name}:")
    rr = runs.get("round_robin")
    for label, p in runs.items():
        hit = p["cache_hit_rate"]
        of_ceiling = ""
        if ceiling and name.startswith("hot-spot"):
            of_ceiling = f" ({hit / ceiling['round_robin']['cache_hit_rate']:.2f} of ceiling)"
        of_rr = f" ({p['e2e_ms']['p99'] / rr['e2e_ms']['p99']:.2f}x rr)" if rr else ""
        print(f"  {label:22} hit {hit:6.1%}{of_ceiling}  TTFT p99 {p['ttft_ms']['p99']:8.1f} ms"
              f"  E2E p50 {p['e2e_ms']['p50']:8.1f}  p99 {p['e2e_ms']['p99']:8.1f} ms{of_rr}"
              f"  imbalance {p['imbalance']:.2f}")
        if name.endswith("-holders"):
            counts = sorted((w["requests"] for w in p["per_worker"].values()), reverse=True)
            total = max(sum(counts), 1)
            print("    per-engine shares: " + " ".join(f"{c / total:.1%}" for c in counts))
PY
