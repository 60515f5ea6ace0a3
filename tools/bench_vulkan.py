"""Benchmarks of the Vulkan backend (BENCHMARKS.md, section "Vulkan backend (lavapipe)").

    .venv/bin/python tools/bench_vulkan.py ops        # per-op time, Vulkan vs CPU
    .venv/bin/python tools/bench_vulkan.py overhead   # Python cost: record vs replay
    .venv/bin/python tools/bench_vulkan.py model      # Gemma 3 270M graphs, whole

ops: each op at Gemma 3 270M shapes, R independent copies in one graph (one submission), so
the time per op is the device's time without the per-submission cost; the CPU backend computes
the same graph. Medians of `--reps` runs.
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

from pyggml import Context, Graph, ops, quants
from pyggml.backend import base
from pyggml.backend.cpu import CpuBackend, cpu_buffer_type
from pyggml.backend.vulkan import VulkanBackend

E, FF, H, HKV, D, NKV = 640, 2048, 4, 1, 256, 256      # Gemma 3 270M


def _rand(shape, scale=1.0):
    return (np.random.default_rng(0).standard_normal(shape) * scale).astype(np.float32)


def _fill(t):
    if t.type.name == "I32":
        base.tensor_set(t, (np.arange(t.nelements()) % max(1, t.ne[0])).astype(np.int32))
    elif t.type.name == "F32":
        base.tensor_set(t, _rand(t.nelements()))
    elif t.type.name == "F16":
        base.tensor_set(t, _rand(t.nelements(), 0.1).astype(np.float16))
    else:
        base.tensor_set(t, quants.quantize(_rand((t.nrows(), t.ne[0]), 0.1), t.type).tobytes())


def _op_cases(T: int):
    """name -> build(ctx) -> (inputs, out), at T tokens."""
    def mm(wt, n, k):
        def b(ctx):
            w = ctx.new_tensor(wt, [k, n])
            x = ctx.new_tensor("f32", [k, T])
            return [w, x], lambda: ops.mul_mat(ctx, w, x)
        return b

    def unary(fn, ne):
        def b(ctx):
            x = ctx.new_tensor("f32", ne)
            return [x], lambda: fn(ctx, x)
        return b

    def fa(ctx):
        q = ctx.new_tensor("f32", [D, T, H])
        k = ctx.new_tensor("f16", [D, NKV, HKV])
        v = ctx.new_tensor("f16", [D, NKV, HKV])
        m = ctx.new_tensor("f16", [NKV, T])
        return [q, k, v, m], lambda: ops.flash_attn_ext(ctx, q, k, v, m, scale=0.0625)

    def rope(ctx):
        x = ctx.new_tensor("f32", [D, H, T])
        p = ctx.new_tensor("i32", [T])
        return [x, p], lambda: ops.rope(ctx, x, p, D, mode=2)

    def softmax(ctx):
        x = ctx.new_tensor("f32", [NKV, T, H])
        m = ctx.new_tensor("f16", [NKV, T])
        return [x, m], lambda: ops.soft_max_ext(ctx, x, m, scale=0.0625)

    def add(ctx):
        a, b = ctx.new_tensor("f32", [E, T]), ctx.new_tensor("f32", [E, T])
        return [a, b], lambda: ops.add(ctx, a, b)

    def set_rows(ctx):
        cache = ctx.new_tensor("f16", [D * HKV, 512])
        x = ctx.new_tensor("f32", [D * HKV, T])
        i = ctx.new_tensor("i32", [T])
        return [cache, x, i], lambda: ops.set_rows(ctx, cache, x, i)

    return {
        f"mul_mat q5_0 {E}->{FF}": mm("q5_0", FF, E), f"mul_mat q8_0 {E}->{FF}": mm("q8_0", FF, E),
        f"mul_mat q4_k {FF}->{E}": mm("q4_k", E, FF), f"mul_mat q6_k {FF}->{E}": mm("q6_k", E, FF),
        f"mul_mat f16 {E}->{FF}": mm("f16", FF, E), f"mul_mat f32 {E}->{FF}": mm("f32", FF, E),
        f"rms_norm {E}": unary(lambda c, x: ops.rms_norm(c, x, 1e-6), [E, T]),
        f"gelu {FF}": unary(lambda c, x: ops.gelu(c, x), [FF, T]),
        f"add {E}": add, f"rope neox {D}x{H}": rope, f"soft_max {NKV}x{H}": softmax,
        f"flash_attn D{D} H{H} kv{NKV}": fa, f"set_rows f16 {D}": set_rows,
    }


def _time(fn, reps: int) -> float:
    fn()
    ts = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts)


def bench_ops(vk: VulkanBackend, cpu: CpuBackend, T: int, R: int, reps: int) -> None:
    print(f"T={T} tokens, {R} copies per graph, median of {reps}; us per op")
    print(f"{'op':34} {'vulkan':>10} {'cpu':>10} {'vk/cpu':>7}")
    for name, build in _op_cases(T).items():
        res = []
        for where in ("vk", "cpu"):
            ctx = Context(no_alloc=True)
            inputs, mk = build(ctx)
            outs = [mk() for _ in range(R)]
            g = Graph()
            for o in outs:
                g.build_forward_expand(o)
            buft = vk.get_default_buffer_type() if where == "vk" else cpu_buffer_type()
            buf = base.alloc_tensors(buft, list(ctx.tensors), base.BufferUsage.COMPUTE)
            for t in inputs:
                _fill(t)
            if where == "vk":
                dt = _time(lambda: (vk.graph_compute(g), vk.synchronize()), reps)
            else:
                dt = _time(lambda: cpu.graph_compute(g), reps)
            res.append(dt / R * 1e6)
            del buf
        print(f"{name:34} {res[0]:10.1f} {res[1]:10.1f} {res[0] / res[1]:7.1f}")


def bench_overhead(vk: VulkanBackend, n: int, reps: int) -> None:
    ctx = Context(no_alloc=True)
    x = ctx.new_tensor("f32", [64])
    h = x
    for _ in range(n):
        h = ops.scale(ctx, h, 1.0001)
    g = Graph()
    g.build_forward_expand(h)
    buf = base.alloc_tensors(vk.get_default_buffer_type(), list(ctx.tensors))
    _fill(x)
    vk.graph_compute(g)
    vk.synchronize()
    rec, sub, wait = [], [], []
    for _ in range(reps):
        g.next_uid()
        t0 = time.perf_counter()
        vk.graph_compute(g)                     # record + submit
        rec.append(time.perf_counter() - t0)
        vk.synchronize()
    for _ in range(reps):
        t0 = time.perf_counter()
        vk.graph_compute(g)                     # replay: checks + submit
        t1 = time.perf_counter()
        vk.synchronize()
        t2 = time.perf_counter()
        sub.append(t1 - t0)
        wait.append(t2 - t1)
    r, s, w = (statistics.median(v) for v in (rec, sub, wait))
    print(f"graph of {n} dependent dispatches (64 floats each), median of {reps}:")
    print(f"  record + submit : {r * 1e3:8.2f} ms  = {r / n * 1e6:6.1f} us per dispatch")
    print(f"  replay (Python) : {s * 1e3:8.2f} ms  = {s / n * 1e6:6.2f} us per dispatch")
    print(f"  device time     : {w * 1e3:8.2f} ms  = {w / n * 1e6:6.1f} us per dispatch "
          f"(with a barrier between each)")
    del buf


def _kv_cache(R, hp, buft):
    """A 512-cell F16 KV cache in `buft` (the runtime's KVCache, either signature)."""
    try:
        return R.KVCache(hp, 512, "f16", "f16", 1, buffer_types=[buft] * hp.n_layer)
    except TypeError:
        return R.KVCache(hp, 512, "f16", "f16", 1, buffer_type=buft)


def bench_model(vk: VulkanBackend, cpu: CpuBackend, reps: int, profile: bool = False) -> None:
    """Whole Gemma 3 270M graphs with every weight and the KV cache in Vulkan memory."""
    from pyggml.alloc import GraphAllocator
    from pyggml.llm import runtime as R
    from pyggml.models_default import ensure_default_model
    m = R.GGUFModel.open(ensure_default_model())
    w_host = m.create_tensors()
    hp = R.read_hparams(m, m.tensors)
    ctx = Context(no_alloc=True)
    w_vk = {k: ctx.new_tensor(t.type, t.ne, name=t.name) for k, t in w_host.items()}
    buf = base.alloc_tensors(vk.get_default_buffer_type(), list(w_vk.values()))
    for k, t in w_host.items():
        base.tensor_copy(t, w_vk[k])
    print(f"weights on {vk.name}: {buf.n_bytes / 2**20:.0f} MiB")
    for T in (1, 64):
        out = {}
        for where, weights, be in (("vk", w_vk, vk), ("cpu", w_host, cpu)):
            buft = vk.get_default_buffer_type() if where == "vk" else cpu_buffer_type()
            kv = _kv_cache(R, hp, buft)
            g, inp, logits = R.build_graph(hp, weights, kv, R.GraphParams(T, 1, 256), True, True)
            ga = GraphAllocator([buft])
            ga.alloc_graph(g)
            for kb in getattr(kv, "buffers", None) or [kv.buffer]:
                kb.clear(0)
            mask = np.where(np.arange(256)[None, :] <= np.arange(T)[:, None], 0, -np.inf)

            def set_inputs(inp=inp):          # inputs' memory is reused after their last use
                base.tensor_set(inp.tokens, (np.arange(T) * 7 + 2).astype(np.int32))
                base.tensor_set(inp.pos, np.arange(T, dtype=np.int32))
                base.tensor_set(inp.kv_idxs, np.arange(T, dtype=np.int32))
                if inp.out_ids is not None:
                    base.tensor_set(inp.out_ids, np.array([T - 1], np.int32))
                for mt in (inp.mask, inp.mask_swa):
                    if mt is not None:
                        base.tensor_set(mt, mask.astype(np.float16))
            if where == "vk":
                dt = _time(lambda: (set_inputs(), vk.graph_compute(g), vk.synchronize()), reps)
                stats = vk.record_stats(g)
                if profile:
                    vk.profile = True
                    g.next_uid()
                    set_inputs()
                    vk.graph_compute(g)
                    vk.synchronize()
                    vk.profile = False
                    by = {}
                    for _node, op, shader, sec in vk.profile_results(g):
                        k = f"{op} ({shader})"
                        n, tot = by.get(k, (0, 0.0))
                        by[k] = (n + 1, tot + sec)
                    total = sum(v[1] for v in by.values())
                    print(f"  T={T} device time by shader (timestamps, total "
                          f"{total * 1e3:.1f} ms):")
                    for k, (n, tot) in sorted(by.items(), key=lambda x: -x[1][1])[:12]:
                        print(f"    {k:40} {n:4d} x  {tot * 1e3:8.1f} ms  "
                              f"{100 * tot / total:5.1f}%")
            else:
                dt = _time(lambda: (set_inputs(), cpu.graph_compute(g)), reps)
                stats = None
            out[where] = (dt, np.frombuffer(base.tensor_get(logits), np.float32).astype(np.float64))
            extra = f", {stats[0]} dispatches, {stats[1]} barriers" if stats else ""
            print(f"  T={T:3d} {where:4}: {dt * 1e3:8.1f} ms per graph ({len(g.nodes)} nodes"
                  f"{extra})")
        a, b = out["vk"][1], out["cpu"][1]
        print(f"  T={T:3d} logits NMSE vk vs cpu: {np.sum((a - b) ** 2) / np.sum(b ** 2):.2e}, "
              f"same argmax: {int(np.argmax(a)) == int(np.argmax(b))}")


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("what", choices=["ops", "overhead", "model", "all"])
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--copies", type=int, default=10)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--profile", action="store_true", help="model: device time per shader")
    a = p.parse_args(argv)
    vk = VulkanBackend(0)
    cpu = CpuBackend(n_threads=a.threads)
    print(f"device: {vk.device.description}; CPU backend: {a.threads} threads")
    if a.what in ("ops", "all"):
        for T in (1, 64):
            bench_ops(vk, cpu, T, a.copies, a.reps)
    if a.what in ("overhead", "all"):
        bench_overhead(vk, 500, a.reps)
    if a.what in ("model", "all"):
        bench_model(vk, cpu, a.reps, a.profile)


if __name__ == "__main__":
    main()
