"""The mixture-of-experts FFN block, built from pyggml ops the way llama.cpp's
`llm_graph_context::build_moe_ffn` builds it (same ops in the same order, so the numbers agree
with llama.cpp's to its own rounding):

    logits   = mul_mat(gate_inp, x)                       [n_expert, T]
    probs    = soft_max(logits) | sigmoid(logits) | logits (softmax_weight)
    selected = argsort_top_k(probs (+ exp_probs_b), k)     I32 [k, T] (a strided view)
    weights  = get_rows(reshape(probs, [1, n_expert, T]), selected)           [1, k, T]
               (softmax_weight: soft_max over the k selected logits)
               (norm_w: weights / clamp(sum_rows(weights), 2^-14, inf))
               (w_scale: weights * w_scale)
    up, gate = mul_mat_id(up_exps, x, selected), mul_mat_id(gate_exps, x, selected)  [F, k, T]
    experts  = mul_mat_id(down_exps, act(gate) * up, selected)                 [E, k, T]
    out      = sum over the k slots of experts * weights (views + add)         [E, T]

Shapes (ggml order): E = n_embd, F = expert FFN width, T tokens, k = n_expert_used.
"""

from __future__ import annotations

from pyggml import ops
from pyggml.context import Context
from pyggml.tensor import Tensor

GATING = ("softmax", "sigmoid", "softmax_weight")
ACTIVATIONS = ("silu", "gelu", "swiglu_oai")
# gpt-oss's clamped SwiGLU (llama.cpp's LLM_FFN_SWIGLU_OAI_MOE constants)
OAI_ALPHA, OAI_LIMIT = 1.702, 7.0
# the smallest normal fp16: llama.cpp's floor for the sum of the selected weights
WEIGHTS_SUM_MIN = 6.103515625e-5


def moe_ffn(ctx: Context, x: Tensor, gate_inp: Tensor, up_exps: Tensor, gate_exps: Tensor | None,
            down_exps: Tensor, n_expert_used: int, *, gating: str = "softmax",
            norm_w: bool = False, w_scale: float = 0.0, exp_probs_b: Tensor | None = None,
            act: str = "silu", name: str = "ffn_moe", gate_inp_b: Tensor | None = None,
            up_b: Tensor | None = None, gate_b: Tensor | None = None,
            down_b: Tensor | None = None, logits: Tensor | None = None,
            gate_up_exps: Tensor | None = None, up_s: Tensor | None = None,
            gate_s: Tensor | None = None, down_s: Tensor | None = None,
            lora=None) -> Tensor:
    """The MoE FFN of one layer. x: F32 [E, T] (contiguous); gate_inp (the router):
    [E, n_expert]; up_exps, gate_exps: [E, F, n_expert]; down_exps: [F, E, n_expert];
    exp_probs_b: F32 [n_expert] selection bias (added for choosing only). gate_exps None: no
    gate (act(up)). Returns F32 [E, T]. Node names are `name` + llama.cpp's suffixes
    ("-logits", "-probs", "-topk", "-weights", "-up", "-gate", "-down", "-out").
    gpt-oss: gate_inp_b F32 [n_expert] (router bias), up_b / gate_b F32 [F, n_expert] and
    down_b F32 [E, n_expert] (each selected expert's bias, ggml's add_id: here get_rows of the
    bias rows by the selected ids), act "swiglu_oai" (swiglu_oai below).
    Gemma 4: logits F32 [n_expert, T], the router's output computed by the caller (gate_inp
    None); gate_up_exps [E, 2F, n_expert] (gate rows | up rows) in place of up_exps /
    gate_exps; up_s / gate_s / down_s F32 [n_expert]: each expert's output scale (with a fused
    gate_up, up_s scales both halves), llama.cpp's build_lora_mm_id.
    lora: the LoRA adapters applied (pyggml.llm.lora.Loras; None: none): their deltas are
    added to the router's logits (build_lora_mm) and after each expert matmul and its scale,
    before its bias (build_lora_mm_id), as llama.cpp adds them."""
    if gating not in GATING:
        raise ValueError(f"moe_ffn: gating must be one of {', '.join(GATING)}, got {gating!r}")
    if act not in ACTIVATIONS:
        raise ValueError(f"moe_ffn: act must be one of {', '.join(ACTIVATIONS)}, got {act!r}")
    n_embd, n_tokens = x.ne[0], x.ne[1]
    n_expert = gate_inp.ne[1] if logits is None else logits.ne[0]
    k = n_expert_used
    if not 0 < k <= n_expert:
        raise ValueError(f"moe_ffn: n_expert_used={k} must be in [1, n_expert={n_expert}]")

    if logits is None:
        logits = ops.mul_mat(ctx, gate_inp, x, name=f"{name}-logits")        # [n_expert, T]
        if lora:
            logits = lora.mm(ctx, gate_inp, x, logits)
    if gate_inp_b is not None:
        logits = ops.add(ctx, logits, gate_inp_b, name=f"{name}-logits_biased")
    if gating == "softmax":
        probs = ops.soft_max_ext(ctx, logits, name=f"{name}-probs")
    elif gating == "sigmoid":
        probs = ops.sigmoid(ctx, logits, name=f"{name}-probs")
    else:
        probs = logits
    selection = probs if exp_probs_b is None else ops.add(ctx, probs, exp_probs_b,
                                                          name=f"{name}-probs_biased")
    selected = ops.argsort_top_k(ctx, selection, k, name=f"{name}-topk")     # I32 [k, T]

    weights = ops.get_rows(ctx, ops.reshape_3d(ctx, probs, 1, n_expert, n_tokens), selected,
                           name=f"{name}-weights")                            # [1, k, T]
    if gating == "softmax_weight":
        w2 = ops.soft_max_ext(ctx, ops.reshape_2d(ctx, weights, k, n_tokens))
        weights = ops.reshape_3d(ctx, w2, 1, k, n_tokens, name=f"{name}-weights_softmax")
    if norm_w:
        w2 = ops.reshape_2d(ctx, weights, k, n_tokens)
        total = ops.clamp(ctx, ops.sum_rows(ctx, w2), WEIGHTS_SUM_MIN, float("inf"))
        w2 = ops.div(ctx, w2, total, name=f"{name}-weights_norm")              # [k, T]
        weights = ops.reshape_3d(ctx, w2, 1, k, n_tokens)
    if w_scale not in (0.0, 1.0):
        weights = ops.scale(ctx, weights, w_scale, name=f"{name}-weights_scaled")

    x3 = ops.reshape_3d(ctx, x, n_embd, 1, n_tokens)
    ids = None

    def rows_of(b):         # the row of b [n, n_expert] of each slot's expert: [n, k, T]
        nonlocal ids
        if ids is None:
            ids = ops.reshape_1d(ctx, ops.cont(ctx, selected), k * n_tokens)
        return ops.reshape_3d(ctx, ops.get_rows(ctx, b, ids), b.ne[0], k, n_tokens)

    def add_id(t, b):       # t [n, k, T] + the bias row of each slot's expert
        return ops.add(ctx, t, rows_of(b))

    def scaled(t, s):       # t [n, k, T] · each slot's expert's scale (s F32 [n_expert])
        return t if s is None else ops.mul(ctx, t, rows_of(ops.reshape_2d(ctx, s, 1, n_expert)))

    def expert_mm(w, inp, s, part):     # build_lora_mm_id: the matmul, its scale, the LoRAs
        t = scaled(ops.mul_mat_id(ctx, w, inp, selected, name=f"{name}-{part}"), s)
        return lora.mm_id(ctx, w, inp, selected, t) if lora else t

    if gate_up_exps is not None:
        gu = expert_mm(gate_up_exps, x3, up_s, "gate_up")                      # [2F, k, T]
        F = gu.ne[0] // 2
        gate = ops.cont(ctx, ops.view_3d(ctx, gu, F, k, n_tokens, gu.nb[1], gu.nb[2], 0))
        up = ops.cont(ctx, ops.view_3d(ctx, gu, F, k, n_tokens, gu.nb[1], gu.nb[2],
                                       F * gu.nb[0]))
        gate_exps = gate_up_exps
    else:
        up = expert_mm(up_exps, x3, up_s, "up")
        if up_b is not None:
            up = add_id(up, up_b)
    if gate_exps is not None:
        if gate_up_exps is None:
            gate = expert_mm(gate_exps, x3, gate_s, "gate")
        if gate_b is not None:
            gate = add_id(gate, gate_b)
        if act == "swiglu_oai":
            h = swiglu_oai(ctx, gate, up)
        else:
            h = ops.mul(ctx, ops.silu(ctx, gate) if act == "silu" else ops.gelu(ctx, gate), up)
    else:
        h = ops.silu(ctx, up) if act == "silu" else ops.gelu(ctx, up)
    experts = expert_mm(down_exps, h, down_s, "down")                          # [E, k, T]
    if down_b is not None:
        experts = add_id(experts, down_b)
    experts = ops.mul(ctx, experts, weights, name=f"{name}-weighted")

    out = None
    for i in range(k):      # one [E, T] view per slot (rows experts.nb[2] apart), then adds
        v = ops.view_2d(ctx, experts, n_embd, n_tokens, experts.nb[2], i * experts.nb[1])
        out = v if out is None else ops.add(ctx, out, v)
    if k == 1:
        out = ops.cont(ctx, out)        # a contiguous result, as llama.cpp
    out.name = f"{name}-out"
    return out


def swiglu_oai(ctx: Context, gate: Tensor, up: Tensor, alpha: float = OAI_ALPHA,
               limit: float = OAI_LIMIT) -> Tensor:
    """gpt-oss's SwiGLU (ggml_swiglu_oai) from existing ops: x = min(gate, limit),
    y = clamp(up, -limit, limit), x·sigmoid(alpha·x)·(y + 1) (ggml divides by 1 + exp(-alpha·x)
    where this multiplies by the sigmoid: the same value to the last bit or so)."""
    x = ops.clamp(ctx, gate, -float("inf"), limit)
    y = ops.scale(ctx, ops.clamp(ctx, up, -limit, limit), 1.0, 1.0)
    return ops.mul(ctx, ops.mul(ctx, x, ops.sigmoid(ctx, ops.scale(ctx, x, alpha))), y)
