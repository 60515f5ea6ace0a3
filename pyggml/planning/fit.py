"""Fit searches: what makes a plan fit the memory there is.

    changes = suggest_changes(planner, plan)       # `pyggml plan --check-fit`: smallest changes
    res = fit("model.gguf", budgets={"Vulkan0": "6GiB", "CPU": "8GiB"})   # `pyggml mem --fit`
    res.n_gpu_layers, res.n_ctx, res.plan          # the plan that achieves it
    open("fit.yaml", "w").write(res.to_yaml())     # a config `pyggml run -c fit.yaml` takes

Both plan every candidate with pyggml.planning.memory (no weight byte read, nothing allocated)
and search with one bisection (`largest_fitting`: memory grows with n_ctx, gpu_layers and
n_ubatch).

suggest_changes: each device's planned bytes against its free memory; where something does not
fit, single changes that make it fit, smallest move first: the KV cache on the CPU, the largest
gpu_layers, n_ctx (multiples of 256) and n_ubatch.

fit: budgets are bytes per device name; "CPU" is system RAM. Without one, a device's budget is
its free memory (a virtual device: its declared size; system RAM: psutil's available memory),
times (1 - margin). What must fit: on every non-CPU device its weights + KV cache + compute
buffer; in system RAM the runtime's own memory (estimated, or `runtime=` bytes) + the CPU's
buffers + host staging + every UMA device's buffers (an integrated GPU's memory is system RAM:
offloading to it frees no RAM). Software devices (lavapipe) are never proposed unless named
(`gpu_device=`): they are slower than the CPU. prefer="gpu_layers" (default): from every layer
and the output on the GPU down to none, the first gpu_layers value at which min_ctx fits, then
the largest n_ctx (a multiple of 256, up to max_ctx, at most the trained context) at that value:
speed first, then context. prefer="ctx": the largest n_ctx over all gpu_layers values, then the
most gpu_layers at that n_ctx.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from pyggml.backend.catalog import VirtualSpec
from pyggml.errors import ConfigError, PyggmlError
from pyggml.planning.memory import CPU, FitChange, Planner, RunPlan
from pyggml.units import fmt_bytes, parse_size, size_text

CTX_STEP = 256          # the KV cache pads n_kv to 256: contexts are multiples of it


def largest_fitting(lo: int, hi: int, fits, step: int = 1) -> int | None:
    """The largest multiple of `step` in [lo, hi] for which fits(x) holds (lo, hi multiples of
    step), assuming fits is monotone (true up to some x, false above); None when fits(lo) fails.
    Asks fits about O(log((hi - lo) / step)) values, hi first."""
    if lo > hi or not fits(lo):
        return None
    if fits(hi):
        return hi
    good, bad = lo, hi                      # fits at good, not at bad
    while bad - good > step:
        mid = (good + bad) // 2 // step * step
        mid = max(mid, good + step)
        if fits(mid):
            good = mid
        else:
            bad = mid
    return good


def suggest_changes(planner: Planner, report: RunPlan, max_evals: int = 40) -> list[FitChange]:
    """Changes that make every device fit, smallest move first ([] when none is found or all
    fits already): the KV cache on the CPU, the largest gpu_layers, n_ctx (multiples of 256) and
    n_ubatch that fit; each one a full plan."""
    bad = report.not_fitting()
    if not bad:
        return []
    evals = [0]
    cfg = report.config
    plans: dict[tuple, RunPlan | None] = {}

    def attempt(sets) -> RunPlan | None:
        key = tuple(sets)
        if key not in plans:
            if evals[0] >= max_evals:
                return None
            evals[0] += 1
            try:
                plans[key] = planner.plan(cfg.with_sets(sets), opts=report.opts,
                                          with_no_inplace=False, lora=report.lora_specs)
            except PyggmlError:
                plans[key] = None
        return plans[key]

    def fits(sets) -> bool:
        r = attempt(sets)
        return r is not None and not r.not_fitting()

    def moved(r: RunPlan) -> int:
        after = {d.device: d.total for d in r.devices}
        return sum(report.device(d).total - after.get(d, 0) for d in bad)

    out: list[FitChange] = []
    if any(report.device(d).kv for d in bad if d != CPU):
        ranges = cfg.get(("kv", "ranges")) or []
        sets = ["kv.device=cpu"] + [f"kv.ranges.{i}.device=cpu"
                                    for i, r in enumerate(ranges) if "device" in r]
        if fits(sets):
            out.append(FitChange("KV cache on the CPU", sets, moved(attempt(sets)),
                                 attempt(sets)))
    searches = [("gpu_layers", "gpu_layers", 1,
                 sum(1 for d in report.offload.layer_devices if d != CPU),
                 any(d != CPU for d in bad)),
                ("n_ctx", "context.n_ctx", CTX_STEP, report.n_ctx, True),
                ("n_ubatch", "context.n_ubatch", 1, report.n_ubatch, True)]
    for what, key, step, now, wanted in searches:
        if not wanted or now <= step:
            continue
        best = largest_fitting(step, (now - 1) // step * step,
                               lambda x: fits([f"{key}={x}"]), step)
        if best is not None:
            r = attempt([f"{key}={best}"])
            out.append(FitChange(f"{what}: {best} (was {now})", [f"{key}={best}"], moved(r), r))
    out.sort(key=lambda c: c.moved)
    return out


@dataclass
class Check:
    """One planned candidate: does it fit, and by how much each budget is over (bytes > 0)."""
    n_gpu_layers: int
    n_ctx: int
    fits: bool
    need: dict[str, int]
    over: dict[str, int]

@dataclass
class FitResult:
    model: str
    fits: bool
    n_gpu_layers: int
    n_ctx: int
    gpu_device: str | None
    budgets: dict[str, int]
    runtime: int                    # system RAM the runtime itself is given (estimate or given)
    plan: RunPlan | None
    config: object | None           # the offload config (pyggml.offload.config.Config) found
    checks: list[Check] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def summary(self) -> str:
        head = (f"fits: gpu_layers {self.n_gpu_layers}" +
                (f" on {self.gpu_device}" if self.gpu_device and self.n_gpu_layers else "") +
                f", n_ctx {self.n_ctx}") if self.fits else "does not fit even on the CPU alone"
        lines = [head, "budgets: " + ", ".join(
            f"{d} {fmt_bytes(b)}" + (" (system RAM)" if d == CPU else "")
            for d, b in self.budgets.items())]
        if self.plan is not None:
            for d in self.plan.devices:
                if d.device == CPU:
                    continue
                lines.append(f"  {d.device}: {fmt_bytes(d.total)} = weights {fmt_bytes(d.weights)} + KV "
                             f"{fmt_bytes(d.kv)} + compute {fmt_bytes(d.compute)}")
            cpu = self.plan.device(CPU)
            lines.append(f"  system RAM: {fmt_bytes(self.runtime + self.plan.system_ram)} = runtime "
                         f"{fmt_bytes(self.runtime)} + CPU weights {fmt_bytes(cpu.weights)} + KV "
                         f"{fmt_bytes(cpu.kv)} + compute {fmt_bytes(cpu.compute)} + staging "
                         f"{fmt_bytes(self.plan.staging)}" +
                         "".join(f" + {d.device} {fmt_bytes(d.total)} (UMA)"
                                 for d in self.plan.devices if d.uma and d.device != CPU) +
                         (f" + LoRA adapters {fmt_bytes(self.plan.lora_bytes)}"
                          if self.plan.loras else ""))
        lines += ["note: " + n for n in self.notes]
        return "\n".join(lines)

    def to_config(self) -> dict:
        """The result as an offload config (plain data of pyggml.offload.config's schema, keys
        in the schema's order)."""
        from pyggml.offload.config import SCHEMA
        data = {} if self.config is None else self.config.data
        order = list(SCHEMA["properties"])
        return {k: data[k] for k in sorted(data, key=lambda k: (order.index(k) if k in order
                                                                 else len(order)))}

    def to_yaml(self) -> str:
        from pyggml.offload.config import dump_yaml
        head = [f"# written by `pyggml mem --fit` for {self.model}"]
        head += ["# " + line for line in self.summary().splitlines()]
        if self.to_config().get("virtual_devices"):
            head.append("# virtual_devices are planning-only: to run this on the machine that "
                        "has the GPU, put its name (`pyggml plan` lists them) in devices")
        return "\n".join(head) + "\n" + dump_yaml(self.to_config())


def default_budgets(planner: Planner, names, margin: float) -> dict[str, int]:
    """Free memory of each named device (virtual: declared), system RAM available, less margin."""
    import psutil
    out = {}
    for name in names:
        avail = (psutil.virtual_memory().available if name == CPU
                 else planner.catalog.memory_of(name)[0])
        out[name] = int(avail * (1.0 - margin))
    return out


def _need(plan: RunPlan, runtime: int) -> dict[str, int]:
    need = {d.device: d.total for d in plan.devices if d.device != CPU}
    need[CPU] = runtime + plan.system_ram
    return need


def fit(model=None, budgets: dict | None = None, *, config=None, virtual=(),
        gpu_device: str | None = None, min_ctx: int | None = None, max_ctx: int | None = None,
        n_ubatch: int | None = None, n_batch: int | None = None, type_k: str | None = None,
        type_v: str | None = None, flash_attn: bool = True, logits_all: bool = False,
        swa_full: bool = False, runtime: int | str | None = None, margin: float = 0.05,
        prefer: str = "gpu_layers", max_gpu_layers: int | None = None, lora=None) -> FitResult:
    """See the module docstring. config: a base offload config (path, Config or dict: its rules,
    KV placement, devices and sizes are kept; gpu_layers and context.n_ctx are what is searched).
    budgets: {device: bytes or '6GiB'}; missing devices get default_budgets. runtime: system RAM
    the runtime needs besides its buffers (default: pyggml.planning.measure's estimate). lora:
    LoRA adapters as LLM takes them, planned with every candidate."""
    from pyggml.offload.config import load_config
    from pyggml.offload.devices import with_config_devices
    if prefer not in ("gpu_layers", "ctx"):
        raise ConfigError(f"prefer must be 'gpu_layers' or 'ctx', got {prefer!r}")
    with Planner(model, virtual=virtual) as planner:
        hp = planner.mf.hparams
        base = load_config(config if config is not None else {})
        planner.catalog = with_config_devices(planner.catalog, base)
        declared = [d for d in base.get(("devices",)) or [] if str(d).lower() != "cpu"]
        gpu = gpu_device or (str(declared[0]) if declared else None) or planner.catalog.default_gpu()
        if gpu is not None:
            dev = planner.catalog.device(gpu)
            gpu = dev.name
            if dev.is_software() and not gpu_device and not declared:
                gpu = None               # slower than the CPU: only when named
        # the base config's values stay; what the search sets is marked as the advisor's
        values: dict = {"context": {}}
        for key, v in (("n_ubatch", n_ubatch), ("n_batch", n_batch)):
            if v is not None:
                values["context"][key] = v
        kv = {k: v for k, v in (("type_k", type_k), ("type_v", type_v)) if v is not None}
        if kv:
            values["kv"] = kv
        in_base = {x["name"] for x in base.get(("virtual_devices",)) or []}
        cli_virtual = [v for v in virtual if isinstance(v, VirtualSpec) and v.name not in in_base
                       and getattr(planner.catalog.device(v.name), "virtual", False)]
        if gpu in {v.name for v in cli_virtual}:
            values["virtual_devices"] = (
                list(base.get(("virtual_devices",)) or []) +
                [{"name": v.name, "memory": size_text(v.memory), "kind": v.kind}
                 for v in cli_virtual])
        names = ([gpu] if gpu else []) + [CPU]
        given = {planner.catalog.device(k).name if k.upper() != CPU else CPU: parse_size(v)
                 for k, v in (budgets or {}).items()}
        budget = default_budgets(planner, [n for n in names if n not in given], margin)
        budget.update(given)
        if runtime is None:
            from pyggml.planning.measure import runtime_overhead_estimate
            runtime = runtime_overhead_estimate(planner.mf.facts())
        runtime = parse_size(runtime, "runtime memory")
        top = hp.n_layer + 1 if gpu else 0
        if max_gpu_layers is not None:
            top = min(top, max_gpu_layers)
        hi_ctx = min(max_ctx or hp.n_ctx_train, hp.n_ctx_train) // CTX_STEP * CTX_STEP
        hi_ctx = max(hi_ctx, CTX_STEP)
        lo_ctx = min(min_ctx or min(4096, hi_ctx), hi_ctx) // CTX_STEP * CTX_STEP or CTX_STEP
        checks: dict[tuple[int, int], Check] = {}
        found: dict[tuple[int, int], RunPlan] = {}

        def check(ngl: int, n_ctx: int) -> Check:
            if (ngl, n_ctx) in checks:
                return checks[ngl, n_ctx]
            v = {k: (dict(x) if isinstance(x, dict) else x) for k, x in values.items()}
            v["context"] = dict(values["context"], n_ctx=n_ctx)
            v["gpu_layers"] = ngl
            if not declared or gpu_device:
                v["devices"] = [gpu] if ngl and gpu else ["cpu"]
            cfg = base.with_values(v, "pyggml mem --fit")
            plan = planner.plan(cfg, with_no_inplace=False, flash_attn=flash_attn,
                                logits_all=logits_all, swa_full=swa_full, lora=lora)
            need = _need(plan, runtime)
            over = {d: need.get(d, 0) - b for d, b in budget.items() if need.get(d, 0) > b}
            checks[ngl, n_ctx] = Check(ngl, n_ctx, not over, need, over)
            found[ngl, n_ctx] = plan
            return checks[ngl, n_ctx]

        def largest_ctx(ngl: int, lo: int) -> int | None:
            return largest_fitting(lo, hi_ctx, lambda n: check(ngl, n).fits, CTX_STEP)

        best: tuple[int, int] | None = None
        for ngl in range(top, -1, -1):
            lo = lo_ctx if best is None else min(hi_ctx, best[1] + CTX_STEP)
            n = largest_ctx(ngl, lo)
            if n is not None and (best is None or n > best[1]):
                best = (ngl, n)
                if prefer == "gpu_layers":
                    break
        notes = []
        if best is None:             # not even min_ctx on the CPU: the largest context at all
            n = largest_ctx(0, CTX_STEP) if lo_ctx > CTX_STEP else None
            if n is not None:
                best = (0, n)
                notes.append(f"n_ctx {lo_ctx} does not fit anywhere; {n} does (CPU only)")
        if best is None:
            c = check(0, min(lo_ctx, CTX_STEP))
            notes.append("even n_ctx 256 on the CPU is over budget by " +
                         ", ".join(f"{d} {fmt_bytes(o)}" for d, o in c.over.items()))
            plan = found[0, c.n_ctx]
            return FitResult(planner.path, False, 0, 0, gpu, budget, runtime, plan,
                             plan.config, list(checks.values()), notes)
        ngl, n_ctx = best
        plan = found[best]
        for d in plan.devices:
            if d.uma and d.device != CPU and d.total:
                notes.append(f"{d.device} shares system RAM ({d.uma}): its {fmt_bytes(d.total)} "
                             f"are counted against the system RAM budget too")
        if ngl < top:
            nxt = [c for c in checks.values() if c.n_gpu_layers == ngl + 1 and not c.fits]
            if nxt:
                notes.append(f"gpu_layers {ngl + 1} does not fit at n_ctx {nxt[0].n_ctx}: over "
                             "by " + ", ".join(f"{d} {fmt_bytes(o)}"
                                               for d, o in nxt[0].over.items()))
        return FitResult(planner.path, True, ngl, n_ctx, gpu if ngl else None, budget, runtime,
                         plan, plan.config, list(checks.values()), notes)
