"""The C executor's schedule (native/src/graph.c): barriers only where a node needs another
thread's results, element-wise nodes after a decode MUL_MAT fused into it, weights prefetched by a
thread early at a barrier. None of it may change a bit: every graph here is computed with the
schedule (pg_graph_set_schedule modes 1 and 2) and without it (mode 0: a barrier after every
node), with 1 to 4 threads, and the outputs must be equal byte for byte. The counts of barriers and
fused nodes show that the schedule did act on these graphs (pg_graph_schedule_stats)."""
import zlib

import numpy as np
import pytest

from pyggml import Context, Graph, _native, ops, quants
from pyggml.backend.cpu import CpuBackend, host_array, set_host_data
from pyggml.types import ROPE_MODE_NEOX, ROPE_MODE_NORMAL

THREADS = (1, 2, 3, 4)


@pytest.fixture(scope="module")
def cpus():
    bs = {n: CpuBackend(n_threads=n) for n in THREADS}
    yield bs
    _native.fn("pg_graph_set_schedule")(2)
    for b in bs.values():
        b.close()


@pytest.fixture
def rng(request):
    return np.random.default_rng(zlib.crc32(request.node.nodeid.encode()))


def new_ctx():
    return Context(mem_size=64 << 20, no_alloc=False)


def f32(ctx, rng, *shape, name="", scale=1.0):
    """shape in numpy order (ggml's reversed)"""
    t = ctx.new_tensor("f32", list(reversed(shape)), name=name)
    set_host_data(t, (rng.standard_normal(shape) * scale).astype(np.float32))
    return t


def weights(ctx, rng, wtype, N, K):
    t = ctx.new_tensor(wtype, [K, N], name=f"w{N}x{K}")
    w = (rng.standard_normal((N, K)) * 0.5).astype(np.float32)
    set_host_data(t, w if wtype == "f32" else quants.quantize(w, wtype).tobytes())
    return t


def compute_all(outs, cpus):
    """Every output under each mode and thread count; all must agree bit for bit with mode 0 on
    one thread. Returns the schedule's (barriers, fused) counts and the number of computed nodes."""
    g = Graph()
    for o in outs:
        g.build_forward_expand(o)
    ref = None
    setm = _native.fn("pg_graph_set_schedule")
    try:
        for mode in (0, 1, 2):
            setm(mode)
            for n, cpu in cpus.items():
                for o in outs:
                    host_array(o)[...] = np.nan
                cpu.graph_compute(g)
                got = [host_array(o).tobytes() for o in outs]
                if ref is None:
                    ref = got
                for k, (a, b) in enumerate(zip(got, ref)):
                    assert a == b, f"output {outs[k].name} differs: mode {mode}, {n} threads"
    finally:
        setm(2)
    plan = cpus[2].plan(g)
    computed = sum(1 for i in plan.order if plan.tensors[i].op.name not in
                   ("NONE", "RESHAPE", "VIEW", "PERMUTE", "TRANSPOSE"))
    return plan.schedule_stats(), computed


@pytest.mark.parametrize("wtype", ["q4_k", "q6_k", "q8_0", "q4_0"])
@pytest.mark.parametrize("M", [1, 2, 3])
@pytest.mark.parametrize("N", [8, 40, 264, 1000])
def test_matmul_epilogues_bit_exact(wtype, M, N, cpus, rng):
    """bias and residual adds, sub/div with the product second, the SwiGLU and GEGLU gates: each
    fused into the MUL_MAT before it"""
    K = 256 if wtype.endswith("_k") else 64
    ctx = new_ctx()
    x = f32(ctx, rng, M, K, name="x")
    w1, w2 = weights(ctx, rng, wtype, N, K), weights(ctx, rng, wtype, N, K)
    bias, resid = f32(ctx, rng, N, name="bias"), f32(ctx, rng, M, N, name="resid")
    gate_s = ops.silu(ctx, ops.mul_mat(ctx, w1, x), name="silu")
    swiglu = ops.mul(ctx, gate_s, ops.mul_mat(ctx, w2, x), name="swiglu")
    gate_g = ops.gelu(ctx, ops.mul_mat(ctx, w2, x), name="gelu")
    geglu = ops.mul(ctx, gate_g, ops.mul_mat(ctx, w1, x), name="geglu")
    biased = ops.add(ctx, ops.mul_mat(ctx, w1, x), bias, name="biased")
    res = ops.add(ctx, resid, ops.mul_mat(ctx, w2, x), name="res")
    sub = ops.sub(ctx, resid, ops.mul_mat(ctx, w1, x), name="sub")
    div = ops.div(ctx, ops.scale(ctx, resid, 2.0), ops.mul_mat(ctx, w2, x), name="div")
    (barriers, fused), computed = compute_all([swiglu, geglu, biased, res, sub, div], cpus)
    # both gates, their products, bias, residual, sub, div — where the type takes the vec_dot8
    # path for M rows (all K-quants up to 8 rows; some legacy types only for one)
    assert fused == 8 or (M > 1 and fused == 0), fused
    assert barriers < computed - fused


@pytest.mark.parametrize("M", [1, 2])
def test_in_place_epilogues_bit_exact(M, cpus, rng):
    """an element-wise node written over the product or over its other source"""
    ctx = new_ctx()
    K, N = 256, 72
    x = f32(ctx, rng, M, K)
    w = weights(ctx, rng, "q4_k", N, K)
    resid = f32(ctx, rng, M, N, name="resid")
    over_mm = ops.add(ctx, ops.mul_mat(ctx, w, x), f32(ctx, rng, N), inplace=True, name="over_mm")
    over_resid = ops.add(ctx, resid, ops.mul_mat(ctx, w, x), inplace=True, name="over_resid")
    silu_in_place = ops.silu(ctx, ops.mul_mat(ctx, w, x), inplace=True, name="silu_ip")
    (_, fused), _ = compute_all([over_mm, over_resid, silu_in_place], cpus)
    assert fused == 3


def test_no_fusion_over_the_activations(cpus, rng):
    """a node that writes into the product's own input must wait for every thread's dots"""
    ctx = new_ctx()
    K = 256
    x = f32(ctx, rng, 1, K, name="x")
    w = weights(ctx, rng, "q4_k", K, K)
    # out = x + x·Wᵀ written over x: each thread would overwrite activations the other still reads
    out = ops.add(ctx, x, ops.mul_mat(ctx, w, x), inplace=True, name="out")
    (_, fused), _ = compute_all([out], cpus)
    assert fused == 0


@pytest.mark.parametrize("mode", [ROPE_MODE_NORMAL, ROPE_MODE_NEOX])
@pytest.mark.parametrize("heads", [1, 2, 5])
def test_decode_block_bit_exact(mode, heads, cpus, rng):
    """One decoder layer's shape in decode (one token): the one-row chains (add -> rms_norm ->
    mul) run without barriers, q/k/v and gate/up share their input, q and k are roped and
    normed per head, the KV cache gets its row."""
    ctx = new_ctx()
    D, E, F = 64, 256, 96
    inp = f32(ctx, rng, 1, E, name="inp")
    h = ops.mul(ctx, ops.rms_norm(ctx, inp, 1e-6), f32(ctx, rng, E), name="attn_norm")
    pos = ctx.new_tensor("i32", [1], name="pos")
    set_host_data(pos, np.array([7], np.int32))
    qs = []
    for name, nh in (("q", heads), ("k", 1)):
        p = ops.add(ctx, ops.mul_mat(ctx, weights(ctx, rng, "q4_k", D * nh, E), h), f32(ctx, rng, D * nh))
        p = ops.reshape(ctx, p, [D, nh, 1])
        p = ops.mul(ctx, ops.rms_norm(ctx, p, 1e-6), f32(ctx, rng, D), name=f"{name}_norm")
        qs.append(ops.rope(ctx, p, pos, D, mode, name=f"{name}_rope"))
    v = ops.mul_mat(ctx, weights(ctx, rng, "q6_k", D, E), h)
    cache = ctx.new_tensor("f16", [D, 4], name="cache")
    set_host_data(cache, np.zeros((4, D), np.float16))
    idx = ctx.new_tensor("i32", [1], name="idx")
    set_host_data(idx, np.array([2], np.int32))
    stored = ops.set_rows(ctx, cache, ops.reshape(ctx, v, [D, 1]), idx, name="stored")
    att = ops.scale(ctx, ops.reshape(ctx, qs[0], [D * heads, 1]), 0.125, name="att")
    o = ops.add(ctx, inp, ops.mul_mat(ctx, weights(ctx, rng, "q8_0", E, D * heads), att), name="ffn_inp")
    hn = ops.mul(ctx, ops.rms_norm(ctx, o, 1e-6), f32(ctx, rng, E), name="ffn_norm")
    up = ops.mul(ctx, ops.silu(ctx, ops.mul_mat(ctx, weights(ctx, rng, "q4_k", F * 8, E), hn)),
                 ops.mul_mat(ctx, weights(ctx, rng, "q4_k", F * 8, E), hn))
    out = ops.add(ctx, o, ops.mul_mat(ctx, weights(ctx, rng, "q4_k", E, F * 8), up), name="l_out")
    nxt = ops.mul(ctx, ops.rms_norm(ctx, out, 1e-6), f32(ctx, rng, E), name="next_norm")
    (barriers, fused), computed = compute_all([nxt, qs[1], stored], cpus)
    assert fused == 6, fused     # q and k bias, the residual after the attention output, silu, up, down
    assert barriers <= computed - fused - 5, (barriers, computed, fused)


@pytest.mark.parametrize("seed", range(12))
def test_random_graphs_bit_exact(seed, cpus):
    """random mixes of element-wise nodes over rows of several counts and decode MUL_MATs, some
    in place: whatever the schedule elides or fuses, the bits stay those of a barrier per node"""
    rng = np.random.default_rng(seed)
    ctx = new_ctx()
    K = 256
    pool = [f32(ctx, rng, int(rng.integers(1, 4)), K, name=f"in{i}") for i in range(3)]
    for i in range(40):
        a = pool[int(rng.integers(len(pool)))]
        kind = rng.choice(["mm", "add", "mul", "silu", "gelu", "norm", "scale", "inplace"])
        if kind == "mm":
            x = a if a.ne[0] == K and a.ne[1] <= 3 else pool[0]
            t = ops.mul_mat(ctx, weights(ctx, rng, "q4_k", K, K), x)
        elif kind in ("add", "mul"):
            same = [b for b in pool if b.ne[:2] == a.ne[:2]]
            t = getattr(ops, kind)(ctx, a, same[int(rng.integers(len(same)))])
        elif kind == "inplace":
            t = ops.scale(ctx, a, 0.5, inplace=True) if a.op.name != "NONE" else ops.sqr(ctx, a)
        elif kind == "norm":
            t = ops.rms_norm(ctx, a, 1e-5)
        elif kind == "scale":
            t = ops.scale(ctx, a, 0.25, 1.0)
        else:
            t = getattr(ops, kind)(ctx, a)
        t.name = f"n{i}"
        pool.append(t)
    outs = pool[3:]
    compute_all(outs[-6:] + outs[:3], cpus)


def test_eval_callback_sees_every_node_complete(cpus, rng):
    """with an eval callback the executor runs without the schedule: a fused node's product is
    whole when the callback sees it"""
    ctx = new_ctx()
    x = f32(ctx, rng, 1, 256)
    mm = ops.mul_mat(ctx, weights(ctx, rng, "q4_k", 64, 256), x, name="mm")
    out = ops.add(ctx, mm, f32(ctx, rng, 64), name="out")
    g = Graph()
    g.build_forward_expand(out)
    seen = {}
    cpu = cpus[2]
    cpu.set_eval_callback(lambda t, arr: seen.setdefault(t.name, np.array(arr).copy()) is not None)
    try:
        cpu.graph_compute(g)
    finally:
        cpu.set_eval_callback(None)
    assert np.array_equal(seen["mm"], host_array(mm)) and np.array_equal(seen["out"], host_array(out))
    assert cpu.plan(g).schedule_stats()[1] == 1
