#!/usr/bin/env bash
# Routing quality of round_robin, least_load, prefix_hash and cache_aware on 8 simulated engines
# with finite KV caches (the benchmark of issue 6), each policy on a fresh fleet:
#
#   scripts/bench-routing.sh [OUT_DIR] [all|routing|demo|imbalance]
#                                           (about 15 minutes on 2 cores for routing, 10 for demo,
#                                            10 for imbalance;
#                                            default OUT_DIR target/bench-routing)
#
# Workloads (the flags are in the commands below; each run's table is kept in OUT_DIR/*.txt, its
# JSON report in OUT_DIR/*.json):
#   shared-prefix  128 groups of 2,048-token system prompts, 8 conversations each, 64-token
#                  questions; Poisson arrivals at 120 req/s (round robin sustains about 154 req/s
#                  on this fleet, measured closed-loop with 256 in flight), 6,000 requests,
#                  65,536 KV tokens per engine (room for 16 of the 128 system prompts).
#   mooncake-1x    the first 3,000 rows of the Mooncake conversation trace (15 minutes of it) at
#                  the trace's own load (paced 20x faster, engines simulated 20x faster), 2,097,152
#                  KV tokens per engine (an H200-class engine serving an 8B model).
#   mooncake-6x    the same rows at six times the trace's load (paced 30x, engines 5x).
#   demo-before-N, demo-after-N   (issue 42) `make demo`'s workload (replay compare's defaults:
#                  1,500 requests, 32 groups of 2,048-token prompts, 8 in flight, 4 engines of 32,768
#                  tokens at 5x), round robin and cache_aware in one run, three rounds each: before,
#                  with sim-engine's decode priced over the engine's own cache as it was
#                  (`--decode-pool-tokens 32768`), and after (over the published curve's pool).
#   demo-imbalance-N, demo-spill-A-R-N   (issue 42) `make demo` as it runs now (6,000 requests),
#                  round robin and cache_aware in one run: with its defaults, and with the spill
#                  gate tightened (--balance-abs-threshold A --balance-rel-threshold R, 1/1.0 and
#                  3/1.5), two rounds each; the summary prints per engine its requests and its
#                  cold prefills (uncached tokens past 128 per request, over 2,048), so a group
#                  placement and the replicas are visible. scripts/demo-imbalance-bound.py gives
#                  what the imbalance row can be while every group stays on one engine.
# For each workload the ceiling is measured too: the same requests, one at a time, on one engine
# with an unbounded cache (what "the hit rate an unbounded cache would allow" means here). And
# the TTFT floor: cache_aware on four times the engines (32) at the same load, where requests
# hardly queue, so its p99 is what the workload's compulsory prefills (first turns, new
# conversations) cost with the cache used as well as it can be; no router on 8 engines gets
# below it. The summary at the end gives, per workload, cache_aware's hit rate over that
# ceiling, its imbalance (max/mean requests per engine), its TTFT p99 over round robin's, and
# that floor over round robin's (the lowest ratio any router could reach).
set -euo pipefail
cd "$(dirname "$0")/.."
out="${1:-target/bench-routing}"
which="${2:-all}"
mkdir -p "$out"
cargo build --release --workspace --bins
source scripts/lib/replay-compare-run.sh
policies=round_robin,least_load,prefix_hash,cache_aware
trace=../shared/traces/mooncake_conversation_trace.jsonl
synthetic=(--synthetic --groups 128 --prompts-per-group 8 --system-prompt-len 2048
    --question-len 64 --output-len 16 --max-requests 6000)
mooncake=(--trace "$trace" --max-requests 3000)

if [[ "$which" == all || "$which" == demo ]]; then
    for round in 1 2 3; do
        run "demo-before-$round" --synthetic --max-requests 1500 \
            --policies round_robin,cache_aware --sim-arg=--decode-pool-tokens=32768
        run "demo-after-$round" --synthetic --max-requests 1500 --policies round_robin,cache_aware
    done
fi
if [[ "$which" == all || "$which" == imbalance ]]; then
    for round in 1 2; do
        run "demo-imbalance-$round" --policies round_robin,cache_aware
        for gate in 1/1.0 3/1.5; do
            run "demo-spill-${gate%/*}-${gate#*/}-$round" --policies round_robin,cache_aware \
                "--gateway-arg=--balance-abs-threshold=${gate%/*}" \
                "--gateway-arg=--balance-rel-threshold=${gate#*/}"
        done
    done
fi
if [[ "$which" == all || "$which" == routing ]]; then
    run shared-prefix-ceiling "${synthetic[@]}" --concurrency 1 --engines 1 \
        --kv-capacity-tokens 1000000000 --sim-speedup 1000 --policies round_robin
    run shared-prefix "${synthetic[@]}" --rate 120 --engines 8 --kv-capacity-tokens 65536 \
        --sim-speedup 1 --policies "$policies"
    run shared-prefix-floor "${synthetic[@]}" --rate 120 --engines 32 --kv-capacity-tokens 65536 \
        --sim-speedup 1 --policies cache_aware
    run mooncake-ceiling "${mooncake[@]}" --concurrency 1 --engines 1 \
        --kv-capacity-tokens 1000000000 --sim-speedup 1000 --policies round_robin
    run mooncake-1x "${mooncake[@]}" --speedup 20 --sim-speedup 20 --engines 8 \
        --kv-capacity-tokens 2097152 --policies "$policies"
    run mooncake-1x-floor "${mooncake[@]}" --speedup 20 --sim-speedup 20 --engines 32 \
        --kv-capacity-tokens 2097152 --policies cache_aware
    run mooncake-6x "${mooncake[@]}" --speedup 30 --sim-speedup 5 --engines 8 \
        --kv-capacity-tokens 2097152 --policies "$policies"
    run mooncake-6x-floor "${mooncake[@]}" --speedup 30 --sim-speedup 5 --engines 32 \
        --kv-capacity-tokens 2097152 --policies cache_aware
fi

python3 - "$out" <<'EOF'
import json, os, sys
out = sys.argv[1]
def policies(name):
    return {p["label"]: p for p in json.load(open(f"{out}/{name}.json"))["policies"]}
for phase in ["before", "after"]:
    for round in [1, 2, 3]:
        name = f"demo-{phase}-{round}"
        if not os.path.exists(f"{out}/{name}.json"):
            continue
        rr, ca = policies(name)["round_robin"], policies(name)["cache_aware"]
        rows = [("hit", "cache_hit_rate", None), ("TTFT p50", "ttft_ms", "p50"),
                ("TTFT p99", "ttft_ms", "p99"), ("ITL p50", "itl_ms", "p50"),
                ("E2E p50", "e2e_ms", "p50"), ("E2E p99", "e2e_ms", "p99"),
                ("req/s", "throughput_rps", None)]
        cells = []
        for label, key, pct in rows:
            a, b = (rr[key][pct], ca[key][pct]) if pct else (rr[key], ca[key])
            cells.append(f"{label} {a:.4g}/{b:.4g}")
        print(f"{name} (round_robin/cache_aware): " + ", ".join(cells))
for name in sorted(os.listdir(out)):
    if not (name.startswith("demo-imbalance-") or name.startswith("demo-spill-")) or not name.endswith(".json"):
        continue
    ca = policies(name[:-5])["cache_aware"]
    engines = [(w["requests"], (w["prompt_tokens"] - w["cached_tokens"] - 128 * w["requests"]) / 2048)
               for w in ca["per_worker"].values()]
    print(f"{name[:-5]}: cache_aware hit {ca['cache_hit_rate']:.1%}, imbalance {ca['imbalance']:.2f}, "
          "per engine requests / cold prefills: "
          + ", ".join(f"{r} / {c:.0f}" for r, c in engines))
for name, ceiling in [("shared-prefix", "shared-prefix-ceiling"), ("mooncake-1x", "mooncake-ceiling"),
                      ("mooncake-6x", "mooncake-ceiling")]:
    if not os.path.exists(f"{out}/{name}.json"):
        continue
    top = policies(ceiling)["round_robin"]["cache_hit_rate"]
    runs = policies(name)
    ca, rr = runs["cache_aware"], runs["round_robin"]
    floor = policies(f"{name}-floor")["cache_aware"]["ttft_ms"]["p99"]
    rr_p99 = rr["ttft_ms"]["p99"]
    print(f"{name}: cache_aware hit {ca['cache_hit_rate']:.1%} of ceiling {top:.1%} = "
          f"{ca['cache_hit_rate'] / top:.2f} (target >= 0.95); imbalance {ca['imbalance']:.2f} "
          f"(target <= 1.15); TTFT p99 {ca['ttft_ms']['p99']:.1f} vs round robin "
          f"{rr_p99:.1f} ms = {ca['ttft_ms']['p99'] / rr_p99:.2f} (target <= 0.50); "
          f"floor {floor:.1f} ms = {floor / rr_p99:.2f} of round robin's")
EOF
