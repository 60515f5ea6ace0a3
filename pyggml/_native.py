"""Loads libpyggml with ctypes and binds its entry points lazily.

Search order: $PYGGML_LIB (pyggml.settings), then <repo>/build/native/libpyggml.so (what
`make setup` builds). A missing library raises NativeLibraryError naming every path tried and the
command that builds it. On load the library's ABI version (PG_ABI_VERSION) and sizeof(pg_tensor)
must equal ABI_VERSION and PG_TENSOR_DTYPE.itemsize here: a library built from other sources
than this Python code is refused (NativeLibraryError naming the path, both values and
`make native`) instead of misreading structs. Symbols are bound on first use (`native.fn(name)`),
so one missing symbol does not break import. Modules declare the prototypes they use with
`declare`.
"""

from __future__ import annotations

import ctypes
import logging
from pathlib import Path

import numpy as np

from pyggml import settings
from pyggml.errors import InvalidArgumentError, NativeLibraryError

_REPO = Path(__file__).resolve().parent.parent
_lib: ctypes.CDLL | None = None
_bound: dict[str, object] = {}
_prototypes: dict[str, tuple] = {}

log = logging.getLogger("pyggml.native")

ABI_VERSION = 2        # PG_ABI_VERSION in native/include/pyggml.h: change both together

# pg_status (values as in pyggml.h; tests/test_types.py checks them against the header)
(PG_OK, PG_ERR_INVALID_ARG, PG_ERR_UNSUPPORTED, PG_ERR_NOMEM, PG_ERR_INTERNAL, PG_ERR_ABORTED,
 PG_ERR_CLOSED) = range(7)
STATUS_NAMES = {0: "ok", 1: "invalid argument", 2: "unsupported", 3: "out of memory",
                4: "internal error", 5: "stopped by the evaluation callback",
                6: "thread pool freed"}

# numpy mirror of `pg_tensor`, the array element pg_graph_compute reads (pyggml/backend/cpu.py
# marshals graphs into it). Its itemsize is checked against the C sizeof when the library loads,
# and its field offsets against pg_tensor_field_offsets by tests/test_types.py.
PG_TENSOR_DTYPE = np.dtype([
    ("type", "<i4"), ("op", "<i4"), ("ne", "<i8", (4,)), ("nb", "<i8", (4,)),
    ("op_params", "<i4", (16,)), ("src", "<i4", (10,)), ("flags", "<i4"), ("pad_", "<i4"),
    ("data", "<u8"), ("name", "S48"),
])

PATH_NAMES = settings.CPU_PATHS            # pg_path order
CPU_FEATURE_BITS = {
    "sse3": 1 << 0, "avx": 1 << 1, "avx2": 1 << 2, "fma": 1 << 3, "f16c": 1 << 4,
    "avx512f": 1 << 5, "avx512bw": 1 << 6, "avx512vl": 1 << 7, "avx512vnni": 1 << 8, "amx_int8": 1 << 9,
    "avx_vnni": 1 << 10,
    "neon": 1 << 16, "dotprod": 1 << 17, "fp16": 1 << 18,
}


def library_candidates() -> list[Path]:
    env = settings.current().lib
    paths = [env] if env else []
    paths += [_REPO / "build" / "native" / "libpyggml.so",
              Path(__file__).resolve().parent / "libpyggml.so"]
    return paths


def lib() -> ctypes.CDLL:
    """The loaded library (loaded on first call)."""
    global _lib
    if _lib is None:
        env = settings.current()
        tried = []
        for p in library_candidates():
            tried.append(str(p))
            if p.is_file():
                try:
                    handle = ctypes.CDLL(str(p))
                except OSError as e:
                    raise NativeLibraryError(f"cannot load {p}: {e}; rebuild it with `make setup`")
                break
        else:
            raise NativeLibraryError(
                "libpyggml.so not found (tried: " + ", ".join(tried) + "); build it with "
                "`make setup` (or `make native`) in the repository root, or set PYGGML_LIB")
        check_abi(handle, p)
        _lib = handle
        if env.cpu_path is not None:
            _apply_cpu_path(env.cpu_path)
    return _lib


def check_abi(handle: ctypes.CDLL, path) -> None:
    """Refuse a library whose ABI version or sizeof(pg_tensor) differ from this Python code."""
    fix = "rebuild it with `make native` (or point PYGGML_LIB at a matching build)"
    try:
        abi, size = handle.pg_abi_version, handle.pg_tensor_struct_size
    except AttributeError:
        raise NativeLibraryError(f"{path} has no ABI version (pg_abi_version): it is older than "
                                 f"the Python code, which expects ABI {ABI_VERSION}; {fix}") \
            from None
    abi.restype, abi.argtypes = ctypes.c_int32, []
    size.restype, size.argtypes = ctypes.c_size_t, []
    got_abi, got_size = abi(), size()
    if got_abi != ABI_VERSION or got_size != PG_TENSOR_DTYPE.itemsize:
        raise NativeLibraryError(
            f"{path} does not match the Python code: library ABI {got_abi}, sizeof(pg_tensor) "
            f"{got_size} bytes; Python expects ABI {ABI_VERSION}, {PG_TENSOR_DTYPE.itemsize} "
            f"bytes; {fix}")


def _apply_cpu_path(name: str) -> None:
    """PYGGML_CPU_PATH: the C side chose it at load if it can; say so when it could not."""
    path = PATH_NAMES.index(name)
    if fn("pg_cpu_path")() != path and fn("pg_set_cpu_path")(path) != PG_OK:
        log.warning("PYGGML_CPU_PATH=%s: this CPU or build cannot run that path; using %s",
                    name, cpu_path())


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
declare("pg_abi_version", ctypes.c_int32, [])
declare("pg_tensor_struct_size", ctypes.c_size_t, [])
declare("pg_tensor_field_offsets", ctypes.c_int32, [ctypes.POINTER(ctypes.c_int64), ctypes.c_int32])


def version() -> str:
    return fn("pg_version")().decode()


def cpu_features() -> dict[str, bool]:
    bits = fn("pg_cpu_features")()
    return {name: bool(bits & b) for name, b in CPU_FEATURE_BITS.items()}


def cpu_path() -> str:
    """The kernel path in use: scalar, avx2, avx512, amx or neon."""
    return PATH_NAMES[fn("pg_cpu_path")()]


def set_cpu_path(name: str) -> None:
    """Force a kernel path; NativeLibraryError if this CPU or build cannot run it."""
    if name not in PATH_NAMES:
        raise InvalidArgumentError(f"unknown CPU path {name!r}; expected one of "
                                   f"{', '.join(PATH_NAMES)}")
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


# ---- the decode step (pg_decode_step in pyggml.h; pyggml/llm/context.py's fast path) ----------
PG_STEP_MAX_UNDO = 16
PG_STEP_FALLBACK, PG_STEP_OTHER_GRAPH, PG_STEP_NOT_FINITE = 100, 101, 102


class CellUndo(ctypes.Structure):
    """pg_cell_undo: a cell the step changed and what it held before."""
    _fields_ = [("space", ctypes.c_int32), ("pad_", ctypes.c_int32), ("cell", ctypes.c_int64),
                ("pos", ctypes.c_int64), ("seqs", ctypes.c_uint64)]


class DecodeStepArgs(ctypes.Structure):
    """pg_decode_step_args, field for field (its size is checked against the library's
    pg_decode_step_args_size before the first use)."""
    _P2 = ctypes.c_void_p * 2
    _I2 = ctypes.c_int64 * 2
    _fields_ = [
        ("cell_pos", _P2), ("cell_seqs", _P2), ("n_cells", _I2),
        ("n_spaces", ctypes.c_int32), ("pad0_", ctypes.c_int32),
        ("ring", ctypes.c_int64), ("window", ctypes.c_int64), ("kv_pad", ctypes.c_int64),
        ("n_kv", _I2),
        ("inp_tokens", ctypes.c_void_p), ("inp_pos", ctypes.c_void_p), ("inp_kv_idxs", _P2),
        ("inp_out_ids", ctypes.c_void_p),
        ("mask", _P2), ("mask_n_kv", _I2), ("mask_space", _I2), ("mask_window", _I2),
        ("plan", ctypes.c_void_p), ("tp", ctypes.c_void_p), ("work", ctypes.c_void_p),
        ("work_size", ctypes.c_size_t), ("n_threads", ctypes.c_int32),
        ("bad_node", ctypes.c_int32),
        ("logits", ctypes.c_void_p), ("n_vocab", ctypes.c_int64),
        ("t_compute_ns", ctypes.c_int64), ("n_undo", ctypes.c_int64),
        ("undo", CellUndo * PG_STEP_MAX_UNDO),
    ]


declare("pg_decode_step", ctypes.c_int32, [ctypes.POINTER(DecodeStepArgs), ctypes.c_int32,
                                           ctypes.c_int32, ctypes.c_int32, ctypes.c_void_p])
declare("pg_decode_step_undo", None, [ctypes.POINTER(DecodeStepArgs)])
declare("pg_decode_step_args_size", ctypes.c_size_t, [])


_step_ok: list[bool] = []        # decode_step_available's answer, found once


def decode_step_available() -> bool:
    """Whether the loaded library has pg_decode_step with this module's layout of its arguments
    (a library older than the Python code has not: the general path is taken)."""
    if not _step_ok:
        try:
            _step_ok.append(fn("pg_decode_step_args_size")() == ctypes.sizeof(DecodeStepArgs))
        except NativeLibraryError:
            _step_ok.append(False)
    return _step_ok[0]
