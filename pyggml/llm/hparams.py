"""Model hyper-parameters read from GGUF metadata, as llama.cpp derives them
(formats-and-models.md §1.5, §3.2, §4)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from pyggml.errors import ModelError

SUPPORTED_ARCHS = ("gemma3", "llama", "qwen2")


@dataclass
class HParams:
    """Shapes: E = n_embd, H = n_head, Hkv = n_head_kv, D = head_dim_k, L = n_layer, F = n_ff."""
    arch: str
    n_layer: int
    n_embd: int
    n_ff: list[int]                  # per layer
    n_head: list[int]                # per layer
    n_head_kv: list[int]             # per layer
    head_dim_k: int
    head_dim_v: int
    n_rot: int
    n_vocab: int
    n_ctx_train: int
    rms_eps: float
    rope_base: float
    rope_base_swa: float
    rope_freq_scale: float
    rope_neox: bool
    sliding_window: int              # 0: no sliding-window layers
    swa_layers: list[bool] = field(default_factory=list)   # per layer: sliding (local)?
    embd_scale: float = 1.0          # Gemma: sqrt(E)
    attn_scale: float = 1.0          # applied to q (Gemma) / as the softmax scale
    final_softcap: float = 0.0
    tied_output: bool = False

    def layer_is_swa(self, il: int) -> bool:
        return bool(self.swa_layers) and self.swa_layers[il]


def read_hparams(model, tensor_names) -> HParams:
    """HParams of a GGUFModel. Raises ModelError for an unknown architecture."""
    arch = model.arch
    if arch not in SUPPORTED_ARCHS:
        raise ModelError(f"{model.paths[0] if hasattr(model, 'paths') else 'model'}: architecture "
                         f"{arch!r} is not supported (supported: {', '.join(SUPPORTED_ARCHS)})")
    k = model.arch_key
    L = model.get_u32(k("block_count"))
    E = model.get_u32(k("embedding_length"))
    n_head = model.get_u32_per_layer(k("attention.head_count"), L)
    n_head_kv = model.get_u32_per_layer(k("attention.head_count_kv"), L, default=n_head)
    n_ff = model.get_u32_per_layer(k("feed_forward_length"), L)
    if n_head[0] <= 0:
        raise ModelError(f"{k('attention.head_count')} must be > 0")
    hd_k = model.get_u32(k("attention.key_length"), E // n_head[0])
    hd_v = model.get_u32(k("attention.value_length"), hd_k)
    if hd_k <= 0 or hd_v <= 0:
        raise ModelError(f"{k('attention.key_length')}={hd_k} and {k('attention.value_length')}"
                         f"={hd_v}: head sizes must be > 0")
    n_rot = model.get_u32(k("rope.dimension_count"), hd_k)
    tokens = model.get_arr("tokenizer.ggml.tokens", None)
    n_vocab = model.get_u32(k("vocab_size"), len(tokens) if tokens is not None else 0)
    if "token_embd.weight" in tensor_names:
        n_vocab = model.tensor_info("token_embd.weight").ne[1]
    scale_type = model.get_str(k("rope.scaling.type"), "linear")
    factor = model.get_f32(k("rope.scaling.factor"), 0.0) or model.get_f32(k("rope.scale_linear"), 0.0)
    freq_scale = 1.0 / factor if factor and scale_type != "none" else 1.0
    hp = HParams(
        arch=arch, n_layer=L, n_embd=E, n_ff=n_ff, n_head=n_head, n_head_kv=n_head_kv,
        head_dim_k=hd_k, head_dim_v=hd_v, n_rot=n_rot, n_vocab=n_vocab,
        n_ctx_train=model.get_u32(k("context_length")),
        rms_eps=model.get_f32(k("attention.layer_norm_rms_epsilon")),
        rope_base=model.get_f32(k("rope.freq_base"), 10000.0),
        rope_base_swa=model.get_f32(k("rope.freq_base_swa"), 10000.0),
        rope_freq_scale=freq_scale,
        rope_neox=arch in ("gemma3", "qwen2"),
        sliding_window=0,
        final_softcap=model.get_f32(k("final_logit_softcapping"), 0.0),
        tied_output="output.weight" not in tensor_names,
    )
    if arch == "gemma3":
        hp.sliding_window = model.get_u32(k("attention.sliding_window"), 0)
        if hp.sliding_window > 0:
            pattern = model.get(k("attention.sliding_window_pattern"), 6)
            if isinstance(pattern, (list, tuple)) or hasattr(pattern, "__len__"):
                hp.swa_layers = [bool(x) for x in list(pattern)][:L]
            else:
                p = int(pattern)
                hp.swa_layers = [(il % p) < (p - 1) for il in range(L)]
        hp.embd_scale = math.sqrt(float(E))
        # 27B decides by layer count (llama.cpp): 1/sqrt(E/H); otherwise 1/sqrt(D)
        hp.attn_scale = 1.0 / math.sqrt(E / n_head[0]) if L == 62 else 1.0 / math.sqrt(hd_k)
    else:
        hp.attn_scale = 1.0 / math.sqrt(hd_k)
        if arch == "llama" and n_rot != hd_k:
            raise ModelError(f"llama: rope.dimension_count {n_rot} must equal the head size {hd_k}")
    return hp
