"""The sampling chain of llama.cpp's `common` defaults (docs/FORMATS.md §6):
logit_bias → penalties → top_k → top_p → min_p → temperature → dist. Greedy when
temperature <= 0.

The penalties are llama.cpp's `penalties` sampler over the last `repeat_last_n` tokens (0: off,
-1: all of them): a token seen there has its logit divided by `repeat_penalty` (multiplied when
<= 0), then `frequency_penalty` times its count and `presence_penalty` subtracted (all in fp32,
in that order). `logit_bias` adds (token id, bias) pairs to the logits first (-inf bans a token).
With them off (1.0, 0.0, 0.0, no biases) the chain is the one it was without them, bit for bit.

The random draw reproduces libstdc++'s std::mt19937 seeded with `seed` and
uniform_real_distribution<double>(0, 1) (two 32-bit outputs per double), which is what llama.cpp's
dist sampler uses; whether every draw matches llama.cpp bit for bit is unconfirmed.
"""

from __future__ import annotations

import numbers
from collections import deque
from dataclasses import dataclass, fields

import numpy as np

from pyggml.errors import ArgumentTypeError, ModelError

DEFAULT_SEED = 0xFFFFFFFF       # llama.cpp's LLAMA_DEFAULT_SEED: a random seed
RANDOM_SEEDS = (-1, DEFAULT_SEED)   # -1: llama.cpp's `--seed -1`, also random
_INT_FIELDS = ("top_k", "repeat_last_n", "seed")
_OTHER_FIELDS = ("logit_bias",)             # checked on their own (validate)


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

    def __post_init__(self):
        lb = self.logit_bias
        if isinstance(lb, dict):
            lb = tuple(lb.items())
        elif lb is None:
            lb = ()
        elif isinstance(lb, list):
            lb = tuple(tuple(x) if isinstance(x, list) else x for x in lb)
        object.__setattr__(self, "logit_bias", lb)

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
        if not 0.0 <= self.top_p <= 1.0:
            problems.append(f"top_p must be in [0, 1], got {self.top_p}")
        if not 0.0 <= self.min_p <= 1.0:
            problems.append(f"min_p must be in [0, 1], got {self.min_p}")
        if not self.repeat_penalty > 0.0:
            problems.append(f"repeat_penalty must be > 0, got {self.repeat_penalty}")
        if self.repeat_last_n < -1:
            problems.append(f"repeat_last_n must be >= -1, got {self.repeat_last_n}")
        for name in ("presence_penalty", "frequency_penalty"):
            if not np.isfinite(getattr(self, name)):
                problems.append(f"{name} must be finite, got {getattr(self, name)}")
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


class Sampler:
    """Stateful sampler for one sequence (keeps the recent tokens for the repetition penalty and
    the random generator)."""

    def __init__(self, params: SamplingParams | None = None):
        self.params = (params or SamplingParams()).validate()
        seed = int(self.params.seed)
        if seed in RANDOM_SEEDS:
            seed = int(np.random.SeedSequence().entropy % (1 << 32))
        self._mt = np.random.MT19937(0)
        self._mt._legacy_seeding(seed)      # init_genrand(seed), as std::mt19937(seed)
        self.recent: deque[int] = deque(maxlen=max(self.params.repeat_last_n, 1) if
                                        self.params.repeat_last_n >= 0 else None)

    def accept(self, token: int) -> None:
        self.recent.append(int(token))

    def uniform(self) -> float:
        """The next draw of the generator, in [0, 1) (the draw `sample` makes)."""
        return self._uniform()

    def _uniform(self) -> float:
        a, b = (int(x) & 0xFFFFFFFF for x in self._mt.random_raw(2))
        return (a + b * 2.0 ** 32) / 2.0 ** 64

    def sample(self, logits: np.ndarray) -> int:
        """Pick the next token id from logits (float32 [n_vocab])."""
        ids, w = self.candidates(logits)
        if w is None:
            return int(ids[0])
        r = self._uniform() * w.sum()
        i = int(np.searchsorted(np.cumsum(w), r))
        return int(ids[min(i, ids.size - 1)])

    def distribution(self, logits: np.ndarray, recent=None) -> tuple[np.ndarray, np.ndarray]:
        """The distribution `sample` draws from: (token ids, probabilities float64), a point
        mass on the argmax when greedy. recent: the tokens the repetition penalty sees (default:
        this sampler's). Speculative decoding compares these (pyggml/llm/speculative.py)."""
        ids, w = self.candidates(logits, recent)
        if w is None:
            return ids, np.ones(1)
        return ids, w / w.sum()

    def candidates(self, logits: np.ndarray, recent=None) -> tuple[np.ndarray, np.ndarray | None]:
        """The chain up to the draw: (token ids, unnormalized float64 weights), or ([argmax],
        None) when greedy."""
        p = self.params
        recent = self.recent if recent is None else recent
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
        freq_pres = p.frequency_penalty != 0.0 or p.presence_penalty != 0.0
        if p.repeat_last_n != 0 and recent and freq_pres:
            logits = logits.copy()
            ids, counts = np.unique(np.fromiter(recent, dtype=np.int64), return_counts=True)
            v = logits[ids]
            v = np.where(v <= 0, v * np.float32(p.repeat_penalty),
                         v / np.float32(p.repeat_penalty))
            v = v - (counts.astype(np.float32) * np.float32(p.frequency_penalty) +
                     (counts > 0).astype(np.float32) * np.float32(p.presence_penalty))
            logits[ids] = v
        elif p.repeat_penalty != 1.0 and recent and p.repeat_last_n != 0:
            logits = logits.copy()
            ids = np.fromiter(set(recent), dtype=np.int64)
            v = logits[ids]
            logits[ids] = np.where(v <= 0, v * p.repeat_penalty, v / p.repeat_penalty)
        if p.temperature <= 0.0:
            return np.array([int(np.argmax(logits))]), None     # first maximum in id order
        ids = np.arange(logits.size)
        vals = logits
        if 0 < p.top_k < logits.size:
            part = np.argpartition(-vals, p.top_k - 1)[: p.top_k]
            ids, vals = part, vals[part]
        order = np.argsort(-vals, kind="stable")
        ids, vals = ids[order], vals[order]
        if p.top_p < 1.0:
            e = np.exp(vals - vals[0], dtype=np.float32)
            cum = np.cumsum(e / e.sum(dtype=np.float32), dtype=np.float32)
            keep = int(np.searchsorted(cum, np.float32(p.top_p))) + 1
            ids, vals = ids[:keep], vals[:keep]
        if p.min_p > 0.0:
            keep = vals >= vals[0] + np.log(np.float32(p.min_p))
            ids, vals = ids[keep], vals[keep]
        vals = vals / np.float32(p.temperature)
        return ids, np.exp((vals - vals[0]).astype(np.float64))
