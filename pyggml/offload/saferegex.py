"""Regexes from configs and requests (`-ot REGEX=DEV`, a rule's `match`), matched under a time
budget: Python's `re` backtracks, and a pattern like `(a|a?)+$` takes seconds per tensor name
(tripling per character), which in `pyggml serve`'s what-if planner held every endpoint. The
syntax is checked by `re` (its error messages, the syntax users write for llama.cpp's std::regex
too); matching runs on the `regex` package (the same syntax, VERSION0) with a timeout, and a
pattern that exceeds it is a ConfigError naming the pattern and the tensor name.
"""

from __future__ import annotations

import re
import time

import regex

from pyggml.errors import ConfigError

MAX_PATTERN_CHARS = 1000
#: seconds one search of one tensor name may take (a sane pattern takes microseconds), and all
#: searches of one compiled pattern together (a model has up to a few thousand tensors)
SEARCH_TIMEOUT_S = 0.05
TOTAL_BUDGET_S = 0.5


def check_pattern(pattern: str) -> str | None:
    """None, or why `pattern` is not a usable regex (re's message)."""
    if not isinstance(pattern, str):
        return f"a regex must be a string, got {type(pattern).__name__}"
    if len(pattern) > MAX_PATTERN_CHARS:
        return f"a regex of {len(pattern)} characters (at most {MAX_PATTERN_CHARS} are taken)"
    try:
        re.compile(pattern)
    except re.error as e:
        return str(e)
    except (RecursionError, OverflowError, MemoryError) as e:
        return f"too complex ({type(e).__name__})"
    try:
        regex.compile(pattern, regex.VERSION0)
    except (regex.error, RecursionError, OverflowError, MemoryError) as e:
        return f"not supported ({e})"
    return None


class SafeRegex:
    """A compiled pattern whose search() runs under SEARCH_TIMEOUT_S per call and
    TOTAL_BUDGET_S over all calls (ConfigError past either)."""

    __slots__ = ("pattern", "_rx", "timeout_s", "budget_s", "_spent")

    def __init__(self, pattern: str, timeout_s: float = SEARCH_TIMEOUT_S,
                 budget_s: float = TOTAL_BUDGET_S):
        why = check_pattern(pattern)
        if why is not None:
            raise ConfigError(f"invalid regex {pattern!r}: {why}")
        self.pattern, self.timeout_s, self.budget_s = pattern, timeout_s, budget_s
        self._spent = 0.0
        self._rx = regex.compile(pattern, regex.VERSION0)

    def _slow(self, text: str, what: str) -> ConfigError:
        return ConfigError(
            f"regex {self.pattern!r} took more than {what} (at {text!r}): catastrophic "
            f"backtracking (nested or overlapping repeats such as (a+)+ or (a|a?)+); write it "
            f"without them")

    def search(self, text: str):
        t0 = time.perf_counter()
        try:
            return self._rx.search(text, concurrent=True, timeout=self.timeout_s)
        except TimeoutError:
            raise self._slow(text, f"{self.timeout_s * 1000:.0f} ms on one tensor name") from None
        finally:
            self._spent += time.perf_counter() - t0
            if self._spent > self.budget_s:
                self._spent = 0.0
                raise self._slow(text, f"{self.budget_s:.1f} s over the model's tensor names")

    def __repr__(self) -> str:
        return f"SafeRegex({self.pattern!r})"
