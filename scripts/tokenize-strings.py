"""Generates tests/fixtures/tokenize_strings.jsonl: 100,000 short strings, one JSON string per
line, on which kvgate's byte-level BPE must give the Python `tokenizers` package's IDs
(tests/tokenize_reference.rs; scripts/tokenize-reference.py --strings writes the IDs). Seeded
and stdlib-only, so the file is reproducible: rerun it and `git diff` shows nothing.

Kinds (round-robin): code, English prose, CJK, Arabic and Devanagari (and Thai), emoji and ZWJ
sequences, combining marks (NFC's work under Qwen), digit runs, whitespace runs, added-token
look-alikes (and real added tokens), invalid-looking sequences (U+FFFD, controls,
noncharacters, private use, escaped bytes), and random code points from every plane.

Usage: tokenize-strings.py > tests/fixtures/tokenize_strings.jsonl
"""
import json
import random
import sys

COUNT = 100_000
rng = random.Random(20261204)


def pick(seq):
    return seq[rng.randrange(len(seq))]


def chars(lo, hi, n):
    return "".join(chr(rng.randint(lo, hi)) for _ in range(n))


WORDS = ("the model answer it's don't THEY'LL we've I'm you'd she'll can't o'clock rock'n'roll "
         "Hello World internationalization naïve café résumé Zürich e-mail x1 y22 z333 "
         "a I OK USA GPT-4 LLaMA Qwen3 tokenizer cache").split()
CODE = ["def", "fn", "let", "mut", "return", "if", "else", "for", "while", "{", "}", "(", ")",
        "[", "]", ";", ":", "::", "->", "=>", "==", "!=", "+=", "&&", "||", "//", "#", "/*", "*/",
        "'a'", '"str"', "x", "self", "0x1F", "1e-9", "42", "__init__", "camelCase", "snake_case",
        "\n", "\n    ", "\n\t", "\r\n", "  ", " ", " ", " "]
SPACES = [" ", "  ", "\t", "\n", "\r\n", "\r", "\n\n", "\u3000", "\u00a0", "\u2028", "\u0085",
          "\u2009", "\u200b", "\u000b", "\u000c", "\u1680", "\u202f", "\u205f"]
SPECIALS = ["<|im_start|>", "<|im_end|>", "<|endoftext|>", "<|begin_of_text|>", "<|eot_id|>",
            "<|start_header_id|>", "<|end_header_id|>", "<think>", "</think>", "<tool_call>",
            "<|reserved_special_token_5|>", "<|fim_prefix|>"]
EMOJI = ["😀", "👍", "👍🏽", "👩‍👩‍👧", "👨🏿‍💻", "🏳️‍🌈", "🇫🇷", "🇯🇵", "1️⃣", "❤️", "🧑‍🤝‍🧑",
         "🎉", "⭐", "☕", "🫠", "👁‍🗨", "🏴‍☠️", "©️", "‼️"]
COMBINING = [chr(c) for c in range(0x300, 0x370)] + ["\u0327", "\u0328", "\u20dd", "\u1ab0",
                                                      "\u302a", "\u0e31", "\u093c"]


def code():
    return "".join(pick(CODE) + pick(["", " ", ""]) for _ in range(rng.randint(2, 12)))


def prose():
    out = []
    for _ in range(rng.randint(1, 10)):
        w = pick(WORDS)
        if rng.random() < 0.1:
            w = w.upper()
        out.append(w + pick(["", "", "", ",", ".", "!", "?", ";", "..."]))
    return pick([" ", "  ", "\n", ""]).join(out) if rng.random() < 0.1 else " ".join(out)


def cjk():
    parts = []
    for _ in range(rng.randint(1, 4)):
        kind = rng.randrange(6)
        if kind == 0:
            parts.append(chars(0x4E00, 0x9FFF, rng.randint(1, 12)))
        elif kind == 1:
            parts.append(chars(0x3041, 0x3096, rng.randint(1, 8)))
        elif kind == 2:
            parts.append(chars(0x30A1, 0x30FA, rng.randint(1, 8)))
        elif kind == 3:
            parts.append(chars(0xAC00, 0xD7A3, rng.randint(1, 8)))
        elif kind == 4:
            parts.append(chars(0x20000, 0x2A6DF, rng.randint(1, 3)))
        else:
            parts.append(pick(["、", "。", "，", "！", "？", "「", "」", "（", "）", "：", "・", "ー"]))
        parts.append(pick(["", "", " ", "\n", "123", "abc"]))
    return "".join(parts)


def rtl_indic():
    kind = rng.randrange(4)
    if kind == 0:  # Arabic letters with harakat and Arabic-Indic digits
        s = "".join(chr(rng.randint(0x0621, 0x064A)) + (chr(rng.randint(0x064B, 0x0652))
                    if rng.random() < 0.3 else "") for _ in range(rng.randint(1, 10)))
        return s + pick(["", " ", "، ", " ١٢٣", "؟"]) + pick(["", "مرحبا بالعالم"])
    if kind == 1:  # Devanagari consonants, matras, virama, digits
        s = "".join(chr(rng.randint(0x0915, 0x0939)) + pick(["", "", "\u093e", "\u093f",
                    "\u0940", "\u094d", "\u0902", "\u094b"]) for _ in range(rng.randint(1, 10)))
        return s + pick(["", " ", "।", " ०१२", "नमस्ते दुनिया"])
    if kind == 2:  # Thai
        return chars(0x0E01, 0x0E2E, rng.randint(1, 6)) + pick(["\u0e31", "\u0e48", "", " "])
    return pick(["שלום עולם", "Привет, мир", "Γειά σου", "Բարեւ", "ሰላም", "안녕하세요"])


def emoji():
    return pick(["", " ", "a"]).join(pick(EMOJI) for _ in range(rng.randint(1, 5))) + pick(
        ["", " ok", "!", "\u200d", "\ufe0f"])


def combining():
    out = []
    for _ in range(rng.randint(1, 6)):
        out.append(pick(["a", "e", "o", "A", "n", "i", "ı", "ß", "Å", "ﬁ", " ", "1", "ᄀ"]))
        for _ in range(rng.randint(0, 3)):
            out.append(pick(COMBINING))
        if rng.random() < 0.2:  # decomposed Hangul jamo: L V (T), composed by NFC
            out.append(chr(rng.randint(0x1100, 0x1112)) + chr(rng.randint(0x1161, 0x1175)) +
                       pick(["", chr(rng.randint(0x11A8, 0x11C2))]))
    return "".join(out)


def digits():
    run = "".join(pick("0123456789") for _ in range(rng.randint(1, 40)))
    kind = rng.randrange(5)
    if kind == 0:
        run = "".join(chr(0x0660 + int(d)) for d in run)
    elif kind == 1:
        run = "".join(chr(0xFF10 + int(d)) for d in run)
    elif kind == 2:
        run = run[: len(run) // 2] + pick([".", ",", " ", "e", "½", "Ⅻ", "²"]) + run[len(run) // 2:]
    return pick(["", "$", "x", " ", "-"]) + run + pick(["", "%", "th", " ", "\n"])


def whitespace():
    s = "".join(pick(SPACES) * rng.randint(1, 6) for _ in range(rng.randint(1, 5)))
    return pick(["", "a", "1", "!"]) + s + pick(["", "b", "2", "?", "\n"])


def specials():
    s = pick(SPECIALS)
    kind = rng.randrange(5)
    if kind == 0:
        s = s[: rng.randint(1, len(s) - 1)]
    elif kind == 1:
        s = s.upper()
    elif kind == 2:
        s = s.replace("|", pick(["｜", " |", "||", ""]))
    elif kind == 3:
        s = s + pick(SPECIALS)
    return pick(["", " ", "\n", "x"]) + s + pick(["", " ", "\n", "user", "<|"])


def invalid_looking():
    parts = []
    for _ in range(rng.randint(1, 5)):
        kind = rng.randrange(7)
        if kind == 0:
            parts.append("\ufffd" * rng.randint(1, 3))
        elif kind == 1:
            parts.append(chr(pick(list(range(0, 32)) + [127] + list(range(0x80, 0xA0)))))
        elif kind == 2:
            parts.append(pick(["\ufffe", "\uffff", "\U0001fffe", "\U0010ffff", "\ufdd0"]))
        elif kind == 3:
            parts.append(chars(0xE000, 0xF8FF, rng.randint(1, 3)))
        elif kind == 4:
            parts.append(pick(["\\xff\\xfe", "\\ud800", "%C0%80", "\\u0000", "Ã©", "â€™"]))
        elif kind == 5:
            parts.append("\ufeff")
        else:
            parts.append(chr(rng.randint(0x0378, 0x0379)) + chr(rng.randint(0x0870, 0x089F)))
    return "".join(parts)


def random_code_points():
    out = []
    for _ in range(rng.randint(1, 10)):
        c = rng.randint(0, 0x10FFFF) if rng.random() < 0.5 else rng.randint(0, 0x2FFF)
        if 0xD800 <= c <= 0xDFFF:
            c = 0x41
        out.append(chr(c))
    return "".join(out)


KINDS = [code, prose, cjk, rtl_indic, emoji, combining, digits, whitespace, specials,
         invalid_looking, random_code_points]


def main():
    out = sys.stdout
    for i in range(COUNT):
        s = KINDS[i % len(KINDS)]()
        # One in eight strings joins two kinds, so kinds meet at their boundaries.
        if rng.random() < 0.125:
            s += pick(KINDS)()
        out.write(json.dumps(s, ensure_ascii=False) + "\n")


if __name__ == "__main__":
    main()
