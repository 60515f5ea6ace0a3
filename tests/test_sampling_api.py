"""The sampling keywords of the Python API (create_completion / create_chat_completion /
LLM.generate: typical_p, mirostat, XTC, DRY, ...) reach the sampler, and n > 1 choices share
the prompt's cells yet give, choice by choice, what n = 1 runs with seed + i give."""

from __future__ import annotations

import numpy as np
import pytest

from pyggml.errors import ModelError
from pyggml.llm.completion import sampling_params
from pyggml.llm.runtime import LLM
from pyggml.llm.sampler import Sampler

PROMPT = list(range(5, 25))


@pytest.fixture(scope="module")
def tiny(tiny_models):
    tm = tiny_models.get(arch="gemma3", weight_type="f32", n_layer=2)
    with LLM(tm.path, n_ctx=512, n_threads=1, n_seq_max=4) as m:
        yield m


def _by_hand(m, n_tokens: int, **kw) -> list[int]:
    """The tokens the sampler picks, decoding one token at a time (no generation loop)."""
    s = Sampler(sampling_params(**kw), m.tokenizer)
    for t in PROMPT:
        s.accept(t)
    m.reset()
    logits = m.eval(PROMPT)
    out = []
    for _ in range(n_tokens):
        t = s.sample(logits)
        s.accept(t)
        out.append(t)
        logits = m.eval([t])
    m.reset()
    return out


@pytest.mark.parametrize("kw", [
    {"mirostat_mode": 2, "mirostat_tau": 3.0, "temperature": 1.0},
    {"mirostat": 1, "temperature": 1.5},
    {"typical_p": 0.6, "temperature": 1.2, "top_k": 0, "min_p": 0.0},
    {"xtc_probability": 0.7, "xtc_threshold": 0.02, "temperature": 1.0},
    {"dry_multiplier": 2.0, "dry_allowed_length": 1, "temperature": 0.0,
     "presence_penalty": 0.3, "logit_bias": {7: 5.0}},
])
def test_api_keywords_reach_the_sampler(tiny, kw):
    want = _by_hand(tiny, 12, seed=42, **kw)
    out = tiny.create_completion(PROMPT, max_tokens=12, seed=42, stop_at_eog=False, **kw)
    assert out["choices"][0]["text"] == tiny.detokenize(want)
    got = [t.id for t in tiny.generate(PROMPT, 12, seed=42, stop_at_eog=False,
                                       **kw)]
    assert got == want


def test_n_choices_share_the_prompt_and_equal_single_runs(tiny):
    kw = dict(max_tokens=10, temperature=40.0, top_k=0, top_p=1.0, min_p=0.0, seed=7,
              stop_at_eog=False)
    singles = [tiny.create_completion(PROMPT, **dict(kw, seed=7 + i))["choices"][0]["text"]
               for i in range(3)]
    tiny.reset()
    n_prompt_before = tiny.stats.n_prompt_tokens
    out = tiny.create_completion(PROMPT, n=3, **kw)
    # the prompt is evaluated once, plus its last two tokens for each other choice
    assert tiny.stats.n_prompt_tokens - n_prompt_before == len(PROMPT) + 2 * 2
    assert [c["index"] for c in out["choices"]] == [0, 1, 2]
    assert [c["text"] for c in out["choices"]] == singles
    assert len(set(singles)) > 1
    assert out["usage"]["completion_tokens"] == 30
    # the first choice's sequence holds what n=1 leaves; the others gave their cells back
    assert len(tiny.seq_tokens(0)) == len(PROMPT) + 9
    assert all(tiny.seq_tokens(s) == [] for s in (1, 2, 3))


def test_n_choices_streamed(tiny):
    kw = dict(max_tokens=6, temperature=40.0, top_k=0, top_p=1.0, min_p=0.0, seed=3,
              stop_at_eog=False)
    whole = tiny.create_completion(PROMPT, n=2, **kw)
    texts, ends = ["", ""], {}
    for ch in tiny.create_completion(PROMPT, n=2, stream=True, **kw):
        for c in ch["choices"]:
            texts[c["index"]] += c["text"]
            if c["finish_reason"]:
                ends[c["index"]] = c["finish_reason"]
    assert texts == [c["text"] for c in whole["choices"]]
    assert ends == {0: "length", 1: "length"}


def test_n_chat_choices(tiny):
    msgs = [{"role": "user", "content": "hi"}]
    out = tiny.create_chat_completion(msgs, n=2, max_tokens=5, temperature=1.0, seed=1)
    assert [c["index"] for c in out["choices"]] == [0, 1]
    one = tiny.create_chat_completion(msgs, max_tokens=5, temperature=1.0, seed=2)
    assert out["choices"][1]["message"] == one["choices"][0]["message"]


def test_bad_requests(tiny):
    with pytest.raises(ModelError, match="n_seq_max=4"):
        tiny.create_completion(PROMPT, n=5)
    with pytest.raises(ModelError, match="n must be"):
        tiny.create_completion(PROMPT, n=0)
    with pytest.raises(TypeError, match="'top_a'"):
        tiny.create_completion(PROMPT, top_a=0.1)
    with pytest.raises(ModelError, match="tfs_z"):
        tiny.create_completion(PROMPT, tfs_z=0.9)
    with pytest.raises(ModelError, match="mirostat"):
        tiny.create_completion(PROMPT, mirostat_mode=3)
    with pytest.raises(ModelError, match="speculative"):
        tiny.generate(PROMPT, 4, xtc_probability=0.5, draft="lookup").__next__()
    assert np.isfinite(sampling_params(tfs_z=1.0).temperature)
