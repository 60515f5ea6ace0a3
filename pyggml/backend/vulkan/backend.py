"""The Vulkan backend: GPU memory and compute shaders through the `vulkan` binding.

Use it:

    from pyggml.backend import vulkan
    dev = vulkan.devices()[0]                 # or default_registry().devices(), or backend_reg()
    backend = vulkan.VulkanBackend(device_index=0)        # == dev.init_backend()
    buft = backend.get_default_buffer_type()              # device-local memory
    buf = base.alloc_tensors(buft, weights)               # place tensors; tensor_set/get move bytes
    backend.graph_compute(graph); backend.synchronize()

With the scheduler: `Scheduler([VulkanBackend(0), CpuBackend()])`; what `supports_op` refuses
runs on the CPU. `vulkan.devices()` is empty when there is no loader, no device or the compiled
shaders are missing; `vulkan.unavailable_reason()` says why (also logged once, logger
"pyggml.vulkan").

Devices: one per physical device, listed when `backend_reg()` first runs. PYGGML_VULKAN_DEVICES
(read then) selects them by index: "0", "1,0"; "none" lists none. A device's `vk_type` is what
Vulkan reports ("discrete GPU", "integrated GPU", "CPU" for lavapipe, ...); its scheduler-facing
`type` is IGPU for integrated GPUs and GPU otherwise (DeviceType.CPU is reserved for the host
backend, which the scheduler requires last).

Memory: device-local; tensors have opaque addresses (`data = buffer.base + offset`, never
dereferenced by the host). Allocations larger than one storage-buffer binding are read through
overlapping windows (device.py); the buffer type's max_size is one binding, so the graph
allocator keeps compute buffers in one window. A weight larger than one binding is split by rows
(MUL_MAT, GET_ROWS). Host access: memmove where the memory is host-visible, else a staging copy.

Modules of this package: info (loader, device facts, KernelConfig: kernel shapes chosen from
the limits), device (logical device, memory windows, pipelines, submissions, transfers), ops
(support rules and dispatches per op), record (command-buffer recording and replay), shaders
(the compiled modules required: shaders/variants.mk's list); shaders/*.comp with their variants
in shaders/variants.mk; benchmarks in tools/bench_vulkan.py.

Execution: a graph is recorded once into one command buffer (pipelines, descriptor sets, push
constants, a barrier only where a dispatch touches memory an earlier one since the last barrier
wrote, or writes memory one read); computing the same graph object again with the same uid and
the same addresses resubmits it (`n_recordings` counts recordings). Whether the addresses are the
same is known in O(1) while no tensor has moved since the recording
(pyggml.tensor.placement_generation): a replay does no Python work per node. graph_compute returns once
the work is queued; synchronize() (or reading a tensor) waits. Errors found by shaders (a row
index outside its source) are raised by synchronize(), naming the node.
"""

from __future__ import annotations

import bisect
import logging
import weakref

import numpy as np

from pyggml import settings
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
from pyggml.backend.vulkan.device import BUFFER_PAD, DeviceMemory, VkContext, staging_size
from pyggml.backend.vulkan.info import (
    Instance,
    binding_limit,
    KernelConfig,
    VulkanMemoryError,
    loader_error,
    query_device,
    shader_dir,
    vk_module,
)
from pyggml.backend.vulkan.ops import why_unsupported
from pyggml.backend.vulkan.record import Recorder
from pyggml.backend.vulkan.shaders import required_shaders
from pyggml.errors import BackendError, SettingsError
from pyggml.tensor import Tensor
from pyggml.types import Op

__all__ = ["OFFLOAD_MIN_BATCH", "VulkanRules", "VulkanBackend", "VulkanDevice", "VulkanBuffer", "VulkanBufferType",
           "VulkanMemoryError", "backend_reg", "devices", "unavailable_reason"]

log = logging.getLogger("pyggml.vulkan")

OFFLOAD_MIN_BATCH = 32    # a MUL_MAT (ID) over this many rows (tokens): worth copying host weights


class VulkanRules:
    """What a Vulkan device with these limits computes (`why_unsupported`, the exact support
    rule of ops.py) and takes from host weights (`offload_op`). The backend answers with it, and
    so does a planning-only device standing for a GPU this machine lacks (max_bind: the largest
    range one storage binding covers; cfg: the KernelConfig, None for planning)."""

    offload_min_batch = OFFLOAD_MIN_BATCH

    def __init__(self, max_bind: int, max_wg_count=(65535, 65535, 65535), cfg=None):
        self.max_bind, self.max_wg_count, self.cfg = max_bind, tuple(max_wg_count), cfg

    def why_unsupported(self, node: Tensor) -> str | None:
        return why_unsupported(node, self)

    def supports_op(self, node: Tensor) -> bool:
        return why_unsupported(node, self) is None

    def offload_op(self, node: Tensor) -> bool:
        """Host weights worth copying here: a MUL_MAT over at least offload_min_batch rows, a
        MUL_MAT_ID over that many tokens (ne[2], as ggml-vulkan counts its batch)."""
        batch = {Op.MUL_MAT: node.ne[1], Op.MUL_MAT_ID: node.ne[2]}.get(node.op, 0)
        return batch >= self.offload_min_batch and self.supports_op(node)


# ---- discovery -----------------------------------------------------------------------------------

_reg: BackendReg | None = None
_reason: str | None = None


def _check_shaders() -> str | None:
    d = shader_dir()
    try:
        required = required_shaders()
    except BackendError as e:
        return str(e)
    missing = []
    for name in required:
        p = d / f"{name}.spv"
        try:
            with open(p, "rb") as f:
                ok = f.read(4) == b"\x03\x02\x23\x07"
        except OSError:
            ok = False
        if not ok:
            missing.append(name)
    if missing:
        more = ", ..." if len(missing) > 4 else ""
        return (f"{len(missing)} compiled shader(s) missing or invalid in {d} "
                f"({', '.join(missing[:4])}{more}); run `make shaders`")
    return None


def _selection(n: int) -> list[int] | None:
    """Device indices to open (PYGGML_VULKAN_DEVICES via pyggml.settings); None: Vulkan off."""
    sel = settings.current().vulkan_devices
    if sel is None:
        return list(range(n))
    if not sel:
        return None
    bad = [i for i in sel if i >= n]
    if bad:
        raise SettingsError(f"PYGGML_VULKAN_DEVICES={','.join(map(str, sel))}: no device "
                            f"{bad[0]} (this machine has {n} Vulkan device(s): indices 0..{n - 1})")
    return list(sel)


def _discover() -> tuple[list["VulkanDevice"], str | None]:
    if settings.current().vulkan_devices == ():
        # before the loader: an instance loads every driver (lavapipe: LLVM, ~50 MB resident)
        return [], "PYGGML_VULKAN_DEVICES disables Vulkan"
    if vk_module() is None:
        return [], loader_error()
    why = _check_shaders()
    if why:
        return [], why
    try:
        pds = Instance.physical_devices()
    except Exception as e:  # a broken ICD must not break the CPU
        return [], f"Vulkan instance or device enumeration failed: {type(e).__name__}: {e}"
    sel = _selection(len(pds))
    if sel is None:
        return [], "PYGGML_VULKAN_DEVICES disables Vulkan"
    devs, skipped = [], []
    for i in sel:
        info = query_device(i, pds[i])
        if info.api_version < (1, 1, 0):
            skipped.append(f"{info.name}: Vulkan {info.api_version} < 1.1")
            continue
        devs.append(VulkanDevice(info, pds[i], name=f"Vulkan{len(devs)}"))
    if not devs:
        return [], "no Vulkan device" + (f" usable ({'; '.join(skipped)})" if skipped else " found")
    return devs, None


def backend_reg() -> BackendReg | None:
    """The Vulkan module's registry entry (None when no device can be used; the reason is logged
    once and kept in unavailable_reason())."""
    global _reg, _reason
    if _reg is None and _reason is None:
        devs, why = _discover()
        if devs:
            _reg = BackendReg("Vulkan", devs)
            for d in devs:
                log.info("Vulkan device %s: %s", d.name, d.description)
        else:
            _reason = why
            log.warning("Vulkan backend disabled: %s", why)
    return _reg


def devices() -> list["VulkanDevice"]:
    reg = backend_reg()
    return reg.devices() if reg is not None else []


def unavailable_reason() -> str | None:
    backend_reg()
    return _reason


def open_device(index: int = 0, **overrides) -> "VulkanDevice":
    """A separate VulkanDevice (own logical device) for physical device `index` with kernel
    settings overridden (KernelConfig fields: subgroup, store16, wg_reduce, storage_range,
    host_mapped, ...). For tests and benchmarks of the other code paths."""
    if not devices():
        raise BackendError(f"no Vulkan device: {unavailable_reason()}")
    pds = Instance.physical_devices()
    info = query_device(index, pds[index])
    return VulkanDevice(info, pds[index], name=f"Vulkan{index}*", overrides=overrides)


# ---- device --------------------------------------------------------------------------------------

class VulkanDevice(Device):
    """One physical device. The logical device (VkContext) is created on first use and shared
    by every backend and buffer of this device."""

    def __init__(self, info, pd, name: str, overrides: dict | None = None):
        self.info, self.pd, self.name = info, pd, name
        self.vk_type = info.type_name
        self.type = DeviceType.IGPU if info.type_name == "integrated GPU" else DeviceType.GPU
        self.cfg = KernelConfig.for_device(info, **(overrides or {}))
        self.description = f"Vulkan {info.describe()}"
        self._ctx: VkContext | None = None
        self._buft = VulkanBufferType(self)
        self._buffers: list[tuple[int, "VulkanBuffer"]] = []     # sorted by base (weak refs)
        self._gelu = None
        self._iq_grids = None

    @property
    def ctx(self) -> VkContext:
        if self._ctx is None:
            self._ctx = VkContext(self.info, self.pd, self.cfg)
            ctx = self._ctx
            self.dummy = DeviceMemory(ctx, 256).window(0, 256)[0]
            self.status_mem = DeviceMemory(ctx, 16, host_visible_only=True)
            ctx.fill(self.status_mem, 0)
            self.status = self.status_mem.window(0, 16)[0]
        return self._ctx

    def memory(self) -> tuple[int, int]:
        total = max((s for s, local in self.info.heaps if local), default=0)
        used = sum(self._ctx.heap_used) if self._ctx is not None else 0
        return max(0, total - used), total

    def buffer_types(self) -> list[BufferType]:
        return [self._buft]

    def has_events(self) -> bool:
        return True

    def uma_reason(self) -> str | None:
        if self.vk_type == "CPU":
            return ("the Vulkan driver reports a CPU device (software rendering: device memory "
                    "is host memory)")
        why = super().uma_reason()
        if why is None and all(local for _, local in self.info.heaps) and self.host_maps_memory():
            why = "its only memory heap is device-local and host-visible"
        return why

    def host_maps_memory(self) -> bool:
        """The host reads and writes this device's buffers directly (no staging): the memory
        type the backend allocates in is host-visible and host_mapped is on."""
        return self.ctx.dev_mappable

    def staging_bytes(self, largest_transfer: int) -> int:
        if largest_transfer <= 0 or self.host_maps_memory():
            return 0
        return staging_size(largest_transfer)

    def is_software(self) -> bool:
        return self.vk_type == "CPU"

    def init_backend(self, **params) -> "VulkanBackend":
        return VulkanBackend(device=self)

    # -- address space: opaque, unique, never reused --
    def _register(self, buf: "VulkanBuffer") -> None:
        self._buffers = [(b, r) for b, r in self._buffers if r() is not None]
        bisect.insort(self._buffers, (buf.base, weakref.ref(buf)), key=lambda x: x[0])

    def locate(self, addr: int, n: int) -> tuple["VulkanBuffer", int]:
        """(buffer, offset) of the live buffer of this device holding [addr, addr + n)."""
        i = bisect.bisect_right(self._buffers, addr, key=lambda x: x[0]) - 1
        if i >= 0:
            buf = self._buffers[i][1]()
            if buf is not None and addr + n <= buf.base + buf.n_bytes and not buf.dm.released:
                return buf, addr - buf.base
        raise BackendError(f"address {addr:#x} (+{n} bytes) is not in a live buffer of {self.name}")

    def gelu_table(self):
        """The fp16 GELU table (65536 entries, ggml's): built once with the CPU backend's GELU."""
        if self._gelu is None:
            table = _gelu_table()
            dm = DeviceMemory(self.ctx, table.nbytes)
            self.ctx.write(dm, 0, table)
            self._gelu = (dm, dm.window(0, table.nbytes)[0])
        return self._gelu[1]

    def iq_grids(self):
        """The codebooks of the IQ types (iq_grids.py), uploaded at first use."""
        if self._iq_grids is None:
            from pyggml.backend.vulkan.iq_grids import table
            words = table()
            dm = DeviceMemory(self.ctx, words.nbytes)
            self.ctx.write(dm, 0, words)
            self._iq_grids = (dm, dm.window(0, words.nbytes)[0])
        return self._iq_grids[1]


def _gelu_table() -> np.ndarray:
    """fp16 bits of gelu(x) for every fp16 x, exactly as the CPU backend computes it."""
    from pyggml import ops
    from pyggml.backend.cpu import CpuBackend, host_array, set_host_data
    from pyggml.context import Context
    from pyggml.graph import Graph
    x = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16).view(np.float16).astype(np.float32)
    # entries outside [-10, 10] are never read (the shader branches first); fp16(9.997) is 10
    x = np.where(np.isfinite(x) & (np.abs(x) <= 10), x, 0).astype(np.float32)
    ctx = Context(mem_size=(1 << 20) + 4096, no_alloc=False)
    t = ctx.new_tensor_1d("f32", 1 << 16)
    set_host_data(t, x)
    y = ops.gelu(ctx, t)
    g = Graph()
    g.build_forward_expand(y)
    cpu = CpuBackend(n_threads=1)
    try:
        cpu.graph_compute(g)
        return host_array(y).reshape(-1).astype(np.float16).view(np.uint16).copy()
    finally:
        cpu.close()


# ---- memory --------------------------------------------------------------------------------------

_BASE0 = 1 << 52          # opaque device addresses: far from any host mapping
_space = [0]


def _reserve_space(n_bytes: int) -> int:
    """A fresh opaque address range of n_bytes, never reused, 1 MiB apart from the others."""
    base = _BASE0 + _space[0]
    _space[0] += ((n_bytes >> 20) + 2) << 20
    return base


class VulkanBufferType(BufferType):
    """Device-local memory of one Vulkan device. max_size: one storage-buffer binding."""

    def __init__(self, device: VulkanDevice):
        lim = binding_limit(device.info, device.cfg.storage_range)
        # an allocation of max_size (plus the pad, in 4 KiB pages) is a single window
        super().__init__(device.name, alignment=64,
                         max_size=max(64, (lim - BUFFER_PAD) // 4096 * 4096),
                         is_host=False, device=device)

    def alloc_buffer(self, n_bytes: int, usage: BufferUsage = BufferUsage.ANY) -> "VulkanBuffer":
        return VulkanBuffer(self, n_bytes, usage)


class VulkanBuffer(Buffer):
    def __init__(self, buft: VulkanBufferType, n_bytes: int, usage: BufferUsage = BufferUsage.ANY):
        if n_bytes < 0:
            raise BackendError(f"cannot allocate {n_bytes} bytes")
        super().__init__(buft, n_bytes, usage)
        self.device: VulkanDevice = buft.device
        self.dm = DeviceMemory(self.device.ctx, max(n_bytes, 4))
        self.base = _reserve_space(n_bytes)
        self.device._register(self)
        self._finalizer = weakref.finalize(self, self.dm.release)
        if usage == BufferUsage.ANY:
            # as the CPU's host buffers: a fresh buffer reads as zeros (a KV cache's unwritten
            # cells enter the non-flash attention's K·q product; garbage there may be NaN, which
            # the -inf mask does not remove). Weights and compute buffers are written before use.
            self.device.ctx.fill(self.dm, 0)

    def set_tensor(self, tensor, data, offset: int = 0) -> None:
        raw = memoryview(data).cast("B") if not isinstance(data, np.ndarray) \
            else np.ascontiguousarray(data).reshape(-1).view(np.uint8)
        n = raw.nbytes
        start = self._range(tensor, offset, n, "set_tensor")
        self.device.ctx.write(self.dm, start, raw)

    def get_tensor(self, tensor, offset: int = 0, n_bytes: int | None = None) -> bytes:
        n = tensor.nbytes() - offset if n_bytes is None else n_bytes
        start = self._range(tensor, offset, n, "get_tensor")
        return self.device.ctx.read(self.dm, start, n)

    def cpy_tensor(self, src, dst) -> bool:
        sb = src.buffer
        if isinstance(sb, VulkanBuffer) and sb.device is self.device:
            n = src.nbytes()
            s0 = sb._range(src, 0, n, "cpy_tensor")
            d0 = self._range(dst, 0, n, "cpy_tensor")
            self.device.ctx.copy(sb.dm, s0, self.dm, d0, n)
            return True
        return super().cpy_tensor(src, dst)

    def clear(self, value: int = 0) -> None:
        self.device.ctx.fill(self.dm, value)

    def release(self) -> None:
        """Free the device memory now (the buffer must no longer be used)."""
        self.device.ctx.wait()
        self._finalizer()


# ---- events --------------------------------------------------------------------------------------

class VulkanEvent(Event):
    """A submission serial on the device's queue."""

    def __init__(self, backend: "VulkanBackend"):
        super().__init__(backend)
        self.serial = 0

    def record(self) -> None:
        self.serial = self.backend.device.ctx.serial

    def synchronize(self) -> None:
        self.backend.device.ctx.wait(self.serial)


# ---- the backend --------------------------------------------------------------------------------

class VulkanBackend(Backend):
    """Computes graphs on one Vulkan device (see the module docstring)."""

    def __init__(self, device_index: int = 0, device: VulkanDevice | None = None):
        if device is None:
            devs = devices()
            if not devs:
                raise BackendError(f"no Vulkan device: {unavailable_reason()}")
            if not 0 <= device_index < len(devs):
                raise BackendError(f"no Vulkan device {device_index} ({len(devs)} listed)")
            device = devs[device_index]
        self.device = device
        self.name = device.name
        self.ctx = device.ctx
        self.cfg = device.cfg
        self.rules = VulkanRules(self.ctx.max_bind, device.info.max_wg_count, self.cfg)
        self.max_bind = self.rules.max_bind           # limits the Builder reads
        self.recorder = Recorder(device, self.rules)
        self._records: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()
        self.n_computes = 0

    @property
    def profile(self) -> bool:
        """Record device timestamps per dispatch (profile_results) in new recordings."""
        return self.recorder.profile

    @profile.setter
    def profile(self, on: bool) -> None:
        self.recorder.profile = bool(on)

    @property
    def n_recordings(self) -> int:
        """Command buffers recorded so far (a replay records nothing)."""
        return self.recorder.n_recordings

    # -- capabilities --
    def supports_buft(self, buft: BufferType) -> bool:
        return isinstance(buft, VulkanBufferType) and buft.device is self.device

    offload_min_batch = OFFLOAD_MIN_BATCH

    def why_unsupported(self, node: Tensor) -> str | None:
        return self.rules.why_unsupported(node)

    def supports_op(self, node: Tensor) -> bool:
        return self.rules.supports_op(node)

    def offload_op(self, node: Tensor) -> bool:
        return self.rules.offload_op(node)

    # -- compute --
    def graph_compute(self, graph) -> None:
        rec = self._records.get(graph)
        if rec is None or not rec.still_valid(graph):     # O(1) while no tensor moved
            if rec is not None:
                rec.release()
            rec = self.recorder.record(graph, self.name)
            self._records[graph] = rec
        elif rec.serial:
            self.ctx.wait(rec.serial)        # the same command buffer may not run twice at once
        rec.state[0] = self.ctx.submit(rec.submit, self._check_status)
        self.n_computes += 1

    def graph_compute_sync(self, graph) -> None:
        self.graph_compute(graph)
        self.synchronize()

    def _check_status(self) -> str | None:
        return self.recorder.check_status(self.name)

    def profile_results(self, graph) -> list[tuple[str, str, str, float]]:
        """With `profile = True` set before the graph was recorded: (node, op, shader, seconds)
        per dispatch of its last compute (device timestamps; call after synchronize())."""
        rec = self._records.get(graph)
        if rec is None:
            raise BackendError("graph not recorded")
        return self.recorder.timestamps(rec)

    def record_stats(self, graph) -> tuple[int, int] | None:
        """(dispatches, barriers) of the recording of `graph`, if it was recorded."""
        rec = self._records.get(graph)
        return None if rec is None else (rec.n_dispatches, rec.n_barriers)

    def synchronize(self) -> None:
        self.ctx.wait()

    # -- events and copies --
    def event_new(self) -> VulkanEvent:
        return VulkanEvent(self)

    def event_wait(self, event: Event) -> None:
        if isinstance(event, VulkanEvent) and event.backend.device.ctx is self.ctx:
            return          # one queue: later submissions start after earlier ones (barriers)
        event.synchronize()

    def close(self) -> None:
        self.ctx.wait()
        for rec in list(self._records.values()):
            rec.release()
        self._records = weakref.WeakKeyDictionary()
