"""The KV cache: per layer one K and one V tensor over a space of cells, plus each cell's position
and sequence set (llama.cpp's unified cache).

Two cell spaces: "full" (n_ctx cells) for global-attention layers, and, when the model has
sliding-window layers, "swa" with room for the window only: before a ubatch is placed, cells that
no query of it or of any later ubatch can see any more (position at least `window` behind the
sequence's first new token) are freed. With `swa_full=True` (or when the window space would not
be smaller) the sliding-window layers use the full space (masking alone hides the rest). The full
space always exists and bounds the context (n_ctx), even if no layer reads it.

Placement never depends on the other sequences (greedy output must not: the attention adds up a
row's visible keys in cell-index order, so the order of a sequence's cells is part of its
result). The full space puts each sequence's new cells after the cells it holds (position
order). The window space gives each sequence a ring of its own of window + n_ubatch cells, and
position p of sequence s the cell s·ring + p mod ring: the order of the cells a query sees
depends on its position alone — not on who else is served, nor on what the sequence held before
(a trimmed prefix cache). That costs (n_seq_max - 1)·n_ubatch cells more than llama.cpp's
shared window space (window·n_seq_max + n_ubatch); with one sequence the sizes are equal.

Layout per layer: K and V are [D·Hkv, n_cells] (one row of all KV heads per cell), written by
set_rows at the ubatch's cell indices and read through 3-D views [D, n_kv, Hkv].
"""

from __future__ import annotations

import ctypes

import numpy as np

from pyggml import _native
from pyggml.backend.base import BufferUsage, alloc_tensors, tensor_set
from pyggml.backend.planning import PlanningBuffer
from pyggml.context import Context
from pyggml.errors import (ContextOverflowError, InsufficientMemoryError, InvalidArgumentError,
                           ModelError)
from pyggml.llm import recurrent as rs
from pyggml.types import GGMLType, as_type

KV_PAD = 256          # n_kv (cells the attention reads) is padded to this: graphs get reused
#: the cache types llama.cpp offers (-ctk/-ctv): float, and the block types whose rows ggml's
#: quantizers write one at a time (set_rows)
KV_TYPES = (GGMLType.F16, GGMLType.F32, GGMLType.BF16, GGMLType.Q8_0, GGMLType.Q4_0,
            GGMLType.Q4_1, GGMLType.Q5_0, GGMLType.Q5_1, GGMLType.IQ4_NL)

FULL, SWA = "full", "swa"

_P, _I64 = ctypes.c_void_p, ctypes.c_int64
_native.declare("pg_kv_mask", ctypes.c_int32, [_P, _P, _I64, _P, _P, _I64, _I64, _P, _I64])


def _bits(seq_ids: np.ndarray) -> np.ndarray:
    return np.left_shift(np.uint64(1), seq_ids.astype(np.uint64))


def kv_type_choices() -> list[str]:
    """The names -ctk/-ctv and type_k/type_v take."""
    return [t.name.lower() for t in KV_TYPES]


def is_quantized(t) -> bool:
    """A block type (not f32/f16/bf16)."""
    return as_type(t) not in (GGMLType.F16, GGMLType.F32, GGMLType.BF16)


#: llama.cpp rotates quantized K and V (its attn_rot_k / attn_rot_v; LLAMA_ATTN_ROT_DISABLE
#: turns it off there): False here compares without it (tools/kv_perplexity.py)
ROTATE_QUANTIZED = True


def rotation_sizes(type_k, head_k: int, type_v, head_v: int) -> tuple[int, int]:
    """The orders (0: none) of the Hadamard rotations of a layer's K and V, as llama.cpp's KV
    cache chooses them: a quantized K with a head size that is a multiple of 64 is rotated in
    blocks of the largest power of two (>= 64) that divides the head size, q with it; a
    quantized V likewise in blocks of 64, and the attention output back. An orthonormal
    rotation leaves q·k and the weighted sum of v unchanged, but spreads outliers over the
    block, so a 4-bit block scale loses less."""
    if not ROTATE_QUANTIZED:
        return 0, 0
    nk = 0
    if is_quantized(type_k) and head_k % 64 == 0:
        nk = 64
        while head_k % (nk * 2) == 0:
            nk *= 2
    nv = 64 if is_quantized(type_v) and head_v % 64 == 0 else 0
    return nk, nv


def hadamard(n: int) -> np.ndarray:
    """The orthonormal Walsh-Hadamard matrix of order n (a power of two; Sylvester's order:
    H[i, j] = (-1)^popcount(i & j) / sqrt(n)), float32. Symmetric, its own inverse."""
    h = np.ones((1, 1), np.float32) / np.float32(np.sqrt(n))
    while h.shape[0] < n:
        h = np.block([[h, h], [h, -h]])
    return np.ascontiguousarray(h, np.float32)


def swa_ring_cells(window: int, n_ubatch: int) -> int:
    """Cells of one sequence's ring in the sliding-window space: the window's cells still
    visible to a ubatch's first token plus the ubatch's own (a cell is reused only after the
    window has dropped its position)."""
    return window + n_ubatch


def swa_space_cells(window: int, n_seq_max: int, n_ubatch: int, n_ctx: int) -> int:
    """Cells of the sliding-window space: a ring per sequence, padded to KV_PAD; n_ctx (no
    separate space: the layers use the full one) when that is not smaller."""
    return min(n_ctx, -(-(swa_ring_cells(window, n_ubatch) * n_seq_max) // KV_PAD) * KV_PAD)


class CellSpace:
    """n_cells cells: position (-1 = empty) and sequence bit set of each."""

    def __init__(self, name: str, n_cells: int):
        self.name = name
        self.n_cells = n_cells
        self.pos = np.full(n_cells, -1, dtype=np.int64)
        self.seqs = np.zeros(n_cells, dtype=np.uint64)
        # both arrays are only ever changed in place (restore() included): their addresses hold
        self._cells_ptrs = (self.pos.ctypes.data, self.seqs.ctypes.data)

    def n_used(self) -> int:
        return int(np.count_nonzero(self.pos >= 0))

    def find_slot(self, n_tokens: int, n_ctx: int) -> np.ndarray:
        """Indices of n_tokens free cells (lowest first); ModelError when there are too few."""
        free = np.flatnonzero(self.pos < 0)
        if free.size < n_tokens:
            raise ContextOverflowError(f"context overflow: {n_tokens} new tokens but only "
                                       f"{free.size} of {self.n_cells} KV cells ({self.name}) are "
                                       f"free (n_ctx={n_ctx}); start a new sequence, remove old "
                                       f"tokens (seq_rm) or use a larger n_ctx")
        return free[:n_tokens]

    def find_slot_ordered(self, n_ctx: int, seq_ids: np.ndarray) -> np.ndarray:
        """find_slot, with each sequence's new cells after every cell it already holds (and in
        the ubatch's order among themselves), so that a sequence's cells are in position order:
        the attention accumulates over cells in index order, and a token placed in a hole
        before its sequence's older cells (left by another sequence, or by a trimmed prefix
        cache) changes the rounding, and so a greedy reply by who else was served. Where no
        such cells are free, the lowest free ones (as find_slot)."""
        n = len(seq_ids)
        free = self.pos < 0
        if int(np.count_nonzero(free)) < n:
            return self.find_slot(n, n_ctx)
        out = np.empty(n, np.int64)
        if n == 1:                      # a decode step: one sequence, no bounds to find
            starts, ends = (0,), (1,)
        else:           # the ubatch's tokens come grouped by sequence (Context.decode does so)
            bounds = np.flatnonzero(np.diff(seq_ids)) + 1
            starts = np.concatenate(([0], bounds))
            ends = np.concatenate((bounds, [n]))
        for a, b in zip(starts, ends):
            bit = np.uint64(1) << np.uint64(int(seq_ids[a]))
            held = np.flatnonzero(self.seqs & bit)
            floor = int(held[-1]) + 1 if held.size else 0
            cand = np.flatnonzero(free[floor:])[:b - a] + floor
            if cand.size < b - a:
                cand = np.flatnonzero(free)[:b - a]
            out[a:b] = cand
            free[cand] = False
        return out

    def find_slot_ring(self, n_ctx: int, pos: np.ndarray, seq_ids: np.ndarray,
                       ring: int) -> np.ndarray:
        """Cells for new tokens in per-sequence rings: seq_id·ring + pos mod ring (see the
        module docstring). A token whose ring cell is taken (a cell shared by seq_cp and still
        held by another sequence, or more tokens of a sequence than its ring holds) gets the
        lowest free cell instead: correct, only not independent of the others."""
        cells = np.asarray(seq_ids, np.int64) * ring + np.asarray(pos, np.int64) % ring
        ok = cells < self.n_cells
        ok[ok] = self.pos[cells[ok]] < 0
        if ok.all() and np.unique(cells).size == cells.size:
            return cells
        free = self.pos < 0
        for i in np.flatnonzero(ok):            # the first token for a ring cell keeps it
            if free[cells[i]]:
                free[cells[i]] = False
            else:
                ok[i] = False
        bad = np.flatnonzero(~ok)
        spare = np.flatnonzero(free)
        if spare.size < bad.size:
            raise ContextOverflowError(f"context overflow: {len(pos)} new tokens but only "
                                       f"{len(pos) - bad.size + spare.size} of {self.n_cells} KV "
                                       f"cells ({self.name}) are free for them (n_ctx={n_ctx})")
        cells[bad] = spare[:bad.size]
        return cells

    def apply(self, cells: np.ndarray, pos: np.ndarray, seq_ids: np.ndarray) -> None:
        self.pos[cells] = pos
        self.seqs[cells] = _bits(seq_ids)

    def forget_outside_window(self, pos: np.ndarray, seq_ids: np.ndarray, window: int) -> None:
        """Free what the new tokens (and any later ones) cannot see: for each sequence, cells at
        least `window` positions behind its first new token."""
        one = len(seq_ids) == 1         # a decode step: no unique() and no mask per sequence
        for sid in (seq_ids if one else np.unique(seq_ids)):
            first = int(pos[0] if one else pos[seq_ids == sid].min())
            bit = np.uint64(1) << np.uint64(sid)
            sel = ((self.seqs & bit) != 0) & (self.pos <= first - window)
            self.seqs[sel] &= ~bit
        self.pos[self.seqs == 0] = -1

    def n_kv(self) -> int:
        """Cells the attention reads: up to the last used one, padded to KV_PAD."""
        used = np.flatnonzero(self.pos >= 0)
        last = int(used[-1]) + 1 if used.size else 1
        return min(self.n_cells, -(-last // KV_PAD) * KV_PAD)

    def mask_into(self, out: np.ndarray, pos: np.ndarray, seq_ids: np.ndarray,
                  window: int = 0) -> None:
        """The attention mask of new tokens, written into `out`, a C-contiguous float16
        (n_tokens, n_kv) array (a graph's mask input), in one native pass (pg_kv_mask): 0 where
        token t may attend to cell j (same sequence, cell position <= token position, and
        within `window` if > 0), -inf elsewhere."""
        n_kv = out.shape[1]
        if (out.dtype != np.float16 or out.ndim != 2 or not out.flags.c_contiguous
                or out.shape[0] != len(pos) or not 0 <= n_kv <= self.n_cells or window < 0):
            raise InvalidArgumentError(
                f"KV mask ({self.name}): out must be C-contiguous float16 ({len(pos)}, n_kv <= "
                f"{self.n_cells}) and window >= 0, got {out.dtype} {out.shape}, window {window}")
        pos = np.ascontiguousarray(pos, np.int32)
        seq_ids = np.ascontiguousarray(seq_ids, np.int64)
        st = _native.fn("pg_kv_mask")(self._cells_ptrs[0], self._cells_ptrs[1], n_kv,
                                      pos.ctypes.data, seq_ids.ctypes.data, len(pos),
                                      int(window), out.ctypes.data, n_kv)
        if st != _native.PG_OK:     # the rest was checked above: a sequence id out of range
            raise InvalidArgumentError(f"KV mask ({self.name}): sequence ids must be in [0, 63], "
                                       f"got {sorted(set(seq_ids.tolist()))[:8]}")

    def seq_rm(self, seq_id: int, p0: int = 0, p1: int | None = None) -> None:
        sel = (self.pos >= p0) & ((self.pos < p1) if p1 is not None else True)
        if seq_id < 0:
            self.seqs[sel] = 0
        else:
            self.seqs[sel] &= ~np.uint64(1 << seq_id)
        self.pos[self.seqs == 0] = -1

    def seq_cp(self, src: int, dst: int, p0: int = 0, p1: int | None = None) -> None:
        sel = ((self.seqs & np.uint64(1 << src)) != 0) & (self.pos >= p0)
        if p1 is not None:
            sel &= self.pos < p1
        self.seqs[sel] |= np.uint64(1 << dst)


class KVCache:
    """Cells × n_layer layers (see the module docstring). `buffer_types`: per layer, the buffer
    type that holds its K and V (host memory by default); one buffer per distinct buffer type.
    type_k / type_v: one type, or a list with one per layer (`types_k` / `types_v` keep the
    per-layer types; `type_k` / `type_v` are layer 0's)."""

    def __init__(self, hp, n_ctx: int, type_k="f16", type_v="f16", n_seq_max: int = 1,
                 buffer_types=None, n_ubatch: int = 512, swa_full: bool = False):
        per_layer = {}
        for what, t in (("type_k", type_k), ("type_v", type_v)):
            ts = list(t) if isinstance(t, (list, tuple)) else [t] * hp.n_layer
            if len(ts) != hp.n_layer:
                raise ModelError(f"KV cache {what}: {len(ts)} types for {hp.n_layer} layers")
            ts = [as_type(x) for x in ts]
            for bad in (x for x in ts if x not in KV_TYPES):
                raise ModelError(f"KV cache {what} must be one of "
                                 f"{', '.join(k.name.lower() for k in KV_TYPES)}, got {bad.name}")
            per_layer[what] = ts
        self.types_k, self.types_v = per_layer["type_k"], per_layer["type_v"]
        self.type_k, self.type_v = self.types_k[0], self.types_v[0]
        for what, v, lo, hi in (("n_seq_max", n_seq_max, 1, 64), ("n_ctx", n_ctx, 1, None),
                                ("n_ubatch", n_ubatch, 1, None)):
            if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < lo or \
                    (hi is not None and v > hi):
                raise ModelError(f"KV cache {what} must be an integer in {lo}.."
                                 f"{hi if hi is not None else ''}, got {v!r}")
        if buffer_types is not None and len(buffer_types) != hp.n_layer:
            raise ModelError(f"KV cache: {len(buffer_types)} buffer types for {hp.n_layer} "
                             f"layers")
        self.n_ctx = n_ctx
        self.n_seq_max = n_seq_max
        self.arch = hp.arch
        self.window = hp.sliding_window
        swa_layers = [hp.layer_is_swa(il) for il in range(hp.n_layer)]
        self.swa_ring = swa_ring_cells(self.window, n_ubatch)
        n_swa = swa_space_cells(self.window, n_seq_max, n_ubatch, n_ctx)
        n_cells = {FULL: n_ctx}
        if any(swa_layers) and not swa_full and n_swa < n_ctx:
            n_cells[SWA] = n_swa
        self.layer_space = [SWA if sw and SWA in n_cells else FULL for sw in swa_layers]
        self.k, self.v = [], []
        self.shared_from: dict[int, int] = {}    # layer → the earlier layer whose cache it reads
        ctx = Context(no_alloc=True, name="kv")
        # recurrent layers hold their state in their K/V slots (pyggml/llm/recurrent.py)
        self.rs_layers = [il for il in range(hp.n_layer) if rs.layer_is_recurrent(hp, il)]
        for il in range(hp.n_layer):
            if il in self.rs_layers:
                self.layer_space[il] = rs.RS
                for lst, t in zip((self.k, self.v), rs.new_state_tensors(ctx, hp, il, n_seq_max)):
                    lst.append(t)
                continue
            src = hp.kv_layer(il)
            if src != il:
                # a layer sharing an earlier layer's cache (Gemma 4): the same tensors, no bytes
                if not 0 <= src < il or self.layer_space[src] != self.layer_space[il]:
                    raise ModelError(f"{hp.arch}: layer {il} cannot share the KV cache of layer "
                                     f"{src} (an earlier layer of the same attention kind)")
                self.shared_from[il] = src
                self.k.append(self.k[src])
                self.v.append(self.v[src])
                continue
            ne_k = hp.head_k(il) * hp.n_head_kv[il]
            ne_v = hp.head_v(il) * hp.n_head_kv[il]
            n = n_cells[self.layer_space[il]]
            self.k.append(ctx.new_tensor(self.types_k[il], [ne_k, n], name=f"cache_k_l{il}"))
            self.v.append(ctx.new_tensor(self.types_v[il], [ne_v, n], name=f"cache_v_l{il}"))
        self.n_bytes = sum(self.layer_bytes(il) for il in range(hp.n_layer))
        if buffer_types is None:
            from pyggml.backend.cpu import cpu_buffer_type
            buffer_types = [cpu_buffer_type()] * hp.n_layer
        self._check_host_memory(buffer_types, n_cells)
        self.spaces = {name: CellSpace(name, n) for name, n in n_cells.items()}
        groups: dict[int, tuple] = {}           # id(buft) -> (buft, [layers])
        for il, bt in enumerate(buffer_types):
            if il not in self.shared_from:
                groups.setdefault(id(bt), (bt, []))[1].append(il)
        self.buffers = []
        self.bytes_by_buffer_type: dict[str, int] = {}
        # llama.cpp's rotation of quantized K/V (see rotation_sizes): per layer the Hadamard
        # matrix its K (q, k) and V (v in, attention out) go through, None without one; one
        # matrix of each size per buffer, beside the cells
        self.rot_k: list = [None] * hp.n_layer
        self.rot_v: list = [None] * hp.n_layer
        for bt, layers in groups.values():
            rots = self._rotations(ctx, hp, layers)
            buf = alloc_tensors(bt, [t for il in layers for t in (self.k[il], self.v[il])]
                                + list(rots.values()), BufferUsage.ANY)
            if not isinstance(buf, PlanningBuffer):
                # cells not yet written are read too (up to n_kv, at probability 0, and 0 · NaN
                # is NaN): device memory (a GPU's, an rpc-server's) starts as anything, so it is
                # cleared as llama.cpp clears its cache; host memory comes zeroed (anonymous
                # pages) and clearing it would make every page of the cache resident at once
                if not getattr(bt, "is_host", False):
                    buf.clear(0)
                for n, t in rots.items():
                    tensor_set(t, hadamard(n))
            self.buffers.append(buf)
            self.bytes_by_buffer_type[bt.name] = (self.bytes_by_buffer_type.get(bt.name, 0)
                                                  + buf.n_bytes)

    def _rotations(self, ctx, hp, layers) -> dict:
        """The Hadamard matrices (F32 [n, n]) `layers` need, by size; sets rot_k / rot_v of
        those layers and of the layers that read their caches."""
        rots = {}
        for il in layers:
            if il in self.rs_layers:
                continue
            hkv = hp.n_head_kv[il]
            nk, nv = rotation_sizes(self.k[il].type, self.k[il].ne[0] // hkv,
                                    self.v[il].type, self.v[il].ne[0] // hkv)
            for n, attr in ((nk, "rot_k"), (nv, "rot_v")):
                if n:
                    if n not in rots:
                        rots[n] = ctx.new_tensor(GGMLType.F32, [n, n], name=f"kv_rot_{n}")
                    getattr(self, attr)[il] = rots[n]
        for il, src in getattr(self, "shared_from", {}).items():
            if src in layers:
                self.rot_k[il], self.rot_v[il] = self.rot_k[src], self.rot_v[src]
        return rots

    def _check_host_memory(self, buffer_types, n_cells: dict[str, int]) -> None:
        """Refuse, before allocating, a cache the system cannot hold: host K/V rows plus the
        cells' bookkeeping (position and sequence set, 16 bytes a cell), with the n_ctx that
        would fit in the message."""
        from pyggml.backend.cpu import GIB, available_host_memory
        # planning stand-ins (no is_host) allocate nothing: only real host buffers count
        host = [il for il, bt in enumerate(buffer_types) if getattr(bt, "is_host", False)]
        meta = 16 * sum(n_cells.values())
        need = meta + sum(self.layer_bytes(il) for il in host)
        avail = available_host_memory()
        if need <= avail:
            return
        # bytes per cell of the full space (grows with n_ctx); the window space is fixed
        per_cell = 16 + sum(self.layer_bytes(il) / self.n_ctx
                            for il in host if self.layer_space[il] == FULL)
        fixed = need - per_cell * self.n_ctx
        fit = int((avail - fixed) // per_cell) // KV_PAD * KV_PAD if avail > fixed else 0
        raise InsufficientMemoryError(
            f"the KV cache for n_ctx={self.n_ctx} needs {need / GIB:.2f} GiB of host memory "
            f"({self.n_bytes / GIB:.2f} GiB K/V, {self.type_k.name.lower()}/"
            f"{self.type_v.name.lower()}) but only {avail / GIB:.2f} GiB are available; "
            + (f"n_ctx={fit} would fit" if fit >= KV_PAD else "no context size fits")
            + (" (type_k/type_v q8_0 about halves an f16 cache)"
               if GGMLType.Q8_0 not in (self.type_k, self.type_v) else ""))

    def layer_bytes(self, il: int) -> int:
        """Bytes of layer il's own K and V (0 for a layer reading another layer's cache)."""
        if il in self.shared_from:
            return 0
        return self.k[il].nbytes() + self.v[il].nbytes()

    # ---- cells -------------------------------------------------------------------------------
    @property
    def pos(self) -> np.ndarray:
        """Positions of the full space's cells (-1: empty)."""
        return self.spaces[FULL].pos

    def n_used(self) -> int:
        """Tokens held (cells used in the full space, which bounds the context)."""
        return self.spaces[FULL].n_used()

    def place(self, pos: np.ndarray, seq_ids: np.ndarray,
              atomic: bool = True) -> dict[str, np.ndarray]:
        """Cells for a ubatch's tokens in every space (after freeing what the window hides in the
        sliding-window space), marked with their positions and sequences: {space: cell indices}.
        ModelError if a space lacks room (nothing is changed then). atomic=False: the caller
        holds a snapshot() and restores it on any error (the runtime does, per batch), so no
        second copy of the cells is taken per ubatch."""
        if not atomic:
            return self._place(pos, seq_ids)
        snap = self.snapshot()
        try:
            return self._place(pos, seq_ids)
        except BaseException:
            self.restore(snap)
            raise

    def _place(self, pos: np.ndarray, seq_ids: np.ndarray) -> dict[str, np.ndarray]:
        cells = {}
        for name, sp in self.spaces.items():
            if name == SWA:
                sp.forget_outside_window(pos, seq_ids, self.window)
            # the full space keeps each sequence's cells in position order; the sliding-window
            # space a ring per sequence, indexed by position (the module docstring)
            cells[name] = (sp.find_slot_ordered(self.n_ctx, seq_ids) if name == FULL
                           else sp.find_slot_ring(self.n_ctx, pos, seq_ids, self.swa_ring))
        for name, sp in self.spaces.items():
            sp.apply(cells[name], pos, seq_ids)
        return cells

    def n_kv(self) -> dict[str, int]:
        """{space: cells the attention reads} (padded to KV_PAD)."""
        return {name: sp.n_kv() for name, sp in self.spaces.items()}

    def mask_into(self, space: str, out: np.ndarray, pos: np.ndarray, seq_ids: np.ndarray,
                  window: int = 0) -> None:
        """mask() of a cell space written into a graph's mask input `out` (n_tokens, n_kv)."""
        self.spaces[space].mask_into(out, pos, seq_ids, window)

    def snapshot(self):
        return {n: (sp.pos.copy(), sp.seqs.copy()) for n, sp in self.spaces.items()}

    def restore(self, snap) -> None:
        for n, (p, q) in snap.items():
            self.spaces[n].pos[:], self.spaces[n].seqs[:] = p, q

    # ---- sequence operations (llama.cpp's memory API) -----------------------------------------
    def clear(self) -> None:
        for sp in self.spaces.values():
            sp.pos[:] = -1
            sp.seqs[:] = 0

    def _check_seq(self, what: str, seq_id, allow_all: bool = False) -> None:
        lo = -1 if allow_all else 0
        if isinstance(seq_id, bool) or not isinstance(seq_id, (int, np.integer)) or \
                not lo <= seq_id < self.n_seq_max:
            raise ModelError(f"{what} must be a sequence id in {lo}..{self.n_seq_max - 1} "
                             f"(n_seq_max={self.n_seq_max}{'; -1: all' if allow_all else ''}), "
                             f"got {seq_id!r}")

    def rs_tensors(self) -> list:
        """The recurrent layers' state tensors (conv, ssm per layer; empty without any)."""
        return [t for il in self.rs_layers for t in (self.k[il], self.v[il])]

    def _refuse_recurrent(self, what: str) -> None:
        if self.rs_layers:
            raise rs.RecurrentStateError(
                f"{self.arch}: {what} cannot be honoured by a model with recurrent layers "
                f"(their state folds in every earlier token); keep a prefix of the sequence "
                f"(Context.seq_keep_first) or reset it")

    def seq_rm(self, seq_id: int, p0: int = 0, p1: int | None = None) -> None:
        """Forget sequence seq_id's tokens with positions in [p0, p1) (p1 None: to the end);
        seq_id -1: all sequences. Recurrent models: only a whole sequence (p0 0) or a suffix
        whose state the caller restores (Context.seq_keep_first); a middle range is a
        RecurrentStateError."""
        self._check_seq("seq_rm: seq_id", seq_id, allow_all=True)
        if p1 is not None and p1 <= self.seq_pos_max(max(seq_id, 0)) and seq_id >= 0:
            self._refuse_recurrent(f"seq_rm(seq_id={seq_id}, p0={p0}, p1={p1}) (a middle range)")
        for sp in self.spaces.values():
            sp.seq_rm(seq_id, p0, p1)

    def seq_cp(self, src: int, dst: int, p0: int = 0, p1: int | None = None) -> None:
        """Make dst share src's cells with positions in [p0, p1) (no data is copied)."""
        self._refuse_recurrent(f"seq_cp(src={src}, dst={dst}) (sharing cells)")
        self._check_seq("seq_cp: src", src)
        self._check_seq("seq_cp: dst", dst)
        for sp in self.spaces.values():
            sp.seq_cp(src, dst, p0, p1)

    def seq_pos_max(self, seq_id: int) -> int:
        """Largest position of seq_id in the cache, -1 if it has none."""
        self._check_seq("seq_pos_max: seq_id", seq_id)
        sp = self.spaces[FULL]
        sel = (sp.seqs & np.uint64(1 << seq_id)) != 0
        return int(sp.pos[sel].max()) if sel.any() else -1

    def seq_pos_min(self, seq_id: int, space: str = FULL) -> int:
        """Smallest position of seq_id held in a cell space, -1 if it has none."""
        sp = self.spaces[space]
        sel = (sp.seqs & np.uint64(1 << seq_id)) != 0
        return int(sp.pos[sel].min()) if sel.any() else -1

    def can_keep_prefix(self, seq_id: int, n_keep: int) -> bool:
        """Whether positions [0, n_keep) of seq_id can stay while the rest is forgotten and
        evaluation goes on at position n_keep: the full space keeps every cell, but the
        sliding-window space dropped cells that fell out of the window of a later token; the
        token at n_keep needs positions from n_keep - window + 1 on, so the oldest cell the
        sequence still holds there must be no later than that."""
        if n_keep <= 0:
            return True
        if SWA not in self.spaces:
            return True
        lo = self.seq_pos_min(seq_id, SWA)
        return 0 <= lo <= max(0, n_keep - self.window + 1)

