"""MUL_MAT_ID on the CPU next to MUL_MAT reading the same bytes (BENCHMARKS.md, "Mixture of
experts"). Shape of one OLMoE-1B-7B expert projection: 64 experts of 2048 x 1024, top-8.

decode (1 token, 8 entries): mul_mat_id over the 64 stacked experts with ids = 8 consecutive
experts in shuffled order, against a mul_mat of the same 8 experts viewed as one [2048, 8192]
matrix: the same bytes, the same cache state (the 8 change every run; order A B / B A
alternates). batch (T tokens, random top-8 ids): mul_mat_id against a dense mul_mat with the same
multiply-adds (T x 8 rows x 1024 x 2048) over one [2048, 8192] matrix; the MoE one also reads up
to all 64 experts. Medians.

    .venv/bin/python tools/bench_moe.py [--threads 2] [--runs 15] [--type q4_k]
"""
from __future__ import annotations

import argparse
import time

import numpy as np

from pyggml import Context, Graph, ops, quants
from pyggml.backend.cpu import CpuBackend, set_host_data

K, N, N_EXPERT, TOP_K = 2048, 1024, 64, 8


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--runs", type=int, default=15)
    ap.add_argument("--type", default="q4_k")
    ap.add_argument("--tokens", type=int, nargs="*", default=[1, 16, 64, 256])
    args = ap.parse_args()
    rng = np.random.default_rng(0)
    w = (rng.standard_normal((N_EXPERT * N, K)) * 0.1).astype(np.float32)
    raw = quants.quantize(w, args.type).tobytes()
    plane = len(raw) // N_EXPERT
    cpu = CpuBackend(n_threads=args.threads)
    print(f"type {args.type}, {args.threads} threads, expert {N}x{K} = {plane / 1e6:.2f} MB")
    for T in args.tokens:
        ctx = Context(mem_size=len(raw) + (64 << 20), no_alloc=False)
        exps = ctx.new_tensor(args.type, [K, N, N_EXPERT], name="exps")
        set_host_data(exps, raw)
        x = ctx.new_tensor("f32", [K, 1, T], name="x")
        set_host_data(x, rng.standard_normal((T, 1, K)).astype(np.float32))
        ids = ctx.new_tensor("i32", [TOP_K, T], name="ids")
        moe = ops.mul_mat_id(ctx, exps, x, ids)
        if T == 1:      # the same bytes: 8 consecutive experts as one matrix (a view)
            views = [ops.view_2d(ctx, exps, K, N * TOP_K, exps.nb[1], e * exps.nb[2])
                     for e in range(0, N_EXPERT - TOP_K + 1, TOP_K)]
            x2 = ops.reshape_2d(ctx, x, K, 1)
            dense = [ops.mul_mat(ctx, v, x2) for v in views]
        else:           # the same multiply-adds over one [K, 8N] matrix
            x2 = ctx.new_tensor("f32", [K, T * 1], name="x2")
            set_host_data(x2, rng.standard_normal((T, K)).astype(np.float32))
            dense = [ops.mul_mat(ctx, ops.view_2d(ctx, exps, K, N * TOP_K, exps.nb[1], 0), x2)]
        g_moe = Graph()
        g_moe.build_forward_expand(moe)
        g_dense = []
        for d in dense:
            g = Graph()
            g.build_forward_expand(d)
            g_dense.append(g)
        t_moe, t_dense = [], []
        for r in range(args.runs + 1):
            if T == 1:
                idv = (r % len(g_dense)) * TOP_K + rng.permutation(TOP_K)[None]
            else:
                idv = np.stack([rng.choice(N_EXPERT, TOP_K, replace=False) for _ in range(T)])
            set_host_data(ids, idv.astype(np.int32))
            pair = [(g_moe, t_moe), (g_dense[r % len(g_dense)], t_dense)]
            for g, ts in (pair if r % 2 else pair[::-1]):
                t0 = time.perf_counter()
                cpu.graph_compute(g)
                if r:   # the first pair warms up (plans, thread pool)
                    ts.append(time.perf_counter() - t0)
        m, d = np.median(t_moe) * 1e3, np.median(t_dense) * 1e3
        if T == 1:
            gbs = TOP_K * plane / (m * 1e-3) / 1e9
            print(f"decode: mul_mat_id {m:.3f} ms ({gbs:.1f} GB/s), mul_mat of the same bytes "
                  f"{d:.3f} ms; dense/moe time ratio {d / m:.2f}")
        else:
            gf = 2 * T * TOP_K * N * K / 1e9
            print(f"T={T}: mul_mat_id {m:.2f} ms ({gf / m * 1e3:.0f} GFLOP/s), dense mul_mat "
                  f"of the same flops {d:.2f} ms ({gf / d * 1e3:.0f} GFLOP/s); "
                  f"dense/moe time ratio {d / m:.2f}")


if __name__ == "__main__":
    main()
