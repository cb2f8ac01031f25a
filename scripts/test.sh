#!/usr/bin/env bash
# The whole test suite, as CI runs it: formatting, lints, then every test of the workspace.
# Needs only the Rust toolchain (nightly too for the sanitizer pass, which is skipped without it);
# integration tests start sim-engine and kvgate on loopback.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo fmt --all -- --check
cargo clippy --workspace --all-targets -- -D warnings
# Binaries first: the integration tests start target/debug/{kvgate,sim-engine,replay}.
cargo build --workspace --bins
cargo test --workspace
# The index's unsafe code under AddressSanitizer (needs nightly; skipped with a note without it).
scripts/test-sanitized.sh
