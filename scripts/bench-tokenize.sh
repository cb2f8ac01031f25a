#!/usr/bin/env bash
# Gateway tokenization on the Mooncake trace sent as chat: the same requests through kvgate routing
# on text, then on Qwen3's token IDs (--tokenizer-path, --tokenizer-cache-enable-l1), each on a
# fresh sim-engine fleet (8 engines, 2,097,152 KV tokens each); prints each run's cache hit rate,
# kvgate's CPU per request (its utime + stime over the run, tokenizer pool included) and the
# tokenizer's figures from /metrics.
#
#   scripts/bench-tokenize.sh [OUT_DIR]   (default target/bench-tokenize; REQUESTS=1000,
#                                          SPEEDUP=10: trace and engines paced 10x)
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=lib/fleet.sh
source scripts/lib/fleet.sh
out="${1:-target/bench-tokenize}"
requests="${REQUESTS:-1000}"
speedup="${SPEEDUP:-10}"
mkdir -p "$out"
scripts/fetch-tokenizers.sh
cargo build --release --workspace --bins
trace=../shared/traces/mooncake_conversation_trace.jsonl
fleet_init target/release "$out"
read -r base gateway < <(fleet_ports 8 2)
metrics=$((gateway + 1))
workers=()
for i in $(seq 0 7); do workers+=("http://127.0.0.1:$((base + i))"); done

for mode in text tokens; do
    fleet_start_sim target/release "$base" --engines 8 --kv-capacity-tokens 2097152 \
        --speedup "$speedup"
    args=()
    if [ "$mode" = tokens ]; then
        args=(--tokenizer-path target/tokenizers/qwen3 --tokenizer-cache-enable-l1)
    fi
    # kvgate's own log level (info), unlike fleet_start_kvgate's: the log is kept beside the report.
    fleet_start "$mode" target/release/kvgate --host 127.0.0.1 --port "$gateway" \
        --prometheus-port "$metrics" --data-cores 1 "${args[@]}" --worker-urls "${workers[@]}"
    kvgate=$FLEET_PID
    fleet_wait_port "$mode" "$gateway"
    fleet_wait sim-engine "${workers[@]/%//health}"
    target/release/replay --gateway "http://127.0.0.1:$gateway" --trace "$trace" \
        --max-requests "$requests" --speedup "$speedup" --form chat --no-progress \
        --out "$out/$mode.json" --plot "$out/$mode.svg" > "$out/$mode.txt"
    fleet_cpu_us "$kvgate" > "$out/$mode.cpu_us"
    curl -s "http://127.0.0.1:$metrics/metrics" > "$out/$mode.metrics"
    fleet_kill_all
done

python3 - "$out" <<'PY'
import json, sys
out = sys.argv[1]
for mode in ("text", "tokens"):
    report = json.load(open(f"{out}/{mode}.json"))
    cpu_us = int(open(f"{out}/{mode}.cpu_us").read())
    done = report["requests"]
    figures = {}
    for line in open(f"{out}/{mode}.metrics", errors="replace"):
        if line.startswith(("smg_tokenizer", "kvgate_tokenize", "smg_cache_aware_policy_branch_total")):
            name, value = line.rsplit(" ", 1)
            figures[name] = float(value)
    print(f"{mode}: hit rate {report['cache_hit_rate']:.1%}, kvgate CPU {cpu_us / 1e6:.1f} s = "
          f"{cpu_us / max(done, 1):.0f} us per request ({done} requests), TTFT p50 "
          f"{report['ttft_ms']['p50']:.1f} ms")
    for name, value in figures.items():
        print(f"    {name} {value:.0f}")
PY
