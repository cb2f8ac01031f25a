"""The Python `tokenizers` package's cold encoding speed on the encode group's corpora of
perf/tokenize.rs (written to target/tokenize-bench/ by `cargo bench -p kvgate --bench tokenize`),
for the third column of perf/results-tokenize.md: tokens per second, median of 21 rounds.

Usage: target/tokenizers/venv/bin/python scripts/tokenize-python-speed.py target/tokenizers/qwen3
"""
import statistics
import sys
import time

from tokenizers import Tokenizer


def main():
    tokenizer = Tokenizer.from_file(f"{sys.argv[1]}/tokenizer.json")
    for name in ["prose", "code", "cjk", "cjk_unique"]:
        with open(f"target/tokenize-bench/{name}.txt", encoding="utf-8") as f:
            text = f.read()
        tokens = len(tokenizer.encode(text, add_special_tokens=False).ids)
        rates = []
        for _ in range(21):
            start, n = time.perf_counter(), 0
            while time.perf_counter() - start < 0.05 or n < 3:
                tokenizer.encode(text, add_special_tokens=False)
                n += 1
            rates.append(tokens * n / (time.perf_counter() - start))
        print(f"python tokenizers: {name}: {tokens} tokens, {statistics.median(rates) / 1e6:.2f} M tokens/s")


if __name__ == "__main__":
    main()
