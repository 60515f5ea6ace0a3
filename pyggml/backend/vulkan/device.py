"""Vulkan plumbing for the Vulkan backend: one logical device with its memory, windows,
pipelines, descriptor sets, submissions and transfers. No ggml semantics here (those are in
ops.py; device facts and kernel shapes in info.py; the public classes in
backend.py).

Memory model. A `DeviceMemory` is one vkAllocateMemory. Shaders see it through *windows*:
VkBuffers bound at some offset of the memory, each at most maxStorageBufferRange long (the most
one storage-buffer descriptor may cover). Windows start on a grid of `window_step` bytes (half
the range), so any range up to half the range long lies inside one grid window; a longer range
gets a window of its own starting just before it. Descriptors always cover whole windows and
shaders get their operands' offsets inside the window as push constants, so descriptor sets
depend only on which windows a dispatch touches: a whole graph needs a handful of them.

Host access. Memory that is device-local *and* host-visible (integrated GPUs, resizable BAR,
lavapipe) is mapped once and read/written with memmove unless the device was opened with
host_mapped=False; otherwise transfers go through a host-visible staging buffer and
vkCmdCopyBuffer.
"""

from __future__ import annotations

import ctypes
import struct
from collections import deque

import numpy as np

from pyggml.backend.vulkan.info import (
    DeviceInfo,
    KernelConfig,
    VulkanMemoryError,
    _human,
    binding_limit,
    shader_dir,
    vk_module,
)
from pyggml.errors import BackendError


# ---- memory --------------------------------------------------------------------------------------

STAGING_MIN = 4 << 20  # the host-visible staging buffer of unmapped memory: at least 4 MiB,
STAGING_MAX = 64 << 20  # at most 64 MiB (larger transfers go through it in pieces)
BUFFER_PAD = 64       # extra bytes after every allocation: word reads of the last bytes stay inside


class DeviceMemory:
    """One device allocation seen through windows (see the module docstring)."""

    def __init__(self, ctx: "VkContext", n_bytes: int, host_visible_only: bool = False):
        self.ctx = ctx
        self.n_bytes = n_bytes
        self.size = (n_bytes + BUFFER_PAD + 4095) // 4096 * 4096   # windows end on 4 KiB
        self.mem, self.type_index, self.mapped = ctx.allocate(self.size, host_visible_only, n_bytes)
        self.windows: dict[int, tuple] = {}      # start -> (VkBuffer, size, key)
        self.released = False

    def window(self, start: int, n: int) -> tuple:
        """((VkBuffer, size, key), window start) of a window holding bytes [start, start + n)."""
        ctx = self.ctx
        if self.size <= ctx.window_limit:
            w0 = 0
        else:
            w0 = start // ctx.window_step * ctx.window_step
            if start + n > w0 + ctx.window_limit:
                w0 = start // ctx.window_align * ctx.window_align
        if start + n > w0 + ctx.window_limit:
            raise BackendError(f"{n} bytes at offset {start} cannot be bound: larger than the "
                               f"device's storage-buffer range ({ctx.window_limit} bytes)")
        w = self.windows.get(w0)
        if w is None:
            size = min(ctx.window_limit, self.size - w0)
            buf = ctx.create_buffer(size)
            req = ctx.vk.vkGetBufferMemoryRequirements(ctx.device, buf)
            if w0 % req.alignment or not req.memoryTypeBits >> self.type_index & 1 \
                    or w0 + req.size > self.size:
                ctx.vk.vkDestroyBuffer(ctx.device, buf, None)
                raise BackendError(f"a {size}-byte window at offset {w0} does not fit the "
                                   f"device's buffer requirements (alignment {req.alignment}, "
                                   f"size {req.size}, memory types {req.memoryTypeBits:#x})")
            ctx.vk.vkBindBufferMemory(ctx.device, buf, self.mem, w0)
            w = self.windows[w0] = (buf, size, ctx.handle_key(buf))
        return w, w0

    def pieces(self, start: int, n: int):
        """Split [start, start + n) into (VkBuffer, offset in window, length) pieces."""
        end = start + n
        while start < end:
            ln = min(end - start, self.ctx.window_step)
            win, w0 = self.window(start, ln)
            yield win[0], start - w0, ln
            start += ln

    def release(self) -> None:
        if self.released:
            return
        self.released = True
        ctx = self.ctx
        keys = {w[2] for w in self.windows.values()}
        ctx.forget_descriptor_sets(keys)
        for buf, _, _ in self.windows.values():
            ctx.vk.vkDestroyBuffer(ctx.device, buf, None)
        self.windows.clear()
        ctx.free(self.mem, self.size, self.type_index, self.mapped is not None)


# ---- the logical device --------------------------------------------------------------------------

def staging_size(largest_transfer: int) -> int:
    """Bytes of the staging buffer that transfers of up to `largest_transfer` bytes use."""
    return max(STAGING_MIN, min(STAGING_MAX, largest_transfer))


N_BINDINGS = 9       # storage buffers per dispatch (GATED_DELTA_NET: 7 sources, result, status)
PUSH_BYTES = 128


class VkContext:
    """A logical device with one compute queue, and everything the backend records with."""

    def __init__(self, info: DeviceInfo, pd, cfg: KernelConfig):
        vk = self.vk = vk_module()
        self.info, self.pd, self.cfg = info, pd, cfg
        self.shader_dir = shader_dir()       # read once, when the device is opened
        self.ffi = vk.ffi
        n_storage = vk.vkGetPhysicalDeviceProperties(pd).limits.maxPerStageDescriptorStorageBuffers
        if n_storage < N_BINDINGS:
            raise BackendError(f"{info.name}: {n_storage} storage buffers per shader stage, the "
                               f"backend binds {N_BINDINGS}")
        qf = vk.vkGetPhysicalDeviceQueueFamilyProperties(pd)
        fam = [i for i, q in enumerate(qf) if q.queueFlags & vk.VK_QUEUE_COMPUTE_BIT]
        if not fam:
            raise BackendError(f"{info.name}: no compute queue")
        self.queue_family = fam[0]
        qinfo = vk.VkDeviceQueueCreateInfo(queueFamilyIndex=self.queue_family, queueCount=1,
                                           pQueuePriorities=[1.0])
        feats = vk.VkPhysicalDevice16BitStorageFeatures(storageBuffer16BitAccess=vk.VK_TRUE) \
            if cfg.store16 else None
        self.device = vk.vkCreateDevice(pd, vk.VkDeviceCreateInfo(
            pNext=feats, queueCreateInfoCount=1, pQueueCreateInfos=[qinfo]), None)
        self.queue = vk.vkGetDeviceQueue(self.device, self.queue_family, 0)
        self.pool = vk.vkCreateCommandPool(self.device, vk.VkCommandPoolCreateInfo(
            flags=vk.VK_COMMAND_POOL_CREATE_RESET_COMMAND_BUFFER_BIT,
            queueFamilyIndex=self.queue_family), None)
        # memory types: device-local first choice; host-visible+coherent for staging
        self.heap_used = [0] * len(info.heaps)
        probe = self.create_buffer(256)
        req = vk.vkGetBufferMemoryRequirements(self.device, probe)
        vk.vkDestroyBuffer(self.device, probe, None)
        self.type_bits = req.memoryTypeBits
        self.dev_type = self._pick_type(vk.VK_MEMORY_PROPERTY_DEVICE_LOCAL_BIT, 0)
        self.host_type = self._pick_type(
            vk.VK_MEMORY_PROPERTY_HOST_VISIBLE_BIT | vk.VK_MEMORY_PROPERTY_HOST_COHERENT_BIT,
            vk.VK_MEMORY_PROPERTY_HOST_CACHED_BIT)
        flags = info.memory_types[self.dev_type][0]
        hv = vk.VK_MEMORY_PROPERTY_HOST_VISIBLE_BIT | vk.VK_MEMORY_PROPERTY_HOST_COHERENT_BIT
        self.dev_mappable = cfg.host_mapped and (flags & hv) == hv
        # windows
        rng = binding_limit(info, cfg.storage_range)
        self.window_align = max(req.alignment, info.min_storage_offset_alignment, 256)
        self.window_limit = rng
        self.window_step = max(self.window_align, rng // 2 // self.window_align * self.window_align)
        self.max_bind = self.window_limit - self.window_align   # any range this long can be bound
        # descriptors and pipelines
        binding = [vk.VkDescriptorSetLayoutBinding(
            binding=i, descriptorType=vk.VK_DESCRIPTOR_TYPE_STORAGE_BUFFER, descriptorCount=1,
            stageFlags=vk.VK_SHADER_STAGE_COMPUTE_BIT) for i in range(N_BINDINGS)]
        self.dsl = vk.vkCreateDescriptorSetLayout(self.device, vk.VkDescriptorSetLayoutCreateInfo(
            bindingCount=N_BINDINGS, pBindings=binding), None)
        pcr = vk.VkPushConstantRange(stageFlags=vk.VK_SHADER_STAGE_COMPUTE_BIT, offset=0,
                                     size=PUSH_BYTES)
        self.layout = vk.vkCreatePipelineLayout(self.device, vk.VkPipelineLayoutCreateInfo(
            setLayoutCount=1, pSetLayouts=[self.dsl], pushConstantRangeCount=1,
            pPushConstantRanges=[pcr]), None)
        self.desc_pools: list = []
        self.desc_pool_free = 0
        self.desc_sets: dict[tuple, object] = {}
        self.modules: dict[str, object] = {}
        self.pipelines: dict[tuple, object] = {}
        self.serial = 0                       # submissions so far
        self.inflight: deque = deque()        # (serial, fence, fence array, on_done)
        self.free_fences: list = []
        self.xfer_cmd = self.new_command_buffer()
        self.staging: DeviceMemory | None = None
        self.n_pipelines_created = 0

    # -- handles --
    def handle_key(self, h) -> int:
        return int(self.ffi.cast("uintptr_t", h))

    def _pick_type(self, want: int, prefer: int) -> int:
        """A memory type storage buffers may use with all `want` flags: the one on the largest
        heap (not a small host-visible window of device memory), then with `prefer` flags."""
        ok = [(self.info.heaps[heap][0], flags & prefer == prefer, -i, i)
              for i, (flags, heap) in enumerate(self.info.memory_types)
              if flags & want == want and self.type_bits >> i & 1]
        if not ok:
            raise BackendError(f"{self.info.name}: no memory type with flags {want:#x} for "
                               f"storage buffers")
        return max(ok)[3]

    # -- memory --
    def allocate(self, size: int, host: bool, requested: int | None = None) -> tuple:
        """(VkDeviceMemory, memory type, mapped address or None) of `size` bytes; errors name
        `requested` (the caller's size) and the heap."""
        vk = self.vk
        requested = size if requested is None else requested
        ti = self.host_type if host else self.dev_type
        heap = self.info.memory_types[ti][1]
        heap_size = self.info.heaps[heap][0]
        where = (f"Vulkan device '{self.info.name}': cannot allocate a buffer of {requested} "
                 f"bytes ({_human(requested)}) in memory heap {heap} of {heap_size} bytes "
                 f"({_human(heap_size)}, {self.heap_used[heap]} bytes already allocated by "
                 f"pyggml)")
        if size > self.info.max_allocation:
            raise VulkanMemoryError(f"{where}: larger than the device's largest allocation "
                                    f"({self.info.max_allocation} bytes); use the buffer type's "
                                    f"max_size to split it")
        if size > heap_size:
            raise VulkanMemoryError(f"{where}: larger than the heap")
        try:
            mem = vk.vkAllocateMemory(self.device, vk.VkMemoryAllocateInfo(
                allocationSize=size, memoryTypeIndex=ti), None)
        except (vk.VkErrorOutOfDeviceMemory, vk.VkErrorOutOfHostMemory) as e:
            raise VulkanMemoryError(f"{where}: {type(e).__name__}") from None
        self.heap_used[heap] += size
        mapped = None
        if host or self.dev_mappable:
            buf = vk.vkMapMemory(self.device, mem, 0, size, 0)
            mapped = int(self.ffi.cast("uintptr_t", self.ffi.from_buffer(buf)))
        return mem, ti, mapped

    def free(self, mem, size: int, ti: int, mapped: bool) -> None:
        vk = self.vk
        if mapped:
            vk.vkUnmapMemory(self.device, mem)
        vk.vkFreeMemory(self.device, mem, None)
        self.heap_used[self.info.memory_types[ti][1]] -= size

    def create_buffer(self, size: int):
        vk = self.vk
        usage = (vk.VK_BUFFER_USAGE_STORAGE_BUFFER_BIT | vk.VK_BUFFER_USAGE_TRANSFER_SRC_BIT
                 | vk.VK_BUFFER_USAGE_TRANSFER_DST_BIT)
        return vk.vkCreateBuffer(self.device, vk.VkBufferCreateInfo(
            size=size, usage=usage, sharingMode=vk.VK_SHARING_MODE_EXCLUSIVE), None)

    # -- pipelines --
    def pipeline(self, name: str, spec: tuple[int, ...]):
        key = (name, spec)
        p = self.pipelines.get(key)
        if p is None:
            p = self.pipelines[key] = self._create_pipeline(name, spec)
        return p

    def _create_pipeline(self, name: str, spec: tuple[int, ...]):
        vk, ffi = self.vk, self.ffi
        mod = self.modules.get(name)
        if mod is None:
            path = self.shader_dir / f"{name}.spv"
            try:
                code = path.read_bytes()
            except OSError as e:
                raise BackendError(f"shader {path} cannot be read ({e}); run `make shaders`") \
                    from None
            mod = self.modules[name] = vk.vkCreateShaderModule(
                self.device, vk.VkShaderModuleCreateInfo(codeSize=len(code), pCode=code), None)
        entries = [vk.VkSpecializationMapEntry(constantID=i, offset=4 * i, size=4)
                   for i in range(len(spec))]
        data = ffi.new("uint32_t[]", list(spec) or [0])
        spec_info = vk.VkSpecializationInfo(mapEntryCount=len(spec), pMapEntries=entries,
                                            dataSize=4 * len(spec), pData=data)
        entry_name = ffi.new("char[]", b"main")      # must outlive vkCreateComputePipelines
        stage = vk.VkPipelineShaderStageCreateInfo(
            stage=vk.VK_SHADER_STAGE_COMPUTE_BIT, module=mod, pName=entry_name,
            pSpecializationInfo=spec_info)
        info = vk.VkComputePipelineCreateInfo(stage=stage, layout=self.layout)
        try:
            p = vk.vkCreateComputePipelines(self.device, None, 1, [info], None)[0]
        except vk.VkError as e:
            raise BackendError(f"pipeline {name} {spec} could not be created: "
                               f"{type(e).__name__}") from None
        del entry_name, data, entries
        self.n_pipelines_created += 1
        return p

    # -- descriptor sets: one per tuple of windows, whole windows bound --
    def descriptor_set(self, bufs: tuple) -> object:
        """bufs: N_BINDINGS (VkBuffer, size, key) windows."""
        key = tuple(b[2] for b in bufs)
        ds = self.desc_sets.get(key)
        if ds is not None:
            return ds
        vk = self.vk
        if not self.desc_pools or self.desc_pool_free == 0:
            size = vk.VkDescriptorPoolSize(type=vk.VK_DESCRIPTOR_TYPE_STORAGE_BUFFER,
                                           descriptorCount=256 * N_BINDINGS)
            info = vk.VkDescriptorPoolCreateInfo(
                flags=vk.VK_DESCRIPTOR_POOL_CREATE_FREE_DESCRIPTOR_SET_BIT, maxSets=256,
                poolSizeCount=1, pPoolSizes=[size])
            self.desc_pools.append(vk.vkCreateDescriptorPool(self.device, info, None))
            self.desc_pool_free = 256
        pool = self.desc_pools[-1]
        ds = vk.vkAllocateDescriptorSets(self.device, vk.VkDescriptorSetAllocateInfo(
            descriptorPool=pool, descriptorSetCount=1, pSetLayouts=[self.dsl]))[0]
        self.desc_pool_free -= 1
        infos = [vk.VkDescriptorBufferInfo(buffer=b[0], offset=0, range=b[1]) for b in bufs]
        writes = [vk.VkWriteDescriptorSet(dstSet=ds, dstBinding=i, descriptorCount=1,
                                          descriptorType=vk.VK_DESCRIPTOR_TYPE_STORAGE_BUFFER,
                                          pBufferInfo=[infos[i]]) for i in range(N_BINDINGS)]
        vk.vkUpdateDescriptorSets(self.device, N_BINDINGS, writes, 0, None)
        self.desc_sets[key] = (ds, pool)
        return self.desc_sets[key]

    def forget_descriptor_sets(self, window_keys: set) -> None:
        dead = [k for k in self.desc_sets if window_keys.intersection(k)]
        for k in dead:
            ds, pool = self.desc_sets.pop(k)
            self.vk.vkFreeDescriptorSets(self.device, pool, 1, [ds])

    # -- command buffers and submission --
    def new_command_buffer(self):
        vk = self.vk
        return vk.vkAllocateCommandBuffers(self.device, vk.VkCommandBufferAllocateInfo(
            commandPool=self.pool, level=vk.VK_COMMAND_BUFFER_LEVEL_PRIMARY,
            commandBufferCount=1))[0]

    def free_command_buffer(self, cmd) -> None:
        self.vk.vkFreeCommandBuffers(self.device, self.pool, 1, [cmd])

    def barrier(self, cmd, src_stage: int, src_access: int, dst_stage: int,
                dst_access: int) -> None:
        """A global memory barrier (every buffer) between the two stage/access scopes."""
        vk = self.vk
        mb = vk.VkMemoryBarrier(srcAccessMask=src_access, dstAccessMask=dst_access)
        vk.vkCmdPipelineBarrier(cmd, src_stage, dst_stage, 0, 1, [mb], 0, None, 0, None)

    def submit_info(self, cmd):
        """A VkSubmitInfo for `cmd`, built once and kept by the caller (replays reuse it)."""
        vk = self.vk
        return vk.VkSubmitInfo(commandBufferCount=1, pCommandBuffers=[cmd])

    def submit(self, submit, on_done=None) -> int:
        """Queue a prebuilt VkSubmitInfo; returns its serial. on_done() runs when wait() sees it
        finish and may return an error message (raised by wait)."""
        vk, lib = self.vk, self.vk.lib
        fence = self.free_fences.pop() if self.free_fences else \
            vk.vkCreateFence(self.device, vk.VkFenceCreateInfo(), None)
        res = lib.vkQueueSubmit(self.queue, 1, self.ffi.addressof(submit), fence)
        if res != vk.VK_SUCCESS:
            self.free_fences.append(fence)
            raise BackendError(f"vkQueueSubmit failed ({res})")
        self.serial += 1
        self.inflight.append((self.serial, fence, self.ffi.new("VkFence[1]", [fence]), on_done))
        return self.serial

    def wait(self, serial: int | None = None) -> None:
        """Block until submission `serial` (default: every submission) has finished."""
        vk, lib = self.vk, self.vk.lib
        serial = self.serial if serial is None else serial
        errors = []
        while self.inflight and self.inflight[0][0] <= serial:
            s, fence, arr, on_done = self.inflight[0]
            res = lib.vkWaitForFences(self.device, 1, arr, vk.VK_TRUE, 120 * 10**9)
            if res != vk.VK_SUCCESS:
                raise BackendError(f"vkWaitForFences failed ({res}): the device did not finish "
                                   f"in 120 s or was lost")
            self.inflight.popleft()
            lib.vkResetFences(self.device, 1, arr)
            self.free_fences.append(fence)
            if on_done is not None:
                msg = on_done()
                if msg:
                    errors.append(msg)
        if errors:
            raise BackendError("; ".join(errors))

    def submit_wait(self, submit) -> None:
        self.wait(self.submit(submit))

    # -- transfers (staging unless the memory is mapped) --
    def _staging(self, n: int) -> DeviceMemory:
        need = staging_size(n)
        if self.staging is None or self.staging.n_bytes < need:
            if self.staging is not None:
                self.staging.release()
            self.staging = DeviceMemory(self, need, host_visible_only=True)
        return self.staging

    def _transfer(self, record) -> None:
        vk = self.vk
        self.wait()
        cmd = self.xfer_cmd
        vk.vkResetCommandBuffer(cmd, 0)
        vk.vkBeginCommandBuffer(cmd, vk.VkCommandBufferBeginInfo(
            flags=vk.VK_COMMAND_BUFFER_USAGE_ONE_TIME_SUBMIT_BIT))
        all_rw = vk.VK_ACCESS_SHADER_WRITE_BIT | vk.VK_ACCESS_TRANSFER_WRITE_BIT
        comp_xfer = vk.VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT | vk.VK_PIPELINE_STAGE_TRANSFER_BIT
        self.barrier(cmd, comp_xfer, all_rw, vk.VK_PIPELINE_STAGE_TRANSFER_BIT,
                     vk.VK_ACCESS_TRANSFER_READ_BIT | vk.VK_ACCESS_TRANSFER_WRITE_BIT)
        record(cmd)
        self.barrier(cmd, vk.VK_PIPELINE_STAGE_TRANSFER_BIT, vk.VK_ACCESS_TRANSFER_WRITE_BIT,
                     vk.VK_PIPELINE_STAGE_HOST_BIT | vk.VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT,
                     vk.VK_ACCESS_HOST_READ_BIT | vk.VK_ACCESS_SHADER_READ_BIT)
        vk.vkEndCommandBuffer(cmd)
        self.submit_wait(self.submit_info(cmd))

    def write(self, dm: DeviceMemory, offset: int, data) -> None:
        self.wait()
        src = np.frombuffer(memoryview(data).cast("B"), dtype=np.uint8)
        n = src.nbytes
        if n == 0:
            return
        if dm.mapped is not None:
            ctypes.memmove(dm.mapped + offset, src.ctypes.data, n)
            return
        st = self._staging(n)
        done = 0
        while done < n:
            ln = min(n - done, st.n_bytes)
            ctypes.memmove(st.mapped, src.ctypes.data + done, ln)
            sbuf = st.window(0, ln)[0][0]

            def rec(cmd, o=offset + done, ln=ln, sbuf=sbuf):
                so = 0
                for buf, wo, pl in dm.pieces(o, ln):
                    self.vk.vkCmdCopyBuffer(cmd, sbuf, buf, 1, [self.vk.VkBufferCopy(
                        srcOffset=so, dstOffset=wo, size=pl)])
                    so += pl
            self._transfer(rec)
            done += ln

    def read(self, dm: DeviceMemory, offset: int, n: int) -> bytes:
        self.wait()
        if n == 0:
            return b""
        if dm.mapped is not None:
            return ctypes.string_at(dm.mapped + offset, n)
        st = self._staging(n)
        out = bytearray()
        done = 0
        while done < n:
            ln = min(n - done, st.n_bytes)
            sbuf = st.window(0, ln)[0][0]

            def rec(cmd, o=offset + done, ln=ln, sbuf=sbuf):
                so = 0
                for buf, wo, pl in dm.pieces(o, ln):
                    self.vk.vkCmdCopyBuffer(cmd, buf, sbuf, 1, [self.vk.VkBufferCopy(
                        srcOffset=wo, dstOffset=so, size=pl)])
                    so += pl
            self._transfer(rec)
            out += ctypes.string_at(st.mapped, ln)
            done += ln
        return bytes(out)

    def fill(self, dm: DeviceMemory, value: int) -> None:
        self.wait()
        word = struct.unpack("<I", bytes([value & 0xff]) * 4)[0]
        if dm.mapped is not None:
            ctypes.memset(dm.mapped, value & 0xff, dm.size)
            return

        def rec(cmd):
            for buf, wo, pl in dm.pieces(0, dm.size // 4 * 4):
                self.vk.vkCmdFillBuffer(cmd, buf, wo, pl, word)
        self._transfer(rec)

    def copy(self, src: DeviceMemory, so: int, dst: DeviceMemory, do: int, n: int) -> None:
        """Device-to-device copy of n bytes."""
        self.wait()
        if n == 0:
            return
        if src.mapped is not None and dst.mapped is not None:
            ctypes.memmove(dst.mapped + do, src.mapped + so, n)
            return
        step = self.window_step

        def rec(cmd):
            done = 0
            while done < n:
                ln = min(n - done, step)
                (sb, _, _), sw = src.window(so + done, ln)
                (db, _, _), dw = dst.window(do + done, ln)
                self.vk.vkCmdCopyBuffer(cmd, sb, db, 1, [self.vk.VkBufferCopy(
                    srcOffset=so + done - sw, dstOffset=do + done - dw, size=ln)])
                done += ln
        self._transfer(rec)
