"""Every CPU op against a numpy float64 reference, on shapes that are not multiples of block or
thread counts, with contiguous and permuted inputs; 1 and 2 threads give identical bits.

Tolerances (relative to the largest reference magnitude of the output):
- element-wise, norms, softmax, rope, copies between float types: 1e-5 (fp32 rounding);
  F16/BF16 destinations: their rounding (1e-3 / 8e-3).
- MUL_MAT: the reference quantizes the activations the way the kernel does (quantize_act to the
  weight's vec_dot_type) and dequantizes the weights, then multiplies in float64: 2e-5 (fp32
  accumulation order). This checks the algorithm exactly, not merely "close to float". Q4_1/Q5_1:
  2e-3, because their min term uses Q8_1's block sum, stored in fp16.
- FLASH_ATTN_EXT with F16 K/V: q is rounded to fp16 for the K dots (as ggml): 2e-3.
"""
import zlib

import numpy as np
import pytest

from pyggml import Context, Graph, _native, ops, quants
from pyggml.backend.cpu import CpuBackend, host_array, set_host_data
from pyggml.errors import BackendError, ComputeAbortedError, InvalidArgumentError, UnsupportedOpError
from pyggml.types import ROPE_MODE_NEOX, ROPE_MODE_NORMAL, GGMLType

RNG = np.random.default_rng(1234)


@pytest.fixture(autouse=True)
def _seed_per_test(request):
    """Same data for a test however tests are ordered or distributed (pytest-xdist)."""
    global RNG
    RNG = np.random.default_rng(zlib.crc32(request.node.nodeid.encode()))


@pytest.fixture(scope="module")
def cpu1():
    return CpuBackend(n_threads=1)


@pytest.fixture(scope="module")
def cpu2():
    return CpuBackend(n_threads=2)


def new_ctx():
    return Context(mem_size=64 << 20, no_alloc=False)


def rand(*shape, scale=1.0):
    return (RNG.standard_normal(shape) * scale).astype(np.float32)


def tensor(ctx, data: np.ndarray, type_="f32", name=""):
    t = ctx.new_tensor(type_, list(reversed(data.shape)), name=name)
    set_host_data(t, data.astype({"f32": np.float32, "f16": np.float16,
                                  "i32": np.int32}[type_]))
    return t


def run(out, cpu1, cpu2):
    """Compute with 1 and 2 threads; they must agree bit for bit. Returns the float64 result."""
    g = Graph()
    g.build_forward_expand(out)
    cpu1.graph_compute(g)
    r1 = host_array(out).copy()
    host_array(out)[...] = 0
    cpu2.graph_compute(g)
    r2 = host_array(out).copy()
    assert r1.tobytes() == r2.tobytes(), "1 and 2 threads differ"
    return r1.astype(np.float64).reshape(tuple(reversed(out.ne[: out.n_dims])))


def close(got, ref, tol):
    ref = np.asarray(ref, dtype=np.float64)
    scale = max(np.max(np.abs(ref)), 1e-30)
    err = np.max(np.abs(got - ref)) / scale
    assert err <= tol, f"max relative error {err:.3g} > {tol}"


SHAPES = [(1, 1, 7), (3, 5, 33), (2, 3, 4, 65)]   # numpy order: odd, not multiples of 32


# ---- element-wise ---------------------------------------------------------------------------------

@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("op", ["add", "sub", "mul", "div"])
@pytest.mark.parametrize("bcast", ["full", "row", "plane"])
def test_binary(op, shape, bcast, cpu1, cpu2):
    ctx = new_ctx()
    a = rand(*shape)
    bshape = {"full": shape, "row": (shape[-1],), "plane": (1,) * (len(shape) - 1) + (shape[-1],)}[bcast]
    b = rand(*bshape) + (3.0 if op == "div" else 0.0)
    out = getattr(ops, op)(ctx, tensor(ctx, a), tensor(ctx, b))
    ref = {"add": np.add, "sub": np.subtract, "mul": np.multiply, "div": np.divide}[op](
        a.astype(np.float64), b.astype(np.float64))
    close(run(out, cpu1, cpu2), ref, 1e-6)


def test_binary_broadcast_inner_dim(cpu1, cpu2):
    """b repeats along ne[0] too (ne[0] of a a multiple of b's)."""
    ctx = new_ctx()
    a, b = rand(4, 12), rand(4, 3)
    out = ops.mul(ctx, tensor(ctx, a), tensor(ctx, b))
    close(run(out, cpu1, cpu2), a * np.tile(b, (1, 4)), 1e-6)


def _gelu_ref(x):
    """ggml's GELU: tanh form evaluated on fp16-rounded input, output rounded to fp16."""
    xh = x.astype(np.float16).astype(np.float64)
    y = 0.5 * xh * (1 + np.tanh(np.sqrt(2 / np.pi) * xh * (1 + 0.044715 * xh * xh)))
    y = y.astype(np.float16).astype(np.float64)
    return np.where(x <= -10, 0.0, np.where(x >= 10, x, y))


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("op", ["sqr", "sqrt", "scale", "silu", "gelu", "tanh"])
def test_unary(op, shape, cpu1, cpu2):
    ctx = new_ctx()
    a = rand(*shape, scale=3.0)
    if op == "sqrt":
        a = np.abs(a)
    if op == "gelu":
        a[..., 0] = 12.0      # the x >= 10 and x <= -10 branches
        a.flat[1] = -11.0
    ta = tensor(ctx, a)
    out = ops.scale(ctx, ta, 0.37, 0.5) if op == "scale" else getattr(ops, op)(ctx, ta)
    x = a.astype(np.float64)
    ref = {"sqr": lambda: x * x, "sqrt": lambda: np.sqrt(x), "scale": lambda: x * 0.37 + 0.5,
           "silu": lambda: x / (1 + np.exp(-x)), "gelu": lambda: _gelu_ref(x),
           "tanh": lambda: np.tanh(x)}[op]()
    # GELU's output is an fp16 table entry: fp32 vs float64 evaluation may round one ulp apart
    close(run(out, cpu1, cpu2), ref, 1e-3 if op == "gelu" else 2e-6)


@pytest.mark.parametrize("shape", SHAPES)
def test_norms(shape, cpu1, cpu2):
    ctx = new_ctx()
    a = rand(*shape, scale=2.0) + 0.5
    x = a.astype(np.float64)
    out = ops.rms_norm(ctx, tensor(ctx, a), 1e-6)
    close(run(out, cpu1, cpu2), x / np.sqrt((x * x).mean(-1, keepdims=True) + 1e-6), 2e-6)
    ctx = new_ctx()
    out = ops.norm(ctx, tensor(ctx, a), 1e-5)
    c = x - x.mean(-1, keepdims=True)
    close(run(out, cpu1, cpu2), c / np.sqrt((c * c).mean(-1, keepdims=True) + 1e-5), 2e-6)


def test_norm_of_permuted_input(cpu1, cpu2):
    ctx = new_ctx()
    a = rand(3, 5, 40)
    p = ops.permute(ctx, tensor(ctx, a), 0, 2, 1, 3)        # rows stay dense, planes swap
    out = ops.rms_norm(ctx, p, 1e-6)
    x = a.astype(np.float64).transpose(1, 0, 2)
    close(run(out, cpu1, cpu2), x / np.sqrt((x * x).mean(-1, keepdims=True) + 1e-6), 2e-6)


def test_diag_mask_inf(cpu1, cpu2):
    ctx = new_ctx()
    a = rand(2, 5, 9)
    out = ops.diag_mask_inf(ctx, tensor(ctx, a), 3)
    got = run(out, cpu1, cpu2)
    j, i = np.meshgrid(np.arange(5), np.arange(9), indexing="ij")
    ref = np.where(i > 3 + j, -np.inf, a)
    assert np.array_equal(got, ref)


@pytest.mark.parametrize("mask_type,max_bias", [(None, 0.0), ("f32", 0.0), ("f16", 0.0),
                                                 ("f32", 8.0), ("f16", 8.0)])
def test_soft_max_ext(mask_type, max_bias, cpu1, cpu2):
    ctx = new_ctx()
    H, nq, nkv = 4, 5, 37
    a = rand(H, nq, nkv, scale=3.0)
    srcs = []
    m = np.zeros((8, nkv), np.float32)          # padded rows beyond nq, as llama.cpp's masks
    m[:, 20:] = -np.inf
    m[2, :3] = -np.inf
    mt = tensor(ctx, m, mask_type) if mask_type else None
    out = ops.soft_max_ext(ctx, tensor(ctx, a), mt, scale=0.3, max_bias=max_bias)
    got = run(out, cpu1, cpu2)
    w = a.astype(np.float64) * 0.3
    if mask_type:
        n_log2 = 2 ** int(np.floor(np.log2(H)))
        m0, m1 = 2 ** (-max_bias / n_log2), 2 ** (-(max_bias / 2) / n_log2)
        slopes = [1.0 if not max_bias else (m0 ** (h + 1) if h < n_log2 else
                                            m1 ** (2 * (h - n_log2) + 1)) for h in range(H)]
        w = w + np.array(slopes)[:, None, None] * m[None, :nq].astype(np.float64)
    e = np.exp(w - w.max(-1, keepdims=True))
    close(got, e / e.sum(-1, keepdims=True), 2e-6)


def _rope_ref(x, pos, n_dims, mode, base, fscale, ff=None):
    """x: (T, H, D) float64; angles iterated in fp32 like ggml."""
    T, H, D = x.shape
    out = x.copy()
    theta_scale = np.float32(base) ** np.float32(-2.0 / n_dims)
    for t in range(T):
        theta = np.float32(pos[t])
        for k in range(n_dims // 2):
            th = np.float32(fscale) * (theta / np.float32(1.0 if ff is None else ff[k]))
            c, s = np.cos(np.float64(th)), np.sin(np.float64(th))
            i0, i1 = (2 * k, 2 * k + 1) if mode == ROPE_MODE_NORMAL else (k, k + n_dims // 2)
            x0, x1 = x[t, :, i0], x[t, :, i1]
            out[t, :, i0], out[t, :, i1] = x0 * c - x1 * s, x0 * s + x1 * c
            theta = np.float32(theta * theta_scale)
    return out


@pytest.mark.parametrize("mode", [ROPE_MODE_NORMAL, ROPE_MODE_NEOX])
@pytest.mark.parametrize("n_dims", [16, 10])
@pytest.mark.parametrize("with_ff", [False, True])
def test_rope(mode, n_dims, with_ff, cpu1, cpu2):
    ctx = new_ctx()
    T, H, D = 5, 3, 16
    x = rand(T, H, D)
    pos = np.array([0, 1, 7, 300, 4000], np.int32)
    ff = (1.0 + RNG.random(n_dims // 2)).astype(np.float32) if with_ff else None
    out = ops.rope_ext(ctx, tensor(ctx, x), tensor(ctx, pos, "i32"),
                       tensor(ctx, ff) if with_ff else None, n_dims=n_dims, mode=mode,
                       freq_base=10000.0, freq_scale=0.5)
    ref = _rope_ref(x.astype(np.float64), pos, n_dims, mode, 10000.0, 0.5, ff)
    close(run(out, cpu1, cpu2), ref, 2e-5)


def test_rope_yarn_ext_factor_is_used(cpu1, cpu2):
    """YaRN: with ext_factor the angles blend and the magnitude scales (mscale)."""
    ctx = new_ctx()
    x = rand(2, 2, 16)
    pos = tensor(ctx, np.array([3, 900], np.int32), "i32")
    plain = ops.rope_ext(ctx, tensor(ctx, x), pos, n_dims=16, freq_scale=0.25, n_ctx_orig=512)
    yarn = ops.rope_ext(ctx, tensor(ctx, x), pos, n_dims=16, freq_scale=0.25, n_ctx_orig=512,
                        ext_factor=1.0, attn_factor=1.0)
    a, b = run(plain, cpu1, cpu2), run(yarn, cpu1, cpu2)
    # mscale = 1 + 0.1 ln(1/0.25): norms of rotated pairs grow by that factor
    ratio = np.linalg.norm(b[..., :16]) / np.linalg.norm(a[..., :16])
    assert abs(ratio - (1 + 0.1 * np.log(4))) < 1e-4
    assert not np.allclose(a, b / ratio, atol=1e-3)   # and the angles differ


# ---- rows and copies ------------------------------------------------------------------------------

@pytest.mark.parametrize("wtype", ["f32", "f16", "bf16", "q4_0", "q4_1", "q5_0", "q5_1", "q8_0",
                                   "q2_k", "q3_k", "q4_k", "q5_k", "q6_k"])
def test_get_rows_every_type(wtype, cpu1, cpu2):
    ctx = new_ctx()
    K = 256 if wtype.endswith("_k") else 64
    w = rand(11, K)
    wt = ctx.new_tensor_2d(wtype, K, 11, name="w")
    if wtype == "f32":
        set_host_data(wt, w)
        deq = w
    elif wtype == "f16":
        set_host_data(wt, w.astype(np.float16))
        deq = w.astype(np.float16)
    else:
        q = quants.quantize(w, wtype)
        set_host_data(wt, q.tobytes())
        deq = quants.dequantize(q, wtype).reshape(11, K)
    ids = np.array([3, 0, 10, 3], np.int32)
    out = ops.get_rows(ctx, wt, tensor(ctx, ids, "i32"))
    assert np.array_equal(run(out, cpu1, cpu2), deq[ids].astype(np.float64))


def test_get_rows_bad_index_is_an_error(cpu2):
    ctx = new_ctx()
    out = ops.get_rows(ctx, tensor(ctx, rand(4, 8)), tensor(ctx, np.array([1, 9], np.int32), "i32"),
                       name="rows")
    g = Graph()
    g.build_forward_expand(out)
    with pytest.raises(BackendError, match="'rows'.*row index"):
        cpu2.graph_compute(g)


@pytest.mark.parametrize("dst_type", ["f32", "f16", "bf16", "q8_0"])
def test_set_rows_kv_write(dst_type, cpu1, cpu2):
    ctx = new_ctx()
    cache = ctx.new_tensor_2d(dst_type, 64, 10, name="cache")
    host_array(cache)[...] = 0
    rows = rand(3, 64)
    out = ops.set_rows(ctx, cache, tensor(ctx, rows), tensor(ctx, np.array([7, 2, 5], np.int32), "i32"))
    g = Graph()
    g.build_forward_expand(out)
    cpu2.graph_compute(g)
    if dst_type in ("f32", "f16"):
        got = host_array(cache).astype(np.float64).reshape(10, 64)
        ref = rows.astype(np.float16 if dst_type == "f16" else np.float32).astype(np.float64)
    elif dst_type == "bf16":
        got = (host_array(cache).astype(np.uint32) << 16).view(np.float32).reshape(10, 64)
        ref = rows
        assert np.max(np.abs(got[[7, 2, 5]] - ref)) <= np.max(np.abs(ref)) * 2 ** -8
        assert np.all(got[[0, 1, 3, 4, 6, 8, 9]] == 0)
        return
    else:
        got = quants.dequantize(host_array(cache).reshape(-1).tobytes(), "q8_0").reshape(10, 64)
        ref = quants.dequantize(quants.quantize_act(rows, "q8_0"), "q8_0").reshape(3, 64)
    assert np.array_equal(got[[7, 2, 5]], ref)
    assert np.all(got[[0, 1, 3, 4, 6, 8, 9]] == 0)


@pytest.mark.parametrize("src_t,dst_t", [("f32", "f16"), ("f16", "f32"), ("f32", "f32"),
                                         ("f32", "bf16"), ("f16", "f16")])
def test_cpy_permuted_into_view(src_t, dst_t, cpu1, cpu2):
    ctx = new_ctx()
    a = rand(3, 4, 6)
    ta = tensor(ctx, a, "f16" if src_t == "f16" else "f32")
    if src_t == "f16":
        a = a.astype(np.float16).astype(np.float32)
    p = ops.permute(ctx, ta, 1, 0, 2, 3)                  # numpy view: (3, 6, 4)
    dst = ctx.new_tensor(dst_t, [4, 6, 3], name="dst")
    out = ops.cpy(ctx, p, dst)
    g = Graph()
    g.build_forward_expand(out)
    cpu2.graph_compute(g)
    ref = a.transpose(0, 2, 1).astype(np.float64)
    raw = host_array(dst)
    got = ((raw.astype(np.uint32) << 16).view(np.float32) if dst_t == "bf16" else raw)
    tol = {"f32": 0, "f16": 1e-3, "bf16": 8e-3}[dst_t]
    close(got.astype(np.float64).reshape(ref.shape), ref, tol if tol else 1e-12)


def test_cont_transposed_and_reshaped(cpu1, cpu2):
    ctx = new_ctx()
    a = rand(5, 7)
    t = ops.transpose(ctx, tensor(ctx, a))
    out = ops.cont(ctx, t, ne=[35])
    assert np.array_equal(run(out, cpu1, cpu2), a.T.reshape(-1).astype(np.float64))


@pytest.mark.parametrize("dim", [0, 1, 2])
def test_concat(dim, cpu1, cpu2):
    ctx = new_ctx()
    a = rand(2, 3, 5)
    bs = list(a.shape)
    bs[2 - dim] = 4
    b = rand(*bs)
    out = ops.concat(ctx, tensor(ctx, a), tensor(ctx, b), dim)
    assert np.array_equal(run(out, cpu1, cpu2), np.concatenate([a, b], axis=2 - dim))


# ---- mul_mat --------------------------------------------------------------------------------------

WTYPES = ["f32", "f16", "bf16", "q4_0", "q4_1", "q5_0", "q5_1", "q8_0",
          "q2_k", "q3_k", "q4_k", "q5_k", "q6_k"]


def _weights(ctx, wtype, N, K, planes=1):
    w = rand(planes, N, K, scale=0.5)
    t = ctx.new_tensor(wtype, [K, N, planes], name="w")
    if wtype == "f32":
        set_host_data(t, w)
        return t, w.astype(np.float64)
    if wtype == "f16":
        set_host_data(t, w.astype(np.float16))
        return t, w.astype(np.float16).astype(np.float64)
    q = quants.quantize(w.reshape(-1, K), wtype)
    set_host_data(t, q.tobytes())
    return t, quants.dequantize(q, wtype).reshape(planes, N, K).astype(np.float64)


def _act_ref(x, wtype):
    """Activations as the kernel sees them: converted to the weight's vec_dot_type."""
    vdt = quants.vec_dot_type(wtype)
    if vdt == GGMLType.F32:
        return x.astype(np.float64)
    flat = x.reshape(-1, x.shape[-1])
    q = quants.quantize_act(flat, vdt)
    return quants.dequantize(q, vdt).reshape(x.shape).astype(np.float64)


@pytest.mark.parametrize("wtype", WTYPES)
@pytest.mark.parametrize("M", [1, 5])
def test_mul_mat_every_type(wtype, M, cpu1, cpu2):
    ctx = new_ctx()
    K = 512 if wtype.endswith("_k") else 96
    N = 13
    wt, wref = _weights(ctx, wtype, N, K)
    x = rand(M, K)
    out = ops.mul_mat(ctx, wt, tensor(ctx, x))
    got = run(out, cpu1, cpu2)
    ref = _act_ref(x, wtype) @ wref[0].T
    # Q8_1 stores its block sum s = d·Σq in fp16, which the _1 dots use for the min term
    close(got, ref, 2e-3 if wtype in ("q4_1", "q5_1") else 2e-5)
    # and against plain float math: the quantization error stays small
    close(got, x.astype(np.float64) @ wref[0].T, 2e-2)


def test_mul_mat_broadcast_and_permuted_activations(cpu1, cpu2):
    """Attention-shaped: k [D, n_kv, Hkv] times permuted q [D, T, H] with H = 2·Hkv."""
    ctx = new_ctx()
    D, nkv, Hkv, T, H = 32, 9, 2, 3, 4
    k = rand(Hkv, nkv, D)
    q = rand(T, H, D)
    tk = tensor(ctx, k, "f16")
    tq = ops.permute(ctx, tensor(ctx, q), 0, 2, 1, 3)       # [D, T, H]
    out = ops.mul_mat(ctx, tk, tq)                            # [nkv, T, H]
    got = run(out, cpu1, cpu2)
    kk = k.astype(np.float16).astype(np.float64)
    qq = q.astype(np.float16).astype(np.float64).transpose(1, 0, 2)   # (H, T, D)
    ref = np.einsum("htd,gnd->htn", qq, kk[np.arange(H) // 2][:, None][:, 0])
    ref = np.stack([qq[h] @ kk[h // 2].T for h in range(H)])
    close(got, ref, 1e-5)


# ---- flash attention ------------------------------------------------------------------------------

@pytest.mark.parametrize("kv_type", ["f32", "f16"])
@pytest.mark.parametrize("softcap", [0.0, 20.0])
def test_flash_attn_ext(kv_type, softcap, cpu1, cpu2):
    ctx = new_ctx()
    D, nq, H, Hkv, nkv = 32, 5, 4, 2, 41
    q, k, v = rand(H, nq, D), rand(Hkv, nkv, D), rand(Hkv, nkv, D)
    m = np.zeros((8, nkv), np.float32)
    for i in range(nq):
        m[i, 30 + i + 1:] = -np.inf             # causal
    m[1, :4] = -np.inf                           # a sliding-window hole
    tk, tv = tensor(ctx, k, kv_type), tensor(ctx, v, kv_type)
    out = ops.flash_attn_ext(ctx, tensor(ctx, q), tk, tv, tensor(ctx, m, "f16"),
                             scale=0.125, logit_softcap=softcap)
    got = run(out, cpu1, cpu2)                   # (nq, H, D) numpy order of [D, H, nq]
    if kv_type == "f16":
        k = k.astype(np.float16)
        v = v.astype(np.float16)
        qq = q.astype(np.float16).astype(np.float64)
    else:
        qq = q.astype(np.float64)
    ref = np.zeros((nq, H, D))
    for h in range(H):
        s = qq[h] @ k[h // 2].astype(np.float64).T * 0.125
        if softcap:
            s = softcap * np.tanh(s / softcap)
        s = s + m[:nq]
        p = np.exp(s - s.max(-1, keepdims=True))
        p /= p.sum(-1, keepdims=True)
        ref[:, h] = p @ v[h // 2].astype(np.float64)
    close(got, ref, 2e-5 if kv_type == "f32" else 2e-3)


# ---- the executor ---------------------------------------------------------------------------------

def test_plan_is_reused_and_eval_callback(cpu2):
    ctx = new_ctx()
    x = tensor(ctx, rand(2, 8), name="x")
    y = ops.silu(ctx, ops.scale(ctx, x, 2.0, name="s"), name="y")
    g = Graph()
    g.build_forward_expand(y)
    built = cpu2.n_plans_built
    cpu2.graph_compute(g)
    cpu2.graph_compute(g)
    assert cpu2.n_plans_built == built + 1           # marshalled once, computed twice
    g.next_uid()
    cpu2.graph_compute(g)
    assert cpu2.n_plans_built == built + 2           # a new uid re-marshals
    seen = []
    cpu2.set_eval_callback(lambda t, arr: seen.append((t.name, float(arr.sum()))) or True)
    try:
        cpu2.graph_compute(g)
    finally:
        cpu2.set_eval_callback(None)
    assert [n for n, _ in seen] == ["s", "y"]
    assert abs(seen[0][1] - 2 * float(host_array(x).sum())) < 1e-4


def _two_node_graph():
    """ctx (keep it: it owns the memory), x, s = 2x, y = silu(s), the graph of y."""
    ctx = new_ctx()
    x = tensor(ctx, rand(2, 8), name="x")
    s = ops.scale(ctx, x, 2.0, name="s")
    y = ops.silu(ctx, s, name="y")
    g = Graph()
    g.build_forward_expand(y)
    return ctx, x, s, y, g


def test_eval_callback_outcomes(cpu2, monkeypatch):
    """Normal, stopped by the callback (ComputeAbortedError, later nodes not computed), an
    exception inside the callback (re-raised as itself after the compute), and an internal error
    of the library (not reported as a stop): four distinct outcomes."""
    ctx, x, s, y, g = _two_node_graph()
    host_array(y)[...] = 7.0
    seen = []
    cpu2.set_eval_callback(lambda t, arr: seen.append(t.name) or True)
    try:
        cpu2.graph_compute(g)                         # normal: every node, no error
        assert seen == ["s", "y"]
        assert np.allclose(host_array(s), 2 * host_array(x))
        host_array(y)[...] = 7.0
        seen.clear()
        cpu2.set_eval_callback(lambda t, arr: seen.append(t.name) or False)
        with pytest.raises(ComputeAbortedError, match="stopped by the evaluation callback"):
            cpu2.graph_compute(g)
        assert seen == ["s"] and (host_array(y) == 7.0).all()    # y never ran

        class Boom(RuntimeError):
            pass

        def raising(t, arr):
            seen.append(t.name)
            raise Boom(f"bad value in {t.name}")
        seen.clear()
        cpu2.set_eval_callback(raising)
        with pytest.raises(Boom, match="bad value in s") as e:
            cpu2.graph_compute(g)
        assert seen == ["s"] and (host_array(y) == 7.0).all()
        assert any(f.name == "raising" for f in e.traceback)   # the callback's own traceback
    finally:
        cpu2.set_eval_callback(None)
    # an internal error of the C executor is not a callback stop
    # g's plan is validated and kept (pg_plan_compute); the others for the unkept paths
    names = ("pg_graph_compute", "pg_graph_compute_validated", "pg_plan_compute")
    real = {n: _native.fn(n) for n in names}
    for n in names:
        monkeypatch.setitem(_native._bound, n, lambda *a: _native.PG_ERR_INTERNAL)
    with pytest.raises(BackendError, match="internal error in libpyggml") as e:
        cpu2.graph_compute(g)
    assert not isinstance(e.value, ComputeAbortedError)
    for n in names:
        monkeypatch.setitem(_native._bound, n, real[n])
    cpu2.graph_compute(g)                             # and the real one works again


def test_cached_plan_follows_moved_tensors(cpu2):
    """Same graph, same uid, but its input was placed elsewhere: the cached plan re-reads the
    addresses (reading the new memory, not the old one) without being rebuilt."""
    ctx, x, s, y, g = _two_node_graph()
    cpu2.graph_compute(g)
    built = cpu2.n_plans_built
    other = new_ctx()
    x2 = tensor(other, rand(2, 8), name="x2")
    x.data = x2.data                                  # x now lives in another arena
    cpu2.graph_compute(g)
    assert cpu2.n_plans_built == built
    assert np.allclose(host_array(s), 2 * host_array(x2))
    want = 2 * host_array(x2).astype(np.float64)
    assert np.allclose(host_array(y), want / (1 + np.exp(-want)), rtol=1e-5, atol=1e-6)


def _count_calls(monkeypatch, names):
    calls = {n: 0 for n in names}
    for n in names:
        real = _native.fn(n)

        def counted(*a, _n=n, _real=real):
            calls[_n] += 1
            return _real(*a)
        monkeypatch.setitem(_native._bound, n, counted)
    return calls


def test_cached_plan_validated_once(cpu2, monkeypatch):
    """A plan's nodes are validated when it is built and when its addresses change, not on
    every compute (decode recomputes one plan a token): the recomputes take the kept plan's C
    entry point (no per-node checks, the schedule kept), with the same results."""
    ctx, x, s, y, g = _two_node_graph()
    names = ("pg_graph_validate", "pg_graph_compute", "pg_graph_compute_validated",
             "pg_plan_compute")
    calls = _count_calls(monkeypatch, names)
    cpu2.graph_compute(g)
    first = host_array(y).copy()
    assert calls["pg_graph_validate"] == 1 and calls["pg_plan_compute"] == 1
    for _ in range(3):
        cpu2.graph_compute(g)
    assert calls == dict(zip(names, (1, 0, 0, 4)))
    assert np.array_equal(host_array(y), first)
    other = new_ctx()
    x2 = tensor(other, rand(2, 8), name="x2")
    x.data = x2.data                                  # moved: validated again, once
    cpu2.graph_compute(g)
    cpu2.graph_compute(g)
    assert calls == dict(zip(names, (2, 0, 0, 6)))
    assert np.allclose(host_array(s), 2 * host_array(x2))


def test_unvalidated_plan_takes_the_validating_compute(cpu2, monkeypatch):
    """A plan whose validation was dropped (as after new addresses) is checked by the C
    executor itself on compute; so is every plan with a library that lacks the entry point."""
    ctx, x, s, y, g = _two_node_graph()
    plan = cpu2.plan(g)
    plan.validated = False
    calls = _count_calls(monkeypatch, ("pg_graph_compute", "pg_graph_compute_validated"))
    cpu2.plan_compute(plan)
    assert calls == {"pg_graph_compute": 1, "pg_graph_compute_validated": 0}
    from pyggml.backend import cpu as cpu_mod
    monkeypatch.setattr(cpu_mod, "_HAS_VALIDATED", [False])
    plan.validated, plan.handle = True, None          # such a library keeps no C plan either
    cpu2.plan_compute(plan)
    assert calls == {"pg_graph_compute": 2, "pg_graph_compute_validated": 0}


def test_missing_data_names_the_node(cpu2):
    ctx = Context()                                   # no_alloc: nothing has data
    y = ops.silu(ctx, ctx.new_tensor_1d("f32", 4, name="x"), name="act")
    g = Graph()
    g.build_forward_expand(y)
    with pytest.raises(BackendError, match="'act'.*no data"):
        cpu2.graph_compute(g)


def test_unsupported_op_names_the_node(cpu2):
    ctx = new_ctx()
    a = ctx.new_tensor_2d("f16", 8, 2, name="h")
    y = ops.silu(ctx, a, name="act16")                # F16 silu has no CPU kernel
    g = Graph()
    g.build_forward_expand(y)
    assert not cpu2.supports_op(y)
    assert "F32" in cpu2.why_unsupported(y)
    with pytest.raises(UnsupportedOpError, match="'act16'.*SILU"):
        cpu2.graph_compute(g)
    w = ctx.new_tensor_2d("nvfp4", 256, 2, name="wq")       # a type with no kernels yet
    mm = ops.mul_mat(ctx, w, ctx.new_tensor_2d("f32", 256, 1, name="xa"), name="mm")
    assert "no dot kernel" in cpu2.why_unsupported(mm)


def test_thread_counts():
    with pytest.raises(ValueError, match="n_threads"):
        CpuBackend(n_threads=1000)
