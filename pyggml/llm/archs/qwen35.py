"""Qwen 3.5 / 3.6 (`qwen35`, `qwen35moe`): a hybrid of gated DeltaNet linear-attention layers and
full-attention layers (every `full_attention_interval`-th layer, or the layers that
`attention.recurrent_layers` marks false), llama.cpp's src/models/qwen35*.cpp. Every layer:
x += mixer(rms(x)·attn_norm); x += ffn(rms(x)·post_attention_norm), the FFN dense (qwen35) or
experts plus a sigmoid-gated shared expert (qwen35moe).

Attention layer: attn_q [E, 2·H·D] gives per head q | gate; q and k RMS-normed per head
(attn_q_norm / attn_k_norm [D]), multi-section rope (IMROPE: for text positions it is NEOX rope
on the first n_rot dimensions, see _read), attention, times sigmoid(gate), attn_output.

Linear-attention layer (H_v value heads of Dv, H_k key heads of Dk = ssm.state_size,
C = 2·H_k·Dk + H_v·Dv): qkv = attn_qkv·x [C, T] through the causal convolution ssm_conv1d
[K, C] (state: the K-1 last inputs per channel) and SiLU, split q | k | v; q, k L2-normed per
head (rms_norm with eps/Dk, times 1/√Dk: llama.cpp's build_gdn_l2_norm); beta =
sigmoid(ssm_beta·x), g = softplus(ssm_alpha·x + ssm_dt.bias)·ssm_a [H_v, T]; the gated delta
rule with output scale 1/√Dv (state [Dk·Dv·H_v] per sequence, pyggml/llm/recurrent.py); per
head rms·ssm_norm times silu(attn_gate·x); ssm_out.
"""

from __future__ import annotations

import math

from pyggml import ops
from pyggml.errors import ModelError
from pyggml.llm import recurrent as rs
from pyggml.llm.archs.common import Arch
from pyggml.llm.archs.lfm2 import conv_state


def _imrope_is_neox(sections, n_rot: int) -> bool:
    """True when ggml's IMROPE with text positions (t = h = w = pos, e = 0) rotates every pair
    of the first n_rot dimensions by pos·θᵢ: no pair falls to the 'e' section."""
    s = list(sections) + [0] * (4 - len(sections))
    dims = sum(s[:4])
    if dims <= 0:
        return False
    for p in range(n_rot // 2):
        sec = p % dims
        if not ((sec % 3 == 1 and sec < 3 * s[1]) or (sec % 3 == 2 and sec < 3 * s[2])
                or (sec % 3 == 0 and sec < 3 * s[0])):
            return False
    return True


def _read(model, hp) -> None:
    k = model.arch_key
    L = hp.n_layer
    d_conv = model.get_u32(k("ssm.conv_kernel"))
    d_inner = model.get_u32(k("ssm.inner_size"))
    d_state = model.get_u32(k("ssm.state_size"))
    h_v = model.get_u32(k("ssm.time_step_rank"))
    h_k = model.get_u32(k("ssm.group_count"))
    if d_conv < 2 or not h_v or not h_k or h_v % h_k or d_inner != d_state * h_v:
        raise ModelError(f"{hp.arch}: ssm.conv_kernel {d_conv} (>= 2), ssm.time_step_rank {h_v} "
                         f"(a multiple of ssm.group_count {h_k}), ssm.inner_size {d_inner} "
                         f"(= ssm.state_size {d_state} x time_step_rank) do not fit")
    hp.ssm_conv_kernel = d_conv
    hp.ssm_conv_channels = d_inner + 2 * h_k * d_state
    hp.ssm_state_size = d_state * d_state * h_v
    hp.ssm_heads = (h_k, h_v, d_state)
    rec = model.get(k("attention.recurrent_layers"), None)
    if rec is not None and hasattr(rec, "__len__"):
        flags = [bool(x) for x in list(rec)]
        if len(flags) < L:
            raise ModelError(f"{k('attention.recurrent_layers')}: {len(flags)} entries for "
                             f"{L} layers")
        hp.recurrent_layers = flags[:L]
    else:
        every = model.get_u32(k("full_attention_interval"), 4)
        if every < 1:
            raise ModelError(f"{k('full_attention_interval')} must be >= 1, got {every}")
        hp.recurrent_layers = [(il + 1) % every != 0 for il in range(L)]
    sections = model.get(k("rope.dimension_sections"), None)
    if sections is None:
        raise ModelError(f"{hp.arch}: {k('rope.dimension_sections')} is required")
    hp.rope_sections = [int(x) for x in list(sections)][:4]
    if not _imrope_is_neox(hp.rope_sections, hp.n_rot):
        raise ModelError(f"{k('rope.dimension_sections')} = {hp.rope_sections} with "
                         f"rope.dimension_count {hp.n_rot}: a section of text-position rope "
                         f"that is not rotated (the fourth) is not supported yet")
    if hp.head_dim_k != hp.head_dim_v:
        raise ModelError(f"{hp.arch}: key and value head sizes differ ({hp.head_dim_k}, "
                         f"{hp.head_dim_v})")
    scale = model.get_f32(k("attention.scale"), 0.0)
    hp.attn_scale = scale or 1.0 / math.sqrt(hp.head_dim_k)
    if hp.n_expert:
        hp.expert_norm_w = True
        if not model.get_u32(k("expert_feed_forward_length"), 0):
            hp.n_ff_exp = hp.n_ff[0] // hp.n_expert_used
        hp.n_ff_shexp = hp.n_ff_shexp or hp.n_ff[0]


def layer_tensors(hp, il):
    E, D, H, Hkv = hp.n_embd, hp.head_dim_k, hp.n_head[il], hp.n_head_kv[il]
    d = {"attn_norm": [E], "post_attention_norm": [E]}
    if hp.recurrent_layers[il]:
        h_k, h_v, dk = hp.ssm_heads
        C, V = hp.ssm_conv_channels, h_v * dk
        d.update({"attn_qkv": [E, C], "attn_gate": [E, V],
                  "ssm_conv1d": [hp.ssm_conv_kernel, C], "ssm_dt.bias": [h_v], "ssm_a.": [h_v],
                  "ssm_beta": [E, h_v], "ssm_alpha": [E, h_v], "ssm_norm": [dk],
                  "ssm_out": [V, E]})
    else:
        d.update({"attn_q": [E, 2 * H * D], "attn_k": [E, Hkv * D], "attn_v": [E, Hkv * D],
                  "attn_output": [H * D, E], "attn_q_norm": [D], "attn_k_norm": [D]})
    if hp.n_expert:
        F, X, S = hp.n_ff_exp, hp.n_expert, hp.n_ff_shexp
        d.update({"ffn_gate_inp": [E, X], "ffn_gate_exps": [E, F, X], "ffn_up_exps": [E, F, X],
                  "ffn_down_exps": [F, E, X], "ffn_gate_inp_shexp": [E],
                  "ffn_gate_shexp": [E, S], "ffn_up_shexp": [E, S], "ffn_down_shexp": [S, E]})
    else:
        F = hp.n_ff[il]
        d.update({"ffn_gate": [E, F], "ffn_up": [E, F], "ffn_down": [F, E]})
    return d


def _attn(b, il, cur):
    ctx, hp, T = b.ctx, b.hp, b.T
    D, H, Hkv = hp.head_dim_k, hp.n_head[il], hp.n_head_kv[il]
    qg = b.mm(b.w(il, "attn_q"), cur, name=f"wqg-{il}")          # [2·D·H, T]
    q = ops.view_3d(ctx, qg, D, H, T, 2 * D * 4, qg.nb[1], 0)
    gate = ops.cont(ctx, ops.view_3d(ctx, qg, D, H, T, 2 * D * 4, qg.nb[1], D * 4))
    gate = ops.reshape_2d(ctx, gate, D * H, T)
    k = b.mm(b.w(il, "attn_k"), cur, name=f"wk-{il}")
    v = b.mm(b.w(il, "attn_v"), cur, name=f"wv-{il}")
    q = b.norm(q, b.w(il, "attn_q_norm"), f"q_norm-{il}")
    k = b.norm(ops.reshape_3d(ctx, k, D, Hkv, T), b.w(il, "attn_k_norm"), f"k_norm-{il}")
    q = b.rope(il, q, f"q_rope-{il}", factors=False)
    k = b.rope(il, k, f"k_rope-{il}", factors=False)
    o = b.attention(il, q, k, v, hp.attn_scale)                                # [D·H, T]
    o = ops.mul(ctx, o, ops.sigmoid(ctx, gate), name=f"attn_gated-{il}")
    return b.attn_out(il, o)


def _l2_norm(ctx, x, eps):
    n = x.ne[0]
    return ops.scale(ctx, ops.rms_norm(ctx, x, eps / n), 1.0 / math.sqrt(n))


def _linear_attn(b, il, cur):
    ctx, hp, kv, T = b.ctx, b.hp, b.kv, b.T
    h_k, h_v, dk = hp.ssm_heads
    dv, C = dk, hp.ssm_conv_channels
    qkv = b.mm(b.w(il, "attn_qkv"), cur, name=f"qkv_mixed-{il}")    # [C, T]
    z = b.mm(b.w(il, "attn_gate"), cur, name=f"z-{il}")            # [Dv·H_v, T]
    beta = ops.sigmoid(ctx, b.mm(b.w(il, "ssm_beta"), cur), name=f"beta-{il}")
    alpha = b.mm(b.w(il, "ssm_alpha"), cur, name=f"alpha-{il}")    # [H_v, T]
    alpha = ops.add(ctx, alpha, b.weights[f"blk.{il}.ssm_dt.bias"])
    g = ops.mul(ctx, ops.softplus(ctx, alpha), b.weights[f"blk.{il}.ssm_a"], name=f"gate-{il}")
    y = ops.silu(ctx, conv_state(b, il, qkv, b.w(il, "ssm_conv1d"), "conv"),
                 name=f"conv_silu-{il}")                                       # [C, T]
    row = y.nb[1]
    q = ops.view_3d(ctx, y, dk, h_k, T, dk * 4, row, 0)
    k = ops.view_3d(ctx, y, dk, h_k, T, dk * 4, row, h_k * dk * 4)
    v = ops.view_3d(ctx, y, dv, h_v, T, dv * 4, row, 2 * h_k * dk * 4)
    q = _l2_norm(ctx, q, hp.rms_eps)
    k = _l2_norm(ctx, k, hp.rms_eps)
    o = rs.update(b, il, kv.v[il], lambda st, seq, inpl: ops.gated_delta(
        ctx, q, k, v, g, beta, st, seq, 1.0 / math.sqrt(dv), name=f"gdn-{il}", in_place=inpl),
        [dv, h_v, T], "ssm")
    o = b.norm(o, b.w(il, "ssm_norm"), f"ssm_norm-{il}")
    o = ops.mul(ctx, o, ops.silu(ctx, ops.reshape_3d(ctx, z, dv, h_v, T)), name=f"gated-{il}")
    o = ops.reshape_2d(ctx, o, dv * h_v, T)
    return b.mm(b.w(il, "ssm_out"), o, name=f"linear_attn_out-{il}")


def _moe(b, il, cur):
    ctx = b.ctx
    out = b.moe(il, cur)
    sh = b.ffn(il, cur, shared=True)
    gate = ops.sigmoid(ctx, b.mm(b.w(il, "ffn_gate_inp_shexp"), cur))   # [1, T]
    return ops.add(ctx, out, ops.mul(ctx, sh, gate, name=f"ffn_shexp_gated-{il}"),
                   name=f"ffn_out-{il}")


def build_layer(b, il, x):
    ctx, hp = b.ctx, b.hp
    cur = b.norm(x, b.w(il, "attn_norm"), f"attn_norm-{il}")
    cur = _linear_attn(b, il, cur) if hp.recurrent_layers[il] else _attn(b, il, cur)
    cur, x = b.last_rows(il, cur, x)
    x = ops.add(ctx, cur, x, name=f"attn_residual-{il}")
    cur = b.norm(x, b.w(il, "post_attention_norm"), f"attn_post_norm-{il}")
    cur = _moe(b, il, cur) if hp.n_expert else b.ffn(il, cur)
    return ops.add(ctx, cur, x, name=f"l_out-{il}")


ARCHS = (
    Arch(name="qwen35", rope_neox=True, read_hparams=_read, layer_tensors=layer_tensors,
         build_layer=build_layer),
    Arch(name="qwen35moe", rope_neox=True, read_hparams=_read, layer_tensors=layer_tensors,
         build_layer=build_layer, moe=True, moe_only=True),
)
