"""The sampler chain (pyggml/llm/sampler.py) against llama.cpp's: the same seed gives the same
tokens, step after step, on fixed logits, for the default chain, the truncations in their
orders (unsorted min_p, top_p's sort, typical_p), XTC, mirostat v1 / v2, DRY (with and without
sequence breakers, tokenized with SmolLM2's vocabulary), penalties and logit_bias together.
The reference is llama-cpp-python 0.3.36's low-level sampler API (tools/make_sampler_refs.py,
tests/data/sampler_refs.json); the logits are made here the way the script made them."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from pyggml.errors import ModelError
from pyggml.llm.sampler import Sampler, SamplingParams, _dry, dry_breakers

REFS = json.loads((Path(__file__).parent / "data" / "sampler_refs.json").read_text())
SMOL = Path.home() / ".cache/pyggml/models/SmolLM2-135M-Instruct.Q4_1.gguf"


def _logits(case_seed: int, step: int, n_vocab: int) -> np.ndarray:
    x = np.random.RandomState(case_seed * 1000 + step).standard_normal(n_vocab) * 2.0
    x[REFS["hot"]] += 6.0
    return x.astype(np.float32)


@pytest.fixture(scope="module")
def smol_tokenizer():
    from pyggml.llm.tokenizer import Tokenizer
    if not SMOL.exists():
        pytest.skip("SmolLM2-135M-Instruct is not fetched (make setup)")
    return Tokenizer.from_gguf(str(SMOL))


def _params(p: dict) -> SamplingParams:
    return SamplingParams(**{k: (tuple(map(tuple, v)) if k == "logit_bias" else
                                 tuple(v) if k == "dry_sequence_breakers" else v)
                             for k, v in p.items()})


@pytest.mark.parametrize("name", sorted(REFS["cases"]))
def test_same_tokens_as_llamacpp(name, request):
    case = REFS["cases"][name]
    params = _params(case["params"])
    tok = request.getfixturevalue("smol_tokenizer") if params.dry_on and \
        params.dry_sequence_breakers else None
    s = Sampler(params, tok)
    for t in REFS["prompt"]:
        s.accept(t)
    got = []
    for step in range(REFS["n_steps"]):
        t = s.sample(_logits(case["case_seed"], step, REFS["n_vocab"]))
        s.accept(t)
        got.append(t)
    assert got == case["tokens"]


def test_dry_breakers_of_smollm2(smol_tokenizer):
    """The breakers llama.cpp derives: a token containing the string is a breaker alone; one
    ending in its start carries the rest as a tail."""
    br = dry_breakers(smol_tokenizer, ("\n", "The end"))
    nl = smol_tokenizer.encode("\n", add_special=False)
    assert nl and () in br[nl[0]]
    the = smol_tokenizer.encode("The", add_special=False)[0]
    assert tuple(smol_tokenizer.encode(" end", add_special=False)) in br[the]
    assert dry_breakers(smol_tokenizer, ("\n", "The end")) is br      # scanned once


def test_dry_penalizes_the_token_that_extends_a_repeat():
    """a b c d a b c -> d would extend a run of 3: multiplier · base^(3 - allowed)."""
    p = SamplingParams(dry_multiplier=0.8, dry_base=1.75, dry_allowed_length=2,
                       dry_sequence_breakers=())
    vals = np.zeros(8, np.float32)
    out = _dry(vals, [1, 2, 3, 4, 1, 2, 3], p, {})
    want = np.zeros(8, np.float32)
    want[4] = -np.float32(0.8 * 1.75 ** 1)
    assert np.array_equal(out, want)
    # a breaker between the runs stops the repeat
    out = _dry(vals, [1, 2, 3, 4, 1, 2, 7, 3], p, {7: [()]})
    assert not out.any()


def test_speculative_needs_a_fixed_distribution():
    for p in (SamplingParams(mirostat=2), SamplingParams(xtc_probability=0.5)):
        assert not p.fixed_distribution
        with pytest.raises(ModelError, match="fixed distribution"):
            Sampler(p).distribution(np.zeros(4, np.float32))


@pytest.mark.parametrize("bad,match", [
    ({"typical_p": 1.5}, "typical_p"), ({"mirostat": 3}, "mirostat"),
    ({"xtc_probability": -0.1}, "xtc_probability"), ({"dry_penalty_last_n": -2},
                                                      "dry_penalty_last_n"),
    ({"dry_allowed_length": -1}, "dry_allowed_length"), ({"min_keep": -1}, "min_keep"),
    ({"dry_sequence_breakers": (1,)}, "dry_sequence_breakers")])
def test_bad_values_are_named(bad, match):
    with pytest.raises(ModelError, match=match):
        SamplingParams(**bad).validate()


def test_dry_with_breakers_needs_the_tokenizer():
    with pytest.raises(ModelError, match="tokenizer"):
        Sampler(SamplingParams(dry_multiplier=0.5))
