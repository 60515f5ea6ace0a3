"""Remote devices: a backend that drives llama.cpp's unmodified rpc-server over TCP.

    register_endpoints(["host:port", ...])  ─► one RpcReg per endpoint in the registry
      RpcReg ─► RpcDevice per device the server reports (DEVICE_COUNT), named RPC[host:port]
                (device 0) and RPC<d>[host:port] (d >= 1), type GPU
        ├─► RpcBufferType (alignment, max size from GET_ALIGNMENT / GET_MAX_SIZE)
        │     └─► RpcBuffer (ALLOC_BUFFER, BUFFER_GET_BASE; FREE_BUFFER when collected)
        └─► RpcBackend (GRAPH_COMPUTE, GRAPH_RECOMPUTE on graph reuse, supports_op)

One TCP connection per endpoint, opened by register_endpoints and kept for the registry's life:
the server keeps buffers and stored graphs only as long as the connection lives, and serves one
client at a time.

A Buffer's `base` is the server's own address of that buffer (BUFFER_GET_BASE), so a tensor's
`data` is the absolute address the wire format wants. Nothing reaches the socket unvalidated:
types and ops must be in pyggml.backend.rpc.tables, element counts fit 32 bits and are block
multiples, every byte range lies inside its tensor and its buffer, and graph nodes pass
`supports_op` (the server's CPU backend aborts the whole server on an op it cannot run).

Weights (buffers with usage WEIGHTS) of at least `hash_min_bytes` are first offered by content
hash (SET_TENSOR_HASH, FNV-1a 64): a server started with `-c` that has the bytes in its cache
applies them without an upload; otherwise they go as SET_TENSOR with the cache flag set, so the
next load finds them. `traffic()` counts what was sent.

Synchronisation: the server handles commands strictly in order, and every read goes through
GET_TENSOR, whose answer comes after everything sent before it: `synchronize()` has nothing to
wait for (the scheduler calls it before each input copy: it must not write either; small
SET_TENSORs are copied into the connection's queue and wait for the graph compute or the next
read, pyggml.backend.rpc.protocol). A server that died or stopped answering shows at the next
command that waits for an answer (at the latest the next read of a result), as RpcError within
the timeout.
"""

from __future__ import annotations

import ctypes
import struct
import weakref

from pyggml import settings

from pyggml.backend.base import (
    Backend,
    BackendReg,
    Buffer,
    BufferType,
    BufferUsage,
    Device,
    DeviceType,
    Registry,
    default_registry,
    is_host_tensor,
    _host_view,
)
from pyggml.backend.rpc.protocol import (
    HASH_MIN_BYTES,
    MAX_NAME_BYTES,
    QUEUE_MAX_BYTES,
    RPC_TENSOR,
    U32_MAX,
    Cmd,
    Connection,
    Prepared,
    RpcError,
    TrafficStats,
    fnv1a64,
    request_bytes,
)
from pyggml.backend.rpc.tables import OPS, TYPES
from pyggml.errors import BackendError, UnsupportedOpError
from pyggml.graph import Graph
from pyggml.tensor import MAX_SRC, Tensor, TensorFlag
from pyggml.types import VIEW_OPS, GGMLType, Op, traits

# pyggml.settings reads them: rpc_endpoints (backend_reg()), rpc_timeout_s, rpc_hash_min_bytes
ENV_ENDPOINTS = "PYGGML_RPC"
ENV_TIMEOUT = "PYGGML_RPC_TIMEOUT"
ENV_HASH_MIN = "PYGGML_RPC_HASH_MIN"

_COMPUTE = int(TensorFlag.COMPUTE)
_U64 = struct.Struct("<Q")


# ---- op support of the server's backend ------------------------------------------------------

F32, F16, BF16, I32 = GGMLType.F32, GGMLType.F16, GGMLType.BF16, GGMLType.I32
_FLOAT = frozenset({F32, F16, BF16})
# types ggml's CPU backend converts to float (get_rows, mul_mat's src0, flash attention's K/V)
_TO_FLOAT = frozenset({F32, F16, BF16, GGMLType.Q4_0, GGMLType.Q4_1, GGMLType.Q5_0,
                       GGMLType.Q5_1, GGMLType.Q8_0, GGMLType.Q2_K, GGMLType.Q3_K,
                       GGMLType.Q4_K, GGMLType.Q5_K, GGMLType.Q6_K, GGMLType.IQ4_NL,
                       GGMLType.IQ4_XS})
# types it converts from float (cpy / set_rows destinations: the KV cache)
_FROM_FLOAT = frozenset({F32, F16, BF16, GGMLType.Q4_0, GGMLType.Q4_1, GGMLType.Q5_0,
                         GGMLType.Q5_1, GGMLType.Q8_0, GGMLType.IQ4_NL})


def _rows_dense(t: Tensor) -> bool:
    return t.nb[0] == traits(t.type).type_size


def why_unsupported(node: Tensor) -> str | None:
    """None if the rpc-server's ggml CPU backend (0c1e570) runs `node` as pyggml means it, else
    why not. A table per op of the types and layouts its kernels accept (from ggml-cpu's
    supports_op and the asserts of its kernels), limited to what pyggml builds."""
    op = node.op
    if op in VIEW_OPS or op == Op.NONE:
        return None
    if op not in OPS:
        return f"op {op.name} has no ggml number in the RPC tables"
    if op in (Op.SSM_CONV, Op.GATED_DELTA_NET):
        return (f"{op.name}: pyggml's recurrent op (a per-token sequence input, the new states "
                f"after the outputs) is not ggml's")
    src = [s for s in node.src if s is not None]
    for t in [node] + src:
        if t.type not in TYPES:
            return f"type {t.type.name} has no ggml number"
    a = node.src[0] if node.src else None
    b = node.src[1] if len(node.src) > 1 else None
    if a is None:
        return f"{op.name} needs a source"
    if op == Op.MUL_MAT:
        if a.type not in _TO_FLOAT or b is None or b.type != F32 or node.type != F32:
            return "MUL_MAT needs src0 of a float/legacy/k-quant type, src1 F32, result F32"
        if not _rows_dense(a) or not _rows_dense(b) or not _rows_dense(node):
            return "MUL_MAT needs rows with dense elements (nb[0] = element size)"
        if b.ne[2] % a.ne[2] or b.ne[3] % a.ne[3]:
            return "MUL_MAT broadcasts src0 over dims 2, 3 only by whole multiples"
        return None
    if op in (Op.ADD, Op.SUB, Op.MUL, Op.DIV):
        if a.type not in (F32, F16) or b is None or b.type not in (F32, a.type) \
                or node.type != a.type:
            return f"{op.name} needs src0 F32/F16, src1 F32 or src0's type, result src0's type"
        if not _rows_dense(a) or not _rows_dense(node) or not _rows_dense(b):
            return f"{op.name} needs dense rows"
        if any(a.ne[i] % b.ne[i] for i in range(4)):
            return f"{op.name}: src1 must repeat into src0"
        return None
    if op == Op.MUL_MAT_ID:
        ids = node.src[2] if len(node.src) > 2 else None
        if a.type not in _TO_FLOAT or b is None or b.type != F32 or node.type != F32 \
                or ids is None or ids.type != I32:
            return "MUL_MAT_ID needs src0 of a float/legacy/k-quant type, src1 F32, I32 ids"
        if not _rows_dense(a) or not _rows_dense(b) or not _rows_dense(node):
            return "MUL_MAT_ID needs rows with dense elements"
        return None
    if op in (Op.ARGSORT, Op.CLAMP):
        # ggml's kernels walk the rows as i * nb[1]: rows must follow each other in dims 1..3
        if a.type != F32 or node.type != (I32 if op == Op.ARGSORT else F32) \
                or not _rows_dense(a) or not _rows_dense(node):
            return f"{op.name} needs F32 input with dense rows"
        for t in (a, node):
            if t.nb[2] != t.nb[1] * t.ne[1] or t.nb[3] != t.nb[2] * t.ne[2]:
                return f"{op.name} needs rows evenly spaced over dims 1..3 (ggml walks i * nb[1])"
        return None
    if op == Op.SUM_ROWS:
        if a.type != F32 or node.type != F32 or not _rows_dense(a) or not _rows_dense(node):
            return "SUM_ROWS needs F32 with dense rows"
        return None
    if op in (Op.SQR, Op.SQRT, Op.GELU, Op.SILU, Op.TANH, Op.SIGMOID, Op.SOFTPLUS):
        if a.type not in (F32, F16) or node.type != a.type or not _rows_dense(a) \
                or not _rows_dense(node):
            return f"{op.name} needs F32/F16 with dense rows, result of the same type"
        return None
    if op in (Op.SCALE, Op.RMS_NORM, Op.NORM, Op.DIAG_MASK_INF):
        if a.type != F32 or node.type != F32 or not _rows_dense(a) or not _rows_dense(node):
            return f"{op.name} needs F32 with dense rows"
        # ggml asserts ggml_is_contiguous on both (a permuted input aborts the server)
        if op in (Op.SCALE, Op.DIAG_MASK_INF) and not (a.is_contiguous()
                                                       and node.is_contiguous()):
            return f"{op.name} needs a contiguous input and result (ggml's CPU kernel asserts it)"
        return None
    if op == Op.SOFT_MAX:
        if a.type != F32 or node.type != F32 or (b is not None and b.type not in (F32, F16)):
            return "SOFT_MAX needs F32 input (mask F16/F32)"
        if len(src) > 2:
            return "SOFT_MAX with attention sinks is not mapped"
        return None
    if op == Op.ROPE:
        mode = node.op_param_i32(2)
        if a.type not in (F32, F16) or node.type != a.type or b is None or b.type != I32:
            return "ROPE needs F32/F16 input and I32 positions"
        if mode not in (0, 2):
            return f"ROPE mode {mode} is not mapped"
        if len(node.src) > 2 and node.src[2] is not None and node.src[2].type != F32:
            return "ROPE frequency factors must be F32"
        return None
    if op == Op.FLASH_ATTN_EXT:
        k, v = node.src[1], node.src[2]
        mask = node.src[3] if len(node.src) > 3 else None
        if a.type != F32 or node.type != F32:
            return "FLASH_ATTN_EXT needs F32 q and result"
        if k.type not in _TO_FLOAT or v.type not in _TO_FLOAT:
            return f"FLASH_ATTN_EXT cannot read K {k.type.name} / V {v.type.name}"
        if mask is not None and mask.type != F16:
            return "FLASH_ATTN_EXT needs an F16 mask (ggml's CPU kernel reads it as F16)"
        if not all(_rows_dense(t) for t in (a, k, v, node)):
            return "FLASH_ATTN_EXT needs q, K, V and the result with dense rows"
        return None
    if op == Op.GET_ROWS:
        if b is None or b.type != I32:
            return "GET_ROWS needs I32 indices"
        if a.type == I32 and node.type == I32:
            return None
        if a.type not in _TO_FLOAT or node.type != F32:
            return f"GET_ROWS cannot convert {a.type.name} rows to {node.type.name}"
        return None
    if op == Op.SET_ROWS:
        dst = node.view_src if node.view_src is not None else node
        if a.type != F32 or b is None or b.type != I32 or dst.type not in _FROM_FLOAT:
            return "SET_ROWS needs F32 rows, I32 indices and a float/legacy-quant destination"
        return None
    if op in (Op.CPY, Op.DUP, Op.CONT):
        if a.type not in _FLOAT and a.type != node.type:
            return f"{op.name} from {a.type.name} only to the same type"
        if node.type not in _FROM_FLOAT:
            return f"{op.name} cannot convert to {node.type.name}"
        if traits(node.type).is_quantized and not node.is_contiguous():
            return f"{op.name} into a quantized tensor needs it contiguous"
        return None
    if op == Op.CONCAT:
        if b is None or a.type != b.type or node.type != a.type or a.type not in (F32, F16, I32):
            return "CONCAT needs two sources of the same F32/F16/I32 type"
        return None
    return f"op {op.name} is not in the RPC support table"


# ---- wire records ---------------------------------------------------------------------------

def _owner(t: Tensor) -> Tensor:
    while t.view_src is not None:
        t = t.view_src
    return t


def _buffer_of(t: Tensor):
    return t.buffer if t.buffer is not None else _owner(t).buffer


def check_layout(t: Tensor, endpoint: str) -> None:
    """What the server would abort on or silently misread: a type or op without a ggml number,
    counts or strides that do not fit its 32-bit fields, a quantized row that is not a whole
    number of blocks."""
    if t.type not in TYPES:
        raise BackendError(f"RPC {endpoint}: tensor '{t.name}' has type {t.type.name}, which has "
                           f"no ggml number in the RPC tables")
    if t.op not in OPS:
        raise BackendError(f"RPC {endpoint}: tensor '{t.name}' has op {t.op.name}, which has no "
                           f"ggml number in the RPC tables")
    for i in range(4):
        if not 0 <= t.ne[i] <= U32_MAX or not 0 <= t.nb[i] <= U32_MAX:
            raise BackendError(f"RPC {endpoint}: tensor '{t.name}': ne={list(t.ne)} "
                               f"nb={list(t.nb)} do not fit the protocol's 32-bit fields "
                               f"(a stride of 4 GiB or more cannot be sent)")
    blk = traits(t.type).block_size
    if blk > 1 and t.ne[0] % blk:
        raise BackendError(f"RPC {endpoint}: tensor '{t.name}': ne[0]={t.ne[0]} is not a "
                           f"multiple of {t.type.name}'s block of {blk}")


def pack_tensor(t: Tensor, conn: Connection, *, flags: int | None = None,
                with_data: bool = True, use_count: int = 0) -> bytes:
    """The 296-byte rpc_tensor of `t`. with_data: its buffer must be one of this connection's
    and [data, data + nbytes) inside it; otherwise buffer and data go as 0 (shape only).
    use_count: its consumers in the graph (ggml's CPU backend fuses RMS_NORM + MUL only where
    the norm has one; 0: unknown, nothing fused)."""
    check_layout(t, conn.endpoint)
    buf_id = data = 0
    if with_data:
        buf = _buffer_of(t)
        if not isinstance(buf, RpcBuffer) or buf.conn is not conn or t.data is None:
            raise BackendError(f"RPC {conn.endpoint}: tensor '{t.name}' is not in memory of this "
                               f"server (its buffer: {buf!r})")
        n = t.nbytes()
        if t.data < buf.base or t.data + n > buf.base + buf.n_bytes:
            raise BackendError(f"RPC {conn.endpoint}: tensor '{t.name}': bytes [{t.data - buf.base},"
                               f" {t.data - buf.base + n}) outside its buffer of {buf.n_bytes}")
        if buf.remote_ptr == 0:
            raise BackendError(f"RPC {conn.endpoint}: tensor '{t.name}': its buffer was freed")
        buf_id, data = buf.remote_ptr, t.data
    wire = OPS[t.op]
    params = bytearray(t.op_params)
    if wire.unary is not None:
        struct.pack_into("<i", params, 0, wire.unary[1])
    src = [0] * MAX_SRC
    for i, s in enumerate(t.src[:MAX_SRC]):
        if s is not None:
            src[i] = id(s)
    vs = t.view_src
    name = t.name.encode("utf-8", "replace")[:MAX_NAME_BYTES]
    return RPC_TENSOR.pack(id(t), TYPES[t.type], buf_id, *t.ne, *t.nb, wire.number,
                           *struct.unpack("<16i", params),
                           int(t.flags) if flags is None else flags, *src,
                           0 if vs is None else id(vs), t.view_offs if vs is not None else 0,
                           data, name, use_count)


def serialize_graph(graph: Graph, device: int, conn: Connection) -> bytes:
    """GRAPH_COMPUTE's payload: u32 device | u32 n_nodes | u64 ids | u32 n_tensors | tensors.
    Nodes: the graph's non-view nodes, each with the COMPUTE flag (ggml skips nodes without
    it); tensors: everything reachable through src and view_src, each once, with its use count
    in the graph (a split's: the whole graph's, Graph.subgraph), as llama.cpp's client sends."""
    nodes = [t for t in graph.nodes if t.op not in VIEW_OPS and t.op != Op.NONE]
    for t in nodes:
        why = why_unsupported(t)
        if why is not None:
            raise UnsupportedOpError(f"RPC {conn.endpoint}: node '{t.name}' ({t.op.name}): {why}")
    node_ids = {id(t) for t in nodes}
    records: list[bytes] = []
    seen: set[int] = set()
    stack = list(reversed(nodes))
    while stack:
        t = stack.pop()
        if id(t) in seen:
            continue
        seen.add(id(t))
        fl = int(t.flags) | _COMPUTE if id(t) in node_ids else int(t.flags) & ~_COMPUTE
        records.append(pack_tensor(t, conn, flags=fl, use_count=graph.use_count(t)))
        stack.extend(s for s in t.src if s is not None)
        if t.view_src is not None:
            stack.append(t.view_src)
    head = struct.pack(f"<II{len(nodes)}Q", device, len(nodes), *(id(t) for t in nodes))
    return b"".join([head, struct.pack("<I", len(records))] + records)


# ---- memory ---------------------------------------------------------------------------------

class RpcBufferType(BufferType):
    """The default buffer type of one remote device (not host memory)."""

    def __init__(self, device: "RpcDevice", alignment: int, max_size: int):
        super().__init__(device.name, alignment=alignment,
                         max_size=None if max_size >= (1 << 63) else max_size,
                         is_host=False, device=device)
        self.conn = device.conn
        self.index = device.index
        self._alloc_sizes: dict[tuple, int] = {}

    def alloc_buffer(self, n_bytes: int, usage: BufferUsage = BufferUsage.ANY) -> "RpcBuffer":
        return RpcBuffer(self, n_bytes, usage)

    def get_alloc_size(self, tensor: Tensor) -> int:
        """Bytes the server's buffer type wants for `tensor` (GET_ALLOC_SIZE), asked only where
        llama.cpp's client asks: a quantized tensor owning its memory whose rows are not a
        multiple of 512 elements (CUDA pads those). Cached by type and shape; never less than
        nbytes."""
        n = tensor.nbytes()
        if tensor.view_src is not None or not traits(tensor.type).is_quantized \
                or tensor.ne[0] % 512 == 0:
            return n
        key = (tensor.type, tensor.ne, tensor.nb)
        got = self._alloc_sizes.get(key)
        if got is None:
            check_layout(tensor, self.conn.endpoint)
            shape = Tensor(tensor.type, tensor.ne, tensor.nb, name=tensor.name)
            rec = pack_tensor(shape, self.conn, with_data=False)
            payload = struct.pack("<I", self.index) + rec + bytes(RPC_TENSOR.size * MAX_SRC)
            got = _U64.unpack(self.conn.request(Cmd.GET_ALLOC_SIZE, payload, 8))[0]
            self._alloc_sizes[key] = got
        return max(n, got)


def _free_remote(conn_ref, remote_ptr: int) -> None:
    conn = conn_ref()
    if conn is not None and conn.broken is None:
        conn.queue_free(remote_ptr)


class RpcBuffer(Buffer):
    """One ALLOC_BUFFER on the server; freed (FREE_BUFFER, queued) when collected."""

    def __init__(self, buft: RpcBufferType, n_bytes: int, usage: BufferUsage = BufferUsage.ANY):
        super().__init__(buft, n_bytes, usage)
        self.conn: Connection = buft.conn
        self.endpoint = self.conn.endpoint
        if n_bytes < 0 or (buft.max_size is not None and n_bytes > buft.max_size):
            raise BackendError(f"RPC {self.endpoint}: cannot allocate {n_bytes} bytes on "
                               f"{buft.name} (largest: {buft.max_size})")
        ptr, size = self.conn.alloc_buffer(buft.index, max(n_bytes, 1))
        if ptr == 0:
            free, total = buft.device.memory()
            raise BackendError(f"RPC {self.endpoint}: {buft.name} could not allocate "
                               f"{n_bytes} bytes ({free} of {total} bytes free)")
        self.remote_ptr = ptr
        self.remote_size = size
        self.base = self.conn.buffer_get_base(ptr)
        self._gets: dict[tuple, Prepared] = {}      # get_tensor_into's requests, by read
        self._finalizer = weakref.finalize(self, _free_remote, weakref.ref(self.conn), ptr)

    def free(self) -> None:
        """Free the remote memory now (else when collected)."""
        if self._finalizer.alive:
            self._finalizer()
            self.remote_ptr = 0
            self._gets.clear()

    def _span(self, tensor: Tensor, offset: int, n: int, what: str) -> None:
        if _buffer_of(tensor) is not self:
            raise BackendError(f"RPC {self.endpoint}: {what} '{tensor.name}': the tensor is not in "
                               f"this buffer")
        if offset < 0 or n < 0 or offset + n > tensor.nbytes():
            raise BackendError(f"RPC {self.endpoint}: {what} '{tensor.name}': bytes [{offset}, "
                               f"{offset + n}) outside the tensor's {tensor.nbytes()} bytes")
        self._range(tensor, offset, n, f"RPC {self.endpoint}: {what}")

    def set_tensor(self, tensor: Tensor, data, offset: int = 0) -> None:
        mv = memoryview(data).cast("B") if not isinstance(data, memoryview) else data.cast("B")
        n = mv.nbytes
        self._span(tensor, offset, n, "set_tensor")
        if n == 0:
            return
        rec = pack_tensor(tensor, self.conn)
        conn, st = self.conn, self.conn.stats
        weights = self.usage is BufferUsage.WEIGHTS
        hash_min = getattr(self.buft.device, "hash_min_bytes", HASH_MIN_BYTES)
        if weights and hash_min is not None and n >= hash_min:
            h = fnv1a64(mv)
            hit = conn.request(Cmd.SET_TENSOR_HASH, rec + struct.pack("<QQ", offset, h), 1)
            if hit == b"\x01":
                st.hash_hits += 1
                return
            st.hash_misses += 1
            cache_flag = 1
        else:
            cache_flag = 0
        head = rec + struct.pack("<BQ", cache_flag, offset)
        conn.request(Cmd.SET_TENSOR, (head, mv), flush=False)
        if weights:
            st.weight_bytes_uploaded += n

    def get_tensor(self, tensor: Tensor, offset: int = 0, n_bytes: int | None = None) -> bytes:
        n = tensor.nbytes() - offset if n_bytes is None else n_bytes
        self._span(tensor, offset, n, "get_tensor")
        if n == 0:
            return b""
        rec = pack_tensor(tensor, self.conn)
        return self.conn.request(Cmd.GET_TENSOR, rec + struct.pack("<QQ", offset, n), n)

    def get_tensor_into(self, tensor: Tensor, out: memoryview, offset: int = 0) -> None:
        """GET_TENSOR received straight into `out` (a model's logits: no 1 MiB copy a token)."""
        n = out.nbytes
        key = (id(tensor), tensor.data, tensor.type, tensor.ne, tensor.nb, tensor.view_offs,
               offset, n)
        req = self._gets.get(key) if self.remote_ptr else None
        if req is None:                 # the same read every token (logits): marshalled once
            self._span(tensor, offset, n, "get_tensor")
            rec = pack_tensor(tensor, self.conn)
            if len(self._gets) >= 64:
                self._gets.clear()
            req = self._gets[key] = Prepared.of([(Cmd.GET_TENSOR,
                                                  rec + struct.pack("<QQ", offset, n))])
        self.conn.request_into(req, [out])

    def memset_tensor(self, tensor: Tensor, value: int, offset: int = 0,
                      n_bytes: int | None = None) -> None:
        n = tensor.nbytes() - offset if n_bytes is None else n_bytes
        self._span(tensor, offset, n, "memset_tensor")
        if n == 0:
            return
        rec = pack_tensor(tensor, self.conn)
        self.conn.request(Cmd.MEMSET_TENSOR, rec + struct.pack("<QQB", offset, n, value & 0xFF),
                          flush=False)

    def cpy_tensor(self, src: Tensor, dst: Tensor) -> bool:
        """COPY_TENSOR when src is on the same server; SET_TENSOR from host memory."""
        if is_host_tensor(src):
            self.set_tensor(dst, _host_view(src.data, src.nbytes()))
            return True
        sb = _buffer_of(src)
        if not isinstance(sb, RpcBuffer) or sb.conn is not self.conn:
            return False
        self._span(dst, 0, src.nbytes(), "cpy_tensor into")
        payload = pack_tensor(src, self.conn) + pack_tensor(dst, self.conn)
        return self.conn.request(Cmd.COPY_TENSOR, payload, 1) == b"\x01"

    def clear(self, value: int = 0) -> None:
        self.conn.buffer_clear(self.remote_ptr, value)


# ---- devices and their backends -------------------------------------------------------------

class RpcDevice(Device):
    """Device `index` of the rpc-server at `endpoint`. Reported as a GPU, as llama.cpp does."""

    type = DeviceType.GPU

    def __init__(self, conn: Connection, index: int, hash_min_bytes: int | None):
        self.conn = conn
        self.index = index
        self.endpoint = conn.endpoint
        self.name = device_name(conn.endpoint, index)
        self.description = f"ggml rpc-server {conn.endpoint} device {index}"
        self.hash_min_bytes = hash_min_bytes
        self._buft = RpcBufferType(self, conn.get_alignment(index), conn.get_max_size(index))
        self.last_graph: tuple | None = None      # (weakref to Graph, uid) the server stores

    def memory(self) -> tuple[int, int]:
        return self.conn.get_device_memory(self.index)

    def buffer_types(self) -> list[BufferType]:
        return [self._buft]

    def init_backend(self, **_ignored) -> "RpcBackend":
        return RpcBackend(self)


def device_name(endpoint: str, index: int) -> str:
    """'RPC[host:port]' for a server's first device, 'RPC<d>[host:port]' for the others."""
    return f"RPC[{endpoint}]" if index == 0 else f"RPC{index}[{endpoint}]"


class RpcBackend(Backend):
    """Runs split graphs on one remote device."""

    def __init__(self, device: RpcDevice):
        self.device = device
        self.name = device.name
        self.conn = device.conn
        self._payloads: "weakref.WeakKeyDictionary[Graph, tuple[int, bytes]]" = \
            weakref.WeakKeyDictionary()
        self._support: dict[tuple, bool] = {}
        self.n_computes = 0          # GRAPH_COMPUTE sent (counters for tests and benchmarks)
        self.n_recomputes = 0        # GRAPH_RECOMPUTE sent

    def get_default_buffer_type(self) -> BufferType:
        return self.device._buft

    def supports_buft(self, buft: BufferType) -> bool:
        return buft is self.device._buft

    def supports_op(self, node: Tensor) -> bool:
        if node.op in VIEW_OPS or node.op == Op.NONE:
            return True
        key = (node.op, node.type, node.ne, node.nb, bytes(node.op_params),
               None if node.view_src is None else node.view_src.type,
               tuple(None if s is None else (s.type, s.ne, s.nb) for s in node.src))
        ok = self._support.get(key)
        if ok is None:
            if len(self._support) >= 1 << 16:
                self._support.clear()
            ok = self._support[key] = why_unsupported(node) is None
        return ok

    def graph_compute(self, graph: Graph) -> None:
        dev = self.device
        last = dev.last_graph
        if last is not None and last[0]() is graph and last[1] == graph.uid:
            self.conn.graph_recompute(dev.index)
            self.n_recomputes += 1
            return
        cached = self._payloads.get(graph)
        if cached is None or cached[0] != graph.uid:
            cached = (graph.uid, serialize_graph(graph, dev.index, self.conn))
            self._payloads[graph] = cached
        self.conn.request(Cmd.GRAPH_COMPUTE, cached[1])
        self.n_computes += 1
        dev.last_graph = (weakref.ref(graph), graph.uid)

    def cpy_tensor_async(self, src: Tensor, dst: Tensor) -> bool:
        db = _buffer_of(dst)
        sb = _buffer_of(src)
        if not isinstance(db, RpcBuffer) or not isinstance(sb, RpcBuffer) or \
                sb.conn is not self.conn or db.conn is not self.conn:
            return False
        return db.cpy_tensor(src, dst)

    def compile_input_copies(self, copies, backends):
        """A split's input copies into this device as one marshalled upload (_InputUpload), or
        None when one of them is not a plain copy it knows: from host memory, or from another
        rpc-server (read with GET_TENSOR), into this device's compute memory, at most
        QUEUE_MAX_BYTES each. Validated here, once: the scheduler builds it per split."""
        conn = self.conn
        blob, cmds, sizes = bytearray(), [], []
        host: list[tuple[int, int, int]] = []          # (offset in blob, source address, bytes)
        remote: dict[int, tuple[Connection, list, list]] = {}   # id(conn) -> (conn, GETs, slots)
        for src, dst, sb, _user in copies:
            db = _buffer_of(dst)
            n = src.nbytes()
            if (not isinstance(db, RpcBuffer) or db.conn is not conn
                    or db.usage is BufferUsage.WEIGHTS or dst.nbytes() != n
                    or not 0 < n <= QUEUE_MAX_BYTES or src.data is None):
                return None
            if is_host_tensor(src):
                where = None
            else:
                sbuf = _buffer_of(src)
                if not isinstance(sbuf, RpcBuffer) or sbuf.conn is conn or sbuf.conn.broken:
                    return None
                where = sbuf.conn
            req = request_bytes(Cmd.SET_TENSOR, pack_tensor(dst, conn)
                                + struct.pack("<BQ", 0, 0) + bytes(n))
            slot = len(blob) + len(req) - n
            blob += req
            cmds.append(Cmd.SET_TENSOR)
            sizes.append(len(req))
            if where is None:
                host.append((slot, src.data, n))
            else:
                get = request_bytes(Cmd.GET_TENSOR, pack_tensor(src, where)
                                    + struct.pack("<QQ", 0, n))
                entry = remote.setdefault(id(where), (where, [], []))
                entry[1].append(get)
                entry[2].append((slot, n))
        if not cmds:
            return None
        sync = []
        for _src, _dst, sb, _user in copies:
            if backends[sb] not in sync and backends[sb] is not self:
                sync.append(backends[sb])
        reads = [(c, Prepared(bytearray(b"".join(gets)), [Cmd.GET_TENSOR] * len(gets),
                              [len(g) for g in gets]), slots)
                 for c, gets, slots in remote.values()]
        return _InputUpload(conn, Prepared(blob, cmds, sizes), host, reads, sync)


class _InputUpload:
    """One split's input copies into one rpc-server, marshalled once: the SET_TENSOR requests
    (headers, tensor records) stand in one buffer and each call only rewrites their data:
    host sources by memmove, sources on other rpc-servers received straight into place (their
    GET_TENSORs pipelined, one write and one wait per server); then the buffer joins the
    connection's queue and goes out with the graph compute. Measured in a decode loop: ~15 us
    for a split's six inputs, where one set_tensor per input (a record packed and checked, a
    command queued) took 10-60 us each."""

    __slots__ = ("conn", "upload", "host", "reads", "sync", "_addr")

    def __init__(self, conn, upload: Prepared, host, reads, sync):
        self.conn, self.upload, self.host, self.sync = conn, upload, host, sync
        mv = memoryview(upload.blob)
        self._addr = ctypes.addressof(ctypes.c_char.from_buffer(upload.blob))
        self.reads = [(c, req, [mv[off:off + n] for off, n in slots]) for c, req, slots in reads]

    def __call__(self) -> None:
        for b in self.sync:                 # the sources' backends are done (as tensor_copy)
            b.synchronize()
        base = self._addr
        for off, src, n in self.host:
            ctypes.memmove(base + off, src, n)
        for c, req, views in self.reads:
            c.request_into(req, views)
        self.conn.send_prepared(self.upload)


class RpcReg(BackendReg):
    """The devices of one rpc-server, over one connection."""

    def __init__(self, conn: Connection, hash_min_bytes: int | None):
        self.conn = conn
        self.endpoint = conn.endpoint
        n = conn.device_count()
        if n == 0:
            conn.close()
            raise RpcError(f"RPC server {conn.endpoint}: reports no device")
        devs = [RpcDevice(conn, i, hash_min_bytes) for i in range(n)]
        super().__init__(f"RPC[{conn.endpoint}]", devs)

        def _graphs_freed(devs=devs):       # FREE_BUFFER discards the server's stored graphs
            for d in devs:
                d.last_graph = None
        conn.on_free = _graphs_freed

    def traffic(self) -> TrafficStats:
        return self.conn.stats.snapshot()

    def close(self) -> None:
        self.conn.close()


# ---- registration ---------------------------------------------------------------------------

def parse_endpoints(endpoints) -> list[str]:
    """'h:p,h:p' or an iterable of 'h:p' -> a list without duplicates, each checked."""
    from pyggml.backend.rpc.protocol import parse_endpoint
    items = endpoints.split(",") if isinstance(endpoints, str) else list(endpoints)
    out = []
    for e in items:
        if not isinstance(e, str):
            raise RpcError(f"RPC endpoint {e!r}: expected a 'host:port' string")
        e = e.strip()
        if not e:
            continue
        parse_endpoint(e)
        if e not in out:
            out.append(e)
    return out


def register_endpoints(endpoints, registry: Registry | None = None, *,
                       timeout_s: float | None = None,
                       hash_min_bytes: int | None = -1) -> list[RpcReg]:
    """Connect to each rpc-server in `endpoints` ('host:port' strings or one comma-separated
    string, as llama.cpp's --rpc) and add its devices to `registry` (default: the process-wide
    one). An endpoint already registered there is kept as it is (one connection per server).

    timeout_s: per socket operation (default $PYGGML_RPC_TIMEOUT or 60 s); hash_min_bytes:
    weights of at least this many bytes are offered by hash first (None: never; default
    $PYGGML_RPC_HASH_MIN or 64 KiB), both through pyggml.settings. Raises RpcError naming the endpoint when one cannot be
    reached or speaks another protocol version; nothing is registered then."""
    reg = registry if registry is not None else default_registry()
    st = settings.current()
    timeout = timeout_s if timeout_s is not None else st.rpc_timeout_s
    hmin = st.rpc_hash_min_bytes if hash_min_bytes == -1 else hash_min_bytes
    existing = {r.endpoint: r for r in rpc_regs(reg)}
    made: list[RpcReg] = []
    out: list[RpcReg] = []
    try:
        for e in parse_endpoints(endpoints):
            old = existing.get(e)
            if old is not None and old.conn.broken is None:
                out.append(old)
                continue
            r = RpcReg(Connection(e, timeout), hmin)
            made.append(r)
            out.append(r)
    except BaseException:
        for r in made:
            r.close()
        raise
    for e, old in existing.items():                 # a dead server registered again
        if old.conn.broken is not None and any(r.endpoint == e for r in made):
            reg.unregister(old)
    for r in made:
        reg.register(r)
    return out


def unregister_endpoints(endpoints, registry: Registry | None = None) -> None:
    """Close the connections to these servers and drop their devices from the registry."""
    reg = registry if registry is not None else default_registry()
    want = set(parse_endpoints(endpoints))
    for r in rpc_regs(reg):
        if r.endpoint in want:
            r.close()
            reg.unregister(r)
    for m in reg.backend_regs():                    # servers inside a $PYGGML_RPC entry
        if isinstance(m, _MultiReg):
            m.regs = [r for r in m.regs if r.endpoint not in want]
            m._devices = [d for r in m.regs for d in r.devices()]


def connect(endpoints, registry: Registry | None = None, **kw) -> list[RpcReg]:
    """Short name of register_endpoints."""
    return register_endpoints(endpoints, registry, **kw)


def backend_reg() -> BackendReg | None:
    """The registry's entry point (Registry.DEFAULT_MODULES): the devices of the servers named in
    $PYGGML_RPC ('host:port,host:port'; unset or empty: None, no device). The Registry takes one
    entry per module, so several servers come as one entry holding each server's RpcReg."""
    st = settings.current()
    if not st.rpc_endpoints:
        return None
    timeout, hmin = st.rpc_timeout_s, st.rpc_hash_min_bytes
    regs: list[RpcReg] = []
    try:
        for e in st.rpc_endpoints:
            regs.append(RpcReg(Connection(e, timeout), hmin))
    except BaseException:
        for r in regs:
            r.close()
        raise
    return _MultiReg(regs)


def rpc_regs(registry: Registry | None = None) -> list[RpcReg]:
    """Every server registered in `registry` (default: the process-wide one)."""
    reg = registry if registry is not None else default_registry()
    out = []
    for r in reg.backend_regs():
        out.extend(r.regs if isinstance(r, _MultiReg) else [r] if isinstance(r, RpcReg) else [])
    return out


def connected_endpoints(registry: Registry | None = None) -> list[str]:
    """Endpoints of the servers in `registry` (default: the process-wide one, if it was built:
    this does not build it) whose connection is alive."""
    reg = registry if registry is not None else default_registry(create=False)
    if reg is None:
        return []
    return [r.endpoint for r in rpc_regs(reg) if r.conn.broken is None]


class _MultiReg(BackendReg):
    """Several servers' devices as one registry entry (for $PYGGML_RPC with several servers)."""

    def __init__(self, regs: list[RpcReg]):
        self.regs = regs
        self.name = "RPC"
        self._devices = [d for r in regs for d in r.devices()]

    def close(self) -> None:
        for r in self.regs:
            r.close()
