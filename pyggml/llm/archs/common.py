"""What every architecture's graph shares: the graph inputs, the KV-cache store and attention,
rope with the model's scaling, the SwiGLU/GeGLU FFN, the output head — as `Builder` methods, so
an architecture module only writes the order of its layer (pyggml/llm/archs/<family>.py); and
the metadata readers several families use (`swa_pattern`).

Shapes (ggml order): T tokens in the ubatch, E = n_embd, D = head size, H / Hkv heads,
n_kv = KV cells read (n_kv_swa in the sliding-window cell space), n_out = rows whose logits are
wanted.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from pyggml import ops
from pyggml.context import Context
from pyggml.errors import ModelError
from pyggml.graph import Graph
from pyggml.tensor import Tensor
from pyggml.types import ROPE_MODE_NEOX, ROPE_MODE_NORMAL, GGMLType, block_size, row_size


def swa_pattern(model, key: str, n_layer: int, default_period: int) -> list[bool]:
    """Sliding-window layers from `key` (llama.cpp's load_swa_pattern): a bool array (one per
    layer) or a period p: layer il slides unless il % p == p - 1 (every p-th layer is dense)."""
    pattern = model.get(key, default_period)
    if isinstance(pattern, (list, tuple)) or hasattr(pattern, "__len__"):
        flags = [bool(x) for x in list(pattern)][:n_layer]
        if len(flags) != n_layer:
            raise ModelError(f"{key}: {len(flags)} entries for {n_layer} layers")
        return flags
    p = int(pattern)
    if p < 1:
        raise ModelError(f"{key} must be >= 1, got {p}")
    return [(il % p) < (p - 1) for il in range(n_layer)]


def read_shared_kv(model, hp, path, default: int = 0) -> None:
    """attention.shared_kv_layers = n (`default` when absent): the last n layers store no K/V,
    each attends the cache of the last layer of its kind before them (llama.cpp's layer reuse
    for Gemma 3n and Gemma 4: layer L - n - 2 for a sliding-window layer, L - n - 1 for a
    global one). Sets hp.kv_source; at least 2 layers must keep a cache, and a layer whose
    source is of the other kind is a ModelError."""
    key = model.arch_key("attention.shared_kv_layers")
    shared = model.get_u32(key, default)
    if not shared:
        return
    L, start = hp.n_layer, hp.n_layer - shared
    if start < 2:
        raise ModelError(f"{path}: {key} = {shared} leaves {start} layers with a KV cache "
                         f"(at least 2 needed)")
    src = {True: start - 2, False: start - 1}
    hp.kv_source = [il if il < start else src[hp.layer_is_swa(il)] for il in range(L)]
    kind = {True: "sliding-window", False: "global"}
    for il in range(start, L):
        s = hp.kv_source[il]
        if hp.layer_is_swa(s) != hp.layer_is_swa(il):
            raise ModelError(f"{path}: layer {il} ({kind[hp.layer_is_swa(il)]}) would share the "
                             f"KV cache of layer {s} ({kind[hp.layer_is_swa(s)]}; "
                             f"{key} = {shared})")


# graph capacity: ~40 nodes per dense layer, ~60 per mixture-of-experts layer, ~100 per Gemma 3n
# layer (AltUp, LAuReL), plus inputs and the output head
def graph_size(n_layer: int) -> int:
    return 128 * n_layer + 256


@dataclass(frozen=True)
class GraphParams:
    """Everything that decides a ubatch graph's topology: equal params → the graph is reused."""
    n_tokens: int
    n_outputs: int
    n_kv: int
    n_kv_swa: int = 0     # cells read by sliding-window layers when they have their own space
    n_rs: int = 0         # sequences in the ubatch (models with recurrent layers; else 0)


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
    rs_ids: Tensor | None = None   # I32 [n_rs]: the ubatch's sequences (recurrent state rows)
    rs_seq: Tensor | None = None   # I32 [T]: each token's index into rs_ids
    attn_temp: Tensor | None = None  # F32 [1, 1, T]: q's temperature per token (hp.attn_temp_scale)


@dataclass(frozen=True, kw_only=True)
class Arch:
    """One architecture (`general.architecture`): how its metadata is read, which tensors it
    needs, and the graph of one layer.

    read_hparams(model, hp): the architecture's own keys into `hp` (the shared ones are read).
    layer_tensors(hp, il): {short name: ne} of the tensors layer il must have
        ('attn_q' → blk.{il}.attn_q.weight).
    build_layer(b, il, x): the residual stream x F32 [E, T] after layer il (on the last layer,
        only the output rows: call `b.last_rows`).
    """
    name: str
    rope_neox: bool
    read_hparams: Callable
    layer_tensors: Callable
    build_layer: Callable
    output_required: bool = False   # no tied output: output.weight must be there
    moe: bool = False               # may have experts (expert_count > 0)
    moe_only: bool = False          # must have experts
    output_norm: str = "output_norm"  # the final norm's tensor (LFM2: token_embd_norm)
    # model_tensors(hp): {full name: ne} of required tensors outside the layers (besides
    # token_embd / output_norm / output)
    model_tensors: Callable | None = None
    # prepare(b, x) -> x: runs once on the embeddings x, before layer 0, and returns the stream
    # layer 0 takes (Gemma 4's per-layer inputs, kept on the Builder; Gemma 3n's AltUp copies)
    prepare: Callable | None = None


def need_tensor(weights: dict, name: str, ne, arch: str, path) -> None:
    """weights[name] exists with shape ne (trailing 1s allowed), else ModelError."""
    t = weights.get(name)
    if t is None:
        raise ModelError(f"{path}: missing tensor '{name}' (architecture {arch})")
    got = list(t.ne[: len(ne)])
    if got != list(ne) or any(x != 1 for x in t.ne[len(ne):]):
        raise ModelError(f"{path}: tensor '{name}' has shape {list(t.ne[:t.n_dims])}, "
                         f"expected {list(ne)}")


def attn_shapes(hp, il: int, fused_qkv: bool = False) -> dict:
    """{short: ne} of a standard attention block (separate or fused Q/K/V)."""
    E, D, Dv = hp.n_embd, hp.head_k(il), hp.head_v(il)
    H, Hkv = hp.n_head[il], hp.n_head_kv[il]
    qkv = ({"attn_qkv": [E, H * D + Hkv * D + Hkv * Dv]} if fused_qkv else
           {"attn_q": [E, H * D], "attn_k": [E, Hkv * D], "attn_v": [E, Hkv * Dv]})
    return {"attn_norm": [E], **qkv, "attn_output": [H * Dv, E]}


def ffn_shapes(hp, il: int) -> dict:
    """{short: ne} of a gated FFN (dense) or of the experts (n_expert > 0)."""
    E = hp.n_embd
    if hp.n_expert:
        F, X = hp.n_ff_exp, hp.n_expert
        d = {"ffn_norm": [E], "ffn_gate_inp": [E, X], "ffn_gate_exps": [E, F, X],
             "ffn_up_exps": [E, F, X], "ffn_down_exps": [F, E, X]}
        if hp.n_ff_shexp:
            S = hp.n_ff_shexp
            d.update({"ffn_gate_shexp": [E, S], "ffn_up_shexp": [E, S],
                      "ffn_down_shexp": [S, E]})
        return d
    F = hp.n_ff[il]
    return {"ffn_norm": [E], "ffn_gate": [E, F], "ffn_up": [E, F], "ffn_down": [F, E]}


def rope_factors(hp, weights: dict, n_ctx: int) -> Tensor | None:
    """The rope frequency factors F32 [n_rot/2]: rope_freqs (Llama 3) or, for LongRoPE (Phi-3),
    the long factors when the context (n_ctx cells) is longer than the original one, else the
    short ones (llama.cpp's get_rope_factors); None without any."""
    if "rope_freqs.weight" in weights:
        return weights["rope_freqs.weight"]
    if n_ctx > hp.n_ctx_orig_yarn and "rope_factors_long.weight" in weights:
        return weights["rope_factors_long.weight"]
    return weights.get("rope_factors_short.weight")


def rotate(ctx, x: Tensor, rot: Tensor) -> Tensor:
    """x (contiguous, ne[0] a multiple of n) times the rotation rot (F32 [n, n], symmetric) in
    blocks of n along ne[0] (llama.cpp's llama_mul_mat_hadamard); same shape as x."""
    n = rot.ne[0]
    y = ops.mul_mat(ctx, rot, ops.reshape_2d(ctx, x, n, x.nelements() // n))
    return ops.reshape(ctx, y, list(x.ne))


class Builder:
    """The graph of one ubatch under construction: context, graph, inputs and the shared
    pieces. `build(arch)` runs the whole model: embeddings → arch.build_layer per layer →
    output head; it returns (graph, inputs, logits F32 [V, n_out])."""

    def __init__(self, hp, weights: dict, kv, gp: GraphParams, flash_attn: bool = True,
                 select_outputs: bool = True, embd_lookup=None, lora=None):
        self.hp, self.weights, self.kv, self.gp = hp, weights, kv, gp
        # the LoRA adapters applied (pyggml.llm.lora.Loras); None: none, the plain graph
        self.lora = lora if lora else None
        self.embd_lookup = weights["token_embd.weight"] if embd_lookup is None else embd_lookup
        self.flash_attn = flash_attn
        T = self.T = gp.n_tokens
        spaces = set(kv.layer_space)
        # n_kv_swa 0: the whole sliding-window space (the worst case, for planning)
        self.n_kv_of = {"full": gp.n_kv,
                        "swa": gp.n_kv_swa or (kv.spaces["swa"].n_cells if "swa" in kv.spaces
                                               else 0)}
        swa_space = next((kv.layer_space[il] for il in range(hp.n_layer) if hp.layer_is_swa(il)),
                         "full")
        ctx = self.ctx = Context(no_alloc=True, name="graph")
        self.g = Graph(size=graph_size(hp.n_layer) +
                       (self.lora.extra_graph_size() if self.lora else 0))
        any_swa = any(hp.layer_is_swa(il) for il in range(hp.n_layer))
        all_swa = all(hp.layer_is_swa(il) for il in range(hp.n_layer))
        self.inp = GraphInputs(
            tokens=ctx.new_tensor_1d(GGMLType.I32, T, name="inp_tokens").set_input(),
            pos=ctx.new_tensor_1d(GGMLType.I32, T, name="inp_pos").set_input(),
            kv_idxs=(ctx.new_tensor_1d(GGMLType.I32, T, name="inp_kv_idxs").set_input()
                     if "full" in spaces else None),
            kv_idxs_swa=(ctx.new_tensor_1d(GGMLType.I32, T, name="inp_kv_idxs_swa").set_input()
                         if "swa" in spaces else None),
            mask=(ctx.new_tensor_2d(GGMLType.F16, gp.n_kv, T, name="inp_kq_mask").set_input()
                  if not all_swa else None),
            mask_swa=(ctx.new_tensor_2d(GGMLType.F16, self.n_kv_of[swa_space], T,
                                        name="inp_kq_mask_swa").set_input()
                      if any_swa else None),
            out_ids=(ctx.new_tensor_1d(GGMLType.I32, gp.n_outputs, name="inp_out_ids").set_input()
                     if select_outputs else None),
        )
        if hp.attn_temp_scale:
            self.inp.attn_temp = ctx.new_tensor_3d(GGMLType.F32, 1, 1, T,
                                                   name="inp_attn_scale").set_input()
        if getattr(kv, "rs_layers", None):     # recurrent layers (pyggml/llm/recurrent.py)
            n_rs = gp.n_rs or min(kv.n_seq_max, T)
            self.inp.rs_ids = ctx.new_tensor_1d(GGMLType.I32, n_rs, name="inp_rs_ids").set_input()
            self.inp.rs_seq = ctx.new_tensor_1d(GGMLType.I32, T, name="inp_rs_seq").set_input()
        self.rope_mode = ROPE_MODE_NEOX if hp.rope_neox else ROPE_MODE_NORMAL
        self.rope_factors = rope_factors(hp, weights, kv.n_ctx)

    # ---- tensors -------------------------------------------------------------------------------
    def w(self, il: int, short: str) -> Tensor:
        """The weight blk.{il}.{short}.weight (checked present by check_weights)."""
        return self.weights[f"blk.{il}.{short}.weight"]

    def opt(self, il: int, short: str, kind: str = "weight") -> Tensor | None:
        return self.weights.get(f"blk.{il}.{short}.{kind}")

    def bias(self, x: Tensor, il: int, short: str) -> Tensor:
        b = self.opt(il, short, "bias")
        return ops.add(self.ctx, x, b) if b is not None else x

    # ---- pieces --------------------------------------------------------------------------------
    def mm(self, w: Tensor, x: Tensor, name: str = "") -> Tensor:
        """mul_mat(w, x) plus the applied LoRA adapters' deltas for w: llama.cpp's
        build_lora_mm, which every weight matmul of a model goes through (pyggml/llm/lora.py).
        w [n_in, n_out], x [n_in, T] → F32 [n_out, T]; the name stays on the plain matmul."""
        y = ops.mul_mat(self.ctx, w, x, name=name)
        return y if self.lora is None else self.lora.mm(self.ctx, w, x, y)

    def norm(self, t: Tensor, w: Tensor, name: str = "") -> Tensor:
        """RMS norm over ne[0] times the weight."""
        return ops.mul(self.ctx, ops.rms_norm(self.ctx, t, self.hp.rms_eps), w, name=name)

    def embed(self) -> Tensor:
        """F32 [E, T]: the token embeddings (scaled by hp.embd_scale when it is not 1)."""
        x = ops.get_rows(self.ctx, self.embd_lookup, self.inp.tokens, name="inp_embd")
        if self.lora is not None:
            x = self.lora.embd(self.ctx, self.inp.tokens, x)
        if self.hp.embd_scale not in (0.0, 1.0):
            x = ops.scale(self.ctx, x, self.hp.embd_scale, name="inp_scaled")
        return x

    def qkv(self, il: int, cur: Tensor, heads: bool = True) -> tuple[Tensor, Tensor, Tensor]:
        """Projections of cur [E, T]: q [D, H, T], k [D, Hkv, T] (heads=False: [H*D, T],
        [Hkv*D, T]), v [Dv*Hkv, T]; from attn_q/k/v (+ optional biases) or a fused attn_qkv
        (rows q | k | v)."""
        ctx, hp, T = self.ctx, self.hp, self.T
        D, Dv, H, Hkv = hp.head_k(il), hp.head_v(il), hp.n_head[il], hp.n_head_kv[il]
        fused = self.opt(il, "attn_qkv")
        if fused is not None:
            qkv = self.bias(self.mm(fused, cur, name=f"wqkv-{il}"), il, "attn_qkv")
            es = row_size(qkv.type, 1)
            q = ops.cont(ctx, ops.view_2d(ctx, qkv, H * D, T, qkv.nb[1], 0))
            k = ops.cont(ctx, ops.view_2d(ctx, qkv, Hkv * D, T, qkv.nb[1], H * D * es))
            v = ops.cont(ctx, ops.view_2d(ctx, qkv, Hkv * Dv, T, qkv.nb[1], (H + Hkv) * D * es))
        else:
            q = self.bias(self.mm(self.w(il, "attn_q"), cur), il, "attn_q")
            k = self.bias(self.mm(self.w(il, "attn_k"), cur), il, "attn_k")
            v = self.bias(self.mm(self.w(il, "attn_v"), cur), il, "attn_v")
        if not heads:
            return q, k, v
        return ops.reshape_3d(ctx, q, D, H, T), ops.reshape_3d(ctx, k, D, Hkv, T), v

    def rope(self, il: int, t: Tensor, name: str, factors: bool = True) -> Tensor:
        """Rotary embedding of t [D, heads, T] at the ubatch positions, with the model's scaling
        (sliding-window layers use their own base and frequency scale)."""
        hp = self.hp
        swa = hp.layer_is_swa(il)
        return ops.rope_ext(self.ctx, t, self.inp.pos, self.rope_factors if factors else None,
                            n_dims=hp.rot(il), mode=self.rope_mode, n_ctx_orig=hp.n_ctx_orig_yarn,
                            freq_base=hp.rope_base_swa if swa else hp.rope_base,
                            freq_scale=hp.rope_freq_scale_swa if swa else hp.rope_freq_scale,
                            ext_factor=hp.rope_ext_factor, attn_factor=hp.rope_attn_factor,
                            beta_fast=hp.rope_beta_fast, beta_slow=hp.rope_beta_slow, name=name)

    def attention(self, il: int, q: Tensor, k: Tensor | None, v: Tensor | None,
                  kq_scale: float, softcap: float = 0.0, sinks: Tensor | None = None) -> Tensor:
        """Store this ubatch's k [D, Hkv, T] and v [Dv*Hkv, T] in the layer's cache cells, then
        attend q [D, H, T] over the cells: softmax(softcap·tanh(q·kᵀ·kq_scale/softcap) + mask)·v.
        sinks: F32 [H], one more logit per head in the softmax (gpt-oss). k and v None: the
        layer reads the cache of hp.kv_layer(il), already written by that layer.
        Returns F32 [Dv*H, T] (before the output projection)."""
        ctx, hp, kv, g, T = self.ctx, self.hp, self.kv, self.g, self.T
        D, Dv, H, Hkv = hp.head_k(il), hp.head_v(il), hp.n_head[il], hp.n_head_kv[il]
        swa = hp.layer_is_swa(il)
        src = hp.kv_layer(il)
        ck, cv = kv.k[src], kv.v[src]
        n_kv = self.n_kv_of[kv.layer_space[src]]
        # a quantized cache holds K and V rotated (llama.cpp's attn_rot_k / attn_rot_v): q
        # with K, so that q·k is unchanged; the output is rotated back with V
        rk, rv = getattr(kv, "rot_k", None), getattr(kv, "rot_v", None)
        rk, rv = (rk[il], rv[il]) if rk is not None else (None, None)
        if rk is not None:
            q = rotate(ctx, q, rk)
            k = rotate(ctx, k, rk) if k is not None else None
        if rv is not None and v is not None:
            v = rotate(ctx, v, rv)
        if k is not None:
            # write this ubatch's K and V into the cache cells (expanded now: runs before
            # attention)
            idxs = self.inp.kv_idxs_swa if kv.layer_space[il] == "swa" else self.inp.kv_idxs
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
        mask = self.inp.mask_swa if swa else self.inp.mask
        if self.flash_attn:
            o = ops.flash_attn_ext(ctx, qp, kview, vview, mask, scale=kq_scale,
                                   logit_softcap=softcap, name=f"fattn-{il}",
                                   sinks=sinks)                                 # [Dv, H, T]
            o = ops.reshape_2d(ctx, o, Dv * H, T)
            return rotate(ctx, o, rv) if rv is not None else o
        kq = ops.mul_mat(ctx, kview, qp, name=f"kq-{il}")        # [n_kv, T, H]
        if softcap:
            # llama.cpp's order without flash attention: cap the raw scores, then scale in
            # the softmax (the models that cap put their scale into q)
            kq = ops.scale(ctx, ops.tanh(ctx, ops.scale(ctx, kq, 1.0 / softcap)), softcap)
        kq = ops.soft_max_ext(ctx, kq, mask, scale=kq_scale, name=f"kq_soft_max-{il}",
                              sinks=sinks)
        if block_size(cv.type) > 1:
            # quantized rows cannot be transposed: dequantized first (llama.cpp refuses a
            # quantized V without flash attention)
            vview = ops.cast(ctx, vview, GGMLType.F32, name=f"v_dequant-{il}")
        vt = ops.cont(ctx, ops.permute(ctx, vview, 1, 0, 2, 3))   # [n_kv, Dv, Hkv]
        o = ops.mul_mat(ctx, vt, kq, name=f"kqv-{il}")           # [Dv, T, H]
        o = ops.cont(ctx, ops.permute(ctx, o, 0, 2, 1, 3))        # [Dv, H, T]
        o = ops.reshape_2d(ctx, o, Dv * H, T)
        return rotate(ctx, o, rv) if rv is not None else o

    def attn_out(self, il: int, o: Tensor) -> Tensor:
        """The output projection of attention (+ optional bias): [E, T]."""
        return self.bias(self.mm(self.w(il, "attn_output"), o, name=f"attn_out-{il}"),
                         il, "attn_output")

    def last_rows(self, il: int, *ts: Tensor) -> tuple[Tensor, ...]:
        """On the last layer, only the rows whose logits are wanted go on (llama.cpp's
        inp_out_ids); elsewhere the tensors unchanged."""
        if il == self.hp.n_layer - 1 and self.inp.out_ids is not None:
            return tuple(ops.get_rows(self.ctx, t, self.inp.out_ids) for t in ts)
        return ts

    def ffn(self, il: int, cur: Tensor, act: str = "silu", shared: bool = False,
            gate_fn: Callable | None = None) -> Tensor:
        """down(act(gate·cur) * up·cur) (+ optional biases): [E, T]. The tensors are ffn_gate /
        ffn_up / ffn_down, or with shared=True the shared expert's ffn_*_shexp. gate_fn(gate)
        transforms the gate projection before the activation (Gemma 3n's sparsity)."""
        ctx = self.ctx
        sfx = "_shexp" if shared else ""
        names = (f"ffn_gate{sfx}", f"ffn_up{sfx}", f"ffn_down{sfx}")
        gate = self.bias(self.mm(self.w(il, names[0]), cur, name=f"ffn_gate{sfx}-{il}"),
                         il, names[0])
        up = self.bias(self.mm(self.w(il, names[1]), cur, name=f"ffn_up{sfx}-{il}"),
                       il, names[1])
        if gate_fn is not None:
            gate = gate_fn(gate)
        a = ops.gelu(ctx, gate) if act == "gelu" else ops.silu(ctx, gate)
        return self.bias(self.mm(self.w(il, names[2]), ops.mul(ctx, a, up),
                                 name=f"ffn_out{sfx}-{il}"), il, names[2])

    def moe(self, il: int, cur: Tensor) -> Tensor:
        """The mixture-of-experts FFN of cur [E, T] (router ffn_gate_inp, experts
        ffn_{gate,up,down}_exps), with the model's gating and weight normalization: [E, T]."""
        from pyggml.llm.moe import moe_ffn
        hp = self.hp
        return moe_ffn(self.ctx, cur, self.w(il, "ffn_gate_inp"), self.w(il, "ffn_up_exps"),
                       self.opt(il, "ffn_gate_exps"), self.w(il, "ffn_down_exps"),
                       hp.n_expert_used, gating=hp.expert_gating, norm_w=hp.expert_norm_w,
                       w_scale=hp.expert_weights_scale, act="silu", name=f"ffn_moe-{il}",
                       lora=self.lora)

    def output(self, x: Tensor) -> Tensor:
        """The head: output norm, output matrix (tied: token_embd), optional bias, Granite's
        logit scale, Gemma's final soft-cap. F32 [V, n_out]."""
        ctx, hp = self.ctx, self.hp
        norm = getattr(self, "arch", None)
        x = self.norm(x, self.weights[f"{norm.output_norm if norm else 'output_norm'}.weight"],
                      "result_norm")
        # a tied output matrix placed on a device gets its own copy there, named output.weight
        out_w = self.weights.get("output.weight", self.weights["token_embd.weight"])
        logits = self.mm(out_w, x, name="result_output")
        if "output.bias" in self.weights:
            logits = ops.add(ctx, logits, self.weights["output.bias"])
        if hp.logit_scale:
            logits = ops.scale(ctx, logits, 1.0 / hp.logit_scale)
        if hp.final_softcap:
            logits = ops.scale(ctx, ops.tanh(ctx, ops.scale(ctx, logits, 1.0 / hp.final_softcap)),
                               hp.final_softcap)
        return logits

    def build(self, arch: Arch):
        self.arch = arch
        x = self.embed()
        if arch.prepare is not None:
            x = arch.prepare(self, x)
        for il in range(self.hp.n_layer):
            x = arch.build_layer(self, il, x)
        logits = self.output(x)
        logits.set_output()
        self.g.build_forward_expand(logits)
        return self.g, self.inp, logits
