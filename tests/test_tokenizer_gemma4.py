"""The Gemma 4 tokenizer (`tokenizer.ggml.model = "gemma4"`, pyggml/llm/tokenizer.py) gives
llama.cpp's ids and texts: tests/data/gemma4_tokenizer_refs.json, made by
tools/make_gemma4_vocab_refs.py with llama-cpp-python 0.3.36 on a vocabulary it derives from
llama.cpp's SPM test vocabulary (regenerated here, byte for byte: sha256 checked), over the
358-string tokenizer corpus (spaces as ▁, newline runs, byte fallback, special tokens)."""
import hashlib
import json
import sys
from pathlib import Path

import pytest

from pyggml.llm.tokenizer import Tokenizer

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))
import make_gemma4_vocab_refs as G  # noqa: E402

REFS = json.loads((ROOT / "tests" / "data" / "gemma4_tokenizer_refs.json").read_text("utf-8"))


@pytest.fixture(scope="module")
def tok(tmp_path_factory):
    p = G.write_vocab(tmp_path_factory.mktemp("g4vocab") / "vocab.gguf")
    assert hashlib.sha256(p.read_bytes()).hexdigest() == REFS["vocab_sha256"]
    return Tokenizer.from_gguf(p)


def test_vocabulary_settings_as_llamacpp(tok):
    assert tok.pre == "gemma4" and tok.escape_ws and not tok.is_spm
    assert tok.add_bos and tok.bos_id == 1          # forced on: the file says false


def test_ids_and_texts_equal_llamacpp(tok):
    rows = REFS["rows"]
    assert len(rows) >= 300
    n_newline_runs = n_bytes = 0
    for r in rows:
        assert tok.encode(r["text"], add_special=True) == r["ids"], repr(r["text"])
        got = tok.encode(r["text"], add_special=True, parse_special=True)
        assert got == r["ids_special"], repr(r["text"])
        assert tok.detokenize(got, special=True).decode("utf-8", "replace") == r["detok"], \
            repr(r["text"])
        n_newline_runs += any(tok.token_text(i).strip("\n") == "" for i in got[1:])
        n_bytes += any(tok.token_text(i).startswith("<0x") for i in got[1:])
    # the corpus reaches the gemma4-specific paths
    assert n_newline_runs > 20 and n_bytes > 20
