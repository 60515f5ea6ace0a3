"""pyggml.llm.vocab.Vocab: the compact id <-> text tables behind the tokenizer."""
import random
import tracemalloc

import numpy as np
import pytest

from pyggml.llm.tokenizer import Tokenizer
from pyggml.llm.vocab import DuplicateTextError, Vocab


def _texts(n, seed=0):
    rng = random.Random(seed)
    alphabet = "ab▁é中\U0001F600 <|>"
    out = {"".join(rng.choice(alphabet) for _ in range(rng.randint(1, 12))) for _ in range(n)}
    return sorted(out)


def test_every_text_is_found_and_nothing_else():
    texts = _texts(20000) + ["\udcff\udc80raw", "<0x0A>"]         # surrogateescape bytes too
    v = Vocab.from_texts(texts)
    assert len(v) == len(texts) and list(v) == texts
    assert all(v.get(t) == i for i, t in enumerate(texts))
    assert all(v.index(t) == i and t in v for i, t in enumerate(texts[:500]))
    known = set(texts)
    misses = [t + "x" for t in texts[:2000] if t + "x" not in known]
    assert misses and all(v.get(t) is None and t not in v for t in misses)
    assert v.get("", -7) == -7 and 3 not in v
    with pytest.raises(KeyError):
        v.index("not a token")


def test_from_buffer_equals_from_texts():
    texts = _texts(3000, seed=1)
    raw = [t.encode() for t in texts]
    buf = bytearray(b"HEAD")
    starts = []
    for r in raw:                                  # GGUF-like: a length before each string
        buf += len(r).to_bytes(8, "little")
        starts.append(len(buf))
        buf += r
    v = Vocab.from_buffer(bytes(buf), np.array(starts), np.array([len(r) for r in raw]))
    assert list(v) == texts and all(v.get(t) == i for i, t in enumerate(texts))


def test_duplicates_are_named():
    with pytest.raises(DuplicateTextError) as e:
        Vocab.from_texts(["a", "b", "c", "b"])
    assert e.value.ids == (1, 3) and e.value.text == "b"


def test_gemma_tokenizer_tables_are_compact():
    """Gemma 3's 262k-token vocabulary: ~57 MiB of Python objects as lists and a dict; the
    Vocab tables are ~10 MiB and the whole tokenizer under 20 MiB (tracemalloc counts them)."""
    from pyggml.models_default import ensure_default_model
    path = ensure_default_model()
    tracemalloc.start()
    try:
        tok = Tokenizer.from_gguf(path)
        held, _ = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert tok.n_vocab == 262144
    assert tok._tokens.nbytes() < 12 << 20
    assert held < 20 << 20, f"{held / 2**20:.1f} MiB"
    assert tok.encode("Hello world", add_special=False) == [9259, 1902]


def test_tokenizer_names_a_duplicate_token():
    from pyggml.errors import TokenizerError
    kv = {"tokenizer.ggml.model": "llama", "tokenizer.ggml.tokens": ["<unk>", "a", "b", "a"]}
    with pytest.raises(TokenizerError, match=r"duplicate token 'a' at ids 1 and 3"):
        Tokenizer.from_metadata(kv)
    kv["tokenizer.ggml.tokens"] = ["<unk>", "", "b", ""]          # empty texts get a name
    tok = Tokenizer.from_metadata(kv)
    assert tok.token_text(1) == "[EMPTY_1]" and tok.text_to_id("[EMPTY_3]") == 3
