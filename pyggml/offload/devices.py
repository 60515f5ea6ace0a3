"""The devices an offload config brings or names: whether planning it needs this machine's
devices listed (listing loads every backend module), and the catalog it is planned on (its
rpc-servers connected, its virtual devices declared). The catalog itself is
pyggml.backend.catalog's.
"""

from __future__ import annotations

from pyggml.backend.base import Registry
from pyggml.backend.catalog import CPU, DeviceCatalog, VirtualSpec
from pyggml.offload.config import device_refs
from pyggml.units import size_or_none


def needs_machine_devices(cfg, virtual=()) -> bool:
    """Whether a plan of `cfg` (a Config; None: CPU only) may place anything on a device of this
    machine other than the CPU, so that listing this machine's devices is needed: gpu_layers
    without `devices` (every GPU found), an rpc-server, or any device, device index or buffer
    type a rule, `devices` or `kv` names that is not the CPU or a virtual device (`virtual`:
    VirtualSpecs or names, and the config's own virtual_devices). Listing devices loads every
    backend module (Vulkan: its loader and drivers, lavapipe's LLVM ~50 MB resident), which a
    CPU-only plan or run does without."""
    if cfg is None:
        return False
    if cfg.get(("rpc",)):
        return True
    ngl = cfg.get(("gpu_layers",), 0)
    if cfg.get(("devices",)) is None and (ngl == "all" or (ngl or 0) > 0):
        return True
    known = {CPU.lower(), "layer"} | {getattr(v, "name", v).lower() for v in virtual} | {
        str(v.get("name", "")).lower() for v in cfg.get(("virtual_devices",)) or []}
    return any(not isinstance(d, str) or d.strip().lower() not in known
               for d in device_refs(cfg.data))


def registry_for(cfg, virtual=()):
    """The registry to list devices from for `cfg`: the CPU's alone when the plan cannot use
    another device of this machine (needs_machine_devices), else None (the default one)."""
    if needs_machine_devices(cfg, virtual):
        return None
    return Registry(("pyggml.backend.cpu",))


def with_config_devices(catalog: DeviceCatalog, cfg) -> DeviceCatalog:
    """`catalog` plus the devices a config (a Config) brings: its `rpc` servers (connected now,
    their devices registered) and its `virtual_devices` (a name already listed keeps its
    entry)."""
    cat = catalog.with_rpc(cfg.get(("rpc",)) or [])
    specs = [VirtualSpec(v["name"], size_or_none(v["memory"]), v.get("kind", "gpu"))
             for v in cfg.get(("virtual_devices",)) or [] if cat.info(v["name"]) is None]
    return cat.with_devices(specs) if specs else cat
