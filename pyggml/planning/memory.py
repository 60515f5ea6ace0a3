"""Planning-only memory estimates: what a model run would put on each device, without running it.

    from pyggml.planning.memory import plan_memory, VirtualDevice
    mp = plan_memory("model.gguf", n_ctx=2048, n_ubatch=512)             # CPU only
    mp = plan_memory("model.gguf", n_ctx=8192, n_gpu_layers=99,
                     devices=[VirtualDevice("laptop", 8 << 30)])         # a GPU you do not have
    mp.device("CPU").compute, mp.system_ram, mp.reports["prefill"].summary()

`plan_memory` repeats the model runtime's set-up (pyggml/llm/runtime.py: offload plan, weights per
device, KV cache, the worst-case ubatch graph, one scheduler per phase) with memory that is never
allocated: weights stay mapped (no byte read), device weights, KV cache and compute buffers are
`PlannedBuffer`s (an address range, no memory). The scheduler splits the graph and the allocator
plans it exactly as at run time, so the compute-buffer figures are the ones `LLM` reserves (a test
compares them). What it costs: opening the GGUF's tensor table and planning one graph per phase.

Devices. Real devices come from the registry; their backends are asked only `supports_op` and
`offload_op` (no memory is allocated on them). A `VirtualDevice` is a planning-only device with a
declared memory size: a GPU you do not have (`kind="gpu"`) or an integrated one (`kind="igpu"`,
UMA), declared on the command line or in a config (`virtual_devices:`). Its backend follows the
Vulkan backend's op rules (pyggml's GPU backend is what would run there) and, like it, offloads
matrix products over 32+ rows from host weights.

UMA. A device whose memory is the host's (an integrated GPU, a software rasterizer such as
lavapipe, or a Vulkan device whose only heap is device-local and host-visible) holds its buffers in
system RAM: `DeviceUsage.uma` is True with the reason, and `MemoryPlan.system_ram` counts them.
Offloading to such a device frees no RAM.

Host staging: a device whose memory the CPU cannot map gets host-visible staging memory for
transfers (the Vulkan backend: max(4 MiB, the largest transfer up to 64 MiB)); counted in system
RAM.
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass, field

from pyggml.alloc import PlanReport
from pyggml.backend.base import (
    Backend,
    BufferType,
    BufferUsage,
    Device,
    DeviceType,
    default_registry,
)
from pyggml.errors import ConfigError, PyggmlError
from pyggml.offload import CPU, OffloadPlan, pin_phase_ops, plan_from_args
from pyggml.types import Op, VIEW_OPS

MiB = 1 << 20
GiB = 1 << 30
STAGING_MIN = 4 << 20          # the Vulkan backend's staging buffer: at least 4 MiB,
STAGING_MAX = 64 << 20         # at most 64 MiB (larger transfers go in pieces)
OFFLOAD_MIN_BATCH = 32         # virtual GPUs offload MUL_MAT over this many rows (as Vulkan)
_FAKE_BASE = 1 << 56           # planned buffers' opaque addresses: never dereferenced


def human(n: int | None) -> str:
    """Bytes as MiB (or GiB above 10 GiB), the unit llama.cpp prints."""
    if n is None:
        return "-"
    if abs(n) >= 10 * GiB:
        return f"{n / GiB:.2f} GiB"
    return f"{n / MiB:.2f} MiB"


def parse_size(text) -> int:
    """'8GiB', '512 MiB', '8G', '1.5GB' (GB = GiB here), or a plain byte count -> bytes."""
    if isinstance(text, int):
        return text
    s = str(text).strip().replace(" ", "").lower()
    units = (("gib", GiB), ("gb", GiB), ("g", GiB), ("mib", MiB), ("mb", MiB), ("m", MiB),
             ("kib", 1024), ("kb", 1024), ("k", 1024), ("b", 1))
    for suffix, scale in units:
        if s.endswith(suffix):
            num = s[: -len(suffix)]
            break
    else:
        num, scale = s, 1
    try:
        value = float(num)
    except ValueError:
        raise ConfigError(f"memory size {text!r}: expected a number with an optional unit "
                          f"(B, KiB, MiB, GiB), e.g. '8GiB'") from None
    if value < 0:
        raise ConfigError(f"memory size {text!r} is negative")
    return int(value * scale)


# ---- memory that is never allocated ------------------------------------------------------------

class PlannedBuffer:
    """An address range standing for a buffer that is not allocated: what the scheduler and the
    allocator need of a Buffer (buft, base, n_bytes, usage, is_host) and nothing else."""
    _next = [_FAKE_BASE]

    def __init__(self, buft: BufferType, n_bytes: int, usage: BufferUsage = BufferUsage.ANY):
        self.buft = buft
        self.n_bytes = n_bytes
        self.usage = usage
        self.is_host = bool(buft.is_host)
        self.base = PlannedBuffer._next[0]
        PlannedBuffer._next[0] += ((n_bytes >> 20) + 2) << 20

    @property
    def name(self) -> str:
        return self.buft.name

    def __repr__(self) -> str:
        return f"PlannedBuffer({self.buft.name!r}, {self.n_bytes} bytes, planning only)"


class PlanningBufferType(BufferType):
    """A buffer type whose buffers are PlannedBuffers: the alignment and max_size of a real
    type (or a virtual device's), no memory."""

    def __init__(self, name: str, alignment: int = 64, max_size: int | None = None,
                 is_host: bool = False, device: Device | None = None):
        super().__init__(name, alignment, max_size, is_host, device)

    def alloc_buffer(self, n_bytes: int, usage: BufferUsage = BufferUsage.ANY) -> PlannedBuffer:
        return PlannedBuffer(self, n_bytes, usage)


class PlanningBackend(Backend):
    """A real device's backend for planning: `supports_op` / `offload_op` are the real backend's
    (inner), memory is planned only."""

    def __init__(self, device: Device, buft: PlanningBufferType, inner: Backend | None):
        self.device, self.name, self._buft, self.inner = device, device.name, buft, inner

    def get_default_buffer_type(self) -> BufferType:
        return self._buft

    def supports_buft(self, buft) -> bool:
        return buft is self._buft

    def supports_op(self, node) -> bool:
        if self.inner is None:
            return True
        return self.inner.supports_op(node)

    def offload_op(self, node) -> bool:
        if self.inner is None:
            return False
        return self.inner.offload_op(node)

    def graph_compute(self, graph) -> None:
        raise PyggmlError(f"'{self.name}' is a planning-only backend: it cannot compute")


# ---- planning-only devices ---------------------------------------------------------------------

class VirtualBackend(PlanningBackend):
    """A virtual device's backend: the Vulkan backend's op rules (pyggml's GPU backend: what a
    GPU you do not have would run), with one storage binding of `max_bind` bytes; refuses
    `unsupported_ops` too; offloads MUL_MAT over 32+ rows from host weights, as Vulkan does."""

    max_wg_count = (65535, 65535, 65535)
    cfg = None

    def __init__(self, device: "VirtualDevice"):
        super().__init__(device, device.buft, None)
        self.max_bind = device.max_bind

    def supports_op(self, node) -> bool:
        from pyggml.backend.vulkan.ops import why_unsupported
        if node.op in VIEW_OPS or node.op == Op.NONE:
            return True
        if node.op.name in self.device.unsupported_ops:
            return False
        return why_unsupported(node, self) is None

    def offload_op(self, node) -> bool:
        return node.op == Op.MUL_MAT and node.ne[1] >= OFFLOAD_MIN_BATCH and self.supports_op(node)


class VirtualDevice(Device):
    """A planning-only device: a name, a memory size, a kind ("gpu": own memory; "igpu": shares
    system RAM, i.e. UMA). alignment / max_size: its buffer type's (max_size None: no limit).
    unsupported_ops: op names its backend refuses besides the Vulkan backend's rules (they run
    on the CPU in the plan); max_bind: the largest tensor one shader binding may cover."""

    def __init__(self, name: str, memory: int | str, kind: str = "gpu", *,
                 alignment: int = 256, max_size: int | str | None = None,
                 unsupported_ops=(), description: str = "", max_bind: int = 1 << 30):
        kind = kind.lower()
        if kind not in ("gpu", "igpu"):
            raise ConfigError(f"virtual device '{name}': kind must be 'gpu' or 'igpu', got "
                              f"{kind!r}")
        if name.upper() == CPU:
            raise ConfigError("a virtual device cannot be called 'CPU'")
        self.name = name
        self.total = parse_size(memory)
        self.kind = kind
        self.type = DeviceType.IGPU if kind == "igpu" else DeviceType.GPU
        self.description = (description or
                            f"virtual {kind.upper()} ({human(self.total)}, planning only)")
        self.unsupported_ops = frozenset(o.upper() for o in unsupported_ops)
        self.max_bind = max_bind
        self.buft = PlanningBufferType(name, alignment,
                                       None if max_size is None else parse_size(max_size),
                                       is_host=False, device=self)

    @property
    def uma(self) -> bool:
        return self.kind == "igpu"

    def memory(self) -> tuple[int, int]:
        return self.total, self.total

    def buffer_types(self) -> list[BufferType]:
        return [self.buft]

    def init_backend(self, **params) -> Backend:
        return VirtualBackend(self)


def uma_reason(dev) -> str | None:
    """Why a device's memory is system RAM, or None when it has its own."""
    if isinstance(dev, VirtualDevice):
        return "declared as an integrated GPU (kind: igpu)" if dev.uma else None
    if dev.type == DeviceType.CPU:
        return "the host itself"
    if dev.type == DeviceType.IGPU:
        return "the driver reports an integrated GPU"
    vk_type = getattr(dev, "vk_type", None)
    if vk_type == "CPU":
        return ("the Vulkan driver reports a CPU device (software rendering: device memory is "
                "host memory)")
    info = getattr(dev, "info", None)
    heaps = getattr(info, "heaps", None)
    if heaps and all(local for _, local in heaps) and _device_local_host_visible(info):
        return "its only memory heap is device-local and host-visible"
    return None


_HOST_VISIBLE_COHERENT = 0x2 | 0x4       # VK_MEMORY_PROPERTY_HOST_VISIBLE | HOST_COHERENT
_DEVICE_LOCAL = 0x1


def _device_local_type(info) -> int | None:
    """The memory type the Vulkan backend allocates device memory in (first device-local)."""
    for flags, _heap in getattr(info, "memory_types", []) or []:
        if flags & _DEVICE_LOCAL:
            return flags
    return None


def _device_local_host_visible(info) -> bool:
    flags = _device_local_type(info)
    return flags is not None and flags & _HOST_VISIBLE_COHERENT == _HOST_VISIBLE_COHERENT


def staging_bytes(dev, largest_transfer: int) -> int:
    """Host staging memory a device's backend makes for transfers of up to `largest_transfer`
    bytes: none where the CPU maps device memory (UMA, resizable BAR, lavapipe)."""
    if dev.type == DeviceType.CPU or largest_transfer <= 0:
        return 0
    if isinstance(dev, VirtualDevice):
        mappable = dev.uma
    else:
        cfg = getattr(dev, "cfg", None)
        mappable = (getattr(cfg, "host_mapped", True)
                    and _device_local_host_visible(getattr(dev, "info", None)))
    if mappable:
        return 0
    return max(STAGING_MIN, min(STAGING_MAX, largest_transfer))


# ---- the result --------------------------------------------------------------------------------

@dataclass
class DeviceUsage:
    """Planned bytes on one device. compute: planned peak of its compute buffer (all phases);
    compute_naive: sum of every intermediate (nothing reused); compute_no_inplace: the peak with
    in-place reuse off; compute_lower_bound: the most bytes alive at once (any placement needs
    that). staging: host-visible staging memory for transfers (system RAM). memory: (free,
    total) of the device (a virtual device: its declared size)."""
    device: str
    kind: str                       # CPU | GPU | IGPU | virtual GPU | virtual IGPU
    uma: str | None                 # why its memory is system RAM (None: its own memory)
    weights_by_type: dict[str, int]
    weights: int
    weights_mapped: bool            # the CPU's weights: pages of the mapped GGUF file
    kv: int
    compute: int
    compute_naive: int
    compute_no_inplace: int | None
    compute_lower_bound: int
    staging: int
    memory: tuple[int, int] | None

    @property
    def total(self) -> int:
        """Bytes in this device's memory (staging is host memory: not counted here)."""
        return self.weights + self.kv + self.compute


@dataclass
class KVLayer:
    layer: int
    device: str
    bytes: int
    sliding: bool
    cells: int                      # KV cells of its space (n_ctx, or the window-sized space)


@dataclass
class MemoryPlan:
    """The plan of one model configuration. reports: the allocator's PlanReport per scheduler
    (phase name, "prefill" first; "decode" only when its scheduler differs)."""
    model: str
    n_ctx: int
    n_ubatch: int
    n_batch: int
    n_seq_max: int
    type_k: str
    type_v: str
    logits_all: bool
    flash_attn: bool
    devices: list[DeviceUsage]
    kv_layers: list[KVLayer]
    offload: OffloadPlan = field(repr=False)
    reports: dict[str, PlanReport] = field(repr=False, default_factory=dict)
    n_swa_cells: int = 0            # cells a window-sized cache for sliding layers would hold
    plan_seconds: float = 0.0
    facts: dict = field(default_factory=dict)   # arch, n_layer, n_embd, n_vocab, n_ctx_train,
                                                # weight_bytes (the file's tensor data)

    def device(self, name: str) -> DeviceUsage:
        for d in self.devices:
            if d.device.lower() == name.lower():
                return d
        raise KeyError(name)

    @property
    def kv_bytes(self) -> int:
        return sum(x.bytes for x in self.kv_layers)

    @property
    def compute_bytes(self) -> int:
        return sum(d.compute for d in self.devices)

    @property
    def staging(self) -> int:
        return sum(d.staging for d in self.devices)

    @property
    def system_ram(self) -> int:
        """Buffers in system RAM: the CPU's (mapped weights, KV, compute), host staging, and the
        memory of every UMA device (the runtime's own Python objects are not included)."""
        return sum(d.total for d in self.devices if d.uma) + self.staging

    def kv_split(self) -> tuple[int, int, int, int]:
        """(global layers, their bytes, sliding-window layers, their bytes)."""
        g = [x for x in self.kv_layers if not x.sliding]
        s = [x for x in self.kv_layers if x.sliding]
        return len(g), sum(x.bytes for x in g), len(s), sum(x.bytes for x in s)

    def kv_swa_window_bytes(self) -> int:
        """KV bytes with sliding-window layers keeping n_swa_cells cells (llama.cpp's SWA
        cache; what pyggml's cache holds too unless swa_full)."""
        if not self.n_swa_cells:
            return self.kv_bytes
        return sum(x.bytes * self.n_swa_cells // x.cells if x.sliding else x.bytes
                   for x in self.kv_layers)

    def to_dict(self) -> dict:
        d = {k: v for k, v in asdict(self).items() if k not in ("offload", "reports")}
        d["system_ram"] = self.system_ram
        d["devices"] = [dict(asdict(x), total=x.total) for x in self.devices]
        return d


# ---- planning ----------------------------------------------------------------------------------

def _type_name(t) -> str:
    """A KV type, or per-layer types ("f16", or "f16,q8_0" when layers differ)."""
    ts = list(t) if isinstance(t, (list, tuple)) else [t]
    names = [x if isinstance(x, str) else x.name.lower() for x in ts]
    return ",".join(dict.fromkeys(n.lower() for n in names))


class PlanningModel:
    """A GGUF model opened for planning: tensor table, hyper-parameters and mapped weight tensors
    (no byte of weight data is read). Reuse one across many plan_memory calls."""

    def __init__(self, path):
        from pyggml.gguf import GGUFModel
        from pyggml.llm.hparams import read_hparams
        from pyggml.llm.models import check_weights
        if path is None:
            from pyggml.models_default import ensure_default_model
            path = ensure_default_model()
        self.path = os.fspath(path)
        self.model = GGUFModel.open(self.path)
        self.weights = self.model.create_tensors()
        self.hparams = read_hparams(self.model, self.model.tensors)
        check_weights(self.hparams, self.weights, self.path)

    def facts(self) -> dict:
        hp = self.hparams
        return {"arch": hp.arch, "n_layer": hp.n_layer, "n_embd": hp.n_embd,
                "n_vocab": hp.n_vocab, "n_ctx_train": hp.n_ctx_train,
                "sliding_window": hp.sliding_window, "weight_bytes": self.model.n_bytes,
                "file": os.path.basename(self.path)}

    def close(self) -> None:
        self.model.close()


class Devices:
    """Name -> Device: the registry's devices plus virtual ones (a virtual device may not take a
    real device's name). Backends for planning are made once per device and kept."""

    def __init__(self, virtual=(), registry=None):
        self.registry = registry or default_registry()
        self.real = {d.name: d for d in self.registry.devices()}
        self.virtual = {}
        self.add_virtual(virtual)
        self._backends: dict[str, PlanningBackend] = {}

    def add_virtual(self, virtual) -> None:
        """Add VirtualDevices; one declared again (same name, size and kind) is kept once."""
        for v in virtual:
            old = next((d for n, d in self.virtual.items() if n.lower() == v.name.lower()), None)
            if old is not None and (old.total, old.kind) == (v.total, v.kind):
                continue
            if old is not None or any(v.name.lower() == n.lower() for n in self.real):
                raise ConfigError(f"virtual device '{v.name}' has the name of another device "
                                  f"({', '.join(list(self.real) + list(self.virtual))})")
            self.virtual[v.name] = v

    def catalog(self):
        """These devices as pyggml.offload's DeviceCatalog (virtual ones as planning-only)."""
        from pyggml.offload import DeviceCatalog
        return DeviceCatalog.from_registry(self.registry,
                                           {n: v.total for n, v in self.virtual.items()})

    def names(self) -> list[str]:
        """Non-CPU devices (virtual ones first: a config declares them to use them), then CPU."""
        gpus = [n for n, d in self.real.items() if d.type != DeviceType.CPU]
        return list(self.virtual) + gpus + [CPU]

    def get(self, name: str) -> Device:
        for table in (self.virtual, self.real):
            for n, d in table.items():
                if n.lower() == name.lower():
                    return d
        raise ConfigError(f"no device named '{name}' (known: {', '.join(self.names())})")

    def first_gpu(self) -> str | None:
        names = [n for n in self.names() if n != CPU]
        return names[0] if names else None

    def backend(self, name: str) -> PlanningBackend:
        dev = self.get(name)
        b = self._backends.get(dev.name)
        if b is not None:
            return b
        if isinstance(dev, VirtualDevice):
            b = VirtualBackend(dev)
        else:
            real_buft = dev.default_buffer_type()
            buft = PlanningBufferType(real_buft.name, real_buft.alignment, real_buft.max_size,
                                      real_buft.is_host, dev)
            if dev.type == DeviceType.CPU:
                from pyggml.backend.cpu import CpuBackend
                inner = CpuBackend(n_threads=1, n_threads_batch=1)
            else:
                inner = dev.init_backend()
            b = PlanningBackend(dev, buft, inner)
        self._backends[dev.name] = b
        return b

    def close(self) -> None:
        for b in self._backends.values():
            if b.inner is not None:
                b.inner.close()
        self._backends = {}


def _kind(dev) -> str:
    k = dev.type.value
    return f"virtual {k}" if isinstance(dev, VirtualDevice) else k


def virtual_devices_of(cfg) -> list[VirtualDevice]:
    """The `virtual_devices` a config declares (a Config, a dict, or None)."""
    items = (cfg.get(("virtual_devices",)) if hasattr(cfg, "where_of") else
             (cfg or {}).get("virtual_devices")) or []
    return [VirtualDevice(it["name"], it["memory"], it.get("kind", "gpu")) for it in items]


def load_run_config(config, sets=()):
    """A config (path, Config or dict) as a validated pyggml.offload.config.Config."""
    from pyggml.offload.config import load_config
    return load_config(config, sets)


def make_offload(pm: PlanningModel, devices: Devices, n_gpu_layers: int = 0,
                 gpu_device: str | None = None, **kw) -> OffloadPlan:
    """llama.cpp-style flags as an OffloadPlan over real and virtual devices (-ngl goes to
    gpu_device, default the first non-CPU device: a virtual one if declared)."""
    gpu = gpu_device or (devices.first_gpu() if n_gpu_layers > 0 else None)
    if gpu is not None:
        gpu = devices.get(gpu).name
    return plan_from_args(pm.model.tensors, pm.hparams.n_layer, pm.hparams.tied_output,
                          n_gpu_layers, gpu, **kw)


def plan_memory(model, *, config=None, sets=(), n_ctx: int = 2048, n_ubatch: int = 512,
                n_batch: int = 2048, n_seq_max: int = 1, type_k="f16", type_v="f16",
                logits_all: bool = False, flash_attn: bool = True, n_gpu_layers: int = 0,
                gpu_device: str | None = None, offload: OffloadPlan | None = None,
                devices: Devices | list | None = None, with_no_inplace: bool = True,
                swa_full: bool = False) -> MemoryPlan:
    """Plan one configuration (see the module docstring). model: a path or a PlanningModel;
    devices: a Devices or a list of VirtualDevice (with the registry's). Where weights go:
    `offload` (a plan), else `config` (an offload config: path, Config or dict, amended by
    `sets`; its sizes and KV types replace the keyword arguments, as in the runtime, and its
    `virtual_devices` join the devices), else n_gpu_layers / gpu_device. swa_full: sliding-
    window layers keep n_ctx cells (as LLM(swa_full=True)), else a window-sized space."""
    import time

    from pyggml.context import Context
    from pyggml.llm.kv_cache import KVCache
    from pyggml.llm.models import GraphParams, build_graph, graph_size
    from pyggml.sched import Scheduler

    t0 = time.perf_counter()
    own_pm = not isinstance(model, PlanningModel)
    pm = PlanningModel(model) if own_pm else model
    own_devs = not isinstance(devices, Devices)
    devs = devices if not own_devs else Devices(devices or ())
    try:
        hp = pm.hparams
        if offload is not None:
            plan = offload
        elif config is not None:
            from pyggml.offload import plan_from_config
            cfg = load_run_config(config, sets)
            devs.add_virtual(virtual_devices_of(cfg))
            plan, st = plan_from_config(cfg, pm.model.tensors, hp.n_layer, hp.tied_output,
                                        catalog=devs.catalog())
            n_ctx, n_batch = st.n_ctx or n_ctx, st.n_batch or n_batch
            n_ubatch, n_seq_max = st.n_ubatch or n_ubatch, st.n_seq_max or n_seq_max
            type_k, type_v = st.type_k or type_k, st.type_v or type_v
        else:
            plan = make_offload(pm, devs, n_gpu_layers, gpu_device)
        for name, v in (("n_ctx", n_ctx), ("n_batch", n_batch), ("n_ubatch", n_ubatch)):
            if not isinstance(v, int) or v < 1:
                raise ConfigError(f"{name} must be a positive integer, got {v!r}")
        n_ubatch = min(n_ubatch, n_batch)
        used = plan.devices_used()
        backends = [devs.backend(n) for n in used if n != CPU] + [devs.backend(CPU)]
        by_name = {b.device.name: b for b in backends}
        by_name[CPU] = backends[-1]

        # weights: mapped on the CPU, one planned WEIGHTS buffer per other device (as the runtime)
        weights = dict(pm.weights)
        per_dev: dict[str, dict[str, int]] = {}
        largest: dict[str, int] = {}
        ctx = Context(no_alloc=True, name="planned-weights")
        dev_names: dict[str, list[str]] = {}
        for name, p in plan.weights.items():
            dev_names.setdefault(p.device, []).append(name)
        if "output.weight" in plan.weights and "output.weight" not in weights:
            weights["output.weight"] = weights["token_embd.weight"]     # tied: the CPU's copy
        for dev, names in dev_names.items():
            bt = by_name[dev].get_default_buffer_type() if dev != CPU else None
            align = bt.alignment if bt is not None else 1
            sizes = {}
            if dev == CPU:              # mapped: a tied output on the CPU is token_embd itself
                names = [n for n in names if n in pm.model.tensors]
            for n in names:
                src = "token_embd.weight" if n == "output.weight" and n not in pm.model.tensors \
                    else n
                info = pm.model.tensor_info(src)
                sizes[n] = -(-info.nbytes // align) * align
                tname = info.type.name.lower()
                per_dev.setdefault(dev, {})
                per_dev[dev][tname] = per_dev[dev].get(tname, 0) + sizes[n]
                largest[dev] = max(largest.get(dev, 0), info.nbytes)
            if dev == CPU:
                continue
            buf = bt.alloc_buffer(sum(sizes.values()), BufferUsage.WEIGHTS)
            off = 0
            for n in names:
                src = "token_embd.weight" if n == "output.weight" and n not in pm.model.tensors \
                    else n
                info = pm.model.tensor_info(src)
                t = ctx.new_tensor(info.type, info.ne[: max(info.n_dims, 1)], name=n)
                t.data, t.buffer = buf.base + off, buf
                off += sizes[n]
                weights[n] = t

        kv_bufts = [by_name[p.device].get_default_buffer_type() for p in plan.kv]
        kv = KVCache(hp, n_ctx, type_k, type_v, n_seq_max, kv_bufts, n_ubatch=n_ubatch,
                     swa_full=swa_full)
        kv_layers = [KVLayer(il, plan.kv[il].device, kv.k[il].nbytes() + kv.v[il].nbytes(),
                             hp.layer_is_swa(il), kv.k[il].ne[1]) for il in range(hp.n_layer)]
        kv_by_dev: dict[str, int] = {}
        for x in kv_layers:
            kv_by_dev[x.device] = kv_by_dev.get(x.device, 0) + x.bytes

        n_out = n_ubatch if logits_all else min(n_seq_max, n_ubatch)
        gp = GraphParams(n_ubatch, n_out, n_ctx,               # the runtime's worst case
                         kv.spaces["swa"].n_cells if "swa" in kv.spaces else 0)
        gs = graph_size(hp.n_layer) * 2
        oo = plan.op_offload
        scheds = {"prefill": Scheduler(backends, n_copies=plan.n_copies,
                                       op_offload=oo["prefill"], graph_size=gs, debug=0)}
        if oo["decode"] != oo["prefill"] or plan.phase_ops:      # as the runtime
            scheds["decode"] = Scheduler(backends, n_copies=plan.n_copies,
                                         op_offload=oo["decode"], graph_size=gs, debug=0)
        reports = {}
        comp = {b.device.name: [0, 0, 0, 0] for b in backends}
        for phase, sched in scheds.items():
            g, _, _ = build_graph(hp, weights, kv, gp, flash_attn, not logits_all)
            pin_phase_ops(sched, g, plan, phase, weights)
            sched.reserve(g)
            rep = sched.galloc.report(with_no_inplace=with_no_inplace)
            reports[phase] = rep
            for bp, b in zip(rep.buffers, backends):
                c = comp[b.device.name]
                c[0] += bp.peak
                c[1] += bp.naive
                c[2] += bp.peak_no_inplace or 0
                c[3] += bp.max_live

        out = []
        for b in backends:
            dev = b.device
            name = dev.name if dev.type != DeviceType.CPU else CPU
            wt = per_dev.get(name, {})
            c = comp[dev.name]
            transfer = max(largest.get(name, 0), 0)
            try:
                mem = dev.memory()
            except Exception:        # a device that cannot say: unknown
                mem = None
            out.append(DeviceUsage(
                device=name, kind=_kind(dev), uma=uma_reason(dev),
                weights_by_type=dict(sorted(wt.items(), key=lambda kv_: -kv_[1])),
                weights=sum(wt.values()), weights_mapped=name == CPU,
                kv=kv_by_dev.get(name, 0), compute=c[0], compute_naive=c[1],
                compute_no_inplace=c[2] if with_no_inplace else None, compute_lower_bound=c[3],
                staging=staging_bytes(dev, transfer), memory=mem))
        n_swa = 0          # llama.cpp's SWA cache: window * n_seq_max + n_ubatch, padded
        if hp.sliding_window and any(x.sliding for x in kv_layers):
            n_swa = min(n_ctx, -(-(hp.sliding_window * n_seq_max + n_ubatch) // 256) * 256)
        return MemoryPlan(
            model=pm.path, n_ctx=n_ctx, n_ubatch=n_ubatch, n_batch=n_batch, n_seq_max=n_seq_max,
            type_k=_type_name(type_k), type_v=_type_name(type_v), logits_all=logits_all,
            flash_attn=flash_attn,
            devices=out, kv_layers=kv_layers, offload=plan, reports=reports, n_swa_cells=n_swa,
            plan_seconds=time.perf_counter() - t0, facts=pm.facts())
    finally:
        if own_devs:
            devs.close()
        if own_pm:
            pm.close()
