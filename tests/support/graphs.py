"""Weights placed on chosen devices, and readers, for scheduler tests."""

from __future__ import annotations

import zlib

import numpy as np

from pyggml import quants
from pyggml.backend.base import BufferUsage, alloc_tensors, tensor_get, tensor_set
from pyggml.types import GGMLType


def weight_values(name: str, type_, ne) -> np.ndarray | bytes:
    """Deterministic values for weight `name` (bytes for quantized types)."""
    rng = np.random.default_rng(zlib.crc32(name.encode()))
    shape = tuple(reversed([x for x in ne]))
    vals = (rng.standard_normal(shape) * 0.5).astype(np.float32)
    t = GGMLType[type_.upper()] if isinstance(type_, str) else GGMLType(type_)
    if t == GGMLType.F32:
        return vals
    if t == GGMLType.F16:
        return vals.astype(np.float16)
    return quants.quantize(vals.reshape(-1, ne[0]), t).tobytes()


def make_weights(ctx, specs: dict, where: dict) -> dict:
    """specs: name -> (type, ne); where: name -> buffer type. One WEIGHTS buffer per buffer type
    (kept on the returned dict under '_buffers')."""
    out, by_buft = {}, {}
    for name, (type_, ne) in specs.items():
        t = ctx.new_tensor(type_, ne, name=name)
        out[name] = t
        by_buft.setdefault(id(where[name]), (where[name], []))[1].append(t)
    out["_buffers"] = [alloc_tensors(bt, ts, BufferUsage.WEIGHTS) for bt, ts in by_buft.values()]
    for name, (type_, ne) in specs.items():
        tensor_set(out[name], weight_values(name, type_, ne))
    return out


def read_f32(t) -> np.ndarray:
    """An F32 tensor's values in numpy order (contiguous tensors)."""
    return np.frombuffer(tensor_get(t), dtype=np.float32).reshape(t.shape).copy()
