"""The fit advisor: the largest context and the most GPU layers that fit given memory budgets.

    res = fit("model.gguf", budgets={"Vulkan0": "6GiB", "CPU": "8GiB"})
    res.n_gpu_layers, res.n_ctx, res.plan          # the plan that achieves it
    open("fit.yaml", "w").write(res.to_yaml())    # a config `pyggml run -c fit.yaml` takes

Budgets: bytes per device name; "CPU" is system RAM. Without one, a device's budget is its free
memory (a virtual device: its declared size; system RAM: psutil's available memory), times
(1 - margin). What must fit: on every non-CPU device, its weights + KV cache + compute buffer; in
system RAM, the runtime's own memory (estimated, or `runtime=` bytes) + the CPU's buffers + host
staging + every UMA device's buffers (an integrated GPU's memory is system RAM: offloading to it
frees no RAM, and the report says so). Every candidate is planned with pyggml.planning.memory (no
weight byte read, nothing allocated).

Search. prefer="gpu_layers" (default): from every layer and the output on the GPU down to none,
the first gpu_layers value at which min_ctx fits, then the largest n_ctx (a multiple of 256, up
to max_ctx) at that value: speed first, then context. prefer="ctx": the largest n_ctx over all
gpu_layers values, then the most gpu_layers at that n_ctx. Both assume memory grows with n_ctx
(binary search) and scan gpu_layers one by one.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from pyggml.errors import ConfigError
from pyggml.planning.memory import (
    CPU,
    Devices,
    MemoryPlan,
    PlanningModel,
    human,
    parse_size,
    plan_memory,
)

CTX_STEP = 256          # the KV cache pads n_kv to 256: contexts are multiples of it


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
    plan: MemoryPlan | None
    config: object | None           # the offload config (pyggml.offload.config.Config) found
    checks: list[Check] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def summary(self) -> str:
        head = (f"fits: gpu_layers {self.n_gpu_layers}" +
                (f" on {self.gpu_device}" if self.gpu_device and self.n_gpu_layers else "") +
                f", n_ctx {self.n_ctx}") if self.fits else "does not fit even on the CPU alone"
        lines = [head, "budgets: " + ", ".join(
            f"{d} {human(b)}" + (" (system RAM)" if d == CPU else "")
            for d, b in self.budgets.items())]
        if self.plan is not None:
            for d in self.plan.devices:
                if d.device == CPU:
                    continue
                lines.append(f"  {d.device}: {human(d.total)} = weights {human(d.weights)} + KV "
                             f"{human(d.kv)} + compute {human(d.compute)}")
            cpu = self.plan.device(CPU)
            lines.append(f"  system RAM: {human(self.runtime + self.plan.system_ram)} = runtime "
                         f"{human(self.runtime)} + CPU weights {human(cpu.weights)} + KV "
                         f"{human(cpu.kv)} + compute {human(cpu.compute)} + staging "
                         f"{human(self.plan.staging)}" +
                         "".join(f" + {d.device} {human(d.total)} (UMA)"
                                 for d in self.plan.devices if d.uma and d.device != CPU))
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


def default_budgets(devs: Devices, names, margin: float) -> dict[str, int]:
    """Free memory of each named device (virtual: declared), system RAM available, less margin."""
    import psutil
    out = {}
    for name in names:
        if name == CPU:
            avail = psutil.virtual_memory().available
        else:
            avail = devs.get(name).memory()[0]
        out[name] = int(avail * (1.0 - margin))
    return out


def _need(plan: MemoryPlan, runtime: int) -> dict[str, int]:
    need = {d.device: d.total for d in plan.devices if d.device != CPU}
    need[CPU] = runtime + plan.system_ram
    return need


def _size_text(n: int) -> str | int:
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20)):
        if n % scale == 0:
            return f"{n // scale}{unit}"
    return n


def fit(model=None, budgets: dict | None = None, *, config=None, devices=(),
        gpu_device: str | None = None, min_ctx: int | None = None, max_ctx: int | None = None,
        n_ubatch: int | None = None, n_batch: int | None = None, type_k: str | None = None,
        type_v: str | None = None, flash_attn: bool = True, logits_all: bool = False,
        swa_full: bool = False, runtime: int | str | None = None, margin: float = 0.05,
        prefer: str = "gpu_layers", max_gpu_layers: int | None = None) -> FitResult:
    """See the module docstring. config: a base offload config (path, Config or dict: its rules,
    KV placement, devices and sizes are kept; gpu_layers and context.n_ctx are what is searched).
    budgets: {device: bytes or '6GiB'}; missing devices get default_budgets. runtime: system RAM
    the runtime needs besides its buffers (default: pyggml.planning.measure.runtime_overhead_estimate)."""
    from pyggml.planning.memory import load_run_config, virtual_devices_of
    if prefer not in ("gpu_layers", "ctx"):
        raise ConfigError(f"prefer must be 'gpu_layers' or 'ctx', got {prefer!r}")
    pm = model if isinstance(model, PlanningModel) else PlanningModel(model)
    devs = devices if isinstance(devices, Devices) else Devices(list(devices))
    try:
        hp = pm.hparams
        base = load_run_config(config if config is not None else {})
        devs.add_virtual(virtual_devices_of(base))
        declared = [d for d in base.get(("devices",)) or [] if str(d).lower() != "cpu"]
        gpu = gpu_device or (str(declared[0]) if declared else None) or devs.first_gpu()
        if gpu is not None:
            gpu = devs.get(gpu).name
        # the base config's values stay; what the search sets is marked as the advisor's
        values: dict = {"context": {}}
        for key, v in (("n_ubatch", n_ubatch), ("n_batch", n_batch)):
            if v is not None:
                values["context"][key] = v
        kv = {k: v for k, v in (("type_k", type_k), ("type_v", type_v)) if v is not None}
        if kv:
            values["kv"] = kv
        cli_virtual = [v for v in devs.virtual.values()
                       if v.name not in {x.name for x in virtual_devices_of(base)}]
        if cli_virtual and (gpu in {v.name for v in cli_virtual}):
            values["virtual_devices"] = (
                list(base.get(("virtual_devices",)) or []) +
                [{"name": v.name, "memory": _size_text(v.total), "kind": v.kind}
                 for v in cli_virtual])
        names = ([gpu] if gpu else []) + [CPU]
        given = {devs.get(k).name if k.upper() != CPU else CPU: parse_size(v)
                 for k, v in (budgets or {}).items()}
        budget = default_budgets(devs, [n for n in names if n not in given], margin)
        budget.update(given)
        if runtime is None:
            from pyggml.planning.measure import runtime_overhead_estimate
            runtime = runtime_overhead_estimate(pm.facts())
        runtime = parse_size(runtime)
        top = hp.n_layer + 1 if gpu else 0
        if max_gpu_layers is not None:
            top = min(top, max_gpu_layers)
        hi_ctx = max_ctx or hp.n_ctx_train
        lo_ctx = min(min_ctx or min(4096, hp.n_ctx_train), hi_ctx)
        checks: list[Check] = []
        found: dict[tuple[int, int], tuple[MemoryPlan, object]] = {}

        def candidate(ngl: int, n_ctx: int):
            v = {k: (dict(x) if isinstance(x, dict) else x) for k, x in values.items()}
            v["context"] = dict(values["context"], n_ctx=n_ctx)
            v["gpu_layers"] = ngl
            if not declared or gpu_device:
                v["devices"] = [gpu] if ngl and gpu else ["cpu"]
            return base.with_values(v, "pyggml mem --fit")

        def check(ngl: int, n_ctx: int) -> Check:
            for c in checks:
                if (c.n_gpu_layers, c.n_ctx) == (ngl, n_ctx):
                    return c
            cfg = candidate(ngl, n_ctx)
            plan = plan_memory(pm, config=cfg, devices=devs, with_no_inplace=False,
                               flash_attn=flash_attn, logits_all=logits_all, swa_full=swa_full)
            need = _need(plan, runtime)
            over = {d: need.get(d, 0) - b for d, b in budget.items() if need.get(d, 0) > b}
            c = Check(ngl, n_ctx, not over, need, over)
            checks.append(c)
            found[ngl, n_ctx] = (plan, cfg)
            return c

        def largest_ctx(ngl: int, lo: int) -> int | None:
            """The largest fitting n_ctx in [lo, hi_ctx] (steps of 256), None if lo fails."""
            if not check(ngl, lo).fits:
                return None
            if check(ngl, hi_ctx).fits:
                return hi_ctx
            good, bad = lo, hi_ctx            # fits at good, not at bad
            while True:
                mid = (good + bad) // 2 // CTX_STEP * CTX_STEP
                if mid <= good:
                    mid = good + CTX_STEP
                if mid >= bad:
                    return good
                if check(ngl, mid).fits:
                    good = mid
                else:
                    bad = mid

        best: tuple[int, int] | None = None
        if prefer == "gpu_layers":
            for ngl in range(top, -1, -1):
                n = largest_ctx(ngl, lo_ctx)
                if n is not None:
                    best = (ngl, n)
                    break
        else:
            for ngl in range(top, -1, -1):
                n = largest_ctx(ngl, lo_ctx if best is None else
                                min(hi_ctx, best[1] + CTX_STEP))
                if n is not None and (best is None or n > best[1]):
                    best = (ngl, n)
        notes = []
        if best is None:             # not even min_ctx on the CPU: the largest context at all
            n = largest_ctx(0, CTX_STEP) if lo_ctx > CTX_STEP else None
            if n is not None:
                best = (0, n)
                notes.append(f"n_ctx {lo_ctx} does not fit anywhere; {n} does (CPU only)")
        if best is None:
            c = check(0, min(lo_ctx, CTX_STEP))
            notes.append("even n_ctx 256 on the CPU is over budget by " +
                         ", ".join(f"{d} {human(o)}" for d, o in c.over.items()))
            plan, cfg = found[0, c.n_ctx]
            return FitResult(pm.path, False, 0, 0, gpu, budget, runtime, plan, cfg, checks,
                             notes)
        ngl, n_ctx = best
        plan, cfg = found[best]
        for d in plan.devices:
            if d.uma and d.device != CPU and d.total:
                notes.append(f"{d.device} shares system RAM ({d.uma}): its {human(d.total)} "
                             f"are counted against the system RAM budget too")
        if ngl < top:
            nxt = [c for c in checks if c.n_gpu_layers == ngl + 1 and not c.fits]
            if nxt:
                notes.append(f"gpu_layers {ngl + 1} does not fit at n_ctx {nxt[0].n_ctx}: over "
                             "by " + ", ".join(f"{d} {human(o)}" for d, o in nxt[0].over.items()))
        return FitResult(pm.path, True, ngl, n_ctx, gpu if ngl else None, budget, runtime, plan,
                         cfg, checks, notes)
    finally:
        if not isinstance(devices, Devices):
            devs.close()
        if pm is not model:
            pm.close()


def budgets_arg(items) -> dict[str, str]:
    """['Vulkan0=6GiB', 'CPU=8GiB'] -> {'Vulkan0': '6GiB', 'CPU': '8GiB'}."""
    out = {}
    for it in items or []:
        name, _, size = it.partition("=")
        if not name or not size:
            raise ConfigError(f"--budget {it!r}: expected DEVICE=SIZE, e.g. Vulkan0=6GiB")
        out[name] = size
    return out

