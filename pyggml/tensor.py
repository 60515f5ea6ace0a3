"""Tensor: the metadata of one graph node, with ggml_tensor's semantics.

A Tensor holds no data of its own. `data` is an address (int) once an allocator or a context arena
has placed it, else None; `buffer` names the memory that holds it. `ne` counts elements per
dimension with ne[0] innermost (ggml order); `nb` are byte strides. A view shares its source's
memory: `view_src` is the tensor that owns the bytes and `view_offs` the byte offset into it.

Placement generation: every time a tensor's `data` changes to another address (an allocator
placing a graph, a buffer or arena placing tensors, or code assigning it), the process-wide
counter `placement_generation()` goes up. Backends that keep address-dependent work per graph (the
Vulkan backend's recorded command buffers, the CPU's marshalled node arrays) remember the
generation they prepared at and look at the addresses again only when it moved: replaying an
unchanged graph costs no Python work per node.
"""

from __future__ import annotations

import struct
from enum import IntFlag

from pyggml.types import GGMLType, Op, traits

MAX_DIMS = 4
MAX_SRC = 10
MAX_OP_PARAMS = 16          # int32 slots (64 bytes); floats are stored bit-cast, as ggml does
MAX_NAME_BYTES = 47         # what fits the C struct's name field (48 with the terminator)

_placements = [0]           # the placement generation (a list: bumped in place by Tensor.data)


def placement_generation() -> int:
    """Counts changes of any tensor's data address in this process (see the module docstring)."""
    return _placements[0]


class TensorFlag(IntFlag):
    INPUT = 1
    OUTPUT = 2
    PARAM = 4
    LOSS = 8
    COMPUTE = 16


def contiguous_strides(type_: GGMLType, ne) -> tuple[int, int, int, int]:
    """Byte strides of a contiguous tensor: nb[0] = bytes per block, nb[1] = one row's bytes."""
    tr = traits(type_)
    nb0 = tr.type_size
    nb1 = nb0 * (ne[0] // tr.block_size)
    nb2 = nb1 * ne[1]
    nb3 = nb2 * ne[2]
    return (nb0, nb1, nb2, nb3)


class Tensor:
    """One node of a lazy compute graph (see module docstring).

    Shapes: `ne` is a 4-tuple, ne[0] innermost; `shape` gives the numpy order.
    """

    __slots__ = ("type", "ne", "nb", "op", "op_params", "flags", "src", "view_src", "view_offs",
                 "buffer", "_data", "name", "extra", "_keepalive", "__weakref__")

    def __init__(self, type_: GGMLType, ne, nb=None, op: Op = Op.NONE, src=(), view_src=None,
                 view_offs: int = 0, name: str = ""):
        self.type = GGMLType(type_)
        self.ne = tuple(int(x) for x in ne)
        self.nb = tuple(int(x) for x in nb) if nb is not None else contiguous_strides(self.type, self.ne)
        self.op = Op(op)
        self.op_params = bytearray(MAX_OP_PARAMS * 4)
        self.flags = 0
        self.src = list(src)
        self.view_src = view_src
        self.view_offs = int(view_offs)
        self.buffer = None
        self._data = None           # a new tensor is in no prepared graph: no generation bump
        self.name = name
        self.extra = None
        self._keepalive = None      # what `data` points into, when nothing else owns it

    @property
    def data(self) -> int | None:
        """The address of the first element (int), or None when not placed."""
        return self._data

    @data.setter
    def data(self, addr: int | None) -> None:
        if addr != self._data:
            self._data = addr
            _placements[0] += 1

    # ---- shape facts -------------------------------------------------------------------------
    @property
    def n_dims(self) -> int:
        """Number of dimensions up to the last one larger than 1 (at least 1), as ggml_n_dims."""
        for i in range(MAX_DIMS - 1, 0, -1):
            if self.ne[i] > 1:
                return i + 1
        return 1

    @property
    def shape(self) -> tuple[int, ...]:
        """numpy order: reversed(ne[:n_dims])."""
        return tuple(reversed(self.ne[: self.n_dims]))

    def nelements(self) -> int:
        ne = self.ne
        return ne[0] * ne[1] * ne[2] * ne[3]

    def nrows(self) -> int:
        ne = self.ne
        return ne[1] * ne[2] * ne[3]

    def nbytes(self) -> int:
        """Bytes spanned from the first to one past the last element (ggml_nbytes)."""
        ne, nb = self.ne, self.nb
        if any(x <= 0 for x in ne):
            return 0
        tr = traits(self.type)
        if tr.block_size == 1:
            n = tr.type_size
            for i in range(MAX_DIMS):
                n += (ne[i] - 1) * nb[i]
            return n
        n = ne[0] * nb[0] // tr.block_size
        for i in range(1, MAX_DIMS):
            n += (ne[i] - 1) * nb[i]
        return n

    def row_bytes(self) -> int:
        tr = traits(self.type)
        return self.ne[0] // tr.block_size * tr.type_size

    def is_contiguous(self) -> bool:
        """Elements laid out densely in ne order (dimensions of size 1 may have any stride)."""
        tr = traits(self.type)
        if self.ne[0] != tr.block_size and self.nb[0] != tr.type_size:
            return False
        expect = tr.type_size * (self.ne[0] // tr.block_size)
        for i in range(1, MAX_DIMS):
            if self.ne[i] != 1:
                if self.nb[i] != expect:
                    return False
                expect *= self.ne[i]
        return True

    def is_contiguous_rows(self) -> bool:
        """Each row is dense (nb[0] is the element/block size); rows may be strided."""
        return self.nb[0] == traits(self.type).type_size

    def is_transposed(self) -> bool:
        return self.nb[0] > self.nb[1]

    def is_permuted(self) -> bool:
        nb = self.nb
        return nb[0] > nb[1] or nb[1] > nb[2] or nb[2] > nb[3]

    @property
    def is_view(self) -> bool:
        return self.view_src is not None

    def same_shape(self, other: "Tensor") -> bool:
        return self.ne == other.ne

    def same_layout(self, other: "Tensor") -> bool:
        return self.type == other.type and self.ne == other.ne and self.nb == other.nb

    # ---- op params (int32 slots, floats bit-cast) --------------------------------------------
    def set_op_params_i32(self, i: int, value: int) -> None:
        struct.pack_into("<i", self.op_params, 4 * i, int(value))

    def set_op_params_f32(self, i: int, value: float) -> None:
        struct.pack_into("<f", self.op_params, 4 * i, float(value))

    def op_param_i32(self, i: int) -> int:
        return struct.unpack_from("<i", self.op_params, 4 * i)[0]

    def op_param_f32(self, i: int) -> float:
        return struct.unpack_from("<f", self.op_params, 4 * i)[0]

    # ---- flags and names ---------------------------------------------------------------------
    def set_input(self) -> "Tensor":
        self.flags |= TensorFlag.INPUT
        return self

    def set_output(self) -> "Tensor":
        self.flags |= TensorFlag.OUTPUT
        return self

    def set_param(self) -> "Tensor":
        self.flags |= TensorFlag.PARAM
        return self

    def set_name(self, name: str) -> "Tensor":
        self.name = name
        return self

    def __repr__(self) -> str:
        ne = ", ".join(str(x) for x in self.ne)
        return f"Tensor({self.name!r}, {self.type.name}, op={self.op.name}, ne=[{ne}])"
