"""Hybrid models (recurrent layers beside attention: LFM2's short convolutions in lfm2 / lfm2moe,
Qwen 3.5's gated DeltaNet in qwen35 / qwen35moe) against llama.cpp, and the sequence API
over their recurrent state.

- logits at every position of a 40-token sequence (tests/data/hybrid_refs.npz, made by
  tools/make_arch_refs.py with llama-cpp-python 0.3.36 on tools/make_hybrid_models.py's files)
  within tests/test_llm_archs.py's bounds (1.5 times llama.cpp's own fa0-vs-fa1 RMS + 0.002,
  ordered top-5 ids where clear), on every CPU path and both attention paths;
- one batch = token by token = prompt chunks of odd sizes, bit for bit (the recurrence runs the
  same arithmetic per token whatever the ubatch);
- sequences interleaved in one batch give each one's logits alone;
- the state checkpoints: keeping a prefix restores the nearest checkpoint and replays the rest
  (bit-identical to a cold evaluation), reuse_prefix resumes from a checkpoint (counted), a
  multi-turn chat evaluates only what follows the last checkpoint and equals a cold evaluation;
- what a recurrent model cannot honour is a RecurrentStateError naming the model and operation;
- with the cache in host memory the recurrent ops update the state in place: decode graphs copy
  no state bytes, and sequences decoded in turns (with a checkpoint restore, a copy, a batch and
  a reset between) read their own rows: the copying form's bits, each sequence alone's logits.
"""
import hashlib
import sys
from pathlib import Path

import numpy as np
import pytest

from pyggml import _native
from pyggml.llm.recurrent import RecurrentStateError
from pyggml.llm.runtime import LLM

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))
sys.path.insert(0, str(ROOT / "tests"))
import make_hybrid_models as H  # noqa: E402

REFS = np.load(ROOT / "tests" / "data" / "hybrid_refs.npz")
TOKENS = [int(t) for t in REFS["tokens"]]
VARIANTS = sorted(H.VARIANTS)
# pyggml vs llama.cpp, RMS over all logits (flash attention off / on), the largest over the
# scalar, AVX2 and AVX-512 paths (x86-64)
MEASURED = {"lfm2": (0.0225, 0.0318), "qwen35": (0.0215, 0.0212), "qwen35moe": (0.0283, 0.0322),
            "lfm2moe": (0.0048, 0.0226)}


def _self_diff(name):
    a = REFS[f"{name}.fa0.logits"].astype(np.float32)
    b = REFS[f"{name}.fa1.logits"].astype(np.float32)
    return float(np.sqrt(((a - b) ** 2).mean()))


RMS_BOUND = {v: 1.5 * _self_diff(v) + 0.002 for v in VARIANTS}
NOISE = {v: 5.0 * _self_diff(v) + 0.01 for v in VARIANTS}


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    d = tmp_path_factory.mktemp("hybrid_models")
    paths = {}
    for v in VARIANTS:
        p = H.write_variant(v, d / f"{v}.gguf")
        assert hashlib.sha256(p.read_bytes()).hexdigest() == str(REFS[f"{v}.sha256"]), (
            f"{v}: the generator no longer writes the file the references were made on; rerun "
            f"tools/make_arch_refs.py on tools/make_hybrid_models.py's output")
        paths[v] = p
    return paths


@pytest.fixture
def cpu_path(request):
    before = _native.cpu_path()
    _native.set_cpu_path(request.param)
    yield request.param
    _native.set_cpu_path(before)


def check(name, fa, logits):
    ref = REFS[f"{name}.fa{fa}.logits"].astype(np.float32)
    ids, vals = REFS[f"{name}.fa{fa}.top_ids"], REFS[f"{name}.fa{fa}.top_vals"]
    assert logits.shape == ref.shape
    rms = float(np.sqrt(((logits - ref) ** 2).mean()))
    assert rms <= RMS_BOUND[name], f"{name}: logit RMS error {rms:.4f} > {RMS_BOUND[name]:.4f}"
    checked = 0
    for t in range(len(ref)):
        order = np.argsort(-logits[t], kind="stable")[:5]
        for r in range(5):
            if vals[t, r] - vals[t, r + 1] > NOISE[name] and \
                    (r == 0 or vals[t, r - 1] - vals[t, r] > NOISE[name]):
                checked += 1
                assert order[r] == ids[t, r], f"{name}: position {t} rank {r}"
    assert checked >= 0.2 * 5 * len(ref)
    return rms


def test_bounds_are_stated():
    assert set(MEASURED) == set(VARIANTS)
    for v, (fa0, fa1) in MEASURED.items():
        assert fa0 <= RMS_BOUND[v] and fa1 <= RMS_BOUND[v], v


@pytest.mark.parametrize("cpu_path", _native.available_paths(), indirect=True)
@pytest.mark.parametrize("fa", [0, 1])
@pytest.mark.parametrize("name", VARIANTS)
def test_logits_match_llamacpp(models, name, fa, cpu_path):
    with LLM(models[name], n_ctx=256, logits_all=True, n_threads=2, flash_attn=bool(fa)) as m:
        check(name, fa, m.eval(TOKENS))


@pytest.mark.parametrize("name", VARIANTS)
def test_batch_equals_token_by_token_and_chunks(models, name):
    with LLM(models[name], n_ctx=256, logits_all=True, n_threads=2) as m:
        whole = m.eval(TOKENS)
        m.reset()
        one = np.stack([m.eval([t])[0] for t in TOKENS])
        m.reset()
        chunks, i = [], 0
        for n in (7, 1, 13, 2, 17):
            chunks.append(m.eval(TOKENS[i:i + n]))
            i += n
        chunks = np.concatenate(chunks)
    # the matmuls' one-row and many-row paths may round apart; the recurrence itself does not
    np.testing.assert_allclose(one, whole, atol=RMS_BOUND[name] * 4)
    np.testing.assert_allclose(chunks, whole, atol=RMS_BOUND[name] * 4)
    # with n_ubatch 1 every token is its own graph in both runs: bit for bit
    with LLM(models[name], n_ctx=256, logits_all=True, n_threads=2, n_ubatch=1) as m:
        a = m.eval(TOKENS[:12])
        m.reset()
        b = np.concatenate([m.eval(TOKENS[:5]), m.eval(TOKENS[5:12])])
    assert a.tobytes() == b.tobytes()


@pytest.mark.parametrize("name", VARIANTS)
def test_sequences_in_one_batch_equal_alone(models, name):
    a, b = TOKENS[:9], TOKENS[10:23]
    with LLM(models[name], n_ctx=256, n_seq_max=2, n_threads=2) as m:
        alone_a = m.eval(a, seq_id=0)
        alone_b = m.eval(b, seq_id=1)
        m.reset()
        both = m.context.decode_batch([(a, 0), (b, 1)])
        # then one token each, in one batch, on the states the batch left
        nxt = m.context.decode_batch([([5 + 260], 0), ([6 + 260], 1)])
        m.reset()
        m.eval(a, seq_id=0)
        m.eval(b, seq_id=1)
        na = m.eval([265], seq_id=0)
        nb = m.eval([266], seq_id=1)
    np.testing.assert_allclose(both[0], alone_a, atol=1e-4)
    np.testing.assert_allclose(both[1], alone_b, atol=1e-4)
    np.testing.assert_allclose(nxt[0], na, atol=1e-4)
    np.testing.assert_allclose(nxt[1], nb, atol=1e-4)


@pytest.mark.parametrize("name", VARIANTS)
def test_keep_first_restores_a_checkpoint_and_replays(models, name):
    with LLM(models[name], n_ctx=256, n_threads=2) as m:
        ctx = m.context
        m.eval(TOKENS[:20])                      # checkpoint at 20
        m.eval(TOKENS[20:30])                    # checkpoint at 30
        ctx.seq_keep_first(0, 25)                # from the checkpoint at 20, 5 replayed
        assert ctx.seq_tokens(0) == TOKENS[:25]
        assert ctx.stats.n_state_replayed == 5
        warm = m.eval(TOKENS[25:32])
        ctx.seq_keep_first(0, 0)
        m.reset()
        cold = m.eval(TOKENS[:25])
        cold2 = m.eval(TOKENS[25:32])
    assert cold2.tobytes() == warm.tobytes()
    del cold


@pytest.mark.parametrize("name", VARIANTS)
def test_reuse_prefix_resumes_from_the_nearest_checkpoint(models, name):
    with LLM(models[name], n_ctx=256, n_threads=2) as m:
        ctx = m.context
        m.eval(TOKENS[:16])                      # checkpoint at 16
        m.eval(TOKENS[16:30])                    # checkpoint at 30
        new = TOKENS[:24] + [300, 301, 302]      # shares 24 tokens: resume at 16
        n = ctx.reuse_prefix(new)
        assert n == 16 and ctx.seq_len(0) == 16 and ctx.stats.n_state_replayed == 0
        warm = m.eval(new[n:])
        m.reset()
        cold = m.eval(new)
    assert warm.tobytes() == cold.tobytes()


def _turn(m, ids, reuse=True):
    """A greedy 4-token completion of ids on sequence 0: (tokens, prompt tokens reused)."""
    from pyggml.llm.generate import Generation, run
    from pyggml.llm.sampler import SamplingParams
    g = Generation(m.tokenizer, ids, 4, SamplingParams(temperature=0.0), stop_at_eog=False,
                   seq_id=0, reuse_prefix=reuse)
    for _ in run(m.context, g):
        pass
    return list(g.tokens), g.n_reused


@pytest.mark.parametrize("name", VARIANTS)
def test_multi_turn_chat_evaluates_only_what_follows_the_last_checkpoint(models, name):
    """Five turns, each prompt the conversation so far plus a new message. Odd turns keep the
    reply as generated (the state the last turn left is reused whole); even turns follow a reply
    whose last evaluated token was "re-rendered" (as a template may): the turn resumes from the checkpoint at the end of the
    previous prompt. Only the tokens after the reused ones are evaluated (counted), and every
    reply equals a cold evaluation's."""
    rng = np.random.default_rng(5)
    with LLM(models[name], n_ctx=256, n_threads=2) as m, \
            LLM(models[name], n_ctx=256, n_threads=2) as cold:
        convo = list(TOKENS[:12])
        prev_prompt = 0
        for turn in range(5):
            convo += [int(t) for t in rng.integers(260, 384, 6)]       # a new user message
            held = m.context.seq_len(0)
            before = m.stats.n_prompt_tokens
            toks, reused = _turn(m, convo)
            evaluated = m.stats.n_prompt_tokens - before
            assert evaluated == len(convo) - reused
            if turn % 2 == 1:
                assert reused == held > 0, (turn, reused, held)
            elif turn:
                assert reused == prev_prompt, (turn, reused, prev_prompt)
            ref, _ = _turn(cold, convo, reuse=False)
            assert toks == ref, turn
            prev_prompt = len(convo)
            # odd turns: the third reply token (the last one the sequence holds) re-rendered
            convo += toks if turn % 2 == 0 else toks[:2] + [(toks[2] - 259) % 124 + 260] + toks[3:]


@pytest.mark.parametrize("name", VARIANTS)
def test_what_a_recurrent_model_cannot_honour_is_a_typed_error(models, name):
    with LLM(models[name], n_ctx=256, n_seq_max=2, n_threads=2) as m:
        m.eval(TOKENS[:10])
        with pytest.raises(RecurrentStateError, match=rf"{name}: seq_rm.*middle range"):
            m.kv.seq_rm(0, 2, 5)
        with pytest.raises(RecurrentStateError, match=rf"{name}: seq_cp"):
            m.kv.seq_cp(0, 1)


@pytest.mark.parametrize("name", VARIANTS)
def test_speculative_decoding_rolls_the_state_back(models, name):
    """Drafts that are right for two tokens and then wrong: each rejected draft is taken back
    through the rollback checkpoint (the accepted tokens replayed), so the greedy tokens equal
    plain decoding's."""
    from pyggml.llm.speculative import PromptLookup, Proposal
    prompt = TOKENS[:30]
    with LLM(models[name], n_ctx=256, n_threads=2) as m:
        plain = [t.id for t in m.generate(prompt, max_tokens=20, temperature=0.0, draft=False,
                                          stop_at_eog=False)]

        class HalfRight(PromptLookup):
            def propose(self, reqs):
                out = []
                for r in reqs:
                    done = len(r.context) - len(prompt)
                    toks = plain[done:done + 2] + [(t - 259) % 124 + 260
                                                   for t in plain[done + 2:done + 4]]
                    out.append(Proposal(toks, [None] * len(toks)))
                return out
        spec = [t.id for t in m.generate(prompt, max_tokens=20, temperature=0.0,
                                         draft=HalfRight(n_max=4, n_min=4), stop_at_eog=False)]
        s = m.stats.spec
        assert s.rounds > 0 and s.drafted > s.accepted > 0, (s.rounds, s.drafted, s.accepted)
        assert m.stats.n_state_replayed > 0
    assert spec == plain


def _state_copies(m, n_rs):
    """The decode graph's nodes that copy recurrent state (GET_ROWS / SET_ROWS / CPY on a state
    tensor, a recurrent op whose state source is not the cache itself) and the bytes they copy."""
    from pyggml.llm.archs.common import GraphParams
    from pyggml.types import Op
    states = {id(t) for t in m.kv.rs_tensors()}
    g, _, _ = m.context.run.build_graph(GraphParams(1, 1, 16, 0, n_rs=n_rs))
    found, n = [], 0
    for t in g.nodes:
        base = t.view_src if t.view_src is not None else t
        if t.op == Op.GET_ROWS and id(t.src[0]) in states:
            found.append(t.name)
            n += t.nbytes()
        elif t.op in (Op.SET_ROWS, Op.CPY) and id(base) in states:
            found.append(t.name)
            n += t.src[0].nbytes()
        elif t.op in (Op.SSM_CONV, Op.GATED_DELTA_NET):
            st = t.src[2 if t.op == Op.SSM_CONV else 5]
            if id(st) not in states:
                found.append(t.name)
                n += st.nbytes()
    return found, n


@pytest.mark.parametrize("name", VARIANTS)
def test_decode_copies_no_recurrent_state(models, name, monkeypatch):
    """With the cache in host memory each recurrent op reads and updates its sequence's state
    where it is: no node of a decode graph copies state bytes (the copying form moved each
    layer's state three times a token: gathered, copied into the op's result, stored back)."""
    with LLM(models[name], n_ctx=64, n_seq_max=2, n_threads=1) as m:
        assert _state_copies(m, 1) == ([], 0)
        assert _state_copies(m, 2) == ([], 0)
        from pyggml.llm import recurrent as rs
        monkeypatch.setattr(rs, "in_place", lambda t: False)
        found, n = _state_copies(m, 1)
        # the copying form: three copies of the state (LFM2: the convolutions' alone, not the
        # 4-byte placeholder of a layer without a delta-rule state)
        lfm2 = name.startswith("lfm2")
        per_seq = rs.bytes_per_seq(m.hparams) - (4 * len(m.kv.rs_layers) if lfm2 else 0)
        assert n == 3 * per_seq
        assert len(found) == 3 * len(m.kv.rs_layers) * (1 if lfm2 else 2)


def _interleaved(m):
    """Two sequences (rows 0 and 2 of three: a token's row is not its index in the ubatch)
    decoded token by token in turns, with a checkpoint restore, a copy, a batch of both and a
    reset between: every logits row, in order."""
    ctx, out = m.context, []
    a, b = TOKENS[:9], TOKENS[10:21]
    out.append(m.eval(a, seq_id=0))
    out.append(m.eval(b, seq_id=2))
    for i in range(3):
        out.append(m.eval([260 + i], seq_id=0))
        out.append(m.eval([300 + i], seq_id=2))
    ctx.seq_keep_first(0, len(a) + 1)           # restores the checkpoint at 9, replays one
    out.append(m.eval([270], seq_id=0))
    ctx.seq_copy(2, 1)                          # row 1 gets row 2's state, host side
    out.append(m.eval([310], seq_id=1))
    out.append(m.eval([310], seq_id=2))
    both = ctx.decode_batch([([271], 0), ([311], 2)])
    out += [both[0], both[2]]
    ctx.seq_reset(2)                            # row 2 starts again from the empty state
    out.append(m.eval(b[:4], seq_id=2))
    out.append(m.eval([272], seq_id=0))
    return out


@pytest.mark.parametrize("name", VARIANTS)
def test_interleaved_sequences_read_their_own_state(models, name, monkeypatch):
    """The in-place form against the copying one (bit for bit) and against each sequence alone:
    a stale state, or one read from another sequence's row, changes the logits."""
    with LLM(models[name], n_ctx=128, n_seq_max=3, n_threads=2) as m:
        got = _interleaved(m)
        assert m.context.stats.n_state_replayed == 1
    from pyggml.llm import recurrent as rs
    with monkeypatch.context() as mp:
        mp.setattr(rs, "in_place", lambda t: False)
        with LLM(models[name], n_ctx=128, n_seq_max=3, n_threads=2) as m:
            ref = _interleaved(m)
    for i, (x, y) in enumerate(zip(got, ref)):
        assert x.tobytes() == y.tobytes(), i
    a, b = TOKENS[:9], TOKENS[10:21]
    with LLM(models[name], n_ctx=128, n_threads=2) as m:
        seq0 = [m.eval(a)] + [m.eval([260 + i]) for i in range(3)]
        m.reset()
        seq0 += [m.eval(a + [260, 270]), m.eval([271]), m.eval([272])]
        m.reset()
        seq2 = [m.eval(b)] + [m.eval([300 + i]) for i in range(3)]
        seq2 += [m.eval([310]), m.eval([311])]
        m.reset()
        seq2 += [m.eval(b[:4])]
    alone = [seq0[0], seq2[0], seq0[1], seq2[1], seq0[2], seq2[2], seq0[3], seq2[3], seq0[4],
             seq2[4], seq2[4], seq0[5], seq2[5], seq2[6], seq0[6]]
    assert len(alone) == len(got)
    for i, (x, y) in enumerate(zip(got, alone)):
        np.testing.assert_allclose(x, y, atol=1e-4, err_msg=str(i))
