"""One generation loop, plain or speculative, for every caller: `LLM.generate`,
`create_completion` / `create_chat_completion`, `pyggml chat` and every server slot.

A `Generation` is one completion of one prompt on one sequence of a `Context`. It is driven in
steps, so that one driver can run one generation (`run`) and another many at once in one batch
(the server, pyggml/server/engine.py):

    gen.start(ctx, speculator)          # keep the common prefix, take the sequence's epoch
    while not gen.done:
        [gen.propose(...)]              # speculative: the draft's tokens for this step
        tokens = gen.next_input(budget)     # a prompt chunk, or the last token (+ drafts)
        out = decode_step(ctx, [gen])[seq_id]   # (one decode for many generations)
        text = gen.advance(out)         # sample / accept, stop, text safe to show

Decided here once: sampling (with an optional per-step `token_filter`, the entry of
constrained decoding), end-of-generation tokens, stop strings, max_tokens, a full context, the
speculative round's accepted tokens, the KV cells the sequence keeps when the generation ends
(always the ones plain decoding would hold: the prompt and every generated token that was
evaluated, whether the generation ended, was cancelled or a round drafted past its end), the
stats, and cancellation (`close`).

Text: token pieces (bytes) go through an incremental UTF-8 decoder, so no text ends inside a
character; stop strings are matched on the decoded text, and the text is cut before the stop.
Text that may be the start of a stop string is held back until it cannot be any more, so no
streamed piece ends inside a possible stop string.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable, Iterator

import numpy as np

from pyggml.errors import ModelError
from pyggml.llm.sampler import Sampler, SamplingParams
from pyggml.llm.speculative import Proposal
from pyggml.llm.textstream import TextStream

FINISH_STOP, FINISH_LENGTH, FINISH_CONTEXT = "stop", "length", "context"
#: why a generation ended: an end-of-generation token or a stop string, max_tokens, no KV cell
#: for the next token (llama.cpp without context shift stops the same way; OpenAI-style APIs
#: call it 'length')
FINISH_REASONS = (FINISH_STOP, FINISH_LENGTH, FINISH_CONTEXT)

#: token_filter(generated, logits) -> logits: called before each sampling with the tokens
#: generated so far (drafted ones included while a round is verified) and the float32 row
#: [n_vocab]; it returns the row to sample from (e.g. -inf where a grammar forbids a token).
TokenFilter = Callable[[list[int], np.ndarray], np.ndarray]


@dataclass
class Token:
    """One generated token: its id and the text it completes (pyggml.llm.textstream: '' while
    a character is incomplete, U+FFFD for invalid bytes; the texts of a generation joined are
    its detokenized text)."""
    id: int
    text: str


@dataclass
class TokenLogprob:
    token: int
    text: str
    logprob: float
    top: list[tuple[int, str, float]]       # (id, text, logprob), best first


class Generation:
    """One completion of `prompt_ids` on one sequence (see the module docstring).

    tokenizer: is_eog and token_to_piece; max_tokens: tokens to generate at most (None or < 0:
    until an end or a full context; 0: none); params: sampling; stop: stop strings; logprobs:
    top-N log-probabilities per token (None: none); stop_at_eog: an end-of-generation token
    ends it (it is not part of the text); token_filter: see TokenFilter; seq_id: its sequence;
    reuse_prefix: keep the cells of the longest common prefix with what the sequence holds
    (else the sequence is reset); lora: the LoRA scales its sequence is decoded with, one per
    loaded adapter (None: the context's global scales; Context.set_seq_lora).

    After a step: `text` (all text, cut at a stop string), `tokens` (generated, EOG excluded),
    `new_tokens` (the Tokens of the last advance, texts before stop strings; `tail` is the text
    a finish flushed after them), `finish_reason` (None while running)."""

    def __init__(self, tokenizer, prompt_ids: list[int], max_tokens: int | None = None,
                 params: SamplingParams | None = None, stop=(), logprobs: int | None = None,
                 stop_at_eog: bool = True, token_filter: TokenFilter | None = None,
                 seq_id: int = 0, reuse_prefix: bool = True, lora=None):
        self.tokenizer = tokenizer
        self.lora = lora
        self.prompt_ids = list(prompt_ids)
        self.max_tokens = None if max_tokens is None or max_tokens < 0 else int(max_tokens)
        self.params = params or SamplingParams()
        self.stop = [s for s in stop if s]
        self.logprobs = logprobs
        self.stop_at_eog = stop_at_eog
        self.token_filter = token_filter
        self.seq_id = seq_id
        self.reuse_prefix = reuse_prefix
        self.sampler = Sampler(self.params, tokenizer)     # DRY tokenizes its breakers
        for t in self.prompt_ids:          # the sampler keeps the last repeat_last_n
            self.sampler.accept(t)
        self.stream = TextStream()
        self.text = ""                 # generated text so far (cut at a stop string when found)
        self.n_emitted = 0             # characters of `text` handed out
        self.tokens: list[int] = []
        self.token_logprobs: list[TokenLogprob] = []
        self.new_tokens: list[Token] = []
        self.tail = ""
        self.stopping_word = ""        # the stop string that ended the text ("" if none did)
        self.eog_token: int | None = None   # the end-of-generation token that ended it
        self.finish_reason: str | None = None
        self.last_token: int | None = None       # sampled, to evaluate next (None: finished)
        self.n_reused = 0              # prompt tokens whose cells were kept
        self.n_drafted = self.n_accepted = 0     # speculative: this generation's counts
        self.ctx = None
        self.spec = None
        self.todo: list[int] = []      # prompt tokens still to evaluate
        self._epoch = None
        self._n_cells = 0              # cells plain decoding would hold (kept at the end)
        self._input: list[int] = []    # what the step being decoded evaluates
        self._proposal: Proposal | None = None
        self._max_stop = max((len(s) for s in self.stop), default=0)

    @property
    def done(self) -> bool:
        return self.finish_reason is not None

    @property
    def prefilling(self) -> bool:
        return bool(self.todo)

    @property
    def all_rows(self) -> bool:
        """The step being prepared needs a logits row for every token (a speculative round)."""
        return self.spec is not None and not self.todo

    # ---- the steps ---------------------------------------------------------------------------
    def start(self, ctx, speculator=None, seq_id: int | None = None) -> int:
        """Bind to `ctx` (and a Speculator): prepare the sequence (its common prefix kept, or
        reset), take its epoch. Returns the prompt tokens kept; `todo` holds the rest."""
        if seq_id is not None:
            self.seq_id = seq_id
        sid = self.seq_id = ctx.check_seq(self.seq_id)
        if not self.prompt_ids:
            raise ModelError("empty prompt: at least one token is needed")
        if speculator is not None and not self.params.fixed_distribution:
            raise ModelError("speculative decoding needs a fixed distribution per step: "
                             "mirostat and XTC draw their own (turn them off, or the draft)")
        with ctx.lock:
            ctx.check_open()
            ctx.set_seq_lora(sid, self.lora)     # before the prefix check: cells of other
            if self.reuse_prefix:                # LoRA scales are not reused
                self.n_reused = ctx.reuse_prefix(self.prompt_ids, sid)
            else:
                ctx.seq_reset(sid)
                self.n_reused = 0
            self._epoch = ctx.seq_epoch(sid)
        self.ctx, self.spec = ctx, speculator
        self.todo = self.prompt_ids[self.n_reused:]
        self._n_cells = self.n_reused
        if speculator is not None:
            speculator.reset_seq(sid)
        return self.n_reused

    def start_copy(self, ctx, src: "Generation", row: np.ndarray, seq_id: int,
                   speculator=None) -> str:
        """Start as a further choice of `src`'s prompt right after src evaluated it (src
        sampled its first token from `row`, the logits F32 [n_vocab] of the prompt's last
        token, and its sequence holds exactly the prompt): sequence seq_id shares the
        prompt's KV cells (Context.seq_copy) and this generation samples its first token from
        the same row — the prompt is evaluated once for all choices, as llama-server's
        n_cmpl children copy their parent's state. Returns the first text, as advance."""
        if self.prompt_ids != src.prompt_ids:
            raise ModelError("start_copy: the generations have different prompts")
        sid = self.seq_id = ctx.check_seq(seq_id)
        with ctx.lock:
            ctx.check_open()
            if ctx.seq_tokens(src.seq_id) != self.prompt_ids:
                raise ModelError(f"start_copy: sequence {src.seq_id} does not hold just the "
                                 f"prompt")
            ctx.seq_copy(src.seq_id, sid)
            ctx.set_seq_lora(sid, self.lora)
            self._epoch = ctx.seq_epoch(sid)
        self.ctx, self.spec = ctx, speculator
        self.n_reused = len(self.prompt_ids)
        self.todo, self._input = [], []
        self._n_cells = len(self.prompt_ids)
        if speculator is not None:
            speculator.reset_seq(sid)
        return self.advance(np.array(row, dtype=np.float32))    # a prompt "chunk" of 0 tokens

    def check(self) -> None:
        """ClosedError / GeneratorInvalidatedError when the sequence changed under it."""
        self.ctx.check_epoch(self.seq_id, self._epoch)

    def propose(self, proposal: Proposal) -> None:
        """The draft's tokens for the next step (Speculator.propose of `draft_request`)."""
        self._proposal = proposal

    def draft_request(self, cells: int):
        """What to draft for the next step, given `cells` KV cells this sequence may use past
        its last token (None: no speculator, or the prompt is still being evaluated)."""
        if self.spec is None or self.todo or self.done:
            return None
        cap = cells if self.max_tokens is None else \
            min(cells, self.max_tokens - len(self.tokens) - 1)
        return self.spec.request(self.seq_id, self.last_token, self.sampler, cap)

    def next_input(self, max_prompt: int | None = None) -> list[int]:
        """The tokens the next step evaluates: a chunk of the prompt (at most max_prompt
        tokens), else the last sampled token and the drafted ones."""
        if self.done:
            raise ModelError("this generation is finished")
        if self.todo:
            n = len(self.todo) if max_prompt is None else max(0, max_prompt)
            self._input, self.todo = self.todo[:n], self.todo[n:]
        else:
            prop = self._proposal or Proposal()
            self._input = [self.last_token] + prop.tokens
        return self._input

    def advance(self, out: np.ndarray) -> str:
        """Take the step's output (its sequence's logits from the decode of next_input: the
        last row, or every row in a speculative round); returns the new text that is safe to
        show ('' while held back). Sets finish_reason when the generation ends."""
        self.new_tokens, self.tail = [], ""
        ctx, st = self.ctx, self.ctx.stats
        evaluated, self._input = self._input, []
        if self.last_token is None:             # a prompt chunk
            self._n_cells += len(evaluated)
            st.n_prompt_tokens += len(evaluated)
            if self.todo:
                return ""
            if self.max_tokens == 0:
                return self._finish(FINISH_LENGTH)
            row = out if out.ndim == 1 else out[-1]
            return self._push_sampled(self._sample(row), row)
        if self.spec is None:
            self._n_cells += 1
            row = out if out.ndim == 1 else out[-1]
            return self._push_sampled(self._sample(row), row)
        prop, self._proposal = self._proposal or Proposal(), None
        rows = out.reshape(len(evaluated), -1)
        if self.token_filter is not None:       # row i follows the drafts before it
            rows = np.stack([self.token_filter(self.tokens + prop.tokens[:i], r)
                             for i, r in enumerate(rows)])
        n_before = self._n_cells
        with ctx.lock:          # the round's tokens; the rejected drafts' cells go
            toks = self.spec.finish_round(self.seq_id, n_before, prop, rows, self.sampler)
        if prop.tokens:
            self.n_drafted += len(prop.tokens)
            self.n_accepted += len(toks) - 1
        self._n_cells += 1                      # `last`, evaluated
        text = ""
        for j, (tok, row) in enumerate(zip(toks, rows)):
            text += self._push(tok, row)
            if self.done:
                return text
            if j < len(toks) - 1:               # a kept draft: its cell is held
                self._n_cells += 1
        return text + self._check_room()

    def close(self, n_shown: int | None = None) -> None:
        """Stop here (a cancelled request, an iterator closed early): the sequence keeps the
        cells plain decoding would hold (with those of a prompt chunk or of the last token
        that were evaluated for a step not taken: drafts never checked go). n_shown: only
        that many generated tokens were handed out (the rest of a speculative round was
        not): plain decoding would have evaluated all but the last of them."""
        if self._input:
            self._n_cells += len(self._input) if self.last_token is None else 1
            self._input = []
        if n_shown is not None and self._n_cells >= len(self.prompt_ids):
            self._n_cells = min(self._n_cells, len(self.prompt_ids) + max(n_shown - 1, 0))
        self._settle()
        self.last_token = None

    def end_context_full(self) -> str:
        """End now as at a full context (FINISH_CONTEXT): a server whose shared cache has no
        cell left for this generation's next token. Returns the text the end flushes."""
        return self._finish(FINISH_CONTEXT)

    # ---- sampling and text -------------------------------------------------------------------
    def _sample(self, row: np.ndarray) -> int:
        if self.token_filter is not None:
            row = self.token_filter(self.tokens, row)
        tok = self.sampler.sample(row)
        self.sampler.accept(tok)
        return tok

    def _push_sampled(self, tok: int, row) -> str:
        text = self._push(tok, row)
        return text if self.done else text + self._check_room()

    def _check_room(self) -> str:
        """A full context ends the generation before its next step (no cell for last_token)."""
        if self.ctx.free_cells() < 1:
            return self._finish(FINISH_CONTEXT)
        return ""

    def _push(self, tok: int, logits: np.ndarray) -> str:
        """A token chosen (and passed to the sampler) from `logits`: EOG, stop strings and
        max_tokens are checked; the new safe text."""
        if self.max_tokens is not None and self.max_tokens <= len(self.tokens):
            return self._finish(FINISH_LENGTH)
        tokenizer = self.tokenizer
        if self.stop_at_eog and tokenizer.is_eog(tok):
            self.eog_token = tok
            return self._finish(FINISH_STOP)
        self.tokens.append(tok)
        self.ctx.stats.n_gen_tokens += 1
        self.last_token = tok
        piece = tokenizer.token_to_piece(tok)
        if self.logprobs is not None:
            self.token_logprobs.append(self._logprob(logits, tok, piece))
        new = self.stream.push(piece)
        self.new_tokens.append(Token(tok, new))
        self.text += new
        hit = self._find_stop()
        if hit is not None:
            self._cut_at_stop(hit)
            return self._finish(FINISH_STOP, cut=True)
        if self.max_tokens is not None and len(self.tokens) >= self.max_tokens:
            return self._finish(FINISH_LENGTH)
        return self._take(len(self.text) - self._held_back())

    def _logprob(self, logits, tok, piece) -> TokenLogprob:
        x = np.asarray(logits, np.float64)
        lse = float(np.log(np.exp(x - x.max()).sum()) + x.max())
        n = max(int(self.logprobs), 1)
        top = np.argpartition(-x, min(n, x.size) - 1)[:n]
        top = top[np.argsort(-x[top], kind="stable")]
        dec = self.tokenizer.token_to_piece
        return TokenLogprob(tok, piece.decode("utf-8", "replace"), float(x[tok] - lse),
                            [(int(i), dec(int(i)).decode("utf-8", "replace"), float(x[i] - lse))
                             for i in top])

    def _find_stop(self) -> int | None:
        """Index of the earliest stop string in the text not yet handed out (none can start
        earlier: text that could begin one is held back)."""
        best = None
        for s in self.stop:
            i = self.text.find(s, self.n_emitted)
            if i >= 0 and (best is None or i < best):
                best = i
        return best

    def _cut_at_stop(self, hit: int) -> None:
        """The text ends where a stop string begins (at `hit`); which one is kept."""
        self.stopping_word = next(s for s in self.stop if self.text.startswith(s, hit))
        self.text = self.text[:hit]

    def _held_back(self) -> int:
        """Characters at the end of the text that are the start of some stop string."""
        tail = self.text[self.n_emitted:]
        for k in range(min(len(tail), self._max_stop - 1), 0, -1):
            end = tail[-k:]
            if any(s.startswith(end) for s in self.stop):
                return k
        return 0

    def _take(self, upto: int) -> str:
        out = self.text[self.n_emitted:upto]
        self.n_emitted = max(self.n_emitted, upto)
        return out

    def _finish(self, reason: str, cut: bool = False) -> str:
        """End: the held-back text goes out (after the bytes of an unfinished character, and
        cut at a stop string they complete), unless the text was just cut at a stop string;
        the sequence keeps the cells plain decoding would hold."""
        self.finish_reason = reason
        self.last_token = None
        if not cut:
            self.tail = self.stream.flush()
            self.text += self.tail
            hit = self._find_stop()
            if hit is not None:
                self._cut_at_stop(hit)
                self.finish_reason = FINISH_STOP
        self._settle()
        return self._take(len(self.text))

    def _settle(self) -> None:
        """Drop cells past what plain decoding would hold (drafts checked past the end)."""
        ctx = self.ctx
        if ctx is None:
            return
        with ctx.lock:
            if ctx.closed or ctx.seq_epoch(self.seq_id) != self._epoch:
                return
            if ctx.seq_len(self.seq_id) > self._n_cells:
                ctx.seq_keep_first(self.seq_id, self._n_cells, invalidate=False)
                if self.spec is not None:
                    self.spec.draft.forget_after(self.seq_id, self._n_cells)


def decode_step(ctx, gens: list[Generation]) -> dict[int, np.ndarray]:
    """Evaluate the prepared inputs (next_input) of several generations in one batch, each on
    its own sequence; checks first that none was invalidated. {seq_id: output rows}."""
    with ctx.lock:
        for g in gens:
            g.check()
        return ctx.decode([(g._input, g.seq_id) for g in gens],
                          frozenset(g.seq_id for g in gens if g.all_rows), invalidate=False)


def run(ctx, gen: Generation, speculator=None) -> Iterator[str]:
    """Drive one generation to its end: after each step, the new text that is safe to show
    ('' while held back or when a step produced nothing to show). Starts it (prefix reuse)
    unless started; the draft evaluates the prompt right after the model (prompt time).
    Closing the iterator early keeps plain decoding's cells."""
    st = ctx.stats
    if gen.ctx is None:
        gen.start(ctx, speculator)
    spec = gen.spec
    t0 = time.perf_counter()
    t1 = None
    try:
        with ctx.lock:
            gen.next_input()
            text = gen.advance(decode_step(ctx, [gen])[gen.seq_id])
        if spec is not None:
            spec.prefill(gen.seq_id, gen.prompt_ids)
        st.t_prompt_s += time.perf_counter() - t0
        t1 = time.perf_counter()
        yield text
        while not gen.done:
            with ctx.lock:
                if spec is not None:
                    gen.check()
                    gen.propose(spec.propose([gen.draft_request(ctx.free_cells() - 1)])[0])
                n = len(gen.next_input())
                t = time.perf_counter()
                out = decode_step(ctx, [gen])[gen.seq_id]
                if spec is not None:        # what a round costs: k_for's cost model
                    spec.costs.add_verify(n, time.perf_counter() - t)
                text = gen.advance(out)
            yield text
    finally:
        if t1 is not None:
            st.t_gen_s += time.perf_counter() - t1
        if not gen.done:
            gen.close()


class Tokens:
    """LLM.generate's result: an iterator of Token over `run`. A token whose text ends inside a
    character is held until the next is known: an end there flushes the unfinished bytes as
    U+FFFD into it. finish_reason: None while running, then one of FINISH_REASONS, set before
    the last token is handed out. on_end(gen) is called once it is set."""

    def __init__(self, ctx, gen: Generation, speculator=None, on_end=None):
        self.generation = gen
        self._it = self._tokens(ctx, gen, speculator, on_end)

    finish_reason = property(lambda self: self.generation.finish_reason)

    def __iter__(self) -> "Tokens":
        return self

    def __next__(self) -> Token:
        return next(self._it)

    def close(self) -> None:
        self._it.close()

    @staticmethod
    def _tokens(ctx, gen, speculator, on_end) -> Iterator[Token]:
        held: Token | None = None
        n_shown = 0
        steps = run(ctx, gen, speculator)
        try:
            for _ in steps:
                if gen.done and on_end is not None:
                    on_end(gen)
                for t in gen.new_tokens:
                    if held is not None:
                        n_shown += 1
                        yield held
                    held = Token(t.id, t.text)
                if held is not None and not gen.done and not gen.stream.pending:
                    n_shown += 1
                    yield held
                    held = None
            if held is not None:
                held.text += gen.tail
                yield held
        finally:
            if not gen.done:            # closed early: keep what was handed out
                gen.close(n_shown)
            steps.close()
