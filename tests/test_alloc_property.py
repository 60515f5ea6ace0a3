"""Property test of the planning allocator: random graphs, checked by an independent live-range
checker that only trusts the addresses of the plan.

The checker recomputes every owner's live interval from the graph (leafs and inputs from before the
first node, each node from its own index, every read and every write through a view, outputs to
past the last node) and requires: tensors whose bytes overlap in a buffer chunk have disjoint
intervals, except an in-place handover (the node at the single shared index runs an op that may run
in place, reads the old tensor through exactly one source laid out like itself at its own address,
and fits inside it; never an input or output); every address is aligned and inside its chunk; the
memory behind it holds it; each tensor lives in the buffer type it was assigned.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pyggml import Context, Graph, ops
from pyggml.alloc import BufferTypeSpec, GraphAllocator
from pyggml.errors import PyggmlError
from pyggml.tensor import TensorFlag
from pyggml.types import VIEW_OPS, GGMLType, Op

REPO = Path(__file__).resolve().parent.parent

# The checker's own list of ops whose kernels tolerate dst == src.
CHECKER_INPLACE = {Op.ADD, Op.SUB, Op.MUL, Op.DIV, Op.SQR, Op.SQRT, Op.GELU, Op.SILU, Op.TANH,
                   Op.SCALE, Op.DIAG_MASK_INF, Op.NORM, Op.RMS_NORM, Op.SOFT_MAX, Op.ROPE}


class NumpyBufferType:
    """A buffer type backed by numpy host memory (aligned base)."""

    def __init__(self, name, alignment=64, max_size=None):
        self.name, self.alignment, self.max_size = name, alignment, max_size
        self.allocated = []

    def alloc_buffer(self, n):
        raw = np.zeros(n + self.alignment, dtype=np.uint8)
        pad = (-raw.ctypes.data) % self.alignment
        arr = raw[pad:pad + n]
        self.allocated.append(arr)
        return arr


def _owner(t):
    return t.view_src if t.view_src is not None else t


def live_intervals(graph):
    """id(owner) -> [owner, first index, last index]; -1 = before node 0, n = after the graph."""
    nodes, n = graph.nodes, len(graph.nodes)
    live = {}

    def touch(t, j):
        o = _owner(t)
        e = live.get(id(o))
        if e is None:
            live[id(o)] = [o, j, j]
        else:
            e[1], e[2] = min(e[1], j), max(e[2], j)

    for t in graph.leafs:
        touch(t, -1)
    for j, t in enumerate(nodes):
        if t.flags & TensorFlag.INPUT:
            touch(t, -1)
        if t.view_src is None or t.op not in VIEW_OPS:
            touch(t, j)                      # produced here, or written through a view
        for s in t.src:
            if s is not None:
                touch(s, j)
    for t in (*graph.leafs, *nodes):
        if t.flags & TensorFlag.OUTPUT:
            touch(t, n)
    return live


def check_plan(graph, al, buffer_types, node_ids=None, leaf_ids=None, memory=True,
               external=None):
    """Raise AssertionError on any violation of the allocator invariant."""
    nodes = graph.nodes
    node_ids = node_ids or [0] * len(nodes)
    leaf_ids = leaf_ids or [0] * len(graph.leafs)
    assigned = {id(t): buffer_types[b] for t, b in zip(nodes, node_ids)}
    assigned.update({id(t): buffer_types[b] for t, b in zip(graph.leafs, leaf_ids)})
    placed = []     # (owner, bt, chunk, offset, size, first, last)
    for o, first, last in live_intervals(graph).values():
        p = al.placement(o)
        if p is None:
            assert o.data is not None or o.buffer is not None, f"{o.name}: not placed, no data"
            if external is not None and id(o) in external:
                assert o.data == external[id(o)], f"external {o.name} was moved"
            continue
        bid, chunk, off = p
        bt = buffer_types[bid]
        if id(o) in assigned:
            assert bt is assigned[id(o)], f"{o.name} placed in {bt.name}, assigned elsewhere"
        size = o.nbytes()
        assert off % bt.alignment == 0, f"{o.name}: offset {off} not aligned to {bt.alignment}"
        chunk_size = al.chunk_sizes(bid)[chunk]
        assert off + size <= chunk_size, f"{o.name}: [{off}, {off + size}) past {chunk_size}"
        if memory:
            base = o.buffer.ctypes.data
            assert o.data == base + off, f"{o.name}: data is not the chunk base + offset"
            assert o.data + size <= base + o.buffer.nbytes
        placed.append((o, bt, chunk, off, size, first, last))
    if memory:
        for t in (*graph.leafs, *nodes):
            if t.view_src is not None and t.view_src.data is not None:
                assert t.data == t.view_src.data + t.view_offs, f"view {t.name} misplaced"
    # chunks respect max_size unless one tensor alone is larger (or it is the last chunk)
    for bid, bt in enumerate(buffer_types):
        if bt.max_size is not None and al.get_buffer_size(bid):
            for c, cs in enumerate(al.chunk_sizes(bid)[:-1] if len(al.chunk_sizes(bid)) == 16
                                   else al.chunk_sizes(bid)):
                biggest = max((p[4] for p in placed if p[1] is bt and p[2] == c), default=0)
                assert cs <= max(bt.max_size, -(-biggest // bt.alignment) * bt.alignment)
    # overlaps: sweep each chunk by offset
    by_chunk = {}
    for p in placed:
        if p[4] > 0:
            by_chunk.setdefault((id(p[1]), p[2]), []).append(p)
    for group in by_chunk.values():
        group.sort(key=lambda p: p[3])
        for i, a in enumerate(group):
            for b in group[i + 1:]:
                if b[3] >= a[3] + a[4]:
                    break
                if a[6] < b[5] or b[6] < a[5]:
                    continue
                assert _handover(a, b, nodes, al) or _handover(b, a, nodes, al), (
                    f"{a[0].name} [{a[3]}, {a[3] + a[4]}) live {a[5]}..{a[6]} overlaps "
                    f"{b[0].name} [{b[3]}, {b[3] + b[4]}) live {b[5]}..{b[6]}")


def _handover(old, new, nodes, al) -> bool:
    """new took old's memory in place at the one index where both are live."""
    o, _, _, o_off, o_size, _, o_last = old
    t, _, _, n_off, n_size, n_first, _ = new
    j = o_last
    if n_first != j or j >= len(nodes) or nodes[j] is not t or t.view_src is not None:
        return False
    if t.op not in CHECKER_INPLACE or o.flags & (TensorFlag.INPUT | TensorFlag.OUTPUT):
        return False
    refs = [s for s in t.src if s is not None and _owner(s) is o]
    if len(refs) != 1:
        return False
    s = refs[0]
    if (s.type, s.ne, s.nb) != (t.type, t.ne, t.nb):
        return False
    return al.placement(s)[2] == n_off and n_off + n_size <= o_off + o_size


# ---- random graphs -------------------------------------------------------------------------

SHAPES = [(4, 1, 1), (8, 2, 1), (8, 3, 2), (16, 2, 1), (16, 1, 2), (4, 4, 1)]
OP_KINDS = ["unary", "unary_ip", "scale", "norm", "binary", "binary_ip", "softmax", "mul_mat",
            "reshape", "view", "permute", "transpose", "cont", "cpy", "concat", "get_rows",
            "rope", "set_rows", "const", "f16_cpy"]

recipes = st.fixed_dictionaries({
    "leaves": st.lists(st.tuples(st.integers(0, len(SHAPES) - 1), st.integers(0, 2)),
                       min_size=1, max_size=4),
    "ops": st.lists(st.tuples(st.sampled_from(OP_KINDS), st.integers(0, 10**6),
                              st.integers(0, 10**6), st.integers(0, 10**6)),
                    min_size=12, max_size=80),
    "outputs": st.lists(st.integers(0, 10**6), min_size=1, max_size=3),
    "sinks": st.lists(st.integers(0, 10**6), max_size=2),
    "bits": st.lists(st.integers(0, 1), min_size=1, max_size=16),
    "max_size": st.sampled_from([None, 128, 256, 512, 2048]),
    "expand_all": st.booleans(),
})


def _writable(t) -> bool:
    o = _owner(t)
    return not o.flags & TensorFlag.INPUT and o.data is None


def build(recipe):
    """A graph from a recipe, deterministically (the same recipe gives the same graph)."""
    ctx = Context(no_alloc=True)
    fake = [1 << 40]

    def external(t):
        t.data = fake[0]
        fake[0] += t.nbytes() + 64
        return t

    pool = []
    for shape_i, kind in recipe["leaves"]:
        t = ctx.new_tensor(GGMLType.F32, list(SHAPES[shape_i]))
        if kind == 0:
            t.set_input()
        elif kind == 2:
            external(t)
        pool.append(t)
    for kind, i, j, k in recipe["ops"]:
        # mostly the newest tensor or one of the 4 newest, so that chains grow long
        r = i % 8
        a = (pool[-1] if r < 4 else pool[-1 - (i // 8) % min(4, len(pool))] if r < 7
             else pool[(i // 8) % len(pool)])
        want = _PARTNER.get(kind)
        cands = [t for t in pool if want is None or want(a, t)] or pool
        b = cands[j % len(cands)]
        try:
            t = _apply(ctx, kind, a, b, k, external)
        except (PyggmlError, ValueError):
            continue
        if t is not None:
            pool.append(t)
    outs = [pool[-1]] + [pool[o % len(pool)] for o in recipe["outputs"]]
    g = Graph()
    for o in outs:
        o.set_output()
        g.build_forward_expand(o)
    for s in recipe["sinks"]:
        g.build_forward_expand(pool[s % len(pool)])
    if recipe["expand_all"]:            # every tensor made, dangling ones included
        for t in pool:
            g.build_forward_expand(t)
    return g


_PARTNER = {   # which second operands make sense for an op
    "binary": lambda a, b: all(a.ne[i] % b.ne[i] == 0 for i in range(4)),
    "binary_ip": lambda a, b: all(a.ne[i] % b.ne[i] == 0 for i in range(4)),
    "mul_mat": lambda a, b: a.ne[0] == b.ne[0] and b.ne[2] % a.ne[2] == 0,
    "concat": lambda a, b: sum(a.ne[i] != b.ne[i] for i in range(4)) <= 1,
    "cpy": lambda a, b: a.nelements() == b.nelements() and a is not b,
}


def _apply(ctx, kind, a, b, k, external):
    if kind in ("unary", "unary_ip"):
        if kind == "unary_ip" and not _writable(a):
            return None
        f = [ops.silu, ops.gelu, ops.sqr, ops.tanh, ops.sqrt,
             lambda c, x, inplace: ops.diag_mask_inf(c, x, 0, inplace=inplace)][k % 6]
        return f(ctx, a, inplace=kind == "unary_ip")
    if kind == "scale":
        return ops.scale(ctx, a, 0.5, inplace=bool(k % 2) and _writable(a))
    if kind == "norm":
        return (ops.rms_norm if k % 2 else ops.norm)(ctx, a, 1e-5)
    if kind in ("binary", "binary_ip"):
        if kind == "binary_ip" and not _writable(a):
            return None
        f = [ops.add, ops.mul, ops.sub, ops.div][k % 4]
        return f(ctx, a, b, inplace=kind == "binary_ip")
    if kind == "softmax":
        mask = None
        if k % 2:
            mask = ctx.new_tensor(GGMLType.F32, [a.ne[0], a.ne[1]]).set_input()
        return ops.soft_max_ext(ctx, a, mask, 0.5)
    if kind == "mul_mat":
        return ops.mul_mat(ctx, a, b)
    if kind == "reshape":
        n = a.nelements()
        return ops.reshape(ctx, a, [n] if k % 2 else [a.ne[0], n // a.ne[0]])
    if kind == "view":
        rows = a.nrows()
        r0 = k % rows
        if k % 3 == 0:
            return ops.view_1d(ctx, a, a.ne[0], r0 * a.nb[1])
        n_rows = max(1, (rows - r0) // 2)
        return ops.view_2d(ctx, a, a.ne[0], n_rows, a.nb[1], r0 * a.nb[1])
    if kind == "permute":
        return ops.permute(ctx, a, *[(0, 2, 1, 3), (1, 0, 2, 3), (2, 1, 0, 3)][k % 3])
    if kind == "transpose":
        return ops.transpose(ctx, a)
    if kind == "cont":
        return ops.cont(ctx, a)
    if kind == "cpy":
        if not _writable(b) or a.nelements() != b.nelements() or _owner(a) is _owner(b):
            return None
        return ops.cpy(ctx, a, b)
    if kind == "concat":
        return ops.concat(ctx, a, b, k % 3)
    if kind == "get_rows":
        idx = ctx.new_tensor(GGMLType.I32, [k % 3 + 1, a.ne[2]]).set_input()
        return ops.get_rows(ctx, a, idx)
    if kind == "rope":
        pos = ctx.new_tensor(GGMLType.I32, [a.ne[2]]).set_input()
        return ops.rope(ctx, a, pos, a.ne[0])
    if kind == "set_rows":
        dst = external(ctx.new_tensor(GGMLType.F32, [a.ne[0], a.ne[1] + 2, a.ne[2], a.ne[3]]))
        idx = ctx.new_tensor(GGMLType.I32, [a.ne[1]]).set_input()
        return ops.set_rows(ctx, dst, a, idx)
    if kind == "const":
        return ctx.new_tensor(GGMLType.F32, list(a.ne))          # a leaf we allocate
    if kind == "f16_cpy":
        dst = ctx.new_tensor(GGMLType.F16, list(a.ne))
        return ops.cpy(ctx, a, dst)
    raise AssertionError(kind)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(recipes)
def test_random_graphs_never_overlap_live_tensors(recipe):
    g = build(recipe)
    bits = recipe["bits"]
    node_ids = [bits[i % len(bits)] for i in range(g.n_nodes)]
    leaf_ids = [bits[(i + 1) % len(bits)] for i in range(g.n_leafs)]
    bts = [NumpyBufferType("a", alignment=16, max_size=recipe["max_size"]),
           NumpyBufferType("b", alignment=64)]
    external = {id(t): t.data for t in (*g.leafs, *g.nodes) if t.data is not None}
    al = GraphAllocator(bts)
    al.reserve(g, node_ids, leaf_ids)
    al.alloc_graph(g)
    check_plan(g, al, bts, node_ids, leaf_ids, memory=True, external=external)

    rep = al.report()
    for p in rep.tensors:
        if p.placed in ("fresh", "inplace", "view_parent"):
            t = (g.leafs if p.role == "leaf" else g.nodes)[p.index]
            assert al.placement(t) == (p.buffer_id, p.chunk, p.offset)
    for b in rep.buffers:
        assert b.peak == sum(b.chunk_sizes) == al.get_buffer_size(b.buffer_id)
        assert b.max_live <= b.peak <= b.naive

    # a second graph of the same recipe reuses the plan, address for address
    g2 = build(recipe)
    assert not al.needs_realloc(g2)
    al.alloc_graph(g2)
    assert [t.data for t in (*g.leafs, *g.nodes)] == [t.data for t in (*g2.leafs, *g2.nodes)]


@settings(max_examples=100, deadline=None)
@given(recipes)
def test_random_graphs_planning_only(recipe):
    """One buffer type without memory: the plan alone satisfies the checker."""
    g = build(recipe)
    bt = BufferTypeSpec("cpu", alignment=32, max_size=recipe["max_size"])
    al = GraphAllocator(bt)
    al.alloc_graph(g)                       # no plan yet: one buffer type plans by itself
    check_plan(g, al, [bt], memory=False)
    assert all(t.data is None for t in g.nodes if t.view_src is None)


def _load_bench():
    spec = importlib.util.spec_from_file_location("bench_alloc", REPO / "tools" / "bench_alloc.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_transformer_graph_passes_the_checker():
    bench = _load_bench()
    g, _ = bench.build_llama_graph(n_layer=4, n_embd=256, n_tokens=32, n_head=4, n_ff=704)
    bt = NumpyBufferType("cpu", alignment=64)
    al = GraphAllocator(bt)
    al.reserve(g)
    al.alloc_graph(g)
    check_plan(g, al, [bt], memory=True)
    # full size, planning only: 722 nodes, 170 in-place and 48 view-parent handovers checked
    g, _ = bench.build_llama_graph()
    spec = BufferTypeSpec("cpu", alignment=64)
    al = GraphAllocator(spec)
    al.reserve(g)
    check_plan(g, al, [spec], memory=False)
