"""`Context`: the decode side of a model run — batches split into ubatches, the graph cache, the
KV cache's per-sequence bookkeeping and the lock. llama.cpp's `llama_context` plus its public
sequence API (`llama_memory_seq_rm / seq_pos_max`); the sampler and the generation loop sit on
top (pyggml/llm/generate.py), the user-facing `LLM` around both (pyggml/llm/runtime.py).

Per ubatch: find KV cells → GraphParams(n_tokens, n_outputs, n_kv, n_kv_swa). Equal to the params
of one of the last few graphs (GRAPHS_KEPT; decoding, the verification of k drafts and prompt
chunks take turns): the reuse path writes the inputs and computes that graph again (no build, no
allocator planning — the scheduler keeps it allocated, `Scheduler._park` — and the CPU backend
replays its marshalled node array). Otherwise a new graph is built and placed with
`alloc_graph` from the plan reserved at start-up for the worst case.

The decode step's fast path: one token of one sequence, CPU only, through the graph the last
such step computed while the scheduler and the CPU plan would run it as it is, is one native
call (pg_decode_step: KV cells, inputs, mask rows, compute, logits copied and checked) plus
O(1) bookkeeping here; it gives the general path's cells and bits (tests/test_decode_step.py)
and hands every other case (n_kv past its graph's, several sequences, prompts, LoRA, recurrent
layers, other backends, eval callbacks) to the general path.

Sequences: each holds tokens at positions 0..n-1 (`seq_tokens`, `seq_len`). Only this module
changes what a sequence holds: `decode` appends, `seq_keep_first` keeps a prefix, `seq_reset`
forgets, `reuse_prefix` keeps the longest common prefix with a new prompt. Every change bumps
the sequence's epoch unless its owner says otherwise (`invalidate=False`: a generation moving
its own sequence on); a generation started at one epoch stops with GeneratorInvalidatedError
once it changed (`check_epoch`).

LoRA adapters (pyggml/llm/lora.py; loaded with the run): each sequence is decoded with the
global scales (`set_lora_scales`) or its own (`set_seq_lora`, a server request's "lora"); a
batch whose sequences differ is decoded one group of equal scales after another (the scales
are constants of a graph, as in llama.cpp, whose server batches only equal sets together).
Every sequence's cells carry the tag of the set they were computed under (`seq_lora_tag`):
`reuse_prefix` keeps nothing of cells computed under another set, so a scale change never
reuses KV of another scale.
"""

from __future__ import annotations

import ctypes
import os
import threading
from collections import OrderedDict
from dataclasses import dataclass, field

import numpy as np

from pyggml import _native
from pyggml.backend.base import is_host_tensor, tensor_get_into
from pyggml.backend.cpu import CpuBackend, host_array
from pyggml.errors import (ArgumentTypeError, ClosedError, ContextOverflowError,
                           GeneratorInvalidatedError, ModelError, PyggmlError)
from pyggml.llm import recurrent as rs
from pyggml.llm.kv_cache import FULL, KV_PAD, SWA
from pyggml.llm.lora import NO_LORA, Loras, check_scale
from pyggml.llm.models import GraphParams
from pyggml.llm.options import is_int, token_list
from pyggml.llm.speculative import SpecStats
from pyggml.offload import pin_phase_ops
from pyggml.tensor import placement_generation
from pyggml.sched import Scheduler

_addressof, _c_char_at = ctypes.addressof, ctypes.c_char.from_buffer     # an array's address

#: built graphs kept per context: as many as the scheduler keeps allocated
GRAPHS_KEPT = Scheduler.PARKED_MAX

#: what a ubatch returns: the logits (float32 [n, n_vocab]) or the final normed hidden state
#: (float32 [n, n_embd], the `result_norm` node before the output matrix: embeddings)
OUTPUTS = ("logits", "hidden")


@dataclass
class RunStats:
    """Counters and timings (seconds) since the model was opened or stats were reset."""
    graphs_built: int = 0
    graphs_reused: int = 0
    allocator_plans: int = 0          # reserve() calls (planning); the reuse path makes none
    n_prompt_tokens: int = 0          # prompt tokens evaluated
    n_prompt_reused: int = 0          # prompt tokens whose KV cells were kept (reuse_prefix)
    n_state_replayed: int = 0         # recurrent models: tokens re-evaluated from a checkpoint
                                      # to keep a prefix (seq_keep_first)
    n_gen_tokens: int = 0
    t_load_s: float = 0.0
    t_prompt_s: float = 0.0
    t_gen_s: float = 0.0
    ubatch_sizes: list = field(default_factory=list)
    spec: SpecStats = field(default_factory=SpecStats)    # speculative decoding: drafted, accepted


@dataclass
class _BuiltGraph:
    """A graph of a recent ubatch, kept for reuse: its inputs' numpy views and its output (and
    a numpy view of the output when it is in host memory: made once, not per token)."""
    graph: object
    output: object
    views: dict
    sched: Scheduler
    out_view: np.ndarray | None = None


class _FastStep:
    """A kept single-token decode graph the fast path runs in one native call (pg_decode_step):
    the graph, the scheduler and CPU backend that compute it, and the step's arguments (cell
    arrays, input addresses, the C plan) filled once. Valid while the scheduler would compute
    the graph as it is (current, same uid: a re-split or re-allocation gives a new one), no
    tensor moved since (the CPU plan's addresses hold) and the CPU backend would run the plan
    directly (no eval callback, the same decode threads); otherwise the general path runs and
    arms a new one. Every check is a few attribute reads: after a token's compute streamed the
    weights through the caches, each object Python touches is a cache miss."""

    __slots__ = ("built", "sched", "graph", "uid", "cpu", "nt", "gen", "args", "args_ref",
                 "n_vocab", "step")

    def valid(self) -> bool:
        return (self.sched.computes_as_is(self.graph, self.uid)
                and placement_generation() == self.gen and self.cpu.runs_plans(self.nt))


class Context:
    """The decode side of a run (pyggml.llm.setup.Run) of a model file: see the module docstring.

    Threads: every call holds `lock` (re-entrant), so calls from several threads run one after
    another; hold it yourself to make several calls atomic. close() frees the run's backends;
    afterwards every call raises ClosedError."""

    def __init__(self, run, offload, name: str):
        self.run, self.offload, self.name = run, offload, name
        self.hparams = run.model.hparams
        self.kv = run.kv
        self.lock = threading.RLock()
        self.stats = RunStats(allocator_plans=sum(1 for _ in run.scheds()))
        # called as on_ubatch(tokens_done, tokens_total) after each ubatch of a decode of more
        # than one ubatch (a progress bar for long prompts; None: nothing)
        self.on_ubatch = None
        self._closed = False
        self._graphs: OrderedDict[tuple, _BuiltGraph] = OrderedDict()   # (params, sched, output)
        n = self.n_seq_max
        self._seq_tokens: list[list[int]] = [[] for _ in range(n)]   # what each holds, in order
        self._seq_epoch = [0] * n           # bumped by every change of a sequence from outside
        # recurrent (hybrid) models: state checkpoints per sequence (pyggml/llm/recurrent.py)
        self.checkpoints = rs.Checkpoints(n) if self.kv.rs_layers else None
        # LoRA: the adapters, their global scales, a sequence's own scales (None: the global
        # ones) and the tag of the set its cells were computed under (None: mixed, unknown)
        self.adapters = tuple(getattr(run, "loras", ()))
        self.lora_scales = [1.0] * len(self.adapters)
        self._seq_lora: list[tuple | None] = [None] * n
        self._seq_lora_tag: list[tuple | None] = [NO_LORA] * n
        # the decode step's fast path (_decode_fast): one token of one sequence through the
        # kept graph of the last such step, in one native call; None: not armed
        self._fast: _FastStep | None = None
        self.fast_steps = 0             # tokens the fast path decoded (tests, benchmarks)

    n_ctx = property(lambda self: self.run.opts.n_ctx)
    n_ubatch = property(lambda self: self.run.opts.n_ubatch)
    n_seq_max = property(lambda self: self.run.opts.n_seq_max)
    logits_all = property(lambda self: self.run.opts.logits_all)
    closed = property(lambda self: self._closed)

    # ---- checks ------------------------------------------------------------------------------
    def check_open(self) -> None:
        if self._closed:
            raise ClosedError(f"this LLM ({os.path.basename(self.name)}) was closed: create a "
                              f"new one")

    def check_seq(self, seq_id) -> int:
        """seq_id as an int in [0, n_seq_max), else a typed error naming it."""
        if type(seq_id) is int and 0 <= seq_id < self.run.opts.n_seq_max:
            return seq_id           # the common case first: this runs once per token
        if not is_int(seq_id):
            raise ArgumentTypeError(f"seq_id must be an integer in [0, {self.n_seq_max}), got "
                                    f"{type(seq_id).__name__} {seq_id!r}")
        if not 0 <= seq_id < self.n_seq_max:
            raise ModelError(f"seq_id must be in [0, {self.n_seq_max}) (n_seq_max), got {seq_id!r}")
        return int(seq_id)

    def check_tokens(self, tokens, what: str = "tokens") -> list[int]:
        """A non-empty list of token ids inside the vocabulary, else a typed error."""
        if type(tokens) is list and len(tokens) == 1 and type(tokens[0]) is int \
                and 0 <= tokens[0] < self.hparams.n_vocab:
            return [tokens[0]]      # one token (a decode step): its checks without a pass
        tokens = token_list(tokens, what)
        if not tokens:
            raise ModelError(f"empty prompt: {what} has no token, at least one is needed")
        V = self.hparams.n_vocab
        bad = [t for t in tokens if not 0 <= t < V]
        if bad:
            raise ModelError(f"token ids outside the vocabulary [0, {V}): {bad[:5]}")
        return tokens

    # ---- LoRA adapters -----------------------------------------------------------------------
    def check_lora_scales(self, scales, what: str = "scales") -> tuple:
        """One finite number per loaded adapter, as a tuple (else a typed error naming it)."""
        if isinstance(scales, (str, bytes)) or not hasattr(scales, "__len__"):
            raise ArgumentTypeError(f"LoRA {what} must be a list of numbers (one per adapter), "
                                    f"got {type(scales).__name__} {scales!r:.60}")
        if len(scales) != len(self.adapters):
            raise ModelError(f"LoRA {what}: {len(scales)} given, {len(self.adapters)} adapters "
                             f"are loaded (one scale per adapter)")
        return tuple(check_scale(f"LoRA {what}[{i}]", s) for i, s in enumerate(scales))

    def set_lora_scales(self, scales) -> None:
        """The global scales, one per adapter (0: not applied); sequences without their own
        scales are decoded with these from their next decode on."""
        scales = self.check_lora_scales(scales)
        with self.lock:
            self.lora_scales = list(scales)

    def set_seq_lora(self, seq_id: int, scales) -> None:
        """Sequence seq_id's own scales (one per adapter), or None: the global ones."""
        seq_id = self.check_seq(seq_id)
        scales = None if scales is None else self.check_lora_scales(scales)
        with self.lock:
            self._seq_lora[seq_id] = scales

    def loras(self, scales=None) -> Loras:
        """The adapters a sequence with `scales` (one per adapter; None: the global ones) is
        decoded with (those whose scale is not 0)."""
        return Loras(zip(self.adapters, self.lora_scales if scales is None else scales))

    def seq_loras(self, seq_id: int) -> Loras:
        """The adapters sequence seq_id is decoded with."""
        return self.loras(self._seq_lora[seq_id])

    def reusable_prefix(self, ids: list[int], seq_id: int, lora_tag: tuple) -> int:
        """Tokens at the start of `ids` whose cells sequence seq_id holds, computed under the
        adapter set `lora_tag` (Loras.tag): 0 when its cells were computed under another."""
        if self._seq_lora_tag[self.check_seq(seq_id)] != lora_tag:
            return 0
        return self.common_prefix(ids, seq_id)

    def seq_lora_tag(self, seq_id: int) -> tuple | None:
        """The tag (Loras.tag) of the adapter set the sequence's cells were computed under
        (() without LoRA; None: under several, or unknown)."""
        return self._seq_lora_tag[self.check_seq(seq_id)]

    # ---- sequences ---------------------------------------------------------------------------
    def free_cells(self) -> int:
        """KV cells no sequence holds (shared by all sequences)."""
        return self.n_ctx - self.kv.n_used()

    def seq_tokens(self, seq_id: int = 0) -> list[int]:
        """The tokens sequence `seq_id` holds, in position order (a copy)."""
        return list(self._seq_tokens[self.check_seq(seq_id)])

    def seq_len(self, seq_id: int = 0) -> int:
        """Tokens sequence `seq_id` holds: the next position (llama.cpp's seq_pos_max + 1)."""
        return len(self._seq_tokens[self.check_seq(seq_id)])

    def seq_epoch(self, seq_id: int) -> int:
        return self._seq_epoch[self.check_seq(seq_id)]

    def check_epoch(self, seq_id: int, epoch: int) -> None:
        """ClosedError after close(); GeneratorInvalidatedError once the sequence was changed
        since `epoch` by anyone but the generation that holds it."""
        if self._closed:
            raise ClosedError(f"this LLM ({os.path.basename(self.name)}) was closed: its "
                              f"generations cannot continue")
        if self._seq_epoch[seq_id] != epoch:
            raise GeneratorInvalidatedError(
                f"sequence {seq_id} was changed after this generation started (a newer "
                f"generate, reset, eval or decode_batch on it): its cache no longer holds this "
                f"generation's tokens; start a new generate")

    def seq_keep_first(self, seq_id: int, n_keep: int, *, invalidate: bool = True) -> None:
        """Keep the first n_keep tokens of a sequence, forget the rest (positions >= n_keep).
        invalidate=False: the sequence's own generation moving on (its epoch stays)."""
        seq_id = self.check_seq(seq_id)
        with self.lock:
            self.check_open()
            held = self._seq_tokens[seq_id]
            if not is_int(n_keep) or not 0 <= n_keep <= len(held):
                raise ModelError(f"n_keep must be in [0, {len(held)}] (tokens held by sequence "
                                 f"{seq_id}), got {n_keep!r}")
            if n_keep < len(held) and self.checkpoints is not None:
                self._keep_first_recurrent(seq_id, int(n_keep))
            elif n_keep < len(held):
                self.kv.seq_rm(seq_id, int(n_keep))
                del held[n_keep:]
            if not held:
                self._seq_lora_tag[seq_id] = NO_LORA
            if invalidate:
                self._seq_epoch[seq_id] += 1

    def _keep_first_recurrent(self, seq_id: int, n_keep: int) -> None:
        """A recurrent state cannot be cut back: restore the nearest checkpoint at or before
        n_keep (none: the empty state), forget what follows it, then evaluate the tokens from it
        to n_keep again (counted in stats.n_state_replayed)."""
        held = self._seq_tokens[seq_id]
        cp = self.checkpoints.nearest(seq_id, n_keep)
        c = cp.n_tokens if cp is not None else 0
        replay = held[c:n_keep]
        rs.write_seq(self.kv, seq_id, cp.rows if cp is not None else None)
        self.kv.seq_rm(seq_id, c)
        del held[c:]
        self.checkpoints.forget_after(seq_id, c)
        if replay:
            self.stats.n_state_replayed += len(replay)
            self.decode([(replay, seq_id)], invalidate=False)

    def seq_reset(self, seq_id: int | None = None) -> None:
        """Forget a sequence's tokens (every sequence with None); their generations end."""
        with self.lock:
            self.check_open()
            if self.checkpoints is not None:
                self.checkpoints.clear(None if seq_id is None else self.check_seq(seq_id))
            if seq_id is None:
                self.kv.clear()
                self._seq_tokens = [[] for _ in range(self.n_seq_max)]
                self._seq_lora_tag = [NO_LORA] * self.n_seq_max
                self._seq_epoch = [e + 1 for e in self._seq_epoch]
            else:
                seq_id = self.check_seq(seq_id)
                self.kv.seq_rm(seq_id)
                self._seq_tokens[seq_id] = []
                self._seq_lora_tag[seq_id] = NO_LORA
                self._seq_epoch[seq_id] += 1

    def seq_copy(self, src: int, dst: int) -> None:
        """Make sequence dst hold what src holds (llama.cpp's seq_cp of a whole sequence): the
        KV cells are shared, not copied (a cell belongs to both until one forgets it); the
        recurrent state rows and checkpoints of a hybrid model are copied. dst's own tokens
        go and its generations end."""
        src, dst = self.check_seq(src), self.check_seq(dst)
        with self.lock:
            self.check_open()
            if src == dst:
                return
            self.seq_reset(dst)
            for sp in self.kv.spaces.values():
                sp.seq_cp(src, dst)
            if self.checkpoints is not None:
                rs.write_seq(self.kv, dst, rs.read_seq(self.kv, src))
                cps = self.checkpoints
                cps.by_seq[dst], cps.rollback[dst] = list(cps.by_seq[src]), cps.rollback[src]
            self._seq_tokens[dst] = list(self._seq_tokens[src])
            self._seq_lora_tag[dst] = self._seq_lora_tag[src]

    def seq_adopt(self, seq_id: int, tokens: list[int], lora_tag=NO_LORA) -> None:
        """Sequence seq_id (just reset) now holds `tokens` at positions 0..n-1, whose cells its
        caller placed and filled (a restored state: pyggml/llm/state.py), computed under the
        LoRA set `lora_tag` (Loras.tag)."""
        seq_id = self.check_seq(seq_id)
        with self.lock:
            self._seq_lora_tag[seq_id] = lora_tag if tokens else NO_LORA
            self._seq_tokens[seq_id] = list(tokens)
            self._seq_epoch[seq_id] += 1

    def common_prefix(self, ids: list[int], seq_id: int) -> int:
        """Tokens at the start of `ids` that sequence seq_id holds already."""
        n = 0
        for a, b in zip(self._seq_tokens[self.check_seq(seq_id)], ids):
            if a != b:
                break
            n += 1
        return n

    def reuse_prefix(self, ids: list[int], seq_id: int = 0) -> int:
        """Prepare sequence seq_id to evaluate prompt `ids`: keep the KV cells of the longest
        common prefix with what it holds, forget the rest. Returns the tokens kept: evaluate
        ids[n:] next. At least the last two prompt tokens are evaluated again: the last one's
        logits are needed, and with a single row the matmuls take the one-row path, whose
        rounding differs from the multi-row path for some formats (Q4_1's block sums), so a
        reused prompt would not give exactly the tokens of a fresh one. Sliding-window layers:
        when cells the window needs for the shorter prefix were already dropped, nothing is
        kept (llama.cpp does the same)."""
        seq_id = self.check_seq(seq_id)
        with self.lock:
            # cells computed under other LoRA scales: nothing to reuse
            n = self.reusable_prefix(ids[:-2], seq_id, self.seq_loras(seq_id).tag)
            if n > 0 and not self.kv.can_keep_prefix(seq_id, n):
                n = 0
            if self.checkpoints is not None and n < self.seq_len(seq_id):
                # recurrent state: resume from the nearest checkpoint at or before n
                cp = self.checkpoints.nearest(seq_id, n)
                n = cp.n_tokens if cp is not None else 0
            self.seq_keep_first(seq_id, n)
            self.stats.n_prompt_reused += n
        return n

    # ---- evaluation --------------------------------------------------------------------------
    def decode_batch(self, seqs, all_logits=()) -> dict[int, np.ndarray]:
        """Append tokens to several sequences in one batch: [(tokens, seq_id), ...], each
        sequence once; checked (typed errors naming the item), then `decode`."""
        if not isinstance(seqs, (list, tuple)) or not seqs:
            raise ArgumentTypeError(f"decode_batch takes a non-empty list of (tokens, seq_id) "
                                    f"pairs, got {type(seqs).__name__} {seqs!r:.60}")
        checked = []
        for i, item in enumerate(seqs):
            if not isinstance(item, (list, tuple)) or len(item) != 2:
                raise ArgumentTypeError(f"decode_batch: seqs[{i}] must be a (tokens, seq_id) "
                                        f"pair, got {type(item).__name__} {item!r:.60}")
            checked.append((self.check_tokens(item[0]), self.check_seq(item[1])))
        sids_given = [sid for _, sid in checked]
        if len(set(sids_given)) != len(sids_given):
            raise ModelError(f"decode_batch: each sequence at most once per batch, got seq_ids "
                             f"{sids_given}")
        return self.decode(checked, frozenset(int(s) for s in all_logits))

    def decode(self, seqs: list[tuple[list[int], int]], all_rows=frozenset(), *,
               output: str = "logits", invalidate: bool = True) -> dict[int, np.ndarray]:
        """Append checked tokens to sequences [(tokens, seq_id), ...] in ubatches of at most
        n_ubatch tokens. Returns {seq_id: float32 rows}: the last row of each sequence
        ([n_vocab]), or every row ([n, n_vocab]) with logits_all and for the seq_ids in
        `all_rows` (a speculative round verifies every drafted token in one batch);
        output="hidden": every row of the final normed hidden state ([n, n_embd]).
        ContextOverflowError (nothing changed) when the cache lacks room; on any error the
        cache is left as it was. invalidate=False: the sequences' own generations are
        evaluating (their epochs stay)."""
        if output not in OUTPUTS:
            raise ModelError(f"output must be one of {', '.join(OUTPUTS)}, got {output!r}")
        with self.lock:
            self.check_open()
            if (self._fast is not None and len(seqs) == 1 and len(seqs[0][0]) == 1
                    and output == "logits"):
                out = self._decode_fast(seqs[0][0][0], seqs[0][1], all_rows, invalidate)
                if out is not None:
                    return out
            groups: dict[tuple, list] = {}
            loras = {}
            for item in seqs:
                lo = self.seq_loras(item[1])
                groups.setdefault(lo.tag, []).append(item)
                loras[lo.tag] = lo
            if len(groups) == 1:
                return self._decode(seqs, all_rows, output, invalidate, loras[next(iter(groups))])
            # sequences with different LoRA scales: one decode per set (an error leaves the
            # groups decoded before it in place)
            out = {}
            for tag, group in groups.items():
                out.update(self._decode(group, all_rows, output, invalidate, loras[tag]))
            return out

    def _decode(self, seqs, all_rows, output: str, invalidate: bool,
                lora: Loras) -> dict[int, np.ndarray]:
        """decode of sequences that share one set of LoRA adapters."""
        with self.lock:
            if invalidate:
                for _, sid in seqs:
                    self._seq_epoch[sid] += 1
            every = output == "hidden" or self.logits_all
            toks, pos, sids, want = [], [], [], []
            for tokens, sid in seqs:
                p0 = len(self._seq_tokens[sid])
                toks += tokens
                pos += range(p0, p0 + len(tokens))
                sids += [sid] * len(tokens)
                want += [every or sid in all_rows] * (len(tokens) - 1) + [True]
            if len(toks) > self.free_cells():
                raise ContextOverflowError(f"context overflow: {len(toks)} new tokens but "
                                           f"{self.free_cells()} of n_ctx={self.n_ctx} KV cells "
                                           f"are free; reset a sequence or use a larger n_ctx")
            toks, pos = np.asarray(toks, np.int32), np.asarray(pos, np.int32)
            sids, want = np.asarray(sids, np.int64), np.asarray(want, bool)
            rows = []
            snapshot = self.kv.snapshot()
            if self.checkpoints is not None:
                self._before_recurrent(seqs, all_rows)
            try:
                for i in range(0, len(toks), self.n_ubatch):
                    sl = slice(i, i + self.n_ubatch)
                    rows.append(self._decode_ubatch(toks[sl], pos[sl], sids[sl], want[sl], output,
                                                    lora))
                    if self.on_ubatch is not None and len(toks) > self.n_ubatch:
                        self.on_ubatch(min(i + self.n_ubatch, len(toks)), len(toks))
                    if self.checkpoints is not None:
                        self._checkpoint_ubatch(pos[sl], sids[sl])
            except BaseException:
                # leave the cache as it was: the model stays usable after an error
                self.kv.restore(snapshot)
                if self.checkpoints is not None:
                    # the recurrent state moved on in part: those sequences start again
                    for _, sid in seqs:
                        self.kv.seq_rm(sid)
                        self._seq_tokens[sid] = []
                        self._seq_lora_tag[sid] = NO_LORA
                        self._seq_epoch[sid] += 1
                        self.checkpoints.clear(sid)
                raise
            for tokens, sid in seqs:
                self._appended(sid, [int(t) for t in tokens], lora.tag)
                if self.checkpoints is not None and len(tokens) > 1 and sid not in all_rows:
                    # the end of an evaluated prompt (a message's end): a checkpoint
                    self.checkpoints.add(self.kv, sid, len(self._seq_tokens[sid]))
        out = np.concatenate(rows) if len(rows) > 1 else rows[0]
        if len(seqs) == 1:          # no selection: no second copy of (maybe large) logits
            sid = seqs[0][1]
            return {sid: out if every or sid in all_rows else out[-1]}
        out_sids = sids[want]
        result = {}
        for _, sid in seqs:
            sel = out[out_sids == sid]
            result[sid] = sel if every or sid in all_rows else sel[-1]
        return result

    def _appended(self, sid: int, tokens: list[int], tag) -> None:
        """Tokens computed into sequence sid under the LoRA set `tag`: held, and the set its
        cells were computed under kept (None once cells of several sets mix: never reused)."""
        held = self._seq_tokens[sid]
        if not held:
            self._seq_lora_tag[sid] = tag
        elif self._seq_lora_tag[sid] != tag:
            self._seq_lora_tag[sid] = None
        held += tokens

    def _decode_fast(self, tok, sid: int, all_rows, invalidate: bool) -> dict | None:
        """decode of one token of one sequence through the armed graph (_arm_fast), placed,
        written, computed and its logits copied and checked in one native call; the same
        cells, inputs, kernels and so the same bits as the general path. None (nothing done):
        the general path must run (another graph: n_kv grew; no free cell; the graph or its
        plan changed; a compute error, which the general path then reports). The graph is the
        scheduler's current one, so it is the most recent in _graphs already."""
        f = self._fast
        if not f.valid():
            self._fast = None
            return None
        held = self._seq_tokens[sid]
        out = np.empty(f.n_vocab, np.float32)
        st = f.step(f.args_ref, tok, len(held), sid, _addressof(_c_char_at(out)))
        if st:
            if st != _native.PG_STEP_NOT_FINITE:
                return None         # nothing changed (the step took back its cells)
            if invalidate:
                self._seq_epoch[sid] += 1
            raise PyggmlError("the model produced non-finite logits (NaN or +inf)")
        if invalidate:
            self._seq_epoch[sid] += 1
        f.sched.n_computes += 1
        f.cpu.n_computes += 1
        stats = self.stats
        stats.graphs_reused += 1
        stats.ubatch_sizes.append(1)
        self.fast_steps += 1
        self._appended(sid, [tok], NO_LORA)
        if self.logits_all or sid in all_rows:
            return {sid: out.reshape(1, -1)}
        return {sid: out}

    def _arm_fast(self, built: _BuiltGraph, sched, gp: GraphParams) -> None:
        """After the general path computed a one-token, one-output logits graph: keep it for
        _decode_fast when the step can run it (CPU only, one split, no LoRA adapters, no
        recurrent layers, no inputs the step does not write, host logits); else disarm."""
        self._fast = None
        cpu = self.run.cpu
        views = built.views
        if (self.checkpoints is not None or self.adapters or built.out_view is None
                or not isinstance(cpu, CpuBackend) or not _native.decode_step_available()
                or any(k in views for k in ("attn_temp", "rs_ids", "rs_seq"))
                or set(self.kv.spaces) - {FULL, SWA}):
            return
        split = sched.sole_split(built.graph)
        if split is None or sched.backends[split.backend_id] is not cpu:
            return
        nt = cpu.n_threads
        plan = cpu.kept_plan(split.graph, nt)
        if plan is None or not cpu.runs_plans(nt):
            return
        a = _native.DecodeStepArgs()
        spaces = [self.kv.spaces[FULL]] + ([self.kv.spaces[SWA]] if SWA in self.kv.spaces else [])
        for i, sp in enumerate(spaces):
            a.cell_pos[i], a.cell_seqs[i] = sp.pos.ctypes.data, sp.seqs.ctypes.data
            a.n_cells[i] = sp.n_cells
        a.n_spaces = len(spaces)
        a.ring, a.window, a.kv_pad = self.kv.swa_ring, self.kv.window, KV_PAD
        a.n_kv[0], a.n_kv[1] = gp.n_kv, gp.n_kv_swa
        ptr = lambda name: views[name].ctypes.data if name in views else None   # noqa: E731
        a.inp_tokens, a.inp_pos, a.inp_out_ids = ptr("tokens"), ptr("pos"), ptr("out_ids")
        a.inp_kv_idxs[0], a.inp_kv_idxs[1] = ptr("kv_idxs"), ptr("kv_idxs_swa")
        # the masks as _write_inputs writes them: the full one without a window, the sliding
        # one over its own space (or the full one) with the window
        masks = [("mask", 0, 0), ("mask_swa", len(spaces) - 1, self.hparams.sliding_window)]
        for m, (name, space, window) in enumerate(masks):
            if name in views:
                a.mask[m], a.mask_n_kv[m] = views[name].ctypes.data, views[name].shape[1]
                a.mask_space[m], a.mask_window[m] = space, window
        a.plan, a.tp, a.n_threads = plan.handle, cpu._tp, min(nt, plan.n_threads)
        a.work, a.work_size = (plan.work.ctypes.data if plan.work.size else None), plan.work.size
        a.logits, a.n_vocab = built.out_view.ctypes.data, self.hparams.n_vocab
        f = _FastStep()
        f.built, f.sched, f.graph, f.uid = built, sched, built.graph, built.graph.uid
        f.cpu, f.nt, f.gen, f.args, f.n_vocab = cpu, nt, plan.generation, a, self.hparams.n_vocab
        f.args_ref, f.step = ctypes.byref(a), _native.fn("pg_decode_step")
        self._fast = f

    def _before_recurrent(self, seqs, all_rows) -> None:
        """Recurrent models, before a batch: a sequence that starts at position 0 starts from
        the empty state; one whose rows are all wanted (a speculative verification) gets a
        rollback checkpoint, so that rejected drafts can be taken back."""
        for _, sid in seqs:
            n = len(self._seq_tokens[sid])
            if n == 0:
                rs.write_seq(self.kv, sid, None)
            elif sid in all_rows:
                self.checkpoints.add(self.kv, sid, n, rollback=True)

    def _checkpoint_ubatch(self, pos, sids) -> None:
        """A checkpoint of each sequence of the ubatch whose length crossed a multiple of the
        checkpoint interval (long prompts resume from every few thousand tokens)."""
        every = self.checkpoints.interval
        for sid in np.unique(sids):
            p = pos[sids == sid]
            if (int(p[-1]) + 1) // every > int(p[0]) // every:
                self.checkpoints.add(self.kv, int(sid), int(p[-1]) + 1)

    def _decode_ubatch(self, toks, pos, sids, want, output: str, lora: Loras) -> np.ndarray:
        T = len(toks)
        cells = self.kv.place(pos, sids, atomic=False)     # decode() restores on errors
        n_kv = self.kv.n_kv()
        out_ids = np.flatnonzero(want).astype(np.int32)
        n_wanted = len(out_ids)
        if n_wanted == 0:       # keep the topology of a full ubatch: compute one row, drop it
            out_ids = np.array([T - 1], np.int32)
        n_rs = len(np.unique(sids)) if self.checkpoints is not None else 0
        gp = GraphParams(T, len(out_ids), n_kv["full"], n_kv.get("swa", 0), n_rs=n_rs)
        self.stats.ubatch_sizes.append(T)
        phase = "decode" if T == 1 else "prefill"
        sched = self.run.sched[phase]
        key = (gp, id(sched), output, lora.tag)
        built = self._graphs.get(key)
        if built is not None and built.sched is sched and sched.holds(built.graph):
            self._graphs.move_to_end(key)
            self.stats.graphs_reused += 1
        else:
            g, inp, logits = (self.run.build_graph(gp, lora) if lora else
                              self.run.build_graph(gp))
            # the hidden state is found once per built graph, not per token
            res = logits if output == "logits" else \
                next(t for t in g.nodes if t.name == "result_norm").set_output()
            before = sched.n_reserves
            pin_phase_ops(sched, g, self.offload, phase, self.run.weights, n_tokens=T)
            sched.alloc_graph(g)
            self.stats.allocator_plans += sched.n_reserves - before
            built = self._graphs[key] = _BuiltGraph(
                g, res, self._input_views(inp, T), sched,
                host_array(res) if is_host_tensor(res) else None)
            while len(self._graphs) > GRAPHS_KEPT:
                self._graphs.popitem(last=False)
            self.stats.graphs_built += 1
        self._write_inputs(built.views, toks, pos, sids, cells, out_ids, n_kv)
        cpu = self.run.cpu
        cpu.set_n_threads(cpu.n_threads if T == 1 else cpu.n_threads_batch)
        sched.graph_compute(built.graph)
        if T == 1 and output == "logits" and n_wanted == 1:
            if self._fast is None or self._fast.built is not built or not self._fast.valid():
                self._arm_fast(built, sched, gp)
        if output == "hidden":      # every row: the normed hidden state of all T tokens
            E = self.hparams.n_embd
            if built.out_view is not None:
                return built.out_view.reshape(T, E).copy()
            return tensor_get_into(built.output, np.empty((T, E), np.float32))
        V = self.hparams.n_vocab
        if built.out_view is not None:
            out = built.out_view.reshape(len(out_ids), V)[:n_wanted].copy()
        else:
            out = tensor_get_into(built.output, np.empty((n_wanted, V), np.float32))
        # NaN or +inf anywhere makes the maximum non-finite: one pass over the logits (1 MiB a
        # token for a 262K vocabulary, read from memory) instead of isfinite's two and a mask;
        # -inf alone (a token that cannot come) is allowed
        if out.size and not np.isfinite(out.max()):
            raise PyggmlError("the model produced non-finite logits (NaN or +inf)")
        return out

    @staticmethod
    def _input_views(inp, T: int) -> dict:
        """numpy views of a placed graph's input tensors (host memory), by input name."""
        views = {name: host_array(getattr(inp, name)).reshape(-1)
                 for name in ("tokens", "pos", "kv_idxs", "kv_idxs_swa", "out_ids", "attn_temp",
                              "rs_ids", "rs_seq")
                 if getattr(inp, name) is not None}
        if inp.mask is not None:
            views["mask"] = host_array(inp.mask).reshape(T, -1)
        if inp.mask_swa is not None:
            views["mask_swa"] = host_array(inp.mask_swa).reshape(T, -1)
        return views

    def _write_inputs(self, views, toks, pos, sids, cells, out_ids, n_kv) -> None:
        """Write a ubatch's inputs into its graph's input tensors (numpy views of them)."""
        views["tokens"][:] = toks
        views["pos"][:] = pos
        if "kv_idxs" in views:
            views["kv_idxs"][:] = cells["full"]
        if "kv_idxs_swa" in views:
            views["kv_idxs_swa"][:] = cells["swa"]
        if "out_ids" in views:
            views["out_ids"][:] = out_ids
        if "rs_ids" in views:       # the ubatch's sequences, each token's index into them
            ids, idx = np.unique(sids, return_inverse=True)
            views["rs_ids"][:] = ids
            views["rs_seq"][:] = idx
        if "attn_temp" in views:       # llama.cpp's llm_graph_input_attn_temp, in float64
            hp = self.hparams
            fl = np.floor(np.asarray(pos, np.float32) / np.float32(hp.attn_temp_floor_scale))
            views["attn_temp"][:] = np.log(fl.astype(np.float64) + 1.0) * hp.attn_temp_scale + 1.0
        if "mask" in views:
            self.kv.mask_into("full", views["mask"], pos, sids)
        if "mask_swa" in views:
            sp = "swa" if "swa" in n_kv else "full"
            self.kv.mask_into(sp, views["mask_swa"], pos, sids, self.hparams.sliding_window)

    def close(self) -> None:
        """Free the run's backends (waits for a decode in progress); idempotent."""
        with self.lock:
            if not self._closed:
                self._closed = True
                self.run.close()
