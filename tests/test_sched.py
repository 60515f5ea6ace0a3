"""The scheduler on hand-made graphs: the exact backend and cause of every node, splits and their
inputs, the weight-incompatibility cut, pass 3, synchronisation, graph reuse, bad input.

Backends: TEST (tests/support/devices.py: separate memory, asynchronous, strict about touching its
memory while busy) before the CPU. Results are compared bit for bit with a CPU-only run: both run
the same C kernels."""

from __future__ import annotations

import numpy as np
import pytest

from pyggml import Context, Graph, ops
from pyggml.backend.base import tensor_get, tensor_set
from pyggml.backend.cpu import CpuBackend, cpu_buffer_type
from pyggml.errors import SchedulerError, SettingsError, UnsupportedOpError
from pyggml.sched import MAX_BACKENDS, MAX_COPIES, Scheduler
from pyggml.types import Op
from support.devices import HostPeerBackend, TestDevice
from support.graphs import make_weights, read_f32

K, M = 64, 3
RNG = np.random.default_rng(11)


@pytest.fixture(scope="module")
def cpu():
    return CpuBackend(n_threads=2)


@pytest.fixture
def dev():
    d = TestDevice()
    d.strict = True
    return d


def new_test_backend(dev, **kw):
    return dev.init_backend(**kw)


def graph_of(*outs) -> Graph:
    g = Graph()
    for o in outs:
        o.set_output()
        g.build_forward_expand(o)
    return g


def causes(sched, g):
    return {name: (backend, cause) for name, _, backend, cause in sched.assignments()}


# ---- a block over two devices: every node's backend and cause -----------------------------------

BLOCK_SPECS = {"w_o": ("f32", [K, K]), "w_up": ("f16", [K, K]), "w_q": ("q8_0", [K, K]),
               "norm": ("f32", [K])}


def build_block(ctx, w):
    x = ctx.new_tensor("f32", [K, M], name="x").set_input()
    n0 = ops.rms_norm(ctx, x, 1e-5, name="n0")
    n1 = ops.mul(ctx, n0, w["norm"], name="n1")
    n2 = ops.mul_mat(ctx, w["w_q"], n1, name="n2")
    n3 = ops.reshape_3d(ctx, n2, K // 2, 2, M, name="n3")
    n4 = ops.scale(ctx, n3, 0.5, name="n4")
    n5 = ops.reshape_2d(ctx, n4, K, M, name="n5")
    n6 = ops.silu(ctx, n5, name="n6")
    n7 = ops.mul_mat(ctx, w["w_up"], n6, name="n7")
    n8 = ops.add(ctx, n7, n2, name="n8")
    n9 = ops.mul_mat(ctx, w["w_o"], n8, name="n9")
    out = ops.scale(ctx, n9, 2.0, name="out")
    return x, graph_of(out), out


def block_on(dev_buft, ctx=None):
    ctx = ctx or Context(no_alloc=True)
    where = {"w_o": cpu_buffer_type(), "w_up": dev_buft, "w_q": dev_buft, "norm": dev_buft}
    w = make_weights(ctx, BLOCK_SPECS, where)
    return (*build_block(ctx, w), w)


def cpu_reference(cpu, x_values):
    ctx = Context(no_alloc=True)
    w = make_weights(ctx, BLOCK_SPECS, {k: cpu_buffer_type() for k in BLOCK_SPECS})
    x, g, out = build_block(ctx, w)
    s = Scheduler([cpu])
    s.alloc_graph(g)
    tensor_set(x, x_values)
    s.graph_compute(g)
    assert s.get_n_splits() == 1 and not s.splits[0].inputs
    return tensor_get(out)


EXPECTED_BLOCK = {
    "n0": ("TEST", "2.gu"), "n1": ("TEST", "1.wgt1"), "n2": ("TEST", "1.wgt0"),
    "n3": ("TEST", "4.vsrc"), "n4": ("TEST", "2.gd"), "n5": ("TEST", "4.vsrc"),
    "n6": ("CPU", "3.best"), "n7": ("TEST", "1.wgt0"), "n8": ("TEST", "2.gd"),
    "n9": ("CPU", "1.wgt0"), "out": ("CPU", "2.rd"),
}


def test_block_assignments_splits_inputs_and_bits(cpu, dev):
    tb = new_test_backend(dev, unsupported={Op.SILU}, delay_s=0.002)
    x, g, out, w = block_on(dev.default_buffer_type())
    s = Scheduler([tb, cpu])
    s.alloc_graph(g)
    assert [t.name for t in g.nodes] == list(EXPECTED_BLOCK)
    assert causes(s, g) == EXPECTED_BLOCK
    leafs = {t.name: (s.get_assignment(t).backend_name, s.get_assignment(t).cause)
             for t in g.leafs}
    assert leafs == {"w_o": ("CPU", "1.dst"), "w_up": ("TEST", "1.dst"),
                     "w_q": ("TEST", "1.dst"), "x": ("CPU", "1.inp"), "norm": ("TEST", "1.dst")}
    sp = s.splits
    assert s.get_n_splits() == 4
    assert [(s.backends[p.backend_id].name, p.i_start, p.i_end) for p in sp] == [
        ("TEST", 0, 6), ("CPU", 6, 7), ("TEST", 7, 9), ("CPU", 9, 11)]
    assert [[t.name for t in p.inputs] for p in sp] == [["x"], ["n5"], ["n6"], ["n8"]]
    # the split graphs hold the split's nodes and read the copies
    assert [[t.name for t in p.graph.nodes] for p in sp][0] == ["n0", "n1", "n2", "n3", "n4",
                                                                   "n5"]
    assert [t.name for t in sp[1].graph.leafs] == ["CPU#n5#0"]
    n6 = g.nodes[6]
    assert n6.src[0] is sp[1].graph.leafs[0] and s.get_assignment(n6.src[0]).cause == "4.cpy"
    assert dev.owns(sp[0].graph.leafs[0]) and not dev.owns(n6.src[0])

    xv = RNG.standard_normal((M, K)).astype(np.float32)
    tensor_set(x, xv)
    s.trace = []
    n_acc, b_in, b_out = dev.n_accesses, dev.bytes_in, dev.bytes_out
    assert s.graph_compute(g)
    assert tensor_get(out) == cpu_reference(cpu, xv)
    copies = [(e[1], e[2]) for e in s.trace if e[0] == "copy"]
    assert copies == [(0, "x"), (1, "n5"), (2, "n6"), (3, "n8")]     # once per split input
    # four crossings of strict TEST memory, none while TEST was busy (that would have raised)
    assert dev.n_accesses - n_acc == 4
    assert dev.bytes_in - b_in == dev.bytes_out - b_out == 2 * K * M * 4
    # reset restores the sources that were rewired to copies
    s.reset()
    assert g.nodes[6].src[0] is g.nodes[5] and s.get_n_splits() == 0
    tb.close()


def test_reuse_path_builds_each_plan_once_and_new_graph_keeps_addresses(cpu, dev):
    tb = new_test_backend(dev, unsupported={Op.SILU})
    x, g, out, w = block_on(dev.default_buffer_type())
    s = Scheduler([tb, cpu])
    built0, tb_built0 = cpu.n_plans_built, tb.n_plans_built
    xv = RNG.standard_normal((M, K)).astype(np.float32)
    s.alloc_graph(g)
    tensor_set(x, xv)
    s.graph_compute(g)
    first = tensor_get(out)
    assert (cpu.n_plans_built - built0, tb.n_plans_built - tb_built0) == (2, 2)
    split_graphs = [p.graph for p in s.splits]
    uids = [p.graph.uid for p in s.splits]
    for _ in range(3):                                 # the reuse path: compute again
        tensor_set(x, xv)
        s.graph_compute(g)
    assert tensor_get(out) == first
    assert (cpu.n_plans_built - built0, tb.n_plans_built - tb_built0) == (2, 2)
    assert [p.graph for p in s.splits] == split_graphs and [p.graph.uid for p in s.splits] == uids
    assert (s.n_splits_made, s.n_reserves, s.n_computes) == (1, 1, 4)
    # a new graph of the same topology: split again, same plan and addresses, new split graphs
    addrs = [t.data for t in g.nodes]
    x2, g2, out2 = build_block(Context(no_alloc=True), w)
    s.alloc_graph(g2)
    assert [t.data for t in g2.nodes] == addrs and s.n_reserves == 1
    assert all(p.graph.uid not in uids for p in s.splits)
    tensor_set(x2, xv)
    s.graph_compute(g2)
    assert tensor_get(out2) == first
    assert (cpu.n_plans_built - built0, tb.n_plans_built - tb_built0) == (4, 4)
    # computing the old graph again splits it again
    tensor_set(x, xv)          # (x's memory is shared with x2: same plan)
    s.graph_compute(g)
    assert s.n_splits_made == 3 and tensor_get(out) == first
    s.graph_compute(g)
    assert s.n_splits_made == 3
    # a graph that grew after it was allocated is split again
    g.build_forward_expand(ops.scale(Context(no_alloc=True), out, 1.0, name="more"))
    tensor_set(x, xv)
    s.graph_compute(g)
    assert s.n_splits_made == 4 and s.splits[-1].graph.nodes[-1].name == "more"
    assert tensor_get(g.nodes[-1]) == first
    tb.close()


# ---- view ops, the weight cut, host weights, pass 3 ---------------------------------------------

def test_view_ops_never_start_a_split(cpu, dev):
    tb = new_test_backend(dev)
    ctx = Context(no_alloc=True)
    w = make_weights(ctx, {"w_t": ("f32", [K, K]), "w_c": ("f32", [K, K])},
                     {"w_t": dev.default_buffer_type(), "w_c": cpu_buffer_type()})
    x = ctx.new_tensor("f32", [K, M], name="x").set_input()
    v0 = ops.reshape_2d(ctx, x, K, M, name="v0")                # the first node is a view
    c = ops.mul_mat(ctx, w["w_c"], v0, name="c")
    a = ops.mul_mat(ctx, w["w_t"], c, name="a")
    v = ops.reshape_2d(ctx, c, K, M, name="v")                  # a CPU view among TEST nodes
    out = ops.add(ctx, a, v, name="out")
    g = graph_of(out)
    s = Scheduler([tb, cpu])
    s.alloc_graph(g)
    assert causes(s, g) == {"v0": ("CPU", "4.vsrc"), "c": ("CPU", "1.wgt0"),
                            "a": ("TEST", "1.wgt0"), "v": ("CPU", "4.vsrc"),
                            "out": ("TEST", "2.gd")}
    assert [(s.backends[p.backend_id].name, [t.name for t in p.graph.nodes]) for p in s.splits] \
        == [("CPU", ["v0", "c"]), ("TEST", ["a", "v", "out"])]
    assert [t.name for t in s.splits[1].inputs] == ["c", "v"]
    xv = RNG.standard_normal((M, K)).astype(np.float32)
    tensor_set(x, xv)
    s.graph_compute(g)
    W = {k: np.frombuffer(tensor_get(w[k]), np.float32).reshape(K, K) for k in ("w_t", "w_c")}
    cc = xv @ W["w_c"].T
    np.testing.assert_allclose(read_f32(out), cc @ W["w_t"].T + cc, rtol=2e-5, atol=2e-4)
    tb.close()


def _cut_graph(ctx, dev):
    w = make_weights(ctx, {"w_t": ("f32", [K, K]), "w_c": ("f32", [K, K])},
                     {"w_t": dev.default_buffer_type(), "w_c": cpu_buffer_type()})
    x = ctx.new_tensor("f32", [K, M], name="x").set_input()
    y = ctx.new_tensor("f32", [K, M], name="y").set_input()
    a = ops.mul_mat(ctx, w["w_t"], x, name="a")
    b = ops.mul_mat(ctx, w["w_c"], y, name="b")
    out = ops.add(ctx, a, b, name="out")
    return x, y, graph_of(out), out, w


def test_weight_incompatibility_cut_and_host_weights_copied_last(cpu, dev):
    tb = new_test_backend(dev, offload_min_rows=1)        # TEST wants every mul_mat
    ctx = Context(no_alloc=True)
    x, y, g, out, w = _cut_graph(ctx, dev)
    s = Scheduler([tb, cpu])
    s.alloc_graph(g)
    assert causes(s, g) == {"a": ("TEST", "1.wgt0"), "b": ("TEST", "1.off"),
                            "out": ("TEST", "2.gd")}
    # b is on TEST like a, but its weight is in CPU memory and the split already has an input:
    # a new split starts (same backend), whose inputs are the CPU weight and y
    assert [(s.backends[p.backend_id].name, p.i_start, p.i_end) for p in s.splits] == [
        ("TEST", 0, 1), ("TEST", 1, 3)]
    assert [[t.name for t in p.inputs] for p in s.splits] == [["x"], ["w_c", "y"]]
    assert [p[0].name for p in s.splits[1].copy_plan] == ["y", "w_c"]     # host weight last
    xv, yv = (RNG.standard_normal((M, K)).astype(np.float32) for _ in range(2))
    tensor_set(x, xv)
    tensor_set(y, yv)
    s.trace = []
    s.graph_compute(g)
    assert s.trace == [
        ("sync", "TEST"), ("copy", 0, "x", "CPU", "TEST"), ("compute", 0, "TEST"),
        ("sync", "TEST"), ("copy", 1, "y", "CPU", "TEST"),
        ("sync", "TEST"), ("sync", "CPU"), ("sync", "TEST"), ("copy", 1, "w_c", "CPU", "TEST"),
        ("compute", 1, "TEST")]
    W = {k: np.frombuffer(tensor_get(w[k]), np.float32).reshape(K, K) for k in ("w_t", "w_c")}
    np.testing.assert_allclose(read_f32(out), yv @ W["w_c"].T + xv @ W["w_t"].T, rtol=2e-5,
                               atol=2e-4)
    # without op offload, b runs where its weight is
    s2 = Scheduler([tb, cpu], op_offload=False)
    _, _, g2, _, _ = _cut_graph(Context(no_alloc=True), dev)
    s2.alloc_graph(g2)
    assert causes(s2, g2)["b"] == ("CPU", "1.wgt0") and s2.get_n_splits() == 2
    tb.close()


def test_pass3_upgrades_to_a_backend_sharing_the_buffer_type(cpu, dev):
    tb = new_test_backend(dev)
    peer = HostPeerBackend(ops=(Op.ADD, Op.MUL_MAT))
    ctx = Context(no_alloc=True)
    w = make_weights(ctx, {"w_h": ("f32", [K, K]), "g_h": ("f32", [K])},
                     {"w_h": cpu_buffer_type(), "g_h": cpu_buffer_type()})
    x = ctx.new_tensor("f32", [K, M], name="x").set_input()
    a = ops.mul(ctx, x, w["g_h"], name="a")            # PEER cannot MUL: the CPU takes it
    c = ops.add(ctx, a, a, name="c")                   # expanded to the CPU, then upgraded
    d = ops.mul(ctx, c, w["g_h"], name="d")
    e = ops.mul_mat(ctx, w["w_h"], d, name="e")        # host weight: the first backend for it
    g = graph_of(e)
    s = Scheduler([tb, peer, cpu])
    s.alloc_graph(g)
    assert causes(s, g) == {"a": ("CPU", "1.wgt1"), "c": ("PEER", "3.upg"),
                            "d": ("CPU", "1.wgt1"), "e": ("PEER", "1.wgt0")}
    assert [(s.backends[p.backend_id].name, [t.name for t in p.inputs]) for p in s.splits] == [
        ("CPU", []), ("PEER", []), ("CPU", []), ("PEER", [])]   # shared host memory: no copies
    assert s.get_buffer_size(cpu) == 0 < s.get_buffer_size(peer)   # one host compute buffer
    xv = RNG.standard_normal((M, K)).astype(np.float32)
    tensor_set(x, xv)
    s.trace = []
    n0 = peer.n_computes
    s.graph_compute(g)
    # a split without inputs on another backend than the previous split first waits for it
    assert s.trace == [("compute", 0, "CPU"), ("sync", "CPU"), ("compute", 1, "PEER"),
                       ("sync", "PEER"), ("compute", 2, "CPU"), ("sync", "CPU"),
                       ("compute", 3, "PEER")]
    assert peer.n_computes == n0 + 2
    W = np.frombuffer(tensor_get(w["w_h"]), np.float32).reshape(K, K)
    gh = np.frombuffer(tensor_get(w["g_h"]), np.float32)
    np.testing.assert_allclose(read_f32(e), (2 * xv * gh * gh) @ W.T, rtol=2e-5, atol=2e-4)
    # a user assignment is honoured and never upgraded
    s.set_tensor_backend(c, cpu)
    s.alloc_graph(g)
    assert causes(s, g)["c"] == ("CPU", "usr")
    tb.close()


def test_preallocated_destination_and_inplace_view_follow_memory(cpu, dev):
    """A CPY into a tensor in TEST memory (a KV-cache write) runs on TEST (1.dst). An in-place
    op shares its source's memory: expansion put it on TEST, but its source is on the CPU, so it
    moves there (4.vsrc) instead of writing CPU memory from TEST."""
    tb = new_test_backend(dev, unsupported={Op.SCALE})
    ctx = Context(no_alloc=True)
    w = make_weights(ctx, {"w_t": ("f32", [K, K]), "cache": ("f32", [K, M])},
                     {"w_t": dev.default_buffer_type(), "cache": dev.default_buffer_type()})
    x = ctx.new_tensor("f32", [K, M], name="x").set_input()
    h = ops.scale(ctx, x, 2.0, name="h")
    hi = ops.add(ctx, h, x, inplace=True, name="hi")
    a = ops.mul_mat(ctx, w["w_t"], hi, name="a")
    kv = ops.cpy(ctx, a, w["cache"], name="kv")
    g = graph_of(kv)
    s = Scheduler([tb, cpu])
    s.alloc_graph(g)
    assert causes(s, g) == {"h": ("CPU", "3.best"), "hi": ("CPU", "4.vsrc"),
                            "a": ("TEST", "1.wgt0"), "kv": ("TEST", "1.dst")}
    assert [[t.name for t in p.inputs] for p in s.splits] == [[], ["hi"]]
    assert hi.data == h.data
    xv = RNG.standard_normal((M, K)).astype(np.float32)
    tensor_set(x, xv)
    s.graph_compute(g)
    W = np.frombuffer(tensor_get(w["w_t"]), np.float32).reshape(K, K)
    np.testing.assert_allclose(read_f32(w["cache"]), (3 * xv) @ W.T, rtol=2e-5, atol=2e-4)
    tb.close()


# ---- n_copies ----------------------------------------------------------------------------------

def _pipeline_graph(ctx, w, cache_name):
    """x (CPU input) -> a on the CPU -> b on TEST -> written into a TEST cache tensor."""
    x = ctx.new_tensor("f32", [K, M], name="x").set_input()
    a = ops.mul_mat(ctx, w["w_c"], x, name="a")
    b = ops.mul_mat(ctx, w["w_t"], a, name="b")
    kv = ops.cpy(ctx, b, w[cache_name], name="kv")
    return x, graph_of(kv)


def _pipeline_weights(ctx, dev):
    specs = {"w_c": ("f32", [K, K]), "w_t": ("f32", [K, K]), "cache0": ("f32", [K, M]),
             "cache1": ("f32", [K, M])}
    t = dev.default_buffer_type()
    return make_weights(ctx, specs, {"w_c": cpu_buffer_type(), "w_t": t, "cache0": t,
                                     "cache1": t})


def test_n_copies_2_rotates_copies_and_matches_one_copy(cpu, dev):
    xs = [RNG.standard_normal((M, K)).astype(np.float32) for _ in range(2)]
    results = {}
    for n_copies in (1, 2):
        dev.strict = n_copies == 1
        tb = new_test_backend(dev)
        ctx = Context(no_alloc=True)
        w = _pipeline_weights(ctx, dev)
        x, g = _pipeline_graph(ctx, w, "cache0")
        s = Scheduler([tb, cpu], n_copies=n_copies)
        assert s.get_n_copies() == n_copies
        seen = []
        for xv in xs:
            s.alloc_graph(g)                  # one batch: split, rotate the copy, place
            tensor_set(x, xv)
            s.graph_compute(g)
            results.setdefault(n_copies, []).append(tensor_get(w["cache0"]))
            cp = s.splits[1].graph.leafs[0]
            seen.append((s.cur_copy, cp, cp.data, x.data, g.nodes[1].src[1]))
        if n_copies == 2:
            (c0, cp0, d0, x0, src0), (c1, cp1, d1, x1, src1) = seen
            assert (c0, c1) == (0, 1)
            assert cp0.name == "TEST#a#0" and cp1.name == "TEST#a#1"
            assert cp0 is not cp1 and d0 != d1 and x0 != x1       # different memory per batch
            assert src0 is cp0 and src1 is cp1                     # b read its batch's copy
            assert [c.name for c in s.copies_of(g.nodes[0], tb)] == ["TEST#a#0", "TEST#a#1"]
            assert [c.name for c in s.copies_of(x, cpu)] == ["CPU#x#0", "x"]  # x is copy 1
        tb.close()
    assert results[1] == results[2]
    assert results[1][0] != results[1][1]


def test_n_copies_2_overlaps_consecutive_batches(cpu, dev):
    """Batch A still runs on TEST while batch B is copied in: B waits on copy 1's event only."""
    xs = [RNG.standard_normal((M, K)).astype(np.float32) for _ in range(2)]
    ref_ctx = Context(no_alloc=True)
    ref_w = _pipeline_weights(ref_ctx, dev)
    dev.strict = False              # TEST memory is written while TEST runs: that is the point
    tb = new_test_backend(dev, delay_s=0.2)
    ref = []
    s1 = Scheduler([tb, cpu])
    for xv in xs:
        x, g = _pipeline_graph(ref_ctx, ref_w, "cache0")
        s1.alloc_graph(g)
        tensor_set(x, xv)
        s1.graph_compute(g)
        ref.append(tensor_get(ref_w["cache0"]))

    ctx = Context(no_alloc=True)
    w = _pipeline_weights(ctx, dev)
    s = Scheduler([tb, cpu], n_copies=2)
    xa, ga = _pipeline_graph(ctx, w, "cache0")
    xb, gb = _pipeline_graph(ctx, w, "cache1")
    s.alloc_graph(ga)
    tensor_set(xa, xs[0])
    s.graph_compute_async(ga)
    assert dev.pending > 0                             # A is still running on TEST
    s.trace = []
    s.alloc_graph(gb)
    tensor_set(xb, xs[1])
    s.graph_compute_async(gb)
    assert s.trace == [
        ("compute", 0, "CPU"), ("record", "CPU", 1),
        ("event_wait", "TEST", 1), ("sync", "CPU"), ("event_sync", "TEST", 1),
        ("copy", 1, "a", "CPU", "TEST"), ("compute", 1, "TEST"), ("record", "TEST", 1)]
    s.synchronize()
    assert tensor_get(w["cache0"]) == ref[0] and tensor_get(w["cache1"]) == ref[1]
    tb.close()


# ---- eval callback, reserve, debug output -------------------------------------------------------

def test_eval_callback_reads_wanted_nodes_and_can_stop(cpu, dev):
    tb = new_test_backend(dev, offload_min_rows=1)
    x, y, g, out, w = _cut_graph(Context(no_alloc=True), dev)
    s = Scheduler([tb, cpu])
    xv, yv = (RNG.standard_normal((M, K)).astype(np.float32) for _ in range(2))
    s.alloc_graph(g)
    tensor_set(x, xv)
    tensor_set(y, yv)
    s.graph_compute(g)
    plain = tensor_get(out)
    asked, got = [], {}

    def cb(t, ask):
        if ask:
            asked.append(t.name)
            return t.name == "a"
        got[t.name] = np.frombuffer(tensor_get(t), np.float32).reshape(M, K)
        return True

    s.set_eval_callback(cb)
    built = tb.n_plans_built
    for _ in range(2):
        tensor_set(x, xv)
        tensor_set(y, yv)
        assert s.graph_compute(g)
    assert asked == ["a", "b", "out"] * 2 and list(got) == ["a"]
    assert tensor_get(out) == plain
    assert tb.n_plans_built == built + 2          # two sub-graph views, built once each
    W = np.frombuffer(tensor_get(w["w_t"]), np.float32).reshape(K, K)
    np.testing.assert_allclose(got["a"], xv @ W.T, rtol=2e-5, atol=2e-4)
    s.set_eval_callback(lambda t, ask: True if ask else False)    # stop at the first node
    n = tb.n_computes
    assert s.graph_compute(g) is False and tb.n_computes == n + 1
    s.set_eval_callback(None)
    assert s.graph_compute(g) and tensor_get(out) == plain
    tb.close()


def test_reserve_then_smaller_graph_fits(cpu, dev):
    tb = new_test_backend(dev, unsupported={Op.SILU})
    ctx = Context(no_alloc=True)
    w = make_weights(ctx, BLOCK_SPECS, {"w_o": cpu_buffer_type(),
                                        "w_up": dev.default_buffer_type(),
                                        "w_q": dev.default_buffer_type(),
                                        "norm": dev.default_buffer_type()})
    s = Scheduler([tb, cpu])
    _, g_big, _ = build_block(ctx, w)
    sizes = s.reserve_size(g_big)
    assert s.n_splits_made == 1 and s.n_reserves == 0     # measured, nothing allocated
    assert g_big.nodes[0].data is None
    s.reserve(g_big)
    assert s.get_n_splits() == 0 and g_big.nodes[6].src[0] is g_big.nodes[5]   # reset after
    assert sizes == {"TEST": s.get_buffer_size(tb), "CPU": s.get_buffer_size(cpu)}
    assert min(sizes.values()) > 0
    x, g, out = build_block(ctx, w)
    s.alloc_graph(g)
    assert s.n_reserves == 1                                 # the reserved plan is reused
    tensor_set(x, RNG.standard_normal((M, K)).astype(np.float32))
    s.graph_compute(g)
    assert np.isfinite(read_f32(out)).all()
    tb.close()


def test_debug_output_is_read_at_construction(cpu, dev, monkeypatch, capsys):
    tb = new_test_backend(dev, unsupported={Op.SILU})
    monkeypatch.setenv("PYGGML_SCHED_DEBUG", "2")
    s2 = Scheduler([tb, cpu])
    monkeypatch.setenv("PYGGML_SCHED_DEBUG", "1")
    s1 = Scheduler([tb, cpu])
    monkeypatch.setenv("PYGGML_SCHED_DEBUG", "0")
    x, g, out, w = block_on(dev.default_buffer_type())
    s2.alloc_graph(g)
    err = capsys.readouterr().err.splitlines()
    assert err[0] == "## SPLIT #0: TEST # 1 inputs: [x (768B)]"
    assert err[1].startswith("node #  0 (  RMS_NORM):                   n0 (768B) [TEST 2.gu]")
    assert "x (768B) [CPU 1.inp]" in err[1] or "TEST#x#0 (768B) [TEST 4.cpy]" in err[1]
    assert "## SPLIT #3: CPU # 1 inputs: [n8 (768B)]" in err
    assert sum(line.startswith("node #") for line in err) == 9     # views are not listed
    x2, g2, _ = build_block(Context(no_alloc=True), w)
    s1.alloc_graph(g2)
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 4 and all(line.startswith("## SPLIT") for line in err)
    s0 = Scheduler([tb, cpu])
    _, g3, _ = build_block(Context(no_alloc=True), w)
    s0.alloc_graph(g3)
    assert capsys.readouterr().err == ""
    assert s0.format_assignments(verbose=False).count("## SPLIT") == 4
    tb.close()


# ---- bad input ---------------------------------------------------------------------------------

def test_op_no_backend_supports_names_op_and_backends(cpu, dev):
    tb = new_test_backend(dev)
    ctx = Context(no_alloc=True)
    x = ctx.new_tensor("f16", [K, M], name="x").set_input()
    bad = ops.silu(ctx, x, name="bad")
    s = Scheduler([tb, cpu])
    with pytest.raises(UnsupportedOpError,
                       match=r"no backend can compute node 'bad' \(op SILU -> F16\[64, 3, 1, 1\]"
                             r" from 'x' F16.*backends asked: TEST: only F32.*; CPU: only F32"):
        s.alloc_graph(graph_of(bad))
    assert s.get_n_splits() == 0 and not s._rewired
    tb.close()


def test_bad_scheduler_arguments(cpu, dev):
    tb = new_test_backend(dev)
    with pytest.raises(SchedulerError, match="at least one backend"):
        Scheduler([])
    with pytest.raises(SchedulerError, match=f"got 17 backends; at most {MAX_BACKENDS}"):
        Scheduler([cpu] * 17)
    with pytest.raises(SchedulerError, match="'CPU' is listed twice"):
        Scheduler([cpu, cpu])
    with pytest.raises(SchedulerError, match=r"last backend must be the CPU .*got \[CPU, TEST\]"):
        Scheduler([cpu, tb])
    for n in (0, MAX_COPIES + 1, 1.5):
        with pytest.raises(SchedulerError, match=f"n_copies must be an integer in 1..{MAX_COPIES}"):
            Scheduler([tb, cpu], n_copies=n)
    with pytest.raises(SchedulerError, match="'TEST' cannot use buffer type 'CPU'"):
        Scheduler([tb, cpu], bufts=[cpu_buffer_type(), cpu_buffer_type()])
    with pytest.raises(SchedulerError, match="not a pyggml Backend"):
        Scheduler(["CPU", cpu])
    s = Scheduler([tb, cpu], graph_size=5)
    x, g, out, w = block_on(dev.default_buffer_type())
    with pytest.raises(SchedulerError, match="11 nodes and 5 leafs, more than the scheduler's "
                                             "graph_size 5; .*graph_size >= 16"):
        s.alloc_graph(g)
    with pytest.raises(SchedulerError, match="'NPU' is not one of this scheduler's backends "
                                             r"\(TEST, CPU\)"):
        s.set_tensor_backend(out, "NPU")
    tb.close()


def test_tensor_in_memory_no_backend_can_use(cpu, dev):
    ctx = Context(no_alloc=True)
    w = make_weights(ctx, {"w_t": ("f32", [K, K])}, {"w_t": dev.default_buffer_type()})
    x = ctx.new_tensor("f32", [K, M], name="x").set_input()
    y = ops.mul_mat(ctx, w["w_t"], x, name="y")
    with pytest.raises(SchedulerError, match="tensor 'w_t' .* memory of type 'TEST', but no "
                                             r"backend of \[CPU\] can use that memory"):
        Scheduler([cpu]).alloc_graph(graph_of(y))


def test_bad_debug_env_and_user_assignment_to_unsupporting_backend(cpu, dev, monkeypatch):
    tb = new_test_backend(dev, unsupported={Op.SILU})
    monkeypatch.setenv("PYGGML_SCHED_DEBUG", "yes")
    with pytest.raises(SettingsError, match="PYGGML_SCHED_DEBUG='yes': expected 0, 1 or 2"):
        Scheduler([tb, cpu])
    monkeypatch.delenv("PYGGML_SCHED_DEBUG")
    ctx = Context(no_alloc=True)
    x = ctx.new_tensor("f32", [K, M], name="x").set_input()
    y = ops.silu(ctx, x, name="y")
    s = Scheduler([tb, cpu])
    s.set_tensor_backend(y, tb)
    with pytest.raises(SchedulerError, match="node 'y' \\(SILU\\) is assigned to backend 'TEST' "
                                             "\\(cause usr\\), which does not support it"):
        s.alloc_graph(graph_of(y))
    tb.close()


def test_mapped_gguf_weights_place_ops_on_the_cpu_or_offload(cpu, dev, tiny_models):
    from pyggml.gguf import GGUFModel
    tm = tiny_models.get(arch="llama", weight_type="q8_0")
    w = GGUFModel.open(tm.path).create_tensors()
    wq = w["blk.0.attn_q.weight"]
    results = {}
    for rows in (None, 1):
        tb = new_test_backend(dev, offload_min_rows=rows)
        ctx = Context(no_alloc=True)
        x = ctx.new_tensor("f32", [wq.ne[0], M], name="x").set_input()
        q = ops.mul_mat(ctx, wq, x, name="q")
        g = graph_of(q)
        s = Scheduler([tb, cpu])
        s.alloc_graph(g)
        tensor_set(x, np.linspace(-1, 1, wq.ne[0] * M, dtype=np.float32))
        s.graph_compute(g)
        results[rows] = tensor_get(q)
        if rows is None:
            assert causes(s, g) == {"q": ("CPU", "1.wgt0")} and s.get_n_splits() == 1
        else:
            assert causes(s, g) == {"q": ("TEST", "1.off")}
            assert [p[0].name for p in s.splits[0].copy_plan] == ["x", "blk.0.attn_q.weight"]
        tb.close()
    assert results[None] == results[1]


def test_split_graph_without_memory_then_compute(cpu, dev):
    tb = new_test_backend(dev, unsupported={Op.SILU})
    x, g, out, w = block_on(dev.default_buffer_type())
    s = Scheduler([tb, cpu])
    s.set_tensor_backend(g.nodes[0], cpu)                 # a pin survives repeated splits
    for _ in range(2):
        sp = s.split_graph(g)
        assert [len(p.inputs) for p in sp] == [0, 1, 1, 1, 1] and g.nodes[0].data is None
        assert s.get_assignment(g.nodes[0]).cause == "usr"
    xv = RNG.standard_normal((M, K)).astype(np.float32)
    s.alloc_graph(g)
    tensor_set(x, xv)
    s.graph_compute(g)
    assert s.get_assignment(g.nodes[0]).cause == "usr"
    assert tensor_get(out) == cpu_reference(cpu, xv)
    tb.close()


# ---- parked graphs: switching between a few graphs re-splits and re-allocates none -------------

def test_switching_graphs_unparks_instead_of_splitting_again(cpu, dev):
    ctx = Context(no_alloc=True)
    w = make_weights(ctx, BLOCK_SPECS, {k: cpu_buffer_type() for k in BLOCK_SPECS})
    s = Scheduler([cpu])
    xs = [RNG.standard_normal((M, K)).astype(np.float32) for _ in range(2)]
    built = [build_block(ctx, w) for _ in range(2)]        # two graphs of the same weights
    want = [cpu_reference(cpu, x) for x in xs]
    for g in (built[0][1], built[1][1]):
        s.alloc_graph(g)
    splits = s.n_splits_made
    for rnd in range(3):
        for (x, g, out), xv, wv in zip(built, xs, want):
            tensor_set(x, xv)
            s.graph_compute(g)
            assert np.array_equal(tensor_get(out), wv), f"round {rnd}: wrong values"
    assert s.n_splits_made == splits                       # no graph was split again
    assert s.n_unparked == 6
    assert s.holds(built[0][1]) and s.holds(built[1][1])
    s.reserve(built[0][1])                                 # the compute memory may move:
    assert not s.holds(built[1][1])                        # a parked graph is not trusted
    tensor_set(built[1][0], xs[1])
    s.graph_compute(built[1][1])
    assert np.array_equal(tensor_get(built[1][2]), want[1])


def test_graphs_with_copies_between_devices_are_not_parked(cpu, dev):
    tb = new_test_backend(dev, unsupported={Op.SILU})
    s = Scheduler([tb, cpu])
    (x0, g0, _, _), (x1, g1, _, _) = block_on(dev.default_buffer_type()), \
        block_on(dev.default_buffer_type())
    s.alloc_graph(g0)
    assert any(sp.inputs for sp in s.splits)               # sources rewired to copies
    s.alloc_graph(g1)
    assert not s.holds(g0)                                 # reset as before, not parked
    assert s.n_unparked == 0
    tb.close()
