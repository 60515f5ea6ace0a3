"""A sequence's state saved and restored (llama-cpp-python's `Llama.save_state` /
`load_state`), and prompt caches of such states (its `LlamaRAMCache` / `LlamaDiskCache`).

A `LlamaState` holds what a sequence holds: its tokens, the K and V rows of its cells (per
layer, in position order, the cache's own bytes: f16 / q8_0 rows as they are) for every cell
space, and for hybrid models the recurrent state rows. It restores into the same model (the
architecture, sizes, vocabulary and KV types are checked: a `StateError` names what differs),
into any sequence, with any n_ctx that has room.

A prompt cache maps token sequences to states; `LLM.set_cache(cache)` makes create_completion
and create_chat_completion look up the state with the longest common prefix with a prompt and
restore it when it covers more than the sequence already holds, and store the sequence's state
after each completion (llama-cpp-python's use). Both caches are bounded by `capacity_bytes`
and drop the least recently used states first. The disk cache keeps one .npz file per state
(numpy arrays only: nothing executable is read back) and an index rebuilt from the files.
"""

from __future__ import annotations

import hashlib
import json
import os
import zipfile
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from pyggml.backend.base import tensor_get_into, tensor_set
from pyggml.errors import ModelError
from pyggml.llm import recurrent as rs
from pyggml.llm.lora import tag_of

FORMAT = 1


class StateError(ModelError):
    """A saved state that does not fit this model (or a damaged state file)."""


@dataclass
class LlamaState:
    """One sequence's saved state (see the module docstring).

    model: what it was saved from ({arch, n_layer, n_embd, n_vocab, types_k, types_v});
    tokens: int32 [n_tokens]; spaces: {space: (positions int64 [n], {layer: (K rows uint8
    [n, row bytes], V rows)})}; recurrent: per state tensor one float32 row (hybrids)."""
    model: dict
    tokens: np.ndarray
    spaces: dict = field(repr=False)
    recurrent: list | None = field(default=None, repr=False)

    # llama-cpp-python's names
    @property
    def input_ids(self) -> np.ndarray:
        return self.tokens

    @property
    def n_tokens(self) -> int:
        return int(self.tokens.size)

    @property
    def llama_state_size(self) -> int:
        return self.n_bytes

    @property
    def n_bytes(self) -> int:
        n = self.tokens.nbytes
        for pos, rows in self.spaces.values():
            n += pos.nbytes + sum(k.nbytes + v.nbytes for k, v in rows.values())
        return n + sum(r.nbytes for r in self.recurrent or ())


def model_identity(llm) -> dict:
    hp, kv = llm.hparams, llm.kv
    return {"arch": hp.arch, "n_layer": int(hp.n_layer), "n_embd": int(hp.n_embd),
            "n_vocab": int(hp.n_vocab), "types_k": [t.name for t in kv.types_k],
            "types_v": [t.name for t in kv.types_v]}


def _runs(cells: np.ndarray):
    """(start index in cells, first cell, count) of each run of consecutive cell indices."""
    if cells.size == 0:
        return
    breaks = np.flatnonzero(np.diff(cells) != 1) + 1
    starts = np.concatenate(([0], breaks))
    ends = np.concatenate((breaks, [cells.size]))
    for a, b in zip(starts, ends):
        yield int(a), int(cells[a]), int(b - a)


def _read_rows(t, cells: np.ndarray) -> np.ndarray:
    row = int(t.nb[1])
    out = np.empty((cells.size, row), np.uint8)
    for a, c0, n in _runs(cells):
        tensor_get_into(t, out[a:a + n], c0 * row)
    return out


def _write_rows(t, cells: np.ndarray, rows: np.ndarray) -> None:
    row = int(t.nb[1])
    for a, c0, n in _runs(cells):
        tensor_set(t, np.ascontiguousarray(rows[a:a + n]), c0 * row)


def save_state(llm, seq_id: int = 0) -> LlamaState:
    """The state of sequence seq_id (its tokens, cells and recurrent rows)."""
    ctx, kv = llm.context, llm.kv
    with ctx.lock:
        ctx.check_open()
        seq_id = ctx.check_seq(seq_id)
        bit = np.uint64(1) << np.uint64(seq_id)
        spaces = {}
        for name, sp in kv.spaces.items():
            cells = np.flatnonzero((sp.seqs & bit) != 0)
            order = np.argsort(sp.pos[cells], kind="stable")
            cells = cells[order]
            # a layer reading another layer's cache (Gemma 4's shared KV) has no rows of its own
            rows = {il: (_read_rows(kv.k[il], cells), _read_rows(kv.v[il], cells))
                    for il in range(len(kv.k)) if kv.layer_space[il] == name
                    and il not in getattr(kv, "shared_from", ())}
            spaces[name] = (sp.pos[cells].copy(), rows)
        recurrent = rs.read_seq(kv, seq_id) if kv.rs_layers else None
        # the LoRA set the cells were computed under (pyggml/llm/lora.py; not part of the
        # identity: a state loads under any set, and is reused only under its own)
        model = dict(model_identity(llm), lora=ctx.seq_lora_tag(seq_id))
        return LlamaState(model,
                          np.asarray(ctx.seq_tokens(seq_id), np.int32), spaces, recurrent)


def load_state(llm, state: LlamaState, seq_id: int = 0) -> None:
    """Make sequence seq_id hold `state` (what it held goes; its generations end). StateError
    when the state was saved from another model or does not fit this cache."""
    if not isinstance(state, LlamaState):
        raise StateError(f"load_state takes a LlamaState (from save_state), got "
                         f"{type(state).__name__}")
    mine = model_identity(llm)
    diff = [k for k in mine if state.model.get(k) != mine[k]]
    if diff:
        shown = ", ".join(f"{k} {state.model.get(k)!r} here {mine[k]!r}" for k in diff[:2])
        raise StateError(f"this state was saved from another model: {', '.join(diff)} differ "
                         f"({shown})")
    ctx, kv = llm.context, llm.kv
    with ctx.lock:
        ctx.check_open()
        seq_id = ctx.check_seq(seq_id)
        if set(state.spaces) != set(kv.spaces):
            raise StateError(f"this state has the cell spaces {sorted(state.spaces)} but this "
                             f"cache has {sorted(kv.spaces)} (another swa_full setting?)")
        ctx.seq_reset(seq_id)
        for name, (pos, _) in state.spaces.items():
            free = int(np.count_nonzero(kv.spaces[name].pos < 0))
            if pos.size > free:
                raise StateError(f"the state holds {pos.size} cells ({name}) but only {free} "
                                 f"are free (n_ctx={llm.n_ctx})")
        placed = []
        try:
            for name, (pos, rows) in state.spaces.items():
                sp = kv.spaces[name]
                sids = np.full(pos.size, seq_id, np.int64)
                cells = (sp.find_slot_ordered(llm.n_ctx, sids) if name == "full"
                         else sp.find_slot(pos.size, llm.n_ctx))
                sp.apply(cells, pos, sids)
                placed.append(name)
                for il, (k, v) in rows.items():
                    for t, r in ((kv.k[il], k), (kv.v[il], v)):
                        if r.shape != (pos.size, int(t.nb[1])):
                            raise StateError(f"state rows of layer {il} have shape {r.shape}, "
                                             f"expected {(pos.size, int(t.nb[1]))}")
                        _write_rows(t, cells, r)
            if kv.rs_layers:
                if state.recurrent is None or len(state.recurrent) != len(kv.rs_tensors()):
                    raise StateError("the state lacks this hybrid model's recurrent rows")
                rs.write_seq(kv, seq_id, state.recurrent)
        except BaseException:
            ctx.seq_reset(seq_id)
            raise
        tag = state.model.get("lora", ())
        ctx.seq_adopt(seq_id, state.tokens.tolist(), None if tag is None else tag_of(tag))


# ---- files -------------------------------------------------------------------------------------
def write_state(state: LlamaState, path) -> int:
    """Save a state as a .npz of plain arrays; returns its size in bytes."""
    arrays = {"tokens": state.tokens,
              "meta": np.frombuffer(json.dumps({"format": FORMAT, "model": state.model,
                                                "layers": {n: sorted(r) for n, (_, r) in
                                                           state.spaces.items()},
                                                "recurrent": None if state.recurrent is None
                                                else len(state.recurrent)}).encode(), np.uint8)}
    for name, (pos, rows) in state.spaces.items():
        arrays[f"pos.{name}"] = pos
        for il, (k, v) in rows.items():
            arrays[f"k.{name}.{il}"], arrays[f"v.{name}.{il}"] = k, v
    for i, r in enumerate(state.recurrent or ()):
        arrays[f"rs.{i}"] = r
    tmp = Path(str(path) + ".tmp")
    with open(tmp, "wb") as f:
        np.savez(f, **arrays)
    os.replace(tmp, path)
    return Path(path).stat().st_size


def read_state(path) -> LlamaState:
    """A state written by write_state; StateError for anything else."""
    try:
        with np.load(path, allow_pickle=False) as z:
            meta = json.loads(bytes(z["meta"]).decode())
            if meta.get("format") != FORMAT:
                raise StateError(f"{path}: state format {meta.get('format')!r}, expected "
                                 f"{FORMAT}")
            spaces = {}
            for name, layers in meta["layers"].items():
                spaces[name] = (z[f"pos.{name}"].astype(np.int64),
                                {int(il): (z[f"k.{name}.{il}"], z[f"v.{name}.{il}"])
                                 for il in layers})
            rec = None if meta["recurrent"] is None else \
                [z[f"rs.{i}"] for i in range(int(meta["recurrent"]))]
            return LlamaState(meta["model"], z["tokens"].astype(np.int32), spaces, rec)
    except StateError:
        raise
    except (OSError, ValueError, KeyError, TypeError, EOFError, zipfile.BadZipFile) as e:
        raise StateError(f"{path}: not a pyggml state file ({type(e).__name__}: "
                         f"{str(e)[:120]})") from None


# ---- prompt caches -----------------------------------------------------------------------------
def common_prefix(a, b) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def longest_prefix_key(keys, tokens) -> tuple | None:
    """Of the token tuples `keys` (a cache's, oldest use first), the one sharing the longest
    common prefix with `tokens` (the first such on a tie), None when none shares a token."""
    best, n_best = None, 0
    for k in keys:
        n = common_prefix(k, tokens)
        if n > n_best:
            best, n_best = k, n
    return best


class LlamaRAMCache:
    """States in memory, at most capacity_bytes together (least recently used dropped)."""

    def __init__(self, capacity_bytes: int = 2 << 30):
        self.capacity_bytes = int(capacity_bytes)
        self._states: OrderedDict[tuple, LlamaState] = OrderedDict()

    @property
    def cache_size(self) -> int:
        return sum(s.n_bytes for s in self._states.values())

    def _longest(self, key) -> tuple | None:
        return longest_prefix_key(self._states, key)

    def __getitem__(self, key) -> LlamaState:
        k = self._longest(tuple(key))
        if k is None:
            raise KeyError("no state shares a prefix with these tokens")
        self._states.move_to_end(k)
        return self._states[k]

    def __contains__(self, key) -> bool:
        return self._longest(tuple(key)) is not None

    def __setitem__(self, key, state: LlamaState) -> None:
        key = tuple(key)
        self._states.pop(key, None)
        self._states[key] = state
        while self._states and self.cache_size > self.capacity_bytes:
            self._states.popitem(last=False)


class LlamaDiskCache:
    """States in files under cache_dir, at most capacity_bytes together (least recently used
    dropped). Other files there are left alone."""

    def __init__(self, cache_dir: str | os.PathLike = ".cache/llama_cache",
                 capacity_bytes: int = 10 << 30):
        self.cache_dir = Path(cache_dir)
        self.capacity_bytes = int(capacity_bytes)
        self.cache_dir.mkdir(parents=True, exist_ok=True)
        self._index: OrderedDict[tuple, Path] = OrderedDict()      # oldest use first
        files = sorted(self.cache_dir.glob("state-*.npz"), key=lambda p: p.stat().st_mtime)
        for p in files:
            try:
                with np.load(p, allow_pickle=False) as z:
                    self._index[tuple(int(t) for t in z["tokens"])] = p
            except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile):
                continue                    # a damaged file is no entry (and never read)

    @property
    def cache_size(self) -> int:
        return sum(p.stat().st_size for p in self._index.values() if p.exists())

    def _longest(self, key) -> tuple | None:
        return longest_prefix_key(self._index, key)

    def __getitem__(self, key) -> LlamaState:
        k = self._longest(tuple(key))
        if k is None:
            raise KeyError("no state shares a prefix with these tokens")
        p = self._index.pop(k)
        self._index[k] = p
        os.utime(p)
        return read_state(p)

    def __contains__(self, key) -> bool:
        return self._longest(tuple(key)) is not None

    def __setitem__(self, key, state: LlamaState) -> None:
        key = tuple(int(t) for t in key)
        name = hashlib.sha256(np.asarray(key, np.int64).tobytes()).hexdigest()[:32]
        path = self.cache_dir / f"state-{name}.npz"
        write_state(state, path)
        self._index.pop(key, None)
        self._index[key] = path
        while len(self._index) > 1 and self.cache_size > self.capacity_bytes:
            _, old = self._index.popitem(last=False)
            old.unlink(missing_ok=True)
        if self.cache_size > self.capacity_bytes:       # one state larger than the whole cache
            _, old = self._index.popitem(last=False)
            old.unlink(missing_ok=True)
