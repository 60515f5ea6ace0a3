"""Rule resolution: an offload config applied to a model's tensors on a catalog's devices gives
an `OffloadPlan` (pyggml.offload.plan) and the RunOptions fields the config sets.

The config comes from a YAML file (pyggml.offload.config) or from llama.cpp's flags, translated
into the same config first (pyggml.offload.flags), so both give the same plan. Every placement
records the rule that decided it, so `pyggml plan` can say why a tensor lives where it does.

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
(`pin_phase_ops`, pyggml.offload.pinning), the weights being copied per batch, like op offload.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from pyggml.backend.catalog import CPU, GPU_NAME, DeviceCatalog
from pyggml.errors import ConfigError
from pyggml.offload.config import (
    PHASES,
    Config,
    Where,
    _did_you_mean,
    _fmt_range,
    format_layers,
    key_path,
    load_config,
    parse_layers,
)
from pyggml.offload.devices import with_config_devices
from pyggml.offload.saferegex import SafeRegex
from pyggml.offload.plan import (OffloadPlan, Placement, RuleReport, default_slot, layer_of,
                                 tensor_kind)


# ---- rules -------------------------------------------------------------------------------------

@dataclass
class _Rule:
    index: int
    where: Where
    label: str
    regex: SafeRegex | None
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
    """Config + model tensor names + devices -> OffloadPlan and the RunOptions fields set."""

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

    def resolve(self) -> tuple[OffloadPlan, dict]:
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
                    if GPU_NAME.match(ref.strip()):
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
                SafeRegex(r["match"]) if "match" in r else None,
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
            slot = default_slot(name)
            if kind == "embd":
                weights[name] = Placement(CPU, "token embeddings stay on the CPU")
            elif slot is not None:
                dev = layer_dev[slot] if slot < L else CPU
                weights[name] = Placement(dev, self._slot_label(slot) if slot < L
                                          else "default: CPU")
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

    def _settings(self) -> dict:
        """The RunOptions fields the config sets (context sizes, threads, per-layer KV types);
        a field it leaves unset is absent, so the caller's value stays."""
        cfg, L = self.cfg, self.n_layer
        ctx = cfg.get(("context",)) or {}
        s = {k: ctx.get(k) for k in ("n_ctx", "n_batch", "n_ubatch", "n_seq_max")}
        th = cfg.get(("threads",))
        if isinstance(th, int):
            s["n_threads"] = s["n_threads_batch"] = th
        elif isinstance(th, dict):
            s["n_threads"], s["n_threads_batch"] = th.get("decode"), th.get("batch")
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
            s["type_k"], s["type_v"] = tuple(tk), tuple(tv)
        return {k: v for k, v in s.items() if v is not None}

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


def resolve(cfg: Config, tensor_names, n_layer: int, tied_output: bool,
            catalog: DeviceCatalog) -> tuple[OffloadPlan, dict]:
    """A Config applied to a model's tensors (names, or a name -> TensorInfo mapping) on the
    catalog's devices as they are: (the plan, the RunOptions fields the config sets, also kept
    as plan.settings). ConfigError lists every problem found, each with where it was set."""
    plan, settings = _Resolver(cfg, tensor_names, n_layer, tied_output, catalog).resolve()
    plan.settings = settings
    return plan, settings


def plan_from_config(config, tensor_names, n_layer: int, tied_output: bool, *,
                     catalog: DeviceCatalog | None = None,
                     sets=()) -> tuple[OffloadPlan, dict]:
    """An offload config (a path, a Config or a dict, amended by `sets`) resolved on `catalog`
    (default: this machine's devices) plus the rpc-servers and virtual devices it brings."""
    cfg = load_config(config, sets)
    if catalog is None:
        catalog = DeviceCatalog.from_registry()
    return resolve(cfg, tensor_names, n_layer, tied_output, with_config_devices(catalog, cfg))
