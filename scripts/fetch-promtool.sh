#!/usr/bin/env bash
# promtool, for tests/observability.rs (`promtool check metrics` on a live scrape of kvgate): the
# Debian `prometheus` package (about 19 MB; CI is root) when promtool is not on the PATH. A
# second run does nothing. The test fails without it when KVGATE_REQUIRE_PROMTOOL=1 (set by
# scripts/test.sh) and skips otherwise.
set -euo pipefail
if ! command -v promtool >/dev/null; then
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends prometheus >/dev/null
fi
promtool --version | head -1
