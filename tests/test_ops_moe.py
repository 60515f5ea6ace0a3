"""The mixture-of-experts ops on the CPU against numpy float64 references: MUL_MAT_ID (every
weight type, every kernel path incl. forced scalar, decode and batch shapes, broadcast
activations, strided ids), ARGSORT / argsort_top_k, SUM_ROWS, CLAMP, SIGMOID; 1, 2 and 3 threads
give identical bits.

MUL_MAT_ID tolerances are MUL_MAT's (tests/test_ops_cpu.py): the reference converts the
activations to the weight's vec_dot_type as the kernel does and multiplies dequantized weights in
float64: 2e-5 (fp32 accumulation order), Q4_1/Q5_1 2e-3 (Q8_1's fp16 block sum).
"""
import zlib

import numpy as np
import pytest

from pyggml import Context, Graph, _native, ops, quants
from pyggml.backend.cpu import CpuBackend, host_array, set_host_data
from pyggml.errors import BackendError, ShapeError
from pyggml.types import SORT_ORDER_ASC, SORT_ORDER_DESC, GGMLType

RNG = np.random.default_rng(1)


@pytest.fixture(autouse=True)
def _seed_per_test(request):
    global RNG
    RNG = np.random.default_rng(zlib.crc32(request.node.nodeid.encode()))


@pytest.fixture(scope="module")
def cpus():
    return [CpuBackend(n_threads=n) for n in (1, 2, 3)]


@pytest.fixture(params=_native.available_paths())
def path(request):
    """Every kernel path this CPU runs (scalar always), restored afterwards."""
    before = _native.cpu_path()
    _native.set_cpu_path(request.param)
    yield request.param
    _native.set_cpu_path(before)


def new_ctx():
    return Context(mem_size=64 << 20, no_alloc=False)


def rand(*shape, scale=1.0):
    return (RNG.standard_normal(shape) * scale).astype(np.float32)


def tensor(ctx, data: np.ndarray, type_="f32", name=""):
    t = ctx.new_tensor(type_, list(reversed(data.shape)), name=name)
    set_host_data(t, data.astype({"f32": np.float32, "i32": np.int32}[type_]))
    return t


def run(out, cpus):
    """Compute with every thread count; all must agree bit for bit. Returns the result."""
    g = Graph()
    g.build_forward_expand(out)
    first = None
    for cpu in cpus:
        cpu.graph_compute(g)
        r = host_array(out).copy()
        host_array(out)[...] = 0
        if first is None:
            first = r
        else:
            assert r.tobytes() == first.tobytes(), f"{cpu.n_threads} threads differ from 1"
    return first.reshape(tuple(reversed(out.ne[: out.n_dims])))


def close(got, ref, tol):
    ref = np.asarray(ref, dtype=np.float64)
    scale = max(np.max(np.abs(ref)), 1e-30)
    err = np.max(np.abs(got.astype(np.float64) - ref)) / scale
    assert err <= tol, f"max relative error {err:.3g} > {tol}"


# ---- mul_mat_id -------------------------------------------------------------------------------

WTYPES = ["f32", "f16", "bf16", "q4_0", "q4_1", "q5_0", "q5_1", "q8_0",
          "q2_k", "q3_k", "q4_k", "q5_k", "q6_k"]


def expert_weights(ctx, wtype, n_expert, N, K, poison=()):
    """Stacked experts [K, N, n_expert] and their dequantized values (n_expert, N, K). Experts in
    `poison` get NaN weights: a kernel that reads any of their rows returns NaN."""
    w = rand(n_expert, N, K, scale=0.5)
    t = ctx.new_tensor(wtype, [K, N, n_expert], name="exps")
    if wtype == "f32":
        w[list(poison)] = np.nan
        set_host_data(t, w)
        return t, w.astype(np.float64)
    if wtype in ("f16", "bf16"):
        w[list(poison)] = np.nan
        if wtype == "f16":
            set_host_data(t, w.astype(np.float16))
            return t, w.astype(np.float16).astype(np.float64)
        bits = (w.view(np.uint32) >> 16).astype(np.uint16)      # exact for bf16-rounded values
        w = (bits.astype(np.uint32) << 16).view(np.float32)
        set_host_data(t, bits)
        return t, w.astype(np.float64)
    q = quants.quantize(w.reshape(-1, K), wtype)
    deq = quants.dequantize(q, wtype).reshape(n_expert, N, K).astype(np.float64)
    raw = bytearray(q.tobytes())
    per_expert = len(raw) // n_expert
    for e in poison:                                       # every byte 0xff: NaN fp16 scales
        raw[e * per_expert:(e + 1) * per_expert] = b"\xff" * per_expert
    set_host_data(t, bytes(raw))
    return t, deq


def act_ref(x, wtype):
    """Activations as the kernel sees them: converted to the weight's vec_dot_type."""
    vdt = quants.vec_dot_type(wtype)
    if vdt == GGMLType.F32:
        return x.astype(np.float64)
    q = quants.quantize_act(x.reshape(-1, x.shape[-1]), vdt)
    return quants.dequantize(q, vdt).reshape(x.shape).astype(np.float64)


def mul_mat_id_ref(w, x, ids):
    """w (n_expert, N, K), x (n_tok, n_b, K), ids (n_tok, n_used) → (n_tok, n_used, N)."""
    n_tok, n_used = ids.shape
    n_b = x.shape[1]
    out = np.zeros((n_tok, n_used, w.shape[1]))
    for t in range(n_tok):
        for i in range(n_used):
            out[t, i] = w[ids[t, i]] @ x[t, i % n_b]
    return out


def tol_of(wtype):
    return 2e-3 if wtype in ("q4_1", "q5_1") else 2e-5


def _case(wtype, n_tok, n_b, cpus, n_expert=6, n_used=3, N=13, poison=(5,)):
    ctx = new_ctx()
    K = 512 if wtype.endswith("_k") else 96
    wt, w = expert_weights(ctx, wtype, n_expert, N, K, poison)
    allowed = [e for e in range(n_expert) if e not in poison]
    ids = RNG.choice(allowed, size=(n_tok, n_used)).astype(np.int32)   # repeats allowed
    x = rand(n_tok, n_b, K)
    out = ops.mul_mat_id(ctx, wt, tensor(ctx, x), tensor(ctx, ids, "i32"))
    assert out.ne == (N, n_used, n_tok, 1)
    got = run(out, cpus)
    assert np.all(np.isfinite(got)), "a row of an unselected (NaN) expert was read"
    close(got, mul_mat_id_ref(w, act_ref(x, wtype), ids), tol_of(wtype))
    close(got, mul_mat_id_ref(w, x.astype(np.float64), ids), 3e-2)   # near float math too


@pytest.mark.parametrize("wtype", WTYPES)
@pytest.mark.parametrize("n_tok", [1, 9])
def test_mul_mat_id_every_type(wtype, n_tok, cpus):
    """Decode (one token: one entry per expert, vec_dot) and a batch (several entries per
    expert: gemm blocks, and N=13 rows cut over the threads at gemm-block multiples)."""
    _case(wtype, n_tok, 3, cpus)


@pytest.mark.parametrize("wtype", ["f32", "f16", "q4_0", "q8_0", "q4_k", "q6_k"])
def test_mul_mat_id_every_path(wtype, path, cpus):
    """Forced scalar and every SIMD path: same references."""
    _case(wtype, 9, 3, cpus)
    _case(wtype, 1, 1, cpus)


@pytest.mark.parametrize("wtype", ["f32", "q4_0", "q4_k"])
def test_mul_mat_id_broadcast_activations(wtype, cpus):
    """b.ne[1] == 1: every slot of a token multiplies the token's one activation row (the
    gate/up projections of an MoE FFN)."""
    _case(wtype, 5, 1, cpus, n_expert=8, n_used=4, N=40)


def test_mul_mat_id_many_tokens_per_expert(cpus):
    """More entries per expert than one outer block of activations (Q8_0 rows of K=4096 are
    4352 bytes, so a 256 KiB block holds 56 of them): the outer loop runs more than once."""
    _case("q8_0", 70, 1, cpus, n_expert=2, n_used=1, N=9, poison=())


TILE_TYPES = ["q2_k", "q3_k", "q4_k", "q5_k", "q6_k", "q4_0", "q5_0", "q8_0",
              "iq4_xs", "iq4_nl", "mxfp4"]


@pytest.mark.parametrize("wtype", TILE_TYPES)
def test_mul_mat_id_prompt_rows_equal_each_token_alone(wtype, path, cpus):
    """A prompt's expert products (native/src/ops_moe.c): experts with 41, 20 and 17 routed
    rows take dense MUL_MAT's repacked tiles where the path has them (from 12 or 32 rows per
    expert, by how fast the type's pack is), one with 2 rows the gemm. Every row has the bits of
    its token computed alone (one token: the decode kernels), on every path, with 1, 2 and 3
    threads; N = 37 is two tiles and a tail."""
    ctx = new_ctx()
    n_tok, K, N = 40, 512, 37
    wt, w = expert_weights(ctx, wtype, 4, N, K, ())
    ids = np.zeros((n_tok, 2), np.int32)                  # slot 0: expert 0 for every token
    ids[:, 1] = [1] * 20 + [2] * 17 + [3, 3, 0]          # token 39 picks expert 0 twice
    x = rand(n_tok, 1, K)
    out = ops.mul_mat_id(ctx, wt, tensor(ctx, x), tensor(ctx, ids, "i32"))
    got = run(out, cpus)
    close(got, mul_mat_id_ref(w, act_ref(x, wtype), ids), tol_of(wtype))
    for t in range(n_tok):
        one = ops.mul_mat_id(ctx, wt, tensor(ctx, x[t:t + 1]), tensor(ctx, ids[t:t + 1], "i32"))
        alone = run(one, cpus[1:2])
        assert alone.tobytes() == got[t:t + 1].tobytes(), (
            f"{path}: token {t}'s rows differ from the token alone (max |diff| "
            f"{float(np.max(np.abs(alone - got[t:t + 1]))):.3g})")


def test_mul_mat_id_strided_ids_from_top_k(cpus):
    """ids as argsort_top_k makes them: a view of the first k columns of a descending
    argsort (row stride n_expert)."""
    ctx = new_ctx()
    n_expert, k, n_tok, K, N = 7, 2, 4, 64, 11
    wt, w = expert_weights(ctx, "q8_0", n_expert, N, K, ())
    logits = rand(n_tok, n_expert)
    top = ops.argsort_top_k(ctx, tensor(ctx, logits), k)
    assert top.nb[1] == n_expert * 4 and not top.is_contiguous()
    x = rand(n_tok, 1, K)
    out = ops.mul_mat_id(ctx, wt, tensor(ctx, x), top)
    ids = np.argsort(-logits, axis=1, kind="stable")[:, :k]
    close(run(out, cpus), mul_mat_id_ref(w, act_ref(x, "q8_0"), ids), 2e-5)


def test_mul_mat_id_bad_expert_index_is_an_error(cpus):
    ctx = new_ctx()
    wt, _ = expert_weights(ctx, "f32", 3, 4, 32, ())
    out = ops.mul_mat_id(ctx, wt, tensor(ctx, rand(2, 1, 32)),
                         tensor(ctx, np.array([[0, 3], [1, 2]], np.int32), "i32"), name="moe")
    g = Graph()
    g.build_forward_expand(out)
    with pytest.raises(BackendError, match="'moe'.*expert id"):
        cpus[1].graph_compute(g)


# ---- router pieces ----------------------------------------------------------------------------

def argsort_ref(x, desc):
    """Value order, ties by index, NaNs last (by index)."""
    out = np.empty(x.shape, np.int64)
    for r, row in enumerate(x.reshape(-1, x.shape[-1])):
        key = [(1, 0.0, i) if np.isnan(v) else (0, -v if desc else v, i) for i, v in enumerate(row)]
        out.reshape(-1, x.shape[-1])[r] = [k[2] for k in sorted(key)]
    return out


@pytest.mark.parametrize("order", [SORT_ORDER_ASC, SORT_ORDER_DESC])
@pytest.mark.parametrize("n", [1, 2, 7, 64, 300])
def test_argsort(order, n, cpus):
    ctx = new_ctx()
    x = rand(3, 5, n)
    x = np.round(x * 2) / 2                         # many ties
    if n > 4:
        x[0, 0, 1] = np.nan
        x[0, 0, 3] = np.nan
        x[1, 2, 0] = np.inf
        x[2, 1, n - 1] = -np.inf
    out = ops.argsort(ctx, tensor(ctx, x), order)
    assert out.type == GGMLType.I32
    got = run(out, cpus)
    assert np.array_equal(got, argsort_ref(x, order == SORT_ORDER_DESC))


def test_argsort_of_permuted_rows_and_top_k(cpus):
    ctx = new_ctx()
    x = rand(4, 6, 33)
    p = ops.permute(ctx, tensor(ctx, x), 0, 2, 1, 3)            # rows strided: [33, 4, 6]
    top = ops.argsort_top_k(ctx, p, 5)
    assert top.ne == (5, 4, 6, 1)
    got = run(ops.cont(ctx, top), cpus)
    ref = argsort_ref(x.transpose(1, 0, 2), True)[..., :5]
    assert np.array_equal(got, ref)
    with pytest.raises(ShapeError, match="k=34"):
        ops.argsort_top_k(ctx, p, 34)
    with pytest.raises(ValueError, match="order"):
        ops.argsort(ctx, p, 2)


@pytest.mark.parametrize("shape", [(1, 1), (3, 5, 33), (2, 3, 4, 1000)])
def test_sum_rows(shape, cpus):
    ctx = new_ctx()
    x = rand(*shape, scale=3.0)
    out = ops.sum_rows(ctx, tensor(ctx, x))
    assert out.ne[0] == 1 and out.ne[1:] == tensor(ctx, x).ne[1:]
    close(run(out, cpus), x.astype(np.float64).sum(-1, keepdims=True), 1e-7)


def test_sum_rows_of_strided_view(cpus):
    ctx = new_ctx()
    x = rand(5, 12)
    v = ops.view_2d(ctx, tensor(ctx, x), 7, 5, 12 * 4, 4 * 3)    # columns 3..9 of each row
    close(run(ops.sum_rows(ctx, v), cpus), x[:, 3:10].astype(np.float64).sum(-1, keepdims=True),
          1e-7)


def test_clamp_and_sigmoid(cpus):
    ctx = new_ctx()
    x = rand(3, 41, scale=4.0)
    x[0, :4] = [np.nan, np.inf, -np.inf, 0.0]
    got = run(ops.clamp(ctx, tensor(ctx, x), -1.5, 2.25), cpus)
    ref = np.clip(x, -1.5, 2.25)
    ref[0, 0] = 2.25                                # NaN -> max, as ggml's MIN/MAX macros
    assert np.array_equal(got, ref.astype(np.float32))
    got = run(ops.clamp(ctx, tensor(ctx, x), 6.103515625e-5, np.inf), cpus)
    ref = np.maximum(x, np.float32(6.103515625e-5))
    ref[0, 0] = np.inf
    assert np.array_equal(got, ref.astype(np.float32))
    x[0, 0] = 0.5
    close(run(ops.sigmoid(ctx, tensor(ctx, x)), cpus), 1 / (1 + np.exp(-x.astype(np.float64))),
          2e-7)


def test_clamp_and_sigmoid_in_place(cpus):
    """Both are in alloc.INPLACE_OPS: the kernels accept dst == src."""
    ctx = new_ctx()
    x = rand(4, 37, scale=3.0)
    a = tensor(ctx, x)
    out = ops.clamp(ctx, ops.sigmoid(ctx, a, inplace=True), 0.25, 0.75, inplace=True)
    assert out.view_src is a or out.view_src.view_src is a
    got = run(out, cpus[:1])
    ref = np.clip(1 / (1 + np.exp(-x.astype(np.float64))), 0.25, 0.75)
    close(got, ref, 2e-7)


def test_batch_of_expert_products_uses_the_batch_threads():
    """A CPU split of only MUL_MAT_ID nodes (experts on the CPU) over several tokens is batch
    work: n_threads_batch, as for a MUL_MAT over several rows; one token: n_threads."""
    cpu = CpuBackend(n_threads=1, n_threads_batch=3)
    for n_tok, want in ((5, 3), (1, 1)):
        ctx = Context(no_alloc=True)
        out = ops.mul_mat_id(ctx, ctx.new_tensor("q4_0", [64, 8, 4]),
                             ctx.new_tensor("f32", [64, 1, n_tok]),
                             ctx.new_tensor("i32", [2, n_tok]))
        g = Graph()
        g.build_forward_expand(out)
        assert cpu._threads_for(g) == want
