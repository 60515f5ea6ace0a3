"""`pyggml plan`: an offload plan worked out without running anything (a dry run).

    report = dry_run("model.gguf", "configs/kv-on-cpu.yaml")
    print(format_report(report))              # tensors, rules, memory per device, warnings
    report.device("Vulkan0").compute          # bytes of compute buffer the scheduler reserves

The plan is pyggml.planning.memory's RunPlan (the runtime's own set-up in planning mode: only the
GGUF's tensor table is read, no weight byte is touched, no device memory allocated); this module
renders its placement: tensors per device and the rule that put them there, the KV cache, the
phase rules, memory per device against free memory, and the equivalent llama.cpp flags.

Devices this machine lacks can be planned for (`--virtual-device Vulkan1=8GiB`, old spelling
`--assume-device`): a planning-only device with the declared memory and the Vulkan backend's op
rules; a device that exists can be given another memory size the same way. `check_fit`
(pyggml.planning.fit.suggest_changes) compares each device's planned bytes with its free memory
and, where something does not fit, tries the smallest changes.
"""

from __future__ import annotations

import os

from pyggml.backend.catalog import CPU
from pyggml.offload.flags import shell_join
from pyggml.offload.plan import layer_of
from pyggml.offload.config import Config, format_layers
from pyggml.planning.memory import Planner, RunPlan, kv_type_names
from pyggml.units import fmt_bytes


def dry_run(model_path=None, config=None, *, sets=(), virtual=(), check_fit: bool = False,
            **flags) -> RunPlan:
    """Plan `config` (a path, a Config, or None) amended by llama.cpp flags (n_gpu_layers,
    overrides, kv_offload, op_offload, n_ctx, ...) and --set items, for a model, without
    touching weight bytes or allocating device memory. flags: Planner.plan's keywords."""
    from pyggml.planning.fit import suggest_changes
    with Planner(model_path, virtual=virtual) as planner:
        report = planner.plan(config, sets=sets, **flags)
        if check_fit:
            report.fit_changes = suggest_changes(planner, report)
        return report


# ---- the report --------------------------------------------------------------------------------

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


def format_report(r: RunPlan, per_tensor: bool = False) -> str:
    plan, s = r.offload, r.opts
    n_layer = r.facts["n_layer"]
    types_k = kv_type_names(s.type_k, n_layer)
    types_v = kv_type_names(s.type_v, n_layer)
    totals = {d.device: d for d in r.devices}
    L = []
    total = sum(r.tensor_bytes.values())
    L.append(f"model:   {r.model} ({r.facts['arch']}, {n_layer} layers, {len(r.tensor_bytes)} weight "
             f"tensors, {fmt_bytes(total)} as placed)")
    files = r.config.files or [r.config.source]
    L.append(f"config:  {' <- '.join(files)}")
    devs = []
    for d in plan.devices:
        t = totals.get(d)
        extra = ("" if t is None else " (planning only)" if t.virtual else
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
    kv_bytes = [x.bytes for x in r.kv_layers]
    while i < n_layer:
        j = i
        # a recurrent layer holds its state (pyggml/llm/recurrent.py), not K/V
        kind = (lambda il: ("state f32",) if r.kv_layers[il].recurrent else
                (f"{types_k[il]}/{types_v[il]}",))
        key = (plan.kv[i].device, plan.kv[i].rule, *kind(i))
        while j + 1 < n_layer and (plan.kv[j + 1].device, plan.kv[j + 1].rule,
                                   *kind(j + 1)) == key:
            j += 1
        rows.append([f"layers {format_layers([(i, j)])}", key[0], key[2],
                     fmt_bytes(sum(kv_bytes[i:j + 1])), key[1]])
        i = j + 1
    L += _table(rows, ["layers", "device", "K/V", "bytes", "rule"])
    if r.lookup_device != CPU:
        L.append("")
        L.append(f"token lookup: on {r.lookup_device}, from the tied output matrix's copy there "
                 f"(all of layer 0 is there too: token ids go to it, not embedding rows)")
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
    for d, t in totals.items():
        fit = {None: "", True: "yes", False: "NO"}[t.fits]
        rows.append([d, fmt_bytes(t.weights), fmt_bytes(t.kv), fmt_bytes(t.compute),
                     fmt_bytes(t.total), fmt_bytes(t.free), fit])
    L += _table(rows, ["device", "weights", "KV cache", "compute", "total", "free", "fits"])
    L += _experts_lines(r)
    L += lora_lines(r)
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




def _experts_lines(r: RunPlan) -> list[str]:
    """Where a mixture-of-experts model's expert weights live and what decoding reads."""
    if not r.expert_bytes:
        return []
    where = ", ".join(f"{fmt_bytes(d.experts)} on {d.device}" for d in r.devices if d.experts)
    n, k = r.facts.get("n_expert", 0), r.facts.get("n_expert_used", 0)
    return [f"experts: {fmt_bytes(r.expert_bytes)} of the weights ({where}); a decoded token "
            f"reads {k} of {n} routed experts per layer: {fmt_bytes(r.weight_bytes_per_token)} "
            f"of weights per token (decode speed is about memory bandwidth / that)"]


def lora_lines(r: RunPlan) -> list[str]:
    """The LoRA adapters a plan counts (pyggml plan / pyggml mem)."""
    if not r.loras:
        return []
    each = ", ".join(f"{os.path.basename(p)} {fmt_bytes(n)} at scale {sc:g}"
                     for p, sc, n in r.loras)
    return [f"LoRA adapters: {fmt_bytes(r.lora_bytes)} mapped in system RAM ({each}); the "
            f"compute buffers are planned with every adapter applied"]


def emit_yaml(cfg: Config, argv=None) -> str:
    head = "# an offload config written by `pyggml plan --emit-yaml`"
    if argv:
        head += f"\n# from: pyggml {shell_join(argv)}"
    body = cfg.to_yaml() if cfg.data else "{}\n"
    return f"{head}\n{body}"
