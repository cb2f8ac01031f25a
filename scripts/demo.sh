#!/usr/bin/env bash
# The main job: build, start a simulated engine fleet and one kvgate per policy, replay the same
# workload through each, and print what happened side by side.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release --workspace --bins
exec target/release/replay compare "$@"
