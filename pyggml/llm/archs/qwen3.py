"""Qwen 3: the Llama block with NEOX rope and an RMS norm of each head of q and k (attn_q_norm,
attn_k_norm [D]) before rope; qwen3moe: experts instead of the FFN (softmax gating, the k
selected weights renormalized, expert_feed_forward_length wide)."""

from __future__ import annotations

from pyggml import ops
from pyggml.llm.archs.common import Arch, attn_shapes, ffn_shapes


def _read(model, hp) -> None:
    if hp.n_expert:
        hp.expert_norm_w = True
        if not model.get_u32(model.arch_key("expert_feed_forward_length"), 0):
            hp.n_ff_exp = hp.n_ff[0] // hp.n_expert_used


def layer_tensors(hp, il):
    D = hp.head_dim_k
    return {**attn_shapes(hp, il), "attn_q_norm": [D], "attn_k_norm": [D], **ffn_shapes(hp, il)}


def build_layer(b, il, x):
    ctx, hp = b.ctx, b.hp
    cur = b.norm(x, b.w(il, "attn_norm"), f"attn_norm-{il}")
    q, k, v = b.qkv(il, cur)
    q = b.rope(il, b.norm(q, b.w(il, "attn_q_norm"), f"q_norm-{il}"), f"q_rope-{il}",
               factors=False)
    k = b.rope(il, b.norm(k, b.w(il, "attn_k_norm"), f"k_norm-{il}"), f"k_rope-{il}",
               factors=False)
    cur = b.attn_out(il, b.attention(il, q, k, v, hp.attn_scale))
    cur, x = b.last_rows(il, cur, x)
    x = ops.add(ctx, cur, x, name=f"ffn_inp-{il}")
    cur = b.norm(x, b.w(il, "ffn_norm"), f"ffn_norm-{il}")
    cur = b.moe(il, cur) if hp.n_expert else b.ffn(il, cur)
    return ops.add(ctx, cur, x, name=f"l_out-{il}")


ARCHS = (
    Arch(name="qwen3", rope_neox=True, read_hparams=_read,
         layer_tensors=layer_tensors, build_layer=build_layer),
    Arch(name="qwen3moe", rope_neox=True, read_hparams=_read,
         layer_tensors=layer_tensors, build_layer=build_layer, moe=True, moe_only=True),
)
