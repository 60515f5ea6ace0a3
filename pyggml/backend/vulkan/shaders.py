"""Which compiled SPIR-V modules the Vulkan backend needs: read from shaders/variants.mk, the list
the Makefile compiles, so the two cannot drift apart (a test compares this reading with
`make shader-names`).

variants.mk holds plain `NAME := words` assignments (backslash-continued): VK_SHADERS and
VK_TOOL_SHADERS are name:source:defines entries, VK_TYPED_SHADERS entries are made once per type
of VK_TYPES with '%' standing for the type. The backend loads VK_SHADERS and VK_TYPED_SHADERS;
VK_TOOL_SHADERS are built for tools only.
"""

from __future__ import annotations

import functools
import re
from pathlib import Path

from pyggml.errors import BackendError

_REPO_VARIANTS = Path(__file__).resolve().parents[3] / "shaders" / "variants.mk"
# an installed wheel carries a copy next to its compiled modules (setup.py's build_shaders)
_PACKAGE_VARIANTS = Path(__file__).resolve().parents[2] / "shaders" / "variants.mk"
VARIANTS_FILE = _REPO_VARIANTS if _REPO_VARIANTS.is_file() else _PACKAGE_VARIANTS
_ASSIGNMENT = re.compile(r"^([A-Z_]+)\s*:=\s*(.*)$")


def read_variables(text: str, where: str = "variants.mk") -> dict[str, list[str]]:
    """The `NAME := words` assignments of a makefile text, as word lists; BackendError for any
    other statement (this reader expands nothing)."""
    out: dict[str, list[str]] = {}
    joined = re.sub(r"\\\n", " ", text)
    for i, line in enumerate(joined.splitlines(), 1):
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        m = _ASSIGNMENT.match(line)
        if m is None or "$" in line:
            raise BackendError(f"{where}: {line!r} is not a plain `NAME := words` assignment "
                               f"(the backend reads this file: the Makefile does the expanding)")
        out[m.group(1)] = m.group(2).split()
    return out


@functools.lru_cache(maxsize=None)
def required_shaders(path: Path = VARIANTS_FILE) -> tuple[str, ...]:
    """The names of the modules the backend loads (build/shaders/<name>.spv), in the order of
    variants.mk; BackendError when the file cannot be read."""
    try:
        text = Path(path).read_text()
    except OSError as e:
        raise BackendError(f"the shader list {path} cannot be read ({e})") from None
    v = read_variables(text, str(path))
    names = [entry.split(":", 1)[0] for entry in v.get("VK_SHADERS", [])]
    names += [entry.split(":", 1)[0].replace("%", t)
              for entry in v.get("VK_TYPED_SHADERS", []) for t in v.get("VK_TYPES", [])]
    if not names:
        raise BackendError(f"{path}: no VK_SHADERS or VK_TYPED_SHADERS listed")
    return tuple(names)
