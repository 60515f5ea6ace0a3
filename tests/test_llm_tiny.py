"""The model runtime on tiny generated models: an independent float64 numpy forward pass is the
reference (docs/FORMATS.md §3.5 and §4), plus graph reuse, ubatches, sequences, errors.

Stated tolerances, as max |ours - ref| / max |ref| over all logits:
- F32 weights, F32 KV cache: 2e-4 (fp32 arithmetic; ggml-style fp32 rope angles);
- F16 weights / F16 KV cache: 5e-3 (fp16 rounding of K, V and of q for the K dots);
- Q8_0 / Q4_0 / Q4_K / Q6_K weights: 6e-2 (activations quantized to Q8_0 / Q8_K per row before each
  matmul, as ggml does; the reference multiplies unquantized activations).
"""
import math

import gguf
import numpy as np
import pytest

from pyggml.errors import ModelError, PyggmlError
from pyggml.llm.runtime import LLM
from support.gguf_edit import copy_with_tensor_filled


# ---- independent reference ----------------------------------------------------------------------

def _rms(x, w, eps):
    return x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * w


def _rope(x, pos, base, neox):
    """x (T, heads, D) float64, exact angles pos * base^(-2k/D)."""
    T, Hh, D = x.shape
    k = np.arange(D // 2)
    theta = pos[:, None] * base ** (-2.0 * k / D)          # (T, D/2)
    c, s = np.cos(theta)[:, None, :], np.sin(theta)[:, None, :]
    if neox:
        x0, x1 = x[..., : D // 2], x[..., D // 2:]
        return np.concatenate([x0 * c - x1 * s, x0 * s + x1 * c], axis=-1)
    x0, x1 = x[..., 0::2], x[..., 1::2]
    out = np.empty_like(x)
    out[..., 0::2], out[..., 1::2] = x0 * c - x1 * s, x0 * s + x1 * c
    return out


def reference_logits(tm, tokens, arch=None, biases=None):
    """float64 logits (T, V) of a whole sequence at positions 0..T-1. arch overrides the
    model's (qwen2 = llama with NEOX rope and optional q/k/v biases)."""
    hp, W = tm.hparams, {k: v.astype(np.float64) for k, v in tm.weights.items()}
    W.update({k: v.astype(np.float64) for k, v in (biases or {}).items()})
    arch = arch or hp.arch
    gemma = arch == "gemma3"
    neox = arch in ("gemma3", "qwen2")
    E, H, Hkv, D = hp.n_embd, hp.n_head, hp.n_head_kv, hp.head_dim
    T = len(tokens)
    pos = np.arange(T, dtype=np.float64)
    x = W["token_embd.weight"][tokens]
    if gemma:
        x = x * math.sqrt(E)
    causal = pos[None, :] <= pos[:, None]
    for il in range(hp.n_layer):
        p = f"blk.{il}."
        local = gemma and hp.sliding_window and (il % 6) < 5
        h = _rms(x, W[p + "attn_norm.weight"], hp.rms_eps)
        q = (h @ W[p + "attn_q.weight"].T + W.get(p + "attn_q.bias", 0)).reshape(T, H, D)
        k = (h @ W[p + "attn_k.weight"].T + W.get(p + "attn_k.bias", 0)).reshape(T, Hkv, D)
        v = (h @ W[p + "attn_v.weight"].T + W.get(p + "attn_v.bias", 0)).reshape(T, Hkv, D)
        if gemma:
            q = _rms(q, W[p + "attn_q_norm.weight"], hp.rms_eps)
            k = _rms(k, W[p + "attn_k_norm.weight"], hp.rms_eps)
        base = hp.rope_freq_base_swa if local else hp.rope_freq_base
        q, k = _rope(q, pos, base, neox), _rope(k, pos, base, neox)
        allowed = causal & ((pos[:, None] - pos[None, :]) < hp.sliding_window) if local else causal
        o = np.empty((T, H, D))
        for hh in range(H):
            s = q[:, hh] @ k[:, hh // (H // Hkv)].T / math.sqrt(D)
            s = np.where(allowed, s, -np.inf)
            a = np.exp(s - s.max(-1, keepdims=True))
            o[:, hh] = (a / a.sum(-1, keepdims=True)) @ v[:, hh // (H // Hkv)]
        o = o.reshape(T, H * D) @ W[p + "attn_output.weight"].T
        if gemma:
            o = _rms(o, W[p + "post_attention_norm.weight"], hp.rms_eps)
        x = x + o
        h = _rms(x, W[p + "ffn_norm.weight"], hp.rms_eps)
        g, u = h @ W[p + "ffn_gate.weight"].T, h @ W[p + "ffn_up.weight"].T
        if gemma:
            act = 0.5 * g * (1 + np.tanh(math.sqrt(2 / math.pi) * (g + 0.044715 * g ** 3)))
        else:
            act = g / (1 + np.exp(-g))
        f = (act * u) @ W[p + "ffn_down.weight"].T
        if gemma:
            f = _rms(f, W[p + "post_ffw_norm.weight"], hp.rms_eps)
        x = x + f
    x = _rms(x, W["output_norm.weight"], hp.rms_eps)
    out = W["token_embd.weight"] if hp.tied_embeddings else W["output.weight"]
    return x @ out.T


def rel_err(got, ref):
    return float(np.max(np.abs(got - ref)) / np.max(np.abs(ref)))


TOL = {"f32": 2e-4, "f16": 5e-3, "q8_0": 6e-2, "q4_0": 6e-2, "q4_k": 6e-2, "q6_k": 6e-2}
PROMPT = [2, 17, 99, 5, 300, 41, 7, 8, 250, 3, 77, 12, 19]      # 13 tokens > window 8


def _model(tiny_models, arch, wtype):
    big = wtype in ("q4_k", "q6_k")              # K-quants need rows of 256
    return tiny_models.get(arch=arch, weight_type=wtype, n_layer=2,
                           n_embd=256 if big else 64, n_ff=512 if big else 128)


@pytest.mark.parametrize("arch", ["gemma3", "llama"])
@pytest.mark.parametrize("wtype", ["f32", "f16", "q8_0", "q4_0", "q4_k", "q6_k"])
def test_logits_match_numpy_reference(tiny_models, arch, wtype):
    tm = _model(tiny_models, arch, wtype)
    kv = "f32" if wtype == "f32" else "f16"
    with LLM(tm.path, n_ctx=64, n_threads=2, logits_all=True, type_k=kv, type_v=kv) as llm:
        got = llm.eval(PROMPT)
    ref = reference_logits(tm, PROMPT)
    assert got.shape == ref.shape
    assert rel_err(got, ref) <= TOL[wtype]
    # the decision that matters: the best next token at every position (where not a near tie)
    srt = np.sort(ref, axis=-1)
    clear = (srt[:, -1] - srt[:, -2]) > 0.05 * np.abs(ref).max()
    assert np.array_equal(got.argmax(-1)[clear], ref.argmax(-1)[clear])


@pytest.mark.parametrize("arch", ["gemma3", "llama"])
def test_incremental_decode_and_ubatches_agree(tiny_models, arch):
    tm = _model(tiny_models, arch, "f32")
    ref = reference_logits(tm, PROMPT)
    with LLM(tm.path, n_ctx=64, n_threads=2, n_ubatch=4, type_k="f32", type_v="f32") as llm:
        first = llm.eval(PROMPT[:5])            # 2 ubatches (4 + 1)
        steps = [first] + [llm.eval([t]) for t in PROMPT[5:]]
    got = np.stack(steps)
    assert rel_err(got, ref[4:]) <= TOL["f32"]


def test_graph_reuse_counters(tiny_models):
    tm = _model(tiny_models, "gemma3", "q8_0")
    with LLM(tm.path, n_ctx=512, n_threads=2) as llm:
        list(llm.generate(PROMPT, max_tokens=100, temperature=0, stop_at_eog=False))
        s = llm.stats
        assert s.n_gen_tokens == 100
        decode_builds = s.graphs_built - 1                  # one graph for the prompt
        assert decode_builds <= 2
        assert s.graphs_reused >= 98
        assert s.allocator_plans == 1                       # the reserve at start-up only
        # and the reuse path does not re-marshal the CPU node array
        assert llm.backend.n_plans_built == s.graphs_built


def test_two_sequences_together_equal_each_alone(tiny_models):
    tm = _model(tiny_models, "llama", "q8_0")
    a, b = [2, 10, 11, 12, 13], [2, 50, 60]
    alone = {}
    for sid, prompt in ((0, a), (1, b)):
        with LLM(tm.path, n_ctx=64, n_threads=1) as llm:
            toks = [t.id for t in llm.generate(prompt, 8, temperature=0, stop_at_eog=False)]
            alone[sid] = toks
    with LLM(tm.path, n_ctx=64, n_threads=1, n_seq_max=2) as llm:
        out = llm.decode_batch([(a, 0), (b, 1)])
        together = {0: [], 1: []}
        for _ in range(8):
            nxt = {sid: int(np.argmax(out[sid])) for sid in (0, 1)}
            for sid in (0, 1):
                together[sid].append(nxt[sid])
            out = llm.decode_batch([([nxt[0]], 0), ([nxt[1]], 1)])
    assert together == alone


def test_logits_all_and_memory(tiny_models):
    tm = _model(tiny_models, "gemma3", "q8_0")
    with LLM(tm.path, n_ctx=128, n_ubatch=32, n_threads=1) as last:
        with LLM(tm.path, n_ctx=128, n_ubatch=32, n_threads=1, logits_all=True) as every:
            V = tm.hparams.n_vocab
            # logits for every position need n_ubatch rows of logits in the compute buffer;
            # last-token logits only one row, so the planned buffer is smaller
            assert every.compute_buffer_size() >= 32 * V * 4
            assert last.compute_buffer_size() < every.compute_buffer_size()
            la, lb = last.eval(PROMPT), every.eval(PROMPT)
            assert lb.shape == (len(PROMPT), V) and la.shape == (V,)
            assert np.allclose(la, lb[-1], rtol=1e-5, atol=1e-5)


# ---- bad input ------------------------------------------------------------------------------------

def test_bad_input_is_typed_and_model_stays_usable(tiny_models):
    tm = _model(tiny_models, "gemma3", "q8_0")
    with LLM(tm.path, n_ctx=16, n_threads=1) as llm:
        good = llm.eval(PROMPT[:4])
        llm.reset()
        with pytest.raises(ModelError, match="empty prompt"):
            llm.eval([])
        with pytest.raises(ModelError, match="context overflow.*n_ctx=16"):
            llm.eval(list(range(2, 22)))
        with pytest.raises(ModelError, match="outside the vocabulary"):
            llm.eval([2, 10 ** 6])
        with pytest.raises(ModelError, match="seq_id"):
            llm.eval([2], seq_id=3)
        with pytest.raises(ModelError, match="top_p.*temperature|temperature|top_p"):
            llm.generate("hi", 4, top_p=1.5)
        with pytest.raises(ModelError, match="top_k"):
            llm.generate("hi", 4, top_k=-1)
        with pytest.raises(ModelError, match="max_tokens"):
            llm.generate("hi", -2)          # -1 is llama.cpp's "until the end"
        # nothing above changed the cache: same logits as before
        assert llm.kv.n_used() == 0
        assert np.array_equal(llm.eval(PROMPT[:4]), good)
        # overflow in the middle of a sequence keeps what was there
        used = llm.kv.n_used()
        with pytest.raises(ModelError, match="context overflow"):
            llm.eval(list(range(2, 20)))
        assert llm.kv.n_used() == used


def _rewrite(src, dst, *, arch=None, drop=(), reshape=None, extra=None):
    """Copy a GGUF file changing its architecture name, dropping tensors, changing one shape or
    adding tensors (extra: name -> float32 array)."""
    r = gguf.GGUFReader(src)
    old_arch = r.fields["general.architecture"].contents()
    new_arch = arch or old_arch
    w = gguf.GGUFWriter(dst, new_arch)
    for f in r.fields.values():
        if f.name.startswith("GGUF.") or f.name == "general.architecture":
            continue
        name = f.name.replace(old_arch + ".", new_arch + ".", 1)
        vt = f.types[0]
        if vt == gguf.GGUFValueType.ARRAY:
            w.add_array(name, f.contents())
        else:
            w.add_key_value(name, f.contents(), vt)
    for t in r.tensors:
        if t.name in drop:
            continue
        data = np.array(t.data)
        if reshape and t.name == reshape:
            data = data[: data.shape[0] // 2]
        w.add_tensor(t.name, data, raw_dtype=t.tensor_type)
    for name, arr in (extra or {}).items():
        w.add_tensor(name, arr)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return dst


@pytest.mark.parametrize("bad", [math.nan, math.inf])
def test_non_finite_logits_are_a_typed_error(tiny_models, tmp_path, bad):
    """A model whose output norm holds NaN or +inf gives non-finite logits: a PyggmlError at
    the step that made them, not NaN scores handed on to sampling."""
    tm = tiny_models.get(arch="llama", weight_type="f32")
    path = copy_with_tensor_filled(tm.path, tmp_path / "bad.gguf", "output_norm.weight", bad)
    with LLM(path, n_ctx=64, n_threads=1) as m:
        with pytest.raises(PyggmlError, match="non-finite logits"):
            m.eval([1, 2, 3])


def test_unknown_architecture_missing_and_misshapen_tensors(tiny_models, tmp_path):
    tm = _model(tiny_models, "llama", "f32")
    with pytest.raises(ModelError, match="architecture 'mamba9' is not supported"):
        LLM(_rewrite(tm.path, tmp_path / "a.gguf", arch="mamba9"), n_ctx=16)
    with pytest.raises(ModelError, match="missing tensor 'blk.1.ffn_up.weight'"):
        LLM(_rewrite(tm.path, tmp_path / "b.gguf", drop=("blk.1.ffn_up.weight",)), n_ctx=16)
    with pytest.raises(ModelError, match="'blk.0.attn_q.weight' has shape .* expected"):
        LLM(_rewrite(tm.path, tmp_path / "c.gguf", reshape="blk.0.attn_q.weight"), n_ctx=16)
    with pytest.raises(ModelError, match="n_ctx must be a positive integer"):
        LLM(tm.path, n_ctx=-1)
    with pytest.raises(ModelError, match="type_k"):
        LLM(tm.path, n_ctx=16, type_k="q4_k")


def test_qwen2_neox_rope_and_qkv_biases(tiny_models, tmp_path):
    """qwen2 = llama with NEOX rope and q/k/v biases (docs/FORMATS.md §4)."""
    tm = _model(tiny_models, "llama", "f32")
    hp = tm.hparams
    rng = np.random.default_rng(5)
    biases = {}
    for il in range(hp.n_layer):
        for short, n in (("attn_q", hp.n_head), ("attn_k", hp.n_head_kv), ("attn_v", hp.n_head_kv)):
            biases[f"blk.{il}.{short}.bias"] = (rng.standard_normal(n * hp.head_dim) * 0.5
                                                ).astype(np.float32)
    path = _rewrite(tm.path, tmp_path / "qwen2.gguf", arch="qwen2", extra=biases)
    with LLM(path, n_ctx=64, n_threads=2, logits_all=True, type_k="f32", type_v="f32") as llm:
        assert llm.hparams.rope_neox
        got = llm.eval(PROMPT)
    ref = reference_logits(tm, PROMPT, arch="qwen2", biases=biases)
    assert rel_err(got, ref) <= TOL["f32"]
    assert rel_err(got, reference_logits(tm, PROMPT, arch="qwen2")) > 10 * TOL["f32"]  # biases matter


def test_sampler_seeded_and_chain():
    from pyggml.llm.sampler import Sampler, SamplingParams
    logits = np.array([1.0, 5.0, 4.9, -3.0, 4.0], np.float32)
    assert Sampler(SamplingParams(temperature=0)).sample(logits) == 1
    draws = [Sampler(SamplingParams(seed=42)).sample(logits) for _ in range(3)]
    assert len(set(draws)) == 1                             # same seed, same draw
    s = Sampler(SamplingParams(seed=7, top_k=2, top_p=1.0, min_p=0.0, temperature=1.0))
    picks = {s.sample(logits) for _ in range(200)}
    assert picks == {1, 2}                                  # top_k=2 keeps exactly the best two
    s = Sampler(SamplingParams(seed=7, top_k=0, top_p=1.0, min_p=0.5, temperature=1.0))
    assert {s.sample(logits) for _ in range(200)} <= {1, 2, 4}   # min_p: within ln(0.5) of max
    s = Sampler(SamplingParams(temperature=0, repeat_penalty=100.0))
    s.accept(1)
    assert s.sample(logits) == 2                            # the repeated token is penalised
    with pytest.raises(PyggmlError, match="min_p"):
        SamplingParams(min_p=2).validate()


def _mask_reference(sp, pos, seq_ids, n_kv, window):
    """The KV mask in numpy, from its definition: same sequence, a used cell at or before the
    token's position, within the window when there is one."""
    cpos, cseq = sp.pos[:n_kv], sp.seqs[:n_kv]
    bits = np.left_shift(np.uint64(1), np.asarray(seq_ids).astype(np.uint64))
    ok = ((cseq & bits[:, None]) != 0) & (cpos >= 0) & (cpos <= pos[:, None])
    if window > 0:
        ok &= (pos[:, None] - cpos) < window
    return np.where(ok, np.float16(0), np.float16(-np.inf)).astype(np.float16)


def test_kv_mask_matches_its_definition():
    """CellSpace.mask_into (native pg_kv_mask) against numpy, bit for bit, over random cells,
    several sequences, windows and n_kv (0 included); a malformed output array and a sequence
    id out of range are typed errors."""
    from pyggml.errors import InvalidArgumentError
    from pyggml.llm.kv_cache import CellSpace
    rng = np.random.default_rng(7)
    for _ in range(300):
        n = int(rng.integers(1, 700))
        sp = CellSpace("full", n)
        sp.pos[:] = rng.integers(-1, 400, n)
        sp.seqs[:] = rng.integers(0, 1 << 5, n).astype(np.uint64)
        T = int(rng.integers(1, 48))
        pos = rng.integers(0, 420, T).astype(np.int32)
        sids = rng.integers(0, 5, T)
        n_kv, window = int(rng.integers(0, n + 1)), int(rng.choice([0, 1, 7, 128]))
        got = np.full((T, n_kv), np.float16(1.5))          # every element must be written
        sp.mask_into(got, pos, sids, window)
        assert got.tobytes() == _mask_reference(sp, pos, sids, n_kv, window).tobytes()
    sp = CellSpace("full", 16)
    for out in (np.zeros((2, 16), np.float32), np.zeros((2, 32), np.float16),
                np.zeros((16, 2), np.float16).T, np.zeros((3, 16), np.float16)):
        with pytest.raises(InvalidArgumentError, match="KV mask"):
            sp.mask_into(out, np.array([1, 2], np.int32), np.array([0, 0]))
    with pytest.raises(InvalidArgumentError, match=r"sequence ids must be in \[0, 63\]"):
        sp.mask_into(np.zeros((2, 16), np.float16), np.array([1, 2], np.int32), np.array([0, 64]))


def test_window_sized_cache_for_sliding_layers_equals_full_cache(tiny_models):
    """Gemma's sliding-window layers get their own window-sized cell space (as llama.cpp); after
    it wraps (300 tokens through 256 cells, window 8) the logits equal the full-cache layout's."""
    tm = _model(tiny_models, "gemma3", "f32")
    prompt = PROMPT * 3
    runs = {}
    for swa_full in (False, True):
        with LLM(tm.path, n_ctx=1024, n_ubatch=8, n_threads=1, type_k="f32", type_v="f32",
                 swa_full=swa_full) as llm:
            if not swa_full:
                assert llm.kv.spaces["swa"].n_cells == 256
                assert llm.kv.k[0].ne[1] == 256 and llm.memory_report()["kv_cache_bytes"] < \
                    2 * 1024 * 2 * tm.hparams.head_dim * tm.hparams.n_head_kv * 4
            else:
                assert "swa" not in llm.kv.spaces
            steps = [llm.eval(prompt)]
            tok = int(np.argmax(steps[-1]))
            for _ in range(300):
                steps.append(llm.eval([tok]))
                tok = int(np.argmax(steps[-1]))
            if not swa_full:
                assert llm.kv.spaces["swa"].n_used() <= tm.hparams.sliding_window + 8
            runs[swa_full] = np.stack(steps)
    assert rel_err(runs[False], runs[True]) <= 1e-5


def test_q8_0_kv_cache_with_several_kv_heads(tiny_models):
    """A Q8_0 cache addresses heads by row size (blocks), not by element size. Without flash
    attention a quantized V is dequantized before it is transposed (llama.cpp refuses it)."""
    tm = tiny_models.get(arch="gemma3", weight_type="f32", n_embd=64, n_head=4, n_head_kv=2,
                         head_dim=32)
    ref = reference_logits(tm, PROMPT)
    with LLM(tm.path, n_ctx=64, n_threads=2, logits_all=True, type_k="q8_0",
             type_v="q8_0") as llm:
        got = llm.eval(PROMPT)
    assert rel_err(got, ref) <= 3e-2
    with LLM(tm.path, n_ctx=64, n_threads=2, logits_all=True, type_k="q8_0", type_v="f16",
             flash_attn=False) as llm:
        assert rel_err(llm.eval(PROMPT), ref) <= 3e-2
    with LLM(tm.path, n_ctx=64, n_threads=2, logits_all=True, type_k="q8_0", type_v="q8_0",
             flash_attn=False) as llm:
        assert rel_err(llm.eval(PROMPT), ref) <= 3e-2
