"""Backend interfaces: ggml-backend's levels as small Python classes.

    Registry ──► BackendReg (one per backend module: cpu, vulkan, ...)
                   └─► Device (name, type, memory, its buffer types)
                         ├─► BufferType (name, alignment, max_size, is_host) ─► Buffer (bytes)
                         └─► Backend (a stream of work on the device) ─► Event (a marker in it)

What the scheduler (pyggml.sched) relies on, and nothing else:

- `Backend.supports_op(node)`: can this backend compute `node` with these types and layouts?
  Layouts only: `node.data` may still be None. VIEW/RESHAPE/PERMUTE/TRANSPOSE and NONE are
  always supported (they compute nothing). Called often: make it cheap or cache it.
- `Backend.supports_buft(buft)`: can its kernels read and write memory of that buffer type
  directly? (CPU: every host buffer type.)
- `Backend.offload_op(node)`: although the node's weight is in host memory, is it worth
  computing here (the weight is then copied in)? Default False.
- `Backend.graph_compute(graph)`: compute `graph.nodes` in order. Every source of a non-view
  node lives in memory this backend supports (the scheduler copied it there); view ops are
  no-ops and may live anywhere. May return before the work is done (then `synchronize()` waits);
  but everything it needs from the Python tensors (ops, shapes, sources, addresses) must be read
  before it returns: the scheduler may rewire sources for the next batch while this one runs.
  The same graph object with the same `graph.uid` is passed again on graph reuse (same tensors,
  same addresses): cache whatever was prepared for it (CPU: the marshalled node array; Vulkan: a
  recorded command buffer) keyed by the graph object and its uid. A new uid means: prepare again.
  Addresses can still move under the same uid (an allocator placing the graph in other memory,
  code assigning `data`): compare `pyggml.tensor.placement_generation()` with the one you
  prepared at (O(1)) and re-read addresses only when it moved.
- `Backend.synchronize()`: block until all work queued on this backend is done.
- `Backend.event_new()` → Event or None (no events: the scheduler synchronizes instead);
  `Event.record()`, `Event.synchronize()`, `Backend.event_wait(event)`.
- `Backend.cpy_tensor_async(src, dst)` → bool: optional fast copy into this backend's memory
  (False = not done, the scheduler then copies synchronously with `tensor_copy`).
- `BufferType.alloc_buffer(n_bytes, usage)` → Buffer; `Buffer.set_tensor / get_tensor /
  memset_tensor / cpy_tensor / clear`. A Buffer has an integer `base`; a tensor placed in it has
  `data = base + offset` and `buffer = that Buffer`. For a host buffer `base` is a real address
  the C library may use; for device memory it is an opaque number only the buffer interprets.

Weights: a Buffer with `usage == BufferUsage.WEIGHTS`. The scheduler places an op next to its
weights (pass 1) and, when a weight must be copied to another device, copies host weights last.

Free functions at the bottom work on any tensor whatever its memory: `tensor_set`, `tensor_get`,
`tensor_copy`, `alloc_tensors` (place tensors in one new buffer, e.g. weights on a device).
"""

from __future__ import annotations

import ctypes
import importlib
from dataclasses import dataclass
from enum import Enum

import numpy as np

from pyggml.errors import BackendError, InvalidArgumentError

# ---- kinds -------------------------------------------------------------------------------------


class BufferUsage(Enum):
    ANY = 0
    WEIGHTS = 1
    COMPUTE = 2


class DeviceType(Enum):
    CPU = "CPU"         # the host processor; always present, always last in priority
    GPU = "GPU"         # a discrete GPU with its own memory
    IGPU = "IGPU"       # an integrated GPU (shares host memory, may still need copies)
    ACCEL = "ACCEL"     # an accelerator working on host memory (BLAS-like)


# ---- memory ------------------------------------------------------------------------------------

class BufferType:
    """A kind of memory a device offers.

    alignment: every tensor offset is a multiple of it (a power of two); max_size: the largest
    single allocation (None = no limit); is_host: the CPU can read and write it at `data`
    directly; device: the Device it belongs to (None for free-standing types)."""

    def __init__(self, name: str, alignment: int = 64, max_size: int | None = None,
                 is_host: bool = True, device: "Device | None" = None):
        if alignment <= 0 or alignment & (alignment - 1):
            raise InvalidArgumentError(f"buffer type '{name}': alignment must be a power of "
                                       f"two, got {alignment}")
        self.name = name
        self.alignment = alignment
        self.max_size = max_size
        self.is_host = is_host
        self.device = device

    def alloc_buffer(self, n_bytes: int, usage: BufferUsage = BufferUsage.ANY) -> "Buffer":
        """A new buffer of n_bytes (its `base` aligned to `alignment`)."""
        raise NotImplementedError(f"buffer type '{self.name}' cannot allocate memory")

    def get_alloc_size(self, tensor) -> int:
        """Bytes `tensor` needs in this memory (may exceed tensor.nbytes(), e.g. for padding)."""
        return tensor.nbytes()

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name!r})"


class Buffer:
    """One allocation of `buft`, `n_bytes` long, starting at the integer `base`.

    Tensors placed in it have data = base + offset. Methods take the tensor (its `data` says
    where) and a byte offset inside the tensor."""

    def __init__(self, buft: BufferType, n_bytes: int, usage: BufferUsage = BufferUsage.ANY):
        self.buft = buft
        self.n_bytes = n_bytes
        self.usage = usage
        self.base = 0

    @property
    def is_host(self) -> bool:
        return self.buft.is_host

    @property
    def name(self) -> str:
        return self.buft.name

    def contains(self, tensor, n_bytes: int | None = None) -> bool:
        """Whether [tensor.data, tensor.data + n_bytes) lies inside this buffer."""
        if tensor.data is None:
            return False
        n = tensor.nbytes() if n_bytes is None else n_bytes
        return self.base <= tensor.data and tensor.data + n <= self.base + self.n_bytes

    def _range(self, tensor, offset: int, n_bytes: int, what: str) -> int:
        """Start of [offset, offset + n_bytes) of `tensor` relative to base; checked."""
        if tensor.data is None:
            raise BackendError(f"{what} '{tensor.name}': the tensor has no data (not allocated)")
        start = tensor.data - self.base + offset
        if offset < 0 or n_bytes < 0 or start < 0 or start + n_bytes > self.n_bytes:
            raise BackendError(f"{what} '{tensor.name}': bytes [{start}, {start + n_bytes}) are "
                               f"outside the {self.name} buffer of {self.n_bytes} bytes")
        return start

    def set_tensor(self, tensor, data, offset: int = 0) -> None:
        """Write the bytes of `data` (bytes-like) at `offset` inside `tensor`."""
        raise NotImplementedError

    def get_tensor(self, tensor, offset: int = 0, n_bytes: int | None = None) -> bytes:
        """Read n_bytes (default: to the tensor's end) from `offset` inside `tensor`."""
        raise NotImplementedError

    def get_tensor_into(self, tensor, out: memoryview, offset: int = 0) -> None:
        """Read out.nbytes bytes from `offset` inside `tensor` into the writable bytes `out`
        (default: through get_tensor; a buffer that can receive in place overrides it)."""
        out[:] = self.get_tensor(tensor, offset, out.nbytes)

    def memset_tensor(self, tensor, value: int, offset: int = 0,
                      n_bytes: int | None = None) -> None:
        """Fill bytes of `tensor` with `value` (default: from offset to its end)."""
        n = tensor.nbytes() - offset if n_bytes is None else n_bytes
        self.set_tensor(tensor, bytes([value & 0xFF]) * n, offset)

    def cpy_tensor(self, src, dst) -> bool:
        """Copy all of `src` into `dst` (which lives in this buffer) if this buffer knows how to
        reach src's memory; False otherwise (the caller then stages through host bytes).
        Default: from host memory only."""
        if not is_host_tensor(src):
            return False
        self.set_tensor(dst, _host_view(src.data, src.nbytes()))
        return True

    def clear(self, value: int = 0) -> None:
        """Fill the whole buffer with `value`."""
        raise NotImplementedError

    def __repr__(self) -> str:
        return (f"{type(self).__name__}({self.name!r}, {self.n_bytes} bytes, "
                f"{self.usage.name.lower()})")


# ---- compute -----------------------------------------------------------------------------------

class Event:
    """A marker in a backend's stream of work (ggml_backend_event). `record()` places it after the
    work queued so far; `synchronize()` blocks until that work is done; another backend can
    queue a wait on it with `backend.event_wait(event)`. A wait binds to the record current when
    the wait is asked for (as CUDA/Vulkan stream waits do), not to a later re-record: the
    scheduler queues a wait and then records the same event again on the same stream."""

    def __init__(self, backend: "Backend"):
        self.backend = backend

    def record(self) -> None:
        raise NotImplementedError

    def synchronize(self) -> None:
        raise NotImplementedError


class Backend:
    """Computes graphs on one device (see the module docstring for the contract).

    Subclasses set `name` and `device` and implement supports_op, supports_buft and
    graph_compute; the rest has working defaults for a synchronous backend without events."""

    name: str = "?"
    device: "Device | None" = None

    # -- capabilities --
    def get_default_buffer_type(self) -> BufferType:
        """The buffer type the scheduler allocates this backend's compute memory in."""
        if self.device is None:
            raise NotImplementedError(f"backend '{self.name}' has no device")
        return self.device.default_buffer_type()

    def supports_op(self, node) -> bool:
        raise NotImplementedError

    def supports_buft(self, buft: BufferType) -> bool:
        raise NotImplementedError

    #: a matrix product over at least this many rows is worth copying a host weight for
    #: (offload_op); None: this backend never takes ops from host weights
    offload_min_batch: int | None = None

    def offload_op(self, node) -> bool:
        return False

    # -- compute --
    def graph_compute(self, graph) -> None:
        raise NotImplementedError

    def synchronize(self) -> None:
        pass

    # -- data in and out (may be queued on the backend's stream; default: synchronous) --
    def set_tensor_async(self, tensor, data, offset: int = 0) -> None:
        tensor_set(tensor, data, offset)

    def get_tensor_async(self, tensor, offset: int = 0, n_bytes: int | None = None) -> bytes:
        return tensor_get(tensor, offset, n_bytes)

    def cpy_tensor_async(self, src, dst) -> bool:
        """Copy src into dst (dst in this backend's memory) on this backend's stream; False
        when not supported (the caller copies synchronously)."""
        return False

    def compile_input_copies(self, copies, backends):
        """A function that does a split's input copies at once, built once per split and
        called before each of its computes; None (the default): the scheduler copies them one
        by one. copies: the split's copy plan, (source, destination in this backend's memory,
        source backend index into `backends`, is a user input). It must leave the same bytes
        as the one-by-one copies and wait for the sources as they do."""
        return None

    # -- events --
    def event_new(self) -> Event | None:
        """A new event on this backend, or None when it has none (callers synchronize)."""
        return None

    def event_wait(self, event: Event) -> None:
        """Make the work queued on this backend from now on wait for `event`."""
        event.synchronize()

    def close(self) -> None:
        pass

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name!r})"


# ---- devices and their registry ----------------------------------------------------------------

@dataclass(frozen=True)
class DeviceProps:
    name: str
    description: str
    type: DeviceType
    memory_free: int
    memory_total: int
    buffer_types: tuple[str, ...]
    host_buffer_type: str | None
    events: bool


class Device:
    """One device of a backend module: CPU, a GPU, an accelerator.

    Subclasses set name, description and type and implement memory(), buffer_types() and
    init_backend(). `reg` is set by the BackendReg that lists the device."""

    name: str = "?"
    description: str = ""
    type: DeviceType = DeviceType.CPU
    reg: "BackendReg | None" = None

    def memory(self) -> tuple[int, int]:
        """(free, total) bytes of this device's memory."""
        raise NotImplementedError

    def buffer_types(self) -> list[BufferType]:
        """The buffer types of this device; the first is its default."""
        raise NotImplementedError

    def default_buffer_type(self) -> BufferType:
        return self.buffer_types()[0]

    def host_buffer_type(self) -> BufferType | None:
        """Host memory this device reads fast (pinned/staging), or None."""
        return None

    def init_backend(self, **params) -> Backend:
        raise NotImplementedError

    def has_events(self) -> bool:
        return False

    # -- facts the memory planner asks (the backend knows them; the planner never re-derives) --
    def uma_reason(self) -> str | None:
        """Why this device's memory is system RAM (UMA), or None when it has its own."""
        if self.type == DeviceType.CPU:
            return "the host itself"
        if self.type == DeviceType.IGPU:
            return "the driver reports an integrated GPU"
        return None

    def staging_bytes(self, largest_transfer: int) -> int:
        """Host memory this device's backend allocates to move up to `largest_transfer` bytes
        in or out at once (0: the host writes its memory directly)."""
        return 0

    def is_software(self) -> bool:
        """A device that computes on the host's CPU cores through a driver (e.g. lavapipe):
        slower than the CPU backend, so never chosen unless named."""
        return False

    def props(self) -> DeviceProps:
        free, total = self.memory()
        host = self.host_buffer_type()
        return DeviceProps(self.name, self.description, self.type, free, total,
                           tuple(b.name for b in self.buffer_types()),
                           None if host is None else host.name, self.has_events())

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name!r}, {self.type.value})"


class BackendReg:
    """The devices of one backend module (ggml_backend_reg)."""

    def __init__(self, name: str, devices=()):
        self.name = name
        self._devices = list(devices)
        for d in self._devices:
            d.reg = self

    def devices(self) -> list[Device]:
        return list(self._devices)

    def __repr__(self) -> str:
        return f"BackendReg({self.name!r}, {len(self._devices)} device(s))"


class Registry:
    """Devices from every backend module, in priority order: accelerators first, CPU last.

    modules: backend modules to load; each offers `backend_reg() -> BackendReg | None` (None:
    no hardware). A module that cannot be imported or finds no device is skipped; the reason
    is kept in `load_errors` (module -> text). `register(reg)` adds a BackendReg by hand (tests
    use it for their test devices)."""

    DEFAULT_MODULES = ("pyggml.backend.vulkan", "pyggml.backend.rpc", "pyggml.backend.cpu")

    def __init__(self, modules=DEFAULT_MODULES):
        self._regs: list[BackendReg] = []
        self.load_errors: dict[str, str] = {}
        for mod in modules:
            self.load_module(mod)

    def load_module(self, module: str) -> BackendReg | None:
        try:
            m = importlib.import_module(module)
            fn = getattr(m, "backend_reg", None)
            if fn is None:
                raise BackendError(f"module {module} has no backend_reg()")
            reg = fn()
        except Exception as e:  # a broken or absent backend must not break the others
            self.load_errors[module] = f"{type(e).__name__}: {e}"
            return None
        if reg is None:
            self.load_errors[module] = "no device found"
            return None
        self.register(reg)
        return reg

    def register(self, reg: BackendReg) -> None:
        if any(r is reg for r in self._regs):
            return
        self._regs.append(reg)

    def unregister(self, reg: BackendReg) -> None:
        self._regs = [r for r in self._regs if r is not reg]

    def backend_regs(self) -> list[BackendReg]:
        return list(self._regs)

    def devices(self) -> list[Device]:
        """Every device; non-CPU devices in registration order, then CPU devices."""
        devs = [d for r in self._regs for d in r.devices()]
        return ([d for d in devs if d.type != DeviceType.CPU]
                + [d for d in devs if d.type == DeviceType.CPU])

    def device(self, name: str) -> Device:
        for d in self.devices():
            if d.name.lower() == name.lower():
                return d
        known = ", ".join(d.name for d in self.devices()) or "none"
        raise BackendError(f"no device named '{name}' (known: {known})")

    def devices_of_type(self, type_: DeviceType) -> list[Device]:
        return [d for d in self.devices() if d.type == type_]

    def init_backends(self, names=None, **params) -> list[Backend]:
        """One backend per device (or per name in `names`), in priority order, CPU last: what
        Scheduler(backends) expects. params go to every init_backend."""
        devs = self.devices() if names is None else [self.device(n) for n in names]
        devs = ([d for d in devs if d.type != DeviceType.CPU]
                + [d for d in devs if d.type == DeviceType.CPU])
        return [d.init_backend(**params) for d in devs]


_default_registry: Registry | None = None


def default_registry(create: bool = True) -> Registry | None:
    """The process-wide registry of the default backend modules, built on first use (create
    False: None while it was not built; building it loads every backend module)."""
    global _default_registry
    if _default_registry is None and create:
        _default_registry = Registry()
    return _default_registry


# ---- tensor data, whatever its memory ----------------------------------------------------------

def _host_view(addr: int, n_bytes: int) -> memoryview:
    return memoryview((ctypes.c_char * n_bytes).from_address(addr)).cast("B")


def is_host_buffer(buf) -> bool:
    """Host memory: a Buffer whose type is host, any object with `is_host` True (e.g. a mapped
    GGUF file), or a numpy array."""
    if buf is None:
        return False
    flag = getattr(buf, "is_host", None)
    if isinstance(flag, bool):
        return flag
    buft = getattr(buf, "buft", None)
    if buft is not None:
        return bool(buft.is_host)
    return hasattr(buf, "ctypes")          # numpy array


def buffer_usage(buf) -> BufferUsage:
    return getattr(buf, "usage", None) or BufferUsage.ANY


def is_host_tensor(t) -> bool:
    """t has data the CPU can read at t.data (a host buffer, or data without a buffer: a
    Context arena)."""
    if t.data is None:
        return False
    return t.buffer is None or is_host_buffer(t.buffer)


def _check_span(t, offset: int, n_bytes: int, what: str) -> None:
    if t.data is None:
        raise BackendError(f"{what} '{t.name}': the tensor has no data (not allocated)")
    if offset < 0 or n_bytes < 0 or offset + n_bytes > t.nbytes():
        raise BackendError(f"{what} '{t.name}': bytes [{offset}, {offset + n_bytes}) outside the "
                           f"tensor's {t.nbytes()} bytes")


def _check_writable(t, what: str) -> None:
    mm = getattr(t.buffer, "memmap", None)          # a GGUF file mapped read-only
    if mm is not None and not mm.flags.writeable:
        raise BackendError(f"{what} '{t.name}': its memory ({t.buffer!r}) is read-only")


def _bytes_of(data) -> np.ndarray:
    """A uint8 view (no copy where possible) of bytes-like data or a numpy array."""
    if isinstance(data, np.ndarray):
        return np.ascontiguousarray(data).reshape(-1).view(np.uint8)
    return np.frombuffer(memoryview(data).cast("B"), dtype=np.uint8)


def tensor_set(t, data, offset: int = 0) -> None:
    """Write bytes-like `data` (or a numpy array's bytes) into t at byte `offset`."""
    raw = _bytes_of(data)
    _check_span(t, offset, raw.size, "tensor_set")
    _check_writable(t, "tensor_set")
    if is_host_tensor(t):
        if raw.size:
            ctypes.memmove(t.data + offset, raw.ctypes.data, raw.size)
    else:
        t.buffer.set_tensor(t, raw, offset)


def tensor_get(t, offset: int = 0, n_bytes: int | None = None) -> bytes:
    """Read n_bytes (default: to the end) of t from byte `offset`."""
    n = t.nbytes() - offset if n_bytes is None else n_bytes
    _check_span(t, offset, n, "tensor_get")
    if is_host_tensor(t):
        return ctypes.string_at(t.data + offset, n)
    return t.buffer.get_tensor(t, offset, n)


def tensor_get_into(t, out: np.ndarray, offset: int = 0) -> np.ndarray:
    """Read out.nbytes bytes of t from byte `offset` into the C-contiguous array `out` (no
    intermediate bytes object where the buffer can receive in place); returns out."""
    if not out.flags.c_contiguous or not out.flags.writeable:
        raise BackendError(f"tensor_get_into '{t.name}': the destination must be a writable "
                           f"C-contiguous array")
    n = out.nbytes
    _check_span(t, offset, n, "tensor_get_into")
    if n == 0:
        return out
    if is_host_tensor(t):
        ctypes.memmove(out.ctypes.data, t.data + offset, n)
    else:
        t.buffer.get_tensor_into(t, memoryview(out).cast("B"), offset)
    return out


def tensor_copy(src, dst) -> None:
    """Copy all bytes of src into dst (same byte size), across any two memories
    (ggml_backend_tensor_copy)."""
    n = src.nbytes()
    if dst.nbytes() != n:
        raise BackendError(f"tensor_copy '{src.name}' -> '{dst.name}': {n} bytes into "
                           f"{dst.nbytes()} bytes")
    if src.data is None or dst.data is None:
        which = src if src.data is None else dst
        raise BackendError(f"tensor_copy '{src.name}' -> '{dst.name}': '{which.name}' has no "
                           f"data (not allocated)")
    if n == 0:
        return
    _check_writable(dst, "tensor_copy into")
    src_host, dst_host = is_host_tensor(src), is_host_tensor(dst)
    if src_host and dst_host:
        ctypes.memmove(dst.data, src.data, n)
    elif src_host:
        dst.buffer.set_tensor(dst, _host_view(src.data, n))
    elif dst_host:
        ctypes.memmove(dst.data, src.buffer.get_tensor(src, 0, n), n)
    elif not dst.buffer.cpy_tensor(src, dst):
        dst.buffer.set_tensor(dst, src.buffer.get_tensor(src, 0, n))


def alloc_tensors(buft: BufferType, tensors, usage: BufferUsage = BufferUsage.WEIGHTS) -> Buffer:
    """Place `tensors` in one new buffer of `buft` (ggml_backend_alloc_ctx_tensors_from_buft):
    each non-view tensor gets an aligned offset; views get their source's address. Returns the
    buffer (keep it alive while the tensors are used)."""
    tensors = list(tensors)
    owners = [t for t in tensors if t.view_src is None]
    for t in owners:
        if t.data is not None:
            raise BackendError(f"alloc_tensors: tensor '{t.name}' already has data")
    a = buft.alignment
    offs, size = [], 0
    for t in owners:
        offs.append(size)
        size += (buft.get_alloc_size(t) + a - 1) // a * a
    buf = buft.alloc_buffer(max(size, a), usage)
    for t, off in zip(owners, offs):
        t.data, t.buffer = buf.base + off, buf
    for t in tensors:
        if t.view_src is not None:
            vs = t.view_src
            if vs.data is None:
                raise BackendError(f"alloc_tensors: view '{t.name}' of '{vs.name}', which has "
                                   f"no data; list the source too")
            t.data, t.buffer = vs.data + t.view_offs, vs.buffer
    return buf
