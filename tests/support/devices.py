"""Test-only devices for the scheduler (never registered outside tests).

TestDevice ("TEST"): a CPU-like device whose memory is NOT host memory for the scheduler (its
buffer type has is_host=False and the CPU backend refuses it), so every crossing is a real copy.
Its backend computes with the C executor of an internal CpuBackend on a worker thread, i.e.
asynchronously: graph_compute returns at once, synchronize() waits, events are real markers in its
queue. Checks that catch scheduler bugs deterministically:
  - graph_compute refuses a graph whose non-view nodes touch memory outside TEST buffers;
  - strict=True: reading or writing TEST memory while work is queued or running raises (valid
    for n_copies=1, where the scheduler synchronizes before every copy);
  - an optional delay before each compute makes a missing synchronisation show in the results.

HostPeerBackend ("PEER"): a BLAS-like backend on host memory with the CPU's own buffer type,
supporting a few ops; it lets pass 3 upgrade nodes from the CPU.
"""

from __future__ import annotations

import queue
import threading
import time
import weakref

import numpy as np

from pyggml.backend.base import (
    Backend,
    BackendReg,
    Buffer,
    BufferType,
    BufferUsage,
    Device,
    DeviceType,
    Event,
    Registry,
)
from pyggml.backend.cpu import CpuBackend, cpu_buffer_type
from pyggml.errors import BackendError
from pyggml.types import VIEW_OPS, Op


# ---- memory -------------------------------------------------------------------------------------

class TestBufferType(BufferType):
    __test__ = False

    def __init__(self, device: "TestDevice"):
        super().__init__(device.name, alignment=128, max_size=None, is_host=False, device=device)

    def alloc_buffer(self, n_bytes: int, usage: BufferUsage = BufferUsage.ANY) -> "TestBuffer":
        return TestBuffer(self, n_bytes, usage)


class TestBuffer(Buffer):
    """Separate memory: only this object's methods (and the TEST backend) touch it."""
    __test__ = False

    def __init__(self, buft: TestBufferType, n_bytes: int, usage: BufferUsage):
        super().__init__(buft, n_bytes, usage)
        self._mem = np.zeros(max(n_bytes, 1) + buft.alignment, dtype=np.uint8)
        pad = (-self._mem.ctypes.data) % buft.alignment
        self.base = self._mem.ctypes.data + pad
        self.array = self._mem[pad:pad + n_bytes]
        self.device: TestDevice = buft.device
        self.device._buffers.add(self)

    def _idle(self, what: str, t) -> None:
        dev = self.device
        dev.n_accesses += 1
        if dev.strict and dev.pending:
            raise BackendError(f"{what} '{t.name}' in {dev.name} memory while {dev.pending} "
                               f"task(s) are queued or running on {dev.name}")

    def set_tensor(self, tensor, data, offset: int = 0) -> None:
        raw = np.frombuffer(memoryview(data).cast("B"), dtype=np.uint8)
        start = self._range(tensor, offset, raw.size, "set_tensor")
        self._idle("set_tensor", tensor)
        self.array[start:start + raw.size] = raw
        self.device.bytes_in += raw.size

    def get_tensor(self, tensor, offset: int = 0, n_bytes: int | None = None) -> bytes:
        n = tensor.nbytes() - offset if n_bytes is None else n_bytes
        start = self._range(tensor, offset, n, "get_tensor")
        self._idle("get_tensor", tensor)
        self.device.bytes_out += n
        return self.array[start:start + n].tobytes()

    def cpy_tensor(self, src, dst) -> bool:
        sbuf = src.buffer
        if isinstance(sbuf, TestBuffer) and sbuf.device is self.device:
            n = src.nbytes()
            s0 = sbuf._range(src, 0, n, "cpy_tensor")
            d0 = self._range(dst, 0, n, "cpy_tensor")
            self._idle("cpy_tensor", dst)
            self.array[d0:d0 + n] = sbuf.array[s0:s0 + n]
            return True
        return super().cpy_tensor(src, dst)

    def clear(self, value: int = 0) -> None:
        self.array[:] = value


# ---- device, events, backend --------------------------------------------------------------------

class TestDevice(Device):
    __test__ = False
    type = DeviceType.GPU

    def __init__(self, name: str = "TEST", memory: int = 1 << 30):
        self.name = name
        self.description = "test-only CPU-like device with separate memory"
        self._memory = memory
        self._buffers: "weakref.WeakSet[TestBuffer]" = weakref.WeakSet()
        self._buft = TestBufferType(self)
        self.strict = False
        self.pending = 0               # tasks queued or running on any of its backends
        self.n_accesses = 0
        self.bytes_in = 0
        self.bytes_out = 0

    def memory(self) -> tuple[int, int]:
        used = sum(b.n_bytes for b in list(self._buffers))
        return max(0, self._memory - used), self._memory

    def buffer_types(self) -> list[BufferType]:
        return [self._buft]

    def has_events(self) -> bool:
        return True

    def init_backend(self, **params) -> "TestBackend":
        return TestBackend(self, **params)

    def owns(self, t) -> bool:
        if t.data is None:
            return False
        n = t.nbytes()
        return any(b.base <= t.data and t.data + n <= b.base + b.n_bytes
                   for b in list(self._buffers))


class TestEvent(Event):
    """Each record() is a new marker; waits bind to the marker current when they are asked for
    (as CUDA's stream-wait-event does), so a wait queued before a re-record cannot deadlock."""
    __test__ = False

    def __init__(self, backend: "TestBackend"):
        super().__init__(backend)
        self._marker = threading.Event()
        self._marker.set()
        self.n_records = 0

    def record(self) -> None:
        self.n_records += 1
        self._marker = marker = threading.Event()
        self.backend._submit(marker.set)

    def synchronize(self) -> None:
        self._marker.wait()


class TestBackend(Backend):
    """Computes on TEST memory on a worker thread (see the module docstring).

    unsupported: ops it refuses; offload_min_rows: offload_op says yes for MUL_MAT with at least
    this many activation rows (None: never); delay_s: sleep before each compute."""
    __test__ = False

    def __init__(self, device: TestDevice, unsupported=(), offload_min_rows: int | None = None,
                 delay_s: float = 0.0, **_ignored):
        self.device = device
        self.name = device.name
        self.unsupported = frozenset(unsupported)
        self.offload_min_rows = offload_min_rows
        self.delay_s = delay_s
        self._cpu = CpuBackend(n_threads=1)
        self._checked: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()
        self._error: BaseException | None = None
        self._lock = threading.Lock()
        self._q: queue.Queue = queue.Queue()
        self._thread = threading.Thread(target=self._work, name=f"{self.name}-worker",
                                        daemon=True)
        self._thread.start()
        weakref.finalize(self, self._q.put, None)
        self.n_computes = 0
        self.n_syncs = 0
        self.computed: list = []      # the split graphs computed, in order

    # -- the worker --
    def _work(self) -> None:
        while True:
            fn = self._q.get()
            if fn is None:
                self._q.task_done()
                return
            try:
                fn()
            except BaseException as e:  # reported by synchronize()
                self._error = e
            finally:
                with self._lock:
                    self.device.pending -= 1
                self._q.task_done()

    def _submit(self, fn) -> None:
        with self._lock:
            self.device.pending += 1
        self._q.put(fn)

    # -- capabilities --
    def why_unsupported(self, node) -> str | None:
        if node.op in self.unsupported:
            return f"{node.op.name} is switched off on {self.name}"
        return self._cpu.why_unsupported(node)

    def supports_op(self, node) -> bool:
        return node.op == Op.NONE or node.op in VIEW_OPS or self.why_unsupported(node) is None

    def supports_buft(self, buft: BufferType) -> bool:
        return buft is self.device._buft

    def offload_op(self, node) -> bool:
        return (self.offload_min_rows is not None and node.op == Op.MUL_MAT
                and node.ne[1] >= self.offload_min_rows)

    # -- compute --
    def _check_memory(self, graph) -> None:
        for n in graph.nodes:
            if n.op in VIEW_OPS:
                continue
            for t in [n] + [s for s in n.src if s is not None]:
                if not self.device.owns(t):
                    where = "no data" if t.data is None else f"{t.data:#x}"
                    raise BackendError(f"{self.name}: node '{n.name}' ({n.op.name}) touches "
                                       f"'{t.name}' at {where}, outside {self.name} memory")

    def graph_compute(self, graph) -> None:
        if self._checked.get(graph) != graph.uid:
            self._check_memory(graph)
            self._checked[graph] = graph.uid
        plan = self._cpu.plan(graph)            # read the Python tensors now, compute later
        self.n_computes += 1
        self.computed.append(graph)
        delay = self.delay_s

        def run():
            if delay:
                time.sleep(delay)
            self._cpu.plan_compute(plan)
        self._submit(run)

    def synchronize(self) -> None:
        self.n_syncs += 1
        self._q.join()
        if self._error is not None:
            e, self._error = self._error, None
            raise BackendError(f"{self.name}: {e}") from e

    def event_new(self) -> TestEvent:
        return TestEvent(self)

    def event_wait(self, event: Event) -> None:
        marker = getattr(event, "_marker", None)
        if marker is None:                  # another kind of event: wait for it right here
            event.synchronize()
        else:
            self._submit(marker.wait)

    @property
    def n_plans_built(self) -> int:
        return self._cpu.n_plans_built

    def close(self) -> None:
        self._q.put(None)


class PeerDevice(Device):
    name = "PEER"
    description = "test-only BLAS-like backend on host memory"
    type = DeviceType.ACCEL

    def memory(self) -> tuple[int, int]:
        return 0, 0

    def buffer_types(self) -> list[BufferType]:
        return [cpu_buffer_type()]

    def init_backend(self, **params) -> "HostPeerBackend":
        return HostPeerBackend(**params)


_peer_device = PeerDevice()


class HostPeerBackend(CpuBackend):
    """Runs only `ops` (default MUL_MAT and ADD) on host memory, with the CPU's buffer type."""

    name = "PEER"

    def __init__(self, ops=(Op.MUL_MAT, Op.ADD)):
        super().__init__(n_threads=1)
        self.device = _peer_device
        self.ops = frozenset(ops)

    def why_unsupported(self, node) -> str | None:
        if node.op != Op.NONE and node.op not in VIEW_OPS and node.op not in self.ops:
            return f"{node.op.name} is not one of {self.name}'s ops"
        return super().why_unsupported(node)


def test_registry(n_devices: int = 1) -> tuple[Registry, list[TestDevice]]:
    """A Registry with the CPU module and `n_devices` TEST devices (TEST, TEST1, ...)."""
    reg = Registry(modules=("pyggml.backend.cpu",))
    devs = [TestDevice("TEST" if i == 0 else f"TEST{i}") for i in range(n_devices)]
    reg.register(BackendReg("TEST", devs))
    return reg, devs


test_registry.__test__ = False
