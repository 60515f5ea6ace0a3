"""The whole MoE FFN block (pyggml.llm.moe.moe_ffn: router softmax/sigmoid → top-k → weights
normalized → mul_mat_id up/gate/down → weighted sum over the k slots) against a numpy float64
reference of the same math, with quantized expert weights; on the CPU (1 and 2 threads, every
kernel path), on Vulkan alone, and split the llama.cpp `-ot exps=CPU` way (experts in host
memory, the rest on Vulkan) through the scheduler.

References: the router runs in F32 (real GGUFs keep ffn_gate_inp in F32), so the selected
experts must equal numpy's exactly (the data are drawn so the k-th and (k+1)-th probabilities
differ by more than 1e-4). CPU: the reference converts each expert matmul's input to the weight's
vec_dot_type as the kernels do (Q8_0 / Q8_K), so the bound is fp32 rounding: 1e-4 of the largest
output. Vulkan multiplies dequantized weights with fp32 activations: its bound against the
plain-float reference is 1e-4, and against the CPU result 2e-2 (the CPU's activation rounding).
"""
from __future__ import annotations

import zlib

import numpy as np
import pytest

from pyggml import Context, Graph, _native, quants
from pyggml.backend.base import BufferUsage, alloc_tensors, tensor_get, tensor_set
from pyggml.backend.cpu import CpuBackend, cpu_buffer_type
from pyggml.llm.moe import WEIGHTS_SUM_MIN, moe_ffn
from pyggml.sched import Scheduler
from pyggml.types import GGMLType

E, F, N_EXPERT = 256, 256, 8          # K-quant rows need multiples of 256


class Block:
    """Weights and input of one MoE block, as numpy values and quantized bytes."""

    def __init__(self, wtype: str, n_tokens: int, k: int, gating: str, seed: int):
        rng = np.random.default_rng(seed)
        self.wtype, self.k, self.gating = wtype, k, gating
        for _ in range(100):        # redraw until the top-k choice is clear of near ties
            self.x = rng.standard_normal((n_tokens, E)).astype(np.float32)
            self.router = (rng.standard_normal((N_EXPERT, E)) * 0.1).astype(np.float32)
            p = self._probs(self.router.astype(np.float64) @ self.x.astype(np.float64).T).T
            s = np.sort(p, axis=1)[:, ::-1]
            if k == N_EXPERT or np.min(s[:, k - 1] - s[:, k]) > 1e-4:
                break
        self.raw, self.deq = {}, {}
        for name, shape in (("up", (N_EXPERT, F, E)), ("gate", (N_EXPERT, F, E)),
                            ("down", (N_EXPERT, E, F))):
            v = (rng.standard_normal(shape) * 0.2).astype(np.float32)
            q = quants.quantize(v.reshape(-1, shape[-1]), wtype)
            self.raw[name] = q.tobytes()
            self.deq[name] = quants.dequantize(q, wtype).reshape(shape).astype(np.float64)

    def _probs(self, logits):
        """logits (n_expert, T) → gating probabilities (n_expert, T)."""
        if self.gating == "softmax":
            e = np.exp(logits - logits.max(axis=0))
            return e / e.sum(axis=0)
        if self.gating == "sigmoid":
            return 1 / (1 + np.exp(-logits))
        return logits

    def reference(self, norm_w: bool, quantize_acts: bool):
        """(out (T, E), selected (T, k)) in float64."""
        def act(v):
            if not quantize_acts:
                return v
            vdt = quants.vec_dot_type(self.wtype)
            q = quants.quantize_act(v.astype(np.float32)[None], vdt)
            return quants.dequantize(q, vdt)[0].astype(np.float64)

        x = self.x.astype(np.float64)
        probs = self._probs(self.router.astype(np.float64) @ x.T).T          # (T, n_expert)
        sel = np.argsort(-probs, axis=1, kind="stable")[:, : self.k]
        w = np.take_along_axis(probs, sel, axis=1)
        if self.gating == "softmax_weight":
            e = np.exp(w - w.max(axis=1, keepdims=True))
            w = e / e.sum(axis=1, keepdims=True)
        if norm_w:
            w = w / np.maximum(w.sum(axis=1, keepdims=True), WEIGHTS_SUM_MIN)
        out = np.zeros_like(x)
        for t in range(x.shape[0]):
            xa = act(x[t])
            for j, e in enumerate(sel[t]):
                g = self.deq["gate"][e] @ xa
                h = (g / (1 + np.exp(-g))) * (self.deq["up"][e] @ xa)
                out[t] += (self.deq["down"][e] @ act(h)) * w[t, j]
        return out, sel

    def build(self, ctx, where, norm_w: bool):
        """Tensors placed by `where(name)` (a buffer type); returns (graph, out, selected)."""
        T = self.x.shape[0]
        specs = {"x": ("f32", [E, T]), "router": ("f32", [E, N_EXPERT]),
                 "up": (self.wtype, [E, F, N_EXPERT]), "gate": (self.wtype, [E, F, N_EXPERT]),
                 "down": (self.wtype, [F, E, N_EXPERT])}
        t = {n: ctx.new_tensor(ty, ne, name=n) for n, (ty, ne) in specs.items()}
        t["x"].set_input()
        by = {}
        for n, ten in t.items():
            by.setdefault(id(where(n)), (where(n), []))[1].append(ten)
        self._buffers = [alloc_tensors(bt, ts, BufferUsage.WEIGHTS) for bt, ts in by.values()]
        tensor_set(t["x"], self.x)
        tensor_set(t["router"], self.router)
        for n in ("up", "gate", "down"):
            tensor_set(t[n], self.raw[n])
        out = moe_ffn(ctx, t["x"], t["router"], t["up"], t["gate"], t["down"], self.k,
                      gating=self.gating, norm_w=norm_w, name="moe")
        out.set_output()
        sel = _find(out, "moe-topk")
        sel.set_output()
        g = Graph()
        g.build_forward_expand(out)
        g.build_forward_expand(sel)
        return g, out, sel


def _find(root, name):
    seen, stack = set(), [root]
    while stack:
        t = stack.pop()
        if t.name == name:
            return t
        if id(t) not in seen:
            seen.add(id(t))
            stack.extend(s for s in t.src if s is not None)
    raise KeyError(name)


def read(t) -> np.ndarray:
    """Values of a (possibly strided) 2-D F32/I32 tensor, numpy shape (ne1, ne0)."""
    dt = np.int32 if t.type == GGMLType.I32 else np.float32
    src = t.view_src if t.view_src is not None else t
    raw = np.frombuffer(tensor_get(src), dtype=dt)
    arr = np.lib.stride_tricks.as_strided(raw[t.view_offs // 4:] if t.view_src is not None
                                          else raw, (t.ne[1], t.ne[0]), (t.nb[1], t.nb[0]))
    return arr.astype(np.float64 if dt == np.float32 else np.int64)


def close(got, ref, tol):
    err = np.max(np.abs(got - ref)) / np.max(np.abs(ref))
    assert err <= tol, f"max relative error {err:.3g} > {tol}"


CASES = [  # (wtype, tokens, k, gating, norm_w)
    ("q4_0", 1, 2, "softmax", True), ("q4_0", 7, 2, "softmax", False),
    ("q4_k", 1, 4, "softmax", True), ("q4_k", 7, 4, "sigmoid", True),
    ("q4_k", 5, 1, "softmax", False), ("q8_0", 6, 3, "softmax_weight", False),
    ("q6_k", 4, 2, "softmax", True),
]


def _ids(c):
    return f"{c[0]}-T{c[1]}-k{c[2]}-{c[3]}{'-norm' if c[4] else ''}"


@pytest.fixture(scope="module")
def cpus():
    return [CpuBackend(n_threads=1), CpuBackend(n_threads=2)]


def _cpu_run(case, cpus):
    wtype, T, k, gating, norm_w = case
    blk = Block(wtype, T, k, gating, zlib.crc32(_ids(case).encode()))
    ctx = Context(no_alloc=True)
    g, out, sel = blk.build(ctx, lambda n: cpu_buffer_type(), norm_w)
    results = []
    for cpu in cpus:
        s = Scheduler([cpu])
        s.alloc_graph(g)
        s.graph_compute(g)
        results.append((read(out), read(sel)))
    assert results[0][0].tobytes() == results[1][0].tobytes(), "1 and 2 threads differ"
    return blk, norm_w, results[0]


@pytest.mark.parametrize("case", CASES, ids=_ids)
def test_moe_block_cpu(case, cpus):
    blk, norm_w, (got, sel) = _cpu_run(case, cpus)
    ref, ref_sel = blk.reference(norm_w, quantize_acts=True)
    assert np.array_equal(sel, ref_sel)
    close(got, ref, 1e-4)
    close(got, blk.reference(norm_w, quantize_acts=False)[0], 3e-2)


@pytest.fixture(params=_native.available_paths())
def path(request):
    before = _native.cpu_path()
    _native.set_cpu_path(request.param)
    yield request.param
    _native.set_cpu_path(before)


@pytest.mark.parametrize("case", [CASES[1], CASES[3]], ids=_ids)
def test_moe_block_cpu_every_path(case, path, cpus):
    blk, norm_w, (got, sel) = _cpu_run(case, cpus)
    ref, ref_sel = blk.reference(norm_w, quantize_acts=True)
    assert np.array_equal(sel, ref_sel)
    close(got, ref, 1e-4)


@pytest.fixture(scope="module")
def vk():
    try:
        from pyggml.backend import vulkan
        devs = vulkan.devices()
    except Exception as e:          # no vulkan module, loader or shaders
        pytest.skip(f"Vulkan unavailable: {e}")
    if not devs:
        pytest.skip(f"no Vulkan device: {vulkan.unavailable_reason()}")
    be = devs[0].init_backend()
    yield be
    be.close()


@pytest.mark.parametrize("case", CASES, ids=_ids)
def test_moe_block_vulkan(case, vk, cpus):
    """Every node on Vulkan (one split), then the experts in host memory: the three mul_mat_id
    nodes run on the CPU, the router and the sums on Vulkan."""
    wtype, T, k, gating, norm_w = case
    blk = Block(wtype, T, k, gating, zlib.crc32(_ids(case).encode()))
    ref, ref_sel = blk.reference(norm_w, quantize_acts=False)
    cpu = cpus[1]
    ctx = Context(no_alloc=True)
    g, out, sel = blk.build(ctx, lambda n: vk.get_default_buffer_type(), norm_w)
    s = Scheduler([vk, cpu])
    s.alloc_graph(g)
    assert [s.get_backend(sp.backend_id).name for sp in s.splits] == [vk.name]
    s.graph_compute(g)
    got = read(out)
    assert np.array_equal(read(sel), ref_sel)
    close(got, ref, 1e-4)

    ctx = Context(no_alloc=True)
    host = {"up", "gate", "down"}
    g, out2, sel2 = blk.build(ctx, lambda n: cpu_buffer_type() if n in host
                              else vk.get_default_buffer_type(), norm_w)
    s = Scheduler([vk, cpu])
    s.alloc_graph(g)
    on_cpu = {n.name for sp in s.splits if s.get_backend(sp.backend_id) is cpu
              for n in sp.graph.nodes}
    assert {"moe-up", "moe-gate", "moe-down"} <= on_cpu
    assert "moe-logits" not in on_cpu and "moe-topk (argsort)" not in on_cpu
    s.graph_compute(g)
    assert np.array_equal(read(sel2), ref_sel)
    _, _, (cpu_out, _) = _cpu_run(case, cpus[:1] * 2)
    close(read(out2), cpu_out, 1e-5)          # the expert matmuls are the CPU's


@pytest.mark.parametrize("n_tokens", [40, 4])
def test_moe_block_host_experts_offloaded_for_batches(n_tokens, vk, cpus):
    """With op_offload (llama.cpp's default), a batch of at least 32 tokens copies the host
    experts to the GPU for its mul_mat_id (ggml-vulkan counts MUL_MAT_ID's batch in ne[2]); a
    smaller one runs them where they are."""
    blk = Block("q4_0", n_tokens, 2, "softmax", 5)
    ref, ref_sel = blk.reference(True, quantize_acts=False)
    host = {"up", "gate", "down"}
    ctx = Context(no_alloc=True)
    g, out, sel = blk.build(ctx, lambda n: cpu_buffer_type() if n in host
                            else vk.get_default_buffer_type(), True)
    s = Scheduler([vk, cpus[1]], op_offload=True)
    s.alloc_graph(g)
    on_cpu = {n.name for sp in s.splits if s.get_backend(sp.backend_id) is cpus[1]
              for n in sp.graph.nodes}
    if n_tokens >= 32:
        assert not {"moe-up", "moe-gate", "moe-down"} & on_cpu
    else:
        assert {"moe-up", "moe-gate", "moe-down"} <= on_cpu
    s.graph_compute(g)
    assert np.array_equal(read(sel), ref_sel)
    close(read(out), ref, 1e-4 if n_tokens >= 32 else 3e-2)


def test_moe_block_without_gate_gelu_and_scaled_weights(cpus):
    """No gate experts (act(up)), GELU, w_scale and a selection bias (exp_probs_b shifts the
    choice, not the weights), on F32 experts: float64 reference within fp32 rounding (GELU's
    fp16 table: 1e-3)."""
    rng = np.random.default_rng(7)
    T, k, n_expert = 3, 2, 6
    xv = rng.standard_normal((T, 64)).astype(np.float32)
    rv = (rng.standard_normal((n_expert, 64)) * 0.3).astype(np.float32)
    uv = (rng.standard_normal((n_expert, 32, 64)) * 0.2).astype(np.float32)
    dv = (rng.standard_normal((n_expert, 64, 32)) * 0.2).astype(np.float32)
    bias = np.array([0, 0, 5.0, 0, 0, 0], np.float32)        # expert 2 always chosen
    ctx = Context(no_alloc=True)
    ts = {n: ctx.new_tensor("f32", list(reversed(v.shape)), name=n)
          for n, v in (("x", xv), ("r", rv), ("u", uv), ("d", dv), ("b", bias))}
    buf = alloc_tensors(cpu_buffer_type(), list(ts.values()), BufferUsage.WEIGHTS)
    for n, v in (("x", xv), ("r", rv), ("u", uv), ("d", dv), ("b", bias)):
        tensor_set(ts[n], v)
    out = moe_ffn(ctx, ts["x"], ts["r"], ts["u"], None, ts["d"], k, w_scale=2.5,
                  exp_probs_b=ts["b"], act="gelu", name="m")
    g = Graph()
    g.build_forward_expand(out)
    s = Scheduler([cpus[0]])
    s.alloc_graph(g)
    s.graph_compute(g)
    logits = xv.astype(np.float64) @ rv.T.astype(np.float64)
    p = np.exp(logits - logits.max(1, keepdims=True))
    p /= p.sum(1, keepdims=True)
    sel = np.argsort(-(p + bias), axis=1, kind="stable")[:, :k]
    assert np.all(sel[:, 0] == 2)
    ref = np.zeros((T, 64))
    for t in range(T):
        for j, e in enumerate(sel[t]):
            u = uv[e].astype(np.float64) @ xv[t]
            h = 0.5 * u * (1 + np.tanh(np.sqrt(2 / np.pi) * (u + 0.044715 * u ** 3)))
            ref[t] += (dv[e].astype(np.float64) @ h) * p[t, e] * 2.5
    close(read(out), ref, 1e-3)
    del buf
    with pytest.raises(ValueError, match="gating"):
        moe_ffn(ctx, ts["x"], ts["r"], ts["u"], None, ts["d"], k, gating="top1")
    with pytest.raises(ValueError, match="n_expert_used=7"):
        moe_ffn(ctx, ts["x"], ts["r"], ts["u"], None, ts["d"], 7)
