"""`LLM`: load a GGUF model and run it — the public entry point of pyggml for text generation.

A facade over three layers: the model file and its run (pyggml/llm/setup.py: weights,
backends, KV cache, schedulers), a `Context` that decodes batches and keeps the sequences
(pyggml/llm/context.py), and the one generation loop (pyggml/llm/generate.py); completions in
OpenAI's shapes are in pyggml/llm/completion.py, embeddings in pyggml/llm/embedding.py.
"""

from __future__ import annotations

import os
import time
from dataclasses import replace

import numpy as np

from pyggml.errors import ArgumentTypeError, ContextOverflowError, ModelError
from pyggml.llm.context import Context, RunStats  # noqa: F401 - RunStats: part of the API
from pyggml.llm.generate import Generation, Tokens
from pyggml.llm.grammar import constraint_for, request_spec
from pyggml.llm.lora import check_specs, load_adapters
from pyggml.llm.options import check_flag, check_int, token_list, validate_options
from pyggml.llm.sampler import DEFAULT_SEED
from pyggml.llm.setup import DEFAULTS, ModelFile, RunOptions, build_run, resolve_offload
from pyggml.llm.speculative import DraftModel, Speculator, as_draft
from pyggml.llm.tokenizer import Tokenizer
from pyggml.offload import OffloadPlan
from pyggml.offload.config import load_config


class LLM:
    """A GGUF language model ready to run.

    model_path: a GGUF file (None: the embedded default model, Gemma 3 270M Q4_K_M).
    n_ctx: KV cells (shared by all sequences; 0: the model's trained context); n_batch: tokens
    per eval call chunk; n_ubatch: tokens per graph; n_threads / n_threads_batch: decode /
    prompt threads; n_seq_max: sequences decoded together; type_k/type_v: KV cache types (f16,
    f32, bf16, q8_0, q4_0, q4_1, q5_0, q5_1, iq4_nl; quantized ones rotated as llama.cpp's);
    logits_all: keep logits for every position (else the last of each eval only);
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
    --draft-min; for a path or 'lookup');
    lora: LoRA adapters in llama.cpp's GGUF format (pyggml/llm/lora.py): a path, or a list of
    paths and (path, scale) pairs (scale default 1.0), checked against the model before
    anything is allocated (LoraError names the file and tensor); lora_init_without_apply:
    load them with every scale 0 (llama.cpp's --lora-init-without-apply), to be applied by
    set_lora_scales. `lora_adapters` lists them;
    use_mmap: the weights the CPU computes with stay mapped from the file (True), are read into
    host memory (False), or None: read when the kernel gives that memory huge pages and it fits
    (faster decode; pyggml.llm.setup.host_weights_copied).
    `config` afterwards: the loaded Config the run was made from (None: made from n_gpu_layers
    or an OffloadPlan).
    Defaults: pyggml.llm.setup.RunOptions (the one table of them, shared with the CLI).
    A KV cache larger than the available memory is refused before anything is allocated
    (InsufficientMemoryError, with the n_ctx that would fit).

    Layers: `context` (pyggml/llm/context.py) decodes and keeps the sequences; a generation
    (pyggml/llm/generate.py) samples on top of it; this class opens the file and joins them.

    Threads: one LLM may be shared. Evaluation is serialized by `lock` (the context's
    re-entrant lock): eval, decode_batch, reset, generate and each step of a generation hold
    it, so calls from several threads run one after another, never interleaved inside the
    engine. Hold `with llm.lock:` yourself to make several calls atomic (reset then eval).
    Generators of different sequences (seq_id, n_seq_max > 1) may be consumed by different
    threads; a generator is invalidated by any other change of its sequence (GeneratorInvalidatedError).
    tokenize and detokenize need no lock (the vocabulary is read-only).

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
                 draft_max: int | None = None, draft_min: int | None = None,
                 chat_template=None, embedding: bool = False, lora=None,
                 lora_init_without_apply: bool = False, use_mmap: bool | None = None):
        t0 = time.perf_counter()
        if chat_template is not None and not isinstance(chat_template, (str, os.PathLike)):
            raise ArgumentTypeError(f"chat_template must be a built-in name or a Jinja file, "
                                    f"got {type(chat_template).__name__} {chat_template!r:.60}")
        check_flag("embedding", embedding)
        check_flag("lora_init_without_apply", lora_init_without_apply)
        lora_specs = check_specs(lora)
        check_flag("use_mmap", use_mmap, none_ok=True)
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
                          n_draft=draft.n_max if draft is not None else 0, use_mmap=use_mmap)
        self.file = ModelFile(model_path)
        self._adapters: list = []
        try:
            # checked against the model before anything is allocated; all or nothing
            self._adapters = load_adapters(lora_specs, self.file)
            # loaded once and kept: what the run was made from (the served plan describes it)
            self.config = None if config is None else load_config(config)
            self.offload, opts = resolve_offload(self.file, opts, config=self.config,
                                                 offload=offload, gpu_device=device)
            self.tokenizer = Tokenizer.from_gguf(self.path)
            self.run = build_run(self.file, self.offload, opts, progress=progress,
                                 loras=self._adapters)
        except BaseException:
            for ad in self._adapters:
                ad.close()
            self.file.close()
            raise
        self.context = Context(self.run, self.offload, self.path)
        if lora_specs:
            self.context.set_lora_scales([0.0 if lora_init_without_apply else s
                                          for _, s in lora_specs])
        self.settings = self.offload.settings
        self.verbose = verbose
        self.last_finish_reason: str | None = None    # of the last generate that ended
        self._chat_templates: dict = {}
        # chat completions' template when a call names none (None: the model's own)
        self.chat_template = None if chat_template is None else os.fspath(chat_template)
        self.embedding = embedding              # llama-cpp-python's flag: embed() works anyway
        self.cache = None                       # a prompt cache (set_cache; pyggml/llm/state.py)
        self.speculator: Speculator | None = None
        # speculators of draft models by DraftModel.key (file, options): a draft named again
        # (generate(draft=path), create_completion) is the one already open, not reopened
        self._speculators: dict[tuple, Speculator] = {}
        if draft is not None:
            try:
                self.speculator = Speculator(self, draft)
            except BaseException:
                self.context.close()
                self.file.close()
                raise
            if isinstance(draft, DraftModel) and draft.key() is not None:
                self._speculators[draft.key()] = self.speculator
        if self.chat_template is not None:      # a bad name or file: now, not at the first chat
            try:
                self.get_chat_template()
            except BaseException:
                self.close()
                raise
        self.stats.t_load_s = time.perf_counter() - t0

    # the run's parts (pyggml.llm.setup.Run) and the context's, under the names users know
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
    lock = property(lambda self: self.context.lock)
    stats = property(lambda self: self.context.stats)
    closed = property(lambda self: self.context.closed)

    @property
    def on_ubatch(self):
        """on_ubatch(tokens_done, tokens_total) after each ubatch of a long eval (None)."""
        return self.context.on_ubatch

    @on_ubatch.setter
    def on_ubatch(self, fn) -> None:
        self.context.on_ubatch = fn

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

    # ---- memory ----------------------------------------------------------------------------
    def compute_buffer_size(self, device: str | None = None) -> int:
        """Bytes of the planned compute buffers (intermediate tensors of the worst-case graph),
        of one device or all together."""
        self.context.check_open()
        return self.run.compute_buffer_size(device)

    def memory_report(self) -> dict:
        self.context.check_open()
        unique = {id(t): t for t in self.weights.values()}     # a tied output may alias
        return {"weights_bytes": sum(t.nbytes() for t in unique.values()),
                "kv_cache_bytes": self.kv.n_bytes,
                "compute_buffer_bytes": self.compute_buffer_size()}

    # ---- evaluation and sequences (pyggml/llm/context.py) ----------------------------------
    def eval(self, tokens, seq_id: int = 0) -> np.ndarray:
        """Append `tokens` to sequence `seq_id` and return the logits: float32 [n_vocab] of the
        last token, or [n_tokens, n_vocab] with logits_all. Invalidates the sequence's
        generators."""
        ctx = self.context
        seq_id = ctx.check_seq(seq_id)
        return ctx.decode([(ctx.check_tokens(tokens), seq_id)])[seq_id]

    def decode_batch(self, seqs: list[tuple[list[int], int]],
                     all_logits=()) -> dict[int, np.ndarray]:
        """Append tokens to several sequences in one batch: [(tokens, seq_id), ...], each
        sequence once. Returns {seq_id: logits of its last token} ([n, n_vocab] per sequence
        with logits_all, and for the seq_ids in `all_logits`: a speculative round verifies
        every drafted token in one batch). ContextOverflowError (nothing changed) when the
        cache lacks room. Invalidates the generators of these sequences."""
        return self.context.decode_batch(seqs, all_logits)

    def reset(self, seq_id: int | None = None) -> None:
        """Forget a sequence's tokens (all sequences with None); its generators are
        invalidated."""
        with self.lock:
            self.context.seq_reset(seq_id)
            if self.speculator is not None:         # the draft's copy goes too
                for sid in range(self.n_seq_max) if seq_id is None else (seq_id,):
                    self.speculator.draft.forget_after(sid, 0)

    def seq_tokens(self, seq_id: int = 0) -> list[int]:
        """The tokens sequence `seq_id` holds in the KV cache, in position order."""
        return self.context.seq_tokens(seq_id)

    def truncate(self, seq_id: int, n_keep: int) -> None:
        """Keep the first n_keep tokens of a sequence, forget the rest (positions >= n_keep);
        its generators are invalidated."""
        self.context.seq_keep_first(seq_id, n_keep)

    def reuse_prefix(self, ids: list[int], seq_id: int = 0) -> int:
        """Keep the cells of the longest common prefix of `ids` with what seq_id holds (see
        Context.reuse_prefix); returns the tokens kept: evaluate ids[n:] next."""
        return self.context.reuse_prefix(ids, seq_id)

    # ---- LoRA adapters (pyggml/llm/lora.py) ---------------------------------------------------
    @property
    def lora_adapters(self) -> list[dict]:
        """The loaded adapters as llama-server's GET /lora-adapters lists them: id, path,
        scale (the global one), task_name, prompt_prefix."""
        return [{"id": i, "path": ad.path, "scale": s, "task_name": ad.task_name,
                 "prompt_prefix": ad.prompt_prefix}
                for i, (ad, s) in enumerate(zip(self.context.adapters,
                                                self.context.lora_scales))]

    def set_lora_scales(self, scales) -> None:
        """The global LoRA scales: a list with one number per adapter, or {id: scale} where an
        adapter not named gets 0 (llama-server's POST /lora-adapters). 0: not applied. Cells
        computed under other scales are not reused (Context.reuse_prefix)."""
        n = len(self.context.adapters)
        if isinstance(scales, dict):
            for i in scales:
                if isinstance(i, bool) or not isinstance(i, int) or not 0 <= i < n:
                    raise ModelError(f"LoRA adapter id {i!r}: no such adapter ({n} loaded, ids "
                                     f"0..{n - 1})" if n else
                                     f"LoRA adapter id {i!r}: no adapter is loaded (LLM(lora=...))")
            scales = [scales.get(i, 0.0) for i in range(n)]
        self.context.set_lora_scales(scales)

    # ---- saved states and prompt caches (pyggml/llm/state.py) -------------------------------
    def save_state(self, seq_id: int = 0):
        """A LlamaState of sequence seq_id: its tokens, KV cells (and recurrent state), to
        load_state into this model later, into any sequence."""
        from pyggml.llm.state import save_state
        return save_state(self, seq_id)

    def load_state(self, state, seq_id: int = 0) -> None:
        """Make seq_id hold a saved state (StateError when it is another model's); what it held
        goes and its generators are invalidated."""
        from pyggml.llm.state import load_state
        load_state(self, state, seq_id)

    def set_cache(self, cache) -> None:
        """A prompt cache (pyggml.llm.state.LlamaRAMCache / LlamaDiskCache, None: none) that
        create_completion and create_chat_completion restore states from and save them to."""
        self.cache = cache

    # ---- completions (llama-cpp-python's API; pyggml/llm/completion.py) --------------------
    def get_chat_template(self, spec=None):
        """The chat template: `spec` (a built-in name such as 'chatml' or 'gemma', or a Jinja
        file), else LLM(chat_template=), else the model's tokenizer.chat_template;
        ChatTemplateError when there is none."""
        from pyggml.llm.chat import load_chat_template
        if spec is None:
            spec = self.chat_template
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

    def embed(self, texts, pooling: str = "mean", normalize: bool = True, seq_id: int = 0):
        """Embeddings (final normed hidden state, mean or last-token pooled, L2-normalized):
        one list of floats per text (pyggml/llm/embedding.py). Uses and frees seq_id."""
        from pyggml.llm.embedding import embed
        return embed(self, texts, pooling, normalize, seq_id)

    # ---- generation (pyggml/llm/generate.py) -----------------------------------------------
    def generate(self, prompt: str | bytes | list[int], max_tokens: int = 128, *,
                 temperature: float = 0.8, top_k: int = 40, top_p: float = 0.95,
                 min_p: float = 0.05, repeat_penalty: float = 1.0, seed: int = DEFAULT_SEED,
                 seq_id: int = 0, stop_at_eog: bool = True, draft=None,
                 grammar=None, **sampling) -> Tokens:
        """A fresh completion of `prompt` in seq_id (the sequence is reset now), as an iterator
        of Token with a finish_reason (pyggml.llm.generate.Tokens: 'stop', 'length' or
        'context'). max_tokens -1: until an end-of-generation token or a full context. seed
        -1 or 0xFFFFFFFF: a random seed (llama.cpp); temperature <= 0: greedy. The other
        sampling keywords: pyggml.llm.completion.sampling_params's (typical_p, mirostat_mode,
        xtc_*, dry_*, penalties, logit_bias, ...). The prompt is
        evaluated at the first next(). draft: speculative decoding (None: the LLM's
        draft_model, if any; False: none; or a PromptLookup / DraftModel / a draft model's GGUF
        path, opened once and kept: see speculator_for): the same tokens as without for
        greedy, the same distribution when sampling (pyggml/llm/speculative.py). Resuming
        raises ClosedError after close(), GeneratorInvalidatedError once anything else changed
        the sequence (a newer generate, reset, eval or decode_batch on it). grammar: a
        pyggml.llm.grammar.GrammarSpec (or GBNF text) the output is constrained to."""
        from pyggml.llm.completion import check_sampling_keywords, sampling_params
        check_sampling_keywords("generate", sampling)
        params = replace(sampling_params(temperature=temperature, top_k=top_k, top_p=top_p,
                                         min_p=min_p, repeat_penalty=repeat_penalty,
                                         **sampling), seed=seed).validate()
        max_tokens = check_int("max_tokens", max_tokens, -1,
                               hint=" (-1: until end of generation or a full context)")
        check_flag("stop_at_eog", stop_at_eog)
        ctx = self.context
        seq_id = ctx.check_seq(seq_id)
        if isinstance(prompt, (str, bytes, bytearray, memoryview)):
            ids = self.tokenize(prompt)
        else:
            ids = token_list(prompt, "prompt")
        ids = ctx.check_tokens(ids, "prompt")
        gen = Generation(self.tokenizer, ids, max_tokens, params, stop_at_eog=stop_at_eog,
                         token_filter=constraint_for(self, request_spec(grammar)),
                         seq_id=seq_id, reuse_prefix=False)
        spec = self.speculator_for(draft)
        with self.lock:
            self.reset(seq_id)      # the draft's copy of the sequence goes too
            gen.start(ctx, spec)
            if len(ids) > ctx.free_cells():
                raise ContextOverflowError(
                    f"the prompt has {len(ids)} tokens but only {ctx.free_cells()} of "
                    f"n_ctx={self.n_ctx} KV cells are free: use a larger n_ctx or a shorter "
                    f"prompt")
        return Tokens(ctx, gen, on_end=lambda g: setattr(self, "last_finish_reason",
                                                         g.finish_reason))

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
            self.context.check_open()
            spec = self._speculators.get(key)
            if spec is None:
                spec = self._speculators[key] = Speculator(self, d)
            else:
                spec.draft.bind(self)       # opens it again if its user closed it
            return spec

    # ---- lifetime ----------------------------------------------------------------------------
    def close(self) -> None:
        """Free the backends and the model file (see the class docstring); idempotent."""
        with self.lock:
            if self.context.closed:
                return
            for spec in {id(s): s for s in [self.speculator, *self._speculators.values()]
                         if s is not None}.values():
                spec.close()
            self._speculators.clear()
            self.context.close()
            for ad in self._adapters:
                ad.close()
            self.file.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
