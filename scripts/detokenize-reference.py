"""The reference side of tokenize::decode's tests: token ID sequences and the Python
`tokenizers` package's `decode` of each, with skip_special_tokens on and off, written to
tests/fixtures/detokenize-<name>.jsonl (one {"ids", "skip_special_tokens", "text"} per line).

Cases per tokenizer: random IDs over the whole vocabulary (added tokens included), the IDs of
texts in several scripts (English, code, CJK, emoji with joiners and flags, accents), those IDs
with special tokens put in at random places, and the same cut short inside a character.

Two small SentencePiece tokenizers are built here too (byte fallback, `▁` pieces), one with
Llama 2's decoder (Replace, ByteFallback, Fuse, Strip) and one with Metaspace's, and saved
beside their cases as tests/fixtures/detokenize-sp-<kind>.json, since the fetched models
(Llama 3, Qwen3) are byte-level.

Usage (scripts/fetch-tokenizers.sh's venv, tokenizers==0.22.2):
  target/tokenizers/venv/bin/python scripts/detokenize-reference.py target/tokenizers tests/fixtures
"""
import json
import random
import sys

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, AddedToken

TEXTS = [
    "Hello, world! The quick brown fox jumps over the lazy dog.",
    "def main():\n    print(\"hi\")\n\treturn {'a': [1, 2, 3]}\n",
    "日本語のテキストと中文字符混合，还有한국어도 있습니다。",
    "Emoji: 🎉👍🏽 family 👨‍👩‍👧‍👦 flag 🇯🇵 and ⚡️ done",
    "café naïve façade x̧ ﬁ Ωmega   spaces\n\n\nnewlines",
    "  leading and trailing spaces  ",
]


def cases_for(tok, rng, count_random=40):
    size = tok.get_vocab_size(with_added_tokens=True)
    specials = [i for i, t in tok.get_added_tokens_decoder().items() if t.special]
    seqs = []
    for _ in range(count_random):
        seqs.append([rng.randrange(size) for _ in range(rng.randrange(1, 48))])
    for text in TEXTS:
        ids = tok.encode(text, add_special_tokens=False).ids
        seqs.append(ids)
        mixed = list(ids)
        for _ in range(3):
            if specials:
                mixed.insert(rng.randrange(len(mixed) + 1), rng.choice(specials))
        seqs.append(mixed)
        seqs.append(ids[: max(1, len(ids) * 2 // 3)])
    out = []
    for ids in seqs:
        for skip in (True, False):
            out.append({"ids": ids, "skip_special_tokens": skip,
                        "text": tok.decode(ids, skip_special_tokens=skip)})
    return out


def sentencepiece(decoder):
    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2}
    for b in range(256):
        vocab["<0x%02X>" % b] = len(vocab)
    for piece in ["▁", "▁Hello", "▁world", "Hello", "ab", "▁日本", "語", "▁▁", "▁the",
                  "ing", "▁ca", "fé", "▁🎉", "x", "▁a▁b"]:
        vocab[piece] = len(vocab)
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token="<unk>", byte_fallback=True))
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first")
    tok.decoder = decoder
    tok.add_special_tokens([AddedToken("<s>", special=True), AddedToken("</s>", special=True)])
    tok.add_tokens([AddedToken("<extra>", special=False)])
    return tok


def write(path, cases):
    with open(path, "w", encoding="utf-8") as f:
        for case in cases:
            f.write(json.dumps(case, ensure_ascii=False) + "\n")


def main():
    models_dir, fixtures = sys.argv[1], sys.argv[2]
    for name in ("llama3", "qwen3"):
        tok = Tokenizer.from_file(f"{models_dir}/{name}/tokenizer.json")
        write(f"{fixtures}/detokenize-{name}.jsonl", cases_for(tok, random.Random(name)))
    kinds = {
        "strip": decoders.Sequence([
            decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(),
            decoders.Strip(content=" ", left=1, right=0),
        ]),
        "metaspace": decoders.Metaspace(replacement="▁", prepend_scheme="first"),
    }
    for kind, decoder in kinds.items():
        tok = sentencepiece(decoder)
        tok.save(f"{fixtures}/detokenize-sp-{kind}.json")
        write(f"{fixtures}/detokenize-sp-{kind}.jsonl",
              cases_for(tok, random.Random(kind), count_random=150))


if __name__ == "__main__":
    main()
