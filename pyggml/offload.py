"""Offload plans: which device holds each weight and each layer's KV cache, and why.

An `OffloadPlan` is what the model runtime consumes. It is made from llama.cpp-style arguments
(`plan_from_args`: -ngl, -ot, --no-kv-offload, --no-op-offload) or, with the YAML config work,
from a config file; every placement records the rule that decided it, so `pyggml plan` can say
why a tensor lives where it does.

Layer numbering and `-ngl N`: the first N transformer layers go to the first GPU device; with N
greater than n_layer (llama.cpp counts the output as one more layer; 99 means all), the output layer too (output norm and output matrix; a tied output matrix is
duplicated there, as llama.cpp does). Token embeddings always stay on the CPU (get_rows of a few
rows is not worth a device copy).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from pyggml.errors import ConfigError

CPU = "CPU"
_LAYER_RE = re.compile(r"^blk\.(\d+)\.")


@dataclass(frozen=True)
class Placement:
    """device: a Registry device name ("CPU", "Vulkan0", ...); rule: what decided it."""
    device: str
    rule: str


@dataclass
class OffloadPlan:
    """devices: device names in priority order, CPU last. weights: tensor name -> Placement
    ("output.weight" appears even for tied models when the output goes to another device than
    token_embd). kv: per layer. op_offload: per phase ("prefill", "decode"): whether the
    scheduler may move a large op to a higher-priority device although its weight is in host
    memory. n_copies: pipeline copies of split inputs."""
    devices: list[str]
    weights: dict[str, Placement]
    kv: list[Placement]
    op_offload: dict[str, bool] = field(default_factory=lambda: {"prefill": True, "decode": True})
    n_copies: int = 1

    def weight_device(self, name: str) -> str:
        p = self.weights.get(name)
        return p.device if p else CPU

    def devices_used(self) -> list[str]:
        used = {p.device for p in self.weights.values()} | {p.device for p in self.kv}
        return [d for d in self.devices if d in used or d == CPU]


def layer_of(name: str) -> int | None:
    """The transformer layer index of a tensor name (blk.N.*), None for global tensors."""
    m = _LAYER_RE.match(name)
    return int(m.group(1)) if m else None


def plan_from_args(tensor_names, n_layer: int, tied_output: bool, n_gpu_layers: int = 0,
                   gpu_device: str | None = None, overrides=(), kv_offload: bool = True,
                   op_offload: bool = True) -> OffloadPlan:
    """llama.cpp's flags as a plan. overrides: [(regex, device)] (-ot), first match wins, applied
    before -ngl. gpu_device: the device -ngl puts layers on (None: no GPU, everything on CPU)."""
    if n_gpu_layers < 0:
        raise ConfigError(f"-ngl must be >= 0, got {n_gpu_layers}")
    if n_gpu_layers > 0 and gpu_device is None:
        raise ConfigError("-ngl > 0 needs a GPU device, and none was found "
                          "(pyggml info lists the devices)")
    rules = []
    for i, (pattern, device) in enumerate(overrides):
        try:
            rules.append((re.compile(pattern), device, f"-ot[{i}] '{pattern}'={device}"))
        except re.error as e:
            raise ConfigError(f"-ot {pattern}={device}: invalid regex: {e}") from None
    names = list(tensor_names)
    if tied_output and n_gpu_layers > n_layer and "output.weight" not in names:
        names.append("output.weight")
    weights = {}
    for name in names:
        hit = next(((dev, why) for rx, dev, why in rules if rx.search(name)), None)
        if hit:
            weights[name] = Placement(hit[0], hit[1])
            continue
        il = layer_of(name)
        on_gpu = gpu_device is not None and (
            (il is not None and il < n_gpu_layers) or
            (il is None and name.startswith("output") and n_gpu_layers > n_layer))
        weights[name] = (Placement(gpu_device, f"-ngl {n_gpu_layers}") if on_gpu
                         else Placement(CPU, "default (CPU)"))
    kv = [Placement(gpu_device, f"-ngl {n_gpu_layers}") if
          (gpu_device and kv_offload and il < n_gpu_layers)
          else Placement(CPU, "--no-kv-offload" if not kv_offload else "default (CPU)")
          for il in range(n_layer)]
    devices = ([gpu_device] if gpu_device else []) + [d for d, _ in overrides
                                                      if d not in (gpu_device, CPU)]
    devices = list(dict.fromkeys(devices)) + [CPU]
    return OffloadPlan(devices, weights, kv,
                       {"prefill": op_offload, "decode": op_offload})
