"""The Llama family: pre-norm blocks, grouped-query attention, SwiGLU FFN or mixtral-style experts.

- llama:      rope normal (adjacent pairs); Llama 3's rope_freqs; MoE (mixtral) with
              expert_count > 0: softmax gating, the k selected weights renormalized.
- qwen2:      as llama with NEOX rope and q/k/v biases.
- granite:    as llama with four scales: embedding_scale (x·s after the lookup),
              attention.scale (softmax scale), residual_scale (each branch's output · s before
              the residual add), logit_scale (logits / s).
- granitemoe: granite with experts (and an optional shared expert, ffn_*_shexp).
- smollm3:    as llama without rope on every 4th layer (il + 1 ≡ 0 mod 4) and without rope
              factors.
- mistral3:   as llama (Ministral 3, Mistral Small 3.x), optionally with Llama 4's attention
              temperature (attention.temperature_scale: q times ln(⌊pos / n_ctx_orig⌋ + 1)·s + 1
              after rope), optional attn_output / FFN biases, experts possible.
"""

from __future__ import annotations

from pyggml import ops
from pyggml.errors import ModelError
from pyggml.llm.archs.common import Arch, attn_shapes, ffn_shapes


def _read_llama(model, hp) -> None:
    if hp.n_rot != hp.head_dim_k:
        raise ModelError(f"{hp.arch}: rope.dimension_count {hp.n_rot} must equal the head size "
                         f"{hp.head_dim_k}")
    if hp.n_expert:
        hp.expert_norm_w = True
        hp.n_ff_exp = hp.n_ff[0]          # the experts are feed_forward_length wide


def _read_qwen2(model, hp) -> None:
    pass


def _read_smollm3(model, hp) -> None:
    _read_llama(model, hp)
    hp.n_no_rope_layer_step = 4


def _read_mistral3(model, hp) -> None:
    _read_llama(model, hp)
    hp.attn_temp_scale = model.get_f32(model.arch_key("attention.temperature_scale"), 0.0)
    if hp.attn_temp_scale:
        hp.attn_temp_floor_scale = hp.n_ctx_orig_yarn
        if not hp.attn_temp_floor_scale:
            raise ModelError(f"{hp.arch}: attention.temperature_scale needs "
                             f"rope.scaling.original_context_length > 0")


def _read_granite(model, hp) -> None:
    _read_llama(model, hp)
    k = model.arch_key
    hp.logit_scale = model.get_f32(k("logit_scale"))
    hp.residual_scale = model.get_f32(k("residual_scale"), 0.0)
    hp.embd_scale = model.get_f32(k("embedding_scale"), 0.0) or 1.0
    scale = model.get_f32(k("attention.scale"), 0.0)
    if scale:
        hp.attn_scale = scale
    if not model.get_bool(k("rope.scaling.finetuned"), True):
        raise ModelError(f"{hp.arch}: rope.scaling.finetuned = false (Granite without rope) "
                         f"is not supported")


def layer_tensors(hp, il):
    return {**attn_shapes(hp, il), **ffn_shapes(hp, il)}


def build_layer(b, il, x):
    """x [E, T] → the residual stream after layer il."""
    ctx, hp = b.ctx, b.hp
    cur = b.norm(x, b.w(il, "attn_norm"), f"attn_norm-{il}")
    q, k, v = b.qkv(il, cur)
    if hp.layer_has_rope(il):
        factors = hp.arch != "smollm3"
        q = b.rope(il, q, f"q_rope-{il}", factors=factors)
        k = b.rope(il, k, f"k_rope-{il}", factors=factors)
    if b.inp.attn_temp is not None:
        q = ops.mul(ctx, q, b.inp.attn_temp, name=f"q_temp-{il}")
    cur = b.attn_out(il, b.attention(il, q, k, v, hp.attn_scale))
    cur, x = b.last_rows(il, cur, x)
    if hp.residual_scale:
        cur = ops.scale(ctx, cur, hp.residual_scale)
    x = ops.add(ctx, x, cur, name=f"ffn_inp-{il}")
    cur = b.norm(x, b.w(il, "ffn_norm"), f"ffn_norm-{il}")
    if hp.n_expert:
        moe = b.moe(il, cur)
        cur = ops.add(ctx, moe, b.ffn(il, cur, shared=True)) if hp.n_ff_shexp else moe
    else:
        cur = b.ffn(il, cur)
    if hp.residual_scale:
        cur = ops.scale(ctx, cur, hp.residual_scale)
    if il == hp.n_layer - 1:
        # the sum takes the memory of its first source in place: putting `cur` first moves
        # the residual stream off its early offset, so the big logits tensor can sit low
        # (2-4 MiB less compute buffer with logits for every position)
        return ops.add(ctx, cur, x, name=f"l_out-{il}")
    return ops.add(ctx, x, cur, name=f"l_out-{il}")


ARCHS = (
    Arch(name="llama", rope_neox=False, read_hparams=_read_llama,
         layer_tensors=layer_tensors, build_layer=build_layer, moe=True),
    Arch(name="qwen2", rope_neox=True, read_hparams=_read_qwen2,
         layer_tensors=layer_tensors, build_layer=build_layer),
    Arch(name="granite", rope_neox=False, read_hparams=_read_granite,
         layer_tensors=layer_tensors, build_layer=build_layer),
    Arch(name="granitemoe", rope_neox=False, read_hparams=_read_granite,
         layer_tensors=layer_tensors, build_layer=build_layer, moe=True, moe_only=True),
    Arch(name="smollm3", rope_neox=False, read_hparams=_read_smollm3,
         layer_tensors=layer_tensors, build_layer=build_layer),
    Arch(name="mistral3", rope_neox=False, read_hparams=_read_mistral3,
         layer_tensors=layer_tensors, build_layer=build_layer, moe=True),
)
