"""The scheduler with the Vulkan backend, where a Vulkan device is available (lavapipe counts):
weights on Vulkan and on the CPU, results close to a CPU-only run, the recorded command buffer
replayed on graph reuse. Skipped without Vulkan."""

from __future__ import annotations

import numpy as np
import pytest

from pyggml import Context
from pyggml.backend.base import tensor_set
from pyggml.backend.cpu import CpuBackend, cpu_buffer_type
from pyggml.sched import Scheduler
from support.graphs import make_weights, read_f32
from test_sched import BLOCK_SPECS, K, M, build_block


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


def test_block_over_vulkan_and_cpu(vk):
    cpu = CpuBackend(n_threads=2)
    xv = np.random.default_rng(3).standard_normal((M, K)).astype(np.float32)
    ctx = Context(no_alloc=True)
    w = make_weights(ctx, BLOCK_SPECS, {k: cpu_buffer_type() for k in BLOCK_SPECS})
    x, g, out = build_block(ctx, w)
    s1 = Scheduler([cpu])
    s1.alloc_graph(g)
    tensor_set(x, xv)
    s1.graph_compute(g)
    ref = read_f32(out)

    vb = vk.get_default_buffer_type()
    ctx = Context(no_alloc=True)
    w = make_weights(ctx, BLOCK_SPECS, {"w_o": cpu_buffer_type(), "w_up": vb, "w_q": vb,
                                        "norm": vb})
    x, g, out = build_block(ctx, w)
    s = Scheduler([vk, cpu])
    s.alloc_graph(g)
    assert [(s.backends[p.backend_id].name, [t.name for t in p.inputs]) for p in s.splits] == [
        (vk.name, ["x"]), ("CPU", ["n8"])]
    tensor_set(x, xv)
    s.graph_compute(g)
    got = read_f32(out)
    assert np.abs(got - ref).max() <= 2e-2 * np.abs(ref).max()
    n = vk.n_recordings
    for _ in range(3):
        tensor_set(x, xv)
        s.graph_compute(g)
    assert vk.n_recordings == n and np.array_equal(read_f32(out), got)
