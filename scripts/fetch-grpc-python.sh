#!/usr/bin/env bash
# The Python side of tests/grpc_python.rs: a venv with PyPI's smg-grpc-proto (SMG's generated
# grpcio stubs for SGLang's and vLLM's engine services, with grpcio and protobuf) under
# target/grpc-python/ (a second run does nothing). Needs python3 with venv; installs it with
# apt-get when missing (CI is root).
set -euo pipefail
cd "$(dirname "$0")/.."
dir="${KVGATE_GRPC_PYTHON:-target/grpc-python}"
if [ ! -x "$dir/venv/bin/python" ] || ! "$dir/venv/bin/python" -c 'import grpc, smg_grpc_proto' 2>/dev/null; then
    mkdir -p "$dir"
    python3 -m venv "$dir/venv" 2>/dev/null || {
        command -v python3 >/dev/null || { apt-get update -qq && apt-get install -y -qq python3 >/dev/null; }
        apt-get update -qq && apt-get install -y -qq python3-venv >/dev/null
        python3 -m venv "$dir/venv"
    }
    "$dir/venv/bin/pip" install --quiet --disable-pip-version-check smg-grpc-proto==0.4.28
fi
