"""KV cache types (-ctk/-ctv, type_k/type_v): f16, f32, bf16, q8_0, q4_0, q4_1, q5_0, q5_1,
iq4_nl as llama.cpp offers them, with its Hadamard rotation of quantized K/V, in both attention
paths (flash attention reads the quantized rows; without it V is dequantized first).

References: tests/data/kv_type_refs.npz (tools/make_kv_type_refs.py, llama-cpp-python 0.3.36):
llama.cpp's logits with the same cache type on two random-weight models (head size 64, and 128
where K is rotated in blocks of 128), and ggml's CPU row quantizers on fixed rows.
"""

from __future__ import annotations

import hashlib
import sys
from pathlib import Path

import numpy as np
import pytest

from pyggml import quants
from pyggml.errors import ModelError
from pyggml.llm import kv_cache
from pyggml.llm.runtime import LLM

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tools"))

import make_kv_type_refs as K  # noqa: E402

REFS = np.load(ROOT / "tests" / "data" / "kv_type_refs.npz")
TOKENS = [int(t) for t in REFS["tokens"]]
# logit RMS of pyggml vs llama.cpp with the same cache type, (flash attention on, off),
# measured. llama.cpp runs a quantized V only with flash attention: the references are its
# flash-attention logits for both. f16 / bf16 / fa off: the known difference of the two
# attention paths (llama.cpp's flash attention accumulates f16 V in f16; tests/test_llm_archs.py
# bounds it the same way). Quantized K: the scores are the type's dots as ggml's, but summed in
# the scalar reference's order where ggml's x86 kernels use theirs (q8_0, q4_1, iq4_nl differ
# in the last bits).
MEASURED = {
    "qwen3": {"f16": (0.0362, 0.0366), "bf16": (0.0004, 0.0395), "q8_0": (0.0081, 0.0004),
              "q4_0": (0.0011, 0.0011), "q4_1": (0.0150, 0.0222), "q5_0": (0.0004, 0.0004),
              "q5_1": (0.0008, 0.0008), "iq4_nl": (0.0035, 0.0173)},
    "kv-d128": {"f16": (0.0307, 0.0308), "bf16": (0.0190, 0.0321), "q8_0": (0.0032, 0.0032),
                "q4_0": (0.0040, 0.0040), "q4_1": (0.0126, 0.0109), "q5_0": (0.0004, 0.0004),
                "q5_1": (0.0008, 0.0008), "iq4_nl": (0.0265, 0.0004)},
}


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    d = tmp_path_factory.mktemp("kv_models")
    paths = K.write_models(d)
    for m, p in paths.items():
        assert hashlib.sha256(p.read_bytes()).hexdigest() == str(REFS[f"{m}.sha256"]), (
            f"{m}: the generator no longer writes the file the references were made on; rerun "
            f"tools/make_kv_type_refs.py")
    return paths


def _rms(a, b) -> float:
    return float(np.sqrt(((a - b) ** 2).mean()))


def _logits(path, t, fa) -> np.ndarray:
    with LLM(path, n_ctx=256, n_batch=64, n_ubatch=64, n_threads=2, logits_all=True,
             type_k=t, type_v=t, flash_attn=fa) as llm:
        return llm.eval(TOKENS)


@pytest.mark.parametrize("model", list(MEASURED))
@pytest.mark.parametrize("t", K.TYPES)
def test_logits_equal_llamacpp_with_the_same_cache_type(models, model, t):
    ref = REFS[f"{model}.{t}.fa1.logits"].astype(np.float32)
    f16 = REFS[f"{model}.f16.fa1.logits"].astype(np.float32)
    for fa, measured in zip((True, False), MEASURED[model][t]):
        rms = _rms(_logits(models[model], t, fa), ref)
        assert rms <= 1.5 * measured + 0.003, (model, t, fa, rms)
    if t in ("q4_0", "q5_0", "iq4_nl"):
        # the quantized cache's own error (llama.cpp's q4_0 vs its f16) is far above the
        # distance to llama.cpp's same-type logits: the same rows and rotation, not a look-alike
        assert min(MEASURED[model][t]) < 0.15 * _rms(ref, f16)


def test_rotation_is_what_llamacpp_does(models, monkeypatch):
    """Without the rotation a q4_0 cache gives other logits than llama.cpp's (which rotates):
    the rotation is needed for the match above, and it is the better cache (closer to f16)."""
    ref = REFS["kv-d128.q4_0.fa1.logits"].astype(np.float32)
    f16 = _logits(models["kv-d128"], "f16", True)
    rotated = _logits(models["kv-d128"], "q4_0", True)
    monkeypatch.setattr(kv_cache, "ROTATE_QUANTIZED", False)
    plain = _logits(models["kv-d128"], "q4_0", True)
    assert _rms(plain, ref) > 10 * _rms(rotated, ref)
    assert _rms(rotated, f16) < _rms(plain, f16)


@pytest.mark.parametrize("t", list(K.ROW_TYPES))
def test_cache_rows_are_quantized_as_ggml_does(t):
    """set_rows writes a row with the type's from_float: ggml's CPU quantize_row_<type> bit
    for bit (IQ4_NL: without the scale search llama-quantize's files use)."""
    got = quants.quantize_act(REFS["rows.x"], t)
    assert np.array_equal(got, REFS[f"rows.{t}"])


def test_hadamard_and_rotation_sizes_are_llamacpps():
    for n in (64, 128, 256):
        h = kv_cache.hadamard(n)
        assert h.dtype == np.float32 and np.array_equal(h, h.T)
        assert np.abs(h @ h - np.eye(n)).max() < 1e-6
        i, j = np.indices((n, n))
        signs = 1 - 2 * (np.vectorize(lambda x: bin(x).count("1"))(i & j) % 2)
        assert np.array_equal(np.sign(h), signs)
    sizes = kv_cache.rotation_sizes
    assert sizes("q4_0", 128, "q4_0", 128) == (128, 64)
    assert sizes("q8_0", 64, "f16", 64) == (64, 0)
    assert sizes("iq4_nl", 256, "q5_1", 256) == (256, 64)
    assert sizes("q4_0", 192, "q4_0", 192) == (64, 64)        # 192 = 3·64
    assert sizes("q4_0", 80, "q4_0", 80) == (0, 0)            # not a multiple of 64
    assert sizes("f16", 128, "bf16", 128) == (0, 0)


@pytest.mark.parametrize("t,bytes_per_32", [("f16", 64), ("bf16", 64), ("q8_0", 34),
                                            ("q4_0", 18), ("q4_1", 20), ("q5_0", 22),
                                            ("q5_1", 24), ("iq4_nl", 18)])
def test_cache_bytes_planned_and_allocated(models, t, bytes_per_32):
    from pyggml.planning.memory import plan_memory
    path = models["kv-d128"]
    n_ctx, n_layer, width = 512, 2, 128 * 2          # head 128 × 2 KV heads
    want = 2 * n_layer * n_ctx * width // 32 * bytes_per_32
    with LLM(path, n_ctx=n_ctx, n_threads=1, type_k=t, type_v=t) as llm:
        assert llm.kv.n_bytes == want
        rot = 0 if t in ("f16", "bf16") else 4 * (128 * 128 + 64 * 64)   # the two matrices
        assert sum(llm.kv.bytes_by_buffer_type.values()) >= want + rot
    plan = plan_memory(path, n_ctx=n_ctx, type_k=t, type_v=t)
    assert plan.kv_bytes == want and plan.type_k == t


def test_unknown_kv_type_names_the_choices(models):
    with pytest.raises(ModelError, match="iq4_nl"):
        LLM(models["qwen3"], n_ctx=64, type_k="q4_k")


def test_config_schema_lists_the_cache_types():
    from pyggml.offload.config import KV_TYPE_NAMES
    assert list(KV_TYPE_NAMES) == kv_cache.kv_type_choices()


@pytest.mark.parametrize("t", ["q8_0", "q4_0", "q4_1", "q5_1", "iq4_nl", "bf16"])
def test_flash_attention_reads_the_cache_rows_as_they_are(t):
    """FLASH_ATTN_EXT on quantized K/V (a mask with holes, so kept keys come in runs of several
    lengths): the scores are K's own dots of the stored rows with q in K's vec_dot_type, V the
    stored rows dequantized; 1 and 2 threads give the same bits; a numpy reference from the
    dequantized rows."""
    from pyggml import Context, Graph, ops
    from pyggml.backend.base import tensor_set
    from pyggml.backend.cpu import CpuBackend, host_array, set_host_data
    rng = np.random.default_rng(5)
    D, nq, H, Hkv, nkv = 64, 3, 4, 2, 77
    q = rng.standard_normal((H, nq, D)).astype(np.float32)
    k = rng.standard_normal((Hkv, nkv, D)).astype(np.float32)
    v = rng.standard_normal((Hkv, nkv, D)).astype(np.float32)
    m = np.zeros((nq, nkv), np.float32)
    m[:, 5:9] = m[:, 20] = m[:, 41:50] = -np.inf
    m[0, 70:] = -np.inf
    ctx = Context(mem_size=16 << 20, no_alloc=False)

    def cache(x):
        tt = ctx.new_tensor(t, [D, nkv, Hkv])
        rows = quants.quantize_act(x, t)                   # what set_rows writes
        tensor_set(tt, rows)
        return tt, quants.dequantize(rows, t).reshape(x.shape).astype(np.float64)
    (tk, kd), (tv, vd) = cache(k), cache(v)
    tq = ctx.new_tensor("f32", [D, nq, H])
    set_host_data(tq, q)
    tm = ctx.new_tensor("f16", [nkv, nq])
    set_host_data(tm, m.astype(np.float16))
    out = ops.flash_attn_ext(ctx, tq, tk, tv, tm, scale=0.125)
    g = Graph()
    g.build_forward_expand(out)
    res = []
    for n in (1, 2):
        CpuBackend(n_threads=n).graph_compute(g)
        res.append(host_array(out).copy())
    assert res[0].tobytes() == res[1].tobytes()
    # q as K's dot sees it: in K's vec_dot_type (q8_0, q8_1, bf16) and back
    qt = {"q4_1": "q8_1", "q5_1": "q8_1", "bf16": "bf16"}.get(t, "q8_0")
    qd = quants.dequantize(quants.quantize_act(q, qt), qt).reshape(q.shape)
    ref = np.zeros((nq, H, D))
    for h in range(H):
        s = qd[h] @ kd[h // 2].T * 0.125 + m
        p = np.exp(s - s.max(-1, keepdims=True))
        ref[:, h] = (p / p.sum(-1, keepdims=True)) @ vd[h // 2]
    got = res[0].astype(np.float64).reshape(nq, H, D)
    # (q4_1 / q5_1: ggml's dot adds min · (q8_1's block sum, stored as fp16))
    tol = 5e-4 if t in ("q4_1", "q5_1") else 2e-5
    assert np.abs(got - ref).max() <= tol * np.abs(ref).max()
