"""Transformer graph builders for gemma3, llama and qwen2, from GGUF metadata only
(formats-and-models.md §3.5 and §4). One function builds the graph of one ubatch; the
architectures differ in a handful of switches, kept together here so the shared path is read once.

Shapes (ggml order): T tokens in the ubatch, E = n_embd, D = head size, H / Hkv heads,
n_kv = KV cells read (n_kv_swa in the sliding-window cell space), n_out = rows whose logits are
wanted.
"""

from __future__ import annotations

from dataclasses import dataclass

from pyggml import ops
from pyggml.context import Context
from pyggml.errors import ModelError
from pyggml.graph import Graph
from pyggml.tensor import Tensor
from pyggml.types import ROPE_MODE_NEOX, ROPE_MODE_NORMAL, GGMLType, row_size

# graph capacity: ~40 nodes per layer plus inputs and output
def graph_size(n_layer: int) -> int:
    return 64 * n_layer + 256


@dataclass(frozen=True)
class GraphParams:
    """Everything that decides a ubatch graph's topology: equal params → the graph is reused."""
    n_tokens: int
    n_outputs: int
    n_kv: int
    n_kv_swa: int = 0     # cells read by sliding-window layers when they have their own space


@dataclass
class GraphInputs:
    """The INPUT tensors of a built graph, written before each compute."""
    tokens: Tensor        # I32 [T]
    pos: Tensor           # I32 [T]
    kv_idxs: Tensor | None      # I32 [T]: each token's cell in the full space
    kv_idxs_swa: Tensor | None  # I32 [T]: each token's cell in the sliding-window space
    mask: Tensor | None       # F16 [n_kv, T] (None when every layer is sliding-window)
    mask_swa: Tensor | None   # F16 [n_kv of the SWA layers' space, T] (None without SWA layers)
    out_ids: Tensor | None  # I32 [n_out]: ubatch rows whose logits are wanted (None: all rows)


REQUIRED_LAYER_TENSORS = {
    "gemma3": ("attn_norm", "attn_q", "attn_k", "attn_v", "attn_output", "attn_q_norm",
               "attn_k_norm", "post_attention_norm", "ffn_norm", "ffn_gate", "ffn_up", "ffn_down",
               "post_ffw_norm"),
    "llama": ("attn_norm", "attn_q", "attn_k", "attn_v", "attn_output", "ffn_norm", "ffn_gate",
              "ffn_up", "ffn_down"),
    "qwen2": ("attn_norm", "attn_q", "attn_k", "attn_v", "attn_output", "ffn_norm", "ffn_gate",
              "ffn_up", "ffn_down"),
}


def check_weights(hp, weights: dict, path) -> None:
    """Every tensor the graph needs is present with the shape the metadata implies."""
    E, D, Dv = hp.n_embd, hp.head_dim_k, hp.head_dim_v

    def need(name, ne):
        t = weights.get(name)
        if t is None:
            raise ModelError(f"{path}: missing tensor '{name}' (architecture {hp.arch})")
        got = list(t.ne[: len(ne)])
        if got != list(ne) or any(x != 1 for x in t.ne[len(ne):]):
            raise ModelError(f"{path}: tensor '{name}' has shape {list(t.ne[:t.n_dims])}, "
                             f"expected {list(ne)}")

    need("token_embd.weight", [E, hp.n_vocab])
    need("output_norm.weight", [E])
    if not hp.tied_output:
        need("output.weight", [E, hp.n_vocab])
    for il in range(hp.n_layer):
        H, Hkv, F = hp.n_head[il], hp.n_head_kv[il], hp.n_ff[il]
        shapes = {"attn_norm": [E], "attn_q": [E, H * D], "attn_k": [E, Hkv * D],
                  "attn_v": [E, Hkv * Dv], "attn_output": [H * Dv, E], "attn_q_norm": [D],
                  "attn_k_norm": [D], "post_attention_norm": [E], "ffn_norm": [E],
                  "ffn_gate": [E, F], "ffn_up": [E, F], "ffn_down": [F, E], "post_ffw_norm": [E]}
        for short in REQUIRED_LAYER_TENSORS[hp.arch]:
            need(f"blk.{il}.{short}.weight", shapes[short])


def _bias(ctx, x, weights, name):
    b = weights.get(name)
    return ops.add(ctx, x, b) if b is not None else x


def build_graph(hp, weights: dict, kv, gp: GraphParams, flash_attn: bool = True,
                select_outputs: bool = True):
    """The graph of one ubatch: (graph, inputs, logits F32 [V, n_out]). select_outputs: pick
    the output rows with inp_out_ids (every graph of a model must agree on it, so that all ubatch
    graphs share one topology and one allocation plan); False only when every row is wanted."""
    E, D, Dv = hp.n_embd, hp.head_dim_k, hp.head_dim_v
    T = gp.n_tokens
    spaces = set(kv.layer_space)
    # n_kv_swa 0: the whole sliding-window space (the worst case, for planning)
    n_kv_of = {"full": gp.n_kv,
               "swa": gp.n_kv_swa or (kv.spaces["swa"].n_cells if "swa" in kv.spaces else 0)}
    swa_space = next((kv.layer_space[il] for il in range(hp.n_layer) if hp.layer_is_swa(il)),
                     "full")
    ctx = Context(no_alloc=True, name="graph")
    g = Graph(size=graph_size(hp.n_layer))
    inp = GraphInputs(
        tokens=ctx.new_tensor_1d(GGMLType.I32, T, name="inp_tokens").set_input(),
        pos=ctx.new_tensor_1d(GGMLType.I32, T, name="inp_pos").set_input(),
        kv_idxs=(ctx.new_tensor_1d(GGMLType.I32, T, name="inp_kv_idxs").set_input()
                 if "full" in spaces else None),
        kv_idxs_swa=(ctx.new_tensor_1d(GGMLType.I32, T, name="inp_kv_idxs_swa").set_input()
                     if "swa" in spaces else None),
        mask=(ctx.new_tensor_2d(GGMLType.F16, gp.n_kv, T, name="inp_kq_mask").set_input()
              if not all(hp.layer_is_swa(il) for il in range(hp.n_layer)) else None),
        mask_swa=(ctx.new_tensor_2d(GGMLType.F16, n_kv_of[swa_space], T,
                                    name="inp_kq_mask_swa").set_input()
                  if any(hp.layer_is_swa(il) for il in range(hp.n_layer)) else None),
        out_ids=(ctx.new_tensor_1d(GGMLType.I32, gp.n_outputs, name="inp_out_ids").set_input()
                 if select_outputs else None),
    )
    gemma = hp.arch == "gemma3"
    x = ops.get_rows(ctx, weights["token_embd.weight"], inp.tokens, name="inp_embd")
    if gemma:
        x = ops.scale(ctx, x, hp.embd_scale, name="inp_scaled")
    rope_mode = ROPE_MODE_NEOX if hp.rope_neox else ROPE_MODE_NORMAL
    rope_ff = weights.get("rope_freqs.weight")

    def norm(t, w, name):
        return ops.mul(ctx, ops.rms_norm(ctx, t, hp.rms_eps), w, name=name)

    for il in range(hp.n_layer):
        W = lambda short: weights[f"blk.{il}.{short}.weight"]       # noqa: E731
        H, Hkv = hp.n_head[il], hp.n_head_kv[il]
        swa = hp.layer_is_swa(il)
        cur = norm(x, W("attn_norm"), f"attn_norm-{il}")
        q = _bias(ctx, ops.mul_mat(ctx, W("attn_q"), cur), weights, f"blk.{il}.attn_q.bias")
        k = _bias(ctx, ops.mul_mat(ctx, W("attn_k"), cur), weights, f"blk.{il}.attn_k.bias")
        v = _bias(ctx, ops.mul_mat(ctx, W("attn_v"), cur), weights, f"blk.{il}.attn_v.bias")
        q = ops.reshape_3d(ctx, q, D, H, T)
        k = ops.reshape_3d(ctx, k, D, Hkv, T)
        if gemma:
            q = norm(q, W("attn_q_norm"), f"q_norm-{il}")
            k = norm(k, W("attn_k_norm"), f"k_norm-{il}")
        base = hp.rope_base_swa if (gemma and swa) else hp.rope_base
        fscale = 1.0 if (gemma and swa) else hp.rope_freq_scale
        q = ops.rope_ext(ctx, q, inp.pos, rope_ff, n_dims=hp.n_rot, mode=rope_mode,
                         n_ctx_orig=hp.n_ctx_train, freq_base=base, freq_scale=fscale,
                         name=f"q_rope-{il}")
        k = ops.rope_ext(ctx, k, inp.pos, rope_ff, n_dims=hp.n_rot, mode=rope_mode,
                         n_ctx_orig=hp.n_ctx_train, freq_base=base, freq_scale=fscale,
                         name=f"k_rope-{il}")
        kq_scale = 1.0
        if gemma:
            q = ops.scale(ctx, q, hp.attn_scale, name=f"q_scaled-{il}")
        else:
            kq_scale = hp.attn_scale
        # write this ubatch's K and V into the cache cells (expanded now: runs before attention)
        ck, cv = kv.k[il], kv.v[il]
        idxs = inp.kv_idxs_swa if kv.layer_space[il] == "swa" else inp.kv_idxs
        n_kv = n_kv_of[kv.layer_space[il]]
        g.build_forward_expand(ops.set_rows(ctx, ck, ops.reshape_2d(ctx, k, D * Hkv, T),
                                            idxs, name=f"k_store-{il}"))
        g.build_forward_expand(ops.set_rows(ctx, cv, ops.reshape_2d(ctx, v, Dv * Hkv, T),
                                            idxs, name=f"v_store-{il}"))
        # heads within a cell's row: one head is row_size(D) bytes (blocks, for quantized caches)
        kview = ops.view_3d(ctx, ck, D, n_kv, Hkv, ck.nb[1], row_size(ck.type, D), 0,
                            name=f"k_view-{il}")
        vview = ops.view_3d(ctx, cv, Dv, n_kv, Hkv, cv.nb[1], row_size(cv.type, Dv), 0,
                            name=f"v_view-{il}")
        qp = ops.permute(ctx, q, 0, 2, 1, 3)                       # [D, T, H]
        mask = inp.mask_swa if swa else inp.mask
        if flash_attn:
            o = ops.flash_attn_ext(ctx, qp, kview, vview, mask, scale=kq_scale,
                                   name=f"fattn-{il}")           # [Dv, H, T]
            o = ops.reshape_2d(ctx, o, Dv * H, T)
        else:
            kq = ops.mul_mat(ctx, kview, qp, name=f"kq-{il}")    # [n_kv, T, H]
            kq = ops.soft_max_ext(ctx, kq, mask, scale=kq_scale, name=f"kq_soft_max-{il}")
            vt = ops.cont(ctx, ops.permute(ctx, vview, 1, 0, 2, 3))   # [n_kv, Dv, Hkv]
            o = ops.mul_mat(ctx, vt, kq, name=f"kqv-{il}")       # [Dv, T, H]
            o = ops.cont(ctx, ops.permute(ctx, o, 0, 2, 1, 3))    # [Dv, H, T]
            o = ops.reshape_2d(ctx, o, Dv * H, T)
        cur = _bias(ctx, ops.mul_mat(ctx, W("attn_output"), o, name=f"attn_out-{il}"),
                    weights, f"blk.{il}.attn_output.bias")
        if gemma:
            cur = norm(cur, W("post_attention_norm"), f"attn_post_norm-{il}")
        if il == hp.n_layer - 1 and inp.out_ids is not None:
            # only the rows whose logits are wanted go on (llama.cpp's inp_out_ids)
            cur = ops.get_rows(ctx, cur, inp.out_ids)
            x = ops.get_rows(ctx, x, inp.out_ids)
        x = ops.add(ctx, x, cur, name=f"ffn_inp-{il}")
        cur = norm(x, W("ffn_norm"), f"ffn_norm-{il}")
        gate = ops.mul_mat(ctx, W("ffn_gate"), cur, name=f"ffn_gate-{il}")
        up = ops.mul_mat(ctx, W("ffn_up"), cur, name=f"ffn_up-{il}")
        act = ops.gelu(ctx, gate) if gemma else ops.silu(ctx, gate)
        cur = ops.mul_mat(ctx, W("ffn_down"), ops.mul(ctx, act, up), name=f"ffn_out-{il}")
        if gemma:
            cur = norm(cur, W("post_ffw_norm"), f"ffn_post_norm-{il}")
        if il == hp.n_layer - 1:
            # the sum takes the memory of its first source in place: putting `cur` first moves
            # the residual stream off its early offset, so the big logits tensor can sit low
            # (2-4 MiB less compute buffer with logits for every position)
            x = ops.add(ctx, cur, x, name=f"l_out-{il}")
        else:
            x = ops.add(ctx, x, cur, name=f"l_out-{il}")

    x = norm(x, weights["output_norm.weight"], "result_norm")
    # a tied output matrix placed on a device gets its own copy there, named output.weight
    out_w = weights.get("output.weight", weights["token_embd.weight"])
    logits = ops.mul_mat(ctx, out_w, x, name="result_output")
    if hp.final_softcap:
        logits = ops.scale(ctx, ops.tanh(ctx, ops.scale(ctx, logits, 1.0 / hp.final_softcap)),
                           hp.final_softcap)
    logits.set_output()
    g.build_forward_expand(logits)
    return g, inp, logits
