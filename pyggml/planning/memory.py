"""The plan of a model run without running it: where every tensor goes and what each device holds.

    with Planner("model.gguf", virtual=[VirtualSpec("laptop", 8 << 30)]) as p:
        rp = p.plan(config="configs/kv-on-cpu.yaml")      # or: p.plan(n_gpu_layers=99, n_ctx=8192)
    rp.device("CPU").compute, rp.system_ram, rp.reports["prefill"].summary()
    rp = plan_memory("model.gguf", n_ctx=2048)             # one plan, CPU only

A plan is the model runtime's own set-up (pyggml.llm.setup.build_run) in planning mode: weights
stay mapped (no byte read), every other buffer is a planning buffer (an address range, no
memory). The scheduler splits the graph and the allocator plans it exactly as at run time, so the
figures are the ones `LLM` reserves (a test builds the same settings both ways and compares every
buffer). `RunPlan` is the one report: `pyggml plan` renders its placement (pyggml.planning.
dryrun), `pyggml mem` its memory (pyggml.planning.measure).

Devices. This machine's come from the registry; their backends answer supports_op / offload_op.
They are listed only for a plan that can use one (offload.devices.needs_machine_devices): a CPU-only
plan, or one on virtual devices alone, loads no backend module but the CPU's (no Vulkan driver).
Virtual devices (`--virtual-device NAME=SIZE[:igpu]`, a config's `virtual_devices`) are planning-
only GPUs with a declared memory that follow the Vulkan backend's rules; a virtual spec with the
name of a real device declares that device's memory instead. UMA (an integrated GPU, lavapipe, a
Vulkan device whose only heap is device-local and host-visible): the device's buffers are system
RAM (`DevicePlan.uma` says why; `RunPlan.system_ram` counts them). Host staging: what a device's
backend allocates for transfers when the host cannot map its memory (the device says how much).
"""

from __future__ import annotations

import re
import time
from dataclasses import asdict, dataclass, field

from pyggml.alloc import PlanReport
from pyggml.backend.cpu import default_n_threads
from pyggml.llm.lora import check_specs, load_adapters
from pyggml.llm.setup import ModelFile, RunOptions, build_run, resolve_offload
from pyggml.llm.kv_cache import swa_space_cells
from pyggml.backend.base import Registry
from pyggml.backend.catalog import CPU, DeviceCatalog
from pyggml.offload.config import Config, load_config
from pyggml.offload.devices import needs_machine_devices, with_config_devices
from pyggml.offload.flags import config_from_flags, llama_flags
from pyggml.offload.pinning import pin_phase_ops
from pyggml.offload.plan import OffloadPlan, is_expert, layer_of
from pyggml.types import VIEW_OPS


@dataclass
class DevicePlan:
    """Planned bytes on one device. compute: planned peak of its compute buffers (all phases);
    compute_naive: sum of every intermediate (nothing reused); compute_no_inplace: the peak with
    in-place reuse off; compute_lower_bound: the most bytes alive at once (any placement needs
    that). staging: host memory for transfers (system RAM). memory: (free, total) bytes (a
    virtual device: its declared size; None: unknown)."""
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
    experts: int = 0                # of weights: mixture-of-experts FFN weights (ffn_*_exps)
    virtual: bool = False           # a planning-only device (no hardware)
    assumed_memory: bool = False    # memory declared, not read from the device
    software: bool = False          # computes on the host's cores through a driver (lavapipe)

    @property
    def total(self) -> int:
        """Bytes in this device's memory (staging is host memory: not counted here)."""
        return self.weights + self.kv + self.compute

    @property
    def free(self) -> int | None:
        return None if self.memory is None else self.memory[0]

    @property
    def fits(self) -> bool | None:
        return None if self.free is None else self.total <= self.free


@dataclass
class KVLayer:
    layer: int
    device: str
    bytes: int
    sliding: bool
    cells: int                      # KV cells of its space (n_ctx, or the window-sized space)
    recurrent: bool = False         # a recurrent layer: its state, `cells` sequences of it


@dataclass
class NodePlacement:
    """Where one node of the worst-case graph runs and why. cause: the scheduler's tag (see
    pyggml.sched: 1.wgt0, 1.off, 2.gd, ...); layer: the transformer layer it belongs to (-1:
    before the first layer, the embedding; n_layer: after the last, the output head): from a
    name's -N suffix or a blk.N weight it reads, else the layer of the node before it."""
    name: str
    op: str
    device: str
    cause: str
    layer: int
    view: bool              # a view op (no compute, no memory of its own)


_NODE_LAYER = re.compile(r"-(\d+)$")


def node_placements(run, phase: str, sched) -> list[NodePlacement]:
    """Every node of `run`'s worst-case graph as `sched` assigns it (split again, then reset:
    the reserved buffers are not touched)."""
    gp = run.worst_case_params()
    g, _, _ = run.build_graph(gp)
    pin_phase_ops(sched, g, run.offload, phase, run.weights, n_tokens=gp.n_tokens)
    weight_names = {id(t): n for n, t in run.weights.items()}
    n_layer = run.model.hparams.n_layer
    out, cur = [], -1
    try:
        sched.split_graph(g)
        for t in g.nodes:
            m = _NODE_LAYER.search(t.name or "")
            il = int(m.group(1)) if m else None
            for s in t.src:
                w = weight_names.get(id(s)) if s is not None else None
                if w is not None and il is None:
                    il = layer_of(w)
                    if il is None and cur >= 0:
                        il = n_layer            # a global weight after the layers: the head
            cur = cur if il is None else il
            a = sched.get_assignment(t)
            out.append(NodePlacement(t.name, t.op.name, a.backend_name if a else "",
                                     a.cause if a else "", cur, t.op in VIEW_OPS))
    finally:
        sched.reset()
    return out


@dataclass
class FitChange:
    what: str              # 'KV cache on the CPU', 'gpu_layers: 12 (was 19)', ...
    sets: list[str]        # --set items that make it
    moved: int             # bytes taken off the devices that did not fit
    plan: "RunPlan"


@dataclass
class RunPlan:
    """The plan of one configuration. opts: the effective options (threads filled in); reports:
    the allocator's report per scheduler (phase name, "prefill" first; "decode" only when its
    scheduler differs); tensor_bytes: weight name -> bytes as placed (aligned on devices);
    llama / llama_missing: equivalent llama.cpp flags and what has none."""
    model: str
    facts: dict
    opts: RunOptions
    config: Config
    offload: OffloadPlan = field(repr=False)
    devices: list[DevicePlan]
    kv_layers: list[KVLayer]
    tensor_bytes: dict[str, int] = field(repr=False)
    reports: dict[str, PlanReport] = field(repr=False)
    compute_by_phase: dict[str, dict[str, int]]
    llama: list[str]
    llama_missing: list[str]
    warnings: list[str]
    n_swa_cells: int = 0            # cells a window-sized cache for sliding layers holds
    plan_seconds: float = 0.0
    fit_changes: list[FitChange] | None = None
    weight_bytes_per_token: int = 0     # weight bytes a decoded token reads (MoE: top-k experts)
    nodes: dict[str, list[NodePlacement]] = field(default_factory=dict, repr=False)  # with_nodes
    draft: "RunPlan | None" = None      # speculative decoding: the draft model's plan (CPU)
    lookup_device: str = CPU            # where the token lookup runs (Run.embd_lookup)
    # LoRA adapters the graphs may apply: (path, scale, bytes of its tensors), mapped from the
    # file in system RAM as the runtime keeps them (pyggml/llm/lora.py)
    loras: list[tuple[str, float, int]] = field(default_factory=list)

    @property
    def lora_bytes(self) -> int:
        return sum(n for _, _, n in self.loras)

    @property
    def lora_specs(self) -> list[tuple[str, float]]:
        """The adapters as Planner.plan's `lora` takes them (to plan a variant the same way)."""
        return [(path, scale) for path, scale, _ in self.loras]

    @property
    def expert_bytes(self) -> int:
        return sum(d.experts for d in self.devices)

    # the options most reports show
    n_ctx = property(lambda self: self.opts.n_ctx)
    n_ubatch = property(lambda self: self.opts.n_ubatch)
    n_batch = property(lambda self: self.opts.n_batch)
    n_seq_max = property(lambda self: self.opts.n_seq_max)
    logits_all = property(lambda self: self.opts.logits_all)
    flash_attn = property(lambda self: self.opts.flash_attn)
    type_k = property(lambda self: _type_name(self.opts.type_k))
    type_v = property(lambda self: _type_name(self.opts.type_v))

    def device(self, name: str) -> DevicePlan:
        for d in self.devices:
            if d.device.lower() == name.lower():
                return d
        raise KeyError(name)

    def not_fitting(self) -> list[str]:
        return [d.device for d in self.devices if d.fits is False]

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
        """Buffers in system RAM: the CPU's (mapped weights, KV, compute), host staging, LoRA
        adapters (mapped) and the memory of every UMA device (the runtime's own Python objects
        are not included)."""
        return sum(d.total for d in self.devices if d.uma) + self.staging + self.lora_bytes

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
        d = {k: getattr(self, k) for k in ("model", "facts", "n_ctx", "n_ubatch", "n_batch",
                                           "n_seq_max", "type_k", "type_v", "logits_all",
                                           "flash_attn", "n_swa_cells", "plan_seconds",
                                           "llama", "llama_missing", "warnings",
                                           "expert_bytes", "weight_bytes_per_token",
                                           "lora_bytes")}
        d["loras"] = [{"path": p, "scale": sc, "bytes": n} for p, sc, n in self.loras]
        d["kv_layers"] = [asdict(x) for x in self.kv_layers]
        d["devices"] = [dict(asdict(x), total=x.total) for x in self.devices]
        d["system_ram"] = self.system_ram
        if self.draft is not None:
            d["draft"] = self.draft.to_dict()
        return d

    def draft_summary(self) -> str:
        """One line on the draft model's memory ('' without one)."""
        if self.draft is None:
            return ""
        from pyggml.units import fmt_bytes
        dp = self.draft
        w, kv, c = (sum(d.weights for d in dp.devices), dp.kv_bytes, dp.compute_bytes)
        return (f"draft model {dp.model}: weights {fmt_bytes(w)} (mapped), KV cache "
                f"{fmt_bytes(kv)}, compute {fmt_bytes(c)}; total {fmt_bytes(w + kv + c)} of "
                f"system RAM beside the model's (the model's compute buffer holds the logits "
                f"of {self.opts.n_draft} + 1 rows per sequence)")


def kv_type_names(t, n_layer: int = 1) -> list[str]:
    """A KV type or per-layer types (GGMLType or names) -> one lower-case name per layer."""
    ts = list(t) if isinstance(t, (list, tuple)) else [t] * n_layer
    return [(x if isinstance(x, str) else x.name).lower() for x in ts]


def _type_name(t) -> str:
    """A KV type, or per-layer types ("f16", or "f16,q8_0" when layers differ)."""
    return ",".join(dict.fromkeys(kv_type_names(t)))


def _kind(dev) -> str:
    k = dev.type.value
    return f"virtual {k}" if getattr(dev, "virtual", False) else k


class Planner:
    """A model's tensor table and the devices to plan on, ready for many plans (the fit search
    makes dozens). model: a path (None: the default model) or an open ModelFile; virtual:
    VirtualSpecs (or PlanningDevices) beside this machine's devices."""

    def __init__(self, model=None, *, virtual=(), registry=None):
        self.own_model = not isinstance(model, ModelFile)
        self.mf = ModelFile(model) if self.own_model else model
        self.virtual = list(virtual)
        self._registry = registry
        self._catalog: DeviceCatalog | None = None
        try:
            # the CPU and the virtual devices (checked now); this machine's other devices are
            # listed only for a plan that can use them (see catalog_for)
            self._cpu_catalog = DeviceCatalog.from_registry(Registry(("pyggml.backend.cpu",)),
                                                            self.virtual)
            if registry is not None:
                self._catalog = DeviceCatalog.from_registry(registry, self.virtual)
        except BaseException:
            self.close()
            raise

    @property
    def catalog(self) -> DeviceCatalog:
        """This machine's devices and the virtual ones, listed on first use (from the default
        registry unless one was given: listing loads every backend module)."""
        if self._catalog is None:
            self._catalog = DeviceCatalog.from_registry(self._registry, self.virtual)
        return self._catalog

    @catalog.setter
    def catalog(self, catalog: DeviceCatalog) -> None:
        self._catalog = catalog

    def catalog_for(self, cfg: Config, offload: OffloadPlan | None = None) -> DeviceCatalog:
        """The devices a plan of `cfg` (or of `offload`, made by it) is made on: the CPU and the
        virtual devices alone when it can use no other device of this machine
        (needs_machine_devices: a CPU-only `pyggml mem` / `pyggml plan` loads no Vulkan
        driver), unless this machine's devices were listed already or a registry was given."""
        if self._catalog is not None:
            return self._catalog
        if offload is not None:
            machine = any(d != CPU for d in offload.devices_used()) or bool(cfg.get(("rpc",)))
        else:
            machine = needs_machine_devices(cfg, self.virtual)
        return self.catalog if machine else self._cpu_catalog

    @property
    def path(self) -> str:
        return self.mf.path

    def config_of(self, config=None, *, sets=(), n_gpu_layers: int | None = None,
                  gpu_device: str | None = None, **flags) -> Config:
        """The Config a plan uses: a file / Config / dict, or llama.cpp-style flags (-ngl to
        `gpu_device`, default the first virtual device, else the first GPU)."""
        if config is not None:
            cfg = load_config(config)
            if n_gpu_layers is not None or flags:
                cfg = config_from_flags(cfg, n_gpu_layers=n_gpu_layers, **flags)
        else:
            devices = None
            if (n_gpu_layers or 0) > 0:
                gpu = gpu_device or self.catalog.default_gpu()
                devices = [gpu] if gpu else None     # None: the resolver says why none
            cfg = config_from_flags(None, n_gpu_layers=n_gpu_layers, devices=devices, **flags)
        return cfg.with_sets(sets) if sets else cfg

    def plan(self, config=None, *, sets=(), opts: RunOptions | None = None,
             offload: OffloadPlan | None = None, with_no_inplace: bool = True,
             n_gpu_layers: int | None = None, gpu_device: str | None = None, overrides=(),
             with_nodes: bool = False, draft_model=None, lora=None, **options) -> RunPlan:
        """Plan `config` (a path, Config or dict, amended by `sets`; its sizes, threads and KV
        types replace the options, as in the runtime), or n_gpu_layers on gpu_device, or an
        OffloadPlan as given (with the config that made it, if any: its rpc-servers and
        virtual devices are listed and its llama.cpp flags derived, its placement is not
        resolved again); overrides: -ot rules [(regex, device)]. options: RunOptions fields
        (n_ctx, n_ubatch, logits_all, n_draft, ...). with_nodes: also where every node of the
        worst-case graph runs and why (RunPlan.nodes). draft_model: a draft model's GGUF path
        (speculative decoding): planned as the runtime opens it (CPU, the model's n_ctx,
        n_seq_max, n_ubatch, sliding-window layers over all cells) into RunPlan.draft, and
        n_draft (default 16, llama.cpp's --draft-max) rows per sequence in the worst case.
        lora: LoRA adapters as LLM(lora=...) takes them (a path or [(path, scale)]): checked
        against the model (LoraError names the file), their tensors counted in system RAM
        (RunPlan.loras) and the worst-case graphs built with all of them applied, as the
        runtime reserves its compute buffers."""
        if draft_model is not None:
            from pyggml.llm.speculative import DRAFT_MAX
            options.setdefault("n_draft", DRAFT_MAX)
        t0 = time.perf_counter()
        opts = (opts or RunOptions()).replace(**options)
        mf = self.mf
        cfg = self.config_of(config, sets=sets, n_gpu_layers=n_gpu_layers,
                             gpu_device=gpu_device, **({"overrides": list(overrides)}
                                                       if overrides else {}))
        catalog = with_config_devices(self.catalog_for(cfg, offload), cfg)
        plan, opts = resolve_offload(mf, opts, config=None if offload else cfg, offload=offload,
                                     catalog=catalog)
        threads = opts.n_threads or default_n_threads()
        opts = opts.replace(n_threads=threads, n_threads_batch=opts.n_threads_batch or threads)
        specs = check_specs(lora)
        adapters = load_adapters(specs, mf) if specs else []
        try:
            run = build_run(mf, plan, opts, catalog=catalog, planning=True, loras=adapters)
            try:
                rp = self._report(run, cfg, catalog, with_no_inplace, t0)
                if with_nodes:
                    rp.nodes = {ph: node_placements(run, ph, s) for ph, s in run.scheds()}
            finally:
                run.close()
            rp.loras = [(ad.path, scale, ad.nbytes) for ad, (_, scale) in zip(adapters, specs)]
            rp.llama += [f for path, scale in specs
                         for f in (("--lora", path) if scale == 1.0 else
                                   ("--lora-scaled", f"{path}:{scale:g}"))]
        finally:
            for ad in adapters:
                ad.close()
        if draft_model is not None:
            with Planner(draft_model, virtual=()) as dp:
                rp.draft = dp.plan(n_gpu_layers=0, n_ctx=opts.n_ctx, n_seq_max=opts.n_seq_max,
                                   n_ubatch=opts.n_ubatch, n_batch=opts.n_batch,
                                   n_threads=opts.n_threads, swa_full=True)
        return rp

    def _report(self, run, cfg: Config, catalog: DeviceCatalog, with_no_inplace: bool,
                t0: float) -> RunPlan:
        mf, plan, opts, hp = run.model, run.offload, run.opts, run.model.hparams
        tensor_bytes: dict[str, int] = {}
        by_type: dict[str, dict[str, int]] = {b.device.name: {} for b in run.backends}
        experts: dict[str, int] = {b.device.name: 0 for b in run.backends}
        n_exp, n_used = getattr(hp, "n_expert", 0), getattr(hp, "n_expert_used", 0)
        per_token = 0           # a decoded token reads every weight once, of routed experts k/n
        largest: dict[str, int] = {}
        for name, t in run.weights.items():
            dev = plan.weight_device(name)
            if dev == CPU and name not in mf.model.tensors:
                continue                    # a tied output on the CPU is token_embd itself
            if dev == CPU:
                n = t.nbytes()              # mapped from the file: no padding
            else:
                a = t.buffer.buft.alignment
                n = -(-t.buffer.buft.get_alloc_size(t) // a) * a
            tensor_bytes[name] = n
            routed = is_expert(name) and name.split(".", 2)[2].split(".")[0].endswith("_exps")
            if is_expert(name):
                experts[dev] += n
            share = n * n_used // n_exp if routed and n_exp and n_used else t.nbytes()
            # get_rows reads one row per token (Gemma 4's per-layer embeddings too)
            if not name.startswith(("token_embd", "per_layer_token_embd")):
                per_token += share
            tname = t.type.name.lower()
            by_type[dev][tname] = by_type[dev].get(tname, 0) + n
            largest[dev] = max(largest.get(dev, 0), t.nbytes())
        kv = run.kv
        kv_layers = [KVLayer(il, plan.kv[il].device, kv.layer_bytes(il),
                             hp.layer_is_swa(il), kv.k[il].ne[1],
                             recurrent=il in getattr(kv, "rs_layers", ()))
                     for il in range(hp.n_layer)]
        reports, by_phase = {}, {}
        comp = {b.device.name: [0, 0, 0, 0] for b in run.backends}
        for phase, sched in run.scheds():
            rep = sched.galloc.report(with_no_inplace=with_no_inplace)
            reports[phase] = rep
            by_phase[phase] = {b.device.name: sched.get_buffer_size(b) for b in run.backends}
            for bp, b in zip(rep.buffers, run.backends):
                c = comp[b.device.name]
                c[0] += bp.peak
                c[1] += bp.naive
                c[2] += bp.peak_no_inplace or 0
                c[3] += bp.max_live
        devices = []
        for b in run.backends:
            dev, name = b.device, b.device.name
            wt = by_type[name]
            c = comp[name]
            try:
                mem = dev.memory()
            except Exception:       # a device that cannot say: unknown
                mem = None
            devices.append(DevicePlan(
                device=name, kind=_kind(dev), uma=dev.uma_reason(),
                weights_by_type=dict(sorted(wt.items(), key=lambda kv_: -kv_[1])),
                weights=sum(wt.values()), weights_mapped=name == CPU,
                kv=sum(x.bytes for x in kv_layers if x.device == name), compute=c[0],
                compute_naive=c[1], compute_no_inplace=c[2] if with_no_inplace else None,
                compute_lower_bound=c[3], staging=dev.staging_bytes(largest.get(name, 0)),
                memory=mem, experts=experts[name], virtual=dev.virtual,
                assumed_memory=dev.assumed_memory, software=dev.is_software()))
        n_swa = 0           # the KV cache's window space (pyggml/llm/kv_cache.py)
        if hp.sliding_window and any(x.sliding for x in kv_layers):
            n_swa = swa_space_cells(hp.sliding_window, opts.n_seq_max, opts.n_ubatch, opts.n_ctx)
        # KV types given as run options (-ctk/-ctv, type_k=) count as much as a config's
        kv_types = {k: tuple(kv_type_names(v))
                    for k, v in (("type_k", opts.type_k), ("type_v", opts.type_v))}
        flags, missing = llama_flags(cfg, plan, mf.model.tensors, hp.n_layer,
                                     {**kv_types, **plan.settings})
        facts = dict(mf.facts(), n_expert=n_exp, n_expert_used=n_used)
        lookup = next((n for n, t in run.weights.items() if t is run.embd_lookup),
                      "token_embd.weight")
        return RunPlan(mf.path, facts, opts, cfg, plan, devices, kv_layers, tensor_bytes,
                       reports, by_phase, flags, missing, list(plan.warnings), n_swa,
                       time.perf_counter() - t0, weight_bytes_per_token=per_token,
                       lookup_device=plan.weight_device(lookup))

    def close(self) -> None:
        if self.own_model:
            self.mf.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def plan_memory(model=None, *, virtual=(), registry=None, **kw) -> RunPlan:
    """One plan (Planner(model, virtual=...).plan(**kw)); model: a path or a ModelFile."""
    with Planner(model, virtual=virtual, registry=registry) as p:
        return p.plan(**kw)
