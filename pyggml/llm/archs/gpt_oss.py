"""gpt-oss (`general.architecture = "gpt-oss"`, llama.cpp's openai-moe): every layer a
mixture of experts, as llama.cpp's src/models/openai-moe.cpp builds it.

- attention: q/k/v (optional biases), NEOX rope (YaRN in the released models), softmax scale
  1/sqrt(D) with one learnt sink logit per head (attn_sinks [H]: it joins each softmax and takes
  its share of the weight, its value row is zero), attn_output with bias; every other layer a
  sliding window (attention.sliding_window; the even layers slide, llama.cpp's pattern 2), the
  same rope base on both unless rope.freq_base_swa says otherwise;
- the residual sum is normalized (post_attention_norm, the only norm before the experts);
- experts: the router with bias, the k largest logits chosen and softmaxed among themselves
  (llama.cpp's SOFTMAX_WEIGHT gating, no renormalization), expert biases on up, gate and down,
  the clamped SwiGLU x·sigmoid(1.702·x)·(y + 1) with x = min(gate, 7), y = clamp(up, ±7)
  (pyggml/llm/moe.py: swiglu_oai). The experts are MXFP4 in the released files.
"""

from __future__ import annotations

from pyggml import ops
from pyggml.llm.archs.common import Arch, attn_shapes, swa_pattern


def _read(model, hp) -> None:
    k, L = model.arch_key, hp.n_layer
    hp.sliding_window = model.get_u32(k("attention.sliding_window"))
    hp.swa_layers = swa_pattern(model, k("attention.sliding_window_pattern"), L, 2)
    hp.rope_base_swa = model.get_f32(k("rope.freq_base_swa"), hp.rope_base)
    hp.rope_freq_scale_swa = hp.rope_freq_scale
    hp.expert_gating = "softmax_weight"
    hp.expert_norm_w = False


def layer_tensors(hp, il):
    E, F, X, H = hp.n_embd, hp.n_ff_exp, hp.n_expert, hp.n_head[il]
    return {**attn_shapes(hp, il), "attn_sinks": [H], "post_attention_norm": [E],
            "ffn_gate_inp": [E, X], "ffn_gate_exps": [E, F, X], "ffn_up_exps": [E, F, X],
            "ffn_down_exps": [F, E, X]}


def build_layer(b, il, x):
    from pyggml.llm.moe import moe_ffn
    ctx, hp = b.ctx, b.hp
    cur = b.norm(x, b.w(il, "attn_norm"), f"attn_norm-{il}")
    q, k, v = b.qkv(il, cur)
    q = b.rope(il, q, f"q_rope-{il}", factors=False)
    k = b.rope(il, k, f"k_rope-{il}", factors=False)
    cur = b.attn_out(il, b.attention(il, q, k, v, hp.attn_scale,
                                     sinks=b.w(il, "attn_sinks")))
    cur, x = b.last_rows(il, cur, x)
    x = ops.add(ctx, cur, x, name=f"ffn_inp-{il}")
    cur = b.norm(x, b.w(il, "post_attention_norm"), f"attn_post_norm-{il}")
    cur = moe_ffn(ctx, cur, b.w(il, "ffn_gate_inp"), b.w(il, "ffn_up_exps"),
                  b.w(il, "ffn_gate_exps"), b.w(il, "ffn_down_exps"), hp.n_expert_used,
                  gating="softmax_weight", norm_w=False, w_scale=hp.expert_weights_scale,
                  act="swiglu_oai", name=f"ffn_moe-{il}",
                  gate_inp_b=b.opt(il, "ffn_gate_inp", "bias"),
                  up_b=b.opt(il, "ffn_up_exps", "bias"), gate_b=b.opt(il, "ffn_gate_exps", "bias"),
                  down_b=b.opt(il, "ffn_down_exps", "bias"), lora=b.lora)
    return ops.add(ctx, cur, x, name=f"l_out-{il}")


ARCHS = (
    Arch(name="gpt-oss", rope_neox=True, read_hparams=_read, layer_tensors=layer_tensors,
         build_layer=build_layer, output_required=True, moe=True, moe_only=True),
)
