"""Compact test data from llama.cpp's BPE vocabulary test files (the llama-cpp-python sdist's
vendor/llama.cpp/models/ggml-vocab-NAME.gguf with .inp/.out), for tests/test_tokenizer_vocabs.py:
the vocabularies are 1-11 MB each, the data the tests need a few KB.

    .venv/bin/python tools/make_vocab_vectors.py \
        /work/ref/llama-cpp-python-0.3.36/vendor/llama.cpp/models tests/data/vocab_vectors.json \
        /work/ref/llamacpp-venv/bin/python

The third argument, a Python with llama_cpp, adds EXTRA_TEXTS (combining marks, scripts whose
letters carry marks, CJK next to Latin, digit runs: where the pre-tokenizers of these
vocabularies differ and llama.cpp's .inp files have nothing) with the ids llama.cpp gives on
the full vocabulary (`Llama(vocab_only=True).tokenize(text, add_bos=False, special=False)`).

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
EXTRA_TEXTS = ["Cafe\u0301", "e\u0301", " a\u0300\u0301\u0302b", "\u0301x", "x \u0301 y",
               "Vie\u0302\u0301t Nam", "\u1e01\u0308 \u0308a", "1\u03012", "'\u0301s",
               "\u0928\u092e\u0938\u094d\u0924\u0947 \u0926\u0941\u0928\u093f\u092f\u093e",
               "\u0e2a\u0e27\u0e31\u0e2a\u0e14\u0e35\u0e0a\u0e32\u0e27\u0e42\u0e25\u0e01",
               "\u6c49\u5b57abc\u6c49\u5b57 123456 \u4e2d\u6587x",
               "\uc548\ub155\ud558\uc138\uc694 \uc138\uacc4!", "\uff21\uff22\uff23\uff01\u3002 \u2018q\u2019",
               "x  \n\n  y\r\n", "price: $1,234.56 (approx.)", "a\u00b5b \u0391\u03b2\u03b3 \u0436\u0437"]
_WORKER = r"""
import json, sys, llama_cpp
job = json.load(open(sys.argv[1], encoding="utf-8"))
out = {}
for name, path in job["vocabs"].items():
    llm = llama_cpp.Llama(model_path=path, vocab_only=True, verbose=False)
    out[name] = [llm.tokenize(t.encode(), add_bos=False, special=False) for t in job["texts"]]
json.dump(out, open(sys.argv[2], "w", encoding="utf-8"))
"""


def llama_cpp_ids(llama_python: str, vocabs: dict) -> dict:
    """{name: ids of EXTRA_TEXTS} from llama.cpp on each full vocabulary."""
    import subprocess
    import tempfile
    with tempfile.TemporaryDirectory() as tmp:
        job, out = Path(tmp) / "job.json", Path(tmp) / "out.json"
        job.write_text(json.dumps({"vocabs": vocabs, "texts": EXTRA_TEXTS}), encoding="utf-8")
        subprocess.run([llama_python, "-c", _WORKER, str(job), str(out)], check=True)
        return json.loads(out.read_text(encoding="utf-8"))


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


def compact(models: Path, name: str, extra_ids=None) -> dict:
    path = models / f"ggml-vocab-{name}.gguf"
    kv = read_gguf_tokenizer_metadata(path)
    tok = Tokenizer.from_metadata(kv)
    texts, expected = vectors(models, name)
    if extra_ids is not None:
        texts, expected = texts + EXTRA_TEXTS, expected + extra_ids
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
    if len(argv) not in (2, 3):
        print(__doc__)
        return 2
    models, out = Path(argv[0]), Path(argv[1])
    data = {}
    names = {}
    for p in sorted(models.glob("ggml-vocab-*.gguf")):
        name = p.name[len("ggml-vocab-"):-len(".gguf")]
        if not (models / f"{p.name}.out").exists():
            continue
        kv = read_gguf_tokenizer_metadata(p)
        if kv.get("tokenizer.ggml.model") != "gpt2":
            continue         # SPM vocabularies are small enough to be committed whole
        names[name] = str(p)
    extra = llama_cpp_ids(argv[2], names) if len(argv) == 3 else {}
    for name in names:
        data[name] = compact(models, name, extra.get(name))
        print(f"{name}: pre={data[name]['metadata'].get('tokenizer.ggml.pre')}, "
              f"{len(data[name]['tokens'])} tokens, "
              f"{len(data[name]['merges'])} merges, {len(data[name]['texts'])} texts")
    out.write_text(json.dumps(data, ensure_ascii=False, sort_keys=True) + "\n", encoding="utf-8")
    print(f"{out}: {out.stat().st_size} bytes")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
