#!/usr/bin/env bash
# The main job: build, start a simulated engine fleet and one kvgate per policy, replay the same
# workload through each, and print what happened side by side.
#
# With no arguments: round_robin vs cache_aware (the recommended configuration for engines without
# KV events: README, "Recommended configuration"), each on 4 fresh engines of 32k KV tokens, with
# 6,000 requests of the shared-prefix generator (32 groups of 2k-token system prompts), 8 in
# flight: about two minutes on 2 cores (with fewer, a loaded machine's two worst stalls decide the
# p99 rows: perf/results-routing-2.md). The table goes to stdout; replay-compare.json and
# replay-compare.svg (TTFT CDF and hit rate over time) to the current directory; under the table,
# each column's kvgate flags and which one README recommends. Any
# `replay compare` flag can be added, e.g. `--policies direct,round_robin,cache_aware` or
# `--trace ../shared/traces/mooncake_conversation_trace.jsonl --speedup 100 --max-requests 2000`.
#
# DEMO_GRPC=sglang (or vllm) runs the same comparison on a gRPC fleet: `sim-engine --grpc`, and
# each kvgate in front of `grpc://` workers as their front end (it renders the chat template,
# tokenizes, and detokenizes the streamed token IDs), both with Qwen3's tokenizer
# (scripts/fetch-tokenizers.sh fetches it when absent).
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release --workspace --bins
grpc=()
if [ -n "${DEMO_GRPC:-}" ]; then
    tokenizer="${KVGATE_TOKENIZER_FIXTURES:-target/tokenizers}/qwen3"
    [ -s "$tokenizer/tokenizer.json" ] || scripts/fetch-tokenizers.sh
    grpc=(--grpc "$DEMO_GRPC" "--sim-arg=--tokenizer-path=$tokenizer"
        "--gateway-arg=--tokenizer-path=$tokenizer")
fi
target/release/replay compare "${grpc[@]}" "$@"
if [[ " $* " != *" --policies"* ]]; then
    # Keep in step with README.md, "Recommended configuration".
    echo "Recommended for HTTP engines without KV events (README, \"Recommended configuration\"):"
    echo "cache_aware, i.e. kvgate --policy cache_aware with its defaults (the column above)."
fi
