"""Batching is invisible, bit for bit: Gemma's logits of a sequence decoded inside a multi-sequence
decode_batch (its KV cells interleaved with other sequences', its prompt admitted next to other
sequences' decode tokens) equal the logits of the same sequence decoded alone, on the default
(SIMD) kernel path. The kernels guarantee it op by op (native/tests/test_gemm.c: a MUL_MAT row
among other rows = the row alone; native/tests/test_attn.c: attention rows independent of other
sequences' cells and rows); this checks the whole model."""

from __future__ import annotations

import numpy as np
import pytest

from pyggml import _native
from pyggml.llm.runtime import LLM

PROMPT_A = "The quick brown fox jumps over the lazy dog because"
PROMPT_B = "In 1492, Columbus sailed"
PROMPT_C = "def fibonacci(n):\n    "
STEPS = 6


@pytest.fixture(scope="module")
def llm():
    m = LLM(None, n_ctx=1024, n_threads=2, n_seq_max=4)
    yield m
    m.close()


def _alone(llm, tokens):
    """Logits of the prompt's last token, then of each greedy token fed back, sequence 0 alone."""
    llm.reset()
    logits = [llm.decode_batch([(tokens, 0)])[0]]
    fed = []
    for _ in range(STEPS):
        fed.append(int(np.argmax(logits[-1])))
        logits.append(llm.decode_batch([([fed[-1]], 0)])[0])
    return logits, fed


def test_default_path_is_simd():
    assert _native.cpu_path() != "scalar", "this machine runs the scalar path only"


def test_gemma_logits_in_a_batch_equal_alone(llm):
    ta, tb, tc = (llm.tokenize(p) for p in (PROMPT_A, PROMPT_B, PROMPT_C))
    want, fed = _alone(llm, ta)

    llm.reset()
    # other sequences first, so A's cells come after and between theirs
    llm.decode_batch([(tb, 1), (tc[:3], 2)])
    # A's prompt admitted together with B's decode token and the rest of C's prompt
    out = llm.decode_batch([([7], 1), (ta, 0), (tc[3:], 2)])
    got = [out[0]]
    for i in range(STEPS):
        # all three decode one token per step: A's row among B's and C's (gemm, shared tiles)
        out = llm.decode_batch([([11 + i], 2), ([fed[i]], 0), ([5 + i], 1)])
        got.append(out[0])
    for step, (w, g) in enumerate(zip(want, got)):
        assert w.dtype == g.dtype == np.float32
        assert w.tobytes() == g.tobytes(), (
            f"step {step}: logits differ in the batch (max |diff| "
            f"{float(np.max(np.abs(w - g))):.3g})")


LONG_PROMPT = ("A long prompt, so that its MUL_MATs take the prompt-sized kernels (the gemm, and on "
               "the amx path the tile gemm from 16 rows on): " + PROMPT_A + " " + PROMPT_B + " "
               + PROMPT_C)


@pytest.mark.parametrize("path", [p for p in _native.available_paths() if p != "scalar"])
def test_prompt_in_one_ubatch_equals_token_by_token(llm, path):
    """On every SIMD path this CPU runs: a 40+-token prompt evaluated in one ubatch gives each
    position the logits it gets when the tokens are fed one by one (decode kernels)."""
    was = _native.cpu_path()
    _native.set_cpu_path(path)
    try:
        toks = llm.tokenize(LONG_PROMPT)
        assert len(toks) >= 40
        llm.reset()
        whole = llm.decode_batch([(toks, 0)])[0]
        llm.reset()
        for t in toks:
            one = llm.decode_batch([([t], 0)])[0]
    finally:
        _native.set_cpu_path(was)
    assert whole.tobytes() == one.tobytes(), (
        f"{path}: the last position's logits differ (max |diff| "
        f"{float(np.max(np.abs(whole - one))):.3g})")


def test_alternating_shapes_reuse_the_kept_graphs(llm):
    """Speculative rounds alternate a k+1-row verification with one-row steps: the LLM keeps the
    built graphs and the scheduler keeps them allocated (parked), so switching builds nothing
    after the first round, and the logits are those of the first, freshly built round."""
    toks = llm.tokenize(PROMPT_A)

    def rounds():
        llm.reset()
        out = [llm.decode_batch([(toks, 0)])[0]]
        for i in range(4):
            out.append(llm.decode_batch([([20 + i, 30 + i, 40 + i], 0)], all_logits=(0,))[0])
            out.append(llm.decode_batch([([50 + i], 0)])[0])
        return out

    first = rounds()
    built = llm.stats.graphs_built
    unparked = llm.sched["prefill"].n_unparked + llm.sched["decode"].n_unparked
    second = rounds()
    assert llm.stats.graphs_built == built, "a graph was built again"
    assert llm.sched["prefill"].n_unparked + llm.sched["decode"].n_unparked > unparked
    for a, b in zip(first, second):
        assert a.tobytes() == b.tobytes()
