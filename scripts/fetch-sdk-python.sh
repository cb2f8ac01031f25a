#!/usr/bin/env bash
# The Python side of the SDK tests (tests/pd.rs's `the_openai_and_anthropic_sdks_...`): a venv with
# PyPI's openai and anthropic client libraries under target/sdk-python/ (a second run does
# nothing). Needs python3 with venv; installs it with apt-get when missing (CI is root).
set -euo pipefail
cd "$(dirname "$0")/.."
dir="${KVGATE_SDK_PYTHON:-target/sdk-python}"
if [ ! -x "$dir/venv/bin/python" ] || ! "$dir/venv/bin/python" -c 'import openai, anthropic' 2>/dev/null; then
    mkdir -p "$dir"
    python3 -m venv "$dir/venv" 2>/dev/null || {
        command -v python3 >/dev/null || { apt-get update -qq && apt-get install -y -qq python3 >/dev/null; }
        apt-get update -qq && apt-get install -y -qq python3-venv >/dev/null
        python3 -m venv "$dir/venv"
    }
    "$dir/venv/bin/pip" install --quiet --disable-pip-version-check openai==3.63.0 anthropic==2.17.0
fi
