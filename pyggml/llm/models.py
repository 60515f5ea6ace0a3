"""The model graph of one ubatch, from GGUF metadata only (docs/FORMATS.md §3.5 and §4):
`build_graph` and `check_weights` dispatch on the architecture to its module in
pyggml/llm/archs/ (the shared pieces are in pyggml/llm/archs/common.py).

Shapes (ggml order): T tokens in the ubatch, E = n_embd, D = head size, H / Hkv heads,
n_kv = KV cells read, n_out = rows whose logits are wanted.
"""

from __future__ import annotations

from pyggml.errors import ModelError, UnsupportedTypeError
from pyggml.llm.archs import get_arch
from pyggml.llm.archs.common import (Builder, GraphInputs, GraphParams, graph_size,  # noqa: F401
                                     need_tensor)
from pyggml.types import COMPUTE_TYPES, GGMLType

# The types a model's tensors may have: what the CPU kernels compute (the CPU backend is always
# there to fall back to), less the activation-only formats.
WEIGHT_TYPES = COMPUTE_TYPES - {GGMLType.Q8_1, GGMLType.Q8_K, GGMLType.I32}


def check_weights(hp, weights: dict, path) -> None:
    """Every tensor the graph needs is present with the shape the metadata implies (weights:
    name → Tensor or TensorInfo, anything with .ne and .n_dims)."""
    arch = get_arch(hp.arch, path)
    E = hp.n_embd

    needed = []

    def need(name, ne):
        need_tensor(weights, name, ne, hp.arch, path)
        needed.append(name)

    need("token_embd.weight", [E, hp.n_vocab])
    need(f"{arch.output_norm}.weight", [E])
    if arch.output_required and "output.weight" not in weights:
        raise ModelError(f"{path}: missing tensor 'output.weight' (architecture {hp.arch} has "
                         f"no tied output)")
    if not hp.tied_output:
        need("output.weight", [E, hp.n_vocab])
    for il in range(hp.n_layer):
        shapes = dict(arch.layer_tensors(hp, il))
        # llama.cpp takes a fused attn_qkv in place of attn_q/k/v for every architecture, and
        # separate ones where the converter writes a fused one
        fused = f"blk.{il}.attn_qkv.weight" in weights
        if fused != ("attn_qkv" in shapes):
            D, Dv, H, Hkv = hp.head_k(il), hp.head_v(il), hp.n_head[il], hp.n_head_kv[il]
            for s in ("attn_q", "attn_k", "attn_v", "attn_qkv"):
                shapes.pop(s, None)
            if fused:
                shapes["attn_qkv"] = [E, H * D + Hkv * D + Hkv * Dv]
            else:
                shapes.update({"attn_q": [E, H * D], "attn_k": [E, Hkv * D],
                               "attn_v": [E, Hkv * Dv]})
        for short, ne in shapes.items():
            # 'ssm_dt.bias' names its suffix; 'ssm_a.' a tensor without one (blk.N.ssm_a)
            need(f"blk.{il}.{short.rstrip('.')}" if short.endswith((".", ".bias", ".scale"))
                 else f"blk.{il}.{short}.weight", ne)
    for name, ne in (arch.model_tensors(hp) if arch.model_tensors else {}).items():
        need(name, ne)
    for name in ("rope_freqs.weight", "rope_factors_long.weight", "rope_factors_short.weight"):
        if name in weights:
            need(name, [hp.n_rot // 2])
    check_types(weights, needed, path)


def check_types(weights: dict, names, path) -> None:
    """Every tensor the graph reads has a type the kernels compute, else one UnsupportedTypeError
    naming the first such tensor and its type, how many more there are, and the supported types
    (raised while the file is only mapped: nothing is allocated yet)."""
    bad = [(n, weights[n].type) for n in names
           if GGMLType(int(weights[n].type)) not in WEIGHT_TYPES]
    if not bad:
        return
    name, t = bad[0]
    more = sorted({GGMLType(int(b[1])).name for b in bad[1:]})
    also = f" (and {len(bad) - 1} more tensors: {', '.join(more)})" if len(bad) > 1 else ""
    raise UnsupportedTypeError(
        f"{path}: tensor '{name}' has type {GGMLType(int(t)).name}, which pyggml cannot compute"
        f"{also}; supported types: {', '.join(x.name for x in sorted(WEIGHT_TYPES))}")


def build_graph(hp, weights: dict, kv, gp: GraphParams, flash_attn: bool = True,
                select_outputs: bool = True, embd_lookup=None, lora=None):
    """The graph of one ubatch: (graph, inputs, logits F32 [V, n_out]). select_outputs: pick
    the output rows with inp_out_ids (every graph of a model must agree on it, so that all ubatch
    graphs share one topology and one allocation plan); False only when every row is wanted.
    embd_lookup: the matrix the token lookup reads (default token_embd; see Run.embd_lookup).
    lora: the LoRA adapters applied (pyggml.llm.lora.Loras; None or empty: the plain graph)."""
    return Builder(hp, weights, kv, gp, flash_attn, select_outputs,
                   embd_lookup, lora).build(get_arch(hp.arch))
