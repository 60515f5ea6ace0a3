"""The architectures pyggml runs, one module per family; `get_arch(name)` is the registry.

Adding one: docs/ARCHITECTURE.md, "How to add an architecture". A model's `general.architecture` selects its Arch;
an unknown one is a ModelError naming it and listing these.
"""

from __future__ import annotations

from pyggml.errors import ModelError
from pyggml.llm.archs import (gemma, gemma3n, gemma4, gpt_oss, lfm2, llama, olmo, phi3, qwen3,
                              qwen35)
from pyggml.llm.archs.common import Arch

ARCHS: dict[str, Arch] = {a.name: a for m in (llama, qwen3, qwen35, gemma, phi3, olmo, lfm2,
                                                  gpt_oss, gemma4, gemma3n)
                         for a in m.ARCHS}
SUPPORTED_ARCHS = tuple(sorted(ARCHS))


def get_arch(name: str, path="model") -> Arch:
    a = ARCHS.get(name)
    if a is None:
        raise ModelError(f"{path}: architecture {name!r} is not supported (supported: "
                         f"{', '.join(SUPPORTED_ARCHS)})")
    return a
