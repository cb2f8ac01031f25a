"""The reference side of tests/tokenize_reference.rs: renders each chat request of a corpus
with jinja2 the way Hugging Face transformers does for the engines (apply_chat_template:
trim_blocks, lstrip_blocks, loopcontrols, HF's tojson, raise_exception, strftime_now, the
special tokens of tokenizer_config.json, add_generation_prompt, tools, documents and
chat_template_kwargs), then tokenizes with the Python `tokenizers` package: chat prompts without
the post-processor's special tokens (as apply_chat_template), completions prompts with them.
Content parts are flattened to the text of their text parts joined by newlines, as vLLM does
for string-format templates (both test templates are).

With --strings, the IDs of each string of a strings file (one JSON string per line,
tests/fixtures/tokenize_strings.jsonl) encoded without the post-processor's tokens, one line of
space-separated IDs per string: the reference of kvgate's byte-level BPE.

Usage: tokenize-reference.py TOKENIZER_DIR CORPUS.jsonl > reference.jsonl
       tokenize-reference.py --strings TOKENIZER_DIR STRINGS.jsonl > strings.ids
"""
import json
import sys
from datetime import datetime

import jinja2
import jinja2.ext
import jinja2.sandbox
from tokenizers import Tokenizer


def environment():
    env = jinja2.sandbox.ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols]
    )

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent,
                          separators=separators, sort_keys=sort_keys)

    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    return env


def flatten(messages):
    out = []
    for message in messages:
        content = message.get("content")
        if isinstance(content, list):
            texts = [p if isinstance(p, str) else p.get("text", "")
                     for p in content
                     if isinstance(p, str) or (isinstance(p, dict) and p.get("type") == "text")]
            message = dict(message, content="\n".join(texts))
        out.append(message)
    return out


def strings_ids(model_dir, path):
    tokenizer = Tokenizer.from_file(f"{model_dir}/tokenizer.json")
    with open(path, encoding="utf-8") as f:
        strings = [json.loads(line) for line in f]
    for encoding in tokenizer.encode_batch(strings, add_special_tokens=False):
        print(" ".join(map(str, encoding.ids)))


def main():
    if sys.argv[1] == "--strings":
        strings_ids(sys.argv[2], sys.argv[3])
        return
    model_dir, corpus = sys.argv[1], sys.argv[2]
    tokenizer = Tokenizer.from_file(f"{model_dir}/tokenizer.json")
    with open(f"{model_dir}/tokenizer_config.json", encoding="utf-8") as f:
        config = json.load(f)
    special = {k: (v if isinstance(v, str) else v.get("content"))
               for k, v in config.items()
               if k.endswith("_token") and (isinstance(v, str) or
                                            (isinstance(v, dict) and "content" in v))}
    template = environment().from_string(config["chat_template"])
    with open(corpus, encoding="utf-8") as f:
        for line in f:
            if not line.strip():
                continue
            case = json.loads(line)
            body = case["body"]
            if case["endpoint"] == "completions":
                prompt, add_special = body["prompt"], True
            else:
                context = dict(special)
                context.update(
                    messages=flatten(body["messages"]),
                    tools=body.get("tools"),
                    documents=body.get("documents"),
                    add_generation_prompt=body.get("add_generation_prompt", True),
                )
                context.update(body.get("chat_template_kwargs") or {})
                prompt, add_special = template.render(**context), False
            ids = tokenizer.encode(prompt, add_special_tokens=add_special).ids
            print(json.dumps({"name": case["name"], "prompt": prompt, "ids": ids},
                             ensure_ascii=False))


if __name__ == "__main__":
    main()
