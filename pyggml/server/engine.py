"""Continuous batching: N slots (N sequences of one KV cache), one decode loop in a worker thread.

Each step builds ONE `decode_batch`: the next token of every slot that is generating, plus
prompt tokens of slots being admitted, at most n_ubatch tokens in all (shortest remaining
prompt first, so a short request is not stuck behind a long one), then samples every slot whose
logits came out. Prompt chunks are cut so that a step lasts about `step_target_s` (from the
measured seconds per batch row), and a step that admits a new request's first chunk carries no
chunk of a prompt admitted earlier: a request arriving while a long prompt is evaluated waits
for at most one short step, then gets a step of its own size (time to first token). A new request goes to the free slot holding the longest prefix of its prompt
(those cells are kept, LLM.reuse_prefix); requests beyond the free slots wait in a bounded queue
(full: `QueueFullError`, the server answers 503). A cancelled request frees its slot before the
next step. Events go back to the asyncio side through `loop.call_soon_threadsafe`.

One KV cache, shared by the slots as llama-server's unified cache (`--kv-unified`): a request
may use all of n_ctx while the other slots are idle. Idle slots keep their cells as prefix
caches until the cells are needed (then the least recently used go first). A waiting request
is admitted when its prompt fits in the cells that are free or held by idle slots, besides what
the running prompts still need; when the generating slots need more cells than are left, the
generation holding the most cells ends as if the context were full (finish_reason "length").

Each slot's request is a `pyggml.llm.generate.Generation`, stepped by the one generation loop's
calls (next_input, advance): sampling, stop strings, the end, the cells kept are decided there.
With a draft (LLM(draft_model=...), `serve -md / --lookup`), each generating slot first drafts
(all slots together, pyggml/llm/speculative.py) and puts its last token and drafted tokens into
the same one decode_batch, with logits for every row. A draft model evaluates each prompt chunk right after the model's, in the
same step (timed with it, so the step-time chunks cover both): when a prompt is done, the
draft's cache holds it too, and the first round drafts at once.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections import deque
from dataclasses import dataclass, field

from pyggml.backend.rpc.protocol import RpcError
from pyggml.errors import ContextOverflowError, PyggmlError
from pyggml.llm.generate import Generation, decode_step


#: fewest prompt tokens a step takes: smaller chunks cost prefill speed (Qwen2.5-Coder-1.5B, 2
#: threads, amx path: 1536 prompt tokens in chunks of 128 run at 0.84x the speed of chunks of 512,
#: of 64 at 0.76x), larger ones keep a short request waiting behind a long prompt's chunk (64: its
#: time to first token 1.39x idle, 128: 2.57x; Gemma 3 270M's 250 ms steps take 128 anyway)
MIN_PROMPT_CHUNK = 64


class QueueFullError(PyggmlError):
    """Every slot is busy and the waiting queue is full."""


@dataclass
class Job:
    """One request for the worker. kind: "complete" (gen set) or "embed" (texts set)."""
    kind: str
    loop: asyncio.AbstractEventLoop
    events: asyncio.Queue
    ids: list[int] = field(default_factory=list)
    gen: Generation | None = None
    texts: list | None = None
    pooling: str = "mean"
    cancelled: threading.Event = field(default_factory=threading.Event)
    t_queued: float = field(default_factory=time.perf_counter)
    n_reused: int = 0
    vecs: list = field(default_factory=list)     # embed: the inputs' vectors so far
    n_embedded: int = 0                          # embed: their tokens
    # n > 1 (pyggml/server/choices.py): the further choices of a request with the same prompt
    # are admitted with it, each to a slot of its own, and wait there (their generation not
    # started) until this job's prompt is evaluated; then they share its cells and its last
    # logits (Generation.start_copy): the prompt is evaluated once, as llama-server's n_cmpl
    children: list = field(default_factory=list)
    parent: "Job | None" = None                  # on a further choice: whose prompt it shares

    @property
    def waiting(self) -> bool:
        """A further choice whose parent has not evaluated the prompt yet."""
        return self.gen is not None and self.gen.ctx is None

    def emit(self, *event) -> None:
        try:
            self.loop.call_soon_threadsafe(self.events.put_nowait, event)
        except RuntimeError:         # the event loop is gone (server shutting down)
            pass


@dataclass
class Slot:
    seq_id: int
    job: Job | None = None
    draft_todo: list[int] = field(default_factory=list)   # prompt tokens the draft model has
    #                     yet to evaluate (the generation's todo, and any prefix it lacks)
    started: bool = False                             # a chunk of this job's prompt ran
    last_used: float = 0.0

    @property
    def todo(self) -> list[int]:
        """Prompt tokens of its request still to evaluate."""
        gen = self.job.gen if self.job is not None else None
        return gen.todo if gen is not None else []


class PerSecond:
    """Counts per wall-clock second over the last `seconds` seconds (a ring buffer; add() from
    the worker thread, last() from the HTTP side)."""

    def __init__(self, seconds: int = 60, clock=time.monotonic):
        self.seconds, self.clock = seconds, clock
        self._counts = [0] * seconds
        self._now = int(clock())            # the second _counts[_now % seconds] counts
        self._lock = threading.Lock()

    def _advance(self, now: int) -> None:
        for t in range(self._now + 1, min(now, self._now + self.seconds) + 1):
            self._counts[t % self.seconds] = 0
        self._now = max(self._now, now)

    def add(self, n: int) -> None:
        with self._lock:
            self._advance(int(self.clock()))
            self._counts[self._now % self.seconds] += n

    def last(self) -> list[int]:
        """Counts of the last `seconds` seconds, oldest first; the last one is the current
        (unfinished) second."""
        with self._lock:
            self._advance(int(self.clock()))
            k = self._now + 1
            return [self._counts[(k + i) % self.seconds] for i in range(self.seconds)]


@dataclass
class Metrics:
    requests_total: dict = field(default_factory=dict)      # endpoint -> count
    requests_rejected_total: int = 0                        # 503: queue full
    requests_cancelled_total: int = 0
    prompt_tokens_reused_total: int = 0                     # kept from a slot's prefix cache
    # per-second windows of the two token counters below (the web page's Live view)
    prompt_per_s: PerSecond = field(default_factory=PerSecond, repr=False)
    generated_per_s: PerSecond = field(default_factory=PerSecond, repr=False)
    _prompt: int = 0
    _generated: int = 0
    decode_steps_total: int = 0
    decode_steps_multi_seq_total: int = 0                   # steps with >= 2 sequences
    max_seqs_per_step: int = 0
    decode_seconds_total: float = 0.0
    draft_tokens_total: int = 0                             # speculative decoding: drafted
    draft_accepted_total: int = 0                           # ... and accepted by the model

    # The windows are fed by the counters themselves, so every place that counts tokens (the
    # decode step, speculative decoding) feeds them without knowing about them.
    @property
    def prompt_tokens_total(self) -> int:
        """Prompt tokens evaluated."""
        return self._prompt

    @prompt_tokens_total.setter
    def prompt_tokens_total(self, v: int) -> None:
        self.prompt_per_s.add(v - self._prompt)
        self._prompt = v

    @property
    def generated_tokens_total(self) -> int:
        return self._generated

    @generated_tokens_total.setter
    def generated_tokens_total(self, v: int) -> None:
        self.generated_per_s.add(v - self._generated)
        self._generated = v


class Engine:
    """The worker thread that owns the LLM. submit() from any thread; stop() to end."""

    def __init__(self, llm, n_slots: int, queue_size: int = 64, step_target_s: float = 0.25):
        if not 1 <= n_slots <= llm.n_seq_max:
            raise PyggmlError(f"n_slots {n_slots} must be in 1..n_seq_max ({llm.n_seq_max})")
        if not step_target_s >= 0:
            raise PyggmlError(f"step_target_s must be >= 0 (0: n_ubatch prompt tokens per "
                              f"step), got {step_target_s!r}")
        self.llm = llm
        self.step_target_s = step_target_s
        self.s_per_row: float | None = None     # measured seconds per batch row (moving mean)
        self.slots = [Slot(i) for i in range(n_slots)]
        self.n_ctx_slot = llm.n_ctx         # one unified cache: a request may use all of it
        self.queue_size = queue_size
        self.pending: deque[Job] = deque()
        self.metrics = Metrics()
        self._cv = threading.Condition()
        self._stop = False
        self._thread = threading.Thread(target=self._run, name="pyggml-engine", daemon=True)
        self._thread.start()

    # ---- any thread --------------------------------------------------------------------------
    def submit(self, job: Job) -> None:
        with self._cv:
            if len(self.pending) >= self.queue_size:
                self.metrics.requests_rejected_total += 1
                raise QueueFullError(f"all {len(self.slots)} slots are busy and "
                                     f"{len(self.pending)} requests are waiting")
            self.pending.append(job)
            self._cv.notify()

    def wake(self) -> None:
        with self._cv:
            self._cv.notify()

    def stop(self, timeout_s: float = 10.0) -> None:
        with self._cv:
            self._stop = True
            self._cv.notify()
        self._thread.join(timeout_s)

    def queue_length(self) -> int:
        return len(self.pending)

    def busy_slots(self) -> int:
        return sum(s.job is not None for s in self.slots)

    # ---- worker ------------------------------------------------------------------------------
    def _run(self) -> None:
        while True:
            with self._cv:
                while not self._stop and not self.pending and self.busy_slots() == 0:
                    self._cv.wait(0.5)
                if self._stop:
                    break
                idle_with_requests = bool(self.pending) and self.busy_slots() == 0
            # a backend gone while idle (an rpc-server restarted): reconnect before admitting
            # (outside the lock: submit() from the event loop must not wait for the upload)
            if idle_with_requests and not self._backends_ok():
                continue
            with self._cv:
                self._admit()
            self._drop_cancelled()
            try:
                self._step()
            except Exception as e:             # noqa: BLE001 - the loop must survive anything
                for s in self.slots:
                    if s.job is not None:
                        self._fail(s, 500, f"internal error: {type(e).__name__}: {e}")
        for s in self.slots:
            if s.job is not None:
                self._fail(s, 503, "the server is shutting down")
        for job in self.pending:
            for j in [job] + job.children:
                j.emit("error", 503, "the server is shutting down")

    def _backends_ok(self) -> bool:
        """The model's backends can compute, reconnected if an rpc-server went away and is
        back (pyggml/server/health.py); else every waiting request gets a 503 naming it."""
        from pyggml.server import health
        if not health.backend_problems(self.llm):
            return True
        try:
            problems = health.reconnect(self.llm)
        except PyggmlError as e:
            problems = [str(e)]
        if not problems:
            return True
        with self._cv:
            jobs, self.pending = list(self.pending), deque()
        for job in jobs:
            for j in [job] + job.children:
                j.emit("error", 503, "; ".join(problems))
        return False

    def _admit(self) -> None:
        """Give waiting requests free slots: the one holding the longest prefix of the prompt,
        then the least recently used."""
        while self.pending:
            free = [s for s in self.slots if s.job is None]
            if not free:
                return
            job = self.pending[0]
            if job.cancelled.is_set():
                self.pending.popleft()
                self.metrics.requests_cancelled_total += 1
                for child in reversed(job.children):    # the other choices go on their own
                    child.parent = None
                    self.pending.appendleft(child)
                continue

            if len(free) < 1 + len(job.children):
                return          # every choice of a request starts together (as llama-server)
            ctx = self.llm.context
            # a slot's cells count only when computed under the LoRA scales job decodes with
            tag = ctx.loras(job.gen.lora if job.gen is not None else None).tag
            slot = max(free, key=lambda s: (ctx.reusable_prefix(job.ids, s.seq_id, tag),
                                            -s.last_used))
            if job.kind == "complete" and not self._prompt_fits(job.ids, slot,
                                                                 len(job.children)):
                return                      # it waits (first in line) for cells to free up
            self.pending.popleft()
            slot.job = job
            if job.kind == "embed":
                continue
            self._start(slot)
            # the further choices wait in the least recently used other slots
            rest = sorted((s for s in free if s is not slot), key=lambda s: s.last_used)
            for s, child in zip(rest, job.children):
                s.job = child

    def _start(self, slot: Slot) -> None:
        """Start the generation of the slot's request (its prefix cache reused)."""
        job, spec = slot.job, self.llm.speculator
        job.n_reused = job.gen.start(self.llm.context, spec, slot.seq_id)
        self.metrics.prompt_tokens_reused_total += job.n_reused
        slot.draft_todo = spec.draft.start_prompt(slot.seq_id, job.ids) if spec else []

    def _start_children(self, slot: Slot, row) -> None:
        """The parent's prompt was evaluated (its first token sampled from `row`): its waiting
        further choices share the prompt's cells and sample their first token from `row`
        (their drafts, with a speculator, catch up in their first round)."""
        job = slot.job
        for s in self.slots:
            child = s.job
            if child is None or child.parent is not job or not child.waiting:
                continue
            try:
                text = child.gen.start_copy(self.llm.context, job.gen, row, s.seq_id,
                                            self.llm.speculator)
            except PyggmlError as e:
                self._fail(s, 500, str(e))
                continue
            child.n_reused = len(child.ids)
            s.started = True
            self.metrics.generated_tokens_total += len(child.gen.tokens)
            if text:
                child.emit("text", text)
            if child.gen.done:
                child.emit("done", child.gen)
                self._release(s)

    def _prompt_fits(self, ids: list[int], slot: Slot, n_more: int = 0) -> bool:
        """Whether a prompt admitted to `slot` (with n_more further choices sharing its cells,
        a cell each for their first tokens) fits in the cells that are free or held by idle
        slots (their prefix caches), besides the cells the running requests' prompts still
        need and one per generating slot. Always true when no request is running (the app
        refuses prompts longer than n_ctx)."""
        ctx = self.llm.context
        active = [s for s in self.slots if s.job is not None and s.job.kind == "complete"]
        if not active:
            return True
        kept = min(ctx.common_prefix(ids, slot.seq_id), max(0, len(ids) - 2))
        evictable = sum(ctx.seq_len(s.seq_id) for s in self.slots if s.job is None) - kept
        committed = sum(len(s.todo) if s.todo else 1 for s in active)
        return len(ids) - kept + 1 + n_more <= ctx.free_cells() + evictable - committed

    def _make_room(self, n_cells: int) -> bool:
        """Drop idle slots' prefix caches, least recently used first, until n_cells cells are
        free; whether they are."""
        ctx = self.llm.context
        idle = sorted((s for s in self.slots if s.job is None and ctx.seq_len(s.seq_id)),
                      key=lambda s: s.last_used)
        for s in idle:
            if ctx.free_cells() >= n_cells:
                break
            self.llm.reset(s.seq_id)
        return ctx.free_cells() >= n_cells

    def _end_for_room(self, gen_slots: list[Slot]) -> list[Slot]:
        """Generating slots that can each take a cell this step: while there are fewer free
        cells (after dropping idle caches) than such slots, the generation holding the most
        cells ends as at a full context ("length"). Returns the slots left."""
        ctx = self.llm.context
        left = list(gen_slots)
        while left and not self._make_room(len(left)):
            s = max(left, key=lambda s: (ctx.seq_len(s.seq_id), s.seq_id))
            left.remove(s)
            text = s.job.gen.end_context_full()
            if text:
                s.job.emit("text", text)
            s.job.emit("done", s.job.gen)
            self._release(s)
        return left

    def _prompt_budget(self, n_decoding: int) -> int:
        """Prompt tokens this step may take besides `n_decoding` generating slots' tokens: what
        keeps the step near step_target_s at the measured seconds per row, in multiples of
        MIN_PROMPT_CHUNK (so that the few sizes' graphs are reused) and never fewer, at most
        n_ubatch rows in all."""
        room = self.llm.n_ubatch - n_decoding
        if self.step_target_s == 0 or self.s_per_row is None:
            rows = MIN_PROMPT_CHUNK if self.step_target_s else room
        else:
            rows = int(self.step_target_s / self.s_per_row) - n_decoding
            rows = max(MIN_PROMPT_CHUNK, rows // MIN_PROMPT_CHUNK * MIN_PROMPT_CHUNK)
        return max(0, min(room, rows))

    def _drop_cancelled(self) -> None:
        for s in self.slots:
            if s.job is not None and s.job.cancelled.is_set():
                self.metrics.requests_cancelled_total += 1
                self._release(s)

    def _release(self, s: Slot) -> None:
        job = s.job
        if job is not None:         # further choices still waiting: on their own from now on
            for child in job.children:
                child.parent = None
        s.job, s.draft_todo, s.last_used = None, [], time.perf_counter()
        s.started = False

    def _fail(self, s: Slot, status: int, message: str) -> None:
        s.job.emit("error", status, message)
        try:
            self.llm.reset(s.seq_id)
        except PyggmlError:
            pass
        self._release(s)

    def _step(self) -> None:
        llm, m = self.llm, self.metrics
        for s in self.slots:       # embeddings: one input per step, so streams keep flowing
            if s.job is not None and s.job.kind == "embed":
                job = s.job
                try:
                    x = job.texts[len(job.vecs)]
                    n = len(llm.tokenize(x)) if isinstance(x, str) else len(x)
                    if not self._make_room(n):      # its cells are taken: a later step
                        continue
                    job.vecs.extend(llm.embed([x], job.pooling, True, s.seq_id))
                    job.n_embedded += n
                    m.prompt_tokens_total += n
                    if len(job.vecs) == len(job.texts):
                        job.emit("embeddings", job.vecs, job.n_embedded)
                        self._release(s)
                except PyggmlError as e:
                    self._fail(s, 400, str(e))
        for s in self.slots:        # a further choice whose parent went before its prompt ended
            if s.job is not None and s.job.waiting and s.job.parent is None:
                try:
                    self._start(s)
                except PyggmlError as e:
                    self._fail(s, 500, str(e))
        gens = [s for s in self.slots if s.job is not None and s.job.kind == "complete"
                and not s.job.waiting]
        gen_slots = self._end_for_room([s for s in gens if not s.job.gen.prefilling])
        gens = [s for s in gens if s.job is not None]     # those _end_for_room ended are free
        self._drafts(gen_slots)
        batch = [s for s in gen_slots]
        n_rows = sum(len(s.job.gen.next_input()) for s in batch)
        budget = self._prompt_budget(n_rows)
        waiting = sorted((s for s in gens if s.job.gen.prefilling),
                         key=lambda s: len(s.job.gen.todo))
        if any(not s.started for s in waiting):      # new requests first, in a short step
            waiting = [s for s in waiting if not s.started]
        budget = min(budget, sum(len(s.todo) for s in waiting))
        if budget > 0:                  # prompt chunks take what the cache has left
            self._make_room(n_rows + budget)
            budget = min(budget, llm.context.free_cells() - n_rows)
        draft_chunks = []
        for s in waiting:
            if budget <= 0:
                break
            gen = s.job.gen
            chunk = gen.next_input(budget)
            s.started = True
            budget -= len(chunk)
            n_rows += len(chunk)
            batch.append(s)
            m.prompt_tokens_total += len(chunk)
            # the draft takes what it lacks up to where the model stands after this chunk
            k = max(0, len(s.draft_todo) - len(gen.todo))
            if k:
                draft_chunks.append((s.draft_todo[:k], s.seq_id))
                s.draft_todo = s.draft_todo[k:]
        if not batch:
            if waiting and not gen_slots and not any(
                    s.job is not None and s.job.kind == "embed" for s in self.slots):
                # prompts only, no cell left for any of them and none to free: the one with
                # the most left to evaluate gives way (a guard; admission by cells keeps the
                # room for running prompts, so this should never be needed)
                s = max(waiting, key=lambda s: len(s.todo))
                self._fail(s, 503, "the KV cache is full; retry later")
            return
        t0 = time.perf_counter()
        try:
            out = decode_step(llm.context, [s.job.gen for s in batch])
        except PyggmlError as e:
            # a backend that went away (an rpc-server): 503, as /health says; the context full
            # (admission by cells should prevent it): 400
            status = (503 if isinstance(e, RpcError) else
                      400 if isinstance(e, ContextOverflowError) else 500)
            for s in batch:
                self._fail(s, status, str(e))
            return
        if draft_chunks:
            try:
                llm.speculator.draft.eval_prompt_chunks(draft_chunks)
            except PyggmlError:         # the first round evaluates what the draft lacks
                pass
        dt = time.perf_counter() - t0
        if n_rows >= 8:                    # one token's step is mostly fixed costs: not a rate
            rate = dt / n_rows
            self.s_per_row = rate if self.s_per_row is None else 0.7 * self.s_per_row + 0.3 * rate
        n_seqs = len(batch)
        m.decode_steps_total += 1
        m.decode_seconds_total += dt
        m.decode_steps_multi_seq_total += n_seqs >= 2
        m.max_seqs_per_step = max(m.max_seqs_per_step, n_seqs)
        self._make_room(n_seqs)     # a generation ends at a full cache, not at idle slots' caches
        for s in batch:
            job, gen = s.job, s.job.gen
            if job.cancelled.is_set():      # its drafts were never checked: their cells go
                gen.close()
                continue
            n_gen, n_drafted, n_accepted = len(gen.tokens), gen.n_drafted, gen.n_accepted
            row = out[s.seq_id]
            shared = row if row.ndim == 1 else row[-1]
            shared = shared.copy() if job.children and not gen.prefilling and \
                gen.last_token is None else None     # the prompt's last logits, for choices
            text = gen.advance(row)
            m.generated_tokens_total += len(gen.tokens) - n_gen
            m.draft_tokens_total += gen.n_drafted - n_drafted
            m.draft_accepted_total += gen.n_accepted - n_accepted
            if text:
                job.emit("text", text)
            if shared is not None:
                self._start_children(s, shared)
            if gen.done:
                job.emit("done", gen)
                self._release(s)

    def _drafts(self, gen_slots: list[Slot]) -> None:
        """Speculative decoding (the LLM's draft_model): the generating slots draft together;
        their drafted tokens join this step's one decode_batch. Each slot drafts at most what
        its max_tokens and its share of the free cells allow."""
        spec = self.llm.speculator
        if spec is None or not gen_slots:
            return
        free = self.llm.context.free_cells() - len(gen_slots)
        room = max(0, min(free // len(gen_slots),
                          (self.llm.n_ubatch - len(gen_slots)) // len(gen_slots)))
        gens = [s.job.gen for s in gen_slots]
        for gen, p in zip(gens, spec.propose([g.draft_request(room) for g in gens])):
            gen.propose(p)
