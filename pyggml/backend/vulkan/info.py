"""What a Vulkan device is, for the Vulkan backend: the loader, the physical devices' facts
(limits, subgroups, 16-bit storage, memory heaps) and the kernel shapes chosen from them
(KernelConfig). No logical device is created here (see device.py).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path

from pyggml import settings
from pyggml.errors import BackendError, InvalidArgumentError

_VK = None
_VK_ERROR: str | None = None


def vk_module():
    """The `vulkan` binding, or None when it or the system's Vulkan loader is missing
    (`loader_error()` says why)."""
    global _VK, _VK_ERROR
    if _VK is None and _VK_ERROR is None:
        try:
            import vulkan  # noqa: PLC0415 - the loader is optional
            _VK = vulkan
        except (OSError, ImportError) as e:
            _VK_ERROR = f"the Vulkan loader or the `vulkan` Python binding is missing ({e})"
    return _VK


def loader_error() -> str | None:
    vk_module()
    return _VK_ERROR


class VulkanMemoryError(BackendError, MemoryError):
    """Device memory could not be allocated; the message names the size asked and the heap."""


def _human(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)


def shader_dir() -> Path:
    """Where the compiled SPIR-V lives: $PYGGML_SHADER_DIR (pyggml.settings), else
    <repo>/build/shaders (`make shaders`), else the installed package's pyggml/shaders (a wheel:
    setup.py's build_shaders)."""
    env = settings.current().shader_dir
    if env:
        return env
    repo = Path(__file__).resolve().parents[3] / "build" / "shaders"
    package = Path(__file__).resolve().parents[2] / "shaders"
    return repo if repo.is_dir() or not package.is_dir() else package


# ---- physical devices ----------------------------------------------------------------------------

DEVICE_TYPES = {0: "other", 1: "integrated GPU", 2: "discrete GPU", 3: "virtual GPU", 4: "CPU"}


@dataclass
class DeviceInfo:
    """What a physical device reports, as far as the backend cares."""
    index: int
    name: str
    type_name: str                 # DEVICE_TYPES
    api_version: tuple[int, int, int]
    driver: str
    max_wg_invocations: int
    max_wg_size: tuple[int, int, int]
    max_wg_count: tuple[int, int, int]
    max_shared_memory: int
    max_storage_range: int
    max_allocation: int
    min_storage_offset_alignment: int
    max_push_constants: int
    subgroup_size: int
    subgroup_arithmetic: bool      # basic + arithmetic ops in compute shaders
    storage16: bool                # storageBuffer16BitAccess
    heaps: list[tuple[int, bool]]  # (size, device_local) per heap
    memory_types: list[tuple[int, int]] = field(default_factory=list)   # (flags, heap)

    @property
    def is_gpu(self) -> bool:
        return self.type_name.endswith("GPU")

    def describe(self) -> str:
        return (f"{self.name} ({self.type_name}, Vulkan {'.'.join(map(str, self.api_version))}, "
                f"subgroup {self.subgroup_size}, storage range {_human(self.max_storage_range)})")


class Instance:
    """The process's VkInstance (created on first use, never destroyed)."""

    _inst = None

    @classmethod
    def get(cls):
        vk = vk_module()
        if vk is None:
            raise BackendError(loader_error())
        if cls._inst is None:
            app = vk.VkApplicationInfo(pApplicationName="pyggml", applicationVersion=1,
                                       pEngineName="pyggml", engineVersion=1,
                                       apiVersion=vk.VK_MAKE_VERSION(1, 2, 0))
            cls._inst = vk.vkCreateInstance(vk.VkInstanceCreateInfo(pApplicationInfo=app), None)
        return cls._inst

    @classmethod
    def physical_devices(cls) -> list:
        return list(vk_module().vkEnumeratePhysicalDevices(cls.get()))


def query_device(index: int, pd) -> DeviceInfo:
    vk = vk_module()
    props = vk.vkGetPhysicalDeviceProperties(pd)
    lim = props.limits
    sg = vk.VkPhysicalDeviceSubgroupProperties()
    vk.vkGetPhysicalDeviceProperties2(pd, vk.VkPhysicalDeviceProperties2(pNext=sg))
    maint3 = vk.VkPhysicalDeviceMaintenance3Properties()
    vk.vkGetPhysicalDeviceProperties2(pd, vk.VkPhysicalDeviceProperties2(pNext=maint3))
    f16 = vk.VkPhysicalDevice16BitStorageFeatures()
    vk.vkGetPhysicalDeviceFeatures2(pd, vk.VkPhysicalDeviceFeatures2(pNext=f16))
    mp = vk.vkGetPhysicalDeviceMemoryProperties(pd)
    v = props.apiVersion
    arith = vk.VK_SUBGROUP_FEATURE_BASIC_BIT | vk.VK_SUBGROUP_FEATURE_ARITHMETIC_BIT
    return DeviceInfo(
        index=index, name=props.deviceName, type_name=DEVICE_TYPES.get(props.deviceType, "other"),
        api_version=(v >> 22, (v >> 12) & 0x3ff, v & 0xfff), driver=str(props.driverVersion),
        max_wg_invocations=lim.maxComputeWorkGroupInvocations,
        max_wg_size=tuple(lim.maxComputeWorkGroupSize),
        max_wg_count=tuple(lim.maxComputeWorkGroupCount),
        max_shared_memory=lim.maxComputeSharedMemorySize,
        max_storage_range=lim.maxStorageBufferRange,
        max_allocation=maint3.maxMemoryAllocationSize or (1 << 31),
        min_storage_offset_alignment=lim.minStorageBufferOffsetAlignment,
        max_push_constants=lim.maxPushConstantsSize, subgroup_size=max(1, sg.subgroupSize),
        subgroup_arithmetic=bool(sg.supportedStages & vk.VK_SHADER_STAGE_COMPUTE_BIT)
        and (sg.supportedOperations & arith) == arith,
        storage16=bool(f16.storageBuffer16BitAccess),
        heaps=[(mp.memoryHeaps[i].size,
                bool(mp.memoryHeaps[i].flags & vk.VK_MEMORY_HEAP_DEVICE_LOCAL_BIT))
               for i in range(mp.memoryHeapCount)],
        memory_types=[(mp.memoryTypes[i].propertyFlags, mp.memoryTypes[i].heapIndex)
                      for i in range(mp.memoryTypeCount)],
    )


def binding_limit(info: DeviceInfo, storage_range: int | None = None) -> int:
    """Bytes one storage-buffer window covers: the device's maxStorageBufferRange (or the
    smaller `storage_range` asked for), in whole 4 KiB pages."""
    rng = min(info.max_storage_range, storage_range or info.max_storage_range, 1 << 32)
    return rng // 4096 * 4096 if rng >= 8192 else rng // 4 * 4


# ---- kernel configuration ------------------------------------------------------------------------

def _pow2_floor(n: int) -> int:
    return 1 << (max(1, n).bit_length() - 1)


@dataclass
class KernelConfig:
    """Kernel shapes for one device, chosen from its limits (see `for_device`)."""
    wg_elem: int          # element-wise ops: invocations per workgroup
    ept: int              # element-wise ops: elements per invocation
    wg_reduce: int        # one-row-per-workgroup kernels (norms, softmax, matvec, attention)
    subgroup: bool        # reductions with subgroup arithmetic (else shared memory only)
    store16: bool         # fp16 stores through 16-bit storage (else word atomics)
    mm_tile: int          # tiled matmul: mm_tile x mm_tile outputs, (mm_tile/4)^2 invocations
    mmv_rows: int = 1                  # matrix-vector kernel: weight rows per workgroup
    mmv_max_cols: int = 8              # activation rows for the matrix-vector kernel (else tiled)
    host_mapped: bool = True           # read/write host-visible device memory directly
    storage_range: int | None = None   # bytes one binding may cover (None: the device's limit)

    @classmethod
    def for_device(cls, info: DeviceInfo, **overrides) -> "KernelConfig":
        """Rules: a CPU device (lavapipe) runs a workgroup as SIMD chunks of the subgroup size and
        pays for every barrier between chunks, so row kernels use exactly one subgroup, and it
        pays a fixed cost per invocation, so element-wise kernels take 8 elements per invocation
        (ADD over 640 x 64: 2.4x faster than 1); GPUs get 64 invocations (two waves of 32, one
        of 64) and one element per invocation. The matrix-vector kernel computes several weight
        rows together, sharing the activation loads: 8 on a CPU device (lavapipe, Gemma 3
        shapes: 1.2-1.6x faster than 1 row), 2 on GPUs (register pressure). Tiles:
        64x64 (256 invocations) on GPUs that allow 256 invocations and 2 x 64 x 33 floats of
        shared memory, else 32x32. Overrides are checked against the same limits."""
        cap = _pow2_floor(min(info.max_wg_invocations, info.max_wg_size[0]))
        sgs = info.subgroup_size
        if not info.is_gpu and sgs >= 4 and sgs & (sgs - 1) == 0:
            wg_reduce = min(sgs, cap)
        else:
            wg_reduce = min(64, cap)
        big_tile = info.is_gpu and cap >= 256 and info.max_shared_memory >= 2 * 64 * 33 * 4 + 1024
        cfg = cls(wg_elem=min(256 if info.is_gpu else 64, cap), ept=1 if info.is_gpu else 8,
                  wg_reduce=wg_reduce,
                  subgroup=info.subgroup_arithmetic, store16=info.storage16,
                  mm_tile=64 if big_tile else 32, mmv_rows=2 if info.is_gpu else 8)
        for k, val in overrides.items():
            if not hasattr(cfg, k):
                known = ", ".join(f.name for f in dataclasses.fields(cls))
                raise InvalidArgumentError(f"unknown Vulkan kernel setting {k!r}; known: {known}")
            setattr(cfg, k, val)
        if cfg.store16 and not info.storage16:
            raise InvalidArgumentError(f"store16=True: {info.name} has no "
                                       f"storageBuffer16BitAccess")
        if cfg.subgroup and not info.subgroup_arithmetic:
            raise InvalidArgumentError(f"subgroup=True: {info.name} has no subgroup arithmetic in "
                                       f"compute shaders")
        for k in ("wg_elem", "wg_reduce"):
            v = getattr(cfg, k)
            if v < 1 or v & (v - 1) or v > cap:
                raise InvalidArgumentError(f"{k}={v}: must be a power of two <= {cap} on "
                                           f"{info.name}")
        if cfg.mm_tile not in (32, 64) or (cfg.mm_tile // 4) ** 2 > cap or \
                2 * cfg.mm_tile * 33 * 4 > info.max_shared_memory:
            raise InvalidArgumentError(f"mm_tile={cfg.mm_tile}: 32 or 64 within the device's "
                                       f"limits")
        if not 1 <= cfg.ept <= 64:
            raise InvalidArgumentError(f"ept={cfg.ept}: must be in 1..64")
        if not 1 <= cfg.mmv_max_cols <= 64 or cfg.mmv_rows < 1:
            raise InvalidArgumentError(f"mmv_max_cols={cfg.mmv_max_cols} must be in 1..64 and "
                                       f"mmv_rows={cfg.mmv_rows} >= 1")
        return cfg
