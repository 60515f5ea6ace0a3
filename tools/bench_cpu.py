"""CPU backend benchmarks (issue: CPU backend), each a ratio or rate measured in one run:

1. matvec through the graph executor: a 4096×4096 weight × one activation row, GB/s of weight
   bytes per type at 1 and 2 threads (enough different matrices cycled to read 256 MiB, so they
   come from memory, not cache), next to this machine's memory read bandwidth (measured here
   with the same thread count);
2. a 512-row prompt-sized MUL_MAT (4096×4096 weight): GFLOP/s per type;
3. the per-call overhead of a graph of 500 trivial nodes (scale of a 1-element tensor).

Usage: .venv/bin/python tools/bench_cpu.py [--types q4_0,q8_0,...] [--threads 1,2] [--runs 7]
Prints a markdown table; medians over --runs.
"""

from __future__ import annotations

import argparse
import statistics
import threading
import time

import numpy as np

from pyggml import Context, Graph, ops, quants
from pyggml.backend.cpu import CpuBackend, set_host_data


def median_time(fn, runs: int) -> float:
    fn()
    ts = []
    for _ in range(runs):
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts)


def read_bandwidth(n_threads: int, runs: int, n_bytes: int = 512 << 20) -> float:
    """GB/s reading a large array with n_threads threads (pg_bench_read, GIL released)."""
    buf = np.ones(n_bytes, dtype=np.uint8)
    parts = np.array_split(buf, n_threads)

    def run():
        ths = [threading.Thread(target=quants.bench_read, args=(p,)) for p in parts]
        for t in ths:
            t.start()
        for t in ths:
            t.join()
    return n_bytes / median_time(run, runs) / 1e9


def weight_tensor(ctx, wtype: str, K: int, N: int):
    w = np.random.default_rng(0).standard_normal((N, K)).astype(np.float32)
    t = ctx.new_tensor_2d(wtype, K, N, name="w")
    if wtype == "f32":
        set_host_data(t, w)
    elif wtype == "f16":
        set_host_data(t, w.astype(np.float16))
    else:
        set_host_data(t, quants.quantize(w, wtype).tobytes())
    return t


def bench_matmul(wtype: str, M: int, threads: list[int], runs: int, K=4096, N=4096,
                 min_bytes: int = 0):
    """Seconds per MUL_MAT of a K×N weight and M activation rows (median). With min_bytes, as
    many weight matrices as that takes are cycled, so the weights stream from memory rather
    than from the last-level cache; the time is per matrix."""
    one = Context(no_alloc=True).new_tensor_2d(wtype, K, N)
    n_mats = max(1, -(-min_bytes // one.nbytes()))
    graphs = []
    for i in range(n_mats):
        ctx = Context(mem_size=(K * N * 4 + K * M * 4 + N * M * 4) + (1 << 20), no_alloc=False)
        w = weight_tensor(ctx, wtype, K, N)
        x = ctx.new_tensor_2d("f32", K, M, name="x")
        set_host_data(x, np.random.default_rng(1).standard_normal((M, K)).astype(np.float32))
        g = Graph()
        g.build_forward_expand(ops.mul_mat(ctx, w, x))
        graphs.append((ctx, g))
    out = {}
    for nt in threads:
        be = CpuBackend(n_threads=nt)
        out[nt] = median_time(lambda: [be.graph_compute(g) for _, g in graphs], runs) / n_mats
        be.close()
    return one.nbytes(), out


def bench_overhead(threads: list[int], runs: int, n_nodes: int = 500) -> dict[int, float]:
    ctx = Context(mem_size=1 << 20, no_alloc=False)
    t = ctx.new_tensor_1d("f32", 1, name="x")
    for _ in range(n_nodes):
        t = ops.scale(ctx, t, 1.0)
    g = Graph(size=n_nodes + 8)
    g.build_forward_expand(t)
    out = {}
    for nt in threads:
        be = CpuBackend(n_threads=nt)
        out[nt] = median_time(lambda: be.graph_compute(g), runs * 20)
        be.close()
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--types", default="q4_0,q5_0,q8_0,q4_k,q6_k,f16")
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--runs", type=int, default=7)
    ap.add_argument("--prompt-rows", type=int, default=512)
    args = ap.parse_args()
    threads = [int(x) for x in args.threads.split(",")]
    types = args.types.split(",")
    bw = {nt: read_bandwidth(nt, args.runs) for nt in threads}
    print("memory read bandwidth: " + ", ".join(f"{nt} thread(s) {v:.1f} GB/s" for nt, v in bw.items()))
    print("\n| type | " + " | ".join(f"matvec GB/s t={nt} (% of bw)" for nt in threads) +
          " | " + " | ".join(f"pp{args.prompt_rows} GFLOP/s t={nt}" for nt in threads) + " |")
    print("|---|" + "---|" * (2 * len(threads)))
    for ty in types:
        n_bytes, tv = bench_matmul(ty, 1, threads, args.runs, min_bytes=256 << 20)
        _, tp = bench_matmul(ty, args.prompt_rows, threads, max(2, args.runs // 3))
        flops = 2 * 4096 * 4096 * args.prompt_rows
        cells = [f"{n_bytes / tv[nt] / 1e9:.1f} ({100 * n_bytes / tv[nt] / 1e9 / bw[nt]:.0f}%)"
                 for nt in threads]
        cells += [f"{flops / tp[nt] / 1e9:.1f}" for nt in threads]
        print(f"| {ty} | " + " | ".join(cells) + " |")
    ov = bench_overhead(threads, args.runs)
    print("\ngraph of 500 trivial nodes, per compute call: " +
          ", ".join(f"{nt} thread(s) {v * 1e3:.3f} ms" for nt, v in ov.items()))


if __name__ == "__main__":
    main()
