"""The Python types/op tables agree with native/include/pyggml.h and with the gguf package."""
import ctypes
import re

import gguf
import numpy as np
import pytest

from pyggml import _native, settings
from pyggml.backend import cpu
from pyggml.errors import InvalidArgumentError, NativeLibraryError, UnsupportedTypeError
from pyggml.types import TYPE_TRAITS, GGMLType, Op, as_type, row_size
from conftest import REPO

HEADER = (REPO / "native" / "include" / "pyggml.h").read_text()


def _header_enum(prefix: str) -> dict[str, int]:
    return {m.group(1): int(m.group(2))
            for m in re.finditer(rf"^\s*{prefix}(\w+)\s*=\s*(\d+),", HEADER, re.M)}


def test_types_match_header():
    header = _header_enum("PG_TYPE_")
    header.pop("COUNT")
    assert header == {t.name: t.value for t in GGMLType}


def test_ops_match_header():
    header = _header_enum("PG_OP_")
    header.pop("COUNT")
    assert header == {o.name: o.value for o in Op}


def test_every_gguf_type_known_with_gguf_sizes():
    for t in gguf.GGMLQuantizationType:
        ours = TYPE_TRAITS[GGMLType(t.value)]
        blk, size = gguf.GGML_QUANT_SIZES[t]
        if t.name == "Q8_1":
            # gguf.constants still has the old 40-byte layout; ggml's block_q8_1 is 2 fp16 + 32
            assert (ours.block_size, ours.type_size) == (32, 36)
        else:
            assert (ours.block_size, ours.type_size) == (blk, size), t.name


def test_row_size():
    assert row_size(GGMLType.F32, 10) == 40
    assert row_size("q4_0", 64) == 36
    assert row_size(GGMLType.Q4_K, 512) == 288
    assert row_size(GGMLType.Q8_1, 32) == 36
    with pytest.raises(UnsupportedTypeError, match="Q4_0.*multiple of 32.*33"):
        row_size(GGMLType.Q4_0, 33)
    with pytest.raises(UnsupportedTypeError, match="unknown tensor type id 4"):
        row_size(4, 32)
    with pytest.raises(UnsupportedTypeError, match="'q9_9'"):
        as_type("q9_9")


def test_status_codes_and_abi_version_match_header():
    header = _header_enum("PG_ERR_")
    assert header == {"INVALID_ARG": _native.PG_ERR_INVALID_ARG,
                      "UNSUPPORTED": _native.PG_ERR_UNSUPPORTED, "NOMEM": _native.PG_ERR_NOMEM,
                      "INTERNAL": _native.PG_ERR_INTERNAL, "ABORTED": _native.PG_ERR_ABORTED,
                      "CLOSED": _native.PG_ERR_CLOSED}
    assert set(_native.STATUS_NAMES) == {_native.PG_OK, *header.values()}
    m = re.search(r"^#define PG_ABI_VERSION\s+(\d+)", HEADER, re.M)
    assert m and int(m.group(1)) == _native.ABI_VERSION


def test_tensor_struct_mirror_matches_c_layout():
    """The numpy mirror the CPU backend marshals graphs into has the C struct's size and field
    offsets (the loader checks the size too; the offsets catch a reordered field)."""
    assert _native.version() == "0.1.0"
    assert _native.fn("pg_abi_version")() == _native.ABI_VERSION
    dt = _native.PG_TENSOR_DTYPE
    assert dt.itemsize == _native.fn("pg_tensor_struct_size")() == 240
    offsets = (ctypes.c_int64 * 16)()
    n = _native.fn("pg_tensor_field_offsets")(offsets, 16)
    assert n == len(dt.names) == 10
    assert {name: offsets[i] for i, name in enumerate(dt.names)} == \
        {name: dt.fields[name][1] for name in dt.names}
    assert cpu.PG_TENSOR_DTYPE is dt                  # one mirror, the one the CPU uses
    assert not hasattr(_native, "PgTensor")


def _fresh_loader(monkeypatch):
    monkeypatch.setattr(_native, "_lib", None)
    monkeypatch.setattr(_native, "_bound", {})


def test_loader_refuses_a_library_of_another_abi(monkeypatch):
    path = next(str(p) for p in _native.library_candidates() if p.is_file())
    abi = _native.ABI_VERSION
    _fresh_loader(monkeypatch)
    monkeypatch.setattr(_native, "ABI_VERSION", 999)
    with pytest.raises(NativeLibraryError) as e:
        _native.lib()
    msg = str(e.value)
    assert path in msg and f"library ABI {abi}," in msg and "expects ABI 999" in msg
    assert "make native" in msg
    assert _native._lib is None                      # nothing half-loaded: the next call retries
    monkeypatch.setattr(_native, "ABI_VERSION", abi)
    monkeypatch.setattr(_native, "PG_TENSOR_DTYPE", np.dtype([("x", "<i8")]))
    with pytest.raises(NativeLibraryError, match=r"sizeof\(pg_tensor\) 240 bytes; Python expects "
                                                 rf"ABI {abi}, 8 bytes; rebuild it with `make native`"):
        _native.lib()
    monkeypatch.undo()
    _fresh_loader(monkeypatch)
    assert _native.lib() is not None                 # the real library passes the check
    assert _native.fn("pg_abi_version")() == _native.ABI_VERSION


def test_loader_refuses_a_library_without_abi_version(monkeypatch):
    class Old:                                       # a library built before the ABI check
        pg_tensor_struct_size = None
    with pytest.raises(NativeLibraryError, match=rf"old\.so has no ABI version.*expects ABI "
                                                 rf"{_native.ABI_VERSION}.*make native"):
        _native.check_abi(Old(), "/x/old.so")


def test_cpu_path_setting(monkeypatch, caplog):
    before = _native.cpu_path()
    with settings.override(settings.Settings(cpu_path="scalar")):
        _fresh_loader(monkeypatch)
        _native.lib()
        assert _native.cpu_path() == "scalar"
    if "neon" not in _native.available_paths():      # a path this CPU cannot run: a warning
        with settings.override(settings.Settings(cpu_path="neon")):
            _fresh_loader(monkeypatch)
            _native.lib()
        assert "PYGGML_CPU_PATH=neon: this CPU or build cannot run that path" in caplog.text
    _native.set_cpu_path(before)


def test_cpu_paths_selectable():
    paths = _native.available_paths()
    assert "scalar" in paths
    before = _native.cpu_path()
    _native.set_cpu_path("scalar")
    assert _native.cpu_path() == "scalar"
    _native.set_cpu_path(before)
    with pytest.raises(InvalidArgumentError, match="unknown CPU path 'sse9'; expected one of "
                                                   "scalar, avx2, avx512, neon, amx"):
        _native.set_cpu_path("sse9")


def test_missing_library_message(monkeypatch, tmp_path):
    monkeypatch.setattr(_native, "_lib", None)
    monkeypatch.setattr(_native, "_bound", {})
    monkeypatch.setattr(_native, "_REPO", tmp_path)
    monkeypatch.setenv("PYGGML_LIB", str(tmp_path / "nope.so"))
    monkeypatch.setattr(_native, "__file__", str(tmp_path / "pyggml" / "_native.py"))
    with pytest.raises(_native.NativeLibraryError, match=r"nope\.so.*make setup"):
        _native.lib()
