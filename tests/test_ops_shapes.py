"""Shape inference and checks of the graph-building ops; views share storage."""
import pytest

from pyggml import Context, ops
from pyggml.errors import ShapeError, UnsupportedTypeError
from pyggml.types import ROPE_MODE_NEOX, SORT_ORDER_DESC, GGMLType, Op


@pytest.fixture
def ctx():
    return Context()


def t2(ctx, type_, ne0, ne1, name):
    return ctx.new_tensor_2d(type_, ne0, ne1, name=name)


def _both_named(err, a, b):
    msg = str(err.value)
    assert f"'{a.name}'" in msg and f"'{b.name}'" in msg
    assert "[" + ", ".join(str(x) for x in a.ne) + "]" in msg
    assert "[" + ", ".join(str(x) for x in b.ne) + "]" in msg


def test_mul_mat_shapes_and_errors(ctx):
    w = ctx.new_tensor_3d("q4_0", 64, 10, 2, name="w")
    x = ctx.new_tensor_4d("f32", 64, 7, 4, 3, name="x")
    y = ops.mul_mat(ctx, w, x)
    assert y.ne == (10, 7, 4, 3) and y.type == GGMLType.F32 and y.op == Op.MUL_MAT
    bad = t2(ctx, "f32", 32, 7, "bad")
    with pytest.raises(ShapeError) as e:
        ops.mul_mat(ctx, w, bad)
    _both_named(e, w, bad)
    x3 = ctx.new_tensor_3d("f32", 64, 7, 3, name="x3")
    with pytest.raises(ShapeError, match="broadcast") as e:
        ops.mul_mat(ctx, w, x3)
    _both_named(e, w, x3)


def test_binary_broadcast(ctx):
    a = ctx.new_tensor_3d("f32", 8, 6, 4, name="a")
    b = ctx.new_tensor_1d("f32", 8, name="b")
    for f in (ops.add, ops.sub, ops.mul, ops.div):
        assert f(ctx, a, b).ne == a.ne
    c = t2(ctx, "f32", 8, 4, "c")
    with pytest.raises(ShapeError) as e:
        ops.add(ctx, a, c)
    _both_named(e, a, c)
    inpl = ops.add(ctx, a, b, inplace=True)
    assert inpl.view_src is a and inpl.op == Op.ADD


def test_unary_and_params(ctx):
    a = t2(ctx, "f32", 16, 3, "a")
    s = ops.scale(ctx, a, 0.25)
    assert s.op_param_f32(0) == 0.25
    n = ops.rms_norm(ctx, a, 1e-6)
    assert n.op == Op.RMS_NORM and abs(n.op_param_f32(0) - 1e-6) < 1e-12
    assert ops.norm(ctx, a, 1e-5).op == Op.NORM
    assert ops.gelu(ctx, a).op == Op.GELU and ops.silu(ctx, a).op == Op.SILU
    assert ops.sqrt(ctx, ops.sqr(ctx, a)).ne == a.ne
    assert ops.diag_mask_inf(ctx, a, 5).op_param_i32(0) == 5
    q = t2(ctx, "q8_0", 32, 3, "q")
    with pytest.raises(UnsupportedTypeError, match="Q8_0"):
        ops.silu(ctx, q)


def test_rope_params(ctx):
    a = ctx.new_tensor_3d("f32", 64, 4, 5, name="q")
    pos = ctx.new_tensor_1d("i32", 5, name="pos")
    r = ops.rope_ext(ctx, a, pos, n_dims=64, mode=ROPE_MODE_NEOX, n_ctx_orig=4096,
                     freq_base=1e6, freq_scale=0.125, ext_factor=1.0, attn_factor=0.9,
                     beta_fast=32, beta_slow=1)
    assert [r.op_param_i32(i) for i in range(5)] == [0, 64, 2, 0, 4096]
    assert [round(r.op_param_f32(i), 6) for i in range(5, 11)] == [1e6, 0.125, 1.0, 0.9, 32, 1]
    bad = ctx.new_tensor_1d("i32", 4, name="pos4")
    with pytest.raises(ShapeError) as e:
        ops.rope(ctx, a, bad, 64)
    _both_named(e, a, bad)
    with pytest.raises(ValueError, match="mode"):
        ops.rope(ctx, a, pos, 64, mode=1)


def test_soft_max_ext_mask_checks(ctx):
    a = ctx.new_tensor_3d("f32", 32, 5, 4, name="kq")
    m = ctx.new_tensor_2d("f16", 32, 8, name="mask")
    s = ops.soft_max_ext(ctx, a, m, scale=0.125)
    assert s.src == [a, m] and s.op_param_f32(0) == 0.125
    m_bad = ctx.new_tensor_2d("f32", 31, 8, name="mask_bad")
    with pytest.raises(ShapeError) as e:
        ops.soft_max_ext(ctx, a, m_bad)
    _both_named(e, a, m_bad)


def test_get_rows_set_rows_cpy(ctx):
    emb = t2(ctx, "q4_k", 256, 1000, "emb")
    ids = ctx.new_tensor_1d("i32", 7, name="ids")
    r = ops.get_rows(ctx, emb, ids)
    assert r.ne == (256, 7, 1, 1) and r.type == GGMLType.F32
    cache = t2(ctx, "f16", 64, 100, "cache")
    rows = t2(ctx, "f32", 64, 3, "rows")
    idx = ctx.new_tensor_1d("i32", 3, name="idx")
    w = ops.set_rows(ctx, cache, rows, idx)
    assert w.view_src is cache and w.src == [rows, idx] and w.op == Op.SET_ROWS
    idx_bad = ctx.new_tensor_1d("i32", 4, name="idx_bad")
    with pytest.raises(ShapeError) as e:
        ops.set_rows(ctx, cache, rows, idx_bad)
    _both_named(e, rows, idx_bad)
    dst = ops.view_1d(ctx, cache, 192, offset=64 * 2 * 10)
    c = ops.cpy(ctx, rows, dst)
    assert c.view_src is cache and c.view_offs == 1280 and c.op == Op.CPY
    with pytest.raises(ShapeError) as e:
        ops.cpy(ctx, rows, cache)
    _both_named(e, rows, cache)


def test_views_share_storage(ctx):
    a = ctx.new_tensor_3d("f32", 8, 6, 4, name="a")
    v = ops.view_2d(ctx, a, 4, 6, a.nb[1], offset=16)
    assert v.view_src is a and v.view_offs == 16 and v.nb[1] == a.nb[1]
    vv = ops.view_1d(ctx, v, 2, offset=8)       # a view of a view points at the owner
    assert vv.view_src is a and vv.view_offs == 24
    r = ops.reshape_2d(ctx, a, 48, 4)
    assert r.view_src is a and r.ne == (48, 4, 1, 1)
    p = ops.permute(ctx, a, 0, 2, 1, 3)
    assert p.view_src is a and p.ne == (8, 4, 6, 1) and p.nb[1] == a.nb[2] and p.is_permuted()
    t = ops.transpose(ctx, a)
    assert t.ne == (6, 8, 4, 1) and t.is_transposed() and t.op == Op.TRANSPOSE
    with pytest.raises(ShapeError, match="outside its source"):
        ops.view_1d(ctx, a, 8 * 6 * 4, offset=4)
    with pytest.raises(ShapeError, match="contiguous"):
        ops.reshape_1d(ctx, t, 192)
    with pytest.raises(ShapeError) as e:
        ops.reshape_2d(ctx, a, 7, 7)
    assert "'a'" in str(e.value)
    c = ops.cont(ctx, t)
    assert c.ne == t.ne and c.is_contiguous() and c.view_src is None


def test_quantized_strides_and_padding_rules(ctx):
    w = t2(ctx, "q4_k", 512, 3, "w")
    assert w.nb == (144, 288, 864, 864) and w.nbytes() == 864
    with pytest.raises(ShapeError, match="Q4_K.*ne\\[0\\]=100.*256"):
        t2(ctx, "q4_k", 100, 3, "bad")
    row = ops.view_2d(ctx, w, 512, 1, w.nb[1], offset=w.nb[1])
    assert row.nbytes() == 288 and row.view_offs == 288
    with pytest.raises(ShapeError, match="block size"):
        ops.view_1d(ctx, w, 100)


def test_concat(ctx):
    a = ctx.new_tensor_3d("f32", 8, 6, 4, name="a")
    b = ctx.new_tensor_3d("f32", 8, 2, 4, name="b")
    c = ops.concat(ctx, a, b, dim=1)
    assert c.ne == (8, 8, 4, 1) and c.op_param_i32(0) == 1
    with pytest.raises(ShapeError) as e:
        ops.concat(ctx, a, b, dim=0)
    _both_named(e, a, b)


def test_flash_attn_ext_shape(ctx):
    q = ctx.new_tensor_4d("f32", 256, 7, 4, 1, name="q")
    k = ctx.new_tensor_4d("f16", 256, 512, 1, 1, name="k")
    v = ctx.new_tensor_4d("f16", 256, 512, 1, 1, name="v")
    m = ctx.new_tensor_2d("f16", 512, 8, name="mask")
    o = ops.flash_attn_ext(ctx, q, k, v, m, scale=0.0625)
    assert o.ne == (256, 4, 7, 1) and o.type == GGMLType.F32
    k_bad = ctx.new_tensor_4d("f16", 128, 512, 1, 1, name="k_bad")
    with pytest.raises(ShapeError) as e:
        ops.flash_attn_ext(ctx, q, k_bad, v)
    _both_named(e, q, k_bad)


def test_mul_mat_id_shapes_and_errors(ctx):
    w = ctx.new_tensor_3d("q4_0", 64, 16, 4, name="exps")
    b = ctx.new_tensor_3d("f32", 64, 1, 5, name="x")
    ids = t2(ctx, "i32", 2, 5, "ids")
    y = ops.mul_mat_id(ctx, w, b, ids)
    assert y.ne == (16, 2, 5, 1) and y.type == GGMLType.F32 and y.op == Op.MUL_MAT_ID
    assert y.src == [w, b, ids]
    b2 = ctx.new_tensor_3d("f32", 64, 2, 5, name="x2")          # one row per slot
    assert ops.mul_mat_id(ctx, w, b2, ids).ne == (16, 2, 5, 1)
    bad = [
        (w, b, t2(ctx, "f32", 2, 5, "fids"), "ids must be I32"),
        (w, b, t2(ctx, "i32", 2, 4, "ids4"), r"ids.ne\[1\]=4 \(tokens\) must equal b.ne\[2\]=5"),
        (w, ctx.new_tensor_3d("f32", 32, 1, 5, name="x32"), ids, "inner dimensions differ"),
        (w, ctx.new_tensor_3d("f32", 64, 3, 5, name="x3"), ids,
         r"must be a multiple of b.ne\[1\]=3"),
        (ctx.new_tensor_4d("q4_0", 64, 16, 2, 2, name="w4"), b, ids, "as must be 3-D"),
        (w, b, ctx.new_tensor_3d("i32", 2, 5, 2, name="ids3"), "ids must be 2-D"),
        (w, ctx.new_tensor_4d("f32", 64, 1, 5, 2, name="x4"), ids, "b must be 3-D"),
    ]
    for ww, bb, ii, msg in bad:
        with pytest.raises(ShapeError, match=msg) as e:
            ops.mul_mat_id(ctx, ww, bb, ii)
        _both_named(e, ww, ii)
        _both_named(e, bb, ii)


def test_router_ops_shapes(ctx):
    logits = t2(ctx, "f32", 60, 7, "logits")
    s = ops.argsort(ctx, logits, SORT_ORDER_DESC)
    assert s.ne == logits.ne and s.type == GGMLType.I32 and s.op_param_i32(0) == SORT_ORDER_DESC
    top = ops.argsort_top_k(ctx, logits, 8)
    assert top.ne == (8, 7, 1, 1) and top.op == Op.VIEW and top.nb[1] == 60 * 4
    assert top.view_src.op == Op.ARGSORT
    r = ops.sum_rows(ctx, ctx.new_tensor_3d("f32", 8, 7, 3, name="w"))
    assert r.ne == (1, 7, 3, 1) and r.op == Op.SUM_ROWS
    c = ops.clamp(ctx, logits, -1.0, float("inf"))
    assert c.op == Op.CLAMP and c.op_param_f32(0) == -1.0 and c.op_param_f32(1) == float("inf")
    assert ops.sigmoid(ctx, logits).op == Op.SIGMOID
    with pytest.raises(UnsupportedTypeError, match="argsort: a must be F32"):
        ops.argsort(ctx, t2(ctx, "f16", 4, 4, "h"))
    with pytest.raises(UnsupportedTypeError, match="sum_rows"):
        ops.sum_rows(ctx, t2(ctx, "i32", 4, 4, "i"))
    with pytest.raises(ShapeError, match="k=0"):
        ops.argsort_top_k(ctx, logits, 0)
