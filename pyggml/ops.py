"""Graph-building ops. Each builds a lazy tensor (nothing is computed or allocated), checks shapes
and raises ShapeError naming both shapes when they cannot combine.

Conventions (ggml's):
- ne[0] is the innermost dimension; a 2-D weight with ne=[K, N] is a numpy (N, K) array.
- mul_mat(a, b) with a.ne=[K, N, ...] and b.ne=[K, M, ...] gives ne=[N, M, ...]:
  out[m][n] = dot(a_row_n, b_row_m), i.e. numpy `b @ a.T`. a broadcasts over b's ne[2], ne[3].
- Binary ops (add, sub, mul, div) broadcast b over a: each a.ne[i] must be a multiple of b.ne[i].
- View ops (view_*, reshape_*, permute, transpose) return tensors that share their source's memory.
- op_params are 16 int32 slots; float parameters are stored bit-cast (see Tensor.set_op_params_f32).
"""

from __future__ import annotations

from pyggml.context import Context
from pyggml.errors import InvalidArgumentError, ShapeError, UnsupportedTypeError
from pyggml.tensor import Tensor, contiguous_strides
from pyggml.types import (
    ROPE_MODE_NEOX,
    ROPE_MODE_NORMAL,
    SORT_ORDER_ASC,
    SORT_ORDER_DESC,
    GGMLType,
    Op,
    as_type,
    traits,
)


def _ne(t: Tensor) -> str:
    return f"'{t.name or '?'}' {t.type.name}[{', '.join(str(x) for x in t.ne)}]"


def _fail(op: str, msg: str, *tensors: Tensor) -> ShapeError:
    return ShapeError(f"{op}: {msg} (" + ", ".join(_ne(t) for t in tensors) + ")")


def _node(ctx: Context, op: Op, type_, ne, srcs, name: str = "") -> Tensor:
    t = ctx.new_tensor(type_, ne, name=name)
    t.op = op
    t.src = list(srcs)
    return t


def _view_node(ctx: Context, op: Op, a: Tensor, ne, nb, offs: int, name: str = "") -> Tensor:
    t = ctx.new_tensor(a.type, ne, view_src=a, view_offs=offs, nb=nb, name=name)
    t.op = op
    t.src = [a]
    return t


def can_repeat(b: Tensor, a: Tensor) -> bool:
    """b can be broadcast to a's shape (each a.ne[i] a multiple of b.ne[i])."""
    return all(b.ne[i] > 0 and a.ne[i] % b.ne[i] == 0 for i in range(4)) or a.nelements() == 0


# ---- matrix product --------------------------------------------------------------------------

def mul_mat(ctx: Context, a: Tensor, b: Tensor, name: str = "") -> Tensor:
    """out = b · aᵀ. a: [K, N, A2, A3] (weights, any type), b: [K, M, B2, B3] with B2 % A2 == 0
    and B3 % A3 == 0 → F32 [N, M, B2, B3]."""
    if a.ne[0] != b.ne[0]:
        raise _fail("mul_mat", f"inner dimensions differ: a.ne[0]={a.ne[0]} vs b.ne[0]={b.ne[0]}",
                    a, b)
    if b.ne[2] % a.ne[2] or b.ne[3] % a.ne[3]:
        raise _fail("mul_mat", "a cannot be broadcast over b's dims 2 and 3", a, b)
    if a.is_transposed():
        raise _fail("mul_mat", "a must not be transposed (make it contiguous with cont)", a, b)
    return _node(ctx, Op.MUL_MAT, GGMLType.F32, [a.ne[1], b.ne[1], b.ne[2], b.ne[3]], [a, b], name)


def mul_mat_id(ctx: Context, as_: Tensor, b: Tensor, ids: Tensor, name: str = "") -> Tensor:
    """Per-token expert matrix products (ggml_mul_mat_id, the FFN of a mixture of experts).

    as_: stacked expert weights [K, N, n_expert] (any type mul_mat takes);
    b: F32 activations [K, n_b, n_tokens] with n_used % n_b == 0 (n_b is 1 or n_used);
    ids: I32 [n_used, n_tokens], the expert of each slot (may be a strided view, e.g. the
    result of argsort_top_k). Result F32 [N, n_used, n_tokens]:
    out[:, i, t] = as_[:, :, ids[i, t]] · b[:, i % n_b, t]."""
    op = "mul_mat_id"
    if ids.type != GGMLType.I32:
        raise _fail(op, "ids must be I32", as_, b, ids)
    if as_.ne[3] != 1:
        raise _fail(op, "as must be 3-D [K, N, n_expert] (one matrix per expert)", as_, b, ids)
    if b.ne[3] != 1:
        raise _fail(op, "b must be 3-D [K, n_used or 1, n_tokens]", as_, b, ids)
    if ids.ne[2] != 1 or ids.ne[3] != 1:
        raise _fail(op, "ids must be 2-D [n_used, n_tokens]", as_, b, ids)
    if ids.ne[1] != b.ne[2]:
        raise _fail(op, f"ids.ne[1]={ids.ne[1]} (tokens) must equal b.ne[2]={b.ne[2]}",
                    as_, b, ids)
    if as_.ne[0] != b.ne[0]:
        raise _fail(op, f"inner dimensions differ: as.ne[0]={as_.ne[0]} vs b.ne[0]={b.ne[0]}",
                    as_, b, ids)
    if b.ne[1] <= 0 or ids.ne[0] % b.ne[1]:
        raise _fail(op, f"ids.ne[0]={ids.ne[0]} (experts per token) must be a multiple of "
                    f"b.ne[1]={b.ne[1]}", as_, b, ids)
    if as_.is_transposed():
        raise _fail(op, "as must not be transposed", as_, b, ids)
    return _node(ctx, Op.MUL_MAT_ID, GGMLType.F32, [as_.ne[1], ids.ne[0], b.ne[2], 1],
                 [as_, b, ids], name)


# ---- element-wise binary ---------------------------------------------------------------------

def _binary(ctx: Context, op: Op, a: Tensor, b: Tensor, inplace: bool, name: str) -> Tensor:
    if not can_repeat(b, a):
        raise _fail(op.name.lower(), "b cannot be broadcast to a (a.ne[i] % b.ne[i] != 0)", a, b)
    if b.type not in (GGMLType.F32, GGMLType.F16, GGMLType.BF16):
        raise UnsupportedTypeError(f"{op.name.lower()}: b must be a float type, got {_ne(b)}")
    if inplace:
        t = ctx.view_tensor(a, name=name)
        t.op, t.src = op, [a, b]
        return t
    return _node(ctx, op, a.type, a.ne, [a, b], name)


def add(ctx, a, b, inplace=False, name=""):
    """a + b, b broadcast over a. Result has a's type and shape."""
    return _binary(ctx, Op.ADD, a, b, inplace, name)


def sub(ctx, a, b, inplace=False, name=""):
    """a - b, b broadcast over a."""
    return _binary(ctx, Op.SUB, a, b, inplace, name)


def mul(ctx, a, b, inplace=False, name=""):
    """a * b element-wise, b broadcast over a."""
    return _binary(ctx, Op.MUL, a, b, inplace, name)


def div(ctx, a, b, inplace=False, name=""):
    """a / b element-wise, b broadcast over a."""
    return _binary(ctx, Op.DIV, a, b, inplace, name)


# ---- element-wise unary ----------------------------------------------------------------------

def _unary(ctx: Context, op: Op, a: Tensor, inplace: bool, name: str) -> Tensor:
    if a.type not in (GGMLType.F32, GGMLType.F16, GGMLType.BF16):
        raise UnsupportedTypeError(f"{op.name.lower()}: needs a float tensor, got {_ne(a)}")
    if inplace:
        t = ctx.view_tensor(a, name=name)
        t.op, t.src = op, [a]
        return t
    return _node(ctx, op, a.type, a.ne, [a], name)


def sqr(ctx, a, inplace=False, name=""):
    return _unary(ctx, Op.SQR, a, inplace, name)


def sqrt(ctx, a, inplace=False, name=""):
    return _unary(ctx, Op.SQRT, a, inplace, name)


def gelu(ctx, a, inplace=False, name=""):
    """GELU, tanh approximation (as ggml)."""
    return _unary(ctx, Op.GELU, a, inplace, name)


def silu(ctx, a, inplace=False, name=""):
    return _unary(ctx, Op.SILU, a, inplace, name)


def tanh(ctx, a, inplace=False, name=""):
    return _unary(ctx, Op.TANH, a, inplace, name)


def sigmoid(ctx, a, inplace=False, name=""):
    """1 / (1 + exp(-a)) element-wise."""
    return _unary(ctx, Op.SIGMOID, a, inplace, name)


def clamp(ctx, a, min_: float, max_: float, inplace=False, name=""):
    """max(min(a, max_), min_) element-wise (NaN becomes max_, as ggml's MIN/MAX macros do).
    op_params: f32 min, f32 max."""
    t = _unary(ctx, Op.CLAMP, a, inplace, name)
    t.set_op_params_f32(0, min_)
    t.set_op_params_f32(1, max_)
    return t


def scale(ctx, a, s: float, bias: float = 0.0, inplace=False, name=""):
    """a * s + bias. op_params: f32 s, f32 bias."""
    t = _unary(ctx, Op.SCALE, a, inplace, name)
    t.set_op_params_f32(0, s)
    t.set_op_params_f32(1, bias)
    return t


def _norm(ctx, op, a, eps, inplace, name):
    if eps < 0:
        raise InvalidArgumentError(f"{op.name.lower()}: eps must be >= 0, got {eps}")
    t = _unary(ctx, op, a, inplace, name)
    t.set_op_params_f32(0, eps)
    return t


def rms_norm(ctx, a, eps: float, inplace=False, name=""):
    """Each row (ne[0]) divided by sqrt(mean(x²) + eps). op_params: f32 eps."""
    return _norm(ctx, Op.RMS_NORM, a, eps, inplace, name)


def norm(ctx, a, eps: float, inplace=False, name=""):
    """Each row (ne[0]) minus its mean, divided by sqrt(var + eps). op_params: f32 eps."""
    return _norm(ctx, Op.NORM, a, eps, inplace, name)


def diag_mask_inf(ctx, a, n_past: int, inplace=False, name=""):
    """Sets a[i, j] = -inf where column i > n_past + row j (causal mask). op_params: i32 n_past."""
    t = _unary(ctx, Op.DIAG_MASK_INF, a, inplace, name)
    t.set_op_params_i32(0, n_past)
    return t


# ---- reductions and sorting -------------------------------------------------------------------

def sum_rows(ctx, a, name=""):
    """Sum of each row. a: F32 [ne0, ne1, ne2, ne3] → F32 [1, ne1, ne2, ne3]."""
    if a.type != GGMLType.F32:
        raise UnsupportedTypeError(f"sum_rows: a must be F32, got {_ne(a)}")
    return _node(ctx, Op.SUM_ROWS, GGMLType.F32, [1, a.ne[1], a.ne[2], a.ne[3]], [a], name)


def argsort(ctx, a, order: int = SORT_ORDER_ASC, name=""):
    """Indices that sort each row of a. a: F32 [n, ...] → I32 [n, ...]. op_params: i32 order
    (SORT_ORDER_ASC / SORT_ORDER_DESC). Equal values keep their index order and NaNs go last,
    so the result is one defined permutation on every backend (ggml's std::sort leaves ties
    unspecified)."""
    if order not in (SORT_ORDER_ASC, SORT_ORDER_DESC):
        raise ValueError(f"argsort: order must be {SORT_ORDER_ASC} (ascending) or "
                         f"{SORT_ORDER_DESC} (descending), got {order}")
    if a.type != GGMLType.F32:
        raise UnsupportedTypeError(f"argsort: a must be F32, got {_ne(a)}")
    if a.ne[0] >= 1 << 31:
        raise _fail("argsort", "rows longer than 2^31 - 1", a)
    t = _node(ctx, Op.ARGSORT, GGMLType.I32, a.ne, [a], name)
    t.set_op_params_i32(0, order)
    return t


def argsort_top_k(ctx, a, k: int, name=""):
    """Indices of the k largest values of each row, largest first (ggml_argsort_top_k: a
    descending argsort and a view of its first k columns, so the result is strided).
    a: F32 [n, ...] → I32 [k, ...] view."""
    if not 0 < k <= a.ne[0]:
        raise _fail("argsort_top_k", f"k={k} must be in [1, a.ne[0]={a.ne[0]}]", a)
    s = argsort(ctx, a, SORT_ORDER_DESC, name=f"{name} (argsort)" if name else "")
    return view_4d(ctx, s, k, s.ne[1], s.ne[2], s.ne[3], s.nb[1], s.nb[2], s.nb[3], 0, name=name)


# ---- attention pieces ------------------------------------------------------------------------

def soft_max_ext(ctx, a, mask: Tensor | None = None, scale: float = 1.0, max_bias: float = 0.0,
                 name="", sinks: Tensor | None = None):
    """softmax(a * scale + mask) over ne[0]. a: [n_kv, n_q, H, B]; mask (F16/F32): [n_kv, >=n_q,
    H % m2 == 0, B % m3 == 0]. op_params: f32 scale, f32 max_bias (ALiBi; 0 = off).
    sinks: F32 [H], one more logit per head (src[2], gpt-oss's attention sinks, as ggml's
    soft_max_add_sinks): it joins the max and the sum, its weight is dropped."""
    if a.type != GGMLType.F32:
        raise UnsupportedTypeError(f"soft_max_ext: a must be F32, got {_ne(a)}")
    srcs = [a]
    if mask is not None:
        if mask.type not in (GGMLType.F32, GGMLType.F16):
            raise UnsupportedTypeError(f"soft_max_ext: mask must be F16 or F32, got {_ne(mask)}")
        if not mask.is_contiguous():
            raise _fail("soft_max_ext", "mask must be contiguous", a, mask)
        if mask.ne[0] != a.ne[0] or mask.ne[1] < a.ne[1]:
            raise _fail("soft_max_ext", "mask needs ne[0] == a.ne[0] and ne[1] >= a.ne[1]",
                        a, mask)
        if a.ne[2] % mask.ne[2] or a.ne[3] % mask.ne[3]:
            raise _fail("soft_max_ext", "mask cannot be broadcast over a's dims 2 and 3", a, mask)
        srcs.append(mask)
    if max_bias > 0 and mask is None:
        raise InvalidArgumentError(f"soft_max_ext: max_bias={max_bias} > 0 (ALiBi) needs a mask")
    if sinks is not None:
        _check_sinks("soft_max_ext", sinks, a.ne[2])
        srcs += [None] * (2 - len(srcs)) + [sinks]
    t = _node(ctx, Op.SOFT_MAX, GGMLType.F32, a.ne, srcs, name)
    t.set_op_params_f32(0, scale)
    t.set_op_params_f32(1, max_bias)
    return t


def rope_ext(ctx, a, pos: Tensor, freq_factors: Tensor | None = None, *, n_dims: int,
             mode: int = ROPE_MODE_NORMAL, n_ctx_orig: int = 0, freq_base: float = 10000.0,
             freq_scale: float = 1.0, ext_factor: float = 0.0, attn_factor: float = 1.0,
             beta_fast: float = 32.0, beta_slow: float = 1.0, name="") -> Tensor:
    """Rotary position embedding. a: [D, H, T, B]; pos: I32 [T]; freq_factors: F32 [n_dims/2].

    op_params as ggml stores them: i32 [0]=0 (n_past), [1]=n_dims, [2]=mode, [3]=0,
    [4]=n_ctx_orig; f32 [5]=freq_base, [6]=freq_scale, [7]=ext_factor, [8]=attn_factor,
    [9]=beta_fast, [10]=beta_slow. mode: 0 normal (adjacent pairs), 2 NEOX (halves)."""
    if mode not in (ROPE_MODE_NORMAL, ROPE_MODE_NEOX):
        raise InvalidArgumentError(f"rope: mode must be {ROPE_MODE_NORMAL} (normal) or "
                                   f"{ROPE_MODE_NEOX} (neox), got {mode}")
    if pos.type != GGMLType.I32 or pos.n_dims != 1:
        raise _fail("rope", "pos must be a 1-D I32 tensor", a, pos)
    if pos.ne[0] != a.ne[2]:
        raise _fail("rope", f"pos.ne[0]={pos.ne[0]} must equal a.ne[2]={a.ne[2]}", a, pos)
    if n_dims <= 0 or n_dims % 2 or n_dims > a.ne[0]:
        raise _fail("rope", f"n_dims={n_dims} must be even and in (0, a.ne[0]]", a)
    srcs = [a, pos]
    if freq_factors is not None:
        if freq_factors.type != GGMLType.F32 or freq_factors.ne[0] < n_dims // 2:
            raise _fail("rope", f"freq_factors must be F32 with ne[0] >= n_dims/2={n_dims // 2}",
                        a, freq_factors)
        srcs.append(freq_factors)
    if a.type not in (GGMLType.F32, GGMLType.F16):
        raise UnsupportedTypeError(f"rope: a must be F32 or F16, got {_ne(a)}")
    t = _node(ctx, Op.ROPE, a.type, a.ne, srcs, name)
    for i, v in enumerate((0, n_dims, mode, 0, n_ctx_orig)):
        t.set_op_params_i32(i, v)
    for i, v in enumerate((freq_base, freq_scale, ext_factor, attn_factor, beta_fast, beta_slow)):
        t.set_op_params_f32(5 + i, v)
    return t


def rope(ctx, a, pos, n_dims: int, mode: int = ROPE_MODE_NORMAL, name="") -> Tensor:
    """rope_ext with ggml's defaults (base 10000, no scaling)."""
    return rope_ext(ctx, a, pos, n_dims=n_dims, mode=mode, name=name)


def _check_sinks(op: str, sinks: Tensor, n_head: int) -> None:
    if sinks.type != GGMLType.F32 or sinks.ne[0] < n_head or not sinks.is_contiguous():
        raise _fail(op, f"sinks must be a contiguous F32 [>= {n_head}] (one logit per head)",
                    sinks)


def flash_attn_ext(ctx, q, k, v, mask: Tensor | None = None, scale: float = 1.0,
                   max_bias: float = 0.0, logit_softcap: float = 0.0, name="",
                   sinks: Tensor | None = None) -> Tensor:
    """Fused attention softmax(q·kᵀ·scale + mask)·v without the score matrix.
    q: [D, n_q, H, B], k: [D, n_kv, Hkv, B], v: [Dv, n_kv, Hkv, B], H % Hkv == 0;
    mask: [n_kv, >= n_q, ...]. Result F32 [Dv, H, n_q, B] (heads before tokens, as ggml).
    op_params: f32 scale, f32 max_bias, f32 logit_softcap. sinks: F32 [H] (src[4]), one more
    logit per head in the softmax whose value row is zero (gpt-oss)."""
    if k.ne[0] != q.ne[0]:
        raise _fail("flash_attn_ext", "k.ne[0] must equal q.ne[0] (head size)", q, k)
    if v.ne[1] != k.ne[1] or v.ne[2] != k.ne[2]:
        raise _fail("flash_attn_ext", "v must have k's n_kv (ne[1]) and heads (ne[2])", k, v)
    if q.ne[2] % k.ne[2] or q.ne[3] != k.ne[3]:
        raise _fail("flash_attn_ext", "q heads must be a multiple of k heads, same batch", q, k)
    srcs = [q, k, v]
    if mask is not None:
        if mask.ne[0] != k.ne[1] or mask.ne[1] < q.ne[1]:
            raise _fail("flash_attn_ext", "mask needs ne[0] == n_kv and ne[1] >= n_q", q, k, mask)
        srcs.append(mask)
    if sinks is not None:
        _check_sinks("flash_attn_ext", sinks, q.ne[2])
        srcs += [None] * (4 - len(srcs)) + [sinks]
    t = _node(ctx, Op.FLASH_ATTN_EXT, GGMLType.F32, [v.ne[0], q.ne[2], q.ne[1], q.ne[3]], srcs,
              name)
    t.set_op_params_f32(0, scale)
    t.set_op_params_f32(1, max_bias)
    t.set_op_params_f32(2, logit_softcap)
    return t


# ---- rows ------------------------------------------------------------------------------------

def get_rows(ctx, a, b, name=""):
    """Rows of a picked by I32 indices b. a: [E, R, A2, A3], b: I32 [n, A2, A3'] →
    F32 [E, n, b.ne[1], b.ne[2]] (rows dequantized)."""
    if b.type != GGMLType.I32:
        raise _fail("get_rows", "indices must be I32", a, b)
    if a.ne[2] != b.ne[1] or b.ne[3] != 1:
        raise _fail("get_rows", "b.ne[1] must equal a.ne[2] and b.ne[3] must be 1", a, b)
    out_type = GGMLType.I32 if a.type == GGMLType.I32 else GGMLType.F32
    return _node(ctx, Op.GET_ROWS, out_type, [a.ne[0], b.ne[0], b.ne[1], b.ne[2]], [a, b], name)


def set_rows(ctx, a, b, c, name=""):
    """Writes the rows of b into a at I32 row indices c (KV-cache writes); returns a view of a.
    a: [E, R, ...] (any type with a from-float conversion), b: F32 [E, n, B2, B3], c: I32 [n, ...]
    with B2 % c.ne[1] == 0."""
    if b.ne[0] != a.ne[0]:
        raise _fail("set_rows", "b.ne[0] must equal a.ne[0]", a, b)
    if c.type != GGMLType.I32:
        raise _fail("set_rows", "indices must be I32", a, c)
    if c.ne[0] != b.ne[1]:
        raise _fail("set_rows", "c.ne[0] must equal b.ne[1] (one index per row)", b, c)
    if b.ne[2] % c.ne[1] or b.ne[3] % c.ne[2] or a.ne[2] != b.ne[2] or a.ne[3] != b.ne[3]:
        raise _fail("set_rows", "dims 2 and 3 of a, b and c must agree", a, b, c)
    if b.type != GGMLType.F32:
        raise UnsupportedTypeError(f"set_rows: b must be F32, got {_ne(b)}")
    t = ctx.view_tensor(a, name=name)
    t.op, t.src = Op.SET_ROWS, [b, c]
    return t


# ---- copies ----------------------------------------------------------------------------------

def cpy(ctx, a, b, name=""):
    """Copies a into b (converting type); returns a view of b. Element counts must match."""
    if a.nelements() != b.nelements():
        raise _fail("cpy", "element counts differ", a, b)
    t = ctx.view_tensor(b, name=name or (f"{b.name} (copy of {a.name})" if b.name else ""))
    t.op, t.src = Op.CPY, [a, b]
    return t


def cont(ctx, a, ne=None, name=""):
    """A contiguous copy of a (optionally reshaped to `ne` with the same element count)."""
    ne = list(a.ne) if ne is None else list(ne) + [1] * (4 - len(ne))
    if ne[0] * ne[1] * ne[2] * ne[3] != a.nelements():
        raise _fail("cont", f"cannot make {ne} from {a.nelements()} elements", a)
    return _node(ctx, Op.CONT, a.type, ne, [a], name)


def cast(ctx, a, type_, name=""):
    """A contiguous copy of a converted to `type_` (ggml_cast): float <-> float, F32 -> a block
    type, or a block type -> F32 (dequantized; rows of whole blocks)."""
    return _node(ctx, Op.CONT, as_type(type_), list(a.ne), [a], name)


def concat(ctx, a, b, dim: int, name=""):
    """a and b joined along `dim`; all other dims must agree. op_params: i32 dim."""
    if not 0 <= dim < 4:
        raise InvalidArgumentError(f"concat: dim must be 0..3, got {dim}")
    if a.type != b.type:
        raise _fail("concat", "types differ", a, b)
    for i in range(4):
        if i != dim and a.ne[i] != b.ne[i]:
            raise _fail("concat", f"ne[{i}] differs ({a.ne[i]} vs {b.ne[i]})", a, b)
    ne = list(a.ne)
    ne[dim] += b.ne[dim]
    t = _node(ctx, Op.CONCAT, a.type, ne, [a, b], name)
    t.set_op_params_i32(0, dim)
    return t


# ---- views -----------------------------------------------------------------------------------

def _view(ctx, a, ne, nb_tail, offset, name):
    tr = traits(a.type)
    ne = list(ne) + [1] * (4 - len(ne))
    nb = [tr.type_size] + list(nb_tail)
    # strides of unspecified dims: contiguous after the last given one
    while len(nb) < 4:
        i = len(nb)
        nb.append(nb[i - 1] * (ne[i - 1] if i > 1 else ne[0] // tr.block_size))
    if ne[0] % tr.block_size:
        raise _fail("view", f"ne[0]={ne[0]} is not a multiple of {a.type.name}'s block size "
                    f"{tr.block_size}", a)
    return _view_node(ctx, Op.VIEW, a, ne, nb, offset, name)


def view_1d(ctx, a, ne0, offset=0, name=""):
    """ne0 elements of a starting at byte `offset`."""
    return _view(ctx, a, [ne0], [], offset, name)


def view_2d(ctx, a, ne0, ne1, nb1, offset=0, name=""):
    return _view(ctx, a, [ne0, ne1], [nb1], offset, name)


def view_3d(ctx, a, ne0, ne1, ne2, nb1, nb2, offset=0, name=""):
    return _view(ctx, a, [ne0, ne1, ne2], [nb1, nb2], offset, name)


def view_4d(ctx, a, ne0, ne1, ne2, ne3, nb1, nb2, nb3, offset=0, name=""):
    return _view(ctx, a, [ne0, ne1, ne2, ne3], [nb1, nb2, nb3], offset, name)


def reshape(ctx, a, ne, name=""):
    """a with shape `ne` (same element count); a must be contiguous."""
    ne = list(ne) + [1] * (4 - len(ne))
    if not a.is_contiguous():
        raise _fail("reshape", "a must be contiguous (use cont first)", a)
    if ne[0] * ne[1] * ne[2] * ne[3] != a.nelements():
        raise _fail("reshape", f"cannot reshape {a.nelements()} elements to {ne}", a)
    return _view_node(ctx, Op.RESHAPE, a, ne, contiguous_strides(a.type, ne), 0, name)


def reshape_1d(ctx, a, ne0, name=""):
    return reshape(ctx, a, [ne0], name)


def reshape_2d(ctx, a, ne0, ne1, name=""):
    return reshape(ctx, a, [ne0, ne1], name)


def reshape_3d(ctx, a, ne0, ne1, ne2, name=""):
    return reshape(ctx, a, [ne0, ne1, ne2], name)


def reshape_4d(ctx, a, ne0, ne1, ne2, ne3, name=""):
    return reshape(ctx, a, [ne0, ne1, ne2, ne3], name)


def permute(ctx, a, axis0: int, axis1: int, axis2: int, axis3: int, name=""):
    """Source dim i becomes result dim axis_i (ggml_permute). op_params: the four axes."""
    axes = (axis0, axis1, axis2, axis3)
    if sorted(axes) != [0, 1, 2, 3]:
        raise InvalidArgumentError(f"permute: axes must be a permutation of 0..3, got {axes}")
    ne = [0] * 4
    nb = [0] * 4
    for i, ax in enumerate(axes):
        ne[ax] = a.ne[i]
        nb[ax] = a.nb[i]
    t = _view_node(ctx, Op.PERMUTE, a, ne, nb, 0, name)
    for i, ax in enumerate(axes):
        t.set_op_params_i32(i, ax)
    return t


def transpose(ctx, a, name=""):
    """Swap dims 0 and 1 (a view)."""
    t = permute(ctx, a, 1, 0, 2, 3, name)
    t.op = Op.TRANSPOSE
    return t


# ---- recurrent layers (hybrid models; native/src/ops_ssm.c) -----------------------------------

def _f32(op: str, *ts: Tensor) -> None:
    for t in ts:
        if t.type != GGMLType.F32:
            raise UnsupportedTypeError(f"{op}: {_ne(t)} must be F32")


def ssm_conv(ctx, x, kernel, state, seq, name="", in_place=False):
    """Short causal convolution with state (LFM2's shortconv, Qwen 3.5's conv1d), tokens in order.
    x F32 [C, T]; kernel F32 [K, C]; state F32 [(K-1)*C, S] (each sequence's K-1 previous inputs
    per channel, oldest first); seq I32 [T] (token t continues state seq[t]). Result F32 1-D
    [C*T + (K-1)*C*S]: y [C, T] (y[c,t] = sum over the window of K inputs times kernel[:, c])
    then the new states; see ssm_split.
    in_place: state is the cache itself (S cells) and the cells the tokens name are updated
    where they are (a side effect on state: nothing else in the graph may read it); the result
    is y F32 [C, T] alone (contiguous). The CPU backend's form (native/src/ops_ssm.c)."""
    op = "ssm_conv"
    _f32(op, x, kernel, state)
    C, T, K = x.ne[0], x.ne[1], kernel.ne[0]
    if kernel.ne[1] != C or K < 2 or x.ne[2] != 1 or x.ne[3] != 1:
        raise _fail(op, "x must be [C, T] and kernel [K >= 2, C]", x, kernel)
    if state.ne[0] != (K - 1) * C or state.ne[2] != 1 or state.ne[3] != 1:
        raise _fail(op, "state must be [(K-1)*C, S]", kernel, state)
    if seq.type != GGMLType.I32 or seq.nelements() != T:
        raise _fail(op, "seq must be I32 [T]", x, seq)
    t = _node(ctx, Op.SSM_CONV, GGMLType.F32,
              [C, T, 1, 1] if in_place else [C * T + (K - 1) * C * state.ne[1], 1, 1, 1],
              [x, kernel, state, seq], name)
    t.set_op_params_i32(0, int(in_place))
    return t


def gated_delta(ctx, q, k, v, g, beta, state, seq, scale: float, name="", in_place=False):
    """The gated delta rule (Qwen 3.5's linear attention), tokens in order, per head h:
    S ← exp(g)·S; S ← S + k·((v − Sᵀk)·beta)ᵀ; o = scale·Sᵀq. q, k F32 [Dk, Hk, T] (head h reads
    head h % Hk); v F32 [Dv, H, T]; g, beta F32 [H, T] (contiguous); state F32 [Dk*Dv*H, S]; seq
    I32 [T]. Result F32 1-D [Dv*H*T + Dk*Dv*H*S]: o [Dv, H, T] then the new states.
    in_place: as ssm_conv's (the cells seq names updated in state itself); the result is
    o F32 [Dv, H, T] alone (contiguous)."""
    op = "gated_delta"
    _f32(op, q, k, v, g, beta, state)
    Dk, Hk, Dv, H, T = q.ne[0], q.ne[1], v.ne[0], v.ne[1], v.ne[2]
    if list(k.ne[:3]) != [Dk, Hk, T] or q.ne[2] != T or H % Hk:
        raise _fail(op, "q, k must be [Dk, Hk, T], v [Dv, H, T] with H % Hk == 0", q, k, v)
    if g.nelements() != H * T or beta.nelements() != H * T:
        raise _fail(op, "g and beta must be [H, T]", v, g, beta)
    if state.ne[0] != Dk * Dv * H:
        raise _fail(op, "state must be [Dk*Dv*H, S]", v, state)
    if seq.type != GGMLType.I32 or seq.nelements() != T:
        raise _fail(op, "seq must be I32 [T]", v, seq)
    t = _node(ctx, Op.GATED_DELTA_NET, GGMLType.F32,
              [Dv, H, T, 1] if in_place else [Dv * H * T + Dk * Dv * H * state.ne[1], 1, 1, 1],
              [q, k, v, g, beta, state, seq], name)
    t.set_op_params_f32(0, scale)
    t.set_op_params_i32(1, int(in_place))
    return t


def softplus(ctx, a, name=""):
    """log(1 + exp(a)) element-wise, a itself above 20 (ggml_softplus). F32 with dense rows."""
    _f32("softplus", a)
    return _node(ctx, Op.SOFTPLUS, GGMLType.F32, a.ne, [a], name)


def ssm_split(ctx, out, y_ne, state_row: int, name=""):
    """The two parts of an ssm_conv / gated_delta result: (y viewed as y_ne, contiguous; the new
    states [state_row, S])."""
    n_y = 1
    for n in y_ne:
        n_y *= n
    n_s = (out.ne[0] - n_y) // state_row
    y = reshape(ctx, view_1d(ctx, out, n_y, 0), list(y_ne), name=name)
    st = view_2d(ctx, out, state_row, n_s, state_row * 4, n_y * 4)
    return y, st
