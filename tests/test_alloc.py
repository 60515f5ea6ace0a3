"""Unit tests of the planning allocator with exact offsets, one mechanism each.

Graph tests use F32 [64] tensors (256 bytes) and a 32-byte alignment unless said otherwise, so a
fresh allocation after k live 256-byte tensors lands at 256 * k.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest

from pyggml import Context, Graph, ops
from pyggml.alloc import INPLACE_OPS, BufferTypeSpec, DynAllocator, GraphAllocator
from pyggml.errors import AllocatorError
from pyggml.types import GGMLType, Op

REPO = Path(__file__).resolve().parent.parent
F32 = GGMLType.F32


class NumpyBufferType:
    """A buffer type backed by numpy host memory (aligned base), counting its allocations."""

    def __init__(self, name="host", alignment=32, max_size=None):
        self.name, self.alignment, self.max_size = name, alignment, max_size
        self.allocated = []

    def alloc_buffer(self, n):
        raw = np.zeros(n + self.alignment, dtype=np.uint8)
        pad = (-raw.ctypes.data) % self.alignment
        arr = raw[pad:pad + n]
        self.allocated.append(arr)
        return arr


def aligned_array(n, alignment=64):
    raw = np.zeros(n + alignment, dtype=np.uint8)
    pad = (-raw.ctypes.data) % alignment
    return raw[pad:pad + n]


def plan(*outputs, bt=None, **kw):
    g = Graph()
    for o in outputs:
        o.set_output()
        g.build_forward_expand(o)
    al = GraphAllocator(bt or BufferTypeSpec("cpu", alignment=32))
    al.reserve(g, **kw)
    return g, al, al.report()


def offset(al, t):
    p = al.placement(t)
    return None if p is None else p[2]


def external(ctx, ne, name, addr=0x10000):
    w = ctx.new_tensor(F32, ne, name=name)
    w.data = addr
    return w


# ---- DynAllocator ----------------------------------------------------------------------------

def test_best_fit_takes_the_tightest_non_last_block():
    d = DynAllocator(alignment=16)
    assert d.alloc(100) == (0, 0)        # 112 after alignment
    assert d.alloc(200) == (0, 112)      # 208
    assert d.alloc(50) == (0, 320)       # 64
    assert d.alloc(300) == (0, 384)      # 304, ends at 688
    d.free(0, 0, 100)
    d.free(0, 320, 50)
    assert d.free_blocks(0)[:2] == [(0, 112), (320, 64)]
    assert d.free_blocks(0)[2][0] == 688
    assert d.alloc(60) == (0, 320)       # 64 fits both blocks: the 64-byte one is tighter
    assert d.alloc(40) == (0, 0)         # 48 from the 112-byte block
    assert d.free_blocks(0)[0] == (48, 64)
    assert d.chunk_sizes == [688]


def test_best_fit_prefers_an_earlier_tighter_block():
    d = DynAllocator(alignment=16)
    for size, off in ((64, 0), (16, 64), (128, 80), (16, 208)):
        assert d.alloc(size) == (0, off)
    d.free(0, 0, 64)
    d.free(0, 80, 128)
    assert d.alloc(48) == (0, 0)             # not the larger block at 80
    assert d.alloc(100) == (0, 80)


def test_best_fit_tie_goes_to_the_later_block():
    d = DynAllocator(alignment=16)
    for size, off in ((64, 0), (16, 64), (64, 80), (16, 144)):
        assert d.alloc(size) == (0, off)
    d.free(0, 0, 64)
    d.free(0, 80, 64)
    assert d.alloc(64) == (0, 80)


def test_free_merges_with_both_neighbours_and_the_last_block():
    d = DynAllocator(alignment=16)
    for i in range(4):
        assert d.alloc(16) == (0, 16 * i)
    d.free(0, 0, 16)
    d.free(0, 32, 16)
    assert [b for b in d.free_blocks(0)[:-1]] == [(0, 16), (32, 16)]
    d.free(0, 16, 16)                    # joins both neighbours
    assert d.free_blocks(0)[0] == (0, 48)
    d.free(0, 48, 16)                    # joins the last block: one block again
    assert len(d.free_blocks(0)) == 1 and d.free_blocks(0)[0][0] == 0
    assert d.chunk_sizes == [64]         # the high-water mark stays


def test_double_free_is_an_error():
    d = DynAllocator(alignment=16)
    d.alloc(32)
    d.free(0, 0, 32)
    with pytest.raises(AllocatorError, match="already free"):
        d.free(0, 0, 32)


def test_alignment_rounds_every_size():
    d = DynAllocator(alignment=64)
    assert d.alloc(1) == (0, 0)
    assert d.alloc(1) == (0, 64)
    assert d.chunk_sizes == [128]
    with pytest.raises(ValueError):
        DynAllocator(alignment=48)


def test_reuse_factor_prefers_the_least_growth():
    d = DynAllocator(alignment=4, max_chunk_size=1000)
    assert d.alloc(500) == (0, 0)
    assert d.alloc(100) == (0, 500)
    assert d.alloc(600) == (1, 0)        # 400 left in chunk 0: a new chunk
    d.free(0, 500, 100)                  # chunk 0's last block is [500, 1000) again
    # last blocks: chunk 0 grows by 100 (600 - 500 - 200), chunk 1 by 200 (600 - 600 - 200)
    assert d.alloc(200) == (0, 500)
    assert d.chunk_sizes == [700, 600]


def test_reuse_factor_prefers_the_least_idle_memory():
    d = DynAllocator(alignment=4, max_chunk_size=1000)
    assert d.alloc(800) == (0, 0)
    assert d.alloc(600) == (1, 0)
    d.free(0, 0, 800)
    d.free(1, 0, 600)
    # both fit below their high-water mark: chunk 0 leaves 300 idle, chunk 1 leaves 100
    assert d.alloc(500) == (1, 0)
    # chunk 1's last block [500, 1000) is too small; chunk 0 leaves 100 idle
    assert d.alloc(700) == (0, 0)
    assert d.chunk_sizes == [800, 600]


def test_reuse_factor_prefers_fitting_over_growing():
    d = DynAllocator(alignment=4, max_chunk_size=1000)
    assert d.alloc(400) == (0, 0)
    assert d.alloc(700) == (1, 0)
    d.free(1, 0, 700)
    # chunk 0 would grow by 300, chunk 1 fits below its mark (400 idle): chunk 1
    assert d.alloc(300) == (1, 0)
    assert d.chunk_sizes == [400, 700]


def test_new_chunk_at_max_chunk_size_and_for_a_larger_tensor():
    d = DynAllocator(alignment=4, max_chunk_size=1000)
    assert d.alloc(600) == (0, 0)
    assert d.alloc(600) == (1, 0)
    assert d.alloc(1500) == (2, 0)       # alone larger than the cap: a chunk of its own size
    assert d.chunk_sizes == [600, 600, 1500]
    assert d.alloc(300) == (0, 600)      # equal growth in chunks 0 and 1: the first
    assert d.chunk_sizes == [900, 600, 1500]


def test_the_last_chunk_is_unbounded():
    d = DynAllocator(alignment=4, max_chunk_size=100, max_chunks=3)
    assert [d.alloc(100) for _ in range(4)] == [(0, 0), (1, 0), (2, 0), (2, 100)]
    assert d.chunk_sizes == [100, 100, 200]


# ---- in place ------------------------------------------------------------------------------

def test_inplace_taken_when_the_node_is_the_last_consumer(ctx):
    x = external(ctx, [64], "x")
    a = ops.cont(ctx, x, name="a")
    b = ops.silu(ctx, a, name="b")
    _, al, rep = plan(b)
    assert [offset(al, t) for t in (a, b)] == [0, 0]
    assert rep.tensor("b").placed == "inplace" and rep.tensor("b").parent == "a"
    assert rep.tensor("a").last == 1          # handed over at node 1
    assert al.get_buffer_size(0) == 256
    assert rep.buffers[0].peak_no_inplace == 512
    assert rep.buffers[0].live_bytes == [0, 256, 256]     # before node 0, at node 0, at node 1


def test_an_input_is_freed_after_its_last_consumer(ctx):
    x = ctx.new_tensor_1d(F32, 64, name="x").set_input()
    a = ops.cont(ctx, x, name="a")
    b = ops.cont(ctx, a, name="b")
    _, al, rep = plan(b)
    assert [offset(al, t) for t in (x, a, b)] == [0, 256, 0]
    assert rep.tensor("x").first == -1 and rep.tensor("x").last == 0


def test_inplace_refused_for_memory_not_owned(ctx):
    w = external(ctx, [64], "w")
    b = ops.silu(ctx, w, name="b")
    _, al, rep = plan(b)
    assert al.placement(w) is None and w.data == 0x10000
    assert offset(al, b) == 0 and rep.tensor("b").placed == "fresh"
    assert rep.tensor("w").placed == "external"


def test_inplace_refused_for_an_output_parent(ctx):
    x = external(ctx, [64], "x")
    a = ops.cont(ctx, x, name="a").set_output()
    b = ops.silu(ctx, a, name="b")
    _, al, rep = plan(b)
    assert [offset(al, t) for t in (a, b)] == [0, 256]
    assert rep.tensor("b").placed == "fresh" and rep.tensor("a").last is None


def test_inplace_refused_for_an_input_parent(ctx):
    x = ctx.new_tensor_1d(F32, 64, name="x").set_input()
    b = ops.silu(ctx, x, name="b")
    _, al, _ = plan(b)
    assert [offset(al, t) for t in (x, b)] == [0, 256]


def test_inplace_refused_for_a_different_layout(ctx):
    x = external(ctx, [64], "x")
    a = ops.cont(ctx, x, ne=[8, 8], name="a")
    b = ops.silu(ctx, ops.transpose(ctx, a, name="aT"), name="b")   # strides differ from aT's
    _, al, rep = plan(b)
    assert [offset(al, t) for t in (a, b)] == [0, 256]
    assert rep.tensor("b").placed == "fresh"
    assert rep.tensor("a").last == 2          # freed when its view's last consumer ran


def test_inplace_refused_for_a_parent_with_another_consumer(ctx):
    x = external(ctx, [64], "x")
    a = ops.cont(ctx, x, name="a")
    b = ops.silu(ctx, a, name="b")            # a is still needed by c
    c = ops.add(ctx, b, a, name="c")          # b's last consumer: in place
    _, al, rep = plan(c)
    assert [offset(al, t) for t in (a, b, c)] == [0, 256, 256]
    assert rep.tensor("b").placed == "fresh"
    assert rep.tensor("c").placed == "inplace" and rep.tensor("c").parent == "b"


def test_inplace_refused_for_a_parent_with_a_live_view(ctx):
    x = external(ctx, [64], "x")
    a = ops.cont(ctx, x, name="a")
    v = ops.view_1d(ctx, a, 32, 0, name="v")
    b = ops.silu(ctx, a, name="b")
    c = ops.cont(ctx, v, name="c")
    _, al, rep = plan(b, c)
    assert [offset(al, t) for t in (a, b, c)] == [0, 256, 512]
    assert rep.tensor("b").placed == "fresh"


def test_inplace_refused_across_buffer_types(ctx):
    x = ctx.new_tensor_1d(F32, 64, name="x").set_input()
    a = ops.cont(ctx, x, name="a")
    b = ops.silu(ctx, a, name="b")
    g = Graph()
    g.build_forward_expand(b.set_output())
    al = GraphAllocator([BufferTypeSpec("gpu", 32), BufferTypeSpec("cpu", 32)])
    al.reserve(g, node_buffer_ids=[0, 1], leaf_buffer_ids=[0])
    assert al.placement(b) == (1, 0, 0) and al.placement(a) == (0, 0, 256)


def test_inplace_only_for_listed_ops(ctx):
    assert {Op.ADD, Op.MUL, Op.SILU, Op.SCALE, Op.RMS_NORM, Op.NORM, Op.SOFT_MAX,
            Op.ROPE} <= INPLACE_OPS
    assert not {Op.MUL_MAT, Op.CONT, Op.CPY, Op.GET_ROWS, Op.CONCAT, Op.FLASH_ATTN_EXT,
                Op.DUP} & INPLACE_OPS
    x = external(ctx, [64], "x")
    a = ops.cont(ctx, x, name="a")
    b = ops.cont(ctx, a, name="b")            # CONT never runs in place
    _, al, _ = plan(b)
    assert [offset(al, t) for t in (a, b)] == [0, 256]


# ---- views ---------------------------------------------------------------------------------

def test_view_parent_reuse_returns_the_tail(ctx):
    x = ctx.new_tensor_1d(F32, 64, name="x").set_input()
    a = ops.cont(ctx, x, name="a")                         # 256 bytes at 256
    b = ops.silu(ctx, ops.view_1d(ctx, a, 32, 0, name="v"), name="b")   # 128 bytes
    d = ops.cont(ctx, ops.view_1d(ctx, x, 16, 0), name="d")             # 64 bytes
    _, al, rep = plan(b, d)
    assert offset(al, b) == 256
    assert rep.tensor("b").placed == "view_parent" and rep.tensor("b").parent == "a"
    assert offset(al, d) == 384                            # the freed tail [384, 512)
    assert al.get_buffer_size(0) == 512
    # x, then a, then b holds 128 of a's 256 bytes, then d takes 64 more
    assert rep.buffers[0].live_bytes == [256, 512, 512, 384, 384, 448]


def test_view_parent_refused_at_a_nonzero_view_offset(ctx):
    x = external(ctx, [64], "x")
    a = ops.cont(ctx, x, name="a")
    b = ops.silu(ctx, ops.view_1d(ctx, a, 32, 128, name="v"), name="b")
    _, al, rep = plan(b)
    assert offset(al, b) == 256 and rep.tensor("b").placed == "fresh"


def test_reshape_norm_mul_chain_allocates_nothing_new(ctx):
    x = ctx.new_tensor_1d(F32, 64, name="x").set_input()
    a = ops.cont(ctx, x, name="a")
    r = ops.reshape_2d(ctx, a, 8, 8, name="r")
    n = ops.rms_norm(ctx, r, 1e-5, name="n")
    m = ops.mul(ctx, n, external(ctx, [8], "w"), name="m")
    _, al, rep = plan(m)
    assert [offset(al, t) for t in (a, r, n, m)] == [256, 256, 256, 256]
    assert [rep.tensor(k).placed for k in "rnm"] == ["view", "view_parent", "inplace"]
    assert al.get_buffer_size(0) == 512


def test_a_view_keeps_its_owner_alive(ctx):
    x = external(ctx, [64], "x")
    a = ops.cont(ctx, x, name="a")
    v = ops.view_1d(ctx, a, 32, 128, name="v")
    b = ops.cont(ctx, x, name="b")
    c = ops.cont(ctx, b, name="c").set_output()
    d = ops.cont(ctx, v, name="d").set_output()
    g = Graph()
    for t in (v, c, d):                       # order: a, v, b, c, d
        g.build_forward_expand(t)
    al = GraphAllocator(BufferTypeSpec("cpu", alignment=32))
    al.reserve(g)
    rep = al.report()
    # a's only consumer (the view node) ran at 1, but a lives until v's consumer d ran at 4
    assert [offset(al, t) for t in (a, v, b, c, d)] == [0, 128, 256, 512, 256]
    assert rep.tensor("a").last == rep.tensor("v").last == rep.tensor("d").index == 4


def test_output_view_pins_its_owner(ctx):
    x = external(ctx, [64], "x")
    a = ops.cont(ctx, x, name="a")
    v = ops.view_1d(ctx, a, 32, 0, name="v").set_output()
    b = ops.silu(ctx, v, name="b")            # would take a's memory through v: refused
    c = ops.cont(ctx, b, name="c")
    _, al, rep = plan(b, c)
    assert [offset(al, t) for t in (a, b, c)] == [0, 256, 384]
    assert rep.tensor("a").last is None


# ---- lifetimes -----------------------------------------------------------------------------

def test_outputs_are_kept_to_the_end(ctx):
    x = ctx.new_tensor_1d(F32, 64, name="x").set_input()
    a = ops.cont(ctx, x, name="a").set_output()
    b = ops.cont(ctx, a, name="b")
    c = ops.cont(ctx, b, name="c")
    d = ops.cont(ctx, c, name="d")
    _, al, rep = plan(a, d)
    # x is freed after node 0; b and d reuse its bytes, nobody ever touches a's
    assert [offset(al, t) for t in (x, a, b, c, d)] == [0, 256, 0, 512, 0]
    assert rep.tensor("a").last is None and rep.tensor("d").last is None
    assert rep.tensor("x").last == 0 and rep.tensor("b").last == 2
    assert rep.buffers[0].live_bytes == [256, 512, 512, 768, 768]
    assert rep.buffers[0].max_live == rep.buffers[0].peak == 768


def test_inputs_are_allocated_before_any_node(ctx):
    w = external(ctx, [64], "w")
    a = ops.cont(ctx, w, name="a")
    late = ops.cont(ctx, w, name="late").set_input()     # written by the user, read last
    b = ops.cont(ctx, a, name="b")
    c = ops.add(ctx, b, late, name="c")
    _, al, rep = plan(c)
    assert [offset(al, t) for t in (late, a, b, c)] == [0, 256, 512, 512]
    assert rep.tensor("late").first == -1 and rep.tensor("a").first == 0
    assert rep.tensor("c").parent == "b"       # in place on b, never on the input


def test_leafs_are_allocated_first_and_freed_after_use(ctx):
    x = ctx.new_tensor_1d(F32, 64, name="x").set_input()
    k = ctx.new_tensor_1d(F32, 64, name="k")             # a constant we place
    a = ops.add(ctx, ops.cont(ctx, x, name="xc"), k, name="a")
    b = ops.cont(ctx, a, name="b")
    c = ops.cont(ctx, b, name="c")
    _, al, rep = plan(c)
    assert [offset(al, t) for t in (x, k)] == [0, 256]
    assert rep.tensor("k").first == -1 and rep.tensor("k").last == 1
    assert offset(al, c) == 256                # reuses k's memory once both leafs are dead


# ---- reserve, alloc_graph, needs_realloc -------------------------------------------------------

def _mlp(n, name_prefix=""):
    ctx = Context(no_alloc=True)
    x = ctx.new_tensor_2d(F32, 64, n, name="x").set_input()
    w = external(ctx, [64, 64], "w")
    h = ops.mul_mat(ctx, w, x, name="h")
    h = ops.silu(ctx, h, name="act")
    y = ops.mul_mat(ctx, w, h, name="y")
    y = ops.add(ctx, y, x, name="res")
    out = ops.rms_norm(ctx, y, 1e-5, name="out").set_output()
    g = Graph()
    g.build_forward_expand(out)
    return g


def _addresses(g):
    return [t.data for t in (*g.leafs, *g.nodes)]


def test_reserve_then_alloc_gives_identical_addresses():
    bt = NumpyBufferType(alignment=64)
    al = GraphAllocator(bt)
    g0 = _mlp(8)
    al.reserve(g0)
    assert len(bt.allocated) == 1 and bt.allocated[0].nbytes == al.get_buffer_size(0)
    al.alloc_graph(g0)
    first = _addresses(g0)
    base = bt.allocated[0].ctypes.data
    assert all(a is not None for a in first)
    assert g0.get_tensor("x").data == base + al.placement(g0.get_tensor("x"))[2]
    for _ in range(3):
        g = _mlp(8)
        assert not al.needs_realloc(g)
        al.alloc_graph(g)
        assert _addresses(g) == first
        assert g.get_tensor("out").buffer is bt.allocated[0]
    assert len(bt.allocated) == 1             # no reallocation


def test_needs_realloc_when_a_shape_grows_not_when_it_shrinks():
    bt = NumpyBufferType(alignment=64)
    al = GraphAllocator(bt)
    al.reserve(_mlp(8))
    size8 = al.get_buffer_size(0)
    assert al.needs_realloc(_mlp(16))
    assert not al.needs_realloc(_mlp(4))
    g4 = _mlp(4)
    al.alloc_graph(g4)                         # the 8-token plan holds 4 tokens
    g8 = _mlp(8)
    al.alloc_graph(g8)
    assert _addresses(g4)[1:] == _addresses(g8)[1:]   # leaf 0 (w) is external in both
    assert al.get_buffer_size(0) == size8 and len(bt.allocated) == 1
    # one buffer type: alloc_graph re-plans by itself and grows the memory
    g16 = _mlp(16)
    al.alloc_graph(g16)
    assert al.get_buffer_size(0) == 2 * size8 and len(bt.allocated) == 2
    assert not al.needs_realloc(_mlp(16))
    # a graph with another node count needs a new plan too
    g = _mlp(8)
    g.build_forward_expand(ops.cont(Context(), g.get_tensor("out")))
    assert al.needs_realloc(g)


def test_several_buffer_types_are_not_replanned_automatically():
    al = GraphAllocator([NumpyBufferType("a"), NumpyBufferType("b")])
    g = _mlp(8)
    al.reserve(g, [1] * g.n_nodes, [0] * g.n_leafs)
    al.alloc_graph(_mlp(8))
    with pytest.raises(AllocatorError, match="reserve"):
        al.alloc_graph(_mlp(16))


def test_max_size_splits_a_buffer_into_chunks(ctx):
    bt = NumpyBufferType(alignment=32, max_size=512)
    x = ctx.new_tensor_1d(F32, 64, name="x").set_input()
    a = ops.cont(ctx, x, name="a")
    b = ops.cont(ctx, x, name="b")
    c = ops.add(ctx, ops.add(ctx, a, b, name="ab"), ops.cont(ctx, x, name="c0"), name="c")
    g, al, rep = plan(c, bt=bt)
    assert al.placement(x) == (0, 0, 0) and al.placement(a) == (0, 0, 256)
    assert al.placement(b) == (0, 1, 0)        # chunk 0 is full at 512
    assert al.placement(g.get_tensor("ab")) == (0, 0, 256)      # in place on a
    assert al.placement(g.get_tensor("c0")) == (0, 1, 0)        # b was freed after ab
    assert al.chunk_sizes(0) == rep.buffers[0].chunk_sizes == [512, 256]
    assert [m.nbytes for m in bt.allocated] == [512, 256]
    al.alloc_graph(g)
    assert b.data == bt.allocated[1].ctypes.data and b.buffer is bt.allocated[1]
    assert a.data == bt.allocated[0].ctypes.data + 256


def test_same_buffer_type_twice_shares_one_buffer():
    bt = BufferTypeSpec("cpu", 64)
    al = GraphAllocator([bt, bt])
    g = _mlp(8)
    al.reserve(g, [i % 2 for i in range(g.n_nodes)], [1] * g.n_leafs)
    assert al.get_buffer_size(1) == 0 and al.get_buffer_size(0) > 0
    rep = al.report()
    assert rep.buffers[1].shares == 0 and rep.buffers[0].peak == al.get_buffer_size(0)
    mem = aligned_array(al.get_buffer_size(0))
    al.alloc_graph(g, buffers=[None, mem])     # memory given under either id serves both
    assert all(t.buffer is mem for t in g.nodes if al.placement(t) is not None)
    with pytest.raises(AllocatorError, match="share a buffer type"):
        al.alloc_graph(g, buffers=[mem, aligned_array(al.get_buffer_size(0))])


def test_planning_only_then_explicit_memory():
    al = GraphAllocator(BufferTypeSpec("cpu", 64))
    g = _mlp(8)
    al.reserve(g)
    al.alloc_graph(g)
    assert all(t.data is None for t in g.nodes)        # the plan alone
    out = g.get_tensor("out")
    bid, chunk, off = al.placement(out)
    mem = aligned_array(al.get_buffer_size(0))
    al.alloc_graph(g, buffers=[mem])
    assert out.data == mem.ctypes.data + off and out.buffer is mem
    g2 = _mlp(8)                               # plan reused: placements by position
    al.alloc_graph(g2)
    assert [al.placement(t) for t in g2.nodes] == [al.placement(t) for t in g.nodes]
    assert all(al.placement(t) is not None for t in g2.nodes)
    assert al.placement(g2.get_tensor("w")) is None
    with pytest.raises(AllocatorError, match="needs"):
        al.alloc_graph(_mlp(8), buffers=[aligned_array(64)])


def test_reserve_size_measures_without_side_effects():
    bt = NumpyBufferType(alignment=64)
    al = GraphAllocator(bt)
    al.reserve(_mlp(8))
    small = al.get_buffer_size(0)
    assert al.reserve_size(_mlp(32)) == [4 * small]
    assert al.get_buffer_size(0) == small and len(bt.allocated) == 1
    assert not al.needs_realloc(_mlp(8))


# ---- bad input -----------------------------------------------------------------------------

def test_buffer_id_out_of_range_names_the_tensor():
    al = GraphAllocator([BufferTypeSpec("a"), BufferTypeSpec("b")])
    g = _mlp(8)
    ids = [0] * g.n_nodes
    ids[2] = 5
    with pytest.raises(AllocatorError, match=f"'{g.nodes[2].name}'.*buffer id 5"):
        al.reserve(g, node_buffer_ids=ids)
    with pytest.raises(AllocatorError, match="entries"):
        al.reserve(g, node_buffer_ids=[0])
    with pytest.raises(AllocatorError, match="leaf 0 'w'"):
        al.reserve(g, leaf_buffer_ids=[-1] + [0] * (g.n_leafs - 1))
    with pytest.raises(AllocatorError, match="out of range"):
        al.get_buffer_size(2)


def test_tensor_from_another_graphs_buffer_is_refused():
    first = GraphAllocator(NumpyBufferType())
    g1 = _mlp(8)
    first.reserve(g1)
    first.alloc_graph(g1)
    ctx = Context()
    x = g1.get_tensor("x")                     # an input in first's compute buffer
    g2 = Graph()
    g2.build_forward_expand(ops.cont(ctx, x, name="next").set_output())
    second = GraphAllocator(NumpyBufferType())
    with pytest.raises(AllocatorError, match="'x'.*another graph allocator"):
        second.reserve(g2)
    with pytest.raises(AllocatorError, match="'x'"):
        second.alloc_graph(g2)
    g3 = Graph()                               # an intermediate: every tensor under it is too
    g3.build_forward_expand(ops.cont(ctx, g1.get_tensor("act"), name="next2").set_output())
    with pytest.raises(AllocatorError, match="another graph allocator"):
        second.reserve(g3)
    first.reserve(g1)                          # its own tensors are simply planned again


def test_view_of_an_unplaced_tensor_outside_the_graph(ctx):
    cache = ctx.new_tensor_2d(F32, 64, 4, name="cache")     # no memory, not in the graph
    rows = ctx.new_tensor_2d(F32, 64, 1, name="rows").set_input()
    idx = ctx.new_tensor_1d(GGMLType.I32, 1, name="idx").set_input()
    w = ops.set_rows(ctx, cache, rows, idx, name="write")
    g = Graph()
    g.build_forward_expand(w)
    with pytest.raises(AllocatorError, match="'write'.*'cache'"):
        GraphAllocator(BufferTypeSpec()).reserve(g)
    cache.data = 0x2000                        # a KV cache with memory: fine
    al = GraphAllocator(BufferTypeSpec())
    al.reserve(g)
    assert al.placement(w) is None and al.placement(rows) == (0, 0, 0)


def test_buffer_type_without_alignment_is_refused():
    class Bad:
        name = "bad"
        max_size = None
    with pytest.raises(AllocatorError, match="alignment"):
        GraphAllocator(Bad())


# ---- a transformer-shaped graph ------------------------------------------------------------

def _bench():
    spec = importlib.util.spec_from_file_location("bench_alloc", REPO / "tools" / "bench_alloc.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_transformer_peak_is_at_most_one_layer_plus_inputs():
    bench = _bench()
    g, _ = bench.build_llama_graph(n_layer=24, n_embd=4096, n_tokens=512)
    assert g.n_nodes == 722
    al = GraphAllocator(BufferTypeSpec("cpu", alignment=64))
    al.reserve(g)
    rep = al.report()
    b = rep.buffers[0]
    largest, inputs, bound = bench.working_set_bound(g, 64)
    assert b.peak <= bound
    assert b.naive / b.peak > 20
    assert b.peak < b.peak_no_inplace < b.naive
    assert b.n_view_parent == 2 * 24            # rope of q and k through their reshape
    # 24 identical layers: the residual stream settles into two alternating places
    outs = {al.placement(g.get_tensor(f"l{i}.l_out")) for i in range(24)}
    assert len(outs) <= 2
