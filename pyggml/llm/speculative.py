"""Speculative decoding: a cheap draft proposes up to k tokens, the target model checks them all
in one batch, and every accepted token costs no read of the target's weights of its own.

One round on a sequence whose last sampled token `last` is not evaluated yet:

1. the draft proposes d_1..d_k from the sequence's tokens and `last` (k adaptive, see `Speculator`);
2. the target evaluates [last, d_1..d_k] in one ubatch with logits for every row: row i is the
   target's distribution after d_i (row 0: after `last`);
3. `accept_tokens` walks the rows: d_i is kept with probability min(1, p(d_i) / q(d_i)) (p: the
   target's distribution at row i-1, q: the draft's), the first rejection draws the round's
   last token from the residual norm(max(0, p - q)) and ends the round; when every d_i is kept,
   the last token is drawn from row k (the "bonus" token). This is the standard speculative
   sampling rule (Leviathan et al. 2023, Chen et al. 2023): the tokens come out with exactly
   the target's distribution. p and q are the distributions the plain sampler draws from
   (`Sampler.distribution`: repetition penalty, top_k, top_p, min_p, temperature), the penalty
   seeing the tokens accepted so far. A deterministic draft (prompt lookup, or a draft model
   under greedy sampling) has q = a point mass: d_i is kept with probability p(d_i), the
   residual is p without d_i. Greedy targets: d_i is kept iff it is the argmax, the round ends
   with the argmax, so the output is the target's own greedy output.
4. the KV cells of the rejected tokens are removed from the target's cache and the draft's
   (`Context.seq_keep_first`), so both hold exactly the kept tokens.

A round yields 1..k+1 tokens, each with the target's logits row it was chosen from (logprobs);
the generation loop hands them out one by one and stops at an end-of-generation token, a stop
string or max_tokens exactly where plain decoding would (pyggml/llm/generate.py): a token kept
past the end is never shown, and its cells are dropped.

Drafts: `PromptLookup` (n-gram match in the sequence's own tokens: llama.cpp's prompt lookup
decoding / `--spec-type ngram-simple`, llama-cpp-python's LlamaPromptLookupDecoding; the CLI
flag is `--lookup`) and `DraftModel` (a smaller model with a compatible vocabulary, llama.cpp's
`--model-draft`; checked as llama.cpp's common_speculative_are_compatible).
"""

from __future__ import annotations

import os
import time
import weakref
from collections import deque
from dataclasses import dataclass, field

import numpy as np

from pyggml.errors import ModelError
from pyggml.llm.sampler import Sampler

DRAFT_MAX = 16          # llama.cpp's --draft-max default (llama-server)
DRAFT_MIN = 0           # llama.cpp's --draft-min default
LOOKUP_NGRAM_MAX = 16   # prompt lookup's longest tail compared; longer matches are kept often
VOCAB_MAX_SIZE_DIFFERENCE = 128     # llama.cpp's SPEC_VOCAB_MAX_SIZE_DIFFERENCE
VOCAB_CHECK_START_TOKEN_ID = 5      # llama.cpp's SPEC_VOCAB_CHECK_START_TOKEN_ID


class DraftVocabError(ModelError):
    """The draft model's vocabulary does not match the target's (speculation would propose
    the wrong tokens)."""


def check_vocab_compatible(target, draft, target_name: str = "target",
                           draft_name: str = "draft") -> None:
    """Refuse a draft tokenizer whose ids mean other tokens than the target's, as llama.cpp's
    common_speculative_are_compatible: same vocabulary type, same BOS / EOS use and ids, sizes
    within 128, and the same token texts from id 5 on. target / draft: Tokenizer objects."""
    def fail(what: str):
        raise DraftVocabError(f"the draft model {draft_name} cannot draft for {target_name}: "
                              f"{what}")
    if target.model != draft.model:
        fail(f"vocabulary type {draft.model!r} (tokenizer.ggml.model), the target's is "
             f"{target.model!r}")
    if target.add_bos != draft.add_bos or (target.add_bos and target.bos_id != draft.bos_id):
        fail(f"BOS add={draft.add_bos} id={draft.bos_id}, the target's add={target.add_bos} "
             f"id={target.bos_id}")
    if target.add_eos != draft.add_eos or (target.add_eos and target.eos_id != draft.eos_id):
        fail(f"EOS add={draft.add_eos} id={draft.eos_id}, the target's add={target.add_eos} "
             f"id={target.eos_id}")
    nt, nd = target.n_vocab, draft.n_vocab
    if abs(nt - nd) > VOCAB_MAX_SIZE_DIFFERENCE:
        fail(f"{nd} tokens, the target has {nt} (at most {VOCAB_MAX_SIZE_DIFFERENCE} apart)")
    # the tokenizers' id -> text tables when they have them (token_text checks each id: slow
    # over 150k ids)
    tt, td = getattr(target, "_tokens", None), getattr(draft, "_tokens", None)
    text_t = tt.__getitem__ if tt is not None else target.token_text
    text_d = td.__getitem__ if td is not None else draft.token_text
    for i in range(VOCAB_CHECK_START_TOKEN_ID, min(nt, nd)):
        if text_t(i) != text_d(i):
            fail(f"token {i} is {draft.token_text(i)!r}, the target's is "
                 f"{target.token_text(i)!r}")


def _is_llm(x) -> bool:
    """An LLM (pyggml.llm.runtime imports this module: no import back)."""
    return hasattr(x, "decode_batch") and hasattr(x, "tokenizer")


def _check_bounds(n_max, n_min) -> tuple[int, int]:
    for name, v in (("draft_max", n_max), ("draft_min", n_min)):
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 0:
            raise ModelError(f"{name} must be an integer >= 0, got {v!r}")
    if n_max < 1:
        raise ModelError(f"draft_max must be >= 1 (tokens drafted per round), got {n_max}")
    if n_min > n_max:
        raise ModelError(f"draft_min {n_min} is more than draft_max {n_max}")
    return int(n_max), int(n_min)


@dataclass
class Proposal:
    """What a draft proposes for one sequence: tokens, and per token the draft's distribution
    it was drawn from ((ids, probs)), or None where the draft is deterministic (a point mass)."""
    tokens: list[int] = field(default_factory=list)
    q: list = field(default_factory=list)
    match: int = 0          # prompt lookup: tokens of context its source matched (0: none)


@dataclass
class DraftRequest:
    """One sequence to draft for: its tokens then the last sampled token (`context`), at most
    `n` tokens, the target's sampler (parameters and penalty history)."""
    seq_id: int
    context: list[int]
    n: int
    sampler: Sampler


class PromptLookup:
    """Prompt lookup decoding: the context's last tokens are looked up earlier in it (prompt and
    text so far); the occurrence matching the most of them (at most ngram_max, at least
    ngram_min; the latest of equals) gives the draft: the tokens that followed it there. No
    second model; q is a point mass. The match length goes with the proposal: the Speculator
    learns how often drafts of each match length are kept and drafts only as far as that pays
    (a 1-token match in code is kept about one time in five, a 4-token one most times).
    n_max / n_min: as draft_max / draft_min (llama-cpp-python calls n_max num_pred_tokens)."""

    kind = "lookup"
    trims = True            # proposes all it has; the Speculator cuts it (Speculator.trim)

    def __init__(self, n_max: int = DRAFT_MAX, n_min: int = DRAFT_MIN,
                 ngram_max: int = LOOKUP_NGRAM_MAX, ngram_min: int = 1,
                 num_pred_tokens: int | None = None):
        if num_pred_tokens is not None:
            n_max = num_pred_tokens
        self.n_max, self.n_min = _check_bounds(n_max, n_min)
        for name, v in (("ngram_max", ngram_max), ("ngram_min", ngram_min)):
            if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 1:
                raise ModelError(f"prompt lookup {name} must be an integer >= 1, got {v!r}")
        if ngram_min > ngram_max:
            raise ModelError(f"prompt lookup ngram_min {ngram_min} is more than ngram_max "
                             f"{ngram_max}")
        self.ngram_max, self.ngram_min = int(ngram_max), int(ngram_min)

    def describe(self) -> str:
        return f"prompt lookup (n-grams {self.ngram_min}..{self.ngram_max})"

    def key(self) -> tuple:
        """Lookups of equal options share a Speculator (and its learnt costs and match
        statistics) on a target: LLM.speculator_for."""
        return ("lookup", self.n_max, self.n_min, self.ngram_max, self.ngram_min)

    def bind(self, target) -> None:
        pass

    def propose(self, reqs: list[DraftRequest]) -> list[Proposal]:
        return [self.lookup(r.context, r.n) for r in reqs]

    def lookup(self, context: list[int], n: int) -> Proposal:
        """Up to n tokens that followed the earlier occurrence of the context's longest
        matching tail (ngram_max..ngram_min tokens; the latest of equally long ones);
        Proposal.match: that tail's length (0: no draft)."""
        out = Proposal()
        if n <= 0 or len(context) < 2:
            return out
        a = np.asarray(context, np.int64)
        L = len(a)
        # p: where a draft would start (a[p:] follows the occurrence a[p-m:p] of the tail
        # a[L-m:]); the candidates shrink as the tail grows
        cand = np.arange(1, L)
        m, best = 0, -1
        while m < self.ngram_max:
            src = cand - 1 - m
            keep = src >= 0
            cand = cand[keep]
            cand = cand[a[src[keep]] == a[L - 1 - m]]
            if cand.size == 0:
                break
            m, best = m + 1, int(cand[-1])
        if best < 0 or m < self.ngram_min:
            return out
        out.tokens = [int(t) for t in a[best: best + n]]
        out.q = [None] * len(out.tokens)
        out.match = m
        return out

    def forget_after(self, seq_id: int, n_keep: int) -> None:
        pass

    def prefill(self, seq_id: int, tokens: list[int]) -> None:
        pass

    def start_prompt(self, seq_id: int, ids: list[int]) -> list[int]:
        return []

    def eval_prompt_chunks(self, chunks: list[tuple[list[int], int]]) -> None:
        pass

    def close(self) -> None:
        pass


class DraftModel:
    """A smaller model with the target's vocabulary (llama.cpp's --model-draft). `model`: a GGUF
    path or an LLM (used as it is; its n_seq_max must cover the target's sequences). A path is
    opened when bound to a target, with the target's n_ctx, n_seq_max, threads and n_ubatch
    unless `llm_kwargs` say otherwise, and sliding-window layers over all cells (swa_full: the
    draft's cache is cut back every round, which a window-sized cache could not always keep).
    p_min: stop drafting when the draft's own probability (softmax of its logits) of its token
    falls below it (llama.cpp's --draft-p-min; 0: never)."""

    kind = "draft model"
    trims = False           # drafting costs: the Speculator asks for k tokens, not more

    def __init__(self, model, n_max: int = DRAFT_MAX, n_min: int = DRAFT_MIN,
                 p_min: float = 0.0, **llm_kwargs):
        self.n_max, self.n_min = _check_bounds(n_max, n_min)
        if isinstance(p_min, bool) or not isinstance(p_min, (int, float)) or \
                not 0.0 <= p_min <= 1.0:
            raise ModelError(f"draft p_min must be a number in [0, 1], got {p_min!r}")
        self.p_min = float(p_min)
        self.model = model
        self.llm_kwargs = llm_kwargs
        self.llm = None
        self._owned = False
        self._samplers: dict[int, Sampler] = {}

    def describe(self) -> str:
        path = self.llm.path if self.llm is not None else os.fspath(self.model)
        return f"draft model {os.path.basename(path)}"

    def key(self) -> tuple | None:
        """What the draft opens: (file, options) for a path (a target keeps one draft per key,
        LLM.speculator_for); None for an LLM given as it is (nothing is opened)."""
        if _is_llm(self.model):
            return None
        return (os.path.realpath(os.fspath(self.model)), self.n_max, self.n_min, self.p_min,
                tuple(sorted((k, repr(v)) for k, v in self.llm_kwargs.items())))

    def bind(self, target) -> None:
        """Open the draft model for `target` (an LLM) and check its vocabulary."""
        if self.llm is not None and getattr(self, "_bound_to", None) is target:
            return                          # checked already
        if self.llm is None:
            if _is_llm(self.model):
                self.llm = self.model
            else:
                kw = dict(n_ctx=target.n_ctx, n_seq_max=target.n_seq_max,
                          n_ubatch=target.n_ubatch, n_batch=target.n_batch,
                          n_threads=target.backend.n_threads,
                          n_threads_batch=target.backend.n_threads_batch, swa_full=True)
                kw.update(self.llm_kwargs)
                self.llm = type(target)(self.model, **kw)     # an LLM (no import cycle)
                self._owned = True
        try:
            check_vocab_compatible(target.tokenizer, self.llm.tokenizer,
                                   os.path.basename(target.path),
                                   os.path.basename(self.llm.path))
            if self.llm.n_seq_max < target.n_seq_max:
                raise ModelError(f"the draft model has n_seq_max={self.llm.n_seq_max}, the "
                                 f"target {target.n_seq_max}: it needs one sequence per target "
                                 f"sequence")
        except BaseException:
            self.close()
            raise
        self._bound_to = target

    def _sampler(self, req: DraftRequest) -> Sampler:
        """The draft's sampler of a sequence: the target's parameters, its own generator
        (seeded from the target's first draw, so a seeded run is reproducible)."""
        held = self._samplers.get(req.seq_id)        # (the target's sampler, the draft's)
        if held is not None and held[0]() is req.sampler:
            return held[1]
        seed = int(req.sampler.uniform() * 2 ** 32) if req.sampler.params.temperature > 0 else 0
        s = req.sampler.fork(seed)
        self._samplers[req.seq_id] = (weakref.ref(req.sampler), s)
        return s

    def _sync(self, req: DraftRequest) -> list[int]:
        """Keep the draft cells of the longest common prefix with the context; the tokens to
        evaluate next (at least the last)."""
        llm, ctx = self.llm, req.context
        held = llm.seq_tokens(req.seq_id)
        n = 0
        for a, b in zip(held, ctx):
            if a != b:
                break
            n += 1
        n = min(n, len(ctx) - 1)
        if n > 0 and not llm.kv.can_keep_prefix(req.seq_id, n):
            n = 0
        if n < len(held):
            llm.truncate(req.seq_id, n)
        return ctx[n:]

    def prefill(self, seq_id: int, tokens: list[int]) -> None:
        """Evaluate a prompt in the draft's sequence (keeping the cells of a common prefix), so
        the first round evaluates the new token only: prompt time, not generation time."""
        llm = self.llm
        with llm.lock:
            pending = self._sync(DraftRequest(seq_id, list(tokens) + [-1], 0, None))
            if len(pending) > 1 and len(pending) - 1 <= llm.n_ctx - llm.kv.n_used():
                llm.decode_batch([(pending[:-1], seq_id)])

    def start_prompt(self, seq_id: int, ids: list[int]) -> list[int]:
        """A prompt about to be evaluated in chunks (the server, pyggml/server/engine.py): keep
        the draft's cells of the longest common prefix with `ids`; returns the tokens of `ids`
        the draft has yet to evaluate (the ends of the chunks: eval_prompt_chunks)."""
        with self.llm.lock:
            return self._sync(DraftRequest(seq_id, list(ids) + [-1], 0, None))[:-1]

    def eval_prompt_chunks(self, chunks: list[tuple[list[int], int]]) -> None:
        """Evaluate prompt chunks [(tokens, seq_id)] in the draft's sequences, in one batch
        (nothing when the draft's cache has no room: the first round then catches up)."""
        chunks = [(t, sid) for t, sid in chunks if t]
        llm = self.llm
        with llm.lock:
            if chunks and sum(len(t) for t, _ in chunks) <= llm.n_ctx - llm.kv.n_used():
                llm.decode_batch(chunks)

    def propose(self, reqs: list[DraftRequest]) -> list[Proposal]:
        """Draft for several sequences together: one draft decode_batch per drafted position."""
        out = [Proposal() for _ in reqs]
        llm = self.llm
        with llm.lock:
            live = [i for i, r in enumerate(reqs) if r.n > 0]
            pending = {}
            for i in live:
                pending[i] = self._sync(reqs[i])
            # the draft's cache must hold each context and n - 1 drafted tokens
            need = sum(len(pending[i]) + reqs[i].n - 1 for i in live)
            if need > llm.n_ctx - llm.kv.n_used():
                live = []                   # no room: no draft this round (the target decides)
            hist = {i: deque(reqs[i].sampler.recent, maxlen=reqs[i].sampler.recent.maxlen)
                    for i in live}
            while live:
                logits = llm.decode_batch([(pending[i], reqs[i].seq_id) for i in live])
                nxt = []
                for i in live:
                    r = reqs[i]
                    row = logits[r.seq_id]
                    row = row[-1] if row.ndim == 2 else row
                    s = self._sampler(r)
                    ids, probs = s.distribution(row, hist[i])
                    if len(ids) == 1:
                        tok, q = int(ids[0]), None
                    else:
                        j = int(np.searchsorted(np.cumsum(probs), s.uniform() * probs.sum()))
                        tok, q = int(ids[min(j, len(ids) - 1)]), (ids, probs)
                    if self.p_min > 0.0:
                        x = row.astype(np.float64)
                        e = np.exp(x - x.max())
                        if e[tok] / e.sum() < self.p_min:
                            continue
                    out[i].tokens.append(tok)
                    out[i].q.append(q)
                    hist[i].append(tok)
                    if len(out[i].tokens) < r.n:
                        pending[i] = [tok]
                        nxt.append(i)
                live = nxt
        return out

    def forget_after(self, seq_id: int, n_keep: int) -> None:
        """Drop the draft's cells from position n_keep on (the target rejected those)."""
        llm = self.llm
        if llm is None:
            return
        with llm.lock:
            if len(llm.seq_tokens(seq_id)) > n_keep:
                llm.truncate(seq_id, n_keep)

    def close(self) -> None:
        if self._owned and self.llm is not None:
            self.llm.close()
        self.llm = None
        self._bound_to = None


def as_draft(spec, n_max: int | None = None, n_min: int | None = None):
    """A draft from what a user passes: PromptLookup / DraftModel as they are, 'lookup' (prompt
    lookup), a GGUF path or an LLM (a DraftModel); None stays None."""
    if spec is None or isinstance(spec, (PromptLookup, DraftModel)):
        return spec
    kw = {k: v for k, v in (("n_max", n_max), ("n_min", n_min)) if v is not None}
    if isinstance(spec, str) and spec == "lookup":
        return PromptLookup(**kw)
    if isinstance(spec, (str, os.PathLike)) or _is_llm(spec):
        return DraftModel(spec, **kw)
    raise ModelError(f"draft_model must be a PromptLookup, a DraftModel, a GGUF path, an LLM "
                     f"or 'lookup', got {type(spec).__name__} {spec!r:.60}")


def _draw(ids: np.ndarray, w: np.ndarray, sampler: Sampler) -> int:
    """A token from weights w over ids (float64, not necessarily normalized)."""
    i = int(np.searchsorted(np.cumsum(w), sampler.uniform() * w.sum()))
    return int(ids[min(i, ids.size - 1)])


def accept_tokens(rows: np.ndarray, proposal: Proposal, sampler: Sampler) -> list[int]:
    """The speculative sampling rule (module docstring, step 3). rows: float32 [k+1, n_vocab],
    the target's logits after last, d_1, ..., d_k. Returns the round's tokens (the kept drafts,
    then one drawn token); each is passed to sampler.accept as it is decided, so the repetition
    penalty of the next row sees it."""
    out = []
    greedy = sampler.params.temperature <= 0.0
    for i, d in enumerate(proposal.tokens):
        ids, p = sampler.distribution(rows[i])
        if greedy:
            tok = int(ids[0])
            keep = tok == d
        else:
            hit = np.flatnonzero(ids == d)
            pd = float(p[hit[0]]) if hit.size else 0.0
            q = proposal.q[i]
            if q is None:
                qd = 1.0
            else:
                qh = np.flatnonzero(q[0] == d)
                qd = float(q[1][qh[0]]) if qh.size else 0.0
            keep = pd >= qd or (pd > 0.0 and sampler.uniform() * qd < pd)
            if keep:
                tok = d
            else:                       # the residual norm(max(0, p - q)) over p's support
                if q is None:
                    r = np.where(ids == d, 0.0, p)
                else:
                    qd_dense = dict(zip(q[0].tolist(), q[1].tolist()))
                    r = np.maximum(0.0, p - np.array([qd_dense.get(t, 0.0) for t in
                                                      ids.tolist()]))
                tok = _draw(ids, r if r.sum() > 0 else p, sampler)
        sampler.accept(tok)
        out.append(tok)
        if not keep:
            return out
    tok = sampler.sample(rows[len(proposal.tokens)])
    sampler.accept(tok)
    out.append(tok)
    return out


@dataclass
class SpecStats:
    """Counters of speculative rounds (one LLM's, since it was made or its stats reset)."""
    rounds: int = 0
    drafted: int = 0
    accepted: int = 0

    @property
    def acceptance_rate(self) -> float:
        return self.accepted / self.drafted if self.drafted else 0.0


class CostModel:
    """What a round costs, learnt while decoding (seconds): a drafted token (moving average) and
    the model's verification of n rows. On a CPU that is not a line: a batch of rows costs about
    one row while the weights' bandwidth bounds it, then steps where the matmul kernels change
    (pyggml's K-quant decode kernel takes up to 8 rows with one read of the weights, the gemm
    more, the AMX tiles 16 and up). So each timed size keeps its own moving average; a size not
    timed yet is interpolated between its timed neighbours, and past the largest timed size
    extrapolated with the slope of an exponentially weighted least-squares line through all
    timings (never below the largest size's time). The first timing of each size is dropped:
    it includes building that size's graph, and a size that looked that dear might never be
    chosen, so never timed again."""

    DECAY = 0.95

    def __init__(self):
        self.draft_s: float | None = None
        self._w = self._x = self._y = self._xx = self._xy = 0.0
        self._by_rows: dict[int, float] = {}    # rows -> moving average of seconds
        self._seen: set[int] = set()            # sizes timed once (that time is not kept)
        self.n_verify = 0

    def add_draft(self, n_tokens: int, seconds: float) -> None:
        if n_tokens > 0:
            per = seconds / n_tokens
            self.draft_s = per if self.draft_s is None else 0.8 * self.draft_s + 0.2 * per

    def add_verify(self, n_rows: int, seconds: float) -> None:
        if n_rows not in self._seen:    # the first of a size builds its graph: not a cost
            self._seen.add(n_rows)
            return
        d = self.DECAY
        self._w, self._x, self._y = d * self._w + 1, d * self._x + n_rows, d * self._y + seconds
        self._xx = d * self._xx + n_rows * n_rows
        self._xy = d * self._xy + n_rows * seconds
        old = self._by_rows.get(n_rows)
        self._by_rows[n_rows] = seconds if old is None else 0.7 * old + 0.3 * seconds
        self.n_verify += 1

    def verify_s(self, n_rows: int) -> float | None:
        """Seconds to verify n_rows (None until rows of several sizes were timed)."""
        if self.n_verify < 4 or len(self._by_rows) < 2:
            return None
        t = self._by_rows
        if n_rows in t:
            return t[n_rows]
        sizes = sorted(t)
        if n_rows < sizes[0]:
            return t[sizes[0]]
        if n_rows > sizes[-1]:
            xm, ym = self._x / self._w, self._y / self._w
            var = self._xx / self._w - xm * xm
            slope = max(0.0, (self._xy / self._w - xm * ym) / var) if var > 1e-9 else 0.0
            return t[sizes[-1]] + slope * (n_rows - sizes[-1])
        hi = next(n for n in sizes if n > n_rows)
        lo = max(n for n in sizes if n < n_rows)
        return t[lo] + (t[hi] - t[lo]) * (n_rows - lo) / (hi - lo)

    def best_k(self, alpha: float, k_lo: int, k_hi: int) -> int | None:
        """The k of the most expected tokens per second: a round of k drafts yields
        (1 - α^(k+1)) / (1 - α) tokens when each draft is kept with probability α, and costs k
        drafted tokens and a verification of k + 1 rows (None: costs not known yet)."""
        if self.draft_s is None or self.verify_s(1) is None or k_hi < k_lo:
            return None
        best, best_rate = None, -1.0
        for k in range(k_lo, k_hi + 1):
            gain = (1.0 - alpha ** (k + 1)) / (1.0 - alpha) if alpha < 1.0 else k + 1.0
            rate = gain / (k * self.draft_s + self.verify_s(k + 1))
            if rate > best_rate:
                best, best_rate = k, rate
        return best


class Speculator:
    """A target LLM with a draft: the per-sequence draft length k and the rounds.

    k adapts to the acceptance within [max(n_min, 1), n_max]. It starts at (n_max + n_min) / 2
    rounded up; every draft kept → k grows by half; a rejection after a kept drafts →
    k = a + 1. Once the rounds' costs are known (`CostModel`, timed by `round`), k is the one
    with the most expected tokens per second at the sequence's acceptance rate (a moving
    estimate of the chance that a draft is kept): with a draft model whose tokens cost a fair
    share of the model's, or a CPU whose verification grows with the rows, that is often far
    below n_max. A proposal shorter than n_min is not used (a plain step instead), as
    llama.cpp's --draft-min."""

    ALPHA_DECAY = 0.9
    # prompt lookup (a draft that `trims`): a drafted token's chance to be kept is learnt per
    # match length, 1..MATCH_CAP tokens (longer counts as MATCH_CAP), as decayed counts with a
    # Beta(MATCH_PRIOR) prior; the token j places after a match of m sits at a match of m + j
    # once the ones before it are kept. Tuned offline on recorded greedy outputs of code
    # prompts (tools/bench_speculative.py): the results move little for caps 4..8.
    MATCH_CAP = 4
    MATCH_DECAY = 0.95
    MATCH_PRIOR = (2.0, 2.0)
    # ... and after EXPLORE_EVERY proposals in a row were cut to nothing, the next drafts one
    # token: it keeps the statistics and the 2-row timing current (one noisy timing could else
    # stop drafting for good); it costs at most one 2-row step in EXPLORE_EVERY
    EXPLORE_EVERY = 8

    def __init__(self, target, draft):
        self.target, self.draft = target, draft
        draft.bind(target)
        self.k = [self._k0()] * target.n_seq_max
        self.costs = CostModel()
        self._kept = [[0.0, 0.0] for _ in range(target.n_seq_max)]   # (kept, rejected), decayed
        # per sequence, per match length 0..MATCH_CAP: (kept, rejected) drafted tokens, decayed
        self._by_match = [np.zeros((self.MATCH_CAP + 1, 2)) for _ in range(target.n_seq_max)]
        self._cut_to_none = [0] * target.n_seq_max

    def alpha(self, seq_id: int) -> float:
        """Estimated chance that a drafted token is kept (a Beta(1, 1) prior, decayed counts)."""
        a, r = self._kept[seq_id]
        return (a + 1.0) / (a + r + 2.0)

    def k_for(self, seq_id: int) -> int:
        lo, hi = max(self.draft.n_min, 1), self.draft.n_max
        k = self.costs.best_k(min(self.alpha(seq_id), 0.999), lo, hi)
        return self.k[seq_id] if k is None else k

    def _k0(self) -> int:
        return max(1, -(-(self.draft.n_max + self.draft.n_min) // 2))

    def reset_seq(self, seq_id: int) -> None:
        self.k[seq_id] = self._k0()
        self._kept[seq_id] = [0.0, 0.0]
        self._by_match[seq_id][:] = 0.0
        self._cut_to_none[seq_id] = 0

    def request(self, seq_id: int, last: int, sampler: Sampler, cap: int) -> DraftRequest:
        """What to draft for seq_id this round: at most min(k, cap) tokens (cap: what max_tokens
        and the free cells allow past `last`); a draft that trims is asked for n_max."""
        ctx = self.target.context.seq_tokens(seq_id) + [int(last)]
        k = self.draft.n_max if self.draft.trims else self.k_for(seq_id)
        n = max(0, min(k, cap, self.target.n_ubatch - 1))
        return DraftRequest(seq_id, ctx, n, sampler)

    def propose(self, reqs: list[DraftRequest]) -> list[Proposal]:
        t0 = time.perf_counter()
        props = self.draft.propose(reqs)
        self.costs.add_draft(max((len(p.tokens) for p in props), default=0),
                             time.perf_counter() - t0)
        for r, p in zip(reqs, props):
            if p.match > 0:
                self.trim(r.seq_id, p)
            if len(p.tokens) < max(self.draft.n_min, 1):
                p.tokens, p.q = [], []
        return props

    def trim(self, seq_id: int, p: Proposal) -> None:
        """Cut a lookup proposal to the length of the most expected tokens per second: with
        s_j the learnt chance that its first j tokens are all kept (a product over their match
        lengths), a cut to k yields 1 + s_1 + ... + s_k tokens for a verification of k + 1
        rows. Before the verification costs are known: the adaptive k."""
        if not p.tokens:
            return
        if self.costs.verify_s(1) is None:
            k = self.k[seq_id]
        else:
            c = self._by_match[seq_id]
            ms = np.minimum(p.match + np.arange(len(p.tokens)), self.MATCH_CAP)
            a, b = self.MATCH_PRIOR
            kept = np.cumprod((c[ms, 0] + a) / (c[ms, 0] + c[ms, 1] + a + b))
            gain = 1.0 + np.concatenate(([0.0], np.cumsum(kept)))
            rate = [gain[j] / self.costs.verify_s(j + 1) for j in range(len(gain))]
            k = int(np.argmax(rate))
            if k == 0:
                self._cut_to_none[seq_id] += 1
                if self._cut_to_none[seq_id] >= self.EXPLORE_EVERY:
                    k = 1
            if k:
                self._cut_to_none[seq_id] = 0
        del p.tokens[k:], p.q[k:]

    def finish_round(self, seq_id: int, n_before: int, proposal: Proposal,
                     rows: np.ndarray, sampler: Sampler) -> list[int]:
        """After the target evaluated [last] + proposal.tokens on seq_id (which held n_before
        tokens): the round's tokens; the rejected drafts' cells are removed from both caches."""
        toks = accept_tokens(rows, proposal, sampler)
        n_draft, n_kept = len(proposal.tokens), len(toks) - 1
        t = self.target
        t.context.seq_keep_first(seq_id, n_before + 1 + n_kept, invalidate=False)
        if isinstance(self.draft, DraftModel):
            self.draft.forget_after(seq_id, n_before + 1 + n_kept)
        if n_draft:
            st = t.stats
            st.spec.rounds += 1
            st.spec.drafted += n_draft
            st.spec.accepted += n_kept
            kept = self._kept[seq_id]
            d = self.ALPHA_DECAY
            kept[0] = d * kept[0] + n_kept
            kept[1] = d * kept[1] + (n_kept < n_draft)
            if n_kept == n_draft:
                self.k[seq_id] = min(self.draft.n_max, self.k[seq_id] + max(1, self.k[seq_id] // 2))
            else:
                self.k[seq_id] = max(self.draft.n_min, 1, n_kept + 1)
            if proposal.match > 0:      # each token decided: kept, or the one rejected
                c = self._by_match[seq_id]
                c *= self.MATCH_DECAY
                for j in range(min(n_kept + 1, n_draft)):
                    c[min(proposal.match + j, self.MATCH_CAP), 0 if j < n_kept else 1] += 1.0
        return toks

    def prefill(self, seq_id: int, tokens: list[int]) -> None:
        """The prompt `tokens` (what seq_id holds now) to the draft, before the first round."""
        self.draft.prefill(seq_id, tokens)

    def close(self) -> None:
        self.draft.close()
