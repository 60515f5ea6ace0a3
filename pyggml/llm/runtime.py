"""`LLM`: load a GGUF model and run it — batches split into ubatches, a KV cache, graph reuse,
sampling. The public entry point of pyggml for text generation.

Per ubatch: find KV cells → GraphParams(n_tokens, n_outputs, n_kv, n_kv_swa). Equal to the params
of one of the last few graphs (GRAPHS_KEPT; decoding, the verification of k drafts and prompt
chunks take turns): the reuse path writes the inputs and computes that graph again (no build, no
allocator planning — the scheduler keeps it allocated, `Scheduler._park` — and the CPU backend
replays its marshalled node array). Otherwise a new graph is built and placed with
`alloc_graph` from the plan reserved at start-up for the worst case.
"""

from __future__ import annotations

import os
import threading
import time
from collections import OrderedDict, deque
from dataclasses import dataclass, field
from typing import Iterator

import numpy as np

from pyggml.backend.base import is_host_tensor, tensor_get_into
from pyggml.backend.cpu import host_array
from pyggml.errors import (ArgumentTypeError, ClosedError, ContextOverflowError,
                           GeneratorInvalidatedError, ModelError, PyggmlError)
from pyggml.llm.models import GraphParams
from pyggml.llm.options import check_flag, check_int, is_int, token_list, validate_options
from pyggml.llm.sampler import DEFAULT_SEED, Sampler, SamplingParams
from pyggml.llm.setup import DEFAULTS, ModelFile, RunOptions, build_run, resolve_offload
from pyggml.llm.speculative import DraftModel, SpecStats, Speculator, as_draft
from pyggml.llm.textstream import TextStream
from pyggml.llm.tokenizer import Tokenizer
from pyggml.offload import OffloadPlan, pin_phase_ops
from pyggml.offload.config import load_config
from pyggml.sched import Scheduler


@dataclass
class RunStats:
    """Counters and timings (seconds) since the LLM was created or stats were reset."""
    graphs_built: int = 0
    graphs_reused: int = 0
    allocator_plans: int = 0          # reserve() calls (planning); the reuse path makes none
    n_prompt_tokens: int = 0          # prompt tokens evaluated
    n_prompt_reused: int = 0          # prompt tokens whose KV cells were kept (reuse_prefix)
    n_gen_tokens: int = 0
    t_load_s: float = 0.0
    t_prompt_s: float = 0.0
    t_gen_s: float = 0.0
    ubatch_sizes: list = field(default_factory=list)
    spec: SpecStats = field(default_factory=SpecStats)    # speculative decoding: drafted, accepted


#: built graphs kept per LLM: as many as the scheduler keeps allocated
GRAPHS_KEPT = Scheduler.PARKED_MAX


@dataclass
class _BuiltGraph:
    """A graph of a recent ubatch, kept for reuse: its params, inputs' numpy views, output."""
    params: GraphParams
    graph: object
    logits: object
    views: dict
    sched: Scheduler


@dataclass
class Token:
    """One generated token: its id and the text it completes (see pyggml.llm.textstream: ''
    while a character is incomplete, U+FFFD for invalid bytes; the texts of a generation joined
    are its detokenized text)."""
    id: int
    text: str


FINISH_REASONS = ("stop", "length", "context")


class Generation:
    """The tokens of one `LLM.generate` call: an iterator of Token.

    finish_reason: None while running, then 'stop' (an end-of-generation token; it is not
    yielded), 'length' (max_tokens reached) or 'context' (the KV cache has no cell for the next
    token; llama.cpp without context shift stops the same way). It is set before the last
    token is handed out. (OpenAI-style APIs call 'context' 'length'.)
    Resuming raises ClosedError after LLM.close(), and GeneratorInvalidatedError once the
    sequence was changed by anything else: a newer generate, reset, eval or decode_batch on it.
    """

    def __init__(self):
        self.finish_reason: str | None = None
        self._it: Iterator[Token] | None = None

    def __iter__(self) -> "Generation":
        return self

    def __next__(self) -> Token:
        return next(self._it)

    def close(self) -> None:
        self._it.close()


class LLM:
    """A GGUF language model ready to run.

    model_path: a GGUF file (None: the embedded default model, Gemma 3 270M Q4_K_M).
    n_ctx: KV cells (shared by all sequences; 0: the model's trained context); n_batch: tokens
    per eval call chunk; n_ubatch: tokens per graph; n_threads / n_threads_batch: decode /
    prompt threads; n_seq_max: sequences decoded together; type_k/type_v: KV cache types (f16,
    f32, q8_0); logits_all: keep logits for every position (else the last of each eval only);
    flash_attn: fused attention (llama.cpp's default on CPU) or mul_mat + softmax;
    n_gpu_layers: as llama.cpp's -ngl, the last N of the n_layer + 1 layer slots (the output
    is the last) on `device` (llama.cpp's -dev; default: the first GPU that is not a software
    device such as lavapipe, which is used only when named); offload: an OffloadPlan (overrides n_gpu_layers);
    config: an offload config (a YAML path, a pyggml.offload.config.Config or a dict; see
    configs/README.md): its plan replaces n_gpu_layers / offload, and the sizes, threads and
    KV types it sets replace the keyword arguments;
    progress: a progress bar while weights are copied to devices (None: on a terminal);
    swa_full: sliding-window layers keep all n_ctx cells (else a window-sized cache, as llama.cpp);
    draft_model: speculative decoding for generate / create_completion (pyggml/llm/speculative.py):
    a PromptLookup, a DraftModel, a GGUF path or LLM (a draft model), or 'lookup' (prompt lookup);
    draft_max / draft_min: tokens drafted per round at most / at least (llama.cpp's --draft-max,
    --draft-min; for a path or 'lookup').
    `config` afterwards: the loaded Config the run was made from (None: made from n_gpu_layers
    or an OffloadPlan).
    Defaults: pyggml.llm.setup.RunOptions (the one table of them, shared with the CLI).
    A KV cache larger than the available memory is refused before anything is allocated
    (InsufficientMemoryError, with the n_ctx that would fit).

    Threads: one LLM may be shared. Evaluation is serialized by `lock` (a re-entrant lock):
    eval, decode_batch, reset, generate and each step of a generation hold it, so calls from
    several threads run one after another, never interleaved inside the engine. Hold
    `with llm.lock:` yourself to make several calls atomic (reset then eval). Generators of
    different sequences (seq_id, n_seq_max > 1) may be consumed by different threads; a
    generator is invalidated by any other change of its sequence (see Generation). tokenize and
    detokenize need no lock (the vocabulary is read-only).

    close() (also at the end of a `with` block) frees the backends and the model file; it waits
    for an evaluation in progress, and a second close() does nothing. Afterwards every method
    except tokenize, detokenize and close raises ClosedError, and so do unfinished generators.
    """

    def __init__(self, model_path: str | os.PathLike | None = None, config=None, *,
                 n_ctx: int = DEFAULTS.n_ctx, n_batch: int = DEFAULTS.n_batch,
                 n_ubatch: int = DEFAULTS.n_ubatch, n_threads: int | None = None,
                 n_threads_batch: int | None = None, n_seq_max: int = DEFAULTS.n_seq_max,
                 type_k: str = DEFAULTS.type_k, type_v: str = DEFAULTS.type_v,
                 logits_all: bool = DEFAULTS.logits_all, flash_attn: bool = DEFAULTS.flash_attn,
                 n_gpu_layers: int = DEFAULTS.n_gpu_layers, offload: OffloadPlan | None = None,
                 progress: bool | None = None, swa_full: bool = DEFAULTS.swa_full,
                 device: str | None = None, verbose: bool = False, draft_model=None,
                 draft_max: int | None = None, draft_min: int | None = None):
        t0 = time.perf_counter()
        self._closed = False
        self.lock = threading.RLock()
        validate_options(model_path, config, n_ctx=n_ctx, n_batch=n_batch, n_ubatch=n_ubatch,
                         n_threads=n_threads, n_threads_batch=n_threads_batch, n_seq_max=n_seq_max,
                         type_k=type_k, type_v=type_v, logits_all=logits_all,
                         flash_attn=flash_attn, n_gpu_layers=n_gpu_layers, offload=offload,
                         progress=progress, swa_full=swa_full, device=device, verbose=verbose)
        draft = as_draft(draft_model, draft_max, draft_min)
        opts = RunOptions(n_ctx=n_ctx, n_batch=n_batch, n_ubatch=n_ubatch, n_threads=n_threads,
                          n_threads_batch=n_threads_batch, n_seq_max=n_seq_max, type_k=type_k,
                          type_v=type_v, logits_all=logits_all, flash_attn=flash_attn,
                          swa_full=swa_full, n_gpu_layers=n_gpu_layers,
                          n_draft=draft.n_max if draft is not None else 0)
        self.file = ModelFile(model_path)
        try:
            # loaded once and kept: what the run was made from (the served plan describes it)
            self.config = None if config is None else load_config(config)
            self.offload, opts = resolve_offload(self.file, opts, config=self.config,
                                                 offload=offload, gpu_device=device)
            self.tokenizer = Tokenizer.from_gguf(self.path)
            self.run = build_run(self.file, self.offload, opts, progress=progress)
        except BaseException:
            self.file.close()
            raise
        self.settings = self.offload.settings
        self.verbose = verbose
        self.stats = RunStats(allocator_plans=sum(1 for _ in self.run.scheds()))
        self._graphs: OrderedDict[tuple, _BuiltGraph] = OrderedDict()   # (params, sched) ->
        self._seq_pos = [0] * self.n_seq_max
        self._seq_epoch = [0] * self.n_seq_max    # bumped by every change of a sequence from outside
        self.last_finish_reason: str | None = None    # of the last generation that ended
        # called as on_ubatch(tokens_done, tokens_total) after each ubatch of an eval of more
        # than one ubatch (a progress bar for long prompts; None: nothing)
        self.on_ubatch = None
        self._seq_tokens: list[list[int]] = [[] for _ in range(self.n_seq_max)]   # what each holds
        self._chat_templates: dict = {}
        self.speculator: Speculator | None = None
        # speculators of draft models by DraftModel.key (file, options): a draft named again
        # (generate(draft=path), create_completion) is the one already open, not reopened
        self._speculators: dict[tuple, Speculator] = {}
        if draft is not None:
            try:
                self.speculator = Speculator(self, draft)
            except BaseException:
                self.run.close()
                self.file.close()
                raise
            key = draft.key() if isinstance(draft, DraftModel) else None
            if key is not None:
                self._speculators[key] = self.speculator
        self.stats.t_load_s = time.perf_counter() - t0

    # the run's parts (pyggml.llm.setup.Run) under the names users know
    path = property(lambda self: self.file.path)
    model = property(lambda self: self.file.model)
    hparams = property(lambda self: self.file.hparams)
    weights = property(lambda self: self.run.weights)
    weight_buffers = property(lambda self: self.run.weight_buffers)
    kv = property(lambda self: self.run.kv)
    sched = property(lambda self: self.run.sched)
    backends = property(lambda self: self.run.backends)
    backend = property(lambda self: self.run.cpu)
    n_ctx = property(lambda self: self.run.opts.n_ctx)
    n_batch = property(lambda self: self.run.opts.n_batch)
    n_ubatch = property(lambda self: self.run.opts.n_ubatch)
    n_seq_max = property(lambda self: self.run.opts.n_seq_max)
    logits_all = property(lambda self: self.run.opts.logits_all)
    flash_attn = property(lambda self: self.run.opts.flash_attn)

    # ---- text ------------------------------------------------------------------------------
    def tokenize(self, text: str | bytes, add_special: bool = True,
                 parse_special: bool = True) -> list[int]:
        """Token ids of `text` (BOS per the model; special-token texts parsed, as llama.cpp's
        completion does). bytes and str that are not valid UTF-8 are taken as llama.cpp takes
        bytes (pyggml.llm.tokenizer). Works after close()."""
        check_flag("add_special", add_special)
        check_flag("parse_special", parse_special)
        return self.tokenizer.encode(text, add_special=add_special, parse_special=parse_special)

    def detokenize(self, ids, special: bool = False) -> str:
        """Text of token ids (invalid UTF-8 as U+FFFD). Works after close()."""
        check_flag("special", special)
        return self.tokenizer.decode(token_list(ids, "ids"), special=special)

    # ---- lifetime ----------------------------------------------------------------------------
    def _check_open(self) -> None:
        if self._closed:
            raise ClosedError(f"this LLM ({os.path.basename(self.path)}) was closed: create a "
                              f"new one")

    # ---- memory ----------------------------------------------------------------------------
    def compute_buffer_size(self, device: str | None = None) -> int:
        """Bytes of the planned compute buffers (intermediate tensors of the worst-case graph),
        of one device or all together."""
        self._check_open()
        return self.run.compute_buffer_size(device)

    def memory_report(self) -> dict:
        self._check_open()
        unique = {id(t): t for t in self.weights.values()}     # a tied output may alias
        return {"weights_bytes": sum(t.nbytes() for t in unique.values()),
                "kv_cache_bytes": self.kv.n_bytes,
                "compute_buffer_bytes": self.compute_buffer_size()}

    # ---- evaluation ------------------------------------------------------------------------
    def reset(self, seq_id: int | None = None) -> None:
        """Forget a sequence's tokens (all sequences with None); its generators are
        invalidated."""
        with self.lock:
            self._check_open()
            if seq_id is None:
                self.kv.clear()
                self._seq_pos = [0] * self.n_seq_max
                self._seq_tokens = [[] for _ in range(self.n_seq_max)]
                self._seq_epoch = [e + 1 for e in self._seq_epoch]
            else:
                seq_id = self._check_seq(seq_id)
                self.kv.seq_rm(seq_id)
                self._seq_pos[seq_id] = 0
                self._seq_tokens[seq_id] = []
                self._seq_epoch[seq_id] += 1
            if self.speculator is not None:         # the draft's copy goes too
                for sid in range(self.n_seq_max) if seq_id is None else (seq_id,):
                    self.speculator.draft.forget_after(sid, 0)

    def _check_seq(self, seq_id) -> int:
        if not is_int(seq_id):
            raise ArgumentTypeError(f"seq_id must be an integer in [0, {self.n_seq_max}), got "
                                    f"{type(seq_id).__name__} {seq_id!r}")
        if not 0 <= seq_id < self.n_seq_max:
            raise ModelError(f"seq_id must be in [0, {self.n_seq_max}) (n_seq_max), got {seq_id!r}")
        return int(seq_id)

    def _check_tokens(self, tokens, what: str = "tokens") -> list[int]:
        tokens = token_list(tokens, what)
        if not tokens:
            raise ModelError(f"empty prompt: {what} has no token, at least one is needed")
        V = self.hparams.n_vocab
        bad = [t for t in tokens if not 0 <= t < V]
        if bad:
            raise ModelError(f"token ids outside the vocabulary [0, {V}): {bad[:5]}")
        return tokens

    def _free_cells(self) -> int:
        return self.n_ctx - self.kv.n_used()

    def eval(self, tokens, seq_id: int = 0) -> np.ndarray:
        """Append `tokens` to sequence `seq_id` and return the logits: float32 [n_vocab] of the
        last token, or [n_tokens, n_vocab] with logits_all. Invalidates the sequence's
        generators."""
        seq_id = self._check_seq(seq_id)
        return self._decode_checked([(self._check_tokens(tokens), seq_id)])[seq_id]

    def decode_batch(self, seqs: list[tuple[list[int], int]],
                     all_logits=()) -> dict[int, np.ndarray]:
        """Append tokens to several sequences in one batch: [(tokens, seq_id), ...], each
        sequence once. Returns {seq_id: logits of its last token} ([n, n_vocab] per sequence
        with logits_all, and for the seq_ids in `all_logits`: a speculative round verifies
        every drafted token in one batch). ContextOverflowError (nothing changed) when the
        cache lacks room. Invalidates the generators of these sequences."""
        if not isinstance(seqs, (list, tuple)) or not seqs:
            raise ArgumentTypeError(f"decode_batch takes a non-empty list of (tokens, seq_id) "
                                    f"pairs, got {type(seqs).__name__} {seqs!r:.60}")
        checked = []
        for i, item in enumerate(seqs):
            if not isinstance(item, (list, tuple)) or len(item) != 2:
                raise ArgumentTypeError(f"decode_batch: seqs[{i}] must be a (tokens, seq_id) "
                                        f"pair, got {type(item).__name__} {item!r:.60}")
            checked.append((self._check_tokens(item[0]), self._check_seq(item[1])))
        sids_given = [sid for _, sid in checked]
        if len(set(sids_given)) != len(sids_given):
            raise ModelError(f"decode_batch: each sequence at most once per batch, got seq_ids "
                             f"{sids_given}")
        return self._decode_checked(checked, frozenset(int(s) for s in all_logits))

    def _decode_checked(self, seqs: list[tuple[list[int], int]],
                        all_rows: frozenset = frozenset()) -> dict[int, np.ndarray]:
        """decode_batch of checked input (eval: one sequence, without the batch checks)."""
        with self.lock:
            self._check_open()
            for _, sid in seqs:
                self._seq_epoch[sid] += 1
            return self._decode_locked(seqs, all_rows)

    def _decode_locked(self, seqs: list[tuple[list[int], int]],
                       all_rows: frozenset = frozenset()) -> dict[int, np.ndarray]:
        """decode_batch of checked input; the caller holds the lock. all_rows: sequences whose
        every row is returned ([n, n_vocab])."""
        toks, pos, sids, want = [], [], [], []
        for tokens, sid in seqs:
            p0 = self._seq_pos[sid]
            toks += tokens
            pos += range(p0, p0 + len(tokens))
            sids += [sid] * len(tokens)
            want += [self.logits_all or sid in all_rows] * (len(tokens) - 1) + [True]
        if len(toks) > self._free_cells():
            raise ContextOverflowError(f"context overflow: {len(toks)} new tokens but "
                                       f"{self._free_cells()} of n_ctx={self.n_ctx} KV cells are "
                                       f"free; reset a sequence or use a larger n_ctx")
        toks, pos = np.asarray(toks, np.int32), np.asarray(pos, np.int32)
        sids, want = np.asarray(sids, np.int64), np.asarray(want, bool)
        rows = []
        snapshot = (self.kv.snapshot(), list(self._seq_pos))
        try:
            for i in range(0, len(toks), self.n_ubatch):
                sl = slice(i, i + self.n_ubatch)
                rows.append(self._decode_ubatch(toks[sl], pos[sl], sids[sl], want[sl]))
                if self.on_ubatch is not None and len(toks) > self.n_ubatch:
                    self.on_ubatch(min(i + self.n_ubatch, len(toks)), len(toks))
        except BaseException:
            # leave the cache as it was: the model stays usable after an error
            self.kv.restore(snapshot[0])
            self._seq_pos = snapshot[1]
            raise
        for tokens, sid in seqs:
            self._seq_pos[sid] += len(tokens)
            self._seq_tokens[sid] += [int(t) for t in tokens]
        logits = np.concatenate(rows) if len(rows) > 1 else rows[0]
        if len(seqs) == 1:          # no selection: no second copy of (maybe large) logits
            sid = seqs[0][1]
            return {sid: logits if self.logits_all or sid in all_rows else logits[-1]}
        out_sids = sids[want]
        result = {}
        for _, sid in seqs:
            sel = logits[out_sids == sid]
            result[sid] = sel if self.logits_all or sid in all_rows else sel[-1]
        return result

    def _decode_ubatch(self, toks, pos, sids, want) -> np.ndarray:
        T = len(toks)
        cells = self.kv.place(pos, sids, atomic=False)     # _decode_locked restores on errors
        n_kv = self.kv.n_kv()
        out_ids = np.flatnonzero(want).astype(np.int32)
        n_wanted = len(out_ids)
        if n_wanted == 0:       # keep the topology of a full ubatch: compute one row, drop it
            out_ids = np.array([T - 1], np.int32)
        gp = GraphParams(T, len(out_ids), n_kv["full"], n_kv.get("swa", 0))
        self.stats.ubatch_sizes.append(T)
        sched = self.sched["decode" if T == 1 else "prefill"]
        key = (gp, id(sched))
        built = self._graphs.get(key)
        if built is not None and built.sched is sched and sched.holds(built.graph):
            self._graphs.move_to_end(key)
            self.stats.graphs_reused += 1
        else:
            g, inp, logits = self.run.build_graph(gp)
            before = sched.n_reserves
            pin_phase_ops(sched, g, self.offload, "decode" if T == 1 else "prefill", self.weights,
                          n_tokens=T)
            sched.alloc_graph(g)
            self.stats.allocator_plans += sched.n_reserves - before
            views = self._input_views(inp, T)
            built = self._graphs[key] = _BuiltGraph(gp, g, logits, views, sched)
            while len(self._graphs) > GRAPHS_KEPT:
                self._graphs.popitem(last=False)
            self.stats.graphs_built += 1
        g, logits, views = built.graph, built.logits, built.views
        self._write_inputs(views, toks, pos, sids, cells, out_ids, n_kv)
        self.backend.set_n_threads(self.backend.n_threads if T == 1 else self.backend.n_threads_batch)
        sched.graph_compute(g)
        V = self.hparams.n_vocab
        if is_host_tensor(logits):
            out = host_array(logits).reshape(len(out_ids), V)[:n_wanted].copy()
        else:
            out = tensor_get_into(logits, np.empty((n_wanted, V), np.float32))
        # NaN or +inf anywhere makes the maximum non-finite: one pass over the logits (1 MiB a
        # token for a 262K vocabulary, read from memory) instead of isfinite's two and a mask;
        # -inf alone (a token that cannot come) is allowed
        if out.size and not np.isfinite(out.max()):
            raise PyggmlError("the model produced non-finite logits (NaN or +inf)")
        return out

    # ---- prompt prefix reuse ---------------------------------------------------------------
    def seq_tokens(self, seq_id: int = 0) -> list[int]:
        """The tokens sequence `seq_id` holds in the KV cache, in position order."""
        self._check_seq(seq_id)
        return list(self._seq_tokens[seq_id])

    def truncate(self, seq_id: int, n_keep: int) -> None:
        """Keep the first n_keep tokens of a sequence, forget the rest (positions >= n_keep);
        its generators are invalidated."""
        seq_id = self._check_seq(seq_id)
        with self.lock:
            self._check_open()
            if not is_int(n_keep) or not 0 <= n_keep <= self._seq_pos[seq_id]:
                raise ModelError(f"n_keep must be in [0, {self._seq_pos[seq_id]}] (tokens held "
                                 f"by sequence {seq_id}), got {n_keep!r}")
            self._truncate_locked(seq_id, int(n_keep))
            self._seq_epoch[seq_id] += 1

    def _truncate_locked(self, seq_id: int, n_keep: int) -> None:
        """truncate without invalidating generators: a generation dropping its own rejected
        drafts (pyggml/llm/speculative.py). The caller holds the lock."""
        if n_keep < self._seq_pos[seq_id]:
            self.kv.seq_rm(seq_id, n_keep)
            self._seq_pos[seq_id] = n_keep
            del self._seq_tokens[seq_id][n_keep:]

    def reuse_prefix(self, ids: list[int], seq_id: int = 0) -> int:
        """Prepare sequence seq_id to evaluate prompt `ids`: keep the KV cells of the longest
        common prefix with what it holds, forget the rest. Returns the tokens kept: evaluate
        ids[n:] next. At least the last two prompt tokens are evaluated again: the last one's
        logits are needed, and with a single row the matmuls take the one-row path, whose
        rounding differs from the multi-row path for some formats (Q4_1's block sums), so a
        reused prompt would not give exactly the tokens of a fresh one. Sliding-window layers:
        when cells the window needs for the shorter prefix were already dropped, nothing is
        kept (llama.cpp does the same)."""
        seq_id = self._check_seq(seq_id)
        with self.lock:
            held = self._seq_tokens[seq_id]
            n = 0
            for a, b in zip(held, ids[:-2]):
                if a != b:
                    break
                n += 1
            if n > 0 and not self.kv.can_keep_prefix(seq_id, n):
                n = 0
            self.truncate(seq_id, n)
            self.stats.n_prompt_reused += n
        return n

    # ---- completions (llama-cpp-python's API; pyggml/llm/completion.py) --------------------
    def get_chat_template(self, spec=None):
        """The chat template: `spec` (a built-in name such as 'chatml' or 'gemma', or a Jinja
        file), else the model's tokenizer.chat_template; ChatTemplateError when there is none."""
        from pyggml.llm.chat import load_chat_template
        key = None if spec is None else os.fspath(spec)
        if key not in self._chat_templates:
            tok = self.tokenizer
            text = lambda i: tok.decode([i], special=True) if i is not None else ""   # noqa: E731
            self._chat_templates[key] = load_chat_template(
                key, self.model.get("tokenizer.chat_template"), text(tok.bos_id),
                text(tok.eos_id))
        return self._chat_templates[key]

    def create_completion(self, prompt, max_tokens: int | None = 16, **kw):
        """As llama-cpp-python's: temperature, top_p, top_k, min_p, repeat_penalty, seed,
        stop, logprobs, echo, stream, seq_id, draft (see
        pyggml.llm.completion.create_completion)."""
        from pyggml.llm.completion import create_completion
        return create_completion(self, prompt, max_tokens=max_tokens, **kw)

    def create_chat_completion(self, messages, **kw):
        """As llama-cpp-python's: chat_template, max_tokens, temperature, top_p, top_k, min_p,
        repeat_penalty, seed, stop, logprobs, top_logprobs, stream, seq_id, draft."""
        from pyggml.llm.completion import create_chat_completion
        return create_chat_completion(self, messages, **kw)

    @staticmethod
    def _input_views(inp, T: int) -> dict:
        """numpy views of a placed graph's input tensors (host memory), by input name."""
        views = {name: host_array(getattr(inp, name)).reshape(-1)
                 for name in ("tokens", "pos", "kv_idxs", "kv_idxs_swa", "out_ids")
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
        if "mask" in views:
            self.kv.mask_into("full", views["mask"], pos, sids)
        if "mask_swa" in views:
            sp = "swa" if "swa" in n_kv else "full"
            self.kv.mask_into(sp, views["mask_swa"], pos, sids, self.hparams.sliding_window)

    def embed(self, texts, pooling: str = "mean", normalize: bool = True, seq_id: int = 0):
        """Embeddings (final normed hidden state, mean or last-token pooled, L2-normalized):
        one list of floats per text (pyggml/llm/embedding.py). Uses and frees seq_id."""
        from pyggml.llm.embedding import embed
        return embed(self, texts, pooling, normalize, seq_id)

    # ---- generation ------------------------------------------------------------------------
    def generate(self, prompt: str | bytes | list[int], max_tokens: int = 128, *,
                 temperature: float = 0.8, top_k: int = 40, top_p: float = 0.95,
                 min_p: float = 0.05, repeat_penalty: float = 1.0, seed: int = DEFAULT_SEED,
                 seq_id: int = 0, stop_at_eog: bool = True, draft=None) -> Generation:
        """A fresh completion of `prompt` in seq_id (the sequence is reset now), as an iterator
        of Token (see Generation for finish_reason and invalidation). max_tokens -1: until an
        end-of-generation token or a full context. seed -1 or 0xFFFFFFFF: a random seed
        (llama.cpp); temperature <= 0: greedy. The prompt is evaluated at the first next().
        draft: speculative decoding (None: the LLM's draft_model, if any; False: none; or a
        PromptLookup / DraftModel / a draft model's GGUF path, opened once and kept: see
        speculator_for): the same tokens as without for greedy, the same
        distribution when sampling (pyggml/llm/speculative.py)."""
        params = SamplingParams(temperature, top_k, top_p, min_p, repeat_penalty, 64,
                                seed).validate()
        max_tokens = check_int("max_tokens", max_tokens, -1,
                               hint=" (-1: until end of generation or a full context)")
        check_flag("stop_at_eog", stop_at_eog)
        seq_id = self._check_seq(seq_id)
        if isinstance(prompt, (str, bytes, bytearray, memoryview)):
            ids = self.tokenize(prompt)
        else:
            ids = token_list(prompt, "prompt")
        ids = self._check_tokens(ids, "prompt")
        with self.lock:
            self.reset(seq_id)
            epoch = self._seq_epoch[seq_id]
            if len(ids) > self._free_cells():
                raise ContextOverflowError(
                    f"the prompt has {len(ids)} tokens but only {self._free_cells()} of "
                    f"n_ctx={self.n_ctx} KV cells are free: use a larger n_ctx or a shorter "
                    f"prompt")
        sampler = Sampler(params)
        for t in ids:
            sampler.accept(t)
        spec = self.speculator_for(draft)
        if spec is not None:
            spec.reset_seq(seq_id)
        gen = Generation()
        gen._it = self._generate(gen, ids, max_tokens, sampler, seq_id, stop_at_eog, epoch, spec)
        return gen

    def speculator_for(self, draft=None) -> Speculator | None:
        """The Speculator of a call's `draft` argument: None: the LLM's own (draft_model);
        False: none; a PromptLookup / DraftModel (or 'lookup', a path). A draft model on a
        file is opened once per (file, options) and kept (closed with this LLM): a later call
        naming the same file and options reuses it, and so does one naming the LLM's own."""
        if draft is None:
            return self.speculator
        if draft is False:
            return None
        d = as_draft(draft)
        key = d.key() if hasattr(d, "key") else None
        if key is None:
            return Speculator(self, d)
        with self.lock:
            self._check_open()
            spec = self._speculators.get(key)
            if spec is None:
                spec = self._speculators[key] = Speculator(self, d)
            else:
                spec.draft.bind(self)       # opens it again if its user closed it
            return spec

    def _check_generation(self, seq_id: int, epoch: int) -> None:
        if self._closed:
            raise ClosedError(f"this LLM ({os.path.basename(self.path)}) was closed: its "
                              f"generations cannot continue")
        if self._seq_epoch[seq_id] != epoch:
            raise GeneratorInvalidatedError(
                f"sequence {seq_id} was changed after this generation started (a newer "
                f"generate, reset, eval or decode_batch on it): its cache no longer holds this "
                f"generation's tokens; start a new generate")

    def _step(self, tokens: list[int], seq_id: int, epoch: int,
              all_rows: bool = False) -> np.ndarray | None:
        """Logits after appending `tokens` to the generation's sequence (all_rows: float32
        [len(tokens), n_vocab], else the last row); None when the cache is full (a sequence of
        another thread may take the last cells between two steps)."""
        with self.lock:
            self._check_generation(seq_id, epoch)
            if len(tokens) > self._free_cells():
                return None
            logits = self._decode_locked([(tokens, seq_id)],
                                         frozenset((seq_id,)) if all_rows else frozenset())
            logits = logits[seq_id]
        if all_rows:
            return logits.reshape(len(tokens), -1)
        return logits[-1] if logits.ndim == 2 else logits

    def _generate(self, gen: Generation, ids, max_tokens, sampler, seq_id, stop_at_eog,
                  epoch, spec: Speculator | None = None) -> Iterator[Token]:
        def finish(reason: str) -> None:
            gen.finish_reason = self.last_finish_reason = reason

        # advance(tok): evaluate tok, return the next token (None: no cell for tok). With a
        # draft, a round yields several tokens at once: they queue here, and `ahead` counts
        # the cells this sequence holds beyond what plain decoding would, so the context-full
        # decision and the cells kept at the end are plain decoding's.
        queue: deque[int] = deque()
        n_advanced = 0

        def advance(tok: int) -> int | None:
            nonlocal n_advanced
            n_advanced += 1
            if queue:
                return queue.popleft()
            if spec is None:
                logits = self._step([tok], seq_id, epoch)
                if logits is None:
                    return None
                nxt = sampler.sample(logits)
                sampler.accept(nxt)
                return nxt
            cap = self._free_cells() - 1
            if max_tokens > 0:
                cap = min(cap, max_tokens - n - 1)
            res = spec.round(seq_id, tok, sampler, cap,
                             lambda t: self._step(t, seq_id, epoch, all_rows=True))
            if res is None:
                return None
            queue.extend(t for t, _ in res)
            return queue.popleft()

        def ahead() -> int:
            return self._seq_pos[seq_id] - (len(ids) + n_advanced)

        t0 = time.perf_counter()
        logits = self._step(ids, seq_id, epoch)
        if logits is None:      # another sequence took the cells since generate()
            raise ContextOverflowError(f"the prompt's {len(ids)} tokens no longer fit: other "
                                       f"sequences use the KV cache (n_ctx={self.n_ctx})")
        if spec is not None:
            spec.prefill(seq_id, ids)
        self.stats.t_prompt_s += time.perf_counter() - t0
        self.stats.n_prompt_tokens += len(ids)
        t1 = time.perf_counter()
        stream, n = TextStream(), 0
        is_eog, piece = self.tokenizer.is_eog, self.tokenizer.token_to_piece
        try:
            if max_tokens == 0:
                finish("length")
                return
            tok = sampler.sample(logits)
            sampler.accept(tok)
            while True:
                if stop_at_eog and is_eog(tok):
                    finish("stop")      # nothing is pending here: see the lookahead below
                    return
                n += 1
                self.stats.n_gen_tokens += 1
                text = stream.push(piece(tok))
                if 0 < max_tokens <= n:
                    finish("length")
                    yield Token(tok, text + stream.flush())
                    return
                with self.lock:
                    self._check_generation(seq_id, epoch)
                    full = self._free_cells() + ahead() < 1
                if full:
                    finish("context")
                    yield Token(tok, text + stream.flush())
                    return
                if stream.pending:
                    # bytes of an unfinished character: whether they ever finish depends on the
                    # next token, so compute it before handing this one out (its text is
                    # incomplete anyway); an end there flushes them as U+FFFD into this token
                    nxt = advance(tok)
                    if nxt is None or (stop_at_eog and is_eog(nxt)):
                        finish("context" if nxt is None else "stop")
                        yield Token(tok, text + stream.flush())
                        return
                    yield Token(tok, text)
                    tok = nxt
                    continue
                yield Token(tok, text)
                nxt = advance(tok)
                if nxt is None:
                    finish("context")
                    return
                tok = nxt
        finally:
            self.stats.t_gen_s += time.perf_counter() - t1
            if spec is not None:            # drop the cells of drafts kept past the end
                with self.lock:
                    if not self._closed and self._seq_epoch[seq_id] == epoch:
                        self._truncate_locked(seq_id, len(ids) + n_advanced)

    def close(self) -> None:
        """Free the backends and the model file (see the class docstring); idempotent."""
        with self.lock:
            if self._closed:
                return
            self._closed = True
            for spec in {id(s): s for s in [self.speculator, *self._speculators.values()]
                         if s is not None}.values():
                spec.close()
            self._speculators.clear()
            self.run.close()
            self.file.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
