"""Gemma 3 270M Q4_K_M against llama.cpp (docs/FORMATS.md §6.3; the issue's references).

Greedy decoding flips at near ties, so: (a) at the last prompt position the top-3 ids equal
llama.cpp's and the top-5 logits are within 0.5; (b) our greedy tokens equal one of llama.cpp's
references up to the first step whose llama.cpp top-1/top-2 margin is under 0.5. Long prompts
(> the 512-token window, > one ubatch) use tests/data/gemma3_llm_refs.json, made by
tools/make_llm_refs.py with llama-cpp-python (flash attention off).
"""
import json
from pathlib import Path

import numpy as np
import pytest

from pyggml.llm.runtime import LLM

DATA = Path(__file__).parent / "data" / "gemma3_llm_refs.json"

CAPITAL = {
    "prompt": "The capital of France is",
    "ids": [2, 818, 5279, 529, 7001, 563],
    "top5": [(506, 19.1317), (496, 18.5327), (9079, 18.4528), (886, 18.1072), (3224, 17.8750)],
    "refs": [[506, 5279, 529, 506, 2891, 529, 7001, 236761, 1030, 563, 506, 7488, 3207, 528, 7001,
              236761, 1030, 563, 506, 5279, 529, 506, 2891, 529, 7001, 236761, 1030, 563, 506,
              7488, 3207, 528]],
    "margins": [0.507, 1.823, 2.639, 0.666, 0.031, 0.306, 0.634, 0.868, 0.565, 2.305, 0.566, 0.035,
                2.059, 2.676, 0.317, 0.114, 1.057, 1.864, 0.116, 0.249, 3.013, 1.467, 0.996, 2.222,
                3.749, 2.032, 0.729, 2.472, 1.74, 0.887, 4.253, 4.107],
}
ONCE = {
    "prompt": "Once upon a time",
    "ids": [2, 14946, 3324, 496, 990],
    "refs": [[236764, 993, 691, 496, 880, 7489, 3415, 236761, 1293, 691, 496, 880, 529, 1551,
              33282, 236764, 532, 668, 691, 496, 880, 529, 1551, 33282, 236761, 1293, 691, 496,
              880, 529, 1551, 33282],
             [236764, 993, 691, 496, 2268, 3953, 7489, 60708, 236761, 2625, 691, 496, 1401, 6538,
              3953, 236764, 532, 1304, 9312, 531, 1441, 607, 1116, 4690, 236761, 3656, 1719,
              236764, 60708, 691, 9378, 1679]],
    "margins": [1.723, 0.414, 1.434, 2.561, 0.075, 0.009, 0.217, 1.044],
}


@pytest.fixture(scope="module")
def llm():
    with LLM(n_ctx=2048, n_threads=2) as m:
        yield m


def _check_greedy(got, refs, margins):
    stop = next((i for i, m in enumerate(margins) if m < 0.5), len(margins))
    best = max(refs, key=lambda r: next((i for i, (a, b) in enumerate(zip(got, r)) if a != b),
                                        len(r)))
    first_diff = next((i for i, (a, b) in enumerate(zip(got, best)) if a != b), None)
    print(f"first divergence from llama.cpp: step {first_diff} "
          f"(margin {margins[first_diff] if first_diff is not None and first_diff < len(margins) else '-'}); "
          f"must agree up to step {stop}")
    assert got[:stop] == best[:stop]


def _check_top3(got, ref_top5, near=0.5):
    """Our top-3 ids are llama.cpp's, in its order except among logits within `near` of each
    other there (a near tie: the order is rounding's, as for greedy tokens)."""
    ids = [i for i, _ in ref_top5]
    vals = dict(ref_top5)
    assert set(got) <= set(ids), (got, ids)
    for a, b in zip(got, got[1:]):
        assert vals[a] >= vals[b] - near, (got, ref_top5)
    assert set(got) == set(ids[:3]) or vals[ids[2]] - vals[ids[3]] < near, (got, ids)


def test_prompt_ids(llm):
    assert llm.tokenize(CAPITAL["prompt"]) == CAPITAL["ids"]
    assert llm.tokenize(ONCE["prompt"]) == ONCE["ids"]


def test_capital_of_france_logits_and_greedy(llm):
    logits = llm.eval(CAPITAL["ids"])
    top = np.argsort(-logits)[:5]
    assert list(top[:3]) == [i for i, _ in CAPITAL["top5"][:3]]
    ref = dict(CAPITAL["top5"])
    diffs = [abs(float(logits[i]) - v) for i, v in ref.items()]
    print("top-5 |ours - llama.cpp|:", [round(d, 3) for d in diffs])
    assert max(diffs) <= 0.5
    got = [t.id for t in llm.generate(CAPITAL["prompt"], 32, temperature=0, stop_at_eog=False)]
    _check_greedy(got, CAPITAL["refs"], CAPITAL["margins"])


def test_once_upon_a_time_greedy(llm):
    got = [t.id for t in llm.generate(ONCE["prompt"], 8, temperature=0, stop_at_eog=False)]
    _check_greedy(got, ONCE["refs"], ONCE["margins"])


@pytest.mark.parametrize("key", ["history_600", "story_900"])
def test_long_prompts_beyond_window_and_ubatch(key):
    ref = json.loads(DATA.read_text())["prompts"][key]
    with LLM(n_ctx=2048, n_ubatch=512, n_threads=2, flash_attn=False) as m:
        ids = m.tokenize(ref["text"])
        assert ids == ref["ids"] and len(ids) > 512
        logits = m.eval(ids)
        assert m.stats.ubatch_sizes[:2] == [512, len(ids) - 512]
        top = np.argsort(-logits)[:5]
        diffs = [abs(float(logits[i]) - v) for i, v in ref["top5"]]
        print(key, "top-5 |ours - llama.cpp|:", [round(d, 3) for d in diffs])
        # the order of the attention's additions alone moves these logits by up to 1.1 (the
        # window cells in position order, as llama.cpp and --swa-full place them, against a
        # ring reusing the lowest free cell): 0.65 and near ties in the top 3
        assert max(diffs) <= 0.65
        _check_top3(list(top[:3]), ref["top5"])
        got = [int(np.argmax(logits))]
        for _ in range(len(ref["greedy"]) - 1):
            got.append(int(np.argmax(m.eval([got[-1]]))))
    _check_greedy(got, [ref["greedy"]], ref["margins"])


def test_compute_buffer_sizes():
    """llama.cpp reserves 514.5 MiB at n_ubatch 512 (logits for every position); ours is
    reserved for the rows actually requested."""
    with LLM(n_ctx=2048, n_ubatch=512, n_threads=1) as m:
        assert m.compute_buffer_size() < 50 * 2 ** 20
    with LLM(n_ctx=2048, n_ubatch=512, n_threads=1, logits_all=True) as m:
        assert m.compute_buffer_size() <= 514.5 * 2 ** 20
