"""The recurrent-layer ops (SSM_CONV, GATED_DELTA_NET; native/src/ops_ssm.c) against numpy float64
references, with ubatches that mix sequences, on every kernel path (ops_ssm_avx2.c, _avx512.c,
_neon.c); 1 and 2 threads give the same bits, and a batch of tokens gives the bits of the same
tokens evaluated one at a time (state carried over)."""
import numpy as np
import pytest

from pyggml import Context, Graph, _native, ops
from pyggml.backend.cpu import CpuBackend, host_array, set_host_data
from pyggml.errors import ShapeError

RNG = np.random.default_rng(33)


@pytest.fixture(scope="module")
def cpus():
    return CpuBackend(n_threads=1), CpuBackend(n_threads=2)


@pytest.fixture(params=_native.available_paths())
def path(request):
    before = _native.cpu_path()
    _native.set_cpu_path(request.param)
    yield request.param
    _native.set_cpu_path(before)


def _t(ctx, data, type_="f32"):
    t = ctx.new_tensor(type_, list(reversed(data.shape)))
    set_host_data(t, data.astype({"f32": np.float32, "i32": np.int32}[type_]))
    return t


def _run(out, cpus):
    g = Graph()
    g.build_forward_expand(out)
    res = []
    for cpu in cpus:
        host_array(out)[...] = 0
        cpu.graph_compute(g)
        res.append(host_array(out).copy())
    assert res[0].tobytes() == res[1].tobytes(), "1 and 2 threads differ"
    return res[0].reshape(-1)


# ---- references -------------------------------------------------------------------------------

def conv_ref(x, kernel, state, seq):
    """x (T, C), kernel (C, K), state (S, C, K-1), seq (T,) → y (T, C), new state."""
    st = state.astype(np.float64).copy()
    y = np.zeros(x.shape, np.float64)
    for t in range(x.shape[0]):
        s = seq[t]
        win = np.concatenate([st[s], x[t][:, None]], axis=1)           # (C, K)
        y[t] = (win * kernel).sum(axis=1)
        st[s] = win[:, 1:]
    return y, st


def delta_ref(q, k, v, g, beta, state, seq, scale):
    """q, k (T, Hk, Dk); v (T, H, Dv); g, beta (T, H); state (S, H, Dv, Dk) (row j = column j of
    S[i][j]) → o (T, H, Dv), new state."""
    st = state.astype(np.float64).copy()
    T, H, Dv = v.shape
    Hk = q.shape[1]
    o = np.zeros((T, H, Dv))
    for t in range(T):
        for h in range(H):
            M = st[seq[t], h]                       # (Dv, Dk): M[j, i] = S[i][j]
            kk, qq = k[t, h % Hk].astype(np.float64), q[t, h % Hk].astype(np.float64)
            M *= np.exp(g[t, h])
            d = (v[t, h] - M @ kk) * beta[t, h]
            M += d[:, None] * kk[None, :]
            o[t, h] = scale * (M @ qq)
    return o, st


# ---- ops ----------------------------------------------------------------------------------------

def _conv(ctx, x, kernel, state, seq):
    C, K = kernel.shape
    S = state.shape[0]
    out = ops.ssm_conv(ctx, _t(ctx, x), _t(ctx, kernel), _t(ctx, state.reshape(S, -1)),
                       _t(ctx, seq, "i32"))
    return out


@pytest.mark.parametrize("C,K,T,S", [(1, 2, 1, 1), (37, 4, 13, 3), (256, 3, 64, 2)])
def test_ssm_conv(C, K, T, S, cpus, path):
    ctx = Context(mem_size=64 << 20, no_alloc=False)
    x = RNG.standard_normal((T, C)).astype(np.float32)
    kernel = RNG.standard_normal((C, K)).astype(np.float32)
    state = RNG.standard_normal((S, C, K - 1)).astype(np.float32)
    seq = RNG.integers(0, S, T).astype(np.int32)
    got = _run(_conv(ctx, x, kernel, state, seq), cpus)
    y, st = conv_ref(x, kernel, state, seq)
    np.testing.assert_allclose(got[: T * C].reshape(T, C), y, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(got[T * C:].reshape(S, C, K - 1), st, rtol=0, atol=0)


def test_ssm_conv_batch_equals_token_by_token(cpus, path):
    C, K, T = 40, 4, 9
    x = RNG.standard_normal((T, C)).astype(np.float32)
    kernel = RNG.standard_normal((C, K)).astype(np.float32)
    state = RNG.standard_normal((1, C, K - 1)).astype(np.float32)
    seq = np.zeros(T, np.int32)
    ctx = Context(mem_size=16 << 20, no_alloc=False)
    whole = _run(_conv(ctx, x, kernel, state, seq), cpus)
    st = state
    for t in range(T):
        ctx = Context(mem_size=16 << 20, no_alloc=False)
        one = _run(_conv(ctx, x[t:t + 1], kernel, st, seq[:1]), cpus)
        assert one[:C].tobytes() == whole[t * C:(t + 1) * C].tobytes()
        st = one[C:].reshape(1, C, K - 1)
    assert st.tobytes() == whole[T * C:].tobytes()


def _delta(ctx, q, k, v, g, beta, state, seq, scale):
    S = state.shape[0]
    return ops.gated_delta(ctx, _t(ctx, q), _t(ctx, k), _t(ctx, v), _t(ctx, g), _t(ctx, beta),
                           _t(ctx, state.reshape(S, -1)), _t(ctx, seq, "i32"), scale)


def _delta_inputs(T, H, Hk, Dk, Dv, S):
    q = RNG.standard_normal((T, Hk, Dk)).astype(np.float32)
    k = RNG.standard_normal((T, Hk, Dk)).astype(np.float32)
    k /= np.linalg.norm(k, axis=-1, keepdims=True)          # l2-normed, as the models do
    v = RNG.standard_normal((T, H, Dv)).astype(np.float32)
    g = -np.abs(RNG.standard_normal((T, H))).astype(np.float32)
    beta = (1 / (1 + np.exp(-RNG.standard_normal((T, H))))).astype(np.float32)
    state = (RNG.standard_normal((S, H, Dv, Dk)) * 0.1).astype(np.float32)
    seq = RNG.integers(0, S, T).astype(np.int32)
    return q, k, v, g, beta, state, seq


# (.., 128, 40, ..): several blocks of state rows per head, the last one short
@pytest.mark.parametrize("T,H,Hk,Dk,Dv,S", [(1, 1, 1, 4, 4, 1), (11, 4, 2, 16, 8, 3),
                                           (33, 3, 3, 32, 32, 1), (9, 2, 1, 128, 40, 2)])
def test_gated_delta(T, H, Hk, Dk, Dv, S, cpus, path):
    ctx = Context(mem_size=64 << 20, no_alloc=False)
    q, k, v, g, beta, state, seq = _delta_inputs(T, H, Hk, Dk, Dv, S)
    scale = 1 / np.sqrt(Dk)
    got = _run(_delta(ctx, q, k, v, g, beta, state, seq, scale), cpus)
    o, st = delta_ref(q, k, v, g, beta, state, seq, scale)
    n = T * H * Dv
    np.testing.assert_allclose(got[:n].reshape(T, H, Dv), o, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(got[n:].reshape(S, H, Dv, Dk), st, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("Dk,Dv", [(16, 16), (37, 35)])
def test_gated_delta_batch_equals_token_by_token(Dk, Dv, cpus, path):
    T, H, Hk = 7, 2, 1
    q, k, v, g, beta, state, _ = _delta_inputs(T, H, Hk, Dk, Dv, 1)
    seq = np.zeros(T, np.int32)
    ctx = Context(mem_size=16 << 20, no_alloc=False)
    whole = _run(_delta(ctx, q, k, v, g, beta, state, seq, 0.25), cpus)
    st, n1 = state, H * Dv
    for t in range(T):
        ctx = Context(mem_size=16 << 20, no_alloc=False)
        sl = slice(t, t + 1)
        one = _run(_delta(ctx, q[sl], k[sl], v[sl], g[sl], beta[sl], st, seq[:1], 0.25), cpus)
        assert one[:n1].tobytes() == whole[t * n1:(t + 1) * n1].tobytes()
        st = one[n1:].reshape(state.shape)
    assert st.tobytes() == whole[T * n1:].tobytes()


# ---- the in-place form (the decode path of a host cache: pyggml/llm/recurrent.py) -----------------

def _run_in_place(build, cells, cpus):
    """Per CPU backend, from the same cells: (outputs, the cells after) of the in-place op that
    build(ctx, state tensor) makes; 1 and 2 threads must agree."""
    res = []
    for cpu in cpus:
        ctx = Context(mem_size=64 << 20, no_alloc=False)
        st = _t(ctx, cells.reshape(cells.shape[0], -1))
        out = build(ctx, st)
        g = Graph()
        g.build_forward_expand(out)
        cpu.graph_compute(g)
        res.append((host_array(out).reshape(-1).copy(), host_array(st).reshape(cells.shape).copy()))
    assert all(r[0].tobytes() == res[0][0].tobytes() and r[1].tobytes() == res[0][1].tobytes()
               for r in res), "1 and 2 threads differ"
    return res[0]


# cells named out of order, some never (R = 5 cells, the tokens continue cells 3 and 1 only);
# T = 1 and T <= K (the conv's direct path), T > K (its transposed path)
@pytest.mark.parametrize("T", [1, 3, 11])
def test_ssm_conv_in_place_equals_the_copying_form(T, cpus, path):
    C, K, R = 37, 4, 5
    x = RNG.standard_normal((T, C)).astype(np.float32)
    kernel = RNG.standard_normal((C, K)).astype(np.float32)
    cells = RNG.standard_normal((R, C, K - 1)).astype(np.float32)
    rows = np.array([3, 1], np.int32)
    idx = RNG.integers(0, 2, T).astype(np.int32)
    y, after = _run_in_place(lambda ctx, st: ops.ssm_conv(
        ctx, _t(ctx, x), _t(ctx, kernel), st, _t(ctx, rows[idx], "i32"), in_place=True),
        cells, cpus)
    # the copying form on the gathered rows, stored back as the graph's set_rows would
    ctx = Context(mem_size=64 << 20, no_alloc=False)
    ref = _run(_conv(ctx, x, kernel, cells[rows], idx), cpus)
    assert y.tobytes() == ref[:T * C].tobytes()
    want = cells.copy()
    want[rows] = ref[T * C:].reshape(2, C, K - 1)
    assert after.tobytes() == want.tobytes()        # cells 0, 2, 4 untouched


@pytest.mark.parametrize("T", [1, 9])
def test_gated_delta_in_place_equals_the_copying_form(T, cpus, path):
    H, Hk, Dk, Dv, R = 4, 2, 32, 40, 5
    q, k, v, g, beta, cells, _ = _delta_inputs(T, H, Hk, Dk, Dv, R)
    rows = np.array([4, 0], np.int32)
    idx = RNG.integers(0, 2, T).astype(np.int32)
    o, after = _run_in_place(lambda ctx, st: ops.gated_delta(
        ctx, _t(ctx, q), _t(ctx, k), _t(ctx, v), _t(ctx, g), _t(ctx, beta), st,
        _t(ctx, rows[idx], "i32"), 0.25, in_place=True), cells, cpus)
    ctx = Context(mem_size=64 << 20, no_alloc=False)
    ref = _run(_delta(ctx, q, k, v, g, beta, cells[rows], idx, 0.25), cpus)
    n = T * H * Dv
    assert o.tobytes() == ref[:n].tobytes()
    want = cells.copy()
    want[rows] = ref[n:].reshape(2, H, Dv, Dk)
    assert after.tobytes() == want.tobytes()


def test_bad_sequence_index_is_an_error(cpus):
    from pyggml.errors import PyggmlError
    ctx = Context(mem_size=16 << 20, no_alloc=False)
    x = np.ones((3, 4), np.float32)
    out = _conv(ctx, x, np.ones((4, 3), np.float32), np.zeros((1, 4, 2), np.float32),
                np.array([0, 1, 0], np.int32))
    g = Graph()
    g.build_forward_expand(out)
    with pytest.raises(PyggmlError):
        cpus[1].graph_compute(g)


def test_shape_errors_name_the_op():
    ctx = Context(mem_size=1 << 20, no_alloc=True)
    x = ctx.new_tensor("f32", [8, 3])
    with pytest.raises(ShapeError, match="ssm_conv"):
        ops.ssm_conv(ctx, x, ctx.new_tensor("f32", [4, 7]), ctx.new_tensor("f32", [24, 1]),
                     ctx.new_tensor("i32", [3]))
    with pytest.raises(ShapeError, match="gated_delta"):
        ops.gated_delta(ctx, ctx.new_tensor("f32", [8, 3, 2]), ctx.new_tensor("f32", [8, 3, 2]),
                        ctx.new_tensor("f32", [8, 4, 2]), ctx.new_tensor("f32", [4, 2]),
                        ctx.new_tensor("f32", [4, 2]), ctx.new_tensor("f32", [256, 1]),
                        ctx.new_tensor("i32", [2]), 1.0)


# ---- softplus (Qwen 3.5's decay rate) ---------------------------------------------------------

@pytest.mark.parametrize("shape", [(4, 7), (3, 5, 33)])
def test_softplus(shape, cpus):
    x = (RNG.standard_normal(shape) * 12).astype(np.float32)
    x.flat[:4] = [25.0, 20.0, -30.0, 0.0]
    ctx = Context(mem_size=1 << 20, no_alloc=False)
    out = _run(ops.softplus(ctx, _t(ctx, x)), cpus)
    ref = np.where(x > 20, x, np.log1p(np.exp(x.astype(np.float64)))).astype(np.float32)
    np.testing.assert_allclose(out, ref.reshape(-1), rtol=2e-6, atol=2e-7)
    assert out[0] == 25.0


def test_softplus_on_a_view_with_strided_rows(cpus):
    x = RNG.standard_normal((6, 10)).astype(np.float32)
    ctx = Context(mem_size=1 << 20, no_alloc=False)
    a = _t(ctx, x)
    v = ops.view_2d(ctx, a, 4, 6, a.nb[1], 8)          # columns 2..5 of each row
    out = _run(ops.softplus(ctx, v), cpus)
    np.testing.assert_allclose(out, np.log1p(np.exp(x[:, 2:6].astype(np.float64)))
                               .astype(np.float32).reshape(-1), rtol=2e-6, atol=2e-7)


def test_in_place_forms_stay_on_the_cpu():
    """The in-place forms write the host cache where it lies: no other backend takes them
    (their results are y alone, so a device that ran them would also lose the new states)."""
    from types import SimpleNamespace
    from pyggml.backend.rpc.backend import why_unsupported as rpc_why
    from pyggml.backend.vulkan.ops import IN_PLACE_STATE, why_unsupported as vk_why
    ctx = Context(mem_size=16 << 20, no_alloc=False)
    C, K, T, H, Dk, Dv = 8, 4, 2, 2, 8, 8
    seq = _t(ctx, np.zeros(T, np.int32), "i32")
    conv = ops.ssm_conv(ctx, _t(ctx, np.ones((T, C), np.float32)),
                        _t(ctx, np.ones((C, K), np.float32)),
                        _t(ctx, np.zeros((3, (K - 1) * C), np.float32)), seq, in_place=True)
    qk = _t(ctx, np.ones((T, H, Dk), np.float32))
    gb = _t(ctx, np.ones((T, H), np.float32))
    delta = ops.gated_delta(ctx, qk, qk, _t(ctx, np.ones((T, H, Dv), np.float32)), gb, gb,
                            _t(ctx, np.zeros((3, Dk * Dv * H), np.float32)), seq, 0.5,
                            in_place=True)
    lim = SimpleNamespace(max_bind=1 << 30, max_wg_count=(65535, 65535, 65535))
    for node in (conv, delta):
        assert vk_why(node, lim) == IN_PLACE_STATE
        assert rpc_why(node)
