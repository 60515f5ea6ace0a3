"""Every op the Vulkan backend accepts, computed on Vulkan and on the CPU backend, must agree
(ggml's test-backend-ops): op x type x shape, odd sizes that are not multiples of any workgroup
size, permuted inputs where the op allows them, in-place forms. The cases and their bounds on the
normalized mean squared error are the registry tests/support/op_cases.py shares with the
rpc-server's tests (tests/test_rpc.py).

Each case also fills guard tensors between all tensors of the graph and checks after the compute
that neither the guards nor the inputs changed (out-of-bounds writes).

Three device configurations run the whole list: the device's own choice (on lavapipe: one 8-wide
subgroup per row, subgroup arithmetic, 16-bit stores, 8 elements per invocation, 8 matvec rows
per workgroup, 32x32 matmul tiles), what KernelConfig picks for GPUs (64-wide rows reduced over
several subgroups, 256-wide element-wise, 2 matvec rows, 64x64 tiles) and a portable one
(shared-memory reductions, fp16 stores with word atomics, one element per invocation, one matvec
row, staging copies instead of mapped memory). Skips only when there is no Vulkan device at all.
"""
from __future__ import annotations

import fcntl
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

from pyggml import Context, Graph
from pyggml.backend import base
from pyggml.backend.cpu import CpuBackend
from pyggml.types import Op
from support.op_cases import Inputs, cases_for, check_build, check_op_case, view_of_raw
from support.op_cases import nmse  # noqa: F401 - test_vulkan_backend takes it from here

REPO = Path(__file__).resolve().parent.parent

# build the shaders the tests load (cheap when up to date; locked: pytest-xdist workers import
# this module at the same time); without glslang the backend says so
if shutil.which("glslangValidator"):
    (REPO / "build").mkdir(exist_ok=True)
    with open(REPO / "build" / ".shaders.lock", "w") as _lock:
        fcntl.flock(_lock, fcntl.LOCK_EX)
        subprocess.run(["make", "-s", "shaders"], cwd=REPO, check=True)

from pyggml.backend import vulkan  # noqa: E402
from pyggml.backend.vulkan.info import Instance, vk_module  # noqa: E402


def _physical_devices() -> int:
    if vk_module() is None:
        return 0
    try:
        return len(Instance.physical_devices())
    except Exception:
        return 0


if _physical_devices() == 0:
    pytest.skip(f"no Vulkan device on this machine ({vulkan.unavailable_reason()})",
                allow_module_level=True)


# ---- fixtures ------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def cpu():
    return CpuBackend(n_threads=2)


CONFIGS = {
    "native": None,
    # what KernelConfig picks for a GPU: 64-wide row kernels (on lavapipe: 8 subgroups combined
    # through shared memory), 256-wide element-wise, 2 matvec rows, 64x64 tiles
    "gpu": dict(wg_reduce=64, wg_elem=256, ept=1, mmv_rows=2, mm_tile=64),
    "portable": dict(subgroup=False, store16=False, wg_reduce=64, wg_elem=128, ept=1,
                     mm_tile=64, mmv_rows=1, host_mapped=False),
}
_backends: dict = {}


def vk_backend(config: str = "native") -> vulkan.VulkanBackend:
    be = _backends.get(config)
    if be is None:
        assert vulkan.devices(), \
            f"a Vulkan device exists but is unusable: {vulkan.unavailable_reason()}"
        if CONFIGS[config] is None:
            be = vulkan.VulkanBackend(device_index=0)
        else:
            be = vulkan.open_device(0, **CONFIGS[config]).init_backend()
        _backends[config] = be
    return be


@pytest.fixture(scope="module", params=list(CONFIGS))
def vk(request):
    return vk_backend(request.param)


# ---- the harness ---------------------------------------------------------------------------------

def compute_vk(build, seed, vk: vulkan.VulkanBackend):
    ctx = Context(no_alloc=True)
    inp = Inputs(ctx, seed)
    out, check = build(ctx, inp)
    g = Graph()
    g.build_forward_expand(out)
    tensors = list(ctx.tensors)
    guards = [ctx.new_tensor_1d("f32", 24, name=f"guard{i}") for i in range(len(tensors) + 1)]
    order = [x for pair in zip(guards, tensors) for x in pair] + [guards[-1]]
    buf = base.alloc_tensors(vk.get_default_buffer_type(), order, base.BufferUsage.COMPUTE)
    pattern = np.full(24, -12345.5, np.float32).tobytes()
    for gt in guards:
        base.tensor_set(gt, pattern)
    for t, raw in inp.values:
        base.tensor_set(t, raw)
    vk.graph_compute(g)
    vk.synchronize()
    result = view_of_raw(check, base.tensor_get(check)).astype(np.float64).copy()
    for gt in guards:
        assert base.tensor_get(gt) == pattern, f"out-of-bounds write into {gt.name}"
    written = {id(check), id(check.view_src)}          # and memory nodes write in place:
    written |= {id(n.view_src) for n in g.nodes if n.view_src is not None
                and n.op not in (Op.VIEW, Op.RESHAPE, Op.PERMUTE, Op.TRANSPOSE)}
    for t, raw in inp.values:
        if id(t) not in written:
            assert base.tensor_get(t) == raw, f"input '{t.name}' was modified"
    del buf
    return result


def check_case(name, build, tol, vk, cpu) -> float:
    """A build that is not in the registry (tests/test_vulkan_backend.py) on `vk`."""
    return check_build(name, build, tol, lambda b, seed: compute_vk(b, seed, vk), cpu)


@pytest.mark.parametrize("name", cases_for("vulkan"))
def test_op_parity(name, vk, cpu):
    check_op_case(name, "vulkan", lambda build, seed: compute_vk(build, seed, vk), cpu)
