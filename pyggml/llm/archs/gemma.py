"""Gemma 2 and Gemma 3: embeddings · sqrt(E), GeGLU FFN, an RMS norm after attention and after
the FFN as well as before, q scaled before attention (1/sqrt(D); 1/sqrt(E/H) for the largest
model), alternating sliding-window layers (Gemma 2: every other layer, Gemma 3: 5 of 6), NEOX
rope.

- gemma2: attention scores soft-capped (attn_logit_softcapping, default 50) and the logits
  (final_logit_softcapping, default 30): cap·tanh(s/cap).
- gemma3: a per-head RMS norm of q and k (attn_q_norm, attn_k_norm [D]) before rope; the
  sliding-window layers use their own rope base (rope.freq_base_swa) and no frequency scaling.
"""

from __future__ import annotations

import math

from pyggml import ops
from pyggml.llm.archs.common import Arch, attn_shapes, ffn_shapes, swa_pattern


def _read_gemma3(model, hp) -> None:
    k, L, E = model.arch_key, hp.n_layer, hp.n_embd
    hp.sliding_window = model.get_u32(k("attention.sliding_window"), 0)
    if hp.sliding_window > 0:
        hp.swa_layers = swa_pattern(model, k("attention.sliding_window_pattern"), L, 6)
    hp.rope_freq_scale_swa = 1.0
    hp.embd_scale = math.sqrt(float(E))
    # 27B decides by layer count (llama.cpp): 1/sqrt(E/H); otherwise 1/sqrt(D)
    hp.attn_scale = (1.0 / math.sqrt(E / hp.n_head[0]) if L == 62 else
                     1.0 / math.sqrt(hp.head_dim_k))


def _read_gemma2(model, hp) -> None:
    k, L, E = model.arch_key, hp.n_layer, hp.n_embd
    hp.sliding_window = model.get_u32(k("attention.sliding_window"), 4096)
    hp.swa_layers = swa_pattern(model, k("attention.sliding_window_pattern"), L, 2)
    hp.rope_base_swa = model.get_f32(k("rope.freq_base_swa"), hp.rope_base)
    hp.rope_freq_scale_swa = hp.rope_freq_scale
    hp.attn_softcap = model.get_f32(k("attn_logit_softcapping"), 50.0)
    hp.final_softcap = model.get_f32(k("final_logit_softcapping"), 30.0)
    hp.embd_scale = math.sqrt(float(E))
    # 27B (46 layers, llama.cpp): 1/sqrt(E/H); otherwise 1/sqrt(D)
    hp.attn_scale = (1.0 / math.sqrt(E / hp.n_head[0]) if L == 46 else
                     1.0 / math.sqrt(hp.head_dim_k))
    hp.tied_output = True        # llama.cpp's gemma2 always uses token_embd as the output


def _tensors_gemma2(hp, il):
    E = hp.n_embd
    return {**attn_shapes(hp, il), "post_attention_norm": [E], **ffn_shapes(hp, il),
            "post_ffw_norm": [E]}


def _tensors_gemma3(hp, il):
    D = hp.head_dim_k
    return {**_tensors_gemma2(hp, il), "attn_q_norm": [D], "attn_k_norm": [D]}


def build_layer(b, il, x):
    ctx, hp = b.ctx, b.hp
    gemma3 = hp.arch == "gemma3"
    cur = b.norm(x, b.w(il, "attn_norm"), f"attn_norm-{il}")
    q, k, v = b.qkv(il, cur)
    if gemma3:
        q = b.norm(q, b.w(il, "attn_q_norm"), f"q_norm-{il}")
        k = b.norm(k, b.w(il, "attn_k_norm"), f"k_norm-{il}")
    q = b.rope(il, q, f"q_rope-{il}")
    k = b.rope(il, k, f"k_rope-{il}")
    q = ops.scale(ctx, q, hp.attn_scale, name=f"q_scaled-{il}")
    cur = b.attn_out(il, b.attention(il, q, k, v, 1.0, softcap=hp.attn_softcap))
    cur = b.norm(cur, b.w(il, "post_attention_norm"), f"attn_post_norm-{il}")
    cur, x = b.last_rows(il, cur, x)
    x = ops.add(ctx, x, cur, name=f"ffn_inp-{il}")
    cur = b.norm(x, b.w(il, "ffn_norm"), f"ffn_norm-{il}")
    cur = b.ffn(il, cur, act="gelu")
    cur = b.norm(cur, b.w(il, "post_ffw_norm"), f"ffn_post_norm-{il}")
    if il == hp.n_layer - 1:
        return ops.add(ctx, cur, x, name=f"l_out-{il}")     # see llama.build_layer
    return ops.add(ctx, x, cur, name=f"l_out-{il}")


ARCHS = (
    Arch(name="gemma2", rope_neox=True, read_hparams=_read_gemma2,
         layer_tensors=_tensors_gemma2, build_layer=build_layer),
    Arch(name="gemma3", rope_neox=True, read_hparams=_read_gemma3,
         layer_tensors=_tensors_gemma3, build_layer=build_layer),
)
