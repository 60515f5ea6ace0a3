"""save_state / load_state (pyggml/llm/state.py) and the prompt caches: a restored sequence
continues exactly as the one it was saved from (dense, sliding-window and hybrid models, into
another sequence), another model's state is refused by name, the caches restore the longest
prefix and stay within their bytes."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

from pyggml.llm.runtime import LLM
from pyggml.llm.state import (LlamaDiskCache, LlamaRAMCache, StateError, read_state,
                              write_state)

ROOT = Path(__file__).resolve().parents[1]
PROMPT = list(range(5, 45))


def _continue(m, seq_id, toks):
    return [m.eval([t], seq_id=seq_id) for t in toks]


@pytest.mark.parametrize("kind", ["dense", "swa"])
def test_a_restored_sequence_continues_exactly(tiny_models, kind, tmp_path):
    kw = {"sliding_window": 8} if kind == "swa" else {}
    tm = tiny_models.get(arch="gemma3", weight_type="q8_0", n_layer=2, **kw)
    with LLM(tm.path, n_ctx=512, n_threads=1, n_seq_max=2, n_ubatch=16) as m:
        m.eval(PROMPT)
        st = m.save_state()
        assert st.n_tokens == len(PROMPT) and st.input_ids.tolist() == PROMPT
        want = _continue(m, 0, [7, 8, 9])
        m.reset()
        m.load_state(st, seq_id=1)                   # another sequence
        assert m.seq_tokens(1) == PROMPT
        got = _continue(m, 1, [7, 8, 9])
        assert all(np.array_equal(a, b) for a, b in zip(got, want))
        # through a file
        write_state(st, tmp_path / "s.npz")
        m.reset()
        m.load_state(read_state(tmp_path / "s.npz"))
        got = _continue(m, 0, [7, 8, 9])
        assert all(np.array_equal(a, b) for a, b in zip(got, want))


def test_hybrid_state_holds_the_recurrent_rows(tmp_path):
    sys.path.insert(0, str(ROOT / "tools"))
    import make_hybrid_models as H
    path = H.write_variant("lfm2", tmp_path / "lfm2.gguf")
    with LLM(path, n_ctx=256, n_threads=1, n_seq_max=2) as m:
        m.eval(PROMPT[:20])
        st = m.save_state()
        assert st.recurrent is not None
        want = _continue(m, 0, [3, 4])
        m.reset()
        m.load_state(st, seq_id=1)
        got = _continue(m, 1, [3, 4])
        assert all(np.array_equal(a, b) for a, b in zip(got, want))


def test_another_models_state_is_refused(tiny_models):
    a = tiny_models.get(arch="gemma3", weight_type="q8_0", n_layer=2)
    b = tiny_models.get(arch="gemma3", weight_type="q8_0", n_layer=3)
    with LLM(a.path, n_ctx=256, n_threads=1) as m:
        m.eval(PROMPT)
        st = m.save_state()
    with LLM(b.path, n_ctx=256, n_threads=1) as m, pytest.raises(StateError, match="n_layer"):
        m.load_state(st)
    with LLM(a.path, n_ctx=256, n_threads=1, type_k="f32") as m, \
            pytest.raises(StateError, match="types_k"):
        m.load_state(st)
    with LLM(a.path, n_ctx=256, n_threads=1) as m, pytest.raises(StateError, match="LlamaState"):
        m.load_state({"tokens": PROMPT})


def test_a_damaged_state_file_is_a_state_error(tmp_path):
    p = tmp_path / "bad.npz"
    p.write_bytes(b"PK\x03\x04 not really")
    with pytest.raises(StateError, match="not a pyggml state file"):
        read_state(p)


@pytest.mark.parametrize("cache_kind", ["ram", "disk"])
def test_prompt_cache_restores_the_longest_prefix(tiny_models, tmp_path, cache_kind):
    tm = tiny_models.get(arch="gemma3", weight_type="q8_0", n_layer=2)
    with LLM(tm.path, n_ctx=512, n_threads=1) as m:
        cache = LlamaRAMCache() if cache_kind == "ram" else LlamaDiskCache(tmp_path / "c")
        m.set_cache(cache)
        first = m.create_completion(PROMPT, max_tokens=4, temperature=0)
        assert PROMPT in cache and cache[PROMPT].n_tokens >= len(PROMPT)
        m.reset()                                    # the sequence forgets; the cache has it
        before = m.stats.n_prompt_tokens
        again = m.create_completion(PROMPT, max_tokens=4, temperature=0)
        assert again["choices"][0]["text"] == first["choices"][0]["text"]
        assert m.stats.n_prompt_tokens - before == 2      # only the last two evaluated again
        if cache_kind == "disk":                     # a new instance finds the files
            assert PROMPT in LlamaDiskCache(tmp_path / "c")


@pytest.mark.parametrize("cache_kind", ["ram", "disk"])
def test_prompt_caches_stay_within_capacity(tiny_models, tmp_path, cache_kind):
    tm = tiny_models.get(arch="gemma3", weight_type="q8_0", n_layer=2)
    with LLM(tm.path, n_ctx=512, n_threads=1) as m:
        m.eval(PROMPT)
        size = m.save_state().n_bytes
        cap = int(size * 2.5)
        cache = LlamaRAMCache(cap) if cache_kind == "ram" else LlamaDiskCache(tmp_path, cap)
        for k in range(4):
            m.reset()
            m.eval([k + 1] + PROMPT[1:])
            cache[[k + 1] + PROMPT[1:]] = m.save_state()
        assert cache.cache_size <= cap
        assert [1] + PROMPT[1:] not in cache and [4] + PROMPT[1:] in cache
        if cache_kind == "disk":
            assert len(list(tmp_path.glob("state-*.npz"))) == 2
