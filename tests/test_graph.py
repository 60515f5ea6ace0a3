"""Graph construction: topological order, dedup, use counts, leafs, eval order, limits."""
import random
import sys

import pytest

from pyggml import Context, EvalOrder, Graph, ops
from pyggml.errors import ContextFullError, GraphFullError
from pyggml.tensor import TensorFlag
from pyggml.types import GGMLType, Op


def _random_dag(seed: int, n_ops: int = 60):
    rng = random.Random(seed)
    ctx = Context()
    pool = [ctx.new_tensor_2d(GGMLType.F32, 8, 4, name=f"in{i}") for i in range(3)]
    consumers = {id(t): 0 for t in pool}
    for _ in range(n_ops):
        kind = rng.choice(["add", "mul", "silu", "scale", "sqr"])
        if kind in ("add", "mul"):
            a, b = rng.choice(pool), rng.choice(pool)
            t = getattr(ops, kind)(ctx, a, b)
        else:
            a = rng.choice(pool)
            t = ops.scale(ctx, a, 0.5) if kind == "scale" else getattr(ops, kind)(ctx, a)
        pool.append(t)
    outs = rng.sample(pool[3:], 3)
    return ctx, pool, outs


@pytest.mark.parametrize("seed", range(20))
@pytest.mark.parametrize("order", list(EvalOrder))
def test_random_dag_topological(seed, order):
    ctx, pool, outs = _random_dag(seed)
    g = Graph(order=order)
    for o in outs:
        g.build_forward_expand(o)
    pos = {id(t): i for i, t in enumerate(g.nodes)}
    leaf_ids = {id(t) for t in g.leafs}
    assert len(pos) == len(g.nodes), "a node appears twice"
    # every src comes before its consumer; every reachable tensor is in the graph exactly once
    expected_uses: dict[int, int] = {}
    for i, t in enumerate(g.nodes):
        for s in t.src:
            assert id(s) in leaf_ids or pos[id(s)] < i
            expected_uses[id(s)] = expected_uses.get(id(s), 0) + 1
    for t in g.nodes + g.leafs:
        assert g.use_count(t) == expected_uses.get(id(t), 0), t.name
    assert all(t.op == Op.NONE for t in g.leafs)
    assert all(t.op != Op.NONE for t in g.nodes)
    assert all(t.flags & TensorFlag.COMPUTE for t in g.nodes)
    for o in outs:
        assert id(o) in pos


def test_eval_order_changes_order_not_validity():
    ctx = Context()
    x = ctx.new_tensor_1d("f32", 4, name="x")
    a = ops.sqr(ctx, x, name="a")
    b = ops.silu(ctx, x, name="b")
    c = ops.add(ctx, a, b, name="c")
    l2r, r2l = Graph(order=EvalOrder.LEFT_TO_RIGHT), Graph(order=EvalOrder.RIGHT_TO_LEFT)
    l2r.build_forward_expand(c)
    r2l.build_forward_expand(c)
    assert [t.name for t in l2r.nodes] == ["a", "b", "c"]
    assert [t.name for t in r2l.nodes] == ["b", "a", "c"]


def test_shared_subexpression_once_and_use_counts():
    ctx = Context()
    x = ctx.new_tensor_1d("f32", 4, name="x")
    s = ops.sqr(ctx, x, name="s")
    y = ops.add(ctx, s, s, name="y")          # s consumed twice by one node
    z = ops.mul(ctx, y, s, name="z")          # and once more
    g = Graph()
    g.build_forward_expand(z)
    assert [t.name for t in g.nodes] == ["s", "y", "z"]
    assert g.use_count(s) == 3
    assert g.use_count(x) == 1
    assert g.use_count(z) == 0
    g.build_forward_expand(z)                 # expanding again adds nothing
    assert g.n_nodes == 3 and g.use_count(s) == 3


def test_leaf_node_split_param_and_auto_names():
    ctx = Context()
    w = ctx.new_tensor_2d("f32", 4, 4)        # unnamed weight
    p = ctx.new_tensor_1d("f32", 4, name="p").set_param()
    x = ctx.new_tensor_2d("f32", 4, 2, name="x").set_input()
    y = ops.add(ctx, ops.mul_mat(ctx, w, x), p)
    g = Graph()
    g.build_forward_expand(y)
    assert [t.name for t in g.leafs] == ["leaf_0", "x"]
    assert p in g.nodes and w in g.leafs         # a PARAM with op NONE is a node
    assert [t.name for t in g.nodes] == ["node_0", "p", "node_2"]


def test_use_counts_are_per_graph():
    ctx = Context()
    x = ctx.new_tensor_1d("f32", 4, name="x")
    a = ops.sqr(ctx, x)
    b = ops.sqr(ctx, a)
    g1, g2 = Graph(), Graph()
    g1.build_forward_expand(b)
    g2.build_forward_expand(a)
    assert g1.use_count(a) == 1 and g2.use_count(a) == 0
    assert g1.uid != g2.uid
    old = g1.uid
    assert g1.next_uid() != old


def test_subgraph_keeps_the_whole_graphs_use_counts():
    """A scheduler split is a subgraph: a node whose other consumer lies outside it still counts
    that consumer (a backend must not fuse it away), as ggml_graph_view shares use counts."""
    ctx = Context()
    x = ctx.new_tensor_1d("f32", 4, name="x")
    a = ops.sqr(ctx, x)
    b = ops.sqr(ctx, a)
    c = ops.add(ctx, b, a)
    g = Graph()
    g.build_forward_expand(c)
    sub = g.subgraph(g.nodes[:2], [x])
    assert sub.nodes == [a, b] and sub.leafs == [x]
    assert sub.use_count(a) == g.use_count(a) == 2
    assert sub.uid != g.uid


def test_graph_size_limit():
    ctx = Context()
    t = ctx.new_tensor_1d("f32", 4, name="x")
    for _ in range(10):
        t = ops.sqr(ctx, t)
    g = Graph(size=5)
    with pytest.raises(GraphFullError, match="more than 5 nodes"):
        g.build_forward_expand(t)


def test_deep_chain_100k_nodes_no_recursion_limit():
    ctx = Context()
    t = ctx.new_tensor_1d("f32", 4, name="x")
    for _ in range(100_000):
        t = ops.sqr(ctx, t)
    g = Graph(size=100_001)
    assert sys.getrecursionlimit() < 100_000
    g.build_forward_expand(t)
    assert g.n_nodes == 100_000 and g.n_leafs == 1
    assert g.nodes[-1] is t
    assert g.use_count(g.nodes[0]) == 1


def test_to_dot():
    ctx = Context()
    x = ctx.new_tensor_1d("f32", 4, name='x"q')
    y = ops.silu(ctx, x, name="y").set_output()
    g = Graph()
    g.build_forward_expand(y)
    dot = g.to_dot()
    assert dot.startswith("digraph") and "l0 -> n0" in dot and 'x\\"q' in dot
    assert "SILU" in dot and "lightyellow" in dot


def test_context_budget_error_says_how_much():
    from pyggml.context import TENSOR_OVERHEAD
    ctx = Context(mem_size=TENSOR_OVERHEAD * 2 + 10, name="small")
    ctx.new_tensor_1d("f32", 4, name="a")
    ctx.new_tensor_1d("f32", 4, name="b")
    with pytest.raises(ContextFullError) as e:
        ctx.new_tensor_1d("f32", 4, name="c")
    msg = str(e.value)
    assert "'small'" in msg and "'c'" in msg and f"needs {TENSOR_OVERHEAD}" in msg
    assert "10 of" in msg and f"mem_size >= {TENSOR_OVERHEAD * 3}" in msg


def test_context_arena_allocates_and_charges_data():
    ctx = Context(mem_size=4096, no_alloc=False)
    a = ctx.new_tensor_1d("f32", 100, name="a")      # 400 bytes -> 416 aligned
    b = ctx.new_tensor_1d("f32", 8, name="b")
    assert a.data is not None and b.data == a.data + 416
    v = ops.view_1d(ctx, a, 10, offset=40)
    assert v.data == a.data + 40
    with pytest.raises(ContextFullError, match="needs"):
        ctx.new_tensor_1d("f32", 1000, name="big")
