"""The Python types/op tables agree with native/include/pyggml.h and with the gguf package."""
import re

import gguf
import pytest

from pyggml import _native
from pyggml.errors import UnsupportedTypeError
from pyggml.types import TYPE_TRAITS, GGMLType, Op, as_type, row_size
from tests.conftest import REPO

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


def test_native_struct_and_version():
    import ctypes
    assert _native.version() == "0.1.0"
    assert ctypes.sizeof(_native.PgTensor) == _native.fn("pg_tensor_struct_size")()


def test_cpu_paths_selectable():
    paths = _native.available_paths()
    assert "scalar" in paths
    before = _native.cpu_path()
    _native.set_cpu_path("scalar")
    assert _native.cpu_path() == "scalar"
    _native.set_cpu_path(before)
    with pytest.raises(ValueError, match="unknown CPU path"):
        _native.set_cpu_path("sse9")


def test_missing_library_message(monkeypatch, tmp_path):
    monkeypatch.setattr(_native, "_lib", None)
    monkeypatch.setattr(_native, "_bound", {})
    monkeypatch.setattr(_native, "_REPO", tmp_path)
    monkeypatch.setenv("PYGGML_LIB", str(tmp_path / "nope.so"))
    monkeypatch.setattr(_native, "__file__", str(tmp_path / "pyggml" / "_native.py"))
    with pytest.raises(_native.NativeLibraryError, match=r"nope\.so.*make setup"):
        _native.lib()
