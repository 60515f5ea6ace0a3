"""The op parity cases: one registry of graphs that every backend computes against the CPU
backend (ggml's test-backend-ops), used by tests/test_backend_parity.py (Vulkan, three device
configurations) and tests/test_rpc.py (llama.cpp's rpc-server: ggml's own CPU kernels).

A case is a build `(ctx, Inputs) -> (node to compute, tensor to check)` with deterministic input
values (seeded by the case's name), and a bound on the normalized mean squared error
sum((backend - cpu)^2) / sum(cpu^2):

- data movement (get_rows, set_rows, cpy/cont, concat), diag_mask, GELU (ggml's fp16 table),
  F32 element-wise: identical or within fp32 rounding (1e-12 .. 1e-10);
- norms, softmax, silu, tanh, rope: fp32 with different summation order and exp/tanh: 1e-9 ..
  1e-6 (rope: libm vs shader sin/cos and 2.5-ulp division at angles up to 4000 rad);
- MUL_MAT with F32 weights: 1e-9; F16 and quantized weights: 5e-4 (the CPU converts
  activations to fp16 / Q8_0 / Q8_1 / Q8_K; the Vulkan shaders multiply dequantized weights with
  fp32 activations; ggml's CPU kernels quantize them too, possibly in another order: the MoE
  cases of K 256 stay within 1e-6 there);
- FLASH_ATTN_EXT: F32 K/V 1e-9, F16 K/V 1e-6 (both round q to fp16); on the rpc-server 5e-6
  (ggml's kernel accumulates V·softmax in fp16 when V is F16).

Every case runs on every backend with its bound, except where `bound(backend, ...)` sets that
backend's own, or `not_on(backend, ...)` says why it does not run there: "refused: ..." (the
backend refuses the graph before computing it: tests/test_rpc.py checks that it does) or a
difference of definition (ties in a sort, a row with every key masked).
"""
from __future__ import annotations

import zlib
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from pyggml import Context, Graph, ops, quants
from pyggml.backend.cpu import host_array, set_host_data
from pyggml.types import ROPE_MODE_NEOX, ROPE_MODE_NORMAL, GGMLType

BACKENDS = ("vulkan", "rpc")


# ---- the harness ---------------------------------------------------------------------------------

class Inputs:
    """Creates input tensors with deterministic values (the same for both builds of a case)."""

    def __init__(self, ctx: Context, seed: int):
        self.ctx = ctx
        self.rng = np.random.default_rng(seed)
        self.values: list[tuple] = []            # (tensor, raw bytes)

    def _add(self, t, raw: bytes):
        self.values.append((t, raw))
        return t

    def _new(self, type_, v: np.ndarray, name: str):
        return self._add(self.ctx.new_tensor(type_, list(reversed(v.shape)), name=name),
                         v.tobytes())

    def f32(self, *shape, scale=1.0, offset=0.0, values=None, name=""):
        v = (self.rng.standard_normal(shape) * scale + offset).astype(np.float32) \
            if values is None else np.asarray(values, np.float32)
        return self._new("f32", v, name)

    def f16(self, *shape, scale=1.0, values=None, name=""):
        v = (self.rng.standard_normal(shape) * scale).astype(np.float16) \
            if values is None else np.asarray(values, np.float16)
        return self._new("f16", v, name)

    def i32(self, values, name=""):
        v = np.asarray(values, np.int32)
        return self._new("i32", v, name)

    def weights(self, wtype: str, *shape, scale=0.5, name="w"):
        """Weights of any type: [K] innermost; quantized with pyggml.quants."""
        if wtype == "f32":
            return self.f32(*shape, scale=scale, name=name)
        if wtype == "f16":
            return self.f16(*shape, scale=scale, name=name)
        if wtype == "i32":
            return self.i32(self.rng.integers(-1000, 1000, shape), name=name)
        if wtype in GRID_TYPES:
            raw = _grid_blocks(self.rng, wtype, int(np.prod(shape[:-1])), shape[-1] // 256)
        else:
            v = (self.rng.standard_normal(shape) * scale).astype(np.float32)
            raw = quants.quantize(v.reshape(-1, shape[-1]), wtype).tobytes()
        return self._add(self.ctx.new_tensor(wtype, list(reversed(shape)), name=name), raw)


# the codebook i-quants: files are read, not written (llama.cpp makes them with an importance
# matrix), so their weights here are random codes, signs and scales with a small finite fp16 d
GRID_TYPES = ("iq2_xxs", "iq2_xs", "iq2_s", "iq3_xxs", "iq3_s", "iq1_s", "iq1_m")


def _grid_blocks(rng, wtype: str, rows: int, n_blocks: int) -> bytes:
    size = quants.row_bytes(wtype, 256)
    b = rng.integers(0, 256, (rows, n_blocks, size), dtype=np.uint8)
    h = (rng.standard_normal((rows, n_blocks)) * 0.02).astype(np.float16).view(np.uint16)
    if wtype == "iq1_m":                     # d in the top nibbles of the four scale words
        sc = b[..., 48:56].copy().view(np.uint16)
        for k in range(4):
            sc[..., k] = (sc[..., k] & 0x0FFF) | (((h >> (4 * k)) & 0xF) << 12)
        b[..., 48:56] = sc.view(np.uint8)
    else:
        b[..., 0:2] = h.view(np.uint8).reshape(rows, n_blocks, 2)
    return b.tobytes()


def view_of_raw(t, raw: bytes) -> np.ndarray:
    dt = {GGMLType.F32: np.float32, GGMLType.F16: np.float16, GGMLType.I32: np.int32}[t.type]
    return np.ndarray(tuple(reversed(t.ne)), dtype=dt, buffer=raw, strides=tuple(reversed(t.nb)))


def compute_cpu(build, seed, cpu):
    ctx = Context(mem_size=64 << 20, no_alloc=False)
    inp = Inputs(ctx, seed)
    out, check = build(ctx, inp)
    for t, raw in inp.values:
        set_host_data(t, raw)
    g = Graph()
    g.build_forward_expand(out)
    cpu.graph_compute(g)
    return host_array(check).astype(np.float64).copy()


def nmse(got: np.ndarray, ref: np.ndarray) -> float:
    assert got.shape == ref.shape
    fin = np.isfinite(ref)
    assert np.array_equal(fin, np.isfinite(got)), "non-finite values differ"
    assert np.array_equal(got[~fin], ref[~fin]), "infinities differ"
    d = np.sum((got[fin] - ref[fin]) ** 2)
    s = np.sum(ref[fin] ** 2)
    return float(d / s) if s > 0 else float(d)


# ---- the registry --------------------------------------------------------------------------------

@dataclass
class OpCase:
    name: str
    build: Callable
    tol: float                                            # NMSE bound on every backend ...
    tol_by: dict[str, float] = field(default_factory=dict)   # ... unless one has its own
    not_on: dict[str, str] = field(default_factory=dict)     # backend -> why it does not run

    @property
    def seed(self) -> int:
        return zlib.crc32(self.name.encode())        # as check_build seeds it


CASES: dict[str, OpCase] = {}


def case(name: str, tol: float):
    def deco(fn):
        assert name not in CASES, f"two op cases named {name}"
        CASES[name] = OpCase(name, fn, tol)
        return fn
    return deco


def bound(backend: str, tol: float, names) -> None:
    """`backend`'s own NMSE bound for these cases."""
    for n in names:
        CASES[n].tol_by[backend] = tol


def not_on(backend: str, reason: str, names) -> None:
    for n in names:
        CASES[n].not_on[backend] = reason


def cases_for(backend: str) -> list[str]:
    """The names of the cases `backend` computes."""
    assert backend in BACKENDS, backend
    return [n for n, c in CASES.items() if backend not in c.not_on]


def refused_on(backend: str) -> list[str]:
    """Cases `backend` must refuse before computing anything."""
    return [n for n, c in CASES.items() if c.not_on.get(backend, "").startswith("refused")]


def check_build(name: str, build, tol: float, compute, cpu) -> float:
    """A build computed by compute(build, seed) -> float64 result against the CPU backend
    `cpu`, its inputs seeded by `name`; returns the NMSE (asserted within tol)."""
    seed = zlib.crc32(name.encode())
    err = nmse(compute(build, seed), compute_cpu(build, seed, cpu))
    assert err <= tol, f"{name}: NMSE {err:.3g} > {tol:g}"
    return err


def check_op_case(name: str, backend: str, compute, cpu) -> float:
    """Registered case `name` on `backend` (compute as for check_build), within its bound."""
    c = CASES[name]
    return check_build(name, c.build, c.tol_by.get(backend, c.tol), compute, cpu)


# ---- the cases (first those the Vulkan tests had, then the rpc-server's) -----------------------

def _single(fn):
    """A build that returns its node as both the computed and the checked tensor."""
    def build(ctx, I):
        t = fn(ctx, I)
        return t, t
    return build


SHAPES = {"4d": (2, 3, 5, 33), "vec": (7,), "rows": (3, 1000)}

for _op in ("add", "sub", "mul", "div"):
    for _bc, _bshape in (("full", None), ("row", (33,)), ("plane", (5, 33)), ("inner", (3, 1, 11))):
        def _b(ctx, I, op=_op, bshape=_bshape):
            a = I.f32(2, 3, 5, 33)
            b = I.f32(*(bshape or (2, 3, 5, 33)), offset=3.0 if op == "div" else 0.0)
            return getattr(ops, op)(ctx, a, b)
        case(f"{_op}-{_bc}", 1e-12)(_single(_b))
    case(f"{_op}-permuted", 1e-12)(_single(
        lambda ctx, I, op=_op: getattr(ops, op)(
            ctx, ops.permute(ctx, I.f32(2, 5, 3, 33), 0, 2, 1, 3), I.f32(33, offset=2.0))))
case("add-inplace", 1e-12)(_single(
    lambda ctx, I: ops.add(ctx, I.f32(3, 65), I.f32(65), inplace=True)))

_UNARY = {
    "scale": (lambda ctx, a: ops.scale(ctx, a, 0.37, 0.5), 1e-12),
    "silu": (lambda ctx, a: ops.silu(ctx, a), 1e-10),
    "gelu": (lambda ctx, a: ops.gelu(ctx, a), 1e-12),
    "sqr": (lambda ctx, a: ops.sqr(ctx, a), 1e-12),
    "tanh": (lambda ctx, a: ops.tanh(ctx, a), 1e-10),
    "diag_mask_inf": (lambda ctx, a: ops.diag_mask_inf(ctx, a, 3), 0.0),
    "sigmoid": (lambda ctx, a: ops.sigmoid(ctx, a), 1e-10),
    "clamp": (lambda ctx, a: ops.clamp(ctx, a, -1.5, 2.25), 0.0),
}
for _name, (_fn, _tol) in _UNARY.items():
    for _sh, _shape in SHAPES.items():
        def _u(ctx, I, fn=_fn, shape=_shape, name=_name):
            vals = None
            if name == "gelu":    # both branches outside (-10, 10) and values near fp16 ties
                vals = (I.rng.standard_normal(shape) * 4).astype(np.float32)
                vals.flat[0], vals.flat[-1] = 12.0, -11.0
            return fn(ctx, I.f32(*shape, scale=3.0, values=vals))
        case(f"{_name}-{_sh}", _tol)(_single(_u))
    case(f"{_name}-permuted", _tol)(_single(
        lambda ctx, I, fn=_fn: fn(ctx, ops.permute(ctx, I.f32(3, 4, 2, 17), 0, 2, 1, 3))))
case("sqrt-4d", 1e-12)(_single(lambda ctx, I: ops.sqrt(ctx, ops.sqr(ctx, I.f32(2, 3, 5, 33)))))
case("scale-inplace", 1e-12)(_single(lambda ctx, I: ops.scale(ctx, I.f32(5, 9), 2.0, inplace=True)))

for _name, _fn in (("rms_norm", ops.rms_norm), ("norm", ops.norm)):
    for _sh, _shape in SHAPES.items():
        case(f"{_name}-{_sh}", 1e-10)(_single(
            lambda ctx, I, fn=_fn, shape=_shape: fn(ctx, I.f32(*shape, scale=2.0, offset=0.5),
                                                    1e-5)))
    case(f"{_name}-permuted", 1e-10)(_single(
        lambda ctx, I, fn=_fn: fn(ctx, ops.permute(ctx, I.f32(3, 5, 40), 0, 2, 1, 3), 1e-6)))


case("clamp-nan-inf", 0.0)(_single(lambda ctx, I: ops.clamp(
    ctx, I.f32(values=[[np.nan, np.inf, -np.inf, 0.0, 3.0, -7.0]]), 6.103515625e-5, np.inf)))

for _sh, _shape in SHAPES.items():
    case(f"sum_rows-{_sh}", 1e-12)(_single(
        lambda ctx, I, shape=_shape: ops.sum_rows(ctx, I.f32(*shape, scale=3.0))))
case("sum_rows-permuted", 1e-12)(_single(
    lambda ctx, I: ops.sum_rows(ctx, ops.permute(ctx, I.f32(3, 4, 2, 17), 0, 2, 1, 3))))


def _argsort_input(I, rows, n):
    """Values with many ties, NaNs and infinities (the order is total: ties by index)."""
    v = np.round(I.rng.standard_normal((rows, n)) * 2).astype(np.float32) / 2
    if n > 4:
        v[0, 1] = v[0, 3] = np.nan
        v[1 % rows, 0] = np.inf
        v[-1, n - 1] = -np.inf
    return I.f32(values=v)


for _n in (1, 2, 7, 64, 300, 1024):
    for _order in (0, 1):
        case(f"argsort-n{_n}-{'desc' if _order else 'asc'}", 0.0)(_single(
            lambda ctx, I, n=_n, order=_order: ops.argsort(ctx, _argsort_input(I, 5, n), order)))
case("argsort-permuted", 0.0)(_single(
    lambda ctx, I: ops.argsort(ctx, ops.permute(ctx, I.f32(3, 4, 37), 0, 2, 1, 3), 1)))



def _router_weights(ctx, I, n_tok=9, n_expert=60, k=8):
    """The MoE router's gather: probs [1, n_expert, n_tok] at the strided top-k ids."""
    probs = I.f32(n_tok, n_expert)
    top = ops.argsort_top_k(ctx, probs, k)
    return ops.get_rows(ctx, ops.reshape_3d(ctx, probs, 1, n_expert, n_tok), top)


case("argsort_top_k-get_rows", 0.0)(_single(_router_weights))


def _mask(nq_rows, nkv, I, kind, fully_masked_row=None):
    m = np.zeros((nq_rows, nkv), np.float32)
    m[:, nkv * 2 // 3:] = -np.inf
    m[1, :3] = -np.inf
    if fully_masked_row is not None:
        m[fully_masked_row] = -np.inf
    return I.f16(values=m) if kind == "f16" else I.f32(values=m)


for _mk in ("none", "f32", "f16"):
    for _bias in (0.0, 8.0):
        if _mk == "none" and _bias:
            continue
        case(f"soft_max-{_mk}-bias{_bias:g}", 1e-9)(_single(
            lambda ctx, I, mk=_mk, bias=_bias: ops.soft_max_ext(
                ctx, I.f32(2, 4, 5, 37, scale=3.0),
                None if mk == "none" else _mask(8, 37, I, mk, fully_masked_row=2),
                scale=0.3, max_bias=bias)))
case("soft_max-long-row", 1e-9)(_single(
    lambda ctx, I: ops.soft_max_ext(ctx, I.f32(3, 1100), _mask(3, 1100, I, "f32"), scale=0.1)))
case("soft_max-permuted", 1e-9)(_single(
    lambda ctx, I: ops.soft_max_ext(ctx, ops.permute(ctx, I.f32(5, 4, 37), 0, 2, 1, 3), None)))


def _rope(ctx, I, mode, n_dims, with_ff, ext=0.0, T=5, H=3, D=16, permuted=False):
    x = I.f32(T, H, D)
    if permuted:          # [D, T, H] data viewed as [D, H, T]
        x = ops.permute(ctx, I.f32(H, T, D), 0, 2, 1, 3)
    pos = I.i32(np.array([0, 1, 7, 300, 4000], np.int32)[:T])
    ff = I.f32(n_dims // 2, values=1.0 + I.rng.random(n_dims // 2)) if with_ff else None
    return ops.rope_ext(ctx, x, pos, ff, n_dims=n_dims, mode=mode, freq_base=10000.0,
                        freq_scale=0.5 if not ext else 0.25, n_ctx_orig=512 if ext else 0,
                        ext_factor=ext, attn_factor=1.0)


for _mode in (ROPE_MODE_NORMAL, ROPE_MODE_NEOX):
    for _nd in (16, 10):
        for _ff in (False, True):
            case(f"rope-m{_mode}-d{_nd}-ff{int(_ff)}", 1e-7)(_single(
                lambda ctx, I, m=_mode, nd=_nd, ff=_ff: _rope(ctx, I, m, nd, ff)))
    case(f"rope-m{_mode}-yarn", 1e-7)(_single(
        lambda ctx, I, m=_mode: _rope(ctx, I, m, 16, False, ext=1.0)))
    case(f"rope-m{_mode}-permuted", 1e-7)(_single(
        lambda ctx, I, m=_mode: _rope(ctx, I, m, 16, False, permuted=True)))

WTYPES = ["f32", "f16", "q4_0", "q4_1", "q5_0", "q5_1", "q8_0", "q4_k", "q5_k", "q6_k"]


def _K(wtype, small=64):
    return small if wtype in ("f32", "f16", "i32") or quants.block_size(wtype) < 256 else 512


for _wt in WTYPES + ["i32"]:
    case(f"get_rows-{_wt}", 1e-12)(_single(
        lambda ctx, I, wt=_wt: ops.get_rows(ctx, I.weights(wt, 11, _K(wt)),
                                            I.i32([3, 0, 10, 3, 7]))))
case("get_rows-3d", 1e-12)(_single(
    lambda ctx, I: ops.get_rows(ctx, I.weights("q8_0", 3, 7, 64), I.i32([[1, 6], [0, 0], [5, 2]]))))
case("get_rows-f32-odd", 1e-12)(_single(
    lambda ctx, I: ops.get_rows(ctx, I.f32(9, 33), I.i32([8, 1, 1]))))


def _set_rows(ctx, I, dst, three_d=False):
    if three_d:
        cache = I.weights(dst, 2, 10, 33, scale=0.0)
        rows = I.f32(2, 3, 33)
        idx = I.i32([[7, 2, 5]])                  # broadcast over dim 2
    else:
        cache = I.weights(dst, 10, 64, scale=0.0)
        rows = I.f32(3, 64)
        idx = I.i32([7, 2, 5])
    out = ops.set_rows(ctx, cache, rows, idx)
    return out, cache


for _dt in ("f32", "f16"):
    case(f"set_rows-{_dt}", 1e-12)(lambda ctx, I, dt=_dt: _set_rows(ctx, I, dt))
    case(f"set_rows-{_dt}-3d", 1e-12)(lambda ctx, I, dt=_dt: _set_rows(ctx, I, dt, True))


def _cpy(ctx, I, st, dt):
    a = I.f16(3, 4, 7) if st == "f16" else I.f32(3, 4, 7)
    p = ops.permute(ctx, a, 1, 0, 2, 3)
    dst = ctx.new_tensor(dt, [4, 7, 3], name="dst")
    return ops.cpy(ctx, p, dst), dst


for _st in ("f32", "f16"):
    for _dt in ("f32", "f16"):
        case(f"cpy-{_st}-{_dt}-permuted", 1e-12)(lambda ctx, I, s=_st, d=_dt: _cpy(ctx, I, s, d))
case("cont-transposed-reshaped", 1e-12)(_single(
    lambda ctx, I: ops.cont(ctx, ops.transpose(ctx, I.f32(5, 7)), ne=[35])))
case("cont-f16-permuted", 1e-12)(_single(
    lambda ctx, I: ops.cont(ctx, ops.permute(ctx, I.f16(3, 5, 9), 2, 0, 1, 3))))


def _cpy_into_view(ctx, I):
    """F32 rows written as F16 into every other row of a bigger destination (a KV-cache view)."""
    big = I.weights("f16", 8, 33, scale=0.0)
    v = ops.view_2d(ctx, big, 33, 4, 2 * big.nb[1], big.nb[1])
    return ops.cpy(ctx, I.f32(4, 33), v), big


case("cpy-into-strided-view", 1e-12)(_cpy_into_view)

for _dim in range(4):
    def _cat(ctx, I, dim=_dim, t="f32"):
        sa = [2, 3, 5, 7]
        sb = list(sa)
        sb[3 - dim] = 4
        mk = I.f16 if t == "f16" else I.f32
        return ops.concat(ctx, mk(*sa), mk(*sb), dim)
    case(f"concat-dim{_dim}", 0.0)(_single(_cat))
case("concat-f16-dim1", 0.0)(_single(
    lambda ctx, I: ops.concat(ctx, I.f16(3, 5, 7), I.f16(3, 2, 7), 1)))

for _wt in WTYPES:
    _tol = 1e-9 if _wt == "f32" else 5e-4
    for _M in (1, 3, 8, 17):
        def _mm(ctx, I, wt=_wt, M=_M):
            K = _K(wt, small=96) if wt != "f32" else 33
            return ops.mul_mat(ctx, I.weights(wt, 13, K), I.f32(M, K))
        case(f"mul_mat-{_wt}-M{_M}", _tol)(_single(_mm))
    case(f"mul_mat-{_wt}-broadcast", _tol)(_single(
        lambda ctx, I, wt=_wt: ops.mul_mat(ctx, I.weights(wt, 1, 2, 7, _K(wt)),
                                           I.f32(3, 4, 10, _K(wt)))))
case("mul_mat-f16-permuted-activations", 5e-4)(_single(
    lambda ctx, I: ops.mul_mat(ctx, I.f16(2, 9, 32),
                               ops.permute(ctx, I.f32(3, 4, 32), 0, 2, 1, 3))))
case("mul_mat-f32-big-M", 1e-9)(_single(
    lambda ctx, I: ops.mul_mat(ctx, I.f32(70, 40), I.f32(2, 130, 40))))


def _mul_mat_id(ctx, I, wt, n_tok, n_b, n_expert=6, n_used=3, N=13, top_k=False):
    """Experts [K, N, n_expert]; ids random (repeats allowed, expert 5 never chosen) or the
    strided view argsort_top_k makes."""
    K = _K(wt, small=96) if wt != "f32" else 33
    w = I.weights(wt, n_expert, N, K)
    x = I.f32(n_tok, n_b, K)
    if top_k:
        ids = ops.argsort_top_k(ctx, I.f32(n_tok, n_expert), n_used)
    else:
        ids = I.i32(I.rng.integers(0, n_expert - 1, (n_tok, n_used)))
    return ops.mul_mat_id(ctx, w, x, ids)


for _wt in WTYPES:
    _tol = 1e-9 if _wt == "f32" else 5e-4
    for _nt in (1, 9):
        for _nb in (1, 3):
            case(f"mul_mat_id-{_wt}-T{_nt}-b{_nb}", _tol)(_single(
                lambda ctx, I, wt=_wt, nt=_nt, nb=_nb: _mul_mat_id(ctx, I, wt, nt, nb)))
for _wt in ("f32", "f16", "q4_0", "q4_k", "q6_k"):
    # the tiled kernel with more entries per expert than one tile (96 tokens x 2 of 4 experts)
    case(f"mul_mat_id-{_wt}-T96-tiles", 1e-9 if _wt == "f32" else 5e-4)(_single(
        lambda ctx, I, wt=_wt: _mul_mat_id(ctx, I, wt, 96, 1, n_expert=5, n_used=2, N=70)))
case("mul_mat_id-q4_0-top_k-ids", 5e-4)(_single(
    lambda ctx, I: _mul_mat_id(ctx, I, "q4_0", 7, 1, n_expert=8, n_used=2, top_k=True)))


def _moe_block(ctx, I, wt, T, k=2, gating="softmax", norm_w=True, E=256, F=256, n_expert=8):
    """The whole MoE FFN (llm/moe.py) on one backend: router, top-k, weights, experts, sum."""
    from pyggml.llm.moe import moe_ffn
    x = I.f32(T, E)
    router = I.f32(n_expert, E, scale=0.1)
    up, gate = I.weights(wt, n_expert, F, E, scale=0.2), I.weights(wt, n_expert, F, E, scale=0.2)
    down = I.weights(wt, n_expert, E, F, scale=0.2)
    return moe_ffn(ctx, x, router, up, gate, down, k, gating=gating, norm_w=norm_w)


for _wt, _T, _k, _gating in (("q4_0", 1, 2, "softmax"), ("q4_k", 5, 4, "sigmoid"),
                             ("q4_k", 40, 2, "softmax"), ("f16", 3, 1, "softmax_weight")):
    case(f"moe_ffn-{_wt}-T{_T}-k{_k}-{_gating}", 5e-4)(_single(
        lambda ctx, I, wt=_wt, T=_T, k=_k, g=_gating: _moe_block(ctx, I, wt, T, k, g)))


def _fa(ctx, I, kv, softcap=0.0, mask="f16", bias=0.0, nq=5, nkv=41, D=40, H=4, Hkv=2):
    q = I.f32(H, nq, D)
    k = (I.f16 if kv == "f16" else I.f32)(Hkv, nkv, D)
    v = (I.f16 if kv == "f16" else I.f32)(Hkv, nkv, D)
    m = None
    if mask != "none":
        mv = np.zeros((8, nkv), np.float32)
        for i in range(nq):
            mv[i, nkv - nq + i + 1:] = -np.inf
        mv[1, :4] = -np.inf
        if nq > 3:
            mv[3, :] = -np.inf                    # a row with every key masked: zeros
        m = I.f16(values=mv) if mask == "f16" else I.f32(values=mv)
    return ops.flash_attn_ext(ctx, q, k, v, m, scale=1 / np.sqrt(D), max_bias=bias,
                              logit_softcap=softcap)


for _kv in ("f32", "f16"):
    _tol = 1e-9 if _kv == "f32" else 1e-6
    case(f"flash_attn-{_kv}", _tol)(_single(lambda ctx, I, kv=_kv: _fa(ctx, I, kv)))
    case(f"flash_attn-{_kv}-softcap", _tol)(_single(lambda ctx, I, kv=_kv: _fa(ctx, I, kv, 20.0)))
    case(f"flash_attn-{_kv}-f32mask-alibi", _tol)(_single(
        lambda ctx, I, kv=_kv: _fa(ctx, I, kv, mask="f32", bias=8.0)))
    case(f"flash_attn-{_kv}-nomask-decode", _tol)(_single(
        lambda ctx, I, kv=_kv: _fa(ctx, I, kv, mask="none", nq=1, nkv=70, D=64, H=8, Hkv=1)))


def _fa_batch(ctx, I, B=2, H=2, nq=3, nkv=9, D=16):
    q, k, v = I.f32(B, H, nq, D), I.f16(B, 1, nkv, D), I.f16(B, 1, nkv, D)
    mv = np.zeros((B, 1, 4, nkv), np.float32)
    mv[1, 0, :, 6:] = -np.inf                     # a different mask per sequence
    return ops.flash_attn_ext(ctx, q, k, v, I.f16(values=mv), scale=0.3)


case("flash_attn-batch", 1e-6)(_single(_fa_batch))


def _attention_block(ctx, I, flash: bool, kv="f16", T=3, H=4, Hkv=2, D=40, n_ctx=20, n_kv=16):
    """The model runtime's attention: this ubatch's K/V written into a cache with set_rows, read
    back through 3-D views [D, n_kv, Hkv] of the [D*Hkv, n_ctx] cache, q permuted to [D, T, H];
    flash attention, or mul_mat + soft_max + mul_mat over a cont of the permuted V view."""
    ck = I.weights(kv, n_ctx, D * Hkv, scale=0.5, name="cache_k")
    cv = I.weights(kv, n_ctx, D * Hkv, scale=0.5, name="cache_v")
    k, v = I.f32(T, D * Hkv), I.f32(T, D * Hkv)
    idx = I.i32([9, 2, 15][:T])
    ks = ops.set_rows(ctx, ck, k, idx)
    vs = ops.set_rows(ctx, cv, v, idx)
    kview = ops.view_3d(ctx, ks, D, n_kv, Hkv, ck.nb[1], ck.nb[0] * D, 0)
    vview = ops.view_3d(ctx, vs, D, n_kv, Hkv, cv.nb[1], cv.nb[0] * D, 0)
    qp = ops.permute(ctx, I.f32(T, H, D), 0, 2, 1, 3)               # [D, T, H]
    mv = np.zeros((T, n_kv), np.float32)
    mv[:, 11:] = -np.inf
    mask = I.f16(values=mv)
    if flash:
        o = ops.flash_attn_ext(ctx, qp, kview, vview, mask, scale=0.15)
        return o, o
    kq = ops.soft_max_ext(ctx, ops.mul_mat(ctx, kview, qp), mask, scale=0.15)
    vt = ops.cont(ctx, ops.permute(ctx, vview, 1, 0, 2, 3))            # [n_kv, D, Hkv]
    o = ops.cont(ctx, ops.permute(ctx, ops.mul_mat(ctx, vt, kq), 0, 2, 1, 3))
    return o, o


for _kv in ("f16", "f32"):
    # with an f16 cache the CPU rounds q to fp16 for K·q (both paths), the shaders only for flash
    case(f"attention-flash-cache-{_kv}", 1e-6 if _kv == "f32" else 1e-5)(
        lambda ctx, I, kv=_kv: _attention_block(ctx, I, True, kv))
    case(f"attention-mul_mat-cache-{_kv}", 1e-6 if _kv == "f32" else 1e-5)(
        lambda ctx, I, kv=_kv: _attention_block(ctx, I, False, kv))


# the rpc-server's cases (ggml's CPU kernels: K 256 for every quantized type)
for _op in ("add", "sub", "mul", "div"):
    case(f"{_op}-broadcast", 1e-12)(_single(
        lambda ctx, I, op=_op: getattr(ops, op)(ctx, I.f32(2, 3, 5, 33),
                                                I.f32(5, 33, offset=3.0 if op == "div" else 0))))
case("scale-bias", 1e-12)(_single(lambda ctx, I: ops.scale(ctx, I.f32(3, 70), 0.37, 0.5)))
case("gelu", 1e-12)(_single(lambda ctx, I: ops.gelu(ctx, I.f32(4, 65, scale=4.0))))
case("silu", 1e-10)(_single(lambda ctx, I: ops.silu(ctx, I.f32(4, 65, scale=3.0))))
case("tanh", 1e-10)(_single(lambda ctx, I: ops.tanh(ctx, I.f32(4, 65, scale=3.0))))
case("sqr-sqrt", 1e-12)(_single(lambda ctx, I: ops.sqrt(ctx, ops.sqr(ctx, I.f32(3, 40)))))
case("diag_mask_inf", 0.0)(_single(lambda ctx, I: ops.diag_mask_inf(ctx, I.f32(5, 9), 3)))
case("rms_norm", 1e-10)(_single(lambda ctx, I: ops.rms_norm(ctx, I.f32(3, 640, offset=0.5), 1e-6)))
case("norm", 1e-10)(_single(lambda ctx, I: ops.norm(ctx, I.f32(3, 100, offset=0.5), 1e-5)))
case("soft_max-f16-mask", 1e-9)(_single(
    lambda ctx, I: ops.soft_max_ext(ctx, I.f32(2, 4, 37, scale=3.0),
                                    I.f16(values=np.where(np.arange(37) > 30, -np.inf, 0)
                                          * np.ones((4, 1))), scale=0.3)))
for _mode in (ROPE_MODE_NORMAL, ROPE_MODE_NEOX):
    case(f"rope-m{_mode}", 1e-7)(_single(
        lambda ctx, I, m=_mode: ops.rope_ext(ctx, I.f32(5, 3, 16), I.i32([0, 1, 7, 300, 4000]),
                                             n_dims=16, mode=m, freq_base=10000.0)))
case("rope-neox-freq-factors", 1e-7)(_single(
    lambda ctx, I: ops.rope_ext(ctx, I.f32(3, 2, 16), I.i32([0, 5, 9]),
                                I.f32(8, values=1.0 + np.arange(8) / 8), n_dims=16,
                                mode=ROPE_MODE_NEOX, freq_base=1e6)))
for _wt in ("f32", "q8_0", "q4_k", "q6_k"):
    case(f"get_rows-{_wt}-K256", 1e-12)(_single(
        lambda ctx, I, wt=_wt: ops.get_rows(ctx, I.weights(wt, 11, 256), I.i32([3, 0, 10, 3]))))
# (set_rows-f32, set_rows-f16 and cpy-f32-f16-permuted were here: the cases of those names
# above build exactly the same graph from the same values)
case("cont-transposed", 1e-12)(_single(lambda ctx, I: ops.cont(ctx, ops.transpose(ctx,
                                                                            I.f32(5, 7)))))
case("concat-dim1-3d", 0.0)(_single(
    lambda ctx, I: ops.concat(ctx, I.f32(3, 5, 7), I.f32(3, 2, 7), 1)))
for _wt in ("f32", "f16", "q4_0", "q8_0", "q4_k", "q5_k", "q6_k"):
    for _M in (1, 7):
        case(f"mul_mat-{_wt}-M{_M}-K256", 1e-9 if _wt == "f32" else 5e-4)(_single(
            lambda ctx, I, wt=_wt, M=_M: ops.mul_mat(ctx, I.weights(wt, 13, 256), I.f32(M, 256))))
case("mul_mat-kq-broadcast", 5e-4)(_single(
    lambda ctx, I: ops.mul_mat(ctx, I.f16(2, 9, 32), ops.permute(ctx, I.f32(3, 4, 32),
                                                                 0, 2, 1, 3))))


# the MoE ops against ggml's own CPU kernels (ARGSORT inputs without ties: ggml's std::sort
# leaves their order unspecified)
def _mul_mat_id_k256(ctx, I, wt, T, n_b, top_k=False, n_expert=6, n_used=3):
    w = I.weights(wt, n_expert, 13, 256)
    ids = (ops.argsort_top_k(ctx, I.f32(T, n_expert), n_used) if top_k
           else I.i32(I.rng.integers(0, n_expert, (T, n_used))))
    return ops.mul_mat_id(ctx, w, I.f32(T, n_b, 256), ids)


for _wt in ("f32", "f16", "q4_0", "q8_0", "q4_k", "q6_k"):
    for _T, _nb in ((1, 1), (9, 3), (9, 1)):
        case(f"mul_mat_id-{_wt}-T{_T}-b{_nb}-K256", 1e-9 if _wt == "f32" else 1e-6)(_single(
            lambda ctx, I, wt=_wt, T=_T, nb=_nb: _mul_mat_id_k256(ctx, I, wt, T, nb)))
case("mul_mat_id-q4_k-top_k-ids", 1e-6)(_single(
    lambda ctx, I: _mul_mat_id_k256(ctx, I, "q4_k", 7, 1, True)))
for _order in (0, 1):
    case(f"argsort-{_order}", 0.0)(_single(
        lambda ctx, I, o=_order: ops.argsort(ctx, I.f32(3, 4, 60), o)))
case("sum_rows", 1e-12)(_single(lambda ctx, I: ops.sum_rows(ctx, I.f32(3, 5, 70, scale=3.0))))
case("clamp", 0.0)(_single(lambda ctx, I: ops.clamp(ctx, I.f32(4, 65, scale=3.0), -1.5, 2.25)))
case("sigmoid", 1e-12)(_single(lambda ctx, I: ops.sigmoid(ctx, I.f32(4, 65, scale=3.0))))


def _moe_ffn_k256(ctx, I, wt, T, k, norm_w):
    from pyggml.llm.moe import moe_ffn
    n_expert, E, F = 8, 256, 256
    up, gate = (I.weights(wt, n_expert, F, E, scale=0.2) for _ in range(2))
    return moe_ffn(ctx, I.f32(T, E), I.f32(n_expert, E, scale=0.1), up, gate,
                   I.weights(wt, n_expert, E, F, scale=0.2), k, norm_w=norm_w)


case("moe_ffn-q4_k-T5-k2-norm", 1e-6)(_single(
    lambda ctx, I: _moe_ffn_k256(ctx, I, "q4_k", 5, 2, True)))
case("moe_ffn-q4_0-T1-k4", 1e-6)(_single(
    lambda ctx, I: _moe_ffn_k256(ctx, I, "q4_0", 1, 4, False)))


def _fa_causal(ctx, I, nq=5, nkv=41, D=64, H=4, Hkv=1):
    mv = np.zeros((8, nkv), np.float32)
    for i in range(nq):
        mv[i, nkv - nq + i + 1:] = -np.inf
    return ops.flash_attn_ext(ctx, I.f32(H, nq, D), I.f16(Hkv, nkv, D), I.f16(Hkv, nkv, D),
                              I.f16(values=mv), scale=1 / np.sqrt(D))


case("flash_attn-f16-prefill", 5e-6)(_single(_fa_causal))
case("flash_attn-f16-decode", 5e-6)(_single(lambda ctx, I: _fa_causal(ctx, I, nq=1, nkv=70)))


# the types of the files of 2026 (issue 32): dequantized rows bit for bit (NMSE 0), products
# against the CPU's Q8_0 / Q8_K activations within the quantized bound; MXFP4's 17-byte blocks
# put rows at odd byte offsets (K 96: 51-byte rows)
NEW_WTYPES = ["iq4_nl", "iq4_xs", "mxfp4", "iq2_xxs", "iq2_xs", "iq2_s", "iq3_xxs", "iq3_s",
              "iq1_s", "iq1_m", "tq1_0", "tq2_0"]


for _wt in NEW_WTYPES:
    case(f"get_rows-{_wt}", 0.0)(_single(
        lambda ctx, I, wt=_wt: ops.get_rows(ctx, I.weights(wt, 11, _K(wt, 160)),
                                            I.i32([3, 0, 10, 3, 7]))))
    if _wt not in NEW_WTYPES[:3]:      # the others share the super-block loops of IQ4_XS:
        for _M, _T in ((1, 1), (17, 9)):   # one matrix-vector and one tiled shape each
            case(f"mul_mat-{_wt}-M{_M}", 5e-4)(_single(
                lambda ctx, I, wt=_wt, M=_M: ops.mul_mat(ctx, I.weights(wt, 13, 512),
                                                         I.f32(M, 512))))
            case(f"mul_mat_id-{_wt}-T{_T}", 5e-4)(_single(
                lambda ctx, I, wt=_wt, T=_T: _mul_mat_id(ctx, I, wt, T, 1)))
        continue
    for _M in (1, 3, 17):
        case(f"mul_mat-{_wt}-M{_M}", 5e-4)(_single(
            lambda ctx, I, wt=_wt, M=_M: ops.mul_mat(ctx, I.weights(wt, 13, _K(wt, 96)),
                                                     I.f32(M, _K(wt, 96)))))
    case(f"mul_mat-{_wt}-broadcast", 5e-4)(_single(
        lambda ctx, I, wt=_wt: ops.mul_mat(ctx, I.weights(wt, 1, 2, 7, _K(wt, 96)),
                                           I.f32(3, 4, 10, _K(wt, 96)))))
    for _nt in (1, 9):
        case(f"mul_mat_id-{_wt}-T{_nt}", 5e-4)(_single(
            lambda ctx, I, wt=_wt, nt=_nt: _mul_mat_id(ctx, I, wt, nt, 3 if nt == 9 else 1)))
    case(f"mul_mat_id-{_wt}-T96-tiles", 5e-4)(_single(
        lambda ctx, I, wt=_wt: _mul_mat_id(ctx, I, wt, 96, 1, n_expert=5, n_used=2, N=70)))


# the ops of the 2026 architectures (issues 32, 33): attention sinks (gpt-oss) in both attention
# paths, gpt-oss's clamped SwiGLU (composed of existing ops), SOFTPLUS, and the recurrent ops
# (SSM_CONV, GATED_DELTA_NET) with sequences interleaved in one ubatch, decode and prompt forms
def _sinks(I, H):
    return I.f32(H, values=np.array([2.5, -1.0, 40.0, -np.inf, 0.3, 1.0, -3.0, 7.0])[:H])


for _mk in ("none", "f16"):
    case(f"soft_max-sinks-{_mk}", 1e-9)(_single(
        lambda ctx, I, mk=_mk: ops.soft_max_ext(
            ctx, I.f32(2, 4, 5, 37, scale=3.0),
            None if mk == "none" else _mask(8, 37, I, mk, fully_masked_row=2), scale=0.3,
            sinks=_sinks(I, 4))))
for _kv in ("f32", "f16"):
    case(f"flash_attn-{_kv}-sinks", 1e-9 if _kv == "f32" else 1e-6)(_single(
        lambda ctx, I, kv=_kv: ops.flash_attn_ext(
            ctx, I.f32(4, 5, 40), (I.f16 if kv == "f16" else I.f32)(2, 41, 40),
            (I.f16 if kv == "f16" else I.f32)(2, 41, 40), _mask(8, 41, I, "f16", 3), scale=0.16,
            sinks=_sinks(I, 4))))
case("flash_attn-sinks-decode", 1e-6)(_single(
    lambda ctx, I: ops.flash_attn_ext(ctx, I.f32(8, 1, 64), I.f16(1, 70, 64), I.f16(1, 70, 64),
                                      None, scale=0.125, sinks=_sinks(I, 8))))


def _swiglu_oai(ctx, I):
    from pyggml.llm.moe import swiglu_oai
    return swiglu_oai(ctx, I.f32(3, 70, scale=9.0), I.f32(3, 70, scale=9.0))


case("swiglu_oai", 1e-10)(_single(_swiglu_oai))
for _sh, _shape in SHAPES.items():
    case(f"softplus-{_sh}", 1e-10)(_single(
        lambda ctx, I, shape=_shape: ops.softplus(ctx, I.f32(*shape, scale=12.0))))


def _ssm_conv(ctx, I, C=37, T=9, K=4, S=3, seq=None):
    x = ops.view_2d(ctx, I.f32(T, C + 3), C, T, (C + 3) * 4, 0)         # rows C + 3 apart
    seq = I.i32(I.rng.integers(0, S, T) if seq is None else seq)
    return ops.ssm_conv(ctx, x, I.f32(C, K), I.f32(S, (K - 1) * C), seq)


case("ssm_conv-decode", 1e-10)(_single(lambda ctx, I: _ssm_conv(ctx, I, T=1, S=1, seq=[0])))
case("ssm_conv-prompt-3seqs", 1e-10)(_single(lambda ctx, I: _ssm_conv(ctx, I)))
case("ssm_conv-K3-long", 1e-10)(_single(lambda ctx, I: _ssm_conv(ctx, I, C=70, T=40, K=3, S=2)))


def _gated_delta(ctx, I, T, H, Hk, Dk, Dv, S):
    q = I.f32(T, Hk, Dk)
    kv = I.rng.standard_normal((T, Hk, Dk))
    k = I.f32(values=kv / np.linalg.norm(kv, axis=-1, keepdims=True))    # l2-normed, as the models
    g = I.f32(T, H, values=-np.abs(I.rng.standard_normal((T, H))))
    beta = I.f32(T, H, values=1 / (1 + np.exp(-I.rng.standard_normal((T, H)))))
    return ops.gated_delta(ctx, q, k, I.f32(T, H, Dv), g, beta,
                           I.f32(S, Dk * Dv * H, scale=0.1), I.i32(I.rng.integers(0, S, T)),
                           1 / np.sqrt(Dk))


for _T, _H, _Hk, _Dk, _Dv, _S in ((1, 4, 2, 32, 16, 1), (11, 4, 2, 16, 8, 3), (9, 2, 1, 128, 40, 2),
                                  (5, 3, 3, 37, 35, 1)):
    case(f"gated_delta-T{_T}-H{_H}-Hk{_Hk}-Dk{_Dk}-Dv{_Dv}-S{_S}", 1e-9)(_single(
        lambda ctx, I, a=(_T, _H, _Hk, _Dk, _Dv, _S): _gated_delta(ctx, I, *a)))


# ---- where a backend differs ---------------------------------------------------------------------

_RPC_CONTIGUOUS = ("refused: ggml's CPU kernels need a contiguous input (SCALE, DIAG_MASK_INF) or "
                   "rows evenly spaced over dims 1..3 (CLAMP, ARGSORT)")
not_on("rpc", _RPC_CONTIGUOUS, ["scale-permuted", "diag_mask_inf-permuted", "clamp-permuted",
                                "argsort-permuted"])
not_on("rpc", "refused: ggml's CPU kernel reads the mask of FLASH_ATTN_EXT as F16",
       ["flash_attn-f32-f32mask-alibi", "flash_attn-f16-f32mask-alibi"])
not_on("rpc", "ties: ggml sorts with std::sort, which leaves the order of equal values "
              "unspecified (pyggml's order is total: ties by index)",
       [f"argsort-n{n}-{o}" for n in (7, 64, 300, 1024) for o in ("asc", "desc")])
not_on("rpc", "a row with every key masked: ggml's soft_max gives NaN (0/0), pyggml's zeros",
       [f"soft_max-{m}-bias{b}" for m in ("f32", "f16") for b in (0, 8)])
bound("rpc", 5e-6, [n for n in CASES if n.startswith("flash_attn-f16")])
# the K-256 matrix-product cases of quantized experts: the Vulkan shaders use fp32 activations
bound("vulkan", 5e-4, [n for n in CASES if n.endswith("-K256") and n.startswith("mul_mat_id-q")]
      + ["mul_mat_id-q4_k-top_k-ids", "moe_ffn-q4_k-T5-k2-norm", "moe_ffn-q4_0-T1-k4"])
# the issue-32/33 cases on the rpc-server: IQ4_NL, IQ4_XS, sinks without a fully masked row,
# SwiGLU-OAI and SOFTPLUS run there against ggml's own kernels; the others not (yet)
_NOT_SENT = [t for t in NEW_WTYPES if t not in ("iq4_nl", "iq4_xs")]
not_on("rpc", "the rpc backend does not send these weight types (pyggml/backend/rpc)",
       [n for n in CASES if any(n.startswith(f"{op}-{t}-") or n == f"get_rows-{t}"
                                for t in _NOT_SENT for op in ("mul_mat", "mul_mat_id"))])
not_on("rpc", "a row with every key masked: ggml's soft_max gives NaN (0/0), pyggml's zeros",
       ["soft_max-sinks-f16"])
not_on("rpc", "not yet run against the rpc-server (the sinks of FLASH_ATTN_EXT)",
       [n for n in CASES if n.startswith("flash_attn") and "sinks" in n])
not_on("rpc", "pyggml's recurrent ops (states per sequence, seq ids) have no ggml op of that "
              "contract", [n for n in CASES if n.startswith(("ssm_conv", "gated_delta"))])
