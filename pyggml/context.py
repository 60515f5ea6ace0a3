"""Context: owns tensor metadata (and, unless no_alloc, a host arena for tensor data), under a
size budget, like ggml_context. Exhausting the budget raises ContextFullError with the numbers."""

from __future__ import annotations

import numpy as np

from pyggml.errors import ContextFullError, InvalidArgumentError, ShapeError
from pyggml.tensor import MAX_DIMS, Tensor, contiguous_strides
from pyggml.types import GGMLType, as_type, traits

# Metadata bytes charged per tensor against the budget (ggml: object header + tensor struct).
TENSOR_OVERHEAD = 368
DATA_ALIGNMENT = 32


def _align(n: int, a: int) -> int:
    return (n + a - 1) // a * a


class Context:
    """Creates tensors and accounts for their cost.

    mem_size: budget in bytes for metadata (TENSOR_OVERHEAD per tensor) and, when `no_alloc` is
        False, the data of every non-view tensor (aligned to 32). None = unlimited (only with
        no_alloc=True).
    no_alloc: True (the usual case) creates lazy tensors whose data an allocator places later;
        False gives each new tensor host memory from an arena owned by the context.
    """

    def __init__(self, mem_size: int | None = None, no_alloc: bool = True, name: str = "ctx"):
        if mem_size is None and not no_alloc:
            raise InvalidArgumentError("Context(no_alloc=False) needs a mem_size for its data arena")
        if mem_size is not None and mem_size < 0:
            raise InvalidArgumentError(f"Context mem_size must be >= 0, got {mem_size}")
        self.name = name
        self.mem_size = mem_size
        self.no_alloc = no_alloc
        self.used_bytes = 0
        self.tensors: list[Tensor] = []
        self._by_name: dict[str, Tensor] = {}
        self._arena = None if no_alloc else np.zeros(mem_size, dtype=np.uint8)
        self._arena_addr = 0 if no_alloc else self._arena.ctypes.data
        self._arena_used = 0

    # ---- creation ----------------------------------------------------------------------------
    def new_tensor(self, type_, ne, *, view_src: Tensor | None = None, view_offs: int = 0,
                   nb=None, name: str = "") -> Tensor:
        """A new tensor of `type_` with shape `ne` (1 to 4 dims, ne[0] innermost).

        With `view_src`, the tensor shares view_src's memory at byte offset `view_offs` (which must
        lie inside it); `nb` may give non-contiguous strides for views."""
        t_type = as_type(type_)
        ne = list(ne)
        if not 1 <= len(ne) <= MAX_DIMS:
            raise ShapeError(f"a tensor has 1 to {MAX_DIMS} dimensions, got ne={ne}")
        if not all(isinstance(x, (int, np.integer)) and not isinstance(x, bool) for x in ne):
            raise ShapeError(f"tensor '{name}': ne must be integers, got ne={ne}")
        if any(x < 0 for x in ne):
            raise ShapeError(f"negative dimension in ne={ne}")
        ne = [int(x) for x in ne] + [1] * (MAX_DIMS - len(ne))
        blk = traits(t_type).block_size
        if ne[0] % blk:
            raise ShapeError(f"tensor '{name}' of type {t_type.name}: ne[0]={ne[0]} is not a "
                             f"multiple of the block size {blk}")
        if view_src is not None and view_src.view_src is not None:
            # a view of a view owns nothing: point at the tensor that owns the bytes
            view_offs += view_src.view_offs
            view_src = view_src.view_src
        t = Tensor(t_type, ne, nb=nb, view_src=view_src, view_offs=view_offs, name=name)
        data_bytes = 0
        if view_src is not None:
            span = t.nbytes()
            if view_offs < 0 or view_offs + span > view_src.nbytes():
                raise ShapeError(
                    f"view '{name}' of {view_src.name or 'tensor'} (ne={list(view_src.ne)}, "
                    f"{view_src.nbytes()} bytes) needs bytes [{view_offs}, {view_offs + span}), "
                    f"outside its source")
            if view_src.data is not None:
                t.data = view_src.data + view_offs
                t.buffer = view_src.buffer
        elif not self.no_alloc:
            data_bytes = _align(t.nbytes(), DATA_ALIGNMENT)
        self._charge(TENSOR_OVERHEAD + data_bytes, name)
        if data_bytes:
            t.data = self._arena_addr + self._arena_used
            t._keepalive = self._arena   # the arena lives as long as any tensor in it
            self._arena_used += data_bytes
        self.tensors.append(t)
        if name:
            self._by_name[name] = t
        return t

    def new_tensor_1d(self, type_, ne0, name=""):
        return self.new_tensor(type_, [ne0], name=name)

    def new_tensor_2d(self, type_, ne0, ne1, name=""):
        return self.new_tensor(type_, [ne0, ne1], name=name)

    def new_tensor_3d(self, type_, ne0, ne1, ne2, name=""):
        return self.new_tensor(type_, [ne0, ne1, ne2], name=name)

    def new_tensor_4d(self, type_, ne0, ne1, ne2, ne3, name=""):
        return self.new_tensor(type_, [ne0, ne1, ne2, ne3], name=name)

    def dup_tensor(self, a: Tensor, type_=None, name: str = "") -> Tensor:
        """A new contiguous tensor with a's shape (and type unless given)."""
        return self.new_tensor(a.type if type_ is None else type_, a.ne, name=name)

    def view_tensor(self, a: Tensor, name: str = "") -> Tensor:
        """A view of all of `a` with its strides."""
        return self.new_tensor(a.type, a.ne, view_src=a, view_offs=0, nb=a.nb,
                               name=name or (f"{a.name} (view)" if a.name else ""))

    def _charge(self, n_bytes: int, name: str) -> None:
        if self.mem_size is not None and self.used_bytes + n_bytes > self.mem_size:
            left = self.mem_size - self.used_bytes
            raise ContextFullError(
                f"context '{self.name}' is full: tensor '{name or '?'}' needs {n_bytes} bytes, "
                f"{left} of {self.mem_size} left ({len(self.tensors)} tensors); "
                f"create it with mem_size >= {self.used_bytes + n_bytes}")
        self.used_bytes += n_bytes

    # ---- lookup ------------------------------------------------------------------------------
    def get_tensor(self, name: str) -> Tensor | None:
        t = self._by_name.get(name)
        if t is None:  # renamed after creation
            for x in self.tensors:
                if x.name == name:
                    return x
        return t

    def arena(self) -> np.ndarray | None:
        """The host arena behind tensor data when no_alloc=False (keeps it alive)."""
        return self._arena

    def __len__(self) -> int:
        return len(self.tensors)
