"""Compact test data from llama.cpp's BPE vocabulary test files (the llama-cpp-python sdist's
vendor/llama.cpp/models/ggml-vocab-NAME.gguf with .inp/.out), for tests/test_tokenizer_vocabs.py:
the vocabularies are 1-11 MB each, the data the tests need a few KB.

    .venv/bin/python tools/make_vocab_vectors.py \
        /work/ref/llama-cpp-python-0.3.36/vendor/llama.cpp/models tests/data/vocab_vectors.json

Per vocabulary: its tokenizer metadata (`tokenizer.ggml.pre` and the scalar keys), the texts of
.inp and llama.cpp's ids of .out, and the part of the vocabulary tokenizing those texts touches:
every merge pair looked up that exists (a superset of the merges applied), every token text
looked up that exists, the 256 byte-level symbols, and all non-normal (special) tokens; ids and
the merges' relative rank order are kept. Byte-pair encoding with that subset gives the same ids
as with the full vocabulary: at every step the lowest-rank applicable merge of the full table is
in the subset, and nothing the subset lacks was ever applicable. The tool checks the texts
tokenize to .out before writing (with pyggml's tokenizer on the full vocabulary), so the data is
also evidence that the full vocabularies pass.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from pyggml.llm.tokenizer import (Tokenizer, _B2U,  # noqa: E402
                                  read_gguf_tokenizer_metadata)

SEP = "\n__ggml_vocab_test__\n"
NORMAL = 1


class _Recording(dict):
    """A dict that remembers every key looked up that it holds."""

    def __init__(self, d):
        super().__init__(d)
        self.hits = set()

    def get(self, k, default=None):
        if dict.__contains__(self, k):
            self.hits.add(k)
        return dict.get(self, k, default)

    def __contains__(self, k):
        found = dict.__contains__(self, k)
        if found:
            self.hits.add(k)
        return found

    def __getitem__(self, k):
        v = dict.__getitem__(self, k)
        self.hits.add(k)
        return v


def vectors(models: Path, name: str):
    texts = (models / f"ggml-vocab-{name}.gguf.inp").read_text(encoding="utf-8").split(SEP)
    lines = (models / f"ggml-vocab-{name}.gguf.out").read_text(encoding="utf-8").split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    if len(texts) == len(lines) + 1 and texts[-1] == "":
        texts.pop()
    assert len(texts) == len(lines), name
    return texts, [[int(x) for x in line.split()] for line in lines]


def compact(models: Path, name: str) -> dict:
    path = models / f"ggml-vocab-{name}.gguf"
    kv = read_gguf_tokenizer_metadata(path)
    tok = Tokenizer.from_metadata(kv)
    texts, expected = vectors(models, name)
    tok._ranks, tok._to_id = _Recording(tok._ranks), _Recording(tok._to_id)
    tok._word_cache.clear()
    for text, ids in zip(texts, expected):
        got = tok.encode(text, add_special=False, parse_special=False)
        if got != ids:
            raise SystemExit(f"{name}: {text!r} gives {got}, llama.cpp {ids}: not writing data")
    tokens = list(kv["tokenizer.ggml.tokens"])
    types = [int(t) for t in kv["tokenizer.ggml.token_type"]]
    keep = {tok._to_id[t] for t in tok._to_id.hits}
    keep |= {i for ids in expected for i in ids}
    keep |= {i for i, t in enumerate(types) if t != NORMAL}
    keep |= {dict.get(tok._to_id, c) for c in _B2U if dict.get(tok._to_id, c) is not None}
    merges = list(kv["tokenizer.ggml.merges"])
    hit = {f"{a} {b}" for a, b in tok._ranks.hits}
    scalars = {k: v for k, v in kv.items() if k.startswith("tokenizer.ggml.") and
               isinstance(v, (str, int, float, bool)) and k != "tokenizer.ggml.model"}
    return {"model": kv["tokenizer.ggml.model"], "n_vocab": len(tokens), "metadata": scalars,
            "tokens": {str(i): tokens[i] for i in sorted(keep)},
            "token_types": {str(i): types[i] for i in sorted(keep) if types[i] != NORMAL},
            "merges": [m for m in merges if m in hit], "texts": texts, "ids": expected}


def main(argv) -> int:
    if len(argv) != 2:
        print(__doc__)
        return 2
    models, out = Path(argv[0]), Path(argv[1])
    data = {}
    for p in sorted(models.glob("ggml-vocab-*.gguf")):
        name = p.name[len("ggml-vocab-"):-len(".gguf")]
        if not (models / f"{p.name}.out").exists():
            continue
        kv = read_gguf_tokenizer_metadata(p)
        if kv.get("tokenizer.ggml.model") != "gpt2":
            continue         # SPM vocabularies are small enough to be committed whole
        data[name] = compact(models, name)
        print(f"{name}: pre={kv.get('tokenizer.ggml.pre')}, {len(data[name]['tokens'])} tokens, "
              f"{len(data[name]['merges'])} merges, {len(data[name]['texts'])} texts")
    out.write_text(json.dumps(data, ensure_ascii=False, sort_keys=True) + "\n", encoding="utf-8")
    print(f"{out}: {out.stat().st_size} bytes")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
