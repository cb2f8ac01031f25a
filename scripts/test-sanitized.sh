#!/usr/bin/env bash
# The index's unsafe code under AddressSanitizer: the index's unit tests, the model-based
# property test (tests/index_model.rs) and the reader/writer stress test (tests/index_stress.rs),
# built with `-Zsanitizer=address`. A reader touching a node, label or child table after
# reclamation freed it, a double free, an out-of-bounds read or a leak in `src/index/` fails the
# run with ASan's report. Checked that it would: with `reclaim` freeing retired items without
# waiting for readers, the stress test stops at a heap-use-after-free in a reader's label compare.
#
#   scripts/test-sanitized.sh            (about 2 minutes on 2 cores; scripts/test.sh runs it)
#
# Needs a nightly toolchain (sanitizers are unstable); without one it says so and exits 0, so the
# normal suite still runs on a stable-only machine. The standard library is not instrumented
# (that needs rust-src and -Zbuild-std), which leaves kvgate's own reads checked: every access
# to index memory goes through them. `INDEX_STRESS_SEED` replays a seed, as in the normal pass.
set -euo pipefail
cd "$(dirname "$0")/.."
if ! cargo +nightly --version >/dev/null 2>&1; then
    echo "test-sanitized: skipped, no nightly toolchain (rustup toolchain install nightly)" >&2
    exit 0
fi
target="$(rustc -vV | sed -n 's/^host: //p')"
export RUSTFLAGS="-Zsanitizer=address -Cforce-frame-pointers=yes"
export RUSTDOCFLAGS="$RUSTFLAGS"
# Its own target directory: the flags change every crate's build, and must not evict the normal
# build's artifacts. Leak detection stays on: dropping the index must free all of it.
run() {
    cargo +nightly test -p kvgate --target "$target" --target-dir target/asan "$@"
}
# SANITIZED_BUILD_ONLY=1: build the three test binaries and stop (scripts/test.sh builds them
# at low priority while the normal tests run).
if [ "${SANITIZED_BUILD_ONLY:-0}" = 1 ]; then
    run --no-run --lib --test index_model --test index_stress
    exit 0
fi
run --lib -- index::
run --test index_model
run --test index_stress
