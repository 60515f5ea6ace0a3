"""logit_bias, presence and frequency penalties (pyggml/llm/sampler.py) as llama.cpp applies them
(src/llama-sampling.cpp: llama_sampler_logit_bias_apply, llama_sampler_penalties_apply), checked
against a transcription of that C code on fixed logits; off, every output is what it was."""

from __future__ import annotations

from collections import Counter, deque

import numpy as np
import pytest

from pyggml.errors import ModelError
from pyggml.llm.completion import sampling_params
from pyggml.llm.sampler import Sampler, SamplingParams


def llamacpp_penalties(logits, last, repeat, freq, present, last_n):
    """llama_sampler_penalties_apply, one candidate at a time in fp32."""
    out = np.array(logits, dtype=np.float32)
    if last_n == 0 or (repeat == 1.0 and freq == 0.0 and present == 0.0):
        return out
    window = list(last)[-last_n:] if last_n > 0 else list(last)
    counts = Counter(window)
    f32 = np.float32
    for tok, count in counts.items():
        x = out[tok]
        x = x * f32(repeat) if x <= 0 else x / f32(repeat)
        x = x - (f32(count) * f32(freq) + f32(count > 0) * f32(present))
        out[tok] = x
    return out


def _logits(n=64, seed=1):
    return np.random.default_rng(seed).normal(0, 3, n).astype(np.float32)


@pytest.mark.parametrize("repeat,freq,present,last_n", [
    (1.0, 0.5, 0.0, 64), (1.0, 0.0, 0.7, 64), (1.3, 0.4, 0.6, 64), (1.1, 1.5, -0.5, 8),
    (1.0, 0.2, 0.2, -1), (1.3, 0.5, 0.5, 0)])
def test_penalties_equal_llamacpps_on_fixed_logits(repeat, freq, present, last_n):
    logits = _logits()
    history = [3, 5, 5, 9, 3, 3, 40, 63, 5, 0, 0, 12] * 3
    p = SamplingParams(temperature=0.0, repeat_penalty=repeat, frequency_penalty=freq,
                       presence_penalty=present, repeat_last_n=last_n)
    s = Sampler(p)
    for t in history:
        s.accept(t)
    want = llamacpp_penalties(logits, history, repeat, freq, present, last_n)
    # greedy: the argmax of llama.cpp's penalized logits
    assert s.sample(logits) == int(np.argmax(want))
    # sampled: the same candidates and weights as the chain run on llama.cpp's logits
    p2 = SamplingParams(temperature=0.9, top_k=0, top_p=1.0, min_p=0.0,
                        repeat_penalty=repeat, frequency_penalty=freq, presence_penalty=present,
                        repeat_last_n=last_n, seed=7)
    s2, plain = Sampler(p2), Sampler(SamplingParams(temperature=0.9, top_k=0, top_p=1.0,
                                                    min_p=0.0, seed=7))
    for t in history:
        s2.accept(t)
    ids, w = s2.distribution(logits)
    ids0, w0 = plain.distribution(want)
    assert np.array_equal(ids, ids0) and np.array_equal(w, w0)
    assert s2.sample(logits) == plain.sample(want)          # same seed, same draw


def test_off_is_bit_identical_to_the_chain_without_them():
    logits = _logits(300, 3)
    for temp in (0.0, 0.8):
        a = Sampler(SamplingParams(temperature=temp, repeat_penalty=1.2, seed=11))
        b = Sampler(SamplingParams(temperature=temp, repeat_penalty=1.2, seed=11,
                                   presence_penalty=0.0, frequency_penalty=0.0, logit_bias=()))
        for t in (1, 2, 2, 7):
            a.accept(t)
            b.accept(t)
        for _ in range(20):
            ia, wa = a.candidates(logits)
            ib, wb = b.candidates(logits)
            assert np.array_equal(ia, ib) and (wa is None and wb is None or
                                               np.array_equal(wa, wb))
            assert a.sample(logits) == b.sample(logits)


def test_logit_bias_adds_first_and_minus_inf_bans():
    logits = _logits()
    top = int(np.argmax(logits))
    s = Sampler(SamplingParams(temperature=0.0, logit_bias={top: float("-inf")}))
    second = int(np.argsort(-logits)[1])
    assert s.sample(logits) == second
    s = Sampler(SamplingParams(temperature=0.0, logit_bias=[[5, 100.0]]))
    assert s.sample(logits) == 5
    # before the penalties: the bias is added, then the repetition penalty divides
    s = Sampler(SamplingParams(temperature=0.9, top_k=0, top_p=1.0, min_p=0.0, seed=1,
                               logit_bias={5: 2.0}, repeat_penalty=2.0))
    s.accept(5)
    biased = logits.copy()
    biased[5] += np.float32(2.0)
    ref = llamacpp_penalties(biased, [5], 2.0, 0.0, 0.0, 64)
    ids, w = s.distribution(logits)
    ids0, w0 = Sampler(SamplingParams(temperature=0.9, top_k=0, top_p=1.0, min_p=0.0,
                                      seed=1)).distribution(ref)
    assert np.array_equal(ids, ids0) and np.allclose(w, w0, rtol=0, atol=0)


def test_bad_values_are_refused_by_name():
    with pytest.raises(ModelError, match="presence_penalty"):
        sampling_params(presence_penalty=float("nan"))
    with pytest.raises(ModelError, match="logit_bias"):
        sampling_params(logit_bias={-1: 1.0})
    with pytest.raises(ModelError, match="outside the vocabulary"):
        Sampler(SamplingParams(logit_bias={1000: 1.0})).sample(_logits())


def test_speculative_distribution_sees_the_counts():
    """The speculative rule passes its own history (a deque with repeats): counts matter."""
    logits = _logits()
    p = SamplingParams(temperature=0.0, frequency_penalty=5.0)
    s = Sampler(p)
    top = int(np.argmax(logits))
    once = s.distribution(logits, deque([top]))[0][0]
    hist = deque([top] * 3)
    thrice = s.distribution(logits, hist)[0][0]
    want1 = np.argmax(llamacpp_penalties(logits, [top], 1.0, 5.0, 0.0, 64))
    want3 = np.argmax(llamacpp_penalties(logits, [top] * 3, 1.0, 5.0, 0.0, 64))
    assert (once, thrice) == (want1, want3)

