"""The Vulkan backend beyond single ops: recording once and replaying, barriers, the scheduler
splitting a graph between Vulkan and the CPU, weights larger than one binding, transfers with
and without mapped memory, events, discovery, and bad input (unsupported ops and types, bad row
indices, allocations larger than the heap). Runs on lavapipe in CI; skips only without a Vulkan
device (test_backend_parity decides)."""
from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest

from test_backend_parity import (  # noqa: F401 - also skips this module without a device
    REPO,
    check_case,
    nmse,
    vk_backend,
)
from pyggml import Context, Graph, ops, quants
from pyggml.backend import base, vulkan
from pyggml.backend.cpu import CpuBackend, cpu_buffer_type
from pyggml.backend.vulkan.info import DEVICE_TYPES, VulkanMemoryError
from pyggml.errors import BackendError, SettingsError

RNG = np.random.default_rng(7)


@pytest.fixture(scope="module")
def cpu():
    return CpuBackend(n_threads=2)


@pytest.fixture(scope="module")
def vk():
    return vk_backend("native")


def f32(a) -> bytes:
    return np.asarray(a, np.float32).tobytes()


def read(t) -> np.ndarray:
    return np.frombuffer(base.tensor_get(t), np.float32).reshape(t.shape).astype(np.float64)


def on_vk(vk, ctx, *extra):
    return base.alloc_tensors(vk.get_default_buffer_type(), list(ctx.tensors) + list(extra),
                              base.BufferUsage.COMPUTE)


# ---- replay --------------------------------------------------------------------------------------

def _small_net(ctx, K=64, M=3, N=32):
    x = ctx.new_tensor("f32", [K, M], name="x")
    w = ctx.new_tensor("f16", [K, N], name="w")
    h = ops.mul_mat(ctx, w, x, name="h")
    h = ops.rms_norm(ctx, h, 1e-6, name="hn")
    h = ops.silu(ctx, h, name="hs")
    out = ops.scale(ctx, h, 0.5, name="out")
    return x, w, out


def _net_reference(xv, wv):
    h = xv.astype(np.float64) @ wv.astype(np.float64).T
    h = h / np.sqrt((h * h).mean(-1, keepdims=True) + 1e-6)
    return 0.5 * h / (1 + np.exp(-h))


def test_recorded_once_replayed_for_n_computes(vk):
    ctx = Context(no_alloc=True)
    x, w, out = _small_net(ctx)
    g = Graph()
    g.build_forward_expand(out)
    buf = on_vk(vk, ctx)
    wv = (RNG.standard_normal((32, 64)) * 0.3).astype(np.float16)
    base.tensor_set(w, wv.tobytes())
    rec0, comp0 = vk.n_recordings, vk.n_computes
    for i in range(6):                                # new input data every time
        xv = RNG.standard_normal((3, 64)).astype(np.float32)
        base.tensor_set(x, xv)
        vk.graph_compute(g)
        assert nmse(read(out), _net_reference(xv, wv)) < 1e-6
    assert vk.n_recordings - rec0 == 1
    assert vk.n_computes - comp0 == 6
    g.next_uid()                                      # new uid: prepare again
    vk.graph_compute(g)
    assert vk.n_recordings - rec0 == 2
    # same uid, an address changed: recorded again, reading the new memory
    other = ctx.new_tensor("f32", [64, 3], name="x2")
    buf2 = base.alloc_tensors(vk.get_default_buffer_type(), [other])
    xv = RNG.standard_normal((3, 64)).astype(np.float32)
    base.tensor_set(other, xv)
    x.data, x.buffer = other.data, other.buffer
    vk.graph_compute(g)
    assert vk.n_recordings - rec0 == 3
    assert nmse(read(out), _net_reference(xv, wv)) < 1e-6
    del buf, buf2


def test_replay_is_o1_and_reallocation_rerecords(vk, monkeypatch):
    """An unchanged graph replays without looking at its nodes (no address signature is taken
    while no tensor moved); re-allocating it at other addresses records it again, reading the new
    memory; tensors moving elsewhere cost one address comparison, not a recording."""
    from pyggml.alloc import GraphAllocator
    from pyggml.backend.vulkan import record

    ctx = Context(no_alloc=True)
    x, w, out = _small_net(ctx)
    x.set_input()
    out.set_output()
    g = Graph()
    g.build_forward_expand(out)
    buft = vk.get_default_buffer_type()
    wbuf = base.alloc_tensors(buft, [w])
    wv = (RNG.standard_normal((32, 64)) * 0.3).astype(np.float16)
    base.tensor_set(w, wv.tobytes())
    galloc = GraphAllocator(buft)
    galloc.reserve(g)
    galloc.alloc_graph(g)
    rec0 = vk.n_recordings
    xv = RNG.standard_normal((3, 64)).astype(np.float32)
    base.tensor_set(x, xv)
    vk.graph_compute(g)
    assert vk.n_recordings - rec0 == 1
    calls = []
    real_signature = record.signature
    monkeypatch.setattr(record, "signature", lambda gr: calls.append(gr) or real_signature(gr))
    for _ in range(3):                                 # replays: no per-node Python work
        vk.graph_compute(g)
    assert vk.n_recordings - rec0 == 1 and calls == []
    galloc.alloc_graph(g)                              # same plan, same memory: nothing moved
    vk.graph_compute(g)
    assert vk.n_recordings - rec0 == 1 and calls == []
    assert nmse(read(out), _net_reference(xv, wv)) < 1e-6
    # the same graph (same uid) placed in other memory: recorded again, reads the new buffers
    old, uid = (x.data, out.data), g.uid
    other = buft.alloc_buffer(galloc.get_buffer_size(0), base.BufferUsage.COMPUTE)
    galloc.alloc_graph(g, buffers=[other])
    assert (x.data, out.data) != old and g.uid == uid
    xv = RNG.standard_normal((3, 64)).astype(np.float32)
    base.tensor_set(x, xv)
    vk.graph_compute(g)
    assert vk.n_recordings - rec0 == 2
    assert nmse(read(out), _net_reference(xv, wv)) < 1e-6
    # a tensor of another graph moves: one address comparison, then replays are O(1) again
    elsewhere = Context(no_alloc=True).new_tensor("f32", [8], name="elsewhere")
    ebuf = base.alloc_tensors(buft, [elsewhere])
    calls.clear()
    vk.graph_compute(g)
    vk.graph_compute(g)
    assert vk.n_recordings - rec0 == 2 and len(calls) == 1
    vk.synchronize()
    del wbuf, other, ebuf


def test_barriers_only_where_needed(vk):
    ctx = Context(no_alloc=True)
    xs = [ctx.new_tensor("f32", [37, 3], name=f"x{i}") for i in range(3)]
    a = [ops.scale(ctx, x, float(i + 2), name=f"a{i}") for i, x in enumerate(xs)]   # independent
    s = ops.add(ctx, a[0], a[1], name="s")            # reads a0, a1: one barrier
    t = ops.add(ctx, s, a[2], name="t")               # reads s: a second one
    g = Graph()
    g.build_forward_expand(t)
    buf = on_vk(vk, ctx)
    vals = [RNG.standard_normal((3, 37)).astype(np.float32) for _ in xs]
    for x, v in zip(xs, vals):
        base.tensor_set(x, v)
    vk.graph_compute(g)
    assert np.allclose(read(t), 2 * vals[0] + 3 * vals[1] + 4 * vals[2], atol=1e-5)
    assert vk.record_stats(g) == (5, 2)
    # write-after-read: the in-place scale overwrites x after y read it; a barrier orders them
    ctx2 = Context(no_alloc=True)
    x = ctx2.new_tensor("f32", [300], name="x")
    y = ops.scale(ctx2, x, 2.0, name="y")
    z = ops.scale(ctx2, x, -1.0, inplace=True, name="z")
    g2 = Graph()
    g2.build_forward_expand(y)
    g2.build_forward_expand(z)
    buf2 = on_vk(vk, ctx2)
    xv = RNG.standard_normal(300).astype(np.float32)
    base.tensor_set(x, xv)
    vk.graph_compute(g2)
    assert vk.record_stats(g2) == (2, 1)
    assert np.array_equal(read(y), 2.0 * xv.astype(np.float64))
    assert np.array_equal(read(x), -xv.astype(np.float64))
    del buf, buf2


def test_profile_timestamps_per_dispatch(vk):
    ctx = Context(no_alloc=True)
    x, w, out = _small_net(ctx)
    g = Graph()
    g.build_forward_expand(out)
    buf = on_vk(vk, ctx)
    vk.profile = True
    try:
        vk.graph_compute(g)
        vk.synchronize()
    finally:
        vk.profile = False
    prof = vk.profile_results(g)
    assert [(n, op) for n, op, _s, _t in prof] == [("h", "MUL_MAT"), ("hn", "RMS_NORM"),
                                                   ("hs", "SILU"), ("out", "SCALE")]
    assert all(t >= 0 for *_x, t in prof) and prof[0][2].startswith("mul_mat_vec_f16")
    del buf


def test_async_compute_and_events(vk):
    ctx = Context(no_alloc=True)
    x, w, out = _small_net(ctx)
    g = Graph()
    g.build_forward_expand(out)
    buf = on_vk(vk, ctx)
    wv = (RNG.standard_normal((32, 64)) * 0.3).astype(np.float16)
    xv = RNG.standard_normal((3, 64)).astype(np.float32)
    base.tensor_set(w, wv.tobytes())
    base.tensor_set(x, xv)
    ev = vk.event_new()
    vk.graph_compute(g)                               # queued
    ev.record()
    assert ev.serial == vk.ctx.serial and vk.ctx.inflight
    vk.event_wait(ev)                                 # same queue: nothing to wait for
    ev.synchronize()
    assert not vk.ctx.inflight
    assert nmse(read(out), _net_reference(xv, wv)) < 1e-6
    del buf


# ---- the scheduler: one graph over Vulkan and the CPU --------------------------------------------

def _block(ctx, where_vk, where_cpu, K=256, M=5):
    """Attention-free transformer-ish block; Q3_K has no Vulkan kernel, so its product runs on
    the CPU between Vulkan work."""
    specs = {"emb": ("q8_0", [K, 20]), "norm": ("f32", [K]), "wq": ("q4_k", [K, K]),
             "w3": ("q3_k", [K, K]), "wo": ("f16", [K, K])}
    w = {k: ctx.new_tensor(wt, ne, name=k) for k, (wt, ne) in specs.items()}
    w["_bufs"] = [base.alloc_tensors(bt, [w[k] for k in specs if (k == "w3") == on_cpu],
                                     base.BufferUsage.WEIGHTS)
                  for bt, on_cpu in ((where_vk, False), (where_cpu, True))]
    rng = np.random.default_rng(5)
    for k, (wt, ne) in specs.items():
        v = (rng.standard_normal((ne[1] if len(ne) > 1 else 1, ne[0])) * 0.5).astype(np.float32)
        base.tensor_set(w[k], v if wt == "f32" else v.astype(np.float16) if wt == "f16"
                        else quants.quantize(v, wt).tobytes())
    ids = ctx.new_tensor("i32", [M], name="ids").set_input()
    pos = ctx.new_tensor("i32", [M], name="pos").set_input()
    x = ops.get_rows(ctx, w["emb"], ids, name="x")
    h = ops.mul(ctx, ops.rms_norm(ctx, x, 1e-6, name="n0"), w["norm"], name="n1")
    q = ops.mul_mat(ctx, w["wq"], h, name="q")
    r = ops.rope(ctx, ops.reshape_3d(ctx, q, 64, 4, M, name="q3"), pos, 64, name="r")
    r = ops.reshape_2d(ctx, r, K, M, name="r2")
    c = ops.mul_mat(ctx, w["w3"], r, name="c")        # CPU
    c = ops.gelu(ctx, c, name="g")
    o = ops.mul_mat(ctx, w["wo"], ops.add(ctx, c, h, name="res"), name="o")
    out = ops.soft_max_ext(ctx, o, None, scale=0.005, name="out").set_output()
    g = Graph()
    g.build_forward_expand(out)
    return ids, pos, g, out, w


def test_scheduler_split_between_vulkan_and_cpu_equals_cpu_alone(vk, cpu):
    Scheduler = pytest.importorskip("pyggml.sched", reason="the scheduler has not landed").Scheduler
    ids_v, pos_v = np.array([3, 0, 19, 7, 3], np.int32), np.array([0, 1, 2, 50, 900], np.int32)
    ctx = Context(no_alloc=True)
    ids, pos, g, out, _w = _block(ctx, cpu_buffer_type(), cpu_buffer_type())
    s_cpu = Scheduler([cpu])
    s_cpu.alloc_graph(g)
    base.tensor_set(ids, ids_v)
    base.tensor_set(pos, pos_v)
    s_cpu.graph_compute(g)
    ref = read(out)

    ctx = Context(no_alloc=True)
    ids, pos, g, out, _w = _block(ctx, vk.get_default_buffer_type(), cpu_buffer_type())
    s = Scheduler([vk, cpu])
    s.alloc_graph(g)
    on = {name: b for name, _op, b, _cause in s.assignments()}
    assert on["q"] == vk.name and on["o"] == vk.name and on["c"] == "CPU"
    assert s.get_n_splits() >= 3
    rec0 = vk.n_recordings
    for _ in range(3):                                # reuse path: Vulkan replays
        base.tensor_set(ids, ids_v)
        base.tensor_set(pos, pos_v)
        s.graph_compute(g)
        s.synchronize()
        err = nmse(read(out), ref)     # Q4_K/F16 products: activations fp32 here, Q8_K/F16 on CPU
        assert err < 1e-3, f"NMSE {err:.3g}"
    vk_splits = sum(1 for sp in s.splits if s.get_backend(sp.backend_id) is vk)
    assert vk.n_recordings - rec0 == vk_splits


# ---- quantized types beyond the registry's random weights ----------------------------------------

def test_mxfp4_every_exponent_dequantizes_bit_for_bit(vk):
    """All 256 E8M0 exponents (e < 2: subnormal scales; 255: infinities) and every code, read by
    GET_ROWS on the device, equal the CPU's dequantized bits."""
    rng = np.random.default_rng(3)
    blocks = np.zeros((256, 17), np.uint8)
    blocks[:, 0] = np.arange(256)
    blocks[:, 1:] = rng.integers(0, 256, (256, 16))
    ctx = Context(no_alloc=True)
    w = ctx.new_tensor("mxfp4", [32 * 8, 32], name="w")
    idx = ctx.new_tensor("i32", [32], name="idx")
    out = ops.get_rows(ctx, w, idx)
    g = Graph()
    g.build_forward_expand(out)
    buf = on_vk(vk, ctx)                                             # noqa: F841 - keeps it
    base.tensor_set(w, blocks.tobytes())
    base.tensor_set(idx, np.arange(32, dtype=np.int32).tobytes())
    vk.graph_compute(g)
    got = np.frombuffer(base.tensor_get(out), np.uint32)
    ref = quants.dequantize(blocks.reshape(-1), "mxfp4").view(np.uint32)
    assert np.array_equal(got, ref)


# ---- recurrent ops: a prompt in one dispatch gives the bits of token-by-token decode ------------

def _recurrent_on_vk(vk, build, values):
    """Compute build(ctx) -> (node, inputs) on `vk` with the inputs' values; the node's floats."""
    ctx = Context(no_alloc=True)
    node, inputs = build(ctx)
    g = Graph()
    g.build_forward_expand(node)
    buf = on_vk(vk, ctx)                                             # noqa: F841 - keeps it
    for t, v in zip(inputs, values):
        base.tensor_set(t, np.ascontiguousarray(v).tobytes())
    vk.graph_compute(g)
    return np.frombuffer(base.tensor_get(node), np.float32).copy()


@pytest.mark.parametrize("op", ["ssm_conv", "gated_delta"])
def test_recurrent_prompt_equals_token_by_token(vk, op):
    rng = np.random.default_rng(5)
    T, C, K, H, Hk, Dk, Dv = 6, 24, 4, 4, 2, 40, 24
    if op == "ssm_conv":
        ins = [rng.standard_normal((T, C)), rng.standard_normal((C, K)),
               rng.standard_normal((1, (K - 1) * C))]
        n_out = C

        def build(ctx, n):
            ts = [ctx.new_tensor("f32", [C, n]), ctx.new_tensor("f32", [K, C]),
                  ctx.new_tensor("f32", [(K - 1) * C, 1]), ctx.new_tensor("i32", [n])]
            return ops.ssm_conv(ctx, *ts), ts
    else:
        kv = rng.standard_normal((T, Hk, Dk))
        ins = [rng.standard_normal((T, Hk, Dk)), kv / np.linalg.norm(kv, axis=-1, keepdims=True),
               rng.standard_normal((T, H, Dv)), -np.abs(rng.standard_normal((T, H))),
               1 / (1 + np.exp(-rng.standard_normal((T, H)))),
               rng.standard_normal((1, Dk * Dv * H)) * 0.1]
        n_out = H * Dv

        def build(ctx, n):
            ts = [ctx.new_tensor("f32", [Dk, Hk, n]), ctx.new_tensor("f32", [Dk, Hk, n]),
                  ctx.new_tensor("f32", [Dv, H, n]), ctx.new_tensor("f32", [H, n]),
                  ctx.new_tensor("f32", [H, n]), ctx.new_tensor("f32", [Dk * Dv * H, 1]),
                  ctx.new_tensor("i32", [n])]
            return ops.gated_delta(ctx, *ts, 1 / np.sqrt(Dk)), ts
    ins = [np.asarray(v, np.float32) for v in ins]
    per_token = [i for i in range(len(ins)) if ins[i].shape[0] == T]
    whole = _recurrent_on_vk(vk, lambda ctx: build(ctx, T), ins + [np.zeros(T, np.int32)])
    state = ins[-1]
    for t in range(T):
        one = [v[t:t + 1] if i in per_token else v for i, v in enumerate(ins[:-1])]
        got = _recurrent_on_vk(vk, lambda ctx: build(ctx, 1), one + [state, np.zeros(1, np.int32)])
        assert got[:n_out].tobytes() == whole[t * n_out:(t + 1) * n_out].tobytes()
        state = got[n_out:].reshape(1, -1)
    assert state.tobytes() == whole[T * n_out:].tobytes()
    bad = np.zeros(T, np.int32)
    bad[3] = 1                                                        # one state only
    with pytest.raises(BackendError, match=r"\((SSM_CONV|GATED_DELTA_NET)\).*sequence id"):
        _recurrent_on_vk(vk, lambda ctx: build(ctx, T), ins + [bad])


# ---- weights larger than one storage-buffer binding ----------------------------------------------

@pytest.mark.parametrize("wtype", ["f32", "q8_0", "q6_k", "mxfp4"])
def test_weights_split_across_windows(wtype, cpu):
    small = vulkan.open_device(0, storage_range=64 << 10).init_backend()
    assert small.get_default_buffer_type().max_size < 64 << 10
    K = {"q6_k": 256, "mxfp4": 160}.get(wtype, 64)    # MXFP4: 85-byte rows, pieces at odd bytes
    N = 1200

    def build(M):
        def b(ctx, I):
            w = I.weights(wtype, N, K)
            assert w.nbytes() > 64 << 10                 # several windows
            mm = ops.mul_mat(ctx, w, I.f32(M, K))
            rows = ops.get_rows(ctx, w, I.i32([0, N - 1, 700, 701, 1100]))
            out = ops.concat(ctx, ops.reshape_2d(ctx, mm, N * M, 1),
                             ops.reshape_2d(ctx, rows, K * 5, 1), 0)
            return out, out
        return b
    for M in (1, 10):
        check_case(f"windows-{wtype}-{M}", build(M), 1e-9 if wtype == "f32" else 5e-4, small, cpu)


@pytest.mark.parametrize("wtype", ["f32", "q4_k"])
def test_expert_weights_split_across_windows(wtype, cpu):
    """MUL_MAT_ID on stacked experts larger than one binding: one dispatch per window of
    experts, each computing the entries routed to its experts (bad ids none here)."""
    small = vulkan.open_device(0, storage_range=64 << 10).init_backend()
    K, N, n_expert = (256, 20, 12) if wtype == "f32" else (256, 40, 24)

    def build(n_tok):
        def b(ctx, I):
            w = I.weights(wtype, n_expert, N, K)
            assert w.nbytes() > 64 << 10 and w.nb[2] < 32 << 10    # several expert windows
            ids = I.i32(I.rng.integers(0, n_expert, (n_tok, 4)))
            out = ops.mul_mat_id(ctx, w, I.f32(n_tok, 1, K), ids)
            return out, out
        return b
    for n_tok in (1, 6):
        check_case(f"expert-windows-{wtype}-{n_tok}", build(n_tok),
                   1e-9 if wtype == "f32" else 5e-4, small, cpu)
    ctx = Context(no_alloc=True)
    huge = ctx.new_tensor("f32", [64, 1000, 2], name="huge")        # one expert > a binding
    mm = ops.mul_mat_id(ctx, huge, ctx.new_tensor("f32", [64, 1, 3]),
                        ctx.new_tensor("i32", [1, 3]))
    assert "binding" in small.why_unsupported(mm)


def test_tensor_larger_than_a_binding_is_refused():
    small = vulkan.open_device(0, storage_range=64 << 10).init_backend()
    ctx = Context(no_alloc=True)
    big = ctx.new_tensor("f32", [64, 1000, 2], name="big3d")       # 3-D: cannot split by rows
    mm = ops.mul_mat(ctx, big, ctx.new_tensor("f32", [64, 1, 2]), name="mm")
    assert "binding" in small.why_unsupported(mm)
    act = ops.silu(ctx, ctx.new_tensor("f32", [64, 1000], name="act"), name="act2")
    assert "binding" in small.why_unsupported(act)


# ---- transfers -----------------------------------------------------------------------------------

@pytest.mark.parametrize("config", ["native", "portable"])
def test_transfers(config):
    be = vk_backend(config)
    if config == "portable":
        assert not be.ctx.dev_mappable                              # every transfer is staged
    ctx = Context(no_alloc=True)
    a = ctx.new_tensor("f32", [5 << 18], name="a")                 # 5 MiB: several staging rounds
    b = ctx.new_tensor("f32", [5 << 18], name="b")
    buf = on_vk(be, ctx)
    v = RNG.standard_normal(5 << 18).astype(np.float32)
    base.tensor_set(a, v)
    assert base.tensor_get(a) == v.tobytes()
    base.tensor_set(a, v[:10], offset=12)                           # partial write
    assert np.array_equal(np.frombuffer(base.tensor_get(a, 12, 40), np.float32), v[:10])
    buf.memset_tensor(a, 0, offset=4, n_bytes=8)
    assert np.frombuffer(base.tensor_get(a, 0, 16), np.float32)[1:3].tolist() == [0.0, 0.0]
    base.tensor_copy(a, b)                                          # device to device
    assert base.tensor_get(b) == base.tensor_get(a)
    hctx = Context(mem_size=(5 << 20) + 4096, no_alloc=False)      # keeps the host arena alive
    host = hctx.new_tensor("f32", [5 << 18])
    base.tensor_copy(b, host)
    assert base.tensor_get(host) == base.tensor_get(a)
    buf.clear(0)
    assert not any(base.tensor_get(b, 0, 4096))


# ---- bad input -----------------------------------------------------------------------------------

def test_unsupported_ops_and_types_are_refused(vk, cpu):
    ctx = Context(no_alloc=True)
    x256 = ctx.new_tensor("f32", [256, 2], name="x")
    refused = []
    for wt in ("q2_k", "q3_k", "bf16", "nvfp4"):
        w = ctx.new_tensor(wt, [256, 4], name=f"w_{wt}")
        refused.append(ops.mul_mat(ctx, w, x256, name=f"mm_{wt}"))
        refused.append(ops.get_rows(ctx, w, ctx.new_tensor("i32", [2]), name=f"rows_{wt}"))
    h16 = ctx.new_tensor("f16", [64, 2], name="h16")
    refused += [ops.silu(ctx, h16, name="silu16"), ops.scale(ctx, h16, 2.0, name="scale16"),
                ops.rms_norm(ctx, h16, 1e-6, name="norm16"),
                ops.rope(ctx, ctx.new_tensor("f16", [64, 2, 3]), ctx.new_tensor("i32", [3]), 64,
                         name="rope16"),
                ops.cpy(ctx, x256, ctx.new_tensor("q8_0", [256, 2]), name="cpy_q8"),
                ops.set_rows(ctx, ctx.new_tensor("q8_0", [256, 9]), x256,
                             ctx.new_tensor("i32", [2]), name="setrows_q8"),
                ops.flash_attn_ext(ctx, ctx.new_tensor("f32", [576, 1, 2]),
                                   ctx.new_tensor("f16", [576, 8, 1]),
                                   ctx.new_tensor("f16", [576, 8, 1]), name="fa576")]
    for node in refused:
        assert not vk.supports_op(node), node.name
        assert vk.why_unsupported(node), node.name
    # some of them the CPU computes: the scheduler keeps them there
    assert cpu.supports_op(refused[0]) and cpu.supports_op(refused[2])
    # computing an unsupported node directly names it
    g = Graph()
    g.build_forward_expand(refused[2])                # mm_q3_k
    with pytest.raises(BackendError, match="'mm_q3_k'.*MUL_MAT"):
        vk.graph_compute(g)
    # a node whose memory is not on the device
    host_ctx = Context(mem_size=1 << 16, no_alloc=False)
    y = ops.silu(host_ctx, host_ctx.new_tensor("f32", [8], name="hx"), name="hy")
    g = Graph()
    g.build_forward_expand(y)
    with pytest.raises(BackendError, match="not in a live buffer"):
        vk.graph_compute(g)


def test_bad_row_index_is_reported_after_the_graph(vk):
    ctx = Context(no_alloc=True)
    src = ctx.new_tensor("f32", [8, 4], name="src")
    idx = ctx.new_tensor("i32", [2], name="idx")
    out = ops.get_rows(ctx, src, idx, name="rows")
    g = Graph()
    g.build_forward_expand(out)
    buf = on_vk(vk, ctx)
    base.tensor_set(src, np.arange(32, dtype=np.float32))
    base.tensor_set(idx, np.array([1, 9], np.int32))
    vk.graph_compute(g)
    with pytest.raises(BackendError, match="'rows'.*row index"):
        vk.synchronize()
    base.tensor_set(idx, np.array([1, 3], np.int32))                # the flag was reset
    vk.graph_compute(g)
    vk.synchronize()
    assert read(out).tolist() == [list(range(8, 16)), list(range(24, 32))]
    del buf


@pytest.mark.parametrize("n_tok", [2, 8])          # 4 entries: matrix-vector; 16: tiled
def test_bad_expert_index_is_reported_after_the_graph(vk, n_tok):
    ctx = Context(no_alloc=True)
    w = ctx.new_tensor("f32", [32, 3, 2], name="exps")
    x = ctx.new_tensor("f32", [32, 1, n_tok], name="x")
    ids = ctx.new_tensor("i32", [2, n_tok], name="ids")
    out = ops.mul_mat_id(ctx, w, x, ids, name="moe")
    g = Graph()
    g.build_forward_expand(out)
    buf = on_vk(vk, ctx)
    wv = RNG.standard_normal((2, 3, 32)).astype(np.float32)
    xv = RNG.standard_normal((n_tok, 1, 32)).astype(np.float32)
    base.tensor_set(w, wv)
    base.tensor_set(x, xv)
    iv = np.tile(np.array([[1, 0]], np.int32), (n_tok, 1))
    iv[0, 1], iv[1, 1] = 2, -1
    base.tensor_set(ids, iv)
    vk.graph_compute(g)
    with pytest.raises(BackendError, match="'moe'.*expert id"):
        vk.synchronize()
    got = read(out)
    assert np.all(got[0, 1] == 0) and np.all(got[1, 1] == 0)      # bad entries: zero rows
    np.testing.assert_allclose(got[0, 0], wv[1] @ xv[0, 0], rtol=1e-5)
    for tok in range(2, n_tok):
        np.testing.assert_allclose(got[tok], wv[[1, 0]] @ xv[tok, 0], rtol=1e-5)
    base.tensor_set(ids, np.tile(np.array([[1, 0]], np.int32), (n_tok, 1)))   # flag reset
    vk.graph_compute(g)
    vk.synchronize()
    np.testing.assert_allclose(read(out)[1, 1], wv[0] @ xv[1, 0], rtol=1e-5)
    del buf


def _heap_of_device_memory(vk) -> int:
    info = vk.device.info
    return info.heaps[info.memory_types[vk.ctx.dev_type][1]][0]


def test_allocation_larger_than_the_heap_names_both_sizes(vk):
    heap = _heap_of_device_memory(vk)
    too_big = heap + (1 << 20)
    with pytest.raises(VulkanMemoryError) as e:
        vk.get_default_buffer_type().alloc_buffer(too_big)
    msg = str(e.value)
    assert str(too_big) in msg and str(heap) in msg
    assert isinstance(e.value, MemoryError) and isinstance(e.value, BackendError)


def test_driver_out_of_memory_names_both_sizes(vk, monkeypatch):
    vkm = vk.ctx.vk

    def refuse(*_a, **_k):
        raise vkm.VkErrorOutOfDeviceMemory()
    monkeypatch.setattr(vkm, "vkAllocateMemory", refuse)
    heap = _heap_of_device_memory(vk)
    with pytest.raises(VulkanMemoryError, match=f"cannot allocate a buffer of 12345678 bytes.*"
                                                f"heap \\d+ of {heap} bytes.*OutOfDeviceMemory"):
        vk.get_default_buffer_type().alloc_buffer(12345678)


# ---- discovery -----------------------------------------------------------------------------------

def test_devices_and_registry(monkeypatch, vk):
    dev = vulkan.devices()[0]
    assert dev.vk_type in DEVICE_TYPES.values()
    assert dev.type in (base.DeviceType.GPU, base.DeviceType.IGPU)
    free, total = dev.memory()
    assert 0 <= free <= total and total > 0
    assert dev.default_buffer_type().max_size <= dev.info.max_storage_range
    reg = base.default_registry()
    names = [d.name for d in reg.devices()]
    assert names[0] == "Vulkan0" and names[-1] == "CPU"
    backends = reg.init_backends(["Vulkan0", "CPU"])
    assert isinstance(backends[0], vulkan.VulkanBackend) and backends[-1].name == "CPU"
    # PYGGML_VULKAN_DEVICES is read when discovery runs
    monkeypatch.setenv("PYGGML_VULKAN_DEVICES", "none")
    assert vulkan.backend._discover()[0] == [] and "PYGGML_VULKAN_DEVICES" in vulkan.backend._discover()[1]
    monkeypatch.setenv("PYGGML_VULKAN_DEVICES", "0")
    assert len(vulkan.backend._discover()[0]) == 1
    monkeypatch.setenv("PYGGML_VULKAN_DEVICES", "99")
    with pytest.raises(SettingsError, match=r"PYGGML_VULKAN_DEVICES=99: no device 99 \(this "
                                            r"machine has \d+ Vulkan device"):
        vulkan.backend._discover()
    monkeypatch.setenv("PYGGML_VULKAN_DEVICES", "gpu0")
    with pytest.raises(SettingsError, match="PYGGML_VULKAN_DEVICES='gpu0': expected device "
                                            "indices like '0' or '1,0', or 'none'"):
        vulkan.backend._discover()
    monkeypatch.delenv("PYGGML_VULKAN_DEVICES")
    monkeypatch.setenv("PYGGML_SHADER_DIR", "/nonexistent")
    devs, why = vulkan.backend._discover()
    assert devs == [] and "make shaders" in why


def test_no_vulkan_driver_means_cpu_only():
    """With no ICD the registry lists only the CPU, says why once, and the CPU computes."""
    code = ("import logging\n"
            "from pyggml.backend import base, vulkan\n"
            "r = base.Registry()\n"
            "vulkan.backend_reg(); vulkan.backend_reg()\n"
            "print([d.name for d in r.devices()])\n"
            "print(r.load_errors.get('pyggml.backend.vulkan'))\n")
    env = dict(os.environ, VK_ICD_FILENAMES="/nonexistent.json",
               VK_DRIVER_FILES="/nonexistent.json")
    env.pop("PYGGML_VULKAN_DEVICES", None)
    p = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True,
                       text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    lines = p.stdout.strip().splitlines()
    assert lines[0] == "['CPU']" and lines[1] == "no device found"
    assert p.stderr.count("Vulkan backend disabled") == 1, p.stderr
