"""Model hyper-parameters read from GGUF metadata, as llama.cpp derives them
(docs/FORMATS.md §1.5, §3.2, §4). The keys every architecture shares are read here; each
architecture's own keys (scales, soft-caps, sliding windows, experts) are read by its module in
pyggml/llm/archs/ (`Arch.read_hparams`)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from pyggml.errors import ModelError


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
    embd_scale: float = 1.0          # Gemma: sqrt(E); Granite: embedding_scale
    attn_scale: float = 1.0          # applied to q (Gemma, Phi-3) / as the softmax scale
    final_softcap: float = 0.0
    tied_output: bool = False
    # rope scaling (llama.cpp's cparams.yarn_*: the values ggml_rope_ext receives)
    rope_scaling: str = "linear"     # none / linear / yarn / longrope (rope.scaling.type)
    n_ctx_orig_yarn: int = 0         # rope.scaling.original_context_length (else n_ctx_train)
    rope_freq_scale_swa: float = 1.0  # freq_scale of sliding-window layers
    rope_ext_factor: float = 0.0     # YaRN extrapolation mix (1 with yarn scaling)
    rope_attn_factor: float = 1.0    # magnitude scale of the rotated values
    rope_beta_fast: float = 32.0
    rope_beta_slow: float = 1.0
    # per-architecture scalars (0: unused)
    attn_softcap: float = 0.0        # Gemma 2: attn_logit_softcapping
    logit_scale: float = 0.0         # Granite: logits / logit_scale
    residual_scale: float = 0.0      # Granite: branch outputs * residual_scale
    n_no_rope_layer_step: int = 0    # SmolLM3: layers il with (il + 1) % step == 0 have no rope
    # Llama 4 / Mistral 3 attention temperature: q · (ln(floor(pos / floor_scale) + 1) · s + 1)
    attn_temp_scale: float = 0.0
    attn_temp_floor_scale: int = 0
    # mixture of experts (n_expert 0: dense FFN)
    n_expert: int = 0
    n_expert_used: int = 0
    n_ff_exp: int = 0                # expert FFN width
    n_ff_shexp: int = 0              # shared-expert FFN width (Granite MoE shared)
    expert_norm_w: bool = False      # renormalize the k selected weights to sum 1
    expert_weights_scale: float = 0.0
    expert_gating: str = "softmax"
    # recurrent layers of hybrid models (pyggml/llm/recurrent.py; empty: none)
    recurrent_layers: list[bool] = field(default_factory=list)   # per layer
    ssm_conv_kernel: int = 0         # K of the causal convolution (LFM2: shortconv.l_cache)
    ssm_conv_channels: int = 0       # C, the convolved channels
    ssm_state_size: int = 0          # F32 elements of a layer's delta-rule state (0: none)
    rope_sections: list[int] = field(default_factory=list)   # multi-section rope (Qwen 3.5)
    # sliding-window layers with their own head sizes / rotated dims (Gemma 4; 0: as the others)
    head_dim_k_swa: int = 0
    head_dim_v_swa: int = 0
    n_rot_swa: int = 0
    # per layer, the layer whose K/V cells it attends (Gemma 4's shared KV: the last layers
    # read an earlier layer's cache and store none); empty: every layer its own
    kv_source: list[int] = field(default_factory=list)
    n_embd_per_layer: int = 0        # Gemma 4's per-layer embeddings (0: none)
    expert_layers: list[bool] = field(default_factory=list)  # per layer: experts? (Gemma 4)
    # Gemma 3n: AltUp's parallel copies of the residual stream (0: none) and the one the layer
    # computes on; LAuReL's rank; per layer, the std multiplier of the Gaussian top-k that
    # sparsifies the FFN gate (None: no sparsity)
    n_altup: int = 0
    i_altup_act: int = 0
    laurel_rank: int = 0
    ffn_sparsity: list[float | None] = field(default_factory=list)

    def layer_is_swa(self, il: int) -> bool:
        return bool(self.swa_layers) and self.swa_layers[il]

    def head_k(self, il: int) -> int:
        """K (and Q) head size of layer il."""
        return self.head_dim_k_swa if self.head_dim_k_swa and self.layer_is_swa(il) \
            else self.head_dim_k

    def head_v(self, il: int) -> int:
        return self.head_dim_v_swa if self.head_dim_v_swa and self.layer_is_swa(il) \
            else self.head_dim_v

    def rot(self, il: int) -> int:
        """Rotated dims of layer il's heads."""
        return self.n_rot_swa if self.n_rot_swa and self.layer_is_swa(il) else self.n_rot

    def kv_layer(self, il: int) -> int:
        """The layer whose cache layer il reads (il itself unless it shares an earlier one's)."""
        return self.kv_source[il] if self.kv_source else il

    def layer_has_rope(self, il: int) -> bool:
        return not self.n_no_rope_layer_step or (il + 1) % self.n_no_rope_layer_step != 0


def read_hparams(model, tensor_names) -> HParams:
    """HParams of a GGUFModel. Raises ModelError for an unknown architecture (naming the known
    ones) and for metadata the architecture cannot run with."""
    from pyggml.llm.archs import get_arch
    arch = model.arch
    spec = get_arch(arch, model.paths[0] if hasattr(model, "paths") else "model")
    k = model.arch_key
    L = model.get_u32(k("block_count"))
    E = model.get_u32(k("embedding_length"))
    n_head = model.get_u32_per_layer(k("attention.head_count"), L)
    n_head_kv = model.get_u32_per_layer(k("attention.head_count_kv"), L, default=None)
    if n_head_kv[0] is None:                 # absent: as many K/V heads as query heads
        n_head_kv = list(n_head)
    n_ff = model.get_u32_per_layer(k("feed_forward_length"), L, default=0)
    if n_head[0] <= 0:
        raise ModelError(f"{k('attention.head_count')} must be > 0")
    hd_k = model.get_u32(k("attention.key_length"), E // n_head[0])
    hd_v = model.get_u32(k("attention.value_length"), hd_k)
    if hd_k <= 0 or hd_v <= 0:
        raise ModelError(f"{k('attention.key_length')}={hd_k} and {k('attention.value_length')}"
                         f"={hd_v}: head sizes must be > 0")
    n_rot = model.get_u32(k("rope.dimension_count"), hd_k)
    n_vocab = model.get_u32(k("vocab_size"), model.array_len("tokenizer.ggml.tokens", 0))
    if "token_embd.weight" in tensor_names:
        n_vocab = model.tensor_info("token_embd.weight").ne[1]
    n_ctx_train = model.get_u32(k("context_length"))
    scale_type = model.get_str(k("rope.scaling.type"), "linear")
    if scale_type not in ("none", "linear", "yarn", "longrope"):
        raise ModelError(f"{k('rope.scaling.type')}: unknown rope scaling {scale_type!r} "
                         f"(known: none, linear, yarn, longrope)")
    factor = (model.get_f32(k("rope.scaling.factor"), 0.0)
              or model.get_f32(k("rope.scale_linear"), 0.0))
    freq_scale = 1.0 / factor if factor and scale_type != "none" else 1.0
    hp = HParams(
        arch=arch, n_layer=L, n_embd=E, n_ff=n_ff, n_head=n_head, n_head_kv=n_head_kv,
        head_dim_k=hd_k, head_dim_v=hd_v, n_rot=n_rot, n_vocab=n_vocab,
        n_ctx_train=n_ctx_train,
        rms_eps=model.get_f32(k("attention.layer_norm_rms_epsilon")),
        rope_base=model.get_f32(k("rope.freq_base"), 10000.0),
        rope_base_swa=model.get_f32(k("rope.freq_base_swa"), 10000.0),
        rope_freq_scale=freq_scale,
        rope_neox=spec.rope_neox,
        sliding_window=0,
        final_softcap=model.get_f32(k("final_logit_softcapping"), 0.0),
        tied_output="output.weight" not in tensor_names,
        rope_scaling=scale_type,
        n_ctx_orig_yarn=model.get_u32(k("rope.scaling.original_context_length"), n_ctx_train),
        rope_attn_factor=model.get_f32(k("rope.scaling.attn_factor"), 1.0),
        rope_beta_fast=model.get_f32(k("rope.scaling.yarn_beta_fast"), 32.0),
        rope_beta_slow=model.get_f32(k("rope.scaling.yarn_beta_slow"), 1.0),
        attn_scale=1.0 / math.sqrt(hd_k),
        n_expert=model.get_u32(k("expert_count"), 0),
        n_expert_used=model.get_u32(k("expert_used_count"), 0),
    )
    if scale_type == "yarn":
        # llama.cpp (llama_context): ext_factor 1; the magnitude factor 0.1·ln(s)+1 that ggml's
        # rope applies is cancelled unless yarn_log_multiplier asks for another mscale
        hp.rope_ext_factor = 1.0
        s = 1.0 / freq_scale
        log_mul = model.get_f32(k("rope.scaling.yarn_log_multiplier"), 0.0)

        def mscale(m):
            return 1.0 if s <= 1.0 else 0.1 * m * math.log(s) + 1.0
        af = mscale(1.0) / mscale(log_mul) if log_mul else mscale(1.0)
        hp.rope_attn_factor *= af / (1.0 + 0.1 * math.log(s))
    if hp.n_expert:
        if not 0 < hp.n_expert_used <= hp.n_expert:
            raise ModelError(f"{k('expert_used_count')} = {hp.n_expert_used} must be in "
                             f"[1, {k('expert_count')} = {hp.n_expert}]")
        hp.n_ff_exp = model.get_u32(k("expert_feed_forward_length"), 0) or n_ff[0]
        hp.n_ff_shexp = model.get_u32(k("expert_shared_feed_forward_length"), 0)
        hp.expert_weights_scale = model.get_f32(k("expert_weights_scale"), 0.0)
    elif hp.n_expert_used:
        raise ModelError(f"{k('expert_used_count')} = {hp.n_expert_used} without experts "
                         f"({k('expert_count')} missing or 0)")
    spec.read_hparams(model, hp)
    if not spec.moe and hp.n_expert:
        raise ModelError(f"{arch}: {k('expert_count')} = {hp.n_expert}, but this architecture "
                         f"has no mixture-of-experts variant here")
    if spec.moe_only and not hp.n_expert:
        raise ModelError(f"{arch}: {k('expert_count')} is required (a mixture-of-experts "
                         f"architecture)")
    return hp
