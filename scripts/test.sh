#!/usr/bin/env bash
# The whole test suite, as CI runs it: formatting, lints, then every test of the workspace.
# Needs only the Rust toolchain; integration tests start sim-engine and kvgate on loopback.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo fmt --all -- --check
cargo clippy --workspace --all-targets -- -D warnings
# Binaries first: the integration tests start target/debug/{kvgate,sim-engine,replay}.
cargo build --workspace --bins
cargo test --workspace
