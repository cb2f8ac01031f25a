#!/usr/bin/env bash
# Prefix-index microbenchmarks (perf/index.rs).
#   scripts/bench-index.sh --quick   reduced set (under a minute once built); last line is one JSON
#                                    object with lookup_8k_tokens_ns, lookup_32k_chars_ns,
#                                    lookup_plus_record_8k_tokens_ns, writer_inserts_per_s,
#                                    bytes_per_token and the target ratios (what each figure
#                                    times: the "note" field, and perf/index.rs)
#   scripts/bench-index.sh [ARGS]    the criterion set (ARGS go to criterion, e.g. a name filter)
set -euo pipefail
cd "$(dirname "$0")/.."
cargo bench --quiet -p kvgate --bench index --no-run
if [[ "${1:-}" == "--quick" ]]; then
    cargo bench --quiet -p kvgate --bench index -- --quick | tail -n 1
else
    cargo bench --quiet -p kvgate --bench index -- "$@"
fi
