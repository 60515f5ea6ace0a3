"""Random-weight GGUFs with the exact tensor shapes and Q4_K_M type mix of two laptop-sized
models, so their speed (which depends on shapes and types, not on values) can be measured
without downloading them (issue 36 item 5). Not for tests.

    .venv/bin/python tools/make_laptop_models.py [llama8b|moe30b ...] [--out DIR]
        (default both, into ~/.cache/pyggml/bench/; a present file is kept)

- llama8b: Llama-3.1-8B (32 layers, n_embd 4096, 32 heads / 8 K/V heads of 128, FFN 14336,
  vocab 128256, rope base 500000 with rope_freqs), 4.58 GiB like the real Q4_K_M (4.92 GB).
- moe30b: Qwen3-30B-A3B (arch qwen3moe: 48 layers, n_embd 2048, 32 heads / 4 K/V heads of 128
  with per-head q/k RMS norms, 128 experts of width 768, top-8, vocab 151936), ~17 GiB like the
  real Q4_K_M (18.6 GB).
- gptoss20b: gpt-oss-20b as it is shipped (arch gpt-oss: 24 layers, n_embd 2880, 64 heads / 8
  K/V heads of 64 with biases and attention sinks, every other layer a 128-token sliding window,
  32 experts of width 2880 with biases, top-4, YaRN x32, vocab 201088): experts in MXFP4 (the
  only form the model is released in), every other matrix Q8_0, 11.3 GiB like the released
  gpt-oss-20b-mxfp4.gguf (12.1 GB) — issue 32's MXFP4 MoE row.
Types for the first two as llama.cpp's quantizer picks them for Q4_K_M (llama_tensor_get_type): Q4_K, with Q6_K
for output.weight and for attn_v / ffn_down(_exps) in the layers use_more_bits selects; F32
norms, router and rope factors. Weights as tools/make_moe_bench_model.py draws them: rows from
a seeded pool quantized by pyggml's own quantizer, small residual writers so random routers
spread tokens over the experts. Written one tensor at a time (the files are never in memory);
check `df -h` first: both need ~22 GiB.
"""

from __future__ import annotations

import argparse
import math
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np

import gguf

sys.path.insert(0, str(Path(__file__).resolve().parent))
from make_arch_models import add_vocab  # noqa: E402
from make_moe_bench_model import POOL_ROWS, add_tensor_infos, use_more_bits  # noqa: E402

from pyggml import quants  # noqa: E402

OUT_DIR = Path.home() / ".cache/pyggml/bench"


@dataclass(frozen=True)
class Shape:
    arch: str
    n_layer: int
    n_embd: int
    n_head: int
    n_head_kv: int
    head_dim: int
    n_ff: int                 # dense FFN width, or each expert's
    n_vocab: int
    rope_base: float
    n_expert: int = 0
    n_expert_used: int = 0
    qk_norm: bool = False     # per-head q/k RMS norms (Qwen3)
    rope_freqs: bool = False  # Llama 3's rope_freqs.weight
    oai: bool = False         # gpt-oss: biases, sinks, post-attention norm, MXFP4 experts


MODELS = {
    "llama8b": ("llama-3.1-8b-shape-q4_k_m.gguf",
                Shape("llama", 32, 4096, 32, 8, 128, 14336, 128256, 500000.0, rope_freqs=True)),
    "moe30b": ("qwen3-30b-a3b-shape-q4_k_m.gguf",
               Shape("qwen3moe", 48, 2048, 32, 4, 128, 768, 151936, 1000000.0, n_expert=128,
                     n_expert_used=8, qk_norm=True)),
    "gptoss20b": ("gpt-oss-20b-shape-mxfp4.gguf",
                  Shape("gpt-oss", 24, 2880, 64, 8, 64, 2880, 201088, 150000.0, n_expert=32,
                        n_expert_used=4, oai=True)),
}


def tensor_plan(s: Shape) -> list[tuple[str, tuple[int, ...], str]]:
    """(name, ne (ggml order), type) of every tensor, in file order."""
    E, QD, KD, F, X = s.n_embd, s.n_head * s.head_dim, s.n_head_kv * s.head_dim, s.n_ff, s.n_expert
    if s.oai:
        return _oai_plan(s)
    out = [("token_embd.weight", (E, s.n_vocab), "q4_k"),
           ("output_norm.weight", (E,), "f32"),
           ("output.weight", (E, s.n_vocab), "q6_k")]
    if s.rope_freqs:
        out.append(("rope_freqs.weight", (s.head_dim // 2,), "f32"))
    for il in range(s.n_layer):
        p = f"blk.{il}."
        hi = "q6_k" if use_more_bits(il, s.n_layer) else "q4_k"
        out += [(p + "attn_norm.weight", (E,), "f32"),
                (p + "attn_q.weight", (E, QD), "q4_k"),
                (p + "attn_k.weight", (E, KD), "q4_k"),
                (p + "attn_v.weight", (E, KD), hi)]
        if s.qk_norm:
            out += [(p + "attn_q_norm.weight", (s.head_dim,), "f32"),
                    (p + "attn_k_norm.weight", (s.head_dim,), "f32")]
        out += [(p + "attn_output.weight", (QD, E), "q4_k"),
                (p + "ffn_norm.weight", (E,), "f32")]
        if X:
            out += [(p + "ffn_gate_inp.weight", (E, X), "f32"),
                    (p + "ffn_gate_exps.weight", (E, F, X), "q4_k"),
                    (p + "ffn_up_exps.weight", (E, F, X), "q4_k"),
                    (p + "ffn_down_exps.weight", (F, E, X), hi)]
        else:
            out += [(p + "ffn_gate.weight", (E, F), "q4_k"),
                    (p + "ffn_up.weight", (E, F), "q4_k"),
                    (p + "ffn_down.weight", (F, E), hi)]
    return out


def _oai_plan(s: Shape) -> list[tuple[str, tuple[int, ...], str]]:
    """gpt-oss's tensors as llama.cpp's loader creates them (src/models/openai-moe.cpp)."""
    E, QD, KD, F, X = s.n_embd, s.n_head * s.head_dim, s.n_head_kv * s.head_dim, s.n_ff, s.n_expert
    out = [("token_embd.weight", (E, s.n_vocab), "q8_0"),
           ("output_norm.weight", (E,), "f32"),
           ("output.weight", (E, s.n_vocab), "q8_0")]
    for il in range(s.n_layer):
        p = f"blk.{il}."
        out += [(p + "attn_norm.weight", (E,), "f32"),
                (p + "attn_q.weight", (E, QD), "q8_0"), (p + "attn_q.bias", (QD,), "f32"),
                (p + "attn_k.weight", (E, KD), "q8_0"), (p + "attn_k.bias", (KD,), "f32"),
                (p + "attn_v.weight", (E, KD), "q8_0"), (p + "attn_v.bias", (KD,), "f32"),
                (p + "attn_output.weight", (QD, E), "q8_0"), (p + "attn_output.bias", (E,), "f32"),
                (p + "attn_sinks.weight", (s.n_head,), "f32"),
                (p + "post_attention_norm.weight", (E,), "f32"),
                (p + "ffn_gate_inp.weight", (E, X), "f32"), (p + "ffn_gate_inp.bias", (X,), "f32"),
                (p + "ffn_gate_exps.weight", (E, F, X), "mxfp4"),
                (p + "ffn_gate_exps.bias", (F, X), "f32"),
                (p + "ffn_up_exps.weight", (E, F, X), "mxfp4"),
                (p + "ffn_up_exps.bias", (F, X), "f32"),
                (p + "ffn_down_exps.weight", (F, E, X), "mxfp4"),
                (p + "ffn_down_exps.bias", (E, X), "f32")]
    return out


def row_scale(name: str, s: Shape) -> float:
    """As tools/make_moe_bench_model.row_scale: embeddings of rms 1, small residual writers."""
    if name == "token_embd.weight":
        return math.sqrt(s.n_embd)
    return 0.05 if name.endswith(("attn_output.weight", "ffn_down_exps.weight",
                                  "ffn_down.weight")) else 1.0


def n_bytes(s: Shape) -> int:
    """The file's tensor bytes (without header and alignment)."""
    size = {"f32": (1, 4), "q4_k": (256, 144), "q6_k": (256, 210), "q8_0": (32, 34),
            "mxfp4": (32, 17)}
    total = 0
    for _, ne, t in tensor_plan(s):
        blk, b = size[t]
        total += int(np.prod(ne)) // blk * b
    return total


def write(path: Path, s: Shape, seed: int = 17) -> Path:
    rng = np.random.default_rng(seed)
    plan = tensor_plan(s)
    pools = {}
    for name, ne, t in plan:
        key = (t, ne[0], row_scale(name, s))
        if t != "f32" and key not in pools:
            x = rng.standard_normal((POOL_ROWS, ne[0])).astype(np.float32)
            pools[key] = quants.quantize(x * (key[2] / math.sqrt(ne[0])), t)
    tmp = path.with_suffix(".gguf.tmp")
    w = gguf.GGUFWriter(str(tmp), s.arch)
    a = s.arch
    w.add_name(f"pyggml-random-{path.stem}")
    w.add_uint32(f"{a}.context_length", 32768)
    w.add_uint32(f"{a}.embedding_length", s.n_embd)
    w.add_uint32(f"{a}.block_count", s.n_layer)
    w.add_uint32(f"{a}.feed_forward_length", s.n_ff if not s.n_expert or s.oai else 6144)
    w.add_uint32(f"{a}.attention.head_count", s.n_head)
    w.add_uint32(f"{a}.attention.head_count_kv", s.n_head_kv)
    w.add_uint32(f"{a}.attention.key_length", s.head_dim)
    w.add_uint32(f"{a}.attention.value_length", s.head_dim)
    w.add_uint32(f"{a}.rope.dimension_count", s.head_dim)
    w.add_float32(f"{a}.rope.freq_base", s.rope_base)
    w.add_float32(f"{a}.attention.layer_norm_rms_epsilon", 1e-6 if s.qk_norm else 1e-5)
    w.add_uint32(f"{a}.vocab_size", s.n_vocab)
    if s.oai:                   # as the released gpt-oss-20b
        w.add_uint32(f"{a}.attention.sliding_window", 128)
        w.add_string(f"{a}.rope.scaling.type", "yarn")
        w.add_float32(f"{a}.rope.scaling.factor", 32.0)
        w.add_uint32(f"{a}.rope.scaling.original_context_length", 4096)
    if s.n_expert:
        w.add_uint32(f"{a}.expert_count", s.n_expert)
        w.add_uint32(f"{a}.expert_used_count", s.n_expert_used)
        w.add_uint32(f"{a}.expert_feed_forward_length", s.n_ff)
    w.add_file_type(38 if s.oai else 15)                    # MOSTLY_MXFP4_MOE / Q4_K_M
    add_vocab(w, s.n_vocab)
    add_tensor_infos(w, plan,
                     lambda name, ne, t: pools[(t, ne[0], row_scale(name, s))].shape[1])
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    for name, ne, t in plan:
        if t == "f32":
            if name.endswith("ffn_gate_inp.weight"):
                arr = rng.standard_normal(ne[::-1]).astype(np.float32) * (2.0 / math.sqrt(ne[0]))
            elif name.endswith(".bias") or name.endswith("attn_sinks.weight"):
                arr = rng.standard_normal(ne[::-1]).astype(np.float32) * 0.1
            elif name == "rope_freqs.weight":
                arr = np.ones(ne, np.float32)
            else:                                           # norms
                arr = (1.0 + 0.1 * rng.standard_normal(ne[::-1])).astype(np.float32)
            w.write_tensor_data(arr)
            continue
        pool = pools[(t, ne[0], row_scale(name, s))]
        n_rows = int(np.prod(ne[1:]))
        # one expert (or the whole matrix) at a time: a 128-expert tensor is never in memory
        per = n_rows // (ne[2] if len(ne) > 2 else 1)
        parts = [pool[rng.integers(0, POOL_ROWS, per)] for _ in range(n_rows // per)]
        w.write_tensor_data(parts[0] if len(parts) == 1 else np.concatenate(parts))
        del parts
    w.close()
    tmp.rename(path)
    return path


def main(argv) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("models", nargs="*", default=list(MODELS), choices=list(MODELS))
    ap.add_argument("--out", type=Path, default=OUT_DIR)
    a = ap.parse_args(argv)
    a.out.mkdir(parents=True, exist_ok=True)
    for m in a.models:
        fname, shape = MODELS[m]
        path = a.out / fname
        if path.exists():
            print(f"{path}: present ({path.stat().st_size} bytes)")
            continue
        print(f"{path}: writing {n_bytes(shape) / 2**30:.2f} GiB", flush=True)
        write(path, shape)
        print(f"{path} ({path.stat().st_size} bytes)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
