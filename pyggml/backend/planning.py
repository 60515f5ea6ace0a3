"""The planning-only device: memory that is never allocated, a backend that never computes.

    dev = PlanningDevice.stand_in(real_device, real_device.init_backend())   # this machine's
    dev = PlanningDevice.virtual("laptop", 8 << 30)                        # a GPU it lacks
    backend = dev.init_backend()

Like tinygrad's null device: the scheduler splits a graph and the allocator plans it exactly as
at run time (the same buffer types' alignment and size limits, the same op rules), but every
buffer is an address range with no memory behind it, so sizes can be asked for any settings
without touching a weight byte or allocating device memory (pyggml.llm.setup's planning mode).

What a planning device says about ops and memory it asks the backend it stands in for: a real
device's own backend, or, for a virtual GPU, the Vulkan backend's rules (pyggml's GPU backend:
what would run there) with one storage binding of `max_bind` bytes. Facts the memory plan needs
(UMA, staging bytes) come from the real device, or from the declared kind of a virtual one.
"""

from __future__ import annotations

import itertools

from pyggml.backend.base import Backend, Buffer, BufferType, BufferUsage, Device, DeviceType
from pyggml.errors import BackendError, ConfigError
from pyggml.types import VIEW_OPS, Op
from pyggml.units import fmt_bytes

_PLAN_BASE = 1 << 56            # fake addresses: far from host mappings and Vulkan's range
_space = itertools.count()
KINDS = ("gpu", "igpu")          # a virtual device's own memory, or system RAM (UMA)


class PlanningBuffer(Buffer):
    """A buffer of `buft` that has an address range but no memory: tensors placed in it look
    placed (data, buffer, usage) to the scheduler and the allocator; moving bytes fails."""

    def __init__(self, buft: BufferType, n_bytes: int, usage: BufferUsage = BufferUsage.ANY):
        super().__init__(buft, n_bytes, usage)
        self.base = _PLAN_BASE + (next(_space) << 40)

    def _refuse(self, *_a, **_k):
        raise BackendError(f"planning buffer of {self.name}: no memory behind it (dry run)")

    set_tensor = get_tensor = memset_tensor = clear = cpy_tensor = _refuse


class PlanningBufferType(BufferType):
    """A buffer type whose buffers are PlanningBuffers: the name, alignment, size limit, host
    flag and tensor sizes (get_alloc_size: a remote CUDA device pads quantized rows) of the
    type it stands for (`stands_for`)."""

    stands_for: BufferType | None = None

    def alloc_buffer(self, n_bytes: int, usage: BufferUsage = BufferUsage.ANY) -> PlanningBuffer:
        return PlanningBuffer(self, n_bytes, usage)

    def get_alloc_size(self, tensor) -> int:
        if self.stands_for is None:
            return super().get_alloc_size(tensor)
        return self.stands_for.get_alloc_size(tensor)

    @classmethod
    def like(cls, buft: BufferType, device: Device) -> "PlanningBufferType":
        t = cls(buft.name, buft.alignment, buft.max_size, buft.is_host, device)
        t.stands_for = buft
        return t


class PlanningDevice(Device):
    """A device for planning. `stands_for`: the real device it mirrors (None: virtual);
    `rules`: what answers supports_op / offload_op (the real device's backend, or VulkanRules);
    memory: (free, total) bytes. virtual: a device this machine lacks; assumed_memory: the
    memory was declared rather than read from the device."""

    def __init__(self, name: str, type_: DeviceType, memory: tuple[int, int] | None, rules,
                 buft: BufferType, *, stands_for: Device | None = None, uma: str | None = None,
                 description: str = "", unsupported_ops=()):
        self.name, self.type, self.rules, self.stands_for = name, type_, rules, stands_for
        self._memory = memory
        self._uma = uma
        self.description = description
        self.unsupported_ops = frozenset(o.upper() for o in unsupported_ops)
        self._buft = PlanningBufferType.like(buft, self)
        self.assumed_memory = stands_for is None or memory is not None

    @property
    def virtual(self) -> bool:
        return self.stands_for is None

    @classmethod
    def stand_in(cls, device: Device, backend: Backend,
                 memory: int | None = None) -> "PlanningDevice":
        """`device` of this machine for planning; `memory`: bytes to assume instead of its
        own free memory ("would it fit on a 4 GiB card?")."""
        mem = None if memory is None else (memory, memory)
        desc = device.description + (f" (assumed {fmt_bytes(memory)})" if memory else "")
        return cls(device.name, device.type, mem, backend, device.default_buffer_type(),
                   stands_for=device, description=desc)

    @classmethod
    def virtual_gpu(cls, name: str, memory: int, kind: str = "gpu", *,
                    max_bind: int = 1 << 30, alignment: int = 256,
                    max_size: int | None = None, unsupported_ops=()) -> "PlanningDevice":
        """A GPU this machine lacks, with `memory` bytes: kind "gpu" (its own memory) or
        "igpu" (system RAM, UMA). It follows the Vulkan backend's rules."""
        from pyggml.backend.vulkan.backend import VulkanRules
        kind = str(kind).lower()
        if kind not in KINDS:
            raise ConfigError(f"virtual device '{name}': kind must be 'gpu' or 'igpu', got "
                              f"{kind!r}")
        if name.strip().upper() == "CPU":
            raise ConfigError("a virtual device cannot be called 'CPU': the CPU always exists")
        buft = BufferType(name, alignment, max_size, False)
        return cls(name, DeviceType.IGPU if kind == "igpu" else DeviceType.GPU, (memory, memory),
                   VulkanRules(max_bind), buft,
                   uma="declared as an integrated GPU (kind: igpu)" if kind == "igpu" else None,
                   description=f"virtual {kind.upper()} ({fmt_bytes(memory)}, planning only)",
                   unsupported_ops=unsupported_ops)

    @property
    def kind(self) -> str:
        """gpu / igpu for virtual devices; the device type's name otherwise."""
        if self.virtual:
            return "igpu" if self.type == DeviceType.IGPU else "gpu"
        return self.type.value.lower()

    def memory(self) -> tuple[int, int]:
        if self._memory is not None:
            return self._memory
        return self.stands_for.memory()

    def buffer_types(self) -> list[BufferType]:
        return [self._buft]

    def uma_reason(self) -> str | None:
        return self._uma if self.virtual else self.stands_for.uma_reason()

    def staging_bytes(self, largest_transfer: int) -> int:
        if not self.virtual:
            return self.stands_for.staging_bytes(largest_transfer)
        if self._uma or largest_transfer <= 0:
            return 0
        from pyggml.backend.vulkan.device import staging_size
        return staging_size(largest_transfer)        # a discrete GPU: not host-mapped

    def is_software(self) -> bool:
        return False if self.virtual else self.stands_for.is_software()

    def init_backend(self, **params) -> "PlanningBackend":
        return PlanningBackend(self)


class PlanningBackend(Backend):
    """Answers the scheduler's questions as the backend it stands for would; computes nothing."""

    def __init__(self, device: PlanningDevice):
        self.device, self.name = device, device.name
        self.offload_min_batch = getattr(device.rules, "offload_min_batch", None)

    def supports_buft(self, buft) -> bool:
        return buft is self.device.default_buffer_type()

    def supports_op(self, node) -> bool:
        if node.op in VIEW_OPS or node.op == Op.NONE:
            return True
        if node.op.name in self.device.unsupported_ops:
            return False
        return self.device.rules.supports_op(node)

    def offload_op(self, node) -> bool:
        return self.supports_op(node) and self.device.rules.offload_op(node)

    def graph_compute(self, graph) -> None:
        raise BackendError(f"{self.name} is a planning-only device: it computes nothing")

    def close(self) -> None:
        if not self.device.virtual:
            self.device.rules.close()
