#!/usr/bin/env bash
# cargo-fuzz (the `cargo fuzz` subcommand that builds the libFuzzer targets of fuzz/), installed
# from crates.io with `cargo install --locked` into target/cargo-fuzz/ when it is not there yet
# (a second run does nothing). Prints the directory to put on the PATH, so callers do
#   PATH="$(scripts/fetch-cargo-fuzz.sh):$PATH"
# A debug build (`--debug`: cargo-fuzz only drives cargo and libFuzzer, its own speed does not
# matter), 25 s on 2 cores against 84 s optimized, once per fresh checkout.
set -euo pipefail
cd "$(dirname "$0")/.."
version=0.13.2
root="${KVGATE_CARGO_FUZZ_ROOT:-$PWD/target/cargo-fuzz}"
if ! "$root/bin/cargo-fuzz" --version 2>/dev/null | grep -q " $version\$"; then
    echo "fetch-cargo-fuzz: installing cargo-fuzz $version into $root" >&2
    # Its own build directory, removed once installed, so the install neither evicts the
    # workspace's artifacts nor leaves its own behind.
    CARGO_TARGET_DIR="$PWD/target/cargo-fuzz-build" \
        cargo install --quiet --debug --locked --root "$root" cargo-fuzz --version "$version" >&2
    rm -rf target/cargo-fuzz-build
fi
echo "$root/bin"
