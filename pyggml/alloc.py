"""The planning allocator: tensor lifetimes → offsets in one logical buffer per buffer type.

ggml-alloc.c's design (docs/ARCHITECTURE.md, "The allocator"), in two layers:

DynAllocator    one logical buffer made of up to 16 chunks. Each chunk keeps its free blocks sorted
                by offset, merged on free. A request takes the best fitting free block that is not
                the last block of its chunk; failing that, the last block of the chunk chosen by
                reuse factor (grow a chunk as little as possible, else waste as little as
                possible); failing that, a new chunk. Chunks are capped at the buffer type's
                max_size (a larger single tensor gets a chunk of its own size; the 16th chunk is
                unbounded). Each chunk records its high-water mark: the bytes to allocate.

GraphAllocator  walks a graph in execution order, like ggml_gallocr:
  1. leafs without data, then INPUT tensors, are allocated before any node (never reused before
     their last consumer ran);
  2. children and views are counted per tensor;
  3. per node: its sources get memory if they have none, the node gets memory, and each source
     whose last consumer this was (no children and no live views left) is freed - a view frees
     nothing itself but releases its owner (`view_src`) once the owner has no children and no
     live views left. OUTPUT tensors (or tensors with an OUTPUT view) are never freed.
  A node whose op may run in place (INPLACE_OPS) takes the memory of a source when: (1) the source's
  memory is owned by this allocator and still allocated, (2) it is not an output nor an input,
  (3) node and source have the same layout (type, ne, nb), (4) this node is the source's last
  consumer and the source has no live view. A source that is a view (offset 0) of an owned tensor
  hands over its owner's memory when that view is the owner's only live view and the owner has no
  other consumer left (the view-parent chain: reshape → rms_norm → mul runs without a new
  allocation). When the source is larger (the view-parent case), the tail is freed at once
  (free_extra_space).
  Differences from ggml, all on the safe side: an in-place handover only happens inside one buffer
  type; INPUT tensors are never taken in place; an OUTPUT *view* keeps its owner alive; the
  view-parent path is reachable (in ggml it is not: a view is never "owned"); a view whose owner
  comes later in the graph gets the owner allocated first; best fit looks across all chunks.

reserve / alloc_graph / needs_realloc follow ggml: `reserve` plans and keeps, per node and leaf
index, (buffer id, chunk, offset, size); `alloc_graph` only refills addresses from that plan (no
analysis), re-planning by itself only when there is one buffer type and the graph outgrew the plan;
`needs_realloc` says whether it did: a different node/leaf count, a tensor larger than planned, or
one that now needs memory and had none. Same-shaped graphs get identical addresses. Every address
that alloc_graph changes bumps `pyggml.tensor.placement_generation()` (backends compare it to
know, in O(1), whether a graph they prepared was placed elsewhere); refilling the same addresses
changes nothing.

Addresses. A buffer type needs `name`, `alignment` (a power of two) and `max_size` (None = no
limit); optionally `get_alloc_size(tensor)` (default `tensor.nbytes()`) and `alloc_buffer(n)`.
With `alloc_buffer`, `reserve` allocates one buffer per chunk (reallocated only when a chunk must
grow) and `alloc_graph` sets `tensor.data = base + offset` (an int) and `tensor.buffer` = that
chunk's buffer. A buffer is a numpy array or an object with an integer `base` and `n_bytes` (the
backend's Buffer). `alloc_graph(graph, buffers=...)` may instead pass memory per buffer id. Without
memory, tensors keep data None and their (buffer_id, chunk, offset) lives in the plan
(`placement(t)`, `report()`): planning-only, for `plan` / `mem` and tests.

Ops that may run in place: each kernel must accept dst == src (no restrict pointers; a row or
element is read before, or as, it is written). ggml's list restricted to our ops, plus NORM
(two passes over a row, the second reading only dst).
"""

from __future__ import annotations

import time
import weakref
from bisect import bisect_left
from dataclasses import asdict, dataclass, field

from pyggml.errors import AllocatorError, InvalidArgumentError
from pyggml.tensor import Tensor, TensorFlag
from pyggml.types import Op

INPLACE_OPS = frozenset({
    Op.ADD, Op.SUB, Op.MUL, Op.DIV,                     # element-wise binary (src1 broadcast)
    Op.SQR, Op.SQRT, Op.GELU, Op.SILU, Op.TANH,         # element-wise unary
    Op.SCALE, Op.DIAG_MASK_INF, Op.SIGMOID, Op.CLAMP,
    Op.NORM, Op.RMS_NORM,                               # per row
    Op.SOFT_MAX,                                        # per row, max/sum before the write
    Op.ROPE,                                            # per pair of elements
})

MAX_CHUNKS = 16
_UNBOUNDED = 1 << 62        # "no limit" for chunk capacities (ggml: SIZE_MAX / 2)
_INPUT = int(TensorFlag.INPUT)
_OUTPUT = int(TensorFlag.OUTPUT)

# How a tensor got its memory (TensorPlan.placed).
FRESH = "fresh"                 # a block from the buffer's allocator
INPLACE = "inplace"             # took a source's memory (the source was its last consumer)
VIEW_PARENT = "view_parent"     # took the memory of the owner of a view source
VIEW = "view"                   # a view: shares its owner's memory, allocates nothing
EXTERNAL = "external"           # had data already (weights, KV cache): not placed here


def _align(n: int, alignment: int) -> int:
    return (n + alignment - 1) & -alignment


def _human(n: int) -> str:
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= scale:
            return f"{n / scale:.2f} {unit}"
    return f"{n} B"


# ---- buffer types and memory -------------------------------------------------------------------

@dataclass(frozen=True, eq=False)
class BufferTypeSpec:
    """What the allocator needs of a buffer type, for planning without a device. The backend's
    BufferType objects can be passed instead (duck-typed: name, alignment, max_size)."""
    name: str = "cpu"
    alignment: int = 64
    max_size: int | None = None


def _alloc_compute(bt, size: int):
    """A compute buffer of `size` bytes from buffer type `bt` (BufferUsage.COMPUTE for the
    backends' buffer types; duck-typed ones, as the allocator's tests use, take a size only)."""
    from pyggml.backend.base import BufferType, BufferUsage
    if isinstance(bt, BufferType):
        return bt.alloc_buffer(size, BufferUsage.COMPUTE)
    return bt.alloc_buffer(size)


def _memory_span(mem) -> tuple[int, int]:
    """(base address, size in bytes) of a numpy array or a backend Buffer (`base`, `n_bytes`)."""
    ctypes_ = getattr(mem, "ctypes", None)
    if ctypes_ is not None and hasattr(mem, "nbytes"):        # numpy array
        return int(ctypes_.data), int(mem.nbytes)
    base, size = getattr(mem, "base", None), getattr(mem, "n_bytes", None)
    if not isinstance(base, int) or not isinstance(size, int):
        raise AllocatorError(f"cannot use {mem!r} as memory: need a numpy array or an object "
                             f"with an integer `base` address and `n_bytes`")
    return base, size


# Compute memory handed out by each GraphAllocator: id(buffer) -> (weakref to buffer, weakref to
# allocator). Only used to recognise a tensor living in another allocator's compute memory.
_compute_owner: dict[int, tuple[weakref.ref, weakref.ref]] = {}


def _register_compute(mem, owner: "GraphAllocator") -> None:
    key = id(mem)
    _compute_owner[key] = (weakref.ref(mem, lambda _r, k=key: _compute_owner.pop(k, None)),
                           weakref.ref(owner))


def _compute_owner_of(mem):
    entry = _compute_owner.get(id(mem))
    if entry is None or entry[0]() is not mem:
        return None
    return entry[1]()


# ---- one logical buffer ------------------------------------------------------------------------

class _Chunk:
    """Free blocks of one chunk (parallel lists sorted by offset) and its high-water mark."""
    __slots__ = ("offs", "sizes", "max_size")

    def __init__(self, capacity: int):
        self.offs = [0]
        self.sizes = [capacity]
        self.max_size = 0


class DynAllocator:
    """Offsets inside one logical buffer of up to `max_chunks` chunks (ggml_dyn_tallocr).

    alloc(size) -> (chunk, offset); free(chunk, offset, size). Sizes are rounded up to
    `alignment`. chunk_sizes: the high-water mark of each chunk (what to allocate)."""

    def __init__(self, alignment: int = 64, max_chunk_size: int | None = None,
                 max_chunks: int = MAX_CHUNKS):
        if alignment <= 0 or alignment & (alignment - 1):
            raise InvalidArgumentError(f"alignment must be a power of two, got {alignment!r}")
        if max_chunk_size is not None and max_chunk_size <= 0:
            raise InvalidArgumentError(f"max_chunk_size must be > 0, got {max_chunk_size!r}")
        if max_chunks < 1:
            raise InvalidArgumentError(f"max_chunks must be >= 1, got {max_chunks!r}")
        self.alignment = alignment
        self.max_chunk_size = _UNBOUNDED if max_chunk_size is None else min(max_chunk_size,
                                                                            _UNBOUNDED)
        self.max_chunks = max_chunks
        self._chunks: list[_Chunk] = []

    def reset(self) -> None:
        self._chunks = []

    @property
    def n_chunks(self) -> int:
        return len(self._chunks)

    @property
    def chunk_sizes(self) -> list[int]:
        return [c.max_size for c in self._chunks]

    @property
    def size(self) -> int:
        return sum(c.max_size for c in self._chunks)

    def free_blocks(self, chunk: int) -> list[tuple[int, int]]:
        """(offset, size) of the chunk's free blocks; the last one reaches the chunk's capacity."""
        c = self._chunks[chunk]
        return list(zip(c.offs, c.sizes))

    def alloc(self, size: int) -> tuple[int, int]:
        size = _align(size, self.alignment)
        chunks = self._chunks
        best_c = best_i = -1
        # 1. best fit among blocks that are not the last of their chunk (ties: the later block)
        best_size = _UNBOUNDED << 2
        for c, ch in enumerate(chunks):
            sizes = ch.sizes
            for i in range(len(sizes) - 1):
                s = sizes[i]
                if size <= s <= best_size:
                    best_c, best_i, best_size = c, i, s
        # 2. the last block of a chunk, by reuse factor = high-water - block offset - size:
        #    < 0 the chunk grows by that much, >= 0 that much of its used part stays idle.
        #    Prefer the least growth while all grow, else the least idle memory.
        if best_c < 0:
            best_reuse = None
            for c, ch in enumerate(chunks):
                if not ch.sizes or ch.sizes[-1] < size:
                    continue
                reuse = ch.max_size - ch.offs[-1] - size
                if (best_reuse is None or (best_reuse < 0 and reuse > best_reuse)
                        or 0 <= reuse < best_reuse):
                    best_c, best_i, best_reuse = c, len(ch.sizes) - 1, reuse
        # 3. a new chunk: max_chunk_size, or the request if larger; the last one is unbounded
        if best_c < 0:
            if len(chunks) >= self.max_chunks:   # unreachable: the last chunk is unbounded
                raise AllocatorError(f"no room for {size} bytes in {len(chunks)} chunks")
            last = len(chunks) == self.max_chunks - 1
            chunks.append(_Chunk(_UNBOUNDED if last else max(size, self.max_chunk_size)))
            best_c, best_i = len(chunks) - 1, 0
        ch = chunks[best_c]
        off = ch.offs[best_i]
        rest = ch.sizes[best_i] - size
        if rest:
            ch.offs[best_i] = off + size
            ch.sizes[best_i] = rest
        else:
            del ch.offs[best_i], ch.sizes[best_i]
        if off + size > ch.max_size:
            ch.max_size = off + size
        return best_c, off

    def free(self, chunk: int, offset: int, size: int) -> None:
        size = _align(size, self.alignment)
        if size == 0:
            return
        ch = self._chunks[chunk]
        offs, sizes = ch.offs, ch.sizes
        i = bisect_left(offs, offset)
        overlaps_next = i < len(offs) and offs[i] < offset + size
        overlaps_prev = i > 0 and offs[i - 1] + sizes[i - 1] > offset
        if overlaps_next or overlaps_prev:
            raise AllocatorError(f"freeing bytes [{offset}, {offset + size}) of chunk {chunk} "
                                 f"that are already free")
        joins_prev = i > 0 and offs[i - 1] + sizes[i - 1] == offset
        joins_next = i < len(offs) and offset + size == offs[i]
        if joins_prev and joins_next:
            sizes[i - 1] += size + sizes[i]
            del offs[i], sizes[i]
        elif joins_prev:
            sizes[i - 1] += size
        elif joins_next:
            offs[i] = offset
            sizes[i] += size
        else:
            offs.insert(i, offset)
            sizes.insert(i, size)


# ---- the plan report ---------------------------------------------------------------------------

@dataclass
class TensorPlan:
    """Where one tensor of the graph lives. Offsets are inside the chunk; -1 when not placed here.

    first: node index at which its memory was taken (-1: before the first node: leafs, inputs).
        For a view: the index of the view node (-1 for a leaf).
    last: node index after which its memory was given back or handed to an in-place consumer;
        for a view, its last consumer; None = held to the end (outputs, owners of live views,
        tensors nobody consumes) or never placed.
    placed: fresh | inplace | view_parent | view | external.
    parent: inplace: the source whose memory it took; view_parent: the view's owner whose memory
        it took; view: the tensor owning the bytes."""
    name: str
    role: str               # "leaf" | "node"
    index: int              # in graph.leafs or graph.nodes
    op: str
    buffer_id: int
    chunk: int
    offset: int
    size: int               # bytes the tensor needs (a view: the bytes it spans)
    first: int
    last: int | None
    placed: str
    parent: str | None = None
    flags: int = 0


@dataclass
class BufferPlan:
    """One buffer id. peak: bytes to allocate (sum of the chunks' high-water marks); naive: sum of
    the aligned sizes of every tensor placed in it, as if nothing were ever reused;
    peak_no_inplace: the peak when no op runs in place (None if not computed);
    live_bytes[i + 1]: aligned bytes held while node i runs ([0]: before the first node), and
    max_live its maximum: a lower bound for any placement of these lifetimes (peak / max_live is
    the cost of fragmentation). An id whose buffer type appeared under an earlier id shares that
    id's memory: `shares` names it and the numbers are counted there (0 here)."""
    buffer_id: int
    name: str
    alignment: int
    max_size: int | None
    shares: int | None
    chunk_sizes: list[int]
    peak: int
    naive: int
    peak_no_inplace: int | None
    max_live: int = 0
    n_fresh: int = 0
    n_inplace: int = 0
    n_view_parent: int = 0
    live_bytes: list[int] = field(default_factory=list, repr=False)


@dataclass
class PlanReport:
    """The plan of the last `reserve`, as plain data (`to_dict()` gives JSON-ready dicts).
    tensors: the graph's leafs (in order) then its nodes."""
    n_nodes: int
    n_leafs: int
    plan_seconds: float
    buffers: list[BufferPlan]
    tensors: list[TensorPlan] = field(repr=False)

    @property
    def peak(self) -> int:
        return sum(b.peak for b in self.buffers)

    @property
    def naive(self) -> int:
        return sum(b.naive for b in self.buffers)

    def tensor(self, name: str) -> TensorPlan:
        for p in self.tensors:
            if p.name == name:
                return p
        raise AllocatorError(f"no tensor named {name!r} in this plan ({len(self.tensors)} "
                             f"tensors)")

    def to_dict(self) -> dict:
        return asdict(self)

    def summary(self) -> str:
        mib = _human
        lines = [f"plan of {self.n_nodes} nodes, {self.n_leafs} leafs in "
                 f"{self.plan_seconds * 1e3:.1f} ms"]
        for b in self.buffers:
            if b.shares is not None:
                lines.append(f"  buffer {b.buffer_id} '{b.name}': shares buffer {b.shares}")
                continue
            ratio = f"{b.naive / b.peak:.1f}x" if b.peak else "-"
            no_inp = "" if b.peak_no_inplace is None else \
                f", {mib(b.peak_no_inplace)} without in-place reuse"
            lines.append(f"  buffer {b.buffer_id} '{b.name}': {mib(b.peak)} in "
                         f"{len(b.chunk_sizes)} chunk(s) (lifetimes alone: {mib(b.max_live)}), "
                         f"naive {mib(b.naive)} ({ratio}){no_inp}; "
                         f"{b.n_fresh} fresh, {b.n_inplace} in place, "
                         f"{b.n_view_parent} through a view")
        return "\n".join(lines)


# ---- the graph allocator -----------------------------------------------------------------------

class _State:
    """Per-tensor planning state (ggml's hash_node) plus what the report needs."""
    __slots__ = ("t", "home", "n_children", "n_views", "bid", "chunk", "offset", "size",
                 "allocated", "external", "pinned", "placed", "parent", "first", "last",
                 "handed")

    def __init__(self, t: Tensor, home: int, external: bool):
        self.t = t
        self.home = home            # the buffer id the caller assigned
        self.n_children = 0
        self.n_views = 0
        self.bid = -1
        self.chunk = -1
        self.offset = -1
        self.size = 0
        self.allocated = False      # holds memory from this allocator right now
        self.external = external
        self.pinned = False         # an output, or the owner of an output view: never freed
        self.placed = EXTERNAL if external else None
        self.parent = None
        self.first = -1
        self.last = None
        self.handed = False         # its memory went to an in-place consumer at `last`


class GraphAllocator:
    """Plans (and optionally backs with memory) the tensors of graphs, one logical buffer per
    buffer type (ggml_gallocr). buffer_types: one or a list; the same object listed twice shares
    one buffer. See the module docstring for the algorithm and the address contract."""

    def __init__(self, buffer_types):
        if not isinstance(buffer_types, (list, tuple)):
            buffer_types = [buffer_types]
        if not buffer_types:
            raise AllocatorError("GraphAllocator needs at least one buffer type")
        self.buffer_types = list(buffer_types)
        self.n_buffers = len(self.buffer_types)
        # one DynAllocator per distinct buffer type object; _slot[bid] indexes it
        self._slot: list[int] = []
        self._first_bid: list[int] = []
        for bid, bt in enumerate(self.buffer_types):
            for other, obt in enumerate(self.buffer_types[:bid]):
                if obt is bt:
                    self._slot.append(self._slot[other])
                    break
            else:
                for attr in ("name", "alignment", "max_size"):
                    if not hasattr(bt, attr):
                        raise AllocatorError(f"buffer type {bt!r} (buffer {bid}) has no "
                                             f"`{attr}`")
                self._slot.append(len(self._first_bid))
                self._first_bid.append(bid)
        self._size_fns = [getattr(bt, "get_alloc_size", None) or Tensor.nbytes
                          for bt in self.buffer_types]
        self._tallocs = self._new_tallocs()
        # per distinct buffer type: [(memory, base address, size)] per chunk, or None
        self._memory: list[list | None] = [None] * len(self._first_bid)
        self._node_allocs: list = []
        self._node_src_allocs: list = []
        self._leaf_allocs: list = []
        self._planned = False
        self._last: tuple | None = None      # (graph, node_ids, leaf_ids, states) of reserve
        self._current: list | None = None    # [graph of the last alloc_graph, position index]
        self.plan_seconds = 0.0

    def _new_tallocs(self) -> list[DynAllocator]:
        out = []
        for bid in self._first_bid:
            bt = self.buffer_types[bid]
            out.append(DynAllocator(int(bt.alignment), bt.max_size))
        return out

    # ---- inputs ------------------------------------------------------------------------------
    def _buffer_ids(self, ids, tensors, what: str) -> list[int]:
        if ids is None:
            return [0] * len(tensors)
        ids = list(ids)
        if len(ids) != len(tensors):
            raise AllocatorError(f"{what}_buffer_ids has {len(ids)} entries, the graph has "
                                 f"{len(tensors)} {what}s")
        n = self.n_buffers
        for i, b in enumerate(ids):
            if not isinstance(b, int) or not 0 <= b < n:
                t = tensors[i]
                raise AllocatorError(f"{what} {i} '{t.name}' has buffer id {b!r}, but the "
                                     f"allocator has {n} buffer type(s) (ids 0..{n - 1})")
        return ids

    def _is_external(self, t: Tensor) -> bool:
        """Whether t's memory comes from elsewhere; raises for another allocator's memory."""
        buf = t.buffer
        if buf is None:
            return t.data is not None
        owner = _compute_owner_of(buf)
        if owner is None:
            return True
        if owner is self:
            return False     # placed by an earlier plan of ours: planned again
        raise AllocatorError(f"tensor '{t.name}' ({t.op.name}) lives in the compute buffer of "
                             f"another graph allocator; that memory is reused by that allocator's "
                             f"graphs. Copy it into its own buffer (or recompute it) instead")

    # ---- planning ----------------------------------------------------------------------------
    def _plan(self, graph, node_ids, leaf_ids, tallocs, inplace: bool) -> dict[int, _State]:
        nodes, leafs = graph.nodes, graph.leafs
        st: dict[int, _State] = {}
        is_external = self._is_external
        for i, t in enumerate(leafs):
            st[id(t)] = _State(t, leaf_ids[i], is_external(t))
        for i, t in enumerate(nodes):
            st[id(t)] = _State(t, node_ids[i], is_external(t))
        for t in (*leafs, *nodes):
            vs = t.view_src
            if vs is not None:                      # count views (ggml: phase 2)
                vss = st.get(id(vs))
                if vss is not None:
                    vss.n_views += 1
                elif not is_external(vs):
                    raise AllocatorError(
                        f"view '{t.name}' ({t.op.name}) shares the memory of '{vs.name}', which "
                        f"is not in this graph and has no memory of its own")
            if t.flags & _OUTPUT:
                owner = st.get(id(vs if vs is not None else t))
                if owner is not None:
                    owner.pinned = True

        size_fns = self._size_fns
        slot = self._slot

        def allocate(s: _State, bid: int, step: int) -> None:
            if s.placed is not None or s.t.view_src is not None:
                return
            t = s.t
            size = size_fns[bid](t)
            s.allocated = True
            s.first = step
            if inplace and t.op in INPLACE_OPS:
                talloc = tallocs[slot[bid]]
                for p in t.src:
                    if p is None:
                        continue
                    ps = st[id(p)]
                    if ps.n_children != 1 or ps.n_views:          # (4) last consumer, no views
                        continue
                    vs = p.view_src
                    owner = ps if vs is None else st.get(id(vs))
                    if owner is None or not owner.allocated:      # (1) owned, still allocated
                        continue
                    if owner.pinned or owner.t.flags & _INPUT:    # (2) not an output or input
                        continue
                    if not t.same_layout(p):                      # (3) same layout
                        continue
                    if tallocs[slot[owner.bid]] is not talloc or size > owner.size:
                        continue
                    if vs is not None and (owner.n_views != 1 or owner.n_children
                                           or p.view_offs):
                        continue                                  # the view-parent chain
                    s.bid, s.chunk, s.offset, s.size = owner.bid, owner.chunk, owner.offset, size
                    s.placed = INPLACE if vs is None else VIEW_PARENT
                    s.parent = owner.t.name
                    owner.allocated = False
                    owner.last = step
                    owner.handed = True
                    extra = _align(owner.size, talloc.alignment) - _align(size, talloc.alignment)
                    if extra > 0:                                 # free_extra_space
                        talloc.free(owner.chunk, owner.offset + _align(size, talloc.alignment),
                                    extra)
                    return
            s.bid, s.size, s.placed = bid, size, FRESH
            s.chunk, s.offset = tallocs[slot[bid]].alloc(size)

        def free(s: _State, step: int) -> None:
            if s.pinned:
                return
            tallocs[slot[s.bid]].free(s.chunk, s.offset, s.size)
            s.allocated = False
            s.last = step

        # 1. leafs first (weights are external and skipped)
        for i, t in enumerate(leafs):
            allocate(st[id(t)], leaf_ids[i], -1)
        # 2. count children (views are counted above); inputs next
        for i, t in enumerate(nodes):
            if t.flags & _INPUT:
                allocate(st[id(t)], node_ids[i], -1)
            for p in t.src:
                if p is None:
                    continue
                ps = st.get(id(p))
                if ps is None:
                    raise AllocatorError(f"node '{t.name}' ({t.op.name}) has a source '{p.name}' "
                                         f"that is not in the graph (built after "
                                         f"build_forward_expand?)")
                ps.n_children += 1
                if p.flags & _INPUT:
                    allocate(ps, node_ids[i], -1)
        # 3. in execution order: allocate, then free what this node consumed for the last time
        for i, t in enumerate(nodes):
            s = st[id(t)]
            for p in t.src:
                if p is not None:
                    ps = st[id(p)]
                    allocate(ps, ps.home, i)
            vs = t.view_src
            if vs is not None:
                s.placed, s.parent, s.first = VIEW, vs.name, i
                vss = st.get(id(vs))
                if vss is not None:
                    allocate(vss, vss.home, i)
            else:
                allocate(s, node_ids[i], i)
            for p in t.src:
                if p is None:
                    continue
                ps = st[id(p)]
                ps.n_children -= 1
                if ps.n_children or ps.n_views:
                    continue
                vs = p.view_src
                if vs is not None:
                    ps.last = i
                    vss = st.get(id(vs))
                    if vss is not None:
                        vss.n_views -= 1
                        if not vss.n_views and not vss.n_children and vss.allocated:
                            free(vss, i)
                elif ps.allocated:
                    free(ps, i)
        for t in leafs:
            if t.view_src is not None:
                s = st[id(t)]
                s.placed, s.parent = VIEW, t.view_src.name
        return st

    def reserve(self, graph, node_buffer_ids=None, leaf_buffer_ids=None) -> None:
        """Plan `graph` (node_buffer_ids[i]: buffer id of graph.nodes[i]; likewise for leafs;
        default all 0), keep the plan for alloc_graph, and (re)allocate memory for buffer types
        that have `alloc_buffer` when a chunk must grow. Memory never shrinks."""
        t0 = time.perf_counter()
        node_ids = self._buffer_ids(node_buffer_ids, graph.nodes, "node")
        leaf_ids = self._buffer_ids(leaf_buffer_ids, graph.leafs, "leaf")
        for ta in self._tallocs:
            ta.reset()
        st = self._plan(graph, node_ids, leaf_ids, self._tallocs, inplace=True)

        def entry(t):
            s = st[id(t)]
            if s.placed in (FRESH, INPLACE, VIEW_PARENT):
                return (s.bid, s.chunk, s.offset, s.size)
            return None

        self._node_allocs = [entry(t) for t in graph.nodes]
        self._leaf_allocs = [entry(t) for t in graph.leafs]
        self._node_src_allocs = [tuple(None if p is None else entry(p) for p in t.src)
                                 for t in graph.nodes]
        self._planned = True
        self._last = (graph, node_ids, leaf_ids, st)
        self._grow_memory()
        self.plan_seconds = time.perf_counter() - t0

    def reserve_size(self, graph, node_buffer_ids=None, leaf_buffer_ids=None) -> list[int]:
        """Bytes each buffer id would need for `graph` (0 for an id sharing an earlier id's
        buffer type). Plans on the side: the kept plan and memory are not touched."""
        node_ids = self._buffer_ids(node_buffer_ids, graph.nodes, "node")
        leaf_ids = self._buffer_ids(leaf_buffer_ids, graph.leafs, "leaf")
        tallocs = self._new_tallocs()
        self._plan(graph, node_ids, leaf_ids, tallocs, inplace=True)
        return [tallocs[self._slot[b]].size if self._first_bid[self._slot[b]] == b else 0
                for b in range(self.n_buffers)]

    def _grow_memory(self) -> None:
        for k, ta in enumerate(self._tallocs):
            bt = self.buffer_types[self._first_bid[k]]
            alloc_buffer = getattr(bt, "alloc_buffer", None)
            if alloc_buffer is None:
                continue
            want = ta.chunk_sizes
            have = self._memory[k]
            if have is not None and len(have) >= len(want) and all(
                    h[2] >= w for h, w in zip(have, want)):
                continue
            chunks = []
            for size in want:
                mem = _alloc_compute(bt, size)
                base, got = _memory_span(mem)
                if got < size or base % ta.alignment:
                    raise AllocatorError(f"buffer type '{bt.name}' returned {got} bytes at "
                                         f"{base:#x} for a request of {size} bytes aligned to "
                                         f"{ta.alignment}")
                _register_compute(mem, self)
                chunks.append((mem, base, got))
            self._memory[k] = chunks

    # ---- reuse of the plan -------------------------------------------------------------------
    def _realloc_reason(self, graph) -> str | None:
        if not self._planned:
            return "no plan yet"
        if len(graph.nodes) != len(self._node_allocs):
            return f"the graph has {len(graph.nodes)} nodes, the plan {len(self._node_allocs)}"
        if len(graph.leafs) != len(self._leaf_allocs):
            return f"the graph has {len(graph.leafs)} leafs, the plan {len(self._leaf_allocs)}"
        size_fns = self._size_fns

        def fits(t, a) -> str | None:
            if t.data is not None or t.view_src is not None or t.buffer is not None:
                return None
            if a is None:
                return f"'{t.name}' needs memory but was planned without"
            need = size_fns[a[0]](t)
            if need > a[3]:
                return f"'{t.name}' needs {need} bytes, the plan holds {a[3]}"
            return None

        for t, a in zip(graph.leafs, self._leaf_allocs):
            why = fits(t, a)
            if why:
                return "leaf " + why
        for t, a, srcs in zip(graph.nodes, self._node_allocs, self._node_src_allocs):
            why = fits(t, a)
            if why:
                return "node " + why
            for j, p in enumerate(t.src):
                if p is not None:
                    why = fits(p, srcs[j] if j < len(srcs) else None)
                    if why:
                        return f"source {j} of '{t.name}' {why}"
        return None

    def needs_realloc(self, graph) -> bool:
        """True when alloc_graph could not reuse the kept plan for `graph`."""
        return self._realloc_reason(graph) is not None

    def _chunk_memory(self, buffers) -> list[list | None]:
        """Per buffer id: [(memory, base, size)] per chunk, or None (planning only). Ids that
        share a buffer type share its memory."""
        per_slot = list(self._memory)
        if buffers is not None:
            buffers = list(buffers)
            if len(buffers) != self.n_buffers:
                raise AllocatorError(f"alloc_graph got memory for {len(buffers)} buffers, the "
                                     f"allocator has {self.n_buffers}")
            given_for: dict[int, int] = {}
            for b, given in enumerate(buffers):
                if given is None:
                    continue
                k = self._slot[b]
                if k in given_for and buffers[given_for[k]] is not given:
                    raise AllocatorError(f"buffers {given_for[k]} and {b} share a buffer type "
                                         f"but were given different memory")
                given_for[k] = b
                ta = self._tallocs[k]
                mems = list(given) if isinstance(given, (list, tuple)) else [given]
                if len(mems) < ta.n_chunks:
                    raise AllocatorError(f"buffer {b} '{self.buffer_types[b].name}' is planned "
                                         f"in {ta.n_chunks} chunks, got memory for {len(mems)}")
                chunks = []
                for c, mem in enumerate(mems[:ta.n_chunks]):
                    base, size = _memory_span(mem)
                    need = ta.chunk_sizes[c]
                    if size < need or base % ta.alignment:
                        raise AllocatorError(f"buffer {b} chunk {c}: {size} bytes at {base:#x}, "
                                             f"the plan needs {need} bytes aligned to "
                                             f"{ta.alignment}")
                    _register_compute(mem, self)
                    chunks.append((mem, base, size))
                per_slot[k] = chunks
        return [per_slot[self._slot[b]] for b in range(self.n_buffers)]

    def alloc_graph(self, graph, buffers=None) -> None:
        """Give the graph's tensors the addresses of the kept plan (see the module docstring).

        Re-plans first when needs_realloc(graph) and there is a single buffer type; with several
        it raises AllocatorError (call reserve with the buffer ids). buffers: optional memory per
        buffer id (None = the reserved memory): a numpy array / Buffer, or a list, one per chunk.
        Without memory, addresses stay in the plan (placement(t)) and data stays None."""
        why = self._realloc_reason(graph)
        if why is not None:
            if self.n_buffers != 1:
                raise AllocatorError(f"the graph does not fit the plan ({why}); a plan over "
                                     f"{self.n_buffers} buffers is not redone automatically: "
                                     f"call reserve(graph, node_buffer_ids, leaf_buffer_ids)")
            self.reserve(graph)
        mem = self._chunk_memory(buffers)
        self._current = [graph, None]
        views = []
        for tensors, allocs in ((graph.leafs, self._leaf_allocs), (graph.nodes, self._node_allocs)):
            for t, a in zip(tensors, allocs):
                buf = t.buffer
                owner = None if buf is None else _compute_owner_of(buf)
                if owner is not None and owner is not self:
                    self._is_external(t)          # raises, naming the tensor
                if t.view_src is not None:
                    views.append(t)
                elif a is not None and (t.data is None or owner is self):
                    chunks = mem[a[0]]
                    if chunks is not None:
                        m, base, _ = chunks[a[1]]
                        t.data = base + a[2]
                        t.buffer = m
        for t in views:
            vs = t.view_src
            if vs.data is not None and (t.buffer is None or _compute_owner_of(t.buffer) is self):
                t.data = vs.data + t.view_offs
                t.buffer = vs.buffer

    # ---- queries -----------------------------------------------------------------------------
    def get_buffer_size(self, buffer_id: int) -> int:
        """Bytes of that buffer: its memory if allocated, else the planned peak; 0 for an id that
        shares an earlier id's buffer type."""
        if not isinstance(buffer_id, int) or not 0 <= buffer_id < self.n_buffers:
            raise AllocatorError(f"buffer id {buffer_id!r} out of range 0..{self.n_buffers - 1}")
        k = self._slot[buffer_id]
        if self._first_bid[k] != buffer_id:
            return 0
        if self._memory[k] is not None:
            return sum(size for _, _, size in self._memory[k])
        return self._tallocs[k].size

    def chunk_sizes(self, buffer_id: int) -> list[int]:
        """Planned high-water mark of each chunk of that buffer."""
        self.get_buffer_size(buffer_id)     # range check
        return self._tallocs[self._slot[buffer_id]].chunk_sizes

    def memory_ranges(self, buffer_id: int) -> list[tuple[int, int]]:
        """(base address, bytes) of the memory backing each chunk of that buffer; [] when it has
        none (planning only, or not reserved yet). Memory profilers use it."""
        self.get_buffer_size(buffer_id)     # range check
        mem = self._memory[self._slot[buffer_id]]
        return [] if mem is None else [(base, size) for _, base, size in mem]

    def placement(self, t: Tensor) -> tuple[int, int, int] | None:
        """(buffer_id, chunk, offset) of a tensor of the last reserved graph, or of the graph
        last given to alloc_graph (same positions); a view: its owner's place plus view_offs.
        None when it is not placed here (external data)."""
        if self._last is None:
            raise AllocatorError("no plan yet: call reserve first")
        st = self._last[3]
        s = st.get(id(t))
        if s is None or s.t is not t:
            found = self._placement_by_position(t)
            if found is not False:
                return found
            if t.data is not None or t.buffer is not None:
                return None          # external memory outside the graph (e.g. a KV cache)
            raise AllocatorError(f"tensor '{t.name}' is in neither the reserved graph nor the "
                                 f"one last allocated")
        off = 0
        if t.view_src is not None:
            off = t.view_offs
            s = st.get(id(t.view_src))
            if s is None:
                return None
        if s.placed not in (FRESH, INPLACE, VIEW_PARENT):
            return None
        return (s.bid, s.chunk, s.offset + off)

    def _placement_by_position(self, t: Tensor):
        """placement() in the graph of the last alloc_graph; False if t is not in it."""
        if self._current is None or self._current[0] is self._last[0]:
            return False
        graph, index = self._current
        if index is None:
            index = {id(x): (self._leaf_allocs, i) for i, x in enumerate(graph.leafs)}
            index.update({id(x): (self._node_allocs, i) for i, x in enumerate(graph.nodes)})
            self._current[1] = index
        if id(t) not in index:
            return False
        off = 0
        if t.view_src is not None:
            off, t = t.view_offs, t.view_src
        pos = index.get(id(t))
        a = None if pos is None else pos[0][pos[1]]
        return None if a is None else (a[0], a[1], a[2] + off)

    def report(self, with_no_inplace: bool = True) -> PlanReport:
        """The plan of the last reserve as a PlanReport. with_no_inplace: also plan the graph
        once more with in-place reuse off, for BufferPlan.peak_no_inplace."""
        if self._last is None:
            raise AllocatorError("no plan yet: call reserve first")
        graph, node_ids, leaf_ids, st = self._last
        no_inplace = None
        if with_no_inplace:
            tallocs = self._new_tallocs()
            self._plan(graph, node_ids, leaf_ids, tallocs, inplace=False)
            no_inplace = [ta.size for ta in tallocs]
        tensors = []
        n = len(graph.nodes)
        naive = [0] * len(self._tallocs)
        counts = [[0, 0, 0] for _ in self._tallocs]
        delta = [[0] * (n + 2) for _ in self._tallocs]    # difference arrays of live bytes
        kinds = {FRESH: 0, INPLACE: 1, VIEW_PARENT: 2}
        for role, seq in (("leaf", graph.leafs), ("node", graph.nodes)):
            for i, t in enumerate(seq):
                s = st[id(t)]
                bid, chunk, off, size = s.bid, s.chunk, s.offset, s.size
                if s.placed == VIEW:
                    o = st.get(id(t.view_src))
                    size = t.nbytes()
                    if o is not None and o.placed in kinds:
                        bid, chunk, off = o.bid, o.chunk, o.offset + t.view_offs
                elif s.placed in kinds:
                    k = self._slot[bid]
                    aligned = _align(size, self._tallocs[k].alignment)
                    naive[k] += aligned
                    counts[k][kinds[s.placed]] += 1
                    end = n - 1 if s.last is None else s.last - s.handed   # inclusive
                    if end >= s.first:
                        delta[k][s.first + 1] += aligned
                        delta[k][end + 2] -= aligned
                else:
                    size = t.nbytes()
                tensors.append(TensorPlan(t.name, role, i, t.op.name, bid, chunk, off, size,
                                          s.first, s.last, s.placed, s.parent, int(t.flags)))
        buffers = []
        for b, bt in enumerate(self.buffer_types):
            k = self._slot[b]
            first = self._first_bid[k]
            if first != b:
                buffers.append(BufferPlan(b, bt.name, int(bt.alignment), bt.max_size, first, [],
                                          0, 0, 0 if no_inplace else None))
                continue
            ta = self._tallocs[k]
            live, acc = [], 0
            for d in delta[k][:n + 1]:
                acc += d
                live.append(acc)
            buffers.append(BufferPlan(b, bt.name, int(bt.alignment), bt.max_size, None,
                                      ta.chunk_sizes, ta.size, naive[k],
                                      None if no_inplace is None else no_inplace[k],
                                      max(live), *counts[k], live_bytes=live))
        return PlanReport(len(graph.nodes), len(graph.leafs), self.plan_seconds, buffers, tensors)

