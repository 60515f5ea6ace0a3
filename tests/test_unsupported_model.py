"""A file with something pyggml cannot run fails while it is only mapped, in one line that names
the architecture, or the tensor and its type, and lists what is supported (issue 32, item 3)."""
import dataclasses
import sys
from pathlib import Path

import numpy as np
import pytest

from pyggml import _native
from pyggml.errors import ModelError, UnsupportedTypeError
from pyggml.llm.models import WEIGHT_TYPES
from pyggml.llm.runtime import LLM
from pyggml.types import COMPUTE_TYPES, TYPE_TRAITS, GGMLType

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))
import make_arch_models as M  # noqa: E402


def write_with_raw(tmp_path, raw: GGMLType, types=("q8_0", "raw")) -> Path:
    """The qwen3 variant with its matrices of type "raw" as random bytes of type `raw`."""
    from gguf import GGMLQuantizationType as QT
    blk, size = TYPE_TRAITS[raw].block_size, TYPE_TRAITS[raw].type_size
    rng = np.random.default_rng(5)
    orig = M._encode

    def encode(x, t):
        if t != "raw":
            return orig(x, t)
        b = rng.integers(0, 256, (*x.shape[:-1], x.shape[-1] // blk * size), dtype=np.uint8)
        return b

    M._encode, M._QT["raw"] = encode, QT(int(raw))
    M.VARIANTS["raw"] = dataclasses.replace(M.VARIANTS["qwen3"], types=types)
    try:
        return M.write_variant("raw", tmp_path / f"{raw.name}.gguf")
    finally:
        M._encode = orig
        del M.VARIANTS["raw"], M._QT["raw"]


def test_weight_types_are_what_the_kernels_compute():
    """COMPUTE_TYPES (what the loader accepts) is exactly what libpyggml has dot kernels for,
    on every path this machine can run."""
    import pyggml.quants  # noqa: F401 - declares the entry points
    vdt = _native.fn("pg_vec_dot_type")
    for path in _native.available_paths():
        before = _native.cpu_path()
        _native.set_cpu_path(path)
        try:
            has_dot = {t for t in GGMLType if vdt(int(t)) >= 0}
        finally:
            _native.set_cpu_path(before)
        assert has_dot - {GGMLType.F32, GGMLType.F16, GGMLType.BF16} == \
            {t for t in WEIGHT_TYPES if TYPE_TRAITS[t].is_quantized}, path
    assert WEIGHT_TYPES < COMPUTE_TYPES


def test_unsupported_tensor_type_names_tensor_type_and_supported(tmp_path):
    p = write_with_raw(tmp_path, GGMLType.NVFP4)
    with pytest.raises(UnsupportedTypeError) as e:
        LLM(p, n_ctx=256)
    msg = str(e.value)
    assert "\n" not in msg
    assert f"{p}: tensor 'output.weight' has type NVFP4, which pyggml cannot compute" in msg
    assert "more tensors: NVFP4)" in msg
    assert "supported types: F32, F16, Q4_0" in msg and "Q6_K" in msg and "Q8_K" not in msg


def test_unsupported_type_fails_before_anything_is_allocated(tmp_path, monkeypatch):
    """The check runs on the mapped file: no backend buffer, KV cache or scheduler is made."""
    from pyggml.llm import setup
    p = write_with_raw(tmp_path, GGMLType.NVFP4, types=("raw",))
    called = []
    monkeypatch.setattr(setup, "build_run", lambda *a, **k: called.append(1))
    with pytest.raises(UnsupportedTypeError, match="'token_embd.weight' has type NVFP4"):
        LLM(p, n_ctx=256)
    assert not called


def test_unsupported_type_in_plan_and_cli(tmp_path, capsys):
    from pyggml.cli import main
    p = write_with_raw(tmp_path, GGMLType.NVFP4)
    rc = main(["plan", "-m", str(p)])
    err = capsys.readouterr().err
    assert rc != 0
    assert "tensor 'output.weight' has type NVFP4" in err
    assert len(err.strip().splitlines()) == 1


def test_unknown_architecture_names_itself_and_the_supported(tmp_path):
    import gguf
    p = tmp_path / "mamba.gguf"
    w = gguf.GGUFWriter(str(p), "mamba2")
    w.add_uint32("mamba2.block_count", 1)
    w.add_tensor("token_embd.weight", np.zeros((4, 32), np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with pytest.raises(ModelError, match=r"architecture 'mamba2' is not supported \(supported: "
                                         r"gemma2, .*llama.*\)$"):
        LLM(p)
