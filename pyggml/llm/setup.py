"""One run set-up: what a model run is made of, built for real or for planning.

    mf = ModelFile.open("model.gguf")               # tensor table, hparams, mapped weights
    plan, opts = resolve_offload(mf, RunOptions(n_ctx=8192), config="configs/kv-on-cpu.yaml")
    run = build_run(mf, plan, opts)                  # LLM: buffers allocated, weights copied
    run = build_run(mf, plan, opts, planning=True)   # pyggml plan / mem: nothing allocated

A run is: one backend per device the offload plan uses (the CPU last), the weights placed on
their devices (those planned on the CPU read into huge-page host memory, or left mapped from the
file: see host_weights_copied), the KV cache, one
scheduler per phase (prefill may move big matmuls to a GPU while decode stays next to host
weights) and the compute buffers reserved for the worst-case ubatch graph (ggml's reserve).
`LLM`, the dry run (`pyggml plan`) and the memory plan (`pyggml mem`) all build it here, so every
option the runtime has is plannable and the figures cannot drift apart.

Planning mode puts every buffer on a planning-only device (pyggml.backend.planning): the same
buffer types' sizes and the same op rules, an address range and no memory. No weight byte is
read (a test makes the weights' pages unreadable), no device memory is allocated.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass

from pyggml import ops
from pyggml.backend.base import BufferUsage, DeviceType, alloc_tensors, default_registry
from pyggml.backend.planning import PlanningDevice
from pyggml.context import Context
from pyggml.errors import ConfigError, ModelError
from pyggml.gguf import GGUFModel
from pyggml.llm.hparams import read_hparams
from pyggml.llm.kv_cache import KVCache
from pyggml.llm.models import GraphParams, build_graph, check_weights, graph_size
from pyggml.backend.catalog import CPU, DeviceCatalog
from pyggml.offload.config import load_config
from pyggml.offload.devices import registry_for
from pyggml.offload.flags import plan_from_args
from pyggml.offload.pinning import pin_phase_ops
from pyggml.offload.plan import OffloadPlan, layer_of
from pyggml.offload.rules import plan_from_config
from pyggml.sched import Scheduler
from pyggml.types import GGMLType

PHASES = ("prefill", "decode")


@dataclass(frozen=True)
class RunOptions:
    """The settings of a run, with the one table of defaults (llama.cpp's where it has one).
    n_ctx: KV cells shared by all sequences (0: the model's trained context); n_batch: tokens
    per eval chunk; n_ubatch: tokens per graph; n_threads / n_threads_batch: decode / prompt
    threads (None: physical cores); n_seq_max: sequences decoded together; type_k / type_v:
    KV types (one, or one per layer); logits_all: logits for every position; flash_attn: fused
    attention; swa_full: sliding-window layers keep all n_ctx cells; n_gpu_layers: llama.cpp's
    -ngl (used when no offload plan or config is given); n_draft: tokens a speculative round
    drafts per sequence at most (the worst-case graph then keeps logits for n_draft + 1 rows
    of each sequence: the verification batch); use_mmap: the CPU's weights stay mapped from the
    file (True), are read into host memory (False), or None: read when that gives huge pages and
    fits (host_weights_copied)."""
    n_ctx: int = 4096
    n_batch: int = 2048
    n_ubatch: int = 512
    n_threads: int | None = None
    n_threads_batch: int | None = None
    n_seq_max: int = 1
    type_k: str | tuple = "f16"
    type_v: str | tuple = "f16"
    logits_all: bool = False
    flash_attn: bool = True
    swa_full: bool = False
    n_gpu_layers: int = 0
    n_draft: int = 0
    use_mmap: bool | None = None

    def replace(self, **kw) -> "RunOptions":
        return dataclasses.replace(self, **kw)

    def with_settings(self, settings) -> "RunOptions":
        """These with the fields a config sets (plan_from_config's settings: a mapping of field
        names; the config's sizes, threads and per-layer KV types) replaced."""
        return self.replace(**settings) if settings else self

    def resolved(self, n_ctx_train: int) -> "RunOptions":
        """Checked, with n_ctx 0 as the trained context and n_ubatch at most n_batch."""
        n_ctx = n_ctx_train if self.n_ctx == 0 else self.n_ctx
        for name, v in (("n_ctx", n_ctx), ("n_batch", self.n_batch), ("n_ubatch", self.n_ubatch),
                        ("n_seq_max", self.n_seq_max)):
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                zero = " (or 0: the model's trained context)" if name == "n_ctx" else ""
                raise ModelError(f"{name} must be a positive integer{zero}, got {v!r}")
        return self.replace(n_ctx=n_ctx, n_ubatch=min(self.n_ubatch, self.n_batch))


DEFAULTS = RunOptions()


class ModelFile:
    """A GGUF model opened for running or planning: tensor table (`model.tensors`), hyper-
    parameters and weight tensors mapped from the file (no byte is read until used)."""

    def __init__(self, path: str | os.PathLike | None = None):
        if path is None:
            from pyggml.models_default import ensure_default_model
            path = ensure_default_model()
        self.path = os.fspath(path)
        self.model = GGUFModel.open(self.path)
        try:
            self.weights = self.model.create_tensors()
            self.hparams = read_hparams(self.model, self.model.tensors)
            check_weights(self.hparams, self.weights, self.path)
        except BaseException:
            self.model.close()
            raise

    def facts(self) -> dict:
        hp = self.hparams
        return {"arch": hp.arch, "n_layer": hp.n_layer, "n_embd": hp.n_embd,
                "n_vocab": hp.n_vocab, "n_ctx_train": hp.n_ctx_train,
                "sliding_window": hp.sliding_window, "weight_bytes": self.model.n_bytes,
                "file": os.path.basename(self.path)}

    def close(self) -> None:
        self.model.close()


def resolve_offload(mf: ModelFile, opts: RunOptions, *, config=None,
                    offload: OffloadPlan | None = None, catalog: DeviceCatalog | None = None,
                    gpu_device: str | None = None) -> tuple[OffloadPlan, RunOptions]:
    """Where tensors go and the options that follow: `offload` as given, else `config` (a YAML
    path, Config or dict: its sizes, threads and KV types replace those of `opts`), else
    opts.n_gpu_layers on `gpu_device` (default: the catalog's first GPU, as llama.cpp's -ngl)."""
    hp = mf.hparams
    if offload is None and config is not None:
        config = load_config(config)
        if catalog is None:         # a CPU-only config lists (and loads) no other backend
            catalog = DeviceCatalog.from_registry(registry_for(config))
        offload, settings = plan_from_config(config, mf.model.tensors, hp.n_layer,
                                             hp.tied_output, catalog=catalog)
        opts = opts.with_settings(settings)
    elif offload is None:
        ngl = opts.n_gpu_layers
        if isinstance(ngl, bool) or not isinstance(ngl, int) or ngl < 0:
            raise ConfigError(f"-ngl must be >= 0 (n_gpu_layers), got {ngl!r}")
        if ngl > 0 and gpu_device is None:
            cat = catalog or DeviceCatalog.from_registry()
            gpu_device = cat.default_gpu()
            soft = [d.name for d in cat.infos if d.software]
            if gpu_device is None:
                errs = default_registry().load_errors
                reasons = "; ".join(f"{m}: {e}" for m, e in errs.items())
                why = (f"{', '.join(soft)} is a software device (it computes on the CPU through "
                       f"its driver, slower than the CPU backend); name it to use it anyway: "
                       f"device='{soft[0]}' (-dev {soft[0]})" if soft else
                       reasons or "no backend module reported one")
                raise ModelError(f"n_gpu_layers={ngl} but no GPU device was found ({why})")
        offload = plan_from_args(mf.model.tensors, hp.n_layer, hp.tied_output, ngl,
                                 gpu_device if ngl > 0 else None)
    opts = opts.resolved(hp.n_ctx_train)
    if hp.n_ctx_train and opts.n_ctx > hp.n_ctx_train:
        w = (f"n_ctx {opts.n_ctx} is more than the model was trained for ({hp.n_ctx_train}): "
             f"quality may drop past that many tokens")
        if w not in offload.warnings:
            offload.warnings.append(w)
    return offload, opts


@dataclass
class Run:
    """A model run's parts (see the module docstring). backends: priority order, the CPU last;
    weights: name -> tensor as placed; weight_buffers: device -> WEIGHTS buffer (devices other
    than the CPU); sched: phase -> Scheduler (one object for both when they are alike)."""
    model: ModelFile
    opts: RunOptions
    offload: OffloadPlan
    backends: list
    by_device: dict
    weights: dict
    weight_buffers: dict
    kv: KVCache
    sched: dict
    planning: bool
    embd_lookup: object = None      # the matrix the token lookup reads (see _embedding_lookup)
    loras: tuple = ()               # LoRA adapters (pyggml.llm.lora.LoraAdapter) graphs may apply

    @property
    def cpu(self):
        return self.backends[-1]

    def backend(self, device: str):
        b = self.by_device.get(device)
        if b is None:
            raise ModelError(f"the offload plan names device '{device}', which has no backend "
                             f"here")
        return b

    def scheds(self):
        """(phase, scheduler) of each distinct scheduler, prefill first."""
        seen = []
        for phase, s in self.sched.items():
            if all(s is not o for o in seen):
                seen.append(s)
                yield phase, s

    def worst_case_params(self) -> GraphParams:
        o = self.opts
        n_out = o.n_ubatch if o.logits_all else min(o.n_seq_max * (o.n_draft + 1), o.n_ubatch)
        swa = self.kv.spaces["swa"].n_cells if "swa" in self.kv.spaces else 0
        return GraphParams(o.n_ubatch, n_out, o.n_ctx, swa)

    def build_graph(self, params: GraphParams, lora=None):
        """(graph, inputs, logits) of one ubatch, as the runtime computes it; lora: the LoRA
        adapters applied (pyggml.llm.lora.Loras; None: none)."""
        return build_graph(self.model.hparams, self.weights, self.kv, params,
                           self.opts.flash_attn, not self.opts.logits_all,
                           embd_lookup=self.embd_lookup, lora=lora)

    def worst_case_lora(self):
        """Every loaded adapter applied (the largest graph; its scales do not matter): what
        the reserve plans for, so that no set of adapters needs more memory later."""
        if not self.loras:
            return None
        from pyggml.llm.lora import Loras
        return Loras([(ad, 1.0) for ad in self.loras])

    def reserve(self) -> int:
        """Plan the compute buffers once for the largest ubatch graph (ggml's reserve); returns
        the number of allocator plans made."""
        n = 0
        for phase, sched in self.scheds():
            gp = self.worst_case_params()
            g, _, _ = self.build_graph(gp, self.worst_case_lora())
            pin_phase_ops(sched, g, self.offload, phase, self.weights, n_tokens=gp.n_tokens)
            sched.reserve(g)
            n += 1
        return n

    def compute_buffer_size(self, device: str | None = None) -> int:
        """Bytes of the reserved compute buffers of one device or all, over all schedulers."""
        return sum(s.get_buffer_size(b) for _, s in self.scheds() for b in self.backends
                   if device is None or b.device.name == device)

    def close(self) -> None:
        for b in self.backends:
            b.close()


def _backends(offload: OffloadPlan, opts: RunOptions, catalog: DeviceCatalog | None,
              planning: bool) -> list:
    """One backend per device the plan uses, in its priority order, the CPU last."""
    from pyggml.backend.cpu import CpuBackend
    names = [n for n in offload.devices_used() if n != CPU]
    if not planning:
        # only for a device other than the CPU: listing devices loads every backend module
        # (Vulkan: its driver, ~50 MB resident for lavapipe's LLVM)
        reg = default_registry() if names else None
        return [reg.device(n).init_backend() for n in names] + [
            CpuBackend(opts.n_threads, opts.n_threads_batch)]
    catalog = catalog or DeviceCatalog.from_registry()
    out = []
    for n in names + [CPU]:
        dev = catalog.device(n)
        if not isinstance(dev, PlanningDevice):       # this machine's: its backend answers
            inner = (CpuBackend(1, 1) if dev.type == DeviceType.CPU else dev.init_backend())
            dev = PlanningDevice.stand_in(dev, inner, catalog.assumed.get(dev.name))
        out.append(dev.init_backend())
    return out


# CPU weights are read into host memory (use_mmap None) only while they take at most this share
# of the memory available: a model near the machine's size is better left mapped, where the
# kernel can drop and re-read its pages (an MoE's experts on a 16 GiB laptop).
HOST_COPY_MAX_SHARE = 0.6


def host_weights_copied(use_mmap: bool | None, n_bytes: int) -> bool:
    """Whether the weights planned on the CPU (n_bytes of them) are read into a host buffer
    instead of staying mapped from the file. use_mmap True/False (llama.cpp's --mmap/--no-mmap)
    decides; None: read when the kernel gives huge pages for the buffer (transparent huge pages
    "always" or "madvise") and the weights fit in HOST_COPY_MAX_SHARE of the available memory.

    Why: decode streams every weight once per token, and a mapped file gives 4 KiB pages: one
    TLB miss and page walk per 4 KiB read, two page tables deep in a virtual machine. Over huge
    pages Gemma 3 270M decodes ~10% faster on the AMD Zen 4 VM of BENCHMARKS.md ("weights in
    huge pages"), and Qwen2.5-Coder-1.5B reaches that machine's read limit. The RSS is the same (the mapped file's pages count in it too);
    the load reads the file once (read(2), so the file's pages are never mapped)."""
    if use_mmap is not None:
        return not use_mmap
    from pyggml.backend.cpu import available_host_memory, transparent_huge_pages
    return (transparent_huge_pages() in ("always", "madvise")
            and n_bytes <= HOST_COPY_MAX_SHARE * available_host_memory())


def _host_weights(mf: ModelFile, names: list[str], progress) -> dict:
    """The weights `names` read from the file into one CPU WEIGHTS buffer (huge pages where the
    kernel has them): name -> tensor."""
    from pyggml.backend.cpu import cpu_buffer_type
    ctx = Context(no_alloc=True, name="host-weights")
    placed = {}
    for n in names:
        info = mf.model.tensor_info(n)
        placed[n] = ctx.new_tensor(info.type, info.ne[: max(info.n_dims, 1)], name=n)
    buf = alloc_tensors(cpu_buffer_type(), placed.values(), BufferUsage.WEIGHTS)
    mf.model.read_tensors_into(
        lambda info: buf.array[placed[info.name].data - buf.base:][: info.nbytes],
        names=names, progress=progress, desc="weights to host memory")
    return placed


def _place_weights(mf: ModelFile, offload: OffloadPlan, opts: RunOptions, by_device: dict,
                   planning: bool, progress) -> tuple[dict, dict]:
    """Weights planned on a device other than the CPU get a WEIGHTS buffer there and (for real)
    their bytes copied from the mapped file; those on the CPU are read into a host buffer or
    stay mapped (zero copy), as host_weights_copied says. A tied output matrix placed on a
    device is a copy of token_embd there; on the CPU it is token_embd."""
    weights = dict(mf.weights)
    on_cpu = [n for n in mf.weights if offload.weight_device(n) == CPU]
    if not planning and host_weights_copied(
            opts.use_mmap, sum(mf.model.tensor_info(n).nbytes for n in on_cpu)):
        weights.update(_host_weights(mf, on_cpu, progress))
    if "output.weight" in offload.weights and "output.weight" not in weights:
        weights["output.weight"] = weights["token_embd.weight"]
    by_dev: dict[str, list[str]] = {}
    for name, p in offload.weights.items():
        if p.device != CPU:
            by_dev.setdefault(p.device, []).append(name)
    buffers = {}
    ctx = Context(no_alloc=True, name="device-weights")
    for dev, names in by_dev.items():
        src_of = {n: ("token_embd.weight" if n not in mf.model.tensors else n) for n in names}
        placed = {}
        for n in names:
            info = mf.model.tensor_info(src_of[n])
            placed[n] = ctx.new_tensor(info.type, info.ne[: max(info.n_dims, 1)], name=n)
        bt = by_device[dev].get_default_buffer_type()
        buf = alloc_tensors(bt, placed.values(), BufferUsage.WEIGHTS)
        if not planning:
            by_src: dict[str, list] = {}
            for n, t in placed.items():
                by_src.setdefault(src_of[n], []).append(t)
            mf.model.copy_tensors_to(lambda info, data: [buf.set_tensor(t, data)
                                                         for t in by_src[info.name]],
                                     names=list(by_src), progress=progress,
                                     desc=f"weights to {dev}")
        weights.update(placed)
        buffers[dev] = buf
    return weights, buffers


def _embedding_lookup(mf: ModelFile, weights: dict, offload: OffloadPlan, by_device: dict):
    """The matrix the token embedding lookup reads: token_embd, or the tied output matrix's copy
    on a device when all of layer 0 (weights and KV cache) is on that device too and it can run
    the lookup. Then a ubatch sends that device its token ids (4 bytes a token) instead of the
    looked-up rows (4·n_embd bytes a token), and a decoded token's graph has no CPU split before
    layer 0 (llama.cpp always looks up on the CPU: one more round of input copies per ubatch).
    The copy holds token_embd's bytes, so the rows are the same."""
    emb, copy = weights["token_embd.weight"], weights.get("output.weight")
    dev = offload.weight_device("output.weight")
    # a copy only where the file has no output.weight (_place_weights made one from token_embd;
    # Gemma reads token_embd as its output even when hp.tied_output is forced)
    if "output.weight" in mf.model.tensors or copy is None or copy is emb or dev == CPU:
        return emb
    layer0 = [p.device for n, p in offload.weights.items() if layer_of(n) == 0]
    if (not layer0 or any(d != dev for d in layer0) or not offload.kv
            or offload.kv[0].device != dev):
        return emb
    probe_ctx = Context(no_alloc=True, name="embedding-lookup-probe")
    ids = probe_ctx.new_tensor_1d(GGMLType.I32, 1, name="inp_tokens")
    probe = ops.get_rows(probe_ctx, copy, ids, name="inp_embd")
    return copy if by_device[dev].supports_op(probe) else emb


def build_run(mf: ModelFile, offload: OffloadPlan, opts: RunOptions, *,
              catalog: DeviceCatalog | None = None, planning: bool = False,
              progress: bool | None = None, loras=()) -> Run:
    """The run of `mf` placed by `offload` with resolved `opts` (see resolve_offload), its
    compute buffers reserved. planning: on planning-only devices (no memory, no weight read);
    catalog: the devices to plan on (default: this machine's). progress: a progress bar while
    weights are copied to devices (None: on a terminal). loras: LoRA adapters
    (pyggml.llm.lora.LoraAdapter, checked against mf) that graphs may apply: the reserve and
    the schedulers' graph size count them all."""
    backends = _backends(offload, opts, catalog, planning)
    try:
        by_device = {b.device.name: b for b in backends}
        by_device[CPU] = backends[-1]
        weights, weight_buffers = _place_weights(mf, offload, opts, by_device, planning,
                                                 progress)
        for p in offload.kv:
            if p.device not in by_device:
                raise ModelError(f"the offload plan puts a KV cache on '{p.device}', which has "
                                 f"no backend here")
        kv = KVCache(mf.hparams, opts.n_ctx, opts.type_k, opts.type_v, opts.n_seq_max,
                     [by_device[p.device].get_default_buffer_type() for p in offload.kv],
                     n_ubatch=opts.n_ubatch, swa_full=opts.swa_full)
        oo = offload.op_offload
        gs = graph_size(mf.hparams.n_layer) * 2
        if loras:
            from pyggml.llm.lora import Loras
            gs += 2 * Loras([(ad, 1.0) for ad in loras]).extra_graph_size()
        sched = {"prefill": Scheduler(backends, n_copies=offload.n_copies,
                                      op_offload=oo["prefill"], graph_size=gs)}
        same = oo["decode"] == oo["prefill"] and not offload.phase_ops
        sched["decode"] = sched["prefill"] if same else Scheduler(
            backends, n_copies=offload.n_copies, op_offload=oo["decode"], graph_size=gs)
        for b in backends[:-1]:
            if b.device.is_software():
                w = (f"{b.device.name} is a software device (it computes on the CPU through its "
                     f"driver, usually much slower than the CPU backend)")
                if w not in offload.warnings:
                    offload.warnings.append(w)
        run = Run(mf, opts, offload, backends, by_device, weights, weight_buffers, kv, sched,
                  planning, _embedding_lookup(mf, weights, offload, by_device), tuple(loras))
        run.reserve()
        return run
    except BaseException:
        for b in backends:
            b.close()
        raise
