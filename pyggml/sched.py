"""Scheduler: one graph over several backends (ggml_backend_sched).

`Scheduler(backends)` takes backends in priority order, the CPU last. For each graph it decides
where every node runs (five passes), cuts the node list into splits (consecutive nodes on one
backend, one `graph_compute` call each), adds a copy for every input a split cannot read where
it lives, plans all memory with one GraphAllocator (one buffer per backend buffer type), and runs
the splits with ggml's synchronisation rules.

Passes (docs/ARCHITECTURE.md, "The scheduler"). Every assignment records a cause:

    usr     set_tensor_backend
    1.dst   the tensor (or the memory it views) is already in a buffer: the highest-priority
            backend that supports that buffer type and the op
    1.vsrc  same, from the view source's buffer
    1.inp   a graph input (INPUT flag): the last backend (CPU), where the user writes it
    1.wgt<j> source j is a weight (buffer usage WEIGHTS): run where the weight is (not for
            ROPE / FLASH_ATTN_EXT, whose small extra tensors must not decide)
    1.off   the weight is in host memory but a higher-priority backend supports the op and
            wants it (offload_op; only with op_offload=True)
    2.gd 2.gu 2.rd 2.ru   expansion to unassigned neighbours (ggml tags all four "2.sup"):
            gpu-down / gpu-up (non-CPU assignments spread down, then up, CPU ones stop them),
            rest-down / rest-up (every assignment spreads); only where the backend supports the
            op, view ops are skipped
    3.upg   moved to a higher-priority backend with the same buffer type that supports the op
            and can read every source in place (user assignments are never moved)
    3.best  still unassigned: the backend supporting the op with the most sources in memory it
            can read
    4.vsrc  a view goes where its source's memory is (also an in-place op whose backend cannot
            reach that memory)
    4.cur   an unassigned source goes to its consumer's backend
    4.sup   still unassigned: the first backend that supports it (ggml tags it "2.sup")
    4.leaf  a leaf no node consumes: the last backend
    4.cpy   a copy of a split input, made by the scheduler

Pass 5 cuts a new split where the backend changes, or where (same backend, the split already has
inputs) a node's weight sits on another backend whose memory this one cannot read: starting over
lets the previous split's copied weights be freed (the weight-incompatibility cut). View ops never
start a split. A source whose backend differs and whose memory the split's backend cannot read is
a split input: it gets one copy per (backend, copy index) and the node's `src[j]` is rewired to
that copy (as ggml does; `reset()` restores every rewired source). A copy is made once per
backend and graph: a later split on the same backend reads the same copy.

compute_splits, per split in order: (1) a split without inputs on another backend than the
previous one first waits for the previous backend (the allocator may have reused memory across
splits); (2) inputs are copied, host weights last: a user input (INPUT flag) after waiting for the
split's backend (the user may overwrite it next), any other after waiting for the split's backend
to finish with the copy and for the input's backend to finish producing it (an event instead of a
full synchronize where the backend has events); (3) `backend.graph_compute(split.graph)`; (4) the
backend's event for the current copy is recorded.

n_copies > 1 (pipeline parallelism): split inputs and graph inputs get n_copies tensors each, all
pinned (INPUT|OUTPUT); `alloc_graph` rotates the copy index, so consecutive batches write their
inputs into different memory while the previous batch may still run on another device. The user
keeps writing its input tensor: the allocator gives it the memory of the current copy.

Events are made (event_new) only with n_copies > 1, as in ggml; otherwise the scheduler calls
`synchronize()` where the rules above wait.

Differences from ggml, all on the safe side: pass 4 gives a node its fallback backend before
giving its unassigned sources the node's backend (ggml does the sources first and can leave them
unassigned); a node sharing another tensor's memory (a view, an in-place op) is moved to where
that memory is when its backend cannot reach it (4.vsrc), and a user pin that would compute there
is an error; pass 3 never moves a user pin; no cap on split inputs; alloc_graph and a compute of
another graph reset by themselves. A graph belongs to one scheduler at a time (sources are
rewired until reset).

Reuse: `graph_compute(g)` on the graph last allocated (same object, same uid) only runs
compute_splits: no passes, no planning, the same split Graph objects (so backends replay what
they prepared: the CPU its marshalled node array). `alloc_graph` (or a compute of another graph)
splits again and makes new split graphs, with new uids.

PYGGML_SCHED_DEBUG=1 prints the splits and their inputs after each split; =2 also every node
with its backend and cause (pyggml.settings, read when the Scheduler is made; `debug=`
overrides it).
"""

from __future__ import annotations

import sys
from collections import OrderedDict
from dataclasses import dataclass

from pyggml import settings
from pyggml.alloc import GraphAllocator, _compute_owner_of
from pyggml.backend.base import (
    Backend,
    BufferUsage,
    DeviceType,
    buffer_usage,
    is_host_buffer,
    tensor_copy,
)
from pyggml.errors import SchedulerError, UnsupportedOpError
from pyggml.graph import Graph
from pyggml.tensor import Tensor, TensorFlag
from pyggml.types import VIEW_OPS, Op

MAX_BACKENDS = 16
MAX_COPIES = 4
DEFAULT_GRAPH_SIZE = 8192           # most nodes + leafs of one graph

_INPUT = int(TensorFlag.INPUT)
_OUTPUT = int(TensorFlag.OUTPUT)
_WEIGHTS = BufferUsage.WEIGHTS
_SMALL_EXTRA_SRC_OPS = frozenset({Op.ROPE, Op.FLASH_ATTN_EXT})
_HOST = object()                    # "host memory without a Buffer object" (a Context arena)


@dataclass(frozen=True)
class Assignment:
    """Where a tensor runs (or lives) and why. backend: index in Scheduler.backends."""
    backend: int
    backend_name: str
    cause: str


_UNBUILT = object()


class Split:
    """Consecutive nodes [i_start, i_end) of the graph computed by one backend in one call.

    inputs: tensors (as in the user's graph) living where this backend cannot read them, copied
    in before the split runs; graph: a Graph whose nodes are the split's nodes and whose leafs are
    the current copies of the inputs; the scheduler keeps it (same object, same uid) until it
    splits again. copy_plan: (input, copy, input backend id, is a user input) in copy order;
    copier: the backend's compile_input_copies of it (None: copied one by one), built at the
    split's first compute (a new split is a new Split: the addresses it holds stay valid)."""

    __slots__ = ("index", "backend_id", "i_start", "i_end", "inputs", "graph", "copy_plan",
                 "copier", "_views")

    def __init__(self, index: int, backend_id: int, i_start: int):
        self.index = index
        self.backend_id = backend_id
        self.i_start = i_start
        self.i_end = i_start
        self.inputs: list[Tensor] = []
        self.graph: Graph | None = None
        self.copy_plan: list[tuple] = []
        self.copier = _UNBUILT        # the backend's compile_input_copies, built at first compute
        self._views: dict[tuple[int, int], Graph] = {}

    @property
    def n_inputs(self) -> int:
        return len(self.inputs)

    def __repr__(self) -> str:
        names = ", ".join(t.name for t in self.inputs)
        return (f"Split(#{self.index}, backend={self.backend_id}, nodes=[{self.i_start}, "
                f"{self.i_end}), inputs=[{names}])")


def _size(n: int) -> str:
    return f"{n >> 20}M" if n >= 1 << 20 else f"{n >> 10}K" if n >= 1 << 10 else f"{n}B"


class Scheduler:
    """Schedules graphs over `backends` (priority order, CPU last). See the module docstring.

    bufts: the buffer type of each backend's compute memory (default: each backend's default).
    n_copies: 1..MAX_COPIES copies of inputs for pipeline parallelism. op_offload: allow 1.off.
    graph_size: the most nodes + leafs of a graph. debug: 0/1/2 (None: PYGGML_SCHED_DEBUG).
    trace: set to a list to record what compute_splits does (tests); None costs nothing."""

    def __init__(self, backends, *, n_copies: int = 1, op_offload: bool = True,
                 graph_size: int = DEFAULT_GRAPH_SIZE, bufts=None, debug: int | None = None):
        backends = list(backends)
        if not backends:
            raise SchedulerError("Scheduler needs at least one backend (the CPU, last)")
        if len(backends) > MAX_BACKENDS:
            raise SchedulerError(f"Scheduler got {len(backends)} backends; at most "
                                 f"{MAX_BACKENDS} are supported")
        for i, b in enumerate(backends):
            if not isinstance(b, Backend):
                raise SchedulerError(f"backend {i} is {b!r}, not a pyggml Backend")
            if any(b is o for o in backends[:i]):
                raise SchedulerError(f"backend '{b.name}' is listed twice")
        dev = getattr(backends[-1], "device", None)
        if dev is None or dev.type != DeviceType.CPU:
            names = ", ".join(b.name for b in backends)
            raise SchedulerError(f"the last backend must be the CPU (it takes graph inputs and "
                                 f"anything no other backend can run); got [{names}]")
        if not isinstance(n_copies, int) or not 1 <= n_copies <= MAX_COPIES:
            raise SchedulerError(f"n_copies must be an integer in 1..{MAX_COPIES}, got "
                                 f"{n_copies!r}")
        if not isinstance(graph_size, int) or graph_size < 1:
            raise SchedulerError(f"graph_size must be a positive integer, got {graph_size!r}")
        if bufts is None:
            bufts = [b.get_default_buffer_type() for b in backends]
        bufts = list(bufts)
        if len(bufts) != len(backends):
            raise SchedulerError(f"{len(bufts)} buffer types for {len(backends)} backends")
        for b, bt in zip(backends, bufts):
            if not b.supports_buft(bt):
                raise SchedulerError(f"backend '{b.name}' cannot use buffer type '{bt.name}'")
        if debug is None:
            debug = settings.current().sched_debug
        self.backends: list[Backend] = backends
        self.bufts = bufts
        self.n_backends = len(backends)
        self.n_copies = n_copies
        self.op_offload = op_offload
        self.graph_size = graph_size
        self.debug = debug
        self.galloc = GraphAllocator(bufts)
        self._host_buft = bufts[-1]
        self._events = None
        if n_copies > 1:
            self._events = [[b.event_new() for _ in range(n_copies)] for b in backends]
        self.cur_copy = 0
        self.next_copy = 0
        self.trace: list | None = None
        self._eval_cb = None
        self._buft_ok: dict = {}
        self._sup: dict = {}               # (backend id, id(node)) -> supports_op, per split
        self._prev_bufts: tuple[list, list] = ([], [])
        self._rewired: list[tuple[Tensor, int, Tensor]] = []
        self._flags_set: list[tuple[Tensor, int]] = []
        self._graph: Graph | None = None
        self._graph_uid = -1
        self.n_splits_made = 0        # counters for tests and benchmarks
        self.n_reserves = 0
        self.n_computes = 0
        self.n_unparked = 0
        # graphs kept split and allocated besides the current one (see _park)
        self._parked: OrderedDict[int, tuple] = OrderedDict()
        self.reset()

    # ---- state ---------------------------------------------------------------------------------
    def reset(self) -> None:
        """Forget the current graph: assignments (user ones too), splits and copies; restore the
        sources rewired to copies. The next compute or alloc_graph splits again."""
        self._restore_graph()
        self._tb: dict[int, int] = {}          # id(tensor) -> backend id
        self._cause: dict[int, str] = {}
        self._keep: dict[int, Tensor] = {}     # tensors known by id that the graph does not hold
        self._copies: dict[tuple[int, int], list[Tensor]] = {}
        self._graph_inputs: list[Tensor] = []
        self._splits: list[Split] = []
        self._graph_copy: Graph | None = None
        self._graph = None
        self._graph_uid = -1
        self._n_nodes = -1
        self._is_alloc = False

    #: how many graphs _park keeps: the runtime switches between a few shapes (decode, the
    #: verification of k drafts, prompt chunks of a server step), and splitting and allocating
    #: a 1.5B model's graph again costs ~25-45 ms per switch, most of a decode step
    PARKED_MAX = 8
    _PARK_FIELDS = ("_tb", "_cause", "_keep", "_copies", "_graph_inputs", "_splits",
                    "_graph_copy", "_graph", "_graph_uid", "_n_nodes", "_node_ids", "_leaf_ids",
                    "_prev_bufts", "_sup", "cur_copy")

    def _memory_key(self) -> tuple:
        """Where the compute memory is: a parked graph's addresses hold while it is unchanged."""
        g = self.galloc
        return tuple(tuple(g.memory_ranges(b)) for b in range(g.n_buffers))

    def _park(self) -> bool:
        """Set the current graph aside, split and allocated, for a later compute; False (nothing
        done) when it cannot be kept as it is: several input copies, or sources rewired to copies
        or flags changed for the split (multi-device graphs), which other graphs could disturb.
        A parked graph's tensors keep their addresses in the compute buffers; computing another
        graph there overwrites only intermediate values, which each compute writes anew."""
        g = self._graph
        if (g is None or not self._is_alloc or self.n_copies != 1 or self._rewired
                or self._flags_set):
            return False
        state = {name: getattr(self, name) for name in self._PARK_FIELDS}
        self._parked[id(g)] = (self._memory_key(), state)   # state holds g: its id stays its
        self._parked.move_to_end(id(g))
        while len(self._parked) > self.PARKED_MAX:
            self._parked.popitem(last=False)
        self._graph = None            # forget it as current, undoing nothing (nothing to undo)
        self.reset()
        return True

    def _set_aside(self) -> None:
        """Before another graph is split: park the current one if it can be kept, else reset."""
        if self._is_alloc and not self._park():
            self.reset()

    def holds(self, graph: Graph) -> bool:
        """Whether computing `graph` needs no new split or allocation: it is the current graph or
        a parked one that is still valid."""
        if self._is_alloc and graph is self._graph and graph.uid == self._graph_uid:
            return True
        entry = self._parked.get(id(graph))
        return entry is not None and self._parked_valid(graph, *entry)

    def sole_split(self, graph: Graph) -> Split | None:
        """The split of `graph` when computing it again is that split's compute and nothing else:
        `graph` is the current graph, allocated and unchanged, in one split without input copies,
        one copy, no eval callback or trace (the decode step's fast path, pyggml/llm/context.py,
        then runs it itself). None otherwise."""
        if (self._is_alloc and graph is self._graph and graph.uid == self._graph_uid
                and len(graph.nodes) == self._n_nodes and len(self._splits) == 1
                and self.n_copies == 1 and self._eval_cb is None and self.trace is None
                and not self._splits[0].copy_plan):
            return self._splits[0]
        return None

    def computes_as_is(self, graph: Graph, uid: int) -> bool:
        """Whether sole_split(graph) still gives the split it gave when graph.uid was `uid` (a
        re-split or re-allocation gives the graph a new uid; per token: a few attribute
        reads)."""
        return (graph is self._graph and graph.uid == uid and self._is_alloc
                and self._eval_cb is None and self.trace is None)

    def _parked_valid(self, graph: Graph, mem: tuple, state: dict) -> bool:
        return (state["_graph"] is graph and state["_graph_uid"] == graph.uid
                and state["_n_nodes"] == len(graph.nodes) and mem == self._memory_key())

    def _unpark(self, graph: Graph) -> bool:
        """Make a parked `graph` current again as it was allocated; False if it is not parked
        (or its uid, node count or the compute memory changed since)."""
        entry = self._parked.pop(id(graph), None)
        if entry is None or not self._parked_valid(graph, *entry):
            return False
        state = entry[1]
        self._set_aside()
        for name, value in state.items():
            setattr(self, name, value)
        self._is_alloc = True
        self.n_unparked += 1
        return True

    def _restore_graph(self) -> None:
        if self._rewired:
            for node, j, orig in reversed(self._rewired):
                node.src[j] = orig
            self._rewired = []
            if self._graph is not None:
                self._graph.next_uid()
        for t, flags in reversed(self._flags_set):
            t.flags = flags
        self._flags_set = []

    def _backend_index(self, backend) -> int:
        if isinstance(backend, int) and 0 <= backend < self.n_backends:
            return backend
        for i, b in enumerate(self.backends):
            if b is backend or (isinstance(backend, str) and b.name == backend):
                return i
        raise SchedulerError(f"{backend!r} is not one of this scheduler's backends "
                             f"({', '.join(b.name for b in self.backends)})")

    def set_tensor_backend(self, tensor: Tensor, backend) -> None:
        """Pin `tensor` to `backend` (object, index or name) for the next split (cause "usr").
        After a graph was allocated, this parks it (_park) or resets the scheduler first."""
        b = self._backend_index(backend)
        self._set_aside()
        self._tb[id(tensor)] = b
        self._cause[id(tensor)] = "usr"
        self._keep[id(tensor)] = tensor

    def get_tensor_backend(self, tensor: Tensor) -> Backend | None:
        b = self._tb.get(id(tensor), -1)
        return None if b < 0 else self.backends[b]

    def get_assignment(self, tensor: Tensor) -> Assignment | None:
        b = self._tb.get(id(tensor), -1)
        if b < 0:
            return None
        return Assignment(b, self.backends[b].name, self._cause.get(id(tensor), "?"))

    def get_n_splits(self) -> int:
        return len(self._splits)

    def get_n_copies(self) -> int:
        return self.n_copies

    def get_n_backends(self) -> int:
        return self.n_backends

    def get_backend(self, i: int) -> Backend:
        return self.backends[i]

    @property
    def splits(self) -> list[Split]:
        """The splits of the current graph (read-only)."""
        return list(self._splits)

    def copies_of(self, tensor: Tensor, backend) -> list[Tensor]:
        """The n_copies copies of `tensor` on `backend` made for the current graph ([] if none)."""
        return list(self._copies.get((id(tensor), self._backend_index(backend)), ()))

    def get_buffer_size(self, backend) -> int:
        """Bytes of compute memory reserved for that backend's buffer type (0 when it shares the
        buffer of an earlier backend with the same buffer type)."""
        return self.galloc.get_buffer_size(self._backend_index(backend))

    def set_eval_callback(self, cb) -> None:
        """cb(tensor, ask: bool) -> bool, ggml's two-phase callback: with ask=True, return whether
        you want `tensor`'s data; the nodes up to it are then computed and synchronized and cb is
        called again with ask=False (read the data with pyggml.backend.base.tensor_get); return
        False to stop the compute. None removes it. Costs nothing when unset."""
        self._eval_cb = cb

    # ---- memory helpers ------------------------------------------------------------------------
    def _mem_of(self, t: Tensor):
        """The memory t already lives in (its view source's for a view): a buffer, _HOST for data
        without a buffer, or None (no data yet, or our own compute memory: placed again)."""
        owner = t.view_src if t.view_src is not None else t
        buf = owner.buffer
        if buf is None:
            return _HOST if owner.data is not None else None
        if _compute_owner_of(buf) is self.galloc:
            return None
        return buf

    def _buft_of(self, buf):
        if buf is _HOST:
            return self._host_buft
        buft = getattr(buf, "buft", None)
        if buft is not None:
            return buft
        if is_host_buffer(buf):
            return self._host_buft
        raise SchedulerError(f"memory {buf!r} has no buffer type and is not host memory")

    def _supports_buft(self, b: int, buft) -> bool:
        key = (b, buft)
        r = self._buft_ok.get(key)
        if r is None:
            r = self._buft_ok[key] = bool(self.backends[b].supports_buft(buft))
        return r

    def _supports(self, b: int, t: Tensor) -> bool:
        if t.op == Op.NONE or t.op in VIEW_OPS:
            return True
        key = (b, id(t))
        r = self._sup.get(key)
        if r is None:
            r = self._sup[key] = bool(self.backends[b].supports_op(t))
        return r

    def _backend_from_buffer(self, t: Tensor, op: Tensor) -> int:
        """Highest-priority backend that can use t's memory and run `op`; -1 if t has no memory
        yet or none can."""
        buf = self._mem_of(t)
        if buf is None:
            return -1
        buft = self._buft_of(buf)
        for b in range(self.n_backends):
            if self._supports_buft(b, buft) and self._supports(b, op):
                return b
        return -1

    def _buffer_supported(self, t: Tensor, b: int) -> bool:
        """Can backend b read t where it is (or where it will be allocated)?"""
        buf = self._mem_of(t)
        if buf is not None:
            buft = self._buft_of(buf)
        else:
            tb = self._tb.get(id(t), -1)
            if tb == -1 and t.view_src is not None:
                tb = self._tb.get(id(t.view_src), -1)
            if tb == -1:
                return False
            buft = self.bufts[tb]
        return self._supports_buft(b, buft)

    def _is_host_weight(self, t: Tensor) -> bool:
        buf = t.buffer
        return buf is not None and buffer_usage(buf) is _WEIGHTS and is_host_buffer(buf)

    # ---- pass 1 --------------------------------------------------------------------------------
    def _from_cur(self, t: Tensor) -> tuple[int, str]:
        b = self._backend_from_buffer(t, t)
        if b != -1:
            return b, "1.dst"
        if t.view_src is not None:
            b = self._backend_from_buffer(t.view_src, t)
            if b != -1:
                return b, "1.vsrc"
        mem = self._mem_of(t)
        if mem is not None:
            names = ", ".join(x.name for x in self.backends)
            raise SchedulerError(
                f"tensor '{t.name}' ({t.op.name}) is already in memory of type "
                f"'{self._buft_of(mem).name}', but no backend of [{names}] can use that memory "
                f"and run {t.op.name}: it cannot be moved")
        if t.flags & _INPUT:
            return self.n_backends - 1, "1.inp"
        if t.op not in _SMALL_EXTRA_SRC_OPS:
            last = self.n_backends - 1
            for j, s in enumerate(t.src):
                if s is None or s.buffer is None or buffer_usage(s.buffer) is not _WEIGHTS:
                    continue
                sb = self._backend_from_buffer(s, t)
                if self.op_offload and sb == last and is_host_buffer(s.buffer):
                    for b in range(sb):
                        if self._supports(b, t) and self.backends[b].offload_op(t):
                            return b, "1.off"
                return sb, f"1.wgt{j}"
        return -1, ""

    # ---- the five passes -----------------------------------------------------------------------
    def _assign(self, t: Tensor, b: int, cause: str) -> None:
        self._tb[id(t)] = b
        self._cause[id(t)] = cause

    def _split_graph(self, graph: Graph) -> None:
        nodes, leafs = graph.nodes, graph.leafs
        if len(nodes) + len(leafs) > self.graph_size:
            raise SchedulerError(f"the graph has {len(nodes)} nodes and {len(leafs)} leafs, more "
                                 f"than the scheduler's graph_size {self.graph_size}; create the "
                                 f"Scheduler with graph_size >= {len(nodes) + len(leafs)}")
        self._restore_graph()
        # start over, keeping only the user's pins
        pins = [k for k, c in self._cause.items() if c == "usr"]
        self._tb = {k: self._tb[k] for k in pins}
        self._cause = {k: "usr" for k in pins}
        self._keep = {k: self._keep[k] for k in pins if k in self._keep}
        self._copies, self._graph_inputs, self._splits = {}, [], []
        self._graph = graph
        self._sup = {}
        tb, cause = self._tb, self._cause
        nb, last = self.n_backends, self.n_backends - 1

        # pass 1: facts (memory already placed, graph inputs, weights)
        for t in leafs:
            if id(t) not in tb:
                b, why = self._from_cur(t)
                if b != -1:
                    self._assign(t, b, why)
        for t in nodes:
            if id(t) not in tb:
                b, why = self._from_cur(t)
                if b != -1:
                    self._assign(t, b, why)

        # pass 2: expand assignments to neighbours, non-CPU backends first
        order = [t for t in nodes if t.op not in VIEW_OPS]
        for seq, tag, skip_cpu in ((order, "2.gd", True), (order[::-1], "2.gu", True),
                                   (order, "2.rd", False), (order[::-1], "2.ru", False)):
            cur = -1
            for t in seq:
                b = tb.get(id(t), -1)
                if b != -1:
                    cur = -1 if skip_cpu and b == last else b
                elif cur != -1 and self._supports(cur, t):
                    self._assign(t, cur, tag)

        # pass 3: upgrade to higher priority backends sharing the buffer type; best for the rest
        for t in order:
            b = tb.get(id(t), -1)
            if b == -1:
                best = -1
                for c in range(nb):
                    if not self._supports(c, t):
                        continue
                    n = 0
                    for s in t.src:
                        if s is None:
                            continue
                        known = id(s) in tb or (s.view_src is not None and id(s.view_src) in tb)
                        if known and self._buffer_supported(s, c):
                            n += 1
                    if n > best:
                        best = n
                        self._assign(t, c, "3.best")
            elif cause.get(id(t)) != "usr":
                for c in range(b):
                    if (self.bufts[c] is self.bufts[b] and self._supports(c, t)
                            and all(s is None or self._buffer_supported(s, c) for s in t.src)):
                        self._assign(t, c, "3.upg")
                        break

        # pass 4: views follow their memory, sources their consumer, a fallback for the rest
        for t in nodes:
            tid = id(t)
            b = tb.get(tid, -1)
            vs = t.view_src
            if vs is not None and b == -1 and id(vs) in tb:
                b = tb[id(vs)]
                self._assign(t, b, "4.vsrc")
            if b == -1:
                for c in range(nb):
                    if self._supports(c, t):
                        b = c
                        self._assign(t, c, "4.sup")
                        break
                else:
                    raise self._unsupported_error(t)
            if vs is not None:
                b = self._place_view(t, b)
            for s in t.src:
                if s is None or id(s) in tb:
                    continue
                svs = s.view_src
                if svs is not None and id(svs) in tb:
                    self._assign(s, tb[id(svs)], "4.vsrc")
                else:
                    self._assign(s, b, "4.cur")
        for t in leafs:
            if id(t) not in tb:
                self._assign(t, last, "4.leaf")
        for t in order:        # assignments no pass checked against supports_op
            c = cause.get(id(t))
            if c in ("usr", "1.inp", "4.vsrc") and not self._supports(tb[id(t)], t):
                raise SchedulerError(f"node '{t.name}' ({t.op.name}) is assigned to backend "
                                     f"'{self.backends[tb[id(t)]].name}' (cause {c}), which "
                                     f"does not support it")

        # pass 5: splits, inputs and copies
        self._make_splits(graph)
        self._build_graphs(graph)
        graph.next_uid()
        self.n_splits_made += 1
        if self.debug:
            print(self.format_assignments(verbose=self.debug > 1), file=sys.stderr)

    def _place_view(self, t: Tensor, b: int) -> int:
        """A tensor sharing another's memory must run where that memory can be reached. A view
        op computes nothing and simply follows its memory (even if the user pinned it); a
        computing node pinned by the user where its memory cannot be reached is an error."""
        vs = t.view_src
        vb = self._tb.get(id(vs), -1)
        if vb == -1:                     # an unplaced leaf seen only through views
            self._assign(vs, b, "4.cur")
            return b
        if vb == b or self._buffer_supported(vs, b):
            return b
        if self._cause.get(id(t)) == "usr" and t.op not in VIEW_OPS:
            raise SchedulerError(f"'{t.name}' ({t.op.name}) is assigned by the user to "
                                 f"'{self.backends[b].name}', but it shares the memory of "
                                 f"'{vs.name}' on '{self.backends[vb].name}', which "
                                 f"'{self.backends[b].name}' cannot reach")
        self._assign(t, vb, "4.vsrc")
        return vb

    def _unsupported_error(self, t: Tensor) -> UnsupportedOpError:
        asked = []
        for b in self.backends:
            why = getattr(b, "why_unsupported", None)
            reason = why(t) if why is not None else None
            asked.append(f"{b.name}: {reason or 'not supported'}")
        srcs = ", ".join(f"'{s.name}' {s.type.name}{list(s.ne)}" for s in t.src if s is not None)
        return UnsupportedOpError(
            f"no backend can compute node '{t.name}' (op {t.op.name} -> {t.type.name}"
            f"{list(t.ne)} from {srcs or 'nothing'}); backends asked: " + "; ".join(asked))

    def _dup(self, s: Tensor, b: int, c: int) -> Tensor:
        t = Tensor(s.type, s.ne, s.nb, name=f"{self.backends[b].name}#{s.name}#{c}")
        if self.n_copies > 1:
            t.flags = _INPUT | _OUTPUT      # never reused: another batch may still read it
        self._assign(t, b, "4.cpy")
        self._keep[id(t)] = t
        return t

    def _make_splits(self, graph: Graph) -> None:
        nodes = graph.nodes
        tb, copies = self._tb, self._copies
        n_copies, cur_copy = self.n_copies, self.cur_copy
        splits: list[Split] = []
        self._splits = splits
        if not nodes:
            return
        i0 = 0
        first = tb[id(nodes[0])]
        for i0, t in enumerate(nodes):
            if t.op not in VIEW_OPS:
                first = tb[id(t)]
                break
        else:
            i0 = len(nodes)
        split = Split(0, first, 0)
        cur = first
        for i in range(i0, len(nodes)):
            t = nodes[i]
            if t.op in VIEW_OPS:
                continue
            b = tb[id(t)]
            need_new = False
            if b == cur and split.inputs:
                for s in t.src:             # the weight-incompatibility cut
                    if (s is not None and s.buffer is not None
                            and buffer_usage(s.buffer) is _WEIGHTS
                            and tb.get(id(s), -1) != cur and not self._buffer_supported(s, cur)):
                        need_new = True
                        break
            if b != cur or need_new:
                split.i_end = i
                splits.append(split)
                split = Split(len(splits), b, i)
                cur = b
            for j, s in enumerate(t.src):
                if s is None:
                    continue
                sid = id(s)
                sb = tb.get(sid, -1)
                if sb == -1:
                    raise SchedulerError(f"internal: source '{s.name}' of '{t.name}' has no "
                                         f"backend after pass 4")
                if n_copies > 1 and s.flags & _INPUT and (sid, sb) not in copies:
                    self._flags_set.append((s, s.flags))
                    s.flags |= _INPUT | _OUTPUT
                    copies[(sid, sb)] = [s if c == cur_copy else self._dup(s, sb, c)
                                         for c in range(n_copies)]
                    self._graph_inputs.append(s)
                if sb != cur and not self._buffer_supported(s, cur):
                    cps = copies.get((sid, cur))
                    if cps is None:
                        cps = copies[(sid, cur)] = [self._dup(s, cur, c)
                                                    for c in range(n_copies)]
                        split.inputs.append(s)
                    t.src[j] = cps[cur_copy]
                    self._rewired.append((t, j, s))
        split.i_end = len(nodes)
        splits.append(split)

    def _dep(self, inp: Tensor) -> Tensor:
        """A node that keeps `inp` alive (for the allocator) until its copy is made."""
        root = inp.view_src if inp.view_src is not None else inp
        offs = inp.view_offs if inp.view_src is not None else 0
        return Tensor(inp.type, inp.ne, inp.nb, src=[inp], view_src=root, view_offs=offs,
                      name=f"{inp.name} (dep)")

    def _build_graphs(self, graph: Graph) -> None:
        """Split graphs, and the graph the allocator plans: per split its input dependencies and
        copies, then its nodes; leafs: pinned copies first (n_copies > 1), then the graph's."""
        tb, copies, cur_copy = self._tb, self._copies, self.cur_copy
        one_copy = self.n_copies == 1
        gc_nodes: list[Tensor] = []
        node_ids: list[int] = []
        for sp in self._splits:
            b = sp.backend_id
            cps = [copies[(id(x), b)][cur_copy] for x in sp.inputs]
            for x, cp in zip(sp.inputs, cps):
                gc_nodes.append(self._dep(x))
                node_ids.append(tb[id(x)])
                if one_copy:
                    gc_nodes.append(cp)
                    node_ids.append(b)
            seg = graph.nodes[sp.i_start:sp.i_end]
            gc_nodes.extend(seg)
            node_ids.extend(tb[id(t)] for t in seg)
            sp.graph = graph.subgraph(list(seg), cps)
            plan = [(x, cp, tb[id(x)], bool(x.flags & _INPUT)) for x, cp in zip(sp.inputs, cps)]
            sp.copy_plan = ([p for p in plan if not self._is_host_weight(p[0])]
                            + [p for p in plan if self._is_host_weight(p[0])])
        gc_leafs: list[Tensor] = []
        leaf_ids: list[int] = []
        seen: set[int] = set()
        if not one_copy:
            for s in self._graph_inputs:
                sb = tb[id(s)]
                for cp in copies[(id(s), sb)]:
                    gc_leafs.append(cp)
                    leaf_ids.append(sb)
                    seen.add(id(cp))
            for sp in self._splits:
                for x in sp.inputs:
                    for cp in copies[(id(x), sp.backend_id)]:
                        gc_leafs.append(cp)
                        leaf_ids.append(sp.backend_id)
        for t in graph.leafs:
            if id(t) not in seen:
                gc_leafs.append(t)
                leaf_ids.append(tb[id(t)])
        gc = Graph(size=max(1, len(gc_nodes), len(gc_leafs)))
        gc.nodes, gc.leafs = gc_nodes, gc_leafs
        self._graph_copy = gc
        self._node_ids, self._leaf_ids = node_ids, leaf_ids

    # ---- memory --------------------------------------------------------------------------------
    def _alloc_splits(self) -> None:
        gc, bufts = self._graph_copy, self.bufts
        cur = ([bufts[i] for i in self._node_ids], [bufts[i] for i in self._leaf_ids])
        if cur != self._prev_bufts or self.galloc.needs_realloc(gc):
            for b in self.backends:        # addresses may move: nothing may still run on them
                b.synchronize()
            self.galloc.reserve(gc, self._node_ids, self._leaf_ids)
            self.n_reserves += 1
        self.galloc.alloc_graph(gc)
        self._prev_bufts = cur

    def reserve(self, graph: Graph) -> bool:
        """Plan compute memory for `graph` (the worst case: the largest batch) and allocate it;
        then reset. Later graphs that fit are placed without growing memory."""
        self.synchronize()
        if self._is_alloc:
            self.reset()
        try:
            self._split_graph(graph)
            gc = self._graph_copy
            self.galloc.reserve(gc, self._node_ids, self._leaf_ids)
            self.n_reserves += 1
            self.galloc.alloc_graph(gc)
            self._prev_bufts = ([self.bufts[i] for i in self._node_ids],
                                [self.bufts[i] for i in self._leaf_ids])
        finally:
            self.reset()
        return True

    def reserve_size(self, graph: Graph) -> dict[str, int]:
        """Bytes of compute memory each backend would need for `graph`, without allocating (a
        backend sharing an earlier one's buffer type counts 0). Resets the scheduler."""
        if self._is_alloc:
            self.reset()
        try:
            self._split_graph(graph)
            sizes = self.galloc.reserve_size(self._graph_copy, self._node_ids, self._leaf_ids)
        finally:
            self.reset()
        return {b.name: n for b, n in zip(self.backends, sizes)}

    def split_graph(self, graph: Graph) -> list[Split]:
        """Assign backends and cut `graph` into splits without placing memory (plans, debugging;
        see `splits`, `get_assignment`, `format_assignments`). The next compute allocates."""
        if self._is_alloc:
            self.reset()
        try:
            self._split_graph(graph)
        except BaseException:
            self.reset()
            raise
        return self.splits

    def alloc_graph(self, graph: Graph) -> bool:
        """Assign backends, split, and give every tensor of `graph` its memory (resets first if
        a graph is allocated, parking it when it can be kept: _park). Rotates the input copy
        (n_copies > 1). Raises on failure."""
        self._parked.pop(id(graph), None)
        self._set_aside()
        self.cur_copy = self.next_copy
        self.next_copy = (self.next_copy + 1) % self.n_copies
        try:
            self._split_graph(graph)
            self._alloc_splits()
        except BaseException:
            self.reset()
            raise
        self._is_alloc = True
        self._graph_uid = graph.uid
        self._n_nodes = len(graph.nodes)
        return True

    # ---- compute -------------------------------------------------------------------------------
    def graph_compute(self, graph: Graph) -> bool:
        """Compute `graph` and wait for every backend. False if the eval callback stopped it."""
        done = self.graph_compute_async(graph)
        self.synchronize()
        return done

    def graph_compute_async(self, graph: Graph) -> bool:
        """Compute `graph`; backends may still be running when this returns (synchronize()).
        The graph last allocated (same object, same uid) is computed again as it is."""
        if not (self._is_alloc and graph is self._graph and graph.uid == self._graph_uid
                and len(graph.nodes) == self._n_nodes) and not self._unpark(graph):
            self.alloc_graph(graph)
        return self._compute_splits()

    def synchronize(self) -> None:
        """Wait for every backend. Without an allocated graph, the next batch uses copy 0."""
        for b in self.backends:
            b.synchronize()
        if not self._is_alloc:
            self.next_copy = 0

    def _wait(self, b: int, trace) -> None:
        """Wait until backend b is done with its work on the current copy."""
        ev = self._events[b][self.cur_copy] if self._events is not None else None
        if ev is not None:
            ev.synchronize()
            if trace is not None:
                trace.append(("event_sync", self.backends[b].name, self.cur_copy))
        else:
            self.backends[b].synchronize()
            if trace is not None:
                trace.append(("sync", self.backends[b].name))

    def _compute_splits(self) -> bool:
        backends, events, cur_copy, trace = self.backends, self._events, self.cur_copy, self.trace
        self.n_computes += 1
        prev = -1
        for sp in self._splits:
            b = sp.backend_id
            backend = backends[b]
            if not sp.copy_plan and prev >= 0 and prev != b:
                self._wait(prev, trace)
            copier = sp.copier
            if copier is _UNBUILT:
                copier = sp.copier = (backend.compile_input_copies(sp.copy_plan, backends)
                                      if sp.copy_plan and events is None else None)
            if copier is not None and trace is None:
                copier()
                copy_plan = ()
            else:
                copy_plan = sp.copy_plan
            for src, dst, sb, user_input in copy_plan:
                if user_input:
                    self._wait(b, trace)        # the user may overwrite src after we return
                    tensor_copy(src, dst)
                else:
                    ev = events[b][cur_copy] if events is not None else None
                    if ev is not None:
                        backend.event_wait(ev)
                        if trace is not None:
                            trace.append(("event_wait", backend.name, cur_copy))
                    else:
                        backend.synchronize()
                        if trace is not None:
                            trace.append(("sync", backend.name))
                    if not backend.cpy_tensor_async(src, dst):
                        backends[sb].synchronize()
                        if trace is not None:
                            trace.append(("sync", backends[sb].name))
                        self._wait(b, trace)
                        tensor_copy(src, dst)
                if trace is not None:
                    trace.append(("copy", sp.index, src.name, backends[sb].name, backend.name))
            if trace is not None:
                trace.append(("compute", sp.index, backend.name))
            if self._eval_cb is None:
                backend.graph_compute(sp.graph)
            elif not self._compute_with_callback(sp, backend):
                return False
            if events is not None and events[b][cur_copy] is not None:
                events[b][cur_copy].record()
                if trace is not None:
                    trace.append(("record", backend.name, cur_copy))
            prev = b
        return True

    def _compute_with_callback(self, sp: Split, backend: Backend) -> bool:
        cb = self._eval_cb
        nodes = sp.graph.nodes
        n = len(nodes)
        j0 = 0
        while j0 < n:
            j1 = j0
            t = nodes[j1]
            need = cb(t, True)
            while not need and j1 < n - 1:
                j1 += 1
                t = nodes[j1]
                need = cb(t, True)
            gv = sp._views.get((j0, j1))
            if gv is None:
                gv = sp._views[(j0, j1)] = Graph(size=max(1, j1 + 1 - j0, len(sp.graph.leafs)))
                gv.nodes, gv.leafs = nodes[j0:j1 + 1], sp.graph.leafs
            backend.graph_compute(gv)
            backend.synchronize()
            if need and not cb(t, False):
                return False
            j0 = j1 + 1
        return True

    # ---- debug ---------------------------------------------------------------------------------
    def format_assignments(self, verbose: bool = True) -> str:
        """The splits with their inputs and (verbose) every node with backend, cause and
        sources, as PYGGML_SCHED_DEBUG prints them."""
        g = self._graph
        if g is None:
            return "(no graph)"

        def who(t: Tensor) -> str:
            a = self.get_assignment(t)
            return "NULL ?" if a is None else f"{a.backend_name} {a.cause}"

        lines = []
        starts = {sp.i_start: sp for sp in self._splits}
        for i, t in enumerate(g.nodes):
            sp = starts.get(i)
            if sp is not None:
                ins = " ".join(f"[{x.name} ({_size(x.nbytes())})]" for x in sp.inputs)
                lines.append(f"## SPLIT #{sp.index}: {self.backends[sp.backend_id].name} # "
                             f"{len(sp.inputs)} inputs{': ' + ins if ins else ''}")
            if not verbose or t.op in VIEW_OPS:
                continue
            srcs = "".join(f" {s.name} ({_size(s.nbytes())}) [{who(s)}]"
                           for s in t.src if s is not None)
            lines.append(f"node #{i:3d} ({t.op.name:>10.10s}): {t.name:>20.20s} "
                         f"({_size(t.nbytes())}) [{who(t)}] use={g.use_count(t)}:{srcs}")
        return "\n".join(lines)

    def assignments(self) -> list[tuple[str, str, str, str]]:
        """(node name, op, backend name, cause) for every node of the current graph."""
        g = self._graph
        if g is None:
            return []
        out = []
        for t in g.nodes:
            a = self.get_assignment(t)
            out.append((t.name, t.op.name, a.backend_name if a else "", a.cause if a else ""))
        return out
