"""Benchmark of the planning allocator on a synthetic llama-shaped graph (not a test).

    .venv/bin/python tools/bench_alloc.py [--layers 24] [--embd 4096] [--tokens 512] [--repeat 20]

Builds a rough llama forward pass with pyggml.ops (per layer: rms_norm, mul by the norm weight,
q/k/v mul_mat, reshape, rope, permute, mul_mat kq, soft_max_ext, cont of the permuted v, mul_mat
kqv, permute, cont, reshape, mul_mat out, add residual, rms_norm, mul, ffn gate/up mul_mat, silu,
mul, down mul_mat, add), plans it with GraphAllocator (planning only, no memory) and prints: planned
peak, the naive sum of all intermediates, their ratio, the peak without in-place reuse, the largest
single layer's working set plus the inputs, and the median planning time. Weights are external
(fake addresses, never dereferenced), as weights loaded from a GGUF file are.
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from pyggml import Context, Graph, ops  # noqa: E402
from pyggml.alloc import BufferTypeSpec, GraphAllocator  # noqa: E402
from pyggml.types import GGMLType  # noqa: E402

_FAKE_WEIGHT_ADDR = 1 << 44


class _HostMemory:
    """A buffer type backed by numpy host memory, to time alloc_graph with real addresses."""
    name, alignment, max_size = "host", 64, None

    def alloc_buffer(self, n):
        import numpy as np
        raw = np.empty(n + self.alignment, dtype=np.uint8)
        pad = (-raw.ctypes.data) % self.alignment
        return raw[pad:pad + n]


def build_llama_graph(n_layer=24, n_embd=4096, n_tokens=512, n_head=32, n_ff=11008,
                      weight_type=GGMLType.Q4_0):
    """A llama-shaped forward graph. Returns (graph, inputs); node names start with 'l{i}.' for
    layer i. Weights are leafs with fake external addresses."""
    ctx = Context(no_alloc=True)
    hd = n_embd // n_head
    next_addr = [_FAKE_WEIGHT_ADDR]

    def weight(name, *ne, type_=weight_type):
        w = ctx.new_tensor(type_, list(ne), name=name)
        w.data = next_addr[0]             # external: the allocator never places it
        next_addr[0] += w.nbytes() + 64
        return w

    inp = ctx.new_tensor_2d(GGMLType.F32, n_embd, n_tokens, name="inp_embd").set_input()
    pos = ctx.new_tensor_1d(GGMLType.I32, n_tokens, name="inp_pos").set_input()
    mask = ctx.new_tensor_2d(GGMLType.F32, n_tokens, n_tokens, name="kq_mask").set_input()
    x = inp
    for il in range(n_layer):
        def n(s, il=il):
            return f"l{il}.{s}"
        cur = ops.rms_norm(ctx, x, 1e-5, name=n("attn_norm"))
        cur = ops.mul(ctx, cur, weight(n("attn_norm.w"), n_embd, type_=GGMLType.F32),
                      name=n("attn_norm_w"))
        q = ops.mul_mat(ctx, weight(n("wq"), n_embd, n_embd), cur, name=n("q"))
        k = ops.mul_mat(ctx, weight(n("wk"), n_embd, n_embd), cur, name=n("k"))
        v = ops.mul_mat(ctx, weight(n("wv"), n_embd, n_embd), cur, name=n("v"))
        q = ops.reshape_3d(ctx, q, hd, n_head, n_tokens, name=n("q3"))
        k = ops.reshape_3d(ctx, k, hd, n_head, n_tokens, name=n("k3"))
        v = ops.reshape_3d(ctx, v, hd, n_head, n_tokens, name=n("v3"))
        q = ops.rope(ctx, q, pos, hd, name=n("q_rope"))
        k = ops.rope(ctx, k, pos, hd, name=n("k_rope"))
        q = ops.permute(ctx, q, 0, 2, 1, 3, name=n("q_perm"))            # [hd, T, H]
        k = ops.permute(ctx, k, 0, 2, 1, 3, name=n("k_perm"))
        kq = ops.mul_mat(ctx, k, q, name=n("kq"))                         # [T, T, H]
        kq = ops.soft_max_ext(ctx, kq, mask, 1.0 / math.sqrt(hd), name=n("kq_soft_max"))
        vt = ops.cont(ctx, ops.permute(ctx, v, 1, 2, 0, 3, name=n("v_perm")),
                      name=n("v_t"))                                      # [T, hd, H]
        kqv = ops.mul_mat(ctx, vt, kq, name=n("kqv"))                     # [hd, T, H]
        o = ops.permute(ctx, kqv, 0, 2, 1, 3, name=n("kqv_perm"))        # [hd, H, T]
        o = ops.cont(ctx, o, name=n("kqv_cont"))
        o = ops.reshape_2d(ctx, o, n_embd, n_tokens, name=n("kqv_2d"))
        o = ops.mul_mat(ctx, weight(n("wo"), n_embd, n_embd), o, name=n("attn_out"))
        ffn_inp = ops.add(ctx, o, x, name=n("ffn_inp"))
        cur = ops.rms_norm(ctx, ffn_inp, 1e-5, name=n("ffn_norm"))
        cur = ops.mul(ctx, cur, weight(n("ffn_norm.w"), n_embd, type_=GGMLType.F32),
                      name=n("ffn_norm_w"))
        gate = ops.mul_mat(ctx, weight(n("w_gate"), n_embd, n_ff), cur, name=n("ffn_gate"))
        up = ops.mul_mat(ctx, weight(n("w_up"), n_embd, n_ff), cur, name=n("ffn_up"))
        gate = ops.silu(ctx, gate, name=n("ffn_silu"))
        par = ops.mul(ctx, gate, up, name=n("ffn_par"))
        down = ops.mul_mat(ctx, weight(n("w_down"), n_ff, n_embd), par, name=n("ffn_down"))
        x = ops.add(ctx, down, ffn_inp, name=n("l_out"))
    out = ops.rms_norm(ctx, x, 1e-5, name="out_norm")
    out = ops.mul(ctx, out, weight("out_norm.w", n_embd, type_=GGMLType.F32), name="result")
    out.set_output()
    g = Graph(size=8192)
    g.build_forward_expand(out)
    return g, [inp, pos, mask]


def working_set_bound(graph, alignment: int) -> tuple[int, int, int]:
    """(largest layer working set, inputs, their sum). A layer's working set: the aligned bytes of
    every node of that layer that needs memory of its own (all but views), i.e. what the layer
    would use with no reuse at all."""
    def al(n):
        return (n + alignment - 1) // alignment * alignment
    per_layer: dict[str, int] = {}
    for t in graph.nodes:
        if t.view_src is None and t.name.startswith("l") and "." in t.name:
            layer = t.name.split(".", 1)[0]
            per_layer[layer] = per_layer.get(layer, 0) + al(t.nbytes())
    inputs = sum(al(t.nbytes()) for t in graph.leafs if t.flags & 1 and t.data is None)
    largest = max(per_layer.values())
    return largest, inputs, largest + inputs


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--layers", type=int, default=24)
    ap.add_argument("--embd", type=int, default=4096)
    ap.add_argument("--tokens", type=int, default=512)
    ap.add_argument("--heads", type=int, default=32)
    ap.add_argument("--ff", type=int, default=11008)
    ap.add_argument("--repeat", type=int, default=20)
    args = ap.parse_args(argv)

    t0 = time.perf_counter()
    g, _ = build_llama_graph(args.layers, args.embd, args.tokens, args.heads, args.ff)
    build_s = time.perf_counter() - t0
    buft = BufferTypeSpec("cpu", alignment=64)
    al = GraphAllocator(buft)
    al.reserve(g)                                    # warm-up
    times = []
    for _ in range(args.repeat):
        t0 = time.perf_counter()
        al.reserve(g)
        times.append(time.perf_counter() - t0)
    alloc_times = []
    for _ in range(args.repeat):
        t0 = time.perf_counter()
        al.alloc_graph(g)
        alloc_times.append(time.perf_counter() - t0)
    host = GraphAllocator(_HostMemory())
    host.reserve(g)
    mem_times = []
    for _ in range(args.repeat):
        g2, _ = build_llama_graph(args.layers, args.embd, args.tokens, args.heads, args.ff)
        t0 = time.perf_counter()
        host.alloc_graph(g2)                  # a new same-shaped graph: addresses refilled
        mem_times.append(time.perf_counter() - t0)
    t0 = time.perf_counter()
    rep = al.report()
    report_s = time.perf_counter() - t0
    b = rep.buffers[0]
    largest, inputs, bound = working_set_bound(g, buft.alignment)
    mib = 2**20
    print(f"graph: {args.layers} layers, n_embd {args.embd}, {args.tokens} tokens: "
          f"{rep.n_nodes} nodes, {rep.n_leafs} leafs (built in {build_s * 1e3:.1f} ms)")
    print(f"planned peak:            {b.peak / mib:10.1f} MiB  (lifetimes alone need "
          f"{b.max_live / mib:.1f} MiB)")
    print(f"peak without in-place:   {b.peak_no_inplace / mib:10.1f} MiB")
    print(f"naive sum:               {b.naive / mib:10.1f} MiB  (naive / peak = "
          f"{b.naive / b.peak:.1f}x)")
    print(f"largest layer + inputs:  {bound / mib:10.1f} MiB  ({largest / mib:.1f} + "
          f"{inputs / mib:.1f}); peak <= bound: {b.peak <= bound}")
    print(f"in place: {b.n_inplace}, through a view: {b.n_view_parent}, fresh: {b.n_fresh}")
    print(f"reserve (plan):          median {statistics.median(times) * 1e3:6.2f} ms, "
          f"min {min(times) * 1e3:6.2f} ms over {args.repeat}")
    print(f"alloc_graph (plan only): median {statistics.median(alloc_times) * 1e3:6.2f} ms")
    print(f"alloc_graph (host mem):  median {statistics.median(mem_times) * 1e3:6.2f} ms "
          f"(new same-shaped graph each time)")
    print(f"report (+ no-inplace):   {report_s * 1e3:6.2f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
