"""Attention sinks (gpt-oss): one extra logit per head that joins each softmax row and takes its
share of the weight, with a zero value row — in SOFT_MAX (src[2]) and FLASH_ATTN_EXT (src[4]),
against numpy on every CPU path; sinks far above and far below the scores (both branches of
ggml's rescale), a fully masked row; the Vulkan rules leave both to the CPU."""
import numpy as np
import pytest

from pyggml import _native, ops
from pyggml.errors import ShapeError
from test_ops_cpu import close, cpu1, cpu2, new_ctx, run, tensor  # noqa: F401

RNG = np.random.default_rng(32)


@pytest.fixture(params=_native.available_paths())
def path(request):
    prev = _native.cpu_path()
    _native.set_cpu_path(request.param)
    yield request.param
    _native.set_cpu_path(prev)


def _mask(nq, nkv):
    m = np.zeros((8, nkv), np.float32)
    for i in range(nq):
        m[i, nkv - nq + i + 1:] = -np.inf
    m[1, :4] = -np.inf
    m[2, :] = -np.inf                     # a row that sees nothing but the sink
    return m


def _ref(q, k, v, m, sinks, scale):
    H, nq, D = q.shape
    ref = np.zeros((nq, H, v.shape[-1]))
    for h in range(H):
        s = q[h] @ k[h // 2].T * scale + m[:nq]
        mx = np.maximum(s.max(-1, keepdims=True), sinks[h])
        p = np.exp(s - mx)
        p /= p.sum(-1, keepdims=True) + np.exp(sinks[h] - mx)
        ref[:, h] = p @ v[h // 2]
    return ref


SINKS = {"mixed": np.array([0.5, -1.0, 3.0, 0.0]), "high": np.array([40.0, 35.0, 50.0, 45.0]),
         "low": np.array([-40.0, -35.0, -50.0, -45.0])}


@pytest.mark.parametrize("which", sorted(SINKS))
def test_flash_attn_sinks(path, which, cpu1, cpu2):  # noqa: F811
    ctx = new_ctx()
    D, nq, H, Hkv, nkv = 32, 5, 4, 2, 41
    q, k, v = (RNG.standard_normal(s).astype(np.float32)
               for s in ((H, nq, D), (Hkv, nkv, D), (Hkv, nkv, D)))
    m, sinks = _mask(nq, nkv), SINKS[which].astype(np.float32)
    out = ops.flash_attn_ext(ctx, tensor(ctx, q), tensor(ctx, k), tensor(ctx, v),
                             tensor(ctx, m, "f16"), scale=0.125, sinks=tensor(ctx, sinks))
    got = run(out, cpu1, cpu2)
    close(got, _ref(q.astype(np.float64), k.astype(np.float64), v.astype(np.float64), m,
                    sinks.astype(np.float64), 0.125), 2e-5)


@pytest.mark.parametrize("which", sorted(SINKS))
def test_soft_max_sinks(path, which, cpu1, cpu2):  # noqa: F811
    ctx = new_ctx()
    nkv, nq, H = 41, 5, 4
    a = RNG.standard_normal((H, nq, nkv)).astype(np.float32)
    m, sinks = _mask(nq, nkv), SINKS[which].astype(np.float32)
    out = ops.soft_max_ext(ctx, tensor(ctx, a), tensor(ctx, m, "f16"), scale=0.5,
                           sinks=tensor(ctx, sinks))
    got = run(out, cpu1, cpu2)
    s = a.astype(np.float64) * 0.5 + m[:nq][None]
    mx = np.maximum(s.max(-1, keepdims=True), sinks[:, None, None])
    p = np.exp(s - mx)
    ref = p / (p.sum(-1, keepdims=True) + np.exp(sinks[:, None, None] - mx))
    close(got, ref, 5e-6)


def test_sinks_shape_checked():
    ctx = new_ctx()
    a = tensor(ctx, np.zeros((4, 2, 8), np.float32))
    with pytest.raises(ShapeError, match="sinks must be a contiguous F32"):
        ops.soft_max_ext(ctx, a, sinks=tensor(ctx, np.zeros(3, np.float32)))


def test_vulkan_rules_take_sinks():
    """Vulkan runs sinks itself now (soft_max.comp, flash_attn.comp; their parity cases are in
    tests/support/op_cases.py): its rules no longer send these nodes to the CPU."""
    from pyggml.backend.vulkan.ops import _rule_flash_attn, _rule_soft_max
    ctx = new_ctx()
    a = tensor(ctx, np.zeros((4, 2, 8), np.float32))
    s = tensor(ctx, np.zeros(4, np.float32))
    t = ops.soft_max_ext(ctx, a, sinks=s)
    assert _rule_soft_max(t, *t.src) is None
    q = tensor(ctx, np.zeros((4, 2, 32), np.float32))
    k = tensor(ctx, np.zeros((2, 8, 32), np.float32), "f16")
    t = ops.flash_attn_ext(ctx, q, k, k, None, sinks=s)
    assert _rule_flash_attn(t, *(t.src + [None])[:5]) is None
