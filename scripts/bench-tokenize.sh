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
out="${1:-target/bench-tokenize}"
requests="${REQUESTS:-1000}"
speedup="${SPEEDUP:-10}"
mkdir -p "$out"
scripts/fetch-tokenizers.sh
cargo build --release --workspace --bins
trace=../shared/traces/mooncake_conversation_trace.jsonl
base=38100
gateway=38000
metrics=38099
workers=()
for i in $(seq 0 7); do workers+=("http://127.0.0.1:$((base + i))"); done

wait_port() {
    for _ in $(seq 1 200); do
        (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null && return 0
        sleep 0.05
    done
    echo "port $1 never opened" >&2
    return 1
}

for mode in text tokens; do
    target/release/sim-engine --engines 8 --base-port "$base" --kv-capacity-tokens 2097152 \
        --speedup "$speedup" >/dev/null 2>&1 &
    sim=$!
    args=()
    if [ "$mode" = tokens ]; then
        args=(--tokenizer-path target/tokenizers/qwen3 --tokenizer-cache-enable-l1)
    fi
    target/release/kvgate --host 127.0.0.1 --port "$gateway" --prometheus-port "$metrics" \
        --data-cores 1 "${args[@]}" --worker-urls "${workers[@]}" 2>"$out/$mode.log" &
    kvgate=$!
    wait_port "$gateway"
    wait_port "$base"
    target/release/replay --gateway "http://127.0.0.1:$gateway" --trace "$trace" \
        --max-requests "$requests" --speedup "$speedup" --form chat --no-progress \
        --out "$out/$mode.json" --plot "$out/$mode.svg" > "$out/$mode.txt"
    # utime and stime, fields 14 and 15 of /proc/PID/stat, in clock ticks.
    read -r utime stime < <(awk '{print $14, $15}' "/proc/$kvgate/stat")
    echo "$(( (utime + stime) * 1000000 / $(getconf CLK_TCK) ))" > "$out/$mode.cpu_us"
    (exec 3<>"/dev/tcp/127.0.0.1/$metrics"; printf 'GET /metrics HTTP/1.0\r\n\r\n' >&3; cat <&3) \
        > "$out/$mode.metrics"
    kill "$kvgate" "$sim"
    wait "$kvgate" "$sim" 2>/dev/null || true
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
