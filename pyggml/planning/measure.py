"""`pyggml mem`: where a model run's memory goes, planned and measured, per device.

    rep = measure("model.gguf", n_ctx=2048, n_ubatch=512)     # load, warm up, measure RSS
    rep = estimate("model.gguf", n_ctx=8192, n_gpu_layers=99,
                   virtual=[VirtualSpec("laptop", "8GiB")])    # planning only, no hardware
    print(format_report(rep))

Per device: weights by type, KV cache (global / sliding-window layers), compute buffer as planned
by the allocator (peak) next to the naive sum of every intermediate and the peak without in-place
reuse (the allocator's saving), host staging. System RAM: the CPU's buffers, host staging, and
every UMA device's buffers (Device.uma_reason says why a device counts).

Predicted RSS (`measure`) = RSS after loading (measured before any compute: interpreter,
libraries, GGUF metadata, tokenizer; weights copied to devices at load are already in it) + the
buffers a compute touches: the CPU's weights (mapped, or read into host memory at load: then
already resident), KV cache and compute buffer (less what of them loading already made
resident, read from /proc/self/pagemap), host staging, UMA devices' KV
and compute, and the logits handed to Python. The warm-up then makes them
resident: `fill` evaluates n_ctx tokens (every KV cell written, the last ubatch reads all n_ctx
cells: the worst-case graph); `ubatch` one full ubatch and the KV buffers written whole (what a
full context holds); `token` one token (llama.cpp's warm-up); `none`. Peak RSS is the kernel's
high-water mark (VmHWM), the current RSS comes from psutil. Planning only (`estimate`), the
runtime's share is estimated (runtime_overhead_estimate).

Not counted anywhere: the CPU backend's work buffer (activations quantized for matrix products:
about 1.2 MiB for Gemma 3 270M at n_ubatch 512) and marshalled node arrays (~0.2 MiB).
"""

from __future__ import annotations

import json
import os
import resource
import sys
import time
from dataclasses import asdict, dataclass, field

from pyggml.errors import PyggmlError
from pyggml.llm.setup import DEFAULTS
from pyggml.planning.memory import CPU, Planner, RunPlan, plan_memory
from pyggml.units import MiB
from pyggml.units import fmt_bytes

WARMUPS = ("fill", "ubatch", "token", "none")
PROMPT = "The capital of France is"


# ---- process memory ----------------------------------------------------------------------------

def current_rss() -> int:
    """Resident bytes of this process now (psutil)."""
    import psutil
    return int(psutil.Process().memory_info().rss)


def peak_rss() -> int:
    """The process's resident high-water mark: VmHWM on Linux, else ru_maxrss."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    r = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return r if os.uname().sysname == "Darwin" else r * 1024


def resident_bytes(ranges) -> int | None:
    """Bytes of [base, base + size) ranges of this process's address space that are resident
    now (present in its page tables: /proc/self/pagemap bit 63), None where pagemap is not
    readable. File-backed pages count only once this process touched them, as in RSS."""
    import numpy as np
    page = os.sysconf("SC_PAGE_SIZE")
    total = 0
    try:
        fd = os.open("/proc/self/pagemap", os.O_RDONLY)
    except OSError:
        return None
    spans: list[list[int]] = []          # page ranges, merged: a page counts once
    for first, last in sorted((b // page, (b + n - 1) // page) for b, n in ranges if n > 0):
        if spans and first <= spans[-1][1] + 1:
            spans[-1][1] = max(spans[-1][1], last)
        else:
            spans.append([first, last])
    try:
        for first, last in spans:
            raw = os.pread(fd, 8 * (last - first + 1), 8 * first)
            entries = np.frombuffer(raw, dtype=np.uint64)
            total += int(np.count_nonzero(entries >> np.uint64(63))) * page
    except OSError:
        return None
    finally:
        os.close(fd)
    return total


def reset_peak_rss() -> bool:
    """Reset the high-water mark to the current RSS (Linux: /proc/self/clear_refs "5"), so that
    peak_rss() sees only what comes next. False where that is not possible."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def runtime_overhead_estimate(facts: dict) -> int:
    """RSS of a loaded runtime before its buffers: this process's current RSS (interpreter and
    libraries, pyggml imported) + 16 MiB of model objects + ~400 B per vocabulary entry (the
    tokenizer's tables; measured: Gemma 3's 262144 entries take ~105 MB)."""
    return current_rss() + 16 * MiB + 400 * int(facts.get("n_vocab", 0))


# ---- llama.cpp's figures -----------------------------------------------------------------------

# llama.cpp (CPU, n_ctx 2048, flash attention) on Gemma 3 270M Q4_K_M, from its load log and a
# 128-token generation. Its compute buffer holds logits for every position of the ubatch and does
# not depend on n_ctx; its SWA cache gives sliding-window layers n_swa + n_ubatch cells (padded).
LLAMACPP_GEMMA3_270M = {
    "name": "llama.cpp (Gemma 3 270M Q4_K_M)",
    "model_buffer": int(235.16 * MiB),
    "compute": {512: int(514.50 * MiB), 128: int(128.63 * MiB)},
    "peak_rss_gen128": (320_000_000, 340_000_000),
}


def llamacpp_reference(plan: RunPlan) -> dict | None:
    """llama.cpp's figures for this model and settings, where known (None otherwise)."""
    f = plan.facts
    if (f.get("arch"), f.get("n_layer"), f.get("n_embd"), f.get("weight_bytes")) != \
            ("gemma3", 18, 640, 246587904):
        return None
    ref = LLAMACPP_GEMMA3_270M
    return {"name": ref["name"], "weights": ref["model_buffer"],
            "compute": ref["compute"].get(plan.n_ubatch),
            "kv": plan.kv_swa_window_bytes() if plan.type_k == plan.type_v == "f16" else None,
            "kv_cells_swa": plan.n_swa_cells,
            "peak_rss_gen128": ref["peak_rss_gen128"]}


# ---- reports -----------------------------------------------------------------------------------

@dataclass
class Measurement:
    """What `measure` saw. rss_*: psutil; peak_rss: VmHWM after the warm-up (and generation).
    device_used: bytes pyggml holds on each non-CPU device (Device.memory). allocated: the
    runtime's own figures (compute per device, KV per buffer type, weights per device).
    resident / resident_at_load: the CPU's weights, KV cache and compute buffers, each as the
    bytes of its address ranges resident at the end / after loading (resident_bytes; None where
    that cannot be read; see _resident_parts)."""
    warmup: str
    peak_reset: bool                # the high-water mark was reset when measure() began
    tokens_evaluated: int
    tokens_generated: int
    rss_before_load: int
    rss_at_load: int
    rss_after: int
    peak_rss: int
    device_used: dict[str, int]
    allocated: dict
    resident: dict                  # weights / kv / compute: host bytes resident after the run
    resident_at_load: dict          # the same before the warm-up
    seconds: float


@dataclass
class MemReport:
    plan: RunPlan
    runtime: int                    # RSS of the runtime before buffers (measured or estimated)
    runtime_measured: bool
    logits_host: int                # logits handed to Python per eval (and their finite check)
    predicted_rss: int
    measured: Measurement | None = None
    reference: dict | None = None
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict:
        return {"plan": self.plan.to_dict(), "runtime": self.runtime,
                "runtime_measured": self.runtime_measured, "logits_host": self.logits_host,
                "predicted_rss": self.predicted_rss,
                "measured": None if self.measured is None else asdict(self.measured),
                "reference": self.reference, "notes": self.notes}


def _logits_host(plan: RunPlan, rows: int) -> int:
    """Logits handed to Python per eval call: LLM.decode_batch copies the wanted rows out of the
    compute buffer (float32), then selects each sequence's rows into a second array (boolean
    indexing copies): two float32 copies alive at once."""
    return rows * int(plan.facts.get("n_vocab", 0)) * 4 * 2


def _uma_devices_part(plan: RunPlan, with_weights: bool) -> int:
    return sum((d.weights if with_weights else 0) + d.kv + d.compute
               for d in plan.devices if d.uma and d.device != CPU)


def estimate(model=None, *, virtual=(), **settings) -> MemReport:
    """Planning-only report (no weight byte read, nothing allocated): a RunPlan and an
    estimated RSS. settings: Planner.plan's keyword arguments."""
    plan = plan_memory(model, virtual=virtual, **settings)
    runtime = runtime_overhead_estimate(plan.facts)
    logits = _logits_host(plan, plan.n_ubatch if plan.logits_all else 1)
    rep = MemReport(plan, runtime, False, logits, runtime + plan.system_ram + logits,
                    reference=llamacpp_reference(plan))
    _add_notes(rep)
    return rep


def measure(model=None, *, config=None, n_ctx: int = DEFAULTS.n_ctx,
            n_ubatch: int = DEFAULTS.n_ubatch, n_batch: int = DEFAULTS.n_batch,
            n_threads: int | None = None, type_k="f16", type_v="f16",
            logits_all: bool = False, flash_attn: bool = True, n_gpu_layers: int = 0,
            offload=None, warmup: str = "fill", gen: int = 0, prompt: str = PROMPT,
            swa_full: bool = False, progress: bool = False, lora=None) -> MemReport:
    """Load the model with the runtime (config: an offload config, as LLM takes it; lora: LoRA
    adapters as LLM takes them), plan the same configuration, warm up (see the module docstring), optionally generate `gen` tokens
    greedily, and measure."""
    from pyggml.llm.runtime import LLM
    if warmup not in WARMUPS:
        raise PyggmlError(f"warmup must be one of {', '.join(WARMUPS)}, got {warmup!r}")
    from pyggml.backend.base import default_registry
    from pyggml.offload.config import load_config
    from pyggml.offload.devices import needs_machine_devices
    t0 = time.perf_counter()
    if config is not None:
        config = load_config(config)
    if n_gpu_layers or needs_machine_devices(config) or (
            offload is not None and any(d != CPU for d in offload.devices_used())):
        default_registry().devices()    # backend modules and drivers: part of "before loading"
    # (a CPU-only run lists no other device: its backend modules are never loaded)
    peak_reset = reset_peak_rss()
    rss0 = current_rss()
    llm = LLM(model, config=config, n_ctx=n_ctx, n_batch=n_batch, n_ubatch=n_ubatch,
              n_threads=n_threads, n_threads_batch=n_threads, type_k=type_k, type_v=type_v,
              logits_all=logits_all, flash_attn=flash_attn, n_gpu_layers=n_gpu_layers,
              offload=offload, progress=False, swa_full=swa_full, lora=lora)
    try:
        n_ubatch = llm.n_ubatch
        plan = plan_memory(llm.run.model, opts=llm.run.opts, offload=llm.offload, lora=lora)
        rss_load = current_rss()
        at_load = _resident_parts(llm)
        allocated = {
            "compute": {b.device.name: llm.compute_buffer_size(b.device.name)
                        for b in llm.backends},
            "kv": dict(llm.kv.bytes_by_buffer_type),
            "weight_buffers": {d: b.n_bytes for d, b in llm.weight_buffers.items()},
        }
        n_eval = _warm_up(llm, warmup, progress)
        n_gen = 0
        if gen > 0:
            for _ in llm.generate(prompt, gen, temperature=0.0, stop_at_eog=False):
                n_gen += 1
        resident = _resident_parts(llm)
        used = {}
        for b in llm.backends:
            if b.device.name != CPU and b.device.type.value != "CPU":
                free, total = b.device.memory()
                used[b.device.name] = total - free
        m = Measurement(warmup, peak_reset, n_eval, n_gen, rss0, rss_load, current_rss(),
                        peak_rss(), used, allocated, resident, at_load,
                        time.perf_counter() - t0)
    finally:
        llm.close()
    rows = n_ubatch if logits_all else 1
    logits = _logits_host(plan, rows)
    cpu = plan.device(CPU)
    # what loading already made resident is in rss_load: count only the rest of each buffer
    # (weights read at load to copy a tied output to a device, for instance)
    fresh = sum(max(0, planned - (at_load.get(key) or 0)) for key, planned in
                (("weights", cpu.weights), ("kv", cpu.kv), ("compute", cpu.compute)))
    # adapters stay mapped; the first token applying them reads them all
    fresh += sum(n for _, scale, n in plan.loras if scale != 0)
    predicted = rss_load + fresh + plan.staging + _uma_devices_part(plan, False) + logits
    rep = MemReport(plan, rss_load, True, logits, predicted, m, llamacpp_reference(plan))
    _add_notes(rep)
    return rep


def _resident_parts(llm) -> dict:
    """Resident bytes of the CPU's buffers: weights (CPU-placed tensors: file ranges where
    they stay mapped, else their host copy), KV cache, compute buffers; `copied`: file ranges
    of weights copied to devices; `mapped_all`: the whole mapped GGUF (header and metadata
    included) and `mapped` its size."""
    from pyggml.backend.base import is_host_buffer
    maps = {id(p.buffer): (p.buffer.base, p.buffer.size) for p in llm.model.parts}
    cpu_w, copied = [], []
    for name, p in llm.offload.weights.items():
        if p.device == CPU:
            t = llm.run.weights[name]
            cpu_w.append((t.data, t.nbytes()))
            continue
        src = "token_embd.weight" if name not in llm.model.tensors else name
        info = llm.model.tensor_info(src)
        copied.append((llm.model.parts[info.part].buffer.base + info.offset, info.nbytes))
    kv = [(b.base, b.n_bytes) for b in llm.kv.buffers if is_host_buffer(b)]
    compute, seen = [], []
    for sched in llm.sched.values():
        if any(sched is o for o in seen):
            continue
        seen.append(sched)
        for i, b in enumerate(sched.backends):
            if b.device.type.value == "CPU":
                compute += sched.galloc.memory_ranges(i)
    return {"weights": resident_bytes(cpu_w), "copied": resident_bytes(copied),
            "mapped_all": resident_bytes(maps.values()),
            "mapped": sum(n for _, n in maps.values()),
            "kv": resident_bytes(kv), "compute": resident_bytes(compute)}


def _warm_up(llm, warmup: str, progress: bool = False) -> int:
    """Run the warm-up (a progress bar on stderr with `progress`); returns the tokens
    evaluated. The cache is emptied afterwards."""
    if warmup == "none":
        return 0
    V = llm.hparams.n_vocab
    if warmup == "token":
        n = 1
    elif warmup == "ubatch":
        n = min(llm.n_ubatch, llm.n_ctx)
        for buf in llm.kv.buffers:          # what a full context holds: every cell written
            buf.clear(0)
    else:
        n = llm.n_ctx
    ids = [(i * 7919 + 13) % V for i in range(n)]
    step = llm.n_ubatch                     # one ubatch per eval: the progress bar moves
    from tqdm import tqdm
    with tqdm(total=n, unit="tok", desc="warm-up", disable=not progress, leave=False) as bar:
        for i in range(0, n, step):
            llm.eval(ids[i:i + step])
            bar.update(len(ids[i:i + step]))
    llm.reset()
    return n


def _add_notes(rep: MemReport) -> None:
    plan = rep.plan
    for d in plan.devices:
        if d.uma and d.device != CPU:
            rep.notes.append(f"{d.device} shares system RAM ({d.uma}): its {fmt_bytes(d.total)} "
                             f"count against system RAM too; offloading to it frees no RAM.")
    ng, bg, ns, bs = plan.kv_split()
    cells = {x.cells for x in plan.kv_layers if x.sliding}
    if ns and plan.n_swa_cells and plan.n_swa_cells < plan.n_ctx:
        if cells == {plan.n_ctx}:
            rep.notes.append(
                f"swa_full: the KV cache keeps all {plan.n_ctx} cells for the {ns} sliding-window "
                f"layers too ({fmt_bytes(bs)}); the window-sized cache ({plan.n_swa_cells} cells = "
                f"window {plan.facts.get('sliding_window')} + n_ubatch, as llama.cpp) would hold "
                f"{fmt_bytes(plan.kv_swa_window_bytes() - bg)}.")
        else:
            rep.notes.append(
                f"the {ns} sliding-window layers keep {'/'.join(map(str, sorted(cells)))} KV "
                f"cells (window {plan.facts.get('sliding_window')} + n_ubatch, padded to 256, "
                f"as llama.cpp), the {ng} global layers all {plan.n_ctx}.")
    rec = [x for x in plan.kv_layers if x.recurrent]
    if rec:
        from pyggml.llm.recurrent import CHECKPOINTS_MAX
        n_seq = rec[0].cells
        total = sum(x.bytes for x in rec)
        rep.notes.append(
            f"the {len(rec)} recurrent layers keep a fixed state per sequence instead of KV "
            f"cells: {fmt_bytes(total // n_seq)} per sequence ({fmt_bytes(rec[0].bytes // n_seq)} "
            f"a layer), {fmt_bytes(total)} for n_seq_max {n_seq}; the prompt cache's state "
            f"checkpoints take at most {fmt_bytes(total * (CHECKPOINTS_MAX + 1))} of system RAM "
            f"({CHECKPOINTS_MAX} per sequence + 1 before a speculative verification).")
    if plan.logits_all:
        rep.notes.append("logits for every position: the compute buffer holds n_ubatch rows of "
                         "logits, as llama.cpp always reserves.")


# ---- formatting --------------------------------------------------------------------------------

def _row(label: str, values, ref=None, width=14) -> str:
    cells = "".join(f"{v:>{width}}" for v in values)
    return f"  {label:<30}{cells}" + (f"{ref:>{width + 4}}" if ref is not None else "")


def format_report(rep: MemReport) -> str:
    plan = rep.plan
    f = plan.facts
    ref = rep.reference
    out = [f"model {f.get('file')} ({f.get('arch')}, {f.get('n_layer')} layers, "
           f"n_vocab {f.get('n_vocab')}); n_ctx {plan.n_ctx}, n_ubatch {plan.n_ubatch}, "
           f"n_batch {plan.n_batch}, KV {plan.type_k}/{plan.type_v}, flash attention "
           f"{'on' if plan.flash_attn else 'off'}, logits "
           f"{'for every position' if plan.logits_all else 'of the last token'}"]
    devs = plan.devices
    names = [d.device + ("" if d.device == CPU or not d.uma else " (UMA)") for d in devs]
    r = (lambda key: None if ref is None else fmt_bytes(ref[key]) if ref.get(key) else "-")
    out.append(_row("", names, ref and "llama.cpp"))
    out.append(_row("weights", [fmt_bytes(d.weights) for d in devs], r("weights")))
    types = sorted({t for d in devs for t in d.weights_by_type},
                   key=lambda t: -sum(d.weights_by_type.get(t, 0) for d in devs))
    for t in types:
        out.append(_row(f"  {t}", [fmt_bytes(d.weights_by_type.get(t)) if t in d.weights_by_type
                                   else "" for d in devs]))
    if plan.expert_bytes:
        out.append(_row("  of which experts (MoE)", [fmt_bytes(d.experts) for d in devs]))
    if plan.loras:
        out.append(_row("LoRA adapters (mapped)", [fmt_bytes(plan.lora_bytes) if d.device == CPU
                                                   else "" for d in devs]))
    out.append(_row("KV cache", [fmt_bytes(d.kv) for d in devs], r("kv")))
    if any(x.recurrent for x in plan.kv_layers):
        n_rec = sum(1 for x in plan.kv_layers if x.recurrent)
        out.append(_row(f"  {n_rec} recurrent layers (state)",
                        [fmt_bytes(sum(x.bytes for x in plan.kv_layers
                                       if x.recurrent and x.device == d.device)) for d in devs]))
    ng, bg, ns, bs = plan.kv_split()
    if ns:
        by = {d.device: [0, 0] for d in devs}
        for x in plan.kv_layers:
            by[x.device][1 if x.sliding else 0] += x.bytes
        ref_g = fmt_bytes(bg) if ref else None
        ref_s = fmt_bytes(plan.kv_swa_window_bytes() - bg) if ref and plan.n_swa_cells else None
        out.append(_row(f"  {ng} global layers", [fmt_bytes(by[d.device][0]) for d in devs], ref_g))
        out.append(_row(f"  {ns} sliding-window layers", [fmt_bytes(by[d.device][1]) for d in devs],
                        ref_s))
    out.append(_row("compute buffer (planned peak)", [fmt_bytes(d.compute) for d in devs],
                    r("compute")))
    out.append(_row("  naive sum of intermediates", [fmt_bytes(d.compute_naive) for d in devs]))
    out.append(_row("  peak without in-place reuse", [fmt_bytes(d.compute_no_inplace)
                                                      for d in devs]))
    out.append(_row("  lower bound (lifetimes)", [fmt_bytes(d.compute_lower_bound) for d in devs]))
    out.append(_row("host staging (system RAM)", [fmt_bytes(d.staging) for d in devs]))
    out.append(_row("total on the device", [fmt_bytes(d.total) for d in devs]))
    mem = [fmt_bytes(d.memory[1]) if d.memory else "?" for d in devs]
    out.append(_row("device memory (total)", mem))
    out.append("")
    sys_parts = [f"{d.device} {fmt_bytes(d.total)}" + ("" if d.device == CPU else " (UMA)")
                 for d in devs if d.uma]
    out.append(f"system RAM buffers: {fmt_bytes(plan.system_ram)} ("
               + ", ".join(sys_parts + [f"host staging {fmt_bytes(plan.staging)}"]
                           + ([f"LoRA adapters {fmt_bytes(plan.lora_bytes)}"] if plan.loras
                              else [])) + ")")
    if plan.expert_bytes:
        out.append(f"weights read per decoded token: {fmt_bytes(plan.weight_bytes_per_token)} "
                   f"({plan.facts.get('n_expert_used')} of {plan.facts.get('n_expert')} routed "
                   f"experts per layer)")
    m = rep.measured
    if m is None:
        out.append(f"predicted RSS {fmt_bytes(rep.predicted_rss)} = runtime {fmt_bytes(rep.runtime)} "
                   f"(estimated) + system RAM buffers + logits handed to Python "
                   f"{fmt_bytes(rep.logits_host)} (planning only: nothing loaded)")
    else:
        diff = m.peak_rss - rep.predicted_rss
        rest = rep.predicted_rss - m.rss_at_load - rep.logits_host
        out.append(f"predicted RSS {fmt_bytes(rep.predicted_rss)} = RSS after loading "
                   f"{fmt_bytes(m.rss_at_load)} + buffers a compute touches that loading did not "
                   f"{fmt_bytes(rest)} + logits handed to Python {fmt_bytes(rep.logits_host)}")
        what = {"fill": f"{m.tokens_evaluated} tokens (full context)",
                "ubatch": f"one ubatch of {m.tokens_evaluated} tokens, KV written whole",
                "token": "one token", "none": "no warm-up"}[m.warmup]
        gen = f", then {m.tokens_generated} generated tokens" if m.tokens_generated else ""
        out.append(f"measured after warm-up ({what}{gen}): peak RSS {fmt_bytes(m.peak_rss)} "
                   f"({m.peak_rss / 1e6:.0f} MB), RSS now {fmt_bytes(m.rss_after)}; "
                   f"peak - predicted = {diff / MiB:+.1f} MiB "
                   f"({100.0 * diff / max(rep.predicted_rss, 1):+.1f}%)")
        cpu = plan.device(CPU)
        res = m.resident
        if res.get("weights") is not None:
            parts = [f"{what} {fmt_bytes(res[key])} of {fmt_bytes(planned)}" for what, key, planned in
                     (("CPU weights", "weights", cpu.weights), ("KV cache", "kv", cpu.kv),
                      ("compute", "compute", cpu.compute)) if planned]
            parts.append(f"the whole mapped GGUF {fmt_bytes(res['mapped_all'])} of "
                         f"{fmt_bytes(res['mapped'])}")
            out.append("resident at the end (pagemap): " + ", ".join(parts))
            if res.get("copied"):
                out.append(f"file pages of weights copied to devices, still mapped (the kernel "
                           f"may reclaim them): {fmt_bytes(res['copied'])}")
        if not m.peak_reset:
            out.append("(the peak could not be reset: it covers the whole process)")
        out.append(f"RSS before loading {fmt_bytes(m.rss_before_load)} (interpreter, libraries, "
                   f"backend modules); loading added {fmt_bytes(m.rss_at_load - m.rss_before_load)}"
                   f" (GGUF metadata, tokenizer, runtime objects, weights copied to devices)")
        for dev, n in m.device_used.items():
            out.append(f"{dev}: pyggml holds {fmt_bytes(n)} of device memory (planned "
                       f"{fmt_bytes(plan.device(dev).total)})")
        mism = [f"{dev} allocated {fmt_bytes(n)}, planned {fmt_bytes(plan.device(dev).compute)}"
                for dev, n in m.allocated["compute"].items()
                if dev in [d.device for d in devs] and n != plan.device(dev).compute]
        out.append("runtime's compute buffers: " + ("; ".join(mism) if mism else
                                                    "as planned"))
    if ref is not None:
        lo, hi = ref["peak_rss_gen128"]
        out.append(f"{ref['name']}: compute buffer "
                   f"{fmt_bytes(ref['compute']) if ref['compute'] else '(not known at this n_ubatch)'}"
                   f" (logits for all {plan.n_ubatch} positions), peak RSS generating 128 tokens "
                   f"{lo / 1e6:.0f}-{hi / 1e6:.0f} MB")
    for note in rep.notes:
        out.append("note: " + note)
    return "\n".join(out)


# ---- sweeps ------------------------------------------------------------------------------------

def sweep(model, n_ctxs, n_ubatches, *, virtual=(), config=None, **settings) -> list[dict]:
    """Plan every (n_ctx, n_ubatch): rows of n_ctx, n_ubatch, and per device compute / kv /
    weights / total, plus system_ram. Planning only. config: an offload config whose sizes the
    sweep replaces."""
    from pyggml.offload.config import load_config
    base = load_config(config if config is not None else {})
    rows = []
    with Planner(model, virtual=virtual) as planner:
        for ub in n_ubatches:
            for n_ctx in n_ctxs:
                cfg = base.with_values({"context": {"n_ctx": n_ctx, "n_ubatch": ub}}, "sweep")
                plan = planner.plan(cfg, with_no_inplace=False, **settings)
                row = {"n_ctx": n_ctx, "n_ubatch": plan.n_ubatch,
                       "compute": plan.compute_bytes, "kv": plan.kv_bytes,
                       "system_ram": plan.system_ram}
                for d in plan.devices:
                    for k in ("weights", "kv", "compute", "total"):
                        row[f"{d.device}.{k}"] = getattr(d, k)
                rows.append(row)
    return rows


def format_sweep(rows: list[dict]) -> str:
    head = f"{'n_ubatch':>8} {'n_ctx':>7} {'compute':>12} {'KV cache':>12} {'system RAM':>12}"
    lines = [head]
    for r in rows:
        lines.append(f"{r['n_ubatch']:>8} {r['n_ctx']:>7} {fmt_bytes(r['compute']):>12} "
                     f"{fmt_bytes(r['kv']):>12} {fmt_bytes(r['system_ram']):>12}")
    return "\n".join(lines)


def write_sweep_csv(rows: list[dict], path) -> None:
    import csv
    keys = list(rows[0]) if rows else []
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=keys)
        w.writeheader()
        w.writerows(rows)
