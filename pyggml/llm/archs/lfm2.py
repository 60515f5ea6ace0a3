"""LFM2 (Liquid): a hybrid of attention layers (Qwen 3's: RMS-normed q/k heads, NEOX rope) and
short-convolution layers, every layer followed by a SwiGLU FFN; the layers with
attention.head_count_kv 0 are the convolutions (llama.cpp's src/models/lfm2.cpp).

Short-convolution block of cur [E, T]: in_proj → b, c, x [E, T] each (rows b | c | x);
y = c · conv(b · x) with a causal convolution of kernel size K = shortconv.l_cache over time,
per channel (shortconv.conv [K, E]), continuing each sequence's state (its K-1 last b·x, see
pyggml/llm/recurrent.py); out_proj. The final norm is `token_embd_norm` (the converter's name).
"""

from __future__ import annotations

from pyggml import ops
from pyggml.errors import ModelError
from pyggml.llm.archs.common import Arch, attn_shapes, ffn_shapes


def _read(model, hp) -> None:
    k = model.arch_key
    hp.ssm_conv_kernel = model.get_u32(k("shortconv.l_cache"))
    if hp.ssm_conv_kernel < 2:
        raise ModelError(f"{k('shortconv.l_cache')} must be >= 2, got {hp.ssm_conv_kernel}")
    hp.ssm_conv_channels = hp.n_embd
    hp.recurrent_layers = [n == 0 for n in hp.n_head_kv]
    if model.get_u32(k("attention.sliding_window"), 0):
        raise ModelError(f"{k('attention.sliding_window')}: LFM2 with sliding-window attention "
                         f"is not supported yet")


def layer_tensors(hp, il):
    E, D = hp.n_embd, hp.head_dim_k
    if hp.recurrent_layers[il]:
        return {"attn_norm": [E], "shortconv.conv": [hp.ssm_conv_kernel, E],
                "shortconv.in_proj": [E, 3 * E], "shortconv.out_proj": [E, E],
                **ffn_shapes(hp, il)}
    return {**attn_shapes(hp, il), "attn_q_norm": [D], "attn_k_norm": [D], **ffn_shapes(hp, il)}


def conv_state(b, il, x, kernel, name):
    """The causal convolution of x [C, T] (contiguous) with kernel [K, C], continuing the
    state of each token's sequence; the new states are stored (expanded now). Returns [C, T]."""
    ctx, kv = b.ctx, b.kv
    C, T = x.ne[0], x.ne[1]
    cache = kv.k[il]
    st = ops.get_rows(ctx, cache, b.inp.rs_ids, name=f"conv_state-{il}")
    out = ops.ssm_conv(ctx, x, kernel, st, b.inp.rs_seq, name=f"{name}-{il}")
    y, new = ops.ssm_split(ctx, out, [C, T], cache.ne[0])
    b.g.build_forward_expand(ops.set_rows(ctx, cache, new, b.inp.rs_ids,
                                          name=f"conv_state_store-{il}"))
    return y


def _shortconv(b, il, cur):
    ctx, E = b.ctx, b.hp.n_embd
    bcx = ops.mul_mat(ctx, b.w(il, "shortconv.in_proj"), cur, name=f"conv_in-{il}")   # [3E, T]
    T = bcx.ne[1]
    part = [ops.view_2d(ctx, bcx, E, T, bcx.nb[1], i * E * 4) for i in range(3)]
    bx = ops.mul(ctx, part[0], part[2], name=f"conv_bx-{il}")
    y = conv_state(b, il, bx, b.w(il, "shortconv.conv"), "conv")
    y = ops.mul(ctx, part[1], y, name=f"conv_y-{il}")
    return ops.mul_mat(ctx, b.w(il, "shortconv.out_proj"), y, name=f"conv_out-{il}")


def _attn(b, il, cur):
    hp = b.hp
    q, k, v = b.qkv(il, cur)
    q = b.rope(il, b.norm(q, b.w(il, "attn_q_norm"), f"q_norm-{il}"), f"q_rope-{il}",
               factors=False)
    k = b.rope(il, b.norm(k, b.w(il, "attn_k_norm"), f"k_norm-{il}"), f"k_rope-{il}",
               factors=False)
    return b.attn_out(il, b.attention(il, q, k, v, hp.attn_scale))


def build_layer(b, il, x):
    ctx = b.ctx
    cur = b.norm(x, b.w(il, "attn_norm"), f"attn_norm-{il}")
    cur = _shortconv(b, il, cur) if b.hp.recurrent_layers[il] else _attn(b, il, cur)
    cur, x = b.last_rows(il, cur, x)
    x = ops.add(ctx, x, cur, name=f"ffn_inp-{il}")
    cur = b.ffn(il, b.norm(x, b.w(il, "ffn_norm"), f"ffn_norm-{il}"))
    return ops.add(ctx, x, cur, name=f"l_out-{il}")


ARCHS = (
    Arch(name="lfm2", rope_neox=True, read_hparams=_read, layer_tensors=layer_tensors,
         build_layer=build_layer, output_norm="token_embd_norm"),
)
