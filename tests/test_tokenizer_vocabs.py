"""Every BPE pre-tokenizer llama.cpp's own vocabulary tests cover (command-r, deepseek-coder,
deepseek-llm, falcon, gpt-2, llama-bpe, mpt, qwen2, qwen35, refact, starcoder): the test texts
(ggml-vocab-NAME.gguf.inp) give llama.cpp's ids (.out). The vocabularies are reduced to the part
those texts touch (tests/data/vocab_vectors.json, made by tools/make_vocab_vectors.py from the
llama-cpp-python 0.3.36 sdist; its docstring says why the ids are those of the full vocabulary);
the SPM vocabularies (llama-spm, phi-3) are tested whole in tests/test_tokenizer.py. The
.inp texts hardly tell some pre-tokenizers apart (qwen35 differs from qwen2 in combining marks
only), so 17 more texts with marks, Indic / Thai / CJK / Hangul and full-width forms are added,
with the ids llama.cpp gives on the full vocabularies (make_vocab_vectors.EXTRA_TEXTS); the
gpt-2 vocabulary relabelled with each pre-tokenizer is checked on a 358-string corpus in
tests/test_tokenizer_refs.py."""
import json
from pathlib import Path

import pytest

from pyggml.llm import Tokenizer

DATA = json.loads((Path(__file__).resolve().parent / "data" / "vocab_vectors.json")
                  .read_text(encoding="utf-8"))
NORMAL = 1


def tokenizer_of(v: dict) -> Tokenizer:
    """A Tokenizer with the vocabulary's ids: the kept tokens at their ids, the others empty."""
    tokens = [""] * v["n_vocab"]
    types = [NORMAL] * v["n_vocab"]
    for i, t in v["tokens"].items():
        tokens[int(i)] = t
    for i, t in v["token_types"].items():
        types[int(i)] = t
    import numpy as np
    kv = {**v["metadata"], "tokenizer.ggml.model": v["model"], "tokenizer.ggml.tokens": tokens,
          "tokenizer.ggml.token_type": np.asarray(types, np.int32),
          "tokenizer.ggml.merges": v["merges"]}
    return Tokenizer.from_metadata(kv)


def test_every_bpe_vocab_test_file_is_covered():
    assert set(DATA) == {"command-r", "deepseek-coder", "deepseek-llm", "falcon", "gpt-2",
                         "llama-bpe", "mpt", "qwen2", "qwen35", "refact", "starcoder"}
    assert {v["metadata"]["tokenizer.ggml.pre"] for v in DATA.values()} == set(DATA)


@pytest.mark.parametrize("name", sorted(DATA))
def test_llama_cpp_vocab_vectors(name):
    v = DATA[name]
    tok = tokenizer_of(v)
    assert tok.pre == name and len(v["texts"]) >= 60
    failures = []
    for text, ids in zip(v["texts"], v["ids"]):
        got = tok.encode(text, add_special=False, parse_special=False)
        if got != ids:
            failures.append((text, got, ids))
    assert not failures, f"{name}: {len(failures)} texts differ, first: {failures[0]}"
    # and back: without llama.cpp's clean-up of spaces before punctuation the ids decode to
    # the text itself (byte-level BPE keeps every byte)
    if not tok.clean_spaces:
        for text, ids in zip(v["texts"], v["ids"]):
            assert tok.decode(ids) == text, (name, text)


@pytest.mark.parametrize("name", ["deepseek-coder", "deepseek-llm"])
def test_deepseek_pretokenizers_split_as_llama_cpp(name):
    tok = tokenizer_of(DATA[name])
    # digits one by one (coder) / as runs (llm); CJK runs apart from Latin words; newlines alone
    words = tok.pretokenize("abc 123\n\n汉字 x")
    digits = ["1", "2", "3"] if name == "deepseek-coder" else ["123"]
    assert words == ["abc", " "] + digits + ["\n", "\n", "汉字", " x"]
