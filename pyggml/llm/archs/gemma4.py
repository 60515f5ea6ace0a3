"""Gemma 4 (`general.architecture = "gemma4"`), as llama.cpp's src/models/gemma4.cpp builds it:
Gemma 3's sandwich of RMS norms around attention and the GeGLU FFN, with

- sliding-window layers from a per-layer bool array (attention.sliding_window_pattern) whose
  heads may be smaller than the global layers' (attention.key_length_swa / value_length_swa,
  rope.dimension_count_swa) and whose rope has its own base (rope.freq_base_swa) and no
  factors; the global layers' rope uses rope_freqs (proportional rope);
- q and k RMS-normed per head with weights, v RMS-normed per head without one, then no q
  scaling and softmax scale 1 (the norms set the scale);
- layers without attn_v take the K projection as V (before k's norm and rope);
- shared KV (attention.shared_kv_layers = n): the last n layers store no K/V and attend the
  cache of the last sliding-window / global layer before them (llama.cpp's reuse: layer
  L - n - 2 for sliding-window layers, L - n - 1 for global ones);
- per-layer embeddings (embedding_length_per_layer_input = P > 0, E2B/E4B): per token a
  [P, L] input, (per_layer_token_embd row · sqrt(P) + rms_norm(per_layer_model_proj · x /
  sqrt(E))) / sqrt(2); after each layer's FFN the stream gets proj(gelu(inp_gate · x) ·
  input_il), RMS-normed (post_norm), added;
- an optional per-layer output scale (layer_output_scale [1]); final logit soft-capping
  (final_logit_softcapping, 30 when absent);
- experts (26B-A4B) on layers with ffn_gate_inp: the dense FFN runs as a shared expert beside
  them (its output normed by post_ffw_norm_1, the experts' input by pre_ffw_norm_2 and their
  output by post_ffw_norm_2); the router reads rms_norm(x) / sqrt(E) · ffn_gate_inp.scale,
  softmax over all experts, the k best renormalized, GeGLU experts (gate|up fused or not) with
  an optional per-expert output scale (ffn_down_exps.scale).

Not here: the vision tower, and "gemma4-assistant" (the multi-token-prediction drafter, a
separate architecture), which fail at load as unknown architectures.
"""

from __future__ import annotations

import math

from pyggml import ops
from pyggml.errors import ModelError
from pyggml.llm.archs.common import Arch, need_tensor, read_shared_kv, swa_pattern


def _read(model, hp) -> None:
    k, L, E = model.arch_key, hp.n_layer, hp.n_embd
    path = model.paths[0] if hasattr(model, "paths") else "model"
    if k("attention.sliding_window_pattern") not in model:
        raise ModelError(f"{path}: gemma4 needs {k('attention.sliding_window_pattern')} "
                         f"(a bool per layer)")
    hp.swa_layers = swa_pattern(model, k("attention.sliding_window_pattern"), L, 1)
    hp.sliding_window = model.get_u32(k("attention.sliding_window"))
    hp.rope_freq_scale_swa = 1.0
    hp.n_embd_per_layer = model.get_u32(k("embedding_length_per_layer_input"))
    hp.head_dim_k_swa = model.get_u32(k("attention.key_length_swa"))
    hp.head_dim_v_swa = model.get_u32(k("attention.value_length_swa"))
    hp.n_rot_swa = model.get_u32(k("rope.dimension_count_swa"), hp.n_rot)
    for key, v, head in (("attention.key_length_swa", hp.head_dim_k_swa, None),
                         ("rope.dimension_count", hp.n_rot, hp.head_dim_k),
                         ("rope.dimension_count_swa", hp.n_rot_swa, hp.head_dim_k_swa)):
        if v <= 0 or (head is not None and (v > head or v % 2)):
            raise ModelError(f"{path}: {k(key)} = {v} must be > 0"
                             + (f", even and at most the head size {head}" if head else ""))
    if hp.head_dim_k != hp.head_dim_v or hp.head_dim_k_swa != hp.head_dim_v_swa:
        raise ModelError(f"{path}: gemma4 needs equal K and V head sizes (key_length "
                         f"{hp.head_dim_k} / value_length {hp.head_dim_v}, _swa "
                         f"{hp.head_dim_k_swa} / {hp.head_dim_v_swa})")
    hp.embd_scale = math.sqrt(float(E))
    hp.attn_scale = 1.0
    # llama.cpp's default when the key is absent
    hp.final_softcap = model.get_f32(k("final_logit_softcapping"), 30.0)
    read_shared_kv(model, hp, path)
    tensors = model.tensors
    if hp.n_expert:
        hp.expert_layers = [f"blk.{il}.ffn_gate_inp.weight" in tensors for il in range(L)]
        ff = model.get_u32_per_layer(k("expert_feed_forward_length"), L, default=0)
        hp.n_ff_exp = max(ff) or hp.n_ff_exp
        if len({f for f, e in zip(ff, hp.expert_layers) if e}) > 1:
            raise ModelError(f"{path}: {k('expert_feed_forward_length')} differs between "
                             f"layers with experts ({ff}); not supported")
        hp.expert_gating, hp.expert_norm_w = "softmax", True
    # tensors llama.cpp takes when present: their shapes now, so that a wrong one is a load error
    for il in range(L):
        D, H, Hkv, X, Fx = hp.head_k(il), hp.n_head[il], hp.n_head_kv[il], hp.n_expert, \
            hp.n_ff_exp
        opt = {"attn_v.weight": [E, Hkv * D], "layer_output_scale.weight": [1],
               "ffn_down_exps.scale": [X], "ffn_up_exps.scale": [X],
               "ffn_gate_exps.scale": [X]}
        for short, ne in opt.items():
            name = f"blk.{il}.{short}"
            if name in tensors:
                need_tensor(tensors, name, ne, hp.arch, path)
        if f"blk.{il}.attn_qkv.weight" in tensors:
            raise ModelError(f"{path}: blk.{il}.attn_qkv.weight: gemma4 with a fused QKV "
                             f"projection is not supported")
        if hp.expert_layers and hp.expert_layers[il]:
            if f"blk.{il}.ffn_gate_up_exps.weight" in tensors:
                need_tensor(tensors, f"blk.{il}.ffn_gate_up_exps.weight", [E, 2 * Fx, X],
                            hp.arch, path)
            else:
                for what in ("ffn_gate_exps", "ffn_up_exps"):
                    need_tensor(tensors, f"blk.{il}.{what}.weight", [E, Fx, X], hp.arch, path)
        for what in ("attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up",
                     "ffn_down", "attn_qkv"):
            if f"blk.{il}.{what}.scale" in tensors:
                raise ModelError(f"{path}: blk.{il}.{what}.scale: per-tensor weight scales "
                                 f"are not supported")


def _model_tensors(hp) -> dict:
    out = {}
    if not all(hp.layer_is_swa(il) for il in range(hp.n_layer)):
        # the global layers' rope factors, one tensor for all of them
        out["rope_freqs.weight"] = [hp.head_dim_k // 2]
    P = hp.n_embd_per_layer
    if P:
        out.update({"per_layer_token_embd.weight": [P * hp.n_layer, hp.n_vocab],
                    "per_layer_model_proj.weight": [hp.n_embd, P * hp.n_layer],
                    "per_layer_proj_norm.weight": [P]})
    return out


def layer_tensors(hp, il):
    E, D, H, Hkv, F = hp.n_embd, hp.head_k(il), hp.n_head[il], hp.n_head_kv[il], hp.n_ff[il]
    has_kv = hp.kv_layer(il) == il
    d = {"attn_norm": [E], "attn_q": [E, H * D], "attn_output": [H * D, E],
         "attn_q_norm": [D], "post_attention_norm": [E],
         "ffn_norm": [E], "ffn_gate": [E, F], "ffn_up": [E, F], "ffn_down": [F, E],
         "post_ffw_norm": [E]}
    if has_kv:
        d.update({"attn_k": [E, Hkv * D], "attn_k_norm": [D]})
    if hp.expert_layers and hp.expert_layers[il]:
        X, Fx = hp.n_expert, hp.n_ff_exp
        d.update({"ffn_gate_inp": [E, X], "ffn_gate_inp.scale": [E], "pre_ffw_norm_2": [E],
                  "post_ffw_norm_1": [E], "post_ffw_norm_2": [E],
                  "ffn_down_exps": [Fx, E, X]})
        # (gate|up fused or separate: checked in _read / taken as present)
    if hp.n_embd_per_layer:
        P = hp.n_embd_per_layer
        d.update({"inp_gate": [E, P], "proj": [P, E], "post_norm": [E]})
    return d


def prepare(b, x):
    """The per-layer inputs F32 [P, T, L] of the ubatch (llama.cpp's build_inp_per_layer and
    project_per_layer_inputs), kept as b.per_layer_inp; x [E, T] are the scaled embeddings,
    returned unchanged."""
    hp, ctx, T = b.hp, b.ctx, b.T
    P, L, E = hp.n_embd_per_layer, hp.n_layer, hp.n_embd
    b.per_layer_inp = None
    if not P:
        return x
    w = b.weights
    sel = ops.get_rows(ctx, w["per_layer_token_embd.weight"], b.inp.tokens)   # [P*L, T]
    sel = ops.scale(ctx, ops.reshape_3d(ctx, sel, P, L, T), math.sqrt(float(P)),
                    name="inp_per_layer_selected")
    # a plain matmul in llama.cpp too: no LoRA here
    proj = ops.mul_mat(ctx, w["per_layer_model_proj.weight"], x)               # [P*L, T]
    proj = ops.reshape_3d(ctx, ops.scale(ctx, proj, 1.0 / math.sqrt(float(E))), P, L, T)
    proj = b.norm(proj, w["per_layer_proj_norm.weight"], "per_layer_proj")
    inp = ops.scale(ctx, ops.add(ctx, proj, sel), 1.0 / math.sqrt(2.0), name="inp_per_layer")
    b.per_layer_inp = ops.cont(ctx, ops.permute(ctx, inp, 0, 2, 1, 3))        # [P, T, L]
    return x


def per_layer_out(b, il, cur, select_rows: bool):
    """Layer il's per-layer-embedding branch of cur F32 [E, n]: rms_norm(proj(gelu(inp_gate ·
    cur) · input_il)) · post_norm, F32 [E, n]. select_rows: cur holds only the last layer's
    output rows (b.last_rows), so the input rows are picked the same way."""
    ctx, P, pin = b.ctx, b.hp.n_embd_per_layer, b.per_layer_inp
    inp = ops.view_2d(ctx, pin, P, b.T, pin.nb[1], il * pin.nb[2])          # [P, T]
    if select_rows:
        (inp,) = b.last_rows(il, inp)
    g = ops.gelu(ctx, b.mm(b.w(il, "inp_gate"), cur))
    g = b.mm(b.w(il, "proj"), ops.mul(ctx, g, inp))
    return b.norm(g, b.w(il, "post_norm"), f"per_layer_embd_out-{il}")


def build_layer(b, il, x):
    ctx, hp, T = b.ctx, b.hp, b.T
    D, H, Hkv = hp.head_k(il), hp.n_head[il], hp.n_head_kv[il]
    swa = hp.layer_is_swa(il)
    cur = b.norm(x, b.w(il, "attn_norm"), f"attn_norm-{il}")
    q = ops.reshape_3d(ctx, b.mm(b.w(il, "attn_q"), cur), D, H, T)
    q = b.norm(q, b.w(il, "attn_q_norm"), f"q_norm-{il}")
    q = b.rope(il, q, f"q_rope-{il}", factors=not swa)
    if hp.kv_layer(il) == il:
        kp = b.mm(b.w(il, "attn_k"), cur)
        wv = b.opt(il, "attn_v")
        vp = b.mm(wv, cur) if wv is not None else kp   # no attn_v: V is K
        k = b.norm(ops.reshape_3d(ctx, kp, D, Hkv, T), b.w(il, "attn_k_norm"), f"k_norm-{il}")
        v = ops.rms_norm(ctx, ops.reshape_3d(ctx, vp, D, Hkv, T), hp.rms_eps,
                         name=f"v_norm-{il}")
        k = b.rope(il, k, f"k_rope-{il}", factors=not swa)
        o = b.attention(il, q, k, ops.reshape_2d(ctx, v, D * Hkv, T), hp.attn_scale)
    else:
        o = b.attention(il, q, None, None, hp.attn_scale)
    cur = b.attn_out(il, o)
    cur, x = b.last_rows(il, cur, x)
    cur = b.norm(cur, b.w(il, "post_attention_norm"), f"attn_post_norm-{il}")
    attn_out = ops.add(ctx, cur, x, name=f"attn_out-{il}")
    if hp.expert_layers and hp.expert_layers[il]:
        from pyggml.llm.moe import moe_ffn
        mlp = b.ffn(il, b.norm(attn_out, b.w(il, "ffn_norm"), f"ffn_norm_1-{il}"), act="gelu")
        mlp = b.norm(mlp, b.w(il, "post_ffw_norm_1"), f"ffn_mlp-{il}")
        moe_in = b.norm(attn_out, b.w(il, "pre_ffw_norm_2"), f"ffn_norm_2-{il}")
        r = ops.scale(ctx, ops.rms_norm(ctx, attn_out, hp.rms_eps), 1.0 / math.sqrt(hp.n_embd))
        r = ops.mul(ctx, r, b.opt(il, "ffn_gate_inp", "scale"))
        logits = b.mm(b.w(il, "ffn_gate_inp"), r, name=f"ffn_moe_logits-{il}")
        moe = moe_ffn(ctx, moe_in, None, b.opt(il, "ffn_up_exps"), b.opt(il, "ffn_gate_exps"),
                      b.w(il, "ffn_down_exps"), hp.n_expert_used, gating="softmax",
                      norm_w=True, w_scale=1.0, act="gelu", name=f"ffn_moe-{il}",
                      logits=logits, gate_up_exps=b.opt(il, "ffn_gate_up_exps"),
                      up_s=b.opt(il, "ffn_up_exps", "scale"),
                      gate_s=b.opt(il, "ffn_gate_exps", "scale"),
                      down_s=b.opt(il, "ffn_down_exps", "scale"), lora=b.lora)
        moe = b.norm(moe, b.w(il, "post_ffw_norm_2"), f"ffn_moe-{il}")
        cur = ops.add(ctx, mlp, moe, name=f"ffn_moe_combined-{il}")
    else:
        cur = b.ffn(il, b.norm(attn_out, b.w(il, "ffn_norm"), f"ffn_norm-{il}"), act="gelu")
    cur = b.norm(cur, b.w(il, "post_ffw_norm"), f"ffn_post_norm-{il}")
    cur = ops.add(ctx, cur, attn_out, name=f"ffn_out-{il}")
    if b.per_layer_inp is not None:
        cur = ops.add(ctx, cur, per_layer_out(b, il, cur, select_rows=True), name=f"pe_out-{il}")
    s = b.opt(il, "layer_output_scale")
    if s is not None:
        cur = ops.mul(ctx, cur, s, name=f"out_scaled-{il}")
    return cur


ARCHS = (
    Arch(name="gemma4", rope_neox=True, read_hparams=_read, layer_tensors=layer_tensors,
         build_layer=build_layer, moe=True, model_tensors=_model_tensors, prepare=prepare),
)
