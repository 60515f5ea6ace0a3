"""What the Vulkan backend computes, and how: per op, the exact support rule (`why_unsupported`)
and the dispatches that compute a node (`build`). Semantics are those of the CPU kernels in
native/src/ops_*.c; each shader's header comment states its contract.

A dispatch names a SPIR-V module (build/shaders/<name>.spv), its specialization constants,
N_BINDINGS bindings (whole windows, see device.py; the unused ones bound to a dummy), the push
constants (offsets of the operands inside their windows, shapes, strides in elements) and a
workgroup grid, plus the byte ranges it reads and writes (virtual addresses), from which the
recorder derives barriers.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import math
import struct
from dataclasses import dataclass

import numpy as np

from pyggml.backend.vulkan.device import N_BINDINGS
from pyggml.errors import BackendError
from pyggml.tensor import Tensor
from pyggml.types import ROPE_MODE_NEOX, ROPE_MODE_NORMAL, VIEW_OPS, GGMLType, Op, traits

F32, F16, I32 = GGMLType.F32, GGMLType.F16, GGMLType.I32
FLOAT_TYPES = (F32, F16)
QUANT_TYPES = (GGMLType.Q4_0, GGMLType.Q4_1, GGMLType.Q5_0, GGMLType.Q5_1, GGMLType.Q8_0,
               GGMLType.Q4_K, GGMLType.Q5_K, GGMLType.Q6_K, GGMLType.IQ4_NL, GGMLType.IQ4_XS,
               GGMLType.MXFP4, GGMLType.IQ2_XXS, GGMLType.IQ2_XS, GGMLType.IQ2_S, GGMLType.IQ3_XXS,
               GGMLType.IQ3_S, GGMLType.IQ1_S, GGMLType.IQ1_M, GGMLType.TQ1_0, GGMLType.TQ2_0)
WEIGHT_TYPES = FLOAT_TYPES + QUANT_TYPES          # MUL_MAT and GET_ROWS sources
# types whose shaders read the codebook table at binding 5 (env.iq_grids(); iq_grids.glsl)
GRID_TYPES = frozenset({GGMLType.IQ2_XXS, GGMLType.IQ2_XS, GGMLType.IQ2_S, GGMLType.IQ3_XXS,
                        GGMLType.IQ3_S, GGMLType.IQ1_S, GGMLType.IQ1_M})
ESIZE = {F32: 4, I32: 4, F16: 2}
BINARY = {Op.ADD: 0, Op.SUB: 1, Op.MUL: 2, Op.DIV: 3}
UNARY = {Op.SCALE: 0, Op.SILU: 1, Op.GELU: 2, Op.SQR: 3, Op.SQRT: 4, Op.TANH: 5,
         Op.DIAG_MASK_INF: 6, Op.SIGMOID: 7, Op.CLAMP: 8, Op.SOFTPLUS: 9}
MAX_HEAD = 512                                     # flash_attn.comp MAX_D
ARGSORT_MAX = 1024                                 # argsort.comp MAX_N
U32 = 1 << 32
MAX_SRC = 7                                        # GATED_DELTA_NET's sources

# libm's float functions, so host-side constants match the CPU kernels bit for bit
_libm = ctypes.CDLL(ctypes.util.find_library("m") or "libm.so.6")
for _fn in ("powf", "logf"):
    getattr(_libm, _fn).restype = ctypes.c_float
_libm.powf.argtypes = [ctypes.c_float, ctypes.c_float]
_libm.logf.argtypes = [ctypes.c_float]
f32 = np.float32


def type_suffix(t: GGMLType) -> str:
    return "f32" if t == I32 else t.name.lower()


@dataclass
class Dispatch:
    pipeline: str
    spec: tuple
    bindings: tuple            # N_BINDINGS windows (VkBuffer, size, key)
    push: bytes
    grid: tuple
    reads: list                # [(lo, hi)] virtual byte ranges
    writes: list


def _pack(*vals) -> bytes:
    out = bytearray()
    for v in vals:
        if isinstance(v, (float, np.floating)):
            out += struct.pack("<f", float(v))
        elif v < 0:
            out += struct.pack("<i", int(v))
        else:
            if v >= U32:
                raise BackendError(f"value {v} does not fit a 32-bit push constant")
            out += struct.pack("<I", int(v))
    return bytes(out)


def _span(t: Tensor) -> tuple[int, int]:
    return (t.data, t.data + t.nbytes())


def _dense_rows(t: Tensor) -> bool:
    return t.nb[0] == traits(t.type).type_size


def _strides_ok(t: Tensor, es: int) -> bool:
    return all(nb % es == 0 for nb in t.nb) and t.view_offs % es == 0


# ---- support rules -------------------------------------------------------------------------------

def why_unsupported(node: Tensor, lim) -> str | None:
    """None if the Vulkan backend computes `node` exactly as the CPU backend does, else why not.
    `lim` gives the device limits (max_bind, max_wg_count, cfg)."""
    op = node.op
    if op in VIEW_OPS or op == Op.NONE:
        return None
    src = [s for s in node.src if s is not None]
    for t in [node] + src:
        if any(x < 0 for x in t.ne) or t.nelements() >= U32:
            return f"tensor '{t.name}' has too many elements for 32-bit indexing"
    fn = _RULES.get(op)
    if fn is None:
        return f"op {op.name} has no Vulkan kernel"
    why = fn(node, *(list(node.src) + [None] * (MAX_SRC - len(node.src))))
    if why:
        return why
    big = {Op.MUL_MAT: 0, Op.GET_ROWS: 0, Op.MUL_MAT_ID: 0}.get(op)
    for i, t in enumerate(node.src):
        if t is None or t.nbytes() <= lim.max_bind:
            continue
        if i == big and op != Op.MUL_MAT_ID and t.ne[2] == 1 and t.ne[3] == 1 \
                and t.nb[1] <= lim.max_bind:
            continue                   # split into row pieces
        if i == big and op == Op.MUL_MAT_ID and t.nb[2] <= lim.max_bind:
            continue                   # split into expert pieces
        return (f"'{t.name}' spans {t.nbytes()} bytes, more than one storage-buffer binding "
                f"({lim.max_bind} bytes) and it cannot be split by rows")
    if op == Op.MUL_MAT_ID and node.src[0].ne[2] > lim.max_wg_count[2]:
        return (f"{node.src[0].ne[2]} experts, more than the device's {lim.max_wg_count[2]} "
                f"workgroups in z")
    if node.nbytes() > lim.max_bind:
        return f"the result spans {node.nbytes()} bytes, more than one binding ({lim.max_bind})"
    return None


def _f32_all(*ts) -> bool:
    return all(t.type == F32 and _strides_ok(t, 4) for t in ts)


def _rule_binary(t, a, b, *_):
    if a is None or b is None or not _f32_all(t, a, b):
        return "F32 operands only"
    if a.ne != t.ne or any(b.ne[i] <= 0 or a.ne[i] % b.ne[i] for i in range(4)):
        return "shapes do not broadcast"
    return None


def _rule_unary(t, a, *_):
    if a is None or not _f32_all(t, a):
        return "F32 only"
    return None if a.ne == t.ne else "output shape differs from input"


def _rule_soft_max(t, a, m, *rest):
    if a is None or not _f32_all(t, a) or a.ne != t.ne or not (_dense_rows(a) and _dense_rows(t)):
        return "F32 with dense rows only"
    sinks = rest[0] if rest else None
    if sinks is not None and (sinks.type != F32 or not sinks.is_contiguous()
                              or sinks.ne[0] < a.ne[2]):
        return "sinks must be a contiguous F32 [>= ne2]"
    if m is not None:
        if m.type not in FLOAT_TYPES or not _strides_ok(m, ESIZE[m.type]) or not _dense_rows(m):
            return "mask must be F16/F32 with dense rows"
        if m.ne[0] != a.ne[0] or m.ne[1] < a.ne[1] or a.ne[2] % m.ne[2] or a.ne[3] % m.ne[3]:
            return "mask shape does not fit"
    return None


def _rule_rope(t, a, pos, ff, *_):
    n_dims, mode = t.op_param_i32(1), t.op_param_i32(2)
    if a is None or pos is None or not _f32_all(t, a) or a.ne != t.ne:
        return "F32 only, same shape"
    if not (_dense_rows(a) and _dense_rows(t)):
        return "rows must be dense"
    if pos.type != I32 or pos.ne[0] != a.ne[2] or not pos.is_contiguous():
        return "pos must be contiguous I32 [ne2]"
    if n_dims <= 0 or n_dims % 2 or n_dims > a.ne[0]:
        return f"n_dims {n_dims} invalid"
    if mode not in (ROPE_MODE_NORMAL, ROPE_MODE_NEOX):
        return f"rope mode {mode}"
    if ff is not None and (ff.type != F32 or ff.ne[0] < n_dims // 2 or not ff.is_contiguous()):
        return "freq_factors must be contiguous F32 with >= n_dims/2 values"
    return None


def _rule_get_rows(t, a, b, *_):
    if a is None or b is None or b.type != I32 or not _strides_ok(b, 4):
        return "needs a and I32 indices"
    if a.type not in WEIGHT_TYPES + (I32,):
        return f"cannot read rows of {a.type.name}"
    if t.type != (I32 if a.type == I32 else F32) or not _strides_ok(t, 4):
        return "output type"
    if (t.ne[0] != a.ne[0] or t.ne[1] != b.ne[0] or t.ne[2] != b.ne[1] or t.ne[3] != b.ne[2]
            or a.ne[2] != b.ne[1] or b.ne[3] != 1):
        return "shapes do not match get_rows"
    if not (_dense_rows(a) and _dense_rows(t)):
        return "rows must be dense"
    if a.type in ESIZE and not _strides_ok(a, ESIZE[a.type]):
        return "misaligned source"
    return None


def _rule_set_rows(t, b, c, *_):
    if b is None or c is None or b.type != F32 or c.type != I32 or t.type not in FLOAT_TYPES:
        return "F32 rows, I32 indices, F32/F16 destination only"
    if not (_strides_ok(b, 4) and _strides_ok(c, 4) and _strides_ok(t, ESIZE[t.type])):
        return "misaligned operands"
    if (b.ne[0] != t.ne[0] or c.ne[0] != b.ne[1] or b.ne[2] != t.ne[2] or b.ne[3] != t.ne[3]
            or b.ne[2] % c.ne[1] or b.ne[3] % c.ne[2]):
        return "shapes do not match set_rows"
    if not (_dense_rows(b) and _dense_rows(t)):
        return "rows must be dense"
    return None


def _rule_cpy(t, a, *_):
    if a is None or not (a.type in FLOAT_TYPES and t.type in FLOAT_TYPES
                         or a.type == t.type == I32):
        return "F32/F16 copies and I32 -> I32 only"
    if not (_strides_ok(a, ESIZE[a.type]) and _strides_ok(t, ESIZE[t.type])):
        return "misaligned operands"
    return None if a.nelements() == t.nelements() else "element counts differ"


def _rule_concat(t, a, b, *_):
    dim = t.op_param_i32(0)
    if a is None or b is None or not 0 <= dim <= 3:
        return "needs two sources and dim in 0..3"
    if not (a.type == b.type == t.type) or t.type not in (F32, F16, I32):
        return "same F32/F16/I32 type needed"
    es = ESIZE[t.type]
    if not all(_strides_ok(x, es) for x in (t, a, b)):
        return "misaligned operands"
    for d in range(4):
        want = a.ne[d] + b.ne[d] if d == dim else a.ne[d]
        if t.ne[d] != want or (d != dim and b.ne[d] != a.ne[d]):
            return "shapes do not concat"
    return None


def _rule_mul_mat(t, a, b, *_):
    if a is None or b is None or a.type not in WEIGHT_TYPES:
        return f"no kernel for weights of type {a.type.name if a is not None else '?'}"
    if not _f32_all(t, b):
        return "activations and output must be F32"
    if a.type in ESIZE and not _strides_ok(a, ESIZE[a.type]):
        return "misaligned weights"
    if a.ne[0] != b.ne[0] or b.ne[2] % a.ne[2] or b.ne[3] % a.ne[3]:
        return "shapes do not multiply"
    if t.ne != (a.ne[1], b.ne[1], b.ne[2], b.ne[3]):
        return "output shape is not [a.ne1, b.ne1, b.ne2, b.ne3]"
    if not (_dense_rows(a) and _dense_rows(b) and _dense_rows(t)):
        return "rows must be dense"
    return None


def _rule_mul_mat_id(t, a, b, ids, *_):
    if a is None or b is None or ids is None or a.type not in WEIGHT_TYPES:
        return f"no kernel for weights of type {a.type.name if a is not None else '?'}"
    if not _f32_all(t, b):
        return "activations and output must be F32"
    if ids.type != I32 or not _strides_ok(ids, 4):
        return "ids must be I32"
    if a.type in ESIZE and not _strides_ok(a, ESIZE[a.type]):
        return "misaligned weights"
    if (a.ne[3] != 1 or b.ne[3] != 1 or ids.ne[2] != 1 or ids.ne[3] != 1 or a.ne[0] != b.ne[0]
            or ids.ne[1] != b.ne[2] or b.ne[1] <= 0 or ids.ne[0] % b.ne[1]):
        return "shapes do not fit mul_mat_id"
    if t.ne != (a.ne[1], ids.ne[0], b.ne[2], 1):
        return "output shape is not [as.ne1, ids.ne0, b.ne2]"
    if not (_dense_rows(a) and _dense_rows(b) and _dense_rows(t)):
        return "rows must be dense"
    return None


def _rule_sum_rows(t, a, *_):
    if a is None or not _f32_all(t, a):
        return "F32 only"
    return None if t.ne == (1,) + a.ne[1:] else "output shape is not [1, ne1, ne2, ne3]"


def _rule_argsort(t, a, *_):
    if a is None or a.type != F32 or t.type != I32 or not _strides_ok(a, 4) \
            or not _strides_ok(t, 4):
        return "F32 input and I32 output only"
    if a.ne != t.ne or not (_dense_rows(a) and _dense_rows(t)):
        return "same shape and dense rows needed"
    if a.ne[0] > ARGSORT_MAX:
        return f"rows longer than {ARGSORT_MAX} (one workgroup sorts a row in shared memory)"
    if t.op_param_i32(0) not in (0, 1):
        return f"sort order {t.op_param_i32(0)}"
    return None


def _rule_flash_attn(t, q, k, v, m, *rest):
    if q is None or k is None or v is None or not _f32_all(t, q):
        return "needs F32 q and output, k, v"
    sinks = rest[0] if rest else None
    if sinks is not None and (sinks.type != F32 or not sinks.is_contiguous()
                              or sinks.ne[0] < q.ne[2]):
        return "sinks must be a contiguous F32 [>= H]"
    if k.type not in FLOAT_TYPES or v.type != k.type:
        return "k, v must be both F16 or F32"
    if not (_strides_ok(k, ESIZE[k.type]) and _strides_ok(v, ESIZE[v.type])):
        return "misaligned k/v"
    if (k.ne[0] != q.ne[0] or v.ne[1] != k.ne[1] or v.ne[2] != k.ne[2] or k.ne[2] <= 0
            or q.ne[2] % k.ne[2] or q.ne[3] != k.ne[3] or v.ne[3] != k.ne[3]):
        return "q, k, v shapes do not fit"
    if q.ne[0] > MAX_HEAD or v.ne[0] > MAX_HEAD:
        return f"head sizes above {MAX_HEAD}"
    if t.ne != (v.ne[0], q.ne[2], q.ne[1], q.ne[3]) or not t.is_contiguous():
        return "output must be a contiguous [Dv, H, n_q, B]"
    if m is not None and (m.type not in FLOAT_TYPES or not _strides_ok(m, ESIZE[m.type])
                          or m.ne[0] != k.ne[1] or m.ne[1] < q.ne[1] or q.ne[2] % m.ne[2]
                          or q.ne[3] % m.ne[3] or not _dense_rows(m)):
        return "mask shape or type does not fit"
    if not all(_dense_rows(x) for x in (q, k, v)):
        return "rows must be dense"
    return None


def _contiguous_i32(t, n: int) -> bool:
    return t is not None and t.type == I32 and t.is_contiguous() and t.nelements() == n


def _contiguous_f32(t, n: int) -> bool:
    return t is not None and t.type == F32 and t.is_contiguous() and t.nelements() == n


# ops.ssm_conv / ops.gated_delta with in_place: the state updated where it lies in a host cache
IN_PLACE_STATE = "the in-place form (state updated in the host cache) is the CPU's"


def _rule_ssm_conv(t, x, w, st, seq, *_):
    if x is None or w is None or st is None or seq is None:
        return "needs x, kernel, state and seq"
    if t.op_param_i32(0):
        return IN_PLACE_STATE
    if not (_f32_all(t, x, w, st) and _dense_rows(x) and _dense_rows(st)):
        return "F32 x, kernel and state with dense rows only"
    C, T, K, S = x.ne[0], x.ne[1], w.ne[0], st.ne[1]
    if x.ne[2:] != (1, 1) or w.ne[1:] != (C, 1, 1) or not w.is_contiguous() or K < 2:
        return "x must be [C, T] and kernel a contiguous [K >= 2, C]"
    if st.ne[0] != (K - 1) * C or st.ne[2:] != (1, 1) or S < 1:
        return "state must be [(K-1)*C, S]"
    if not _contiguous_i32(seq, T):
        return "seq must be a contiguous I32 [T]"
    if t.ne != (C * T + (K - 1) * C * S, 1, 1, 1) or not t.is_contiguous():
        return "output must be a contiguous [C*T + (K-1)*C*S]"
    return None


def _rule_gated_delta(t, q, k, v, g, beta, st, seq):
    if any(x is None for x in (q, k, v, g, beta, st, seq)):
        return "needs q, k, v, g, beta, state and seq"
    if t.op_param_i32(1):
        return IN_PLACE_STATE
    if not (_f32_all(t, q, k, v, st) and all(_dense_rows(x) for x in (q, k, v, st))):
        return "F32 q, k, v and state with dense rows only"
    Dk, Hk, Dv, H, T = q.ne[0], q.ne[1], v.ne[0], v.ne[1], v.ne[2]
    if k.ne != q.ne or q.ne[2] != T or q.ne[3] != 1 or v.ne[3] != 1 or H % Hk:
        return "q, k must be [Dk, Hk, T] and v [Dv, H, T] with H % Hk == 0"
    if not (_contiguous_f32(g, H * T) and _contiguous_f32(beta, H * T)):
        return "g and beta must be contiguous F32 [H, T]"
    if st.ne[0] != Dk * Dv * H or st.ne[2:] != (1, 1) or st.ne[1] < 1:
        return "state must be [Dk*Dv*H, S]"
    if not _contiguous_i32(seq, T):
        return "seq must be a contiguous I32 [T]"
    if t.ne != (Dv * H * T + Dk * Dv * H * st.ne[1], 1, 1, 1) or not t.is_contiguous():
        return "output must be a contiguous [Dv*H*T + Dk*Dv*H*S]"
    return None


_RULES = {Op.ADD: _rule_binary, Op.SUB: _rule_binary, Op.MUL: _rule_binary, Op.DIV: _rule_binary,
          Op.SOFT_MAX: _rule_soft_max, Op.ROPE: _rule_rope, Op.GET_ROWS: _rule_get_rows,
          Op.SET_ROWS: _rule_set_rows, Op.CPY: _rule_cpy, Op.CONT: _rule_cpy, Op.DUP: _rule_cpy,
          Op.CONCAT: _rule_concat, Op.MUL_MAT: _rule_mul_mat,
          Op.FLASH_ATTN_EXT: _rule_flash_attn, Op.NORM: _rule_unary, Op.RMS_NORM: _rule_unary,
          Op.MUL_MAT_ID: _rule_mul_mat_id, Op.SUM_ROWS: _rule_sum_rows, Op.ARGSORT: _rule_argsort,
          Op.SSM_CONV: _rule_ssm_conv, Op.GATED_DELTA_NET: _rule_gated_delta}
_RULES.update({op: _rule_unary for op in UNARY})


# ---- dispatch building ---------------------------------------------------------------------------

class Builder:
    """Turns nodes into dispatches for one device. `env` supplies: cfg (KernelConfig),
    bind(addr, n) -> (window, byte offset in it), the special windows `dummy`, `status` and
    `gelu_table()`, `iq_grids()` (the codebooks of the IQ types), and the device's
    max_wg_count."""

    def __init__(self, env):
        self.env = env
        self.cfg = env.cfg

    def fold(self, total: int, z: int = 1) -> tuple:
        mx, my, mz = self.env.max_wg_count
        x = min(total, mx)
        y = -(-total // x) if x else 0
        if y > my or z > mz:
            raise BackendError(f"grid of {total} x {z} workgroups exceeds the device's limits")
        return (x, y, z)

    def rows_grid(self, n_cols: int, n_rows: int) -> tuple:
        """Row grid (common.glsl grid_row/grid_col): x covers n_cols invocations, y and z the
        rows."""
        mx, my, mz = self.env.max_wg_count
        x = -(-n_cols // (self.cfg.wg_elem * self.cfg.ept))
        y = min(n_rows, my)
        z = -(-n_rows // y) if y else 0
        if x > mx or z > mz:
            raise BackendError(f"row grid of {n_cols} x {n_rows} exceeds the device's limits")
        return (x, y, z)

    def loc(self, t: Tensor, unit: int, off: int = 0, n: int | None = None):
        """(window, offset in `unit`s) of t's bytes [off, off + n)."""
        if t.data is None:
            raise BackendError(f"tensor '{t.name}' has no data address; allocate the graph first")
        n = t.nbytes() - off if n is None else n
        win, wo = self.env.bind(t.data + off, max(n, 1))
        if wo % unit:
            raise BackendError(f"tensor '{t.name}' at {t.data:#x} is not aligned to {unit} bytes")
        return win, wo // unit

    def strides(self, t: Tensor, unit: int) -> list:
        return [nb // unit for nb in t.nb]

    def build(self, node: Tensor) -> list:
        if node.op in VIEW_OPS or node.op == Op.NONE or node.nelements() == 0:
            return []
        return getattr(self, "_" + node.op.name.lower())(node)

    def _weights_wins(self, a: Tensor, wins: tuple) -> tuple:
        """The bindings of a dispatch reading weights `a`: the codebook table at 5 for the IQ
        types."""
        if a.type not in GRID_TYPES:
            return wins
        return tuple(wins) + (self.env.dummy,) * (5 - len(wins)) + (self.env.iq_grids(),)

    def _mk(self, name, spec, wins, push, grid, reads, writes) -> Dispatch:
        wins = list(wins) + [self.env.dummy] * (N_BINDINGS - len(wins))
        return Dispatch(name, tuple(spec), tuple(wins), push, grid,
                        [_span(t) if isinstance(t, Tensor) else t for t in reads],
                        [_span(t) if isinstance(t, Tensor) else t for t in writes])

    # -- element-wise --
    def _add(self, t):
        a, b = t.src[0], t.src[1]
        (wa, oa), (wb, ob), (wd, od) = self.loc(a, 4), self.loc(b, 4), self.loc(t, 4)
        push = _pack(*t.ne, oa, *self.strides(a, 4), *b.ne, ob, *self.strides(b, 4),
                     od, *self.strides(t, 4), BINARY[t.op])
        return [self._mk("binary", self._elem_spec(), (wa, wb, wd), push,
                         self.rows_grid(t.ne[0], t.nrows()), [a, b], [t])]

    _sub = _mul = _div = _add

    def _scale(self, t):
        a = t.src[0]
        (wa, oa), (wd, od) = self.loc(a, 4), self.loc(t, 4)
        f0, f1 = ((t.op_param_f32(0), t.op_param_f32(1)) if t.op in (Op.SCALE, Op.CLAMP)
                  else (0.0, 0.0))
        if t.op == Op.DIAG_MASK_INF:
            f0 = t.op_param_i32(0)
        table = self.env.gelu_table() if t.op == Op.GELU else self.env.dummy
        push = _pack(*t.ne, oa, *self.strides(a, 4), od, *self.strides(t, 4), UNARY[t.op], f0, f1)
        return [self._mk("unary", self._elem_spec(), (wa, wd, table), push,
                         self.rows_grid(t.ne[0], t.nrows()), [a], [t])]

    _silu = _gelu = _sqr = _sqrt = _tanh = _diag_mask_inf = _sigmoid = _clamp = _softplus = _scale

    def _elem_spec(self) -> tuple:
        """Specialization of the row-grid kernels: workgroup size, elements per invocation."""
        return (self.cfg.wg_elem, self.cfg.ept)

    def _sg(self, name: str) -> str:
        return name + "_sg" if self.cfg.subgroup else name

    def _rms_norm(self, t):
        a = t.src[0]
        (wa, oa), (wd, od) = self.loc(a, 4), self.loc(t, 4)
        push = _pack(*t.ne, oa, *self.strides(a, 4), od, *self.strides(t, 4),
                     0 if t.op == Op.RMS_NORM else 1, t.op_param_f32(0))
        return [self._mk(self._sg("norm"), (self.cfg.wg_reduce,), (wa, wd), push,
                         self.fold(t.nrows()), [a], [t])]

    _norm = _rms_norm

    def _soft_max(self, t):
        a, m = t.src[0], (t.src[1] if len(t.src) > 1 else None)
        (wa, oa), (wd, od) = self.loc(a, 4), self.loc(t, 4)
        scale, max_bias = t.op_param_f32(0), t.op_param_f32(1)
        flags, mpush, wm, reads = 0, [0, 1, 1, 0, 0, 0], self.env.dummy, [a]
        if m is not None:
            u = ESIZE[m.type]
            wm, om = self.loc(m, u)
            s = self.strides(m, u)
            flags = 1 | (2 if m.type == F16 else 0)
            mpush = [om, m.ne[2], m.ne[3], s[1], s[2], s[3]]
            reads.append(m)
        m0, m1, nl2 = _alibi(max_bias, t.ne[2])
        if max_bias > 0:
            flags |= 4
        sk = t.src[2] if len(t.src) > 2 else None
        ws, os_ = self.env.dummy, 0
        if sk is not None:
            ws, os_ = self.loc(sk, 4)
            flags |= 8
            reads.append(sk)
        sa, sd = self.strides(a, 4), self.strides(t, 4)
        push = _pack(*t.ne, oa, sa[1], sa[2], sa[3], *mpush, od, sd[1], sd[2], sd[3], flags,
                     scale, m0, m1, nl2, os_)
        return [self._mk(self._sg("soft_max"), (self.cfg.wg_reduce,), (wa, wm, wd, ws), push,
                         self.fold(t.nrows()), reads, [t])]

    def _rope(self, t):
        a, pos = t.src[0], t.src[1]
        ff = t.src[2] if len(t.src) > 2 else None
        (wa, oa), (wp, op_), (wd, od) = self.loc(a, 4), self.loc(pos, 4), self.loc(t, 4)
        wf, of = self.loc(ff, 4) if ff is not None else (self.env.dummy, 0)
        n_dims, mode, n_ctx_orig = t.op_param_i32(1), t.op_param_i32(2), t.op_param_i32(4)
        base, fscale, ext, attn, bfast, bslow = (t.op_param_f32(i) for i in range(5, 11))
        theta_scale = _libm.powf(base, float(f32(-2.0) / f32(n_dims)))
        corr0 = corr1 = 0.0
        mscale = attn
        if ext != 0.0:
            corr0 = float(max(0.0, math.floor(_corr_dim(n_dims, n_ctx_orig, bfast, base))))
            corr1 = float(min(n_dims - 1, math.ceil(_corr_dim(n_dims, n_ctx_orig, bslow, base))))
            ln = f32(_libm.logf(float(f32(1.0) / f32(fscale))))
            mscale = float(f32(attn) * (f32(1.0) + f32(0.1) * ln))
        sa, sd = self.strides(a, 4), self.strides(t, 4)
        flags = (1 if mode == ROPE_MODE_NEOX else 0) | (2 if ff is not None else 0)
        push = _pack(*t.ne, oa, sa[1], sa[2], sa[3], od, sd[1], sd[2], sd[3], op_, of, n_dims,
                     flags, theta_scale, fscale, ext, attn, mscale, corr0, corr1)
        slots = n_dims // 2 + (t.ne[0] - n_dims)
        reads = [a, pos] + ([ff] if ff is not None else [])
        return [self._mk("rope", self._elem_spec(), (wa, wp, wf, wd), push,
                         self.rows_grid(slots, t.nrows()), reads, [t])]

    # -- rows and copies --
    def _row_pieces(self, a: Tensor):
        """[(row0, row1)] so that each piece of a 2-D `a` fits one binding."""
        if a.nbytes() <= self.env.max_bind:
            return [(0, a.ne[1])]
        per = max(1, self.env.max_bind // a.nb[1])
        return [(r, min(r + per, a.ne[1])) for r in range(0, a.ne[1], per)]

    def _get_rows(self, t):
        a, b = t.src[0], t.src[1]
        u = 1 if a.type in QUANT_TYPES else ESIZE[a.type]
        (wb, ob), (wd, od) = self.loc(b, 4), self.loc(t, 4)
        sb, sd = self.strides(b, 4), self.strides(t, 4)
        n_idx = b.ne[0] * b.ne[1] * b.ne[2]
        per_row = a.ne[0] if u > 1 else a.ne[0] // 4
        grid = self.rows_grid(per_row, n_idx)
        out = []
        for r0, r1 in self._row_pieces(a):
            n = a.nbytes() if (r0, r1) == (0, a.ne[1]) else (r1 - r0) * a.nb[1]
            wa, oa = self.loc(a, u, r0 * a.nb[1], n)
            push = _pack(a.ne[0], n_idx, b.ne[0], b.ne[1], oa, a.nb[1] // u, a.nb[2] // u,
                         a.nb[3] // u, a.ne[1], r0, r1, ob, sb[0], sb[1], sb[2],
                         od, sd[1], sd[2], sd[3], self.env.tag(t))
            rd = (a.data + r0 * a.nb[1], a.data + r0 * a.nb[1] + n)
            out.append(self._mk("get_rows_" + type_suffix(a.type), self._elem_spec(),
                                self._weights_wins(a, (wa, wb, wd, self.env.status)), push, grid,
                                [rd, b], [t]))
        return out

    def _set_rows(self, t):
        b, c = t.src[0], t.src[1]
        u = ESIZE[t.type]
        (wb, ob), (wc, oc), (wd, od) = self.loc(b, 4), self.loc(c, 4), self.loc(t, u)
        sb, sc, sd = self.strides(b, 4), self.strides(c, 4), self.strides(t, u)
        push = _pack(*b.ne, ob, sb[1], sb[2], sb[3], oc, c.ne[1], c.ne[2], sc[0], sc[1], sc[2],
                     od, sd[1], sd[2], sd[3], t.ne[1], 1 if t.type == F16 else 0, self.env.tag(t))
        name = "set_rows_s16" if t.type == F16 and self.cfg.store16 else "set_rows"
        return [self._mk(name, self._elem_spec(), (wb, wc, wd, self.env.status), push,
                         self.rows_grid(b.ne[0], b.nrows()), [b, c], [t])]

    def _cpy(self, t):
        a = t.src[0]
        ua, ud = ESIZE[a.type], ESIZE[t.type]
        (wa, oa), (wd, od) = self.loc(a, ua), self.loc(t, ud)
        flags = ((1 if a.type == F16 else 0) | (2 if t.type == F16 else 0)
                 | (4 if a.ne != t.ne else 0))
        push = _pack(*a.ne, oa, *self.strides(a, ua), *t.ne, od, *self.strides(t, ud), flags)
        name = "cpy_s16" if t.type == F16 and self.cfg.store16 else "cpy"
        return [self._mk(name, self._elem_spec(), (wa, wd), push,
                         self.rows_grid(a.ne[0], a.nrows()), [a], [t])]

    _cont = _dup = _cpy

    def _concat(self, t):
        a, b = t.src[0], t.src[1]
        u = ESIZE[t.type]
        (wa, oa), (wb, ob), (wd, od) = self.loc(a, u), self.loc(b, u), self.loc(t, u)
        dim = t.op_param_i32(0)
        push = _pack(*t.ne, oa, *self.strides(a, u), ob, *self.strides(b, u), od,
                     *self.strides(t, u), dim, a.ne[dim], 1 if t.type == F16 else 0)
        name = "concat_s16" if t.type == F16 and self.cfg.store16 else "concat"
        return [self._mk(name, self._elem_spec(), (wa, wb, wd), push,
                         self.rows_grid(t.ne[0], t.nrows()), [a, b], [t])]

    # -- matrix products --
    def _mul_mat(self, t):
        a, b = t.src[0], t.src[1]
        u = 1 if a.type in QUANT_TYPES else ESIZE[a.type]
        K, M, B2, B3 = b.ne[0], b.ne[1], b.ne[2], b.ne[3]
        (wb, ob), (wd, od) = self.loc(b, 4), self.loc(t, 4)
        sb, sd = self.strides(b, 4), self.strides(t, 4)
        sfx = type_suffix(a.type)
        cfg = self.cfg
        out = []
        for r0, r1 in self._row_pieces(a):
            n = a.nbytes() if (r0, r1) == (0, a.ne[1]) else (r1 - r0) * a.nb[1]
            wa, oa = self.loc(a, u, r0 * a.nb[1], n)
            N = r1 - r0
            push = _pack(K, N, M, oa, a.nb[1] // u, a.nb[2] // u, a.nb[3] // u,
                         B2 // a.ne[2], B3 // a.ne[3], B2, ob, sb[1], sb[2], sb[3],
                         od, sd[1], sd[2], sd[3], r0)
            rd = (a.data + r0 * a.nb[1], a.data + r0 * a.nb[1] + n)
            if M <= cfg.mmv_max_cols:
                nr = cfg.mmv_rows
                out.append(self._mk(self._sg("mul_mat_vec_" + sfx), (cfg.wg_reduce, nr, M),
                                    self._weights_wins(a, (wa, wb, wd)), push,
                                    self.fold(-(-N // nr), B2 * B3),
                                    [rd, b], [t]))
            else:
                tile = cfg.mm_tile
                grid = (-(-N // tile), -(-M // tile), B2 * B3)
                mx = self.env.max_wg_count
                if any(g > m for g, m in zip(grid, mx)):
                    raise BackendError(f"mul_mat '{t.name}': grid {grid} exceeds the device's {mx}")
                out.append(self._mk("mul_mat_" + sfx, ((tile // 4) ** 2, tile, tile),
                                    self._weights_wins(a, (wa, wb, wd)), push, grid, [rd, b], [t]))
        return out

    def _mul_mat_id(self, t):
        a, b, ids = t.src[0], t.src[1], t.src[2]
        u = 1 if a.type in QUANT_TYPES else ESIZE[a.type]
        K, N, n_as = a.ne[0], a.ne[1], a.ne[2]
        n_ids, n_tok = ids.ne[0], ids.ne[1]
        (wb, ob), (wi, oi), (wd, od) = self.loc(b, 4), self.loc(ids, 4), self.loc(t, 4)
        sb, si, sd = self.strides(b, 4), self.strides(ids, 4), self.strides(t, 4)
        cfg = self.cfg
        nr = cfg.mmv_rows
        per = max(1, self.env.max_bind // a.nb[2]) if a.nbytes() > self.env.max_bind else n_as
        out = []
        for e0 in range(0, n_as, per):
            e1 = min(e0 + per, n_as)
            n = a.nbytes() if (e0, e1) == (0, n_as) else (e1 - e0) * a.nb[2]
            wa, oa = self.loc(a, u, e0 * a.nb[2], n)
            push = _pack(K, N, oa, a.nb[1] // u, a.nb[2] // u, e0, e1, n_as, n_ids, b.ne[1],
                         n_ids * n_tok, ob, sb[1], sb[2], oi, si[0], si[1], od, sd[1], sd[2],
                         self.env.tag(t))
            rd = (a.data + e0 * a.nb[2], a.data + e0 * a.nb[2] + n)
            wins = self._weights_wins(a, (wa, wb, wd, wi, self.env.status))
            if n_ids * n_tok <= cfg.mmv_max_cols:
                out.append(self._mk(self._sg("mul_mat_vec_id_" + type_suffix(a.type)),
                                    (cfg.wg_reduce, nr, 1), wins, push,
                                    self.fold(-(-N // nr), n_ids * n_tok), [rd, b, ids], [t]))
            else:           # tiled: one workgroup per (row tile, expert), entries in tiles
                tile = cfg.mm_tile
                out.append(self._mk("mul_mat_id_" + type_suffix(a.type),
                                    ((tile // 4) ** 2, tile, tile), wins, push,
                                    (-(-N // tile), 1, e1 - e0), [rd, b, ids], [t]))
        return out

    def _sum_rows(self, t):
        a = t.src[0]
        (wa, oa), (wd, od) = self.loc(a, 4), self.loc(t, 4)
        push = _pack(*a.ne, oa, *self.strides(a, 4), od, *self.strides(t, 4), 2, 0.0)
        return [self._mk(self._sg("norm"), (self.cfg.wg_reduce,), (wa, wd), push,
                         self.fold(a.nrows()), [a], [t])]

    def _argsort(self, t):
        a = t.src[0]
        (wa, oa), (wd, od) = self.loc(a, 4), self.loc(t, 4)
        sa, sd = self.strides(a, 4), self.strides(t, 4)
        n_pad = 1 << max(0, (a.ne[0] - 1).bit_length())
        push = _pack(*a.ne, oa, sa[1], sa[2], sa[3], od, sd[1], sd[2], sd[3],
                     t.op_param_i32(0), n_pad)
        return [self._mk("argsort", (self.cfg.wg_reduce,), (wa, wd), push,
                         self.fold(a.nrows()), [a], [t])]

    def _flash_attn_ext(self, t):
        q, k, v = t.src[0], t.src[1], t.src[2]
        m = t.src[3] if len(t.src) > 3 else None
        uk = ESIZE[k.type]
        (wq, oq), (wk, ok), (wv, ov), (wd, od) = (self.loc(q, 4), self.loc(k, uk), self.loc(v, uk),
                                                  self.loc(t, 4))
        sq, sk, sv = self.strides(q, 4), self.strides(k, uk), self.strides(v, uk)
        scale, max_bias, softcap = (f32(t.op_param_f32(i)) for i in range(3))
        if softcap != 0:
            scale = scale / softcap
        H = q.ne[2]
        m0, m1, nl2 = _alibi(float(max_bias), H)
        flags = (1 if k.type == F16 else 0) | (8 if max_bias > 0 else 0) | (nl2 << 16)
        wm, mp, reads = self.env.dummy, [0, 0, 0, 0, 1, 1], [q, k, v]
        if m is not None:
            um = ESIZE[m.type]
            wm, om = self.loc(m, um)
            s = self.strides(m, um)
            mp = [om, s[1], s[2], s[3], m.ne[2], m.ne[3]]
            flags |= 2 | (4 if m.type == F16 else 0)
            reads.append(m)
        sinks = t.src[4] if len(t.src) > 4 else None
        ws, os_ = self.env.dummy, 0
        if sinks is not None:
            ws, os_ = self.loc(sinks, 4)
            flags |= 16
            reads.append(sinks)
        push = _pack(q.ne[0], v.ne[0], q.ne[1], k.ne[1], H, H // k.ne[2], oq, sq[1], sq[2], sq[3],
                     ok, sk[1], sk[2], sk[3], ov, sv[1], sv[2], sv[3], *mp, od, flags,
                     scale, softcap, m0, m1, os_)
        return [self._mk(self._sg("flash_attn"), (self.cfg.wg_reduce,), (wq, wk, wv, wm, wd, ws),
                         push, self.fold(q.ne[1] * H, q.ne[3]), reads, [t])]

    # -- recurrent layers --
    def _ssm_conv(self, t):
        x, w, st, seq = t.src[:4]
        (wx, ox), (ww, ow), (wst, ost), (wq, oq), (wd, od) = (
            self.loc(x, 4), self.loc(w, 4), self.loc(st, 4), self.loc(seq, 4), self.loc(t, 4))
        C, T, K, S = x.ne[0], x.ne[1], w.ne[0], st.ne[1]
        push = _pack(C, T, K, S, ox, x.nb[1] // 4, ow, ost, st.nb[1] // 4, oq, od,
                     self.env.tag(t))
        return [self._mk("ssm_conv", self._elem_spec(), (wx, ww, wst, wq, wd, self.env.status),
                         push, self.rows_grid(C, 1), [x, w, st, seq], [t])]

    def _gated_delta_net(self, t):
        q, k, v, g, beta, st, seq = t.src[:7]
        (wq, oq), (wk, ok), (wv, ov), (wg, og), (wb, ob), (wst, ost), (wsq, osq), (wd, od) = (
            self.loc(x, 4) for x in (q, k, v, g, beta, st, seq, t))
        Dk, Hk, Dv, H, T = q.ne[0], q.ne[1], v.ne[0], v.ne[1], v.ne[2]
        sq, sk, sv = self.strides(q, 4), self.strides(k, 4), self.strides(v, 4)
        push = _pack(Dk, Hk, Dv, H, T, st.ne[1], oq, sq[1], sq[2], ok, sk[1], sk[2],
                     ov, sv[1], sv[2], og, ob, ost, st.nb[1] // 4, osq, od, self.env.tag(t),
                     t.op_param_f32(0))
        return [self._mk(self._sg("gated_delta"), (self.cfg.wg_reduce,),
                         (wq, wk, wv, wg, wb, wst, wsq, wd, self.env.status), push,
                         self.fold(H * Dv), [q, k, v, g, beta, st, seq], [t])]


def _alibi(max_bias: float, n_head: int) -> tuple[float, float, int]:
    """m0, m1, n_head_log2 as the CPU kernels compute them."""
    nl2 = 1 << int(math.floor(math.log2(n_head))) if n_head else 1
    m0 = _libm.powf(2.0, float(f32(-max_bias) / f32(nl2)))
    m1 = _libm.powf(2.0, float(f32(-(f32(max_bias) / f32(2.0))) / f32(nl2)))
    return m0, m1, nl2


def _corr_dim(n_dims: int, n_ctx_orig: int, n_rot: float, base: float) -> float:
    ratio = f32(n_ctx_orig) / (f32(n_rot) * f32(2.0) * f32(math.pi))
    num = f32(n_dims) * f32(_libm.logf(float(ratio)))
    return float(num / (f32(2.0) * f32(_libm.logf(base))))
