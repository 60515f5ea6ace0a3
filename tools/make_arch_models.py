"""Small random-weight GGUF models, one per architecture variant pyggml runs, written with the
`gguf` package's GGUFWriter under the metadata keys and tensor names llama.cpp's converter
(convert_hf_to_gguf.py) writes. Deterministic: a variant's bytes depend only on its spec (fixed
seeds), so tests regenerate them instead of committing them (tests/test_llm_archs.py) and the
references llama.cpp computed on them (tools/make_arch_refs.py → tests/data/arch_refs.npz) stay
valid.

    python tools/make_arch_models.py OUT_DIR [VARIANT ...]     # default: every variant

Shapes: E = 256, head size 64, 4 query heads over 2 K/V heads, F = 3E, V = 384 tokens, 2-4
layers (gemma3n 22: its KV sharing starts at layer 20); MoE variants 4-8 experts with top-k 2-3. Weight types: a mix per variant over the block
formats (K-quants Q2_K..Q6_K, Q4_0/Q4_1/Q5_0/Q5_1/Q8_0, F16, BF16), quantized by pyggml's own
bit-exact quantizers (pyggml.quants); 1-D tensors (norms, rope factors) F32. Every quantized row
length is a multiple of 256, so no type falls back; rows of other lengths (gemma3n's AltUp
coefficients, 4, and laurel_r, 64) are F32 / Q8_0.
"""

from __future__ import annotations

import math
import sys
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

import gguf
from gguf import GGMLQuantizationType as QT

SPACE = "\u2581"
N_VOCAB = 384
# the fixed token sequence the references are computed for (ids in the normal-token range)
TOKENS = [int(t) for t in np.random.default_rng(1234).integers(260, N_VOCAB, 24)]


@dataclass(frozen=True)
class Spec:
    """One variant: its architecture, shapes, weight-type mix and extra metadata/tensors."""
    arch: str
    types: tuple                     # weight types assigned round-robin over the 2-D/3-D weights
    n_layer: int = 2
    n_embd: int = 256
    n_head: int = 4
    n_head_kv: int = 2
    head_dim: int = 64
    n_ff: int = 768
    n_expert: int = 0
    n_expert_used: int = 0
    n_ff_exp: int = 0
    n_ff_shexp: int = 0
    tied: bool = False               # no output.weight
    qk_norm: str = ""                # "head": [D] (qwen3, gemma3); "row": [H*D] (olmo2, olmoe)
    post_norms: bool = False         # post_attention_norm / post_ffw_norm (gemma2, olmo2)
    pre_norms: bool = True           # attn_norm / ffn_norm (not olmo2)
    fused_qkv: bool = False          # attn_qkv (phi3)
    fused_up: bool = False           # ffn_up [E, 2F] gate|up (phi3)
    qkv_bias: bool = False
    rope_freqs: bool = False         # llama 3
    longrope: bool = False           # phi3 rope_factors_long / short
    kv: dict = field(default_factory=dict)    # extra {arch}.* keys (suffix → value)
    seed: int = 0
    oai: bool = False                # gpt-oss: sinks, post-attention norm only, biases everywhere
    exp_type: str = ""               # the experts' type (default: round robin as the others)
    g4: dict = field(default_factory=dict)    # gemma4: its own layout (_gemma4_tensors)
    g3n: dict = field(default_factory=dict)   # gemma3n: its own layout (_gemma3n_tensors)


_K = ("q4_k", "q6_k", "q5_k", "q3_k", "q2_k")
VARIANTS: dict[str, Spec] = {
    "llama3": Spec("llama", ("q4_k", "q2_k", "q3_k", "q6_k"), n_layer=3, tied=True,
                   rope_freqs=True, kv={"rope.freq_base": 500000.0}, seed=1),
    "qwen3": Spec("qwen3", ("q4_k", "q6_k", "q8_0", "q5_k"), n_layer=3, qk_norm="head",
                  kv={"rope.freq_base": 1000000.0}, seed=2),
    "qwen3-yarn": Spec("qwen3", ("q5_k", "q4_0", "q6_k"), qk_norm="head",
                       kv={"rope.freq_base": 1000000.0, "rope.scaling.type": "yarn",
                           "rope.scaling.factor": 4.0,
                           "rope.scaling.original_context_length": 16}, seed=3),
    "phi3": Spec("phi3", ("q5_0", "q8_0", "q4_k", "f16"), n_head_kv=4, fused_qkv=True,
                 fused_up=True, longrope=True,
                 kv={"rope.scaling.original_context_length": 4096,
                     "attention.sliding_window": 2047}, seed=4),
    "phi3-long": Spec("phi3", ("q6_k", "q4_1", "q5_k"), n_head_kv=4, fused_qkv=True,
                      fused_up=True, longrope=True,
                      kv={"rope.scaling.original_context_length": 128,
                          "attention.sliding_window": 131072}, seed=5),
    "gemma2": Spec("gemma2", ("q6_k", "q4_0", "q5_k", "bf16"), n_layer=3, tied=True,
                   post_norms=True,
                   kv={"attention.sliding_window": 8, "attn_logit_softcapping": 2.0,
                       "final_logit_softcapping": 15.0}, seed=6),
    "granite": Spec("granite", ("q3_k", "q4_1", "q8_0", "q6_k"), tied=True,
                    kv={"logit_scale": 2.0, "residual_scale": 0.6, "embedding_scale": 3.0,
                        "attention.scale": 0.015625}, seed=7),
    "olmo2": Spec("olmo2", ("q5_1", "q4_k", "f16", "q2_k"), qk_norm="row", post_norms=True,
                  pre_norms=False, n_head_kv=4, seed=8),
    "mixtral": Spec("llama", ("q4_k", "q5_0", "q6_k"), n_expert=4, n_expert_used=2,
                    n_ff_exp=512, seed=9),
    "qwen3moe": Spec("qwen3moe", ("q4_k", "q8_0", "q3_k", "q6_k"), qk_norm="head", n_expert=8,
                     n_expert_used=3, n_ff_exp=256, kv={"rope.freq_base": 1000000.0}, seed=10),
    "olmoe": Spec("olmoe", ("q5_k", "q4_0", "q6_k"), qk_norm="row", n_head_kv=4, n_expert=8,
                  n_expert_used=2, n_ff_exp=256, seed=11),
    "granitemoe": Spec("granitemoe", ("q4_k", "q6_k", "q8_0"), tied=True, n_expert=6,
                       n_expert_used=2, n_ff_exp=256, n_ff_shexp=512,
                       kv={"logit_scale": 3.0, "residual_scale": 0.7, "embedding_scale": 2.0,
                           "attention.scale": 0.02}, seed=12),
    # issue 32: the non-linear and microscaling types in a dense llama; SmolLM3 (no rope on
    # layer 3), Mistral 3 with YaRN and Llama 4's attention temperature (refs in
    # tests/data/arch_refs_2026.npz)
    "llama-iq4": Spec("llama", ("iq4_xs", "iq4_nl", "mxfp4"), n_layer=3, seed=13),
    # the codebook i-quants (random codes: they have no quantizer without an imatrix), a
    # layer of each kind of weight in each type, the head at Q6_K so that logits keep margins
    "llama-iqgrid": Spec("llama", ("q6_k", "q6_k", "iq3_s", "iq2_xxs", "iq2_xs", "iq2_s",
                                   "iq3_xxs", "iq1_s", "iq1_m", "iq3_s", "iq2_s"),
                         n_layer=3, seed=18),
    # ternary weights (TQ1_0 / TQ2_0, as BitNet-style files carry them)
    "llama-tq": Spec("llama", ("q6_k", "q8_0", "tq1_0", "tq2_0"), n_layer=2, seed=19),
    "smollm3": Spec("smollm3", ("q4_k", "iq4_xs", "q6_k", "iq4_nl"), n_layer=4, tied=True,
                    kv={"rope.freq_base": 5000000.0}, seed=14),
    "mistral3": Spec("mistral3", ("iq4_nl", "q5_k", "mxfp4", "q6_k"), n_layer=3,
                     kv={"rope.freq_base": 1000000.0, "rope.scaling.type": "yarn",
                         "rope.scaling.factor": 4.0,
                         "rope.scaling.original_context_length": 8,
                         "rope.scaling.yarn_beta_fast": 32.0,
                         "rope.scaling.yarn_beta_slow": 1.0,
                         "attention.temperature_scale": 0.5}, seed=15),
    # gpt-oss: MXFP4 experts with biases, attention sinks, every other layer a sliding window
    # of 8 (llama.cpp's pattern 2), YaRN as the released models have it
    "gpt-oss": Spec("gpt-oss", ("q8_0", "f16", "q6_k"), n_layer=4, n_head=8,
                    n_expert=8, n_expert_used=4, n_ff_exp=256, oai=True, qkv_bias=True,
                    exp_type="mxfp4",
                    kv={"rope.freq_base": 150000.0, "rope.scaling.type": "yarn",
                        "rope.scaling.factor": 4.0,
                        "rope.scaling.original_context_length": 64,
                        "attention.sliding_window": 8}, seed=17),
    # Gemma 4 (refs in tests/data/arch_refs_gemma4.npz): 64-wide sliding-window heads beside
    # 128-wide global ones with proportional-rope factors, per-layer FFN widths, a layer whose
    # V is its K, per-layer embeddings, the last two layers on shared KV, output scales,
    # final soft-cap
    "gemma4": Spec("gemma4", ("q4_k", "q6_k", "q8_0", "iq4_xs", "q5_k"), n_layer=4,
                   head_dim=128, n_ff=768, tied=True,
                   g4={"swa": [True, False, True, False], "head_dim_swa": 64,
                       "n_ff": [768, 512, 1024, 768], "per_layer": 256,
                       "shared_kv": 2, "no_v": [1], "out_scale": True},
                   kv={"rope.freq_base": 1000000.0, "rope.freq_base_swa": 10000.0,
                       "attention.sliding_window": 8, "final_logit_softcapping": 30.0},
                   seed=20),
    # Gemma 4 with experts (26B-A4B's layout): the dense FFN beside 8 GeGLU experts (top 2),
    # layer 0 with gate|up fused, per-expert output scales
    "gemma4-moe": Spec("gemma4", ("q6_k", "q8_0", "q4_k", "mxfp4"), n_layer=3, head_dim=128,
                       n_ff=512, tied=True, n_expert=8, n_expert_used=2, n_ff_exp=256,
                       g4={"swa": [True, True, False], "head_dim_swa": 64,
                           "fused_gate_up": [0], "exp_scale": True},
                       kv={"rope.freq_base": 1000000.0, "rope.freq_base_swa": 10000.0,
                           "attention.sliding_window": 8}, seed=21),
    # Gemma 3n (refs in tests/data/arch_refs_gemma3n.npz): 22 layers so that the last two
    # share the KV of layers 18 (sliding-window) and 19 (global), as llama.cpp fixes the
    # sharing to start at layer 20; AltUp with 4 copies (its 3-D projections quantized),
    # LAuReL of rank 64, 256 per-layer dims (llama.cpp's fixed sizes), the Gaussian top-k
    # sparsity on layers 0..9, sliding window 8
    "gemma3n": Spec("gemma3n", ("q4_k", "q6_k", "q8_0", "q5_k", "iq4_xs"), n_layer=22,
                    n_ff=512, tied=True,
                    g3n={"swa": [il % 5 < 4 for il in range(20)] + [True, False],
                         "per_layer": 256, "laurel_rank": 64, "n_altup": 4, "shared_kv": 2,
                         "sparsity": [1.6448533535003662] * 10 + [-math.inf] * 12},
                    kv={"rope.freq_base": 1000000.0, "rope.freq_base_swa": 10000.0,
                        "attention.sliding_window": 8, "final_logit_softcapping": 30.0},
                    seed=22),
}

_QT = {"f32": QT.F32, "f16": QT.F16, "bf16": QT.BF16, "q4_0": QT.Q4_0, "q4_1": QT.Q4_1,
       "q5_0": QT.Q5_0, "q5_1": QT.Q5_1, "q8_0": QT.Q8_0, "q2_k": QT.Q2_K, "q3_k": QT.Q3_K,
       "q4_k": QT.Q4_K, "q5_k": QT.Q5_K, "q6_k": QT.Q6_K, "iq4_nl": QT.IQ4_NL,
       "iq4_xs": QT.IQ4_XS, "mxfp4": QT.MXFP4, "iq2_xxs": QT.IQ2_XXS, "iq2_xs": QT.IQ2_XS,
       "iq2_s": QT.IQ2_S, "iq3_xxs": QT.IQ3_XXS, "iq3_s": QT.IQ3_S, "iq1_s": QT.IQ1_S,
       "iq1_m": QT.IQ1_M, "tq1_0": QT.TQ1_0, "tq2_0": QT.TQ2_0}


GRID_TYPES = ("iq2_xxs", "iq2_xs", "iq2_s", "iq3_xxs", "iq3_s", "iq1_s", "iq1_m")


def _grid_codes(x: np.ndarray, type_: str) -> np.ndarray:
    """A codebook i-quant has no quantizer without an importance matrix: random codes, scales
    and signs (seeded by the data) with one fp16 d per tensor that gives x's standard deviation."""
    import zlib

    from pyggml import quants
    qt = getattr(QT, type_.upper())
    size = gguf.GGML_QUANT_SIZES[qt][1]
    rows, n = int(np.prod(x.shape[:-1])), x.shape[-1]
    rng = np.random.default_rng(zlib.crc32(x.tobytes()))
    b = rng.integers(0, 256, (rows, n // 256, size), dtype=np.uint8)

    def set_d(d):
        h = np.full(b.shape[:2], d, np.float16).view(np.uint16)
        if type_ == "iq1_m":
            sc = b[..., 48:56].copy().view(np.uint16)
            for k in range(4):
                sc[..., k] = (sc[..., k] & 0x0FFF) | (((h >> (4 * k)) & 0xF) << 12)
            b[..., 48:56] = sc.view(np.uint8)
        else:
            b[..., 0:2] = h.view(np.uint8).reshape(*b.shape[:2], 2)
    set_d(1.0)
    std1 = float(quants.dequantize(b.reshape(rows, -1), type_).std())
    set_d(float(x.std()) / std1)
    return b.reshape(*x.shape[:-1], -1)


def _encode(x: np.ndarray, type_: str) -> np.ndarray:
    """float32 rows (last axis) → the array GGUFWriter stores for type_."""
    if type_ in GRID_TYPES:
        return _grid_codes(x, type_)
    if type_ == "f32":
        return x.astype(np.float32)
    if type_ == "f16":
        return x.astype(np.float16)
    if type_ == "bf16":
        from gguf.quants import quantize
        return quantize(x.astype(np.float32), QT.BF16)
    from pyggml import quants
    flat = x.reshape(-1, x.shape[-1]).astype(np.float32)
    q = quants.quantize(flat, type_)
    return q.reshape(*x.shape[:-1], q.shape[-1])


def _llama3_rope_freqs(D: int, base: float) -> np.ndarray:
    """Llama 3.1's rope scaling as factors 1/scale per frequency (the converter's formula):
    factor 8, low_freq_factor 1, high_freq_factor 4, original context 8192."""
    factor, lo, hi, orig = 8.0, 1.0, 4.0, 8192
    freqs = 1.0 / base ** (np.arange(0, D, 2, dtype=np.float64) / D)
    out = []
    for f in freqs:
        wavelen = 2 * math.pi / f
        if wavelen < orig / hi:
            out.append(1.0)
        elif wavelen > orig / lo:
            out.append(factor)
        else:
            smooth = (orig / wavelen - lo) / (hi - lo)
            out.append(1.0 / ((1 - smooth) / factor + smooth))
    return np.asarray(out, np.float32)


def _makers(out: list, rng):
    """mat(name, rows, cols, std=1/sqrt(cols), extra=()): a random matrix with
    ne = [cols, rows, *extra]; vec(name, n, mean=1, std=0.1): a random vector (norm weights);
    both appended to out as (name, float32 array in numpy order)."""
    def mat(name, rows, cols, std=None, extra=()):
        std = std if std is not None else 1.0 / math.sqrt(cols)
        out.append((name, (rng.standard_normal((*extra[::-1], rows, cols)) * std)
                    .astype(np.float32)))

    def vec(name, n, mean=1.0, std=0.1):
        out.append((name, (mean + rng.standard_normal(n) * std).astype(np.float32)))
    return mat, vec


def _gemma3n_tensors(s: Spec, rng) -> list[tuple[str, np.ndarray]]:
    """The tensors of a gemma3n variant, as llama.cpp's gemma3n loader names them."""
    g, E, H, Hkv, D, L, F = s.g3n, s.n_embd, s.n_head, s.n_head_kv, s.head_dim, s.n_layer, s.n_ff
    A, P, R = g["n_altup"], g["per_layer"], g["laurel_rank"]
    out = []
    mat, vec = _makers(out, rng)
    # the branches' post-norm weights at 0.3: with 1.0 the 22 random layers amplify rounding
    # (llama.cpp's own two attention paths then differ by 0.53 RMS in the logits, 0.057 so)
    PN = 0.3
    mat("token_embd.weight", N_VOCAB, E, std=3.0 / math.sqrt(E))
    vec("output_norm.weight", E)
    mat("altup_proj.weight", E, E, extra=(A - 1,))
    mat("altup_unembd_proj.weight", E, E, extra=(A - 1,))
    mat("per_layer_token_embd.weight", N_VOCAB, P * L, std=1.0)
    mat("per_layer_model_proj.weight", P * L, E)
    vec("per_layer_proj_norm.weight", P)
    for il in range(L):
        p = f"blk.{il}."
        vec(p + "attn_norm.weight", E)
        mat(p + "attn_q.weight", H * D, E)
        mat(p + "attn_k.weight", Hkv * D, E)
        mat(p + "attn_v.weight", Hkv * D, E)
        vec(p + "attn_q_norm.weight", D, 0.35, 0.05)     # softmaxes not too sharp
        vec(p + "attn_k_norm.weight", D)
        mat(p + "attn_output.weight", E, H * D)
        vec(p + "post_attention_norm.weight", E, PN)
        vec(p + "ffn_norm.weight", E)
        mat(p + "ffn_gate.weight", F, E)
        mat(p + "ffn_up.weight", F, E)
        mat(p + "ffn_down.weight", E, F)
        vec(p + "post_ffw_norm.weight", E, PN)
        mat(p + "inp_gate.weight", P, E)
        mat(p + "proj.weight", E, P)
        vec(p + "post_norm.weight", E, PN)
        # AltUp's mixing coefficients small: predictions and corrections near identity
        mat(p + "altup_correct_coef.weight", A, A, std=0.2)
        vec(p + "altup_correct_scale.weight", E)
        mat(p + "altup_predict_coef.weight", A * A, A, std=0.2)
        mat(p + "altup_router.weight", A, E, std=4.0 / math.sqrt(E))
        vec(p + "altup_router_norm.weight", E)
        mat(p + "laurel_l.weight", R, E)
        mat(p + "laurel_r.weight", E, R)
        vec(p + "laurel_post_norm.weight", E, PN)
    return out


def _gemma4_tensors(s: Spec, rng) -> list[tuple[str, np.ndarray]]:
    """The tensors of a gemma4 variant, as llama.cpp's gemma4 loader names them."""
    g, E, H, Hkv, L, X = s.g4, s.n_embd, s.n_head, s.n_head_kv, s.n_layer, s.n_expert
    out = []
    mat, vec = _makers(out, rng)

    mat("token_embd.weight", N_VOCAB, E, std=3.0 / math.sqrt(E))
    vec("output_norm.weight", E)
    D = s.head_dim
    # proportional rope: the global layers rotate a quarter of their dims (huge factors stop
    # the rest), as Gemma 4's converter writes rope_freqs
    out.append(("rope_freqs.weight", np.where(np.arange(D // 2) < D // 8, 1.0, 1e30)
                .astype(np.float32)))
    P = g.get("per_layer", 0)
    if P:
        mat("per_layer_token_embd.weight", N_VOCAB, P * L, std=1.0)
        mat("per_layer_model_proj.weight", P * L, E)
        vec("per_layer_proj_norm.weight", P)
    start = L - g.get("shared_kv", 0)
    for il in range(L):
        p = f"blk.{il}."
        Dl = g["head_dim_swa"] if g["swa"][il] else D
        F = g["n_ff"][il] if "n_ff" in g else s.n_ff
        vec(p + "attn_norm.weight", E)
        mat(p + "attn_q.weight", H * Dl, E)
        if il < start:
            mat(p + "attn_k.weight", Hkv * Dl, E)
            if il not in g.get("no_v", ()):
                mat(p + "attn_v.weight", Hkv * Dl, E)
            vec(p + "attn_k_norm.weight", Dl)
        vec(p + "attn_q_norm.weight", Dl, 0.35, 0.05)     # softmaxes not too sharp
        mat(p + "attn_output.weight", E, H * Dl)
        vec(p + "post_attention_norm.weight", E)
        vec(p + "ffn_norm.weight", E)
        mat(p + "ffn_gate.weight", F, E)
        mat(p + "ffn_up.weight", F, E)
        mat(p + "ffn_down.weight", E, F)
        vec(p + "post_ffw_norm.weight", E)
        if X:
            Fx = s.n_ff_exp
            mat(p + "ffn_gate_inp.weight", X, E, std=4.0)
            vec(p + "ffn_gate_inp.scale", E)
            for n in ("pre_ffw_norm_2", "post_ffw_norm_1", "post_ffw_norm_2"):
                vec(p + n + ".weight", E)
            if il in g.get("fused_gate_up", ()):
                mat(p + "ffn_gate_up_exps.weight", 2 * Fx, E, extra=(X,))
            else:
                mat(p + "ffn_gate_exps.weight", Fx, E, extra=(X,))
                mat(p + "ffn_up_exps.weight", Fx, E, extra=(X,))
            mat(p + "ffn_down_exps.weight", E, Fx, extra=(X,))
            if g.get("exp_scale"):
                vec(p + "ffn_down_exps.scale", X, 1.0, 0.3)
        if P:
            mat(p + "inp_gate.weight", P, E)
            mat(p + "proj.weight", E, P)
            vec(p + "post_norm.weight", E)
        if g.get("out_scale"):
            out.append((p + "layer_output_scale.weight",
                        np.array([0.5 + 0.1 * il], np.float32)))
    return out


def tensors_of(s: Spec, rng) -> list[tuple[str, np.ndarray]]:
    """(name, float32 array in numpy order = reversed ne) of every tensor of the variant."""
    if s.g4:
        return _gemma4_tensors(s, rng)
    if s.g3n:
        return _gemma3n_tensors(s, rng)
    E, D, H, Hkv, F = s.n_embd, s.head_dim, s.n_head, s.n_head_kv, s.n_ff
    out = []
    mat, vec = _makers(out, rng)

    # tied: the embeddings are the output matrix too, sized for logits of rms ~3
    mat("token_embd.weight", N_VOCAB, E, std=3.0 / math.sqrt(E) if s.tied else 1.0)
    vec("output_norm.weight", E)
    if not s.tied:
        mat("output.weight", N_VOCAB, E, std=2.0 / math.sqrt(E))
    if s.rope_freqs:
        out.append(("rope_freqs.weight",
                    _llama3_rope_freqs(D, float(s.kv.get("rope.freq_base", 10000.0)))))
    if s.longrope:
        out.append(("rope_factors_long.weight",
                    (1.0 + rng.random(D // 2) * 7.0).astype(np.float32)))
        out.append(("rope_factors_short.weight",
                    (1.0 + rng.random(D // 2) * 0.5).astype(np.float32)))
    for il in range(s.n_layer):
        p = f"blk.{il}."
        if s.pre_norms:
            vec(p + "attn_norm.weight", E)
        if s.fused_qkv:
            mat(p + "attn_qkv.weight", H * D + 2 * Hkv * D, E)
        else:
            mat(p + "attn_q.weight", H * D, E)
            mat(p + "attn_k.weight", Hkv * D, E)
            mat(p + "attn_v.weight", Hkv * D, E)
        if s.qkv_bias:
            for n, w in (("attn_q", H * D), ("attn_k", Hkv * D), ("attn_v", Hkv * D)):
                vec(p + n + ".bias", w, 0.0, 0.1)
        if s.qk_norm == "head":
            vec(p + "attn_q_norm.weight", D)
            vec(p + "attn_k_norm.weight", D)
        elif s.qk_norm == "row":
            vec(p + "attn_q_norm.weight", H * D)
            vec(p + "attn_k_norm.weight", Hkv * D)
        mat(p + "attn_output.weight", E, H * D)
        if s.oai:
            vec(p + "attn_output.bias", E, 0.0, 0.1)
            out.append((p + "attn_sinks.weight", (rng.standard_normal(H) * 2.0)
                        .astype(np.float32)))
        if s.post_norms or s.oai:
            vec(p + "post_attention_norm.weight", E)
        if s.pre_norms and not s.oai:
            vec(p + "ffn_norm.weight", E)
        if s.n_expert:
            X, Fx = s.n_expert, s.n_ff_exp
            mat(p + "ffn_gate_inp.weight", X, E, std=2.0 / math.sqrt(E))
            mat(p + "ffn_gate_exps.weight", Fx, E, extra=(X,))
            mat(p + "ffn_up_exps.weight", Fx, E, extra=(X,))
            mat(p + "ffn_down_exps.weight", E, Fx, extra=(X,))
            if s.oai:
                vec(p + "ffn_gate_inp.bias", X, 0.0, 0.5)
                for n, w in (("ffn_gate_exps", Fx), ("ffn_up_exps", Fx), ("ffn_down_exps", E)):
                    out.append((p + n + ".bias", (rng.standard_normal((X, w)) * 0.1)
                                .astype(np.float32)))
            if s.n_ff_shexp:
                mat(p + "ffn_gate_shexp.weight", s.n_ff_shexp, E)
                mat(p + "ffn_up_shexp.weight", s.n_ff_shexp, E)
                mat(p + "ffn_down_shexp.weight", E, s.n_ff_shexp)
        elif s.fused_up:
            mat(p + "ffn_up.weight", 2 * F, E)
            mat(p + "ffn_down.weight", E, F)
        else:
            mat(p + "ffn_gate.weight", F, E)
            mat(p + "ffn_up.weight", F, E)
            mat(p + "ffn_down.weight", E, F)
        if s.post_norms:
            vec(p + "post_ffw_norm.weight", E)
    return out


def _vocab(n_vocab: int = N_VOCAB):
    """A SentencePiece ('llama') vocabulary of n_vocab tokens: <unk> <s> </s>, the 256 byte
    tokens, <|endoftext|> (llama.cpp's vocab loader looks it up in Phi-3 models), pieces."""
    tokens = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)] + ["<|endoftext|>"]
    types = [2, 3, 3] + [6] * 256 + [3]
    tokens += [f"{SPACE}w{i}" for i in range(n_vocab - len(tokens))]
    types += [1] * (n_vocab - len(types))
    scores = [0.0] * 260 + [-float(j) for j in range(n_vocab - 260)]
    return tokens, scores, types


def add_vocab(w: gguf.GGUFWriter, n_vocab: int = N_VOCAB, vocab=None,
              add_bos: bool = False) -> None:
    """Write a SentencePiece vocabulary's keys (`vocab` = (tokens, scores, types), default
    _vocab(n_vocab)): <s> = 1 the BOS, </s> = 2 the EOS, <unk> = 0."""
    tokens, scores, types = vocab or _vocab(n_vocab)
    w.add_tokenizer_model("llama")
    w.add_token_list(tokens)
    w.add_token_scores(scores)
    w.add_token_types(types)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_unk_token_id(0)
    w.add_add_bos_token(add_bos)


def write_variant(name: str, path) -> Path:
    """Write variant `name` to `path`; returns the path."""
    s = VARIANTS[name]
    rng = np.random.default_rng(1000 + s.seed)
    path = Path(path)
    w = gguf.GGUFWriter(str(path), s.arch)
    a = s.arch
    w.add_name(f"pyggml-random-{name}")
    w.add_uint32(f"{a}.context_length", 4096)
    w.add_uint32(f"{a}.embedding_length", s.n_embd)
    w.add_uint32(f"{a}.block_count", s.n_layer)
    # llama (mixtral), olmoe, granitemoe: feed_forward_length is the experts' width
    own_exp_key = s.arch in ("qwen3moe", "gpt-oss")
    own_exp_key = own_exp_key or bool(s.g4)
    if "n_ff" in s.g4:
        w.add_array(f"{a}.feed_forward_length", s.g4["n_ff"])
    else:
        w.add_uint32(f"{a}.feed_forward_length",
                     s.n_ff_exp if s.n_expert and not own_exp_key else s.n_ff)
    if s.g4:
        w.add_array(f"{a}.attention.sliding_window_pattern", s.g4["swa"])
        w.add_uint32(f"{a}.attention.key_length_swa", s.g4["head_dim_swa"])
        w.add_uint32(f"{a}.attention.value_length_swa", s.g4["head_dim_swa"])
        w.add_uint32(f"{a}.rope.dimension_count_swa",
                     s.g4.get("n_rot_swa", s.g4["head_dim_swa"]))
        w.add_uint32(f"{a}.embedding_length_per_layer_input", s.g4.get("per_layer", 0))
        if s.g4.get("shared_kv"):
            w.add_uint32(f"{a}.attention.shared_kv_layers", s.g4["shared_kv"])
    if s.g3n:
        g = s.g3n
        w.add_array(f"{a}.attention.sliding_window_pattern", g["swa"])
        w.add_uint32(f"{a}.embedding_length_per_layer_input", g["per_layer"])
        w.add_uint32(f"{a}.altup.active_idx", 0)
        w.add_uint32(f"{a}.altup.num_inputs", g["n_altup"])
        w.add_uint32(f"{a}.attention.shared_kv_layers", g["shared_kv"])
        w.add_array(f"{a}.activation_sparsity_scale", g["sparsity"])
    w.add_uint32(f"{a}.attention.head_count", s.n_head)
    w.add_uint32(f"{a}.attention.head_count_kv", s.n_head_kv)
    w.add_uint32(f"{a}.attention.key_length", s.head_dim)
    w.add_uint32(f"{a}.attention.value_length", s.head_dim)
    w.add_uint32(f"{a}.rope.dimension_count", s.head_dim)
    w.add_float32(f"{a}.attention.layer_norm_rms_epsilon", 1e-6)
    w.add_uint32(f"{a}.vocab_size", N_VOCAB)
    if s.n_expert:
        w.add_uint32(f"{a}.expert_count", s.n_expert)
        w.add_uint32(f"{a}.expert_used_count", s.n_expert_used)
        if own_exp_key:
            w.add_uint32(f"{a}.expert_feed_forward_length", s.n_ff_exp)
        if s.n_ff_shexp:
            w.add_uint32(f"{a}.expert_shared_feed_forward_length", s.n_ff_shexp)
    if s.longrope:
        f = 4096 / s.kv["rope.scaling.original_context_length"]
        w.add_float32(f"{a}.rope.scaling.attn_factor",
                      math.sqrt(1 + math.log(f) / math.log(s.kv[
                          "rope.scaling.original_context_length"])) if f > 1 else 1.0)
    for key, v in s.kv.items():
        if isinstance(v, str):
            w.add_string(f"{a}.{key}", v)
        elif isinstance(v, float):
            w.add_float32(f"{a}.{key}", v)
        else:
            w.add_uint32(f"{a}.{key}", v)
    w.add_file_type(15)             # MOSTLY_Q4_K_M (informational: the types are mixed)
    add_vocab(w)
    k = 0
    for tname, arr in tensors_of(s, rng):
        if arr.ndim == 1 or tname.endswith((".bias", ".scale")):
            w.add_tensor(tname, arr)
            continue
        # the MoE router stays at a high-precision type so that the top-k choice is stable
        t = "f16" if tname.endswith("ffn_gate_inp.weight") else s.types[k % len(s.types)]
        if s.exp_type and "_exps." in tname:
            t = s.exp_type
        elif arr.shape[-1] % 256:
            # gemma3n's rows of 4 (AltUp's coefficients) and 64 (laurel_r)
            t = "f32" if arr.shape[-1] % 32 else "q8_0"
        else:
            k += 1
        data = _encode(arr, t)
        if t in ("f16", "f32"):
            w.add_tensor(tname, data)
        else:
            w.add_tensor(tname, data, raw_shape=data.shape, raw_dtype=_QT[t])
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def rewrite(src, dst, drop_keys=(), drop_tensors=(), rename=None, add_tensor=None,
            set_keys=None) -> Path:
    """A copy of the GGUF src at dst with edits, for the tests of files pyggml refuses: less
    the keys drop_keys and the tensors drop_tensors, tensors renamed by rename {old: new},
    plus add_tensor (name, float32 array) and set_keys {name: uint32 or list} (replacing
    src's); the architecture, the other keys and the tensors' bytes as they were."""
    r = gguf.GGUFReader(str(src))
    arch = r.fields["general.architecture"].contents()
    set_keys = set_keys or {}
    w = gguf.GGUFWriter(str(dst), arch)
    for f in r.fields.values():
        if f.name.startswith("GGUF.") or f.name == "general.architecture" or \
                f.name in drop_keys or f.name in set_keys:
            continue
        t = f.types[0]
        if t == gguf.GGUFValueType.ARRAY:
            w.add_key_value(f.name, f.contents(), t, sub_type=f.types[-1])
        else:
            w.add_key_value(f.name, f.contents(), t)
    for k, v in set_keys.items():
        if isinstance(v, list):
            w.add_array(k, v)
        else:
            w.add_uint32(k, v)
    for t in r.tensors:
        if t.name not in drop_tensors:
            w.add_tensor((rename or {}).get(t.name, t.name), t.data, raw_shape=t.data.shape,
                         raw_dtype=t.tensor_type)
    if add_tensor:
        w.add_tensor(*add_tensor)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return Path(dst)


def main(argv) -> int:
    if not argv:
        print(__doc__)
        return 2
    out = Path(argv[0])
    out.mkdir(parents=True, exist_ok=True)
    (out / "tokens.txt").write_text(" ".join(map(str, TOKENS)) + "\n")
    for name in argv[1:] or VARIANTS:
        p = write_variant(name, out / f"{name}.gguf")
        print(f"{p} ({p.stat().st_size} bytes)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
