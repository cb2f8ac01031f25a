#!/usr/bin/env bash
# Prefix-index microbenchmarks (perf/index.rs).
#   scripts/bench-index.sh --quick   the reduced set, seven rounds of it on fresh fixtures (under a
#                                    minute once built; "--quick --rounds N" for N); the last line
#                                    is one JSON object of medians over the rounds, with
#                                    lookup_8k_tokens_ns, lookup_32k_chars_ns,
#                                    lookup_plus_record_8k_tokens_ns, writer_inserts_per_s,
#                                    bytes_per_token, the target ratios and rounds_* (each round's
#                                    target figures); what each figure times: the "note" field
#   scripts/bench-index.sh [ARGS]    the criterion set (ARGS go to criterion, e.g. a name filter)
set -euo pipefail
cd "$(dirname "$0")/.."
cargo bench --quiet -p kvgate --bench index --no-run
if [[ "${1:-}" == "--quick" ]]; then
    cargo bench --quiet -p kvgate --bench index -- "$@" | tail -n 1
else
    cargo bench --quiet -p kvgate --bench index -- "$@"
fi
