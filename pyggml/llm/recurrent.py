"""Recurrent state of the hybrid models (LFM2's short convolutions, Qwen 3.5's gated DeltaNet):
per recurrent layer and per sequence a fixed-size state instead of KV cells, and the checkpoints
that let a prompt cache survive it.

Layout (llama.cpp's `cache_r_l` / `cache_s_l`): per recurrent layer il the KV cache holds, in the
layer's K/V slots (`kv.k[il]`, `kv.v[il]`, so the allocator, the offload rules and the memory
reports treat them as that layer's cache):
- conv  F32 [(K-1)·C, n_seq_max]: per sequence, the K-1 last inputs of each of the C channels of
  the causal convolution (kernel size K), oldest first;
- ssm   F32 [Dk·Dv·H, n_seq_max]: per sequence, the H delta-rule state matrices (Dv rows of Dk);
  a [1, n_seq_max] placeholder for layers without one (LFM2).
Row s is sequence s; inputs `inp_rs_ids` I32 [S] (the ubatch's sequences, distinct) and
`inp_rs_seq` I32 [T] (each token's index into them). The ops run a ubatch's tokens in order
(ssm_conv / gated_delta: token t continues sequence seq[t]) in one of two forms (`update`):
- in place, when the state tensors are in host memory (the CPU backend runs them): the op reads
  and updates the rows of the ubatch's sequences where they are, seq being each token's row
  (`token_rows`, rs_ids[rs_seq]); no state bytes are copied per token;
- copying, elsewhere (a device's memory): the rows of the ubatch's sequences are gathered
  (get_rows), the op writes the new rows after its outputs, and they are stored back
  (set_rows); every backend with the recurrent ops runs this form.
Both forms do the same arithmetic on each row: the same bits.

A recurrent state cannot be cut back to a shorter prefix the way KV cells are forgotten. So the
context keeps **checkpoints** (`Checkpoints`): host copies of a sequence's rows at a few token
counts (the end of each evaluated prompt, every `interval` tokens of a long one, before a
speculative verification), at most `max_per_seq` per sequence (the oldest goes first, except the
one before a verification, which is kept apart). Keeping the first n tokens restores the nearest
checkpoint at or before n and re-evaluates the tokens between (`Context.seq_keep_first`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from pyggml import ops
from pyggml.backend.base import is_host_buffer, tensor_get_into, tensor_set
from pyggml.context import Context
from pyggml.errors import ModelError
from pyggml.types import GGMLType

RS = "rs"                   # KVCache.layer_space of a recurrent layer
CHECKPOINTS_MAX = 8         # checkpoints kept per sequence (llama.cpp's --ctx-checkpoints)
CHECKPOINT_INTERVAL = 2048  # tokens between checkpoints while a long prompt is evaluated


class RecurrentStateError(ModelError):
    """A sequence operation a recurrent (hybrid) model cannot honour, e.g. forgetting a middle
    range of a sequence: its state holds every earlier token folded in."""


def is_recurrent(hp) -> bool:
    return any(getattr(hp, "recurrent_layers", None) or ())


def layer_is_recurrent(hp, il: int) -> bool:
    r = getattr(hp, "recurrent_layers", None)
    return bool(r) and r[il]


def state_rows(hp) -> tuple[int, int]:
    """(conv row, ssm row): F32 elements of one sequence's state in a recurrent layer."""
    conv = (hp.ssm_conv_kernel - 1) * hp.ssm_conv_channels
    return conv, max(hp.ssm_state_size, 1)


def new_state_tensors(ctx: Context, hp, il: int, n_seq_max: int):
    """(conv, ssm) state tensors of recurrent layer il (allocated by the KV cache)."""
    conv, ssm = state_rows(hp)
    return (ctx.new_tensor(GGMLType.F32, [conv, n_seq_max], name=f"cache_r_l{il}"),
            ctx.new_tensor(GGMLType.F32, [ssm, n_seq_max], name=f"cache_s_l{il}"))


def in_place(t) -> bool:
    """Whether the recurrent op may update state tensor t where it is: t lives in host memory
    (not a device's, not a planning stand-in), so the op runs on the CPU, whose kernels have the
    in-place form, and the scheduler hands them t itself, not a copy."""
    return t.buffer is not None and is_host_buffer(t.buffer)


def token_rows(b):
    """I32 [T]: each token's state row, rs_ids[rs_seq] (one node per graph, on the builder)."""
    t = getattr(b, "_rs_token_rows", None)
    if t is None:
        ids = ops.reshape_2d(b.ctx, b.inp.rs_ids, 1, b.inp.rs_ids.ne[0])
        t = ops.reshape_1d(b.ctx, ops.get_rows(b.ctx, ids, b.inp.rs_seq), b.T,
                           name="rs_token_rows")
        b._rs_token_rows = t
    return t


def update(b, il: int, cache, run, y_ne, kind: str):
    """Runs a recurrent op over the ubatch on state tensor cache F32 [row, n_seq_max] and stores
    the new states of recurrent layer il (kind: "conv" / "ssm", for the nodes' names):
    run(state, seq, in_place) builds the op (ops.ssm_conv / ops.gated_delta with its other
    arguments). Returns the op's outputs as y_ne, contiguous (the module docstring has the two
    forms)."""
    ctx = b.ctx
    if in_place(cache):
        return run(cache, token_rows(b), True)
    st = ops.get_rows(ctx, cache, b.inp.rs_ids, name=f"{kind}_state-{il}")
    y, new = ops.ssm_split(ctx, run(st, b.inp.rs_seq, False), list(y_ne), cache.ne[0])
    b.g.build_forward_expand(ops.set_rows(ctx, cache, new, b.inp.rs_ids,
                                          name=f"{kind}_state_store-{il}"))
    return y


def bytes_per_seq(hp) -> int:
    """Bytes of one sequence's recurrent state over all recurrent layers."""
    conv, ssm = state_rows(hp)
    n = sum(1 for il in range(hp.n_layer) if layer_is_recurrent(hp, il))
    return 4 * n * (conv + (ssm if hp.ssm_state_size else 1))


def read_seq(kv, seq_id: int) -> list[np.ndarray]:
    """Copies of sequence seq_id's rows of every recurrent layer's state tensors."""
    out = []
    for t in kv.rs_tensors():
        row = np.empty(t.ne[0], np.float32)
        out.append(tensor_get_into(t, row, seq_id * t.nb[1]))
    return out


def write_seq(kv, seq_id: int, rows: list[np.ndarray] | None) -> None:
    """Set sequence seq_id's rows (None: zeros, the state before any token)."""
    for i, t in enumerate(kv.rs_tensors()):
        data = np.zeros(t.ne[0], np.float32) if rows is None else rows[i]
        tensor_set(t, data, seq_id * t.nb[1])


@dataclass
class Checkpoint:
    n_tokens: int                   # the state after the first n_tokens of the sequence
    rows: list = field(repr=False)  # one array per state tensor (read_seq)

    @property
    def n_bytes(self) -> int:
        return sum(r.nbytes for r in self.rows)


class Checkpoints:
    """Per sequence, checkpoints sorted by n_tokens (at most max_per_seq) plus one kept apart
    before a speculative verification (`rollback`)."""

    def __init__(self, n_seq_max: int, max_per_seq: int = CHECKPOINTS_MAX,
                 interval: int = CHECKPOINT_INTERVAL):
        self.max_per_seq, self.interval = max_per_seq, interval
        self.by_seq: list[list[Checkpoint]] = [[] for _ in range(n_seq_max)]
        self.rollback: list[Checkpoint | None] = [None] * n_seq_max

    def add(self, kv, seq_id: int, n_tokens: int, rollback: bool = False) -> None:
        cp = Checkpoint(n_tokens, read_seq(kv, seq_id))
        if rollback:
            self.rollback[seq_id] = cp
            return
        lst = [c for c in self.by_seq[seq_id] if c.n_tokens != n_tokens]
        lst.append(cp)
        lst.sort(key=lambda c: c.n_tokens)
        while len(lst) > self.max_per_seq:
            lst.pop(0)
        self.by_seq[seq_id] = lst

    def has(self, seq_id: int, n_tokens: int) -> bool:
        return any(c.n_tokens == n_tokens for c in self.by_seq[seq_id])

    def nearest(self, seq_id: int, n: int) -> Checkpoint | None:
        """The checkpoint with the most tokens at or before n (the rollback one included)."""
        best = None
        for c in self.by_seq[seq_id] + [self.rollback[seq_id]]:
            if c is not None and c.n_tokens <= n and (best is None or c.n_tokens > best.n_tokens):
                best = c
        return best

    def forget_after(self, seq_id: int, n: int) -> None:
        """Drop the checkpoints of more than n tokens (the sequence was cut back to n)."""
        self.by_seq[seq_id] = [c for c in self.by_seq[seq_id] if c.n_tokens <= n]
        r = self.rollback[seq_id]
        if r is not None and r.n_tokens > n:
            self.rollback[seq_id] = None

    def clear(self, seq_id: int | None = None) -> None:
        for s in (range(len(self.by_seq)) if seq_id is None else [seq_id]):
            self.by_seq[s] = []
            self.rollback[s] = None

    def n_bytes(self) -> int:
        return sum(c.n_bytes for lst in self.by_seq for c in lst) + \
            sum(c.n_bytes for c in self.rollback if c is not None)


def checkpoint_bound_bytes(hp, n_seq_max: int, max_per_seq: int = CHECKPOINTS_MAX) -> int:
    """Host bytes the checkpoints can take at most: (max_per_seq + 1) per sequence."""
    return bytes_per_seq(hp) * n_seq_max * (max_per_seq + 1) if is_recurrent(hp) else 0
