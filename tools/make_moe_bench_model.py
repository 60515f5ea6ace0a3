"""A random-weight GGUF of OLMoE-1B-7B's shape and Q4_K_M type mix, for the MoE decode benchmark
(tools/bench_moe_model.py, BENCHMARKS.md "MoE decode: OLMoE-1B-7B shape"). Not for tests.

    .venv/bin/python tools/make_moe_bench_model.py [OUT]
        (default ~/.cache/pyggml/bench/olmoe-1b-7b-shape-q4_k_m.gguf; a present file is kept)

Shape (allenai/OLMoE-1B-7B-0924's config.json): 16 layers, n_embd 2048, 16 heads (16 K/V heads)
of 128, 64 experts of width 1024, top-8, Q/K RMS norms over whole rows, vocab 50304, SwiGLU.
Types as llama.cpp's quantizer picks them for Q4_K_M (llama_tensor_get_type): Q4_K everywhere,
Q6_K for output.weight and for attn_v / ffn_down_exps in the layers `use_more_bits` selects
(i < n/8, i >= 7n/8, (i - n/8) % 3 == 2: layers 0, 1, 4, 7, 10, 13, 14, 15), F32 for the router
(ffn_gate_inp: the quantizer never quantizes it) and the norms. About 4.2 GB, like the real
OLMoE-1B-7B-0924 Q4_K_M GGUF (4.21 GB).

Weights: every quantized row is drawn (with replacement, seeded) from a pool of 4096 rows that
pyggml's own quantizer made from N(0, row_scale²/row_length) floats (row_scale below), so
writing 4 GB takes seconds and needs little memory; decode speed depends on the bytes, not
on the values. Router rows are distinct random F32; with the row scales chosen the tokens spread
over the experts (measured: tools/bench_moe_model.py). A SentencePiece-style vocabulary of 50304
pieces (`▁w<i>`), as in tools/make_arch_models.py.
"""

from __future__ import annotations

import math
import sys
from pathlib import Path

import numpy as np

import gguf
from gguf import GGMLQuantizationType as QT

from pyggml import quants

sys.path.insert(0, str(Path(__file__).resolve().parent))
from make_arch_models import add_vocab  # noqa: E402

N_LAYER, N_EMBD, N_HEAD, HEAD_DIM = 16, 2048, 16, 128
N_EXPERT, N_EXPERT_USED, N_FF_EXP, N_VOCAB = 64, 8, 1024, 50304
POOL_ROWS = 4096
DEFAULT_OUT = Path.home() / ".cache/pyggml/bench/olmoe-1b-7b-shape-q4_k_m.gguf"


def add_tensor_infos(w: gguf.GGUFWriter, plan, row_bytes) -> None:
    """The tensor infos of `plan` ((name, ne in ggml order, type) each) ahead of data written
    one tensor at a time: f32 as is, a quantized type as rows of row_bytes(name, ne, type)."""
    for name, ne, t in plan:
        n_rows = int(np.prod(ne[1:])) if len(ne) > 1 else 1
        if t == "f32":
            w.add_tensor_info(name, ne[::-1], np.dtype(np.float32), 4 * n_rows * ne[0])
        else:
            rb = row_bytes(name, ne, t)
            w.add_tensor_info(name, (*ne[:0:-1], rb), np.dtype(np.uint8), n_rows * rb,
                              raw_dtype=QT[t.upper()])


def use_more_bits(i: int, n: int) -> bool:
    """llama.cpp's llama-quant.cpp use_more_bits(i_layer, n_layers)."""
    return i < n // 8 or i >= 7 * n // 8 or (i - n // 8) % 3 == 2


def tensor_plan() -> list[tuple[str, tuple[int, ...], str]]:
    """(name, ne (ggml order, ne[0] innermost), type) of every tensor, in file order."""
    E, HD, X, F = N_EMBD, N_HEAD * HEAD_DIM, N_EXPERT, N_FF_EXP
    out = [("token_embd.weight", (E, N_VOCAB), "q4_k"),
           ("output_norm.weight", (E,), "f32"),
           ("output.weight", (E, N_VOCAB), "q6_k")]
    for il in range(N_LAYER):
        p = f"blk.{il}."
        hi = "q6_k" if use_more_bits(il, N_LAYER) else "q4_k"
        out += [(p + "attn_norm.weight", (E,), "f32"),
                (p + "attn_q.weight", (E, HD), "q4_k"),
                (p + "attn_k.weight", (E, HD), "q4_k"),
                (p + "attn_v.weight", (E, HD), hi),
                (p + "attn_q_norm.weight", (HD,), "f32"),
                (p + "attn_k_norm.weight", (HD,), "f32"),
                (p + "attn_output.weight", (HD, E), "q4_k"),
                (p + "ffn_norm.weight", (E,), "f32"),
                (p + "ffn_gate_inp.weight", (E, X), "f32"),
                (p + "ffn_gate_exps.weight", (E, F, X), "q4_k"),
                (p + "ffn_up_exps.weight", (E, F, X), "q4_k"),
                (p + "ffn_down_exps.weight", (F, E, X), hi)]
    return out


def row_scale(name: str) -> float:
    """Standard deviation × sqrt(row length) of a tensor's rows. The residual-stream writers
    (attn_output, ffn_down_exps) are small (0.05) and the embeddings of rms 1, so the hidden
    state stays dominated by each token's own embedding: random routers then spread the tokens
    over the experts roughly evenly, as a trained (load-balanced) router does. With every
    matrix at 1.0 the layers' outputs grow alike for all tokens and the deeper layers route most
    tokens to the same few experts, which would keep them in cache and flatter decode speed."""
    if name == "token_embd.weight":
        return math.sqrt(N_EMBD)                # embeddings of rms 1
    return 0.05 if name.endswith(("attn_output.weight", "ffn_down_exps.weight")) else 1.0


def _pools(rng) -> dict[tuple[str, int, float], np.ndarray]:
    """(type, row length, row scale) → POOL_ROWS quantized rows (uint8 [POOL_ROWS, bytes])."""
    pools = {}
    for name, ne, t in tensor_plan():
        key = (t, ne[0], row_scale(name))
        if t != "f32" and key not in pools:
            x = rng.standard_normal((POOL_ROWS, ne[0])).astype(np.float32)
            pools[key] = quants.quantize(x * (key[2] / math.sqrt(ne[0])), t)
    return pools


def write(path: Path) -> Path:
    rng = np.random.default_rng(17)
    pools = _pools(rng)
    plan = tensor_plan()
    tmp = path.with_suffix(".gguf.tmp")
    w = gguf.GGUFWriter(str(tmp), "olmoe")
    a = "olmoe"
    w.add_name("pyggml-random-olmoe-1b-7b-shape")
    w.add_uint32(f"{a}.context_length", 4096)
    w.add_uint32(f"{a}.embedding_length", N_EMBD)
    w.add_uint32(f"{a}.block_count", N_LAYER)
    w.add_uint32(f"{a}.feed_forward_length", N_FF_EXP)
    w.add_uint32(f"{a}.attention.head_count", N_HEAD)
    w.add_uint32(f"{a}.attention.head_count_kv", N_HEAD)
    w.add_uint32(f"{a}.attention.key_length", HEAD_DIM)
    w.add_uint32(f"{a}.attention.value_length", HEAD_DIM)
    w.add_uint32(f"{a}.rope.dimension_count", HEAD_DIM)
    w.add_float32(f"{a}.rope.freq_base", 10000.0)
    w.add_float32(f"{a}.attention.layer_norm_rms_epsilon", 1e-5)
    w.add_uint32(f"{a}.vocab_size", N_VOCAB)
    w.add_uint32(f"{a}.expert_count", N_EXPERT)
    w.add_uint32(f"{a}.expert_used_count", N_EXPERT_USED)
    w.add_file_type(15)                                     # MOSTLY_Q4_K_M
    add_vocab(w, N_VOCAB)
    add_tensor_infos(w, plan, lambda name, ne, t: pools[(t, ne[0], row_scale(name))].shape[1])
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    for name, ne, t in plan:
        if t == "f32":
            if name.endswith("ffn_gate_inp.weight"):
                arr = rng.standard_normal(ne[::-1]).astype(np.float32) * (2.0 / math.sqrt(ne[0]))
            else:                                           # norms
                arr = (1.0 + 0.1 * rng.standard_normal(ne[::-1])).astype(np.float32)
        else:
            pool = pools[(t, ne[0], row_scale(name))]
            n_rows = int(np.prod(ne[1:]))
            arr = pool[rng.integers(0, POOL_ROWS, n_rows)]
        w.write_tensor_data(arr)
    w.close()
    tmp.rename(path)
    return path


def main(argv) -> int:
    out = Path(argv[0]) if argv else DEFAULT_OUT
    if out.exists():
        print(f"{out}: present ({out.stat().st_size} bytes)")
        return 0
    out.parent.mkdir(parents=True, exist_ok=True)
    p = write(out)
    print(f"{p} ({p.stat().st_size} bytes)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
