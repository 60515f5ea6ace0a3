"""Gemma 3n (`general.architecture = "gemma3n"`, E2B / E4B text), as llama.cpp's
src/models/gemma3n.cpp builds it: Gemma 3's sandwich of RMS norms around attention and the
GeGLU FFN, q and k RMS-normed per head with weights, v without, softmax scale 1, no rope factors
(sliding-window layers: rope.freq_base_swa, frequency scale 1), final soft-cap 30, and

- AltUp: the residual stream is A = altup.num_inputs (4) copies x [E, T, A]. Before layer 0
  copy j > 0 is altup_proj[j-1] · x rescaled to x's per-token magnitude. Each layer predicts
  all copies from a mix (per token coefficients from the router: tanh(altup_router ·
  rms_norm(x_act)·altup_router_norm / E)), computes on the active copy (altup.active_idx), then
  corrects every copy by the innovation (output - prediction) times router coefficients + 1.
  After the last layer copies j > 0 are unprojected (altup_unembd_proj, rescaled) and all A
  averaged;
- LAuReL: a rank-r residual beside attention, x + rms_norm(laurel_r · laurel_l · x), averaged
  with the attention branch (sum / sqrt(2));
- per-layer embeddings (as Gemma 4: pyggml/llm/archs/gemma4.py, `prepare`, `per_layer_out`),
  here from the corrected active copy times altup_correct_scale, added to copies 1..A-1;
- Gaussian top-k sparsity of the FFN gate on the first layers: relu(g - mean(g) - s·std(g))
  (std with n - 1), s from activation_sparsity_scale (1.6449 = Φ⁻¹(0.95) on layers 0..9 when
  absent, llama.cpp's constants; -inf: none);
- shared KV: layers from L - attention.shared_kv_layers (llama.cpp: always 20) on attend the
  cache of layer 18 (sliding-window) / 19 (global) and store none (common.read_shared_kv).

llama.cpp fixes n_altup 4, the active copy 0, 256 per-layer dims, the KV-sharing start 20 and
the sparsity of layers 0..9; here they are read from the file's keys (the converter writes them)
with those values as defaults, so the released files compute the same. Not here: the vision and
audio towers.
"""

from __future__ import annotations

import math

from pyggml import ops
from pyggml.errors import ModelError
from pyggml.llm.archs import gemma4
from pyggml.llm.archs.common import (Arch, attn_shapes, ffn_shapes, read_shared_kv,
                                     swa_pattern)

KV_FROM_START = 20            # llama.cpp's n_layer_kv_from_start for gemma3n
SPARSE_LAYERS = 10            # llama.cpp's n_layer_sparsity
SPARSITY_STD_MUL = 1.6448533535003662   # Φ⁻¹(0.95), llama.cpp's f_sparsity_std_mul


def _read(model, hp) -> None:
    k, L, E = model.arch_key, hp.n_layer, hp.n_embd
    path = model.paths[0] if hasattr(model, "paths") else "model"
    hp.swa_layers = swa_pattern(model, k("attention.sliding_window_pattern"), L, 5)
    hp.sliding_window = model.get_u32(k("attention.sliding_window"))
    hp.rope_freq_scale_swa = 1.0
    hp.embd_scale = math.sqrt(float(E))
    hp.attn_scale = 1.0
    hp.final_softcap = model.get_f32(k("final_logit_softcapping"), 30.0)
    hp.n_altup = model.get_u32(k("altup.num_inputs"), 4)
    hp.i_altup_act = model.get_u32(k("altup.active_idx"), 0)
    if hp.n_altup < 2 or hp.i_altup_act >= hp.n_altup:
        raise ModelError(f"{path}: {k('altup.num_inputs')} = {hp.n_altup} must be >= 2 and "
                         f"{k('altup.active_idx')} = {hp.i_altup_act} below it")
    hp.n_embd_per_layer = model.get_u32(k("embedding_length_per_layer_input"), 256)
    laurel = model.tensors.get("blk.0.laurel_l.weight")
    hp.laurel_rank = int(laurel.ne[1]) if laurel is not None else 64
    if hp.head_dim_k != hp.head_dim_v:
        raise ModelError(f"{path}: gemma3n needs equal K and V head sizes (key_length "
                         f"{hp.head_dim_k}, value_length {hp.head_dim_v})")
    key = k("activation_sparsity_scale")
    if key in model:
        scales = [float(s) for s in model.get(key)]
        if len(scales) != L:
            raise ModelError(f"{path}: {key} has {len(scales)} entries for {L} layers")
        hp.ffn_sparsity = [s if math.isfinite(s) else None for s in scales]
    else:
        hp.ffn_sparsity = [SPARSITY_STD_MUL if il < SPARSE_LAYERS else None for il in range(L)]
    read_shared_kv(model, hp, path, default=max(L - KV_FROM_START, 0))


def _model_tensors(hp) -> dict:
    E, A, P, L = hp.n_embd, hp.n_altup, hp.n_embd_per_layer, hp.n_layer
    return {"altup_proj.weight": [E, E, A - 1], "altup_unembd_proj.weight": [E, E, A - 1],
            "per_layer_token_embd.weight": [P * L, hp.n_vocab],
            "per_layer_model_proj.weight": [E, P * L], "per_layer_proj_norm.weight": [P]}


def _layer_tensors(hp, il):
    E, D, A, P, R = hp.n_embd, hp.head_k(il), hp.n_altup, hp.n_embd_per_layer, hp.laurel_rank
    # every layer has K and V projections, also those that read another layer's cache
    return {**attn_shapes(hp, il), "attn_q_norm": [D], "attn_k_norm": [D],
            "post_attention_norm": [E], **ffn_shapes(hp, il), "post_ffw_norm": [E],
            "inp_gate": [E, P], "proj": [P, E], "post_norm": [E],
            "altup_correct_coef": [A, A], "altup_correct_scale": [E],
            "altup_predict_coef": [A, A * A], "altup_router": [E, A], "altup_router_norm": [E],
            "laurel_l": [E, R], "laurel_r": [R, E], "laurel_post_norm": [E]}


# ---- AltUp helpers: x [E, T, A] holds the A copies of the stream -----------------------------

def _copy(ctx, x, j):
    """Copy j of x [E, T, A] as a view [E, T]."""
    return ops.view_2d(ctx, x, x.ne[0], x.ne[1], x.nb[1], j * x.nb[2])


def _copies_from_1(ctx, x):
    """Copies 1..A-1 of x [E, T, A] as a view [E, T, A-1]."""
    return ops.view_3d(ctx, x, x.ne[0], x.ne[1], x.ne[2] - 1, x.nb[1], x.nb[2], x.nb[2])


def _repeat(ctx, x, n):
    """x [E, T] repeated n times along ne[2]: [E, T, n]."""
    out = x
    for _ in range(n - 1):
        out = ops.concat(ctx, out, x, 2)
    return out


def _magnitude(ctx, x):
    """The L2 norm of each row of x: [1, ...]."""
    return ops.sqrt(ctx, ops.sum_rows(ctx, ops.sqr(ctx, x)))


def _rescaled(ctx, y, like):
    """y [E, T, n] with each row scaled to the magnitude of like's row [E, T] of its token."""
    return ops.div(ctx, ops.mul(ctx, y, _magnitude(ctx, like)), _magnitude(ctx, y))


def prepare(b, x):
    """Per-layer inputs (Gemma 4's), then the A copies of the scaled embeddings x [E, T]:
    F32 [E, T, A]."""
    ctx, A = b.ctx, b.hp.n_altup
    x = gemma4.prepare(b, x)
    # AltUp's projections and router are plain matmuls in llama.cpp (no LoRA), the
    # coefficient and LAuReL matrices go through b.mm as every other weight
    added = ops.mul_mat(ctx, b.weights["altup_proj.weight"], _repeat(ctx, x, A - 1))
    return ops.concat(ctx, x, _rescaled(ctx, added, x), 2, name="inp_stacked")


def _modalities(b, il, x):
    """The router's per-token mix F32 [A, T] of x [E, T]."""
    ctx = b.ctx
    r = ops.scale(ctx, b.norm(x, b.w(il, "altup_router_norm")), 1.0 / b.hp.n_embd)
    return ops.tanh(ctx, ops.mul_mat(ctx, b.w(il, "altup_router"), r))


def _predict(b, il, x):
    """x [E, T, A] + each copy mixed from all copies by the router's coefficients of the active
    one: [E, T, A]."""
    ctx, A, T = b.ctx, b.hp.n_altup, b.T
    coefs = b.mm(b.w(il, "altup_predict_coef"),
                 _modalities(b, il, _copy(ctx, x, b.hp.i_altup_act)))            # [A*A, T]
    coefs = ops.reshape_3d(ctx, coefs, A, A, T)
    xt = ops.cont(ctx, ops.permute(ctx, x, 1, 2, 0, 3))                           # [A, E, T]
    p = ops.cont(ctx, ops.permute(ctx, ops.mul_mat(ctx, xt, coefs), 0, 2, 1, 3))  # [E, T, A]
    return ops.add(ctx, p, x, name=f"predictions-{il}")


def _correct(b, il, pred, out):
    """pred [E, T, A] + (out - the active prediction) · (router coefficients of out + 1)."""
    ctx, A, T = b.ctx, b.hp.n_altup, b.T
    innovation = ops.sub(ctx, out, _copy(ctx, pred, b.hp.i_altup_act))            # [E, T]
    c = b.mm(b.w(il, "altup_correct_coef"), _modalities(b, il, out))             # [A, T]
    c = ops.cont(ctx, ops.transpose(ctx, ops.scale(ctx, c, 1.0, 1.0)), ne=[1, T, A])
    return ops.add(ctx, ops.mul(ctx, _repeat(ctx, innovation, A), c), pred,
                   name=f"corrected-{il}")


def _unembed(b, x):
    """The A copies x [E, T, A] merged into one stream [E, T]."""
    ctx, A = b.ctx, b.hp.n_altup
    u = ops.mul_mat(ctx, b.weights["altup_unembd_proj.weight"], _copies_from_1(ctx, x))
    u = _rescaled(ctx, u, _copy(ctx, x, b.hp.i_altup_act))                       # [E, T, A-1]
    cur = _copy(ctx, x, 0)
    for j in range(A - 1):
        cur = ops.add(ctx, cur, _copy(ctx, u, j))
    return ops.scale(ctx, cur, 1.0 / A, name="unembd_merged")


def _gaussian_top_k(ctx, g, std_mul):
    """relu(g - (mean + std_mul · std)) per row of g [F, T] (std over F - 1)."""
    n = g.ne[0]
    mean = ops.scale(ctx, ops.sum_rows(ctx, g), 1.0 / n)
    var = ops.scale(ctx, ops.sum_rows(ctx, ops.sqr(ctx, ops.sub(ctx, g, mean))), 1.0 / (n - 1))
    cutoff = ops.add(ctx, mean, ops.scale(ctx, ops.sqrt(ctx, var), std_mul))
    return ops.clamp(ctx, ops.sub(ctx, g, cutoff), 0.0, math.inf)     # relu


def build_layer(b, il, x):
    ctx, hp, T = b.ctx, b.hp, b.T
    D, Hkv = hp.head_k(il), hp.n_head_kv[il]
    pred = _predict(b, il, x)
    active = _copy(ctx, pred, hp.i_altup_act)                                     # [E, T]
    cur = b.norm(active, b.w(il, "attn_norm"), f"attn_norm-{il}")
    laurel = b.mm(b.w(il, "laurel_r"), b.mm(b.w(il, "laurel_l"), cur))
    laurel = ops.add(ctx, b.norm(laurel, b.w(il, "laurel_post_norm")), cur,
                     name=f"laurel_out-{il}")
    q, k, v = b.qkv(il, cur)           # k, v unused (not in the graph) on shared-KV layers
    q = b.rope(il, b.norm(q, b.w(il, "attn_q_norm"), f"q_norm-{il}"), f"q_rope-{il}",
               factors=False)
    if hp.kv_layer(il) == il:
        k = b.rope(il, b.norm(k, b.w(il, "attn_k_norm"), f"k_norm-{il}"), f"k_rope-{il}",
                   factors=False)
        v = ops.rms_norm(ctx, ops.reshape_3d(ctx, v, D, Hkv, T), hp.rms_eps, name=f"v_norm-{il}")
        o = b.attention(il, q, k, ops.reshape_2d(ctx, v, D * Hkv, T), hp.attn_scale)
    else:
        o = b.attention(il, q, None, None, hp.attn_scale)
    cur = b.norm(b.attn_out(il, o), b.w(il, "post_attention_norm"), f"attn_post_norm-{il}")
    cur = ops.add(ctx, cur, active, name=f"attn_gated-{il}")
    attn_laurel = ops.scale(ctx, ops.add(ctx, cur, laurel), 1.0 / math.sqrt(2.0),
                            name=f"attn_laurel-{il}")
    s = hp.ffn_sparsity[il]
    cur = b.ffn(il, b.norm(attn_laurel, b.w(il, "ffn_norm"), f"ffn_norm-{il}"), act="gelu",
                gate_fn=None if s is None else (lambda g: _gaussian_top_k(ctx, g, s)))
    cur = b.norm(cur, b.w(il, "post_ffw_norm"), f"ffn_post_norm-{il}")
    out = ops.add(ctx, cur, attn_laurel, name=f"attn_ffw_laurel_gated-{il}")
    corrected = _correct(b, il, pred, out)
    first = ops.mul(ctx, _copy(ctx, corrected, hp.i_altup_act), b.w(il, "altup_correct_scale"))
    first = gemma4.per_layer_out(b, il, first, select_rows=False)
    # copies 1.. get the per-layer branch (copy 0, not the active one: as llama.cpp and HF)
    rest = ops.add(ctx, _copies_from_1(ctx, corrected), first)
    x = ops.concat(ctx, _copy(ctx, corrected, 0), rest, 2, name=f"l_out-{il}")
    if il == hp.n_layer - 1:
        (x,) = b.last_rows(il, _unembed(b, x))
    return x


ARCHS = (
    Arch(name="gemma3n", rope_neox=True, read_hparams=_read, layer_tensors=_layer_tensors,
         build_layer=build_layer, model_tensors=_model_tensors, prepare=prepare),
)
