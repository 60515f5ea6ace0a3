"""ggml's RPC protocol 7.0.0 (llama.cpp 0c1e570), client side: framing, messages, one connection.

Byte layouts are in docs/rpc-protocol.md. In short: a request is `u8 cmd | u64 size | payload`,
a response (only for commands that have one) `u64 size | payload`; little-endian, packed. The
first command must be HELLO. The server answers strictly in order and never sends an error code:
on any failure it closes the connection (or aborts, which is why the backend validates first).

`Connection` is one TCP connection to one rpc-server, shared by all devices that server reports.
Every socket operation has a timeout; any failure (refused, closed, timed out, a reply of the
wrong size) marks the connection broken and raises RpcError naming the endpoint, and every later
call raises at once: after a failure the server's state (buffers, stored graphs) is gone or out
of step, so nothing is retried.

Writes are coalesced: a small command without an answer (SET_TENSOR of a graph input,
FREE_BUFFER, ...) is queued and goes out in the same socket write as the next command that must
leave now: one that waits for an answer, or a graph compute (the server should start at once).
A decoded token is then two writes (its inputs + GRAPH_RECOMPUTE, then GET_TENSOR) and one round
trip, instead of one write per command, each waking the server for a few hundred bytes. The
server reads a byte stream and handles commands strictly in order, so nothing else changes; a
dead server shows at the write that flushes the queue, at the latest the next read of a result.
"""

from __future__ import annotations

import ctypes
import logging
import select
import socket
import struct
import threading
from dataclasses import dataclass, field
from enum import IntEnum

import numpy as np

from pyggml import _native
from pyggml.errors import BackendError

_log = logging.getLogger("pyggml.rpc")

PROTO_VERSION = (7, 0, 0)
DEFAULT_PORT = 50052


class RpcError(BackendError):
    """An rpc-server cannot be reached, rejected us, went away or stopped answering. The message
    names the endpoint and the command. `detail`: what exactly went wrong where the message does
    not say it (connecting: see Connection)."""

    def __init__(self, message: str, detail: str | None = None):
        super().__init__(message)
        self.detail = detail


class Cmd(IntEnum):
    ALLOC_BUFFER = 0
    GET_ALIGNMENT = 1
    GET_MAX_SIZE = 2
    BUFFER_GET_BASE = 3
    FREE_BUFFER = 4
    BUFFER_CLEAR = 5
    SET_TENSOR = 6
    SET_TENSOR_HASH = 7
    GET_TENSOR = 8
    COPY_TENSOR = 9
    GRAPH_COMPUTE = 10
    GET_DEVICE_MEMORY = 11
    INIT_TENSOR = 12
    GET_ALLOC_SIZE = 13
    HELLO = 14
    DEVICE_COUNT = 15
    GRAPH_RECOMPUTE = 16
    MEMSET_TENSOR = 17


# rpc_tensor: id, type, buffer, ne[4] (u32), nb[4] (u32), op, op_params[16], flags, src[10],
# view_src, view_offs, data, name[64], use_count. 296 bytes, packed.
RPC_TENSOR = struct.Struct("<QIQ4I4II16ii10QQQQ64si")
assert RPC_TENSOR.size == 296
HELLO_CAPS_BYTES = 24               # conn_caps (RDMA negotiation); all zero = plain TCP
MAX_NAME_BYTES = 63                 # GGML_MAX_NAME - 1
U32_MAX = (1 << 32) - 1
HASH_MIN_BYTES = 64 << 10           # default: weights this large are offered by hash first
QUEUE_MAX_BYTES = 64 << 10          # queued commands: flushed before they grow past this; a
                                    # larger payload goes straight from the caller's memory
RECV_BUFFER_MAX_BYTES = 16 << 20    # answers up to this size are received into a kept buffer

_HDR = struct.Struct("<BQ")
_U64 = struct.Struct("<Q")


def fnv1a64(data) -> int:
    """FNV-1a 64 of bytes-like data (the server's cache key); computed in libpyggml, in place
    (read-only buffers such as a mapped GGUF file included)."""
    arr = np.frombuffer(memoryview(data).cast("B"), dtype=np.uint8)
    return _native.fn("pg_fnv1a64")(arr.ctypes.data if arr.size else None, arr.size)


_native.declare("pg_fnv1a64", ctypes.c_uint64, [ctypes.c_void_p, ctypes.c_size_t])


def parse_endpoint(text: str) -> tuple[str, int]:
    """'host:port' -> (host, port); raises RpcError naming the text when malformed."""
    if not isinstance(text, str) or not text.strip():
        raise RpcError(f"RPC endpoint {text!r}: expected 'host:port'")
    t = text.strip()
    host, sep, port = t.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise RpcError(f"RPC endpoint {text!r}: expected 'host:port' with a port in 1..65535")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    return host, int(port)


@dataclass
class TrafficStats:
    """Bytes and commands that went over one connection (headers included; a queued command
    counts when it is queued)."""
    bytes_sent: int = 0
    bytes_received: int = 0
    commands: dict[str, int] = field(default_factory=dict)
    bytes_by_command: dict[str, int] = field(default_factory=dict)
    weight_bytes_uploaded: int = 0   # SET_TENSOR data into WEIGHTS buffers
    hash_hits: int = 0               # SET_TENSOR_HASH answered 1: the server had the bytes
    hash_misses: int = 0
    writes: int = 0                  # socket writes (sendall calls): queued commands share one
    round_trips: int = 0             # commands whose answer we waited for

    def snapshot(self) -> "TrafficStats":
        return TrafficStats(self.bytes_sent, self.bytes_received, dict(self.commands),
                            dict(self.bytes_by_command), self.weight_bytes_uploaded,
                            self.hash_hits, self.hash_misses, self.writes, self.round_trips)


class Prepared:
    """Requests marshalled once and sent many times (a split's input copies, built by the RPC
    backend when the scheduler first runs the split): `blob` holds whole requests, each
    `u8 cmd | u64 size | payload`; the caller rewrites only data bytes inside it between sends.
    cmds: each request's command, in order; sizes: each request's bytes."""

    __slots__ = ("blob", "cmds", "names", "_counts")

    def __init__(self, blob: bytearray, cmds: list["Cmd"], sizes: list[int]):
        if sum(sizes) != len(blob) or len(sizes) != len(cmds) or not cmds:
            raise ValueError(f"Prepared: {len(cmds)} requests of {sum(sizes)} bytes in a blob "
                             f"of {len(blob)}")
        self.blob, self.cmds = blob, list(cmds)
        self.names = [c.name for c in cmds]
        counts: dict[str, tuple[int, int]] = {}
        for name, n in zip(self.names, sizes):
            k, b = counts.get(name, (0, 0))
            counts[name] = (k + 1, b + n)
        self._counts = list(counts.items())

    @classmethod
    def of(cls, requests: list[tuple["Cmd", bytes]]) -> "Prepared":
        parts = [request_bytes(c, p) for c, p in requests]
        return cls(bytearray(b"".join(parts)), [c for c, _ in requests], [len(p) for p in parts])

    def count_into(self, st: "TrafficStats") -> None:
        st.bytes_sent += len(self.blob)
        for name, (k, n) in self._counts:
            st.commands[name] = st.commands.get(name, 0) + k
            st.bytes_by_command[name] = st.bytes_by_command.get(name, 0) + n


def request_bytes(cmd: "Cmd", payload: bytes) -> bytes:
    """One whole request: u8 cmd | u64 size | payload."""
    return _HDR.pack(int(cmd), len(payload)) + payload


class Connection:
    """One TCP connection to an rpc-server at `endpoint` ('host:port'), after HELLO.

    timeout_s: the most any one socket operation (connect, send, waiting for a reply, which
    includes the server's compute time for the graph before it) may take."""

    def __init__(self, endpoint: str, timeout_s: float = 60.0):
        if not timeout_s or timeout_s <= 0:
            raise RpcError(f"RPC endpoint {endpoint}: timeout must be > 0 s, got {timeout_s!r}")
        self.host, self.port = parse_endpoint(endpoint)
        self.endpoint = endpoint.strip()
        self.timeout_s = float(timeout_s)
        self.stats = TrafficStats()
        self.broken: str | None = None
        self._lock = threading.RLock()
        self._queue = bytearray()        # commands without an answer, not yet written
        self._queued: list[str] = []     # their names, for error messages
        self._recv_buf = bytearray()     # answers are received here (see _recv_exact)
        self._pending_frees: list[int] = []
        self.on_free = None              # called after FREE_BUFFERs go out (stored graphs die)
        # Whatever fails before the server has answered HELLO as one of protocol PROTO_VERSION
        # (refused, no answer in time, closed, another protocol or version) gives one message:
        # an endpoint a request names must not tell a port scanner which of them it was. What
        # it was goes to `detail` (and the debug log) for the one who runs the servers.
        try:
            try:
                self._sock = socket.create_connection((self.host, self.port),
                                                      timeout=self.timeout_s)
            except socket.timeout:
                raise RpcError("", f"no connection within {self.timeout_s:g} s") from None
            except OSError as e:
                raise RpcError("", f"connect: {e.strerror or e}") from None
            self._sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            self._sock.settimeout(self.timeout_s)
            try:
                self.server_version = self._hello()
            except BaseException:
                self.close()
                raise
        except RpcError as e:
            detail = e.detail or str(e)
            _log.debug("RPC server %s: %s", self.endpoint, detail)
            raise RpcError(f"RPC server {self.endpoint}: cannot connect: no rpc-server of "
                           f"protocol {_ver(PROTO_VERSION)} (llama.cpp 0c1e570, llama-cpp-python "
                           f"0.3.36) answered there within {self.timeout_s:g} s (start one with: "
                           f"rpc-server -H <host> -p {self.port}; one client at a time)",
                           detail) from None

    # ---- framing -----------------------------------------------------------------------------
    def _fail(self, what: str) -> RpcError:
        self.broken = what
        try:
            self._sock.close()
        except OSError:
            pass
        return RpcError(f"RPC server {self.endpoint}: {what}")

    def _check_usable(self, cmd: Cmd) -> None:
        if self.broken is not None:
            raise RpcError(f"RPC server {self.endpoint}: cannot send {cmd.name}: the connection "
                           f"failed earlier ({self.broken}); reconnect and load again")

    def _send(self, cmd: Cmd, payload, flush: bool = True) -> None:
        """Queue or write one command. payload: bytes-like, or a tuple of bytes-like parts (a
        header and a large tensor's bytes, not joined). flush: write it, with everything
        queued before it, now; else it may wait in the queue (a command without an answer)."""
        parts = payload if isinstance(payload, tuple) else (payload,)
        n = sum(memoryview(p).nbytes for p in parts)
        q = self._queue
        if n <= QUEUE_MAX_BYTES:
            if q and len(q) + _HDR.size + n > QUEUE_MAX_BYTES:
                self._write(q)
            q += _HDR.pack(int(cmd), n)
            for p in parts:
                q += p
            self._queued.append(cmd.name)
            if flush:
                self._write(q)
        else:       # large: header and small parts join the queue, a large part goes as is
            q += _HDR.pack(int(cmd), n)
            self._queued.append(cmd.name)
            for p in parts:
                if memoryview(p).nbytes <= QUEUE_MAX_BYTES:
                    q += p
                else:
                    self._write(q)
                    self._write(p, (cmd.name, n))
            if q:
                self._write(q)
        st = self.stats
        st.bytes_sent += _HDR.size + n
        st.commands[cmd.name] = st.commands.get(cmd.name, 0) + 1
        st.bytes_by_command[cmd.name] = st.bytes_by_command.get(cmd.name, 0) + _HDR.size + n

    def _write(self, data, large: tuple[str, int] | None = None) -> None:
        """sendall(data): the queue (emptied, also on failure), or one part of a large
        payload, large = (its command's name, the payload's size)."""
        if large is None:
            what = ", ".join(self._queued[-3:])
            if len(self._queued) > 3:
                what = f"{len(self._queued) - 3} queued commands, then {what}"
            size = len(data)
        else:
            what, size = large
        try:
            self._sock.sendall(data)
        except socket.timeout:
            raise self._fail(f"sending {what} ({size} bytes) timed out after "
                             f"{self.timeout_s:g} s (the server stopped reading)") from None
        except OSError as e:
            raise self._fail(f"sending {what} failed: {e.strerror or e} (the server closed "
                             f"the connection: it crashed or rejected an earlier request)"
                             ) from None
        finally:
            if large is None:
                del data[:]
                self._queued.clear()
        self.stats.writes += 1

    def flush(self) -> None:
        """Write the queued commands now (nothing to do when none is queued)."""
        with self._lock:
            if self._queue and self.broken is None:
                self._write(self._queue)

    def _recv_exact(self, n: int, cmd: Cmd) -> bytes:
        """n bytes of an answer. Received into the connection's own buffer (kept, up to
        RECV_BUFFER_MAX_BYTES), then copied out: a new buffer per answer costs a page fault per
        4 KiB, twice (it and the copy), which for a model's logits (1 MiB a token for Gemma 3)
        took ~0.8 ms a token on a VM, against ~0.07 ms for the copy from a kept buffer."""
        if n > RECV_BUFFER_MAX_BYTES:
            view = memoryview(bytearray(n))
        else:
            if len(self._recv_buf) < n:
                self._recv_buf = bytearray(n)
            view = memoryview(self._recv_buf)[:n]
        self._recv_into(view, cmd)
        return bytes(view)

    def _recv_into(self, view: memoryview, cmd: Cmd) -> None:
        """Fill `view` (writable bytes) with the next bytes of an answer to `cmd`."""
        n, got = view.nbytes, 0
        try:
            while got < n:
                k = self._sock.recv_into(view[got:], n - got)
                if k == 0:
                    raise self._fail(f"closed the connection while we waited for the answer to "
                                     f"{cmd.name} (the server crashed or rejected the request)")
                got += k
        except socket.timeout:
            raise self._fail(f"no answer to {cmd.name} within {self.timeout_s:g} s "
                             f"(the server stopped answering)") from None
        except OSError as e:
            raise self._fail(f"receiving the answer to {cmd.name} failed: "
                             f"{e.strerror or e}") from None
        self.stats.bytes_received += n

    def _recv_reply(self, cmd: Cmd, size: int | None) -> bytes:
        (n,) = _U64.unpack(self._recv_exact(8, cmd))
        if size is not None and n != size:
            raise self._fail(f"answered {cmd.name} with {n} bytes, expected {size}")
        return self._recv_exact(n, cmd)

    def request(self, cmd: Cmd, payload=b"", reply_size: int | None = -1,
                flush: bool = True) -> bytes | None:
        """Send one command; reply_size: -1 = the command has no answer (returns None), None =
        any length, else the exact length expected. flush:
        False lets a command without an answer wait in the queue for the next write."""
        with self._lock:
            self._check_usable(cmd)
            self._flush_frees()
            if reply_size == -1:
                self._send(cmd, payload, flush)
                return None
            self._send(cmd, payload)
            self.stats.round_trips += 1
            return self._recv_reply(cmd, reply_size)

    def send_prepared(self, req: Prepared) -> None:
        """Queue prepared requests without answers (as request(..., flush=False) does for one):
        they go out with the next command that must leave now."""
        with self._lock:
            q = self._enqueue(req)
            if len(q) > QUEUE_MAX_BYTES:
                self._write(q)

    def request_into(self, req: Prepared, views: list[memoryview]) -> None:
        """Send prepared requests that each have an answer (GET_TENSOR), with the queue, in one
        write; then receive answer i straight into views[i], whose size it must have."""
        with self._lock:
            self._write(self._enqueue(req))
            self.stats.round_trips += len(views)
            for cmd, view in zip(req.cmds, views):
                (n,) = _U64.unpack(self._recv_exact(8, cmd))
                if n != view.nbytes:
                    raise self._fail(f"answered {cmd.name} with {n} bytes, expected "
                                     f"{view.nbytes}")
                self._recv_into(view, cmd)

    def _enqueue(self, req: Prepared) -> bytearray:
        """Append prepared requests to the queue (written first if they would overflow it);
        the caller holds the lock. Returns the queue."""
        self._check_usable(req.cmds[0])
        self._flush_frees()
        q = self._queue
        if q and len(q) + len(req.blob) > QUEUE_MAX_BYTES:
            self._write(q)
        q += req.blob
        self._queued.extend(req.names)
        req.count_into(self.stats)
        return q

    def _hello(self) -> tuple[int, int, int]:
        self._send(Cmd.HELLO, bytes(HELLO_CAPS_BYTES))
        try:
            rsp = self._recv_reply(Cmd.HELLO, 4 + HELLO_CAPS_BYTES)
        except RpcError as e:
            raise RpcError(f"{e}; a server of protocol {_ver(PROTO_VERSION)} (llama.cpp 0c1e570)"
                           f" answers HELLO with 28 bytes: an older or newer rpc-server?"
                           ) from None
        ver = (rsp[0], rsp[1], rsp[2])
        if ver[0] != PROTO_VERSION[0] or ver[1] > PROTO_VERSION[1]:
            raise self._fail(f"speaks RPC protocol {_ver(ver)}; this client speaks "
                             f"{_ver(PROTO_VERSION)} (major must match, server minor <= "
                             f"{PROTO_VERSION[1]}): use an rpc-server built from llama.cpp "
                             f"0c1e570 (llama-cpp-python 0.3.36)")
        if ver[2] != PROTO_VERSION[2]:
            # the patch number follows GGML_OP_COUNT: our op numbers would mean other ops
            raise self._fail(f"speaks RPC protocol {_ver(ver)}, whose op numbering differs "
                             f"from {_ver(PROTO_VERSION)} (the patch number follows ggml's op "
                             f"count); use an rpc-server built from llama.cpp 0c1e570")
        return ver

    def alive(self) -> bool:
        """Whether the connection still works as far as can be told without sending anything:
        not failed, and the server has not closed it (a killed rpc-server's socket reads as
        closed at once; one that is frozen is found by the next command's timeout). Never
        blocks; a closed connection is marked broken."""
        if self.broken is not None:
            return False
        try:
            # a socket with a timeout waits for data inside recv, even with MSG_DONTWAIT: ask
            # select first (readable: closed, failed or an answer is there; recv returns at once)
            if not select.select([self._sock], [], [], 0)[0]:
                return True              # open, nothing to read: the usual state
            peek = self._sock.recv(1, socket.MSG_PEEK)
        except (ValueError, OSError) as e:      # ValueError: the socket was closed here
            self.broken = f"the connection failed: {e.strerror or e}"
            return False
        if peek == b"":
            self.broken = "the server closed the connection"
            return False
        return True                      # an answer on its way (a command in flight)

    # ---- buffers freed by the garbage collector ----------------------------------------------
    def queue_free(self, remote_ptr: int) -> None:
        """Called from a finalizer: FREE_BUFFER goes out before the next command (never from
        inside another command's send/receive)."""
        self._pending_frees.append(remote_ptr)

    def _flush_frees(self) -> None:
        if not self._pending_frees:
            return
        while self._pending_frees:          # pop: a finalizer may append meanwhile
            self._send(Cmd.FREE_BUFFER, _U64.pack(self._pending_frees.pop()), flush=False)
        if self.on_free is not None:
            self.on_free()

    def close(self) -> None:
        with self._lock:
            if self.broken is None:
                try:
                    self._flush_frees()
                    self.flush()
                except RpcError:
                    pass
            self.broken = self.broken or "closed by the client"
            try:
                self._sock.close()
            except OSError:
                pass

    # ---- commands with fixed layouts ---------------------------------------------------------
    def device_count(self) -> int:
        return struct.unpack("<I", self.request(Cmd.DEVICE_COUNT, b"", 4))[0]

    def get_alignment(self, device: int) -> int:
        return _U64.unpack(self.request(Cmd.GET_ALIGNMENT, struct.pack("<I", device), 8))[0]

    def get_max_size(self, device: int) -> int:
        return _U64.unpack(self.request(Cmd.GET_MAX_SIZE, struct.pack("<I", device), 8))[0]

    def get_device_memory(self, device: int) -> tuple[int, int]:
        return struct.unpack("<QQ", self.request(Cmd.GET_DEVICE_MEMORY,
                                                 struct.pack("<I", device), 16))

    def alloc_buffer(self, device: int, n_bytes: int) -> tuple[int, int]:
        """(remote_ptr, remote_size); remote_ptr 0 = the server could not allocate."""
        return struct.unpack("<QQ", self.request(Cmd.ALLOC_BUFFER,
                                                 struct.pack("<IQ", device, n_bytes), 16))

    def buffer_get_base(self, remote_ptr: int) -> int:
        return _U64.unpack(self.request(Cmd.BUFFER_GET_BASE, _U64.pack(remote_ptr), 8))[0]

    def buffer_clear(self, remote_ptr: int, value: int) -> None:
        self.request(Cmd.BUFFER_CLEAR, struct.pack("<QB", remote_ptr, value & 0xFF), flush=False)

    def graph_recompute(self, device: int) -> None:
        """Written at once, with the queued inputs before it: the server starts computing."""
        self.request(Cmd.GRAPH_RECOMPUTE, struct.pack("<I", device))


def _ver(v) -> str:
    return ".".join(str(x) for x in v)
