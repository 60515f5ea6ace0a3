"""Backend interfaces, ggml-backend's four levels as small Python classes.

- BufferType: a kind of memory a device offers (name, alignment, max_size, is_host).
- Buffer: one allocation of a BufferType; tensors are placed at offsets inside it.
- Backend: computes graphs on one device; says which ops (`supports_op`) and buffer types
  (`supports_buft`) it can use, and whether an op is worth moving to it (`offload_op`).
"""

from __future__ import annotations

from enum import Enum


class BufferUsage(Enum):
    ANY = 0
    WEIGHTS = 1
    COMPUTE = 2


class BufferType:
    """A kind of memory. alignment: bytes every tensor offset is a multiple of; max_size: the
    largest single allocation (None = no limit); is_host: the CPU can read it directly."""

    def __init__(self, name: str, alignment: int = 64, max_size: int | None = None,
                 is_host: bool = True):
        self.name = name
        self.alignment = alignment
        self.max_size = max_size
        self.is_host = is_host

    def alloc_buffer(self, n_bytes: int) -> "Buffer":
        raise NotImplementedError

    def __repr__(self) -> str:
        return f"BufferType({self.name!r})"


class Buffer:
    """One allocation of `buft`, n_bytes long. `base` is an integer address for host buffers."""

    def __init__(self, buft: BufferType, n_bytes: int, usage: BufferUsage = BufferUsage.ANY):
        self.buft = buft
        self.n_bytes = n_bytes
        self.usage = usage
        self.base = 0

    def set_tensor(self, tensor, data: bytes | memoryview, offset: int = 0) -> None:
        raise NotImplementedError

    def get_tensor(self, tensor, offset: int = 0, n_bytes: int | None = None) -> bytes:
        raise NotImplementedError

    def clear(self, value: int = 0) -> None:
        raise NotImplementedError


class Backend:
    """Computes graphs on one device. Subclasses implement the methods below."""

    name: str = "?"

    def supports_op(self, node) -> bool:
        raise NotImplementedError

    def supports_buft(self, buft: BufferType) -> bool:
        raise NotImplementedError

    def offload_op(self, node) -> bool:
        return False

    def graph_compute(self, graph) -> None:
        raise NotImplementedError

    def synchronize(self) -> None:
        pass
