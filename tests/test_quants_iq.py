"""IQ4_NL, IQ4_XS and MXFP4 through pyggml.quants, on every CPU path.

Oracles:
  - dequantize: gguf.quants.dequantize (the gguf package implements all three), bit for bit, on
    random blocks (random codes and scales);
  - quantize: ggml's own ggml_quantize_chunk without importance matrix, i.e. what llama-quantize
    writes (tests/data/iq_quant_refs.npz, made by tools/make_iq_quant_refs.py with
    llama-cpp-python 0.3.36's libggml), bit for bit; MXFP4 also against gguf.quants.quantize;
  - vec_dot: a float64 dot of the dequantized weight row and the dequantized activation row
    (Q8_0 for IQ4_NL and MXFP4, Q8_K for IQ4_XS, ggml's pairing), and the same bits on every path.
"""
from __future__ import annotations

from pathlib import Path

import gguf
import gguf.quants as gq
import numpy as np
import pytest

from pyggml import _native, quants

ROOT = Path(__file__).resolve().parents[1]
REFS = np.load(ROOT / "tests" / "data" / "iq_quant_refs.npz")
TYPES = ["iq4_nl", "iq4_xs", "mxfp4"]
QT = {"iq4_nl": gguf.GGMLQuantizationType.IQ4_NL, "iq4_xs": gguf.GGMLQuantizationType.IQ4_XS,
      "mxfp4": gguf.GGMLQuantizationType.MXFP4}
LAYOUT = {"iq4_nl": (32, 18), "iq4_xs": (256, 136), "mxfp4": (32, 17)}
VEC_DOT_TYPE = {"iq4_nl": "q8_0", "iq4_xs": "q8_K", "mxfp4": "q8_0"}


@pytest.fixture(params=_native.available_paths())
def path(request):
    prev = _native.cpu_path()
    _native.set_cpu_path(request.param)
    yield request.param
    _native.set_cpu_path(prev)


def random_blocks(type_, rows, n_blocks, seed=0):
    """Random codes and scale bytes; fp16 scales small and finite, MXFP4 exponents 2^-12..2^1
    and a few subnormal ones."""
    blk, size = LAYOUT[type_]
    rng = np.random.default_rng(seed)
    b = rng.integers(0, 256, (rows, n_blocks, size), dtype=np.uint8)
    if type_ == "mxfp4":
        b[..., 0] = rng.integers(116, 130, (rows, n_blocks))
        b[0, 0, 0] = 0
        b[-1, -1, 0] = 1
    else:
        b[..., 0:2] = (rng.standard_normal((rows, n_blocks)) * 0.02).astype(np.float16) \
            .view(np.uint8).reshape(rows, n_blocks, 2)
    return b.reshape(rows, n_blocks * size)


@pytest.mark.parametrize("type_", TYPES)
def test_dequantize_bit_exact_with_gguf(path, type_):
    q = random_blocks(type_, 5, 9)
    ours = quants.dequantize(q, type_)
    ref = gq.dequantize(q, QT[type_])
    assert np.array_equal(ours.view(np.uint32), ref.astype(np.float32).view(np.uint32))


@pytest.mark.parametrize("type_", TYPES)
def test_quantize_bit_exact_with_ggml(path, type_):
    x, ref = REFS[f"{type_}.x"], REFS[f"{type_}.q"]
    q = quants.quantize(x, type_)
    bad = np.nonzero((q != ref).any(1))[0]
    assert not len(bad), f"{type_}: rows {bad.tolist()} differ from ggml's"


def test_mxfp4_quantize_bit_exact_with_gguf():
    x = np.random.default_rng(3).standard_normal((6, 1024)).astype(np.float32)
    x[1] *= 1e-30
    x[2, :64] = 0
    assert np.array_equal(quants.quantize(x, "mxfp4"), gq.quantize(x, QT["mxfp4"]))


@pytest.mark.parametrize("type_", TYPES)
def test_vec_dot_matches_float64_and_every_path(path, type_):
    blk, _ = LAYOUT[type_]
    rng = np.random.default_rng(7)
    for nb in (1, 3, 8, 9):
        n = nb * 256
        w = quants.quantize(rng.standard_normal((1, n)).astype(np.float32), type_)[0]
        a = quants.quantize_act(rng.standard_normal(n).astype(np.float32) * 2,
                                VEC_DOT_TYPE[type_])
        want = float(quants.dequantize(w[None], type_)[0].astype(np.float64)
                     @ quants.dequantize(a[None], VEC_DOT_TYPE[type_])[0].astype(np.float64))
        got = quants.vec_dot(w, a, type_)
        assert abs(got - want) <= 1e-5 * (abs(want) + n ** 0.5), (nb, got, want)
        prev = _native.cpu_path()
        _native.set_cpu_path("scalar")
        try:
            scalar = quants.vec_dot(w, a, type_)
        finally:
            _native.set_cpu_path(prev)
        assert np.float32(got).tobytes() == np.float32(scalar).tobytes()


def test_vec_dot_types_are_ggmls():
    vdt = _native.fn("pg_vec_dot_type")
    assert [vdt(int(QT[t])) for t in TYPES] == [8, 15, 8]


# ---- the codebook i-quants (IQ1_S, IQ1_M, IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S) -------------

GRID_TYPES = ["iq2_xxs", "iq2_xs", "iq2_s", "iq3_xxs", "iq3_s", "iq1_s", "iq1_m"]


def random_grid_blocks(type_, rows, n_blocks, seed=0):
    """Random codes, scales and signs; the fp16 d small and finite (IQ1_M keeps it in the top
    nibbles of its four scale words)."""
    qt = gguf.GGMLQuantizationType[type_.upper()]
    size = gguf.GGML_QUANT_SIZES[qt][1]
    rng = np.random.default_rng(seed)
    b = rng.integers(0, 256, (rows, n_blocks, size), dtype=np.uint8)
    h = (rng.standard_normal((rows, n_blocks)) * 0.02).astype(np.float16).view(np.uint16)
    if type_ == "iq1_m":
        sc = b[..., 48:56].copy().view(np.uint16)                   # [rows, nb, 4]
        for k in range(4):
            sc[..., k] = (sc[..., k] & 0x0FFF) | (((h >> (4 * k)) & 0xF) << 12)
        b[..., 48:56] = sc.view(np.uint8)
    else:
        b[..., 0:2] = h.view(np.uint8).reshape(rows, n_blocks, 2)
    return b.reshape(rows, n_blocks * size)


@pytest.mark.parametrize("type_", GRID_TYPES)
def test_grid_dequantize_bit_exact_with_gguf(path, type_):
    q = random_grid_blocks(type_, 4, 7)
    ours = quants.dequantize(q, type_)
    ref = gq.dequantize(q, gguf.GGMLQuantizationType[type_.upper()]).astype(np.float32)
    assert np.array_equal(ours.view(np.uint32), ref.view(np.uint32))


@pytest.mark.parametrize("type_", GRID_TYPES)
def test_grid_vec_dot_matches_float64_and_every_path(path, type_):
    rng = np.random.default_rng(11)
    for nb in (1, 2, 5):
        w = random_grid_blocks(type_, 1, nb, seed=nb)[0]
        a = quants.quantize_act(rng.standard_normal(nb * 256).astype(np.float32), "q8_K")
        wd = quants.dequantize(w[None], type_)[0].astype(np.float64)
        ad = quants.dequantize(a[None], "q8_K")[0].astype(np.float64)
        want = float(wd @ ad)
        got = quants.vec_dot(w, a, type_)
        assert abs(got - want) <= 1e-5 * float(np.abs(wd) @ np.abs(ad)), (nb, got, want)
        prev = _native.cpu_path()
        _native.set_cpu_path("scalar")
        try:
            scalar = quants.vec_dot(w, a, type_)
        finally:
            _native.set_cpu_path(prev)
        assert np.float32(got).tobytes() == np.float32(scalar).tobytes()


def test_grid_types_have_no_quantizer():
    """llama.cpp makes them with an importance matrix; pyggml reads them, it does not write."""
    from pyggml.errors import UnsupportedTypeError
    for t in GRID_TYPES:
        with pytest.raises(UnsupportedTypeError):
            quants.quantize(np.zeros((1, 256), np.float32), t)


# ---- ternary: TQ1_0, TQ2_0 --------------------------------------------------------------------

@pytest.mark.parametrize("type_", ["tq1_0", "tq2_0"])
def test_ternary_bit_exact_with_gguf(path, type_):
    qt = gguf.GGMLQuantizationType[type_.upper()]
    rng = np.random.default_rng(5)
    x = rng.standard_normal((5, 768)).astype(np.float32)
    x[1, :300] = 0
    x[2] *= 1e-3
    x[3, ::3] = x[3, 0]                               # ties at the rounding points
    q = quants.quantize(x, type_)
    assert np.array_equal(q, gq.quantize(x, qt))
    raw = rng.integers(0, 256, q.shape, dtype=np.uint8)
    raw.reshape(5, 3, -1)[..., -2:] = (rng.standard_normal((5, 3)) * 0.05).astype(np.float16) \
        .view(np.uint8).reshape(5, 3, 2)
    assert np.array_equal(quants.dequantize(raw, type_).view(np.uint32),
                          gq.dequantize(raw, qt).astype(np.float32).view(np.uint32))
    a = quants.quantize_act(rng.standard_normal(768).astype(np.float32), "q8_K")
    want = float(quants.dequantize(q[:1], type_)[0].astype(np.float64)
                 @ quants.dequantize(a[None], "q8_K")[0].astype(np.float64))
    assert abs(quants.vec_dot(q[0], a, type_) - want) <= 1e-5 * (abs(want) + 30)
