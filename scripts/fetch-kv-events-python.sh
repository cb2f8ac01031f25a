#!/usr/bin/env bash
# The Python side of tests/kv_events_python.rs: a venv with pyzmq and msgspec from PyPI (the
# libraries vLLM and SGLang publish KV events with), under target/kv-events-python/ (a second
# run does nothing). Needs python3 with venv; installs it with apt-get when missing (CI is root).
set -euo pipefail
cd "$(dirname "$0")/.."
dir="${KVGATE_KV_EVENTS_PYTHON:-target/kv-events-python}"
if [ ! -x "$dir/venv/bin/python" ] || ! "$dir/venv/bin/python" -c 'import zmq, msgspec' 2>/dev/null; then
    mkdir -p "$dir"
    python3 -m venv "$dir/venv" 2>/dev/null || {
        command -v python3 >/dev/null || { apt-get update -qq && apt-get install -y -qq python3 >/dev/null; }
        apt-get update -qq && apt-get install -y -qq python3-venv >/dev/null
        python3 -m venv "$dir/venv"
    }
    "$dir/venv/bin/pip" install --quiet --disable-pip-version-check pyzmq==27.1.0 msgspec==0.19.0
fi
