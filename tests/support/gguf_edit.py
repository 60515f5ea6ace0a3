"""Edits of test GGUF files in place of a writer round trip."""
from __future__ import annotations

import shutil

import gguf
import numpy as np


def copy_with_tensor_filled(src, dst, name: str, value: float):
    """A copy of the GGUF `src` at `dst` whose F32 tensor `name` holds `value` everywhere
    (e.g. NaN in output_norm.weight: a model whose logits are not finite). Returns dst."""
    shutil.copy(src, dst)
    t, = [t for t in gguf.GGUFReader(src).tensors if t.name == name]
    with open(dst, "r+b") as f:
        f.seek(int(t.data_offset))
        f.write(np.full(t.n_elements, value, np.float32).tobytes())
    return dst
