"""An offload plan: which device holds each weight and each layer's KV cache, where ops run per
phase, and the rule that decided each placement (what `pyggml plan` shows). The runtime consumes
it; pyggml.offload.rules makes it from a config. Also the tensor names plans and rules speak of:
a tensor's layer (`layer_of`) and kind (`tensor_kind`, `is_expert`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from pyggml.backend.catalog import CPU
from pyggml.offload.config import Where

_LAYER_RE = re.compile(r"^blk\.(\d+)\.")


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
    # the RunOptions fields the config sets (n_ctx, n_threads, type_k, ...; plan_from_config)
    settings: dict = field(default_factory=dict)

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


#: global tensors that llama.cpp creates as layer 0's (tn(..., 0) of LLM_TENSOR_LAYER_REPEATING
#: in its tensor infos: placed with layer 0 by default): Gemma 3n's / Gemma 4's projection of
#: the hidden state into the per-layer inputs and its norm
_LAYER0 = ("per_layer_model_proj.", "per_layer_proj_norm.")


def default_slot(name: str) -> int | None:
    """The layer whose device a tensor goes to when no rule decides it: its own (blk.N.*),
    layer 0 for _LAYER0, None for other global tensors."""
    il = layer_of(name)
    if il is None and name.startswith(_LAYER0):
        return 0
    return il


_EXPERTS = re.compile(r"^ffn_\w+_(exps|shexp)\b")


def is_expert(name: str) -> bool:
    """A mixture-of-experts weight: blk.N.ffn_{gate,up,down,gate_up}_exps (the stacked routed
    experts, [ne0, ne1, n_expert]) or ffn_*_shexp (the shared expert), as llama.cpp names them."""
    il = layer_of(name)
    return il is not None and bool(_EXPERTS.match(name.split(".", 2)[2]))


#: global tensors of llama.cpp's output layer (LLM_TENSOR_LAYER_OUTPUT in llama-arch.cpp's
#: tensor infos: placed with the output matrix) besides output*: Gemma 3n's AltUp projections
_OUTPUT_LAYER = ("output", "altup_proj.", "altup_unembd_proj.")


def tensor_kind(name: str) -> str | None:
    """attn, ffn, experts (MoE expert FFN weights: also of kind ffn), norm (in layers), embd,
    output (the output layer's tensors, placed with the output matrix), or None (e.g.
    rope_freqs)."""
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
    if name.startswith(("token_embd", "position_embd", "token_types", "per_layer_token_embd")):
        return "embd"
    if name.startswith(_OUTPUT_LAYER):
        return "output"
    return None
