"""Phi-3: one fused projection attn_qkv (rows q | k | v), NEOX rope with LongRoPE factors
(rope_factors_long when the context exceeds rope.scaling.original_context_length, else
rope_factors_short; rope.scaling.attn_factor scales the rotated values), q · 1/sqrt(D) before
attention, and a fused gate|up FFN: ffn_up [E, 2F] → silu(first F rows) · (last F rows).
Its sliding_window key is ignored, as llama.cpp does."""

from __future__ import annotations

from pyggml import ops
from pyggml.llm.archs.common import Arch, attn_shapes


def _read(model, hp) -> None:
    pass


def layer_tensors(hp, il):
    E, F = hp.n_embd, hp.n_ff[il]
    return {**attn_shapes(hp, il, fused_qkv=True), "ffn_norm": [E],
            "ffn_up": [E, 2 * F], "ffn_down": [F, E]}


def build_layer(b, il, x):
    ctx, hp = b.ctx, b.hp
    cur = b.norm(x, b.w(il, "attn_norm"), f"attn_norm-{il}")
    q, k, v = b.qkv(il, cur)
    q = b.rope(il, q, f"q_rope-{il}")
    k = b.rope(il, k, f"k_rope-{il}")
    q = ops.scale(ctx, q, hp.attn_scale, name=f"q_scaled-{il}")
    cur = b.attn_out(il, b.attention(il, q, k, v, 1.0))
    cur, x = b.last_rows(il, cur, x)
    x = ops.add(ctx, cur, x, name=f"ffn_inp-{il}")
    cur = b.norm(x, b.w(il, "ffn_norm"), f"ffn_norm-{il}")
    F = hp.n_ff[il]
    up = b.mm(b.w(il, "ffn_up"), cur, name=f"ffn_up-{il}")     # [2F, rows]
    n = up.ne[1]                  # T, or n_out after the last layer's row selection
    gate = ops.cont(ctx, ops.view_2d(ctx, up, F, n, up.nb[1], 0))
    up2 = ops.cont(ctx, ops.view_2d(ctx, up, F, n, up.nb[1], F * up.nb[0]))
    cur = b.mm(b.w(il, "ffn_down"), ops.mul(ctx, ops.silu(ctx, gate), up2),
               name=f"ffn_out-{il}")
    return ops.add(ctx, x, cur, name=f"l_out-{il}")


ARCHS = (
    Arch(name="phi3", rope_neox=True, read_hparams=_read,
         layer_tensors=layer_tensors, build_layer=build_layer),
)
