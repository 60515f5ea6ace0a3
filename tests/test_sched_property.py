"""Property test: random graphs with weights spread over TEST and the CPU at random, some ops
switched off on TEST, some nodes pinned by the user, one or two copies. For every graph: each node
runs on a backend that supports it; each split reads only memory its backend can reach; each split
input is copied exactly once per split (and once per backend per graph); the result equals the
CPU-only result bit for bit."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from pyggml import Context, Graph, ops
from pyggml.backend.base import tensor_get, tensor_set
from pyggml.backend.cpu import CpuBackend, cpu_buffer_type
from pyggml.sched import Scheduler
from pyggml.types import VIEW_OPS, Op
from support.devices import TestDevice
from support.graphs import make_weights

K, M = 32, 2
KINDS = ("mul_mat", "mul_mat", "mul_mat", "add", "add", "mul_w", "mul_w", "add_w", "silu", "gelu",
         "scale", "rms_norm", "reshape_silu", "transpose_twice", "cpy_view")   # weighted
WTYPES = ("f32", "f16", "q8_0")
SWITCHABLE = (Op.SILU, Op.ADD, Op.MUL, Op.RMS_NORM, Op.SCALE, Op.CONT, Op.MUL_MAT, Op.GELU)


@st.composite
def graph_specs(draw):
    n = draw(st.integers(3, 14))
    steps = []
    for i in range(n):
        kind = draw(st.sampled_from(KINDS))
        # sources: 0, 1 are the inputs x, y; k >= 2 is step k - 2 (mostly the latest steps)
        a = draw(st.one_of(st.just(i + 1), st.integers(0, i + 1)))
        b = draw(st.integers(0, i + 1))
        on_test = draw(st.booleans())
        wtype = draw(st.sampled_from(WTYPES))
        pin = draw(st.integers(0, 4)) == 0           # the user pins this step to the CPU
        steps.append((kind, a, b, on_test, wtype, pin))
    extra_out = draw(st.integers(0, n + 1))
    off = draw(st.sets(st.sampled_from(SWITCHABLE), max_size=3))
    n_copies = draw(st.sampled_from((1, 2)))
    return steps, extra_out, frozenset(off), n_copies


def build(spec, dev_buft, all_cpu: bool):
    """The graph of `spec`, weights on TEST where the spec says (unless all_cpu)."""
    steps, extra_out, _, _ = spec
    ctx = Context(no_alloc=True)
    specs, where = {}, {}
    for i, (kind, _, _, on_test, wtype, _) in enumerate(steps):
        if kind == "mul_mat":
            specs[f"w{i}"] = (wtype, [K, K])
        elif kind in ("mul_w", "add_w"):
            specs[f"w{i}"] = ("f32", [K])
        elif kind == "cpy_view":
            specs[f"w{i}"] = ("f32", [K, M])           # a cache tensor the step writes into
        else:
            continue
        where[f"w{i}"] = cpu_buffer_type() if all_cpu or not on_test else dev_buft
    w = make_weights(ctx, specs, where)
    x = ctx.new_tensor("f32", [K, M], name="x").set_input()
    y = ctx.new_tensor("f32", [K, M], name="y").set_input()
    acts = [x, y]
    pins = []
    for i, (kind, ia, ib, _, _, pin) in enumerate(steps):
        a, b, nm = acts[ia], acts[ib], f"s{i}"
        if kind == "mul_mat":
            t = ops.mul_mat(ctx, w[f"w{i}"], a, name=nm)
        elif kind == "add":
            t = ops.add(ctx, a, b, name=nm)
        elif kind == "mul_w":
            t = ops.mul(ctx, a, w[f"w{i}"], name=nm)
        elif kind == "add_w":
            t = ops.add(ctx, a, w[f"w{i}"], name=nm)
        elif kind == "silu":
            t = ops.silu(ctx, a, name=nm)
        elif kind == "gelu":
            t = ops.gelu(ctx, a, name=nm)
        elif kind == "scale":
            t = ops.scale(ctx, a, 0.75, name=nm)
        elif kind == "rms_norm":
            t = ops.rms_norm(ctx, a, 1e-5, name=nm)
        elif kind == "reshape_silu":
            r = ops.silu(ctx, ops.reshape_2d(ctx, a, K * M, 1, name=nm + "r"), name=nm + "s")
            t = ops.reshape_2d(ctx, r, K, M, name=nm)
        elif kind == "transpose_twice":
            c = ops.cont(ctx, ops.transpose(ctx, a, name=nm + "t"), name=nm + "c")
            t = ops.cont(ctx, ops.transpose(ctx, c, name=nm + "tt"), name=nm)
        else:                                          # write into a pre-placed tensor, read it
            t = ops.scale(ctx, ops.cpy(ctx, a, w[f"w{i}"], name=nm + "k"), 1.0, name=nm)
        acts.append(t)
        if pin:
            pins.append(t)
    outs = [acts[-1]] + ([acts[extra_out]] if 2 <= extra_out < len(acts) - 1 else [])
    g = Graph()
    for o in outs:
        o.set_output()
        g.build_forward_expand(o)
    return g, x, y, outs, pins, w


@pytest.fixture(scope="module")
def rig():
    dev = TestDevice()
    tb = dev.init_backend()
    cpu = CpuBackend(n_threads=2)
    yield dev, tb, cpu
    tb.close()


RNG = np.random.default_rng(5)
XV = RNG.standard_normal((M, K)).astype(np.float32)
YV = RNG.standard_normal((M, K)).astype(np.float32)


def run(sched, g, x, y, outs, pins=()):
    for p in pins:
        sched.set_tensor_backend(p, sched.backends[-1])
    sched.alloc_graph(g)
    for t, v in ((x, XV), (y, YV)):
        if g.contains(t):                 # an input no step reads is not in the graph
            tensor_set(t, v)
    sched.trace = []
    sched.graph_compute(g)
    return [tensor_get(o) for o in outs]


@settings(max_examples=300, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(spec=graph_specs())
def test_random_graphs_over_two_devices(rig, spec):
    dev, tb, cpu = rig
    _, _, off, n_copies = spec
    tb.unsupported = off
    dev.strict = n_copies == 1

    g_ref, xr, yr, outs_ref, _, _ = build(spec, dev.default_buffer_type(), all_cpu=True)
    want = run(Scheduler([cpu]), g_ref, xr, yr, outs_ref)

    g, x, y, outs, pins, _ = build(spec, dev.default_buffer_type(), all_cpu=False)
    s = Scheduler([tb, cpu], n_copies=n_copies)
    got = run(s, g, x, y, outs, pins)

    for t in g.nodes:                      # a supporting backend for every node; pins kept
        a = s.get_assignment(t)
        assert s.backends[a.backend].supports_op(t), (t.name, a)
        if any(t is p for p in pins):       # a pinned view follows its memory instead
            assert (a.cause, a.backend_name) == ("usr", "CPU") or (
                t.op in VIEW_OPS and a.cause == "4.vsrc")
    inputs_per_backend = {}
    for sp in s.splits:
        assert len({id(i) for i in sp.inputs}) == len(sp.inputs)
        on_test = s.backends[sp.backend_id] is tb
        for i in sp.inputs:
            key = (id(i), sp.backend_id)
            assert key not in inputs_per_backend, f"{i.name} copied twice to one backend"
            inputs_per_backend[key] = sp.index
        for t in sp.graph.nodes:           # every split reads only memory it can reach
            if t.op in VIEW_OPS:
                continue
            for src in [t] + [q for q in t.src if q is not None]:
                assert dev.owns(src) == on_test, (sp.index, t.name, src.name)
    copies = [(e[1], e[2]) for e in s.trace if e[0] == "copy"]
    assert copies == [(sp.index, p[0].name) for sp in s.splits for p in sp.copy_plan]
    assert sorted(copies) == sorted((sp.index, i.name) for sp in s.splits for i in sp.inputs)
    assert got == want
    event(f"splits: {min(s.get_n_splits(), 5)}{'+' if s.get_n_splits() >= 5 else ''}")
    event(f"copies per compute: {min(len(copies), 4)}{'+' if len(copies) >= 4 else ''}")
