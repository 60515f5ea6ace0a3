"""Offload plans: which device holds each weight and each layer's KV cache, where ops run per
phase, and why.

An `OffloadPlan` is what the model runtime consumes. It comes from an offload config
(`plan_from_config`: a YAML file read by pyggml.offload.config, or a Config) or from llama.cpp's
flags (`plan_from_args`: -ngl, -ot, --no-kv-offload, --no-op-offload), which are translated into
the same config first, so both give the same plan. Every placement records the rule that decided
it, so `pyggml plan` can say why a tensor lives where it does.

How a weight's device is decided (llama.cpp's order):
1. `overrides` without `phase`, in order: the first rule whose match / layers / kind all hold;
2. `gpu_layers` (-ngl): of the n_layer + 1 layer slots (layers 0..n_layer-1, then the output
   layer: output norm and output matrix), the LAST N go to the GPUs of `devices`, shared by
   `tensor_split` (-ts; default: in proportion to free memory). So -ngl 1 offloads only the
   output, -ngl n_layer + 1 (or 99, or `all`) everything. Token embeddings stay on the CPU
   (get_rows of a few rows is not worth a device copy); a tied output matrix planned on another
   device than token_embd appears as "output.weight": a copy is placed there;
3. otherwise the CPU.
A layer's KV cache goes to that layer's gpu_layers device unless `kv` says otherwise. Rules with
`phase` do not move memory: in their phase the ops that read matched weights run on their device
(`pin_phase_ops`), the weights being copied per batch, like op offload.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from pyggml.errors import ConfigError
from pyggml.types import Op
from pyggml.units import size_or_none
from pyggml.offload.config import (
    CLI,
    KINDS,
    PHASES,
    Config,
    Where,
    device_refs,
    _did_you_mean,
    _fmt_range,
    format_layers,
    key_path,
    load_config,
    parse_layers,
)

CPU = "CPU"
_LAYER_RE = re.compile(r"^blk\.(\d+)\.")
# devices pyggml can have: Vulkan<i>, and rpc-server devices RPC[host:port] / RPC<d>[host:port]
_GPU_NAME = re.compile(r"^(vulkan\d+|rpc\d*\[[^\]]+\])$", re.IGNORECASE)


@dataclass(frozen=True)
class Placement:
    """device: a Registry device name ("CPU", "Vulkan0", ...); rule: what decided it;
    buffer_type: a buffer type of that device by name (None: its default)."""
    device: str
    rule: str
    buffer_type: str | None = None


@dataclass
class RuleReport:
    """One override rule as applied to a model: the tensors it matches on its own and those it
    decided (first match wins)."""
    index: int
    label: str
    where: Where
    device: str
    phase: str | None
    matched: list[str] = field(default_factory=list)
    decided: list[str] = field(default_factory=list)
    shadowed_by: list[int] = field(default_factory=list)


@dataclass
class RunSettings:
    """Runtime sizes a config sets (None: not set, the caller's value stays). type_k / type_v:
    per layer."""
    n_ctx: int | None = None
    n_batch: int | None = None
    n_ubatch: int | None = None
    n_seq_max: int | None = None
    n_threads: int | None = None
    n_threads_batch: int | None = None
    type_k: list[str] | None = None
    type_v: list[str] | None = None


@dataclass
class OffloadPlan:
    """devices: device names in priority order, CPU last. weights: tensor name -> Placement
    ("output.weight" appears even for tied models when the output goes to another device than
    token_embd). kv: per layer. op_offload: per phase ("prefill", "decode"): whether the
    scheduler may move a large op to a higher-priority device although its weight is in host
    memory. n_copies: pipeline copies of split inputs. phase_ops: per phase, weight name -> where
    the ops reading it run in that phase (phase rules; only where that differs from its memory).
    rules, warnings, gpu_layer_devices: what `pyggml plan` shows."""
    devices: list[str]
    weights: dict[str, Placement]
    kv: list[Placement]
    op_offload: dict[str, bool] = field(default_factory=lambda: {"prefill": True, "decode": True})
    n_copies: int = 1
    phase_ops: dict[str, dict[str, Placement]] = field(default_factory=dict)
    rules: list[RuleReport] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    layer_devices: list[str] = field(default_factory=list)    # n_layer + 1 slots (gpu_layers)
    settings: RunSettings | None = None       # the sizes the config set (plan_from_config)

    def weight_device(self, name: str) -> str:
        p = self.weights.get(name)
        return p.device if p else CPU

    def devices_used(self) -> list[str]:
        """Devices holding weights or KV, running phase-rule ops, or (op offload on in some
        phase) any listed device: those get a backend."""
        used = ({p.device for p in self.weights.values()} | {p.device for p in self.kv}
                | {p.device for ops in self.phase_ops.values() for p in ops.values()})
        if any(self.op_offload.values()):
            used |= set(self.devices)
        return [d for d in self.devices if d in used or d == CPU]


def layer_of(name: str) -> int | None:
    """The transformer layer index of a tensor name (blk.N.*), None for global tensors."""
    m = _LAYER_RE.match(name)
    return int(m.group(1)) if m else None


_EXPERTS = re.compile(r"^ffn_\w+_(exps|shexp)\b")


def is_expert(name: str) -> bool:
    """A mixture-of-experts weight: blk.N.ffn_{gate,up,down,gate_up}_exps (the stacked routed
    experts, [ne0, ne1, n_expert]) or ffn_*_shexp (the shared expert), as llama.cpp names them."""
    il = layer_of(name)
    return il is not None and bool(_EXPERTS.match(name.split(".", 2)[2]))


def tensor_kind(name: str) -> str | None:
    """attn, ffn, experts (MoE expert FFN weights: also of kind ffn), norm (in layers), embd,
    output, or None (e.g. rope_freqs)."""
    il = layer_of(name)
    if il is not None:
        short = name.split(".", 2)[2]
        if "norm" in short:
            return "norm"
        if short.startswith("attn_"):
            return "attn"
        if _EXPERTS.match(short):
            return "experts"
        if short.startswith("ffn_"):
            return "ffn"
        return None
    if name.startswith(("token_embd", "position_embd", "token_types")):
        return "embd"
    if name.startswith("output"):
        return "output"
    return None


# ---- devices ----

@dataclass(frozen=True)
class VirtualSpec:
    """A device declared for planning: `--virtual-device NAME=SIZE[:igpu]` or a config's
    `virtual_devices` entry. memory: bytes; kind: gpu (own memory) or igpu (system RAM)."""
    name: str
    memory: int
    kind: str = "gpu"

    def __post_init__(self):
        from pyggml.units import parse_size
        object.__setattr__(self, "memory", parse_size(self.memory, f"device {self.name}"))
        object.__setattr__(self, "kind", str(self.kind).lower())
        if self.kind not in ("gpu", "igpu"):
            raise ConfigError(f"virtual device '{self.name}': kind must be 'gpu' or 'igpu', got "
                              f"{self.kind!r}")

    @classmethod
    def parse(cls, text: str, flag: str = "--virtual-device") -> "VirtualSpec":
        """NAME=SIZE[:igpu] (e.g. laptop=8GiB, apu=16GiB:igpu); a size left out: 8 GiB."""
        from pyggml.units import parse_size
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
        from pyggml.backend.planning import PlanningDevice
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
    from pyggml.backend.base import DeviceType
    free, total = (assumed, assumed) if assumed is not None else d.memory()
    bts = tuple(b.name for b in d.buffer_types())
    host = d.host_buffer_type()
    if host is not None and host.name not in bts:
        bts += (host.name,)
    virtual = getattr(d, "virtual", False)
    return DeviceInfo(d.name, d.type == DeviceType.CPU, free, total, bts, d.description,
                      planning=virtual, assumed_memory=virtual or assumed is not None,
                      software=d.is_software() and assumed is None)


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
    from pyggml.backend.base import Registry
    return Registry(("pyggml.backend.cpu",))


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
        from pyggml.backend.base import default_registry
        reg = registry or default_registry()
        return cls([], devices={d.name: d for d in reg.devices()}).with_devices(virtual)

    def with_devices(self, virtual) -> "DeviceCatalog":
        """This catalog plus virtual devices (VirtualSpec or PlanningDevice); a spec declared
        again with the same size and kind is kept once, another one of the same name is an
        error."""
        from pyggml.backend.planning import PlanningDevice
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

    def with_virtual(self, cfg) -> "DeviceCatalog":
        """This catalog plus the devices a config brings: its `rpc` servers (connected now, their
        devices registered) and its `virtual_devices` (a name already listed keeps its entry)."""
        cat = self
        servers = cfg.get(("rpc",)) or []
        if servers:
            from pyggml.backend.rpc import register_endpoints
            devices = dict(self.devices)
            for reg in register_endpoints(servers):
                devices.update({d.name: d for d in reg.devices()})
            cat = DeviceCatalog([], self.permissive, devices, self.assumed).with_devices([])
        specs = [VirtualSpec(v["name"], size_or_none(v["memory"]), v.get("kind", "gpu"))
                 for v in cfg.get(("virtual_devices",)) or [] if cat.info(v["name"]) is None]
        return cat.with_devices(specs) if specs else cat

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
        return None, ("absent" if _GPU_NAME.match(ref.strip()) else "unknown")

    def lookup_buffer_type(self, name: str) -> tuple[str | None, str | None]:
        """(device name, buffer type name), or (None, None)."""
        for d in self.infos:
            for bt in d.buffer_types:
                if bt.lower() == name.lower():
                    return d.name, bt
        if self.permissive:
            return name, name
        return None, None


# ---- rules -------------------------------------------------------------------------------------

@dataclass
class _Rule:
    index: int
    where: Where
    label: str
    regex: re.Pattern | None
    has_layers: bool
    ranges: list | None
    kinds: frozenset | None
    device: str
    buffer_type: str | None
    phase: str | None

    def matches(self, name: str, il: int | None, kind: str | None) -> bool:
        if self.regex is not None and not self.regex.search(name):
            return False
        if self.has_layers:
            if il is None:
                return False
            if self.ranges is not None and not any(a <= il <= b for a, b in self.ranges):
                return False
        if self.kinds is not None and kind not in self.kinds and not (
                kind == "experts" and "ffn" in self.kinds):     # experts are ffn weights too
            return False
        return True


def _where_txt(w: Where) -> str:
    """' (file:12)' for file values; '' for command-line ones (their label is the flag)."""
    if w.text is not None:
        return ""
    return f" ({w.file}:{w.line})" if w.line is not None else f" ({w.file})"


def _rule_label(i: int, r: dict, where: Where, target: str) -> str:
    if where.text is not None and where.text.startswith("-ot"):
        return where.text
    parts = []
    if "name" in r:
        parts.append(repr(r["name"]))
    if "match" in r:
        parts.append(f"match {r['match']!r}")
    if "layers" in r:
        parts.append(f"layers {format_layers(parse_layers(r['layers']))}")
    if "kind" in r:
        k = r["kind"]
        parts.append(f"kind {','.join(k) if isinstance(k, list) else k}")
    phase = f" in {r['phase']}" if "phase" in r else ""
    txt = where.text if where.text is not None else ""
    src = f" [{txt}]" if txt else _where_txt(where)
    return f"overrides[{i}] {' '.join(parts)} -> {target}{phase}{src}"


# ---- resolution --------------------------------------------------------------------------------

class _Resolver:
    """Config + model tensor names + devices -> OffloadPlan and RunSettings."""

    def __init__(self, cfg: Config, names, n_layer: int, tied_output: bool,
                 catalog: DeviceCatalog):
        self.cfg, self.n_layer, self.tied = cfg, n_layer, tied_output
        self.names = list(names)
        self.catalog = catalog
        self.errors: list[str] = []
        self.warnings: list[str] = []
        self.fallback_cpu = cfg.get(("fallback",), "error") == "cpu"
        self._absent_warned: set[str] = set()

    def err(self, path, msg: str) -> None:
        self.errors.append(f"{self.cfg.where_of(path)}: {key_path(path)}: {msg}")

    def device(self, path, ref) -> str | None:
        """A device ref -> a present device name (an absent one -> CPU with fallback: cpu)."""
        name, why = self.catalog.lookup(ref)
        if name is not None:
            return name
        here = ", ".join(self.catalog.names())
        if why == "unknown":
            hint = _did_you_mean(str(ref), self.catalog.names() + ["cpu"])
            self.err(path, f"unknown device {ref!r}{hint}; devices here: {here}")
            return None
        if self.fallback_cpu:
            if str(ref) not in self._absent_warned:
                self._absent_warned.add(str(ref))
                self.warnings.append(f"{self.cfg.where_of(path)}: {key_path(path)}: device "
                                     f"{ref!r} is absent on this machine; fallback: cpu puts "
                                     f"what it would hold on the CPU")
            return CPU
        self.err(path, f"device {ref!r} is absent on this machine (devices here: {here}); set "
                       f"'fallback: cpu' to use the CPU instead")
        return None

    def resolve(self) -> tuple[OffloadPlan, RunSettings]:
        cfg, L = self.cfg, self.n_layer
        # devices in priority order
        listed = cfg.get(("devices",))
        gpus: list[str] = []          # as configured (absent ones mapped later)
        gpu_targets: list[str] = []   # after fallback
        self._n_listed = 0            # GPU entries of `devices`, resolved or not
        if listed is None:        # every GPU, when gpu_layers gives them something to hold
            ngl = cfg.get(("gpu_layers",), 0)
            if ngl == "all" or ngl > 0:
                gpus = [d.name for d in self.catalog.infos if not d.is_cpu and not d.software]
            gpu_targets = list(gpus)
        else:
            for i, ref in enumerate(listed):
                path = ("devices", i)
                name, _ = self.catalog.lookup(ref)
                if name == CPU:
                    if i != len(listed) - 1:
                        self.err(path, "the CPU is always the last device (it takes graph "
                                       "inputs and whatever no GPU can run)")
                    continue
                self._n_listed += 1
                dev = self.device(path, ref)
                if dev is None:
                    continue
                key = dev if dev != CPU else str(ref)        # CPU: an absent GPU, fallback
                if key in gpus:
                    self.err(path, f"device {key} is listed twice")
                    continue
                gpus.append(key)
                gpu_targets.append(dev)
        layer_dev = self._layer_devices(gpus, gpu_targets)
        rules = self._rules()
        names = list(self.names)
        if self.tied and "output.weight" not in names:
            names.append("output.weight")
        weights, reports = self._place_weights(names, rules, layer_dev)
        phase_ops = self._phase_ops(names, rules, weights, reports)
        kv = self._kv(layer_dev)
        settings = self._settings()
        if self.errors:
            raise ConfigError("invalid offload config:\n  " + "\n  ".join(self.errors))
        self._warn_rules(reports, rules)
        used = [g for g in gpu_targets if g != CPU]
        for p in list(weights.values()) + kv + [p for ops in phase_ops.values()
                                                for p in ops.values()]:
            if p.device != CPU and p.device not in used:
                used.append(p.device)
        oo = cfg.get(("op_offload",), True)
        oo = {ph: bool(oo) for ph in PHASES} if isinstance(oo, bool) else \
            {ph: bool(oo.get(ph, True)) for ph in PHASES}
        plan = OffloadPlan(list(dict.fromkeys(used)) + [CPU], weights, kv, oo,
                           cfg.get(("n_copies",), 1), phase_ops, reports, self.warnings,
                           layer_dev)
        return plan, settings

    # -- gpu_layers and tensor_split --
    def _layer_devices(self, gpus, targets) -> list[str]:
        cfg, L = self.cfg, self.n_layer
        ngl = cfg.get(("gpu_layers",), 0)
        n = L + 1 if ngl == "all" else min(int(ngl), L + 1)
        if n > 0 and not gpus:
            here = ", ".join(self.catalog.names())
            soft = [d.name for d in self.catalog.infos if d.software]
            if soft and not cfg.has(("devices",)):
                here += (f"; {', '.join(soft)} computes on the CPU through its driver (a "
                         f"software device, slower than the CPU backend): name it in 'devices' "
                         f"(-dev {soft[0]}) to use it anyway")
            if cfg.has(("devices",)):
                self.err(("gpu_layers",), f"{ngl} layer(s) for the GPUs, but 'devices' names no "
                                          f"GPU (devices here: {here})")
            elif self.fallback_cpu:
                self.warnings.append(f"{cfg.where_of(('gpu_layers',))}: gpu_layers: no GPU "
                                     f"found; fallback: cpu keeps every layer on the CPU")
            else:
                self.err(("gpu_layers",), f"{ngl} layer(s) for the GPUs, but this machine has "
                                          f"no GPU (devices here: {here}); set 'fallback: cpu' "
                                          f"to run on the CPU instead")
            n = 0
        split = cfg.get(("tensor_split",))
        n_listed = self._n_listed if cfg.has(("devices",)) else len(gpus)
        if split is not None and len(gpus) != n_listed:
            split = None                 # a device failed to resolve: that error says enough
        elif split is not None:
            if len(split) != len(gpus):
                self.err(("tensor_split",), f"{len(split)} share(s) for {len(gpus)} GPU(s) in "
                                            f"'devices' ({', '.join(gpus) or 'none'})")
                split = None
            elif sum(split) <= 0:
                self.err(("tensor_split",), "the shares add up to 0")
                split = None
        if split is None and gpus:
            frees = [(self.catalog.info(g).free if self.catalog.info(g) else None) for g in gpus]
            split = frees if all(f for f in frees) else [1.0] * len(gpus)
        cum, acc = [], 0.0
        for s in split or []:
            acc += s
            cum.append(acc)
        cum = [c / acc for c in cum] if acc else cum
        start = L + 1 - n
        out = []
        self._absent_slots: dict[int, str] = {}
        for il in range(L + 1):
            if il < start or not gpus:
                out.append(CPU)
                continue
            f = (il - start) / n
            k = next((i for i, c in enumerate(cum) if c > f), len(cum) - 1)
            out.append(targets[k])
            if targets[k] != gpus[k]:
                self._absent_slots[il] = gpus[k]
        self._ngl_label = self._label(("gpu_layers",), f"gpu_layers: {ngl}")
        self._split_used = len(gpus) > 1
        return out

    def _label(self, path, txt: str) -> str:
        if not self.cfg.has(path):
            return f"{txt} (default)"
        w = self.cfg.where_of(path)
        if w.text is not None and not w.text.startswith("--set"):
            return w.text
        if w.text is not None:
            return f"{txt} [{w.text}]"
        return f"{txt}{_where_txt(w)}"

    # -- overrides --
    def _rules(self) -> list[_Rule]:
        out = []
        for i, r in enumerate(self.cfg.get(("overrides",)) or []):
            path = ("overrides", i)
            if "device" in r:
                dev, bt = self.device(path + ("device",), r["device"]), None
            else:
                dev, bt = self.catalog.lookup_buffer_type(r["buffer_type"])
                if dev is None:
                    ref = r["buffer_type"]
                    if _GPU_NAME.match(ref.strip()):
                        dev, bt = self.device(path + ("buffer_type",), ref), None
                    else:
                        known = [b for d in self.catalog.infos for b in d.buffer_types]
                        self.err(path + ("buffer_type",),
                                 f"unknown buffer type {ref!r}{_did_you_mean(ref, known)}; "
                                 f"buffer types here: {', '.join(known)}")
            if dev is None:
                continue
            if dev == CPU and bt is not None and bt.lower() == CPU.lower():
                bt = None
            layers = r.get("layers")
            kinds = r.get("kind")
            where = self.cfg.where_of(path)
            out.append(_Rule(
                i, where, _rule_label(i, r, where, bt or dev),
                re.compile(r["match"]) if "match" in r else None,
                "layers" in r, parse_layers(layers) if layers is not None else None,
                frozenset(kinds if isinstance(kinds, list) else [kinds]) if kinds else None,
                dev, bt, r.get("phase")))
        return out

    def _place_weights(self, names, rules, layer_dev):
        L = self.n_layer
        weights: dict[str, Placement] = {}
        reports = [RuleReport(r.index, r.label, r.where, r.buffer_type or r.device, r.phase)
                   for r in rules]
        for name in names:
            il, kind = layer_of(name), tensor_kind(name)
            decided = None
            for r, rep in zip(rules, reports):
                if not r.matches(name, il, kind):
                    continue
                rep.matched.append(name)
                if r.phase is not None:
                    continue
                if decided is None:
                    decided = r
                    rep.decided.append(name)
                    weights[name] = Placement(r.device, r.label, r.buffer_type)
                elif decided.index not in rep.shadowed_by:
                    rep.shadowed_by.append(decided.index)
            if decided is not None:
                continue
            if kind == "embd":
                weights[name] = Placement(CPU, "token embeddings stay on the CPU")
            elif il is not None:
                dev = layer_dev[il] if il < L else CPU
                weights[name] = Placement(dev, self._slot_label(il) if il < L else "default: CPU")
            elif kind == "output":
                weights[name] = Placement(layer_dev[L], self._slot_label(L))
            else:
                weights[name] = Placement(CPU, "default: CPU")
        # a tied output matrix needs its own copy only where it differs from token_embd
        if self.tied and "output.weight" not in self.names:
            out, emb = weights.get("output.weight"), weights.get("token_embd.weight")
            if out is not None and emb is not None and (out.device, out.buffer_type) == (
                    emb.device, emb.buffer_type):
                del weights["output.weight"]
        return weights, reports

    def _slot_label(self, il: int) -> str:
        """Why layer slot il is where gpu_layers put it."""
        if not self._gpu_slot(il):
            return "default: CPU"
        absent = self._absent_slots.get(il)
        if absent is not None:
            return f"{self._ngl_label}; {absent} absent -> CPU (fallback: cpu)"
        return self._ngl_label

    def _gpu_slot(self, il: int) -> bool:
        ngl = self.cfg.get(("gpu_layers",), 0)
        n = self.n_layer + 1 if ngl == "all" else min(int(ngl), self.n_layer + 1)
        return il >= self.n_layer + 1 - n and n > 0

    def _phase_ops(self, names, rules, weights, reports):
        out: dict[str, dict[str, Placement]] = {}
        for ph in PHASES:
            prs = [(r, rep) for r, rep in zip(rules, reports) if r.phase == ph]
            if not prs:
                continue
            ops: dict[str, Placement] = {}
            for name in names:
                if name not in weights:
                    continue
                il, kind = layer_of(name), tensor_kind(name)
                first = None
                for r, rep in prs:
                    if not r.matches(name, il, kind):
                        continue
                    if first is None:
                        first = r
                        rep.decided.append(name)
                        if r.device != weights[name].device:
                            ops[name] = Placement(r.device, r.label)
                    elif first.index not in rep.shadowed_by:
                        rep.shadowed_by.append(first.index)
            if ops:
                out[ph] = ops
        return out

    # -- KV cache --
    def _kv(self, layer_dev) -> list[Placement]:
        cfg, L = self.cfg, self.n_layer
        base = cfg.get(("kv", "device"), "layer")
        kvs: list[Placement] = []

        def target(path, ref, il, label):
            if isinstance(ref, str) and ref.strip().lower() == "layer":
                dev = layer_dev[il]
                if dev == CPU and not self._gpu_slot(il):
                    return Placement(CPU, "default: CPU (its layer is on the CPU)")
                if label is None:
                    return Placement(dev, self._slot_label(il))
                return Placement(dev, f"{label} -> {self._slot_label(il)}")
            dev = self.device(path, ref)
            return Placement(dev or CPU, label)

        base_label = (self._label(("kv", "device"), f"kv.device: {base}")
                      if cfg.has(("kv", "device")) else None)
        base_p = [target(("kv", "device"), base, il, base_label) for il in range(L)]
        kvs = list(base_p)
        for i, r in enumerate(cfg.get(("kv", "ranges")) or []):
            ranges = parse_layers(r["layers"])
            path = ("kv", "ranges", i)
            lay = [il for il in range(L) if ranges is None or any(a <= il <= b
                                                                  for a, b in ranges)]
            beyond = [(a, b) for a, b in (ranges or []) if b >= L]
            if beyond:
                self.warnings.append(f"{cfg.where_of(path)}: kv.ranges[{i}]: layers "
                                     f"{', '.join(_fmt_range(a, b) for a, b in beyond)} are "
                                     f"beyond this model's layers 0-{L - 1}")
            if "device" in r:
                label = self._label(path, f"kv.ranges[{i}] layers {format_layers(ranges)}")
                for il in lay:
                    kvs[il] = target(path + ("device",), r["device"], il, label)
        return kvs

    def _settings(self) -> RunSettings:
        cfg, L = self.cfg, self.n_layer
        s = RunSettings()
        ctx = cfg.get(("context",)) or {}
        s.n_ctx, s.n_batch = ctx.get("n_ctx"), ctx.get("n_batch")
        s.n_ubatch, s.n_seq_max = ctx.get("n_ubatch"), ctx.get("n_seq_max")
        th = cfg.get(("threads",))
        if isinstance(th, int):
            s.n_threads = s.n_threads_batch = th
        elif isinstance(th, dict):
            s.n_threads, s.n_threads_batch = th.get("decode"), th.get("batch")
        kv = cfg.get(("kv",)) or {}
        ranges = kv.get("ranges") or []
        if any(k in kv for k in ("type_k", "type_v")) or any(
                k in r for r in ranges for k in ("type_k", "type_v")):
            tk = [kv.get("type_k", "f16")] * L
            tv = [kv.get("type_v", "f16")] * L
            for r in ranges:
                rr = parse_layers(r["layers"])
                for il in range(L):
                    if rr is None or any(a <= il <= b for a, b in rr):
                        tk[il] = r.get("type_k", tk[il])
                        tv[il] = r.get("type_v", tv[il])
            s.type_k, s.type_v = tk, tv
        return s

    def _warn_rules(self, reports, rules) -> None:
        L = self.n_layer
        for r, rep in zip(rules, reports):
            head = f"{r.where}: overrides[{r.index}]"
            if r.where.text is not None and r.where.text.startswith("-ot"):
                head = r.where.text
            if not rep.matched:
                why = ""
                if r.has_layers and r.ranges is not None and all(a >= L for a, _ in r.ranges):
                    why = f" (its layers {format_layers(r.ranges)}; this model has 0-{L - 1})"
                elif r.kinds is not None and not any(tensor_kind(n) in r.kinds
                                                     for n in self.names):
                    why = f" (no tensor of kind {', '.join(sorted(r.kinds))})"
                self.warnings.append(f"{head}: matches no tensor of this model, so it never "
                                     f"applies{why}")
            elif not rep.decided:
                by = ", ".join(f"overrides[{j}]" for j in rep.shadowed_by)
                self.warnings.append(f"{head}: shadowed: each of the {len(rep.matched)} "
                                     f"tensor(s) it matches is decided by an earlier rule ({by})")


def plan_from_config(config, tensor_names, n_layer: int, tied_output: bool, *,
                     catalog: DeviceCatalog | None = None,
                     sets=()) -> tuple[OffloadPlan, RunSettings]:
    """An offload config (a path, a Config or a dict) applied to a model's tensors (names, or a
    name -> TensorInfo mapping) on this machine's devices (default: the registry's)."""
    cfg = load_config(config, sets)
    if catalog is None:
        catalog = DeviceCatalog.from_registry()
    catalog = catalog.with_virtual(cfg)
    plan, settings = _Resolver(cfg, tensor_names, n_layer, tied_output, catalog).resolve()
    plan.settings = settings
    return plan, settings


# ---- llama.cpp's flags -------------------------------------------------------------------------

def config_from_flags(config=None, *, sets=(), n_gpu_layers: int | None = None, overrides=(),
                      kv_offload: bool = True, op_offload: bool = True, devices=None,
                      n_ctx: int | None = None, n_batch: int | None = None,
                      n_ubatch: int | None = None, threads: int | None = None,
                      threads_batch: int | None = None) -> Config:
    """llama.cpp's flags (and a config file they amend) as one Config. Precedence: the file,
    then the flags, then `sets` (--set key=value). overrides: [(regex, device)] (-ot), put before
    the file's rules (first match wins)."""
    cfg = load_config(config) if config is not None else Config({}, {(): Where(CLI)}, CLI)
    if devices is not None:
        cfg = cfg.with_values({"devices": list(devices)},
                              "-dev " + (",".join(map(str, devices)) or "none"))
    if n_gpu_layers is not None:
        if not isinstance(n_gpu_layers, int) or n_gpu_layers < 0:
            raise ConfigError(f"-ngl must be >= 0, got {n_gpu_layers}")
        cfg = cfg.with_values({"gpu_layers": n_gpu_layers}, f"-ngl {n_gpu_layers}")
    if overrides:
        rules = []
        for pattern, device in overrides:
            try:
                re.compile(pattern)
            except re.error as e:
                raise ConfigError(f"-ot {pattern}={device}: invalid regex: {e}") from None
            rules.append({"match": pattern, "device": device})
        old = cfg.get(("overrides",)) or []
        new = cfg.with_values({"overrides": rules + old}, "-ot")
        for i, (pattern, device) in enumerate(overrides):
            new.where[("overrides", i)] = Where(CLI, text=f"-ot {pattern}={device}")
        for j in range(len(old)):          # the file's rules keep their marks
            for p, w in cfg.where.items():
                if p[:2] == ("overrides", j):
                    new.where[("overrides", j + len(rules)) + p[2:]] = w
        cfg = new
    if not kv_offload:
        cfg = cfg.with_values({"kv": {"device": "cpu"}}, "--no-kv-offload")
    if not op_offload:
        cfg = cfg.with_values({"op_offload": False}, "--no-op-offload")
    for key, v, flag in ((("context", "n_ctx"), n_ctx, "-c"), (("context", "n_batch"), n_batch,
                         "-b"), (("context", "n_ubatch"), n_ubatch, "-ub"),
                         (("threads", "decode"), threads, "-t"),
                         (("threads", "batch"), threads_batch, "-tb")):
        if v is not None:
            cfg = cfg.with_values({key[0]: {key[1]: v}}, f"{flag} {v}")
    return cfg.with_sets(sets) if sets else cfg


def plan_from_args(tensor_names, n_layer: int, tied_output: bool, n_gpu_layers: int = 0,
                   gpu_device: str | None = None, overrides=(), kv_offload: bool = True,
                   op_offload: bool = True) -> OffloadPlan:
    """llama.cpp's flags as a plan. overrides: [(regex, device)] (-ot), first match wins, applied
    before -ngl. gpu_device: the device -ngl puts layers on (None: no GPU, everything on CPU).
    Device names are taken as given (the runtime checks that they exist)."""
    if not isinstance(n_gpu_layers, int) or n_gpu_layers < 0:
        raise ConfigError(f"-ngl must be >= 0, got {n_gpu_layers}")
    if n_gpu_layers > 0 and gpu_device is None:
        raise ConfigError("-ngl > 0 needs a GPU device, and none was found "
                          "(pyggml info lists the devices)")
    cfg = config_from_flags(n_gpu_layers=n_gpu_layers, overrides=overrides,
                            kv_offload=kv_offload, op_offload=op_offload,
                            devices=[gpu_device] if gpu_device else [])
    infos = [DeviceInfo(gpu_device)] if gpu_device else []
    plan, _ = _Resolver(cfg, tensor_names, n_layer, tied_output,
                        DeviceCatalog(infos, permissive=True)).resolve()
    return plan


def _names_regex(names, n_layer: int) -> str:
    """An anchored regex matching exactly `names`: blk.N.x names grouped by their layer sets."""
    by_short: dict[str, set[int]] = {}
    glob = []
    for n in names:
        il = layer_of(n)
        if il is None:
            glob.append(n)
        else:
            by_short.setdefault(n.split(".", 2)[2], set()).add(il)
    groups: dict[tuple, list[str]] = {}
    for short, ls in by_short.items():
        groups.setdefault(tuple(sorted(ls)), []).append(short)
    alts = []
    for ls, shorts in groups.items():
        if ls == tuple(range(n_layer)):
            lre = "\\d+"
        else:
            lre = ls[0] if len(ls) == 1 else "(?:" + "|".join(map(str, ls)) + ")"
        sre = (re.escape(shorts[0]) if len(shorts) == 1
               else "(?:" + "|".join(re.escape(s) for s in sorted(shorts)) + ")")
        alts.append(f"blk\\.{lre}\\.{sre}")
    alts += [re.escape(n) for n in sorted(glob)]
    return "^(?:" + "|".join(alts) + ")$" if len(alts) > 1 else f"^{alts[0]}$"


def llama_flags(cfg: Config, plan: OffloadPlan, tensor_names, n_layer: int,
                settings: RunSettings | None = None) -> tuple[list[str], list[str]]:
    """(llama.cpp flags equivalent to the config, what has no llama.cpp equivalent). -ot rules
    keep their order (llama.cpp also takes the first match); a rule with only `match` keeps its
    regex, others become an exact list of the tensors they match in this model."""
    flags: list[str] = []
    missing: list[str] = []
    if cfg.get(("rpc",)):
        flags += ["--rpc", ",".join(cfg.get(("rpc",)))]
    listed = cfg.get(("devices",))
    gpus = [d for d in plan.devices if d != CPU]
    if listed is not None:
        flags += ["-dev", ",".join(gpus) if gpus else "none"]
    ngl = cfg.get(("gpu_layers",), 0)
    if ngl:
        flags += ["-ngl", str(n_layer + 1 if ngl == "all" else ngl)]
    split = cfg.get(("tensor_split",))
    if split is not None:
        flags += ["-ts", ",".join(f"{x:g}" for x in split)]
    names = set(tensor_names)
    for rep in plan.rules:
        r = cfg.get(("overrides", rep.index))
        if rep.phase is not None:
            missing.append(f"{rep.label}: llama.cpp has no per-phase placement (only "
                           f"--no-op-offload for all phases)")
            continue
        matched = [n for n in rep.matched if n in names]
        if "output.weight" in rep.matched and "output.weight" not in names:
            missing.append(f"{rep.label}: a tied output matrix has no name of its own in "
                           f"llama.cpp (it is token_embd.weight, placed with the output layer)")
        if not matched:
            continue
        if r is None:                   # a plan made by another config: its exact tensors
            pat = _names_regex(matched, n_layer)
        elif set(r) - {"name"} <= {"match", "device", "buffer_type"}:
            pat = r["match"]
        elif set(r) - {"name"} <= {"kind", "device"} and r["kind"] in ("experts", ["experts"]):
            pat = r"ffn_\w+_(exps|shexp)\b"          # llama.cpp users write -ot exps=CPU
        else:
            pat = _names_regex(matched, n_layer)
        flags += ["-ot", f"{pat}={rep.device}"]
    kvd = cfg.get(("kv", "device"), "layer")
    ranges = cfg.get(("kv", "ranges")) or []
    if isinstance(kvd, str) and kvd.lower() == "cpu" and not any("device" in r for r in ranges):
        flags.append("--no-kv-offload")
    elif not (isinstance(kvd, str) and kvd.lower() == "layer") or any("device" in r
                                                                      for r in ranges):
        missing.append("kv placement per device or layer range (llama.cpp: the KV cache follows "
                       "its layer, or --no-kv-offload puts all of it on the CPU)")
    if settings is not None and settings.type_k is not None:
        for flag, types in (("-ctk", settings.type_k), ("-ctv", settings.type_v)):
            if len(set(types)) > 1:
                missing.append(f"{flag}: KV types per layer range (llama.cpp: one type for all)")
            elif types and types[0] != "f16":
                flags += [flag, types[0]]
    oo = plan.op_offload
    if not any(oo.values()):
        flags.append("--no-op-offload")
    elif not all(oo.values()):
        missing.append("op_offload per phase (llama.cpp: --no-op-offload for all phases)")
    if plan.n_copies > 1:
        missing.append(f"n_copies: {plan.n_copies} (llama.cpp: a build setting, "
                       f"GGML_SCHED_MAX_COPIES)")
    if settings is not None:
        for flag, v in (("-c", settings.n_ctx), ("-b", settings.n_batch),
                        ("-ub", settings.n_ubatch), ("-np", settings.n_seq_max),
                        ("-t", settings.n_threads), ("-tb", settings.n_threads_batch)):
            if v is not None:
                flags += [flag, str(v)]
    if cfg.get(("fallback",)) == "cpu":
        missing.append("fallback: cpu (llama.cpp fails on a device it does not find)")
    return flags, missing


def shell_join(flags) -> str:
    import shlex
    return " ".join(shlex.quote(f) for f in flags)


# ---- phase rules at run time ---------------------------------------------------------------------

#: below this many tokens, or with every layer and the output offloaded, a layer's norms run
#: where the layer's weights are (llama.cpp's graph callback, llama-context.cpp: "norm" with il >= 0)
NORM_PIN_MAX_TOKENS = 32
_NORM_OPS = (Op.RMS_NORM, Op.NORM)


def pin_phase_ops(sched, graph, plan: OffloadPlan, phase: str, weights: dict, *,
                  n_tokens: int) -> int:
    """Before a graph of `phase` over a batch of n_tokens is reserved or allocated: each
    layer's norms (pin_layer_norms); every node reading a weight that a phase rule sends
    elsewhere is pinned to that device's backend (where it supports the op). Returns the
    number of nodes pinned."""
    backends = {b.name: b for b in sched.backends}
    n = pin_layer_norms(sched, graph, plan, weights, backends, n_tokens)
    ops = plan.phase_ops.get(phase)
    if not ops:
        return n
    want = {id(weights[w]): backends.get(p.device) for w, p in ops.items() if w in weights}
    for node in graph.nodes:
        for s in node.src:
            b = want.get(id(s)) if s is not None else None
            if b is not None and b.supports_op(node):
                sched.set_tensor_backend(node, b)
                n += 1
                break
    return n


def pin_layer_norms(sched, graph, plan: OffloadPlan, weights: dict, backends: dict,
                    n_tokens: int) -> int:
    """A weight-less norm (RMS_NORM, NORM) whose result a layer's norm weight multiplies runs
    on that weight's device, for batches under NORM_PIN_MAX_TOKENS tokens or with every layer
    slot offloaded (-ngl > n_layer), as llama.cpp pins its "norm" tensors. The scheduler
    would otherwise give it the previous node's device: at a layer boundary between two
    devices the next one then needs both the norm's result and the residual (two copies
    instead of one; over RPC two round trips). Returns the number of nodes pinned."""
    full_offload = bool(plan.layer_devices) and CPU not in plan.layer_devices
    if not full_offload and n_tokens >= NORM_PIN_MAX_TOKENS:
        return 0
    layer_weight = {id(t): name for name, t in weights.items() if layer_of(name) is not None}
    n = 0
    for node in graph.nodes:
        if node.op != Op.MUL or len(node.src) < 2 or node.src[1] is None:
            continue
        norm, name = node.src[0], layer_weight.get(id(node.src[1]))
        if name is None or norm is None or norm.op not in _NORM_OPS:
            continue
        b = backends.get(plan.weight_device(name))
        if b is not None and b.supports_op(norm):
            sched.set_tensor_backend(norm, b)
            n += 1
    return n


__all__ = ["CPU", "KINDS", "DeviceCatalog", "DeviceInfo", "VirtualSpec", "OffloadPlan", "Placement",
           "RuleReport", "RunSettings", "config_from_flags", "layer_of", "llama_flags",
           "pin_layer_norms", "pin_phase_ops", "plan_from_args", "plan_from_config", "shell_join", "tensor_kind", "is_expert"]
