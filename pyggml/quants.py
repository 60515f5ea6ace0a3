"""Quantize, dequantize and dot rows of any block format through libpyggml's kernels.

Arrays follow the gguf package's convention: the last axis is the row; a quantized array is
uint8 with last axis = bytes per row. Every function runs on the current kernel path
(`pyggml._native.cpu_path()`); tests switch paths with `_native.set_cpu_path`.

    q = quantize(x, "q4_0")          # reference quantizer, bit-exact with gguf.quants.quantize
    y = dequantize(q, "q4_0")        # float32, shape of x
    a = quantize_act(v, "q8_0")      # fast activation quantizer (what matmul uses)
    s = vec_dot(q[0], a, "q4_0")     # dot of one weight row with an activation row

Errors: an unknown type or one without the kernel asked for raises UnsupportedTypeError; an input
of the wrong dtype raises UnsupportedTypeError; a length that is not a multiple of the block size
or a byte count that does not match raises ShapeError. All name the type and the length.
"""

from __future__ import annotations

import ctypes
import statistics
import threading
import time

import numpy as np

from pyggml import _native
from pyggml.errors import ShapeError, UnsupportedTypeError
from pyggml.types import GGMLType, as_type

_c_int, _c_i64, _p = ctypes.c_int32, ctypes.c_int64, ctypes.c_void_p
_native.declare("pg_type_block_size", _c_int, [_c_int])
_native.declare("pg_type_size", _c_int, [_c_int])
_native.declare("pg_quantize_row", _c_int, [_c_int, _p, _p, _c_i64])
_native.declare("pg_quantize_row_act", _c_int, [_c_int, _p, _p, _c_i64])
_native.declare("pg_dequantize_row", _c_int, [_c_int, _p, _p, _c_i64])
_native.declare("pg_vec_dot_type", _c_int, [_c_int])
_native.declare("pg_vec_dot", _c_int, [_c_int, _c_i64, _p, _p, _p])
_native.declare("pg_matvec_scratch_size", ctypes.c_size_t, [_c_int, _c_i64])
_native.declare("pg_matvec", _c_int, [_c_int, _c_i64, _c_i64, _p, ctypes.c_size_t, _p, _p, _p,
                                      ctypes.c_size_t])
_native.declare("pg_bench_read", ctypes.c_uint64, [_p, ctypes.c_size_t])


def _layout(t: GGMLType) -> tuple[int, int]:
    """(elements per block, bytes per block) as the C kernels know them."""
    blk = _native.fn("pg_type_block_size")(int(t))
    size = _native.fn("pg_type_size")(int(t))
    if blk <= 0 or size <= 0:
        raise UnsupportedTypeError(f"type {t.name} has no kernels in libpyggml")
    return blk, size


def _type(type_) -> GGMLType:
    return as_type(type_)


def block_size(type_) -> int:
    """Elements per block of a type the kernels support."""
    return _layout(_type(type_))[0]


def row_bytes(type_, n: int) -> int:
    """Bytes of a row of n elements; ShapeError when n is not a multiple of the block size."""
    t = _type(type_)
    blk, size = _layout(t)
    _check_len(t, n, blk)
    return n // blk * size


def _check_len(t: GGMLType, n: int, blk: int) -> None:
    if n < 0 or n % blk:
        raise ShapeError(f"a row of {t.name} must hold a multiple of {blk} elements, got {n}")


def _as_f32(arr, t: GGMLType, what: str) -> np.ndarray:
    a = np.asarray(arr)
    if a.dtype != np.float32:
        raise UnsupportedTypeError(
            f"{what} to {t.name} expects float32 input, got dtype {a.dtype} "
            f"(shape {a.shape}); convert with .astype(np.float32)")
    return np.ascontiguousarray(a)


def _as_bytes(data, t: GGMLType) -> np.ndarray:
    if isinstance(data, (bytes, bytearray, memoryview)):
        return np.frombuffer(data, dtype=np.uint8)
    a = np.asarray(data)
    if (t, a.dtype) in ((GGMLType.F32, np.float32), (GGMLType.F16, np.float16)):
        return np.ascontiguousarray(a).view(np.uint8)   # plain floats: their bytes
    if a.dtype != np.uint8:
        raise UnsupportedTypeError(
            f"{t.name} data must be uint8 bytes (bytes, bytearray or a uint8 array), "
            f"got dtype {a.dtype} (shape {a.shape})")
    return np.ascontiguousarray(a)


def _status(st: int, what: str, t: GGMLType, n: int) -> None:
    if st == _native.PG_ERR_UNSUPPORTED:
        raise UnsupportedTypeError(f"{what}: type {t.name} has no such kernel (n={n})")
    if st == _native.PG_ERR_INVALID_ARG:
        raise ShapeError(f"{what}: invalid arguments for type {t.name} (n={n})")
    _native.check(st, f"{what} ({t.name}, n={n})")


def _quantize(arr, type_, fast: bool) -> np.ndarray:
    t = _type(type_)
    what = "quantize_act" if fast else "quantize"
    blk, size = _layout(t)
    x = _as_f32(arr, t, what)
    if x.ndim == 0:
        raise ShapeError(f"{what} to {t.name} needs at least one dimension, got a scalar")
    n_row = x.shape[-1]
    _check_len(t, n_row, blk)
    out = np.empty(x.shape[:-1] + (n_row // blk * size,), dtype=np.uint8)
    if x.size:
        fn = _native.fn("pg_quantize_row_act" if fast else "pg_quantize_row")
        _status(fn(int(t), x.ctypes.data, out.ctypes.data, x.size), what, t, n_row)
    return out


def quantize(arr, type_) -> np.ndarray:
    """Reference quantizer: float32 rows (last axis) -> uint8 blocks, bit-exact with
    gguf.quants.quantize for every type it implements."""
    return _quantize(arr, type_, fast=False)


def quantize_act(arr, type_) -> np.ndarray:
    """Fast activation quantizer of the current path (for vec_dot_type activations)."""
    return _quantize(arr, type_, fast=True)


def dequantize(data, type_, n: int | None = None) -> np.ndarray:
    """uint8 blocks -> float32. With n, data holds exactly n elements and the result is 1-D;
    without it, a uint8 array's last axis (bytes per row) is converted row by row."""
    t = _type(type_)
    blk, size = _layout(t)
    b = _as_bytes(data, t)
    if n is None:
        if b.ndim == 0 or b.shape[-1] % size:
            raise ShapeError(f"{t.name} rows must be a multiple of {size} bytes, "
                             f"got shape {b.shape}")
        shape = b.shape[:-1] + (b.shape[-1] // size * blk,)
    else:
        n = int(n)
        _check_len(t, n, blk)
        if b.size != n // blk * size:
            raise ShapeError(f"{n} elements of {t.name} take {n // blk * size} bytes, "
                             f"got {b.size}")
        shape = (n,)
    out = np.empty(shape, dtype=np.float32)
    if out.size:
        _status(_native.fn("pg_dequantize_row")(int(t), b.ctypes.data, out.ctypes.data,
                                                out.size), "dequantize", t, out.size)
    return out


def vec_dot_type(type_) -> GGMLType:
    """The type activations must be in for vec_dot with weights of `type_`."""
    t = _type(type_)
    vt = _native.fn("pg_vec_dot_type")(int(t))
    if vt < 0:
        raise UnsupportedTypeError(f"type {t.name} has no dot-product kernel")
    return GGMLType(vt)


def vec_dot(x, y, type_, n: int | None = None) -> float:
    """dot(x, y): x holds one row of `type_` (uint8 blocks), y the same number of elements in
    vec_dot_type(type_) (uint8 blocks, e.g. from quantize_act)."""
    t = _type(type_)
    vt = vec_dot_type(t)
    blk, size = _layout(t)
    vblk, vsize = _layout(vt)
    xb, yb = _as_bytes(x, t), _as_bytes(y, vt)
    if n is None:
        if xb.size % size:
            raise ShapeError(f"{t.name} row of {xb.size} bytes is not whole blocks of {size}")
        n = xb.size // size * blk
    n = int(n)
    _check_len(t, n, blk)
    _check_len(vt, n, vblk)
    if xb.size != n // blk * size or yb.size != n // vblk * vsize:
        raise ShapeError(f"vec_dot of {n} elements needs {n // blk * size} bytes of {t.name} and "
                         f"{n // vblk * vsize} bytes of {vt.name}, got {xb.size} and {yb.size}")
    s = ctypes.c_float(0.0)
    if n:
        _status(_native.fn("pg_vec_dot")(int(t), n, ctypes.addressof(s), xb.ctypes.data,
                                         yb.ctypes.data), "vec_dot", t, n)
    return float(s.value)


def matvec(w, type_, x, out: np.ndarray | None = None) -> np.ndarray:
    """out[r] = dot(w[r], x) for a 2-D uint8 weight array (rows, bytes per row) of `type_` and a
    float32 vector x; x is quantized once to vec_dot_type (one thread)."""
    t = _type(type_)
    xv = _as_f32(x, t, "matvec")
    wb = _as_bytes(w, t)
    if wb.ndim != 2 or xv.ndim != 1:
        raise ShapeError(f"matvec wants 2-D weights and a 1-D vector, got {wb.shape} and "
                         f"{xv.shape}")
    ne0 = xv.shape[0]
    if wb.shape[1] != row_bytes(t, ne0):
        raise ShapeError(f"{t.name} rows of {ne0} elements take {row_bytes(t, ne0)} bytes, "
                         f"weights have {wb.shape[1]}")
    vec_dot_type(t)
    if out is None:
        out = np.empty(wb.shape[0], dtype=np.float32)
    elif out.dtype != np.float32 or out.shape != (wb.shape[0],) or not out.flags.c_contiguous:
        raise ShapeError(f"matvec out must be contiguous float32 of shape ({wb.shape[0]},)")
    scratch_size = _native.fn("pg_matvec_scratch_size")(int(t), ne0)
    scratch = np.empty(max(scratch_size, 1), dtype=np.uint8)
    _status(_native.fn("pg_matvec")(int(t), ne0, wb.shape[0], wb.ctypes.data, wb.strides[0],
                                    xv.ctypes.data, out.ctypes.data, scratch.ctypes.data,
                                    scratch_size), "matvec", t, ne0)
    return out


def matvec_scratch_size(type_, n: int) -> int:
    """Bytes of scratch pg_matvec needs for n activations of `type_`'s vec_dot_type."""
    t = _type(type_)
    vt = vec_dot_type(t)
    _check_len(vt, n, _layout(vt)[0])
    return int(_native.fn("pg_matvec_scratch_size")(int(t), int(n)))


def bench_read(buf: np.ndarray) -> int:
    """Read every byte of a contiguous array once (memory-bandwidth probe); returns a checksum."""
    if not buf.flags.c_contiguous:
        raise ShapeError("bench_read needs a contiguous array")
    return int(_native.fn("pg_bench_read")(buf.ctypes.data, buf.nbytes))


def read_bandwidth(n_threads: int, runs: int = 5, n_bytes: int = 512 << 20) -> float:
    """This machine's memory read bandwidth in GB/s: n_threads threads each read their share of
    n_bytes (bench_read; ctypes releases the GIL), median of `runs` (benchmarks put decode speed
    next to it)."""
    buf = np.ones(n_bytes, dtype=np.uint8)
    parts = np.array_split(buf, n_threads)
    times = []
    for _ in range(runs):
        ths = [threading.Thread(target=bench_read, args=(p,)) for p in parts]
        t0 = time.perf_counter()
        for t in ths:
            t.start()
        for t in ths:
            t.join()
        times.append(time.perf_counter() - t0)
    return n_bytes / statistics.median(times) / 1e9


__all__ = ["quantize", "quantize_act", "dequantize", "vec_dot", "vec_dot_type", "matvec",
           "block_size", "row_bytes", "matvec_scratch_size", "bench_read"]
