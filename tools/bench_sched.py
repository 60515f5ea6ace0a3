"""Per-compute overhead of the scheduler's reuse path (graph_compute of the graph last
allocated: no passes, no planning, marshalled plans replayed).

A ~700-node graph of tiny tensors (so compute time is small next to the overhead): 100 layers of
rms_norm, mul by a norm weight, mul_mat, reshape, silu, reshape back, add. Timed per call, medians:
  cpu direct   CpuBackend.graph_compute(graph) on a graph allocated by GraphAllocator (floor)
  sched 1      Scheduler([cpu]): one split
  sched 2      Scheduler([TEST, cpu]): layers 0-49 with weights on the test device (separate
               memory, its own worker thread), 50-99 on the CPU
  sched 10     the same with the device changing every 10 layers
plus the cost of alloc_graph for a new graph of the same topology (the five passes + placement).

Run: .venv/bin/python tools/bench_sched.py [--layers 100] [--iters 300]
The TEST device lives in tests/support (test-only); this tool imports it from there.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))

from pyggml import Context, Graph, ops  # noqa: E402
from pyggml.alloc import GraphAllocator  # noqa: E402
from pyggml.backend.base import tensor_set  # noqa: E402
from pyggml.backend.cpu import CpuBackend, cpu_buffer_type  # noqa: E402
from pyggml.sched import Scheduler  # noqa: E402
from support.devices import TestDevice  # noqa: E402
from support.graphs import make_weights  # noqa: E402

K, M = 32, 1


def build(n_layers: int, where_of_layer) -> tuple[Graph, object]:
    ctx = Context(no_alloc=True)
    specs, where = {}, {}
    for i in range(n_layers):
        specs[f"w{i}"] = ("f32", [K, K])
        specs[f"n{i}"] = ("f32", [K])
        where[f"w{i}"] = where[f"n{i}"] = where_of_layer(i)
    w = make_weights(ctx, specs, where)
    x = ctx.new_tensor("f32", [K, M], name="x").set_input()
    h = x
    for i in range(n_layers):
        a = ops.mul(ctx, ops.rms_norm(ctx, h, 1e-5), w[f"n{i}"])
        b = ops.mul_mat(ctx, w[f"w{i}"], a)
        c = ops.reshape_2d(ctx, ops.silu(ctx, ops.reshape_2d(ctx, b, K * M, 1)), K, M)
        h = ops.add(ctx, c, h)
    h.set_output()
    g = Graph(size=8 * n_layers + 16)
    g.build_forward_expand(h)
    g._keep = w                         # weights stay alive with the graph
    return g, x


def interleaved_medians_us(fns, iters: int) -> list[float]:
    """Median time per call of each fn, calls interleaved so all see the same machine noise."""
    for fn in fns:
        for _ in range(10):
            fn()
    ts = [[] for _ in fns]
    for _ in range(iters):
        for k, fn in enumerate(fns):
            t0 = time.perf_counter()
            fn()
            ts[k].append(time.perf_counter() - t0)
    return [statistics.median(t) * 1e6 for t in ts]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", type=int, default=100)
    ap.add_argument("--iters", type=int, default=300)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    cpu = CpuBackend(n_threads=args.threads)
    dev = TestDevice()
    tb = dev.init_backend()
    xv = np.random.default_rng(0).standard_normal((M, K)).astype(np.float32)
    host = cpu_buffer_type()

    g0, x0 = build(args.layers, lambda i: host)
    galloc = GraphAllocator(host)
    galloc.reserve(g0)
    galloc.alloc_graph(g0)
    tensor_set(x0, xv)
    rows, fns = [("cpu direct", len(g0.nodes), 1, None)], [lambda: cpu.graph_compute(g0)]
    for label, backends, where in (
            ("sched 1", [cpu], lambda i: host),
            ("sched 2", [tb, cpu],
             lambda i: dev.default_buffer_type() if i < args.layers // 2 else host),
            ("sched 10", [tb, cpu],
             lambda i: dev.default_buffer_type() if (i // 10) % 2 == 0 else host)):
        s = Scheduler(backends, graph_size=20 * args.layers + 64)
        g, x = build(args.layers, where)
        s.alloc_graph(g)
        tensor_set(x, xv)
        g2, _ = build(args.layers, where)
        t0 = time.perf_counter()
        s.alloc_graph(g2)                # a new graph of the same topology: passes + placement
        t_alloc = (time.perf_counter() - t0) * 1e3
        s.alloc_graph(g)
        tensor_set(x, xv)
        rows.append((label, len(g.nodes), s.get_n_splits(), t_alloc))
        fns.append(lambda s=s, g=g: s.graph_compute(g))
    meds = interleaved_medians_us(fns, args.iters)
    print(f"{'':12s} {'nodes':>6s} {'splits':>6s} {'median us/compute':>18s} "
          f"{'over direct':>12s} {'alloc_graph ms':>15s}")
    for r, us in zip(rows, meds):
        extra = f"{r[3]:15.1f}" if r[3] is not None else f"{'':>15s}"
        print(f"{r[0]:12s} {r[1]:6d} {r[2]:6d} {us:18.1f} {us - meds[0]:12.1f} {extra}")
    tb.close()


if __name__ == "__main__":
    main()
