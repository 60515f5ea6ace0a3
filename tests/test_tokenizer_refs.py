"""Tokenizers against llama.cpp reference data made by tools/make_tokenizer_refs.py (llama.cpp
through llama-cpp-python, run once; the ids and texts are committed under tests/data):

- the default model's Gemma 3 vocabulary (SPM) on a corpus of several hundred strings;
- the gpt-2 test vocabulary relabelled with the llama3, qwen2, smollm, default and falcon
  pre-tokenizers."""
import hashlib
import json
import unicodedata
from pathlib import Path

import pytest

from pyggml.errors import PyggmlError
from pyggml.llm import Tokenizer
from pyggml.llm.tokenizer import read_gguf_tokenizer_metadata

DATA = Path(__file__).resolve().parent / "data"
GEMMA_REFS = json.loads((DATA / "gemma3_tokenizer_refs.json").read_text(encoding="utf-8"))
BPE_REFS = json.loads((DATA / "bpe_pretokenizer_refs.json").read_text(encoding="utf-8"))
GPT2_VOCAB = DATA / "tokenizer-tests" / "ggml-vocab-gpt-2.gguf"


@pytest.fixture(scope="module")
def gemma():
    try:
        from pyggml.models_default import ensure_default_model
        path = ensure_default_model()
    except PyggmlError as e:
        pytest.skip(f"default model not available: {e}")
    return Tokenizer.from_gguf(path)


def _mismatches(cases, fn, key):
    bad = [(c["text"], c[key], got) for c in cases if (got := fn(c)) != c[key]]
    return f"{len(bad)}/{len(cases)} differ from llama.cpp, first: {bad[0] if bad else None}"


def test_corpus_is_varied():
    texts = [c["text"] for c in GEMMA_REFS["cases"]]
    assert len(texts) >= 200

    def has(pred):
        return sum(1 for t in texts if pred(t))

    assert has(lambda t: t.isascii() and t.strip()) >= 50
    assert has(lambda t: any(unicodedata.category(ch) == "Mn" or "À" <= ch <= "ÿ"
                             for ch in t)) >= 10                                 # accents
    assert has(lambda t: any("\u4e00" <= ch <= "\u9fff" or "\u3040" <= ch <= "\u30ff"
                             for ch in t)) >= 10
    assert has(lambda t: any(ord(ch) >= 0x1F300 for ch in t)) >= 10             # emoji
    assert has(lambda t: "  " in t or "\t" in t) >= 20                           # whitespace runs
    assert has(lambda t: t.startswith(" ")) >= 10 and has(lambda t: "\n" in t) >= 30
    assert has(lambda t: any(ch.isdigit() for ch in t)) >= 20
    assert has(lambda t: "<start_of_turn>" in t or "<end_of_turn>" in t) >= 10
    assert has(lambda t: "def " in t or "{" in t or ";" in t) >= 10              # code


def test_gemma_vocab_matches(gemma):
    ref = GEMMA_REFS
    assert gemma.n_vocab == ref["n_vocab"]
    assert (gemma.bos_id, gemma.eos_id, gemma.eot_id) == (ref["bos"], ref["eos"], ref["eot"])
    assert (gemma.add_bos, gemma.add_eos) == (ref["add_bos"], ref["add_eos"])
    assert sorted(gemma.eog_ids) == ref["eog"]
    attrs = b"".join(int(gemma.token_attr(i)).to_bytes(4, "little") for i in range(gemma.n_vocab))
    assert hashlib.sha256(attrs).hexdigest() == ref["attrs_sha256"]


@pytest.mark.parametrize("special", [False, True])
def test_gemma_every_piece_matches(gemma, special):
    h = hashlib.sha256()
    for i in range(gemma.n_vocab):
        piece = gemma.token_to_piece(i, special)
        h.update(len(piece).to_bytes(4, "little") + piece)
    assert h.hexdigest() == GEMMA_REFS["pieces_sha256"]["special" if special else "plain"]


@pytest.mark.parametrize("key, add_special, parse_special", [
    ("ids", True, True), ("ids_plain", True, False), ("ids_nobos", False, False)])
def test_gemma_ids_match_llama_cpp(gemma, key, add_special, parse_special):
    cases = GEMMA_REFS["cases"]
    msg = _mismatches(cases, lambda c: gemma.encode(c["text"], add_special, parse_special), key)
    assert msg.startswith("0/"), msg


@pytest.mark.parametrize("key, ids_key, special", [
    ("detok", "ids", False), ("detok_special", "ids", True), ("detok_plain", "ids_plain", False)])
def test_gemma_detokenize_matches_llama_cpp(gemma, key, ids_key, special):
    cases = GEMMA_REFS["cases"]
    msg = _mismatches(cases, lambda c: gemma.detokenize(c[ids_key], special).decode(
        "utf-8", "surrogateescape"), key)
    assert msg.startswith("0/"), msg


def test_gemma_round_trip(gemma):
    """decode(encode(s)) == s for the whole corpus; SentencePiece reads a literal '▁' as a space
    (llama.cpp too), so there the expected text has spaces."""
    for c in GEMMA_REFS["cases"]:
        text = c["text"]
        assert gemma.decode(gemma.encode(text)) == text.replace("\u2581", " ")
        ids = gemma.encode(text, parse_special=True)
        assert gemma.decode(ids, special=True) == "<bos>" + text.replace("\u2581", " ")


def test_gemma_chat_prompt(gemma):
    ids = gemma.encode("<start_of_turn>user\nHi<end_of_turn>\n", parse_special=True)
    assert ids[:2] == [2, 105] and 106 in ids and 107 in ids     # 107: "\n" (USER_DEFINED)
    assert gemma.is_eog(106) and gemma.is_eog(1) and not gemma.is_eog(105)


@pytest.fixture(scope="module")
def gpt2_kv():
    if not GPT2_VOCAB.is_file():
        pytest.skip(f"tokenizer test vectors not found at {GPT2_VOCAB}")
    return read_gguf_tokenizer_metadata(GPT2_VOCAB)


@pytest.mark.parametrize("pre", sorted(BPE_REFS["pre"]))
def test_bpe_pretokenizers_match_llama_cpp(gpt2_kv, pre):
    ref = BPE_REFS["pre"][pre]
    tok = Tokenizer.from_metadata({**gpt2_kv, "tokenizer.ggml.pre": pre})
    assert (tok.bos_id, tok.eos_id, tok.add_bos, tok.add_eos) == (
        ref["bos"], ref["eos"], ref["add_bos"], ref["add_eos"])
    assert sorted(tok.eog_ids) == ref["eog"]
    texts = BPE_REFS["texts"]
    assert len(texts) >= 200
    bad = []
    for i, text in enumerate(texts):
        got = (tok.encode(text, True, True), tok.encode(text, False, False),
               tok.detokenize(ref["ids"][i]).decode("utf-8", "surrogateescape"))
        want = (ref["ids"][i], ref["ids_nobos"][i], ref["detok"][i])
        if got != want:
            bad.append((text, want, got))
    assert not bad, f"{pre}: {len(bad)}/{len(texts)} differ from llama.cpp, first: {bad[0]}"
