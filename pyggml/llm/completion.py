"""Completions in llama-cpp-python's (and OpenAI's) shapes: `create_completion`,
`create_chat_completion`, their stream chunks, stop strings, logprobs, usage.

`Generation` is one completion in progress, independent of how its logits are computed: the
Python API drives one with `LLM.eval` (prompt prefix reused, see `LLM.reuse_prefix`); the server
drives many at once, one `decode_batch` per step (pyggml/server/engine.py).

Text: the token pieces (bytes) go through an incremental UTF-8 decoder, so no text ends inside
a character; stop strings are matched on the decoded text, and the text is cut before the stop.
Text that may be the start of a stop string is held back until it cannot be any more, so no
streamed chunk ends inside a possible stop string.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass, field
from typing import Iterator

import numpy as np

from pyggml.errors import ModelError
from pyggml.llm.chat import chat_prompt
from pyggml.llm.sampler import Sampler, SamplingParams
from pyggml.llm.textstream import TextStream

FINISH_STOP, FINISH_LENGTH = "stop", "length"


def normalize_stop(stop) -> list[str]:
    """`stop`: None, a string or a list of strings (OpenAI); empty strings are ignored."""
    if stop is None:
        return []
    if isinstance(stop, str):
        stop = [stop]
    if not isinstance(stop, (list, tuple)) or not all(isinstance(s, str) for s in stop):
        raise ModelError(f"stop must be a string or a list of strings, got {stop!r}")
    return [s for s in stop if s]


@dataclass
class TokenLogprob:
    token: int
    text: str
    logprob: float
    top: list[tuple[int, str, float]]       # (id, text, logprob), best first


@dataclass
class Generation:
    """One completion on one sequence. Feed it the logits after each evaluation (`step`); it
    samples, decodes, matches stop strings and returns the text that is safe to show.

    max_tokens: tokens to generate at most; logprobs: top-N log-probabilities per token (None:
    none); stop_at_eog: an end-of-generation token ends it (not part of the text)."""
    llm: object
    prompt_ids: list[int]
    max_tokens: int
    params: SamplingParams = field(default_factory=SamplingParams)
    stop: list[str] = field(default_factory=list)
    logprobs: int | None = None
    stop_at_eog: bool = True

    def __post_init__(self):
        self.sampler = Sampler(self.params)
        for t in self.prompt_ids:          # the sampler keeps the last repeat_last_n
            self.sampler.accept(t)
        self.stream = TextStream()
        self.text = ""                 # generated text so far (cut at a stop string when found)
        self.n_emitted = 0             # characters of `text` handed out
        self.tokens: list[int] = []    # generated tokens (EOG not included)
        self.token_logprobs: list[TokenLogprob] = []
        self.finish_reason: str | None = None
        self.last_token: int | None = None       # to evaluate next (None when finished)
        self._max_stop = max((len(s) for s in self.stop), default=0)

    @property
    def done(self) -> bool:
        return self.finish_reason is not None

    def step(self, logits: np.ndarray) -> str:
        """Sample the next token from `logits` (float32 [n_vocab]) and return the new safe text
        ('' while held back). Sets finish_reason when the completion ends."""
        if self.done:
            raise ModelError("this completion is finished")
        if self.max_tokens <= len(self.tokens):
            return self._finish(FINISH_LENGTH)
        tok = self.sampler.sample(logits)
        self.sampler.accept(tok)
        return self.push(tok, logits)

    def push(self, tok: int, logits: np.ndarray) -> str:
        """As step, for a token chosen elsewhere (a speculative round, which has passed it to
        the sampler) from `logits` (the target's row it was chosen from, for logprobs)."""
        if self.done:
            raise ModelError("this completion is finished")
        if self.max_tokens <= len(self.tokens):
            return self._finish(FINISH_LENGTH)
        tok_is_eog = self.llm.tokenizer.is_eog(tok)
        if self.stop_at_eog and tok_is_eog:
            return self._finish(FINISH_STOP)
        self.tokens.append(tok)
        self.last_token = tok
        piece = self.llm.tokenizer.token_to_piece(tok)
        if self.logprobs is not None:
            self.token_logprobs.append(self._logprob(logits, tok, piece))
        self.text += self.stream.push(piece)
        hit = self._find_stop()
        if hit is not None:
            self.text = self.text[:hit]
            return self._finish(FINISH_STOP, cut=True)
        if len(self.tokens) >= self.max_tokens:
            return self._finish(FINISH_LENGTH)
        return self._take(len(self.text) - self._held_back())

    def _logprob(self, logits, tok, piece) -> TokenLogprob:
        x = np.asarray(logits, np.float64)
        lse = float(np.log(np.exp(x - x.max()).sum()) + x.max())
        n = max(int(self.logprobs), 1)
        top = np.argpartition(-x, min(n, x.size) - 1)[:n]
        top = top[np.argsort(-x[top], kind="stable")]
        dec = self.llm.tokenizer.token_to_piece
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
        cut at a stop string they complete), unless the text was just cut at a stop string."""
        self.finish_reason = reason
        self.last_token = None
        if not cut:
            self.text += self.stream.flush()
            hit = self._find_stop()
            if hit is not None:
                self.text, self.finish_reason = self.text[:hit], FINISH_STOP
        return self._take(len(self.text))


# ---- request checks --------------------------------------------------------------------------
def sampling_params(temperature=0.8, top_p=0.95, top_k=40, min_p=0.05, repeat_penalty=1.0,
                    seed=None, repeat_last_n=64) -> SamplingParams:
    """llama-cpp-python's / llama-server's defaults; seed None: a random one."""
    return SamplingParams(float(temperature), int(top_k), float(top_p), float(min_p),
                          float(repeat_penalty), int(repeat_last_n),
                          0xFFFFFFFF if seed is None else int(seed) & 0xFFFFFFFF).validate()


def token_budget(n_prompt: int, max_tokens, n_ctx: int) -> int:
    """Tokens a completion may generate: max_tokens (None or <= 0: until the context is full).
    A prompt that leaves no room, or a max_tokens that cannot fit, is a ModelError naming the
    numbers."""
    room = n_ctx - n_prompt
    if room < 1:
        raise ModelError(f"the prompt has {n_prompt} tokens but the context holds {n_ctx} "
                         f"(n_ctx): at least one more token must fit")
    if max_tokens is None or max_tokens <= 0:
        return room
    if not isinstance(max_tokens, (int, np.integer)):
        raise ModelError(f"max_tokens must be an integer, got {max_tokens!r}")
    if n_prompt + max_tokens > n_ctx:
        raise ModelError(f"{n_prompt} prompt tokens + max_tokens {max_tokens} = "
                         f"{n_prompt + max_tokens} exceeds the context of {n_ctx} tokens (n_ctx)")
    return int(max_tokens)


# ---- OpenAI-shaped results -------------------------------------------------------------------
def _usage(n_prompt: int, n_gen: int, run: "CompletionRun | None" = None) -> dict:
    """OpenAI's usage; with speculative decoding also the drafted and accepted tokens."""
    out = {"prompt_tokens": n_prompt, "completion_tokens": n_gen,
           "total_tokens": n_prompt + n_gen}
    if run is not None and run.spec is not None:
        out["draft_tokens"] = run.n_drafted
        out["draft_accepted_tokens"] = run.n_accepted
    return out


def completion_logprobs(lps: list[TokenLogprob], start_offset: int) -> dict:
    """OpenAI's legacy completions logprobs: tokens, text_offset, token_logprobs, top_logprobs."""
    out = {"tokens": [], "text_offset": [], "token_logprobs": [], "top_logprobs": []}
    off = start_offset
    for lp in lps:
        out["tokens"].append(lp.text)
        out["text_offset"].append(off)
        out["token_logprobs"].append(lp.logprob)
        out["top_logprobs"].append({t: p for _, t, p in lp.top})
        off += len(lp.text)
    return out


def chat_logprobs(gen: Generation) -> dict:
    """OpenAI's chat logprobs: {"content": [{token, logprob, bytes, top_logprobs}, ...]}."""
    return {"content": [{"token": lp.text, "logprob": lp.logprob,
                         "bytes": list(lp.text.encode()),
                         "top_logprobs": [{"token": t, "logprob": p, "bytes": list(t.encode())}
                                          for _, t, p in lp.top]}
                        for lp in gen.token_logprobs]}


class CompletionRun:
    """One completion on one sequence of an LLM, driven by eval (the Python API). draft: as
    LLM.generate's (None: the LLM's draft_model; False: none)."""

    def __init__(self, llm, prompt_ids: list[int], gen: Generation, seq_id: int, draft=None):
        self.llm, self.ids, self.gen, self.seq_id = llm, prompt_ids, gen, seq_id
        self.spec = llm.speculator_for(draft)
        self.n_drafted = self.n_accepted = 0       # this completion's speculative counts

    def pieces(self) -> Iterator[str]:
        """The text as it becomes safe to show; gen.finish_reason is set at the end."""
        llm, st = self.llm, self.llm.stats
        t0 = time.perf_counter()
        n_keep = llm.reuse_prefix(self.ids, self.seq_id)
        logits = llm.eval(self.ids[n_keep:], self.seq_id)
        if self.spec is not None:
            self.spec.prefill(self.seq_id, self.ids)
        st.t_prompt_s += time.perf_counter() - t0
        st.n_prompt_tokens += len(self.ids) - n_keep
        t1 = time.perf_counter()
        try:
            while True:
                n_before = len(self.gen.tokens)
                text = self.gen.step(logits if logits.ndim == 1 else logits[-1])
                st.n_gen_tokens += len(self.gen.tokens) - n_before
                if text:
                    yield text
                if self.gen.done:
                    return
                if self.spec is not None:
                    yield from self._speculative()
                    return
                logits = llm.eval([self.gen.last_token], self.seq_id)
        finally:
            st.t_gen_s += time.perf_counter() - t1

    def _speculative(self) -> Iterator[str]:
        """The rest of the completion in speculative rounds (pyggml/llm/speculative.py). The
        tokens of a round are pushed one by one and the rest dropped once the completion ends,
        and the sequence is cut back to the cells plain decoding would hold: the prompt and
        every token that did not end the completion."""
        llm, gen, sid, spec = self.llm, self.gen, self.seq_id, self.spec
        st = llm.stats
        spec.reset_seq(sid)
        n_evals = len(gen.tokens)        # plain decoding evaluates each token that goes on
        s0 = (st.spec.drafted, st.spec.accepted)

        def decode(tokens):
            return llm.decode_batch([(tokens, sid)], all_logits=(sid,))[sid].reshape(
                len(tokens), -1)
        try:
            while not gen.done:
                free = llm.n_ctx - llm.kv.n_used()
                cap = min(free - 1, gen.max_tokens - len(gen.tokens) - 1)
                for tok, row in spec.round(sid, gen.last_token, gen.sampler, cap, decode):
                    n_before = len(gen.tokens)
                    text = gen.push(tok, row)
                    st.n_gen_tokens += len(gen.tokens) - n_before
                    if text:
                        yield text
                    if gen.done:
                        break
                    n_evals += 1
        finally:
            self.n_drafted += st.spec.drafted - s0[0]
            self.n_accepted += st.spec.accepted - s0[1]
            with llm.lock:
                if not llm._closed:
                    llm._truncate_locked(sid, len(self.ids) + n_evals)


def _model_name(llm) -> str:
    return llm.path


def create_completion(llm, prompt, *, max_tokens=16, temperature=0.8, top_p=0.95, top_k=40,
                      min_p=0.05, repeat_penalty=1.0, seed=None, stop=None, logprobs=None,
                      echo=False, stream=False, seq_id=0, stop_at_eog=True, draft=None):
    """llama-cpp-python's Llama.create_completion: an OpenAI text_completion dict, or with
    stream=True an iterator of text_completion chunks (the last carries finish_reason).
    draft: speculative decoding, as LLM.generate's (usage then says draft_tokens and
    draft_accepted_tokens)."""
    ids = llm.tokenize(prompt) if isinstance(prompt, str) else [int(t) for t in prompt]
    if not ids:
        raise ModelError("empty prompt: at least one token is needed")
    if logprobs is not None and (not isinstance(logprobs, (int, np.integer)) or logprobs < 0):
        raise ModelError(f"logprobs must be a non-negative integer, got {logprobs!r}")
    gen = Generation(llm, ids, token_budget(len(ids), max_tokens, llm.n_ctx),
                     sampling_params(temperature, top_p, top_k, min_p, repeat_penalty, seed),
                     normalize_stop(stop), logprobs, stop_at_eog)
    run = CompletionRun(llm, ids, gen, seq_id, draft)
    cid, created = f"cmpl-{uuid.uuid4()}", int(time.time())
    prefix = (prompt if isinstance(prompt, str) else llm.detokenize(ids)) if echo else ""

    def chunk(text, finish, lp=None):
        return {"id": cid, "object": "text_completion", "created": created,
                "model": _model_name(llm),
                "choices": [{"text": text, "index": 0, "logprobs": lp, "finish_reason": finish}]}

    if stream:
        def chunks():
            if prefix:
                yield chunk(prefix, None)
            n_lp = 0
            off = len(prefix)
            for text in run.pieces():
                lp = None
                if logprobs is not None:
                    lp = completion_logprobs(gen.token_logprobs[n_lp:], off)
                    n_lp = len(gen.token_logprobs)
                off += len(text)
                yield chunk(text, None, lp)
            last = chunk("", gen.finish_reason)
            last["usage"] = _usage(len(ids), len(gen.tokens), run)
            yield last
        return chunks()
    text = "".join(run.pieces())
    out = chunk(prefix + text, gen.finish_reason,
                completion_logprobs(gen.token_logprobs, len(prefix)) if logprobs is not None else None)
    out["usage"] = _usage(len(ids), len(gen.tokens), run)
    return out


def chat_prompt_ids(llm, template, messages) -> list[int]:
    """Token ids of the chat prompt: special tokens parsed and BOS added as the model wants,
    once (a template that writes bos_token itself does not get a second one)."""
    ids = llm.tokenize(chat_prompt(template, messages))
    bos = llm.tokenizer.bos_id
    if len(ids) >= 2 and bos is not None and ids[0] == bos and ids[1] == bos:
        ids = ids[1:]
    return ids


def create_chat_completion(llm, messages, *, chat_template=None, max_tokens=None,
                           temperature=0.8, top_p=0.95, top_k=40, min_p=0.05,
                           repeat_penalty=1.0, seed=None, stop=None, logprobs=False,
                           top_logprobs=None, stream=False, seq_id=0, draft=None):
    """llama-cpp-python's Llama.create_chat_completion: an OpenAI chat.completion dict, or with
    stream=True an iterator of chat.completion.chunk dicts (role first, then content deltas,
    then an empty delta with finish_reason)."""
    template = llm.get_chat_template(chat_template)
    ids = chat_prompt_ids(llm, template, messages)
    n_lp = (top_logprobs or 0) if logprobs else None
    gen = Generation(llm, ids, token_budget(len(ids), max_tokens, llm.n_ctx),
                     sampling_params(temperature, top_p, top_k, min_p, repeat_penalty, seed),
                     normalize_stop(stop), n_lp, True)
    run = CompletionRun(llm, ids, gen, seq_id, draft)
    cid, created = f"chatcmpl-{uuid.uuid4()}", int(time.time())

    def chunk(delta, finish):
        return {"id": cid, "object": "chat.completion.chunk", "created": created,
                "model": _model_name(llm),
                "choices": [{"index": 0, "delta": delta, "logprobs": None,
                             "finish_reason": finish}]}

    if stream:
        def chunks():
            yield chunk({"role": "assistant"}, None)
            for text in run.pieces():
                yield chunk({"content": text}, None)
            last = chunk({}, gen.finish_reason)
            last["usage"] = _usage(len(ids), len(gen.tokens), run)
            yield last
        return chunks()
    text = "".join(run.pieces())
    return {"id": cid, "object": "chat.completion", "created": created,
            "model": _model_name(llm),
            "choices": [{"index": 0, "message": {"role": "assistant", "content": text},
                         "logprobs": chat_logprobs(gen) if logprobs else None,
                         "finish_reason": gen.finish_reason}],
            "usage": _usage(len(ids), len(gen.tokens), run)}
