"""Legacy (32-element) block formats and float types through pyggml.quants, on every kernel path
this CPU runs.

Oracles:
  - gguf.quants (the gguf package) for quantize/dequantize of F32, F16, BF16, Q4_0, Q4_1, Q5_0,
    Q5_1 and Q8_0: bit-exact.
  - Q8_1: gguf has no reference (and lists a stale 40-byte block), so `q8_1_reference` below is
    our own numpy transcription of ggml's quantize_row_q8_1_ref (docs/FORMATS.md §2.5).
  - Dot products: ggml's per-block formulas (§2.4) evaluated in float64 from the decoded integers;
    ours must agree within 1e-5 of Σ|block terms| (float32 accumulation in another order).

Magnitudes tested run from 1e-30 to 1e30. Below about 4e-37 per block, 1/d overflows in
ggml's C reference and the float-to-int conversion it then does is undefined, so no reference
exists there (ours clamps; see native/src/quants_legacy.c).
"""

import gguf
import numpy as np
import pytest
from gguf import GGMLQuantizationType as G

from pyggml import _native, quants
from pyggml.errors import ShapeError, UnsupportedTypeError
from pyggml.types import GGMLType

GGUF_TYPES = ["F32", "F16", "BF16", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0"]
QUANT_TYPES = ["Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0"]
DOT_TYPES = ["F32", "F16", "BF16", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0"]


@pytest.fixture(params=_native.available_paths())
def path(request):
    """Run the test on one kernel path, restoring the previous one afterwards."""
    before = _native.cpu_path()
    _native.set_cpu_path(request.param)
    yield request.param
    _native.set_cpu_path(before)


def np_roundf(a):
    """C roundf: half away from zero."""
    return gguf.quants.np_roundf(a)


# ---- test data -----------------------------------------------------------------------------------

# value that makes a rounding tie appear: per type, (anchor, tie offset): the anchor makes the
# block's d an exact power of two p, every other element is (k + 0.5)·p.
_TIE_ANCHOR = {"Q4_0": 8.0, "Q5_0": 16.0, "Q8_0": 127.0, "Q8_1": 127.0}
_TIE_SPAN = {"Q4_1": 15.0, "Q5_1": 31.0}


def tie_rows(type_name, n_rows, n, rng):
    """Rows whose blocks put x·id (+ offset) exactly on .5 for the type's reference quantizer."""
    x = np.empty((n_rows, n // 32, 32), dtype=np.float32)
    p = np.float32(2.0) ** rng.integers(-10, 6, size=(n_rows, n // 32, 1)).astype(np.float32)
    if type_name in _TIE_SPAN:   # min at 0·p, max at span·p: d = p, (x − min)·id = k + 0.5
        span = _TIE_SPAN[type_name]
        k = rng.integers(0, int(span), size=x.shape).astype(np.float32)
        x[:] = (k + np.float32(0.5)) * p
        x[..., 0] = 0.0
        x[..., 1] = span * p[..., 0]
        x += np.float32(-3.0) * p   # shift: min = −3p keeps the differences exact
        return x.reshape(n_rows, n)
    a = _TIE_ANCHOR.get(type_name, 127.0)
    k = rng.integers(-int(a) + 1, int(a) - 1, size=x.shape).astype(np.float32)
    x[:] = (k + np.float32(0.5)) * p
    j = rng.integers(0, 32, size=(n_rows, n // 32))
    sign = np.where(rng.random((n_rows, n // 32)) < 0.5, -1.0, 1.0).astype(np.float32)
    np.put_along_axis(x, j[..., None], (sign * a)[..., None] * p, axis=2)
    return x.reshape(n_rows, n)


def rows(kind, n_rows, n, rng, type_name="Q8_0"):
    if kind == "normal":
        return rng.standard_normal((n_rows, n), dtype=np.float32)
    if kind == "ties":
        return tie_rows(type_name, n_rows, n, rng)
    if kind == "zeros":
        x = rng.standard_normal((n_rows, n), dtype=np.float32)
        x[:, : n // 2] = 0.0    # whole zero blocks and zero elements mixed in
        x[:, ::7] = 0.0
        return x
    if kind == "huge":
        return (rng.standard_normal((n_rows, n)) * 1e30).astype(np.float32)
    if kind == "tiny":
        return (rng.standard_normal((n_rows, n)) * 1e-30).astype(np.float32)
    if kind == "mixed":   # per-block magnitudes spread over 1e-30 .. 1e30
        e = rng.integers(-30, 31, size=(n_rows, n // 32, 1))
        x = rng.standard_normal((n_rows, n // 32, 32)) * 10.0 ** e
        return x.astype(np.float32).reshape(n_rows, n)
    raise ValueError(kind)


KINDS = ["normal", "ties", "zeros", "huge", "tiny", "mixed"]
SIZES = [32, 64, 224, 4096]


def assert_same_floats(a, b, what):
    """Equal bit patterns, except that any NaN equals any NaN at the same position."""
    a, b = np.asarray(a, np.float32), np.asarray(b, np.float32)
    assert a.shape == b.shape, what
    nan = np.isnan(a)
    assert np.array_equal(nan, np.isnan(b)), f"{what}: NaN positions differ"
    bad = a.view(np.uint32)[~nan] != b.view(np.uint32)[~nan]
    assert not bad.any(), (f"{what}: {bad.sum()} values differ, e.g. {a[~nan][bad][:4]} vs "
                           f"{b[~nan][bad][:4]}")


# ---- quantize / dequantize against gguf ----------------------------------------------------------

@pytest.mark.parametrize("type_name", GGUF_TYPES)
@pytest.mark.parametrize("kind", KINDS)
def test_quantize_bit_exact_with_gguf(path, type_name, kind):
    rng = np.random.default_rng(abs(hash((type_name, kind))) % 2**32)
    for n in SIZES:
        x = rows(kind, 3, n, rng, type_name)
        with np.errstate(all="ignore"):
            want = gguf.quants.quantize(x, G[type_name]).view(np.uint8)
        got = quants.quantize(x, type_name)
        assert got.dtype == np.uint8 and got.shape == want.shape
        bad = np.flatnonzero((got != want).any(axis=0))
        assert bad.size == 0, f"{type_name} {kind} n={n}: bytes differ at row offsets {bad[:8]}"


@pytest.mark.parametrize("type_name", GGUF_TYPES)
@pytest.mark.parametrize("kind", KINDS)
def test_dequantize_bit_exact_with_gguf(path, type_name, kind):
    rng = np.random.default_rng(abs(hash((type_name, kind, "dq"))) % 2**32)
    for n in SIZES:
        with np.errstate(all="ignore"):
            q = gguf.quants.quantize(rows(kind, 3, n, rng, type_name), G[type_name]).view(np.uint8)
            want = gguf.quants.dequantize(q, G[type_name])
        got = quants.dequantize(q, type_name)
        assert_same_floats(got, want, f"{type_name} {kind} n={n}")
        # one row through the 1-D form with an explicit element count, from bytes
        assert_same_floats(quants.dequantize(q[0].tobytes(), type_name, n), want[0], "1-D form")


@pytest.mark.parametrize("type_name", ["Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "F16", "BF16"])
def test_dequantize_random_blocks(path, type_name):
    """Arbitrary block bytes (not only what a quantizer writes) with finite fp16 scales."""
    rng = np.random.default_rng(7)
    blk, size = gguf.GGML_QUANT_SIZES[G[type_name]]
    raw = rng.integers(0, 256, size=(64, size), dtype=np.uint8)
    if blk == 32:
        n_scales = 2 if type_name in ("Q4_1", "Q5_1") else 1
        sc = (rng.standard_normal((64, n_scales)) * 4).astype(np.float16)
        raw[:, : 2 * n_scales] = sc.view(np.uint8)
    data = raw.reshape(1, -1)
    with np.errstate(all="ignore"):
        want = gguf.quants.dequantize(data, G[type_name])
    assert_same_floats(quants.dequantize(data, type_name), want, type_name)


# ---- Q8_1: our own reference ---------------------------------------------------------------------

def q8_1_reference(x):
    """numpy transcription of ggml's quantize_row_q8_1_ref: fp16 d = amax/127, fp16
    s = d·Σq (integer sum times the fp32 d), q = roundf(x/d), 36 bytes per block."""
    b = x.reshape(-1, 32).astype(np.float32)
    d = np.abs(b).max(axis=1, keepdims=True) / np.float32(127)
    with np.errstate(divide="ignore"):
        inv = np.where(d == 0, np.float32(0), np.float32(1) / d).astype(np.float32)
    q = np_roundf(b * inv).astype(np.int8)
    s = q.astype(np.int32).sum(axis=1, keepdims=True).astype(np.float32) * d
    with np.errstate(over="ignore"):   # huge rows: fp16 d and s overflow to inf, as in C
        d16, s16 = d.astype(np.float16), s.astype(np.float16)
    out = np.concatenate([d16.view(np.uint8), s16.view(np.uint8), q.view(np.uint8)], axis=1)
    return out.reshape(x.shape[:-1] + (x.shape[-1] // 32 * 36,))


@pytest.mark.parametrize("kind", KINDS)
def test_q8_1_against_own_reference(path, kind):
    rng = np.random.default_rng(11)
    for n in SIZES:
        x = rows(kind, 3, n, rng, "Q8_1")
        want = q8_1_reference(x)
        assert np.array_equal(quants.quantize(x, "Q8_1"), want), f"{kind} n={n}"
        assert np.array_equal(quants.quantize_act(x, "Q8_1"), want), f"act {kind} n={n}"
        # dequantize: q·d (s is not used)
        blocks = want.reshape(-1, 36)
        d = blocks[:, :2].copy().view(np.float16).astype(np.float32)
        with np.errstate(invalid="ignore"):   # 0 · inf = NaN for huge rows, as in C
            deq = (blocks[:, 4:].view(np.int8).astype(np.float32) * d).reshape(x.shape)
        assert_same_floats(quants.dequantize(want, "Q8_1"), deq, f"Q8_1 dequantize {kind}")


def test_q8_1_reference_sanity():
    """The hand-written reference on values whose answer is known."""
    x = np.zeros((1, 32), np.float32)
    x[0, :4] = [127.0, -63.5, 2.5, 0.5]   # d = 1: ties round away from zero
    b = q8_1_reference(x)[0]
    assert b[:2].view(np.float16)[0] == 1.0
    assert list(b[4:8].view(np.int8)) == [127, -64, 3, 1]
    assert b[2:4].view(np.float16)[0] == 127 - 64 + 3 + 1


# ---- activation quantizers: bit-exact with the reference on every path ---------------------------

@pytest.mark.parametrize("type_name", ["Q8_0", "F16", "BF16"])
@pytest.mark.parametrize("kind", KINDS)
def test_quantize_act_equals_reference(path, type_name, kind):
    """Our fast quantizers keep the reference's roundf (half away from zero) and id = 1/d,
    so they equal gguf's reference bit for bit on every path (ggml's own x86/ARM SIMD paths
    round ties to even instead, docs/FORMATS.md §2.5)."""
    rng = np.random.default_rng(5)
    for n in SIZES:
        x = rows(kind, 3, n, rng, type_name)
        with np.errstate(all="ignore"):
            want = gguf.quants.quantize(x, G[type_name]).view(np.uint8)
        assert np.array_equal(quants.quantize_act(x, type_name), want), f"{kind} n={n}"


def test_q8_0_ties_round_away_from_zero(path):
    x = np.zeros(32, np.float32)
    x[:5] = [127.0, 2.5, -2.5, 0.5, -126.5]   # amax 127: d = 1, id = 1, every x·id exact
    q = quants.quantize_act(x, "q8_0")
    assert list(q[2:7].view(np.int8)) == [127, 3, -3, 1, -127]


# ---- dot products against float64 ----------------------------------------------------------------

def decode(data, type_name):
    """Per block: integer values (float64), d, and m (Q4_1/Q5_1) or s (Q8_1), from raw bytes."""
    blk_bytes = {"Q4_0": 18, "Q4_1": 20, "Q5_0": 22, "Q5_1": 24, "Q8_0": 34, "Q8_1": 36}
    b = np.asarray(data, np.uint8).reshape(-1, blk_bytes[type_name])
    d = b[:, :2].copy().view(np.float16).astype(np.float64)[:, 0]
    m = np.zeros_like(d)
    if type_name in ("Q4_1", "Q5_1", "Q8_1"):
        m = b[:, 2:4].copy().view(np.float16).astype(np.float64)[:, 0]
    if type_name in ("Q8_0", "Q8_1"):
        q = b[:, -32:].view(np.int8).astype(np.float64)
        return q, d, m
    qs = b[:, -16:]
    q = np.concatenate([qs & 0xF, qs >> 4], axis=1).astype(np.int64)
    if type_name in ("Q5_0", "Q5_1"):
        off = 2 if type_name == "Q5_0" else 4
        qh = b[:, off:off + 4].copy().view(np.uint32)[:, 0].astype(np.int64)
        q |= ((qh[:, None] >> np.arange(32)) & 1) << 4
    q = q - {"Q4_0": 8, "Q5_0": 16}.get(type_name, 0)
    return q.astype(np.float64), d, m


def dot_reference(xq, yq, type_name, n):
    """(value, magnitude) of ggml's dot formula in float64 (§2.4)."""
    if type_name in ("F32", "F16", "BF16"):
        a = quants.dequantize(xq, type_name, n).astype(np.float64)
        b = quants.dequantize(yq, type_name, n).astype(np.float64)
        return float(a @ b), float(np.abs(a) @ np.abs(b))
    vt = "Q8_1" if type_name in ("Q4_1", "Q5_1") else "Q8_0"
    qx, dx, mx = decode(xq, type_name)
    qy, dy, sy = decode(yq, vt)
    isum = (qx * qy).sum(axis=1)
    terms = dx * dy * isum + (mx * sy if vt == "Q8_1" else 0.0)
    mag = np.abs(dx * dy) * np.abs(qx * qy).sum(axis=1) + np.abs(mx * sy)
    return float(terms.sum()), float(mag.sum())


@pytest.mark.parametrize("type_name", DOT_TYPES)
def test_vec_dot_against_float64(path, type_name):
    rng = np.random.default_rng(3)
    vt = quants.vec_dot_type(type_name)
    assert vt == {"F32": GGMLType.F32, "F16": GGMLType.F16, "BF16": GGMLType.BF16,
                  "Q4_1": GGMLType.Q8_1, "Q5_1": GGMLType.Q8_1}.get(type_name, GGMLType.Q8_0)
    for n in [32, 64, 224, 4096]:
        for kind in ["normal", "ties", "zeros", "mixed"]:
            w = rows(kind, 1, n, rng, type_name)[0]
            if kind == "mixed":
                w = np.clip(w, -1e4, 1e4)   # fp16 scales and fp16/bf16 values stay finite
            a = rows("normal", 1, n, rng)[0]
            xq = quants.quantize(w, type_name)
            yq = quants.quantize_act(a, vt)
            got = quants.vec_dot(xq, yq, type_name)
            want, mag = dot_reference(xq, yq, type_name, n)
            assert abs(got - want) <= 1e-5 * mag + 1e-30, (
                f"{type_name} n={n} {kind}: {got} vs {want} (magnitude {mag})")


@pytest.mark.parametrize("type_name", ["Q4_0", "Q4_1", "Q5_0", "Q8_0", "F16", "F32"])
def test_matvec_equals_rowwise_vec_dot(path, type_name):
    rng = np.random.default_rng(9)
    w = rng.standard_normal((6, 128), dtype=np.float32)
    x = rng.standard_normal(128, dtype=np.float32)
    wq = quants.quantize(w, type_name)
    out = quants.matvec(wq, type_name, x)
    xq = quants.quantize_act(x, quants.vec_dot_type(type_name))
    want = np.array([quants.vec_dot(r, xq, type_name) for r in wq], dtype=np.float32)
    assert np.array_equal(out, want)
    # and close to the float result of the dequantized weights
    ref = quants.dequantize(wq, type_name).astype(np.float64) @ x.astype(np.float64)
    assert np.allclose(out, ref, rtol=0.05, atol=0.05 * np.abs(ref).max())


def test_paths_agree_on_a_dot():
    """The same dot on every path: equal within the stated tolerance (sanity across paths)."""
    rng = np.random.default_rng(1)
    w = rng.standard_normal(4096, dtype=np.float32)
    a = rng.standard_normal(4096, dtype=np.float32)
    before = _native.cpu_path()
    try:
        for t in QUANT_TYPES:
            res = {}
            for p in _native.available_paths():
                _native.set_cpu_path(p)
                xq = quants.quantize(w, t)
                res[p] = quants.vec_dot(xq, quants.quantize_act(a, quants.vec_dot_type(t)), t)
            _, mag = dot_reference(xq, quants.quantize_act(a, quants.vec_dot_type(t)), t, 4096)
            assert max(res.values()) - min(res.values()) <= 1e-5 * mag, (t, res)
    finally:
        _native.set_cpu_path(before)


# ---- bad input -----------------------------------------------------------------------------------

def test_wrong_dtype_names_type_and_shape():
    with pytest.raises(UnsupportedTypeError, match=r"Q4_0.*float32.*float64.*\(64,\)"):
        quants.quantize(np.zeros(64), "q4_0")
    with pytest.raises(UnsupportedTypeError, match=r"Q8_0.*int32"):
        quants.quantize_act(np.zeros(64, np.int32), "q8_0")
    with pytest.raises(UnsupportedTypeError, match=r"Q4_1.*uint8.*float32"):
        quants.dequantize(np.zeros(20, np.float32), "q4_1", 32)


def test_length_not_multiple_of_block():
    with pytest.raises(ShapeError, match=r"Q5_0.*multiple of 32.*33"):
        quants.quantize(np.zeros(33, np.float32), "q5_0")
    with pytest.raises(ShapeError, match=r"Q8_1.*multiple of 32.*48"):
        quants.quantize_act(np.zeros((2, 48), np.float32), GGMLType.Q8_1)
    with pytest.raises(ShapeError, match=r"Q4_0.*multiple of 32.*40"):
        quants.dequantize(np.zeros(36, np.uint8), "q4_0", 40)
    with pytest.raises(ShapeError, match=r"64 elements of Q8_0 take 68 bytes, got 34"):
        quants.dequantize(np.zeros(34, np.uint8), "q8_0", 64)
    with pytest.raises(ShapeError, match=r"Q4_0 rows must be a multiple of 18 bytes"):
        quants.dequantize(np.zeros((2, 20), np.uint8), "q4_0")
    with pytest.raises(ShapeError, match=r"vec_dot of 64 elements"):
        quants.vec_dot(np.zeros(36, np.uint8), np.zeros(34, np.uint8), "q4_0")


def test_unknown_and_unsupported_types():
    with pytest.raises(UnsupportedTypeError, match="unknown tensor type name 'q9_9'"):
        quants.quantize(np.zeros(32, np.float32), "q9_9")
    with pytest.raises(UnsupportedTypeError, match="unknown tensor type id 4"):
        quants.dequantize(b"\0" * 18, 4, 32)
    with pytest.raises(UnsupportedTypeError, match=r"NVFP4 has no (kernels|such kernel)"):
        quants.dequantize(b"\0" * 36, "nvfp4", 64)
    with pytest.raises(UnsupportedTypeError, match="Q8_1 has no dot-product kernel"):
        quants.vec_dot(b"\0" * 36, b"\0" * 36, "q8_1")


def test_shapes_and_inputs():
    x = np.random.default_rng(0).standard_normal((2, 3, 64), dtype=np.float32)
    q = quants.quantize(x, "q8_0")
    assert q.shape == (2, 3, 68)
    assert quants.dequantize(q, "q8_0").shape == (2, 3, 64)
    assert quants.quantize(np.zeros((0, 64), np.float32), "q4_0").shape == (0, 36)
    assert quants.dequantize(b"", "q4_0", 0).shape == (0,)
    assert quants.row_bytes("q5_1", 4096) == 128 * 24
    assert quants.block_size("q8_1") == 32
    # F32 / F16 data may also be given as their own dtype
    h = np.arange(8, dtype=np.float16)
    assert np.array_equal(quants.dequantize(h, "f16", 8), h.astype(np.float32))
    assert quants.bench_read(np.ones(1000, np.uint8)) > 0
