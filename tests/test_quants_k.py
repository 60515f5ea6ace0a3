"""K-quants (Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, Q8_K) through pyggml.quants, on every CPU path.

Oracles:
  - dequantize: gguf.quants.dequantize (gguf 0.19 implements it for Q2_K..Q6_K), bit for bit.
  - quantize: gguf.quants has NO quantizer for any K-quant nor for Q8_K (it raises
    NotImplementedError, checked below), so this file carries its own numpy reference of ggml's
    reference quantizers without importance matrix (quantize_row_q{2..6}_K_ref with
    make_qkx2_quants / make_q3_quants / make_qx_quants, and quantize_row_q8_K_ref). It evaluates
    every fp32 operation in C's order, one rounding each, vectorized across sub-blocks only, so
    its bytes must equal the library's exactly. (During development the C reference was also
    compared byte for byte with ggml's own C functions; the only difference by design: Q8_K bsums
    of an all-zero block, which ggml leaves unwritten and we set to 0.)
  - vec_dot: a float64 dot of the dequantized weight row and the dequantized Q8_K row.
"""

from __future__ import annotations

import gguf
import gguf.quants as gq
import numpy as np
import pytest

from pyggml import _native, quants
from pyggml.errors import ShapeError, UnsupportedTypeError

F = np.float32
QK = 256
WEIGHT_TYPES = ["q2_K", "q3_K", "q4_K", "q5_K", "q6_K"]
GQT = {"q2_K": gguf.GGMLQuantizationType.Q2_K, "q3_K": gguf.GGMLQuantizationType.Q3_K,
       "q4_K": gguf.GGMLQuantizationType.Q4_K, "q5_K": gguf.GGMLQuantizationType.Q5_K,
       "q6_K": gguf.GGMLQuantizationType.Q6_K, "q8_K": gguf.GGMLQuantizationType.Q8_K}
BLOCK_BYTES = {"q2_K": 84, "q3_K": 110, "q4_K": 144, "q5_K": 176, "q6_K": 210, "q8_K": 292}


@pytest.fixture(params=_native.available_paths())
def path(request):
    """Run the test on one CPU path, then restore the previous one."""
    prev = _native.cpu_path()
    _native.set_cpu_path(request.param)
    yield request.param
    _native.set_cpu_path(prev)


# ---- numpy reference of ggml's K-quant reference quantizers ---------------------------------

def nearest_int(v):
    """ggml's nearest_int: add 1.5*2^23 in fp32 and read the mantissa (ties to even)."""
    t = (np.asarray(v, dtype=F) + F(12582912.0)).view(np.int32)
    return (t & 0x007FFFFF) - 0x00400000


def f16(v):
    """fp32 -> fp16 bits (RNE, overflow to inf) and the fp32 value they hold."""
    h = np.asarray(v, dtype=F).astype(np.float16)
    return h.view(np.uint16), h.astype(F)


def first_absmax(x):
    """(amax, signed value at the first index reaching it) per row: the C scan `ax > amax`."""
    ax = np.abs(x)
    idx = np.argmax(ax, axis=-1)
    rows = np.arange(x.shape[0])
    return ax[rows, idx], x[rows, idx]


def make_qx_quants(x, nmax):
    """make_qx_quants(n, nmax, x, L, rmse_type=1, qw=NULL): weights x^2. -> (scale, L 0..2nmax-1)"""
    g, n = x.shape
    amax, mx = first_absmax(x)
    zero = amax < F(1e-15)
    w = x * x

    def fit(iscale):
        lv = np.clip(nearest_int(iscale[:, None] * x), -nmax, nmax - 1)
        lf = lv.astype(F)
        sumlx, suml2 = np.zeros(g, F), np.zeros(g, F)
        for i in range(n):
            sumlx = sumlx + w[:, i] * x[:, i] * lf[:, i]
            suml2 = suml2 + w[:, i] * lf[:, i] * lf[:, i]
        return lv, sumlx, suml2

    lv, sumlx, suml2 = fit(F(-nmax) / mx)
    L = lv + nmax
    scale = np.where(suml2 != 0, sumlx / suml2, F(0)).astype(F)
    best = scale * sumlx
    for is_ in range(-9, 10):
        if is_ == 0:
            continue
        lv, sumlx, suml2 = fit(-(F(nmax) + F(0.1) * F(is_)) / mx)
        better = (suml2 > 0) & (sumlx * sumlx > best * suml2)
        L = np.where(better[:, None], lv + nmax, L)
        scale = np.where(better, sumlx / suml2, scale).astype(F)
        best = np.where(better, scale * sumlx, best).astype(F)
    L[zero] = 0
    scale[zero] = 0
    return scale, L


def make_q3_quants(x, nmax):
    """make_q3_quants(n, nmax, x, L, do_rmse=true): coordinate descent, 5 passes at most."""
    g, n = x.shape
    amax, mx = first_absmax(x)
    zero = amax < F(1e-15)
    w = x * x
    L = np.clip(nearest_int((F(-nmax) / mx)[:, None] * x), -nmax, nmax - 1)
    sumlx, suml2 = np.zeros(g, F), np.zeros(g, F)
    for i in range(n):
        lf = L[:, i].astype(F)
        sumlx = sumlx + w[:, i] * x[:, i] * lf
        suml2 = suml2 + w[:, i] * lf * lf
    alive = np.ones(g, bool)
    for _ in range(5):
        changed = np.zeros(g, bool)
        for i in range(n):
            wi, xi, li = w[:, i], x[:, i], L[:, i].astype(F)
            slx = sumlx - wi * xi * li
            sl2 = suml2 - wi * li * li
            new_l = np.clip(nearest_int(xi * sl2 / slx), -nmax, nmax - 1)
            nf = new_l.astype(F)
            slx2 = slx + wi * xi * nf
            sl22 = sl2 + wi * nf * nf
            upd = (alive & (slx > 0) & (new_l != L[:, i]) & (sl22 > 0)
                   & (slx2 * slx2 * suml2 > sumlx * sumlx * sl22))
            L[:, i] = np.where(upd, new_l, L[:, i])
            sumlx = np.where(upd, slx2, sumlx).astype(F)
            suml2 = np.where(upd, sl22, suml2).astype(F)
            changed |= upd
        alive &= changed
    scale = np.where(suml2 > 0, sumlx / suml2, F(0)).astype(F)
    L = L + nmax
    L[zero] = 0
    scale[zero] = 0
    return scale, L


def make_qkx2_quants(x, weights, nmax, rmin, rdelta, nstep, use_mad):
    """make_qkx2_quants: asymmetric x ~ scale*L - the_min. -> (scale, the_min, L 0..nmax)"""
    g, n = x.shape
    mn, mx = x[:, 0].copy(), x[:, 0].copy()
    sum_w = weights[:, 0].copy()
    sum_x = sum_w * x[:, 0]
    for i in range(1, n):
        mn = np.where(x[:, i] < mn, x[:, i], mn)
        mx = np.where(x[:, i] > mx, x[:, i], mx)
        sum_w = sum_w + weights[:, i]
        sum_x = sum_x + weights[:, i] * x[:, i]
    mn = np.where(mn > 0, F(0), mn).astype(F)
    flat = mx == mn

    def err(scale, lf, m):
        e = np.zeros(g, F)
        for i in range(n):
            d = scale * lf[:, i] + m - x[:, i]
            d = np.abs(d) if use_mad else d * d
            e = e + weights[:, i] * d
        return e

    iscale = F(nmax) / (mx - mn)
    scale = F(1) / iscale
    L = np.clip(nearest_int(iscale[:, None] * (x - mn[:, None])), 0, nmax)
    best = err(scale, L.astype(F), mn)
    for is_ in range(nstep + 1):
        isc = (F(rmin) + F(rdelta) * F(is_) + F(nmax)) / (mx - mn)
        la = np.clip(nearest_int(isc[:, None] * (x - mn[:, None])), 0, nmax)
        lf = la.astype(F)
        sl, sl2, sxl = np.zeros(g, F), np.zeros(g, F), np.zeros(g, F)
        for i in range(n):
            wi = weights[:, i]
            sl = sl + wi * lf[:, i]
            sl2 = sl2 + wi * lf[:, i] * lf[:, i]
            sxl = sxl + wi * lf[:, i] * x[:, i]
        D = sum_w * sl2 - sl * sl
        this_scale = (sum_w * sxl - sum_x * sl) / D
        this_min = (sl2 * sum_x - sl * sxl) / D
        pos = this_min > 0
        this_min = np.where(pos, F(0), this_min).astype(F)
        this_scale = np.where(pos, sxl / sl2, this_scale).astype(F)
        cur = err(this_scale, lf, this_min)
        better = (D > 0) & (cur < best)
        L = np.where(better[:, None], la, L)
        best = np.where(better, cur, best).astype(F)
        scale = np.where(better, this_scale, scale).astype(F)
        mn = np.where(better, this_min, mn).astype(F)
    L[flat] = 0
    scale = np.where(flat, F(0), scale).astype(F)
    return scale, -mn, L


def running_max(v):
    """The C loop `if (v[j] > m) m = v[j]` from m = 0 over the last axis (NaN never wins)."""
    m = np.zeros(v.shape[0], F)
    for j in range(v.shape[1]):
        m = np.where(v[:, j] > m, v[:, j], m)
    return m


def pack_2bit(L):
    """(B, 256) levels 0..3 -> (B, 64): element 128n + 32j + l at bits 2j of byte 32n + l."""
    q = L.reshape(-1, 2, 4, 32).astype(np.uint8)
    return (q[:, :, 0] | (q[:, :, 1] << 2) | (q[:, :, 2] << 4) | (q[:, :, 3] << 6)).reshape(-1, 64)


def ref_q2_K(x):
    B = x.shape[0]
    xs = x.reshape(B * 16, 16)
    scales, mins, L = make_qkx2_quants(xs, np.abs(xs), 3, -0.5, 0.1, 15, True)
    scales, mins, L = scales.reshape(B, 16), mins.reshape(B, 16), L.reshape(B, 256)
    max_scale, max_min = running_max(scales), running_max(mins)
    sc = np.where((max_scale > 0)[:, None],
                  nearest_int((F(15) / max_scale)[:, None] * scales) & 0xFF, 0)
    d16, d = f16(np.where(max_scale > 0, max_scale / F(15), F(0)))
    sc = sc | np.where((max_min > 0)[:, None],
                       (nearest_int((F(15) / max_min)[:, None] * mins) << 4) & 0xFF, 0)
    m16, dm = f16(np.where(max_min > 0, max_min / F(15), F(0)))
    dl = d[:, None] * (sc & 0xF).astype(F)
    ml = dm[:, None] * (sc >> 4).astype(F)
    req = np.clip(nearest_int((x.reshape(B, 16, 16) + ml[:, :, None]) / dl[:, :, None]), 0, 3)
    L = np.where((dl != 0)[:, :, None], req, L.reshape(B, 16, 16)).reshape(B, 256)
    out = np.zeros((B, 84), np.uint8)
    out[:, :16] = sc
    out[:, 16:80] = pack_2bit(L)
    out[:, 80:82] = d16.view(np.uint8).reshape(B, 2)
    out[:, 82:84] = m16.view(np.uint8).reshape(B, 2)
    return out


def ref_q3_K(x):
    B = x.shape[0]
    scales, L = make_q3_quants(x.reshape(B * 16, 16), 4)
    scales, L = scales.reshape(B, 16), L.reshape(B, 256)
    amax, max_scale = np.zeros(B, F), np.zeros(B, F)
    for j in range(16):
        s = np.abs(scales[:, j])
        upd = s > amax
        amax = np.where(upd, s, amax)
        max_scale = np.where(upd, scales[:, j], max_scale)
    nz = max_scale != 0
    iscale = F(-32) / np.where(nz, max_scale, F(1))
    l8 = ((nearest_int(iscale[:, None] * scales) + 128) & 0xFF) - 128        # (int8_t) cast
    lq = np.where(nz[:, None], np.clip(l8, -32, 31) + 32, 0)
    sb = np.zeros((B, 12), np.int64)
    for j in range(16):
        if j < 8:
            sb[:, j] |= lq[:, j] & 0xF
        else:
            sb[:, j - 8] |= (lq[:, j] & 0xF) << 4
        sb[:, 8 + j % 4] |= (lq[:, j] >> 4) << (2 * (j // 4))
    d16, d = f16(np.where(nz, F(1) / iscale, F(0)))
    dl = d[:, None] * (lq - 32).astype(F)
    req = np.clip(nearest_int(x.reshape(B, 16, 16) / dl[:, :, None]), -4, 3) + 4
    L = np.where((dl != 0)[:, :, None], req, L.reshape(B, 16, 16)).reshape(B, 256)
    hi = L > 3
    hmask = np.zeros((B, 32), np.int64)
    for k in range(8):
        hmask |= hi[:, 32 * k:32 * k + 32].astype(np.int64) << k
    out = np.zeros((B, 110), np.uint8)
    out[:, :32] = hmask
    out[:, 32:96] = pack_2bit(np.where(hi, L - 4, L))
    out[:, 96:108] = sb
    out[:, 108:110] = d16.view(np.uint8).reshape(B, 2)
    return out


def _ref_k4(x, nmax, rmin, rdelta, nstep):
    """Q4_K/Q5_K common part -> (d16, dmin16, 12 scale bytes, levels (B, 256))."""
    B = x.shape[0]
    xs = x.reshape(B * 8, 32)
    sum_x2 = np.zeros(B * 8, F)
    for i in range(32):
        sum_x2 = sum_x2 + xs[:, i] * xs[:, i]
    av_x = np.sqrt(sum_x2 / F(32))
    scales, mins, L = make_qkx2_quants(xs, av_x[:, None] + np.abs(xs), nmax, rmin, rdelta, nstep,
                                       False)
    scales, mins, L = scales.reshape(B, 8), mins.reshape(B, 8), L.reshape(B, 8, 32)
    max_scale, max_min = running_max(scales), running_max(mins)
    inv_s = np.where(max_scale > 0, F(63) / np.where(max_scale > 0, max_scale, F(1)), F(0))
    inv_m = np.where(max_min > 0, F(63) / np.where(max_min > 0, max_min, F(1)), F(0))
    ls = np.minimum(nearest_int(inv_s[:, None] * scales) & 0xFF, 63)
    lm = np.minimum(nearest_int(inv_m[:, None] * mins) & 0xFF, 63)
    sb = np.zeros((B, 12), np.int64)
    sb[:, 0:4], sb[:, 4:8] = ls[:, :4], lm[:, :4]
    sb[:, 8:12] = (ls[:, 4:] & 0xF) | ((lm[:, 4:] & 0xF) << 4)
    sb[:, 0:4] |= (ls[:, 4:] >> 4) << 6
    sb[:, 4:8] |= (lm[:, 4:] >> 4) << 6
    d16, d = f16(max_scale / F(63))
    m16, dm = f16(max_min / F(63))
    dl = d[:, None] * ls.astype(F)
    ml = dm[:, None] * lm.astype(F)
    req = np.clip(nearest_int((x.reshape(B, 8, 32) + ml[:, :, None]) / dl[:, :, None]), 0, nmax)
    L = np.where((dl != 0)[:, :, None], req, L).reshape(B, 256)
    return d16, m16, sb, L


def ref_q4_K(x):
    B = x.shape[0]
    d16, m16, sb, L = _ref_k4(x, 15, -1.0, 0.1, 20)
    Lc = L.reshape(B, 4, 2, 32)
    out = np.zeros((B, 144), np.uint8)
    out[:, 0:2] = d16.view(np.uint8).reshape(B, 2)
    out[:, 2:4] = m16.view(np.uint8).reshape(B, 2)
    out[:, 4:16] = sb
    out[:, 16:] = (Lc[:, :, 0] | (Lc[:, :, 1] << 4)).reshape(B, 128)
    return out


def ref_q5_K(x):
    B = x.shape[0]
    d16, m16, sb, L = _ref_k4(x, 31, -0.5, 0.1, 15)
    Lc = L.reshape(B, 8, 32)
    qh = np.zeros((B, 32), np.int64)
    for j in range(8):
        qh |= (Lc[:, j] >> 4) << j
    lo = (Lc & 0xF).reshape(B, 4, 2, 32)
    out = np.zeros((B, 176), np.uint8)
    out[:, 0:2] = d16.view(np.uint8).reshape(B, 2)
    out[:, 2:4] = m16.view(np.uint8).reshape(B, 2)
    out[:, 4:16] = sb
    out[:, 16:48] = qh
    out[:, 48:] = (lo[:, :, 0] | (lo[:, :, 1] << 4)).reshape(B, 128)
    return out


def ref_q6_K(x):
    B = x.shape[0]
    scales, L = make_qx_quants(x.reshape(B * 16, 16), 32)
    scales, L = scales.reshape(B, 16), L.reshape(B, 256)
    amax, max_scale = np.zeros(B, F), np.zeros(B, F)
    for j in range(16):
        s = np.abs(scales[:, j])
        upd = s > amax
        amax = np.where(upd, s, amax)
        max_scale = np.where(upd, scales[:, j], max_scale)
    zero = amax < F(1e-15)
    iscale = F(-128) / np.where(zero, F(1), max_scale)
    d16, d = f16(F(1) / iscale)
    sc = ((np.minimum(127, nearest_int(iscale[:, None] * scales)) + 128) & 0xFF) - 128
    dl = d[:, None] * sc.astype(F)
    req = np.clip(nearest_int(x.reshape(B, 16, 16) / dl[:, :, None]), -32, 31) + 32
    L = np.where((dl != 0)[:, :, None], req, L.reshape(B, 16, 16)).reshape(B, 2, 4, 32)
    out = np.zeros((B, 210), np.uint8)
    ql = np.concatenate([(L[:, :, 0] & 0xF) | ((L[:, :, 2] & 0xF) << 4),
                         (L[:, :, 1] & 0xF) | ((L[:, :, 3] & 0xF) << 4)], axis=2)
    out[:, :128] = ql.reshape(B, 128)
    out[:, 128:192] = ((L[:, :, 0] >> 4) | ((L[:, :, 1] >> 4) << 2) | ((L[:, :, 2] >> 4) << 4)
                       | ((L[:, :, 3] >> 4) << 6)).reshape(B, 64)
    out[:, 192:208] = sc.astype(np.int8).view(np.uint8)
    out[:, 208:210] = d16.view(np.uint8).reshape(B, 2)
    out[zero] = 0
    return out


def ref_q8_K(x):
    B = x.shape[0]
    amax, mx = first_absmax(x)
    zero = amax == 0
    iscale = F(-127) / np.where(zero, F(1), mx)
    q = ((np.minimum(127, nearest_int(iscale[:, None] * x)) + 128) & 0xFF) - 128
    q[zero] = 0
    out = np.zeros((B, 292), np.uint8)
    out[:, 0:4] = np.where(zero, F(0), F(1) / iscale).astype(F).view(np.uint8).reshape(B, 4)
    out[:, 4:260] = q.astype(np.int8).view(np.uint8)
    out[:, 260:292] = q.reshape(B, 16, 16).sum(axis=2).astype(np.int16).view(np.uint8)
    return out


REFERENCE = {"q2_K": ref_q2_K, "q3_K": ref_q3_K, "q4_K": ref_q4_K, "q5_K": ref_q5_K,
             "q6_K": ref_q6_K, "q8_K": ref_q8_K}


def reference_quantize(x, type_):
    """Rows (..., n) -> (..., n/256 * block bytes) with the numpy reference."""
    x = np.asarray(x, dtype=F)
    with np.errstate(all="ignore"):
        blocks = REFERENCE[type_](x.reshape(-1, QK))
    return blocks.reshape(x.shape[:-1] + (x.shape[-1] // QK * BLOCK_BYTES[type_],))


# ---- test data --------------------------------------------------------------------------------

def edge_rows(rng, n_blocks):
    """Rows of n_blocks blocks exercising the quantizers: normal, heavy tails, zeros, ties,
    huge (fp16 scales overflow to inf; intermediate sums overflow) and tiny magnitudes."""
    n = n_blocks * QK
    z = rng.standard_normal((9, n)).astype(F)
    rows = [
        z[0],
        (z[1] ** 3).astype(F),
        rng.integers(-4, 5, n).astype(F),                          # integers: exact ties
        (rng.integers(-8, 9, n) * 0.5).astype(F),                  # halves: ties
        np.where(rng.random(n) < 0.7, F(0), z[4]).astype(F),       # sparse
        np.zeros(n, F),
        (z[6] * F(1e8)).astype(F),                                 # huge: d overflows fp16
        (z[7] * F(1e15)).astype(F),                                # huger: sums overflow fp32
        (z[8] * F(1e-30)).astype(F),                               # tiny
        (z[8] * F(1e-38)).astype(F),                               # subnormal, scales overflow
        np.abs(z[0]) + F(3),                                       # all positive: min clamps
        np.sign(z[1]).astype(F),                                   # +-1 only
    ]
    mixed = z[2].copy()
    mixed[::QK] *= F(1000)                                         # one outlier per block
    rows.append(mixed)
    # bulk random rows at assorted scales, uniform and gaussian, for coverage of the searches
    scale = np.exp(rng.uniform(-8, 8, (16, 1))).astype(F)
    rows.extend((rng.standard_normal((8, n)) * scale[:8]).astype(F))
    rows.extend((rng.uniform(-1, 1, (8, n)) * scale[8:]).astype(F))
    if n_blocks > 1:
        r = z[3].copy()
        r[:QK] = 0                                                 # a zero block among others
        rows.append(r)
    return np.stack(rows)


# ---- tests ------------------------------------------------------------------------------------

def test_gguf_has_no_kquant_quantizer():
    """Why this file carries its own reference: gguf can dequantize K-quants but not quantize."""
    x = np.ones((1, QK), F)
    for t in WEIGHT_TYPES + ["q8_K"]:
        with pytest.raises(NotImplementedError):
            gq.quantize(x, GQT[t])


@pytest.mark.parametrize("type_", WEIGHT_TYPES)
def test_dequantize_bit_exact_with_gguf(path, type_):
    rng = np.random.default_rng(1)
    nb, size = 37, BLOCK_BYTES[type_]
    blocks = rng.integers(0, 256, (nb, size), dtype=np.uint8)
    # finite fp16 fields of every kind: normal, subnormal, zero, extremes, negative
    special = np.array([0.0, -0.0, 6e-8, -3e-5, 1.0, -2.5, 65504.0, 1e-3, 0.0123], np.float16)
    h = np.concatenate([special, rng.standard_normal(nb).astype(np.float16)])[:nb]
    m = rng.permutation(np.concatenate([special, rng.standard_normal(nb).astype(np.float16)]))[:nb]
    off = {"q2_K": (80, 82), "q3_K": (108, None), "q4_K": (0, 2), "q5_K": (0, 2),
           "q6_K": (208, None)}[type_]
    blocks[:, off[0]:off[0] + 2] = h.view(np.uint8).reshape(nb, 2)
    if off[1] is not None:
        blocks[:, off[1]:off[1] + 2] = m.view(np.uint8).reshape(nb, 2)
    for rows in (blocks.reshape(1, -1), blocks[:7].reshape(7, -1), blocks[:2].reshape(1, -1)):
        ours = quants.dequantize(rows, type_)
        want = gq.dequantize(rows, GQT[type_])
        assert ours.shape == want.shape
        np.testing.assert_array_equal(ours.view(np.uint32), want.view(np.uint32))


@pytest.mark.parametrize("type_", WEIGHT_TYPES + ["q8_K"])
@pytest.mark.parametrize("n_blocks", [1, 2, 5])
def test_quantize_bit_exact_with_reference(path, type_, n_blocks):
    x = edge_rows(np.random.default_rng(n_blocks), n_blocks)
    want = reference_quantize(x, type_)
    got = quants.quantize(x, type_)
    assert got.shape == want.shape
    bad = np.nonzero((got != want).any(axis=1))[0]
    assert bad.size == 0, f"{type_}: rows {bad.tolist()} differ from the numpy reference"
    if type_ == "q8_K":   # the activation quantizer of this path gives the same bytes
        np.testing.assert_array_equal(quants.quantize_act(x, type_), want)


@pytest.mark.parametrize("type_", WEIGHT_TYPES)
def test_reference_round_trip(type_):
    """The numpy reference itself is a sound quantizer: gguf dequantizes its output close to the
    input, and exactly to 0 for zero rows."""
    rng = np.random.default_rng(7)
    x = rng.standard_normal((8, 4 * QK)).astype(F)
    y = gq.dequantize(reference_quantize(x, type_), GQT[type_])
    rel = np.sqrt(np.mean((x - y) ** 2) / np.mean(x ** 2))
    assert rel < {"q2_K": 0.45, "q3_K": 0.25, "q4_K": 0.12, "q5_K": 0.06, "q6_K": 0.03}[type_]
    z = gq.dequantize(reference_quantize(np.zeros((1, QK), F), type_), GQT[type_])
    assert not z.any()


def dequantize_q8_K(b):
    b = b.reshape(-1, 292)
    d = b[:, 0:4].copy().view(F)
    q = b[:, 4:260].view(np.int8).astype(F)
    return (d * q).reshape(-1)


@pytest.mark.parametrize("type_", WEIGHT_TYPES)
def test_vec_dot_matches_float64(path, type_):
    rng = np.random.default_rng(3)
    for n_blocks in (1, 2, 7):
        n = n_blocks * QK
        w = quants.quantize(rng.standard_normal((4, n)).astype(F), type_)
        wf = gq.dequantize(w, GQT[type_]).astype(np.float64)
        x = (rng.standard_normal(n) * 3).astype(F)
        a = quants.quantize_act(x, quants.vec_dot_type(type_))
        af = dequantize_q8_K(a).astype(np.float64)
        for r in range(4):
            got = quants.vec_dot(w[r], a, type_)
            want = float(wf[r] @ af)
            mag = float(np.abs(wf[r]) @ np.abs(af))
            # fp32 accumulation of exact integer block sums: a few ulps of the magnitude
            assert abs(got - want) <= 1e-5 * mag, (type_, n_blocks, r, got, want)
        out = quants.matvec(w, type_, x)
        assert (np.abs(out - wf @ af) <= 1e-5 * (np.abs(wf) @ np.abs(af))).all()


def test_vec_dot_type_is_q8_K():
    for t in WEIGHT_TYPES:
        assert quants.vec_dot_type(t).name.lower() == "q8_k"


@pytest.mark.parametrize("type_", WEIGHT_TYPES + ["q8_K"])
def test_bad_input(type_):
    with pytest.raises(ShapeError, match=r"(?i)" + type_ + r".*\b100\b"):
        quants.quantize(np.zeros(100, F), type_)
    with pytest.raises(UnsupportedTypeError, match=r"(?i)" + type_):
        quants.quantize(np.zeros(QK, np.float64), type_)
    with pytest.raises(ShapeError, match=r"(?i)" + type_):
        quants.dequantize(np.zeros(BLOCK_BYTES[type_] + 1, np.uint8), type_)
