"""Scenarios of tests/test_hardening_api.py that must run in their own process: a hang or a crash
(or an AddressSanitizer report, with the sanitizer build of libpyggml) then fails one test
instead of the test session. Each prints one JSON line {"ok": bool, ...} and exits 0 when ok.

    python tests/support/hardening_scenarios.py SCENARIO MODEL.gguf [SEED]

use_after_close: every use of a closed LLM (and of its unfinished generator) raises ClosedError,
    tokenize still works, a second close is a no-op, the same after a `with` block; the CPU
    backend's freed thread pool is refused by the C library (PG_ERR_CLOSED -> ClosedError).
two_threads: one LLM, two threads generating greedily on their own sequences give the tokens
    of a single-threaded run; two threads on one sequence get correct tokens or
    GeneratorInvalidatedError.
stress: 4 threads x 50 random calls (generate, resume a paused generation, eval, reset,
    tokenize, close) on a shared LLM (4 sequences) and on per-thread LLMs: every result equals
    the single-threaded one or is a ClosedError / GeneratorInvalidatedError.
"""

from __future__ import annotations

import json
import random
import sys
import threading
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import numpy as np  # noqa: E402

from pyggml.errors import ClosedError, GeneratorInvalidatedError  # noqa: E402
from pyggml.llm.runtime import LLM  # noqa: E402

PROMPTS = ["the quick brown fox", "once upon a time", "the capital of france is", "hello world"]
N_GEN = 6
JOIN_S = 60.0           # a thread still running after this is a hang
EXPECTED = (ClosedError, GeneratorInvalidatedError)


def _greedy(llm, prompt, seq_id=0):
    g = llm.generate(prompt, N_GEN, temperature=0.0, seq_id=seq_id, stop_at_eog=False)
    ids = [t.id for t in g]
    return ids, g.finish_reason


def _references(path):
    with LLM(path, n_ctx=256, n_threads=1) as llm:
        gen = {p: _greedy(llm, p)[0] for p in PROMPTS}
        tok = {p: llm.tokenize(p) for p in PROMPTS}
        top = {}
        for p in PROMPTS:
            llm.reset()
            top[p] = int(np.argmax(llm.eval(tok[p])))
    return gen, tok, top


def _raises(fn, cls) -> str | None:
    """None if fn() raised `cls` with a message, else what happened instead."""
    try:
        fn()
    except cls as e:
        return None if str(e) else f"{cls.__name__} without a message"
    except BaseException as e:  # noqa: BLE001 - the point is to report anything else
        return f"{type(e).__name__}: {e}"
    return "no error"


def use_after_close(path, _seed=0):
    problems = []
    llm = LLM(path, n_ctx=256, n_threads=2)
    ref, _ = _greedy(llm, PROMPTS[0])
    ids_before = llm.tokenize(PROMPTS[0])
    paused = llm.generate(PROMPTS[1], N_GEN, temperature=0.0)
    next(paused)
    llm.close()
    llm.close()                                     # a second close: no-op
    uses = {
        "eval": lambda: llm.eval([1, 2, 3]),
        "decode_batch": lambda: llm.decode_batch([([1, 2], 0)]),
        "generate": lambda: llm.generate(PROMPTS[0], 4),
        "resume generator": lambda: next(paused),
        "reset": lambda: llm.reset(),
        "reset(seq)": lambda: llm.reset(0),
        "memory_report": lambda: llm.memory_report(),
    }
    for name, fn in uses.items():
        why = _raises(fn, ClosedError)
        if why:
            problems.append(f"{name} after close: {why}")
    if llm.tokenize(PROMPTS[0]) != ids_before:         # allowed: the vocabulary is Python data
        problems.append("tokenize after close gives other ids")
    with LLM(path, n_ctx=256, n_threads=2) as llm2:
        got, _ = _greedy(llm2, PROMPTS[0])
        if got != ref:
            problems.append(f"second LLM: {got} != {ref}")
    for name, fn in {"eval after with": lambda: llm2.eval([1]),
                     "generate after with": lambda: list(llm2.generate(PROMPTS[0], 2))}.items():
        why = _raises(fn, ClosedError)
        if why:
            problems.append(f"{name}: {why}")
    problems += _freed_pool_refused_by_c()
    return {"ok": not problems, "problems": problems}


def _freed_pool_refused_by_c() -> list[str]:
    """The C library itself refuses the freed pool: the Python-side flag is cleared to stand for
    a compute that was already past it when another thread closed the backend."""
    from pyggml import Context, Graph, ops
    from pyggml.backend.cpu import CpuBackend, host_array, set_host_data
    ctx = Context(mem_size=1 << 20, no_alloc=False)
    a = ctx.new_tensor("f32", [64, 4], name="a")
    set_host_data(a, np.ones((4, 64), np.float32))
    y = ops.add(ctx, a, a, name="y")
    g = Graph()
    g.build_forward_expand(y)
    cpu = CpuBackend(n_threads=2)
    cpu.graph_compute(g)
    out = []
    if not np.all(host_array(y) == 2):
        out.append("live pool: wrong result")
    cpu.close()
    why = _raises(lambda: cpu.graph_compute(g), ClosedError)
    if why:
        out.append(f"closed backend: {why}")
    cpu._closed = False            # past the Python check: only the C registry stands guard
    why = _raises(lambda: cpu.graph_compute(g), ClosedError)
    if why:
        out.append(f"freed pool in C: {why}")
    cpu.close()
    return out


def _run_threads(fn, n):
    errors = []

    def wrap(i):
        try:
            fn(i)
        except BaseException as e:  # noqa: BLE001
            errors.append(f"thread {i}: {type(e).__name__}: {e}")
    ts = [threading.Thread(target=wrap, args=(i,), daemon=True) for i in range(n)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(JOIN_S)
    hung = [i for i, t in enumerate(ts) if t.is_alive()]
    return errors + [f"thread {i} did not finish in {JOIN_S} s" for i in hung]


def two_threads(path, _seed=0):
    ref, _, _ = _references(path)
    problems = []
    counts = {"correct": 0, "invalidated": 0}
    lock = threading.Lock()
    llm = LLM(path, n_ctx=256, n_seq_max=2, n_threads=2)

    def own_seq(i):
        for k in range(6):
            p = PROMPTS[(i + k) % len(PROMPTS)]
            got, reason = _greedy(llm, p, seq_id=i)
            if got != ref[p] or reason != "length":
                problems.append(f"seq {i} {p!r}: {got} ({reason}) != {ref[p]}")
            with lock:
                counts["correct"] += 1

    def same_seq(i):
        for k in range(6):
            p = PROMPTS[(i + k) % len(PROMPTS)]
            try:
                got, _ = _greedy(llm, p, seq_id=0)
            except GeneratorInvalidatedError:
                with lock:
                    counts["invalidated"] += 1
                continue
            if got != ref[p]:
                problems.append(f"shared seq {p!r}: {got} != {ref[p]}")
            with lock:
                counts["correct"] += 1

    problems += _run_threads(own_seq, 2)
    if counts["correct"] != 12:
        problems.append(f"own sequences: {counts['correct']} of 12 generations correct")
    problems += _run_threads(same_seq, 2)
    llm.close()
    return {"ok": not problems, "problems": problems[:10], "counts": counts}


def stress(path, seed=0):
    ref_gen, ref_tok, ref_top = _references(path)
    shared = LLM(path, n_ctx=256, n_seq_max=4, n_threads=2)
    problems, lock = [], threading.Lock()
    counts: dict[str, int] = {}

    def count(key):
        with lock:
            counts[key] = counts.get(key, 0) + 1

    def worker(i):
        rng = random.Random(seed * 1000 + i)
        own = LLM(path, n_ctx=128, n_threads=2)
        paused = None                 # (generation, prompt, ids so far) left half-consumed
        for k in range(50):
            use_shared = rng.random() < 0.6
            llm = shared if use_shared else own
            seq = (i if rng.random() < 0.75 else 0) if use_shared else 0
            p = rng.choice(PROMPTS)
            op = rng.choices(["generate", "pause", "resume", "eval", "reset", "tokenize",
                              "close"], [4, 2, 2, 4, 2, 2, 1])[0]
            if op == "close" and use_shared and k < 40:
                op = "tokenize"       # close the shared LLM late only: use it a lot first
            try:
                if op == "generate":
                    got, reason = _greedy(llm, p, seq)
                    ok = got == ref_gen[p] and reason == "length"
                elif op == "pause":
                    g = llm.generate(p, N_GEN, temperature=0.0, seq_id=seq, stop_at_eog=False)
                    paused = (g, p, [next(g).id for _ in range(rng.randint(1, 3))])
                    ok = paused[2] == ref_gen[p][:len(paused[2])]
                elif op == "resume" and paused is None:     # nothing paused: pause one
                    g = llm.generate(p, N_GEN, temperature=0.0, seq_id=seq, stop_at_eog=False)
                    paused = (g, p, [next(g).id])
                    ok = paused[2] == ref_gen[p][:1]
                elif op == "resume":
                    g, pp, ids = paused
                    paused = None
                    ids = ids + [t.id for t in g]
                    ok = ids == ref_gen[pp] and g.finish_reason == "length"
                elif op == "eval":
                    with llm.lock:    # reset + eval as one step
                        llm.reset(seq)
                        ok = int(np.argmax(llm.eval(ref_tok[p], seq))) == ref_top[p]
                elif op == "reset":
                    llm.reset(seq if rng.random() < 0.8 else None)
                    ok = True
                elif op == "tokenize":
                    ok = llm.tokenize(p) == ref_tok[p]
                else:
                    llm.close()
                    ok = True
                    if not use_shared and rng.random() < 0.7:
                        own = LLM(path, n_ctx=128, n_threads=2)
            except EXPECTED as e:
                if not str(e):
                    problems.append(f"thread {i} call {k} {op}: {type(e).__name__} "
                                    f"without a message")
                count(type(e).__name__)
                continue
            except BaseException as e:  # noqa: BLE001
                problems.append(f"thread {i} call {k} {op}: {type(e).__name__}: {e}")
                continue
            count(f"{op}-{'ok' if ok else 'WRONG'}")
            if not ok:
                problems.append(f"thread {i} call {k} {op} {p!r} on "
                                f"{'shared' if use_shared else 'own'} seq {seq}: wrong result")
        own.close()

    problems += _run_threads(worker, 4)
    shared.close()
    n_calls = sum(counts.values())
    if n_calls != 200:
        problems.append(f"{n_calls} of 200 calls accounted for")
    return {"ok": not problems, "problems": problems[:10], "counts": counts}


SCENARIOS = {"use_after_close": use_after_close, "two_threads": two_threads, "stress": stress}

if __name__ == "__main__":
    name, model = sys.argv[1], sys.argv[2]
    seed = int(sys.argv[3]) if len(sys.argv) > 3 else 0
    result = SCENARIOS[name](model, seed)
    print(json.dumps(result))
    sys.exit(0 if result["ok"] else 1)
