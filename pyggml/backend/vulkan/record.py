"""Recording graphs into command buffers for the Vulkan backend, and replaying them.

`Recorder.record(graph)` turns every non-view node into dispatches (ops.Builder, with
this recorder as its environment: window lookup, status tags, device-owned buffers) and records
them into one command buffer: pipeline and descriptor-set binds only when they change, push
constants per dispatch, and a global memory barrier only where a dispatch reads memory written
since the last barrier or writes memory read or written since then (read-after-write,
write-after-read, write-after-write on byte ranges of the opaque device addresses). A leading
barrier orders it after earlier submissions (transfers, other graphs); a trailing one makes its
writes visible to transfers and the host.

A `Record` keeps what its commands use alive (the buffers) and frees its Vulkan objects when it
is dropped, after its last submission finished. `Record.still_valid(graph)` says whether it can be
replayed for `graph`: same uid and node count, and the addresses it was recorded with. Checking
those costs O(1) while no tensor anywhere has moved (pyggml.tensor.placement_generation); after
some tensor moved, the graph's addresses are compared once (`signature`) and, if they are the
same, the record is valid again at the new generation.
"""

from __future__ import annotations

import ctypes
import itertools
import logging
import weakref

from pyggml.backend.vulkan.device import VkContext
from pyggml.backend.vulkan.ops import Builder, why_unsupported
from pyggml.errors import BackendError
from pyggml.tensor import Tensor, placement_generation
from pyggml.types import VIEW_OPS, Op

log = logging.getLogger("pyggml.vulkan")


class Record:
    """One graph recorded into one command buffer. Its Vulkan objects are freed with it (after
    its last submission finished), or by release()."""

    def __init__(self, ctx: VkContext, graph, generation: int, cmd, keep: list,
                 n_dispatches: int, n_barriers: int, labels: list, qpool, tags: list,
                 tag_names: dict):
        self.uid, self.n_nodes, self.cmd = graph.uid, len(graph.nodes), cmd
        self.generation = generation      # placement generation the addresses were read at
        self.sig = signature(graph)       # those addresses (compared only after a move)
        self.submit = ctx.submit_info(cmd)           # built once: a replay only submits it
        self.keep = keep                  # buffers the commands read and write: kept alive
        self.n_dispatches, self.n_barriers = n_dispatches, n_barriers
        self.labels, self.qpool = labels, qpool      # (node, op, shader) per dispatch
        self.state = [0]                  # last submission's serial (shared with the finalizer)
        self.release = weakref.finalize(self, _free_record, ctx, cmd, qpool, self.state, tags,
                                        tag_names)

    @property
    def serial(self) -> int:
        return self.state[0]

    def still_valid(self, graph) -> bool:
        """Whether these commands compute `graph` as it is now (see the module docstring)."""
        if self.uid != graph.uid or self.n_nodes != len(graph.nodes):
            return False
        gen = placement_generation()
        if gen == self.generation:
            return True
        if signature(graph) != self.sig:
            return False
        self.generation = gen             # tensors moved elsewhere; this graph's did not
        return True


def _free_record(ctx: VkContext, cmd, qpool, state, tags, tag_names) -> None:
    try:
        ctx.wait(state[0])
    except BackendError as e:     # a shader's bad-data report: the buffer is still done
        log.warning("%s", e)
    ctx.free_command_buffer(cmd)
    if qpool is not None:
        ctx.vk.vkDestroyQueryPool(ctx.device, qpool, None)
    for t in tags:
        tag_names.pop(t, None)


def signature(graph) -> list:
    """Addresses a recording depends on: every node's and source's data."""
    return [t.data if t is not None else None for n in graph.nodes for t in (n, *n.src)]


def _overlaps(ranges, lo: int, hi: int) -> bool:
    return any(a < hi and lo < b for a, b in ranges)


class Recorder:
    """Records graphs for one backend of `device` (a vulkan.VulkanDevice)."""

    def __init__(self, device, limits):
        self.device = device
        self.ctx: VkContext = device.ctx
        self.cfg = device.cfg
        self.limits = limits                 # what why_unsupported needs (VulkanRules)
        self.max_bind = self.ctx.max_bind
        self.max_wg_count = device.info.max_wg_count
        self.builder = Builder(self)
        self.tags: dict[int, str] = {}       # status tag -> node, of live recordings
        self._next_tag = itertools.count(1)
        self._new_tags: list[int] = []
        self._keep: list = []
        self.profile = False
        self.n_recordings = 0

    # -- the Builder's environment --
    @property
    def dummy(self):
        return self.device.dummy

    @property
    def status(self):
        return self.device.status

    def gelu_table(self):
        return self.device.gelu_table()

    def iq_grids(self):
        return self.device.iq_grids()

    def tag(self, node: Tensor) -> int:
        t = next(self._next_tag)
        self.tags[t] = f"'{node.name}' ({node.op.name})"
        self._new_tags.append(t)
        return t

    def bind(self, addr: int, n: int):
        buf, off = self.device.locate(addr, n)
        self._keep.append(buf)
        win, w0 = buf.dm.window(off, n)
        return win, off - w0

    def check_status(self, name: str) -> str | None:
        """The bad-data report a shader left in the status word (then cleared), or None."""
        word = ctypes.c_uint32.from_address(self.device.status_mem.mapped)
        if word.value == 0:
            return None
        tag, word.value = word.value, 0
        what = self.tags.get(tag, f"tag {tag}")
        return (f"{name}: node {what} met bad data "
                f"(a row index, expert id or sequence id outside its source)")

    # -- recording --
    def record(self, graph, name: str) -> Record:
        vk, ctx = self.ctx.vk, self.ctx
        generation = placement_generation()           # before any address is read
        self._keep, self._new_tags = [], []
        dispatches, labels = [], []
        for node in graph.nodes:
            if node.op in VIEW_OPS or node.op == Op.NONE:
                continue
            why = why_unsupported(node, self.limits)
            if why:
                raise BackendError(f"{name} cannot compute node '{node.name}' "
                                   f"({node.op.name}): {why}")
            ds = self.builder.build(node)
            dispatches.extend(ds)
            labels.extend([(node.name, node.op.name, d.pipeline) for d in ds])
        cmd = ctx.new_command_buffer()
        qpool_box = [None]
        try:
            n_barriers = self._record_commands(cmd, dispatches, qpool_box)
        except BaseException:
            ctx.free_command_buffer(cmd)
            if qpool_box[0] is not None:
                vk.vkDestroyQueryPool(ctx.device, qpool_box[0], None)
            for t in self._new_tags:
                self.tags.pop(t, None)
            raise
        self.n_recordings += 1
        keep, self._keep = self._keep, []
        tags, self._new_tags = self._new_tags, []
        return Record(ctx, graph, generation, cmd, keep, len(dispatches), n_barriers, labels,
                      qpool_box[0], tags, self.tags)

    def _record_commands(self, cmd, dispatches, qpool_box) -> int:
        """Record `dispatches` with barriers where needed; returns the number of barriers."""
        vk, ctx = self.ctx.vk, self.ctx
        vk.vkBeginCommandBuffer(cmd, vk.VkCommandBufferBeginInfo())
        qpool = None
        if self.profile:
            qpool = vk.vkCreateQueryPool(ctx.device, vk.VkQueryPoolCreateInfo(
                queryType=vk.VK_QUERY_TYPE_TIMESTAMP, queryCount=len(dispatches) + 1), None)
            qpool_box[0] = qpool
            vk.vkCmdResetQueryPool(cmd, qpool, 0, len(dispatches) + 1)
        comp, xfer = vk.VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT, vk.VK_PIPELINE_STAGE_TRANSFER_BIT
        rw = vk.VK_ACCESS_SHADER_READ_BIT | vk.VK_ACCESS_SHADER_WRITE_BIT
        ctx.barrier(cmd, comp | xfer,
                    vk.VK_ACCESS_SHADER_WRITE_BIT | vk.VK_ACCESS_TRANSFER_WRITE_BIT, comp, rw)
        written, read = [], []
        last_pipe = last_ds = None
        n_barriers = 0
        bind_point = vk.VK_PIPELINE_BIND_POINT_COMPUTE
        if qpool is not None:
            vk.vkCmdWriteTimestamp(cmd, vk.VK_PIPELINE_STAGE_BOTTOM_OF_PIPE_BIT, qpool, 0)
        for i, d in enumerate(dispatches):
            hazard = any(_overlaps(written, lo, hi) for lo, hi in d.reads) or any(
                _overlaps(written, lo, hi) or _overlaps(read, lo, hi) for lo, hi in d.writes)
            if hazard:
                ctx.barrier(cmd, comp, vk.VK_ACCESS_SHADER_WRITE_BIT, comp, rw)
                n_barriers += 1
                written, read = [], []
            read.extend(d.reads)
            written.extend(d.writes)
            pipe = ctx.pipeline(d.pipeline, d.spec)
            if pipe is not last_pipe:
                vk.vkCmdBindPipeline(cmd, bind_point, pipe)
                last_pipe = pipe
            ds = ctx.descriptor_set(d.bindings)[0]
            if ds is not last_ds:
                vk.vkCmdBindDescriptorSets(cmd, bind_point, ctx.layout, 0, 1, [ds], 0, None)
                last_ds = ds
            push = ctx.ffi.from_buffer(d.push)
            vk.vkCmdPushConstants(cmd, ctx.layout, vk.VK_SHADER_STAGE_COMPUTE_BIT, 0,
                                  len(d.push), push)
            vk.vkCmdDispatch(cmd, *d.grid)
            if qpool is not None:
                vk.vkCmdWriteTimestamp(cmd, vk.VK_PIPELINE_STAGE_BOTTOM_OF_PIPE_BIT, qpool, i + 1)
        ctx.barrier(cmd, comp, vk.VK_ACCESS_SHADER_WRITE_BIT,
                    comp | xfer | vk.VK_PIPELINE_STAGE_HOST_BIT,
                    rw | vk.VK_ACCESS_TRANSFER_READ_BIT | vk.VK_ACCESS_HOST_READ_BIT)
        vk.vkEndCommandBuffer(cmd)
        return n_barriers

    def timestamps(self, rec: Record) -> list[tuple[str, str, str, float]]:
        """(node, op, shader, seconds) per dispatch of the last run of a profiled record."""
        if rec.qpool is None:
            raise BackendError("graph not recorded with profile = True")
        vk, ctx = self.ctx.vk, self.ctx
        n = rec.n_dispatches + 1
        data = ctx.ffi.new("uint64_t[]", n)
        vk.vkGetQueryPoolResults(ctx.device, rec.qpool, 0, n, 8 * n, data, 8,
                                 vk.VK_QUERY_RESULT_64_BIT | vk.VK_QUERY_RESULT_WAIT_BIT)
        period = vk.vkGetPhysicalDeviceProperties(self.device.pd).limits.timestampPeriod * 1e-9
        return [(*rec.labels[i], (data[i + 1] - data[i]) * period) for i in range(n - 1)]
