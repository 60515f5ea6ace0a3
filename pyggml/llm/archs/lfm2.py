"""LFM2 (Liquid): a hybrid of attention layers (Qwen 3's: RMS-normed q/k heads, NEOX rope) and
short-convolution layers, every layer followed by a SwiGLU FFN; the layers with
attention.head_count_kv 0 are the convolutions (llama.cpp's src/models/lfm2.cpp).

Short-convolution block of cur [E, T]: in_proj → b, c, x [E, T] each (rows b | c | x);
y = c · conv(b · x) with a causal convolution of kernel size K = shortconv.l_cache over time,
per channel (shortconv.conv [K, E]), continuing each sequence's state (its K-1 last b·x, see
pyggml/llm/recurrent.py); out_proj. The final norm is `token_embd_norm` (the converter's name).

lfm2moe (LFM2-8B-A1B; llama.cpp's src/models/lfm2moe.cpp): the same layers, the FFN of every
layer from leading_dense_block_count on a mixture of experts — expert_gating_func's gating
(sigmoid in the released models), a per-expert selection bias exp_probs_b.bias [X] added for
choosing only, the k selected weights renormalized.
"""

from __future__ import annotations

from pyggml import ops
from pyggml.errors import ModelError
from pyggml.llm import recurrent as rs
from pyggml.llm.archs.common import Arch, attn_shapes, ffn_shapes
from pyggml.llm.moe import moe_ffn

# llama.cpp's llama_expert_gating_func_type
_GATING = {1: "softmax", 2: "sigmoid", 3: "softmax_weight"}


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


def _read_moe(model, hp) -> None:
    _read(model, hp)
    k = model.arch_key
    lead = model.get_u32(k("leading_dense_block_count"), 0)
    hp.expert_layers = [il >= lead for il in range(hp.n_layer)]
    func = model.get_u32(k("expert_gating_func"), 0)
    if func not in _GATING:
        raise ModelError(f"{k('expert_gating_func')} = {func}: expected one of "
                         f"{sorted(_GATING)} (softmax, sigmoid, softmax_weight)")
    hp.expert_gating, hp.expert_norm_w = _GATING[func], True


def _is_moe(hp, il) -> bool:
    return bool(hp.expert_layers) and hp.expert_layers[il]


def _ffn_shapes(hp, il) -> dict:
    E = hp.n_embd
    if _is_moe(hp, il):
        return {**ffn_shapes(hp, il), "exp_probs_b.bias": [hp.n_expert]}
    F = hp.n_ff[il]
    return {"ffn_norm": [E], "ffn_gate": [E, F], "ffn_up": [E, F], "ffn_down": [F, E]}


def layer_tensors(hp, il):
    E, D = hp.n_embd, hp.head_dim_k
    if hp.recurrent_layers[il]:
        return {"attn_norm": [E], "shortconv.conv": [hp.ssm_conv_kernel, E],
                "shortconv.in_proj": [E, 3 * E], "shortconv.out_proj": [E, E],
                **_ffn_shapes(hp, il)}
    return {**attn_shapes(hp, il), "attn_q_norm": [D], "attn_k_norm": [D], **_ffn_shapes(hp, il)}


def conv_state(b, il, x, kernel, name):
    """The causal convolution of x [C, T] (contiguous) with kernel [K, C], continuing the
    state of each token's sequence; the new states are stored (expanded now). Returns [C, T]."""
    return rs.update(b, il, b.kv.k[il], lambda st, seq, inpl: ops.ssm_conv(
        b.ctx, x, kernel, st, seq, name=f"{name}-{il}", in_place=inpl), x.ne[:2], "conv")


def _shortconv(b, il, cur):
    ctx, E = b.ctx, b.hp.n_embd
    bcx = b.mm(b.w(il, "shortconv.in_proj"), cur, name=f"conv_in-{il}")   # [3E, T]
    T = bcx.ne[1]
    part = [ops.view_2d(ctx, bcx, E, T, bcx.nb[1], i * E * 4) for i in range(3)]
    bx = ops.mul(ctx, part[0], part[2], name=f"conv_bx-{il}")
    y = conv_state(b, il, bx, b.w(il, "shortconv.conv"), "conv")
    y = ops.mul(ctx, part[1], y, name=f"conv_y-{il}")
    return b.mm(b.w(il, "shortconv.out_proj"), y, name=f"conv_out-{il}")


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
    cur = b.norm(x, b.w(il, "ffn_norm"), f"ffn_norm-{il}")
    cur = _moe(b, il, cur) if _is_moe(b.hp, il) else b.ffn(il, cur)
    return ops.add(ctx, x, cur, name=f"l_out-{il}")


def _moe(b, il, cur):
    hp = b.hp
    return moe_ffn(b.ctx, cur, b.w(il, "ffn_gate_inp"), b.w(il, "ffn_up_exps"),
                   b.w(il, "ffn_gate_exps"), b.w(il, "ffn_down_exps"), hp.n_expert_used,
                   gating=hp.expert_gating, norm_w=hp.expert_norm_w,
                   w_scale=hp.expert_weights_scale,
                   exp_probs_b=b.weights[f"blk.{il}.exp_probs_b.bias"], act="silu",
                   name=f"ffn_moe-{il}", lora=b.lora)


ARCHS = (
    Arch(name="lfm2", rope_neox=True, read_hparams=_read, layer_tensors=layer_tensors,
         build_layer=build_layer, output_norm="token_embd_norm"),
    Arch(name="lfm2moe", rope_neox=True, read_hparams=_read_moe, layer_tensors=layer_tensors,
         build_layer=build_layer, output_norm="token_embd_norm", moe=True, moe_only=True),
)
