"""OLMo 2 and OLMoE: an RMS norm of the whole q and k rows (attn_q_norm [H·D], attn_k_norm
[Hkv·D]) before splitting into heads, NEOX rope.

- olmo2: no norm before attention or FFN; a norm after each (post_attention_norm,
  post_ffw_norm) instead, then the residual add. An untied output matrix.
- olmoe: pre-norm blocks (attn_norm, ffn_norm) with experts: softmax gating, the k selected
  weights used as they are (not renormalized).
"""

from __future__ import annotations

from pyggml import ops
from pyggml.errors import ModelError
from pyggml.llm.archs.common import Arch, attn_shapes, ffn_shapes


def _read_olmo2(model, hp) -> None:
    if model.get_u32(model.arch_key("attention.sliding_window"), 0):
        raise ModelError(f"{hp.arch}: sliding-window attention (OLMo 3) is not supported")


def _read_olmoe(model, hp) -> None:
    hp.expert_norm_w = False
    hp.n_ff_exp = hp.n_ff[0]              # the experts are feed_forward_length wide


def _qk_norm_shapes(hp, il):
    return {"attn_q_norm": [hp.n_head[il] * hp.head_dim_k],
            "attn_k_norm": [hp.n_head_kv[il] * hp.head_dim_k]}


def _tensors_olmo2(hp, il):
    E = hp.n_embd
    t = {**attn_shapes(hp, il), **ffn_shapes(hp, il), **_qk_norm_shapes(hp, il),
         "post_attention_norm": [E], "post_ffw_norm": [E]}
    del t["attn_norm"], t["ffn_norm"]
    return t


def _tensors_olmoe(hp, il):
    return {**attn_shapes(hp, il), **ffn_shapes(hp, il), **_qk_norm_shapes(hp, il)}


def _attention(b, il, cur):
    ctx, hp, T = b.ctx, b.hp, b.T
    D, H, Hkv = hp.head_dim_k, hp.n_head[il], hp.n_head_kv[il]
    q, k, v = b.qkv(il, cur, heads=False)
    q = b.norm(q, b.w(il, "attn_q_norm"), f"q_norm-{il}")
    k = b.norm(k, b.w(il, "attn_k_norm"), f"k_norm-{il}")
    q = b.rope(il, ops.reshape_3d(ctx, q, D, H, T), f"q_rope-{il}", factors=False)
    k = b.rope(il, ops.reshape_3d(ctx, k, D, Hkv, T), f"k_rope-{il}", factors=False)
    return b.attn_out(il, b.attention(il, q, k, v, hp.attn_scale))


def build_olmo2(b, il, x):
    ctx = b.ctx
    cur = _attention(b, il, x)
    cur, x = b.last_rows(il, cur, x)
    cur = b.norm(cur, b.w(il, "post_attention_norm"), f"attn_post_norm-{il}")
    x = ops.add(ctx, cur, x, name=f"ffn_inp-{il}")
    cur = b.norm(b.ffn(il, x), b.w(il, "post_ffw_norm"), f"ffn_post_norm-{il}")
    return ops.add(ctx, cur, x, name=f"l_out-{il}")


def build_olmoe(b, il, x):
    ctx = b.ctx
    cur = _attention(b, il, b.norm(x, b.w(il, "attn_norm"), f"attn_norm-{il}"))
    cur, x = b.last_rows(il, cur, x)
    x = ops.add(ctx, cur, x, name=f"ffn_inp-{il}")
    cur = b.moe(il, b.norm(x, b.w(il, "ffn_norm"), f"ffn_norm-{il}"))
    return ops.add(ctx, cur, x, name=f"l_out-{il}")


ARCHS = (
    Arch(name="olmo2", rope_neox=True, read_hparams=_read_olmo2,
         layer_tensors=_tensors_olmo2, build_layer=build_olmo2, output_required=True),
    Arch(name="olmoe", rope_neox=True, read_hparams=_read_olmoe,
         layer_tensors=_tensors_olmoe, build_layer=build_olmoe,
         output_required=True, moe=True, moe_only=True),
)
