"""The sampling chain of llama.cpp's `common` (common/sampling.cpp, docs/FORMATS.md §6), with its
defaults and its order:

    logit_bias → penalties → DRY → top_k → typical_p → top_p → min_p → XTC → temperature → dist

or, with mirostat 1 / 2: logit_bias → temperature → mirostat (v1 / v2), which draws itself (the
penalties, DRY and the truncations are not in that chain, as in llama.cpp).

Each step works on the candidates as llama.cpp's `llama_token_data_array` holds them: ids and
fp32 logits in an order (sorted by logit or not) that the steps keep or change as llama.cpp's do,
because the draw walks the candidates in that order. top_k sorts; typical_p leaves them ordered
by its score; min_p on unsorted candidates keeps their order (with top_k 0 and top_p 1 the draw
walks token ids in id order, as llama.cpp's). Temperature <= 0 keeps the first largest logit of
what the chain left (typical_p and XTC can drop the argmax even then, as in llama.cpp).

The penalties are llama.cpp's `penalties` sampler over the last `repeat_last_n` tokens (0: off,
-1: all of them): a token seen there has its logit divided by `repeat_penalty` (multiplied when
<= 0), then `frequency_penalty` times its count and `presence_penalty` subtracted (all in fp32,
in that order). `logit_bias` adds (token id, bias) pairs to the logits first (-inf bans a token).
DRY (Don't Repeat Yourself): over the last `dry_penalty_last_n` tokens, a token that would extend
a repeated run of n >= dry_allowed_length tokens loses dry_multiplier · dry_base^(n -
dry_allowed_length); the runs stop at the sequence breakers (strings, tokenized as llama.cpp
does: `dry_breakers`). XTC (exclude top choices): with probability xtc_probability, every token
with p >= xtc_threshold but the least likely of them goes.

Random draws reproduce libstdc++'s std::mt19937 and its uniform_real_distribution /
discrete_distribution (generate_canonical: two 32-bit outputs per double, one per float), which
llama.cpp's dist, XTC and mirostat samplers use, each with its own generator seeded with `seed`:
the same seed gives llama.cpp's tokens (tests/test_sampler_chain.py checks this against
llama-cpp-python's sampler on fixed logits).
"""

from __future__ import annotations

import math
import numbers
import weakref
from collections import deque
from dataclasses import dataclass, fields

import numpy as np

from pyggml.errors import ArgumentTypeError, ModelError

DEFAULT_SEED = 0xFFFFFFFF       # llama.cpp's LLAMA_DEFAULT_SEED: a random seed
RANDOM_SEEDS = (-1, DEFAULT_SEED)   # -1: llama.cpp's `--seed -1`, also random
DRY_BREAKERS = ("\n", ":", "\"", "*")     # llama.cpp's default DRY sequence breakers
DRY_MAX_CHARS, DRY_MAX_TAIL = 40, 20      # llama.cpp's bounds on a breaker (chars, tail tokens)
MIROSTAT_M = 100                # llama.cpp's m: tokens mirostat v1 estimates s_hat from
_INT_FIELDS = ("top_k", "repeat_last_n", "seed", "mirostat", "dry_allowed_length",
               "dry_penalty_last_n", "min_keep")
_OTHER_FIELDS = ("logit_bias", "dry_sequence_breakers")     # checked on their own (validate)
_F32 = np.float32


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 0.8
    top_k: int = 40
    top_p: float = 0.95
    min_p: float = 0.05
    repeat_penalty: float = 1.0
    repeat_last_n: int = 64
    seed: int = DEFAULT_SEED
    presence_penalty: float = 0.0           # llama.cpp's penalty_present (OpenAI's field)
    frequency_penalty: float = 0.0          # llama.cpp's penalty_freq
    logit_bias: tuple = ()                  # ((token id, bias), ...); a dict is taken too
    typical_p: float = 1.0                  # 1: off
    xtc_probability: float = 0.0            # 0: off
    xtc_threshold: float = 0.1              # > 0.5: off
    mirostat: int = 0                       # 0: off, 1: mirostat, 2: mirostat 2.0
    mirostat_tau: float = 5.0               # target entropy
    mirostat_eta: float = 0.1               # learning rate
    dry_multiplier: float = 0.0             # 0: off
    dry_base: float = 1.75
    dry_allowed_length: int = 2
    dry_penalty_last_n: int = 64            # 0: off
    dry_sequence_breakers: tuple = DRY_BREAKERS
    min_keep: int = 0                       # truncations keep at least this many (0: off)

    def __post_init__(self):
        lb = self.logit_bias
        if isinstance(lb, dict):
            lb = tuple(lb.items())
        elif lb is None:
            lb = ()
        elif isinstance(lb, list):
            lb = tuple(tuple(x) if isinstance(x, list) else x for x in lb)
        object.__setattr__(self, "logit_bias", lb)
        br = self.dry_sequence_breakers
        if br is None:
            br = ()
        elif isinstance(br, str):
            br = (br,)
        elif isinstance(br, list):
            br = tuple(br)
        object.__setattr__(self, "dry_sequence_breakers", br)

    @property
    def dry_on(self) -> bool:
        """DRY changes anything (llama.cpp's dry_enabled)."""
        return (self.mirostat == 0 and self.dry_multiplier != 0.0 and self.dry_base >= 1.0
                and self.dry_penalty_last_n != 0)

    @property
    def xtc_on(self) -> bool:
        return self.mirostat == 0 and self.xtc_probability > 0.0 and self.xtc_threshold <= 0.5

    @property
    def fixed_distribution(self) -> bool:
        """Whether each step draws from a distribution fixed by the logits and the history
        (speculative decoding's rule needs one): not with mirostat (its state moves with every
        draw) nor XTC (a draw of its own decides what it removes)."""
        return self.mirostat == 0 and not self.xtc_on

    def validate(self) -> "SamplingParams":
        for f in fields(self):
            if f.name in _OTHER_FIELDS:
                continue
            v = getattr(self, f.name)
            kind = numbers.Integral if f.name in _INT_FIELDS else numbers.Real
            if isinstance(v, bool) or not isinstance(v, kind):
                what = "an integer" if kind is numbers.Integral else "a number"
                raise ArgumentTypeError(f"invalid sampling parameters: {f.name} must be {what}, "
                                        f"got {v!r}")
        problems = []
        if not np.isfinite(self.temperature):
            problems.append(f"temperature must be finite, got {self.temperature}")
        if self.top_k < 0:
            problems.append(f"top_k must be >= 0 (0 = off), got {self.top_k}")
        for name in ("top_p", "min_p", "typical_p", "xtc_probability"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                problems.append(f"{name} must be in [0, 1], got {getattr(self, name)}")
        if not 0.0 <= self.xtc_threshold <= 1.0:
            problems.append(f"xtc_threshold must be in [0, 1] (> 0.5: off), got "
                            f"{self.xtc_threshold}")
        if not self.repeat_penalty > 0.0:
            problems.append(f"repeat_penalty must be > 0, got {self.repeat_penalty}")
        if self.repeat_last_n < -1:
            problems.append(f"repeat_last_n must be >= -1, got {self.repeat_last_n}")
        for name in ("presence_penalty", "frequency_penalty", "mirostat_tau", "mirostat_eta",
                     "dry_multiplier", "dry_base"):
            if not np.isfinite(getattr(self, name)):
                problems.append(f"{name} must be finite, got {getattr(self, name)}")
        if self.mirostat not in (0, 1, 2):
            problems.append(f"mirostat must be 0 (off), 1 or 2, got {self.mirostat}")
        if self.dry_allowed_length < 0:
            problems.append(f"dry_allowed_length must be >= 0, got {self.dry_allowed_length}")
        if self.dry_penalty_last_n < 0:
            problems.append(f"dry_penalty_last_n must be >= 0 (0 = off), got "
                            f"{self.dry_penalty_last_n}")
        if self.min_keep < 0:
            problems.append(f"min_keep must be >= 0, got {self.min_keep}")
        if not (isinstance(self.dry_sequence_breakers, tuple) and all(
                isinstance(s, str) for s in self.dry_sequence_breakers)):
            problems.append(f"dry_sequence_breakers must be a list of strings, got "
                            f"{self.dry_sequence_breakers!r:.60}")
        elif len(self.dry_sequence_breakers) > 64:
            problems.append(f"dry_sequence_breakers: at most 64 strings, got "
                            f"{len(self.dry_sequence_breakers)}")
        if not isinstance(self.logit_bias, tuple):
            problems.append(f"logit_bias must be (token id, bias) pairs, got {self.logit_bias!r}")
        else:
            for pair in self.logit_bias:
                ok = isinstance(pair, tuple) and len(pair) == 2
                tok, bias = pair if ok else (None, None)
                if not (ok and isinstance(tok, numbers.Integral) and not isinstance(tok, bool)
                        and tok >= 0 and isinstance(bias, numbers.Real)
                        and not isinstance(bias, bool) and bias == bias and bias != np.inf):
                    problems.append(f"logit_bias entries must be (token id >= 0, bias: a number "
                                    f"or -inf), got {pair!r}")
                    break
        if not -1 <= self.seed <= 0xFFFFFFFF:
            problems.append(f"seed must be in [0, 2^32) or -1 (random), got {self.seed}")
        if problems:
            raise ModelError("invalid sampling parameters: " + "; ".join(problems))
        return self


# ---- libstdc++'s random numbers ----------------------------------------------------------------
class _MT19937:
    """std::mt19937(seed) with libstdc++'s generate_canonical."""

    def __init__(self, seed: int):
        self._mt = np.random.MT19937(0)
        self._mt._legacy_seeding(seed)      # init_genrand(seed), as std::mt19937(seed)

    def canonical_double(self) -> float:
        """uniform_real_distribution<double>(0, 1): (a + b·2^32) / 2^64 in double."""
        a, b = (int(x) & 0xFFFFFFFF for x in self._mt.random_raw(2))
        r = (a + b * 4294967296.0) / 18446744073709551616.0
        return r if r < 1.0 else math.nextafter(1.0, 0.0)

    def canonical_float(self) -> np.float32:
        """uniform_real_distribution<float>(0, 1): float(a) / 2^32 in float."""
        a = int(self._mt.random_raw()) & 0xFFFFFFFF
        r = _F32(a) / _F32(4294967296.0)
        return r if r < _F32(1) else np.nextafter(_F32(1), _F32(0))

    def discrete(self, p: np.ndarray) -> int:
        """std::discrete_distribution over weights p (fp32): no draw for fewer than two."""
        if p.size < 2:
            return 0
        w = p.astype(np.float64)
        w /= np.cumsum(w)[-1]               # std::accumulate, in order
        cp = np.cumsum(w)
        cp[-1] = 1.0
        return int(np.searchsorted(cp, self.canonical_double(), side="left"))


# ---- the steps (each as llama.cpp's sampler on the candidates it is given) ---------------------
class _Cands:
    """llama_token_data_array: ids, fp32 logits, and whether they are sorted by logit (desc)."""
    __slots__ = ("ids", "vals", "sorted")

    def __init__(self, ids, vals, sorted_):
        self.ids, self.vals, self.sorted = ids, vals, sorted_

    def sort(self) -> None:
        if not self.sorted:
            order = np.argsort(-self.vals, kind="stable")
            self.ids, self.vals, self.sorted = self.ids[order], self.vals[order], True

    def keep(self, sel) -> None:
        self.ids, self.vals = self.ids[sel], self.vals[sel]

    def probs(self, sort: bool) -> np.ndarray:
        """llama_sampler_softmax_impl: fp32 probabilities, the sum taken in array order."""
        if sort:
            self.sort()
        mx = self.vals[0] if self.sorted else self.vals.max()
        e = np.exp(self.vals - mx, dtype=_F32)
        return e / np.cumsum(e, dtype=_F32)[-1]


def _top_k(c: _Cands, k: int) -> None:
    if k <= 0:
        return
    k = min(k, c.ids.size)
    if not c.sorted and k < c.ids.size:
        part = np.argpartition(-c.vals, k - 1)[:k]
        c.keep(part)
    c.sorted = False
    c.sort()


def _typical(c: _Cands, p: float, min_keep: int) -> None:
    if p >= 1.0:
        return
    pr = c.probs(sort=True)
    with np.errstate(divide="ignore", invalid="ignore"):
        logp = np.log(pr, dtype=_F32)
        entropy = np.cumsum(-pr * logp, dtype=_F32)[-1]
        shifted = np.abs(-logp - entropy)
    order = np.argsort(shifted, kind="stable")
    cum = np.cumsum(pr[order], dtype=_F32)
    i = np.arange(cum.size)
    hit = np.flatnonzero((cum > _F32(p)) & ((min_keep == 0) | (i >= min_keep - 1)))
    last = int(hit[0]) + 1 if hit.size else cum.size
    c.keep(order[:last])
    c.sorted = False


def _top_p(c: _Cands, p: float, min_keep: int) -> None:
    if p >= 1.0:
        return
    pr = c.probs(sort=False)
    if not c.sorted:
        order = np.argsort(-c.vals, kind="stable")
        c.ids, c.vals, pr, c.sorted = c.ids[order], c.vals[order], pr[order], True
    cum = np.cumsum(pr, dtype=_F32)
    i = np.arange(cum.size)
    hit = np.flatnonzero((cum >= _F32(p)) & (i + 1 >= min_keep))
    last = int(hit[0]) + 1 if hit.size else cum.size
    c.keep(slice(0, last))


def _min_p(c: _Cands, p: float, min_keep: int) -> None:
    if p <= 0.0 or c.ids.size == 0:
        return
    log_p = np.log(_F32(p), dtype=_F32)
    if not c.sorted:
        sel = c.vals >= c.vals.max() + log_p
        n = int(np.count_nonzero(sel))
        if n > 0 and n >= min_keep:
            c.keep(sel)
            return
        c.sort()
    below = c.vals < c.vals[0] + log_p
    below[0] = False
    i = np.arange(below.size)
    cut = np.flatnonzero(below & (i >= min_keep))
    c.keep(slice(0, int(cut[0]) if cut.size else below.size))


def _xtc(c: _Cands, prob: float, threshold: float, min_keep: int, rng: _MT19937) -> None:
    if prob <= 0.0 or threshold > 0.5 or c.ids.size < 2:
        return
    if rng.canonical_float() > _F32(prob):
        return
    pr = c.probs(sort=True)
    above = pr >= _F32(threshold)
    pos_last = 0 if not above[0] else (int(np.argmin(above)) - 1 if not above.all()
                                        else above.size - 1)
    if c.ids.size - pos_last >= min_keep and pos_last > 0:
        c.keep(slice(pos_last, None))


def _argmax_first(c: _Cands) -> int:
    """temperature <= 0: the first largest logit in array order."""
    return int(c.ids[int(np.argmax(c.vals))])


def _dist(c: _Cands, rng: _MT19937) -> int:
    """llama_sampler_dist: fp32 exp(l - max), the running sum in double until sum·u."""
    u = rng.canonical_double()
    if c.ids.size == 1:
        return int(c.ids[0])
    mx = c.vals[0] if c.sorted else c.vals.max()
    cum = np.cumsum(np.exp(c.vals - mx, dtype=_F32).astype(np.float64))
    i = int(np.searchsorted(cum, cum[-1] * u, side="left"))
    return int(c.ids[min(i, c.ids.size - 1)])


class _Mirostat:
    """Mirostat v1 / v2 (llama.cpp's): a target surprise tau, mu moved by eta per token."""

    def __init__(self, version: int, tau: float, eta: float, n_vocab: int, rng: _MT19937):
        self.version, self.tau, self.eta = version, _F32(tau), _F32(eta)
        self.mu = _F32(2.0) * self.tau
        self.n_vocab, self.rng = n_vocab, rng

    def sample(self, c: _Cands) -> int:
        with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
            pr = c.probs(sort=True)
            if self.version == 1:
                n = min(MIROSTAT_M - 1, pr.size - 1)
                i = np.arange(n, dtype=_F32)
                t = np.log((i + _F32(2)) / (i + _F32(1)), dtype=_F32)
                b = np.log(pr[:n] / pr[1:n + 1], dtype=_F32)
                s_ti_bi = np.cumsum(t * b, dtype=_F32)[-1] if n > 0 else _F32(0)
                s_ti_sq = np.cumsum(t * t, dtype=_F32)[-1] if n > 0 else _F32(0)
                s_hat = _F32(s_ti_bi / s_ti_sq)
                eps = s_hat - _F32(1)
                k = np.power(_F32(eps * np.power(_F32(2), self.mu, dtype=_F32)) /
                             (_F32(1) - np.power(_F32(self.n_vocab), -eps, dtype=_F32)),
                             _F32(1) / s_hat, dtype=_F32)
                # C's int(k) on x86: out of range or NaN is INT_MIN, so max(int(k), 1) is 1
                ki = int(k) if np.isfinite(k) and -2.0 ** 31 < k < 2.0 ** 31 else -2 ** 31
                c.keep(slice(0, min(max(ki, 1), c.ids.size)))
            else:
                over = -np.log2(pr, dtype=_F32) > self.mu
                cut = int(np.argmax(over)) if over.any() else over.size
                c.keep(slice(0, max(cut, 1)))
            pr = c.probs(sort=True)
            idx = self.rng.discrete(pr)
            surprise = -np.log2(pr[idx], dtype=_F32)
            self.mu = _F32(self.mu - self.eta * _F32(surprise - self.tau))
        return int(c.ids[idx])


# ---- DRY ---------------------------------------------------------------------------------------
_breaker_cache: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def dry_breakers(tokenizer, strings) -> dict[int, list[tuple[int, ...]]]:
    """llama.cpp's processed DRY sequence breakers: {head token: [tail token sequences]}. A token
    whose text contains a breaker is a breaker by itself (empty tail); a token whose text ends
    with the start of a breaker is a head, the rest of the breaker tokenized its tail (at most
    DRY_MAX_TAIL tokens). Breakers are cut to DRY_MAX_CHARS characters; empty ones are skipped.
    Scans the vocabulary once per (tokenizer, breakers) and keeps the result."""
    key = tuple(strings)
    per_tok = _breaker_cache.setdefault(tokenizer, {})
    if key in per_tok:
        return per_tok[key]
    words = [tokenizer.detokenize([t], special=True) for t in range(tokenizer.n_vocab)] \
        if key else []
    out: dict[int, list[tuple[int, ...]]] = {}
    for s in key:
        if not s:
            continue
        b = s[:DRY_MAX_CHARS].encode("utf-8")
        for tid, word in enumerate(words):
            if b in word:
                seqs = out.setdefault(tid, [])
                if () not in seqs:
                    seqs.append(())
                continue
            pos = word.find(b[:1])
            while pos >= 0:
                n = len(word) - pos             # the word ends inside the breaker
                if n < len(b) and word[pos:] == b[:n]:
                    tail = tuple(tokenizer.encode(b[n:], add_special=False,
                                                  parse_special=False)[:DRY_MAX_TAIL])
                    seqs = out.setdefault(tid, [])
                    if tail not in seqs:
                        seqs.append(tail)
                pos = word.find(b[:1], pos + 1)
    per_tok[key] = out
    return out


def _dry(vals: np.ndarray, last: list[int], p: SamplingParams, breakers) -> np.ndarray:
    """llama.cpp's DRY on the full logits row; last: the last dry_penalty_last_n tokens."""
    n = len(last)
    allowed = p.dry_allowed_length
    if n <= allowed:
        return vals
    rat = last[::-1]                    # rat[i]: i tokens before the newest
    rep_limit = n
    for i, tok in enumerate(rat):       # the newest breaker bounds a repeat's length
        tails = breakers.get(tok)
        if not tails:
            continue
        longest = -1
        for tail in tails:
            L = len(tail)
            if longest < L <= i and all(tail[o] == rat[i - o - 1] for o in range(L)):
                longest = L
        if longest >= 0:
            rep_limit = i - longest
            break
    if rep_limit < allowed:
        return vals
    # z[k]: how many tokens before rat[k] repeat the newest ones (Z-algorithm on rat)
    z = [0] * n
    lo = hi = 0
    for k in range(1, n):
        m = min(hi - k, z[k - lo]) if k < hi else 0
        while k + m < n and rat[m] == rat[k + m]:
            m += 1
        z[k] = m
        if k + m > hi:
            lo, hi = k, k + m
    best: dict[int, int] = {}
    for k in range(1, n):
        run = min(z[k], rep_limit)
        if run >= allowed:              # emitting rat[k - 1] would extend this run
            tok = rat[k - 1]
            if best.get(tok, -1) < run:
                best[tok] = run
    if not best:
        return vals
    base = _F32(p.dry_base)
    max_exp = int(_F32(88.7228391) / np.log(base, dtype=_F32)) if base > _F32(1.000001) else 0
    vals = vals.copy()
    for tok, run in best.items():
        if tok >= vals.size or () in breakers.get(tok, ()):
            continue
        e = run - allowed
        if max_exp > 0 and e > max_exp:
            e = max_exp
        vals[tok] -= _F32(float(_F32(p.dry_multiplier)) * float(base) ** e)
    return vals


# ---- the sampler -------------------------------------------------------------------------------
class Sampler:
    """Stateful sampler for one sequence: the recent tokens (penalties, DRY), the random
    generators (dist, XTC, mirostat) and mirostat's mu. tokenizer: needed when DRY is on with
    sequence breakers (they are tokenized)."""

    def __init__(self, params: SamplingParams | None = None, tokenizer=None):
        self.params = p = (params or SamplingParams()).validate()
        self.tokenizer = tokenizer
        seed = int(p.seed)
        if seed in RANDOM_SEEDS:
            seed = int(np.random.SeedSequence().entropy % (1 << 32))
        self.seed = seed
        self._mt = _MT19937(seed)               # dist (and speculative decoding's draws)
        self._xtc_mt = _MT19937(seed) if p.xtc_on else None
        self._mirostat = None                   # made at the first sample (needs n_vocab)
        if p.dry_on and p.dry_sequence_breakers:
            if tokenizer is None:
                raise ModelError("DRY with sequence breakers needs the model's tokenizer "
                                 "(Sampler(params, tokenizer))")
            self._breakers = dry_breakers(tokenizer, p.dry_sequence_breakers)
        else:
            self._breakers = {}
        keep = [p.repeat_last_n, p.dry_penalty_last_n if p.dry_on else 0, 1]
        self.recent: deque[int] = deque(maxlen=None if p.repeat_last_n < 0 else max(keep))

    def fork(self, seed: int) -> "Sampler":
        """A sampler with the same parameters (and tokenizer) and another seed."""
        from dataclasses import replace
        return Sampler(replace(self.params, seed=seed), self.tokenizer)

    def accept(self, token: int) -> None:
        self.recent.append(int(token))

    def uniform(self) -> float:
        """The next draw of the dist generator, in [0, 1) (the draw `sample` makes)."""
        return self._mt.canonical_double()

    def sample(self, logits: np.ndarray) -> int:
        """Pick the next token id from logits (float32 [n_vocab])."""
        p = self.params
        c = self._chain(logits, self.recent, draw=True)
        if isinstance(c, int):
            return c
        if p.mirostat:
            if self._mirostat is None:
                self._mirostat = _Mirostat(p.mirostat, p.mirostat_tau, p.mirostat_eta,
                                           int(np.asarray(logits).size), _MT19937(self.seed))
            return self._mirostat.sample(c)
        return _dist(c, self._mt)

    def distribution(self, logits: np.ndarray, recent=None) -> tuple[np.ndarray, np.ndarray]:
        """The distribution `sample` draws from: (token ids, probabilities float64), a point
        mass on the argmax when greedy. recent: the tokens the penalties and DRY see (default:
        this sampler's). Speculative decoding compares these (pyggml/llm/speculative.py)."""
        ids, w = self.candidates(logits, recent)
        if w is None:
            return ids, np.ones(1)
        return ids, w / w.sum()

    def candidates(self, logits: np.ndarray, recent=None) -> tuple[np.ndarray, np.ndarray | None]:
        """The chain up to the draw: (token ids, unnormalized float64 weights), or ([argmax],
        None) when greedy. Only for a fixed distribution (SamplingParams.fixed_distribution)."""
        if not self.params.fixed_distribution:
            raise ModelError("this sampler has no fixed distribution to show (mirostat and XTC "
                             "draw their own): speculative decoding cannot use it")
        c = self._chain(logits, self.recent if recent is None else recent, draw=False)
        if isinstance(c, int):
            return np.array([c]), None
        mx = c.vals[0] if c.sorted else c.vals.max()
        return c.ids, np.exp(c.vals - mx, dtype=_F32).astype(np.float64)

    def _chain(self, logits, recent, draw: bool):
        """The candidates the final draw sees, or a token id when the chain decided alone
        (temperature <= 0)."""
        p = self.params
        logits = np.asarray(logits, dtype=np.float32)
        if logits.ndim != 1 or logits.size == 0:
            raise ModelError(f"sample: logits must be one non-empty row [n_vocab], got shape "
                             f"{logits.shape}")
        if p.logit_bias:
            logits = logits.copy()
            for tok, bias in p.logit_bias:
                if tok >= logits.size:
                    raise ModelError(f"logit_bias: token id {tok} is outside the vocabulary "
                                     f"(n_vocab {logits.size})")
                logits[tok] += np.float32(bias)
        if p.mirostat:
            c = _Cands(np.arange(logits.size), logits, False)
            if p.temperature <= 0.0:
                c.keep(slice(int(np.argmax(logits)), int(np.argmax(logits)) + 1))
            else:
                c.vals = c.vals / _F32(p.temperature)
            return c
        logits = self._penalize(logits, recent)
        if p.dry_on and recent:
            window = list(recent)[-p.dry_penalty_last_n:]
            logits = _dry(logits, window, p, self._breakers)
        if p.temperature <= 0.0 and p.typical_p >= 1.0 and not p.xtc_on:
            return int(np.argmax(logits))       # top_k / top_p / min_p keep the argmax
        c = _Cands(np.arange(logits.size), logits, False)
        _top_k(c, p.top_k)
        _typical(c, p.typical_p, p.min_keep)
        _top_p(c, p.top_p, p.min_keep)
        _min_p(c, p.min_p, p.min_keep)
        if p.xtc_on and draw:
            _xtc(c, p.xtc_probability, p.xtc_threshold, p.min_keep, self._xtc_mt)
        if p.temperature <= 0.0:
            return _argmax_first(c)
        c.vals = c.vals / _F32(p.temperature)
        return c

    def _penalize(self, logits: np.ndarray, recent) -> np.ndarray:
        p = self.params
        if p.repeat_last_n == 0 or not recent:
            return logits
        freq_pres = p.frequency_penalty != 0.0 or p.presence_penalty != 0.0
        if not freq_pres and p.repeat_penalty == 1.0:
            return logits
        window = recent if p.repeat_last_n < 0 or len(recent) <= p.repeat_last_n else \
            list(recent)[-p.repeat_last_n:]
        logits = logits.copy()
        if freq_pres:
            ids, counts = np.unique(np.fromiter(window, dtype=np.int64), return_counts=True)
            v = logits[ids]
            v = np.where(v <= 0, v * np.float32(p.repeat_penalty),
                         v / np.float32(p.repeat_penalty))
            v = v - (counts.astype(np.float32) * np.float32(p.frequency_penalty) +
                     (counts > 0).astype(np.float32) * np.float32(p.presence_penalty))
            logits[ids] = v
        else:
            ids = np.fromiter(set(window), dtype=np.int64)
            v = logits[ids]
            logits[ids] = np.where(v <= 0, v * p.repeat_penalty, v / p.repeat_penalty)
        return logits
