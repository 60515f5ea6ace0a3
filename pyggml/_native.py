"""Loads libpyggml with ctypes and binds its entry points lazily.

Search order: $PYGGML_LIB, then <repo>/build/native/libpyggml.so (what `make setup` builds).
A missing library raises NativeLibraryError naming every path tried and the command that builds it.
Symbols are bound on first use (`native.fn(name)`), so one missing symbol does not break import.
Modules declare the prototypes they use with `declare`.
"""

from __future__ import annotations

import ctypes
import os
from pathlib import Path

from pyggml.errors import NativeLibraryError

_REPO = Path(__file__).resolve().parent.parent
_lib: ctypes.CDLL | None = None
_bound: dict[str, object] = {}
_prototypes: dict[str, tuple] = {}

(PG_OK, PG_ERR_INVALID_ARG, PG_ERR_UNSUPPORTED, PG_ERR_NOMEM, PG_ERR_INTERNAL,
 PG_ERR_CLOSED) = range(6)
STATUS_NAMES = {0: "ok", 1: "invalid argument", 2: "unsupported", 3: "out of memory",
                4: "internal error", 5: "thread pool freed"}

PATH_NAMES = ("scalar", "avx2", "avx512", "neon")
CPU_FEATURE_BITS = {
    "sse3": 1 << 0, "avx": 1 << 1, "avx2": 1 << 2, "fma": 1 << 3, "f16c": 1 << 4,
    "avx512f": 1 << 5, "avx512bw": 1 << 6, "avx512vl": 1 << 7, "avx512vnni": 1 << 8,
    "neon": 1 << 16, "dotprod": 1 << 17, "fp16": 1 << 18,
}


def library_candidates() -> list[Path]:
    env = os.environ.get("PYGGML_LIB")
    paths = [Path(env)] if env else []
    paths += [_REPO / "build" / "native" / "libpyggml.so",
              Path(__file__).resolve().parent / "libpyggml.so"]
    return paths


def lib() -> ctypes.CDLL:
    """The loaded library (loaded on first call)."""
    global _lib
    if _lib is None:
        tried = []
        for p in library_candidates():
            tried.append(str(p))
            if p.is_file():
                try:
                    _lib = ctypes.CDLL(str(p))
                except OSError as e:
                    raise NativeLibraryError(f"cannot load {p}: {e}; rebuild it with `make setup`")
                break
        else:
            raise NativeLibraryError(
                "libpyggml.so not found (tried: " + ", ".join(tried) + "); build it with "
                "`make setup` (or `make native`) in the repository root, or set PYGGML_LIB")
    return _lib


def declare(name: str, restype, argtypes: list) -> None:
    """Record the C prototype of `name` (bound when first used)."""
    _prototypes[name] = (restype, argtypes)


def fn(name: str):
    """The bound C function `name` with its declared prototype."""
    f = _bound.get(name)
    if f is None:
        try:
            f = getattr(lib(), name)
        except AttributeError:
            raise NativeLibraryError(
                f"libpyggml has no symbol {name!r}: the library is older than the Python code; "
                f"rebuild it with `make native`") from None
        restype, argtypes = _prototypes.get(name, (ctypes.c_int32, None))
        f.restype = restype
        if argtypes is not None:
            f.argtypes = argtypes
        _bound[name] = f
    return f


def check(status: int, what: str) -> None:
    """Turn a pg_status into NativeLibraryError naming the call."""
    if status != PG_OK:
        raise NativeLibraryError(f"{what} failed: {STATUS_NAMES.get(status, status)}")


declare("pg_version", ctypes.c_char_p, [])
declare("pg_cpu_features", ctypes.c_uint32, [])
declare("pg_cpu_path", ctypes.c_int32, [])
declare("pg_set_cpu_path", ctypes.c_int32, [ctypes.c_int32])
declare("pg_path_compiled", ctypes.c_int32, [ctypes.c_int32])
declare("pg_tensor_struct_size", ctypes.c_size_t, [])


def version() -> str:
    return fn("pg_version")().decode()


def cpu_features() -> dict[str, bool]:
    bits = fn("pg_cpu_features")()
    return {name: bool(bits & b) for name, b in CPU_FEATURE_BITS.items()}


def cpu_path() -> str:
    """The kernel path in use: scalar, avx2, avx512 or neon."""
    return PATH_NAMES[fn("pg_cpu_path")()]


def set_cpu_path(name: str) -> None:
    """Force a kernel path; NativeLibraryError if this CPU or build cannot run it."""
    if name not in PATH_NAMES:
        raise ValueError(f"unknown CPU path {name!r}; expected one of {', '.join(PATH_NAMES)}")
    if fn("pg_set_cpu_path")(PATH_NAMES.index(name)) != PG_OK:
        raise NativeLibraryError(f"CPU path {name!r} is not available on this CPU/build "
                                 f"(features: {', '.join(k for k, v in cpu_features().items() if v)})")


def available_paths() -> list[str]:
    """Paths this build has and this CPU can run (tests and benchmarks compare them)."""
    cur = fn("pg_cpu_path")()
    out = []
    for i, name in enumerate(PATH_NAMES):
        if fn("pg_set_cpu_path")(i) == PG_OK:
            out.append(name)
    fn("pg_set_cpu_path")(cur)
    return out


class PgTensor(ctypes.Structure):
    """ctypes mirror of `pg_tensor` in pyggml.h (size checked against the C side by a test)."""
    _fields_ = [
        ("type", ctypes.c_int32),
        ("op", ctypes.c_int32),
        ("ne", ctypes.c_int64 * 4),
        ("nb", ctypes.c_int64 * 4),
        ("op_params", ctypes.c_int32 * 16),
        ("src", ctypes.c_int32 * 10),
        ("flags", ctypes.c_int32),
        ("pad_", ctypes.c_int32),
        ("data", ctypes.c_void_p),
        ("name", ctypes.c_char * 48),
    ]
