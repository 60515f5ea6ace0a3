"""`pyggml plan`: an offload plan worked out without running anything (a dry run).

    report = dry_run("model.gguf", "configs/kv-on-cpu.yaml")
    print(format_report(report))              # tensors, rules, memory per device, warnings
    report.totals["Vulkan0"].compute          # bytes of compute buffer the scheduler reserves

Only the GGUF's tensor table is read (`GGUFModel.open` maps the file; no weight byte is touched,
a test checks it with the weights' pages made unreadable). The model's graph is built exactly as
the runtime builds it, on weight tensors that look placed where the plan puts them: each device
gets a *planning buffer* (`PlanningBuffer`: the device's real buffer type, a fake address range,
no memory), so the scheduler assigns ops (pass 1 follows weights' memory) and the allocator sizes
the compute buffers (`Scheduler.reserve_size`) as they will be at run time. The KV cache is laid
out in planning buffers the same way.

Devices this machine lacks can be assumed for planning (`--assume-device Vulkan1=8GiB`): a
planning-only device with the declared memory, the Vulkan backend's op-support rules and
offload rule, and planning buffers; a device that exists can be given another memory size the
same way ("would it fit on a 4 GiB card?").

`--check-fit` compares each device's planned bytes (weights + KV + compute) with its free memory
(Vulkan heap, psutil for the CPU, the declared size for an assumed device) and, where something
does not fit, tries the smallest changes: KV on the CPU, fewer gpu_layers, a smaller n_ctx.
"""

from __future__ import annotations

import itertools
import os
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path

from pyggml.backend.base import (
    Backend,
    Buffer,
    BufferType,
    BufferUsage,
    Device,
    DeviceType,
    default_registry,
)
from pyggml.context import Context
from pyggml.errors import BackendError, ConfigError, PyggmlError
from pyggml.offload import (
    CPU,
    DeviceCatalog,
    OffloadPlan,
    RunSettings,
    config_from_flags,
    layer_of,
    llama_flags,
    pin_phase_ops,
    plan_from_config,
    shell_join,
)
from pyggml.offload.config import Config, describe_schema, format_layers

DEFAULTS = {"n_ctx": 4096, "n_batch": 2048, "n_ubatch": 512, "n_seq_max": 1}   # pyggml run's


# ---- planning-only memory and devices ----------------------------------------------------------

_PLAN_BASE = 1 << 56            # fake addresses: far from host mappings and Vulkan's range
_space = itertools.count()


class PlanningBuffer(Buffer):
    """A buffer of `buft` that has an address range but no memory: tensors placed in it look
    placed (data, buffer, usage) to the scheduler and the allocator; reading or writing fails."""

    def __init__(self, buft: BufferType, n_bytes: int, usage: BufferUsage = BufferUsage.ANY):
        super().__init__(buft, n_bytes, usage)
        self.base = _PLAN_BASE + (next(_space) << 40)

    def _refuse(self, *_a, **_k):
        raise BackendError(f"planning buffer of {self.name}: no memory behind it (dry run)")

    set_tensor = get_tensor = memset_tensor = clear = _refuse

    def cpy_tensor(self, src, dst) -> bool:
        self._refuse()


class PlanningAllocator:
    """Looks like a buffer type to the KV cache: allocates PlanningBuffers of the real type."""

    def __init__(self, buft: BufferType):
        self.buft = buft
        self.name = buft.name
        self.alignment = buft.alignment

    def alloc_buffer(self, n_bytes: int, usage: BufferUsage = BufferUsage.ANY) -> PlanningBuffer:
        return PlanningBuffer(self.buft, n_bytes, usage)

    def get_alloc_size(self, tensor) -> int:
        return self.buft.get_alloc_size(tensor)


class PlanningBufferType(BufferType):
    def __init__(self, device: "PlanningDevice"):
        super().__init__(device.name, alignment=64, max_size=None, is_host=False, device=device)

    def alloc_buffer(self, n_bytes: int, usage: BufferUsage = BufferUsage.ANY) -> PlanningBuffer:
        return PlanningBuffer(self, n_bytes, usage)


class PlanningDevice(Device):
    """A GPU assumed for planning: declared memory, Vulkan's op rules, no hardware."""

    def __init__(self, name: str, memory: int, max_bind: int):
        self.name = name
        self.description = "planning-only device (assumed, no hardware)"
        self.type = DeviceType.GPU
        self._memory = memory
        self.max_bind = max_bind
        self._buft = PlanningBufferType(self)

    def memory(self) -> tuple[int, int]:
        return self._memory, self._memory

    def buffer_types(self) -> list[BufferType]:
        return [self._buft]

    def init_backend(self, **params) -> "PlanningBackend":
        return PlanningBackend(self)


class PlanningBackend(Backend):
    """Answers the scheduler's questions as the Vulkan backend would; computes nothing."""

    def __init__(self, device: PlanningDevice):
        self.device = device
        self.name = device.name
        self.max_bind = device.max_bind
        self.max_wg_count = (65535, 65535, 65535)
        self.cfg = None

    def supports_buft(self, buft) -> bool:
        return buft is self.device._buft

    def why_unsupported(self, node) -> str | None:
        from pyggml.backend.vulkan.ops import why_unsupported
        return why_unsupported(node, self)

    def supports_op(self, node) -> bool:
        return self.why_unsupported(node) is None

    def offload_op(self, node) -> bool:
        from pyggml.backend.vulkan import VulkanBackend
        return VulkanBackend.offload_op(self, node)

    def graph_compute(self, graph) -> None:
        raise BackendError(f"{self.name} is a planning-only device: it computes nothing")


def parse_size(text: str) -> int:
    """'8GiB', '512M', '2.5G', '1000000' -> bytes (K/M/G/T are powers of 1024)."""
    m = re.fullmatch(r"\s*([0-9]+(?:\.[0-9]+)?)\s*([kmgt]?)(i?b)?\s*", text, re.IGNORECASE)
    if not m:
        raise ConfigError(f"'{text}' is not a memory size (like 8GiB, 512MiB, 2G)")
    mult = 1024 ** " kmgt".index(m.group(2).lower() or " ")
    return int(float(m.group(1)) * mult)


def parse_assumed(items) -> dict[str, int]:
    """['Vulkan1=8GiB', 'Vulkan2'] -> {name: bytes}; a size left out: 8 GiB."""
    out = {}
    for it in items or []:
        name, _, size = it.partition("=")
        if not name.strip():
            raise ConfigError(f"--assume-device {it}: expected NAME[=SIZE], e.g. Vulkan1=8GiB")
        if name.strip().lower() == "cpu":
            raise ConfigError("--assume-device: the CPU always exists; its free memory is read "
                              "from the system")
        out[name.strip()] = parse_size(size) if size else 8 << 30
    return out


# ---- the dry run -------------------------------------------------------------------------------

@dataclass
class DeviceTotals:
    weights: int = 0
    kv: int = 0
    compute: int = 0
    free: int | None = None
    total_memory: int | None = None
    planning: bool = False            # a planning-only device (no hardware)
    assumed_memory: bool = False      # free/total declared with --assume-device

    @property
    def total(self) -> int:
        return self.weights + self.kv + self.compute

    @property
    def fits(self) -> bool | None:
        return None if self.free is None else self.total <= self.free


@dataclass
class FitChange:
    what: str              # 'kv on CPU', 'gpu_layers: 12', 'n_ctx: 8192'
    sets: list[str]        # --set items that make it
    moved: int             # bytes taken off the devices that did not fit
    report: "PlanReport"


@dataclass
class PlanReport:
    model: str
    arch: str
    n_layer: int
    config: Config
    plan: OffloadPlan
    settings: RunSettings            # effective values (defaults filled in)
    tensor_bytes: dict[str, int]     # name -> bytes as placed (aligned on devices)
    kv_bytes: list[int]              # per layer
    totals: dict[str, DeviceTotals]
    compute_by_phase: dict[str, dict[str, int]]
    llama: list[str]
    llama_missing: list[str]
    warnings: list[str]
    descriptions: dict[str, str] = field(default_factory=dict)
    fit_changes: list[FitChange] | None = None

    def not_fitting(self) -> list[str]:
        return [d for d, t in self.totals.items() if t.fits is False]


def _backends(plan: OffloadPlan, catalog: DeviceCatalog, registry, threads):
    """Backends in the plan's priority order: real ones for devices this machine has (they
    only answer questions here), planning backends for assumed ones, the CPU last."""
    from pyggml.backend.cpu import CpuBackend
    real = {d.name: d for d in registry.devices()}
    names = [n for n in plan.devices_used() if n != CPU]
    out = {n: real[n].init_backend() for n in names if n in real}
    mirror = next(iter(out.values()), None)         # assumed GPUs take a real one's limits
    max_bind = getattr(mirror, "max_bind", None) or (1 << 30)
    return ([out[n] if n in out else
             PlanningDevice(n, catalog.info(n).free or 0, max_bind).init_backend()
             for n in names] + [CpuBackend(*threads)])


def _plan_memory(model, hp, plan: OffloadPlan, settings: RunSettings, backends, flash_attn):
    """(tensor bytes, kv bytes per layer, {device: DeviceTotals without free}, compute by
    phase): weights placed in planning buffers, the KV cache laid out, schedulers reserved."""
    from pyggml.llm.kv_cache import KVCache
    from pyggml.llm.models import GraphParams, build_graph, graph_size
    from pyggml.sched import Scheduler
    by_dev = {b.name: b for b in backends}
    totals = {b.name: DeviceTotals() for b in backends}
    ctx = Context(no_alloc=True, name="planned-weights")
    weights, sizes = {}, {}
    groups: dict[str, list] = {}
    for name, p in plan.weights.items():
        src = name if name in model.tensors else "token_embd.weight"     # a tied output copy
        info = model.tensors[src]
        t = ctx.new_tensor(info.type, info.ne[: max(info.n_dims, 1)], name=name)
        weights[name] = t
        groups.setdefault(p.device, []).append((t, info.nbytes))
    for dev, items in groups.items():
        b = by_dev[dev]
        bt = b.get_default_buffer_type()
        align = 1 if dev == CPU else bt.alignment          # CPU weights stay mapped: no padding
        n = [-(-nb // align) * align for _, nb in items]
        buf = PlanningBuffer(bt, sum(n), BufferUsage.WEIGHTS)
        off = 0
        for (t, _), k in zip(items, n):
            t.data, t.buffer = buf.base + off, buf
            sizes[t.name] = k
            off += k
        totals[dev].weights += sum(n)
    for name in model.tensors:                # weights of no placement stay mapped on the CPU
        if name not in weights:
            info = model.tensors[name]
            t = ctx.new_tensor(info.type, info.ne[: max(info.n_dims, 1)], name=name)
            buf = PlanningBuffer(by_dev[CPU].get_default_buffer_type(), info.nbytes,
                                 BufferUsage.WEIGHTS)
            t.data, t.buffer = buf.base, buf
            weights[name], sizes[name] = t, info.nbytes
            totals[CPU].weights += info.nbytes
    allocs = {b.name: PlanningAllocator(b.get_default_buffer_type()) for b in backends}
    kv = KVCache(hp, settings.n_ctx, settings.type_k, settings.type_v, settings.n_seq_max,
                 [allocs[p.device] for p in plan.kv],
                 n_ubatch=min(settings.n_ubatch, settings.n_batch))
    kv_bytes = []
    for il in range(hp.n_layer):
        align = allocs[plan.kv[il].device].alignment
        nb = sum(-(-t.nbytes() // align) * align for t in (kv.k[il], kv.v[il]))
        kv_bytes.append(nb)
        totals[plan.kv[il].device].kv += nb
    oo = plan.op_offload
    gs = graph_size(hp.n_layer) * 2
    scheds = {"prefill": Scheduler(backends, n_copies=plan.n_copies, op_offload=oo["prefill"],
                                   graph_size=gs)}
    same = oo["decode"] == oo["prefill"] and not plan.phase_ops
    scheds["decode"] = scheds["prefill"] if same else Scheduler(
        backends, n_copies=plan.n_copies, op_offload=oo["decode"], graph_size=gs)
    n_ubatch = min(settings.n_ubatch, settings.n_batch)
    gp = GraphParams(n_ubatch, min(settings.n_seq_max, n_ubatch), settings.n_ctx)
    by_phase = {}
    for phase, s in scheds.items():
        if phase == "decode" and s is scheds["prefill"]:
            continue
        g, _, _ = build_graph(hp, weights, kv, gp, flash_attn, True)
        pin_phase_ops(s, g, plan, phase, weights)
        by_phase[phase] = s.reserve_size(g)
        for name, n in by_phase[phase].items():
            totals[name].compute += n
    return sizes, kv_bytes, totals, by_phase


def _effective(settings: RunSettings, n_layer: int) -> RunSettings:
    from pyggml.backend.cpu import default_n_threads
    s = RunSettings(**vars(settings))
    for k, v in DEFAULTS.items():
        if getattr(s, k) is None:
            setattr(s, k, v)
    s.n_threads = s.n_threads or default_n_threads()
    s.n_threads_batch = s.n_threads_batch or s.n_threads
    s.type_k = s.type_k or ["f16"] * n_layer
    s.type_v = s.type_v or ["f16"] * n_layer
    return s


def build_config(config=None, *, sets=(), n_gpu_layers=None, overrides=(), kv_offload=True,
                 op_offload=True, n_ctx=None, n_batch=None, n_ubatch=None, threads=None,
                 threads_batch=None) -> Config:
    """The Config a command line describes (a file, llama.cpp flags, --set items)."""
    return config_from_flags(config, sets=sets, n_gpu_layers=n_gpu_layers, overrides=overrides,
                             kv_offload=kv_offload, op_offload=op_offload, n_ctx=n_ctx,
                             n_batch=n_batch, n_ubatch=n_ubatch, threads=threads,
                             threads_batch=threads_batch)


class Planner:
    """A model's tensor table and this machine's devices, ready to plan configs against."""

    def __init__(self, model_path=None, *, assumed: dict | None = None, registry=None,
                 flash_attn: bool = True):
        from pyggml.gguf import GGUFModel
        from pyggml.llm.hparams import read_hparams
        from pyggml.llm.models import check_weights
        if model_path is None:
            from pyggml.models_default import ensure_default_model
            model_path = ensure_default_model()
        self.path = os.fspath(model_path)
        self.model = GGUFModel.open(self.path)
        self.hp = read_hparams(self.model, self.model.tensors)
        check_weights(self.hp, self.model.tensors, self.path)      # TensorInfo: ne, n_dims
        self.registry = registry or default_registry()
        self.catalog = DeviceCatalog.from_registry(self.registry, assumed)
        self.flash_attn = flash_attn

    def plan(self, cfg: Config) -> PlanReport:
        hp = self.hp
        catalog = self.catalog.with_virtual(cfg)        # the config's virtual_devices
        plan, settings = plan_from_config(cfg, self.model.tensors, hp.n_layer, hp.tied_output,
                                          catalog=catalog)
        eff = _effective(settings, hp.n_layer)
        backends = _backends(plan, catalog, self.registry,
                             (eff.n_threads, eff.n_threads_batch))
        try:
            sizes, kv_bytes, totals, by_phase = _plan_memory(self.model, hp, plan, eff, backends,
                                                             self.flash_attn)
        finally:
            for b in backends:
                b.close()
        for name, t in totals.items():
            info = catalog.info(name)
            if info is not None:
                t.free, t.total_memory = info.free, info.total
                t.planning, t.assumed_memory = info.planning, info.assumed_memory
        flags, missing = llama_flags(cfg, plan, self.model.tensors, hp.n_layer, settings)
        return PlanReport(self.path, hp.arch, hp.n_layer, cfg, plan, eff, sizes, kv_bytes,
                          totals, by_phase, flags, missing, list(plan.warnings),
                          {d.name: d.description for d in catalog.infos})

    # -- check-fit --
    def check_fit(self, report: PlanReport, max_evals: int = 40) -> list[FitChange]:
        """Changes that make every device fit, smallest first ([] when none is found or all
        fits already): the KV cache on the CPU, the largest gpu_layers, n_ctx (multiples of 256)
        and n_ubatch that fit; each one a full plan (binary searches)."""
        bad = report.not_fitting()
        if not bad:
            return []
        evals = [0]
        cfg = report.config

        def attempt(sets):
            if evals[0] >= max_evals:
                return None
            evals[0] += 1
            try:
                r = self.plan(cfg.with_sets(sets))
            except PyggmlError:
                return None
            return r

        def moved(r):
            return sum(report.totals[d].total - r.totals.get(d, DeviceTotals()).total
                       for d in bad)

        out: list[FitChange] = []
        # 1. the KV cache on the CPU
        if any(report.totals[d].kv for d in bad if d != CPU):
            ranges = cfg.get(("kv", "ranges")) or []
            sets = ["kv.device=cpu"] + [f"kv.ranges.{i}.device=cpu"
                                        for i, r in enumerate(ranges) if "device" in r]
            r = attempt(sets)
            if r is not None and not r.not_fitting():
                out.append(FitChange("KV cache on the CPU", sets, moved(r), r))
        # 2. fewer gpu_layers (the largest count that fits)
        slots = [i for i, d in enumerate(report.plan.layer_devices) if d != CPU]
        if slots and any(d != CPU for d in bad):
            lo, hi, best = 0, len(slots) - 1, None
            while lo <= hi:
                mid = (lo + hi) // 2
                r = attempt([f"gpu_layers={mid}"])
                if r is not None and not r.not_fitting():
                    best, lo = (mid, r), mid + 1
                else:
                    hi = mid - 1
            if best is not None:
                out.append(FitChange(f"gpu_layers: {best[0]} (was {len(slots)})",
                                     [f"gpu_layers={best[0]}"], moved(best[1]), best[1]))
        # 3. a smaller context (multiples of 256)
        n_ctx = report.settings.n_ctx
        lo, hi, best = 1, (n_ctx - 1) // 256, None
        while lo <= hi:
            mid = (lo + hi) // 2
            r = attempt([f"context.n_ctx={mid * 256}"])
            if r is not None and not r.not_fitting():
                best, lo = (mid * 256, r), mid + 1
            else:
                hi = mid - 1
        if best is not None:
            out.append(FitChange(f"n_ctx: {best[0]} (was {n_ctx})",
                                 [f"context.n_ctx={best[0]}"], moved(best[1]), best[1]))
        # 4. smaller ubatches (the compute buffer grows with the tokens per graph)
        n_ub = min(report.settings.n_ubatch, report.settings.n_batch)
        lo, hi, best = 1, n_ub - 1, None
        while lo <= hi:
            mid = (lo + hi) // 2
            r = attempt([f"context.n_ubatch={mid}"])
            if r is not None and not r.not_fitting():
                best, lo = (mid, r), mid + 1
            else:
                hi = mid - 1
        if best is not None:
            out.append(FitChange(f"n_ubatch: {best[0]} (was {n_ub})",
                                 [f"context.n_ubatch={best[0]}"], moved(best[1]), best[1]))
        out.sort(key=lambda c: c.moved)
        return out

    def close(self) -> None:
        self.model.close()


def dry_run(model_path=None, config=None, *, sets=(), assumed=None, check_fit: bool = False,
            flash_attn: bool = True, **flags) -> PlanReport:
    """Plan `config` (a path, a Config, or None) amended by llama.cpp flags (n_gpu_layers,
    overrides, kv_offload, op_offload, n_ctx, ...) and --set items, for a model, without
    touching weight bytes or allocating device memory."""
    planner = Planner(model_path, assumed=assumed, flash_attn=flash_attn)
    try:
        cfg = build_config(config, sets=sets, **flags)
        report = planner.plan(cfg)
        if check_fit:
            report.fit_changes = planner.check_fit(report)
        return report
    finally:
        planner.close()


# ---- the report --------------------------------------------------------------------------------

def fmt_bytes(n: int | None) -> str:
    if n is None:
        return "?"
    for unit, k in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if n >= 1 << k:
            return f"{n / (1 << k):.2f} {unit}"
    return f"{n} B"


def _table(rows, header) -> list[str]:
    w = [max(len(str(r[i])) for r in [header] + rows) for i in range(len(header))]
    out = ["  " + "  ".join(str(h).ljust(w[i]) for i, h in enumerate(header)).rstrip()]
    for r in rows:
        out.append("  " + "  ".join(str(c).ljust(w[i]) for i, c in enumerate(r)).rstrip())
    return out


def _short(name: str) -> str:
    il = layer_of(name)
    s = name.split(".", 2)[2] if il is not None else name
    return s[:-7] if s.endswith(".weight") else s


def format_report(r: PlanReport, per_tensor: bool = False) -> str:
    plan, s = r.plan, r.settings
    L = []
    total = sum(r.tensor_bytes.values())
    L.append(f"model:   {r.model} ({r.arch}, {r.n_layer} layers, {len(r.tensor_bytes)} weight "
             f"tensors, {fmt_bytes(total)} as placed)")
    files = r.config.files or [r.config.source]
    L.append(f"config:  {' <- '.join(files)}")
    devs = []
    for d in plan.devices:
        t = r.totals.get(d)
        extra = ("" if t is None else " (planning only)" if t.planning else
                 " (assumed memory)" if t.assumed_memory else "")
        devs.append(f"{d}{extra}")
    L.append(f"devices: {', '.join(devs)} (priority order; CPU last)")
    L.append(f"sizes:   n_ctx {s.n_ctx}, n_batch {s.n_batch}, n_ubatch "
             f"{min(s.n_ubatch, s.n_batch)}, n_seq_max {s.n_seq_max}; threads {s.n_threads} "
             f"decode / {s.n_threads_batch} batch; op offload prefill {'on' if plan.op_offload['prefill'] else 'off'}, "
             f"decode {'on' if plan.op_offload['decode'] else 'off'}; n_copies {plan.n_copies}")
    L.append("")
    L.append("weights" + (" (per tensor):" if per_tensor else " (grouped per layer):"))
    rows = []
    order = sorted(plan.weights, key=lambda n: (layer_of(n) is not None, layer_of(n) or 0))
    if per_tensor:
        for n in order:
            p = plan.weights[n]
            rows.append([n, p.buffer_type or p.device, fmt_bytes(r.tensor_bytes[n]), p.rule])
        L += _table(rows, ["tensor", "device", "bytes", "rule"])
    else:
        # one row per (tensor names, device, rule), consecutive layers merged into a range
        per_layer: dict[int, dict[tuple, list[str]]] = {}
        for n in order:
            p = plan.weights[n]
            il = layer_of(n)
            per_layer.setdefault(il if il is not None else -1, {}).setdefault(
                (p.buffer_type or p.device, p.rule), []).append(n)
        runs: list[list] = []          # [first layer, last layer, shorts, dev, rule, bytes]
        for il, groups in per_layer.items():
            for (dev, rule), names in groups.items():
                shorts = " ".join(_short(n) for n in names)
                nb = sum(r.tensor_bytes[n] for n in names)
                prev = next((x for x in runs if x[1] == il - 1 and x[2:5] == [shorts, dev, rule]
                             and il >= 0), None)
                if prev is not None:
                    prev[1], prev[5] = il, prev[5] + nb
                else:
                    runs.append([il, il, shorts, dev, rule, nb])
        for a, b, shorts, dev, rule, nb in runs:
            where = "-" if a < 0 else f"blk.{format_layers([(a, b)])}"
            rows.append([where, shorts, dev, fmt_bytes(nb), rule])
        L += _table(rows, ["layers", "tensors", "device", "bytes", "rule"])
    L.append("")
    L.append("KV cache:")
    rows, i = [], 0
    while i < r.n_layer:
        j = i
        key = (plan.kv[i].device, plan.kv[i].rule, s.type_k[i], s.type_v[i])
        while j + 1 < r.n_layer and (plan.kv[j + 1].device, plan.kv[j + 1].rule, s.type_k[j + 1],
                                     s.type_v[j + 1]) == key:
            j += 1
        rows.append([f"layers {format_layers([(i, j)])}", key[0], f"{key[2]}/{key[3]}",
                     fmt_bytes(sum(r.kv_bytes[i:j + 1])), key[1]])
        i = j + 1
    L += _table(rows, ["layers", "device", "K/V", "bytes", "rule"])
    if plan.phase_ops:
        L.append("")
        L.append("phase rules (ops run elsewhere than their weights' memory):")
        rows = []
        for ph, ops in plan.phase_ops.items():
            by: dict[tuple, list[str]] = {}
            for n, p in ops.items():
                by.setdefault((p.device, p.rule), []).append(n)
            for (dev, rule), names in by.items():
                rows.append([ph, f"{len(names)} weight(s)", dev, rule])
        L += _table(rows, ["phase", "ops reading", "run on", "rule"])
    if plan.rules:
        L.append("")
        L.append("rules:")
        rows = []
        for rep in plan.rules:
            rows.append([rep.label, len(rep.matched), len(rep.decided),
                         fmt_bytes(sum(r.tensor_bytes.get(n, 0) for n in rep.decided))])
        L += _table(rows, ["rule", "matches", "decides", "bytes"])
    L.append("")
    L.append("memory per device (compute: the scheduler's reserve for the worst-case ubatch"
             + (", prefill + decode schedulers" if len(r.compute_by_phase) > 1 else "") + "):")
    rows = []
    for d, t in r.totals.items():
        fit = {None: "", True: "yes", False: "NO"}[t.fits]
        rows.append([d, fmt_bytes(t.weights), fmt_bytes(t.kv), fmt_bytes(t.compute),
                     fmt_bytes(t.total), fmt_bytes(t.free), fit])
    L += _table(rows, ["device", "weights", "KV cache", "compute", "total", "free", "fits"])
    if r.fit_changes is not None:
        L.append("")
        bad = r.not_fitting()
        if not bad:
            L.append("check-fit: every device has enough free memory")
        elif not r.fit_changes:
            L.append(f"check-fit: {', '.join(bad)} too small, and no single change tried (KV on "
                     f"the CPU, fewer gpu_layers, a smaller n_ctx or n_ubatch) makes it fit")
        else:
            L.append(f"check-fit: {', '.join(bad)} too small; changes that fit, smallest first:")
            for c in r.fit_changes:
                sets = " ".join(f"--set {x}" for x in c.sets)
                L.append(f"  {c.what}: moves {fmt_bytes(c.moved)} off {', '.join(bad)}  ({sets})")
    if r.warnings:
        L.append("")
        L.append("warnings:")
        L += [f"  {w}" for w in r.warnings]
    L.append("")
    L.append(f"llama.cpp: {shell_join(r.llama) if r.llama else '(default flags)'}")
    for m in r.llama_missing:
        L.append(f"  no llama.cpp equivalent: {m}")
    return "\n".join(L)


def emit_yaml(cfg: Config, argv=None) -> str:
    head = "# an offload config written by `pyggml plan --emit-yaml`"
    if argv:
        head += f"\n# from: pyggml {shell_join(argv)}"
    body = cfg.to_yaml() if cfg.data else "{}\n"
    return f"{head}\n{body}"


# ---- the command -------------------------------------------------------------------------------

def add_arguments(p) -> None:
    """`pyggml plan`'s own options (the shared ones come from the CLI)."""
    p.add_argument("--per-tensor", action="store_true", help="one row per tensor")
    p.add_argument("--check-fit", action="store_true",
                   help="compare with free device memory; suggest the smallest change that fits")
    p.add_argument("--emit-yaml", nargs="?", const="-", default=None, metavar="FILE",
                   help="write the equivalent config (after flags and --set) to FILE or stdout")
    p.add_argument("--assume-device", action="append", default=[], metavar="NAME[=SIZE]",
                   help="plan for a device this machine lacks (or with another memory size), "
                        "e.g. Vulkan1=8GiB")
    p.add_argument("--schema", action="store_true", help="print the config schema and exit")


def add_offload_arguments(p) -> None:
    """llama.cpp's offload flags and --set, shared by run, bench and plan."""
    p.add_argument("-ot", "--override-tensor", action="append", default=[],
                   metavar="REGEX=DEVICE", help="tensors whose name matches REGEX go to DEVICE "
                   "(repeatable, first match wins, before -ngl)")
    p.add_argument("-nkvo", "--no-kv-offload", action="store_true",
                   help="keep the KV cache on the CPU")
    p.add_argument("--no-op-offload", action="store_true",
                   help="never move an op to a GPU when its weight is in host memory")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="override a config value (e.g. gpu_layers=8, context.n_ctx=8192)")


def parse_ot(item: str) -> tuple[str, str]:
    """'REGEX=DEVICE' -> (regex, device); the device is what follows the last '='."""
    pattern, sep, device = item.rpartition("=")
    if not sep or not pattern or not device.strip():
        raise ConfigError(f"-ot {item}: expected REGEX=DEVICE (e.g. -ot 'ffn_.*=CPU')")
    return pattern, device.strip()


def split_ctx(values) -> tuple[int | None, str | None]:
    """-c may be given twice: an integer is the context size, anything else a config file."""
    n_ctx, path = None, None
    for v in values or []:
        if v.isdigit():
            n_ctx = int(v)
        else:
            path = v
    return n_ctx, path


def _int_or_none(v):
    return v if isinstance(v, int) and not isinstance(v, bool) else None


def config_from_cli(args, always: bool = False) -> Config | None:
    """The Config a command line gives (None: no config file and no offload flag, unless
    `always`). Without a file, -ngl uses the first GPU, as `LLM(n_gpu_layers=...)` does."""
    n_ctx, path = split_ctx(getattr(args, "ctx", None))
    ot = [parse_ot(x) for x in getattr(args, "override_tensor", None) or []]
    sets = getattr(args, "set", None) or []
    nkvo = getattr(args, "no_kv_offload", False)
    noop = getattr(args, "no_op_offload", False)
    ngl = _int_or_none(getattr(args, "n_gpu_layers", None))
    if not (always or path or ot or sets or nkvo or noop):
        return None
    devices = None
    if path is None:
        gpus = [d.name for d in default_registry().devices() if d.type != DeviceType.CPU]
        devices = gpus[:1] if (ngl or 0) > 0 and gpus else ([] if not (ngl or 0) else None)
    cfg = config_from_flags(
        path, n_gpu_layers=ngl, overrides=ot, kv_offload=not nkvo, op_offload=not noop,
        devices=devices, n_ctx=n_ctx, n_batch=_int_or_none(getattr(args, "batch_size", None)),
        n_ubatch=_int_or_none(getattr(args, "ubatch_size", None)),
        threads=_int_or_none(getattr(args, "threads", None)),
        threads_batch=_int_or_none(getattr(args, "threads_batch", None)))
    return cfg.with_sets(sets) if sets else cfg


def run(args, argv=None) -> int:
    """`pyggml plan`."""
    if args.schema:
        print(describe_schema())
        return 0
    fa = getattr(args, "flash_attn", "auto") != "off"
    cfg = config_from_cli(args, always=True)
    planner = Planner(args.model, assumed=parse_assumed(args.assume_device), flash_attn=fa)
    try:
        report = planner.plan(cfg)
        if args.check_fit:
            report.fit_changes = planner.check_fit(report)
    finally:
        planner.close()
    if args.emit_yaml is not None:
        text = emit_yaml(report.config, argv)
        if args.emit_yaml == "-":
            print(text, end="")
            return 0
        Path(args.emit_yaml).write_text(text, encoding="utf-8")
        print(f"wrote {args.emit_yaml}", file=sys.stderr)
    print(format_report(report, per_tensor=args.per_tensor))
    if args.check_fit and report.not_fitting():
        return 2
    return 0
