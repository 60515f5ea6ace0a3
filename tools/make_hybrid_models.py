"""Small random-weight GGUF models of the hybrid architectures (recurrent layers beside attention:
LFM2's short convolutions; Qwen 3.5's gated DeltaNet, dense and with experts), written like tools/make_arch_models.py (its vocabulary, encoders and
seeds; llama.cpp's converter's keys and tensor names). Deterministic, so tests regenerate them
(tests/test_llm_hybrid.py) and llama.cpp's references stay valid:

    .venv/bin/python tools/make_hybrid_models.py /tmp/hybrid_models
    /work/ref/llamacpp-venv/bin/python tools/make_arch_refs.py /tmp/hybrid_models \
        tests/data/hybrid_refs.npz

Shapes: E = 256, head size 64, 4 query heads over 2 K/V heads on the attention layers, F = 3E,
V = 384; the convolution layers have attention.head_count_kv 0 (how llama.cpp tells them
apart) and kernel size shortconv.l_cache = 3 (LFM2's). qwen35 / qwen35moe: the same attention
(q carries a per-head gate: attn_q is [E, 2·H·D]) with partial multi-section rope, gated DeltaNet
layers of H_K = 2 key and H_V = 4 value heads of 32 (conv kernel 4), every 4th (dense) or 2nd
(experts: 4 of 128 wide, 2 used, a shared expert of F) layer attention.
"""

from __future__ import annotations

import math
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np

import gguf

sys.path.insert(0, str(Path(__file__).resolve().parent))
import make_arch_models as M  # noqa: E402

# a longer sequence than make_arch_models.TOKENS: checkpoints and chunked prompts get room
TOKENS = [int(t) for t in np.random.default_rng(4321).integers(260, M.N_VOCAB, 40)]


@dataclass(frozen=True)
class Shapes:
    """Layer shapes. The defaults are the test models'; tools/bench_hybrid.py writes a laptop
    model's. Qwen 3.5's linear attention: h_k key heads and h_v value heads of dk
    (ssm.state_size), conv channels 2·h_k·dk + h_v·dk; partial multi-section rope (n_rot of d,
    sections)."""
    e: int = 256                     # embedding
    d: int = 64                      # attention head size
    h: int = 4                       # attention query heads
    hkv: int = 2                     # attention K/V heads
    f: int = 768                     # feed-forward
    h_k: int = 2
    h_v: int = 4
    dk: int = 32
    n_rot: int = 16
    sections: tuple = (3, 3, 2, 0)
    f_exp: int = 128
    n_ctx_train: int = 4096          # context_length


@dataclass(frozen=True)
class Hybrid:
    arch: str
    layers: str                      # per layer: "r" recurrent, "a" attention
    types: tuple                     # quantized matrices take these in turn
    l_cache: int = 3
    seed: int = 0
    experts: int = 0                 # qwen35moe: routed experts (2 used) and a shared one
    shapes: Shapes = Shapes()
    # instead of `types` in turn: the type of each matrix by its tensor name
    type_of: object = None


VARIANTS = {
    "lfm2": Hybrid("lfm2", "rrar", ("q4_k", "q6_k", "q8_0", "q5_k"), seed=40),
    # gated DeltaNet layers every 4th layer attention (full_attention_interval 4)
    "qwen35": Hybrid("qwen35", "rrra", ("q4_k", "q6_k", "q8_0", "q5_k"), l_cache=4, seed=41),
    "qwen35moe": Hybrid("qwen35moe", "rara", ("q8_0", "q4_k", "q6_k"), l_cache=4, seed=42,
                        experts=4),
    # LFM2-8B-A1B's shape: the first layer's FFN dense, experts after it (sigmoid gating with a
    # selection bias, the k weights renormalized)
    "lfm2moe": Hybrid("lfm2moe", "rrar", ("q4_k", "q8_0", "q6_k"), seed=43, experts=4),
}
LFM2MOE_DENSE_LEAD = 1


def tensors_of(s: Hybrid, rng) -> list[tuple[str, np.ndarray]]:
    out = []
    E, D, H, HKV, F = s.shapes.e, s.shapes.d, s.shapes.h, s.shapes.hkv, s.shapes.f

    def mat(name, rows, cols, std=None):
        std = std if std is not None else 1.0 / math.sqrt(cols)
        out.append((name, (rng.standard_normal((rows, cols)) * std).astype(np.float32)))

    def vec(name, n, mean=1.0, std=0.1):
        out.append((name, (mean + rng.standard_normal(n) * std).astype(np.float32)))

    if s.arch.startswith("qwen35"):
        return qwen35_tensors(s, rng, mat, vec, out)
    mat("token_embd.weight", M.N_VOCAB, E, std=1.0)
    vec("token_embd_norm.weight", E)
    mat("output.weight", M.N_VOCAB, E, std=2.0 / math.sqrt(E))
    for il, kind in enumerate(s.layers):
        p = f"blk.{il}."
        vec(p + "attn_norm.weight", E)
        if kind == "r":
            # f32 [K, E] (ne order); the converter keeps the 1-D convolution in f32
            out.append((p + "shortconv.conv.weight",
                        (rng.standard_normal((E, s.l_cache)) / math.sqrt(s.l_cache))
                        .astype(np.float32)))
            mat(p + "shortconv.in_proj.weight", 3 * E, E)
            mat(p + "shortconv.out_proj.weight", E, E)
        else:
            mat(p + "attn_q.weight", H * D, E)
            mat(p + "attn_k.weight", HKV * D, E)
            mat(p + "attn_v.weight", HKV * D, E)
            vec(p + "attn_q_norm.weight", D)
            vec(p + "attn_k_norm.weight", D)
            mat(p + "attn_output.weight", E, H * D)
        vec(p + "ffn_norm.weight", E)
        if s.experts and il >= LFM2MOE_DENSE_LEAD:
            X, F_EXP = s.experts, s.shapes.f_exp
            mat(p + "ffn_gate_inp.weight", X, E)
            for n, rows, cols in (("ffn_gate_exps", F_EXP, E), ("ffn_up_exps", F_EXP, E),
                                  ("ffn_down_exps", E, F_EXP)):
                out.append((p + n + ".weight", (rng.standard_normal((X, rows, cols))
                                                / math.sqrt(cols)).astype(np.float32)))
            vec(p + "exp_probs_b.bias", X, mean=0.0, std=0.5)
            continue
        mat(p + "ffn_gate.weight", F, E)
        mat(p + "ffn_up.weight", F, E)
        mat(p + "ffn_down.weight", E, F)
    return out


def qwen35_tensors(s: Hybrid, rng, mat, vec, out):
    E, D, H, HKV, F = s.shapes.e, s.shapes.d, s.shapes.h, s.shapes.hkv, s.shapes.f
    H_K, H_V, DK, F_EXP = s.shapes.h_k, s.shapes.h_v, s.shapes.dk, s.shapes.f_exp
    mat("token_embd.weight", M.N_VOCAB, E, std=1.0)
    vec("output_norm.weight", E)
    mat("output.weight", M.N_VOCAB, E, std=2.0 / math.sqrt(E))
    C, V = 2 * H_K * DK + H_V * DK, H_V * DK
    for il, kind in enumerate(s.layers):
        p = f"blk.{il}."
        vec(p + "attn_norm.weight", E)
        vec(p + "post_attention_norm.weight", E)
        if kind == "r":
            mat(p + "attn_qkv.weight", C, E)
            mat(p + "attn_gate.weight", V, E)
            out.append((p + "ssm_conv1d.weight",
                        (rng.standard_normal((C, s.l_cache)) / math.sqrt(s.l_cache))
                        .astype(np.float32)))
            vec(p + "ssm_dt.bias", H_V, mean=0.0, std=1.0)
            # -exp(A_log), as the converter stores it
            out.append((p + "ssm_a", (-np.exp(rng.standard_normal(H_V) * 0.5))
                        .astype(np.float32)))
            mat(p + "ssm_beta.weight", H_V, E)
            mat(p + "ssm_alpha.weight", H_V, E)
            vec(p + "ssm_norm.weight", DK)
            mat(p + "ssm_out.weight", E, V)
        else:
            mat(p + "attn_q.weight", 2 * H * D, E)
            mat(p + "attn_k.weight", HKV * D, E)
            mat(p + "attn_v.weight", HKV * D, E)
            vec(p + "attn_q_norm.weight", D)
            vec(p + "attn_k_norm.weight", D)
            mat(p + "attn_output.weight", E, H * D)
        if s.experts:
            X = s.experts
            mat(p + "ffn_gate_inp.weight", X, E)
            for n, rows, cols in (("ffn_gate_exps", F_EXP, E), ("ffn_up_exps", F_EXP, E),
                                  ("ffn_down_exps", E, F_EXP)):
                out.append((p + n + ".weight", (rng.standard_normal((X, rows, cols))
                                                / math.sqrt(cols)).astype(np.float32)))
            vec(p + "ffn_gate_inp_shexp.weight", E, mean=0.0, std=1.0 / math.sqrt(E))
            mat(p + "ffn_gate_shexp.weight", F, E)
            mat(p + "ffn_up_shexp.weight", F, E)
            mat(p + "ffn_down_shexp.weight", E, F)
        else:
            mat(p + "ffn_gate.weight", F, E)
            mat(p + "ffn_up.weight", F, E)
            mat(p + "ffn_down.weight", E, F)
    return out


def write_variant(name: str, path) -> Path:
    return write_model(VARIANTS[name], path, name)


def write_model(s: Hybrid, path, name: str) -> Path:
    E, D, H, HKV, F = s.shapes.e, s.shapes.d, s.shapes.h, s.shapes.hkv, s.shapes.f
    H_K, H_V, DK = s.shapes.h_k, s.shapes.h_v, s.shapes.dk
    rng = np.random.default_rng(1000 + s.seed)
    path = Path(path)
    w = gguf.GGUFWriter(str(path), s.arch)
    a = s.arch
    w.add_name(f"pyggml-random-{name}")
    w.add_uint32(f"{a}.context_length", s.shapes.n_ctx_train)
    w.add_uint32(f"{a}.embedding_length", E)
    w.add_uint32(f"{a}.block_count", len(s.layers))
    w.add_uint32(f"{a}.feed_forward_length", F)
    w.add_uint32(f"{a}.attention.head_count", H)
    if a.startswith("qwen35"):
        w.add_uint32(f"{a}.attention.head_count_kv", HKV)
        w.add_uint32(f"{a}.attention.key_length", D)
        w.add_uint32(f"{a}.attention.value_length", D)
        w.add_uint32(f"{a}.rope.dimension_count", s.shapes.n_rot)
        w.add_array(f"{a}.rope.dimension_sections", list(s.shapes.sections))
        w.add_uint32(f"{a}.full_attention_interval", s.layers.index("a") + 1)
        w.add_uint32(f"{a}.ssm.conv_kernel", s.l_cache)
        w.add_uint32(f"{a}.ssm.inner_size", H_V * DK)
        w.add_uint32(f"{a}.ssm.state_size", DK)
        w.add_uint32(f"{a}.ssm.time_step_rank", H_V)
        w.add_uint32(f"{a}.ssm.group_count", H_K)
        if s.experts:
            w.add_uint32(f"{a}.expert_count", s.experts)
            w.add_uint32(f"{a}.expert_used_count", 2)
            w.add_uint32(f"{a}.expert_feed_forward_length", s.shapes.f_exp)
            w.add_uint32(f"{a}.expert_shared_feed_forward_length", F)
    else:
        w.add_array(f"{a}.attention.head_count_kv", [HKV if k == "a" else 0 for k in s.layers])
        w.add_uint32(f"{a}.rope.dimension_count", D)
    if a == "lfm2moe":
        w.add_uint32(f"{a}.expert_count", s.experts)
        w.add_uint32(f"{a}.expert_used_count", 2)
        w.add_uint32(f"{a}.expert_feed_forward_length", s.shapes.f_exp)
        w.add_uint32(f"{a}.leading_dense_block_count", LFM2MOE_DENSE_LEAD)
        w.add_uint32(f"{a}.expert_gating_func", 2)                  # sigmoid
    w.add_float32(f"{a}.rope.freq_base", 1000000.0)
    w.add_float32(f"{a}.attention.layer_norm_rms_epsilon", 1e-5)
    w.add_uint32(f"{a}.vocab_size", M.N_VOCAB)
    if a.startswith("lfm2"):
        w.add_uint32(f"{a}.shortconv.l_cache", s.l_cache)
    w.add_file_type(15)
    M.add_vocab(w)
    k = 0
    for tname, arr in tensors_of(s, rng):
        if arr.ndim == 1 or arr.shape[-1] % 256:
            w.add_tensor(tname, arr)
            continue
        if s.type_of is not None:
            t = s.type_of(tname)
        else:
            t = s.types[k % len(s.types)]
            k += 1
        data = M._encode(arr, t)
        w.add_tensor(tname, data, raw_shape=data.shape, raw_dtype=M._QT[t])
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def main(argv) -> int:
    if not argv:
        print(__doc__)
        return 2
    out = Path(argv[0])
    out.mkdir(parents=True, exist_ok=True)
    for name in argv[1:] or sorted(VARIANTS):
        print(write_variant(name, out / f"{name}.gguf"))
    (out / "tokens.txt").write_text(" ".join(str(t) for t in TOKENS))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
