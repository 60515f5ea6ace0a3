"""The CPU backend: host memory and the C graph executor of libpyggml.

A graph is marshalled once into a numpy array laid out exactly like the C struct `pg_tensor`
(leafs, nodes and any outside sources; src[] as indices) plus the order of nodes to run. Each
compute is then a single ctypes call (`pg_graph_compute`, GIL released) with the C thread pool.
The marshalled plan is cached per graph and reused while the graph's uid is unchanged (the
scheduler gives a graph a new uid when it re-splits or re-allocates it); when some tensor moved
since (pyggml.tensor.placement_generation) the plan re-reads its tensors' addresses first. The
C side keeps a plan too (`pg_plan`): the executor's barrier/fusion schedule and work size, made on
the first compute and again only when the tensors' addresses changed, not per compute.

Registry side (pyggml.backend.base): `backend_reg()` lists one `CpuDevice` (type CPU, host
memory); its default buffer type is the process-wide `cpu_buffer_type()`. The CPU computes
synchronously: its events are no-ops and `synchronize()` returns at once.
"""

from __future__ import annotations

import ctypes
import mmap
import os
import platform
import weakref

import numpy as np

from pyggml import _native
from pyggml.backend.base import (
    Backend,
    BackendReg,
    Buffer,
    BufferType,
    BufferUsage,
    Device,
    DeviceType,
    Event,
)
from pyggml.errors import (
    BackendError,
    ClosedError,
    ComputeAbortedError,
    InsufficientMemoryError,
    InvalidArgumentError,
    NativeLibraryError,
    UnsupportedOpError,
)
from pyggml.graph import Graph
from pyggml.tensor import Tensor, placement_generation
from pyggml.types import VIEW_OPS, GGMLType, Op, traits

PG_TENSOR_DTYPE = _native.PG_TENSOR_DTYPE    # the numpy mirror of `pg_tensor`

_P = ctypes.c_void_p
_native.declare("pg_threadpool_new", _P, [ctypes.c_int32])
_native.declare("pg_threadpool_free", None, [_P])
_native.declare("pg_node_supported", ctypes.c_int32,
                [_P, ctypes.c_int32, ctypes.c_int32, ctypes.c_char_p, ctypes.c_size_t])
_native.declare("pg_graph_validate", ctypes.c_int32,
                [_P, ctypes.c_int32, _P, ctypes.c_int32, ctypes.POINTER(ctypes.c_int32)])
_native.declare("pg_graph_work_size", ctypes.c_int32,
                [_P, ctypes.c_int32, _P, ctypes.c_int32, ctypes.c_int32,
                 ctypes.POINTER(ctypes.c_size_t)])
_native.declare("pg_graph_schedule_stats", ctypes.c_int32,
                [_P, ctypes.c_int32, _P, ctypes.c_int32, ctypes.POINTER(ctypes.c_int32),
                 ctypes.POINTER(ctypes.c_int32)])
_native.declare("pg_graph_set_schedule", None, [ctypes.c_int32])
EVAL_CB = ctypes.CFUNCTYPE(ctypes.c_int32, ctypes.c_int32, _P, _P)
_native.declare("pg_graph_compute", ctypes.c_int32,
                [_P, ctypes.c_int32, _P, ctypes.c_int32, _P, ctypes.c_int32, _P, ctypes.c_size_t,
                 EVAL_CB, _P, ctypes.POINTER(ctypes.c_int32)])
_native.declare("pg_graph_compute_validated", ctypes.c_int32,
                [_P, ctypes.c_int32, _P, ctypes.c_int32, _P, ctypes.c_int32, _P, ctypes.c_size_t,
                 EVAL_CB, _P, ctypes.POINTER(ctypes.c_int32)])

_native.declare("pg_plan_new", _P, [_P, ctypes.c_int32, _P, ctypes.c_int32])
_native.declare("pg_plan_free", None, [_P])
_native.declare("pg_plan_compute", ctypes.c_int32,
                [_P, _P, ctypes.c_int32, _P, ctypes.c_size_t, ctypes.POINTER(ctypes.c_int32)])
_native.declare("pg_plan_n_schedules", ctypes.c_int64, [_P])


_HAS_VALIDATED: list[bool] = []     # whether the loaded library has it (looked up once)


def _compute_fn(validated: bool):
    """pg_graph_compute, or for a plan validated since its last change the entry point that
    skips the per-node validation (with a library older than it, as tools/ab_libs.py loads:
    the validating one)."""
    if validated:
        if not _HAS_VALIDATED:
            try:
                _native.fn("pg_graph_compute_validated")
                _HAS_VALIDATED.append(True)
            except NativeLibraryError:
                _HAS_VALIDATED.append(False)
        if _HAS_VALIDATED[0]:
            return _native.fn("pg_graph_compute_validated")
    return _native.fn("pg_graph_compute")

_NUMPY_DTYPES = {GGMLType.F32: np.float32, GGMLType.F16: np.float16, GGMLType.I32: np.int32,
                 GGMLType.BF16: np.uint16, GGMLType.I8: np.int8, GGMLType.I16: np.int16,
                 GGMLType.I64: np.int64, GGMLType.F64: np.float64}


MAX_THREADS = 256       # PG_MAX_THREADS in pyggml.h: the most threads of one pool


def default_n_threads() -> int:
    """Physical cores where known (hyper-threads do not help memory-bound decode), at least 1."""
    try:
        import psutil
        n = psutil.cpu_count(logical=False)
    except Exception:  # psutil can fail inside odd containers
        n = None
    return max(1, n or os.cpu_count() or 1)


def _thread_count(what: str, n, limit: int) -> int:
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or not 1 <= n <= limit:
        why = "the CPU thread pool's limit" if limit == MAX_THREADS else "the pool size"
        raise InvalidArgumentError(f"{what} must be an integer in 1..{limit} ({why}), got {n!r}")
    return int(n)


# ---- host memory ---------------------------------------------------------------------------------

class HostBufferType(BufferType):
    """Plain host memory (numpy-owned; huge pages for large weight and KV buffers, see
    _huge_page_memory), 64-byte aligned. Use `cpu_buffer_type()` for the CPU
    device's own instance (the scheduler compares buffer types by identity)."""

    def __init__(self, device: "Device | None" = None):
        super().__init__("CPU", alignment=64, max_size=None, is_host=True, device=device)

    def alloc_buffer(self, n_bytes: int, usage: BufferUsage = BufferUsage.ANY) -> "HostBuffer":
        return HostBuffer(self, n_bytes, usage)


GIB = 1 << 30
CHECKED_ALLOC_BYTES = 256 << 20     # host buffers from this size on are checked before allocating


def available_host_memory() -> int:
    """Bytes the system can give without swapping (psutil's `available`)."""
    import psutil
    return int(psutil.virtual_memory().available)


def require_host_memory(n_bytes: int, what: str, hint: str = "") -> None:
    """InsufficientMemoryError, before allocating, if `n_bytes` exceed the available memory: a
    failed allocation would be a numpy error, and an overcommitted one an OOM kill later."""
    avail = available_host_memory()
    if n_bytes > avail:
        raise InsufficientMemoryError(f"{what} needs {n_bytes / GIB:.2f} GiB of host memory but "
                                      f"only {avail / GIB:.2f} GiB are available"
                                      + (f"; {hint}" if hint else ""))


HUGE_PAGE_BYTES = 2 << 20          # x86-64's and most arm64 kernels' transparent huge page


def transparent_huge_pages() -> str:
    """The kernel's transparent huge page mode: "always", "madvise", or "never" ("" where the
    system has none: not Linux, or the file is missing)."""
    try:
        with open("/sys/kernel/mm/transparent_hugepage/enabled") as f:
            text = f.read()
    except OSError:
        return ""
    start, end = text.find("["), text.find("]")
    return text[start + 1: end] if 0 <= start < end else ""


def _huge_page_memory(n_bytes: int) -> np.ndarray | None:
    """n_bytes of zeroed anonymous memory advised for transparent huge pages (a uint8 array over
    a private anonymous mapping, 2 MiB-aligned by the kernel from this size on), or None where
    huge pages cannot be had (small buffers, no THP, not Linux).

    Why: weights and long KV caches are streamed once per token, and with 4 KiB pages every
    4 KiB of the stream costs a TLB miss and a page walk, which in a virtual machine walks two
    page tables (guest's and host's). On the AMD Zen 4 VM of BENCHMARKS.md a plain read of 1 GiB
    ran at 26.5 GB/s over 4 KiB pages and 31.5 GB/s over huge pages (2 threads)."""
    if n_bytes < HUGE_PAGE_BYTES or not hasattr(mmap, "MADV_HUGEPAGE"):
        return None
    if transparent_huge_pages() not in ("always", "madvise"):
        return None
    size = -(-n_bytes // HUGE_PAGE_BYTES) * HUGE_PAGE_BYTES
    m = mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    m.madvise(mmap.MADV_HUGEPAGE)
    return np.frombuffer(m, dtype=np.uint8, count=n_bytes)


class HostBuffer(Buffer):
    def __init__(self, buft: BufferType, n_bytes: int, usage: BufferUsage = BufferUsage.ANY):
        super().__init__(buft, n_bytes, usage)
        if n_bytes >= CHECKED_ALLOC_BYTES:
            require_host_memory(n_bytes, f"a host buffer ({usage.name.lower()})")
        try:
            # weights and KV caches (streamed every token); compute buffers are reused from
            # cache and touched sparsely
            self._mem = None if usage == BufferUsage.COMPUTE else _huge_page_memory(n_bytes)
            self.huge_pages = self._mem is not None          # advised, not guaranteed
            if self._mem is None:       # over-allocate so the base can be aligned
                self._mem = np.zeros(max(n_bytes, 1) + buft.alignment, dtype=np.uint8)
        except (MemoryError, OSError):
            raise InsufficientMemoryError(f"cannot allocate a host buffer of {n_bytes / GIB:.2f} "
                                          f"GiB ({usage.name.lower()})") from None
        addr = self._mem.ctypes.data
        self._pad = (-addr) % buft.alignment
        self.base = addr + self._pad
        self.array = self._mem[self._pad: self._pad + n_bytes]

    def set_tensor(self, tensor: Tensor, data, offset: int = 0) -> None:
        raw = np.frombuffer(memoryview(data).cast("B"), dtype=np.uint8)
        start = tensor.data - self.base + offset
        if start < 0 or start + raw.size > self.n_bytes:
            raise BackendError(f"set_tensor '{tensor.name}': bytes [{start}, {start + raw.size}) "
                               f"outside the buffer of {self.n_bytes} bytes")
        self.array[start: start + raw.size] = raw

    def get_tensor(self, tensor: Tensor, offset: int = 0, n_bytes: int | None = None) -> bytes:
        start = tensor.data - self.base + offset
        n = tensor.nbytes() - offset if n_bytes is None else n_bytes
        return self.array[start: start + n].tobytes()

    def memset_tensor(self, tensor: Tensor, value: int, offset: int = 0,
                      n_bytes: int | None = None) -> None:
        n = tensor.nbytes() - offset if n_bytes is None else n_bytes
        start = self._range(tensor, offset, n, "memset_tensor")
        self.array[start: start + n] = value & 0xFF

    def clear(self, value: int = 0) -> None:
        self.array[:] = value


def host_array(t: Tensor) -> np.ndarray:
    """A numpy view of a host tensor's memory (writable), in numpy order (reversed ne).
    Quantized tensors come back as uint8 with one row of blocks as the last axis."""
    if t.data is None:
        raise BackendError(f"tensor '{t.name}' has no data (not allocated)")
    span = t.nbytes()
    buf = (ctypes.c_uint8 * max(span, 1)).from_address(t.data)
    if t.type in _NUMPY_DTYPES:
        dt = np.dtype(_NUMPY_DTYPES[t.type])
        return np.ndarray(tuple(reversed(t.ne)), dtype=dt, buffer=buf,
                          strides=tuple(reversed(t.nb)))
    ne, nb = t.ne, t.nb
    return np.ndarray((ne[3], ne[2], ne[1], t.row_bytes()), dtype=np.uint8, buffer=buf,
                      strides=(nb[3], nb[2], nb[1], 1))


def set_host_data(t: Tensor, values) -> None:
    """Write `values` (numpy-order shape of t, or raw bytes for quantized types) into t."""
    dst = host_array(t)
    if isinstance(values, (bytes, bytearray, memoryview)):
        raw = np.frombuffer(memoryview(values).cast("B"), dtype=np.uint8)
        dst[...] = raw.view(dst.dtype).reshape(dst.shape)
    elif t.type in _NUMPY_DTYPES:
        dst[...] = np.asarray(values).reshape(dst.shape)
    else:
        dst[...] = np.frombuffer(memoryview(values).cast("B"), dtype=np.uint8).reshape(dst.shape)


# ---- marshalling ---------------------------------------------------------------------------------

class CpuGraphPlan:
    """A graph marshalled for pg_graph_compute: the pg_tensor array, the node order and a work
    buffer. Recomputing reuses all three; `refresh_data` re-reads the tensors' addresses.

    The C executor validates the array once per plan (`validated`; again after `refresh_data`
    changed addresses) and each compute of a validated plan skips the per-node checks
    (pg_graph_compute_validated: ~35 us a decoded token on an 874-node graph). Nothing else
    writes `arr` or `order` after construction."""

    def __init__(self, nodes: list[Tensor], leafs: list[Tensor], n_threads: int):
        tensors: list[Tensor] = []
        index: dict[int, int] = {}

        def add(t: Tensor) -> int:
            i = index.get(id(t))
            if i is None:
                i = index[id(t)] = len(tensors)
                tensors.append(t)
            return i

        for t in leafs:
            add(t)
        for t in nodes:                 # sources outside the node/leaf lists (split inputs)
            for s in t.src:
                if s is not None:
                    add(s)
        order = [add(t) for t in nodes]
        self.tensors = tensors
        self.n_threads = n_threads
        arr = np.zeros(len(tensors), dtype=PG_TENSOR_DTYPE)
        arr["type"] = [int(t.type) for t in tensors]
        arr["op"] = [int(t.op) for t in tensors]
        arr["ne"] = [t.ne for t in tensors]
        arr["nb"] = [t.nb for t in tensors]
        arr["op_params"] = np.frombuffer(b"".join(bytes(t.op_params) for t in tensors),
                                         dtype="<i4").reshape(len(tensors), 16)
        src = np.full((len(tensors), 10), -1, dtype=np.int32)
        for i, t in enumerate(tensors):
            for k, s in enumerate(t.src):
                if s is not None:       # -1: a source of an outside tensor (computed elsewhere)
                    src[i, k] = index.get(id(s), -1)
        arr["src"] = src
        arr["flags"] = [int(t.flags) for t in tensors]
        arr["name"] = [t.name.encode("utf-8", "replace")[:47] for t in tensors]
        self.arr = arr
        self.order = np.asarray(order, dtype=np.int32)
        self.refresh_data()
        self._check_data()
        self.work = np.zeros(0, dtype=np.uint8)
        self._validate_and_size()
        # the C side's kept plan (pg_plan): the executor's schedule and work size made once,
        # not per compute; it borrows arr and order, which live as long as this object. None
        # with a library older than it (tools/ab_libs.py): computes make them each time.
        self.handle = None
        try:
            new, free = _native.fn("pg_plan_new"), _native.fn("pg_plan_free")
        except NativeLibraryError:
            return
        self.handle = new(arr.ctypes.data, len(tensors), self.order.ctypes.data, len(self.order))
        if self.handle:
            weakref.finalize(self, free, self.handle)

    def n_schedules(self) -> int:
        """Schedules the kept plan has made (one per set of tensor addresses it was computed
        with; 0 before the first compute, -1 without a kept plan)."""
        return int(_native.fn("pg_plan_n_schedules")(self.handle)) if self.handle else -1

    def schedule_stats(self) -> tuple[int, int]:
        """(barriers, fused nodes) of one compute under the C executor's schedule (graph.c): a
        barrier only where a node needs another thread's results, element-wise nodes after a
        decode MUL_MAT computed inside it. Without the schedule: one barrier per computed node."""
        nb, nf = ctypes.c_int32(0), ctypes.c_int32(0)
        _native.check(_native.fn("pg_graph_schedule_stats")(
            self.arr.ctypes.data, len(self.tensors), self.order.ctypes.data, len(self.order),
            ctypes.byref(nb), ctypes.byref(nf)), "pg_graph_schedule_stats")
        return nb.value, nf.value

    def refresh_data(self) -> None:
        self.generation = placement_generation()
        self.arr["data"] = [t.data or 0 for t in self.tensors]
        self.validated = False

    def _check_data(self) -> None:
        for i in self.order:
            t = self.tensors[i]
            if t.op in VIEW_OPS:
                continue
            for s in [t] + [x for x in t.src if x is not None]:
                if s.data is None and s.nbytes() > 0:
                    what = "its output" if s is t else f"its source '{s.name}'"
                    raise BackendError(f"node '{t.name}' ({t.op.name}): {what} has no data "
                                       f"address; allocate the graph before computing it")

    def _validate_and_size(self) -> None:
        bad = ctypes.c_int32(-1)
        p = self.arr.ctypes.data
        st = _native.fn("pg_graph_validate")(p, len(self.tensors), self.order.ctypes.data,
                                             len(self.order), ctypes.byref(bad))
        if st != _native.PG_OK:
            raise _node_error(self.arr, self.tensors, bad.value, st)
        size = ctypes.c_size_t(0)
        _native.check(_native.fn("pg_graph_work_size")(p, len(self.tensors), self.order.ctypes.data,
                                                       len(self.order), self.n_threads,
                                                       ctypes.byref(size)), "pg_graph_work_size")
        if size.value > self.work.size:
            self.work = np.zeros(size.value, dtype=np.uint8)
        self.validated = True


def _node_error(arr, tensors, i: int, status: int) -> Exception:
    if i < 0:
        return BackendError(f"graph rejected by the CPU executor: {_native.STATUS_NAMES.get(status)}")
    reason = ctypes.create_string_buffer(160)
    _native.fn("pg_node_supported")(arr.ctypes.data, len(tensors), i, reason, 160)
    t = tensors[i]
    srcs = ", ".join(f"{s.name}:{s.type.name}{list(s.ne)}" for s in t.src if s is not None)
    cls = UnsupportedOpError if status == _native.PG_ERR_UNSUPPORTED else BackendError
    return cls(f"CPU cannot compute node '{t.name}' ({t.op.name} -> {t.type.name}{list(t.ne)}"
               f" from {srcs or 'nothing'}): {reason.value.decode()}")


# ---- device, registry entry, events --------------------------------------------------------------

def _cpu_description() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                if line.startswith(("model name", "Model")):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "CPU"


class CpuDevice(Device):
    """The host processor and its memory."""

    name = "CPU"
    type = DeviceType.CPU

    def __init__(self):
        self._description: str | None = None
        self._buft = HostBufferType(device=self)

    @property
    def description(self) -> str:   # read lazily: /proc/cpuinfo is not free
        if self._description is None:
            self._description = _cpu_description()
        return self._description

    def memory(self) -> tuple[int, int]:
        import psutil
        vm = psutil.virtual_memory()
        return int(vm.available), int(vm.total)

    def buffer_types(self) -> list[BufferType]:
        return [self._buft]

    def host_buffer_type(self) -> BufferType:
        return self._buft

    def has_events(self) -> bool:
        return True

    def init_backend(self, n_threads: int | None = None, n_threads_batch: int | None = None,
                     **_ignored) -> "CpuBackend":
        return CpuBackend(n_threads, n_threads_batch)


_cpu_device: CpuDevice | None = None


def cpu_device() -> CpuDevice:
    """The process-wide CPU device."""
    global _cpu_device
    if _cpu_device is None:
        _cpu_device = CpuDevice()
    return _cpu_device


def cpu_buffer_type() -> HostBufferType:
    """The CPU device's host buffer type (one object per process)."""
    return cpu_device().default_buffer_type()


def backend_reg() -> BackendReg:
    """The CPU backend module's registry entry: one CPU device."""
    return BackendReg("CPU", [cpu_device()])


class CpuEvent(Event):
    """The CPU computes synchronously: recorded work is always done."""

    def record(self) -> None:
        pass

    def synchronize(self) -> None:
        pass


# ---- the backend ---------------------------------------------------------------------------------

class CpuBackend(Backend):
    """Computes graphs on host memory with the C executor.

    n_threads: threads for single-token work; n_threads_batch: for batches (defaults to
    n_threads). The thread pool is created once, sized for the larger of the two."""

    name = "CPU"

    def __init__(self, n_threads: int | None = None, n_threads_batch: int | None = None):
        self.n_threads = _thread_count("n_threads", n_threads or default_n_threads(), MAX_THREADS)
        self.n_threads_batch = _thread_count("n_threads_batch", n_threads_batch or self.n_threads,
                                             MAX_THREADS)
        self.device = cpu_device()
        self.buft = cpu_buffer_type()
        self._tp = _native.fn("pg_threadpool_new")(max(self.n_threads, self.n_threads_batch))
        if not self._tp:
            raise BackendError("could not create the CPU thread pool")
        self._finalizer = weakref.finalize(self, _native.fn("pg_threadpool_free"), self._tp)
        self._closed = False
        self._plans: "weakref.WeakKeyDictionary[Graph, tuple]" = weakref.WeakKeyDictionary()
        self._eval_cb = None
        self._support_cache: dict[tuple, str | None] = {}
        self.n_plans_built = 0     # counters for tests and benchmarks
        self.n_computes = 0
        self.n_threads_active: int | None = None

    def set_n_threads(self, n: int | None) -> None:
        """Threads for the next computes (the model runtime sets n_threads for single tokens and
        n_threads_batch for batches, like ggml_backend_cpu_set_n_threads); None: decide per
        graph."""
        if n is not None:
            n = _thread_count("n_threads", n, max(self.n_threads, self.n_threads_batch))
        self.n_threads_active = n

    def close(self) -> None:
        """Free the thread pool (again: no-op). Computing afterwards raises ClosedError; the C
        library refuses the freed pool too (PG_ERR_CLOSED), so a compute racing with close()
        ends in the same error, never a hang."""
        self._closed = True
        self._finalizer()

    # -- capability queries --
    def get_default_buffer_type(self) -> BufferType:
        return self.buft

    def supports_buft(self, buft: BufferType) -> bool:
        return buft.is_host

    def supports_op(self, node: Tensor) -> bool:
        return self.why_unsupported(node) is None

    def why_unsupported(self, node: Tensor) -> str | None:
        """None if the CPU can compute `node`, else the reason (layouts and types only: data
        addresses are not needed). Answers are cached by op, types, shapes, strides and
        op_params, so the scheduler can ask for every node of every graph."""
        if node.op in VIEW_OPS or node.op == Op.NONE:
            return None
        key = (node.op, node.type, node.ne, node.nb, bytes(node.op_params),
               tuple(None if s is None else (s.type, s.ne, s.nb) for s in node.src))
        cache = self._support_cache
        if key in cache:
            return cache[key]
        if len(cache) >= 1 << 16:
            cache.clear()
        reason = cache[key] = self._why_unsupported(node)
        return reason

    def _why_unsupported(self, node: Tensor) -> str | None:
        tensors = [node] + [s for s in node.src if s is not None]
        arr = np.zeros(len(tensors), dtype=PG_TENSOR_DTYPE)
        for i, t in enumerate(tensors):
            arr[i]["type"], arr[i]["op"] = int(t.type), int(t.op)
            arr[i]["ne"], arr[i]["nb"] = t.ne, t.nb
            arr[i]["op_params"] = np.frombuffer(bytes(t.op_params), dtype="<i4")
            arr[i]["data"] = 64        # any non-null address: only layouts are checked here
            arr[i]["src"] = -1
        k = 1
        for j, s in enumerate(node.src):
            if s is not None:
                arr[0]["src"][j] = k
                k += 1
        reason = ctypes.create_string_buffer(160)
        st = _native.fn("pg_node_supported")(arr.ctypes.data, len(tensors), 0, reason, 160)
        return None if st == _native.PG_OK else reason.value.decode()

    # -- events (no-ops: the CPU is synchronous) --
    def event_new(self) -> CpuEvent:
        return CpuEvent(self)

    def event_wait(self, event: Event) -> None:
        event.synchronize()

    # -- compute --
    def set_eval_callback(self, cb) -> None:
        """cb(tensor, numpy view of its output) -> bool (False stops the graph), called after each
        computed node; None to remove. Costs nothing when unset."""
        self._eval_cb = cb

    def plan(self, graph: Graph, n_threads: int | None = None) -> CpuGraphPlan:
        """The marshalled form of `graph`, cached while graph.uid is unchanged."""
        nt = n_threads or self._threads_for(graph)
        cached = self._plans.get(graph)
        if cached is not None and cached[0] == graph.uid and cached[1].n_threads >= nt:
            p = cached[1]
            if p.generation != placement_generation():     # some tensor moved: re-read addresses
                p.refresh_data()
                p._check_data()
                p._validate_and_size()                     # the C checks see the new addresses
            return p
        p = CpuGraphPlan(graph.nodes, graph.leafs, nt)
        self._plans[graph] = (graph.uid, p)
        self.n_plans_built += 1
        return p

    def kept_plan(self, graph: Graph, n_threads: int) -> CpuGraphPlan | None:
        """The plan `plan(graph, n_threads)` would return as it is (same uid, no tensor moved,
        validated, a kept C plan, enough threads), or None when it would make or refresh one;
        also None with an eval callback or after close()."""
        cached = self._plans.get(graph)
        if (cached is None or cached[0] != graph.uid or self._eval_cb is not None
                or self._closed):
            return None
        p = cached[1]
        ok = (p.n_threads >= n_threads and p.handle and p.validated
              and p.generation == placement_generation())
        return p if ok else None

    def runs_plans(self, n_threads: int) -> bool:
        """Whether a compute runs its kept plan as it is with n_threads threads: open, no eval
        callback, n_threads still the decode threads (kept_plan's checks of the backend; the
        plan's own hold while its graph's uid and the tensors' placements do)."""
        return self._eval_cb is None and not self._closed and self.n_threads == n_threads

    def _threads_for(self, graph: Graph) -> int:
        if self.n_threads_active:
            return self.n_threads_active
        # single-token work (every node has at most one row per sequence) uses n_threads
        big = any((t.op == Op.MUL_MAT and t.ne[1] > 1) or (t.op == Op.MUL_MAT_ID and t.ne[2] > 1)
                  for t in graph.nodes[-8:])
        return self.n_threads_batch if big else self.n_threads

    def graph_compute(self, graph: Graph, n_threads: int | None = None) -> None:
        """Compute every node of `graph` (tensors must have host data addresses)."""
        nt = n_threads or self._threads_for(graph)
        self.plan_compute(self.plan(graph, nt), nt)

    def plan_compute(self, plan: CpuGraphPlan, n_threads: int | None = None) -> None:
        if self._closed:        # first: a later pool may have been given the freed one's address
            raise ClosedError("the CPU backend was closed (its thread pool is freed)")
        nt = min(n_threads or plan.n_threads, plan.n_threads)
        bad = ctypes.c_int32(-1)
        cb = EVAL_CB()
        raised: list[BaseException] = []
        if self._eval_cb is not None:
            user_cb, tensors = self._eval_cb, plan.tensors

            def _trampoline(i, _t, _u):
                t = tensors[i]
                try:
                    return 0 if user_cb(t, host_array(t)) is not False else 1
                except BaseException as e:  # cannot cross C frames: stop, re-raise after
                    raised.append(e)
                    return 1
            cb = EVAL_CB(_trampoline)
        work = plan.work.ctypes.data if plan.work.size else None
        if plan.handle and plan.validated and self._eval_cb is None:
            # the kept plan: its schedule is made again only when its tensors moved
            st = _native.fn("pg_plan_compute")(plan.handle, self._tp, nt, work, plan.work.size,
                                               ctypes.byref(bad))
        else:
            st = _compute_fn(plan.validated)(
                plan.arr.ctypes.data, len(plan.tensors), plan.order.ctypes.data,
                len(plan.order), self._tp, nt, work, plan.work.size, cb, None, ctypes.byref(bad))
        self.n_computes += 1
        if raised:
            raise raised[0]
        if st != _native.PG_OK:
            if st == _native.PG_ERR_ABORTED:
                raise ComputeAbortedError("graph stopped by the evaluation callback")
            if st == _native.PG_ERR_INTERNAL:
                raise BackendError("pg_graph_compute: internal error in libpyggml (a bug: please "
                                   "report it with the graph)")
            if st == _native.PG_ERR_CLOSED:
                raise ClosedError("the CPU backend's thread pool was freed (closed) before this "
                                  "compute started")
            if bad.value >= 0:
                t = plan.tensors[bad.value]
                raise BackendError(f"node '{t.name}' ({t.op.name}) met bad data while computing "
                                   f"(e.g. a row index or expert id outside its source)")
            raise _node_error(plan.arr, plan.tensors, bad.value, st)
