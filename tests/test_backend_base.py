"""The backend interface levels: Registry → Device → BufferType → Buffer, Backend, Event; the CPU
backend implementing them; tensor bytes across host and separate (test device) memory."""

from __future__ import annotations

import numpy as np
import pytest

from pyggml import Context, Graph, ops
from pyggml.backend.base import (
    BackendReg,
    BufferType,
    BufferUsage,
    DeviceType,
    Registry,
    alloc_tensors,
    buffer_usage,
    is_host_buffer,
    is_host_tensor,
    tensor_copy,
    tensor_get,
    tensor_get_into,
    tensor_set,
)
from pyggml.backend.cpu import (
    CpuBackend,
    CpuDevice,
    HostBufferType,
    backend_reg,
    cpu_buffer_type,
    cpu_device,
)
from pyggml.errors import BackendError
from pyggml.types import Op
from support.devices import HostPeerBackend, TestDevice, test_registry

RNG = np.random.default_rng(7)


@pytest.fixture(scope="module")
def cpu():
    return CpuBackend(n_threads=1)


@pytest.fixture
def dev():
    return TestDevice()


# ---- registry and devices ------------------------------------------------------------------------

def test_registry_cpu_is_found_and_last():
    reg, (tdev,) = test_registry()
    devs = reg.devices()
    assert [d.name for d in devs] == ["TEST", "CPU"]
    assert devs[-1] is cpu_device() and devs[-1].type is DeviceType.CPU
    assert reg.device("cpu") is cpu_device()
    assert reg.device("TEST") is tdev
    assert reg.devices_of_type(DeviceType.GPU) == [tdev]
    with pytest.raises(BackendError, match="no device named 'NPU'.*known: TEST, CPU"):
        reg.device("NPU")
    backends = reg.init_backends(n_threads=1)
    assert [b.name for b in backends] == ["TEST", "CPU"]
    assert backends[1].n_threads == 1 and backends[0].device is tdev
    for b in backends:
        b.close()


def test_registry_records_modules_that_cannot_load():
    reg = Registry(modules=("pyggml.backend.no_such_backend", "pyggml.backend.cpu",
                            "pyggml.types"))
    assert [d.name for d in reg.devices()] == ["CPU"]
    assert "ModuleNotFoundError" in reg.load_errors["pyggml.backend.no_such_backend"]
    assert "has no backend_reg()" in reg.load_errors["pyggml.types"]


def test_registry_register_unregister_and_order():
    reg = Registry(modules=("pyggml.backend.cpu",))
    extra = BackendReg("TEST", [TestDevice("TEST"), TestDevice("TEST1")])
    reg.register(extra)
    reg.register(extra)                      # twice: listed once
    assert [d.name for d in reg.devices()] == ["TEST", "TEST1", "CPU"]
    assert all(d.reg is extra for d in extra.devices())
    reg.unregister(extra)
    assert [d.name for d in reg.devices()] == ["CPU"]


def test_cpu_device_props():
    d = cpu_device()
    assert isinstance(d, CpuDevice) and backend_reg().devices() == [d]
    p = d.props()
    assert p.type is DeviceType.CPU and p.name == "CPU" and p.description
    assert 0 < p.memory_free <= p.memory_total
    assert p.buffer_types == ("CPU",) and p.host_buffer_type == "CPU" and p.events
    assert d.default_buffer_type() is cpu_buffer_type() is d.host_buffer_type()
    assert cpu_buffer_type().device is d and cpu_buffer_type().is_host


def test_test_device_is_not_host(cpu, dev):
    buft = dev.default_buffer_type()
    assert not buft.is_host and buft.alignment == 128 and buft.device is dev
    assert not cpu.supports_buft(buft) and cpu.supports_buft(cpu_buffer_type())
    b = dev.init_backend()
    assert b.supports_buft(buft) and not b.supports_buft(cpu_buffer_type())
    free, total = dev.memory()
    buf = buft.alloc_buffer(1000)
    assert dev.memory() == (free - 1000, total)
    assert buf.base % 128 == 0 and not buf.is_host and not is_host_buffer(buf)
    b.close()


def test_buffer_type_alignment_must_be_power_of_two():
    with pytest.raises(ValueError, match="power of two, got 48"):
        BufferType("x", alignment=48)


# ---- buffers and tensor bytes --------------------------------------------------------------------

def _vec(ctx, n, name):
    return ctx.new_tensor("f32", [n], name=name)


def test_host_buffer_set_get_memset_clear_and_bounds():
    ctx = Context(no_alloc=True)
    a, b = _vec(ctx, 10, "a"), _vec(ctx, 6, "b")
    buf = alloc_tensors(cpu_buffer_type(), [a, b], usage=BufferUsage.COMPUTE)
    assert buf.usage is BufferUsage.COMPUTE and buffer_usage(buf) is BufferUsage.COMPUTE
    assert a.buffer is buf and b.data - a.data == 64           # 40 bytes aligned to 64
    vals = np.arange(10, dtype=np.float32)
    buf.set_tensor(a, vals.tobytes())
    assert np.frombuffer(buf.get_tensor(a), np.float32).tolist() == vals.tolist()
    assert buf.get_tensor(a, 4, 8) == vals[1:3].tobytes()
    buf.memset_tensor(a, 0, 8, 8)
    assert np.frombuffer(tensor_get(a), np.float32).tolist() == [0, 1, 0, 0, 4, 5, 6, 7, 8, 9]
    with pytest.raises(BackendError, match=r"'a': bytes \[128, 136\) outside the buffer of 128"):
        buf.set_tensor(a, b"\0" * 8, offset=buf.n_bytes)
    buf.clear(0xFF)
    assert tensor_get(b) == b"\xff" * 24


def test_tensor_set_get_copy_across_memories(dev):
    ctx = Context(no_alloc=True)
    h1, h2 = _vec(ctx, 33, "h1"), _vec(ctx, 33, "h2")
    d1, d2 = _vec(ctx, 33, "d1"), _vec(ctx, 33, "d2")
    alloc_tensors(cpu_buffer_type(), [h1, h2])
    buf = alloc_tensors(dev.default_buffer_type(), [d1, d2], usage=BufferUsage.WEIGHTS)
    assert buf.usage is BufferUsage.WEIGHTS and d2.data - d1.data == 256
    assert is_host_tensor(h1) and not is_host_tensor(d1)
    vals = RNG.standard_normal(33).astype(np.float32)
    tensor_set(h1, vals)
    tensor_copy(h1, d1)                            # host -> device
    assert dev.bytes_in == 132
    tensor_copy(d1, d2)                            # device -> device (buffer cpy_tensor)
    tensor_copy(d2, h2)                            # device -> host
    assert dev.bytes_out == 132
    assert tensor_get(h2) == vals.tobytes() == tensor_get(d1)
    tensor_set(d1, b"\x01\x02", offset=4)
    assert tensor_get(d1, 4, 2) == b"\x01\x02"
    with pytest.raises(BackendError, match=r"'d1': bytes \[130, 134\) outside"):
        tensor_set(d1, b"abcd", offset=130)
    short = _vec(ctx, 3, "short")
    alloc_tensors(cpu_buffer_type(), [short])
    with pytest.raises(BackendError, match="132 bytes into 12 bytes"):
        tensor_copy(h1, short)
    with pytest.raises(BackendError, match="'late' has no data"):
        tensor_copy(h1, _vec(ctx, 33, "late"))


def test_tensor_get_into_reads_into_an_array(dev):
    """tensor_get_into fills a caller's array from host memory (memmove) and from a device
    buffer (its get_tensor_into; the default goes through get_tensor), bounds checked, and
    refuses a destination it cannot write in place."""
    ctx = Context(no_alloc=True)
    h, d = _vec(ctx, 33, "h"), _vec(ctx, 33, "d")
    alloc_tensors(cpu_buffer_type(), [h])
    buf = alloc_tensors(dev.default_buffer_type(), [d])
    vals = RNG.standard_normal(33).astype(np.float32)
    tensor_set(h, vals)
    tensor_set(d, vals)
    for t in (h, d):
        out = np.zeros(33, np.float32)
        assert tensor_get_into(t, out) is out and np.array_equal(out, vals)
        tail = np.zeros(3, np.float32)
        assert np.array_equal(tensor_get_into(t, tail, offset=30 * 4), vals[30:])
        with pytest.raises(BackendError, match=r"'%s': bytes \[120, 136\) outside" % t.name):
            tensor_get_into(t, np.zeros(4, np.float32), offset=120)
        with pytest.raises(BackendError, match="writable C-contiguous"):
            tensor_get_into(t, np.zeros((33, 2), np.float32)[:, 0])
    del buf


def test_alloc_tensors_places_views_and_refuses_placed_tensors():
    ctx = Context(no_alloc=True)
    w = ctx.new_tensor("f32", [8, 4], name="w")
    v = ops.view_1d(ctx, w, 8, offset=32, name="row1")
    alloc_tensors(cpu_buffer_type(), [w, v])
    assert v.data == w.data + 32 and v.buffer is w.buffer
    tensor_set(w, np.arange(32, dtype=np.float32))
    assert np.frombuffer(tensor_get(v), np.float32).tolist() == list(range(8, 16))
    with pytest.raises(BackendError, match="'w' already has data"):
        alloc_tensors(cpu_buffer_type(), [w])


def test_strict_test_memory_refuses_access_while_busy(dev):
    dev.strict = True
    b = dev.init_backend(delay_s=0.05)
    ctx = Context(no_alloc=True)
    x = _vec(ctx, 16, "x")
    y = ops.scale(ctx, x, 2.0, name="y")
    alloc_tensors(dev.default_buffer_type(), [x, y])
    g = Graph()
    g.build_forward_expand(y)
    b.graph_compute(g)
    with pytest.raises(BackendError, match="while 1 task"):
        tensor_get(y)
    b.synchronize()
    tensor_get(y)
    b.close()


# ---- backends ------------------------------------------------------------------------------------

def test_cpu_backend_interface(cpu):
    assert cpu.device is cpu_device() and cpu.get_default_buffer_type() is cpu_buffer_type()
    assert isinstance(HostBufferType(), HostBufferType)
    ev = cpu.event_new()
    ev.record()
    ev.synchronize()
    cpu.event_wait(ev)
    cpu.synchronize()
    assert not cpu.offload_op(None) and not cpu.cpy_tensor_async(None, None)


def test_cpu_supports_op_cache_answers_per_layout(cpu):
    ctx = Context(no_alloc=True)
    a = ctx.new_tensor("f32", [8, 2])
    good = ops.add(ctx, a, ctx.new_tensor("f32", [8, 2]))
    bad = ops.add(ctx, a, ctx.new_tensor("f16", [8, 2]))      # CPU: b must match a's type
    answers = [cpu.supports_op(t) for t in (good, bad, good, bad)]
    assert answers[0] and answers == [answers[0], answers[1]] * 2
    assert cpu.why_unsupported(bad) == cpu._why_unsupported(bad)


def test_test_backend_events_order_work(dev):
    b = dev.init_backend(delay_s=0.02)
    ctx = Context(no_alloc=True)
    x = _vec(ctx, 8, "x")
    y = ops.scale(ctx, x, 3.0, name="y")
    alloc_tensors(dev.default_buffer_type(), [x, y])
    tensor_set(x, np.ones(8, np.float32))
    g = Graph()
    g.build_forward_expand(y)
    b.graph_compute(g)
    ev = b.event_new()
    ev.record()
    ev.synchronize()                         # waits for the compute queued before the record
    assert dev.pending == 0 and np.frombuffer(tensor_get(y), np.float32).tolist() == [3.0] * 8
    assert ev.n_records == 1
    b.close()


def test_test_backend_refuses_foreign_memory(dev):
    b = dev.init_backend()
    ctx = Context(no_alloc=True)
    x = _vec(ctx, 8, "x")
    y = ops.scale(ctx, x, 3.0, name="y")
    alloc_tensors(cpu_buffer_type(), [x])
    alloc_tensors(dev.default_buffer_type(), [y])
    g = Graph()
    g.build_forward_expand(y)
    with pytest.raises(BackendError, match="touches 'x' at 0x[0-9a-f]+, outside TEST memory"):
        b.graph_compute(g)
    b.close()


def test_host_peer_shares_cpu_buffer_type():
    p = HostPeerBackend()
    assert p.get_default_buffer_type() is cpu_buffer_type() and p.device.type is DeviceType.ACCEL
    ctx = Context(no_alloc=True)
    a = ctx.new_tensor("f32", [8])
    assert p.supports_op(ops.add(ctx, a, a)) and not p.supports_op(ops.silu(ctx, a))
    assert "SILU is not one of PEER's ops" in p.why_unsupported(ops.silu(ctx, a))
    assert p.supports_op(ops.reshape(ctx, a, [2, 4])) and Op.SILU not in p.ops


def test_mapped_gguf_weights_are_host_weights_and_read_only(tiny_models):
    from pyggml.gguf import GGUFModel
    tm = tiny_models.get(arch="llama", weight_type="q8_0")
    model = GGUFModel.open(tm.path)
    w = model.create_tensors()
    t = w["blk.0.attn_q.weight"]
    assert is_host_buffer(t.buffer) and buffer_usage(t.buffer) is BufferUsage.WEIGHTS
    assert is_host_tensor(t) and len(tensor_get(t, 0, 34)) == 34
    with pytest.raises(BackendError, match="'blk.0.attn_q.weight': its memory .* is read-only"):
        tensor_set(t, b"\0" * 34)
