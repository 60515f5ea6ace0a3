"""The device catalog: the devices a plan may name, with what it needs to know of each (free
memory, buffer types, whether it is a software or a planning-only device).

    catalog = DeviceCatalog.from_registry(virtual=[VirtualSpec("laptop", 8 << 30)])
    catalog.with_rpc(["10.0.0.2:50052"])     # an rpc-server's devices, connected now
    catalog.lookup("vulkan0")                # ('Vulkan0', None) or (None, 'absent' | 'unknown')

It lists this machine's devices (a Registry's), rpc-servers' devices and virtual ones (declared
for planning: "would it fit on an 8 GiB card?"). The runtime, the dry run and the memory plan all
name devices through it; which devices a config brings is pyggml.offload.devices'.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from pyggml.backend.base import DeviceType, default_registry
from pyggml.backend.planning import PlanningDevice
from pyggml.errors import ConfigError
from pyggml.units import parse_size

CPU = "CPU"
#: devices pyggml can have: Vulkan<i>, and rpc-server devices RPC[host:port] / RPC<d>[host:port]
GPU_NAME = re.compile(r"^(vulkan\d+|rpc\d*\[[^\]]+\])$", re.IGNORECASE)


@dataclass(frozen=True)
class VirtualSpec:
    """A device declared for planning: `--virtual-device NAME=SIZE[:igpu]` or a config's
    `virtual_devices` entry. memory: bytes; kind: gpu (own memory) or igpu (system RAM)."""
    name: str
    memory: int
    kind: str = "gpu"

    def __post_init__(self):
        object.__setattr__(self, "memory", parse_size(self.memory, f"device {self.name}"))
        object.__setattr__(self, "kind", str(self.kind).lower())
        if self.kind not in ("gpu", "igpu"):
            raise ConfigError(f"virtual device '{self.name}': kind must be 'gpu' or 'igpu', got "
                              f"{self.kind!r}")

    @classmethod
    def parse(cls, text: str, flag: str = "--virtual-device") -> "VirtualSpec":
        """NAME=SIZE[:igpu] (e.g. laptop=8GiB, apu=16GiB:igpu); a size left out: 8 GiB."""
        name, _, rest = str(text).partition("=")
        size, _, kind = rest.partition(":")
        if not name.strip():
            raise ConfigError(f"{flag} {text!r}: expected NAME=SIZE[:igpu], e.g. laptop=8GiB")
        if name.strip().upper() == CPU:
            raise ConfigError(f"{flag} {text!r}: the CPU always exists; its free memory is "
                              f"read from the system")
        return cls(name.strip(), parse_size(size, f"{flag} {name.strip()}") if size.strip()
                   else 8 << 30, (kind or "gpu").strip().lower())

    def device(self):
        return PlanningDevice.virtual_gpu(self.name, self.memory, self.kind)


@dataclass(frozen=True)
class DeviceInfo:
    """A device a plan may name. free/total: bytes (None: unknown); planning: a virtual device
    (planning only, no hardware); assumed_memory: free/total were declared, not read."""
    name: str
    is_cpu: bool = False
    free: int | None = None
    total: int | None = None
    buffer_types: tuple[str, ...] = ()
    description: str = ""
    planning: bool = False
    assumed_memory: bool = False
    software: bool = False      # slower than the CPU (lavapipe): used only where named


def _info_of(d, assumed: int | None = None) -> DeviceInfo:
    free, total = (assumed, assumed) if assumed is not None else d.memory()
    bts = tuple(b.name for b in d.buffer_types())
    host = d.host_buffer_type()
    if host is not None and host.name not in bts:
        bts += (host.name,)
    virtual = getattr(d, "virtual", False)
    return DeviceInfo(d.name, d.type == DeviceType.CPU, free, total, bts, d.description,
                      planning=virtual, assumed_memory=virtual or assumed is not None,
                      software=d.is_software() and assumed is None)



class DeviceCatalog:
    """The devices a plan may name: this machine's (registry order: GPUs, then the CPU) and
    virtual ones (planning-only devices a config or a flag declares). The one device catalog of
    the runtime, the dry run and the memory plan. devices: name -> Device (absent in catalogs
    made from bare DeviceInfos); assumed: name -> bytes of memory declared for a real device;
    permissive: accept any device name as present (plan_from_args, which has no registry)."""

    def __init__(self, infos, permissive: bool = False, devices=None, assumed=None):
        infos = list(infos)
        if not any(d.is_cpu for d in infos):
            infos.append(DeviceInfo(CPU, is_cpu=True, buffer_types=(CPU,)))
        self.infos = [d for d in infos if not d.is_cpu] + [d for d in infos if d.is_cpu]
        self.permissive = permissive
        self.devices = dict(devices or {})
        self.assumed = dict(assumed or {})

    @classmethod
    def from_registry(cls, registry=None, virtual=()) -> "DeviceCatalog":
        """The registry's devices plus `virtual`: VirtualSpecs (or PlanningDevices). A spec
        with a real device's name declares that device's memory instead ("would it fit on a
        4 GiB card?")."""
        reg = registry or default_registry()
        return cls([], devices={d.name: d for d in reg.devices()}).with_devices(virtual)

    def with_devices(self, virtual) -> "DeviceCatalog":
        """This catalog plus virtual devices (VirtualSpec or PlanningDevice); a spec declared
        again with the same size and kind is kept once, another one of the same name is an
        error."""
        devices, assumed = dict(self.devices), dict(self.assumed)
        for v in virtual:
            if isinstance(v, VirtualSpec):
                real = next((n for n, d in devices.items() if n.lower() == v.name.lower()
                             and not getattr(d, "virtual", False)), None)
                if real is not None:
                    assumed[real] = v.memory
                    continue
                v = v.device()
            old = next((d for n, d in devices.items() if n.lower() == v.name.lower()), None)
            if old is not None:
                if isinstance(old, PlanningDevice) and old.virtual and \
                        (old.memory(), old.kind) == (v.memory(), v.kind):
                    continue
                raise ConfigError(f"virtual device '{v.name}' has the name of another device "
                                  f"({', '.join(devices)})")
            devices[v.name] = v
        infos = [_info_of(d, assumed.get(n)) for n, d in devices.items()]
        return DeviceCatalog(infos, self.permissive, devices, assumed)

    def with_rpc(self, endpoints) -> "DeviceCatalog":
        """This catalog plus the devices of llama.cpp rpc-servers (host:port; connected now,
        their devices registered)."""
        if not endpoints:
            return self
        from pyggml.backend.rpc import register_endpoints
        devices = dict(self.devices)
        for reg in register_endpoints(endpoints):
            devices.update({d.name: d for d in reg.devices()})
        return DeviceCatalog([], self.permissive, devices, self.assumed).with_devices([])

    def default_gpu(self) -> str | None:
        """Where -ngl goes without -dev: a virtual device if one is declared, else the first
        GPU that is not a software device (those are used only where named)."""
        gpus = [d for d in self.infos if not d.is_cpu and not d.software]
        names = [d.name for d in gpus if d.planning] + [d.name for d in gpus if not d.planning]
        return names[0] if names else None

    def memory_of(self, name: str) -> tuple[int, int]:
        """(free, total) bytes of a device: the declared size where one was assumed."""
        d = self.device(name)
        n = self.assumed.get(d.name)
        return (n, n) if n is not None else d.memory()

    def device(self, name: str):
        """The Device of a name (case-insensitive); ConfigError naming the known ones."""
        for n, d in self.devices.items():
            if n.lower() == name.lower():
                return d
        if name.upper() == CPU:
            from pyggml.backend.cpu import cpu_device
            return cpu_device()
        raise ConfigError(f"no device named '{name}' (known: {', '.join(self.names())})")

    def names(self) -> list[str]:
        return [d.name for d in self.infos]

    def info(self, name: str) -> DeviceInfo | None:
        return next((d for d in self.infos if d.name.lower() == name.lower()), None)

    def lookup(self, ref) -> tuple[str | None, str | None]:
        """(canonical name, None), or (None, 'absent' | 'unknown')."""
        if isinstance(ref, int):
            if 0 <= ref < len(self.infos):
                return self.infos[ref].name, None
            return None, "absent"
        if ref.strip().lower() == "cpu":
            return CPU, None
        d = self.info(ref.strip())
        if d is not None:
            return d.name, None
        if self.permissive:
            return ref.strip(), None
        return None, ("absent" if GPU_NAME.match(ref.strip()) else "unknown")

    def lookup_buffer_type(self, name: str) -> tuple[str | None, str | None]:
        """(device name, buffer type name), or (None, None)."""
        for d in self.infos:
            for bt in d.buffer_types:
                if bt.lower() == name.lower():
                    return d.name, bt
        if self.permissive:
            return name, name
        return None, None
